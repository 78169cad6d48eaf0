"""HD95 and NSD of mask pairs: on the CPU bit-identical to MONAI (:func:`cpu_surface_pairs`, the default) and
in torch on any device (:func:`surface_pairs`, ``eval.surface_device: auto``: brute-force nearest edge voxel,
on an H100 16x slower than the CPU's KD-tree for BraTS-sized masks, benchmarks/results/surface_speed.json).

The same definitions as MONAI's ``compute_hausdorff_distance(percentile=95)`` and
``compute_surface_dice`` (``use_subvoxels=False``), the reference of tests/test_surface.py:

* edges: a mask minus its binary erosion with the face-connected cross (``scipy.ndimage.binary_erosion``'s
  default structure), the outside of the grid counting as background (MONAI crops to the foreground with a
  1-voxel margin, padding with zeros where the box leaves the grid: the same edges);
* distances: from each edge voxel of one mask to the nearest edge voxel of the other, Euclidean, voxel
  indices scaled by ``spacing`` (MONAI: a KD-tree in float64, cast to float32); here exact differences in
  float32 (``torch.cdist`` without the matrix-product shortcut), in chunks of at most :data:`CHUNK_PAIRS`
  pairs so memory stays bounded;
* HD95: ``torch.quantile(d, 0.95)`` (linear interpolation) of each direction's float32 distances, the larger
  of the two (symmetric);
* NSD: the edge voxels of both masks within ``tau`` of the other mask's edge over all edge voxels.

Tolerance against MONAI: the float32 coordinate differences (exact for voxel indices, rounded once by the
spacing) and the float32 sum/sqrt give distances within ~1e-6 relative of MONAI's, so HD95 agrees to
~1e-5 relative (tests/test_surface.py checks 1e-4 relative + 1e-5 absolute); NSD can only differ where a
distance lies within that rounding of ``tau`` exactly (the tests use tolerances off the distance lattice).

Only pairs where both masks are non-empty come here (:func:`fedseg.evaluate.metrics.batch_metrics` applies
the empty-mask rule before).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
import torch.nn.functional as F
from scipy.ndimage import binary_erosion
from scipy.spatial import KDTree

__all__ = ["CHUNK_PAIRS", "mask_edges", "nearest_distances", "surface_pairs", "cpu_surface_pairs"]

CHUNK_PAIRS = 1 << 24  # at most this many (edge voxel, edge voxel) distances at once: 64 MiB of float32


def mask_edges(mask: torch.Tensor) -> torch.Tensor:
    """Edge voxels of a binary mask ``(*S)`` (2D or 3D, bool): the mask minus its erosion by the
    face-connected cross, outside the grid = background. Returns bool ``(*S)`` on ``mask``'s device."""
    d = mask.dim()
    m = F.pad(mask[None, None].float(), [1, 1] * d)[0, 0]  # zero border: the outside is background
    inner = m[tuple(slice(1, -1) for _ in range(d))].bool()
    for axis in range(d):
        for shift in (0, 2):
            idx = [slice(1, -1)] * d
            idx[axis] = slice(shift, shift + mask.shape[axis])
            inner = inner & m[tuple(idx)].bool()
    return mask & ~inner


def nearest_distances(src: torch.Tensor, dst: torch.Tensor, chunk_pairs: int = CHUNK_PAIRS) -> torch.Tensor:
    """For each point of ``src`` ``(n, D)`` the distance to the nearest point of ``dst`` ``(m, D)`` (both
    float32, physical units), ``(n,)`` float32; ``src`` in chunks so at most ``chunk_pairs`` distances exist."""
    step = max(1, chunk_pairs // max(1, dst.shape[0]))
    out = [
        torch.cdist(part[None], dst[None], compute_mode="donot_use_mm_for_euclid_dist")[0].amin(dim=1)
        for part in src.split(step)
    ]
    return torch.cat(out) if out else src.new_zeros(0)


def _points(edges: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """Edge voxel indices ``(n, D)`` scaled by the spacing: float32 physical coordinates."""
    return edges.nonzero().to(torch.float32) * scale


def surface_pairs(
    pred: torch.Tensor,
    truth: torch.Tensor,
    spacing: Sequence[float] | None,
    percentile: float,
    taus: Sequence[float],
) -> tuple[torch.Tensor, torch.Tensor]:
    """HD (at ``percentile``) and NSD of ``N`` mask pairs ``(N, *S)`` (bool, both masks of each pair
    non-empty), pair ``i`` scored at NSD tolerance ``taus[i]``. Returns two float64 CPU tensors ``(N,)``
    (module docstring for definitions and the tolerance against MONAI)."""
    n, dims = pred.shape[0], pred.dim() - 1
    steps = [1.0] * dims if spacing is None else [float(s) for s in spacing]
    scale = torch.tensor(steps, dtype=torch.float32, device=pred.device)
    hd, nsd = torch.empty(n, dtype=torch.float64), torch.empty(n, dtype=torch.float64)
    q = percentile / 100
    for i in range(n):
        a, b = _points(mask_edges(pred[i]), scale), _points(mask_edges(truth[i]), scale)
        d_ab, d_ba = nearest_distances(a, b), nearest_distances(b, a)
        hd[i] = float(torch.maximum(torch.quantile(d_ab, q), torch.quantile(d_ba, q)))
        within = (d_ab <= taus[i]).sum() + (d_ba <= taus[i]).sum()
        nsd[i] = float((within / (d_ab.numel() + d_ba.numel())).to(torch.float32))
    return hd, nsd


def _cpu_edge_points(pred: np.ndarray, truth: np.ndarray, scale: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
    """MONAI's edge voxels of a non-empty pair ``(*S)`` as float64 coordinates, in MONAI's frame: the union's
    bounding box grown by 1 voxel (``CropForeground(margin=1, allow_smaller=False)``, zero padding outside the
    grid), edges = mask XOR ``scipy.ndimage.binary_erosion(mask)``, indices times ``scale`` (spacing)."""
    union = pred | truth
    lo = [
        int(np.flatnonzero(union.any(axis=tuple(a for a in range(union.ndim) if a != d)))[0]) for d in range(union.ndim)
    ]
    hi = [
        int(np.flatnonzero(union.any(axis=tuple(a for a in range(union.ndim) if a != d)))[-1])
        for d in range(union.ndim)
    ]
    box = tuple(slice(lo_d, hi_d + 3) for lo_d, hi_d in zip(lo, hi))  # [lo - 1, hi + 2) in the padded grid
    out = []
    for mask in (pred, truth):
        crop = np.pad(mask, 1)[box]
        pts = np.argwhere(binary_erosion(crop) ^ crop).astype(np.float64)
        out.append(pts if scale is None else pts * scale)
    return out[0], out[1]


PARALLEL_QUERY_POINTS = 10_000  # fewer query points than this: one thread (scipy starts its threads per query)


def query_workers(points: int) -> int:
    """Threads for a KD-tree query of ``points`` points: the run's ``threads`` (torch's thread count) for a large
    query, else 1. Each point's nearest distance is the same on any thread, so results do not depend on it."""
    return torch.get_num_threads() if points >= PARALLEL_QUERY_POINTS else 1


def cpu_surface_pairs(
    pred: torch.Tensor, truth: torch.Tensor, spacing: Sequence[float] | None, percentile: float, taus: Sequence[float]
) -> tuple[torch.Tensor, torch.Tensor]:
    """HD (at ``percentile``) and NSD of ``N`` non-empty mask pairs ``(N, *S)`` on the CPU, bit-identical to
    MONAI's ``compute_hausdorff_distance`` and ``compute_surface_dice`` (same edges, frame, float64 KD-tree
    distances cast to float32, ``torch.quantile``, NSD ratio in float32) but with each pair's edges and
    distances computed once for both metrics and without MONAI's per-pair transform machinery; the nearest-edge
    queries on the run's ``threads`` (torch's thread count). Returns two float64 CPU tensors ``(N,)``."""
    p, t = pred.cpu().numpy(), truth.cpu().numpy()
    scale = None if spacing is None else np.asarray([float(s) for s in spacing], dtype=np.float64)
    n = p.shape[0]
    hd, nsd = torch.empty(n, dtype=torch.float64), torch.empty(n, dtype=torch.float64)
    q = percentile / 100
    for i in range(n):
        a, b = _cpu_edge_points(p[i], t[i], scale)
        d_ab = torch.from_numpy(
            KDTree(b, leafsize=32).query(a, k=1, workers=query_workers(len(a)))[0].astype(np.float32)
        )
        d_ba = torch.from_numpy(
            KDTree(a, leafsize=32).query(b, k=1, workers=query_workers(len(b)))[0].astype(np.float32)
        )
        hd[i] = float(torch.maximum(torch.quantile(d_ab, q), torch.quantile(d_ba, q)))
        within = torch.sum(d_ab <= taus[i]) + torch.sum(d_ba <= taus[i])
        nsd[i] = float(within / (len(d_ab) + len(d_ba)))  # a float32 tensor, as MONAI's
    return hd, nsd
