"""The legend every table of a bench shares (:func:`notes`: what Δ, CI, p, †, ° and ‡ are, what is paired with what),
printed before the tables of tables.md, report.html and tables.tex (as comments), with the bench's own caveats: its
test alternative, HD95 and NSD where tested, data generated per seed, how its grids were tuned (:data:`GRID_NOTE`,
:func:`tuning_note`) and what a tie on validation selects (:data:`TIE_NOTE`), the methods that ran a configuration of
their own (:func:`own_set_note`) or select a round per site (:func:`per_site_note`), and the changes of its tests or
comparisons made after results existed.
"""

from __future__ import annotations

from collections.abc import Sequence

from fedseg.bench.select import selection_ties
from fedseg.bench.spec import BenchSpec
from fedseg.bench.table_rows import has_hd95_tests, has_nsd
from fedseg.evaluate.stats import EXACT_BELOW, PERMUTATION_UP_TO, RESAMPLES

NOTES = (
    "Dice / HD95: mean ± std over the test cases of all folds (each case averaged over the seeds first); client "
    "avg: mean of per-site means, ± std over seeds; per site: the site's mean over its test cases, ± std over "
    "seeds. Δ: mean over cases of (method − reference), paired per case and seed (the same images in every seed: "
    "data.seed), over the cases in the cases paired column. 95% CI: percentile interval of Δ over {resamples} "
    "hierarchical bootstrap samples (sites, then cases within the drawn sites, and seeds, all with replacement), "
    "so it carries case-to-case and run-to-run variance (with fewer than 5 seeds the run-to-run part cannot show "
    "its full size: read the Δ per seed column: s0 is run seed 0's Δ). p: {alternative} paired Wilcoxon "
    "signed-rank test over cases (each case's differences averaged over the seeds; {method}), Holm-adjusted "
    "within its table (the Δ column's comparisons; every cell of the per-site table; the bench's comparisons). °: "
    "too few paired cases for the test ever to give p < 0.05 (n nonzero differences: its smallest p is 2^(1−n) "
    "two-sided, 2^(−n) one-tailed, so fewer than 6 or 5): no evidence either way, and left out of its Holm family "
    "(Tarone 1990), as is a comparison whose differences are all 0 (0 differ: p = 1, nothing to test). † marks a "
    "comparison only where both hold: the CI excludes 0{side} and the adjusted p < 0.05 (a CI of a handful of "
    "cases excludes 0 whenever they differ the same way; the p does not carry the seeds' variance); never with "
    "one seed, whose CI has no run-to-run variance to draw: a difference between two trained models, not yet "
    "between two methods. (seeds disagree): the Δ per seed do not all share Δ's sign (a seed at exactly 0 "
    "included): the p takes each image as the unit and cannot see that the training runs disagree (a shift in one "
    "seed moves almost every image the same way), so a small p there is no evidence across runs: read the CI (the "
    "Δ per seed of the other metrics are in tables.json). (mean and ranks disagree): the signed-rank statistic "
    "favours the other side than Δ (better on most images, much worse on a few, or the reverse): no †; the p says "
    "only that the two differ. cases paired: n, and (k differ) where some differences are 0 (the p ranks those "
    "k). ‡: Δ, CI and p pair fewer cases than the Dice columns average (a site failed), or the method and the "
    "reference finished different runs (a seed or fold missing): the columns describe other cases or runs than Δ "
    "(in the per-site table: the site's test paired fewer cases than its two cells average).{tuned} Differences "
    "of Dice (as of any score in [0, 1]) to 4 decimals, of HD95 to 2; a nonzero one that would round to ±0.0000 is "
    "shown to one significant digit (+3e-05), so a bound printed as 0 is exactly 0."
)

GRID_NOTE = (
    " Settings chosen on validation only (see the tuning table); (grid edge): the selected value is the smallest or "
    "largest of its grid, so the best one may lie outside it."
)

TIE_NOTE = (
    " (tie): another setting of the grid had the selected one's validation score exactly (the tuning table names "
    "them): the selection takes the first of the tied settings in the order the bench lists its grid (the first "
    "key varying slowest; for values listed in increasing order, the smallest), a fixed rule that keeps the choice "
    "reproducible and away from the test scores; validation did not prefer it, so a tie's (grid edge) is flagged "
    "only for a key every tied setting shares (one tied from inside the grid says the edge was not better)."
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


def methods_recorded(tables: dict) -> bool:
    """Whether the tables' pooled Dice tests record their Wilcoxon ``p_method`` (``fedseg.evaluate.stats.
    wilcoxon_method``): tables written before it hold p values of scipy's ``method="auto"``, whose rule depends on
    the scipy version."""
    tests = [s["wilcoxon"] for t in tables.values() for s in t["methods"].values() if s.get("wilcoxon")]
    return all("p_method" in test for test in tests)


def notes(bench: BenchSpec, tables: dict, changes: Sequence[str] = (), tuning: Sequence[dict] = ()) -> str:
    """The tables' legend, with the bench's test alternative (NSD's only where a federation has NSD: an old bench
    renders as it did), the ``changes`` of its tests or comparisons made after runs had finished, how settings are
    chosen on validation (:data:`GRID_NOTE`, only where a method has a grid) and what a tie selects
    (:data:`TIE_NOTE`) where a selection of its ``tuning`` rows was one (``fedseg.bench.select.selection_ties``),
    the methods that ran a configuration of their own (:func:`own_set_note`) and those whose sites select their own
    round (:func:`per_site_note`)."""
    alternative = bench.tests.alternative
    side = {"two-sided": "", "greater": " (lies above 0: the tests are one-tailed, method > reference)"}.get(
        alternative, " (lies below 0: the tests are one-tailed, method < reference)"
    )
    one = "one-tailed (" + alternative + ")" if alternative != "two-sided" else "two-sided"
    method = WILCOXON_AUTO
    if methods_recorded(tables):
        method = WILCOXON_METHOD.format(exact_below=EXACT_BELOW, permutation_up_to=PERMUTATION_UP_TO)
    tie = TIE_NOTE if selection_ties(list(tuning)) else ""
    tuned = GRID_NOTE + tie if any(m.grid for m in bench.methods) else ""
    text = NOTES.format(resamples=RESAMPLES, side=side, alternative=one, method=method, tuned=tuned)
    hd95, nsd = any(has_hd95_tests(t) for t in tables.values()), any(has_nsd(t) for t in tables.values())
    text += HD95_NOTE.format(side=HD95_SIDE[alternative]) if hd95 else ""
    text += NSD_NOTE if nsd else ""
    text += OWN_PAIRS if hd95 or nsd else ""
    text += PER_SEED_DATA if bench.data_seed == "per-seed" else ""
    text += tuning_note(bench)
    text += own_set_note(tables)
    text += per_site_note(bench, tables)
    text += provenance_note(tables)
    if changes:
        text += " **Changed after results existed** (" + "; ".join(changes) + "): the p-values and † follow the change."
    return text


def own_set_note(tables: dict) -> str:
    """ "" unless the methods' own ``set:`` overrides (tables.json ``method_set`` of each method,
    ``fedseg.bench.tables.federation_tables``) differ between methods: then one sentence naming each method's (a
    ``model.norm=batch`` of FedBN's entry alone makes FedBN-on-BatchNorm the row next to FedAvg-on-InstanceNorm,
    which the setting column does not show). Tables written before it was recorded render as they did."""
    recorded: dict[str, list[str]] = {}
    for t in tables.values():
        for name, stats in t["methods"].items():
            if isinstance(stats.get("method_set"), list):
                recorded.setdefault(name, [str(a) for a in stats["method_set"]])
    if len({tuple(s) for s in recorded.values()}) < 2:
        return ""
    own = "; ".join(f"{name}: {', '.join(s)}" for name, s in recorded.items() if s)
    others = "; the others run the bench's configuration alone" if any(not s for s in recorded.values()) else ""
    return (
        f" **Methods with their own configuration** (set: in the bench file, on top of the bench's and the "
        f"federation's): {own}{others}, so a difference between methods that ran different configurations is not "
        "their algorithms' alone."
    )


def per_site_methods(bench: BenchSpec, tables: dict) -> dict[str, str]:
    """``{method: kind}`` of the methods of ``tables`` whose scored algorithm tests each site with its own model (a
    clustered method: its cluster's) from the round where that site scored best on its own validation split (the
    server's ``SELECTS_PER_SITE``: local, fedbn, fedper, lg-fedavg, ditto, finetune, the clustered methods; not
    FedSM, whose run selects one round for its super model), in a federation whose sites are tested (a leave-one-out
    federation scores a model on a site it never saw, no site's own); an algorithm no longer known counts as not."""
    from fedseg.algorithms import get_algorithm

    names = [n for t in tables.values() if not t.get("leave_one_out") for n in t["methods"]]
    out: dict[str, str] = {}
    for name in dict.fromkeys(names):
        if name not in bench.method_names:
            continue
        try:
            spec = get_algorithm(bench.method(name).scored)
        except KeyError:
            continue
        if getattr(spec.server, "SELECTS_PER_SITE", False):
            out[name] = spec.kind
    return out


def per_site_note(bench: BenchSpec, tables: dict) -> str:
    """ "" unless a method of the tables selects a round per site (:func:`per_site_methods`): then one sentence
    naming them, against the one round per run of the other methods, and that the paired tests still pair the same
    test cases."""
    kinds = per_site_methods(bench, tables)
    if not kinds:
        return ""
    cluster = " (a clustered method: its cluster's)" if "clustered" in kinds.values() else ""
    others = {n for t in tables.values() for n in t["methods"]} - set(kinds)
    contrast = (
        ", where each run of the other methods tests every site at one round, that of the best mean validation Dice "
        "over the sites"
        if others
        else ""
    )
    return (
        f" **Per-site selection** ({', '.join(kinds)}): each site is tested with its own model{cluster} from the "
        f"round where it scored best on its own validation split{contrast}; Δ, CI and p still pair the same test "
        "cases."
    )


def provenance_note(tables: dict) -> str:
    """What trained the runs (tables.json ``provenance`` of each federation, ``fedseg.bench.tables.runs_provenance``):
    fedseg's version and commit (and whether a checkout had uncommitted changes), torch, MONAI, Python and the
    devices; "" for tables written before it was recorded (they render as they did)."""
    recorded = [t["provenance"] for t in tables.values() if t.get("provenance")]
    if not recorded:
        return ""

    def values(key: str) -> str:
        found = sorted({v for p in recorded for v in p.get(key, [])})
        return " / ".join(v[:12] if key == "commit" else v for v in found) or "?"

    dirty = {d for p in recorded for d in p.get("dirty", [])}
    state = (
        ", with uncommitted changes"
        if dirty == {True}
        else (", some runs with uncommitted changes" if True in dirty else "")
    )
    return (
        f" Trained with fedseg {values('fedseg')} (commit {values('commit')}{state}), torch {values('torch')}, MONAI "
        f"{values('monai')}, Python {values('python')} on {values('device')}; every run's summary.json says its own."
    )


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
