"""The Python API (fedseg.api, the names exported by ``fedseg``): Experiment, Results, register_algorithm,
register_federation, and examples/python_api.py run as a user would."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
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
from fedseg.algorithms import ALGORITHMS, unregister_algorithm
from fedseg.cli import app
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
    with pytest.raises(TypeError, match="AlgorithmSpec"):
        register_algorithm("test-x")
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


def _without_provenance(summary: dict) -> dict:
    return {k: v for k, v in summary.items() if k != "provenance"}


def test_experiment_with_an_in_memory_federation(tmp_path, tiny_config, disc_federation):
    cfg = tiny_config(algorithms=["fedavg"], fl={"rounds": 1}, eval={"hd95": False, "local_models": False})
    fed = disc_federation(n_sites=2, cases_per_site=8)
    results = Experiment(cfg, tmp_path / "run", federation=fed, progress=False).run(report=False)
    assert results.summary["dataset"] == "discs" and not results.report_path.exists()
    again = Experiment.from_run(tmp_path / "run", federation=fed, progress=False).run(resume=True)
    assert _without_provenance(again.summary) == _without_provenance(results.summary)


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
