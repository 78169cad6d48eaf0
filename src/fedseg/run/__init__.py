"""The run wing: validate data, train every algorithm round by round, select on validation, test once, write
the run outputs; resumable from per-algorithm checkpoints.

``run_experiment`` (``experiment``) runs a whole experiment, ``run_algorithm`` (``loop``) one algorithm's round
loop; ``preparation`` loads and checks the data, ``checks`` the options, ``engines`` builds the engines,
``steps``, ``resume``, ``selection`` and ``finish`` are the loop's named steps, ``summary`` the ``summary.json``
entry. ``outputs``, ``provenance``, ``preflight``, ``runlog``, ``progress``, ``start_from`` and ``stopping`` serve
the run only.

The public names below are imported from their modules when first used, so that a command that needs only a
light module of the wing (e.g. ``fedseg --version``: ``provenance``) does not load torch and the engines.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from fedseg.run.checks import LOCAL_MODELS_WARN_SITES, check_sampling, cost_warnings, method_notes, option_warnings
    from fedseg.run.engines import EngineFactory, local_engines, simulator_engine
    from fedseg.run.experiment import announce, run_experiment
    from fedseg.run.loop import run_algorithm
    from fedseg.run.preparation import (
        PLAN_FILE,
        Prepared,
        count_sites,
        federation_splits,
        folder_root,
        load_federation,
        prepare,
        prepare_planned,
        prepared_sites,
    )
    from fedseg.run.result import AlgorithmResult
    from fedseg.run.resume import finished_bundle, is_finished, validated_from_rows
    from fedseg.run.selection import nan_low, selectable_scores
    from fedseg.run.state import RoundCallback, ValidatedCallback
    from fedseg.run.summary import cross_site_summary, finite_mean, site_means, summarize

_HOMES = {  # public name -> the module of the wing that defines it
    "PLAN_FILE": "preparation",
    "Prepared": "preparation",
    "count_sites": "preparation",
    "federation_splits": "preparation",
    "folder_root": "preparation",
    "load_federation": "preparation",
    "prepare": "preparation",
    "prepare_planned": "preparation",
    "prepared_sites": "preparation",
    "LOCAL_MODELS_WARN_SITES": "checks",
    "check_sampling": "checks",
    "cost_warnings": "checks",
    "method_notes": "checks",
    "option_warnings": "checks",
    "EngineFactory": "engines",
    "local_engines": "engines",
    "simulator_engine": "engines",
    "AlgorithmResult": "result",
    "RoundCallback": "state",
    "ValidatedCallback": "state",
    "run_algorithm": "loop",
    "finished_bundle": "resume",
    "is_finished": "resume",
    "validated_from_rows": "resume",
    "nan_low": "selection",
    "selectable_scores": "selection",
    "cross_site_summary": "summary",
    "finite_mean": "summary",
    "site_means": "summary",
    "summarize": "summary",
    "announce": "experiment",
    "run_experiment": "experiment",
}
__all__ = [
    "AlgorithmResult",
    "EngineFactory",
    "LOCAL_MODELS_WARN_SITES",
    "PLAN_FILE",
    "Prepared",
    "RoundCallback",
    "ValidatedCallback",
    "announce",
    "check_sampling",
    "cost_warnings",
    "count_sites",
    "cross_site_summary",
    "federation_splits",
    "finished_bundle",
    "finite_mean",
    "folder_root",
    "is_finished",
    "load_federation",
    "local_engines",
    "method_notes",
    "nan_low",
    "option_warnings",
    "prepare",
    "prepare_planned",
    "prepared_sites",
    "run_algorithm",
    "run_experiment",
    "selectable_scores",
    "simulator_engine",
    "site_means",
    "summarize",
    "validated_from_rows",
]


def __getattr__(name: str) -> object:
    """A public name of the wing, imported from its module on first use."""
    if (home := _HOMES.get(name)) is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{home}"), name)
    globals()[name] = value
    return value
