"""The ``fedseg`` command's exit: skip the interpreter's teardown once the command has finished.

After a run, Python's normal exit spends 1.2-1.5 s (2 CPU cores) finalizing the ~4,000 modules torch, MONAI and
fedseg imported and collecting their objects, work whose only effect is freeing memory the operating system frees
anyway. :func:`exit_now` does what a normal exit does that has an effect outside the process, then ends it at
once with ``os._exit``:

1. it waits for no thread, so it applies only when the main thread is the only non-daemon thread left (a
   tracker's upload thread, a Flower client's: the normal exit, which joins them, is used instead), threads
   computing what nobody will read aside (``fedseg.interrupts.DISCARDABLE_THREADS``) and those a command declared
   it leaves (:func:`discard_at_exit`: a stopped SuperNode's Runtime API server);
2. ``atexit`` handlers run (``logging.shutdown``, multiprocessing's pool and process-server shutdown,
   ``weakref.finalize`` callbacks, trackers' ``finish``), in the normal order, with Ctrl-C ignored (the work is
   done: it would only end a handler in a traceback);
3. ``sys.stdout``, ``sys.stderr`` and the C library's stdio buffers are flushed (a closed pipe, as in
   ``fedseg ... | head``, is ignored; a failed write, e.g. to a full disk, is reported and gives status 120).

fedseg writes every output file inside a ``with`` block (closed when the command returns) and moves finished
files into place atomically, so nothing is left for teardown to flush. Shared-memory tensors (the worker pool's)
are file descriptors the kernel frees with the process. Library use (``import fedseg``, ``fedseg.api``) never
goes through here. What is skipped besides the teardown: tools that run the ``fedseg`` script inside their own
process and write their data after it returns (``python -m cProfile``, ``coverage run``; those that save from
an ``atexit`` handler, as pytest-cov does, are fine), and the clean-up of temporary files third-party code left
open (a ``NamedTemporaryFile`` is deleted when it is closed or collected).
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import os
import signal
import sys
import threading


def exit_status(code: str | int | None) -> int:
    """The process status of ``SystemExit(code)``: None -> 0, an int as is, anything else (a message, which
    is printed to stderr as Python does, where there is one) -> 1."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    if sys.stderr is not None:
        print(code, file=sys.stderr)
    return 1


_DISCARDED: set[str] = set()  # name prefixes of threads a command declared it leaves (discard_at_exit)


def discard_at_exit(*prefixes: str) -> None:
    """Threads whose names start with one of ``prefixes`` serve nothing once this command has returned: the exit does
    not wait for them (``fedseg flower supernode``: the Runtime API thread Flower's SuperNode leaves when a stop
    signal ends it before its exit handlers are in place; the normal exit waited for it for ever)."""
    _DISCARDED.update(prefixes)


def other_threads_running() -> bool:
    """Whether a non-daemon thread other than the main one is alive (the normal exit would wait for it), leaving
    out those that only compute results nobody reads any more (``fedseg.interrupts.DISCARDABLE_THREADS``: a stopped
    command's case preparation or batch prefetch) and those the command declared it leaves (:func:`discard_at_exit`)."""
    from fedseg.interrupts import DISCARDABLE_THREADS

    main = threading.main_thread()
    return any(
        t is not main and not t.daemon and t.is_alive() and not t.name.startswith((DISCARDABLE_THREADS, *_DISCARDED))
        for t in threading.enumerate()
    )


def print_error(line: str) -> None:
    """``line`` on stderr (file descriptor 2), whatever state ``sys.stdout``/``sys.stderr`` are in (a full disk,
    a closed pipe, closed at start)."""
    with contextlib.suppress(Exception):
        os.write(2, (line + "\n").encode())


def flush_streams(status: int) -> int:
    """Flush ``sys.stdout`` and ``sys.stderr`` (either may be None: a closed descriptor at start), then the C
    library's stdio buffers (output of C/C++ extensions). A reader that went away (``fedseg ... | head``) is not
    an error; any other failure (a full disk, an I/O error) is reported on stderr and turns a status of 0 into
    120, as Python's own exit does. Returns the status."""
    for stream in (sys.stdout, sys.stderr):
        if stream is None:
            continue
        try:
            stream.flush()
        except BrokenPipeError:
            pass
        except ValueError:  # closed already: nothing more can reach it
            pass
        except OSError as e:
            status = status or 120
            print_error(f"error: could not write the command's output: {e}")
    with contextlib.suppress(Exception):
        ctypes.CDLL(None).fflush(None)
    return status


def exit_now(code: str | int | None = 0) -> None:
    """End the process with ``SystemExit(code)``'s status: at once (module docstring) unless another
    non-daemon thread still runs, then by the normal exit."""
    if other_threads_running():
        sys.exit(code)
    status = exit_status(code)
    # the command's work is done: a Ctrl-C now (a user pressing it as the run ends) would only interrupt an atexit
    # handler with a traceback (an audit: 7 of 8 tries printed torch's or logging's) and change nothing else
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    atexit._run_exitfuncs()
    os._exit(flush_streams(status))
