"""Stopping a command cleanly: SIGTERM and SIGHUP act like Ctrl-C, and worker processes stop with their parent.

A run writes a checkpoint only after a round completes (atomically), so stopping anywhere inside a round loses
that round's unfinished work and nothing else: ``--resume`` continues from the last checkpoint. These helpers
make every way of stopping take that path:

* :func:`terminate_on_signals` turns SIGTERM / SIGHUP into ``KeyboardInterrupt`` in the main thread, so the
  ``finally`` blocks and ``except KeyboardInterrupt`` handlers that Ctrl-C runs also run for ``kill`` or a
  closed terminal (by default SIGTERM ends the process at once, leaving its workers training as orphans);
* :func:`stop_processes` interrupts worker processes (SIGINT: each stops as Ctrl-C would stop it), waits a
  little, then kills what is left, so no process outlives the command;
* :func:`resume_hint` is the line an interrupted command prints: how to continue.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
import time
from collections.abc import Iterable, Iterator
from pathlib import Path

from fedseg.folder_lock import has_entries

__all__ = [
    "DISCARDABLE_THREADS",
    "INTERRUPTED_EXIT",
    "deferred_interrupts",
    "interrupts_noted",
    "is_running",
    "resume_hint",
    "stop_processes",
    "terminate_on_signals",
]

INTERRUPTED_EXIT = 130  # the shell's code for a command ended by SIGINT (128 + 2)
# name prefix of threads that only compute results nobody will read once their command stops (fedseg.data.prefetch):
# an interrupted command exits without waiting for them (fedseg.process_exit)
DISCARDABLE_THREADS = "fedseg-discardable"
# what stops a command: Ctrl-C, kill, a closed terminal (Windows has no SIGHUP)
_STOP_SIGNALS = tuple(s for s in (signal.SIGINT, signal.SIGTERM, getattr(signal, "SIGHUP", None)) if s is not None)


@contextlib.contextmanager
def terminate_on_signals() -> Iterator[None]:
    """SIGTERM / SIGHUP raise ``KeyboardInterrupt`` (like Ctrl-C) while the block runs, in the main thread only
    (elsewhere signals cannot be handled, and the block runs unchanged)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def interrupt(signum: int, frame: object) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    saved = {s: signal.signal(s, interrupt) for s in _STOP_SIGNALS if s != signal.SIGINT}
    try:
        yield
    finally:
        for s, handler in saved.items():
            signal.signal(s, handler)


_noted: list[list[int]] = []  # the stop signals received by each running interrupts_noted block, innermost last


@contextlib.contextmanager
def interrupts_noted() -> Iterator[None]:
    """Note every SIGINT / SIGTERM / SIGHUP the block receives, each acted on at once as before (the handler in
    place: ``KeyboardInterrupt``, or the default action); one whose ``KeyboardInterrupt`` Python dropped (raised in
    a finalizer: "Exception ignored in ...", not printed here) is raised again when the block ends, and meanwhile
    stops :func:`deferred_interrupts` from starting. In a thread other than the main one the block runs unchanged."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    received: list[int] = []
    before = {s: signal.getsignal(s) for s in _STOP_SIGNALS}

    def note(signum: int, frame: object) -> None:
        for signals in _noted:
            signals.append(signum)
        _act_on(signum, before[signum])

    noting = [s for s, handler in before.items() if handler not in (signal.SIG_IGN, None)]
    hook = sys.unraisablehook
    sys.unraisablehook = lambda u: None if isinstance(u.exc_value, KeyboardInterrupt) and _noted else hook(u)
    _noted.append(received)
    for s in noting:
        signal.signal(s, note)
    try:
        yield
    finally:
        for s in noting:
            signal.signal(s, before[s])
        _noted.remove(received)
        sys.unraisablehook = hook
    if received:  # its KeyboardInterrupt was dropped
        raise KeyboardInterrupt(f"signal {received[0]}")


@contextlib.contextmanager
def deferred_interrupts() -> Iterator[None]:
    """Run the block to its end through SIGINT / SIGTERM / SIGHUP, then act on the first one received as the
    handler in place before would have (``KeyboardInterrupt``, or the default action: the process ends): for a step
    that must not stop half-way (writing a page and moving its figures in; starting a worker process, whose child
    reads its start-up data from a pipe the parent is still writing). A ``KeyboardInterrupt`` before the block when
    :func:`interrupts_noted` noted one that Python dropped. In a thread other than the main one (where signals
    cannot be handled) the block runs unchanged."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    if any(_noted):  # a stop signal came and its KeyboardInterrupt was dropped (interrupts_noted)
        raise KeyboardInterrupt
    received: list[int] = []
    saved = {s: signal.signal(s, lambda signum, frame: received.append(signum)) for s in _STOP_SIGNALS}
    try:
        yield
    finally:
        for s, handler in saved.items():
            signal.signal(s, handler)
        if received:
            _act_on(received[0], saved[received[0]])


def _act_on(signum: int, handler: object) -> None:
    """Do what ``handler`` (as ``signal.signal`` returned it) does for ``signum``."""
    if callable(handler):
        handler(signum, None)
    elif handler == signal.SIG_DFL:
        if signum == signal.SIGINT:
            raise KeyboardInterrupt
        signal.signal(signum, signal.SIG_DFL)
        signal.raise_signal(signum)
    # SIG_IGN, or None (a handler not installed from Python): ignored, as it would have been


def stop_processes(pids: Iterable[int], grace_s: float = 20.0, first: int = signal.SIGINT) -> None:
    """Send each process of ``pids`` the signal ``first`` (SIGINT: each stops as Ctrl-C would stop it; SIGTERM for
    workers that ignore Ctrl-C), wait up to ``grace_s`` seconds for all to exit, then SIGKILL the rest. Further
    SIGINT/SIGTERM/SIGHUP to this process are ignored meanwhile (a second Ctrl-C would otherwise abandon the
    workers half-stopped); the caller re-raises its interrupt afterwards."""
    pids = [p for p in pids if _alive(p)]
    if not pids:
        return
    in_main = threading.current_thread() is threading.main_thread()
    saved = {s: signal.signal(s, signal.SIG_IGN) for s in _STOP_SIGNALS} if in_main else {}
    try:
        for pid in pids:
            _send(pid, first)
        deadline = time.monotonic() + grace_s
        while any(_alive(p) for p in pids) and time.monotonic() < deadline:
            time.sleep(0.1)
        for pid in pids:
            if _alive(pid):
                _send(pid, getattr(signal, "SIGKILL", signal.SIGTERM))  # Windows has no SIGKILL
    finally:
        for s, handler in saved.items():
            signal.signal(s, handler)


def resume_hint(what: str, out: os.PathLike | str, detail: str = "") -> str:
    """``interrupted: <detail>; <what> continues from OUT with the same command and --resume`` (one line)."""
    done = f"{detail}; " if detail else ""
    return f"interrupted: {done}run the same command with --resume to continue {what} in {out}"


def interrupted_text(what: str, out: os.PathLike | str, detail: str = "") -> str:
    """The one line of a command interrupted while writing ``what`` into ``out``: before anything was written there
    (``out`` missing or empty: an interrupt during the data's preparation), that nothing was and to run the same
    command; else :func:`resume_hint`."""
    folder = Path(out)
    if not folder.is_dir() or not has_entries(folder):
        return f"interrupted before {what} began: nothing was written to {out}; run the same command"
    return resume_hint(what, out, detail)


def is_running(pid: int) -> bool:
    """True if ``pid`` exists and is not a zombie (Linux: read from /proc; elsewhere any existing process)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return True


def start_time(pid: int) -> str | None:
    """When ``pid`` started (Linux: ``/proc/<pid>/stat`` field 22, in clock ticks since boot), which tells a process
    from a later one that reuses its PID; None where it cannot be read (gone, or not Linux)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def _alive(pid: int) -> bool:
    """Whether ``pid`` still runs; a zombie our own child left is reaped here."""
    try:
        waited, _ = os.waitpid(pid, os.WNOHANG)
        if waited == pid:
            return False
    except ChildProcessError:
        pass  # not our child (e.g. a forkserver's)
    return is_running(pid)


def _send(pid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, sig)
