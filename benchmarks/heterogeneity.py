"""Heterogeneity of the built-in federations, measured (not assumed).

For each federation and seed: local training per site with the cross-site matrix (each
site's model on every site's test split, the "Client k Local" rows of the FedSM paper's
Table 3) and centralized training, at the benchmark budget of ``benchmarks/common.py``
(64x64). Criteria of the spine issue:
  synthetic-retina:   mean off-diagonal Dice >= 0.15 below the mean diagonal Dice
  synthetic-prostate: mean off-diagonal Dice <= 0.08 below the mean diagonal Dice
  both:               centralized mean test Dice (client_avg) >= 0.80

    .venv/bin/python benchmarks/heterogeneity.py [--spec benchmarks/specs/heterogeneity.yaml] [--jobs 2]

The runs are the bench file ``benchmarks/specs/heterogeneity.yaml``, trained and resumed by ``fedseg bench``
(``common.bench_entries``; runs under ``benchmarks/runs/heterogeneity/``). Writes
benchmarks/results/heterogeneity.json.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from common import RESULTS, SPECS, bench_entries

CRITERIA = {"synthetic-retina": ("gap_at_least", 0.15), "synthetic-prostate": ("gap_at_most", 0.08)}
CENTRALIZED_AT_LEAST = 0.80


def seed_entry(local: dict, central: dict) -> dict:
    s = local["summary"]
    sites = local["sites"]
    return {
        "seed": local["seed"],
        "matrix": [[round(s["cross_site"]["dice"][a][b], 4) for b in sites] for a in sites],
        "diagonal_mean": s["local_avg"],
        "off_diagonal_mean": s["local_gen"],
        "gap": s["local_avg"] - s["local_gen"],
        "centralized_dice": central["summary"]["dice"]["client_avg"],
        "overrides": local["overrides"],
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--spec", type=Path, default=SPECS / "heterogeneity.yaml", help="the bench file of the runs")
    ap.add_argument("--jobs", type=int, default=2, help="runs trained at once (one torch thread each)")
    args = ap.parse_args()
    bench, done = bench_entries(args.spec, args.jobs)
    seeds = list(bench.seeds)
    report = {}
    for fed in (f.name for f in bench.federations):
        runs = [seed_entry(done[(fed, s, "local")], done[(fed, s, "centralized")]) for s in seeds]
        kind, bound = CRITERIA[fed]
        gap = float(np.mean([r["gap"] for r in runs]))
        central = float(np.mean([r["centralized_dice"] for r in runs]))
        gap_ok = gap >= bound if kind == "gap_at_least" else gap <= bound
        report[fed] = {
            "sites": done[(fed, seeds[0], "local")]["sites"],
            "runs": runs,
            "mean_diagonal": float(np.mean([r["diagonal_mean"] for r in runs])),
            "mean_off_diagonal": float(np.mean([r["off_diagonal_mean"] for r in runs])),
            "mean_gap": gap,
            "mean_centralized_dice": central,
            "criteria": {kind: bound, "centralized_at_least": CENTRALIZED_AT_LEAST},
            "pass": bool(gap_ok and central >= CENTRALIZED_AT_LEAST),
        }
        print(
            f"{fed}: gap {gap:.3f} ({kind} {bound}), centralized {central:.3f} -> "
            f"{'PASS' if report[fed]['pass'] else 'FAIL'}"
        )
    RESULTS.mkdir(exist_ok=True)
    path = RESULTS / "heterogeneity.json"
    old = json.loads(path.read_text()) if path.exists() else {}
    path.write_text(json.dumps({**old, **report}, indent=2))


if __name__ == "__main__":
    main()
