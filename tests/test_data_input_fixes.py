"""Data input that a mature tool reads or names plainly: DICOM slices without the 128-byte preamble (raw DICOM
streams), a slice or RTSTRUCT cut short inside its header, CSV rows whose case differs from the files' only in Unicode
normalisation, Windows' junk files in the resume record, and the channel names and name of an nnU-Net export."""

from __future__ import annotations

import json
import unicodedata
from pathlib import Path

import numpy as np
import pytest
import yaml
from typer.testing import CliRunner

pytest.importorskip("itk")
pydicom = pytest.importorskip("pydicom")
pytest.importorskip("highdicom")

from fedseg.data import dicom_series, readers, rtstruct  # noqa: E402
from fedseg.data.case_files import read_image  # noqa: E402
from fedseg.data.check import check_folder  # noqa: E402
from fedseg.data.cli import data_app  # noqa: E402
from fedseg.data.federation import FederationError  # noqa: E402
from fedseg.data.folder import scan_site  # noqa: E402
from fedseg.data.metadata import read_cases_csv  # noqa: E402
from fedseg.data.splits import read_site_splits_csv  # noqa: E402
from fedseg.predict_inputs import holds_dicom, list_inputs  # noqa: E402
from fedseg.predict_seg import sorted_slices  # noqa: E402
from fedseg.run.data_record import RECORD, changes, check_data_files, folder_files  # noqa: E402
from test_data_messages import DAMAGED, SERIES, _png, _site  # noqa: E402  (after the importorskips)
from test_readers import LABEL, VALUES, write_nifti, write_series  # noqa: E402

NAMES = [f"IM{k}" for k in range(VALUES.shape[2])]  # no .dcm: as PACS exports often name slices


def raw_stream(folder: Path) -> None:
    """Rewrite each slice of ``folder`` as a raw DICOM stream: its data set alone (implicit VR little endian), no
    128-byte preamble, no ``DICM``, no file meta, as some old PACS export slices."""
    for path in folder.iterdir():
        ds = pydicom.dcmread(path)
        del ds.file_meta
        ds.preamble = None
        pydicom.dcmwrite(path, ds, implicit_vr=True, little_endian=True, enforce_file_format=False)
        assert path.read_bytes()[128:132] != b"DICM"


def dicom_federation(root: Path, modalities: dict[str, str], cases: int = 3) -> Path:
    """A 3D federation of DICOM series (``VALUES``, Modality ``modalities[site]``) labelled by NIfTI files on their
    grid (``LABEL``)."""
    header = {"name": "dcm", "kind": "3d", "channels": 1, "regions": {"organ": [1, 2], "lesion": [2]}}
    root.mkdir(parents=True)
    (root / "federation.yaml").write_text(yaml.safe_dump(header))
    for site, modality in modalities.items():
        for i in range(cases):
            series = root / site / "images" / f"c{i}"
            write_series(series, VALUES, names=NAMES)
            for path in series.iterdir():
                ds = pydicom.dcmread(path)
                ds.Modality = modality
                ds.save_as(path)
            write_nifti(root / site / "labels" / f"c{i}.nii.gz", LABEL)
    return root


# --- 1. DICOM files without the preamble -----------------------------------------------------------------------------


def test_a_series_of_raw_dicom_streams_reads_as_the_same_series_everywhere(tmp_path):
    """Slices without the preamble and ``DICM`` (pydicom refuses them unless forced; ITK/GDCM reads them) are a
    series for ``data check``, a run's reader and ``fedseg predict`` alike, with the same voxels and grid."""
    write_series(tmp_path / "ref", VALUES, names=NAMES)
    reference = dicom_series.series_grid(tmp_path / "ref")
    root = dicom_federation(tmp_path / "fed", {"a": "CT", "b": "CT"})
    for series in root.glob("*/images/*"):
        raw_stream(series)
    fed = check_folder(root)  # data check's validation: no problem
    for site in fed.sites:
        for case in site.cases:
            image, label = case.arrays()
            np.testing.assert_array_equal(image, VALUES[None])
            np.testing.assert_array_equal(label, LABEL)
    series = root / "a" / "images" / "c0"
    np.testing.assert_allclose(dicom_series.series_grid(series).affine, reference.affine)
    assert list_inputs(series) == [series] and list_inputs(series.parent) == sorted(series.parent.iterdir())
    assert holds_dicom(series)  # no .dcm names: found by its data set
    positions = [[float(h.ImagePositionPatient[2]) for h in sorted_slices(s)] for s in (series, tmp_path / "ref")]
    assert len(positions[0]) == VALUES.shape[2] and positions[0] == positions[1]  # predict --dicom-seg's headers
    assert dicom_series.dicom_modalities(fed) == {"a": "CT", "b": "CT"}  # the run's CT note reads them too


def test_a_raw_stream_whose_uids_have_leading_zeros_is_read(tmp_path):
    """Old systems wrote UID parts with leading zeros (``1.2.0840...``), which the standard forbids and ITK reads:
    the raw-stream check asks for digits and dots, not a standard-valid UID."""
    series = tmp_path / "c1"
    write_series(series, VALUES, names=NAMES)
    for i, path in enumerate(sorted(series.iterdir())):
        ds = pydicom.dcmread(path)
        ds.SOPInstanceUID = f"1.2.0840.10008.0{i}"
        ds.save_as(path)
    raw_stream(series)
    assert dicom_series.series_folder_problem(series) is None
    np.testing.assert_array_equal(read_image(series, "3d"), VALUES[None])


def test_a_large_file_that_starts_as_no_data_set_is_not_parsed(tmp_path, monkeypatch):
    """A forced parse reads any bytes as elements (a 20 MB file of zeros took 6 s): a file whose first bytes are no
    element of a data set is refused without one."""
    blob = tmp_path / "image.raw"  # a MetaImage's pixel file: no image type of its own
    blob.write_bytes(bytes(4 << 20))
    forced = []
    real = pydicom.dcmread
    monkeypatch.setattr(pydicom, "dcmread", lambda *a, **k: forced.append(k.get("force")) or real(*a, **k))
    assert not dicom_series.is_dicom_file(blob) and True not in forced


def test_files_that_are_no_dicom_in_a_series_folder_are_still_refused(tmp_path):
    """Forced, pydicom parses a PNG or a note into a few nonsense tags: they are no slices, said as before."""
    site = _site(tmp_path)
    series = site / "images" / "c1"
    write_series(series, VALUES, names=NAMES)
    raw_stream(series)
    _png(series / "000.png")  # first by name: the file the folder is recognised by
    _, problems = scan_site(site)
    assert f"{series / '000.png'}: not a DICOM file (no DICM preamble); {SERIES}" in problems
    (series / "000.png").unlink()
    (series / "notes.txt").write_text("case,split\nc1,train\n")  # last by name: read with the slices
    with pytest.raises(FederationError) as e:
        read_image(series, "3d")
    assert str(e.value) == f"{series / 'notes.txt'}: not a DICOM file (no DICM preamble); expected one DICOM series"


def test_a_slice_whose_preamble_was_cut_off_before_its_file_meta_is_named(tmp_path):
    """A file that starts with its file meta group where the preamble belongs: pydicom reads it, ITK/GDCM does not;
    one line naming it and saying how to write it again, not ITK's "Could not create IO object"."""
    series = tmp_path / "c1"
    write_series(series, VALUES, names=NAMES)
    first = series / NAMES[0]
    first.write_bytes(first.read_bytes()[132:])
    with pytest.raises(FederationError) as e:
        read_image(series, "3d")
    message = str(e.value)
    assert message.startswith(f"{first}: a DICOM file whose 128-byte preamble and DICM prefix are missing before its")
    assert "ITK/GDCM cannot read" in message and "\n" not in message


# --- 2. a slice cut short inside its header ----------------------------------------------------------------------


def test_a_slice_cut_inside_its_header_is_named_truncated_not_without_pixel_spacing(tmp_path):
    """pydicom reads a slice cut inside its header quietly up to the cut: it is a truncated file, not a file with "no
    PixelSpacing", nor (cut inside its SeriesInstanceUID) a second series."""
    series = tmp_path / "c1"
    write_series(series, VALUES, names=NAMES)
    victim = series / NAMES[2]
    data = victim.read_bytes()
    cut = data.index(b"\x28\x00\x30\x00")  # the PixelSpacing element's tag (explicit VR little endian)
    victim.write_bytes(data[:cut])
    with pytest.raises(FederationError) as e:
        readers.volume_grid(series)
    assert (
        str(e.value)
        == f"{victim}: the file ends after {cut} bytes, before its PixelSpacing and BitsAllocated: {DAMAGED}"
    )
    uid = data.index(b"\x20\x00\x0e\x00") + 20  # inside the SeriesInstanceUID's value
    victim.write_bytes(data[:uid])
    with pytest.raises(FederationError) as e:
        readers.volume_grid(series)
    assert str(e.value).startswith(f"{victim}: the file ends after {uid} bytes, inside its SeriesInstanceUID, before")
    assert str(e.value).endswith(DAMAGED)


# --- 3. an empty or damaged RTSTRUCT ---------------------------------------------------------------------------------


def test_deflated_rtstruct_and_seg_are_read_not_called_truncated(tmp_path):
    """Deflated files: pydicom's element positions are in the inflated bytes, past the (smaller) file's end; a file
    cut short fails to inflate instead."""
    from test_rtstruct import write_rtstruct

    rs = write_rtstruct(tmp_path / "rs.dcm")
    plain = rtstruct._dataset(rs)
    ds = pydicom.dcmread(rs)
    ds.file_meta.TransferSyntaxUID = pydicom.uid.DeflatedExplicitVRLittleEndian
    ds.save_as(tmp_path / "deflated.dcm", enforce_file_format=True)
    assert (tmp_path / "deflated.dcm").stat().st_size < rs.stat().st_size
    assert rtstruct._dataset(tmp_path / "deflated.dcm").ROIContourSequence == plain.ROIContourSequence


def test_an_empty_damaged_or_foreign_rtstruct_is_said_as_the_image_reader_says_it(tmp_path):
    """The same plain lines as for slices and SEGs (``dicom_series.dicom_read_failure``), never an exception class name
    such as InvalidDicomError."""
    from test_rtstruct import write_rtstruct

    data = write_rtstruct(tmp_path / "rs.dcm").read_bytes()
    rs = tmp_path / "label.dcm"
    for content, line in (
        (b"", f"{rs}: empty file (0 bytes): an interrupted copy? copy it again"),
        (data[:143], f"{rs}: cannot read its DICOM header: {DAMAGED}"),  # inside its file meta
        (b"ROI list\nctv\n", f"{rs}: not a DICOM file (no DICM preamble); expected an RTSTRUCT"),
        (data[:1500], f"{rs}: the file ends after 1500 bytes, inside its ROIContourSequence: {DAMAGED}"),
    ):
        rs.write_bytes(content)
        with pytest.raises(FederationError) as e:
            rtstruct.contour_points(rs)
        assert str(e.value) == line
    series = tmp_path / "ct"
    write_series(series, VALUES, names=NAMES)
    (series / NAMES[3]).write_bytes(b"not a slice")
    with pytest.raises(FederationError) as e:
        rtstruct._series_instances(series)  # the series whose instances the contours name
    assert str(e.value) == f"{series / NAMES[3]}: not a DICOM file (no DICM preamble); expected one DICOM series"


# --- 4. CSV rows that differ from the case names only in Unicode normalisation ---------------------------------------


def test_a_csv_row_naming_a_case_in_another_unicode_normalisation_says_so(tmp_path):
    """``Müller`` typed in splits.csv or cases.csv on Linux (NFC) for files a Mac named (NFD): one line naming the
    file, the row and both spellings, not "unknown case 'Müller'" beside a case that prints the same."""
    nfd, nfc = unicodedata.normalize("NFD", "Müller"), unicodedata.normalize("NFC", "Müller")
    splits, cases = tmp_path / "splits.csv", tmp_path / "cases.csv"
    splits.write_text(f"case,split\n{nfc},train\nghost,test\n", encoding="utf-8")
    cases.write_text(f"case,grade\n{nfc},HGG\n", encoding="utf-8")
    said = (
        f"case {nfc!r} (NFC) differs from the site's case {nfd!r} (NFD) only in Unicode normalisation (names typed on "
        "another system than the files'?), so it names no case; spell it as the case's files are named"
    )
    with pytest.raises(FederationError) as e:
        read_site_splits_csv(splits, [nfd, "other"])
    assert str(e.value).splitlines() == [
        f"{splits}:2: {said}",
        f"{splits}:3: unknown case 'ghost' (no such image in this site)",
    ]
    with pytest.raises(FederationError) as e:
        read_cases_csv(cases, [nfd])
    assert str(e.value) == f"{cases}:2: {said}"


# --- 5. Windows' junk files and the resume record ----------------------------------------------------------------


def test_windows_junk_files_do_not_change_the_data_record(tmp_path):
    """Explorer writes ``Thumbs.db`` / ``desktop.ini`` by merely showing a folder: the readers skip them, so a resume
    must not call the data changed for them."""
    site = _site(tmp_path / "fed")
    _png(site / "images" / "c1.png")
    _png(site / "labels" / "c1.png")
    recorded = folder_files(tmp_path / "fed")
    (site / "images" / "Thumbs.db").write_bytes(b"\x00junk")
    (site / "labels" / "desktop.ini").write_text("[.ShellClassInfo]\n")
    (site / "EHTHUMBS.DB").write_bytes(b"\x00junk")
    assert changes(recorded, folder_files(tmp_path / "fed")) == []
    _png(site / "images" / "c2.png")  # data still counts
    assert changes(recorded, folder_files(tmp_path / "fed")) == ["added: s1/images/c2.png"]


def test_a_run_recorded_with_windows_junk_files_resumes(tmp_path):
    """A record written before junk files were left out lists them: they are not called removed on resume."""
    site = _site(tmp_path / "fed")
    _png(site / "images" / "c1.png")
    _png(site / "labels" / "c1.png")
    (site / "images" / "Thumbs.db").write_bytes(b"\x00junk")
    out = tmp_path / "run"
    out.mkdir()
    record = {"data": "folder", "files": {**folder_files(tmp_path / "fed"), "s1/images/Thumbs.db": [5, 0]}}
    (out / RECORD).write_text(json.dumps(record))
    assert check_data_files(out, tmp_path / "fed") is None  # no ValueError: Thumbs.db is not "removed"
    (site / "labels" / "c1.png").unlink()
    with pytest.raises(ValueError, match="removed: s1/labels/c1.png"):
        check_data_files(out, tmp_path / "fed")


# --- 6. nnU-Net export: channel names and name --------------------------------------------------------------------


def _exported(root: Path, out: Path, *args: str) -> dict:
    result = CliRunner().invoke(data_app, ["export", "nnunet", str(root), "--out", str(out), *args])
    assert result.exit_code == 0, result.output
    (dataset,) = out.iterdir()
    return {"folder": dataset.name, **json.loads((dataset / "dataset.json").read_text())}


def test_a_dicom_federation_exports_its_modality_as_the_channel_name_where_the_sites_agree(tmp_path):
    """nnU-Net normalizes a channel named ``CT`` in Hounsfield windows and every other one per image: a CT series
    exported as ``channel0`` would be trained with the wrong normalization."""
    ct = dicom_federation(tmp_path / "ct", {"a": "CT", "b": "CT"})
    assert _exported(ct, tmp_path / "raw-ct")["channel_names"] == {"0": "CT"}
    mixed = dicom_federation(tmp_path / "mixed", {"a": "CT", "b": "MR"})
    assert _exported(mixed, tmp_path / "raw-mixed")["channel_names"] == {"0": "channel0"}  # no one name fits both
    assert _exported(mixed, tmp_path / "raw-b", "--site", "b")["channel_names"] == {"0": "MR"}


def test_a_reexported_nnunet_import_keeps_its_channel_names_and_is_named_as_its_folder(tmp_path):
    """An import of ``Dataset501_Liver`` is named after it; exported as ``--id 7`` its dataset.json said
    ``Dataset501_Liver`` inside ``Dataset007_Liver``: the name is the written folder's, as nnU-Net names datasets."""
    from test_nnunet import cli, nnunet_dataset

    src, fed = nnunet_dataset(tmp_path / "Dataset501_Liver"), tmp_path / "fed"
    assert cli("import", "nnunet", str(src), "--site-by", "^([A-Z]+)_", "--out", str(fed)).exit_code == 0
    dataset = _exported(fed, tmp_path / "raw", "--id", "7")
    assert dataset["folder"] == dataset["name"] == "Dataset007_Liver"
    assert dataset["channel_names"] == {"0": "T2", "1": "ADC"}
    named = _exported(fed, tmp_path / "raw-named", "--id", "8", "--name", "liver 3")
    assert named["folder"] == named["name"] == "Dataset008_liver_3"
