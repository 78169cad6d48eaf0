"""Mirroring test-time augmentation (``fedseg predict --tta``): a network's logits averaged over every flip
of the spatial axes.

nnU-Net's inference (Isensee et al., Nature Methods 2021; nnU-Net v2 ``predict_sliding_window_return_logits``)
runs the network on the image and on its mirrored copies along every subset of the spatial axes, flips each
output back and averages the logits: 2^D passes, 4 in 2D and 8 in 3D. ``fedseg predict --tta`` applies the same
to the network that segments each image (FedSM: the one its selector chose on the image as given; the selector
never sees a mirrored copy). It is not part of a run's evaluation: the FeTS 2022 benchmark (Sec. 4.4.2) leaves
inference free of extras that would hide one method's imperfections, and a run's tables follow it, so masks from
``--tta`` are not the masks a run's test scores were computed on.
"""

from __future__ import annotations

from itertools import combinations

import torch
from torch import nn


def mirror_axes(spatial_dims: int) -> list[tuple[int, ...]]:
    """Every subset of the spatial axes of a batch ``(B, C, *S)``, as tensor dims (2.. 2 + D - 1), the empty
    subset (the image as given) first: ``2 ** spatial_dims`` of them."""
    axes = range(2, 2 + spatial_dims)
    return [subset for k in range(spatial_dims + 1) for subset in combinations(axes, k)]


class MirrorAveraged(nn.Module):
    """``network`` with mirroring test-time augmentation: ``forward(x)`` ``(B, C, *S)`` -> the mean of
    ``flip(network(flip(x, axes)), axes)`` over :func:`mirror_axes` ``(B, R, *S)``, in the logits' dtype.

    A network that routes each image among several networks (``for_image``, FedSM's super model) routes on the
    image as given, then the chosen network is mirrored (:meth:`for_image`; ``forward`` does it image by image)."""

    def __init__(self, network: nn.Module, spatial_dims: int):
        super().__init__()
        self.network = network
        self.spatial_dims = spatial_dims
        self.axes = mirror_axes(spatial_dims)

    @torch.no_grad()
    def for_image(self, x: torch.Tensor) -> nn.Module:
        """The mirrored network for one image ``x`` ``(1, C, *S)``: itself, or for a routing network the network
        it routes ``x`` to, mirrored (the volume path's :func:`fedseg.evaluate.sliding.network_for` calls it)."""
        route = getattr(self.network, "for_image", None)
        return self if route is None else MirrorAveraged(route(x), self.spatial_dims)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if getattr(self.network, "for_image", None) is not None:  # route each image on itself, as given
            return torch.cat([self.for_image(image[None])(image[None]) for image in x])
        total = self.network(x)
        for axes in self.axes[1:]:
            total = total + torch.flip(self.network(torch.flip(x, axes)), axes)
        return total / len(self.axes)
