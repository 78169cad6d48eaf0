"""Per-case segmentation metrics: Dice, HD95 and normalized surface Dice (NSD), computed with MONAI.

Every task is a set of *regions* (see docs/design.md §2 "Regions"); the network predicts one
sigmoid channel per region, so predictions and ground truth are binary masks with one
channel per region, ``(R, *S)`` for one case or ``(B, R, *S)`` for a batch, where ``S``
is 2D ``(H, W)`` or 3D ``(H, W, D)``. There is no background channel: every channel is
scored (``include_background=True`` in MONAI terms).

* Dice: :func:`monai.metrics.compute_dice` (the function behind ``DiceMetric``), its arithmetic on voxel counts
  (:func:`dice_scores`: bit-identical up to 2^24 voxels per region, tests/test_surface.py, without its float32
  copies of the masks; beyond, the exact counts, where MONAI's float32 sums round).
* HD95: :func:`monai.metrics.compute_hausdorff_distance` (the function behind
  ``HausdorffDistanceMetric``) with ``percentile=95``, symmetric, Euclidean, on the mask
  edges (the mask minus its binary erosion): the larger of the two directed 95th percentiles (the BraTS
  evaluation's definition; FeTS 2022 Eq. 33 prints one percentile of both directions pooled, never larger).
  Units are pixels/voxels, or physical units (e.g. mm) when ``spacing`` is given.
* NSD: :func:`monai.metrics.compute_surface_dice` (Nikolov et al. 2021, the function behind
  ``SurfaceDiceMetric``): the fraction of both mask edges (same edges as HD95) lying within the
  tolerance ``tau`` of the other mask's edge, in ``[0, 1]``, higher is better. ``tau`` is in the HD95
  unit (``eval.nsd_tolerance``, default 1.0: 1 mm on the volume path, 1 pixel in 2D; one value, or one
  per region). NSD counts boundary errors larger than ``tau`` no matter how large, which HD95 does not
  (Metrics Reloaded recommends it next to Dice and HD95). It needs the same surface-distance work as
  HD95 and is computed under the same gate (``hd95=True`` / ``eval.hd95``).

HD95 and NSD are MONAI's definitions, computed by :mod:`fedseg.evaluate.surface`: on the CPU bit-identical
to the two MONAI functions (``cpu_surface_pairs``: the same edges, frame and KD-tree, each pair's distances
computed once for both metrics; tests/test_surface.py compares them with MONAI), on a CUDA device in torch
(``surface_pairs``, MONAI's numbers to float32 rounding: tests/test_surface.py allows HD95 1e-4 relative + 1e-5
absolute and NSD 1e-6; ``eval.surface_device: auto``, not the default: exact distance transforms, not yet timed on a
GPU). Dice is computed where the masks live.

Empty-mask rule (BraTS convention; applied explicitly here, not left to MONAI's defaults):

====================  =========  ==========================  =========
truth / prediction    Dice       HD95                        NSD
====================  =========  ==========================  =========
both empty            1.0        0.0                         1.0
exactly one empty     0.0        ``worst``                   0.0
both non-empty        MONAI      MONAI                       MONAI
====================  =========  ==========================  =========

Partial annotations (nnU-Net's ignore label, ``fedseg.data.federation.Regions.ignore``): a truth with one channel
more than the prediction carries the known (annotated) voxels last. Dice then counts those voxels only, as nnU-Net's
evaluation does (overlap counts inside the known mask; a region absent from both inside it follows the table's
both-empty rule). HD95 and NSD need the true surface, which is unknown where voxels are unannotated: a case with any
unannotated voxel (on the scored grid) gets NaN HD95 and NSD (not computed, as with ``hd95=False``; nnU-Net reports
overlap metrics only), a case whose every voxel is annotated keeps them as above. A case without any annotated voxel
carries no information: all three metrics NaN. Tables average over the cases that have a number (NaN is skipped,
``fedseg.evaluate.tables``).

``worst`` is ``eval.hd95_worst`` when set, else the diagonal of the case's grid in the HD95 unit,
``sqrt(sum_i (n_i s_i)^2)`` for spatial shape ``n`` and spacing ``s`` (1 without a spacing): 373.13 mm
for a BraTS volume (240 x 240 x 155 at 1 mm), the value the BraTS evaluation uses; 90.5 pixels for a
64 x 64 image. So a missed region (truth present, nothing predicted) and a hallucinated one (nothing
there, something predicted) cost the most an HD95 can, and every case counts in the HD95 averages:
dropping such cases (NaN, as this module did before, and as the FeTS 2022 benchmark does, Sec. 4.4.5)
rewards a model for predicting nothing where it is unsure. NaN now only means "not computed"
(``hd95=False``: neither HD95 nor NSD; partial annotations, above). NSD follows Dice's rule (MONAI itself returns
NaN when both are empty, 0 when one is).

:data:`fedseg.evaluate.metric_info.METRICS` describes the three for every table (name in ``results.csv``
and ``summary.json``, heading, direction, decimals), so a table loops over them instead of naming each.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np
import torch

from fedseg.data.federation import split_known
from fedseg.evaluate.metric_info import DEFAULT_NSD_TOLERANCE
from fedseg.evaluate.surface import cpu_surface_pairs, surface_pairs

if TYPE_CHECKING:
    from fedseg.data.federation import Regions

__all__ = [
    "logits_to_masks",
    "label_map_masks",
    "case_metrics",
    "batch_metrics",
    "dice_scores",
    "grid_diagonal",
    "Scores",
    "HD95_PERCENTILE",
]

HD95_PERCENTILE = 95.0
Scores = dict[str, np.ndarray]  # metric name (METRIC_NAMES) -> (B, R) float64


def logits_to_masks(logits: torch.Tensor, threshold: float = 0.5, regions: Regions | None = None) -> torch.Tensor:
    """Binarize per-region logits.

    Args:
        logits: ``(B, R, *S)`` raw network outputs, one channel per region.
        threshold: probability threshold applied after the sigmoid.
        regions: the task's regions to score the label map the masks paint (:func:`label_map_masks`,
            ``eval.score_on: label_map``); None: the thresholded channels as they are (``channels``).

    Returns:
        bool tensor ``(B, R, *S)``: ``sigmoid(logits) > threshold``, through :func:`label_map_masks` with ``regions``.
    """
    masks = torch.sigmoid(logits) > threshold
    return masks if regions is None else label_map_masks(masks, regions)


def label_map_masks(masks: torch.Tensor, regions: Regions) -> torch.Tensor:
    """Boolean region masks ``(B, R, *S)`` -> the region masks of the label map they paint: ``regions.one_hot`` of
    ``regions.to_label`` per case, what a written prediction (``fedseg predict``, nnU-Net's region-based export)
    holds, so that the scores of a run are the scores of its written masks. Nested regions differ from the channels
    where a smaller region is predicted outside a larger one (a cup pixel outside the disc is painted cup, which lies
    in the disc: the disc's mask gains it); disjoint regions where two are predicted at one pixel (the later,
    smaller region keeps it). Computed on the masks' device; regions that overlap without nesting
    (``Regions.paint_order`` refuses them) on the CPU through ``Regions.to_label``."""
    if len(regions) == 1 or not len(masks):  # one region paints itself
        return masks
    try:
        order = regions.paint_order()
    except ValueError:
        painted = np.stack([regions.one_hot(regions.to_label(m)) for m in masks.cpu().numpy()])
        return torch.from_numpy(painted).to(masks.device, torch.bool)
    label = torch.zeros((masks.shape[0], *masks.shape[2:]), dtype=torch.int32, device=masks.device)
    for region, value in order:
        label.masked_fill_(masks[:, region], value)
    values = [torch.tensor(vals, dtype=torch.int32, device=masks.device) for vals in regions.values]
    return torch.stack([torch.isin(label, v) for v in values], 1)


def _as_bool(x: torch.Tensor | np.ndarray) -> torch.Tensor:
    """Binary mask (any dtype, nonzero = foreground) -> bool tensor on the device it lives on."""
    x = torch.as_tensor(x)
    return (x != 0) if x.dtype != torch.bool else x


def dice_scores(p: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
    """Dice ``(B, R)`` float32 of bool masks ``(B, R, *S)`` on their own device with the module's empty-mask rule:
    only these ``B x R`` numbers need to leave an accelerator. MONAI ``compute_dice``'s arithmetic (float32
    ``2 * |P & T| / (|T| + |P|)``) on voxel counts taken from the bool masks: bit-identical to it (its float32 sums
    of 0/1 are exact up to 2^24 voxels, where the counts are), without its two float32 copies of the masks and
    their temporaries (2.5 GB for one 512x512x300 CT's three regions)."""
    b, r = p.shape[:2]
    p, t = _as_bool(p).reshape(b, r, -1), _as_bool(t).reshape(b, r, -1)  # 0/1 floats too (as MONAI took them)
    p_count, t_count, both = p.sum(-1), t.sum(-1), (p & t).sum(-1)
    dice = (2.0 * both.float()) / (t_count.float() + p_count.float())
    p_any, t_any = p_count > 0, t_count > 0
    dice[~p_any & ~t_any] = 1.0  # both empty
    dice[p_any ^ t_any] = 0.0  # exactly one empty
    return dice


def batch_metrics(
    pred: torch.Tensor | np.ndarray,
    truth: torch.Tensor | np.ndarray,
    hd95: bool = True,
    spacing: Sequence[float] | None = None,
    worst: float | None = None,
    tolerance: float | Sequence[float] = DEFAULT_NSD_TOLERANCE,
    surface_device: str = "cpu",
) -> Scores:
    """Per-case, per-region Dice, HD95 and NSD for a batch, with the module's empty-mask rule.

    Args:
        pred: binary prediction ``(B, R, *S)`` (bool or 0/1), ``S`` 2D or 3D; on any device (Dice is
            computed where it lives; ``truth`` is moved there).
        truth: binary ground truth, same shape; or ``(B, R + 1, *S)``, the known (annotated) voxels last (an
            ignore label's, ``Regions.target``): prediction and truth then count inside them only; HD95 and NSD
            NaN for a case with an unannotated voxel, every metric NaN for one without an annotated voxel.
        hd95: compute the surface metrics HD95 and NSD; when False they are all NaN (Dice only
            is much cheaper: each needs a surface-distance computation per case and region).
        spacing: optional pixel/voxel spacing, one number per spatial dim (same for the
            whole batch); HD95 and the NSD tolerance are then in physical units, otherwise in
            pixels/voxels.
        worst: HD95 when exactly one of the masks is empty, in HD95 units; None = the grid's
            diagonal (:func:`grid_diagonal`).
        tolerance: NSD's tolerance ``tau`` in the HD95 unit, one for all regions or one per
            region (``metric_info.region_tolerances``); > 0.
        surface_device: ``cpu``: HD95/NSD on the CPU (``cpu_surface_pairs``, MONAI's numbers bit for bit);
            ``auto``: in torch on ``pred``'s device when that is not the CPU (``surface_pairs``, ~1e-5
            relative to MONAI; ``eval.surface_device``).

    Returns:
        ``{"dice": ..., "hd95": ..., "nsd": ...}`` (``metric_info.METRIC_NAMES``), float64 numpy arrays
        of shape ``(B, R)``.
    """
    p = _as_bool(pred)
    t = _as_bool(truth).to(p.device)
    partial = unknown = None  # with the known voxels: (B,) cases with an unannotated voxel / without an annotated one
    if p.ndim == t.ndim and p.ndim > 1 and t.shape[1] == p.shape[1] + 1:  # the known voxels last: score only those
        t, known = split_known(t, p.shape[1])
        if known is not None:
            p, t = p & known, t & known
            flat = known.reshape(known.shape[0], -1)
            partial, unknown = (~flat.all(-1)).cpu(), (~flat.any(-1)).cpu()
    if p.shape != t.shape:
        raise ValueError(f"pred and truth shapes differ: {tuple(p.shape)} vs {tuple(t.shape)}")
    if p.ndim not in (4, 5):
        raise ValueError(f"expected (B, R, H, W) or (B, R, H, W, D), got {tuple(p.shape)}")
    b, r = p.shape[:2]
    taus = [float(v) for v in tolerance] if isinstance(tolerance, Sequence) else [float(tolerance)] * r
    if len(taus) != r or not all(np.isfinite(v) and v > 0 for v in taus):
        raise ValueError(f"NSD tolerance: one finite number > 0, or one per region ({r}); got {tolerance!r}")
    dice = dice_scores(p, t).double().cpu().numpy()
    if unknown is not None:
        dice[unknown.numpy()] = np.nan  # no annotated voxel: the case says nothing

    hd = np.full((b, r), np.nan, dtype=np.float64)
    nsd = np.full((b, r), np.nan, dtype=np.float64)
    if not hd95:
        return {"dice": dice, "hd95": hd, "nsd": nsd}
    p_any = p.reshape(b, r, -1).any(-1).cpu()
    t_any = t.reshape(b, r, -1).any(-1).cpu()
    neither, one, both = ~p_any & ~t_any, p_any ^ t_any, p_any & t_any
    if partial is not None:  # a surface is unknown where a voxel is unannotated: those cases' stay NaN
        whole = ~partial[:, None]
        neither, one, both = neither & whole, one & whole, both & whole
    hd[neither.numpy()] = 0.0  # both empty
    hd[one.numpy()] = grid_diagonal(p.shape[2:], spacing) if worst is None else float(worst)
    nsd[neither.numpy()] = 1.0  # both empty
    nsd[one.numpy()] = 0.0  # exactly one empty
    if bool(both.any()):
        rows, cols = both.nonzero(as_tuple=True)
        steps = None if spacing is None else [float(s) for s in spacing]
        # Only pairs with both masks non-empty are measured; the other pairs got their value from the rule above.
        on_device = surface_device == "auto" and p.device.type != "cpu"
        measure = surface_pairs if on_device else cpu_surface_pairs
        pair_hd, pair_nsd = measure(
            p[rows, cols], t[rows, cols], steps, HD95_PERCENTILE, [taus[c] for c in cols.tolist()]
        )
        hd[rows.numpy(), cols.numpy()] = pair_hd.numpy()
        nsd[rows.numpy(), cols.numpy()] = pair_nsd.numpy()
    return {"dice": dice, "hd95": hd, "nsd": nsd}


def grid_diagonal(shape: Sequence[int], spacing: Sequence[float] | None = None) -> float:
    """Length of the diagonal of a grid of ``shape`` voxels with ``spacing`` (1 per axis when None):
    ``sqrt(sum_i (shape_i * spacing_i)^2)``; the default ``worst`` HD95 (module docstring)."""
    steps = [1.0] * len(shape) if spacing is None else [float(s) for s in spacing]
    return float(np.sqrt(sum((n * s) ** 2 for n, s in zip(shape, steps))))


def case_metrics(
    pred: torch.Tensor | np.ndarray,
    truth: torch.Tensor | np.ndarray,
    spacing: Sequence[float] | None = None,
    worst: float | None = None,
    tolerance: float | Sequence[float] = DEFAULT_NSD_TOLERANCE,
) -> Scores:
    """Dice, HD95 and NSD per region for one case (see the module docstring for empty masks).

    Args:
        pred: binary prediction ``(R, *S)``, ``S`` 2D or 3D.
        truth: binary ground truth ``(R, *S)``, or ``(R + 1, *S)`` with the known voxels last (:func:`batch_metrics`).
        spacing: optional pixel/voxel spacing (one number per spatial dim); HD95 and the NSD
            tolerance are then in those physical units, otherwise in pixels/voxels.
        worst: HD95 when exactly one mask of a region is empty (None: the grid's diagonal).
        tolerance: NSD's tolerance in the HD95 unit (one, or one per region).

    Returns:
        ``{"dice": ..., "hd95": ..., "nsd": ...}``, float64 arrays of shape ``(R,)``.
    """
    scores = batch_metrics(
        _as_bool(pred)[None], _as_bool(truth)[None], hd95=True, spacing=spacing, worst=worst, tolerance=tolerance
    )
    return {k: v[0] for k, v in scores.items()}
