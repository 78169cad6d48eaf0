"""Sliding-window inference on cases kept on their own grid, mapped back to the original grid.

FeTS 2022 benchmark Sec. 4.4.1 ("sliding window inference ... overlap of 0.5 ... gaussian mode")
and Auto-FedAvg Sec. 4.2.1. MONAI's ``sliding_window_inference`` runs the network on windows of
``data.volume.patch_size`` voxels (``sw_overlap``, ``sw_mode`` blending, ``sw_batch_size`` windows
per forward pass) over the preprocessed volume ``(C, *P)``; the blended logits become probabilities,
are mapped back to the original grid (``fedseg.data.volumes.restore``: padding removed, crop put
back, resampling undone) and thresholded there. Metrics are then computed on the original grid with
the case's spacing (HD95 in mm; ``fedseg.evaluate.metrics``).
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from functools import partial

import numpy as np
import torch
from torch import nn

from fedseg.accel import inference_autocast
from fedseg.config import VolumeConfig
from fedseg.data.federation import Regions
from fedseg.data.volumes import Grid, Volume, patch_size, restore
from fedseg.evaluate.metric_info import DEFAULT_NSD_TOLERANCE, METRIC_NAMES
from fedseg.evaluate.metrics import Scores, batch_metrics, label_map_masks
from fedseg.evaluate.surface import one_query_thread

# The most GPU memory (MiB) one case's blending and mapping back may take on an accelerator (:func:`case_mapping_mb`);
# a larger case runs on the CPU, as every case did before. 2 GiB: a BraTS case (4 x 240 x 240 x 155) takes ~0.5 GiB.
BLEND_ON_DEVICE_MAX_MB = 2048.0


def case_mapping_mb(vol: Volume) -> float:
    """GPU memory (MiB) that blending case ``vol`` and mapping it back take at once, estimated from its shapes (C
    channels, R regions, P padded voxels, S resampled and O original voxels, D axes): the image (C x P), MONAI's
    logits and count map (R + 1 x P; the sigmoid overwrites the logits) in float32 and the masks on the original grid
    (R x O bool); with resampling (``grid.affine`` set) one region at a time (:func:`predict_on_grid`): its
    restored crop (S float32), MONAI ``Spacing``'s float64 input, output and sampling grid while it is built
    (S + O + (2D + 1) x O: 56 bytes per original voxel in 3D, :func:`fedseg.data.volumes.restore`)."""
    channels, regions, padded = vol.image.shape[0], vol.label.shape[0] - vol.known, vol.label[0].numel()
    grid = vol.grid
    resampled, original = math.prod(grid.resampled), math.prod(grid.shape)
    resampling = grid.affine is not None
    floats32 = padded * (channels + regions + 1) + (resampled if resampling else 0)
    floats64 = resampled + original + (2 * len(grid.shape) + 1) * original if resampling else 0
    return (4 * floats32 + 8 * floats64 + regions * original) / 2**20


def blend_device(vol: Volume, device: torch.device) -> torch.device:
    """Where case ``vol`` is blended, restored and thresholded (:func:`predict_on_grid`): on ``device`` when it is an
    accelerator and :func:`case_mapping_mb` fits :data:`BLEND_ON_DEVICE_MAX_MB`, else on the CPU."""
    fits = case_mapping_mb(vol) <= BLEND_ON_DEVICE_MAX_MB
    return device if device.type != "cpu" and fits else torch.device("cpu")


@torch.no_grad()
def sliding_logits(
    model: nn.Module,
    image: torch.Tensor,
    cfg: VolumeConfig,
    device: torch.device,
    blend: torch.device = torch.device("cpu"),
) -> torch.Tensor:
    """Blended logits ``(R, *P)`` float32 of ``model`` over ``image`` ``(C, *P)``, ``P >= patch`` per axis, on
    ``blend``. Windows run on ``device``; the blend is accumulated on ``blend`` (the CPU by default: a whole
    volume need not fit on the accelerator; :func:`blend_device` chooses the accelerator where it fits, and
    the image is then sliced there too). Puts ``model`` in eval mode. Windows run at the model's ``train.amp``
    precision (``fedseg.accel.inference_autocast``); their logits are cast to float32 before blending."""
    from monai.inferers import sliding_window_inference

    model.eval()

    def predictor(window: torch.Tensor) -> torch.Tensor:
        with inference_autocast(model, device):
            logits = model(window)
        return logits.float()

    out = sliding_window_inference(
        image[None].to(blend),
        roi_size=patch_size(cfg, image.dim() - 1),
        sw_batch_size=cfg.sw_batch_size,
        predictor=predictor,
        overlap=cfg.sw_overlap,
        mode=cfg.sw_mode,
        sw_device=device,
        device=blend,
    )
    assert isinstance(out, torch.Tensor)  # the network returns one tensor
    return out[0].float()


def predict_on_grid(
    model: nn.Module,
    image: torch.Tensor,
    grid: Grid,
    cfg: VolumeConfig,
    threshold: float,
    device: torch.device,
    blend: torch.device = torch.device("cpu"),
    keep_logits: list[torch.Tensor] | None = None,
) -> torch.Tensor:
    """Boolean region masks ``(R, *O)`` on the case's original grid, on ``blend``: ``sigmoid(sliding logits)``
    mapped back by :func:`fedseg.data.volumes.restore`, then ``> threshold`` (all on ``blend``). ``keep_logits``: a
    list that receives the blended logits ``(R, *P)`` on the CPU (a site's sample prediction reuses them).

    Memory: the sigmoid overwrites the logits unless they are kept (then it is a copy), and ``restore`` maps back and
    thresholds one region at a time, so one region's float copies on the original grid exist at once, never all R
    (the same masks to the bit as mapping all regions back, then thresholding)."""
    logits = sliding_logits(model, image, cfg, device, blend)
    kept = None
    if keep_logits is not None:
        kept = logits.cpu()
        keep_logits.append(kept)
    probs = torch.sigmoid(logits) if kept is logits else logits.sigmoid_()
    del logits, kept
    return restore(probs, grid, threshold)


def network_for(model: nn.Module, view: torch.Tensor | None, device: torch.device) -> nn.Module:
    """The network that slides over one case: ``model``, or for a model that routes whole images (FedSM's
    super model: ``for_image``) the network it picks for the case's fixed-size ``view`` ``(C, *S)``."""
    for_image = getattr(model, "for_image", None)
    if for_image is None or view is None:
        return model
    model.eval()
    return for_image(view[None].to(device))


def _prediction(
    net: nn.Module,
    vol: Volume,
    cfg: VolumeConfig,
    threshold: float,
    device: torch.device,
    keep_logits: list[torch.Tensor] | None = None,
) -> torch.Tensor:
    """:func:`predict_on_grid` of ``vol``, blended where :func:`blend_device` says; a case whose mapping runs out of
    the accelerator's memory (the estimate is rough, other work holds memory too) is done again on the CPU."""
    blend = blend_device(vol, device)
    try:
        return predict_on_grid(net, vol.image, vol.grid, cfg, threshold, device, blend, keep_logits)
    except torch.OutOfMemoryError:
        if blend.type == "cpu":
            raise
        torch.cuda.empty_cache()
        if keep_logits:
            keep_logits.clear()
        return predict_on_grid(net, vol.image, vol.grid, cfg, threshold, device, keep_logits=keep_logits)


def score_volumes(
    model: nn.Module,
    volumes: list[Volume],
    cfg: VolumeConfig,
    threshold: float,
    hd95: bool,
    device: torch.device,
    worst: float | None = None,
    views: torch.Tensor | None = None,
    tolerance: float | Sequence[float] = DEFAULT_NSD_TOLERANCE,
    surface_device: str = "cpu",
    regions: Regions | None = None,
    first_logits: list[torch.Tensor] | None = None,
) -> Scores:
    """``{"dice", "hd95", "nsd"}`` -> ``(N, R)`` float64: every volume predicted by sliding window, scored on
    its original grid against its original-grid truth with its own spacing (HD95 and NSD's ``tolerance`` in
    mm), with the metrics' empty-mask rule and ``worst`` (``eval.hd95_worst``; None = the case's grid diagonal
    in mm). ``views``: the cases' fixed-size images ``(N, C, *S)`` a routing model decides on
    (:func:`network_for`). A case is blended, restored and thresholded on ``device`` where it fits
    (:func:`blend_device`), else on the CPU; its Dice is computed where its mask is (only ``(1, R)`` numbers
    leave the accelerator); the mask goes to ``device`` when ``surface_device`` is ``auto`` (HD95/NSD there,
    :mod:`fedseg.evaluate.surface`), else HD95/NSD copy it to the CPU. ``regions``: score the label map the
    masks paint (:func:`fedseg.evaluate.metrics.label_map_masks`); None: the thresholded channels. ``first_logits``:
    a list that receives the first case's blended logits ``(R, *P)`` on the CPU (``sample_prediction`` reuses them
    rather than predicting that case twice). With the network on a CUDA device, HD95/NSD on the CPU run in
    :func:`surface_threads` background threads on CPU copies of the masks while the next cases are predicted (the
    KD-tree queries release the interpreter lock; Dice is computed here, where the mask is; each case's numbers are
    what they are alone, in the cases' order)."""
    surface_on_device = surface_device == "auto" and hd95
    measure = partial(batch_metrics, hd95=hd95, worst=worst, tolerance=tolerance, surface_device=surface_device)
    workers = surface_threads(device)
    pool = ThreadPoolExecutor(workers) if workers and hd95 and not surface_on_device else None
    pending: deque[tuple[Scores, Future[Scores]]] = deque()
    cases: list[Scores] = []

    def surface(pred: torch.Tensor, truth: torch.Tensor, spacing: Sequence[float] | None) -> Scores:
        with one_query_thread():  # the pool's threads already use the cores
            return measure(pred, truth, spacing=spacing)

    try:
        for i, vol in enumerate(volumes):
            net = network_for(model, None if views is None else views[i], device)
            pred = _prediction(net, vol, cfg, threshold, device, first_logits if i == 0 else None)
            if regions is not None:
                pred = label_map_masks(pred[None], regions)[0]
            if vol.truth is None:  # fedseg.data.dataset.build_site_data keeps it for validation and test cases only
                raise ValueError(f"volume {i}: a training case, without original-grid truth, cannot be scored")
            masks = (pred[None].to(device if surface_on_device else pred.device), vol.truth[None])
            if pool is None:
                cases.append(measure(*masks, spacing=vol.spacing))
                continue
            dice = measure(*masks, spacing=vol.spacing, hd95=False)  # here, where the mask is (an accelerator)
            on_cpu = (masks[0].cpu(), masks[1].cpu())  # the threads touch no accelerator memory
            pending.append((dice, pool.submit(surface, *on_cpu, vol.spacing)))
            while len(pending) > 2 * workers:  # a few cases' masks in memory at most
                cases.append(_with_dice(*pending.popleft()))
        cases += [_with_dice(*case) for case in pending]
    finally:
        if pool is not None:
            pool.shutdown(cancel_futures=True)  # an error or Ctrl-C: the cases not started are dropped
    if not volumes:
        return {m: np.zeros((0, 0)) for m in METRIC_NAMES}
    return {m: np.stack([case[m][0] for case in cases]) for m in METRIC_NAMES}


def _with_dice(dice: Scores, surface: Future[Scores]) -> Scores:
    """A case's scores: its Dice as computed where its mask was, HD95 and NSD from the background thread."""
    return {**surface.result(), "dice": dice["dice"]}


def surface_threads(device: torch.device) -> int:
    """Background threads computing HD95/NSD on the CPU during a volume evaluation (:func:`score_volumes`): the run's
    ``threads`` (torch's thread count) where the network runs on a CUDA device and the CPU waits for it, each thread's
    KD-tree queries on one thread (``surface.one_query_thread``); none where the CPU runs the network too (on 2 cores
    a thread overlapping the next case's prediction gained nothing: ``fets-cpu``'s final evaluation took 1.03x as
    long, 0.98-1.19 over 4 alternated pairs), nor on Apple's MPS, where two threads running its ops at once can
    abort the process (pytorch/pytorch#197805). The threads get CPU masks: Dice is computed where the mask is, in
    the calling thread."""
    return max(1, torch.get_num_threads()) if device.type == "cuda" else 0
