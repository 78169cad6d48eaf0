"""Federated algorithms, registered by name: one ``AlgorithmSpec`` per method (``registry``).

Each method module holds a Server and a Client class, its options model and its ``SPECS``. This
list is the one place that names them: adding a method is its module plus one entry here. The
order is the order of the README's method table and of ``fedseg presets``-style listings.
User code adds its own methods at run time with ``register_algorithm`` (after the built-in ones), in its own
process; an installed package adds them in every process (entry-point group ``fedseg.methods``, loaded here after
the built-in ones: ``fedseg.method_plugins``). Both pass the same checks (:func:`check_spec`).
"""

from __future__ import annotations

import dataclasses
import difflib
import re
import sys
from collections.abc import Iterable, Mapping
from typing import get_args

from fedseg import method_plugins as plugins
from fedseg.algorithms import (
    centralized,
    cfl,
    clustered,
    ditto,
    fedadam,
    fedavg,
    fedavgdp,
    fedbn,
    fedmedian,
    fednova,
    fedpidavg,
    fedprox,
    fedtrimmedavg,
    finetune,
    krum,
    local,
    partial,
    qfedavg,
    scaffold,
)
from fedseg.algorithms.autofedavg import method as autofedavg
from fedseg.algorithms.fedsm import extra as fedsm_extra
from fedseg.algorithms.fedsm import method as fedsm_method
from fedseg.algorithms.registry import AlgorithmSpec, Kind
from fedseg.config_load import ConfigError
from fedseg.engine.context import MethodOptions

METHOD_MODULES = (
    centralized,
    local,
    fedavg,
    fedavgdp,
    fedprox,
    scaffold,
    fednova,
    fedadam,
    fedmedian,
    fedtrimmedavg,
    krum,
    qfedavg,
    fedpidavg,
    autofedavg,
    finetune,
    ditto,
    partial,
    fedbn,
    cfl,
    clustered,
    fedsm_method,
    fedsm_extra,
)

ALGORITHMS: dict[str, AlgorithmSpec] = {spec.name: spec for module in METHOD_MODULES for spec in module.SPECS}


BUILTIN_ALGORITHMS = frozenset(ALGORITHMS)
PLUGINS: dict[str, plugins.Plugin] = {}  # method name -> the installed package it comes from (loaded at the end)
PLUGIN_FAILURES: list[plugins.Failure] = []  # the installed plugins left out, and why
NAME_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
ON_FLOWER_REGISTERED = (
    "registered from user code (register_algorithm): Flower nodes run other processes; install it as a package "
    "on every site instead (docs/api.md, Packaging a method)"
)


class UnknownAlgorithm(KeyError, ValueError):
    """An algorithm ``name`` neither built in nor registered in this process. A KeyError (a failed look-up in
    ``ALGORITHMS``, as code catching one expects) and a ValueError (bad input, as the API documents); its text is
    the message as written (a plain KeyError's would be quoted)."""

    def __init__(self, name: str, message: str) -> None:
        super().__init__(message)
        self.name = name

    def __str__(self) -> str:
        return str(self.args[0])

    def __reduce__(self):  # pickled as built (a worker process's error reaches the run)
        return type(self), (self.name, self.args[0])


def check_spec(spec: object, taken: Mapping[str, AlgorithmSpec] | None = None, replace: bool = False) -> None:
    """The checks every method defined outside fedseg passes before it is added (``register_algorithm`` and the
    installed plugins, ``fedseg.method_plugins``): a TypeError or ValueError in one line naming the method. Its name
    (the pattern, not a built-in one, not one of ``taken``'s (default: ``ALGORITHMS``) unless ``replace``, never an
    installed plugin's, not another name in other case), its ``server`` and ``client`` (subclasses of ``FedAvgServer``
    and ``FedAvgClient``, in that order), its ``kind`` and its ``options`` model."""
    taken = ALGORITHMS if taken is None else taken
    if not isinstance(spec, AlgorithmSpec):
        raise TypeError(f"expected an AlgorithmSpec, got {type(spec).__name__}")
    if not isinstance(spec.name, str) or not NAME_PATTERN.fullmatch(spec.name):
        raise ValueError(
            f"algorithm name {spec.name!r}: use letters, digits, '.', '_' and '-' (not starting with one): "
            "it names files (checkpoints/NAME.pt, model/NAME/) and a --algorithms list entry"
        )
    if spec.name in BUILTIN_ALGORITHMS:
        raise ValueError(
            f"algorithm {spec.name!r} is built in ({ALGORITHMS[spec.name].display_name}); choose another name"
        )
    if spec.name in PLUGINS:
        raise ValueError(
            f"algorithm {spec.name!r} is installed by {PLUGINS[spec.name]} ({taken[spec.name].display_name}); "
            "choose another name"
        )
    if spec.name in taken and not replace:
        raise ValueError(
            f"algorithm {spec.name!r} is already registered ({taken[spec.name].display_name}); "
            "choose another name or pass replace=True to replace it"
        )
    same_letters = [n for n in taken if n.lower() == spec.name.lower() and n != spec.name]
    if same_letters:  # model/FedAvg and model/fedavg are one folder on macOS and Windows
        raise ValueError(
            f"algorithm {spec.name!r} differs from {same_letters[0]!r} only in upper and lower case: its files "
            "(checkpoints/NAME.pt, model/NAME/) would be the same on a case-insensitive file system; choose another "
            "name"
        )
    server_base, client_base = fedavg.FedAvgServer, fedavg.FedAvgClient
    if _subclass(spec.server, client_base) and _subclass(spec.client, server_base):
        raise TypeError(
            f"algorithm {spec.name!r}: server and client are swapped: AlgorithmSpec(name, display_name, "
            f"server, client, description) takes the server class ({spec.client.__name__}) first"
        )
    for role, value, base in (("server", spec.server, server_base), ("client", spec.client, client_base)):
        if not _subclass(value, base):
            got = value.__name__ if isinstance(value, type) else f"a {type(value).__name__}"
            raise TypeError(
                f"algorithm {spec.name!r}: {role} must be a subclass of fedseg's {base.__name__}, got {got}"
            )
    if spec.kind not in get_args(Kind):
        raise ValueError(f"algorithm {spec.name!r}: kind {spec.kind!r} is not one of {', '.join(get_args(Kind))}")
    if not (isinstance(spec.options, type) and issubclass(spec.options, MethodOptions)):
        raise TypeError(
            f"algorithm {spec.name!r}: options must be a MethodOptions model (fedseg.engine.context), "
            "e.g. FedAvgOptions"
        )


def register_algorithm(spec: AlgorithmSpec, replace: bool = False) -> AlgorithmSpec:
    """Add a method defined outside fedseg: its name then works in configs (``algorithms: [NAME]``,
    ``methods.NAME``), in runs and in listings (``ALGORITHMS``), in this process. A built-in name is
    refused, and so is an installed plugin's; a name already registered is refused unless ``replace`` (e.g. a
    notebook cell run again). Flower nodes are other processes, which do not know it: unless ``spec.on_flower`` says
    otherwise, the registered entry refuses Flower with that reason (an installed method package runs there:
    ``fedseg.method_plugins``). Returns the registered entry.

    Checked here (:func:`check_spec`), with one line naming the method: its name, its ``server`` and ``client``
    (subclasses of ``FedAvgServer`` and ``FedAvgClient``, in that order), its ``kind`` and its ``options`` model.
    Another process (a fresh kernel resuming the run) knows the method only once it registers it again; ``fedseg``
    commands never."""
    if not isinstance(spec, AlgorithmSpec):
        raise TypeError(f"register_algorithm expects an AlgorithmSpec, got {type(spec).__name__}")
    check_spec(spec, replace=replace)
    if spec.on_flower is None:
        spec = dataclasses.replace(spec, on_flower=ON_FLOWER_REGISTERED)
    ALGORITHMS[spec.name] = spec
    return spec


DEFERRED: list = []  # entry points whose module was being imported when fedseg's methods loaded (it imported fedseg)


def _load_plugins() -> None:
    """Add the methods of every installed ``fedseg.methods`` entry point (``fedseg.method_plugins``), after the
    built-in ones: each spec checked as ``register_algorithm`` checks it (:func:`check_spec`); a plugin with any
    problem is left out whole and said in one warning line (``PLUGIN_FAILURES``). A plugin whose module is being
    imported right now (it imported fedseg, which loads the plugins: its ``SPECS`` are not there yet) is loaded
    once its import has finished, when a method is first looked up (:func:`load_deferred`)."""
    try:
        found = plugins.entry_points()
    except Exception as e:  # noqa: BLE001 - a damaged metadata file on sys.path: fedseg still starts
        print(
            f"warning: method plugins not loaded: reading the installed packages failed: {plugins.one_line(e)}",
            file=sys.stderr,
        )
        return
    for entry_point in found:
        if plugins.importing(entry_point):
            DEFERRED.append(entry_point)
        else:
            _load_plugin(entry_point)
    plugins.say_failures(PLUGIN_FAILURES, sys.stderr)


def load_deferred() -> None:
    """Load the plugins :func:`_load_plugins` left for later whose module's import has finished since."""
    ready = [e for e in DEFERRED if not plugins.importing(e)]
    if not ready:
        return
    for entry_point in ready:
        DEFERRED.remove(entry_point)
        _load_plugin(entry_point)
    plugins.say_failures(PLUGIN_FAILURES, sys.stderr)


def _load_plugin(entry_point) -> None:
    """Add one entry point's methods, or record why not (``PLUGIN_FAILURES``)."""
    plugin = plugins.plugin_of(entry_point)
    try:
        specs = plugins.read_specs(entry_point)
    except plugins.NotLoaded as e:
        PLUGIN_FAILURES.append(plugins.Failure(plugin, str(e), (plugin.entry_point,)))
        return
    names = tuple(s.name for s in specs if isinstance(s, AlgorithmSpec) and isinstance(s.name, str))
    mine: dict[str, AlgorithmSpec] = {}
    problems = []
    for i, spec in enumerate(specs):
        try:
            check_spec(spec, {**ALGORITHMS, **mine})
        except Exception as e:  # noqa: BLE001 - TypeError/ValueError as written; anything else from its objects
            problems.append(f"SPECS[{i}]: {' '.join(str(e).split()) or type(e).__name__}")
            continue
        mine[spec.name] = spec
    if problems:
        PLUGIN_FAILURES.append(plugins.Failure(plugin, "; ".join(problems), names or (plugin.entry_point,)))
        return
    ALGORITHMS.update(mine)
    PLUGINS.update(dict.fromkeys(mine, plugin))


def loaded_plugins() -> tuple[dict[str, plugins.Plugin], list[plugins.Failure]]:
    """The plugin methods this process loaded (``PLUGINS``) and the entry points left out (``PLUGIN_FAILURES``), those
    deferred loaded first (``fedseg.method_plugins.load_problem`` reads them)."""
    load_deferred()
    return PLUGINS, PLUGIN_FAILURES


def plugin_records(names: Iterable[str]) -> dict[str, dict[str, str]]:
    """``{method: {"distribution", "version"}}`` for those of ``names`` installed as plugins (what a run records and
    a Flower run config carries)."""
    load_deferred()
    return {name: PLUGINS[name].record() for name in names if name in PLUGINS}


def _subclass(value: object, base: type) -> bool:
    return isinstance(value, type) and issubclass(value, base)


def unregister_algorithm(name: str) -> None:
    """Remove an algorithm added with ``register_algorithm`` (built-in and installed ones cannot be removed)."""
    if name in BUILTIN_ALGORITHMS:
        raise ValueError(f"algorithm {name!r} is built in; only registered algorithms can be removed")
    if name in PLUGINS:
        raise ValueError(
            f"algorithm {name!r} is installed by {PLUGINS[name]}; only registered algorithms can be removed"
        )
    if name not in ALGORITHMS:
        raise KeyError(f"{name!r} is not a registered algorithm")
    del ALGORITHMS[name]


def get_algorithm(name: str) -> AlgorithmSpec:
    """The registry entry of ``name``; an :class:`UnknownAlgorithm` (a KeyError and a ValueError) naming the closest
    known name, or listing them all, otherwise."""
    if name not in ALGORITHMS and DEFERRED:
        load_deferred()
    if name not in ALGORITHMS:
        raise UnknownAlgorithm(name, f"unknown algorithm {name!r}; {_closest_name(name)}")
    return ALGORITHMS[name]


def _closest_name(name: str) -> str:
    """``did you mean 'fedavg'?`` for a near miss, else the list of every algorithm; where an installed plugin that
    would have added ``name`` failed to load, that plugin and why instead (and, after the list, a plugin whose module
    failed to import: its method names are unknown)."""
    own = [f for f in PLUGIN_FAILURES if name in f.names]
    if own:  # an installed package would have added it
        return "; ".join(f.hint() for f in own)
    close = difflib.get_close_matches(name, list(ALGORITHMS), n=1)
    if close:
        return f"did you mean {close[0]!r}?"
    said = f"algorithms: {', '.join(sorted(ALGORITHMS))}"
    unread = [f for f in PLUGIN_FAILURES if f.names == (f.plugin.entry_point,)]  # method names unknown
    if unread:
        said += " (method plugins that failed to load, one may have it: " + "; ".join(f.hint() for f in unread) + ")"
    return said


def check_sites(cfg, num_sites: int, where: str) -> None:
    """``AlgorithmSpec.check_sites`` for every algorithm of run config ``cfg`` with its ``methods.<name>`` options."""
    for name in cfg.algorithms:
        get_algorithm(name).check_sites(num_sites, where, cfg.methods.get(name))


def check_method_names(methods: Mapping[str, object]) -> None:
    """Every key of config ``methods`` names a registered algorithm: a misspelt one (``methods.fedsmm.lam``) would
    otherwise be ignored and the run use the defaults. Keys of algorithms the run does not train are fine (a preset
    holds options for methods one may add), and their options are checked as well (a bad value would otherwise
    surface only in the run that adds the method). ``ConfigError`` naming the key and the closest name."""
    load_deferred()
    for key, options in methods.items():
        if key not in ALGORITHMS:
            raise ConfigError(f"methods.{key}: no algorithm is named {key!r}; {_closest_name(key)}")
        ALGORITHMS[key].parse_options(options)  # type: ignore[arg-type]


_load_plugins()

__all__ = [
    "ALGORITHMS",
    "PLUGINS",
    "AlgorithmSpec",
    "UnknownAlgorithm",
    "check_method_names",
    "check_spec",
    "check_sites",
    "get_algorithm",
    "plugin_records",
    "register_algorithm",
    "unregister_algorithm",
]
