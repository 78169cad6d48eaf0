"""Atomic checkpoints: write to a temporary file in the same folder, then rename over the old one.

:class:`CheckpointWriter` takes a snapshot of the payload at once (tensors cloned, containers
copied: training may change them right after) and serializes, writes, fsyncs and renames it on a
background thread, so a round's checkpoint overlaps the next round's compute. A crash mid-write
leaves the previous checkpoint in place (the rename never happened) and a temp file, which the
next run removes (``remove_temp_files``); the folder is fsynced after each rename, so a power
loss cannot reorder a checkpoint and the files it names.
"""

from __future__ import annotations

import pickle
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from types import TracebackType
from typing import Any, TypeVar, cast

import torch

from fedseg.atomic_files import atomic_write_bytes

T = TypeVar("T")


def save_checkpoint(path: Path, payload: dict[str, Any]) -> None:
    atomic_write_bytes(path, lambda f: torch.save(payload, f))


def snapshot(obj: T) -> T:
    """A copy of ``obj`` that later in-place changes cannot reach: tensors cloned, dicts/lists/tuples
    copied recursively; anything else (numbers, strings) is immutable and shared."""
    copied: object = obj
    if isinstance(obj, torch.Tensor):
        copied = obj.detach().clone()
    elif isinstance(obj, dict):
        copied = {k: snapshot(v) for k, v in obj.items()}
    elif isinstance(obj, (list, tuple)):
        copied = type(obj)(snapshot(v) for v in obj)
    return cast(T, copied)


class CheckpointWriter:
    """Background atomic checkpoint writes, run one after another in the order queued; use as a
    context manager (``close`` waits for the last). A task runs only if every earlier one
    succeeded (a clean-up never follows a failed write); the first error is raised by a later
    ``save``/``then`` or by ``close``."""

    MAX_QUEUED = 3  # a round queues at most: the best round's states, the checkpoint, the clean-up

    def __init__(self) -> None:
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="checkpoint")
        self._queue: deque[Future[None]] = deque()

    def save(self, path: Path, payload: dict[str, Any], frozen: bool = False) -> None:
        """Queue an atomic write of ``payload``; ``frozen``: the caller guarantees nothing in it will
        change (fresh copies), so it is not copied again."""
        self._submit(save_checkpoint, path, payload if frozen else snapshot(payload))

    def then(self, fn: Callable[[], object]) -> None:
        """Call ``fn()`` on the writer thread after the tasks queued so far (e.g. delete files they replace)."""
        self._submit(fn)

    def _submit(self, fn: Callable[..., object], *args: Any) -> None:
        while self._queue and (len(self._queue) >= self.MAX_QUEUED or self._queue[0].done()):
            self._queue.popleft().result()  # bounds the payloads held in memory; re-raises a failure
        previous = self._queue[-1] if self._queue else None
        self._queue.append(self._pool.submit(_after, previous, fn, *args))

    def wait(self) -> None:
        """Block until every queued task is done; re-raise the first error."""
        while self._queue:
            self._queue.popleft().result()

    def close(self) -> None:
        try:
            self.wait()
        finally:
            self._pool.shutdown(wait=True)

    def __enter__(self) -> CheckpointWriter:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if exc is None:
            self.close()
            return
        try:  # an error is already propagating: finish the writes, but do not hide that error
            self.close()
        except Exception as write_error:  # noqa: BLE001
            exc.add_note(f"also, a checkpoint write failed: {type(write_error).__name__}: {write_error}")


def _after(previous: Future[None] | None, fn: Callable[..., object], *args: Any) -> None:
    """Run ``fn(*args)`` once ``previous`` (already run: one worker, FIFO) succeeded; else re-raise its error."""
    if previous is not None:
        previous.result()
    fn(*args)


def remove_temp_files(path: Path) -> None:
    """Delete temp files a killed process left next to ``path`` (``.<name>.*``, see ``atomic_write_bytes``)."""
    for tmp in path.parent.glob(f".{path.stem}.*"):
        tmp.unlink(missing_ok=True)


def load_checkpoint(path: Path) -> dict[str, Any] | None:
    """The checkpoint at ``path``, or None if there is none; a ValueError naming ``path`` if it cannot be read
    (checkpoints are written atomically, so a damaged one was truncated or changed by something else)."""
    if not path.is_file():
        return None
    try:
        loaded: dict[str, Any] = torch.load(path, map_location="cpu", weights_only=True)
    except (RuntimeError, EOFError, pickle.UnpicklingError, ValueError) as e:
        reason = str(e).strip().splitlines()[0].split(". ")[0][:160] if str(e).strip() else type(e).__name__
        raise ValueError(
            f"{path}: the checkpoint cannot be read ({reason}); if it is damaged, delete it and run again with "
            "--resume to train that algorithm again from its first round"
        ) from None
    return loaded
