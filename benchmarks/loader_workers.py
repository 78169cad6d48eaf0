"""Training steps per second with ``train.loader_workers`` = 0, 1, 2 on the ``fets-cpu`` preset (3D patches +
FeTS augmentations; issue 26, item 2).

Times ``Trainer.fit`` (a fresh network, ``--steps`` optimizer steps) on the pooled training cases of the preset's
federation, the worker counts alternated within each repeat (rotated start) so that load on the machine hits all
of them alike; reports the median and spread of steps/s per count and each median's ratio to 0 workers. The
training result is the same for every count (tests/test_accel.py), so only time differs. One untimed fit first.

Usage: ``PYTHONPATH=src python benchmarks/loader_workers.py [--repeats 5] [--steps 6]``
-> ``benchmarks/results/loader_workers.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path

import torch

from fedseg.config import BudgetConfig
from fedseg.config_load import config_from_cli
from fedseg.data.dataset import CaseSet
from fedseg.run import prepare
from fedseg.train import Trainer

RESULTS = Path(__file__).resolve().parent / "results" / "loader_workers.json"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--preset", default="fets-cpu")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--workers", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    cfg = config_from_cli(args.preset, None, None, "fedavg", 1, None, [], None, None)
    torch.set_num_threads(cfg.threads)
    prep = prepare(cfg)
    data = CaseSet.concat("pooled", [site.train for site in prep.site_data])
    device = torch.device(cfg.device)
    rates: dict[int, list[float]] = {w: [] for w in args.workers}
    warm = BudgetConfig(unit="steps", amount=2)  # untimed: first-call costs (allocations, MONAI imports)
    Trainer(cfg.train, device).fit(prep.task.new_model(), data, torch.Generator().manual_seed(0), budget=warm)
    for rep in range(args.repeats):
        order = args.workers[rep % len(args.workers) :] + args.workers[: rep % len(args.workers)]
        for workers in order:
            train = cfg.train.model_copy(update={"loader_workers": workers})
            model = prep.task.new_model()
            start = time.perf_counter()
            Trainer(train, device).fit(
                model, data, torch.Generator().manual_seed(rep), budget=BudgetConfig(unit="steps", amount=args.steps)
            )
            rates[workers].append(args.steps / (time.perf_counter() - start))
            print(f"repeat {rep} workers {workers}: {rates[workers][-1]:.3f} steps/s", flush=True)
    base = statistics.median(rates[args.workers[0]])
    report = {
        "preset": args.preset,
        "command": f"PYTHONPATH=src python benchmarks/loader_workers.py --repeats {args.repeats} --steps {args.steps}",
        "device": cfg.device,
        "torch_threads": cfg.threads,
        "cpus": os.cpu_count(),
        "batch_size": cfg.train.batch_size,
        "steps_per_fit": args.steps,
        "repeats": args.repeats,
        "steps_per_s": {
            str(w): {
                "median": round(statistics.median(r), 3),
                "min": round(min(r), 3),
                "max": round(max(r), 3),
                "ratio_to_first": round(statistics.median(r) / base, 3),
            }
            for w, r in rates.items()
        },
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(report["steps_per_s"]))


if __name__ == "__main__":
    main()
