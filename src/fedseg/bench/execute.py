"""Running a bench's runs: resumable, ``jobs`` runs at a time, with progress (the phases: ``fedseg.bench.phases``).

A finished run leaves ``bench-run.json`` (its configuration) in its folder; a resumed bench reuses such a run
without starting it, continues a half-done one from its last checkpoint (``fedseg run --resume``) and starts the
rest.

``jobs`` > 1 trains that many runs at once, each in a fresh process (``forkserver``; its own torch threads, as
the run's ``threads`` says), so runs never share state and their numbers equal a ``jobs`` = 1 bench's. On Linux
the process server and every run process end with the bench however it ends (SIGKILL too), so no run trains on. A fresh
process knows the built-in methods, and those a script registers at its top level (it runs that again as it
starts); the bench's methods registered in this process (``register_algorithm``, under ``if __name__ ==
"__main__":`` too) are sent to each run's process and registered there (:func:`job_registrations`: a class the
processes cannot import is refused before any run starts), and so are the federations registered here that its runs
read (:func:`job_federations`: a builder that cannot be sent, a lambda, is refused first). The runs at once
share the machine's memory, and each run's memory check (``fedseg.data.memory_guard``) would see all of it free, so
N runs each judged to fit could together exhaust it: each run process is told its share (:func:`job_memory_share`:
``FEDSEG_MEMORY_SHARE`` and ``FEDSEG_MEMORY_SHARED``, 1/N of the memory available to the bench as it starts them).
"""

from __future__ import annotations

import json
import multiprocessing
import os
import pickle
import queue
import signal
import time
import traceback
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from multiprocessing.process import BaseProcess
from pathlib import Path
from typing import TYPE_CHECKING

from fedseg.atomic_files import atomic_write_text, json_number, strict_json_text
from fedseg.bench.plan import BenchRun, reference_method, run_config
from fedseg.bench.spec import BenchSpec
from fedseg.config import RunConfig
from fedseg.config_load import with_recorded_defaults, without_idle_methods
from fedseg.engine.forkserver import die_with_parent, ensure_server, server_pid
from fedseg.interrupts import INTERRUPTED_EXIT, stop_processes
from fedseg.run.said_once import said_environment
from fedseg.run.stopping import recorded_not_converged

if TYPE_CHECKING:
    from fedseg.algorithms.registry import AlgorithmSpec
    from fedseg.data.sources import RegisteredFederation

DONE_FILE = "bench-run.json"


class RunFailed(ValueError):
    """A bench run's process ended without an answer (killed, e.g. out of memory); the CLI prints one line."""


Echo = Callable[[str], None]


@dataclass
class Finished:
    """A finished run: its plan entry, folder and ``summary.json``, and the wall seconds it took here (0: reused)."""

    run: BenchRun
    dir: Path
    summary: dict
    seconds: float

    def entry(self, name: str) -> dict:
        return self.summary["algorithms"][name]


JOBS_FIX = "define it in a .py module the run processes can import, or use --jobs 1"


def job_registrations(bench: BenchSpec) -> tuple[AlgorithmSpec, ...]:
    """The methods the bench trains that were registered in this process (``register_algorithm``), which each run's
    process registers again (:func:`_train_in_process`); a ValueError naming the method and what cannot travel
    (a class defined in a notebook or inside a function: ``fedseg.engine.worker_imports.check_sendable``), before
    any run starts."""
    from fedseg.algorithms import ALGORITHMS, BUILTIN_ALGORITHMS, PLUGINS
    from fedseg.engine.worker_imports import check_sendable

    trained = dict.fromkeys(a for m in [*bench.methods, reference_method(bench)] for a in m.trained)
    own = BUILTIN_ALGORITHMS | set(PLUGINS)  # installed plugins: each run's process loads them itself
    specs = tuple(ALGORITHMS[name] for name in trained if name in ALGORITHMS and name not in own)
    for spec in specs:
        check_sendable(spec.name, spec, JOBS_WHERE, JOBS_FIX)
        check_pickles(spec, f"method {spec.name!r}", JOBS_FIX)
    return specs


JOBS_WHERE = "bench --jobs > 1 (each run in a new process)"


def check_pickles(thing: object, what: str, fix: str) -> None:
    """A ValueError (one line: ``what`` cannot be sent to the run processes, why, ``fix``) where ``thing`` does not
    survive pickling, as it must to reach a bench's run processes."""
    try:
        pickle.loads(pickle.dumps(thing))
    except Exception as e:  # noqa: BLE001 - any pickling problem: said in one line before any run
        raise ValueError(
            f"{JOBS_WHERE}: {what} cannot be sent to the run processes ({type(e).__name__}: {e}); {fix}"
        ) from None


def job_federations(configs: Iterable[RunConfig]) -> tuple[RegisteredFederation, ...]:
    """The federations registered in this process (``register_federation``) that ``configs`` read
    (``data.source``), which each run's process registers again (a script's registration under ``if __name__ ==
    "__main__":`` does not run there); a ValueError naming the one whose builder cannot be sent (a lambda, a ready
    ``Federation`` given to ``register_federation``, a function defined in a notebook), before any run starts."""
    from fedseg.data.sources import REGISTERED

    registered = tuple(REGISTERED[name] for name in dict.fromkeys(c.data.source for c in configs) if name in REGISTERED)
    fix = "register it with a builder function defined in a .py module the run processes can import, or use --jobs 1"
    for federation in registered:
        check_pickles(federation, f"federation {federation.name!r}", fix)
    return registered


def job_memory_share(runs: int) -> dict[str, str]:
    """The environment that tells each of ``runs`` run processes at once its share of the memory
    (``fedseg.data.memory_guard.memory_share``): ``FEDSEG_MEMORY_SHARE`` = ``runs`` and ``FEDSEG_MEMORY_SHARED`` =
    the bytes available to this process now (its own share where it is itself told one), measured once here, as
    the runs start, not by each run: a run started later sees what the others already hold. Nothing for a single
    run, under ``FEDSEG_MEMORY_CHECK=off`` (inherited: no run checks), or where the memory cannot be read (macOS:
    no run checks either)."""
    from fedseg.data.memory_guard import (
        MEMORY_SHARE_ENV,
        MEMORY_SHARED_ENV,
        check_off,
        memory_available,
        memory_share,
        shared_available,
    )

    if runs < 2 or check_off():
        return {}
    available = shared_available(memory_available(), memory_share())
    if available is None:
        return {}
    return {MEMORY_SHARE_ENV: str(runs), MEMORY_SHARED_ENV: str(available[0])}


def _train_in_process(
    cfg_json: dict,
    out: str,
    results,
    registered: tuple[AlgorithmSpec, ...] = (),
    federations: tuple[RegisteredFederation, ...] = (),
    environment: dict[str, str] | None = None,
    parent: int | None = None,
) -> None:
    """A bench process's target: end with ``parent`` (the process server that forked it, which ends with the bench:
    ``fedseg.engine.server_preload``), so a bench killed by SIGKILL leaves no run training on; set ``environment``
    (:func:`job_memory_share`), register ``registered`` (the bench's methods registered in the parent,
    ``job_registrations``: a script's ``if __name__ == "__main__":`` block does not run here), ``train`` one run,
    then put ``(out, seconds, None)`` on ``results``, or ``(out, None, exception)`` when it failed, and exit;
    interrupted (SIGINT from the bench or Ctrl-C) before its answer is ready, it leaves quietly. Once the answer is
    ready, SIGINT is ignored, so an interrupt cannot cut it short (ignored, not blocked: blocking holds it back from
    this thread only, and Python runs its handler in the main thread whichever thread received it; the bench stops
    the other runs with SIGINT as soon as one fails)."""
    answer: tuple[str, float | None, BaseException | None]
    # the bench stops its runs with SIGINT: taken as Ctrl-C even where this process inherited it ignored (a bench
    # started in the background by a script, `fedseg bench ... &`, whose SIGINT stopped no run: SIGKILL after 20 s)
    if not die_with_parent(signal.SIGKILL, parent):  # its server (so the bench) ended before the signal was set
        os._exit(INTERRUPTED_EXIT)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    os.environ.update(environment or {})
    try:
        try:
            if registered:
                from fedseg.algorithms import register_algorithm

                for spec in registered:
                    register_algorithm(spec, replace=True)
            if federations:
                from fedseg.data.sources import REGISTERED

                REGISTERED.update({federation.name: federation for federation in federations})
            answer = (out, train(cfg_json, out), None)
        except KeyboardInterrupt:
            raise
        except BaseException as e:
            answer = (out, None, _portable(e, traceback.format_exc()))
        signal.signal(signal.SIGINT, signal.SIG_IGN)
    except KeyboardInterrupt:
        os._exit(INTERRUPTED_EXIT)  # no traceback: the bench says what happened
    results.put(answer)
    results.close()
    results.join_thread()  # the answer is in the pipe before the process ends
    os._exit(0)


def _portable(error: BaseException, child_traceback: str) -> BaseException:
    """``error`` as the bench process will read it back: itself if it survives pickling both ways (an exception
    whose ``__init__`` takes other arguments pickles but does not load), else a RuntimeError with its text; with
    the run process's traceback as a note, since the bench's own traceback ends at the queue."""
    try:
        portable = pickle.loads(pickle.dumps(error))
    except Exception:
        portable = RuntimeError(f"{type(error).__name__}: {error}")
    portable.add_note(f"raised in the bench's run process:\n{child_traceback.rstrip()}")
    return portable


def train(cfg_json: dict, out: str) -> float:
    """Train one run (in this process) to completion, resuming what is on disk; mark it done; wall seconds."""
    import torch

    from fedseg.run import run_experiment

    cfg = RunConfig.model_validate(cfg_json)
    torch.set_num_threads(cfg.threads)
    began = time.perf_counter()
    results = run_experiment(cfg, Path(out), resume=True)
    if cfg.data.repartition.holdout is not None:
        score_unseen(cfg, Path(out), results)
    atomic_write_text(Path(out) / DONE_FILE, strict_json_text({"config": cfg_json}, indent=1))
    return time.perf_counter() - began


def score_unseen(cfg: RunConfig, out: Path, results) -> None:
    """A leave-one-out run: every trained model scored on all cases of the held-out site, ``out/unseen.csv`` +
    ``unseen.json`` (``fedseg.studies.unseen_rows``: FedSM Table 5 cells, per-case Dice in the JSON)."""
    from fedseg.data.repartition import repartition_all
    from fedseg.run import load_federation
    from fedseg.studies import UNSEEN, unseen_columns, unseen_rows, write_table

    full = repartition_all(load_federation(cfg), cfg.data.repartition, cfg.data.split, cfg.data.seed)
    assert cfg.data.repartition.holdout is not None  # the caller checks
    rows, _ = unseen_rows(results, full, cfg.data.repartition.holdout, ".")
    write_table(out, UNSEEN, unseen_columns(full.site_names), rows)


def is_done(folder: Path, cfg: RunConfig) -> bool:
    """Whether ``folder`` holds a finished bench run of exactly ``cfg``; a ValueError (one line) where it does but its
    methods resolved their options otherwise than they do now (``fedseg.run.method_record``: a method's defaults
    changed, another version of its code or of fedseg): reused, its numbers would join runs trained otherwise."""
    from fedseg.run.method_record import check_method_options

    marker = folder / DONE_FILE
    if not marker.is_file() or not (folder / "summary.json").is_file():
        return False
    try:  # normalized as a resume compares configurations: keys added by a later fedseg at their defaults
        recorded = RunConfig.model_validate(with_recorded_defaults(json.loads(marker.read_text()).get("config", {})))
    except (ValueError, TypeError):
        return False
    if without_idle_methods(recorded.model_dump(mode="json")) != without_idle_methods(cfg.model_dump(mode="json")):
        return False
    check_method_options(folder, cfg)
    return True


class Runner:
    """Executes lists of runs, ``jobs`` at a time, printing one line per finished run with an ETA."""

    def __init__(
        self,
        bench: BenchSpec,
        root: Path,
        out: Path,
        jobs: int,
        echo: Echo,
        train: bool = True,
        registered: tuple[AlgorithmSpec, ...] = (),
    ):
        self.bench, self.root, self.out, self.jobs, self.echo, self.train = bench, root, out, jobs, echo, train
        self.registered = registered  # jobs > 1: sent to each run's process (job_registrations)
        self.trained_seconds: dict[str, list[float]] = {}  # method -> wall seconds of its runs trained here

    def execute(self, runs: list[BenchRun], phase: str) -> dict[BenchRun, Finished]:
        unique = list(dict.fromkeys(runs))
        configs = {r: run_config(self.bench, self.root, r) for r in unique}
        done = {r: self._finished(r, 0.0) for r in unique if is_done(r.dir(self.out), configs[r])}
        todo = [r for r in unique if r not in done]
        self.echo(f"{phase}: {len(unique)} runs, {len(done)} done, {len(todo)} {'to train' if self.train else 'left'}")
        if not todo or not self.train:
            return done
        if self.jobs == 1:
            for r in todo:
                done[r] = self._finished(r, train(configs[r].model_dump(mode="json"), str(r.dir(self.out))))
                self._report(done[r], [t for t in todo if t not in done])
            return done
        return self._execute_in_processes(todo, configs, done)

    def _execute_in_processes(
        self, todo: list[BenchRun], configs: dict[BenchRun, RunConfig], done: dict[BenchRun, Finished]
    ) -> dict[BenchRun, Finished]:
        """``jobs`` runs at a time, each in a fresh process; a failure, Ctrl-C or SIGTERM (the CLI turns it into
        KeyboardInterrupt) starts no further run, stops the running ones (their last round's checkpoint stays)
        and leaves no process behind, then re-raises."""
        federations = job_federations(configs[r] for r in todo)  # registered here: sent along, checked first
        # each run's share of the memory; the bench's record of the notes shown (fedseg.run.said_once)
        environment = {**job_memory_share(min(self.jobs, len(todo))), **said_environment()}
        # the process server dies with this process however it ends (SIGKILL too), and each run's process with it
        ensure_server()
        context = multiprocessing.get_context("forkserver")
        results = context.Queue()  # (run folder, wall seconds, None) or (run folder, None, the exception)
        queued = list(todo)
        running: dict[str, tuple[BaseProcess, BenchRun]] = {}
        silent: dict[str, float] = {}  # run folder -> when its process was first seen ended without an answer
        try:
            while queued or running:
                while queued and len(running) < self.jobs:
                    r = queued.pop(0)
                    folder = str(r.dir(self.out))
                    child = context.Process(
                        target=_train_in_process,
                        args=(
                            configs[r].model_dump(mode="json"),
                            folder,
                            results,
                            self.registered,
                            federations,
                            environment,
                            server_pid(),
                        ),
                    )
                    child.start()
                    running[folder] = (child, r)
                try:
                    folder, seconds, error = results.get(timeout=1.0)
                except queue.Empty:
                    for where, (process, r) in running.items():
                        if process.exitcode is None:
                            continue
                        ended = silent.setdefault(where, time.monotonic())
                        if process.exitcode != 0 or time.monotonic() - ended > 30:  # its answer is not on the way
                            # killed (e.g. out of memory) before it could answer, or gone without a word
                            raise RunFailed(f"run {r.label} ended with exit code {process.exitcode}") from None
                    continue
                process, r = running.pop(folder)
                process.join(timeout=30)
                if error is not None:
                    raise error
                done[r] = self._finished(r, seconds)
                self._report(done[r], queued + [run for _, run in running.values()])
        except BaseException:
            stop_processes([p.pid for p, _ in running.values() if p.pid is not None and p.exitcode is None])
            for process, _ in running.values():
                process.join(timeout=1.0)
            raise
        return done

    def _finished(self, run: BenchRun, seconds: float) -> Finished:
        folder = run.dir(self.out)
        return Finished(run, folder, json.loads((folder / "summary.json").read_text()), seconds)

    def _report(self, fin: Finished, left: list[BenchRun]) -> None:
        self.trained_seconds.setdefault(fin.run.method, []).append(fin.seconds)
        eta, untimed = self._eta(left)
        method = self.bench.method(fin.run.method) if fin.run.method in self.bench.method_names else None
        entry = fin.entry(method.scored if method else fin.run.method)
        conv = entry.get("convergence", {})
        late = " (best round in the last 10%, at least 2, no plateau: may not have converged)" * recorded_not_converged(
            entry
        )
        late += " (validation never rose above its first validated round: did it train?)" * (
            conv.get("improved") is False
        )
        self.echo(
            f"  done {fin.run.label}: test Dice {json_number(entry['dice'].get('client_avg')):.4f}, validation "
            f"{json_number(conv.get('best_val_dice')):.4f} at round {conv.get('best_round')}/{conv.get('rounds')}"
            f"{late} [{fin.seconds:.0f} s; {len(left)} left, ETA {_duration(eta)}{untimed}]"
        )

    def _eta(self, left: list[BenchRun]) -> tuple[float, str]:
        """Seconds until the runs ``left`` are trained, ``jobs`` at a time: each at the mean time of its method's
        runs trained so far (methods differ: FedSM's runs take several FedAvg runs' time), a method without one
        at the mean of all; and a note naming how many runs that guess covers."""
        every = [s for times in self.trained_seconds.values() for s in times]
        overall = sum(every) / len(every)
        mean = {m: sum(times) / len(times) for m, times in self.trained_seconds.items()}
        guessed = [r for r in left if r.method not in mean]
        eta = sum(mean.get(r.method, overall) for r in left) / self.jobs
        return eta, f", {len(guessed)} of them of methods not timed yet" if guessed else ""


def _duration(seconds: float) -> str:
    seconds = int(round(seconds))
    return (
        f"{seconds // 3600}h{seconds % 3600 // 60:02d}m" if seconds >= 3600 else f"{seconds // 60}m{seconds % 60:02d}s"
    )
