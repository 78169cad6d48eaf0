"""One algorithm's training: its engine and server, then round by round (resumable from its checkpoint),
keeping the best round on validation, and its test once training ends (``fedseg.run.finish``)."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import torch

from fedseg.algorithms import get_algorithm
from fedseg.engine.base import Observer
from fedseg.engine.checkpoint import CheckpointWriter, load_checkpoint, remove_temp_files
from fedseg.engine.faults import MethodError, model_problem
from fedseg.engine.own_code import own_code
from fedseg.engine.state import state_problem
from fedseg.run.engines import EngineFactory, simulator_engine
from fedseg.run.finish import finish
from fedseg.run.method_code import method_code
from fedseg.run.preparation import Prepared
from fedseg.run.result import AlgorithmResult
from fedseg.run.resume import checkpoint_path, clone, finished_result
from fedseg.run.start_from import start_weights
from fedseg.run.state import AlgorithmRun, RoundCallback, RoundState, RunHooks, ValidatedCallback
from fedseg.run.steps import checkpoint_round, must_validate, resume_state, update_best, update_stop, validate_round
from fedseg.tracking import Tracker


def run_algorithm(
    name: str,
    prep: Prepared,
    out: Path,
    resume: bool,
    observers: list[Observer] | None = None,
    on_round_end: RoundCallback | None = None,
    engine_factory: EngineFactory | None = None,
    on_log_line: Callable[[str], None] | None = None,
    earlier: dict[str, AlgorithmResult] | None = None,
    keep_checkpoints: bool = False,
    tracker: Tracker | None = None,
    on_validated: ValidatedCallback | None = None,
) -> AlgorithmResult:
    """Train ``name`` for ``fl.rounds`` rounds (resuming if asked), keep the best round by mean
    validation Dice over sites, evaluate it once on the test splits.

    ``engine_factory`` builds the engine (default: the in-process ``Simulator``, whatever ``engine.workers``:
    ``run_experiment`` opens the worker pool, ``local_engines``; Flower: ``fedseg.flower.engine``). An engine
    whose client states live elsewhere (``supports_resume`` False) can reuse a finished checkpoint but cannot
    resume a half-done one.

    Each round's line goes to ``out/run.log`` (and to ``on_log_line``) once its checkpoint is on disk,
    so a resumed round is never logged twice.

    ``earlier``: the results of the algorithms run before this one in the same run, for a method that
    starts from one of their models (``fedseg.run.start_from``).

    When it finishes, the trained models go to ``out/model/<name>/`` and the checkpoint becomes a small
    "finished" record (results, the weights file's digest); a resume reuses it, reading the models back
    from that folder. ``keep_checkpoints``: the finished checkpoint also holds the models (``--keep-checkpoints``).

    ``tracker`` (``fedseg.tracking``): gets each round's metrics when its checkpoint is on disk (as run.log)
    and the test results after the finished checkpoint, so a resumed run logs nothing twice. ``on_validated``: each
    validated round's mean validation Dice over sites, when scored (a resume: the last its checkpoint holds first)."""
    spec = get_algorithm(name)
    options = spec.parse_options(prep.task.cfg.methods.get(name))
    method_cfg = spec.run_config(prep.task.cfg)
    if method_cfg is not prep.task.cfg:  # the method's own rounds
        prep = replace(prep, task=replace(prep.task, cfg=method_cfg))
    earlier = earlier or {}
    engine = (engine_factory or simulator_engine)(name, spec, options, prep, out, observers)
    engine.all_sites_required = spec.needs_every_site  # fl.on_failure = skip cannot apply to it
    engine.method_code = own_code(spec.server, spec.client)  # a site's error in it names its place (none: built-in)
    trained = False

    def when() -> str:  # where the method's own error was raised, for its message
        if trained:
            return f"after round {engine.round} (testing the selected model)"
        return f"round {engine.round}" if engine.round else "start"

    with method_code(name, engine.method_code, when):  # a registered method's own error: one line
        server = spec.server(engine, prep.task, options)
        if (initial := start_weights(options, earlier, prep.task)) is not None:  # e.g. finetune: fedavg's model
            server.global_weights = dict(initial)
        hooks = RunHooks(on_round_end, on_log_line, tracker, on_validated)
        run = AlgorithmRun(
            name, spec, options, prep, engine, server, out, checkpoint_path(out, name), earlier, keep_checkpoints, hooks
        )
        remove_temp_files(run.ckpt_path)  # left by a process killed mid-write
        ckpt = load_checkpoint(run.ckpt_path) if resume else None
        if ckpt and ckpt.get("finished"):
            result = finished_result(name, ckpt, run.ckpt_path, out)
            engine.close()  # as after training: e.g. a Flower run stopped before it released the sites' snapshots
            return result
        state = resume_state(run, ckpt)
        if tracker:  # one tracking run per algorithm; a resumed one is continued
            tracker.start(name, run.cfg, state.start)
        last = train_rounds(run, state)
        trained = True
        return finish(run, state, last)


def train_rounds(run: AlgorithmRun, state: RoundState) -> int:
    """The round loop: train, validate when due, keep the best round, apply the stop rules, checkpoint; returns
    the last round trained (a resumed run that had stopped trains no more)."""
    cfg, engine, server, hooks = run.cfg, run.engine, run.server, run.hooks
    last = cfg.fl.rounds if state.stopped is None else state.start - 1
    reference = {k: torch.empty(v.shape, dtype=v.dtype, device="meta") for k, v in server.global_weights.items()}
    if hooks.on_validated and state.validated:  # a resume: the last validated round so far
        latest = max(state.validated)
        hooks.on_validated(run.name, latest, state.validated[latest])
    with CheckpointWriter() as writer:
        for rnd in range(state.start, last + 1):
            engine.round = rnd
            began = time.perf_counter()
            losses = server.run_round(rnd)
            check_global_model(run, rnd, reference)
            if must_validate(run, rnd):
                validate_round(run, state, rnd, losses)
            snapshot = {"server": server_state(run, rnd), "clients": engine.snapshot_clients()}  # copies: frozen
            update_best(run, state, rnd, snapshot)
            update_stop(run, state, rnd)
            checkpoint_round(writer, run, state, rnd, snapshot, losses, began)
            if hooks.on_round_end:
                hooks.on_round_end(run.name, rnd, losses)
            if state.stopped:
                return rnd
    return last


def server_state(run: AlgorithmRun, rnd: int) -> dict[str, torch.Tensor]:
    """A copy of the server's ``state_dict()`` after round ``rnd`` (what its checkpoint and the best round keep); a
    ``MethodError`` naming the method, the round and the entry where it holds anything but tensors under names (an
    int, a nested dict: ``fedseg.engine.state.state_problem``), before a checkpoint or a resume meets it."""
    state = run.server.state_dict()
    problem = state_problem(state, f"{type(run.server).__name__}.state_dict()")
    if problem is not None:
        raise MethodError(f"{run.name}, round {rnd}: {problem}")
    return clone(state)


def check_global_model(run: AlgorithmRun, rnd: int, reference: dict[str, torch.Tensor]) -> None:
    """``MethodError`` where the server's global model after round ``rnd``'s merge has other names, shapes or dtypes
    than before the first round (``reference``: meta tensors) or holds NaN/Inf: said of the method, before the
    sites receive it (else each site's next exchange failed, blamed on the site)."""
    problem = model_problem(run.server.global_weights, reference)
    if problem is not None:
        raise MethodError(
            f"{run.name}, round {rnd}: the server's global model after its merge cannot go to the sites: {problem} "
            f"({type(run.server).__name__}.aggregate sets self.global_weights to the merged model)"
        )
