"""A bench's three phases (``fedseg.bench.plan``) run one after another: budget references, tuning on validation,
final runs; the budget each reference sets; what an existing ``OUT`` may hold.

``OUT/bench.json`` records the bench; resuming with a different bench is refused before any work, except one
with methods appended at the end of ``methods`` (a bench grown over several sittings) or other ``comparisons`` or
``tests`` (they change only the tables). Once a run has finished, ``bench.json`` keeps the ``comparisons`` and
``tests`` it had (chosen before any result): a later choice is recorded as one made after results existed
(``fedseg.bench.report.record_analysis_changes``), even if the bench is interrupted again before its tables.
"""

from __future__ import annotations

import contextlib
import json
from dataclasses import dataclass, field, replace
from pathlib import Path

from fedseg.atomic_files import atomic_write_text, strict_json_text
from fedseg.bench.execute import DONE_FILE, Echo, Finished, Runner, job_registrations
from fedseg.bench.plan import (
    BenchRun,
    Holdouts,
    Selected,
    check_data,
    check_plan,
    final_runs,
    holdout_sites,
    is_budget_reference,
    phased,
    reference_runs,
    tuning_runs,
)
from fedseg.bench.select import select_settings
from fedseg.bench.spec import BenchSpec
from fedseg.folder_lock import holding
from fedseg.run.preflight import check_out_kind
from fedseg.run.said_once import said_once

BENCH_FILE = "bench.json"
TABLES_ONLY = {"comparisons", "tests"}  # bench keys that change no run, only the tables: a resume may change them


def budget_caps(bench: BenchSpec, references: dict[BenchRun, Finished]) -> dict[tuple[str, int, int], tuple[str, ...]]:
    """Per cell, the ``fl.stop`` budget every other run gets: the reference's cost per trained round x
    ``budget.rounds`` (its SGD steps, Eq. 34, or simulated hours, Eq. 36-38)."""
    caps: dict[tuple[str, int, int], tuple[str, ...]] = {}
    for run, fin in references.items():
        entry = next(iter(fin.summary["algorithms"].values()))
        trained, rounds = entry["convergence"]["rounds"], bench.budget.rounds
        if bench.budget.rule == "sgd_steps":
            steps = -(-int(entry["cost"]["sgd_steps"]) * rounds // trained)  # ceil, exact in integers
            caps[run.cell] = (f"fl.stop.sgd_steps={steps}",)
        else:
            hours = entry["cost"]["simulated_hours"] * rounds / trained
            caps[run.cell] = (f"fl.stop.simulated_hours={hours!r}",)
    return caps


def with_caps(bench: BenchSpec, runs: list[BenchRun], caps: dict) -> list[BenchRun]:
    """``runs`` with their cell's budget cap; none for the budget reference and for a phased method (FedSM-extra):
    its first phase cannot be stopped, so a cap would stop it at the start of its second phase (its selector after
    one round), not at the budget; it trains ``budget.rounds`` model rounds and its own phases on top instead."""
    return [r if uncapped(bench, r) else replace(r, caps=caps.get(r.cell, ())) for r in runs]


def uncapped(bench: BenchSpec, run: BenchRun) -> bool:
    method = bench.method(run.method)
    return is_budget_reference(bench, method, run.setting) or phased(method)


def check_out(bench: BenchSpec, out: Path, resume: bool) -> dict | None:
    """``OUT`` holds no bench (or, with ``resume``, this same bench, but for ``TABLES_ONLY`` keys) and no run,
    study or federation (``fedseg.run.preflight.check_out_kind``), before any work; the bench recorded there
    (:func:`as_recorded`), or None."""
    check_out_kind(out, "bench")
    recorded = out / BENCH_FILE
    if not recorded.is_file():
        return None
    if not resume:
        raise FileExistsError(f"{out}: already holds a bench; use --resume to continue it or choose another --out")
    try:
        old = as_recorded(json.loads(recorded.read_text()))
    except ValueError as e:
        raise ValueError(f"{recorded}: not a bench record ({e})") from None
    if not isinstance(old, dict):
        raise ValueError(f"{recorded}: not a bench record (a JSON object expected)")
    new = bench.model_dump(mode="json")
    keys = sorted(k for k in set(old) | set(new) if old.get(k) != new.get(k) and k not in TABLES_ONLY)
    if keys and not (keys == ["methods"] and new["methods"][: len(old["methods"])] == old["methods"]):
        raise ValueError(  # (methods appended at the end: every finished run is still one of this bench's)
            f"{recorded}: cannot resume a different bench (methods may only be appended at the end); "
            f"it differs in: {'; '.join(spec_change(k, old, new, 80) for k in keys)}"
        )
    return old


def as_recorded(spec: object) -> object:
    """A bench recorded by some fedseg (``bench.json``, the ``bench`` of ``tables.json``) as this one records it:
    fields added since at their defaults, but ``data_seed`` at per-seed (a bench recorded before it existed took its
    runs' data from their seed); as written where it does not validate."""
    if isinstance(spec, dict):
        spec = {"data_seed": "per-seed", **spec}
    try:
        return BenchSpec.model_validate(spec).model_dump(mode="json")
    except ValueError:
        return spec


def record_bench(bench: BenchSpec, out: Path, recorded: dict | None) -> None:
    """Write ``OUT/bench.json``: ``bench``, but once a run has finished, with the ``TABLES_ONLY`` keys of the bench
    ``recorded`` there before (:func:`check_out`): the tests and comparisons chosen before any result, which
    :func:`fedseg.bench.report.record_analysis_changes` compares a later choice with until tables exist."""
    content = bench.model_dump(mode="json")
    if recorded is not None and any((out / "runs").rglob(DONE_FILE)):
        content.update({key: recorded[key] for key in TABLES_ONLY if key in recorded})
    atomic_write_text(out / BENCH_FILE, strict_json_text(content, indent=1))


def spec_change(key: str, old: dict, new: dict, width: int | None = None) -> str:
    """``key: old -> new`` of two bench specs (JSON values). With ``width``: only what differs, each value cut to
    ``width`` characters: a mapping's keys (``budget.rounds: 30 -> 20``), a list's elements (``set[5]: "a" -> "b"``;
    entries with a name by it: ``methods[fedprox].set[0]``), or what only one side of a list has (``set: without
    "a", with "b"``); a list that fits in ``width`` whole (``seeds: [0, 1] -> [0, 1, 2]``)."""
    return "; ".join(_changes(key, old.get(key), new.get(key), width))


def _changes(path: str, old: object, new: object, width: int | None) -> list[str]:
    if old == new:
        return []
    if width is not None and isinstance(old, dict) and isinstance(new, dict):
        return [c for k in dict.fromkeys([*old, *new]) for c in _changes(f"{path}.{k}", old.get(k), new.get(k), width)]
    if (
        width is None
        or not (isinstance(old, list) and isinstance(new, list))
        or max(len(_json(old)), len(_json(new))) <= width
    ):
        return [f"{path}: {_cut(old, width)} -> {_cut(new, width)}"]
    labels = [
        [e["name"] if isinstance(e, dict) and "name" in e else i for i, e in enumerate(side)] for side in (old, new)
    ]
    if labels[0] == labels[1]:  # element by element (a list of the same length, or of the same named entries)
        return [c for label, a, b in zip(labels[0], old, new) for c in _changes(f"{path}[{label}]", a, b, width)]
    sides = (("without", [e for e in old if e not in new]), ("with", [e for e in new if e not in old]))
    parts = [f"{word} {', '.join(_cut(e, width) for e in only)}" for word, only in sides if only]
    return [f"{path}: {', '.join(parts) or 'the same elements in another order'}"]


def _json(value: object) -> str:
    return json.dumps(value, separators=(", ", ": "))


def _cut(value: object, width: int | None) -> str:
    """``value`` as JSON, cut to ``width`` characters."""
    s = _json(value)
    return s if width is None or len(s) <= width else s[: width - 1] + "…"


@dataclass
class BenchRuns:
    """Everything a bench ran: the tuning runs, the selection, the final runs."""

    tuning: dict[BenchRun, Finished]
    selected: Selected  # fedseg.bench.plan.selection_key -> the setting selected on validation
    final: dict[BenchRun, Finished]
    holdouts: Holdouts = field(default_factory=dict)  # a leave-one-out federation's sites: its folds


ONE_SEED_NOTE = (
    "note: seeds: {seeds} is one seed: no comparison of the tables can get a † (its CI has no run-to-run variance: "
    "a difference between two trained models, not yet between two methods); give at least 2, e.g. seeds: [0, 1, 2]"
)


def run_bench(
    bench: BenchSpec,
    root: Path,
    out: Path,
    jobs: int = 1,
    resume: bool = False,
    echo: Echo = print,
    train: bool = True,
) -> BenchRuns:
    """Run (or resume) every phase of ``bench`` into ``out``; the finished runs (tables: ``fedseg.bench.report``).
    ``train`` False: train nothing, collect the runs finished so far (a bench still running, or stopped): methods
    whose tuning is not finished have no final runs, and the tables say how many runs each number rests on."""
    out = Path(out)
    check_plan(bench, root)
    registered = job_registrations(bench) if jobs > 1 and train else ()  # sent to the runs' processes: checked now
    if not train and not (out / BENCH_FILE).is_file():
        raise FileNotFoundError(f"{out}: holds no bench ({BENCH_FILE}); run `fedseg bench` first")
    recorded = check_out(bench, out, resume or not train)  # --tables-only: the tables are of the bench recorded there
    holdouts = holdout_sites(bench, root)
    if train:
        check_data(bench, root, holdouts, out)  # before anything is written: every federation, fold and site
        if len(bench.seeds) == 1:  # the default too: a bench without seeds:
            echo(ONE_SEED_NOTE.format(seeds=list(bench.seeds)))
        out.mkdir(parents=True, exist_ok=True)
    held = holding(out) if train else contextlib.nullcontext()  # one bench trains in this folder (not --tables-only)
    with held, said_once():  # a note its runs share (e.g. eval.hd95_worst's) shown by the first only
        if train:
            record_bench(bench, out, recorded)
        return run_phases(bench, root, out, Runner(bench, root, out, jobs, echo, train, registered), holdouts)


def run_phases(bench: BenchSpec, root: Path, out: Path, runner: Runner, holdouts: Holdouts) -> BenchRuns:
    """``run_bench``'s phases: budget references, tuning on validation (in two stages where a method's settings
    come from another's), the final runs at the selected settings."""
    caps = budget_caps(bench, runner.execute(reference_runs(bench, holdouts), "budget references"))
    planned = with_caps(bench, tuning_runs(bench, holdouts), caps)
    tuning = runner.execute(planned, "tuning on validation")
    selected = select_settings(bench, tuning, planned)
    if any(m.settings_from and m.grid for m in bench.methods):  # two-stage tuning: at the selected settings
        second = with_caps(bench, tuning_runs(bench, holdouts, selected), caps)
        tuning.update(runner.execute(second, "tuning on validation, at the settings_from settings"))
        selected.update(select_settings(bench, tuning, second))
    final = runner.execute(with_caps(bench, final_runs(bench, selected, holdouts), caps), "final runs")
    return BenchRuns(tuning, selected, final, holdouts)
