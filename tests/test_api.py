"""The Python API (fedseg.api, the names exported by ``fedseg``): Experiment, Results, register_algorithm,
register_federation, and examples/python_api.py run as a user would."""

from __future__ import annotations

import json
import math
import os
import pickle
import random
import subprocess
import sys
import warnings
from collections import defaultdict
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from typer.testing import CliRunner

import fedseg
from fedseg import (
    AlgorithmSpec,
    ConfigError,
    Experiment,
    FedAvgClient,
    FedAvgServer,
    FederationError,
    Results,
    register_algorithm,
    register_federation,
)
from fedseg.algorithms import ALGORITHMS, get_algorithm, unregister_algorithm
from fedseg.cli import app
from fedseg.config_load import dump_config
from fedseg.data.sources import REGISTERED, unregister_federation
from fedseg.run import count_sites, load_federation

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "python_api.py"


class EqualServer(FedAvgServer):
    def aggregation_weights(self, replies):
        return {site: 1.0 for site in replies}


def equal_spec(name: str = "test-equal") -> AlgorithmSpec:
    return AlgorithmSpec(name, "Test equal", EqualServer, FedAvgClient, "FedAvg with p_k = 1/K (a test)")


@pytest.fixture
def registry():
    """Leaves ALGORITHMS and the registered federations as it found them (other tests read the registry)."""
    algorithms, federations = dict(ALGORITHMS), dict(REGISTERED)
    yield
    for name in set(ALGORITHMS) - set(algorithms):
        unregister_algorithm(name)
    for name in set(REGISTERED) - set(federations):
        unregister_federation(name)


def test_import_fedseg_is_cheap_and_exports_the_api():
    code = "import sys, fedseg; print('torch' in sys.modules, 'fedseg.api' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.split() == ["False", "False"]
    assert set(fedseg.__all__) == {"__version__", *fedseg._EXPORTS}
    assert all(getattr(fedseg, name) is not None for name in fedseg.__all__)
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        fedseg.nope  # noqa: B018


def test_register_algorithm_refuses_duplicates_builtins_and_bad_names(registry):
    from fedseg.cli_options import algorithm_names

    spec = register_algorithm(equal_spec())
    assert ALGORITHMS["test-equal"] is spec and "test-equal" in algorithm_names().split(", ")
    with pytest.raises(ValueError, match="'test-equal' is already registered .*replace=True"):
        register_algorithm(equal_spec())
    assert spec.on_flower and "Flower nodes" in spec.on_flower  # other processes: they do not know it
    again = register_algorithm(equal_spec(), replace=True)
    assert ALGORITHMS["test-equal"] is again and again is not spec
    with pytest.raises(ValueError, match="'fedavg' is built in"):
        register_algorithm(equal_spec("fedavg"), replace=True)
    with pytest.raises(ValueError, match="letters, digits"):
        register_algorithm(equal_spec("a/b"))
    with pytest.raises(ValueError, match="'FedAvg' differs from 'fedavg' only in upper and lower case"):
        register_algorithm(equal_spec("FedAvg"))
    with pytest.raises(TypeError, match="AlgorithmSpec"):
        register_algorithm("test-x")
    swapped = AlgorithmSpec("test-x", "X", FedAvgClient, EqualServer, "server and client swapped")
    with pytest.raises(TypeError, match=r"'test-x': server and client are swapped: .*server class \(EqualServer\)"):
        register_algorithm(swapped)
    with pytest.raises(
        TypeError, match="'test-x': client must be a subclass of fedseg's FedAvgClient, got EqualServer"
    ):
        register_algorithm(AlgorithmSpec("test-x", "X", EqualServer, EqualServer, "two servers"))
    with pytest.raises(TypeError, match="'test-x': server must be a subclass of fedseg's FedAvgServer, got a str"):
        register_algorithm(AlgorithmSpec("test-x", "X", "EqualServer", FedAvgClient, "a name, not a class"))
    glob = AlgorithmSpec("test-x", "X", EqualServer, FedAvgClient, "a misspelt kind", kind="glob")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="'test-x': kind 'glob' is not one of baseline, global, personalized, clust"):
        register_algorithm(glob)
    assert "test-x" not in ALGORITHMS
    with pytest.raises(ValueError, match=r"methods\.test-equal\.lr: unknown key \(this section takes no keys\)"):
        get_algorithm("test-equal").parse_options({"lr": 1})  # a method without options (was "known keys: ")
    result = CliRunner().invoke(app, ["algorithms"], terminal_width=300)
    assert result.exit_code == 0 and "test-equal" in result.output and "Test equal" in result.output
    with pytest.raises(ValueError, match="built in"):
        unregister_algorithm("fedavg")


def test_register_federation_and_unknown_source_names_the_registered_ones(registry, tiny_config, disc_federation):
    calls = []

    def build(cfg):
        calls.append(cfg.seed)
        return disc_federation(n_sites=2, cases_per_site=8, size=cfg.data.image_size)

    register_federation("test-discs", build)
    cfg = tiny_config(data={"source": "test-discs"}, seed=3)
    assert load_federation(cfg).site_names == ["site1", "site2"] and calls == [3]
    assert count_sites(cfg) == 2 and calls == [3, 3]  # no declared count: built
    register_federation("test-ready", disc_federation(n_sites=4))  # a ready Federation
    assert count_sites(tiny_config(data={"source": "test-ready"})) == 4
    with pytest.raises(FederationError, match="unknown data.source 'nope'; available: folder, synthetic-retina, "):
        load_federation(tiny_config(data={"source": "nope"}))
    with pytest.raises(FederationError, match="available: .*test-discs, test-ready"):
        count_sites(tiny_config(data={"source": "nope"}))
    with pytest.raises(ValueError, match="'test-discs' is already registered; .*replace=True"):
        register_federation("test-discs", build)
    register_federation("test-discs", build, sites=2, replace=True)
    assert count_sites(cfg) == 2 and calls == [3, 3]  # declared count: not built
    for name in ("folder", "synthetic-retina"):
        with pytest.raises(ValueError, match="built in"):
            register_federation(name, build)
    register_federation("test-bad", lambda cfg: "not a federation")
    with pytest.raises(FederationError, match="returned str, not a Federation"):
        load_federation(tiny_config(data={"source": "test-bad"}))


def test_experiment_results_round_trip_custom_algorithm_and_federation(
    registry, tmp_path, tiny, tiny_config, disc_federation
):
    register_algorithm(equal_spec())
    register_federation("test-discs", lambda cfg: disc_federation(n_sites=2, cases_per_site=8), sites=2)
    config = {**tiny, "algorithms": ["fedavg", "test-equal"], "fl": {"rounds": 1}, "eval": {"hd95": False}}
    config["data"] = {**config["data"], "source": "test-discs"}
    out = tmp_path / "run"
    results = Experiment(config, out, progress=False).run()  # a dict config, data.source registered

    assert results.algorithms == ["fedavg", "test-equal"] and results.sites == ["site1", "site2"]
    assert results.summary["algorithms"]["test-equal"]["display_name"] == "Test equal"
    assert results.summary == json.loads((out / "summary.json").read_text())
    assert set(results.dice()) == {"fedavg", "test-equal"} and set(results.dice("site1")) == {"fedavg", "test-equal"}
    assert results.report_path.is_file() and results.report_path == out / "report.html"
    assert results.config is not None and results.config.data.source == "test-discs"
    rows = results.cases(algorithm="test-equal", metric="dice", model="global")
    assert rows and all(isinstance(r["value"], float) and r["algorithm"] == "test-equal" for r in rows)
    assert {r["site"] for r in rows} == {"site1", "site2"} and len(results.cases()) > len(rows)
    # eval.local_models: results.csv also holds fedavg's local:siteN rows; scored=True gives those dice() averages
    every = results.cases(algorithm="fedavg", metric="dice")
    scored = results.cases(algorithm="fedavg", metric="dice", scored=True)
    assert {r["model"] for r in every} == {"global", "local:site1", "local:site2"}
    assert {r["model"] for r in scored} == {"global"} and results.site_models("fedavg") == dict.fromkeys(
        results.sites, "global"
    )
    assert _client_avg(scored) == pytest.approx(results.dice()["fedavg"], abs=1e-9)
    assert {r["algorithm"] for r in results.cases(metric="dice", scored=True)} == {"fedavg", "test-equal"}
    with pytest.raises(
        ValueError, match=r"dice\('site9'\): .* has no site 'site9'; choose one of client_avg, global, site1, site2$"
    ):
        results.dice("site9")
    with pytest.raises(ValueError, match="hd95.*choose one of client_avg, global, site1, site2"):
        results.hd95("Site1")
    assert {r["round"] for r in results.rounds()} == {1}
    assert results.raw is not None
    for result in results.raw.algorithms:
        assert (results.model_dirs[result.name] / "weights.safetensors").is_file()
        bundle = results.bundle(result.name)
        assert all(torch.equal(bundle[m][k], w[k]) for m, w in result.bundle.items() for k in w)

    loaded = Results.load(out)
    assert loaded.summary == results.summary and str(loaded.cases()) == str(results.cases()) and loaded.raw is None
    (out / "report.html").unlink()
    assert loaded.report() == out / "report.html" and (out / "report.html").is_file()
    assert "test-equal" in repr(loaded)
    try:
        import pandas  # noqa: F401
    except ImportError:
        with pytest.raises(ImportError, match="pip install pandas"):
            loaded.dataframe()
    else:
        assert len(loaded.dataframe(algorithm="fedavg")) == len(loaded.cases(algorithm="fedavg"))

    resumed = loaded.resume(progress=False)  # the recorded config; finished methods reused
    assert _without_provenance(resumed.summary) == _without_provenance(results.summary)
    with pytest.raises(FileExistsError, match="resume"):
        Experiment(config, out, progress=False).run()
    unregister_algorithm("test-equal")  # as in a new process (a restarted kernel) that did not register it again
    with pytest.raises(
        ValueError, match=r"unknown algorithm 'test-equal'; .*register it again before resuming its run"
    ):
        loaded.resume(progress=False)


def _client_avg(rows: list[dict]) -> float:
    """The mean over sites of the mean over cases of the mean over regions (summary.json's client_avg)."""
    cases: dict[tuple[str, str], list[float]] = defaultdict(list)
    for r in rows:
        cases[r["site"], r["case"]].append(r["value"])
    sites: dict[str, list[float]] = defaultdict(list)
    for (site, _), values in cases.items():
        sites[site].append(float(np.nanmean(values)))
    return float(np.mean([np.mean(v) for v in sites.values()]))


def _without_provenance(summary: dict) -> dict:
    return {k: v for k, v in summary.items() if k != "provenance"}


def test_experiment_with_an_in_memory_federation_leaves_the_process_as_it_was(tmp_path, tiny_config, disc_federation):
    cfg = tiny_config(algorithms=["fedavg"], fl={"rounds": 1}, eval={"hd95": False, "local_models": False})
    fed = disc_federation(n_sites=2, cases_per_site=8)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(2)  # the run sets threads=1 (cfg.threads)
        _seed_everything(1234)
        results = Experiment(cfg, tmp_path / "run", federation=fed, progress=False).run(report=False)
        assert torch.get_num_threads() == 2 and torch.initial_seed() == 1234
        after = _draws()
        _seed_everything(1234)
        assert after == _draws()  # the generators continue as if no run had happened
        with pytest.raises(FileExistsError):  # fails after the run set torch's threads: restored all the same
            Experiment(cfg, tmp_path / "run", federation=fed, progress=False).run()
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(threads)
    assert results.summary["dataset"] == "discs" and not results.report_path.exists()
    # eval.hd95 off: no HD95. summary.json is strict JSON (null, not NaN: R's jsonlite and JSON.parse refuse NaN)
    text = (tmp_path / "run" / "summary.json").read_text()
    strict = json.loads(text, parse_constant=lambda name: pytest.fail(f"summary.json holds {name}"))
    assert strict["algorithms"]["fedavg"]["hd95"]["client_avg"] is None and math.isnan(results.hd95()["fedavg"])
    assert results.report().is_file()  # the report reads the nulls as missing
    again = Experiment.from_run(tmp_path / "run", federation=fed, progress=False).run(resume=True)
    assert _without_provenance(again.summary) == _without_provenance(results.summary)


def _seed_everything(seed: int) -> None:
    torch.manual_seed(seed)
    random.seed(seed)
    np.random.seed(seed)


def _draws() -> tuple[float, float, float]:
    return float(torch.rand(1)), random.random(), float(np.random.rand())


def test_bad_configs_and_missing_runs_are_named(tmp_path, tiny):
    with pytest.raises(ConfigError, match=r"config: fl\.rounds"):
        Experiment({**tiny, "fl": {"rounds": 0}}, tmp_path)
    with pytest.raises(ConfigError, match="nope"):
        Experiment({**tiny, "nope": 1}, tmp_path)
    with pytest.raises(TypeError, match="RunConfig, a dict or a YAML file path"):
        Experiment(3, tmp_path)
    with pytest.raises(FileNotFoundError, match="summary.json"):
        Results.load(tmp_path)
    with pytest.raises(FileNotFoundError, match="config.yaml"):
        Experiment.from_run(tmp_path)
    with pytest.raises(ValueError, match=r"unknown algorithm 'fedavgg'; did you mean 'fedavg'\?$") as raised:
        Experiment({**tiny, "algorithms": ["fedavgg"]}, tmp_path / "typo", progress=False).run()
    assert not (tmp_path / "typo").exists() and isinstance(raised.value, KeyError)  # also what a look-up raises
    copy = pickle.loads(pickle.dumps(raised.value))  # as from a worker process
    assert type(copy) is type(raised.value) and str(copy) == str(raised.value) and copy.name == "fedavgg"


def test_a_runconfig_changed_after_it_was_built_is_validated_again_before_anything_is_written(tmp_path, tiny_config):
    cfg = tiny_config()
    cfg.fl.rounds = 0  # pydantic does not check an assignment
    with pytest.raises(ConfigError, match=r"^config: fl\.rounds must be at least 1, got 0$"):
        Experiment(cfg, tmp_path / "run")
    experiment = Experiment(tiny_config(), tmp_path / "run", progress=False)
    experiment.config.fl.rounds = "abc"  # type: ignore[assignment]
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no pydantic serializer warning on the way
        with pytest.raises(ConfigError, match=r"^config: fl\.rounds must be an integer, got 'abc'$"):
            experiment.run()
    assert not (tmp_path / "run").exists()
    assert Experiment(tiny_config(), tmp_path).config == tiny_config()  # a valid one: an equal copy


def test_results_load_names_a_bad_summary_and_shows_an_interrupted_run(tmp_path, tiny_config):
    path = tmp_path / "summary.json"
    entry = {"dice": {"client_avg": 0.5, "global": 0.5, "site1": 0.5}, "hd95": {"client_avg": 2.0}}
    bad = {
        "": r"summary.json: empty \(a copy cut short\?\); `fedseg run` with the run's command and --resume writes",
        '{"algorithms": {"local"': r"summary.json: not valid JSON \(Expecting ':' delimiter: line 1 column 24",
        "[1, 2]": "summary.json: not a JSON object but a list",
        json.dumps({"sites": ["site1"], "algorithms": ["local"]}): "summary.json: algorithms is a list, not an object",
        json.dumps({"sites": ["site1"], "algorithms": {"local": 0.5}}): "summary.json: algorithms.local is a number",
        json.dumps({"sites": ["site1"], "algorithms": {"local": {}}}): "summary.json: algorithms.local holds no 'dice'",
        json.dumps({"algorithms": {"local": entry}, "sites": "site1"}): "summary.json: sites is a string",
    }
    for text, message in bad.items():
        path.write_text(text)
        with pytest.raises(ValueError, match=message):
            Results.load(tmp_path)
    path.write_bytes(b"\xff\xfe{}")
    with pytest.raises(ValueError, match="summary.json: not UTF-8 text"):
        Results.load(tmp_path)

    # an interrupted run: config.yaml lists two algorithms, summary.json holds the one that finished
    (tmp_path / "config.yaml").write_text(dump_config(tiny_config(algorithms=["local", "fedavg"])))
    path.write_text(json.dumps({"dataset": "discs", "sites": ["site1"], "algorithms": {"local": entry}}))
    half = Results.load(tmp_path)
    assert half.algorithms == ["local"] and half.missing == ["fedavg"] and not half.finished
    assert repr(half).endswith("test Dice local 0.5000; not finished: fedavg)")
    path.write_text(
        json.dumps({"dataset": "discs", "sites": ["site1"], "algorithms": {"local": entry, "fedavg": entry}})
    )
    whole = Results.load(tmp_path)
    assert whole.missing == [] and whole.finished and "not finished" not in repr(whole)
    assert math.isnan(whole.hd95("site1")["local"]) and math.isnan(whole.nsd()["local"])


def test_example_script(tmp_path):
    """examples/python_api.py as a user runs it (a fresh process: its registrations are its own)."""
    out = tmp_path / "example"
    env = {**os.environ, "FEDSEG_EXAMPLE_OUT": str(out)}
    done = subprocess.run(
        [sys.executable, str(EXAMPLE)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    for name in ("fedavg", "fedavg-equal"):
        assert any(line.startswith(f"test Dice {name}: 0.") for line in lines), done.stdout
    summary = json.loads((out / "retina" / "summary.json").read_text())
    assert list(summary["algorithms"]) == ["fedavg", "fedavg-equal"] and summary["dataset"] == "synthetic-retina"
    assert summary["algorithms"]["fedavg-equal"]["display_name"] == "FedAvg (equal weights)"
    assert (out / "retina" / "report.html").is_file()
    assert (out / "retina" / "model" / "fedavg-equal" / "weights.safetensors").is_file()
    squares = json.loads((out / "squares" / "summary.json").read_text())
    assert squares["dataset"] == "squares" and squares["sites"] == ["hospital1", "hospital2"]
    assert any(line.startswith("test Dice fedavg-equal on squares: ") for line in lines)


def test_results_nsd_reads_summary_json_and_is_nan_for_a_run_written_before_it(tmp_path):
    entry = {"dice": {"client_avg": 0.8, "site1": 0.7}, "hd95": {"client_avg": 3.0, "site1": 4.0}}
    summary = {"algorithms": {"fedavg": {**entry, "nsd": {"client_avg": 0.6, "site1": 0.5}}, "old": entry}}
    results = Results(tmp_path, summary)
    nsd = results.nsd()
    assert nsd["fedavg"] == 0.6 and math.isnan(nsd["old"]) and results.nsd("site1")["fedavg"] == 0.5
    assert results.hd95() == {"fedavg": 3.0, "old": 3.0}


def test_a_script_that_registers_a_method_runs_every_cli_command_with_it(tmp_path):
    """docs/api.md's pattern for the command line: mymethods_cli.py registers the method, then hands over to
    fedseg's CLI; its `run` trains the method on the worker pool (whose processes import the script again) and a
    second `run --resume` reuses the finished run. The script is the page's, read from it."""
    page = (ROOT / "docs" / "api.md").read_text()
    script = page.split("# mymethods_cli.py\n", 1)[1].split("```", 1)[0]
    (tmp_path / "mymethods_cli.py").write_text(script)
    (tmp_path / "mymethods.py").write_text(
        "from fedseg import FedAvgServer\n\n\nclass EqualWeights(FedAvgServer):\n"
        "    def aggregation_weights(self, replies):\n        return {site: 1.0 for site in replies}\n"
    )
    out = tmp_path / "eq"
    args = [sys.executable, "mymethods_cli.py", "run", "--preset", "demo", "--algorithms", "fedavg-equal"]
    args += ["--rounds", "1", "--workers", "2", "--threads", "1", "--out", str(out)]
    args += ["--set", "data.scale=0.05", "--set", "data.image_size=32", "--set", "model.channels=[4,8,16]"]
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    first = subprocess.run(args, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert first.returncode == 0, first.stdout + first.stderr
    summary = json.loads((out / "summary.json").read_text())
    assert list(summary["algorithms"]) == ["fedavg-equal"]
    again = subprocess.run([*args, "--resume"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert again.returncode == 0 and "has finished" in again.stdout + again.stderr, again.stdout + again.stderr


RESULTS_HEADER = "algorithm,model,site,case,region,metric,value"
ROUND_ROWS = "algorithm,round,site,val_dice,train_loss\nfedavg,1,site1,0.5,0.9\n"
ENTRY = {"dice": {"client_avg": 0.5, "global": 0.5, "site1": 0.5}}


def _fake_run(out: Path, results: str | bytes | None, rounds: str | None = ROUND_ROWS) -> Path:
    """A run folder holding summary.json (fedavg finished) and the given results.csv / rounds.csv (None: none)."""
    out.mkdir(parents=True, exist_ok=True)
    summary = {"dataset": "discs", "sites": ["site1"], "regions": ["disc"], "algorithms": {"fedavg": ENTRY}}
    (out / "summary.json").write_text(json.dumps(summary))
    for name, content in (("results.csv", results), ("rounds.csv", rounds)):
        if isinstance(content, bytes):
            (out / name).write_bytes(content)
        elif content is not None:
            (out / name).write_text(content)
    return out


def test_cases_and_rounds_read_the_run_files_as_the_report_does(tmp_path):
    """A damaged results.csv or rounds.csv is the report's one-line ValueError naming the file (not a garbage row, a
    bare UnicodeDecodeError or KeyError); a missing one of a run with finished algorithms says to resume it."""
    from fedseg.presentation.kit import load_run

    row = "fedavg,global,site1,c1,disc,dice,0.8"
    damaged = {
        f"{RESULTS_HEADER}\n{row}\nfedavg,global,site1,c2\n": r"results.csv: line 3 has 4 fields, the header 7 \(cut",
        b"\x89PNG\r\n\x1a\n\x00\xff": r"results.csv: not UTF-8 text",
        "algorithm,site,case,value\nfedavg,site1,c1,0.8\n": r"results.csv: no column 'model'",
        f"{RESULTS_HEADER}\nfedavg,global,site1,c1,disc,dice,abc\n": r"results.csv: line 2: value 'abc' is not a",
    }
    for content, message in damaged.items():
        out = _fake_run(tmp_path / "damaged", content)
        results = Results.load(out)
        with pytest.raises(ValueError, match=message) as raised:
            results.cases()
        with pytest.raises(ValueError) as report_said:
            load_run(out)  # what Results.report() reads
        assert str(raised.value) == str(report_said.value) and "\n" not in str(raised.value)
    out = _fake_run(tmp_path / "rounds", f"{RESULTS_HEADER}\n{row}\n", "algorithm,round,site\nfedavg,1,site1\n")
    with pytest.raises(ValueError, match=r"rounds.csv: no column 'val_dice' \(its header: algorithm,round,site\)"):
        Results.load(out).rounds()
    (out / "rounds.csv").write_text(ROUND_ROWS + "fedavg,2,si")
    with pytest.raises(ValueError, match=r"rounds.csv: line 3 has 3 fields, the header 5 \(cut short\?\)"):
        Results.load(out).rounds()
    (out / "rounds.csv").write_text(ROUND_ROWS + "fedavg,,site1,0.5,0.1\n")
    with pytest.raises(ValueError, match=r"rounds.csv: row 2: round '' is not a round number"):
        Results.load(out).rounds()
    (out / "rounds.csv").write_text(ROUND_ROWS)
    assert Results.load(out).rounds() == [
        {"algorithm": "fedavg", "round": 1, "site": "site1", "val_dice": 0.5, "train_loss": 0.9}
    ]

    missing = Results.load(_fake_run(tmp_path / "missing", None, None))
    for read in (missing.cases, missing.rounds):
        with pytest.raises(FileNotFoundError, match=r"results.csv|rounds.csv") as raised:
            read()
        assert "missing, though summary.json lists finished algorithms (fedavg)" in str(raised.value)
        assert "resume it to write it again (results.resume()" in str(raised.value) and "\n" not in str(raised.value)
    whole = Results.load(_fake_run(tmp_path / "whole", f"{RESULTS_HEADER}\n{row}\n"))
    assert [r["value"] for r in whole.cases(metric="dice")] == [0.8]
    assert whole.cases(metric="nsd") == [] and whole.cases(model="global", metric="hd95") == []  # no match: no rows
    assert Results(tmp_path / "none", {"sites": ["site1"], "algorithms": {}}).cases() == []  # nothing finished yet


def test_relative_folders_are_resolved_when_the_objects_are_made(tmp_path, monkeypatch, tiny_config, disc_federation):
    """``Experiment(cfg, "runs/rel")`` and ``Results.load("runs/rel")`` keep reading and writing there after a chdir."""
    here, elsewhere = tmp_path / "here", tmp_path / "elsewhere"
    here.mkdir(), elsewhere.mkdir()
    cfg = tiny_config(algorithms=["fedavg"], fl={"rounds": 1}, eval={"hd95": False, "local_models": False})
    fed = disc_federation(n_sites=2, cases_per_site=8)
    monkeypatch.chdir(here)
    experiment = Experiment(cfg, "runs/rel", federation=fed, progress=False)
    assert experiment.out == here / "runs" / "rel" and experiment.out.is_absolute()
    monkeypatch.chdir(elsewhere)  # after the experiment was made: it still trains into here/runs/rel
    results = experiment.run(report=False)
    assert (here / "runs" / "rel" / "summary.json").is_file() and not (elsewhere / "runs").exists()
    monkeypatch.chdir(here)
    loaded = Results.load("runs/rel")
    monkeypatch.chdir(elsewhere)
    for r in (results, loaded):
        assert r.out == here / "runs" / "rel" and r.cases(metric="dice")
        assert r.model_dir("fedavg") == here / "runs" / "rel" / "model" / "fedavg" and r.rounds()
        assert r.report() == here / "runs" / "rel" / "report.html" and r.report_path.is_file()
    assert loaded.resume(federation=fed, progress=False).out == here / "runs" / "rel"
    assert not (elsewhere / "runs").exists()
    assert Results(Path("x"), {}).out == elsewhere / "x"


def test_experiment_checks_names_options_device_and_source_when_made(tmp_path, tiny, disc_federation):
    """The checks run() makes before any work that need no data fail at ``Experiment(...)`` already, each a
    ValueError (the base class of ConfigError, FederationError and UnknownAlgorithm); nothing is written."""
    from fedseg.algorithms import UnknownAlgorithm

    out = tmp_path / "run"
    bad = {
        "algorithms": (["fedavgg"], UnknownAlgorithm, r"unknown algorithm 'fedavgg'; did you mean 'fedavg'\?$"),
        "methods": (
            {"fedprox": {"muu": 0.1}},
            ValueError,
            r"^methods\.fedprox\.muu: unknown key \(did you mean .mu.\?\)$",
        ),
        "device": ("tpu", ValueError, r"^device 'tpu': not a torch device; use cpu, cuda"),
        "data": ({**tiny["data"], "source": "nope"}, FederationError, r"unknown data.source 'nope'; available: folder"),
    }
    for key, (value, kind, message) in bad.items():
        with pytest.raises(kind, match=message) as raised:
            Experiment({**tiny, key: value}, out, progress=False)  # no run(): made, not run
        assert isinstance(raised.value, ValueError) and "register it again" not in str(raised.value)
    assert not out.exists()
    given = Experiment({**tiny, "data": bad["data"][0]}, out, federation=disc_federation(n_sites=2), progress=False)
    assert given.config.data.source == "nope"  # an in-memory federation replaces data.source: not checked


def test_a_run_on_a_missing_device_and_an_unknown_algorithm_point_at_what_works(tmp_path, tiny):
    """``Experiment.from_run`` of a run recorded on a device this machine lacks points at ``Results.load``, which
    reads it; ``model_dir`` of an algorithm the run lacks is an UnknownAlgorithm (KeyError and ValueError, as
    ``dice`` raises ValueError) naming the closest."""
    from fedseg.algorithms import UnknownAlgorithm

    out = _fake_run(tmp_path / "run", f"{RESULTS_HEADER}\nfedavg,global,site1,c1,disc,dice,0.5\n")
    (out / "config.yaml").write_text(yaml.safe_dump({**tiny, "device": "cuda:7"}))
    if not torch.cuda.is_available() or torch.cuda.device_count() < 8:
        with pytest.raises(ValueError, match=r"^device 'cuda:7': .* or use Results\.load\(.*records the device") as e:
            Experiment.from_run(out)
        assert "device=cpu" not in str(e.value)  # a resume keeps the device: no advice to switch it
    loaded = Results.load(out)
    assert loaded.dice() == {"fedavg": 0.5}
    with pytest.raises(UnknownAlgorithm, match=r"^model_dir\('fedavgg'\): .* did you mean 'fedavg'\? choose one"):
        loaded.model_dir("fedavgg")
    with pytest.raises(KeyError, match=r"^site_models\('fedsm'\): "):
        loaded.site_models("fedsm")
    with pytest.raises(ValueError, match=r"^bundle\('fedsm'\): "):
        loaded.bundle("fedsm")


def test_load_config_takes_one_override_string_or_a_mapping_and_names_a_preset_given_as_a_file(tmp_path, monkeypatch):
    listed = fedseg.load_config(preset="demo", overrides=["fl.rounds=3", "algorithms=[local, fedavg]"])
    assert fedseg.load_config(preset="demo", overrides="fl.rounds=3").fl.rounds == 3
    mapped = fedseg.load_config(preset="demo", overrides={"fl.rounds": 3, "algorithms": ("local", "fedavg")})
    assert mapped == listed
    assert fedseg.load_config(preset="demo", overrides={"train.lr": 1e-5, "data.root": None}).train.lr == 1e-5
    with pytest.raises(ConfigError, match=r"fl\.rounds"):
        fedseg.load_config(preset="demo", overrides={"fl.rounds": 0})  # validated as --set fl.rounds=0 is
    with pytest.raises(TypeError, match=r"overrides: got int; expected 'key.sub=value', a list of them or a mapping"):
        fedseg.load_config(preset="demo", overrides=3)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"overrides: item 3 \(int\) is not a string"):
        fedseg.load_config(preset="demo", overrides=["fl.rounds=2", 3])  # type: ignore[list-item]
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError, match=r"^demo: config file not found; 'demo' is a preset: pass load_config\(pres"):
        Experiment("demo", tmp_path / "run")
    with pytest.raises(ConfigError, match=r"^nodemo: config file not found$"):
        Experiment("nodemo", tmp_path / "run")


def test_resuming_a_registered_federation_unregistered_says_to_register_it_again(
    registry, tmp_path, tiny_config, disc_federation
):
    """As for a registered method: a fresh process (a restarted kernel) that did not register the federation again."""
    from fedseg.data.sources import UnknownSource

    register_federation("test-blobs", lambda cfg: disc_federation(n_sites=2, cases_per_site=8), sites=2)
    cfg = tiny_config(algorithms=["fedavg"], data={"source": "test-blobs"}, fl={"rounds": 1}, eval={"hd95": False})
    out = tmp_path / "run"
    results = Experiment(cfg, out, progress=False).run(report=False)
    experiment = Experiment(cfg, out, progress=False)
    unregister_federation("test-blobs")
    hint = r"unknown data.source 'test-blobs'; available: .*register it again \(fedseg.data.sources.register_fed"
    with pytest.raises(FederationError, match=hint + r"eration\) before resuming its run$"):
        experiment.run(resume=True)
    for resume in (results.resume, lambda **kw: Experiment(cfg, out, **kw).run(resume=True)):
        with pytest.raises(FederationError, match=hint) as raised:
            resume(progress=False)
        assert isinstance(raised.value, UnknownSource) and raised.value.name == "test-blobs"
    with pytest.raises(FederationError, match=r"^unknown data.source 'test-blobs'; available: [^;]*$"):
        Experiment(cfg, tmp_path / "other", progress=False)  # no run there: no resume, no hint
    copy = pickle.loads(pickle.dumps(raised.value))
    assert type(copy) is UnknownSource and str(copy) == str(raised.value) and copy.name == "test-blobs"
