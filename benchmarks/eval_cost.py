"""What evaluation costs next to training, read from the ledger of real runs (issue 26).

Runs ``fedseg run --preset P --algorithms fedavg --rounds R`` ``--runs`` times per preset (the CLI, a fresh
process each) and reads each run's ``ledger.csv`` (one ``wall_seconds`` per exchange):

* ``train``: the last round's train exchange (warm; round 1 includes warm-up);
* ``val``: the last round's validation exchange (the first ``evaluate`` of that round);
* ``final``: everything after it: ``share_model``, the test of the selected model (``test``) and the K
  cross-site exchanges of the sites' local models (``cross_site``, ``eval.local_models``).

Targets (issue 26, item 4): ``val / train <= 0.25`` and ``final / train <= 2``. Writes medians and
spreads to ``benchmarks/results/eval_cost.json``.

    PYTHONPATH=src python benchmarks/eval_cost.py --presets demo,fets-cpu --rounds 2 --runs 3
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

HERE = Path(__file__).parent


def exchanges(ledger: Path) -> list[dict]:
    """One row per exchange, in order: ``{exchange, round, action, wall_seconds}``."""
    seen: dict[int, dict] = {}
    with ledger.open() as f:
        for row in csv.DictReader(f):
            seen.setdefault(
                int(row["exchange"]),
                {"round": int(row["round"]), "action": row["action"], "wall_seconds": float(row["wall_seconds"])},
            )
    return [seen[k] for k in sorted(seen)]


def costs(ledger: Path) -> dict[str, float]:
    """``train``, ``val``, ``final`` seconds of one run (module docstring) and their ratios."""
    rows = exchanges(ledger)
    last = max(r["round"] for r in rows)
    tail = [r for r in rows if r["round"] == last]
    train = sum(r["wall_seconds"] for r in tail if r["action"] == "train")
    first_eval = next(i for i, r in enumerate(tail) if r["action"] == "evaluate")
    val = tail[first_eval]["wall_seconds"]
    after = tail[first_eval + 1 :]
    final = sum(r["wall_seconds"] for r in after)
    evals = [r["wall_seconds"] for r in after if r["action"] == "evaluate"]
    test = evals[0] if evals else 0.0  # the selected model's test (fedavg: before the cross-site rows)
    return {
        "train": train,
        "val": val,
        "final": final,
        "test": test,
        "cross_site": sum(evals[1:]),
        "val_ratio": val / train,
        "final_ratio": final / train,
    }


def one_run(preset: str, rounds: int, extra: list[str]) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "run"
        cmd = [sys.executable, "-m", "fedseg.cli", "run", "--preset", preset, "--algorithms", "fedavg"]
        cmd += ["--rounds", str(rounds), "--out", str(out), *extra]
        subprocess.run(cmd, check=True, capture_output=True, env=os.environ.copy())
        return costs(out / "ledger.csv")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--presets", default="demo,fets-cpu")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--out", type=Path, default=HERE / "results" / "eval_cost.json")
    args = ap.parse_args()
    result: dict = {"rounds": args.rounds, "runs": args.runs, "targets": {"val_ratio": 0.25, "final_ratio": 2.0}}
    presets = args.presets.split(",")
    runs: dict[str, list[dict]] = {p: [] for p in presets}
    for _ in range(args.runs):  # alternate the presets run by run (shared, noisy CPUs)
        for p in presets:
            runs[p].append(one_run(p, args.rounds, []))
            print(p, runs[p][-1], flush=True)
    for p, rs in runs.items():
        result[p] = {
            "runs": rs,
            **{
                k: {
                    "median": float(np.median([r[k] for r in rs])),
                    "min": min(r[k] for r in rs),
                    "max": max(r[k] for r in rs),
                }
                for k in rs[0]
            },
        }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps({p: {k: result[p][k]["median"] for k in runs[p][0]} for p in presets}, indent=1))


if __name__ == "__main__":
    main()
