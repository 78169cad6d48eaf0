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
from fedseg.engine.forkserver import PARENT_ENV, die_with_parent
from fedseg.interrupts import INTERRUPTED_EXIT

MODULES = ("fedseg.engine.pool", "fedseg.algorithms", "torch._dynamo")


def _die_with_parent() -> None:
    """Linux: SIGKILL this server the moment the process that started it ends (``PARENT_ENV`` names it), however
    that ends. Otherwise a command killed by a signal it does not handle yet (a SIGTERM while ``fedseg run``
    imports torch) or by SIGKILL left the server importing torch and MONAI, then finalizing them: an audit saw it
    18 s after the command had died. Its workers end on their own once their pipes to that process close."""
    parent = os.environ.pop(PARENT_ENV, None)  # set by ensure_server for this server only (not for its workers)
    if parent is not None and not die_with_parent(signal.SIGKILL, int(parent)):
        os._exit(INTERRUPTED_EXIT)  # it ended before the signal was set (this server now has another parent)


_die_with_parent()


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
