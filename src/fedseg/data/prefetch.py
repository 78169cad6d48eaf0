"""Computing the items of an ordered stream ahead of their use, in background threads.

Used by the Trainer (``train.loader_workers``) to prepare the next training batches (patch crops,
augmentation) while the model trains, and by ``fedseg.data.dataset.build_site_data`` to read and pre-process a
site's cases (``data.prepare_threads``). The result is the same for any number of workers as long as each item is
a pure function of its input (the Trainer seeds each step from its own stream).
"""

from __future__ import annotations

import contextvars
import math
import os
from collections import deque
from collections.abc import Callable, Generator, Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import TypeVar

from fedseg.interrupts import DISCARDABLE_THREADS

T = TypeVar("T")
R = TypeVar("R")


def usable_cpus() -> int:
    """The CPUs this process may use, at least 1: its affinity where the platform says (else the machine's CPUs),
    capped by its cgroup's CPU quota (:func:`cgroup_cpu_limit`: ``docker --cpus 2`` or a Kubernetes CPU limit on a
    64-core host gives 2, where more threads than that would only be throttled)."""
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    quota = cgroup_cpu_limit()
    return max(1, min(cpus, math.ceil(quota)) if quota is not None else cpus)


def cgroup_cpu_limit(cgroups: Path = Path("/proc/self/cgroup"), root: Path = Path("/sys/fs/cgroup")) -> float | None:
    """CPUs the CPU quota of this process's cgroup allows (quota / period: 1.5 for ``--cpus 1.5``), the smallest
    along its cgroup and their parents, or None without a quota (or where none can be read: not Linux). cgroup v2:
    ``cpu.max`` (``max 100000`` or ``150000 100000``); v1: ``cpu.cfs_quota_us`` (-1: none) / ``cpu.cfs_period_us``
    under the ``cpu`` controller's mount. ``cgroups``: the process's cgroup list; ``root``: where they are mounted."""
    found = [q for folder, v2 in cgroup_folders("cpu", cgroups, root) if (q := _quota(folder, v2)) is not None]
    return min(found) if found else None


def cgroup_folders(controller: str, cgroups: Path, root: Path) -> list[tuple[Path, bool]]:
    """The folders of this process's cgroups that may set a limit of ``controller`` (``cpu``, ``memory``), each with
    whether it is cgroup v2: per line of ``cgroups`` (``/proc/self/cgroup``) that is v2's one unified hierarchy or
    names ``controller`` (v1), the cgroup's folder under each place it may be mounted below ``root``
    (``/sys/fs/cgroup``; v2: the root or ``unified/``; v1: ``<controllers>/`` or ``<controller>/``) and its parents up
    to that mount (a container's own cgroup is often the mount's root). Empty where ``cgroups`` cannot be read (not
    Linux). :func:`cgroup_cpu_limit` and ``fedseg.data.memory_guard.cgroup_memory_headroom`` read their files."""
    try:
        lines = cgroups.read_text().splitlines()
    except OSError:
        return []
    folders = []
    for line in lines:
        _, controllers, path = (line.split(":", 2) + ["", ""])[:3]
        if controllers == "":  # v2: one unified hierarchy
            mounts = [root, root / "unified"]
        elif controller in controllers.split(","):
            mounts = [root / controllers, root / controller]
        else:
            continue
        for mount in mounts:
            folder = mount / path.lstrip("/")
            while True:
                folders.append((folder, controllers == ""))
                if folder == mount or mount not in folder.parents:
                    break
                folder = folder.parent
    return folders


def _quota(folder: Path, v2: bool) -> float | None:
    """The CPU quota one cgroup folder sets (CPUs), or None (no file, no quota, unreadable)."""
    try:
        if v2:
            quota, period = (folder / "cpu.max").read_text().split()[:2]
            return None if quota == "max" else int(quota) / int(period)
        quota_us = int((folder / "cpu.cfs_quota_us").read_text())
        period_us = int((folder / "cpu.cfs_period_us").read_text())
        return None if quota_us <= 0 or period_us <= 0 else quota_us / period_us
    except (OSError, ValueError, ZeroDivisionError):
        return None


def ordered_map(
    fn: Callable[[T], R], items: Iterable[T], workers: int, name: str = "batches"
) -> Generator[R, None, None]:
    """``fn(item)`` for each of ``items``, in order. ``workers`` = 0: on the caller's thread, one item at a
    time. ``workers`` > 0: that many threads (named ``fedseg-discardable-<name>``) compute up to ``workers + 1``
    items ahead of the one consumed (``items`` itself is advanced on the caller's thread), each in a copy of the
    caller's context (its ``contextvars``, e.g. ``fedseg.data.rtstruct.noting``). An exception of ``fn`` is raised
    when its item is consumed. Closing the iterator early cancels what has not started and waits for what has; an
    exception (``fn``'s, Ctrl-C) cancels what has not started and returns at once: the items being computed finish
    in the background, their results dropped (an interrupted command exits without them: ``fedseg.process_exit``),
    so that a second Ctrl-C never lands in a wait for them."""
    if workers == 0:
        yield from map(fn, items)
        return
    pending: deque[Future[R]] = deque()
    pool = ThreadPoolExecutor(workers, thread_name_prefix=f"{DISCARDABLE_THREADS}-{name}")
    try:
        for item in items:
            pending.append(pool.submit(contextvars.copy_context().run, fn, item))
            if len(pending) > workers + 1:
                yield pending.popleft().result()
        while pending:
            yield pending.popleft().result()
    except GeneratorExit:  # closed early by its consumer: what runs finishes here
        pool.shutdown(wait=True, cancel_futures=True)
        raise
    except BaseException:
        pool.shutdown(wait=False, cancel_futures=True)
        raise
    pool.shutdown(wait=True)
