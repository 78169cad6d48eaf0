"""Server-side merges of named tensors."""

from __future__ import annotations

from typing import Mapping, Sequence

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
    merged = {}
    for name, first in updates[0].items():
        acc = torch.zeros_like(first, dtype=torch.float64)
        for update, w in zip(updates, weights):
            acc += update[name].to(torch.float64) * (w / total)
        merged[name] = acc.to(first.dtype)
    return merged
