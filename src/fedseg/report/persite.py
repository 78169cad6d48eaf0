"""The run report's sections on methods whose sites use models of their own (FeTS 2022).

Methods of kind ``personalized`` (each site uses its own model) or ``clustered`` (each site uses
its cluster's model) are tested per site with the model selected on that site's **own**
validation split (``summary.json`` ``selected_rounds``; :mod:`fedseg.algorithms.persite`). Local
selects per site too. The sections here, shown when a run has any personalized or clustered
method:

* "Personalized and clustered methods (FeTS Table 1)": the references (Centralized, Local, FedAvg
  when present) and each such method, with mean ± std over test cases of the mean Dice, the Dice
  of each region, the mean HD95 and NSD (NSD when the run has it; each site with its own model,
  :mod:`fedseg.report.own_scores`), the selected rounds and the FeTS Table 2 cost (total SGD
  steps, estimated hours; marked when it includes the base method a method starts from);
* "Per-institution test Dice (FeTS Fig. 6 style)": test Dice per site as grouped bars, sites
  ordered by training-set size (``train_samples``), Centralized and FedAvg as reference lines
  (:func:`fedseg.presentation.figures.per_site_bars`);
* "Clusters of the clustered methods": membership per site at each validated round where it
  changed (``round_metrics.csv`` metric ``cluster``), the final one, and the cluster of each
  site's tested model where that differs.

It also says how to read the selected round of a method that selects per site everywhere the
report shows one (:func:`rounds_cell`; late ones: ``fedseg.run.stopping.recorded_late_sites``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path

from fedseg.evaluate.metric_info import DICE
from fedseg.presentation import figures
from fedseg.presentation.kit import RunFiles, Section, bold_line, esc, fmt, fmt_int, num, table
from fedseg.report.methods import method_kind
from fedseg.report.own_scores import MeanStd, mean_std_text, own_case_stats, own_region_stats, scored_metrics
from fedseg.run.stopping import selected_round_of_sites as selected_rounds

__all__ = [
    "CLUSTERS_TITLE",
    "FIGURE_TITLE",
    "PER_SITE_KINDS",
    "TABLE1_TITLE",
    "cluster_changes",
    "cost_bases",
    "per_site_methods",
    "reference_methods",
    "rounds_cell",
    "sections",
    "selected_rounds",
]

PER_SITE_KINDS = ("personalized", "clustered")
TABLE1_TITLE = "Personalized and clustered methods (FeTS Table 1)"
FIGURE_TITLE = "Per-institution test Dice (FeTS Fig. 6 style)"
CLUSTERS_TITLE = "Clusters of the clustered methods"
FIGURE = "per_site_dice.png"
REFERENCES = ("centralized", "fedavg")  # drawn as reference lines in the figure, when present
BASE_MARK = "†"  # a cost that includes the training of the method the method starts from


# --------------------------------------------------------------------------- what a method is
def per_site_methods(run: RunFiles, order: Sequence[str]) -> list[str]:
    """The personalized and clustered methods among ``order``, in that order."""
    return [a for a in order if method_kind(a, run.algorithms.get(a)) in PER_SITE_KINDS]


def reference_methods(run: RunFiles, order: Sequence[str]) -> list[str]:
    """The rows the per-site methods are compared with: the baselines (Centralized, Local), then FedAvg."""
    baselines = [a for a in order if method_kind(a, run.algorithms.get(a)) == "baseline"]
    return baselines + [a for a in order if a.lower() == "fedavg"]


def rounds_cell(run: RunFiles, name: str) -> str:
    """HTML of the round(s) ``name``'s tested models come from.

    Per-site selection: ``"r (every site)"`` or the range ``"lo–hi (per site)"``, each site's round in
    the tooltip; otherwise the round with the best mean validation Dice (``best_round``)."""
    entry = run.algorithms.get(name, {})
    sel = selected_rounds(entry)
    if not sel:
        return fmt_int(entry.get("best_round"))
    order = [s for s in run.sites if s in sel] + [s for s in sel if s not in run.sites]
    tip = " · ".join(f"{s} {sel[s]}" for s in order)
    lo, hi = min(sel.values()), max(sel.values())
    text = f"{lo} (every site)" if lo == hi else f"{lo}–{hi} (per site)"
    return f'<span title="{esc(tip)}">{text}</span>'


def cost_bases(run: RunFiles, entry: Mapping) -> list[str]:
    """Display names of the methods whose training the method's ``cost`` includes besides its own
    (``cost.includes``, e.g. FedAvg for a fine-tuning started from it)."""
    includes = (entry.get("cost") or {}).get("includes") or []
    return [run.label(x) for x in includes if x != "this method"]


# --------------------------------------------------------------------------- FeTS Table 1
def _stats_cells(stats: Sequence[MeanStd], digits: int, best: float | None) -> list[str]:
    cells = []
    for s in stats:
        text = mean_std_text(s, digits)
        bold = best is not None and s["n"] > 0 and fmt(s["mean"], digits) == fmt(best, digits)
        cells.append(f"<td>{'<b>' + text + '</b>' if bold else text}</td>")
    return cells


def table1(run: RunFiles, order: Sequence[str]) -> str | None:
    """FeTS Table 1 over the references and the per-site methods (None without per-site methods)."""
    methods = per_site_methods(run, order)
    if not methods:
        return None
    refs = [a for a in reference_methods(run, order) if a not in methods]
    rows = refs + methods
    regions = run.regions or sorted({r["region"] for r in run.results})
    # columns: ("dice", None) = mean over regions; ("dice", region); then each other metric's mean (HD95, NSD)
    metrics = [m for m in scored_metrics(run) if m.name != DICE.name]
    columns: list[tuple[str, str | None, int, bool]] = [("dice", None, DICE.mean_digits, True)]
    columns += [("dice", g, DICE.digits, True) for g in regions]
    columns += [(m.name, None, m.digits, m.higher_is_better) for m in metrics]
    stats: dict[str, list[MeanStd]] = {}
    for name in rows:
        per_region = own_region_stats(run, name, "dice", regions) if run.results else {}
        out = []
        for metric, region, _, _ in columns:
            if not run.results:  # summary.json only: the pooled mean, no spread
                g = num(run.algorithms[name].get(metric, {}).get("global")) if region is None else math.nan
                out.append({"mean": g, "std": math.nan, "n": 0 if math.isnan(g) else 1})
            elif region is None:
                out.append(own_case_stats(run, name, metric))
            else:
                out.append(per_region[region])
        stats[name] = out
    best = []  # best per-site method per column (bold)
    for j, (_, _, _, higher) in enumerate(columns):
        vals = [stats[a][j]["mean"] for a in methods if stats[a][j]["n"] > 0 and not math.isnan(stats[a][j]["mean"])]
        best.append((max(vals) if higher else min(vals)) if vals else None)
    head = (
        "<tr><th>Method</th><th>Dice</th>"
        + "".join(f"<th>{esc(g)} Dice</th>" for g in regions)
        + "".join(f"<th>{m.label}</th>" for m in metrics)
        + "<th>Selected round</th><th>Total SGD steps</th><th>Estimated training time (h)</th></tr>"
    )
    body = []
    for i, name in enumerate(rows):
        entry = run.algorithms[name]
        cells = []
        for j, (_, _, digits, _) in enumerate(columns):
            cells += _stats_cells([stats[name][j]], digits, best[j] if name in methods else None)
        cost = entry.get("cost") or {}
        mark = f" {BASE_MARK}" if cost_bases(run, entry) else ""
        cells += [
            f"<td>{rounds_cell(run, name)}</td>",
            f"<td>{fmt_int(cost.get('sgd_steps'))}{mark}</td>",
            f"<td>{fmt(cost.get('simulated_hours'), 3)}{mark}</td>",
        ]
        label = "Local (own site)" if name.lower() == "local" else run.label(name)
        cls = ' class="group"' if i == len(refs) and refs else ""
        body.append(f"<tr{cls}><th>{esc(label)}</th>{''.join(cells)}</tr>")
    legend = "the best personalized or clustered method of each column (references above the rule never are)"
    return table(head, body) + (bold_line(legend) if any("<b>" in row for row in body) else "")


def _table1_note(run: RunFiles, order: Sequence[str]) -> str:
    based = {run.label(a): cost_bases(run, run.algorithms[a]) for a in order if cost_bases(run, run.algorithms[a])}
    cost = (
        f" {BASE_MARK}: the method fine-tunes another method's trained model, and its cost includes that "
        "model's training, as in FeTS Table 2 ("
        + "; ".join(f"{esc(a)}: {esc(', '.join(b))} + its own" for a, b in based.items())
        + ")."
        if based
        else ""
    )
    return (
        "FeTS 2022 Table 1 layout. Every site is tested with its own model (personalized methods: the "
        "site's model; clustered methods: its cluster's model; Local: the model trained on the site alone), "
        "selected <b>per site</b> at the round where it scored best on that site's own validation split "
        "(Selected round: the range over sites; hover for each site's round). Centralized and FedAvg test one "
        "model, of the round with the best mean validation Dice. Mean ± std over all test cases (sample std; a "
        "case's Dice, HD95 and NSD: mean over regions; HD95 over the cases it was computed for, eval.hd95). Total "
        f"SGD steps and estimated training time: FeTS Table 2 (section Cost).{cost}"
    )


# --------------------------------------------------------------------------- FeTS Fig. 6
def train_sizes(run: RunFiles, order: Sequence[str]) -> dict[str, float]:
    """``{site: training cases}`` from the first method in ``order`` whose entry has ``train_samples``."""
    for a in order:
        sizes = run.algorithms.get(a, {}).get("train_samples")
        if isinstance(sizes, Mapping) and sizes:
            return {str(s): num(n) for s, n in sizes.items()}
    return {}


def dice_figure(run: RunFiles, order: Sequence[str], fig_dir: Path) -> str | None:
    """The Fig. 6-style bars (``figures/per_site_dice.png``) as an ``<img>``; None when nothing to draw."""
    methods = per_site_methods(run, order)
    per_site = lambda a: {s: num(run.algorithms[a].get("dice", {}).get(s)) for s in run.sites}  # noqa: E731
    refs = {run.label(a): per_site(a) for a in order if a.lower() in REFERENCES and a not in methods}
    path = figures.per_site_bars(
        {run.label(a): per_site(a) for a in methods},
        run.sites,
        train_sizes(run, order),
        fig_dir / FIGURE,
        references=refs,
        ylabel="test Dice (each site's own model)",
    )
    return f'<img src="figures/{FIGURE}" alt="test Dice per site, sites by training-set size">' if path else None


def _figure_note(run: RunFiles, order: Sequence[str]) -> str:
    refs = [run.label(a) for a in order if a.lower() in REFERENCES and a not in per_site_methods(run, order)]
    lines = (
        f" Black lines: {esc(' (solid) and '.join(refs))}{' (dashed)' if len(refs) > 1 else ''} on the same site."
        if refs
        else ""
    )
    return (
        "After FeTS 2022 Fig. 6: mean test Dice of each site (its own model, mean over its test cases and the "
        "regions) for every personalized and clustered method; sites ordered by the size of their training "
        f"split (n = training cases), largest first.{lines}"
    )


# --------------------------------------------------------------------------- clusters
def cluster_membership(run: RunFiles, name: str) -> dict[int, dict[str, int]]:
    """``{round: {site: cluster}}`` of ``name`` from ``round_metrics.csv`` (metric ``cluster``), rounds ascending."""
    out: dict[int, dict[str, int]] = {}
    for r in run.round_metrics:
        if r.get("algorithm") == name and r.get("metric") == "cluster":
            v, rnd = num(r.get("value")), num(r.get("round"))
            if not math.isnan(v) and not math.isnan(rnd):
                out.setdefault(int(rnd), {})[r["site"]] = int(v)
    return dict(sorted(out.items()))


def cluster_changes(membership: Mapping[int, Mapping[str, int]]) -> list[int]:
    """The rounds whose membership differs from the round before (the first round always)."""
    rounds, prev = [], None
    for rnd, m in membership.items():
        if prev is None or dict(m) != dict(prev):
            rounds.append(rnd)
        prev = m
    return rounds


def _cluster_row(label: str, sites: Sequence[str], m: Mapping[str, int], prev: Mapping[str, int] | None) -> str:
    cells = []
    for s in sites:
        text = fmt_int(m.get(s))
        changed = prev is not None and s in m and m.get(s) != prev.get(s)
        cells.append(f"<td>{'<b>' + text + '</b>' if changed else text}</td>")
    n = len({m[s] for s in sites if s in m})
    return f"<th>{esc(label)}</th>{''.join(cells)}<td>{n}</td>"


def clusters_table(run: RunFiles, order: Sequence[str]) -> str | None:
    """Per clustered method: the membership at each validated round where it changed, the final one,
    and, where it differs, the cluster of each site's tested model (at its selected round)."""
    sites = run.sites
    body: list[str] = []
    for name in order:
        if method_kind(name, run.algorithms.get(name)) != "clustered":
            continue
        membership = cluster_membership(run, name)
        if not membership:
            continue
        changes, last = cluster_changes(membership), max(membership)
        rows, prev = [], None
        for rnd in changes:
            what = "first" if prev is None else "changed"
            label = f"{run.label(name)}, round {rnd} ({what}{', final' if rnd == last else ''})"
            rows.append(_cluster_row(label, sites, membership[rnd], prev))
            prev = membership[rnd]
        if changes[-1] != last:
            rows.append(_cluster_row(f"{run.label(name)}, round {last} (final)", sites, membership[last], None))
        sel = selected_rounds(run.algorithms[name])
        tested = {s: membership[r][s] for s, r in sel.items() if r in membership and s in membership[r]}
        if tested and any(tested.get(s) != membership[last].get(s) for s in tested):
            rows.append(_cluster_row(f"{run.label(name)}, tested model (selected round)", sites, tested, None))
        group = ' class="group"' if body else ""  # a rule between methods
        body += [f"<tr{group if i == 0 else ''}>{r}</tr>" for i, r in enumerate(rows)]
    if not body:
        return None
    head = "<tr><th>Method, round</th>" + "".join(f"<th>{esc(s)}</th>" for s in sites) + "<th>Clusters</th></tr>"
    moved = any("<b>" in row for row in body)
    return table(head, body) + (bold_line("a site that moved to another cluster since the row above") if moved else "")


CLUSTERS_NOTE = (
    "Cluster number of each site (clusters are numbered 0, 1, …; a split keeps the number for the part "
    "holding the cluster's first site) at each validated round where the membership changed, recorded "
    "after that round's training and merge (<code>round_metrics.csv</code>, metric <code>cluster</code>). "
    "Final: the clusters after the last round. A site is tested with its "
    "cluster's model at the site's own selected round; where that cluster differs from the final one, the "
    "“tested model” row gives it."
)


# --------------------------------------------------------------------------- sections
def sections(run: RunFiles, order: Sequence[str], fig_dir: Path) -> list[Section]:
    """The FeTS Table 1 section, the Fig. 6-style figure and the cluster table; [] when the run has
    no personalized or clustered method."""
    if not per_site_methods(run, order):
        return []
    return [
        Section(TABLE1_TITLE, table1(run, order), _table1_note(run, order)),
        Section(FIGURE_TITLE, dice_figure(run, order, fig_dir), _figure_note(run, order)),
        Section(CLUSTERS_TITLE, clusters_table(run, order), CLUSTERS_NOTE),
    ]
