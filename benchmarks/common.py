"""Shared by the accuracy benchmarks: one benchmark budget, and one way to compose runs: ``fedseg bench``.

A script that trains runs names them in a bench file (``benchmarks/specs/<name>.yaml``: federations, methods,
seeds, budget) and gets them through :func:`bench_entries`, which runs the bench (planned and validated before any
work, ``--jobs`` runs at a time in fresh processes, resumed: finished runs are reused, a half-done one continues)
into ``benchmarks/runs/<name>/`` (git-ignored, as every run folder: only the aggregate tables under
``benchmarks/results/`` are committed), and reads each finished run's folder into the entry its tables use. The
paired tests and mean ± std of those tables come from ``fedseg.evaluate.stats``.

The benchmark budget (64x64, batch 4, one local epoch per round): ``synthetic-retina`` at
scale 0.25 (the demo's federation: 227 training images) and ``synthetic-prostate`` at scale
0.1 (317 training images: its paper sizes are 3.5x the retina's), ``ROUNDS`` rounds. ``BUDGET`` and
:func:`run_overrides` say it as overrides of the federation's preset (the bench files set the same
configuration; ``tests/test_bench_scripts.py`` checks it).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).parent
RESULTS = HERE / "results"  # the aggregates (committed)
RUNS = HERE / "runs"  # run folders (git-ignored)
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


def run_overrides(federation: str, seed: int, algorithm: str, extra: list[str]) -> list[str]:
    """The overrides (on the federation's preset) of one run at the benchmark budget. ``algorithm``: one name, or
    a chain ``"fedavg+finetune"`` trained as one run (a method that starts from an earlier one's model,
    ``start_from``); a suffix ``@tag`` is a label only."""
    names = algorithm.partition("@")[0].replace("+", ",")
    return [*BUDGET[federation], f"seed={seed}", f"algorithms=[{names}]", *extra]


def case_stats(rows: list[dict], algorithm: str, regions: list[str], own) -> dict:
    """FeTS Table 1 numbers over the test cases each site scores with its own model (``own``: the row filter of the
    model each site uses, ``fedseg.bench.tables.site_model_filter``: an FL method's shared model, not also the local
    models it kept): per region Dice mean/std, and per case (mean over regions) Dice and HD95 mean/std (sample
    std)."""
    from fedseg.evaluate.stats import mean_std
    from fedseg.evaluate.tables import case_means, region_summary

    out = {"region_dice": region_summary(rows, algorithm, "dice", regions, model_filter=own)}
    for metric in ("dice", "hd95"):
        out[f"case_{metric}"] = mean_std(case_means(rows, algorithm, metric, own).values())
    return out


def case_dice(entry: dict, algorithm: str) -> dict[tuple[str, str], float]:
    """``{(site, case): test Dice, mean over regions, of the model the case's site uses}``, from the run's folder
    (``site_models`` of its summary.json, ``fedseg.bench.tables.site_model_filter``: FedAvg's global model, not also
    the local models it kept): what the scripts' paired tests read."""
    import csv
    from collections import defaultdict

    from fedseg.bench.tables import site_model_filter

    folder = Path(entry["dir"])
    with open(folder / "results.csv", newline="") as f:
        rows = [r for r in csv.DictReader(f) if r["algorithm"] == algorithm]
    own = site_model_filter(json.loads((folder / "summary.json").read_text())["algorithms"][algorithm], rows)
    per_case: dict[tuple[str, str], list[float]] = defaultdict(list)
    for r in rows:
        if r["metric"] == "dice" and own(r):
            per_case[(r["site"], r["case"])].append(float(r["value"]))
    return {k: float(np.nanmean(v)) for k, v in per_case.items()}


def val_curve(rounds_rows: list[dict]) -> list[float]:
    """Mean validation Dice over sites per round."""
    by_round: dict[int, list[float]] = {}
    for r in rounds_rows:
        by_round.setdefault(int(r["round"]), []).append(float(r["val_dice"]))
    return [float(np.nanmean(by_round[k])) for k in sorted(by_round)]


SPECS = HERE / "specs"  # bench files (``fedseg bench``) of the scripts that compose runs


def bench_entries(spec_file: Path, jobs: int, out: Path | None = None) -> tuple[Any, dict[tuple[str, int, str], dict]]:
    """Every final run of a bench file, trained (or reused) by ``fedseg bench`` itself, as the scripts' entries.

        The one way the benchmark scripts compose runs: the bench plans, trains ``jobs`` runs at a time in fresh
        processes and resumes (``--resume``: finished runs are reused, a half-done one continues). Its runs go to
        ``out`` (default ``benchmarks/runs/<bench name>/``, git-ignored); ``fedseg bench SPEC --out OUT --resume``
        on the command line is the same bench. Returns the bench and ``{(federation, seed, method): entry}``
    (``federation``: :func:`cell_name`), each
        entry: ``summary`` (the run's ``summary.json`` entry of the method's last
        algorithm), ``stats`` (:func:`case_stats`), ``round_metrics``, ``val_dice_per_round``, ``overrides``,
        ``wall_seconds``, ``dir`` (the run folder); a method of several algorithms (a chain) also has ``chain``
        (one entry per algorithm)."""
    from fedseg.bench.phases import run_bench
    from fedseg.bench.plan import load_bench

    bench, root = load_bench(spec_file)
    runs = run_bench(bench, root, out or RUNS / bench.name, jobs, resume=True, echo=_echo)
    return bench, {(cell_name(r), r.seed, r.method): run_entry(r, fin.dir) for r, fin in runs.final.items()}


def cell_name(run) -> str:
    """The federation of a bench run as :func:`bench_entries` keys it: its name, or with a k-fold split or a
    leave-one-out federation ``<name>/fold<k>`` / ``<name>/holdout-<site>`` (each fold its own entry)."""
    if run.holdout is not None:
        return f"{run.federation}/holdout-{run.holdout}"
    return run.federation if run.fold == 0 else f"{run.federation}/fold{run.fold}"


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

    from fedseg.bench.tables import site_model_filter
    from fedseg.evaluate.tables import read_rows

    def table(name: str) -> list[dict]:
        path = folder / name
        if not path.is_file():
            return []
        with open(path, newline="") as f:
            return list(csv.DictReader(f))

    summary = json.loads((folder / "summary.json").read_text())
    rows = read_rows(folder / "results.csv")

    def rows_of(name: str) -> list[dict]:
        return [r for r in rows if r["algorithm"] == name]

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
            "stats": case_stats(rows, name, summary["regions"], site_model_filter(algo, rows_of(name))),
            "round_metrics": [r for r in metric_rows if r.get("algorithm", name) == name],
            "val_dice_per_round": val_curve([r for r in rounds_rows if r.get("algorithm", name) == name]),
            "wall_seconds": seconds,
            "dir": str(folder),
        }
        for name, algo in summary["algorithms"].items()
    ]
    return entries[0] if len(entries) == 1 else {**entries[-1], "algorithm": run.method, "chain": entries}


def not_converged_line(rows: list[dict], name_key: str) -> str:
    """The Markdown line naming the rows (``name_key``: their label) whose round selected on validation lies in the
    last 10% (at least 2) of the rounds trained (still improving; ``fedseg.run.stopping.late_best``), or "none"."""
    from fedseg.run.stopping import late_best

    late = [r[name_key] for r in rows if late_best(r["best_round"], r["rounds"])]
    return "Not converged (selected round in the last 10%, at least 2, of the rounds, so still improving): " + (
        ", ".join(late) or "none"
    )
