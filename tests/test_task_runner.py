"""What the site's and the coordinator's Flower task runners share (``fedseg.flower.task_runner``), in real processes
and sockets: a task's token reaches its process on standard input only, a task dies with a runner stopped mid-task,
one task's failure is logged and not the runner's, a failure of the runner is one line, the poll waits only when no
task was pending, and the Runtime API is waited for (an IPv6 one too)."""

from __future__ import annotations

import logging
import os
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time

import pytest

from fedseg.flower.task_runner import one_task, poll, run_task_process, runtime_client
from test_interrupts import interruptible

TOKEN = "t0ken-of-one-task"


def python(code: str) -> list[str]:
    return [sys.executable, "-c", textwrap.dedent(code)]


def test_a_task_process_reads_its_token_on_standard_input_only_and_its_status_is_returned(tmp_path):
    """The token is in no argument (``ps``) and in no environment (``/proc/PID/environ``) of the task's process."""
    seen = tmp_path / "seen"
    task = python(
        f"""
        import pathlib, sys
        from fedseg.flower.runtime_secret import handed_over
        token = handed_over()
        shown = pathlib.Path("/proc/self/cmdline").read_bytes() + pathlib.Path("/proc/self/environ").read_bytes()
        pathlib.Path({str(seen)!r}).write_text(f"{{token}} {{sys.stdin.closed}} {{token.encode() in shown}}")
        sys.exit(3)
        """
    )
    assert run_task_process(task, TOKEN) == 3
    assert seen.read_text() == f"{TOKEN} True False"


def test_a_runner_stopped_mid_task_takes_the_task_with_it(tmp_path):
    """Ctrl-C (SIGINT to the runner alone) while a task runs: the runner kills and reaps the task before it ends."""
    pid_file, said = tmp_path / "task.pid", tmp_path / "runner.log"
    runner = python(
        f"""
        import sys
        from fedseg.flower.task_runner import run_task_process
        task = '''
        import os, pathlib, time
        from fedseg.flower.runtime_secret import handed_over
        handed_over()
        pathlib.Path({str(pid_file)!r}).write_text(str(os.getpid()))
        time.sleep(600)
        '''
        run_task_process([sys.executable, "-c", task], {TOKEN!r})
        """
    )
    with said.open("w") as log:  # a file, not a pipe: a task that outlived the runner would hold a pipe open
        # SIGINT at its default in the child: a suite run in the background (CI) starts it ignored, and Python
        # keeps an ignored SIGINT ignored
        proc = subprocess.Popen(runner, stdout=log, stderr=subprocess.STDOUT, preexec_fn=interruptible)  # noqa: S603
    try:
        deadline = time.monotonic() + 60
        while not pid_file.is_file() or not pid_file.read_text():
            assert time.monotonic() < deadline and proc.poll() is None, said.read_text()
            time.sleep(0.05)
        task_pid = int(pid_file.read_text())
        time.sleep(0.5)  # the runner waits for the task
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert "KeyboardInterrupt" in said.read_text(), said.read_text()
    try:
        os.kill(task_pid, signal.SIGKILL)  # where it outlived the runner: the test leaves nothing behind
    except ProcessLookupError:
        return
    pytest.fail("the task outlived its runner")


@pytest.mark.parametrize(
    ("block", "status", "said"),
    [
        ("import httpx; raise httpx.ConnectError('[Errno 111] Connection refused')", 1, "Some runner: [Errno 111]"),
        ("from fedseg.flower.task_runner import signing_secret; signing_secret('not hex')", 1, "Some runner: non-hex"),
        ("raise TimeoutError('the API is not listening on 127.0.0.1:9 after 300 s')", 1, "Some runner: the API is"),
        ("import os, signal, time; os.kill(os.getpid(), signal.SIGINT); time.sleep(30)", 130, ""),
    ],
)
def test_a_runner_that_fails_says_so_in_one_line_and_exits(block, status, said):
    """A Runtime API that fails a call (``httpx.HTTPError``), a secret that is not hex, a Runtime API that never
    listened: ``<runner>: <reason>`` and exit 1, no traceback; Ctrl-C: 130, nothing said."""
    done = subprocess.run(  # noqa: S603
        python(
            f"""
            from fedseg.flower.task_runner import exits_in_one_line
            with exits_in_one_line("Some runner"):
                {block}
            """
        ),
        capture_output=True,
        text=True,
        timeout=60,
        preexec_fn=interruptible,  # SIGINT at its default, as for a terminal's job (the suite may run in background)
    )
    assert done.returncode == status, done.stderr
    assert done.stderr.startswith(said) and len(done.stderr.splitlines()) == (1 if said else 0), done.stderr


def test_one_tasks_failure_is_logged_with_its_traceback_and_the_runner_goes_on(caplog):
    log = logging.getLogger("fedseg.test_task_runner")
    with caplog.at_level(logging.ERROR, logger=log.name):
        for run_id in (1, 2):
            with one_task(log, "run %d: not started", run_id):
                raise OSError("no more processes")
    assert [r.getMessage() for r in caplog.records] == ["run 1: not started", "run 2: not started"]
    assert all(r.exc_info and r.exc_info[0] is OSError for r in caplog.records)
    with pytest.raises(KeyboardInterrupt), one_task(log, "not contained"):  # the runner stopping is the runner's
        raise KeyboardInterrupt


def test_the_poll_waits_only_after_a_call_that_found_no_task():
    """Tasks queued in a row start at once; a poll that found none waits ``seconds`` before the next."""
    found, handled = iter(["a", "b", None, "c"]), []

    class Done(Exception):
        pass

    def acquire():
        acquired = next(found, Done)
        if acquired is Done:
            raise Done
        return acquired

    with pytest.raises(Done):
        poll(acquire, lambda acquired: handled.append((acquired, time.monotonic())), 1.0)
    (a, at_a), (b, at_b), (none, at_none), (c, at_c) = handled
    assert (a, b, none, c) == ("a", "b", None, "c")
    assert at_b - at_a < 1.0 and at_none - at_b < 1.0 and at_c - at_none >= 1.0


@pytest.mark.parametrize(
    ("family", "host", "address"), [(socket.AF_INET, "127.0.0.1", "127.0.0.1:{}"), (socket.AF_INET6, "::1", "[::1]:{}")]
)
def test_the_runtime_client_is_made_once_its_api_listens(family, host, address):
    """The client is made only once the Runtime API accepts connections (Flower would print a retry line per poll
    before), at an IPv6 address in brackets as at an IPv4 one."""
    from flwr.supercore.runtime import RuntimeHttpClient

    with socket.socket(family) as server:
        try:
            server.bind((host, 0))
        except OSError:
            pytest.skip(f"no {host} on this machine")
        port = server.getsockname()[1]
        later = threading.Timer(0.5, server.listen)  # bound, not listening: a connection is refused until then
        start = time.monotonic()
        later.start()
        try:
            client = runtime_client(address.format(port), True, None, b"s" * 32, "the test's Runtime API")
        finally:
            later.join()
        waited = time.monotonic() - start
    assert isinstance(client, RuntimeHttpClient) and waited >= 0.5
    client.close()
