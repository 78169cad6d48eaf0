"""Paired statistics between methods: Wilcoxon signed-rank tests on per-case scores (scipy), mean ± std.

Comparisons are paired per case: two methods scored on the same test cases (same site, case id and, in a
k-fold study, the fold that tested it). A case's score is its mean over regions (``fedseg.evaluate.tables``);
with several seeds, each case's scores are averaged over the seeds first, so every case is one pair (seeds
train on the same cases and are not independent samples). Cases a method could not score (NaN) are left out
of that comparison.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Iterable, Mapping
from typing import Any

import numpy as np
from scipy.stats import wilcoxon

SIGNIFICANCE = 0.05  # the dagger in the tables: p below this


def paired_wilcoxon(scores: Mapping[Hashable, float], reference: Mapping[Hashable, float]) -> dict[str, float]:
    """Two-sided Wilcoxon signed-rank test of ``scores`` against ``reference`` over the keys both score.

    Args:
        scores, reference: ``{case key: score}`` (e.g. ``(site, case)`` -> mean Dice over regions).
    Returns:
        ``n`` (pairs), ``p`` (NaN with no pair; 1.0 when every difference is 0, where scipy cannot rank),
        ``mean_diff`` and ``median_diff`` (scores - reference).
    """
    keys = [k for k in scores if k in reference and np.isfinite(scores[k]) and np.isfinite(reference[k])]
    diffs = np.array([scores[k] - reference[k] for k in keys], dtype=np.float64)
    if not keys:
        return {"n": 0, "p": math.nan, "mean_diff": math.nan, "median_diff": math.nan}
    p = 1.0 if not np.any(diffs) else float(wilcoxon(diffs).pvalue)
    return {"n": len(keys), "p": p, "mean_diff": float(diffs.mean()), "median_diff": float(np.median(diffs))}


def mean_std(values: Iterable[float]) -> dict[str, float]:
    """``mean``, sample ``std`` (ddof 1; NaN for fewer than 2) and ``n`` of the finite ``values``."""
    v = np.array([x for x in values if x is not None and np.isfinite(x)], dtype=np.float64)
    return {
        "mean": float(v.mean()) if v.size else math.nan,
        "std": float(v.std(ddof=1)) if v.size > 1 else math.nan,
        "n": int(v.size),
    }


def seed_averaged(per_seed: Mapping[Any, Mapping[Any, float]]) -> dict[Any, float]:
    """``{seed: {case key: score}}`` -> ``{case key: mean over the seeds that scored it}``."""
    sums: dict[Hashable, list[float]] = {}
    for cases in per_seed.values():
        for key, value in cases.items():
            if np.isfinite(value):
                sums.setdefault(key, []).append(value)
    return {key: float(np.mean(v)) for key, v in sums.items()}
