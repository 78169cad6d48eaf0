"""The ``summary.json`` entry of one algorithm: test metrics per site, the cross-site matrix of local models."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np

from fedseg.engine.ledger import Ledger
from fedseg.evaluate.metric_info import METRIC_NAMES
from fedseg.evaluate.tables import site_summary

Row = dict[str, Any]  # a row of results.csv


def site_means(rows: list[Row], site_model: Callable[[str], str], sites: list[str]) -> dict[str, float]:
    """Mean Dice per site over the cases scored with the model that site uses."""
    return site_summary(
        rows, rows[0]["algorithm"], "dice", sites, model_filter=lambda r: r["model"] == site_model(r["site"])
    )


def summarize(
    name: str,
    test_rows: list[Row],
    site_model: Callable[[str], str],
    sites: list[str],
    ledger: Ledger,
    rounds: int,
    best_round: int,
    cost: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The ``summary.json`` entry of one algorithm; ``cost``: the FeTS Table 2 cost object
    (:func:`fedseg.evaluate.cost.cost_table`)."""
    entry = {**own_model_scores(name, test_rows, site_model, sites), "rounds": rounds, "best_round": best_round}
    entry.update(ledger.totals())
    entry.update(other_models_scores(name, test_rows, site_model, sites))
    if cost is not None:
        entry["cost"] = cost
    return entry


def own_model_scores(name: str, rows: list[Row], site_model: Callable[[str], str], sites: list[str]) -> dict[str, Any]:
    """Per metric (Dice, HD95, NSD) the site means, client average and global mean of algorithm ``name``'s test
    ``rows`` scored with the model each site uses (``site_model``): those of its ``summary.json`` entry."""
    own = lambda r: r["model"] == site_model(r["site"])  # noqa: E731
    return {m: site_summary(rows, name, m, sites, model_filter=own) for m in METRIC_NAMES}


def other_models_scores(
    name: str, rows: list[Row], site_model: Callable[[str], str], sites: list[str]
) -> dict[str, Any]:
    """Where algorithm ``name``'s test ``rows`` also score models its sites do not use (their local models): the
    cross-site matrix and its means (:func:`cross_site_summary`); {} otherwise."""
    mine = [r for r in rows if r["algorithm"] == name]
    return cross_site_summary(mine, sites) if any(r["model"] != site_model(r["site"]) for r in mine) else {}


def cross_site_summary(rows: list[Row], sites: list[str]) -> dict[str, Any]:
    """Cross-site matrix of per-site models ("local:<site>" on every test site; ``rows``: one
    algorithm's) with its diagonal/off-diagonal means."""
    from fedseg.evaluate.tables import cross_site_matrix

    matrix = cross_site_matrix(rows, "dice", sites, algorithm=None)
    off = ~np.eye(len(sites), dtype=bool)
    return {
        "cross_site": {"dice": {a: {b: float(matrix[i, j]) for j, b in enumerate(sites)} for i, a in enumerate(sites)}},
        "local_avg": finite_mean(np.diag(matrix)),
        "local_gen": finite_mean(matrix[off]),  # NaN with one site (no off-diagonal)
    }


def finite_mean(values: np.ndarray) -> float:
    """Mean of the non-NaN ``values``; NaN (without numpy's empty-slice warning) when there are none."""
    kept = values[~np.isnan(values)]
    return float(kept.mean()) if kept.size else math.nan
