"""``fedseg.flower.deploy.Processes``: a deployment's processes are stopped with it, also one that has left the
deployment's process tree and group (as Ray's actors do once Flower's simulation process has shut Ray down): it is
found by the private FLWR_HOME every process of the deployment inherits. Real processes, no Flower."""

from __future__ import annotations

import os
import sys

from fedseg.flower.deploy import Processes, is_running

# a launcher that starts a sleeper in a session of its own (no longer our descendant once the launcher exits, and
# in another process group), prints its pid and exits
LAUNCHER = (
    "import subprocess, sys; "
    "p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)'], start_new_session=True); "
    "print(p.pid, flush=True)"
)


def test_a_process_that_left_the_deployments_tree_is_still_stopped(tmp_path):
    home = tmp_path / "home"
    env = {**os.environ, "FLWR_HOME": str(home)}
    with Processes(tmp_path / "processes.json", home) as procs:
        launcher = procs.start("launcher", [sys.executable, "-c", LAUNCHER], tmp_path / "launcher.log", env)
        assert launcher.proc.wait(timeout=60) == 0
        orphan = int((tmp_path / "launcher.log").read_text().split()[0])
        assert is_running(orphan) and orphan in procs.current()
    assert not is_running(orphan)


def test_a_process_of_another_deployment_is_left_alone(tmp_path):
    other = {**os.environ, "FLWR_HOME": str(tmp_path / "other-home")}
    with Processes(tmp_path / "other.json", tmp_path / "other-home") as others:
        sleeper = others.start(
            "sleeper", [sys.executable, "-c", "import time; time.sleep(120)"], tmp_path / "s.log", other
        )
        with Processes(tmp_path / "processes.json", tmp_path / "home") as procs:
            assert sleeper.proc.pid not in procs.current()
        assert is_running(sleeper.proc.pid)
    assert not is_running(sleeper.proc.pid)


def test_stopping_signals_each_process_once(tmp_path, monkeypatch):
    """SIGTERM reaches each process of a deployment once: its process group's signal, not also one of its own. A
    second SIGTERM killed a process mid-way through its graceful exit (Flower's handler puts back the default action
    when it starts): at the end of `fedseg flower local`, site1's SuperNode died with its log cut short and its
    --state lock file left behind."""
    import signal

    sent: list[tuple[str, int]] = []  # (how, target) of every SIGTERM
    kill, killpg = os.kill, os.killpg

    def spy_kill(pid: int, sig: int) -> None:
        if sig == signal.SIGTERM:
            sent.append(("kill", pid))
        kill(pid, sig)

    def spy_killpg(group: int, sig: int) -> None:
        if sig == signal.SIGTERM:
            sent.append(("killpg", group))
        killpg(group, sig)

    home = tmp_path / "home"
    env = {**os.environ, "FLWR_HOME": str(home)}
    with Processes(tmp_path / "processes.json", home) as procs:
        sleep = [sys.executable, "-c", "import time; time.sleep(120)"]
        sleeper = procs.start("sleeper", sleep, tmp_path / "s.log", env)
        launcher = procs.start("launcher", [sys.executable, "-c", LAUNCHER], tmp_path / "launcher.log", env)
        assert launcher.proc.wait(timeout=60) == 0
        orphan = int((tmp_path / "launcher.log").read_text().split()[0])  # in a group of its own: its own signal
        assert is_running(orphan) and is_running(sleeper.proc.pid)
        monkeypatch.setattr(os, "kill", spy_kill)
        monkeypatch.setattr(os, "killpg", spy_killpg)
    monkeypatch.undo()
    assert not is_running(orphan) and sleeper.proc.returncode == -signal.SIGTERM
    assert sent.count(("killpg", sleeper.proc.pid)) == 1 and ("kill", sleeper.proc.pid) not in sent, sent
    assert sent.count(("kill", orphan)) == 1, sent
