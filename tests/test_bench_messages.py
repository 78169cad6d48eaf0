"""The one line a bad bench file gets, as a fresh-eyes study met them: each names the file and the place in it (a
``set:`` entry of the bench, of a federation or of a method, a grid value, a method's entry), says what is wrong and
what to write, when the file is read (``load_bench``) and from ``fedseg bench`` (no traceback, nothing run)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from fedseg.bench.plan import check_plan, load_bench
from fedseg.cli import app
from fedseg.config_load import ConfigError

SET = ["data.image_size=32", "threads=1"]


def _write(tmp_path: Path, **fields) -> Path:
    spec = {
        "base": {"preset": "synthetic-retina"},
        "set": SET,
        "split": {"mode": "ratio"},
        "budget": {"rule": "rounds", "rounds": 2},
        "federations": ["synthetic-retina"],
        "methods": ["fedavg"],
        "seeds": [0],
        **fields,
    }
    path = tmp_path / "bench.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def _refusal(path: Path) -> str:
    with pytest.raises(ConfigError) as raised:
        load_bench(path)
    return str(raised.value)


TRIAN = "trian: unknown key (did you mean 'train'?)"


@pytest.mark.parametrize(
    "fields, said",
    [
        ({"set": [*SET, "trian.lr=0.01"]}, f"set[2] 'trian.lr=0.01': {TRIAN}"),
        (
            {"federations": [{"name": "synthetic-retina", "set": ["trian.lr=0.01"]}]},
            f"federations[0] (synthetic-retina).set[0] 'trian.lr=0.01': {TRIAN}",
        ),
        (
            {"methods": ["fedavg", {"name": "fedprox", "set": ["trian.lr=0.01"]}]},
            f"methods[1] (fedprox).set[0] 'trian.lr=0.01': {TRIAN}",
        ),
        (
            {"methods": ["fedavg", {"name": "fedprox", "set": ["train.lrr=0.01"]}]},
            "methods[1] (fedprox).set[0] 'train.lrr=0.01': train.lrr: unknown key (did you mean 'lr'?)",
        ),
        (
            {"methods": ["fedavg", {"name": "fedprox", "grid": {"trian.lr": [0.01]}}]},
            f"methods[1] (fedprox).grid 'trian.lr: 0.01': {TRIAN}",
        ),
        (
            {"methods": ["fedavg", {"name": "fedprox", "grid": {"train.lr": [0.01, "fast"]}}]},
            "methods[1] (fedprox).grid 'train.lr: fast': train.lr must be a number, got 'fast'",
        ),
    ],
)
def test_an_unknown_run_option_names_the_file_and_the_set_entry_that_gave_it(tmp_path, fields, said):
    """``trian.lr=0.01`` said ``bench run synthetic-retina/fold0/seed0/fedavg/default: the bench's trian: unknown
    key`` wherever it was given: the run, not the file, and "the bench's" for a federation's or a method's too."""
    path = _write(tmp_path, **fields)
    assert _refusal(path) == f"{path}: {said}"


@pytest.mark.parametrize(
    "fields, said",
    [
        (
            {"methods": ["fedavg", {"name": "fedprox", "set": ["train.lr=abc"]}]},
            "methods[1] (fedprox).set[0] 'train.lr=abc': train.lr must be a number, got 'abc'",
        ),
        (
            {"methods": ["fedavg", {"name": "fedprox", "set": ["train.optimizer=adamw"]}]},
            "methods[1] (fedprox).set[0] 'train.optimizer=adamw': train.optimizer must be 'adam' or 'sgd', got 'adamw'",
        ),
        (
            {"methods": ["fedavg", {"name": "fedprox", "set": ["methods.fedprox.mu=abc"]}]},
            "methods[1] (fedprox).set[0] 'methods.fedprox.mu=abc': methods.fedprox.mu must be a number, got 'abc'",
        ),
        (
            {"methods": ["fedavg", {"name": "fedprox", "grid": {"train.lr": [0.01, -1]}}]},
            "methods[1] (fedprox).grid 'train.lr: -1': train.lr must be greater than 0.0, got -1",
        ),
        ({"set": [*SET, "threads=abc"]}, "set[2] 'threads=abc': threads must be an integer, got 'abc'"),
        (
            {"federations": [{"name": "synthetic-retina", "set": ["data.image_size=1.5"]}]},
            "federations[0] (synthetic-retina).set[0] 'data.image_size=1.5': data.image_size must be an integer, got "
            "1.5",
        ),
    ],
)
def test_a_bad_run_option_value_says_plainly_what_it_must_be(tmp_path, fields, said):
    """``train.lr=abc`` said ``train.lr: Input should be a valid number, unable to parse string as a number``
    (pydantic's words); one line names the file, the entry, the key, what it must be and what it got."""
    path = _write(tmp_path, **fields)
    assert _refusal(path) == f"{path}: {said}"


@pytest.mark.parametrize(
    "fields, said",
    [
        ({"split": {"mode": "kfold", "folds": -1}}, "split.folds must be at least 2, got -1"),
        ({"split": {"mode": "kfold", "folds": "five"}}, "split.folds must be an integer, got 'five'"),
        ({"split": {"mode": "kfold", "folds": 3}, "tune": {"folds": -1}}, "tune.folds must be a list, got -1"),
        (
            {"split": {"mode": "kfold", "folds": 3}, "tune": {"folds": ["a"]}},
            "tune.folds[0] must be an integer, got 'a'",
        ),
        ({"budget": {"rule": "rounds", "rounds": "abc"}}, "budget.rounds must be an integer, got 'abc'"),
        (
            {"budget": {"rule": "round"}},
            "budget.rule must be 'rounds', 'sgd_steps' or 'simulated_time', got 'round'",
        ),
        (
            {"tests": {"alternative": "bigger"}},
            "tests.alternative must be 'two-sided', 'greater' or 'less', got 'bigger'",
        ),
        ({"tune": {"per_fold": "maybe"}}, "tune.per_fold must be true or false, got 'maybe'"),
        ({"stop": "early"}, "stop must be a mapping (key: value lines), got 'early'"),
        (
            {"methods": ["fedavg", {"name": "fedprox", "set": "train.lr=0.1"}]},
            "methods[1] (fedprox).set must be a list, got 'train.lr=0.1'",
        ),
        (
            {"methods": ["fedavg", {"name": "fedprox", "grid": {"train.lr": "fast"}}]},
            "methods[1] (fedprox).grid.train.lr must be a list, got 'fast'",
        ),
        ({"comparisons": [["fedavg"]]}, "comparisons[0][1] is missing"),
        ({"seeds": [-1]}, "seeds: give seeds from 0 to 4294967295, got [-1]"),
        ({"seeds": ["a"]}, "seeds: give a list of integers such as [0, 1, 2], got [a]"),
    ],
)
def test_a_bad_value_of_a_bench_field_says_plainly_what_it_must_be(tmp_path, fields, said):
    """``split: {folds: -1}`` said ``split.folds: Input should be greater than or equal to 2``; ``tune.folds: [a]``
    said ``tune.folds.0: ...``; ``seeds: [-1]`` said ``bench run synthetic-retina/fold0/seed-1/fedavg/default: the
    bench's seed: Input should be greater than or equal to 0`` (a run, not the file's field)."""
    path = _write(tmp_path, **fields)
    assert _refusal(path) == f"{path}: {said}"


def test_fedseg_bench_prints_a_bad_value_as_one_plain_line(tmp_path):
    path = _write(tmp_path, methods=["fedavg", {"name": "fedprox", "set": ["train.lr=abc"]}])
    result = CliRunner().invoke(app, ["bench", str(path), "--out", str(tmp_path / "out")])
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert result.exit_code == 1 and "Traceback" not in result.output and "pydantic" not in result.output
    assert lines == [f"error: {path}: methods[1] (fedprox).set[0] 'train.lr=abc': train.lr must be a number, got 'abc'"]


@pytest.mark.parametrize(
    "methods, said",
    [
        (
            ["fedavg", {"name": "fedprox", "set": ["methods.fedprox.muu=0.01"]}],
            "methods[1] (fedprox).set[0] 'methods.fedprox.muu=0.01': methods.fedprox.muu: unknown key "
            "(did you mean 'mu'?)",
        ),
        (
            ["fedavg", {"name": "fedprox", "set": ["methods.fedprox={muu: 1}"]}],
            "methods[1] (fedprox).set[0] 'methods.fedprox={muu: 1}': methods.fedprox.muu: unknown key "
            "(did you mean 'mu'?)",
        ),
        (
            ["fedavg", {"name": "fedsm", "grid": {"methods.fedsm.lamm": [0.3, 0.7]}}],
            "methods[1] (fedsm).grid 'methods.fedsm.lamm: 0.3': methods.fedsm.lamm: unknown key (did you mean 'lam'?)",
        ),
        (
            ["fedavg", {"name": "fedprox", "set": ["methods.fedproxx.mu=0.1"]}],
            "methods[1] (fedprox).set[0] 'methods.fedproxx.mu=0.1': methods.fedproxx: no algorithm is named "
            "'fedproxx'; did you mean 'fedprox'?",
        ),
    ],
)
def test_a_method_option_typo_names_the_file_and_the_entry_that_gave_it(tmp_path, methods, said):
    """``methods.fedprox.muu`` said ``bench run .../fedprox/default: methods.fedprox.muu: unknown key``; a misspelt
    method in a key (``methods.fedproxx.mu``) was refused only once its run started."""
    path = _write(tmp_path, methods=methods)
    assert _refusal(path) == f"{path}: {said}"


@pytest.mark.parametrize(
    "methods, said",
    [
        (["fedavg", "fedsmm"], "methods[1]: unknown algorithm 'fedsmm'; did you mean 'fedsm'?"),
        (
            ["fedavg", {"name": "ft", "algorithms": ["fedavg", "finetun"]}],
            "methods[1] (ft).algorithms[1]: unknown algorithm 'finetun'; did you mean 'finetune'?",
        ),
    ],
)
def test_an_unknown_algorithm_names_the_file_and_the_method_entry(tmp_path, methods, said):
    """``fedsmm`` said ``bench run synthetic-retina/fold0/seed0/fedsmm/default: unknown algorithm 'fedsmm'...``."""
    path = _write(tmp_path, methods=methods)
    assert _refusal(path) == f"{path}: {said}"


def test_a_method_name_that_is_no_algorithm_says_how_a_method_names_its_algorithms(tmp_path):
    path = _write(tmp_path, methods=["fedavg", "lr-study"])
    said = _refusal(path)
    assert said.startswith(f"{path}: methods[1]: unknown algorithm 'lr-study'; algorithms: ")  # every one, listed
    assert said.endswith("; a method of another name gives its algorithms: {name: lr-study, algorithms: [fedavg]}")


def test_a_misspelt_built_in_federation_names_the_file_and_the_closest(tmp_path):
    path = _write(tmp_path, federations=["synthetic-retna"])
    assert _refusal(path) == (
        f"{path}: federations[0]: 'synthetic-retna' is not a built-in federation (folder, synthetic-retina, "
        "synthetic-prostate, synthetic-brats); did you mean 'synthetic-retina'? Otherwise give its data with set: "
        "[data.source=folder, data.root=PATH, ...]"
    )


def test_check_plan_without_the_file_names_the_run_and_the_place(tmp_path):
    """``run_bench`` checks the plan again, without the file: the run and the place, as before the file was known."""
    path = _write(tmp_path)
    bench, root = load_bench(path)
    bad = bench.model_copy(update={"set": (*bench.set, "trian.lr=0.01")})
    with pytest.raises(ConfigError) as raised:
        check_plan(bad, root)
    assert (
        str(raised.value) == f"bench run synthetic-retina/fold0/seed0/fedavg/default: set[2] 'trian.lr=0.01': {TRIAN}"
    )


@pytest.mark.parametrize(
    "federations, said",
    [
        (
            ["/data/my-hospitals"],
            "federations[0]: '/data/my-hospitals' is a path, not a federation name; give a federation folder as "
            "{name: my-hospitals, set: [data.source=folder, data.root=/data/my-hospitals]}",
        ),
        (
            ["../fed/"],
            "federations[0]: '../fed/' is a path, not a federation name; give a federation folder as "
            "{name: fed, set: [data.source=folder, data.root=../fed/]}",
        ),
        (
            [{"name": "a/b", "set": ["data.source=synthetic-retina"]}],
            "federations[0].name: 'a/b' cannot name a folder (it names the federation's runs' folder: no '/', '\\' or "
            "leading '.'); choose another name",
        ),
    ],
)
def test_a_path_for_a_federation_says_once_how_to_give_a_federation_folder(tmp_path, federations, said):
    """It said ``federations.0.name: federations: '/tmp/...' cannot name a folder (no '/', '\\', leading '.')``."""
    path = _write(tmp_path, federations=federations)
    assert _refusal(path) == f"{path}: {said}"


def test_a_method_name_that_cannot_name_a_folder_names_its_entry(tmp_path):
    path = _write(tmp_path, methods=["fedavg", "a/b"])
    assert _refusal(path) == (
        f"{path}: methods[1]: 'a/b' cannot name a folder (it names the method's runs' folder: no '/', '\\' or "
        "leading '.'); choose another name"
    )


@pytest.mark.parametrize(
    "fields, said",
    [
        ({"seeds": {0: "a", 1: "b"}}, "seeds: give a list of integers such as [0, 1, 2], got {0: a, 1: b}"),
        ({"seeds": [0, 1.5]}, "seeds: give a list of integers such as [0, 1, 2], got [0, 1.5]"),
        ({"seeds": None}, "seeds: give a list of integers such as [0, 1, 2], got nothing"),
        (
            {"methods": ["fedavg", {"name": "fedprox", "grid": {"train.lr": [0.1, 0.2]}}], "tune": {"seeds": {"a": 1}}},
            "tune.seeds: give a list of integers such as [0, 1, 2], got {a: 1}",
        ),
    ],
)
def test_seeds_that_are_no_list_of_integers_say_what_to_write(tmp_path, fields, said):
    """``seeds: {0: a, 1: b}`` said ``seeds: Input should be a valid tuple``."""
    path = _write(tmp_path, **fields)
    assert _refusal(path) == f"{path}: {said}"


def test_seeds_that_read_as_integers_and_a_recorded_null_tune_seeds_still_load(tmp_path):
    methods = ["fedavg", {"name": "fedprox", "grid": {"train.lr": [0.1, 0.2]}}]
    bench, _ = load_bench(_write(tmp_path, seeds=[0, "1", 2.0], methods=methods, tune={"seeds": None}))
    assert bench.seeds == (0, 1, 2) and bench.tune.seeds is None


def test_fedseg_bench_prints_the_one_line_and_runs_nothing(tmp_path):
    path = _write(tmp_path, methods=["fedavg", {"name": "fedprox", "set": ["trian.lr=0.01"]}])
    result = CliRunner().invoke(app, ["bench", str(path), "--out", str(tmp_path / "out")])
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert result.exit_code == 1 and "Traceback" not in result.output
    assert lines == [f"error: {path}: methods[1] (fedprox).set[0] 'trian.lr=0.01': {TRIAN}"], result.output
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    "method, said",
    [
        (
            {"name": "fedprox", "grid": {"methods.fedsm.lam": [0.1, 0.5]}},
            "methods[1] (fedprox).grid 'methods.fedsm.lam: 0.1': fedsm is not an algorithm this method trains "
            "(['fedprox']): its runs would ignore the option; give the options of its own algorithms",
        ),
        (
            {"name": "fedprox", "set": ["methods.fedsm.lam=0.5"]},
            "methods[1] (fedprox).set[0] 'methods.fedsm.lam=0.5': fedsm is not an algorithm this method trains "
            "(['fedprox']): its runs would ignore the option; give the options of its own algorithms",
        ),
    ],
)
def test_an_option_of_an_algorithm_the_method_does_not_train_names_its_entry(tmp_path, method, said):
    """A grid on ``methods.fedsm.lam`` for a FedProx method ran two identical settings, tuned "lam" on validation
    and printed ``lam=0.1`` as FedProx's setting in the tables: a grid on a parameter no run of it reads."""
    path = _write(tmp_path, methods=["fedavg", method])
    assert _refusal(path) == f"{path}: {said}"


def test_an_option_of_a_chained_methods_own_algorithm_is_accepted(tmp_path):
    methods = [
        "fedavg",
        {"name": "ft", "algorithms": ["fedavg", "finetune"], "set": ["methods.fedavg.weighting=uniform"]},
    ]
    bench, _ = load_bench(_write(tmp_path, methods=methods))
    assert bench.method_names == ["fedavg", "ft"]


def test_a_misspelt_reference_method_names_its_entry_not_the_reference(tmp_path):
    """``methods: [fedavgg, ...]`` with ``reference: fedavg`` said ``reference: 'fedavg' is not among the methods
    ['fedavgg', ...]``: the reference was right, the method entry was misspelt."""
    path = _write(tmp_path, methods=["fedavgg", "fedprox"], reference="fedavg")
    assert _refusal(path) == f"{path}: methods[0]: unknown algorithm 'fedavgg'; did you mean 'fedavg'?"


def test_two_methods_of_one_name_name_both_entries(tmp_path):
    path = _write(tmp_path, methods=["fedavg", "fedprox", {"name": "fedprox", "algorithms": ["fedbn"]}])
    assert _refusal(path) == (
        f"{path}: methods[2]: the name 'fedprox' is taken by methods[1]; give each its own name (its tables and "
        "folders are named by it)"
    )


def test_a_bench_of_one_seed_says_so_before_it_trains(tmp_path):
    """A bench of one seed (or none given: the default [0]) trained and wrote tables in which nothing could get a †,
    and said so only deep in the legend; now one line first."""
    from fedseg.bench.phases import run_bench

    lines: list[str] = []
    path = _write(
        tmp_path, budget={"rule": "rounds", "rounds": 1}, set=[*SET, "data.scale=0.05", "model.channels=[4,8,16]"]
    )
    spec, root = load_bench(path)
    run_bench(spec, root, tmp_path / "out", echo=lines.append)
    notes = [line for line in lines if line.startswith("note: seeds:")]
    assert notes == [
        "note: seeds: [0] is one seed: no comparison of the tables can get a † (its CI has no run-to-run variance: "
        "a difference between two trained models, not yet between two methods); give at least 2, e.g. seeds: [0, 1, 2]"
    ]
    assert lines.index(notes[0]) == 0


def test_a_bench_without_fedavg_and_without_a_reference_says_the_reference_is_the_default(tmp_path):
    """``reference:`` left out with no ``fedavg`` method said ``reference: 'fedavg' is not among the methods``, naming
    a field and a value the file does not hold."""
    path = _write(tmp_path, methods=["fedprox", "scaffold"])
    assert _refusal(path) == (
        f"{path}: reference: not given, so 'fedavg', which is not among the methods ['fedprox', 'scaffold']; give the "
        "method the paired tests compare against (reference: NAME)"
    )


def test_an_option_of_an_algorithm_no_method_trains_names_the_shared_set_entry(tmp_path):
    """``set: [methods.fedsm.lam=0.5]`` in a bench of FedAvg and FedProx changed no run, silently."""
    path = _write(tmp_path, set=[*SET, "methods.fedsm.lam=0.5"], methods=["fedavg", "fedprox"])
    assert _refusal(path) == (
        f"{path}: set[2] 'methods.fedsm.lam=0.5': no method of the bench trains fedsm (['fedavg', 'fedprox']): no run "
        "would read the option"
    )
    fed = [{"name": "synthetic-retina", "set": ["methods.fedprox.mu=0.1"]}]  # an option of a trained algorithm: kept
    assert load_bench(_write(tmp_path, federations=fed, methods=["fedavg", "fedprox"]))[0].method_names == [
        "fedavg",
        "fedprox",
    ]
