"""FedProx (Li et al., MLSys 2020): FedAvg whose local objective carries a proximal term.

Local objective of site k in round t: ``l(w) + (mu / 2) * ||w - w^t||^2`` with ``w^t`` the global
model the site received (:class:`fedseg.algorithms.proximal.ProximalTerm`). The server side is
FedAvg's merge, unchanged.
"""

from __future__ import annotations

from pydantic import Field
from torch import nn

from fedseg.algorithms.fedavg import FedAvgClient, FedAvgOptions, FedAvgServer
from fedseg.algorithms.prefixes import MODEL
from fedseg.algorithms.proximal import ProximalTerm
from fedseg.algorithms.registry import AlgorithmSpec
from fedseg.engine.context import ClientContext, options_as
from fedseg.engine.messages import Message
from fedseg.train import TrainHooks


class FedProxOptions(FedAvgOptions):
    ONE_STEP_AS_FEDAVG = "the proximal term is zero on a round's first step, so FedProx trains exactly as FedAvg"

    mu: float = Field(0.001, ge=0, description="proximal weight mu (Auto-FedAvg paper's best FedProx mu = 0.001)")


class FedProxClient(FedAvgClient):
    def train_hooks(self, model: nn.Module, msg: Message, ctx: ClientContext) -> TrainHooks:
        return ProximalTerm.towards(
            msg.group(MODEL), model, options_as(ctx.options, FedProxOptions).mu
        )  # w^t, fixed during the round


FedProxServer = FedAvgServer


SPECS = (
    AlgorithmSpec(
        "fedprox",
        "FedProx",
        FedProxServer,
        FedProxClient,
        "FedProx (Li et al.): local proximal term (mu/2)||w - w_global||^2",
        FedProxOptions,
        on_secure_aggregation=None,
    ),
)
