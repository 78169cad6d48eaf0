"""Computing the items of an ordered stream ahead of their use, in background threads.

Used by the Trainer (``train.loader_workers``) to prepare the next training batches (patch crops,
augmentation) while the model trains. The result is the same for any number of workers as long as
each item is a pure function of its input (the Trainer seeds each step from its own stream).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Generator, Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TypeVar

T = TypeVar("T")
R = TypeVar("R")


def ordered_map(fn: Callable[[T], R], items: Iterable[T], workers: int) -> Generator[R, None, None]:
    """``fn(item)`` for each of ``items``, in order. ``workers`` = 0: on the caller's thread, one item at a
    time. ``workers`` > 0: that many threads compute up to ``workers + 1`` items ahead of the one consumed
    (``items`` itself is advanced on the caller's thread). An exception of ``fn`` is raised when its item is
    consumed; closing the iterator early cancels what has not started and waits for what has."""
    if workers == 0:
        yield from map(fn, items)
        return
    pending: deque[Future[R]] = deque()
    with ThreadPoolExecutor(workers, thread_name_prefix="fedseg-batches") as pool:
        try:
            for item in items:
                pending.append(pool.submit(fn, item))
                if len(pending) > workers + 1:
                    yield pending.popleft().result()
            while pending:
                yield pending.popleft().result()
        finally:
            for future in pending:
                future.cancel()
