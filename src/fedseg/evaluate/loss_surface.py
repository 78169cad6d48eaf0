"""1-D loss surfaces near a trained segmentation network (FedSM, Xu et al., CVPR 2022, Sec. 4.2, Figure 4).

Two kinds of curve of one site k's loss ``L_k``: the run's training loss (``train.loss``,
``fedseg.train.segmentation_loss``) averaged over site k's **training** split (the paper: "on Client 5's data";
the data the models were fitted to), with the network in eval mode, in float32 (no autocast), batched:

* **random directions** — what the paper's Figure 4 plots ("the 1D loss surface near the trained model by computing
  the loss along 10 randomly sampled unit vector directions", following its refs. [18, 23]: He et al. 2019,
  "Asymmetric valleys", and Izmailov et al. 2018, SWA): ``L_k(w + t d_j)`` for directions ``j = 1..n`` and ``t``
  on a grid (default -1..1, 21 points). Each ``d_j`` is Gaussian and **filter-normalized** — fedseg's choice, not
  the paper's (it says "unit vector" directions and does not normalize per filter; Li et al., NeurIPS 2018,
  Sec. 4, showed that unnormalized directions make the sharpness of different networks incomparable): for every
  parameter with two or
  more dimensions (conv / transposed-conv / linear weights) and every filter ``i`` of it (the slice ``i`` along
  dim 0, as Li et al.'s code takes it: a conv's output channel, a transposed conv's input channel),
  ``d_{j,i} <- d_{j,i} / ||d_{j,i}|| * ||w_i||``; parameters with one dimension (biases, normalization layers'
  scale and shift) get a zero direction (Li et al.'s "ignore biasbn"), buffers (BatchNorm running statistics)
  stay as trained. So "unit" is per filter, relative to the model: a step ``t = 1`` moves every filter by its own
  norm, which makes the curves of different models (and their sharpness) comparable (Li et al. Sec. 4).
  Direction ``j`` draws from a generator seeded by ``(seed, j)`` (``fedseg.train.step_generator``), parameter by
  parameter in the network's order: every model of the same network gets the same raw draws, normalized to its
  own filters.
* **the line between two models** — the tracker's reading of the figure ("1-D loss along the line from the global
  to a personalized model, per site"; not what the paper plots): ``L_k((1 - t) w_a + t w_b)``, every float entry
  of the weights interpolated (parameters and float buffers), ``t = 0`` is ``w_a`` (e.g. FedSM's global model),
  ``t = 1`` is ``w_b`` (site k's personalized model); default ``t`` in -0.25..1.25.

Weights are ``{parameter or buffer name: tensor}`` as ``fedseg.engine.messages.weights_of`` gives them (a bundle's
model). Run folders, CSV and figure: ``fedseg.loss_surface`` (``fedseg loss-surface``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import torch
from torch import nn

from fedseg.data.dataset import CaseSet
from fedseg.engine.messages import load_weights
from fedseg.train import LossFn, step_generator

Weights = Mapping[str, torch.Tensor]

DIRECTION_TS = tuple(round(float(t), 10) for t in np.linspace(-1.0, 1.0, 21))  # the paper's range (Figure 4's x axis)
LINE_TS = tuple(round(float(t), 10) for t in np.linspace(-0.25, 1.25, 13))  # global (0) -> personal (1) and beyond


def filter_norms(tensor: torch.Tensor) -> torch.Tensor:
    """The L2 norm of each filter (slice along dim 0) of a parameter with >= 2 dims: ``(out,)``."""
    return tensor.detach().flatten(1).norm(dim=1)


def random_direction(model: nn.Module, weights: Weights, seed: int, index: int) -> dict[str, torch.Tensor]:
    """Direction ``index`` (``seed``-ed) for ``weights`` of ``model``'s network, filter-normalized (module doc):
    ``{parameter name: tensor of its shape}`` on the weights' device, zero for one-dimensional parameters."""
    generator = step_generator(seed, index)
    direction = {}
    for name, _ in model.named_parameters():
        w = weights[name]
        if w.dim() <= 1:
            direction[name] = torch.zeros_like(w)
            continue
        d = torch.randn(w.shape, generator=generator, dtype=torch.float32).to(w.device, w.dtype)
        scale = filter_norms(w) / filter_norms(d).clamp_min(1e-10)
        direction[name] = d * scale.view(-1, *([1] * (w.dim() - 1)))
    return direction


@torch.no_grad()
def mean_loss(model: nn.Module, data: CaseSet, loss_fn: LossFn, device: torch.device, batch_size: int) -> float:
    """``loss_fn`` of ``model`` (in eval mode) over every case of ``data``'s fixed-size view, in batches of
    ``batch_size``: the mean per case (each batch's loss, a mean over its cases, weighted by its size; summed in
    float64)."""
    if len(data) == 0:
        raise ValueError(f"{data.name}: no cases to compute the loss on")
    model.eval()
    total = 0.0
    for idx in torch.arange(len(data)).split(batch_size):
        x, y = data.batch(idx, device)
        total += float(loss_fn(model(x).float(), y)) * len(idx)
    return total / len(data)


@torch.no_grad()
def direction_losses(
    model: nn.Module,
    weights: Weights,
    data: CaseSet,
    loss_fn: LossFn,
    device: torch.device,
    batch_size: int,
    directions: int = 10,
    ts: Sequence[float] = DIRECTION_TS,
    seed: int = 0,
) -> np.ndarray:
    """``L(w + t d_j)`` for ``j < directions`` (rows) and ``t`` in ``ts`` (columns): ``(directions, len(ts))``.
    ``model`` is any network of ``weights``' architecture (moved to ``device``); it ends holding ``weights``."""
    model.to(device)
    base = {k: v.to(device) for k, v in weights.items()}
    load_weights(model, base)
    params = dict(model.named_parameters())
    out = np.empty((directions, len(ts)))
    for j in range(directions):
        d = random_direction(model, base, seed, j)
        for i, t in enumerate(ts):
            for name, p in params.items():
                p.copy_(base[name] + t * d[name])
            out[j, i] = mean_loss(model, data, loss_fn, device, batch_size)
    load_weights(model, base)
    return out


def interpolate(a: Weights, b: Weights, t: float) -> dict[str, torch.Tensor]:
    """``(1 - t) a + t b`` for every float entry (others, e.g. integer step counters, from ``a``)."""
    return {k: (1 - t) * v + t * b[k] if v.is_floating_point() else v for k, v in a.items()}


@torch.no_grad()
def line_losses(
    model: nn.Module,
    start: Weights,
    end: Weights,
    data: CaseSet,
    loss_fn: LossFn,
    device: torch.device,
    batch_size: int,
    ts: Sequence[float] = LINE_TS,
) -> np.ndarray:
    """``L((1 - t) start + t end)`` for ``t`` in ``ts``: ``(len(ts),)``."""
    model.to(device)
    a = {k: v.to(device) for k, v in start.items()}
    b = {k: v.to(device) for k, v in end.items()}
    missing = sorted(set(a) ^ set(b))
    if missing:
        raise ValueError(f"the two models differ in their entries, e.g. {missing[:3]}")
    out = np.empty(len(ts))
    for i, t in enumerate(ts):
        load_weights(model, interpolate(a, b, t))
        out[i] = mean_loss(model, data, loss_fn, device, batch_size)
    return out
