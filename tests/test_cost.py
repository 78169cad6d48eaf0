"""FeTS Table 2 cost model (Eq. 34-38) on hand-made ledger rows, and its place in a run's outputs."""

from __future__ import annotations

import csv
import json

import pytest

from fedseg.algorithms.centralized import POOLED as CENTRALIZED_POOLED
from fedseg.algorithms.qfedavg import LOSS_ACTION
from fedseg.config import CostConfig, RunConfig
from fedseg.engine.ledger import LedgerRow
from fedseg.evaluate.cost import FORWARD_ACTIONS, POOLED, cost_table
from fedseg.report.html import render_report
from fedseg.run import run_experiment

# 250,000 floats: 1 s down at 1 MB/s, 2 s up at 0.5 MB/s (4 bytes per float)
M = 250_000
CFG = CostConfig(batch_seconds=2.0, eval_seconds=0.5, forward_fraction=0.25, download_mb_s=1.0, upload_mb_s=0.5)
VAL = {"a": 4, "b": 10}


def _rows() -> list[LedgerRow]:
    """Two q-FedAvg-like rounds of sites a and b: a forward-only "loss" exchange (model down), a "train"
    exchange (model up); round 1 not validated, round 2 validated (first evaluate row per site),
    then the final test evaluation (second evaluate rows) and a share_model row, all in round 2."""
    r = LedgerRow
    return [
        r(1, "a", "loss", 3, M, 0, 0.3),
        r(1, "b", "loss", 1, M, 0, 0.1),
        r(1, "a", "train", 10, 0, M, 5.0),
        r(1, "b", "train", 4, 0, M, 2.0),
        r(2, "a", "loss", 3, M, 0, 0.3),
        r(2, "b", "loss", 1, M, 0, 0.1),
        r(2, "a", "train", 10, 0, M, 5.0),
        r(2, "b", "train", 12, 0, M, 6.0),
        r(2, "a", "evaluate", 0, M, 16, 0.8),
        r(2, "b", "evaluate", 0, M, 40, 2.0),
        r(2, "a", "evaluate", 0, M, 16, 100.0),
        r(2, "b", "evaluate", 0, M, 40, 100.0),
        r(2, "a", "share_model", 0, 0, M, 50.0),
    ]


def test_cost_table_by_hand_with_config_timing():
    c = cost_table(_rows(), CFG, VAL)
    assert c["sgd_steps"] == 10 + 4 + 10 + 12  # Eq. 34: the loss pass is not SGD
    assert c["parallel_sgd_steps"] == 10 + 12  # Eq. 35: per round the busiest site
    assert c["forward_batches"] == 3 + 1 + 3 + 1
    assert c["floats"] == 8 * M  # training exchanges only: 4 downloads + 4 uploads
    assert c["eval_floats"] == 4 * M + 2 * 16 + 2 * 40 + M  # evaluate and share_model rows, reported apart
    assert (c["t_batch"], c["t_forward"], c["t_eval"]) == (2.0, 0.5, 0.5)
    # Eq. 36-38, t_batch 2 s, t_forward 0.5 s, t_eval 0.5 s, 1 s down + 2 s up per model:
    # round 1: a = 10*2 + 3*0.5 + 0 + 1 + 2 = 24.5, b = 4*2 + 0.5 + 3 = 11.5   -> 24.5
    # round 2: a = 20 + 1.5 + 4*0.5 + 3 = 26.5,     b = 24 + 0.5 + 10*0.5 + 3 = 32.5 -> 32.5
    assert c["simulated_seconds"] == pytest.approx(24.5 + 32.5)
    assert c["simulated_hours"] == pytest.approx(57.0 / 3600)
    assert (c["timing"], c["download_mb_s"], c["upload_mb_s"], c["bytes_per_float"]) == ("config", 1.0, 0.5, 4)


def test_cost_table_by_hand_with_measured_timing():
    c = cost_table(_rows(), CFG.model_copy(update={"timing": "measured"}), VAL)
    # t_batch = (5 + 2 + 5 + 6) s / 36 steps; t_forward = 0.8 s / 8 batches; t_eval from the first
    # evaluate row per validated (round, site): (0.8 + 2.0) s / (4 + 10) cases
    assert (
        c["t_batch"] == pytest.approx(0.5)
        and c["t_forward"] == pytest.approx(0.1)
        and c["t_eval"] == pytest.approx(0.2)
    )
    # round 1: a = 5 + 0.3 + 3 = 8.3, b = 2 + 0.1 + 3 = 5.1;
    # round 2: a = 5 + 0.3 + 0.8 + 3 = 9.1, b = 6 + 0.1 + 2 + 3 = 11.1
    assert c["simulated_seconds"] == pytest.approx(8.3 + 11.1)
    assert c["sgd_steps"] == 36 and c["floats"] == 8 * M


def test_cost_table_reads_ledger_dicts_and_csv_strings():
    rows = [{k: str(v) for k, v in vars(r).items()} for r in _rows()]
    assert cost_table(rows, CFG, VAL) == cost_table(_rows(), CFG, VAL)


def test_centralized_pooled_participant_validates_every_site():
    """The paper's centralized row: one participant trains and validates all validation cases."""
    assert POOLED == CENTRALIZED_POOLED and LOSS_ACTION in FORWARD_ACTIONS
    rows = [
        LedgerRow(1, POOLED, "train", 20, 0, 0, 1.0),
        LedgerRow(1, "a", "evaluate", 0, M, 16, 0.1),
        LedgerRow(1, "b", "evaluate", 0, M, 40, 0.1),
        LedgerRow(2, POOLED, "train", 20, 0, 0, 1.0),
    ]
    c = cost_table(rows, CFG, VAL)
    assert (c["sgd_steps"], c["parallel_sgd_steps"], c["floats"]) == (40, 40, 0)
    assert c["simulated_seconds"] == pytest.approx((20 * 2 + 14 * 0.5) + 20 * 2)  # no comm: data is pooled


def test_cost_config_defaults_are_the_papers_and_keys_are_checked(tiny_config):
    cfg = RunConfig().cost
    assert (
        cfg.timing,
        cfg.batch_seconds,
        cfg.eval_seconds,
        cfg.download_mb_s,
        cfg.upload_mb_s,
        cfg.bytes_per_float,
    ) == ("config", 1.86, 0.80, 20.0, 13.3, 4)
    with pytest.raises(ValueError):
        tiny_config(cost={"bandwidth": 3})
    with pytest.raises(ValueError):
        tiny_config(cost={"timing": "guessed"})


def test_summary_json_and_report_carry_the_cost_table(tmp_path, tiny_config, disc_federation):
    cfg = tiny_config(algorithms=["fedavg", "qfedavg"], fl={"rounds": 2}, cost={"download_mb_s": 10.0})
    run_experiment(cfg, tmp_path, federation=disc_federation(n_sites=2, cases_per_site=8))
    summary = json.loads((tmp_path / "summary.json").read_text())
    with open(tmp_path / "ledger.csv") as f:
        ledger = list(csv.DictReader(f))
    val = {"site1": 2, "site2": 2}  # 8 cases, ratio split 0.5 / 0.25 / 0.25
    for name in ("fedavg", "qfedavg"):
        entry = summary["algorithms"][name]
        rows = [{k: v for k, v in r.items() if k != "algorithm"} for r in ledger if r["algorithm"] == name]
        expected = cost_table(rows, cfg.cost, val)
        assert entry["cost"] == pytest.approx(expected)
        assert entry["cost"]["download_mb_s"] == 10.0
        assert entry["cost"]["floats"] == entry["floats_sent"]
        assert entry["cost"]["sgd_steps"] == 2 * 2 * 1  # 2 rounds x 2 sites x 1 batch of 4 training cases
    assert summary["algorithms"]["qfedavg"]["cost"]["forward_batches"] == 4
    page = render_report(tmp_path).read_text()
    assert "Cost (FeTS Table 2)" in page and "Total max. parallel SGD steps" in page
    assert f"{summary['algorithms']['qfedavg']['cost']['simulated_hours']:.3f}" in page
