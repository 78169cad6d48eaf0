"""A registered method's own code: the functions of its server and client classes that are not fedseg's (written
in a notebook's cell, a script, a module beside it), and the place an error was raised in them, for the one line
that reports it (``fedseg.run.method_code`` on the server's side, ``BaseEngine.exchange`` on a site's; a pool
worker records it with the exception, :func:`keep_own_place`)."""

from __future__ import annotations

import inspect
import sysconfig
from collections.abc import Collection
from pathlib import Path
from types import CodeType

import fedseg

_PACKAGE = Path(fedseg.__file__).resolve().parent
_LIBRARIES = [_PACKAGE] + [
    Path(p).resolve() for key in ("stdlib", "platstdlib", "purelib", "platlib") if (p := sysconfig.get_paths().get(key))
]


def own_code(*classes: type) -> set[CodeType]:
    """The code objects of the functions of ``classes`` and of their base classes (with the comprehensions and
    functions nested in them), fedseg's, the standard library's and installed packages' left out."""
    codes: set[CodeType] = set()
    for cls in classes:
        for klass in cls.__mro__:
            for member in vars(klass).values():
                function = inspect.unwrap(
                    member.__func__ if isinstance(member, (classmethod, staticmethod)) else member
                )
                code = getattr(function, "__code__", None)
                if isinstance(code, CodeType) and not _is_library(code.co_filename):
                    codes |= _with_nested(code)
    return codes


def _with_nested(code: CodeType) -> set[CodeType]:
    nested = [c for c in code.co_consts if isinstance(c, CodeType)]
    return {code}.union(*(_with_nested(c) for c in nested))


def _is_library(filename: str) -> bool:
    path = Path(filename)
    return path.is_absolute() and any(path.resolve().is_relative_to(p) for p in _LIBRARIES)


def own_frame(error: BaseException, codes: Collection[CodeType]) -> tuple[str, str, int] | None:
    """``(function, file, line)`` of the innermost frame of ``error``'s traceback that runs one of ``codes``
    (``own_code``); None where none does."""
    found, tb = None, error.__traceback__
    while tb is not None:
        if tb.tb_frame.f_code in codes:
            found = (tb.tb_frame.f_code.co_name, tb.tb_frame.f_code.co_filename, tb.tb_lineno)
        tb = tb.tb_next
    return found


_PLACE = "fedseg_own_place"  # the attribute keep_own_place sets: pickled with the exception, unlike its traceback


def own_place(error: BaseException, codes: Collection[CodeType]) -> str:
    """`` (raised in <function>, <file>:<line>: the method's own code)`` for ``error`` raised through ``codes``
    (:func:`own_frame`), or as :func:`keep_own_place` recorded it in the process that raised it; empty otherwise."""
    kept = getattr(error, _PLACE, None)
    if isinstance(kept, str):
        return kept
    frame = own_frame(error, codes) if codes else None
    if frame is None:
        return ""
    function, filename, line = frame
    return f" (raised in {function}, {filename}:{line}: the method's own code)"


def keep_own_place(error: BaseException, codes: Collection[CodeType]) -> None:
    """Record :func:`own_place` on ``error`` for a process that receives it pickled, without its traceback (a
    worker's site failure reaching the pool's parent)."""
    setattr(error, _PLACE, own_place(error, codes))
