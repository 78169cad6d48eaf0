"""Shared by the accuracy benchmarks: one benchmark budget, one cached run per (federation, seed, algorithm).

Every benchmark trains each algorithm as its own run (``algorithms=[name]``) under
``benchmarks/runs/<federation>/seed<S>/<name>/`` and keeps what the tables need in
``benchmarks/runs/<federation>/seed<S>/<name>.json`` (git-ignored, as the run folders: only the aggregate tables
under ``benchmarks/results/`` are committed). A run whose
JSON exists with the same overrides is not trained again, so ``heterogeneity.py`` and
``methods.py`` share their centralized and local runs, an interrupted benchmark continues
where it stopped, and ``--jobs 2`` trains two runs at once (one torch thread each).

The benchmark budget (64x64, batch 4, one local epoch per round): ``synthetic-retina`` at
scale 0.25 (the demo's federation: 227 training images) and ``synthetic-prostate`` at scale
0.1 (317 training images: its paper sizes are 3.5x the retina's), ``ROUNDS`` rounds.
"""

from __future__ import annotations

import json
import math
import shutil
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).parent
RESULTS = HERE / "results"  # the aggregates (committed)
RUNS = HERE / "runs"  # run folders and the per-run cache (git-ignored)
ROUNDS = 30
BUDGET = {
    "synthetic-retina": [
        "data.scale=0.25",
        "data.image_size=64",
        "train.batch_size=4",
        f"fl.rounds={ROUNDS}",
        "threads=1",
    ],
    "synthetic-prostate": [
        "data.scale=0.1",
        "data.image_size=64",
        "train.batch_size=4",
        f"fl.rounds={ROUNDS}",
        "threads=1",
    ],
    # the preset's own budget (synthetic-brats at 48^3, 32^3 patches, SGD as FeTS), ROUNDS rounds
    "fets-cpu": [f"fl.rounds={ROUNDS}", "threads=1"],
}


def cache_path(federation: str, seed: int, algorithm: str) -> Path:
    return RUNS / federation / f"seed{seed}" / f"{algorithm}.json"


def run_overrides(federation: str, seed: int, algorithm: str, extra: list[str]) -> list[str]:
    """``algorithm``: one name, or a chain ``"fedavg+finetune"`` trained as one run (a method that
    starts from an earlier one's model, ``start_from``); a suffix ``@tag`` names a cache of its own
    (another benchmark's budget: ``local@p20`` does not replace ``local``)."""
    names = algorithm.partition("@")[0].replace("+", ",")
    return [*BUDGET[federation], f"seed={seed}", f"algorithms=[{names}]", *extra]


def case_stats(rows: list[dict], algorithm: str, regions: list[str], own) -> dict:
    """FeTS Table 1 numbers over the test cases each site scores with its own model: per region
    Dice mean/std, and per case (mean over regions) Dice and HD95 mean/std (sample std)."""
    from fedseg.evaluate.stats import mean_std
    from fedseg.evaluate.tables import case_means, region_summary

    out = {"region_dice": region_summary(rows, algorithm, "dice", regions, model_filter=own)}
    for metric in ("dice", "hd95"):
        out[f"case_{metric}"] = mean_std(case_means(rows, algorithm, metric, own).values())
    return out


def train_one(federation: str, seed: int, algorithm: str, extra: list[str]) -> dict:
    """Train one algorithm (in this process) and return its cache entry."""
    import torch

    from fedseg.config import load_config
    from fedseg.evaluate.tables import own_site_model
    from fedseg.run import run_experiment

    overrides = run_overrides(federation, seed, algorithm, extra)
    cfg = load_config(preset=federation, overrides=overrides)
    out = RUNS / federation / f"seed{seed}" / algorithm
    shutil.rmtree(out, ignore_errors=True)
    torch.set_num_threads(cfg.threads)
    start = time.perf_counter()
    results = run_experiment(cfg, out)
    seconds = time.perf_counter() - start
    sites = results.federation.site_names
    regions = list(results.federation.regions.names)
    entries = [
        {
            "federation": federation,
            "seed": seed,
            "algorithm": result.name,
            "overrides": overrides,
            "sites": sites,
            "regions": regions,
            "summary": result.summary,
            "stats": case_stats(result.test_rows, result.name, regions, own_site_model),
            "round_metrics": result.metric_rows,
            "val_dice_per_round": _val_curve(result.rounds_rows),
            "wall_seconds": seconds,
        }
        for result in results.algorithms
    ]
    entry = entries[0] if len(entries) == 1 else {**entries[-1], "algorithm": algorithm, "chain": entries}
    path = cache_path(federation, seed, algorithm)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(entry, indent=1, allow_nan=True))
    return entry


def _val_curve(rounds_rows: list[dict]) -> list[float]:
    """Mean validation Dice over sites per round."""
    by_round: dict[int, list[float]] = {}
    for r in rounds_rows:
        by_round.setdefault(int(r["round"]), []).append(float(r["val_dice"]))
    return [float(np.nanmean(by_round[k])) for k in sorted(by_round)]


def cached(federation: str, seed: int, algorithm: str, extra: list[str]) -> dict | None:
    path = cache_path(federation, seed, algorithm)
    if not path.exists():
        return None
    entry = json.loads(path.read_text())
    return entry if entry["overrides"] == run_overrides(federation, seed, algorithm, extra) else None


def run_all(jobs: list[tuple[str, int, str]], extra: list[str], workers: int) -> dict[tuple[str, int, str], dict]:
    """Every (federation, seed, algorithm) entry, training the missing ones ``workers`` at a time
    (each in a fresh process, so runs never share torch state)."""
    done = {job: cached(*job, extra) for job in jobs}
    todo = [job for job, entry in done.items() if entry is None]
    print(f"{len(jobs) - len(todo)} cached, {len(todo)} to train", flush=True)
    with ProcessPoolExecutor(max_workers=workers, max_tasks_per_child=1) as pool:
        futures = {job: pool.submit(train_one, *job, extra) for job in todo}
        for job, fut in futures.items():
            done[job] = fut.result()
            print(
                f"done {job}: client_avg Dice {done[job]['summary']['dice']['client_avg']:.4f} "
                f"({done[job]['wall_seconds']:.0f} s)",
                flush=True,
            )
    return done


SPECS = HERE / "specs"  # bench files (``fedseg bench``) of the scripts that compose runs


def bench_entries(spec_file: Path, jobs: int, out: Path | None = None) -> tuple[Any, dict[tuple[str, int, str], dict]]:
    """Every final run of a bench file, trained (or reused) by ``fedseg bench`` itself, as the scripts' entries.

    The one way the benchmark scripts compose runs: the bench plans, trains ``jobs`` runs at a time in fresh
    processes and resumes (``--resume``: finished runs are reused, a half-done one continues). Its runs go to
    ``out`` (default ``benchmarks/runs/<bench name>/``, git-ignored); ``fedseg bench SPEC --out OUT --resume``
    on the command line is the same bench. Returns the bench and ``{(federation, seed, method): entry}``, each
    entry what :func:`train_one` records: ``summary`` (the run's ``summary.json`` entry of the method's last
    algorithm), ``stats`` (:func:`case_stats`), ``round_metrics``, ``val_dice_per_round``, ``overrides``,
    ``wall_seconds``, ``dir`` (the run folder); a method of several algorithms (a chain) also has ``chain``
    (one entry per algorithm)."""
    from fedseg.bench.phases import run_bench
    from fedseg.bench.spec import load_bench

    bench, root = load_bench(spec_file)
    runs = run_bench(bench, root, out or RUNS / bench.name, jobs, resume=True, echo=_echo)
    return bench, {(r.federation, r.seed, r.method): run_entry(r, fin.dir) for r, fin in runs.final.items()}


def parameters(manifest: Path) -> int:
    """Floats in a trained network's state (``count_parameters``), rebuilt from its bundle's ``manifest.json``."""
    from fedseg.config import ModelConfig
    from fedseg.models.factory import build_segmenter, count_parameters

    m = json.loads(manifest.read_text())
    net = build_segmenter(ModelConfig.model_validate(m["network"]), m["spatial_dims"], m["in_channels"], 3, 0)
    return count_parameters(net)


def _echo(line: str) -> None:
    print(line, flush=True)


def run_entry(run, folder: Path) -> dict:
    """A finished bench run's entry (:func:`bench_entries`), read from its folder."""
    import csv

    from fedseg.evaluate.tables import own_site_model, read_rows

    def table(name: str) -> list[dict]:
        path = folder / name
        if not path.is_file():
            return []
        with open(path, newline="") as f:
            return list(csv.DictReader(f))

    summary = json.loads((folder / "summary.json").read_text())
    rows = read_rows(folder / "results.csv")
    metric_rows = [
        {**r, "round": int(r["round"]), "value": float(r["value"]) if r.get("value") not in (None, "") else math.nan}
        for r in table("round_metrics.csv")
    ]
    rounds_rows = table("rounds.csv")
    seconds = float(summary.get("provenance", {}).get("wall_seconds", math.nan))
    entries = [
        {
            "federation": run.federation,
            "seed": run.seed,
            "algorithm": name,
            "overrides": list(run.overrides),
            "sites": summary["sites"],
            "regions": summary["regions"],
            "summary": algo,
            "stats": case_stats(rows, name, summary["regions"], own_site_model),
            "round_metrics": [r for r in metric_rows if r.get("algorithm", name) == name],
            "val_dice_per_round": _val_curve([r for r in rounds_rows if r.get("algorithm", name) == name]),
            "wall_seconds": seconds,
            "dir": str(folder),
        }
        for name, algo in summary["algorithms"].items()
    ]
    return entries[0] if len(entries) == 1 else {**entries[-1], "algorithm": run.method, "chain": entries}


def not_converged_line(rows: list[dict], name_key: str) -> str:
    """The Markdown line naming the rows (``name_key``: their label) whose round selected on validation lies in the
    last 10% of the rounds trained (still improving), or "none"."""
    late = [r[name_key] for r in rows if r["best_round"] > 0.9 * r["rounds"]]
    return "Not converged (selected round in the last 10% of the rounds, so still improving): " + (
        ", ".join(late) or "none"
    )
