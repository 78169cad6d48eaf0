"""Segmentation networks from MONAI, built from a ``ModelConfig``.

Every network maps ``(B, C, *S)`` images to ``(B, R, *S)`` logits, one channel per
region; apply a sigmoid for probabilities. ``spatial_dims`` (2 or 3) follows the federation.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import cast

import torch
from monai.networks.nets import DynUNet, UNet
from torch import nn

from fedseg.config import ModelConfig
from fedseg.models.state import float_state


def build_segmenter(cfg: ModelConfig, spatial_dims: int, in_channels: int, out_channels: int, seed: int) -> nn.Module:
    """Build the network with weights initialized from ``seed`` (same seed -> same weights).

    ``dynunet``: MONAI ``DynUNet`` with ``len(channels)`` levels, level ``i`` convolving with
    ``kernel_sizes[i]`` (default 3) and level ``i + 1`` downsampling by ``strides[i]`` (default 2), each one
    number or one per axis (a planned network: kernel 1 and stride 1 on an axis too coarse to pool yet,
    ``fedseg.plan.planner``); upsampling mirrors the strides. ``planned`` is resolved by the run into such a
    ``dynunet`` before any network is built."""
    if cfg.name == "planned":
        raise ValueError(
            "model.name planned is resolved by the run (fedseg.run.run_experiment plans a dynunet from the sites' "
            "fingerprints); build the planned network from plan.json's model settings instead"
        )
    depth = len(cfg.channels)
    strides = cfg.strides or (2,) * (depth - 1)  # its length: checked by ModelConfig
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        if cfg.name == "unet":
            return UNet(
                spatial_dims=spatial_dims,
                in_channels=in_channels,
                out_channels=out_channels,
                channels=cfg.channels,
                strides=cast(Sequence[int], strides),  # MONAI takes one number or one per axis per level
                num_res_units=cfg.num_res_units,
                norm=cfg.norm,
                dropout=cfg.dropout,
            )
        kernels = cfg.kernel_sizes or (3,) * depth  # its length: checked by ModelConfig
        return DynUNet(
            spatial_dims=spatial_dims,
            in_channels=in_channels,
            out_channels=out_channels,
            kernel_size=list(kernels),
            strides=[1, *strides],
            upsample_kernel_size=list(strides),
            filters=list(cfg.channels),
            norm_name=cfg.norm,
            dropout=cfg.dropout or None,
        )


def count_parameters(model: nn.Module) -> int:
    """Number of floats in the model's state (parameters and buffers; an aliased entry once)."""
    return sum(t.numel() for t in float_state(model).values())
