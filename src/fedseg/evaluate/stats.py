"""Paired statistics between methods: Wilcoxon signed-rank tests, a hierarchical bootstrap, rank stability.

What is paired with what: two methods scored on the same test cases, a case known by ``(site, case id)`` (in a
k-fold study the fold that tested it; the same image under every run seed since ``data.seed`` is the dataset's,
``fedseg.config.DataConfig``), each case's score its mean over regions (``fedseg.evaluate.tables``), in the same
run seed. Scores are per seed: ``{seed: {(site, case): score}}``; a difference is ``a - b`` of one case in one
seed, in the score's unit (Dice: a fraction in [0, 1]). Cases a method could not score (NaN) are left out.

* :func:`paired_wilcoxon`: Wilcoxon signed-rank test (scipy) over cases, each case's difference averaged over the
  seeds first (seeds train on the same cases and are not independent samples); two-sided or one-tailed; its method
  chosen by :func:`wilcoxon_method` (recorded with the p), never scipy's ``auto``, whose meaning changed between
  scipy versions;
* :func:`compare`: that test plus a **hierarchical paired bootstrap** of the mean difference (resample the sites,
  then the cases within each sampled site, and the seeds, all with replacement) with a percentile CI and the
  per-seed mean differences: the CI carries both the case-to-case and the run-to-run (seed) variance;
* :func:`rank_stability`: how often each method holds each rank (by mean score, higher better) over the same
  bootstrap samples (challengeR's rank stability);
* :func:`correct_family`: Holm's step-down adjustment of the p values of a family of comparisons (every method
  against the reference in one table, every cell of a per-site table), and :func:`significant`, the one rule of
  every table's † and of the run report's "beyond noise": the bootstrap CI excludes 0 on the tested side **and**
  the (Holm-adjusted) Wilcoxon p < 0.05. Both, because each fails alone: the percentile bootstrap of a handful of
  cases excludes 0 whenever their differences share a sign (3 cases: p = 0.25), and the Wilcoxon test ignores the
  seed-to-seed variance that the bootstrap carries. And the two must point the same way (:func:`ranks_disagree`:
  a two-sided signed-rank p whose ranks favour the other side than the mean says only that the two differ).

What the p and CI say: whether these trained models differ on these test images (the cases are the sample); the
run-to-run variance enters only through the seeds' resampling, which with few seeds (under 5) cannot show its full
size: the per-seed differences are listed beside each comparison for that reason.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

SIGNIFICANCE = 0.05  # the (Holm-adjusted) Wilcoxon p below which a difference can be significant (significant)
LEVEL = 0.95  # the bootstrap CI's coverage
RESAMPLES = 2000  # bootstrap samples
RNG_SEED = 0  # the bootstrap's fixed random stream: the same numbers on every call
Alternative = Literal["two-sided", "greater", "less"]
ALTERNATIVES: tuple[Alternative, ...] = ("two-sided", "greater", "less")

PerSeed = Mapping[Any, Mapping[Hashable, float]]  # {seed: {(site, case): score}}
EXACT_BELOW = 50  # fewer nonzero differences than this, none tied, get the exact Wilcoxon p (wilcoxon_method)
PERMUTATION_UP_TO = 13  # up to this many nonzero differences with ties: every one of their 2^n sign assignments
DIFF_DIGITS = 4  # decimals of a difference of fractions (Dice, NSD) in every table (signed_text)


def paired_wilcoxon(
    scores: Mapping[Hashable, float], reference: Mapping[Hashable, float], alternative: Alternative = "two-sided"
) -> dict[str, Any]:
    """Wilcoxon signed-rank test of ``scores`` against ``reference`` over the keys both score.

    Args:
        scores, reference: ``{case key: score}`` (e.g. ``(site, case)`` -> Dice averaged over regions and seeds).
        alternative: ``two-sided``; ``greater`` (``scores`` higher) or ``less``: one-tailed, as FeTS 2022 reports.
    Returns:
        ``n`` (pairs), ``n_nonzero`` (pairs that differ: the zero differences are dropped, Wilcoxon's treatment,
        scipy's and R's default, so the test rests on these), ``p`` (NaN with no pair; 1.0 when every difference is
        0, where nothing can be ranked), ``p_method`` (:func:`wilcoxon_method`; None where nothing was ranked),
        ``rank_sign`` (:func:`signed_rank_sign`: the side the ranks favour), ``alternative``, ``mean_diff`` and
        ``median_diff`` (scores - reference).
    """
    keys = [k for k in scores if k in reference and np.isfinite(scores[k]) and np.isfinite(reference[k])]
    return _wilcoxon(np.array([scores[k] - reference[k] for k in keys], dtype=np.float64), alternative)


WilcoxonMethod = Literal["exact", "permutation", "asymptotic"]


def wilcoxon_method(diffs: np.ndarray) -> WilcoxonMethod:
    """The method of the Wilcoxon p of the differences ``diffs``, over the nonzero ones (Wilcoxon's treatment of
    zeros, scipy's and R's default):

    * ``exact``: the exact null distribution of the signed-rank statistic, for fewer than :data:`EXACT_BELOW`
      nonzero differences of which no two have the same absolute value;
    * ``permutation``: with ties, for up to :data:`PERMUTATION_UP_TO` of them, the exact distribution given the
      tied (average) ranks: every one of the 2^n sign assignments (scipy >= 1.13's ``method="auto"`` gives the same
      p there; the normal approximation is poor at such sizes: 6 equal differences, exact 0.031, normal 0.020);
    * ``asymptotic`` otherwise: the normal approximation with the tie and the continuity corrections.

    Chosen here, not by scipy's ``method="auto"``, whose rule changed between the versions fedseg allows: the p is
    :func:`wilcoxon_p`'s, the same in every scipy since 1.11."""
    nonzero = diffs[diffs != 0]
    ties = np.unique(np.abs(nonzero)).size < nonzero.size
    if not ties:
        return "exact" if nonzero.size < EXACT_BELOW else "asymptotic"
    return "permutation" if nonzero.size <= PERMUTATION_UP_TO else "asymptotic"


def wilcoxon_p(diffs: np.ndarray, alternative: Alternative, method: WilcoxonMethod) -> float:
    """The Wilcoxon signed-rank p of the nonzero differences ``diffs`` by ``method`` (:func:`wilcoxon_method`):
    ``scipy.stats.wilcoxon(diffs, alternative=alternative, method=method, correction=method == "asymptotic")``
    (scipy before 1.15 names the normal approximation ``approx``), or for ``permutation``
    :func:`permutation_wilcoxon_p`."""
    from scipy.stats import wilcoxon  # here: the bench spec imports this module

    if method == "permutation":
        return permutation_wilcoxon_p(diffs, alternative)
    correction = method == "asymptotic"
    try:
        return float(wilcoxon(diffs, alternative=alternative, method=method, correction=correction).pvalue)
    except ValueError:
        if method != "asymptotic":
            raise
        return float(wilcoxon(diffs, alternative=alternative, method="approx", correction=correction).pvalue)


def permutation_wilcoxon_p(diffs: np.ndarray, alternative: Alternative) -> float:
    """The exact p of the signed-rank statistic R+ (the sum of the ranks of ``|diffs|``, ties averaged, over the
    positive ``diffs``; none 0) under its null distribution given those ranks: each of the 2^n sign assignments
    equally likely (n <= :data:`PERMUTATION_UP_TO`). ``greater``: P(R+ >= observed); ``less``: P(R+ <= observed);
    two-sided: twice the smaller, at most 1 (scipy's permutation test)."""
    from scipy.stats import rankdata

    n = diffs.size
    if not 0 < n <= PERMUTATION_UP_TO or not np.all(diffs != 0):
        raise ValueError(f"permutation p: 1 to {PERMUTATION_UP_TO} nonzero differences, got {diffs.tolist()}")
    ranks = rankdata(np.abs(diffs))  # multiples of 0.5: the sums below are exact in float64
    observed = float(ranks[diffs > 0].sum())
    signs = (np.arange(2**n)[:, None] >> np.arange(n)) & 1  # every assignment: 1 = positive
    null = signs @ ranks
    greater, less = float(np.mean(null >= observed)), float(np.mean(null <= observed))
    return {"greater": greater, "less": less, "two-sided": min(1.0, 2 * min(greater, less))}[alternative]


def _wilcoxon(diffs: np.ndarray, alternative: Alternative) -> dict[str, Any]:
    if alternative not in ALTERNATIVES:
        raise ValueError(f"alternative {alternative!r}: use one of {', '.join(ALTERNATIVES)}")
    nonzero = diffs[diffs != 0]
    method = wilcoxon_method(diffs) if nonzero.size else None
    if not diffs.size:
        p = math.nan
    else:
        p = wilcoxon_p(nonzero, alternative, method) if method else 1.0
    return {
        "n": int(diffs.size),
        "n_nonzero": int(nonzero.size),
        "rank_sign": signed_rank_sign(nonzero),
        "p": p,
        "p_method": method,
        "alternative": alternative,
        "mean_diff": float(diffs.mean()) if diffs.size else math.nan,
        "median_diff": float(np.median(diffs)) if diffs.size else math.nan,
    }


def signed_rank_sign(diffs: np.ndarray) -> int:
    """The side the signed-rank test's statistic favours: the sign of R+ - R- (the sums of the ranks of
    ``|diffs|``, ties averaged, over the positive and the negative nonzero ``diffs``): 1, -1, or 0 when they
    balance (or there is none). It can oppose the mean's sign: a method better on most images and much worse on a
    few has a negative mean and a positive R+ - R-."""
    from scipy.stats import rankdata

    nonzero = diffs[diffs != 0]
    if not nonzero.size:
        return 0
    return int(np.sign(float(np.sum(np.sign(nonzero) * rankdata(np.abs(nonzero))))))


@dataclass(frozen=True)
class CaseTable:
    """Per-seed scores of one or more methods on a common set of cases, as arrays.

    ``keys``: the ``(site, case)`` keys, grouped by site; ``site_index[i]``: the site of case ``i`` (0..S-1);
    ``seeds``: the seeds (columns); ``values[m]``: method ``m``'s ``cases x seeds`` scores, NaN where unscored."""

    keys: list[Hashable]
    site_index: np.ndarray
    seeds: list[Any]
    values: list[np.ndarray]


def case_table(methods: list[PerSeed]) -> CaseTable:
    """The seeds every method has and the cases every method scored in at least one of them."""
    seeds = sorted(set.intersection(*(set(m) for m in methods))) if methods else []
    scored = [{k for s in seeds for k, v in m[s].items() if np.isfinite(v)} for m in methods]
    common = set.intersection(*scored) if scored else set()
    keys = sorted(common, key=lambda k: (str(_site(k)), str(k)))
    sites = list(dict.fromkeys(_site(k) for k in keys))
    site_index = np.array([sites.index(_site(k)) for k in keys], dtype=np.int64)
    values = [
        np.array([[m[s].get(k, math.nan) for s in seeds] for k in keys], dtype=np.float64).reshape(
            len(keys), len(seeds)
        )
        for m in methods
    ]
    return CaseTable(keys, site_index, seeds, values)


def _site(key: Hashable) -> Hashable:
    return key[0] if isinstance(key, tuple) else key


def _nanmean_rows(values: np.ndarray) -> np.ndarray:
    finite = np.isfinite(values)
    count = finite.sum(axis=1)
    return np.where(count > 0, np.where(finite, values, 0.0).sum(axis=1) / np.maximum(count, 1), np.nan)


def bootstrap_means(
    values: list[np.ndarray],
    site_index: np.ndarray,
    resamples: int = RESAMPLES,
    rng_seed: int = RNG_SEED,
    site_means: bool = False,
) -> np.ndarray:
    """Hierarchical bootstrap of the mean over cases and seeds, the same samples for every array of ``values``
    (each ``cases x seeds``; ``site_index``: each case's site, 0..S-1).

    Each sample draws S sites with replacement out of the S sites, for each drawn site as many cases as it has
    with replacement among its own cases, and K seeds with replacement out of the K columns; its statistic is the
    mean over the drawn (case, seed) cells of each array (NaN cells left out: the cases pooled, a large site weighs
    more), or with ``site_means`` the mean over the drawn sites of each one's mean over its drawn cells (every site
    weighs the same: Client Avg's statistic). Returns ``len(values) x resamples``. Vectorized: a ``resamples x S x
    (largest site)`` index array, then one matrix product per array."""
    rng = np.random.default_rng(rng_seed)
    n_sites = int(site_index.max()) + 1 if site_index.size else 0
    if not n_sites or not values or not values[0].shape[1]:
        return np.full((len(values), resamples), np.nan)
    order = np.argsort(site_index, kind="stable")
    counts = np.bincount(site_index, minlength=n_sites)
    offsets = np.concatenate([[0], np.cumsum(counts)[:-1]])
    largest = int(counts.max())
    drawn_sites = rng.integers(0, n_sites, size=(resamples, n_sites))
    n_drawn = counts[drawn_sites][..., None]  # resamples x S x 1
    within = np.floor(rng.random((resamples, n_sites, largest)) * n_drawn).astype(np.int64)
    used = np.arange(largest)[None, None, :] < n_drawn
    cases = order[offsets[drawn_sites][..., None] + np.minimum(within, n_drawn - 1)].reshape(resamples, -1)
    used = used.reshape(resamples, -1)
    n_seeds = values[0].shape[1]
    drawn_seeds = rng.integers(0, n_seeds, (resamples, n_seeds))
    seed_weights = (drawn_seeds[..., None] == np.arange(n_seeds)).sum(axis=1).astype(np.float64)  # resamples x K
    out = np.empty((len(values), resamples))
    for m, v in enumerate(values):
        finite = np.isfinite(v)
        totals = np.where(finite, v, 0.0) @ seed_weights.T  # cases x resamples: seed-weighted sums per case
        cells = finite.astype(np.float64) @ seed_weights.T
        rows = np.arange(resamples)[:, None]
        num = np.where(used, totals.T[rows, cases], 0.0)  # resamples x (S x largest)
        den = np.where(used, cells.T[rows, cases], 0.0)
        if site_means:  # each drawn site's mean, then their mean (sites without a scored cell left out)
            site_num = num.reshape(resamples, n_sites, largest).sum(axis=2)
            site_den = den.reshape(resamples, n_sites, largest).sum(axis=2)
            scored = site_den > 0
            site_mean = np.where(scored, site_num / np.where(scored, site_den, 1.0), 0.0)
            n_scored = scored.sum(axis=1)
            out[m] = np.where(n_scored > 0, site_mean.sum(axis=1) / np.maximum(n_scored, 1), np.nan)
        else:
            num, den = num.sum(axis=1), den.sum(axis=1)
            out[m] = np.where(den > 0, num / np.maximum(den, 1), np.nan)
    return out


def compare(
    a: PerSeed,
    b: PerSeed,
    alternative: Alternative = "two-sided",
    resamples: int = RESAMPLES,
    rng_seed: int = RNG_SEED,
    level: float = LEVEL,
    with_cases: bool = False,
    site_means: bool = False,
) -> dict[str, Any]:
    """Method ``a`` against ``b`` (each ``{seed: {(site, case): score}}``), paired per case and seed over the seeds
    both have and the cases both scored. ``with_cases``: also ``case_diffs``, ``{"site/case": a - b averaged over
    the seeds}`` (the numbers the Wilcoxon test ranks, in the table's case order), so the p can be recomputed from
    the table alone: :func:`wilcoxon_p`'s call of the values (NaN, or null in tables.json, left out) with the
    recorded ``p_method`` (:func:`wilcoxon_method`), or R's ``wilcox.test`` of them (``exact``: of the nonzero ones
    with ``exact=TRUE``; R's defaults fall back to the normal approximation where some are 0).

    Returns :func:`paired_wilcoxon`'s keys (the test on the per-case differences averaged over the seeds: ``n``
    cases, ``p``, ``p_method``, ``mean_diff``, ``median_diff``) plus ``seeds`` (how many), ``per_seed_diff``
    (``{seed: mean over cases of a - b}``, keyed by the seeds as given: ints from a bench, which tables.json writes as
    strings, JSON's only key type), ``ci_low`` / ``ci_high`` (the ``level`` percentile interval of the
    hierarchical bootstrap of the mean difference, :func:`bootstrap_means`) and ``ci_excludes_0``: the CI lies
    above 0 (``greater``), below 0 (``less``) or on either side (``two-sided``), one half of :func:`significant`.
    With a one-tailed ``alternative`` the CI stays the two-sided ``level`` one: its side tested at 2.5%, the p at
    5% (conservative). ``site_means``: the CI is of the difference of the mean of site means (Client Avg) instead
    of the cases pooled (:func:`bootstrap_means`), and the result also holds ``site_mean_diff``, that difference
    itself (the sites' mean differences averaged); the test stays the per-case one."""
    table = case_table([a, b])
    diffs = table.values[0] - table.values[1]  # cases x seeds, NaN where either is unscored in that seed
    case_diffs = _nanmean_rows(diffs)
    test = _wilcoxon(case_diffs[np.isfinite(case_diffs)], alternative)
    per_seed = {
        s: float(np.nanmean(diffs[:, j])) if np.isfinite(diffs[:, j]).any() else math.nan
        for j, s in enumerate(table.seeds)
    }
    boot = bootstrap_means([diffs], table.site_index, resamples, rng_seed, site_means)[0]
    boot = boot[np.isfinite(boot)]
    tail = (1 - level) / 2
    low, high = (float(q) for q in np.quantile(boot, [tail, 1 - tail])) if boot.size else (math.nan, math.nan)
    excludes = {"two-sided": low > 0 or high < 0, "greater": low > 0, "less": high < 0}[alternative]
    return {
        **test,
        "seeds": len(table.seeds),
        "per_seed_diff": per_seed,
        "ci_low": low,
        "ci_high": high,
        "ci_level": level,
        "ci_excludes_0": bool(excludes),
        **({"site_mean_diff": _site_mean(diffs, table.site_index)} if site_means else {}),
        **({"case_diffs": {_case_name(k): float(d) for k, d in zip(table.keys, case_diffs)}} if with_cases else {}),
    }


def _site_mean(diffs: np.ndarray, site_index: np.ndarray) -> float:
    """The mean over sites of each site's mean over its scored (case, seed) cells of ``diffs`` (``cases x seeds``,
    NaN unscored): the statistic :func:`bootstrap_means` resamples with ``site_means``."""
    means = [np.nanmean(d) for s in np.unique(site_index) if np.isfinite(d := diffs[site_index == s]).any()]
    return float(np.mean(means)) if means else math.nan


def _case_name(key: Hashable) -> str:
    """``site/case`` of a ``(site, case)`` key (any other key as its text)."""
    return "/".join(map(str, key)) if isinstance(key, tuple) else str(key)


def rank_stability(
    methods: Mapping[str, PerSeed], resamples: int = RESAMPLES, rng_seed: int = RNG_SEED
) -> dict[str, dict[int, float]]:
    """``{method: {rank: fraction of bootstrap samples}}``: each method's rank (1 = highest mean score; methods with
    equal means share the best of their ranks, as challengeR's ``ties.method = "min"``: a method that scores every
    case as another, e.g. FedSM routing every image to its global model, ranks with it, not behind it) in every
    hierarchical bootstrap sample (:func:`bootstrap_means`, the same samples for all methods) over the seeds all have
    and the cases all scored. Empty with fewer than two methods."""
    names = list(methods)
    if len(names) < 2:
        return {}
    table = case_table([methods[n] for n in names])
    means = bootstrap_means(table.values, table.site_index, resamples, rng_seed)  # methods x resamples
    if not np.isfinite(means).all():
        return {}
    ranks = 1 + (means[None, :, :] > means[:, None, :]).sum(axis=1)  # 1 + how many methods score higher
    return {n: {r: float(np.mean(ranks[i] == r)) for r in range(1, len(names) + 1)} for i, n in enumerate(names)}


def mean_std(values: Iterable[float]) -> dict[str, float]:
    """``mean``, sample ``std`` (ddof 1; NaN for fewer than 2) and ``n`` of the finite ``values``."""
    v = np.array([x for x in values if x is not None and np.isfinite(x)], dtype=np.float64)
    return {
        "mean": float(v.mean()) if v.size else math.nan,
        "std": float(v.std(ddof=1)) if v.size > 1 else math.nan,
        "n": int(v.size),
    }


def seed_averaged(per_seed: PerSeed) -> dict[Any, float]:
    """``{seed: {case key: score}}`` -> ``{case key: mean over the seeds that scored it}``."""
    sums: dict[Hashable, list[float]] = {}
    for cases in per_seed.values():
        for key, value in cases.items():
            if np.isfinite(value):
                sums.setdefault(key, []).append(value)
    return {key: float(np.mean(v)) for key, v in sums.items()}


def holm(p_values: Iterable[float]) -> list[float]:
    """Holm's step-down adjusted p values (Holm 1979), in the order given: the i-th smallest of the m finite p
    values times (m - i + 1), made non-decreasing, at most 1; a NaN stays NaN and does not count in m."""
    values = list(p_values)
    finite = sorted((p, i) for i, p in enumerate(values) if math.isfinite(p))
    adjusted = [math.nan] * len(values)
    running, m = 0.0, len(finite)
    for rank, (p, i) in enumerate(finite):
        running = max(running, min(1.0, (m - rank) * p))
        adjusted[i] = running
    return adjusted


def smallest_p(test: Mapping[str, Any]) -> float:
    """The smallest p the signed-rank test of ``test`` can give: every one of its n nonzero paired differences on
    the tested side, 2^-n one-tailed and 2^(1-n) two-sided (the exact test; ties only raise it). n is
    ``n_nonzero``, else ``n`` (tables written before it: then a bound below the true smallest p)."""
    n = test.get("n_nonzero", test.get("n"))
    if not isinstance(n, int) or n < 1:
        return 1.0
    return min(1.0, 2.0 ** (1 - n) if test.get("alternative", "two-sided") == "two-sided" else 2.0**-n)


def correct_family(tests: Iterable[dict[str, Any] | None]) -> None:
    """Add ``p_holm`` (:func:`holm` over the family's finite p values) and ``family`` (how many) to every
    comparison of ``tests`` (``compare`` results; None and those without a p are skipped): one table's
    comparisons, which a reader scans together for a †. A test too small ever to give p < ``SIGNIFICANCE``
    (:func:`smallest_p`: a site's 5 cases, two-sided) is marked ``too_few`` and left out of the family, as Tarone's
    (1990) correction for discrete tests leaves such hypotheses out: it can never be rejected, and counting it would
    only make the others' adjusted p larger. A test whose differences are all 0 is left out too, unmarked (there is
    no difference to test: its p is 1)."""
    finite = [t for t in tests if t is not None and isinstance(t.get("p"), (int, float)) and math.isfinite(t["p"])]
    for t in finite:
        t.pop("p_holm", None), t.pop("family", None)
        t["too_few"] = smallest_p(t) >= SIGNIFICANCE and t.get("n_nonzero") != 0  # all equal: no difference at all
    family = [t for t in finite if smallest_p(t) < SIGNIFICANCE]
    for t, adjusted in zip(family, holm(t["p"] for t in family)):
        t["p_holm"], t["family"] = adjusted, len(family)


def adjusted_p(test: Mapping[str, Any]) -> float:
    """The p a comparison is judged by: Holm-adjusted within its family where :func:`correct_family` ran, else
    the Wilcoxon p (a comparison on its own)."""
    p = test.get("p_holm", test.get("p"))
    return float(p) if isinstance(p, (int, float)) else math.nan  # None: a p tables.json holds as null (NaN)


def significant(test: Mapping[str, Any] | None) -> bool:
    """The bootstrap CI excludes 0 on the tested side and :func:`adjusted_p` < ``SIGNIFICANCE``, the two pointing
    the same way (not :func:`ranks_disagree`): the † of every table and the run report's "beyond noise" (see the
    module docstring for why both)."""
    if not test or not test.get("n") or not test.get("ci_excludes_0") or ranks_disagree(test):
        return False
    p = adjusted_p(test)
    return math.isfinite(p) and p < SIGNIFICANCE


def significant_over_seeds(test: Mapping[str, Any] | None) -> bool:
    """:func:`significant` over at least 2 seeds: a bench's †. With one seed the hierarchical bootstrap has no
    run-to-run variance to draw, so the difference is one of two trained models, not yet of two methods (a single
    run's report says "beyond noise" of its one seed instead). A test without ``seeds`` (an old tables.json) is
    judged by :func:`significant` alone."""
    seeds = (test or {}).get("seeds")
    return significant(test) and not (isinstance(seeds, int) and seeds < 2)


def seeds_disagree(test: Mapping[str, Any] | None) -> bool:
    """Whether the per-seed differences (``per_seed_diff``, at least 2 of them) do not all share the sign of the
    mean difference (a seed with a difference of exactly 0 does not share it; with a mean of exactly 0, whether any
    seed differs from 0): the Wilcoxon p, which takes each
    image (averaged over the seeds) as the unit, cannot see that the training runs disagree, and a shift in one seed
    alone moves almost every image the same way. The CI, which resamples the seeds, is the guide then."""
    test = test or {}
    diffs = [v for v in (test.get("per_seed_diff") or {}).values() if isinstance(v, (int, float)) and math.isfinite(v)]
    mean = test.get("mean_diff", test.get("mean_difference"))
    if len(diffs) < 2 or not (isinstance(mean, (int, float)) and math.isfinite(mean)):
        return False
    if mean == 0:  # no sign to share: they disagree where they differ at all
        return any(d != 0 for d in diffs)
    return any(d == 0 or (d > 0) != (mean > 0) for d in diffs)


def ci_statistic(test: Mapping[str, Any]) -> float:
    """The difference ``test``'s CI is about: ``site_mean_diff`` where :func:`compare` ran with ``site_means``, else
    the mean difference over the cases (``mean_diff``; ``mean_difference`` in older tables); NaN without one."""
    mean = test.get("site_mean_diff", test.get("mean_diff", test.get("mean_difference")))
    return float(mean) if isinstance(mean, (int, float)) else math.nan


def ranks_disagree(test: Mapping[str, Any] | None) -> bool:
    """Whether the difference the CI is about (:func:`ci_statistic`) and the signed-rank statistic (``rank_sign``,
    :func:`signed_rank_sign`; from ``case_diffs`` for a tables.json written before it was recorded) point opposite
    ways: a two-sided p then says the ranks favour one side while the mean, and its CI, say the other (a method better
    on most images and much worse on a few). Neither number alone is the comparison then; the table says so instead
    of a †."""
    test = test or {}
    sign = test.get("rank_sign")
    if not isinstance(sign, int) and isinstance(test.get("case_diffs"), Mapping):
        values = [v for v in test["case_diffs"].values() if isinstance(v, (int, float)) and math.isfinite(v)]
        sign = signed_rank_sign(np.array(values, dtype=np.float64))
    mean = ci_statistic(test)
    if not (isinstance(sign, int) and sign and math.isfinite(mean) and mean):
        return False
    return (sign > 0) != (mean > 0)


def cautions(test: Mapping[str, Any] | None) -> list[str]:
    """What to read beside a comparison's p: ``seeds disagree`` (:func:`seeds_disagree`), ``mean and ranks
    disagree`` (:func:`ranks_disagree`)."""
    return [
        said
        for said, holds in (("seeds disagree", seeds_disagree), ("mean and ranks disagree", ranks_disagree))
        if holds(test)
    ]


def caution_text(test: Mapping[str, Any] | None) -> str:
    """:func:`cautions` as they follow a p in every table: `` (seeds disagree) (mean and ranks disagree)``; empty
    when none holds."""
    return "".join(f" ({said})" for said in cautions(test))


# --- the text of a comparison (``compare``'s result: ``mean_diff``/``mean_difference``, ``ci_low``, ``ci_high``,
# ``ci_excludes_0``, ``p``/``p_holm``), one way in every table: the run and bench reports, docs/results.md,
# benchmarks' Markdown
def dagger(test: Mapping[str, Any] | None) -> str:
    """`` †`` after a number whose comparison ``test`` is :func:`significant`; empty otherwise."""
    return " †" if significant(test) else ""


def p_value_text(test: Mapping[str, Any] | None) -> str:
    """The p a comparison is judged by (:func:`adjusted_p`) as :func:`p_text` writes it; ``–`` without one."""
    return p_text(adjusted_p(test) if test else math.nan)


def p_text(p: float) -> str:
    """``p`` to 2 significant digits, or as many more as it takes to stay on its side of ``SIGNIFICANCE`` (0.0496
    is ``0.0496``, not ``0.05`` beside a †); ``–`` for NaN."""
    if not math.isfinite(p):
        return "–"
    for digits in range(2, 8):
        text = f"{p:.{digits}g}"
        if (float(text) < SIGNIFICANCE) == (p < SIGNIFICANCE):
            return text
    return repr(p)


def signed_text(x: object, digits: int = DIFF_DIGITS) -> str:
    """``x`` with its sign to ``digits`` decimals; "" where it is not a number (None, NaN). A nonzero ``x`` that
    would print as ``+0.0000`` / ``-0.0000`` is written with one significant digit instead (``+3e-05``), so a
    printed zero is exactly 0 and a CI bound always shows its side of 0."""
    if not (isinstance(x, (int, float)) and math.isfinite(x)):
        return ""
    x = float(x) + 0.0  # -0.0: 0.0
    text = f"{x:+.{digits}f}"
    return f"{x:+.1g}" if x and not float(text) else text


def ci_text(test: Mapping[str, Any] | None, digits: int = DIFF_DIGITS) -> str:
    """``[low, high]`` of ``test``'s bootstrap CI, each bound by :func:`signed_text` to ``digits`` decimals; ``–``
    without one."""
    low, high = (None, None) if not test else (test.get("ci_low"), test.get("ci_high"))
    if not all(isinstance(x, (int, float)) and math.isfinite(x) for x in (low, high)):
        return "–"
    return f"[{signed_text(low, digits)}, {signed_text(high, digits)}]"
