"""Mapping predictions back one region at a time (fedseg.data.volumes.restore with a threshold, as
fedseg.evaluate.sliding.predict_on_grid does) gives the masks, and so the scores, of mapping all regions back at
once and thresholding: bit for bit, with and without resampling, in 3D and 2D."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from fedseg.config import VolumeConfig
from fedseg.data.federation import Regions
from fedseg.data.volumes import Grid, build_volume, preprocess, restore
from fedseg.evaluate import sliding

torch.set_num_threads(1)
CPU = torch.device("cpu")
NESTED = Regions.from_mapping({"a": [1, 2, 3], "b": [2, 3], "c": [3]})


def reference(values: torch.Tensor, grid: Grid, threshold: float) -> torch.Tensor:
    """What evaluation did before: every region mapped back at once, then thresholded."""
    return restore(values, grid) > threshold


def case(shape: tuple[int, ...], seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """A 1-channel image, non-zero inside a margin (so the foreground crop cuts), and nested labels 1 > 2 > 3."""
    rng = np.random.default_rng(seed)
    image = np.zeros((1, *shape), np.float32)
    inner = tuple(slice(3, n - 4) for n in shape)
    image[(0, *inner)] = rng.normal(size=image[(0, *inner)].shape) + 1.0
    r2 = sum(a**2 for a in np.meshgrid(*[np.linspace(-1, 1, n) for n in shape], indexing="ij", sparse=True))
    label = (r2 < 0.6).astype(np.uint8) + (r2 < 0.3) + (r2 < 0.1)
    return image, label


SETUPS = [  # shape, spacing, data.volume.spacing
    ((37, 41, 23), (0.8, 0.8, 2.5), (1.5, 1.5, 1.5)),  # resampled, 3D
    ((61, 53), (0.7, 1.3), (1.0, 1.0)),  # resampled, 2D
    ((30, 31, 17), (1.0, 1.0, 2.0), None),  # crop and pad only
    ((45, 38), (1.0, 1.0), None),
]


@pytest.mark.parametrize("shape,spacing,target", SETUPS)
@pytest.mark.parametrize("threads", [1, 2])
def test_restore_with_threshold_is_all_regions_then_threshold(shape, spacing, target, threads):
    image, label = case(shape)
    _, masks, grid = preprocess(image, label, NESTED, spacing, VolumeConfig(patch_size=8, spacing=target), "none")
    assert masks is not None and (grid.affine is not None) == (target is not None)
    probs = torch.sigmoid(3 * torch.randn((3, *masks.shape[1:]), generator=torch.Generator().manual_seed(1)))
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        for threshold in (0.5, 0.3, 0.9):
            new = restore(probs, grid, threshold)
            assert new.dtype == torch.bool and new.shape == (3, *shape)
            assert torch.equal(new, reference(probs, grid, threshold))
        assert torch.equal(restore(masks, grid, 0.5), reference(masks, grid, 0.5))  # bool input, as restore takes
        for r in range(3):  # each region alone, as the thresholded path maps them: the same numbers as all at once
            assert torch.equal(restore(probs[r : r + 1], grid)[0], restore(probs, grid)[r])
    finally:
        torch.set_num_threads(before)


class Net(nn.Module):
    """A small random convolutional network, 1 -> 3 channels, 2D or 3D (logits of both signs, ragged masks)."""

    def __init__(self, dims: int):
        super().__init__()
        conv = nn.Conv3d if dims == 3 else nn.Conv2d
        torch.manual_seed(0)
        self.body = nn.Sequential(conv(1, 4, 3, padding=1), nn.Tanh(), conv(4, 3, 3, padding=1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return 4 * self.body(x) + 2 * x[:, :1]


def old_predict_on_grid(model, image, grid, cfg, threshold, device, blend=CPU, keep_logits=None):
    """``predict_on_grid`` as it was: sigmoid into a new tensor, all regions restored at once, then thresholded."""
    logits = sliding.sliding_logits(model, image, cfg, device, blend)
    if keep_logits is not None:
        keep_logits.append(logits.cpu())
    return reference(torch.sigmoid(logits), grid, threshold)


@pytest.mark.parametrize("shape,spacing,target", SETUPS)
def test_scores_and_kept_logits_are_those_of_mapping_all_regions_back(monkeypatch, shape, spacing, target):
    cfg = VolumeConfig(patch_size=8, spacing=target, sw_batch_size=2)
    vols = [build_volume(*case(shape, seed), NESTED, spacing, cfg, "zscore_foreground") for seed in (0, 1)]
    net = Net(len(shape))
    logits = sliding.sliding_logits(net, vols[0].image, cfg, CPU)
    masks = sliding.predict_on_grid(net, vols[0].image, vols[0].grid, cfg, 0.5, CPU)
    assert torch.equal(masks, old_predict_on_grid(net, vols[0].image, vols[0].grid, cfg, 0.5, CPU))
    assert 0 < masks.sum() < masks.numel()  # neither empty nor full: the border is where it could differ

    def scores(regions):
        kept: list[torch.Tensor] = []
        out = sliding.score_volumes(net, vols, cfg, 0.5, True, CPU, worst=100.0, regions=regions, first_logits=kept)
        return out, kept

    for regions in (None, NESTED):
        new, new_kept = scores(regions)
        with monkeypatch.context() as m:
            m.setattr(sliding, "predict_on_grid", old_predict_on_grid)
            old, old_kept = scores(regions)
        for metric in ("dice", "hd95", "nsd"):
            assert new[metric].tobytes() == old[metric].tobytes(), metric
        assert len(new_kept) == 1 and torch.equal(new_kept[0], logits)  # the kept logits, not their sigmoid
        assert torch.equal(old_kept[0], logits)
