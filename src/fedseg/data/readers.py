"""Volume files: NIfTI, NRRD, MetaImage (``.mha``/``.mhd``) and DICOM series (DICOM-SEG label maps:
:mod:`fedseg.data.dicom_seg`).

``fedseg.data.case_files`` reads every format through this module: ``read_volume`` (the voxels) and
``volume_grid`` (where they lie, from the header alone; a NRRD/MetaImage's as ITK states it: ``itk_geometry``, which
``fedseg.data.volume_write`` writes back for ``fedseg predict``'s masks), and through ``dicom_seg.read_dicom_seg``
(a DICOM-SEG drawn on an image's grid). Readers: NIfTI with nibabel (as before), NRRD/MetaImage and DICOM series
with MONAI's ``ITKReader`` (the reader ``monai.transforms.LoadImage`` uses; called directly so that the stored dtype is
kept, where ``LoadImage``'s tensor turns uint16 into int32), DICOM headers (a series' grid and what it refuses:
:mod:`fedseg.data.dicom_series`) and DICOM-SEG with pydicom. The grid type: :mod:`fedseg.data.voxel_grid`.
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

import logging
import threading
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any, cast

import numpy as np

from fedseg.data.dicom_series import SeriesError, read_dicom, series_entries, series_grid, slice_order
from fedseg.data.federation import FederationError
from fedseg.data.optional_modules import require_module
from fedseg.data.voxel_grid import LPS_TO_RAS, VoxelGrid, embed_affine, grid_mismatch

log = logging.getLogger("fedseg.data.readers")

if TYPE_CHECKING:
    from nibabel.spatialimages import SpatialImage

NIFTI_EXTS = ("nii.gz", "nii")
ITK_EXTS = ("nrrd", "mha", "mhd")  # read with ITK
VOLUME_EXTS = NIFTI_EXTS + ITK_EXTS  # single-file volumes (images and labels)
SEG_EXT = "dcm"  # a DICOM-SEG label map: labels/<case>.dcm
DICOM = "dicom"  # the format name of a DICOM series folder (images/<case>/)


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
    itk = require_module("itk", path or Path("."), what)
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
        return VoxelGrid(self.shape, LPS_TO_RAS @ embed_affine(lps))


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
    return np.asarray(data), embed_affine(np.asarray(meta["affine"], dtype=np.float64))


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
