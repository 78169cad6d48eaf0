"""benchmarks/gpu.py: its CPU mode end to end (real runs in its own child processes), a case killed at its time
limit keeps what it measured, a bad --set is one line, and nvidia-smi lines become per-phase busy fractions."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from datetime import datetime
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "gpu.py"
PHASES = ["startup", "train", "validation", "round_other", "final_eval", "algorithm_setup", "report", "exit", "total"]


def _gpu_module():
    spec = importlib.util.spec_from_file_location("benchmark_gpu", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses resolve the module's annotations through sys.modules
    spec.loader.exec_module(module)
    return module


def _run(out: Path, *args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    paths = [str(ROOT / "src"), os.environ.get("PYTHONPATH")]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in paths if p)}
    cmd = [sys.executable, str(SCRIPT), "--cpu", "--out", str(out), *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)


@pytest.fixture(scope="module")
def cpu_report(tmp_path_factory) -> tuple[dict, Path]:
    out = tmp_path_factory.mktemp("gpu-bench")
    # a budget that a loaded 2-core machine meets (about 60 s when idle)
    proc = _run(out, "--budget-s", "300")
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads((out / "gpu-cpu.json").read_text()), out


def test_cpu_mode_reports_every_case_and_phase(cpu_report):
    report, out = cpu_report
    assert report["mode"] == "cpu" and set(report["cases"]) == {"demo32", "fets-cpu", "demo32-2workers"}
    assert report["machine"]["torch"] and report["kernel_process"]["status"] == "ok"
    for name, case in report["cases"].items():
        assert case["status"] == "ok", (name, case)
        phases = case["phases"]
        assert list(phases) == PHASES
        for p in ["startup", "train", "validation", "final_eval", "report", "exit", "total"]:
            assert phases[p]["seconds"] > 0, (name, p)
        # the phases tile the child's life: launch -> exit
        parts = sum(v["seconds"] or 0.0 for k, v in phases.items() if k != "total")
        assert parts == pytest.approx(phases["total"]["seconds"], rel=1e-6)
        for p, v in phases.items():
            assert v["share"] is None or 0 <= v["share"] <= 1, (name, p)
            assert v["gpu_busy"] is None and v["gpu_samples"] == 0  # no GPU sampled in CPU mode
        assert set(case["startup_detail"]) == {"imports", "data_and_checks", "first_model"}
        kernel = case["kernel"]
        assert kernel["kernel_s_per_step"] > 0 and kernel["step_wall_s"] > 0, kernel
        assert kernel["input_shape"][0] == 4  # train.batch_size of both presets
        for algo in case["algorithms"].values():
            assert algo["steps_per_round"] > 0 and algo["final_eval_s"] > 0
            assert 0 < algo["final_eval_share_100_rounds"] < 1
            assert algo["round_over_kernel"] > algo["train_over_kernel"] > 0
    demo = report["cases"]["demo32"]
    assert list(demo["algorithms"]) == ["fedavg", "fedsm"] and demo["phases"]["algorithm_setup"]["seconds"] > 0
    assert [r["round"] for r in demo["algorithms"]["fedavg"]["rounds"]] == [1, 2]
    assert demo["algorithms"]["fedavg"]["steady_rounds"] == [2]
    assert demo["derived"]["training_gpu_busy"] is None
    # a round's kernel time from the cases its sites trained on (FedAvg's replies say), else from its steps (FedSM)
    fedavg, fedsm = demo["algorithms"]["fedavg"], demo["algorithms"]["fedsm"]
    assert fedavg["kernel_basis"] == "samples" and fedsm["kernel_basis"] == "steps"
    assert [r["samples"] for r in fedavg["rounds"]] == [fedavg["samples_per_round"]] * 2
    assert fedavg["kernel_s_per_round"] == pytest.approx(
        fedavg["samples_per_round"] * demo["kernel"]["kernel_s_per_step"] / demo["kernel"]["input_shape"][0]
    )
    assert fedavg["round_over_kernel"] == pytest.approx(fedavg["round_s"] / fedavg["kernel_s_per_round"])
    md = (out / "gpu-cpu.md").read_text()
    assert "## demo32: ok" in md and "## fets-cpu: ok" in md
    # two sites at once in two workers: the same test Dice to the last bit (CPU), compared in the report
    (compared,) = report["comparisons"]
    assert (compared["case"], compared["against"], compared["algorithm"]) == ("demo32-2workers", "demo32", "fedavg")
    assert compared["test_dice"] == demo["test_dice"]["fedavg"] and compared["dice_diff"] == 0.0
    assert compared["round_speedup"] > 0 and "## Comparisons" in md
    # the same network and step: measured once, shared
    two = report["cases"]["demo32-2workers"]["kernel"]
    assert two["same_as"] == "demo32" and two["kernel_s_per_step"] == demo["kernel"]["kernel_s_per_step"]


def test_a_dependency_that_fails_to_import_stops_it_in_one_line_before_any_case(tmp_path):
    """A too-old dependency on the GPU machine (pydantic's ``Sentinel`` from typing_extensions < 4.16) is one line
    naming the package, in seconds, not a case lost after minutes."""
    broken = tmp_path / "site"
    broken.mkdir()
    (broken / "pydantic.py").write_text("from typing_extensions import NoSuchName\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(broken), str(ROOT / "src")])}
    cmd = [sys.executable, str(SCRIPT), "--cpu", "--out", str(tmp_path / "out")]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=env)
    assert proc.returncode != 0 and "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines() == [
        "gpu.py: cannot import pydantic: ImportError: cannot import name 'NoSuchName' from 'typing_extensions' "
        f"({Path(__import__('typing_extensions').__file__)})"
    ]
    assert not (tmp_path / "out").exists()


def test_killed_case_keeps_what_it_measured(tmp_path):
    # 500 rounds cannot finish within the case's share of 30 s: killed, its start-up (and rounds) still reported
    proc = _run(tmp_path, "--cases", "demo32", "--budget-s", "30", "--set", "fl.rounds=500", "--label", "cut")
    assert proc.returncode == 0, proc.stderr[-2000:]
    case = json.loads((tmp_path / "gpu-cpu-cut.json").read_text())["cases"]["demo32"]
    assert case["status"] == "timeout" and "fl.rounds=500" in case["overrides"]
    assert case["phases"]["startup"]["seconds"] > 0
    assert case["phases"]["final_eval"]["seconds"] is None  # never reached
    assert case["phases"]["total"]["seconds"] < case["limit_s"] + 10  # killed, not waited for
    assert (tmp_path / "gpu-cpu-cut.md").is_file()


def test_bad_set_is_one_line(tmp_path):
    proc = _run(tmp_path, "--set", "train.no_such_key=1", timeout=120)
    assert proc.returncode != 0 and "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "no_such_key" in lines[0] and lines[0].startswith("--set: case demo32")
    assert not list(tmp_path.iterdir())  # nothing written


def test_nvidia_smi_samples_per_phase():
    gpu = _gpu_module()

    def line(index: int, second: int, util: int, mib: int) -> str:
        return f"{index}, 2026/01/02 03:04:{second:02d}.500, {util}, {mib}"

    lines = [line(0, 1, 10, 100), line(1, 1, 99, 999), line(0, 2, 90, 300), line(0, 3, 50, 200), "0, 2026/01/0"]
    samples = gpu.parse_smi(lines, 0)  # the other GPU's sample and the line cut by a kill are left out
    t0 = datetime(2026, 1, 2, 3, 4, 1, 500000).timestamp()
    assert [s[1:] for s in samples] == [(10.0, 100.0), (90.0, 300.0), (50.0, 200.0)] and samples[0][0] == t0
    both = gpu.busy(samples, [(t0 + 0.5, t0 + 1.5), (t0 + 1.9, t0 + 2.1)])
    assert both == {"gpu_busy": pytest.approx(0.7), "gpu_memory_used_mib_max": 300.0, "gpu_samples": 2}
    none = {"gpu_busy": None, "gpu_memory_used_mib_max": None, "gpu_samples": 0}
    assert gpu.busy(samples, [(t0 + 3, t0 + 4)]) == none


def test_profile_script_cpu_mode(tmp_path):
    """benchmarks/gpu_profile.py --cpu: a real fets-cpu run; per-round times, every ledger row as a site's turn, the
    Python profile of the middle rounds, the last round's profiled ops and the profile of the final evaluation."""
    paths = [str(ROOT / "src"), os.environ.get("PYTHONPATH")]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in paths if p)}
    cmd = [
        sys.executable,
        str(ROOT / "benchmarks" / "gpu_profile.py"),
        "--cpu",
        "--rounds",
        "4",
        "--out",
        str(tmp_path),
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    report = json.loads((tmp_path / "gpu_profile-cpu.json").read_text())
    assert [r["round"] for r in report["rounds"]] == [1, 2, 3, 4] and all(r["seconds"] > 0 for r in report["rounds"])
    train = [t for t in report["turns"] if t["action"] == "train"]
    assert {t["round"] for t in train} == {1, 2, 3, 4} and all(t["steps"] >= 1 and t["seconds"] > 0 for t in train)
    assert report["python_profile"]["rounds"] == [2, 2]
    functions = [r["function"] for r in report["python_profile"]["by_cumulative"]]
    assert any("fedseg/train.py" in f and "(fit)" in f for f in functions), functions[:10]
    kernel = report["kernel"]
    assert kernel["round"] == 4 and kernel["kernel_s"] is None and kernel["by_cpu"][0]["self_cpu_s"] > 0
    final = report["final_profile"]
    tested = [r["function"] for r in final["by_cumulative"]]
    assert final["seconds"] > 0 and any("run/finish.py" in f and "(finish)" in f for f in tested), tested[:10]
    assert "function calls" in (tmp_path / "gpu_profile-cpu.txt").read_text()
    bad = subprocess.run([*cmd[:2], "--cpu", "--rounds", "3"], capture_output=True, text=True, timeout=120, env=env)
    assert bad.returncode != 0 and bad.stderr.strip().splitlines() == [
        "--rounds: at least 4 (round 1 warms up, the last two are the clean and the kernel profile's)"
    ]
