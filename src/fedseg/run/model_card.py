"""A trained bundle's model card: what a site's clinical engineer or an auditor needs to know about a model file
that has left its run folder (``manifest.json`` ``trained``), and the record ``fedseg predict`` writes next to its
masks (``predict.json``): which model, with which digest, made them.

The card is made once, when the algorithm finishes (kept in its finished checkpoint, so a resume or the run's
final write puts the same card back): the method, the federation and its sites with their training cases, the
round selected on validation and whether the run may not have converged, the test Dice per site (a synthetic
federation's, or the hospitals' own test splits), the seed, the config's digest, and the software that trained
it (fedseg, torch, MONAI, the git commit)."""

from __future__ import annotations

import hashlib
import math
from pathlib import Path
from typing import Any

from fedseg.config import RunConfig
from fedseg.config_load import dump_config
from fedseg.data.federation import Federation
from fedseg.run.outputs import BUNDLE_WEIGHTS
from fedseg.run.provenance import git_state, package_version, utc_now

RECORD_NAME = "predict.json"  # what fedseg predict writes next to its masks


def model_card(name: str, fed: Federation, cfg: RunConfig, summary: dict[str, Any]) -> dict[str, Any]:
    """The card of algorithm ``name``'s trained bundle (module docstring) from its ``summary.json`` entry."""
    commit, dirty = git_state()
    convergence = summary.get("convergence") or {}
    return {
        "algorithm": name,
        "method": summary.get("display_name", name),
        "federation": fed.name,
        "sites": list(fed.site_names),
        "train_cases": dict(summary.get("train_samples") or {}),
        "rounds_trained": summary.get("rounds"),
        "selected_round": summary.get("best_round"),  # on validation
        **({"selected_rounds": summary["selected_rounds"]} if summary.get("selected_rounds") else {}),  # per site
        "may_not_have_converged": convergence.get("converged") is False,
        "never_improved": convergence.get("improved") is False,  # validation flat from its first round: trained?
        "test_dice": dict(summary.get("dice") or {}),  # per site, client_avg, global (the selected round's models)
        "seed": cfg.seed,
        "config_sha256": hashlib.sha256(dump_config(cfg).encode()).hexdigest(),  # the config it trained with, as YAML
        "fedseg": package_version("fedseg"),
        "torch": package_version("torch"),
        "monai": package_version("monai"),
        "commit": commit,
        "dirty": dirty,
        "finished": utc_now(),
    }


def prediction_record(folder: Path, manifest: dict[str, Any], options: dict[str, Any], inputs: int) -> dict[str, Any]:
    """``predict.json``: the bundle ``folder`` (its weights' SHA-256 and model card, ``null`` for a bundle written
    before cards), the prediction's ``options`` (threshold, FedSM's gamma, the site's model), how many ``inputs``,
    the software that predicted and when: which model made these masks, for an audit long after."""
    digest = hashlib.sha256()
    with open(folder / BUNDLE_WEIGHTS, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return {
        "model": str(folder.resolve()),
        "weights_sha256": digest.hexdigest(),
        "trained": manifest.get("trained"),
        **options,
        "inputs": inputs,
        "fedseg": package_version("fedseg"),
        "torch": package_version("torch"),
        "monai": package_version("monai"),
        "predicted": utc_now(),
    }


def card_line(card: dict[str, Any] | None, site: str | None = None) -> str | None:
    """One line saying what a bundle is (``fedseg predict`` prints it): method, federation, round, test Dice. With
    ``site`` (``--site``: one site's model of a per-site bundle) the round that site's model was selected at and its
    test Dice on the site's own test cases, where the card records them (``selected_rounds``)."""
    if not card:
        return None
    rounds = card.get("selected_rounds") or {}
    own = site is not None and site in rounds
    dice = (card.get("test_dice") or {}).get(site if own else "client_avg")
    which = f"on {site}'s test cases" if own else "(client avg)"
    whose = f" ({site}'s model)" if own else ""
    score = f", test Dice {dice:.3f} {which}" if isinstance(dice, int | float) and math.isfinite(dice) else ""
    late = "; it may not have converged" if card.get("may_not_have_converged") else ""
    late = "; its validation never improved on its first round (did it train?)" if card.get("never_improved") else late
    return (
        f"model: {card.get('method')}{whose} trained on {card.get('federation')} ({len(card.get('sites') or [])} "
        f"sites), round {rounds[site] if own else card.get('selected_round')} of {card.get('rounds_trained')}{score}, "
        f"fedseg {card.get('fedseg')}, "
        f"finished {card.get('finished')}{late}"
    )
