"""The worker pool's process server, started early (stdlib only: importing this module costs no torch import).

``fedseg.engine.pool`` starts its workers from a ``forkserver``: one clean process that imports fedseg and torch
once (``PRELOAD``, about 6 s on one core) and forks every worker from there. Started when the pool is built, those
imports come after the parent's own imports and data preparation and the run waits for them; :func:`start_forkserver`
starts the server at once (``fedseg run`` calls it as soon as the config says ``engine.workers > 1``, before it
imports torch), so its imports run on another core while the parent imports and prepares the data.
"""

from __future__ import annotations

import contextlib
import importlib
import multiprocessing
import multiprocessing.util
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from fedseg.interrupts import stop_processes

# forkserver: one clean server process imports fedseg and torch once (before any torch thread runs) and
# forks every worker from it, so a worker (or a replacement) starts in milliseconds, not after seconds of
# imports; spawn where there is no forkserver. Never fork the parent: its torch threads make that unsafe.
START_METHOD = "forkserver" if "forkserver" in multiprocessing.get_all_start_methods() else "spawn"
# Imported once, before any fork: fedseg.engine.server_preload imports the rest (MONAI's lean import, the pool,
# every method, torch._dynamo) and ends the server quietly on a Ctrl-C during those imports.
PRELOAD = ["fedseg.engine.server_preload"]


# The PID of the process that starts the server, when the server is to die with it (server_preload: Linux's
# parent-death signal). Only from the main thread: the signal follows the thread that started the server.
PARENT_ENV = "FEDSEG_SERVER_PARENT"

_PR_SET_PDEATHSIG = 1  # linux/prctl.h


def die_with_parent(signum: int, parent: int | None) -> bool:
    """Linux: have this process get ``signum`` the moment its parent ends (prctl ``PR_SET_PDEATHSIG``), however
    that ends (even SIGKILL). False when ``parent`` (the PID it was started by) is already gone: it may have ended
    before the signal was set, and this process then has another parent and no signal will come (the caller exits).
    True otherwise, also where there is no such signal (other systems) or ``parent`` is None (no check).

    The one helper for every process that must not outlive its starter: the pool's process server
    (``fedseg.engine.server_preload``), a bench's run processes (``fedseg.bench.execute``), the processes of a
    Flower deployment (``fedseg.flower.deploy``, in the child before exec). Safe between fork and exec: no import
    beyond ctypes, no lock."""
    if not sys.platform.startswith("linux"):
        return True
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, int(signum), 0, 0, 0)
    except (OSError, AttributeError):
        return True
    return parent is None or os.getppid() == parent


def server_pid() -> int | None:
    """The PID of this process's process server (``forkserver``), None when it has none running."""
    from multiprocessing import forkserver

    server: Any = forkserver._forkserver  # a private field, as stop_server reads it
    return getattr(server, "_forkserver_pid", None)


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


OPEN_FILES = 1 << 16  # the soft limit of open files the worker pool asks for (at most the hard limit)


def raise_open_files_limit(wanted: int = OPEN_FILES) -> int | None:
    """Raise this process's soft limit of open files towards ``wanted`` (never above the hard limit, never down); the
    limit now, or None where there is none to set (Windows). The worker pool sends the sites' tensors through shared
    memory, an open file descriptor per tensor in the parent and in each worker (torch's ``file_descriptor``
    strategy): three per volume, so a FeTS-sized federation on ``--workers`` passes the soft limit of 1024 that many
    systems set, while the hard limit is far higher."""
    try:
        import resource
    except ImportError:
        return None
    try:
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        target = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
        if soft != resource.RLIM_INFINITY and soft < target:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            return target
        return soft
    except (OSError, ValueError):  # a limit the system refuses: the one there is stays
        return None


def ensure_server() -> None:
    """Start the process server with ``PRELOAD`` if this platform has one and it does not run yet (returns at once).
    It starts with Ctrl-C (SIGINT) blocked, a mask it inherits: ``fedseg.engine.server_preload`` unblocks it once
    it can end the server quietly, so a Ctrl-C in the server's first moments prints no traceback."""
    raise_open_files_limit()  # before the server starts: it and the workers it forks inherit the limit
    if START_METHOD != "forkserver":
        return
    multiprocessing.get_context("forkserver").set_forkserver_preload(PRELOAD)
    from multiprocessing import forkserver, resource_tracker

    # the resource tracker first: starting it unblocks SIGINT in this thread (CPython 3.11-3.13), which would
    # undo the block below before the server is spawned
    resource_tracker.ensure_running()
    held = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    # started from the main thread (whose end is the process's), the server dies with this process, however it
    # ends (fedseg.engine.server_preload reads this; a SIGTERM before the command handles it, a SIGKILL)
    tied = threading.current_thread() is threading.main_thread()
    before = os.environ.get(PARENT_ENV)
    if tied:
        os.environ[PARENT_ENV] = str(os.getpid())
    try:
        forkserver.ensure_running()
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, held)
        if tied:
            if before is None:
                os.environ.pop(PARENT_ENV, None)
            else:
                os.environ[PARENT_ENV] = before
    if not _stop_registered:  # at exit, after multiprocessing has ended this process's daemonic children (an
        # atexit handler ran before that: the tracker they hold never ended and the exit hung)
        _stop_registered.append(multiprocessing.util.Finalize(None, stop_server, exitpriority=-100))


_stop_registered: list[object] = []  # stop_server's exit finalizer, registered once per process
TRACKER_GRACE_S = 5.0  # how long the exit waits for the resource tracker (one holding on for a child left running)


def stop_server() -> None:
    """End the process server and the resource tracker this process started, and wait for them (at exit, as
    multiprocessing's last finalizer: after it has ended this process's daemonic children, which hold the tracker's
    pipe too; the ``fedseg`` command runs it also when interrupted). Left alone, each ends only once it sees
    this process gone, after it has returned: the server then spends seconds finalizing the torch and MONAI it
    imported, so an interrupted command's processes outlived it (an audit saw the server 3-5 s after the shell
    prompt came back). The server holds nothing to save (its workers are stopped by the pool): SIGTERM ends it at
    once; the tracker is asked to stop (its pipe closed) and cleans up what it tracks, as at its normal end, waited
    for up to ``TRACKER_GRACE_S`` (a process this one did not start may still hold the pipe)."""
    from multiprocessing import forkserver, resource_tracker

    server: Any = forkserver._forkserver  # its private fields: the server's PID and the pipe that keeps it alive
    pid = getattr(server, "_forkserver_pid", None)
    if pid is not None:
        stop_processes([pid], grace_s=5.0, first=signal.SIGTERM)
        with contextlib.suppress(OSError, TypeError):
            os.close(server._forkserver_alive_fd)
        server._forkserver_alive_fd = None
        server._forkserver_pid = None
    tracker: Any = resource_tracker._resource_tracker
    fd, tracker_pid = getattr(tracker, "_fd", None), getattr(tracker, "_pid", None)
    if fd is None or tracker_pid is None:
        return
    with contextlib.suppress(OSError):
        os.close(fd)  # its end of the pipe: the tracker ends once no other process holds it
    tracker._fd, tracker._pid = None, None
    deadline = time.monotonic() + TRACKER_GRACE_S  # not forever (its own _stop waits without end): a process
    while time.monotonic() < deadline:  # that is not ours may hold the pipe, and the tracker then ends with it
        with contextlib.suppress(ChildProcessError):
            if os.waitpid(tracker_pid, os.WNOHANG)[0] == 0:
                time.sleep(0.05)
                continue
        break


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
