"""Provenance (``fedseg --version``, summary.json ``provenance``, report header), ``run.log`` and the
modes of the files a run writes."""

from __future__ import annotations

import json
import os
import re
import shutil
import stat
import subprocess
import time
from pathlib import Path

import flwr
import monai
import numpy
import pytest
import torch
from typer.testing import CliRunner

import fedseg
from fedseg.cli import app
from fedseg.data.folder_write import write_folder
from fedseg.report.html import render_report
from fedseg.run import run_experiment
from fedseg.run.provenance import git_state
from fedseg.run.runlog import round_line

runner = CliRunner()
LINE = re.compile(
    r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ (\S+) round (\d+)/(\d+) mean val Dice (\d\.\d{4}|nan|-) "
    r"loss (\d+\.\d{4}|-) \d+\.\d s$"
)
STOPPED = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ stopped: \S.*$")
EVENT = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ (resumed|finished)$")


def _in_git_checkout() -> bool:
    try:
        done = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=Path(fedseg.__file__).parent, capture_output=True, timeout=5
        )
    except OSError:
        return False
    return done.returncode == 0


def _log_rounds(out: Path) -> list[tuple[str, int]]:
    """The rounds ``out/run.log`` logs; every other line must be a run's ``stopped:``, ``resumed`` or ``finished``."""
    lines = (out / "run.log").read_text().splitlines()
    for line in lines:
        assert LINE.match(line) or STOPPED.match(line) or EVENT.match(line), line
    return [(m[1], int(m[2])) for m in map(LINE.match, lines) if m]


@pytest.fixture(scope="module")
def run_022(tmp_path_factory, tiny_config, disc_federation) -> Path:
    """One run (local + fedavg, 2 rounds) under umask 022, then its report."""
    out = tmp_path_factory.mktemp("run")
    old = os.umask(0o022)
    try:
        run_experiment(tiny_config(algorithms=["local", "fedavg"]), out, federation=disc_federation())
        render_report(out)
    finally:
        os.umask(old)
    return out


def test_version_option_prints_versions_and_exits_0():
    result = runner.invoke(app, ["--version"])
    assert result.exit_code == 0, result.output
    assert result.output.splitlines()[0] == f"fedseg {fedseg.__version__}"
    for name, module in (("torch", torch), ("monai", monai), ("flwr", flwr)):
        assert f"{name} {module.__version__}" in result.output


def test_summary_records_provenance(run_022):
    prov = json.loads((run_022 / "summary.json").read_text())["provenance"]
    assert prov["fedseg"] == fedseg.__version__
    assert prov["torch"] == torch.__version__ and prov["monai"] == monai.__version__
    assert prov["flwr"] == flwr.__version__ and prov["numpy"] == numpy.__version__
    assert re.fullmatch(r"\d+\.\d+\.\d+", prov["python"])
    assert prov["start"] <= prov["end"] and prov["wall_seconds"] > 0 and prov["resumes"] == []
    assert prov["device"] == "cpu" and prov["threads"] == 1 and prov["hostname"]
    if _in_git_checkout():
        assert re.fullmatch(r"[0-9a-f]{40}", prov["commit"]) and isinstance(prov["dirty"], bool)


def test_git_state_outside_a_checkout_is_none(tmp_path):
    assert git_state(tmp_path) == (None, None)


def _git(repo: Path, *args: str) -> None:
    who = ["-c", "user.email=t@t", "-c", "user.name=t"]
    subprocess.run(["git", *who, *args], cwd=repo, check=True, capture_output=True)


@pytest.mark.skipif(shutil.which("git") is None, reason="needs git")
def test_the_source_state_is_the_packages_own_and_survives_any_bytes(tmp_path, monkeypatch):
    """What a run records of fedseg's code (``source_state``) reads the package's own folder: a latin-1 edit in it
    crashed every run (the diff was decoded as UTF-8), an untracked new module went unseen, an edit elsewhere in the
    repository (docs) counted, and a fedseg installed in a project's own repository took that project's commit."""
    from fedseg.run import provenance

    repo = tmp_path / "repo"
    (repo / "pkg").mkdir(parents=True)
    (repo / "pkg" / "__init__.py").write_text("x = 1\n")
    (repo / "pkg" / "notes.txt").write_bytes(b"plain\n")
    (repo / "docs.md").write_text("docs\n")
    _git(repo, "init", "-q")
    _git(repo, "add", ".")
    _git(repo, "commit", "-q", "-m", "start")
    monkeypatch.setattr(provenance, "package_dir", lambda: repo / "pkg")
    clean = provenance.source_state()
    assert clean["commit"] and clean["dirty"] is False and clean["changes"] is None
    (repo / "pkg" / "notes.txt").write_bytes(b"na\xefve caf\xe9\n")  # latin-1
    edited = provenance.source_state()
    assert edited["dirty"] and edited["changes"] and edited["commit"] == clean["commit"]
    (repo / "docs.md").write_text("docs, edited\n")  # outside the package: not fedseg's code
    assert provenance.source_state()["changes"] == edited["changes"]
    (repo / "pkg" / "notes.txt").write_bytes(b"plain\n")  # the package clean again, the docs still edited
    assert provenance.source_state() == clean  # dirty says the package's edits (a second reviewer: any file's)
    (repo / "pkg" / "notes.txt").write_bytes(b"na\xefve caf\xe9\n")
    (repo / "pkg" / "new.py").write_text("y = 2\n")  # untracked, in the package
    assert provenance.source_state()["changes"] != edited["changes"]
    installed = repo / "venv" / "site" / "fedseg"  # a virtual environment git does not track, inside the project
    installed.mkdir(parents=True)
    (installed / "__init__.py").write_text("")
    (repo / ".gitignore").write_text("venv/\n")
    monkeypatch.setattr(provenance, "package_dir", lambda: installed)
    assert provenance.git_state() == (None, None) and provenance.source_state()["commit"] is None


def test_report_header_shows_version_commit_and_device(run_022):
    html = (run_022 / "report.html").read_text()
    prov = json.loads((run_022 / "summary.json").read_text())["provenance"]
    assert f"fedseg {fedseg.__version__}" in html and f"torch {torch.__version__}" in html
    assert "device cpu" in html
    if prov["commit"]:
        assert f"commit {prov['commit'][:10]}" in html


def test_run_log_has_one_line_per_algorithm_round(run_022):
    assert _log_rounds(run_022) == [("local", 1), ("local", 2), ("fedavg", 1), ("fedavg", 2)]


def test_round_line_format():
    line = round_line("fedavg", 3, 10, 0.81234, {"a": 0.5, "b": 0.25}, 1.26)
    assert line.endswith(" fedavg round 3/10 mean val Dice 0.8123 loss 0.3750 1.3 s") and LINE.match(line)
    assert " mean val Dice - loss - " in round_line("fedavg", 1, 2, None, {}, 0.0)


class _Stop(Exception):
    pass


def test_resumed_run_keeps_start_records_resume_and_logs_each_round_once(tmp_path, tiny_config, disc_federation):
    cfg = tiny_config(algorithms=["fedavg"], fl={"rounds": 3})

    def stop(name, rnd, losses):
        if rnd == 2:
            raise _Stop

    with pytest.raises(_Stop):
        run_experiment(cfg, tmp_path, on_round_end=stop, federation=disc_federation())
    assert _log_rounds(tmp_path) == [("fedavg", 1), ("fedavg", 2)]
    assert (tmp_path / "run.log").read_text().splitlines()[-1].endswith(" stopped: _Stop")  # why the run ended
    first_start = json.loads((tmp_path / ".provenance.json").read_text())["start"]
    run_experiment(cfg, tmp_path, resume=True, federation=disc_federation())
    assert _log_rounds(tmp_path) == [("fedavg", 1), ("fedavg", 2), ("fedavg", 3)]
    events = [m[1] for m in map(EVENT.match, (tmp_path / "run.log").read_text().splitlines()) if m]
    assert events == ["resumed", "finished"]  # the log does not end on the stopped line of a run that went on
    assert (tmp_path / "run.log").read_text().splitlines()[-1].endswith(" finished")
    prov = json.loads((tmp_path / "summary.json").read_text())["provenance"]
    assert prov["start"] == first_start and len(prov["resumes"]) == 1
    assert prov["start"] <= prov["resumes"][0] <= prov["end"]
    record = (tmp_path / ".provenance.json").read_text()
    time.sleep(1.1)  # the provenance's clock counts seconds
    log = (tmp_path / "run.log").read_text()
    run_experiment(cfg, tmp_path, resume=True, federation=disc_federation())  # finished: nothing to log
    assert (tmp_path / "run.log").read_text() == log
    # stopped after its last checkpoint, while writing its outputs (Ctrl-C during the report): a resume finds every
    # algorithm finished, rewrites the outputs, and the log says so rather than ending on the stopped line
    (tmp_path / "run.log").write_text(log + "2026-01-01T00:00:00Z stopped: interrupted\n")
    run_experiment(cfg, tmp_path, resume=True, federation=disc_federation())
    assert [m[1] for m in map(EVENT.match, (tmp_path / "run.log").read_text().splitlines()[-2:])] == [
        "resumed",
        "finished",
    ]
    # a call that trains nothing is no resume: the run's end, wall time and resumes stay (make demo twice)
    assert json.loads((tmp_path / "summary.json").read_text())["provenance"] == prov
    assert (tmp_path / ".provenance.json").read_text() == record


def test_cli_run_without_a_terminal_prints_round_lines(tmp_path, disc_federation):
    root = write_folder(disc_federation(n_sites=2, cases_per_site=8), tmp_path / "fed")
    out = tmp_path / "run"
    args = ["run", "--preset", "demo", "--data", str(root), "--algorithms", "fedavg", "--rounds", "2"]
    sets = ["model.channels=[4,8,16]", "data.image_size=32", "train.batch_size=4", "threads=1", "eval.hd95=false"]
    result = runner.invoke(app, [*args, "--out", str(out), *[x for s in sets for x in ("--set", s)]])
    assert result.exit_code == 0, result.output
    printed = [line for line in result.output.splitlines() if LINE.match(line)]
    logged = (out / "run.log").read_text().splitlines()
    assert printed == logged[:-1] and EVENT.match(logged[-1])[1] == "finished"
    assert [LINE.match(line)[2] for line in printed] == ["1", "2"]
    prov = json.loads((out / "summary.json").read_text())["provenance"]
    assert isinstance(prov["command"], list)


def test_written_files_have_the_mode_of_normally_created_files(run_022):
    files = [p for p in run_022.rglob("*") if p.is_file()]
    assert {"results.csv", "summary.json", "config.yaml", "run.log", "weights.safetensors", "fedavg.pt"} <= {
        p.name for p in files
    }
    modes = {str(p.relative_to(run_022)): stat.S_IMODE(p.stat().st_mode) for p in files}
    private = {k for k in modes if k.startswith("samples/") and k.endswith(".npz")}  # a patient's image each
    assert private and all(modes[k] == 0o600 for k in private), {k: oct(modes[k]) for k in private}
    public = {k: m for k, m in modes.items() if k not in private}
    assert all(m == 0o644 for m in public.values()), {k: oct(m) for k, m in public.items() if m != 0o644}
