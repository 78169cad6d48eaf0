"""FedSM's model selector: a VGG-11-style image classifier (Simonyan & Zisserman 2014, config "A").

The FedSM paper (Sec. 4) uses VGG-11 as the selector f_s(w_s; x) that maps an image to a
score vector over candidate models. Here the channel widths of VGG-11's eight 3x3 conv
layers (64, M, 128, M, 256, 256, M, 512, 512, M, 512, 512, M) are multiplied by ``width``
(a quarter-width selector keeps CPU runs fast; see ``benchmarks/selector_speed.py``), each
conv is followed by a normalization layer (``batch`` | ``instance``) and ReLU, and the
features are average-pooled to 1 voxel per channel before a two-layer classifier head.

Input: images ``(B, C, *S)`` (``S`` 2D or 3D); if ``input_size`` is set they are first
resampled to ``input_size`` per side (``area``: the mean of the voxels each output voxel covers, in 2D and 3D), so
the selector may read a downsampled image. Output: logits ``(B, num_classes)`` (apply a softmax for scores). The
last conv block runs at ceil(side / 16) per axis after four 2x pools, and a normalization layer needs more than one
value per channel (InstanceNorm more than one voxel, BatchNorm a batch > 1 at 1 voxel): with instance norm a side
of at least :data:`MIN_INSTANCE_SIDE` (``SelectorOptions`` refuses a smaller ``selector_input_size``).

BatchNorm's running statistics are float buffers: ``weights_of`` includes them, so they are
averaged with the weights; ``num_batches_tracked`` is an integer buffer and is not sent.
"""

from __future__ import annotations

from typing import Literal

import torch
import torch.nn.functional as F
from torch import nn

VGG11 = (64, "M", 128, "M", 256, 256, "M", 512, 512, "M", 512, 512, "M")
LAST_BLOCK_STRIDE = 16  # four 2x pools before the last conv block
MIN_INSTANCE_SIDE = LAST_BLOCK_STRIDE + 1  # the smallest side whose last block keeps 2 voxels per axis
HEAD = 256  # hidden units of the classifier head at width 1


class Selector(nn.Module):
    """VGG-11-style classifier. See the module docstring for shapes."""

    def __init__(
        self,
        in_channels: int,
        num_classes: int,
        width: float = 0.25,
        norm: Literal["batch", "instance"] = "batch",
        input_size: int | None = None,
        spatial_dims: int = 2,
    ):
        super().__init__()
        if spatial_dims not in (2, 3):
            raise ValueError(f"selector: spatial_dims must be 2 or 3, got {spatial_dims}")
        if width <= 0:
            raise ValueError(f"selector: width must be positive, got {width}")
        if num_classes < 2:
            raise ValueError(f"selector: needs at least 2 classes, got {num_classes}")
        conv = nn.Conv2d if spatial_dims == 2 else nn.Conv3d
        pool = nn.MaxPool2d if spatial_dims == 2 else nn.MaxPool3d
        norms = {
            "batch": nn.BatchNorm2d if spatial_dims == 2 else nn.BatchNorm3d,
            "instance": nn.InstanceNorm2d if spatial_dims == 2 else nn.InstanceNorm3d,
        }
        if norm not in norms:
            raise ValueError(f"selector: norm must be 'batch' or 'instance', got {norm!r}")
        layers: list[nn.Module] = []
        channels = in_channels
        for item in VGG11:
            if item == "M":
                # ceil_mode keeps a 1-pixel map at 1 pixel, so small inputs never shrink to zero
                layers.append(pool(kernel_size=2, stride=2, ceil_mode=True))
                continue
            out = max(1, round(int(item) * width))
            norm_layer = norms[norm](out) if norm == "batch" else norms[norm](out, affine=True)
            layers += [conv(channels, out, kernel_size=3, padding=1), norm_layer, nn.ReLU(inplace=True)]
            channels = out
        self.features = nn.Sequential(*layers)
        self.pool = nn.AdaptiveAvgPool2d(1) if spatial_dims == 2 else nn.AdaptiveAvgPool3d(1)
        hidden = max(8, round(HEAD * width))
        self.head = nn.Sequential(nn.Linear(channels, hidden), nn.ReLU(inplace=True), nn.Linear(hidden, num_classes))
        self.input_size = input_size
        self.spatial_dims = spatial_dims
        self.num_classes = num_classes

    def embed(self, x: torch.Tensor) -> torch.Tensor:
        """Penultimate features: images ``(B, C, *S)`` -> the head's hidden activations ``(B, hidden)``
        (after its ReLU, before the last linear layer; e.g. for a t-SNE map, FedSM paper Fig. 3)."""
        if self.input_size is not None and tuple(x.shape[2:]) != (self.input_size,) * self.spatial_dims:
            x = F.interpolate(x, size=(self.input_size,) * self.spatial_dims, mode="area")
        return self.head[:-1](torch.flatten(self.pool(self.features(x)), 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head[-1](self.embed(x))


def build_selector(
    in_channels: int,
    num_classes: int,
    width: float = 0.25,
    norm: Literal["batch", "instance"] = "batch",
    input_size: int | None = None,
    spatial_dims: int = 2,
    seed: int = 0,
) -> Selector:
    """A ``Selector`` with weights initialized from ``seed`` (same seed -> same weights)."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return Selector(in_channels, num_classes, width, norm, input_size, spatial_dims)
