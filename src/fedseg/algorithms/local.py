"""Local training: each site trains alone; nothing is averaged.

Evaluation gives the cross-site matrix (each site's model on every site's test split, the
"Client k Local" rows of the FedSM paper's Table 3). Auto-FedAvg's "local avg" is its
diagonal mean and "local gen" its off-diagonal mean. Each site's model is the one of the best
round (mean validation Dice over sites), not each site's own best round as the FL methods' local
models (``fedseg.algorithms.fedavg``: ``keep_best_local``, which ``local`` does not use).
"""

from __future__ import annotations

from torch import nn

from fedseg.algorithms.fedavg import (
    MODEL,
    FedAvgClient,
    FedAvgServer,
    local_model_name,
    put_group,
    state_group,
    train_meta,
)
from fedseg.algorithms.registry import AlgorithmSpec
from fedseg.engine.context import ClientContext
from fedseg.engine.messages import Message, load_weights, prefixed, weights_of


class LocalClient(FedAvgClient):
    """Keeps its own model in client state; trains it; shares it only to be scored elsewhere."""

    def own_model(self, ctx: ClientContext) -> nn.Module:
        model = ctx.task.new_model()
        if state_group(ctx.state, MODEL):
            load_weights(model, state_group(ctx.state, MODEL))
        return model

    def start_model(self, msg: Message, ctx: ClientContext) -> nn.Module:
        return self.own_model(ctx)

    def after_fit(self, model, stats, msg, ctx) -> Message:
        put_group(ctx.state, MODEL, weights_of(model))
        return Message({}, train_meta(stats, ctx))

    def keep_best_local(self, model: nn.Module, ctx: ClientContext) -> None:
        """Nothing: the site's own model is its local model."""

    def eval_model(self, msg: Message, ctx: ClientContext) -> nn.Module:
        return super().eval_model(msg, ctx) if msg.group(MODEL) else self.own_model(ctx)

    def on_share_model(self, msg: Message, ctx: ClientContext) -> Message:
        return Message(prefixed(MODEL, weights_of(self.own_model(ctx))))


class LocalServer(FedAvgServer):
    """Coordinates rounds (for validation and selection) without touching the models."""

    KEEPS_LOCAL_MODELS = False  # the sites' own models are scored across sites directly

    def run_round(self, rnd: int) -> dict[str, float]:
        replies = self.engine.exchange({s: Message() for s in self.engine.sites}, "train")
        return {s: float(r.meta["loss"]) for s, r in replies.items()}

    def site_model(self, site: str) -> str:
        return local_model_name(site)

    def eval_messages(self, split: str, sample: bool) -> dict[str, Message]:
        return {
            s: Message({}, {"split": split, "model": self.site_model(s), "sample": sample}) for s in self.engine.sites
        }

    def evaluate(self, split: str, sample: bool = False) -> list[dict]:
        rows = super().evaluate(split, sample)
        if split == "test":  # every site's model on every other site's test split
            rows += self.cross_site_rows(self.collect_models(), skip_own=True)
        return rows

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: dict) -> None:
        pass

    def bundle(self) -> dict[str, dict]:
        return {self.site_model(s): w for s, w in self.collect_models().items()}


SPECS = (
    AlgorithmSpec(
        "local",
        "Local",
        LocalServer,
        LocalClient,
        "each site trains alone; cross-site matrix at test time",
        kind="baseline",
    ),
)
