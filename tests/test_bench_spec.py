"""A bench file refused when loaded, without training: keys of a ``set:`` or grid that the bench overwrites in every
run, fields no run uses, an unknown budget reference, keys given twice (bench and run config files); the refusal of
a resumed bench that differs, naming the differing part."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from fedseg.bench.execute import Finished
from fedseg.bench.phases import BENCH_FILE, budget_caps, check_out, with_caps
from fedseg.bench.plan import federation_overrides, final_runs, load_bench, reference_runs, settings, tuning_runs
from fedseg.bench.spec import BenchSpec, assigned_keys
from fedseg.config_load import ConfigError, load_config

SET = ["data.scale=0.05", "data.image_size=16", "model.channels=[4,8,16]", "threads=1", "eval.local_models=false"]


def _write(tmp_path: Path, **fields) -> Path:
    spec = {
        "name": "tiny",
        "base": {"preset": "synthetic-retina"},
        "set": SET,
        "federations": ["synthetic-retina"],
        "methods": ["fedavg", {"name": "fedprox", "grid": {"methods.fedprox.mu": [0.1, 1.0]}}],
        "seeds": [0, 1],
        **fields,
    }
    path = tmp_path / "bench.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


LOO = {"name": "unseen", "set": ["data.source=synthetic-retina"], "leave_one_out": True}


@pytest.mark.parametrize(
    "change, said",
    [
        (
            {"set": [*SET, "fl.rounds=1"]},
            "set: fl.rounds: the bench sets it in every run, overwriting this; use budget.rounds",
        ),
        ({"set": ["fl.stop.patience=3"]}, "set: fl.stop.patience: .*; use stop.patience"),
        (
            {"set": ["fl.stop={patience: 3, min_delta: 0.01}"]},
            "set: fl.stop.patience: .*; use stop.patience; set: fl.stop.min_delta",
        ),
        ({"set": ["fl.stop.min_rounds=5"]}, "set: fl.stop.min_rounds: .*; use stop.min_rounds"),
        ({"set": ["seed=3"]}, "set: seed: .*; use seeds"),
        ({"set": ["data.split={mode: kfold}"]}, "set: data.split.mode: .*; use split.mode"),
        (
            {"federations": [{"name": "r", "set": ["data.source=synthetic-retina", "data.split.fold=1"]}]},
            r"federation r: set: data.split.fold: .*; use split \(mode: kfold tests every fold\)",
        ),
        (
            {"methods": ["fedavg", {"name": "fedprox", "set": ["algorithms=[fedprox,finetune]"]}]},
            r"method fedprox: set: algorithms: .*; use a method's algorithms",
        ),
        (
            {"methods": ["fedavg", {"name": "fedprox", "grid": {"fl.rounds": [5, 10]}}]},
            "method fedprox: grid: fl.rounds: .*; use budget.rounds",
        ),
        ({"data_seed": "per-seed", "set": ["data.seed=1"]}, "set: data.seed: .*; use data_seed: fixed"),
        (
            {"federations": [LOO], "methods": ["fedavg", {"name": "local", "set": ["data.repartition.holdout=site1"]}]},
            "method local: set: data.repartition.holdout: .*federation without leave_one_out",
        ),
        (
            {"budget": {"rule": "sgd_steps", "rounds": 2}, "set": ["fl.stop.sgd_steps=100"]},
            r"set: fl.stop.sgd_steps: .*; use budget \(rule: sgd_steps",
        ),
        (
            {"split": {"mode": "kfold", "folds": 2}, "set": ["data.split.ratios=[0.6,0.2,0.2]"]},
            "set: data.split.ratios: used only by split mode: ratio",
        ),
        ({"set": ["data.split.train_fraction=0.7"]}, "set: data.split.train_fraction: used only by split mode: kfold"),
        (
            {"set": ["data.source=synthetic-prostate"], "federations": ["synthetic-retina", "synthetic-prostate"]},
            r"set: data.source: federation synthetic-retina sets it \(its name is a built-in federation\)",
        ),
    ],
)
def test_a_set_or_grid_key_the_bench_sets_itself_is_refused_naming_where_and_what_to_use(tmp_path, change, said):
    path = _write(tmp_path, **change)
    with pytest.raises(ConfigError, match=f"^{path}: {said}") as refused:
        load_bench(path)
    assert "\n" not in str(refused.value)


@pytest.mark.parametrize(
    "change",
    [
        {"set": ["data.seed=1"]},  # data_seed: fixed: the base configuration's data.seed, the bench's choice
        {"federations": [{"name": "r", "set": ["data.source=synthetic-retina", "data.repartition.holdout=site1"]}]},
        {"set": ["fl.stop.sgd_steps=100"]},  # rule: rounds sets no cap: the file's own is kept
        {"set": ["data.split.ratios=[0.6,0.2,0.2]"]},
        {"split": {"mode": "kfold", "folds": 2}, "set": ["data.split.train_fraction=0.7"]},
        {"set": ["fl.validate_every=2", "data={scale: 0.05}"]},  # a section without a key the bench sets
        {"set": ["data.source=synthetic-retina"], "federations": [{"name": "r", "set": ["data.scale=0.05"]}]},
    ],
)
def test_keys_the_bench_leaves_alone_are_accepted(tmp_path, change):
    """Accepted, kept as written, and none of them is a key the bench sets in its runs (``run_keys``)."""
    spec, _ = load_bench(_write(tmp_path, **change))
    fed_sets = [a for f in change.get("federations", []) if isinstance(f, dict) for a in f["set"]]
    written = [*change.get("set", []), *fed_sets]
    given = [*spec.set, *(a for f in spec.federations for a in federation_overrides(f))]
    assert written and all(a in given for a in written), (written, given)
    keys = {k for a in written for k in assigned_keys(a)}
    for fed in spec.federations:
        assert not keys & set(spec.run_keys(fed)), (fed.name, keys & set(spec.run_keys(fed)))


def test_assigned_keys_reach_into_a_mapping_value():
    assert sorted(assigned_keys("fl={stop: {patience: 3}, rounds: 2}")) == [
        "fl",
        "fl.rounds",
        "fl.stop",
        "fl.stop.patience",
    ]
    assert list(assigned_keys("model.channels=[4,8")) == ["model.channels"]  # bad YAML: the run config reports it


@pytest.mark.parametrize(
    "fields",
    [
        {"split": {"mode": "kfold", "folds": 3}, "data_seed": "per-seed", "stop": {"patience": 2, "min_rounds": 3}},
        {"budget": {"rule": "sgd_steps", "rounds": 2}, "federations": ["synthetic-retina", LOO]},
        {"budget": {"rule": "simulated_time", "rounds": 2, "reference": "scaffold"}, "split": {"mode": "ratio"}},
    ],
)
def test_every_key_a_run_gets_after_the_set_lists_is_one_the_bench_refuses_in_them(tmp_path, fields):
    """``BenchSpec.run_keys`` is what ``make_run`` (and the budget caps) set after the ``set:`` lists and grids: a
    key added there and not to ``run_keys`` fails here."""
    spec, _ = load_bench(_write(tmp_path, **fields))
    holdouts = {"unseen": ["site1", "site2"]}
    summary = {"algorithms": {"x": {"convergence": {"rounds": 2}, "cost": {"sgd_steps": 8, "simulated_hours": 0.1}}}}
    caps = budget_caps(spec, {r: Finished(r, Path(), summary, 0.0) for r in reference_runs(spec, holdouts)})
    chosen = {(f.name, m.name): settings(m)[0] for f in spec.federations for m in spec.methods if m.grid}
    runs = with_caps(spec, [*tuning_runs(spec, holdouts), *final_runs(spec, chosen, holdouts)], caps)
    for run in runs:
        fed = next(f for f in spec.federations if f.name == run.federation)
        method = spec.method(run.method)
        given = [*spec.set, *federation_overrides(fed), *method.set]
        given += [f"{key}=" for key, _ in run.inherited + run.setting]
        users = {k for a in given for k in assigned_keys(a)}
        set_by_bench = {a.split("=", 1)[0] for a in (*run.overrides, *run.caps)} - users
        assert set_by_bench <= set(spec.run_keys(fed)), (run.label, set_by_bench - set(spec.run_keys(fed)))


@pytest.mark.parametrize(
    "change, said",
    [
        ({"split": {"folds": 5}}, "split: folds applies only to mode: kfold"),
        ({"budget": {"rounds": 2, "reference": "fedavg"}}, "budget: reference: used only by rule: sgd_steps or"),
        ({"budget": {"rounds": 2, "max_factor": 2}}, "budget: max_factor: used only by rule"),
        ({"stop": {"min_rounds": 10}}, "stop: min_rounds applies only with patience"),
        ({"methods": ["fedavg", "fedprox"], "tune": {"seeds": [0]}}, "tune: unused, no method has a grid to tune"),
        ({"federations": [LOO], "tune": {"folds": [0]}}, "tune.folds: unused, a leave-one-out federation tunes on"),
        (
            {"budget": {"rule": "sgd_steps", "rounds": 2, "reference": "fedavgg"}},
            r"budget.reference: unknown algorithm 'fedavgg'; did you mean 'fedavg'\? \(give a method of the bench",
        ),
    ],
)
def test_a_field_no_run_would_use_is_refused(tmp_path, change, said):
    path = _write(tmp_path, **change)
    with pytest.raises(ConfigError, match=f"^{path}: {said}"):
        load_bench(path)


def test_a_recorded_bench_validates_whatever_it_holds():
    """bench.json and tables.json hold every field (a ratio split's folds, a rounds budget's reference), so they
    validate without the checks of a file as written; the committed benches' records included."""
    records = sorted(Path(__file__).parents[1].glob("benchmarks/results/*/bench.json"))
    assert records
    for record in records:
        content = json.loads(record.read_text())
        BenchSpec.model_validate(content)
        BenchSpec.model_validate(json.loads((record.parent / "tables.json").read_text())["bench"])
    dumped = BenchSpec.model_validate({"base": {"preset": "x"}, "federations": ["a"], "methods": ["fedavg"]})
    BenchSpec.model_validate(dumped.model_dump(mode="json"))


def test_a_key_given_twice_in_a_bench_file_is_refused_with_both_lines(tmp_path):
    path = _write(tmp_path)
    path.write_text(path.read_text() + "budget: {rounds: 1}\nseeds: [0]\n")
    first = next(i for i, line in enumerate(path.read_text().splitlines(), 1) if line.startswith("seeds:"))
    last = len(path.read_text().splitlines())
    with pytest.raises(ConfigError) as refused:
        load_bench(path)
    assert str(refused.value) == f"{path}: key 'seeds' given twice (lines {first} and {last}); keep one"
    path.write_text(yaml.safe_dump({"base": {"preset": "x"}}) + "methods:\n- {name: a, grid: {x: [1], x: [2]}}\n")
    with pytest.raises(ConfigError, match=r"key 'methods\.0\.grid\.x' given twice \(line 4\)"):
        load_bench(path)


def test_a_key_given_twice_in_a_run_config_file_is_refused(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text("seed: 0\nfl:\n  rounds: 2\n  weighting: uniform\n  rounds: 5\n")
    with pytest.raises(ConfigError) as refused:
        load_config(file=path)
    assert str(refused.value) == f"{path}: key 'fl.rounds' given twice (lines 3 and 5); keep one"
    path.write_text("defaults: &d {rounds: 2}\nfl:\n  <<: *d\n  rounds: 5\n".replace("defaults", "x_defaults"))
    with pytest.raises(ConfigError, match="x_defaults: unknown key"):  # a merge key's keys may be overridden
        load_config(file=path)


def test_a_resume_refused_names_the_differing_element_of_a_long_list(tmp_path):
    spec, _ = load_bench(_write(tmp_path, set=[*SET, "train.lr=0.01"]))
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / BENCH_FILE).write_text(json.dumps(spec.model_dump(mode="json")))
    other, _ = load_bench(_write(tmp_path, set=[*SET, "train.lr=0.02"], budget={"rounds": 20}))
    with pytest.raises(ValueError) as refused:
        check_out(other, tmp_path / "out", resume=True)
    assert str(refused.value).endswith(
        'it differs in: budget.rounds: 30 -> 20; set[5]: "train.lr=0.01" -> "train.lr=0.02"'
    ), refused.value
    grown, _ = load_bench(_write(tmp_path, set=[*SET, "train.lr=0.01", "data.normalize=zscore"]))
    with pytest.raises(ValueError, match=r'it differs in: set: with "data.normalize=zscore"$'):
        check_out(grown, tmp_path / "out", resume=True)
