"""The cost of central differential privacy in Dice: ``fedavg-dp`` on the demo's federation
(``demo`` preset: synthetic-retina, 6 sites, scale 0.25, 64x64, batch 4, one local epoch per round)
at a small budget, for a few noise multipliers z, with ε at δ = 1e-5.

    .venv/bin/python benchmarks/privacy.py [--spec benchmarks/specs/privacy.yaml] [--jobs 2]

Runs (the methods of the bench file ``benchmarks/specs/privacy.yaml``: rounds, seed and multipliers are set there;
each its own run, one torch thread, ``--jobs`` at a time; about 10 minutes on 2 cores):

* ``off``: ``clip_norm: null, noise_multiplier: 0`` -- no mechanism: FedAvg's uniform average bit for
  bit, the last round's model tested (the reference: the same release rule as every private run);
* ``clip``: clipping only (``noise_multiplier: 0``, ε = ∞): what clipping alone costs;
* ``z=<z>``: clipping and noise at each multiplier.

Every private run uses the method's default ``clip_norm`` unless the bench file sets one; ``off`` records
the sites' update norms before clipping (``round_metrics.csv`` ``update_norm``), the numbers to choose
C from. Besides Dice, each row gives the expected noise norm over the whole network relative to C:
σ·√d / C = z·√d / n (d parameters, n sites) -- the average of n clipped updates has norm at most C,
so this ratio says how much larger the noise is than the signal, whatever C is.

Writes ``benchmarks/results/privacy.json`` and ``benchmarks/results/privacy.md``; the runs are trained and resumed
by ``fedseg bench`` (``common.bench_entries``: finished runs under ``benchmarks/runs/privacy/`` are reused).
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
from pathlib import Path

from common import RESULTS, SPECS, bench_entries

PRESET = "demo"
DELTA = 1e-5
METHOD = "fedavg-dp"


def budget(rounds: int) -> list[str]:
    return [f"fl.rounds={rounds}", "threads=1", f"algorithms=[{METHOD}]", f"methods.{METHOD}.delta={DELTA}"]


def plan(rounds: int, multipliers: list[float], clip: float | None) -> dict[str, list[str]]:
    """``{tag: overrides}`` of every run, as the script planned them before ``specs/privacy.yaml`` (the test checks
    that the bench file plans the same configurations)."""
    key = f"methods.{METHOD}"
    c = [] if clip is None else [f"{key}.clip_norm={clip}"]
    runs = {
        "off": [*budget(rounds), f"{key}.noise_multiplier=0", f"{key}.clip_norm=null"],
        "clip": [*budget(rounds), f"{key}.noise_multiplier=0", *c],
    }
    for z in multipliers:
        runs[f"z={z:g}"] = [*budget(rounds), f"{key}.noise_multiplier={z}", *c]
    return runs


def cache_entry(tag: str, entry: dict) -> dict:
    """What the table needs of one run (``common.bench_entries``' entry), read from its folder."""
    from common import parameters

    norms: dict[int, list[float]] = {}
    for r in entry["round_metrics"]:
        if r["metric"] == "update_norm":
            norms.setdefault(int(r["round"]), []).append(float(r["value"]))
    return {
        "tag": tag,
        "overrides": entry["overrides"],
        "sites": entry["sites"],
        "parameters": parameters(Path(entry["dir"]) / "model" / METHOD / "manifest.json"),  # d: floats sent
        "summary": entry["summary"],
        "update_norms": {str(k): v for k, v in sorted(norms.items())},
        "val_dice_last_round": entry["val_dice_per_round"][-1],
        "wall_seconds": entry["wall_seconds"],
    }


def z_for_epsilon(eps: float, rounds: int) -> float:
    """The smallest noise multiplier whose ε (RDP accountant) after ``rounds`` rounds is at most ``eps``."""
    from fedseg.algorithms.privacy import epsilon

    low, high = 1e-3, 1.0
    while epsilon(high, rounds, DELTA) > eps:
        high *= 2
    for _ in range(60):
        mid = (low + high) / 2
        low, high = (mid, high) if epsilon(mid, rounds, DELTA) > eps else (low, mid)
    return high


def row(entry: dict) -> dict:
    s, p = entry["summary"], entry["summary"]["privacy"]
    n, d = len(entry["sites"]), entry["parameters"]
    all_norms = [v for vs in entry["update_norms"].values() for v in vs]
    return {
        "tag": entry["tag"],
        "noise_multiplier": p["noise_multiplier"],
        "clip_norm": p["clip_norm"],
        "epsilon": p["epsilon"],
        "epsilon_exact": p["epsilon_exact"],
        "delta": p["delta"],
        "noise_std": p["noise_std"],
        "noise_to_signal": p["noise_multiplier"] * math.sqrt(d) / n,  # sigma sqrt(d) / C
        "test_dice": s["dice"]["client_avg"],
        "test_dice_global": s["dice"]["global"],
        "test_dice_per_site": {k: v for k, v in s["dice"].items() if k not in ("client_avg", "global")},
        "val_dice_last_round": entry["val_dice_last_round"],
        "update_norm_median": statistics.median(all_norms) if all_norms else math.nan,
        "update_norm_max": max(all_norms) if all_norms else math.nan,
        "wall_seconds": entry["wall_seconds"],
    }


def fmt(x: float | None, digits: int) -> str:
    if x is None:
        return "none"
    return "∞" if math.isinf(x) else f"{x:.{digits}f}"


def markdown(report: dict) -> str:
    rows, off = report["runs"], report["runs"][0]
    lines = [
        f"# Central DP (`{METHOD}`): ε at δ = {DELTA:g} vs test Dice",
        "",
        f"`{PRESET}` preset (synthetic-retina, {report['sites']} sites, scale 0.25, 64x64, batch 4, one local epoch "
        f"per round), {report['rounds']} rounds, seed {report['seed']}, {report['parameters']:,} parameters; the "
        "last round's model tested. ε: RDP accountant; ε exact: Gaussian DP. Unit: a whole site (user-level DP). "
        "noise/signal: expected noise norm over the network divided by C (= z·√d / n; the average of the clipped "
        "updates has norm at most C).",
        "",
        "| run | z | C | ε | ε exact | noise std | noise/signal | test Dice (client avg) | Δ vs off | "
        "val Dice (last round) | median update norm |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['tag']} | {fmt(r['noise_multiplier'], 3)} | {fmt(r['clip_norm'], 2)} | {fmt(r['epsilon'], 1)} | "
            f"{fmt(r['epsilon_exact'], 1)} | {fmt(r['noise_std'], 4)} | {fmt(r['noise_to_signal'], 1)} | "
            f"{r['test_dice']:.4f} | {r['test_dice'] - off['test_dice']:+.4f} | {r['val_dice_last_round']:.4f} | "
            f"{fmt(r['update_norm_median'], 2)} |"
        )
    lines += [
        "",
        f"Sites' update norms before clipping (run `off`, all rounds): median {off['update_norm_median']:.2f}, "
        f"max {off['update_norm_max']:.2f}.",
        "",
        f"What a useful ε would take at {report['rounds']} rounds: the noise multiplier z for a target ε, and the "
        "number of sites n at which the expected noise norm equals C (noise/signal = 1: n = z·√d).",
        "",
        "| target ε | z | sites for noise/signal = 1 |",
        "|---|---|---|",
    ]
    for t in report["what_it_takes"]:
        lines.append(f"| {t['epsilon']:g} | {t['noise_multiplier']:.3f} | {t['sites_for_unit_noise_to_signal']:,.0f} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--spec", type=Path, default=SPECS / "privacy.yaml", help="the bench file of the runs")
    parser.add_argument("--jobs", type=int, default=2)
    args = parser.parse_args()

    bench, done = bench_entries(args.spec, args.jobs)
    fed, seed, rounds = bench.federations[0].name, bench.seeds[0], bench.budget.rounds
    entries = [cache_entry(m.name, done[(fed, seed, m.name)]) for m in bench.methods]
    d, n = entries[0]["parameters"], len(entries[0]["sites"])
    report = {
        "preset": PRESET,
        "rounds": rounds,
        "seed": seed,
        "sites": n,
        "parameters": d,
        "delta": DELTA,
        "runs": [row(e) for e in entries],
        "what_it_takes": [
            {
                "epsilon": eps,
                "noise_multiplier": (z := z_for_epsilon(eps, rounds)),
                "sites_for_unit_noise_to_signal": z * math.sqrt(d),
            }
            for eps in (1.0, 3.0, 10.0)
        ],
    }
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "privacy.json").write_text(json.dumps(report, indent=1, allow_nan=True))
    (RESULTS / "privacy.md").write_text(markdown(report))
    print(markdown(report))


if __name__ == "__main__":
    main()
