"""Atomic checkpoints: write to a temporary file in the same folder, then rename over the old one.

:class:`CheckpointWriter` takes a snapshot of the payload at once (tensors cloned, containers
copied: training may change them right after) and serializes, writes, fsyncs and renames it on a
background thread, so a round's checkpoint overlaps the next round's compute. At most one write
is in flight; a write error is raised by the next ``save`` or by ``close``. A crash mid-write
leaves the previous checkpoint in place (the rename never happened).
"""

from __future__ import annotations

import os
import tempfile
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import torch


def atomic_write_bytes(path: Path, write) -> None:
    """Call ``write(file)`` on a temp file next to ``path`` and atomically replace ``path`` with it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def atomic_write_text(path: Path, text: str) -> None:
    atomic_write_bytes(path, lambda f: f.write(text.encode()))


def save_checkpoint(path: Path, payload: dict) -> None:
    atomic_write_bytes(path, lambda f: torch.save(payload, f))


def snapshot(obj):
    """A copy of ``obj`` that later in-place changes cannot reach: tensors cloned, dicts/lists/tuples
    copied recursively; anything else (numbers, strings) is immutable and shared."""
    if isinstance(obj, torch.Tensor):
        return obj.detach().clone()
    if isinstance(obj, dict):
        return {k: snapshot(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(snapshot(v) for v in obj)
    return obj


class CheckpointWriter:
    """Background atomic checkpoint writes; use as a context manager (``close`` waits for the last)."""

    def __init__(self) -> None:
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="checkpoint")
        self._pending: Future | None = None

    def save(self, path: Path, payload: dict, frozen: bool = False) -> None:
        """Queue an atomic write of ``payload``; ``frozen``: the caller guarantees nothing in it will
        change (fresh copies), so it is not copied again."""
        payload = payload if frozen else snapshot(payload)
        self.wait()
        self._pending = self._pool.submit(save_checkpoint, path, payload)

    def then(self, fn) -> None:
        """Call ``fn()`` on the writer thread after the writes queued so far (e.g. delete files they replace)."""
        self.wait()
        self._pending = self._pool.submit(fn)

    def wait(self) -> None:
        """Block until the write in flight (if any) is on disk; re-raise its error."""
        if self._pending is not None:
            pending, self._pending = self._pending, None
            pending.result()

    def close(self) -> None:
        try:
            self.wait()
        finally:
            self._pool.shutdown(wait=True)

    def __enter__(self) -> "CheckpointWriter":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def load_checkpoint(path: Path) -> dict | None:
    """The checkpoint at ``path``, or None if there is none."""
    if not path.is_file():
        return None
    return torch.load(path, map_location="cpu", weights_only=True)
