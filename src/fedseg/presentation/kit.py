"""The report kit: presentation primitives shared by every page fedseg writes.

The run report (:mod:`fedseg.report.html`), the study page (:mod:`fedseg.report.studies`) and
a method family's own report module (e.g. :mod:`fedseg.algorithms.fedsm.report`) build their
HTML from these pieces:

* the run's files: :class:`RunFiles` / :func:`load_run` (``summary.json``, ``results.csv``,
  ``rounds.csv``, ``round_metrics.csv``, ``ledger.csv``, ``samples/``, ``config.yaml``) and the
  readers behind them (:mod:`fedseg.presentation.files`: :func:`read_csv`, :func:`load_npz`; a
  damaged file is one ValueError naming it), which a family uses for files of its own;
* number formatting (:func:`num`, :func:`fmt`, :func:`fmt_int`, :func:`nanmean`) and escaping
  (:func:`esc`);
* tables (:class:`TableRow`, :func:`score_table`, :func:`table`, :func:`site_columns`);
* sections (:class:`Section`, :func:`section`) and the page around them (:data:`CSS`,
  :func:`page`), written by :func:`write_page` with its ``figures/*.png`` embedded as data
  URIs (:func:`embed_figures`), so a page keeps its figures when sent alone.

Nothing here knows a method: names, order and families come from the callers (the registry
is read by ``report.html`` / ``report.studies``, never here).
"""

from __future__ import annotations

import base64
import functools
import html
import math
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from fedseg.atomic_files import atomic_write_text
from fedseg.interrupts import deferred_interrupts
from fedseg.presentation.drafts import replace_figures
from fedseg.presentation.files import REWRITE_HINT, check_summary, load_npz, read_csv, read_json, read_text

__all__ = [
    "CSS",
    "FIGURE_SRC",
    "RunFiles",
    "Section",
    "TableRow",
    "bold_legend",
    "bold_line",
    "embed_figures",
    "esc",
    "fmt",
    "fmt_int",
    "load_npz",
    "load_run",
    "metric_scalar",
    "nanmean",
    "num",
    "page",
    "read_csv",
    "score_table",
    "section",
    "site_columns",
    "table",
    "write_page",
]


# --------------------------------------------------------------------------- numbers and text
def num(x) -> float:
    """JSON / CSV number -> float (None, blank, non-numbers -> NaN)."""
    try:
        return math.nan if x is None or x == "" else float(x)
    except (TypeError, ValueError):
        return math.nan


def fmt(x, digits: int) -> str:
    """``x`` with ``digits`` decimals; "–" when it is not a number."""
    v = num(x)
    return "–" if math.isnan(v) else f"{v:.{digits}f}"


def fmt_int(x) -> str:
    """``x`` rounded, with thousands separators; "–" when it is not a number."""
    v = num(x)
    return "–" if math.isnan(v) else f"{int(round(v)):,}"


def esc(x) -> str:
    """``str(x)`` escaped for HTML text."""
    return html.escape(str(x))


def esc_md(text: str) -> str:
    """``text`` escaped for HTML, with its Markdown ``**bold**`` spans as ``<b>`` (a note written once for
    ``tables.md`` and for ``report.html``)."""
    return re.sub(r"\*\*(.+?)\*\*", r"<b>\1</b>", esc(text))


def nanmean(xs: Iterable) -> float:
    """Mean of the numbers among ``xs`` (NaN when there is none)."""
    v = [x for x in (num(x) for x in xs) if not math.isnan(x)]
    return float(np.mean(v)) if v else math.nan


def metric_scalar(entry: Mapping, key: str, metric: str = "dice") -> float:
    """``entry[key]`` as a number, whether stored as a float or as ``{metric: float}``."""
    v = entry.get(key)
    return num(v.get(metric) if isinstance(v, Mapping) else v)


# --------------------------------------------------------------------------- files
SELECTOR_DIR = "selector_features"  # FedSM's test routing (fedseg.algorithms.fedsm.features.FEATURES_DIR)


def routed_to_global(run_dir: Path) -> dict[str, tuple[int, float]]:
    """``{algorithm: (test images, γ)}`` for each FedSM-family algorithm of the run in ``run_dir`` whose selector
    routed every test image to the global model (``selector_features/<algorithm>.npz``: ``chosen`` all 0): its
    test scores are then its global model's. γ: the threshold chosen on validation, NaN for variants without one.
    ``fedsm-ensemble`` mixes every candidate (its ``chosen`` is only the heaviest): never listed (``mode``, or its
    name in files written before the mode was recorded)."""
    out = {}
    for name, arrays in load_npz(Path(run_dir) / SELECTOR_DIR, "*.npz", {"chosen"}).items():
        chosen = np.asarray(arrays["chosen"])
        mode = str(arrays["mode"]) if "mode" in arrays else ("ensemble" if name.endswith("ensemble") else "")
        if mode != "ensemble" and chosen.size and not np.any(chosen != 0):
            out[name] = (int(chosen.size), num(arrays["gamma"]) if "gamma" in arrays else math.nan)
    return out


def load_samples(folder: Path, skipped: list[Path] | None = None) -> dict[str, dict[str, dict[str, np.ndarray]]]:
    """``samples/<algorithm>__<site>.npz`` -> ``{site: {algorithm: arrays}}`` (unreadable files: to ``skipped``)."""
    out: dict[str, dict[str, dict[str, np.ndarray]]] = {}
    for stem, arrays in load_npz(folder, "*__*.npz", {"image", "truth", "pred"}, skipped).items():
        algorithm, _, site = stem.partition("__")
        out.setdefault(site, {})[algorithm] = arrays
    return out


@dataclass
class RunFiles:
    """Everything the report reads from a run directory (optional parts empty if absent).

    ``names``: display name per algorithm, filled by the page that renders the run (from the
    registry); :meth:`label` falls back to summary.json's ``display_name``, then the name.
    Files of a method family's own (e.g. FedSM's ``selector_features/``) are read by that
    family's report module from ``dir``.
    """

    dir: Path
    summary: dict
    results: list[dict] = field(default_factory=list)
    rounds: list[dict] = field(default_factory=list)
    ledger: list[dict] = field(default_factory=list)
    samples: dict[str, dict[str, dict[str, np.ndarray]]] = field(default_factory=dict)  # site -> algorithm -> arrays
    config: str | None = None
    round_metrics: list[dict] = field(default_factory=list)  # round_metrics.csv rows
    names: dict[str, str] = field(default_factory=dict)  # algorithm -> display name
    unreadable: list[Path] = field(default_factory=list)  # files left out: they cannot be read (samples/*.npz)

    @property
    def sites(self) -> list[str]:
        return list(self.summary.get("sites", []))

    @property
    def regions(self) -> list[str]:
        return list(self.summary.get("regions", []))

    @property
    def algorithms(self) -> dict[str, dict]:
        return self.summary.get("algorithms", {})

    @functools.cached_property
    def settings(self) -> dict[str, Any]:
        """``config.yaml`` parsed ({} when the run has none, or it is not a readable mapping: then it is listed in
        ``unreadable``, so the page and the command say that its sections are left out)."""
        import yaml

        try:
            loaded = yaml.safe_load(self.config or "")
        except yaml.YAMLError:
            loaded = None
        if self.config is not None and not isinstance(loaded, dict):
            self.unreadable.append(self.dir / "config.yaml")
        return loaded if isinstance(loaded, dict) else {}

    @property
    def unfinished(self) -> list[str]:
        """The algorithms ``config.yaml`` names that ``summary.json`` does not hold (the run was stopped before they
        finished: ``fedseg run --resume`` trains them), in the config's order; empty without a readable config."""
        configured = self.settings.get("algorithms")
        names = configured if isinstance(configured, list) else []
        return [a for a in names if isinstance(a, str) and a not in self.algorithms]

    def label(self, algorithm: str) -> str:
        """Display name of ``algorithm`` (``names``, else summary.json's ``display_name``, else the name)."""
        if algorithm in self.names:
            return self.names[algorithm]
        return str(self.algorithms.get(algorithm, {}).get("display_name") or algorithm)


#: the columns of a run's CSV files the pages index (those fedseg writes, less the ones only read with a default)
RUN_COLUMNS = {
    "results.csv": ("algorithm", "model", "site", "case", "region", "metric", "value"),
    "rounds.csv": ("algorithm", "round", "site", "val_dice"),
    "round_metrics.csv": ("algorithm", "round", "site", "metric", "value"),
    "ledger.csv": ("algorithm",),
}
#: the number columns of a run's CSV files that a page converts without a default (blank: NaN)
RUN_NUMBERS: dict[str, dict[str, type]] = {"results.csv": {"value": float}, "rounds.csv": {"round": int}}


def _read_run_csv(run_dir: Path, name: str) -> list[dict]:
    """The rows of the run's CSV file ``name`` (``[]`` without it), checked by :func:`~.files.read_csv` against
    :data:`RUN_COLUMNS` / :data:`RUN_NUMBERS`; ``results.csv``'s ``value`` as a float (blank: NaN)."""
    rows = read_csv(run_dir / name, RUN_COLUMNS.get(name, ()), RUN_NUMBERS.get(name))
    if name == "results.csv":
        for r in rows:
            r["value"] = num(r["value"])
    return rows


def load_run(run_dir: str | Path) -> RunFiles:
    """Read a run directory. Raises FileNotFoundError when ``summary.json`` is missing, and a ValueError naming the
    file and what is wrong when one of its files cannot be read as fedseg writes it (:mod:`.files`)."""
    run_dir = Path(run_dir)
    summary_path = run_dir / "summary.json"
    if not summary_path.is_file():
        raise FileNotFoundError(f"{summary_path} not found: is {run_dir} a fedseg run directory?")
    config = run_dir / "config.yaml"
    unreadable: list[Path] = []
    return RunFiles(
        dir=run_dir,
        summary=check_summary(read_json(summary_path, REWRITE_HINT), summary_path),
        results=_read_run_csv(run_dir, "results.csv"),
        rounds=_read_run_csv(run_dir, "rounds.csv"),
        ledger=_read_run_csv(run_dir, "ledger.csv"),
        samples=load_samples(run_dir / "samples", unreadable),
        config=read_text(config) if config.is_file() else None,
        round_metrics=_read_run_csv(run_dir, "round_metrics.csv"),
        unreadable=unreadable,
    )


# --------------------------------------------------------------------------- tables
@dataclass
class TableRow:
    """One table row: a label, values per column key, and whether it competes for bold."""

    label: str
    values: dict[str, float]
    federated: bool
    group: str  # e.g. "baseline" | "local" | "federated": a rule is drawn between groups


def _best(rows: Sequence[TableRow], key: str, higher_is_better: bool, to_text: Callable[[float], str]) -> set[str]:
    """Formatted best federated value(s) of a column (ties at display precision all win)."""
    vals = [r.values.get(key, math.nan) for r in rows if r.federated]
    vals = [v for v in vals if not math.isnan(v)]
    if not vals:
        return set()
    return {to_text(max(vals) if higher_is_better else min(vals))}


def score_table(
    rows: Sequence[TableRow],
    columns: Sequence[tuple[str, str]],
    higher_is_better: bool,
    digits: int,
    legend: str | None = None,
) -> str:
    """HTML table of ``rows`` over ``columns`` (``(key, header)``), best federated value bold; when a cell is bold,
    a legend line under the table says what bold marks (``legend``, HTML: by default :func:`bold_legend`)."""
    to_text = lambda v: fmt(v, digits)  # noqa: E731
    best = {key: _best(rows, key, higher_is_better, to_text) for key, _ in columns}
    head = "".join(f"<th>{esc(h)}</th>" for _, h in columns)
    body, prev_group, bolded = [], None, False
    for r in rows:
        cls = ' class="group"' if prev_group is not None and r.group != prev_group else ""
        prev_group = r.group
        cells = []
        for key, _ in columns:
            text = to_text(r.values.get(key, math.nan))
            bold = r.federated and text in best[key]
            bolded |= bold
            cells.append(f"<td>{'<b>' + text + '</b>' if bold else text}</td>")
        body.append(f"<tr{cls}><th>{esc(r.label)}</th>{''.join(cells)}</tr>")
    out = table(f"<tr><th>Method</th>{head}</tr>", body)
    return out + bold_line(legend or bold_legend(higher_is_better)) if bolded else out


def bold_legend(higher_is_better: bool = True) -> str:
    """What :func:`score_table` bolds: the best federated method's number in each column."""
    direction = "higher" if higher_is_better else "lower"
    return (
        f"the best number of each column among the federated methods ({direction} is better); ties at the "
        "shown precision are all bold, and baselines such as Centralized and Local never are"
    )


def bold_line(what: str) -> str:
    """The legend line under a table that bolds something: "<b>Bold</b>: ``what``." (``what``: HTML)."""
    return f'<p class="legend"><b>Bold</b>: {what}.</p>'


def table(head_row: str, body_rows: Sequence[str]) -> str:
    """A score table: long headers wrap, and with very many columns it scrolls sideways inside its own box
    rather than widening the page."""
    return (
        f'<div class="wide"><table class="scores"><thead>{head_row}</thead>'
        f"<tbody>{''.join(body_rows)}</tbody></table></div>"
    )


def site_columns(sites: Sequence[str]) -> list[tuple[str, str]]:
    """Columns of a per-site score table: the sites, then Client Avg and Global."""
    return [(s, s) for s in sites] + [("client_avg", "Client Avg"), ("global", "Global")]


# --------------------------------------------------------------------------- sections and page
@dataclass(frozen=True)
class Section:
    """A report section: ``title`` (plain text), ``body`` (HTML; None or "" = nothing to show,
    the section is left out) and ``note`` (HTML, shown under the body).

    A section a method family contributes (``Family.report_sections``) without a body adds its
    note to the run report's own section of the same title (e.g. how to read the family's
    validation curves)."""

    title: str
    body: str | None
    note: str = ""

    def html(self) -> str:
        return section(self.title, self.body, self.note)


def section(title: str, body: str | None, note: str = "") -> str:
    """``<h2>title</h2>`` + body + note; "" when there is no body."""
    if not body:
        return ""
    return f"<h2>{esc(title)}</h2>{body}" + (f'<p class="note">{note}</p>' if note else "")


CSS = """
body { font-family: -apple-system, "Segoe UI", Roboto, "Helvetica Neue", Arial, sans-serif; color: #1f2328;
       max-width: 1200px; margin: 24px auto; padding: 0 20px; line-height: 1.45; }
h1 { font-size: 1.6em; margin-bottom: 0.2em; }
h2 { font-size: 1.2em; margin-top: 2em; border-bottom: 1px solid #d0d7de; padding-bottom: 4px; }
h3 { font-size: 1.02em; margin: 1.2em 0 0; }
.meta { color: #57606a; margin: 0.2em 0; overflow-wrap: anywhere; }
.verdict { border: 1px solid #d0d7de; border-left: 5px solid #0072B2; background: #f6f8fa; padding: 8px 16px;
           margin: 18px 0 8px; }
.verdict .headline { font-size: 1.08em; margin: 4px 0; }
.verdict ul { margin: 4px 0; padding-left: 20px; }
.wide { max-width: 100%; overflow-x: auto; }
table.scores { border-collapse: collapse; margin: 10px 0 4px; font-size: 0.88em;
                font-variant-numeric: tabular-nums; }
table.scores th, table.scores td { padding: 4px 8px; border-bottom: 1px solid #eaeef2; text-align: right; }
table.scores td { white-space: nowrap; }
table.scores thead th { background: #f6f8fa; border-bottom: 2px solid #d0d7de; vertical-align: bottom;
                        max-width: 9em; overflow-wrap: anywhere; hyphens: auto; }
table.scores tbody th { text-align: left; font-weight: 600; max-width: 16em; overflow-wrap: anywhere; }
table.scores thead th:first-child { text-align: left; }
table.scores tr.group th, table.scores tr.group td { border-top: 2px solid #d0d7de; }
table.scores b { color: #0a58ca; }
.note { color: #57606a; font-size: 0.88em; margin: 4px 0 0; max-width: 980px; }
.legend { color: #57606a; font-size: 0.85em; margin: 2px 0 0; }
.legend b { color: #0a58ca; }
img { max-width: 100%; height: auto; display: block; margin: 10px 0; }
img.square { max-width: 560px; }
.tiles { display: flex; flex-wrap: wrap; gap: 4px 16px; align-items: flex-start; }
.tiles img.tile { max-width: 540px; width: calc(50% - 8px); margin: 10px 0 0; }
details { margin-top: 2em; }
summary { cursor: pointer; font-weight: 600; }
pre { background: #f6f8fa; padding: 12px; overflow-x: auto; font-size: 0.85em; white-space: pre-wrap; }
code { overflow-wrap: anywhere; }
"""


def page(title: str, parts: Iterable[str]) -> str:
    """A whole self-contained HTML page (no scripts, no network) of ``parts`` under ``<title>``."""
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f"<title>{esc(title)}</title>"
        f"<style>{CSS}</style></head><body>{''.join(parts)}</body></html>\n"
    )


#: ``src="figures/NAME.png"`` as the sections write it (the one form :func:`embed_figures` inlines).
FIGURE_SRC = re.compile(r'src="figures/([^"/\\]+\.png)"')


def embed_figures(text: str, root: str | Path, fig_dir: str | Path | None = None) -> str:
    """``text`` with every ``src="figures/NAME.png"`` replaced by the PNG's bytes as a
    ``data:image/png;base64,...`` URI (read from ``fig_dir/NAME.png``, by default ``root/figures/NAME.png``), so
    that the page keeps its figures when sent alone. Other ``src`` values, links and a missing file are left
    as they are."""
    fig_dir = Path(fig_dir) if fig_dir is not None else Path(root) / "figures"

    def inline(m: re.Match[str]) -> str:
        path = fig_dir / html.unescape(m.group(1))
        if not path.is_file():
            return m.group(0)
        return f'src="data:image/png;base64,{base64.b64encode(path.read_bytes()).decode("ascii")}"'

    return FIGURE_SRC.sub(inline, text)


def write_page(out: str | Path, title: str, parts: Iterable[str], drawn: Path | None = None) -> Path:
    """Write :func:`page` to ``out`` with its figures embedded (:func:`embed_figures`, relative to
    ``out``'s folder); returns ``out``. The one place every fedseg page is written.

    ``drawn``: the folder its figures were drawn into (:func:`fedseg.presentation.drafts.figure_draft`): they are
    embedded from there and, once the page is written, replace the PNGs of ``figures/`` beside it
    (:func:`~fedseg.presentation.drafts.replace_figures`), the page and the figures changed together
    (:func:`~fedseg.interrupts.deferred_interrupts`)."""
    out = Path(out)
    text = embed_figures(page(title, parts), out.parent, drawn)
    with deferred_interrupts():
        atomic_write_text(out, text)  # never half a page (a full disk); before the figures: it may fail
        if drawn is not None:
            replace_figures(drawn, out.parent / "figures")
    return out
