"""The named steps around one algorithm's round loop (``fedseg.run.loop.train_rounds``): resume, validate,
keep the best round, apply the stop rules, checkpoint (and log the round once its checkpoint is on disk)."""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from fedseg.engine.checkpoint import CheckpointWriter
from fedseg.engine.ledger import Ledger
from fedseg.run.resume import Checkpoint, remove_best_files, restore_best, stored_best, validated_from_rows
from fedseg.run.runlog import log_round, round_line
from fedseg.run.selection import is_better, selectable_scores
from fedseg.run.state import AlgorithmRun, RoundState
from fedseg.run.stopping import budget_reached, budget_used, has_budget, stop_reason
from fedseg.run.summary import site_means
from fedseg.tracking import round_record

Losses = dict[str, float]  # site -> training loss of the round


def resume_state(run: AlgorithmRun, ckpt: Checkpoint | None) -> RoundState:
    """A fresh start, or (``ckpt``: a half-done checkpoint) the server, client states and ledger put back and
    where training stood. An engine whose client states live elsewhere (``supports_resume`` False) refuses."""
    if ckpt is None:
        return RoundState()
    engine = run.engine
    if not engine.supports_resume:
        raise ValueError(
            f"{run.ckpt_path}: cannot resume {run.name!r} on this engine ({type(engine).__name__}): "
            "the sites' client states are not in the checkpoint; start a new run (another --out)"
        )
    run.server.load_state_dict(ckpt["server"])
    engine.restore_clients(ckpt["clients"])
    engine.ledger = Ledger.from_dicts(ckpt["ledger"])
    state = RoundState(
        start=ckpt["round"] + 1,
        rounds_rows=ckpt["rounds_rows"],
        metric_rows=ckpt["metric_rows"],
        best=restore_best(ckpt["best"], ckpt, run.ckpt_path, engine),
        stopped=ckpt.get("stopped"),
        validated=dict(ckpt.get("validated") or validated_from_rows(ckpt["rounds_rows"])),  # older: from rows
    )
    if state.stopped is None:
        # the stop rules again after the checkpointed round: the same answer, unless it was the last of fewer
        # fl.rounds (not checked there) and the run now has more (fedseg.run.extend), where a run configured with
        # them from the start would have checked it
        update_stop(run, state, ckpt["round"])
    return state


def must_validate(run: AlgorithmRun, rnd: int) -> bool:
    """Round ``rnd`` is validated every ``fl.validate_every`` rounds, in the last round, and when a stop budget
    is reached in it (that makes it the last: validated, and checked again after)."""
    cfg = run.cfg
    over_budget = None
    if has_budget(cfg.fl.stop) and run.server.selectable(rnd):
        over_budget = budget_reached(cfg.fl.stop, budget_used(run.engine.ledger.rows, cfg.cost, run.val_cases()))
    return bool(rnd % cfg.fl.validate_every == 0 or rnd == cfg.fl.rounds or over_budget)


def validate_round(run: AlgorithmRun, state: RoundState, rnd: int, losses: Losses) -> None:
    """Score every site's model on its validation split: the round's rows, metrics and mean over sites."""
    server = run.server
    per_site = site_means(server.evaluate("val"), server.site_model, run.sites)
    for site in run.sites:
        state.rounds_rows.append(
            {
                "algorithm": run.name,
                "round": rnd,
                "site": site,
                "val_dice": per_site[site],
                "train_loss": losses.get(site, float(np.mean(list(losses.values())))),
            }
        )
    state.metric_rows += [{"algorithm": run.name, "round": rnd, **row} for row in server.round_metrics()]
    state.validated[rnd] = per_site["client_avg"]
    if run.hooks.on_validated:
        run.hooks.on_validated(run.name, rnd, per_site["client_avg"])


def update_best(run: AlgorithmRun, state: RoundState, rnd: int, snapshot: dict[str, Any]) -> None:
    """Round ``rnd`` (its states: ``snapshot``) becomes the best if validated, selectable and better."""
    if rnd in state.validated and run.server.selectable(rnd):
        if is_better(state.validated[rnd], None if state.best is None else state.best["score"]):
            state.best = {"round": rnd, "score": state.validated[rnd], **snapshot}


def update_stop(run: AlgorithmRun, state: RoundState, rnd: int) -> None:
    """The fl.stop rule that ends training after round ``rnd``, if any (only before the last round, once a
    round may be selected)."""
    cfg = run.cfg
    if state.best is not None and run.server.selectable(rnd) and rnd < cfg.fl.rounds:
        used = budget_used(run.engine.ledger.rows, cfg.cost, run.val_cases()) if has_budget(cfg.fl.stop) else None
        state.stopped = stop_reason(cfg.fl.stop, selectable_scores(state.validated, run.server), rnd, used)


def checkpoint_round(
    writer: CheckpointWriter,
    run: AlgorithmRun,
    state: RoundState,
    rnd: int,
    snapshot: dict[str, Any],
    losses: Losses,
    began: float,
) -> None:
    """Queue round ``rnd``'s checkpoint; once it is on disk, the best files it no longer names go, the engine
    hears of it, and the round's line is logged and tracked (so a resumed round is never logged twice)."""
    cfg, engine, best = run.cfg, run.engine, state.best
    payload = {
        "round": rnd,
        **snapshot,
        "ledger": engine.ledger.as_dicts(),
        "rounds_rows": list(state.rounds_rows),
        "metric_rows": list(state.metric_rows),
        "best": stored_best(best, rnd, run.ckpt_path, writer),
        "stopped": state.stopped,
        "validated": dict(state.validated),
    }
    writer.save(run.ckpt_path, payload, frozen=True)
    line = round_line(run.name, rnd, cfg.fl.rounds, state.validated.get(rnd), losses, time.perf_counter() - began)
    tracker = run.hooks.tracker
    validated = state.validated.get(rnd)
    tracked = (
        None
        if tracker is None
        else round_record(run.name, rnd, state.rounds_rows, state.metric_rows, validated, losses, engine.ledger)
    )
    named = [snapshot["clients"], best["clients"]] if best else [snapshot["clients"]]
    keep: str | None = best.get("file") if best else None

    def after_checkpoint() -> None:
        remove_best_files(run.ckpt_path, keep)
        engine.checkpointed(named)  # e.g. Flower: the sites may drop older snapshots
        log_round(run.out, line, run.hooks.on_log_line)  # once the round's checkpoint is on disk: never twice
        if tracker is not None and tracked is not None:
            tracker.log_round(tracked)  # likewise

    writer.then(after_checkpoint)
