"""Experiment tracking (fedseg.tracking): what a run writes to TensorBoard and MLflow, read back with the
libraries' own readers, checked against the run's own files (rounds.csv, round_metrics.csv, summary.json)."""

from __future__ import annotations

import csv
import importlib.util
import json
import math
import sys

import pytest
import yaml
from typer.testing import CliRunner

from fedseg.config import ConfigError, config_from_cli, load_config
from fedseg.run import run_experiment
from fedseg.tracking import TrackingUnavailable, final_metrics, metric_name

runner = CliRunner()
needs_extra = pytest.mark.skipif(
    not all(importlib.util.find_spec(p) for p in ("tensorboard", "mlflow")),
    reason="needs the tracking extra: pip install 'fedseg[tracking]'",
)
FEDSM = {"selector_width": 0.0625}  # a tiny selector


def _cfg(tiny_config, **overrides):
    base = {
        "algorithms": ["fedavg", "fedsm"],
        "eval": {"hd95": False},
        "methods": {"fedsm": FEDSM},
        "tracking": ["tensorboard", "mlflow"],
    }
    return tiny_config(**{**base, **overrides})


def _read_csv(path):
    with open(path) as f:
        return list(csv.DictReader(f))


def _scalars(out, algorithm) -> dict[str, dict[int, float]]:
    """``{tag: {step: value}}`` of ``out/tb/<algorithm>/`` (TensorBoard's reader, purged as TensorBoard shows it)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(out / "tb" / algorithm))
    acc.Reload()
    return {tag: {e.step: e.value for e in acc.Scalars(tag)} for tag in acc.Tags()["scalars"]}


def _mlflow(out, monkeypatch, uri: str | None = None):
    """An MlflowClient on the run's store (default ``out/mlruns``)."""
    from mlflow.tracking import MlflowClient

    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # MLflow 3's file store is opt-in
    return MlflowClient(tracking_uri=uri or (out / "mlruns").resolve().as_uri())


def _runs(client) -> dict:
    """``{run name: Run}`` over every experiment of the store (one run per algorithm expected)."""
    ids = [e.experiment_id for e in client.search_experiments()]
    runs = client.search_runs(ids)
    assert len({r.info.run_name for r in runs}) == len(runs), "one tracking run per algorithm"
    return {r.info.run_name: r for r in runs}


def _history(client, run, key) -> dict[int, float]:
    points = client.get_metric_history(run.info.run_id, key)
    assert len({p.step for p in points}) == len(points), f"{key}: a step logged twice"
    return {p.step: p.value for p in points}


def _same(a: float, b: float) -> bool:
    return (math.isnan(a) and math.isnan(b)) or a == pytest.approx(b, rel=1e-6, abs=1e-7)


@pytest.fixture(scope="module")
def tracked(tmp_path_factory, tiny_config, disc_federation):
    """A finished 2-round run of fedavg and FedSM with both trackers."""
    out = tmp_path_factory.mktemp("tracking") / "run"
    run_experiment(_cfg(tiny_config), out, federation=disc_federation())
    return out


@needs_extra
def test_tensorboard_has_each_rounds_validation_and_the_test_results(tracked):
    rounds = _read_csv(tracked / "rounds.csv")
    summary = json.loads((tracked / "summary.json").read_text())["algorithms"]
    assert sorted(p.name for p in (tracked / "tb").iterdir()) == ["fedavg", "fedsm"]  # one run per algorithm
    for algorithm in ("fedavg", "fedsm"):
        scalars = _scalars(tracked, algorithm)
        mine = [r for r in rounds if r["algorithm"] == algorithm]
        for row in mine:
            assert _same(scalars[metric_name("val_dice", row["site"])][int(row["round"])], float(row["val_dice"]))
        for rnd in (1, 2):
            values = [float(r["val_dice"]) for r in mine if int(r["round"]) == rnd]
            finite = [v for v in values if not math.isnan(v)]
            assert _same(scalars["val_dice/mean"][rnd], sum(finite) / len(finite))
            assert set(scalars) >= {"train_loss/mean", "ledger/floats_sent", "ledger/sgd_steps", "ledger/seconds"}
        for key, value in summary[algorithm]["dice"].items():
            assert _same(scalars[f"test/dice/{key}"][2], value)
        assert scalars["best_round"][2] == summary[algorithm]["best_round"]
        assert scalars["total/sgd_steps"][2] == summary[algorithm]["sgd_steps"]
    assert scalars["ledger/sgd_steps"][1] < scalars["ledger/sgd_steps"][2]  # the ledger so far, per round
    hparams = _hparams(tracked, "fedsm")
    assert hparams["train.lr"].number_value == pytest.approx(0.001) and hparams["algorithm"].string_value == "fedsm"
    assert hparams["model.channels"].string_value == "[4, 8, 16]"


def _hparams(out, algorithm) -> dict:
    """The HParams TensorBoard shows for ``out/tb/<algorithm>/`` (its hparams plugin's session start)."""
    from tensorboard.backend.event_processing.plugin_event_accumulator import EventAccumulator as PluginAccumulator
    from tensorboard.plugins.hparams import plugin_data_pb2

    acc = PluginAccumulator(str(out / "tb" / algorithm))
    acc.Reload()
    content = acc.PluginTagToContent("hparams")["_hparams_/session_start_info"]
    return dict(plugin_data_pb2.HParamsPluginData.FromString(content).session_start_info.hparams)


@needs_extra
def test_mlflow_has_one_run_per_algorithm_with_rounds_test_results_and_params(tracked, monkeypatch):
    client = _mlflow(tracked, monkeypatch)
    runs = _runs(client)
    assert sorted(runs) == ["fedavg", "fedsm"]
    rounds = _read_csv(tracked / "rounds.csv")
    metrics = _read_csv(tracked / "round_metrics.csv")
    summary = json.loads((tracked / "summary.json").read_text())["algorithms"]
    for algorithm, run in runs.items():
        assert run.info.status == "FINISHED"
        for row in (r for r in rounds if r["algorithm"] == algorithm):
            history = _history(client, run, metric_name("val_dice", row["site"]))
            assert sorted(history) == [1, 2]
            assert _same(history[int(row["round"])], float(row["val_dice"]))
        final = run.data.metrics
        for key, value in summary[algorithm]["dice"].items():
            assert _same(final[f"test/dice/{key}"], value)
        assert final["total/floats_sent"] == summary[algorithm]["floats_sent"]
        assert final["cost/simulated_seconds"] == pytest.approx(summary[algorithm]["cost"]["simulated_seconds"])
        if "local_avg" in summary[algorithm]:
            assert _same(final["test/local_avg"], summary[algorithm]["local_avg"])
        params = run.data.params
        assert params["train.lr"] == "0.001" and params["fl.rounds"] == "2" and params["algorithm"] == algorithm
        assert params["model.channels"] == "[4, 8, 16]" and params["methods.fedsm.selector_width"] == "0.0625"
        assert "config.yaml" in [a.path for a in client.list_artifacts(run.info.run_id)]
    selector = [r for r in metrics if r["algorithm"] == "fedsm" and r["metric"] == "selector_acc"]
    assert selector, "FedSM reports its selector's accuracy per round"
    for row in selector:  # method metrics: <metric>/<site>
        history = _history(client, runs["fedsm"], metric_name("selector_acc", row["site"]))
        assert _same(history[int(row["round"])], float(row["value"]))


@needs_extra
def test_resumed_run_continues_the_same_tracking_runs_without_repeating_a_round(
    tmp_path, tiny_config, disc_federation, monkeypatch
):
    class Stop(Exception):
        pass

    def stop(name, rnd, losses):
        if (name, rnd) == ("fedavg", 1):
            raise Stop

    cfg = _cfg(tiny_config, algorithms=["fedavg"])
    out = tmp_path / "run"
    with pytest.raises(Stop):
        run_experiment(cfg, out, on_round_end=stop, federation=disc_federation())
    assert sorted(_scalars(out, "fedavg")["val_dice/mean"]) == [1]  # round 1's checkpoint is on disk
    run_experiment(cfg, out, resume=True, federation=disc_federation())

    client = _mlflow(out, monkeypatch)
    runs = _runs(client)
    assert list(runs) == ["fedavg"] and runs["fedavg"].info.status == "FINISHED"
    rounds = [r for r in _read_csv(out / "rounds.csv")]
    for row in rounds:
        history = _history(client, runs["fedavg"], metric_name("val_dice", row["site"]))  # asserts: no step twice
        assert sorted(history) == [1, 2] and _same(history[int(row["round"])], float(row["val_dice"]))
    scalars = _scalars(out, "fedavg")
    assert sorted(scalars["val_dice/mean"]) == [1, 2]
    for row in rounds:
        assert _same(scalars[metric_name("val_dice", row["site"])][int(row["round"])], float(row["val_dice"]))


@needs_extra
def test_cli_track_options_log_the_report_as_an_artifact(tmp_path, disc_federation, monkeypatch):
    from fedseg.cli import app
    from fedseg.data.folder import write_folder

    root = write_folder(disc_federation(n_sites=2, cases_per_site=8), tmp_path / "fed")
    out = tmp_path / "run"
    sets = ["model.channels=[4,8,16]", "data.image_size=32", "train.batch_size=4", "threads=1", "eval.hd95=false"]
    args = ["run", "--preset", "demo", "--data", str(root), "--algorithms", "fedavg", "--rounds", "1"]
    args += [a for s in sets for a in ("--set", s)]
    result = runner.invoke(app, [*args, "--out", str(out), "--track", "tensorboard", "--track", "mlflow"])
    assert result.exit_code == 0, result.output
    assert yaml.safe_load((out / "config.yaml").read_text())["tracking"] == ["tensorboard", "mlflow"]
    assert (out / "report.html").is_file() and (out / "tb" / "fedavg").is_dir()
    client = _mlflow(out, monkeypatch)
    run = _runs(client)["fedavg"]
    assert "report.html" in [a.path for a in client.list_artifacts(run.info.run_id)]


def test_track_option_and_set_give_the_same_tracking(tmp_path):
    both = ["tensorboard", "mlflow"]
    cli = lambda *track: config_from_cli("demo", None, None, None, None, None, [], tracking=track)  # noqa: E731
    assert cli("tensorboard", "mlflow").tracking == both
    assert cli("tensorboard,mlflow").tracking == both
    assert cli("mlflow, tensorboard", "mlflow").tracking == ["mlflow", "tensorboard"]  # duplicates dropped
    assert load_config(preset="demo", overrides=["tracking=[tensorboard, mlflow]"]).tracking == both
    assert load_config(preset="demo").tracking == [] and load_config(preset="demo").tracking_uri is None
    with pytest.raises(ConfigError, match="tracking"):
        cli("wandb")


@pytest.mark.parametrize("missing", ["tensorboard", "mlflow"])
def test_tracking_without_its_package_fails_before_any_work_naming_the_extra(
    missing, tmp_path, tiny_config, disc_federation, monkeypatch
):
    monkeypatch.setitem(sys.modules, missing, None)  # `import <missing>` raises ImportError
    out = tmp_path / "run"
    with pytest.raises(TrackingUnavailable, match=r"pip install 'fedseg\[tracking\]'") as e:
        run_experiment(_cfg(tiny_config, tracking=[missing]), out, federation=disc_federation(n_sites=2))
    assert missing in str(e.value)
    assert not out.exists()


def test_cli_names_the_extra_when_the_package_is_missing(tmp_path, monkeypatch):
    from fedseg.cli import app

    monkeypatch.setitem(sys.modules, "mlflow", None)
    out = tmp_path / "run"
    sets = ["--set", "data.scale=0.05", "--set", "data.image_size=32", "--set", "model.channels=[4,8,16]"]
    result = runner.invoke(app, ["run", "--preset", "demo", *sets, "--track", "mlflow", "--out", str(out)])
    assert result.exit_code == 1 and "pip install 'fedseg[tracking]'" in result.output
    assert "Traceback" not in result.output and not out.exists()


def test_tracking_is_off_by_default_and_writes_nothing(tmp_path, tiny_config, disc_federation):
    out = tmp_path / "run"
    cfg = tiny_config(algorithms=["fedavg"], fl={"rounds": 1}, eval={"hd95": False, "local_models": False})
    assert cfg.tracking == []
    run_experiment(cfg, out, federation=disc_federation(n_sites=2, cases_per_site=8))
    assert (out / "summary.json").is_file()
    assert not (out / "tb").exists() and not (out / "mlruns").exists()


@needs_extra
def test_tracking_uri_puts_mlflow_runs_elsewhere(tmp_path, tiny_config, disc_federation, monkeypatch):
    store = tmp_path / "store"
    cfg = tiny_config(
        algorithms=["fedavg"],
        fl={"rounds": 1},
        eval={"hd95": False, "local_models": False},
        tracking=["mlflow"],
        tracking_uri=store.as_uri(),
    )
    out = tmp_path / "run"
    run_experiment(cfg, out, federation=disc_federation(n_sites=2, cases_per_site=8))
    assert not (out / "mlruns").exists() and not (out / "tb").exists()
    client = _mlflow(out, monkeypatch, store.as_uri())
    run = _runs(client)["fedavg"]
    assert run.data.tags["fedseg.out"] == str(out.resolve())
    assert "test/dice/client_avg" in run.data.metrics


def test_metric_names_keep_only_portable_characters():
    assert metric_name("alpha@conv.0", "site 1") == "alpha_conv.0/site 1"
    assert metric_name("val_dice", "..") == "val_dice/_.."
    assert metric_name("a:b", "x/y") == "a_b/x_y"


def test_final_metrics_log_nsd_next_to_dice_and_hd95_and_skip_it_for_an_old_summary():
    entry = {
        "dice": {"site1": 0.8, "client_avg": 0.8, "global": 0.8},
        "hd95": {"site1": 3.0, "client_avg": 3.0, "global": 3.0},
        "nsd": {"site1": 0.6, "client_avg": 0.65, "global": 0.7},
    }
    metrics = final_metrics(entry)
    assert {k: v for k, v in metrics.items() if k.startswith("test/nsd/")} == {
        "test/nsd/site1": 0.6,
        "test/nsd/client_avg": 0.65,
        "test/nsd/global": 0.7,
    }
    assert metrics["test/hd95/global"] == 3.0
    old = final_metrics({k: v for k, v in entry.items() if k != "nsd"})
    assert not any(k.startswith("test/nsd/") for k in old) and old["test/dice/site1"] == 0.8
