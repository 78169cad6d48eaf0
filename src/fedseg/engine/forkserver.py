"""The worker pool's process server, started early (stdlib only: importing this module costs no torch import).

``fedseg.engine.pool`` starts its workers from a ``forkserver``: one clean process that imports fedseg and torch
once (``PRELOAD``, about 6 s on one core) and forks every worker from there. Started when the pool is built, those
imports come after the parent's own imports and data preparation and the run waits for them; :func:`start_forkserver`
starts the server at once (``fedseg run`` calls it as soon as the config says ``engine.workers > 1``, before it
imports torch), so its imports run on another core while the parent imports and prepares the data.
"""

from __future__ import annotations

import multiprocessing

# forkserver: one clean server process imports fedseg and torch once (before any torch thread runs) and
# forks every worker from it, so a worker (or a replacement) starts in milliseconds, not after seconds of
# imports; spawn where there is no forkserver. Never fork the parent: its torch threads make that unsafe.
START_METHOD = "forkserver" if "forkserver" in multiprocessing.get_all_start_methods() else "spawn"
# Imported once, before any fork: server_preload first (fedseg.lean_monai's hook, before MONAI's import); the
# optimizers import torch._dynamo at their first step (~800 modules, 2 s per worker otherwise).
PRELOAD = ["fedseg.engine.server_preload", "fedseg.engine.pool", "fedseg.algorithms", "torch._dynamo"]


def start_forkserver() -> None:
    """Start the process server with ``PRELOAD`` now, if this platform has one and it does not run yet; returns
    at once (the server imports in the background). The pool's workers are forked from it later."""
    if START_METHOD != "forkserver":
        return
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(PRELOAD)
    from multiprocessing import forkserver

    forkserver.ensure_running()
