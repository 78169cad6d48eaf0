"""The ``fedseg`` command's exit: skip the interpreter's teardown once the command has finished.

After a run, Python's normal exit spends 1.2-1.5 s (2 CPU cores) finalizing the ~4,000 modules torch, MONAI and
fedseg imported and collecting their objects, work whose only effect is freeing memory the operating system frees
anyway. :func:`exit_now` does what a normal exit does that has an effect outside the process, then ends it at
once with ``os._exit``:

1. it waits for no thread, so it applies only when the main thread is the only non-daemon thread left (a
   tracker's upload thread, a Flower client's: the normal exit, which joins them, is used instead);
2. ``atexit`` handlers run (``logging.shutdown``, multiprocessing's pool and process-server shutdown,
   ``weakref.finalize`` callbacks, trackers' ``finish``), in the normal order;
3. ``sys.stdout`` and ``sys.stderr`` are flushed (a closed pipe, as in ``fedseg ... | head``, is ignored).

fedseg writes every output file inside a ``with`` block (closed when the command returns) and moves finished
files into place atomically, so nothing is left for teardown to flush. Shared-memory tensors (the worker pool's)
are file descriptors the kernel frees with the process. Library use (``import fedseg``, ``fedseg.api``) never
goes through here.
"""

from __future__ import annotations

import atexit
import os
import sys
import threading


def exit_status(code: str | int | None) -> int:
    """The process status of ``SystemExit(code)``: None -> 0, an int as is, anything else (a message, which
    is printed to stderr as Python does) -> 1."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    print(code, file=sys.stderr)
    return 1


def other_threads_running() -> bool:
    """Whether a non-daemon thread other than the main one is alive (the normal exit would wait for it)."""
    main = threading.main_thread()
    return any(t is not main and not t.daemon and t.is_alive() for t in threading.enumerate())


def exit_now(code: str | int | None = 0) -> None:
    """End the process with ``SystemExit(code)``'s status: at once (module docstring) unless another
    non-daemon thread still runs, then by the normal exit."""
    if other_threads_running():
        sys.exit(code)
    status = exit_status(code)
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed pipe or stream: nothing more can reach it
            pass
    os._exit(status)
