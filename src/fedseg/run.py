"""Run an experiment: validate data, train every algorithm round by round, select on
validation, test once, write the run outputs. Resumable from per-algorithm checkpoints."""

from __future__ import annotations

import json
import math
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch

from fedseg.accel import resolve
from fedseg.algorithms import check_method_names, check_sites, get_algorithm
from fedseg.algorithms.sampling import sampling_refusal
from fedseg.config import RunConfig, dump_config
from fedseg.data.dataset import SiteData, build_site_data
from fedseg.data.federation import Federation, Split
from fedseg.data.repartition import repartition, repartitioned_site_count
from fedseg.engine.base import Engine
from fedseg.engine.checkpoint import (
    CheckpointWriter,
    atomic_write_text,
    fsync_dir,
    load_checkpoint,
    remove_temp_files,
    save_checkpoint,
)
from fedseg.engine.context import Task
from fedseg.engine.faults import check_fault_sites
from fedseg.engine.forkserver import start_forkserver
from fedseg.engine.ledger import Ledger
from fedseg.engine.simulator import Simulator
from fedseg.engine.state import state_store
from fedseg.evaluate.metric_info import METRIC_NAMES
from fedseg.evaluate.tables import site_summary
from fedseg.outputs import RunResults, bundle_order, read_bundle, write_bundle_files, write_outputs
from fedseg.preflight import check_device, check_out_dir, check_resume, recorded_config
from fedseg.provenance import begin, unchanged
from fedseg.runlog import append_line, log_round, round_line
from fedseg.start_from import check_start_from, combined_cost, start_weights
from fedseg.stopping import budget_reached, budget_used, convergence, has_budget, stop_reason
from fedseg.tracking import Tracker, check_available, open_tracker, round_record

if TYPE_CHECKING:
    from fedseg.plan.federated import PlannedRun

RoundCallback = Callable[[str, int, dict], None]
# (algorithm name, AlgorithmSpec, validated options, Prepared, out dir, observers) -> engine; see ``simulator_engine``
EngineFactory = Callable[..., Engine]


@dataclass
class Prepared:
    """A validated federation, its splits and every site's preprocessed data; ``plan``: with ``model.name:
    planned``, the plan the data and the task's config follow (``prepare_planned``)."""

    federation: Federation
    splits: dict[str, dict[str, Split]]
    site_data: list[SiteData]
    task: Task
    plan: PlannedRun | None = None


def folder_root(cfg: RunConfig) -> str | None:
    """``cfg.data.root`` if the data is a federation folder, None for a built-in federation."""
    if cfg.data.source == "folder" or cfg.data.root:
        if not cfg.data.root:
            raise ValueError("data.source is 'folder' but data.root is not set (use --data ROOT)")
        return cfg.data.root
    return None


def load_federation(cfg: RunConfig) -> Federation:
    """The federation named by ``cfg.data``: a folder (validated by ``data check``), a built-in one or one
    registered from user code (``fedseg.data.sources.register_federation``)."""
    if root := folder_root(cfg):
        from fedseg.data.check import check_folder

        return check_folder(root, cfg.data.split, cfg.data.seed)
    from fedseg.data.sources import build_federation

    return build_federation(cfg)


def count_sites(cfg: RunConfig) -> int:
    """Number of sites of the federation ``cfg.data`` names, without reading or generating any image
    (for checks made before any work, e.g. when a study is planned)."""
    if root := folder_root(cfg):
        from fedseg.data.folder import load_folder

        count = len(load_folder(root).sites)
    else:
        from fedseg.data.sources import count_source_sites

        count = count_source_sites(cfg)
    return repartitioned_site_count(cfg.data.repartition, count)


def federation_splits(cfg: RunConfig, federation: Federation | None) -> tuple[Federation, dict[str, dict[str, Split]]]:
    """The (repartitioned) federation and its checked splits: ``{site: {case id: split}}``."""
    from fedseg.data.splits import check_splits, make_splits

    fed = repartition(federation or load_federation(cfg), cfg.data.repartition, cfg.data.split, cfg.data.seed)
    splits = make_splits(fed, cfg.data.split, cfg.data.seed)
    check_splits(fed, splits)
    return fed, splits


def prepare(cfg: RunConfig, federation: Federation | None = None) -> Prepared:
    """Load (unless an in-memory ``federation`` is given) and validate everything before any file is written."""
    return prepared_sites(cfg, *federation_splits(cfg, federation))


def prepared_sites(cfg: RunConfig, fed: Federation, splits: dict[str, dict[str, Split]]) -> Prepared:
    """Every site's data pre-processed under ``cfg.data``, and the task of ``cfg``."""
    site_data = [build_site_data(fed, site, i, splits[site.name], cfg.data) for i, site in enumerate(fed.sites)]
    task = Task(cfg, fed.spatial_dims, fed.channels, fed.regions.names)
    task.nsd_tolerances  # noqa: B018 - a mapping eval.nsd_tolerance must name the regions: fail before training
    return Prepared(fed, splits, site_data, task)


PLAN_FILE = "plan.json"


def prepare_planned(cfg: RunConfig, out: Path, resume: bool, federation: Federation | None = None) -> Prepared:
    """``model.name: planned``: the federation and splits, then the plan (``fedseg.plan``): the one in
    ``out/plan.json`` when resuming a run that recorded one (reused, never planned again), else planned from the
    sites' fingerprints collected through the planning exchanges; then every site's data pre-processed and the
    task built under the config with the plan applied (``fedseg.plan.planner.apply_plan``)."""
    from fedseg.plan.federated import PlannedRun, plan_federation, planning_engine
    from fedseg.plan.planner import apply_plan

    fed, splits = federation_splits(cfg, federation)
    stored = out / PLAN_FILE
    if resume and stored.is_file():
        planned = PlannedRun.from_dict(json.loads(stored.read_text()))
    else:
        planned = plan_federation(planning_engine(cfg, fed, splits), cfg)
    prep = prepared_sites(apply_plan(cfg, planned.plan), fed, splits)
    return replace(prep, plan=planned)


@dataclass
class AlgorithmResult:
    name: str
    test_rows: list[dict]
    rounds_rows: list[dict]
    ledger: list[dict]
    summary: dict
    bundle: dict[str, dict[str, torch.Tensor]] = field(default_factory=dict)
    metric_rows: list[dict] = field(default_factory=list)  # method-specific per-round metrics


def site_means(rows: list[dict], site_model: Callable[[str], str], sites: list[str]) -> dict[str, float]:
    """Mean Dice per site over the cases scored with the model that site uses."""
    return site_summary(
        rows, rows[0]["algorithm"], "dice", sites, model_filter=lambda r: r["model"] == site_model(r["site"])
    )


def simulator_engine(name: str, spec, options, prep: Prepared, out: Path, observers: list | None) -> Simulator:
    """The default engine: every site in this process, data from ``prep.site_data``; the sites' state stores
    where ``engine.state`` says (``fedseg.engine.state``; disk: OUT/states/<name>/)."""
    store = state_store(prep.task.cfg, [d.name for d in prep.site_data], out / "states" / name)
    return Simulator(name, spec.client(), prep.site_data, prep.task, options, out / "samples", observers, store)


@contextmanager
def local_engines(
    cfg: RunConfig, prep: Prepared, engine_factory: EngineFactory | None
) -> Iterator[EngineFactory | None]:
    """The engine factory of a run: ``engine_factory`` if given (e.g. Flower), else the simulator
    (``engine.workers`` = 1: None, ``run_algorithm``'s default) or engines on one worker pool for the whole
    run (``fedseg.engine.pool``), whose processes end when the context does (also on errors)."""
    if engine_factory is not None or cfg.engine.workers == 1:
        yield engine_factory
        return
    from fedseg.engine.pool import PoolEngine, WorkerPool

    devices = cfg.engine.devices or [cfg.device]
    with WorkerPool(prep.site_data, cfg.engine.workers, cfg.threads, devices) as pool:

        def pool_engine(name: str, spec, options, prep: Prepared, out: Path, observers: list | None) -> PoolEngine:
            store = state_store(prep.task.cfg, [d.name for d in prep.site_data], out / "states" / name)
            client = spec.client()
            return PoolEngine(name, client, pool, prep.site_data, prep.task, options, out / "samples", observers, store)

        yield pool_engine


def check_sampling(cfg: RunConfig, num_sites: int, where: str) -> None:
    """Before any work: ``fl.clients_per_round`` fits the federation and every federated method of the run may
    sample (``fedseg.algorithms.fedavg.sampling_refusal``); the baselines (centralized, local) do not sample."""
    from fedseg.engine.sampling import sample_count

    value = cfg.fl.clients_per_round
    k = sample_count(num_sites, value)
    if k == num_sites:
        return
    for name in cfg.algorithms:
        spec = get_algorithm(name)
        if not spec.federated:
            continue
        if (why := sampling_refusal(spec)) is not None:
            raise ValueError(
                f"fl.clients_per_round = {value}: {name} cannot train a sample of the sites per round: {why}. "
                f"Remove {name} from algorithms or unset fl.clients_per_round"
            )
        spec.check_sites(
            k, f"{where} sampled to {k} sites per round (fl.clients_per_round = {value})", cfg.methods.get(name)
        )


LOCAL_MODELS_WARN_SITES = 20  # above this many sites the K x K test evaluations of eval.local_models are announced


def cost_warnings(cfg: RunConfig, num_sites: int) -> list[str]:
    """Lines announcing what will make this run slow or unusual, shown once when it starts (``run_experiment``):
    each algorithm's option warnings (:func:`option_warnings`), and with
    ``eval.local_models`` on and more than ``LOCAL_MODELS_WARN_SITES`` sites, every method that keeps local
    models scores each site's model on every site's test split, K x K evaluations (K = 100: 10,000)."""
    lines = [line for n in cfg.algorithms for line in option_warnings(n, cfg, num_sites)]
    keeping = [n for n in cfg.algorithms if getattr(get_algorithm(n).server, "KEEPS_LOCAL_MODELS", False)]
    if not (cfg.eval.local_models and keeping and num_sites > LOCAL_MODELS_WARN_SITES):
        return lines
    k = num_sites
    return lines + [
        f"warning: eval.local_models is on: at test time {', '.join(keeping)} will score every site's local model on "
        f"every site's test split ({k} x {k} = {k * k} evaluations each); set eval.local_models=false to turn it off"
    ]


def option_warnings(name: str, cfg: RunConfig, num_sites: int) -> list[str]:
    """What algorithm ``name``'s options say about running on ``num_sites`` sites (an options model's
    ``site_warnings(num_sites, algorithm)``, e.g. SoftPull's lambda below 1/K)."""
    options = get_algorithm(name).parse_options(cfg.methods.get(name))
    warn = getattr(options, "site_warnings", None)
    return list(warn(num_sites, name)) if warn is not None else []


def method_notes(cfg: RunConfig, task: Task) -> list[str]:
    """Lines saying what a method's options mean on this run's network (an options model's ``run_note(task,
    algorithm)``, e.g. FedPer's share of private parameters), shown once when the run starts."""
    notes = (getattr(get_algorithm(n).parse_options(cfg.methods.get(n)), "run_note", None) for n in cfg.algorithms)
    return [note(task, n) for n, note in zip(cfg.algorithms, notes) if note is not None]


def announce(out: Path, line: str, on_log_line: Callable[[str], None] | None) -> None:
    """Append ``line`` to ``out/run.log`` and show it: through ``on_log_line`` if given, else on stderr."""
    append_line(out, line)
    if on_log_line is not None:
        on_log_line(line)
    else:
        print(line, file=sys.stderr, flush=True)


def run_algorithm(
    name: str,
    prep: Prepared,
    out: Path,
    resume: bool,
    observers: list | None = None,
    on_round_end: RoundCallback | None = None,
    engine_factory: EngineFactory | None = None,
    on_log_line: Callable[[str], None] | None = None,
    earlier: dict[str, AlgorithmResult] | None = None,
    keep_checkpoints: bool = False,
    tracker: Tracker | None = None,
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
    starts from one of their models (``fedseg.start_from``).

    When it finishes, the trained models go to ``out/model/<name>/`` and the checkpoint becomes a small
    "finished" record (results, the weights file's digest); a resume reuses it, reading the models back
    from that folder. ``keep_checkpoints``: the finished checkpoint also holds the models (``--keep-checkpoints``).

    ``tracker`` (``fedseg.tracking``): gets each round's metrics when its checkpoint is on disk (as run.log)
    and the test results after the finished checkpoint, so a resumed run logs nothing twice."""
    spec = get_algorithm(name)
    options = spec.parse_options(prep.task.cfg.methods.get(name))
    if (method_cfg := spec.run_config(prep.task.cfg)) is not prep.task.cfg:  # the method's own rounds
        prep = replace(prep, task=replace(prep.task, cfg=method_cfg))
    cfg, earlier = prep.task.cfg, earlier or {}
    engine: Engine = (engine_factory or simulator_engine)(name, spec, options, prep, out, observers)
    engine.all_sites_required = spec.needs_every_site  # fl.on_failure = skip cannot apply to it
    server = spec.server(engine, prep.task, options)
    if (initial := start_weights(options, earlier, prep.task)) is not None:  # e.g. finetune: fedavg's model
        server.global_weights = dict(initial)
    sites = engine.sites
    ckpt_path = out / "checkpoints" / f"{name}.pt"
    remove_temp_files(ckpt_path)  # left by a process killed mid-write
    ckpt = load_checkpoint(ckpt_path) if resume else None
    if ckpt and ckpt.get("finished"):
        remove_best_files(ckpt_path, keep=None)  # in case the run stopped right after finishing
        return AlgorithmResult(
            name,
            ckpt["test_rows"],
            ckpt["rounds_rows"],
            ckpt["ledger"],
            ckpt["summary"],
            finished_bundle(ckpt, ckpt_path, out / "model" / name),
            ckpt["metric_rows"],
        )

    start, rounds_rows, metric_rows, best = 1, [], [], None
    stopped: str | None = None  # the fl.stop rule that ended training early (fedseg.stopping)
    validated: dict[int, float] = {}  # round -> mean validation Dice over sites
    if ckpt and not getattr(engine, "supports_resume", True):
        raise ValueError(
            f"{ckpt_path}: cannot resume {name!r} on this engine ({type(engine).__name__}): "
            "the sites' client states are not in the checkpoint; start a new run (another --out)"
        )
    if ckpt:
        server.load_state_dict(ckpt["server"])
        engine.restore_clients(ckpt["clients"])
        engine.ledger = Ledger.from_dicts(ckpt["ledger"])
        start, rounds_rows, metric_rows, best = (
            ckpt["round"] + 1,
            ckpt["rounds_rows"],
            ckpt["metric_rows"],
            ckpt["best"],
        )
        best = restore_best(best, ckpt, ckpt_path, engine)
        stopped = ckpt.get("stopped")
        validated = dict(ckpt.get("validated") or validated_from_rows(rounds_rows))  # older checkpoints: from rows

    if tracker:  # one tracking run per algorithm; a resumed one is continued
        tracker.start(name, cfg, start)
    last = cfg.fl.rounds if stopped is None else start - 1  # a resumed run that had stopped trains no more
    val_cases = {s: engine.num_samples(s, "val") for s in sites}
    with CheckpointWriter() as writer:
        for rnd in range(start, last + 1):
            engine.round = rnd
            began = time.perf_counter()
            losses = server.run_round(rnd)
            over_budget = None  # a budget reached in this round makes it the last: validated (and checked again after)
            if has_budget(cfg.fl.stop) and server.selectable(rnd):
                over_budget = budget_reached(cfg.fl.stop, budget_used(engine.ledger.rows, cfg.cost, val_cases))
            if rnd % cfg.fl.validate_every == 0 or rnd == cfg.fl.rounds or over_budget:
                per_site = site_means(server.evaluate("val"), server.site_model, sites)
                for site in sites:
                    rounds_rows.append(
                        {
                            "algorithm": name,
                            "round": rnd,
                            "site": site,
                            "val_dice": per_site[site],
                            "train_loss": losses.get(site, float(np.mean(list(losses.values())))),
                        }
                    )
                metric_rows += [{"algorithm": name, "round": rnd, **row} for row in server.round_metrics()]
                validated[rnd] = per_site["client_avg"]
            state = {"server": clone(server.state_dict()), "clients": engine.snapshot_clients()}  # copies: frozen
            if (
                rnd in validated
                and server.selectable(rnd)
                and (best is None or nan_low(validated[rnd]) > nan_low(best["score"]))
            ):
                best = {"round": rnd, "score": validated[rnd], **state}
            if best is not None and server.selectable(rnd) and rnd < cfg.fl.rounds:
                used = budget_used(engine.ledger.rows, cfg.cost, val_cases) if has_budget(cfg.fl.stop) else None
                stopped = stop_reason(cfg.fl.stop, selectable_scores(validated, server), rnd, used)
            writer.save(
                ckpt_path,
                {
                    "round": rnd,
                    **state,
                    "ledger": engine.ledger.as_dicts(),
                    "rounds_rows": list(rounds_rows),
                    "metric_rows": list(metric_rows),
                    "best": stored_best(best, rnd, ckpt_path, writer),
                    "stopped": stopped,
                    "validated": dict(validated),
                },
                frozen=True,
            )
            line = round_line(name, rnd, cfg.fl.rounds, validated.get(rnd), losses, time.perf_counter() - began)

            tracked = (
                None
                if tracker is None
                else round_record(name, rnd, rounds_rows, metric_rows, validated.get(rnd), losses, engine.ledger)
            )

            named = [state["clients"], best["clients"]] if best else [state["clients"]]

            def after_checkpoint(keep=best and best.get("file"), line=line, tracked=tracked, named=named) -> None:
                remove_best_files(ckpt_path, keep)
                engine.checkpointed(named)  # e.g. Flower: the sites may drop older snapshots
                log_round(out, line, on_log_line)  # once the round's checkpoint is on disk: never twice
                if tracker is not None and tracked is not None:
                    tracker.log_round(tracked)  # likewise

            writer.then(after_checkpoint)
            if on_round_end:
                on_round_end(name, rnd, losses)
            if stopped:
                last = rnd
                break

    assert best is not None, "fl.rounds >= 1 and the last round is always validated"
    engine.round = last
    # Before the restore: the sites' kept local models are then their best over *all* rounds (the
    # restored states hold only the best up to the selected round; fedseg.algorithms.fedavg).
    server.collect_local_models()
    server.load_state_dict(best["server"])
    if not server.SELECTS_PER_SITE:  # per-site selection: each site's state holds its own choice
        engine.restore_clients(best["clients"])
    server.finalize()
    test_rows = server.evaluate("test", sample=True)
    bundle = server.bundle()
    summary = summarize(
        name,
        test_rows,
        server.site_model,
        sites,
        engine.ledger,
        last,
        best["round"],
        cost=combined_cost(
            options, earlier, engine.ledger.as_dicts(), cfg.cost, {s: engine.num_samples(s, "val") for s in sites}
        ),
    )
    if server.SELECTS_PER_SITE:  # the round each site's tested model comes from (its own best on validation)
        summary["selected_rounds"] = dict(server.selected_rounds)
    summary.update(spec.summary_fields())
    summary.update(getattr(server, "summary_fields", dict)())  # a server's own, e.g. fedavg-dp's privacy
    summary["train_samples"] = {s: engine.num_samples(s, "train") for s in sites}
    summary["site_models"] = {s: server.site_model(s) for s in sites}  # the model each site's scores come from
    summary["convergence"] = convergence(
        selectable_scores(validated, server), last, best["round"], cfg.fl.stop, stopped
    )
    summary["failures"] = engine.ledger.failures()  # replies left out (fl.on_failure = skip)
    if cfg.fl.clients_per_round is not None and spec.federated and sampling_refusal(spec) is None:  # who trained
        summary["sampled_sites"] = {str(r): server.participants(r) for r in range(1, last + 1)}
    result = AlgorithmResult(name, test_rows, rounds_rows, engine.ledger.as_dicts(), summary, bundle, metric_rows)
    finished = {
        "finished": True,
        "test_rows": test_rows,
        "rounds_rows": rounds_rows,
        "ledger": result.ledger,
        "summary": summary,
        "metric_rows": metric_rows,
        # the models, on disk before the checkpoint that relies on them (run_experiment rewrites them unchanged)
        "bundle_sha256": write_bundle_files(out / "model" / name, bundle, cfg, prep.federation),
        "bundle_order": bundle_order(bundle),
    }
    save_checkpoint(ckpt_path, {**finished, "bundle": bundle} if keep_checkpoints else finished)
    remove_best_files(ckpt_path, keep=None)  # only now: the checkpoint on disk no longer names them
    if (close := getattr(engine, "close", None)) is not None:  # e.g. the state files of engine.state: disk
        close()
    if tracker:  # after the finished checkpoint: a resume never logs the test twice
        tracker.finish(name, cfg, summary)
    return result


def is_finished(ckpt_path: Path) -> bool:
    """Whether ``ckpt_path`` is a finished algorithm's checkpoint (a resume reuses it without training)."""
    ckpt = load_checkpoint(ckpt_path)
    return bool(ckpt and ckpt.get("finished"))


def finished_bundle(ckpt: dict, ckpt_path: Path, folder: Path) -> dict:
    """The trained models of a finished checkpoint: in it (``keep_checkpoints``, or a run of an older
    fedseg), else read back from the run's ``model/<algorithm>/``, which must hold what was written then."""
    if "bundle" in ckpt:
        return ckpt["bundle"]
    try:
        return read_bundle(folder, ckpt.get("bundle_sha256"), ckpt.get("bundle_order"))
    except ValueError as e:
        raise ValueError(
            f"{ckpt_path}: finished, but its trained models cannot be reused: {e}; "
            f"delete {ckpt_path} to train it again, or start a new run (another --out)"
        ) from None


# --- the best round in the checkpoint -------------------------------------------------------
# The best round's states are needed to resume. If it is the checkpointed round itself, the
# checkpoint says so ({"current": True}: its states are the checkpoint's own); if it is an earlier
# round, its states are written once, to CHECKPOINT.best-<round>.pt, the first time a later
# checkpoint needs them, and every checkpoint after that names that file. A best file is deleted
# only after a checkpoint that no longer names it is on disk.
def best_path(ckpt_path: Path, rnd: int) -> Path:
    return ckpt_path.with_name(f"{ckpt_path.stem}.best-{rnd}.pt")


def stored_best(best: dict | None, rnd: int, ckpt_path: Path, writer: CheckpointWriter) -> dict | None:
    """What round ``rnd``'s checkpoint records about ``best`` (queues the best file's write if needed)."""
    if best is None:
        return None
    if best["round"] == rnd:
        return {"round": rnd, "score": best["score"], "current": True}
    if "file" not in best:
        path = best_path(ckpt_path, best["round"])
        writer.save(path, {"server": best["server"], "clients": best["clients"]}, frozen=True)
        best["file"] = path.name
    return {"round": best["round"], "score": best["score"], "file": best["file"]}


def restore_best(stored: dict | None, ckpt: dict, ckpt_path: Path, engine) -> dict | None:
    """The in-memory best round (with its states) from a checkpoint's record (see ``stored_best``)."""
    if stored is None:
        return None
    if stored.get("current"):
        return {**stored, "server": clone(ckpt["server"]), "clients": engine.snapshot_clients()}
    states = load_checkpoint(ckpt_path.with_name(stored["file"]))
    if states is None:
        raise FileNotFoundError(
            f"{ckpt_path.with_name(stored['file'])}: missing (the best round's states; "
            f"{ckpt_path} names it); cannot resume, start a new run"
        )
    return {**stored, **states}


def remove_best_files(ckpt_path: Path, keep: str | None) -> None:
    for path in ckpt_path.parent.glob(f"{ckpt_path.stem}.best-*.pt"):
        if path.name != keep:
            path.unlink(missing_ok=True)
    fsync_dir(ckpt_path.parent)


def validated_from_rows(rounds_rows: list[dict]) -> dict[int, float]:
    """round -> mean validation Dice over sites (NaN sites left out), rebuilt from ``rounds.csv`` rows."""
    by_round: dict[int, list[float]] = {}
    for row in rounds_rows:
        by_round.setdefault(int(row["round"]), []).append(float(row["val_dice"]))
    return {rnd: finite_mean(np.array(values)) for rnd, values in by_round.items()}


def selectable_scores(validated: dict[int, float], server) -> dict[int, float]:
    """The validated rounds' mean validation Dice, of the rounds whose model may be selected (the plateau rule's)."""
    return {rnd: score for rnd, score in validated.items() if server.selectable(rnd)}


def nan_low(score: float) -> float:
    """A validation score for comparisons: NaN (no site could be scored) ranks below every number."""
    return -math.inf if math.isnan(score) else score


def summarize(
    name, test_rows, site_model, sites, ledger: Ledger, rounds: int, best_round: int, cost: dict | None = None
) -> dict:
    """The ``summary.json`` entry of one algorithm (see DESIGN.md "Run outputs"); ``cost``: the
    FeTS Table 2 cost object (:func:`fedseg.evaluate.cost.cost_table`)."""
    own = lambda r: r["model"] == site_model(r["site"])  # noqa: E731
    entry = {
        **{m: site_summary(test_rows, name, m, sites, model_filter=own) for m in METRIC_NAMES},
        "rounds": rounds,
        "best_round": best_round,
        **ledger.totals(),
    }
    if any(r["model"] != site_model(r["site"]) for r in test_rows):
        entry.update(cross_site_summary(test_rows, sites))
    if cost is not None:
        entry["cost"] = cost
    return entry


def cross_site_summary(rows: list[dict], sites: list[str]) -> dict:
    """Cross-site matrix of per-site models ("local:<site>" on every test site; ``rows``: one
    algorithm's) with its diagonal/off-diagonal means."""
    from fedseg.evaluate.tables import cross_site_matrix

    matrix = cross_site_matrix(rows, "dice", sites, algorithm=None)
    off = ~np.eye(len(sites), dtype=bool)
    return {
        "cross_site": {"dice": {a: {b: float(matrix[i, j]) for j, b in enumerate(sites)} for i, a in enumerate(sites)}},
        "local_avg": finite_mean(np.diag(matrix)),
        "local_gen": finite_mean(matrix[off]),  # NaN with one site (no off-diagonal)
    }


def finite_mean(values: np.ndarray) -> float:
    """Mean of the non-NaN ``values``; NaN (without numpy's empty-slice warning) when there are none."""
    kept = values[~np.isnan(values)]
    return float(kept.mean()) if kept.size else math.nan


def clone(state: dict) -> dict:
    return {k: v.clone() for k, v in state.items()}


def run_experiment(
    cfg: RunConfig,
    out: Path,
    resume: bool = False,
    observers: list | None = None,
    on_round_end: RoundCallback | None = None,
    on_algorithm_start: Callable[[str], None] | None = None,
    federation: Federation | None = None,
    prepared: Prepared | None = None,
    engine_factory: EngineFactory | None = None,
    on_log_line: Callable[[str], None] | None = None,
    keep_checkpoints: bool = False,
) -> RunResults:
    """Check the device, ``out``, the options, the data and (``resume``) that the configuration equals the
    recorded one (``fedseg.preflight``) before writing anything; record ``config.yaml``; then run every
    algorithm and write the outputs.

    ``prepared`` skips loading data here (an engine whose sites hold their own data, e.g. Flower,
    needs only the federation's header, site names and the Task); ``engine_factory``, ``keep_checkpoints``:
    see ``run_algorithm``.

    ``model.name: planned`` (``fedseg.plan``): the sites' fingerprints are collected and the run planned before
    any case is pre-processed (``prepare_planned``); every algorithm trains under the config with the plan
    applied, ``config.yaml`` keeps the config as given, ``plan.json`` the plan (a resume reuses it) and
    ``summary.json`` the plan with its traffic (``ledger.csv``: rows of algorithm ``plan``)."""
    if engine_factory is None and cfg.engine.workers > 1:  # the worker pool's server imports while we prepare
        start_forkserver()
    if prepared is None:  # else (Flower) the sites compute, on their machines: ``fedseg flower local`` checks
        check_device(cfg.device)
    out = Path(out)
    check_out_dir(out)
    torch.set_num_threads(cfg.threads)
    for name in cfg.algorithms:  # unknown names and bad options fail before any work
        get_algorithm(name).parse_options(cfg.methods.get(name))
    check_method_names(cfg.methods)
    check_available(cfg.tracking)  # so does a tracker whose package is missing (fedseg.tracking)
    if resume and (recorded := recorded_config(out / "config.yaml")) is not None:
        check_resume(recorded, cfg.model_dump(mode="json"), str(out / "config.yaml"))
    if cfg.model.name == "planned" and prepared is not None:
        raise ValueError(
            "model.name planned: the sites' fingerprints are collected before their data is pre-processed, which "
            "this engine (sites holding their own data, e.g. Flower) does not do yet; run it with `fedseg run`, or "
            "copy the model and data settings of a planned run's plan.json into the config"
        )
    if cfg.model.name == "planned":
        prep = prepare_planned(cfg, out, resume, federation)
    else:
        prep = prepared or prepare(cfg, federation)
    check_sites(cfg, len(prep.federation.sites), f"federation {prep.federation.name!r}")
    check_fault_sites(cfg.faults, [s.name for s in prep.federation.sites], f"federation {prep.federation.name!r}")
    check_sampling(cfg, len(prep.federation.sites), f"federation {prep.federation.name!r}")
    for device in cfg.engine.devices or []:  # the worker pool's device slots
        check_device(device)
    for name in cfg.algorithms:  # options that depend on the network (e.g. FedPer's private_layers)
        get_algorithm(name).check_task(prep.task, cfg.methods.get(name))
    check_start_from(cfg, {n: get_algorithm(n).parse_options(cfg.methods.get(n)) for n in cfg.algorithms}, prep.task)
    if out.exists() and any(out.iterdir()) and not resume and (out / "checkpoints").exists():
        raise FileExistsError(f"{out}: already holds a run; use --resume to continue it or choose another --out")
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out / "config.yaml", dump_config(cfg))  # recorded before training: resume compares with it
    if prep.plan is not None:  # model.name planned: what the run trains with; a resume reuses it
        atomic_write_text(out / PLAN_FILE, json.dumps(prep.plan.to_dict(), indent=2))
    for line in cost_warnings(cfg, len(prep.federation.sites)):
        announce(out, line, on_log_line)
    for line in method_notes(cfg, prep.task):
        announce(out, line, on_log_line)
    finished = resume and all(is_finished(out / "checkpoints" / f"{name}.pt") for name in cfg.algorithms)
    provenance = (finished and unchanged(out)) or {  # accel: the effective train.amp / channels_last / ...
        **begin(out, resume, cfg.device),
        "accel": resolve(cfg.train, cfg.device).record(),
    }
    results = RunResults(cfg, prep.federation, [], provenance)
    if prep.plan is not None:
        results.plan, results.plan_ledger, results.planned_cfg = prep.plan.summary(), prep.plan.ledger, prep.task.cfg
    tracker = open_tracker(cfg, out, resume)  # None: tracking is off
    with local_engines(cfg, prep, engine_factory) as factory:  # engine.workers > 1: one worker pool per run
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
            )
            results.algorithms.append(result)
            family = get_algorithm(name).family
            if family and family.after_test:  # e.g. FedSM: the selector's features of the test images (Fig. 3)
                family.after_test(out, name, result.bundle, prep.site_data, prep.task)
            write_outputs(out, results)
    return results
