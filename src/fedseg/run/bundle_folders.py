"""Where a trained model bundle lies: ``RUN/model/<algorithm>/`` (``manifest.json`` + ``weights.safetensors``,
written by ``fedseg.run.outputs.write_bundle_files``), found from the folder given (``find_bundle``), and
``BundleError``. File look-ups only (the method registry, so torch, is imported only to tell apart several bundles
of one run: ``routing_of``), so ``fedseg predict`` says a wrong ``--model`` before it imports torch
(``fedseg.path_checks``); ``fedseg.run.bundles`` reads the bundle found."""

from __future__ import annotations

import json
from collections.abc import Collection
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from fedseg.algorithms.registry import BundleRouting

BUNDLE_WEIGHTS, BUNDLE_MANIFEST = "weights.safetensors", "manifest.json"


class BundleError(ValueError):
    """A bad model folder (or, raised by ``fedseg.predict`` as ``BundleError``, option or input file); the
    message names the file or option."""


def _bundle_folders(folder: Path) -> list[Path]:
    return sorted(p for p in folder.iterdir() if (p / BUNDLE_MANIFEST).is_file()) if folder.is_dir() else []


def run_bundles(run_dir: Path) -> list[Path]:
    """Every bundle folder of a finished run, ``RUN/model/<algorithm>/``, by algorithm name (none: ``[]``)."""
    return _bundle_folders(Path(run_dir) / "model")


def _manifest_models(path: Path) -> list[str]:
    """The ``models`` a manifest lists; none if it cannot be read (``load_bundle`` reports that)."""
    try:
        models = json.loads(path.read_text(encoding="utf-8")).get("models", [])
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, AttributeError):
        return []
    return models if isinstance(models, list) else []


def find_bundle(path: Path, algorithm: str | None = None) -> Path:
    """The bundle folder ``path`` names: ``RUN/model/<algorithm>`` itself, or one inside ``RUN/model``
    (or ``RUN``): ``algorithm`` if given, else the only bundle, else the only one that routes (FedSM's)."""
    path = Path(path)
    if path.is_file() and path.name in (BUNDLE_MANIFEST, BUNDLE_WEIGHTS):  # a bundle's file given for its folder
        path = path.parent
    if (path / BUNDLE_MANIFEST).is_file():
        if algorithm is not None and algorithm != path.name:
            raise BundleError(f"{path}: is the bundle of {path.name!r}, not of --algorithm {algorithm!r}")
        return path
    if (path / "model").is_dir() and not _bundle_folders(path):
        path = path / "model"
    found = _bundle_folders(path)
    if not found:
        raise BundleError(
            f"{path}: no {BUNDLE_MANIFEST} here or in its sub-folders "
            "(expected RUN/model or RUN/model/<algorithm> of a finished run)"
        )
    names = ", ".join(p.name for p in found)
    if algorithm is not None:
        if not (path / algorithm / BUNDLE_MANIFEST).is_file():
            raise BundleError(f"{path}: no bundle for --algorithm {algorithm!r} (available: {names})")
        return path / algorithm
    if len(found) == 1:
        return found[0]
    supers = [p for p in found if routing_of(_manifest_models(p / BUNDLE_MANIFEST)) is not None]
    if len(supers) == 1:
        return supers[0]
    raise BundleError(f"{path}: holds the bundles {names}; choose one with --algorithm")


def routing_of(model_names: Collection[str]) -> BundleRouting | None:
    """The routing (``fedseg.algorithms.registry.BundleRouting``) of the registered family that owns a bundle
    listing ``model_names``, or None."""
    from fedseg.algorithms import ALGORITHMS  # the registered methods (torch): only where several bundles are found

    families = [spec.family for spec in ALGORITHMS.values() if spec.family is not None]
    return next((f.routing for f in families if f.routing is not None and f.routing.owns(model_names)), None)
