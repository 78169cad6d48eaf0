"""DICOM series: a case folder in ``images/`` holding the single-frame slices of one volume, read from the headers
alone with pydicom (``series_grid``: where the voxels lie; the voxels themselves are read by ITK/GDCM in
``fedseg.data.readers.read_volume``, which checks ITK's grid against this one), in ``fedseg.data.readers``' orientation
rule: array axes column, row, slice, the slices sorted by position along the slice normal (row direction x column
direction) as ITK/GDCM sorts them (``slice_order``: the one rule of the reader and of the DICOM-SEG writer).

Also the DICOM file helpers of the DICOM-SEG and RTSTRUCT readers and of ``fedseg predict``'s inputs: ``read_dicom``
(a standard file, or a raw DICOM stream without the 128-byte preamble and ``DICM`` prefix, which ITK/GDCM read and
pydicom only when forced, taken only where it names a SOPClassUID and SOPInstanceUID), ``is_dicom_file``,
``dicom_read_failure`` and ``ended_early`` (why a file could not be read, or ends too early, in plain words),
``sop_class``, and ``dicom_modalities`` (each site's Modality, for the run's CT note).

Refused, each with one line naming the folder or file (``FederationError``; ``SeriesError`` from ``series_grid``,
so that ``fedseg predict`` skips that series alone): a folder that is empty, holds a subfolder (a series one level
too deep: a PACS export's ``<case>/<series>/*.dcm``, ``nested_series``) or a file that is no DICOM
(``series_folder_problem``, from names and the first file alone); several series in one folder (each named as a
viewer shows it); a DICOMDIR (a medium's index, not a slice); a DICOM-SEG (a label map: ``labels/<case>.dcm``); a
multi-frame file; a file without the preamble before its file meta (ITK/GDCM cannot read it); a slice cut short
(an interrupted copy: ITK would drop it and blame the spacing) or without a slice's geometry; slices of other
orientations or sizes; two slices at one position; uneven slice spacing (a missing slice; gaps may differ by header
rounding, ``_SPACING_ATOL_MM``); and a gantry tilt (slices stacked off their normal: ITK would read them sheared).
pydicom comes with ``pip install 'fedseg[formats]'``; without it these fail with one line saying what to install.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO

import numpy as np

from fedseg.data.federation import FederationError
from fedseg.data.folder_entries import ignored_entry
from fedseg.data.optional_modules import require_module
from fedseg.data.voxel_grid import LPS_TO_RAS, VoxelGrid
from fedseg.wording import listed

if TYPE_CHECKING:
    from fedseg.data.federation import Federation

SEG_SOP_CLASSES = ("1.2.840.10008.5.1.4.1.1.66.4", "1.2.840.10008.5.1.4.1.1.66.7")  # Segmentation, Label Map
_POSITION_TOL_MM = 0.01  # two slices closer than this along the normal share a position
_SPACING_RTOL = 0.01  # slice gaps that differ by more than 1 % are uneven ...
# ... and by more than header precision: ImagePositionPatient is a decimal string that scanners often round to 2
# decimals (0.625 mm slices at 0, 0.63, 1.25, 1.88 mm), so each position is off by up to 0.005 mm, a gap by up to
# 0.01 mm and two gaps differ by up to 0.02 mm (0.62 vs 0.63 mm: 1.6 %). A missing slice doubles a gap and mixed
# thicknesses (2 vs 2.5 mm) differ by far more, so both are still refused.
_SPACING_ATOL_MM = 0.02
_DICOMDIR_SOP_CLASS = "1.2.840.10008.1.3.10"  # Media Storage Directory Storage: a DICOMDIR
_TILT_VOXELS = 0.25  # the last slice further sideways than this (in-plane voxels) of a grid through the first: tilted
DAMAGED = "a truncated or damaged file (an interrupted copy?)"


def series_entries(folder: Path) -> list[Path]:
    """The entries of a DICOM series folder, sorted by name, without those no data (``ignored_entry``)."""
    return sorted(p for p in folder.iterdir() if not ignored_entry(p.name))


def empty_file_problem(path: Path) -> str | None:
    """One line for a file of 0 bytes (an interrupted copy; pydicom would call it no DICOM file), else None."""
    try:
        empty = path.is_file() and path.stat().st_size == 0
    except OSError:
        return None
    return f"{path}: empty file (0 bytes): an interrupted copy? copy it again" if empty else None


def has_dicm_prefix(path: Path) -> bool:
    """Whether ``path`` holds ``DICM`` after a 128-byte preamble, as every DICOM file written to the standard does;
    False where it cannot be read."""
    try:
        with open(path, "rb") as f:
            return f.read(132)[128:] == b"DICM"
    except OSError:
        return False


def _meta_first(path: Path) -> bool:
    """Whether ``path`` starts with a file meta element (group 0002) where the 128-byte preamble belongs: a DICOM file
    with its preamble cut off, which pydicom reads (``read_dicom``) but ITK/GDCM does not."""
    try:
        with open(path, "rb") as f:
            return f.read(2) == b"\x02\x00"
    except OSError:
        return False


_IDENTITY = ("SOPClassUID", "SOPInstanceUID")  # what every DICOM object names (a forced read of other bytes does not)
_UID = re.compile(r"\d+(\.\d+)*")  # a UID as old PACS write them: digits and dots (leading zeros too), <= 64 chars
_RAW_GROUPS = (0x0002, 0x0008)  # a data set's first element: its file meta, or its identifying group


def _starts_like_data_set(path: Path) -> bool:
    """Whether ``path``'s first bytes are a DICOM element header of a raw data set: a tag of group 0002 or 0008
    (either byte order), then a two-letter value representation (explicit VR) or a value length within the file
    (implicit VR). Cheap (8 bytes), so a forced parse, which reads any bytes as elements and can read a large file
    whole, is tried only on files that can be one."""
    try:
        with open(path, "rb") as f:
            head = f.read(8)
        size = path.stat().st_size
    except OSError:
        return False
    if len(head) < 8:
        return False
    groups = {int.from_bytes(head[:2], "little"), int.from_bytes(head[:2], "big")}
    explicit = head[4:6].isalpha() and head[4:6].isupper()
    implicit = min(int.from_bytes(head[4:8], "little"), int.from_bytes(head[4:8], "big")) <= size
    return bool(groups & set(_RAW_GROUPS)) and (explicit or implicit)


def read_dicom(path: Path, source: BinaryIO | None = None, **options: Any) -> Any:
    """``pydicom.dcmread(source or path, **options)``, a file without the 128-byte preamble and ``DICM`` prefix too:
    a raw DICOM stream (its data set alone, as some old PACS and tools export slices), which ITK/GDCM read and
    pydicom only when forced. Forced, pydicom parses any bytes into some data set (a PNG or a note as a few nonsense
    tags), so it is tried only on a file that starts as a data set (``_starts_like_data_set``) and taken only where
    it names a SOPClassUID and SOPInstanceUID (digits and dots, at most 64 characters; old systems' UIDs with leading
    zeros in a part are read as ITK reads them), as any DICOM object does; otherwise pydicom's own error is raised
    (``dicom_read_failure`` says it in words). A raw stream has no file meta to name its transfer syntax: it is set
    to the (uncompressed) encoding pydicom found, so that pixels decode.
    ``source``: ``path`` opened by the caller (read from its start; read again from there when forced)."""
    pydicom = require_module("pydicom", path, "a DICOM file")
    try:
        return pydicom.dcmread(path if source is None else source, **options)
    except pydicom.errors.InvalidDicomError:
        if has_dicm_prefix(path) or not _starts_like_data_set(path):  # damaged DICOM, or another format
            raise
        if source is not None:
            source.seek(0)
        if options.get("specific_tags") is not None:
            options["specific_tags"] = [*options["specific_tags"], *_IDENTITY]
        try:
            ds = pydicom.dcmread(path if source is None else source, force=True, **options)
            uids = [str(ds.get(keyword, "") or "") for keyword in _IDENTITY]
        except Exception:  # noqa: BLE001 — any bytes that are no data set: not DICOM, pydicom's first error says so
            uids = []
        if not uids or not all(len(uid) <= 64 and _UID.fullmatch(uid) for uid in uids):
            raise
    if "TransferSyntaxUID" not in ds.file_meta:
        implicit, little = ds.original_encoding
        ds.file_meta.TransferSyntaxUID = (
            pydicom.uid.ImplicitVRLittleEndian
            if implicit
            else pydicom.uid.ExplicitVRLittleEndian
            if little
            else pydicom.uid.ExplicitVRBigEndian
        )
    return ds


def is_dicom_file(path: Path) -> bool:
    """Whether ``path`` is a DICOM file: the ``DICM`` prefix, or without it a data set ``read_dicom`` takes (a raw
    DICOM stream). Cheap for a DICOM file (132 bytes); others are parsed once, without their pixels.
    ``FederationError`` where that needs pydicom and it is not installed."""
    if has_dicm_prefix(path):
        return True
    try:
        read_dicom(path, stop_before_pixels=True, defer_size=1024)  # values over 1 KiB are not read
    except FederationError:  # no pydicom: that, not "no DICOM file"
        raise
    except Exception:  # noqa: BLE001 — pydicom raises several types for a file that is no DICOM
        return False
    return True


NOT_DICOM = "not a DICOM file (no DICM preamble)"


def dicom_read_failure(path: Path, e: Exception, expected: str) -> str:
    """Why ``read_dicom`` could not read ``path`` (``e``), in one line and plain words (no exception class names): an
    empty file, a DICOM file whose header is cut short or damaged (it has the DICM preamble), or no DICOM file at all
    (``expected``: what it should be)."""
    if (empty := empty_file_problem(path)) is not None:
        return empty
    if isinstance(e, OSError):  # not its content: the file itself cannot be read
        return f"{path}: cannot read ({e.strerror or e}); {expected}"
    if has_dicm_prefix(path):
        return f"{path}: cannot read its DICOM header: {DAMAGED}"
    return f"{path}: {NOT_DICOM}; {expected}"


def _deflated(ds: Any) -> bool:
    """Whether data set ``ds`` was stored deflated (zlib): pydicom parses the inflated bytes, so its element positions
    are not positions in the file, and a file cut short fails to inflate in ``read_dicom`` instead."""
    syntax = getattr(getattr(ds, "file_meta", None), "TransferSyntaxUID", None)
    return bool(getattr(syntax, "is_deflated", False))


def ended_early(path: Path, ds: Any, needed: Sequence[str]) -> str | None:
    """How the DICOM file ``path``, whose data set ``ds`` pydicom read up to the file's end (quietly, as it reads a
    file cut short), ends too early: "the file ends after N bytes, inside its <last element>" where that element's
    value runs past the end, and/or "before its <the ``needed`` attributes it lacks>" where they all would come after
    its last element (a data set is stored in tag order, so a file cut short lacks exactly what follows the cut).
    None where it lacks none of them and its last element is whole, or lacks one its stored elements should follow
    (no cut: a file of another kind, said by its reader), and for a deflated file (``_deflated``)."""
    from pydicom.datadict import keyword_for_tag, tag_for_keyword

    if _deflated(ds):
        return None
    size = path.stat().st_size
    last = max(ds.keys(), default=None)
    element = ds.get_item(last) if last is not None else None
    length, at = getattr(element, "length", None), getattr(element, "value_tell", None)
    inside = isinstance(length, int) and isinstance(at, int) and length != 0xFFFFFFFF and at + length > size
    missing = sorted((tag_for_keyword(k), k) for k in needed if k not in ds)
    before = bool(missing) and (last is None or missing[0][0] > last)
    if not (inside or before):
        return None
    where = [f"inside its {keyword_for_tag(last) or last}"] if inside and last is not None else []
    if before:
        names = [k for _, k in missing]
        where.append(f"before its {listed(names, 2)}")
    return f"the file ends after {size} bytes, {', '.join(where)}"


def _nested_series(folder: Path, entries: list[Path]) -> str | None:
    """For a case folder ``folder`` whose one entry (``entries``) is a folder of DICOM files (a PACS export's
    ``<case>/<series>/*.dcm``): what it holds and what to do; else None."""
    if len(entries) != 1 or not entries[0].is_dir():
        return None
    try:
        inner = series_entries(entries[0])
        files = [p for p in inner if p.is_file()]
        if not files or len(files) != len(inner):
            return None
        if not (files[0].name.lower().endswith(".dcm") or is_dicom_file(files[0])):
            return None
    except (OSError, FederationError):
        return None
    count = f"{len(files)} DICOM file{'s' if len(files) > 1 else ''}"
    return (
        f"{folder}: holds the folder {entries[0].name!r} of {count}, a series one level too deep (a PACS export's "
        f"layout?): move the files up into {folder.name}/ and remove {entries[0].name!r}"
    )


def nested_series(folder: Path) -> bool:
    """Whether ``folder``'s one entry is a folder of DICOM files (a series one level too deep: ``_nested_series``)."""
    try:
        return _nested_series(folder, series_entries(folder)) is not None
    except OSError:
        return False


def series_folder_problem(folder: Path) -> str | None:
    """Why ``folder`` (inside ``images/``) cannot be a DICOM series, from names and the first file's
    preamble alone, or its header where it has none (``is_dicom_file``; cheap: ``load_folder`` reads no image);
    ``None`` if it looks like one."""
    expected = "a case folder in images/ must hold the .dcm files of one DICOM series"
    try:
        entries = series_entries(folder)
    except OSError as e:
        return f"{folder}: cannot list this folder ({e.strerror}); {expected}"
    if not entries:
        return f"{folder}: empty folder; {expected}"
    for entry in entries:
        if not entry.is_file():
            said = _nested_series(folder, entries) or f"{folder}: holds {entry.name!r}, which is not a file"
            return f"{said}; {expected}"
    if (empty := empty_file_problem(entries[0])) is not None:
        return f"{empty}; {expected}"
    try:
        with open(entries[0], "rb") as f:
            f.read(1)
    except OSError as e:
        return f"{entries[0]}: cannot read ({e.strerror}); {expected}"
    try:
        dicom = is_dicom_file(entries[0])
    except FederationError as e:  # no pydicom to read a file without the DICM preamble
        return f"{e}; {expected}"
    if not dicom:
        return f"{entries[0]}: {NOT_DICOM}; {expected}"
    return None


def _truncated(path: Path, ds: Any, pixels_at: int) -> str | None:
    """Why ``path`` (its header ``ds``, read without pixels up to byte ``pixels_at``, where its pixel data element
    starts) is cut short: an uncompressed slice whose file ends before its pixel data (Rows x Columns x
    SamplesPerPixel x BitsAllocated / 8 bytes after the element's 8-byte header at least) does, as an interrupted
    copy leaves it; ITK would drop the slice and blame the slice spacing. None where it is complete or cannot be told
    (a compressed or deflated transfer syntax, a header without the sizes: the checks after this one say so)."""
    syntax = getattr(getattr(ds, "file_meta", None), "TransferSyntaxUID", None)
    try:
        if syntax is None or syntax.is_compressed or _deflated(ds):
            return None
        needed = int(ds.Rows) * int(ds.Columns) * int(getattr(ds, "SamplesPerPixel", 1)) * int(ds.BitsAllocated) // 8
    except (AttributeError, TypeError, ValueError):
        return None
    missing = pixels_at + 8 + needed - path.stat().st_size
    if missing <= 0:
        return None
    return (
        f"{path}: its pixel data ends at least {missing} bytes short of {int(ds.Rows)} x {int(ds.Columns)} pixels of "
        f"{int(ds.BitsAllocated)} bits: a truncated file (an interrupted copy?); copy it again"
    )


def _is_dicomdir(path: Path, ds: Any) -> bool:
    """Whether ``path`` (its header ``ds``) is a DICOMDIR, the index a DICOM medium (CD, USB export) keeps beside its
    series: by its file name or its SOP class. Refused rather than skipped: ITK/GDCM reads the series folder itself,
    and what it makes of a DICOMDIR there is not fedseg's to decide; a DICOMDIR among the slices also means the
    folder is a medium's layout, not one series per case folder."""
    sop_class = getattr(getattr(ds, "file_meta", None), "MediaStorageSOPClassUID", None) or getattr(
        ds, "SOPClassUID", None
    )
    return path.name.upper() == "DICOMDIR" or str(sop_class or "") == _DICOMDIR_SOP_CLASS


# what the header of a slice of a volume holds (BitsAllocated: for its pixel data's size, ``_truncated``)
_SLICE_ATTRIBUTES = (
    "ImagePositionPatient",
    "ImageOrientationPatient",
    "PixelSpacing",
    "Rows",
    "Columns",
    "BitsAllocated",
)


def _plane(ds: Any, path: Path) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """A slice's ``(position, row direction, column direction, (row spacing, column spacing))`` in LPS mm."""
    missing = [a for a in _SLICE_ATTRIBUTES if a not in ds]
    if missing:
        raise FederationError(
            f"{path}: not a slice of a volume (no {', '.join(missing)}); a DICOM series folder holds one "
            "single-frame image per slice"
        )
    try:
        position = np.asarray(ds.ImagePositionPatient, dtype=np.float64)
        orientation = np.asarray(ds.ImageOrientationPatient, dtype=np.float64)
        spacing = np.asarray(ds.PixelSpacing, dtype=np.float64)
    except (TypeError, ValueError):
        position = orientation = spacing = np.zeros(0)
    if position.shape != (3,) or orientation.shape != (6,) or spacing.shape != (2,):
        raise FederationError(f"{path}: malformed ImagePositionPatient, ImageOrientationPatient or PixelSpacing")
    return position, orientation[:3], orientation[3:], spacing


def slice_order(headers: Sequence[Any]) -> tuple[list[int], np.ndarray]:
    """The order of a DICOM series' slices along fedseg's third array axis, as ITK/GDCM sorts them: the indices of
    ``headers`` (the slices' pydicom datasets) sorted by ImagePositionPatient along the slice normal (row direction x
    column direction of the first's ImageOrientationPatient; slices at one position keep their order in
    ``headers``), and that normal (LPS). The one rule of ``series_grid`` and the DICOM-SEG writer
    (``fedseg.predict_seg.sorted_slices``); ``headers`` are slices of one volume (as ``series_grid`` checks)."""
    orientation = np.asarray(headers[0].ImageOrientationPatient, dtype=np.float64)
    normal = np.cross(orientation[:3], orientation[3:])
    heights = [float(np.asarray(ds.ImagePositionPatient, dtype=np.float64) @ normal) for ds in headers]
    return sorted(range(len(headers)), key=heights.__getitem__), normal


def _series_number(ds: Any) -> str:
    """A slice's SeriesNumber as text ("" where it has none; 0 is a number)."""
    number = getattr(ds, "SeriesNumber", None)
    return "" if number is None or str(number).strip() == "" else str(number).strip()


def _series_text(series: list[str], headers: list[tuple[Path, Any]]) -> str:
    """The series ``series`` (SeriesInstanceUIDs) of a folder's slices ``headers`` as a user tells them apart in a
    viewer: each one's SeriesNumber and SeriesDescription where it has them, its number of files and its first file,
    e.g. "series 2 'abdomen 5mm': 120 files, IM0001.dcm ..."; its UID where it has no SeriesNumber, or another
    series has the same one."""
    numbers = [{_series_number(ds) for _, ds in headers if str(ds.SeriesInstanceUID) == uid} for uid in series]
    parts = []
    for uid, number in zip(series, numbers):
        files = sorted(path.name for path, ds in headers if str(ds.SeriesInstanceUID) == uid)
        first = next(ds for _, ds in headers if str(ds.SeriesInstanceUID) == uid)
        unique = len(number) == 1 and "" not in number and sum(n == number for n in numbers) == 1
        name = f"series {next(iter(number))}" if unique else f"series {uid}"
        description = str(getattr(first, "SeriesDescription", "") or "").strip()
        if description:
            name += f" '{description}'"
        more = len(files) > 1
        parts.append(f"{name}: {len(files)} file{'s' if more else ''}, {files[0]}{' ...' if more else ''}")
    return "; ".join(parts)


class SeriesError(FederationError):
    """A DICOM series folder whose files cannot be read as one volume: uneven slice spacing (a missing slice), two
    slices at one position, slices of other orientations or sizes, several series, a damaged or cut-short slice, a
    gantry tilt, pixel data ITK cannot decode (``series_grid``, ``read_volume``). A problem of that folder's files
    alone, so ``fedseg predict`` skips that series and predicts the other inputs; not raised for a missing optional
    module (pydicom, ITK: every series would fail)."""


def series_grid(folder: Path) -> VoxelGrid:
    """The grid of the DICOM series in ``folder`` (``_series_grid``); ``SeriesError`` (one line) where its files
    cannot be read as one volume."""
    require_module("pydicom", folder, "a DICOM series")  # said for the folder, before any file
    try:
        return _series_grid(folder)
    except SeriesError:
        raise
    except FederationError as e:
        raise SeriesError(str(e)) from None


def _series_grid(folder: Path) -> VoxelGrid:
    """The grid of the DICOM series in ``folder``, from the headers alone (pydicom), after checking that
    the folder holds exactly one series of parallel, evenly spaced, single-frame slices.

    Array axes: column, row, slice (slices sorted by position along the normal, as ITK reads them).
    ``FederationError`` with one line naming the folder or file: not DICOM, several series, a DICOMDIR, a DICOM-SEG,
    a multi-frame file, slices with different orientations or sizes, two slices at one position, uneven
    slice spacing (missing slices; gaps may differ by header rounding, ``_SPACING_ATOL_MM``; the spacing is their
    mean), slices stacked off their normal (a gantry-tilted CT: the last slice more than
    ``_TILT_VOXELS`` sideways of a grid through the first; ITK would read it sheared, every voxel misplaced by up
    to that much).
    """
    problem = series_folder_problem(folder)
    if problem is not None:
        raise FederationError(problem)
    headers = []
    for path in series_entries(folder):
        try:
            with open(path, "rb") as f:
                ds = read_dicom(path, f, stop_before_pixels=True)
                pixels_at = f.tell()  # pydicom stops at the pixel data element's start, else at the file's end
        except FederationError:
            raise
        except Exception as e:  # noqa: BLE001 — pydicom raises several types for a non-DICOM file
            raise FederationError(dicom_read_failure(path, e, "expected one DICOM series")) from None
        if not has_dicm_prefix(path) and _meta_first(path):
            raise FederationError(
                f"{path}: a DICOM file whose 128-byte preamble and DICM prefix are missing before its file meta "
                "header, which ITK/GDCM cannot read; write it again as a standard DICOM file (dcmconv, gdcmconv, or "
                "pydicom: dcmread(path, force=True).save_as(path, enforce_file_format=True))"
            )
        if _is_dicomdir(path, ds):
            raise FederationError(
                f"{path}: a DICOMDIR (a media directory), not a slice: move it out of the series folder"
            )
        if pixels_at >= path.stat().st_size and (early := ended_early(path, ds, _SLICE_ATTRIBUTES)) is not None:
            raise FederationError(f"{path}: {early}: {DAMAGED}")  # not "no PixelSpacing" or "2 series" of a cut UID
        if (short := _truncated(path, ds, pixels_at)) is not None:
            raise FederationError(short)
        headers.append((path, ds))
    for path, ds in headers:  # a truncated or damaged file parses with its header cut short
        if not str(getattr(ds, "SeriesInstanceUID", "")):
            raise FederationError(f"{path}: DICOM header without a SeriesInstanceUID (a damaged or truncated file?)")
    series = sorted({str(ds.SeriesInstanceUID) for _, ds in headers})
    if len(series) > 1:
        raise FederationError(
            f"{folder}: holds {len(series)} DICOM series ({_series_text(series, headers)}); put each series in its own "
            "case folder"
        )
    planes = []
    for path, ds in headers:
        if str(getattr(ds, "Modality", "")) == "SEG" or str(getattr(ds, "SOPClassUID", "")) in SEG_SOP_CLASSES:
            raise FederationError(f"{path}: a DICOM-SEG is a label map; it belongs in labels/<case>.dcm")
        if int(getattr(ds, "NumberOfFrames", 1) or 1) > 1:
            raise FederationError(f"{path}: multi-frame DICOM is not supported; store one single-frame file per slice")
        planes.append((path, *_plane(ds, path), (int(ds.Rows), int(ds.Columns))))
    _, _, row0, col0, spacing0, size0 = planes[0]
    for path, _, row, col, spacing, size in planes[1:]:
        if not (np.allclose(row, row0, atol=1e-4) and np.allclose(col, col0, atol=1e-4)):
            raise FederationError(f"{path}: its ImageOrientationPatient differs from {planes[0][0].name}'s")
        if size != size0 or not np.allclose(spacing, spacing0, rtol=1e-4):
            raise FederationError(f"{path}: its size or PixelSpacing differs from {planes[0][0].name}'s")
    indices, normal = slice_order([ds for _, ds in headers])
    order = [planes[i] for i in indices]
    heights = np.array([float(p[1] @ normal) for p in order])
    gaps = np.diff(heights)
    if gaps.size and gaps.min() < _POSITION_TOL_MM:
        k = int(np.argmin(gaps))
        raise FederationError(
            f"{folder}: {order[k][0].name} and {order[k + 1][0].name} lie at the same position "
            f"({heights[k]:g} mm along the slice normal); one file per slice"
        )
    if gaps.size > 1 and gaps.max() - gaps.min() > _SPACING_RTOL * gaps.min() + _SPACING_ATOL_MM:
        k = int(np.argmax(gaps))
        raise FederationError(
            f"{folder}: uneven slice spacing ({gaps.min():g} to {gaps.max():g} mm; the largest gap is between "
            f"{order[k][0].name} and {order[k + 1][0].name}): missing slices?"
        )
    drift = order[-1][1] - order[0][1]
    drift = drift - (drift @ normal) * normal  # in the slice plane: zero when the slices stack along their normal
    voxels = float(np.linalg.norm(drift / np.asarray([spacing0[1], spacing0[0]]).mean()))
    if voxels > _TILT_VOXELS:
        angle = float(np.degrees(np.arctan2(np.linalg.norm(drift), heights[-1] - heights[0])))
        raise FederationError(
            f"{folder}: the slices are stacked {angle:.1f} degrees off their normal (a gantry-tilted CT?): the last "
            f"lies {voxels:.1f} voxels sideways of a grid through the first, so no voxel grid holds them; resample "
            "the series first (dcm2niix corrects gantry tilt) and give the NIfTI"
        )
    step = float(gaps.mean()) if gaps.size else float(getattr(headers[0][1], "SliceThickness", 1.0) or 1.0)
    lps = np.eye(4)
    lps[:3, 0], lps[:3, 1], lps[:3, 2] = row0 * spacing0[1], col0 * spacing0[0], normal * step
    lps[:3, 3] = order[0][1]
    return VoxelGrid((size0[1], size0[0], len(order)), LPS_TO_RAS @ lps)


def dicom_modalities(fed: Federation) -> dict[str, str]:
    """``{site: Modality}`` (``CT``, ``MR``...) of each site's first DICOM series (a case whose image is a folder; the
    header of its first file by name, pixels not read), for what depends on it (the run's CT note, the channel name
    of an nnU-Net export); sites without one, unreadable headers and a missing pydicom are left out
    (``fedseg data check`` names unreadable files)."""
    out = {}
    for site in fed.sites:
        images = (Path(str(c.meta["image"])) for c in site.cases if c.meta.get("image"))
        folder = next((image for image in images if image.is_dir()), None)
        # the series' slices as the reader lists them (junk files left out; PACS slices may have no extension)
        first = next((p for p in series_entries(folder) if p.is_file()), None) if folder else None
        if first is None:
            continue
        try:
            modality = str(read_dicom(first, stop_before_pixels=True, specific_tags=["Modality"]).Modality)
        except Exception:  # noqa: BLE001 - any unreadable header, or no pydicom: data check's to say, not this note's
            continue
        if modality.strip():
            out[site.name] = modality.strip().upper()
    return out


def sop_class(ds: Any) -> str:
    """The SOP class of the DICOM file ``ds`` (a DICOM-SEG's, an RTSTRUCT's...): its SOPClassUID, else its file meta's
    (a file cut short keeps that)."""
    meta = getattr(ds, "file_meta", None)
    return str(getattr(ds, "SOPClassUID", "") or getattr(meta, "MediaStorageSOPClassUID", "") or "")
