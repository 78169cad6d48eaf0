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
mask with other values (naming the file, the values found and the convention), an unreadable file.
"""

from __future__ import annotations

import functools
from pathlib import Path

import numpy as np

from fedseg.data.case_files import split_name
from fedseg.data.federation import FederationError
from fedseg.data.importers.writer import Plan, PlannedCase, PlannedSite, Source, existing_folder, raise_problems

IMAGE_EXTS = ("jpg", "jpeg", "png", "bmp", "tif", "tiff")
MASK_EXTS = ("png", "bmp", "tif", "tiff")
LINKABLE = ("jpg", "jpeg", "png")
CUP, RIM, BACKGROUND = 0, 128, 255  # mask grey levels
LABELS = {BACKGROUND: 0, RIM: 1, CUP: 2}  # mask grey level -> fedseg label value
REGIONS = {"disc": [1, 2], "cup": [2]}
LABEL_NAMES = {0: "background", 1: "rim", 2: "cup"}


def _open(path: Path):
    from PIL import Image

    try:
        image = Image.open(path)
        image.load()
        return image
    except Exception as e:  # noqa: BLE001 — any decoder failure means "corrupt file" to the user
        raise FederationError(f"{path}: cannot read ({type(e).__name__}: {e})") from None


def rgb_image(path: Path) -> np.ndarray:
    """An image file as uint8 RGB ``(H, W, 3)``."""
    with _open(path) as image:
        return np.asarray(image.convert("RGB"))


def mask_labels(path: Path) -> np.ndarray:
    """A REFUGE/RIGA mask as a fedseg label map uint8 ``(H, W)``: 255 -> 0 (background), 128 -> 1 (rim),
    0 -> 2 (cup); ``FederationError`` naming the file for any other value or unequal RGB channels."""
    with _open(path) as image:
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
    lut = np.zeros(256, np.uint8)
    for grey, value in LABELS.items():
        lut[grey] = value
    return lut[mask.astype(np.intp)]


def _files(folder: Path, exts: tuple[str, ...], what: str, problems: list[str]) -> dict[str, tuple[Path, str]]:
    """``{id: (path, extension)}`` of the files in ``folder`` (hidden ones ignored); others are problems."""
    if not folder.is_dir():
        problems.append(f"{folder}: missing {folder.name}/ folder (expected images/ and masks/ in each source)")
        return {}
    found: dict[str, tuple[Path, str]] = {}
    for path in sorted(folder.iterdir()):
        if path.name.startswith("."):
            continue
        parsed = split_name(path.name, exts) if path.is_file() else None
        if parsed is None:
            problems.append(f"{path}: unsupported {what} file (expected {', '.join('.' + e for e in exts)})")
        elif parsed[0] in found:
            problems.append(f"{path}: duplicate {what} id {parsed[0]!r} (also {found[parsed[0]][0].name})")
        else:
            found[parsed[0]] = (path, parsed[1].lower())
    return found


def _image_source(path: Path, ext: str) -> Source:
    """The file as is when it is an RGB PNG/JPEG (only its header is read), else a conversion to RGB PNG."""
    if ext in LINKABLE:
        from PIL import Image

        try:
            with Image.open(path) as image:
                if image.mode == "RGB":
                    return Source(path)
        except Exception as e:  # noqa: BLE001 — any decoder failure means "corrupt file" to the user
            raise FederationError(f"{path}: cannot read ({type(e).__name__}: {e})") from None
    return Source.png(path, functools.partial(rgb_image, path))


def site_cases(src: Path) -> tuple[list[PlannedCase], list[str]]:
    """The cases of one source folder and the problems found."""
    problems: list[str] = []
    images = _files(src / "images", IMAGE_EXTS, "image", problems)
    masks = _files(src / "masks", MASK_EXTS, "mask", problems)
    for cid in sorted(set(images) - set(masks)):
        problems.append(f"{images[cid][0]}: image without mask (expected {src / 'masks' / cid}.<png|bmp|tif>)")
    for cid in sorted(set(masks) - set(images)):
        problems.append(f"{masks[cid][0]}: mask without image (expected {src / 'images' / cid}.<jpg|png|bmp|tif>)")
    cases = [
        PlannedCase(
            cid, _image_source(*images[cid]), Source.png(masks[cid][0], functools.partial(mask_labels, masks[cid][0]))
        )
        for cid in sorted(set(images) & set(masks))
    ]
    if not cases and images == {} and masks == {}:
        problems.append(f"{src}: no case (expected images/<id>.jpg with masks/<id>.bmp)")
    return cases, problems


def plan_fundus(sources: list[Path]) -> Plan:
    """Plan the import of fundus source folders ``sources`` (one site each; see the module docstring)."""
    if not sources:
        raise FederationError("fundus: expected one or more source folders (each with images/ and masks/)")
    folders = [existing_folder(s, "a fundus source folder with images/ and masks/") for s in sources]
    names = [f.name for f in folders]
    if len(set(names)) != len(names):
        raise FederationError(f"fundus: source folders must have distinct names (they become the sites), got {names}")
    sites, problems = [], []
    for folder in folders:
        cases, site_problems = site_cases(folder)
        sites.append(PlannedSite(folder.name, cases))
        problems += site_problems
    raise_problems(problems)
    return Plan("fundus", "2d", 3, REGIONS, sites, LABEL_NAMES)
