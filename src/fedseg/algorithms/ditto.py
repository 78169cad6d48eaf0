"""Ditto (Li et al., ICML 2021; FeTS 2022 Eq. 24): a personal model per site, pulled towards the global one.

Site k solves ``min_v  f_k(v) + (lambda / 2) ||v - w*||^2`` (Eq. 24) for its personal model v_k,
where w* is the global model of ordinary FedAvg. Ditto can solve it in two forms:

* **concurrent** (this method, ``ditto``; Ditto's Algorithm 1): FedAvg trains w as always, and in
  every round site k also trains its v_k (kept in its state store, ``personal/``; it starts as the
  first global model it receives) for ``personal_epochs`` / ``personal_steps`` on
  ``f_k(v) + (lambda / 2) ||v - w^t||^2`` with w^t the global model received this round (the
  proximal term of :class:`fedseg.algorithms.proximal.ProximalTerm`, over the trainable parameters).
  Only w travels: Ditto's traffic is FedAvg's; its steps (ledger, cost table) are both trainings'.
  v_k is what site k is validated and tested with (per-site selection, ``fedseg.algorithms.persite``).
* **fine-tuning** (``ditto-ft``, ``fedseg.algorithms.finetune``): after a global method has
  trained w*, each site fine-tunes a copy of it on the same regularized objective. That is the
  form the FeTS 2022 benchmark implemented (its Table 1 "Ditto" row): Ditto's authors found the
  concurrent form helps only against malicious sites, at a much larger local cost.

Random streams: the FedAvg half draws its batches from the site's stream of the round, exactly as
FedAvg does, and v_k's training from a copy of that stream taken before, exactly as ``local``'s
training does. So Ditto's global model is FedAvg's, bit for bit, and with lambda = 0 each v_k is
``local``'s model, bit for bit (tests check both); as lambda grows, v_k approaches w.
"""

from __future__ import annotations

import torch
from pydantic import Field
from torch import nn

from fedseg.algorithms.client_state import put_group, state_group
from fedseg.algorithms.fedavg import FedAvgOptions
from fedseg.algorithms.persite import PerSiteClient, PerSiteServer
from fedseg.algorithms.prefixes import MODEL
from fedseg.algorithms.proximal import ProximalTerm
from fedseg.algorithms.registry import AlgorithmSpec
from fedseg.config import BudgetConfig
from fedseg.engine.context import ClientContext, options_as
from fedseg.engine.messages import Message, load_weights, weights_of

PERSONAL = "personal"  # client-state prefix of v_k
OPT_PERSONAL = "opt_personal"  # client-state prefix of v_k's optimizer moments (train.keep_optimizer_state)


class DittoOptions(FedAvgOptions):
    lam: float = Field(
        0.1, ge=0, description="lambda of Eq. 24: pull of v_k towards the global model (FeTS grid: 0.001-1)"
    )
    personal_epochs: int | None = Field(
        None, ge=1, description="epochs training v_k per round; None = the round's local budget"
    )
    personal_steps: int | None = Field(
        None, ge=1, description="optimizer steps training v_k per round (instead of personal_epochs)"
    )


def personal_budget(options: DittoOptions) -> BudgetConfig | None:
    """v_k's budget per round: ``personal_steps`` steps, else ``personal_epochs`` epochs, else the local budget."""
    if options.personal_steps:
        return BudgetConfig(unit="steps", amount=options.personal_steps)
    if options.personal_epochs:
        return BudgetConfig(unit="epochs", amount=options.personal_epochs)
    return options.local_budget()


class DittoClient(PerSiteClient):
    """FedAvg's local training of w, plus the proximal training of the site's own v_k."""

    def own_model(self, msg: Message, ctx: ClientContext) -> nn.Module:
        """v_k (the received global model before the site has one)."""
        model = ctx.task.new_model()
        load_weights(model, state_group(ctx.state, PERSONAL) or msg.group(MODEL))
        return model

    def on_train(self, msg: Message, ctx: ClientContext) -> Message:
        personal_stream = torch.Generator().set_state(ctx.generator.get_state())  # local's batches
        personal, opts = self.own_model(msg, ctx), options_as(ctx.options, DittoOptions)
        personal_stats = self.fit(
            personal,
            msg,
            ctx,
            state_key=OPT_PERSONAL,
            budget=personal_budget(opts),
            hooks=ProximalTerm.towards(msg.group(MODEL), personal, opts.lam),  # w^t, fixed this round
            generator=personal_stream,
        )
        put_group(ctx.state, PERSONAL, weights_of(personal))
        reply = super().on_train(msg, ctx)  # FedAvg's half, on the site's own stream
        reply.meta["steps"] = int(reply.meta["steps"]) + personal_stats.steps  # the cost counts both trainings
        return reply


class DittoServer(PerSiteServer):
    """FedAvg; each site is evaluated with its v_k (nothing to send for it)."""

    def site_weights(self, site: str) -> dict:
        """Nothing: a site is evaluated with its own v_k. Under client sampling (``fl.clients_per_round``) a site
        not yet sampled has none: every site then gets the global model, the one its v_k would start from (an
        unsampled site failed its first validation: ``weights are missing``)."""
        return {} if self.task.cfg.fl.clients_per_round is None else self.global_weights


SPECS = (
    AlgorithmSpec(
        "ditto",
        "Ditto",
        DittoServer,
        DittoClient,
        "Ditto (Li et al.): FedAvg plus a personal model per site with a proximal pull (lambda/2)||v - w||^2",
        DittoOptions,
        kind="personalized",
        on_secure_aggregation=None,
    ),
)
