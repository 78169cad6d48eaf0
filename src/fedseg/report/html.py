"""The run report: one self-contained ``report.html`` plus PNGs in ``figures/``.

:func:`render_report` reads only the run's own files (docs/design.md §3 "Run outputs"):
``summary.json`` (required), ``results.csv`` (required where summary.json names its site models, and checked against
it: :func:`fedseg.report.own_scores.check_results`), and optionally ``rounds.csv``,
``round_metrics.csv``, ``ledger.csv``, ``samples/<algorithm>__<site>.npz``, ``config.yaml``,
the files a method family reads for its own sections (FedSM: ``selector_features/``) and the
study tables ``unseen.csv`` / ``sweep.csv`` of a run that is part of a study. Each missing
optional file just drops the sections that need it; a damaged one stops the render with a ValueError naming it
(:mod:`fedseg.presentation.files`). The page uses no scripts and no network; figures are embedded as data URIs (also
written as ``figures/*.png``; the folder is the report's own: its PNGs are replaced by those of the render, so none
survives from an earlier one). The figures are drawn aside (:mod:`fedseg.presentation.drafts`) and replace the old
ones with the page, at the end: a render that fails or is interrupted leaves the previous report and figures.

Sections:

* a verdict (:mod:`fedseg.report.verdict`): the best federated method on test Dice (Client Avg), its
  paired differences from the runner-up and FedAvg with a 95% interval and, as unranked references, from each
  baseline (Local, Centralized), which differences are within noise, which methods may not have converged, and
  routing notes (FedSM: every image to the global model);
* test Dice, HD95 and NSD tables in the layout of the FedSM paper's Table 3: Centralized,
  Local's own-site row, FedAvg, the other federated methods, then the method families (FedSM,
  FedSM-extra, ...); columns = sites, Client Avg, Global; best federated number per column bold (a
  legend line under every table that bolds says what bold marks);
* the paper's "Client k Local" rows (the k-th site's local model on every site's test data) in a
  section of their own;
  Names, baseline-or-federated and families come from summary.json and the algorithm registry
  (:mod:`fedseg.report.methods`);
* the Auto-FedAvg paper's Table 2 layout, when some method has local models (summary.json
  ``local_avg``): per site the test Dice of the model the site uses, "global test avg" (Client
  Avg), "local avg" / "local gen" (diagonal / off-diagonal mean of the cross-site matrix of the
  sites' best local models; "–" for a method without them);
* per-region mean +- std over test cases (FeTS Table 1 style);
* validation Dice and training loss per round (paper Fig. 2; a star on the selected round, except for
  the methods that select a round per site: ``selected_rounds``);
* when the run has personalized or clustered methods, FeTS 2022's Table 1 layout, its Fig. 6-style
  per-site bars and the clusters per round (:mod:`fedseg.report.persite`);
* the sections of each method family present (``Family.report_sections``, e.g. FedSM's per-model
  curves and model selector, :mod:`fedseg.algorithms.fedsm.report`);
* a cross-site heatmap for every method with per-site models (Local, personalized, clustered, a
  federated method's best local models; a run with Local only: Local's, as "Local training across
  sites"); example predictions;
* communication and compute totals from the ledger; the FeTS Table 2 cost table (summary.json
  ``cost``); the (ε, δ) accounting of the methods with differential privacy (summary.json
  ``privacy``, ``fedavg-dp``); the study tables of the directory (:mod:`fedseg.report.study_tables`); the
  configuration.

Built from :mod:`fedseg.presentation.kit` (HTML, tables, the run's files) and
:mod:`fedseg.presentation.figures`; the study page (:mod:`fedseg.report.studies`) uses this module,
never the other way round.
"""

from __future__ import annotations

import math
import re
from pathlib import Path

import numpy as np

from fedseg.engine.ledger import EVAL_ACTIONS
from fedseg.evaluate.metric_info import METRICS, scoring_text
from fedseg.evaluate.tables import cross_site_matrix, site_summary
from fedseg.presentation import figures
from fedseg.presentation.drafts import figure_draft
from fedseg.presentation.kit import (
    RunFiles,
    Section,
    TableRow,
    esc,
    fmt,
    fmt_int,
    load_run,
    metric_scalar,
    nanmean,
    num,
    score_table,
    site_columns,
    table,
    write_page,
)
from fedseg.report import persite
from fedseg.report.methods import algorithm_order, display_name, families, is_federated
from fedseg.report.own_scores import check_results, check_round_files, mean_std_text, own_region_stats, scored_metrics
from fedseg.report.study_tables import study_sections
from fedseg.report.verdict import never_improved_methods, routing_notes, unconverged_methods, verdict, verdict_html
from fedseg.run.stopping import NEVER_IMPROVED_WHY, NOT_CONVERGED_WHY

__all__ = ["BYTES_PER_FLOAT", "RunFiles", "algorithm_order", "load_run", "render_report"]

BYTES_PER_FLOAT = 4
VALIDATION_IMG = '<img src="figures/validation.png" alt="validation curves">'
SAMPLES_IMG = '<img src="figures/samples.png" alt="example predictions">'


# --------------------------------------------------------------------------- score tables
def _cross_site_row(run: RunFiles, train: str, metric: str) -> dict[str, float] | None:
    """Site ``train``'s local model on every site (+ Client Avg, Global), or None if unknown.

    From ``results.csv`` when it has the rows (all columns, same code as summary.json),
    else from ``summary.json``'s ``cross_site`` (no Global: it needs the pooled cases).
    """
    sites = run.sites
    if run.results:
        model = f"local:{train}"
        row = site_summary(run.results, "local", metric, sites, model_filter=lambda r: r["model"] == model)
        if not all(math.isnan(row[s]) for s in sites):
            return row
    cross = run.algorithms.get("local", {}).get("cross_site", {}).get(metric, {}).get(train)
    if not cross:
        return None
    row = {s: num(cross.get(s)) for s in sites}
    row["client_avg"] = nanmean(row[s] for s in sites)
    row["global"] = num(cross.get("global"))
    return row


def local_label(k: int, site: str) -> str:
    """Row label of the k-th site's (1-based) local model, as the paper's "Client k Local"."""
    return f"Client {k} Local ({site})"


def score_rows(run: RunFiles, metric: str) -> list[TableRow]:
    """Rows of the main Dice / HD95 / NSD table: baselines (Local: its own-site row), FedAvg, the other federated
    methods; the "Client k Local" rows are in :func:`local_models_rows`."""
    rows = []
    for name in algorithm_order(run.summary):
        entry = run.algorithms[name]
        own = {k: num(v) for k, v in entry.get(metric, {}).items()}
        if name.lower() == "local":
            rows.append(TableRow("Local (own site)", own, False, "local"))
        else:
            fed = is_federated(name, entry)
            rows.append(TableRow(run.label(name), own, fed, "federated" if fed else "baseline"))
    return rows


def local_models_rows(run: RunFiles, metric: str) -> list[TableRow]:
    """One "Client k Local" row per site (the k-th site's local model on every site, FedSM paper Table 3) and
    Local's own-site row; [] without a Local method."""
    entry = run.algorithms.get("local")
    if entry is None:
        return []
    rows = []
    for k, train in enumerate(run.sites, start=1):
        cross = _cross_site_row(run, train, metric)
        if cross is not None:
            rows.append(TableRow(local_label(k, train), cross, False, "local"))
    if rows:
        rows.append(TableRow("Local (own site)", {k: num(v) for k, v in entry.get(metric, {}).items()}, False, "own"))
    return rows


LOCAL_MODELS_TITLE = "Local models on every site (Client k Local)"


def local_models_section(run: RunFiles) -> Section:
    """The "Client k Local" rows of each metric (FedSM paper Table 3's cross-site rows), out of the main table:
    how each site's locally trained model does on the other sites' test data."""
    unit, tolerance = run.summary.get("hd95_unit", "pixels / voxels"), run.summary.get("nsd_tolerance")
    parts = []
    for m in METRICS:
        rows = local_models_rows(run, m.name)
        if any(not math.isnan(v) for r in rows for v in r.values.values()):
            head = f"<h3>Test {esc(m.title(unit, tolerance))}</h3>"
            parts.append(head + score_table(rows, site_columns(run.sites), m.higher_is_better, m.mean_digits))
    note = (
        "“Client <i>k</i> Local (<i>site</i>)”: the <i>k</i>-th site's locally trained model (Local, at the round "
        "selected on its own validation split) on every site's test data; its own site's column is the diagonal of "
        "the cross-site heatmap below. “Local (own site)”: each site's own model on its own data, the Local row "
        "of the main tables. Nothing is bold: these are references, not federated methods."
    )
    return Section(LOCAL_MODELS_TITLE, "".join(parts) or None, note)


def table2_rows(run: RunFiles) -> list[TableRow]:
    """Rows of the Auto-FedAvg Table 2 layout: the "Client k Local" rows and Local's own-site row,
    then one row per other method; columns sites, ``client_avg``, ``local_avg``, ``local_gen``."""
    rows = []
    for name in algorithm_order(run.summary):
        entry = run.algorithms[name]
        values = {k: num(v) for k, v in entry.get("dice", {}).items() if k != "global"}
        values.update({k: metric_scalar(entry, k) for k in ("local_avg", "local_gen")})
        if name.lower() == "local":
            for k, train in enumerate(run.sites, start=1):
                cross = _cross_site_row(run, train, "dice")
                if cross is not None:
                    cells = {s: cross[s] for s in [*run.sites, "client_avg"]}
                    rows.append(TableRow(local_label(k, train), cells, False, "local"))
            rows.append(TableRow("Local (own site)", values, False, "local"))
        else:
            fed = is_federated(name, entry)
            rows.append(TableRow(run.label(name), values, fed, "federated" if fed else "baseline"))
    return rows


def table2_section(run: RunFiles) -> Section:
    """The Auto-FedAvg Table 2 layout; no body (left out) when no method has local models (``local_avg``)."""
    title = "Global and local models (Auto-FedAvg Table 2 layout)"
    if not any("local_avg" in e for e in run.algorithms.values()):
        return Section(title, None)
    columns = [(s, s) for s in run.sites] + [
        ("client_avg", "Global test avg"),
        ("local_avg", "Local avg"),
        ("local_gen", "Local gen"),
    ]
    note = (
        "Auto-FedAvg paper, Table 2. Sites: test Dice of the model each site uses (federated methods: the "
        "global model of the round with the best mean validation Dice; personalized and clustered methods: the "
        "site's own model, or its cluster's, at the round it scored best on its own validation split); Global "
        "test avg: their mean. Local avg "
        "/ Local gen: each site's own locally trained model (the one it held right after local training in "
        "the round where it scored best on its own validation split; for Local, its model of the selected "
        "round) on its own test split (diagonal mean) / on the other sites' (off-diagonal mean); – where a "
        "method has no local models (config <code>eval.local_models</code>)."
    )
    return Section(title, score_table(table2_rows(run), columns, True, 4), note)


def region_table(run: RunFiles) -> str | None:
    """Per-region Dice, HD95 and NSD (when the run has NSD rows), mean +- std over test cases (each algorithm's
    own models)."""
    if not run.results:
        return None
    regions = run.regions or sorted({r["region"] for r in run.results})
    metrics = scored_metrics(run)
    head = "".join(f"<th>{esc(g)} {m.label}</th>" for m in metrics for g in regions)
    body = []
    for name in algorithm_order(run.summary):
        cells = []
        for m in metrics:
            stats = own_region_stats(run, name, m.name, regions)
            cells += [f"<td>{mean_std_text(stats[g], m.digits)}</td>" for g in regions]
        label = "Local (own site)" if name.lower() == "local" else run.label(name)
        body.append(f"<tr><th>{esc(label)}</th>{''.join(cells)}</tr>")
    return table(f"<tr><th>Method</th>{head}</tr>", body)


# --------------------------------------------------------------------------- ledger
def ledger_table(run: RunFiles) -> str | None:
    """Totals per algorithm: floats down/up/total (+ MB), SGD steps, wall time, rounds, selected round
    (the best mean validation round; for a method that selects per site, the range of its sites' rounds).

    Floats and steps count training exchanges only (evaluation traffic excluded, as in
    ``summary.json``); wall time (seconds) counts all compute and depends on the machine and its
    load, so SGD steps (next to it) are the comparable measure of work. ``summary.json`` numbers are shown;
    the down/up split comes from ``ledger.csv`` when present.
    """
    if not run.algorithms:
        return None
    split: dict[str, list[float]] = {}
    for r in run.ledger:
        if r.get("action") in EVAL_ACTIONS:
            continue
        acc = split.setdefault(r["algorithm"], [0.0, 0.0])
        acc[0] += np.nan_to_num(num(r.get("floats_down")))
        acc[1] += np.nan_to_num(num(r.get("floats_up")))
    head = [
        "Method",
        "Rounds",
        "Selected round",
        "Floats down",
        "Floats up",
        "Floats sent",
        "MB sent",
        "SGD steps",
        "Wall time (s, load-dependent)",
    ]
    body = []
    for name in algorithm_order(run.summary):
        e = run.algorithms[name]
        down, up = split.get(name, (math.nan, math.nan))
        sent = num(e.get("floats_sent"))
        if math.isnan(sent) and name in split:
            sent = down + up
        mb = sent * BYTES_PER_FLOAT / 1e6
        cells = [
            fmt_int(e.get("rounds")),
            persite.rounds_cell(run, name),
            fmt_int(down),
            fmt_int(up),
            fmt_int(sent),
            fmt(mb, 1),
            fmt_int(e.get("sgd_steps")),
            fmt(e.get("seconds"), 1),
        ]
        body.append(f"<tr><th>{esc(run.label(name))}</th>{''.join(f'<td>{c}</td>' for c in cells)}</tr>")
    return table("<tr>" + "".join(f"<th>{h}</th>" for h in head) + "</tr>", body)


def cost_section(run: RunFiles) -> str | None:
    """FeTS Table 2 from each algorithm's ``cost`` object in summary.json (Eq. 34-38,
    :mod:`fedseg.evaluate.cost`), with a note on the timing and bandwidths used."""
    costs = {n: run.algorithms[n]["cost"] for n in algorithm_order(run.summary) if run.algorithms[n].get("cost")}
    if not costs:
        return None
    measured = any(c.get("timing") == "measured" for c in costs.values())
    head = [
        "Method",
        "Total SGD steps",
        "Total max. parallel SGD steps",
        "Forward-only batches",
        "Communicated floats (all sites)",
        "per site",
        "Evaluation floats per site",
        "Estimated training time (h)",
    ] + (["t_batch (s)", "t_eval (s)"] if measured else [])
    body = []
    for name, c in costs.items():
        cells = [
            fmt_int(c.get("sgd_steps")),
            fmt_int(c.get("parallel_sgd_steps")),
            fmt_int(c.get("forward_batches")),
            fmt_int(c.get("floats")),
            fmt_int(num(c.get("floats")) / len(run.sites)),  # FeTS Table 2 reports communication per institution
            fmt_int(num(c.get("eval_floats")) / len(run.sites)),
            fmt(c.get("simulated_hours"), 3),
        ]
        if measured:
            cells += [fmt(c.get("t_batch"), 4), fmt(c.get("t_eval"), 4)]
        mark = f" {persite.BASE_MARK}" if persite.cost_bases(run, run.algorithms[name]) else ""
        body.append(f"<tr><th>{esc(run.label(name))}{mark}</th>{''.join(f'<td>{x}</td>' for x in cells)}</tr>")
    c = next(iter(costs.values()))
    bases = {run.label(n): persite.cost_bases(run, run.algorithms[n]) for n in costs}
    based = "; ".join(f"{esc(a)}: {esc(', '.join(b))} + its own" for a, b in bases.items() if b)
    timing = (
        "t_batch and t_eval measured from this run's ledger (per algorithm, columns on the right)"
        if measured
        else f"t_batch = {fmt(c.get('t_batch'), 2)} s per training batch, t_forward = {fmt(c.get('t_forward'), 2)} s, "
        f"t_eval = {fmt(c.get('t_eval'), 2)} s per validation case (config <code>cost</code>; defaults: the "
        f"paper's V100 values)"
    )
    note = (
        "FeTS benchmark Table 2 (Eq. 34–38). SGD steps: sum over rounds and sites; max. parallel: sum over "
        "rounds of the busiest site's steps. Forward-only batches (q-FedAvg's loss pass) are not SGD steps; they "
        "cost t_forward each. Time: per round, the slowest site's steps × t_batch + forward batches × t_forward + "
        f"validation cases × t_eval + its floats down / up × {esc(c.get('bytes_per_float', BYTES_PER_FLOAT))} "
        f"bytes at {fmt(c.get('download_mb_s'), 1)} / {fmt(c.get('upload_mb_s'), 1)} MB/s, summed over rounds; "
        f"{timing}."
    ) + (
        f" {persite.BASE_MARK}: the method starts from another method's trained model, and its numbers include "
        f"that training ({based})."
        if based
        else ""
    )
    return table("<tr>" + "".join(f"<th>{h}</th>" for h in head) + "</tr>", body) + f'<p class="note">{note}</p>'


def privacy_section(run: RunFiles) -> str | None:
    """The (ε, δ) accounting of every algorithm with a summary.json ``privacy`` entry (``fedavg-dp``,
    :mod:`fedseg.algorithms.privacy`), next to its test Dice; None when there is none."""
    entries = {
        n: run.algorithms[n]["privacy"] for n in algorithm_order(run.summary) if run.algorithms[n].get("privacy")
    }
    if not entries:
        return None
    eps = lambda x: "∞" if math.isinf(num(x)) else fmt(x, 2)  # noqa: E731
    head = ["Method", "ε", "ε exact", "δ", "noise multiplier z", "clip norm C", "noise std", "rounds", "tested"]
    head.append("Test Dice (Client Avg)")
    body = []
    for name, p in entries.items():
        tested = "last round" if p.get("select_round") == "last" else "best round on validation (not covered)"
        cells = [
            eps(p.get("epsilon")),
            eps(p.get("epsilon_exact")),
            esc(p.get("delta")),
            fmt(p.get("noise_multiplier"), 3),
        ]
        cells += [fmt(p.get("clip_norm"), 3), fmt(p.get("noise_std"), 5), fmt_int(p.get("rounds")), tested]
        cells.append(fmt(metric_scalar(run.algorithms[name], "dice", "client_avg"), 4))
        body.append(f"<tr><th>{esc(run.label(name))}</th>{''.join(f'<td>{c}</td>' for c in cells)}</tr>")
    note = (
        "Central differential privacy: each site's update w<sub>k</sub> − w clipped to L2 norm ≤ C, the clipped "
        "updates averaged uniformly over the n sites, Gaussian noise of std z·C/n added to every coordinate, "
        "every site in every round. ε: RDP accountant (Balle et al. 2020 conversion; Opacus's RDPAccountant with "
        "sample rate 1); ε exact: the Gaussian-DP value, tight for this mechanism. The unit is a whole site "
        "(user-level DP: adding or removing one hospital's data); it covers the global models only and assumes a "
        "trusted server. This report's per-site scores and losses are computed from the sites' data without noise. "
        "ε = ∞: no noise."
    )
    return table("<tr>" + "".join(f"<th>{h}</th>" for h in head) + "</tr>", body) + f'<p class="note">{note}</p>'


# --------------------------------------------------------------------------- figures
CROSS_SITE_NOTE = "Rows: the site a local model was trained on; columns: the site whose test data it is scored on."


def cross_site_of(run: RunFiles, name: str) -> np.ndarray | None:
    """Cross-site Dice ``(model's site, test site)`` of ``name``'s per-site models (``local:<site>``):
    from summary.json's ``cross_site``, else from its results.csv rows; None when it has none."""
    sites = run.sites
    cross = run.algorithms.get(name, {}).get("cross_site", {}).get("dice")
    if cross:
        return np.array([[num(cross.get(a, {}).get(b)) for b in sites] for a in sites], dtype=np.float64)
    if any(r["algorithm"] == name and r["model"].startswith("local:") for r in run.results):
        return cross_site_matrix(run.results, "dice", sites, algorithm=name)
    return None


def _figure_stem(name: str) -> str:
    """A file-name-safe form of an algorithm name."""
    return re.sub(r"[^A-Za-z0-9_.-]", "_", name)


def cross_site_section(run: RunFiles, fig_dir: Path) -> Section:
    """One heatmap per method with per-site models (Local, the personalized and clustered methods, a
    federated method's best local models) across sites, each with its local avg (diagonal) / local gen
    (off-diagonal). A run whose only such method is Local gets Local's section as before (one square
    heatmap ``figures/cross_site.png``, no title)."""
    matrices = {}
    for name in algorithm_order(run.summary):
        m = cross_site_of(run, name)
        if m is not None and np.isfinite(m).any():
            matrices[name] = m
    only_local = list(matrices) == ["local"]
    title = "Local training across sites" if only_local else "Per-site models across sites"
    if not matrices:
        return Section(title, None)
    off = ~np.eye(len(run.sites), dtype=bool)
    imgs, numbers = [], []
    for name, m in matrices.items():
        entry = run.algorithms.get(name, {})
        avg, gen = metric_scalar(entry, "local_avg"), metric_scalar(entry, "local_gen")
        avg = nanmean(np.diag(m)) if math.isnan(avg) else avg
        gen = nanmean(m[off]) if math.isnan(gen) else gen
        label = "Local" if name.lower() == "local" else run.label(name)
        file = "cross_site.png" if name.lower() == "local" else f"cross_site_{_figure_stem(name)}.png"
        figures.cross_site_heatmap(
            m,
            run.sites,
            fig_dir / file,
            "Dice",
            title=None if only_local else f"{label}\nlocal avg {fmt(avg, 3)} · local gen {fmt(gen, 3)}",
            ylabel="training site (local model)" if only_local else "site of the model",
        )
        alt = f"{label} cross-site Dice heatmap" if not only_local else "local cross-site Dice heatmap"
        imgs.append(f'<img src="figures/{file}" alt="{esc(alt)}" class="{"square" if only_local else "tile"}">')
        numbers.append((label, avg, gen))
    if only_local:
        _, avg, gen = numbers[0]
        body = (
            f"{imgs[0]}"
            f'<p class="note"><b>Local avg</b> (diagonal: each site\'s model on its own test data) = {fmt(avg, 4)}; '
            f"<b>Local gen</b> (off-diagonal: on the other sites' test data) = {fmt(gen, 4)}.</p>"
        )
        return Section(title, body, CROSS_SITE_NOTE)
    listed = "; ".join(f"{esc(label)} {fmt(avg, 4)} / {fmt(gen, 4)}" for label, avg, gen in numbers)
    note = (
        "Rows: the site whose model it is — Local: the model trained on that site alone; personalized and "
        "clustered methods: the model the site uses (its cluster's, for a clustered method), at the site's own "
        "selected round; other federated methods: the site's best locally trained model (config "
        "<code>eval.local_models</code>). Columns: the site whose test data it is scored on. <b>Local avg</b> "
        "(diagonal, bold: each site's model on its own test data) / <b>local gen</b> (off-diagonal: on the other "
        f"sites' test data): {listed}."
    )
    return Section(title, f'<div class="tiles">{"".join(imgs)}</div>', note)


# --------------------------------------------------------------------------- page
def _header(run: RunFiles) -> str:
    s = run.summary
    counts: dict[str, set] = {}
    for r in run.results:
        counts.setdefault(r["site"], set()).add(r["case"])
    sites = ", ".join(f"{esc(x)} ({len(counts[x])})" if x in counts else esc(x) for x in run.sites)
    algs = ", ".join(esc(run.label(a)) for a in algorithm_order(s))
    return (
        f"<h1>fedseg report — {esc(s.get('dataset', run.dir.name))}</h1>"
        f'<p class="meta">Run: <code>{esc(run.dir.resolve().name)}</code></p>'
        f'<p class="meta">Sites{" (test cases)" if counts else ""}: {sites}</p>'
        f'<p class="meta">Regions: {esc(", ".join(run.regions))} &nbsp;·&nbsp; Methods: {algs}</p>'
        + _notice_lines(run)
        + _data_line(run)
        + _provenance_line(s.get("provenance"))
    )


def unfinished_text(run: RunFiles) -> str | None:
    """One sentence naming the configured methods this run has not finished (None when it finished every one)."""
    if not (missing := run.unfinished):
        return None
    return (
        f"incomplete run: {', '.join(missing)} did not finish (the run was stopped); this report holds the finished "
        f"methods only, and `fedseg run` with the run's command and --resume trains the rest"
    )


def unreadable_text(run: RunFiles) -> str | None:
    """One sentence naming the run's files left out of the report because they cannot be read (None when none)."""
    if not run.unreadable:
        return None
    names = ", ".join(str(p.relative_to(run.dir)) if p.is_relative_to(run.dir) else str(p) for p in run.unreadable)
    return f"left out of the report: {names} (cannot be read: damaged or cut short)"


def _notice_lines(run: RunFiles) -> str:
    """The header's bold lines: the methods not finished, the files left out."""
    lines = [t for t in (unfinished_text(run), unreadable_text(run)) if t]
    return "".join(f'<p class="meta"><b>{esc(t[0].upper() + t[1:])}.</b></p>' for t in lines)


def _data_line(run: RunFiles) -> str:
    """The split protocol and any repartition or held-out site (``config.yaml``'s ``data``; FeTS Sec. 4.3-4.4)."""
    data = run.settings.get("data") or {}
    split, part = data.get("split") or {}, data.get("repartition") or {}
    parts = []
    if split.get("mode") == "kfold":
        parts.append(f"federated {split.get('folds')}-fold split, fold {split.get('fold')} tested")
    elif split.get("mode"):
        parts.append(f"{split['mode']} split")
    mode = part.get("mode", "none")
    if mode == "iid":
        parts.append(f"IID repartition: every case dealt to {part.get('sites')} synthetic sites")
    elif mode == "limited":
        limits = [f"at most {part['max_cases']} cases per site" if part.get("max_cases") else ""]
        limits += [f"sites dropped: {', '.join(map(str, part['drop_sites']))}" if part.get("drop_sites") else ""]
        limits += [f"cases without {part['require']!r} dropped" if part.get("require") else ""]
        parts.append("limited repartition (" + "; ".join(x for x in limits if x) + ")")
    if part.get("holdout") is not None:
        parts.append(f"site {part['holdout']} held out of training (unseen)")
    if not parts:
        return ""
    return f'<p class="meta">Data: {esc(str(data.get("source", "?")))} · {esc(" · ".join(parts))}</p>'


def _provenance_line(prov: dict | None) -> str:
    """fedseg version, commit (short, + dirty), torch, the installed method packages (``plugins``), device, date,
    wall time (summary.json ``provenance``)."""
    if not isinstance(prov, dict):
        return ""
    commit = prov.get("commit")
    plugins = prov.get("plugins")
    plugins = plugins if isinstance(plugins, dict) else {}
    parts = [
        f"fedseg {prov.get('fedseg', '?')}",
        f"commit {commit[:10]}{' (dirty)' if prov.get('dirty') else ''}" if commit else "commit unknown",
        f"torch {prov.get('torch', '?')}",
        *(
            f"{name}: plugin {p.get('distribution', '?')} {p.get('version', '?')}"
            for name, p in plugins.items()
            if isinstance(p, dict)
        ),
        f"device {prov.get('device', '?')}",
        str(prov.get("start", "?")).replace("T", " ").replace("Z", " UTC"),
    ]
    if isinstance(prov.get("wall_seconds"), int | float):
        parts.append(f"wall {prov['wall_seconds']:.0f} s")
    return f'<p class="meta">{" &nbsp;·&nbsp; ".join(esc(p) for p in parts)}</p>'


def _score_sections(run: RunFiles) -> list[Section]:
    """Dice, HD95 and NSD tables (same renderer, :data:`METRICS`; a metric without numbers, e.g. NSD of a run
    written before it existed, has none)."""
    regions = ", ".join(run.regions) or "regions"
    common = (
        (
            f"Per case: mean over regions ({esc(regions)}); per site: mean over its test cases. "
            "Client Avg = mean of the site means; Global = mean over all test cases pooled. "
            + scoring_text(run.summary.get("score_on"), run.summary.get("score_grid"), run.summary.get("ignore_label"))
        )
        + (
            "“Local (own site)”: each site's own model on its own data (each site's model on every site: "
            f"“{esc(LOCAL_MODELS_TITLE)}” below). "
            if "local" in run.algorithms
            else ""
        )
        + (
            "Personalized and clustered methods: each site with its own model (a clustered method: its cluster's), "
            "selected at the round where it scored best on the site's own validation split. "
            if persite.per_site_methods(run, list(run.algorithms))
            else ""
        )
    )
    notes = {
        "dice": _unconverged(run),
        "hd95": " A region empty in both truth and prediction scores 0; empty in exactly one, the worst value "
        f"({_worst_hd95(run)}).",
        "nsd": " Normalized surface Dice: the share of the boundary points of truth and prediction that lie "
        "within the tolerance τ (eval.nsd_tolerance) of the other's boundary; a region empty in both truth and "
        "prediction scores 1, empty in exactly one 0.",
    }
    unit, tolerance = run.summary.get("hd95_unit", "pixels / voxels"), run.summary.get("nsd_tolerance")
    out = []
    for m in METRICS:
        rows = score_rows(run, m.name)
        if any(not math.isnan(v) for r in rows for v in r.values.values()):  # e.g. no HD95 when eval.hd95 is off
            note = notes[m.name].lstrip()
            table_html = score_table(rows, site_columns(run.sites), m.higher_is_better, m.mean_digits)
            out.append(Section(f"Test {m.title(unit, tolerance)}", table_html, common + note))
    return out


def _worst_hd95(run: RunFiles) -> str:
    """The HD95 a missed or hallucinated region scores, as the run's summary records it (``hd95_worst``)."""
    worst, unit = run.summary.get("hd95_worst"), run.summary.get("hd95_unit", "pixels / voxels")
    if isinstance(worst, int | float):
        return f"{worst:g} {unit}, eval.hd95_worst"
    if "hd95_worst" in run.summary:
        return "the diagonal of the case's grid, eval.hd95_worst unset"
    return "eval.hd95_worst, by default the diagonal of the case's grid"


def _unconverged(run: RunFiles) -> str:
    """A warning naming the methods that may not have converged (:func:`fedseg.report.verdict.unconverged_methods`),
    so more rounds may change the comparison, and those whose validation never improved (``never_improved_methods``)."""
    late, per_site = unconverged_methods(run)
    flat = never_improved_methods(run)
    never = f" <b>Never improved</b>: {esc(', '.join(flat))} — {esc(NEVER_IMPROVED_WHY)}." if flat else ""
    if not late:
        return never
    return never + (
        f" <b>May not have converged</b>: {esc(', '.join(late))} — {NOT_CONVERGED_WHY}"
        + (
            " (for a method that selects a round per site, on its own validation split: at least half its "
            "sites selected a round among those last ones)"
            if per_site
            else ""
        )
        + "; more rounds may change these numbers."
    )


def _validation_note(run: RunFiles, order: list[str]) -> str:
    """How to read the validation curves; which methods have no star (per-site selection) and why."""
    per_site = [run.label(a) for a in order if persite.selected_rounds(run.algorithms[a])]
    if not per_site:
        return (
            "Mean over sites of the validation Dice; the star marks the round selected on validation "
            "(whose model is tested above)."
        )
    return (
        "Mean over sites of the validation Dice (each site's own model for the methods that have one); the star "
        "marks the round selected on validation (whose model is tested above). "
        f"No star for {esc(', '.join(per_site))}: they select a round <b>per site</b>, on each site's own "
        "validation split, so no single round of this mean curve is the tested one; each site's round is in "
        "the column “Selected round” of “Communication and compute”"
        + (f" and of “{esc(persite.TABLE1_TITLE)}”" if persite.per_site_methods(run, order) else "")
        + "."
    )


def family_sections(run: RunFiles, order: list[str], fig_dir: Path) -> list[Section]:
    """The sections of every registered method family among the run's algorithms (``Family.report_sections``
    with the family's algorithms in table order), families in table order."""
    return [
        s
        for family, members in families(run.summary, order)
        if family.report_sections is not None
        for s in family.report_sections(run, members, fig_dir)
    ]


def render_report(run_dir: str | Path, run: RunFiles | None = None) -> Path:
    """Write ``run_dir/report.html`` and ``run_dir/figures/*.png`` from the run's files (``run``: already read with
    ``load_run``). A file that cannot be read as fedseg writes it is a ValueError naming it; then, as on any other
    error or an interrupt, the previous report and figures are left as they were.

    Returns:
        path of ``report.html``.
    """
    from fedseg.algorithms import load_deferred

    load_deferred()  # a method package imported before fedseg (a script): its names and families, as a run has them
    run = run or load_run(run_dir)
    check_results(run)
    check_round_files(run)
    with figure_draft(run.dir) as fig_dir:  # the figures replace figures/ with the page, once all is drawn
        title = f"fedseg report — {run.summary.get('dataset', '')}"
        return write_page(run.dir / "report.html", title, _report_parts(run, fig_dir), drawn=fig_dir)


def _report_parts(run: RunFiles, fig_dir: Path) -> list[str]:
    """The HTML parts of ``run``'s report, its figures drawn into ``fig_dir``."""
    order = algorithm_order(run.summary)
    run.names = {a: display_name(a, run.algorithms[a]) for a in order}
    labels = dict(run.names)

    curves = figures.validation_curves(
        run.rounds,
        fig_dir / "validation.png",
        order,
        labels,
        {
            a: int(e["best_round"])
            for a, e in run.algorithms.items()
            if "best_round" in e and not persite.selected_rounds(e)
        },
    )
    samples = figures.sample_grid(run.samples, run.sites, order, run.regions, fig_dir / "samples.png", labels)
    extra = family_sections(run, order, fig_dir)
    # a family section without a body adds its note to the section of that title below
    notes: dict[str, list[str]] = {}
    for s in extra:
        if not s.body and s.note:
            notes.setdefault(s.title, []).append(s.note)

    def add_notes(s: Section) -> Section:
        return Section(s.title, s.body, " ".join([s.note, *notes[s.title]])) if s.title in notes else s

    sections = [
        *_score_sections(run),
        local_models_section(run),
        table2_section(run),
        Section(
            "Per-region scores (mean ± std over test cases)",
            region_table(run),
            "Each method's own models (for Local: each site's model on its own site; a federated method's local "
            "models are not counted). "
            "Std over cases (sample std); HD95 over the cases it was computed for (eval.hd95).",
        ),
        Section("Validation Dice per round", VALIDATION_IMG if curves else None, _validation_note(run, order)),
        *persite.sections(run, order, fig_dir),
        *(s for s in extra if s.body),
        cross_site_section(run, fig_dir),
        Section(
            "Example test predictions",
            SAMPLES_IMG if samples else None,
            "One test case per site; contours in one colour per region (colour-blind-safe Okabe–Ito), the "
            "ground truth dashed (also under each prediction, for comparison), a prediction solid. The Dice under each "
            "prediction is for that single case. 3-channel images are shown as RGB, others by their "
            "first channel; 3D cases by their middle slice.",
        ),
        Section(
            "Communication and compute",
            ledger_table(run),
            f"Floats and SGD steps count training exchanges (evaluation traffic excluded); "
            f"MB = floats × {BYTES_PER_FLOAT} bytes / 10⁶. Wall time: seconds of all compute of the method, "
            "measured on the machine that ran it, so it depends on that machine and its load; "
            "SGD steps (next column) compare the work done independently of the machine. Selected round: the "
            "round whose model is tested (best mean validation Dice); for a method that selects per site (each "
            "site on its own validation split), the range of its sites' rounds (hover for each site's).",
        ),
        Section("Cost (FeTS Table 2)", cost_section(run)),
        Section("Differential privacy", privacy_section(run)),
    ]
    best = verdict(run)
    top = verdict_html(best, routing_notes(run)) if best is not None else ""
    parts = [_header(run), top, *(add_notes(s).html() for s in sections), *study_sections(run.dir, fig_dir)]
    if run.config is not None:
        parts.append(f"<details><summary>config.yaml</summary><pre>{esc(run.config)}</pre></details>")
    return parts
