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
from collections import OrderedDict

import pytest
import torch

from fedseg.data.federation import Federation

pytest_plugins = [
    "fedseg.testing"
]  # the fixtures tiny_config and disc_federation, as a method package's tests get them

torch.set_num_threads(1)


# Modules whose few tests take minutes together (Flower deployments, processes stopped mid-run, benches), longest
# first. `make test`'s `--dist loadscope` queues modules by their number of tests, most first, so these came last and
# one worker ran them alone while the other had finished; the scheduler below hands them out first instead (longest
# first, the short modules then even out the two workers' ends). Only the order changes: every test still runs.
HEAVY_MODULES_FIRST = (
    "test_flower_deploy.py",
    "test_flower_security.py",
    "test_interrupts.py",
    "test_flower_secure.py",
    "test_flower_restart.py",
    "test_method_plugins.py",
    "test_loss_surface.py",
    "test_memory_guard.py",
    "test_pool_engine.py",
    "test_fedsm.py",
    "test_api.py",
    "test_docs.py",
    "test_bench_kill.py",
)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """``--dist loadscope`` handing out ``HEAVY_MODULES_FIRST`` before the rest (then xdist's own order)."""
    if config.getvalue("dist") != "loadscope":
        return None
    from xdist.scheduler import LoadScopeScheduling

    if not callable(getattr(LoadScopeScheduling, "_assign_work_unit", None)):  # another xdist: its own order
        return None

    class HeavyFirst(LoadScopeScheduling):
        def _assign_work_unit(self, node) -> None:
            queue = getattr(self, "workqueue", None)
            for name in HEAVY_MODULES_FIRST if isinstance(queue, OrderedDict) else ():
                scope = next((s for s in queue if s.split("::")[0].endswith("/" + name)), None)
                if scope is not None:
                    queue.move_to_end(scope, last=False)
                    break
            super()._assign_work_unit(node)

    return HeavyFirst(config, log)


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
