"""FedProx (Li et al., MLSys 2020): FedAvg whose local objective carries a proximal term.

Local objective of site k in round t: ``l(w) + (mu / 2) * ||w - w^t||^2`` with ``w^t`` the global
model the site received. The norm is *squared* (one public benchmark used the unsquared norm
by mistake) and runs over the trainable parameters (buffers such as BatchNorm statistics get
no gradient). The server side is FedAvg's merge, unchanged.
"""

from __future__ import annotations

import torch
from pydantic import Field
from torch import nn

from fedseg.algorithms.fedavg import MODEL, FedAvgClient, FedAvgOptions, FedAvgServer
from fedseg.algorithms.registry import AlgorithmSpec
from fedseg.engine.context import ClientContext
from fedseg.engine.messages import Message
from fedseg.train import TrainHooks


class FedProxOptions(FedAvgOptions):
    mu: float = Field(0.001, ge=0, description="proximal weight mu (Auto-FedAvg paper's best FedProx mu = 0.001)")


def proximal_term(model: nn.Module, anchor: dict[str, torch.Tensor], mu: float) -> torch.Tensor:
    """``(mu / 2) * sum_p ||p - anchor[p]||^2`` over the model's trainable parameters (scalar)."""
    terms = [(p - anchor[name]).pow(2).sum() for name, p in model.named_parameters() if p.requires_grad]
    return 0.5 * mu * torch.stack(terms).sum()


class ProximalTerm(TrainHooks):
    """Adds ``proximal_term(model, anchor, mu)`` to every step's loss."""

    def __init__(self, anchor: dict[str, torch.Tensor], mu: float):
        self.anchor, self.mu = anchor, mu

    @classmethod
    def towards(cls, weights: dict[str, torch.Tensor], model: nn.Module, mu: float) -> ProximalTerm:
        """The term pulling ``model`` towards ``weights`` (detached, on the model's device: fixed while training)."""
        device = next(model.parameters()).device
        return cls({k: v.detach().to(device) for k, v in weights.items()}, float(mu))

    def extra_loss(self, model: nn.Module) -> torch.Tensor:
        return proximal_term(model, self.anchor, self.mu)


class FedProxClient(FedAvgClient):
    def train_hooks(self, model: nn.Module, msg: Message, ctx: ClientContext) -> TrainHooks:
        return ProximalTerm.towards(msg.group(MODEL), model, ctx.options.mu)  # w^t, fixed during the round


FedProxServer = FedAvgServer


SPECS = (
    AlgorithmSpec(
        "fedprox",
        "FedProx",
        FedProxServer,
        FedProxClient,
        "FedProx (Li et al.): local proximal term (mu/2)||w - w_global||^2",
        FedProxOptions,
    ),
)
