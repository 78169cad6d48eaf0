"""Seconds and memory from a folder federation on disk to every site's pre-processed data, without the prepared-case
cache, with it cold (every case prepared and stored) and warm (every case read back): ``$FEDSEG_PREPARED_CACHE``,
``fedseg.data.prepared``.

Writes a folder federation of ``--cases`` BraTS-like cases (``prepare_threads.brats_like``: 4 modalities of
``--shape`` voxels, ``.nii.gz``, 2 sites), then times ``fedseg.run.prepare`` under the ``--preset``'s data settings
(one preparation thread, so the figures are per core) for the three modes, alternated within each repeat (rotated
start, a fresh cache folder for each cold run), and reports the median and spread per mode, the warm and cold
medians' ratios to the uncached one, and whether every mode gave the same tensors (a SHA-256 of all of them). Then,
in a fresh process per mode, the memory the prepared federation holds: the process's anonymous resident memory
(``RssAnon``: what it cannot give back) and its file-backed resident memory (``RssFile``: the page cache it maps,
which the system can drop and re-read), after ``prepare`` minus before, per case (cold too: a case stored is read
back mapped); and the cache's size on disk.

Usage: ``PYTHONPATH=src python benchmarks/prepared_cache.py [--cases 8] [--shape 240 240 155] [--repeats 3]``
-> ``benchmarks/results/prepared_cache.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from fedseg.config_load import config_from_cli
from fedseg.data.folder_write import write_folder
from fedseg.data.prepared import PREPARED_CACHE_ENV
from fedseg.run import prepare
from prepare_threads import brats_like, folder_arguments, seconds_summary, tensors_digest, write_report

RESULTS = Path(__file__).resolve().parent / "results" / "prepared_cache.json"
MODES = ("off", "cold", "warm")


def config(preset: str, root: Path):
    overrides = ["device=cpu", "threads=1", "data.split.mode=ratio", f"data.root={root}", "data.prepare_threads=1"]
    return config_from_cli(preset, None, None, "fedavg", 1, None, overrides, None, None)


def rss_mb() -> dict[str, float]:
    """``RssAnon`` and ``RssFile`` of this process, MB."""
    found = {}
    for line in Path("/proc/self/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("RssAnon", "RssFile"):
            found[key] = int(value.split()[0]) / 1024
    return found


def memory_child(preset: str, root: Path) -> None:
    """In a fresh process: prepare once, print the growth of RssAnon and RssFile as JSON."""
    cfg = config(preset, root)
    torch.set_num_threads(1)
    before = rss_mb()
    prep = prepare(cfg)
    after = rss_mb()
    print(json.dumps({k: after[k] - before[k] for k in after}))
    del prep


def timed(cfg, mode: str, cache: Path) -> tuple[float, str]:
    if mode == "off":
        os.environ.pop(PREPARED_CACHE_ENV, None)
    else:
        os.environ[PREPARED_CACHE_ENV] = str(cache)
    try:
        start = time.perf_counter()
        prep = prepare(cfg)
        return time.perf_counter() - start, tensors_digest(prep)
    finally:
        os.environ.pop(PREPARED_CACHE_ENV, None)


def main() -> None:
    parser = folder_arguments(RESULTS)
    parser.add_argument("--memory-child", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.memory_child:
        return memory_child(args.preset, args.memory_child)
    shape = tuple(args.shape)
    with tempfile.TemporaryDirectory(prefix="prepared-cache-") as tmp:
        root = write_folder(brats_like(args.cases, shape), Path(tmp) / "brats-like")
        cfg = config(args.preset, root)
        torch.set_num_threads(1)
        warm_cache = Path(tmp) / "warm"
        timed(cfg, "cold", warm_cache)  # untimed: fills the warm cache, loads the libraries
        seconds: dict[str, list[float]] = {m: [] for m in MODES}
        digests: set[str] = set()
        for rep in range(args.repeats):
            for mode in MODES[rep % 3 :] + MODES[: rep % 3]:
                cache = warm_cache if mode == "warm" else Path(tmp) / f"cold-{rep}"
                s, digest = timed(cfg, mode, cache)
                seconds[mode].append(s)
                digests.add(digest)
                print(f"repeat {rep} {mode}: {s:.2f} s", flush=True)
        disk = sum(f.stat().st_size for f in warm_cache.rglob("*.case"))
        memory = {}
        for mode in MODES:  # cold: a run that fills the cache reads each case back mapped, as a warm one
            env = {k: v for k, v in os.environ.items() if k != PREPARED_CACHE_ENV}
            if mode != "off":
                env[PREPARED_CACHE_ENV] = str(warm_cache if mode == "warm" else Path(tmp) / "cold-memory")
            child = [sys.executable, __file__, "--preset", args.preset, "--memory-child", str(root)]
            done = subprocess.run(child, env=env, capture_output=True, text=True, check=True)
            grown = json.loads(done.stdout.strip().splitlines()[-1])
            memory[mode] = {k: round(v / args.cases, 1) for k, v in grown.items()}
    report = {
        "what": "seconds of fedseg.run.prepare on a folder federation of BraTS-like .nii.gz cases without the "
        "prepared-case cache, with it cold (prepare and store) and warm (read back); RSS growth per case",
        "command": "PYTHONPATH=src python benchmarks/prepared_cache.py "
        f"--cases {args.cases} --shape {' '.join(map(str, shape))} --repeats {args.repeats}",
        "preset": args.preset,
        "cases": args.cases,
        "shape": list(shape),
        "prepare_threads": 1,
        "repeats": args.repeats,
        "identical_tensors": len(digests) == 1,
        "seconds": seconds_summary(seconds, args.cases, "off", "speedup_vs_off"),
        "disk_mb_per_case": round(disk / 1e6 / args.cases, 1),
        "rss_mb_per_case": memory,
    }
    write_report(args.out, report, len(digests) == 1, "the modes gave different tensors")


if __name__ == "__main__":
    main()
