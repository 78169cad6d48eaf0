"""Sliding-window inference on cases kept on their own grid, mapped back to the original grid.

FeTS 2022 benchmark Sec. 4.4.1 ("sliding window inference ... overlap of 0.5 ... gaussian mode")
and Auto-FedAvg Sec. 4.3. MONAI's ``sliding_window_inference`` runs the network on windows of
``data.volume.patch_size`` voxels (``sw_overlap``, ``sw_mode`` blending, ``sw_batch_size`` windows
per forward pass) over the preprocessed volume ``(C, *P)``; the blended logits become probabilities,
are mapped back to the original grid (``fedseg.data.volumes.restore``: padding removed, crop put
back, resampling undone) and thresholded there. Metrics are then computed on the original grid with
the case's spacing (HD95 in mm; ``fedseg.evaluate.metrics``).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
from torch import nn

from fedseg.accel import inference_autocast
from fedseg.config import VolumeConfig
from fedseg.data.volumes import Grid, Volume, patch_size, restore
from fedseg.evaluate.metric_info import DEFAULT_NSD_TOLERANCE, METRIC_NAMES
from fedseg.evaluate.metrics import Scores, batch_metrics

# The largest whole-case output (MiB) blended on an accelerator: (R + 1) float32 maps of the padded grid (the logits
# and MONAI's count map). 2 GiB holds 3 regions of a 512 x 512 x 400 CT; a larger case is blended on the CPU.
BLEND_ON_DEVICE_MAX_MB = 2048.0


def blend_device(vol: Volume, device: torch.device) -> torch.device:
    """Where :func:`sliding_logits` accumulates case ``vol``'s blended logits: on ``device`` when it is an
    accelerator and the output fits :data:`BLEND_ON_DEVICE_MAX_MB`, else on the CPU."""
    voxels = vol.label[0].numel()
    fits = (vol.label.shape[0] + 1) * voxels * 4 / 2**20 <= BLEND_ON_DEVICE_MAX_MB
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
) -> torch.Tensor:
    """Boolean region masks ``(R, *O)`` on the case's original grid, on ``blend``: ``sigmoid(sliding logits)``
    mapped back by :func:`fedseg.data.volumes.restore`, then ``> threshold`` (all on ``blend``)."""
    return restore(torch.sigmoid(sliding_logits(model, image, cfg, device, blend)), grid) > threshold


def network_for(model: nn.Module, view: torch.Tensor | None, device: torch.device) -> nn.Module:
    """The network that slides over one case: ``model``, or for a model that routes whole images (FedSM's
    super model: ``for_image``) the network it picks for the case's fixed-size ``view`` ``(C, *S)``."""
    for_image = getattr(model, "for_image", None)
    if for_image is None or view is None:
        return model
    model.eval()
    return for_image(view[None].to(device))


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
) -> Scores:
    """``{"dice", "hd95", "nsd"}`` -> ``(N, R)`` float64: every volume predicted by sliding window, scored on
    its original grid against its original-grid truth with its own spacing (HD95 and NSD's ``tolerance`` in
    mm), with the metrics' empty-mask rule and ``worst`` (``eval.hd95_worst``; None = the case's grid diagonal
    in mm). ``views``: the cases' fixed-size images ``(N, C, *S)`` a routing model decides on
    (:func:`network_for`). A case is blended, restored and thresholded on ``device`` where it fits
    (:func:`blend_device`), else on the CPU; the masks go to ``device`` for the metrics when ``device`` is an
    accelerator and ``surface_device`` is ``auto`` (HD95/NSD there, :mod:`fedseg.evaluate.surface`), else to
    the CPU."""
    to = device if surface_device == "auto" and hd95 else torch.device("cpu")
    scores: dict[str, list[np.ndarray]] = {m: [] for m in METRIC_NAMES}
    for i, vol in enumerate(volumes):
        net = network_for(model, None if views is None else views[i], device)
        pred = predict_on_grid(net, vol.image, vol.grid, cfg, threshold, device, blend_device(vol, device))
        case = batch_metrics(
            pred[None].to(to),
            vol.truth[None],
            hd95=hd95,
            spacing=vol.spacing,
            worst=worst,
            tolerance=tolerance,
            surface_device=surface_device,
        )
        for m in METRIC_NAMES:
            scores[m].append(case[m][0])
    if not volumes:
        return {m: np.zeros((0, 0)) for m in METRIC_NAMES}
    return {m: np.stack(v) for m, v in scores.items()}
