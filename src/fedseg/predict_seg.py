"""``fedseg predict --dicom-seg``: the predicted regions of a DICOM series input as a DICOM Segmentation object.

For each input that is a DICOM series folder, ``<name>.dcm`` beside its NIfTI mask ``<name>.nii.gz``: a BINARY
DICOM-SEG (highdicom) with one segment per region of the bundle, in the bundle's region order (segment ``k`` =
region ``k - 1``, labelled with the region's name), each segment that region's predicted mask before the regions are
painted to a label map (``Regions.to_label``), so nested regions (BraTS WT/TC/ET) overlap as predicted. Its frames
lie on the source slices and reference them; the patient, study and frame of reference are the source series'
(highdicom copies them, a one-component PatientName such as ``ANON123`` as it is, without highdicom's warning on
it; the patient and study attributes of DICOM type 2 that an anonymizer removed are written empty, as the
standard allows, ``TYPE2_PATIENT_STUDY``), the series is new (``SeriesInstanceUID``; ``SeriesNumber`` the
source's + 1000),
``SeriesDescription`` says fedseg and the algorithm, ``Manufacturer`` and ``ContentCreatorName`` are ``fedseg``.
Each segment is AUTOMATIC, identified as ``fedseg <algorithm>`` (family Artificial Intelligence, DCM 123110; the
model that segmented the image and the threshold as parameters); its category is Anatomical Structure
(SCT 91723000) and its type the generic Body structure (SCT 123037004): a region's anatomy is known by its name only.

highdicom (with pydicom) comes with ``pip install 'fedseg[formats]'``; it is imported only when a SEG is asked for.
"""

from __future__ import annotations

import importlib
import warnings
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np

from fedseg import __version__
from fedseg.data import dicom_series, optional_modules
from fedseg.run.bundles import Bundle, BundleError

SERIES_NUMBER_OFFSET = 1000  # the SEG's SeriesNumber: the source series' + this
_LO = 64  # the longest LO (long string) value: SeriesDescription, algorithm name
# highdicom's warning (4 lines per SEG) on a source's one-component PatientName ("Smith", "ANON123"): valid DICOM,
# which the SEG must copy as it is (the patient's name is the source's, not fedseg's to re-encode)
_ONE_COMPONENT_NAME = r'The string ".*" is unlikely to represent the intended person name'
# the patient and study attributes a SEG copies from its source that DICOM makes type 2 (present, possibly empty):
# anonymizers remove them (highdicom then fails on the missing attribute), so the SEG gets them empty
TYPE2_PATIENT_STUDY = (
    "PatientName",
    "PatientID",
    "PatientBirthDate",
    "PatientSex",
    "StudyDate",
    "StudyTime",
    "StudyID",
    "AccessionNumber",
    "ReferringPhysicianName",
)


def seg_name(path: Path) -> str | None:
    """``<name>.dcm``: the DICOM-SEG written for the DICOM series folder ``path`` (beside ``<name>.nii.gz``); None
    for an image file (no series to reference)."""
    return f"{path.name}.dcm" if path.is_dir() else None


def require_highdicom(where: Path) -> ModuleType:
    """highdicom, imported now; ``BundleError`` (``PredictError``) naming ``where`` and the install command."""
    try:
        return importlib.import_module("highdicom")
    except ImportError:
        raise BundleError(f"{where}: writing a DICOM-SEG needs highdicom: {optional_modules.INSTALL_HINT}") from None


def seg_writer(bundle: Bundle, paths: list[Path], given: Path, skipped: int = 0) -> SegWriter:
    """The writer of ``bundle``'s DICOM-SEGs; ``--dicom-seg`` is refused (one line, before anything is predicted)
    where none of the inputs ``paths`` of ``--input given`` is a DICOM series folder, or where highdicom is missing.
    ``skipped``: how many DICOM series among the inputs were skipped (unreadable as one volume: ``predict``'s
    warnings); where those were all the series, the refusal says so, not that there was none."""
    if not any(p.is_dir() for p in paths) and skipped:
        which = "the only DICOM series" if skipped == 1 else f"all {skipped} DICOM series"
        raise BundleError(
            f"{given}: --dicom-seg writes a DICOM-SEG for each DICOM series input, and {which} among the inputs "
            f"{'was' if skipped == 1 else 'were'} skipped (unreadable as one volume, said above); --dicom-seg needs "
            "at least one readable series: fix or remove the skipped series, or leave out --dicom-seg to predict "
            "the other inputs"
        )
    if not any(p.is_dir() for p in paths):
        raise BundleError(
            f"{given}: --dicom-seg writes a DICOM-SEG for each DICOM series input (a folder of .dcm slices), and "
            "there is none among the inputs; leave out --dicom-seg for other images"
        )
    require_highdicom(given)
    return SegWriter(bundle.folder.name, bundle.regions.names, float(bundle.manifest["threshold"]), __version__)


@dataclass(frozen=True)
class SegWriter:
    """What every DICOM-SEG of one ``predict`` says of its maker: ``algorithm`` (the bundle folder's name, e.g.
    ``fedavg``), the bundle's ``regions`` (names, in channel order), its ``threshold`` and fedseg's ``version``."""

    algorithm: str
    regions: tuple[str, ...]
    threshold: float
    version: str

    def write_for(self, folder: Path, masks: np.ndarray, source: Path, model: str) -> str:
        """The DICOM-SEG of input ``source`` into ``folder`` if it is a DICOM series (``write``): its name; else ``""``
        (an image file gets none)."""
        name = seg_name(source)
        if name is not None:
            self.write(folder / name, masks, source, model)
        return name or ""

    def write(self, path: Path, masks: np.ndarray, series: Path, model: str) -> None:
        """The DICOM-SEG of region ``masks`` ``(R, *spatial)`` (0/1, on the grid fedseg reads ``series`` on:
        column, row, slice sorted along the slice normal) to ``path``; ``model``: the network that predicted them."""
        try:
            self._write(path, masks, series, model)
        except (AttributeError, KeyError, TypeError, ValueError) as e:  # a header highdicom cannot build a SEG on
            raise BundleError(f"{series}: cannot write its DICOM-SEG ({type(e).__name__}: {e})") from None

    def _write(self, path: Path, masks: np.ndarray, series: Path, model: str) -> None:
        hd = require_highdicom(series)
        from pydicom.sr.codedict import codes

        sources = sorted_slices(series)
        first = sources[0]
        shape = (int(first.Columns), int(first.Rows), len(sources))
        masks = np.asarray(masks).astype(bool).reshape(len(self.regions), *shape)  # a 2D model: its slice axis
        frames = np.ascontiguousarray(masks.transpose(3, 2, 1, 0))  # (slices, rows, columns, segments)
        algorithm = hd.AlgorithmIdentificationSequence(
            name=f"fedseg {self.algorithm}"[:_LO],
            family=codes.cid7162.ArtificialIntelligence,
            version=self.version,
            parameters={"model": model, "threshold": f"{self.threshold:g}"},
        )
        descriptions = [
            hd.seg.SegmentDescription(
                segment_number=number,
                segment_label=name[:_LO],
                segmented_property_category=codes.SCT.AnatomicalStructure,
                segmented_property_type=codes.SCT.BodyStructure,
                algorithm_type=hd.seg.SegmentAlgorithmTypeValues.AUTOMATIC,
                algorithm_identification=algorithm,
            )
            for number, name in enumerate(self.regions, start=1)
        ]
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", _ONE_COMPONENT_NAME, UserWarning)
            seg = self._segmentation(hd, sources, frames, descriptions, model)
        seg.SeriesDescription = f"fedseg {self.algorithm} segmentation"[:_LO]
        seg.ContentCreatorName = "fedseg"  # set here: highdicom warns of a one-component person name
        seg.save_as(path)

    def _segmentation(
        self, hd: ModuleType, sources: list[Any], frames: np.ndarray, descriptions: list[Any], model: str
    ) -> Any:
        """highdicom's ``Segmentation`` of ``frames`` on ``sources`` (see the module docstring)."""
        first = sources[0]
        return hd.seg.Segmentation(
            source_images=sources,
            pixel_array=frames,
            segmentation_type=hd.seg.SegmentationTypeValues.BINARY,
            segment_descriptions=descriptions,
            series_instance_uid=hd.UID(),
            series_number=int(getattr(first, "SeriesNumber", 0) or 0) + SERIES_NUMBER_OFFSET,
            sop_instance_uid=hd.UID(),
            instance_number=1,
            manufacturer="fedseg",
            manufacturer_model_name=f"fedseg {self.algorithm}"[:_LO],
            software_versions=self.version,
            device_serial_number=model[:_LO],
            content_label="FEDSEG",
            content_description=f"fedseg predict, {self.algorithm}"[:_LO],
            omit_empty_frames=bool(frames.any()),  # nothing predicted: every frame kept (highdicom warns otherwise)
        )


def sorted_slices(series: Path) -> list[Any]:
    """The headers of the slices of DICOM series folder ``series`` in the order fedseg reads them (its third array
    axis: by position along the slice normal, ``dicom_series.slice_order``, the order ``dicom_series.series_grid``
    gives them); the series is one ``read_inputs`` accepted."""
    headers = [dicom_series.read_dicom(p, stop_before_pixels=True) for p in dicom_series.series_entries(series)]
    return [with_type2_attributes(headers[i]) for i in dicom_series.slice_order(headers)[0]]


def with_type2_attributes(header: Any) -> Any:
    """``header`` (a pydicom dataset, read into memory only) with each of ``TYPE2_PATIENT_STUDY`` it lacks set
    empty: an anonymized series' SEG says "unknown" as the standard allows, rather than no SEG at all."""
    for keyword in TYPE2_PATIENT_STUDY:
        if keyword not in header:
            setattr(header, keyword, "")
    return header
