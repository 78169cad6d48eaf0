"""The model selector's view of the test images, saved for the report (FedSM paper Fig. 3).

The report renders from the run's files only, on a machine that may not hold the data, so a
FedSM-family run writes, right after testing, ``selector_features/<algorithm>.npz`` with one
row per test image of every site (sites in federation order, cases in split order):

* ``features`` ``(N, D)`` float32: the selector's penultimate activations (``Selector.embed``);
* ``probs`` ``(N, C)`` float32: the selector's softmax (C = K for ``fedsm``, K+1 with the global
  model as class 0 for ``fedsm-extra`` / ``fedsm-ensemble``);
* ``chosen`` ``(N,)`` int64: the candidate Algorithm 2 routes the image to at the bundle's gamma
  (0 = global model, k = personalized model of the k-th site);
* ``gamma`` (0-d float64): the threshold of Algorithm 2 (NaN for the variants without one);
* ``mode`` (0-d string): the super model's mode (``threshold``, ``argmax``, ``ensemble``: there ``chosen`` is the
  heaviest candidate of the mixture, for the map; the prediction mixes them all);
* ``site`` ``(N,)`` int64: index of the image's site in ``sites``; ``sites`` ``(K,)`` and
  ``case`` ``(N,)``: site names and case ids (strings).

The site an image came from is stored for colouring the map only; the selector never sees it.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch

from fedseg.algorithms.fedsm.model import SELECTOR_SPEC, route, super_model_from_bundle
from fedseg.atomic_files import atomic_write_bytes
from fedseg.data.dataset import SiteData
from fedseg.engine.context import Task

FEATURES_DIR = "selector_features"


@torch.no_grad()
def selector_features(
    bundle: dict[str, dict[str, torch.Tensor]], site_data: Sequence[SiteData], task: Task
) -> dict | None:
    """The arrays described in the module docstring for every site's test split, or None when
    ``bundle`` holds no selector (any algorithm outside the FedSM family)."""
    if SELECTOR_SPEC not in bundle or "selector" not in bundle:
        return None
    sm = super_model_from_bundle(bundle, task.new_model, task.in_channels, task.spatial_dims).to(task.device).eval()
    batch = task.cfg.eval.batch_size
    features, probs, site, cases = [], [], [], []
    for i, sd in enumerate(site_data):
        for xb in sd.test.x.split(batch):
            embedded = sm.selector.embed(xb.to(task.device))  # one pass: the softmax is the head's last layer on it
            features.append(embedded.cpu())
            probs.append(torch.softmax(sm.selector.head[-1](embedded), dim=1).cpu())  # = sm.scores(xb)
        site += [i] * len(sd.test)
        cases += list(sd.test.ids)
    if not features:
        return None
    p = torch.cat(probs)
    return {
        "features": torch.cat(features).numpy().astype(np.float32),
        "probs": p.numpy().astype(np.float32),
        "chosen": route(p, sm.mode, sm.gamma).numpy().astype(np.int64),
        "gamma": np.float64(sm.gamma),
        "mode": np.array(sm.mode),
        "site": np.array(site, dtype=np.int64),
        "sites": np.array([sd.name for sd in site_data]),
        "case": np.array(cases),
    }


def write_selector_features(out: Path, algorithm: str, bundle: dict, site_data: Sequence[SiteData], task: Task) -> None:
    """Write ``out/selector_features/<algorithm>.npz`` (atomically) if the bundle has a selector."""
    arrays = selector_features(bundle, site_data, task)
    if arrays is None:
        return
    path = Path(out) / FEATURES_DIR / f"{algorithm}.npz"
    atomic_write_bytes(path, lambda f: np.savez_compressed(f, **arrays))
