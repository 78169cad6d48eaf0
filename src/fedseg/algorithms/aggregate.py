"""Server-side merges of named tensors."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import torch

Weights = dict[str, torch.Tensor]


def weighted_average(updates: Sequence[Mapping[str, torch.Tensor]], weights: Sequence[float]) -> Weights:
    """``sum_k p_k * updates[k]`` with ``p_k = weights[k] / sum(weights)``, per tensor name.

    Accumulates in float64 and casts back to each tensor's dtype, so a single update is returned unchanged.
    """
    if not updates or len(updates) != len(weights):
        raise ValueError(f"need one weight per update, got {len(updates)} updates and {len(weights)} weights")
    total = float(sum(weights))
    if total <= 0:
        raise ValueError(f"aggregation weights must sum to a positive number, got {list(weights)}")
    shares = [w / total for w in weights]
    return combine(updates, lambda name: shares)


def combine(updates: Sequence[Mapping[str, torch.Tensor]], coefficients: Callable[[str], Sequence[float]]) -> Weights:
    """``sum_k c_k(name) * updates[k][name]`` per tensor name, the coefficients used as given (not
    normalized): ``coefficients(name)`` is one number per update, e.g. Auto-FedAvg's layer-wise
    alpha of the tensor's layer group. Accumulates in float64 and casts back to each tensor's dtype.
    """
    merged = {}
    for name, first in updates[0].items():
        acc = torch.zeros_like(first, dtype=torch.float64)
        # one buffer reused: the rounding of ``acc += u.double() * c`` without two new tensors per update
        # (1.3-4.5x faster on 22.6M weights, 2 CPUs)
        term = torch.empty_like(acc)
        for update, c in zip(updates, coefficients(name)):
            term.copy_(update[name])
            acc += term.mul_(c)
        merged[name] = acc.to(first.dtype)
    return merged


def _stacked(updates: Sequence[Mapping[str, torch.Tensor]], name: str) -> torch.Tensor:
    """``(K, *shape)`` float64 stack of one named tensor over the K updates."""
    return torch.stack([u[name].to(torch.float64) for u in updates])


def stacked_median(stack: torch.Tensor) -> torch.Tensor:
    """The median over the first axis of ``stack`` ``(K, *shape)``: for even K the mean of the two middle values
    (``numpy.median``'s definition, also Flower's), not torch's lower median."""
    k = stack.shape[0]
    return stack.sort(dim=0).values[(k - 1) // 2 : k // 2 + 1].mean(dim=0)  # one middle value (odd K) or two


def coordinate_median(updates: Sequence[Mapping[str, torch.Tensor]]) -> Weights:
    """Coordinate-wise median over the K updates, per tensor name (FedMedian, Yin et al. 2018).

    For even K the mean of the two middle values (``numpy.median``'s definition, also Flower's),
    not torch's lower median. Unweighted. Translation-equivariant, so merging models or
    merging updates ``w_k - w`` and adding ``w`` give the same model.
    """
    if not updates:
        raise ValueError("coordinate_median needs at least one update")
    return {name: stacked_median(_stacked(updates, name)).to(first.dtype) for name, first in updates[0].items()}


def trimmed_mean(updates: Sequence[Mapping[str, torch.Tensor]], beta: float) -> Weights:
    """Coordinate-wise trimmed mean (FedTrimmedAvg, Yin et al. 2018): per coordinate, drop the
    ``int(beta * K)`` smallest and as many largest of the K values, average the rest.

    The cut count is ``scipy.stats.trim_mean``'s (and Flower's): ``beta = 0.2`` trims nothing
    below K = 5. Unweighted; ``0 <= beta < 0.5``.
    """
    if not updates:
        raise ValueError("trimmed_mean needs at least one update")
    if not 0.0 <= beta < 0.5:
        raise ValueError(f"trimmed mean fraction beta must be in [0, 0.5), got {beta}")
    k = len(updates)
    cut = int(beta * k)
    merged = {}
    for name, first in updates[0].items():
        ordered = _stacked(updates, name).sort(dim=0).values
        merged[name] = ordered[cut : k - cut].mean(dim=0).to(first.dtype)
    return merged


def server_step(current: Mapping[str, torch.Tensor], target: Mapping[str, torch.Tensor], lr: float) -> Weights:
    """``current + lr * (target - current)`` per tensor (a server learning rate on the averaged
    update; float64 arithmetic). ``lr == 1`` returns ``target`` itself, so a method whose server
    rate is 1 merges bit-for-bit like FedAvg."""
    if lr == 1.0:
        return dict(target)
    out = {}
    for name, t in target.items():
        base = current[name].to(torch.float64)
        out[name] = (base + lr * (t.to(torch.float64) - base)).to(t.dtype)
    return out


def softpull(models: Mapping[str, Mapping[str, torch.Tensor]], lam: float) -> dict[str, Weights]:
    """SoftPull (FedSM Eq. 11, Algorithm 1 line 16), for every site k at once from the received models:

    ``w_p,k <- lam * w_p,k + (1 - lam) / (K - 1) * sum_{k' != k} w_p,k'``.

    ``models``: ``{site: weights}`` of the K >= 2 personalized models. ``lam = 1/K`` gives every
    site the plain uniform average (FedAvg's "hard" averaging); ``lam = 1`` leaves each model
    unchanged. The range check against K lives with the method (``fedseg.algorithms.fedsm``).
    """
    sites = list(models)
    if len(sites) < 2:
        raise ValueError(f"SoftPull needs at least 2 personalized models (it averages the other K-1), got {len(sites)}")
    pull = (1.0 - lam) / (len(sites) - 1)
    return {k: weighted_average([models[j] for j in sites], [lam if j == k else pull for j in sites]) for k in sites}
