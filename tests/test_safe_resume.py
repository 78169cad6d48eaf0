"""Checks before any work (fedseg.run.preflight): resume only with the recorded configuration, a usable device,
an ``--out`` that is (or can become) a folder."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import torch
import yaml
from PIL import Image
from typer.testing import CliRunner

from fedseg.cli import app
from fedseg.run import run_experiment
from fedseg.run.preflight import check_device, resume_conflicts

runner = CliRunner()
DEMO = ["run", "--preset", "demo", "--set", "model.channels=[4,8,16]", "--set", "data.image_size=32"]


def _small(tiny_config, **overrides):
    base = {"algorithms": ["fedavg"], "fl": {"rounds": 1}, "eval": {"hd95": False, "local_models": False}}
    return tiny_config(**{**base, **overrides})


@pytest.fixture(scope="module")
def finished(tmp_path_factory, tiny_config, disc_federation):
    """A finished 1-round fedavg run on 2 sites; tests resume copies of it."""
    out = tmp_path_factory.mktemp("safe_resume") / "run"
    run_experiment(_small(tiny_config), out, federation=disc_federation(n_sites=2, cases_per_site=8))
    return out


@pytest.fixture
def run_copy(finished, tmp_path):
    return shutil.copytree(finished, tmp_path / "run")


def _fed(disc_federation):
    return disc_federation(n_sites=2, cases_per_site=8)


def test_resume_with_changed_lr_or_rounds_refuses_listing_every_key(run_copy, tiny_config, disc_federation):
    recorded = (run_copy / "config.yaml").read_text()
    changed = _small(tiny_config, train={"lr": 0.01}, fl={"rounds": 2})
    with pytest.raises(ValueError) as e:
        run_experiment(changed, run_copy, resume=True, federation=_fed(disc_federation))
    assert "train.lr: 0.001 -> 0.01" in str(e.value) and "fl.rounds: 1 -> 2" in str(e.value)
    assert "to train a finished model for more rounds: a new run (another --out) of fedavg-continue" in str(e.value)
    assert (run_copy / "config.yaml").read_text() == recorded  # nothing rewritten
    with pytest.raises(ValueError) as e:  # another key only: no word of more rounds
        run_experiment(_small(tiny_config, train={"lr": 0.01}), run_copy, resume=True, federation=_fed(disc_federation))
    assert "train.lr: 0.001 -> 0.01" in str(e.value) and "more rounds" not in str(e.value)


def test_run_interrupted_in_its_first_algorithm_is_checked_too(tmp_path, tiny_config, disc_federation):
    """config.yaml is recorded before training, so a run cut before any algorithm finished is compared."""

    class Stop(Exception):
        pass

    def stop(name, rnd, losses):
        raise Stop

    cfg = _small(tiny_config, fl={"rounds": 2})
    with pytest.raises(Stop):
        run_experiment(cfg, tmp_path / "cut", on_round_end=stop, federation=_fed(disc_federation))
    assert not (tmp_path / "cut" / "summary.json").exists()
    assert yaml.safe_load((tmp_path / "cut" / "config.yaml").read_text())["train"]["lr"] == 0.001
    with pytest.raises(ValueError, match=r"train\.lr: 0\.001 -> 0\.01"):
        run_experiment(
            _small(tiny_config, fl={"rounds": 2}, train={"lr": 0.01}),
            tmp_path / "cut",
            resume=True,
            federation=_fed(disc_federation),
        )


def test_resume_with_other_threads_or_name_continues(run_copy, finished, tiny_config, disc_federation):
    try:
        run_experiment(
            _small(tiny_config, threads=2, name="renamed"), run_copy, resume=True, federation=_fed(disc_federation)
        )
    finally:
        torch.set_num_threads(1)
    dice = [json.loads((d / "summary.json").read_text())["algorithms"]["fedavg"]["dice"] for d in (finished, run_copy)]
    assert dice[0] == dice[1]
    assert yaml.safe_load((run_copy / "config.yaml").read_text())["threads"] == 2
    # another thread count changes the last digits of what is trained after it (a determinism audit): said, logged
    log = (run_copy / "run.log").read_text()
    assert "resumed with threads 2, the run started with 1: the rounds trained now are not bit-identical" in log


def test_resume_may_append_algorithms_at_the_end(run_copy, finished, tiny_config, disc_federation):
    run_experiment(
        _small(tiny_config, algorithms=["fedavg", "local"]), run_copy, resume=True, federation=_fed(disc_federation)
    )
    summary = json.loads((run_copy / "summary.json").read_text())
    assert list(summary["algorithms"]) == ["fedavg", "local"]
    before = json.loads((finished / "summary.json").read_text())["algorithms"]["fedavg"]["dice"]
    assert summary["algorithms"]["fedavg"]["dice"] == before  # the finished method reused
    assert yaml.safe_load((run_copy / "config.yaml").read_text())["algorithms"] == ["fedavg", "local"]


def test_resume_conflicts_rules():
    old = {"name": "a", "threads": 1, "algorithms": ["local", "fedavg"], "methods": {"fedprox": {"mu": 0.01}}}
    assert resume_conflicts(old, {**old, "name": "b", "threads": 4}) == []
    loaders = {"train": {"loader_workers": 0}}  # results do not depend on it: a resume may change it
    assert resume_conflicts({**old, **loaders}, {**old, "train": {"loader_workers": 2}}) == []
    assert resume_conflicts(old, {**old, "algorithms": ["local", "fedavg", "fedprox"]}) == []
    assert resume_conflicts(old, {**old, "algorithms": ["fedavg", "local"]}) == [
        "algorithms: [local, fedavg] -> [fedavg, local]"
    ]
    assert resume_conflicts(old, {**old, "algorithms": ["local"]}) == ["algorithms: [local, fedavg] -> [local]"]
    # the options of algorithms the run does not train change nothing in it (a preset that gains FedSM options)
    assert resume_conflicts(old, {**old, "methods": {"fedprox": {"mu": 0.1}, "scaffold": {"x": 1}}}) == []
    ran = {**old, "algorithms": ["local", "fedprox"]}
    assert resume_conflicts(ran, {**ran, "methods": {"fedprox": {"mu": 0.1}, "scaffold": {"x": 1}}}) == [
        "methods.fedprox.mu: 0.01 -> 0.1",
    ]
    appended = {"algorithms": ["local", "fedprox", "scaffold"], "methods": {"fedprox": {"mu": 0.01}, "scaffold": {}}}
    assert resume_conflicts(ran, {**ran, **appended}) == []  # a method appended on resume may bring its options


def test_options_of_algorithms_a_run_does_not_train_leave_its_digest_and_resume_alone(tmp_path):
    """A second review: the fets presets gained FedSM's selector size, which changed every FedAvg run's agreed
    configuration digest and refused the resume of FedAvg runs started before."""
    from fedseg.config_load import config_from_cli, config_record

    def cfg(*sets: str, algorithms: str = "fedavg"):
        return config_from_cli("fets-cpu", None, None, algorithms, 1, None, list(sets), None, None)

    plain = cfg()
    assert "fedsm" in plain.methods  # the preset's
    without = plain.model_copy(update={"methods": {}})
    assert config_record(plain) == config_record(without)
    assert resume_conflicts(without.model_dump(mode="json"), plain.model_dump(mode="json")) == []
    fedsm = cfg(algorithms="fedsm")
    changed = cfg("methods.fedsm.selector_input_size=32", algorithms="fedsm")
    assert config_record(fedsm) != config_record(changed)  # a trained method's options are the configuration
    assert resume_conflicts(fedsm.model_dump(mode="json"), changed.model_dump(mode="json")) == [
        "methods.fedsm.selector_input_size: 24 -> 32"
    ]


def test_cli_resume_with_changed_lr_prints_the_keys(tmp_path, disc_federation):
    from fedseg.data.folder_write import write_folder

    root = write_folder(disc_federation(n_sites=2, cases_per_site=8), tmp_path / "fed")
    args = [*DEMO, "--data", str(root), "--algorithms", "fedavg", "--rounds", "1", "--set", "eval.hd95=false"]
    out = tmp_path / "run"
    assert runner.invoke(app, [*args, "--out", str(out)]).exit_code == 0
    result = runner.invoke(app, [*args, "--set", "train.lr=0.01", "--rounds", "2", "--out", str(out), "--resume"])
    assert result.exit_code != 0
    assert "train.lr: 0.001 -> 0.01" in result.output and "fl.rounds: 1 -> 2" in result.output
    assert "Traceback" not in result.output


@pytest.mark.skipif(torch.cuda.is_available(), reason="this torch has CUDA")
def test_cuda_on_a_cpu_torch_is_refused_before_any_output(tmp_path):
    out = tmp_path / "run"
    result = runner.invoke(app, [*DEMO, "--set", "device=cuda", "--out", str(out)])
    assert result.exit_code != 0 and "Traceback" not in result.output
    assert "device 'cuda'" in result.output and "no CUDA" in result.output and "device: cpu" in result.output
    assert len(result.output.strip().splitlines()) < 10
    assert not out.exists()


def test_bad_device_string_is_refused(tmp_path):
    out = tmp_path / "run"
    result = runner.invoke(app, [*DEMO, "--set", "device=banana", "--out", str(out)])
    assert result.exit_code != 0 and "device 'banana'" in result.output and "Traceback" not in result.output
    assert not out.exists()
    with pytest.raises(ValueError, match="device 'cuda:7'"):
        check_device("cuda:7")
    assert check_device("cpu") == torch.device("cpu")


@pytest.mark.parametrize("under", [False, True])
def test_out_that_is_a_file_is_refused_in_one_line(tmp_path, under):
    file = tmp_path / "file.txt"
    file.write_text("x")
    out = file / "run" if under else file
    result = runner.invoke(app, [*DEMO, "--out", str(out)])
    assert result.exit_code != 0 and "Traceback" not in result.output
    assert len(result.output.strip().splitlines()) < 10
    assert str(file) in result.output and "is a file" in result.output
    assert file.read_text() == "x"


def test_predict_out_under_a_file_is_refused(finished, tmp_path):
    image = tmp_path / "x.png"
    Image.fromarray(np.zeros((32, 32, 3), np.uint8)).save(image)
    file = tmp_path / "file.txt"
    file.write_text("x")
    result = runner.invoke(
        app, ["predict", "--model", str(finished / "model"), "--input", str(image), "--out", str(file / "masks")]
    )
    assert result.exit_code != 0 and "Traceback" not in result.output
    assert str(file) in result.output and "is a file" in result.output
    assert len(result.output.strip().splitlines()) < 10


def test_predict_into_a_run_folder_is_refused_even_with_force(finished, run_copy, tmp_path):
    """`predict --out` a run's folder (one still training, say) wrote masks, predictions.csv and predict.json among
    the run's own files (a reviewer)."""
    image = tmp_path / "x.png"
    Image.fromarray(np.zeros((32, 32, 3), np.uint8)).save(image)
    before = sorted(p.name for p in run_copy.iterdir())
    for force in ([], ["--force"]):
        args = ["predict", "--model", str(finished / "model"), "--input", str(image), "--out", str(run_copy), *force]
        result = runner.invoke(app, args)
        assert result.exit_code != 0 and "Traceback" not in result.output
        said = " ".join(result.output.split())
        assert f"{run_copy}: holds a run (checkpoints); a prediction's masks go in a folder of their own" in said
    assert sorted(p.name for p in run_copy.iterdir()) == before
    project = tmp_path / "project"  # a folder holding the user's own config.yaml is no run
    project.mkdir()
    (project / "config.yaml").write_text("algorithms: [fedavg]\n")
    args = ["predict", "--model", str(finished / "model"), "--input", str(image), "--out", str(project)]
    assert runner.invoke(app, args).exit_code == 0
