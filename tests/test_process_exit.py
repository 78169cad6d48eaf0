"""The ``fedseg`` command's quick exit (``fedseg.process_exit``): what a normal exit does outside the process
still happens (atexit handlers, flushed output, the status, a running thread's work), in real interpreters."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from fedseg.config_load import preset_names


def python(code: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], cwd=cwd, capture_output=True, text=True, timeout=60
    )


def test_atexit_handlers_run_output_is_flushed_and_the_status_kept(tmp_path):
    done = python(
        """
        import atexit, pathlib, sys
        from fedseg.process_exit import exit_now
        atexit.register(lambda: pathlib.Path("atexit-ran").write_text("yes"))
        sys.stdout.write("unflushed to a pipe, no newline")
        sys.stderr.write("and to stderr")
        exit_now(3)
        raise AssertionError("exit_now returned")
        """,
        tmp_path,
    )
    assert done.returncode == 3, done.stderr
    assert done.stdout == "unflushed to a pipe, no newline"
    assert done.stderr == "and to stderr"
    assert (tmp_path / "atexit-ran").read_text() == "yes"


def test_a_ctrl_c_while_the_atexit_handlers_run_is_no_traceback(tmp_path):
    """An audit: a Ctrl-C pressed as a run ended (its report written) interrupted torch's or logging's atexit
    handler, 7 times in 8, with a 10-line traceback. The work is done by then: the handlers run with SIGINT
    ignored, every one of them, and the status is the command's."""
    done = python(
        """
        import atexit, os, pathlib, signal
        from fedseg.process_exit import exit_now
        atexit.register(lambda: pathlib.Path("last-ran").write_text("yes"))  # registered first: runs last
        atexit.register(lambda: (os.kill(os.getpid(), signal.SIGINT), __import__("time").sleep(0.2)))
        exit_now(0)
        """,
        tmp_path,
    )
    assert done.returncode == 0 and "Traceback" not in done.stderr and "KeyboardInterrupt" not in done.stderr, done
    assert (tmp_path / "last-ran").read_text() == "yes"


def test_a_message_status_is_printed_and_exits_1(tmp_path):
    done = python("from fedseg.process_exit import exit_now\nexit_now('error: it went wrong')", tmp_path)
    assert (done.returncode, done.stderr.strip()) == (1, "error: it went wrong")


def test_a_running_non_daemon_thread_finishes_its_work(tmp_path):
    """With another thread still working, the normal exit (which waits for it) is taken."""
    done = python(
        """
        import pathlib, threading, time
        from fedseg.process_exit import exit_now
        def upload():
            time.sleep(0.5)
            pathlib.Path("uploaded").write_text("all of it")
        threading.Thread(target=upload).start()
        exit_now(0)
        """,
        tmp_path,
    )
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "uploaded").read_text() == "all of it"


def test_a_thread_the_command_declared_it_leaves_does_not_hold_the_exit(tmp_path):
    """A thread that never ends (a stopped SuperNode's Runtime API server, which Flower did not stop) held the normal
    exit for ever; declared with ``discard_at_exit``, the exit does not wait for it. Undeclared, it is waited for."""
    forever = """
        import threading, time
        from fedseg.process_exit import discard_at_exit, exit_now
        threading.Thread(target=lambda: time.sleep(3600), name="supernode-runtime-http-api").start()
        {declare}
        exit_now(0)
        """
    done = python(forever.format(declare='discard_at_exit("supernode-runtime-http-api")'), tmp_path)
    assert done.returncode == 0, done.stderr
    with pytest.raises(subprocess.TimeoutExpired):
        subprocess.run([sys.executable, "-c", textwrap.dedent(forever.format(declare=""))], cwd=tmp_path, timeout=5)


def test_the_command_keeps_its_error_status_and_line(tmp_path):
    done = subprocess.run(
        [sys.executable, "-m", "fedseg.cli", "run", "--preset", "no-such", "--out", str(tmp_path / "run")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 1
    assert done.stdout == ""  # the error goes to stderr: a redirected output holds no error text
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert lines == [f"error: unknown preset 'no-such'; available: {', '.join(preset_names())}"]
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize(
    "args, message",
    [
        (["data", "check", "{missing}"], "error: {missing}: does not exist"),
        (["flower", "certs", "--out", "{file}"], "error: {file}:"),
        (["predict", "--model", "{missing}", "--input", "{missing}", "--out", "{out}"], "error: {missing}"),
    ],
)
def test_every_command_family_prints_its_error_line_to_stderr(tmp_path, args, message):
    """fedseg run/predict, fedseg data and fedseg flower stop on a bad input the same way: one ``error:`` line
    on stderr, nothing on stdout, status 1."""
    (tmp_path / "file").write_text("not a folder")
    names = {"missing": tmp_path / "missing", "file": tmp_path / "file", "out": tmp_path / "out"}
    argv = [a.format(**names) for a in args]
    done = subprocess.run([sys.executable, "-m", "fedseg.cli", *argv], capture_output=True, text=True, timeout=120)
    assert (done.returncode, done.stdout) == (1, ""), (done.stdout, done.stderr)
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith(message.format(**names)), done.stderr


def _no_unbuffered_env() -> dict:
    import os

    return {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}  # output stays in the buffer


def test_closed_standard_streams_are_no_error(tmp_path):
    """stdout / stderr closed before start (Python sets them to None): the command still ends with its status."""
    code = "from fedseg.process_exit import exit_now\nprint('lost')\nexit_now(0)"
    for closed in (1, 2):
        done = subprocess.run(
            [sys.executable, "-c", code],
            pass_fds=(),
            stdin=subprocess.DEVNULL,
            timeout=60,
            preexec_fn=lambda fd=closed: __import__("os").close(fd),
        )
        assert done.returncode == 0, closed


def test_output_that_cannot_be_written_is_reported_and_fails_the_command(tmp_path):
    """A final flush that fails (here: a file size limit of 0, as a full disk) gives a message on stderr and
    status 120, as Python's own exit does, not a silent success."""
    import resource

    out = tmp_path / "out.txt"
    with out.open("w") as stdout:
        done = subprocess.run(
            [sys.executable, "-c", "from fedseg.process_exit import exit_now\nprint('x' * 100)\nexit_now(0)"],
            stdout=stdout,
            stderr=subprocess.PIPE,
            text=True,
            timeout=60,
            env=_no_unbuffered_env(),
            preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_FSIZE, (0, resource.RLIM_INFINITY)),
        )
    assert done.returncode == 120
    assert done.stderr.strip().startswith("error: could not write the command's output:"), done.stderr
