"""Local fine-tuning of a trained global model (FeTS 2022 Sec. 3.3.3, 4.4), and Ditto in that form.

``finetune`` starts from another method's trained global model w* (``start_from``, default: the
``fedavg`` of the same run, or a ``RUN/model/<algorithm>/`` folder; ``fedseg.run.start_from``). Site
k receives w* once (round 1: the only traffic) and then trains its copy alone, one local budget
(``train.budget``, default one epoch) per round, for ``epochs`` rounds (paper: 30 epochs). Each
site keeps its best epoch on its own validation split (per-site selection,
``fedseg.algorithms.persite``); test data is never consulted before the single test. The cost
table adds the base method's training (FeTS Table 2).

``ditto-ft`` is the same with Ditto's proximal pull towards the start model, FeTS 2022's Ditto
(Eq. 24 solved "by local fine-tuning over the regularized local objective"): the site minimizes
``f_k(v) + (lam / 2) ||v - w*||^2`` (over the trainable parameters; ``lam`` = 0 is ``finetune``).
The concurrent form of Ditto is ``fedseg.algorithms.ditto``.
"""

from __future__ import annotations

from pydantic import Field
from torch import nn

from fedseg.algorithms.client_state import put_group, state_group
from fedseg.algorithms.fedavg import BudgetOptions, train_meta
from fedseg.algorithms.persite import PerSiteClient, PerSiteServer
from fedseg.algorithms.prefixes import MODEL
from fedseg.algorithms.proximal import ProximalTerm
from fedseg.algorithms.registry import AlgorithmSpec
from fedseg.engine.context import ClientContext, options_as
from fedseg.engine.messages import Message, load_weights, prefixed, weights_of
from fedseg.train import TrainHooks

START = "start"  # client-state prefix of w*, the model the site started from (Ditto's anchor)


class FinetuneOptions(BudgetOptions):
    start_from: str = Field(
        "fedavg", description="algorithm of the same run (listed before) or RUN/model/<algorithm> folder to start from"
    )
    epochs: int = Field(30, ge=1, description="fine-tuning rounds of one local budget each (FeTS 2022: 30 epochs)")
    lam: float = Field(0.0, ge=0, description="Ditto's pull (lam/2)||v - w*||^2 towards the start model; 0 = none")

    def run_rounds(self, rounds: int) -> int:
        """This method's number of rounds (``AlgorithmSpec.run_config``): one per fine-tuning epoch."""
        return self.epochs


class DittoFinetuneOptions(FinetuneOptions):
    lam: float = Field(0.1, ge=0, description="Ditto's lambda of Eq. 24 (FeTS grid: 0.001, 0.01, 0.1, 1)")


class FinetuneClient(PerSiteClient):
    """Round 1: keeps the received w*; every round: trains its own copy one local budget."""

    def own_model(self, msg: Message, ctx: ClientContext) -> nn.Module:
        model = ctx.task.new_model()
        load_weights(model, state_group(ctx.state, MODEL) or state_group(ctx.state, START) or msg.group(MODEL))
        return model

    def start_model(self, msg: Message, ctx: ClientContext) -> nn.Module:
        if msg.group(MODEL):
            put_group(ctx.state, START, msg.group(MODEL))
        return self.own_model(msg, ctx)

    def train_hooks(self, model: nn.Module, msg: Message, ctx: ClientContext) -> TrainHooks:
        lam = options_as(ctx.options, FinetuneOptions).lam
        if not lam:
            return TrainHooks()
        return ProximalTerm.towards(state_group(ctx.state, START), model, lam)

    def after_fit(self, model, stats, msg, ctx) -> Message:
        put_group(ctx.state, MODEL, weights_of(model))
        return Message({}, train_meta(stats, ctx))


class FinetuneServer(PerSiteServer):
    """Sends w* in the first round; then only coordinates rounds (validation, per-site selection)."""

    def run_round(self, rnd: int) -> dict[str, float]:
        down = prefixed(MODEL, self.global_weights) if rnd == 1 else {}
        replies = self.engine.exchange({s: Message(dict(down)) for s in self.engine.sites}, "train")
        return {s: float(r.meta["loss"]) for s, r in replies.items()}

    def site_weights(self, site: str) -> dict:
        return {}


SPECS = (
    AlgorithmSpec(
        "finetune",
        "Local fine-tuning",
        FinetuneServer,
        FinetuneClient,
        "each site fine-tunes a trained global model (start_from, default fedavg) and keeps its best epoch",
        FinetuneOptions,
        kind="personalized",
    ),
    AlgorithmSpec(
        "ditto-ft",
        "Ditto (fine-tuning)",
        FinetuneServer,
        FinetuneClient,
        "Ditto as FeTS 2022 ran it: local fine-tuning of a global model with the pull (lam/2)||v - w*||^2",
        DittoFinetuneOptions,
        kind="personalized",
    ),
)
