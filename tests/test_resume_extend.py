"""A resume that extends a run to more rounds (``fl.rounds`` grown): the same numbers as a run configured with them
from the start, or one line saying why not (``fedseg.run.extend``)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from fedseg.cli import app
from fedseg.run import run_experiment

# the seconds, and where / when the run was made, differ between any two runs
NOT_COMPARED = {"seconds", "wall_seconds"}


def _numbers(out: Path) -> dict:
    summary = json.loads((out / "summary.json").read_text())
    return {a: {k: v for k, v in e.items() if k not in NOT_COMPARED} for a, e in summary["algorithms"].items()}


def _same_models(a, b) -> None:
    for x, y in zip(a.algorithms, b.algorithms, strict=True):
        assert x.name == y.name and set(x.bundle) == set(y.bundle)
        for model in x.bundle:
            for key in x.bundle[model]:
                assert torch.equal(x.bundle[model][key], y.bundle[model][key]), (x.name, model, key)


def _csv(out: Path, name: str) -> str:
    return (out / name).read_text()


def _rounds(cfg, rounds: int):
    return cfg.model_copy(update={"fl": cfg.fl.model_copy(update={"rounds": rounds})})


@pytest.mark.parametrize("algorithms", [["fedavg", "local"], ["fedprox", "fedsm"]])
def test_a_finished_run_extended_equals_a_run_configured_with_the_rounds(
    tmp_path, algorithms, tiny_config, disc_federation
):
    cfg = tiny_config(algorithms=algorithms)  # 2 rounds
    run_experiment(cfg, tmp_path / "ext", federation=disc_federation(), keep_checkpoints=True)
    assert (tmp_path / "ext" / "checkpoints" / f"{algorithms[0]}.last.pt").is_file()
    extended = run_experiment(_rounds(cfg, 3), tmp_path / "ext", resume=True, federation=disc_federation())
    fresh = run_experiment(_rounds(cfg, 3), tmp_path / "fresh", federation=disc_federation())
    assert not list((tmp_path / "fresh" / "checkpoints").glob("*.last.pt"))  # without --keep-checkpoints: none kept

    _same_models(fresh, extended)
    assert _numbers(tmp_path / "ext") == _numbers(tmp_path / "fresh")
    for name in ("rounds.csv", "results.csv"):  # ledger.csv holds wall-clock seconds
        assert _csv(tmp_path / "ext", name) == _csv(tmp_path / "fresh", name), name
    summary = json.loads((tmp_path / "ext" / "summary.json").read_text())
    assert all(entry["rounds"] == 3 for entry in summary["algorithms"].values())
    [record] = summary["provenance"]["extended"]
    assert (record["from"], record["to"], record["algorithms"]) == (2, 3, algorithms)
    log = (tmp_path / "ext" / "run.log").read_text()
    assert f"extended: fl.rounds 2 -> 3; {', '.join(algorithms)} continue from their last round" in log
    events = [
        line.split(" ", 2)[1] for line in log.splitlines() if line.split(" ", 2)[1:2] in (["resumed"], ["finished"])
    ]
    assert events == ["finished", "resumed", "finished"]  # its log ends finished again
    # resumed again with the same rounds: nothing trains, the numbers stay
    run_experiment(_rounds(cfg, 3), tmp_path / "ext", resume=True, federation=disc_federation())
    assert _numbers(tmp_path / "ext") == _numbers(tmp_path / "fresh")


def test_an_interrupted_run_resumed_with_more_rounds_equals_one_configured_with_them(
    tmp_path, tiny_config, disc_federation
):
    """Stopped in its last round's checkpoint's wake (round 2 of 2, before its test): the stop rule, not checked in a
    last round, is checked again (here: a plateau of patience 1 may stop it), and it continues from there."""
    cfg = tiny_config(algorithms=["fedavg"], fl={"rounds": 2, "stop": {"patience": 1, "min_delta": 0.5}})

    class Stop(Exception):
        pass

    def stop(name, rnd, losses):
        if rnd == 2:
            raise Stop

    with pytest.raises(Stop):
        run_experiment(cfg, tmp_path / "ext", on_round_end=stop, federation=disc_federation())
    extended = run_experiment(_rounds(cfg, 4), tmp_path / "ext", resume=True, federation=disc_federation())
    fresh = run_experiment(_rounds(cfg, 4), tmp_path / "fresh", federation=disc_federation())
    _same_models(fresh, extended)
    assert _numbers(tmp_path / "ext") == _numbers(tmp_path / "fresh")
    # the plateau rule (no gain of 0.5 in a round) stops the 4-round run after round 2, as it does the fresh one
    assert json.loads((tmp_path / "fresh" / "summary.json").read_text())["algorithms"]["fedavg"]["rounds"] == 2


def test_a_resume_says_on_the_console_where_each_algorithm_goes_on_from(tmp_path, tiny_config, disc_federation):
    """A user's audit: a resumed run went straight to its next round on the console (only run.log said resumed)."""
    cfg = tiny_config(algorithms=["fedavg", "local"], fl={"rounds": 2})

    class Stop(Exception):
        pass

    def stop(name, rnd, losses):
        if name == "fedavg" and rnd == 1:
            raise Stop

    with pytest.raises(Stop):
        run_experiment(cfg, tmp_path / "run", on_round_end=stop, federation=disc_federation())
    shown: list[str] = []
    run_experiment(cfg, tmp_path / "run", resume=True, federation=disc_federation(), on_log_line=shown.append)
    assert "resume: fedavg after round 1 of 2, local not begun; the run goes on from there" in shown, shown


def test_an_extension_of_a_run_interrupted_before_an_algorithm_began_says_that_one_trains_too(
    tmp_path, tiny_config, disc_federation
):
    """Interrupted in fedavg's last round, before local began, resumed with more rounds: the extension's line named
    no algorithm but the continued one, or said "no algorithm trains more" where none continued, while local trained
    (the review's point); it names local, trained from round 1, and local trains the new number of rounds."""
    cfg = tiny_config(algorithms=["fedavg", "local"], fl={"rounds": 1})

    class Stop(Exception):
        pass

    def stop(name, rnd, losses):
        if name == "fedavg":
            raise Stop

    with pytest.raises(Stop):
        run_experiment(cfg, tmp_path / "ext", on_round_end=stop, federation=disc_federation())
    run_experiment(_rounds(cfg, 2), tmp_path / "ext", resume=True, federation=disc_federation())
    log = (tmp_path / "ext" / "run.log").read_text()
    assert (
        "extended: fl.rounds 1 -> 2; fedavg continue from their last round; local not begun before: trained from "
        "round 1; the model is selected again" in log
    ), log
    summary = json.loads((tmp_path / "ext" / "summary.json").read_text())
    assert {name: entry["rounds"] for name, entry in summary["algorithms"].items()} == {"fedavg": 2, "local": 2}


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        (
            {"train": {"lr_schedule": "cosine"}},
            "fedavg: lr schedule cosine depends on fl.rounds: every round's learning rate so far was set for 2 "
            "rounds, not 3",
        ),
        (
            {"fl": {"rounds": 3, "validate_every": 2}},
            "fedavg: round 3 was validated only because it was the last (fl.validate_every=2); a 4-round run does "
            "not validate it",
        ),
        (
            {"algorithms": ["fedavg-dp"]},
            "fedavg-dp: select_round: last makes only round fl.rounds selectable",
        ),
    ],
)
def test_an_extension_that_would_train_differently_is_refused_in_one_line(
    tmp_path, overrides, expected, tiny_config, disc_federation
):
    cfg = tiny_config(**{"algorithms": ["fedavg"], **overrides})
    run_experiment(cfg, tmp_path, federation=disc_federation(), keep_checkpoints=True)
    before = sorted(p.name for p in tmp_path.rglob("*"))
    summary = (tmp_path / "summary.json").read_text()
    with pytest.raises(ValueError) as e:
        run_experiment(_rounds(cfg, cfg.fl.rounds + 1), tmp_path, resume=True, federation=disc_federation())
    text = str(e.value)
    assert "\n" not in text and text.startswith(f"cannot extend the run in {tmp_path} from ")
    assert expected in text, text
    assert sorted(p.name for p in tmp_path.rglob("*")) == before and (tmp_path / "summary.json").read_text() == summary


def _cli(args: list[str]):
    return CliRunner().invoke(app, args)


TINY_SET = ["data.scale=0.05", "data.image_size=32", "model.channels=[4,8]", "model.strides=[2]", "threads=1"]


@pytest.fixture(scope="module")
def cli_run(tmp_path_factory) -> tuple[Path, list[str]]:
    """A finished 2-round FedAvg run of ``demo`` (tiny) through the CLI and the arguments that made it (no
    ``--rounds``, no ``--out``)."""
    out = tmp_path_factory.mktemp("extend") / "run"
    args = ["run", "--preset", "demo", "--algorithms", "fedavg", *(a for s in TINY_SET for a in ("--set", s))]
    result = _cli([*args, "--rounds", "2", "--out", str(out), "--keep-checkpoints"])
    assert result.exit_code == 0, result.output
    return out, args


def test_the_cli_extends_a_run_with_rounds_or_set_and_refuses_fewer_in_one_line(cli_run, tmp_path):
    run, args = cli_run
    copy = tmp_path / "run"
    shutil.copytree(run, copy)
    fewer = _cli([*args, "--rounds", "1", "--out", str(copy), "--resume"])
    lines = [line for line in fewer.output.strip().splitlines() if line.strip()]
    assert fewer.exit_code == 1 and len(lines) == 1 and "Traceback" not in fewer.output, fewer.output
    assert lines[0] == (
        f"error: {copy / 'config.yaml'}: fl.rounds 2 -> 1: a resume can only add rounds to the run; resume with "
        "--rounds 2 or more, or start a new run (another --out)"
    )
    result = _cli([*args, "--set", "fl.rounds=3", "--out", str(copy), "--resume"])
    assert result.exit_code == 0, result.output
    fresh = _cli([*args, "--rounds", "3", "--out", str(tmp_path / "fresh")])
    assert fresh.exit_code == 0, fresh.output
    assert _numbers(copy) == _numbers(tmp_path / "fresh")
    assert (copy / "model" / "fedavg" / "weights.safetensors").read_bytes() == (
        tmp_path / "fresh" / "model" / "fedavg" / "weights.safetensors"
    ).read_bytes()
    assert "extended: fl.rounds 2 -> 3" in (copy / "run.log").read_text()


def test_the_cli_refuses_an_extension_that_would_train_differently_in_one_line(cli_run, tmp_path):
    run, args = cli_run
    copy = tmp_path / "run"
    shutil.copytree(run, copy)
    (copy / "checkpoints" / "fedavg.last.pt").unlink()  # as a run of a fedseg that kept no last round
    result = _cli([*args, "--rounds", "4", "--out", str(copy), "--resume"])
    lines = [line for line in result.output.strip().splitlines() if line.strip()]
    assert result.exit_code == 1 and len(lines) == 1 and "Traceback" not in result.output, result.output
    assert lines[0].startswith(f"error: cannot extend the run in {copy} from 2 to 4 rounds: fedavg: finished without ")


def test_an_extension_interrupted_and_resumed_equals_one_configured_with_the_rounds(
    tmp_path, tiny_config, disc_federation
):
    cfg = tiny_config(algorithms=["fedavg", "local"])

    class Stop(Exception):
        pass

    def stop(name, rnd, losses):
        if name == "local" and rnd == 3:
            raise Stop

    run_experiment(cfg, tmp_path / "ext", federation=disc_federation(), keep_checkpoints=True)
    with pytest.raises(Stop):  # fedavg extended and finished again, local stopped in its round 3
        run_experiment(_rounds(cfg, 4), tmp_path / "ext", resume=True, on_round_end=stop, federation=disc_federation())
    extended = run_experiment(_rounds(cfg, 4), tmp_path / "ext", resume=True, federation=disc_federation())
    fresh = run_experiment(_rounds(cfg, 4), tmp_path / "fresh", federation=disc_federation())
    _same_models(fresh, extended)
    assert _numbers(tmp_path / "ext") == _numbers(tmp_path / "fresh")
    extended_record = json.loads((tmp_path / "ext" / "summary.json").read_text())["provenance"]["extended"]
    assert [(r["from"], r["to"]) for r in extended_record] == [(2, 4)]


def test_the_python_api_extends_a_run(tmp_path, tiny_config, disc_federation):
    from fedseg.api import Experiment

    cfg = tiny_config(algorithms=["fedavg"], fl={"rounds": 1})
    Experiment(cfg, tmp_path / "ext", federation=disc_federation(), progress=False, keep_checkpoints=True).run(
        report=False
    )
    experiment = Experiment.from_run(tmp_path / "ext", federation=disc_federation(), progress=False)
    experiment.config = _rounds(experiment.config, 2)
    extended = experiment.run(resume=True, report=False)
    fresh = Experiment(_rounds(cfg, 2), tmp_path / "fresh", federation=disc_federation(), progress=False).run(
        report=False
    )
    assert extended.summary["algorithms"]["fedavg"]["rounds"] == 2
    assert _numbers(tmp_path / "ext") == _numbers(tmp_path / "fresh")
    assert fresh.summary["algorithms"]["fedavg"]["dice"] == extended.summary["algorithms"]["fedavg"]["dice"]


def test_more_rounds_with_another_change_is_refused_listing_both(tmp_path, tiny_config, disc_federation):
    cfg = tiny_config(algorithms=["fedavg"], fl={"rounds": 1})
    run_experiment(cfg, tmp_path, federation=disc_federation(), keep_checkpoints=True)
    changed = tiny_config(algorithms=["fedavg"], fl={"rounds": 2}, train={"lr": 0.01})
    with pytest.raises(ValueError) as e:
        run_experiment(changed, tmp_path, resume=True, federation=disc_federation())
    assert "fl.rounds: 1 -> 2" in str(e.value) and "train.lr: 0.001 -> 0.01" in str(e.value)
    assert "fl.rounds alone may grow on resume" in str(e.value)
    assert (
        not (tmp_path / "checkpoints" / "fedavg.pt").read_bytes()
        == (tmp_path / "checkpoints" / "fedavg.last.pt").read_bytes()
    )  # still the finished record: nothing reopened


STOPPED_EARLY = {"stop": {"patience": 1, "min_delta": 0.5}}  # no gain of 0.5 in a round: stops after round 2


def test_an_extension_where_every_algorithm_stopped_early_records_it_and_says_so_in_one_line(
    tmp_path, tiny_config, disc_federation
):
    """Every algorithm stopped by its stop rule before ``fl.rounds``: the extension trains nothing (a run configured
    with the new rounds stops there too), but ``summary.json`` records it as any other (its provenance was reused
    unchanged, as for a finished run resumed, so ``provenance.extended`` was missing) and one line says why nothing
    trains (it said so twice: every algorithm finished, and "no algorithm trains more; the model is selected again
    ... and tested again")."""
    algorithms = ["fedavg", "local"]
    cfg = tiny_config(algorithms=algorithms, fl={"rounds": 3, **STOPPED_EARLY})
    run_experiment(cfg, tmp_path / "ext", federation=disc_federation(), keep_checkpoints=True)
    before = json.loads((tmp_path / "ext" / "summary.json").read_text())
    assert {a: e["rounds"] for a, e in before["algorithms"].items()} == {"fedavg": 2, "local": 2}
    assert "extended" not in before["provenance"]

    lines: list[str] = []
    run_experiment(
        _rounds(cfg, 5), tmp_path / "ext", resume=True, federation=disc_federation(), on_log_line=lines.append
    )
    fresh = run_experiment(_rounds(cfg, 5), tmp_path / "fresh", federation=disc_federation())
    assert [a.summary["rounds"] for a in fresh.algorithms] == [2, 2]  # a run configured with 5 rounds stops there too
    assert _numbers(tmp_path / "ext") == _numbers(tmp_path / "fresh")

    provenance = json.loads((tmp_path / "ext" / "summary.json").read_text())["provenance"]
    [record] = provenance["extended"]
    assert (record["from"], record["to"], record["algorithms"]) == (3, 5, [])
    assert provenance["start"] == before["provenance"]["start"] and len(provenance["resumes"]) == 1
    said = [line for line in lines if "extended" in line or "finished" in line or "nothing is trained" in line]
    assert said == [
        "extended: fl.rounds 3 -> 5, but no algorithm had rounds left to train: fedavg stopped early after round 2 "
        "(plateau), local stopped early after round 2 (plateau); nothing is trained, the outputs are written again"
    ]
    assert said[0] in (tmp_path / "ext" / "run.log").read_text()
    # resumed again with the same rounds: nothing trains, and the record stays
    run_experiment(_rounds(cfg, 5), tmp_path / "ext", resume=True, federation=disc_federation())
    assert json.loads((tmp_path / "ext" / "summary.json").read_text())["provenance"] == provenance


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads sessions from /proc (Linux)")
def test_the_cli_extending_a_run_that_stopped_early_everywhere_starts_no_process_server(tmp_path):
    """``fedseg run --workers 2 --resume --rounds M`` of a run whose every algorithm stopped early: nothing has rounds
    left to train, so neither the pool's process server (a process importing torch and every method) nor the pool
    is started (they were: the run was not taken for idle because it was extended). Watched by session in /proc."""
    import sys

    from test_interrupts import run_watching_process_server

    out = tmp_path / "run"
    stop = ["fl.stop.patience=1", "fl.stop.min_delta=0.5"]
    command = [sys.executable, "-m", "fedseg.cli", "run", "--preset", "demo", "--algorithms", "fedavg", "--workers"]
    command += ["2", "--out", str(out), *(a for s in [*TINY_SET, *stop] for a in ("--set", s))]

    def watched(*more: str) -> tuple[bool, str]:
        return run_watching_process_server([*command, *more])

    trained, _ = watched("--rounds", "3", "--keep-checkpoints")
    assert trained  # the check sees a process server where there is one
    assert json.loads((out / "summary.json").read_text())["algorithms"]["fedavg"]["rounds"] == 2
    extended, output = watched("--rounds", "5", "--resume")
    assert not extended, output[-3000:]
    assert "extended: fl.rounds 3 -> 5, but no algorithm had rounds left to train: fedavg stopped early after " in (
        " ".join(output.split())
    )
    [record] = json.loads((out / "summary.json").read_text())["provenance"]["extended"]
    assert (record["from"], record["to"], record["algorithms"]) == (3, 5, [])
