"""Volume formats beyond NIfTI: NRRD, MetaImage, DICOM series and DICOM-SEG, read like NIfTI.

Every file is written here by an independent writer (nibabel, pynrrd, ITK, pydicom, highdicom) from one
tiny volume on a non-trivial grid: anisotropic spacing, x and y axes swapped and the slice axis running
towards the feet. Reading any of them through ``fedseg.data.folder`` must give the NIfTI array, spacing
and patient-space grid.
"""

from __future__ import annotations

import logging
import re
import shutil
import sys
import time
from pathlib import Path

import nibabel as nib
import numpy as np
import pytest
import yaml
from typer.testing import CliRunner

from fedseg.atomic_files import current_umask
from fedseg.data import dicom_seg, dicom_series, readers
from fedseg.data.case_files import read_image, read_label
from fedseg.data.check import check_folder
from fedseg.data.cli import data_app
from fedseg.data.federation import FederationError
from fedseg.data.folder import load_folder, scan_site
from fedseg.data.volumes import case_spacing, file_spacing

itk = pytest.importorskip("itk")
pydicom = pytest.importorskip("pydicom")
hd = pytest.importorskip("highdicom")
nrrd = pytest.importorskip("nrrd")

SHAPE = (8, 10, 6)  # array order: i (DICOM column), j (DICOM row), k (slice)
SPACING = (0.7, 1.3, 2.5)  # mm
DIRECTION = np.array([[0.0, 1.0, 0.0], [1.0, 0.0, 0.0], [0.0, 0.0, -1.0]])  # LPS; columns = axis directions
ORIGIN = np.array([10.0, -5.0, 3.0])  # LPS mm of voxel (0, 0, 0)
LPS_TO_RAS = np.diag([-1.0, -1.0, 1.0, 1.0])
VALUES = (np.arange(np.prod(SHAPE)).reshape(SHAPE) * 7 % 1000).astype(np.uint16)
LABEL = np.zeros(SHAPE, np.uint8)
LABEL[2:5, 3:7, 1:4] = 1
LABEL[5:7, 1:3, 2:5] = 2
LABEL[0, 9, 5] = 2  # a corner voxel: the last row, column and slice
SEGMENTS = {1: "Organ", 2: "lesion"}


def lps_affine(spacing=SPACING, direction=DIRECTION, origin=ORIGIN) -> np.ndarray:
    affine = np.eye(4)
    affine[:3, :3], affine[:3, 3] = np.asarray(direction) * np.asarray(spacing), origin
    return affine


# --- writers (each independent of the reader under test) -----------------------------------------------


def write_nifti(path: Path, data: np.ndarray, **grid) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    nib.save(nib.Nifti1Image(data, LPS_TO_RAS @ lps_affine(**grid), dtype=data.dtype), path)
    return path


def write_pynrrd(path: Path, data: np.ndarray) -> Path:
    """NRRD with pynrrd: ``data`` in NRRD's index order (``index_order="F"``), LPS space."""
    path.parent.mkdir(parents=True, exist_ok=True)
    header = {
        "space": "left-posterior-superior",
        "space directions": (DIRECTION * np.array(SPACING)).T,  # one row per axis
        "space origin": ORIGIN,
    }
    nrrd.write(str(path), data, header, index_order="F")
    return path


def write_itk(path: Path, data: np.ndarray, vector: bool = False) -> Path:
    """MetaImage (or any ITK format) with ITK; ITK's NumPy view is (k, j, i[, components])."""
    path.parent.mkdir(parents=True, exist_ok=True)
    view = data.transpose(2, 1, 0, 3) if vector else data.T
    image = itk.image_from_array(np.ascontiguousarray(view), is_vector=vector)
    image.SetSpacing([float(s) for s in SPACING])
    image.SetOrigin([float(o) for o in ORIGIN])
    image.SetDirection(itk.matrix_from_array(DIRECTION.copy()))
    itk.imwrite(image, str(path))
    return path


def write_series(
    folder: Path,
    data: np.ndarray,
    *,
    spacing=SPACING,
    origin=ORIGIN,
    names=None,
    series_uid=None,
    frame="1.2.3.5",
    tilt_mm: float = 0.0,
    heights=None,
    decimals: int | None = None,
    patient_name: str = "Test^Case",
) -> list[pydicom.Dataset]:
    """One single-frame CT file per slice ``data[:, :, k]``, written with pydicom in shuffled file-name order;
    ``tilt_mm``: each slice shifted that much further along the column direction (a gantry-tilted CT's stack);
    ``heights``: slice ``k`` at ``heights[k]`` mm along the normal (default ``k`` times the slice spacing);
    ``decimals``: ImagePositionPatient rounded to that many decimals, as many scanners write it."""
    from pydicom.dataset import Dataset, FileMetaDataset
    from pydicom.uid import CTImageStorage, ExplicitVRLittleEndian, generate_uid

    folder.mkdir(parents=True, exist_ok=True)
    study, series = "1.2.3.4", series_uid or generate_uid()
    names = names or [f"IM{n:04d}" for n in np.random.default_rng(0).permutation(data.shape[2])]
    written = []
    for k in range(data.shape[2]):
        uid = generate_uid()
        ds = Dataset()
        ds.file_meta = FileMetaDataset()
        ds.file_meta.MediaStorageSOPClassUID, ds.file_meta.MediaStorageSOPInstanceUID = CTImageStorage, uid
        ds.file_meta.TransferSyntaxUID = ExplicitVRLittleEndian
        ds.SOPClassUID, ds.SOPInstanceUID, ds.Modality = CTImageStorage, uid, "CT"
        ds.PatientName, ds.PatientID, ds.PatientBirthDate, ds.PatientSex = patient_name, "p1", "", "O"
        ds.StudyInstanceUID, ds.SeriesInstanceUID, ds.FrameOfReferenceUID = study, series, frame
        ds.StudyDate, ds.StudyTime, ds.StudyID = "20240101", "1200", "1"
        ds.AccessionNumber, ds.ReferringPhysicianName = "", ""
        ds.SeriesNumber, ds.InstanceNumber, ds.Manufacturer = 1, k + 1, "fedseg"
        ds.ImageOrientationPatient = [float(v) for v in (*DIRECTION[:, 0], *DIRECTION[:, 1])]
        height = k * spacing[2] if heights is None else heights[k]
        position = np.asarray(origin) + height * DIRECTION[:, 2] + k * tilt_mm * DIRECTION[:, 1]
        ds.ImagePositionPatient = [float(v) if decimals is None else round(float(v), decimals) for v in position]
        ds.PixelSpacing, ds.SliceThickness = [float(spacing[1]), float(spacing[0])], float(spacing[2])
        plane = np.ascontiguousarray(data[:, :, k].T.astype(np.uint16))  # rows = j, columns = i
        ds.Rows, ds.Columns = plane.shape
        ds.SamplesPerPixel, ds.PhotometricInterpretation = 1, "MONOCHROME2"
        ds.BitsAllocated, ds.BitsStored, ds.HighBit, ds.PixelRepresentation = 16, 16, 15, 0
        ds.PixelData = plane.tobytes()
        ds.save_as(folder / names[k], enforce_file_format=True)
        written.append(ds)
    return written


def write_seg(
    path: Path, sources: list, label: np.ndarray, segments: dict[int, str] = SEGMENTS, kind: str = "BINARY"
) -> Path:
    """A DICOM-SEG (``kind`` BINARY or LABELMAP) with highdicom, one frame per source slice (highdicom drops
    the empty ones)."""
    category = hd.sr.CodedConcept("91723000", "SCT", "Anatomical Structure")
    descriptions = [
        hd.seg.SegmentDescription(
            segment_number=number,
            segment_label=name,
            segmented_property_category=category,
            segmented_property_type=hd.sr.CodedConcept("41216001", "SCT", "Prostate"),
            algorithm_type=hd.seg.SegmentAlgorithmTypeValues.MANUAL,
        )
        for number, name in segments.items()
    ]
    seg = hd.seg.Segmentation(
        source_images=sources,
        pixel_array=np.stack([label[:, :, k].T for k in range(label.shape[2])]),  # (frames, rows, columns)
        segmentation_type=getattr(hd.seg.SegmentationTypeValues, kind),
        segment_descriptions=descriptions,
        series_instance_uid=hd.UID(),
        series_number=2,
        sop_instance_uid=hd.UID(),
        instance_number=1,
        manufacturer="fedseg",
        manufacturer_model_name="test",
        software_versions="0",
        device_serial_number="1",
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    seg.save_as(path)
    return path


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, Path]:
    """The volume and its label map in every format (written once for the module)."""
    d = tmp_path_factory.mktemp("formats")
    sources = write_series(d / "dicom", VALUES)
    return {
        "nifti": write_nifti(d / "image.nii.gz", VALUES),
        "nrrd": write_pynrrd(d / "image.nrrd", VALUES),
        "mha": write_itk(d / "image.mha", VALUES),
        "mhd": write_itk(d / "image.mhd", VALUES),
        "dicom": d / "dicom",
        "label_nifti": write_nifti(d / "label.nii.gz", LABEL),
        "label_nrrd": write_pynrrd(d / "label.nrrd", LABEL),
        "label_mha": write_itk(d / "label.mha", LABEL),
        "label_seg": write_seg(d / "label.dcm", sources, LABEL),
    }


# --- the same data in every format ----------------------------------------------------------------------


@pytest.mark.parametrize("fmt", ["nrrd", "mha", "mhd", "dicom"])
def test_every_format_reads_back_the_nifti_array_spacing_and_grid(files, fmt):
    reference = read_image(files["nifti"], "3d")
    np.testing.assert_array_equal(reference, VALUES[None])  # NIfTI: as stored, channel-first
    image = read_image(files[fmt], "3d")
    assert image.dtype == reference.dtype == np.uint16 and image.shape == (1, *SHAPE)
    np.testing.assert_array_equal(image, reference)
    assert file_spacing(files[fmt], 3) == pytest.approx(SPACING) == file_spacing(files["nifti"], 3)
    np.testing.assert_allclose(readers.volume_grid(files[fmt]).affine, LPS_TO_RAS @ lps_affine(), atol=1e-6)
    np.testing.assert_allclose(readers.volume_grid(files["nifti"]).affine, LPS_TO_RAS @ lps_affine(), atol=1e-6)


@pytest.mark.parametrize(("label", "image"), [("nrrd", "nrrd"), ("mha", "mha"), ("seg", "dicom"), ("seg", "nifti")])
def test_every_label_format_reads_back_the_nifti_label_map(files, label, image):
    reference = read_label(files["label_nifti"], "3d")
    np.testing.assert_array_equal(reference, LABEL)
    got = read_label(files[f"label_{label}"], "3d", image=files[image])
    assert got.dtype == np.uint8
    np.testing.assert_array_equal(got, reference)


def test_a_seg_lands_on_a_flipped_nifti_by_patient_position(files, tmp_path):
    """A dcm2niix-style NIfTI of the series with the row axis stored the other way round (a left-handed
    grid no DICOM series has): the SEG's segments land on the same patient positions, so flipped too."""
    flipped_origin = ORIGIN + (SHAPE[1] - 1) * SPACING[1] * DIRECTION[:, 1]
    nifti = write_nifti(
        tmp_path / "flipped.nii.gz",
        VALUES[:, ::-1].copy(),
        direction=DIRECTION * [1, -1, 1],
        origin=flipped_origin,
    )
    handedness = [np.linalg.det(readers.volume_grid(path).affine) for path in (nifti, files["dicom"])]
    assert handedness[0] < 0 < handedness[1]
    np.testing.assert_array_equal(read_image(nifti, "3d"), VALUES[None, :, ::-1])  # as stored
    np.testing.assert_array_equal(read_label(files["label_seg"], "3d", image=nifti), LABEL[:, ::-1])


def test_a_label_map_written_on_a_files_grid_reads_back_with_its_values_type_and_grid(files, tmp_path):
    """``volume_write`` (``fedseg predict``'s masks of NRRD and MetaImage inputs) names every element type as the
    readers size it; a uint16 label map (label values over 255) written on each file's grid (as ITK reads it) reads
    back with its values, its type (little-endian, said in the header) and the volume's grid."""
    from fedseg.data.volume_write import MET_TYPES, NRRD_TYPES, write_itk_volume

    for name, met in MET_TYPES.items():
        assert readers._MET_BYTES[met] == np.dtype(name).itemsize, name
        assert NRRD_TYPES[name] in readers._NRRD_BYTES[np.dtype(name).itemsize], name
    wide = LABEL.astype(np.uint16) * 300
    for source in ("mha", "mhd", "nrrd"):
        for ext in ("mha", "nrrd"):
            path = tmp_path / f"{source}.{ext}"
            write_itk_volume(path, wide, readers.itk_geometry(files[source]))
            back = readers.read_volume(path)
            assert back.dtype == np.uint16 and np.array_equal(back, wide), path.name
            np.testing.assert_array_equal(readers.volume_grid(path).affine, readers.volume_grid(files[source]).affine)
            np.testing.assert_allclose(readers.volume_grid(path).affine, LPS_TO_RAS @ lps_affine(), atol=1e-12)
    assert b"\nElementType = MET_USHORT\n" in (tmp_path / "mha.mha").read_bytes()[:1000]
    header = (tmp_path / "nrrd.nrrd").read_bytes().split(b"\n\n")[0].decode().splitlines()
    assert {"type: uint16", "endian: little", "encoding: gzip"} <= set(header)


def test_vector_metaimage_gives_channels_like_a_4d_nifti(tmp_path):
    two = np.stack([VALUES, VALUES[::-1]], axis=-1)  # (X, Y, Z, C)
    nifti, mha = write_nifti(tmp_path / "x.nii.gz", two), write_itk(tmp_path / "x.mha", two, vector=True)
    image = read_image(mha, "3d")
    assert image.shape == (2, *SHAPE)
    np.testing.assert_array_equal(image, read_image(nifti, "3d"))


def test_a_labelmap_seg_reads_like_a_binary_one(files, tmp_path):
    sources = [pydicom.dcmread(p) for p in sorted(files["dicom"].iterdir())]
    sources.sort(key=lambda ds: int(ds.InstanceNumber))
    seg = write_seg(tmp_path / "labelmap.dcm", sources, LABEL, kind="LABELMAP")
    assert pydicom.dcmread(seg).SegmentationType == "LABELMAP"
    np.testing.assert_array_equal(read_label(seg, "3d", image=files["nifti"]), LABEL)


def test_dicom_seg_segments_take_the_values_of_matching_label_names(files):
    names = {0: "background", 1: "Lesion", 2: "organ"}  # "Organ" is segment 1 in the SEG, "lesion" 2
    got = read_label(files["label_seg"], "3d", image=files["dicom"], label_names=names)
    np.testing.assert_array_equal(got, np.choose(LABEL, [0, 2, 1]))
    seg = Path("seg.dcm")
    assert dicom_seg.segment_values({1: "a", 2: "b"}, {3: "A", 4: "b"}, seg) == {1: 3, 2: 4}
    assert dicom_seg.segment_values({1: "a"}, {3: "a", 4: "A"}, seg) == {1: 1}  # an ambiguous name maps nothing


def test_seg_segments_are_matched_by_name_and_a_segment_label_names_does_not_list_is_not_read(files, caplog):
    """Segment 1 "Organ" and 2 "lesion" against label_names naming only one of them: the named one is read by name,
    the other is not read at all (it must not become the label its number has: 2 "tumor" here), said once per file,
    as RTSTRUCT ROIs naming no label are skipped."""
    dicom_seg._noted_segments.clear()
    other_two = {0: "background", 1: "organ", 3: "tumor"}  # "lesion" is another structure than label 3 here
    with caplog.at_level(logging.WARNING, logger="fedseg.data.dicom_seg"):
        for _ in range(2):
            got = read_label(files["label_seg"], "3d", image=files["dicom"], label_names=other_two)
            np.testing.assert_array_equal(got, np.where(LABEL == 1, 1, 0))
    assert [r.getMessage() for r in caplog.records] == [
        f"{files['label_seg']}: segment 2 'lesion' names no label of label_names (federation.yaml), so it is not read "
        "(background), while the segments named so are read by name (1 'Organ' -> 1); add its name to label_names "
        "to train it"
    ]
    # a review: segment 2 "lesion" where label 2 is "tumor", named by no segment, was read by number (as label 2)
    # before segments were matched by name; not read now, label 2 would go missing: refused, with the way out
    with pytest.raises(FederationError) as e:
        read_label(
            files["label_seg"], "3d", image=files["dicom"], label_names={0: "background", 1: "organ", 2: "tumor"}
        )
    assert str(e.value) == (
        f"{files['label_seg']}: segment 2 'lesion' names no label of label_names, and no other segment names label 2 "
        "('tumor'): if it is that structure under another name, list the name as one of label 2's (label_names: "
        "{2: [tumor, lesion]}), else rename the segment"
    )
    swapped = {0: "background", 1: "lesion", 3: "liver"}  # "lesion" is segment 2, "Organ" names nothing here
    got = read_label(files["label_seg"], "3d", image=files["dicom"], label_names=swapped)
    np.testing.assert_array_equal(got, np.where(LABEL == 2, 1, 0))  # by name: lesion as 1, Organ not read
    assert dicom_seg.segment_values({1: "Tumor", 2: "TUMOR"}, {1: "tumor"}, Path("two.dcm")) == {1: 1, 2: 1}
    assert "segments 1 'Tumor' and 2 'TUMOR' name one label (1) and are read as one" in caplog.records[-1].getMessage()


def without_slice_spacing(seg: Path, out: Path) -> Path:
    """The DICOM-SEG ``seg`` without the SpacingBetweenSlices highdicom writes (as some writers leave it out),
    written to ``out``."""
    ds = pydicom.dcmread(seg)
    for groups in (ds.SharedFunctionalGroupsSequence[0], *ds.PerFrameFunctionalGroupsSequence):
        for measures in getattr(groups, "PixelMeasuresSequence", []):
            if "SpacingBetweenSlices" in measures:
                del measures.SpacingBetweenSlices
    ds.save_as(out)
    return out


def test_a_seg_drawn_on_a_thicker_series_of_the_same_scan_is_refused_not_read_striped(files, tmp_path):
    """A SEG drawn on a 5 mm reconstruction of this 2.5 mm scan (same frame of reference) lands on every other slice:
    read so, every other slice of the structure would be background. Its SpacingBetweenSlices (5 mm) says so on any
    image, one frame alone too: one line naming the file, both spacings and the slices. Without one, its slices
    decide as before: one in 2 and naming another series, or 3 slices one in 2 apart; 2 slices 2 apart on this
    series are read."""
    thick = write_series(tmp_path / "thick", VALUES[:, :, ::2], spacing=(0.7, 1.3, 5.0))  # the same frame 1.2.3.5
    full = np.zeros(SHAPE, np.uint8)
    full[2:5, 3:7, :] = 1
    seg = write_seg(tmp_path / "thick.dcm", thick, full[:, :, ::2], segments={1: "organ"})
    assert (
        float(pydicom.dcmread(seg).SharedFunctionalGroupsSequence[0].PixelMeasuresSequence[0].SpacingBetweenSlices) == 5
    )
    names = {0: "background", 1: "organ"}
    for image in (files["dicom"], files["nifti"]):
        with pytest.raises(FederationError) as e:
            read_label(seg, "3d", image=image, label_names=names)
        assert str(e.value) == (
            f"{seg}: this DICOM-SEG was drawn on slices 5 mm apart (its SpacingBetweenSlices), but its image {image} "
            "has 2.5 mm between slices: read on it, each of its slices would paint one of the 2 image slices it "
            "stands for (it lies on slices 0, 2, 4), training striped labels; give it the series it was drawn on as "
            "its image, or resample it onto this one"
        )
    one = np.zeros(SHAPE, np.uint8)
    one[2:5, 3:7, 2] = 1  # one 5 mm slice: the image's slices 2 and 3, painted on 2 alone
    single = write_seg(tmp_path / "single.dcm", thick, one[:, :, ::2], segments={1: "organ"})
    with pytest.raises(
        FederationError, match=r"single\.dcm: this DICOM-SEG was drawn on slices 5 mm apart .* slice 2\)"
    ):
        read_label(single, "3d", image=files["dicom"], label_names=names)
    unknown = without_slice_spacing(seg, tmp_path / "unknown.dcm")  # its own spacing unknown: its slices decide
    with pytest.raises(FederationError) as e:
        read_label(unknown, "3d", image=files["dicom"], label_names=names)
    assert str(e.value) == (
        f"{unknown}: this DICOM-SEG covers only 3 of the 5 slices of its structures' extent (slices 0-4 of "
        f"{files['dicom']}, one in 2): drawn on another series with 5 mm between slices (this image: 2.5 mm)? Read so "
        "it would train striped labels; give it the series it was drawn on as its image, or resample it onto this one"
    )
    with pytest.raises(FederationError, match="covers only 3 of the 5 slices"):
        read_label(unknown, "3d", image=files["nifti"], label_names=names)  # no UIDs: 3 regular
    sources = write_series(tmp_path / "own", VALUES)  # this series: two structures 2 slices apart are content
    two = np.zeros(SHAPE, np.uint8)
    two[2:5, 3:7, 1] = two[2:5, 3:7, 3] = 1
    own = write_seg(tmp_path / "own.dcm", sources, two, segments={1: "organ"})
    np.testing.assert_array_equal(read_label(own, "3d", image=files["nifti"], label_names={1: "organ"}), two)


def test_single_slice_structures_drawn_on_a_co_registered_series_of_the_same_spacing_are_read(files, tmp_path):
    """Two single-slice structures drawn on another 2.5 mm series of the same frame of reference (4 slices from
    this one's second: other slice positions) land on slices 1 and 3 of this 2.5 mm series: its SpacingBetweenSlices
    says they were drawn at the image's spacing, so they are two structures, not stripes, and are read on the series
    and on a NIfTI of it. Without SpacingBetweenSlices their own spacing is unknown and they are refused as before.
    A SEG of this very series is read however sparsely its slices are drawn (every other one)."""
    shifted = ORIGIN + 1 * SPACING[2] * DIRECTION[:, 2]
    other = write_series(tmp_path / "other", VALUES[:, :, 1:5], origin=shifted)  # another series, frame 1.2.3.5
    two = np.zeros(SHAPE, np.uint8)
    two[2:5, 3:7, 1] = 1  # "organ" on the image's slice 1 (the other series' first)
    two[5:7, 1:3, 3] = 2  # "lesion" on the image's slice 3 (its third)
    seg = write_seg(tmp_path / "two.dcm", other, two[:, :, 1:5])
    names = {0: "background", 1: "organ", 2: "lesion"}
    for image in (files["dicom"], files["nifti"]):
        np.testing.assert_array_equal(read_label(seg, "3d", image=image, label_names=names), two)
    unknown = without_slice_spacing(seg, tmp_path / "unknown.dcm")
    with pytest.raises(FederationError) as e:
        read_label(unknown, "3d", image=files["dicom"], label_names=names)
    assert str(e.value).startswith(
        f"{unknown}: this DICOM-SEG covers only 2 of the 3 slices of its structures' extent (slices 1-3 of "
        f"{files['dicom']}, one in 2)"
    )
    sources = [pydicom.dcmread(p) for p in sorted(files["dicom"].iterdir())]
    sources.sort(key=lambda ds: int(ds.InstanceNumber))
    sparse = np.zeros(SHAPE, np.uint8)
    sparse[2:5, 3:7, 0:6:2] = 1  # every other slice of this series annotated
    own = write_seg(tmp_path / "sparse.dcm", sources, sparse, segments={1: "organ"})
    own_unknown = without_slice_spacing(own, tmp_path / "sparse-unknown.dcm")  # it names this series: its spacing
    for label in (own, own_unknown):
        np.testing.assert_array_equal(read_label(label, "3d", image=files["dicom"], label_names=names), sparse)


def test_a_seg_whose_segment_names_name_no_label_is_read_by_number_with_one_warning(files, caplog):
    """Segments "Organ" and "Lesion" against label_names that name neither (another tool's vocabulary): read by
    segment number, as documented, but said once per labels folder, with what each segment becomes."""
    other = {0: "background", 1: "tumor", 2: "liver"}
    dicom_seg._warned_by_number.clear()
    with caplog.at_level(logging.WARNING, logger="fedseg.data.dicom_seg"):
        for _ in range(2):
            got = read_label(files["label_seg"], "3d", image=files["dicom"], label_names=other)
            np.testing.assert_array_equal(got, LABEL)
    said = [r.getMessage() for r in caplog.records]
    assert said == [
        f"{files['label_seg']}: no segment label of this DICOM-SEG names a label of label_names, so its segments are "
        "read by number: 1 'Organ' -> 'tumor', 2 'lesion' -> 'liver'; if that is not what they hold, name the labels "
        "in label_names (federation.yaml) as the segments are named (said once for the SEGs of "
        f"{files['label_seg'].parent} named so)"
    ]
    caplog.clear()
    seg = Path("generic/seg.dcm")
    with caplog.at_level(logging.WARNING, logger="fedseg.data.dicom_seg"):
        assert dicom_seg.segment_values({1: "Segment 1", 2: "seg_2", 3: ""}, other, seg) == {1: 1, 2: 2, 3: 3}
        assert dicom_seg.segment_values({1: "Organ"}, None, seg) == {1: 1}  # no label_names: numbers, nothing to say
    assert not caplog.records


# --- one clear line per problem ------------------------------------------------------------------------------


def _site(tmp_path: Path) -> Path:
    site = tmp_path / "s1"
    (site / "images").mkdir(parents=True)
    (site / "labels").mkdir()
    return site


def test_folders_in_images_that_are_not_a_dicom_series_are_named(tmp_path):
    site = _site(tmp_path)
    (site / "images" / "c4.png").mkdir()
    (site / "images" / "c4.png" / "a.png").write_bytes(b"\x89PNG not dicom")
    (site / "images" / "c5").mkdir()
    (site / "images" / "c6").symlink_to(site / "images" / "c6")  # a link loop
    (site / "images" / "c7.dcm").write_bytes(b"x")
    _, problems = scan_site(site)
    expected = "a case folder in images/ must hold the .dcm files of one DICOM series"
    assert f"{site}/images/c4.png/a.png: not a DICOM file (no DICM preamble); {expected}" in problems
    assert f"{site}/images/c5: empty folder; {expected}" in problems
    assert f"{site}/images/c6: neither a file nor a folder (a broken symbolic link or a link loop)" in problems
    assert any(p.startswith(f"{site}/images/c7.dcm: unsupported image file") and "series folder" in p for p in problems)


def test_two_series_in_one_folder_are_refused(tmp_path):
    """Named as a viewer shows them, so the user can tell which to move out: by their UIDs where their
    SeriesNumbers are the same, by SeriesNumber and SeriesDescription where they differ."""
    write_series(tmp_path / "c1", VALUES, names=[f"a{k}" for k in range(SHAPE[2])], series_uid="1.2.3.100")
    write_series(tmp_path / "c1", VALUES[:, :, :4], names=[f"b{k}" for k in range(4)], series_uid="1.2.3.200")
    with pytest.raises(FederationError) as e:
        read_image(tmp_path / "c1", "3d")
    assert str(e.value) == (
        f"{tmp_path}/c1: holds 2 DICOM series (series 1.2.3.100: 6 files, a0 ...; series 1.2.3.200: 4 files, b0 ...); "
        "put each series in its own case folder"
    )
    for k in range(4):  # a thin-slice reconstruction exported into the same folder, as a PACS export does
        ds = pydicom.dcmread(tmp_path / "c1" / f"b{k}")
        ds.SeriesNumber, ds.SeriesDescription = 3, "thin 1mm"
        ds.save_as(tmp_path / "c1" / f"b{k}")
    (tmp_path / "c1" / "b0").rename(tmp_path / "c1" / "scout")
    for k in (1, 2, 3):
        (tmp_path / "c1" / f"b{k}").unlink()
    with pytest.raises(FederationError) as e:
        read_image(tmp_path / "c1", "3d")
    assert str(e.value) == (
        f"{tmp_path}/c1: holds 2 DICOM series (series 1: 6 files, a0 ...; series 3 'thin 1mm': 1 file, scout); put "
        "each series in its own case folder"
    )


def test_a_gantry_tilted_series_is_refused_and_rounding_noise_in_the_positions_is_not(tmp_path):
    """Slices stacked off their normal (a head CT with the gantry tilted 15 degrees: each 2.5 mm slice shifted
    0.67 mm sideways) have no voxel grid: refused in one line with the angle, pointing at a resampling; positions
    written with a little rounding noise (0.01 mm per slice) still read."""
    shift = SPACING[2] * np.tan(np.radians(15))
    write_series(tmp_path / "c1", VALUES, tilt_mm=shift)
    with pytest.raises(FederationError) as e:
        read_image(tmp_path / "c1", "3d")
    said = str(e.value)
    assert said.startswith(f"{tmp_path}/c1: the slices are stacked 15.0 degrees off their normal (a gantry-tilted CT?)")
    assert "dcm2niix corrects gantry tilt" in said and "\n" not in said
    write_series(tmp_path / "c2", VALUES, tilt_mm=0.01)
    assert read_image(tmp_path / "c2", "3d").shape[1:] == VALUES.shape


def test_a_missing_slice_is_reported_as_uneven_spacing(tmp_path):
    write_series(tmp_path / "c1", VALUES, names=[f"s{k}" for k in range(SHAPE[2])])
    (tmp_path / "c1" / "s2").unlink()
    uneven = r"c1: uneven slice spacing \(2\.5 to 5 mm; the largest gap is between s1 and s3\): missing slices\?$"
    with pytest.raises(FederationError, match=uneven):
        read_image(tmp_path / "c1", "3d")
    with pytest.raises(FederationError, match=r"^[^\n]*uneven slice spacing[^\n]*$"):
        file_spacing(tmp_path / "c1", 3)


def test_positions_rounded_to_two_decimals_read_as_even_and_mixed_slice_thicknesses_do_not(tmp_path):
    """0.625 mm CT slices whose ImagePositionPatient is rounded to 2 decimals (gaps of 0.62 and 0.63 mm, 1.6 %
    apart) are one evenly spaced series, its spacing the mean gap; slices 2 mm then 2.5 mm apart are still refused."""
    written = write_series(tmp_path / "thin", VALUES, heights=[k * 0.625 for k in range(SHAPE[2])], decimals=2)
    heights = sorted(float(ds.ImagePositionPatient[2]) for ds in written)  # the normal is -z (DIRECTION)
    assert len({round(b - a, 6) for a, b in zip(heights, heights[1:])}) > 1  # the rounding left uneven gaps
    grid = dicom_series.series_grid(tmp_path / "thin")
    assert grid.spacing(3)[2] == pytest.approx((heights[-1] - heights[0]) / (len(heights) - 1))
    assert read_image(tmp_path / "thin", "3d").shape[1:] == VALUES.shape
    write_series(tmp_path / "mixed", VALUES, heights=[0.0, 2.0, 4.0, 6.5, 9.0, 11.5])
    with pytest.raises(FederationError, match=r"mixed: uneven slice spacing \(2 to 2\.5 mm; "):
        dicom_series.series_grid(tmp_path / "mixed")


@pytest.mark.parametrize("name", ["DICOMDIR", "media.dcm"])
def test_a_dicomdir_in_a_series_folder_is_named_as_a_dicomdir(tmp_path, name):
    """A DICOMDIR (the index of a CD or USB export, found by its name or its SOP class) copied among the slices is
    named as what it is, not as a damaged slice without a SeriesInstanceUID."""
    from pydicom.fileset import FileSet

    write_series(tmp_path / "case", VALUES)
    medium = FileSet()
    medium.add(pydicom.dcmread(dicom_series.series_entries(tmp_path / "case")[0]))
    medium.write(tmp_path / "medium")
    shutil.copy(tmp_path / "medium" / "DICOMDIR", tmp_path / "case" / name)
    with pytest.raises(FederationError) as e:
        readers.volume_grid(tmp_path / "case")
    assert str(e.value) == (
        f"{tmp_path}/case/{name}: a DICOMDIR (a media directory), not a slice: move it out of the series folder"
    )


@pytest.mark.parametrize(
    ("grid", "why"),
    [
        ({"origin": ORIGIN + [0.65, 0.0, 0.0]}, r"its position is 0\.50 voxels off"),
        ({"spacing": (0.7, 2.6, 2.5)}, r"its orientation or pixel spacing differs from the image's"),
        ({"origin": ORIGIN + [0.0, 0.0, -5.0]}, r"it reaches voxel .* outside shape \(8, 10, 6\)"),
    ],
)
def test_a_seg_drawn_on_another_grid_is_refused(files, tmp_path, grid, why):
    other = write_seg(tmp_path / "seg.dcm", write_series(tmp_path / "other", VALUES, **grid), LABEL)
    where = r"seg\.dcm: DICOM-SEG frame \d+ does not lie on the grid of [^\n]*/dicom \("
    with pytest.raises(FederationError, match=where + why):
        read_label(other, "3d", image=files["dicom"])


def test_a_seg_of_another_scan_on_the_same_grid_is_refused(files, tmp_path):
    """Scans of one protocol share their grid, so a SEG drawn on another patient's series lands on this one's voxels:
    its frame of reference tells, and it is refused, not read as this label; without frames of reference, the series
    it references. A SEG drawn on a co-registered series (the same frame of reference) is read."""
    other_patient = write_series(tmp_path / "other", VALUES, frame="1.2.3.77")  # the same grid, another patient
    seg = write_seg(tmp_path / "other.dcm", other_patient, LABEL)
    with pytest.raises(FederationError) as e:
        read_label(seg, "3d", image=files["dicom"])
    assert str(e.value) == (
        f"{seg}: drawn on another scan: its FrameOfReferenceUID 1.2.3.77 is not that of its image {files['dicom']} "
        "(1.2.3.5); a segmentation of another patient or study?"
    )
    no_frame = pydicom.dcmread(seg)
    del no_frame.FrameOfReferenceUID
    no_frame.save_as(tmp_path / "no-frame.dcm")
    series = pydicom.dcmread(next(files["dicom"].iterdir())).SeriesInstanceUID
    with pytest.raises(FederationError) as e:
        read_label(tmp_path / "no-frame.dcm", "3d", image=files["dicom"])
    assert str(e.value) == (
        f"{tmp_path / 'no-frame.dcm'}: drawn on another scan: it references series "
        f"{other_patient[0].SeriesInstanceUID}, but its image {files['dicom']} is series {series}; a segmentation of "
        "another series?"
    )
    registered = write_seg(tmp_path / "registered.dcm", write_series(tmp_path / "t2", VALUES), LABEL)  # same frame
    np.testing.assert_array_equal(read_label(registered, "3d", image=files["dicom"]), LABEL)
    moved = pydicom.dcmread(files["label_seg"])
    moved.FrameOfReferenceUID = "1.2.3.999"
    moved.save_as(tmp_path / "moved.dcm")
    with pytest.raises(
        FederationError, match=r"moved\.dcm: drawn on another scan: its FrameOfReferenceUID 1\.2\.3\.999 "
    ):
        read_label(tmp_path / "moved.dcm", "3d", image=files["dicom"])
    np.testing.assert_array_equal(read_label(seg, "3d", image=files["nifti"]), LABEL)  # a NIfTI has no UIDs to compare


def test_a_seg_without_a_volume_image_or_a_dcm_that_is_no_seg_is_refused(files, tmp_path):
    with pytest.raises(FederationError, match=r"label\.dcm: a DICOM-SEG label is read on its case's image grid"):
        read_label(files["label_seg"], "3d")
    png = tmp_path / "a.png"
    png.write_bytes(b"")
    with pytest.raises(FederationError, match=r"label\.dcm: a DICOM-SEG label needs an image with a patient-space"):
        read_label(files["label_seg"], "2d", image=png)
    ct_slice = tmp_path / "ct.dcm"
    ct_slice.write_bytes(next(files["dicom"].iterdir()).read_bytes())
    with pytest.raises(FederationError, match=rf"^{ct_slice}: not a DICOM-SEG \(Modality CT\); a \.dcm label must be"):
        read_label(ct_slice, "3d", image=files["dicom"])


def test_without_the_formats_extra_nifti_works_and_others_say_what_to_install(files, monkeypatch):
    for module in ("itk", "pydicom"):
        monkeypatch.setitem(sys.modules, module, None)  # as if not installed
    np.testing.assert_array_equal(read_image(files["nifti"], "3d"), VALUES[None])
    for path in (files["mha"], files["dicom"], files["label_seg"]):
        with pytest.raises(FederationError) as e:
            read_label(path, "3d", image=files["nifti"]) if path.suffix == ".dcm" else read_image(path, "3d")
        assert str(e.value).startswith(f"{path}: reading ") and str(e.value).endswith(": pip install 'fedseg[formats]'")


# --- a federation mixing formats --------------------------------------------------------------------------


def test_data_check_and_load_folder_on_a_federation_mixing_formats(files, tmp_path):
    import shutil

    root = tmp_path / "fed"
    root.mkdir()
    header = {
        "name": "mixed",
        "kind": "3d",
        "channels": 1,
        "regions": {"organ": [1, 2], "lesion": [2]},
        "label_names": {0: "background", 1: "organ", 2: "lesion"},
    }
    (root / "federation.yaml").write_text(yaml.safe_dump(header))
    layout = {
        "a": [("n1.nii.gz", "nifti", "n1.nii.gz", "label_nifti"), ("r1.nrrd", "nrrd", "r1.nrrd", "label_nrrd")],
        "b": [
            ("m1.mha", "mha", "m1.mha", "label_mha"),
            ("d1", "dicom", "d1.dcm", "label_seg"),
            ("n2.nii.gz", "nifti", "n2.nii.gz", "label_nifti"),  # a third case: every site keeps a test case
        ],
    }
    for site, cases in layout.items():
        (root / site / "images").mkdir(parents=True)
        (root / site / "labels").mkdir()
        for image, key, label, label_key in cases:
            copy = shutil.copytree if files[key].is_dir() else shutil.copy
            copy(files[key], root / site / "images" / image)
            shutil.copy(files[label_key], root / site / "labels" / label)
    write_itk(root / "a" / "images" / "h1.mhd", VALUES)  # a MetaImage header and its .raw data file: one case
    shutil.copy(files["label_mha"], root / "a" / "labels" / "h1.mha")
    result = CliRunner().invoke(data_app, ["check", str(root)])
    assert result.exit_code == 0, result.output
    assert "2 sites, 6 cases" in result.output
    fed = check_folder(root)
    for site in fed.sites:
        for case in site.cases:
            image, label = case.arrays()
            np.testing.assert_array_equal(image, VALUES[None], err_msg=case.id)
            np.testing.assert_array_equal(label, LABEL, err_msg=case.id)
            assert case_spacing(case, 3) == pytest.approx(SPACING)
    assert [c.id for c in load_folder(root).site("b").cases] == ["d1", "m1", "n2"]
    # exported for nnU-Net, every format's case lies where its source lies (origin and directions, not only the
    # spacing), as fedseg predict's masks do; the voxels unchanged
    result = CliRunner().invoke(data_app, ["export", "nnunet", str(root), "--out", str(tmp_path / "raw")])
    assert result.exit_code == 0, result.output
    (dataset,) = (tmp_path / "raw").iterdir()
    assert dataset.stat().st_mode & 0o777 == 0o777 & ~current_umask()  # readable as the umask says, not 0700
    for site in fed.sites:
        for case in site.cases:
            (written,) = dataset.glob(f"images*/{site.name}__{case.id}_0000.nii.gz")
            source = readers.volume_grid(case.meta["image"]).affine
            np.testing.assert_allclose(nib.load(written).affine, source, atol=1e-5, err_msg=case.id)
            np.testing.assert_array_equal(np.asarray(nib.load(written).dataobj), VALUES, err_msg=case.id)
            assert np.abs(source[:3, 3]).max() > 1  # a real origin: diag(spacing) would not pass
    third = [p for p in (root / "b/images/d1").iterdir() if pydicom.dcmread(p).InstanceNumber == 3]
    third[0].unlink()  # a slice in the middle
    result = CliRunner().invoke(data_app, ["check", str(root)])
    assert result.exit_code == 1 and "Traceback" not in result.output
    assert f"{root}/b/images/d1: uneven slice spacing" in result.output
    output = " ".join(result.output.split())  # once, though its DICOM-SEG label is read on the same series
    assert "federation folder is invalid:" in output and output.count("uneven slice spacing") == 1, result.output


def test_msd_import_links_nrrd_and_mha_files_and_refuses_a_lone_mhd_header(files, tmp_path):
    import json
    import shutil

    from fedseg.data.importers import import_dataset
    from fedseg.data.importers.writer import Source

    task = tmp_path / "Task05_Prostate"
    (task / "imagesTr").mkdir(parents=True)
    (task / "labelsTr").mkdir()
    shutil.copy(files["nrrd"], task / "imagesTr" / "p1.nrrd")
    shutil.copy(files["label_mha"], task / "labelsTr" / "p1.mha")
    dataset = {
        "name": "Prostate",
        "modality": {"0": "T2"},
        "labels": {"0": "background", "1": "organ", "2": "lesion"},
        "training": [{"image": "./imagesTr/p1.nrrd", "label": "./labelsTr/p1.mha"}],
    }
    (task / "dataset.json").write_text(json.dumps(dataset))
    fed = import_dataset("msd", [task], tmp_path / "fed")
    assert (tmp_path / "fed" / "Task05_Prostate" / "images" / "p1.nrrd").is_symlink()
    image, label = fed.sites[0].cases[0].arrays()
    np.testing.assert_array_equal(image, VALUES[None])
    np.testing.assert_array_equal(label, LABEL)
    with pytest.raises(FederationError, match=r"image\.mhd: a MetaImage \.mhd header cannot be linked"):
        Source(files["mhd"]).extension()


def test_a_metaimage_without_its_data_file_or_cut_short_is_one_line_without_itks_own_output(tmp_path, capfd):
    """A .mhd copied without its .raw, or a MetaImage or NRRD whose voxel data an interrupted copy cut short: ITK
    says "No such file or directory" (naming the header, which is there) or "trouble reading", and prints its own
    lines on stderr. Each is one line naming the file and what is missing, from a data check too."""
    site = _site(tmp_path / "fed")
    (tmp_path / "fed" / "federation.yaml").write_text(
        yaml.safe_dump({"name": "m", "kind": "3d", "channels": 1, "regions": {"organ": [1, 2]}})
    )
    images = site / "images"
    for case in ("c1", "c2", "c3", "c4"):
        write_itk(site / "labels" / f"{case}.mha", LABEL)
    write_itk(images / "c1.mhd", VALUES)  # c1.mhd + c1.raw
    (images / "c1.raw").unlink()
    write_itk(images / "c2.mhd", VALUES)
    with (images / "c2.raw").open("r+b") as f:
        f.truncate(500)
    write_itk(images / "c3.mha", VALUES)  # ITK writes it uncompressed: a header, then 8 x 10 x 6 x 2 bytes
    with (images / "c3.mha").open("r+b") as f:
        f.truncate((images / "c3.mha").stat().st_size - 100)
    write_pynrrd(images / "c4.nrrd", VALUES)  # pynrrd gzips the voxels
    with (images / "c4.nrrd").open("r+b") as f:
        f.truncate((images / "c4.nrrd").stat().st_size // 2)
    cut = "a truncated file (an interrupted copy?); copy it again"
    expected = {
        "c1.mhd": "its voxel data file c1.raw (ElementDataFile) is missing: a .mhd is only the header; put c1.raw "
        "beside it (copy both files), or give the image as one .mha",
        "c2.mhd": f"its voxel data (DimSize 8 10 6, MET_USHORT) in c2.raw ends after 500 of 960 bytes: {cut}",
        "c3.mha": f"its voxel data (DimSize 8 10 6, MET_USHORT) ends after 860 of 960 bytes: {cut}",
    }
    for name, why in expected.items():
        with pytest.raises(FederationError) as e:
            read_image(images / name, "3d")
        assert str(e.value) == f"{images / name}: {why}"
        with pytest.raises(FederationError) as e:
            readers.volume_grid(images / name)  # the header alone: no grid of a file without its voxels either
        assert str(e.value) == f"{images / name}: {why}"
    with pytest.raises(FederationError) as e:
        read_image(images / "c4.nrrd", "3d")
    assert re.fullmatch(
        rf"{re.escape(str(images))}/c4\.nrrd: its voxel data \(gzip\) ends after \d+ bytes, \d+ of its 960 bytes "
        rf"unpacked: {re.escape(cut)}",
        str(e.value),
    ), str(e.value)
    write_pynrrd(images / "c4.nrrd", VALUES)
    header = (images / "c4.nrrd").read_bytes().split(b"\n\n")[0].replace(b"encoding: gzip", b"encoding: raw")
    (images / "c4.nrrd").write_bytes(header + b"\n\n" + VALUES.astype("<u2").tobytes(order="F")[:700])
    with pytest.raises(FederationError) as e:
        read_image(images / "c4.nrrd", "3d")
    assert str(e.value) == f"{images}/c4.nrrd: its voxel data ends after 700 of 960 bytes: {cut}"
    capfd.readouterr()
    result = CliRunner().invoke(data_app, ["check", str(tmp_path / "fed")])
    assert result.exit_code == 1 and "Traceback" not in result.output
    for name, why in expected.items():
        assert f"{images / name}: {why}" in " ".join(result.output.split()), result.output
    assert "MetaImage" not in capfd.readouterr().err  # ITK never tried: none of its lines on stderr
    (images / "c4.nrrd").write_bytes(header + b"\n\n" + VALUES.astype("<u2").tobytes(order="F"))
    np.testing.assert_array_equal(read_image(images / "c4.nrrd", "3d"), VALUES[None])  # whole: read as before
    # a MetaImage whose voxels are text (BinaryData = False) is shorter than their binary size and is no truncation
    text = " ".join(str(v) for v in VALUES.ravel(order="F"))
    (images / "c5.mha").write_text(
        "ObjectType = Image\nNDims = 3\nBinaryData = False\nDimSize = 8 10 6\nElementSpacing = 1 1 1\n"
        f"ElementType = MET_FLOAT\nElementDataFile = LOCAL\n{text}\n"
    )
    assert readers.metaimage_problem(images / "c5.mha") is None
    np.testing.assert_array_equal(read_image(images / "c5.mha", "3d"), VALUES[None])


def test_reading_a_tiny_dicom_series_is_fast(files):
    read_image(files["dicom"], "3d")  # ITK loads its DICOM module on first use
    start = time.perf_counter()
    read_image(files["dicom"], "3d")
    assert time.perf_counter() - start < 1.0


def test_a_label_on_another_grid_than_its_image_is_one_line(tmp_path):
    """Equal shapes, voxels elsewhere: a label flipped along one axis, or moved by 50 mm, is refused; within half a
    voxel (header rounding) it passes."""
    import nibabel as nib

    from fedseg.data.case_files import grid_problems

    affine = np.diag([0.7, 1.3, 2.5, 1.0])
    data = np.zeros((8, 10, 6), np.uint8)
    nib.save(nib.Nifti1Image(data, affine), tmp_path / "image.nii.gz")
    for name, other in {
        "flipped": affine @ np.array([[-1, 0, 0, 7], [0, 1, 0, 0], [0, 0, 1, 0], [0, 0, 0, 1.0]]),
        "moved": affine + np.array([[0, 0, 0, 50.0]] + [[0, 0, 0, 0]] * 3),
        "rounded": affine + np.array([[0, 0, 0, 0.2]] + [[0, 0, 0, 0]] * 3),
    }.items():
        nib.save(nib.Nifti1Image(data, other), tmp_path / f"{name}.nii.gz")
    image = tmp_path / "image.nii.gz"
    (flipped,) = grid_problems(image, tmp_path / "flipped.nii.gz")
    assert flipped.startswith(f"{tmp_path / 'flipped.nii.gz'}: label grid does not match image {image}")
    assert "resample the label onto the image" in flipped
    assert "np.float64" not in flipped and " mm)" in flipped  # origins as plain numbers, not numpy reprs
    assert len(grid_problems(image, tmp_path / "moved.nii.gz")) == 1
    assert grid_problems(image, tmp_path / "rounded.nii.gz") == []


def test_predict_takes_dicom_series_folders_as_it_takes_the_same_volume_in_nifti(tmp_path, tiny_config):
    """``fedseg predict`` on a DICOM series folder (given itself, or inside the input folder) gives the mask it
    gives for the same voxels in a NIfTI file on the same grid, written as NIfTI with the series' affine."""
    from fedseg.data.federation import Case, Federation, Site
    from fedseg.data.folder_write import write_folder
    from fedseg.predict import predict
    from fedseg.run import run_experiment
    from test_volumes import TUMOUR, _patch_cfg, tumour_case

    def one_channel(seed: int) -> tuple[np.ndarray, np.ndarray]:
        image, label = tumour_case(shape=(20, 22, 14), seed=seed)
        return np.clip(np.rint(image[:1]), 0, 4000).astype(np.uint16), label  # CT-like: what DICOM stores

    sites = [
        Site(s, [Case.from_arrays(f"{s}{i}", *one_channel(10 * k + i)) for i in range(4)]) for k, s in enumerate("ab")
    ]
    root = write_folder(Federation("ct", "3d", 1, TUMOUR, sites), tmp_path / "fed")
    run_experiment(_patch_cfg(tiny_config, root, 1), tmp_path / "run")
    assert "resized" not in (tmp_path / "run" / "run.log").read_text()  # patches of each volume's own grid

    image, _ = one_channel(99)
    series = tmp_path / "dicom" / "case"
    write_series(series, image[0], spacing=(1.0, 1.0, 1.0))
    nifti = tmp_path / "nifti"
    nifti.mkdir()  # the same grid: the series' (PLI; the model, trained on RAS volumes, turns both alike)
    nib.save(nib.Nifti1Image(image[0], readers.volume_grid(series).affine), nifti / "case.nii.gz")
    assert np.array_equal(read_image(series, "3d"), image)  # the same voxels, in the same index order

    predict(tmp_path / "run", nifti, tmp_path / "from_nifti")
    predict(tmp_path / "run", series, tmp_path / "from_series")  # the series folder itself
    predict(tmp_path / "run", series.parent, tmp_path / "from_folder")  # a folder holding the series
    expected = np.asarray(nib.load(tmp_path / "from_nifti" / "case.nii.gz").dataobj)
    assert expected.any()
    for out in ("from_series", "from_folder"):
        mask = nib.load(tmp_path / out / "case.nii.gz")
        assert np.array_equal(np.asarray(mask.dataobj), expected), out
        assert np.allclose(mask.affine, readers.volume_grid(series).affine), out
        assert "case" in (tmp_path / out / "predictions.csv").read_text()


def _nifti_with_zero_voxel_size(path: Path, with_sform: bool) -> Path:
    """A NIfTI whose second pixdim is 0, written byte by byte (nibabel's writer refuses it); ``with_sform``: the
    header also holds an sform, which then gives the voxel size."""
    import gzip
    import struct

    import nibabel as nib

    plain = path.with_suffix("").with_suffix(".nii")
    nib.save(nib.Nifti1Image(np.zeros((4, 4, 4), np.float32), np.eye(4) if with_sform else None), plain)
    raw = bytearray(plain.read_bytes())
    raw[80:84] = struct.pack("<f", 0.0)  # pixdim[1] (pixdim starts at byte 76)
    path.write_bytes(gzip.compress(bytes(raw)))
    return path


def test_a_nifti_without_a_voxel_size_is_refused_by_name_and_nibabels_fix_messages_stay_quiet(tmp_path, capfd):
    from fedseg.data.readers import read_volume, volume_grid

    bad = _nifti_with_zero_voxel_size(tmp_path / "no_size.nii.gz", with_sform=False)
    for read in (volume_grid, read_volume):
        with pytest.raises(FederationError, match=r"no_size\.nii\.gz: voxel size \[0\.0, 1\.0, 1\.0\] \(NIfTI pixdim"):
            read(bad)
    good = _nifti_with_zero_voxel_size(tmp_path / "sform.nii.gz", with_sform=True)  # the sform gives the size
    assert volume_grid(good).shape == (4, 4, 4) and read_volume(good).shape == (4, 4, 4)
    assert "pixdim" not in capfd.readouterr().err  # nibabel's "setting 0 dims to 1", once per file read


def test_a_truncated_dicom_file_of_a_series_is_named(tmp_path):
    from fedseg.data.dicom_series import series_grid

    write_series(tmp_path / "series", VALUES)
    broken = sorted((tmp_path / "series").iterdir())[0]
    broken.write_bytes(broken.read_bytes()[:300])  # cut inside its header, as by an interrupted copy
    with pytest.raises(FederationError) as error:
        series_grid(tmp_path / "series")
    message = str(error.value)
    assert message.startswith(f"{broken}: ") and "\n" not in message, message


def test_series_grid_and_the_seg_writer_sort_the_slices_by_one_rule(tmp_path):
    from fedseg.predict_seg import sorted_slices

    written = write_series(tmp_path / "series", VALUES)  # slice k at ORIGIN + k * 2.5 mm along the normal
    entries = dicom_series.series_entries(tmp_path / "series")  # by file name: shuffled against the positions
    headers = [pydicom.dcmread(p, stop_before_pixels=True) for p in entries]
    indices, normal = dicom_series.slice_order(headers)
    np.testing.assert_allclose(normal, DIRECTION[:, 2])  # row direction x column direction
    assert [int(headers[i].InstanceNumber) for i in indices] == list(range(1, len(written) + 1))
    assert [int(ds.InstanceNumber) for ds in headers] != sorted(int(ds.InstanceNumber) for ds in headers)
    sources = sorted_slices(tmp_path / "series")
    assert [ds.SOPInstanceUID for ds in sources] == [ds.SOPInstanceUID for ds in written]
    grid = dicom_series.series_grid(tmp_path / "series")  # its origin: the first slice of that order
    np.testing.assert_allclose(LPS_TO_RAS[:3, :3] @ np.asarray(sources[0].ImagePositionPatient), grid.affine[:3, 3])


def test_a_truncated_slice_is_named_as_truncated_not_blamed_on_the_slice_spacing(tmp_path):
    """A slice cut short (an interrupted copy): ITK drops it and would report uneven spacing or another series;
    fedseg names the file and says it is truncated, whether its pixel data or its header was cut."""
    write_series(tmp_path / "case", VALUES)
    victim = sorted((tmp_path / "case").iterdir())[2]
    data = victim.read_bytes()
    victim.write_bytes(data[:-100])
    with pytest.raises(FederationError) as e:
        readers.volume_grid(tmp_path / "case")
    assert str(e.value).startswith(
        f"{victim}: its pixel data ends at least 96 bytes short of 10 x 8 pixels of 16 bits"
    )  # 100 - 4: the header assumed at its shortest
    assert "a truncated file (an interrupted copy?)" in str(e.value)
    victim.write_bytes(data[: len(data) - 160 - 12 + 4])  # into the pixel data element's header
    with pytest.raises(FederationError, match="truncated file"):
        readers.volume_grid(tmp_path / "case")
    victim.write_bytes(data)
    assert readers.volume_grid(tmp_path / "case").shape == VALUES.shape


def jpeg_lossless(path: Path) -> None:
    """Re-encode the DICOM file ``path``'s pixels as JPEG-Lossless (ITK's GDCM), as many PACS export a series."""
    import itk

    ds = pydicom.dcmread(path)
    image = itk.image_from_array(np.ascontiguousarray(ds.pixel_array))
    io = itk.GDCMImageIO.New()
    io.SetCompressor("JPEG")
    encoded = path.with_suffix(".jpeg.dcm")
    itk.ImageFileWriter[type(image)].New(Input=image, FileName=str(encoded), ImageIO=io, UseCompression=True).Update()
    compressed = pydicom.dcmread(encoded)
    encoded.unlink()
    ds.file_meta.TransferSyntaxUID, ds.PixelData = compressed.file_meta.TransferSyntaxUID, compressed.PixelData
    ds["PixelData"].VR = "OB"
    ds.save_as(path, enforce_file_format=True)


@pytest.mark.parametrize("compressed", [False, True])
def test_slices_with_their_own_rescale_slope_and_intercept_are_each_rescaled_by_their_own(tmp_path, compressed):
    """PET and some MR series give every slice its own RescaleSlope/Intercept. ITK reads all slices in the first
    file's pixel type (integer where its slope is 1) and truncated the others' values (406.5 read as 406); each
    slice is now its stored values times its own slope plus its own intercept, JPEG-Lossless slices too (decoded by
    ITK, as the whole series is). A series whose slices share one slope and intercept reads as before (ITK's array,
    its dtype)."""
    write_series(tmp_path / "shared", VALUES)
    shared = readers.read_volume(tmp_path / "shared")
    assert shared.dtype != np.float64
    np.testing.assert_array_equal(shared, VALUES)
    slopes = [1.0, 0.5, 0.3, 1.7, 0.001, 2.0]
    intercepts = [0.0, -1.25, 3.0, 0.0, 0.5, -1024.0]
    folder = tmp_path / "per-slice"
    written = write_series(folder, VALUES)
    for path in folder.iterdir():
        if compressed:
            jpeg_lossless(path)
        ds = pydicom.dcmread(path)
        k = [w.SOPInstanceUID for w in written].index(ds.SOPInstanceUID)  # written in slice order, k = its height
        ds.RescaleSlope, ds.RescaleIntercept = slopes[k], intercepts[k]
        ds.save_as(path)
    if compressed:
        assert "JPEG Lossless" in pydicom.dcmread(next(folder.iterdir())).file_meta.TransferSyntaxUID.name
    volume = readers.read_volume(folder)
    expected = np.stack(
        [VALUES[:, :, k].astype(np.float64) * slopes[k] + intercepts[k] for k in range(SHAPE[2])], axis=2
    )
    assert volume.dtype == np.float64 and volume.shape == VALUES.shape
    np.testing.assert_allclose(volume, expected, rtol=0, atol=1e-9)


def test_the_voxel_orientation_data_check_compares_is_the_grids_of_every_format(files):
    """``data check`` warns when volumes lie in different voxel orientations; a DICOM series' comes from one slice's
    header (not every slice's), and must be the orientation of the grid the series is read on, as every other
    format's is."""
    from nibabel.orientations import aff2axcodes

    from fedseg.data.reorient import voxel_orientation

    for key in ("dicom", "nifti", "nrrd", "mha"):
        grid = readers.volume_grid(files[key])
        assert voxel_orientation(files[key]) == "".join(aff2axcodes(grid.affine)), key
    assert voxel_orientation(files["dicom"]) == "PLI"  # DIRECTION: rows run posterior, columns left, slices down


def test_a_relative_federation_folder_is_read_by_absolute_paths_with_itk_loaded_before_the_threads(
    files, tmp_path, monkeypatch
):
    """ITK Python loads its modules on first use and chdirs the whole process into its library folder while it does,
    so a reader thread opening a relative path meanwhile missed it (``fedseg data check fed``: a random
    ``fed/hospA/images/a2/slice_002.dcm: No such file or directory``, HDF5 diagnostics on a folder). The paths handed
    to the readers are absolute, and ITK is loaded on the main thread before the check's threads start."""
    import shutil

    from fedseg.data import check as check_module

    root = tmp_path / "fed"
    header = {"name": "rel", "kind": "3d", "channels": 1, "regions": {"organ": [1, 2], "lesion": [2]}}
    (root / "s1" / "labels").mkdir(parents=True)
    (root / "federation.yaml").write_text(yaml.safe_dump({**header, "label_names": {1: "organ", 2: "lesion"}}))
    for case in ("d1", "d2", "d3"):
        shutil.copytree(files["dicom"], root / "s1" / "images" / case)
        shutil.copy(files["label_seg"], root / "s1" / "labels" / f"{case}.dcm")
    started = []
    real = check_module.ordered_map

    def spy(fn, items, workers, name="batches"):
        items = list(items)
        started.append((readers.itk_loaded(), [job[2] for job in items] + [job[3] for job in items]))
        return real(fn, items, workers, name)

    monkeypatch.setattr(check_module, "ordered_map", spy)
    monkeypatch.setattr(readers, "_itk_loaded", False)
    monkeypatch.chdir(tmp_path)
    checked = check_folder("fed", threads=3)
    [(loaded, paths)] = started
    assert loaded, "ITK was not loaded before the check's reader threads started"
    assert paths and all(p.is_absolute() for p in paths)
    monkeypatch.setattr(readers, "_itk_loaded", False)
    for fed in (checked, load_folder("fed")):
        cases = fed.site("s1").cases
        assert all(Path(c.meta["image"]).is_absolute() and Path(c.meta["label"]).is_absolute() for c in cases)
    assert readers.itk_loaded()  # load_folder loads it on its (the main) thread too
    assert readers.needs_itk([files["dicom"]]) and not readers.needs_itk([files["nifti"]])


def test_predict_names_a_series_folder_one_level_too_deep_instead_of_skipping_it(files, tmp_path):
    """``--input new`` with ``new/ok0/*.dcm`` and ``new/pt1/CT_series/*.dcm`` (a PACS export's layout): pt1 was
    skipped without a word while ok0 was predicted; it is named as ``data check`` names it, in one line."""
    from fedseg.predict_inputs import PredictError, list_inputs

    new = tmp_path / "new"
    shutil.copytree(files["dicom"], new / "ok0")
    shutil.copytree(files["dicom"], new / "pt1" / "CT_series")
    (new / "empty").mkdir()  # no DICOM file in it: no input, as documented
    with pytest.raises(PredictError) as e:
        list_inputs(new)
    assert str(e.value) == (
        f"{new / 'pt1'}: holds the folder 'CT_series' of {SHAPE[2]} DICOM files, a series one level too deep (a PACS "
        "export's layout?): move the files up into pt1/ and remove 'CT_series'; a DICOM series folder holds the .dcm "
        "files of one series and nothing else"
    )
    problems: list[str] = []
    assert list_inputs(new, problems_out=problems) == [new / "ok0"]
    assert len(problems) == 1
