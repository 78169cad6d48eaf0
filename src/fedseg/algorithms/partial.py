"""Partial model sharing (FeTS 2022 Sec. 3.3.5): FedPer keeps the last blocks private, LG-FedAvg the first.

The network's state w is split into federated entries w_g and private entries w_l (w = w_g U w_l)
by block (``fedseg.models.blocks``: a block is a module path of the MONAI UNet / DynUNet, 2D or
3D): ``private_layers`` P blocks (paper: 4) are private, the last P for FedPer (Arivazhagan et
al.), the first P for LG-FedAvg (Liang et al.). What differs from FedAvg:

* only w_g travels, down and up (the ledger counts it: FedAvg's traffic times |w_g| / |w|), and
  only w_g is averaged (sample-weighted, ``weighting`` as FedAvg);
* each site keeps its w_l in its state store from one round to the next (``private/``); in the
  first round it is the common initialization, like every site's starting model;
* site k's model is w_g (received) with its own w_l: it is validated and tested as a per-site
  model (``fedseg.algorithms.persite``: each site at its own best validation round).

Normalization layers belong to their block: a BatchNorm's affine weights and running statistics
are private in a private block and averaged in a federated one. With the default instance
normalization (no affine weights, no running statistics) there is nothing to decide.
"""

from __future__ import annotations

from typing import Literal

import torch
from pydantic import Field
from torch import nn

from fedseg.algorithms.fedavg import MODEL, FedAvgOptions, put_group, state_group, train_meta
from fedseg.algorithms.persite import PerSiteClient, PerSiteServer
from fedseg.algorithms.registry import AlgorithmSpec
from fedseg.engine.context import ClientContext, Task
from fedseg.engine.messages import Message, load_weights, prefixed, weights_of
from fedseg.models.blocks import entries_by_block

PRIVATE = "private"  # client-state prefix of the site's private entries w_l


class SharingOptions(FedAvgOptions):
    """``private_layers``: how many network blocks stay on the site (``fedseg.models.blocks``); FedAvg's
    ``weighting``, ``local_steps`` and ``aggregator`` (over the federated entries w_g)."""

    private_layers: int = Field(4, ge=1, description="P network blocks kept private (FeTS 2022: 4)")

    def check_task(self, task: Task, algorithm: str) -> None:
        """At least one block must stay federated (checked before any work)."""
        try:
            private_entries(task, self)  # type: ignore[arg-type]  # a FedPer or LG-FedAvg options model
        except ValueError as e:
            raise ValueError(f"methods.{algorithm}.{e}") from None


class FedPerOptions(SharingOptions):
    private: Literal["last"] = Field("last", description="FedPer keeps the last P blocks private (fixed)")


class LGFedAvgOptions(SharingOptions):
    private: Literal["first"] = Field("first", description="LG-FedAvg keeps the first P blocks private (fixed)")


def private_entries(task: Task, options: FedPerOptions | LGFedAvgOptions) -> frozenset[str]:
    """Names of the state entries in the P private blocks (first or last, ``options.private``)."""
    grouped = entries_by_block(task.new_model())
    blocks = list(grouped)
    p = options.private_layers
    if p >= len(blocks):
        raise ValueError(
            f"private_layers={p} leaves no federated block: the {task.cfg.model.name} has {len(blocks)} blocks "
            f"({', '.join(blocks)})"
        )
    chosen = blocks[-p:] if options.private == "last" else blocks[:p]
    return frozenset(name for b in chosen for name in grouped[b])


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
        federated, private = split_weights(weights_of(model), private_entries(ctx.task, ctx.options))
        put_group(ctx.state, PRIVATE, private)
        return Message(prefixed(MODEL, federated), train_meta(stats, ctx))


class PartialSharingServer(PerSiteServer):
    """FedAvg over the federated entries w_g only."""

    def __init__(self, engine, task, options):
        super().__init__(engine, task, options)
        self.global_weights, _ = split_weights(self.global_weights, private_entries(task, options))


SPECS = (
    AlgorithmSpec(
        "fedper",
        "FedPer",
        PartialSharingServer,
        PartialSharingClient,
        "FedPer (Arivazhagan et al.): the last private_layers network blocks stay on each site",
        FedPerOptions,
        kind="personalized",
    ),
    AlgorithmSpec(
        "lg-fedavg",
        "LG-FedAvg",
        PartialSharingServer,
        PartialSharingClient,
        "LG-FedAvg (Liang et al.): the first private_layers network blocks stay on each site",
        LGFedAvgOptions,
        kind="personalized",
    ),
)
