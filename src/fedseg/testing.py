"""Test fixtures for a method's tests, fedseg's own and a method package's: tiny run configs, a tiny federation and a
method's engine and server driven one round at a time.

In a method package's ``tests/conftest.py``::

    pytest_plugins = ["fedseg.testing"]

Its tests then request the fixtures by name (never ``from conftest import``):

- ``tiny_config``: the factory ``tiny_config(**overrides) -> RunConfig`` (:func:`make_tiny_config`);
- ``disc_federation``: the factory ``disc_federation(n_sites=3, cases_per_site=12, size=32, seed=0) -> Federation``
  (:func:`make_disc_federation`).

Both are session-scoped (they hold no state), so module-scoped fixtures can use them too. :func:`simulate` builds a
method's ``Simulator`` engine and server on a federation without writing anything, so a test drives one round at a
time (``engine.round = 1; server.run_round(1)``) and sees every message with an observer.

pytest is a test dependency of fedseg only: this module imports it, and nothing in fedseg imports this module.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

import pytest

from fedseg.config import RunConfig
from fedseg.data import discs
from fedseg.data.federation import Federation

if TYPE_CHECKING:  # loaded by simulate: a conftest naming this plugin stays as light as the fixtures
    from fedseg.algorithms.fedavg import FedAvgServer
    from fedseg.engine.base import Observer
    from fedseg.engine.context import MethodOptions
    from fedseg.engine.simulator import Simulator

# A run config small enough for a test: a 3-level U-Net with 4, 8, 16 channels on 32 x 32 images, batches of 4,
# 2 rounds, one thread; a twentieth of a built-in federation's cases (``data.scale``).
TINY: dict[str, Any] = {
    "seed": 0,
    "threads": 1,
    "data": {"image_size": 32, "scale": 0.05},
    "model": {"channels": [4, 8, 16]},
    "train": {"batch_size": 4},
    "fl": {"rounds": 2},
    "eval": {"hd95": True},
}


def make_tiny_config(**overrides: Any) -> RunConfig:
    """``TINY`` with ``overrides``: a dict value is merged into its section (``train={"lr": 0.1}`` keeps
    ``batch_size``), any other value replaces the key (``algorithms=["fedavg"]``)."""
    data = copy.deepcopy(TINY)
    for key, value in overrides.items():
        if isinstance(value, dict):
            data.setdefault(key, {}).update(value)
        else:
            data[key] = value
    return RunConfig.model_validate(data)


def make_disc_federation(n_sites: int = 3, cases_per_site: int = 12, size: int = 32, seed: int = 0) -> Federation:
    """A hand-made 2D RGB federation (``"discs"``, :func:`fedseg.data.discs.disc_federation`): per case an image
    ``(3, size, size)`` uint8 of noise with a bright disc (label 1) holding a brighter cup (label 2) and its label map
    ``(size, size)``; regions ``disc`` = {1, 2} and ``cup`` = {2}. Site k's images are ``10 k`` brighter, so the sites
    differ a little; sites ``site1``..., cases ``s1_000``..."""
    return discs.disc_federation(n_sites, cases_per_site, size, seed)


@pytest.fixture(scope="session")
def tiny_config() -> Callable[..., RunConfig]:
    """Factory ``tiny_config(**overrides) -> RunConfig`` (:func:`make_tiny_config`)."""
    return make_tiny_config


@pytest.fixture(scope="session")
def disc_federation() -> Callable[..., Federation]:
    """Factory ``disc_federation(n_sites=3, cases_per_site=12, size=32, seed=0) -> Federation``
    (:func:`make_disc_federation`)."""
    return make_disc_federation


class Simulation(NamedTuple):
    """A method ready to train on a federation in this process: its engine (``engine.sites``,
    ``engine.client_states[site]``: each site's state store; set ``engine.round`` before a round), its server
    (``server.run_round(rnd)``, ``server.global_weights``) and its validated options (``methods.<name>``)."""

    engine: Simulator
    server: FedAvgServer
    options: MethodOptions


def simulate(
    name: str, cfg: RunConfig, federation: Federation, observers: Sequence[Observer] | None = None
) -> Simulation:
    """Method ``name`` (any registered one) with its options from ``cfg.methods``, on ``federation`` prepared under
    ``cfg``: a ``Simulator`` (every site in this process, state stores in memory, nothing written) and the method's
    server. ``observers`` are called with ``(site, action, message, reply)`` for every message the engine delivers."""
    from fedseg.algorithms import get_algorithm
    from fedseg.engine.simulator import Simulator
    from fedseg.run.preparation import prepare

    prep = prepare(cfg, federation)
    spec = get_algorithm(name)
    options = spec.parse_options(cfg.methods.get(name))
    engine = Simulator(name, spec.client(), prep.site_data, prep.task, options, observers=list(observers or []))
    return Simulation(engine, spec.server(engine, prep.task, options), options)
