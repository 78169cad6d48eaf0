"""The worker pool's process server, started early (stdlib only: importing this module costs no torch import).

``fedseg.engine.pool`` starts its workers from a ``forkserver``: one clean process that imports fedseg and torch
once (``PRELOAD``, about 6 s on one core) and forks every worker from there. Started when the pool is built, those
imports come after the parent's own imports and data preparation and the run waits for them; :func:`start_forkserver`
starts the server at once (``fedseg run`` calls it as soon as the config says ``engine.workers > 1``, before it
imports torch), so its imports run on another core while the parent imports and prepares the data.
"""

from __future__ import annotations

import importlib
import multiprocessing
import signal
import threading
from collections.abc import Callable, Sequence

# forkserver: one clean server process imports fedseg and torch once (before any torch thread runs) and
# forks every worker from it, so a worker (or a replacement) starts in milliseconds, not after seconds of
# imports; spawn where there is no forkserver. Never fork the parent: its torch threads make that unsafe.
START_METHOD = "forkserver" if "forkserver" in multiprocessing.get_all_start_methods() else "spawn"
# Imported once, before any fork: fedseg.engine.server_preload imports the rest (MONAI's lean import, the pool,
# every method, torch._dynamo) and ends the server quietly on a Ctrl-C during those imports.
PRELOAD = ["fedseg.engine.server_preload"]


# What the parent may import while its pool starts (``start_forkserver``'s ``while_waiting``; empty: nothing).
_while_waiting: list[Callable[[], Sequence[str]]] = []


def start_forkserver(while_waiting: Callable[[], Sequence[str]] | None = None) -> None:
    """Start the process server with ``PRELOAD`` now, if this platform has one and it does not run yet; returns
    at once (the server imports in the background). The pool's workers are forked from it later.

    ``while_waiting``: gives the names of modules this process will need after the run (``fedseg run``: its
    report's, ~1 s); the pool imports them in a thread while it waits for the server to finish its imports (the
    server has one more to do than the parent, ``torch._dynamo``, so the parent otherwise idles ~1 s there)."""
    if while_waiting is not None:
        _while_waiting[:] = [while_waiting]
    ensure_server()


def ensure_server() -> None:
    """Start the process server with ``PRELOAD`` if this platform has one and it does not run yet (returns at once).
    It starts with Ctrl-C (SIGINT) blocked, a mask it inherits: ``fedseg.engine.server_preload`` unblocks it once
    it can end the server quietly, so a Ctrl-C in the server's first moments prints no traceback."""
    if START_METHOD != "forkserver":
        return
    multiprocessing.get_context("forkserver").set_forkserver_preload(PRELOAD)
    from multiprocessing import forkserver, resource_tracker

    # the resource tracker first: starting it unblocks SIGINT in this thread (CPython 3.11-3.13), which would
    # undo the block below before the server is spawned
    resource_tracker.ensure_running()
    held = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        forkserver.ensure_running()
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, held)


def import_while_waiting() -> threading.Thread:
    """Import the modules of ``start_forkserver``'s ``while_waiting`` in a daemon thread (started; join it before
    going on, so that no other import runs beside it). Best effort: a module that fails to import is left for
    its real import to report."""

    def load() -> None:
        try:
            names = [name for provider in _while_waiting for name in provider()]
            for name in names:
                importlib.import_module(name)
        except Exception:  # noqa: BLE001, S110 - the real import reports it
            pass

    thread = threading.Thread(target=load, name="fedseg-import-while-waiting", daemon=True)
    thread.start()
    return thread
