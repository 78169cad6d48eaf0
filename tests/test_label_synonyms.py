"""One structure spelled differently at each hospital: ``label_names: {1: [tumor, GTV Tumour]}``.

Hospital A's planning system calls the structure "Tumor", hospital B's "GTV_Tumour". A ``label_names`` entry may list
several names for one label value: the first is the label's name (what exporters, reports and ``fedseg predict``
write), every one is matched when RTSTRUCT ROIs and DICOM-SEG segments are read. Real RT Structure Sets (written with
pydicom, as ``tests/test_rtstruct.py`` writes them) on NIfTI images of their grid: the whole folder's and one
hospital's data check pass, the labels read equal, an nnU-Net export writes one class; a list that cannot be meant
is refused in one line; a changed list re-reads the labels (prepared-case cache); a Flower site's own spellings are
its own.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import nibabel as nib
import numpy as np
import pytest
import yaml
from typer.testing import CliRunner

from fedseg.data import dicom_seg
from fedseg.data.cli import data_app
from fedseg.data.federation import FederationError
from fedseg.data.folder import HEADER_FILE, Header, load_folder, read_header, write_header
from test_data_check import check_warnings
from test_rtstruct import COL, NORMAL, ORIGIN, ROW, SHAPE, expected_label, structures, write_rtstruct

pytest.importorskip("pydicom")

SPELLED = {"hospA": "Tumor", "hospB": "GTV_Tumour"}  # each hospital's name for the one structure
SYNONYMS = {0: "background", 1: ["tumor", "GTV Tumour"]}
HEADER = {"name": "rt", "kind": "3d", "channels": 1, "regions": {"tumor": [1]}, "label_names": SYNONYMS}
TUMOR = expected_label((("ctv", 1),))  # the ctv contours of test_rtstruct painted as label 1


def write_image(path: Path, seed: int) -> Path:
    """A NIfTI CT of the structure sets' grid (test_rtstruct's oblique series), random voxels."""
    affine = np.eye(4)
    affine[:3, 0], affine[:3, 1], affine[:3, 2], affine[:3, 3] = ROW * 0.7, COL * 0.7, NORMAL * 2.5, ORIGIN
    values = np.random.default_rng(seed).integers(0, 1000, SHAPE).astype(np.int16)
    path.parent.mkdir(parents=True, exist_ok=True)
    nib.save(nib.Nifti1Image(values, np.diag([-1, -1, 1, 1]) @ affine), path)
    return path


def rt_sites(root: Path, label_names=SYNONYMS, spelled=SPELLED, cases: int = 3, rois=None) -> Path:
    """A folder federation at ``root``: per site ``cases`` NIfTI images, each labelled by an RTSTRUCT whose tumour ROI
    is named as that site names it (with a BODY beside it), or of ``rois(site name)``."""
    (root).mkdir(parents=True)
    (root / HEADER_FILE).write_text(yaml.safe_dump({**HEADER, "label_names": label_names}, sort_keys=False))
    for s, (site, name) in enumerate(spelled.items()):
        contours = rois(name) if rois else {name: structures()["ctv"], "BODY": structures()["BODY"]}
        rs = write_rtstruct(root.parent / f"{root.name}-{site}.dcm", contours)
        for i in range(cases):
            write_image(root / site / "images" / f"c{i}.nii.gz", 10 * s + i)
            (root / site / "labels").mkdir(exist_ok=True)
            shutil.copy(rs, root / site / "labels" / f"c{i}.dcm")
    return root


def one_site(root: Path, site: str, out: Path) -> Path:
    """A hospital's folder: the federation's federation.yaml and its own site folder only."""
    out.mkdir()
    shutil.copy(root / HEADER_FILE, out / HEADER_FILE)
    shutil.copytree(root / site, out / site)
    return out


def test_one_structure_spelled_differently_at_each_site_reads_as_one_label(tmp_path):
    root = rt_sites(tmp_path / "fed")
    assert check_warnings(root) == []  # no "label 'GTV Tumour' is named by no ROI" at hospital A, nor B's
    header = read_header(root)
    assert header.label_names == {0: "background", 1: "tumor"} and header.label_synonyms == {1: ("GTV Tumour",)}
    fed = load_folder(root)
    assert fed.label_names == {0: "background", 1: "tumor"} and fed.label_synonyms == {1: ("GTV Tumour",)}
    labels = {(site.name, case.id): case.arrays()[1] for site in fed.sites for case in site.cases}
    assert len(labels) == 6
    for where, label in labels.items():
        np.testing.assert_array_equal(label, TUMOR, err_msg=str(where))
    for site in SPELLED:  # each hospital's own check, as its Flower SuperNode runs it
        folder = one_site(root, site, tmp_path / f"only-{site}")
        result = CliRunner().invoke(data_app, ["check", str(folder), "--site", site])
        assert result.exit_code == 0, result.output
        assert not [line for line in result.output.splitlines() if line.startswith("warning: ")], result.output

    out = tmp_path / "nnunet"
    result = CliRunner().invoke(data_app, ["export", "nnunet", str(root), "--out", str(out)])
    assert result.exit_code == 0, result.output
    dataset = next(out.iterdir())
    assert json.loads((dataset / "dataset.json").read_text())["labels"] == {"background": 0, "tumor": 1}
    written = sorted((dataset / "labelsTr").iterdir()) + sorted((dataset / "labelsTs").iterdir())
    assert len(written) == 6
    for path in written:
        assert set(np.unique(np.asarray(nib.load(path).dataobj)).tolist()) == {0, 1}, path.name


def test_without_the_other_name_the_second_hospitals_check_fails_as_before(tmp_path):
    """The single-name form reads as it always did: hospital B's "GTV_Tumour" names no label, so its own check
    refuses its structure sets, listing their ROIs and the label names."""
    root = rt_sites(tmp_path / "fed", label_names={0: "background", 1: "tumor"}, spelled={"hospB": "GTV_Tumour"})
    assert read_header(root) == Header(
        "rt", "3d", 1, read_header(root).regions, {0: "background", 1: "tumor"}, label_synonyms=None
    )
    result = CliRunner().invoke(data_app, ["check", str(root), "--site", "hospB"])
    assert result.exit_code == 1
    assert (
        "labels/c0.dcm: no ROI of this RTSTRUCT names a label of label_names (federation.yaml); its ROIs: "
        "'GTV_Tumour', 'BODY'; label_names: 1: tumor"
    ) in " ".join(result.output.split()), result.output
    # a third spelling, listed nowhere: the refusal lists every name of the label
    third = rt_sites(tmp_path / "fed3", spelled={"hospC": "Gross_Tumour"}, cases=1)
    result = CliRunner().invoke(data_app, ["check", str(third)])
    assert result.exit_code == 1
    assert "its ROIs: 'Gross_Tumour', 'BODY'; label_names: 1: tumor or GTV Tumour" in " ".join(result.output.split())


def test_a_label_none_of_whose_names_a_structure_set_names_is_refused_naming_them_all(tmp_path):
    names = {0: "background", 1: ["tumor", "GTV Tumour"], 2: ["lymph node", "LN_1"]}
    root = rt_sites(tmp_path / "fed", label_names=names, spelled={"hospA": "Tumor"})
    result = CliRunner().invoke(data_app, ["check", str(root)])
    assert result.exit_code == 1
    assert (
        "label_names 2: 'lymph node' (or 'LN_1') is named by no ROI in any of the 3 RTSTRUCTs read, so no case "
        "would hold it; their ROIs: 'BODY', 'Tumor'"
    ) in " ".join(result.output.split()), result.output
    # the first or any other name of the list counts: a site whose ROIs name 'LN 1' holds label 2
    both = {"Tumor": structures()["ctv"], "LN 1": structures()["GTV Primary"], "BODY": structures()["BODY"]}
    other = rt_sites(tmp_path / "fed2", label_names=names, spelled={"hospA": "Tumor"}, rois=lambda _: both)
    fed = load_folder(other)
    label = fed.sites[0].cases[0].arrays()[1]
    np.testing.assert_array_equal(label, expected_label((("ctv", 1), ("GTV Primary", 2))))


def test_the_single_name_form_parses_to_the_same_header_and_writes_back_the_same(tmp_path):
    (tmp_path / "one").mkdir()
    (tmp_path / "list").mkdir()
    (tmp_path / "one" / HEADER_FILE).write_text(yaml.safe_dump({**HEADER, "label_names": {1: "tumor"}}))
    (tmp_path / "list" / HEADER_FILE).write_text(yaml.safe_dump({**HEADER, "label_names": {1: ["tumor"]}}))
    single, listed = read_header(tmp_path / "one"), read_header(tmp_path / "list")
    assert single == listed and single.label_names == {1: "tumor"} and single.label_synonyms is None
    root = rt_sites(tmp_path / "fed", cases=1)
    fed = load_folder(root)
    (tmp_path / "back").mkdir()
    write_header(tmp_path / "back", fed)
    written = yaml.safe_load((tmp_path / "back" / HEADER_FILE).read_text())
    assert written["label_names"] == {0: "background", 1: ["tumor", "GTV Tumour"]}
    assert read_header(tmp_path / "back").label_synonyms == {1: ("GTV Tumour",)}
    write_header(tmp_path / "one", load_folder(rt_sites(tmp_path / "plain", {0: "background", 1: "tumor"}, cases=1)))
    assert yaml.safe_load((tmp_path / "one" / HEADER_FILE).read_text())["label_names"] == {0: "background", 1: "tumor"}


@pytest.mark.parametrize(
    ("names", "said"),
    [
        ({1: []}, "label_names 1: an empty list; give the label's name (then any other names for it)"),
        ({1: ["tumor", 5]}, "label_names 1: 5 in ['tumor', 5] is not a name; list the names as non-empty strings"),
        (
            {1: ["tumor", " "]},
            "label_names 1: ' ' in ['tumor', ' '] is not a name; list the names as non-empty strings",
        ),
        (
            {1: ["tumor", "GTV Tumour"], 2: "gtv-tumour"},
            "label_names 2: 'gtv-tumour' is also a name of label 1 ('GTV Tumour'; names compare case-insensitively, "
            "`_` and `-` as spaces); a name may name one label value only",
        ),
        (
            {1: "Tumor", 2: ["node", "TUMOR"]},
            "label_names 2: 'TUMOR' is also a name of label 1 ('Tumor'; names compare case-insensitively, `_` and "
            "`-` as spaces); a name may name one label value only",
        ),
        (
            {1: {"a": "b"}},
            "label_names: expected a mapping label value (integer >= 0) -> name (or a list of names, the first the "
            "label's), got {1: {'a': 'b'}}",
        ),
    ],
    ids=["empty", "number", "blank", "two-values", "single-and-list", "mapping"],
)
def test_a_list_that_cannot_be_meant_is_one_line_naming_the_file_and_field(tmp_path, names, said):
    (tmp_path / HEADER_FILE).write_text(yaml.safe_dump({**HEADER, "label_names": names}))
    with pytest.raises(FederationError) as e:
        read_header(tmp_path)
    assert str(e.value) == f"{tmp_path / HEADER_FILE}: {said}"


def test_dicom_seg_segments_are_matched_by_any_of_a_labels_names(tmp_path, caplog):
    """A SEG whose segments are "GTV_Tumour" and "Liver" (hospital B's tool) against ``{1: [tumor, GTV Tumour]}``:
    the tumour read as label 1, the liver not read; hospital A's "Tumor" the same. Without the other name B's SEG
    names no label and would be read by segment number."""
    pytest.importorskip("itk")
    pytest.importorskip("highdicom")
    from fedseg.data.case_files import read_label
    from test_readers import LABEL, VALUES, write_seg, write_series

    sources = write_series(tmp_path / "ct", VALUES)
    names, synonyms = {0: "background", 1: "tumor"}, {1: ("GTV Tumour",)}
    for spelled in ("GTV_Tumour", "Tumor"):
        seg = write_seg(tmp_path / f"{spelled}.dcm", sources, LABEL, {1: spelled, 2: "Liver"})
        got = read_label(seg, "3d", image=tmp_path / "ct", label_names=names, label_synonyms=synonyms)
        np.testing.assert_array_equal(got, (LABEL == 1).astype(got.dtype), err_msg=spelled)
    seg = Path("seg.dcm")
    assert dicom_seg.segment_values({1: "GTV_Tumour", 2: "Liver"}, names, seg) == {1: 1, 2: 2}  # by number
    assert dicom_seg.segment_values({1: "Liver", 2: "gtv tumour"}, names, seg, synonyms) == {1: 0, 2: 1}


def test_a_changed_synonym_list_re_reads_the_labels_never_a_stale_one(tmp_path, monkeypatch):
    """Prepared-case cache: each structure set holds "Tumor" and "GTV_Tumour" (two parts of the structure); with
    ``{1: tumor}`` only the first is label 1, with ``{1: [tumor, GTV Tumour]}`` both: a new key, the new labels, the
    same tensors as prepared without the cache; back to the single name, the first entries again."""
    from fedseg.config import VolumeConfig
    from fedseg.data.prepared import PREPARED_CACHE_ENV, SUFFIX
    from test_prepare_threads import SPLITS, _assert_same, _site

    cache = tmp_path / "prepared"
    monkeypatch.setenv(PREPARED_CACHE_ENV, str(cache))
    volume = VolumeConfig(patch_size=(8, 8, 8), spacing=(1.0, 1.0, 2.5))
    parts = {"Tumor": structures()["ctv"], "GTV_Tumour": structures()["GTV Primary"]}
    root = rt_sites(tmp_path / "fed", {0: "background", 1: "tumor"}, {"s": "x"}, rois=lambda _: parts)

    def prepared(label_names) -> tuple[object, list[np.ndarray]]:
        header = yaml.safe_load((root / HEADER_FILE).read_text())
        (root / HEADER_FILE).write_text(yaml.safe_dump({**header, "label_names": label_names}, sort_keys=False))
        fed = load_folder(root)
        site = _site(fed, 1, volume=volume)
        with monkeypatch.context() as m:
            m.delenv(PREPARED_CACHE_ENV)
            plain = _site(fed, 1, volume=volume)
        for split in SPLITS:
            _assert_same(plain.split(split), site.split(split))
        return site, [case.arrays()[1] for case in fed.sites[0].cases]

    def entries() -> int:
        return len(list(cache.glob(f"*/*/*{SUFFIX}")))

    before, labels = prepared({0: "background", 1: "tumor"})
    assert entries() == 3
    np.testing.assert_array_equal(labels[0], expected_label((("ctv", 1),)))
    after, labels = prepared(SYNONYMS)
    assert entries() == 6  # every case prepared again
    union = (expected_label((("ctv", 1),)) > 0) | (expected_label((("GTV Primary", 1),)) > 0)
    np.testing.assert_array_equal(labels[0], union.astype(np.uint8))
    assert any(
        not np.array_equal(a.label.numpy(), b.label.numpy())
        for a, b in zip(before.split("train").volumes or [], after.split("train").volumes or [], strict=True)
    )
    prepared({0: "background", 1: "tumor"})
    assert entries() == 6  # the single name's entries again


def test_each_flower_site_may_list_its_own_spellings(tmp_path, tiny_config):
    """The synonyms are a hospital's local knowledge: the header sites and coordinator agree on (kind, channels,
    regions, ignore label) leaves label names out, so hospital B's federation.yaml may list "GTV Tumour" where the
    coordinator's lists "tumor" alone; the coordinator's record of the federation carries no synonyms."""
    from fedseg.flower import node
    from fedseg.flower.server import federation_from_record, federation_record
    from test_flower_node import _context, _info

    root = rt_sites(tmp_path / "fed")
    coordinator = one_site(root, "hospA", tmp_path / "coordinator")
    (coordinator / HEADER_FILE).write_text(yaml.safe_dump({**HEADER, "label_names": {0: "background", 1: "tumor"}}))
    theirs = load_folder(coordinator)
    site_b = one_site(root, "hospB", tmp_path / "hospB")
    ours = load_folder(site_b, all_sites=False)
    assert ours.label_synonyms == {1: ("GTV Tumour",)} and theirs.label_synonyms is None
    assert node.federation_header(ours) == node.federation_header(theirs)
    record = json.loads(federation_record(ours))
    assert record["label_names"] == {"0": "background", "1": "tumor"} and "label_synonyms" not in record
    assert federation_from_record(federation_record(ours)).label_synonyms is None
    reply = node.handle(_info(theirs), _context("hospB", site_b, tiny_config()))
    assert not reply.has_error(), reply.error.reason if reply.has_error() else ""
    assert dict(reply.content[node.ENGINE])["cases"] == 3
