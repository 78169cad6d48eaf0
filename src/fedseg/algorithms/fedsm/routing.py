"""How ``fedseg predict`` applies a FedSM-family bundle (Algorithm 2): the selector routes each image.

A bundle with a ``selector_spec`` entry is the family's super model (``model.bundle_entries``). Threshold
mode (FedSM): personalized model ``argmax y_s`` if ``max y_s > gamma``, else the global model, where
``y_s`` is the selector's softmax; argmax mode (FedSM-extra): the argmax candidate; ensemble mode: the
weighted ensemble. Each image's row names the chosen candidate (``global``, ``personal:<site>`` or
``ensemble``), its ``confidence`` (``max y_s``) and the selector's softmax: one ``prob:<candidate>``
per site's personalized model, plus ``prob:global`` in the K+1-class modes.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from fedseg.algorithms.fedsm.model import (
    MODES,
    SELECTOR_SPEC,
    SuperModel,
    candidate_names,
    route,
    super_model_from_bundle,
)
from fedseg.algorithms.registry import Bundle, BundleRouting


def owns(model_names: Collection[str]) -> bool:
    """Whether a bundle listing ``model_names`` is a super model (it has a ``selector_spec`` entry)."""
    return SELECTOR_SPEC in model_names


def option_problem(bundle: Bundle, gamma: float | None, folder: str) -> str | None:
    """Why ``--gamma`` does not apply to the super model ``bundle`` (in ``folder``), or None: only threshold
    routing has a gamma, and it lies in [0, 1]."""
    mode = MODES[int(bundle[SELECTOR_SPEC]["mode"])]
    if gamma is not None and mode != "threshold":
        return f"{folder}: --gamma applies to threshold routing (fedsm); this bundle routes by {mode}"
    if gamma is not None and not 0.0 <= gamma <= 1.0:
        return f"--gamma {gamma}: must lie in [0, 1]"
    stored = float(bundle["gamma"]["value"]) if "gamma" in bundle else math.nan
    if gamma is None and mode == "threshold" and not 0.0 <= stored <= 1.0:  # NaN too: routed nothing anywhere
        return (
            f"{folder}/weights.safetensors: gamma/value is {stored}, and threshold routing needs a gamma in [0, 1]: "
            "the file was damaged or edited; give --gamma (the run's summary.json records the one it selected)"
        )
    return None


@dataclass
class RoutedSuperModel:
    """The super model of a bundle as ``fedseg predict`` applies it (``fedseg.algorithms.registry.RoutedModel``)."""

    network: SuperModel
    candidates: list[str]
    prob_names: list[str]

    @torch.no_grad()
    def choices(self, x: torch.Tensor) -> list[dict[str, Any]]:
        """Per image of ``x`` ``(B, C, *S)``: ``model``, ``confidence`` and ``prob:<candidate>``."""
        sm = self.network
        probs = sm.scores(x)  # (B, classes)
        chosen = route(probs, sm.mode, sm.gamma)
        rows = []
        for p, c in zip(probs.tolist(), chosen.tolist()):
            model = "ensemble" if sm.mode == "ensemble" else self.candidates[c]
            rows.append({"model": model, "confidence": max(p), **{f"prob:{n}": v for n, v in zip(self.prob_names, p)}})
        return rows

    def round_key(self, model: str) -> str:
        """The model card's key holding the round of every candidate (and of their ensemble): threshold mode (FedSM)
        ``selected_round`` (the run restores that round's whole super model); argmax and ensemble modes
        (FedSM-extra/-ensemble) ``phase1_best_round``, the best phase-1 round, whose networks the selector phase froze
        (its selected round is the selector's; a card written before it recorded that round holds none)."""
        return "selected_round" if self.network.mode == "threshold" else "phase1_best_round"


def build(
    bundle: Bundle,
    new_segmenter: Callable[[], nn.Module],
    in_channels: int,
    spatial_dims: int,
    gamma: float | None,
) -> RoutedSuperModel:
    """The super model of ``bundle``; ``gamma`` overrides the stored threshold."""
    sm = super_model_from_bundle(bundle, new_segmenter, in_channels, spatial_dims, gamma)
    candidates = candidate_names(bundle)
    return RoutedSuperModel(sm, candidates, candidates[1:] if sm.mode == "threshold" else candidates)


ROUTING = BundleRouting(owns, option_problem, build)
