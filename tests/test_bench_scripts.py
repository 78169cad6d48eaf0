"""The benchmark scripts compose runs through ``fedseg bench``: their bench files (benchmarks/specs) plan valid runs
at the benchmark budget, and ``benchmarks/common.bench_entries`` gives the entries the scripts' tables read."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import yaml

from fedseg.bench.plan import check_plan, final_runs, holdout_sites, load_bench, run_config
from fedseg.config_load import load_config
from fedseg.evaluate.tables import read_rows

ROOT = Path(__file__).resolve().parents[1]
SPECS = sorted((ROOT / "benchmarks" / "specs").glob("*.yaml"))


@pytest.fixture
def common(monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    import common

    return common


@pytest.mark.parametrize("path", SPECS, ids=lambda p: p.name)
def test_script_bench_files_plan_the_benchmark_budget(path, common):
    """Every run of a script's bench file is the run the script trained before (benchmarks/common.py's budget
    on the federation's own preset, with the script's options): the same configuration but for the preset's name."""
    import personalized
    import planning
    import privacy

    def former(run) -> tuple[str, list[str]]:
        """The preset and overrides the script trained this run with before its bench file."""
        if path.stem == "planning":
            return "fets-cpu", common.run_overrides("fets-cpu", run.seed, "fedavg", planning.ARMS[run.method])
        if path.stem.startswith("fedsm_table"):  # fedseg study --sweep KEY=VALUE on the budget
            return run.federation, [
                *common.run_overrides(run.federation, run.seed, "fedsm", []),
                *spec.method(run.method).set,
            ]
        if path.stem == "volumes":
            return "fets-cpu", common.run_overrides("fets-cpu", run.seed, run.method, [])
        if path.stem == "privacy":
            return "demo", [*privacy.plan(10, [0.01, 0.1, 0.5, 1.0, 2.0], None)[run.method], f"seed={run.seed}"]
        extra = personalized.extra(run.federation) if path.stem == "personalized" else []
        if path.stem == "methods" and run.method == "fedavg-steps":  # its committed tables' U, pinned in the file
            extra = ["methods.fedavg-steps.local_steps=20"]
        return run.federation, common.run_overrides(run.federation, run.seed, run.method, extra)

    spec, root = load_bench(path)
    check_plan(spec, root)
    holdouts = holdout_sites(spec, root)
    runs = final_runs(spec, {}, holdouts)
    cells = sum(len(holdouts[f.name]) if f.leave_one_out else 1 for f in spec.federations)
    assert len(runs) == cells * len(spec.methods) * len(spec.seeds)
    for run in runs[:: max(1, len(runs) // 8)]:
        if run.holdout is not None:  # fedseg study --leave-one-out: the federation without the site, not comparable
            continue
        ours = run_config(spec, root, run).model_dump()
        preset, overrides = former(run)
        # the former runs scored each channel: they were recorded before eval.score_on, whose default is label_map
        before = load_config(preset=preset, overrides=[*overrides, "eval.score_on=channels"]).model_dump()
        ours.pop("name"), before.pop("name")
        assert ours == before, run.label


def test_personalized_bench_differs_from_its_former_runs_only_by_the_continuation_control(common):
    """Issue 27: the personalized chain gained ``fedavg-continue`` (the control of the methods that start from
    FedAvg's model, for prior-cfl's 10 rounds) and per-site fine-tuning learning rates (``lr_grid``, FeTS); every
    other run and option is the one the committed tables came from."""
    import personalized

    spec, _ = load_bench(ROOT / "benchmarks" / "specs" / "personalized.yaml")
    former_methods = ["fedavg+finetune+ditto-ft+prior-cfl", "local", "ditto", "fedper", "lg-fedavg", "cfl"]
    assert spec.method_names == [f"{former_methods[0]}+fedavg-continue", *former_methods[1:]]
    assert spec.methods[0].algorithms == ("fedavg", "finetune", "ditto-ft", "prior-cfl", "fedavg-continue")
    added = ["methods.fedavg-continue.rounds=10", *personalized.LR_GRIDS]  # the control; per-site fine-tuning lr
    assert [x for x in spec.set if x not in added] == [
        "eval.score_on=channels",  # as the committed tables were scored (before the option)
        "data.image_size=64",
        "train.batch_size=4",
        "threads=1",
        "methods.finetune.epochs=10",
        "methods.ditto-ft.epochs=10",
        "methods.prior-cfl.rounds=10",
        "methods.cfl.split_round=20",
    ]
    assert all(x in spec.set and x in personalized.extra("synthetic-retina") for x in added)
    assert personalized.CONTROLLED == ["finetune", "ditto-ft", "prior-cfl"]


def test_bench_entries_feed_the_scripts_tables(tmp_path, common, monkeypatch):
    import heterogeneity
    import methods

    spec = {
        "name": "tiny",
        "base": {"preset": "synthetic-retina"},
        "set": ["data.scale=0.05", "data.image_size=32", "model.channels=[4,8,16]", "train.batch_size=4", "threads=1"],
        "federations": ["synthetic-retina"],
        "methods": ["local", "centralized", "fedavg"],
        "seeds": [0],
        "budget": {"rule": "rounds", "rounds": 1},
        "reference": "local",
    }
    path = tmp_path / "tiny.yaml"
    path.write_text(yaml.safe_dump(spec))
    bench, done = common.bench_entries(path, jobs=1, out=tmp_path / "runs")
    assert set(done) == {("synthetic-retina", 0, m) for m in ("local", "centralized", "fedavg")}
    fedavg = done[("synthetic-retina", 0, "fedavg")]  # kept its sites' local models too: their rows are not its own
    assert any(":" in r["model"] for r in read_rows(Path(fedavg["dir"]) / "results.csv"))
    assert fedavg["stats"]["case_dice"]["mean"] == pytest.approx(fedavg["summary"]["dice"]["global"])
    cases = common.case_dice(fedavg, "fedavg")
    assert len(cases) == fedavg["stats"]["case_dice"]["n"]
    assert all(r["n"] == len(cases) for r in fedavg["stats"]["region_dice"].values())
    local, central = done[("synthetic-retina", 0, "local")], done[("synthetic-retina", 0, "centralized")]
    assert local["sites"] and local["regions"] and local["summary"]["rounds"] == 1
    assert local["stats"]["case_dice"]["n"] > 0 and 0 <= local["stats"]["case_dice"]["mean"] <= 1
    assert len(local["val_dice_per_round"]) == 1 and math.isfinite(local["wall_seconds"])
    row = heterogeneity.seed_entry(local, central)
    assert len(row["matrix"]) == len(local["sites"]) and row["gap"] == pytest.approx(
        row["diagonal_mean"] - row["off_diagonal_mean"]
    )
    table = methods.algorithm_table([central])
    assert table["client_avg_dice"]["n"] == 1
    cases = common.case_dice(central, "centralized")  # the per-case Dice the paired tests read from the run
    assert cases and all(0 <= v <= 1 for v in cases.values())
    fedsm_studies = __import__("fedsm_studies")
    monkeypatch.setitem(fedsm_studies.STUDIES, "tiny", ("synthetic-retina", "sweep", "train.lr", "tiny.yaml"))
    (seed0,) = fedsm_studies.study_entries("tiny", bench, done)
    assert [r["value"] for r in seed0["rows"]] == ["local", "centralized", "fedavg"]
    assert "dice_client_avg" in seed0["columns"]
    assert fedsm_studies.average([seed0], "value")[0]["dice_client_avg"] == pytest.approx(
        local["summary"]["dice"]["client_avg"]
    )
    manifest = Path(central["dir"]) / "model" / "centralized" / "manifest.json"  # as planning/privacy read it
    assert common.parameters(manifest) > 0
    again, _ = common.bench_entries(path, jobs=1, out=tmp_path / "runs")  # resumed: nothing trains again
    assert again.name == "tiny"


def test_fedsm_studies_reads_the_unseen_tables_of_a_leave_one_out_bench(tmp_path, common, monkeypatch):
    import fedsm_studies

    spec = {
        "name": "tiny-unseen",
        "base": {"preset": "synthetic-retina"},
        "set": ["data.scale=0.05", "data.image_size=32", "model.channels=[4,8,16]", "train.batch_size=4", "threads=1"],
        "federations": [{"name": "synthetic-retina", "leave_one_out": True}],
        "methods": ["fedavg"],
        "seeds": [0],
        "budget": {"rule": "rounds", "rounds": 1},
    }
    path = tmp_path / "unseen.yaml"
    path.write_text(yaml.safe_dump(spec))
    bench, done = common.bench_entries(path, jobs=1, out=tmp_path / "runs")
    monkeypatch.setitem(fedsm_studies.STUDIES, "tiny", ("synthetic-retina", "holdout", None, "unseen.yaml"))
    (seed0,) = fedsm_studies.study_entries("tiny", bench, done)
    assert len(seed0["rows"]) == 6  # every site of synthetic-retina unseen once, each fold its own entry
    assert {fed for fed, _, _ in done} == {f"synthetic-retina/holdout-{r['unseen_site']}" for r in seed0["rows"]}
    rows = fedsm_studies.average([seed0], "unseen_site")
    assert len(rows) == len(seed0["rows"]) and all(0 <= r["dice"] <= 1 for r in rows)


def test_personalized_md_is_the_rendering_of_its_json_with_each_seeds_difference(common):
    """The committed personalized.md is what ``benchmarks/personalized.py`` renders from personalized.json (the
    script writes both; a rule changed since is re-rendered), and each comparison shows its per-seed Δ with "(seeds
    disagree)" after a p whose seeds do not all share Δ's sign (retina's ditto: s2 -0.0121 against Δ +0.0187)."""
    import personalized

    report = json.loads((common.RESULTS / "personalized.json").read_text())
    md = personalized.markdown(report)
    assert md == (common.RESULTS / "personalized.md").read_text()
    ditto = next(line for line in md.splitlines() if line.startswith("| ditto |"))
    assert "s0 +0.0113 / s1 +0.0571 / s2 -0.0121" in ditto and ditto.endswith("3.5e-06 (seeds disagree) |")
    finetune = next(line for line in md.splitlines() if line.startswith("| finetune |"))
    assert "seeds disagree" not in finetune
