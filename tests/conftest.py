"""Shared fixtures: tiny federations (32x32, a few cases per site) and tiny run configs.

Tests request them as arguments (never ``from conftest import``):

- ``tiny``: a fresh copy of the tiny run-config dict (``TINY``), for YAML config files;
- ``tiny_config``: the factory ``tiny_config(**overrides) -> RunConfig``;
- ``disc_federation``: the factory ``disc_federation(n_sites=3, cases_per_site=12, size=32, seed=0) -> Federation``;
- ``discs``: ``disc_federation()``.

Every test session writes built-in federations to a temporary cache folder of its own (``FEDSEG_CACHE_DIR``, set
for the whole session, subprocesses included): never the user's ``~/.cache``; tests in one session share it.

The two factories are session-scoped (they hold no state), so module-scoped fixtures can use them too.
"""

from __future__ import annotations

import copy
import gc
import os

import numpy as np
import pytest
import torch

from fedseg.config import RunConfig
from fedseg.data.federation import Case, Federation, Regions, Site

torch.set_num_threads(1)

TINY = {
    "seed": 0,
    "threads": 1,
    "data": {"image_size": 32, "scale": 0.05},
    "model": {"channels": [4, 8, 16]},
    "train": {"batch_size": 4},
    "fl": {"rounds": 2},
    "eval": {"hd95": True},
}


def _tiny_config(**overrides) -> RunConfig:
    """A RunConfig small enough for a test: 3-level UNet with 4..16 channels at 32x32, 2 rounds."""
    data = {k: (dict(v) if isinstance(v, dict) else v) for k, v in TINY.items()}
    for key, value in overrides.items():
        if isinstance(value, dict):
            data.setdefault(key, {}).update(value)
        else:
            data[key] = value
    return RunConfig.model_validate(data)


def _disc_federation(n_sites: int = 3, cases_per_site: int = 12, size: int = 32, seed: int = 0) -> Federation:
    """Hand-made 2D RGB federation: a bright disc (label 1) with a brighter cup (label 2) on noise;
    site k shifts the brightness so the sites differ a little."""
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[:size, :size]
    sites = []
    for s in range(n_sites):
        cases = []
        for i in range(cases_per_site):
            cy, cx = rng.integers(size // 4, 3 * size // 4, 2)
            r = size / 5
            d2 = (yy - cy) ** 2 + (xx - cx) ** 2
            label = np.zeros((size, size), np.uint8)
            label[d2 < r * r] = 1
            label[d2 < (r / 2) ** 2] = 2
            image = rng.integers(0, 40, (3, size, size)).astype(np.uint8) + 10 * s
            image[:, label > 0] += 100
            image[:, label == 2] += 60
            cases.append(Case.from_arrays(f"s{s + 1}_{i:03d}", image.astype(np.uint8), label))
        sites.append(Site(f"site{s + 1}", cases))
    return Federation("discs", "2d", 3, Regions.from_mapping({"disc": [1, 2], "cup": [2]}), sites)


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
    return copy.deepcopy(TINY)


@pytest.fixture(scope="session")
def tiny_config():
    """Factory ``tiny_config(**overrides) -> RunConfig``: ``TINY`` with ``overrides`` (dict values merged into
    its sections)."""
    return _tiny_config


@pytest.fixture(scope="session")
def disc_federation():
    """Factory ``disc_federation(n_sites=3, cases_per_site=12, size=32, seed=0) -> Federation``."""
    return _disc_federation


@pytest.fixture
def discs(disc_federation) -> Federation:
    return disc_federation()
