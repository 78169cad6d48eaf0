"""The secret a Flower runtime (SuperNode or SuperLink) and fedseg's task runner beside it share, and how a secret or
a task token reaches another process unseen.

Flower's SuperNode and SuperLink hand out tasks (and with them, a site's messages and state, or the whole run) to
whoever calls ``AcquireTask`` on their Runtime API, on this machine's loopback. Started with
``--superexec-auth-secret-file`` (Flower's SuperExec authentication) they answer only calls signed with that file's
secret: fedseg draws one at each start (:func:`drawn_secret`) and gives it to its runner (``fedseg.flower.worker`` for
a site, ``fedseg.flower.serverapp_runner`` for the coordinator) on the runner's standard input (:func:`hand_over`,
:func:`handed_over`), as the runner gives each task process its token: never in a command's arguments (``ps`` shows
them to every user of the machine) nor in an environment (``/proc/PID/environ``, which a process's children inherit).
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

from fedseg.atomic_files import atomic_write_bytes
from fedseg.interrupts import is_running

SECRET_FILE = "superexec.secret"
SECRET_BYTES = 32


def folder_prefix(purpose: str) -> str:
    """``fedseg-<purpose>-``: the name of a secret's temporary folder, then its process's pid (``supernode``,
    ``superlink``)."""
    return f"fedseg-{purpose}-"


@contextlib.contextmanager
def drawn_secret(purpose: str) -> Iterator[tuple[bytes, Path]]:
    """``(secret, its file)``: :data:`SECRET_BYTES` random bytes drawn now, in a file of mode 0600 in a temporary folder
    of mode 0700 (``fedseg-<purpose>-<pid>-*``) that is removed when the block ends; folders of the same purpose that
    a process killed with -9 left are removed first (:func:`remove_dead_secrets`)."""
    remove_dead_secrets(purpose)
    secret = secrets.token_bytes(SECRET_BYTES)
    with tempfile.TemporaryDirectory(prefix=f"{folder_prefix(purpose)}{os.getpid()}-") as private:  # 0700
        path = Path(private) / SECRET_FILE
        atomic_write_bytes(path, lambda f: f.write(secret), private=True)
        yield secret, path


def remove_dead_secrets(purpose: str) -> None:
    """Remove this user's ``fedseg-<purpose>-<pid>-*`` folders whose process no longer runs (``kill -9``): a secret
    no process uses any more."""
    prefix = folder_prefix(purpose)
    for folder in Path(tempfile.gettempdir()).glob(f"{prefix}*"):
        pid = folder.name.removeprefix(prefix).split("-", 1)[0]
        if pid.isdigit() and not is_running(int(pid)) and folder.is_dir() and not folder.is_symlink():
            if folder.stat().st_uid == os.getuid():
                shutil.rmtree(folder, ignore_errors=True)


def hand_over(child: subprocess.Popen, text: str) -> None:
    """Give ``child`` (started with ``stdin=subprocess.PIPE``, in bytes) one line, ``text``, on its standard input,
    then close it. A child that has already exited is left to be reported by whoever waits for it."""
    assert child.stdin is not None, "start the child with stdin=subprocess.PIPE"
    with contextlib.suppress(BrokenPipeError):
        child.stdin.write(f"{text}\n".encode())
        child.stdin.close()


def handed_over() -> str:
    """The line :func:`hand_over` gave this process ('' where its standard input is a terminal, closed or empty:
    a runner started by hand has no secret, and Flower refuses its calls)."""
    stdin = sys.stdin
    if stdin is None or stdin.closed or stdin.isatty():
        return ""
    line = stdin.readline().strip()
    stdin.close()
    return line
