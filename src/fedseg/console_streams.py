"""The ``fedseg`` command's console streams outlive their reader.

``fedseg run ... | head`` : ``head`` exits after ten lines, and the run's next line on stdout met a closed pipe
(``BrokenPipeError``), which ended a federated run of hours. :func:`outlive_readers` wraps ``sys.stdout`` and
``sys.stderr`` in :class:`ReaderTolerant`: the first write (or flush) to a stream whose reader went away points that
stream's file descriptor at ``/dev/null``, so the command goes on, silent there, and ends with its own status; the
other stream writes where it did (stderr: the errors and warnings, on the terminal). Files (a run's results,
``run.log``) are written as before. Every print of the command goes through these two objects (``print``, rich's
consoles, logging's handler), so this is the one place that handles it."""

from __future__ import annotations

import contextlib
import os
import sys
from typing import TextIO, cast


class ReaderTolerant:
    """A text stream (``sys.stdout``, ``sys.stderr``) whose write or flush, meeting a closed pipe, sends the stream's
    file descriptor to ``/dev/null`` instead of raising: that text and all later text are dropped. Everything else
    (``isatty``, ``fileno``, ``encoding``...) is the wrapped stream's."""

    def __init__(self, stream: TextIO) -> None:
        self.stream = stream

    def write(self, text: str) -> int:
        try:
            return self.stream.write(text)
        except BrokenPipeError:
            self._drop()
            return len(text)

    def flush(self) -> None:
        try:
            self.stream.flush()
        except BrokenPipeError:
            self._drop()

    def _drop(self) -> None:
        """The reader is gone: the stream's descriptor onto ``/dev/null``, then the text the stream still holds
        flushed there (its buffer emptied: the exit's flush has nothing left to fail on)."""
        devnull = os.open(os.devnull, os.O_WRONLY)
        try:
            os.dup2(devnull, self.stream.fileno())
        finally:
            os.close(devnull)
        with contextlib.suppress(OSError, ValueError):
            self.stream.flush()

    def __getattr__(self, name: str) -> object:
        return getattr(self.stream, name)


def outlive_readers() -> None:
    """``sys.stdout`` and ``sys.stderr`` (those open: not None) as :class:`ReaderTolerant` streams; once per process
    (a stream wrapped already is left as it is)."""
    for name in ("stdout", "stderr"):
        stream = getattr(sys, name)
        if stream is not None and not isinstance(stream, ReaderTolerant):
            setattr(sys, name, cast(TextIO, ReaderTolerant(stream)))
