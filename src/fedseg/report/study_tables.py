"""The tables of a study (:mod:`fedseg.studies`) as report sections: unseen sites and sweeps.

:func:`study_sections` turns ``unseen.csv`` (FedSM Table 5 layout) and ``sweep.csv`` (Table 7
layout; Table 6 when the key is ``methods.fedsm.personalization``) of a directory into HTML
sections. They appear on a study's page (:func:`fedseg.report.studies.render_study`) and in the
run report of a run directory that holds such a table (a holdout sub-run keeps its own
``unseen.csv`` rows), so this module sits below both pages: it uses the kit, the report's figure
primitives and the method names only.

A sweep over a numeric value (``--sweep methods.autofedavg-n-dirichlet.t0=1,5,10,20``) also gets a
line figure of the test Dice (client average) against the value, one line per algorithm (the
Auto-FedAvg paper's Fig. 4), written to the page's figure folder (:data:`SWEEP_FIGURE`).

Each table is read with the columns it indexes (:data:`UNSEEN_COLUMNS`, :data:`SWEEP_COLUMNS`): a file without
one of them, or damaged, is a ValueError naming it (:func:`fedseg.presentation.files.read_csv`).
"""

from __future__ import annotations

import html as _html
import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path

from matplotlib.figure import Figure

from fedseg.evaluate.metric_info import METRICS
from fedseg.presentation.figures import LINE_STYLES, save, series_color
from fedseg.presentation.kit import TableRow, esc, fmt, num, read_csv, score_table, section, site_columns, table
from fedseg.report.methods import display_name, is_federated
from fedseg.run.stopping import NEVER_IMPROVED, NEVER_IMPROVED_WHY, NOT_CONVERGED_WHY

__all__ = [
    "STUDY_JSON",
    "SWEEP_CSV",
    "SWEEP_FIGURE",
    "UNSEEN_CSV",
    "check_study_tables",
    "is_study_dir",
    "run_link",
    "study_sections",
    "sweep_figure",
    "sweep_section",
    "unseen_section",
]

UNSEEN_CSV, SWEEP_CSV, STUDY_JSON = "unseen.csv", "sweep.csv", "study.json"
SWEEP_FIGURE = "sweep_dice.png"  # in the directory's figures/
LOG_SCALE_RATIO = 100.0  # a positive numeric sweep spanning this factor or more gets a log axis
PM = "freq_PM_"
PERSONALIZATION_KEY = "methods.fedsm.personalization"
#: the columns of ``unseen.csv`` / ``sweep.csv`` the tables index (besides ``freq_PM_<site>`` / ``dice_<site>``,
#: found in the header)
UNSEEN_COLUMNS = (
    *("algorithm", "unseen_site", "cases", "gamma", "freq_GM"),
    *("dice", "best_gamma", "best_dice", "val_gamma", "val_dice"),
)
SWEEP_COLUMNS = ("key", "algorithm", "value", "dice_client_avg", "dice_global")


def is_study_dir(path: Path) -> bool:
    """A study directory holds ``study.json``, ``unseen.csv`` or ``sweep.csv``."""
    return any((Path(path) / name).is_file() for name in (STUDY_JSON, UNSEEN_CSV, SWEEP_CSV))


def run_link(root: Path, run: str, text: str) -> str:
    """``text`` linked to ``root/run/report.html`` (or to the folder before it is rendered); plain
    ``text`` when ``run`` is not a folder under ``root`` (e.g. the table shown inside a sub-run)."""
    if not run or not (root / run).is_dir():
        return esc(text)
    target = f"{run}/report.html" if (root / run / "report.html").is_file() else f"{run}/"
    return f'<a href="{_html.escape(target, quote=True)}">{esc(text)}</a>'


# --------------------------------------------------------------------------- unseen sites
UNSEEN_NOTE = (
    "Each row: trained on the other sites, scored on <b>all</b> cases of the unseen site (Dice: mean over regions per "
    "case, then over cases). GM = global model, PM <i>site</i> = that training site's personalized model; the numbers "
    "are how often the model selector picks each for the unseen site's images at γ = 0 (the paper's setting: always a "
    "personalized model); N/A = the unseen site itself (it has none). Best γ, Dice: the γ of the grid with the best "
    "Dice on the unseen site itself, an oracle choice as the paper's (ties go to the larger γ). Val. γ, Dice: the γ "
    "chosen on the training sites' validation splits, what a deployment would use. FedSM-extra and the ensemble have "
    "no threshold (γ blank; the ensemble's frequencies: its most weighted candidate); methods with one global model "
    "show its Dice only. unseen.json holds the whole Dice/frequency curve over γ."
)


def unseen_section(root: Path) -> str:
    """Table 5 from ``root/unseen.csv``; "" when the file is missing or empty."""
    rows = read_csv(root / UNSEEN_CSV, UNSEEN_COLUMNS)
    if not rows:
        return ""
    sites = [c[len(PM) :] for c in rows[0] if c.startswith(PM)]
    head = (
        ["Method", "Unseen site", "Cases", "γ", "GM"]
        + [f"PM {s}" for s in sites]
        + ["Dice", "Best γ", "Best Dice", "Val. γ", "Val. Dice"]
    )
    body = []
    for r in rows:
        freqs = ["N/A" if s == r["unseen_site"] else fmt(r[PM + s], 2) for s in sites]
        cells = [
            run_link(root, r.get("run", ""), r["unseen_site"]),
            esc(r["cases"]),
            fmt(r["gamma"], 2),
            fmt(r["freq_GM"], 2),
            *freqs,
            fmt(r["dice"], 4),
            fmt(r["best_gamma"], 2),
            fmt(r["best_dice"], 4),
            fmt(r["val_gamma"], 2),
            fmt(r["val_dice"], 4),
        ]
        body.append(f"<tr><th>{esc(display_name(r['algorithm']))}</th>{''.join(f'<td>{c}</td>' for c in cells)}</tr>")
    labels = {id(r): f"{display_name(r['algorithm'])} without {r['unseen_site']}" for r in rows}
    return section(
        "Unseen sites (FedSM Table 5 layout)",
        table("<tr>" + "".join(f"<th>{esc(h)}</th>" for h in head) + "</tr>", body),
        UNSEEN_NOTE + unconverged_note(rows, labels) + no_row_note(root),
    )


def no_row_note(root: Path) -> str:
    """`` No row: ...``: the methods the study scored on no unseen site and why (``unseen.json`` ``no_row``,
    ``fedseg.studies.no_row_notes``), HTML-escaped; "" without any (or a study written before it recorded them)."""
    try:
        said = json.loads((root / "unseen.json").read_text()).get("no_row")
    except (OSError, ValueError, AttributeError):
        return ""
    lines = [str(x) for x in said] if isinstance(said, list) else []
    return f" <b>No row</b>: {esc('; '.join(lines))}." if lines else ""


def unconverged_note(rows: Sequence[Mapping], labels: Mapping[int, str]) -> str:
    """`` May not have converged: ...`` naming the sub-runs (``labels[id(row)]``) whose ``converged`` cell is
    ``no``, and `` Never improved: ...`` those whose is ``never improved`` (HTML-escaped); "" without any."""
    late = [labels[id(r)] for r in rows if r.get("converged") == "no"]
    flat = [labels[id(r)] for r in rows if r.get("converged") == NEVER_IMPROVED]
    note = ""
    if late:
        note += (
            f" <b>May not have converged</b>: {esc(', '.join(dict.fromkeys(late)))} ({NOT_CONVERGED_WHY}: more "
            "rounds may change these numbers)."
        )
    if flat:
        note += f" <b>Never improved</b>: {esc(', '.join(dict.fromkeys(flat)))} ({esc(NEVER_IMPROVED_WHY)})."
    return note


# --------------------------------------------------------------------------- sweeps
def sweep_section(root: Path, fig_dir: Path | None = None) -> str:
    """Test Dice per value (rows) and site (columns) from ``root/sweep.csv``, then HD95 and NSD Client Avg (NSD when
    the sweep has it), its figure drawn into ``fig_dir`` (default ``root/figures``); "" when missing."""
    rows = read_csv(root / SWEEP_CSV, SWEEP_COLUMNS)
    if not rows:
        return ""
    key = rows[0]["key"]
    sites = [
        c[len("dice_") :] for c in rows[0] if c.startswith("dice_") and c not in ("dice_client_avg", "dice_global")
    ]
    order = list(dict.fromkeys(r["algorithm"] for r in rows))
    others = [m for m in METRICS if m.name != "dice" and f"{m.name}_client_avg" in rows[0]]
    dice_rows: list[TableRow] = []
    other_rows: dict[str, list[TableRow]] = {m.name: [] for m in others}
    for r in sorted(rows, key=lambda r: order.index(r["algorithm"])):  # one block per algorithm, values in order
        label, fed = f"{display_name(r['algorithm'])}: {r['value']}", is_federated(r["algorithm"])
        dice = {
            "val": num(r.get("val_dice")),
            **{s: num(r[f"dice_{s}"]) for s in sites},
            "client_avg": num(r["dice_client_avg"]),
            "global": num(r["dice_global"]),
        }
        dice_rows.append(TableRow(label, dice, fed, r["algorithm"]))
        for m in others:
            other_rows[m.name].append(TableRow(label, {m.name: num(r[f"{m.name}_client_avg"])}, fed, r["algorithm"]))
    layout = "FedSM Table 6 layout" if key == PERSONALIZATION_KEY else "FedSM Table 7 layout"
    if key.startswith("methods.autofedavg") and key.endswith(".t0"):
        layout = "Auto-FedAvg Fig. 4"
    runs = dict.fromkeys((r.get("run", ""), r["value"]) for r in rows)  # one link per value, in order
    links = ", ".join(run_link(root, run, f"{key}={value}") for run, value in runs)
    columns = [("val", "Validation (selects)"), *site_columns(sites)]
    body = score_table(dice_rows, columns, True, 4) + "".join(
        score_table(other_rows[m.name], [(m.name, f"{m.label} Client Avg")], m.higher_is_better, m.mean_digits)
        for m in others
    )
    out = (fig_dir or root / "figures") / SWEEP_FIGURE
    figure = sweep_figure(rows, key, out, {a: display_name(a) for a in order})
    if figure is not None:
        body += f'<img src="figures/{SWEEP_FIGURE}" alt="test Dice (client average) vs {esc(key)}">'
    note = (
        f"One complete run per value of <code>{esc(key)}</code>, everything else as the base configuration. "
        "Test Dice per site (mean over regions per case, then over the site's cases), Client Avg = mean of the "
        "site means, Global = all test cases pooled; HD95 Client Avg below (lower is better). Validation: the mean "
        "validation Dice over sites at the run's selected round — choose a value on it, never on the test columns."
        + (" Figure: the Client Avg test Dice against the value, one line per method." if figure else "")
        + f" Runs: {links}."
    )
    note += unconverged_note(rows, {id(r): f"{display_name(r['algorithm'])}: {r['value']}" for r in rows})
    return section(f"Sweep over {key} ({layout})", body, note)


def sweep_figure(rows: Sequence[Mapping], key: str, out: Path, labels: Mapping[str, str] | None = None) -> Path | None:
    """Test Dice (client average, ``dice_client_avg``) against the swept value, one line per algorithm
    (the Auto-FedAvg paper's Fig. 4 for ``t0``), from ``sweep.csv`` rows.

    Only for a numeric sweep: every ``value`` a finite number and at least two distinct ones; the
    x axis is logarithmic when the values are positive and span a factor of :data:`LOG_SCALE_RATIO`.

    Returns:
        ``out``, or None for a non-numeric sweep or one without any Dice value.
    """
    labels = labels or {}
    xs = [num(r.get("value")) for r in rows]
    if not xs or any(not math.isfinite(x) for x in xs) or len(set(xs)) < 2:
        return None
    series: dict[str, list[tuple[float, float]]] = {}
    for x, r in zip(xs, rows):
        y = num(r.get("dice_client_avg"))
        if not math.isnan(y):
            series.setdefault(str(r.get("algorithm", "")), []).append((x, y))
    if not series:
        return None
    fig = Figure(figsize=(6.8, 3.8))
    ax = fig.subplots()
    for i, (alg, points) in enumerate(series.items()):
        px, py = zip(*sorted(points))
        ax.plot(
            px,
            py,
            color=series_color(i),
            ls=LINE_STYLES[i % len(LINE_STYLES)],
            marker="o",
            ms=4,
            lw=1.6,
            label=labels.get(alg, alg),
        )
    values = sorted(set(xs))
    if values[0] > 0 and values[-1] / values[0] >= LOG_SCALE_RATIO:
        ax.set_xscale("log")
    if len(values) <= 12:  # the swept values as ticks, written as given
        text = {num(r.get("value")): str(r.get("value")) for r in rows}
        ax.set_xticks(values, [text[v] for v in values])
        ax.minorticks_off()
    ax.set(title=f"Test Dice (client average) vs {key}", xlabel=key, ylabel="Dice (client average)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="best")
    fig.tight_layout()
    return save(fig, out)


def check_study_tables(root: Path) -> None:
    """Read ``root``'s ``unseen.csv`` and ``sweep.csv`` (where present) as the sections will: a ValueError naming
    the first that is damaged or lacks a column, before anything is drawn."""
    read_csv(root / UNSEEN_CSV, UNSEEN_COLUMNS)
    read_csv(root / SWEEP_CSV, SWEEP_COLUMNS)


def study_sections(run_dir: Path, fig_dir: Path | None = None) -> list[str]:
    """HTML sections (title + table + note) for ``unseen.csv`` and ``sweep.csv`` of ``run_dir`` (a figure drawn into
    ``fig_dir``, default ``run_dir/figures``); [] when neither exists."""
    return [s for s in (unseen_section(Path(run_dir)), sweep_section(Path(run_dir), fig_dir)) if s]
