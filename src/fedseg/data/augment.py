"""On-the-fly training augmentations (config ``train.augment``; FeTS 2022 benchmark Sec. 4.4.3).

Applied on the CPU to every sample of a training batch (a patch, or a whole image on the
whole-image path), in the paper's order, each a MONAI transform:

1. ``RandFlipd`` along each spatial axis with probability ``flip_prob`` (image and region masks);
2. ``RandGaussianNoise`` (std ``noise_std``, not resampled) with probability ``noise_prob``;
3. ``RandGaussianSmooth`` (sigma in ``smooth_sigma`` per axis) with probability ``smooth_prob``;
4. ``RandScaleIntensity`` (factor in ``scale_range``) with probability ``scale_prob``;
5. ``RandAdjustContrast`` (gamma in ``contrast_gamma``) with probability ``contrast_prob``.

Randomness: one integer per batch drawn from the Trainer's generator (the site's per-(seed, site,
round, action) stream, ``fedseg.engine.context``) seeds the transforms (MONAI ``set_random_state``),
so a batch's augmentations are a function of that stream: the same in every engine and after a resume.
"""

from __future__ import annotations

import torch

from fedseg.config import AugmentConfig

IMAGE, LABEL = "image", "label"


def augmentations(cfg: AugmentConfig, dims: int):
    """The MONAI ``Compose`` of the module docstring for samples ``{"image": (C, *S), "label": (R, *S)}``."""
    from monai.transforms import (
        Compose,
        RandAdjustContrastd,
        RandFlipd,
        RandGaussianNoised,
        RandGaussianSmoothd,
        RandScaleIntensityd,
    )

    lo, hi = cfg.smooth_sigma
    return Compose(
        [
            *(RandFlipd(keys=[IMAGE, LABEL], prob=cfg.flip_prob, spatial_axis=axis) for axis in range(dims)),
            RandGaussianNoised(keys=IMAGE, prob=cfg.noise_prob, mean=0.0, std=cfg.noise_std, sample_std=False),
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
    """Augment images ``x`` ``(B, C, *S)`` and region masks ``y`` ``(B, R, *S)`` (CPU float) sample by
    sample; returns new tensors of the same shapes and dtypes. Seeded from ``generator`` (one draw)."""
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
