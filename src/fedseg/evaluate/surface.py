"""HD95 and NSD of mask pairs: on the CPU bit-identical to MONAI (:func:`cpu_surface_pairs`, the default) and
in torch on any device (:func:`surface_pairs`, ``eval.surface_device: auto``: exact distance transforms of the
edges, tensor operations an accelerator runs at once; benchmarks/surface_speed.py).

The same definitions as MONAI's ``compute_hausdorff_distance(percentile=95)`` and
``compute_surface_dice`` (``use_subvoxels=False``), the reference of tests/test_surface.py:

* edges: a mask minus its binary erosion with the face-connected cross (``scipy.ndimage.binary_erosion``'s
  default structure), the outside of the grid counting as background (MONAI crops to the foreground with a
  1-voxel margin, padding with zeros where the box leaves the grid: the same edges);
* distances: from each edge voxel of one mask to the nearest edge voxel of the other, Euclidean, voxel
  indices scaled by ``spacing`` (MONAI: a KD-tree in float64, cast to float32); here the other mask's exact
  squared Euclidean distance transform (:func:`squared_distances_to`, separable, float64) at the edge
  voxels, in chunks of at most :data:`CHUNK_PAIRS` (voxel, candidate) pairs so memory stays bounded;
* HD95: ``torch.quantile(d, 0.95)`` (linear interpolation) of each direction's float32 distances, the larger
  of the two (symmetric), computed as torch computes it but without its limit of 2^24 values (:func:`quantile`: a
  noisy mask of a 512x512x300 CT has more edge voxels; MONAI's own HD95 fails there);
* NSD: the edge voxels of both masks within ``tau`` of the other mask's edge over all edge voxels.

Tolerance against MONAI: each axis's term ((x − i)·s)² is an exact integer square times s² in float64, summed
and square-rooted in float64 and cast to float32 as MONAI's distances are, so they differ from MONAI's only by
float64 rounding (MONAI subtracts scaled coordinates, here indices are subtracted before scaling): HD95 agrees to
float32 rounding (tests/test_surface.py checks 1e-4 relative + 1e-5 absolute), and NSD differs only where a
distance lies within a float64 rounding of a float32 boundary next to ``tau`` (a tolerance that is a multiple of
the spacing, e.g. 3 voxels of 1.2 mm, scores as MONAI's).

Only pairs where both masks are non-empty come here (:func:`fedseg.evaluate.metrics.batch_metrics` applies
the empty-mask rule before).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

import numpy as np
import torch
import torch.nn.functional as F
from scipy.ndimage import binary_erosion
from scipy.spatial import KDTree

__all__ = [
    "CHUNK_PAIRS",
    "quantile",
    "mask_edges",
    "squared_distances_to",
    "edge_distances",
    "surface_pairs",
    "cpu_surface_pairs",
]

CHUNK_PAIRS = 1 << 24  # at most this many (voxel, candidate) sums at once: 128 MiB of float64


def quantile(values: torch.Tensor, q: float) -> torch.Tensor:
    """``torch.quantile(values, q)`` (linear interpolation; 0-dim, ``values``' dtype), bit for bit as torch computes
    it (sorted values, rank ``q * (n - 1)`` in ``values``' dtype, ``lerp`` between the values below and above), but
    for any number of values: torch refuses more than 2^24 ("quantile() input tensor is too large")."""
    ordered = torch.sort(values.reshape(-1)).values
    if bool(torch.isnan(ordered[-1])):  # sorted last: torch's quantile of values with a NaN is NaN
        return ordered[-1]
    last = ordered.numel() - 1
    rank = torch.tensor(q, dtype=values.dtype) * last  # past 2^24 values float32 may round it beyond the last index
    below = min(int(rank), last)  # truncated, as torch casts the rank to an index
    weight = (rank - below).to(values.device)  # lerp takes no CPU weight with CUDA values
    return torch.lerp(ordered[below], ordered[min(int(torch.ceil(rank)), last)], weight)


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


def _nearest_along(sites: torch.Tensor, axis: int) -> torch.Tensor:
    """For every voxel of ``sites`` ``(*S)`` (bool) the index distance ``|x − i|`` along ``axis`` to the nearest
    True voxel on its line (float64, ∞ where the line has none): the last site at or before it and the first at or
    after it, each one running maximum (``torch.cummax``)."""
    shape = [1] * sites.dim()
    shape[axis] = sites.shape[axis]
    index = torch.arange(sites.shape[axis], device=sites.device, dtype=torch.float64).view(shape)
    before = torch.where(sites, index, -torch.inf).cummax(axis).values
    after = -torch.where(sites, -index, -torch.inf).flip(axis).cummax(axis).values.flip(axis)
    return torch.minimum(index - before, after - index)


def _envelope(g: torch.Tensor, axis: int, step: float, chunk_pairs: int) -> torch.Tensor:
    """``min_i g(.., i, ..) + ((x − i)·step)²`` along ``axis`` for every voxel of ``g`` ``(*S)`` (float64): each
    line's minimum over its ``n`` candidates by brute force, in chunks of at most ``chunk_pairs`` sums."""
    n = g.shape[axis]
    index = torch.arange(n, device=g.device, dtype=torch.float64)
    cost = (index[:, None] - index[None, :]) ** 2 * step**2  # (voxel x, candidate i)
    lines = g.movedim(axis, -1)
    flat = lines.reshape(-1, n)
    per_chunk = max(1, chunk_pairs // (n * n))
    best = torch.cat([(part[:, None, :] + cost).amin(-1) for part in flat.split(per_chunk)])
    return best.reshape(lines.shape).movedim(-1, axis)


def squared_distances_to(
    sites: torch.Tensor, queries: torch.Tensor, spacing: Sequence[float] | None, chunk_pairs: int = CHUNK_PAIRS
) -> torch.Tensor:
    """Exact squared Euclidean distances (physical units², float64 ``(n,)``) from the voxels ``queries`` ``(n, D)``
    (indices) to the nearest True voxel of ``sites`` ``(*S)`` (bool, 2D or 3D, with a True voxel), on ``sites``'
    device; a voxel's coordinates are its indices times ``spacing``.

    The distance transform is separable (Saito & Toriwaki 1994): D²(x) = min_k [min_j [min_i f(i, j, k) +
    ((x₀ − i)·s₀)²] + ((x₁ − j)·s₁)²] + ((x₂ − k)·s₂)², f = 0 on the sites and ∞ elsewhere. The first axis's
    minimum is the 1-D distance to the nearest site on the line (:func:`_nearest_along`); a middle axis's is taken
    over its line's candidates by brute force on the whole grid (:func:`_envelope`); the last axis's only at the
    query voxels. The axes are taken so that the brute-force middle axis is the shortest and the last the longest
    (the minimum does not depend on the order). Tensor operations without data-dependent loops, in chunks of at
    most ``chunk_pairs`` sums."""
    dims = sites.dim()
    steps = [1.0] * dims if spacing is None else [float(s) for s in spacing]
    by_length = sorted(range(dims), key=lambda a: sites.shape[a])
    order = [*by_length[1:-1], by_length[0], by_length[-1]] if dims > 2 else by_length
    sites, queries, steps = sites.permute(order), queries[:, order], [steps[a] for a in order]
    g = _nearest_along(sites, 0) ** 2 * steps[0] ** 2
    for axis in range(1, dims - 1):
        g = _envelope(g, axis, steps[axis], chunk_pairs)
    n = sites.shape[-1]
    candidates = torch.arange(n, device=sites.device, dtype=torch.float64)
    per_chunk = max(1, chunk_pairs // n)
    out = []
    for part in queries.split(per_chunk):
        lines = g[tuple(part[:, a] for a in range(dims - 1))]  # (m, n): each query's line along the last axis
        cost = (part[:, -1:].to(torch.float64) - candidates) ** 2 * steps[-1] ** 2
        out.append((lines + cost).amin(1))
    return torch.cat(out) if out else g.new_zeros(0)


def edge_distances(
    a: torch.Tensor, b: torch.Tensor, spacing: Sequence[float] | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """The distances ``(n_a,)``, ``(n_b,)`` float32 from each edge voxel of ``a`` to the nearest edge voxel of ``b``
    and back, for two non-empty edge grids ``(*S)`` (bool) of one case (:func:`squared_distances_to`), over the
    grids' bounding box only: every edge voxel lies in it, so the distances are those of the whole grid."""
    union = a | b
    others = [[o for o in range(union.dim()) if o != d] for d in range(union.dim())]
    box = tuple(slice(int(i[0]), int(i[-1]) + 1) for i in (union.any(dim=o).nonzero()[:, 0] for o in others))
    a, b = a[box], b[box]
    to_b, to_a = squared_distances_to(b, a.nonzero(), spacing), squared_distances_to(a, b.nonzero(), spacing)
    return to_b.sqrt().float(), to_a.sqrt().float()  # float64 distances cast to float32, as MONAI's


def surface_pairs(
    pred: torch.Tensor,
    truth: torch.Tensor,
    spacing: Sequence[float] | None,
    percentile: float,
    taus: Sequence[float],
) -> tuple[torch.Tensor, torch.Tensor]:
    """HD (at ``percentile``) and NSD of ``N`` mask pairs ``(N, *S)`` (bool, both masks of each pair
    non-empty) on their device, pair ``i`` scored at NSD tolerance ``taus[i]``. Returns two float64 CPU tensors
    ``(N,)`` (module docstring for definitions and the tolerance against MONAI)."""
    n = pred.shape[0]
    hd, nsd = torch.empty(n, dtype=torch.float64), torch.empty(n, dtype=torch.float64)
    q = percentile / 100
    for i in range(n):
        d_ab, d_ba = edge_distances(mask_edges(pred[i]), mask_edges(truth[i]), spacing)
        hd[i] = float(torch.maximum(quantile(d_ab, q), quantile(d_ba, q)))
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


_THREAD = threading.local()  # ``one_query_thread``: set in a thread that is one of several computing HD95 at once


@contextmanager
def one_query_thread() -> Iterator[None]:
    """Within it, this thread's KD-tree queries use one thread (:func:`query_workers`): for a thread that is one of
    several scoring cases at once (``fedseg.evaluate.sliding.surface_threads``), which already use the cores."""
    _THREAD.single = True
    try:
        yield
    finally:
        _THREAD.single = False


def query_workers(points: int) -> int:
    """Threads for a KD-tree query of ``points`` points: the run's ``threads`` (torch's thread count) for a large
    query, else 1 (and 1 within :func:`one_query_thread`). Each point's nearest distance is the same on any thread,
    so results do not depend on it."""
    if getattr(_THREAD, "single", False):
        return 1
    return torch.get_num_threads() if points >= PARALLEL_QUERY_POINTS else 1


def cpu_surface_pairs(
    pred: torch.Tensor, truth: torch.Tensor, spacing: Sequence[float] | None, percentile: float, taus: Sequence[float]
) -> tuple[torch.Tensor, torch.Tensor]:
    """HD (at ``percentile``) and NSD of ``N`` non-empty mask pairs ``(N, *S)`` on the CPU, bit-identical to
    MONAI's ``compute_hausdorff_distance`` and ``compute_surface_dice`` (same edges, frame, float64 KD-tree
    distances cast to float32, ``torch.quantile``'s interpolation (:func:`quantile`), NSD ratio in float32) but
    with each pair's edges and distances computed once for both metrics and without MONAI's per-pair transform
    machinery; the nearest-edge queries on the run's ``threads`` (torch's thread count). Returns two float64 CPU
    tensors ``(N,)``."""
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
        hd[i] = float(torch.maximum(quantile(d_ab, q), quantile(d_ba, q)))
        within = torch.sum(d_ab <= taus[i]) + torch.sum(d_ba <= taus[i])
        nsd[i] = float(within / (len(d_ab) + len(d_ba)))  # a float32 tensor, as MONAI's
    return hd, nsd
