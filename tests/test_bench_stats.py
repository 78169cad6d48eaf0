"""The bench's seeds, paired comparisons and tuning guards (issue 27), without training: the planned runs' data seed,
resuming a bench recorded before data.seed, the CI-based mark, rendering tables that lack the new keys, grid-edge
flags and ties on validation, and the plateau rule's min_rounds in tuning runs."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import numpy as np
import pytest
import yaml

from fedseg.atomic_files import strict_json_text
from fedseg.bench import legend, report, table_rows
from fedseg.bench.execute import Finished
from fedseg.bench.phases import BENCH_FILE, check_out
from fedseg.bench.plan import final_runs, load_bench, run_config, settings, tuning_runs
from fedseg.bench.select import edge_keys, method_edges, select_settings, tuning_rows
from fedseg.bench.tables import add_tests, correct_tests
from fedseg.config_load import ConfigError
from fedseg.evaluate.stats import significant
from fedseg.run.stopping import PLATEAU, stop_reason

RESULTS = Path(__file__).resolve().parents[1] / "benchmarks" / "results"


def _bench(tmp_path: Path, **fields) -> Path:
    spec = {
        "name": "tiny",
        "base": {"preset": "synthetic-retina"},
        "set": ["data.scale=0.05", "data.image_size=16", "model.channels=[4,8,16]"],
        "federations": ["synthetic-retina"],
        "methods": ["fedavg", {"name": "fedprox", "grid": {"methods.fedprox.mu": [0.1, 1.0, 10.0]}}],
        "seeds": [0, 1],
        **fields,
    }
    path = tmp_path / "bench.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def _final_configs(tmp_path: Path, **fields):
    spec, root = load_bench(_bench(tmp_path, **fields))
    chosen = {("synthetic-retina", "fedprox"): settings(spec.method("fedprox"))[0]}
    return [run_config(spec, root, run) for run in final_runs(spec, chosen)]


def test_a_bench_varies_the_run_seed_only_unless_it_asks_for_per_seed_data(tmp_path):
    fixed = _final_configs(tmp_path)
    assert {c.seed for c in fixed} == {0, 1} and {c.data.seed for c in fixed} == {0}
    per_seed = _final_configs(tmp_path, data_seed="per-seed")
    assert all(c.data.seed == c.seed for c in per_seed)


def test_a_bench_recorded_before_data_seed_resumes_only_as_per_seed(tmp_path):
    spec, _ = load_bench(_bench(tmp_path, data_seed="per-seed"))
    old = spec.model_dump(mode="json")
    del old["data_seed"]  # written by a fedseg without it: its runs took their data from their seed
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / BENCH_FILE).write_text(json.dumps(old))
    check_out(spec, tmp_path / "out", resume=True)
    fixed, _ = load_bench(_bench(tmp_path))
    with pytest.raises(ValueError, match="data_seed"):
        check_out(fixed, tmp_path / "out", resume=True)
    alternative, _ = load_bench(_bench(tmp_path, data_seed="per-seed", tests={"alternative": "greater"}))
    check_out(alternative, tmp_path / "out", resume=True)  # the tests change only the tables
    with pytest.raises(ConfigError, match="alternative"):
        load_bench(_bench(tmp_path, tests={"alternative": "bigger"}))


def _per_seed(rng, shift: float) -> dict[int, dict]:
    base = rng.normal(0.8, 0.05, (2, 30))
    return {
        s: {(f"site{i}", f"c{j}"): base[i, j] + shift + rng.normal(0, 0.01) for i in range(2) for j in range(30)}
        for s in range(3)
    }


def test_the_tables_mark_a_method_where_its_ci_excludes_0_on_the_alternatives_side():
    rng = np.random.default_rng(0)
    per_seed = {"ref": _per_seed(rng, 0.0), "better": _per_seed(rng, 0.05), "same": _per_seed(rng, 0.0)}
    for alternative, marked in (("two-sided", {"better"}), ("greater", {"better"}), ("less", set())):
        methods: dict[str, dict] = {name: {"sites": {"site0": {}, "site1": {}}} for name in per_seed}
        add_tests(methods, per_seed, "ref", alternative)
        correct_tests({"methods": methods})
        assert {n for n, s in methods.items() if s["dagger"]} == marked, alternative
        better = methods["better"]
        assert better["wilcoxon"]["alternative"] == alternative and better["wilcoxon"]["ci_low"] > 0
        assert set(better["site_wilcoxon"]) == {"site0", "site1"}
        assert all(t["n"] == 30 for t in better["site_wilcoxon"].values())


def test_tables_without_the_new_keys_render_them_as_absent():
    fed = {  # a tables.json method entry written before the CI, the rank stability and the grid edge
        "regions": ["disc"],
        "hd95_unit": "pixels",
        "runs": 1,
        "sites": ["site1"],
        "methods": {
            "fedavg": {
                "setting": "lr=0.01",
                "dice": {"mean": 0.9, "std": 0.1},
                "regions": {"disc": {"mean": 0.9, "std": 0.1}},
                "hd95": {"mean": 1.0, "std": math.nan},
                "client_avg": {"mean": 0.9, "std": math.nan},
                "convergence": {"runs": 1, "not_converged": 0},
                "wilcoxon": {"n": 5, "p": 0.01, "mean_diff": 0.01, "median_diff": 0.01},
            }
        },
        "comparisons": [{"method": "a", "against": "b", "seeds": 1, "n": 5, "mean_diff": 0.01, "p": 0.01}],
    }
    row = table_rows.test_table(fed, "ref")[1][0]
    assert row[1] == "lr=0.01" and "–" in row and "0.01" in row  # no CI, no mark, the p
    assert row[3:5] == ["–", "–"]  # no rounds, no SGD steps recorded
    assert table_rows.comparison_table(fed)[1][0][2:4] == ["– / –", "– / –"]
    assert table_rows.comparison_table(fed)[1][0][7:] == ["–", "–", "0.01"]
    assert table_rows.rank_table(fed) == (["method"], [])


def test_a_selected_value_at_the_grid_edge_is_flagged():
    spec_path = {"methods.fedprox.mu": [0.1, 1.0, 10.0], "train.lr": [0.003, 0.001], "x.kind": ["a", "b"]}
    from fedseg.bench.spec import MethodSpec

    method = MethodSpec(name="fedprox", grid=spec_path)
    inner = (("methods.fedprox.mu", 1.0), ("train.lr", 0.003), ("x.kind", "a"))
    assert edge_keys(method, inner) == ["train.lr (high)"]  # the grid's order does not matter; categories have none
    assert edge_keys(method, (("methods.fedprox.mu", 0.1),)) == ["methods.fedprox.mu (low)"]
    assert edge_keys(method, (("methods.fedprox.mu", 1.0),)) == []
    rows = [
        {"federation": "f", "method": "fedprox", "setting": "mu=10.0", "val_dice": 0.9, "test_dice": 0.8, "runs": 1}
        | {"selected": True, "at_edge": "methods.fedprox.mu (high)"},
        {"federation": "f", "method": "fedprox", "setting": "mu=1.0", "val_dice": 0.8, "test_dice": 0.8, "runs": 1}
        | {"selected": False, "at_edge": "", "plateau_stops": "24 29"},
    ]
    table = table_rows.tune_table(rows, "f")[1]
    assert [r[-1] for r in table] == ["✓ (grid edge): methods.fedprox.mu (high)", ""]
    assert [r[-2] for r in table] == ["", "24 29"]  # where the plateau rule stopped the losing setting's runs


def _tuned(run, val: float) -> Finished:
    entry = {"convergence": {"best_val_dice": val, "rounds": 2}, "dice": {"client_avg": 1 - val}, "cost": {}}
    return Finished(run, Path(), {"algorithms": {"fedprox": entry}}, 0.0)


def _method_entry(setting: str, at_edge: list[str]) -> dict:
    """A tables.json method entry as the test table reads it."""
    ms = {"mean": 0.9, "std": 0.01, "n": 10}
    return {
        "setting": setting,
        "at_edge": at_edge,
        "dice": ms,
        "regions": {"disc": ms},
        "hd95": ms,
        "client_avg": ms,
        "convergence": {"runs": 2, "not_converged": 0},
    }


def _tied_bench(tmp_path: Path, val: dict[str, float]):
    """The tiny bench's fedprox tuned with validation scores ``val`` (by setting label): its spec, tuning rows (as
    tables.json holds them: strict JSON read back) and its federation's tables."""
    spec, _ = load_bench(_bench(tmp_path, seeds=[0]))
    planned = tuning_runs(spec)
    tuning = {r: _tuned(r, val[r.setting_label]) for r in planned}
    rows = tuning_rows(spec, tuning, select_settings(spec, tuning, planned))
    rows = json.loads(strict_json_text(rows))
    raw_edges = edge_keys(spec.method("fedprox"), next(r for r in planned if r.setting_label == "mu=0.1").setting)
    entry = _method_entry("mu=0.1", raw_edges)  # final_setting's edges: the tie not known
    fed = {"regions": ["disc"], "hd95_unit": "pixels", "runs": 2, "sites": ["site1"], "methods": {"fedprox": entry}}
    return spec, rows, fed


@pytest.mark.parametrize(
    "val, selected_cell, setting_cell, tied",
    [
        ({"mu=0.1": 0.8, "mu=1.0": 0.8, "mu=10.0": 0.7}, "✓ (tie with mu=1.0)", "mu=0.1 (tie)", True),
        ({"mu=0.1": 0.8, "mu=1.0": 0.8, "mu=10.0": 0.8}, "✓ (tie with mu=1.0, mu=10.0)", "mu=0.1 (tie)", True),
        (  # equal to 4 decimals, as the table prints them, but not a tie: the selection compared them
            {"mu=0.1": 0.80001, "mu=1.0": 0.8, "mu=10.0": 0.7},
            "✓ (grid edge): methods.fedprox.mu (low)",
            "mu=0.1 (grid edge)",
            False,
        ),
        (  # no score at all (every run failed): the first setting, which validation did not prefer either
            {"mu=0.1": math.nan, "mu=1.0": math.nan, "mu=10.0": math.nan},
            "✓ (tie with mu=1.0, mu=10.0)",
            "mu=0.1 (tie)",
            True,
        ),
    ],
)
def test_a_tie_on_validation_is_shown_as_a_tie_and_not_as_a_grid_edge(tmp_path, val, selected_cell, setting_cell, tied):
    """mu=0.1 (the grid's low edge) and mu=1.0 share the best validation score: the selection takes the first in
    grid order, mu=0.1, and the tables said ``(grid edge)`` as if the edge had been better; they say ``(tie)`` and
    name the tied settings, with the legend saying what a tie selects; tuning.csv's at_edge drops the edge too."""
    spec, rows, fed = _tied_bench(tmp_path, val)
    assert [r["selected"] for r in rows] == [True, False, False]  # a tie selects the first in grid order
    assert rows[0]["at_edge"] == ("" if tied else "methods.fedprox.mu (low)")
    assert [r[-1] for r in table_rows.tune_table(rows, "synthetic-retina")[1]] == [selected_cell, "", ""]
    assert table_rows.test_table(fed, "fedavg", rows)[1][0][1] == setting_cell
    tables = {"synthetic-retina": fed}
    legend_text = legend.notes(spec, tables, (), rows)
    assert (legend.TIE_NOTE in legend_text) == tied and "(grid edge): the selected value" in legend_text
    assert legend.notes(spec, tables) == legend_text.replace(legend.TIE_NOTE, "")  # no tuning rows: as before
    if tied:  # tables.json of a bench written before: at_edge as the selected setting alone had it
        old = [r | {"at_edge": "methods.fedprox.mu (low)"} if r["selected"] else r for r in rows]
        assert table_rows.tune_table(old, "synthetic-retina")[1][0][-1] == selected_cell
        assert table_rows.test_table(fed, "fedavg", old)[1][0][1] == setting_cell


def test_a_tie_keeps_the_grid_edge_of_a_key_every_tied_setting_shares():
    """lr=0.01 (the high edge of train.lr) with mu=0.1 and with mu=1.0 tie: the lr edge stands (both tied settings
    have it), the mu edge does not (mu=1.0 tied it from inside the grid)."""
    row = {"federation": "f", "method": "fedprox", "test_dice": 0.7, "runs": 1}
    rows = [
        row
        | {"setting": "lr=0.01,mu=0.1", "values": {"train.lr": 0.01, "methods.fedprox.mu": 0.1}, "val_dice": 0.8}
        | {"selected": True, "at_edge": "train.lr (high); methods.fedprox.mu (low)"},
        row
        | {"setting": "lr=0.01,mu=1.0", "values": {"train.lr": 0.01, "methods.fedprox.mu": 1.0}, "val_dice": 0.8}
        | {"selected": False, "at_edge": ""},
        row
        | {"setting": "lr=0.003,mu=0.1", "values": {"train.lr": 0.003, "methods.fedprox.mu": 0.1}}
        | {"val_dice": 0.7, "selected": False, "at_edge": ""},
    ]
    cell = table_rows.tune_table(rows, "f")[1][0][-1]
    assert cell == "✓ (tie with lr=0.01,mu=1.0) (grid edge): train.lr (high)"
    edges = ["train.lr (high)", "methods.fedprox.mu (low)"]
    assert method_edges(edges, rows) == (["train.lr (high)"], True)
    entry = _method_entry("lr=0.01,mu=0.1", edges)
    fed = {"regions": ["disc"], "hd95_unit": "pixels", "runs": 2, "sites": ["site1"], "methods": {"fedprox": entry}}
    assert table_rows.test_table(fed, "fedavg", rows)[1][0][1] == "lr=0.01,mu=0.1 (grid edge) (tie)"
    assert method_edges(edges, [r for r in rows if r["val_dice"] != 0.8 or r["selected"]]) == (edges, False)


def test_the_plateau_rule_does_not_stop_a_tuning_run_before_min_rounds(tmp_path):
    spec, root = load_bench(_bench(tmp_path, stop={"patience": 5, "min_delta": 0.002, "min_rounds": 40}))
    runs = tuning_runs(spec)
    assert runs and all(r.method == "fedprox" for r in runs)
    stalled = {r: 0.5 for r in range(1, 36)}  # a warm-up stall: no gain from round 1 to 35
    for run in runs:
        stop = run_config(spec, root, run).fl.stop
        assert (stop.patience, stop.min_rounds) == (5, 40)
        assert all(stop_reason(stop, stalled, rnd, None) is None for rnd in range(1, 36))
        assert stop_reason(stop, {**stalled, 40: 0.5}, 40, None) == PLATEAU


def test_fedseg_report_renders_a_bench_again_from_its_tables_json_by_the_current_rules(tmp_path):
    """A committed bench folder without its runs: the comparisons gain their Holm-adjusted p, the tables say so."""
    from typer.testing import CliRunner

    from fedseg.cli import app

    bench = tmp_path / "bench"
    shutil.copytree(Path(__file__).parents[1] / "benchmarks" / "results" / "headline-fedsm", bench)
    content = json.loads((bench / "tables.json").read_text())
    for fed in content["federations"].values():  # as a bench written before the correction
        for s in fed["methods"].values():
            for test in [s.get("wilcoxon"), s.get("nsd_wilcoxon"), *(s.get("site_wilcoxon") or {}).values()]:
                if test:
                    test.pop("p_holm", None), test.pop("family", None)
    (bench / "tables.json").write_text(json.dumps(content))
    result = CliRunner().invoke(app, ["report", str(bench)])
    assert result.exit_code == 0, result.output
    fed = next(iter(json.loads((bench / "tables.json").read_text())["federations"].values()))
    tests = [s["wilcoxon"] for s in fed["methods"].values() if s.get("wilcoxon")]
    assert tests and all(t["family"] == len(tests) and t["p_holm"] >= t["p"] for t in tests)
    assert all(s["dagger"] == significant(s.get("wilcoxon")) for s in fed["methods"].values())
    assert "p (Holm)" in (bench / "tables.md").read_text()
    (bench / "tables.json").write_text("{not json")
    result = CliRunner().invoke(app, ["report", str(bench)])
    assert result.exit_code == 1 and result.output.count("\n") == 1, result.output
    assert "tables.json: not a bench's tables" in result.output and "Traceback" not in result.output


def test_no_dagger_from_one_seed_and_the_test_table_shows_each_seeds_delta():
    """With one seed the hierarchical bootstrap has no run-to-run variance to draw: the comparison is of two
    trained models, so the bench tables mark nothing, however small p is; with 3 seeds the same numbers get †.
    The test table shows Δ per seed next to the CI (with fewer than 5 seeds the CI cannot show their spread)."""
    test = {"n": 30, "p": 1e-6, "p_holm": 1e-6, "ci_excludes_0": True, "ci_low": 0.01, "ci_high": 0.02}
    one = {**test, "mean_diff": 0.015, "seeds": 1, "per_seed_diff": {"0": 0.015}}
    three = {**test, "mean_diff": 0.015, "seeds": 3, "per_seed_diff": {"0": 0.02, "1": -0.004, "2": 0.029}}
    assert table_rows.mark(one) == "" and table_rows.p_text(one) == "1e-06"
    assert (
        table_rows.mark(three) == " †" and table_rows.p_text(three) == "1e-06 † (seeds disagree)"
    )  # s1 went the other way
    from fedseg.evaluate.stats import significant, significant_over_seeds

    assert significant(one) and not significant_over_seeds(one) and significant_over_seeds(three)  # tables.json
    fed = {
        "regions": ["disc"],
        "runs": 3,
        "sites": ["site1"],
        "methods": {
            name: {
                "setting": "default",
                "dice": {"mean": 0.9, "std": 0.1},
                "regions": {"disc": {"mean": 0.9, "std": 0.1}},
                "hd95": {"mean": 1.0, "std": 0.5},
                "client_avg": {"mean": 0.9, "std": 0.01},
                "convergence": {"runs": 3, "not_converged": 0},
                "wilcoxon": wilcoxon,
            }
            for name, wilcoxon in (("fedavg", None), ("fedprox", three))
        },
    }
    head, rows = table_rows.test_table(fed, "fedavg")
    assert head[head.index("95% CI") + 1] == "Δ per seed"
    cells = dict(zip(head, rows[1], strict=True))
    assert (
        cells["Δ per seed"] == "s0 +0.0200 / s1 -0.0040 / s2 +0.0290"
        and cells["p (Holm)"] == "1e-06 † (seeds disagree)"
    )
    assert cells["Δ vs fedavg"] == "+0.0150" and cells["95% CI"] == "[+0.0100, +0.0200]"
    assert dict(zip(head, rows[0], strict=True))["Δ per seed"] == ""  # the reference


def test_a_test_side_changed_after_runs_finished_but_before_any_tables_is_recorded(tmp_path, monkeypatch):
    """The side chosen before the first result stays in bench.json, so a change made on a resume before any tables
    exist is recorded (as one made after results), however often that resume is interrupted; one made while no run
    had finished is not (no result had been seen)."""
    from fedseg.bench import phases
    from fedseg.bench.execute import DONE_FILE

    def interrupted(self, runs, phase):
        raise KeyboardInterrupt

    monkeypatch.setattr(phases.Runner, "execute", interrupted)  # every sitting stops before its first run ends
    out, quiet = tmp_path / "out", lambda line: None
    sitting = {}
    for side in ("two-sided", "less", "greater", "greater"):
        sitting[side], root = load_bench(_bench(tmp_path, tests={"alternative": side}))
        with pytest.raises(KeyboardInterrupt):
            phases.run_bench(sitting[side], root, out, resume=out.exists(), echo=quiet)
        if side == "less":  # a run finished in the sitting that chose less
            marker = out / "runs" / "synthetic-retina" / "fold0" / "seed0" / "fedavg" / "default" / DONE_FILE
            marker.parent.mkdir(parents=True)
            marker.write_text("{}")
    assert json.loads((out / BENCH_FILE).read_text())["tests"] == {"alternative": "less"}
    (line,) = report.record_analysis_changes(sitting["greater"], 1, out)
    assert line.endswith(' tests: {"alternative": "less"} -> {"alternative": "greater"} (after 1 finished runs)'), line
    (out / report.TABLES_JSON).write_text(json.dumps({"bench": sitting["greater"].model_dump(mode="json")}))
    assert report.record_analysis_changes(sitting["greater"], 1, out) == [line]  # tables with it: nothing new


def test_runs_whose_selector_routed_every_test_image_to_the_global_model_are_named_under_the_test_table(tmp_path):
    """FedSM's selector_features/<algorithm>.npz (``chosen`` 0 = the global model): a run where every test image
    went to the global model is named (its scores are the global model's), one that used a personalized model is
    not; the bench's Markdown says so under the test table."""
    from fedseg.bench.execute import Finished
    from fedseg.bench.plan import BenchRun
    from fedseg.bench.tables import routed_runs

    pairs = []
    for seed, chosen in enumerate(([0, 0, 0], [0, 2, 0], [0, 0, 0])):
        folder = tmp_path / f"s{seed}" / "selector_features"
        folder.mkdir(parents=True)
        np.savez_compressed(folder / "fedsm.npz", chosen=np.array(chosen, np.int64), gamma=np.float64(0.5))
        run = BenchRun("fed", 0, seed, "fedsm", (), ())
        pairs.append((run, Finished(run, tmp_path / f"s{seed}", {}, 0.0)))
    assert routed_runs(pairs, "fedsm") == ["s0", "s2"] and routed_runs(pairs, "fedsm-extra") == []
    mixes = tmp_path / "s0" / "selector_features" / "fedsm-ensemble.npz"  # its chosen is the heaviest candidate
    np.savez_compressed(mixes, chosen=np.zeros(3, np.int64), gamma=np.float64("nan"), mode=np.array("ensemble"))
    assert routed_runs(pairs, "fedsm-ensemble") == []
    held_out = BenchRun("fed", 1, 0, "fedsm", (), (), holdout="site2")  # scored on its unseen site: not its routing
    assert routed_runs([(held_out, pairs[0][1])], "fedsm") == []
    fed = {"methods": {"fedavg": {"convergence": {"runs": 3}}, "fedsm": {"convergence": {"runs": 3}}}}
    assert table_rows.routing_note(fed) == ""
    fed["methods"]["fedsm"]["routed_to_global"] = ["s0", "s2"]
    assert table_rows.routing_note(fed).startswith(
        "**Routed every test image to its global model** (FedSM's selector): fedsm in s0, s2 of 3 runs."
    )


def test_methods_stopped_by_the_plateau_rule_are_named_under_the_test_table():
    """A Δ against a method stopped after fewer rounds compares budgets too: the note names how many runs per
    method the plateau rule stopped; none stopped, no note."""
    fed = {
        "methods": {
            "fedavg": {"convergence": {"runs": 3, "stopped": {"plateau": 2}}},
            "fedsm": {"convergence": {"runs": 3, "stopped": {"sgd_steps": 3}}},
        }
    }
    assert table_rows.plateau_note(fed).startswith("**Stopped by the plateau rule** (fl.stop): fedavg (2/3). A Δ")
    fed["methods"]["fedavg"]["convergence"]["stopped"] = {}
    assert table_rows.plateau_note(fed) == ""


def test_the_test_tables_notes_reach_the_markdown_and_the_html(tmp_path):
    """A committed bench re-rendered with one method's runs routed to its global model: tables.md and report.html
    both carry the routing note (and the plateau note its runs earned)."""
    folder = tmp_path / "bench"
    shutil.copytree(RESULTS / "headline-fedsm", folder)
    content = json.loads((folder / "tables.json").read_text())
    fed = next(iter(content["federations"].values()))
    method = next(iter(fed["methods"]))
    fed["methods"][method]["routed_to_global"] = ["s1"]
    (folder / "tables.json").write_text(json.dumps(content))
    report.rewrite_report(folder)
    for page in ("tables.md", "report.html"):
        text = (folder / page).read_text()
        assert f"{method} in s1 of " in text and "Routed every test image to its global model" in text, page
        assert "Stopped by the plateau rule" in text, page


def test_local_avg_and_gen_average_the_folds_of_a_seed_before_the_spread_over_seeds():
    """A k-fold bench's local avg / local gen: per seed the mean over its folds, ± std over seeds (as the per-site
    columns beside them), not ± over folds × seeds (a statistician's review: the caption said seeds)."""
    from fedseg.bench.plan import BenchRun
    from fedseg.bench.tables import seed_mean_std

    values = {(0, 0): 0.6, (1, 0): 0.8, (0, 1): 0.7, (1, 1): 0.9}  # (fold, seed) -> the run's local avg
    runs = [Finished(BenchRun("fed", fold, seed, "fedavg", (), ()), Path(), {}, 0.0) for fold, seed in values]
    stats = seed_mean_std(runs, list(values.values()))
    assert stats["n"] == 2 and stats["mean"] == pytest.approx(0.75)
    assert stats["std"] == pytest.approx(np.std([0.7, 0.8], ddof=1))  # seeds' fold means 0.7 and 0.8
    assert seed_mean_std(runs[:2], [0.6, math.nan])["n"] == 1  # a run without local models counts for nothing
