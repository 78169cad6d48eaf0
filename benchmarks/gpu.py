"""Where a run's time goes on a GPU: phases, GPU busy fraction, kernel time, peak memory (issue 26).

Each case is one ``fedseg run`` in a child process of its own (``--child-run``: the CLI's configuration,
``run_experiment`` with the CLI's per-round lines, then ``render_run_report``), so start-up is real and a hang
is killed at the case's time limit. The child streams timestamped events (``time.time()``, seconds) to a JSON-
lines file, flushed line by line: imports done, each algorithm's start, each site's reply (an engine observer,
called right after the exchange's replies are in), each round's end (``on_round_end``), the run's end, the
report's end, ``torch.cuda.max_memory_allocated``. A killed or failed case keeps every phase it reached.

Phases (seconds; the parent stamps the child's launch and its exit):

- ``startup``: launch -> the first round's start (interpreter, imports, data generation and preprocessing,
  checks, the first model); ``startup_detail`` splits it into imports / data and checks / first model;
- ``train``: the training exchanges (every exchange action except ``evaluate`` and ``share_model``);
- ``validation``: the evaluation exchanges inside rounds (per-round validation);
- ``round_other``: the rest of the rounds (aggregation, checkpoint snapshots, the round's bookkeeping);
- ``final_eval``: an algorithm's last round -> its ``summary.json`` written (test evaluation with HD95, model
  files, outputs; ``fedseg.run.run_experiment``);
- ``algorithm_setup``: a later algorithm's start -> its first round (the first algorithm's is in ``startup``);
- ``report``: ``report.html`` rendered; ``exit``: report -> process exit; ``total``: launch -> exit.

An exchange ends at its first reply event and starts ``wall_seconds`` before that (ledger.csv, written when an
algorithm finishes; its rows match the reply events one to one); an algorithm without a ledger.csv (killed)
starts each exchange where the previous one ended. A round starts where the previous one ended (round 1: at its
first exchange's start); a killed algorithm's exchanges after its last finished round count for train and
validation too. Nothing is added to the run's own records.

GPU busy fraction: ``nvidia-smi --query-gpu=index,timestamp,utilization.gpu,memory.used -lms 200`` runs in the
background for the whole script (read through a pseudo-terminal, so its lines come at once); each sample
(utilization: the share of the last sample period in which a kernel ran) counts for the phase whose time
windows hold its timestamp; a phase's busy fraction is its samples' mean / 100 (null: no sample fell in it, or
no sampler). Without nvidia-smi: ``torch.cuda.utilization`` polled every 200 ms if it works (it needs pynvml),
else null. CPU mode: null.

Kernel time (``--child-kernel``, one process for every case, before the runs): the case's network
(``Task.new_model``), optimizer and loss through ``Trainer.fit`` on one fixed random batch already on the
device (``train.batch_size`` x channels x the patch (volumes) or image_size^2), so whatever the run's
configuration changes in a training step (e.g. mixed precision) is measured too; no data loading or
augmentation. After 3 warm-up steps, 5 steps under ``torch.profiler``: the sum of the CUDA kernel (and memcpy)
durations per step (CPU mode: the ops' self CPU time; GPU user annotations, which span kernels already
counted, left out); then 5 unprofiled steps' wall time per step, and ``torch.cuda.max_memory_allocated``. Cases
that differ only in what feeds the steps (``train.budget.*``, ``train.resident_mb``, ``engine.*``, the
``algorithms``, ``fl.rounds``) share the first one's measurement (``same_as``).

Derived, per algorithm, over its steady rounds (rounds >= 2 when there are any, else round 1, which carries the
warm-up; ``steady_rounds`` in the JSON):
``validation_over_training`` = validation s / training s per round; ``final_eval_over_round_training`` =
final evaluation s / one round's training s; ``final_eval_share_100_rounds`` = F / (100 x round s + F);
``round_over_kernel`` = round s / a round's kernel time, ``kernel_s_per_round``: the training cases its training
replies say they saw x kernel s per step / the kernel batch (``kernel_basis: samples``; a site smaller than a
batch trains partial batches, whose steps cost less: the ``fets`` preset's 11 sites train 1-3 steps of 1-4 cases;
linear in the batch, so a lower bound of the kernel time and ``round_over_kernel`` an upper bound),
else optimizer steps per round x kernel s per step (``steps``; ledger.csv, training rows, forward-only rows
excluded; FedSM's steps include its selector's, the kernel time is the segmentation network's);
``train_over_kernel`` likewise with the training exchanges only. Until 2026-11-30 it was steps-based only, which
overstated the kernel time of a round of partial batches (``gpu-h200.json``'s ``fets``: 14 steps of 4 cases).

Comparisons (``comparisons`` in the JSON, a table in the Markdown): a case with ``compare_to`` against that case,
per algorithm both ran: the difference of their global test Dice and their rounds' speed-up. GPU: ``fets-2slots``
(two sites at once on the one GPU, ``engine.devices: [cuda:0, cuda:0]``) against ``fets``, ``retina256-again``
(retina256's FedAvg again: the run-to-run tolerance under bf16 and cuDNN autotuning) against ``retina256``. CPU:
``demo32-2workers`` against ``demo32`` (the difference must be 0: results are bit-identical for any W).

    python benchmarks/gpu.py [--cpu] [--set KEY=VALUE ...] [--label NAME] [--out DIR] [--budget-s 480]
        [--cases NAME,...] [--keep-runs]

Writes ``OUT/gpu.json`` + ``gpu.md`` (``--cpu``: ``gpu-cpu.*``; ``--label L``: ``gpu-L.*`` / ``gpu-cpu-L.*``)
after every case, so a later failure or kill loses nothing measured before. It imports fedseg from the
checkout it lives in (``src/`` first on the path, the children too), so an installed fedseg of another version
cannot stand in for it; it first imports what the runs need and stops with one line naming what is missing. On
a GPU machine without a registry, with the wheels of fedseg's dependencies the machine lacks in ``.whl/``
(``typing_extensions`` among them: pydantic needs 4.16 or newer), in under 10 minutes:

    python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl && \\
    PYTHONPATH=/tmp/site timeout 560 python3 benchmarks/gpu.py --out $OUT
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import json
import math
import os
import platform
import pty
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

HERE = Path(__file__).parent
SOURCE = HERE.parent / "src"  # this checkout's fedseg, ahead of any installed one (module docstring)
if (SOURCE / "fedseg").is_dir() and str(SOURCE) not in sys.path[:1]:
    sys.path.insert(0, str(SOURCE))
RESULTS = HERE / "results"
SAMPLE_MS = 200
PROJECTED_ROUNDS = 100
WARMUP_STEPS, PROFILED_STEPS, TIMED_STEPS = 3, 5, 5
KERNEL_CAP_S = 60.0  # the kernel process's limit at most
KERNEL_FLOOR_S = 40.0  # and at least, where half the budget allows (Runner.kernels)
MIN_CASE_S = 10.0  # a case with less time left than this is skipped
PHASES = ["startup", "train", "validation", "round_other", "final_eval", "algorithm_setup", "report", "exit", "total"]


@dataclass
class Case:
    """One measured run: ``preset`` + ``overrides`` (exactly what the child runs, recorded in the JSON);
    ``weight``: its share of the time left when it starts, against the cases after it."""

    name: str
    preset: str
    overrides: list[str]
    weight: float
    what: str = ""
    extra: list[str] = field(default_factory=list)
    compare_to: str | None = None  # a case of the same run with one thing changed: ``comparisons`` in the JSON
    optional: bool = False  # run only when ``--cases`` names it

    def all_overrides(self) -> list[str]:
        return [*self.overrides, *self.extra]


RETINA_GPU = ["data.image_size=256", "fl.rounds=2", "device=cuda"]
FETS_GPU = ["data.image_size=128", "algorithms=[fedavg]", "fl.rounds=3", "device=cuda"]


def gpu_cases() -> list[Case]:
    return [
        Case(
            "retina256",
            "synthetic-retina",
            [*RETINA_GPU, "algorithms=[fedavg,fedsm]"],
            1.0,  # weights ~ the seconds each took on an H100 (gpu.json, gpu-run1.json): 97, 88, 73, ~50, 112+
            "2D UNet at 256^2, FedAvg and FedSM (3 networks), full-size synthetic-retina (904 training images)",
        ),
        Case(
            "fets",
            "fets",
            FETS_GPU,  # issue 26's command with one more round: rounds 2 and 3 are past the warm-up
            0.9,
            "FeTS DynUNet (22.6M parameters) on 128^3 patches of 128^3 synthetic-brats volumes, FedAvg",
        ),
        Case(
            "fets-2slots",
            "fets",
            [*FETS_GPU, "engine.workers=2", "engine.devices=[cuda:0,cuda:0]"],
            0.75,
            "fets with two sites at once on the one GPU (two worker processes, one device slot each)",
            compare_to="fets",
        ),
        Case(
            "retina256-again",
            "synthetic-retina",
            [*RETINA_GPU, "algorithms=[fedavg]"],
            0.5,
            "retina256's FedAvg once more (the data cached): the GPU's run-to-run difference of the test Dice "
            "(bf16, cuDNN autotuning)",
            compare_to="retina256",
        ),
        Case(
            "fets-25steps",
            "fets",
            [*FETS_GPU, "train.budget.unit=steps", "train.budget.amount=25"],
            1.5,
            "fets with 25 SGD steps per site and round (a FeTS site of ~100 cases, one epoch at batch 4): whether the "
            "per-site fixed cost (first batch, weights in and out) still keeps the GPU from 70% busy at that size",
            optional=True,
        ),
        Case(
            "fets-host-crops",
            "fets",
            [*FETS_GPU, "train.resident_mb=0"],
            0.9,
            "fets with its patches cropped on the CPU and copied (train.resident_mb=0, as before volumes were kept "
            "on the GPU): what cropping on the device saves per site and round; the same crops, so the same Dice up "
            "to the GPU's run-to-run tolerance",
            compare_to="fets",
            optional=True,
        ),
        Case(
            "retina256-compile",
            "synthetic-retina",
            [*RETINA_GPU, "algorithms=[fedavg]", "train.compile=true"],
            1.0,
            "retina256-again with train.compile (torch.compile): at 256^2 a step's wall time is ~4.5x its kernels",
            compare_to="retina256-again",
            optional=True,
        ),
    ]


DEMO32 = ["data.image_size=32", "data.scale=0.05", "model.channels=[8,16,32]", "fl.rounds=2", "device=cpu"]


def cpu_cases() -> list[Case]:
    return [
        Case(
            "demo32",
            "demo",
            [*DEMO32, "algorithms=[fedavg,fedsm]"],
            0.5,
            "synthetic-retina at 32^2, 8 images per site, a 3-level UNet, FedAvg and FedSM",
        ),
        Case(
            "fets-cpu",
            "fets-cpu",
            ["data.image_size=32", "data.scale=0.1", "model.channels=[4,8,16]", "fl.rounds=1", "device=cpu"],
            0.5,
            "fets-cpu at 32^3 (32^3 patches), 33 volumes, a 3-level UNet, one round of FedAvg",
        ),
        Case(
            "demo32-2workers",
            "demo",
            [*DEMO32, "algorithms=[fedavg]", "engine.workers=2", "engine.devices=[cpu,cpu]"],
            0.3,
            "demo32's FedAvg with two sites at once (two worker processes): the same Dice to the last bit",
            compare_to="demo32",
        ),
    ]


# --- children ------------------------------------------------------------------------------------------------
class EventLog:
    """A JSON-lines file of ``{"t": unix seconds, "event": name, ...}``, each line flushed when written."""

    def __init__(self, path: Path) -> None:
        self.file = open(path, "a")  # noqa: SIM115 - open for the child's whole life
        self.lock = threading.Lock()

    def __call__(self, event: str, **fields) -> None:
        with self.lock:
            self.file.write(json.dumps({"t": time.time(), "event": event, **fields}) + "\n")
            self.file.flush()


def child_run(spec: dict) -> None:
    """One case: ``fedseg run`` as the CLI does it (stdout not a terminal), its events to ``spec["events"]``."""
    log = EventLog(Path(spec["events"]))
    from fedseg.api import render_run_report
    from fedseg.config_load import load_config
    from fedseg.interrupts import terminate_on_signals
    from fedseg.run import run_experiment

    log("imported")
    cfg = load_config(preset=spec["preset"], overrides=spec["overrides"])
    log("config", rounds=cfg.fl.rounds)
    current = {"algorithm": ""}

    def on_algorithm_start(name: str) -> None:
        current["algorithm"] = name
        log("algorithm_start", algorithm=name)

    def observe(site, action, msg, reply) -> None:
        samples = reply.meta.get("samples")  # training cases seen (FedAvg's train_meta); None where not said
        samples = samples if isinstance(samples, int) and not isinstance(samples, bool) else None
        log("reply", algorithm=current["algorithm"], site=site, action=action, samples=samples)

    def on_round_end(name: str, rnd: int, losses: dict) -> None:
        log("round_end", algorithm=name, round=rnd)

    out = Path(spec["run_dir"])
    with terminate_on_signals():
        run_experiment(
            cfg,
            out,
            observers=[observe],
            on_round_end=on_round_end,
            on_algorithm_start=on_algorithm_start,
            on_log_line=lambda line: print(line, flush=True),
        )
        log("run_done")
        render_run_report(out, cfg)
        log("report_done")
    import torch

    if torch.cuda.is_available() and torch.cuda.is_initialized():
        log("cuda_memory", max_allocated_mib=torch.cuda.max_memory_allocated() / 2**20)


class FixedBatch:
    """What ``Trainer.fit`` trains on besides a ``CaseSet``: the same batch ``(x, y)`` at every step, already on
    the device (``x``: (B, C, *S) float, ``y``: (B, R, *S) region masks in {0, 1})."""

    name = "fixed-batch"

    def __init__(self, x, y) -> None:
        self.x, self.y = x, y

    def __len__(self) -> int:
        return len(self.x)

    def batch(self, idx, device):
        return self.x, self.y


def input_shape(cfg, dims: int) -> tuple[int, ...]:
    """The spatial shape of a training batch: the patch (volumes) or ``data.image_size`` per axis."""
    if cfg.data.volume.patch_size is not None:
        from fedseg.data.volumes import patch_size

        return patch_size(cfg.data.volume, dims)
    return (cfg.data.image_size,) * dims


def kernel_microseconds(prof, device_type: str) -> float:
    """Device time of the profiled events, microseconds: CUDA kernels and copies (``cuda``), else the ops' self
    CPU time."""
    from torch.autograd import DeviceType

    if device_type == "cuda":
        # a GPU user annotation (e.g. ``Optimizer.step#SGD.step``) spans kernels counted already (torch leaves
        # them out of its own summary too)
        kernels = [e for e in prof.events() if e.device_type == DeviceType.CUDA and not _user_annotation(e)]
        return float(sum(e.time_range.elapsed_us() for e in kernels))
    return float(sum(e.self_cpu_time_total for e in prof.events() if e.device_type == DeviceType.CPU))


def _user_annotation(event) -> bool:
    return bool(getattr(event, "is_user_annotation", False))


def measure_kernel(preset: str, overrides: list[str]) -> dict:
    """One training step's kernel time, wall time and peak memory for the case's network (module docstring)."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    from fedseg.config import BudgetConfig
    from fedseg.config_load import load_config
    from fedseg.data.sources import build_federation
    from fedseg.engine.context import Task
    from fedseg.models.factory import count_parameters
    from fedseg.train import Trainer

    cfg = load_config(preset=preset, overrides=overrides)
    torch.set_num_threads(cfg.threads)  # as run_experiment does
    # the federation's header only (dims, channels, regions): tiny, so nothing large is generated
    small = load_config(preset=preset, overrides=[*overrides, "data.scale=0.01", "data.image_size=32"])
    fed = build_federation(small)
    task = Task.of(cfg, fed)
    device = task.device
    cuda = device.type == "cuda"
    gen = torch.Generator().manual_seed(0)
    shape = (cfg.train.batch_size, fed.channels, *input_shape(cfg, fed.spatial_dims))
    x = torch.randn(shape, generator=gen).to(device)
    y = (torch.rand((shape[0], len(fed.regions.names), *shape[2:]), generator=gen) > 0.5).float().to(device)
    data = FixedBatch(x, y)
    if cuda:
        torch.cuda.reset_peak_memory_stats(device)
    model = task.new_model()
    trainer = Trainer(cfg.train, device)
    opt = trainer.new_optimizer(model)

    def steps(n: int) -> None:
        trainer.fit(model, data, torch.Generator().manual_seed(1), opt, BudgetConfig(unit="steps", amount=n))
        if cuda:
            torch.cuda.synchronize(device)

    steps(WARMUP_STEPS)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with profile(activities=activities) as prof:
        steps(PROFILED_STEPS)
    kernel_us = kernel_microseconds(prof, device.type)
    began = time.perf_counter()
    steps(TIMED_STEPS)
    wall = (time.perf_counter() - began) / TIMED_STEPS
    return {
        "input_shape": list(shape),
        "parameters": count_parameters(model),
        "device": str(device),
        "kernel_s_per_step": kernel_us / 1e6 / PROFILED_STEPS if kernel_us > 0 else None,
        "kernel_source": "CUDA kernels and copies (torch.profiler)" if cuda else "ops' self CPU time (torch.profiler)",
        "step_wall_s": wall,
        "max_allocated_mib": torch.cuda.max_memory_allocated(device) / 2**20 if cuda else None,
        "steps": {"warmup": WARMUP_STEPS, "profiled": PROFILED_STEPS, "timed": TIMED_STEPS},
    }


def child_kernel(spec: dict) -> None:
    """Every case's kernel measurement in turn, each written to ``spec["dir"]/<case>.json`` when done."""
    out = Path(spec["dir"])
    import torch

    info = {
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None,
        "cuda_available": torch.cuda.is_available(),
        "device_name": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
    }
    (out / "torch.json").write_text(json.dumps(info))
    measured: dict[tuple, dict] = {}  # kernel_key -> the first such case's result
    for case in spec["cases"]:
        key = kernel_key(case["preset"], case["overrides"])
        if key in measured:
            (out / f"{case['name']}.json").write_text(json.dumps({**measured[key], "seconds": 0.0}))
            continue
        began = time.perf_counter()
        try:
            result = measure_kernel(case["preset"], case["overrides"])
        except Exception as e:  # one case's failure (e.g. out of memory) must not lose the others
            result = {"error": f"{type(e).__name__}: {e}".splitlines()[0][:300]}
        result["seconds"] = time.perf_counter() - began
        measured[key] = {**result, "same_as": case["name"]}
        (out / f"{case['name']}.json").write_text(json.dumps(result))
        if torch.cuda.is_available():
            torch.cuda.empty_cache()


# settings that change what a run feeds its steps, not a step on the fixed batch: cases differing only in these
# share one kernel measurement (``same_as`` in the JSON)
NOT_IN_A_STEP = ("train.budget.", "train.resident_mb=", "engine.", "fl.rounds=", "algorithms=")


def kernel_key(preset: str, overrides: list[str]) -> tuple:
    return (preset, tuple(o for o in overrides if not o.replace(" ", "").startswith(NOT_IN_A_STEP)))


# --- launching a child with a time limit --------------------------------------------------------------------
def launch(args: list[str], limit_s: float, log_path: Path) -> dict:
    """``python gpu.py ARGS`` in a new session, killed with its children (SIGKILL) after ``limit_s``; its launch and
    exit times, status (ok | timeout | failed) and, when failed, the last lines of its output."""
    launched = time.time()
    with open(log_path, "w") as log:
        proc = subprocess.Popen(
            [sys.executable, str(Path(__file__).resolve()), *args],
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        status = "ok"
        try:
            proc.wait(timeout=max(limit_s, 1.0))
        except subprocess.TimeoutExpired:  # its events are on disk line by line: nothing to wait for
            status = "timeout"
            with contextlib.suppress(ProcessLookupError):  # it ended just now
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    ended = time.time()
    if status == "ok" and proc.returncode != 0:
        status = "failed"
    result = {"status": status, "launched": launched, "ended": ended, "returncode": proc.returncode}
    if status == "failed":
        tail = [line for line in log_path.read_text(errors="replace").splitlines() if line.strip()][-20:]
        result["output_tail"] = tail
    return result


# --- GPU sampling --------------------------------------------------------------------------------------------
class GpuSampler:
    """Utilization (%) and memory used (MiB) of the GPU every ``SAMPLE_MS``: nvidia-smi in the background, its
    output read through a pseudo-terminal (so it writes each line at once, not in 4 KB blocks) by a thread;
    else ``torch.cuda.utilization`` polled by a thread; else nothing (``source`` None)."""

    def __init__(self, index: int) -> None:
        self.index = index
        self.proc: subprocess.Popen | None = None
        self.lines: list[str] = []
        self.polled: list[tuple[float, float, float | None]] = []
        self.stop_event = threading.Event()
        self.thread: threading.Thread | None = None
        self.source: str | None = None

    def start(self) -> None:
        smi = shutil.which("nvidia-smi")
        if smi:
            query = "--query-gpu=index,timestamp,utilization.gpu,memory.used"
            master, slave = pty.openpty()
            cmd = [smi, query, "--format=csv,noheader,nounits", "-lms", str(SAMPLE_MS)]
            self.proc = subprocess.Popen(cmd, stdout=slave, stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL)
            os.close(slave)
            self.thread = threading.Thread(target=self._read, args=(master,), daemon=True)
            self.source = "nvidia-smi"
        elif torch_utilization() is not None:
            self.thread = threading.Thread(target=self._poll, daemon=True)
            self.source = "torch.cuda.utilization"
        if self.thread is not None:
            self.thread.start()

    def _read(self, fd: int) -> None:
        pending = b""
        while True:
            try:
                chunk = os.read(fd, 4096)
            except OSError:  # the pty closes when nvidia-smi ends
                break
            if not chunk:
                break
            *complete, pending = (pending + chunk).split(b"\n")
            self.lines += [line.decode(errors="replace").strip() for line in complete]
        os.close(fd)

    def _poll(self) -> None:
        while not self.stop_event.wait(SAMPLE_MS / 1000):
            util = torch_utilization()
            if util is not None:
                self.polled.append((time.time(), util, None))

    def samples(self) -> list[tuple[float, float, float | None]]:
        """``(unix time, utilization %, memory used MiB or None)`` so far."""
        if self.source != "nvidia-smi":
            return list(self.polled)
        return parse_smi(list(self.lines), self.index)

    def stop(self) -> None:
        self.stop_event.set()
        if self.proc is not None:
            self.proc.terminate()
            self.proc.wait()
        if self.thread is not None:
            self.thread.join(timeout=5)


def torch_utilization() -> float | None:
    """``torch.cuda.utilization`` of cuda:0 (it needs pynvml), None where it does not work."""
    try:
        import torch

        return float(torch.cuda.utilization(0))
    except Exception:  # no pynvml, no driver: the fallback does not work here
        return None


def parse_smi(lines: list[str], index: int) -> list[tuple[float, float, float | None]]:
    """nvidia-smi CSV lines ``index, YYYY/MM/DD HH:MM:SS.mmm, util, memory`` of GPU ``index`` as samples (local
    time, as nvidia-smi writes it); malformed lines (e.g. one cut by the kill) are left out."""
    samples = []
    for line in lines:
        parts = [p.strip() for p in line.split(",")]
        if len(parts) != 4 or parts[0] != str(index):
            continue
        try:
            t = datetime.strptime(parts[1], "%Y/%m/%d %H:%M:%S.%f").timestamp()
            samples.append((t, float(parts[2]), float(parts[3])))
        except ValueError:
            continue
    return samples


def gpu_index() -> int:
    """The index nvidia-smi gives the GPU torch calls cuda:0 (CUDA_VISIBLE_DEVICES' first entry when a number)."""
    first = os.environ.get("CUDA_VISIBLE_DEVICES", "0").split(",")[0].strip()
    return int(first) if first.isdigit() else 0


def smi_query(fields: str) -> list[str] | None:
    smi = shutil.which("nvidia-smi")
    if not smi:
        return None
    try:
        out = subprocess.run(
            [smi, f"--query-gpu={fields}", "--format=csv,noheader", f"--id={gpu_index()}"],
            capture_output=True,
            text=True,
            timeout=20,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return [p.strip() for p in out.stdout.strip().split(",")] if out.returncode == 0 else None


# --- phases from a run's events -----------------------------------------------------------------------------
Window = tuple[float, float]


def read_events(path: Path) -> list[dict]:
    """The child's events; a last line cut by a kill is left out."""
    events = []
    for line in path.read_text().splitlines() if path.is_file() else []:
        try:
            events.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return events


def read_ledger(path: Path) -> list[dict]:
    """``ledger.csv`` rows as dicts of strings; [] before the first algorithm finished (no file yet)."""
    if not path.is_file():
        return []
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def exchanges_of(replies: list[dict], rows: list[dict], begin: float) -> list[dict]:
    """One algorithm's exchanges ``{action, start, end, steps}`` from its reply events (``begin``: its start) and
    ledger.csv rows. The engine records a ledger row and then calls the observers for each answered reply, in
    order, so when the answered rows (exchange > 0, no failure) match the events site by site, each exchange ends
    at its first reply event and starts ``wall_seconds`` before, with its optimizer steps (forward-only rows
    left out); else (no ledger yet: killed) a new exchange begins where the action changes or a site answers
    again, and starts where the previous one ended (steps None)."""
    answered = [r for r in rows if int(r["exchange"]) > 0 and not r["failure"]]
    if answered and [(r["site"], r["action"]) for r in answered] == [(e["site"], e["action"]) for e in replies]:
        return ledger_exchanges(replies, answered, begin)
    out: list[dict] = []
    for e in replies:
        last = out[-1] if out else None
        if last is None or last["action"] != e["action"] or e["site"] in last["sites"]:
            start = last["end"] if last else begin
            out.append({"action": e["action"], "start": start, "end": e["t"], "sites": [e["site"]], "steps": None})
        else:
            last["sites"].append(e["site"])
    return out


def ledger_exchanges(replies: list[dict], answered: list[dict], begin: float) -> list[dict]:
    """``exchanges_of`` where the ledger's rows match the reply events one to one."""
    from fedseg.engine.ledger import FORWARD_ONLY_ACTIONS

    by_number: dict[int, dict] = {}
    previous = begin
    for e, r in zip(replies, answered):
        number = int(r["exchange"])
        if number not in by_number:
            start = max(e["t"] - float(r["wall_seconds"]), previous)
            by_number[number] = {"action": r["action"], "start": start, "end": e["t"], "steps": 0}
            previous = e["t"]
        if r["action"] not in FORWARD_ONLY_ACTIONS:
            by_number[number]["steps"] += int(r["steps"])
    return list(by_number.values())


def algorithm_timeline(
    name: str, events: list[dict], ledger_rows: list[dict], end: float | None, rounds_planned: int
) -> dict:
    """One algorithm's rounds ``[{round, start, end, steps, train_windows, val_windows}]``, its first round's start,
    its final evaluation window (``end``: when its summary existed; None: never) and, when it was killed before
    its last round (``rounds_planned``: ``fl.rounds``), ``unfinished``: the windows of the exchanges after its
    last round's end (train, validation); those after the last round are its unfinished final evaluation."""
    mine = [e for e in events if e.get("algorithm") == name]
    begin = next(e["t"] for e in mine if e["event"] == "algorithm_start")
    replies = [e for e in mine if e["event"] == "reply"]
    exchanges = exchanges_of(replies, [r for r in ledger_rows if r["algorithm"] == name], begin)
    ends = [e for e in mine if e["event"] == "round_end"]
    first = exchanges[0]["start"] if exchanges else None
    rounds, start = [], first
    for r in ends:
        train, val, steps = split_exchanges([x for x in exchanges if start is not None and start <= x["end"] <= r["t"]])
        rounds.append({"round": r["round"], "start": start, "end": r["t"], "train_windows": train, "val_windows": val})
        rounds[-1]["steps"] = sum(steps) if steps and None not in steps else None
        rounds[-1]["samples"] = trained_samples([x for x in replies if start is not None and start < x["t"] <= r["t"]])
        start = r["t"]
    final = (ends[-1]["t"], end) if ends and end is not None else None
    after = ends[-1]["t"] if ends else begin
    in_rounds = end is None and (not ends or ends[-1]["round"] < rounds_planned)  # killed before its last round
    unfinished = split_exchanges([x for x in exchanges if x["end"] > after])[:2] if in_rounds else ([], [])
    return {
        "name": name,
        "begin": begin,
        "first_round_start": first,
        "rounds": rounds,
        "final": final,
        "unfinished": unfinished,
    }


def trained_samples(replies: list[dict]) -> int | None:
    """The training cases the training replies of a round say they saw (``samples``); None where one says none."""
    from fedseg.engine.ledger import EVAL_ACTIONS, FORWARD_ONLY_ACTIONS

    said = [e.get("samples") for e in replies if e["action"] not in EVAL_ACTIONS | FORWARD_ONLY_ACTIONS]
    return sum(said) if said and None not in said else None


def split_exchanges(exchanges: list[dict]) -> tuple[list[Window], list[Window], list[int | None]]:
    """The windows of the training exchanges, of the evaluation exchanges, and the training exchanges' steps."""
    from fedseg.engine.ledger import EVAL_ACTIONS

    train = [x for x in exchanges if x["action"] not in EVAL_ACTIONS]
    val = [(x["start"], x["end"]) for x in exchanges if x["action"] in EVAL_ACTIONS]
    return [(x["start"], x["end"]) for x in train], val, [x["steps"] for x in train]


def span(windows: list[Window]) -> float:
    return sum(b - a for a, b in windows)


def timeline(events: list[dict], launch: dict, ledger_rows: list[dict]) -> dict:
    """Every phase's time windows and the algorithms' timelines of one run (phases the run never reached:
    no windows)."""
    names = [e["algorithm"] for e in events if e["event"] == "algorithm_start"]
    marks = {e["event"]: e["t"] for e in events if e["event"] in ("imported", "run_done", "report_done")}
    starts = [next(e["t"] for e in events if e["event"] == "algorithm_start" and e["algorithm"] == n) for n in names]
    summary_at = [*starts[1:], marks.get("run_done")]
    planned = next((e["rounds"] for e in events if e["event"] == "config"), 0)
    algos = [algorithm_timeline(n, events, ledger_rows, summary_at[i], planned) for i, n in enumerate(names)]
    windows: dict[str, list[Window]] = {p: [] for p in PHASES}
    first = algos[0]["first_round_start"] if algos else None
    last_event = max((e["t"] for e in events), default=launch["launched"])
    windows["startup"] = [(launch["launched"], first if first is not None else last_event)]
    windows["total"] = [(launch["launched"], launch["ended"])]
    for a in algos:
        windows["train"] += a["unfinished"][0]  # a killed algorithm's exchanges after its last round
        windows["validation"] += a["unfinished"][1]
        for r in a["rounds"]:
            windows["train"] += r["train_windows"]
            windows["validation"] += r["val_windows"]
            windows["round_other"] += other_windows((r["start"], r["end"]), r["train_windows"] + r["val_windows"])
        if a["final"]:
            windows["final_eval"].append(a["final"])
        if a is not algos[0] and a["first_round_start"] is not None:
            windows["algorithm_setup"].append((a["begin"], a["first_round_start"]))
    if "run_done" in marks and "report_done" in marks:
        windows["report"] = [(marks["run_done"], marks["report_done"])]
        windows["exit"] = [(marks["report_done"], launch["ended"])]
    detail = {}
    if "imported" in marks:
        detail["imports"] = marks["imported"] - launch["launched"]
        if algos:
            detail["data_and_checks"] = algos[0]["begin"] - marks["imported"]
            if first is not None:
                detail["first_model"] = first - algos[0]["begin"]
    return {"windows": windows, "algorithms": algos, "startup_detail": detail}


def other_windows(outer: Window, inner: list[Window]) -> list[Window]:
    """``outer`` minus the (ordered, disjoint) ``inner`` windows."""
    out, at = [], outer[0]
    for a, b in sorted(inner):
        if a > at:
            out.append((at, a))
        at = max(at, b)
    if outer[1] > at:
        out.append((at, outer[1]))
    return out


# --- numbers ------------------------------------------------------------------------------------------------
def in_windows(samples: list, windows: list[Window]) -> list:
    return [s for s in samples if any(a <= s[0] <= b for a, b in windows)]


def busy(samples: list, windows: list[Window]) -> dict:
    """Of the samples inside ``windows``: ``gpu_busy`` (mean utilization / 100), ``gpu_memory_used_mib_max`` and
    ``gpu_samples`` (their number; None where there are none)."""
    inside = in_windows(samples, windows)
    memory = [s[2] for s in inside if s[2] is not None]
    return {
        "gpu_busy": statistics.fmean(s[1] for s in inside) / 100 if inside else None,
        "gpu_memory_used_mib_max": max(memory) if memory else None,
        "gpu_samples": len(inside),
    }


def ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def algorithm_numbers(algo: dict, kernel_s: float | None, batch: int | None, samples: list) -> dict:
    """Per-round seconds, the derived ratios and the steady rounds' GPU busy fractions of one algorithm (module
    docstring). ``kernel_s``: one step's kernel time on a full batch of ``batch`` cases; a round's kernel time is its
    training cases x ``kernel_s / batch`` where every training reply says how many it saw (a site smaller than a
    batch trains partial batches: the FeTS sites of the ``fets`` preset train 1-3 steps of 1-4 cases), else its
    steps x ``kernel_s`` (``kernel_basis``)."""
    rounds = [r for r in algo["rounds"] if r["start"] is not None]
    rows = [
        {
            "round": r["round"],
            "seconds": r["end"] - r["start"],
            "train_s": span(r["train_windows"]),
            "validation_s": span(r["val_windows"]),
            "steps": r["steps"],
            "samples": r.get("samples"),
        }
        for r in rounds
    ]
    steady = [r for r in rows if r["round"] >= 2] or rows
    steady_windows = [r for r in rounds if r["round"] in {row["round"] for row in steady}]
    mean = {k: statistics.fmean(r[k] for r in steady) if steady else None for k in ("seconds", "train_s")}
    val = statistics.fmean(r["validation_s"] for r in steady) if steady else None
    steps = [r["steps"] for r in steady if r["steps"] is not None]
    seen = [r["samples"] for r in steady if r["samples"] is not None]
    all_said = bool(seen) and len(seen) == len(steady)
    by_samples = all_said and bool(batch)
    if by_samples and kernel_s and batch:
        step_s = statistics.fmean(seen) * kernel_s / batch
    else:
        step_s = statistics.fmean(steps) * kernel_s if steps and kernel_s else None
    final = algo["final"][1] - algo["final"][0] if algo["final"] else None
    projected = PROJECTED_ROUNDS * mean["seconds"] + final if final is not None and mean["seconds"] else None
    return {
        "rounds": rows,
        "steady_rounds": [r["round"] for r in steady],
        "round_s": mean["seconds"],
        "train_s_per_round": mean["train_s"],
        "validation_s_per_round": val,
        "steps_per_round": statistics.fmean(steps) if steps else None,
        "samples_per_round": statistics.fmean(seen) if all_said else None,
        "kernel_basis": ("samples" if by_samples else "steps") if step_s is not None else None,
        "kernel_s_per_round": step_s,
        "final_eval_s": final,
        "validation_over_training": ratio(val, mean["train_s"]),
        "final_eval_over_round_training": ratio(final, mean["train_s"]),
        "final_eval_share_100_rounds": ratio(final, projected),
        "round_over_kernel": ratio(mean["seconds"], step_s),
        "train_over_kernel": ratio(mean["train_s"], step_s),
        # nvidia-smi's busy fraction in the steady rounds alone (round 1 carries cuDNN autotuning and warm-up)
        "steady_train_gpu_busy": busy(samples, [w for r in steady_windows for w in r["train_windows"]])["gpu_busy"],
        "steady_round_gpu_busy": busy(samples, [(r["start"], r["end"]) for r in steady_windows])["gpu_busy"],
    }


def case_numbers(case: Case, launch: dict, work: Path, samples: list) -> dict:
    """The case's JSON entry from its child's events, ledger.csv, kernel measurement and the GPU samples."""
    kernel_file = work / "kernel" / f"{case.name}.json"
    kernel = json.loads(kernel_file.read_text()) if kernel_file.is_file() else None
    events = read_events(work / f"{case.name}.events.jsonl")
    tl = timeline(events, launch, read_ledger(work / case.name / "ledger.csv"))
    total = launch["ended"] - launch["launched"]
    phases = {}
    for p in PHASES:
        w = tl["windows"][p]
        seconds = span(w) if w else None
        phases[p] = {"seconds": seconds, "share": ratio(seconds, total), **busy(samples, w)}
    kernel_s = (kernel or {}).get("kernel_s_per_step")
    batch = ((kernel or {}).get("input_shape") or [None])[0]
    algos = {a["name"]: algorithm_numbers(a, kernel_s, batch, samples) for a in tl["algorithms"]}
    cuda = next((e for e in events if e["event"] == "cuda_memory"), None)
    summary_file = work / case.name / "summary.json"
    summary = json.loads(summary_file.read_text()) if summary_file.is_file() else {}
    return {
        "preset": case.preset,
        "overrides": case.all_overrides(),
        "what": case.what,
        **{k: v for k, v in launch.items() if k not in ("launched", "ended")},
        "phases": phases,
        "startup_detail": tl["startup_detail"],
        "algorithms": algos,
        "kernel": kernel,
        "run_max_allocated_mib": cuda["max_allocated_mib"] if cuda else None,
        "derived": case_derived(phases, algos),
        # global test Dice (the run's own figure); a killed case has none
        "test_dice": {a: e.get("dice", {}).get("global") for a, e in summary.get("algorithms", {}).items()},
    }


def comparisons(cases: list[Case], report_cases: dict) -> list[dict]:
    """Each case with ``compare_to`` against that case, per algorithm both ran: the difference of their test
    Dice (a repeat: the run-to-run tolerance; 2 slots on one device: must match on CPU) and the ratio of their
    rounds' seconds (baseline / case: > 1 when the case is faster)."""
    out = []
    for case in cases:
        base, this = report_cases.get(case.compare_to or ""), report_cases.get(case.name)
        if case.compare_to is None or not base or not this or "algorithms" not in base or "algorithms" not in this:
            continue
        for a in this["algorithms"]:
            if a not in base["algorithms"]:
                continue
            d0, d1 = base.get("test_dice", {}).get(a), this.get("test_dice", {}).get(a)
            out.append(
                {
                    "case": case.name,
                    "against": case.compare_to,
                    "algorithm": a,
                    "test_dice": d1,
                    "test_dice_against": d0,
                    "dice_diff": None if d0 is None or d1 is None else d1 - d0,
                    "round_speedup": ratio(base["algorithms"][a]["round_s"], this["algorithms"][a]["round_s"]),
                }
            )
    return out


def case_derived(phases: dict, algos: dict[str, dict]) -> dict:
    """The case's ratios over its algorithms (sums of their per-round means; module docstring)."""

    def total(key: str) -> float | None:
        values = [a[key] for a in algos.values()]
        return sum(values) if values and None not in values else None

    train, val, final, rnd = (
        total("train_s_per_round"),
        total("validation_s_per_round"),
        total("final_eval_s"),
        total("round_s"),
    )
    return {
        "validation_over_training": ratio(val, train),
        "final_eval_over_round_training": ratio(final, train),
        "final_eval_share_100_rounds": ratio(final, PROJECTED_ROUNDS * rnd + final)
        if final is not None and rnd
        else None,
        "training_gpu_busy": phases["train"]["gpu_busy"],
        "round_over_kernel": {a: n["round_over_kernel"] for a, n in algos.items()},
    }


# --- report -------------------------------------------------------------------------------------------------
def fmt(value, digits: int = 2, pct: bool = False) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    return f"{100 * value:.0f}%" if pct else f"{value:.{digits}f}"


def markdown(report: dict) -> str:
    m = report["machine"]
    lines = [
        f"# Where a run's time goes ({report['mode']}{', ' + report['label'] if report['label'] else ''})",
        "",
        f"{m.get('gpu') or 'no GPU'}; torch {m.get('torch')}, CUDA {m.get('cuda')}; {m.get('cpus')} CPUs; "
        f"GPU sampling: {report['sampling']['source'] or 'none'}; budget {report['budget_s']:.0f} s; "
        f"--set {' '.join(report['user_set']) or '(none)'}",
        "",
    ]
    for name, c in report["cases"].items():
        lines += [f"## {name}: {c['status']}", "", f"`{c['preset']}` with `{' '.join(c['overrides'])}`", ""]
        if "phases" not in c:
            lines += [f"{c.get('reason', '')}", ""]
            continue
        lines += ["| phase | s | share | GPU busy | GPU MiB max |", "|---|---|---|---|---|"]
        for p, v in c["phases"].items():
            lines.append(
                f"| {p} | {fmt(v['seconds'], 1)} | {fmt(v['share'], pct=True)} | {fmt(v['gpu_busy'], pct=True)} "
                f"| {fmt(v['gpu_memory_used_mib_max'], 0)} |"
            )
        k = c.get("kernel") or {}
        lines += [
            "",
            f"Kernel time per step {fmt(k.get('kernel_s_per_step'), 4)} s, step wall {fmt(k.get('step_wall_s'), 4)} "
            f"s, input {k.get('input_shape')}, peak allocated {fmt(k.get('max_allocated_mib'), 0)} MiB "
            f"(run: {fmt(c['run_max_allocated_mib'], 0)} MiB){'; ' + k['error'] if 'error' in k else ''}",
            "",
            "| algorithm | round s | train s | val s | steps | val/train | final s | final/train | final share "
            f"@{PROJECTED_ROUNDS} | round/kernel | train/kernel | GPU busy: train, round (steady rounds) |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|",
        ]
        for a, n in c["algorithms"].items():
            lines.append(
                f"| {a} | {fmt(n['round_s'])} | {fmt(n['train_s_per_round'])} | {fmt(n['validation_s_per_round'])} "
                f"| {fmt(n['steps_per_round'], 0)} | {fmt(n['validation_over_training'])} | {fmt(n['final_eval_s'])} "
                f"| {fmt(n['final_eval_over_round_training'])} | {fmt(n['final_eval_share_100_rounds'], pct=True)} "
                f"| {fmt(n['round_over_kernel'], 1)} | {fmt(n['train_over_kernel'], 1)} "
                f"| {fmt(n['steady_train_gpu_busy'], pct=True)}, {fmt(n['steady_round_gpu_busy'], pct=True)} |"
            )
        lines.append("")
    if report.get("comparisons"):
        lines += [
            "## Comparisons",
            "",
            "| case | against | algorithm | test Dice | against | difference | round speed-up |",
            "|---|---|---|---|---|---|---|",
        ]
        for c in report["comparisons"]:
            diff = "" if c["dice_diff"] is None else f"{c['dice_diff']:+.2e}"
            lines.append(
                f"| {c['case']} | {c['against']} | {c['algorithm']} | {fmt(c['test_dice'], 4)} | "
                f"{fmt(c['test_dice_against'], 4)} | {diff} | {fmt(c['round_speedup'])} |"
            )
        lines.append("")
    return "\n".join(lines) + "\n"


# --- main ---------------------------------------------------------------------------------------------------
def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--cpu", action="store_true", help="tiny CPU cases (a smoke test, < 60 s)")
    ap.add_argument("--set", dest="set_", action="append", default=[], metavar="KEY=VALUE", help="to every case")
    ap.add_argument("--label", default="", help="names the output gpu-LABEL.json / .md")
    ap.add_argument("--out", type=Path, default=RESULTS)
    ap.add_argument("--budget-s", type=float, default=None, help="the whole script's time (default 480; --cpu 240)")
    ap.add_argument(
        "--cases",
        default="",
        help="comma-separated case names (default: all but the optional fets-25steps, fets-host-crops, "
        "retina256-compile)",
    )
    ap.add_argument("--keep-runs", action="store_true", help="keep the runs' folders (printed)")
    ap.add_argument("--child-run", help=argparse.SUPPRESS)
    ap.add_argument("--child-kernel", help=argparse.SUPPRESS)
    return ap.parse_args(argv)


PREFLIGHT = [
    *("torch", "numpy", "scipy", "yaml", "pydantic", "monai", "nibabel"),
    *("fedseg.config", "fedseg.config_load", "fedseg.run"),
]


def preflight() -> None:
    """Import what every run needs (seconds), so a missing or broken package is one line, not a case lost after
    minutes; say which fedseg runs."""
    import importlib

    for name in PREFLIGHT:
        try:
            importlib.import_module(name)
        except Exception as e:  # an ImportError, or a too-old dependency failing inside the import
            sys.exit(f"gpu.py: cannot import {name}: {type(e).__name__}: {str(e).splitlines()[0]}")
    import fedseg

    print(f"fedseg {fedseg.__version__} from {Path(fedseg.__file__).parent}", flush=True)


def select_cases(args: argparse.Namespace) -> list[Case]:
    """The cases to run with ``--set`` appended, each configuration checked here (one line and exit 2 if bad)."""
    from fedseg.config_load import ConfigError, load_config

    cases = cpu_cases() if args.cpu else gpu_cases()
    if args.cases:
        wanted = [n.strip() for n in args.cases.split(",") if n.strip()]
        unknown = sorted(set(wanted) - {c.name for c in cases})
        if unknown:
            sys.exit(f"--cases: unknown {', '.join(unknown)}; this mode has {', '.join(c.name for c in cases)}")
        cases = [c for c in cases if c.name in wanted]
    else:
        cases = [c for c in cases if not c.optional]
    for c in cases:
        c.extra = list(args.set_)
        try:
            load_config(preset=c.preset, overrides=c.all_overrides())
        except (ConfigError, ValueError) as e:
            sys.exit(f"--set: case {c.name} (preset {c.preset}): {str(e).splitlines()[0]}")
    return cases


def machine_info(work: Path) -> dict:
    gpu = smi_query("name,driver_version,memory.total")
    torch_file = work / "kernel" / "torch.json"
    info = json.loads(torch_file.read_text()) if torch_file.is_file() else {}
    return {
        "gpu": gpu[0] if gpu else info.get("device_name"),
        "driver": gpu[1] if gpu else None,
        "gpu_memory_total": gpu[2] if gpu else None,
        **{k: info.get(k) for k in ("torch", "cuda", "cudnn", "cuda_available")},
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
    }


class Bench:
    """One invocation: the cases, the work folder (children's specs, events, logs, runs), the GPU sampler and
    the report, written to ``out/stem.json`` + ``.md`` whenever something was measured."""

    def __init__(self, args: argparse.Namespace, cases: list[Case], budget: float) -> None:
        self.cases, self.out = cases, args.out
        self.stem = ("gpu-cpu" if args.cpu else "gpu") + (f"-{args.label}" if args.label else "")
        self.began = time.time()
        self.deadline = self.began + budget
        self.kernel_share = 0.3 if args.cpu else 0.15  # CPU mode: imports are most of its time
        self.work = Path(tempfile.mkdtemp(prefix="fedseg-gpu-bench-"))
        (self.work / "kernel").mkdir()
        self.sampler = GpuSampler(gpu_index())
        if not args.cpu:
            self.sampler.start()
        self.launched: dict[str, dict] = {}  # case -> its child's launch record (``launch``) and time limit
        self.report: dict = {
            "benchmark": "benchmarks/gpu.py",
            "mode": "cpu" if args.cpu else "gpu",
            "label": args.label,
            "command": " ".join(sys.argv),
            "started_utc": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "budget_s": budget,
            "user_set": list(args.set_),
            "machine": machine_info(self.work),
            "sampling": {"source": self.sampler.source, "interval_ms": SAMPLE_MS, "samples": 0},
            "kernel_process": None,
            "cases": {c.name: {"preset": c.preset, "overrides": c.all_overrides(), "status": "pending"} for c in cases},
        }

    def write(self) -> None:
        """Every finished case's numbers again from all GPU samples so far, then the JSON and Markdown."""
        samples = self.sampler.samples()
        self.report["sampling"]["samples"] = len(samples)
        # every sample, for analyses the tables do not make: [seconds since the script began, busy %, MiB]
        self.report["sampling"]["series"] = [[round(t - self.began, 2), u, m] for t, u, m in samples]
        for case in self.cases:
            if case.name in self.launched:
                self.report["cases"][case.name] = case_numbers(case, self.launched[case.name], self.work, samples)
        self.report["comparisons"] = comparisons(self.cases, self.report["cases"])
        self.report["seconds"] = time.time() - self.began
        self.out.mkdir(parents=True, exist_ok=True)
        (self.out / f"{self.stem}.json").write_text(json.dumps(self.report, indent=1, allow_nan=True))
        (self.out / f"{self.stem}.md").write_text(markdown(self.report))

    def kernels(self) -> None:
        """Every case's kernel measurement in one child process (``kernel_share`` of the budget, at most
        ``KERNEL_CAP_S``, at least ``KERNEL_FLOOR_S`` where half the budget allows: on a fresh GPU machine the
        ``fets`` network's measurement took 23 s, most of it imports, and a 140 s budget's share of 21 s lost it)."""
        cases = [{"name": c.name, "preset": c.preset, "overrides": c.all_overrides()} for c in self.cases]
        (self.work / "kernel.json").write_text(json.dumps({"dir": str(self.work / "kernel"), "cases": cases}))
        left = self.deadline - time.time()
        limit = min(max(self.kernel_share * left, min(KERNEL_FLOOR_S, left / 2)), KERNEL_CAP_S)
        print(f"kernel times: limit {limit:.0f} s", flush=True)
        launched = launch(["--child-kernel", str(self.work / "kernel.json")], limit, self.work / "kernel.log")
        self.report["kernel_process"] = {
            **launched,
            "limit_s": limit,
            "seconds": launched["ended"] - launched["launched"],
        }
        self.report["machine"] = machine_info(self.work)

    def run_case(self, i: int) -> None:
        """Case ``i`` in its child, limited to its weight's share of the time left (skipped below ``MIN_CASE_S``)."""
        case = self.cases[i]
        left = self.deadline - time.time()
        limit = left * case.weight / sum(c.weight for c in self.cases[i:])
        if limit < MIN_CASE_S:
            self.report["cases"][case.name].update(status="skipped", reason=f"budget spent ({left:.0f} s left)")
            return
        print(f"{case.name}: limit {limit:.0f} s", flush=True)
        spec = {
            "preset": case.preset,
            "overrides": case.all_overrides(),
            "events": str(self.work / f"{case.name}.events.jsonl"),
            "run_dir": str(self.work / case.name),
        }
        (self.work / f"{case.name}.spec.json").write_text(json.dumps(spec))
        args = ["--child-run", str(self.work / f"{case.name}.spec.json")]
        self.launched[case.name] = {**launch(args, limit, self.work / f"{case.name}.log"), "limit_s": limit}


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.child_run:
        return child_run(json.loads(Path(args.child_run).read_text()))
    if args.child_kernel:
        return child_kernel(json.loads(Path(args.child_kernel).read_text()))
    budget = args.budget_s if args.budget_s is not None else (240.0 if args.cpu else 480.0)
    preflight()
    bench = Bench(args, select_cases(args), budget)
    bench.write()
    try:
        bench.kernels()
        bench.write()
        for i in range(len(bench.cases)):
            bench.run_case(i)
            bench.write()
    finally:
        bench.sampler.stop()
        bench.write()
        if args.keep_runs:
            print(f"runs kept in {bench.work}")
        else:
            shutil.rmtree(bench.work, ignore_errors=True)
    print(f"wrote {args.out / bench.stem}.json and .md ({bench.report['seconds']:.0f} s)")


if __name__ == "__main__":
    main()
