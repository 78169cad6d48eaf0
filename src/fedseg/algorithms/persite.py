"""Per-site model selection: the base pair of every method whose sites use a model of their own.

FeTS 2022 (Sec. 4.4) and Auto-FedAvg select a personalized model per site: site k is tested with
its own model at the round where that model scored best on site k's **own** validation split, not
at the round with the best mean over sites (which a global model keeps: ``fedseg.run``).

The selection happens on the site, so it works on every engine and survives a resume:

* in every validated round the server asks each site to score its current model on its validation
  split (``evaluate`` with ``meta.keep_best``); the site keeps the model in its state store
  (``sitebest/`` weights, ``sitebest_score``, ``sitebest_round``,
  :func:`~fedseg.algorithms.client_state.keep_if_better`)
  when its mean validation Dice beats the kept one (NaN ranks lowest; ties keep the earlier round);
* at test time (``meta.use_best``; the message carries no weights) each site scores its kept
  model on its test split and replies the round it was kept in (``selected_round``, recorded per
  site in ``summary.json`` as ``selected_rounds``);
* the kept models are then fetched (``share_model``: evaluation traffic) and each is scored on
  every other site's test split: the cross-site matrix with its diagonal mean ("local avg") and
  off-diagonal mean ("local gen"), and they are the run's bundle (``local:<site>``, one per site).

The run restores only the server's state of the best mean round (for what the server holds, e.g.
a global model), never the sites' states: those hold each site's own choice over all rounds.

A site's model is named ``local:<site>`` in result rows ("the model site k holds and uses";
``fedseg.evaluate.tables.cross_site_matrix`` reads these rows). What a method adds:

* server: ``site_weights(site)``: what site k needs, besides its own state, to assemble its
  current model (default: the global model; Ditto: nothing; FedPer: the federated part;
  a clustered method: its cluster's model);
* client: ``own_model(msg, ctx)``: that model (default: the message's weights).
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from fedseg.algorithms.client_state import ROUND, keep_if_better, state_group
from fedseg.algorithms.fedavg import FedAvgClient, FedAvgServer
from fedseg.algorithms.local_models import collect_models, cross_site_rows, kept_model_reply, local_model_name
from fedseg.algorithms.prefixes import MODEL
from fedseg.algorithms.site_scoring import surface_meta
from fedseg.engine.context import ClientContext
from fedseg.engine.messages import Message, MetaValue, load_weights, prefixed, weights_of
from fedseg.evaluate.tables import eval_rows, site_dice

SITE_BEST = "sitebest"  # client-state prefix of the site's selected model (and its _score, _round)
KEEP_BEST = "keep_best"  # eval meta: keep the scored model if it is the site's best so far (validation)
USE_BEST = "use_best"  # eval meta: score the kept model instead (test); the message carries no weights
SELECTED_ROUND = "selected_round"  # reply meta to USE_BEST: the round the kept model comes from


class PerSiteClient(FedAvgClient):
    """Keeps its best model on its own validation split; tests it; shares it to be scored elsewhere."""

    def keep_best_local(self, model: nn.Module, ctx: ClientContext) -> None:
        """Nothing: the site's own (selected) model is its local model (``eval.local_models``)."""

    def own_model(self, msg: Message, ctx: ClientContext) -> nn.Module:
        """The site's current model, assembled from ``msg`` (``site_weights``) and its state store."""
        return super().eval_model(msg, ctx)

    def eval_model(self, msg: Message, ctx: ClientContext) -> nn.Module:
        """Test: the kept model. The site's own model: ``own_model``. Another site's model (cross-site
        rows): the complete weights the message carries."""
        if msg.meta.get(USE_BEST):
            weights = state_group(ctx.state, SITE_BEST)
            if not weights:
                raise ValueError(f"site {ctx.site!r} has no selected model: no round was validated")
            model = ctx.task.new_model()
            load_weights(model, weights)
            return model
        if msg.meta.get("model") == local_model_name(ctx.site):
            return self.own_model(msg, ctx)
        return super().eval_model(msg, ctx)

    def after_evaluate(
        self, model: nn.Module, dice: np.ndarray, msg: Message, ctx: ClientContext
    ) -> dict[str, MetaValue]:
        if msg.meta.get(KEEP_BEST):
            data = ctx.data.split(str(msg.meta["split"]))
            score = site_dice(dice, data.ids, ctx.site, ctx.task.regions)
            if keep_if_better(ctx.state, SITE_BEST, model, score, ctx.round):
                self.on_kept(msg, ctx)
        if msg.meta.get(USE_BEST):
            return {SELECTED_ROUND: int(ctx.state[SITE_BEST + ROUND]), **self.selected_meta(ctx)}
        return {}

    def on_kept(self, msg: Message, ctx: ClientContext) -> None:
        """After the scored model (of ``msg``) became the site's kept one: what else to keep (default: nothing)."""

    def selected_meta(self, ctx: ClientContext) -> dict[str, MetaValue]:
        """More of the kept model's record for the test reply, besides its round (default: nothing)."""
        return {}

    def on_share_model(self, msg: Message, ctx: ClientContext) -> Message:
        """Reply with the site's selected model (empty before any validated round)."""
        return kept_model_reply(ctx, SITE_BEST)


class PerSiteServer(FedAvgServer):
    """Trains like FedAvg (subclasses change what differs); each site is validated and tested with its own model."""

    SELECTS_PER_SITE = True  # fedseg.run: restore the server's best-mean-round state only
    KEEPS_LOCAL_MODELS = False  # the sites' own models are the local models

    def __init__(self, engine, task, options):
        super().__init__(engine, task, options)
        self.selected_rounds: dict[str, int] = {}  # site -> round of its tested model (after the test)
        self.selected_models: dict[str, dict[str, torch.Tensor]] = {}  # site -> its tested model

    def site_model(self, site: str) -> str:
        return local_model_name(site)

    def site_weights(self, site: str) -> dict[str, torch.Tensor]:
        """What ``site`` needs from the server to assemble its current model (default: the global model)."""
        return self.global_weights

    def eval_messages(self, split: str, sample: bool) -> dict[str, Message]:
        messages = {}
        for s in self.engine.sites:
            meta: dict[str, MetaValue] = {
                "split": split,
                "model": self.site_model(s),
                "sample": sample,
                **surface_meta(split),
            }
            if split == "test":
                messages[s] = Message({}, {**meta, USE_BEST: True})
            else:
                messages[s] = Message(prefixed(MODEL, self.site_weights(s)), {**meta, KEEP_BEST: split == "val"})
        return messages

    def evaluate(self, split: str, sample: bool = False) -> list[dict]:
        """``val``: every site scores (and maybe keeps) its current model. ``test``: every site scores its
        kept model; then each kept model on every other site's test split (cross-site rows)."""
        replies = self.engine.exchange(self.eval_messages(split, sample), "evaluate", self.eval_reply_problem)
        rows = eval_rows(self.engine.algorithm, replies, self.task.regions)
        self.read_replies(split, replies)
        if split == "test":
            self.selected_models = collect_models(self.engine, weights_of(self.task.new_model()))
            rows += cross_site_rows(self.engine, self.task, self.selected_models, skip_own=True)
        return rows

    def eval_reply_problem(self, site: str, sent: Message, reply: Message) -> str | None:
        """A reply to the test (``USE_BEST``) names the round its kept model comes from: a round trained so far."""
        if not sent.meta.get(USE_BEST):
            return None
        rnd = reply.meta.get(SELECTED_ROUND)
        if isinstance(rnd, bool) or not isinstance(rnd, int) or not 1 <= rnd <= self.engine.round:
            return f"its {SELECTED_ROUND} = {rnd!r:.40} is not a round trained (1..{self.engine.round})"
        return None

    def read_replies(self, split: str, replies: dict[str, Message]) -> None:
        """What the server notes of the sites' ``evaluate`` replies on ``split``: the test's ``selected_round``s."""
        if split == "test":
            self.selected_rounds = {s: int(r.meta[SELECTED_ROUND]) for s, r in replies.items()}

    def bundle(self) -> dict[str, dict[str, torch.Tensor]]:
        """Every site's tested model, ``local:<site>`` (fetched now if the test has not run)."""
        models = self.selected_models or collect_models(self.engine, weights_of(self.task.new_model()))
        return {local_model_name(s): w for s, w in models.items()}
