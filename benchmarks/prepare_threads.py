"""Seconds from a folder federation on disk to every site's pre-processed data, with ``data.prepare_threads`` = 1
and more (what a run spends before round 1 on a federation folder).

Writes a folder federation of ``--cases`` BraTS-like cases (4 modalities of ``--shape`` voxels, 1 mm, ``.nii.gz``
images and label maps with BraTS's labels 1, 2 and 4; a skull-like zero border; 2 sites), then times
``fedseg.run.prepare`` (reading, the folder's checks, the splits, each case's volume and model-size view) under the
``--preset``'s data settings with each thread count, the counts alternated within each repeat (rotated start) so
that load on the machine hits all of them alike; reports the median and spread of the seconds per count, each
median's ratio to the first count, and checks that every count gives the same tensors (a SHA-256 of all of them).

Usage: ``PYTHONPATH=src python benchmarks/prepare_threads.py [--cases 8] [--shape 240 240 155] [--repeats 3]``
-> ``benchmarks/results/prepare_threads.json``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from fedseg.config_load import config_from_cli
from fedseg.data.federation import Case, Federation, Regions, Site
from fedseg.data.folder_write import write_folder
from fedseg.data.prefetch import usable_cpus
from fedseg.run import prepare

RESULTS = Path(__file__).resolve().parent / "results" / "prepare_threads.json"


def brats_like(cases: int, shape: tuple[int, int, int]) -> Federation:
    """``cases`` cases over 2 sites: a noisy ellipsoidal head in a zero border, a tumour of labels 4 / 1 / 2."""
    rng = np.random.default_rng(0)
    grid = np.stack(np.meshgrid(*[np.linspace(-1, 1, n) for n in shape], indexing="ij"))
    head = (grid**2).sum(0) < 0.8
    sites: list[list[Case]] = [[], []]
    for i in range(cases):
        image = np.where(head, rng.normal(100, 20, (4, *shape)), 0).astype(np.float32)
        centre = rng.uniform(-0.3, 0.3, 3)[:, None, None, None]
        r = np.sqrt(((grid - centre) ** 2).sum(0))
        label = np.select([r < 0.08, r < 0.15, r < 0.25], [4, 1, 2], 0).astype(np.uint8)
        image[:, label > 0] += 40
        sites[i % 2].append(Case.from_arrays(f"case{i:03d}", image, label, spacing=(1.0, 1.0, 1.0)))
    regions = Regions.from_mapping({"WT": [1, 2, 4], "TC": [1, 4], "ET": [4]})
    return Federation("brats-like", "3d", 4, regions, [Site(f"site{k}", c) for k, c in enumerate(sites)])


def tensors_digest(prep) -> str:
    """SHA-256 over every site's split tensors, volumes and original-grid truth, in order."""
    h = hashlib.sha256()
    for site in prep.site_data:
        for split in ("train", "val", "test"):
            data = site.split(split)
            for t in (data.x, data.y):
                h.update(t.contiguous().numpy().tobytes())
            for v in data.volumes or []:
                for t in (v.image, v.label, v.truth):  # truth: None for a training case
                    h.update(b"" if t is None else t.contiguous().numpy().tobytes())
    return h.hexdigest()


def folder_arguments(out: Path) -> argparse.ArgumentParser:
    """The options of a benchmark on a folder of BraTS-like cases: ``--preset``, ``--cases``, ``--shape``,
    ``--repeats``, ``--out`` (default ``out``)."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--preset", default="fets")
    parser.add_argument("--cases", type=int, default=8)
    parser.add_argument("--shape", type=int, nargs=3, default=[240, 240, 155])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", type=Path, default=out)
    return parser


def main() -> None:
    parser = folder_arguments(RESULTS)
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    args = parser.parse_args()
    shape = tuple(args.shape)
    with tempfile.TemporaryDirectory(prefix="prepare-threads-") as tmp:
        root = write_folder(brats_like(args.cases, shape), Path(tmp) / "brats-like")
        overrides = ["device=cpu", "threads=1", "data.split.mode=ratio", f"data.root={root}"]
        base = config_from_cli(args.preset, None, None, "fedavg", 1, None, overrides, None, None)
        torch.set_num_threads(base.threads)
        prepare(base.model_copy(update={"data": base.data.model_copy(update={"prepare_threads": 1})}))  # untimed
        seconds: dict[int, list[float]] = {n: [] for n in args.threads}
        digests: dict[int, set[str]] = {n: set() for n in args.threads}
        for rep in range(args.repeats):
            order = args.threads[rep % len(args.threads) :] + args.threads[: rep % len(args.threads)]
            for n in order:
                cfg = base.model_copy(update={"data": base.data.model_copy(update={"prepare_threads": n})})
                start = time.perf_counter()
                prep = prepare(cfg)
                seconds[n].append(time.perf_counter() - start)
                digests[n].add(tensors_digest(prep))
                del prep
                print(f"repeat {rep} threads {n}: {seconds[n][-1]:.2f} s", flush=True)
    all_digests = set().union(*digests.values())
    report = {
        "what": "seconds of fedseg.run.prepare on a folder federation of BraTS-like .nii.gz cases, per "
        "data.prepare_threads",
        "command": "PYTHONPATH=src python benchmarks/prepare_threads.py "
        f"--cases {args.cases} --shape {' '.join(map(str, shape))} --repeats {args.repeats} "
        f"--threads {' '.join(map(str, args.threads))}",
        "preset": args.preset,
        "cases": args.cases,
        "shape": list(shape),
        "channels": 4,
        "cpus": usable_cpus(),
        "torch_threads": base.threads,
        "repeats": args.repeats,
        "identical_tensors": len(all_digests) == 1,
        "seconds": seconds_summary(seconds, args.cases, args.threads[0], "speedup_vs_first"),
    }
    write_report(args.out, report, len(all_digests) == 1, "the thread counts gave different tensors")


def seconds_summary(seconds: dict, cases: int, base, speedup: str) -> dict[str, dict[str, float]]:
    """Per side of ``seconds`` (``{side: [seconds per repeat]}``): median, min, max, the median per case and the
    ``base`` side's median over its own (``speedup``)."""
    first = statistics.median(seconds[base])
    return {
        str(side): {
            "median": round(statistics.median(s), 2),
            "min": round(min(s), 2),
            "max": round(max(s), 2),
            "per_case": round(statistics.median(s) / cases, 3),
            speedup: round(first / statistics.median(s), 3),
        }
        for side, s in seconds.items()
    }


def write_report(out: Path, report: dict, identical: bool, differ: str) -> None:
    """Write ``report`` as compact JSON to ``out`` and print it; exit with ``differ`` unless the sides gave
    ``identical`` tensors."""
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, separators=(",", ":")) + "\n")
    print(json.dumps(report))
    if not identical:
        raise SystemExit(differ)


if __name__ == "__main__":
    main()
