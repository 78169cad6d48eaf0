"""Run a segmentation model over a ``CaseSet`` and score it per case and region.

Whole-image path: one forward pass per batch of resized images; metrics on each case's own grid (the masks
resized back, nearest, as ``fedseg predict`` writes them; ``eval.score_grid: original``, the set's ``originals``)
or on the model grid (``model``, or a case already on it).
Volume path (the set has ``volumes``, ``data.volume.patch_size``): sliding window per case, mapped
back to the original grid and scored there with the case's spacing (``fedseg.evaluate.sliding``).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
from torch import nn

from fedseg.accel import inference_autocast
from fedseg.config import EvalConfig
from fedseg.data.dataset import CaseSet
from fedseg.data.federation import Regions
from fedseg.data.preprocess import Fit, restore_image, restore_size
from fedseg.evaluate.metric_info import DEFAULT_NSD_TOLERANCE, METRIC_NAMES
from fedseg.evaluate.metrics import Scores, batch_metrics, logits_to_masks
from fedseg.evaluate.sliding import network_for, score_volumes, sliding_logits


@torch.no_grad()
def predict_masks(
    model: nn.Module,
    x: torch.Tensor,
    batch_size: int,
    threshold: float,
    device: torch.device,
    on_device: bool = False,
    regions: Regions | None = None,
) -> torch.Tensor:
    """Images ``(N, C, *S)`` -> boolean region masks ``(N, R, *S)`` on the CPU (``on_device``: left on
    ``device``, where the model ran). The forward pass runs at the model's ``train.amp`` precision
    (``fedseg.accel.inference_autocast``), the logits cast to float32 before thresholding. ``regions``: the masks
    of the label map the channels paint (``fedseg.evaluate.metrics.label_map_masks``); None: the channels."""
    model.eval()
    out = []
    for xb in x.split(batch_size):
        with inference_autocast(model, device):
            logits = model(xb.to(device))
        masks = logits_to_masks(logits.float(), threshold, regions)
        out.append(masks if on_device else masks.cpu())
    return torch.cat(out) if out else torch.empty(0, dtype=torch.bool)


def score_caseset(
    model: nn.Module,
    data: CaseSet,
    batch_size: int,
    threshold: float,
    hd95: bool,
    device: torch.device,
    worst: float | None = None,
    tolerance: float | Sequence[float] = DEFAULT_NSD_TOLERANCE,
    surface_device: str = "cpu",
    regions: Regions | None = None,
    first_logits: list[torch.Tensor] | None = None,
) -> Scores:
    """``{"dice", "hd95", "nsd"}`` -> ``(N, R)`` for every case of ``data`` (module docstring for the two
    paths; HD95 and NSD NaN only when ``hd95`` is False). ``worst``: ``eval.hd95_worst`` (the metrics'
    empty-mask rule; None = the grid's diagonal); ``tolerance``: NSD's, per region or one for all
    (``Task.nsd_tolerances``), in the HD95 unit; ``surface_device``: ``eval.surface_device``
    (:func:`fedseg.evaluate.metrics.batch_metrics`); ``regions``: ``Task.scored_regions`` (the label map's
    masks are scored, ``eval.score_on: label_map``; None: the thresholded channels); ``first_logits``: on the
    volume path, a list that receives the first case's blended logits for :func:`sample_prediction`.

    Whole-image path: each batch of ``batch_size`` is scored where the model ran (Dice on the device;
    HD95/NSD there too unless ``surface_device`` is ``cpu``); only the ``(B, R)`` scores come back."""
    if not len(data):  # a site without cases in this split (e.g. no test cases): no scores, not an error
        return {m: np.zeros((0, data.regions)) for m in METRIC_NAMES}
    if data.volumes is not None and data.volume is not None:
        return score_volumes(
            model,
            data.volumes,
            data.volume,
            threshold,
            hd95,
            device,
            worst,
            data.x,
            tolerance,
            surface_device,
            regions,
            first_logits,
        )
    metrics = {"hd95": hd95, "worst": worst, "tolerance": tolerance, "surface_device": surface_device}
    parts = []
    for start in range(0, len(data), batch_size):
        cases = slice(start, start + batch_size)
        masks = predict_masks(model, data.x[cases], batch_size, threshold, device, on_device=True, regions=regions)
        truths = None if data.originals is None else [data.originals.get(i) for i in range(len(data))[cases]]
        parts += _scores_on_grids(masks, data.y[cases].bool(), truths, metrics, data.fit)
    return {m: np.concatenate([part[m] for part in parts]) for m in METRIC_NAMES}


def _scores_on_grids(
    masks: torch.Tensor, y: torch.Tensor, truths: list | None, metrics: dict, fit: Fit = "stretch"
) -> list[Scores]:
    """``batch_metrics`` of predicted ``masks (B, R, *S)`` against ``y (B, R, *S)``, the batch at once where every
    case is on the model grid, else case by case: a case with an original-grid truth (``truths[i]``, ``(R, *S_i)``)
    is scored there, its masks resized to it from where ``fit`` placed it (``restore_size``: nearest, as ``fedseg
    predict`` writes them)."""
    if truths is None or all(t is None for t in truths):
        return [batch_metrics(masks, y, **metrics)]
    return [
        batch_metrics(masks[i : i + 1], y[i : i + 1], **metrics)
        if truth is None
        else batch_metrics(restore_size(masks[i], tuple(truth.shape[1:]), fit)[None], truth[None], **metrics)
        for i, truth in enumerate(truths)
    ]


@torch.no_grad()
def sample_prediction(
    model: nn.Module,
    data: CaseSet,
    threshold: float,
    device: torch.device,
    regions: Regions | None = None,
    logits: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The first case of ``data`` with its prediction, on the grid it is scored on: ``(image (C, *S), truth
    (R, *S), pred (R, *S) bool)`` on the CPU; the preprocessed volume (sliding window) on the volume path; on the
    whole-image path the resized image, or with an original-grid truth (``CaseSet.originals``) the image and the
    masks resized back to it (so a panel's Dice is results.csv's); ``regions``: as :func:`score_caseset`'s;
    ``logits``: on the volume path, the first case's blended logits where :func:`score_caseset` kept them
    (``first_logits``), so the case is not predicted again."""
    if data.volumes is not None and data.volume is not None:
        vol = data.volumes[0]
        if logits is None:
            logits = sliding_logits(network_for(model, data.x[0], device), vol.image, data.volume, device)
        return vol.image, vol.label, logits_to_masks(logits[None], threshold, regions)[0]
    pred = predict_masks(model, data.x[:1], 1, threshold, device, regions=regions)[0]
    truth = None if data.originals is None else data.originals.get(0)
    if truth is None:
        return data.x[0], data.y[0], pred
    shape = tuple(truth.shape[1:])
    return restore_image(data.x[0], shape, data.fit), truth, restore_size(pred, shape, data.fit)


def candidate_dice(
    models: list[nn.Module], data: CaseSet, ev: EvalConfig, device: torch.device, regions: Regions | None = None
) -> np.ndarray:
    """Dice of every model on every case, ``(M, N, R)`` (``score_caseset`` at ``ev`` and ``regions``; HD95 not
    computed)."""
    return np.stack(
        [score_caseset(m, data, ev.batch_size, ev.threshold, False, device, regions=regions)["dice"] for m in models]
    )
