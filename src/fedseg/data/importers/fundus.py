"""``fundus``: retinal fundus photographs with optic disc/cup masks (REFUGE/RIGA convention), one site per
source folder.

Expected layout of each ``SRC`` (e.g. one per collection: ``REFUGE``, ``Drishti-GS``, ``RIM-ONE``...)::

    SRC/images/<id>.(jpg|jpeg|png|bmp|tif|tiff)      RGB fundus image (or an optic-disc crop)
    SRC/masks/<id>.(png|bmp|tif|tiff)                mask: 0 = cup, 128 = rim, 255 = background

Masks must be lossless (no JPEG) and hold only 0, 128 and 255 (grayscale, or RGB with equal channels).
What it writes: sites named after the source folders; per case the image linked as is when it is an RGB
PNG/JPEG, else converted to an RGB PNG; the mask converted to a label PNG with 0 = background, 1 = rim,
2 = cup; regions ``disc = [1, 2]`` (rim ∪ cup) and ``cup = [2]`` (as ``synthetic-retina``).

Errors: an image without a mask or a mask without an image (naming the file and the expected partner), a
mask with other values (naming the file, the values found and the convention), a mask with cup but no rim (a
binary 0/255 mask, which the convention would read inverted: 0 as cup), an unreadable file.
"""

from __future__ import annotations

import functools
from pathlib import Path

import numpy as np

from fedseg.data.federation import FederationError
from fedseg.data.importers.images import IMAGE_EXTS, image_source, list_files, open_image, source_sites
from fedseg.data.importers.writer import Plan, PlannedCase, Source

MASK_EXTS = ("png", "bmp", "tif", "tiff")
CUP, RIM, BACKGROUND = 0, 128, 255  # mask grey levels
LABELS = {BACKGROUND: 0, RIM: 1, CUP: 2}  # mask grey level -> fedseg label value
REGIONS = {"disc": [1, 2], "cup": [2]}
LABEL_NAMES = {0: "background", 1: "rim", 2: "cup"}


def mask_labels(path: Path) -> np.ndarray:
    """A REFUGE/RIGA mask as a fedseg label map uint8 ``(H, W)``: 255 -> 0 (background), 128 -> 1 (rim),
    0 -> 2 (cup); ``FederationError`` naming the file for any other value or unequal RGB channels."""
    with open_image(path) as image:
        mask = np.asarray(image)
    if mask.ndim == 3:
        if not all(np.array_equal(mask[..., 0], mask[..., c]) for c in range(1, min(mask.shape[-1], 3))):
            raise FederationError(f"{path}: colour mask (its channels differ); expected a grey mask of 0, 128, 255")
        mask = mask[..., 0]
    values = np.unique(mask)
    unknown = [int(v) for v in values if int(v) not in LABELS]
    if unknown:
        shown = ", ".join(map(str, unknown[:10])) + (", ..." if len(unknown) > 10 else "")
        raise FederationError(
            f"{path}: mask values {shown} are not in the REFUGE/RIGA convention "
            f"(expected only {CUP} = cup, {RIM} = rim, {BACKGROUND} = background)"
        )
    if CUP in values and RIM not in values:  # a cup fills its disc in no real eye: a binary mask read as fundus
        raise FederationError(
            f"{path}: cup ({CUP}) with no rim ({RIM}) around it: a binary mask (0/255)? For one foreground region "
            "use `fedseg data import binary` (fundus masks: 0 = cup, 128 = rim, 255 = background)"
        )
    lut = np.zeros(256, np.uint8)
    for grey, value in LABELS.items():
        lut[grey] = value
    return lut[mask.astype(np.intp)]


def site_cases(src: Path) -> tuple[list[PlannedCase], list[str]]:
    """The cases of one source folder and the problems found."""
    problems: list[str] = []
    images = list_files(src / "images", IMAGE_EXTS, "image", problems, "images/ and masks/ in each source")
    masks = list_files(src / "masks", MASK_EXTS, "mask", problems, "images/ and masks/ in each source")
    if not ((src / "images").is_dir() and (src / "masks").is_dir()):
        return [], problems  # the missing folder said: not a line per file of the other
    for cid in sorted(set(images) - set(masks)):
        problems.append(f"{images[cid][0]}: image without mask (expected {src / 'masks' / cid}.<png|bmp|tif>)")
    for cid in sorted(set(masks) - set(images)):
        problems.append(f"{masks[cid][0]}: mask without image (expected {src / 'images' / cid}.<jpg|png|bmp|tif>)")
    cases = [
        PlannedCase(
            cid, image_source(*images[cid]), Source.png(masks[cid][0], functools.partial(mask_labels, masks[cid][0]))
        )
        for cid in sorted(set(images) & set(masks))
    ]
    if not cases and images == {} and masks == {}:
        problems.append(f"{src}: no case (expected images/<id>.jpg with masks/<id>.bmp)")
    return cases, problems


def plan_fundus(sources: list[Path]) -> Plan:
    """Plan the import of fundus source folders ``sources`` (one site each; see the module docstring)."""
    sites = source_sites("fundus", sources, "images/ and masks/", site_cases)
    return Plan("fundus", "2d", 3, REGIONS, sites, LABEL_NAMES)
