"""Each method's scores with its own models, mean ± std over test cases (FeTS Table 1 style).

A method's "own" models are the ones its sites use: its shared model (a ``results.csv`` model name
without ``:``, e.g. ``global``) when it has one, else each per-site model (``local:<site>``) on its
own site (Local, the personalized and clustered methods). The per-region table and the FeTS
Table 1 section of the run report (:mod:`fedseg.report.html`, :mod:`fedseg.report.persite`) read
their numbers through here.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from fedseg.evaluate.metric_info import METRICS, Metric
from fedseg.evaluate.tables import RowFilter, case_means, own_site_model, region_summary
from fedseg.presentation.files import REWRITE_HINT
from fedseg.presentation.kit import RunFiles, fmt, num

__all__ = [
    "MeanStd",
    "check_results",
    "mean_std_text",
    "own_case_stats",
    "own_model_filter",
    "own_region_stats",
    "scored_metrics",
]

MeanStd = dict[str, float]  # {"mean": x, "std": s, "n": counted cases}


def scored_metrics(run: RunFiles) -> list[Metric]:
    """The metrics (:data:`METRICS` order) the run has numbers of: rows in ``results.csv``, else entries in
    ``summary.json`` (a run written before NSD existed: Dice and HD95 only)."""
    have = {r["metric"] for r in run.results} if run.results else {k for e in run.algorithms.values() for k in e}
    return [m for m in METRICS if m.name in have]


def own_model_filter(run: RunFiles, name: str) -> RowFilter:
    """Row filter of the models ``name`` reports as its own: its shared model (a name without
    ``:``, e.g. ``global``) if it has one — leaving out its local models' cross-site rows — else
    each per-site model on its own site (``own_site_model``: Local, personalized, clustered)."""
    if any(r["algorithm"] == name and ":" not in r["model"] for r in run.results):
        return lambda r: ":" not in r["model"]
    return own_site_model


def own_region_stats(run: RunFiles, name: str, metric: str, regions: Sequence[str]) -> dict[str, MeanStd]:
    """``{region: mean, std (sample), n}`` over the test cases of ``name``'s own models."""
    return region_summary(run.results, name, metric, regions, model_filter=own_model_filter(run, name))


def own_case_stats(run: RunFiles, name: str, metric: str) -> MeanStd:
    """Mean and sample std over test cases (each case: mean over regions) of ``name``'s own models;
    NaN mean / std when no case counts (std also with a single case)."""
    v = np.array(list(case_means(run.results, name, metric, own_model_filter(run, name)).values()), dtype=np.float64)
    return {
        "mean": float(v.mean()) if v.size else math.nan,
        "std": float(v.std(ddof=1)) if v.size > 1 else math.nan,
        "n": int(v.size),
    }


def check_results(run: RunFiles) -> None:
    """``results.csv`` holds the test scores ``summary.json`` reports: per algorithm that records its
    ``site_models``, every score its entry holds (Dice, HD95 and NSD per site of the models its sites use; the
    cross-site matrix of its local models and its means) computed again from its rows by the code that wrote it
    (:func:`fedseg.run.summary.own_model_scores`, :func:`~fedseg.run.summary.other_models_scores`) equals the entry's
    (relative 1e-9). A ValueError naming the file, the algorithm and the score otherwise: a file cut at a row
    boundary, emptied to its header, edited or missing reads as valid CSV, and the tables and the verdict's paired
    tests would silently rest on what is left."""
    from fedseg.run.summary import other_models_scores, own_model_scores

    path = run.dir / "results.csv"
    recorded = {n: e["site_models"] for n, e in run.algorithms.items() if isinstance(e.get("site_models"), dict)}
    if not recorded:  # a run written before summary.json named its site models: nothing to compare with
        return
    if not path.is_file():
        what = "is missing" if not path.exists() else "is not a file"
        raise ValueError(f"{path}: {what}; it holds the per-case test scores of {', '.join(recorded)}; {REWRITE_HINT}")
    for name, models in recorded.items():
        again = own_model_scores(name, run.results, models.get, run.sites)
        again.update(other_models_scores(name, run.results, models.get, run.sites))
        reported = _numbers(run.algorithms[name])
        for where, have in _numbers(again).items():
            want = num(reported.get(where))
            if math.isnan(want) and math.isnan(have):
                continue
            if math.isnan(want) or math.isnan(have) or abs(have - want) > 1e-9 * max(1.0, abs(want)):
                found = "no rows" if math.isnan(have) else f"{have:.6g}"
                raise ValueError(
                    f"{path}: {name}'s {where} from its rows is {found} where summary.json reports {want:.6g} (one "
                    f"of the two files was cut short or edited); {REWRITE_HINT}"
                )


def _numbers(entry: dict, prefix: str = "") -> dict[str, float]:
    """The numbers of a nested ``summary.json`` entry by their path (``hd95 site3``, ``cross_site dice site1
    site2``); other values left out."""
    out: dict[str, float] = {}
    for key, value in entry.items():
        if isinstance(value, dict):
            out.update(_numbers(value, f"{prefix}{key} "))
        elif value is None or (isinstance(value, int | float) and not isinstance(value, bool)):
            out[f"{prefix}{key}"] = num(value)
    return out


def mean_std_text(s: MeanStd, digits: int) -> str:
    """``"mean ± std"``; "–" when no case counts."""
    return "–" if s["n"] == 0 else f"{fmt(s['mean'], digits)} ± {fmt(s['std'], digits)}"


def check_round_files(run: RunFiles) -> None:
    """``rounds.csv`` and ``ledger.csv``, where present, hold what ``summary.json`` says each algorithm trained: its
    last round (``rounds``, always validated) among its validation rows, and its SGD steps (``sgd_steps``,
    ``fedseg.engine.ledger.Ledger.totals``) summed over its ledger rows. A ValueError naming the file, the
    algorithm and what is missing otherwise: a file cut at a row boundary reads as valid CSV, and the report would
    silently draw shorter curves and smaller costs."""
    from fedseg.engine.ledger import EVAL_ACTIONS, FORWARD_ONLY_ACTIONS

    for name, entry in run.algorithms.items():
        last, steps = entry.get("rounds"), entry.get("sgd_steps")
        if (run.dir / "rounds.csv").is_file() and isinstance(last, int) and last > 0:
            validated = {int(r["round"]) for r in run.rounds if r["algorithm"] == name}
            if last not in validated:
                upto = f"stop at round {max(validated)}" if validated else "are missing"
                raise ValueError(
                    f"{run.dir / 'rounds.csv'}: {name}'s validation rows {upto} where summary.json says it trained "
                    f"{last} rounds (one of the two files was cut short or edited); {REWRITE_HINT}"
                )
        if (run.dir / "ledger.csv").is_file() and isinstance(steps, int | float) and not isinstance(steps, bool):
            rows = [r for r in run.ledger if r["algorithm"] == name]
            counted = [r for r in rows if r["action"] not in EVAL_ACTIONS | FORWARD_ONLY_ACTIONS]
            total = sum(int(r["steps"]) for r in counted)
            if total != steps:
                raise ValueError(
                    f"{run.dir / 'ledger.csv'}: {name}'s rows hold {total} SGD steps where summary.json reports "
                    f"{steps:g} (one of the two files was cut short or edited); {REWRITE_HINT}"
                )
