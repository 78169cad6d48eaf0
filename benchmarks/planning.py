"""Federated planning (``model.name: planned``, ``fedseg.plan``) against the fixed FeTS setup, on ``synthetic-brats``.

    .venv/bin/python benchmarks/planning.py [--jobs 1]   # -> results/planning.{json,md}

FedAvg, seed 0, ``ROUNDS`` rounds, the ``fets-cpu`` preset's budget (synthetic-brats at 48^3, 11 sites, Adam
3e-3, batch 4, one patch per case and epoch, sliding-window test, HD95 in mm), three arms, each a method of the
bench file ``benchmarks/specs/planning.yaml`` (``common.bench_entries``: trained and resumed by ``fedseg bench``,
runs under ``benchmarks/runs/planning/``; ``ARMS`` below are the overrides it sets, kept for the test):

- ``fixed``: the ``fets-cpu`` preset as shipped: a UNet 8-64 on 32^3 patches, every case on its own grid
  (the thick-slice sites keep 10 / 15 mm slices), z-score within the brain;
- ``fets-dynunet``: the ``fets`` preset's network shrunk to CPU scale, DynUNet 8-64 (4 levels, kernels 3,
  strides 2) on the same 32^3 patches: separates the network family from the plan;
- ``planned``: ``model.name: planned`` with nnU-Net's rules at the CPU budget, ``voxel_budget`` = 32^3
  (fets-cpu's patch), ``base_features`` 8, ``max_features`` 64 (fets-cpu's widths), ``min_edge`` 4 (nnU-Net).

Reported per arm: test Dice and HD95 (mm) per region (WT, TC, ET) of FedAvg's global model, mean +- std over
the test cases (and per case, the mean over regions); the
selected round; the network's parameters; the run's wall seconds; the plan (planned arm) and its traffic.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
from pathlib import Path

from common import RESULTS, ROUNDS, SPECS, bench_entries, case_stats, not_converged_line, parameters

FEDERATION, SEED = "fets-cpu", 0  # the preset whose budget the arms share; the seed
# FedAvg's shared model only: results.csv also holds each site's kept local model on its own test cases
# (eval.local_models), which ``own_site_model`` (common.case_stats' filter) would count as well
GLOBAL = lambda row: row["model"] == "global"  # noqa: E731
REGIONS = ["WT", "TC", "ET"]
ARMS = {
    "fixed": [],
    "fets-dynunet": ["model.name=dynunet", "model.channels=[8,16,32,64]"],
    "planned": [
        "model.name=planned",
        "model.plan.voxel_budget=32768",
        "model.plan.base_features=8",
        "model.plan.max_features=64",
    ],
}


def arm_result(arm: str, entry: dict) -> dict:
    """What the table needs of one arm, read from its run folder."""
    folder = Path(entry["dir"])
    summary = json.loads((folder / "summary.json").read_text())
    with open(folder / "results.csv") as f:
        rows = [{**r, "value": float(r["value"])} for r in csv.DictReader(f)]
    from fedseg.evaluate.tables import region_summary

    stats = case_stats(rows, "fedavg", REGIONS, GLOBAL)
    return {
        "arm": arm,
        "overrides": entry["overrides"],
        "region_dice": stats["region_dice"],
        "region_hd95_mm": region_summary(rows, "fedavg", "hd95", REGIONS, model_filter=GLOBAL),
        "case_dice": stats["case_dice"],
        "case_hd95_mm": stats["case_hd95"],
        "best_round": entry["summary"]["best_round"],
        "rounds": entry["summary"]["rounds"],
        "val_dice_per_round": entry["val_dice_per_round"],
        "parameters": parameters(folder / "model" / "fedavg" / "manifest.json"),
        "wall_seconds": entry["wall_seconds"],
        "train_seconds": entry["summary"]["seconds"],
        "plan": summary.get("plan"),
    }


def fmt(stat: dict, digits: int = 3) -> str:
    mean, std = stat["mean"], stat["std"]
    return "nan" if math.isnan(mean) else f"{mean:.{digits}f} ± {std:.{digits}f}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--spec", type=Path, default=SPECS / "planning.yaml", help="the bench file of the runs")
    ap.add_argument("--jobs", type=int, default=1, help="runs trained at once (one torch thread each)")
    args = ap.parse_args()
    bench, done = bench_entries(args.spec, args.jobs)
    fed = bench.federations[0].name
    results = [arm_result(m.name, done[(fed, SEED, m.name)]) for m in bench.methods]
    (RESULTS / "planning.json").write_text(json.dumps(results, indent=1, allow_nan=True))
    table = []
    for r in results:
        dice, hd = r["region_dice"], r["region_hd95_mm"]
        cells = [fmt(dice[k]) for k in REGIONS] + [fmt(hd[k], 1) for k in REGIONS]
        table.append(
            f"| {r['arm']} | {' | '.join(cells)} | {r['best_round']}/{r['rounds']} | {r['parameters']:,} "
            f"| {r['wall_seconds']:.0f} |"
        )
    plan = next(r["plan"] for r in results if r["arm"] == "planned")
    md = [
        f"# Federated planning vs the fixed FeTS setup (synthetic-brats, `fets-cpu` budget, FedAvg, {ROUNDS} rounds, "
        f"seed {SEED})",
        "",
        "FedAvg's global model on the test cases (mean ± std over cases), HD95 in mm on each case's own grid "
        "(373.13 mm for a missed or invented region). Round: the one selected on validation / rounds trained. "
        "Seconds: the whole run's wall time on a 2-core CPU shared with other jobs (load-dependent: compare "
        "parameters, not seconds).",
        "",
        "| arm | Dice WT | Dice TC | Dice ET | HD95 WT | HD95 TC | HD95 ET | round | parameters | seconds |",
        "|---|---|---|---|---|---|---|---|---|---|",
        *table,
        "",
        f"Plan (from {plan['fingerprint']['cases']} training cases' fingerprints): target spacing "
        f"{plan['target_spacing']} mm, median shape after resampling {plan['median_shape']}, patch "
        f"{plan['patch_size']}, strides {plan['strides'][1:]}, kernels {plan['kernel_sizes']}, filters "
        f"{plan['filters']}, normalization {plan['applied']['normalization']}. Planning traffic: "
        f"{plan['traffic']['floats_up']:,} floats up, {plan['traffic']['floats_down']:,} down (two exchanges).",
        "",
        not_converged_line(results, "arm")
        + ". One seed: differences of a few Dice points are within seed noise at this budget.",
        "",
        "Reproduce: `.venv/bin/python benchmarks/planning.py`.",
    ]
    (RESULTS / "planning.md").write_text("\n".join(md) + "\n")
    print("\n".join(md))


if __name__ == "__main__":
    main()
