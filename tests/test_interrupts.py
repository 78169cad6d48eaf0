"""Stopping commands: SIGTERM on a bench with --jobs 2 stops its running runs, starts none of the queued ones, leaves
no process behind (checked by PID, with real processes) and says how to resume; Ctrl-C on a run says so too."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from fedseg.data.prefetch import usable_cpus

TINY_SET = ["data.scale=0.05", "data.image_size=32", "model.channels=[4,8,16]", "train.batch_size=4", "threads=1"]


def _session_processes(sid: int) -> list[int]:
    """PIDs of the live (non-zombie) processes of session ``sid``, read from /proc."""
    pids = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if int(fields[3]) == sid and fields[0] != "Z":  # fields after the name: state, ppid, pgrp, session
            pids.append(int(stat.parent.name))
    return pids


def _bench_command(tmp_path: Path, name: str, extra_set: list[str], seeds: int, rounds: int) -> list[str]:
    """``fedseg bench`` (``--jobs 2``) of FedAvg over ``seeds`` seeds on a tiny synthetic-retina, out: tmp_path/out."""
    spec = {
        "name": name,
        "base": {"preset": "synthetic-retina"},
        "set": [*TINY_SET, "eval.local_models=false", *extra_set],
        "federations": ["synthetic-retina"],
        "methods": ["fedavg"],
        "seeds": list(range(seeds)),
        "split": {"mode": "ratio"},
        "budget": {"rounds": rounds},
    }
    (tmp_path / "bench.yaml").write_text(yaml.safe_dump(spec))
    bench = ["bench", str(tmp_path / "bench.yaml"), "--out", str(tmp_path / "out"), "--jobs", "2"]
    return [sys.executable, "-m", "fedseg.cli", *bench]


def interruptible() -> None:
    """In the child before it runs: SIGINT at its default, as for a terminal's foreground job. A shell starts
    background jobs with SIGINT ignored and Python keeps an ignored SIGINT ignored, so a suite launched in the
    background would otherwise see Ctrl-C do nothing."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def in_the_background() -> None:
    """In the child before it runs: SIGINT ignored, as a script's background job (`fedseg bench ... &`) has it."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)


@contextlib.contextmanager
def _session(command: list[str], preexec=interruptible) -> Iterator[subprocess.Popen]:
    """``command`` in a new session (its PID is the session id); on leaving, every process of that session is
    killed, so a failing test leaves none behind either."""
    proc = subprocess.Popen(
        command,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
        preexec_fn=preexec,
    )
    try:
        yield proc
    finally:
        if proc.poll() is None or _session_processes(proc.pid):
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def _wait_for(condition, timeout: float, poll: float = 0.2) -> bool:
    deadline = time.monotonic() + timeout
    while not condition() and time.monotonic() < deadline:
        time.sleep(poll)
    return condition()


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads sessions from /proc (Linux)")
@pytest.mark.parametrize("preexec", [interruptible, in_the_background], ids=["foreground", "background"])
def test_sigterm_on_a_bench_with_two_jobs_stops_everything_and_says_how_to_resume(tmp_path, preexec):
    """The bench stops its runs with SIGINT; started in the background by a script (SIGINT inherited ignored) its
    runs ignored it and trained on until SIGKILLed 20 s later, their run.log saying nothing."""
    out = tmp_path / "out"
    with _session(_bench_command(tmp_path, "stoppable", [], seeds=6, rounds=200), preexec) as proc:
        started = lambda: list(out.glob("runs/**/checkpoints/*"))  # noqa: E731  a round finished: both are training
        assert _wait_for(lambda: len({p.parent.parent for p in started()}) >= 2, 240), "two runs never trained"
        assert len(_session_processes(proc.pid)) >= 3  # the bench, its forkserver and two workers
        proc.send_signal(signal.SIGTERM)
        output, _ = proc.communicate(timeout=90)
        assert _wait_for(lambda: not _session_processes(proc.pid), 30), _session_processes(proc.pid)
    assert proc.returncode == 130, output
    assert "interrupted:" in output and "--resume" in output and str(out) in " ".join(output.split()), output
    assert "Traceback" not in output, output
    configs = list(out.glob("runs/**/config.yaml"))
    assert len(configs) == 2, configs  # the 4 queued runs never started
    for config in configs:  # each stopped as Ctrl-C stops a run, not killed
        assert (config.parent / "run.log").read_text().rstrip().endswith("stopped: interrupted"), config.parent


def test_ctrl_c_on_a_run_says_that_resume_continues(tmp_path):
    out = tmp_path / "run"
    run = ["run", "--preset", "demo", "--algorithms", "fedavg", "--rounds", "200", "--out", str(out)]
    with _session([sys.executable, "-m", "fedseg.cli", *run, *(a for s in TINY_SET for a in ("--set", s))]) as proc:
        assert _wait_for(lambda: any(out.glob("checkpoints/*")), 240), "no round finished"
        os.killpg(proc.pid, signal.SIGINT)  # what Ctrl-C does: the whole foreground process group
        output, _ = proc.communicate(timeout=60)
    assert proc.returncode == 130, output
    assert "interrupted: every finished round is checkpointed; run the same command with --resume" in output, output
    assert "Traceback" not in output, output
    assert (out / "run.log").read_text().splitlines()[-1].endswith(" stopped: interrupted")  # the log says why it ends


def _ctrl_c_once_drawing(run: list[str], out: Path, figure: str) -> str:
    """The output of `fedseg RUN...` (with ``TINY_SET``) given Ctrl-C as soon as a file matching ``figure`` is in
    ``out`` (a report being drawn); it must exit 130."""
    with _session([sys.executable, "-m", "fedseg.cli", *run, *(a for s in TINY_SET for a in ("--set", s))]) as proc:
        drawing = lambda: any(out.glob(figure)) or proc.poll() is not None  # noqa: E731
        assert _wait_for(drawing, 240, poll=0.01) and proc.poll() is None
        os.killpg(proc.pid, signal.SIGINT)
        output, _ = proc.communicate(timeout=60)
    assert proc.returncode == 130, output
    return output


def test_ctrl_c_while_the_report_is_drawn_says_the_results_are_written_and_how_to_draw_it(tmp_path):
    """Training finished, then Ctrl-C while report.html is drawn (its first figure is on disk, drawn aside; the page
    and figures/ are written last): one line saying the results are written and which command draws the report, no
    traceback, no half-written report nor figures; that command draws it."""
    out = tmp_path / "run"
    run = ["run", "--preset", "demo", "--algorithms", "fedavg", "--rounds", "1", "--out", str(out)]
    output = _ctrl_c_once_drawing(run, out, ".figures-*/validation.png")  # the report's first figure, drawn aside
    said = " ".join(output.split())
    assert f"interrupted: training finished and its results are written in {out}, the report was not drawn" in said
    assert f"`fedseg report {out}` draws it" in said and "Traceback" not in output, output
    assert not (out / "report.html").exists() and not list(out.glob(".report.html.*"))  # no temp file left
    assert not list(out.glob(".figures-*")) and not list(out.glob("figures/*.png"))  # nor figures drawn aside
    drawn = subprocess.run([sys.executable, "-m", "fedseg.cli", "report", str(out)], capture_output=True, text=True)
    assert drawn.returncode == 0 and (out / "report.html").is_file(), drawn.stdout + drawn.stderr


def test_ctrl_c_while_a_studys_reports_are_drawn_says_its_runs_are_written(tmp_path):
    """A holdout study whose run finished, Ctrl-C while the reports are drawn: one line saying the study's runs and
    table are written and which command draws the reports (it said "every finished round is checkpointed ...
    --resume", as for an interrupted training)."""
    out = tmp_path / "study"
    run = [
        "run",
        "--preset",
        "demo",
        "--algorithms",
        "fedavg",
        "--rounds",
        "1",
        "--holdout",
        "site2",
        "--out",
        str(out),
    ]
    output = _ctrl_c_once_drawing(run, out, "**/.figures-*/*.png")  # a report's figure, drawn aside
    said = " ".join(output.split())
    assert f"interrupted: the study's runs finished and its unseen.csv is written in {out}" in said, output
    assert f"`fedseg report {out}` draws them" in said and "Traceback" not in output, output
    drawn = subprocess.run([sys.executable, "-m", "fedseg.cli", "report", str(out)], capture_output=True, text=True)
    assert drawn.returncode == 0 and (out / "report.html").is_file(), drawn.stdout + drawn.stderr


@pytest.mark.slow
def test_a_failing_run_with_two_jobs_stops_the_bench_with_one_line_and_no_process_left(tmp_path):
    crash = "faults=[{site: site2, kind: crash, round: 1}]"
    with _session(_bench_command(tmp_path, "failing", [crash], seeds=4, rounds=2)) as proc:
        output, _ = proc.communicate(timeout=300)
        assert _wait_for(lambda: not _session_processes(proc.pid), 30), _session_processes(proc.pid)
    assert proc.returncode == 1, output
    errors = [line for line in output.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "site2" in errors[0] and "crash" in errors[0], output
    assert "Traceback" not in output, output
    assert len(list((tmp_path / "out").glob("runs/**/config.yaml"))) <= 2, output  # the queued runs never started


@pytest.fixture
def small_disk(tmp_path):
    """A 300 kB tmpfs (root only; skipped elsewhere): a run's first checkpoint does not fit."""
    mount = tmp_path / "disk"
    mount.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=300k", "tmpfs", str(mount)], capture_output=True).returncode:
        pytest.skip("cannot mount a tmpfs here (needs root)")
    yield mount
    subprocess.run(["umount", "-l", str(mount)], check=False)


def test_a_full_disk_ends_the_run_with_one_line_naming_the_file_and_no_temp_file(small_disk):
    from typer.testing import CliRunner

    from fedseg.cli import app

    out = small_disk / "run"
    args = ["run", "--preset", "demo", "--algorithms", "fedavg", "--rounds", "2", "--out", str(out)]
    result = CliRunner().invoke(app, [*args, *(a for s in TINY_SET for a in ("--set", s))])
    assert result.exit_code == 1, result.output
    assert result.output.strip() == f"error: {out / 'checkpoints' / 'fedavg.pt'}: No space left on device"
    assert not list((out / "checkpoints").iterdir())  # the half-written temp file was removed


def _process_server_of(sid: int) -> int | None:
    """The PID of the worker pool's process server in session ``sid`` while it starts or imports, else None."""
    for pid in _session_processes(sid):
        with contextlib.suppress(OSError):
            if b"server_preload" in Path(f"/proc/{pid}/cmdline").read_bytes():
                return pid
    return None


def run_watching_process_server(command: list[str]) -> tuple[bool, str]:
    """Run ``command`` in a session of its own to its end (it must succeed): whether the worker pool's process
    server was seen in that session (:func:`_process_server_of`, polled every 0.05 s), and its output."""
    seen = False
    with _session(command) as proc:
        while proc.poll() is None:
            seen = seen or _process_server_of(proc.pid) is not None
            time.sleep(0.05)
        output = proc.stdout.read() if proc.stdout else ""
    assert proc.returncode == 0, output[-3000:]
    return seen, output


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads sessions from /proc (Linux)")
@pytest.mark.parametrize("stop", ["ctrl-c", "sigterm"])
def test_ctrl_c_while_the_worker_pool_starts_prints_one_line_and_leaves_no_process(tmp_path, stop):
    """Ctrl-C, or a SIGTERM to the command alone, as soon as the pool's process server exists (the command then
    imports torch for seconds): one line, no process left. A SIGTERM there ended the command silently (status -15:
    it handled SIGTERM only from the run's start on)."""
    out = tmp_path / "run"
    run = ["run", "--preset", "demo", "--algorithms", "fedavg", "--rounds", "200", "--workers", "2", "--out", str(out)]
    with _session([sys.executable, "-m", "fedseg.cli", *run, *(a for s in TINY_SET for a in ("--set", s))]) as proc:
        # as soon as the pool's process server exists: it imports torch and MONAI for seconds after that
        assert _wait_for(lambda: _process_server_of(proc.pid) is not None, 60), "no process server started"
        if stop == "ctrl-c":
            os.killpg(proc.pid, signal.SIGINT)
        else:
            proc.send_signal(signal.SIGTERM)
        output, _ = proc.communicate(timeout=60)
        assert _wait_for(lambda: not _session_processes(proc.pid), 30), _session_processes(proc.pid)
    assert proc.returncode == 130, output
    # before the data was prepared nothing is in --out: the line says so (it said "--resume" to a run not begun)
    said = " ".join(output.split())
    assert said == f"error: interrupted before the run began: nothing was written to {out}; run the same command"
    assert not out.exists() or not any(out.iterdir())


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads sessions from /proc (Linux)")
@pytest.mark.parametrize(
    "stop", ["ctrl-c", "sigterm", "sigint-to-the-parent"], ids=["ctrl-c", "sigterm", "sigint-parent-only"]
)
def test_stopping_data_synth_while_it_writes_leaves_no_half_federation(tmp_path, stop):
    """Ctrl-C (the whole process group), `kill` and a SIGINT to the parent alone: an audit's SIGTERM left the
    staging folder (the retry then refused the non-empty --out) and its generation workers running."""
    out = tmp_path / "fed"
    synth = ["data", "synth", "--preset", "synthetic-brats", "--out", str(out)]  # 55 volumes: seconds of writing
    with _session([sys.executable, "-m", "fedseg.cli", *synth]) as proc:
        writing = lambda: list(out.glob(".writing-*/site1/images/*"))  # noqa: E731  cases being written
        assert _wait_for(writing, 120), "data synth never wrote a case"
        if stop == "ctrl-c":
            os.killpg(proc.pid, signal.SIGINT)
        else:
            proc.send_signal(signal.SIGTERM if stop == "sigterm" else signal.SIGINT)
        output, _ = proc.communicate(timeout=60)
        assert _wait_for(lambda: not _session_processes(proc.pid), 30), _session_processes(proc.pid)
    assert proc.returncode == 130, output
    assert output.strip() == f"error: interrupted: nothing was written to {out}; run the same command again", output
    assert not out.exists() and not list(tmp_path.iterdir()), list(tmp_path.iterdir())


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads sessions from /proc (Linux)")
@pytest.mark.skipif(usable_cpus() < 2, reason="one CPU: the federation is generated without workers")
def test_a_sigint_to_data_synth_alone_while_its_workers_generate_stops_them_and_it(tmp_path):
    """The generation workers (a process pool) stop with their parent: an audit's SIGINT to the parent alone left
    it waiting on them for 11 minutes after it had said 'interrupted'. A seed no other test caches: generated."""
    out = tmp_path / "fed"
    synth = ["data", "synth", "--preset", "synthetic-brats", "--out", str(out), "--seed", "9731"]
    with _session([sys.executable, "-m", "fedseg.cli", *synth]) as proc:
        assert _wait_for(lambda: len(_session_processes(proc.pid)) >= 3, 120), "no generation workers started"
        proc.send_signal(signal.SIGINT)
        output, _ = proc.communicate(timeout=60)
        assert _wait_for(lambda: not _session_processes(proc.pid), 30), _session_processes(proc.pid)
    assert proc.returncode == 130 and "Traceback" not in output, output
    assert output.strip() == f"error: interrupted: nothing was written to {out}; run the same command again", output


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads sessions from /proc (Linux)")
def test_sigkill_on_a_run_with_two_workers_ends_them_without_a_traceback(tmp_path):
    """SIGKILL (no handler runs) on `fedseg run --workers 2` mid-round: its workers, training or waiting, find the
    pool gone and end quietly. An audit's SIGKILL left each worker's traceback on the terminal after the command
    had ended (``ConnectionResetError`` reading the pipe the dead parent left a reply unread in; ``BrokenPipeError``
    sending its answer), where ``EOFError`` alone was taken for "the pool is gone"."""
    out = tmp_path / "run"
    run = ["run", "--preset", "demo", "--algorithms", "fedavg", "--rounds", "200", "--workers", "2", "--out", str(out)]
    with _session([sys.executable, "-m", "fedseg.cli", *run, *(a for s in TINY_SET for a in ("--set", s))]) as proc:
        assert _wait_for(lambda: any(out.glob("checkpoints/*")), 240), "no round finished"
        time.sleep(0.5)  # into the next round: the workers are answering
        proc.send_signal(signal.SIGKILL)
        output, _ = proc.communicate(timeout=60)
        assert _wait_for(lambda: not _session_processes(proc.pid), 30), _session_processes(proc.pid)
    assert proc.returncode == -signal.SIGKILL
    assert "Traceback" not in output and "Error" not in output, output


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads sessions from /proc (Linux)")
def test_a_sigint_to_a_run_with_two_workers_leaves_no_process_once_it_has_exited(tmp_path):
    """SIGINT to `fedseg run --workers 2` alone (as `kill -INT`), mid-round: when the command has exited, none of its
    processes runs any more. An audit found the pool's process server still running 3-5 s after the command had
    ended (finalizing its torch and MONAI imports after it saw its parent gone), and the resource tracker."""
    out = tmp_path / "run"
    run = ["run", "--preset", "demo", "--algorithms", "fedavg", "--rounds", "200", "--workers", "2", "--out", str(out)]
    with _session([sys.executable, "-m", "fedseg.cli", *run, *(a for s in TINY_SET for a in ("--set", s))]) as proc:
        assert _wait_for(lambda: any(out.glob("checkpoints/*")), 240), "no round finished"
        assert len(_session_processes(proc.pid)) >= 4  # the run, its resource tracker, process server, workers
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=60)  # its end, not its output's: a process it left may hold the pipe open
        left = _session_processes(proc.pid)  # at once: the command waited for its processes
        output, _ = proc.communicate(timeout=60)
    assert proc.returncode == 130, output
    assert left == [], [Path(f"/proc/{p}/cmdline").read_bytes()[:120] for p in left if Path(f"/proc/{p}").exists()]
    assert "interrupted: every finished round is checkpointed" in " ".join(output.split()), output


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux's parent-death signal")
def test_the_process_server_dies_with_a_run_killed_while_it_starts(tmp_path):
    """`fedseg run --workers 2` killed while its pool's process server imports torch (SIGKILL; a SIGTERM in the
    command's first seconds, before it handles SIGTERM, ends it as abruptly): the server ends with it. An audit saw
    the server run on 18 s after a SIGTERM had ended the command then (its imports, then their finalization)."""
    out = tmp_path / "run"
    run = ["run", "--preset", "demo", "--algorithms", "fedavg", "--rounds", "200", "--workers", "2", "--out", str(out)]
    with _session([sys.executable, "-m", "fedseg.cli", *run, *(a for s in TINY_SET for a in ("--set", s))]) as proc:
        assert _wait_for(lambda: _process_server_of(proc.pid) is not None, 60), "no process server started"
        proc.send_signal(signal.SIGKILL)  # no handler runs: what SIGTERM does before the command handles it
        proc.wait(timeout=60)
        # the resource tracker ends on its own once its pipe closes (no torch there: at once)
        assert _wait_for(lambda: not _session_processes(proc.pid), 3), [
            Path(f"/proc/{p}/cmdline").read_bytes()[:100] for p in _session_processes(proc.pid)
        ]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the forkserver start method")
def test_a_process_with_the_pool_server_and_a_daemonic_child_still_exits(tmp_path):
    """A process that started the pool's process server (any `engine.workers > 1` run, a notebook's pool) and a
    daemonic child of its own exits: the server's stop at exit ran before multiprocessing ended that child, then
    waited without end for the resource tracker the child still held (a reviewer's script hung, rc 124)."""
    script = tmp_path / "leaves.py"
    script.write_text(
        "import multiprocessing as mp, time\n"
        "def sleeper():\n    time.sleep(3600)\n"
        "if __name__ == '__main__':\n"
        "    from fedseg.engine.forkserver import ensure_server\n"
        "    ensure_server()\n"
        "    mp.get_context('spawn').Process(target=sleeper, daemon=True).start()\n"
    )
    with _session([sys.executable, str(script)]) as proc:
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            pytest.fail("the process did not exit within 60 s")
        assert _wait_for(lambda: not _session_processes(proc.pid), 30), _session_processes(proc.pid)
    assert proc.returncode == 0, proc.communicate()[0]
