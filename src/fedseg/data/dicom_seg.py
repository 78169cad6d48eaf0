"""DICOM-SEG label maps (``labels/<case>.dcm``) read on their image's voxel grid (:mod:`fedseg.data.readers`' grid and
orientation rule): ``read_dicom_seg`` places each frame on the image's slices by its position, maps segments to label
values by name (``label_names``, ``segment_values``) or paints the federation's regions from segments that each name
one (nested regions overlap), and says in one line what no grid can hold (a SEG of another series, frames off the
grid, an overlap a label map cannot hold); ``read_seg_frames`` reads the frames as stored, for a readability check.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import numpy as np

from fedseg.data.dicom_series import (
    DAMAGED,
    SEG_SOP_CLASSES,
    dicom_read_failure,
    ended_early,
    read_dicom,
    series_entries,
    sop_class,
)
from fedseg.data.federation import FederationError
from fedseg.data.readers import DICOM, coarser_problem, striped_problem, striped_step, volume_format
from fedseg.data.voxel_grid import LPS_TO_RAS, VoxelGrid

if TYPE_CHECKING:
    from fedseg.data.federation import Regions

log = logging.getLogger("fedseg.data.dicom_seg")

_GRID_TOL = 0.01  # a SEG pixel lands on an image voxel centre within 1 % of a voxel


def normalized_name(name: str) -> str:
    """A structure's name as names are compared: case-insensitive, ``_`` and ``-`` as spaces, spaces collapsed."""
    return " ".join(name.replace("_", " ").replace("-", " ").split()).casefold()


LabelSynonyms = dict[int, tuple[str, ...]]  # label value -> its names after its first (``label_names``'s)


def label_name_pairs(
    label_names: dict[int, str] | None, synonyms: LabelSynonyms | None = None
) -> list[tuple[int, str]]:
    """``(value, name)`` for every name a structure may be given for a label: each value of ``label_names`` (in its
    order) with its name, then the other names ``synonyms`` lists for it (``federation.yaml`` ``label_names: {1:
    [tumor, GTV Tumour]}``: hospital A's "Tumor" and hospital B's "GTV_Tumour" are both label 1)."""
    return [
        (value, name)
        for value, first in (label_names or {}).items()
        for name in (first, *(synonyms or {}).get(value, ()))
    ]


def names_text(value: int, name: str, synonyms: LabelSynonyms | None = None) -> str:
    """A label's name as a message gives it: ``'tumor'``, or with its other names ``'tumor' (or 'GTV Tumour')``."""
    others = (synonyms or {}).get(value, ())
    return repr(name) + (f" (or {', '.join(map(repr, others))})" if others else "")


def segment_values(
    segments: dict[int, str], label_names: dict[int, str] | None, path: Path, synonyms: LabelSynonyms | None = None
) -> dict[int, int]:
    """Segment number -> label value (0: not read). Segments are matched by name, as RTSTRUCT ROIs are: a segment
    whose label names one of ``label_names`` (the federation's; compared case-insensitively, ``_`` and ``-`` as
    spaces), or one of the other names ``synonyms`` gives a value, gets that name's value. Where some segments are
    named so, the others are not read (value 0: another structure, a "Liver" beside the "Tumor", must not become the
    label its number happens to have), noted once per file (``_note_segments``, which also names two segments read
    as one label). Only where no segment names a label (or without ``label_names``) are segments read by number
    (``_warn_read_by_number`` says so where their names say what they hold)."""
    mapped = _named_values(segments, label_names, synonyms)
    if any(v >= 0 for v in mapped.values()):
        supplied = {v for v in mapped.values() if v >= 0}
        for n in sorted(segments):
            if mapped[n] < 0 and label_names and n in label_names and n not in supplied:
                # read by number before segments were matched by name: not read now, the label would go missing
                raise FederationError(
                    f"{path}: segment {n} {segments[n]!r} names no label of label_names, and no other segment names "
                    f"label {n} ({label_names[n]!r}): if it is that structure under another name, list the name as "
                    f"one of label {n}'s (label_names: {{{n}: [{label_names[n]}, {segments[n]}]}}), else rename the "
                    "segment"
                )
        _note_segments(segments, mapped, path)
        return {n: max(v, 0) for n, v in mapped.items()}
    _warn_read_by_number(segments, mapped, label_names, path)
    return {n: n for n in segments}


_noted_segments: set[Path] = set()  # SEGs _note_segments has spoken of in this process


def _note_segments(segments: dict[int, str], mapped: dict[int, int], path: Path) -> None:
    """Log once per SEG ``path`` (logger ``fedseg.data.dicom_seg``) the segments read by name that name no label
    (not read) and segments that name one label together (read as one, their union)."""
    if path in _noted_segments:
        return
    skipped = [f"{n} {segments[n]!r}" for n in sorted(segments) if mapped[n] < 0]
    by_value: dict[int, list[int]] = {}
    for n in sorted(segments):
        if mapped[n] >= 0:
            by_value.setdefault(mapped[n], []).append(n)
    shared = {v: ns for v, ns in by_value.items() if len(ns) > 1}
    if not skipped and not shared:
        return
    _noted_segments.add(path)
    said = []
    if skipped:
        read = ", ".join(f"{n} {segments[n]!r} -> {mapped[n]}" for n in sorted(segments) if mapped[n] >= 0)
        said.append(
            f"segment{'s' if len(skipped) > 1 else ''} {', '.join(skipped)} name{'' if len(skipped) > 1 else 's'} "
            f"no label of label_names (federation.yaml), so {'they are' if len(skipped) > 1 else 'it is'} not read "
            f"(background), while the segments named so are read by name ({read}); add "
            f"{'their names' if len(skipped) > 1 else 'its name'} to label_names to train "
            f"{'them' if len(skipped) > 1 else 'it'}"
        )
    for value, numbers in sorted(shared.items()):
        both = " and ".join(f"{n} {segments[n]!r}" for n in numbers)
        said.append(f"segments {both} name one label ({value}) and are read as one (their union)")
    log.warning(f"{path}: {'; '.join(said)}")


_GENERIC_SEGMENT = re.compile(r"(segment|seg|label|roi|mask)?[\s_-]*\d*", re.IGNORECASE)  # "Segment 1", "seg_2", "3"
_warned_by_number: set[tuple[Path, tuple[tuple[int, str], ...]]] = set()  # (labels folder, segments) said already


def _warn_read_by_number(
    segments: dict[int, str], mapped: dict[int, int], label_names: dict[int, str] | None, path: Path
) -> None:
    """Log once per labels folder and segment naming when a SEG is read by segment number although ``label_names``
    is given and none of its segments' labels names a label while some say what they hold (not ``Segment 1``,
    empty or a number): segment 1 "Tumor" becomes label 1 whatever ``label_names`` calls 1 (e.g. "organ"), so a
    SEG made by another tool can swap structures without a word. The line says what each segment becomes."""
    if not label_names or any(v >= 0 for v in mapped.values()):
        return
    said = {n: label for n, label in segments.items() if not _GENERIC_SEGMENT.fullmatch(label.strip())}
    key = (path.parent, tuple(sorted(segments.items())))
    if not said or key in _warned_by_number:
        return
    _warned_by_number.add(key)
    becomes = ", ".join(
        f"{n} {segments[n]!r} -> {label_names[n]!r}" if n in label_names else f"{n} {segments[n]!r} -> value {n}"
        for n in sorted(segments)
    )
    log.warning(
        f"{path}: no segment label of this DICOM-SEG names a label of label_names, so its segments are read by "
        f"number: {becomes}; if that is not what they hold, name the labels in label_names (federation.yaml) as the "
        f"segments are named (said once for the SEGs of {path.parent} named so)"
    )


def _functional(ds: Any, frame: Any, sequence: str, attribute: str, path: Path) -> Any:
    """A frame's ``sequence[0].attribute``, per-frame first, then shared; ``FederationError`` if absent."""
    for groups in (frame, getattr(ds, "SharedFunctionalGroupsSequence", [None])[0]):
        if groups is not None and sequence in groups and attribute in getattr(groups, sequence)[0]:
            return getattr(getattr(groups, sequence)[0], attribute)
    raise FederationError(f"{path}: DICOM-SEG frame without {sequence} > {attribute}")


def _named_values(
    segments: dict[int, str], label_names: dict[int, str] | None, synonyms: LabelSynonyms | None = None
) -> dict[int, int]:
    """Segment number -> the label value ``label_names`` (or a value's other names, ``synonyms``) gives its label,
    -1 where it names none (or a name two values share)."""
    by_name: dict[str, int] = {}
    for value, name in label_name_pairs(label_names, synonyms):
        key = normalized_name(name)
        by_name[key] = -1 if by_name.get(key, value) != value else value  # -1: ambiguous name
    return {n: by_name.get(normalized_name(label), -1) for n, label in segments.items()}


def segment_regions(segments: dict[int, str], regions: Regions | None) -> dict[int, int] | None:
    """Segment number -> region index where every segment's label names one of the federation's ``regions``
    (compared as label names: case-insensitive, ``_`` and ``-`` as spaces), as ``fedseg predict --dicom-seg`` labels
    its segments; None otherwise (no regions, or a segment naming none)."""
    if regions is None or not segments:
        return None
    index = {normalized_name(name): i for i, name in enumerate(regions.names)}
    found = {number: index.get(normalized_name(label), -1) for number, label in segments.items()}
    return found if all(i >= 0 for i in found.values()) else None


def read_dicom_seg(
    path: Path,
    grid: VoxelGrid,
    image: Path,
    label_names: dict[int, str] | None = None,
    regions: Regions | None = None,
    synonyms: LabelSynonyms | None = None,
) -> np.ndarray:
    """A DICOM-SEG drawn on ``image`` (whose grid is ``grid``) as a label map of ``grid.shape[:3]``
    (array order, uint8 or uint16), each segment's pixels set to its label value (``segment_values``; ``synonyms``:
    the other names a label value is given, matched as its ``label_names`` name is).

    Segments that each name one of the federation's ``regions`` (``segment_regions``: ``fedseg predict
    --dicom-seg``'s, or BraTS WT/TC/ET drawn as nested structures) are read as region masks and painted to a label
    map as predictions are (``Regions.to_label``: each voxel the value of the smallest region it lies in), where
    their names are not every one a ``label_names`` entry or where they overlap; disjoint segments named as labels
    read the same either way. Every frame of the SEG must lie on the image's voxel grid (same plane orientation and
    pixel spacing, positions on voxel centres, inside the image): frames omitted by the SEG (empty ones) are
    background. A DICOM series image must be the one the SEG was drawn on: the same FrameOfReferenceUID, or without
    one, a series its ReferencedSeriesSequence names (a SEG of another patient can lie on the same grid).
    BINARY and LABELMAP SEGs are read; FRACTIONAL ones are refused (a label map must be exact), as are
    overlapping segments that do not name regions, and a SEG drawn at a coarser slice spacing (mm) than the image's
    (a 5 mm reconstruction's on 2.5 mm slices: its frames paint every other slice, striped labels; ``_striped``:
    its own spacing from its SpacingBetweenSlices or the series it names, else its frames' slices).
    ``FederationError`` with one line naming the file otherwise.
    """
    try:
        return _read_dicom_seg(path, grid, image, label_names, regions, synonyms)
    except FederationError:  # a ValueError too
        raise
    except (AttributeError, IndexError, KeyError, TypeError, ValueError) as e:
        raise FederationError(f"{path}: malformed DICOM-SEG ({type(e).__name__}: {e})") from None


class _Overlap(Exception):
    """Two segments paint different label values on one voxel (``_painted_labels``)."""


def _read_dicom_seg(
    path: Path,
    grid: VoxelGrid,
    image: Path,
    label_names: dict[int, str] | None,
    regions: Regions | None,
    synonyms: LabelSynonyms | None = None,
) -> np.ndarray:
    ds = _seg_dataset(path)
    if sop_class(ds) not in SEG_SOP_CLASSES:
        raise FederationError(
            f"{path}: not a DICOM-SEG (Modality {getattr(ds, 'Modality', '?')}); a .dcm label must be a DICOM "
            "Segmentation or an RT Structure Set (RTSTRUCT)"
        )
    kind = str(getattr(ds, "SegmentationType", ""))
    if kind not in ("BINARY", "LABELMAP"):
        raise FederationError(f"{path}: {kind or 'unknown'} DICOM-SEG not supported (store BINARY segments)")
    segments = {int(s.SegmentNumber): str(getattr(s, "SegmentLabel", "")) for s in ds.SegmentSequence}
    try:
        frames = np.asarray(ds.pixel_array)
    except Exception as e:  # noqa: BLE001 — any decoder failure means "corrupt file" to the user
        raise FederationError(
            f"{path}: cannot decode its pixel data ({type(e).__name__}: {' '.join(str(e).split())[:200]}): {DAMAGED}"
        ) from None
    frames = frames[None] if frames.ndim == 2 else frames
    if (other := _other_series(ds, path, image)) is not None:  # before the frames' placement: another patient's
        raise FederationError(other)  # SEG on a slightly different grid is that, not frames off the grid

    covered: set[tuple[int, int]] = set()  # (axis, index) of the image slices the frames lie on

    def placed() -> Iterator[tuple[int, tuple[np.ndarray, ...], np.ndarray]]:
        return _placed_frames(ds, frames, kind, grid, path, image, covered)

    region_of = segment_regions(segments, regions)
    named = _named_values(segments, label_names, synonyms)
    try:
        if region_of is not None and regions is not None and not all(v >= 0 for v in named.values()):
            label = regions.to_label(_region_masks(placed(), region_of, len(regions), grid))
        else:
            label = _painted_labels(placed(), segment_values(segments, label_names, path, synonyms), grid)
    except _Overlap as clash:
        if region_of is None or regions is None:
            names = f" ({', '.join(regions.names)})" if regions is not None else ""
            raise FederationError(
                f"{path}: segments overlap in {clash}; a label map holds one value per voxel (nested segments are "
                f"read where each segment's label names one of the federation's regions{names})"
            ) from None
        label = regions.to_label(_region_masks(placed(), region_of, len(regions), grid))
    if len(axes := {axis for axis, _ in covered}) == 1 and _spatial(grid)[axis := axes.pop()] > 1:
        if (problem := _striped(ds, path, image, [k for _, k in covered], grid.spacing(3)[axis])) is not None:
            raise FederationError(problem)
    return label.reshape(grid.shape[:3])


def _striped(ds: Any, path: Path, image: Path, slices: list[int], spacing_mm: float) -> str | None:
    """Why the SEG ``ds`` (file ``path``), whose frames lie on the slices ``slices`` of ``image`` (``spacing_mm``
    apart), would train striped labels, or ``None``. Its own slice spacing decides where it is known: the image's
    where the SEG was drawn on this very series (``_drawn_on``), else its PixelMeasuresSequence's
    SpacingBetweenSlices (``own_spacing``): refused only where that is coarser than the image's
    (``readers.coarser_problem``), so two single-slice structures drawn on a co-registered series of other slice
    positions are read whatever slices they land on. Where it is not known (no SpacingBetweenSlices, and a
    SEG naming no series, another one, or an image of another format), the slices decide
    (``readers.striped_step``: one in n of them, the SEG naming another series, or 3 or more one in n apart)."""
    drawn_on = _drawn_on(ds, image)
    if drawn_on:
        return None
    if (own := own_spacing(ds)) is not None:
        return coarser_problem(path, image, slices, own, spacing_mm, "DICOM-SEG", "its SpacingBetweenSlices")
    if (step := striped_step(slices, drawn_on is False)) is not None:
        return striped_problem(path, image, slices, step, spacing_mm, "DICOM-SEG")
    return None


def own_spacing(seg: Any) -> float | None:
    """The slice spacing (mm) the SEG ``seg`` was drawn at: the SpacingBetweenSlices of its shared
    PixelMeasuresSequence, else of its first frame's (highdicom and dcmqi write it from the source series, before
    empty frames are left out); ``None`` where neither has one (or it is not a positive number). SliceThickness is
    not taken for it: a slice's thickness is not the distance between slices (overlapping or gapped
    reconstructions)."""
    groups = [getattr(seg, "SharedFunctionalGroupsSequence", [None])[0]]
    groups += list(getattr(seg, "PerFrameFunctionalGroupsSequence", None) or [])[:1]
    for group in groups:
        measures = getattr(group, "PixelMeasuresSequence", None) if group is not None else None
        value = getattr(measures[0], "SpacingBetweenSlices", None) if measures else None
        try:
            spacing = abs(float(value)) if value not in (None, "") else 0.0
        except (TypeError, ValueError):
            spacing = 0.0
        if spacing > 0 and np.isfinite(spacing):
            return spacing
    return None


def _drawn_on(seg: Any, image: Path) -> bool | None:
    """Whether the SEG ``seg`` was drawn on the DICOM series ``image``: ``True`` where its ReferencedSeriesSequence
    names that series alone, ``False`` where it names series of which ``image`` is none (drawn on another series of
    the same frame of reference), ``None`` where it cannot say: no series named, several of which one is
    ``image``, or an image of another format (a NIfTI has no UIDs)."""
    if volume_format(image) != DICOM:
        return None
    referenced = {str(getattr(item, "SeriesInstanceUID", "")) for item in getattr(seg, "ReferencedSeriesSequence", [])}
    if not (referenced := referenced - {""}):
        return None
    own = str(getattr(read_dicom(series_entries(image)[0], stop_before_pixels=True), "SeriesInstanceUID", ""))
    if not own:
        return None
    if own not in referenced:
        return False
    return True if referenced == {own} else None


def _spatial(grid: VoxelGrid) -> tuple[int, int, int]:
    """``grid``'s three spatial dimensions (a 2D image's grid gets a third axis of 1)."""
    return cast("tuple[int, int, int]", (grid.shape[:3] + (1, 1))[:3])


def _placed_frames(
    ds: Any,
    frames: np.ndarray,
    kind: str,
    grid: VoxelGrid,
    path: Path,
    image: Path,
    covered: set[tuple[int, int]] | None = None,
) -> Iterator[tuple[int, tuple[np.ndarray, ...], np.ndarray]]:
    """Per stored frame of the SEG ``ds`` (its pixels ``frames`` ``(F, rows, columns)``): its number (0-based), the
    voxel indices ``(3 arrays of N)`` of its nonzero pixels on ``image``'s ``grid`` and their segment numbers
    ``(N,)`` (a BINARY frame's one segment; a LABELMAP frame's pixel values). ``FederationError`` for a frame off
    the grid. ``covered`` receives each frame's image slice ``(axis, index)``."""
    spatial = _spatial(grid)
    to_index = np.linalg.inv(LPS_TO_RAS @ grid.affine)  # LPS mm -> voxel index
    per_frame = getattr(ds, "PerFrameFunctionalGroupsSequence", None)
    if per_frame is None or len(per_frame) != len(frames):
        raise FederationError(f"{path}: DICOM-SEG without one PerFrameFunctionalGroupsSequence item per frame")
    rows, cols = frames.shape[1:]
    for f, (pixels, frame) in enumerate(zip(frames, per_frame)):
        position = np.asarray(_functional(ds, frame, "PlanePositionSequence", "ImagePositionPatient", path), float)
        orientation = np.asarray(_functional(ds, frame, "PlaneOrientationSequence", "ImageOrientationPatient", path))
        spacing = np.asarray(_functional(ds, frame, "PixelMeasuresSequence", "PixelSpacing", path), float)
        origin = to_index[:3] @ np.append(position, 1.0)
        step_col = to_index[:3, :3] @ (np.asarray(orientation[:3], float) * spacing[1])  # one column to the right
        step_row = to_index[:3, :3] @ (np.asarray(orientation[3:], float) * spacing[0])  # one row down
        where = f"{path}: DICOM-SEG frame {f + 1} does not lie on the grid of {image}"
        for step in (step_col, step_row):
            if not (np.allclose(step, np.round(step), atol=_GRID_TOL) and np.abs(np.round(step)).sum() == 1):
                raise FederationError(f"{where} (its orientation or pixel spacing differs from the image's)")
        if not np.allclose(origin, np.round(origin), atol=_GRID_TOL):
            raise FederationError(f"{where} (its position is {np.abs(origin - np.round(origin)).max():.2f} voxels off)")
        o, sc, sr = (np.round(v).astype(int) for v in (origin, step_col, step_row))
        if covered is not None:
            axis = int(np.argmin(np.abs(sc) + np.abs(sr)))  # the axis the frame's plane does not span
            covered.add((axis, int(o[axis])))
        corners = [o + sc * c + sr * r for c in (0, cols - 1) for r in (0, rows - 1)]
        if any((c < 0).any() or (c >= np.array(spatial)).any() for c in corners):
            raise FederationError(f"{where} (it reaches voxel {corners[-1].tolist()}, outside shape {spatial})")
        r_idx, c_idx = np.nonzero(pixels)
        if kind == "BINARY":
            number = int(_functional(ds, frame, "SegmentIdentificationSequence", "ReferencedSegmentNumber", path))
            numbers = np.full(r_idx.shape, number, dtype=np.int64)
        else:
            numbers = pixels[r_idx, c_idx].astype(np.int64)
        yield f, tuple(o[:, None] + sc[:, None] * c_idx + sr[:, None] * r_idx), numbers


def _painted_labels(
    placed: Iterator[tuple[int, tuple[np.ndarray, ...], np.ndarray]], values: dict[int, int], grid: VoxelGrid
) -> np.ndarray:
    """The placed frames' segments painted with their label values ``values`` (segment number -> value; an unknown
    number paints itself); ``_Overlap`` where two segments paint different values on one voxel."""
    top = max([0, *values.values()])
    label = np.zeros(_spatial(grid), dtype=np.uint8 if top < 256 else np.uint16)
    for f, idx, numbers in placed:
        written = np.array([values.get(int(n), int(n)) for n in numbers], dtype=np.int64)
        if not written.all():  # segments not read (value 0: named no label where others did)
            kept = written != 0
            idx, written = tuple(i[kept] for i in idx), written[kept]
        clash = (label[idx] != 0) & (label[idx] != written)
        if clash.any():
            raise _Overlap(
                f"{int(clash.sum())} voxels of frame {f + 1} (label values {int(label[idx][clash][0])} and "
                f"{int(written[clash][0])})"
            )
        label[idx] = written
    return label


def _region_masks(
    placed: Iterator[tuple[int, tuple[np.ndarray, ...], np.ndarray]],
    region_of: dict[int, int],
    count: int,
    grid: VoxelGrid,
) -> np.ndarray:
    """The placed frames' segments as region masks ``(count, *spatial)`` bool, each segment into the region
    ``region_of`` names (segment number -> region index)."""
    masks = np.zeros((count, *_spatial(grid)), dtype=bool)
    for _, idx, numbers in placed:
        for number, region in region_of.items():
            chosen = numbers == number
            if chosen.any():
                masks[region][tuple(i[chosen] for i in idx)] = True
    return masks


def _other_series(seg: Any, path: Path, image: Path) -> str | None:
    """Why the DICOM-SEG ``seg`` (file ``path``) was drawn on another scan than the DICOM series ``image``: another
    FrameOfReferenceUID (another patient or position); where either lacks one, a ReferencedSeriesSequence that does
    not name the series (a SEG of another series can lie on the same grid). ``None`` when they agree (a SEG drawn on
    a co-registered series of the same frame of reference is fine: frame and grid place its voxels), or for an image
    that is no DICOM series (a NIfTI has no UIDs)."""
    if volume_format(image) != DICOM:
        return None
    series = read_dicom(series_entries(image)[0], stop_before_pixels=True)
    frame, image_frame = str(getattr(seg, "FrameOfReferenceUID", "")), str(getattr(series, "FrameOfReferenceUID", ""))
    if frame and image_frame:
        if frame == image_frame:
            return None
        return (
            f"{path}: drawn on another scan: its FrameOfReferenceUID {frame} is not that of its image {image} "
            f"({image_frame}); a segmentation of another patient or study?"
        )
    referenced = [str(getattr(item, "SeriesInstanceUID", "")) for item in getattr(seg, "ReferencedSeriesSequence", [])]
    own = str(getattr(series, "SeriesInstanceUID", ""))
    if own and any(referenced) and own not in referenced:
        return (
            f"{path}: drawn on another scan: it references series {', '.join(referenced)}, but its image {image} is "
            f"series {own}; a segmentation of another series?"
        )
    return None


def _seg_dataset(path: Path) -> Any:
    """The DICOM-SEG ``path`` read by pydicom (``read_dicom``); ``FederationError`` in one line for an empty file, a
    file that is no DICOM or whose header is damaged, and a file cut short (``ended_early``: pydicom reads it without
    a word, up to where it ends): a SEG before or inside its pixel data (its SegmentationType, SegmentSequence or
    PixelData missing would otherwise read as an unsupported SEG), a file before its SOP class."""
    try:
        ds = read_dicom(path)
    except FederationError:
        raise
    except Exception as e:  # noqa: BLE001 — pydicom raises several types for a non-DICOM file
        raise FederationError(dicom_read_failure(path, e, "expected a DICOM-SEG")) from None
    seg = sop_class(ds) in SEG_SOP_CLASSES
    needed = ("SegmentationType", "SegmentSequence", "PixelData") if seg else ("SOPClassUID",)
    if (early := ended_early(path, ds, needed)) is not None:
        raise FederationError(f"{path}: {'cannot decode its pixel data (' + early + ')' if seg else early}: {DAMAGED}")
    return ds


def read_seg_frames(path: Path) -> np.ndarray:
    """A DICOM-SEG's pixel frames as stored ``(frames, rows, columns)``, for a readability check."""
    ds = _seg_dataset(path)
    try:
        frames = np.asarray(ds.pixel_array)
    except Exception as e:  # noqa: BLE001 — any decoder failure means "corrupt file" to the user
        raise FederationError(f"{path}: cannot read ({type(e).__name__}: {e})") from None
    return frames[None] if frames.ndim == 2 else frames
