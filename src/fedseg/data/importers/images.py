"""What the 2D importers (``fundus``, ``binary``) share: reading image files with one-line errors, listing a folder
of images by id, an image's source for the plan (linked as is, or converted to an RGB PNG), and one site per source
folder (:func:`source_sites`)."""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np

from fedseg.data import folder_entries
from fedseg.data.case_files import split_name
from fedseg.data.federation import FederationError
from fedseg.data.importers.writer import (
    PlannedCase,
    PlannedSite,
    Source,
    check_distinct_names,
    existing_folder,
    folder_sites,
)

IMAGE_EXTS = ("jpg", "jpeg", "png", "bmp", "tif", "tiff")
LINKABLE = ("jpg", "jpeg", "png")  # an RGB file of these is written as is (linked or copied)


@contextmanager
def decoding(path: Path) -> Iterator[None]:
    """Turn any failure to decode ``path`` inside the block into a ``FederationError`` naming the file."""
    try:
        yield
    except FederationError:
        raise
    except Exception as e:  # noqa: BLE001 — any decoder failure means "corrupt file" to the user
        raise FederationError(f"{path}: cannot read ({type(e).__name__}: {e})") from None


def open_image(path: Path):
    """The decoded ``PIL.Image`` of ``path``; ``FederationError`` naming the file if it cannot be read."""
    from PIL import Image

    with decoding(path):
        image = Image.open(path)
        image.load()
        return image


def image_size(path: Path) -> tuple[int, int]:
    """``(width, height)`` of an image file from its header; ``FederationError`` naming it if it cannot be read."""
    from PIL import Image

    with decoding(path), Image.open(path) as image:
        return image.size


def rgb_image(path: Path) -> np.ndarray:
    """An image file as uint8 RGB ``(H, W, 3)`` (a grey one with its value in each channel)."""
    with open_image(path) as image:
        return np.asarray(image.convert("RGB"))


def image_source(path: Path, ext: str) -> Source:
    """The file as is when it is an RGB PNG/JPEG (only its header is read), else a conversion to RGB PNG."""
    if ext in LINKABLE:
        from PIL import Image

        with decoding(path), Image.open(path) as image:
            if image.mode == "RGB":
                return Source(path)
    return Source.png(path, functools.partial(rgb_image, path))


def list_files(
    folder: Path, exts: tuple[str, ...], what: str, problems: list[str], expected: str
) -> dict[str, tuple[Path, str]]:
    """``{id: (path, extension in lower case)}`` of the files in ``folder`` (hidden ones ignored). A missing
    folder (``expected`` says what each source holds), another file or a sub-folder, and two files of one id are
    appended to ``problems``."""
    if not folder.is_dir():
        problems.append(f"{folder}: missing {folder.name}/ folder (expected {expected})")
        return {}
    found: dict[str, tuple[Path, str]] = {}
    for path in sorted(folder.iterdir()):
        if folder_entries.ignored_entry(path.name):  # .DS_Store, Thumbs.db, desktop.ini: no images
            continue
        parsed = split_name(path.name, exts) if path.is_file() else None
        if parsed is None:
            problems.append(f"{path}: unsupported {what} file (expected {', '.join('.' + e for e in exts)})")
        elif parsed[0] in found:
            problems.append(f"{path}: duplicate {what} id {parsed[0]!r} (also {found[parsed[0]][0].name})")
        else:
            found[parsed[0]] = (path, parsed[1].lower())
    return found


def source_sites(
    layout: str, sources: list[Path], holds: str, site_cases: Callable[[Path], tuple[list[PlannedCase], list[str]]]
) -> list[PlannedSite]:
    """One site per source folder, named after it (distinct names required), with the cases ``site_cases`` finds
    there; every problem of every folder in one ``FederationError`` (``holds``: what each folder holds)."""
    if not sources:
        raise FederationError(f"{layout}: expected one or more source folders (each with {holds})")
    folders = [existing_folder(s, f"a {layout} source folder with {holds}") for s in sources]
    check_distinct_names(layout, folders)
    return folder_sites(folders, site_cases)
