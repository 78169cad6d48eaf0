"""fl.stop: the validation plateau and the SGD-step / simulated-time budgets (fedseg.run.stopping), on whole runs."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from fedseg.config import StopConfig
from fedseg.run import run_experiment
from fedseg.run.stopping import convergence, plateau_round, recorded_not_converged, stop_reason


def test_plateau_reference_moves_only_on_a_gain_above_min_delta():
    scores = {1: 0.50, 2: 0.52, 3: 0.521, 4: float("nan"), 5: 0.6}
    assert plateau_round(scores, 0.0) == 5
    assert plateau_round({k: v for k, v in scores.items() if k < 5}, 0.005) == 2  # 0.521 is not 0.005 above 0.52
    stop = StopConfig(patience=2, min_delta=0.005)
    assert stop_reason(stop, {1: 0.5, 2: 0.52, 3: 0.521}, 3, None) is None  # 1 round since round 2
    assert stop_reason(stop, {1: 0.5, 2: 0.52, 3: 0.521, 4: 0.52}, 4, None) == "plateau"
    assert stop_reason(StopConfig(sgd_steps=10), {}, 4, {"sgd_steps": 10.0, "simulated_time": 0.0}) == "sgd_steps"


def test_min_rounds_lets_no_plateau_stop_a_run_before_it():
    warm_up = {1: 0.5, 2: 0.52, 3: 0.52, 4: 0.52, 5: 0.52, 6: 0.52}  # stalls after round 2
    stop = StopConfig(patience=2, min_delta=0.005, min_rounds=5)
    assert [stop_reason(stop, warm_up, r, None) for r in (4, 5)] == [None, "plateau"]
    assert stop_reason(StopConfig(patience=2, min_delta=0.005), warm_up, 4, None) == "plateau"


def test_convergence_flags_a_best_round_in_the_last_tenth():
    stop = StopConfig()
    assert convergence({r: r / 30 for r in range(1, 31)}, 30, 28, stop, None)["late_best"]
    flat = {r: min(r, 10) / 30 for r in range(1, 31)}
    entry = convergence(flat, 30, 10, stop, None)
    assert not entry["late_best"] and entry["plateaued"] and entry["patience"] == 3


def test_a_short_run_still_rising_before_a_last_dip_has_not_converged():
    """Of 10 rounds the last 10% was round 10 alone: a run climbing 0.03 a round to round 9 that dipped by 0.002 in
    round 10 counted as converged (a statistics audit). The late window is at least the last 2 rounds."""
    rising = {r: 0.5 + 0.03 * r for r in range(1, 10)} | {10: 0.5 + 0.03 * 9 - 0.002}
    entry = convergence(rising, 10, 9, StopConfig(), None)
    assert entry["late_best"] and not entry["plateaued"] and not entry["converged"]
    assert convergence(rising, 10, 8, StopConfig(), None)["late_best"] is False


def test_a_validation_curve_that_never_rose_above_its_first_round_is_no_convergence():
    """A flat curve (an untrained model: every round scores 0.1702) plateaus at once and its best round is the first,
    so it counted as converged (a results audit, train.lr = 1e-9). ``improved`` is False and ``converged`` too; a
    curve that rose once, or a run with one validated round, is not flagged."""
    flat = {r: 0.1702 for r in range(1, 7)}
    entry = convergence(flat, 6, 1, StopConfig(), None)
    assert entry["plateaued"] and not entry["late_best"]
    assert entry["improved"] is False and entry["converged"] is False
    rose = convergence({1: 0.17, 2: 0.4, 3: 0.4, 4: 0.4, 5: 0.4, 6: 0.4}, 6, 2, StopConfig(), None)
    assert rose["improved"] is True and rose["converged"] is True
    assert convergence({1: 0.17}, 1, 1, StopConfig(), None)["improved"] is None
    worse = convergence({1: 0.5, 2: 0.3, 3: math.nan, 4: 0.2}, 4, 1, StopConfig(), None)  # only got worse
    assert worse["improved"] is False and not worse["converged"]


def test_an_untrained_run_says_it_never_improved_in_its_summary_verdict_and_model_card(
    tmp_path, tiny_config, disc_federation
):
    from fedseg.report.html import render_report
    from fedseg.report.verdict import summary_lines

    cfg = tiny_config(algorithms=["fedavg", "fedprox"], fl={"rounds": 3}, train={"lr": 1e-12})
    results = run_experiment(cfg, tmp_path, federation=disc_federation())
    for result in results.algorithms:
        assert result.summary["convergence"]["improved"] is False and result.card["never_improved"] is True
    said = [line for line in summary_lines(tmp_path) if line.startswith("Never improved")]
    assert len(said) == 1 and "FedAvg" in said[0] and "FedProx" in said[0] and "did the model train" in said[0]
    assert "<b>Never improved</b>" in render_report(tmp_path).read_text()


def _ledger_totals(result) -> tuple[int, int]:
    train = [r for r in result.ledger if r["action"] not in ("evaluate",)]
    return sum(int(r["steps"]) for r in train if r["action"] == "train"), max(int(r["round"]) for r in result.ledger)


def test_patience_stops_on_the_plateau_and_a_resume_stays_stopped(tmp_path, tiny_config, disc_federation):
    # min_delta 1: no gain ever counts, so the reference stays at round 1 and patience 2 stops after round 3
    cfg = tiny_config(algorithms=["fedavg"], fl={"rounds": 6, "stop": {"patience": 2, "min_delta": 1.0}})
    result = run_experiment(cfg, tmp_path, federation=disc_federation()).algorithms[0]
    assert result.summary["rounds"] == 3 and result.summary["convergence"]["stopped"] == "plateau"
    assert max(int(r["round"]) for r in result.ledger) == 3
    assert sorted({int(r["round"]) for r in result.rounds_rows}) == [1, 2, 3]

    def interrupt_at_the_stop(name, rnd, losses):
        if rnd == 3:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):  # the stop round's checkpoint is on disk, the run not finished
        run_experiment(cfg, tmp_path / "cut", on_round_end=interrupt_at_the_stop, federation=disc_federation())
    again = run_experiment(cfg, tmp_path / "cut", resume=True, federation=disc_federation()).algorithms[0]
    assert max(int(r["round"]) for r in again.ledger) == 3  # resumed stopped: no round 4
    assert {k: v for k, v in again.summary.items() if k != "seconds"} == {
        k: v for k, v in result.summary.items() if k != "seconds"
    }


def test_sgd_step_budget_gives_the_stated_total(tmp_path, tiny_config, disc_federation):
    one = tiny_config(algorithms=["fedavg"], fl={"rounds": 1})
    per_round, _ = _ledger_totals(run_experiment(one, tmp_path / "one", federation=disc_federation()).algorithms[0])
    exact = tiny_config(algorithms=["fedavg"], fl={"rounds": 10, "stop": {"sgd_steps": 3 * per_round}})
    result = run_experiment(exact, tmp_path / "exact", federation=disc_federation()).algorithms[0]
    steps, rounds = _ledger_totals(result)
    assert (steps, rounds) == (3 * per_round, 3) and result.summary["sgd_steps"] == 3 * per_round
    assert result.summary["convergence"]["stopped"] == "sgd_steps"
    # a budget between two rounds' totals: the round that reaches it is the last one
    between = tiny_config(algorithms=["fedavg"], fl={"rounds": 10, "stop": {"sgd_steps": 2 * per_round + 1}})
    steps, rounds = _ledger_totals(run_experiment(between, tmp_path / "b", federation=disc_federation()).algorithms[0])
    assert rounds == 3 and 2 * per_round + 1 <= steps < 3 * per_round + per_round


def test_simulated_time_budget_gives_the_stated_total(tmp_path, tiny_config, disc_federation):
    free = tiny_config(algorithms=["fedavg"], fl={"rounds": 4})
    hours = run_experiment(free, tmp_path / "free", federation=disc_federation()).algorithms[0].summary["cost"]
    per_round = hours["simulated_hours"] / 4  # timing: config, identical FedAvg rounds
    budget = 2 * per_round
    capped = tiny_config(algorithms=["fedavg"], fl={"rounds": 10, "stop": {"simulated_hours": budget}})
    result = run_experiment(capped, tmp_path / "capped", federation=disc_federation()).algorithms[0]
    assert result.summary["rounds"] == 2 and result.summary["convergence"]["stopped"] == "simulated_time"
    assert math.isclose(result.summary["cost"]["simulated_hours"], budget, rel_tol=1e-9)


@pytest.mark.parametrize("rounds", [2])
def test_a_run_without_stop_trains_every_round_and_records_its_convergence(
    tmp_path, tiny_config, disc_federation, rounds
):
    result = run_experiment(tiny_config(algorithms=["fedavg"]), tmp_path, federation=disc_federation()).algorithms[0]
    conv = result.summary["convergence"]
    assert conv["rounds"] == rounds and conv["stopped"] is None and conv["best_round"] == result.summary["best_round"]


def test_validation_scores_are_rebuilt_from_the_rounds_rows_of_an_older_checkpoint():
    from fedseg.run import validated_from_rows

    rows = [{"round": 1, "val_dice": 0.5}, {"round": 1, "val_dice": float("nan")}, {"round": 2, "val_dice": 0.7}]
    rows.append({"round": 2, "val_dice": 0.9})
    assert validated_from_rows(rows) == {1: 0.5, 2: pytest.approx(0.8)}


def test_every_table_uses_one_late_window():
    """The run's convergence, a per-site method's sites and the benchmarks' lines each had their own rule (the last
    10%, the last round only, best > 0.9 x rounds): one window now, the last 10% of the rounds, at least 2."""
    from fedseg.run.stopping import late_best, late_window, recorded_late_sites

    assert [late_window(r) for r in (1, 10, 20, 25, 100)] == [2, 2, 2, 3, 10]
    assert late_best(9, 10) and not late_best(8, 10) and late_best(91, 100) and not late_best(90, 100)
    assert recorded_late_sites({"rounds": 10, "selected_rounds": {"a": 9, "b": 10, "c": 5}}) == (2, 3)  # a: was not


def test_a_curve_first_scored_after_round_1_or_a_fine_tuning_is_not_judged_by_its_first_score():
    """The review's counter-examples: validate_every = 5 (0.850 at round 5, 0.8505 at round 10) had trained before its
    first score, and a fine-tuning starting from a trained model may be best at once: neither is 'never improved'."""
    late_first = convergence({5: 0.850, 10: 0.8505}, 10, 10, StopConfig(), None)
    assert late_first["improved"] is None and late_first["plateaued"]
    tuned = convergence({1: 0.80, 2: 0.799, 3: 0.797, 4: 0.79}, 4, 1, StopConfig(), None, from_initial_weights=False)
    assert tuned["improved"] is None and tuned["converged"] is True


def test_a_study_table_says_never_improved_apart_from_may_not_have_converged():
    from fedseg.report.study_tables import unconverged_note
    from fedseg.studies import converged_cell

    flat = {"convergence": convergence({r: 0.1702 for r in range(1, 7)}, 6, 1, StopConfig(), None)}
    rising = {"convergence": convergence({r: r / 10 for r in range(1, 7)}, 6, 6, StopConfig(), None)}
    rows = [{"converged": converged_cell(flat)}, {"converged": converged_cell(rising)}]
    assert [r["converged"] for r in rows] == ["never improved", "no"]
    note = unconverged_note(rows, {id(rows[0]): "FedAvg: 1e-9", id(rows[1]): "FedAvg: 0.1"})
    assert "<b>May not have converged</b>: FedAvg: 0.1 (" in note and "<b>Never improved</b>: FedAvg: 1e-9 (" in note


# --------------------------------------------------------------------------- one rule for every page
def _pages_flag(entry: dict) -> tuple[bool, bool, bool]:
    """Whether the run report's verdict, the bench's tables and the model card each say ``entry`` may not have
    converged."""
    from fedseg.bench.tables import convergence_counts
    from fedseg.presentation.kit import RunFiles
    from fedseg.report.verdict import unconverged_methods

    late, _ = unconverged_methods(RunFiles(Path("."), {"sites": ["a", "b", "c"], "algorithms": {"m": entry}}))
    return bool(late), convergence_counts([entry])["not_converged"] == 1, recorded_not_converged(entry)


def test_a_per_site_method_is_judged_on_its_sites_rounds_by_every_page():
    """The report named a per-site method when half its sites selected a late round, whatever the plateau; the bench
    read the convergence entry of the mean curve's best round: the two disagreed on one run. Now the run records the
    per-site rule (``late_sites``) and every page reads it."""
    rising = {r: r / 10 for r in range(1, 11)}  # still climbing: no plateau
    flat = {r: min(r, 3) / 10 for r in range(1, 11)}  # plateau since round 3
    sites_late = {"a": 10, "b": 9, "c": 2}
    entry = convergence(rising, 10, 4, StopConfig(), None, selected_rounds=sites_late)  # mean curve's best: early
    assert entry["late_sites"] == [2, 3] and entry["late_best"] and not entry["converged"] and entry["rule"] == 2
    summary = {"rounds": 10, "best_round": 4, "selected_rounds": sites_late, "convergence": entry}
    assert _pages_flag(summary) == (True, True, True)
    plateau = convergence(flat, 10, 4, StopConfig(), None, selected_rounds=sites_late)
    assert plateau["late_best"] and plateau["plateaued"] and plateau["converged"]
    assert _pages_flag({**summary, "convergence": plateau}) == (False, False, False)
    early = convergence(rising, 10, 10, StopConfig(), None, selected_rounds={"a": 10, "b": 2, "c": 3})
    assert early["late_sites"] == [1, 3] and not early["late_best"]  # the mean curve's best round 10 is late
    assert _pages_flag({**summary, "selected_rounds": {"a": 10, "b": 2, "c": 3}, "convergence": early}) == (
        False,
        False,
        False,
    )


def test_entries_written_before_the_rule_are_read_as_it_says():
    """A per-site entry of an older run recorded the mean curve's best round: its sites are counted instead; an older
    fedavg-dp entry with select_round last judged its last round alone (nothing can be told: not flagged); an entry
    older than the convergence record: its selected round is its last."""
    old = {"rounds": 10, "late_best": False, "plateaued": False, "converged": True}
    per_site = {"rounds": 10, "best_round": 4, "selected_rounds": {"a": 10, "b": 9, "c": 2}, "convergence": old}
    assert _pages_flag(per_site) == (True, True, True)
    last = {"rounds": 10, "late_best": True, "plateaued": False, "converged": False}
    dp = {"rounds": 10, "best_round": 10, "privacy": {"select_round": "last"}, "convergence": last}
    assert _pages_flag(dp) == (False, False, False)
    assert _pages_flag({"rounds": 10, "best_round": 10}) == (True, True, True)
    assert _pages_flag({"rounds": 10, "best_round": 7}) == (False, False, False)
    assert not recorded_not_converged({}) and not recorded_not_converged({"rounds": 0, "best_round": 0})  # no data


def test_runs_record_the_rule_their_pages_read(tmp_path, tiny_config, disc_federation):
    """A per-site method's summary.json carries its sites' late count; fedavg-dp with select_round last is judged on
    its whole validation curve (its last round alone told nothing: ``improved`` was None, never plateaued)."""
    cfg = tiny_config(
        algorithms=["local", "fedavg-dp"], fl={"rounds": 3}, methods={"fedavg-dp": {"noise_multiplier": 0.1}}
    )
    run_experiment(cfg, tmp_path, federation=disc_federation(n_sites=3, cases_per_site=8))
    summary = json.loads((tmp_path / "summary.json").read_text())
    local, dp = summary["algorithms"]["local"], summary["algorithms"]["fedavg-dp"]
    k, n = local["convergence"]["late_sites"]
    assert n == 3 and k == sum(r > 1 for r in local["selected_rounds"].values())  # 3 rounds: rounds 2-3 are late
    assert local["convergence"]["late_best"] is (2 * k >= n)
    assert dp["privacy"]["select_round"] == "last" and dp["best_round"] == 3
    assert dp["convergence"]["improved"] is not None  # judged on rounds 1-3, not on round 3 alone
    for entry in (local, dp):
        assert entry["convergence"]["rule"] == 2
        assert len(set(_pages_flag(entry))) == 1
