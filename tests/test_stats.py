"""fedseg.evaluate.stats on simulated data with a known difference: the hierarchical bootstrap CI covers it at about
the nominal rate, the one-tailed Wilcoxon p is scipy's with the method the stated rule names (R's wilcox.test
default: the same p in every scipy version and in R), rank stability finds a clear winner; a difference's text never
reads as 0 unless it is 0."""

from __future__ import annotations

import math
import time

import numpy as np
import pytest
from scipy.stats import wilcoxon

from fedseg.evaluate.stats import (
    EXACT_BELOW,
    bootstrap_means,
    ci_text,
    compare,
    correct_family,
    dagger,
    holm,
    p_value_text,
    paired_wilcoxon,
    rank_stability,
    signed_text,
    significant,
)


def simulated(rng, delta: float, sites: int = 8, cases: int = 40, seeds: int = 3, base: float = 0.8):
    """Two methods' ``{seed: {(site, case): Dice}}`` with a true mean difference ``delta`` (a - b): site effects,
    case effects shared by both methods (the pairing), a per-(case, seed) run-to-run noise and a small per-seed shift
    of the mean (3 seeds cannot measure a large one: with a shift sd of 0.01 the CI covers 0.02 in ~83% of draws)."""
    site_effect = rng.normal(0, 0.05, sites)
    case_effect = rng.normal(0, 0.08, (sites, cases))
    site_delta = delta + rng.normal(0, 0.01, sites)  # the difference varies a little between sites
    a: dict[int, dict] = {}
    b: dict[int, dict] = {}
    for s in range(seeds):
        shift_a, shift_b = rng.normal(0, 0.003, 2)
        noise_a, noise_b = rng.normal(0, 0.03, (2, sites, cases))
        common = base + site_effect[:, None] + case_effect
        a[s] = {
            (f"site{i}", f"c{j}"): common[i, j] + site_delta[i] + shift_a + noise_a[i, j]
            for i in range(sites)
            for j in range(cases)
        }
        b[s] = {
            (f"site{i}", f"c{j}"): common[i, j] + shift_b + noise_b[i, j] for i in range(sites) for j in range(cases)
        }
    return a, b


def test_the_ci_covers_a_known_difference_at_about_the_nominal_rate():
    rng = np.random.default_rng(1)
    hits = []
    for draw in range(200):
        a, b = simulated(rng, 0.02, cases=20)
        c = compare(a, b, resamples=400, rng_seed=draw)
        hits.append(c["ci_low"] <= 0.02 <= c["ci_high"])
    assert 0.90 <= np.mean(hits) <= 0.99


def test_compare_reports_the_pairs_the_per_seed_means_and_a_mark_only_when_the_ci_excludes_0():
    a, b = simulated(np.random.default_rng(2), 0.05)
    c = compare(a, b)
    assert c["n"] == 8 * 40 and c["seeds"] == 3
    truth = {s: np.mean([a[s][k] - b[s][k] for k in a[s]]) for s in a}
    assert c["per_seed_diff"] == pytest.approx(truth)
    assert c["ci_low"] < c["mean_diff"] < c["ci_high"] and c["ci_excludes_0"]
    same = compare(a, a)
    assert same["mean_diff"] == 0 and not same["ci_excludes_0"] and same["p"] == 1.0
    assert not compare(a, b, alternative="less")["ci_excludes_0"]
    assert compare(a, b) == c  # a fixed random stream: the same CI every time


def test_the_one_tailed_p_is_scipys():
    rng = np.random.default_rng(3)
    x = {i: v for i, v in enumerate(rng.normal(0.8, 0.1, 49))}
    y = {i: x[i] - d for i, d in enumerate(rng.normal(0.01, 0.05, 49))}
    diffs = np.array([x[i] - y[i] for i in range(49)])
    assert np.unique(np.abs(diffs)).size == 49  # 49 distinct nonzero differences: the exact distribution
    for alternative in ("greater", "less", "two-sided"):
        test = paired_wilcoxon(x, y, alternative)
        assert test["p_method"] == "exact"
        assert test["p"] == pytest.approx(wilcoxon(diffs, alternative=alternative, method="exact").pvalue)
    assert paired_wilcoxon(x, y, "greater")["p"] < paired_wilcoxon(x, y)["p"] < paired_wilcoxon(x, y, "less")["p"]
    with pytest.raises(ValueError, match="alternative"):
        paired_wilcoxon(x, y, "bigger")  # type: ignore[arg-type]


def test_rank_stability_of_a_clear_winner_and_of_a_tie():
    rng = np.random.default_rng(4)
    best, worse = simulated(rng, 0.1)
    stability = rank_stability({"worse": worse, "best": best, "copy": worse})
    assert stability["best"][1] > 0.99
    assert stability["worse"][1] == 0 and sum(stability["worse"].values()) == pytest.approx(1.0)
    # an exact tie (a method scoring every case as another) shares the better rank, whichever is listed first
    assert stability["worse"][2] > 0.99 and stability["copy"] == stability["worse"]
    assert stability["copy"][3] == 0.0


def test_2000_resamples_of_350_cases_and_3_seeds_take_well_under_a_second():
    a, b = simulated(np.random.default_rng(5), 0.0, sites=7, cases=50)
    began = time.process_time()  # CPU time: the machine may be shared
    compare(a, b, resamples=2000)
    assert time.process_time() - began < 0.5


def test_the_bootstrap_resamples_sites_then_cases_within_them():
    values = np.array([[0.0], [0.0], [1.0]])  # site 0: two cases at 0; site 1: one case at 1; one seed
    means = bootstrap_means([values], np.array([0, 0, 1]), resamples=4000)[0]
    # a sample holds sites {0,0} (mean 0), {1,1} (mean 1) or one of each (2 of 3 cells at 0): 1/4, 1/4, 1/2
    assert set(np.round(means, 6)) == {0.0, 1.0, round(1 / 3, 6)}
    assert np.mean(means == 0) == pytest.approx(0.25, abs=0.03) and np.mean(means == 1) == pytest.approx(0.25, abs=0.03)


def test_the_site_means_bootstrap_weighs_every_drawn_site_the_same():
    """Client Avg's statistic: site 0 has two cases at 0, site 1 one at 1. A sample of sites {0, 1} gives the mean of
    site means 1/2 (the pooled mean: 1/3); {0, 0}: 0; {1, 1}: 1. ``compare`` gives the same statistic's point value."""
    values = np.array([[0.0], [0.0], [1.0]])
    means = bootstrap_means([values], np.array([0, 0, 1]), resamples=4000, site_means=True)[0]
    assert set(np.round(means, 6)) == {0.0, 0.5, 1.0}
    assert np.mean(means == 0.5) == pytest.approx(0.5, abs=0.03)
    big = {0: {("big", str(i)): 0.6 for i in range(40)} | {("small", "0"): 0.9, ("small", "1"): 0.95}}
    ref = {0: {key: 0.5 for key in big[0]}}
    pooled, by_site = compare(big, ref), compare(big, ref, site_means=True)
    assert "site_mean_diff" not in pooled and by_site["site_mean_diff"] == pytest.approx((0.1 + 0.425) / 2)
    assert pooled["mean_diff"] == pytest.approx((40 * 0.1 + 0.4 + 0.45) / 42) and by_site["p"] == pooled["p"]
    # each bootstrap around its own statistic: a site of 40 cases at 0.1 and two of 2 cases at 0.4 (one seed)
    values, sites = np.array([[0.1]] * 40 + [[0.4]] * 4), np.array([0] * 40 + [1, 1, 2, 2])
    pooled_boot, site_boot = (bootstrap_means([values], sites, 4000, site_means=by)[0] for by in (False, True))
    assert np.median(pooled_boot) == pytest.approx((40 * 0.1 + 4 * 0.4) / 44) and np.median(site_boot) == 0.3


def test_a_p_value_prints_on_its_side_of_the_threshold():
    from fedseg.evaluate.stats import p_text

    assert [p_text(p) for p in (0.0496, 0.05, 0.0504, 0.31, 1.6e-17, math.nan)] == [
        "0.0496",
        "0.05",
        "0.05",
        "0.31",
        "1.6e-17",
        "–",
    ]
    assert p_value_text({"p": 0.0496}) == "0.0496" and p_value_text({"p": 0.0496, "p_holm": 0.0992}) == "0.099"


def test_holm_matches_the_step_down_definition_and_keeps_nan_out_of_the_count():
    # sorted 0.005, 0.01, 0.03, 0.04 (m = 4): x4, x3, x2, x1, made non-decreasing
    assert holm([0.01, 0.04, 0.03, math.nan, 0.005]) == pytest.approx([0.03, 0.06, 0.06, math.nan, 0.02], nan_ok=True)
    assert holm([0.5, 0.9]) == [1.0, 1.0] and holm([]) == []


def test_a_dagger_needs_both_the_ci_and_the_holm_adjusted_p():
    three_cases = {0: {("s", "a"): 0.9, ("s", "b"): 0.8, ("s", "c"): 0.7}}
    better = {0: {("s", "a"): 0.93, ("s", "b"): 0.82, ("s", "c"): 0.71}}
    test = compare(better, three_cases)
    # every difference above 0: the bootstrap CI lies above 0, but 3 pairs cannot give a two-sided p below 0.25
    assert test["ci_excludes_0"] and test["p_method"] == "exact" and test["p"] == pytest.approx(0.25)
    assert not significant(test) and dagger(test) == ""
    rng = np.random.default_rng(1)
    cases = {0: {("s", str(i)): float(v) for i, v in enumerate(rng.random(40))}}
    clear = compare({0: {k: v + 0.05 + 0.01 * rng.standard_normal() for k, v in cases[0].items()}}, cases)
    assert significant(clear) and dagger(clear) == " †"
    family = [clear, {**clear, "p": 0.03}, {**clear, "p": 0.04}]  # each below 0.05 alone
    correct_family(family)
    assert [t["family"] for t in family] == [3, 3, 3] and family[2]["p_holm"] == pytest.approx(0.06)
    assert significant(family[0]) and not significant(family[1]) and not significant(family[2])
    assert p_value_text(family[2]) == "0.06"


def test_the_wilcoxon_counts_the_pairs_that_differ():
    ref = {("s", str(i)): 0.5 for i in range(10)}
    ours = {**ref, ("s", "0"): 0.6, ("s", "1"): 0.7}
    test = paired_wilcoxon(ours, ref)
    assert test["n"] == 10 and test["n_nonzero"] == 2 and test["p_method"] == "exact"  # of the 2 that differ
    # the zeros dropped, ranks 1 and 2, both positive: R+ = 3, reached by 1 of the 4 sign assignments: 2 x 1/4
    assert test["p"] == 0.5 == wilcoxon([0.1, 0.2], method="exact").pvalue
    same = paired_wilcoxon(ref, ref)
    assert (same["n"], same["n_nonzero"], same["p"], same["p_method"]) == (10, 0, 1.0, None)
    empty = paired_wilcoxon({}, ref)
    assert empty["n"] == 0 and math.isnan(empty["p"]) and empty["p_method"] is None


def _normal_p(diffs: list[float]) -> float:
    """The two-sided p of the normal approximation written out as R's wilcox.test computes it (zeros dropped,
    average ranks, the tie correction, the continuity correction), independent of scipy."""
    d = np.array([x for x in diffs if x != 0])
    magnitudes = np.abs(d)
    ranks = np.array([np.sum(magnitudes < m) + (np.sum(magnitudes == m) + 1) / 2 for m in magnitudes])
    n = d.size
    _, ties = np.unique(magnitudes, return_counts=True)
    var = n * (n + 1) * (2 * n + 1) / 24 - np.sum(ties**3 - ties) / 48
    low = min(ranks[d > 0].sum(), ranks[d < 0].sum())
    return math.erfc((abs(low - n * (n + 1) / 4) - 0.5) / math.sqrt(var) / math.sqrt(2))


def test_the_wilcoxon_method_is_exact_without_ties_below_50_exact_given_the_ties_up_to_13_else_the_normal_one():
    """Stated here, not scipy's ``auto`` (whose choice changed across the scipy versions fedseg allows): the zeros
    dropped, exact for fewer than 50 untied differences, the exact distribution given tied ranks up to 13 (every sign
    assignment, worked out by hand below), else the normal approximation with the tie and continuity corrections
    (written out as R computes it)."""
    rng = np.random.default_rng(7)
    distinct = list(rng.normal(0.01, 0.05, EXACT_BELOW))
    zeros = dict.fromkeys(range(EXACT_BELOW + 1), 0.0)
    below = paired_wilcoxon(dict(enumerate(distinct[:-1])), zeros)
    assert (below["n"], below["p_method"]) == (EXACT_BELOW - 1, "exact")
    assert below["p"] == wilcoxon(distinct[:-1], method="exact").pvalue
    at = paired_wilcoxon(dict(enumerate(distinct)), zeros)
    assert at["p_method"] == "asymptotic" and at["p"] == pytest.approx(_normal_p(distinct), rel=1e-9)
    with_a_zero = distinct[:10] + [0.0]  # the zero dropped: 10 untied differences
    test = paired_wilcoxon(dict(enumerate(with_a_zero)), zeros)
    assert (test["n"], test["n_nonzero"], test["p_method"]) == (11, 10, "exact")
    assert test["p"] == wilcoxon(distinct[:10], method="exact").pvalue

    tied = [0.25, 0.25, 0.25, -0.5]  # ranks 2, 2, 2 | 4; R+ = 6. Of the 16 sign assignments, R+ >= 6 in 8
    # (positive: {2,4} x3, {2,2,4} x3, all four, {2,2,2}); R+ <= 6 in 12 ({}, {2} x3, {4}, {2,2} x3, {2,2,2}, {2,4} x3)
    expected = {"two-sided": 1.0, "greater": 8 / 16, "less": 12 / 16}
    for alternative, p in expected.items():
        test = paired_wilcoxon(dict(enumerate(tied)), zeros, alternative)
        assert (test["p_method"], test["p"]) == ("permutation", p), alternative
    six = paired_wilcoxon(dict(enumerate([0.01] * 6)), zeros)  # all tied: only 1 of the 64 assignments is as large
    assert (six["p_method"], six["p"]) == ("permutation", 2 / 64)
    # 13 differences, still enumerated: twelve 0.25 (rank 6.5 each) and -0.5 (rank 13), R+ = 78; R+ >= 78 where
    # k of the twelve are positive and b of the 13: k = 12 (b either), k = 11 with b, k = 10 with b (C(12, 10) = 66)
    assert paired_wilcoxon(dict(enumerate([0.25] * 12 + [-0.5])), zeros, "greater")["p"] == (2 + 12 + 66) / 2**13

    many = [0.25] * 7 + [-0.5] * 7  # 14 tied differences: the normal approximation
    test = paired_wilcoxon(dict(enumerate(many)), zeros)
    assert test["p_method"] == "asymptotic" and test["p"] == pytest.approx(_normal_p(many), rel=1e-12)
    for alternative in ("greater", "less"):  # one-tailed: the continuity correction toward the mean, as in R
        one = paired_wilcoxon(dict(enumerate(many)), zeros, alternative)
        scipy_p = wilcoxon(many, alternative=alternative, method="asymptotic", correction=True).pvalue
        assert one["p"] == pytest.approx(scipy_p, rel=1e-12), alternative


def test_the_normal_approximation_is_asked_for_by_its_old_name_where_scipy_predates_asymptotic(monkeypatch):
    """scipy before 1.15 calls it ``approx`` and rejects ``asymptotic``: the same p either way."""
    import scipy.stats

    real = scipy.stats.wilcoxon
    calls = []

    def old_scipy(x, *args, method="auto", **kwargs):
        calls.append(method)
        if method not in ("auto", "exact", "approx"):
            raise ValueError("method must be either 'auto', 'exact' or 'approx'")
        return real(x, *args, method="asymptotic" if method == "approx" else method, **kwargs)

    tied = {i: v for i, v in enumerate([0.25] * 7 + [-0.5] * 7)}
    zeros = dict.fromkeys(range(14), 0.0)
    now = paired_wilcoxon(tied, zeros)["p"]
    monkeypatch.setattr(scipy.stats, "wilcoxon", old_scipy)
    assert paired_wilcoxon(tied, zeros)["p"] == pytest.approx(now, rel=1e-15) and calls == ["asymptotic", "approx"]


@pytest.mark.parametrize("alternative", ["two-sided", "greater"])
def test_the_case_differences_a_table_keeps_recompute_its_p(alternative):
    """``with_cases``: the per-case differences (averaged over the seeds) the Wilcoxon test ranked, keyed
    ``site/case``: scipy's test of them is the reported p, so a reader can check a table's p from tables.json."""
    a, b = simulated(np.random.default_rng(5), 0.01, sites=3, cases=7)
    b[1][("site0", "c2")] = math.nan  # scored in one seed only: averaged over the seed it has
    test = compare(a, b, alternative, resamples=200, with_cases=True)
    diffs = test["case_diffs"]
    assert len(diffs) == 21 and next(iter(diffs)) == "site0/c0"
    mean_over_seeds = np.mean([a[s][("site0", "c2")] - b[s][("site0", "c2")] for s in (0, 2)])
    assert diffs["site0/c2"] == pytest.approx(mean_over_seeds, abs=1e-15)
    kept = [d for d in diffs.values() if np.isfinite(d)]  # the documented recomputation, with the recorded method
    method = test["p_method"]
    assert test["p"] == pytest.approx(
        wilcoxon(kept, alternative=alternative, method=method, correction=method == "asymptotic").pvalue, rel=1e-12
    )
    assert "case_diffs" not in compare(a, b, alternative, resamples=200)  # only where asked (tables' pooled tests)


def test_a_difference_prints_as_zero_only_where_it_is_zero():
    """4 decimals, always signed; a nonzero number that would print as +0.0000 / -0.0000 shows its first significant
    digit instead, so a CI bound always shows its side of 0."""
    assert [signed_text(x) for x in (0.0012, -0.0012, 0.0, -0.0, 0.00004, -0.000032, 1e-17)] == [
        "+0.0012",
        "-0.0012",
        "+0.0000",
        "+0.0000",
        "+4e-05",
        "-3e-05",
        "+1e-17",
    ]
    assert signed_text(math.nan) == signed_text(None) == ""
    assert signed_text(0.004, 2) == "+0.004" and signed_text(-1.234, 2) == "-1.23"  # HD95: its own digits
    assert ci_text({"ci_low": 0.00002, "ci_high": 0.0041}) == "[+2e-05, +0.0041]"  # excludes 0, and reads so
    assert ci_text({"ci_low": -0.00002, "ci_high": 0.0041}) == "[-2e-05, +0.0041]"
    assert ci_text({"ci_low": 0.0, "ci_high": 0.0041}) == "[+0.0000, +0.0041]"  # a bound at exactly 0
    assert ci_text({"ci_low": None, "ci_high": 0.1}) == "–"  # null in tables.json, as NaN
    assert p_value_text({"p": None}) == "–" and p_value_text({"p": math.nan}) == "–"


def test_seeds_disagree_where_a_seeds_difference_does_not_share_the_means_sign():
    from fedseg.bench.table_rows import p_text
    from fedseg.evaluate.stats import seeds_disagree

    one_seed_moves = {"mean_diff": 0.0386, "per_seed_diff": {0: -0.0072, 1: 0.0, 2: 0.1231}, "p": 2e-14}
    agree = {"mean_diff": 0.03, "per_seed_diff": {0: 0.02, 1: 0.04}, "p": 0.001}
    assert seeds_disagree(one_seed_moves) and not seeds_disagree(agree)
    assert seeds_disagree({"mean_diff": -0.01, "per_seed_diff": {0: -0.02, 1: 0.0}})  # a seed at exactly 0
    assert not seeds_disagree({"mean_diff": 0.01, "per_seed_diff": {0: 0.01}})  # one seed: nothing to disagree
    assert not seeds_disagree({"mean_diff": 0.0, "per_seed_diff": {0: 0.0, 1: 0.0}}) and not seeds_disagree(None)
    assert not seeds_disagree({"mean_diff": -0.02, "per_seed_diff": {0: -0.01, 1: -0.03}})  # agree, below 0
    assert seeds_disagree({"mean_diff": -0.01, "per_seed_diff": {0: -0.03, 1: 0.01}})  # one seed above 0
    assert seeds_disagree({"mean_diff": 0.0, "per_seed_diff": {0: 0.5, 1: -0.5}})  # they cancel out
    assert not seeds_disagree({"mean_diff": 0.01, "per_seed_diff": {0: 0.01, 1: float("nan"), 2: 0.02}})
    assert p_text(one_seed_moves) == "2e-14 (seeds disagree)" and p_text(agree) == "0.001"


def test_a_mean_and_ranks_that_disagree_get_no_dagger_and_say_so():
    """A method slightly better on 9 of 10 images of every site and much worse on the 10th has a negative mean (its
    CI below 0) and a tiny two-sided p whose ranks favour it: the † read as "significantly worse" (a statistics
    audit). Now the comparison says the two disagree and gets no †; where both point the same way nothing changes."""
    from fedseg.bench.table_rows import p_text
    from fedseg.evaluate.stats import caution_text, ranks_disagree

    rng = np.random.default_rng(0)
    keys = [(f"site{i % 12}", f"c{i}") for i in range(120)]
    diffs = np.where(np.arange(120) < 12, -0.5, 0.01) + rng.normal(0, 0.001, 120)  # one bad image per site
    a = {s: {k: 0.8 + d for k, d in zip(keys, diffs)} for s in range(3)}
    b = {s: {k: 0.8 for k in keys} for s in range(3)}
    test = compare(a, b, resamples=500)
    assert test["mean_diff"] < 0 and test["ci_high"] < 0 and test["p"] < 1e-4 and test["rank_sign"] == 1
    assert ranks_disagree(test) and not significant(test) and dagger(test) == ""
    assert caution_text(test) == " (mean and ranks disagree)" and p_text(test).endswith(" (mean and ranks disagree)")
    p = wilcoxon(list(test_diffs := diffs), alternative="greater").pvalue  # the ranks' side, as scipy sees it
    assert p < 1e-4 and len(test_diffs) == 120
    agree = compare({s: {k: 0.81 + 0.001 * i for i, k in enumerate(keys)} for s in range(3)}, b, resamples=500)
    assert agree["rank_sign"] == 1 and not ranks_disagree(agree) and significant(agree)
    # a tables.json written before rank_sign was recorded: read from its case differences
    old = {k: v for k, v in compare(a, b, resamples=50, with_cases=True).items() if k != "rank_sign"}
    assert ranks_disagree(old) and not ranks_disagree({**old, "case_diffs": None})


def test_a_test_too_small_ever_to_reach_significance_is_left_out_of_its_holm_family():
    """The signed-rank test of n nonzero differences cannot give p below 2^(1-n) two-sided (2^-n one-tailed): a
    site's 5 test cases can never reach 0.05. Such a test is marked too_few and left out of its family (Tarone
    1990), so it no longer inflates the Holm adjustment of the tests that can."""
    from fedseg.evaluate.stats import correct_family, smallest_p, wilcoxon_p

    assert smallest_p({"n_nonzero": 5, "alternative": "two-sided"}) == 0.0625
    assert smallest_p({"n_nonzero": 6, "alternative": "two-sided"}) == 0.03125
    assert smallest_p({"n_nonzero": 5, "alternative": "greater"}) == 0.03125
    assert smallest_p({"n": 3}) == 0.25  # a table written before n_nonzero: n bounds it
    # the bound is the exact test's: all 5 (6) differences on one side
    assert wilcoxon_p(np.arange(1.0, 6.0), "two-sided", "exact") == pytest.approx(0.0625)
    assert wilcoxon_p(np.arange(1.0, 7.0), "two-sided", "exact") == pytest.approx(0.03125)
    small = {"p": 0.0625, "n": 5, "n_nonzero": 5, "alternative": "two-sided", "p_holm": 0.2, "family": 3}
    a = {"p": 0.01, "n": 40, "n_nonzero": 40, "alternative": "two-sided"}
    b = {"p": 0.02, "n": 40, "n_nonzero": 40, "alternative": "two-sided"}
    same = {"p": 1.0, "n": 40, "n_nonzero": 0, "alternative": "two-sided"}  # identical scores: nothing to test
    correct_family([small, a, b, same])
    assert small["too_few"] and "p_holm" not in small and "family" not in small
    assert not same["too_few"] and "p_holm" not in same
    assert (a["p_holm"], b["p_holm"], a["family"]) == (0.02, 0.02, 2) and not a["too_few"]
