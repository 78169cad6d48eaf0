"""Heterogeneity of the built-in federations, measured (not assumed).

For each federation and seed: local training per site with the cross-site matrix (each
site's model on every site's test split, the "Client k Local" rows of the FedSM paper's
Table 3) and centralized training. Criteria of the spine issue, at 64x64:
  synthetic-retina:   mean off-diagonal Dice >= 0.15 below the mean diagonal Dice
  synthetic-prostate: mean off-diagonal Dice <= 0.08 below the mean diagonal Dice
  both:               centralized mean test Dice (client_avg) >= 0.80

    .venv/bin/python benchmarks/heterogeneity.py [--seeds 0 1 2] [--federations synthetic-retina synthetic-prostate]

Writes benchmarks/results/heterogeneity.json (and keeps each run under benchmarks/runs/).
"""

from __future__ import annotations

import argparse
import json
import shutil
import time
from pathlib import Path

import numpy as np

from fedseg.config import load_config
from fedseg.run import run_experiment

HERE = Path(__file__).parent
CRITERIA = {"synthetic-retina": ("gap_at_least", 0.15), "synthetic-prostate": ("gap_at_most", 0.08)}


def measure(federation: str, seed: int, overrides: list[str]) -> dict:
    cfg = load_config(preset=federation, overrides=[f"seed={seed}", "algorithms=[centralized, local]", *overrides])
    out = HERE / "runs" / f"heterogeneity-{federation}-seed{seed}"
    shutil.rmtree(out, ignore_errors=True)
    start = time.perf_counter()
    results = run_experiment(cfg, out)
    by_name = {a.name: a.summary for a in results.algorithms}
    local = by_name["local"]
    sites = results.federation.site_names
    matrix = np.array([[local["cross_site"]["dice"][a][b] for b in sites] for a in sites])
    return {
        "seed": seed,
        "matrix": matrix.round(4).tolist(),
        "diagonal_mean": local["local_avg"],
        "off_diagonal_mean": local["local_gen"],
        "gap": local["local_avg"] - local["local_gen"],
        "centralized_dice": by_name["centralized"]["dice"]["client_avg"],
        "seconds": time.perf_counter() - start,
        "config": {"scale": cfg.data.scale, "image_size": cfg.data.image_size, "rounds": cfg.fl.rounds,
                   "budget": cfg.train.budget.model_dump(), "batch_size": cfg.train.batch_size},
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--federations", nargs="+", default=list(CRITERIA))
    ap.add_argument("--set", dest="overrides", action="append", default=[], help="config override key=value")
    args = ap.parse_args()
    report = {}
    for fed in args.federations:
        runs = [measure(fed, s, args.overrides) for s in args.seeds]
        kind, bound = CRITERIA[fed]
        gap = float(np.mean([r["gap"] for r in runs]))
        central = float(np.mean([r["centralized_dice"] for r in runs]))
        gap_ok = gap >= bound if kind == "gap_at_least" else gap <= bound
        report[fed] = {
            "runs": runs,
            "mean_gap": gap,
            "mean_centralized_dice": central,
            "criteria": {kind: bound, "centralized_at_least": 0.80},
            "pass": bool(gap_ok and central >= 0.80),
        }
        print(f"{fed}: gap {gap:.3f} ({kind} {bound}), centralized {central:.3f} -> {'PASS' if report[fed]['pass'] else 'FAIL'}")
    (HERE / "results").mkdir(exist_ok=True)
    path = HERE / "results" / "heterogeneity.json"
    old = json.loads(path.read_text()) if path.exists() else {}
    path.write_text(json.dumps({**old, **report}, indent=2))


if __name__ == "__main__":
    main()
