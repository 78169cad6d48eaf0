"""Methods that start from another method's trained global model (option ``start_from``).

FeTS 2022 fine-tunes the best FedAvg model: locally (``finetune``, ``ditto-ft``) or per cluster
(``prior-cfl``). Their options name the model to start from:

* the name of an algorithm run **earlier in the same run** (default ``fedavg``): its global model at
  its selected round (its bundle's ``global``); the cost table of the method then includes that
  algorithm's training (FeTS Table 2 adds the base method's cost to the fine-tuning's);
* or a ``model/<algorithm>/`` folder of an earlier run (``fedseg run`` writes it): its ``global``
  model; the network (``model`` config), input channels and regions must be this run's. Its
  training cost is not known here: the cost table says so (``cost.includes`` lists only this method).

Everything is checked before any training (:func:`check_start_from`).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from fedseg.algorithms import get_algorithm
from fedseg.evaluate.cost import cost_table

if TYPE_CHECKING:
    from fedseg.config import CostConfig, RunConfig
    from fedseg.engine.context import Task
    from fedseg.run.result import AlgorithmResult, Row

Weights = dict[str, torch.Tensor]


def start_name(options: object) -> str | None:
    """The ``start_from`` value of a method's options (None: the method starts from the initial model)."""
    return getattr(options, "start_from", None)


def check_start_from(
    cfg: RunConfig, algorithms_options: dict[str, object], task: Task, channel_names: list[str] | None = None
) -> None:
    """Raise a ValueError naming ``methods.<name>.start_from`` if it names an algorithm that is not run
    before it in ``cfg.algorithms``, or a folder that is not a compatible trained bundle with a global model
    (``channel_names``: this run's federation's, checked against the bundle's where both are known)."""
    order = list(cfg.algorithms)
    for name, options in algorithms_options.items():
        start = start_name(options)
        if start is None:
            continue
        where = f"methods.{name}.start_from={start!r}"
        if start in order[: order.index(name)]:
            if getattr(get_algorithm(start).server, "SELECTS_PER_SITE", False):  # its bundle: one model per site
                raise ValueError(
                    f"{where}: {start} has no global model (its sites keep their own); start from a global method"
                )
            continue
        if start in order or not is_folder(start):
            raise ValueError(not_run_before(where, name, start, order))
        folder_weights(Path(start), task, where, channel_names)


def is_folder(start: str) -> bool:
    """Whether a ``start_from`` value names a folder (a path) rather than an algorithm."""
    return "/" in start or Path(start).exists()


def not_run_before(where: str, name: str, start: str, order: list[str]) -> str:
    return (
        f"{where}: {name} starts from the global model of {start!r}, which must run before it in the "
        f"same run (algorithms: {', '.join(order)}); list it first, or give a RUN/model/<algorithm> folder"
    )


def folder_weights(folder: Path, task: Task, where: str, channel_names: list[str] | None = None) -> Weights:
    """The ``global`` model of a ``model/<algorithm>/`` folder, checked against this run's network and, where the
    bundle and this run's federation both name their channels (``channel_names``), their order (``channel_order``:
    the same names reordered are refused): a model that read T1 from channel 0 fine-tuned on data holding FLAIR
    there would train on swapped inputs without a word."""
    from fedseg.data.federation import channel_order
    from fedseg.run.bundles import BundleError, load_bundle

    try:
        bundle = load_bundle(folder)
    except BundleError as e:
        raise ValueError(f"{where}: {e}") from None
    if "global" not in bundle.models:
        raise ValueError(f"{where}: {folder} holds no global model (models: {', '.join(bundle.models)})")
    m = bundle.manifest
    mine = {"network": task.cfg.model.model_dump(mode="json"), "in_channels": task.in_channels}
    theirs = {"network": m.get("network"), "in_channels": m.get("in_channels")}
    if (
        mine != theirs
        or tuple(m.get("regions", {})) != tuple(task.regions)
        or m.get("spatial_dims") != task.spatial_dims
    ):
        raise ValueError(
            f"{where}: {folder} was trained with another network or task ({theirs}, regions "
            f"{list(m.get('regions', {}))}, {m.get('spatial_dims')}D); this run: {mine}, regions {list(task.regions)}, "
            f"{task.spatial_dims}D"
        )
    read_as = bundle.channel_names
    if channel_names is not None and read_as is not None and channel_order(read_as, channel_names) == "reordered":
        raise ValueError(
            f"{where}: {folder} reads the channels as {', '.join(read_as)}; this run's federation holds "
            f"{', '.join(channel_names)} (federation.yaml channel_names): the same images in another channel order"
        )
    return bundle.models["global"]


def start_weights(options: object, earlier: dict[str, AlgorithmResult], task: Task) -> Weights | None:
    """The weights a method starts from: ``earlier[name].bundle["global"]`` (an ``AlgorithmResult`` of
    this run) or a folder's global model; None without ``start_from``."""
    start = start_name(options)
    if start is None:
        return None
    if start in earlier:
        bundle = earlier[start].bundle
        if "global" not in bundle:
            raise ValueError(f"start_from={start!r}: {start} has no global model (models: {', '.join(bundle)})")
        return bundle["global"]
    if not is_folder(start):
        raise ValueError(not_run_before(f"start_from={start!r}", "this method", start, list(earlier)))
    return folder_weights(Path(start), task, f"start_from={start!r}")


def combined_cost(
    options: object,
    earlier: dict[str, AlgorithmResult],
    ledger_rows: list[Row],
    cost_cfg: CostConfig,
    val_cases: dict[str, int],
) -> dict[str, Any]:
    """FeTS Table 2 cost of a method, including the training of the algorithm it started from when that
    ran in this run (its ledger first, then this method's rounds after its last round)."""
    start = start_name(options)
    base = earlier.get(start) if start else None
    if base is None:
        cost = cost_table(ledger_rows, cost_cfg, val_cases)
        if start:
            cost["includes"] = ["this method only: the cost of the model it started from is unknown"]
        return cost
    offset = max((int(r["round"]) for r in base.ledger), default=0)
    shifted = [{**r, "round": int(r["round"]) + offset} for r in ledger_rows]
    cost = cost_table([*base.ledger, *shifted], cost_cfg, val_cases)
    cost["includes"] = [base.name, "this method"]
    return cost
