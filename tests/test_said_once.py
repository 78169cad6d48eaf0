"""A note a bench's runs share is said once per bench (``fedseg.run.said_once``): a fresh-eyes study's bench on the
fets-cpu preset printed the same HD95 note (``eval.hd95_worst``) once per run. Each run's ``run.log`` keeps it; a
single run says it once. The smallest configuration that has the note: a folder federation with ``eval.hd95_worst``."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from fedseg.data.folder_write import write_folder

TINY_SET = ["data.image_size=32", "model.channels=[4,8]", "model.strides=[2]", "threads=1", "eval.local_models=false"]
HD95_NOTE = "note: a missed or hallucinated region scores HD95 100 on every case (eval.hd95_worst;"


def fedseg(*args: str) -> str:
    """What the ``fedseg`` command ``args`` (which must succeed) says: its stdout and stderr."""
    done = subprocess.run([sys.executable, "-m", "fedseg", *args], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    return done.stdout + done.stderr


def said(output: str) -> int:
    return sum(line.startswith(HD95_NOTE) for line in output.splitlines())


@pytest.fixture(scope="module")
def folder(tmp_path_factory, disc_federation) -> Path:
    return write_folder(disc_federation(n_sites=2, cases_per_site=8), tmp_path_factory.mktemp("said") / "fed")


@pytest.mark.parametrize("jobs", [1, 2])
def test_a_bench_says_a_note_its_runs_share_once(tmp_path, folder, jobs):
    """Two seeds, two runs (``--jobs 2``: in processes of their own, at once): the note once; in each run.log."""
    spec = {
        "name": "once",
        "base": {"preset": "demo"},
        "set": [*TINY_SET, "eval.hd95_worst=100"],
        "federations": [{"name": "discs", "set": ["data.source=folder", f"data.root={folder}"]}],
        "methods": ["fedavg"],
        "seeds": [0, 1],
        "split": {"mode": "ratio"},
        "budget": {"rounds": 1},
    }
    (tmp_path / "bench.yaml").write_text(yaml.safe_dump(spec))
    output = fedseg("bench", str(tmp_path / "bench.yaml"), "--out", str(tmp_path / "out"), "--jobs", str(jobs))
    assert said(output) == 1, output
    logs = sorted((tmp_path / "out" / "runs").rglob("run.log"))
    assert len(logs) == 2 and all(said(log.read_text()) == 1 for log in logs)


def test_a_run_says_the_note_once(tmp_path, folder):
    run = ["run", "--preset", "demo", "--data", str(folder), "--algorithms", "fedavg", "--rounds", "1"]
    sets = [a for s in [*TINY_SET, "eval.hd95_worst=100"] for a in ("--set", s)]
    assert said(fedseg(*run, *sets, "--out", str(tmp_path / "run"))) == 1


def test_a_line_naming_a_file_whose_name_is_not_utf8_is_said_once(tmp_path, monkeypatch):
    """Linux file names are bytes: one that is not UTF-8 reaches a note as surrogate escapes."""
    from fedseg.run.said_once import SAID_ENV, first_time

    monkeypatch.setenv(SAID_ENV, str(tmp_path))
    line = "note: " + os.fsdecode(b"/data/h\xe9pital/case.nii.gz")
    assert first_time(line) and not first_time(line)
