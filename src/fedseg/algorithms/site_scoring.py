"""How a site scores a model in an ``evaluate`` message, shared by every method's client and server."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from torch import nn

from fedseg.atomic_files import atomic_write_bytes
from fedseg.data.dataset import CaseSet
from fedseg.engine.context import ClientContext
from fedseg.engine.messages import Message, MetaValue
from fedseg.evaluate.inference import sample_prediction, score_caseset
from fedseg.evaluate.metrics import Scores

SURFACE = "surface"  # evaluate meta (bool): also compute HD95 and NSD (with eval.hd95); absent = Dice only


def surface_meta(split: str) -> dict[str, MetaValue]:
    """The ``surface`` entry of an evaluate message scoring a method's own model on ``split``: HD95/NSD only
    for the test (the tables report them for it); validation selects on Dice alone. The site decides nothing
    itself, so every engine (simulator, worker pool, Flower) scores the same metrics."""
    return {SURFACE: split == "test"}


def wants_surface(msg: Message, ctx: ClientContext) -> bool:
    """Whether an evaluate message asks for HD95/NSD: its ``surface`` meta and ``eval.hd95``."""
    return bool(msg.meta.get(SURFACE, False)) and ctx.cfg.eval.hd95


def score_at_site(
    model: nn.Module,
    data: CaseSet,
    ctx: ClientContext,
    surface: bool,
    first_logits: list[torch.Tensor] | None = None,
) -> Scores:
    """``score_caseset`` of ``model`` on ``data`` at the run's ``eval`` settings on the site's device: Dice
    ``(N, R)``, and HD95/NSD when ``surface`` (else NaN); ``first_logits``: receives the first case's sliding-window
    logits for :func:`write_sample` (volumes only)."""
    ev = ctx.cfg.eval
    return score_caseset(
        model,
        data,
        ev.batch_size,
        ev.threshold,
        surface,
        ctx.task.device,
        ev.hd95_worst,
        ctx.task.nsd_tolerances,
        ev.surface_device,
        ctx.task.scored_regions,
        first_logits,
    )


def write_sample(
    model: nn.Module, data: CaseSet, ctx: ClientContext, model_name: str, logits: torch.Tensor | None = None
) -> None:
    """Write the site's first case with its prediction: ``samples/<algorithm>__<site>.npz`` (2D; 3D: middle slice),
    readable by its owner only (a patient's image), written whole or not at all. ``logits``: the first case's
    sliding-window logits where scoring kept them (``score_at_site``'s ``first_logits``), not computed again."""
    image, truth, pred = sample_prediction(
        model, data, ctx.cfg.eval.threshold, ctx.task.device, ctx.task.scored_regions, logits
    )
    if image.dim() == 4:  # (C, D, H, W): keep the middle slice
        mid = image.shape[1] // 2
        image, truth, pred = image[:, mid], truth[:, mid], pred[:, mid]
    assert ctx.artifacts is not None  # callers check
    ctx.artifacts.mkdir(mode=0o700, parents=True, exist_ok=True)  # a patient's image: its owner's only, if made here

    def write(f) -> None:
        np.savez_compressed(
            f,
            image=image.numpy().astype(np.float32),
            truth=truth.numpy().astype(np.uint8),
            pred=pred.numpy().astype(np.uint8),
            case=np.array(data.ids[0]),
            model=np.array(model_name),
        )

    atomic_write_bytes(Path(ctx.artifacts) / f"{ctx.algorithm}__{ctx.site}.npz", write, private=True)  # mode 0600
