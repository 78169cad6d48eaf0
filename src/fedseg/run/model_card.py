"""A trained bundle's model card: what a site's clinical engineer or an auditor needs to know about a model file
that has left its run folder (``manifest.json`` ``trained``), and the record ``fedseg predict`` writes next to its
masks (``predict.json``): which model, with which digest, made them.

The card is made once, when the algorithm finishes (kept in its finished checkpoint, so a resume or the run's
final write puts the same card back): the method, the federation and its sites with their training cases, the
round selected on validation and its mean validation Dice (per site, where each site selects its own; FedSM-extra's
phase-1 round too) and whether the run may not have converged, the test Dice per site (a synthetic federation's, or
the hospitals' own test splits), the seed, the config's digest, and the software that trained it (fedseg, torch,
MONAI, the git commit; a method installed as a package: its name and version, ``plugin``).
``predictions.csv``'s ``round`` column reads the round of each row's model from it (``model_round``)."""

from __future__ import annotations

import hashlib
import math
from pathlib import Path
from typing import Any

from fedseg.config import RunConfig
from fedseg.config_load import dump_config
from fedseg.data.federation import Federation
from fedseg.data.reorient import federation_orientation
from fedseg.run.outputs import BUNDLE_WEIGHTS
from fedseg.run.provenance import git_state, package_version, utc_now
from fedseg.run.stopping import recorded_not_converged

RECORD_NAME = "predict.json"  # what fedseg predict writes next to its masks


def model_card(name: str, fed: Federation, cfg: RunConfig, summary: dict[str, Any]) -> dict[str, Any]:
    """The card of algorithm ``name``'s trained bundle (module docstring) from its ``summary.json`` entry."""
    from fedseg.algorithms import plugin_records

    commit, dirty = git_state()
    plugin = plugin_records([name]).get(name)
    convergence = summary.get("convergence") or {}
    return {
        "algorithm": name,
        "method": summary.get("display_name", name),
        "federation": fed.name,
        "sites": list(fed.site_names),
        "train_cases": dict(summary.get("train_samples") or {}),
        # the voxel orientation its training volumes lay in (None: not one), which manifest.json's ``orientation``
        # keeps when a later write (a resume) finds the data otherwise (``fedseg.run.outputs.write_bundle_files``)
        "orientation": federation_orientation(fed),
        "rounds_trained": summary.get("rounds"),
        "selected_round": summary.get("best_round"),  # on validation
        "selected_val_dice": finite_or_none(convergence.get("best_val_dice")),  # its mean validation Dice over sites
        **({"selected_rounds": summary["selected_rounds"]} if summary.get("selected_rounds") else {}),  # per site
        # FedSM-extra/-ensemble: the phase-1 round whose networks the selector routes among (selected on validation)
        **({"phase1_best_round": summary["phase1_best_round"]} if summary.get("phase1_best_round") else {}),
        "may_not_have_converged": recorded_not_converged(summary),  # the rule of every page
        "never_improved": convergence.get("improved") is False,  # validation flat from its first round: trained?
        "test_dice": dict(summary.get("dice") or {}),  # per site, client_avg, global (the selected round's models)
        "seed": cfg.seed,
        "config_sha256": hashlib.sha256(dump_config(cfg).encode()).hexdigest(),  # the config it trained with, as YAML
        "fedseg": package_version("fedseg"),
        "torch": package_version("torch"),
        "monai": package_version("monai"),
        **({"plugin": plugin} if plugin else {}),  # the installed method package that trained it, name and version
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


def finite_or_none(value: object) -> float | None:
    """``value`` as a float where it is a finite number; None otherwise (a card is strict JSON: no NaN)."""
    return float(value) if isinstance(value, int | float) and math.isfinite(value) else None


def card_round(card: object, key: str = "selected_round") -> int | None:
    """The round ``card[key]`` (a bundle's model card, ``manifest.json`` ``trained``) records; None where the card
    records none (no card: a bundle written before cards; a hand-edited one)."""
    value = card.get(key) if isinstance(card, dict) else None
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def model_round(card: object, model: str) -> int | None:
    """The round at which the bundle's model ``model`` (a single-model bundle's, as ``predictions.csv`` names it) was
    selected on validation, from its ``card``: a site's own model (``local:<site>``) at its site's round
    (``selected_rounds``), the bundle's other model (``global``) at the card's ``selected_round``. None where the card
    does not say: no card, or a site's model of a method that does not select per site (the kept local models of
    ``eval.local_models``: each its site's best over all rounds). A routed bundle's rows: the card's entry its routing
    names (``round_key``, ``fedseg.algorithms.registry.RoutedModel``)."""
    if ":" not in model:
        return card_round(card)
    rounds = card.get("selected_rounds") if isinstance(card, dict) else None
    return card_round(rounds, model.split(":", 1)[1])


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
    val = card.get("selected_val_dice")
    chosen = f" (validation Dice {val:.3f})" if not own and isinstance(val, int | float) and math.isfinite(val) else ""
    late = "; it may not have converged" if card.get("may_not_have_converged") else ""
    late = "; its validation never improved on its first round (did it train?)" if card.get("never_improved") else late
    return (
        f"model: {card.get('method')}{whose} trained on {card.get('federation')} ({len(card.get('sites') or [])} "
        f"sites), round {rounds[site] if own else card.get('selected_round')} of {card.get('rounds_trained')}{chosen}"
        f"{score}, "
        f"fedseg {card.get('fedseg')}, "
        f"{_plugin_text(card.get('plugin'))}"
        f"finished {card.get('finished')}{late}"
    )


def _plugin_text(plugin: object) -> str:
    """``plugin NAME VERSION, `` for a card whose method came from an installed package; "" otherwise."""
    if not isinstance(plugin, dict):
        return ""
    return f"plugin {plugin.get('distribution')} {plugin.get('version')}, "
