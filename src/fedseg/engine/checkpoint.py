"""Atomic checkpoints: write to a temporary file in the same folder, then rename over the old one."""

from __future__ import annotations

import os
import tempfile
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


def load_checkpoint(path: Path) -> dict | None:
    """The checkpoint at ``path``, or None if there is none."""
    if not path.is_file():
        return None
    return torch.load(path, map_location="cpu", weights_only=True)
