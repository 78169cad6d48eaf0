"""Robust aggregation under faults on the ``demo`` preset (synthetic-retina, 6 sites, 64x64).

Rows: the aggregators -- FedAvg (weighted mean), coordinate-wise median (``fedmedian``), trimmed mean
(``fedtrimmedavg``, beta 0.2), Krum, Multi-Krum (m = n - f), Bulyan, and FedAvg with norm-clipped
updates (``methods.fedavg.aggregator: clipped``, ``clip_norm`` C); f = ``num_malicious`` = 1.
Columns, each its own run:

* ``none``: no fault;
* ``scaled``: one attacker (``--attacker``, default site2) whose reply is w + 100 (w_k - w) in every
  round (config ``faults: [{site, kind: scale, factor: 100}]``, no ``round``: every round);
* ``nan``: one site (``--nan-site``, default site5) replies NaN every round and is skipped
  (``faults: [{site, kind: nan}]``, ``fl.on_failure: skip``): the merge runs over the 5 others.

Bulyan needs n >= 4f + 3 = 7 sites for f = 1: on the demo's 6 sites it is refused before any work,
and its cells say so (``refused``). A run the failure policy stops (e.g. FedAvg's model blown up by
the attacker, so that a site's next reply holds NaN, with the default ``fl.on_failure: stop``) is
recorded as ``stopped`` with the reason. ``C`` = 2.0 by default: the update norms of this network
and budget lie between about 0.7 and 5.5 (``round_metrics`` of the CFL benchmark runs), so honest
updates are mostly left alone and the attacker's (about 100 times larger) is cut to C; every run
with a robust aggregator records ``update_norm`` and ``robust_kept`` / ``clip_factor`` per site and
round (``round_metrics.csv``), which the table summarizes for the attacker.

    .venv/bin/python benchmarks/robustness.py [--rounds 10] [--seed 0] [--jobs 2] [--clip-norm 2.0]

About 18 runs of ``--rounds`` rounds at the demo budget: ~10 min on 2 cores with 10 rounds and
``--jobs 2`` (one torch thread each). Runs are cached in
``benchmarks/runs/demo/seed<S>/robustness/<aggregator>@<condition>.json`` (reused when the
overrides match). Writes ``benchmarks/results/robustness.json`` and ``robustness.md``.
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import time
from concurrent.futures import ProcessPoolExecutor

import numpy as np

from common import RESULTS, RUNS, val_curve

PRESET = "demo"
AGGREGATORS = {  # label -> (algorithm, methods.<algorithm> options)
    "FedAvg": ("fedavg", {}),
    "Median": ("fedmedian", {}),
    "Trimmed mean": ("fedtrimmedavg", {}),
    "Krum": ("krum", {}),
    "Multi-Krum": ("multikrum", {}),
    "Bulyan": ("bulyan", {}),
    "Clipped": ("fedavg", {"aggregator": "clipped", "clip_norm": None}),  # C from --clip-norm
}
CONDITIONS = {"none": "no attack", "scaled": "1 attacker, update x100", "nan": "1 NaN site skipped"}


def slug(label: str) -> str:
    return label.lower().replace(" ", "-")


def overrides(label: str, condition: str, args) -> list[str]:
    """The ``--set`` overrides of one cell (on top of the demo preset)."""
    algorithm, options = AGGREGATORS[label]
    out = [f"fl.rounds={args.rounds}", "threads=1", f"seed={args.seed}", f"algorithms=[{algorithm}]"]
    for key, value in options.items():
        out.append(f"methods.{algorithm}.{key}={args.clip_norm if key == 'clip_norm' else value}")
    if condition == "scaled":
        out.append(f"faults=[{{site: {args.attacker}, kind: scale, factor: {args.factor}}}]")
    elif condition == "nan":
        out += [f"faults=[{{site: {args.nan_site}, kind: nan}}]", "fl.on_failure=skip"]
    return out


def cache_file(label: str, condition: str, seed: int):
    return RUNS / PRESET / f"seed{seed}" / "robustness" / f"{slug(label)}@{condition}.json"


def train_cell(label: str, condition: str, sets: list[str], seed: int) -> dict:
    """One run (in a fresh process); its cache entry. A run refused before any work or stopped by
    the failure policy is an entry too (``status`` and ``reason``)."""
    import torch

    from fedseg.config_load import load_config
    from fedseg.run import run_experiment

    cfg = load_config(preset=PRESET, overrides=sets)
    out = RUNS / PRESET / f"seed{seed}" / "robustness" / f"{slug(label)}@{condition}"
    shutil.rmtree(out, ignore_errors=True)
    torch.set_num_threads(cfg.threads)
    entry: dict = {"aggregator": label, "condition": condition, "overrides": sets}
    start = time.perf_counter()
    try:
        results = run_experiment(cfg, out)
    except ValueError as e:  # refused by a requirement (before any work) or stopped by fl.on_failure
        stopped = type(e).__name__ == "SiteFailure"
        entry.update(status="stopped" if stopped else "refused", reason=str(e))
    else:
        result = results.algorithms[0]
        entry.update(
            status="done",
            sites=results.federation.site_names,
            summary=result.summary,
            round_metrics=result.metric_rows,
            val_dice_per_round=val_curve(result.rounds_rows),
        )
    entry["wall_seconds"] = time.perf_counter() - start
    path = cache_file(label, condition, seed)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(entry, indent=1, allow_nan=True))
    return entry


def cached(label: str, condition: str, args) -> dict | None:
    path = cache_file(label, condition, args.seed)
    if not path.exists():
        return None
    entry = json.loads(path.read_text())
    return entry if entry["overrides"] == overrides(label, condition, args) else None


def attacker_note(entry: dict, site: str) -> str:
    """How the merge treated ``site`` over the rounds: kept k of R (selection rules) or its mean clip factor."""
    rows = [r for r in entry.get("round_metrics", []) if r["site"] == site]
    kept = [r["value"] for r in rows if r["metric"] == "robust_kept"]
    clip = [r["value"] for r in rows if r["metric"] == "clip_factor"]
    if kept:
        return f"kept {int(sum(kept))}/{len(kept)}"
    if clip:
        return f"clip x{np.mean(clip):.3g}"
    return ""


def cell(entry: dict, condition: str, args) -> str:
    if entry["status"] != "done":
        return entry["status"]
    text = f"{entry['summary']['dice']['client_avg']:.4f}"
    note = attacker_note(entry, args.attacker) if condition == "scaled" else ""
    return f"{text} ({note})" if note else text


def markdown(done: dict, args) -> str:
    """The table over the aggregators of this invocation (``--aggregators``), rows in ``AGGREGATORS`` order."""
    lines = [
        f"# Robust aggregation on the `{PRESET}` preset ({args.rounds} rounds, seed {args.seed})",
        "",
        "Client-average test Dice (each site's test split with the global model of the best validation round). "
        f"Attacker {args.attacker}: reply w + {args.factor:g}·(w_k − w) every round; NaN site {args.nan_site}: "
        f"skipped every round (`fl.on_failure: skip`). f = 1; clipped: C = {args.clip_norm:g}. In the attack "
        "column: how often the attacker's model was kept (Krum, Multi-Krum) or its mean clip factor.",
        "",
        "| aggregator | " + " | ".join(CONDITIONS.values()) + " |",
        "|---" * (len(CONDITIONS) + 1) + "|",
    ]
    for label in args.aggregators:
        lines.append(f"| {label} | " + " | ".join(cell(done[(label, c)], c, args) for c in CONDITIONS) + " |")
    notes = {e["reason"] for e in done.values() if e["status"] != "done"}
    if notes:
        lines += ["", "Not run / stopped:", ""] + [f"- {n}" for n in sorted(notes)]
    return "\n".join(lines) + "\n"


def summary_row(entry: dict, args) -> dict:
    if entry["status"] != "done":
        return {"status": entry["status"], "reason": entry["reason"]}
    s = entry["summary"]
    return {
        "status": "done",
        "client_avg_dice": s["dice"]["client_avg"],
        "global_dice": s["dice"]["global"],
        "dice_per_site": {k: s["dice"][k] for k in entry["sites"]},
        "best_round": s["best_round"],
        "val_dice_per_round": entry["val_dice_per_round"],
        "failures": len(s.get("failures", [])),
        "attacker": attacker_note(entry, args.attacker),
        "wall_seconds": entry["wall_seconds"],
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--jobs", type=int, default=2, help="runs trained at once (one torch thread each)")
    ap.add_argument("--attacker", default="site2")
    ap.add_argument("--factor", type=float, default=100.0)
    ap.add_argument("--nan-site", default="site5")
    ap.add_argument("--clip-norm", type=float, default=2.0)
    ap.add_argument("--aggregators", nargs="+", default=list(AGGREGATORS), choices=list(AGGREGATORS))
    args = ap.parse_args()
    args.aggregators = [label for label in AGGREGATORS if label in args.aggregators]
    cells = [(label, c) for label in args.aggregators for c in CONDITIONS]
    done = {key: cached(*key, args) for key in cells}
    todo = [key for key, entry in done.items() if entry is None]
    print(f"{len(cells) - len(todo)} cached, {len(todo)} to train", flush=True)
    with ProcessPoolExecutor(max_workers=args.jobs, max_tasks_per_child=1) as pool:
        futures = {key: pool.submit(train_cell, *key, overrides(*key, args), args.seed) for key in todo}
        for key, fut in futures.items():
            done[key] = entry = fut.result()
            dice = entry["summary"]["dice"]["client_avg"] if entry["status"] == "done" else math.nan
            print(f"done {key}: {entry['status']}, client_avg Dice {dice:.4f} ({entry['wall_seconds']:.0f} s)")
    report = {
        "preset": PRESET,
        "rounds": args.rounds,
        "seed": args.seed,
        "attacker": args.attacker,
        "factor": args.factor,
        "nan_site": args.nan_site,
        "clip_norm": args.clip_norm,
        "cells": {label: {c: summary_row(done[(label, c)], args) for c in CONDITIONS} for label in args.aggregators},
    }
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "robustness.json").write_text(json.dumps(report, indent=1, allow_nan=True))
    text = markdown(done, args)
    (RESULTS / "robustness.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
