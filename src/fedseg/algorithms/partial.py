"""Partial model sharing (FeTS 2022 Sec. 3.3.5): FedPer keeps the last layers private, LG-FedAvg the first.

The network's state w is split into federated entries w_g and private entries w_l (w = w_g U w_l).
Which entries are private is the method's rule, its options model's ``private_names`` (a
``PartialOptions``); everything else below is shared by every partial-sharing method (FedBN,
``fedseg.algorithms.fedbn``, keeps the normalization layers private with this same machinery).

FedPer and LG-FedAvg (``SharingOptions``): ``private_layers`` P units (paper: 4) are private, the last
P for FedPer (Arivazhagan et al.), the first P for LG-FedAvg (Liang et al.). ``private_unit`` says what a
unit is:

* ``layers`` (the default, FeTS's reading): a *parameterized layer*, a module that owns parameters
  directly (a convolution, a normalization with affine weights), in the network's module order
  (``parameterized_layers``); the layer's own parameters and buffers are private. On the ``fets``
  preset's DynUNet (23 such layers, instance norm without weights) 4 layers are 0.44% of the
  parameters for FedPer, 0.87% for LG-FedAvg, in line with FeTS's Table 2 traffic (under 1% kept);
* ``blocks`` (fedseg before issue 27): a network block (``fedseg.models.blocks``: a module path of
  the MONAI UNet / DynUNet, 2D or 3D, e.g. a whole encoder level); 4 blocks of that DynUNet are
  9.2% (FedPer) and 15.6% (LG-FedAvg) of its parameters. Kept so old configurations reproduce old
  numbers; a configuration recorded before the option existed resumes as ``blocks``
  (``fedseg.config_load.with_recorded_defaults``).

The run records the share it keeps (``private_fraction``: private parameters / all parameters) in
``summary.json`` and in its log. What differs from FedAvg:

* only w_g travels, down and up (the ledger counts it: FedAvg's traffic times |w_g| / |w|), and
  only w_g is averaged (sample-weighted, ``weighting`` as FedAvg);
* each site keeps its w_l in its state store from one round to the next (``private/``); in the
  first round it is the common initialization, like every site's starting model;
* site k's model is w_g (received) with its own w_l: it is validated and tested as a per-site
  model (``fedseg.algorithms.persite``: each site at its own best validation round).

Normalization layers: with ``blocks`` they belong to their block (a BatchNorm's affine weights and
running statistics are private in a private block, averaged in a federated one); with ``layers`` an
affine norm is a layer of its own, and a norm without weights (buffers only, or nothing) is no layer:
its running statistics, if any, are averaged. With the default instance normalization (no affine
weights, no running statistics) there is nothing to decide.
"""

from __future__ import annotations

from typing import Any, Literal

import torch
from pydantic import Field
from torch import nn

from fedseg.algorithms.client_state import put_group, state_group
from fedseg.algorithms.fedavg import FedAvgOptions, train_meta
from fedseg.algorithms.persite import PerSiteClient, PerSiteServer
from fedseg.algorithms.prefixes import MODEL
from fedseg.algorithms.registry import AlgorithmSpec
from fedseg.engine.context import ClientContext, Task, options_as
from fedseg.engine.messages import Message, load_weights, prefixed, weights_of
from fedseg.models.blocks import entries_by_block
from fedseg.models.state import float_state

PRIVATE = "private"  # client-state prefix of the site's private entries w_l


class PartialOptions(FedAvgOptions):
    """Options of a partial-sharing method: FedAvg's ``weighting``, ``local_steps`` and ``aggregator`` (over the
    federated entries w_g) and the method's rule for which entries stay on the site (``private_names``), which
    ``PartialSharingServer`` / ``PartialSharingClient`` apply. A subclass says what its rule is; the checks
    before any work, the run log's line and summary.json's record follow from it."""

    def private_names(self, model: nn.Module, task: Task) -> frozenset[str]:
        """Names of ``model``'s (``task.new_model()``) floating-point state entries that stay on each site; a
        ValueError, whose text follows ``methods.<name>`` (``problem_line``), when the rule does not fit it."""
        raise NotImplementedError(f"{type(self).__name__} does not say which entries stay private")

    def private_what(self, model: nn.Module) -> str:
        """What stays private, as the run log's line says it (e.g. ``the last 4 layers (private_unit layers)``)."""
        raise NotImplementedError(f"{type(self).__name__} does not say what stays private")

    def private_record(self, model: nn.Module) -> dict[str, Any]:
        """The rule's own entries of summary.json's ``private_sharing`` (after the counts). Default: none."""
        return {}

    def problem_line(self, algorithm: str, problem: str) -> str:
        """``check_task``'s one line for a ``private_names`` problem: ``methods.<algorithm>: <problem>``."""
        return f"methods.{algorithm}: {problem}"

    def check_task(self, task: Task, algorithm: str) -> None:
        """The rule must fit the run's network (checked before any work)."""
        try:
            private_entries(task, self)
        except ValueError as e:
            raise ValueError(self.problem_line(algorithm, str(e))) from None

    def run_note(self, task: Task, algorithm: str) -> str:
        """The run log's line on the private share, e.g. ``fedper: the last 4 layers (private_unit layers) stay
        private, 0.44% of the dynunet's parameters (...)``."""
        info = private_fraction(task, self)
        return (
            f"{algorithm}: {self.private_what(task.new_model())} stay private, "
            f"{info['private_fraction']:.2%} of the {task.cfg.model.name}'s parameters "
            f"({info['private_parameters']:,} of {info['parameters']:,}); the rest is averaged"
        )


class SharingOptions(PartialOptions):
    """FedPer / LG-FedAvg: ``private_layers``: how many units stay on the site, ``private_unit``: parameterized
    layers (FeTS's reading) or network blocks (``fedseg.models.blocks``), ``private``: at which end."""

    private_layers: int = Field(4, ge=1, description="P units (private_unit) kept private (FeTS 2022: 4 layers)")
    private_unit: Literal["layers", "blocks"] = Field(
        "layers",
        description="what private_layers counts: layers = parameterized layers (a conv or norm module owning "
        "weights, in module order), FeTS 2022's reading (4 layers: under 1% of the fets DynUNet kept private); "
        "blocks = network blocks (a whole encoder/decoder level; fedseg before issue 27, 9-16% kept private)",
    )

    private: Literal["last", "first"] = Field("last", description="which end of the network stays private")

    def private_names(self, model: nn.Module, task: Task) -> frozenset[str]:
        """The entries of the P private units (first or last, ``private``; layers or blocks, ``private_unit``);
        at least one unit must stay federated."""
        unit = "layer" if self.private_unit == "layers" else "block"
        grouped = entries_by_layer(model) if unit == "layer" else entries_by_block(model)
        units = list(grouped)
        p = self.private_layers
        if p >= len(units):
            listed = f"{', '.join(units[:3])}, ..., {units[-1]}" if len(units) > 8 else ", ".join(units)
            raise ValueError(
                f"private_layers={p} leaves no federated {unit}: the {task.cfg.model.name} has {len(units)} "
                f"{self.private_unit} ({listed})"
            )
        chosen = units[-p:] if self.private == "last" else units[:p]
        return frozenset(name for u in chosen for name in grouped[u])

    def private_what(self, model: nn.Module) -> str:
        k = self.private_layers
        units = self.private_unit if k > 1 else self.private_unit[:-1]
        return f"the {self.private} {k} {units} (private_unit {self.private_unit})"

    def private_record(self, model: nn.Module) -> dict[str, Any]:
        return {"private_unit": self.private_unit, "private_layers": self.private_layers}

    def problem_line(self, algorithm: str, problem: str) -> str:
        """``methods.fedper.private_layers=5 leaves ...``: the problem names the option at fault."""
        return f"methods.{algorithm}.{problem}"


class FedPerOptions(SharingOptions):
    private: Literal["last"] = Field("last", description="FedPer keeps the last P units private (fixed)")


class LGFedAvgOptions(SharingOptions):
    private: Literal["first"] = Field("first", description="LG-FedAvg keeps the first P units private (fixed)")


def parameterized_layers(model: nn.Module) -> list[str]:
    """Module paths of ``model``'s parameterized layers (modules owning parameters directly), in module order."""
    return [name for name, m in model.named_modules() if any(True for _ in m.parameters(recurse=False))]


def entries_by_layer(model: nn.Module) -> dict[str, list[str]]:
    """``{layer: [state entry names]}``: each parameterized layer's own floating-point entries (its
    parameters and buffers, not its children's), layers in module order."""
    layers = parameterized_layers(model)
    grouped: dict[str, list[str]] = {name: [] for name in layers}
    for entry in float_state(model):
        owner = entry.rpartition(".")[0]
        if owner in grouped:
            grouped[owner].append(entry)
    return grouped


def private_entries(task: Task, options: PartialOptions) -> frozenset[str]:
    """Names of the state entries of ``task``'s network that stay on each site (the method's rule,
    ``options.private_names``; e.g. FedPer's P last units)."""
    return options.private_names(task.new_model(), task)


def private_fraction(task: Task, options: PartialOptions) -> dict:
    """``{private_fraction, private_parameters, parameters, **options.private_record(...)}``: the share of the
    network's parameters kept private (buffers not counted), then the rule's own record (FedPer: ``private_unit``,
    ``private_layers``)."""
    model = task.new_model()
    private = options.private_names(model, task)
    params = dict(model.named_parameters())
    total = sum(p.numel() for p in params.values())
    kept = sum(p.numel() for name, p in params.items() if name in private)
    return {
        "private_fraction": kept / total,
        "private_parameters": kept,
        "parameters": total,
        **options.private_record(model),
    }


def split_weights(weights: dict[str, torch.Tensor], private: frozenset[str]) -> tuple[dict, dict]:
    """``(w_g, w_l)``: the federated and the private entries of ``weights``."""
    federated = {k: v for k, v in weights.items() if k not in private}
    return federated, {k: v for k, v in weights.items() if k in private}


class PartialSharingClient(PerSiteClient):
    """Trains w_g (received) with its own w_l; replies w_g only, keeps w_l."""

    def own_model(self, msg: Message, ctx: ClientContext) -> nn.Module:
        model = ctx.task.new_model()  # w_l = the common initialization until the site has trained
        load_weights(model, {**weights_of(model), **state_group(ctx.state, PRIVATE), **msg.group(MODEL)})
        return model

    def start_model(self, msg: Message, ctx: ClientContext) -> nn.Module:
        return self.own_model(msg, ctx)

    def after_fit(self, model, stats, msg, ctx) -> Message:
        federated, private = split_weights(
            weights_of(model), private_entries(ctx.task, options_as(ctx.options, PartialOptions))
        )
        put_group(ctx.state, PRIVATE, private)
        return Message(prefixed(MODEL, federated), train_meta(stats, ctx))


class PartialSharingServer(PerSiteServer):
    """FedAvg over the federated entries w_g only; the federated buffers (BatchNorm statistics outside the private
    units) are FedAvg's average of the replies' whatever the ``aggregator`` (``FedAvgServer.average_buffers``)."""

    options: PartialOptions  # this method's options (``FedAvgServer.options``)

    def __init__(self, engine, task, options):
        super().__init__(engine, task, options)
        self.global_weights, _ = split_weights(self.global_weights, private_entries(task, options))
        self.buffers = [b for b in self.buffers if b in self.global_weights]  # private ones never come back

    def summary_fields(self) -> dict:
        """summary.json's ``private_fraction`` (private parameters / all) and ``private_sharing`` (the counts)."""
        info = private_fraction(self.task, self.options)
        return {"private_fraction": info["private_fraction"], "private_sharing": info}


SPECS = (
    AlgorithmSpec(
        "fedper",
        "FedPer",
        PartialSharingServer,
        PartialSharingClient,
        "FedPer (Arivazhagan et al.): the last private_layers layers (private_unit) stay on each site",
        FedPerOptions,
        kind="personalized",
        on_secure_aggregation=None,
    ),
    AlgorithmSpec(
        "lg-fedavg",
        "LG-FedAvg",
        PartialSharingServer,
        PartialSharingClient,
        "LG-FedAvg (Liang et al.): the first private_layers layers (private_unit) stay on each site",
        LGFedAvgOptions,
        kind="personalized",
        on_secure_aggregation=None,
    ),
)
