"""FedAvg: broadcast -> local fit -> weighted merge. The base pair every method extends.

A method subclasses this pair (or one built on it) and overrides only what differs from FedAvg. This docstring is
the one list of what it may override and declare (docs/api.md and docs/contributing.md point here;
``tests/test_writing_a_method.py`` checks that it names every public method of the pair and every switch); the
helpers a method uses are gathered in :mod:`fedseg.algorithms.toolkit`.

Server hooks (``FedAvgServer``), in the order a round calls them:

- ``participants(rnd)``: the sites that train in round ``rnd`` (every site, or the ``fl.clients_per_round`` sample);
- ``train_message(site)``: what a site receives (``model/`` + the global weights);
- ``train_reply_problem(site, sent, reply)``: why a reply cannot be merged, beyond the engine's checks (call
  ``super()`` first);
- ``aggregate(replies)``: how the replies merge; sets ``self.global_weights`` (``{entry name: tensor}``) and returns
  nothing; FedAvg's also applies the robust ``aggregator`` (``OWN_MERGE`` below);
- ``aggregation_weights(replies)``: ``{site: p_k}`` (samples | uniform), read through
  ``checked_aggregation_weights(replies)`` (not a hook: the merges call it);
- ``average_buffers(replies)``: the buffers (BatchNorm statistics) set to FedAvg's average after ``aggregate``;
- ``run_round(rnd)``: the whole round (train exchange, ``aggregate``, ``average_buffers``); override only for a
  round of another shape (several exchanges, clusters), returning each site's mean training loss;
- ``round_metrics()``: the method's rows of ``round_metrics.csv`` after validation;
- ``selectable(rnd)``, ``convergence_scores(validated)``: which rounds may be the best one / judge convergence;
- ``finalize()``: last choices on validation data before the single test;
- ``summary_fields()``: the method's own entries of ``summary.json``;
- ``eval_messages(split, sample)``, ``eval_reply_problem(site, sent, reply)``, ``evaluate(split, sample)``,
  ``site_model(site)``: what is scored and under which model name;
- ``collect_local_models()``: the sites' kept best local models, for the cross-site test;
- ``state_dict()`` / ``load_state_dict(state)``: the server's state across rounds (tensors only; checkpoints,
  ``--resume``, the best round);
- ``bundle()``: the trained models to ship (``{model name: weights}``).

Client hooks (``FedAvgClient``; one object serves every site, what a site keeps goes to ``ctx.state``):

- ``handle(action, msg, ctx)``: dispatches to ``on_<action>(msg, ctx)``: ``on_train(msg, ctx)`` (``start_model``,
  ``fit``, ``keep_best_local``, ``after_fit``), ``on_evaluate(msg, ctx)``, ``on_share_model(msg, ctx)``; a method
  with an exchange of its own adds an ``on_<action>``;
- ``start_model(msg, ctx)``: the model a site starts from; ``reused_model(slot, weights, ctx)`` builds one (helper);
- ``train_hooks(model, msg, ctx)``: how local training differs, a :class:`fedseg.train.TrainHooks` (extra loss,
  gradient or step corrections, which parameters train, a custom forward);
- ``fit(model, msg, ctx, ...)``: one local training budget (call it to train another model through the same loop);
- ``keeps_optimizer_state(train, ctx)``: whether the optimizer moments carry over rounds;
- ``keep_best_local(model, ctx)``: keep the site's best local model (``eval.local_models``);
- ``after_fit(model, stats, msg, ctx)``: what a site replies (``super().after_fit`` is FedAvg's reply);
- ``eval_model(msg, ctx)``: the model a site is scored with; ``after_evaluate(model, dice, msg, ctx)``: extra
  reply metadata after scoring; ``eval_reply(...)``: the evaluation reply (helper).

Class-level switches, set on the class (each defaults to FedAvg's behaviour):

- ``FedAvgServer.KEEPS_LOCAL_MODELS`` (True): the sites keep their best local model for the cross-site test;
- ``FedAvgServer.SELECTS_PER_SITE`` (False): each site is tested at its own best validation round;
- ``FedAvgServer.NO_CLIENT_SAMPLING`` (None): why the method cannot train a sample of the sites per round;
- ``FedAvgServer.RETURNED_GROUPS`` (``("model",)``): the message groups every train reply returns;
- ``RobustOptions.OWN_MERGE`` (None), on the options model: why the method's merge is its own, so ``aggregator``
  accepts only ``mean``. A method whose options extend ``FedAvgOptions`` (so have ``aggregator``) and whose server
  overrides ``aggregate`` without merging through ``super().aggregate`` must set it: otherwise a run whose robust
  ``aggregator`` was not applied stops after the round's merge with a ``MethodError``, never silently;
- ``MethodOptions.ONE_STEP_AS_FEDAVG`` (None), on the options model: why the method trains exactly as FedAvg when
  a round is one local step (the run's note then); ``MethodOptions.ONE_STEP_EVERY_SITE`` (False): only where every
  site takes one step, every round (SCAFFOLD), and ``one_step_as_fedavg()`` where options can break it;
- ``MethodOptions.PHASED`` (False), on the options model: the method trains in phases whose first rounds cannot be
  selected (a bench's budget stops it only after them).

The options model's own hooks (``check_sites``, ``site_warnings``, ``check_task``, ``run_rounds``,
``local_budget``, ``run_note``) are :class:`fedseg.engine.context.MethodOptions`'.

Options (``FedAvgOptions``, config ``methods.<name>``) select the FedAvg variants of the FeTS
benchmark (section 3.2.2) per algorithm, so one run can compare them: ``weighting`` (samples |
uniform; None = ``fl.weighting``) and ``local_steps`` (U optimizer steps per round instead of
``train.budget``; None = ``train.budget``). ``fedavg-steps`` and ``fedavg-uniform`` are the same
pair registered with other option defaults. Methods extending the pair subclass these options.

Local models (``eval.local_models``: each site keeps its best model of its own training, scored on
every site's test split) live in :mod:`fedseg.algorithms.local_models`; the robust merges of
``aggregator`` (``RobustOptions``, part of ``FedAvgOptions``) in :mod:`fedseg.algorithms.robust`:
``FedAvgServer.aggregate`` merges through it, so every method that merges like FedAvg has them.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from typing import Literal

import numpy as np
import torch
from pydantic import Field
from torch import nn

from fedseg.algorithms.aggregate import weighted_average
from fedseg.algorithms.client_state import put_group, state_group
from fedseg.algorithms.local_models import (
    collect_models,
    cross_site_rows,
    keep_best_local,
    kept_model_reply,
)
from fedseg.algorithms.prefixes import GRAD_SCALE, MODEL, OPT
from fedseg.algorithms.registry import AlgorithmSpec
from fedseg.algorithms.robust import RobustOptions, robust_aggregator, robust_merge
from fedseg.algorithms.site_scoring import score_at_site, surface_meta, wants_surface, write_sample
from fedseg.config import BudgetConfig, RunConfig, TrainConfig
from fedseg.data.dataset import CaseSet
from fedseg.engine.base import Engine
from fedseg.engine.context import ClientContext, MethodOptions, ReusedModels, Task
from fedseg.engine.faults import MethodError
from fedseg.engine.messages import Message, MetaValue, prefixed, weights_of
from fedseg.engine.sampling import sample_sites
from fedseg.evaluate.tables import eval_rows
from fedseg.train import (
    LossFn,
    Trainer,
    TrainHooks,
    TrainStats,
    grad_scale_from,
    grad_scale_tensor,
    load_optimizer_state,
    optimizer_state,
    round_train_config,
)


class BudgetOptions(MethodOptions):
    """Local-budget option shared by every method built on the FedAvg pair."""

    local_steps: int | None = Field(
        None, ge=1, description="U optimizer steps per round (FedAvg w/ fixed iterations); None = train.budget"
    )

    def local_budget(self) -> BudgetConfig | None:
        """``local_steps`` steps if set, else None (the Trainer's own ``budget``, i.e. ``train.budget``)."""
        return BudgetConfig(unit="steps", amount=self.local_steps) if self.local_steps else None


class FedAvgOptions(RobustOptions, BudgetOptions):
    """FedAvg variants (FeTS section 3.2.2): fixed epochs (default), fixed iterations, uniform averaging;
    the merge's ``aggregator`` (mean, krum, multikrum, bulyan, clipped: ``RobustOptions``)."""

    weighting: Literal["samples", "uniform"] | None = Field(
        None, description="p_k = n_k / N (samples) or 1 / K (uniform); None = fl.weighting"
    )


class FedAvgStepsOptions(FedAvgOptions):
    """``fedavg-steps``: U local steps per site and round, samples-weighted. U = 10 as in the FeTS 2022
    benchmark (Sec. 4.4.8: "we fixed the number of local iterations to 10", with 720 rounds against the
    epoch-based methods' 300: give it ``fl.rounds`` or a ``budget`` accordingly)."""

    local_steps: int | None = Field(10, ge=1)


class FedAvgUniformOptions(FedAvgOptions):
    """``fedavg-uniform``: fixed epochs, uniform averaging (p_k = 1 / K)."""

    weighting: Literal["samples", "uniform"] | None = "uniform"


class FedAvgClient:
    """Trains the received model on the site's train split and replies with its weights."""

    def handle(self, action: str, msg: Message, ctx: ClientContext) -> Message:
        handler = getattr(self, f"on_{action}", None)
        if handler is None:
            raise ValueError(f"{type(self).__name__} has no handler for action {action!r}")
        return handler(msg, ctx)

    # --- training ----------------------------------------------------------------
    def on_train(self, msg: Message, ctx: ClientContext) -> Message:
        model = self.start_model(msg, ctx)
        stats = self.fit(model, msg, ctx)
        self.keep_best_local(model, ctx)
        return self.after_fit(model, stats, msg, ctx)

    def keep_best_local(self, model: nn.Module, ctx: ClientContext) -> None:
        """Keep the just-trained ``model`` if it is the site's best local model so far
        (:func:`fedseg.algorithms.local_models.keep_best_local`); a method without local models does nothing."""
        keep_best_local(model, ctx)

    def on_share_model(self, msg: Message, ctx: ClientContext) -> Message:
        """Reply with the site's kept best local model (empty if it has none)."""
        return kept_model_reply(ctx)

    def start_model(self, msg: Message, ctx: ClientContext) -> nn.Module:
        return self.reused_model("start", msg.group(MODEL), ctx)

    def reused_model(self, slot: str, weights: dict[str, torch.Tensor], ctx: ClientContext) -> nn.Module:
        """The segmentation network with ``weights``: this client's network of ``slot``, reused from message to
        message (``fedseg.engine.context.ReusedModels``: equal to a fresh ``ctx.task.new_model()`` with the weights
        loaded). Only for a network that is not kept after the message; one slot per network alive at once."""
        return reused_models(self).get(slot, (ctx.task,), ctx.task.new_model, weights)

    def fit(
        self,
        model: nn.Module,
        msg: Message,
        ctx: ClientContext,
        state_key: str = OPT,
        data=None,
        loss_fn: LossFn | None = None,
        train_cfg: TrainConfig | None = None,
        budget: BudgetConfig | None = None,
        hooks: TrainHooks | None = None,
        generator: torch.Generator | None = None,
    ) -> TrainStats:
        """One local training budget through the Trainer, optimizer moments kept in client state if configured.

        ``data`` (default: the site's train split), ``loss_fn`` (default: the segmentation loss) and
        ``train_cfg`` (default: ``cfg.train``) let a method train another model through the same
        loop, e.g. FedSM's selector with cross-entropy on (image, site index) at its own learning rate;
        ``budget`` (default: the round's local budget) e.g. FedSM's fine-tuning epochs; ``hooks``
        (default: ``self.train_hooks``) how this training differs from plain training; ``generator``
        (default: the site's stream ``ctx.generator``) the batch order's random stream.
        The Trainer's rate is the round's (``train.lr_schedule``, ``fedseg.train.round_lr``): ``train_cfg.lr``
        scaled by the schedule's factor for round ``ctx.round`` of ``fl.rounds``.
        """
        trainer = Trainer(round_train_config(ctx.cfg.train, ctx.round, ctx.cfg.fl.rounds, train_cfg), ctx.task.device)
        hooks = self.train_hooks(model, msg, ctx) if hooks is None else hooks
        optimizer = trainer.new_optimizer(model, hooks)
        keep = self.keeps_optimizer_state(trainer.cfg, ctx)
        if keep and state_group(ctx.state, state_key):
            load_optimizer_state(optimizer, state_group(ctx.state, state_key))
        scale_key = f"{GRAD_SCALE}/{state_key}"  # fp16: the scaler's state carried to the next round
        stats = trainer.fit(
            model,
            ctx.data.train if data is None else data,
            ctx.generator if generator is None else generator,
            optimizer,
            budget=budget or ctx.options.local_budget(),
            hooks=hooks,
            loss_fn=loss_fn,
            grad_scale=grad_scale_from(ctx.state.get(scale_key)),
        )
        if keep:
            put_group(ctx.state, state_key, optimizer_state(optimizer))
        if stats.grad_scale is not None:
            ctx.state[scale_key] = grad_scale_tensor(stats.grad_scale)
        return stats

    def keeps_optimizer_state(self, train: TrainConfig, ctx: ClientContext) -> bool:
        """Whether ``fit`` carries the optimizer moments across rounds (default: ``train.keep_optimizer_state``)."""
        return train.keep_optimizer_state

    def train_hooks(self, model: nn.Module, msg: Message, ctx: ClientContext) -> TrainHooks:
        """How this method's local training of ``model`` differs from plain training (FedAvg: it does not)."""
        return TrainHooks()

    def after_fit(self, model: nn.Module, stats: TrainStats, msg: Message, ctx: ClientContext) -> Message:
        return Message(prefixed(MODEL, weights_of(model)), train_meta(stats, ctx))

    # --- evaluation --------------------------------------------------------------
    def on_evaluate(self, msg: Message, ctx: ClientContext) -> Message:
        """Score the model on ``meta.split``; reply with per-case Dice/HD95/NSD ``(N, R)`` and case ids
        (HD95/NSD NaN unless ``meta.surface``: :func:`wants_surface`).

        With ``meta.sample = True`` the site also writes one example prediction to its own
        artifacts folder (images never travel in a message).
        """
        model = self.eval_model(msg, ctx)
        data = ctx.data.split(str(msg.meta["split"]))
        first_logits: list[torch.Tensor] | None = [] if writes_sample(msg, ctx, data) else None  # the sample's case
        scores = score_at_site(model, data, ctx, wants_surface(msg, ctx), first_logits)
        tensors = {m: torch.from_numpy(v) for m, v in scores.items()}
        extra = self.after_evaluate(model, scores["dice"], msg, ctx)
        return self.eval_reply(tensors, model, data, msg, ctx, extra, first_logits[0] if first_logits else None)

    def eval_reply(
        self,
        tensors: dict[str, torch.Tensor],
        model: nn.Module,
        data: CaseSet,
        msg: Message,
        ctx: ClientContext,
        extra: Mapping[str, MetaValue] | None = None,
        sample_logits: torch.Tensor | None = None,
    ) -> Message:
        """The evaluation reply every method sends: its per-case ``tensors`` (first axis: ``data``'s cases) with the
        case ids, the model and split it answers for (what ``fedseg.engine.faults.scores_problem`` checks), and
        ``extra`` metadata; with ``meta.sample`` the site first writes ``model``'s example prediction to its own
        artifacts folder (images never travel in a message), from ``sample_logits`` where scoring kept the first
        case's (volumes: not predicted twice)."""
        if writes_sample(msg, ctx, data):
            write_sample(model, data, ctx, str(msg.meta["model"]), sample_logits)
        meta: dict[str, MetaValue] = {
            "cases": json.dumps(data.ids),
            "model": str(msg.meta["model"]),
            "split": str(msg.meta["split"]),
            **(extra or {}),
        }
        return Message(tensors, meta)

    def after_evaluate(
        self, model: nn.Module, dice: np.ndarray, msg: Message, ctx: ClientContext
    ) -> dict[str, MetaValue]:
        """What a site does after scoring ``model`` (per-case Dice ``(N, R)``): extra reply metadata
        (default: nothing; per-site selection keeps its best model, ``fedseg.algorithms.persite``)."""
        return {}

    def eval_model(self, msg: Message, ctx: ClientContext) -> nn.Module:
        """The model to score: the one in the message (a global or another site's model)."""
        return self.reused_model("eval", msg.group(MODEL), ctx)


def writes_sample(msg: Message, ctx: ClientContext, data: CaseSet) -> bool:
    """Whether a site answering evaluate message ``msg`` on ``data`` writes its example prediction (``meta.sample``,
    an artifacts folder of its own and a case to show)."""
    return bool(msg.meta.get("sample")) and ctx.artifacts is not None and len(data) > 0


def train_losses(replies: Mapping[str, Message]) -> dict[str, float]:
    """Each site's mean local training loss in a train exchange (``meta.loss``, checked as a number by the engine:
    ``fedseg.engine.faults.loss_problem``; NaN where a reply holds none): what ``run_round`` returns."""
    return {site: float(reply.meta.get("loss", math.nan)) for site, reply in replies.items()}


def weighting_of(options: object, cfg: RunConfig) -> Literal["samples", "uniform"]:
    """A method's aggregation weighting: its own ``weighting`` option (``FedAvgOptions``) if set, else
    ``fl.weighting``: the one rule of the server's merge, of the weights secure aggregation sends, and of the
    weight a site accepts there (``fedseg.flower.secure``)."""
    own = options.weighting if isinstance(options, FedAvgOptions) else None
    return own or cfg.fl.weighting


def reused_models(client: object) -> ReusedModels:
    """``client``'s reused networks (made on first use: clients are built without arguments)."""
    held = client.__dict__.get("_reused_models")
    if held is None:
        held = client.__dict__["_reused_models"] = ReusedModels()
    return held


def train_meta(stats: TrainStats, ctx: ClientContext) -> dict[str, MetaValue]:
    return {
        "steps": stats.steps,
        "samples": stats.samples,
        "loss": stats.mean_loss,
        "num_examples": len(ctx.data.train),
    }


class FedAvgServer:
    """Holds the global model; each round broadcasts it, collects local models and averages them."""

    # Whether this method's sites keep their best local model (FedAvgClient.keep_best_local): False
    # where no site trains a model of its own in ``train`` (centralized), where the local models are
    # the method's own (local) or where the client trains otherwise (the FedSM family).
    KEEPS_LOCAL_MODELS = True
    RETURNED_GROUPS: tuple[str, ...] = (MODEL,)  # groups of a train message every reply returns (train_reply_problem)
    # Whether each site is tested with its own model at its own best validation round
    # (fedseg.algorithms.persite); False: every site at the round with the best mean validation Dice.
    SELECTS_PER_SITE = False
    # Client sampling (fl.clients_per_round, ``participants``): None if this method may train a sample of
    # the sites per round, else why it cannot (checked before any work: ``sampling_refusal``).
    NO_CLIENT_SAMPLING: str | None = None
    # What a server made without ``__init__`` (a bare merge, e.g. in a test) merges with: no options
    # (FedAvg's weighted mean at ``fl.weighting``), errors naming "fedavg", no robust rows yet.
    options: MethodOptions = MethodOptions()
    algorithm = "fedavg"
    robust_rows: Sequence[dict] = ()

    def __init__(self, engine: Engine, task: Task, options: MethodOptions):
        self.engine = engine
        self.task = task
        self.options = options
        if engine is not None:
            self.algorithm = engine.algorithm  # the name the run knows the method by (error messages)
        model = task.new_model()
        self.global_weights = weights_of(model)
        self.buffers = sorted(set(self.global_weights) - {name for name, _ in model.named_parameters()})
        self.local_models: dict[str, dict[str, torch.Tensor]] = {}  # site -> its best local model, for the test
        self.robust_rows = []  # round_metrics rows of the last robust merge (aggregator != mean)

    # --- one round ---------------------------------------------------------------
    def run_round(self, rnd: int) -> dict[str, float]:
        """Train one round on this round's ``participants``; return the mean local training loss per site."""
        messages = {s: self.train_message(s) for s in self.participants(rnd)}
        replies = self.engine.exchange(messages, "train", self.train_reply_problem)
        self.robust_rows = []  # set again by this round's robust merge, if any (checked below)
        returned: object = self.aggregate(replies)  # type: ignore[func-returns-value]
        if returned is not None:  # a merge returned, not kept: the global model would never change
            raise MethodError(
                f"{self.algorithm}, round {rnd}: {type(self).__name__}.aggregate returned a {type(returned).__name__}; "
                "it returns nothing and sets self.global_weights to the merged model"
            )
        robust = robust_aggregator(self.options)
        if robust is not None and not self.robust_rows:  # an aggregate of its own, without OWN_MERGE
            raise MethodError(
                f"{self.algorithm}, round {rnd}: methods.{self.algorithm}.aggregator = {robust.aggregator} was not "
                f"applied: {type(self).__name__}.aggregate merges without FedAvgServer.aggregate's robust merge; "
                "set OWN_MERGE (why) on the method's options model, which then accepts only 'mean', or merge through "
                "super().aggregate(replies)"
            )
        self.average_buffers(replies)
        return train_losses(replies)

    def participants(self, rnd: int) -> list[str]:
        """The sites that train in round ``rnd``: every site, or the ``fl.clients_per_round`` sample drawn
        from (seed, round) only (``fedseg.engine.sampling``); the others' state stores are not touched."""
        cfg = self.task.cfg
        return sample_sites(self.engine.sites, cfg.fl.clients_per_round, cfg.seed, rnd)

    def average_buffers(self, replies: dict[str, Message]) -> None:
        """Set the model's buffers (entries that are not parameters: BatchNorm's ``running_mean``,
        ``running_var``, ``num_batches_tracked``) to FedAvg's weighted average of the sites' values,
        whatever ``aggregate`` did with them. They are statistics, not weights: a server optimizer
        step (FedAdam would move them by ``eta_s`` per round), a server rate above 1 (FedNova's
        gamma could make a variance negative) or a median is not meant for them. A no-op for models
        without buffers (the default instance norm) and for replies that carry no model (q-FedAvg's
        replies carry updates: there the buffers follow Eq. 17 with the weights)."""
        keys = [f"{MODEL}/{b}" for b in self.buffers]
        if not keys or any(k not in r.tensors for r in replies.values() for k in keys):
            return
        weights = self.checked_aggregation_weights(replies)
        sites = list(replies)
        stats = weighted_average(
            [{b: replies[s].tensors[k] for b, k in zip(self.buffers, keys)} for s in sites], [weights[s] for s in sites]
        )
        self.global_weights = {**self.global_weights, **stats}

    def train_message(self, site: str) -> Message:
        return Message(prefixed(MODEL, self.global_weights))

    def train_reply_problem(self, site: str, sent: Message, reply: Message) -> str | None:
        """Why ``aggregate`` cannot use ``site``'s reply to the train message ``sent``, beyond the engine's own checks
        (names, shapes and dtypes of what was sent, NaN/Inf, n_k, steps: ``fedseg.engine.faults``): a method that
        reads tensors or numbers it did not send checks them here (calling this first). FedAvg's: every group of
        :attr:`RETURNED_GROUPS` that was sent comes back (the engine checks a group both hold is whole; a group left
        out was a KeyError naming no site in the merge), and the reply reports its ``num_examples`` (n_k, which the
        engine checks against the site's declared training set)."""
        for group in self.RETURNED_GROUPS:
            if sent.group(group) and not reply.group(group):
                return f"it returned no {group}/ tensors ({len(sent.group(group))} sent)"
        if "num_examples" not in reply.meta:
            return "it reports no num_examples (its aggregation weight n_k)"
        return None

    def aggregate(self, replies: dict[str, Message]) -> None:
        """FedAvg's weighted average, or the robust merge of ``options.aggregator`` (module docstring)."""
        sites = list(replies)
        weights = self.checked_aggregation_weights(replies)
        models, p = [replies[s].group(MODEL) for s in sites], [weights[s] for s in sites]
        robust = robust_aggregator(self.options)
        if robust is None:
            self.global_weights = weighted_average(models, p)
            return
        merge = robust_merge(robust, self.global_weights, models, p, self.algorithm)
        self.global_weights, self.robust_rows = merge.weights, merge.rows(sites)

    def checked_aggregation_weights(self, replies: dict[str, Message]) -> dict[str, float]:
        """``aggregation_weights``, checked (the merges call this): a mapping with a finite number >= 0 for every
        site that replied; a ``MethodError`` naming the method otherwise."""
        weights: object = self.aggregation_weights(replies)
        rnd = getattr(getattr(self, "engine", None), "round", None)  # None: a bare merge (class attributes above)
        when = f", round {rnd}" if rnd is not None else ""
        where = f"{self.algorithm}{when}: {type(self).__name__}.aggregation_weights returned"
        if not isinstance(weights, Mapping):
            raise MethodError(f"{where} a {type(weights).__name__}; it returns {{site: weight}} for the replies' sites")
        missing = [s for s in replies if s not in weights]
        if missing:
            raise MethodError(f"{where} no weight for site {missing[0]!r}; it returns {{site: weight}} for every reply")
        bad = {s: weights[s] for s in replies if not _usable_weight(weights[s])}
        if bad:
            site, value = next(iter(bad.items()))
            raise MethodError(f"{where} {value!r} for site {site!r}; a weight is a finite number >= 0")
        checked = {s: float(weights[s]) for s in replies}
        if replies and not sum(checked.values()) > 0:
            raise MethodError(f"{where} {checked}; the weights of the sites that replied must not all be 0")
        return checked

    def aggregation_weights(self, replies: dict[str, Message]) -> dict[str, float]:
        """``samples``: n_k (the site's training-set size, as it reports); ``uniform``: 1 per site.
        ``options.weighting`` if set, else ``fl.weighting``."""
        if weighting_of(self.options, self.task.cfg) == "uniform":
            return {s: 1.0 for s in replies}
        return {s: float(r.meta["num_examples"]) for s, r in replies.items()}

    def round_metrics(self) -> list[dict]:
        """Method-specific metrics of the round just validated: rows ``{site, metric, value}``
        written to ``round_metrics.csv`` (e.g. FedSM's selector accuracy). Default: none; with a robust
        ``aggregator``, its per-site rows (module docstring)."""
        return list(self.robust_rows)

    def selectable(self, rnd: int) -> bool:
        """Whether round ``rnd``'s models may be chosen as the best round (on validation Dice)."""
        return True

    def convergence_scores(self, validated: dict[int, float]) -> dict[int, float]:
        """The validation curve (round -> mean validation Dice) whether the run converged is judged on
        (``fedseg.run.stopping.convergence``): its selectable rounds'."""
        return {rnd: score for rnd, score in validated.items() if self.selectable(rnd)}

    def finalize(self) -> None:
        """After the best round is restored and before the single test evaluation: last choices
        made on validation data only (e.g. FedSM's threshold gamma). Default: nothing."""

    def summary_fields(self) -> dict:
        """This server's own entries of its ``summary.json`` record (e.g. fedavg-dp's ``privacy``). Default: none."""
        return {}

    # --- evaluation --------------------------------------------------------------
    def site_model(self, site: str) -> str:
        """Name of the model ``site`` would actually use (what its summary numbers report)."""
        return "global"

    def eval_messages(self, split: str, sample: bool) -> dict[str, Message]:
        meta: dict[str, MetaValue] = {"split": split, "model": "global", "sample": sample, **surface_meta(split)}
        return {s: Message(prefixed(MODEL, self.global_weights), dict(meta)) for s in self.engine.sites}

    def eval_reply_problem(self, site: str, sent: Message, reply: Message) -> str | None:
        """Why the server cannot read ``site``'s evaluation reply beyond its scores (the engine checks those:
        ``fedseg.engine.faults.scores_problem``): a method that reads other numbers of it checks them here. None:
        FedAvg reads only the scores."""
        return None

    def evaluate(self, split: str, sample: bool = False) -> list[dict]:
        """Score on every site's ``split``; tidy rows ``algorithm, model, site, case, region, metric, value``.
        The test adds the cross-site rows of the collected local models (``collect_local_models``)."""
        replies = self.engine.exchange(self.eval_messages(split, sample), "evaluate", self.eval_reply_problem)
        rows = eval_rows(self.engine.algorithm, replies, self.task.regions)
        if split == "test" and self.local_models:
            rows += cross_site_rows(self.engine, self.task, self.local_models)
        return rows

    # --- local models (fedseg.algorithms.local_models) ------------------------------
    def collect_local_models(self) -> None:
        """Fetch every site's kept best local model for the test's cross-site rows. The run calls
        this after the last round and before it restores the best global round's client states
        (which would put back each site's best only up to that round). Nothing is exchanged when
        the method keeps none (``KEEPS_LOCAL_MODELS``) or ``eval.local_models`` is off."""
        keeps = self.KEEPS_LOCAL_MODELS and self.task.cfg.eval.local_models
        self.local_models = collect_models(self.engine, weights_of(self.task.new_model())) if keeps else {}

    # --- state -------------------------------------------------------------------
    def state_dict(self) -> dict[str, torch.Tensor]:
        return prefixed("global", self.global_weights)

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        self.global_weights = Message(state).group("global")

    def bundle(self) -> dict[str, dict[str, torch.Tensor]]:
        """The trained models to ship: ``{model name: weights}``."""
        return {"global": self.global_weights}


SPECS = (
    AlgorithmSpec(
        "fedavg",
        "FedAvg",
        FedAvgServer,
        FedAvgClient,
        "FedAvg (McMahan et al.): weighted (samples | uniform) averaging of local models",
        FedAvgOptions,
        on_secure_aggregation=None,
    ),
    AlgorithmSpec(
        "fedavg-steps",
        "FedAvg (fixed steps)",
        FedAvgServer,
        FedAvgClient,
        "FedAvg with fixed local iterations (U steps per site and round, FeTS 3.2.2)",
        FedAvgStepsOptions,
        on_secure_aggregation=None,
    ),
    AlgorithmSpec(
        "fedavg-uniform",
        "FedAvg (uniform)",
        FedAvgServer,
        FedAvgClient,
        "FedAvg with fixed local epochs and uniform averaging (FeTS 3.2.2)",
        FedAvgUniformOptions,
        on_secure_aggregation=None,
    ),
)


def _usable_weight(value: object) -> bool:
    """Whether ``value`` is a finite real number >= 0 (a bool is no weight)."""
    try:
        number = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return False
    return not isinstance(value, bool) and math.isfinite(number) and number >= 0
