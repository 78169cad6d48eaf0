"""Where a ``fets`` round's wall time goes besides its kernels, on a GPU (issue 26): a Python profile of the rounds
after the first, each site's turn timed, and the CUDA kernel time of the last round.

``benchmarks/gpu.py`` says how busy the GPU is; this script says what the CPU does while the GPU waits. One
``fedseg run`` in this process (``run_experiment``, as the CLI does it) with ``--rounds`` R rounds (default 5):

- ``rounds``: each round's wall time (seconds; round 1 from the run's start, start-up included; round R-1 is the
  one no profiler slows down);
- ``turns``: the run's ledger.csv rows (round, site, action, optimizer steps, the site's own seconds around its
  client's ``handle``, the exchange's wall seconds): the simulator runs one site at a time, so a site's turn is
  its ``seconds``;
- ``python_profile``: ``cProfile`` over rounds 2..R-2 (round 1 carries cuDNN autotuning): on Python 3.12 and later
  every thread (``sys.monitoring``: the ``train.loader_workers`` threads' batch preparation shows beside the main
  thread's waits for it, and cumulative times overlap), before 3.12 the main thread only (the batches show as its
  waits): the functions with the most cumulative and own time (seconds, calls), named by module;
- ``kernel``: ``torch.profiler`` (CPU + CUDA) over round R: the sum of CUDA kernel and copy durations against the
  round's wall time, and the 25 CUDA ops with the most device time and the 25 CPU ops with the most own time;
- ``final_profile``: ``cProfile`` from the end of round R to the end of the run (restoring the selected round, the
  final test with HD95/NSD, the written models and the report): its seconds and the functions with the most
  cumulative and own time, as ``python_profile``.

Writes ``OUT/gpu_profile[-LABEL].json`` and ``.txt`` (the pstats listings). ``--set KEY=VALUE`` goes to the run
(e.g. ``train.resident_mb=0``). CPU mode (``--cpu``): the ``fets-cpu`` preset at 32^3 with a tiny network (a
smoke run of the script, seconds).

    python benchmarks/gpu_profile.py [--cpu] [--rounds 5] [--set KEY=VALUE ...] [--label L] [--out DIR]
"""

from __future__ import annotations

import argparse
import cProfile
import csv
import io
import json
import platform
import pstats
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))  # this checkout's fedseg, not an installed one

GPU_CASE = ("fets", ["data.image_size=128", "algorithms=[fedavg]", "device=cuda"])
CPU_CASE = ("fets-cpu", ["data.image_size=32", "data.scale=0.1", "model.channels=[4,8,16]", "device=cpu"])
TOP = 45


def function_rows(stats: pstats.Stats, key: str, n: int) -> list[dict]:
    """The ``n`` functions with the most ``key`` time (``cumulative`` | ``tottime``): name, calls, own and
    cumulative seconds."""
    rows = []
    entries = stats.stats  # type: ignore[attr-defined]  # {(file, line, name): (cc, nc, tt, ct, callers)}
    order = sorted(entries.items(), key=lambda kv: kv[1][3 if key == "cumulative" else 2], reverse=True)
    for (file, line, name), (_, calls, own, cumulative, _) in order[:n]:
        short = file.split("site-packages/")[-1].split("/src/")[-1]
        rows.append({"function": f"{short}:{line}({name})", "calls": calls, "own_s": own, "cumulative_s": cumulative})
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cpu", action="store_true")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--set", dest="set_", action="append", default=[])
    ap.add_argument("--label", default="")
    ap.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    args = ap.parse_args()
    if args.rounds < 4:
        sys.exit("--rounds: at least 4 (round 1 warms up, the last two are the clean and the kernel profile's)")

    import torch
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    from fedseg.config_load import load_config
    from fedseg.run import run_experiment

    preset, overrides = CPU_CASE if args.cpu else GPU_CASE
    overrides = [*overrides, f"fl.rounds={args.rounds}", *args.set_]
    cfg = load_config(preset=preset, overrides=overrides)
    cuda = cfg.device.startswith("cuda")
    last = args.rounds
    python = cProfile.Profile()
    final = cProfile.Profile()  # from the end of the last round to the end of the run
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    kernel_profile = profile(activities=activities)
    state: dict = {"round_start": time.perf_counter(), "rounds": []}

    def on_round_end(name: str, rnd: int, losses: dict) -> None:
        now = time.perf_counter()
        state["rounds"].append({"round": rnd, "seconds": now - state["round_start"]})
        if rnd == 1:
            python.enable()
        if rnd == last - 2:
            python.disable()
        if rnd == last - 1:
            if cuda:
                torch.cuda.synchronize()
            kernel_profile.__enter__()
        if rnd == last:
            if cuda:
                torch.cuda.synchronize()
            kernel_profile.__exit__(None, None, None)
            state["final_start"] = time.perf_counter()
            final.enable()
        state["round_start"] = time.perf_counter()

    began = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        run_dir = Path(tmp) / "run"
        run_experiment(cfg, run_dir, on_round_end=on_round_end)
        final.disable()
        final_s = time.perf_counter() - state["final_start"]
        total = time.perf_counter() - began
        ledger = next(run_dir.rglob("ledger.csv"))
        with open(ledger, newline="") as f:
            keep = ("round", "site", "action", "steps", "seconds", "wall_seconds")
            turns = [
                {k: row[k] if k in ("site", "action") else float(row[k]) for k in keep} for row in csv.DictReader(f)
            ]

    text = io.StringIO()
    stats = pstats.Stats(python, stream=text)
    stats.sort_stats("cumulative").print_stats(TOP)
    stats.sort_stats("tottime").print_stats(TOP)
    text.write(f"\n\n# After round {last}: the final evaluation, models and report ({final_s:.1f} s)\n\n")
    final_stats = pstats.Stats(final, stream=text)
    final_stats.sort_stats("cumulative").print_stats(TOP)
    final_stats.sort_stats("tottime").print_stats(TOP)
    events = kernel_profile.events()
    device_events = [e for e in events if e.device_type == DeviceType.CUDA and not getattr(e, "is_user_annotation", 0)]
    kernel_s = sum(e.time_range.elapsed_us() for e in device_events) / 1e6
    averages = kernel_profile.key_averages()
    by_device = sorted(averages, key=lambda a: getattr(a, "device_time_total", 0.0), reverse=True)[:25]
    by_cpu = sorted(averages, key=lambda a: a.self_cpu_time_total, reverse=True)[:25]
    last_round = next(r["seconds"] for r in state["rounds"] if r["round"] == last)
    result = {
        "benchmark": "gpu_profile",
        "preset": preset,
        "overrides": overrides,
        "machine": {
            "device_name": torch.cuda.get_device_name(0) if cuda else platform.processor() or platform.machine(),
            "torch": torch.__version__,
            "cuda": torch.version.cuda,
        },
        "total_s": total,
        "rounds": state["rounds"],
        "turns": turns,
        "python_profile": {
            "rounds": [2, last - 2],
            "by_cumulative": function_rows(stats, "cumulative", TOP),
            "by_own": function_rows(stats, "tottime", TOP),
        },
        "final_profile": {
            "seconds": final_s,
            "by_cumulative": function_rows(final_stats, "cumulative", TOP),
            "by_own": function_rows(final_stats, "tottime", TOP),
        },
        "kernel": {
            "round": last,
            "round_s": last_round,
            "kernel_s": kernel_s if cuda else None,
            "kernel_share": kernel_s / last_round if cuda else None,
            "by_device": [
                {"op": a.key, "calls": a.count, "device_s": getattr(a, "device_time_total", 0.0) / 1e6}
                for a in by_device
            ],
            "by_cpu": [{"op": a.key, "calls": a.count, "self_cpu_s": a.self_cpu_time_total / 1e6} for a in by_cpu],
        },
    }
    args.out.mkdir(parents=True, exist_ok=True)
    stem = "gpu_profile" + ("-cpu" if args.cpu else "") + (f"-{args.label}" if args.label else "")
    (args.out / f"{stem}.json").write_text(json.dumps(result, separators=(",", ":")) + "\n")
    (args.out / f"{stem}.txt").write_text(text.getvalue())
    print(f"wrote {args.out / stem}.json and .txt ({total:.0f} s); round {last}: {last_round:.2f} s", end="")
    print(f", kernels {kernel_s:.2f} s" if cuda else "")


if __name__ == "__main__":
    main()
