"""A bench's tables as rows of text, per federation (the papers' layouts), each with its own notes (the legend they
share: :mod:`fedseg.bench.legend`; rendered as tables.md, tables.tex and report.html: :mod:`fedseg.bench.render`).

Every table of methods or settings (all but rank stability) shows, next to its Dice, the rounds each trained (mean ±
std over runs) and its SGD steps (Eq. 34, mean over runs): a budget rule of ``rounds`` with a plateau stop leaves the
methods' steps unequal, and a reader should see by how much.

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
  with ``tune.per_fold``, per fold (a ``fold`` column, in ``tuning.csv`` too), each fold's selection marked. A
  selection that is a tie (another setting has its validation score exactly) says so, naming the tied settings, and
  the test table marks its setting ``(tie)``; a tie flags a grid edge only for a key every tied setting shares
  (``fedseg.bench.select.selection_ties``, found from the tuning rows, so a ``tables.json`` written before renders
  its ties so too).

Differences of fractions (Dice, NSD) print to 4 decimals, HD95's to its own 2, always signed, by
:func:`fedseg.evaluate.stats.signed_text` (a nonzero one that would print as ±0.0000 gets one significant digit).
"""

from __future__ import annotations

import math

from fedseg.bench.select import method_edges, selection_ties, untied_edges
from fedseg.evaluate.metric_info import DICE, HD95, NSD, scoring_text
from fedseg.evaluate.stats import (
    DIFF_DIGITS,
    caution_text,
    ci_text,
    p_value_text,
    signed_text,
    significant_over_seeds,
)
from fedseg.presentation import kit
from fedseg.run.stopping import NEVER_IMPROVED_WHY, PLATEAU

EDGE = " (grid edge)"  # after a selected setting with a value at the edge of its grid
TIE = " (tie)"  # after a selected setting whose validation score another setting of its grid had exactly


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


def test_table(fed: dict, reference: str, tuning: list[dict] | None = None) -> tuple[list[str], list[list[str]]]:
    """The test table of ``fed`` (a federation of ``tables.json``); ``tuning``: its tuning rows, where a method's
    selection may have been a tie (:func:`setting_cell`)."""
    unit = fed.get("hd95_unit") or ""
    nsd, hd95 = has_nsd(fed), has_hd95_tests(fed)
    head = ["method", "setting", "runs", *BUDGET_HEAD, DICE.label, *fed["regions"], HD95.title(unit), "client avg"]
    head += dice_test_head(reference)
    if hd95:
        head += surface_test_head("HD95", reference)
    if nsd:
        head += [NSD.title(unit, fed.get("nsd_tolerance")), *surface_test_head("NSD", reference)]
    head.append("converged")
    rows = []
    ref_runs = (fed["methods"].get(reference) or {}).get("convergence", {}).get("runs")
    for name, s in fed["methods"].items():
        conv = s["convergence"]
        runs = (conv.get("runs"), ref_runs)  # a seed or fold one of the two lacks: the columns average other runs
        row = [
            name,
            setting_cell(name, s, tuning or []),
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


def dice_test_head(reference: str) -> list[str]:
    """The test table's columns of the Dice comparison with ``reference``: Δ, cases paired, CI, Δ per seed, p."""
    return [f"Δ vs {reference}", PAIRED, "95% CI", "Δ per seed", "p (Holm)"]


def surface_test_head(metric: str, reference: str) -> list[str]:
    """The test table's columns of ``metric``'s (``HD95``, ``NSD``) comparison with ``reference``: Δ, CI, p."""
    return [f"{metric} Δ vs {reference}", f"{metric} 95% CI", f"{metric} p (Holm)"]


def test_table_parts(
    table: tuple[list[str], list[list[str]]], reference: str
) -> list[tuple[str, tuple[list[str], list[list[str]]]]]:
    """:func:`test_table` cut by columns into the parts tables.tex prints as tables of their own (its 16 to 23 columns
    shrank to a fifth of a page's width): ``scores`` (the scores, budgets and convergence), ``paired`` (the Dice
    comparison with ``reference``) and, where tested, ``paired surface`` (HD95's and NSD's); each part opens with the
    method column. Every column of the table is in exactly one part (the method column in each)."""
    head, rows = table
    dice = set(dice_test_head(reference))
    surface = {*surface_test_head("HD95", reference), *surface_test_head("NSD", reference)}
    groups = {
        "scores": [i for i, h in enumerate(head) if h not in dice | surface],
        "paired": [0, *(i for i, h in enumerate(head) if h in dice)],
        "paired surface": [0, *(i for i, h in enumerate(head) if h in surface)],
    }
    return [
        (key, ([head[i] for i in columns], [[row[i] for i in columns] for row in rows]))
        for key, columns in groups.items()
        if len(columns) > 1
    ]


def setting_cell(name: str, s: dict, tuning: list[dict]) -> str:
    """The test table's setting of method ``name`` (``s``: its tables.json entry): the label, :data:`EDGE` where a
    selected value lies at its grid's edge, :data:`TIE` where its selection (any fold's) was a tie, an edge then
    only for a key every tied setting shares (``fedseg.bench.select.method_edges``; ``tuning``: the federation's
    tuning rows)."""
    edges, tied = method_edges(list(s.get("at_edge") or []), [r for r in tuning if r["method"] == name])
    return s["setting"] + (EDGE if edges else "") + (TIE if tied else "")


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
    """Each method's Dice per site (the site's mean over its test cases, mean ± std over seeds), with † / ° of its
    comparison with ``reference`` on that site's cases, and ‡ where that comparison paired fewer cases than the two
    cells average (``site_cases``; tables written before it was recorded: no ‡, the seeds were compared)."""
    head = ["method", *BUDGET_HEAD, *fed["sites"], "client avg", "local avg", "local gen"]
    rows = []
    ref = fed["methods"].get(reference) or {}
    for name, s in fed["methods"].items():
        cells = []
        for site in fed["sites"]:
            test = s["site_wilcoxon"].get(site)
            own = [(m.get("site_cases") or {}).get(site, 0) for m in (s, ref)]
            fewer = test is not None and any(test["n"] < n for n in own)
            cells.append(ms(s["sites"].get(site)) + mark(test) + (FEWER_CASES if fewer else ""))
        rows.append([name, *_method_budget(s), *cells, ms(s["client_avg"]), ms(s["local_avg"]), ms(s["local_gen"])])
    return head, rows


LEARNED_WEIGHTS = (
    "α_k: the aggregation weight each site learned (Auto-FedAvg; the mean over layer groups for the layer-wise "
    "variant) at each run's last learning round, mean ± std over the runs (folds × seeds); the weights of one run sum "
    "to 1. FedAvg's weights are n_k / N (training cases)."
)


def weights_table(fed: dict) -> tuple[list[str], list[list[str]]]:
    """The aggregation weights that methods learned (``learned_weights``), one row per such method, a column per
    site (mean ± std over runs)."""
    head = ["method", *fed["sites"]]
    rows = [
        [name, *(ms(s["learned_weights"].get(site)) for site in fed["sites"])]
        for name, s in fed["methods"].items()
        if s.get("learned_weights")
    ]
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
    counted = tuning_counted(rows, federation)
    rows = [r for r in rows if r["federation"] == federation]
    ties = selection_ties(rows)
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
            selected_cell(r, ties.get((r["federation"], r["method"], r.get("fold")))) if r["selected"] else "",
        ]
        for r in rows
    ]
    return head, body


def selected_cell(row: dict, tied: list[dict] | None) -> str:
    """The tuning table's mark of a selected setting: ✓, `` (tie with lr=0.01, lr=0.03)`` where those settings had
    its validation score exactly (``tied``, ``fedseg.bench.select.selection_ties``: the selection took the first in
    grid order), and the grid keys at an edge (:data:`EDGE`: ``train.lr (high)``), of a tie only those every tied
    setting shares (``fedseg.bench.select.untied_edges``)."""
    edges = [e for e in (row.get("at_edge") or "").split("; ") if e]
    tie = ""
    if tied:
        edges = untied_edges(edges, tied)
        tie = f"{TIE[:-1]} with {', '.join(r['setting'] for r in tied[1:])})"
    return "✓" + tie + (f"{EDGE}: {'; '.join(edges)}" if edges else "")


TUNING_CONVERGED = (
    "converged: the setting's tuning runs that selected a round before the last 10% (at least 2) of their rounds or "
    "whose validation plateaued (as the test table counts them); a setting whose runs may not have converged was "
    "compared on validation at a budget that may have cut it short."
)


def tuning_counted(rows: list[dict], federation: str) -> bool:
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


def fold_cell(row: dict) -> str:
    """A tuning row's fold as the tuning table shows it: its number, and a leave-one-out fold's held-out site."""
    fold = str(row.get("fold", ""))
    return f"{fold} (held out: {row['held_out']})" if row.get("held_out") else fold


UNEQUAL_STEPS = 1.25  # a method's SGD steps beyond this factor of the reference's (either way) are named


def budget_note(fed: dict, reference: str, rule: str) -> str:
    """ "" unless the bench capped rounds (``budget.rule: rounds``) and some method's mean SGD steps (Eq. 34) lie
    beyond :data:`UNEQUAL_STEPS` times the reference's: then the sentence naming them with the factor, since their
    Δ compares training budgets as well as methods (FedSM's three model updates per round, Ditto's two...)."""
    steps = {name: s.get("cost", {}).get("sgd_steps") for name, s in fed["methods"].items()}
    ref = steps.get(reference)
    if rule != "rounds" or not _finite(ref) or not ref:
        return ""
    far = [
        f"{name} ×{value / ref:.1f}"
        for name, value in steps.items()
        if name != reference and _finite(value) and not 1 / UNEQUAL_STEPS <= value / ref <= UNEQUAL_STEPS
    ]
    if not far:
        return ""
    return (
        f"**Unequal training** (budget.rule: rounds): SGD steps against {reference}'s: {', '.join(far)}. A Δ "
        "compares training budgets as well as methods; budget.rule: sgd_steps stops every method at the reference's "
        "steps (FeTS Sec. 4.4.7)."
    )


UNSEEN_DICE_ONLY = (
    "**Leave-one-out**: each run is scored on every case of its held-out site by Dice only (the study's unseen-site "
    "scoring, unseen.json: FedSM's routed model over its gamma curve, a global model as it is), so HD95 and NSD "
    "stay empty (–) here."
)


def unseen_note(fed: dict) -> str:
    """The test table's note on a leave-one-out federation (Dice only, :data:`UNSEEN_DICE_ONLY`); "" otherwise."""
    return UNSEEN_DICE_ONLY if fed.get("leave_one_out") else ""


def scoring_note(fed: dict) -> str:
    """What the federation's runs scored (``score_on``, ``score_grid``; "" for tables written before they were
    recorded), and a warning where its runs scored differently."""
    mixed = [key for key in ("score_on", "score_grid") if fed.get(key) == "mixed"]
    if mixed:
        return (
            f"**Scored differently** ({', '.join('eval.' + key for key in mixed)} differs between the runs): their "
            "scores are not comparable; rerun the bench with one setting."
        )
    return scoring_text(fed.get("score_on"), fed.get("score_grid")).strip()


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
