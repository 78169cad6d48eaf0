"""``train.lr_schedule`` (per-round local learning rate) and ``train.adam_betas``."""

from __future__ import annotations

import json
import math
from types import SimpleNamespace

import pytest
import torch

from fedseg.algorithms import qfedavg, scaffold
from fedseg.config import TrainConfig
from fedseg.config_load import ConfigError, validate_config
from fedseg.run import run_experiment
from fedseg.train import Trainer, make_optimizer, round_lr, round_train_config


def _numbers(summary: dict) -> dict:
    """summary.json without wall-clock seconds."""
    return {a: {k: v for k, v in e.items() if k != "seconds"} for a, e in summary["algorithms"].items()}


def test_constant_schedule_is_the_configured_rate_in_every_round():
    cfg = TrainConfig(lr=3e-4)
    assert [round_lr(cfg, t, 5) for t in range(1, 6)] == [3e-4] * 5
    assert round_lr(cfg, 2, 5, rate=0.01) == 0.01
    assert round_train_config(cfg, 3, 5) is cfg  # runs without a schedule build the same Trainer


def test_cosine_schedule_values():
    cfg = TrainConfig(lr=1e-3, lr_schedule="cosine", lr_min=1e-4)
    T = 4
    assert round_lr(cfg, 1, T) == 1e-3
    assert round_lr(cfg, 3, T) == pytest.approx((1e-3 + 1e-4) / 2)  # t - 1 = T / 2: halfway
    last = 1e-4 + 0.9e-3 * (1 + math.cos(math.pi * 3 / 4)) / 2
    assert round_lr(cfg, T, T) == pytest.approx(last)
    lrs = [round_lr(cfg, t, T) for t in range(1, T + 1)]
    assert all(a > b > 1e-4 for a, b in zip(lrs, lrs[1:]))
    assert round_lr(TrainConfig(lr=1e-3, lr_schedule="cosine"), 3, T) == pytest.approx(5e-4)  # lr_min = 0


def test_exponential_schedule_values_and_fets_default_decay():
    assert TrainConfig().lr_decay == 0.995  # FeTS 2022 benchmark, section 4.4.8
    cfg = TrainConfig(lr=1e-2, lr_schedule="exponential", lr_decay=0.5)
    assert [round_lr(cfg, t, 4) for t in range(1, 5)] == pytest.approx([1e-2, 5e-3, 2.5e-3, 1.25e-3])
    assert round_lr(cfg, 1, 4) == 1e-2


def test_other_rates_scale_by_the_schedules_factor():
    cfg = TrainConfig(lr=1e-3, lr_schedule="cosine", lr_min=1e-4)
    factor = round_lr(cfg, 2, 3) / cfg.lr
    assert round_lr(cfg, 2, 3, rate=0.02) == pytest.approx(0.02 * factor)
    assert round_lr(cfg, 2, 3, rate=cfg.lr) == round_lr(cfg, 2, 3)
    selector = cfg.model_copy(update={"lr": 0.02})  # e.g. FedSM's selector_lr
    assert round_train_config(cfg, 2, 3, selector).lr == pytest.approx(0.02 * factor)
    assert round_train_config(cfg, 2, 3).lr == round_lr(cfg, 2, 3)


def test_scheduled_rate_needs_a_round_within_the_run():
    cfg = TrainConfig(lr_schedule="exponential")
    for rnd in (0, 4):
        with pytest.raises(ValueError, match="lr_schedule"):
            round_lr(cfg, rnd, 3)


@pytest.mark.parametrize(
    "train, key",
    [
        ({"adam_betas": [0.9, 1.0]}, "train.adam_betas"),
        ({"adam_betas": [-0.1, 0.9]}, "train.adam_betas"),
        ({"lr_schedule": "step"}, "train.lr_schedule"),
        ({"lr_decay": 0}, "train.lr_decay"),
        ({"lr_schedule": "cosine", "lr": 1e-3, "lr_min": 1e-2}, "train.lr_min"),
    ],
)
def test_invalid_schedule_or_betas_name_the_key(train, key):
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        validate_config({"train": train}, "test")


def test_adam_betas_reach_the_optimizer():
    params = [torch.nn.Parameter(torch.zeros(2))]
    assert make_optimizer(TrainConfig(), params).param_groups[0]["betas"] == (0.9, 0.999)
    opt = make_optimizer(TrainConfig(adam_betas=(0.5, 0.99)), params)
    assert opt.param_groups[0]["betas"] == (0.5, 0.99)


def test_scaffold_and_qfedavg_use_the_rounds_rate(tmp_path, tiny_config, disc_federation, monkeypatch):
    """SCAFFOLD's eta_l (drift step and c_k update) and q-FedAvg's L = 1 / eta_l are the round's rate."""
    cfg = tiny_config(
        algorithms=["scaffold", "qfedavg"],
        train={"lr": 1e-3, "lr_schedule": "exponential", "lr_decay": 0.5, "budget": {"unit": "steps", "amount": 1}},
        fl={"rounds": 2},
    )
    assert scaffold.local_lr(SimpleNamespace(cfg=cfg, round=2)) == 5e-4  # type: ignore[arg-type]
    eta_l, lipschitz_lr = [], []
    local_lr, lipschitz = scaffold.local_lr, qfedavg.lipschitz
    monkeypatch.setattr(scaffold, "local_lr", lambda ctx: eta_l.append((ctx.round, local_lr(ctx))) or eta_l[-1][1])
    monkeypatch.setattr(qfedavg, "lipschitz", lambda opts, lr: lipschitz_lr.append(lr) or lipschitz(opts, lr))
    run_experiment(cfg, tmp_path, federation=disc_federation(cases_per_site=8))
    assert eta_l == [(t, lr) for t, lr in ((1, 1e-3), (2, 5e-4)) for _ in range(3 * 2)]  # 3 sites, 2 uses each
    # 3 sites' Delta_k, h_k, then the server's check of each reply's h_k (Eq. 16 again): the round's rate in both
    assert lipschitz_lr == [lr for lr in (1e-3, 5e-4) for _ in range(3 + 3)]


def _spy_fit_lrs(monkeypatch) -> list[tuple[str, float, bool]]:
    """Record ``(data name, lr of the optimizer Trainer.fit steps with, whether it holds moments)`` for
    every local training run (after any carried-over moments were loaded into the built optimizer)."""
    seen: list[tuple[str, float, bool]] = []
    fit = Trainer.fit

    def spy(self, model, data, generator, optimizer=None, *args, **kwargs):
        assert optimizer is not None  # every method hands the Trainer its round's optimizer
        seen.append((data.name, optimizer.param_groups[0]["lr"], bool(optimizer.state)))
        return fit(self, model, data, generator, optimizer, *args, **kwargs)

    monkeypatch.setattr(Trainer, "fit", spy)
    return seen


@pytest.mark.parametrize("schedule", ["constant", "cosine"])
def test_each_rounds_optimizer_carries_the_rounds_rate(tmp_path, tiny_config, disc_federation, monkeypatch, schedule):
    """Centralized (one pooled Trainer per round) and FedAvg (one per site and round, Adam moments
    carried across rounds): every optimizer steps at ``round_lr`` of its round; ``constant`` at train.lr."""
    cfg = tiny_config(
        algorithms=["centralized", "fedavg"],
        train={"lr": 2e-3, "lr_schedule": schedule, "lr_min": 2e-4, "budget": {"unit": "steps", "amount": 1}},
        fl={"rounds": 3},
    )
    seen = _spy_fit_lrs(monkeypatch)
    run_experiment(cfg, tmp_path, federation=disc_federation(cases_per_site=8))
    rates = [round_lr(cfg.train, t, 3) for t in (1, 2, 3)]
    if schedule == "constant":
        assert rates == [2e-3] * 3
    else:
        assert rates[0] == 2e-3 and rates[0] > rates[1] > rates[2] > 2e-4
    pooled = [(lr, moments) for name, lr, moments in seen if name == "pooled"]
    local = [(lr, moments) for name, lr, moments in seen if name != "pooled"]
    # rounds 2 and 3 load the previous round's Adam moments: the rate is still the round's own
    assert pooled == [(r, t > 1) for t, r in enumerate(rates, 1)]
    assert local == [(r, t > 1) for t, r in enumerate(rates, 1) for _ in range(3)]  # 3 sites per round


def test_resumed_cosine_run_equals_uninterrupted_run(tmp_path, tiny_config, disc_federation):
    cfg = tiny_config(
        algorithms=["fedavg"],
        train={"lr_schedule": "cosine", "budget": {"unit": "steps", "amount": 2}},
        fl={"rounds": 3},
    )
    full = run_experiment(cfg, tmp_path / "full", federation=disc_federation(cases_per_site=8))

    class Stop(Exception):
        pass

    def stop_after_round_2(name, rnd, losses):
        if rnd == 2:
            raise Stop

    with pytest.raises(Stop):
        run_experiment(
            cfg, tmp_path / "cut", on_round_end=stop_after_round_2, federation=disc_federation(cases_per_site=8)
        )
    resumed = run_experiment(cfg, tmp_path / "cut", resume=True, federation=disc_federation(cases_per_site=8))
    for a, b in zip(full.algorithms, resumed.algorithms):
        for model in a.bundle:
            for k in a.bundle[model]:
                assert torch.equal(a.bundle[model][k], b.bundle[model][k]), (a.name, model, k)
    s_full = json.loads((tmp_path / "full" / "summary.json").read_text())
    s_cut = json.loads((tmp_path / "cut" / "summary.json").read_text())
    assert _numbers(s_full) == _numbers(s_cut)
