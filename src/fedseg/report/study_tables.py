"""The tables of a study (:mod:`fedseg.studies`) as report sections: unseen sites and sweeps.

:func:`study_sections` turns ``unseen.csv`` (FedSM Table 5 layout) and ``sweep.csv`` (Table 7
layout; Table 6 when the key is ``methods.fedsm.personalization``) of a directory into HTML
sections. They appear on a study's page (:func:`fedseg.report.studies.render_study`) and in the
run report of a run directory that holds such a table (a holdout sub-run keeps its own
``unseen.csv`` rows), so this module sits below both pages: it uses the kit and the method
names only.
"""

from __future__ import annotations

import html as _html
from pathlib import Path

from fedseg.report.kit import TableRow, esc, fmt, num, read_csv, score_table, section, site_columns, table
from fedseg.report.methods import display_name, is_federated

__all__ = [
    "STUDY_JSON",
    "SWEEP_CSV",
    "UNSEEN_CSV",
    "is_study_dir",
    "run_link",
    "study_sections",
    "sweep_section",
    "unseen_section",
]

UNSEEN_CSV, SWEEP_CSV, STUDY_JSON = "unseen.csv", "sweep.csv", "study.json"
PM = "freq_PM_"
PERSONALIZATION_KEY = "methods.fedsm.personalization"


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
    rows = read_csv(root / UNSEEN_CSV)
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
    return section(
        "Unseen sites (FedSM Table 5 layout)",
        table("<tr>" + "".join(f"<th>{esc(h)}</th>" for h in head) + "</tr>", body),
        UNSEEN_NOTE,
    )


# --------------------------------------------------------------------------- sweeps
def sweep_section(root: Path) -> str:
    """Test Dice per value (rows) and site (columns) from ``root/sweep.csv``, then HD95 Client Avg; "" when missing."""
    rows = read_csv(root / SWEEP_CSV)
    if not rows:
        return ""
    key = rows[0]["key"]
    sites = [
        c[len("dice_") :] for c in rows[0] if c.startswith("dice_") and c not in ("dice_client_avg", "dice_global")
    ]
    order = list(dict.fromkeys(r["algorithm"] for r in rows))
    dice_rows, hd_rows = [], []
    for r in sorted(rows, key=lambda r: order.index(r["algorithm"])):  # one block per algorithm, values in order
        label, fed = f"{display_name(r['algorithm'])}: {r['value']}", is_federated(r["algorithm"])
        dice = {
            **{s: num(r[f"dice_{s}"]) for s in sites},
            "client_avg": num(r["dice_client_avg"]),
            "global": num(r["dice_global"]),
        }
        dice_rows.append(TableRow(label, dice, fed, r["algorithm"]))
        hd_rows.append(TableRow(label, {"hd95": num(r["hd95_client_avg"])}, fed, r["algorithm"]))
    layout = "Table 6" if key == PERSONALIZATION_KEY else "Table 7"
    runs = dict.fromkeys((r.get("run", ""), r["value"]) for r in rows)  # one link per value, in order
    links = ", ".join(run_link(root, run, f"{key}={value}") for run, value in runs)
    body = score_table(dice_rows, site_columns(sites), True, 4) + score_table(
        hd_rows, [("hd95", "HD95 Client Avg")], False, 2
    )
    note = (
        f"One complete run per value of <code>{esc(key)}</code>, everything else as the base configuration. "
        "Test Dice per site (mean over regions per case, then over the site's cases), Client Avg = mean of the "
        "site means, Global = all test cases pooled; HD95 Client Avg below (lower is better). Bold: best "
        f"federated number per column. Runs: {links}."
    )
    return section(f"Sweep over {key} (FedSM {layout} layout)", body, note)


def study_sections(run_dir: Path) -> list[str]:
    """HTML sections (title + table + note) for ``unseen.csv`` and ``sweep.csv`` of ``run_dir``;
    [] when neither exists."""
    return [s for s in (unseen_section(Path(run_dir)), sweep_section(Path(run_dir))) if s]
