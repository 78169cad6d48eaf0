"""Which ``threads`` default: wall time of 2 FedAvg rounds on the ``demo`` preset at threads=1 vs 2.

    .venv/bin/python benchmarks/threads.py [--repeats 5]

Two conditions: the machine as it is (run it on a quiet machine), and with one competing
CPU-bound process (another training run on the same machine, as on a shared workstation or a CI
runner). Each repeat runs threads=1 and threads=2 back to back, alternating which goes first, each
in a fresh process; the ratio t(2) / t(1) of each repeat is reported with its median and spread
(min, max). Writes ``benchmarks/results/threads.json``.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).parent
CMD = [sys.executable, "-m", "fedseg.cli", "run", "--preset", "demo", "--rounds", "2", "--algorithms", "fedavg"]


def timed_run(threads: int) -> float:
    """Seconds of one ``fedseg run`` (fresh process, fresh output folder; data generation included)."""
    with tempfile.TemporaryDirectory() as tmp:
        start = time.perf_counter()
        subprocess.run(
            [*CMD, "--threads", str(threads), "--out", str(Path(tmp) / "run")], check=True, capture_output=True
        )
        return time.perf_counter() - start


def burn(stop) -> None:
    """One CPU-bound competitor (a busy loop) until ``stop`` is set."""
    x = 0
    while not stop.is_set():
        for _ in range(100_000):
            x += 1


def measure(repeats: int) -> dict:
    pairs = []
    for i in range(repeats):
        order = (1, 2) if i % 2 == 0 else (2, 1)
        t = {n: timed_run(n) for n in order}
        pairs.append({"threads1_s": t[1], "threads2_s": t[2], "ratio_2_over_1": t[2] / t[1], "first": order[0]})
    ratios = [p["ratio_2_over_1"] for p in pairs]
    return {
        "pairs": pairs,
        "median_ratio_2_over_1": statistics.median(ratios),
        "min_ratio": min(ratios),
        "max_ratio": max(ratios),
        "median_threads1_s": statistics.median(p["threads1_s"] for p in pairs),
        "median_threads2_s": statistics.median(p["threads2_s"] for p in pairs),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    report = {"command": f"python benchmarks/threads.py --repeats {args.repeats}", "cpus": os.cpu_count()}
    report["quiet"] = measure(args.repeats)
    stop = mp.Event()
    competitor = mp.Process(target=burn, args=(stop,))
    competitor.start()
    try:
        report["one_competing_process"] = measure(args.repeats)
    finally:
        stop.set()
        competitor.join()
    (HERE / "results" / "threads.json").write_text(json.dumps(report, indent=1))
    for cond in ("quiet", "one_competing_process"):
        r = report[cond]
        print(
            f"{cond}: t(2)/t(1) median {r['median_ratio_2_over_1']:.2f} (min {r['min_ratio']:.2f}, max "
            f"{r['max_ratio']:.2f}); medians {r['median_threads1_s']:.1f} s vs {r['median_threads2_s']:.1f} s"
        )


if __name__ == "__main__":
    main()
