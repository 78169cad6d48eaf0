"""What the worker pool's processes must import, checked before they have to (``fedseg.engine.pool``).

A worker receives each method's client, task and options pickled: every class and function in them travels by
reference (module and name) and the worker imports it. Two kinds cannot be imported there:

- one defined in ``__main__`` where the workers do not load this process's ``__main__``: a notebook, the Python
  prompt, ``python -c``, a package's ``__main__.py`` (multiprocessing loads ``__main__`` in a new process only
  from a script's file or a module's name, :func:`main_in_workers`);
- one defined inside a function (``<locals>`` in its ``__qualname__``), or a lambda.

Where the workers do load ``__main__`` (a script), they run the script's top-level code again as they start: a
script that starts the run at its top level, not under ``if __name__ == "__main__":``, would start it again in
every worker (multiprocessing refuses: each worker prints a traceback and dies), and a script read from standard
input (``python -``) has no file to load at all. :func:`check_main` finds both before any worker starts (the
top-level case where the statement that started the run is under no condition at all: a script whose run is
under an ``if`` is let through); :func:`check_sendable` the classes, before a method is sent to the workers. Each
is one ValueError saying what to change.
"""

from __future__ import annotations

import ast
import os
import pickle
import sys
import tokenize
from types import FunctionType
from typing import Any

FIX = "define it in a .py module importable by the workers, or use engine.workers: 1"
GUARD = 'put the run under `if __name__ == "__main__":`, or use engine.workers: 1'


def main_in_workers() -> tuple[str, str] | None:
    """How a worker process loads this process's ``__main__`` as it starts: ``("path", file)`` (a script, run again
    as ``__mp_main__``), ``("name", module)`` (``python -m module``, imported again), or None (not at all).
    As ``multiprocessing.spawn`` prepares a new process, for ``spawn`` and ``forkserver`` alike."""
    from multiprocessing import spawn

    try:
        data = spawn.get_preparation_data("fedseg-worker")
    except Exception:  # noqa: BLE001 - this process is itself a worker starting, or a platform without it
        return None
    name = data.get("init_main_from_name")
    if name is not None:
        return None if name == "__main__" or name.endswith(".__main__") else ("name", name)
    path = data.get("init_main_from_path")
    if path is None or os.path.splitext(os.path.basename(path))[0] == "ipython":  # multiprocessing skips IPython's
        return None
    return ("path", path)


def check_main() -> None:
    """A ValueError where every worker would fail to start: ``__main__``'s file is missing (``python -``), or the
    run was started by a top-level statement of the script, under no ``if __name__ == "__main__":``."""
    how = main_in_workers()
    if how is None:
        return
    main = sys.modules["__main__"]
    path = how[1] if how[0] == "path" else getattr(main, "__file__", None)
    if how[0] == "path" and not os.path.isfile(how[1]):
        raise ValueError(
            f"engine.workers > 1: each worker process loads __main__ again from its file, and this one has none "
            f"({getattr(main, '__file__', how[1])!r}: a script read from standard input?); save the script as a .py "
            f'file and run that, with the run under `if __name__ == "__main__":`, or use engine.workers: 1'
        )
    line = _main_line(main)
    if path is not None and line is not None and _unconditional(path, line):
        shown = os.path.basename(path)
        raise ValueError(
            f"engine.workers > 1: {shown} starts the run at its top level (line {line}), and each worker process runs "
            f"{shown}'s top level again as it starts (it would start the run again): {GUARD}"
        )


def _main_line(main: Any) -> int | None:
    """The line ``__main__``'s top-level code is running (the statement that led here), or None where it is not
    running (a thread, an ``atexit`` hook)."""
    frame = sys._getframe(1)
    while frame is not None:
        if frame.f_code.co_name == "<module>" and frame.f_globals is vars(main):
            return frame.f_lineno
        frame = frame.f_back  # type: ignore[assignment]
    return None


def _unconditional(path: str, line: int) -> bool:
    """Whether the top-level statement of file ``path`` holding ``line`` runs under no condition: in no ``if``,
    ``while``, ``match`` or ``except`` block, and testing no ``__name__`` itself. False when unsure (the file
    unreadable or changed): only a certain case is refused."""
    try:
        with tokenize.open(path) as f:
            body: list[ast.stmt] = ast.parse(f.read(), path).body
    except (OSError, SyntaxError, ValueError):
        return False
    while True:
        stmt = next((s for s in body if s.lineno <= line <= (s.end_lineno or s.lineno)), None)
        if stmt is None or isinstance(stmt, (ast.If, ast.While, ast.Match)):
            return False
        if isinstance(stmt, (ast.Try, ast.TryStar)):
            if any(h.lineno <= line <= (h.end_lineno or h.lineno) for h in stmt.handlers):
                return False
            body = stmt.body + stmt.orelse + stmt.finalbody
        elif isinstance(stmt, (ast.With, ast.AsyncWith)):
            body = stmt.body
        elif isinstance(stmt, (ast.For, ast.AsyncFor)):
            body = stmt.body + stmt.orelse
        elif isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            return False  # a decorator's line: not a run started at the top level
        else:
            return not any(
                isinstance(n, (ast.IfExp, ast.BoolOp)) or (isinstance(n, ast.Name) and n.id == "__name__")
                for n in ast.walk(stmt)
            )


def unreachable(obj: Any) -> str | None:
    """Why a worker cannot import class or function ``obj`` by its name (where it is defined), or None."""
    if not isinstance(obj, (type, FunctionType)):
        return None
    module, qualname = getattr(obj, "__module__", None), getattr(obj, "__qualname__", "")
    if "<locals>" in qualname or "<lambda>" in qualname:
        return f"is defined inside a function ({module}.{qualname})"
    if module == "__main__" and main_in_workers() is None:
        return (
            "is defined in __main__ of this session (a notebook, the Python prompt, `python -c`), "
            "which the worker processes do not load"
        )
    return None


class _Unreachable(Exception):
    def __init__(self, obj: Any, why: str):
        super().__init__(why)
        self.obj, self.why = obj, why


class _Discard:
    def write(self, data: Any) -> None:
        pass


class _Finder(pickle.Pickler):
    """Pickles to nowhere, stopping at the first class or function a worker could not import (tensors are skipped:
    their bytes import nothing)."""

    def __init__(self) -> None:
        super().__init__(_Discard(), protocol=pickle.HIGHEST_PROTOCOL)

    def reducer_override(self, obj: Any) -> Any:
        import torch

        if isinstance(obj, torch.Tensor):
            return int, ()
        why = unreachable(obj)
        if why is not None:
            raise _Unreachable(obj, why)
        return NotImplemented


def check_sendable(algorithm: str, context: Any, setting: str = "engine.workers > 1", fix: str = FIX) -> None:
    """A ValueError naming method ``algorithm`` and the class (or function) of ``context`` (what the workers
    receive: its client, task, options) that they could not import. Another pickling problem is left for the
    sending to report. ``setting``, ``fix``: what sends it to other processes, what to do instead (a bench's
    ``--jobs``: ``fedseg.bench.execute``)."""
    try:
        _Finder().dump(context)
    except _Unreachable as e:
        what = "class" if isinstance(e.obj, type) else "function"
        raise ValueError(f"{setting}: method {algorithm!r}: {what} {e.obj.__qualname__} {e.why}; {fix}") from None
    except Exception:  # noqa: BLE001, S110 - not a question of imports: the real send says what
        pass
