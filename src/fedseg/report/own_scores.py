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
from fedseg.evaluate.tables import RowFilter, case_means, own_site_model, region_summary, site_summary
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
    ``site_models``, the Dice of its rows (each site's own model; each local model of ``cross_site`` on every site,
    averaged as summary.json averages them) equals summary.json's at every site (relative 1e-9). A ValueError
    naming the file, the algorithm, model and site otherwise: a file cut at a row boundary, emptied to its header,
    edited or missing reads as valid CSV, and the tables and the verdict's paired tests would silently rest on what
    is left."""
    path = run.dir / "results.csv"
    recorded = [n for n, e in run.algorithms.items() if isinstance(e.get("site_models"), dict)]
    if not recorded:  # a run written before summary.json named its site models: nothing to compare with
        return
    if not path.is_file():
        what = "is missing" if not path.exists() else "is not a file"
        raise ValueError(f"{path}: {what}; it holds the per-case test scores of {', '.join(recorded)}; {REWRITE_HINT}")
    for name in recorded:
        for what, rows, reported in _reported_dice(run.algorithms[name]):
            from_rows = site_summary(run.results, name, "dice", run.sites, model_filter=rows)
            for site in run.sites:
                want, have = num(reported.get(site)), from_rows[site]
                if math.isnan(want) and math.isnan(have):
                    continue
                if math.isnan(want) or math.isnan(have) or abs(have - want) > 1e-9 * max(1.0, abs(want)):
                    found = "has no rows" if math.isnan(have) else f"gives Dice {have:.6f}"
                    raise ValueError(
                        f"{path}: {name}'s {what} at {site} {found} where summary.json reports {want:.6f} (the file "
                        f"was cut short or edited); {REWRITE_HINT}"
                    )


def _reported_dice(entry: dict) -> list[tuple[str, RowFilter, dict]]:
    """What an algorithm's ``summary.json`` entry reports of Dice per site, each with the rows of ``results.csv``
    it comes from: its sites' own models (``site_models``), and each local model of ``cross_site`` on every site."""
    models: dict[str, str] = entry["site_models"]
    reported: list[tuple[str, RowFilter, dict]] = [
        ("own models", lambda r: r["model"] == models.get(r["site"]), entry.get("dice") or {})
    ]
    for train, scores in ((entry.get("cross_site") or {}).get("dice") or {}).items():
        if isinstance(scores, dict):
            reported.append((f"local:{train}", _model_rows(f"local:{train}"), scores))
    return reported


def _model_rows(model: str) -> RowFilter:
    return lambda r: r["model"] == model


def mean_std_text(s: MeanStd, digits: int) -> str:
    """``"mean ± std"``; "–" when no case counts."""
    return "–" if s["n"] == 0 else f"{fmt(s['mean'], digits)} ± {fmt(s['std'], digits)}"
