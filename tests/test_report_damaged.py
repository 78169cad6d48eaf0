"""``fedseg report`` on a run, study or bench whose files are damaged or edited by hand: one line naming the file
and what is wrong, never a traceback nor a "successful" page of dashes; the previous report.html and figures/ left
as they were when a render fails or is interrupted (Ctrl-C, SIGTERM: exit 130 and how to draw it again). Found by
an audit; each case here printed a traceback, a bare ``error: ... case``, or exit 0 before."""

from __future__ import annotations

import csv
import json
import os
import shutil
import signal
from pathlib import Path

import pytest
from typer.testing import CliRunner

from fedseg.cli import app
from fedseg.interrupts import deferred_interrupts
from fedseg.presentation.drafts import figure_draft
from fedseg.presentation.kit import write_page
from fedseg.report.html import render_report
from fedseg.studies import unseen_columns, write_table
from test_report import SITES, make_run

RESULTS_HEADER = "algorithm,model,site,case,region,metric,value"
BENCH = Path(__file__).parents[1] / "benchmarks" / "results" / "headline"


def _report(folder: Path):
    return CliRunner().invoke(app, ["report", str(folder)])


def _one_error_line(result, code: int = 1) -> str:
    lines = [line for line in result.output.strip().splitlines() if line.strip()]
    assert result.exit_code == code, result.output
    assert len(lines) == 1 and lines[0].startswith("error: "), result.output
    return lines[0]


def _state(folder: Path) -> dict[str, bytes]:
    """The report's files as they are: report.html, figures/*, and any hidden draft folder's files."""
    files = [folder / "report.html", *sorted(folder.glob("figures/*")), *sorted(folder.glob(".figures-*/*"))]
    return {str(p.relative_to(folder)): p.read_bytes() for p in files if p.is_file()}


@pytest.fixture(scope="module")
def drawn_run(tmp_path_factory) -> Path:
    """A hand-made run (:func:`test_report.make_run`) with its report drawn."""
    run = make_run(tmp_path_factory.mktemp("damaged") / "run")
    render_report(run)
    assert {"figures/validation.png", "figures/samples.png", "figures/cross_site.png"} <= set(_state(run))
    return run


@pytest.fixture
def run(drawn_run, tmp_path) -> Path:
    copy = tmp_path / "run"
    shutil.copytree(drawn_run, copy)
    return copy


def _drop_column(path: Path, column: str) -> None:
    with open(path, newline="") as f:
        rows = list(csv.reader(f))
    i = rows[0].index(column)
    with open(path, "w", newline="") as f:
        csv.writer(f).writerows(r[:i] + r[i + 1 :] for r in rows)


def _edit_summary(path: Path, edit) -> None:
    summary = json.loads(path.read_text())
    edit(summary)
    path.write_text(json.dumps(summary))


def _cut(path: Path, at: int) -> None:
    path.write_bytes(path.read_bytes()[:at])


def _offset(path: Path, line: int, fields: int) -> int:
    """Where ``fields`` fields of line ``line`` (1-based) of ``path`` end (before the comma after them)."""
    lines = path.read_bytes().split(b"\n")
    return sum(len(x) + 1 for x in lines[: line - 1]) + len(b",".join(lines[line - 1].split(b",")[:fields]))


BINARY = b"\xff\xfe\x00PK\x03\x04\x80"

RUN_DAMAGES = {  # name: (damage of the run folder, what the line says after "<file>: ")
    **{
        f"results.csv without {c}": (
            lambda run, c=c: _drop_column(run / "results.csv", c),
            (
                "results.csv",
                f"no column {c!r} (its header: {RESULTS_HEADER.replace(',' + c, '').replace(c + ',', '')})",
            ),
        )
        for c in ("case", "site", "metric", "region", "algorithm", "model", "value")
    },
    "rounds.csv without its first column": (
        lambda run: _drop_column(run / "rounds.csv", "algorithm"),
        ("rounds.csv", "no column 'algorithm' (its header: round,site,val_dice,train_loss)"),
    ),
    "binary results.csv": (
        lambda run: (run / "results.csv").write_bytes(BINARY),
        ("results.csv", "not UTF-8 text (at byte offset 0)"),
    ),
    "binary config.yaml": (
        lambda run: (run / "config.yaml").write_bytes(b"seed: 0\n" + BINARY),
        ("config.yaml", "not UTF-8 text (at byte offset 8)"),
    ),
    "empty results.csv": (
        lambda run: (run / "results.csv").write_text(""),
        ("results.csv", f"empty, without a header (expected the columns {RESULTS_HEADER})"),
    ),
    "results.csv cut mid-row": (
        lambda run: _cut(run / "results.csv", _offset(run / "results.csv", line=5, fields=4)),
        ("results.csv", "line 5 has 4 fields, the header 7 (cut short?)"),
    ),
    "a value that is not a number": (
        lambda run: (run / "results.csv").write_text(f"{RESULTS_HEADER}\nfedavg,global,A,A1,disc,dice,0.8x\n"),
        ("results.csv", "line 2: value '0.8x' is not a number"),
    ),
    "summary.json without sites": (
        lambda run: _edit_summary(run / "summary.json", lambda s: s.pop("sites")),
        ("summary.json", "no sites (a list of the federation's site names)"),
    ),
    "summary.json without algorithms": (  # not "the run was stopped": a finished run's file was edited
        lambda run: _edit_summary(run / "summary.json", lambda s: s.pop("algorithms")),
        ("summary.json", "no algorithms (an object of each finished method's results)"),
    ),
    "summary.json a list": (
        lambda run: (run / "summary.json").write_text("[]"),
        ("summary.json", "not a JSON object but an empty list"),
    ),
    "a method's dice null": (
        lambda run: _edit_summary(run / "summary.json", lambda s: s["algorithms"]["fedavg"].update(dice=None)),
        ("summary.json", "algorithms.fedavg.dice is null, not an object"),
    ),
    "a cross-site row null": (
        lambda run: _edit_summary(
            run / "summary.json", lambda s: s["algorithms"]["local"]["cross_site"]["dice"].update(B=None)
        ),
        ("summary.json", "algorithms.local.cross_site.dice.B is null, not an object"),
    ),
    "a selected round that is text": (
        lambda run: _edit_summary(run / "summary.json", lambda s: s["algorithms"]["fedavg"].update(best_round="3")),
        ("summary.json", "algorithms.fedavg.best_round is a string ('3'), not a whole number"),
    ),
}


@pytest.mark.parametrize("damage", RUN_DAMAGES, ids=list(RUN_DAMAGES))
def test_a_damaged_file_of_a_run_is_named_and_the_old_report_stays(run, damage):
    before = _state(run)
    edit, (file, what) = RUN_DAMAGES[damage]
    edit(run)
    line = _one_error_line(_report(run))
    assert line.startswith(f"error: the report was not drawn: {run / file}: {what}"), line
    assert _state(run) == before  # nothing drawn, nothing deleted, no draft folder left


def test_a_cut_short_sample_is_left_out_and_said(run):
    sample = run / "samples" / "fedavg__B.npz"
    _cut(sample, 200)
    result = _report(run)
    assert result.exit_code == 0, result.output
    note = "note: left out of the report: samples/fedavg__B.npz (cannot be read: damaged or cut short)"
    assert note in result.output, result.output
    html = (run / "report.html").read_text()
    assert "Left out of the report: samples/fedavg__B.npz" in html and "example predictions" in html


def test_an_unparseable_config_yaml_is_left_out_and_said(run):
    """Its sections (the data line, the methods not finished) were left out in silence."""
    (run / "config.yaml").write_text("algorithms: [\n")
    result = _report(run)
    assert result.exit_code == 0, result.output
    assert "note: left out of the report: config.yaml (cannot be read: damaged or cut short)" in result.output
    assert "Left out of the report: config.yaml" in (run / "report.html").read_text()


def test_a_render_that_fails_midway_leaves_the_old_report_and_figures(run, monkeypatch):
    """The figures are drawn aside: a failure after some are drawn (here: the cost table) changes nothing."""
    before = _state(run)

    def fail(_run):
        assert any(run.glob(".figures-*/validation.png"))  # drawn, not yet in figures/
        raise ValueError("the cost table cannot be drawn")

    monkeypatch.setattr("fedseg.report.html.cost_section", fail)
    line = _one_error_line(_report(run))
    assert line == "error: the report was not drawn: the cost table cannot be drawn"
    assert _state(run) == before


@pytest.mark.parametrize("how", ["ctrl-c", "sigterm"])
def test_an_interrupted_report_exits_130_with_one_line_and_leaves_the_old_one(run, monkeypatch, how):
    before = _state(run)

    def interrupt(_run):
        if how == "ctrl-c":
            raise KeyboardInterrupt
        os.kill(os.getpid(), signal.SIGTERM)  # `fedseg report` turns it into the same interrupt
        return None

    monkeypatch.setattr("fedseg.report.html.cost_section", interrupt)
    line = _one_error_line(_report(run), 130)
    assert line == f"error: interrupted: the report was not drawn; run `fedseg report {run}` again"
    assert _state(run) == before
    if how == "sigterm":
        monkeypatch.undo()
        assert _report(run).exit_code == 0  # the line's command draws it


@pytest.fixture
def ctrl_c_raises():
    """Ctrl-C raises KeyboardInterrupt in this process for the test, as in a terminal's foreground job (a suite
    started in the background, as a shell starts a job with `&`, has SIGINT ignored)."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, previous)


def test_an_interrupt_while_the_page_and_figures_are_replaced_acts_after_them(ctrl_c_raises):
    reached = False
    with pytest.raises(KeyboardInterrupt):
        with deferred_interrupts():
            os.kill(os.getpid(), signal.SIGINT)
            reached = True
    assert reached


class _Finalized:
    """An object whose finalizer receives Ctrl-C: Python prints its KeyboardInterrupt as "Exception ignored" and
    drops it (as when the garbage collector frees a figure while a report is drawn)."""

    def __del__(self):
        os.kill(os.getpid(), signal.SIGINT)


def test_an_interrupt_python_drops_in_a_finalizer_still_stops_the_render(tmp_path, capsys, ctrl_c_raises):
    with pytest.raises(KeyboardInterrupt):
        with figure_draft(tmp_path) as fig_dir:
            _Finalized()
            write_page(tmp_path / "report.html", "page", ["<p>drawn</p>"], drawn=fig_dir)
    assert not (tmp_path / "report.html").exists() and not list(tmp_path.iterdir())
    assert "Exception ignored" not in capsys.readouterr().err


# --------------------------------------------------------------------------- studies
@pytest.fixture
def study(drawn_run, tmp_path) -> Path:
    """A holdout study as ``fedseg run --holdout A`` lays it out: study.json, unseen.csv and the sub-run."""
    root = tmp_path / "study"
    shutil.copytree(drawn_run, root / "holdout" / "A")
    (root / "study.json").write_text(json.dumps({"kind": "holdout", "runs": {"A": "holdout/A"}, "config": {}}))
    row = {"algorithm": "fedavg", "unseen_site": "A", "cases": 2, "dice": 0.5, "run": "holdout/A"}
    write_table(root, "unseen", unseen_columns(SITES), [row])
    return root


STUDY_DAMAGES = {
    "study.json cut short": (lambda root: _cut(root / "study.json", 30), ("study.json", "not valid JSON (")),
    "study.json a list": (lambda root: (root / "study.json").write_text("[]"), ("study.json", "not a JSON object")),
    "study.json runs a list": (
        lambda root: (root / "study.json").write_text('{"runs": ["holdout/A"]}'),
        ("study.json", "runs is a list, not an object of each run's folder"),
    ),
    "binary unseen.csv": (
        lambda root: (root / "unseen.csv").write_bytes(BINARY),
        ("unseen.csv", "not UTF-8 text (at byte offset 0)"),
    ),
    "unseen.csv without algorithm": (
        lambda root: _drop_column(root / "unseen.csv", "algorithm"),
        ("unseen.csv", "no column 'algorithm' (its header: unseen_site,cases,gamma,freq_GM,freq_PM_A,"),
    ),
    "a sub-run's damaged summary": (
        lambda root: (root / "holdout" / "A" / "summary.json").write_text("[]"),
        ("holdout/A/summary.json", "not a JSON object but an empty list"),
    ),
}


def test_a_study_report_is_drawn(study):
    result = _report(study)
    assert result.exit_code == 0, result.output
    assert "Unseen sites" in (study / "report.html").read_text()


@pytest.mark.parametrize("damage", STUDY_DAMAGES, ids=list(STUDY_DAMAGES))
def test_a_damaged_file_of_a_study_is_named(study, damage):
    edit, (file, what) = STUDY_DAMAGES[damage]
    edit(study)
    line = _one_error_line(_report(study))
    assert line.startswith(f"error: the report was not drawn: {study / file}: {what}"), line
    assert not (study / "report.html").exists() and not list(study.glob(".figures-*"))


# --------------------------------------------------------------------------- benches
@pytest.mark.parametrize(
    ("field", "what"),
    [
        ("regions", "federations.synthetic-retina has no 'regions'"),
        ("local_avg", "KeyError: 'local_avg'"),  # a field the check does not list: named by the table that needs it
    ],
)
def test_a_bench_tables_json_without_a_field_is_named_and_nothing_is_rewritten(tmp_path, field, what):
    bench = tmp_path / "bench"
    shutil.copytree(BENCH, bench)
    content = json.loads((bench / "tables.json").read_text())
    for fed in content["federations"].values():
        for entry in [fed, *fed["methods"].values()]:
            entry.pop(field, None)
    (bench / "tables.json").write_text(json.dumps(content))
    before = {p.name: p.read_bytes() for p in bench.rglob("*") if p.is_file()}
    line = _one_error_line(_report(bench))
    assert line == f"error: {bench / 'tables.json'}: not a bench's tables ({what})", line
    assert {p.name: p.read_bytes() for p in bench.rglob("*") if p.is_file()} == before


@pytest.mark.parametrize("file", ["rounds.csv", "ledger.csv"])
def test_a_training_file_cut_at_a_row_boundary_is_named(run, file):
    """Cut at a line boundary, rounds.csv and ledger.csv read as valid CSV: the report drew shorter validation curves
    and smaller costs without a word (a fresh-eyes audit). Each is checked against summary.json."""
    before = _state(run)
    lines = (run / file).read_text().splitlines(keepends=True)
    (run / file).write_text("".join(lines[: len(lines) // 3]))
    line = _one_error_line(_report(run))
    said = "validation rows stop at round" if file == "rounds.csv" else "SGD steps where summary.json reports"
    assert line.startswith(f"error: the report was not drawn: {run / file}: "), line
    assert said in line and "cut short or edited" in line, line
    assert _state(run) == before
