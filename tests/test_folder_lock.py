"""One writer per output folder (``fedseg.folder_lock``): a second command on a folder another process writes is
refused in one line naming the holder, before it prepares data or writes a file; a holder that dies (even by
SIGKILL) leaves the folder free; a process holds a folder again without refusing itself."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest
from typer.testing import CliRunner

from fedseg.cli import app
from fedseg.folder_lock import LOCK_NAME, FolderInUse, holding

runner = CliRunner()
TINY = ["--preset", "demo", "--set", "model.channels=[4,8,16]", "--set", "data.image_size=32"]

HOLDER = textwrap.dedent(
    """
    import sys
    from pathlib import Path
    from fedseg.folder_lock import holding
    with holding(Path(sys.argv[1]), "fedseg run --out held"):
        print("held", flush=True)
        sys.stdin.read()  # until the test closes our stdin (or kills us)
    """
)


@pytest.fixture
def held(tmp_path):
    """A folder held by another process (a real one, running fedseg's lock) until the test ends."""
    folder = tmp_path / "run"
    folder.mkdir()
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(folder)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None and proc.stdout.readline().strip() == "held"
    yield folder, proc
    if proc.poll() is None:
        proc.stdin.close()
        proc.wait(timeout=30)


def only_line(output: str) -> str:
    lines = [line for line in output.strip().splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in output, output
    return lines[0]


def test_a_second_process_is_refused_naming_the_holder_and_the_lock_goes_with_it(held):
    folder, proc = held
    with pytest.raises(FolderInUse, match=rf"in use by pid {proc.pid}, `fedseg run --out held`, since "):
        with holding(folder):
            pass
    proc.stdin.close()  # the holder ends normally: its lock file goes with it
    assert proc.wait(timeout=30) == 0
    assert not (folder / LOCK_NAME).exists()
    with holding(folder):
        assert json.loads((folder / LOCK_NAME).read_text())["pid"] == os.getpid()
    assert not (folder / LOCK_NAME).exists()


def test_a_holder_killed_by_sigkill_leaves_the_folder_free(held):
    folder, proc = held
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    assert (folder / LOCK_NAME).exists()  # its record stays behind, but not its lock
    with holding(folder, "fedseg run --resume"):
        assert json.loads((folder / LOCK_NAME).read_text())["command"] == "fedseg run --resume"
    assert not (folder / LOCK_NAME).exists()


def test_a_process_holds_a_folder_again_and_lets_go_at_the_last_release(tmp_path):
    with holding(tmp_path):
        with holding(tmp_path / "." / ""):  # the same folder, spelt otherwise
            assert (tmp_path / LOCK_NAME).exists()
        assert (tmp_path / LOCK_NAME).exists()  # the outer hold still stands
    assert not (tmp_path / LOCK_NAME).exists()


def test_a_resume_of_a_run_another_process_writes_is_refused_before_any_work(held):
    folder, proc = held
    before = sorted(p.name for p in folder.iterdir())
    began = time.monotonic()
    result = runner.invoke(app, ["run", *TINY, "--out", str(folder), "--resume"])
    assert result.exit_code == 1
    line = only_line(result.output)
    assert f"{folder}: in use by pid {proc.pid}" in line and "--resume continues its run" in line
    assert sorted(p.name for p in folder.iterdir()) == before  # nothing written
    assert time.monotonic() - began < 30  # refused at once, not after preparing the data


@pytest.mark.parametrize(
    "command",
    [
        ["run", *TINY, "--leave-one-out"],
        ["flower", "local", *TINY, "--algorithms", "fedavg"],
        ["bench", "BENCH"],
    ],
    ids=["study", "flower-local", "bench"],
)
def test_a_study_a_bench_or_a_flower_coordinator_on_a_held_folder_is_refused(held, command, tmp_path):
    folder, proc = held
    if command[0] == "flower":
        pytest.importorskip("flwr")
    if command[0] == "bench":
        bench = {
            "base": {"preset": "synthetic-retina"},
            "set": ["data.image_size=32", "model.channels=[4,8,16]", "data.scale=0.05"],
            "budget": {"rule": "rounds", "rounds": 1},
            "federations": ["synthetic-retina"],
            "methods": ["fedavg"],
            "seeds": [0, 1],
        }
        (tmp_path / "bench.yaml").write_text(json.dumps(bench))
        command = ["bench", str(tmp_path / "bench.yaml")]
    result = runner.invoke(app, [*command, "--out", str(folder)])
    assert result.exit_code != 0
    assert f"in use by pid {proc.pid}" in only_line(result.output)
    assert sorted(p.name for p in folder.iterdir()) == [LOCK_NAME]


def test_a_run_holds_its_new_folder_while_it_trains_and_frees_it_after(tmp_path, disc_federation):
    from fedseg.data.folder_write import write_folder

    root = write_folder(disc_federation(n_sites=2, cases_per_site=6), tmp_path / "fed")
    out = tmp_path / "run"
    seen: list[bool] = []

    def probe(name: str) -> None:  # in the run, before it trains: is the folder held for a second process?
        check = subprocess.run(
            [
                sys.executable,
                "-c",
                "import sys; from fedseg.folder_lock import holding; holding(sys.argv[1]).__enter__()",
                str(out),
            ],
            capture_output=True,
            text=True,
        )
        seen.append("in use by pid" in check.stderr)

    from fedseg.config_load import config_from_cli
    from fedseg.run import run_experiment

    cfg = config_from_cli(
        "demo", None, str(root), "fedavg", 1, None, ["model.channels=[4,8,16]", "data.image_size=32", "eval.hd95=false"]
    )
    run_experiment(cfg, out, on_algorithm_start=probe)
    assert seen == [True]
    assert not (out / LOCK_NAME).exists() and (out / "summary.json").is_file()


def test_a_second_supernode_on_a_held_state_folder_is_refused(held, tmp_path, disc_federation):
    """Two SuperNodes of one site keeping one ``--state`` (a supervisor's restart racing a manual start) would write
    the same site's snapshots: the second is refused after its data check, before Flower starts."""
    pytest.importorskip("flwr")
    from fedseg.data.folder_write import write_folder

    folder, proc = held
    root = write_folder(disc_federation(n_sites=2, cases_per_site=4), tmp_path / "fed")
    site = sorted(p.name for p in root.iterdir() if p.is_dir())[0]
    args = ["--site", site, "--data", str(root), "--superlink", "127.0.0.1:9", "--insecure", "--state", str(folder)]
    result = runner.invoke(app, ["flower", "supernode", *args])
    assert result.exit_code != 0
    lines = [line for line in result.output.strip().splitlines() if line.strip()]
    assert lines[0].startswith("data check passed") and len(lines) == 2, result.output
    assert f"in use by pid {proc.pid}" in lines[1] and "Traceback" not in result.output
    assert "wait for that SuperNode to end" in lines[1] and "--resume" not in lines[1]


def test_another_thread_of_the_process_is_refused(tmp_path):
    """Two ``Experiment.run()`` on one folder from two threads both trained, each round logged twice (a reviewer):
    the hold is the thread's, not the process's."""
    import threading

    inside, leave = threading.Event(), threading.Event()

    def hold() -> None:
        with holding(tmp_path):
            inside.set()
            leave.wait(30)

    thread = threading.Thread(target=hold)
    thread.start()
    try:
        assert inside.wait(30)
        with pytest.raises(FolderInUse, match="in use by another thread of this process"):
            with holding(tmp_path):
                pass
    finally:
        leave.set()
        thread.join(30)
    with holding(tmp_path):  # free again once that thread let go
        pass


def test_a_lock_file_left_by_a_killed_run_does_not_make_its_folder_look_full(tmp_path):
    """A run killed (kill -9) before it wrote anything else leaves only its lock file: `fedseg data synth` then said
    the folder "exists and is not empty" though `ls` showed nothing."""
    folder = tmp_path / "fed"
    folder.mkdir()
    (folder / LOCK_NAME).write_text('{"pid": 1, "command": "fedseg run", "since": "then"}')
    result = runner.invoke(
        app, ["data", "synth", "--preset", "synthetic-retina", "--scale", "0.05", "--out", str(folder)]
    )
    assert result.exit_code == 0, result.output
    assert (folder / "federation.yaml").is_file()


KEEPER = textwrap.dedent(
    """
    import sys
    from pathlib import Path
    from fedseg.folder_lock import hold_until_exit, holding
    hold_until_exit()  # as the fedseg command does
    run, study, sub = (Path(p) for p in sys.argv[1:])
    with holding(run):
        pass  # a run returned: its report is drawn next, under the same hold
    with holding(study):
        with holding(sub):
            pass  # a study's sub-run: let go at once
    print("done", flush=True)
    sys.stdin.read()
    """
)


def test_the_fedseg_command_keeps_its_outermost_folder_until_it_exits(tmp_path):
    """A run's report was drawn after the run let go of its folder: a --resume started in those seconds was let in
    and wrote the same outputs beside it (a reviewer). The command now holds its outermost folder until it exits;
    a study's sub-runs (or an in-process bench's thousand runs) are let go as they end."""
    run, study, sub = tmp_path / "run", tmp_path / "study", tmp_path / "study" / "sub"
    for folder in (run, study, sub):
        folder.mkdir()
    proc = subprocess.Popen(
        [sys.executable, "-c", KEEPER, str(run), str(study), str(sub)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "done"
        for kept in (run, study):
            with pytest.raises(FolderInUse, match=f"in use by pid {proc.pid}"):
                with holding(kept):
                    pass
        with holding(sub):  # let go when its block ended
            pass
    finally:
        proc.stdin.close()
        assert proc.wait(timeout=30) == 0
    assert not (run / LOCK_NAME).exists() and not (study / LOCK_NAME).exists()  # released at exit


def test_a_hold_not_kept_is_let_go_before_an_os_exit_and_a_stale_lock_file_holds_nothing(tmp_path):
    """A SuperNode's --state hold, kept until exit by the fedseg command, stayed as a stale lock file in every site's
    state folder: Flower ends the process with os._exit, past the exit handlers (a reviewer). It is let go when its
    block ends; and a lock file left so is no holder (predict refused such a folder)."""
    from fedseg.folder_lock import held_by_another

    script = (
        "import os, sys\nfrom pathlib import Path\nfrom fedseg.folder_lock import hold_until_exit, holding\n"
        "hold_until_exit()\nwith holding(Path(sys.argv[1]), keep=False):\n    pass\nos._exit(0)\n"
    )
    subprocess.run([sys.executable, "-c", script, str(tmp_path)], check=True, timeout=120)
    assert not (tmp_path / LOCK_NAME).exists()
    (tmp_path / LOCK_NAME).write_text('{"pid": 999999, "command": "fedseg run", "since": "then"}')  # a killed holder's
    assert held_by_another(tmp_path) is None
