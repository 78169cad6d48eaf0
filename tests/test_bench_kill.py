"""A ``fedseg bench --jobs 2`` killed by SIGKILL leaves no process of its own: the process server and each run's
process end with it (Linux's parent-death signal, ``fedseg.engine.forkserver.die_with_parent``), instead of
training on into ``OUT/runs`` until their runs end (real processes, a tiny bench)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest
import yaml

from fedseg.flower.deploy import descendants
from fedseg.interrupts import is_running, start_time

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux's parent-death signal, /proc")

TINY_SET = ["data.scale=0.05", "data.image_size=32", "model.channels=[4,8]", "threads=1", "eval.local_models=false"]


def _wait(condition, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.1)
    return condition()


@pytest.mark.slow
def test_sigkill_of_a_bench_with_jobs_leaves_no_process(tmp_path):
    spec = {
        "name": "tiny",
        "base": {"preset": "synthetic-retina"},
        "set": TINY_SET,
        "federations": ["synthetic-retina"],
        "methods": ["fedavg"],
        "seeds": [0, 1],
        "split": {"mode": "ratio"},
        "budget": {"rule": "rounds", "rounds": 500},  # far longer than the test: the runs train when it is killed
    }
    path = tmp_path / "bench.yaml"
    path.write_text(yaml.safe_dump(spec))
    out = tmp_path / "out"
    command = [sys.executable, "-m", "fedseg.cli", "bench", str(path), "--out", str(out), "--jobs", "2"]
    with open(tmp_path / "bench.log", "wb") as log:
        bench = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    recorded: dict[int, str | None] = {}
    try:
        # its jobs train: a run folder of each holds its lock, and the forkserver's two children run
        def training() -> bool:
            locks = list((out / "runs").rglob(".fedseg-lock")) if (out / "runs").is_dir() else []
            return len(locks) >= 2 and len(descendants(bench.pid)) >= 4

        assert _wait(training, 240), (tmp_path / "bench.log").read_text()[-3000:]
        recorded = {pid: start_time(pid) for pid in descendants(bench.pid)}
        bench.send_signal(signal.SIGKILL)
        bench.wait(timeout=10)

        def left() -> list[int]:  # the same processes (a PID reused meanwhile is another one)
            return [pid for pid, started in recorded.items() if is_running(pid) and start_time(pid) == started]

        assert _wait(lambda: not left(), 10), f"still running after the bench's SIGKILL: {left()}"
    finally:
        if bench.poll() is None:
            bench.kill()
            bench.wait()
        for pid, started in recorded.items():  # a failed assertion leaves nothing running either
            if is_running(pid) and start_time(pid) == started:
                os.kill(pid, signal.SIGKILL)
