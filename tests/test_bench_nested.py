"""Nested tuning (``tune: {per_fold: true}``): every fold searches the grids on its own validation cases and its final
runs take the setting selected there; the spec's refusals, the plan, the selection per fold, the outputs (a ``fold``
column only under per_fold), and a real tiny bench run, collected and re-read; a bench without per_fold plans,
selects and writes what it did before."""

from __future__ import annotations

import csv
import json
import shutil
from pathlib import Path

import pytest
import yaml

from fedseg.bench.execute import DONE_FILE, Finished
from fedseg.bench.legend import tuning_note
from fedseg.bench.phases import BENCH_FILE, check_out
from fedseg.bench.plan import BenchRun, final_runs, load_bench, selection_key, setting_label, settings, tuning_runs
from fedseg.bench.report import TUNING_COLUMNS, tuning_columns
from fedseg.bench.select import select_settings, tuning_rows
from fedseg.bench.spec import BenchSpec
from fedseg.bench.table_rows import tune_table
from fedseg.bench.tables import final_setting
from fedseg.config_load import ConfigError
from test_bench import TINY_SET

FED = "synthetic-retina"
LOO = {"name": "unseen", "set": ["data.source=synthetic-retina"], "leave_one_out": True}


def _bench(tmp_path: Path, **fields) -> Path:
    spec = {
        "name": "nested",
        "base": {"preset": "synthetic-retina"},
        "set": TINY_SET,
        "federations": [FED],
        "methods": ["fedavg", {"name": "fedprox", "grid": {"methods.fedprox.mu": [0.1, 1.0]}}],
        "seeds": [0],
        "split": {"mode": "kfold", "folds": 2},
        "tune": {"per_fold": True},
        "budget": {"rounds": 2},
        **fields,
    }
    path = tmp_path / "bench.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


@pytest.mark.parametrize(
    "change, said",
    [
        (
            {"tune": {"per_fold": True, "folds": [0]}},
            "tune: per_fold and folds: per_fold tunes in every fold, each for itself; folds names the folds of one "
            "tuning shared by every fold: give one of them",
        ),
        (
            {"split": {"mode": "ratio"}},
            r"tune.per_fold: split mode: ratio is one split \(fold 0\), which the tuning uses already, and no "
            r"federation is leave_one_out; use split: \{mode: kfold\} or remove per_fold",
        ),
        ({"methods": ["fedavg", "fedprox"]}, "tune: unused, no method has a grid to tune"),
    ],
)
def test_per_fold_is_refused_where_it_cannot_apply(tmp_path, change, said):
    path = _bench(tmp_path, **change)
    with pytest.raises(ConfigError, match=f"^{path}: .*{said}"):
        load_bench(path)


def test_per_fold_is_recorded_only_when_on_so_a_bench_without_it_records_as_before(tmp_path):
    plain, _ = load_bench(_bench(tmp_path, tune={"seeds": [0]}))
    assert plain.model_dump(mode="json")["tune"] == {"folds": None, "seeds": [0]}  # as before per_fold existed
    nested, _ = load_bench(_bench(tmp_path))
    dumped = nested.model_dump(mode="json")
    assert dumped["tune"] == {"folds": None, "seeds": None, "per_fold": True}
    assert BenchSpec.model_validate(dumped) == nested  # bench.json / tables.json read back
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / BENCH_FILE).write_text(json.dumps(plain.model_dump(mode="json")))
    again, _ = load_bench(_bench(tmp_path, tune={"per_fold": True, "seeds": [0]}))
    with pytest.raises(ValueError, match=r"it differs in: tune.per_fold: null -> true$"):
        check_out(again, tmp_path / "out", resume=True)  # another bench: its folds would take other settings


def test_per_fold_tunes_every_fold_and_each_fold_takes_its_own_setting(tmp_path):
    spec, _ = load_bench(_bench(tmp_path, seeds=[0, 1]))
    assert spec.tune_folds == (0, 1)
    tuning = tuning_runs(spec)
    assert [r.label for r in tuning] == [
        f"{FED}/fold0/seed0/fedprox/mu=0.1",
        f"{FED}/fold1/seed0/fedprox/mu=0.1",
        f"{FED}/fold0/seed0/fedprox/mu=1.0",
        f"{FED}/fold1/seed0/fedprox/mu=1.0",
    ]
    low, high = settings(spec.method("fedprox"))
    assert selection_key(spec, FED, "fedprox", 1) == (FED, "fedprox", 1)
    assert final_runs(spec, {(FED, "fedprox"): low}) == [r for r in final_runs(spec, {}) if r.method == "fedavg"]
    finals = final_runs(spec, {(FED, "fedprox", 0): low, (FED, "fedprox", 1): high})
    assert {(r.fold, r.seed, r.setting_label) for r in finals if r.method == "fedprox"} == {
        (0, 0, "mu=0.1"),
        (0, 1, "mu=0.1"),
        (1, 0, "mu=1.0"),
        (1, 1, "mu=1.0"),
    }
    assert set(tuning) & set(finals) == {tuning[0], tuning[3]}  # each fold's selected tuning run is its seed-0 run
    fedprox = [r for r in finals if r.method == "fedprox"]
    assert final_setting(spec.method("fedprox"), fedprox) == (  # the test table's setting column
        "fold 0: mu=0.1; fold 1: mu=1.0",
        ["methods.fedprox.mu (low)", "methods.fedprox.mu (high)"],
    )
    half = final_runs(spec, {(FED, "fedprox", 1): high})  # fold 0 still tuning (a bench collected while running)
    assert {(r.fold, r.setting_label) for r in half if r.method == "fedprox"} == {(1, "mu=1.0")}


def test_settings_from_follows_each_folds_selection(tmp_path):
    methods = [
        {"name": "fedavg", "grid": {"train.lr": [0.001, 0.003]}},
        {"name": "fedprox", "settings_from": "fedavg", "grid": {"methods.fedprox.mu": [0.1, 1.0]}},
        {"name": "fedsm", "settings_from": "fedavg"},
    ]
    spec, _ = load_bench(_bench(tmp_path, methods=methods, reference="fedavg"))
    slow, fast = settings(spec.method("fedavg"))
    chosen = {(FED, "fedavg", 0): slow, (FED, "fedavg", 1): fast}
    second = tuning_runs(spec, selected=chosen)
    assert [r.label for r in second] == [
        f"{FED}/fold0/seed0/fedprox/lr=0.001,mu=0.1",
        f"{FED}/fold1/seed0/fedprox/lr=0.003,mu=0.1",
        f"{FED}/fold0/seed0/fedprox/lr=0.001,mu=1.0",
        f"{FED}/fold1/seed0/fedprox/lr=0.003,mu=1.0",
    ]
    assert [r.label for r in tuning_runs(spec, selected={(FED, "fedavg", 1): fast})] == [
        f"{FED}/fold1/seed0/fedprox/lr=0.003,mu=0.1",
        f"{FED}/fold1/seed0/fedprox/lr=0.003,mu=1.0",
    ]
    mu = settings(spec.method("fedprox"))
    finals = final_runs(spec, {**chosen, (FED, "fedprox", 0): mu[1], (FED, "fedprox", 1): mu[0]})
    assert {(r.method, r.fold, r.setting_label) for r in finals} == {
        ("fedavg", 0, "lr=0.001"),
        ("fedavg", 1, "lr=0.003"),
        ("fedprox", 0, "lr=0.001,mu=1.0"),
        ("fedprox", 1, "lr=0.003,mu=0.1"),
        ("fedsm", 0, "lr=0.001"),
        ("fedsm", 1, "lr=0.003"),
    }


def test_a_leave_one_out_federation_tunes_at_every_held_out_site_and_ratio_is_accepted_with_one(tmp_path):
    spec, _ = load_bench(_bench(tmp_path, federations=[FED, LOO], split={"mode": "ratio"}))
    holdouts = {"unseen": ["site1", "site2", "site3"]}
    tuning = tuning_runs(spec, holdouts)
    assert {r.fold for r in tuning if r.federation == FED} == {0}  # one split: its only fold
    assert [(r.holdout, r.setting_label) for r in tuning if r.federation == "unseen"] == [
        (site, mu) for mu in ("mu=0.1", "mu=1.0") for site in ("site1", "site2", "site3")
    ]
    low, high = settings(spec.method("fedprox"))
    chosen = {(FED, "fedprox", 0): low, **{("unseen", "fedprox", k): (low, high, high)[k] for k in range(3)}}
    finals = [r for r in final_runs(spec, chosen, holdouts) if r.method == "fedprox" and r.federation == "unseen"]
    assert [(r.holdout, r.setting_label) for r in finals] == [
        ("site1", "mu=0.1"),
        ("site2", "mu=1.0"),
        ("site3", "mu=1.0"),
    ]
    assert final_setting(spec.method("fedprox"), finals) == (
        "holdout site1: mu=0.1; holdout site2: mu=1.0; holdout site3: mu=1.0",
        ["methods.fedprox.mu (low)", "methods.fedprox.mu (high)"],
    )
    assert final_setting(spec.method("fedprox"), finals[1:]) == ("mu=1.0", ["methods.fedprox.mu (high)"])


def _finished(run: BenchRun, val: float) -> Finished:
    entry = {"convergence": {"best_val_dice": val, "rounds": 2}, "dice": {"client_avg": 1 - val}, "cost": {}}
    return Finished(run, Path(), {"algorithms": {"fedprox": entry}}, 0.0)


def test_each_fold_selects_on_its_own_validation_and_the_tables_show_it(tmp_path):
    """Fold 0's validation prefers mu=0.1, fold 1's mu=1.0 (a pooled selection would take mu=1.0 for both): each
    fold takes its own; the tuning rows, tuning.csv's columns, the tuning table and the legend show it."""
    spec, _ = load_bench(_bench(tmp_path, seeds=[0, 1], tune={"per_fold": True, "seeds": [0, 1]}))
    planned = tuning_runs(spec)
    val = {(0, "mu=0.1"): 0.6, (0, "mu=1.0"): 0.5, (1, "mu=0.1"): 0.2, (1, "mu=1.0"): 0.7}
    tuning = {r: _finished(r, val[(r.fold, r.setting_label)] + r.seed / 100) for r in planned}
    low, high = settings(spec.method("fedprox"))
    chosen = select_settings(spec, tuning, planned)
    assert chosen == {(FED, "fedprox", 0): low, (FED, "fedprox", 1): high}
    pooled = spec.model_copy(update={"tune": spec.tune.model_copy(update={"per_fold": False})})
    assert select_settings(pooled, tuning, planned) == {(FED, "fedprox"): high}

    unfinished = {r: f for r, f in tuning.items() if (r.fold, r.seed, r.setting_label) != (1, 1, "mu=0.1")}
    assert select_settings(spec, unfinished, planned) == {(FED, "fedprox", 0): low}  # fold 1 still tuning

    rows = tuning_rows(spec, dict(reversed(tuning.items())), chosen)  # rows fold by fold, whatever finished first
    assert [(r["fold"], r["setting"], r["runs"], r["selected"]) for r in rows] == [
        (0, "mu=0.1", 2, True),
        (0, "mu=1.0", 2, False),
        (1, "mu=0.1", 2, False),
        (1, "mu=1.0", 2, True),
    ]
    assert rows[0]["val_dice"] == pytest.approx(0.605) and rows[0]["at_edge"] == "methods.fedprox.mu (low)"
    assert tuning_columns(spec) == [*TUNING_COLUMNS[:2], "fold", *TUNING_COLUMNS[2:]]
    head, body = tune_table(rows, FED)
    assert head[:3] == ["method", "fold", "setting"] and [b[1] for b in body] == ["0", "0", "1", "1"]
    note = tuning_note(spec)
    assert "nested per fold (tune.per_fold)" in note and "not fully independent" not in note
    assert "at seed 0, 1, also a seed of the final runs" in note  # the seeds' optimism is still said

    plain_rows = tuning_rows(pooled, tuning, {(FED, "fedprox"): high})
    assert all("fold" not in r for r in plain_rows) and tuning_columns(pooled) == TUNING_COLUMNS
    assert tune_table(plain_rows, FED)[0][:2] == ["method", "setting"]
    assert "not fully independent of the tuning" in tuning_note(pooled) and "nested" not in tuning_note(pooled)


def test_a_leave_one_out_folds_tuning_rows_name_the_held_out_site(tmp_path):
    """A leave-one-out federation's folds are its sites: tuning.csv and the tuning table name each fold's held-out
    site (a number alone said nothing of which); a k-fold federation beside it gets an empty held_out cell."""
    spec, _ = load_bench(_bench(tmp_path, federations=[FED, LOO], split={"mode": "ratio"}))
    holdouts = {"unseen": ["site1", "site2", "site3"]}
    planned = tuning_runs(spec, holdouts)
    tuning = {r: _finished(r, 0.5 + (r.setting_label == "mu=1.0") / 10) for r in planned}
    rows = tuning_rows(spec, tuning, select_settings(spec, tuning, planned), holdouts)
    assert tuning_columns(spec) == [*TUNING_COLUMNS[:2], "fold", "held_out", *TUNING_COLUMNS[2:]]
    assert {(r["federation"], r["fold"], r["held_out"]) for r in rows} == {
        (FED, 0, ""),
        *(("unseen", k, site) for k, site in enumerate(holdouts["unseen"])),
    }
    _, body = tune_table(rows, "unseen")
    assert [b[1] for b in body] == [f"{k} (held out: site{k + 1})" for k in range(3) for _ in range(2)]
    assert [b[1] for b in tune_table(rows, FED)[1]] == ["0", "0"]


def _config(run_dir: Path) -> dict:
    return yaml.safe_load((run_dir / "config.yaml").read_text())


def test_a_nested_bench_runs_each_fold_at_its_own_setting_and_reads_back(tmp_path):
    """A real tiny bench (2 folds, 2 rounds, a 2-value grid): each fold's final fedprox runs train the setting with
    the best validation among that fold's tuning runs (read from their summaries), the selected tuning run being
    the fold's seed-0 final run; collected again (train nothing), also while a fold's tuning is unfinished; the
    same runs as a bench without per_fold train nothing more and write the files as before."""
    from fedseg.bench.phases import run_bench
    from fedseg.bench.report import write_report

    spec, root = load_bench(_bench(tmp_path))
    out = tmp_path / "out"
    runs = run_bench(spec, root, out, echo=lambda line: None)
    assert len(runs.tuning) == 4 and {r.fold for r in runs.tuning} == {0, 1}
    for fold in (0, 1):
        scores = {
            r.setting: fin.entry("fedprox")["convergence"]["best_val_dice"]
            for r, fin in runs.tuning.items()
            if r.fold == fold
        }
        order = settings(spec.method("fedprox"))
        best = max(order, key=lambda s: (scores[s], -order.index(s)))
        assert runs.selected[(FED, "fedprox", fold)] == best
        (final,) = [r for r in runs.final if r.method == "fedprox" and r.fold == fold]
        assert final.setting == best and final in runs.tuning  # the selected tuning run is this final run
        assert _config(final.dir(out))["methods"]["fedprox"]["mu"] == dict(best)["methods.fedprox.mu"]
    assert len(list((out / "runs").rglob(DONE_FILE))) == 6  # 4 tuning + 2 fedavg; fedprox's finals reused

    content = write_report(spec, runs, out)
    assert content["bench"]["tune"]["per_fold"] is True
    with open(out / "tuning.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert list(rows[0]) == tuning_columns(spec) and [r["fold"] for r in rows] == ["0", "0", "1", "1"]
    selected = {int(r["fold"]): r["setting"] for r in rows if r["selected"] == "True"}
    assert selected == {k: setting_label(runs.selected[(FED, "fedprox", k)]) for k in (0, 1)}
    text = (out / "tables.md").read_text()
    assert "nested per fold (tune.per_fold)" in text and "| method | fold | setting |" in text
    fedprox = content["federations"][FED]["methods"]["fedprox"]
    if selected[0] == selected[1]:
        assert fedprox["setting"] == selected[0]
    else:
        assert fedprox["setting"] == f"fold 0: {selected[0]}; fold 1: {selected[1]}"

    lines: list[str] = []
    again = run_bench(spec, root, out, train=False, echo=lines.append)  # collected: the same, nothing trained
    assert again.selected == runs.selected and set(again.final) == set(runs.final), lines
    lines.clear()
    resumed = run_bench(spec, root, out, resume=True, echo=lines.append)
    assert set(resumed.final) == set(runs.final) and all(" 0 to train" in line for line in lines if "runs," in line)

    unfinished = next(r for r in runs.tuning if r.fold == 1 and r not in runs.final)
    marker = unfinished.dir(out) / DONE_FILE
    kept = marker.read_text()
    marker.unlink()
    partial = run_bench(spec, root, out, train=False, echo=lambda line: None)  # fold 1 still tuning
    assert partial.selected == {(FED, "fedprox", 0): runs.selected[(FED, "fedprox", 0)]}
    assert {r.fold for r in partial.final if r.method == "fedprox"} == {0}
    write_report(spec, partial, out)  # the tables of a bench still running
    marker.write_text(kept)

    plain, _ = load_bench(_bench(tmp_path, tune={"seeds": [0]}))  # the same runs, tuned on fold 0 for every fold
    shutil.copytree(out / "runs", tmp_path / "plain" / "runs")
    lines = []
    pooled = run_bench(plain, root, tmp_path / "plain", echo=lines.append)
    assert all(" 0 to train" in line for line in lines if "runs," in line), lines
    assert pooled.selected == {(FED, "fedprox"): runs.selected[(FED, "fedprox", 0)]}
    assert {r.setting for r in pooled.final if r.method == "fedprox"} == {runs.selected[(FED, "fedprox", 0)]}
    plain_content = write_report(plain, pooled, tmp_path / "plain")
    assert "per_fold" not in json.loads((tmp_path / "plain" / BENCH_FILE).read_text())["tune"]
    assert "per_fold" not in plain_content["bench"]["tune"]
    header = (tmp_path / "plain" / "tuning.csv").read_text().splitlines()[0]
    assert header == ",".join(TUNING_COLUMNS) and all("fold" not in r for r in plain_content["tuning"])
    plain_text = (tmp_path / "plain" / "tables.md").read_text()
    assert "nested per fold" not in plain_text and "not fully independent of the tuning" in plain_text
    assert "| method | setting |" in plain_text and "| method | fold |" not in plain_text
