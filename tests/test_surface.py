"""Evaluation that computes what the tables report (issue 26): the torch HD95/NSD against MONAI, Dice where the
model ran against MONAI's compute_dice, and the evaluate messages' ``surface`` decision per split/model."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch
from monai.metrics import compute_dice, compute_hausdorff_distance, compute_surface_dice

from fedseg.evaluate.metrics import HD95_PERCENTILE, batch_metrics, dice_scores
from fedseg.evaluate.surface import cpu_surface_pairs, mask_edges, quantile, squared_distances_to, surface_pairs


def monai_pairs(p, t, spacing, taus):
    """MONAI's HD95 and NSD of ``N`` mask pairs ``(N, *S)``: float64 ``(N,)`` each (the reference)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*always_return_as_numpy.*", category=FutureWarning)
        hd = compute_hausdorff_distance(
            p[:, None].float(), t[:, None].float(), include_background=True, percentile=HD95_PERCENTILE, spacing=spacing
        )
        nsd = compute_surface_dice(
            p[None].float(), t[None].float(), class_thresholds=list(taus), include_background=True, spacing=spacing
        )
    return hd[:, 0].double(), nsd[0].double()


def torch_pairs(p, t, spacing, taus):
    return surface_pairs(p, t, spacing, HD95_PERCENTILE, taus)


def random_pairs(shape, seed, p_fg=0.3, t_fg=0.25):
    """``(N, *S)`` bool pairs with blobs, both non-empty, plus one single-voxel prediction."""
    g = torch.Generator().manual_seed(seed)
    p = torch.rand(shape, generator=g) < p_fg
    t = torch.rand(shape, generator=g) < t_fg
    p[0] = False
    p[0].view(-1)[7] = True  # a one-voxel mask
    t[0].view(-1)[3] = True
    return p, t


@pytest.mark.parametrize(
    ("shape", "spacing"),
    [((5, 31, 27), None), ((4, 40, 33), [0.5, 1.7]), ((3, 14, 12, 9), None), ((3, 16, 11, 13), [1.0, 0.8, 2.5])],
)
def test_torch_surface_matches_monai(shape, spacing):
    p, t = random_pairs(shape, seed=len(shape) + shape[1])
    taus = [1.25] * shape[0]  # off the distance lattice of these spacings
    hd_m, nsd_m = monai_pairs(p, t, spacing, taus)
    hd_t, nsd_t = torch_pairs(p, t, spacing, taus)
    np.testing.assert_allclose(hd_t.numpy(), hd_m.numpy(), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(nsd_t.numpy(), nsd_m.numpy(), rtol=0, atol=1e-6)


@pytest.mark.parametrize("tau", [3.6, 2.4, 1.4, 1.2])
def test_torch_surface_with_a_tolerance_on_the_distance_lattice_matches_monai(tau):
    """A tolerance that is a whole number of voxels (3 x 1.2 mm): distances lie exactly at tau, and the float64
    distances cast to float32 fall on the side MONAI's do (float32 sums put 3 x 1.2 above 3.6)."""
    p, t = random_pairs((4, 30, 26), seed=5, p_fg=0.05, t_fg=0.05)
    hd_m, nsd_m = monai_pairs(p, t, [1.2, 0.7], [tau] * 4)
    hd_t, nsd_t = torch_pairs(p, t, [1.2, 0.7], [tau] * 4)
    np.testing.assert_array_equal(hd_t.numpy(), hd_m.numpy())
    np.testing.assert_array_equal(nsd_t.numpy(), nsd_m.numpy())


def test_torch_surface_of_sparse_far_masks_matches_monai():
    """Few scattered voxels far apart (large distances, the percentile interpolating between few values)."""
    p, t = random_pairs((4, 48, 40), seed=3, p_fg=0.01, t_fg=0.02)
    hd_m, nsd_m = monai_pairs(p, t, [0.9, 1.1], [2.0] * 4)
    hd_t, nsd_t = torch_pairs(p, t, [0.9, 1.1], [2.0] * 4)
    np.testing.assert_allclose(hd_t.numpy(), hd_m.numpy(), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(nsd_t.numpy(), nsd_m.numpy(), rtol=0, atol=1e-6)


def test_mask_edges_is_mask_minus_erosion_with_the_border_as_background():
    m = torch.zeros(6, 5, dtype=torch.bool)
    m[:4, :4] = True  # touches the top and left border
    expected = m.clone()
    expected[1:3, 1:3] = False  # interior: all four face neighbours inside the mask and the grid
    assert torch.equal(mask_edges(m), expected)


@pytest.mark.parametrize(("shape", "spacing"), [((9, 13), [0.7, 1.9]), ((6, 8, 5), [1.0, 0.8, 2.5]), ((7, 5, 6), None)])
def test_distance_transform_equals_brute_force_in_any_chunks(shape, spacing):
    """The separable transform at every voxel against every (voxel, site) distance computed directly in float64."""
    g = torch.Generator().manual_seed(0)
    sites = torch.rand(shape, generator=g) < 0.1
    sites.view(-1)[0] = True
    queries = torch.stack(torch.meshgrid(*[torch.arange(n) for n in shape], indexing="ij"), -1).reshape(-1, len(shape))
    found = squared_distances_to(sites, queries, spacing)
    assert torch.equal(squared_distances_to(sites, queries, spacing, chunk_pairs=40), found)
    scale = torch.tensor(spacing or [1.0] * len(shape), dtype=torch.float64)
    direct = torch.cdist(queries * scale, sites.nonzero().double() * scale).amin(1) ** 2
    torch.testing.assert_close(found.double(), direct, rtol=1e-6, atol=1e-6)


def test_batch_metrics_on_the_cpu_keep_monai_numbers():
    """On CPU tensors (either setting) the batch's HD95/NSD are exactly MONAI's on the measured pairs."""
    p, t = random_pairs((6, 30, 30), seed=5)
    pb, tb = p.view(3, 2, 30, 30), t.view(3, 2, 30, 30)
    scores = batch_metrics(pb, tb, spacing=[1.0, 1.5], tolerance=1.0)
    assert all(
        np.array_equal(v, batch_metrics(pb, tb, spacing=[1.0, 1.5], tolerance=1.0, surface_device="auto")[k])
        for k, v in scores.items()
    )
    hd = compute_hausdorff_distance(
        p[:, None].float(), t[:, None].float(), include_background=True, percentile=HD95_PERCENTILE, spacing=[1.0, 1.5]
    )
    nsd = compute_surface_dice(
        p[None].float(), t[None].float(), class_thresholds=[1.0] * 6, include_background=True, spacing=[1.0, 1.5]
    )
    assert np.array_equal(scores["hd95"].reshape(-1), hd[:, 0].double().numpy())
    assert np.array_equal(scores["nsd"].reshape(-1), nsd[0].double().numpy())


def test_dice_scores_equal_monai_compute_dice_with_the_empty_rule():
    g = torch.Generator().manual_seed(1)
    p, t = torch.rand(5, 3, 20, 20, generator=g) > 0.6, torch.rand(5, 3, 20, 20, generator=g) > 0.7
    p[0, 0], t[0, 0] = False, False  # both empty
    p[1, 1] = False  # prediction empty
    t[2, 2] = False  # truth empty
    got = dice_scores(p, t)
    ref = compute_dice(p.float(), t.float(), include_background=True, ignore_empty=False)
    both = p.flatten(2).any(-1) & t.flatten(2).any(-1)
    assert torch.equal(got[both], ref[both])
    assert got[0, 0] == 1.0 and got[1, 1] == 0.0 and got[2, 2] == 0.0
    # batched scoring: one batch or case by case, the same bits
    whole = batch_metrics(p, t)
    for i in range(5):
        part = batch_metrics(p[i : i + 1], t[i : i + 1])
        for m in whole:
            assert np.array_equal(part[m][0], whole[m][i], equal_nan=True)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_batch_metrics_on_cuda_match_the_cpu():
    p, t = random_pairs((4, 3, 64, 64), seed=9)
    cpu = batch_metrics(p, t, spacing=[0.8, 1.2], tolerance=1.3)
    gpu = batch_metrics(p.cuda(), t, spacing=[0.8, 1.2], tolerance=1.3, surface_device="auto")
    assert np.array_equal(cpu["dice"], gpu["dice"])
    np.testing.assert_allclose(gpu["hd95"], cpu["hd95"], rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(gpu["nsd"], cpu["nsd"], rtol=0, atol=1e-6)


def test_cpu_surface_pairs_are_monai_bit_for_bit_on_random_masks():
    """The CPU path (edges and distances once for both metrics) gives MONAI's float64 numbers exactly:
    2D and 3D, with and without (anisotropic) spacing, one-voxel masks, masks touching the border."""
    g = torch.Generator().manual_seed(11)
    for trial in range(24):
        d = 2 + trial % 2
        shape = (3, *(int(x) for x in torch.randint(5, 40 if d == 2 else 18, (d,), generator=g)))
        density = float(torch.rand(1, generator=g)) * 0.5 + 0.02
        p, t = torch.rand(shape, generator=g) < density, torch.rand(shape, generator=g) < density * 0.8
        p[0] = False
        p[0].view(-1)[-1] = True  # a one-voxel mask in the last corner
        t[0].view(-1)[0] = True
        keep = p.flatten(1).any(1) & t.flatten(1).any(1)
        p, t = p[keep], t[keep]
        spacing = None if trial % 3 == 0 else [float(x) for x in torch.rand(d, generator=g) * 2 + 0.3]
        taus = [float(x) for x in torch.rand(len(p), generator=g) * 3 + 0.1]
        hd_m, nsd_m = monai_pairs(p, t, spacing, taus)
        hd_c, nsd_c = cpu_surface_pairs(p, t, spacing, HD95_PERCENTILE, taus)
        assert torch.equal(hd_c, hd_m) and torch.equal(nsd_c, nsd_m), (trial, shape, spacing)


def test_the_quantile_is_torchs_bit_for_bit_and_takes_more_than_2_24_values():
    """A noisy prediction of a 512x512x300 CT has more than 2^24 edge voxels: torch.quantile (and MONAI's HD95 with
    it) refused them ("quantile() input tensor is too large") and the run ended after training, writing nothing."""
    g = torch.Generator().manual_seed(3)
    for n in (1, 2, 7, 100, 4097):
        values = torch.rand(n, generator=g) * 50
        for ties in (values, values.round()):
            for q in (0.0, 0.5, 0.95, 0.99, 1.0):
                assert torch.equal(quantile(ties, q), torch.quantile(ties, q)), (n, q)
    many = torch.arange((1 << 24) + 2, dtype=torch.float32)  # 0, 1, ..., 2^24 + 1: the 95% point is known
    with pytest.raises(RuntimeError, match="too large"):
        torch.quantile(many, 0.95)
    rank = torch.tensor(0.95) * (many.numel() - 1)
    assert float(quantile(many[torch.randperm(many.numel(), generator=g)], 0.95)) == float(rank)


def test_dice_of_a_large_volume_counts_voxels_as_monai_sums_them():
    """Dice from the masks' voxel counts equals MONAI's float32 sums on a volume of several million voxels."""
    g = torch.Generator().manual_seed(4)
    p, t = torch.rand(1, 3, 160, 160, 120, generator=g) > 0.5, torch.rand(1, 3, 160, 160, 120, generator=g) > 0.4
    assert torch.equal(
        dice_scores(p, t), compute_dice(p.float(), t.float(), include_background=True, ignore_empty=False)
    )
    assert torch.equal(dice_scores(p.float(), t.float()), dice_scores(p, t))  # 0/1 floats, as MONAI took them
