"""The volumetric (3D) pipeline on 2 CPU cores: what one FeTS-style round costs, and FeTS Table 1 rows on
``synthetic-brats``.

    .venv/bin/python benchmarks/volumes.py timing            # -> results/volumes_timing.json
    .venv/bin/python benchmarks/volumes.py methods [--jobs 1] # -> results/volumes_methods.{json,md}

``timing``: one round of FedAvg on the ``fets-cpu`` preset (synthetic-brats, 11 institutions, 48^3, UNet
8-64, 32^3 patches, sliding-window validation), in a subprocess of its own: wall time, peak RSS, the
round's training and validation exchanges from ``ledger.csv`` (per-site compute summed, and the
exchange's wall time); then the ``fets`` preset's network (DynUNet 32->512) on a 128^3 patch on this
CPU: seconds per SGD step (forward + backward + step) at batch 1, median of 3 after one warm-up (FeTS
trains at batch 4 on a GPU).

``methods``: the FeTS 2022 benchmark's global methods and FedSM on ``fets-cpu`` (``ROUNDS`` rounds, seed
0), each a method of the bench file ``benchmarks/specs/volumes.yaml``, trained and resumed by ``fedseg bench``
(``common.bench_entries``; runs under ``benchmarks/runs/volumes/``): FeTS Table 1 layout, Dice per region (WT,
TC, ET) and HD95 (mm) per case, mean +- std over the test cases, and the selected round (validation).
"""

from __future__ import annotations

import argparse
import csv
import json
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import RESULTS, ROUNDS, SPECS, bench_entries, not_converged_line

FEDERATION = "fets-cpu"


def one_round() -> dict:
    """One FedAvg round of ``fets-cpu`` in a fresh process."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "run"
        cmd = [sys.executable, "-m", "fedseg.cli", "run", "--preset", FEDERATION, "--rounds", "1", "--out", str(out)]
        start = time.perf_counter()
        proc = subprocess.run(cmd, capture_output=True, text=True)
        wall = time.perf_counter() - start
        if proc.returncode:
            raise RuntimeError(proc.stdout + proc.stderr)
        peak_mb = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
        with open(out / "ledger.csv") as f:
            rows = list(csv.DictReader(f))
        summary = json.loads((out / "summary.json").read_text())
    exchanges: dict[int, dict] = {}
    for r in rows:
        e = exchanges.setdefault(int(r["exchange"]), {"action": r["action"], "compute_s": 0.0, "sites": 0})
        e["compute_s"] += float(r["seconds"])
        e["wall_s"] = float(r["wall_seconds"])
        e["sites"] += 1
    ordered = [exchanges[k] for k in sorted(exchanges)]
    train = next(e for e in ordered if e["action"] == "train")
    validation = next(e for e in ordered if e["action"] == "evaluate")  # round 1's validation comes first
    sizes = summary["algorithms"]["fedavg"]["train_samples"]
    return {
        "command": " ".join(cmd[1:]).replace(str(out), "OUT"),
        "process_wall_s": wall,
        "peak_rss_mb": peak_mb,
        "train_exchange": train,
        "validation_exchange": validation,
        "train_cases": sum(sizes.values()),
        "sites": len(sizes),
    }


def dynunet_step(repeats: int = 3) -> dict:
    """Seconds per SGD step of the ``fets`` preset's DynUNet on one 128^3 4-channel patch, this CPU."""
    import torch

    from fedseg.config_load import load_config
    from fedseg.models.factory import build_segmenter, count_parameters
    from fedseg.train import make_optimizer, segmentation_loss

    cfg = load_config(preset="fets")
    model = build_segmenter(cfg.model, spatial_dims=3, in_channels=4, out_channels=3, seed=0)
    opt = make_optimizer(cfg.train, model.parameters())
    loss_fn = segmentation_loss(cfg.train)
    x = torch.randn(1, 4, 128, 128, 128)
    y = (torch.rand(1, 3, 128, 128, 128) > 0.9).float()
    times = []
    for i in range(repeats + 1):
        start = time.perf_counter()
        opt.zero_grad()
        loss_fn(model(x), y).backward()
        opt.step()
        if i:
            times.append(time.perf_counter() - start)
    return {
        "parameters": count_parameters(model),
        "threads": torch.get_num_threads(),
        "batch": 1,
        "seconds_per_step": statistics.median(times),
        "all_s": times,
    }


def timing() -> None:
    result = {"fets_cpu_round": one_round(), "fets_dynunet_128": dynunet_step()}
    (RESULTS / "volumes_timing.json").write_text(json.dumps(result, indent=1))
    print(json.dumps(result, indent=1))


def fmt(stat: dict) -> str:
    return f"{stat['mean']:.3f} ± {stat['std']:.3f}"


def routed_lines(done: dict, fed: str, seed: int, names: list[str]) -> list[str]:
    """A line per FedSM-family run whose selector sent every test image to its global model (its scores are then its
    global model's: equal to FedAvg's where both trained the same global model)."""
    from fedseg.presentation.kit import routed_to_global

    lines = []
    for m in names:
        for name, (images, gamma) in routed_to_global(Path(done[(fed, seed, m)]["dir"])).items():
            lines += ["", f"{name}: the selector sent all {images} test images to the global model (γ = {gamma:g})."]
    return lines


def methods(jobs: int) -> None:
    bench, done = bench_entries(SPECS / "volumes.yaml", jobs)
    fed, seed = bench.federations[0].name, bench.seeds[0]
    rows, table = [], []
    for m in (method.name for method in bench.methods):
        entry = done[(fed, seed, m)]
        stats, summary = entry["stats"], entry["summary"]
        region = stats["region_dice"]
        rows.append(
            {
                "algorithm": m,
                "dice": stats["case_dice"],
                "region_dice": region,
                "hd95_mm": stats["case_hd95"],
                "best_round": summary["best_round"],
                "selected_rounds": summary.get("selected_rounds"),
                "rounds": summary["rounds"],
                "wall_seconds": entry["wall_seconds"],
            }
        )
        table.append(
            f"| {m} | {fmt(stats['case_dice'])} | {fmt(region['WT'])} | {fmt(region['TC'])} | {fmt(region['ET'])} "
            f"| {fmt(stats['case_hd95'])} | {summary['best_round']}/{summary['rounds']} |"
        )
    (RESULTS / "volumes_methods.json").write_text(json.dumps(rows, indent=1, allow_nan=True))
    md = [
        f"# FeTS Table 1 layout on synthetic-brats (`fets-cpu` preset, {ROUNDS} rounds, seed 0)",
        "",
        "Test cases, each site with its own model where a method has one; mean ± std over cases. "
        "HD95 in mm (BraTS rule: a missed or invented region scores 373.13 mm). Round: selected on validation.",
        "",
        "| method | Dice | WT | TC | ET | HD95 (mm) | round |",
        "|---|---|---|---|---|---|---|",
        *table,
        "",
        not_converged_line(rows, "algorithm")
        + ". At this CPU budget the table compares early training, not final accuracy.",
        *routed_lines(done, fed, seed, [r["algorithm"] for r in rows]),
        "",
        "Reproduce: `.venv/bin/python benchmarks/volumes.py methods`.",
    ]
    (RESULTS / "volumes_methods.md").write_text("\n".join(md) + "\n")
    print("\n".join(md))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("what", choices=["timing", "methods"])
    parser.add_argument("--jobs", type=int, default=1)
    args = parser.parse_args()
    timing() if args.what == "timing" else methods(args.jobs)
