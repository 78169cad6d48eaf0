"""Local training: each site trains alone; nothing is averaged.

Evaluation gives the cross-site matrix (each site's model on every site's test split, the
"Client k Local" rows of the FedSM paper's Table 3). Auto-FedAvg's "local avg" is its
diagonal mean and "local gen" its off-diagonal mean. Each site's model is the one of its own
best round on its own validation split (per-site selection, ``fedseg.algorithms.persite``), as
FeTS 2022 and Auto-FedAvg select local models.
"""

from __future__ import annotations

from torch import nn

from fedseg.algorithms.client_state import put_group, state_group
from fedseg.algorithms.fedavg import train_losses, train_meta
from fedseg.algorithms.persite import PerSiteClient, PerSiteServer
from fedseg.algorithms.prefixes import MODEL
from fedseg.algorithms.registry import AlgorithmSpec
from fedseg.engine.context import ClientContext
from fedseg.engine.messages import Message, load_weights, weights_of


class LocalClient(PerSiteClient):
    """Keeps its own model in client state and trains it; nothing travels in training."""

    def own_model(self, msg: Message, ctx: ClientContext) -> nn.Module:
        model = ctx.task.new_model()
        if state_group(ctx.state, MODEL):
            load_weights(model, state_group(ctx.state, MODEL))
        return model

    def start_model(self, msg: Message, ctx: ClientContext) -> nn.Module:
        return self.own_model(msg, ctx)

    def after_fit(self, model, stats, msg, ctx) -> Message:
        put_group(ctx.state, MODEL, weights_of(model))
        return Message({}, train_meta(stats, ctx))


class LocalServer(PerSiteServer):
    """Coordinates rounds (for validation and selection) without touching the models."""

    def run_round(self, rnd: int) -> dict[str, float]:
        replies = self.engine.exchange({s: Message() for s in self.engine.sites}, "train")
        return train_losses(replies)

    def site_weights(self, site: str) -> dict:
        return {}

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: dict) -> None:
        pass


SPECS = (
    AlgorithmSpec(
        "local",
        "Local",
        LocalServer,
        LocalClient,
        "each site trains alone, keeps its best round on its own validation split; cross-site matrix at test time",
        kind="baseline",
        on_secure_aggregation="each site's own model is sent to the coordinator for the cross-site test",
    ),
)
