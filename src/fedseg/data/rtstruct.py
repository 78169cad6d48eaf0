"""DICOM RT Structure Sets (Modality RTSTRUCT) as label maps: ``labels/<case>.dcm`` painted on its image's grid.

Radiotherapy planning systems store contours as an RT Structure Set: one ROI per structure (GTV, CTV, BODY, a
couch...), each a stack of polygons in patient coordinates (mm, DICOM LPS), one or more per image slice.
``read_rtstruct`` rasterizes the ROIs that ``label_names`` (federation.yaml) names onto the case image's voxel grid
(a 3D volume with a patient-space grid: a DICOM series, NIfTI, NRRD or MetaImage; ``readers.volume_grid``):

- **ROI -> label value**: an ROI whose ``ROIName`` names a ``label_names`` entry (compared as DICOM-SEG segment
  labels are, ``dicom_seg.segment_values``: case-insensitive, ``_`` and ``-`` as spaces) gets that entry's value,
  by any of its names where the entry lists several (``{1: [tumor, GTV Tumour]}``: one structure each hospital
  spells its own way; ``synonyms``, the names after the first); ROIs named in no entry (BODY, External, couch,
  markers) are skipped unread. No ROI named so, or no ``label_names``: refused; a ``label_names`` entry no ROI of
  any structure set names by any of its names: refused by the data check, with the closest ROI names
  (``check.rtstruct_problems``).
- **A label no ROI names**: an ROI declared in StructureSetROISequence without contours is an explicitly empty
  structure, read as background without a word. A ``label_names`` entry that no ROI of a structure set names at all
  is read as background too (a case without a lesion is legitimate), but it is not silent: in RT practice a missing
  ROI usually means "not contoured", so training it as background may be a partial-label bug. Each such file is
  noted (``Painted``): ``fedseg data check`` (``check.check_folder`` inside ``noting``) summarises them in one
  warning line per site and label; any other read logs one WARNING per file (logger ``fedseg.data.rtstruct``, once
  per process) naming the file, the missing labels and the ROIs it has; a Flower site's reads for its messages are
  silent (its data check said them at the start of the run).
- **Paint order**: ascending label value, so where structures overlap the higher value wins (a GTV nested in its
  CTV stays visible when the GTV has the higher value). Two ROIs naming one label (``Tumor`` and ``TUMOR``) are
  painted as their union, with one WARNING per file naming them (a second, discarded attempt would be merged).
- **Contours**: ``CLOSED_PLANAR`` (and ``CLOSEDPLANAR_XOR``) contours are filled. ``POINT``, ``OPEN_PLANAR`` and
  ``OPEN_NONPLANAR`` contours enclose no area, so a labelled ROI holding one is refused rather than read as
  silently smaller (an ROI that names no label may hold any). The contours of one ROI on one slice combine by XOR
  (even-odd rule, the convention of most planning systems): a contour inside another is a hole.
- **Voxel-centre rule**: a voxel belongs to a contour when its centre lies inside the polygon (even-odd crossing
  number in the slice plane); a centre exactly on an edge counts on one side only (positions are taken to 1/1000
  of a voxel, so a point written with a few decimals of mm lies on the centre it was drawn on), so a contour drawn
  along voxel centres covers as many voxels as its area.
- **Planes**: each contour must lie in one slice plane of the image (the grid's third axis, a DICOM series'
  slices): every point within 0.1 slice spacing of the same slice centre; a contour between slices (drawn on
  another scan or on reformatted slices) and one outside the image are refused, naming the ROI and contour.
- On a DICOM series image the structure set must share its FrameOfReferenceUID (without one on either side: name
  the series among its referenced series), as a DICOM-SEG must: another patient's contours can land on the same
  grid.
- On a DICOM series image, the images a labelled ROI's contours name in their ``ContourImageSequence``
  (``ReferencedSOPInstanceUID``, optional) should be slices of that series (headers only, no pixel data). Contours
  naming others are read (they share the frame of reference and lie on this image's slices, so they are placed by
  patient coordinates: drawn on another series of the same frame, e.g. a registered MR, or on this one before an
  anonymiser renamed its images) but noted as above (``Painted.elsewhere``): check they belong to this scan.
- **Stripes**: contours drawn on a thicker reconstruction of the same scan (5 mm over 2.5 mm slices) land on every
  other (n-th) slice, and read so they would train striped labels. An RTSTRUCT holds no slice spacing, so the
  contours' own spacing is known only where they were drawn on the image's series itself (their
  ``ContourImageSequence`` naming its slices, or, naming none, the referenced series being that one alone:
  ``_drawn_on_series``): then it is the image's, and they are read whatever slices they lie on (two single-slice
  structures two slices apart; every other slice contoured). Elsewhere the slices decide
  (``readers.striped_step``): refused (one line) where all lie a multiple of n > 1 slices apart and the contours
  name images outside the series, or 3 or more lie exactly n apart; two such slices are read (two parts of a
  structure), and two single-slice structures drawn on a co-registered series of other slice positions are refused
  (their own spacing unknown): give the structure set that series as its image.

Every problem is one ``FederationError`` line naming the file; a malformed file (missing sequences, bad
``ContourData``) is one line too.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from fedseg.data import dicom_seg, dicom_series, readers, voxel_grid
from fedseg.data.federation import FederationError

RTSTRUCT_SOP_CLASS = "1.2.840.10008.5.1.4.1.1.481.3"  # RT Structure Set Storage
_FILLED = ("CLOSED_PLANAR", "CLOSEDPLANAR_XOR")  # contour types that enclose an area
_PLANE_TOL = 0.1  # slice spacings: a contour's points lie this close to a slice centre
_EDGE_TOL = 0.1  # voxels: how far beyond the image's edge (half a voxel past the last centre) a point may lie
_SNAP = 3  # decimals of a voxel kept in index coordinates: a vertex written to 0.0001 mm stays on its centre

log = logging.getLogger("fedseg.data.rtstruct")


@dataclass(frozen=True)
class Painted:
    """One RT Structure Set read as a label map, with what a notice says of it: its file, the ``label_names`` entries
    ``(value, name)`` that no ROI of it names (read as background: not contoured there?), the names of the ROIs it
    has, and ``elsewhere``: the first labelled ROI whose contours name images outside the case's series (its name,
    how many such images), or ``None``."""

    path: Path
    unnamed: tuple[tuple[int, str], ...]
    rois: tuple[str, ...]
    elsewhere: tuple[str, int] | None = None

    @property
    def notable(self) -> bool:
        return bool(self.unnamed) or self.elsewhere is not None


_painted: ContextVar[list[Painted] | None] = ContextVar("fedseg_rtstruct_painted", default=None)
_warned: set[Painted] = set()  # notices already logged or summarised by this process


@contextmanager
def noting() -> Iterator[list[Painted]]:
    """Within this block every structure set ``read_rtstruct`` reads (in this thread) is appended to the list it
    yields instead of its notices being logged: for a caller that summarises them (data check: one line per site
    and label), or one that reads them again after the data check did (a Flower site's every message); a file noted
    here is not logged again by a later read in this process."""
    painted: list[Painted] = []
    token = _painted.set(painted)
    try:
        yield painted
    finally:
        _painted.reset(token)
        _warned.update(p for p in painted if p.notable)


def unnamed_text(unnamed: tuple[tuple[int, str], ...] | list[tuple[int, str]]) -> str:
    """``'GTV' (2), 'CTV' (1)``: label_names entries as a notice names them."""
    return ", ".join(f"{name!r} ({value})" for value, name in unnamed)


def rois_text(rois: tuple[str, ...] | list[str], shown: int = 10) -> str:
    """ROI names quoted, the first ``shown`` of them (``none`` for no ROI)."""
    return ", ".join([repr(n) for n in rois[:shown]] + (["..."] if len(rois) > shown else [])) or "none"


ELSEWHERE = (
    "drawn on another series of the same frame of reference, or on this one before an anonymiser renamed its "
    "images; they lie on this image's slices and are read by patient coordinates: check they belong to this scan"
)


def _note(painted: Painted) -> None:
    """Note ``painted`` for the summarising caller (``noting``), or log its notices once per process."""
    collected = _painted.get()
    if collected is not None:
        collected.append(painted)
        return
    if not painted.notable or painted in _warned:
        return
    _warned.add(painted)
    if unnamed := painted.unnamed:
        log.warning(
            f"{painted.path}: no ROI of this RTSTRUCT names label_names {unnamed_text(unnamed)}, so this case reads "
            f"{'it' if len(unnamed) == 1 else 'them'} as background (not contoured here?); its ROIs: "
            f"{rois_text(painted.rois)}"
        )
    if painted.elsewhere is not None:
        roi, n = painted.elsewhere
        log.warning(
            f"{painted.path}: the contours of ROI {roi!r} name {n} image{'s' if n > 1 else ''} outside the case's "
            f"series (ContourImageSequence): {ELSEWHERE}"
        )


def _unnamed(
    names: dict[int, str], label_names: dict[int, str], synonyms: dicom_seg.LabelSynonyms | None = None
) -> tuple[tuple[int, str], ...]:
    """The ``label_names`` entries ``(value, name)`` that no ROI of ``names`` names by any of the entry's names."""
    named = {dicom_seg.normalized_name(n) for n in names.values()}
    found = {
        value
        for value, name in dicom_seg.label_name_pairs(label_names, synonyms)
        if dicom_seg.normalized_name(name) in named
    }
    return tuple((value, name) for value, name in sorted(label_names.items()) if value > 0 and value not in found)


def is_rtstruct(path: Path) -> bool:
    """Whether ``path`` is a DICOM RT Structure Set (Modality RTSTRUCT or its SOP class), from its header alone;
    ``False`` for anything else, an unreadable file or without pydicom (the DICOM-SEG reader then says why)."""
    try:
        ds = dicom_series.read_dicom(path, stop_before_pixels=True, specific_tags=["Modality", "SOPClassUID"])
    except Exception:  # noqa: BLE001 — not DICOM, or no pydicom: not an RTSTRUCT
        return False
    return str(getattr(ds, "Modality", "")) == "RTSTRUCT" or dicom_series.sop_class(ds) == RTSTRUCT_SOP_CLASS


def read_rtstruct(
    path: Path,
    grid: voxel_grid.VoxelGrid,
    image: Path,
    label_names: dict[int, str] | None,
    synonyms: dicom_seg.LabelSynonyms | None = None,
) -> np.ndarray:
    """The RT Structure Set ``path`` painted on ``image`` (whose grid is ``grid``) as a label map of ``grid``'s
    spatial shape (uint8, or uint16 for a label value above 255): the ROIs ``label_names`` names (or a value's other
    names, ``synonyms``), in ascending label value (a higher value overwrites a lower one where they overlap), each
    contour filled by the voxel-centre rule and one ROI's contours on a slice combined by XOR (holes); see the module
    docstring. ``FederationError`` with one line naming the file otherwise."""
    try:
        return _read_rtstruct(path, grid, image, label_names, synonyms)
    except FederationError:
        raise
    except (AttributeError, IndexError, KeyError, TypeError, ValueError) as e:  # LinAlgError is a ValueError
        raise _malformed(path, e) from None


def contour_points(path: Path) -> np.ndarray:
    """Every contour point of an RT Structure Set ``(n, 3)`` in LPS mm, for a readability check (no image)."""
    ds = _dataset(path)
    try:
        points = [
            _points(contour, path, str(roi.ReferencedROINumber), c)
            for roi in _sequence(ds, "ROIContourSequence", path)
            for c, contour in enumerate(getattr(roi, "ContourSequence", None) or [], start=1)
        ]
    except FederationError:
        raise
    except (AttributeError, IndexError, KeyError, TypeError, ValueError) as e:
        raise _malformed(path, e) from None
    return np.concatenate(points) if points else np.zeros((0, 3))


def _malformed(path: Path, e: Exception) -> FederationError:
    return FederationError(
        f"{path}: malformed RTSTRUCT ({type(e).__name__}: {' '.join(str(e).split())[:200]}): a truncated or damaged "
        "file (an interrupted copy?)"
    )


def _dataset(path: Path) -> Any:
    """The RT Structure Set ``path`` read by pydicom (``dicom_series.read_dicom``); ``FederationError`` in the image
    reader's words (``dicom_series.dicom_read_failure``) for an empty file, a damaged header or a file that is no
    DICOM, and for a file cut short (``dicom_series.ended_early``: pydicom reads it without a word, up to where it
    ends) inside an element (its ROIs, most of the file) or before its SOP class. One that ends whole without its ROI
    sequences is said malformed by the reader: an RTSTRUCT's last elements vary, so where a cut between two elements
    lies is not known."""
    try:
        ds = dicom_series.read_dicom(path)
    except FederationError:
        raise
    except Exception as e:  # noqa: BLE001 — pydicom raises several types for a non-DICOM file
        raise FederationError(dicom_series.dicom_read_failure(path, e, "expected an RTSTRUCT")) from None
    if (early := dicom_series.ended_early(path, ds, ("SOPClassUID",))) is not None:
        raise FederationError(f"{path}: {early}: {dicom_series.DAMAGED}")
    return ds


def _sequence(ds: Any, name: str, path: Path) -> Any:
    if name not in ds:
        raise FederationError(f"{path}: malformed RTSTRUCT: no {name}")
    return getattr(ds, name)


def _points(contour: Any, path: Path, roi: str, number: int) -> np.ndarray:
    """A contour's ``ContourData`` as ``(n, 3)`` LPS mm; one line naming the ROI and contour if malformed."""
    data = np.asarray(getattr(contour, "ContourData", None) or [], dtype=np.float64)
    if data.size == 0 or data.size % 3 or not np.isfinite(data).all():
        raise FederationError(
            f"{path}: ROI {roi} contour {number}: malformed ContourData ({data.size} numbers; expected x, y, z "
            "triplets in mm)"
        )
    return data.reshape(-1, 3)


def _roi_values(
    names: dict[int, str],
    label_names: dict[int, str] | None,
    path: Path,
    synonyms: dicom_seg.LabelSynonyms | None = None,
) -> dict[int, int]:  # ROI number -> label value, for the ROIs label_names (or a value's synonyms) names
    listed = ", ".join(repr(n) for n in names.values()) or "none"
    if not label_names:
        raise FederationError(
            f"{path}: an RTSTRUCT's ROIs get their label values by name, but federation.yaml has no label_names; "
            f"its ROIs: {listed}"
        )
    by_name: dict[str, list[int]] = {}
    for value, name in sorted(dicom_seg.label_name_pairs(label_names, synonyms)):
        if value > 0:  # background is what no ROI paints
            found = by_name.setdefault(dicom_seg.normalized_name(name), [])
            found += [] if value in found else [value]  # a value's own names alike: one value
    values = {}
    for number, name in names.items():
        matches = by_name.get(dicom_seg.normalized_name(name), [])
        if len(matches) > 1:
            raise FederationError(
                f"{path}: ROI {name!r} names label_names entries of several values ({', '.join(map(str, matches))})"
            )
        if matches:
            values[number] = matches[0]
    if not values:
        expected = ", ".join(
            f"{v}: {n}" + "".join(f" or {other}" for other in (synonyms or {}).get(v, ()))
            for v, n in sorted(label_names.items())
            if v > 0
        )
        raise FederationError(
            f"{path}: no ROI of this RTSTRUCT names a label of label_names (federation.yaml); its ROIs: {listed}; "
            f"label_names: {expected}"
        )
    _warn_shared(names, values, label_names, path)
    return values


_warned_shared: set[Path] = set()  # structure sets whose ROIs sharing a label were said in this process


def _warn_shared(names: dict[int, str], values: dict[int, int], label_names: dict[int, str], path: Path) -> None:
    """Log once per structure set ``path`` where two or more of its ROIs name one label (``Tumor`` and ``TUMOR``,
    a re-contoured structure kept beside the first): they are painted as their union, which is right for one
    structure drawn in parts but wrong for a second, discarded attempt."""
    by_value: dict[int, list[int]] = {}
    for number in sorted(values):
        by_value.setdefault(values[number], []).append(number)
    shared = {value: numbers for value, numbers in by_value.items() if len(numbers) > 1}
    if not shared or path in _warned_shared:
        return
    _warned_shared.add(path)
    said = "; ".join(
        f"ROIs {' and '.join(repr(names[n]) for n in numbers)} {'both' if len(numbers) == 2 else 'all'} name "
        f"label_names {label_names[value]!r} ({value})"
        for value, numbers in sorted(shared.items())
    )
    log.warning(
        f"{path}: {said}, so they are painted as one label (their union); if one is not that structure (a discarded "
        "or second attempt), rename or delete it in the structure set"
    )


def _other_frame(ds: Any, rois: list[Any], path: Path, image: Path) -> str | None:
    """Why the structure set ``ds`` was drawn on another scan than ``image`` (a DICOM series; ``None`` for other
    images): its labelled ROIs' frame of reference (else the ReferencedFrameOfReferenceSequence's) is not the
    series'; where either has none, a referenced series list that does not name it."""
    if readers.volume_format(image) != readers.DICOM:
        return None
    series = dicom_series.read_dicom(dicom_series.series_entries(image)[0], stop_before_pixels=True)
    image_frame = str(getattr(series, "FrameOfReferenceUID", ""))
    referenced = list(getattr(ds, "ReferencedFrameOfReferenceSequence", None) or [])
    frames = {str(getattr(roi, "ReferencedFrameOfReferenceUID", "")) for roi in rois} - {""}
    frames = frames or {str(getattr(item, "FrameOfReferenceUID", "")) for item in referenced} - {""}
    if frames and image_frame:
        if frames == {image_frame}:
            return None
        return (
            f"{path}: drawn on another scan: its FrameOfReferenceUID {', '.join(sorted(frames))} is not that of its "
            f"image {image} ({image_frame}); contours of another patient or study?"
        )
    own = str(getattr(series, "SeriesInstanceUID", ""))
    uids = [
        str(getattr(s, "SeriesInstanceUID", ""))
        for item in referenced
        for study in getattr(item, "RTReferencedStudySequence", None) or []
        for s in getattr(study, "RTReferencedSeriesSequence", None) or []
    ]
    if own and any(uids) and own not in uids:
        return (
            f"{path}: drawn on another scan: it references series {', '.join(u for u in uids if u)}, but its image "
            f"{image} is series {own}; contours of another series?"
        )
    return None


def _series_instances(image: Path) -> set[str] | None:
    """The SOPInstanceUIDs of the DICOM series ``image`` (headers only), or ``None`` for an image of another
    format (a NIfTI names no instances)."""
    if readers.volume_format(image) != readers.DICOM:
        return None
    uids = set()
    for entry in dicom_series.series_entries(image):
        try:
            ds = dicom_series.read_dicom(entry, stop_before_pixels=True, specific_tags=["SOPInstanceUID"])
        except FederationError:
            raise
        except Exception as e:  # noqa: BLE001 — pydicom raises several types for a non-DICOM file
            raise FederationError(dicom_series.dicom_read_failure(entry, e, "expected one DICOM series")) from None
        uids.add(str(getattr(ds, "SOPInstanceUID", "")))
    return uids - {""}


def _elsewhere(labelled: list[tuple[int, Any]], names: dict[int, str], image: Path) -> tuple[str, int] | None:
    """The first of the ``labelled`` ROIs ``(ROI number, ROIContourSequence item)`` whose contours'
    ``ContourImageSequence`` items name images (SOP instance UIDs) that are no slices of the DICOM series ``image``:
    ``(its name, how many such images)``; ``None`` where all are its own (a contour without one names none), or for
    an image of another format. The series' headers are read only when some contour names an image."""
    referenced: dict[int, set[str]] = {}
    for number, item in labelled:
        uids = referenced.setdefault(number, set())
        for contour in getattr(item, "ContourSequence", None) or []:
            for ref in getattr(contour, "ContourImageSequence", None) or []:
                uids.add(str(getattr(ref, "ReferencedSOPInstanceUID", "")))
        uids.discard("")
    if not any(referenced.values()) or (instances := _series_instances(image)) is None:
        return None
    for number, uids in referenced.items():
        if unknown := uids - instances:
            return names[number], len(unknown)
    return None


def _drawn_on_series(ds: Any, labelled: list[tuple[int, Any]], image: Path) -> bool:
    """Whether the structure set ``ds`` was drawn on the DICOM series ``image`` itself, so that its contours' own
    slice spacing is the image's: its ``labelled`` ROIs' contours name images (``ContourImageSequence``) and every
    one is a slice of that series, or, where no contour names one, its ReferencedFrameOfReferenceSequence names that
    series alone (RTReferencedSeriesSequence). ``False`` otherwise, and for an image of another format (a NIfTI has
    no UIDs): the contours' own spacing is then unknown (an RTSTRUCT holds no slice spacing)."""
    if readers.volume_format(image) != readers.DICOM:
        return False
    named = {
        str(getattr(ref, "ReferencedSOPInstanceUID", ""))
        for _, item in labelled
        for contour in getattr(item, "ContourSequence", None) or []
        for ref in getattr(contour, "ContourImageSequence", None) or []
    } - {""}
    if named:
        instances = _series_instances(image)
        return instances is not None and named <= instances
    series = {
        str(getattr(s, "SeriesInstanceUID", ""))
        for item in getattr(ds, "ReferencedFrameOfReferenceSequence", None) or []
        for study in getattr(item, "RTReferencedStudySequence", None) or []
        for s in getattr(study, "RTReferencedSeriesSequence", None) or []
    } - {""}
    if not series:
        return False
    own = dicom_series.read_dicom(dicom_series.series_entries(image)[0], stop_before_pixels=True)
    return series == {str(getattr(own, "SeriesInstanceUID", ""))}


def _fill(polygons: list[np.ndarray], size: tuple[int, int]) -> tuple[tuple[slice, slice], np.ndarray] | None:
    """The voxels of one slice (``size`` = its two axes) whose centres lie inside ``polygons`` (``(n, 2)`` index
    coordinates each) by the even-odd rule over all of them together: ``(index, mask)`` of their bounding box, or
    ``None`` if it holds no voxel centre. For each voxel row (a centre line ``j``), the crossings of every edge with
    that line (an edge counts for ``min(y) <= j < max(y)``, so a vertex on the line is crossed once) toggle every
    centre right of them: a centre with an odd number of crossings to its left is inside."""
    points = np.concatenate(polygons)
    i0, j0 = (max(0, math.ceil(v)) for v in points.min(axis=0))
    i1, j1 = (min(n - 1, math.floor(v)) for v, n in zip(points.max(axis=0), size))
    if i1 < i0 or j1 < j0:
        return None
    rows = np.arange(j0, j1 + 1, dtype=np.float64)
    toggles = np.zeros((rows.size, i1 - i0 + 2), dtype=np.int64)  # per row: voxels i0..i1, one column beyond
    for polygon in polygons:
        (xa, ya), (xb, yb) = polygon.T, np.roll(polygon, -1, axis=0).T
        r, e = np.nonzero((ya[None, :] > rows[:, None]) != (yb[None, :] > rows[:, None]))
        x = np.round(xa[e] + (rows[r] - ya[e]) * (xb[e] - xa[e]) / (yb[e] - ya[e]), _SNAP)
        np.add.at(toggles, (r, np.clip(np.floor(x).astype(np.int64) + 1 - i0, 0, toggles.shape[1] - 1)), 1)
    inside = np.cumsum(toggles, axis=1)[:, :-1] % 2 == 1  # (rows j, columns i)
    return (slice(i0, i1 + 1), slice(j0, j1 + 1)), inside.T


def _read_rtstruct(
    path: Path,
    grid: voxel_grid.VoxelGrid,
    image: Path,
    label_names: dict[int, str] | None,
    synonyms: dicom_seg.LabelSynonyms | None = None,
) -> np.ndarray:
    if len(grid.shape) < 3:
        raise FederationError(
            f"{path}: an RTSTRUCT label is painted on a 3D image volume, but {image} is a 2D image {grid.shape}"
        )
    ds = _dataset(path)
    rois = {int(item.ROINumber): item for item in _sequence(ds, "StructureSetROISequence", path)}
    names = {number: str(getattr(item, "ROIName", "")) for number, item in rois.items()}
    values = _roi_values(names, label_names, path, synonyms)
    if (other := _other_frame(ds, [rois[n] for n in values], path, image)) is not None:
        raise FederationError(other)
    nx, ny, nz = (int(n) for n in grid.shape[:3])
    shape = (nx, ny, nz)
    to_index = np.linalg.inv(voxel_grid.LPS_TO_RAS @ grid.affine)  # LPS mm -> voxel index (VoxelGrid.affine is RAS)
    masks = {number: np.zeros(shape, dtype=bool) for number in values}
    labelled = [  # an ROI naming no label (BODY, couch): not read
        (int(item.ReferencedROINumber), item)
        for item in _sequence(ds, "ROIContourSequence", path)
        if int(item.ReferencedROINumber) in values
    ]
    on_slices: set[int] = set()  # the slices the labelled ROIs' contours lie on
    for number, item in labelled:
        roi = repr(names[number])
        slices: dict[int, list[np.ndarray]] = {}
        for c, contour in enumerate(getattr(item, "ContourSequence", None) or [], start=1):
            kind = str(getattr(contour, "ContourGeometricType", ""))
            if kind not in _FILLED:
                raise FederationError(
                    f"{path}: ROI {roi} contour {c} is {kind or 'of no ContourGeometricType'}: only closed planar "
                    "contours enclose an area to paint (rename the ROI if it is no label)"
                )
            index = np.round(_points(contour, path, roi, c) @ to_index[:3, :3].T + to_index[:3, 3], _SNAP)
            k = int(np.round(np.median(index[:, 2])))
            off = float(np.abs(index[:, 2] - k).max())
            if off > _PLANE_TOL:
                raise FederationError(
                    f"{path}: ROI {roi} contour {c} does not lie in a slice plane of {image}: its points lie up to "
                    f"{off:.2f} slice spacings from slice {k}'s centre (at most {_PLANE_TOL:g}); drawn on another grid "
                    "or on reformatted slices?"
                )
            low, high = index[:, :2].min(axis=0), index[:, :2].max(axis=0)
            if not 0 <= k < nz or (low < -0.5 - _EDGE_TOL).any() or (high > np.array([nx, ny]) - 0.5 + _EDGE_TOL).any():
                raise FederationError(
                    f"{path}: ROI {roi} contour {c} lies outside the grid of {image} (slice {k}, voxels "
                    f"{voxel_grid.numbers_text(low)} to {voxel_grid.numbers_text(high)} in a {shape} image)"
                )
            slices.setdefault(k, []).append(index[:, :2])
        on_slices.update(slices)
        for k, polygons in slices.items():
            filled = _fill(polygons, (nx, ny))
            if filled is not None:
                (si, sj), inside = filled
                masks[number][si, sj, k] |= inside
    elsewhere = _elsewhere(labelled, names, image)
    # stripes: the slice spacing the contours were drawn at is known only where they were drawn on this very series
    # (then it is the image's: read whatever slices they lie on); otherwise the slices decide (striped_step)
    step = readers.striped_step(on_slices, elsewhere is not None)
    if step is not None and (elsewhere is not None or not _drawn_on_series(ds, labelled, image)):
        raise FederationError(readers.striped_problem(path, image, on_slices, step, grid.spacing(3)[2], "RTSTRUCT"))
    top = max(values.values())
    label = np.zeros(shape, dtype=np.uint8 if top < 256 else np.uint16)
    for number in sorted(values, key=lambda n: (values[n], n)):  # ascending value: the higher one wins overlaps
        label[masks[number]] = values[number]
    assert label_names is not None  # _roi_values refused a structure set without them
    _note(Painted(path, _unnamed(names, label_names, synonyms), tuple(names.values()), elsewhere))
    return label
