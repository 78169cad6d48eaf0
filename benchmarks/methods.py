"""Every method on both built-in federations, 3 seeds: the FedSM paper's Table 3/4 layout and the
FeTS benchmark's Table 1 (accuracy) and Table 2 (cost) layouts.

    .venv/bin/python benchmarks/methods.py [--spec benchmarks/specs/methods.yaml] [--jobs 2]

The runs (federations, methods, seeds, budget) are the bench file ``benchmarks/specs/methods.yaml``, trained and
resumed by ``fedseg bench`` (``common.bench_entries``; runs under ``benchmarks/runs/methods/``). Writes
``benchmarks/results/methods.json`` and a readable ``benchmarks/results/methods.md``.
Numbers are what the runs give: nothing is tuned per method beyond the config defaults.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import numpy as np

from common import RESULTS, ROUNDS, SPECS, bench_entries
from fedseg.evaluate.stats import mean_std

COST_KEYS = ["sgd_steps", "parallel_sgd_steps", "floats", "simulated_seconds"]


def algorithm_table(entries: list[dict]) -> dict:
    """One algorithm over seeds: Table 3 (per site, Client Avg, Global), Table 1 (per case, per region)
    and Table 2 (cost) numbers; ``x`` = mean over seeds, ``x_seed_std`` = std over seeds."""
    first = entries[0]
    sites, regions = first["sites"], first["regions"]
    dice = [e["summary"]["dice"] for e in entries]
    hd95 = [e["summary"]["hd95"] for e in entries]
    row = {
        "seeds": [e["seed"] for e in entries],
        "table3_dice": {k: mean_std([d[k] for d in dice])["mean"] for k in [*sites, "client_avg", "global"]},
        "table3_hd95": {k: mean_std([d[k] for d in hd95])["mean"] for k in [*sites, "client_avg", "global"]},
        "client_avg_dice": mean_std([d["client_avg"] for d in dice]),
        "table1": {
            "dice_mean": mean_std([e["stats"]["case_dice"]["mean"] for e in entries])["mean"],
            "dice_std_over_cases": mean_std([e["stats"]["case_dice"]["std"] for e in entries])["mean"],
            "hd95_mean": mean_std([e["stats"]["case_hd95"]["mean"] for e in entries])["mean"],
            "hd95_std_over_cases": mean_std([e["stats"]["case_hd95"]["std"] for e in entries])["mean"],
            **{f"dice_{r}": mean_std([e["stats"]["region_dice"][r]["mean"] for e in entries])["mean"] for r in regions},
            **{
                f"dice_{r}_std_over_cases": mean_std([e["stats"]["region_dice"][r]["std"] for e in entries])["mean"]
                for r in regions
            },
        },
        "best_round": [e["summary"]["best_round"] for e in entries],
        "wall_seconds": mean_std([e["wall_seconds"] for e in entries])["mean"],
    }
    cost = [e["summary"].get("cost") for e in entries]
    if all(cost):
        row["table2_cost"] = {k: mean_std([c[k] for c in cost])["mean"] for k in COST_KEYS if k in cost[0]}
    if "cross_site" in first["summary"]:
        row["local_rows"] = {
            a: {b: mean_std([e["summary"]["cross_site"]["dice"][a][b] for e in entries])["mean"] for b in sites}
            for a in sites
        }
        row["local_avg"] = mean_std([e["summary"]["local_avg"] for e in entries])["mean"]
        row["local_gen"] = mean_std([e["summary"]["local_gen"] for e in entries])["mean"]
    return row


def pm(std: float) -> str:
    """`` ± std`` (std over seeds), nothing with a single seed."""
    return "" if math.isnan(std) else f" ± {std:.4f}"


def markdown(report: dict) -> str:
    lines = [f"# Methods benchmark ({ROUNDS} rounds; see benchmarks/common.py for the budget)", ""]
    for fed, block in report.items():
        algos, sites, regions = block["algorithms"], block["sites"], block["regions"]
        lines += [
            f"## {fed} (seeds {block['seeds']})",
            "",
            "Test Dice, FedSM Table 3 layout (mean over seeds; Client Avg ± std over seeds):",
            "",
            "| method | " + " | ".join(sites) + " | Client Avg | Global |",
            "|---" * (len(sites) + 3) + "|",
        ]
        for name, row in algos.items():
            for a, cells in row.get("local_rows", {}).items():
                lines.append(
                    f"| Client {a} Local | "
                    + " | ".join(f"{cells[b]:.4f}" for b in sites)
                    + f" | {np.mean([cells[b] for b in sites]):.4f} | |"
                )
            d = row["table3_dice"]
            lines.append(
                f"| {name} | "
                + " | ".join(f"{d[s]:.4f}" for s in sites)
                + f" | {d['client_avg']:.4f}{pm(row['client_avg_dice']['std'])} | {d['global']:.4f} |"
            )
        lines += [
            "",
            "FeTS Table 1 layout (per seed the mean and the std over test cases, each then averaged over the seeds):",
            "",
            "| method | Dice | " + " | ".join(f"Dice {r}" for r in regions) + " | HD95 |",
            "|---" * (len(regions) + 3) + "|",
        ]
        for name, row in algos.items():
            t = row["table1"]
            cells = [
                f"{t['dice_mean']:.4f} ± {t['dice_std_over_cases']:.4f}",
                *(f"{t[f'dice_{r}']:.4f} ± {t[f'dice_{r}_std_over_cases']:.4f}" for r in regions),
                f"{t['hd95_mean']:.2f} ± {t['hd95_std_over_cases']:.2f}",
            ]
            lines.append(f"| {name} | " + " | ".join(cells) + " |")
        lines += [
            "",
            "FeTS Table 2 layout (cost, mean over seeds):",
            "",
            "| method | SGD steps | max parallel SGD steps | floats communicated | simulated time (s) | wall (s) |",
            "|---|---|---|---|---|---|",
        ]
        for name, row in algos.items():
            c = row.get("table2_cost", {})
            cells = [f"{c.get(k, math.nan):.4g}" for k in COST_KEYS] + [f"{row['wall_seconds']:.0f}"]
            lines.append(f"| {name} | " + " | ".join(cells) + " |")
        lines.append("")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--spec", type=Path, default=SPECS / "methods.yaml", help="the bench file of the runs")
    ap.add_argument("--jobs", type=int, default=2, help="runs trained at once (one torch thread each)")
    args = ap.parse_args()
    bench, done = bench_entries(args.spec, args.jobs)
    seeds, methods = list(bench.seeds), [m.name for m in bench.methods]
    report = {}
    for fed in (f.name for f in bench.federations):
        first = done[(fed, seeds[0], methods[0])]
        report[fed] = {
            "seeds": seeds,
            "sites": first["sites"],
            "regions": first["regions"],
            "overrides": first["overrides"],
            "algorithms": {a: algorithm_table([done[(fed, s, a)] for s in seeds]) for a in methods},
        }
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "methods.json").write_text(json.dumps(report, indent=1, allow_nan=True))
    (RESULTS / "methods.md").write_text(markdown(report))
    print(markdown(report))


if __name__ == "__main__":
    main()
