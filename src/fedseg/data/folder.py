"""The on-disk federation format (``folder``): read it lazily, write it exactly.

::

    ROOT/federation.yaml                       name, kind (2d|3d), channels, regions, [label_names],
                                               [channel_names], [sites]
    ROOT/<site>/images/<case>.<png|jpg|jpeg|npy|nii|nii.gz|nrrd|mha|mhd>, or images/<case>/ (a DICOM series)
    ROOT/<site>/labels/<case>.<png|npy|nii|nii.gz|nrrd|mha|mhd|dcm>      integer label map (.dcm: DICOM-SEG or
                                                                          RTSTRUCT)
    ROOT/<site>/splits.csv                     optional, header ``case,split``
    ROOT/<site>/cases.csv                      optional case-level metadata, header ``case,<any columns>``

``sites:`` in ``federation.yaml`` holds optional site-level metadata (``sites: {site1: {grade: LGG}}``);
see ``fedseg.data.metadata`` for both kinds of metadata. ``channel_names`` (optional) names what each image channel
holds, in channel order (``[T1, FLAIR]``: one non-empty name per channel): a trained bundle records it, and
``fedseg predict`` refuses nnU-Net images whose ``dataset.json`` orders the channels otherwise. Without it (older
folders, sources that do not say) the channels are known by their number only.

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
  value of that name (``fedseg.data.readers.segment_values``); segments that each name a region (nested ones
  overlap) are painted from their region masks as a prediction is (``readers.read_dicom_seg``).
- RT Structure Set labels (``labels/<case>.dcm``, Modality RTSTRUCT): the contours of the ROIs that ``label_names``
  names, painted on the case's image grid (``fedseg.data.rtstruct``).

Every reader raises ``FederationError("<path>: <problem>")``; ``fedseg.data.check`` uses the
same functions to validate a folder before training.
"""

from __future__ import annotations

import contextlib
import functools
import os
import re
import shlex
import shutil
import tempfile
from collections.abc import Collection, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np
import yaml

from fedseg.atomic_files import naming_errors
from fedseg.data import readers, rtstruct
from fedseg.data.federation import Case, Federation, FederationError, Regions, Site, Split
from fedseg.data.metadata import (
    CASES_FILE,
    GROUP,
    cases_csv_table,
    read_cases_csv,
    read_site_metadata,
    site_metadata_for_yaml,
    site_metadata_problems,
    write_cases_csv,
)
from fedseg.data.splits import Splits, group_split_problems, read_site_splits_csv, write_site_splits_csv
from fedseg.data.structured import read_yaml

IMAGE_EXTS = ("nii.gz", "nii", "png", "jpg", "jpeg", "npy", *readers.ITK_EXTS)  # and DICOM series folders
LABEL_EXTS = ("nii.gz", "nii", "png", "npy", *readers.ITK_EXTS, readers.SEG_EXT)
HEADER_FILE = "federation.yaml"
SPLITS_FILE = "splits.csv"
HEADER_KEYS = ("name", "kind", "channels", "regions", "label_names", "channel_names", "sites")
_PIL_EXTS = ("png", "jpg", "jpeg")


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
    for images and their indices for labels.
    Raises ``FederationError`` for an unsupported extension or an unreadable/corrupt file.
    """
    path = Path(path)
    ext = _ext(path)
    if _is_volume(ext):
        return readers.read_volume(path)
    if ext == readers.SEG_EXT:
        return rtstruct.contour_points(path) if rtstruct.is_rtstruct(path) else readers.read_seg_frames(path)
    try:
        if ext in _PIL_EXTS:
            from PIL import Image

            with Image.open(path) as img:
                img.load()
                pixels: Image.Image = img
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
    if ext in _PIL_EXTS:
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
) -> np.ndarray:
    """Read a label file as an integer map ``(*spatial)``. JPEG is refused (lossy).

    A DICOM-SEG (``.dcm``) is drawn on ``image``'s grid (its case's image: a DICOM series, NIfTI, NRRD or
    MetaImage), segment numbers mapped to label values with ``label_names`` (``readers.segment_values``), or
    segments that name the federation's ``regions`` painted as a prediction is (``readers.read_dicom_seg``); an RT
    Structure Set (``.dcm``, Modality RTSTRUCT) is painted on the same grid, its ROIs named in ``label_names``
    taking their values (``rtstruct.read_rtstruct``).
    """
    path = Path(path)
    if path.is_dir() or split_name(path.name, LABEL_EXTS) is None:
        raise FederationError(f"{path}: unsupported label file type (labels must be lossless: {', '.join(LABEL_EXTS)})")
    ext, sd = _ext(path), _spatial_dims(kind)
    if ext == readers.SEG_EXT:
        data = _seg_label(path, image, label_names, regions)
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
    path: Path, image: Path | None, label_names: dict[int, str] | None, regions: Regions | None
) -> np.ndarray:
    """A DICOM-SEG (``readers.read_dicom_seg``) or RT Structure Set (``rtstruct.read_rtstruct``) label on ``image``'s
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
        return rtstruct.read_rtstruct(path, readers.volume_grid(image), image, label_names)
    return readers.read_dicom_seg(path, readers.volume_grid(image), image, label_names, regions)


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
            if image.shape[0] == 4 and split_name(image_path.name, _PIL_EXTS)
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
    shapes can agree while the voxels do not. Compared from the headers (no voxel read) by ``readers.grid_mismatch``.
    Nothing for 2D files, or a DICOM-SEG label (placed on its image's grid when read)."""
    if not (_is_volume(_ext(image_path)) and _is_volume(_ext(label_path))) or _ext(label_path) == readers.DICOM:
        return []
    mismatch = readers.grid_mismatch(readers.volume_grid(label_path), readers.volume_grid(image_path))
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
) -> tuple[np.ndarray, np.ndarray]:
    """Read one case -> ``(image (C, *spatial), label (*spatial))``; raises ``FederationError`` if malformed.
    ``label_names``, ``regions``: the federation's, for a DICOM-SEG label's segments (``read_label``)."""
    image = read_image(image_path, kind)
    label = read_label(label_path, kind, image=image_path, label_names=label_names, regions=regions)
    problems = case_problems(image, label, image_path, label_path, channels) or grid_problems(image_path, label_path)
    if problems:
        raise FederationError("\n".join(problems))
    return image, label


# --- federation.yaml -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Header:
    """The contents of ``federation.yaml``."""

    name: str
    kind: Literal["2d", "3d"]
    channels: int
    regions: Regions
    label_names: dict[int, str] | None = None
    sites: dict[str, dict[str, object]] = field(default_factory=dict)  # site-level metadata, by site name
    channel_names: list[str] | None = None  # what each channel holds, in channel order; None: not said


def _is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _header_problems(data: dict, site_names: Collection[str] | None = None) -> list[str]:
    """Problems of a parsed ``federation.yaml`` mapping, without the file name prefix."""
    problems = [f"missing key {k!r}" for k in HEADER_KEYS[:4] if k not in data]
    problems += [f"unknown key {k!r} (allowed: {', '.join(HEADER_KEYS)})" for k in data if k not in HEADER_KEYS]
    if "name" in data and not (isinstance(data["name"], str) and data["name"].strip()):
        problems.append(f"name: expected a non-empty string, got {data['name']!r}")
    if "kind" in data and data["kind"] not in ("2d", "3d"):
        problems.append(f"kind: expected 2d or 3d, got {data['kind']!r}")
    if "channels" in data and not (_is_int(data["channels"]) and data["channels"] > 0):
        problems.append(f"channels: expected a positive integer, got {data['channels']!r}")
    if "regions" in data:
        regions = data["regions"]
        if not isinstance(regions, dict):
            problems.append(f"regions: expected a mapping region name -> list of label values, got {regions!r}")
        elif not regions:
            problems.append("regions: empty; at least one region is required")
        else:
            for name, vals in regions.items():
                if not isinstance(vals, list) or not vals or not all(_is_int(v) and v > 0 for v in vals):
                    problems.append(
                        f"regions.{name}: expected a non-empty list of positive integer label values, got {vals!r}"
                    )
    names = data.get("label_names")
    if names is not None:
        if not isinstance(names, dict) or not all(
            _is_int(k) and k >= 0 and isinstance(v, str) for k, v in names.items()
        ):
            problems.append(f"label_names: expected a mapping label value (integer >= 0) -> name, got {names!r}")
    if data.get("channel_names") is not None:
        problems += channel_names_problems(data["channel_names"], data.get("channels"))
    if data.get("sites") is not None:
        problems += site_metadata_problems(data["sites"], site_names)
    return problems


def channel_names_problems(names: Any, channels: Any) -> list[str]:
    """``channel_names`` that is not a list of ``channels`` non-empty strings (one per channel, in channel order; two
    may be equal, as an nnU-Net dataset's ``noNorm, noNorm``): one line saying what was expected and what was found;
    the count is checked only against a valid ``channels``."""
    count = channels if _is_int(channels) and channels > 0 else None
    expected = f"a list of {count if count else 'the'} channel names, one per channel in channel order"
    if not isinstance(names, list) or not all(isinstance(n, str) and n.strip() for n in names):
        return [f"channel_names: expected {expected} (e.g. [T1, FLAIR]), got {names!r}"]
    if count is not None and len(names) != count:
        return [f"channel_names: lists {len(names)} names ({', '.join(names)}) but channels is {count}"]
    return []


def read_header(root: str | Path, site_names: Collection[str] | None = None) -> Header:
    """Read and validate ``ROOT/federation.yaml``; raises ``FederationError`` listing every problem.

    With ``site_names`` (the site folders found), ``sites:`` may only name those sites.
    """
    path = Path(root) / HEADER_FILE
    data = read_yaml(
        path, f"every federation folder needs a {HEADER_FILE}", f"a mapping with keys {', '.join(HEADER_KEYS)}"
    )
    problems = _header_problems(data, site_names)
    if problems:
        raise FederationError("\n".join(f"{path}: {p}" for p in problems))
    names = data.get("label_names")
    return Header(
        name=data["name"],
        kind=data["kind"],
        channels=data["channels"],
        regions=Regions.from_mapping(data["regions"]),
        label_names={int(k): v for k, v in names.items()} if names else None,
        sites=read_site_metadata(data.get("sites")),
        channel_names=list(data["channel_names"]) if data.get("channel_names") is not None else None,
    )


def write_header(root: Path, fed: Federation) -> None:
    """``ROOT/federation.yaml`` of ``fed``; ``channel_names`` written when known (checked as ``read_header`` checks
    it: ``FederationError`` before anything is written)."""
    data: dict[str, Any] = {
        "name": fed.name,
        "kind": fed.kind,
        "channels": int(fed.channels),
        "regions": fed.regions.as_dict(),
    }
    if fed.label_names:
        data["label_names"] = {int(k): str(v) for k, v in fed.label_names.items()}
    if fed.channel_names is not None:
        names = list(fed.channel_names)
        if problems := channel_names_problems(names, int(fed.channels)):
            raise FederationError(f"federation {fed.name!r}: {problems[0]}")
        data["channel_names"] = [str(n) for n in names]
    sites = {site.name: site_metadata_for_yaml(site) for site in fed.sites if site.meta}
    if sites:
        data["sites"] = sites
    (root / HEADER_FILE).write_text(yaml.safe_dump(data, sort_keys=False, default_flow_style=None), encoding="utf-8")


# --- scanning sites --------------------------------------------------------------------------------


@dataclass
class SiteFiles:
    """One site folder's paired files: ``cases`` maps case id -> (image path, label path), sorted by id;
    ``case_meta``: the case-level metadata read from ``cases_csv`` (case id -> column -> value)."""

    name: str
    dir: Path
    cases: dict[str, tuple[Path, Path]] = field(default_factory=dict)
    splits_csv: Path | None = None
    cases_csv: Path | None = None
    case_meta: dict[str, dict[str, str]] = field(default_factory=dict)


def _list_files(
    folder: Path, exts: tuple[str, ...], what: str, problems: list[str]
) -> tuple[dict[str, Path], set[str]]:
    """Case id -> file in ``folder`` (hidden files ignored); returns ``(files, ambiguous ids)`` and appends problems.

    In ``images/``, a sub-folder is a DICOM series whose case id is the folder's name; the data files
    of ``.mhd`` headers are part of their header (``readers.mhd_data_files``)."""
    if not folder.is_dir():
        what = "is a file, not a folder" if os.path.lexists(folder) else "missing"
        problems.append(f"{folder}: {what} (a site holds an images/ and a labels/ folder)")
        return {}, set()
    found: dict[str, list[Path]] = {}
    companions = readers.mhd_data_files(folder)
    for path in sorted(folder.iterdir()):
        if path.name.startswith(".") or (path.name in companions and path.is_file()):
            continue
        if path.is_dir() and what == "image":
            problem = readers.series_folder_problem(path)
            if problem is not None:
                problems.append(problem)
            else:
                found.setdefault(path.name, []).append(path)
            continue
        if not path.is_file() and not path.is_dir():
            problems.append(f"{path}: neither a file nor a folder (a broken symbolic link or a link loop)")
            continue
        parsed = split_name(path.name, exts) if path.is_file() else None
        if parsed is None:
            hint = f"; {DCM_IMAGE_HINT}" if path.name.lower().endswith(".dcm") else ""
            problems.append(
                f"{path}: unsupported {what} file (expected a file ending in {', '.join('.' + e for e in exts)}){hint}"
            )
            continue
        found.setdefault(parsed[0], []).append(path)
    ambiguous = {cid for cid, paths in found.items() if len(paths) > 1}
    for cid in sorted(ambiguous):
        problems.append(f"{folder}: duplicate case id {cid!r} ({', '.join(p.name for p in found[cid])})")
    return {cid: paths[0] for cid, paths in found.items() if cid not in ambiguous}, ambiguous


def scan_site(site_dir: Path) -> tuple[SiteFiles, list[str]]:
    """Pair ``images/`` and ``labels/`` of one site folder by case id; returns the pairs and every problem found
    (a folder with neither: one line saying it is not a site, e.g. a ``notes/`` folder beside the sites)."""
    problems: list[str] = []
    if not (site_dir / "images").exists() and not (site_dir / "labels").exists():
        problems.append(
            f"{site_dir}: not a site folder (no images/ and no labels/); every folder of a federation is a site: move "
            "it out, or hide it with a name starting with '.'"
        )
        return SiteFiles(site_dir.name, site_dir), problems
    images, bad_images = _list_files(site_dir / "images", IMAGE_EXTS, "image", problems)
    labels, bad_labels = _list_files(site_dir / "labels", LABEL_EXTS, "label", problems)
    for cid in sorted(set(images) - set(labels) - bad_labels):
        problems.append(f"{images[cid]}: image without label (no labels/{cid}.<{'|'.join(LABEL_EXTS)}>)")
    for cid in sorted(set(labels) - set(images) - bad_images):
        problems.append(f"{labels[cid]}: label without image (no images/{cid}.<{'|'.join(IMAGE_EXTS)}>)")
    cases = {cid: (images[cid], labels[cid]) for cid in sorted(set(images) & set(labels))}
    if not cases:
        problems.append(f"{site_dir}: empty site (no case with both an image and a label)")
    splits_csv = _site_file(site_dir / SPLITS_FILE, "the site's fixed splits, header case,split", problems)
    cases_csv = _site_file(site_dir / CASES_FILE, "the site's case metadata, header case,<columns>", problems)
    return SiteFiles(site_dir.name, site_dir, cases, splits_csv, cases_csv), problems


def _site_file(path: Path, holds: str, problems: list[str]) -> Path | None:
    """``path``, an optional file of a site (``splits.csv``, ``cases.csv``; ``holds``: what it holds), if it is
    one; else None, with a problem when something else bears its name (a folder, a broken link): ignoring it would
    pass a folder whose splits or metadata are silently not there."""
    if path.is_file():
        return path
    if os.path.lexists(path):
        what = "a folder" if path.is_dir() else "neither a file nor a folder (a broken symbolic link or a link loop)"
        problems.append(f"{path}: is {what}, not a file ({holds})")
    return None


def scan_sites(root: str | Path) -> tuple[list[SiteFiles], list[str]]:
    """Scan every site sub-folder of ``root`` (sorted by name, hidden folders ignored)."""
    root = Path(root)
    if not root.is_dir():
        return [], [f"{root}: not a folder"]
    sites, problems = [], []
    # a folder named federation.yaml is no site: read_header names it
    for site_dir in sorted(
        p for p in root.iterdir() if p.is_dir() and not p.name.startswith(".") and p.name != HEADER_FILE
    ):
        site, site_problems = scan_site(site_dir)
        sites.append(site)
        problems += site_problems
    if not sites:
        problems.append(f"{root}: no site folders (expected ROOT/<site>/images and ROOT/<site>/labels)")
    return sites, problems


def build_federation(
    header: Header,
    sites: list[SiteFiles],
    fixed_splits: dict[str, dict[str, Split]],
    meta: dict[tuple[str, str], dict[str, Any]] | None = None,
) -> Federation:
    """Federation with lazy cases: each ``Case.loader`` is a picklable ``load_case`` partial.

    ``Case.meta`` holds ``image`` and ``label`` (file paths as strings), the case's ``cases.csv``
    columns (``site.case_meta``) and ``meta[(site, case)]``; ``Site.meta`` is the header's
    ``sites:`` entry.
    """
    meta = meta or {}

    def case(site: SiteFiles, cid: str, image: Path, label: Path) -> Case:
        loader = functools.partial(
            load_case, image, label, header.kind, header.channels, header.label_names, header.regions
        )
        files = {"image": str(image), "label": str(label)}
        return Case(cid, loader, {**files, **site.case_meta.get(cid, {}), **meta.get((site.name, cid), {})})

    return Federation(
        name=header.name,
        kind=header.kind,
        channels=header.channels,
        regions=header.regions,
        sites=[
            Site(
                s.name,
                [case(s, cid, *paths) for cid, paths in s.cases.items()],
                fixed_splits.get(s.name),
                dict(header.sites.get(s.name, {})),
            )
            for s in sites
        ],
        label_names=header.label_names,
        channel_names=None if header.channel_names is None else list(header.channel_names),
    )


def scan_folder(
    root: str | Path, *, all_sites: bool = True
) -> tuple[Header | None, list[SiteFiles], dict[str, dict[str, Split]], list[str]]:
    """Read ``federation.yaml``, pair every site's files and read the sites' ``splits.csv`` and ``cases.csv``.

    Returns ``(header or None if invalid, sites, fixed splits per site, problems)``; a site whose
    ``splits.csv`` is invalid gets no fixed splits, one whose ``cases.csv`` is invalid no case
    metadata (``SiteFiles.case_meta``). A ``splits.csv`` that puts the cases of one ``group``
    (``cases.csv``) in different splits is a problem. No image or label is read.

    ``all_sites``: the folder holds every site of the federation, so ``federation.yaml``'s
    ``sites:`` may only name site folders found here; ``False`` for a folder with only some of
    them (a hospital's copy in a Flower deployment: the coordinator's ``federation.yaml`` and
    its own site folder).
    """
    root = Path(root)
    sites, problems = scan_sites(root)
    try:
        header = read_header(root, [s.name for s in sites] if sites and all_sites else None)
    except FederationError as e:
        header, problems = None, str(e).splitlines() + problems
    fixed: dict[str, dict[str, Split]] = {}
    for site in sites:
        if site.splits_csv is not None:
            try:
                fixed[site.name] = read_site_splits_csv(site.splits_csv, site.cases)
            except FederationError as e:
                problems += str(e).splitlines()
        if site.cases_csv is not None:
            try:
                site.case_meta = read_cases_csv(site.cases_csv, site.cases)
            except FederationError as e:
                problems += str(e).splitlines()
        if site.splits_csv is not None and site.name in fixed and site.case_meta:
            groups = {cid: cols[GROUP] for cid, cols in site.case_meta.items() if cols.get(GROUP)}
            problems += [f"{site.splits_csv}: {p}" for p in group_split_problems(fixed[site.name], groups)]
    return header, sites, fixed, problems


SHOWN_PER_KIND = 3


def _problem_kind(line: str) -> str:
    """What a problem line says once its location is removed: the text after the leading
    ``"<path>: "`` / ``"<path>:<line>: "`` / ``"site '<name>': "``, with path-like words
    (anything containing ``/``), quoted names (case ids) and numbers blanked, so the same check
    failing on many files gives the same kind."""
    _, sep, rest = line.partition(": ")
    text = rest if sep else line
    text = re.sub(r"\S*[/\\]\S*", "<path>", text)
    text = re.sub(r"'[^']*'", "'…'", text)
    return re.sub(r"\d+", "#", text)


def group_problems(problems: list[str], shown: int = SHOWN_PER_KIND) -> list[str]:
    """``problems`` grouped by kind (see ``_problem_kind``), in order of first appearance: the first
    ``shown`` lines of each kind in full, then ``"... and N more like this"`` if there are more.

    A wrong ``federation.yaml`` (``kind: 3d`` for PNGs, the wrong ``channels``) fails every case
    the same way; this keeps the message to a few lines that still name the first files.
    """
    groups: dict[str, list[str]] = {}
    for line in problems:
        groups.setdefault(_problem_kind(line), []).append(line)
    out: list[str] = []
    for lines in groups.values():
        out += lines[:shown]
        if len(lines) > shown:
            out.append(f"... and {len(lines) - shown} more like this")
    return out


def problems_text(header: str, problems: list[str]) -> str:
    """One message for ``problems`` found in one place: ``header: the problem`` for one (one line), else ``header
    (N problems):`` and the problems (:func:`group_problems`), one indented line each."""
    if len(problems) == 1:
        return f"{header}: {problems[0]}"
    return f"{header} ({len(problems)} problems):\n" + "\n".join(f"  {p}" for p in group_problems(problems))


def raw_dataset_problem(root: Path) -> str | None:
    """One line for a raw nnU-Net v2 dataset, or Medical Segmentation Decathlon or nnU-Net v1 task (``dataset.json``
    and ``imagesTr/``, no ``federation.yaml``) given where a federation folder is expected: which import makes one of
    it; else None."""
    if (root / HEADER_FILE).exists() or not ((root / "dataset.json").is_file() and (root / "imagesTr").is_dir()):
        return None
    import json

    try:
        keys = json.loads((root / "dataset.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        keys = {}
    msd = isinstance(keys, dict) and "channel_names" not in keys and ("modality" in keys or "training" in keys)
    what = "Medical Segmentation Decathlon (or nnU-Net v1) task" if msd else "nnU-Net v2 dataset"
    command = "msd" if msd else "nnunet"
    site_by = "" if msd else " --site-by REGEX"
    return (
        f"{root}: a raw {what} (dataset.json, imagesTr/), not a federation folder (no {HEADER_FILE}); import it "
        f"first: fedseg data import {command} {shlex.quote(str(root))}{site_by} --out FED, then use FED"
    )


def _link_target(link: Path) -> Path:
    """Where symbolic link ``link`` points, as an absolute path (not resolved further)."""
    target = Path(os.readlink(link))
    return target if target.is_absolute() else link.parent / target


def _first_missing(path: Path) -> Path:
    """The outermost part of ``path`` that does not exist: the folder that moved, or the file itself."""
    return next(p for p in [*reversed(path.parents), path] if not os.path.lexists(p))


def moved_links_problem(root: Path) -> str | None:
    """One line for the files of the federation ``root`` that link to files which no longer exist (a linked import,
    ``fedseg data import`` without ``--copy``, whose source dataset was moved or deleted): how many, where they
    pointed and what to do; else None. Said once, instead of a line per link and the lines that follow from them
    (images without labels, empty sites, cases ``splits.csv`` no longer finds). A link loop is not counted (the site
    scan names it)."""
    if not root.is_dir():
        return None
    dangling = [
        entry
        for site in sorted(root.iterdir())
        if site.is_dir() and not site.name.startswith(".")
        for folder in (site / "images", site / "labels")
        if folder.is_dir()
        for entry in sorted(folder.iterdir())
        if entry.is_symlink() and not os.path.lexists(_link_target(entry))
    ]
    if not dangling:
        return None
    places = list(dict.fromkeys(_first_missing(_link_target(link)) for link in dangling))
    shown = ", ".join(map(str, places[:3])) + (f" and {len(places) - 3} more" if len(places) > 3 else "")
    files = f"{len(dangling)} file{'s' if len(dangling) > 1 else ''}"
    example = f"{dangling[0].relative_to(root)} -> {_link_target(dangling[0])}"
    return (
        f"{files} of {root} link to {shown}, which no longer exist{'s' if len(places) == 1 else ''} (e.g. {example}); "
        "the raw data moved? import it again, or restore it where it was"
    )


def load_folder(root: str | Path, *, all_sites: bool = True) -> Federation:
    """Read a federation folder lazily (only file names, ``federation.yaml``, ``splits.csv``,
    ``cases.csv``, ``.mhd`` headers and the first bytes of one file per DICOM series folder are read).

    Raises ``FederationError`` listing every structural problem (pairing, duplicates, empty
    sites, bad ``federation.yaml``, ``splits.csv`` or ``cases.csv``), or one line for links whose source moved
    (``moved_links_problem``). Array contents are validated
    when a case is loaded, or all at once by ``fedseg.data.check.check_folder``. ``all_sites``: see
    ``scan_folder``.
    """
    for problem in (raw_dataset_problem(Path(root)), moved_links_problem(Path(root))):
        if problem is not None:
            raise FederationError(problem)
    header, sites, fixed, problems = scan_folder(root, all_sites=all_sites)
    if problems:
        raise FederationError("\n".join(group_problems(problems)))
    assert header is not None  # scan_folder reports a problem whenever federation.yaml is invalid
    return build_federation(header, sites, fixed)


# --- writing ----------------------------------------------------------------------------------------


def _safe_name(name: str, what: str) -> str:
    if not name or name.startswith(".") or any(c in name for c in "/\\\0") or name != name.strip():
        raise FederationError(f"{what} {name!r}: not usable as a file name")
    return name


def _write_nifti(path: Path, data: np.ndarray, affine: np.ndarray | None = None) -> None:
    """``data`` as stored (bool -> uint8) with ``affine`` (default identity)."""
    import nibabel as nib

    data = data.astype(np.uint8) if data.dtype == bool else data
    affine = np.eye(4) if affine is None else affine
    with naming_errors(path):
        nib.save(nib.Nifti1Image(np.ascontiguousarray(data), affine, dtype=data.dtype), path)


def write_nifti_like(path: Path, data: np.ndarray, like: Any) -> None:
    """``data`` as stored (bool -> uint8) on the grid of ``like`` (a nibabel NIfTI image) with its spatial header:
    its qform and sform with their codes, and its units. ``_write_nifti`` would code the affine as an "aligned" sform
    without a qform, which viewers and registration tools may read differently from a scanner's qform."""
    import nibabel as nib

    data = np.ascontiguousarray(data.astype(np.uint8) if data.dtype == bool else data)
    header = like.header
    image = nib.Nifti1Image(data, None, dtype=data.dtype)
    image.set_qform(like.get_qform(), code=int(header["qform_code"]))
    image.set_sform(like.get_sform(), code=int(header["sform_code"]))
    image.header.set_xyzt_units(*header.get_xyzt_units())
    with naming_errors(path):
        nib.save(image, path)


def _write_png(path: Path, data: np.ndarray) -> None:
    from PIL import Image

    with naming_errors(path):
        Image.fromarray(np.ascontiguousarray(data)).save(path)


def spacing_affine(spacing: tuple[float, ...] | None) -> np.ndarray | None:
    """The NIfTI affine ``diag(sx, sy, sz, 1)`` of a case's ``spacing`` (mm per axis), ``None`` without one."""
    return None if spacing is None else np.diag([*(float(s) for s in spacing), 1.0])


def _write_image(folder: Path, cid: str, image: np.ndarray, kind: str, affine: np.ndarray | None = None) -> None:
    """PNG for 2D uint8 with 1 or 3 channels, NIfTI for 3D (``(C, X, Y, Z)`` -> ``(X, Y, Z[, C])``, with
    ``affine``, default identity), npy otherwise."""
    if kind == "3d":
        _write_nifti(folder / f"{cid}.nii.gz", image[0] if image.shape[0] == 1 else np.moveaxis(image, 0, -1), affine)
    elif image.dtype == np.uint8 and image.shape[0] in (1, 3):
        _write_png(folder / f"{cid}.png", image[0] if image.shape[0] == 1 else np.moveaxis(image, 0, -1))
    else:
        np.save(folder / f"{cid}.npy", image)


def _write_label(folder: Path, cid: str, label: np.ndarray, kind: str, affine: np.ndarray | None = None) -> None:
    """PNG for 2D uint8, NIfTI for 3D (with ``affine``, default identity), npy otherwise."""
    if kind == "3d":
        _write_nifti(folder / f"{cid}.nii.gz", label, affine)
    elif label.dtype == np.uint8:
        _write_png(folder / f"{cid}.png", label)
    else:
        np.save(folder / f"{cid}.npy", label)


@contextlib.contextmanager
def staging_folder(final: Path, purpose: str) -> Iterator[Path]:
    """A new hidden folder inside ``final`` (``.<purpose>-*``; ``final`` is created if needed) to write a federation
    into before :func:`move_in` puts it in place, so an interrupted or failed write (Ctrl-C, a full disk, a bad
    file) leaves no half federation: if the block raises, the folder is removed with its contents, and ``final``
    too if this created it and it is empty. Inside ``final``, not next to it: the same file system as ``final``
    (a mount point, a link to another disk) and no need to write to its parent."""
    created = not final.exists()
    final.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{purpose}-", dir=final))
    try:
        yield tmp
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        if created:
            with contextlib.suppress(OSError):
                final.rmdir()
        raise


def move_in(written: Path, root: Path, replace: Sequence[Path] = ()) -> None:
    """Move the entries of ``written`` (a :func:`staging_folder` of ``root``) into ``root``, replacing the entries
    ``replace`` (an older federation's ``federation.yaml`` and site folders): those are first moved aside, so if a
    move fails (an entry of that name that is not replaced) or is interrupted, everything is put back as it was.
    Once all are moved, the entries replaced are removed through Ctrl-C and kill (acted on when they are gone), which
    would otherwise leave them half-removed beside the new ones."""
    from fedseg.interrupts import deferred_interrupts

    aside = Path(tempfile.mkdtemp(prefix=".replaced-", dir=root))
    moved_aside: list[Path] = []
    moved_in: list[Path] = []
    try:
        for entry in replace:
            entry.rename(aside / entry.name)
            moved_aside.append(entry)
        for entry in sorted(written.iterdir()):
            entry.rename(root / entry.name)
            moved_in.append(root / entry.name)
    except BaseException:
        for entry in moved_in:
            entry.rename(written / entry.name)
        for entry in moved_aside:
            (aside / entry.name).rename(entry)
        aside.rmdir()
        raise
    with deferred_interrupts():
        shutil.rmtree(aside)
        written.rmdir()


def new_site_folder(root: Path, site: str) -> Path:
    """Create ``root/<site>/images`` and ``root/<site>/labels``; returns ``root/<site>``."""
    site_dir = root / site
    (site_dir / "images").mkdir(parents=True)
    (site_dir / "labels").mkdir()
    return site_dir


def check_root(root: Path, overwrite: bool) -> None:
    """Refuse a non-empty ``root`` unless ``overwrite`` and it is a federation folder (``FederationError``)."""
    if root.exists() and any(root.iterdir()):
        if not overwrite:
            raise FederationError(
                f"{root}: exists and is not empty (replace it with --force; from Python, overwrite=True)"
            )
        if not (root / HEADER_FILE).is_file():
            raise FederationError(
                f"{root}: not empty and not a federation folder (no {HEADER_FILE}); refusing to overwrite"
            )


def _federation_entries(root: Path) -> list[Path]:
    """The federation in ``root`` that ``--force`` replaces: its ``federation.yaml`` and site folders (those with
    ``images/`` or ``labels/``); other files stay."""
    sites = [p for p in root.iterdir() if p.is_dir() and ((p / "images").is_dir() or (p / "labels").is_dir())]
    return [*sites, *([root / HEADER_FILE] if (root / HEADER_FILE).is_file() else [])]


def write_folder(fed: Federation, root: str | Path, splits: Splits | None = None, *, overwrite: bool = False) -> Path:
    """Write ``fed`` in the folder format; reading it back with ``load_folder`` gives equal arrays and dtypes.

    2D images: PNG when uint8 with 1 or 3 channels, else ``.npy`` ``(C, H, W)``; 2D labels: PNG
    when uint8, else ``.npy``; 3D images and labels: ``.nii.gz`` (affine ``diag(Case.spacing)``, identity for
    a case without spacing). Writes
    ``<site>/splits.csv`` from ``splits`` when given, else from each site's ``fixed_splits``.
    Metadata: ``Site.meta`` goes to ``federation.yaml`` ``sites:``, ``Case.metadata`` to
    ``<site>/cases.csv`` (values as strings; neither is written when there is none).
    Returns ``root``.
    """
    root = Path(root)
    for site in fed.sites:
        _safe_name(site.name, "site")
        ids = [_safe_name(c.id, f"site {site.name!r}: case") for c in site.cases]
        if len(set(ids)) != len(ids):
            dupes = sorted({i for i in ids if ids.count(i) > 1})
            raise FederationError(f"site {site.name!r}: duplicate case ids {dupes}")
        site_metadata_for_yaml(site)  # refuse metadata that cannot be written before touching root
        cases_csv_table(site)
    check_root(root, overwrite)
    with staging_folder(root, "writing") as tmp:
        write_header(tmp, fed)
        for site in fed.sites:
            site_dir = new_site_folder(tmp, site.name)
            for case in site.cases:
                image, label = case.arrays()
                affine = spacing_affine(case.spacing)
                _write_image(site_dir / "images", case.id, np.asarray(image), fed.kind, affine)
                _write_label(site_dir / "labels", case.id, np.asarray(label), fed.kind, affine)
            site_split = splits.get(site.name) if splits is not None else site.fixed_splits
            if site_split:
                write_site_splits_csv(site_dir / SPLITS_FILE, site_split)
            write_cases_csv(site_dir / CASES_FILE, site)
        move_in(tmp, root, replace=_federation_entries(root))
    return root
