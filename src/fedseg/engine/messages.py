"""What crosses between server and client: named tensors plus small metadata.

Nothing else crosses. Tensor names are free-form paths such as ``"global/enc.0.weight"``;
metadata values are numbers, strings or booleans. The engine counts ``num_floats`` of
every message, down and up, in the ledger.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

import torch
from torch import nn

from fedseg.models.state import float_state

MetaValue = int | float | str | bool


@dataclass
class Message:
    tensors: dict[str, torch.Tensor] = field(default_factory=dict)
    meta: dict[str, MetaValue] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for key, value in self.meta.items():
            if not isinstance(value, (int, float, str, bool)):
                raise TypeError(f"Message.meta[{key!r}] must be a number, string or bool, got {type(value).__name__}")
        for key, tensor in self.tensors.items():
            if not isinstance(tensor, torch.Tensor):
                raise TypeError(f"Message.tensors[{key!r}] must be a torch.Tensor, got {type(tensor).__name__}")

    def num_floats(self) -> int:
        """Number of scalar values carried by the tensors (what the ledger counts)."""
        return sum(t.numel() for t in self.tensors.values())

    def group(self, prefix: str) -> dict[str, torch.Tensor]:
        """Tensors under ``prefix/``, with the prefix stripped."""
        head = prefix + "/"
        return {k[len(head) :]: v for k, v in self.tensors.items() if k.startswith(head)}


def prefixed(prefix: str, tensors: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """``{name: t}`` -> ``{prefix/name: t}``."""
    return {f"{prefix}/{k}": v for k, v in tensors.items()}


def weights_of(model: nn.Module) -> dict[str, torch.Tensor]:
    """A detached CPU copy of every floating-point entry of the model's state (``float_state``:
    parameters and buffers, so they are never silently left out of averaging)."""
    return {k: v.detach().to("cpu", copy=True) for k, v in float_state(model).items()}


def load_weights(model: nn.Module, weights: Mapping[str, torch.Tensor]) -> None:
    """Load ``weights`` (as produced by ``weights_of``) into ``model``; every float entry must be present."""
    state = model.state_dict()
    missing = [k for k in float_state(model) if k not in weights]
    if missing:
        raise KeyError(f"weights are missing {len(missing)} entries, e.g. {missing[:3]}")
    with torch.no_grad():
        for k, v in weights.items():
            state[k].copy_(v)


def l2_norm(tensors: Mapping[str, torch.Tensor]) -> float:
    """The L2 norm over every floating-point entry of ``tensors`` together (float64; Flower's ``get_norm``): an
    update's norm for robust merges and clipping (``fedseg.algorithms.robust``; the engine's outlier warning uses
    a float32 one, ``fedseg.engine.faults.update_norm``)."""
    return math.sqrt(sum(float(t.to(torch.float64).pow(2).sum()) for t in tensors.values() if t.is_floating_point()))
