"""The floating-point state of a network, each tensor once."""

from __future__ import annotations

import torch
from torch import nn


def float_state(model: nn.Module) -> dict[str, torch.Tensor]:
    """The model's floating-point state entries (parameters and buffers such as BatchNorm
    statistics), each tensor once: an entry that is another name of an earlier entry's tensor is
    left out (MONAI's DynUNet registers its blocks twice, under ``skip_layers.*`` too; counting
    those would double its traffic). Tensors are the model's own (not copies)."""
    seen, entries = set(), {}
    for name, value in model.state_dict().items():
        if not value.is_floating_point():
            continue
        key = (value.data_ptr(), tuple(value.shape), value.stride(), value.dtype)
        if value.numel() and key in seen:
            continue
        seen.add(key)
        entries[name] = value
    return entries
