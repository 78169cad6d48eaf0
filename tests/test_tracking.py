"""Experiment tracking (fedseg.tracking): what a run writes to TensorBoard, MLflow and W&B (offline), read back
with the libraries' own readers, checked against the run's own files (rounds.csv, round_metrics.csv, summary.json)."""

from __future__ import annotations

import csv
import importlib.util
import json
import math
import os
import subprocess
import sys

import pytest
import yaml
from typer.testing import CliRunner

from fedseg.config_load import ConfigError, config_from_cli, load_config
from fedseg.run import run_experiment
from fedseg.tracking import WANDB_DIR, WANDB_IDS, TrackingUnavailable, final_metrics, metric_name, wandb_group

runner = CliRunner()
needs_extra = pytest.mark.skipif(
    not all(importlib.util.find_spec(p) for p in ("tensorboard", "mlflow")),
    reason="needs the tracking extra: pip install 'fedseg[tracking]'",
)
needs_wandb = pytest.mark.skipif(
    not importlib.util.find_spec("wandb"), reason="needs the wandb extra: pip install 'fedseg[wandb]'"
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


class Stop(Exception):
    """Raised by :func:`stop` to interrupt a run after FedAvg's first round (the resume tests)."""


def stop(name, rnd, losses):
    """``on_round_end`` observer: stop the run once FedAvg's round 1 is checkpointed."""
    if (name, rnd) == ("fedavg", 1):
        raise Stop


@needs_extra
def test_resumed_run_continues_the_same_tracking_runs_without_repeating_a_round(
    tmp_path, tiny_config, disc_federation, monkeypatch
):
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
    from fedseg.data.folder_write import write_folder

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
    assert cli("wandb", "mlflow").tracking == ["wandb", "mlflow"]
    with pytest.raises(ConfigError, match="tracking"):
        cli("comet")


@pytest.mark.parametrize("missing, extra", [("tensorboard", "tracking"), ("mlflow", "tracking"), ("wandb", "wandb")])
def test_tracking_without_its_package_fails_before_any_work_naming_the_extra(
    missing, extra, tmp_path, tiny_config, disc_federation, monkeypatch
):
    monkeypatch.setitem(sys.modules, missing, None)  # `import <missing>` raises ImportError
    out = tmp_path / "run"
    with pytest.raises(TrackingUnavailable, match=rf"pip install 'fedseg\[{extra}\]'") as e:
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


# --- Weights & Biases (offline) ----------------------------------------------------------------
NO_SERVER = "http://127.0.0.1:9"  # a W&B server that refuses every connection: trying to reach one fails the test


def _wandb_env() -> dict[str, str]:
    """The environment without the user's W&B settings (what fedseg does by default, offline, is tested), and
    W&B's server address at :data:`NO_SERVER`."""
    return {**{k: v for k, v in os.environ.items() if not k.startswith("WANDB_")}, "WANDB_BASE_URL": NO_SERVER}


def _wandb_segments(out) -> dict[str, list[list[dict]]]:
    """``{run id: [records of each offline-run folder of that W&B run]}``, the folders in the order ``wandb sync``
    uploads them (start time), each read with W&B's own reader of its transaction log (``wandb leet inspect``)."""
    segments: dict[str, list[tuple[str, list[dict]]]] = {}
    for folder in (out / WANDB_DIR).glob("offline-run-*"):
        command = [sys.executable, "-m", "wandb", "leet", "inspect", "--json", str(folder)]
        env = {**_wandb_env(), "WANDB_MODE": "offline", "WANDB_ERROR_REPORTING": "false"}
        read = subprocess.run(command, capture_output=True, text=True, timeout=120, env=env)
        assert read.returncode == 0, read.stderr
        records = [json.loads(line) for line in read.stdout.splitlines() if line.strip()]
        (run,) = [r["run"] for r in records if r["type"] == "run"]
        segments.setdefault(run["run_id"], []).append((run["start_time"], records))
    return {i: [records for _, records in sorted(s, key=lambda t: t[0])] for i, s in segments.items()}


def _of(records: list[dict], kind: str) -> list[dict]:
    return [r[kind] for r in records if r["type"] == kind]


def _wandb_history(segments: list[list[dict]]) -> dict[int, dict]:
    """``{step: logged row}`` over the segments of one W&B run (a step logged twice fails)."""
    rows = [h for records in segments for h in _of(records, "history")]
    steps = [int(h["step"]["num"]) for h in rows]
    assert len(set(steps)) == len(steps), f"a step logged twice: {steps}"
    return {int(h["step"]["num"]): h["item"] for h in rows}


def _wandb_summary(segments: list[list[dict]]) -> dict:
    """The run's summary as W&B builds it: every update, in order."""
    summary: dict = {}
    for records in segments:
        for update in _of(records, "summary"):
            summary.update(update.get("update", {}))
    return summary


def _saved_files(records: list[dict]) -> set[str]:
    return {f["path"] for files in _of(records, "files") for f in files["files"]}


@pytest.fixture(scope="module")
def wandb_tracked(tmp_path_factory, disc_federation):
    """``fedseg run --track wandb`` (fedavg and FedSM, 2 rounds, tiny) in a process of its own, as a user runs it:
    its terminal output, and the run directory."""
    from fedseg.data.folder_write import write_folder

    tmp = tmp_path_factory.mktemp("wandb")
    root = write_folder(disc_federation(n_sites=2, cases_per_site=8), tmp / "fed")
    out = tmp / "run"
    sets = ["model.channels=[4,8,16]", "data.image_size=32", "train.batch_size=4", "threads=1", "eval.hd95=false"]
    sets += ["methods.fedsm.selector_width=0.0625"]
    command = [sys.executable, "-m", "fedseg.cli", "run", "--preset", "demo", "--data", str(root)]
    command += ["--algorithms", "fedavg,fedsm", "--rounds", "2", "--out", str(out), "--track", "wandb"]
    command += [a for s in sets for a in ("--set", s)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=600, env=_wandb_env(), cwd=tmp)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout + done.stderr, out


@needs_wandb
def test_wandb_offline_runs_hold_each_round_the_test_results_config_and_report(wandb_tracked):
    output, out = wandb_tracked
    assert "wandb:" not in output and "W&B" not in output  # W&B prints nothing on fedseg's terminal
    ids = json.loads((out / WANDB_DIR / WANDB_IDS).read_text())
    assert sorted(ids) == ["fedavg", "fedsm"]
    segments = _wandb_segments(out)
    assert sorted(segments) == sorted(ids.values())  # one W&B run per algorithm, nothing else
    rounds = _read_csv(out / "rounds.csv")
    metrics = _read_csv(out / "round_metrics.csv")
    summary = json.loads((out / "summary.json").read_text())["algorithms"]
    config = yaml.safe_load((out / "config.yaml").read_text())
    for algorithm, run_id in ids.items():
        first, report = segments[run_id]  # the training, then the report added to it (a continuation)
        (run,) = _of(first, "run")
        assert run["display_name"] == algorithm and run["run_group"] == wandb_group(out)
        assert run["project"] == config["name"] and run["telemetry"]["feature"]["offline"]
        params = _of(first, "run")[0]["config"]["update"]
        assert params["train.lr"] == 0.001 and params["fl.rounds"] == 2 and params["algorithm"] == algorithm
        assert params["model.channels"] == "[4, 8, 16]" and params["methods.fedsm.selector_width"] == 0.0625
        assert all(_of(records, "exit")[0]["exit_code"] == 0 for records in (first, report))

        history = _wandb_history(segments[run_id])
        assert sorted(history) == [1, 2]
        mine = [r for r in rounds if r["algorithm"] == algorithm]
        assert len(mine) == 4  # 2 sites x 2 rounds
        for row in mine:
            assert _same(history[int(row["round"])][metric_name("val_dice", row["site"])], float(row["val_dice"]))
            assert _same(history[int(row["round"])][metric_name("train_loss", row["site"])], float(row["train_loss"]))
        for rnd in (1, 2):
            finite = [float(r["val_dice"]) for r in mine if int(r["round"]) == rnd and r["val_dice"] != "nan"]
            assert _same(history[rnd]["val_dice/mean"], sum(finite) / len(finite))
        assert history[1]["ledger/sgd_steps"] < history[2]["ledger/sgd_steps"] == summary[algorithm]["sgd_steps"]

        final = _wandb_summary(segments[run_id])
        for key, value in summary[algorithm]["dice"].items():
            assert _same(final[f"test/dice/{key}"], value)
        assert final["best_round"] == summary[algorithm]["best_round"]
        assert final["total/floats_sent"] == summary[algorithm]["floats_sent"]
        assert final["cost/simulated_seconds"] == pytest.approx(summary[algorithm]["cost"]["simulated_seconds"])

        folders = sorted((out / WANDB_DIR).glob(f"offline-run-*-{run_id}*"))
        assert len(folders) == 2 and "fedseg-config.yaml" in _saved_files(first)
        assert yaml.safe_load((folders[0] / "files" / "fedseg-config.yaml").read_text()) == config
        assert "report.html" in _saved_files(report)
        assert (folders[1] / "files" / "report.html").read_bytes() == (out / "report.html").read_bytes()
    selector = [r for r in metrics if r["algorithm"] == "fedsm" and r["metric"] == "selector_acc"]
    assert selector, "FedSM reports its selector's accuracy per round"
    history = _wandb_history(segments[ids["fedsm"]])
    for row in selector:  # method metrics: <metric>/<site>
        assert _same(history[int(row["round"])][metric_name("selector_acc", row["site"])], float(row["value"]))


@needs_wandb
def test_resumed_run_continues_the_same_wandb_run_without_repeating_a_round(
    tmp_path, tiny_config, disc_federation, monkeypatch
):
    for key in [k for k in os.environ if k.startswith("WANDB_")]:
        monkeypatch.delenv(key)
    monkeypatch.setenv("WANDB_BASE_URL", NO_SERVER)
    cfg = tiny_config(algorithms=["fedavg"], eval={"hd95": False, "local_models": False}, tracking=["wandb"])
    out = tmp_path / "run"
    federation = disc_federation(n_sites=2, cases_per_site=8)
    with pytest.raises(Stop):
        run_experiment(cfg, out, on_round_end=stop, federation=federation)
    run_experiment(cfg, out, resume=True, federation=federation)  # in the same process, as in a notebook

    ids = json.loads((out / WANDB_DIR / WANDB_IDS).read_text())
    segments = _wandb_segments(out)
    assert list(segments) == [ids["fedavg"]]  # the same W&B run, continued
    before, after = segments[ids["fedavg"]]
    assert sorted(_wandb_history([before])) == [1] and sorted(_wandb_history([after])) == [2]
    assert _of(before, "exit")[0]["exit_code"] == 1 and _of(after, "exit")[0]["exit_code"] == 0
    history = _wandb_history([before, after])  # asserts: no step twice
    for row in _read_csv(out / "rounds.csv"):
        assert _same(history[int(row["round"])][metric_name("val_dice", row["site"])], float(row["val_dice"]))
    final = _wandb_summary([before, after])
    assert "test/dice/client_avg" in final and "test/dice/client_avg" not in _wandb_summary([before])


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
