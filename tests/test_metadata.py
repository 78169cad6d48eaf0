"""Site- and case-level metadata: federation.yaml ``sites:``, ``<site>/cases.csv``, ``data check``,
``SiteData.metadata_value``, group-aware splits and the built-in federations' site keys."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import yaml
from PIL import Image
from typer.testing import CliRunner

from fedseg.cli import app
from fedseg.config import DataConfig, SplitConfig
from fedseg.data.check import check_folder
from fedseg.data.dataset import build_site_data
from fedseg.data.federation import Case, Federation, FederationError, Regions, Site
from fedseg.data.folder import load_folder
from fedseg.data.folder_write import write_folder
from fedseg.data.metadata import metadata_summary, metadata_value
from fedseg.data.splits import kfold_assignment, make_splits, site_splits
from fedseg.data.synthetic import build_synthetic

HEADER = {"name": "toy", "kind": "2d", "channels": 1, "regions": {"fg": [1]}}


def _with_meta(case: Case, **meta) -> Case:
    return dataclasses.replace(case, meta={**case.meta, **meta})


# --- round trip through the folder format ----------------------------------------------------------


def test_metadata_round_trips_through_write_folder_and_load_folder(tmp_path, disc_federation):
    fed = disc_federation(n_sites=3, cases_per_site=4, size=8)
    s1, s2, _ = fed.sites
    s1.meta = {"grade": "LGG", "vendor": "X", "year": 2019, "field_t": 1.5, "public": True}
    s2.meta = {"grade": "HGG"}
    s1.cases = [
        _with_meta(c, group=f"p{i // 2}", grade="LGG" if i else "HGG", note='a, b "quoted"')
        for i, c in enumerate(s1.cases)
    ]
    s2.cases[1] = _with_meta(s2.cases[1], scanner="S1")  # one case of site2 only; site3 has none

    root = write_folder(fed, tmp_path / "fed")
    header = yaml.safe_load((root / "federation.yaml").read_text())
    assert header["sites"] == {"site1": s1.meta, "site2": {"grade": "HGG"}}  # site3 has no entry
    assert (root / "site2/cases.csv").read_text() == "case,scanner\ns2_001,S1\n"
    assert not (root / "site3/cases.csv").exists()

    back = load_folder(root)
    assert [s.meta for s in back.sites] == [s.meta for s in fed.sites]
    assert [type(v) for v in back.sites[0].meta.values()] == [str, str, int, float, bool]
    for site, read in zip(fed.sites, back.sites):
        assert [c.metadata for c in read.cases] == [c.metadata for c in site.cases]
    assert back.sites[0].cases[0].meta["image"].endswith("site1/images/s1_000.png")  # files kept apart
    assert back.sites[0].cases[0].metadata == {"group": "p0", "grade": "HGG", "note": 'a, b "quoted"'}


def test_no_metadata_writes_no_sites_key_and_no_cases_csv(tmp_path, disc_federation):
    root = write_folder(disc_federation(n_sites=2, cases_per_site=3, size=8), tmp_path / "fed")
    assert "sites" not in yaml.safe_load((root / "federation.yaml").read_text())
    assert not list(root.glob("*/cases.csv"))
    fed = load_folder(root)
    assert all(s.meta == {} and all(c.metadata == {} for c in s.cases) for s in fed.sites)
    assert metadata_summary(fed) is None


def test_write_folder_refuses_metadata_it_cannot_write(tmp_path, disc_federation):
    fed = disc_federation(n_sites=1, cases_per_site=2, size=8)
    fed.sites[0].meta = {"grade": ["LGG", "HGG"]}
    with pytest.raises(FederationError, match=r"site 'site1': metadata 'grade': must be a scalar .* got a list"):
        write_folder(fed, tmp_path / "fed")
    assert not (tmp_path / "fed").exists()
    fed.sites[0].meta = {"grade": np.int64(2)}  # NumPy scalars are written as plain numbers
    write_folder(fed, tmp_path / "ok")
    assert load_folder(tmp_path / "ok").sites[0].meta == {"grade": 2}


def test_empty_cells_mean_no_value_and_unlisted_cases_have_none(tmp_path):
    root = _folder(tmp_path)
    (root / "s1/cases.csv").write_text("grade,case,group\nLGG,a,\n,b,p1\n")
    s1 = load_folder(root).site("s1")
    assert [c.metadata for c in s1.cases] == [{"grade": "LGG"}, {"group": "p1"}, {}]


# --- validation: federation.yaml sites:, cases.csv, data check --------------------------------------


def _png(path: Path, array: np.ndarray) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(array).save(path)


def _set_header(root: Path, **changes) -> None:
    (root / "federation.yaml").write_text(yaml.safe_dump({**HEADER, **changes}))


def _folder(tmp_path: Path) -> Path:
    """A valid federation of 4x4 grayscale PNGs: sites s1 (cases a, b, c) and s2 (d, e, f)."""
    root = tmp_path / "fed"
    root.mkdir(parents=True)
    _set_header(root)
    for site, ids in (("s1", "abc"), ("s2", "def")):
        for cid in ids:
            _png(root / site / "images" / f"{cid}.png", np.zeros((4, 4), np.uint8))
            _png(root / site / "labels" / f"{cid}.png", np.zeros((4, 4), np.uint8))
    return root


def _cases_csv(text: str, site: str = "s1") -> Callable[[Path], None]:
    return lambda root: (root / site / "cases.csv").write_text(text)


# (id, how to break a valid folder, the one line the message must contain)
BROKEN = [
    (
        "unknown-site",
        lambda r: _set_header(r, sites={"s1": {"grade": "LGG"}, "site9": {"grade": "HGG"}}),
        "federation.yaml: sites.site9: no such site folder (sites are s1, s2)",
    ),
    (
        "non-scalar",
        lambda r: _set_header(r, sites={"s1": {"grade": ["LGG", "HGG"]}}),
        "federation.yaml: sites.s1.grade: must be a scalar (string, number or boolean), got a list",
    ),
    (
        "null-value",
        lambda r: _set_header(r, sites={"s1": {"grade": None}}),
        "federation.yaml: sites.s1.grade: must be a scalar (string, number or boolean), got null",
    ),
    (
        "site-not-a-mapping",
        lambda r: _set_header(r, sites={"s1": "LGG"}),
        "federation.yaml: sites.s1: expected a mapping key -> value",
    ),
    (
        "sites-not-a-mapping",
        lambda r: _set_header(r, sites=["s1"]),
        "federation.yaml: sites: expected a mapping site name -> {key: value}",
    ),
    (
        "no-case-column",
        _cases_csv("id,grade\na,LGG\n"),
        "s1/cases.csv:1: missing column 'case' (header is id,grade;",
    ),
    ("unknown-case", _cases_csv("case,grade\na,LGG\nghost,HGG\n"), "s1/cases.csv:3: unknown case 'ghost'"),
    (
        "duplicate-case",
        _cases_csv("case,grade\na,LGG\nb,LGG\na,HGG\n"),
        "s1/cases.csv:4: duplicate case 'a' (first on line 2)",
    ),
    ("empty-column-name", _cases_csv("case,grade,\na,LGG,\n"), "s1/cases.csv:1: empty column name (column 3)"),
    (
        "duplicate-column",
        _cases_csv("case,grade,grade\na,LGG,HGG\n"),
        "s1/cases.csv:1: duplicate column 'grade' (columns 2 and 3)",
    ),
    ("reserved-column", _cases_csv("case,image\na,x\n"), "s1/cases.csv:1: column 'image' is reserved"),
    ("too-many-cells", _cases_csv("case,grade\na,LGG,extra\n"), "s1/cases.csv:2: 3 cells but the header has 2"),
    ("empty-case", _cases_csv("case,grade\n,LGG\n"), "s1/cases.csv:2: empty 'case'"),
    ("empty-file", _cases_csv("\n"), "s1/cases.csv: empty file, expected a header with a 'case' column"),
    (
        "group-split-by-splits-csv",
        lambda r: [
            _cases_csv("case,group\na,p1\nb,p1\nc,p2\n")(r),
            (r / "s1/splits.csv").write_text("case,split\na,train\nb,test\nc,val\n"),  # c: s1 keeps a val case
        ],
        "s1/splits.csv: group 'p1' is split: 'a' train, 'b' test (its cases must share one split)",
    ),
]


@pytest.mark.parametrize("breaks, problem", [b[1:] for b in BROKEN], ids=[b[0] for b in BROKEN])
def test_each_metadata_problem_gives_one_clear_line(tmp_path, breaks, problem):
    root = _folder(tmp_path)
    breaks(root)
    for read in (load_folder, check_folder):
        with pytest.raises(FederationError) as err:
            read(root)
        lines = [line for line in str(err.value).splitlines() if problem in line]
        assert len(lines) == 1, f"{problem!r} not once in:\n{err.value}"
        assert f"{root}/" in lines[0]  # the full path of the file
    result = CliRunner().invoke(app, ["data", "check", str(root)])
    assert result.exit_code == 1, result.output
    assert problem in result.output and len(result.output.strip().splitlines()) == 1  # one line, the problem in it
    assert "Traceback" not in result.output


def test_many_unknown_cases_are_grouped_not_flooded(tmp_path):
    root = _folder(tmp_path)
    (root / "s1/cases.csv").write_text("case,grade\n" + "".join(f"ghost{i},LGG\n" for i in range(40)))
    result = CliRunner().invoke(app, ["data", "check", str(root)])
    assert result.exit_code == 1
    assert "(40 problems)" in result.output and "... and 37 more like this" in result.output
    assert len(result.output.strip().splitlines()) < 8, result.output


def test_site_names_are_checked_against_folders_only_where_there_are_folders(tmp_path):
    from fedseg.data.folder import read_header

    root = _folder(tmp_path)
    _set_header(root, sites={"elsewhere": {"grade": "LGG"}})
    assert read_header(root).sites == {"elsewhere": {"grade": "LGG"}}  # federation.yaml alone (coordinator)
    with pytest.raises(FederationError, match=r"sites.elsewhere: no such site folder \(sites are s1, s2\)"):
        read_header(root, ["s1", "s2"])


def test_cli_check_mentions_the_metadata_keys(tmp_path):
    root = _folder(tmp_path)
    _set_header(root, sites={"s1": {"grade": "LGG", "vendor": "X"}, "s2": {"vendor": "Y"}})
    (root / "s2/cases.csv").write_text("case,group\nd,p1\n")  # 3 cases in 3 groups: a train, a val, a test case
    result = CliRunner().invoke(app, ["data", "check", str(root)])
    assert result.exit_code == 0, result.output
    assert "OK:" in result.output
    assert "metadata: site-level grade (1/2 sites), vendor (2/2 sites); case-level group (1/6 cases)" in result.output
    plain = CliRunner().invoke(app, ["data", "check", str(_folder(tmp_path / "plain"))])
    assert plain.exit_code == 0 and "metadata" not in plain.output


# --- SiteData.metadata_value -----------------------------------------------------------------------


def _site_data(site: Site):
    fed = Federation("toy", "2d", 1, Regions.from_mapping({"fg": [1]}), [site])
    splits = {c.id: s for c, s in zip(site.cases, ["train", "val", "test"] * len(site.cases))}
    return build_site_data(fed, site, 0, splits, DataConfig(image_size=8), originals=False)


def _cases(*metas: dict) -> list[Case]:
    image, label = np.zeros((1, 4, 4), np.uint8), np.zeros((4, 4), np.uint8)
    return [Case.from_arrays(f"c{i}", image, label, **meta) for i, meta in enumerate(metas)]


def test_site_data_carries_site_and_case_metadata_of_every_split():
    cases = _cases({"grade": "LGG"}, {}, {"grade": "HGG", "group": "p1"})
    data = _site_data(Site("site3", cases, meta={"vendor": "X", "year": 2019}))
    assert data.metadata == {"vendor": "X", "year": 2019}
    assert data.case_metadata == {"c0": {"grade": "LGG"}, "c1": {}, "c2": {"grade": "HGG", "group": "p1"}}
    assert (len(data.train), len(data.val), len(data.test)) == (1, 1, 1)


def test_metadata_value_prefers_the_site_level_value_as_a_string():
    data = _site_data(Site("s", _cases({"grade": "HGG"}, {"grade": "HGG"}), meta={"grade": "LGG", "year": 2019}))
    assert data.metadata_value("grade") == "LGG"
    assert data.metadata_value("year") == "2019"


def test_metadata_value_takes_the_case_level_majority_ignoring_empty_values():
    data = _site_data(Site("s", _cases({"grade": "LGG"}, {"grade": "HGG"}, {"grade": "HGG"}, {"grade": ""}, {})))
    assert data.metadata_value("grade") == "HGG"
    many_empty = _site_data(Site("s", _cases({"grade": "LGG"}, {"grade": ""}, {"grade": ""})))
    assert many_empty.metadata_value("grade") == "LGG"


def test_metadata_value_tie_goes_to_the_smallest_value_in_string_order():
    data = _site_data(Site("s", _cases({"grade": "b"}, {"grade": "a"}, {"grade": "b"}, {"grade": "a"})))
    assert data.metadata_value("grade") == "a"
    numbers = metadata_value("s", "k", {}, {"x": {"k": "10"}, "y": {"k": "9"}})
    assert numbers == "10"  # string order, not numeric order


def test_metadata_value_names_the_missing_key_and_the_keys_the_site_has():
    data = _site_data(Site("site3", _cases({"group": "p1"}, {"scanner": ""}), meta={"vendor": "X"}))
    with pytest.raises(ValueError) as err:
        data.metadata_value("grade")
    assert str(err.value) == (
        "site 'site3' has no metadata 'grade' (neither in federation.yaml sites.site3 nor in site3/cases.csv); "
        "keys it has: group, vendor"
    )
    with pytest.raises(ValueError, match="site 'bare' has no metadata 'grade' .*; it has no metadata$"):
        _site_data(Site("bare", _cases({}))).metadata_value("grade")


def test_site_data_from_a_folder_answers_metadata_questions(tmp_path):
    root = _folder(tmp_path)
    _set_header(root, sites={"s1": {"vendor": "X"}})
    (root / "s2/cases.csv").write_text("case,grade\nd,HGG\ne,LGG\nf,HGG\n")
    fed = load_folder(root)
    splits = make_splits(fed, SplitConfig(), seed=0)
    s1, s2 = (
        build_site_data(fed, s, i, splits[s.name], DataConfig(image_size=8), originals=False)
        for i, s in enumerate(fed.sites)
    )
    assert s1.metadata_value("vendor") == "X" and s2.metadata_value("grade") == "HGG"
    assert s2.case_metadata == {"d": {"grade": "HGG"}, "e": {"grade": "LGG"}, "f": {"grade": "HGG"}}


# --- group-aware splits ------------------------------------------------------------------------------

GROUP_SIZES = [5, 1, 3, 4, 2, 6, 1, 2, 3, 1]  # 28 cases in 10 groups


def _grouped_site(name: str = "a", ungrouped: int = 4, order: Callable[[list], list] = list) -> Site:
    image, label = np.zeros((1, 2, 2), np.uint8), np.zeros((2, 2), np.uint8)
    cases = [
        Case.from_arrays(f"{name}-{g:02d}-{k}", image, label, group=f"patient{g}")
        for g, n in enumerate(GROUP_SIZES)
        for k in range(n)
    ]
    cases += [Case.from_arrays(f"{name}-solo{k}", image, label) for k in range(ungrouped)]
    return Site(name, order(cases))


def _groups_of(site: Site) -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for case in site.cases:
        out.setdefault(str(case.meta.get("group", case.id)), set()).add(case.id)
    return out


@pytest.mark.parametrize(
    "cfg",
    [SplitConfig(), SplitConfig(ratios=(0.7, 0.2, 0.1)), *(SplitConfig(mode="kfold", fold=k) for k in range(5))],
    ids=lambda c: f"{c.mode}-{c.ratios if c.mode == 'ratio' else c.fold}",
)
def test_ratio_and_kfold_splits_keep_each_group_in_one_split(cfg):
    site = _grouped_site()
    for seed in range(10):
        splits = site_splits(site, cfg, seed)
        assert list(splits) == [c.id for c in site.cases]
        for members in _groups_of(site).values():
            assert len({splits[c] for c in members}) == 1, (seed, members, splits)
        assert all(list(splits.values()).count(s) for s in ("train", "val", "test"))  # every split used


def test_group_splits_are_deterministic_from_the_seed_and_ignore_case_order():
    site = _grouped_site()
    reordered = _grouped_site(order=lambda cases: list(reversed(cases)))
    cfg = SplitConfig()
    assert site_splits(site, cfg, 3) == site_splits(site, cfg, 3) == site_splits(reordered, cfg, 3)
    assert any(site_splits(site, cfg, 3) != site_splits(site, cfg, s) for s in range(4, 8))


def test_group_splits_come_as_close_to_the_ratios_as_whole_groups_allow():
    site = _grouped_site(ungrouped=0)  # 28 cases: the ratio targets are 14 / 7 / 7
    for seed in range(20):
        values = list(site_splits(site, SplitConfig(), seed).values())
        counts = [values.count(s) for s in ("train", "val", "test")]
        assert sum(counts) == 28 and all(abs(c - t) <= max(GROUP_SIZES) for c, t in zip(counts, (14, 7, 7)))


def test_kfold_groups_share_a_fold_and_each_case_is_test_once():
    site = _grouped_site()
    groups = {c.id: str(c.meta["group"]) for c in site.cases if "group" in c.meta}
    folds = kfold_assignment([c.id for c in site.cases], 5, 1, "a", groups)
    for members in _groups_of(site).values():
        assert len({folds[c] for c in members}) == 1
    tests = [
        {c for c, s in site_splits(site, SplitConfig(mode="kfold", fold=k), 1).items() if s == "test"} for k in range(5)
    ]
    assert all(tests) and sum(len(t) for t in tests) == len(site.cases) == len(set().union(*tests))


def test_groups_of_one_case_split_exactly_like_no_groups():
    image, label = np.zeros((1, 2, 2), np.uint8), np.zeros((2, 2), np.uint8)
    plain = Site("s", [Case.from_arrays(f"c{i:02d}", image, label) for i in range(17)])
    single = Site("s", [_with_meta(c, group=f"g-{c.id}") for c in plain.cases])
    for cfg in (SplitConfig(), SplitConfig(ratios=(0.6, 0.3, 0.1)), SplitConfig(mode="kfold", fold=2)):
        assert site_splits(single, cfg, 4) == site_splits(plain, cfg, 4)


def test_a_group_with_a_fixed_case_follows_it():
    site = _grouped_site()
    site.fixed_splits = {"a-00-0": "test"}  # patient0 has 5 cases
    for seed in range(5):
        splits = site_splits(site, SplitConfig(), seed)
        assert {splits[f"a-00-{k}"] for k in range(5)} == {"test"}


def test_group_splits_from_a_folder(tmp_path):
    root = _folder(tmp_path)
    (root / "s1/cases.csv").write_text("case,group\na,p1\nb,p1\nc,p2\n")
    fed = load_folder(root)
    for seed in range(10):
        splits = make_splits(fed, SplitConfig(), seed)["s1"]
        assert splits["a"] == splits["b"]


# --- built-in federations ----------------------------------------------------------------------------


def test_builtin_federations_carry_site_level_keys(tmp_path):
    retina = build_synthetic("synthetic-retina", scale=0.001, image_size=16, seed=0)
    assert [s.meta for s in retina.sites] == [
        {"collection": c} for c in ("other", "riga", "riga", "riga", "other", "other")
    ]
    prostate = build_synthetic("synthetic-prostate", scale=0.001, image_size=16, seed=0)
    assert [s.meta for s in prostate.sites] == [
        {"coil": c} for c in ("endorectal", "none", "endorectal", "none", "none", "none")
    ]
    assert all(c.metadata == {} for f in (retina, prostate) for s in f.sites for c in s.cases)
    assert metadata_summary(prostate) == "metadata: site-level coil (6/6 sites)"
    back = load_folder(write_folder(retina, tmp_path / "retina"))
    assert [s.meta for s in back.sites] == [s.meta for s in retina.sites]


def test_a_hospitals_partial_folder_may_list_other_sites_with_all_sites_false(tmp_path):
    root = _folder(tmp_path)
    _set_header(root, sites={"s1": {"grade": "LGG"}, "hospital-b": {"grade": "HGG"}})
    with pytest.raises(FederationError, match="sites.hospital-b: no such site folder"):
        load_folder(root)
    assert load_folder(root, all_sites=False).site("s1").meta == {"grade": "LGG"}
    assert check_folder(root, all_sites=False).site("s1").meta == {"grade": "LGG"}
