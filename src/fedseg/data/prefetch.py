"""Computing the items of an ordered stream ahead of their use, in background threads.

Used by the Trainer (``train.loader_workers``) to prepare the next training batches (patch crops,
augmentation) while the model trains, and by ``fedseg.data.dataset.build_site_data`` to read and pre-process a
site's cases (``data.prepare_threads``). The result is the same for any number of workers as long as each item is
a pure function of its input (the Trainer seeds each step from its own stream).
"""

from __future__ import annotations

import contextvars
import os
from collections import deque
from collections.abc import Callable, Generator, Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TypeVar

from fedseg.interrupts import DISCARDABLE_THREADS

T = TypeVar("T")
R = TypeVar("R")


def usable_cpus() -> int:
    """The CPUs this process may run on (its affinity where the platform says, else the machine's), at least 1."""
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return max(1, cpus)


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
