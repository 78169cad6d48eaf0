"""Segmentation networks from MONAI, built from a ``ModelConfig``.

Every network maps ``(B, C, *S)`` images to ``(B, R, *S)`` logits, one channel per
region; apply a sigmoid for probabilities. ``spatial_dims`` (2 or 3) follows the federation.
"""

from __future__ import annotations

import torch
from monai.networks.nets import DynUNet, UNet
from torch import nn

from fedseg.config import ModelConfig
from fedseg.models.state import float_state


def build_segmenter(cfg: ModelConfig, spatial_dims: int, in_channels: int, out_channels: int, seed: int) -> nn.Module:
    """Build the network with weights initialized from ``seed`` (same seed -> same weights)."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        if cfg.name == "unet":
            strides = cfg.strides or (2,) * (len(cfg.channels) - 1)
            if len(strides) != len(cfg.channels) - 1:
                raise ValueError(f"model.strides needs {len(cfg.channels) - 1} entries, got {len(strides)}")
            return UNet(
                spatial_dims=spatial_dims,
                in_channels=in_channels,
                out_channels=out_channels,
                channels=cfg.channels,
                strides=strides,
                num_res_units=cfg.num_res_units,
                norm=cfg.norm,
                dropout=cfg.dropout,
            )
        depth = len(cfg.channels)
        return DynUNet(
            spatial_dims=spatial_dims,
            in_channels=in_channels,
            out_channels=out_channels,
            kernel_size=[3] * depth,
            strides=[1] + [2] * (depth - 1),
            upsample_kernel_size=[2] * (depth - 1),
            filters=list(cfg.channels),
            norm_name=cfg.norm,
            dropout=cfg.dropout or None,
        )


def count_parameters(model: nn.Module) -> int:
    """Number of floats in the model's state (parameters and buffers; an aliased entry once)."""
    return sum(t.numel() for t in float_state(model).values())
