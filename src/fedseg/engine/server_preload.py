"""What the worker pool's process server imports before it forks any worker (``fedseg.engine.forkserver.PRELOAD``
names this module only), in this order:

1. ``fedseg.lean_monai``'s import hook, before MONAI's import, so the server and every worker forked from it skip
   MONAI's unused optional integrations, as the ``fedseg`` command does;
2. :data:`MODULES`: the pool's worker loop, every method, and ``torch._dynamo`` (the optimizers import it at their
   first step: ~800 modules, about 1 s per worker otherwise).

A Ctrl-C while the server starts or imports (the first seconds of a ``--workers`` run; the terminal sends it to the
whole process group) ends the server at once and quietly: the run itself stops with one line that says how to
resume, and a ``KeyboardInterrupt`` here would print the server's traceback after it. The server starts with Ctrl-C
blocked (:func:`fedseg.engine.forkserver.ensure_server`), so one that comes before this module runs is held back and
handled here. The workers get Python's usual Ctrl-C (``KeyboardInterrupt``).
"""

import importlib
import os
import signal

from fedseg import lean_monai
from fedseg.interrupts import INTERRUPTED_EXIT

MODULES = ("fedseg.engine.pool", "fedseg.algorithms", "torch._dynamo")


def _exit_quietly(signum: int, frame: object) -> None:
    os._exit(INTERRUPTED_EXIT)


# the server started with Ctrl-C held back (fedseg.engine.forkserver.ensure_server): one that came meanwhile arrives
# now. A SIGINT ignored by the command (a background job of a script) stays ignored, here and in the workers.
ignored = signal.getsignal(signal.SIGINT) is signal.SIG_IGN
if not ignored:
    signal.signal(signal.SIGINT, _exit_quietly)
signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
try:
    lean_monai.install()
    for name in MODULES:
        importlib.import_module(name)
finally:
    if not ignored:
        signal.signal(signal.SIGINT, signal.default_int_handler)  # what the workers forked from the server get
