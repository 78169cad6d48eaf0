"""A line a bench's runs show when they start (a note, a warning: ``fedseg.run.experiment.announce``) is shown once
per bench, by the first run that has it: a bench on a fets-cpu folder printed the same HD95 note
(``eval.hd95_worst``) once per run, for every seed and method. Each run's ``run.log`` still holds every line; a
single ``fedseg run`` shows each line once anyway.

While :func:`said_once` holds, ``$FEDSEG_SAID_FOLDER`` names a temporary folder holding one empty file per line
shown, named by the line's digest; :func:`first_time` creates it (``O_EXCL``: one process wins), so runs in processes
of their own (``--jobs``: given the variable by :func:`said_environment`) share it."""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import tempfile
from collections.abc import Iterator

SAID_ENV = "FEDSEG_SAID_FOLDER"


def first_time(line: str) -> bool:
    """Whether ``line`` is shown for the first time: always outside a bench (``$FEDSEG_SAID_FOLDER`` unset), else
    for the first run of the bench to ask (its file made here)."""
    folder = os.environ.get(SAID_ENV)
    if not folder:
        return True
    name = hashlib.sha256(line.encode("utf-8", "surrogatepass")).hexdigest()[:32]  # a file name not UTF-8 too
    try:
        os.close(os.open(os.path.join(folder, name), os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600))
    except FileExistsError:
        return False
    except OSError:  # the folder is gone: rather said twice than never
        return True
    return True


@contextlib.contextmanager
def said_once() -> Iterator[None]:
    """The block's runs (in this process, or in processes given :func:`said_environment`) show each line once: a
    temporary folder in ``$FEDSEG_SAID_FOLDER`` meanwhile, removed at the end (the variable as it was). Where no
    temporary folder can be made, every run shows its lines, as a single run does."""
    try:
        folder = tempfile.mkdtemp(prefix="fedseg-said-")
    except OSError:
        yield
        return
    before = os.environ.get(SAID_ENV)
    os.environ[SAID_ENV] = folder
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(SAID_ENV, None)
        else:
            os.environ[SAID_ENV] = before
        shutil.rmtree(folder, ignore_errors=True)


def said_environment() -> dict[str, str]:
    """``{"FEDSEG_SAID_FOLDER": folder}`` inside :func:`said_once` (for a run's process, whose environment is its
    process server's), else ``{}``."""
    folder = os.environ.get(SAID_ENV)
    return {SAID_ENV: folder} if folder else {}
