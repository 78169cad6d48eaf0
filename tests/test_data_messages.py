"""One clear line per problem on the DICOM / folder-format data path (found by a fresh-eyes study): names that
differ only in Unicode normalisation, a DICOM-SEG cut short, a SEG of another patient on a slightly shifted grid, a
series nested one level too deep, a site folder given for its federation, an empty slice, Windows' junk files."""

from __future__ import annotations

import unicodedata
from pathlib import Path

import numpy as np
import pytest
import yaml
from PIL import Image
from typer.testing import CliRunner

pytest.importorskip("itk")
pytest.importorskip("pydicom")
pytest.importorskip("highdicom")

from fedseg.data import dicom_seg, dicom_series  # noqa: E402
from fedseg.data.case_files import read_label  # noqa: E402
from fedseg.data.check import check_folder  # noqa: E402
from fedseg.data.cli import data_app  # noqa: E402
from fedseg.data.federation import FederationError  # noqa: E402
from fedseg.data.folder import load_folder, scan_site  # noqa: E402
from test_readers import LABEL, ORIGIN, VALUES, write_seg, write_series  # noqa: E402  (after the importorskips)

DAMAGED = "a truncated or damaged file (an interrupted copy?)"
SERIES = "a case folder in images/ must hold the .dcm files of one DICOM series"


@pytest.fixture(scope="module")
def case(tmp_path_factory) -> dict[str, Path]:
    """A DICOM series and its DICOM-SEG, written once for the module."""
    d = tmp_path_factory.mktemp("case")
    sources = write_series(d / "series", VALUES)
    return {"series": d / "series", "seg": write_seg(d / "seg.dcm", sources, LABEL)}


def _site(root: Path, name: str = "s1") -> Path:
    site = root / name
    (site / "images").mkdir(parents=True)
    (site / "labels").mkdir()
    return site


def _png(path: Path, value: int = 0) -> None:
    Image.fromarray(np.full((8, 8), value, np.uint8)).save(path)


# --- 1. names that differ only in Unicode normalisation -----------------------------------------------------------


def test_names_that_differ_only_in_unicode_normalisation_are_one_line_per_pair(tmp_path):
    """``José_Peña`` as macOS writes it (NFD: ``e`` + a combining accent) beside the same name typed on Linux (NFC)
    looks identical: one line for the pair saying so and how to rename, not an "image without label" and a "label
    without image" for names that print alike."""
    site = _site(tmp_path)
    nfd, nfc = unicodedata.normalize("NFD", "José_Peña"), unicodedata.normalize("NFC", "José_Peña")
    assert nfd != nfc
    _png(site / "images" / f"{nfd}.png")
    _png(site / "labels" / f"{nfc}.png")
    _png(site / "images" / "ok.png")
    _png(site / "labels" / "ok.png")
    sites, problems = scan_site(site)
    assert problems == [
        f"{site}: images/{nfd}.png (NFD) and labels/{nfc}.png (NFC) differ only in Unicode normalisation (names "
        "copied from a Mac?), so they do not pair; rename one to the other's spelling, e.g. all to NFC: convmv -r -f "
        f"utf8 -t utf8 --nfc --notest {site}"
    ]
    assert list(sites.cases) == ["ok"]
    (site / "images" / "ok.png").unlink()  # the pair is the site's only case: no "empty site" besides
    (site / "labels" / "ok.png").unlink()
    assert len(scan_site(site)[1]) == 1


# --- 2. a DICOM-SEG cut short --------------------------------------------------------------------------------------


def test_a_seg_cut_short_before_its_pixel_data_is_named_truncated_not_an_unknown_seg(case, tmp_path):
    """pydicom reads a SEG cut short without a word up to where it ends; without its SegmentationType it read as an
    "unknown DICOM-SEG not supported": it is the same truncated file that a cut in its pixel data is, said alike, by
    the case reader and by the readability check ``data check`` runs without a valid federation.yaml."""
    data = case["seg"].read_bytes()
    pixel_data = data.rindex(b"\xe0\x7f\x10\x00")  # the PixelData element's tag
    segmentation_type = data.index(b"\x62\x00\x01\x00")  # (0062,0001) SegmentationType, then SegmentSequence
    cut = tmp_path / "cut.dcm"
    for end, missing in (
        (pixel_data, "PixelData"),
        (segmentation_type, "SegmentationType, SegmentSequence and PixelData"),
    ):
        cut.write_bytes(data[:end])
        line = f"{cut}: cannot decode its pixel data (the file ends after {end} bytes, before its {missing}): {DAMAGED}"
        for read in (lambda: read_label(cut, "3d", image=case["series"]), lambda: dicom_seg.read_seg_frames(cut)):
            with pytest.raises(FederationError) as e:
                read()
            assert str(e.value) == line
    cut.write_bytes(data[:-20])  # cut inside the pixel data: said alike (it said the decoder's ValueError)
    with pytest.raises(FederationError) as e:
        read_label(cut, "3d", image=case["series"])
    end = len(data) - 20
    assert (
        str(e.value)
        == f"{cut}: cannot decode its pixel data (the file ends after {end} bytes, inside its PixelData): {DAMAGED}"
    )
    cut.write_bytes(b"")
    with pytest.raises(FederationError) as e:
        read_label(cut, "3d", image=case["series"])
    assert str(e.value) == f"{cut}: empty file (0 bytes): an interrupted copy? copy it again"


# --- 3. another patient's SEG on a slightly different grid ---------------------------------------------------------


def test_a_seg_of_another_patient_on_a_shifted_grid_is_named_as_drawn_on_another_scan(case, tmp_path):
    """Its frame of reference is checked before its frames are placed: "drawn on another scan", not "frame 1 does
    not lie on the grid (0.40 voxels off)" (true, but not the problem)."""
    other = write_series(tmp_path / "other", VALUES, frame="1.2.3.77", origin=ORIGIN + [0.52, 0.0, 0.0])
    seg = write_seg(tmp_path / "other.dcm", other, LABEL)
    with pytest.raises(FederationError) as e:
        read_label(seg, "3d", image=case["series"])
    assert str(e.value) == (
        f"{seg}: drawn on another scan: its FrameOfReferenceUID 1.2.3.77 is not that of its image {case['series']} "
        "(1.2.3.5); a segmentation of another patient or study?"
    )


# --- 4. a series nested one level too deep --------------------------------------------------------------------------


def test_a_series_one_level_too_deep_is_one_line_saying_to_move_its_files_up(case, tmp_path):
    """``images/A002/SE0002_AX/*.dcm`` (a PACS export's layout): one line saying to move the files up, and no "label
    without image" for ``labels/A002.dcm``: its image is there, unreadable as it lies."""
    site = _site(tmp_path)
    write_series(site / "images" / "A002" / "SE0002_AX", VALUES)
    (site / "labels" / "A002.dcm").write_bytes(case["seg"].read_bytes())
    _, problems = scan_site(site)
    assert problems == [
        f"{site}/images/A002: holds the folder 'SE0002_AX' of 6 DICOM files, a series one level too deep (a PACS "
        f"export's layout?): move the files up into A002/ and remove 'SE0002_AX'; {SERIES}"
    ]
    (site / "images" / "A002" / "notes").mkdir()  # two entries: no single series to move up
    assert scan_site(site)[1] == [f"{site}/images/A002: holds 'SE0002_AX', which is not a file; {SERIES}"]


# --- 5. a site folder given for its federation ----------------------------------------------------------------------


def test_a_site_folder_or_its_images_folder_given_for_the_federation_is_one_line(tmp_path):
    root = tmp_path / "fed"
    site = _site(root, "hospA")
    _png(site / "images" / "a.png")
    _png(site / "labels" / "a.png")
    lines = {
        site: f"{site}: a site folder (it holds images/ and labels/), not a federation folder (no federation.yaml); "
        f"give its parent, the federation root ({root} has no federation.yaml either: a federation root holds it and "
        "one folder per site)",
        site / "images": f"{site}/images: a site's images folder, not a federation folder (no federation.yaml); give "
        f"the folder above its site, the federation root ({root} has no federation.yaml either: a federation root "
        "holds it and one folder per site)",
    }
    for given, line in lines.items():
        for read in (check_folder, load_folder):
            with pytest.raises(FederationError) as e:
                read(given)
            assert str(e.value) == line
    header = {"name": "toy", "kind": "2d", "channels": 1, "regions": {"fg": [1]}}
    (root / "federation.yaml").write_text(yaml.safe_dump(header))
    result = CliRunner().invoke(data_app, ["check", str(site / "labels")])
    assert result.exit_code == 1
    assert (
        f"{site}/labels: a site's labels folder, not a federation folder (no federation.yaml); give the folder above "
        f"its site, the federation root: {root}\n"
    ) in result.output
    assert result.output.count(str(site)) == 1 and "Traceback" not in result.output
    check_folder(root)  # the root itself is fine


# --- 6. an empty slice; Windows' junk files -------------------------------------------------------------------------


def test_an_empty_slice_is_named_an_empty_file(tmp_path):
    """A 0-byte file (an interrupted copy) is "empty file (0 bytes)", not "not a DICOM file (InvalidDicomError)":
    the first file of the folder (looked at when the folder is scanned) or any other (when the series is read)."""
    write_series(tmp_path / "case", VALUES, names=[f"IM{k}.dcm" for k in range(VALUES.shape[2])])
    empty = tmp_path / "case" / "IM3.dcm"
    empty.write_bytes(b"")
    with pytest.raises(FederationError) as e:
        dicom_series.series_grid(tmp_path / "case")
    assert str(e.value) == f"{empty}: empty file (0 bytes): an interrupted copy? copy it again"
    first = tmp_path / "case" / "IM0.dcm"
    first.write_bytes(b"")
    assert dicom_series.series_folder_problem(tmp_path / "case") == (
        f"{first}: empty file (0 bytes): an interrupted copy? copy it again; {SERIES}"
    )


def test_a_slice_whose_header_is_cut_short_is_named_damaged_not_no_dicom(tmp_path):
    """A slice with the DICM preamble that pydicom cannot parse (cut inside its file meta header) is a damaged DICOM
    file, not "not a DICOM file"."""
    write_series(tmp_path / "case", VALUES, names=[f"IM{k}.dcm" for k in range(VALUES.shape[2])])
    slice_ = tmp_path / "case" / "IM2.dcm"
    slice_.write_bytes(slice_.read_bytes()[:143])  # inside (0002,0000) FileMetaInformationGroupLength's value
    with pytest.raises(FederationError) as e:
        dicom_series.series_grid(tmp_path / "case")
    assert str(e.value) == f"{slice_}: cannot read its DICOM header: {DAMAGED}"  # no exception class name


@pytest.mark.parametrize("junk", ["Thumbs.db", "desktop.ini", "ehthumbs.db", "THUMBS.DB"])
def test_windows_junk_files_are_ignored_as_ds_store_is(case, tmp_path, junk):
    """Windows Explorer leaves ``Thumbs.db`` and ``desktop.ini`` in the folders it shows: in ``images/``,
    ``labels/`` or a series folder they are skipped as macOS' ``.DS_Store`` is, not unsupported files."""
    site = _site(tmp_path)
    series = site / "images" / "c1"
    series.mkdir()
    for path in case["series"].iterdir():
        (series / path.name).write_bytes(path.read_bytes())
    (site / "labels" / "c1.dcm").write_bytes(case["seg"].read_bytes())
    for folder in (site / "images", site / "labels", series):
        (folder / junk).write_bytes(b"\x00junk")
        (folder / ".DS_Store").write_bytes(b"\x00junk")
    files, problems = scan_site(site)
    assert problems == [] and list(files.cases) == ["c1"]
    assert dicom_series.series_grid(series).shape == VALUES.shape
    np.testing.assert_array_equal(read_label(site / "labels" / "c1.dcm", "3d", image=series), LABEL)
