"""Aggregations over the tidy results rows (``results.csv``).

A row is a dict with keys ``algorithm, model, site, case, region, metric, value``:
``metric`` is ``"dice"``, ``"hd95"`` or ``"nsd"`` (:data:`fedseg.evaluate.metric_info.METRIC_NAMES`; a run
written before NSD existed has no ``nsd`` rows), ``value`` a float where NaN means *not counted*
(see :mod:`fedseg.evaluate.metrics` for the empty-mask rule). ``model`` names the model
that produced the prediction; local training evaluates every site's model on every
site's test data and marks those rows ``model = "local:<train site>"``, and so do the FL
methods for their sites' best local models (``eval.local_models``), next to their
``"global"`` rows.

Aggregation order (the papers' convention; "Dice" in a table = mean over regions):

1. per case: mean over regions, ignoring NaN; a case with only NaN is excluded;
2. per site: mean over that site's cases;
3. ``client_avg``: mean of the site means; ``global``: mean over all cases pooled.

Every function takes an optional ``model_filter(row) -> bool`` predicate to select the
rows of the model each site actually uses (e.g. :func:`own_site_model`); rows for
which it returns False are ignored.
"""

from __future__ import annotations

import csv
import json
import math
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from fedseg.evaluate.metric_info import METRIC_NAMES

if TYPE_CHECKING:
    from fedseg.engine.messages import Message

__all__ = [
    "RESULT_COLUMNS",
    "Row",
    "RowFilter",
    "read_rows",
    "own_site_model",
    "case_means",
    "site_summary",
    "region_summary",
    "cross_site_matrix",
]

RESULT_COLUMNS = ("algorithm", "model", "site", "case", "region", "metric", "value")

Row = dict
RowFilter = Callable[[Row], bool]


def nan_low(score: float) -> float:
    """A validation score for comparisons: NaN (no case or site could be scored) ranks below every number."""
    return -math.inf if math.isnan(score) else score


def is_better(score: float, best_score: float | None) -> bool:
    """Whether validation ``score`` beats the best so far (``best_score``; None: none yet): NaN ranks below every
    number, and a tie does not beat (the earlier round or setting stays). Every selection on validation uses it: the
    run's round, a site's kept local or fine-tuned model, FedSM-extra's phase-1 round."""
    return best_score is None or nan_low(score) > nan_low(best_score)


def read_rows(path: str | Path) -> list[Row]:
    """Read ``results.csv`` into row dicts, ``value`` converted to float (blank -> NaN)."""
    with open(path, newline="") as f:
        return [{**r, "value": _value(r)} for r in csv.DictReader(f)]


def own_site_model(row: Row) -> bool:
    """Row filter: the row was scored with a model its site would use.

    Per-site models are named ``"<kind>:<site>"`` (e.g. ``"local:A"``) and count only on
    their own site's test data; any other model name (e.g. ``"global"``) is shared by all
    sites and always counts. This drops exactly the cross-site rows (of ``local``; an FL method's
    local models on their own site still pass: select its shared model's rows there).
    """
    kind, sep, owner = row["model"].partition(":")
    return not sep or owner == row["site"]


def _value(row: Row) -> float:
    """The row's value as float; blank or missing -> NaN."""
    v = row.get("value")
    return math.nan if v is None or v == "" else float(v)


def _nanmean(xs: Iterable[float]) -> float:
    """Mean of the non-NaN values; NaN when there are none."""
    vals = [x for x in xs if not math.isnan(x)]
    return float(sum(vals) / len(vals)) if vals else math.nan


def _select(
    rows: Iterable[Row],
    metric: str,
    algorithm: str | None = None,
    model_filter: RowFilter | None = None,
) -> Iterable[Row]:
    """Rows of one metric (and algorithm, if given) that pass ``model_filter``."""
    for r in rows:
        if r["metric"] != metric or (algorithm is not None and r["algorithm"] != algorithm):
            continue
        if model_filter is None or model_filter(r):
            yield r


def _case_means(rows: Iterable[Row]) -> dict[tuple[str, str], float]:
    """Mean over regions per (site, case) of already-selected rows; all-NaN cases dropped."""
    per_case: dict[tuple[str, str], list[float]] = defaultdict(list)
    for r in rows:
        per_case[(r["site"], r["case"])].append(_value(r))
    means = {k: _nanmean(v) for k, v in per_case.items()}
    return {k: v for k, v in means.items() if not math.isnan(v)}


def case_means(
    rows: Iterable[Row], algorithm: str, metric: str, model_filter: RowFilter | None = None
) -> dict[tuple[str, str], float]:
    """Per-case metric, averaged over regions (NaN-ignoring).

    Returns:
        ``{(site, case): mean over regions}``; cases whose regions are all NaN
        (e.g. HD95 with an empty mask in every region) are left out.
    """
    return _case_means(_select(rows, metric, algorithm, model_filter))


def _site_stats(cases: dict[tuple[str, str], float], sites: Sequence[str]) -> dict[str, float]:
    """Site means, ``client_avg`` (mean of site means) and ``global`` (pooled cases)."""
    by_site: dict[str, list[float]] = defaultdict(list)
    for (site, _), v in cases.items():
        by_site[site].append(v)
    out = {s: _nanmean(by_site.get(s, [])) for s in sites}
    out["client_avg"] = _nanmean(out[s] for s in sites)
    out["global"] = _nanmean(v for s in sites for v in by_site.get(s, []))
    return out


def site_summary(
    rows: Iterable[Row],
    algorithm: str,
    metric: str,
    sites: Sequence[str],
    model_filter: RowFilter | None = None,
) -> dict[str, float]:
    """Per-site means and the two averages, as in ``summary.json``.

    Args:
        rows: results rows.
        algorithm: algorithm name to select.
        metric: ``"dice"``, ``"hd95"`` or ``"nsd"``.
        sites: test sites to report, in table order; rows of other sites are ignored.
        model_filter: optional row predicate choosing the model each site uses.

    Returns:
        ``{site: mean over the site's cases, ..., "client_avg": mean of the site means,
        "global": mean over all cases of ``sites`` pooled}``. A site without counted
        cases is NaN and left out of ``client_avg``.
    """
    return _site_stats(case_means(rows, algorithm, metric, model_filter), sites)


def region_summary(
    rows: Iterable[Row],
    algorithm: str,
    metric: str,
    regions: Sequence[str] | None = None,
    sites: Sequence[str] | None = None,
    model_filter: RowFilter | None = None,
    ddof: int = 1,
) -> dict[str, dict[str, float]]:
    """Per-region mean and standard deviation over cases (FeTS Table 1 style).

    Args:
        regions: regions in output order; default: in order of first appearance.
        sites: restrict to these test sites (default: all).
        ddof: delta degrees of freedom of the std (1 = sample std).

    Returns:
        ``{region: {"mean": x, "std": s, "n": number of counted cases}}``; NaN values
        are not counted; mean/std are NaN when no case (std: when n <= ddof) counts.
    """
    values: dict[str, list[float]] = defaultdict(list)
    for r in _select(rows, metric, algorithm, model_filter):
        if sites is None or r["site"] in sites:
            values[r["region"]].append(_value(r))
    out = {}
    for region in regions if regions is not None else list(values):
        v = np.array([x for x in values.get(region, []) if not math.isnan(x)], dtype=np.float64)
        mean = float(v.mean()) if v.size else math.nan
        std = float(v.std(ddof=ddof)) if v.size > ddof else math.nan
        out[region] = {"mean": mean, "std": std, "n": int(v.size)}
    return out


def cross_site_matrix(
    rows: Iterable[Row], metric: str, sites: Sequence[str], algorithm: str | None = "local"
) -> np.ndarray:
    """Local models evaluated across sites.

    Args:
        rows: results rows; those with ``model == "local:<train site>"`` are used.
        metric: ``"dice"``, ``"hd95"`` or ``"nsd"``.
        sites: site order for both axes.
        algorithm: restrict to this algorithm name (None: any).

    Returns:
        float64 array ``(train site, test site)``: entry ``[i, j]`` is the mean over
        site ``j``'s test cases (each averaged over regions) of site ``i``'s local model;
        NaN where there are no counted cases.
    """
    rows = list(rows)
    mat = np.full((len(sites), len(sites)), np.nan, dtype=np.float64)
    for i, train in enumerate(sites):
        model = f"local:{train}"
        stats = _site_stats(_case_means(_select(rows, metric, algorithm, lambda r: r["model"] == model)), sites)
        mat[i] = [stats[s] for s in sites]
    return mat


def eval_rows(algorithm: str, replies: dict[str, Message], regions: tuple[str, ...]) -> list[dict]:
    """Turn evaluation replies into tidy rows (:func:`case_rows` of each site's reply: its ``cases`` and every
    metric of :data:`METRIC_NAMES` it carries, each ``(N, R)``)."""
    rows = []
    for site, reply in replies.items():
        values = {metric: reply.tensors[metric].numpy() for metric in METRIC_NAMES if metric in reply.tensors}
        rows += case_rows(
            algorithm, str(reply.meta["model"]), site, json.loads(str(reply.meta["cases"])), values, regions
        )
    return rows


def case_rows(
    algorithm: str,
    model: str,
    site: str,
    cases: Sequence[str],
    values: Mapping[str, np.ndarray],
    regions: tuple[str, ...],
) -> list[dict]:
    """One tidy row per case, region and metric: ``values[metric]`` is ``(N, R)`` for the N ``cases`` and R
    ``regions`` of ``model`` on ``site``."""
    return [
        {
            "algorithm": algorithm,
            "model": model,
            "site": site,
            "case": case,
            "region": region,
            "metric": metric,
            "value": float(scores[i, j]),
        }
        for metric, scores in values.items()
        for i, case in enumerate(cases)
        for j, region in enumerate(regions)
    ]


def site_dice(dice: np.ndarray, cases: Sequence[str], site: str, regions: tuple[str, ...]) -> float:
    """Per-case Dice ``(N, R)`` of one site's ``cases`` -> the site's Dice (mean over regions, then over
    cases; NaN entries not counted), as ``site_summary`` computes it from result rows."""
    rows = case_rows("scored", "scored", site, cases, {"dice": dice}, regions)
    return site_summary(rows, "scored", "dice", [site])[site]
