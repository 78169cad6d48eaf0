"""Dice / HD95 / NSD on hand-made masks with hand-computed values; NSD also against MONAI on random masks."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from monai.metrics import compute_surface_dice

from fedseg.config_load import ConfigError, load_config
from fedseg.evaluate.metric_info import region_tolerances
from fedseg.evaluate.metrics import batch_metrics, case_metrics, logits_to_masks


def square(top: int, left: int, size: int, shape=(32, 32)) -> torch.Tensor:
    """(1, H, W) bool mask with one filled size x size square."""
    m = torch.zeros((1, *shape), dtype=torch.bool)
    m[0, top : top + size, left : left + size] = True
    return m


def test_dice_two_overlapping_squares():
    # 10x10 squares, rows 5..14 vs 8..17: overlap 7x10 = 70 px; Dice = 2*70/(100+100).
    dice = case_metrics(square(5, 5, 10), square(8, 5, 10))["dice"]
    assert dice == pytest.approx([0.7], abs=1e-6)
    # 10x10 vs 10x10 shifted diagonally by (2, 4): overlap 8x6 = 48 -> 96/200.
    dice = case_metrics(square(5, 5, 10), square(7, 9, 10))["dice"]
    assert dice == pytest.approx([0.48], abs=1e-6)


@pytest.mark.parametrize("k", [1, 3, 6])
def test_hd95_shifted_square_equals_shift(k):
    # MONAI measures distances between edge pixels (mask XOR its erosion), from every
    # edge pixel of one mask to the nearest edge pixel of the other, in both directions.
    # For a 10x10 square shifted by k rows, all distances are <= k, and the whole far
    # side (10 of the 36 edge pixels, 28% > 5%) is exactly k away, so the 95th
    # percentile is k.
    hd = case_metrics(square(5, 5, 10), square(5 + k, 5, 10))["hd95"]
    assert hd == pytest.approx([float(k)], abs=1e-6)


def test_hd95_ignores_single_far_outlier_pixel():
    # Prediction = truth + one stray pixel 10 rows and 10 cols beyond the corner.
    # 37 pred edge pixels: 36 at distance 0, one at sqrt(200); the 95th percentile
    # (linear interpolation at position 0.95*36 = 34.2 of the sorted list) is 0.
    # The plain Hausdorff distance (max) would be sqrt(200) = 14.14.
    truth = square(5, 5, 10)
    pred = truth.clone()
    pred[0, 24, 24] = True
    scores = case_metrics(pred, truth)
    dice, hd = scores["dice"], scores["hd95"]
    assert hd == pytest.approx([0.0], abs=1e-6)
    assert dice == pytest.approx([200 / 201], abs=1e-6)


def test_hd95_spacing_gives_physical_units():
    # Shift of 3 rows with row spacing 2.0 mm -> 6 mm.
    hd = case_metrics(square(5, 5, 10), square(8, 5, 10), spacing=(2.0, 1.0))["hd95"]
    assert hd == pytest.approx([6.0], abs=1e-6)
    # Shift along rows is unaffected by column spacing.
    hd = case_metrics(square(5, 5, 10), square(8, 5, 10), spacing=(1.0, 5.0))["hd95"]
    assert hd == pytest.approx([3.0], abs=1e-6)


def test_empty_mask_rule():
    full = square(5, 5, 10)[0]
    empty = torch.zeros_like(full)
    # regions: (both empty), (truth empty, pred not), (pred empty, truth not), (perfect)
    pred = torch.stack([empty, full, empty, full])
    truth = torch.stack([empty, empty, full, full])
    scores = case_metrics(pred, truth)
    dice, hd = scores["dice"], scores["hd95"]
    np.testing.assert_allclose(dice, [1.0, 0.0, 0.0, 1.0], atol=1e-6)
    # BraTS convention (was NaN = not counted, which rewarded misses): both empty -> 0, exactly one
    # empty -> the worst value, by default the grid's diagonal (32 x 32 pixels -> 32 sqrt 2).
    assert hd[0] == 0.0
    assert hd[1] == hd[2] == pytest.approx(32 * np.sqrt(2))
    assert hd[3] == pytest.approx(0.0)
    assert dice.dtype == np.float64 and hd.dtype == np.float64
    # NSD follows Dice's rule (MONAI alone: NaN for both empty).
    np.testing.assert_array_equal(scores["nsd"], [1.0, 0.0, 0.0, 1.0])
    assert scores["nsd"].dtype == np.float64


def test_3d_shifted_cube():
    # 6x6x6 cubes shifted by 2 along the last axis: overlap 6*6*4 = 144 of 216 -> Dice 2/3.
    # HD95: the far face (36 of 152 surface voxels, 24%) is exactly 2 away -> 2.
    a = torch.zeros((1, 16, 16, 16), dtype=torch.bool)
    b = torch.zeros_like(a)
    a[0, 4:10, 4:10, 4:10] = True
    b[0, 4:10, 4:10, 6:12] = True
    scores = case_metrics(a, b)
    dice, hd = scores["dice"], scores["hd95"]
    assert dice == pytest.approx([2 / 3], abs=1e-6)
    assert hd == pytest.approx([2.0], abs=1e-6)


def test_accepts_uint8_numpy():
    a = square(5, 5, 10).numpy().astype(np.uint8)
    b = square(8, 5, 10).numpy().astype(np.uint8)
    scores = case_metrics(a, b)
    dice, hd = scores["dice"], scores["hd95"]
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
    scores = batch_metrics(pred, truth)
    dice, hd = scores["dice"], scores["hd95"]
    assert dice.shape == hd.shape == scores["nsd"].shape == (B, R)
    for b in range(B):
        case = case_metrics(pred[b], truth[b])
        np.testing.assert_allclose(dice[b], case["dice"])
        np.testing.assert_allclose(hd[b], case["hd95"], equal_nan=True)
        np.testing.assert_allclose(scores["nsd"][b], case["nsd"])
    assert dice[4, 1] == 1.0 and dice[1, 2] == 0.0 and dice[3, 0] == 0.0
    # the empty-mask rule (was NaN before the BraTS convention): one empty -> the diagonal, both -> 0
    np.testing.assert_allclose(hd[[1, 3, 4], [2, 0, 1]], [24 * np.sqrt(2), 24 * np.sqrt(2), 0.0])
    assert np.isfinite(hd).all()


def test_batch_without_hd95_is_nan():
    scores = batch_metrics(square(5, 5, 10)[None], square(8, 5, 10)[None], hd95=False)
    dice, hd = scores["dice"], scores["hd95"]
    np.testing.assert_allclose(dice, [[0.7]], atol=1e-6)
    assert np.isnan(hd).all() and hd.shape == (1, 1)
    assert np.isnan(scores["nsd"]).all() and scores["nsd"].shape == (1, 1)  # NSD shares HD95's gate


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


# --------------------------------------------------------------------------- normalized surface Dice
def random_masks(shape: tuple[int, ...], seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(pred, truth)`` bool ``shape`` = (B, R, *S): blobs (a thresholded smoothed noise field) that are never
    empty, so every pair reaches MONAI."""
    g = torch.Generator().manual_seed(seed)
    noise = torch.rand((2, *shape), generator=g)
    dims = len(shape) - 2
    pool = torch.nn.functional.avg_pool2d if dims == 2 else torch.nn.functional.avg_pool3d
    smooth = pool(noise.flatten(0, 2)[:, None], 5, stride=1, padding=2)[:, 0].reshape(noise.shape)
    masks = smooth > smooth.flatten(3).median(-1).values.reshape(*smooth.shape[:3], *([1] * dims))
    assert masks.flatten(3).any(-1).all()
    return masks[0], masks[1]


@pytest.mark.parametrize(
    ("shape", "spacing", "tolerance"),
    [
        ((3, 2, 24, 20), (0.7, 1.3), 1.0),
        ((3, 2, 24, 20), (0.7, 1.3), [0.5, 2.5]),  # one tolerance per region
        ((2, 2, 12, 14, 10), (1.0, 1.0, 2.5), 1.0),
        ((2, 2, 12, 14, 10), (0.8, 1.2, 2.0), [0.9, 1.5]),
    ],
)
def test_nsd_equals_monai_on_random_masks_with_anisotropic_spacing(shape, spacing, tolerance):
    pred, truth = random_masks(shape, seed=len(shape))
    taus = tolerance if isinstance(tolerance, list) else [tolerance] * shape[1]
    expected = compute_surface_dice(
        pred.float(), truth.float(), class_thresholds=taus, include_background=True, spacing=list(spacing)
    )
    nsd = batch_metrics(pred, truth, spacing=spacing, tolerance=tolerance)["nsd"]
    assert nsd.shape == shape[:2] and nsd.dtype == np.float64
    np.testing.assert_allclose(nsd, expected.double().numpy(), atol=1e-6)
    assert 0.0 < nsd.min() and nsd.max() <= 1.0
    # the spacing matters: the same masks in pixels score differently
    assert not np.allclose(nsd, batch_metrics(pred, truth, tolerance=tolerance)["nsd"])


def test_nsd_of_identical_masks_is_one():
    pred, _ = random_masks((2, 3, 16, 16, 8), seed=1)
    np.testing.assert_array_equal(batch_metrics(pred, pred, spacing=(1.0, 1.0, 3.0), tolerance=0.1)["nsd"], 1.0)
    assert case_metrics(square(5, 5, 10), square(5, 5, 10))["nsd"] == pytest.approx([1.0])


@pytest.mark.parametrize(("tolerance", "expected"), [(1.0, 5 / 9), (1.9, 5 / 9), (2.0, 1.0), (3.0, 1.0)])
def test_nsd_of_a_square_shifted_by_two_pixels(tolerance, expected):
    # 10x10 squares at rows 5..14 and 7..16 (cols 5..14); edges (mask minus erosion): 36 pixels each.
    # Truth -> prediction: top row (10 px) lies 2 from the nearest prediction edge pixel; bottom row r=14:
    # cols 5, 14 at 0 (on the prediction's sides), 6 and 13 at 1, 7..12 at 2 (the prediction's bottom row
    # r=16); both side columns (2 x 8 px) at 0 or 1 (the prediction's sides and top row r=7).
    # Within 1: 4 + 16 = 20 of 36, and by symmetry 20 of 36 the other way -> 40/72 = 5/9. Within 2: all.
    nsd = case_metrics(square(5, 5, 10), square(7, 5, 10), tolerance=tolerance)["nsd"]
    assert nsd == pytest.approx([expected], abs=1e-6)


def test_nsd_tolerance_in_physical_units():
    # The same 2-row shift with rows 2 mm apart, columns 1 mm: the top row lies 4 mm away; bottom row
    # r=14, col c: min(c - 5, 14 - c) mm along the row to the prediction's sides, 4 mm to its bottom row,
    # so within 3 mm: cols 5-8 and 11-14 (8 of 10); the sides (16 px) within 2 mm. (0 + 8 + 16) / 36 = 2/3.
    nsd = case_metrics(square(5, 5, 10), square(7, 5, 10), spacing=(2.0, 1.0), tolerance=3.0)["nsd"]
    assert nsd == pytest.approx([2 / 3], abs=1e-6)
    nsd = case_metrics(square(5, 5, 10), square(7, 5, 10), spacing=(2.0, 1.0), tolerance=4.0)["nsd"]
    assert nsd == pytest.approx([1.0], abs=1e-6)


@pytest.mark.parametrize("tolerance", [0.0, -1.0, math.inf, [1.0], [1.0, 2.0, 3.0]])
def test_nsd_tolerance_must_be_positive_and_one_per_region(tolerance):
    with pytest.raises(ValueError, match="NSD tolerance"):
        batch_metrics(torch.zeros(1, 2, 8, 8), torch.zeros(1, 2, 8, 8), tolerance=tolerance)


def test_region_tolerances_from_config():
    assert region_tolerances(2.0, ("disc", "cup")) == [2.0, 2.0]
    assert region_tolerances({"cup": 1.0, "disc": 3.0}, ("disc", "cup")) == [3.0, 1.0]
    with pytest.raises(ValueError, match=r"missing \['cup'\]; unknown \['rim'\]"):
        region_tolerances({"disc": 1.0, "rim": 2.0}, ("disc", "cup"))


@pytest.mark.parametrize("value", ["0", "-2", "abc", "{}", "{disc: 0}", "true"])
def test_config_rejects_a_bad_nsd_tolerance_in_one_line(value):
    with pytest.raises(ConfigError) as err:
        load_config("demo", overrides=[f"eval.nsd_tolerance={value}"])
    assert "eval.nsd_tolerance must be a number > 0" in str(err.value) and "\n" not in str(err.value)


def test_config_nsd_tolerance_default_and_mapping():
    assert load_config("demo").eval.nsd_tolerance == 1.0
    cfg = load_config("demo", overrides=["eval.nsd_tolerance={disc: 2, cup: 0.5}"])
    assert cfg.eval.nsd_tolerance == {"disc": 2.0, "cup": 0.5}
