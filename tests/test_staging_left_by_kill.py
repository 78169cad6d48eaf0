"""A staging folder left by a `fedseg data import`, `data synth` or `data export nnunet` killed by SIGKILL (no clean-up
ran) is removed by the next such command, with one note line: the rerun refused an ``--out`` that `ls` showed
empty (import, synth) or kept the dead export's megabytes for ever. A staging folder of a command still running
is never touched (the command says what to do), nor anything else in ``--out``."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from fedseg.cli import app
from fedseg.data.folder_write import clear_dead_staging, new_staging

SITE_BY = r"^(?P<site>.+?)__(?P<case>.+)$"


def _dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def _left(parent: Path, purpose: str, pid: int) -> Path:
    """A staging folder as a killed writer leaves it: named with its pid, a half-written file inside."""
    parent.mkdir(parents=True, exist_ok=True)
    folder = parent / f".{purpose}-{pid}-k1ll3d_x"
    (folder / "site").mkdir(parents=True)
    (folder / "site" / "half.nii.gz").write_bytes(b"\0" * 1000)
    return folder


def cli(*args: str):
    return CliRunner().invoke(app, ["data", *args])


@pytest.fixture(scope="module")
def exported(tmp_path_factory) -> Path:
    """A tiny federation exported to nnU-Net's format: what `import nnunet` reads."""
    root = tmp_path_factory.mktemp("src")
    assert cli("synth", "--preset", "synthetic-retina", "--scale", "0.05", "--out", str(root / "fed")).exit_code == 0
    result = cli("export", "nnunet", str(root / "fed"), "--out", str(root / "raw"))
    assert result.exit_code == 0, result.output
    (dataset,) = (root / "raw").glob("Dataset*")
    return dataset


def _commands(exported: Path, out: Path) -> dict[str, tuple[str, list[str]]]:
    """Each command's staging purpose and arguments."""
    return {
        "synth": ("writing", ["synth", "--preset", "synthetic-retina", "--scale", "0.05", "--out", str(out)]),
        "import": ("importing", ["import", "nnunet", str(exported), "--site-by", SITE_BY, "--copy", "--out", str(out)]),
        "export": (
            f"{exported.name}.exporting",
            ["export", "nnunet", str(exported.parent.parent / "fed"), "--out", str(out)],
        ),
    }


@pytest.mark.parametrize("command", ["synth", "import", "export"])
def test_a_rerun_removes_the_staging_folder_of_a_killed_command(tmp_path, exported, command):
    out = tmp_path / "out"
    purpose, args = _commands(exported, out)[command]
    dead = _left(out, purpose, _dead_pid())
    other = out / ".importing-notes"  # not a staging folder's name: never touched (import and synth need an
    if command == "export":  # empty --out: their dead staging folder is all it holds)
        other.mkdir()
    result = cli(*args)
    assert result.exit_code == 0, result.output
    assert not dead.exists()
    notes = [line for line in result.output.splitlines() if line.startswith("note:") and dead.name in line]
    assert len(notes) == 1 and "no longer running" in notes[0], result.output
    if command == "export":
        assert other.is_dir()
        assert (out / exported.name / "dataset.json").is_file()
    else:
        assert (out / "federation.yaml").is_file()


@pytest.mark.parametrize("command", ["synth", "import", "export"])
def test_the_staging_folder_of_a_running_command_is_left_alone(tmp_path, exported, command):
    out = tmp_path / "out"
    purpose, args = _commands(exported, out)[command]
    live = _left(out, purpose, os.getpid())  # this test's process runs
    result = cli(*args)
    assert result.exit_code == 1, result.output
    assert f"being written by a running process (pid {os.getpid()})" in result.output
    assert "wait for that command to end or stop it, then run this again" in result.output
    assert (live / "site" / "half.nii.gz").is_file()


def test_only_its_own_kind_of_dead_staging_folder_is_removed(tmp_path):
    dead = _dead_pid()
    mine, theirs = _left(tmp_path, "importing", dead), _left(tmp_path, "writing", dead)
    link = tmp_path / f".importing-{dead}-l1nk_xyz"
    link.symlink_to(theirs)
    assert clear_dead_staging(tmp_path, "importing") == [mine]
    assert not mine.exists() and theirs.is_dir() and link.is_symlink()
    fresh = new_staging(tmp_path, "importing")
    assert fresh.name.startswith(f".importing-{os.getpid()}-")
    assert clear_dead_staging(tmp_path, "importing", blocking="nothing") == []  # its own: alive, kept
    assert fresh.is_dir()
