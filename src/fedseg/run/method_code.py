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

from collections.abc import Callable, Collection, Iterator
from contextlib import contextmanager
from types import CodeType

from fedseg.engine.faults import MethodError, SiteFailure
from fedseg.engine.own_code import own_place


@contextmanager
def method_code(algorithm: str, codes: Collection[CodeType], when: Callable[[], str]) -> Iterator[None]:
    """Re-raise an exception whose traceback passes through the method's own ``codes``
    (``fedseg.engine.own_code.own_code`` of its server and client) as a ``MethodError``: ``<algorithm>, <when()>:
    <type>: <message> (raised in <function>, <file>:<line>: ...)``; anything else unchanged. Built-in methods have
    no own code outside fedseg."""
    try:
        yield
    except (SiteFailure, MethodError, OSError, MemoryError):  # a site's, a said one, the machine's
        raise
    except Exception as e:
        fedsegs = type(e).__module__.startswith("fedseg.")  # fedseg's own error (WorkerDied...), said as it is
        place = "" if fedsegs else own_place(e, codes)
        if not place:
            raise
        message = " ".join(str(e).split()) or "(no message)"
        raise MethodError(f"{algorithm}, {when()}: {type(e).__name__}: {message}{place}") from e
