"""Atomic file writes, stdlib only (a report or a tracker writes files without importing torch): write to a
temporary file in the same folder, fsync it, rename it over the old one, fsync the folder. A crash mid-write
leaves the previous file in place and a temp file ``.<name>.*`` (``fedseg.engine.checkpoint.remove_temp_files``
removes those next to a checkpoint)."""

from __future__ import annotations

import contextlib
import json
import math
import os
import tempfile
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import BinaryIO


@contextlib.contextmanager
def naming_errors(path: Path) -> Iterator[None]:
    """An ``OSError`` without a file name (a write's on a full disk: ``[Errno 28] No space left on device``, as
    Pillow or ``Path.write_bytes`` raise it) raised while writing ``path`` gets ``path`` as its file name, so the
    one line that reports it names the file."""
    try:
        yield
    except OSError as e:
        if e.filename is not None or e.errno is None:
            raise
        raise OSError(e.errno, e.strerror, str(path)) from e


def check_out_dir(out: Path, option: str = "--out") -> None:
    """Refuse an ``out`` that is a file or lies under one, or a link that leads nowhere (a loop, a missing target:
    no folder can be made there), before anything is created: ``ValueError``."""
    out = Path(out)
    for path in (out, *out.parents):
        if path.is_symlink() and not path.exists():
            raise ValueError(f"{option} {out}: {path} is a link that leads nowhere (a loop or a missing target)")
        if path.exists():
            if not path.is_dir():
                where = "is a file" if path == out else f"is a file, so {out} cannot be created"
                raise ValueError(f"{option} {out}: {path} {where}; choose a folder")
            return


def check_out_creatable(out: Path, option: str = "--out") -> None:
    """Where ``out`` does not exist yet, refuse it (``ValueError``) where making it (``out.mkdir(parents=True)``)
    would fail (a read-only or forbidden parent, a file system that takes no folders, e.g. ``/proc``), found by
    making its first missing folder and removing it at once: a command says it before any work, not after it.
    Nothing is left."""
    out = Path(out)
    if out.exists() or out.is_symlink():
        return
    first = out  # the outermost folder of out that does not exist: the one mkdir(parents=True) would fail on
    while first.parent != first and not first.parent.exists():
        first = first.parent
    try:
        os.mkdir(first)
    except FileExistsError:  # made meanwhile (another command): it can be made
        return
    except OSError as e:
        raise ValueError(f"{option} {out}: no folder can be made there ({first}: {e.strerror})") from None
    with contextlib.suppress(OSError):
        os.rmdir(first)


def read_text(path: Path) -> str:
    """``path``'s text (UTF-8, a leading byte-order mark dropped); a ValueError naming it when it is not UTF-8 (an
    OSError as raised). The one reader of the text files fedseg is given or wrote (configs, a run's files)."""
    data = Path(path).read_bytes()
    try:
        return data.decode("utf-8-sig")  # a byte-order mark (a spreadsheet's save) is not text
    except UnicodeDecodeError as e:
        raise ValueError(f"{path}: not UTF-8 text (at byte offset {e.start})") from None


def atomic_write_bytes(path: Path, write: Callable[[BinaryIO], object], private: bool = False) -> None:
    """Call ``write(file)`` on a temp file next to ``path`` and atomically replace ``path`` with it; ``private``:
    readable by its owner only (mode 0600: a site's map of case ids to patients' file names), else the mode of a
    normally created file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    except OSError as e:  # e.g. a read-only folder: named by the file we write, not by the temp name
        raise OSError(e.errno, e.strerror or str(e), str(path)) from e
    try:
        if not private:
            os.fchmod(fd, 0o666 & ~current_umask())  # mkstemp's 0600 -> the mode of a normally created file
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        fsync_dir(path.parent)
    except OSError as e:  # e.g. a full disk: the error names the file it failed to write, not only errno
        if os.path.exists(tmp):
            os.unlink(tmp)
        if e.filename is None or e.filename == tmp:
            raise OSError(e.errno, e.strerror or str(e), str(path)) from e
        raise
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


_UMASK_LOCK = threading.Lock()


def current_umask() -> int:
    """The process umask: from /proc/self/status (Linux; no change to the process), else read by
    setting it and restoring it at once."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    with _UMASK_LOCK:
        mask = os.umask(0o022)
        os.umask(mask)
    return mask


def atomic_write_text(path: Path, text: str, private: bool = False) -> None:
    atomic_write_bytes(path, lambda f: f.write(text.encode()), private)


def fsync_dir(folder: Path) -> None:
    """Make renames and deletions in ``folder`` durable (POSIX; a no-op where directories cannot be opened)."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def json_ready(value: object) -> object:
    """``value`` (dicts, lists and tuples within) with every non-finite float as None: ``json.dumps`` writes it as
    ``null``, valid JSON for any reader (R's jsonlite, JavaScript's ``JSON.parse``), where ``NaN`` is not (and a CSV
    writer an empty cell). A numpy scalar becomes the Python number it holds."""
    if type(value).__module__ == "numpy" and hasattr(value, "item") and getattr(value, "ndim", None) == 0:
        value = value.item()
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: json_ready(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_ready(v) for v in value]
    return value


def strict_json_text(value: object, indent: int | None = None) -> str:
    """``value`` as strict JSON (:func:`json_ready`: a number that is not finite is ``null``); other objects as
    their text."""
    return json.dumps(json_ready(value), indent=indent, allow_nan=False, default=str)


def json_number(value: object) -> float:
    """A number read back from strict JSON (:func:`strict_json_text`): ``null`` (or a missing value) as NaN, the
    value it stood for."""
    return math.nan if value is None else float(value)  # type: ignore[arg-type]
