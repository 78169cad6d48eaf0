"""fedseg bench: the plan, resuming after a kill, paired tests read back from results.csv, validation-only
selection, equal SGD-step budgets (real runs on a tiny built-in federation)."""

from __future__ import annotations

import csv
import itertools
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path

import numpy as np
import pytest
import yaml
from scipy.stats import PermutationMethod, wilcoxon

from fedseg.bench.phases import with_caps
from fedseg.bench.plan import check_data, final_runs, load_bench, reference_runs, settings, tuning_runs
from fedseg.config_load import ConfigError

TINY_SET = [
    "data.scale=0.05",
    "data.image_size=32",
    "model.channels=[4,8,16]",
    "train.batch_size=4",
    "threads=1",
    "eval.local_models=false",
]


def _bench(tmp_path: Path, **fields) -> Path:
    spec = {
        "name": "tiny",
        "base": {"preset": "synthetic-retina"},
        "set": TINY_SET,
        "federations": ["synthetic-retina"],
        "methods": ["fedavg", {"name": "fedprox", "grid": {"methods.fedprox.mu": [0.1, 1.0]}}],
        "seeds": [0, 1],
        "split": {"mode": "kfold", "folds": 2},
        "budget": {"rule": "sgd_steps", "rounds": 2},
        **fields,
    }
    path = tmp_path / "bench.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def test_a_method_that_does_not_fit_the_network_is_refused_before_any_run_trains(tmp_path):
    """FedBN without normalization weights (the default instance norm) was refused by its own run, after the other
    methods' runs had trained (and the fix, a method's own ``set:``, could not resume the bench): now before any
    run, naming the federation and the entry; with its ``set: [model.norm=batch]`` the plan passes."""
    from fedseg.bench.phases import run_bench

    spec, root = load_bench(_bench(tmp_path, methods=["fedavg", "fedbn"]))
    with pytest.raises(ConfigError) as e:
        run_bench(spec, root, tmp_path / "out", echo=lambda line: None)
    text = str(e.value)
    assert text.startswith("bench federation 'synthetic-retina': methods[1] (fedbn): methods.fedbn: the unet")
    assert "set model.norm=batch" in text and "\n" not in text
    assert not (tmp_path / "out").exists()
    fixed = _bench(tmp_path, methods=["fedavg", {"name": "fedbn", "set": ["model.norm=batch"]}])
    check_data(*load_bench(fixed), {})
    inheriting = [  # fedbn's run applies fedavg's selected norm after its own set: instance is possible
        {"name": "fedavg", "grid": {"model.norm": ["instance", "batch"]}},
        {"name": "fedbn", "settings_from": "fedavg", "set": ["model.norm=batch"]},
    ]
    with pytest.raises(
        ConfigError, match=r"^bench federation 'synthetic-retina': methods\[1\] \(fedbn\) norm=instance"
    ):
        check_data(*load_bench(_bench(tmp_path, methods=inheriting)), {})


def test_plan_expands_cells_grids_and_budget_references(tmp_path):
    spec, _ = load_bench(_bench(tmp_path))
    assert [(r.fold, r.seed) for r in reference_runs(spec)] == [(0, 0), (0, 1), (1, 0), (1, 1)]
    tuning = tuning_runs(spec)
    assert [r.label for r in tuning] == [
        "synthetic-retina/fold0/seed0/fedprox/mu=0.1",
        "synthetic-retina/fold0/seed0/fedprox/mu=1.0",
    ]
    finals = final_runs(spec, {("synthetic-retina", "fedprox"): settings(spec.method("fedprox"))[1]})
    assert len(finals) == 8 and {r.setting_label for r in finals if r.method == "fedprox"} == {"mu=1.0"}
    assert "fl.rounds=6" in finals[-1].overrides and "fl.rounds=2" in finals[0].overrides  # max_factor 3; reference
    assert "data.split.fold=1" in finals[-1].overrides and "seed=1" in finals[-1].overrides


def test_tuning_seeds_outside_the_final_seeds_keep_every_final_run_out_of_the_selection(tmp_path):
    """A tuning seed among the seeds made its selected run that seed's final run, the best of the grid on validation
    (a statistics audit: the tuned seed's Δ was the largest). Seeds outside: tuning runs of their own, each cell
    with its budget reference."""
    spec, _ = load_bench(_bench(tmp_path, tune={"seeds": [9]}))
    assert [(r.fold, r.seed) for r in reference_runs(spec)] == [(0, 0), (0, 1), (1, 0), (1, 1), (0, 9)]
    assert {r.seed for r in tuning_runs(spec)} == {9}
    finals = final_runs(spec, {("synthetic-retina", "fedprox"): settings(spec.method("fedprox"))[0]})
    assert {r.seed for r in finals} == {0, 1} and not {r.label for r in finals} & {r.label for r in tuning_runs(spec)}
    with pytest.raises(ConfigError, match=r"tune.seeds: give distinct seeds, got \[9, 9\]"):
        load_bench(_bench(tmp_path, tune={"seeds": [9, 9]}))


def test_the_budget_caps_every_run_but_the_reference_and_a_phased_method(tmp_path):
    """FedSM-extra's model phase cannot be stopped: a cap would end it at its first selector round (the selector
    trained once), so it trains budget.rounds model rounds and its selector rounds on top, uncapped."""
    methods = ["fedavg", "fedprox", "fedsm-extra"]
    spec, _ = load_bench(_bench(tmp_path, methods=methods, seeds=[0], split={"mode": "ratio"}))
    caps = {run.cell: ("fl.stop.sgd_steps=99",) for run in reference_runs(spec)}
    capped = {r.method: r.caps for r in with_caps(spec, final_runs(spec, {}), caps)}
    assert capped == {"fedavg": (), "fedprox": ("fl.stop.sgd_steps=99",), "fedsm-extra": ()}


def test_a_settings_from_method_is_tuned_after_its_source_at_the_setting_selected_for_it(tmp_path):
    methods = [
        {"name": "fedavg", "grid": {"train.lr": [0.001, 0.003]}},
        {"name": "fedprox", "settings_from": "fedavg", "grid": {"methods.fedprox.mu": [0.1, 1.0]}},
        {"name": "fedsm", "settings_from": "fedavg"},
    ]
    spec, _ = load_bench(_bench(tmp_path, methods=methods, budget={"rounds": 2}))
    assert {r.method for r in tuning_runs(spec)} == {"fedavg"}  # stage 1 only
    assert tuning_runs(spec, selected={}) == [] and {r.method for r in final_runs(spec, {})} == set()
    lr = settings(spec.method("fedavg"))[1]
    second = tuning_runs(spec, selected={("synthetic-retina", "fedavg"): lr})
    assert [r.label for r in second] == [
        "synthetic-retina/fold0/seed0/fedprox/lr=0.003,mu=0.1",
        "synthetic-retina/fold0/seed0/fedprox/lr=0.003,mu=1.0",
    ]
    assert second[0].overrides.index("train.lr=0.003") < second[0].overrides.index("methods.fedprox.mu=0.1")
    mu = settings(spec.method("fedprox"))[0]
    finals = final_runs(spec, {("synthetic-retina", "fedavg"): lr, ("synthetic-retina", "fedprox"): mu})
    labels = {(r.method, r.setting_label) for r in finals}
    assert labels == {("fedavg", "lr=0.003"), ("fedprox", "lr=0.003,mu=0.1"), ("fedsm", "lr=0.003")}
    assert len(finals) == 3 * 2 * 2  # 3 methods x 2 folds x 2 seeds


@pytest.mark.parametrize(
    "change, message",
    [
        ({"reference": "scaffold"}, "reference"),
        ({"tune": {"folds": [7]}}, "tune.folds"),
        ({"methods": ["fedavg", "fedavg"]}, r"methods\[1\]: the name 'fedavg' is taken by methods\[0\]"),
        ({"methods": ["fedavg", {"name": "a/b"}]}, "cannot name a folder"),
        ({"methods": ["fedavg", {"name": "fedprox", "settings_from": "fedavg"}]}, "settings_from"),  # no grid
        ({"methods": [{"name": "fedprox", "settings_from": "fedavg"}, "fedavg"]}, "listed before"),
        ({"comparisons": [["fedavg", "scaffold"]]}, "comparisons"),
        ({"seeds": 3}, r"seeds: give a list: \[3\] for seed 3 alone, \[0, 1, 2\] for three seeds"),
        ({"seeds": "0-2"}, "seeds: give a list of integers such as"),
        ({"seeds": "3"}, r"seeds: give a list: \[3\] for seed 3 alone"),
        ({"tune": {"seeds": 1}}, r"tune.seeds: give a list: \[1\] for seed 1 alone"),
        ({"methods": ["fedavg", {"name": "fedprox", "sett": []}]}, r"methods\[1\] \(fedprox\)\.sett: unknown key"),
    ],
)
def test_a_bad_bench_file_names_the_key(tmp_path, change, message):
    with pytest.raises(ConfigError, match=message):
        load_bench(_bench(tmp_path, **change))


def test_seeds_written_as_a_comma_separated_string_are_a_list(tmp_path):
    spec = load_bench(_bench(tmp_path, seeds="0,1,2", tune={"seeds": "0,1"}))[0]
    assert spec.seeds == (0, 1, 2) and spec.tune.seeds == (0, 1)


@pytest.mark.parametrize(
    "methods, said",
    [
        (["fedavg", {"name": "fedprox", "grid": {"methods.fedprox.nu": [1]}}], "methods.fedprox.nu: unknown key"),
        (["fedavg", "scafold"], "bench.yaml: methods[1]: unknown algorithm 'scafold'; did you mean 'scaffold'?\n"),
    ],
)
def test_an_unknown_option_in_a_grid_fails_before_any_run(tmp_path, methods, said):
    path = _bench(tmp_path, methods=methods)
    proc = subprocess.run(
        [sys.executable, "-m", "fedseg.cli", "bench", str(path), "--out", str(tmp_path / "out")],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 1 and said in proc.stderr and proc.stdout == "", proc.stdout + proc.stderr
    assert "Traceback" not in proc.stdout + proc.stderr and not (tmp_path / "out" / "runs").exists()


def _p(diffs, test: dict) -> float:
    """scipy's p of ``diffs`` with the test's recorded alternative and method (docs/benchmark-protocol.md)."""
    method = test["p_method"]
    how = PermutationMethod() if method == "permutation" else method  # scipy >= 1.13: every sign assignment, n <= 13
    return wilcoxon(diffs, alternative=test["alternative"], method=how, correction=method == "asymptotic").pvalue


def _done_markers(out: Path) -> dict[str, int]:
    return {str(p.parent.relative_to(out)): p.stat().st_mtime_ns for p in out.glob("runs/**/bench-run.json")}


def _case_dice(rows: list[dict], method: str) -> dict[tuple[str, str], float]:
    """Per (site, case): the mean over regions per seed, then over seeds (fedseg.evaluate.stats's pairing)."""
    per: dict[tuple[str, str, str], list[float]] = defaultdict(list)
    for r in rows:
        if r["method"] == method and r["metric"] == "dice":
            per[(r["seed"], r["site"], r["case"])].append(float(r["value"]))
    seeds: dict[tuple[str, str], list[float]] = defaultdict(list)
    for (_, site, case), values in per.items():
        seeds[(site, case)].append(float(np.nanmean(values)))
    return {k: float(np.mean(v)) for k, v in seeds.items()}


@pytest.mark.slow
def test_bench_resumes_after_a_kill_and_its_tests_equal_scipys(tmp_path):
    path, out = _bench(tmp_path), tmp_path / "out"
    command = [sys.executable, "-m", "fedseg.cli", "bench", str(path), "--out", str(out)]
    proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    deadline = time.monotonic() + 300
    while len(_done_markers(out)) < 3 and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.2)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    before = _done_markers(out)
    # 9 runs in all: 4 budget references (= fedavg's final runs), 2 tuning runs, 3 more fedprox final runs (its
    # selected setting's fold0/seed0 run is the tuning run)
    assert 3 <= len(before) < 9, before  # killed part-way
    partial = subprocess.run([*command, "--tables-only"], capture_output=True, text=True, timeout=300)
    assert partial.returncode == 0 and _done_markers(out) == before, partial.stdout + partial.stderr  # trains nothing
    done_refs = len([r for r in before if "/fedavg/" in r])
    tables = json.loads((out / "tables.json").read_text())["federations"]
    if done_refs:  # the finished FedAvg runs are in the partial tables, with how many of the 4 there are
        assert tables["synthetic-retina"]["methods"]["fedavg"]["convergence"]["runs"] == done_refs
    resumed = subprocess.run([*command, "--resume"], capture_output=True, text=True, timeout=600)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    after = _done_markers(out)
    assert len(after) == 9
    assert all(after[run] == mtime for run, mtime in before.items())  # finished runs were not trained again

    with open(out / "results.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    tables = json.loads((out / "tables.json").read_text())
    fedprox = tables["federations"]["synthetic-retina"]["methods"]["fedprox"]
    a, b = _case_dice(rows, "fedprox"), _case_dice(rows, "fedavg")
    keys = sorted(set(a) & set(b))
    assert len(keys) == fedprox["wilcoxon"]["n"] == fedprox["cases"]  # every case once, over both folds
    assert fedprox["wilcoxon"]["p"] == pytest.approx(_p([a[k] - b[k] for k in keys], fedprox["wilcoxon"]), rel=1e-12)
    kept = fedprox["wilcoxon"]["case_diffs"]  # tables.json alone recomputes it: results.csv is not committed
    assert kept == pytest.approx({f"{s}/{c}": a[(s, c)] - b[(s, c)] for s, c in keys}, rel=1e-9, abs=1e-12)
    assert _p(list(kept.values()), fedprox["wilcoxon"]) == pytest.approx(fedprox["wilcoxon"]["p"], rel=1e-12)
    for site, test in fedprox["site_wilcoxon"].items():
        diffs = [a[k] - b[k] for k in keys if k[0] == site]
        expected = 1.0 if not any(diffs) else _p(diffs, test)
        assert test["p"] == pytest.approx(expected, rel=1e-12), site

    # equal budgets: every fedprox run stopped on the SGD steps of 2 FedAvg rounds of its cell
    for run in (out / "runs" / "synthetic-retina").glob("fold*/seed*"):
        ref = json.loads((run / "fedavg" / "default" / "summary.json").read_text())["algorithms"]["fedavg"]
        for summary in run.glob("fedprox/*/summary.json"):
            entry = json.loads(summary.read_text())["algorithms"]["fedprox"]
            per_round = ref["sgd_steps"] / 2
            assert ref["sgd_steps"] <= entry["sgd_steps"] < ref["sgd_steps"] + per_round, summary
            assert entry["convergence"]["stopped"] == "sgd_steps"
    assert "Tuning on validation" in (out / "tables.md").read_text() and (out / "report.html").is_file()
    assert tables["federations"]["synthetic-retina"]["score_on"] == "label_map"  # eval.score_on's default
    assert "Scored on the label map" in (out / "tables.md").read_text()  # what was scored, next to the scores
    assert "**" not in (out / "report.html").read_text()  # tables.md's bold notes are <b> in the page
    _tables_show_rounds_and_steps_next_to_dice(out)

    # further comparisons change only the tables: the finished bench takes them without training anything
    _bench(tmp_path, comparisons=[["fedavg", "fedprox"]])
    again = subprocess.run([*command, "--tables-only"], capture_output=True, text=True, timeout=300)
    assert again.returncode == 0 and _done_markers(out) == after, again.stdout + again.stderr
    (pair,) = json.loads((out / "tables.json").read_text())["federations"]["synthetic-retina"]["comparisons"]
    diffs = [b[k] - a[k] for k in keys]
    assert (pair["method"], pair["against"], pair["n"], pair["seeds"]) == ("fedavg", "fedprox", len(keys), 2)
    assert pair["p"] == pytest.approx(_p(diffs, pair), rel=1e-12)
    assert pair["mean_diff"] == pytest.approx(float(np.mean(diffs)), rel=1e-9)
    assert "### Paired comparisons" in (out / "tables.md").read_text()
    # ... but a reader is told: a comparison or a test's side chosen after the results is a choice made on them
    (change,) = (out / "analysis-changes.txt").read_text().splitlines()
    assert re.search(r' comparisons: \[\] -> \[\["fedavg", "fedprox"\]\] \(after \d+ finished runs\)$', change), change
    assert "note: changed after results existed" in again.stdout and change in again.stdout
    assert f"**Changed after results existed** ({change})" in (out / "tables.md").read_text()
    assert json.loads((out / "tables.json").read_text())["analysis_changes"] == [change]
    subprocess.run([*command, "--tables-only"], capture_output=True, text=True, timeout=300, check=True)
    assert (out / "analysis-changes.txt").read_text().splitlines() == [change]  # the same change is kept once
    _bench(tmp_path)  # and back: compared with the tables last written, not with the bench first recorded
    subprocess.run([*command, "--tables-only"], capture_output=True, text=True, timeout=300, check=True)
    back = (out / "analysis-changes.txt").read_text().splitlines()[1:]
    assert len(back) == 1 and ' comparisons: [["fedavg", "fedprox"]] -> [] (after ' in back[0], back


def _md_rows(text: str, heading: str) -> list[dict[str, str]]:
    """The rows of the first Markdown table after ``heading`` in ``text``, as {column: cell}."""
    lines = text[text.index(heading) :].splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("|"))
    table = [line for line in itertools.takewhile(lambda line: line.startswith("|"), lines[start:])]
    head = [c.strip() for c in table[0].strip("|").split("|")]
    return [dict(zip(head, (c.strip() for c in line.strip("|").split("|")))) for line in table[2:]]


def _tables_show_rounds_and_steps_next_to_dice(out: Path) -> None:
    """Every table of tables.md with a Dice column shows the rounds trained and the SGD steps next to it: the means
    over the runs behind that row (final runs: every cell; tuning rows: the setting's tuning runs)."""
    text = (out / "tables.md").read_text()
    runs = out / "runs" / "synthetic-retina"
    chosen = {r["method"]: r["setting"].removesuffix(" (grid edge)") for r in _md_rows(text, "### Test")}
    assert set(chosen) == {"fedavg", "fedprox"}
    for heading in ("### Test", "### Per site", "### Cost"):
        for row in _md_rows(text, heading):
            method = row["method"]
            summaries = runs.glob(f"fold*/seed*/{method}/{chosen[method]}/summary.json")
            entries = [json.loads(p.read_text())["algorithms"][method] for p in summaries]
            assert len(entries) == 4, (method, chosen[method])
            steps = float(np.mean([e["cost"]["sgd_steps"] for e in entries]))
            rounds = float(np.mean([e["convergence"]["rounds"] for e in entries]))
            assert row["SGD steps"] == f"{round(steps):,}", (heading, row)
            assert row["rounds"].split(" ± ")[0] == f"{rounds:.1f}", (heading, row)
    tuning = _md_rows(text, "### Tuning on validation")
    assert len(tuning) == 2
    for row in tuning:
        (summary,) = runs.glob(f"fold0/seed0/fedprox/{row['setting']}/summary.json")
        entry = json.loads(summary.read_text())["algorithms"]["fedprox"]
        assert row["SGD steps"] == f"{round(entry['cost']['sgd_steps']):,}", row
        assert row["rounds"] == f"{entry['convergence']['rounds']:.1f}", row


def _write_flipped_folder(root: Path, federation) -> None:
    """``federation`` as a folder federation (one region, the disc) whose *test* labels are the complement of the
    disc: the better a model finds discs (validation), the worse it scores on test."""
    from PIL import Image

    root.mkdir(parents=True)
    (root / "federation.yaml").write_text(
        yaml.safe_dump({"name": "flipped", "kind": "2d", "channels": 3, "regions": {"disc": [1]}})
    )
    for site in federation.sites:
        (root / site.name / "images").mkdir(parents=True)
        (root / site.name / "labels").mkdir()
        lines = ["case,split"]
        for i, case in enumerate(site.cases):
            image, label = case.arrays()
            split = ("train", "train", "val", "test")[i % 4]
            disc = (label > 0).astype(np.uint8)
            Image.fromarray(np.moveaxis(image, 0, -1)).save(root / site.name / "images" / f"{case.id}.png")
            Image.fromarray(1 - disc if split == "test" else disc).save(root / site.name / "labels" / f"{case.id}.png")
            lines.append(f"{case.id},{split}")
        (root / site.name / "splits.csv").write_text("\n".join(lines) + "\n")


def test_a_case_fixed_to_test_in_every_fold_is_refused_before_anything_is_written(tmp_path, disc_federation):
    """A site's splits.csv fixing test cases (an nnU-Net import's imagesTs) under k-fold would test them in every
    fold, and the tables (keyed by case) would average them into one case: refused, naming site, case and fold."""
    from fedseg.bench.phases import run_bench

    _write_flipped_folder(tmp_path / "fixed", disc_federation(n_sites=2, cases_per_site=8))
    federations = [{"name": "fixed", "set": ["data.source=folder", f"data.root={tmp_path / 'fixed'}"]}]
    spec, root = load_bench(_bench(tmp_path, federations=federations, split={"mode": "kfold", "folds": 2}))
    with pytest.raises(ConfigError, match=r"fold 1: site 'site\d' tests 2 case\(s\) also tested in fold 0 \(e\.g\. '"):
        run_bench(spec, root, tmp_path / "out", echo=lambda line: None)
    assert not (tmp_path / "out").exists()
    one_fold = load_bench(_bench(tmp_path, federations=federations, split={"mode": "ratio"}))
    check_data(one_fold[0], one_fold[1], {})  # one fold: each fixed test case tested once, as before


def test_grids_are_tuned_on_validation_even_when_test_disagrees(tmp_path, disc_federation):
    from fedseg.bench.phases import run_bench
    from fedseg.bench.report import write_report

    _write_flipped_folder(tmp_path / "flipped", disc_federation(n_sites=2, cases_per_site=8))
    path = _bench(
        tmp_path,
        federations=[{"name": "flipped", "set": ["data.source=folder", f"data.root={tmp_path / 'flipped'}"]}],
        methods=[
            "fedavg",
            {"name": "fedprox", "grid": {"train.lr": [0.0003, 0.03]}},
            # two-stage tuning: mu searched at the learning rate selected (on validation) for fedprox
            {
                "name": "fedprox-mu",
                "algorithms": ["fedprox"],
                "settings_from": "fedprox",
                "grid": {"methods.fedprox.mu": [0.01, 1.0]},
            },
        ],
        seeds=[0],
        tune={"seeds": [5]},  # a tuning seed of its own: no final run is a tuning run
        split={"mode": "ratio"},
        budget={"rounds": 3},
    )
    spec, root = load_bench(path)
    runs = run_bench(spec, root, tmp_path / "out", echo=lambda line: None)
    assert {r.seed for r in runs.tuning} == {5} and {r.seed for r in runs.final} == {0}
    tuning = [r for r in write_report(spec, runs, tmp_path / "out")["tuning"] if r["method"] == "fedprox"]
    best_val = max(tuning, key=lambda r: r["val_dice"])
    best_test = max(tuning, key=lambda r: r["test_dice"])
    assert best_val["setting"] != best_test["setting"], tuning  # the test split disagrees with validation
    assert [r["setting"] for r in tuning if r["selected"]] == [best_val["setting"]]
    assert {r.setting_label for r in runs.final if r.method == "fedprox"} == {best_val["setting"]}
    second = [r for r in runs.tuning if r.method == "fedprox-mu"]
    assert len(second) == 2 and {r.setting_label.split(",")[0] for r in second} == {best_val["setting"]}
    lr = best_val["values"]["train.lr"]
    for run in second:
        assert yaml.safe_load((run.dir(tmp_path / "out") / "config.yaml").read_text())["train"]["lr"] == lr
    assert len([r for r in runs.final if r.method == "fedprox-mu"]) == 1


@pytest.mark.parametrize(
    "name",
    [
        "examples/bench-fets.yaml",
        "examples/bench-fedsm.yaml",
        "benchmarks/headline.yaml",
        "benchmarks/headline-fedsm.yaml",
        "benchmarks/headline-equal.yaml",
        "benchmarks/headline-fedsm-equal.yaml",
        "benchmarks/fets-setups.yaml",
        "benchmarks/fets-limited.yaml",
    ],
)
def test_the_example_bench_files_validate_every_run(name):
    """Every run of each committed bench file validates, and its data makes every fold at every site (as ``fedseg
    bench`` checks before training: examples/bench-fets.yaml asked for 5 folds of a 3-case site)."""
    from fedseg.bench.plan import check_data, check_plan, holdout_sites, run_config

    spec, root = load_bench(Path(__file__).resolve().parents[1] / name)
    check_plan(spec, root)  # raises unless every method, grid setting and federation of the bench makes a valid run
    check_data(spec, root, holdout_sites(spec, root))
    chosen = {(f.name, m.name): settings(m)[-1] for f in spec.federations for m in spec.methods if m.grid}
    runs = final_runs(spec, chosen)
    assert len(runs) == len(spec.federations) * len(spec.methods) * len(spec.folds) * len(spec.seeds)
    for run in runs[:: max(1, len(runs) // 10)]:
        cfg = run_config(spec, root, run)
        assert (cfg.seed, cfg.algorithms) == (run.seed, list(spec.method(run.method).trained))


def test_resume_accepts_appended_methods_and_refuses_other_changes(tmp_path):
    from fedseg.bench.phases import BENCH_FILE, check_out

    spec, _ = load_bench(_bench(tmp_path))
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / BENCH_FILE).write_text(json.dumps(spec.model_dump(mode="json")))
    with pytest.raises(FileExistsError, match="--resume"):
        check_out(spec, tmp_path / "out", resume=False)
    grown, _ = load_bench(
        _bench(
            tmp_path, methods=["fedavg", {"name": "fedprox", "grid": {"methods.fedprox.mu": [0.1, 1.0]}}, "scaffold"]
        )
    )
    check_out(grown, tmp_path / "out", resume=True)
    older = spec.model_dump(mode="json")  # written by a fedseg without a field added since: compared at its default
    for fed in older["federations"]:
        del fed["leave_one_out"]
    (tmp_path / "out" / BENCH_FILE).write_text(json.dumps(older))
    check_out(spec, tmp_path / "out", resume=True)
    for change in ({"seeds": [0, 1, 2]}, {"methods": ["scaffold", "fedavg"]}):
        other, _ = load_bench(_bench(tmp_path, **change))
        with pytest.raises(ValueError, match="cannot resume a different bench") as refused:
            check_out(other, tmp_path / "out", resume=True)
        if "seeds" in change:  # the refusal shows what was recorded and what was asked
            assert str(refused.value).endswith("it differs in: seeds: [0, 1] -> [0, 1, 2]")


def test_a_leave_one_out_federation_scores_every_site_unseen(tmp_path):
    """Each fold trains without one site and scores the trained models on all of its cases (FedSM Table 5): the
    pooled results hold every case of every site once per method, and a site's Dice is its unseen-site Dice."""
    from fedseg.bench.phases import run_bench
    from fedseg.bench.report import write_report

    path = _bench(
        tmp_path,
        federations=[{"name": "unseen", "set": ["data.source=synthetic-retina"], "leave_one_out": True}],
        methods=["fedavg", "local"],
        seeds=[0],
        split={"mode": "ratio"},
        budget={"rounds": 1},
    )
    spec, root = load_bench(path)
    runs = run_bench(spec, root, tmp_path / "out", echo=lambda line: None)
    tables = write_report(spec, runs, tmp_path / "out")["federations"]["unseen"]
    assert set(tables["methods"]) == {"fedavg"}  # local has no model for a site it never saw
    sites = [f"site{k}" for k in range(1, 7)]
    assert list(tables["sites"]) == sites and len({r.holdout for r in runs.final}) == 6
    with open(tmp_path / "out" / "results.csv", newline="") as f:
        rows = [r for r in csv.DictReader(f) if r["method"] == "fedavg"]
    for site in sites:
        run = next(r for r in runs.final if r.holdout == site and r.method == "fedavg")
        unseen = json.loads((run.dir(tmp_path / "out") / "unseen.json").read_text())["rows"][0]
        assert unseen["unseen_site"] == site and site not in unseen["training_sites"]
        assert {r["case"] for r in rows if r["site"] == site} == set(unseen["case_ids"])
        assert tables["methods"]["fedavg"]["sites"][site]["mean"] == pytest.approx(unseen["dice"], rel=1e-9)
    assert (
        "**Leave-one-out**: each run is scored on every case of its held-out site by Dice only"
        in (tmp_path / "out" / "tables.md").read_text()
    )  # its HD95 columns are empty: said, not left to guess


@pytest.mark.slow
def test_jobs_2_gives_the_numbers_of_jobs_1(tmp_path):
    """Runs trained two at a time, each in its own process, give the same per-case results as one after another."""
    from fedseg.bench.phases import run_bench
    from fedseg.bench.report import write_report

    path = _bench(tmp_path, methods=["fedavg"], seeds=[0, 1], split={"mode": "ratio"}, budget={"rounds": 1})
    spec, root = load_bench(path)
    results = []
    for jobs in (1, 2):
        out = tmp_path / f"jobs{jobs}"
        write_report(spec, run_bench(spec, root, out, jobs=jobs, echo=lambda line: None), out)
        results.append((out / "results.csv").read_text())
    assert results[0] == results[1] and len(results[0].splitlines()) > 100


def test_tables_score_each_case_with_the_model_its_site_uses(tmp_path):
    """FedAvg with eval.local_models on also scores each site's local model on its own site: the bench keeps only
    the global model's rows (summary.json site_models), so its numbers are the run's own."""
    from fedseg.bench.phases import run_bench
    from fedseg.bench.report import write_report

    tiny = [s for s in TINY_SET if not s.startswith("eval.local_models")]
    path = _bench(tmp_path, set=tiny, methods=["fedavg"], seeds=[0], split={"mode": "ratio"}, budget={"rounds": 1})
    spec, root = load_bench(path)
    runs = run_bench(spec, root, tmp_path / "out", echo=lambda line: None)
    fedavg = write_report(spec, runs, tmp_path / "out")["federations"]["synthetic-retina"]["methods"]["fedavg"]
    (fin,) = runs.final.values()
    summary = fin.summary["algorithms"]["fedavg"]
    assert "local_avg" in summary  # the local models were scored too
    assert fedavg["client_avg"]["mean"] == pytest.approx(summary["dice"]["client_avg"], rel=1e-9)
    with open(tmp_path / "out" / "results.csv", newline="") as f:
        keys = [(r["site"], r["case"], r["region"], r["metric"]) for r in csv.DictReader(f)]
    assert len(keys) == len(set(keys))


@pytest.mark.parametrize(
    "change, message",
    [
        ({"split": {"mode": "kfold", "folds": 40}}, r"fold \d+: site 'site\d' gets no"),
        (
            {
                "federations": [
                    {"name": "x", "set": ["data.source=synthetic-retina", "data.repartition.holdout=nowhere"]}
                ]
            },
            "holdout: no site named 'nowhere'",
        ),
    ],
)
def test_data_that_cannot_make_every_fold_fails_before_anything_is_written(tmp_path, change, message):
    from fedseg.bench.phases import run_bench

    spec, root = load_bench(_bench(tmp_path, **change))
    with pytest.raises(ConfigError, match=message):
        run_bench(spec, root, tmp_path / "out", echo=lambda line: None)
    assert not (tmp_path / "out").exists()


def test_a_leave_one_out_federation_tunes_on_its_first_site_whatever_tune_folds_says(tmp_path):
    unseen = {"name": "unseen", "set": ["data.source=synthetic-retina"], "leave_one_out": True}
    spec, _ = load_bench(_bench(tmp_path, federations=["synthetic-retina", unseen], tune={"folds": [0, 1]}))
    holdouts = {"unseen": ["site1", "site2", "site3"]}
    tuning = [r for r in tuning_runs(spec, holdouts) if r.federation == "unseen"]
    assert [(r.holdout, r.setting_label) for r in tuning] == [("site1", "mu=0.1"), ("site1", "mu=1.0")]
    assert {r.fold for r in tuning_runs(spec, holdouts) if r.federation == "synthetic-retina"} == {0, 1}
    finals = final_runs(spec, {}, holdouts)
    assert {r.holdout for r in finals if r.federation == "unseen"} == {"site1", "site2", "site3"}
    with pytest.raises(ConfigError, match="tune.folds: unused, a leave-one-out federation tunes on its first site"):
        load_bench(_bench(tmp_path, federations=[unseen], tune={"folds": [0, 1]}))  # no federation would use them


def test_hd95_and_nsd_are_tested_like_dice_hd95_on_its_better_side_and_a_bench_without_nsd_renders_as_before(
    tmp_path,
):
    """NSD and HD95 in tables.json (mean ± std over the seed-averaged cases, a paired Wilcoxon test against the
    reference equal to scipy's on the per-case differences, which tables.json keeps): with a one-tailed
    ``greater`` bench (the method better), NSD is tested ``greater`` and HD95 ``less`` (lower is better); both in
    tables.md. The same runs with their NSD rows and summary entries removed (a bench written before NSD existed)
    render with Dice and HD95 unchanged and no NSD column."""
    from fedseg.bench.phases import run_bench
    from fedseg.bench.report import write_report

    tiny = [*TINY_SET, "eval.nsd_tolerance=2"]
    path = _bench(
        tmp_path, set=tiny, seeds=[0], split={"mode": "ratio"}, budget={"rounds": 1}, tests={"alternative": "greater"}
    )
    path.write_text(path.read_text().replace("[0.1, 1.0]", "[0.1]"))  # one fedprox setting: no tuning runs
    spec, root = load_bench(path)
    out = tmp_path / "out"
    runs = run_bench(spec, root, out, echo=lambda line: None)
    fed = write_report(spec, runs, out)["federations"]["synthetic-retina"]
    with open(out / "results.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    fedprox, fedavg = fed["methods"]["fedprox"], fed["methods"]["fedavg"]
    assert fed["nsd_tolerance"] == 2.0
    for metric, side in (("nsd", "greater"), ("hd95", "less")):
        as_dice = [{**r, "metric": "dice" if r["metric"] == metric else "-"} for r in rows]
        a, b = _case_dice(as_dice, "fedprox"), _case_dice(as_dice, "fedavg")
        keys = sorted(set(a) & set(b))
        test = fedprox[f"{metric}_wilcoxon"]
        assert fedavg[f"{metric}_wilcoxon"] is None  # the reference
        assert fedprox[metric]["n"] == len(keys) > 0
        assert fedprox[metric]["mean"] == pytest.approx(float(np.mean([a[k] for k in keys])), rel=1e-12)
        diffs = [a[k] - b[k] for k in keys]
        assert test["n"] == len(keys) and test["alternative"] == side
        assert test["mean_diff"] == pytest.approx(float(np.mean(diffs)), rel=1e-9)
        assert test["p"] == pytest.approx(_p(diffs, test), rel=1e-12), metric
        kept = [v for v in test["case_diffs"].values() if np.isfinite(v)]  # the p recomputable from tables.json
        assert _p(kept, test) == pytest.approx(test["p"], rel=1e-12)
    md = (out / "tables.md").read_text()
    assert "| HD95 Δ vs fedavg | HD95 95% CI | HD95 p (Holm) |" in md and "lower is better: one-tailed" in md
    assert "| NSD (τ 2 pixels) | NSD Δ vs fedavg | NSD 95% CI | NSD p (Holm) |" in md

    # the same bench as written before NSD: no nsd rows, no summary entries
    for run in out.glob("runs/**/results.csv"):
        with open(run, newline="") as f:
            kept = [r for r in csv.DictReader(f) if r["metric"] != "nsd"]
        with open(run, "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=list(kept[0]))
            writer.writeheader()
            writer.writerows(kept)
        summary = json.loads((run.parent / "summary.json").read_text())
        summary.pop("nsd_tolerance")
        for entry in summary["algorithms"].values():
            entry.pop("nsd")
        (run.parent / "summary.json").write_text(json.dumps(summary))
    old = write_report(spec, run_bench(spec, root, out, echo=lambda line: None, train=False), out)
    old_fed = old["federations"]["synthetic-retina"]
    for name in ("fedavg", "fedprox"):
        for key in ("dice", "hd95", "regions", "client_avg", "sites", "wilcoxon", "hd95_wilcoxon"):
            assert old_fed["methods"][name][key] == fed["methods"][name][key], (name, key)
        assert old_fed["methods"][name]["nsd"]["n"] == 0 and old_fed["methods"][name]["nsd_wilcoxon"] is None
    old_md = (out / "tables.md").read_text()
    assert "NSD" not in old_md and old_md.count("\n") == md.count("\n")


def test_bench_notes_keep_their_bold_in_the_page_and_escape_the_rest():
    from fedseg.presentation.kit import esc_md

    note = "**May not have converged** (rounds < 10% & more): fedavg (3/3), **b**"
    assert esc_md(note) == "<b>May not have converged</b> (rounds &lt; 10% &amp; more): fedavg (3/3), <b>b</b>"


def test_per_seed_data_is_checked_for_every_seed_tuning_seeds_too(tmp_path, disc_federation):
    """With data_seed: per-seed each seed builds and splits its own data: a tuning seed whose data leaves a site
    without a test case is refused before anything is written, naming the seed (only seeds[0] was checked)."""
    from dataclasses import replace

    from fedseg.bench.phases import run_bench
    from fedseg.data.sources import register_federation, unregister_federation

    def builder(cfg):
        fed = disc_federation(n_sites=3, cases_per_site=12, size=32, seed=cfg.data.seed)
        if cfg.data.seed == 7:  # this seed's data has 2 cases at site2
            fed.sites[1] = replace(fed.sites[1], cases=fed.sites[1].cases[:2])
        return fed

    register_federation("seeded-discs", builder, sites=3)
    try:
        spec, root = load_bench(
            _bench(
                tmp_path,
                federations=[{"name": "discs", "set": ["data.source=seeded-discs"]}],
                data_seed="per-seed",
                tune={"seeds": [7]},
            )
        )
        with pytest.raises(ConfigError, match=r"bench federation 'discs', fold 0, seed 7: site '[^']+' gets no"):
            run_bench(spec, root, tmp_path / "out", echo=lambda line: None)
        assert not (tmp_path / "out").exists()
    finally:
        unregister_federation("seeded-discs")


def test_the_eta_counts_each_run_left_at_its_methods_time_and_says_what_it_guessed():
    """FedSM's runs take several FedAvg runs' time: an ETA from the mean of every run so far was minutes off after
    the FedAvg runs of a FedAvg-vs-FedSM bench (found by a fresh-eyes run). A method not timed yet is guessed."""
    from fedseg.bench.execute import Runner
    from fedseg.bench.plan import BenchRun

    runner = Runner(None, Path(), Path(), 2, lambda line: None)  # type: ignore[arg-type]
    runner.trained_seconds = {"fedavg": [10.0, 20.0], "fedsm": [60.0]}
    left = [BenchRun("fed", 0, 0, method, (), ()) for method in ("fedsm", "fedavg", "ditto")]
    eta, note = runner._eta(left)
    assert eta == pytest.approx((60 + 15 + 30) / 2)  # ditto: the mean of every run so far, (10 + 20 + 60) / 3
    assert note == ", 1 of them of methods not timed yet"
    assert runner._eta(left[:2]) == (pytest.approx(37.5), "")


def test_the_aggregation_weights_autofedavg_learned_are_tabled_per_site_over_its_runs(tmp_path):
    """A bench with Auto-FedAvg (layer-wise: the mean over groups): tables.json ``learned_weights`` holds each site's
    alpha_k at each run's last learning round (round_metrics.csv), mean ± std over the runs; every output shows the
    table (tables.tex compiles); FedAvg has none."""
    from fedseg.bench.phases import run_bench
    from fedseg.bench.report import write_report

    path = _bench(
        tmp_path,
        methods=["fedavg", "autofedavg-l-softmax"],
        seeds=[0, 1],
        split={"mode": "ratio"},
        budget={"rounds": 2},
    )
    spec, root = load_bench(path)
    out = tmp_path / "out"
    write_report(spec, run_bench(spec, root, out, echo=lambda line: None), out)
    fed = json.loads((out / "tables.json").read_text())["federations"]["synthetic-retina"]
    assert "learned_weights" not in fed["methods"]["fedavg"]
    weights = fed["methods"]["autofedavg-l-softmax"]["learned_weights"]
    assert list(weights) == fed["sites"]
    finals = defaultdict(list)  # site -> alpha at each run's last round, read here from the runs' own files
    for metrics in sorted(out.rglob("round_metrics.csv")):
        with open(metrics, newline="") as f:
            rows = [r for r in csv.DictReader(f) if r["algorithm"] == "autofedavg-l-softmax" and r["metric"] == "alpha"]
        if rows:
            last = max(int(r["round"]) for r in rows)
            for r in rows:
                if int(r["round"]) == last:
                    finals[r["site"]].append(float(r["value"]))
    assert all(len(v) == 2 for v in finals.values()) and set(finals) == set(weights)
    for site, values in finals.items():
        assert weights[site]["mean"] == pytest.approx(np.mean(values)) and weights[site]["n"] == 2
        assert weights[site]["std"] == pytest.approx(np.std(values, ddof=1))
    assert sum(w["mean"] for w in weights.values()) == pytest.approx(1.0, abs=1e-6)  # each run's weights sum to 1
    md, tex = (out / "tables.md").read_text(), (out / "tables.tex").read_text()
    assert "### Learned aggregation weights (Auto-FedAvg)" in md and "α_k: the aggregation weight" in md
    section = md.split("### Learned aggregation weights (Auto-FedAvg)")[1].split("###")[0]
    (row,) = [line for line in section.splitlines() if line.startswith("| autofedavg")]
    site = fed["sites"][0]
    assert row.split(" | ")[1] == f"{weights[site]['mean']:.3f} ± {weights[site]['std']:.3f}"
    assert "learned weights" in tex and "learned weights" in (out / "report.html").read_text()
    assert "$\\alpha$\\_k: the aggregation weight" in tex
    if shutil.which("pdflatex"):
        doc = tmp_path / "doc.tex"
        doc.write_text(
            "\\documentclass{article}\n\\usepackage{booktabs,graphicx}\n\\begin{document}\n"
            f"\\input{{{out / 'tables.tex'}}}\n\\end{{document}}\n"
        )
        cmd = ["pdflatex", "-interaction=nonstopmode", "-halt-on-error", doc.name]
        proc = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0, proc.stdout[-1500:]
