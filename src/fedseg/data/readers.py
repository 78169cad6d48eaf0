"""Volume files: NIfTI, NRRD, MetaImage (``.mha``/``.mhd``) and DICOM series (DICOM-SEG label maps:
:mod:`fedseg.data.dicom_seg`).

``fedseg.data.case_files`` reads every format through this module: ``read_volume`` (the voxels) and
``volume_grid`` (where they lie, from the header alone; a NRRD/MetaImage's as ITK states it: ``itk_geometry``, which
``fedseg.data.volume_write`` writes back for ``fedseg predict``'s masks), and through ``dicom_seg.read_dicom_seg``
(a DICOM-SEG drawn on an image's grid). Readers: NIfTI with nibabel (as before), NRRD/MetaImage and DICOM series
with MONAI's ``ITKReader`` (the reader ``monai.transforms.LoadImage`` uses; called directly so that the stored dtype is
kept, where ``LoadImage``'s tensor turns uint16 into int32), DICOM headers and DICOM-SEG with pydicom.
ITK and pydicom come with ``pip install 'fedseg[formats]'``; without them NIfTI, PNG, JPEG and NumPy
files still work and these formats fail with one line saying what to install.

Orientation rule, the same for every format: **the file's voxel grid in its own index order, never
resampled or reoriented** (what fedseg has always done with NIfTI). Array axis 0 is the fastest index in
the file (NIfTI ``i``, NRRD/MetaImage ``x``, a DICOM slice's column), axis 1 the next (NIfTI ``j``, a
DICOM slice's row), axis 2 the slowest (NIfTI ``k``; a DICOM series' slices sorted by position along
the slice normal ``row direction x column direction``, as ITK/GDCM sorts them), channels (NIfTI's 4th
and 5th axes, NRRD/MetaImage vector components) last. The same grid stored as NIfTI, NRRD, MetaImage
or a DICOM series reads back to the same array. One limit: a DICOM series is always right-handed in
this order (its third axis follows the normal), so a NIfTI whose affine is left-handed
(``det < 0``, e.g. a y-flipped dcm2niix output) and the DICOM series it came from differ by a flip of one
axis; fedseg reports the spacing of both correctly and metrics (Dice, HD95) are unaffected by the flip.

Spacing: the voxel size in mm along each array axis (the lengths of the affine's columns: NIfTI zooms,
ITK spacing, DICOM ``PixelSpacing`` and the distance between slice positions). The affine (``VoxelGrid.affine``)
maps voxel indices to RAS+ mm (nibabel's convention; ITK and DICOM's LPS are converted).
"""

from __future__ import annotations

import importlib
import logging
import re
import threading
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any, BinaryIO, cast

import numpy as np

from fedseg.data.federation import FederationError

log = logging.getLogger("fedseg.data.readers")

if TYPE_CHECKING:
    from nibabel.spatialimages import SpatialImage

    from fedseg.data.federation import Federation

NIFTI_EXTS = ("nii.gz", "nii")
ITK_EXTS = ("nrrd", "mha", "mhd")  # read with ITK
VOLUME_EXTS = NIFTI_EXTS + ITK_EXTS  # single-file volumes (images and labels)
SEG_EXT = "dcm"  # a DICOM-SEG label map: labels/<case>.dcm
DICOM = "dicom"  # the format name of a DICOM series folder (images/<case>/)
INSTALL_HINT = "pip install 'fedseg[formats]'"
LPS_TO_RAS = np.diag([-1.0, -1.0, 1.0, 1.0])
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


def _require(module: str, path: Path, what: str) -> ModuleType:
    """Import ``module`` (an optional dependency); ``FederationError`` naming ``path`` and the install command."""
    try:
        return importlib.import_module(module)
    except ImportError:
        raise FederationError(f"{path}: reading {what} needs {module}: {INSTALL_HINT}") from None


# What fedseg's ITK readers (and MONAI's ITKReader) use: ITK Python loads each of its modules on first use of a name,
# and while it loads one it chdirs the whole process into its library folder (itk.support.base.LibraryLoader), so a
# load in one thread makes a relative path that another thread opens meanwhile miss ("No such file or directory"),
# and two loads at once swap sys.path under each other. ``load_itk`` loads them all at once, under a lock.
_ITK_NAMES = (
    "ImageIOFactory", "CommonEnums", "GDCMSeriesFileNames", "GDCMImageIO", "ImageSeriesReader", "ImageFileReader",
    "imread", "array_from_image", "image_from_array", "array_view_from_image", "VariableLengthVector", "D", "F",
    "Image", "VectorImage", "MetaDataDictionary", "NrrdImageIO", "MetaImageIO", "PyBuffer", "PyVectorContainer",
)  # fmt: skip
_ITK_LOCK = threading.Lock()
_itk_loaded = False


def itk_loaded() -> bool:
    """Whether ``load_itk`` has loaded ITK's modules in this process."""
    return _itk_loaded


def load_itk(path: Path | None = None, what: str = "a DICOM series, NRRD or MetaImage file") -> ModuleType:
    """``itk`` with every module fedseg's readers use loaded (once per process, one thread at a time; ~5-10 s).
    Call it on the main thread before threads read cases (``folder.load_folder``, ``check.check_folder`` do for a
    federation with DICOM series, NRRD or MetaImage files): ITK's loading changes the process's working directory
    while it runs. ``FederationError`` naming ``path`` and the install command without ITK."""
    global _itk_loaded
    itk = _require("itk", path or Path("."), what)
    if not _itk_loaded:
        with _ITK_LOCK:
            if not _itk_loaded:
                for name in _ITK_NAMES:
                    getattr(itk, name)
                _itk_loaded = True
    return itk


def needs_itk(paths: Iterable[Path]) -> bool:
    """Whether any of ``paths`` is read with ITK: a DICOM series folder, a NRRD or MetaImage file."""
    return any(volume_format(Path(p)) in (*ITK_EXTS, DICOM) for p in paths)


_OWN_SPACING_RTOL = 0.01  # a label's own slice spacing this much over its image's is coarser, not header rounding


def striped_step(slices: Iterable[int], drawn_elsewhere: bool) -> int | None:
    """For a label whose own slice spacing cannot be known (a DICOM-SEG without SpacingBetweenSlices that names no
    series or another one; an RTSTRUCT not drawn on its image's series), the step between the image slices its
    frames or contours lie on (``slices``: their indices along the image's slice axis) where every one lies a
    multiple of that step (more than one slice) from every other: a label drawn on a thicker reconstruction of the
    same scan (5 mm over 2.5 mm slices) lands on every other slice, and read so it would train a striped structure.
    The step is the greatest common divisor of the gaps: slices 0, 2 and 5 (gaps 2 and 3) cannot all lie on a
    coarser series' slices, so they are read. Said where the label names another series or other images
    (``drawn_elsewhere``), and otherwise where 3 or more slices lie that step apart every one (every other slice
    annotated: striped too); not for 2 slices 2 apart of a label not known to be drawn elsewhere (two lesions with an
    empty slice between them); ``None`` otherwise. Where the label's own spacing is known, ``coarser_problem``
    decides instead (two single-slice structures drawn on a co-registered series of other slice positions are read
    there; here, their own spacing unknown, they are refused as a thicker series' would be: give the label the
    series it was drawn on as its image)."""
    found = sorted(set(slices))
    if len(found) < 2:
        return None
    gaps = np.diff(found)
    step = int(np.gcd.reduce(gaps))
    if step <= 1:
        return None
    return step if drawn_elsewhere or (len(found) >= 3 and bool((gaps == step).all())) else None


def striped_problem(path: Path, image: Path, slices: Iterable[int], step: int, spacing_mm: float, what: str) -> str:
    """One line: the label ``path`` (a ``what``: DICOM-SEG, RTSTRUCT) lies only on every ``step``-th slice of
    ``image`` (its slices ``slices``, ``spacing_mm`` apart), its own slice spacing unknown (``striped_step``)."""
    found = sorted(set(slices))
    extent = found[-1] - found[0] + 1
    return (
        f"{path}: this {what} covers only {len(found)} of the {extent} slices of its structures' extent (slices "
        f"{found[0]}-{found[-1]} of {image}, one in {step}): drawn on another series with {step * spacing_mm:g} mm "
        f"between slices (this image: {spacing_mm:g} mm)? Read so it would train striped labels; give it the series "
        "it was drawn on as its image, or resample it onto this one"
    )


def _slices_text(found: list[int], shown: int = 6) -> str:
    """Slice indices as a message lists them: ``3``, ``0, 2, 4``, or the first few and the last with a count."""
    if len(found) <= shown:
        return ", ".join(map(str, found))
    return f"{', '.join(map(str, found[: shown - 1]))}, ... {found[-1]} ({len(found)} slices)"


def coarser_problem(
    path: Path, image: Path, slices: Iterable[int], own_mm: float, spacing_mm: float, what: str, source: str
) -> str | None:
    """One line where the label ``path`` (a ``what``: DICOM-SEG, RTSTRUCT), whose own slice spacing is known to be
    ``own_mm`` (mm, as ``source`` says: "its SpacingBetweenSlices"), was drawn on slices further apart than the
    ``spacing_mm`` (mm) between those of ``image``: each of its slices stands for several of the image's, of which
    it paints one (its frames or contours lie on ``slices``, indices along the image's slice axis), so read it would
    train striped labels (a 5 mm reconstruction's SEG on a 2.5 mm series: structures on every other slice). ``None``
    where its spacing is the image's or finer (within 1 %), whatever slices it lies on (two single-slice
    structures two slices apart are two structures, not stripes), and where its slices contradict ``own_mm``: no
    step above one slice divides their gaps (0, 2, 5 cannot lie on a coarser series' slices)."""
    found = sorted(set(slices))
    if not found or own_mm <= spacing_mm * (1 + _OWN_SPACING_RTOL):
        return None
    if len(found) >= 2 and int(np.gcd.reduce(np.diff(found))) <= 1:
        return None
    ratio = own_mm / spacing_mm
    return (
        f"{path}: this {what} was drawn on slices {own_mm:g} mm apart ({source}), but its image {image} has "
        f"{spacing_mm:g} mm between slices: read on it, each of its slices would paint one of the {ratio:.3g} image "
        f"slices it stands for (it lies on slice{'s' if len(found) > 1 else ''} {_slices_text(found)}), training "
        "striped labels; give it the series it was drawn on as its image, or resample it onto this one"
    )


@dataclass(frozen=True)
class VoxelGrid:
    """Where a volume's voxels lie: ``shape`` the spatial shape (array order), ``affine`` 4x4 voxel index ->
    RAS+ mm (a 2D grid is embedded with a unit third axis)."""

    shape: tuple[int, ...]
    affine: np.ndarray

    def spacing(self, dims: int) -> tuple[float, ...]:
        """Voxel size in mm along the first ``dims`` array axes."""
        return tuple(float(v) for v in np.linalg.norm(self.affine[:3, :dims], axis=0))


def _numbers(values: np.ndarray) -> str:
    """``(0.8, 0.8, 2.5)``: numbers as a reader writes them (rounded, no numpy reprs)."""
    return "(" + ", ".join(f"{float(x):g}" for x in np.round(values, 3)) + ")"


def grid_mismatch(grid: VoxelGrid, reference: VoxelGrid) -> str | None:
    """How ``grid``'s voxels lie elsewhere than ``reference``'s, in words ending in ``mm`` (its spacing, an axis
    flipped or rotated, its origin), or ``None`` when they agree: voxel axes (direction x spacing) to 0.1 %, origins
    to half the smallest voxel (header rounding). Shapes are not compared."""
    a, b = grid.affine, reference.affine
    spacing_a, spacing_b = np.linalg.norm(a[:3, :3], axis=0), np.linalg.norm(b[:3, :3], axis=0)
    if not np.allclose(spacing_a, spacing_b, rtol=1e-3, atol=1e-3):
        return f"spacing {_numbers(spacing_a)} vs {_numbers(spacing_b)} mm"
    if not np.allclose(a[:3, :3], b[:3, :3], rtol=1e-3, atol=1e-3):
        axes = lambda m: np.array2string(m[:3, :3].round(3) + 0.0, separator=",").replace("\n", "")  # noqa: E731
        return f"an axis flipped or rotated: voxel axes {axes(a)} vs {axes(b)} mm"
    if np.linalg.norm(a[:3, 3] - b[:3, 3]) > 0.5 * min(spacing_b):
        return f"origin {_numbers(a[:3, 3])} vs {_numbers(b[:3, 3])} mm"
    return None


def _embed(affine: np.ndarray) -> np.ndarray:
    """A ``(n+1, n+1)`` affine (n <= 3 spatial axes) as 4x4, the missing axes unit and orthogonal."""
    n = affine.shape[0] - 1
    out = np.eye(4)
    out[:n, :n], out[:n, 3] = affine[:n, :n], affine[:n, n]
    return out


# --- DICOM series -------------------------------------------------------------------------------------


OS_JUNK_FILES = frozenset({"thumbs.db", "ehthumbs.db", "desktop.ini"})  # Windows Explorer's, as .DS_Store is macOS'
DAMAGED = "a truncated or damaged file (an interrupted copy?)"


def ignored_entry(name: str) -> bool:
    """Whether a folder entry named ``name`` is no data and is skipped wherever a folder of cases or slices is
    listed: hidden (a name starting with ``.``: macOS' ``.DS_Store`` and ``._*``), or a file that Windows Explorer
    leaves in folders it shows (``Thumbs.db``, ``ehthumbs.db``, ``desktop.ini``; any case)."""
    return name.startswith(".") or name.lower() in OS_JUNK_FILES


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
    pydicom = _require("pydicom", path, "a DICOM file")
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


def _listed(words: Sequence[str]) -> str:
    """``a``, ``a and b``, ``a, b and c``."""
    return f"{', '.join(words[:-1])} and {words[-1]}" if len(words) > 1 else "".join(words)


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
        where.append(f"before its {_listed(names if len(names) < 4 else [*names[:2], f'{len(names) - 2} more'])}")
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
    _require("pydicom", folder, "a DICOM series")  # said for the folder, before any file
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


# --- reading ------------------------------------------------------------------------------------------


def volume_format(path: Path) -> str | None:
    """``"nii.gz"``, ``"nii"``, ``"nrrd"``, ``"mha"``, ``"mhd"``, ``DICOM`` for a folder, ``None`` otherwise."""
    if path.is_dir():
        return DICOM
    lower = path.name.lower()
    return next((ext for ext in VOLUME_EXTS if lower.endswith("." + ext)), None)


# bytes per element of the MetaImage element types whose size does not depend on the platform (MET_LONG does)
_MET_BYTES = {
    "MET_CHAR": 1, "MET_UCHAR": 1, "MET_SHORT": 2, "MET_USHORT": 2, "MET_INT": 4, "MET_UINT": 4,
    "MET_LONG_LONG": 8, "MET_ULONG_LONG": 8, "MET_FLOAT": 4, "MET_DOUBLE": 8,
}  # fmt: skip


def metaimage_problem(path: Path) -> str | None:
    """Why the MetaImage ``path`` (``.mha``, or a ``.mhd`` header) cannot hold its voxels, from its header and file
    sizes alone: a ``.mhd`` whose data file (``ElementDataFile``) is not beside it (copied without it), or voxel data
    shorter than the header announces (an interrupted copy): ITK says "No such file or directory" for both, naming
    the header, and prints its own lines on stderr. ``None`` where the data is there and long enough, or cannot be
    told (a file list or pattern, ``HeaderSize``, a compressed file without its ``CompressedDataSize``)."""
    if not path.name.lower().endswith((".mha", ".mhd")):
        return None
    try:
        with path.open("rb") as f:
            head = f.read(65536)
        size = path.stat().st_size
    except OSError:
        return None
    fields: dict[str, str] = {}
    offset = 0
    for line in head.splitlines(keepends=True):
        offset += len(line)
        key, sep, value = line.decode("latin-1").partition("=")
        if not sep:
            return None  # not a MetaImage header line: leave it to ITK
        fields[key.strip()] = value.strip()
        if key.strip() == "ElementDataFile":
            break
    else:
        return None
    data = fields["ElementDataFile"]
    if data == "LIST" or "%" in data or len(data.split()) > 1:
        return None
    if data == "LOCAL":
        data_path, available = path, size - offset
    else:
        data_path = Path(data) if Path(data).is_absolute() else path.parent / data
        if not data_path.is_file():
            return (
                f"{path}: its voxel data file {data} (ElementDataFile) is missing: a .mhd is only the header; put "
                f"{data} beside it (copy both files), or give the image as one .mha"
            )
        available = data_path.stat().st_size
    try:
        if "HeaderSize" in fields or fields.get("BinaryData", "True").lower() != "true":
            return None  # voxels after a header of another size, or written as text: no size to expect
        if fields.get("CompressedData", "False").lower() == "true":
            if "CompressedDataSize" not in fields:
                return None
            expected = int(fields["CompressedDataSize"])
            what = "compressed voxel data"
        else:
            count = int(np.prod([int(n) for n in fields["DimSize"].split()]))
            expected = count * int(fields.get("ElementNumberOfChannels", "1")) * _MET_BYTES[fields["ElementType"]]
            what = f"voxel data (DimSize {fields['DimSize']}, {fields['ElementType']})"
    except (KeyError, ValueError):
        return None
    if available >= expected:
        return None
    where = "" if data_path == path else f" in {data}"
    return (
        f"{path}: its {what}{where} ends after {max(available, 0)} of {expected} bytes: a truncated file (an "
        "interrupted copy?); copy it again"
    )


_NRRD_BYTES = {1: ("signed char", "int8", "int8_t", "uchar", "unsigned char", "uint8", "uint8_t"),
               2: ("short", "short int", "signed short", "signed short int", "int16", "int16_t", "ushort",
                   "unsigned short", "unsigned short int", "uint16", "uint16_t"),
               4: ("int", "signed int", "int32", "int32_t", "uint", "unsigned int", "uint32", "uint32_t", "float"),
               8: ("longlong", "long long", "long long int", "signed long long", "signed long long int", "int64",
                   "int64_t", "ulonglong", "unsigned long long", "unsigned long long int", "uint64", "uint64_t",
                   "double")}  # fmt: skip


def nrrd_truncated(path: Path) -> str | None:
    """Why the NRRD file ``path``, which ITK failed to read, is cut short: its raw voxel data is shorter than its
    header's ``sizes`` and ``type`` announce, or its gzip-encoded data ends before the end of its stream (an
    interrupted copy; ITK says only "trouble reading", in a long line). ``None`` where it is neither (another
    damage, a detached header, an encoding not checked), said by ITK's message. Read only after ITK failed."""
    import zlib

    try:
        raw = path.read_bytes()
    except OSError:
        return None
    end = raw.find(b"\n\n")
    if not raw.startswith(b"NRRD") or end < 0:
        return None
    fields = {}
    for line in raw[:end].decode("latin-1").splitlines()[1:]:
        key, sep, value = line.partition(":")
        if sep and not line.startswith("#") and not value.startswith("="):
            fields[key.strip().lower()] = value.strip()
    data = raw[end + 2 :]
    if "data file" in fields or "datafile" in fields:
        return None
    encoding = fields.get("encoding", "").lower()
    try:
        count = int(np.prod([int(n) for n in fields["sizes"].split()]))
        element = next(n for n, names in _NRRD_BYTES.items() if fields["type"].lower() in names)
    except (KeyError, ValueError, StopIteration):
        return None
    expected = count * element
    if encoding == "raw" and len(data) < expected:
        got = f"ends after {len(data)} of {expected} bytes"
    elif encoding in ("gzip", "gz"):
        stream = zlib.decompressobj(wbits=47)  # a gzip or zlib header
        try:
            unpacked = len(stream.decompress(data))
        except zlib.error:
            return None
        if stream.eof and unpacked >= expected:
            return None
        got = f"(gzip) ends after {len(data)} bytes, {unpacked} of its {expected} bytes unpacked"
    else:
        return None
    return f"{path}: its voxel data {got}: a truncated file (an interrupted copy?); copy it again"


def _itk_header(path: Path) -> Any:
    """ITK's ``ImageIOBase`` for ``path`` with the header read (no voxel); a ``FederationError`` for a MetaImage
    whose data is missing or cut short (``metaimage_problem``), before ITK tries."""
    if (problem := metaimage_problem(path)) is not None:
        raise FederationError(problem)
    itk = load_itk(path, f"a {path.suffix} file")
    io = itk.ImageIOFactory.CreateImageIO(str(path), itk.CommonEnums.IOFileMode_ReadMode)
    if io is None:
        raise FederationError(f"{path}: cannot read (ITK has no reader for this file)")
    io.SetFileName(str(path))
    io.ReadImageInformation()
    return io


@dataclass(frozen=True)
class ItkGeometry:
    """A NRRD/MetaImage file's grid as ITK reads its header, in LPS (ITK's convention; a NRRD stated in another space
    is converted by ITK) and the file's own axis order: ``shape`` every dimension (vector components not among them),
    ``spacing`` and ``origin`` per axis, ``direction`` ``(NDims, NDims)`` with one column per axis (its unit
    direction). ``fedseg.data.volume_write`` writes a file on this grid, as ``grid`` reads it."""

    shape: tuple[int, ...]
    spacing: tuple[float, ...]
    origin: tuple[float, ...]
    direction: np.ndarray

    def grid(self) -> VoxelGrid:
        """The ``VoxelGrid``: the first three axes' LPS affine as RAS (a 2D grid embedded with a unit third axis)."""
        n = min(len(self.shape), 3)
        lps = np.eye(n + 1)
        lps[:n, :n] = self.direction[:n, :n] * np.asarray(self.spacing[:n])
        lps[:n, n] = self.origin[:n]
        return VoxelGrid(self.shape, LPS_TO_RAS @ _embed(lps))


def itk_geometry(path: Path) -> ItkGeometry:
    """The ``ItkGeometry`` of the NRRD or MetaImage file ``path`` from its header alone (no voxel is read);
    ``FederationError`` naming ``path`` if unreadable."""
    try:
        io = _itk_header(path)
    except FederationError:
        raise
    except Exception as e:  # noqa: BLE001 — any decoder failure means "corrupt file" to the user
        raise FederationError(f"{path}: cannot read ({type(e).__name__}: {e})") from None
    n = int(io.GetNumberOfDimensions())
    direction = np.stack([np.asarray(io.GetDirection(axis), dtype=np.float64)[:n] for axis in range(n)], axis=1)
    return ItkGeometry(
        tuple(int(io.GetDimensions(axis)) for axis in range(n)),
        tuple(float(io.GetSpacing(axis)) for axis in range(n)),
        tuple(float(io.GetOrigin(axis)) for axis in range(n)),
        direction,
    )


# the component types ITK Python wraps for multi-component (vector) images
_ITK_VECTOR_COMPONENTS = {"unsigned_char": "UC", "unsigned_short": "US", "short": "SS", "float": "F", "double": "D"}


def _itk_read_kwargs(path: Path) -> dict[str, Any]:
    """``itk.imread`` arguments for a file: a multi-component file is read as a ``VectorImage`` of its own
    component type (ITK Python's default pixel types cover few vector types)."""
    io = _itk_header(path)
    if int(io.GetNumberOfComponents()) == 1:
        return {}
    itk = load_itk(path)
    component = str(io.GetComponentTypeAsString(io.GetComponentType()))
    if component not in _ITK_VECTOR_COMPONENTS:
        raise FederationError(
            f"{path}: ITK Python cannot read {io.GetNumberOfComponents()}-component {component} images "
            f"(store the channels as {', '.join(_ITK_VECTOR_COMPONENTS)})"
        )
    return {"pixel_type": itk.VariableLengthVector[getattr(itk, _ITK_VECTOR_COMPONENTS[component])]}


_NIBABEL_LOGGER = threading.Lock()  # held while load_nifti silences nibabel's logger


def load_nifti(path: Path) -> SpatialImage:
    """``nibabel.load(path)`` without nibabel's header-fix messages (one per load, so a flood over a dataset), and a
    ``FederationError`` where nibabel would invent the voxel size: the header has no sform (the affine then comes
    from ``pixdim``, rotated by the qform if there is one), and a spatial ``pixdim`` is zero or not a
    number (nibabel sets it to 1 mm; HD95 and NSD in mm would be wrong)."""
    import nibabel as nib
    from nibabel.openers import ImageOpener

    fixes = nib.imageglobals.logger  # nibabel reports each header fix there; its own LoggingOutputSuppressor
    with _NIBABEL_LOGGER:  # one load at a time turns it off and back (cases are prepared in threads): headers only
        quiet, fixes.disabled = fixes.disabled, True  # leaves Python's last-resort handler printing them
        try:
            image = cast("SpatialImage", nib.load(path))
        finally:
            fixes.disabled = quiet
    header: Any = image.header  # a NIfTI-1 or NIfTI-2 header (nibabel's stubs type it as the generic one)
    if int(header.get("sform_code", 0)) == 0:  # the affine comes from pixdim (with the qform's rotation, if any)
        with ImageOpener(str(path)) as f:
            raw = type(header).from_fileobj(f, check=False)
        spatial = min(3, len(image.shape))
        pixdim = [float(x) for x in raw["pixdim"][1 : 1 + spatial]]
        if not all(np.isfinite(x) and x != 0 for x in pixdim):  # a negative one: nibabel takes its size, fine
            raise FederationError(
                f"{path}: voxel size {pixdim} (NIfTI pixdim, no sform) is zero or not a number; set the voxel size "
                "in mm in the header (nibabel: image.header.set_zooms)"
            )
    return image


def volume_grid(path: Path) -> VoxelGrid:
    """The grid of a volume file or DICOM series folder from its header(s) alone (no voxel is read).

    ``VoxelGrid.shape`` holds every axis of the file (channels of a NIfTI too); ``FederationError`` if unreadable.
    """
    path = Path(path)
    fmt = volume_format(path)
    if fmt == DICOM:
        return series_grid(path)
    try:
        if fmt in NIFTI_EXTS:
            image = load_nifti(path)
            return VoxelGrid(tuple(int(n) for n in image.shape), np.asarray(image.affine, dtype=np.float64))
        if fmt in ITK_EXTS:
            return itk_geometry(path).grid()
    except FederationError:
        raise
    except Exception as e:  # noqa: BLE001 — any decoder failure means "corrupt file" to the user
        raise FederationError(f"{path}: cannot read ({type(e).__name__}: {e})") from None
    raise FederationError(f"{path}: not a volume file (expected {', '.join(VOLUME_EXTS)} or a DICOM series folder)")


def channels_grid_problem(paths: Sequence[Path]) -> str | None:
    """One line naming the first of an image's channel files ``paths`` (one file per channel, the first channel first,
    as nnU-Net and FeTS store them) whose grid differs from the first file's: its shape, spacing, an axis flipped or
    its origin (``grid_mismatch``), as nnU-Net's own dataset check refuses it. From the headers alone (no voxel is
    read); ``None`` when they agree, for a single file, or when the first file is no volume (PNG, JPEG, npy: no grid,
    their shapes are compared when stacked). A header that cannot be read is that file's one line too (so an import
    collects it with its other problems)."""
    if len(paths) < 2 or volume_format(Path(paths[0])) is None:
        return None
    try:
        grids = [volume_grid(path) for path in paths]
    except FederationError as e:
        return str(e)
    first = grids[0]
    for path, grid in zip(paths[1:], grids[1:]):
        mismatch = f"shape {grid.shape} vs {first.shape}" if grid.shape != first.shape else grid_mismatch(grid, first)
        if mismatch is not None:
            return (
                f"{path}: not on the grid of the first channel {Path(paths[0]).name} ({mismatch}); the channel files "
                "of a case must share one grid (resample it onto the first)"
            )
    return None


def _itk_array(path: Path, what: str) -> tuple[np.ndarray, np.ndarray]:
    """``(array, RAS affine)`` of a file or DICOM folder read by MONAI's ``ITKReader`` in index order
    (``(*spatial)`` or ``(*spatial, components)``)."""
    load_itk(path, what)
    from monai.data import ITKReader

    reader = ITKReader(affine_lps_to_ras=True)
    data, meta = reader.get_data(reader.read(str(path), **({} if path.is_dir() else _itk_read_kwargs(path))))
    return np.asarray(data), _embed(np.asarray(meta["affine"], dtype=np.float64))


def _rescaled_per_slice(folder: Path) -> np.ndarray | None:
    """A DICOM series whose slices carry different RescaleSlope / RescaleIntercept (PET, some MR): ITK reads every
    slice in the first file's pixel type, an integer one where that slope is 1, and truncates the other slices'
    rescaled values (406.5 read as 406; a slope of 0.001 loses whole percents), so such a series is read here slice
    by slice, each file alone by ITK as float64 (GDCM applies that file's own slope and intercept, and decodes what
    ITK decodes: JPEG-Lossless...), in ``series_grid``'s axes (column, row, slice sorted along the normal). None where
    every slice shares them (ITK's array of the whole series is exact)."""
    itk = load_itk(folder, "a DICOM series")
    paths = series_entries(folder)
    headers = [read_dicom(p, stop_before_pixels=True) for p in paths]

    def rescale(ds: Any) -> tuple[float, float]:
        return float(getattr(ds, "RescaleSlope", 1.0) or 1.0), float(getattr(ds, "RescaleIntercept", 0.0) or 0.0)

    if len({rescale(ds) for ds in headers}) < 2:
        return None
    planes = [itk.array_from_image(itk.imread(str(paths[i]), itk.D)) for i in slice_order(headers)[0]]
    return np.stack([plane.reshape(plane.shape[-2:]).T for plane in planes], axis=2)  # (rows, columns) -> (i, j)


def read_volume(path: Path) -> np.ndarray:
    """The voxels of a volume file or DICOM series folder in the file's index order (module docstring):
    ``(*spatial, *rest)`` with any channel axes last, in the stored dtype (NIfTI scaling and DICOM
    rescale slope/intercept applied; a DICOM series whose slices rescale differently as float64).
    ``FederationError`` naming the path if it cannot be read (``SeriesError`` for a DICOM series' files)."""
    path = Path(path)
    fmt = volume_format(path)
    try:
        if fmt in NIFTI_EXTS:
            return np.asanyarray(load_nifti(path).dataobj)
        if fmt in ITK_EXTS:
            return _itk_array(path, f"a {path.suffix} file")[0]
        if fmt == DICOM:
            grid = series_grid(path)
            data, affine = _itk_array(path, "a DICOM series")
            axes_itk, axes_headers = (a[:3, :3] / np.linalg.norm(a[:3, :3], axis=0) for a in (affine, grid.affine))
            if data.shape[:3] != grid.shape or not np.allclose(axes_itk, axes_headers, atol=1e-3):
                raise SeriesError(
                    f"{path}: ITK read this series as shape {data.shape[:3]} but its headers describe {grid.shape} "
                    "on another grid (GDCM splits the folder's slices into several series)"
                )
            rescaled = _rescaled_per_slice(path)
            return data if rescaled is None else rescaled
    except FederationError:
        raise
    except Exception as e:  # noqa: BLE001 — any decoder failure means "corrupt file" to the user
        if fmt == "nrrd" and (cut := nrrd_truncated(path)) is not None:
            raise FederationError(cut) from None
        failed = SeriesError if fmt == DICOM else FederationError  # a series' slices ITK cannot decode
        raise failed(f"{path}: cannot read ({type(e).__name__}: {' '.join(str(e).split())[:300]})") from None
    raise FederationError(f"{path}: not a volume file (expected {', '.join(VOLUME_EXTS)} or a DICOM series folder)")


# --- MetaImage companions ----------------------------------------------------------------------------


def mhd_data_files(folder: Path) -> set[str]:
    """Names of the data files (``ElementDataFile``) that the ``.mhd`` headers in ``folder`` point to: they
    belong to their header and are no case of their own."""
    names = set()
    for header in folder.glob("*"):
        if header.name.lower().endswith(".mhd") and header.is_file():
            try:
                text = header.read_text(encoding="latin-1")[:10000]
            except OSError:
                continue
            for line in text.splitlines():
                key, _, value = line.partition("=")
                if key.strip() == "ElementDataFile" and value.strip() not in ("LOCAL", "LIST"):
                    names.add(Path(value.strip()).name)
    return names
