"""Checkpoints of a finished run: a small record (no models: those are in OUT/model/<algorithm>/), reused
as it was by --resume; the whole payload, models included, with --keep-checkpoints."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from typer.testing import CliRunner

from fedseg.cli import app
from fedseg.engine.checkpoint import load_checkpoint
from fedseg.run import run_experiment
from fedseg.run.outputs import read_bundle

ALGORITHMS = ["local", "fedavg"]


def _cfg(tiny_config):
    return tiny_config(algorithms=ALGORITHMS, fl={"rounds": 1}, eval={"hd95": False})


def _fed(disc_federation):
    return disc_federation(n_sites=2, cases_per_site=8)


def _tensors(obj) -> int:
    """Number of tensor elements anywhere in a checkpoint payload."""
    if isinstance(obj, torch.Tensor):
        return obj.numel()
    if isinstance(obj, dict):
        return sum(_tensors(v) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return sum(_tensors(v) for v in obj)
    return 0


def _same_bundle(a: dict, b: dict) -> bool:
    return list(a) == list(b) and all(
        list(a[m]) == list(b[m]) and all(torch.equal(a[m][k], b[m][k]) for k in a[m]) for m in a
    )


def _summary(out) -> dict:
    summary = json.loads((out / "summary.json").read_text())
    summary.pop("provenance")
    return summary


@pytest.fixture(scope="module")
def finished(tmp_path_factory, tiny_config, disc_federation):
    out = tmp_path_factory.mktemp("finished") / "run"
    return out, run_experiment(_cfg(tiny_config), out, federation=_fed(disc_federation))


def test_finished_checkpoints_hold_no_models(finished):
    out, results = finished
    for result in results.algorithms:
        ckpt = load_checkpoint(out / "checkpoints" / f"{result.name}.pt")
        assert ckpt["finished"] and "bundle" not in ckpt and _tensors(ckpt) == 0
        assert ckpt["bundle_order"] == {m: list(w) for m, w in result.bundle.items()}
        weights = out / "model" / result.name / "weights.safetensors"
        assert (out / "checkpoints" / f"{result.name}.pt").stat().st_size < weights.stat().st_size
        folder = out / "model" / result.name
        assert _same_bundle(read_bundle(folder, ckpt["bundle_sha256"], ckpt["bundle_order"]), result.bundle)
        unordered = read_bundle(folder)  # the file's order: the same tensors
        assert _same_bundle({m: {k: unordered[m][k] for k in w} for m, w in result.bundle.items()}, result.bundle)


def test_resume_of_a_finished_run_reads_the_models_back_unchanged(finished, tmp_path, tiny_config, disc_federation):
    out, results = finished
    copy = shutil.copytree(out, tmp_path / "run")
    said: list[str] = []
    resumed = run_experiment(
        _cfg(tiny_config), copy, resume=True, federation=_fed(disc_federation), on_log_line=said.append
    )
    reused = "resume: every algorithm of this run has finished; nothing is trained, its outputs are written again"
    assert said.count(reused) == 1 and not any("round" in line for line in said)  # said once, and no round trained
    assert (copy / "run.log").read_bytes() == (out / "run.log").read_bytes()  # shown, not logged
    assert _summary(copy) == _summary(out)
    for name in ("results.csv", "rounds.csv", "ledger.csv"):
        assert (copy / name).read_bytes() == (out / name).read_bytes(), name
    for a, b in zip(results.algorithms, resumed.algorithms):
        assert _same_bundle(a.bundle, b.bundle), a.name
        assert (copy / "model" / a.name / "weights.safetensors").read_bytes() == (
            out / "model" / a.name / "weights.safetensors"
        ).read_bytes()
        # the model card made when it finished (its time included), not a new one
        manifest = (copy / "model" / a.name / "manifest.json").read_text()
        assert '"trained"' in manifest and manifest == (out / "model" / a.name / "manifest.json").read_text()


def test_resume_refuses_models_that_are_not_the_run_s(finished, tmp_path, tiny_config, disc_federation):
    out, _ = finished
    copy = shutil.copytree(out, tmp_path / "run")
    shutil.copy(copy / "model" / "local" / "weights.safetensors", copy / "model" / "fedavg" / "weights.safetensors")
    with pytest.raises(ValueError, match=r"fedavg\.pt: finished, but its trained models cannot be reused.*SHA-256"):
        run_experiment(_cfg(tiny_config), copy, resume=True, federation=_fed(disc_federation))
    shutil.rmtree(copy / "model" / "fedavg")
    with pytest.raises(ValueError, match=r"delete .*fedavg\.pt to train it again"):
        run_experiment(_cfg(tiny_config), copy, resume=True, federation=_fed(disc_federation))


def test_keep_checkpoints_keeps_the_models_in_the_finished_checkpoint(tmp_path, tiny_config, disc_federation):
    out = tmp_path / "run"
    results = run_experiment(_cfg(tiny_config), out, federation=_fed(disc_federation), keep_checkpoints=True)
    for result in results.algorithms:
        ckpt = load_checkpoint(out / "checkpoints" / f"{result.name}.pt")
        assert _same_bundle(ckpt["bundle"], result.bundle)
    shutil.rmtree(out / "model")  # the checkpoints alone suffice to reuse the finished methods
    resumed = run_experiment(_cfg(tiny_config), out, resume=True, federation=_fed(disc_federation))
    assert all(_same_bundle(a.bundle, b.bundle) for a, b in zip(results.algorithms, resumed.algorithms))
    assert (out / "model" / "fedavg" / "weights.safetensors").is_file()


def test_cli_keep_checkpoints(tmp_path, disc_federation):
    from fedseg.data.folder_write import write_folder

    root = write_folder(_fed(disc_federation), tmp_path / "fed")
    args = ["run", "--preset", "demo", "--data", str(root), "--algorithms", "fedavg", "--rounds", "1"]
    args += ["--set", "model.channels=[4,8,16]", "--set", "data.image_size=32", "--set", "eval.hd95=false"]
    runner = CliRunner()
    for flag, kept in (([], False), (["--keep-checkpoints"], True)):
        out = tmp_path / f"run-{kept}"
        result = runner.invoke(app, [*args, *flag, "--out", str(out)])
        assert result.exit_code == 0, result.output
        assert ("bundle" in load_checkpoint(out / "checkpoints" / "fedavg.pt")) == kept


def test_a_method_appended_on_resume_starts_from_the_models_read_back(tmp_path, tiny_config, disc_federation):
    """finetune starts from fedavg's model: read back from OUT/model/fedavg/ it gives the same run as in memory."""

    def cfg(algorithms):
        return tiny_config(
            algorithms=algorithms, fl={"rounds": 1}, eval={"hd95": False}, methods={"finetune": {"epochs": 1}}
        )

    straight = run_experiment(cfg(["fedavg", "finetune"]), tmp_path / "straight", federation=_fed(disc_federation))
    run_experiment(cfg(["fedavg"]), tmp_path / "run", federation=_fed(disc_federation))
    appended = run_experiment(
        cfg(["fedavg", "finetune"]), tmp_path / "run", resume=True, federation=_fed(disc_federation)
    )
    assert _same_bundle(straight.algorithms[-1].bundle, appended.algorithms[-1].bundle)
    assert str(straight.algorithms[-1].test_rows) == str(appended.algorithms[-1].test_rows)
