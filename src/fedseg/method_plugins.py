"""Methods installed as packages: the entry-point group ``fedseg.methods``.

A research group ships its method as a distribution whose metadata declares::

    [project.entry-points."fedseg.methods"]
    mymethod = "fedseg_mymethod"

naming a module with ``SPECS = (AlgorithmSpec(...), ...)``, the convention of fedseg's own method modules.
``fedseg.algorithms`` loads every such module when it is imported, after the built-in methods, so every process
(the ``fedseg`` commands, a bench's run processes, the worker pool, Flower's SuperNodes and ServerApp) knows the
methods installed in its environment; each spec passes the checks of ``register_algorithm``. A plugin that cannot
be loaded (its module fails to import, has no ``SPECS``, or a spec fails a check) is skipped whole, with one warning
line on stderr (:meth:`Failure.line`), said once per process tree (``WARNED``); fedseg itself goes on.

On Flower the coordinator sends the plugins' names and versions of the run's methods in the run config
(``fedseg-plugins``, :func:`run_config_value`); the ServerApp and every SuperNode refuse a run whose plugin they
lack or hold in another version (:func:`version_problem`), as they refuse another fedseg version. A SuperNode also
refuses, at its start-up data check (the ``info`` query), a run whose plugin it holds in the right version but
cannot load (:func:`load_problem`: its module fails to import there, a dependency missing on that machine), naming
the package, the method and the error: it would otherwise take part until round 1's first message found no such
method.

Standard library only at import: a SuperNode checks the versions for every message, and its engine queries do not
import torch or the methods (``fedseg.flower.node``); :func:`load_problem` imports them, once, for the ``info``
query, and only for a run that has plugin methods.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

GROUP = "fedseg.methods"
# the failures said already, "distribution==version:entry point" a line: set by the process that said them, so
# the processes it starts (a bench's runs, pool workers, Flower's apps) do not say them again
WARNED = "FEDSEG_PLUGINS_WARNED"
RUN_CONFIG_KEY = "fedseg-plugins"  # Flower run config: {method: {"distribution", "version"}} (JSON)


@dataclass(frozen=True)
class Plugin:
    """Where a method comes from: the installed ``distribution`` at ``version``, its entry point's ``entry_point``
    name and ``module`` (the entry point's value)."""

    distribution: str
    version: str
    entry_point: str
    module: str

    def __str__(self) -> str:
        return f"plugin {self.distribution} {self.version}"

    def record(self) -> dict[str, str]:
        """What a run records of it (provenance, model card, Flower run config): name and version."""
        return {"distribution": self.distribution, "version": self.version}

    @property
    def key(self) -> str:
        return f"{self.distribution}=={self.version}:{self.entry_point}"


@dataclass(frozen=True)
class Failure:
    """A plugin not loaded: ``problem`` says why, in one line; ``names`` the method names it would have added, where
    known (an import failure: the entry point's name)."""

    plugin: Plugin
    problem: str
    names: tuple[str, ...] = ()

    def line(self) -> str:
        """The warning line said once when fedseg's methods load."""
        p = self.plugin
        return (
            f"warning: method plugin {p.distribution} {p.version} (entry point {p.entry_point} = {p.module}) is not "
            f"loaded: {self.problem}; fedseg goes on without it"
        )

    def hint(self) -> str:
        """Why a method of it is unknown (the unknown-algorithm error's hint)."""
        p = self.plugin
        return f"{p} (entry point {p.entry_point}) failed to load: {self.problem}"


def one_line(error: BaseException) -> str:
    """``Type: message`` on one line (a SyntaxError's message spans several)."""
    text = " ".join(str(error).split())
    return f"{type(error).__name__}: {text}" if text else type(error).__name__


def entry_points() -> list[Any]:
    """The installed entry points of group ``fedseg.methods`` (one per distribution name: the first on ``sys.path``,
    the one Python imports), sorted by distribution and entry point names: the order they load in, and so which of
    two plugins claiming one method name is refused, is the same on every machine (not the file system's)."""
    from importlib.metadata import entry_points as installed

    def key(entry_point: Any) -> tuple[str, str]:
        return plugin_of(entry_point).distribution.lower().replace("_", "-"), str(entry_point.name)

    return sorted(installed(group=GROUP), key=key)


def plugin_of(entry_point: Any) -> Plugin:
    dist = getattr(entry_point, "dist", None)
    name = str(dist.metadata["Name"] or dist.name) if dist is not None else "<unknown distribution>"
    version = str(dist.version) if dist is not None else "<unknown version>"
    return Plugin(name, version, str(entry_point.name), str(entry_point.value))


def importing(entry_point: Any) -> bool:
    """Whether the module ``entry_point`` names, or a package holding it, is being imported right now (it imported
    fedseg, which loads the plugins: loading it then would find its ``SPECS``, or what its package's ``__init__``
    defines after the import of fedseg, not yet there)."""
    import sys

    parts = str(entry_point.value).split(":")[0].strip().split(".")
    for depth in range(1, len(parts) + 1):
        module = sys.modules.get(".".join(parts[:depth]))
        if getattr(getattr(module, "__spec__", None), "_initializing", False):
            return True
    return False


class NotLoaded(Exception):
    """An entry point whose ``SPECS`` cannot be read; the message says why, in one line."""


def read_specs(entry_point: Any) -> tuple[Any, ...]:
    """The ``SPECS`` of the module (or object) ``entry_point`` names, as a tuple, unchecked; ``NotLoaded`` when its
    import fails, or it has no ``SPECS``, or they are not a non-empty tuple or list."""
    try:
        target = entry_point.load()
    except (Exception, SystemExit) as e:  # noqa: BLE001 - any failure of someone else's module: said in one line
        raise NotLoaded(f"importing {entry_point.value} failed: {one_line(e)}") from None
    specs = getattr(target, "SPECS", None)
    if specs is None:
        raise NotLoaded(
            f"{entry_point.value} has no SPECS (a tuple of fedseg.AlgorithmSpec, as fedseg's own method modules end)"
        )
    if not isinstance(specs, tuple | list) or not specs:
        raise NotLoaded(f"{entry_point.value}.SPECS is {type(specs).__name__}, not a non-empty tuple of AlgorithmSpec")
    return tuple(specs)


def say_failures(failures: list[Failure], stream: Any) -> None:
    """Write each failure's warning line to ``stream``, except those a parent process said already (``WARNED``),
    and mark them said for this process's children."""
    said = set(filter(None, os.environ.get(WARNED, "").split("\n")))
    new = [f for f in failures if f.plugin.key not in said]
    for failure in new:
        print(failure.line(), file=stream, flush=True)
    if new:
        os.environ[WARNED] = "\n".join(sorted(said | {f.plugin.key for f in new}))


def run_config_value(records: dict[str, dict[str, str]]) -> str:
    """The Flower run config's ``fedseg-plugins`` value: ``{method: {"distribution", "version"}}`` as JSON, "" when
    the run has no plugin method."""
    return json.dumps(records, sort_keys=True) if records else ""


def installed_version(distribution: str) -> str | None:
    """The version of ``distribution`` installed here (importlib.metadata, no import of it); None if none is."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return str(version(distribution))
    except PackageNotFoundError:
        return None


def same_version(a: str, b: str) -> bool:
    """Whether two version strings name one release (``1.0`` and ``1.0.0``: PEP 440, where ``packaging`` is
    installed; else the strings)."""
    try:
        from packaging.version import InvalidVersion, Version
    except ImportError:
        return a == b
    try:
        return Version(a) == Version(b)
    except InvalidVersion:
        return a == b


def version_problem(value: object, here: str) -> str | None:
    """Why this process (``here``: "this SuperNode", "the coordinator") cannot take part in a run whose run config's
    ``fedseg-plugins`` is ``value``: a plugin of one of its methods missing here, or installed in another version (one
    line per method, joined); None when every one agrees (or the run has none)."""
    if not value:
        return None
    try:
        records = json.loads(str(value))
    except ValueError:
        return f"the run's {RUN_CONFIG_KEY} is not JSON: {str(value)[:80]!r}"
    problems = []
    for method, record in sorted(records.items()):
        dist, wanted = str(record.get("distribution")), str(record.get("version"))
        have = installed_version(dist)
        if have is None:
            problems.append(
                f"method {method!r} comes from {dist} {wanted}, which {here} does not have installed "
                f"(pip install '{dist}=={wanted}')"
            )
        elif not same_version(have, wanted):
            problems.append(
                f"method {method!r} comes from {dist} {wanted} but {here} has {dist} {have} installed (install the "
                "same version)"
            )
    return "; ".join(problems) or None


def load_problem(
    value: object, here: str, loaded: Callable[[], tuple[Mapping[str, Plugin], Sequence[Failure]]]
) -> str | None:
    """Why this process (``here``: "this SuperNode") cannot run the plugin methods of a run whose run config's
    ``fedseg-plugins`` is ``value``, though it has their packages in the right version (:func:`version_problem` says
    the others): a method its package's entry point did not add here, with the reason the loading recorded (the
    import error, a spec refused); one line per method, joined; None when each loads (or the run has none, or its
    value is not JSON: :func:`version_problem` says that). ``loaded``: the process's plugin methods and failures
    (``fedseg.algorithms.loaded_plugins``, which imports torch and the methods: called only where the run has a plugin
    method, so for a start-up check, not for every message; passed in, as this module sits below the methods)."""
    if not value:
        return None
    try:
        records = json.loads(str(value))
    except ValueError:
        return None
    if not isinstance(records, dict) or not records:
        return None
    methods, failures = loaded()
    problems = []
    for method, record in sorted(records.items()):
        dist, wanted = str(record.get("distribution")), str(record.get("version"))
        have = installed_version(dist)
        if have is None or not same_version(have, wanted):
            continue  # version_problem's to say
        other = methods.get(method)
        if other is not None and _same_name(other.distribution, dist):
            continue
        failed = [f for f in failures if _same_name(f.plugin.distribution, dist)]
        why = "; ".join(f"entry point {f.plugin.entry_point} = {f.plugin.module}: {f.problem}" for f in failed)
        if other is not None:
            why = f"method {method!r} here comes from {other.distribution} {other.version}" + (
                f"; {why}" if why else ""
            )
        missing = any(f"failed: {kind}" in f.problem for f in failed for kind in ("ModuleNotFoundError", "ImportError"))
        # a process loads the packages once (fedseg.algorithms' import): a fix is seen after a restart, not before
        fix = f"install what it imports on {here}'s machine" if missing else "fix the package there"
        problems.append(
            f"method {method!r} comes from {dist} {wanted}, which {here} has installed but cannot load: "
            f"{why or f'its entry points add no method {method!r}'} ({fix}, then restart {here})"
        )
    return "; ".join(problems) or None


def _same_name(a: str, b: str) -> bool:
    """Whether two distribution names are one (PEP 503: case, ``-``, ``_`` and ``.`` alike)."""
    return re.sub(r"[-_.]+", "-", a).lower() == re.sub(r"[-_.]+", "-", b).lower()
