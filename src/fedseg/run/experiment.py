"""A whole run: every check before any work, ``config.yaml`` recorded, then every algorithm trained in turn
(``fedseg.run.loop.run_algorithm``) and the run's outputs written after each."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from fedseg.accel import resolve
from fedseg.algorithms import check_method_names, check_sites, get_algorithm, plugin_records
from fedseg.atomic_files import atomic_write_text, check_out_creatable, strict_json_text
from fedseg.config import RunConfig
from fedseg.config_load import dump_config, error_text
from fedseg.data.federation import Federation
from fedseg.engine.base import Observer
from fedseg.engine.faults import check_fault_sites
from fedseg.engine.forkserver import start_forkserver
from fedseg.folder_lock import holding
from fedseg.run.checks import (
    check_sampling,
    check_secure_aggregation,
    cost_warnings,
    data_notes,
    device_notes,
    dicom_modalities,
    method_notes,
    prepared_notes,
    spacing_notes,
)
from fedseg.run.data_record import RECORD as DATA_RECORD
from fedseg.run.data_record import check_data_files, check_data_origin, record_data_files
from fedseg.run.engines import EngineFactory, local_engines
from fedseg.run.extend import (
    check_extension,
    extended_algorithms,
    reopen_finished,
    resume_progress,
    rounds_left_text,
    unstarted_algorithms,
)
from fedseg.run.loop import run_algorithm
from fedseg.run.method_record import check_method_options, code_notes, fedseg_notes, plugin_notes, write_record
from fedseg.run.outputs import RunResults, write_outputs
from fedseg.run.preflight import (
    check_device,
    check_out_dir,
    check_out_kind,
    check_out_outside,
    check_resume,
    recorded_config,
    resume_notes,
)
from fedseg.run.preparation import PLAN_FILE, Prepared, folder_root, prepare, prepare_planned
from fedseg.run.provenance import begin, record_extension, unchanged
from fedseg.run.resume import all_finished
from fedseg.run.runlog import RUN_LOG, append_line, last_event, log_event, log_stop
from fedseg.run.said_once import first_time
from fedseg.run.start_from import check_start_from
from fedseg.run.state import RoundCallback, ValidatedCallback
from fedseg.tracking import check_available, open_tracker


def run_experiment(
    cfg: RunConfig,
    out: Path,
    resume: bool = False,
    observers: list[Observer] | None = None,
    on_round_end: RoundCallback | None = None,
    on_algorithm_start: Callable[[str], None] | None = None,
    federation: Federation | None = None,
    prepared: Prepared | None = None,
    engine_factory: EngineFactory | None = None,
    on_log_line: Callable[[str], None] | None = None,
    keep_checkpoints: bool = False,
    hold_out: bool = True,
    on_validated: ValidatedCallback | None = None,
) -> RunResults:
    """Check the device, ``out``, the options, the data and (``resume``) that the configuration equals the
    recorded one (``fedseg.run.preflight``) before writing anything; record ``config.yaml``; then run every
    algorithm and write the outputs.

    ``prepared`` skips loading data here (an engine whose sites hold their own data, e.g. Flower,
    needs only the federation's header, site names and the Task); ``engine_factory``, ``keep_checkpoints``:
    see ``run_algorithm``.

    ``model.name: planned`` (``fedseg.plan``): the sites' fingerprints are collected and the run planned before
    any case is pre-processed (``prepare_planned``); every algorithm trains under the config with the plan
    applied, ``config.yaml`` keeps the config as given, ``plan.json`` the plan (a resume reuses it) and
    ``summary.json`` the plan with its traffic (``ledger.csv``: rows of algorithm ``plan``).

    ``hold_out``: hold ``out`` against a second command writing it (``fedseg.folder_lock``), an existing folder from
    the checks on, a new one from its creation; False where the caller's process holds it (a Flower coordinator,
    whose ServerApp process runs this).

    ``on_validated(algorithm, round, dice)``: each validated round's mean validation Dice over sites (the selection
    metric), as soon as it is scored (``fedseg.run.progress`` shows the last one in its bar).

    With ``engine.workers`` > 1 the worker pool's process server is started early (``start_forkserver``), after
    the checks (a resume's reads the checkpoints), unless a resume finds every algorithm finished with no rounds
    left to train (also an extension to more rounds where each had stopped early, by a stop rule): such a run
    reuses its results and only writes its outputs again, so neither that server (a process importing torch and
    every method, seconds of a core) nor the pool is started."""
    out = Path(out)
    check_before_data(cfg, out, resume, check_compute=prepared is None, in_process=engine_factory is None)
    before = extended_from(out, cfg) if resume else None  # read before record_start rewrites config.yaml
    # a finished run resumed: nothing to train or evaluate (an extension: unless an algorithm trains more rounds)
    idle = (
        resume and all_finished(out, cfg.algorithms) and (before is None or not extended_algorithms(out, cfg, before))
    )
    if engine_factory is None and cfg.engine.workers > 1 and not idle:  # the pool's server imports while we prepare
        start_forkserver()
    held = contextlib.ExitStack()
    if hold_out and out.is_dir():  # before the data is prepared: a second command on it is refused at once
        held.enter_context(holding(out))
    with held:
        prep = prepare_run(cfg, out, resume, federation, prepared)
        check_prepared(cfg, prep)
        if hold_out:  # a new folder held from its creation, before anything is written in it (held again: a no-op;
            out.mkdir(parents=True, exist_ok=True)  # made by another command while the data was prepared: refused)
            held.enter_context(holding(out))
        record_start(cfg, out, resume, prep, on_log_line)
        try:
            results = RunResults(cfg, prep.federation, [], run_provenance(cfg, out, resume, before is not None))
            if prep.plan is not None:
                results.plan, results.plan_ledger, results.planned_cfg = (
                    prep.plan.summary(),
                    prep.plan.ledger,
                    prep.task.cfg,
                )
            tracker = open_tracker(cfg, out, resume)  # None: tracking is off
            # engine.workers > 1: one worker pool per run, none where it has nothing to train (idle)
            with local_engines(cfg, prep, engine_factory, idle) as factory:
                for name in cfg.algorithms:
                    if on_algorithm_start:
                        on_algorithm_start(name)
                    earlier = {r.name: r for r in results.algorithms}
                    result = run_algorithm(
                        name,
                        prep,
                        out,
                        resume,
                        observers,
                        on_round_end,
                        factory,
                        on_log_line,
                        earlier,
                        keep_checkpoints,
                        tracker,
                        on_validated,
                    )
                    results.algorithms.append(result)
                    family = get_algorithm(name).family
                    if family and family.after_test:  # e.g. FedSM: the selector's features of the test images (Fig. 3)
                        family.after_test(out, name, result.bundle, prep.site_data, prep.task)
                    write_outputs(out, results)
            if last_event(out) != "finished":  # a finished run resumed only rewrites its outputs: its log stays
                log_event(out, "finished")
        except BaseException as e:  # the run began here: its run.log says why it ends (an error, Ctrl-C)
            log_stop(out, "interrupted" if isinstance(e, KeyboardInterrupt) else error_text(e) or type(e).__name__)
            raise
        return results


def check_before_data(cfg: RunConfig, out: Path, resume: bool, check_compute: bool, in_process: bool) -> None:
    """The device (``check_compute``: unless the sites compute on their machines, e.g. Flower, where ``fedseg
    flower local`` checks), ``out``, every algorithm's options, secure aggregation (``in_process``: the simulator or
    the worker pool, which refuse it), what the worker pool's processes must import (``engine.workers`` > 1), the
    trackers and (``resume``) the recorded config (``fl.rounds`` may grow, where the run can continue as one
    configured with those rounds trains: ``fedseg.run.extend``) and each started method's resolved options
    (``fedseg.run.method_record``)."""
    if check_compute:
        check_device(cfg.device)
    check_out_dir(out)
    check_out_kind(out, "run")  # a study's, a bench's or a federation's folder: before any data is prepared
    check_out_outside(out, folder_root(cfg))
    if not (resume and out.exists()):
        check_out_creatable(out)  # a place no folder can be made (read-only, /proc): before the data is prepared
    torch.set_num_threads(cfg.threads)
    for name in cfg.algorithms:  # unknown names and bad options fail before any work
        get_algorithm(name).parse_options(cfg.methods.get(name))
    check_method_names(cfg.methods)
    check_secure_aggregation(cfg, in_process)
    if in_process and cfg.engine.workers > 1:  # what the worker pool's processes could not load, before any data
        check_worker_imports(cfg.algorithms)
    check_available(cfg.tracking)  # so does a tracker whose package is missing (fedseg.tracking)
    if (out / "checkpoints").exists() and not (out / "checkpoints").is_dir():
        raise FileExistsError(f"{out / 'checkpoints'}: is a file where the run keeps its checkpoints (a folder)")
    if resume and (out / "checkpoints").exists() and not (out / "config.yaml").is_file():
        raise FileNotFoundError(
            f"{out / 'config.yaml'}: missing, so the configuration of the run in {out} is unknown and a resume cannot "
            "check that it continues the same one; put it back (it was written when the run started) or choose "
            "another --out"
        )
    if resume and (recorded := recorded_config(out / "config.yaml")) is not None:
        if (before := recorded_rounds(recorded)) is not None and before > cfg.fl.rounds:
            check_extension(out, cfg, before)  # fewer rounds: one line
        check_resume(recorded, cfg.model_dump(mode="json"), str(out / "config.yaml"), rounds_may_grow=True)
        if before is not None and before < cfg.fl.rounds:
            if not in_process:  # e.g. Flower: the sites' states of the last round are on their machines
                raise ValueError(
                    f"{out / 'config.yaml'}: fl.rounds {before} -> {cfg.fl.rounds}: extending a run to more rounds "
                    "needs the run's own engine (fedseg run: the simulator or the worker pool); resume with "
                    f"fl.rounds {before}, or start a new run (another --out)"
                )
            check_extension(out, cfg, before)  # more rounds: as a run configured with them trains, or one line
    if resume:  # the same config, but a method whose defaults changed (its code edited, another fedseg)
        check_method_options(out, cfg)
        check_data_files(out, folder_root(cfg))  # the same config, but a federation folder edited since


def check_worker_imports(algorithms: list[str]) -> None:
    """``engine.workers`` > 1: a ValueError naming the method and class a worker process could not import (defined
    in a notebook's ``__main__``) or the script line that starts the run unguarded (``fedseg.engine.worker_imports``);
    the pool checks each method's whole context again when it is sent."""
    from fedseg.engine.worker_imports import check_main, check_sendable

    check_main()
    for name in algorithms:
        spec = get_algorithm(name)
        check_sendable(name, (spec.client, spec.options))


def prepare_run(
    cfg: RunConfig, out: Path, resume: bool, federation: Federation | None, prepared: Prepared | None
) -> Prepared:
    """The run's data: ``prepared`` as given, planned first (``model.name: planned``), or loaded here."""
    if cfg.model.name == "planned" and prepared is not None:
        raise ValueError(
            "model.name planned: the sites' fingerprints are collected before their data is pre-processed, which "
            "this engine (sites holding their own data, e.g. Flower) does not do yet; run it with `fedseg run`, or "
            "copy the model and data settings of a planned run's plan.json into the config"
        )
    if cfg.model.name == "planned":
        return prepare_planned(cfg, out, resume, federation)
    return prepared or prepare(cfg, federation)


def check_prepared(cfg: RunConfig, prep: Prepared) -> None:
    """What depends on the federation and the network: site counts, fault sites, sampling, the pool's device
    slots, the methods' task options (e.g. FedPer's private_layers) and ``start_from``."""
    where = f"federation {prep.federation.name!r}"
    check_sites(cfg, len(prep.federation.sites), where)
    check_fault_sites(cfg.faults, [s.name for s in prep.federation.sites], where)
    check_sampling(cfg, len(prep.federation.sites), where)
    for device in cfg.engine.devices or []:  # the worker pool's device slots
        check_device(device)
    for name in cfg.algorithms:
        get_algorithm(name).check_task(prep.task, cfg.methods.get(name))
    options: dict[str, object] = {n: get_algorithm(n).parse_options(cfg.methods.get(n)) for n in cfg.algorithms}
    check_start_from(cfg, options, prep.task, prep.federation.channel_names)


def record_start(
    cfg: RunConfig, out: Path, resume: bool, prep: Prepared, on_log_line: Callable[[str], None] | None
) -> None:
    """Refuse an ``out`` that holds another run, or (``resume``) data from elsewhere than the run's record says;
    record ``config.yaml`` (a resume compares with it), each method's resolved options (``fedseg.run.method_record``),
    where the data came from (``fedseg.run.data_record``) and the plan (``model.name: planned``; a resume reuses it);
    log a resume in ``run.log`` (unless its log ends finished); announce the cost warnings (a resumed method's code
    edited since its start too) and the methods' notes."""
    if out.exists() and any(out.iterdir()) and not resume and (out / "checkpoints").exists():
        raise FileExistsError(f"{out}: already holds a run; use --resume to continue it or choose another --out")
    if resume:
        check_data_origin(out, folder_root(cfg), prep.fingerprint)
    extension = extend_finished(cfg, out) if resume else []  # before the notes: the reopened ones train again
    notes = (
        extension + resume_notes(recorded_config(out / "config.yaml"), cfg.model_dump(mode="json")) if resume else []
    )
    notes += fedseg_notes(out, cfg) + code_notes(out, cfg) + plugin_notes(out, cfg) if resume else []
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out / "config.yaml", dump_config(cfg))
    write_record(out, cfg)  # each method's resolved options (a resume compares them: fedseg.run.method_record)
    if not resume or not (out / DATA_RECORD).is_file():
        record_data_files(out, folder_root(cfg), prep.fingerprint)
    if prep.plan is not None:
        atomic_write_text(out / PLAN_FILE, strict_json_text(prep.plan.to_dict(), indent=2))
    # shown, not logged: run.log holds what was trained (an extension's own line says what it trains)
    if resume and not extension and all_finished(out, cfg.algorithms):
        show(
            "resume: every algorithm of this run has finished; nothing is trained, its outputs are written again",
            on_log_line,
        )
    elif resume and not extension:
        show(f"resume: {resume_progress(out, cfg)}; the run goes on from there", on_log_line)
    # e.g. stopped while writing outputs; or a finished run extended to more rounds (it ends finished again)
    if resume and (out / RUN_LOG).is_file() and (last_event(out) != "finished" or extension):
        log_event(out, "resumed")
    for line in notes + cost_warnings(cfg, len(prep.federation.sites)):
        announce(out, line, on_log_line)
    fed = prep.federation
    for line in (
        method_notes(cfg, prep.task, {data.name: len(data.train) for data in prep.site_data})
        + data_notes(cfg, fed.kind, fed.channel_names, dicom_modalities(fed) if cfg.data.source == "folder" else None)
        + device_notes(cfg, prep.task.device)
        + spacing_notes(cfg, site_spacings(prep))
        + prepared_notes(prep.site_data)
    ):
        announce(out, line, on_log_line)


def extend_finished(cfg: RunConfig, out: Path) -> list[str]:
    """A resume with more ``fl.rounds`` than the run recorded (checked by ``check_before_data``): the finished
    algorithms that train more continue from their last round (``fedseg.run.extend.reopen_finished``) and the run's
    provenance records the extension; its line for ``run.log``. Nothing (``[]``) for any other resume."""
    before = extended_from(out, cfg)
    if before is None:
        return []
    none_left = rounds_left_text(out, cfg, before)  # before reopening: every algorithm finished, none trains more
    continued = reopen_finished(out, cfg, before)
    record_extension(out, before, cfg.fl.rounds, continued)
    if none_left is not None:
        return [
            f"extended: fl.rounds {before} -> {cfg.fl.rounds}, but no algorithm had rounds left to train: {none_left}; "
            "nothing is trained, the outputs are written again"
        ]
    fresh = unstarted_algorithms(out, cfg)
    trains = "; ".join(
        ([f"{', '.join(continued)} continue from their last round"] if continued else [])
        + ([f"{', '.join(fresh)} not begun before: trained from round 1"] if fresh else [])
    )
    trains = trains or "no algorithm trains more"
    return [
        f"extended: fl.rounds {before} -> {cfg.fl.rounds}; {trains}; the model is selected again on validation over "
        "all rounds and tested again"
    ]


def recorded_rounds(recorded: dict[str, Any]) -> int | None:
    """``fl.rounds`` of a recorded configuration (None: not an int, e.g. a config that no longer validates)."""
    rounds = (recorded.get("fl") or {}).get("rounds") if isinstance(recorded.get("fl"), dict) else None
    return rounds if isinstance(rounds, int) and not isinstance(rounds, bool) else None


def extended_from(out: Path, cfg: RunConfig) -> int | None:
    """The recorded ``fl.rounds`` of the run in ``out`` where ``cfg`` has more (a resume extends it), else None."""
    recorded = recorded_config(out / "config.yaml")
    before = None if recorded is None else recorded_rounds(recorded)
    return before if before is not None and before < cfg.fl.rounds else None


def site_spacings(prep: Prepared) -> dict[str, list[tuple[float, ...]]]:
    """Each site's cases' voxel sizes (mm per axis) on the volume path, from its prepared volumes (none where the
    sites hold their own data, e.g. Flower)."""
    spacings: dict[str, list[tuple[float, ...]]] = {}
    for data in prep.site_data:
        for split in (data.train, data.val, data.test):
            spacings.setdefault(data.name, []).extend(tuple(v.spacing) for v in split.volumes or [])
    return spacings


def run_provenance(cfg: RunConfig, out: Path, resume: bool, extended: bool = False) -> dict[str, Any]:
    """The run's provenance: unchanged when a resume finds every algorithm finished and does not extend the run
    (``extended``: more ``fl.rounds``, recorded in ``provenance.extended`` like any extension, also where no
    algorithm had rounds left to train), else begun now (``accel``: the effective train.amp / channels_last / ...;
    ``plugins``: ``{method: {distribution, version}}`` of the run's methods installed as packages, where it has
    any)."""
    plugins = plugin_records(cfg.algorithms)  # the installed method packages that train (fedseg.method_plugins)
    return (resume and not extended and all_finished(out, cfg.algorithms) and unchanged(out)) or {
        **begin(out, resume, cfg.device),
        "accel": resolve(cfg.train, cfg.device).record(),
        **({"plugins": plugins} if plugins else {}),
    }


def announce(out: Path, line: str, on_log_line: Callable[[str], None] | None) -> None:
    """Append ``line`` to ``out/run.log`` and :func:`show` it (in a bench: unless an earlier run of the bench showed
    it, ``fedseg.run.said_once``)."""
    append_line(out, line)
    if first_time(line):
        show(line, on_log_line)


def show(line: str, on_log_line: Callable[[str], None] | None) -> None:
    """Show ``line``: through ``on_log_line`` if given, else on stderr."""
    if on_log_line is not None:
        on_log_line(line)
    else:
        print(line, file=sys.stderr, flush=True)
