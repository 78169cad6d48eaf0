"""The page of a study directory (:mod:`fedseg.studies`): its tables, its runs, its configuration.

:func:`render_study` writes a study directory's ``report.html``: the unseen-site and sweep
tables (:mod:`fedseg.report.study_tables`), a link to every sub-run's own report (each
re-rendered first with :func:`fedseg.report.html.render_report`) and the base configuration.

A damaged ``study.json``, table or sub-run is a ValueError naming the file and what is wrong
(:mod:`fedseg.presentation.files`); the page and its figures are written last, so a failed or interrupted render
leaves the previous page (sub-runs whose reports were drawn before keep their new, complete reports).

Dependencies go one way: this page uses the run report and the study tables; the run report
uses the study tables (for a run directory that holds one) but never this module.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from fedseg.presentation.drafts import figure_draft
from fedseg.presentation.files import kind_of, read_csv, read_json
from fedseg.presentation.kit import esc, section, write_page
from fedseg.report.html import render_report
from fedseg.report.study_tables import (
    STUDY_JSON,
    SWEEP_CSV,
    UNSEEN_CSV,
    check_study_tables,
    is_study_dir,
    run_link,
    study_sections,
)

__all__ = ["is_study_dir", "render_study", "study_sections"]


def read_study(root: Path) -> dict[str, Any]:
    """``root/study.json`` ({} without one); a ValueError naming it when it is not a JSON object or its ``runs``
    is not an object of ``{label: folder}``."""
    path = root / STUDY_JSON
    if not path.is_file():
        return {}
    meta = read_json(path)
    runs = meta.get("runs") or {}
    if not isinstance(runs, dict) or not all(isinstance(v, str) for v in runs.values()):
        what = kind_of(runs) if not isinstance(runs, dict) else "an object with a folder that is not a string"
        raise ValueError(f"{path}: runs is {what}, not an object of each run's folder")
    return meta


def _sub_runs(root: Path, meta: dict[str, Any]) -> dict[str, str]:
    """``{label: folder relative to root}`` from ``study.json`` (every planned sub-run), else from the tables."""
    if meta:
        return dict(meta.get("runs") or {})
    rows = read_csv(root / UNSEEN_CSV) + read_csv(root / SWEEP_CSV)
    return {r["run"]: r["run"] for r in rows if r.get("run")}


def render_study(study_dir: str | Path, sub_reports: bool = True) -> Path:
    """Write ``study_dir/report.html``: the study tables, a link to every sub-run's report (each
    re-rendered first when ``sub_reports``; a sub-run without ``summary.json`` is listed as not
    finished) and the base configuration from ``study.json``. Returns the page's path."""
    root = Path(study_dir)
    meta = read_study(root)
    check_study_tables(root)  # a damaged table stops the page before any sub-run's report is drawn again
    runs = _sub_runs(root, meta)
    items = []
    for label, rel in runs.items():
        done = (root / rel / "summary.json").is_file()
        if done and sub_reports:
            render_report(root / rel)
        items.append(f"<li>{run_link(root, rel, label) if done else esc(label) + ' (not finished)'}</li>")
    kind = {"holdout": "unseen sites", "sweep": f"sweep over {meta.get('key')}"}.get(str(meta.get("kind")), "study")
    with figure_draft(root) as fig_dir:
        parts = [
            f"<h1>fedseg study — {esc(kind)}</h1>",
            f'<p class="meta">Study: <code>{esc(root.resolve().name)}</code></p>',
            *study_sections(root, fig_dir),
            section(
                "Runs",
                f"<ul>{''.join(items)}</ul>" if items else None,
                "Each run is a complete run directory with its own report.",
            ),
        ]
        if meta.get("config"):
            config = yaml.safe_dump(meta["config"], sort_keys=False)
            parts.append(
                f"<details><summary>base configuration (study.json)</summary><pre>{esc(config)}</pre></details>"
            )
        return write_page(root / "report.html", f"fedseg study — {kind}", parts, drawn=fig_dir)
