"""The one local optimization loop. Every method trains through ``Trainer.fit``.

Methods customize it with hooks instead of copying it:
- ``extra_loss(model) -> Tensor``: added to the segmentation loss (FedProx's proximal term, Ditto's regularizer);
- ``after_backward(model)``: runs between ``backward`` and ``optimizer.step`` (SCAFFOLD's gradient correction).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterator

import torch
from monai.losses import DiceCELoss, DiceLoss
from torch import nn

from fedseg.config import BudgetConfig, TrainConfig
from fedseg.data.dataset import CaseSet

ExtraLoss = Callable[[nn.Module], torch.Tensor]
AfterBackward = Callable[[nn.Module], None]
AfterStep = Callable[[nn.Module], None]  # called after every optimizer step (e.g. SCAFFOLD's step correction)
LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


@dataclass
class TrainStats:
    steps: int
    samples: int
    mean_loss: float


def segmentation_loss(kind: str) -> nn.Module:
    """Soft Dice over the region channels (no background channel exists), optionally + BCE.

    Input: logits ``(B, R, *S)``, target region masks ``(B, R, *S)`` in {0, 1}. Output: scalar.
    """
    if kind == "dice":
        return DiceLoss(sigmoid=True)
    if kind == "dice_bce":
        return DiceCELoss(sigmoid=True)
    raise ValueError(f"train.loss: unknown loss {kind!r} (dice | dice_bce)")


def make_optimizer(cfg: TrainConfig, params) -> torch.optim.Optimizer:
    if cfg.optimizer == "adam":
        return torch.optim.Adam(params, lr=cfg.lr, betas=(0.9, 0.999), weight_decay=cfg.weight_decay)
    return torch.optim.SGD(params, lr=cfg.lr, momentum=cfg.momentum, weight_decay=cfg.weight_decay)


def optimizer_state(opt: torch.optim.Optimizer) -> dict[str, torch.Tensor]:
    """Flatten the optimizer's per-parameter state into named tensors (``"<param index>/<key>"``)."""
    flat = {}
    for idx, state in opt.state_dict()["state"].items():
        for key, value in state.items():
            flat[f"{idx}/{key}"] = value.detach().to("cpu", copy=True) if torch.is_tensor(value) else torch.tensor(value)
    return flat


def load_optimizer_state(opt: torch.optim.Optimizer, flat: dict[str, torch.Tensor]) -> None:
    """Inverse of ``optimizer_state`` (hyperparameters come from the optimizer as built)."""
    state: dict[int, dict[str, torch.Tensor]] = {}
    for name, value in flat.items():
        idx, key = name.split("/", 1)
        state.setdefault(int(idx), {})[key] = value.clone()
    opt.load_state_dict({"state": state, "param_groups": opt.state_dict()["param_groups"]})


def batches(n: int, batch_size: int, generator: torch.Generator, endless: bool) -> Iterator[torch.Tensor]:
    """Index batches over a fresh permutation of ``range(n)`` per pass; ``endless`` repeats passes
    (the endless loader of step budgets)."""
    while True:
        yield from torch.randperm(n, generator=generator).split(batch_size)
        if not endless:
            return


class Trainer:
    """Local training of a segmentation model on one ``CaseSet``."""

    def __init__(self, cfg: TrainConfig, device: torch.device):
        self.cfg = cfg
        self.device = device
        self.loss_fn = segmentation_loss(cfg.loss)

    def new_optimizer(self, model: nn.Module) -> torch.optim.Optimizer:
        return make_optimizer(self.cfg, model.parameters())

    def fit(
        self,
        model: nn.Module,
        data: CaseSet,
        generator: torch.Generator,
        optimizer: torch.optim.Optimizer | None = None,
        budget: BudgetConfig | None = None,
        extra_loss: ExtraLoss | None = None,
        after_backward: AfterBackward | None = None,
        loss_fn: LossFn | None = None,
        after_step: AfterStep | None = None,
    ) -> TrainStats:
        """Train ``model`` in place for ``budget`` (epochs over ``data`` or optimizer steps).

        ``loss_fn(output, target)`` replaces the segmentation loss (FedSM's selector trains with
        cross-entropy on ``data`` yielding ``(image, class index)``); ``data`` is anything with
        ``len``, ``name`` and ``batch(idx, device) -> (x, target)`` (a ``CaseSet`` by default).
        Returns the steps done, samples seen and the mean loss per step (without ``extra_loss``).
        """
        if len(data) == 0:
            raise ValueError(f"no training cases for {data.name}")
        budget = budget or self.cfg.budget
        optimizer = optimizer or self.new_optimizer(model)
        loss_fn = loss_fn or self.loss_fn
        model.train()
        max_steps = budget.amount if budget.unit == "steps" else budget.amount * _batches_per_epoch(len(data), self.cfg.batch_size)
        steps, samples, loss_sum = 0, 0, 0.0
        # One pass of the endless sampler = one epoch, so both budget units share this loop.
        for idx in batches(len(data), self.cfg.batch_size, generator, endless=True):
            x, y = data.batch(idx, self.device)
            optimizer.zero_grad(set_to_none=True)
            loss = loss_fn(model(x), y)
            total = loss + extra_loss(model) if extra_loss else loss
            total.backward()
            if after_backward:
                after_backward(model)
            optimizer.step()
            if after_step:
                after_step(model)
            steps += 1
            samples += len(idx)
            loss_sum += float(loss.detach())
            if steps >= max_steps:
                break
        return TrainStats(steps=steps, samples=samples, mean_loss=loss_sum / max(steps, 1))


def _batches_per_epoch(n: int, batch_size: int) -> int:
    return -(-n // batch_size)
