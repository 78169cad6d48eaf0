"""The proximal term, a training hook shared by the methods that pull local training towards fixed weights.

FedProx pulls towards the received global model, Ditto's personalized model towards the global
model of the round, fine-tuning towards the model it started from: each adds
``(mu / 2) * ||w - anchor||^2`` to every step's loss. The norm is *squared* (one public benchmark
used the unsquared norm by mistake) and runs over the trainable parameters (buffers such as
BatchNorm statistics get no gradient).
"""

from __future__ import annotations

import torch
from torch import nn

from fedseg.train import TrainHooks


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
