"""A trained model bundle, ``RUN/model/<algorithm>/`` (``manifest.json`` + ``weights.safetensors``, written by
``fedseg.run.outputs.write_bundle_files``), read with its manifest checked: for ``fedseg predict`` and for methods
that start from another run's model (``fedseg.run.start_from``); found by ``fedseg.run.bundle_folders``."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, get_args

import torch
from pydantic import ValidationError
from torch import nn

from fedseg.algorithms.registry import BundleRouting
from fedseg.config import ModelConfig, VolumeConfig
from fedseg.data.federation import FederationError, Regions
from fedseg.data.preprocess import Fit, Normalize
from fedseg.data.structured import read_mapping
from fedseg.engine.faults import all_finite
from fedseg.engine.messages import Message
from fedseg.models.factory import build_segmenter
from fedseg.run.bundle_folders import BUNDLE_MANIFEST, BUNDLE_WEIGHTS, routing_of
from fedseg.run.bundle_folders import BundleError as BundleError  # found by bundle_folders, read here
from fedseg.run.bundle_folders import find_bundle as find_bundle
from fedseg.run.bundle_folders import run_bundles as run_bundles

MANIFEST, WEIGHTS = BUNDLE_MANIFEST, BUNDLE_WEIGHTS

MANIFEST_KEYS = ("models", "network", "spatial_dims", "in_channels", "regions", "image_size", "normalize", "threshold")

# entries NaN on purpose: FedSM-extra/-ensemble's gamma (no threshold; fedseg.algorithms.fedsm.model.bundle_entries)
NAN_BY_DESIGN = frozenset({"gamma/value"})


# --- the bundle ------------------------------------------------------------------------------------
@dataclass
class Bundle:
    """A loaded ``model/<algorithm>/`` folder: its manifest and ``{model name: weights}``."""

    folder: Path
    manifest: dict[str, Any]
    models: dict[str, dict[str, torch.Tensor]]

    @property
    def kind(self) -> Literal["2d", "3d"]:
        return "2d" if self.manifest["spatial_dims"] == 2 else "3d"

    @property
    def regions(self) -> Regions:
        return Regions.from_mapping(self.manifest["regions"])

    @property
    def channel_names(self) -> list[str] | None:
        """What each input channel holds, in order (the training federation's ``channel_names``); None where the
        federation did not say, or the bundle predates the field."""
        names = self.manifest.get("channel_names")
        return None if names is None else [str(n) for n in names]

    @property
    def routing(self) -> BundleRouting | None:
        """How the bundle routes each image among its networks (its family's), None for a single-model bundle."""
        return routing_of(self.models)

    @property
    def volume(self) -> VolumeConfig | None:
        """The run's ``data.volume`` when it trained on patches (volume path), else None (older bundles too)."""
        cfg = VolumeConfig.model_validate(self.manifest.get("volume") or {})
        return cfg if cfg.patch_size is not None else None

    def new_segmenter(self) -> nn.Module:
        m = self.manifest
        cfg = ModelConfig.model_validate(m["network"])
        return build_segmenter(cfg, m["spatial_dims"], m["in_channels"], len(m["regions"]), seed=0)


def load_bundle(folder: Path) -> Bundle:
    """Read and check ``manifest.json`` and ``weights.safetensors`` of one bundle folder."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    folder = Path(folder)
    manifest_path, weights_path = folder / MANIFEST, folder / WEIGHTS
    manifest = read_mapping(
        manifest_path, f"expected RUN/model/<algorithm>/{MANIFEST}", "a JSON object", error=BundleError
    )
    missing = [k for k in MANIFEST_KEYS if k not in manifest]
    if missing:
        raise BundleError(f"{manifest_path}: missing keys {', '.join(missing)}")
    for key, allowed in (("spatial_dims", (2, 3)), ("in_channels", None), ("image_size", None)):
        value = manifest[key]
        if isinstance(value, bool) or not isinstance(value, int) or value < 1 or (allowed and value not in allowed):
            expected = " or ".join(map(str, allowed)) if allowed else "a positive integer"
            raise BundleError(f"{manifest_path}: {key} is {value!r}; expected {expected}")
    threshold = manifest["threshold"]
    if isinstance(threshold, bool) or not isinstance(threshold, int | float) or not 0 < threshold < 1:
        raise BundleError(f"{manifest_path}: threshold is {threshold!r}; expected a number between 0 and 1")
    if manifest.get("resize", "stretch") not in get_args(Fit):
        raise BundleError(
            f"{manifest_path}: resize is {manifest['resize']!r}; expected one of {', '.join(get_args(Fit))}"
        )
    if manifest["normalize"] not in get_args(Normalize):
        raise BundleError(
            f"{manifest_path}: normalize is {manifest['normalize']!r}; expected one of {', '.join(get_args(Normalize))}"
        )
    if not isinstance(manifest["models"], list) or not all(isinstance(m, str) for m in manifest["models"]):
        raise BundleError(f"{manifest_path}: models is {manifest['models']!r}; expected a list of model names")
    if not manifest["models"]:
        raise BundleError(f"{manifest_path}: models is empty; expected the names of the models it holds")
    names = manifest.get("channel_names")  # absent in bundles written before it: read as unknown
    if names is not None and not (
        isinstance(names, list)
        and len(names) == manifest["in_channels"]
        and all(isinstance(n, str) and n.strip() for n in names)
    ):
        raise BundleError(
            f"{manifest_path}: channel_names is {names!r}; expected null or a list of {manifest['in_channels']} "
            "channel names (in_channels)"
        )
    try:
        ModelConfig.model_validate(manifest["network"])
        Regions.from_mapping(manifest["regions"])
        VolumeConfig.model_validate(manifest.get("volume") or {})
    except (ValidationError, FederationError) as e:
        raise BundleError(f"{manifest_path}: invalid network, regions or volume ({' '.join(str(e).split())})") from None
    if not weights_path.is_file():
        raise BundleError(f"{weights_path}: {'is not a file' if weights_path.exists() else 'missing'}")
    try:
        tensors = Message(load_file(weights_path))
    except (OSError, SafetensorError) as e:
        raise BundleError(f"{weights_path}: cannot read ({type(e).__name__}: {e})") from None
    models = {name: tensors.group(name) for name in manifest["models"]}
    empty = [name for name, w in models.items() if not w]
    if empty:
        raise BundleError(f"{weights_path}: no tensors for the models {', '.join(empty)} listed in {manifest_path}")
    floats = {k: v for k, v in tensors.tensors.items() if k not in NAN_BY_DESIGN and v.is_floating_point()}
    bad = next((k for k, v in floats.items() if not all_finite(v)), None)
    if bad is not None:  # training never keeps such a model: the file was damaged or edited
        raise BundleError(f"{weights_path}: tensor {bad!r} holds NaN or Inf; it cannot segment anything")
    return Bundle(folder, manifest, models)
