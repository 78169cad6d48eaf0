"""The page of a study directory (:mod:`fedseg.studies`): its tables, its runs, its configuration.

:func:`render_study` writes a study directory's ``report.html``: the unseen-site and sweep
tables (:mod:`fedseg.report.study_tables`), a link to every sub-run's own report (each
re-rendered first with :func:`fedseg.report.html.render_report`) and the base configuration.

Dependencies go one way: this page uses the run report and the study tables; the run report
uses the study tables (for a run directory that holds one) but never this module.
"""

from __future__ import annotations

import json
from pathlib import Path

import yaml

from fedseg.presentation.kit import esc, read_csv, section, write_page
from fedseg.report.html import render_report
from fedseg.report.study_tables import STUDY_JSON, SWEEP_CSV, UNSEEN_CSV, is_study_dir, run_link, study_sections

__all__ = ["is_study_dir", "render_study", "study_sections"]


def _sub_runs(root: Path) -> dict[str, str]:
    """``{label: folder relative to root}`` from ``study.json`` (every planned sub-run), else from the tables."""
    meta = root / STUDY_JSON
    if meta.is_file():
        return dict(json.loads(meta.read_text()).get("runs") or {})
    rows = read_csv(root / UNSEEN_CSV) + read_csv(root / SWEEP_CSV)
    return {r["run"]: r["run"] for r in rows if r.get("run")}


def render_study(study_dir: str | Path, sub_reports: bool = True) -> Path:
    """Write ``study_dir/report.html``: the study tables, a link to every sub-run's report (each
    re-rendered first when ``sub_reports``; a sub-run without ``summary.json`` is listed as not
    finished) and the base configuration from ``study.json``. Returns the page's path."""
    root = Path(study_dir)
    runs = _sub_runs(root)
    items = []
    for label, rel in runs.items():
        done = (root / rel / "summary.json").is_file()
        if done and sub_reports:
            render_report(root / rel)
        items.append(f"<li>{run_link(root, rel, label) if done else esc(label) + ' (not finished)'}</li>")
    meta = json.loads((root / STUDY_JSON).read_text()) if (root / STUDY_JSON).is_file() else {}
    kind = {"holdout": "unseen sites", "sweep": f"sweep over {meta.get('key')}"}.get(str(meta.get("kind")), "study")
    parts = [
        f"<h1>fedseg study — {esc(kind)}</h1>",
        f'<p class="meta">Study: <code>{esc(root.resolve().name)}</code></p>',
        *study_sections(root),
        section(
            "Runs",
            f"<ul>{''.join(items)}</ul>" if items else None,
            "Each run is a complete run directory with its own report.",
        ),
    ]
    if meta.get("config"):
        config = yaml.safe_dump(meta["config"], sort_keys=False)
        parts.append(f"<details><summary>base configuration (study.json)</summary><pre>{esc(config)}</pre></details>")
    return write_page(root / "report.html", f"fedseg study — {kind}", parts)
