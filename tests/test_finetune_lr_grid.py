"""finetune's ``lr_grid``: per-site learning rates chosen on each site's validation split (FeTS 2022's
per-institution search; ``fedseg.algorithms.finetune``)."""

from __future__ import annotations

import math

import pytest
import torch
from typer.testing import CliRunner

from fedseg.algorithms import get_algorithm
from fedseg.cli import app
from fedseg.run import prepare, run_algorithm, run_experiment
from fedseg.tracking import final_metrics

SITES = ["site1", "site2", "site3"]
LR = 1e-3  # train.lr
GRID = [LR, 3e-2]


def _cfg(tiny_config, **finetune):
    return tiny_config(
        algorithms=["fedavg", "finetune"],
        fl={"rounds": 2},
        train={"lr": LR},
        eval={"hd95": False},
        methods={"finetune": {"epochs": 2, **finetune}},
    )


def _same(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def _train_steps(result) -> int:
    return sum(r["steps"] for r in result.ledger if r["action"] == "train")


@pytest.fixture(scope="module")
def plain(tmp_path_factory, tiny_config, disc_federation):
    """fedavg, then finetune without a grid: ``{name: AlgorithmResult}``."""
    out = tmp_path_factory.mktemp("plain")
    results = run_experiment(_cfg(tiny_config), out, federation=disc_federation())
    return {r.name: r for r in results.algorithms}


def _finetune(tiny_config, disc_federation, plain, out, grid, **kw):
    prep = prepare(_cfg(tiny_config, lr_grid=grid), disc_federation())
    return run_algorithm("finetune", prep, out, resume=False, earlier={"fedavg": plain["fedavg"]}, **kw)


@pytest.fixture(scope="module")
def gridded(tmp_path_factory, tiny_config, disc_federation, plain):
    out = tmp_path_factory.mktemp("grid")
    return out, _finetune(tiny_config, disc_federation, plain, out, GRID)


def test_a_grid_of_train_lr_alone_is_no_grid_bit_for_bit(plain, tmp_path, tiny_config, disc_federation):
    one = _finetune(tiny_config, disc_federation, plain, tmp_path, [LR])
    ft = plain["finetune"]
    assert str(one.test_rows) == str(ft.test_rows)  # the test Dice (and every other test row)
    assert one.summary["dice"] == ft.summary["dice"]
    assert one.bundle.keys() == ft.bundle.keys()
    assert all(_same(one.bundle[m], ft.bundle[m]) for m in ft.bundle)
    assert one.rounds_rows == ft.rounds_rows
    assert one.summary["selected_rounds"] == ft.summary["selected_rounds"]
    assert one.summary["selected_lrs"] == {s: LR for s in SITES} and "selected_lrs" not in ft.summary


def test_each_site_selects_the_rate_of_its_best_validated_candidate(gridded):
    out, result = gridded
    rows = [r for r in result.metric_rows if r["metric"].startswith("val_dice_lr=")]
    assert {r["metric"] for r in rows} == {f"val_dice_lr={lr!r}" for lr in GRID}
    assert len(rows) == 2 * len(GRID) * len(SITES)  # every validated round (2), every candidate, every site
    by = {(r["site"], r["round"], r["metric"]): r["value"] for r in rows}
    differ = 0
    for s in SITES:
        best = None  # (score, round, lr): the first best in (round, grid) order
        for rnd in (1, 2):
            scores = [by[s, rnd, f"val_dice_lr={lr!r}"] for lr in GRID]
            differ += scores[0] != scores[1]
            for lr, score in zip(GRID, scores):
                if best is None or score > best[0]:
                    best = (score, rnd, lr)
            val = next(r["val_dice"] for r in result.rounds_rows if r["site"] == s and r["round"] == rnd)
            assert val == pytest.approx(max(scores), abs=1e-12)  # the round's val_dice: its best candidate
        assert best is not None and not math.isnan(best[0])
        assert result.summary["selected_lrs"][s] == best[2], s
        assert result.summary["selected_rounds"][s] == best[1], s
    assert differ == 2 * len(SITES)  # the rates give different models (the test could fail)
    log = (out / "run.log").read_text()
    expected = ", ".join(f"{s} {result.summary['selected_lrs'][s]:g}" for s in SITES)
    assert f"finetune selected lr per site: {expected}" in log
    tracked = final_metrics(result.summary)  # what a tracker (MLflow, ...) logs at the end
    assert {s: tracked[f"selected_lr/{s}"] for s in SITES} == result.summary["selected_lrs"]


def test_the_steps_counted_grow_with_the_grid(plain, gridded):
    _, result = gridded
    ft, fedavg = plain["finetune"], plain["fedavg"]
    assert _train_steps(ft) > 0
    assert _train_steps(result) == len(GRID) * _train_steps(ft)
    assert result.summary["sgd_steps"] == len(GRID) * ft.summary["sgd_steps"]
    assert result.summary["cost"]["sgd_steps"] == fedavg.summary["sgd_steps"] + _train_steps(result)
    assert result.summary["floats_sent"] == ft.summary["floats_sent"]  # w* once: no extra traffic


@pytest.mark.parametrize("grid, why", [([], "no learning rate"), ([0.01, -1.0], "> 0"), ([0.01, 0.01], "more than")])
def test_a_bad_grid_is_one_line_naming_the_field(grid, why):
    with pytest.raises(ValueError) as e:
        get_algorithm("finetune").parse_options({"lr_grid": grid})
    assert str(e.value).startswith("methods.finetune.lr_grid") and why in str(e.value)
    assert "\n" not in str(e.value)


def test_a_bad_grid_is_refused_by_the_cli_before_any_work(tmp_path):
    out = tmp_path / "run"
    args = ["run", "--preset", "demo", "--algorithms", "fedavg,finetune", "--out", str(out)]
    result = CliRunner().invoke(app, [*args, "--set", "methods.finetune.lr_grid=[0.01,0.0]"])
    assert result.exit_code == 1
    assert "methods.finetune.lr_grid" in " ".join(result.output.replace("│", " ").split())
    assert "Traceback" not in result.output and not out.exists()


class _Stop(Exception):
    pass


def test_resume_after_interruption_equals_uninterrupted_run(plain, gridded, tmp_path, tiny_config, disc_federation):
    _, full = gridded

    def stop(algo, rnd, losses):
        if rnd == 1:
            raise _Stop

    with pytest.raises(_Stop):
        _finetune(tiny_config, disc_federation, plain, tmp_path, GRID, on_round_end=stop)
    prep = prepare(_cfg(tiny_config, lr_grid=GRID), disc_federation())
    resumed = run_algorithm("finetune", prep, tmp_path, resume=True, earlier={"fedavg": plain["fedavg"]})
    assert all(_same(full.bundle[m], resumed.bundle[m]) for m in full.bundle)
    assert full.metric_rows == resumed.metric_rows
    assert full.rounds_rows == resumed.rounds_rows
    assert full.summary["dice"] == resumed.summary["dice"]
    assert full.summary["selected_lrs"] == resumed.summary["selected_lrs"]
    assert full.summary["sgd_steps"] == resumed.summary["sgd_steps"]


def test_ditto_ft_takes_the_grid_too(plain, gridded, tmp_path, tiny_config, disc_federation):
    """lam = 0: ``ditto-ft`` with the grid is ``finetune`` with the grid, bit for bit."""
    _, ft = gridded
    cfg = tiny_config(
        algorithms=["ditto-ft"],
        fl={"rounds": 2},
        train={"lr": LR},
        eval={"hd95": False},
        methods={"ditto-ft": {"epochs": 2, "lam": 0.0, "lr_grid": GRID}},
    )
    prep = prepare(cfg, disc_federation())
    ditto = run_algorithm("ditto-ft", prep, tmp_path, resume=False, earlier={"fedavg": plain["fedavg"]})
    assert ditto.summary["selected_lrs"] == ft.summary["selected_lrs"]
    assert all(_same(ditto.bundle[m], ft.bundle[m]) for m in ft.bundle)
    assert [r["value"] for r in ditto.metric_rows] == [r["value"] for r in ft.metric_rows]
