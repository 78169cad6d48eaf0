"""FedNova (Wang et al., NeurIPS 2020): normalized averaging of local updates.

``variant: general`` -- sites report ``a_k``, the l1 norm of their local step-weight vector:
``a_k = tau_k`` (the steps actually taken) for plain SGD and Adam, and with SGD momentum rho
``a_k = (tau_k - rho (1 - rho^tau_k) / (1 - rho)) / (1 - rho)`` (Wang et al., Appendix). That
formula holds for a momentum buffer that starts at zero each round, so with SGD momentum the
general variant resets the buffer every round whatever ``train.keep_optimizer_state`` says: a kept
buffer carries last round's steps into this round's displacement (measured: a total step weight of
28.2 instead of 13.1 for 5 steps at rho = 0.9), and the normalization would be wrong.
The server divides each update by its ``a_k`` and rescales by ``tau_eff = sum_k p_k a_k``:

    w <- w + tau_eff * sum_k p_k (w_k - w) / a_k          (p_k = FedAvg's weights, sum 1)

With equal ``a_k`` this is FedAvg exactly.

``variant: fets`` -- the FeTS benchmark's simplification (Eq. 4-5), uniform averaging with the
analytical server rate ``gamma = K sum_k p_k^2 >= 1`` (``p_k = n_k / N``, sample shares):

    w <- w + gamma * (1 / K) sum_k (w_k - w)

It is the general form when ``tau_k`` is proportional to ``n_k`` (fixed epochs, one batch size):
``p_k tau_eff / tau_k = sum_j p_j^2`` for every k.
"""

from __future__ import annotations

import math
from typing import Literal

from pydantic import Field

from fedseg.algorithms.aggregate import server_step, weighted_average
from fedseg.algorithms.fedavg import FedAvgClient, FedAvgOptions, FedAvgServer
from fedseg.algorithms.prefixes import MODEL
from fedseg.algorithms.registry import AlgorithmSpec
from fedseg.config import TrainConfig
from fedseg.engine.context import ClientContext, options_as
from fedseg.engine.faults import is_number
from fedseg.engine.messages import Message

NORM = "nova_a"  # reply meta key of a_k


class FedNovaOptions(FedAvgOptions):
    OWN_MERGE = "FedNova's merge is its normalized average (updates divided by a_k, rescaled)"
    variant: Literal["general", "fets"] = Field(
        "fets",
        description="general: normalized by a_k, rescaled by tau_eff; fets: uniform + gamma = K sum p_k^2 (Eq. 4-5)",
    )


def momentum_norm(steps: int, rho: float) -> float:
    """``a_k`` for ``steps`` SGD steps with heavy-ball momentum ``rho`` (``steps`` when rho = 0)."""
    if rho == 0:
        return float(steps)
    return (steps - rho * (1 - rho**steps) / (1 - rho)) / (1 - rho)


class FedNovaClient(FedAvgClient):
    def keeps_optimizer_state(self, train: TrainConfig, ctx: ClientContext) -> bool:
        """FedAvg's rule, except that the general variant with SGD momentum starts each round from a zero
        momentum buffer (module doc)."""
        if (
            options_as(ctx.options, FedNovaOptions).variant == "general"
            and train.optimizer == "sgd"
            and train.momentum > 0
        ):
            return False
        return super().keeps_optimizer_state(train, ctx)

    def after_fit(self, model, stats, msg, ctx) -> Message:
        reply = super().after_fit(model, stats, msg, ctx)
        train = ctx.cfg.train
        rho = train.momentum if train.optimizer == "sgd" else 0.0
        reply.meta[NORM] = momentum_norm(stats.steps, rho)
        return reply


class FedNovaServer(FedAvgServer):
    options: FedNovaOptions  # this method's options (``FedAvgServer.options``)

    def train_reply_problem(self, site: str, sent: Message, reply: Message) -> str | None:
        """FedAvg's check; the general form also reads ``a_k`` (``meta.nova_a``), which must be the momentum norm of
        the SGD steps the site reports under the run's momentum (the site's word is its steps, not a free a_k: one
        a_k of 1e-9 made the server's rate, and the merge, whatever that site wanted)."""
        if problem := super().train_reply_problem(site, sent, reply):
            return problem
        if self.options.variant != "general":
            return None
        train = self.task.cfg.train
        expected = momentum_norm(int(reply.meta.get("steps", 0)), train.momentum if train.optimizer == "sgd" else 0.0)
        a = reply.meta.get(NORM)
        if expected <= 0:  # no step trained: its update divided by a_k = 0
            return f"it trained no SGD step (steps = {reply.meta.get('steps')!r}), so its a_k is 0"
        if not is_number(a) or not math.isclose(a, expected, rel_tol=1e-9):
            return (
                f"its {NORM} = {a!r:.40} is not the momentum norm {expected:g} of its {reply.meta.get('steps')} steps"
            )
        return None

    def aggregate(self, replies: dict[str, Message]) -> None:
        sites = list(replies)
        models = [replies[s].group(MODEL) for s in sites]
        if self.options.variant == "fets":
            n = [float(replies[s].meta["num_examples"]) for s in sites]
            gamma = len(n) * sum(x * x for x in n) / sum(n) ** 2  # K sum p_k^2; exactly 1 for equal n_k
            self.global_weights = server_step(self.global_weights, weighted_average(models, [1.0] * len(n)), gamma)
            return
        weights = self.checked_aggregation_weights(replies)
        n = [weights[s] for s in sites]
        a = [float(replies[s].meta[NORM]) for s in sites]
        # sum_k p_k (w_k - w) / a_k = (sum_j n_j r_j) / (N a_ref) * (avg_r - w), with r_k = a_ref / a_k and
        # avg_r the average of the w_k weighted by n_k r_k. With equal a_k, r_k = 1.0 and the rate
        # below is exactly 1 for integer a_k (plain SGD, Adam), so the merge is then FedAvg's bit for bit.
        a_ref = max(a)
        r = [a_ref / ak for ak in a]
        total = sum(n)
        rate = sum(nk * ak for nk, ak in zip(n, a)) * sum(nk * rk for nk, rk in zip(n, r)) / (total * total * a_ref)
        merged = weighted_average(models, [nk * rk for nk, rk in zip(n, r)])
        self.global_weights = server_step(self.global_weights, merged, rate)


SPECS = (
    AlgorithmSpec(
        "fednova",
        "FedNova",
        FedNovaServer,
        FedNovaClient,
        "FedNova (Wang et al.): normalized averaging (general form or FeTS Eq. 4-5)",
        FedNovaOptions,
        on_secure_aggregation="its server normalizes each site's update by that site's own step count tau_k",
    ),
)
