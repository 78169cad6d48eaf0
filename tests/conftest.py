"""Shared fixtures: tiny federations (32x32, a few cases per site) and tiny run configs.

Tests request them as arguments (never ``from conftest import``):

- ``tiny``: a fresh copy of the tiny run-config dict (``fedseg.testing.TINY``), for YAML config files;
- ``tiny_config``: the factory ``tiny_config(**overrides) -> RunConfig`` (``fedseg.testing``, the fixtures a method
  package's tests use too);
- ``disc_federation``: the factory ``disc_federation(n_sites=3, cases_per_site=12, size=32, seed=0) -> Federation``
  (``fedseg.testing``);
- ``discs``: ``disc_federation()``.

Every test session writes built-in federations to a temporary cache folder of its own (``FEDSEG_CACHE_DIR``, set
for the whole session, subprocesses included): never the user's ``~/.cache``; tests in one session share it.

The two factories are session-scoped (they hold no state), so module-scoped fixtures can use them too.
"""

from __future__ import annotations

import copy
import gc
import os

import pytest
import torch

from fedseg.data.federation import Federation

pytest_plugins = [
    "fedseg.testing"
]  # the fixtures tiny_config and disc_federation, as a method package's tests get them

torch.set_num_threads(1)


@pytest.fixture(scope="session", autouse=True)
def federation_cache(tmp_path_factory):
    """The session's cache folder for built-in federations (``fedseg.data.cache``), in ``FEDSEG_CACHE_DIR``."""
    path = tmp_path_factory.mktemp("federation-cache")
    previous = os.environ.get("FEDSEG_CACHE_DIR")
    os.environ["FEDSEG_CACHE_DIR"] = str(path)
    yield path
    if previous is None:
        os.environ.pop("FEDSEG_CACHE_DIR", None)
    else:
        os.environ["FEDSEG_CACHE_DIR"] = previous


@pytest.fixture
def frozen_heap():
    """``gc.freeze()`` for the test: the collector then skips every object that existed before it. Flower's
    message-API strategies (Bulyan, q-FedAvg) run ``gc.collect()`` once per reply
    (``ArrayRecord.to_numpy_ndarrays(keep_input=False)``); in the suite's process, which has imported and built
    everything by then, one collection takes ~0.2 s, so a test of 10 replies spent 2 s collecting. Nothing such a
    test compares depends on the collector."""
    gc.freeze()
    yield
    gc.unfreeze()


@pytest.fixture
def tiny() -> dict:
    """The tiny run-config dict (a deep copy: a test may change it)."""
    from fedseg.testing import TINY  # not at the top: pytest_plugins loads the module first (its asserts rewritten)

    return copy.deepcopy(TINY)


@pytest.fixture
def discs(disc_federation) -> Federation:
    return disc_federation()
