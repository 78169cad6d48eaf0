"""Federated algorithms, registered by name: one ``AlgorithmSpec`` per method (``registry``).

Each method module holds a Server and a Client class, its options model and its ``SPECS``. This
list is the one place that names them: adding a method is its module plus one entry here. The
order is the order of the README's method table and of ``fedseg presets``-style listings.
"""

from __future__ import annotations

from fedseg.algorithms import (
    centralized,
    cfl,
    clustered,
    ditto,
    fedadam,
    fedavg,
    fedmedian,
    fednova,
    fedpidavg,
    fedprox,
    fedtrimmedavg,
    finetune,
    local,
    partial,
    qfedavg,
    scaffold,
)
from fedseg.algorithms.autofedavg import method as autofedavg
from fedseg.algorithms.fedsm import extra as fedsm_extra
from fedseg.algorithms.fedsm import method as fedsm_method
from fedseg.algorithms.registry import AlgorithmSpec

METHOD_MODULES = (
    centralized,
    local,
    fedavg,
    fedprox,
    scaffold,
    fednova,
    fedadam,
    fedmedian,
    fedtrimmedavg,
    qfedavg,
    fedpidavg,
    autofedavg,
    finetune,
    ditto,
    partial,
    cfl,
    clustered,
    fedsm_method,
    fedsm_extra,
)

ALGORITHMS: dict[str, AlgorithmSpec] = {spec.name: spec for module in METHOD_MODULES for spec in module.SPECS}


def get_algorithm(name: str) -> AlgorithmSpec:
    """The registry entry of ``name``; KeyError listing the known names otherwise."""
    if name not in ALGORITHMS:
        raise KeyError(f"unknown algorithm {name!r}; available: {', '.join(sorted(ALGORITHMS))}")
    return ALGORITHMS[name]


def check_sites(cfg, num_sites: int, where: str) -> None:
    """``AlgorithmSpec.check_sites`` for every algorithm of run config ``cfg`` with its ``methods.<name>`` options."""
    for name in cfg.algorithms:
        get_algorithm(name).check_sites(num_sites, where, cfg.methods.get(name))


__all__ = ["ALGORITHMS", "AlgorithmSpec", "check_sites", "get_algorithm"]
