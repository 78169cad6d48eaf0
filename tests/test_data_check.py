"""``check_folder`` and ``fedseg data check``: every malformed folder is reported with its file and problem."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import yaml
from PIL import Image
from typer.testing import CliRunner

from fedseg.config import SplitConfig
from fedseg.data.check import MIN_SITE_CASES, SiteLabels, check_folder, region_site_warnings
from fedseg.data.cli import data_app
from fedseg.data.federation import FederationError, Regions

HEADER = {"name": "toy", "kind": "2d", "channels": 3, "regions": {"disc": [1, 2], "cup": [2]}}


def _png(path: Path, array: np.ndarray) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(array).save(path)


def _npy(path: Path, array: np.ndarray) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    np.save(path, array)


def _set_header(root: Path, **changes) -> None:
    data = {**HEADER, **changes}
    (root / "federation.yaml").write_text(yaml.safe_dump({k: v for k, v in data.items() if v is not None}))


@pytest.fixture
def root(tmp_path: Path) -> Path:
    """A valid 2-site federation of 8x8 RGB PNGs with label maps in {0, 1, 2}."""
    rng = np.random.default_rng(0)
    root = tmp_path / "fed"
    root.mkdir()
    _set_header(root)
    for site, ids in (("s1", "abc"), ("s2", "def")):
        for cid in ids:
            _png(root / site / "images" / f"{cid}.png", rng.integers(0, 256, (8, 8, 3), dtype=np.uint8))
            _png(root / site / "labels" / f"{cid}.png", rng.integers(0, 3, (8, 8), dtype=np.uint8))
    return root


def _rm(path: Path) -> None:
    path.unlink()


def _with(image: np.ndarray, value: float) -> np.ndarray:
    """``image`` with ``value`` (NaN or Inf) in two pixels."""
    image[0, 0, :2] = value
    return image


# Each entry: (id, how to break a valid folder, the file (or site/key) the message must name, the problem).
BROKEN = [
    ("image-without-label", lambda r: _rm(r / "s1/labels/a.png"), "s1/images/a.png", "image without label"),
    ("label-without-image", lambda r: _rm(r / "s1/images/a.png"), "s1/labels/a.png", "label without image"),
    (
        "shape-mismatch",
        lambda r: _png(r / "s1/labels/a.png", np.zeros((5, 8), np.uint8)),
        "s1/images/a.png",
        "image spatial shape (8, 8) does not match label",
    ),
    (
        "unknown-label-value",
        lambda r: _png(r / "s1/labels/b.png", np.full((8, 8), 7, np.uint8)),
        "s1/labels/b.png",
        "label values 7 are not in any region",
    ),
    (
        "empty-site",
        lambda r: [(r / "s3" / d).mkdir(parents=True) for d in ("images", "labels")],
        "s3",
        "empty site",
    ),
    (
        "empty-images-folder",  # one line, not one per label and an "empty site" (a fresh-eyes run: 6 lines)
        lambda r: [_rm(p) for p in (r / "s1" / "images").iterdir()],
        "s1/images",
        "no image files, for the 3 labels of the site",
    ),
    (
        "a-folder-that-is-not-a-site",
        lambda r: ((r / "notes").mkdir(), (r / "notes" / "readme.txt").write_text("to do")),
        "notes",
        "not a site folder (no images/ and no labels/); every folder of a federation is a site: move it out, or hide",
    ),
    (
        "corrupt-png",
        lambda r: (r / "s1/images/a.png").write_bytes(b"\x89PNG garbage"),
        "s1/images/a.png",
        "cannot read",
    ),
    (
        "truncated-npy",
        lambda r: (_rm(r / "s2/labels/d.png"), (r / "s2/labels/d.npy").write_bytes(b"\x93NUMPY\x01\x00")),
        "s2/labels/d.npy",
        "cannot read",
    ),
    (
        "wrong-channel-count",
        lambda r: _png(r / "s1/images/c.png", np.zeros((8, 8), np.uint8)),
        "s1/images/c.png",
        "image has 1 channels but federation.yaml says channels: 3",
    ),
    (
        "rgba-image",
        lambda r: _png(r / "s1/images/c.png", np.zeros((8, 8, 4), np.uint8)),
        "s1/images/c.png",
        "image has 4 channels but federation.yaml says channels: 3 (RGBA",
    ),
    (
        "fractional-label",
        lambda r: (_rm(r / "s1/labels/a.png"), _npy(r / "s1/labels/a.npy", np.full((8, 8), 0.5, np.float32))),
        "s1/labels/a.npy",
        "label map is not integer (dtype float32, 64 fractional values, e.g. 0.5)",
    ),
    (
        "duplicate-case-id",
        lambda r: _npy(r / "s1/images/a.npy", np.zeros((3, 8, 8), np.uint8)),
        "s1/images",
        "duplicate case id 'a' (a.npy, a.png)",
    ),
    (
        "unsupported-file",
        lambda r: (r / "s2/images/notes.txt").write_text("hi"),
        "s2/images/notes.txt",
        "unsupported image file",
    ),
    ("missing-yaml", lambda r: _rm(r / "federation.yaml"), "federation.yaml", "missing"),
    (
        "invalid-yaml",
        lambda r: (r / "federation.yaml").write_text("name: [unclosed"),
        "federation.yaml",
        "not valid YAML",
    ),
    (
        "key-given-twice",
        lambda r: (r / "federation.yaml").write_text(yaml.safe_dump(HEADER) + "kind: 3d\n"),
        "federation.yaml",
        "key 'kind' given twice (lines 2 and 10); keep one",
    ),
    (
        "cases-csv-is-a-folder",
        lambda r: (r / "s1/cases.csv").mkdir(),
        "s1/cases.csv",
        "is a folder, not a file (the site's case metadata, header case,<columns>)",
    ),
    (
        "splits-csv-is-a-folder",
        lambda r: (r / "s2/splits.csv").mkdir(),
        "s2/splits.csv",
        "is a folder, not a file (the site's fixed splits, header case,split)",
    ),
    (
        "splits-csv-is-a-broken-link",
        lambda r: (r / "s2/splits.csv").symlink_to(r / "gone.csv"),
        "s2/splits.csv",
        "is neither a file nor a folder (a broken symbolic link or a link loop), not a file",
    ),
    (
        "labels-is-a-file",
        lambda r: ((r / "s3/images").mkdir(parents=True), (r / "s3/labels").write_text("")),
        "s3/labels",
        "is a file, not a folder (a site holds an images/ and a labels/ folder)",
    ),
    ("missing-key", lambda r: _set_header(r, channels=None), "federation.yaml", "missing key 'channels'"),
    (
        "wrong-type",
        lambda r: _set_header(r, channels="three"),
        "federation.yaml",
        "channels: expected a positive integer, got 'three'",
    ),
    ("bad-kind", lambda r: _set_header(r, kind="4d"), "federation.yaml", "kind: expected 2d or 3d, got '4d'"),
    ("empty-regions", lambda r: _set_header(r, regions={}), "federation.yaml", "regions: empty"),
    (
        "non-positive-label-value",
        lambda r: _set_header(r, regions={"disc": [0, 1]}),
        "federation.yaml",
        "regions.disc: expected a non-empty list of positive integer label values, got [0, 1]",
    ),
    ("unknown-key", lambda r: _set_header(r, chanels=3), "federation.yaml", "unknown key 'chanels'"),
    (
        "splits-unknown-case",
        lambda r: (r / "s1/splits.csv").write_text("case,split\nzzz,train\n"),
        "s1/splits.csv:2",
        "unknown case 'zzz'",
    ),
    (
        "splits-invalid-split",
        lambda r: (r / "s1/splits.csv").write_text("case,split\na,training\n"),
        "s1/splits.csv:2",
        "unknown split 'training'",
    ),
    (
        "nan-pixels",
        lambda r: (
            _rm(r / "s1/images/a.png"),
            _npy(r / "s1/images/a.npy", _with(np.zeros((3, 8, 8), np.float32), np.nan)),
        ),
        "s1/images/a.npy",
        "image has 2 NaN and 0 Inf values (of 192)",
    ),
    (
        "inf-pixels",
        lambda r: (
            _rm(r / "s2/images/e.png"),
            _npy(r / "s2/images/e.npy", _with(np.zeros((3, 8, 8), np.float64), np.inf)),
        ),
        "s2/images/e.npy",
        "image has 0 NaN and 2 Inf values (of 192)",
    ),
    (
        "one-case-site",
        lambda r: (
            _png(r / "s3/images/z.png", np.zeros((8, 8, 3), np.uint8)),
            _png(r / "s3/labels/z.png", np.zeros((8, 8), np.uint8)),
        ),
        "site 's3'",
        "no validation cases and no test cases after splitting (1 cases: 1 train, 0 val, 0 test)",
    ),
    (
        "no-training-cases",
        lambda r: (r / "s2/splits.csv").write_text("case,split\nd,val\ne,test\nf,test\n"),
        "site 's2'",
        "no training cases after splitting",
    ),
]


@pytest.mark.parametrize("name, breaks, where, problem", BROKEN, ids=[b[0] for b in BROKEN])
def test_each_problem_is_reported_with_its_file(root, name, breaks, where, problem):
    breaks(root)
    with pytest.raises(FederationError) as err:
        check_folder(root, SplitConfig(), seed=0)
    lines = [line for line in str(err.value).splitlines() if problem in line]
    assert lines, f"{problem!r} not in:\n{err.value}"
    assert any(where in line for line in lines), f"{where!r} not named in {lines}"


def test_every_problem_is_listed_one_per_line(root):
    (root / "s1/labels/a.png").unlink()
    _png(root / "s1/labels/b.png", np.full((8, 8), 9, np.uint8))
    _png(root / "s2/images/e.png", np.zeros((8, 8), np.uint8))
    (root / "s2/splits.csv").write_text("case,split\nd,test\nghost,train\n")
    with pytest.raises(FederationError) as err:
        check_folder(root)
    lines = str(err.value).splitlines()
    assert lines[0] == f"{root}: federation folder is invalid (4 problems):"
    assert sorted(line.strip().split(": ")[0] for line in lines[1:]) == sorted(
        [f"{root}/s1/images/a.png", f"{root}/s1/labels/b.png", f"{root}/s2/images/e.png", f"{root}/s2/splits.csv:3"]
    )


def test_valid_folder_passes_and_is_returned(root):
    (root / "s1/splits.csv").write_text("case,split\na,train\nb,val\nc,test\n")
    fed = check_folder(root, SplitConfig(mode="kfold", folds=3, fold=1), seed=2)
    assert fed.site_names == ["s1", "s2"] and [len(s.cases) for s in fed.sites] == [3, 3]
    assert fed.sites[0].fixed_splits == {"a": "train", "b": "val", "c": "test"}
    assert {c.meta["image_shape"] for s in fed.sites for c in s.cases} == {(3, 8, 8)}
    image, label = fed.sites[1].cases[0].arrays()
    assert image.shape == (3, 8, 8) and label.shape == (8, 8)


def test_float_label_map_with_integer_values_is_accepted(root):
    (root / "s1/labels/a.png").unlink()
    _npy(root / "s1/labels/a.npy", np.ones((8, 8), np.float64) * 2)
    label = check_folder(root).site("s1").cases[0].arrays()[1]
    assert label.dtype == np.uint8 and (label == 2).all()


def test_3d_folder_rejects_png_images(root):
    _set_header(root, kind="3d")
    with pytest.raises(FederationError, match=r"s1/images/a\.png: a PNG image is 2D but federation.yaml says kind: 3d"):
        check_folder(root)


def test_cli_check_reports_ok_with_a_summary(root):
    result = CliRunner().invoke(data_app, ["check", str(root)])
    assert result.exit_code == 0, result.output
    assert "OK:" in result.output and "2 sites, 6 cases" in result.output
    assert "s1" in result.output and "3×8×8" in result.output and "disc=[1, 2]" in result.output


def test_cli_check_exits_non_zero_with_the_message(root):
    (root / "s1/labels/a.png").unlink()
    result = CliRunner().invoke(data_app, ["check", str(root)])
    assert result.exit_code == 1
    assert f"{root}/s1/images/a.png: image without label" in result.output
    assert "Traceback" not in result.output


def test_cli_check_of_a_hospitals_folder_with_its_own_site_only(root):
    """A hospital's folder: the shared federation.yaml (naming both sites in its site metadata) and its own site
    folder only. `data check` refuses it as a federation (site s2 is missing) and passes it with --site s1, as
    `fedseg flower supernode` checks it; a --site the folder does not hold is one line."""
    import shutil

    header = yaml.safe_load((root / "federation.yaml").read_text())
    (root / "federation.yaml").write_text(
        yaml.safe_dump({**header, "sites": {"s1": {"grade": "a"}, "s2": {"grade": "b"}}})
    )
    shutil.rmtree(root / "s2")
    assert CliRunner().invoke(data_app, ["check", str(root)]).exit_code == 1
    result = CliRunner().invoke(data_app, ["check", str(root), "--site", "s1"])
    assert result.exit_code == 0, result.output
    assert "OK:" in result.output and "1 site, 3 cases" in result.output
    result = CliRunner().invoke(data_app, ["check", str(root), "--site", "s2"])
    assert result.exit_code == 1
    assert f"{root}: no folder for site 's2' (site folders here: s1)" in " ".join(result.output.split())


def test_cli_synth_uses_the_run_preset_data_settings_and_writes_a_valid_folder(tmp_path):
    from fedseg.config_load import load_config
    from fedseg.data.folder import load_folder
    from fedseg.data.synthetic import build_synthetic

    demo = load_config(preset="demo")
    out = tmp_path / "demo"
    result = CliRunner().invoke(data_app, ["synth", "--preset", "demo", "--out", str(out), "--scale", "0.02"])
    assert result.exit_code == 0, result.output
    written = load_folder(out)
    expected = build_synthetic(demo.data.source, scale=0.02, image_size=demo.data.image_size, seed=demo.data.seed)
    assert written.name == demo.data.source and written.site_names == expected.site_names
    first, again = expected.sites[0].cases[0], written.sites[0].cases[0]
    for x, y in zip(first.arrays(), again.arrays()):
        assert x.dtype == y.dtype
        np.testing.assert_array_equal(x, y)
    assert again.arrays()[0].shape[1:] == (demo.data.image_size,) * 2


def test_cli_synth_rejects_an_unknown_name(tmp_path):
    result = CliRunner().invoke(data_app, ["synth", "--preset", "no-such-thing", "--out", str(tmp_path / "x")])
    assert result.exit_code == 1
    assert "no-such-thing" in result.output and "synthetic-retina" in result.output
    assert not (tmp_path / "x").exists()


def _many_pngs(tmp_path: Path, n: int, **header) -> Path:
    root = tmp_path / "many"
    root.mkdir()
    _set_header(root, **header)
    for i in range(n):
        _png(root / "s1" / "images" / f"case{i:02d}.png", np.zeros((4, 4, 3), np.uint8))
        _png(root / "s1" / "labels" / f"case{i:02d}.png", np.zeros((4, 4), np.uint8))
    return root


def test_repeated_problems_are_grouped_naming_the_first_files(tmp_path):
    root = _many_pngs(tmp_path, 30, kind="3d")
    result = CliRunner().invoke(data_app, ["check", str(root)])
    assert result.exit_code == 1
    lines = result.output.strip().splitlines()
    assert len(lines) < 15, result.output
    assert "(60 problems)" in lines[0]  # the count is the total: image and label of every case
    for i in range(3):
        assert f"s1/images/case{i:02d}.png: a PNG image is 2D but federation.yaml says kind: 3d" in result.output
    assert "s1/images/case03.png" not in result.output
    assert result.output.count("... and 27 more like this") == 2  # images, then labels


def test_wrong_channel_count_is_grouped(tmp_path):
    root = _many_pngs(tmp_path, 10, channels=1)
    with pytest.raises(FederationError) as err:
        check_folder(root)
    lines = str(err.value).splitlines()
    assert len(lines) == 5 and lines[-1].strip() == "... and 7 more like this"
    assert "s1/images/case00.png: image has 3 channels but federation.yaml says channels: 1" in lines[1]


def test_group_problems_keeps_distinct_problems_apart():
    from fedseg.data.folder import group_problems

    problems = [f"/d/s1/labels/{c}.png: label without image (no images/{c}.<png|npy>)" for c in "abcde"]
    problems += ["/d/federation.yaml: missing key 'name'", "/d/s2: empty site (no case with both an image and a label)"]
    assert group_problems(problems) == [*problems[:3], "... and 2 more like this", *problems[5:]]


def test_cli_check_warns_about_large_images_once_per_kind_and_passes(root):
    from typer.testing import CliRunner

    from fedseg.cli import app

    result = CliRunner().invoke(app, ["data", "check", str(root), "--max-image-mb", "0.0005"])  # 8x8x3 floats: 768 B
    assert result.exit_code == 0, result.output
    warnings = [line for line in result.output.splitlines() if line.startswith("warning:")]
    assert "image is 0.000768 MB as float32 (3x8x8), above 0.0005 MB" in warnings[0]
    assert len(warnings) == 4 and "and 3 more like this" in warnings[-1]  # 6 images: 3 shown, then a count
    quiet = CliRunner().invoke(app, ["data", "check", str(root)])
    assert quiet.exit_code == 0 and "warning:" not in quiet.output


def _without_the_cup(labels) -> None:
    """Rewrite each label PNG with its cup (value 2) as disc (1)."""
    for label in labels:
        array = np.asarray(Image.open(label)).copy()
        array[array == 2] = 1
        _png(label, array)


def test_a_region_no_case_holds_is_a_warning_naming_it(root):
    """Label value 2 in no case (the annotations number the cup otherwise?): the check passes with one warning line
    naming the region, since every model would learn it as background; with the value back, no warning."""
    _without_the_cup(root.glob("*/labels/*.png"))
    assert check_warnings(root) == [
        "warning: region 'cup' (label value 2): no voxel in any of the 6 cases: every model would learn it as "
        "background (do the labels number it otherwise?)"
    ]
    for site in ("s1", "s2"):
        _png(next(root.glob(f"{site}/labels/*.png")), np.full((8, 8), 2, np.uint8))
    assert check_warnings(root) == []


def check_warnings(root: Path) -> list[str]:
    """The ``warning:`` lines of ``fedseg data check ROOT``, which must pass."""
    result = CliRunner().invoke(data_app, ["check", str(root)])
    assert result.exit_code == 0, result.output
    return [line for line in result.output.splitlines() if line.startswith("warning: ")]


def test_a_key_given_twice_in_federation_yaml_is_the_one_problem_named(root):
    """`kind: 2d` then `kind: 3d`: YAML keeps the last, and the check listed every PNG as "2D but kind: 3d" without
    naming the cause. As a config or bench file, the file is refused: one line naming it, the key and its lines."""
    (root / "federation.yaml").write_text("name: toy\nkind: 2d\nkind: 3d\nchannels: 3\nregions: {disc: [1, 2]}\n")
    result = CliRunner().invoke(data_app, ["check", str(root)])
    assert result.exit_code == 1
    assert result.output.splitlines() == [
        f"error: {root}: federation folder is invalid: {root}/federation.yaml: key 'kind' given twice (lines 2 and 3); "
        "keep one",
    ], result.output


def test_a_folder_where_federation_yaml_goes_is_one_problem_not_a_site(root):
    """A folder named federation.yaml was also reported as a folder that is not a site."""
    (root / "federation.yaml").unlink()
    (root / "federation.yaml").mkdir()
    with pytest.raises(FederationError) as err:
        check_folder(root)
    assert str(err.value).splitlines() == [
        f"{root}: federation folder is invalid: {root}/federation.yaml: is a folder, not a file (every federation "
        "folder needs a federation.yaml)",
    ]


@pytest.mark.parametrize("value", ["nan", "-1", "0", "inf"])
def test_a_max_image_mb_that_is_no_positive_number_is_refused(root, value):
    """`--max-image-mb nan` passed with a warning "above nan MB" for every image; -1 and 0 flag every image."""
    result = CliRunner().invoke(data_app, ["check", str(root), "--max-image-mb", value])
    assert result.exit_code == 1
    shown = f"{float(value):g}"
    assert result.output.splitlines() == [f"error: --max-image-mb {shown}: expected a positive number (MB)"]


def test_a_folder_name_too_long_is_one_line_naming_it(tmp_path):
    """A 300-character ROOT gave `error: [Errno 36] File name too long: '...'` (or a traceback)."""
    root = tmp_path / ("x" * 300)
    result = CliRunner().invoke(data_app, ["check", str(root)])
    assert result.exit_code == 1, result.output
    assert result.output.splitlines() == [f"error: {root}: File name too long"], result.output


def test_a_1_bit_png_mask_reads_as_0_and_1(root):
    """A bilevel (PIL mode "1") mask, as image editors save a binary mask: its pixels are 0/1, but read through
    grey-scale they were 0/255 and every case failed with "label values 255 are not in any region"."""
    from fedseg.data.case_files import read_label

    mask = np.zeros((8, 8), bool)
    mask[2:5, 3:6] = True
    path = root / "s1" / "labels" / "a.png"
    Image.fromarray(mask).convert("1").save(path)
    assert Image.open(path).mode == "1"
    np.testing.assert_array_equal(read_label(path, "2d"), mask.astype(np.uint8))
    assert check_warnings(root) == []  # the federation still checks


def test_an_empty_images_folder_is_one_problem(root):
    for path in (root / "s1" / "images").iterdir():
        path.unlink()
    with pytest.raises(FederationError) as err:
        check_folder(root)
    assert str(err.value) == (
        f"{root}: federation folder is invalid: {root}/s1/images: no image files, for the 3 labels of the site"
    )


def test_a_blank_image_is_a_warning_naming_it(root):
    """An all-zero (or constant) image with a non-empty label was imported, checked and trained on without a word
    (a fresh-eyes 3D CT study: a failed export): the check passes with a warning naming the file."""
    _png(root / "s1" / "images" / "b.png", np.zeros((8, 8, 3), np.uint8))
    (line,) = check_warnings(root)
    assert line == (
        f"warning: {root}/s1/images/b.png: every voxel holds the same value (a blank or failed export?): nothing to "
        "learn from"
    )


def test_sites_whose_volumes_lie_in_other_voxel_orientations_get_one_warning(tmp_path):
    """One hospital's NIfTIs stored RAS, another's rotated in-plane as its scanner wrote them (an LPS MetaImage
    whose rows run posterior): fedseg reads each in its stored voxel order, so the network would see one site's
    anatomy turned against the other's without a word. The check passes with one line naming both orientations
    and sites; reoriented to one, no warning."""
    import itk
    import nibabel as nib

    root = tmp_path / "fed"
    root.mkdir()
    (root / "federation.yaml").write_text(
        yaml.safe_dump({"name": "vol", "kind": "3d", "channels": 1, "regions": {"organ": [1]}})
    )
    rng = np.random.default_rng(0)
    label = np.zeros((6, 5, 4), np.uint8)
    label[2:4, 1:4, 1:3] = 1
    rotated = np.array([[0.0, -1.0, 0.0], [1.0, 0.0, 0.0], [0.0, 0.0, 1.0]])  # ITK's LPS direction: rows run P

    def mha(path: Path, data: np.ndarray, direction: np.ndarray) -> None:
        image = itk.image_from_array(np.ascontiguousarray(data.T))
        image.SetSpacing([1.0, 1.0, 3.0])
        image.SetDirection(itk.matrix_from_array(direction.copy()))
        itk.imwrite(image, str(path))

    for site in ("a", "b"):
        (root / site / "images").mkdir(parents=True)
        (root / site / "labels").mkdir()
        for k in range(3):
            image = rng.normal(100, 10, label.shape).astype(np.float32) + 50 * label
            if site == "a":
                for path, data in (
                    (root / site / "images" / f"{site}{k}.nii.gz", image),
                    (root / site / "labels" / f"{site}{k}.nii.gz", label),
                ):
                    nib.save(nib.Nifti1Image(data, np.diag([1.0, 1.0, 3.0, 1.0])), path)
            else:
                mha(root / site / "images" / f"{site}{k}.mha", image, rotated)
                mha(root / site / "labels" / f"{site}{k}.mha", label, rotated)
    assert check_warnings(root) == [
        "warning: the volumes lie in 2 voxel orientations: PRS (3 cases: b, e.g. b0); RAS (3 cases: a, e.g. a0); "
        "fedseg reads each in its stored voxel order, never reoriented, so a network sees these cases' anatomy "
        "turned or mirrored against one another: `fedseg data reorient` writes a copy with all in one (axes permuted "
        "and flipped, nothing resampled) unless your augmentation covers it"
    ]
    for k in range(3):  # site b rewritten in site a's orientation: nothing to say
        for folder in ("images", "labels"):
            (root / "b" / folder / f"b{k}.mha").unlink()
        image = rng.normal(100, 10, label.shape).astype(np.float32) + 50 * label
        mha(root / "b" / "images" / f"b{k}.mha", image, np.diag([-1.0, -1.0, 1.0]))  # LPS of RAS axes
        mha(root / "b" / "labels" / f"b{k}.mha", label, np.diag([-1.0, -1.0, 1.0]))
    assert check_warnings(root) == []


def test_a_3d_folder_says_how_much_memory_a_run_keeps_its_cases_in(tmp_path, monkeypatch):
    """A scale study: nothing said before a run how much RAM its BraTS-sized cases would take (they all stay in
    memory); the check now gives the upper bound from the shapes it read, and none for 2D."""
    monkeypatch.delenv("FEDSEG_PREPARED_CACHE", raising=False)
    import nibabel as nib

    root = tmp_path / "fed"
    root.mkdir()
    regions = {"wt": [1, 2], "tc": [2]}
    (root / "federation.yaml").write_text(
        yaml.safe_dump({"name": "vol", "kind": "3d", "channels": 2, "regions": regions})
    )
    shapes = {"a": (20, 16, 10), "b": (30, 16, 12)}
    for site, shape in shapes.items():
        (root / site / "images").mkdir(parents=True)
        (root / site / "labels").mkdir()
        for k in range(3):
            label = np.zeros(shape, np.uint8)
            label[4:8, 4:8, 2:5] = 1 + k % 2
            image = np.random.default_rng(k).normal(size=(*shape, 2)).astype(np.float32)
            nib.save(nib.Nifti1Image(image, np.eye(4)), root / site / "images" / f"{site}{k}.nii.gz")
            nib.save(nib.Nifti1Image(label, np.eye(4)), root / site / "labels" / f"{site}{k}.nii.gz")
    result = CliRunner().invoke(data_app, ["check", str(root)])
    assert result.exit_code == 0, result.output
    per_voxel = 4 * 2 + 2 * 2  # float32 image of 2 channels, bool masks of 2 regions and their original-grid copy
    total = sum(3 * per_voxel * int(np.prod(shape)) for shape in shapes.values())
    line = " ".join(result.output.split())
    said = f"keeps these 6 cases in about {total / 1e9:.3g} GB of RAM ({total / 6 / 1e6:.3g} MB per case on the files"
    assert said in line
    assert "set FEDSEG_PREPARED_CACHE=DIR to prepare each case once and map its volume from disk" in line
    # the whole-image path (--preset demo on a 3D folder) keeps each case at data.image_size³, not on its files'
    # grid: these small files take some 80x more there (0.0252 GB), and the note gave only the volume path's 0.000323
    whole = sum(3 * (4 * (2 + 2) * 64**3 + 2 * int(np.prod(shape)) / 8) for shape in shapes.values())
    assert (
        "That is not what a run on the whole-image path keeps (no data.volume.patch_size: --preset demo and the "
        "synthetic presets): it resizes every case to data.image_size per axis, at the default 64³ about "
        f"{whole / 1e9:.3g} GB ({whole / 6 / 1e6:.3g} MB per case: float32 image and masks, whatever the files' size, "
        "and the original-grid truth a bit a voxel)"
    ) in line, line


def test_a_region_one_site_never_holds_is_a_warning_naming_that_site(root):
    """Institutions annotating different structures: s2's labels never hold the cup (value 2) while every case of
    s1's does. Every region is trained at every site, so s2's cases would teach every model that the cup is background:
    one line names the region and s2 with its case count; once one of s2's cases holds it, none."""
    labels = sorted((root / "s2" / "labels").glob("*.png"))
    _without_the_cup(labels)
    assert check_warnings(root) == [
        "warning: region 'cup' (label value 2): no voxel in any case of s2 (3 cases), while at least 100% of the "
        "cases hold it at the 1 site that does (none by chance: at most 0): if s2 does not annotate it, every model "
        "learns it as background there (fedseg trains every region at every site; sites that annotate different "
        "structures are not supported: train on sites that annotate the same ones)"
    ]
    _png(labels[0], np.full((8, 8), 2, np.uint8))
    assert check_warnings(root) == []


def _site(cases: int, holding: int, value: int = 2) -> SiteLabels:
    """``cases`` annotated cases, the first ``holding`` of which hold label ``value`` (all hold 1)."""
    site = SiteLabels()
    for k in range(cases):
        site.add({0, 1, value} if k < holding else {0, 1}, ignore=9)
    return site


def test_a_site_is_named_only_where_chance_does_not_explain_the_region_it_lacks():
    """A rare structure (in a third of the cases where it occurs: enhancing tumour at low-grade glioma sites) is
    missing from a site of 3 cases by chance (2/3 ** 3 = 0.30) and no line names it; a site of 12 such cases
    (0.0077) is named. A site of fewer than MIN_SITE_CASES annotated cases, or whose cases hold only the ignore
    label, is never named, nor a region no site holds (empty_region_warnings says that one)."""
    regions = Regions.from_mapping({"disc": [1, 2], "cup": [2], "vessel": [3]}, ignore=9)
    common = {"a": _site(9, 3), "b": _site(6, 2)}
    assert region_site_warnings(regions, {**common, "small": _site(3, 0)}) == []
    (line,) = region_site_warnings(regions, {**common, "large": _site(12, 0)})
    assert line.startswith("region 'cup' (label value 2): no voxel in any case of large (12 cases), while at least 33%")
    assert "(none by chance: at most 0.0077): if large does not annotate it" in line
    unannotated = SiteLabels()
    for _ in range(MIN_SITE_CASES):
        unannotated.add({9}, ignore=9)  # only the ignore label: no annotated case
    everywhere = {"a": _site(4, 4)}
    assert region_site_warnings(regions, {**everywhere, "few": _site(MIN_SITE_CASES - 1, 0), "c": unannotated}) == []
    (line,) = region_site_warnings(regions, {**everywhere, "enough": _site(MIN_SITE_CASES, 0)})
    assert line.startswith(f"region 'cup' (label value 2): no voxel in any case of enough ({MIN_SITE_CASES} cases)")


def test_the_built_in_brain_tumour_federation_is_not_said_to_annotate_differently(tmp_path):
    """synthetic-brats (fets-cpu) has low-grade sites whose few cases hold no enhancing tumour by chance: no line."""
    out = tmp_path / "brats"
    synth = CliRunner().invoke(data_app, ["synth", "--preset", "fets-cpu", "--out", str(out)])
    assert synth.exit_code == 0, synth.output
    warnings: list[str] = []
    check_folder(out, warnings=warnings)
    assert not [w for w in warnings if "annotate" in w], warnings
