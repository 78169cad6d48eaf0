"""Auto-FedAvg's aggregation weights: the map gamma from beta to alpha (Eq. 3-6), layer groups, and
the differentiable blend ``sum_k alpha_k w_k`` (Eq. 2) the sites learn beta through.

Shapes: ``beta`` and ``alpha`` are ``(G, K)``: G layer groups (1 for network-wise weights) by K
sites in federation order; every row of ``alpha`` lies on the simplex.

* ``softmax`` (Eq. 4): ``alpha_g = softmax(beta_g)``, the same in learning and in the merge.
* ``dirichlet`` (Eq. 5-6): ``alpha_g ~ Dir(beta_g)`` while learning, sampled with implicit
  reparameterization (``torch.distributions.Dirichlet.rsample``: gradients reach beta); the merge
  uses the mode ``(beta_k - 1) / (sum beta - K)`` (Eq. 6). The mode exists only when every
  ``beta_k > 1``; for a group where some ``beta_k <= 1`` the merge falls back to the mean
  ``beta_k / sum beta`` (the distribution's centre, always defined). Learning keeps beta at or
  above ``BETA_FLOOR`` (a projected step: a concentration must stay positive).

Layer groups (layer-wise weights, Sec. 3.2): one group per module that owns parameters, in the
order of the model's state dict (a convolution, a norm layer's affine pair, a PReLU slope). A
module's buffers (BatchNorm's running statistics) belong to that module's group; buffers of a
module without parameters follow the group before them.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass

import torch
from torch import nn

from fedseg.models.state import float_state

Parameterization = str  # "softmax" | "dirichlet"
BETA_FLOOR = 1e-3  # smallest concentration a Dirichlet learning step may leave


@dataclass(frozen=True)
class LayerGroups:
    """Which alpha row each model entry is merged with: ``names[g]`` (the owning module's path;
    ``"network"`` for network-wise weights) and ``of[key] = g`` for every floating-point entry of
    the model's state (the entries ``weights_of`` ships)."""

    names: tuple[str, ...]
    of: dict[str, int]

    @classmethod
    def of_model(cls, model: nn.Module, granularity: str) -> LayerGroups:
        keys = list(float_state(model))
        if granularity == "network":
            return cls(("network",), dict.fromkeys(keys, 0))
        owners = {name.rpartition(".")[0] for name, _ in model.named_parameters()}
        names: list[str] = []
        of: dict[str, int] = {}
        for key in keys:
            module = key.rpartition(".")[0]
            if module in owners and module not in names:
                names.append(module)
            of[key] = names.index(module) if module in names else max(len(names) - 1, 0)
        return cls(tuple(names), of)

    def __len__(self) -> int:
        return len(self.names)


def merge_alpha(beta: torch.Tensor, parameterization: Parameterization) -> torch.Tensor:
    """The alpha the server merges with, ``(G, K)`` float64: softmax(beta) (Eq. 4) or the mode of
    Dir(beta) (Eq. 6; the mean for a group with some beta_k <= 1, see the module docstring)."""
    beta = beta.to(torch.float64)
    if parameterization == "softmax":
        e = torch.exp(beta - beta.max(dim=-1, keepdim=True).values)
        return e / e.sum(dim=-1, keepdim=True)
    k = beta.shape[-1]
    mode = (beta - 1) / (beta.sum(dim=-1, keepdim=True) - k)
    mean = beta / beta.sum(dim=-1, keepdim=True)
    has_mode = (beta > 1).all(dim=-1, keepdim=True)
    return torch.where(has_mode, mode, mean)


def learning_alpha(beta: torch.Tensor, parameterization: Parameterization) -> torch.Tensor:
    """The alpha of one learning step, differentiable in ``beta``: softmax(beta) or one sample of
    Dir(beta) per group (implicit reparameterization; uses torch's global RNG, which the caller seeds)."""
    if parameterization == "softmax":
        return torch.softmax(beta, dim=-1)
    return torch.distributions.Dirichlet(beta).rsample()


def stack_models(models: Sequence[Mapping[str, torch.Tensor]], device: torch.device) -> dict[str, torch.Tensor]:
    """``{key: (K, *shape)}``: the K models' entries stacked in site order, on ``device``."""
    return {key: torch.stack([m[key] for m in models]).to(device) for key in models[0]}


def blend(
    stacked: Mapping[str, torch.Tensor],
    alpha: torch.Tensor,
    groups: Mapping[str, int],
    buffers: Collection[str] = (),
) -> dict[str, torch.Tensor]:
    """``{key: sum_k alpha[g(key), k] * w_k[key]}`` (the model of Eq. 2), differentiable in ``alpha``
    ``(G, K)``; ``stacked`` from :func:`stack_models` (alpha is moved to its device and dtype once). The
    ``buffers`` (BatchNorm's running statistics) are blended with alpha detached: a normalization layer updates
    them in place and cannot differentiate through them (Auto-FedAvg with ``model.norm: batch`` stopped there)."""
    if not stacked:
        return {}
    first = next(iter(stacked.values()))
    a = alpha.to(device=first.device, dtype=first.dtype)
    fixed = a.detach()
    return {
        key: torch.tensordot((fixed if key in buffers else a)[groups[key]], ws, dims=1) for key, ws in stacked.items()
    }
