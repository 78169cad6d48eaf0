"""One case's files in the federation folder format (``fedseg.data.folder``): file names and the extensions read
(``IMAGE_EXTS``, ``LABEL_EXTS``), an image or a label map read as an array (``read_image``, ``read_label``), the
problems of one loaded case (``case_problems``, ``grid_problems``) and ``load_case``, a lazy case's loader.

Array conventions (what a case loader returns): image ``(C, *spatial)`` channel-first,
label ``(*spatial)`` integer, both in their stored dtype (a uint8 PNG stays uint8; a float
label map with integer values becomes the smallest integer dtype that holds them).

- PNG/JPEG: ``(H, W)`` -> ``(1, H, W)``; ``(H, W, k)`` (RGB, RGBA, ...) -> ``(k, H, W)``;
  palette PNGs are expanded to RGB for images and kept as indices for labels.
- NumPy ``.npy``: images are stored channel-first ``(C, *spatial)``; an array with only the
  spatial axes is a single-channel image. Labels are ``(*spatial)``.
- Volumes (NIfTI, NRRD, MetaImage ``.mha``/``.mhd`` + data file, a DICOM series folder): the voxel
  grid in the file's index order, no reorientation or resampling (``fedseg.data.readers`` states the
  rule and how DICOM slices are ordered). The first 2 (kind 2d) or 3 (kind 3d) axes are spatial, the
  remaining axes (NIfTI's 4th/5th, vector components) hold the channels (at most one of them longer
  than 1): ``(X, Y, Z) -> (1, X, Y, Z)``, ``(X, Y, Z, C) -> (C, X, Y, Z)``, ``(X, Y, 1, C) -> (C, X, Y)``.
  Spacing (mm per array axis) comes from the header (``fedseg.data.volumes.file_spacing``).
- DICOM-SEG labels (``labels/<case>.dcm``): drawn on the case's image grid, each segment's pixels get
  its label value: the segment number, or, when every segment's label is one of ``label_names``, the
  value of that name (``fedseg.data.dicom_seg.segment_values``); segments that each name a region (nested ones
  overlap) are painted from their region masks as a prediction is (``dicom_seg.read_dicom_seg``).
- RT Structure Set labels (``labels/<case>.dcm``, Modality RTSTRUCT): the contours of the ROIs that ``label_names``
  names, painted on the case's image grid (``fedseg.data.rtstruct``).

Every reader raises ``FederationError("<path>: <problem>")``; ``fedseg.data.check`` uses the
same functions to validate a folder before training.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import numpy as np

from fedseg.data import dicom_seg, readers, rtstruct, voxel_grid
from fedseg.data.federation import FederationError, Regions

IMAGE_EXTS = ("nii.gz", "nii", "png", "jpg", "jpeg", "npy", *readers.ITK_EXTS)  # and DICOM series folders
LABEL_EXTS = ("nii.gz", "nii", "png", "npy", *readers.ITK_EXTS, readers.SEG_EXT)
PIL_EXTS = ("png", "jpg", "jpeg")


# --- file names --------------------------------------------------------------------------------


def split_name(filename: str, exts: tuple[str, ...] = IMAGE_EXTS) -> tuple[str, str] | None:
    """``"a.nii.gz" -> ("a", "nii.gz")``; ``None`` if the extension (case-insensitive) is not in ``exts``."""
    lower = filename.lower()
    for ext in exts:
        if lower.endswith("." + ext) and len(filename) > len(ext) + 1:
            return filename[: -len(ext) - 1], ext
    return None


DCM_IMAGE_HINT = "a DICOM image is a series folder images/<case>/ holding its .dcm files (a .dcm file is a label)"
_ALL_EXTS = tuple(dict.fromkeys(IMAGE_EXTS + LABEL_EXTS))


def _ext(path: Path) -> str:
    """The format of ``path``: its extension (lower case), ``readers.DICOM`` for a folder."""
    if path.is_dir():
        return readers.DICOM
    found = split_name(path.name, _ALL_EXTS)
    if found is None:
        raise FederationError(f"{path}: unsupported file type (expected one of {', '.join(_ALL_EXTS)})")
    return found[1].lower()


def _is_volume(ext: str) -> bool:
    return ext in readers.VOLUME_EXTS or ext == readers.DICOM


# --- reading arrays ----------------------------------------------------------------------------


def read_array(path: Path, *, as_label: bool = False) -> np.ndarray:
    """Read a file's array as stored, dispatching on the extension.

    PNG/JPEG -> ``(H, W)`` or ``(H, W, k)``; npy -> the stored array; volumes (NIfTI, NRRD, MetaImage,
    a DICOM series folder) -> ``(*spatial, *channels)`` in the file's index order (``readers.read_volume``;
    NIfTI scaling applied); a DICOM-SEG -> its frames ``(frames, rows, columns)``; an RTSTRUCT -> its contour
    points ``(n, 3)`` in LPS mm (it has no voxels without its image). Palette PNGs give RGB
    for images and their indices for labels; 1-bit PNGs 0/255 for images and 0/1 for labels.
    Raises ``FederationError`` for an unsupported extension or an unreadable/corrupt file.
    """
    path = Path(path)
    ext = _ext(path)
    if _is_volume(ext):
        return readers.read_volume(path)
    if ext == readers.SEG_EXT:
        return rtstruct.contour_points(path) if rtstruct.is_rtstruct(path) else dicom_seg.read_seg_frames(path)
    try:
        if ext in PIL_EXTS:
            from PIL import Image

            with Image.open(path) as img:
                img.load()
                pixels: Image.Image = img
                if img.mode == "1" and as_label:  # a bilevel mask: 0/1 (as "L" it read 0/255, no region's value)
                    return np.asarray(img).astype(np.uint8)
                if img.mode == "1" or (img.mode == "P" and not as_label):
                    pixels = img.convert("L" if img.mode == "1" else "RGB")
                return np.asarray(pixels)
        return np.load(path, allow_pickle=False)
    except Exception as e:  # noqa: BLE001 — any decoder failure means "corrupt file" to the user
        raise FederationError(f"{path}: cannot read ({type(e).__name__}: {e})") from None


def _spatial_dims(kind: str) -> int:
    return 2 if kind == "2d" else 3


def _channels_last(data: np.ndarray, sd: int, path: Path, what: str) -> np.ndarray:
    """A volume's ``(*spatial, *rest)`` -> ``(*spatial, C)`` with ``C = prod(rest)``;
    at most one non-singleton ``rest`` axis."""
    rest = data.shape[sd:]
    if data.ndim < sd or sum(n > 1 for n in rest) > 1:
        raise FederationError(f"{path}: cannot read a {sd}D {what} from volume data of shape {data.shape}")
    return data.reshape(data.shape[:sd] + (int(np.prod(rest, dtype=int)),))


def read_image(path: Path, kind: Literal["2d", "3d"]) -> np.ndarray:
    """Read an image file as a channel-first array ``(C, *spatial)`` in its stored dtype.

    The channel count is not checked here (see ``case_problems``): an RGBA PNG gives 4 channels.
    """
    path = Path(path)
    if _ext(path) == readers.SEG_EXT:
        raise FederationError(f"{path}: {DCM_IMAGE_HINT}")
    data, ext, sd = read_array(path), _ext(path), _spatial_dims(kind)
    if not (np.issubdtype(data.dtype, np.number) or data.dtype == bool) or np.issubdtype(
        data.dtype, np.complexfloating
    ):
        raise FederationError(f"{path}: image dtype {data.dtype} is not a real number type")
    if ext in PIL_EXTS:
        if kind != "2d":
            raise FederationError(f"{path}: a {ext.upper()} image is 2D but federation.yaml says kind: {kind}")
        return data[None] if data.ndim == 2 else np.moveaxis(data, -1, 0)
    if ext == "npy":
        if data.ndim == sd:
            return data[None]
        if data.ndim != sd + 1:
            raise FederationError(
                f"{path}: expected a channel-first array (C, {'H, W' if sd == 2 else 'D, H, W'}) "
                f"for kind {kind}, got shape {data.shape}"
            )
        return data
    return np.moveaxis(_channels_last(data, sd, path, "image"), -1, 0)


def _as_integer_labels(label: np.ndarray, path: Path) -> np.ndarray:
    """Integer label maps pass unchanged; bool -> uint8; float maps with integer values -> smallest integer dtype."""
    if label.dtype == bool:
        return label.astype(np.uint8)
    if np.issubdtype(label.dtype, np.integer):
        return label
    if not np.issubdtype(label.dtype, np.floating):
        raise FederationError(f"{path}: label map dtype {label.dtype} is not an integer type")
    finite = np.isfinite(label)
    if not finite.all():
        raise FederationError(f"{path}: label map is not integer ({int((~finite).sum())} NaN/inf values)")
    fractional = label != np.round(label)
    if fractional.any():
        example = float(label[fractional].flat[0])
        raise FederationError(
            f"{path}: label map is not integer (dtype {label.dtype}, "
            f"{int(fractional.sum())} fractional values, e.g. {example:g})"
        )
    if label.size == 0:
        return label.astype(np.uint8)
    lo, hi = int(label.min()), int(label.max())
    return label.astype(np.result_type(np.min_scalar_type(lo), np.min_scalar_type(hi)))


def read_label(
    path: Path,
    kind: Literal["2d", "3d"],
    *,
    image: Path | None = None,
    label_names: dict[int, str] | None = None,
    regions: Regions | None = None,
    label_synonyms: dict[int, tuple[str, ...]] | None = None,
) -> np.ndarray:
    """Read a label file as an integer map ``(*spatial)``. JPEG is refused (lossy).

    A DICOM-SEG (``.dcm``) is drawn on ``image``'s grid (its case's image: a DICOM series, NIfTI, NRRD or
    MetaImage), segment numbers mapped to label values with ``label_names`` (``dicom_seg.segment_values``), or
    segments that name the federation's ``regions`` painted as a prediction is (``dicom_seg.read_dicom_seg``); an RT
    Structure Set (``.dcm``, Modality RTSTRUCT) is painted on the same grid, its ROIs named in ``label_names``
    taking their values (``rtstruct.read_rtstruct``). ``label_synonyms``: a label value's other names (after its
    ``label_names`` name), matched as that name is when SEG segments and RTSTRUCT ROIs are read.
    """
    path = Path(path)
    if path.is_dir() or split_name(path.name, LABEL_EXTS) is None:
        raise FederationError(f"{path}: unsupported label file type (labels must be lossless: {', '.join(LABEL_EXTS)})")
    ext, sd = _ext(path), _spatial_dims(kind)
    if ext == readers.SEG_EXT:
        data = _seg_label(path, image, label_names, regions, label_synonyms)
    else:
        data = read_array(path, as_label=True)
    if _is_volume(ext) or ext == readers.SEG_EXT:
        data = _channels_last(data, sd, path, "label map")
        if data.shape[-1] != 1:
            raise FederationError(f"{path}: label map must have one channel, the volume has {data.shape[-1]}")
        data = data[..., 0]
    if data.ndim != sd:
        raise FederationError(
            f"{path}: label map must be a single-channel {sd}D array for kind {kind}, got shape {data.shape}"
        )
    return _as_integer_labels(data, path)


def _seg_label(
    path: Path,
    image: Path | None,
    label_names: dict[int, str] | None,
    regions: Regions | None,
    synonyms: dict[int, tuple[str, ...]] | None = None,
) -> np.ndarray:
    """A DICOM-SEG (``dicom_seg.read_dicom_seg``) or RT Structure Set (``rtstruct.read_rtstruct``) label on ``image``'s
    grid."""
    structures = rtstruct.is_rtstruct(path)
    what = "an RTSTRUCT" if structures else "a DICOM-SEG"
    if image is None:
        raise FederationError(f"{path}: {what} label is read on its case's image grid, but no image was given")
    image = Path(image)
    if not _is_volume(_ext(image)):
        raise FederationError(
            f"{path}: {what} label needs an image with a patient-space grid (DICOM series, NIfTI, NRRD, "
            f"MetaImage), but {image} is a {_ext(image).upper()} file"
        )
    if structures:
        return rtstruct.read_rtstruct(path, readers.volume_grid(image), image, label_names, synonyms)
    return dicom_seg.read_dicom_seg(path, readers.volume_grid(image), image, label_names, regions, synonyms)


def case_problems(image: np.ndarray, label: np.ndarray, image_path: Path, label_path: Path, channels: int) -> list[str]:
    """Problems of one loaded case, one line each: wrong channel count, NaN or Inf pixels (normalization would turn
    the image to zeros, or training to NaN), image/label spatial shape mismatch."""
    problems = []
    if np.issubdtype(image.dtype, np.floating) and not (finite := np.isfinite(image)).all():
        nan, inf = int(np.isnan(image).sum()), int((~finite).sum() - np.isnan(image).sum())
        problems.append(f"{image_path}: image has {nan} NaN and {inf} Inf values (of {image.size}); replace them")
    if image.shape[0] != channels:
        hint = (
            " (RGBA: store RGB, or set channels: 4)"
            if image.shape[0] == 4 and split_name(image_path.name, PIL_EXTS)
            else ""
        )
        problems.append(
            f"{image_path}: image has {image.shape[0]} channels but federation.yaml says channels: {channels}{hint}"
        )
    if image.shape[1:] != label.shape:
        problems.append(
            f"{image_path}: image spatial shape {tuple(image.shape[1:])} "
            f"does not match label {label_path} shape {tuple(label.shape)}"
        )
    return problems


def grid_problems(image_path: Path, label_path: Path) -> list[str]:
    """A volume image and its label on different grids (an axis flipped, another origin or spacing), one line;
    shapes can agree while the voxels do not. Compared from the headers (no voxel read) by ``voxel_grid.grid_mismatch``.
    Nothing for 2D files, or a DICOM-SEG label (placed on its image's grid when read)."""
    if not (_is_volume(_ext(image_path)) and _is_volume(_ext(label_path))) or _ext(label_path) == readers.DICOM:
        return []
    mismatch = voxel_grid.grid_mismatch(readers.volume_grid(label_path), readers.volume_grid(image_path))
    if mismatch is None:
        return []
    return [
        f"{label_path}: label grid does not match image {image_path} ({mismatch}): resample the label onto the image"
    ]


def load_case(
    image_path: Path,
    label_path: Path,
    kind: Literal["2d", "3d"],
    channels: int,
    label_names: dict[int, str] | None = None,
    regions: Regions | None = None,
    label_synonyms: dict[int, tuple[str, ...]] | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Read one case -> ``(image (C, *spatial), label (*spatial))``; raises ``FederationError`` if malformed.
    ``label_names``, ``regions``, ``label_synonyms``: the federation's, for a DICOM-SEG label's segments and an
    RTSTRUCT's ROIs (``read_label``)."""
    image = read_image(image_path, kind)
    label = read_label(
        label_path, kind, image=image_path, label_names=label_names, regions=regions, label_synonyms=label_synonyms
    )
    problems = case_problems(image, label, image_path, label_path, channels) or grid_problems(image_path, label_path)
    if problems:
        raise FederationError("\n".join(problems))
    return image, label
