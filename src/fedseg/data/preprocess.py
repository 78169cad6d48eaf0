"""Case arrays -> model tensors: resize to the model input size and normalize intensities.

The same function serves training, evaluation and ``fedseg predict`` so that a
prediction on a file equals the evaluation of the same case.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, overload

import numpy as np
import torch
import torch.nn.functional as F

from fedseg.data.federation import Regions

Normalize = Literal["minmax", "zscore", "zscore_foreground", "zscore_channel", "ct", "none"]
Fit = Literal["stretch", "pad"]  # data.resize: how an image reaches the square (cubic) model input


@dataclass(frozen=True)
class CTWindows:
    """nnU-Net's ``CTNormalization``, per channel ``(lower, upper, mean, std)``: clip to ``[lower, upper]`` (the
    0.5 / 99.5 percentiles of the foreground intensities over every training case), subtract ``mean``, divide by
    ``std`` (their mean and std); the same numbers for every case (``data.normalize: ct``, ``data.ct_windows``)."""

    windows: tuple[tuple[float, float, float, float], ...]


def normalization(mode: Normalize, ct_windows: Sequence[Sequence[float]] | None) -> Normalize | CTWindows:
    """What :func:`normalize_image` takes for ``data.normalize`` / ``data.ct_windows``: the mode, or for ``ct`` the
    windows (``ValueError`` without them)."""
    if mode != "ct":
        return mode
    if not ct_windows:
        raise ValueError("data.normalize = ct needs data.ct_windows: (lower, upper, mean, std) per channel")
    return CTWindows(tuple((float(a), float(b), float(m), float(sd)) for a, b, m, sd in ct_windows))


def normalize_image(image: np.ndarray, mode: Normalize | CTWindows) -> np.ndarray:
    """Intensity normalization; returns float32 ``(C, *spatial)``.

    ``minmax`` maps the image's range to [0, 1] over all channels (colour differences between channels
    are kept); ``zscore`` subtracts the image's mean and divides by its standard deviation (all channels
    together); ``zscore_foreground`` normalizes each channel (modality) alone to mean 0 and standard
    deviation 1 over its own non-zero voxels, leaving the zero background at 0 (MONAI
    ``NormalizeIntensity(nonzero=True, channel_wise=True)``; FeTS 2022 benchmark Sec. 4.4.2, nnU-Net's
    MRI scheme); ``zscore_channel`` normalizes each channel alone over all its voxels (nnU-Net's
    ``ZScoreNormalization`` without a mask); :class:`CTWindows` clips and scales each channel with the
    dataset's numbers (nnU-Net's ``CTNormalization``); ``none`` only casts.
    """
    x = image.astype(np.float32)
    if isinstance(mode, CTWindows):
        if len(mode.windows) != len(x):
            raise ValueError(f"data.ct_windows: {len(mode.windows)} windows for an image of {len(x)} channels")
        out = np.empty_like(x)
        for c, (lower, upper, mean, std) in enumerate(mode.windows):
            out[c] = (np.clip(x[c], lower, upper) - mean) / max(std, 1e-8)
        return out
    if mode == "ct":
        raise ValueError("data.normalize = ct needs data.ct_windows: (lower, upper, mean, std) per channel")
    if mode in ("zscore_foreground", "zscore_channel"):
        from monai.transforms import NormalizeIntensity

        masked = mode == "zscore_foreground"
        return np.asarray(NormalizeIntensity(nonzero=masked, channel_wise=True)(x), dtype=np.float32)
    if mode == "minmax":
        lo, hi = float(x.min()), float(x.max())
        return (x - lo) / (hi - lo) if hi > lo else np.zeros_like(x)
    if mode == "zscore":
        std = float(x.std())
        return (x - float(x.mean())) / std if std > 0 else np.zeros_like(x)
    return x


def fit_box(spatial: Sequence[int], size: int, fit: Fit = "stretch") -> tuple[tuple[int, ...], tuple[int, ...]]:
    """Where an image of shape ``spatial`` lies in the ``size``-per-axis model input: ``(shape, offset)`` per axis.
    ``stretch``: the whole input (each axis scaled on its own: a non-square image is squashed); ``pad``: scaled by
    one factor, ``size / max(spatial)``, so its longest side fills the input and its aspect ratio is kept, centred,
    the rest zero (letterboxing). Both give the whole input for a square (cubic) image."""
    if fit == "stretch":
        return (size,) * len(spatial), (0,) * len(spatial)
    scale = size / max(spatial)
    shape = tuple(min(size, max(1, round(n * scale))) for n in spatial)
    return shape, tuple((size - n) // 2 for n in shape)


def resize(
    image: torch.Tensor, label: torch.Tensor | None, size: int, fit: Fit = "stretch"
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Resize ``image (C, *spatial)`` (linear) and ``label (*spatial)`` (nearest) to ``size`` per axis, placed as
    :func:`fit_box` says (``pad``: zeros around the image, background around the label)."""
    spatial = image.shape[1:]
    target = (size,) * len(spatial)
    if tuple(spatial) == target:
        return image, label
    shape, offset = fit_box(spatial, size, fit)
    mode = "bilinear" if len(spatial) == 2 else "trilinear"
    inner = F.interpolate(image[None], size=shape, mode=mode, align_corners=False)[0]
    inner_label = None if label is None else F.interpolate(label[None, None].float(), size=shape, mode="nearest")[0, 0]
    if shape == target:
        return inner, None if inner_label is None else inner_label.long()
    box = tuple(slice(o, o + n) for o, n in zip(offset, shape))
    image = inner.new_zeros((inner.shape[0], *target))
    image[(slice(None), *box)] = inner
    if inner_label is not None:
        label = torch.zeros(target, dtype=torch.long)
        label[box] = inner_label.long()
    return image, None if label is None else label


@overload
def case_tensors(
    image: np.ndarray, label: np.ndarray, regions: Regions, size: int, normalize: Normalize | CTWindows, fit: Fit = ...
) -> tuple[torch.Tensor, torch.Tensor]: ...
@overload
def case_tensors(
    image: np.ndarray, label: None, regions: Regions, size: int, normalize: Normalize | CTWindows, fit: Fit = ...
) -> tuple[torch.Tensor, None]: ...
@overload
def case_tensors(
    image: np.ndarray,
    label: np.ndarray | None,
    regions: Regions,
    size: int,
    normalize: Normalize | CTWindows,
    fit: Fit = ...,
) -> tuple[torch.Tensor, torch.Tensor | None]: ...
def case_tensors(
    image: np.ndarray,
    label: np.ndarray | None,
    regions: Regions,
    size: int,
    normalize: Normalize | CTWindows,
    fit: Fit = "stretch",
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Return ``(x (C, *S) float32, y (R, *S) float32 region masks or None)`` with ``S = (size,)*dims``, the image
    placed as ``fit`` says (``data.resize``, :func:`fit_box`). With an ignore label ``y`` has one more, last channel:
    the known voxels (``Regions.target``; resized nearest with the label, padding known background)."""
    x = torch.from_numpy(normalize_image(image, normalize))
    lab = torch.from_numpy(label.astype(np.int64)) if label is not None else None
    x, lab = resize(x, lab, size, fit)
    if lab is None:
        return x, None
    y = torch.from_numpy(regions.target(lab.numpy())).float()
    return x, y


def restore_size(mask: torch.Tensor, spatial: tuple[int, ...], fit: Fit = "stretch") -> torch.Tensor:
    """Region masks ``(R, *S)`` of the model input back on an original ``spatial`` shape: the image's box in the
    input (:func:`fit_box`; ``pad``: the padding left out) resized nearest-neighbour."""
    if tuple(mask.shape[1:]) == tuple(spatial):
        return mask
    inner = mask[(slice(None), *_box(spatial, mask.shape[1], fit))]
    return F.interpolate(inner[None].float(), size=spatial, mode="nearest")[0].to(mask.dtype)


def restore_image(image: torch.Tensor, spatial: tuple[int, ...], fit: Fit = "stretch") -> torch.Tensor:
    """A model-input image ``(C, *S)`` back on an original ``spatial`` shape (linear; for a figure's panel)."""
    if tuple(image.shape[1:]) == tuple(spatial):
        return image
    inner = image[(slice(None), *_box(spatial, image.shape[1], fit))]
    mode = "bilinear" if len(spatial) == 2 else "trilinear"
    return F.interpolate(inner[None], size=spatial, mode=mode, align_corners=False)[0]


def _box(spatial: Sequence[int], size: int, fit: Fit) -> tuple[slice, ...]:
    shape, offset = fit_box(spatial, size, fit)
    return tuple(slice(o, o + n) for o, n in zip(offset, shape))
