"""Sliding-window inference on the original grid (fedseg.evaluate.sliding) and metrics there in mm."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from torch import nn

from fedseg.config import VolumeConfig
from fedseg.data.federation import Regions
from fedseg.data.volumes import build_volume
from fedseg.evaluate.sliding import score_volumes, sliding_logits

torch.set_num_threads(1)
CPU = torch.device("cpu")
ONE = Regions.from_mapping({"object": [1]})


class Threshold(nn.Module):
    """Logits of ``image > 0.5`` (channel 0): predicts exactly the bright object of the image."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (x[:, :1] - 0.5) * 40


class Ones(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ones_like(x[:, :1])


class Repeat(nn.Module):
    """``net``'s one output channel repeated for ``regions`` regions."""

    def __init__(self, net: nn.Module, regions: int):
        super().__init__()
        self.net, self.regions = net, regions

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x).repeat(1, self.regions, *([1] * (x.dim() - 2)))


class Constant(nn.Module):
    def __init__(self, value: float):
        super().__init__()
        self.value = value

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.full_like(x[:, :1], self.value)


def ball(shape: tuple[int, ...], spacing: tuple[float, ...], radius: float) -> np.ndarray:
    """Voxels whose centre lies within ``radius`` mm of the grid's centre (mm)."""
    grids = np.meshgrid(*[(np.arange(n) - (n - 1) / 2) * s for n, s in zip(shape, spacing)], indexing="ij")
    return sum(g**2 for g in grids) <= radius**2


def test_sliding_window_equals_a_whole_volume_pass_and_covers_every_voxel():
    torch.manual_seed(0)
    net = nn.Sequential(nn.Conv3d(2, 8, 1), nn.ReLU(), nn.Conv3d(8, 3, 1)).eval()  # pointwise: no borders
    image = torch.randn(2, 37, 29, 21)  # larger than the patch on every axis, not a multiple of it
    cfg = VolumeConfig(patch_size=(16, 12, 8), sw_batch_size=3)
    out = sliding_logits(net, image, cfg, CPU)
    with torch.no_grad():
        whole = net(image[None])[0]
    assert out.shape == (3, 37, 29, 21)
    torch.testing.assert_close(out, whole, atol=1e-5, rtol=1e-5)
    covered = sliding_logits(Ones(), image, cfg, CPU)  # Gaussian blending of ones is 1 wherever a window ran
    torch.testing.assert_close(covered, torch.ones(1, 37, 29, 21), atol=1e-5, rtol=0)


def test_concentric_spheres_give_the_analytic_hd95_in_mm_under_anisotropic_spacing():
    """Truth: a ball of 18 mm, prediction: a concentric ball of 12 mm, on a (0.5, 0.5, 1.5) mm grid.
    Every surface point of one is 6 mm from the other: HD95 = 6 mm (up to the voxel size), while the
    same masks in voxel units would give about 12. Dice = 2 r^3 / (r^3 + R^3)."""
    shape, spacing = (84, 84, 30), (0.5, 0.5, 1.5)
    outer, inner = ball(shape, spacing, 18.0), ball(shape, spacing, 12.0)
    image = inner.astype(np.float32)[None]  # the Threshold network predicts the inner ball
    vol = build_volume(image, outer.astype(np.uint8), ONE, spacing, VolumeConfig(patch_size=16), "none")
    scores = score_volumes(Threshold(), [vol], VolumeConfig(patch_size=16), 0.5, True, CPU)
    dice, hd = scores["dice"], scores["hd95"]
    assert hd[0, 0] == pytest.approx(6.0, abs=0.75)
    assert dice[0, 0] == pytest.approx(2 * 12**3 / (12**3 + 18**3), abs=0.02)


def test_empty_prediction_rule_on_the_original_grid():
    """BraTS convention (fedseg.evaluate.metrics): both empty -> Dice 1, HD95 0; truth without prediction
    and prediction without truth -> Dice 0, HD95 = eval.hd95_worst, by default the diagonal in mm."""
    shape, spacing = (20, 18, 12), (1.0, 1.2, 3.0)
    regions = Regions.from_mapping({"a": [1], "b": [2], "c": [3]})
    image = np.zeros((1, *shape), np.float32)
    image[0, 5:9, 5:9, 3:6] = 1.0  # the network predicts this box for every region
    label = np.zeros(shape, np.uint8)
    label[12:16, 10:14, 6:9] = 2  # region b: present, far from the prediction: a miss plus a false positive
    vol = build_volume(image, label, regions, spacing, VolumeConfig(patch_size=8), "none")
    net = Repeat(Threshold(), 3)
    diagonal = math.sqrt(sum((n * s) ** 2 for n, s in zip(shape, spacing)))
    cfg = VolumeConfig(patch_size=8)
    scores = score_volumes(net, [vol], cfg, 0.5, True, CPU)
    dice, hd = scores["dice"], scores["hd95"]
    assert dice[0].tolist() == [0.0, 0.0, 0.0]  # a, c: truth empty, prediction not; b: no overlap
    assert hd[0, 0] == hd[0, 2] == pytest.approx(diagonal)
    assert hd[0, 1] < diagonal
    empty = Repeat(Constant(-10.0), 3)
    scores = score_volumes(empty, [vol], cfg, 0.5, True, CPU, worst=373.13)
    dice, hd = scores["dice"], scores["hd95"]
    assert dice[0].tolist() == [1.0, 0.0, 1.0] and hd[0].tolist() == [0.0, 373.13, 0.0]


class TwoThresholds(nn.Module):
    """Logits of ``image > 0.5`` per channel: region k predicted exactly where channel k is bright."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (x[:, :2] - 0.5) * 40


def test_nested_regions_are_scored_as_the_label_map_they_paint_on_the_original_grid():
    """The volume path scores what ``fedseg predict`` writes (eval.score_on: label_map): an inner region predicted
    beyond the outer one is painted inner, which lies in the outer region, so the outer region gains it; scored as
    channels the outer region misses it."""
    shape, spacing = (24, 20, 12), (1.0, 1.0, 2.5)
    nested = Regions.from_mapping({"outer": [1, 2], "inner": [2]})
    outer, inner = ball(shape, spacing, 6.0), ball(shape, spacing, 8.0) & (np.arange(shape[0]) >= 12)[:, None, None]
    image = np.stack([outer, inner]).astype(np.float32)  # the inner half-ball reaches beyond the outer ball
    label = np.where(inner, 2, np.where(outer, 1, 0)).astype(np.uint8)  # the label map the prediction paints
    vol = build_volume(image, label, nested, spacing, VolumeConfig(patch_size=8), "none")
    cfg = VolumeConfig(patch_size=8)
    painted = score_volumes(TwoThresholds(), [vol], cfg, 0.5, True, CPU, regions=nested)
    assert painted["dice"][0].tolist() == [1.0, 1.0] and painted["hd95"][0].tolist() == [0.0, 0.0]
    channels = score_volumes(TwoThresholds(), [vol], cfg, 0.5, True, CPU)
    union = int((outer | inner).sum())
    assert channels["dice"][0, 0] == pytest.approx(2 * outer.sum() / (outer.sum() + union))
    assert channels["dice"][0, 0] < 1.0 and channels["dice"][0, 1] == 1.0


def test_surface_metrics_in_background_threads_equal_the_inline_ones_in_case_order(monkeypatch):
    """With the network on an accelerator, HD95/NSD run in background threads while the next cases are predicted
    (``surface_threads``): every case's numbers are those computed inline, in the cases' order; forced here on the
    CPU with more cases than the threads keep in flight (2 per thread)."""
    from fedseg.evaluate import sliding

    cfg = VolumeConfig(patch_size=8)
    vols = []
    for k in range(7):
        shape, spacing = (14 + k, 12, 10), (1.0, 0.8 + 0.1 * k, 2.0)
        image = ball(shape, spacing, 3.0 + k / 2).astype(np.float32)[None]
        vols.append(build_volume(image, ball(shape, spacing, 4.0).astype(np.uint8), ONE, spacing, cfg, "none"))
    inline = score_volumes(Threshold(), vols, cfg, 0.5, True, CPU)
    monkeypatch.setattr(sliding, "surface_threads", lambda device: 2)
    threaded = score_volumes(Threshold(), vols, cfg, 0.5, True, CPU)
    for metric in ("dice", "hd95", "nsd"):
        np.testing.assert_array_equal(threaded[metric], inline[metric])
    assert len(set(inline["hd95"][:, 0].tolist())) > 3  # the cases differ: an order mix-up would show
