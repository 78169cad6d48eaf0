"""One writer per output folder: a run's, a study's, a bench's or a Flower coordinator's ``--out`` is held by the
command writing it, so a second command on the same folder (a ``--resume`` typed in another terminal while the
run still trains, two coordinators started on one ``--out``) is refused in one line naming the holder, instead of
both writing checkpoints and outputs into each other's files. Stdlib only.

The hold is an advisory ``flock`` on ``FOLDER/.fedseg-lock``: the kernel drops it when the holding process ends,
however it ends (``kill -9``, a crash, a power cut), so a folder is never left locked by a process that is gone;
the file (the holder's pid, command and start time, for the message) is removed on release and a stale one is
simply taken over. Re-entrant within a thread (a run holds an existing folder before its data is prepared and
again once it writes), refused to another thread of the same process (two ``Experiment.run()`` in threads). Where
``fcntl`` is missing (Windows) or the filesystem has no ``flock`` (some network or FUSE mounts) nothing is held,
the latter said once as a warning. The ``fedseg`` command keeps what it holds until it exits
(``hold_until_exit``: a run's report is drawn under the run's hold)."""

from __future__ import annotations

import atexit
import contextlib
import datetime
import json
import logging
import os
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

try:
    import fcntl
except ImportError:  # Windows: no advisory locks here
    fcntl = None  # type: ignore[assignment]

LOCK_NAME = ".fedseg-lock"
RESUME_HINT = "wait for that one to end or stop it (Ctrl-C), then run this again (--resume continues its run)"

_held: dict[Path, list[int]] = {}  # resolved folder -> [fd of its lock file (-1: none), holds, holding thread]
_held_guard = threading.Lock()
_unlockable: set[Path] = set()  # folders whose filesystem refused a lock (warned once)
_until_exit = False  # hold_until_exit: a hold whose last block ends stays until the process exits
log = logging.getLogger(__name__)


class FolderInUse(FileExistsError):
    """``folder`` is held by another process (its pid, command and start time in the message, where known)."""


def has_entries(folder: Path) -> bool:
    """Whether the folder ``folder`` holds anything but a lock file (one a holder killed by ``kill -9`` left behind
    in a folder it had written nothing else to: the folder is empty to the user)."""
    return any(entry.name != LOCK_NAME for entry in Path(folder).iterdir())


def holder_text(lock_file: Path) -> str:
    """Who holds ``lock_file``, as its holder wrote it: ``pid 123, `fedseg run ...`, since 2026-11-30 08:41 UTC``;
    ``another process`` where the file is empty or unreadable (being written, or written by an older fedseg)."""
    try:
        record = json.loads(lock_file.read_text(encoding="utf-8"))
        return f"pid {int(record['pid'])}, `{record['command']}`, since {record['since']}"
    except (OSError, ValueError, KeyError, TypeError):
        return "another process"


def _acquire(folder: Path, command: str, hint: str) -> int:
    """The fd of ``folder``'s lock file, locked by this process; FolderInUse where another holds it (``hint``: what
    to do then); -1 where the filesystem has no ``flock`` (a warning; nothing held). A lock taken on a file that its
    holder removed meanwhile (released between our open and our lock) is taken again on the file now at the path,
    so two processes never both hold the folder."""
    path = folder / LOCK_NAME
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise FolderInUse(
                f"{folder}: in use by {holder_text(path)}; two commands writing one folder would mix their files: "
                f"{hint}"
            ) from None
        except OSError as e:  # EOPNOTSUPP, ENOLCK: a filesystem without advisory locks
            _release(folder, fd)
            if folder in _unlockable:
                return -1
            _unlockable.add(folder)  # said once per folder
            log.warning(
                "%s: not held against a second command (this filesystem refuses a lock: %s); run one fedseg "
                "command at a time on it",
                folder,
                e.strerror or e,
            )
            return -1
        try:
            same = os.fstat(fd).st_ino == os.stat(path).st_ino
        except FileNotFoundError:
            same = False
        if same:
            break
        os.close(fd)  # the file we locked was removed by its last holder: lock the one at the path now
    since = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    record = json.dumps({"pid": os.getpid(), "command": command, "since": since})
    os.ftruncate(fd, 0)
    os.pwrite(fd, record.encode("utf-8"), 0)
    return fd


def _release(folder: Path, fd: int) -> None:
    """Remove the lock file while still holding it, then let go (a waiting opener re-checks the path)."""
    with contextlib.suppress(OSError):
        os.unlink(folder / LOCK_NAME)
    os.close(fd)


def command_line() -> str:
    """This process's command as the user typed it, shortened to one line: ``fedseg run --preset demo ...``."""
    words = [Path(sys.argv[0]).name if sys.argv else "python", *sys.argv[1:]]
    text = " ".join(words)
    return text if len(text) <= 120 else text[:117] + "..."


@contextlib.contextmanager
def holding(folder: Path, command: str | None = None, hint: str = RESUME_HINT, keep: bool = True) -> Iterator[None]:
    """Hold the existing folder ``folder`` for this thread while the block runs (module docstring); FolderInUse
    (a FileExistsError, so every command's one-line error handling reports it) where another process, or another
    thread of this one, holds it. ``command``: what the message shows another process (default: this process's
    command line); ``hint``: what the refusal tells to do; ``keep`` False: let go when the block ends even under
    ``hold_until_exit`` (a process that Flower ends with ``os._exit``, past every exit handler: a SuperNode)."""
    key = Path(folder).resolve()
    if fcntl is None:
        yield
        return
    me = threading.get_ident()
    with _held_guard:
        entry = _held.get(key)
        if entry is not None and entry[2] != me:
            raise FolderInUse(
                f"{folder}: in use by another thread of this process; two runs writing one folder would mix their "
                "files: run them one after the other, or give each its own folder"
            )
        if entry is None:
            entry = _held[key] = [_acquire(key, command or command_line(), hint), 0, me]
        entry[1] += 1
    try:
        yield
    finally:
        with _held_guard:
            entry[1] -= 1
            outermost = not any(other[1] > 0 for other in _held.values())  # no other hold of this process runs
            if entry[1] == 0 and not (_until_exit and outermost and keep):
                del _held[key]
                if entry[0] >= 0:
                    _release(key, entry[0])


def hold_until_exit() -> None:
    """Keep the outermost folder this process holds until it exits (``release_all`` at exit), not only while its
    block runs: the ``fedseg`` command, so that a run's (a study's, a bench's) folder stays held while its report is
    drawn after the run returned (a ``--resume`` started then wrote the same outputs beside it). Folders held inside
    another hold (a study's or an in-process bench's runs) are let go as before: a bench of a thousand runs keeps no
    thousand files open."""
    global _until_exit
    if not _until_exit:
        _until_exit = True
        atexit.register(release_all)


def held_by_another(folder: Path) -> str | None:
    """Who holds ``folder`` (``holder_text``) where another process does now; None where nobody does (a lock file
    a killed holder left behind holds nothing) or where this process does."""
    key = Path(folder).resolve()
    path = key / LOCK_NAME
    if fcntl is None or key in _held or not path.is_file():
        return None
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return holder_text(path)
    except OSError:  # a filesystem without locks: nobody can hold it
        return None
    finally:
        os.close(fd)
    return None


def release_all() -> None:
    """Let go of every folder this process holds (their lock files removed)."""
    with _held_guard:
        for key, entry in list(_held.items()):
            del _held[key]
            if entry[0] >= 0:
                _release(key, entry[0])
