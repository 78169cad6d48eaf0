"""An error raised in a method's own code (a registered method's server, ``fedseg.algorithms.register_algorithm``)
said in one line that names the method, the round and where it was raised, instead of a bare ``KeyError:
'val_loss'`` or a page of traceback through fedseg's engine.

"Own code": a function of the algorithm's server or client classes (or of a base class of theirs) that is not
fedseg's: written in a notebook's cell, a script, a module beside it; the innermost such frame is named, so an error
in a helper it calls is placed at the call. Errors raised elsewhere (fedseg's refusals and messages, a caller's round
callback), errors of fedseg's own types, the machine's (``OSError``, ``MemoryError``) and the sites' (``SiteFailure``,
which names the site) pass unchanged.
"""

from __future__ import annotations

import inspect
import sysconfig
from collections.abc import Callable, Collection, Iterator
from contextlib import contextmanager
from pathlib import Path
from types import CodeType

import fedseg
from fedseg.engine.faults import MethodError, SiteFailure

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


@contextmanager
def method_code(algorithm: str, classes: tuple[type, ...], when: Callable[[], str]) -> Iterator[None]:
    """Re-raise an exception whose traceback passes through the own code of the method's ``classes`` (its server
    and client; ``own_code``) as a ``MethodError``: ``<algorithm>, <when()>: <type>: <message> (raised in
    <function>, <file>:<line>: ...)``; anything else unchanged. Built-in methods have no own code outside fedseg."""
    codes = own_code(*classes)
    try:
        yield
    except (SiteFailure, MethodError, OSError, MemoryError):  # a site's, a said one, the machine's
        raise
    except Exception as e:
        fedsegs = type(e).__module__.startswith("fedseg.")  # fedseg's own error (WorkerDied...), said as it is
        frame = own_frame(e, codes) if codes and not fedsegs else None
        if frame is None:
            raise
        function, filename, line = frame
        message = " ".join(str(e).split()) or "(no message)"
        raise MethodError(
            f"{algorithm}, {when()}: {type(e).__name__}: {message} (raised in {function}, {filename}:{line}: the "
            "method's own code)"
        ) from e
