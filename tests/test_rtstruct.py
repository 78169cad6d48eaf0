"""DICOM RT Structure Sets as labels: ``labels/<case>.dcm`` holding an RTSTRUCT, painted on its image's grid.

A 6-slice 32 x 32 CT series (0.7 x 0.7 x 2.5 mm, rows rotated 30 degrees in the axial plane, slices running towards
the feet, a non-zero origin) and a structure set written with pydicom; the expected label map is computed
independently: every voxel centre in patient coordinates (from the series' own geometry) tested against each contour
with matplotlib's ``Path.contains_points``.
"""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

import nibabel as nib
import numpy as np
import pytest
import yaml
from matplotlib.path import Path as MplPath
from typer.testing import CliRunner

from fedseg.data import readers
from fedseg.data.case_files import read_label
from fedseg.data.check import check_folder
from fedseg.data.cli import data_app
from fedseg.data.federation import FederationError
from fedseg.data.folder import load_folder
from test_data_check import check_warnings

pydicom = pytest.importorskip("pydicom")

SHAPE = (32, 32, 6)  # array order: column, row, slice
SPACING = (0.7, 0.7, 2.5)  # mm
_T = np.deg2rad(30.0)
ROW = np.array([np.cos(_T), np.sin(_T), 0.0])  # LPS direction of array axis 0 (along a DICOM row)
COL = np.array([np.sin(_T), -np.cos(_T), 0.0])  # LPS direction of array axis 1 (down a DICOM column)
NORMAL = np.cross(ROW, COL)  # (0, 0, -1): slices towards the feet
ORIGIN = np.array([-40.5, 25.25, 112.0])  # LPS mm of voxel (0, 0, 0)
FRAME = "1.2.826.0.1.3680043.8.498.1"
LABEL_NAMES = {0: "background", 1: "CTV", 2: "gtv_primary"}
RTSTRUCT_CLASS = "1.2.840.10008.5.1.4.1.1.481.3"


def mm(ij, k: float) -> np.ndarray:
    """Patient (LPS) mm of in-plane voxel coordinates ``ij`` ``(n, 2)`` on slice ``k``."""
    ij = np.asarray(ij, dtype=np.float64)
    return (
        ORIGIN + np.outer(ij[:, 0] * SPACING[0], ROW) + np.outer(ij[:, 1] * SPACING[1], COL) + k * SPACING[2] * NORMAL
    )


# contours in voxel coordinates (off the voxel centres: no centre lies on an edge, where the two fills may differ)
CTV = [(5.3, 8.2), (14.6, 4.1), (25.8, 7.7), (27.2, 18.4), (21.5, 27.3), (9.9, 26.6), (4.2, 17.9)]
HOLE = [(8.4, 12.3), (15.7, 10.6), (12.2, 19.1)]  # inside CTV on slice 3
GTV = [(12.6, 13.1), (19.4, 11.8), (22.1, 19.6), (16.3, 23.4), (11.1, 20.2)]  # inside CTV, overlapping HOLE
CENTRE = mm([(15.5, 15.5)], 4)[0]
SQUARE = [CENTRE + d for d in ([-4, -4, 0], [4, -4, 0], [4, 4, 0], [-4, 4, 0])]  # 8 x 8 mm along LPS x, y: oblique


def structures() -> dict[str, list[tuple[str, np.ndarray]]]:
    """ROI name -> its contours ``(ContourGeometricType, (n, 3) LPS mm)``."""
    body = [(-9.5, -9.5), (41.5, -9.5), (41.5, 41.5), (-9.5, 41.5)]  # beyond the image: never read
    return {
        "BODY": [("CLOSED_PLANAR", mm(body, k)) for k in range(6)],
        "ctv": [("CLOSED_PLANAR", mm(CTV, k)) for k in range(1, 5)] + [("CLOSED_PLANAR", mm(HOLE, 3))],
        "GTV Primary": [("CLOSED_PLANAR", mm(GTV, k)) for k in (2, 3)] + [("CLOSED_PLANAR", np.array(SQUARE))],
        "Couch": [("OPEN_PLANAR", mm([(0.0, 30.0), (31.0, 30.0)], 0))],
        "Isocenter": [("POINT", mm([(16.0, 16.0)], 2))],
    }


def expected_label(rois: tuple[tuple[str, int], ...] = (("ctv", 1), ("GTV Primary", 2))) -> np.ndarray:
    """The label map of ``rois`` (name, value) by matplotlib: each ROI's contours on a slice XOR-ed, ascending label
    values painted."""
    i, j = np.meshgrid(np.arange(SHAPE[0]), np.arange(SHAPE[1]), indexing="ij")
    centres = np.stack([i.ravel(), j.ravel()], axis=1)
    label = np.zeros(SHAPE, np.uint8)
    for name, value in rois:
        mask = np.zeros(SHAPE, bool)
        for _, points in structures()[name]:
            k = int(round(float((points[0] - ORIGIN) @ NORMAL) / SPACING[2]))
            centre_mm = mm(centres, k)
            plane = lambda p: np.stack([(p - ORIGIN) @ ROW, (p - ORIGIN) @ COL], axis=1)  # noqa: E731
            inside = MplPath(plane(points)).contains_points(plane(centre_mm))
            mask[:, :, k] ^= inside.reshape(SHAPE[:2])
        label[mask] = value
    return label


# --- writers ---------------------------------------------------------------------------------------------------


def _dataset(sop_class: str, uid: str, modality: str, series: str) -> pydicom.Dataset:
    from pydicom.dataset import Dataset, FileMetaDataset
    from pydicom.uid import ExplicitVRLittleEndian

    ds = Dataset()
    ds.file_meta = FileMetaDataset()
    ds.file_meta.MediaStorageSOPClassUID, ds.file_meta.MediaStorageSOPInstanceUID = sop_class, uid
    ds.file_meta.TransferSyntaxUID = ExplicitVRLittleEndian
    ds.SOPClassUID, ds.SOPInstanceUID, ds.Modality = sop_class, uid, modality
    ds.PatientName, ds.PatientID, ds.PatientBirthDate, ds.PatientSex = "Test^Case", "p1", "", "O"
    ds.StudyInstanceUID, ds.SeriesInstanceUID, ds.StudyID = "1.2.3.4", series, "1"
    ds.StudyDate, ds.StudyTime, ds.AccessionNumber, ds.ReferringPhysicianName = "20240101", "1200", "", ""
    ds.SeriesNumber, ds.InstanceNumber, ds.Manufacturer = 1, 1, "fedseg"
    return ds


def write_series(folder: Path, frame: str = FRAME) -> str:
    """One CT file per slice (shuffled names); returns the SeriesInstanceUID."""
    from pydicom.uid import CTImageStorage, generate_uid

    folder.mkdir(parents=True, exist_ok=True)
    series = generate_uid()
    values = (np.arange(np.prod(SHAPE)).reshape(SHAPE) % 997).astype(np.uint16)
    for n, k in enumerate(np.random.default_rng(0).permutation(SHAPE[2])):
        ds = _dataset(CTImageStorage, generate_uid(), "CT", series)
        ds.FrameOfReferenceUID, ds.InstanceNumber = frame, int(k) + 1
        ds.ImageOrientationPatient = [float(v) for v in (*ROW, *COL)]
        ds.ImagePositionPatient = [float(v) for v in ORIGIN + k * SPACING[2] * NORMAL]
        ds.PixelSpacing, ds.SliceThickness = [SPACING[1], SPACING[0]], SPACING[2]  # row spacing, column spacing
        plane = np.ascontiguousarray(values[:, :, k].T)  # rows = axis 1, columns = axis 0
        ds.Rows, ds.Columns = plane.shape
        ds.SamplesPerPixel, ds.PhotometricInterpretation = 1, "MONOCHROME2"
        ds.BitsAllocated, ds.BitsStored, ds.HighBit, ds.PixelRepresentation = 16, 16, 15, 0
        ds.PixelData = plane.tobytes()
        ds.save_as(folder / f"IM{n:04d}", enforce_file_format=True)
    return series


def write_rtstruct(path: Path, rois=None, frame: str = FRAME, series: str = "1.2.3.9") -> Path:
    """An RT Structure Set of ``rois`` (name -> contours, default ``structures()``) with pydicom."""
    from pydicom.dataset import Dataset
    from pydicom.sequence import Sequence
    from pydicom.uid import generate_uid

    ds = _dataset(RTSTRUCT_CLASS, generate_uid(), "RTSTRUCT", generate_uid())
    ds.StructureSetLabel, ds.StructureSetDate, ds.StructureSetTime = "plan", "20240101", "1200"
    referenced_series = Dataset()
    referenced_series.SeriesInstanceUID = series
    study = Dataset()
    study.ReferencedSOPClassUID, study.ReferencedSOPInstanceUID = "1.2.840.10008.3.1.2.3.1", "1.2.3.4"
    study.RTReferencedSeriesSequence = Sequence([referenced_series])
    reference = Dataset()
    reference.FrameOfReferenceUID, reference.RTReferencedStudySequence = frame, Sequence([study])
    ds.ReferencedFrameOfReferenceSequence = Sequence([reference])
    ds.StructureSetROISequence, ds.ROIContourSequence = Sequence(), Sequence()
    for number, (name, contours) in enumerate((rois or structures()).items(), start=1):
        roi = Dataset()
        roi.ROINumber, roi.ReferencedFrameOfReferenceUID, roi.ROIName = number, frame, name
        roi.ROIGenerationAlgorithm = "MANUAL"
        ds.StructureSetROISequence.append(roi)
        item = Dataset()
        item.ReferencedROINumber, item.ROIDisplayColor = number, [255, 0, 0]
        item.ContourSequence = Sequence()
        for kind, points in contours:
            contour = Dataset()
            contour.ContourGeometricType, contour.NumberOfContourPoints = kind, len(points)
            contour.ContourData = [round(float(v), 4) for v in np.asarray(points).ravel()]  # as a TPS writes them
            item.ContourSequence.append(contour)
        ds.ROIContourSequence.append(item)
    path.parent.mkdir(parents=True, exist_ok=True)
    ds.save_as(path, enforce_file_format=True)
    return path


def instances(series_folder: Path) -> dict[int, str]:
    """Slice index -> the SOPInstanceUID of the series file holding it (headers only)."""
    headers = [pydicom.dcmread(p, stop_before_pixels=True) for p in sorted(series_folder.iterdir())]
    return {int(ds.InstanceNumber) - 1: str(ds.SOPInstanceUID) for ds in headers}


def reference(rs: Path, out: Path, uids: dict[str, list[str | None]]) -> Path:
    """``rs`` with a ContourImageSequence added to the contours of the ROIs ``uids`` names (ROI name -> per contour,
    the ReferencedSOPInstanceUID, or ``None``: no ContourImageSequence), written to ``out``."""
    from pydicom.dataset import Dataset
    from pydicom.sequence import Sequence

    ds = pydicom.dcmread(rs)
    names = {int(roi.ROINumber): str(roi.ROIName) for roi in ds.StructureSetROISequence}
    for item in ds.ROIContourSequence:
        for contour, uid in zip(item.ContourSequence, uids.get(names[int(item.ReferencedROINumber)], [])):
            if uid is not None:
                image = Dataset()
                image.ReferencedSOPClassUID, image.ReferencedSOPInstanceUID = "1.2.840.10008.5.1.4.1.1.2", uid
                contour.ContourImageSequence = Sequence([image])
    ds.save_as(out)
    return out


@pytest.fixture(scope="module")
def case(tmp_path_factory) -> tuple[Path, Path]:
    """``(series folder, RTSTRUCT)``, written once for the module."""
    d = tmp_path_factory.mktemp("rtstruct")
    series = write_series(d / "ct")
    return d / "ct", write_rtstruct(d / "rs.dcm", series=series)


# --- tests -------------------------------------------------------------------------------------------------------


def test_an_rtstruct_is_painted_as_matplotlib_fills_its_contours_on_an_oblique_series(case):
    image, rs = case
    affine = np.eye(4)
    affine[:3, 0], affine[:3, 1], affine[:3, 2], affine[:3, 3] = ROW * 0.7, COL * 0.7, NORMAL * 2.5, ORIGIN
    np.testing.assert_allclose(readers.volume_grid(image).affine, np.diag([-1, -1, 1, 1]) @ affine, atol=1e-6)
    expected = expected_label()
    assert {int(v): int(n) for v, n in zip(*np.unique(expected, return_counts=True))}.keys() == {0, 1, 2}
    assert (expected[:, :, 3] == 0).sum() > (expected[:, :, 2] == 0).sum()  # the hole is there
    assert not expected[:, :, [0, 5]].any()  # BODY, the couch and the marker painted nothing
    label = read_label(rs, "3d", image=image, label_names=LABEL_NAMES)
    assert label.dtype == np.uint8 and label.shape == SHAPE
    np.testing.assert_array_equal(label, expected)


def test_the_same_structures_land_on_a_nifti_of_the_same_grid(case, tmp_path):
    """A NIfTI (RAS affine, written by nibabel) has no UIDs: the contours are placed by its affine alone."""
    _, rs = case
    affine = np.eye(4)
    affine[:3, 0], affine[:3, 1], affine[:3, 2], affine[:3, 3] = ROW * 0.7, COL * 0.7, NORMAL * 2.5, ORIGIN
    nifti = tmp_path / "ct.nii.gz"
    nib.save(nib.Nifti1Image(np.zeros(SHAPE, np.int16), np.diag([-1, -1, 1, 1]) @ affine), nifti)
    np.testing.assert_array_equal(read_label(rs, "3d", image=nifti, label_names=LABEL_NAMES), expected_label())


def test_a_square_covers_its_area_in_voxels(case, tmp_path):
    """An 8 x 8 mm square oblique to the voxel rows covers its area within its boundary voxels; one drawn through
    voxel centres along the rows covers exactly its area (a centre on an edge counts on one side only)."""
    image, _ = case
    aligned = mm([(4.0, 4.0), (12.0, 4.0), (12.0, 12.0), (4.0, 12.0)], 1)  # 8 x 8 voxels between centres
    rois = {"gtv_primary": [("CLOSED_PLANAR", np.array(SQUARE)), ("CLOSED_PLANAR", aligned)]}
    label = read_label(write_rtstruct(tmp_path / "square.dcm", rois), "3d", image=image, label_names=LABEL_NAMES)
    pixel = SPACING[0] * SPACING[1]
    oblique = int(label[:, :, 4].sum()) // 2
    boundary = 4 * 8.0 / SPACING[0]  # the perimeter in voxel lengths
    assert abs(oblique - 64.0 / pixel) < boundary / 2, oblique
    assert int(label[:, :, 1].sum()) // 2 == 64
    assert int((label != 0).sum()) == oblique + 64


def test_data_check_and_load_folder_read_an_rtstruct_label(case, tmp_path):
    pytest.importorskip("itk")  # the series' voxels
    image, rs = case
    root = tmp_path / "fed"
    header = {
        "name": "rt",
        "kind": "3d",
        "channels": 1,
        "regions": {"ctv": [1, 2], "gtv": [2]},
        "label_names": LABEL_NAMES,
    }
    root.mkdir()
    (root / "federation.yaml").write_text(yaml.safe_dump(header))
    for cid in ("c1", "c2", "c3"):  # every site keeps a training and a test case
        shutil.copytree(image, root / "site1" / "images" / cid)
        (root / "site1" / "labels").mkdir(exist_ok=True)
        shutil.copy(rs, root / "site1" / "labels" / f"{cid}.dcm")
    result = CliRunner().invoke(data_app, ["check", str(root)])
    assert result.exit_code == 0, result.output
    assert "1 site, 3 cases" in result.output
    check_folder(root)
    expected = expected_label()
    for case_ in load_folder(root).site("site1").cases:
        image_array, label = case_.arrays()
        assert image_array.shape == (1, *SHAPE)
        np.testing.assert_array_equal(label, expected, err_msg=case_.id)
    # without a valid federation.yaml only readability is checked: the RTSTRUCT reads (it has no pixel data)
    (root / "federation.yaml").write_text(yaml.safe_dump({**header, "kind": "4d"}))
    result = CliRunner().invoke(data_app, ["check", str(root)])
    assert result.exit_code == 1 and "kind" in result.output
    assert ".dcm" not in result.output, result.output


def test_an_rtstruct_of_another_frame_of_reference_is_refused(case, tmp_path):
    image, _ = case
    other = write_rtstruct(tmp_path / "other.dcm", frame="1.2.3.77")  # the same grid, another patient
    with pytest.raises(FederationError) as e:
        read_label(other, "3d", image=image, label_names=LABEL_NAMES)
    assert str(e.value) == (
        f"{other}: drawn on another scan: its FrameOfReferenceUID 1.2.3.77 is not that of its image {image} "
        f"({FRAME}); contours of another patient or study?"
    )


def test_a_contour_off_the_slice_planes_or_outside_the_image_is_refused(case, tmp_path):
    image, _ = case
    between = mm(GTV, 2) + 0.3 * SPACING[2] * NORMAL  # 0.3 slice spacings off slice 2
    gtv = [("CLOSED_PLANAR", mm(GTV, 3)), ("CLOSED_PLANAR", between)]
    rs = write_rtstruct(tmp_path / "between.dcm", {"CTV": [("CLOSED_PLANAR", mm(CTV, 1))], "GTV_primary": gtv})
    with pytest.raises(FederationError) as e:
        read_label(rs, "3d", image=image, label_names=LABEL_NAMES)
    assert str(e.value) == (
        f"{rs}: ROI 'GTV_primary' contour 2 does not lie in a slice plane of {image}: its points lie up to 0.30 slice "
        "spacings from slice 2's centre (at most 0.1); drawn on another grid or on reformatted slices?"
    )
    for name, points in (("below", mm(CTV, 6)), ("beside", mm(CTV, 2) + 20.0 * ROW)):
        rs = write_rtstruct(tmp_path / f"{name}.dcm", {"ctv": [("CLOSED_PLANAR", points)]})
        with pytest.raises(FederationError, match=rf"^{rs}: ROI 'ctv' contour 1 lies outside the grid of {image} "):
            read_label(rs, "3d", image=image, label_names=LABEL_NAMES)
    rs = write_rtstruct(tmp_path / "open.dcm", {"ctv": [("CLOSED_PLANAR", mm(CTV, 1)), ("OPEN_PLANAR", mm(CTV, 2))]})
    with pytest.raises(FederationError, match=rf"^{rs}: ROI 'ctv' contour 2 is OPEN_PLANAR: only closed planar"):
        read_label(rs, "3d", image=image, label_names=LABEL_NAMES)


def test_an_rtstruct_whose_rois_name_no_label_lists_them(case, tmp_path):
    image, rs = case
    with pytest.raises(FederationError) as e:
        read_label(rs, "3d", image=image, label_names={0: "background", 1: "prostate", 2: "bladder"})
    rois = "'BODY', 'ctv', 'GTV Primary', 'Couch', 'Isocenter'"
    assert str(e.value) == (
        f"{rs}: no ROI of this RTSTRUCT names a label of label_names (federation.yaml); its ROIs: {rois}; "
        "label_names: 1: prostate, 2: bladder"
    )
    with pytest.raises(FederationError) as e:
        read_label(rs, "3d", image=image)
    assert str(e.value) == (
        f"{rs}: an RTSTRUCT's ROIs get their label values by name, but federation.yaml has no label_names; "
        f"its ROIs: {rois}"
    )


def test_a_malformed_rtstruct_is_one_line_naming_it(case, tmp_path):
    image, rs = case
    ds = pydicom.dcmread(rs)
    del ds.ROIContourSequence
    ds.save_as(tmp_path / "no-contours.dcm")
    with pytest.raises(FederationError, match=rf"^{tmp_path / 'no-contours.dcm'}: malformed RTSTRUCT: no ROIContour"):
        read_label(tmp_path / "no-contours.dcm", "3d", image=image, label_names=LABEL_NAMES)
    ds = pydicom.dcmread(rs)
    ds.ROIContourSequence[1].ContourSequence[0].ContourData = [1.0, 2.0]
    ds.save_as(tmp_path / "bad-points.dcm")
    with pytest.raises(FederationError) as e:
        read_label(tmp_path / "bad-points.dcm", "3d", image=image, label_names=LABEL_NAMES)
    assert str(e.value).startswith(f"{tmp_path / 'bad-points.dcm'}: ROI 'ctv' contour 1: malformed ContourData")
    ds = pydicom.dcmread(rs)
    del ds.StructureSetROISequence[0].ROINumber
    ds.save_as(tmp_path / "no-number.dcm")
    with pytest.raises(FederationError) as e:
        read_label(tmp_path / "no-number.dcm", "3d", image=image, label_names=LABEL_NAMES)
    assert str(e.value).startswith(f"{tmp_path / 'no-number.dcm'}: malformed RTSTRUCT (AttributeError: ")
    assert "\n" not in str(e.value) and str(e.value).endswith("a truncated or damaged file (an interrupted copy?)")
    truncated = tmp_path / "truncated.dcm"
    truncated.write_bytes(rs.read_bytes()[:1500])  # an interrupted copy
    with pytest.raises(
        FederationError, match=r"truncated\.dcm: .*a truncated or damaged file \(an interrupted copy\?\)$"
    ):
        read_label(truncated, "3d", image=image, label_names=LABEL_NAMES)
    with pytest.raises(FederationError, match=r"rs\.dcm: an RTSTRUCT label is read on its case's image grid"):
        read_label(rs, "3d", label_names=LABEL_NAMES)


def rt_federation(root: Path, image: Path, structure_sets: list[Path]) -> Path:
    """A one-site 3D federation folder at ``root``: case ``c<i>`` is the series ``image`` labelled by the i-th of
    ``structure_sets`` (from 1)."""
    header = {"name": "rt", "kind": "3d", "channels": 1, "regions": {"ctv": [1, 2]}, "label_names": LABEL_NAMES}
    (root / "site1" / "labels").mkdir(parents=True)
    (root / "federation.yaml").write_text(yaml.safe_dump(header))
    for i, source in enumerate(structure_sets, start=1):
        shutil.copytree(image, root / "site1" / "images" / f"c{i}")
        shutil.copy(source, root / "site1" / "labels" / f"c{i}.dcm")
    return root


def _notices(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name.startswith("fedseg.data") and r.levelno >= logging.WARNING]


def test_a_label_no_roi_names_reads_as_background_with_one_notice(case, tmp_path, caplog):
    """No ROI named 'gtv_primary' at all (not contoured?): the case reads, the GTV as background, and one WARNING
    names the file, the label and the ROIs it has, however often the file is read."""
    image, _ = case
    rois = {"BODY": structures()["BODY"], "ctv": structures()["ctv"]}
    rs = write_rtstruct(tmp_path / "no-gtv.dcm", rois)
    with caplog.at_level(logging.WARNING):
        label = read_label(rs, "3d", image=image, label_names=LABEL_NAMES)
        assert read_label(rs, "3d", image=image, label_names=LABEL_NAMES).sum() == label.sum()
    np.testing.assert_array_equal(label, expected_label((("ctv", 1),)))  # the CTV alone
    assert set(np.unique(label)) == {0, 1}
    assert _notices(caplog) == [
        f"{rs}: no ROI of this RTSTRUCT names label_names 'gtv_primary' (2), so this case reads it as background "
        "(not contoured here?); its ROIs: 'BODY', 'ctv'"
    ]


def test_an_roi_declared_without_contours_is_empty_without_a_notice(case, tmp_path, caplog):
    """An ROI in StructureSetROISequence with no contours is an explicitly empty structure: background, no word."""
    image, _ = case
    rs = write_rtstruct(tmp_path / "empty-gtv.dcm", {"ctv": structures()["ctv"], "GTV_primary": []})
    with caplog.at_level(logging.WARNING):
        label = read_label(rs, "3d", image=image, label_names=LABEL_NAMES)
    assert set(np.unique(label)) == {0, 1}
    assert _notices(caplog) == []


def test_data_check_summarises_a_label_no_roi_names_per_site(case, tmp_path, caplog):
    """data check: one warning line per site and label, naming the files and their ROIs, no line per file."""
    pytest.importorskip("itk")  # the series' voxels
    image, rs = case
    without = write_rtstruct(tmp_path / "no-gtv.dcm", {"ctv": structures()["ctv"], "BODY": structures()["BODY"]})
    root = rt_federation(tmp_path / "fed", image, [without, rs, without])
    with caplog.at_level(logging.WARNING):
        lines = check_warnings(root)
    assert lines == [
        "warning: site 'site1': label 'gtv_primary' (2) is named by no ROI in 2 of 3 RTSTRUCTs (c1.dcm, c3.dcm): "
        "those cases read it as background (not contoured there?); their ROIs: 'ctv', 'BODY'"
    ]
    assert _notices(caplog) == []  # summarised, not logged per file
    with caplog.at_level(logging.WARNING):  # without a warnings list (a run's check): logged, once
        check_folder(root)
        for case_ in load_folder(root).site("site1").cases:  # the files already summarised: not logged again
            case_.arrays()
    assert _notices(caplog) == [lines[0].removeprefix("warning: ")]


def test_contours_naming_images_of_another_series_read_with_one_notice(case, tmp_path, caplog):
    """ContourImageSequence naming SOP instances that are not slices of the case's series: drawn on another series
    of the same frame of reference (a registered MR) or before an anonymiser renamed the images. They lie on this
    image's slices, so they are read by patient coordinates, with one notice naming the first such ROI (data check:
    one line per site); a NIfTI names no instances, so there nothing is said."""
    pytest.importorskip("itk")  # the series' voxels (data check)
    image, rs = case
    uids = instances(image)
    ctv = [uids[k] for k in range(1, 5)] + ["1.2.3.999.1"]  # the hole: an instance of another series
    gtv = [uids[2], "1.2.3.999.2", "1.2.3.999.1"]
    other = reference(rs, tmp_path / "rescan.dcm", {"ctv": ctv, "GTV Primary": gtv})
    gtv_only = reference(rs, tmp_path / "rescan-gtv.dcm", {"GTV Primary": gtv})
    with caplog.at_level(logging.WARNING):
        for _ in range(2):
            np.testing.assert_array_equal(
                read_label(other, "3d", image=image, label_names=LABEL_NAMES), expected_label()
            )
        np.testing.assert_array_equal(
            read_label(gtv_only, "3d", image=image, label_names=LABEL_NAMES), expected_label()
        )
    said = "outside the case's series (ContourImageSequence): drawn on another series of the same frame of reference"
    assert _notices(caplog) == [
        f"{other}: the contours of ROI 'ctv' name 1 image {said}, or on this one before an anonymiser renamed its "
        "images; they lie on this image's slices and are read by patient coordinates: check they belong to this scan",
        f"{gtv_only}: the contours of ROI 'GTV Primary' name 2 images {said}, or on this one before an anonymiser "
        "renamed its images; they lie on this image's slices and are read by patient coordinates: check they belong "
        "to this scan",
    ]
    caplog.clear()
    affine = np.eye(4)
    affine[:3, 0], affine[:3, 1], affine[:3, 2], affine[:3, 3] = ROW * 0.7, COL * 0.7, NORMAL * 2.5, ORIGIN
    nifti = tmp_path / "ct.nii.gz"
    nib.save(nib.Nifti1Image(np.zeros(SHAPE, np.int16), np.diag([-1, -1, 1, 1]) @ affine), nifti)
    with caplog.at_level(logging.WARNING):
        np.testing.assert_array_equal(read_label(other, "3d", image=nifti, label_names=LABEL_NAMES), expected_label())
    assert _notices(caplog) == []

    root = rt_federation(tmp_path / "fed", image, [rs, other, rs])
    result = CliRunner().invoke(data_app, ["check", str(root)])
    assert result.exit_code == 0, result.output
    assert [line for line in result.output.splitlines() if line.startswith("warning: ")] == [
        "warning: site 'site1': contours in 1 of 3 RTSTRUCTs (c2.dcm) name images outside their case's series: "
        "drawn on another series of the same frame of reference, or on this one before an anonymiser renamed its "
        "images; they lie on this image's slices and are read by patient coordinates: check they belong to this scan"
    ]


def test_contours_naming_their_own_series_instances_read(case, tmp_path, caplog):
    """References to the series' own slices read; a contour without ContourImageSequence is fine (optional), and an
    ROI that names no label (BODY) is not read, its references not checked."""
    image, rs = case
    uids = instances(image)
    ctv = [uids[k] for k in range(1, 5)] + [None]
    own = reference(rs, tmp_path / "own.dcm", {"ctv": ctv, "GTV Primary": [uids[2], uids[3]], "BODY": ["1.2.9"] * 6})
    assert "ContourImageSequence" in pydicom.dcmread(own).ROIContourSequence[1].ContourSequence[0]
    with caplog.at_level(logging.WARNING):
        np.testing.assert_array_equal(read_label(own, "3d", image=image, label_names=LABEL_NAMES), expected_label())
    assert _notices(caplog) == []


def test_a_label_no_structure_set_names_fails_the_data_check_with_the_closest_roi_names(case, tmp_path):
    """Every structure set names its GTV 'GTV primry': no case would hold label 2, so the data check refuses it and
    suggests the ROI (a silent background class otherwise); 'GTV-Primary' is the label's name ('-' as a space)."""
    pytest.importorskip("itk")  # the series' voxels
    image, _ = case
    typo = write_rtstruct(
        tmp_path / "typo.dcm", {"ctv": structures()["ctv"], "GTV primry": structures()["GTV Primary"]}
    )
    root = rt_federation(tmp_path / "fed", image, [typo, typo, typo])
    result = CliRunner().invoke(data_app, ["check", str(root)])
    assert result.exit_code == 1
    said = " ".join(result.output.split())
    assert (
        "label_names 2: 'gtv_primary' is named by no ROI in any of the 3 RTSTRUCTs read, so no case would hold it; "
        "their ROIs: 'GTV primry', 'ctv'; did you mean 'GTV primry'?"
    ) in said, result.output
    hyphen = write_rtstruct(
        tmp_path / "hyphen.dcm", {"ctv": structures()["ctv"], "GTV-Primary": structures()["GTV Primary"]}
    )
    np.testing.assert_array_equal(read_label(hyphen, "3d", image=image, label_names=LABEL_NAMES), expected_label())


def test_an_empty_structure_set_is_named_so_not_no_dicom(tmp_path):
    """As for slices and SEGs (dicom_series.dicom_read_failure): an empty file is an interrupted copy (it said "not a
    DICOM file (InvalidDicomError)")."""
    from fedseg.data.rtstruct import contour_points

    empty = tmp_path / "empty.dcm"
    empty.write_bytes(b"")
    with pytest.raises(FederationError) as e:
        contour_points(empty)
    assert str(e.value) == f"{empty}: empty file (0 bytes): an interrupted copy? copy it again"


def test_contours_on_every_other_slice_drawn_on_a_thicker_series_are_refused(case, tmp_path, caplog):
    """An RTSTRUCT drawn on a 5 mm reconstruction of this 2.5 mm scan (the same frame of reference) has contours on
    every other slice: read so, every other slice of the structure would be background and the data check would say
    nothing. Its ContourImageSequence naming images outside the series says so: one line naming the file. Without
    references, 3 slices one in 2 apart say the same; 2 contoured slices 2 apart are read (two parts of a structure).
    """
    image, _ = case
    every_other = {"ctv": [("CLOSED_PLANAR", mm(CTV, k)) for k in (1, 3)]}
    rs = write_rtstruct(tmp_path / "thick.dcm", every_other)
    thick = reference(rs, tmp_path / "thick-ref.dcm", {"ctv": ["1.2.3.999.1", "1.2.3.999.2"]})
    with pytest.raises(FederationError) as e:
        read_label(thick, "3d", image=image, label_names=LABEL_NAMES)
    assert str(e.value) == (
        f"{thick}: this RTSTRUCT covers only 2 of the 3 slices of its structures' extent (slices 1-3 of {image}, one "
        "in 2): drawn on another series with 5 mm between slices (this image: 2.5 mm)? Read so it would train striped "
        "labels; give it the series it was drawn on as its image, or resample it onto this one"
    )
    with caplog.at_level(logging.WARNING):
        assert set(np.unique(read_label(rs, "3d", image=image, label_names=LABEL_NAMES))) == {0, 1}  # no references
    three = write_rtstruct(tmp_path / "three.dcm", {"ctv": [("CLOSED_PLANAR", mm(CTV, k)) for k in (0, 2, 4)]})
    with pytest.raises(FederationError, match=r"three\.dcm: this RTSTRUCT covers only 3 of the 5 slices"):
        read_label(three, "3d", image=image, label_names=LABEL_NAMES)
    pytest.importorskip("itk")  # the series' voxels (data check)
    root = rt_federation(tmp_path / "fed", image, [thick])
    result = CliRunner().invoke(data_app, ["check", str(root)])
    assert result.exit_code != 0
    assert "c1.dcm: this RTSTRUCT covers only 2 of the 3 slices" in result.output
    assert "Traceback" not in result.output


def test_contours_drawn_on_this_series_are_read_on_whatever_slices_and_other_slices_by_their_gaps(case, tmp_path):
    """Contours whose own slice spacing is the image's are read whatever slices they lie on: every other slice
    contoured on this very series (their ContourImageSequence naming its slices, or, naming none, the referenced
    series being this one) was refused as 3 slices one in 2 apart. Contours naming images of another series on
    slices 0, 2 and 5 (gaps 2 and 3) cannot lie on a coarser series' slices: read too. The same contours naming
    another series alone on slices 1 and 3 (their own spacing unknown) are still refused."""
    image, _ = case
    slices = instances(image)
    series = str(pydicom.dcmread(next(iter(sorted(image.iterdir()))), stop_before_pixels=True).SeriesInstanceUID)
    sparse = {"ctv": [("CLOSED_PLANAR", mm(CTV, k)) for k in (0, 2, 4)]}
    expected = read_label(
        write_rtstruct(tmp_path / "one.dcm", {"ctv": sparse["ctv"][:1]}), "3d", image=image, label_names=LABEL_NAMES
    )[:, :, 0]
    by_images = reference(
        write_rtstruct(tmp_path / "sparse.dcm", sparse),
        tmp_path / "sparse-ref.dcm",
        {"ctv": [slices[k] for k in (0, 2, 4)]},
    )
    by_series = write_rtstruct(tmp_path / "sparse-series.dcm", sparse, series=series)
    for rs in (by_images, by_series):
        label = read_label(rs, "3d", image=image, label_names=LABEL_NAMES)
        assert [int(label[:, :, k].any()) for k in range(SHAPE[2])] == [1, 0, 1, 0, 1, 0], rs.name
        np.testing.assert_array_equal(label[:, :, 2], expected)
    uneven = {"ctv": [("CLOSED_PLANAR", mm(CTV, k)) for k in (0, 2, 5)]}
    other = reference(
        write_rtstruct(tmp_path / "uneven.dcm", uneven),
        tmp_path / "uneven-ref.dcm",
        {"ctv": ["1.2.3.999.1", "1.2.3.999.2", "1.2.3.999.3"]},
    )
    label = read_label(other, "3d", image=image, label_names=LABEL_NAMES)
    assert [int(label[:, :, k].any()) for k in range(SHAPE[2])] == [1, 0, 1, 0, 0, 1]
    two = {"ctv": [("CLOSED_PLANAR", mm(CTV, k)) for k in (1, 3)]}
    elsewhere = reference(
        write_rtstruct(tmp_path / "two.dcm", two), tmp_path / "two-ref.dcm", {"ctv": ["1.2.3.999.1", "1.2.3.999.2"]}
    )
    with pytest.raises(FederationError, match=r"two-ref\.dcm: this RTSTRUCT covers only 2 of the 3 slices"):
        read_label(elsewhere, "3d", image=image, label_names=LABEL_NAMES)


def test_two_rois_naming_one_label_are_painted_as_one_with_one_warning(case, tmp_path, caplog):
    """ "ctv" and "CTV" both name label 1 (a structure contoured twice): painted as their union, as documented, with
    one WARNING per file naming both ROIs, however often it is read."""
    image, _ = case
    second = [("CLOSED_PLANAR", mm(GTV, k)) for k in (1, 2)]
    rs = write_rtstruct(tmp_path / "twice.dcm", {"ctv": structures()["ctv"], "CTV": second})
    with caplog.at_level(logging.WARNING):
        for _ in range(2):
            label = read_label(rs, "3d", image=image, label_names={0: "background", 1: "CTV"})
    alone = read_label(
        write_rtstruct(tmp_path / "second.dcm", {"ctv": second}), "3d", image=image, label_names={1: "ctv"}
    )
    np.testing.assert_array_equal(label, ((expected_label((("ctv", 1),)) > 0) | (alone > 0)).astype(np.uint8))
    assert _notices(caplog) == [
        f"{rs}: ROIs 'ctv' and 'CTV' both name label_names 'CTV' (1), so they are painted as one label (their union); "
        "if one is not that structure (a discarded or second attempt), rename or delete it in the structure set"
    ]
