"""FedSM on a site it never saw (paper Sec. 4.2, Table 5): the family's ``unseen_cells`` hook.

``fedseg.studies`` trains on the federation without one site and scores each bundle on **all**
of that site's cases. For a FedSM-family bundle every candidate (global model GM = 0,
personalized model PM_k of training site k) is scored on every case (``score_caseset``), the
selector's softmax routes each image (Algorithm 2, :func:`~fedseg.algorithms.fedsm.model.route`)
and the image gets its chosen candidate's Dice:

* ``threshold`` (``fedsm``): the cells at ``gamma = 0`` (the paper's setting: always the
  selector's argmax site), the best gamma of the grid on the unseen site itself (``best_*``: an
  oracle, as in the paper) and the gamma chosen on the training sites' validation splits
  (``val_*``, stored in the bundle: what a deployment would use), plus the whole curve;
* ``argmax`` (``fedsm-extra``): the argmax candidate, no gamma;
* ``ensemble`` (``fedsm-ensemble``): the weighted ensemble's own Dice; the frequencies are those
  of the most weighted candidate.

Frequencies are returned as ``{"global": f, <training site>: f, ...}``; the study lays them out
in its columns. ``case_dice`` (``(N, R)`` as lists) is each case's Dice at the row's routing;
``deployed_case_dice`` the same at the validation-chosen gamma (``fedseg bench`` pairs cases on it).
"""

from __future__ import annotations

import numpy as np
import torch

from fedseg.algorithms.fedsm.model import GLOBAL_INDEX, SELECTOR_SPEC, candidate_names, route, super_model_from_bundle
from fedseg.algorithms.fedsm.options import FedSMOptions
from fedseg.data.dataset import CaseSet
from fedseg.engine.context import MethodOptions, Task
from fedseg.evaluate.inference import candidate_dice, score_caseset
from fedseg.evaluate.tables import nan_low, site_dice


def unseen_cells(bundle: dict, data: CaseSet, task: Task, options: MethodOptions) -> dict | None:
    """The Table 5 cells of a FedSM-family ``bundle`` on the unseen site's ``data`` (module doc);
    None for a bundle without a selector."""
    if SELECTOR_SPEC not in bundle:
        return None
    cfg = task.cfg
    sm = super_model_from_bundle(bundle, task.new_model, task.in_channels, task.spatial_dims).to(task.device).eval()
    sites = [name.split(":", 1)[1] for name in candidate_names(bundle)[1:]]
    probs = sm.scores_of(data.x, cfg.eval.batch_size, task.device)

    def point(choice: torch.Tensor, dice: np.ndarray) -> dict:
        """Dice and selection frequencies of one routing ``choice`` ``(N,)`` with per-case Dice ``(N, R)``."""
        freq = np.bincount(choice.numpy(), minlength=len(sites) + 1) / max(len(choice), 1)
        return {
            "dice": site_dice(dice, data.ids, data.name, task.regions),
            "case_dice": dice.tolist(),
            "freq": {"global": float(freq[GLOBAL_INDEX]), **{s: float(freq[k + 1]) for k, s in enumerate(sites)}},
        }

    if sm.mode == "ensemble":
        ev = cfg.eval
        dice = score_caseset(sm, data, ev.batch_size, ev.threshold, False, task.device, regions=task.scored_regions)[
            "dice"
        ]
        return {"mode": sm.mode, **point(route(probs, sm.mode), dice)}
    per_model = candidate_dice(list(sm.candidates), data, cfg.eval, task.device, task.scored_regions)  # (K+1, N, R)

    def at(gamma: float = 0.0) -> dict:  # (argmax mode has no threshold: gamma is ignored)
        choice = route(probs, sm.mode, gamma)
        return point(choice, per_model[choice.numpy(), np.arange(len(data))])

    if sm.mode != "threshold":
        return {"mode": sm.mode, **at()}
    grid = options.gamma_grid if isinstance(options, FedSMOptions) else ()
    curve = [{"gamma": g, **at(g)} for g in sorted({0.0, *map(float, grid)})]
    best = max(reversed(curve), key=lambda p: nan_low(p["dice"]))  # ties: larger gamma
    deployed = at(sm.gamma)  # the gamma chosen on the training sites' validation splits: what a deployment uses
    return {
        "mode": sm.mode,
        "gamma": 0.0,
        **curve[0],
        "best_gamma": best["gamma"],
        "best_dice": best["dice"],
        "val_gamma": sm.gamma,
        "val_dice": deployed["dice"],
        "deployed_case_dice": deployed["case_dice"],
        "curve": [{k: v for k, v in p.items() if k != "case_dice"} for p in curve],
    }
