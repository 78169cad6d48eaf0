"""``binary``: 2D images with one binary mask each, one site per source folder: polyps (Kvasir-SEG, CVC-ClinicDB,
ETIS-Larib, CVC-ColonDB; PraNet's ``TestDataset/<name>/`` folders as they are), skin lesions (ISIC), any
``images/`` + ``masks/`` collection.

Expected layout of each ``SRC``::

    SRC/images/<id>.(jpg|jpeg|png|bmp|tif|tiff)                     RGB or grey image
    SRC/masks/<id>[<suffix>].(png|bmp|tif|tiff|gif|jpg|jpeg)        its binary mask, of the same size

``<suffix>``: none (Kvasir-SEG), or one of ``_mask``, ``_segmentation`` (ISIC), ``_seg``, ``_gt``, ``_label``, in
any case (``_Mask``, ``_GT``). A source with neither ``images/`` nor ``masks/`` but CVC-ClinicDB's own
``Original/`` + ``Ground Truth/`` is read from those.

Mask -> label: read as grey. A mask whose largest value is 1 (0/1 masks) has foreground 1; any other (a 1-bit
image reads as 0/255) has foreground grey >= 128 (0/255 masks, anti-aliased edges, and JPEG masks such as
Kvasir-SEG's, whose values scatter near 0 and 255). A colour mask is read as grey where its channels agree within
``COLOUR_TOLERANCE`` grey levels at every pixel (JPEG noise between channels of a grey mask is less); one whose
channels differ more somewhere is a colour-coded mask: refused. A mask drawn in its alpha channel only (its colour
the same everywhere) is read from the alpha channel. A mask whose largest value lies in 2..127 is refused rather
than imported as empty: a lossless one holds class indices (a multi-class mask), a JPEG one is a 0/1 mask whose
values blurred (or an empty 0/255 one).

What it writes: sites named after the source folders; case ids = the image ids; per case the image linked as is
when it is an RGB PNG/JPEG, else converted to an RGB PNG (grey images too); the mask converted to a label PNG with
0 = background, 1 = foreground; one region ``--region NAME = [1]`` (default ``foreground``).

Errors, one line each: an image without a mask (naming the mask names expected), a mask without an image, two
images or two masks of one id, an image and its mask of different sizes (naming both and their sizes), a colour
or multi-class mask, an unreadable file, a missing or empty folder.
"""

from __future__ import annotations

import functools
import re
from pathlib import Path

import numpy as np

from fedseg.data.federation import FederationError
from fedseg.data.importers.images import IMAGE_EXTS, image_size, image_source, list_files, open_image, source_sites
from fedseg.data.importers.writer import Plan, PlannedCase, Source

MASK_EXTS = ("png", "bmp", "tif", "tiff", "gif", "jpg", "jpeg")
LOSSY = ("jpg", "jpeg")
SUFFIXES = ("_mask", "_segmentation", "_seg", "_gt", "_label")  # compared in lower case
FOLDERS = (("images", "masks"), ("Original", "Ground Truth"))  # ours, then CVC-ClinicDB's
COLOUR_TOLERANCE = 48  # grey levels two channels of a grey (JPEG) mask may differ by; colour-coded masks differ more
THRESHOLD = 128  # foreground: grey >= THRESHOLD (masks whose largest value is not 1)
DEFAULT_REGION = "foreground"
REGION_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
COLOUR_MODES = ("RGB", "RGBA", "RGBX", "P", "PA", "CMYK", "YCbCr", "LAB", "HSV")
EXPECTED = "images/ and masks/ in each source, or CVC-ClinicDB's Original/ and Ground Truth/"


def check_region_name(name: str) -> str:
    """``name`` if it can name the region; ``FederationError`` otherwise (``background`` names label 0)."""
    if not REGION_NAME.fullmatch(name) or name.lower() == "background":
        raise FederationError(
            f"binary: --region {name!r}: use letters, digits, '.', '_' and '-' (not starting with one), "
            "and not 'background' (label 0)"
        )
    return name


def mask_labels(path: Path, lossy: bool = False) -> np.ndarray:
    """A binary mask as a fedseg label map uint8 ``(H, W)`` of 0 (background) and 1 (foreground) (the module
    docstring says how); ``FederationError`` naming the file for a colour-coded mask, or a lossless one (not
    ``lossy``) holding class indices."""
    with open_image(path) as image:
        if image.mode in COLOUR_MODES:
            rgb = image.convert("RGB")
            channels = np.asarray(rgb).astype(np.int16)
            spread = int((channels.max(-1) - channels.min(-1)).max(initial=0))
            if spread > COLOUR_TOLERANCE:
                raise FederationError(
                    f"{path}: colour mask (its channels differ by up to {spread} grey levels, a colour-coded "
                    "multi-class mask?); expected a grey binary mask (0/255 or 0/1)"
                )
            grey = np.asarray(rgb.convert("L"))
        else:
            grey = np.asarray(image.convert("L"))
        if "A" in image.getbands() and grey.min(initial=0) == grey.max(initial=0):  # drawn in the alpha channel only
            grey = np.asarray(image.getchannel("A"))
    top = int(grey.max(initial=0))
    if top == 1:
        return (grey == 1).astype(np.uint8)
    if 1 < top < THRESHOLD:
        values = [int(v) for v in np.unique(grey)]
        shown = ", ".join(map(str, values[:10])) + (", ..." if len(values) > 10 else "")
        why = (
            "a 0/1 mask saved as JPEG (its values blur) or an empty 0/255 one? save masks losslessly (PNG)"
            if lossy
            else "class indices of a multi-class mask? expected a binary mask (0/255, or 0/1)"
        )
        raise FederationError(f"{path}: mask values {shown}: {why}")
    return (grey >= THRESHOLD).astype(np.uint8)


def _folders(src: Path) -> tuple[Path, Path]:
    """The images and masks folders of ``src``: ``images/`` + ``masks/``, else CVC-ClinicDB's where only those
    exist."""
    ours, clinic = ([src / name for name in pair] for pair in FOLDERS)
    if not any(p.exists() for p in ours) and any(p.is_dir() for p in clinic):
        return clinic[0], clinic[1]
    return ours[0], ours[1]


def _owners(stem: str, image_ids: set[str]) -> list[str]:
    """The image ids a mask named ``stem`` may belong to: ``stem`` itself, ``stem`` less a known suffix."""
    owners = [stem] if stem in image_ids else []
    lower = stem.lower()
    for suffix in SUFFIXES:
        if lower.endswith(suffix) and stem[: -len(suffix)] in image_ids:
            owners.append(stem[: -len(suffix)])
    return owners


def _bare(stem: str) -> str:
    """``stem`` less a known mask suffix, if it has one."""
    lower = stem.lower()
    return next((stem[: -len(s)] for s in SUFFIXES if lower.endswith(s) and len(stem) > len(s)), stem)


def site_cases(src: Path) -> tuple[list[PlannedCase], list[str]]:
    """The cases of one source folder and the problems found."""
    problems: list[str] = []
    image_dir, mask_dir = _folders(src)
    images = list_files(image_dir, IMAGE_EXTS, "image", problems, EXPECTED)
    masks = list_files(mask_dir, MASK_EXTS, "mask", problems, EXPECTED)
    if not (image_dir.is_dir() and mask_dir.is_dir()):
        return [], problems  # not a line per image or mask of the other folder
    if not images and not masks:
        problems.append(f"{src}: no case ({image_dir.name}/ and {mask_dir.name}/ are empty)")
    claims: dict[str, list[tuple[Path, str]]] = {cid: [] for cid in images}
    for stem, (path, mask_ext) in masks.items():
        owners = _owners(stem, set(images))
        if not owners:
            problems.append(f"{path}: mask without image (expected {image_dir / _bare(stem)}.<{'|'.join(IMAGE_EXTS)}>)")
        elif len(owners) > 1:
            problems.append(f"{path}: mask of which image? both {' and '.join(images[o][0].name for o in owners)}")
        else:
            claims[owners[0]].append((path, mask_ext))
    cases = []
    for cid, (image, ext) in sorted(images.items()):
        found = claims[cid]
        if not found:
            problems.append(
                f"{image}: image without mask (expected {mask_dir / cid}[{'|'.join(SUFFIXES)}].<{'|'.join(MASK_EXTS)}>)"
            )
        elif len(found) > 1:
            problems.append(f"{image}: several masks ({', '.join(p.name for p, _ in found)}); keep one")
        else:
            mask, mask_ext = found[0]
            try:
                size, mask_size = image_size(image), image_size(mask)
            except FederationError as e:
                problems.append(str(e))
                continue
            if size != mask_size:
                problems.append(
                    f"{image} is {size[0]}x{size[1]} but its mask {mask} is {mask_size[0]}x{mask_size[1]} "
                    "(width x height); they must be the same size"
                )
                continue
            label = Source.png(mask, functools.partial(mask_labels, mask, mask_ext in LOSSY))
            cases.append(PlannedCase(cid, image_source(image, ext), label))
    return cases, problems


def plan_binary(sources: list[Path], region: str = DEFAULT_REGION) -> Plan:
    """Plan the import of binary-mask source folders ``sources`` (one site each; see the module docstring), the
    foreground named ``region``."""
    check_region_name(region)
    sites = source_sites("binary", sources, "images/ and masks/", site_cases)
    return Plan("binary", "2d", 3, {region: [1]}, sites, {0: "background", 1: region})
