"""FedSM round time and peak memory: 6 sites at 64x64 at the preset's default scale, vs FedAvg.

Each algorithm runs in its own fresh process (so peak RSS is that algorithm's alone) for
``--rounds`` rounds of the ``synthetic-retina`` preset (scale 1.0: the FedSM paper's Table 1
sizes, 905 training images). Round time = wall seconds between round ends (training + per-round
validation); round 1 is reported separately (it includes allocator warm-up).

    .venv/bin/python benchmarks/fedsm_cost.py [--rounds 3] [--threads 2] [--algorithms fedsm fedavg]

Writes benchmarks/results/fedsm_cost.json.
"""

from __future__ import annotations

import argparse
import json
import resource
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from common import RESULTS


def measure(algorithm: str, rounds: int, threads: int, preset: str) -> dict:
    import torch

    from fedseg.config import load_config
    from fedseg.run import prepare, run_algorithm

    cfg = load_config(
        preset=preset, overrides=[f"fl.rounds={rounds}", f"threads={threads}", f"algorithms=[{algorithm}]"]
    )
    torch.set_num_threads(threads)
    prep = prepare(cfg)
    rss_after_data = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    ends = [time.perf_counter()]
    with tempfile.TemporaryDirectory() as out:
        run_algorithm(
            algorithm, prep, Path(out), resume=False, on_round_end=lambda n, r, log: ends.append(time.perf_counter())
        )
    per_round = [b - a for a, b in zip(ends[:-1], ends[1:])]
    return {
        "algorithm": algorithm,
        "preset": preset,
        "scale": cfg.data.scale,
        "image_size": cfg.data.image_size,
        "sites": len(prep.site_data),
        "train_cases": sum(len(s.train) for s in prep.site_data),
        "threads": threads,
        "round_seconds": per_round,
        "round_seconds_after_first": sum(per_round[1:]) / max(1, len(per_round) - 1),
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "rss_after_data_mb": rss_after_data,
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--preset", default="synthetic-retina")
    ap.add_argument("--algorithms", nargs="+", default=["fedsm", "fedavg"])
    args = ap.parse_args()
    results = []
    for algo in args.algorithms:  # one at a time: timings need the whole machine
        with ProcessPoolExecutor(max_workers=1) as pool:
            results.append(pool.submit(measure, algo, args.rounds, args.threads, args.preset).result())
        print(json.dumps(results[-1], indent=1), flush=True)
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "fedsm_cost.json").write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
