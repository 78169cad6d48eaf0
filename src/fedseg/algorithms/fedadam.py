"""FedAdam (Reddi et al., ICLR 2021), as in the FeTS benchmark (Eq. 10-12, Algorithm 1 line 25).

The server treats the averaged local update as a pseudo-gradient and takes an Adam step:

    d^t     = sum_k p_k (w_k - w^t)                          (FedAvg's p_k)
    m^{t+1} = beta1 m^t + (1 - beta1) d^t                   (Eq. 10)
    v^{t+1} = beta2 v^t + (1 - beta2) (d^t)^2               (Eq. 11)
    w^{t+1} = w^t + eta_s m^{t+1} / (sqrt(v^{t+1}) + tau)   (Eq. 12)

The step uses the moments just updated, as Algorithm 1 line 25 and Reddi et al.'s Algorithm 2 do; Eq. 12
as printed divides ``Delta^t`` by ``sqrt(v^t)`` (the previous round's moments), which would apply each
round's update one round late. No bias correction (as in the paper and Reddi et al.'s Algorithm 2).
Element-wise over every entry of the model; buffers (BatchNorm statistics, if any) are then reset to FedAvg's average
(``FedAvgServer.average_buffers``). ``m`` and ``v`` (float64) are server state, so a resumed run
continues with them. Clients are plain FedAvg clients.
"""

from __future__ import annotations

import torch
from pydantic import Field

from fedseg.algorithms.aggregate import weighted_average
from fedseg.algorithms.fedavg import FedAvgClient, FedAvgOptions, FedAvgServer
from fedseg.algorithms.prefixes import MODEL
from fedseg.algorithms.registry import AlgorithmSpec
from fedseg.engine.messages import Message, prefixed

Weights = dict[str, torch.Tensor]


class FedAdamOptions(FedAvgOptions):
    """Defaults: FeTS appendix Table 4 (eta_s = 0.001; beta1, beta2, tau = 0.9, 0.999, 1e-8)."""

    OWN_MERGE = "FedAdam's merge is its server Adam step on the weighted mean update (Eq. 10-12)"

    eta_s: float = Field(1e-3, gt=0, description="server learning rate")
    beta1: float = Field(0.9, ge=0, lt=1)
    beta2: float = Field(0.999, ge=0, lt=1)
    tau: float = Field(1e-8, gt=0, description="adaptivity: added to sqrt(v)")


def adam_server_step(
    w: Weights, d: Weights, m: Weights, v: Weights, eta_s: float, beta1: float, beta2: float, tau: float
) -> tuple[Weights, Weights, Weights]:
    """One server Adam step (Eq. 10-12) on pseudo-gradient ``d``; empty ``m``/``v`` mean zeros.

    Returns ``(w_new, m_new, v_new)``; moments float64, weights in their own dtype.
    """
    w_new, m_new, v_new = {}, {}, {}
    for name, x in w.items():
        g = d[name].to(torch.float64)
        m_new[name] = beta1 * m.get(name, torch.zeros_like(g)) + (1 - beta1) * g
        v_new[name] = beta2 * v.get(name, torch.zeros_like(g)) + (1 - beta2) * g * g
        w_new[name] = (x.to(torch.float64) + eta_s * m_new[name] / (v_new[name].sqrt() + tau)).to(x.dtype)
    return w_new, m_new, v_new


class FedAdamServer(FedAvgServer):
    options: FedAdamOptions  # this method's options (``FedAvgServer.options``)

    def __init__(self, engine, task, options):
        super().__init__(engine, task, options)
        self.m: Weights = {}
        self.v: Weights = {}

    def aggregate(self, replies: dict[str, Message]) -> None:
        sites = list(replies)
        weights = self.checked_aggregation_weights(replies)
        w = self.global_weights
        updates = [
            {n: t.to(torch.float64) - w[n].to(torch.float64) for n, t in replies[s].group(MODEL).items()} for s in sites
        ]
        d = weighted_average(updates, [weights[s] for s in sites])
        o = self.options
        self.global_weights, self.m, self.v = adam_server_step(w, d, self.m, self.v, o.eta_s, o.beta1, o.beta2, o.tau)

    def state_dict(self) -> dict[str, torch.Tensor]:
        return {**super().state_dict(), **prefixed("adam_m", self.m), **prefixed("adam_v", self.v)}

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        super().load_state_dict(state)
        self.m, self.v = Message(state).group("adam_m"), Message(state).group("adam_v")


FedAdamClient = FedAvgClient


SPECS = (
    AlgorithmSpec(
        "fedadam",
        "FedAdam",
        FedAdamServer,
        FedAdamClient,
        "FedAdam (Reddi et al.): server-side Adam on the averaged update (FeTS Eq. 10-12)",
        FedAdamOptions,
        on_secure_aggregation=None,
    ),
)
