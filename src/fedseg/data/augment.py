"""On-the-fly training augmentations (config ``train.augment``; FeTS 2022 benchmark Sec. 4.4.3).

Applied to every sample of a training batch (a patch, or a whole image on the whole-image path) on the
batch's device (the GPU for CUDA), in the paper's order, each a MONAI transform:

1. ``RandFlipd`` along each spatial axis with probability ``flip_prob`` (image and region masks);
2. Gaussian noise (std ``noise_std``, not resampled) with probability ``noise_prob``: :class:`DeviceGaussianNoised`,
   MONAI's ``RandGaussianNoised`` with the noise drawn by torch on the image's device (MONAI draws it with
   NumPy on the CPU in float64: on an H200's host 0.19 s of CPU per 4 x 128^3 patch, holding the interpreter lock,
   then a 32 MiB float32 copy to the GPU: the largest wait of a FeTS site's turn, ``benchmarks/gpu_profile.py``);
3. ``RandGaussianSmooth`` (sigma in ``smooth_sigma`` per axis) with probability ``smooth_prob``;
4. ``RandScaleIntensity`` (factor in ``scale_range``) with probability ``scale_prob``;
5. ``RandAdjustContrast`` (gamma in ``contrast_gamma``) with probability ``contrast_prob``.

Randomness: one integer per batch drawn from the Trainer's generator (the site's per-(seed, site,
round, action) stream, ``fedseg.engine.context``) seeds the transforms (MONAI ``set_random_state``),
so a batch's augmentations are a function of that stream: the same in every engine and after a resume. The noise
is a function of its transform's seed and of where it is drawn: on CUDA the GPU model (torch sizes its random
streams by the number of multiprocessors: an H100 and an H200 draw other noise), on the CPU torch's vector kernels
(another CPU type can move the last bits). On one machine and installation runs are bit-identical to each other
(any number of workers and loader threads, every engine); a GPU run's bf16 numbers differ from the CPU's anyway.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping

import torch
from monai.transforms import MapTransform, RandomizableTransform

from fedseg.config import AugmentConfig

IMAGE, LABEL = "image", "label"


class DeviceGaussianNoised(RandomizableTransform, MapTransform):
    """``keys``' images (tensors ``(C, *S)``) plus ``N(0, std^2)`` noise with probability ``prob`` (MONAI
    ``RandGaussianNoised`` with ``mean=0, sample_std=False``), the noise drawn by ``torch.randn`` on the image's
    device from a generator seeded by this transform's random state (one draw for ``prob``, one for the seed when
    applied; every key gets the same noise, as MONAI's); a floating-point image keeps its dtype, another becomes
    float32 (as MONAI's default ``dtype``)."""

    def __init__(self, keys, prob: float, std: float, allow_missing_keys: bool = False) -> None:
        MapTransform.__init__(self, keys, allow_missing_keys)
        RandomizableTransform.__init__(self, prob)
        self.std = std
        self.seed = 0

    def randomize(self, data=None) -> None:
        super().randomize(None)
        if self._do_transform:
            self.seed = int(self.R.randint(2**31 - 1))

    def __call__(self, data: Mapping[Hashable, torch.Tensor]) -> dict[Hashable, torch.Tensor]:
        d = dict(data)
        self.randomize()
        if not self._do_transform:
            return d
        for key in self.key_iterator(d):
            image = torch.as_tensor(d[key])
            image = image if image.is_floating_point() else image.float()
            generator = torch.Generator(device=image.device).manual_seed(self.seed)
            noise = torch.randn(image.shape, generator=generator, device=image.device, dtype=image.dtype)
            d[key] = image + self.std * noise
        return d


def augmentations(cfg: AugmentConfig, dims: int):
    """The MONAI ``Compose`` of the module docstring for samples ``{"image": (C, *S), "label": (R, *S)}``."""
    from monai.transforms import (
        Compose,
        RandAdjustContrastd,
        RandFlipd,
        RandGaussianSmoothd,
        RandScaleIntensityd,
    )

    lo, hi = cfg.smooth_sigma
    return Compose(
        [
            *(RandFlipd(keys=[IMAGE, LABEL], prob=cfg.flip_prob, spatial_axis=axis) for axis in range(dims)),
            DeviceGaussianNoised(keys=IMAGE, prob=cfg.noise_prob, std=cfg.noise_std),
            RandGaussianSmoothd(keys=IMAGE, prob=cfg.smooth_prob, sigma_x=(lo, hi), sigma_y=(lo, hi), sigma_z=(lo, hi)),
            RandScaleIntensityd(
                keys=IMAGE, prob=cfg.scale_prob, factors=(cfg.scale_range[0] - 1.0, cfg.scale_range[1] - 1.0)
            ),
            RandAdjustContrastd(keys=IMAGE, prob=cfg.contrast_prob, gamma=cfg.contrast_gamma),
        ]
    )


def augment_batch(
    x: torch.Tensor, y: torch.Tensor, cfg: AugmentConfig, generator: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor]:
    """Augment images ``x`` ``(B, C, *S)`` and region masks ``y`` ``(B, R, *S)`` (float, on any one device) sample
    by sample; returns new tensors of the same shapes and dtypes. Seeded from ``generator`` (one draw)."""
    from monai.data import MetaTensor

    seed = int(torch.randint(0, 2**31 - 1, (), generator=generator))
    transform = augmentations(cfg, x.dim() - 2)
    transform.set_random_state(seed=seed)
    xs: list[torch.Tensor] = []
    ys: list[torch.Tensor] = []
    for image, label in zip(x, y):
        out = transform({IMAGE: image.clone(), LABEL: label.clone()})
        for key, dest in ((IMAGE, xs), (LABEL, ys)):
            value = out[key]
            dest.append((value.as_tensor() if isinstance(value, MetaTensor) else torch.as_tensor(value)).float())
    return torch.stack(xs).to(x.dtype), torch.stack(ys).to(y.dtype)
