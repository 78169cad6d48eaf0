"""The verdict: the report's answer to its reader's first question, "which method won, and is it real?".

:func:`verdict` reads a run's files (:class:`~fedseg.presentation.kit.RunFiles`) and names the best method on the
run's primary metric, **test Dice, Client Avg** (summary.json ``dice.client_avg``: the figure of the main table),
among the federated methods (the rows that compete for bold; baselines such as Centralized and Local are
references, not contenders), and compares it with the runner-up and with FedAvg, and, as references that rank
nothing, with each baseline of the run (does federating beat training alone, Local; how far is it from pooling the
data, Centralized).

What is paired with what: a run has one seed, so the comparison is over **test cases**. Each test case (site, case
id) is scored by both methods' own models (a shared model, or the site's own model for personalized methods;
:func:`fedseg.report.own_scores.own_model_filter`), a case's score being its Dice averaged over regions; the
difference best − other of every case is tested with :func:`fedseg.evaluate.stats.compare` (``site_means``): a
95% interval of the number the ranking is on, the Client Avg difference (the mean over sites of each site's mean
paired difference), from the hierarchical bootstrap (sites resampled, then cases within each; the seed-to-seed
variance is not in it, having one seed, which the verdict says beside every "beyond noise"), and a Wilcoxon
signed-rank test over the cases (pooled: does the per-case difference lean to one side of 0). A difference is
*beyond noise* when it is :func:`fedseg.evaluate.stats.significant`: the interval excludes 0 and the test's p,
Holm-adjusted over the best's comparisons with every other contender (the comparisons with the baselines: a family
of their own), is below 0.05, the two pointing the same way; else *within noise*. Where the Client Avg difference
and the signed-rank test point opposite ways, or the paired cases' Client Avg points away from the table's (a
method that left cases unscored), the verdict says so instead of ranking one above the other. Two methods are
*tied* only when their Client Avg are equal; scores that merely print alike are two numbers, and their comparison's
CI says whether they differ. The best is chosen on these same test scores, which the terminal says as the report
does (:data:`CHOSEN_AFTER`).

Also: which methods may not have converged (summary.json ``convergence``), and routing notes of a method family
whose test images all went to one model (FedSM: every image to the global model). The HTML form
(:func:`verdict_html`) opens the report; the plain lines (:func:`verdict_lines`, :func:`summary_lines`) end the
terminal summary of ``fedseg run`` (:func:`terminal_lines`: wrapped, each comparison as its result over its test's
numbers).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fedseg.evaluate.stats import (
    LEVEL,
    RESAMPLES,
    SIGNIFICANCE,
    adjusted_p,
    ci_statistic,
    compare,
    correct_family,
    p_text,
    ranks_disagree,
    signed_text,
    significant,
)
from fedseg.evaluate.tables import case_means, own_site_model
from fedseg.presentation.kit import RunFiles, esc, fmt, load_run, num, routed_to_global
from fedseg.report import persite
from fedseg.report.methods import algorithm_order, display_name, is_federated
from fedseg.report.own_scores import own_model_filter
from fedseg.run.stopping import NEVER_IMPROVED_WHY, recorded_late_sites, recorded_not_converged

__all__ = [
    "Difference",
    "Verdict",
    "routing_notes",
    "summary_lines",
    "terminal_lines",
    "unconverged_methods",
    "verdict",
    "verdict_html",
    "verdict_lines",
]

METRIC = "dice"
METRIC_TEXT = "test Dice, Client Avg"
DIGITS = 4  # as the main table
FEDAVG = "fedavg"


@dataclass(frozen=True)
class Difference:
    """The best method against ``other``: ``table_diff`` = best − other on the table's Client Avg; ``test`` =
    :func:`fedseg.evaluate.stats.compare` of the per-case scores (best − other, ``site_means``: its CI of the
    Client Avg difference), None without ``results.csv``."""

    other: str
    table_diff: float
    test: dict[str, Any] | None

    @property
    def identical(self) -> bool:
        """Every paired case scored the same (e.g. two methods that tested the same model)."""
        t = self.test
        return t is not None and t["n"] > 0 and t["ci_low"] == 0 == t["ci_high"] and t["mean_diff"] == 0

    @property
    def within_noise(self) -> bool | None:
        """Not :func:`~fedseg.evaluate.stats.significant` (the 95% CI includes 0 or the adjusted p ≥ 0.05); None
        when there is no per-case test."""
        t = self.test
        if t is None or not t["n"] or math.isnan(t["p"]):
            return None
        return not significant(t) and not self.split

    @property
    def split(self) -> bool:
        """The CI excludes 0 and the adjusted p < 0.05, but the Client Avg difference and the signed-rank test point
        opposite ways (:func:`~fedseg.evaluate.stats.ranks_disagree`: better on most cases, much worse on a few):
        neither wins."""
        t = self.test
        if t is None or not t["n"] or not t.get("ci_excludes_0"):
            return False
        p = adjusted_p(t)
        return math.isfinite(p) and p < SIGNIFICANCE and ranks_disagree(t)

    @property
    def disagrees(self) -> bool:
        """The paired cases find ``other`` better beyond noise although it ranks below on the table's Client Avg (which
        also holds the cases only one of the two scored)."""
        return self.within_noise is False and self.test is not None and ci_statistic(self.test) * self.table_diff < 0


@dataclass(frozen=True)
class Verdict:
    """The best federated method of a run on test Dice (Client Avg) and its differences from the others."""

    best: str
    score: float
    ranked: list[tuple[str, float]]  # contenders by score, best first (table order among equal scores)
    ties: list[str]  # contenders whose score equals the best's (exactly: not at the table's precision)
    differences: dict[str, Difference]  # best against every other contender
    runner_up: str | None  # the first contender below the best's score
    fedavg: str | None  # FedAvg when it is a contender and neither the best nor tied with it
    unconverged: list[str]  # display names (with "k of n sites" for per-site selection)
    baselines: list[str]  # display names of the methods not ranked
    labels: dict[str, str] = field(default_factory=dict)
    never_improved: list[str] = field(default_factory=list)  # display names (never_improved_methods)
    references: dict[str, Difference] = field(default_factory=dict)  # best against each baseline (Local first)
    per_site: dict[str, bool] = field(default_factory=dict)  # whose own models are per-site (each on its own site)

    def label(self, name: str) -> str:
        return self.labels.get(name, name)

    @property
    def shown(self) -> list[Difference]:
        """The differences :func:`verdict_lines` prints one by one, in its order: the runner-up, FedAvg, each tie
        whose cases differ, each baseline."""
        names = [self.runner_up, self.fedavg if self.fedavg != self.runner_up else None]
        names += [n for n in self.ties if not self.differences[n].identical]
        return [self.differences[n] for n in names if n] + list(self.references.values())

    @property
    def tested(self) -> bool:
        """Whether a printed difference has a CI and a p (what the note on how they were tested is about)."""
        return any(d.test is not None and d.test["n"] and not d.identical for d in self.shown)

    @property
    def within_noise(self) -> list[str]:
        return [n for n, d in self.differences.items() if n not in self.ties and d.within_noise]

    @property
    def clear(self) -> list[str]:
        return [
            n
            for n, d in self.differences.items()
            if n not in self.ties and d.within_noise is False and not d.disagrees and not d.split
        ]

    @property
    def split(self) -> list[str]:
        return [n for n, d in self.differences.items() if n not in self.ties and d.split]

    @property
    def disagreeing(self) -> list[str]:
        return [n for n, d in self.differences.items() if n not in self.ties and d.disagrees]


# --------------------------------------------------------------------------- convergence
def unconverged_methods(run: RunFiles) -> tuple[list[str], bool]:
    """Display names of the methods that may not have converged (``fedseg.run.stopping.recorded_not_converged``, the
    bench's and the model card's rule: the round selected on validation lies in the last 10% (at least 2) of the
    rounds trained and validation had not plateaued; a method that selects per site: at least half its sites
    selected a round in that late window, named with "k of n sites"), and whether one of them selects per site. A
    method whose validation never improved is said by :func:`never_improved_methods` instead. A run of one round is
    one of them (its only round is its last: nothing says it converged, as its summary.json and model card say
    too)."""
    late, per_site = [], False
    for a, e in run.algorithms.items():
        if not e.get("rounds") or not recorded_not_converged(e):
            continue
        if (e.get("convergence") or {}).get("improved") is False:
            continue  # said by never_improved_methods
        if persite.selected_rounds(e):
            k, n = recorded_late_sites(e)
            late.append(f"{run.label(a)} ({k} of {n} sites)")
            per_site = True
        else:
            late.append(run.label(a))
    return late, per_site


def never_improved_methods(run: RunFiles) -> list[str]:
    """Display names of the methods whose validation Dice never rose more than ``fl.stop.min_delta`` above its first
    validated round (summary.json ``convergence.improved`` False, ``fedseg.run.stopping.improved``): a flat curve
    that is no plateau (an untrained model scores the same every round)."""
    return [run.label(a) for a, e in run.algorithms.items() if (e.get("convergence") or {}).get("improved") is False]


# --------------------------------------------------------------------------- the verdict
def _cases(run: RunFiles, name: str) -> dict:
    return case_means(run.results, name, METRIC, own_model_filter(run, name)) if run.results else {}


def verdict(run: RunFiles, resamples: int = RESAMPLES) -> Verdict | None:
    """The verdict of ``run`` (its ``names`` give the display names); None when no method has a test Dice
    Client Avg. Contenders: the federated methods, or every method when the run has none."""
    order = algorithm_order(run.summary)
    labels = {a: run.label(a) for a in order}
    scores = {a: num((run.algorithms[a].get(METRIC) or {}).get("client_avg")) for a in order}
    scored = [a for a in order if not math.isnan(scores[a])]
    if not scored:
        return None
    contenders = [a for a in scored if is_federated(a, run.algorithms[a])] or scored
    ranked = sorted(((a, scores[a]) for a in contenders), key=lambda x: -x[1])  # stable: table order on ties
    best, top = ranked[0]
    ties = [a for a, v in ranked[1:] if v == top]  # equal scores, not scores that print alike
    best_cases = _cases(run, best)

    def against(a: str) -> Difference:
        other = _cases(run, a)
        test = (
            compare({0: best_cases}, {0: other}, resamples=resamples, site_means=True) if best_cases and other else None
        )
        return Difference(a, top - scores[a], test)

    differences = {a: against(a) for a, _ in ranked[1:]}
    correct_family(d.test for d in differences.values())
    runner_up = next((a for a, _ in ranked[1:] if a not in ties), None)
    fedavg = next((a for a in contenders if a.lower() == FEDAVG and a != best and a not in ties), None)
    late, _ = unconverged_methods(run)
    # the baselines: methods not federated (a federated one left unranked has no score, and is no baseline)
    others = [a for a in order if a not in contenders and not is_federated(a, run.algorithms[a])]
    baselines = [labels[a] for a in others]
    # the reader's first question: does federating beat training alone (Local), how far is it from pooling the data
    references = {a: against(a) for a in sorted(others, key=lambda a: a.lower() != "local") if a in scored}
    correct_family(d.test for d in references.values())  # a family of their own: they rank nothing
    per_site = {a: own_model_filter(run, a) is own_site_model for a in (best, *references)} if run.results else {}
    return Verdict(
        best,
        top,
        ranked,
        ties,
        differences,
        runner_up,
        fedavg,
        late,
        baselines,
        labels,
        never_improved_methods(run),
        references=references,
        per_site=per_site,
    )


def _signed(x: float) -> str:
    """``x`` with its sign (``signed_text``: a nonzero one that would print as ±0.0000 to one significant digit, so a
    CI bound always shows its side of 0), a minus sign for ``-``; ``–`` for NaN."""
    return "–" if math.isnan(x) else signed_text(x, DIGITS).replace("-", "−")


ONE_SEED = "one seed: the CI holds no training noise, so two trained models differ, not yet two methods"


def _test_parts(d: Difference) -> tuple[str, str | None]:
    """The test of ``d`` in two parts: its numbers (``95% CI [−0.0010, +0.0041], per-case Wilcoxon p = 0.31 (113
    cases)``: the CI of the Client Avg difference, the test over the cases) and what they find (``within noise``; a
    "beyond noise" of one seed says in the same sentence what its CI leaves out), None where there is nothing to find
    (no per-case scores, identical scores: the numbers say it)."""
    t = d.test
    if t is None or not t["n"]:
        return "no per-case scores (results.csv) to test it", None
    if d.identical:
        return f"identical scores on all {t['n']} test cases", None
    ci = f"{round(100 * t['ci_level'])}% CI [{_signed(t['ci_low'])}, {_signed(t['ci_high'])}]"
    paired = ci_statistic(t)
    if not math.isclose(paired, d.table_diff, abs_tol=1e-9):  # the table's also holds cases only one of them scored
        ci = f"Client Avg of the {t['n']} cases both scored {_signed(paired)}, {ci}"
    p = f"per-case Wilcoxon p = {p_text(adjusted_p(t))}"
    p += f" (Holm, {t['family']} comparisons)" if t.get("family", 1) > 1 else ""
    cases = f"{t['n']} cases" + (f", {t['n_nonzero']} differ" if t.get("n_nonzero", t["n"]) < t["n"] else "")
    one_seed = f" ({ONE_SEED})" if t.get("seeds", 1) < 2 else ""
    call = "within noise" if d.within_noise else f"beyond noise across the test cases{one_seed}"
    if d.split:
        call = (
            "Client Avg and the per-case signed-rank test point opposite ways (mean and ranks disagree): neither wins"
        )
    elif d.disagrees:
        call = (
            "the paired test cases point the other way, beyond noise (the table's Client Avg also holds cases only one "
            f"of the two scored{'; ' + ONE_SEED if one_seed else ''})"
        )
    return f"{ci}, {p} ({cases})", call


class Compared(str):
    """A comparison's sentence, as the report and :func:`verdict_lines` give it, that also knows its two-line form
    for the terminal (:func:`terminal_lines`): ``result``, the comparison and what its test finds, and ``details``,
    the test's numbers. One sentence with the difference, its CI, the test and the finding runs to some 250
    characters, which a terminal shows as a block in which the finding (``within noise``) comes last; the two lines
    put it first. A ``str``, so every other use of the verdict's lines (the HTML, the tests) reads the sentence."""

    result: str
    details: str

    def __new__(cls, text: str, result: str, details: str) -> Compared:
        said = super().__new__(cls, text)
        said.result, said.details = result, details
        return said


def _compared(head: str, d: Difference, table: bool = True) -> Compared:
    """The sentence ``{head}: Client Avg … (site means averaged), {test}.`` (without the Client Avg unless
    ``table``), with its terminal form: ``{head}: Client Avg … (site means averaged): {finding}.`` over the test's
    numbers."""
    numbers, call = _test_parts(d)
    clause = f"{numbers}: {call}" if call else numbers
    diff = f"Client Avg {_signed(d.table_diff)} (site means averaged)"
    text = f"{head}: {diff}, {clause}." if table else f"{head}: {clause}."
    if call is None:
        return Compared(text, f"{head}: {diff}." if table else f"{head}:", f"{numbers}.")
    result = f"{head}: {diff}: {call}." if table else f"{head}: {call}."
    return Compared(text, result, f"{numbers}.")


def _against(v: Verdict, name: str, role: str) -> str:
    score = next(s for a, s in v.ranked if a == name)
    return _compared(f"Over {role}{v.label(name)} ({fmt(score, DIGITS)})", v.differences[name])


def _tied(v: Verdict, name: str) -> str:
    return _compared(f"Tied on Client Avg with {v.label(name)}, not case by case", v.differences[name], table=False)


def _reference(v: Verdict, name: str, score: float) -> str:
    """``FedAvg − Local (baseline, 0.7966; Local: each site's own model): Client Avg +0.0575 …``: a reference line,
    no rank; what is paired with what said where a side's own models are per-site."""
    d = v.references[name]
    own = [
        f"{v.label(a)}: each site's own model on that site's cases" for a in (v.best, name) if v.per_site.get(a, False)
    ]
    head = f"{v.label(v.best)} − {v.label(name)} (baseline, {fmt(score, DIGITS)}{'; ' if own else ''}{'; '.join(own)})"
    return _compared(head, d)


def _listed(v: Verdict, names: list[str], with_diff: bool = False) -> str:
    return ", ".join(
        f"{v.label(n)} ({_signed(-v.differences[n].table_diff)})" if with_diff else v.label(n) for n in names
    )


def verdict_lines(v: Verdict, notes: list[str] | None = None) -> list[str]:
    """The verdict as plain sentences, the headline first (the terminal's form; :func:`verdict_html` the page's)."""
    head = f"Best on {METRIC_TEXT}: {v.label(v.best)} at {fmt(v.score, DIGITS)}"
    if v.ties:
        same = [n for n in v.ties if v.differences[n].identical]
        head += f", tied with {_listed(v, v.ties)}" + (
            f" ({'identical' if len(same) == len(v.ties) else _listed(v, same) + ': identical'} scores on every "
            "test case)"
            if same
            else ""
        )
    if len(v.ranked) == 1:
        head += " (the only method ranked)"
    lines = [head + "."]
    if v.runner_up:
        lines.append(_against(v, v.runner_up, "the runner-up "))
    if v.fedavg and v.fedavg != v.runner_up:
        lines.append(_against(v, v.fedavg, ""))
    lines += [_tied(v, n) for n in v.ties if not v.differences[n].identical]
    noise, clear, disagreeing = v.within_noise, v.clear, v.disagreeing
    if noise:
        lines.append(
            f"Within noise of the best (CI includes 0 or Holm-adjusted p ≥ {SIGNIFICANCE:g}): {_listed(v, noise)}."
        )
    if clear:
        lines.append(
            f"Below the best beyond noise (Client Avg differences): {_listed(v, clear, with_diff=True)} (these "
            "trained models, one seed: `fedseg bench` with several seeds compares the methods)."
        )
    if v.split:
        lines.append(
            f"Mean and ranks disagree with the best: {_listed(v, v.split)} (the Client Avg difference and the "
            "per-case signed-rank test point opposite ways: better on most cases, much worse on a few): neither wins."
        )
    if disagreeing:
        lines.append(
            f"Below the best on Client Avg but better over the paired test cases beyond noise: "
            f"{_listed(v, disagreeing)} (the table's Client Avg also holds cases only one of the two scored): neither "
            "wins."
        )
    for name, d in v.references.items():
        lines.append(_reference(v, name, v.score - d.table_diff))
    if v.unconverged:
        if 1 < len(v.unconverged) == len(v.ranked) + len(v.baselines):
            lines.append(
                f"Not converged: none of the {len(v.unconverged)} methods had reached a plateau (the round "
                "selected on validation is among the last ones trained, no plateau of validation Dice); more "
                "rounds may change this ranking."
            )
        else:
            lines.append(
                f"May not have converged: {', '.join(v.unconverged)} (the round selected on validation is among "
                "the last ones trained, no plateau of validation Dice); more rounds may change this ranking."
            )
    if v.never_improved:
        lines.append(f"Never improved: {', '.join(v.never_improved)} ({NEVER_IMPROVED_WHY}).")
    lines += notes or []
    return lines


CHOSEN_AFTER = (
    "The best is the best on these same test scores, so its leads are chosen after looking and read optimistic; a "
    "comparison declared before the results is fedseg bench's, against its reference."
)
PAIRING_NOTE = (
    "Each difference pairs the two methods' own models on the same test cases (a case's score: its Dice averaged "
    "over regions) of this run: a shared model on every case, a method with per-site models (Local, the "
    "personalized ones) each site's own model on that site's cases. Client Avg: the difference of the table's "
    "numbers (site means averaged), the number the ranking and the CI are about. {level}% CI: bootstrap of the "
    "Client Avg difference of the paired cases, resampling the sites and then the cases within each ({resamples} "
    "samples; one run seed, so the variance between seeds is not in it: beyond noise says that these two trained "
    "models differ, not yet that the two methods do); Wilcoxon signed-rank test over the cases pooled (whether the "
    "per-case differences lean to one side of 0; a large site has more cases), its p Holm-adjusted over the best's "
    "comparisons with the other ranked methods (its comparisons with the baselines, references that rank nothing, "
    "as a family of their own). Beyond noise: the CI excludes 0 and that p < {sig:g}, the two pointing the same way; "
    "within noise otherwise. Tied: equal Client Avg. " + CHOSEN_AFTER
)


def verdict_html(v: Verdict, notes: list[str] | None = None) -> str:
    """The verdict block that opens the report: the headline in bold, the rest as plain lines, then how the
    differences were tested (only when one is shown with a CI and a p) and which methods are not ranked."""
    lines = [esc(x) for x in verdict_lines(v, notes)]
    how = [PAIRING_NOTE.format(level=round(100 * LEVEL), resamples=RESAMPLES, sig=SIGNIFICANCE)] if v.tested else []
    if v.baselines:
        how.append(not_ranked(v))
    items = "".join(f"<li>{x}</li>" for x in lines[1:])
    return (
        f'<div class="verdict"><p class="headline"><b>Verdict.</b> {lines[0]}</p>'
        + (f"<ul>{items}</ul>" if items else "")
        + (f'<p class="note">{esc(" ".join(how))}</p>' if how else "")
        + "</div>"
    )


# --------------------------------------------------------------------------- routing
def routing_notes(run: RunFiles) -> list[str]:
    """One sentence per method whose selector routed every test image to the global model (FedSM's
    ``selector_features/<algorithm>.npz``: ``chosen`` 0 = the global model), whose scores are then the global
    model's; with a threshold γ, the one chosen on validation."""
    out = []
    for name, (images, gamma) in routed_to_global(run.dir).items():
        if name not in run.algorithms:
            continue
        why = "" if math.isnan(gamma) else f" (threshold γ = {gamma:.2f}, chosen on validation)"
        same = ""
        fedavg = next((a for a in run.algorithms if a.lower() == FEDAVG), None)
        if fedavg and run.results and _cases(run, name) == _cases(run, fedavg):
            same = f", equal to {run.label(fedavg)}'s"
        out.append(
            f"{run.label(name)} routed all {images} test images to its global model{why}: its test scores "
            f"are the global model's{same}; its personalized models were never used."
        )
    return out


def not_ranked(v: Verdict) -> str:
    """The sentence naming the methods left out of the ranking (a table shows them, possibly above the best)."""
    return f"Not ranked (baselines, references only): {', '.join(v.baselines)}."


def summary_lines(run_dir: str | Path) -> list[str]:
    """The verdict and routing notes of a finished run directory as plain lines (the terminal summary); the
    baselines left out of the ranking are named under the headline, as the table above it shows them too."""
    run = load_run(run_dir)
    run.names = {a: display_name(a, e) for a, e in run.algorithms.items()}
    notes = routing_notes(run)
    v = verdict(run)
    if v is None:
        return notes
    head, *rest = verdict_lines(v, notes)
    chosen = [CHOSEN_AFTER] if len(v.ranked) > 1 and v.tested else []  # the report's note says it too
    return [head, *([not_ranked(v)] if v.baselines else []), *chosen, *rest]


READABLE = 100  # the terminal lines' width at most, however wide the terminal: prose wider is hard to follow


def terminal_lines(lines: list[str], width: int) -> list[str]:
    """``lines`` (:func:`summary_lines`) as the terminal summary prints them, wrapped to ``width`` columns (at most
    :data:`READABLE`, at least 40): the first after ``verdict: ``, each further one after ``- ``, continued two
    spaces in; a comparison (:class:`Compared`) as its result and the test's finding (``per-case test: within
    noise``), then the test's numbers four spaces in. Every number of the lines is printed, none cut in two; the
    lines themselves, the report's sentences, and summary.json are untouched."""
    import textwrap

    width = min(max(width, 40), READABLE)

    def wrap(text: str, first: str, further: str) -> list[str]:  # a number or a name never cut in two
        return textwrap.wrap(
            text, width, initial_indent=first, subsequent_indent=further, break_long_words=False, break_on_hyphens=False
        )

    out: list[str] = []
    for k, line in enumerate(lines):
        first = "verdict: " if k == 0 else "- "
        if isinstance(line, Compared):
            out += wrap(line.result, first, "  ") + wrap(line.details, "    ", "    ")
        else:
            out += wrap(line, first, "  ")
    return out
