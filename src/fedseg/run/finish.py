"""After the last round of one algorithm: restore the best round, test it once, write its models and the
"finished" checkpoint a resume reuses."""

from __future__ import annotations

from typing import Any

from fedseg.algorithms.sampling import sampling_refusal
from fedseg.engine.checkpoint import save_checkpoint
from fedseg.run.extend import keep_last_round, last_path
from fedseg.run.model_card import model_card
from fedseg.run.outputs import bundle_order, write_bundle_files
from fedseg.run.result import AlgorithmResult, Row
from fedseg.run.resume import remove_best_files
from fedseg.run.runlog import log_round, selected_lrs_line
from fedseg.run.start_from import combined_cost, start_name
from fedseg.run.state import AlgorithmRun, BestRound, RoundState
from fedseg.run.stopping import convergence
from fedseg.run.summary import summarize


def finish(run: AlgorithmRun, state: RoundState, last: int) -> AlgorithmResult:
    """Test the best round's model(s), write the models and the finished checkpoint, close the engine and tell
    the tracker (after the finished checkpoint: a resume never logs the test twice)."""
    assert state.best is not None, "fl.rounds >= 1 and the last round is always validated"
    engine, server = run.engine, run.server
    engine.round = last
    restore_best_round(run, state.best)
    test_rows = server.evaluate("test", sample=True)
    bundle = server.bundle()
    summary = training_summary(run, state, last, test_rows)
    card = model_card(run.name, run.prep.federation, run.cfg, summary)
    result = AlgorithmResult(
        run.name, test_rows, state.rounds_rows, engine.ledger.as_dicts(), summary, bundle, state.metric_rows, card
    )
    save_finished(run, result, keep_last=state.stopped is None and run.keep_checkpoints)
    engine.close()  # e.g. the state files of engine.state: disk
    if summary.get("selected_lrs"):  # lr_grid (finetune): the rate each site's tested model was trained at
        log_round(run.out, selected_lrs_line(run.name, summary["selected_lrs"]), run.hooks.on_log_line)
    if run.hooks.tracker:
        run.hooks.tracker.finish(run.name, run.cfg, summary)
    return result


def restore_best_round(run: AlgorithmRun, best: BestRound) -> None:
    """Put back the best round's server (and, unless each site selects its own round, client) states."""
    server = run.server
    # Before the restore: the sites' kept local models are then their best over *all* rounds (the
    # restored states hold only the best up to the selected round; fedseg.algorithms.fedavg).
    server.collect_local_models()
    server.load_state_dict(best["server"])
    if not server.SELECTS_PER_SITE:  # per-site selection: each site's state holds its own choice
        run.engine.restore_clients(best["clients"])
    server.finalize()


def training_summary(run: AlgorithmRun, state: RoundState, last: int, test_rows: list[Row]) -> dict[str, Any]:
    """The algorithm's ``summary.json`` entry: the test metrics (``summarize``) and what training did."""
    assert state.best is not None
    engine, server, spec, cfg, sites = run.engine, run.server, run.spec, run.cfg, run.sites
    cost = combined_cost(
        run.options, run.earlier, engine.ledger.as_dicts(), cfg.cost, {s: engine.num_samples(s, "val") for s in sites}
    )
    summary = summarize(
        run.name, test_rows, server.site_model, sites, engine.ledger, last, state.best["round"], cost=cost
    )
    if server.SELECTS_PER_SITE:  # the round each site's tested model comes from (its own best on validation)
        summary["selected_rounds"] = dict(server.selected_rounds)
    summary.update(spec.summary_fields())
    summary.update(server.summary_fields())  # a server's own, e.g. fedavg-dp's privacy
    summary["train_samples"] = {s: engine.num_samples(s, "train") for s in sites}
    summary["site_models"] = {s: server.site_model(s) for s in sites}  # the model each site's scores come from
    summary["convergence"] = convergence(
        server.convergence_scores(state.validated),
        last,
        state.best["round"],
        cfg.fl.stop,
        state.stopped,
        from_initial_weights=start_name(run.options) is None,  # a fine-tuning may be best at once
        selected_rounds=summary.get("selected_rounds"),
    )
    summary["failures"] = engine.ledger.failures()  # replies left out (fl.on_failure = skip)
    if cfg.fl.clients_per_round is not None and spec.federated and sampling_refusal(spec) is None:  # who trained
        summary["sampled_sites"] = {str(r): server.participants(r) for r in range(1, last + 1)}
    return summary


def save_finished(run: AlgorithmRun, result: AlgorithmResult, keep_last: bool = True) -> None:
    """The trained models to ``out/model/<name>/``, then the checkpoint becomes a small "finished" record
    (results, the weights file's digest; ``keep_checkpoints``: the models too). ``keep_last`` (``keep_checkpoints``
    and not stopped early): the last round's checkpoint is kept first as ``<name>.last.pt``, which the record names,
    so a resume with more ``fl.rounds`` can continue it (``fedseg.run.extend``)."""
    last = keep_last_round(run.ckpt_path) if keep_last else None
    if last is None:
        last_path(run.ckpt_path).unlink(missing_ok=True)
    finished = {
        "last": last,
        "finished": True,
        "test_rows": result.test_rows,
        "rounds_rows": result.rounds_rows,
        "ledger": result.ledger,
        "summary": result.summary,
        "metric_rows": result.metric_rows,
        "card": result.card,
        # the models, on disk before the checkpoint that relies on them (run_experiment rewrites them unchanged)
        "bundle_sha256": write_bundle_files(
            run.out / "model" / run.name, result.bundle, run.cfg, run.prep.federation, result.card
        ),
        "bundle_order": bundle_order(result.bundle),
    }
    save_checkpoint(run.ckpt_path, {**finished, "bundle": result.bundle} if run.keep_checkpoints else finished)
    remove_best_files(run.ckpt_path, keep=None)  # only now: the checkpoint on disk no longer names them
