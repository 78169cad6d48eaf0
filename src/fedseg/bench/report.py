"""A bench's output files: ``results.csv``, ``tuning.csv``, ``tables.json``, ``tables.md``, ``tables.tex`` (the same
tables as LaTeX for a paper), ``report.html`` + figures: written from the runs (:func:`write_report`), or again
from ``tables.json`` alone (:func:`rewrite_report`). The tables' rows: :mod:`fedseg.bench.table_rows`; their legend:
:mod:`fedseg.bench.legend`; as Markdown, LaTeX and HTML: :mod:`fedseg.bench.render`.

``tables.json`` is strict JSON: a number that is not finite (NaN: no std of one seed, no p without a pair) is
``null`` (:func:`fedseg.atomic_files.json_ready`), read back as missing exactly as NaN was (a ``tables.json``
written before, with bare ``NaN``, still reads).
"""

from __future__ import annotations

import json
from pathlib import Path

from fedseg.atomic_files import atomic_write_text, strict_json_text
from fedseg.bench.execute import Echo
from fedseg.bench.phases import BENCH_FILE, TABLES_ONLY, BenchRuns, as_recorded, spec_change
from fedseg.bench.render import html_parts, latex, markdown
from fedseg.bench.select import method_edges, tuning_rows
from fedseg.bench.spec import BenchSpec
from fedseg.bench.tables import RESULT_COLUMNS, correct_tests, federation_tables
from fedseg.presentation import kit
from fedseg.presentation.drafts import figure_draft
from fedseg.presentation.files import kind_of
from fedseg.run.outputs import csv_text
from fedseg.run.provenance import utc_now

TUNING_COLUMNS = [
    "federation",
    "method",
    "setting",
    "val_dice",
    "test_dice",
    "runs",
    "rounds",
    "sgd_steps",
    "plateau_stops",
    "not_converged",
    "selected",
    "at_edge",
]


def tuning_columns(bench: BenchSpec) -> list[str]:
    """``tuning.csv``'s columns: :data:`TUNING_COLUMNS`, with ``fold`` after ``method`` under ``tune.per_fold``
    (and ``held_out``, a leave-one-out fold's held-out site, after it where a federation is leave-one-out)."""
    if not bench.tune.per_fold:
        return TUNING_COLUMNS
    at = TUNING_COLUMNS.index("method") + 1
    held_out = ["held_out"] if any(f.leave_one_out for f in bench.federations) else []
    return [*TUNING_COLUMNS[:at], "fold", *held_out, *TUNING_COLUMNS[at:]]


def write_report(bench: BenchSpec, runs: BenchRuns, out: Path, echo: Echo | None = None) -> dict:
    """Write every output file of a finished bench into ``out``; returns the ``tables.json`` content. A change of
    its tests or comparisons since the tables were last written is recorded first (:func:`record_analysis_changes`,
    its notes to ``echo``)."""
    out = Path(out)
    tables, rows = federation_tables(bench, runs)
    tuning = tuning_rows(bench, runs.tuning, runs.selected, runs.holdouts)
    for fed, t in tables.items():  # a tie's edge stands only for a key every tied setting shares
        for name, stats in t["methods"].items():
            tuned = [r for r in tuning if r["federation"] == fed and r["method"] == name]
            stats["at_edge"] = method_edges(stats["at_edge"], tuned)[0]
    changes = record_analysis_changes(bench, len(runs.tuning) + len(runs.final), out, echo)
    atomic_write_text(out / "results.csv", csv_text(RESULT_COLUMNS, rows))
    atomic_write_text(out / "tuning.csv", csv_text(tuning_columns(bench), tuning))
    content = {"bench": bench.model_dump(mode="json"), "tuning": tuning, "federations": tables, "scipy": _scipy()}
    if changes:
        content["analysis_changes"] = changes
    _write_tables(bench, content, out)
    return content


def _scipy() -> str:
    """The scipy version that computed the tables' p values (their method is recorded with each test)."""
    import scipy

    return str(scipy.__version__)


ANALYSIS_CHANGES = "analysis-changes.txt"


def record_analysis_changes(bench: BenchSpec, finished: int, out: Path, echo: Echo | None = None) -> list[str]:
    """Every change of the tables' tests or comparisons (``TABLES_ONLY``) made after runs had finished, as lines of
    ``OUT/analysis-changes.txt`` (UTC time, ``key: old -> new``, the ``finished`` runs), this one appended when
    ``bench`` differs from the bench of the tables last written (``tables.json``: what readers last saw; a resume
    refused before, or the same ``--tables-only`` again, adds nothing) or, before any tables, from the bench recorded
    in ``bench.json`` (whose tests and comparisons a resumed bench keeps from before its first finished run:
    ``fedseg.bench.phases.record_bench``), its note to ``echo``. Choosing a test's side or a comparison after seeing
    results is a choice the tables must tell their reader of."""
    path = out / ANALYSIS_CHANGES
    shown = _analysis_shown(out)
    new = bench.model_dump(mode="json")
    changed = [spec_change(k, shown, new) for k in sorted(TABLES_ONLY) if shown and shown.get(k) != new.get(k)]
    if changed and finished:
        lines = [f"{utc_now()} {change} (after {finished} finished runs)" for change in changed]
        with open(path, "a") as f:
            f.write("".join(line + "\n" for line in lines))
        say = echo or (lambda _: None)
        for line in lines:
            say(f"note: changed after results existed, and the tables say so ({path}): {line}")
    return path.read_text().splitlines() if path.is_file() else []


def _analysis_shown(out: Path) -> dict | None:
    """The bench a change of tests or comparisons is measured from (:func:`record_analysis_changes`): that of the
    tables last written, else the one recorded in ``bench.json`` (both as this fedseg records them); None where
    neither can be read."""
    for path, key in ((out / TABLES_JSON, "bench"), (out / BENCH_FILE, None)):
        try:
            content = json.loads(path.read_text())
            spec = as_recorded(content[key] if key else content)
        except (OSError, ValueError, KeyError, TypeError):
            continue
        if isinstance(spec, dict):
            return spec
    return None


TABLES_JSON = "tables.json"


def rewrite_report(out: Path) -> Path:
    """Render a bench's ``tables.md`` and ``report.html`` again from its ``tables.json`` alone (``fedseg report``
    on a bench folder), each family of comparisons Holm-corrected by the current rules
    (:func:`fedseg.bench.tables.correct_tests`; a bench written before them gains ``p_holm``). The runs are not
    read: their folders may be gone. A ValueError naming the file where it cannot be read or lacks a field the
    tables show (then nothing is written)."""
    out = Path(out)
    bench, content = read_tables(out / TABLES_JSON)
    try:
        _write_tables(bench, content, out)
    except (KeyError, TypeError, AttributeError, IndexError) as e:  # a field :func:`check_tables` does not check
        raise ValueError(_not_tables(out / TABLES_JSON, e)) from None
    return out / "report.html"


def _not_tables(path: Path, problem: BaseException | str) -> str:
    """``PATH: not a bench's tables (problem)``, an exception as ``Type: its first line``."""
    if isinstance(problem, BaseException):
        problem = f"{type(problem).__name__}: {(str(problem).splitlines() or [''])[0][:160]}"
    return f"{path}: not a bench's tables ({problem})"


#: the fields of ``tables.json`` the tables index, per federation and per method: ``{key: (JSON type, its name)}``
OBJECT, LIST = (dict, "an object"), (list, "a list")
FEDERATION_FIELDS = {"methods": OBJECT, "regions": LIST, "sites": LIST, "runs": ((int, float), "a number")}
METHOD_FIELDS = {
    "setting": (str, "a string"),
    **dict.fromkeys(("convergence", "regions", "sites", "site_wilcoxon", "cost"), OBJECT),
}


def check_tables(content: dict) -> str | None:
    """The first field of :data:`FEDERATION_FIELDS` / :data:`METHOD_FIELDS` that a federation or method of
    ``tables.json`` ``content`` lacks or holds as another type (``federations.X has no 'regions'``); None when none."""
    feds = content.get("federations")
    if not isinstance(feds, dict):
        return f"federations is {kind_of(feds)}, not an object"
    for name, fed in feds.items():
        if bad := _lacks(fed, FEDERATION_FIELDS, f"federations.{name}"):
            return bad
        for method, entry in fed["methods"].items():
            if bad := _lacks(entry, METHOD_FIELDS, f"federations.{name}.methods.{method}"):
                return bad
    return None


def _lacks(entry: object, fields: dict[str, tuple], where: str) -> str | None:
    if not isinstance(entry, dict):
        return f"{where} is {kind_of(entry)}, not an object"
    for key, (kind, name) in fields.items():
        if key not in entry:
            return f"{where} has no {key!r}"
        if not isinstance(entry[key], kind) or isinstance(entry[key], bool):
            return f"{where}.{key} is {kind_of(entry[key])}, not {name}"
    return None


def read_tables(path: Path) -> tuple[BenchSpec, dict]:
    """A bench's ``tables.json`` (its spec and content), each family of comparisons Holm-corrected by the current
    rules (:func:`fedseg.bench.tables.correct_tests`). A non-finite number reads as it was written: ``null``
    (:func:`fedseg.atomic_files.json_ready`) or, in a file written before, ``NaN``; the tables render either as
    missing. A ValueError naming the file where it cannot be read."""
    try:
        content = json.loads(Path(path).read_text())
        bench = BenchSpec.model_validate(content["bench"])
        if bad := check_tables(content):
            raise ValueError(_not_tables(path, bad))
        for fed in content["federations"].values():
            correct_tests(fed)
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
        raise ValueError(str(e) if str(e).startswith(str(path)) else _not_tables(path, e)) from None
    return bench, content


def _write_tables(bench: BenchSpec, content: dict, out: Path) -> None:
    """``tables.json`` (strict JSON: :func:`fedseg.atomic_files.json_ready`), ``tables.md``, ``tables.tex`` and
    ``report.html`` (+ figures) of ``content`` into ``out``: all rendered (the figures aside,
    :mod:`fedseg.presentation.drafts`) before any is written, so a field the tables cannot show leaves the previous
    files as they were."""
    tables, tuning, changes = content["federations"], content["tuning"], content.get("analysis_changes", [])
    md, tex = markdown(bench, tables, tuning, changes), latex(bench, tables, tuning, changes)
    with figure_draft(out) as fig_dir:
        parts = html_parts(bench, tables, tuning, fig_dir, changes)
        atomic_write_text(out / TABLES_JSON, strict_json_text(content, indent=1))
        atomic_write_text(out / "tables.md", md)
        atomic_write_text(out / "tables.tex", tex)
        kit.write_page(out / "report.html", f"fedseg bench {bench.name}", parts, drawn=fig_dir)
