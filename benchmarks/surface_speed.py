"""HD95/NSD on the GPU (torch, ``surface_pairs``) against the CPU path (``cpu_surface_pairs``, MONAI's numbers
bit for bit, tests/test_surface.py) on BraTS-sized 3D masks: agreement and seconds per case.

Masks: ``--cases`` cases of 3 regions on a 240 x 240 x 155 grid at 1 mm, nested blobs (smoothed noise
thresholded) with a perturbed prediction, as a tumour segmentation looks. Needs only torch, numpy and scipy.
Writes ``benchmarks/results/surface_speed.json`` (or ``--out``).

``--threads 1,2``: the CPU path at each torch thread count (the run's ``threads``: its KD-tree queries of
``PARALLEL_QUERY_POINTS`` points or more use them), in alternating order from case to case, with whether the
numbers are the same at every count; ``speedup``: the first count's seconds over each other's, median and range over
the cases.

    PYTHONPATH=src python benchmarks/surface_speed.py --cases 4
    PYTHONPATH=src python benchmarks/surface_speed.py --cases 6 --threads 1,2 --out surface_threads.json
    PYTHONPATH=src python benchmarks/surface_speed.py --cases 4 --concurrent 2 --out surface_concurrent.json

``--concurrent N``: the CPU path over the cases one after another and in N threads at once, at one torch thread, the
order alternated over ``--repeats``, with whether the numbers are the same (``compare_concurrent``).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from fedseg.evaluate.surface import cpu_surface_pairs, surface_pairs

HERE = Path(__file__).parent
SHAPE = (240, 240, 155)


def blob(g: torch.Generator, level: float) -> torch.Tensor:
    """A smooth random blob ``SHAPE`` (bool): low-resolution noise upsampled, plus a centred ellipsoid."""
    noise = torch.rand((1, 1, 15, 15, 10), generator=g)
    field = F.interpolate(noise, size=SHAPE, mode="trilinear", align_corners=False)[0, 0]
    axes = [torch.linspace(-1, 1, n) for n in SHAPE]
    x, y, z = torch.meshgrid(*axes, indexing="ij")
    return (field * 0.6 + (1 - (x**2 + y**2 + z**2)) * 0.8) > level


def case(g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    truth = torch.stack([blob(g, level) for level in (0.75, 0.85, 0.95)])
    pred = torch.stack([blob(g, level + 0.02) for level in (0.75, 0.85, 0.95)])
    return pred, truth


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", type=int, default=4)
    ap.add_argument("--repeats", type=int, default=4, help="--concurrent: how many times, the order alternated")
    ap.add_argument("--out", type=Path, default=HERE / "results" / "surface_speed.json")
    ap.add_argument("--threads", default="", help="comma-separated torch thread counts to compare on the CPU path")
    ap.add_argument(
        "--concurrent", type=int, default=0, help="the CPU path on the cases one after another and in N threads"
    )
    args = ap.parse_args()
    if args.threads:
        return compare_threads(args)
    if args.concurrent:
        return compare_concurrent(args)
    g = torch.Generator().manual_seed(0)
    cases = [case(g) for _ in range(args.cases)]
    taus = [1.0, 1.0, 1.0]
    rows = []
    for pred, truth in cases:
        t0 = time.perf_counter()
        hd_c, nsd_c = cpu_surface_pairs(pred, truth, [1.0, 1.0, 1.0], 95.0, taus)
        cpu_s = time.perf_counter() - t0
        row = {"pred_voxels": int(pred.sum()), "cpu_s": cpu_s, "hd95": hd_c.tolist(), "nsd": nsd_c.tolist()}
        if torch.cuda.is_available():
            p, t = pred.cuda(), truth.cuda()
            surface_pairs(p, t, [1.0, 1.0, 1.0], 95.0, taus)  # warm-up
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            hd_g, nsd_g = surface_pairs(p, t, [1.0, 1.0, 1.0], 95.0, taus)
            row["gpu_s"] = time.perf_counter() - t0
            row["hd95_max_rel_diff"] = float(((hd_g - hd_c).abs() / hd_c.abs().clamp_min(1e-12)).max())
            row["nsd_max_abs_diff"] = float((nsd_g - nsd_c).abs().max())
        rows.append(row)
        print(row, flush=True)
    result = {
        "shape": SHAPE,
        "regions": 3,
        "device": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu",
    }
    result["cases"] = rows
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")


def compare_threads(args: argparse.Namespace) -> None:
    """The CPU path at each of ``--threads``, alternating the order from case to case (module docstring)."""
    counts = [int(n) for n in args.threads.split(",")]
    g = torch.Generator().manual_seed(0)
    rows = []
    for i in range(args.cases):
        pred, truth = case(g)
        seconds, numbers = {}, {}
        for n in counts if i % 2 == 0 else counts[::-1]:
            torch.set_num_threads(n)
            t0 = time.perf_counter()
            hd, nsd = cpu_surface_pairs(pred, truth, [1.0, 1.0, 1.0], 95.0, [1.0, 1.0, 1.0])
            seconds[n] = time.perf_counter() - t0
            numbers[n] = (hd.tolist(), nsd.tolist())
        same = all(v == numbers[counts[0]] for v in numbers.values())
        rows.append({"pred_voxels": int(pred.sum()), "seconds": seconds, "same_numbers": same})
        print(rows[-1], flush=True)
    speedup = {}
    for n in counts[1:]:
        ratios = [r["seconds"][counts[0]] / r["seconds"][n] for r in rows]
        speedup[n] = {"median": statistics.median(ratios), "min": min(ratios), "max": max(ratios)}
    result = {"shape": SHAPE, "regions": 3, "threads": counts, "cases": rows, "speedup": speedup}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")


def compare_concurrent(args: argparse.Namespace) -> None:
    """The CPU path over ``--cases`` cases one after another and in ``--concurrent`` N threads at once (how
    ``fedseg.evaluate.sliding.score_volumes`` runs them while an accelerator predicts the next cases), at one torch
    thread, the two orders alternated over ``--repeats``; whether the numbers are the same, and ``speedup``: the
    sequential seconds over the threaded ones, median and range."""
    from concurrent.futures import ThreadPoolExecutor

    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(0)
    cases = [case(g) for _ in range(args.cases)]

    def one(pair: tuple[torch.Tensor, torch.Tensor]) -> tuple[list, list]:
        hd, nsd = cpu_surface_pairs(pair[0], pair[1], [1.0, 1.0, 1.0], 95.0, [1.0, 1.0, 1.0])
        return hd.tolist(), nsd.tolist()

    rows = []
    for r in range(args.repeats):
        seconds, numbers = {}, {}
        for side in ("sequential", "threads") if r % 2 == 0 else ("threads", "sequential"):
            t0 = time.perf_counter()
            if side == "sequential":
                numbers[side] = [one(c) for c in cases]
            else:
                with ThreadPoolExecutor(args.concurrent) as pool:
                    numbers[side] = list(pool.map(one, cases))
            seconds[side] = time.perf_counter() - t0
        rows.append({"seconds": seconds, "same_numbers": numbers["sequential"] == numbers["threads"]})
        print(rows[-1], flush=True)
    ratios = [row["seconds"]["sequential"] / row["seconds"]["threads"] for row in rows]
    result = {
        "shape": SHAPE,
        "regions": 3,
        "cases": args.cases,
        "threads": args.concurrent,
        "cpus": os.cpu_count(),
        "repeats": rows,
        "speedup": {"median": statistics.median(ratios), "min": min(ratios), "max": max(ratios)},
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
