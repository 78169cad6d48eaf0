"""Run a segmentation model over a ``CaseSet`` and score it per case and region."""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from fedseg.config import EvalConfig
from fedseg.data.dataset import CaseSet
from fedseg.evaluate.metrics import batch_metrics, logits_to_masks


@torch.no_grad()
def predict_masks(
    model: nn.Module, x: torch.Tensor, batch_size: int, threshold: float, device: torch.device
) -> torch.Tensor:
    """Images ``(N, C, *S)`` -> boolean region masks ``(N, R, *S)`` on the CPU."""
    model.eval()
    out = [logits_to_masks(model(xb.to(device)), threshold).cpu() for xb in x.split(batch_size)]
    return torch.cat(out) if out else torch.empty(0, dtype=torch.bool)


def score_caseset(
    model: nn.Module, data: CaseSet, batch_size: int, threshold: float, hd95: bool, device: torch.device
) -> tuple[np.ndarray, np.ndarray]:
    """Return ``(dice (N, R), hd95 (N, R))`` for every case of ``data`` (NaN = not counted)."""
    pred = predict_masks(model, data.x, batch_size, threshold, device)
    return batch_metrics(pred, data.y.bool(), hd95=hd95)


def candidate_dice(models: list[nn.Module], data: CaseSet, ev: EvalConfig, device: torch.device) -> np.ndarray:
    """Dice of every model on every case, ``(M, N, R)`` (``score_caseset`` at ``ev``; HD95 not computed)."""
    return np.stack([score_caseset(m, data, ev.batch_size, ev.threshold, False, device)[0] for m in models])
