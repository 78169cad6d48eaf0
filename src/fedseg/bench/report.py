"""A bench's output files: ``results.csv``, ``tuning.csv``, ``tables.json``, ``tables.md``, ``tables.tex`` (the same
tables as LaTeX for a paper), ``report.html`` + figures.

The tables, per federation (the papers' layouts). Every table of methods or settings (all but rank stability)
shows, next to its Dice, the rounds each trained (mean ± std over runs) and its SGD steps (Eq. 34, mean over runs):
a budget rule of ``rounds`` with a plateau stop leaves the methods' steps unequal, and a reader should see by how
much.

* **Test** (FeTS Table 1 / Table 3 for a limited or IID partition): Dice mean ± std over cases, per region, HD95,
  client average ± std over seeds, Δ against the reference with the cases it pairs, its 95% hierarchical bootstrap
  CI, Δ per seed and the paired Wilcoxon p, Holm-adjusted within the table († where the CI excludes 0 and that p <
  0.05; ‡ where Δ pairs fewer cases or runs than the columns average), then NSD with its own Δ, CI and p (only
  where the runs scored NSD: a bench of runs written before it existed keeps its old columns), runs whose best
  round was in their last 10%, at least 2 ("not converged");
* **Per site** (FedSM Tables 3-4, Auto-FedAvg Table 2): each site's Dice mean ± std over seeds († where the
  site's comparison is significant, Holm-adjusted over every cell of the table), client average, local avg and
  local gen where a method has local models;
* **Cost** (FeTS Table 2): rounds trained, SGD steps (Eq. 34), parallel SGD steps (Eq. 35), training floats per
  site (as FeTS reports them) and in total over sites, evaluation floats per site (validation and test messages,
  not in the paper's communication), simulated hours (Eq. 36-38);
* **Paired comparisons** (the bench's ``comparisons``, e.g. FedSM against centralized, SoftPull against the other
  personalization strategies of FedSM Table 6): Δ, its CI, the per-seed Δ and the Wilcoxon p per pair;
* **Rank stability** (challengeR): how often each method ranks 1st, 2nd... by mean Dice over bootstrap samples;
* **Tuning on validation** (FeTS Table 4, FedSM Table 7 for a λ grid): every setting's validation score (what
  selects) next to its test score (reported, never used), and how many of its tuning runs may not have converged;
  with ``tune.per_fold``, per fold (a ``fold`` column, in ``tuning.csv`` too), each fold's selection marked.

Differences of fractions (Dice, NSD) print to 4 decimals, HD95's to its own 2, always signed, by
:func:`fedseg.evaluate.stats.signed_text` (a nonzero one that would print as ±0.0000 gets one significant digit).
``tables.json`` is strict JSON: a number that is not finite (NaN: no std of one seed, no p without a pair) is
``null`` (:func:`fedseg.atomic_files.json_ready`), read back as missing exactly as NaN was (a ``tables.json``
written before, with bare ``NaN``, still reads).
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from fedseg.atomic_files import atomic_write_text, strict_json_text
from fedseg.bench.execute import Echo
from fedseg.bench.phases import BENCH_FILE, TABLES_ONLY, BenchRuns, as_recorded, spec_change
from fedseg.bench.select import tuning_rows
from fedseg.bench.spec import BenchSpec
from fedseg.bench.tables import RESULT_COLUMNS, correct_tests, federation_tables
from fedseg.evaluate.metric_info import DICE, HD95, NSD
from fedseg.evaluate.stats import (
    DIFF_DIGITS,
    EXACT_BELOW,
    PERMUTATION_UP_TO,
    RESAMPLES,
    caution_text,
    ci_text,
    p_value_text,
    signed_text,
    significant_over_seeds,
)
from fedseg.presentation import kit
from fedseg.presentation.drafts import figure_draft
from fedseg.presentation.figures import per_site_bars
from fedseg.presentation.files import kind_of
from fedseg.presentation.latex import tex_comment, tex_label, tex_table
from fedseg.run.outputs import csv_text
from fedseg.run.provenance import utc_now
from fedseg.run.stopping import NEVER_IMPROVED_WHY, PLATEAU

TUNING_COLUMNS = [
    "federation",
    "method",
    "setting",
    "val_dice",
    "test_dice",
    "runs",
    "rounds",
    "sgd_steps",
    "plateau_stops",
    "not_converged",
    "selected",
    "at_edge",
]
EDGE = " (grid edge)"  # after a selected setting with a value at the edge of its grid


def ms(entry: dict | None, digits: int = 3) -> str:
    """``mean ± std`` (std left out when undefined); ``–`` without a mean."""
    if not entry or not _finite(entry.get("mean")):
        return "–"
    std = entry.get("std")
    return f"{entry['mean']:.{digits}f}" + (f" ± {std:.{digits}f}" if _finite(std) else "")


def _finite(x) -> bool:
    return x is not None and isinstance(x, (int, float)) and math.isfinite(x)


def _fmt3(x) -> str:
    """``x`` to 3 significant digits; ``–`` where it is not a number (NaN, or null in tables.json)."""
    return f"{x:.3g}" if _finite(x) else "–"


def p_text(test: dict | None) -> str:
    """The Wilcoxon p, Holm-adjusted within its table (``fedseg.bench.tables.correct_tests``), with :func:`mark` and
    what to read beside it (``stats.caution_text``: the seeds' differences do not all share the mean's sign, the
    ranks favour the other side than the mean)."""
    return p_value_text(test) + mark(test) + caution_text(test)


TOO_FEW = " °"  # a test too small ever to give p < 0.05 (``fedseg.evaluate.stats.smallest_p``)


def mark(test: dict | None) -> str:
    """`` †`` where the comparison is significant over at least 2 seeds
    (``fedseg.evaluate.stats.significant_over_seeds``), `` °`` where it has too few cases ever to be (``too_few``:
    ``fedseg.evaluate.stats.correct_family``); empty otherwise."""
    return " †" if significant_over_seeds(test) else TOO_FEW if (test or {}).get("too_few") else ""


def per_seed_text(test: dict | None, digits: int = DIFF_DIGITS) -> str:
    """Δ of each seed (``per_seed_diff``, seed order), labelled with its run seed: ``s0 +0.0012 / s1 -0.0004``; "–"
    without them (a seed without a Δ: ``s2 –``)."""
    per_seed = (test or {}).get("per_seed_diff") or {}
    return " / ".join(f"s{seed} {signed_text(v, digits) or '–'}" for seed, v in per_seed.items()) or "–"


def _md_table(head: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    return "\n".join(lines + ["| " + " | ".join(r) + " |" for r in rows])


def has_nsd(fed: dict) -> bool:
    """Whether any method of the federation has NSD numbers (not a bench of runs written before NSD existed)."""
    return any((s.get("nsd") or {}).get("n") for s in fed["methods"].values())


def has_hd95_tests(fed: dict) -> bool:
    """Whether any method of the federation has an HD95 test against the reference (not a ``tables.json`` written
    before HD95 was tested, nor a bench without HD95: ``eval.hd95`` off)."""
    return any(s.get("hd95_wilcoxon") for s in fed["methods"].values())


BUDGET_HEAD = ["rounds", "SGD steps"]  # next to Dice in every table of methods: what each number was trained with


def budget_cells(rounds: dict | float | None, sgd_steps: float | None) -> list[str]:
    """The rounds trained (``mean ± std`` over runs, or a mean) and the mean SGD steps (Eq. 34) of a method or a
    setting; ``–`` where unknown (tables of runs that did not record them)."""
    text = ms(rounds, 1) if isinstance(rounds, dict) else (f"{rounds:.1f}" if _finite(rounds) else "–")
    return [text, kit.fmt_int(sgd_steps) if _finite(sgd_steps) else "–"]


def _method_budget(s: dict | None) -> list[str]:
    """:func:`budget_cells` of a method's tables.json entry (``–`` for what it lacks)."""
    s = s or {}
    return budget_cells(s.get("convergence", {}).get("rounds"), s.get("cost", {}).get("sgd_steps"))


def test_table(fed: dict, reference: str) -> tuple[list[str], list[list[str]]]:
    unit = fed.get("hd95_unit") or ""
    nsd, hd95 = has_nsd(fed), has_hd95_tests(fed)
    head = ["method", "setting", "runs", *BUDGET_HEAD, DICE.label, *fed["regions"], HD95.title(unit), "client avg"]
    head += [f"Δ vs {reference}", PAIRED, "95% CI", "Δ per seed", "p (Holm)"]
    if hd95:
        head += [f"HD95 Δ vs {reference}", "HD95 95% CI", "HD95 p (Holm)"]
    if nsd:
        head += [NSD.title(unit, fed.get("nsd_tolerance")), f"NSD Δ vs {reference}", "NSD 95% CI", "NSD p (Holm)"]
    head.append("converged")
    rows = []
    ref_runs = (fed["methods"].get(reference) or {}).get("convergence", {}).get("runs")
    for name, s in fed["methods"].items():
        conv = s["convergence"]
        runs = (conv.get("runs"), ref_runs)  # a seed or fold one of the two lacks: the columns average other runs
        row = [
            name,
            s["setting"] + (EDGE if s.get("at_edge") else ""),
            f"{conv['runs']}/{fed['runs']}",
            *_method_budget(s),
            ms(s["dice"], DICE.digits),
            *(ms(s["regions"][r], DICE.digits) for r in fed["regions"]),
            ms(s["hd95"], HD95.digits),
            ms(s["client_avg"], DICE.digits),
        ]
        dice_test = s.get("wilcoxon")
        dice_cells = _test_cells(dice_test, name == reference, _own_cases(s, fed["methods"].get(reference)), runs, True)
        paired = "" if name == reference else paired_text(dice_test)
        row += [dice_cells[0], paired, *dice_cells[1:]]
        dice_n = (dice_test or {}).get("n")
        if hd95:
            hd95_cases = _own_cases(s, fed["methods"].get(reference), "hd95")
            row += _test_cells(s.get("hd95_wilcoxon"), name == reference, hd95_cases, runs, False, HD95.digits, dice_n)
        if nsd:
            nsd_cases = _own_cases(s, fed["methods"].get(reference), "nsd")
            nsd_cells = _test_cells(s.get("nsd_wilcoxon"), name == reference, nsd_cases, runs, paired_as=dice_n)
            row += [ms(s.get("nsd"), NSD.digits), *nsd_cells]
        rows.append(row + [_converged_text(conv["not_converged"], conv["runs"])])
    return head, rows


def paired_text(test: dict | None) -> str:
    """The "cases paired" cell: ``n``, and ``(k differ)`` where fewer than ``n`` differ (the Wilcoxon p ranks only
    the nonzero differences, ``n_nonzero``); ``–`` without a test."""
    if not test:
        return "–"
    differ = test.get("n_nonzero")
    return str(test["n"]) + (f" ({differ} differ)" if isinstance(differ, int) and differ < test["n"] else "")


FEWER_CASES = " ‡"  # after a Δ paired over fewer cases or runs than a method's own columns average
PAIRED = "cases paired"  # the test table's column of how many cases the Dice Δ, its CI and p pair


def _own_cases(s: dict, reference: dict | None, metric: str = "dice") -> tuple[int, ...]:
    """How many cases the method's and the reference's own ``metric`` columns average (mean ± std over cases)."""
    return tuple(int((e.get(metric) or {}).get("n") or 0) for e in (s, reference or {}))


def _test_cells(
    test: dict | None,
    is_reference: bool,
    own_cases: tuple[int, ...] = (),
    runs: tuple[object, ...] = (),
    per_seed: bool = False,
    digits: int = DIFF_DIGITS,
    paired_as: int | None = None,
) -> list[str]:
    """Δ (mean paired difference, to ``digits`` decimals), its bootstrap CI, (``per_seed``) Δ per seed and p of a
    comparison with the reference (``compare``); ``ref`` for the reference itself. ‡ after Δ where it pairs fewer
    cases than ``own_cases`` (the method's and the reference's own columns: a site failed) or the two finished
    different numbers of ``runs`` (a seed or fold one lacks): the columns then describe other cases or runs than Δ.
    ``(n=…)`` after Δ where it pairs another number of cases than ``paired_as`` (the Dice Δ's, in the "cases paired"
    column: an HD95 or NSD comparison shows its own only where it differs)."""
    if is_reference:
        return ["", "", *([""] if per_seed else []), "ref"]
    fewer = test is not None and (any(test["n"] < n for n in own_cases) or len(set(runs)) > 1)
    delta = ""
    if test:
        delta = signed_text(test["mean_diff"], digits) + (FEWER_CASES if fewer else "")
        delta += f" (n={test['n']})" if paired_as is not None and test["n"] != paired_as else ""
    return [delta, ci_text(test, digits), *([per_seed_text(test, digits)] if per_seed else []), p_text(test)]


def site_table(fed: dict, reference: str | None = None) -> tuple[list[str], list[list[str]]]:
    """Each method's Dice per site (mean ± std over the site's cases), with † / ° of its comparison with
    ``reference`` on that site's cases, and ‡ where that comparison paired fewer cases than the two cells average."""
    head = ["method", *BUDGET_HEAD, *fed["sites"], "client avg", "local avg", "local gen"]
    rows = []
    ref_sites = (fed["methods"].get(reference) or {}).get("sites") or {}
    for name, s in fed["methods"].items():
        cells = []
        for site in fed["sites"]:
            test = s["site_wilcoxon"].get(site)
            own = _own_cases({"dice": s["sites"].get(site)}, {"dice": ref_sites.get(site)})
            fewer = test is not None and any(test["n"] < n for n in own)
            cells.append(ms(s["sites"].get(site)) + mark(test) + (FEWER_CASES if fewer else ""))
        rows.append([name, *_method_budget(s), *cells, ms(s["client_avg"]), ms(s["local_avg"]), ms(s["local_gen"])])
    return head, rows


def cost_table(fed: dict) -> tuple[list[str], list[list[str]]]:
    head = [
        "method",
        *BUDGET_HEAD,
        "parallel SGD steps",
        "floats per site",
        "floats (all sites)",
        "eval floats per site",
        "sim. hours",
    ]
    rows = []
    for name, s in fed["methods"].items():
        c = s["cost"]
        rows.append(
            [
                name,
                *_method_budget(s),
                kit.fmt_int(c["parallel_sgd_steps"]),
                _fmt3(c["floats_per_site"]),
                _fmt3(c["floats"]),
                _fmt3(c["eval_floats_per_site"]),
                kit.fmt(c["simulated_hours"], 3),
            ]
        )
    return head, rows


def comparison_table(fed: dict) -> tuple[list[str], list[list[str]]]:
    """The bench's ``comparisons``: Δ (mean over cases of the paired differences), its bootstrap CI, Δ per seed
    and the Wilcoxon p."""
    head = ["method", "against", "rounds (method / against)", "SGD steps (method / against)", "seeds", "cases"]
    head += ["Δ Dice", "95% CI", "Δ per seed", "p (Holm)"]
    methods = fed["methods"]
    rows = [
        [
            c["method"],
            c["against"],
            *(" / ".join(pair) for pair in zip(*(_method_budget(methods.get(n)) for n in (c["method"], c["against"])))),
            str(c["seeds"]),
            str(c["n"]),
            signed_text(c["mean_diff"]),
            ci_text(c),
            per_seed_text(c),
            p_text(c),
        ]
        for c in fed.get("comparisons", [])
    ]
    return head, rows


def rank_table(fed: dict) -> tuple[list[str], list[list[str]]]:
    """Rank stability: per method, the fraction of bootstrap samples in which it holds each rank (1 = best)."""
    stability = fed.get("rank_stability") or {}
    n = len(stability)
    head = ["method", *(f"rank {r}" for r in range(1, n + 1))]
    rows = [
        [name, *(f"{float(ranks.get(r, ranks.get(str(r), 0.0))):.2f}" for r in range(1, n + 1))]
        for name, ranks in stability.items()
    ]
    return head, rows


def tune_table(rows: list[dict], federation: str) -> tuple[list[str], list[list[str]]]:
    """Every setting of the federation's grids: its validation score (what selects), test score (not used), runs,
    the rounds where the plateau rule stopped them, and (rows that record it: ``not_converged``, tables written from
    this version on) how many of its runs converged, as the test table's "converged" column counts them."""
    counted = _tuning_counted(rows, federation)
    rows = [r for r in rows if r["federation"] == federation]
    per_fold = any("fold" in r for r in rows)  # tune.per_fold: each fold's own tuning
    head = ["method", *(["fold"] if per_fold else []), "setting", *BUDGET_HEAD]
    head += ["validation Dice (selects)", "test Dice (not used)", "runs"]
    head += ["plateau stop at", *(["converged"] if counted else []), "selected"]
    body = [
        [
            r["method"],
            *([fold_cell(r)] if per_fold else []),
            r["setting"],
            *budget_cells(r.get("rounds"), r.get("sgd_steps")),
            kit.fmt(r["val_dice"], 4),
            kit.fmt(r["test_dice"], 4),
            str(r["runs"]),
            r.get("plateau_stops") or "",
            *([_converged_text(r.get("not_converged"), r["runs"])] if counted else []),
            ("✓" + (f"{EDGE}: {r['at_edge']}" if r.get("at_edge") else "")) if r["selected"] else "",
        ]
        for r in rows
    ]
    return head, body


TUNING_CONVERGED = (
    "converged: the setting's tuning runs that selected a round before the last 10% (at least 2) of their rounds or "
    "whose validation plateaued (as the test table counts them); a setting whose runs may not have converged was "
    "compared on validation at a budget that may have cut it short."
)


def _tuning_counted(rows: list[dict], federation: str) -> bool:
    """Whether the federation's tuning rows count their not-converged runs (rows written before do not)."""
    return any("not_converged" in r for r in rows if r["federation"] == federation)


def _converged_text(not_converged: object, runs: int) -> str:
    """``converged/runs``, the test and tuning tables' "converged" (``not_converged``: runs whose selected round
    lies in the last 10% (at least 2) of their rounds without a validation plateau,
    ``fedseg.run.stopping.not_converged``);
    ``–`` where unknown or without runs."""
    return f"{runs - not_converged}/{runs}" if isinstance(not_converged, int) and runs else "–"


def not_converged(fed: dict) -> str:
    """The test table's note on convergence: the methods whose runs may not have converged, and (tables that count
    them) those whose validation never improved on its first validated round."""
    flat = [
        f"{n} ({s['convergence']['never_improved']}/{s['convergence']['runs']})"
        for n, s in fed["methods"].items()
        if s["convergence"].get("never_improved")
    ]
    never = f" **Never improved** ({NEVER_IMPROVED_WHY}): {', '.join(flat)}." if flat else ""
    return _late_note(fed) + never


def _late_note(fed: dict) -> str:
    late = [
        f"{n} ({s['convergence']['not_converged']}/{s['convergence']['runs']})"
        for n, s in fed["methods"].items()
        if s["convergence"]["not_converged"]
    ]
    if not late:
        return (
            "Every run converged: it selected a round before the last 10% (at least 2) of its rounds, or its "
            "validation plateaued."
        )
    return (
        "**May not have converged** (runs whose round selected on validation lies in the last 10%, at least 2, of the "
        "rounds they "
        f"trained, without a validation plateau): {', '.join(late)}. Their Δ, CI and † compare models that more rounds "
        "may still change: a † there says which method was ahead at this budget, not which converges higher."
    )


NOTES = (
    "Dice / HD95: mean ± std over the test cases of all folds (each case averaged over the seeds first); client avg: "
    "mean of per-site means, ± std over seeds. Δ: mean over cases of (method − reference), paired per case and seed "
    "(the same images in every seed: data.seed), over the cases in the cases paired column. 95% CI: percentile "
    "interval of Δ over {resamples} hierarchical bootstrap samples (sites, then cases within the drawn sites, and "
    "seeds, all with replacement), so it carries case-to-case and run-to-run variance (with fewer than 5 seeds the "
    "run-to-run part cannot show its full size: read the Δ per seed column: s0 is run seed 0's Δ). p: {alternative} "
    "paired Wilcoxon signed-rank test over cases (each case's differences averaged over the seeds; {method}), "
    "Holm-adjusted within its table (the Δ column's comparisons; every cell of the per-site table; the bench's "
    "comparisons). °: too few paired cases for the test ever to give p < 0.05 (n nonzero differences: its smallest p "
    "is 2^(1−n) two-sided, 2^(−n) one-tailed, so fewer than 6 or 5): no evidence either way, and left out of its "
    "Holm family (Tarone 1990). † marks a comparison only where both hold: the CI excludes 0{side} and the adjusted "
    "p < 0.05 (a CI of a handful of cases excludes 0 whenever they differ the same way; the p does not carry the "
    "seeds' variance); never with one seed, whose CI has no run-to-run variance to draw: a difference between two "
    "trained models, not yet between two methods. (seeds disagree): the Δ per seed do not all share Δ's sign (a seed "
    "at exactly 0 included): the p takes each image as the unit and cannot see that the training runs disagree (a "
    "shift in one seed moves almost every image the same way), so a small p there is no evidence across runs: read "
    "the CI (the Δ per seed of the other metrics are in tables.json). (mean and ranks disagree): the signed-rank "
    "statistic favours the other side than Δ (better on most images, much worse on a few, or the reverse): no †; the "
    "p says only that the two differ. cases paired: n, and (k differ) where some differences are 0 (the p ranks "
    "those k). ‡: Δ, CI and p pair fewer cases than the Dice columns average (a site failed), or the method and the "
    "reference finished different runs (a seed or fold missing): the columns describe other cases or runs than Δ "
    "(in the per-site table: the site's test paired fewer cases than its two cells average). "
    "Settings chosen on validation only (see the tuning table); (grid edge): the selected value is the smallest or "
    "largest of its grid, so the best one may lie outside it. Differences of Dice (as of any score in [0, 1]) to 4 "
    "decimals, of HD95 to 2; a nonzero one that would round to ±0.0000 is shown to one significant digit (+3e-05), "
    "so a bound printed as 0 is exactly 0."
)

WILCOXON_METHOD = (
    "over the nonzero differences: exact for fewer than {exact_below} of them without ties; with ties, up to "
    "{permutation_up_to}, exact given the tied ranks (every sign assignment); else the normal approximation with the "
    "tie and continuity corrections; tables.json names it (p_method)"
)
WILCOXON_AUTO = "by scipy's method='auto' of the scipy that computed it: these tables predate the recorded method"

HD95_SIDE = {"two-sided": "", "greater": ": one-tailed, method < reference", "less": ": one-tailed, method > reference"}
HD95_NOTE = (
    " HD95 Δ: mean over cases of (method − reference) in the HD95 unit, negative where the method's boundaries lie "
    "closer; its CI and p: the same paired test on HD95 with the alternative reversed (lower is better{side}), "
    "Holm-adjusted over the HD95 Δ column; a missed or hallucinated region counts at the worst HD95 "
    "(eval.hd95_worst), so every case is paired."
)

NSD_NOTE = (
    " NSD: normalized surface Dice at the tolerance τ in its heading (eval.nsd_tolerance, in the HD95 unit), mean ± "
    "std over cases as Dice, higher is better; its Δ and p: the same paired test on NSD, Holm-adjusted over the NSD "
    "column."
)

COMPARISONS = (
    "The bench's comparisons: Δ = mean over cases of (method − against), paired per case and seed over the seeds both "
    "finished, its 95% bootstrap CI, Δ per seed (s0: run seed 0), and the Wilcoxon p, Holm-adjusted over these "
    "comparisons († where the CI excludes 0 and that p < 0.05)."
)

RANKS = (
    "Rank stability (as challengeR): the fraction of the same bootstrap samples in which each method holds each rank "
    "by mean Dice (rank 1 = highest; methods with equal means share the better rank), over the cases and seeds every "
    "method scored."
)


def methods_recorded(tables: dict) -> bool:
    """Whether the tables' pooled Dice tests record their Wilcoxon ``p_method`` (``fedseg.evaluate.stats.
    wilcoxon_method``): tables written before it hold p values of scipy's ``method="auto"``, whose rule depends on
    the scipy version."""
    tests = [s["wilcoxon"] for t in tables.values() for s in t["methods"].values() if s.get("wilcoxon")]
    return all("p_method" in test for test in tests)


def notes(bench: BenchSpec, tables: dict, changes: Sequence[str] = ()) -> str:
    """The tables' legend, with the bench's test alternative (NSD's only where a federation has NSD: an old bench
    renders as it did) and the ``changes`` of its tests or comparisons made after runs had finished."""
    alternative = bench.tests.alternative
    side = {"two-sided": "", "greater": " (lies above 0: the tests are one-tailed, method > reference)"}.get(
        alternative, " (lies below 0: the tests are one-tailed, method < reference)"
    )
    one = "one-tailed (" + alternative + ")" if alternative != "two-sided" else "two-sided"
    method = WILCOXON_AUTO
    if methods_recorded(tables):
        method = WILCOXON_METHOD.format(exact_below=EXACT_BELOW, permutation_up_to=PERMUTATION_UP_TO)
    text = NOTES.format(resamples=RESAMPLES, side=side, alternative=one, method=method)
    hd95, nsd = any(has_hd95_tests(t) for t in tables.values()), any(has_nsd(t) for t in tables.values())
    text += HD95_NOTE.format(side=HD95_SIDE[alternative]) if hd95 else ""
    text += NSD_NOTE if nsd else ""
    text += OWN_PAIRS if hd95 or nsd else ""
    text += PER_SEED_DATA if bench.data_seed == "per-seed" else ""
    text += tuning_note(bench)
    if changes:
        text += " **Changed after results existed** (" + "; ".join(changes) + "): the p-values and † follow the change."
    return text


def fold_cell(row: dict) -> str:
    """A tuning row's fold as the tuning table shows it: its number, and a leave-one-out fold's held-out site."""
    fold = str(row.get("fold", ""))
    return f"{fold} (held out: {row['held_out']})" if row.get("held_out") else fold


def tuning_columns(bench: BenchSpec) -> list[str]:
    """``tuning.csv``'s columns: :data:`TUNING_COLUMNS`, with ``fold`` after ``method`` under ``tune.per_fold``
    (and ``held_out``, a leave-one-out fold's held-out site, after it where a federation is leave-one-out)."""
    if not bench.tune.per_fold:
        return TUNING_COLUMNS
    at = TUNING_COLUMNS.index("method") + 1
    held_out = ["held_out"] if any(f.leave_one_out for f in bench.federations) else []
    return [*TUNING_COLUMNS[:at], "fold", *held_out, *TUNING_COLUMNS[at:]]


def tuning_note(bench: BenchSpec) -> str:
    """ "" unless a method's grid was searched where it touches the tables: on validation cases that other folds test
    (k-fold, leave-one-out: their test scores are not fully independent of the tuning), or at a seed that is also a
    final seed (its selected run is that seed's final run, the best of its grid on validation: optimistic); with
    ``tune.per_fold`` it says the tuning was nested (every fold tuned on its own validation cases)."""
    grids = [m.name for m in bench.methods if m.grid]
    other_folds = any(f.leave_one_out for f in bench.federations) or (
        bench.split.mode == "kfold" and set(bench.folds) - set(bench.tune_folds)
    )
    shared = sorted(set(bench.tune_seeds) & set(bench.seeds))
    said = []
    if grids and bench.tune.per_fold:
        said.append(
            "nested per fold (tune.per_fold): in every fold on that fold's own validation cases (a leave-one-out "
            "federation: at every held-out site), so no fold's test cases influenced the setting its runs took; the "
            "folds may take different settings (the tuning table marks each fold's)"
        )
    elif grids and other_folds:
        said.append(
            f"on the validation cases of fold {', '.join(map(str, bench.tune_folds))} (a leave-one-out federation: "
            "its first held-out site's federation), which the other folds test: their test scores are not fully "
            "independent of the tuning"
        )
    if grids and shared:
        said.append(
            f"at seed {', '.join(map(str, shared))}, also a seed of the final runs: the run selected there is that "
            "seed's final run, the best of its grid on validation, so that seed's Δ is optimistic for these methods "
            "(tune.seeds outside seeds keeps every final run out of the selection)"
        )
    if not said:
        return ""
    return f" **Tuned** ({', '.join(grids)}): " + "; and ".join(said) + "."


OWN_PAIRS = " (n=…) after a Δ: the cases it pairs, where they are not the cases paired of the Dice Δ."

PER_SEED_DATA = (
    " **This bench has data_seed: per-seed**: each run seed generated and split its own data, so a case id names "
    "another image in each seed; Δ, CI and p pair methods within a seed, but averaging a case over the seeds "
    "averages different images."
)


def plateau_note(fed: dict) -> str:
    """ "" unless the plateau rule (``fl.stop``) stopped some final runs: then the sentence naming how many per method,
    since a Δ between methods stopped after different numbers of rounds compares budgets as well as methods."""
    stopped = [
        f"{name} ({count}/{m['convergence']['runs']})"
        for name, m in fed["methods"].items()
        if (count := (m["convergence"].get("stopped") or {}).get(PLATEAU))
    ]
    if not stopped:
        return ""
    return (
        f"**Stopped by the plateau rule** (fl.stop): {', '.join(stopped)}. A Δ against a method that trained more "
        "rounds compares budgets as well as methods (the rounds column says how many each trained; a plateau counts as "
        "converged, though more rounds might still have raised it)."
    )


def routing_note(fed: dict) -> str:
    """ "" unless a FedSM-family method's selector routed every test image to its global model in some runs (tables
    written from this version on: ``routed_to_global``): then the sentence naming those runs, whose scores are the
    global model's (a Δ of exactly 0 against FedAvg there is that, not a tie of two personalizations)."""
    routed = [
        f"{name} in {', '.join(runs)} of {m['convergence']['runs']} runs"
        for name, m in fed["methods"].items()
        if (runs := m.get("routed_to_global"))
    ]
    if not routed:
        return ""
    return (
        f"**Routed every test image to its global model** (FedSM's selector): {'; '.join(routed)}. There its test "
        "scores are its global model's and its personalized models were never used."
    )


@dataclass
class Section:
    """One table of a federation as every output shows it: ``title`` (tables.md's heading), ``short`` (report.html's
    and tables.tex's: ``FED: short``), the table ``(head, rows)``, its ``notes`` (paragraphs, Markdown ``**bold**``;
    tables.md puts them before the table where ``notes_first``, after it otherwise)."""

    federation: str
    title: str
    short: str
    table: tuple[list[str], list[list[str]]]
    notes: list[str] = field(default_factory=list)
    notes_first: bool = False


def sections(bench: BenchSpec, tables: dict, tuning: list[dict]) -> list[Section]:
    """Every table of the bench, per federation in the order the outputs show them."""
    out = []
    for fed, t in tables.items():
        test_notes = [not_converged(t), *filter(None, (plateau_note(t), routing_note(t)))]
        out += [
            Section(fed, "Test (FeTS Table 1 layout)", "test", test_table(t, bench.reference), test_notes),
            Section(
                fed,
                "Per site (FedSM Tables 3-4, Auto-FedAvg Table 2 layout)",
                "per site",
                site_table(t, bench.reference),
            ),
            Section(fed, "Cost (FeTS Table 2 layout)", "cost", cost_table(t)),
        ]
        if t.get("comparisons"):
            out.append(
                Section(fed, "Paired comparisons", "paired comparisons", comparison_table(t), [COMPARISONS], True)
            )
        if t.get("rank_stability"):
            out.append(Section(fed, "Rank stability", "rank stability", rank_table(t), [RANKS], True))
        if any(r["federation"] == fed for r in tuning):
            note = [TUNING_CONVERGED] if _tuning_counted(tuning, fed) else []
            out.append(Section(fed, "Tuning on validation", "tuning on validation", tune_table(tuning, fed), note))
    return out


def markdown(bench: BenchSpec, tables: dict, tuning: list[dict], changes: Sequence[str] = ()) -> str:
    parts = [f"# Bench {bench.name}", "", notes(bench, tables, changes), ""]
    federation = None
    for section in sections(bench, tables, tuning):
        if section.federation != federation:
            federation = section.federation
            parts += [f"## {federation}", ""]
        notes_text = "\n\n".join(section.notes)
        parts += [f"### {section.title}", ""]
        parts += [notes_text, ""] if section.notes_first else []
        parts += [_md_table(*section.table), ""]
        parts += [notes_text, ""] if section.notes and not section.notes_first else []
    return "\n".join(parts) + "\n"


def _html_table(head: list[str], rows: list[list[str]]) -> str:
    return kit.table(
        "<tr>" + "".join(f"<th>{kit.esc(h)}</th>" for h in head) + "</tr>",
        [
            "<tr><th>" + kit.esc(r[0]) + "</th>" + "".join(f"<td>{kit.esc(c)}</td>" for c in r[1:]) + "</tr>"
            for r in rows
        ],
    )


def html_parts(
    bench: BenchSpec,
    tables: dict,
    tuning: list[dict],
    fig_dir: Path,
    changes: Sequence[str] = (),
) -> list[str]:
    """The HTML parts of the bench's ``report.html``, its figures drawn into ``fig_dir``."""
    parts = [
        f"<h1>Bench {kit.esc(bench.name)}</h1>",
        f'<p class="meta">{kit.esc_md(notes(bench, tables, changes))}</p>',
    ]
    for section in sections(bench, tables, tuning):
        fed = section.federation
        note = kit.esc_md(" ".join(section.notes))
        parts.append(kit.section(f"{fed}: {section.short}", _html_table(*section.table), note))
        if section.short == "per site":
            t = tables[fed]
            fig = per_site_bars(
                {n: {s: v["mean"] for s, v in m["sites"].items()} for n, m in t["methods"].items()},
                t["sites"],
                {} if t.get("leave_one_out") else t["methods"][next(iter(t["methods"]))]["train_samples"],
                fig_dir / f"sites_{fed}.png",
                errors={n: {s: v["std"] for s, v in m["sites"].items()} for n, m in t["methods"].items()},
                title=f"{fed}: test Dice per site (mean ± std over seeds)",
            )
            if fig is not None:
                parts.append(f'<img src="figures/{fig.name}" alt="per-site Dice">')
    return parts


TEX_PREAMBLE = (
    "tables.tex of bench {name}: its tables as LaTeX (\\input{{tables.tex}}; needs \\usepackage{{booktabs,graphicx}}), "
    "the same cells as tables.md, rendered from tables.json by `fedseg report` like it. Each caption carries the "
    "table's own notes; the legend that every table shares (what Δ, CI, p, † and ‡ are, what is paired with what) "
    "follows: put it, or a pointer to it, in your paper."
)


def latex(bench: BenchSpec, tables: dict, tuning: list[dict], changes: Sequence[str] = ()) -> str:
    """``tables.tex``: every table of :func:`sections` as a LaTeX float (:mod:`fedseg.presentation.latex`), the
    legend as comments at the top."""
    head = TEX_PREAMBLE.format(name=bench.name) + "\n\n" + notes(bench, tables, changes).replace("**", "")
    parts = [tex_comment(head)]
    for section in sections(bench, tables, tuning):
        short = f"{section.federation}: {section.short}"
        caption = " ".join([f"{short}.", *section.notes])
        label = tex_label("tab", bench.name, section.federation, section.short)
        parts.append(tex_table(*section.table, caption=caption, label=label, short=short))
    return "\n".join(parts)


def write_report(bench: BenchSpec, runs: BenchRuns, out: Path, echo: Echo | None = None) -> dict:
    """Write every output file of a finished bench into ``out``; returns the ``tables.json`` content. A change of
    its tests or comparisons since the tables were last written is recorded first (:func:`record_analysis_changes`,
    its notes to ``echo``)."""
    out = Path(out)
    tables, rows = federation_tables(bench, runs)
    tuning = tuning_rows(bench, runs.tuning, runs.selected, runs.holdouts)
    changes = record_analysis_changes(bench, len(runs.tuning) + len(runs.final), out, echo)
    atomic_write_text(out / "results.csv", csv_text(RESULT_COLUMNS, rows))
    atomic_write_text(out / "tuning.csv", csv_text(tuning_columns(bench), tuning))
    content = {"bench": bench.model_dump(mode="json"), "tuning": tuning, "federations": tables, "scipy": _scipy()}
    if changes:
        content["analysis_changes"] = changes
    _write_tables(bench, content, out)
    return content


def _scipy() -> str:
    """The scipy version that computed the tables' p values (their method is recorded with each test)."""
    import scipy

    return str(scipy.__version__)


ANALYSIS_CHANGES = "analysis-changes.txt"


def record_analysis_changes(bench: BenchSpec, finished: int, out: Path, echo: Echo | None = None) -> list[str]:
    """Every change of the tables' tests or comparisons (``TABLES_ONLY``) made after runs had finished, as lines of
    ``OUT/analysis-changes.txt`` (UTC time, ``key: old -> new``, the ``finished`` runs), this one appended when
    ``bench`` differs from the bench of the tables last written (``tables.json``: what readers last saw; a resume
    refused before, or the same ``--tables-only`` again, adds nothing) or, before any tables, from the bench recorded
    in ``bench.json`` (whose tests and comparisons a resumed bench keeps from before its first finished run:
    ``fedseg.bench.phases.record_bench``), its note to ``echo``. Choosing a test's side or a comparison after seeing
    results is a choice the tables must tell their reader of."""
    path = out / ANALYSIS_CHANGES
    shown = _analysis_shown(out)
    new = bench.model_dump(mode="json")
    changed = [spec_change(k, shown, new) for k in sorted(TABLES_ONLY) if shown and shown.get(k) != new.get(k)]
    if changed and finished:
        lines = [f"{utc_now()} {change} (after {finished} finished runs)" for change in changed]
        with open(path, "a") as f:
            f.write("".join(line + "\n" for line in lines))
        say = echo or (lambda _: None)
        for line in lines:
            say(f"note: changed after results existed, and the tables say so ({path}): {line}")
    return path.read_text().splitlines() if path.is_file() else []


def _analysis_shown(out: Path) -> dict | None:
    """The bench a change of tests or comparisons is measured from (:func:`record_analysis_changes`): that of the
    tables last written, else the one recorded in ``bench.json`` (both as this fedseg records them); None where
    neither can be read."""
    for path, key in ((out / TABLES_JSON, "bench"), (out / BENCH_FILE, None)):
        try:
            content = json.loads(path.read_text())
            spec = as_recorded(content[key] if key else content)
        except (OSError, ValueError, KeyError, TypeError):
            continue
        if isinstance(spec, dict):
            return spec
    return None


TABLES_JSON = "tables.json"


def rewrite_report(out: Path) -> Path:
    """Render a bench's ``tables.md`` and ``report.html`` again from its ``tables.json`` alone (``fedseg report``
    on a bench folder), each family of comparisons Holm-corrected by the current rules
    (:func:`fedseg.bench.tables.correct_tests`; a bench written before them gains ``p_holm``). The runs are not
    read: their folders may be gone. A ValueError naming the file where it cannot be read or lacks a field the
    tables show (then nothing is written)."""
    out = Path(out)
    bench, content = read_tables(out / TABLES_JSON)
    try:
        _write_tables(bench, content, out)
    except (KeyError, TypeError, AttributeError, IndexError) as e:  # a field :func:`check_tables` does not check
        raise ValueError(_not_tables(out / TABLES_JSON, e)) from None
    return out / "report.html"


def _not_tables(path: Path, problem: BaseException | str) -> str:
    """``PATH: not a bench's tables (problem)``, an exception as ``Type: its first line``."""
    if isinstance(problem, BaseException):
        problem = f"{type(problem).__name__}: {(str(problem).splitlines() or [''])[0][:160]}"
    return f"{path}: not a bench's tables ({problem})"


#: the fields of ``tables.json`` the tables index, per federation and per method: ``{key: (JSON type, its name)}``
OBJECT, LIST = (dict, "an object"), (list, "a list")
FEDERATION_FIELDS = {"methods": OBJECT, "regions": LIST, "sites": LIST, "runs": ((int, float), "a number")}
METHOD_FIELDS = {
    "setting": (str, "a string"),
    **dict.fromkeys(("convergence", "regions", "sites", "site_wilcoxon", "cost"), OBJECT),
}


def check_tables(content: dict) -> str | None:
    """The first field of :data:`FEDERATION_FIELDS` / :data:`METHOD_FIELDS` that a federation or method of
    ``tables.json`` ``content`` lacks or holds as another type (``federations.X has no 'regions'``); None when none."""
    feds = content.get("federations")
    if not isinstance(feds, dict):
        return f"federations is {kind_of(feds)}, not an object"
    for name, fed in feds.items():
        if bad := _lacks(fed, FEDERATION_FIELDS, f"federations.{name}"):
            return bad
        for method, entry in fed["methods"].items():
            if bad := _lacks(entry, METHOD_FIELDS, f"federations.{name}.methods.{method}"):
                return bad
    return None


def _lacks(entry: object, fields: dict[str, tuple], where: str) -> str | None:
    if not isinstance(entry, dict):
        return f"{where} is {kind_of(entry)}, not an object"
    for key, (kind, name) in fields.items():
        if key not in entry:
            return f"{where} has no {key!r}"
        if not isinstance(entry[key], kind) or isinstance(entry[key], bool):
            return f"{where}.{key} is {kind_of(entry[key])}, not {name}"
    return None


def read_tables(path: Path) -> tuple[BenchSpec, dict]:
    """A bench's ``tables.json`` (its spec and content), each family of comparisons Holm-corrected by the current
    rules (:func:`fedseg.bench.tables.correct_tests`). A non-finite number reads as it was written: ``null``
    (:func:`fedseg.atomic_files.json_ready`) or, in a file written before, ``NaN``; the tables render either as
    missing. A ValueError naming the file where it cannot be read."""
    try:
        content = json.loads(Path(path).read_text())
        bench = BenchSpec.model_validate(content["bench"])
        if bad := check_tables(content):
            raise ValueError(_not_tables(path, bad))
        for fed in content["federations"].values():
            correct_tests(fed)
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
        raise ValueError(str(e) if str(e).startswith(str(path)) else _not_tables(path, e)) from None
    return bench, content


def _write_tables(bench: BenchSpec, content: dict, out: Path) -> None:
    """``tables.json`` (strict JSON: :func:`fedseg.atomic_files.json_ready`), ``tables.md``, ``tables.tex`` and
    ``report.html`` (+ figures) of ``content`` into ``out``: all rendered (the figures aside,
    :mod:`fedseg.presentation.drafts`) before any is written, so a field the tables cannot show leaves the previous
    files as they were."""
    tables, tuning, changes = content["federations"], content["tuning"], content.get("analysis_changes", [])
    md, tex = markdown(bench, tables, tuning, changes), latex(bench, tables, tuning, changes)
    with figure_draft(out) as fig_dir:
        parts = html_parts(bench, tables, tuning, fig_dir, changes)
        atomic_write_text(out / TABLES_JSON, strict_json_text(content, indent=1))
        atomic_write_text(out / "tables.md", md)
        atomic_write_text(out / "tables.tex", tex)
        kit.write_page(out / "report.html", f"fedseg bench {bench.name}", parts, drawn=fig_dir)
