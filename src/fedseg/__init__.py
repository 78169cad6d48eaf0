"""fedseg: cross-silo federated learning for medical image segmentation.

The Python API (see docs/api.md and :mod:`fedseg.api`)::

    from fedseg import Experiment, load_config

    results = Experiment(load_config(preset="demo", overrides=["fl.rounds=2"]), "runs/demo").run()
    print(results.dice())

Names exported here are imported on first use (``__getattr__``), so ``import fedseg`` (and the command line)
stays fast: torch is loaded only when a name that needs it is used. (No import of them here, not even for type
checkers: this package's ``__init__`` is the lowest layer, see tests/test_architecture.py.)
"""

from __future__ import annotations

from importlib import import_module
from typing import Any

__version__ = "0.1.0"

# exported name -> the module defining it (imported lazily, by ``__getattr__``)
_EXPORTS = {
    "Experiment": "fedseg.api",
    "Results": "fedseg.api",
    "load_config": "fedseg.config_load",
    "RunConfig": "fedseg.config",
    "ConfigError": "fedseg.config_load",
    "register_algorithm": "fedseg.algorithms",
    "AlgorithmSpec": "fedseg.algorithms.registry",
    "register_federation": "fedseg.data.sources",
    "Federation": "fedseg.data.federation",
    "FederationError": "fedseg.data.federation",
    "Site": "fedseg.data.federation",
    "Case": "fedseg.data.federation",
    "Regions": "fedseg.data.federation",
    "FedAvgServer": "fedseg.algorithms.fedavg",
    "FedAvgClient": "fedseg.algorithms.fedavg",
    "FedAvgOptions": "fedseg.algorithms.fedavg",
    "MethodOptions": "fedseg.engine.context",
    "TrainHooks": "fedseg.train",
    "Message": "fedseg.engine.messages",
    "MethodError": "fedseg.engine.faults",
}

__all__ = [
    "AlgorithmSpec",
    "Case",
    "ConfigError",
    "Experiment",
    "FedAvgClient",
    "FedAvgOptions",
    "FedAvgServer",
    "Federation",
    "FederationError",
    "Message",
    "MethodError",
    "MethodOptions",
    "Regions",
    "Results",
    "RunConfig",
    "Site",
    "TrainHooks",
    "__version__",
    "load_config",
    "register_algorithm",
    "register_federation",
]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'fedseg' has no attribute {name!r}")
    value = getattr(import_module(module), name)
    globals()[name] = value  # later lookups skip __getattr__
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_EXPORTS})
