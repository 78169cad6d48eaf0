"""Dice / HD95 on hand-made masks with hand-computed values."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from fedseg.evaluate.metrics import batch_metrics, case_metrics, logits_to_masks


def square(top: int, left: int, size: int, shape=(32, 32)) -> torch.Tensor:
    """(1, H, W) bool mask with one filled size x size square."""
    m = torch.zeros((1, *shape), dtype=torch.bool)
    m[0, top : top + size, left : left + size] = True
    return m


def test_dice_two_overlapping_squares():
    # 10x10 squares, rows 5..14 vs 8..17: overlap 7x10 = 70 px; Dice = 2*70/(100+100).
    dice, _ = case_metrics(square(5, 5, 10), square(8, 5, 10))
    assert dice == pytest.approx([0.7], abs=1e-6)
    # 10x10 vs 10x10 shifted diagonally by (2, 4): overlap 8x6 = 48 -> 96/200.
    dice, _ = case_metrics(square(5, 5, 10), square(7, 9, 10))
    assert dice == pytest.approx([0.48], abs=1e-6)


@pytest.mark.parametrize("k", [1, 3, 6])
def test_hd95_shifted_square_equals_shift(k):
    # MONAI measures distances between edge pixels (mask XOR its erosion), from every
    # edge pixel of one mask to the nearest edge pixel of the other, in both directions.
    # For a 10x10 square shifted by k rows, all distances are <= k, and the whole far
    # side (10 of the 36 edge pixels, 28% > 5%) is exactly k away, so the 95th
    # percentile is k.
    _, hd = case_metrics(square(5, 5, 10), square(5 + k, 5, 10))
    assert hd == pytest.approx([float(k)], abs=1e-6)


def test_hd95_ignores_single_far_outlier_pixel():
    # Prediction = truth + one stray pixel 10 rows and 10 cols beyond the corner.
    # 37 pred edge pixels: 36 at distance 0, one at sqrt(200); the 95th percentile
    # (linear interpolation at position 0.95*36 = 34.2 of the sorted list) is 0.
    # The plain Hausdorff distance (max) would be sqrt(200) = 14.14.
    truth = square(5, 5, 10)
    pred = truth.clone()
    pred[0, 24, 24] = True
    dice, hd = case_metrics(pred, truth)
    assert hd == pytest.approx([0.0], abs=1e-6)
    assert dice == pytest.approx([200 / 201], abs=1e-6)


def test_hd95_spacing_gives_physical_units():
    # Shift of 3 rows with row spacing 2.0 mm -> 6 mm.
    _, hd = case_metrics(square(5, 5, 10), square(8, 5, 10), spacing=(2.0, 1.0))
    assert hd == pytest.approx([6.0], abs=1e-6)
    # Shift along rows is unaffected by column spacing.
    _, hd = case_metrics(square(5, 5, 10), square(8, 5, 10), spacing=(1.0, 5.0))
    assert hd == pytest.approx([3.0], abs=1e-6)


def test_empty_mask_rule():
    full = square(5, 5, 10)[0]
    empty = torch.zeros_like(full)
    # regions: (both empty), (truth empty, pred not), (pred empty, truth not), (perfect)
    pred = torch.stack([empty, full, empty, full])
    truth = torch.stack([empty, empty, full, full])
    dice, hd = case_metrics(pred, truth)
    np.testing.assert_allclose(dice, [1.0, 0.0, 0.0, 1.0], atol=1e-6)
    # BraTS convention (was NaN = not counted, which rewarded misses): both empty -> 0, exactly one
    # empty -> the worst value, by default the grid's diagonal (32 x 32 pixels -> 32 sqrt 2).
    assert hd[0] == 0.0
    assert hd[1] == hd[2] == pytest.approx(32 * np.sqrt(2))
    assert hd[3] == pytest.approx(0.0)
    assert dice.dtype == np.float64 and hd.dtype == np.float64


def test_3d_shifted_cube():
    # 6x6x6 cubes shifted by 2 along the last axis: overlap 6*6*4 = 144 of 216 -> Dice 2/3.
    # HD95: the far face (36 of 152 surface voxels, 24%) is exactly 2 away -> 2.
    a = torch.zeros((1, 16, 16, 16), dtype=torch.bool)
    b = torch.zeros_like(a)
    a[0, 4:10, 4:10, 4:10] = True
    b[0, 4:10, 4:10, 6:12] = True
    dice, hd = case_metrics(a, b)
    assert dice == pytest.approx([2 / 3], abs=1e-6)
    assert hd == pytest.approx([2.0], abs=1e-6)


def test_accepts_uint8_numpy():
    a = square(5, 5, 10).numpy().astype(np.uint8)
    b = square(8, 5, 10).numpy().astype(np.uint8)
    dice, hd = case_metrics(a, b)
    assert dice == pytest.approx([0.7], abs=1e-6) and hd == pytest.approx([3.0])


def test_batch_equals_per_case():
    g = torch.Generator().manual_seed(0)
    B, R = 5, 3
    truth = torch.zeros((B, R, 24, 24), dtype=torch.bool)
    pred = torch.zeros_like(truth)
    for b in range(B):
        for r in range(R):
            t0, l0 = (int(v) for v in torch.randint(0, 12, (2,), generator=g))
            s = int(torch.randint(2, 12, (1,), generator=g))
            truth[b, r, t0 : t0 + s + 2, l0 : l0 + s + 2] = True
            t1, l1 = (int(v) for v in torch.randint(0, 12, (2,), generator=g))
            pred[b, r, t1 : t1 + s + 3, l1 : l1 + s] = True
    truth[1, 2] = False  # one empty truth
    pred[3, 0] = False  # one empty prediction
    truth[4, 1] = False
    pred[4, 1] = False  # both empty
    dice, hd = batch_metrics(pred, truth)
    assert dice.shape == hd.shape == (B, R)
    for b in range(B):
        d, h = case_metrics(pred[b], truth[b])
        np.testing.assert_allclose(dice[b], d)
        np.testing.assert_allclose(hd[b], h, equal_nan=True)
    assert dice[4, 1] == 1.0 and dice[1, 2] == 0.0 and dice[3, 0] == 0.0
    # the empty-mask rule (was NaN before the BraTS convention): one empty -> the diagonal, both -> 0
    np.testing.assert_allclose(hd[[1, 3, 4], [2, 0, 1]], [24 * np.sqrt(2), 24 * np.sqrt(2), 0.0])
    assert np.isfinite(hd).all()


def test_batch_without_hd95_is_nan():
    dice, hd = batch_metrics(square(5, 5, 10)[None], square(8, 5, 10)[None], hd95=False)
    np.testing.assert_allclose(dice, [[0.7]], atol=1e-6)
    assert np.isnan(hd).all() and hd.shape == (1, 1)


def test_shape_mismatch_raises():
    with pytest.raises(ValueError):
        batch_metrics(torch.zeros(1, 1, 8, 8), torch.zeros(1, 1, 8, 9))


def test_logits_to_masks():
    logits = torch.tensor([[[[-2.0, 0.0], [0.1, 5.0]]]])
    m = logits_to_masks(logits)
    assert m.dtype == torch.bool
    assert m.tolist() == [[[[False, False], [True, True]]]]
    # threshold 0.9 -> logit > log(9) = 2.197
    assert logits_to_masks(logits, threshold=0.9).tolist() == [[[[False, False], [False, True]]]]
    assert math.log(9) < 5.0
