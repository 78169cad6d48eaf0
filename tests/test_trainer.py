"""The Trainer: budgets in epochs and steps, optimizer state round trip, hooks."""

from __future__ import annotations

import torch

from fedseg.config import BudgetConfig
from fedseg.data.dataset import CaseSet
from fedseg.engine.context import Task
from fedseg.train import Trainer, TrainHooks, load_optimizer_state, optimizer_state


def _data(n=10):
    g = torch.Generator().manual_seed(0)
    x = torch.rand(n, 3, 32, 32, generator=g)
    y = (torch.rand(n, 2, 32, 32, generator=g) > 0.5).float()
    return CaseSet("toy", [str(i) for i in range(n)], x, y)


def _model_and_trainer(cfg):
    task = Task(cfg, 2, 3, ("a", "b"))
    return task.new_model(), Trainer(cfg.train, torch.device("cpu"))


def test_epoch_budget_counts_batches_and_samples(tiny_config):
    model, trainer = _model_and_trainer(tiny_config())  # batch size 4
    stats = trainer.fit(
        model, _data(10), torch.Generator().manual_seed(0), budget=BudgetConfig(unit="epochs", amount=2)
    )
    assert stats.steps == 6 and stats.samples == 20


def test_step_budget_runs_past_the_end_of_the_data(tiny_config):
    model, trainer = _model_and_trainer(tiny_config())
    stats = trainer.fit(model, _data(10), torch.Generator().manual_seed(0), budget=BudgetConfig(unit="steps", amount=7))
    assert stats.steps == 7 and stats.samples == 4 + 4 + 2 + 4 + 4 + 2 + 4


def test_hooks_are_called_every_step(tiny_config):
    model, trainer = _model_and_trainer(tiny_config())
    calls = {"extra": 0, "after": 0}

    class Counting(TrainHooks):
        def extra_loss(self, m):
            calls["extra"] += 1
            return torch.zeros(())

        def after_backward(self, m):
            calls["after"] += 1

    trainer.fit(model, _data(8), torch.Generator().manual_seed(0), hooks=Counting())
    assert calls == {"extra": 2, "after": 2}


def test_optimizer_state_round_trip(tiny_config):
    model, trainer = _model_and_trainer(tiny_config())
    opt = trainer.new_optimizer(model)
    trainer.fit(model, _data(8), torch.Generator().manual_seed(0), opt)
    flat = optimizer_state(opt)
    fresh = trainer.new_optimizer(model)
    load_optimizer_state(fresh, flat)
    again = optimizer_state(fresh)
    assert flat.keys() == again.keys() and all(torch.equal(flat[k], again[k]) for k in flat)


def test_dice_bce_gives_each_region_its_own_binary_cross_entropy():
    """``train.loss: dice_bce`` is soft Dice + the binary cross-entropy of every region's sigmoid: with one region
    MONAI's ``DiceCELoss`` to the bit; with nested regions (a voxel in both, as BraTS ET lies in TC and WT) a model
    sure of both has almost no loss, where a softmax cross-entropy across the channels (``DiceCELoss`` with several)
    would make the two compete and charge it log 2 a voxel."""
    from monai.losses import DiceCELoss

    from fedseg.config import TrainConfig
    from fedseg.train import segmentation_loss

    loss_fn = segmentation_loss(TrainConfig(loss="dice_bce"))
    g = torch.Generator().manual_seed(0)
    logits, target = torch.randn((2, 1, 8, 8), generator=g), (torch.rand((2, 1, 8, 8), generator=g) > 0.5).float()
    assert torch.equal(
        loss_fn(logits, target), DiceCELoss(sigmoid=True, smooth_nr=1e-5, smooth_dr=1e-5)(logits, target)
    )
    both = torch.ones((1, 2, 4, 4))  # every voxel in both nested regions
    sure = torch.full((1, 2, 4, 4), 20.0)
    assert loss_fn(sure, both).item() < 1e-6
    assert DiceCELoss(sigmoid=True)(sure, both).item() > 1.0  # the softmax cross-entropy: 2 log 2 per voxel
