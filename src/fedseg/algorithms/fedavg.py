"""FedAvg: broadcast -> local fit -> weighted merge. The base pair every method extends.

Server hooks: ``train_message`` (what a site receives), ``aggregate`` (how replies merge),
``aggregation_weights`` (samples | uniform), ``eval_message`` and ``site_model``.
Client hooks: ``start_model`` (the model a site starts from), ``train_hooks`` (how local
training differs: a :class:`fedseg.train.TrainHooks` handed to the Trainer), ``after_fit`` (what
a site replies), ``eval_model`` (the model a site is evaluated with).

Options (``FedAvgOptions``, config ``methods.<name>``) select the FedAvg variants of the FeTS
benchmark (section 3.2.2) per algorithm, so one run can compare them: ``weighting`` (samples |
uniform; None = ``fl.weighting``) and ``local_steps`` (U optimizer steps per round instead of
``train.budget``; None = ``train.budget``). ``fedavg-steps`` and ``fedavg-uniform`` are the same
pair registered with other option defaults. Methods extending the pair subclass these options.

Local models (Auto-FedAvg Table 2, "local avg" / "local gen"; config ``eval.local_models``): in
every validated round (``fl.validate_every``, and the last) a site scores the model it holds right
after its local training on its own validation split, inside its ``train`` handling (no extra
message; the compute counts in the train rows' seconds, so also in a measured ``t_batch``), and
keeps it in its state store (``localbest/`` weights, ``localbest_score``, ``localbest_round``)
when it beats its best so far (``FedAvgClient.keep_best_local``; no random numbers drawn). At test
time the server scores every site's kept model on every site's test split (rows ``model =
"local:<site>"``, :meth:`FedAvgServer.cross_site_rows`, shared with ``local``), which
``fedseg.run.summarize`` turns into ``cross_site`` / ``local_avg`` / ``local_gen``. A client that
overrides ``on_train`` without calling ``keep_best_local`` (the FedSM family) has no local models.

The best global round's restore (``fedseg.run.run_algorithm``) puts back the client states of that
round, whose kept models are only the best up to it. So the run asks the server to collect the
kept models (``collect_local_models``: one ``share_model`` exchange, evaluation traffic) after the
last round and *before* that restore: each site's model is then its best over all rounds. The
kept model lives in the checkpointed client state, so a resumed run collects the same models.

Robust aggregation (``aggregator``, :class:`fedseg.algorithms.robust.RobustOptions`, part of
``FedAvgOptions``): ``mean`` (default: ``weighted_average``, unchanged) | ``krum`` | ``multikrum`` |
``bulyan`` | ``clipped``, with ``num_malicious`` (f), ``multikrum_keep`` (m) and ``clip_norm`` (C).
``FedAvgServer.aggregate`` dispatches on it, so every method that merges through it has it (fedprox,
ditto's global model, fedper, lg-fedavg, ...); methods whose merge is their own refuse anything but
``mean`` (``RobustOptions.OWN_MERGE``). Buffers stay FedAvg's weighted average (``average_buffers``).
With a robust aggregator, ``round_metrics`` reports per site ``update_norm`` and ``robust_kept``
(Krum, Multi-Krum, Bulyan) or ``clip_factor`` (clipped) of the last merge.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Literal

import numpy as np
import torch
from pydantic import BaseModel, ConfigDict, Field
from torch import nn

from fedseg.algorithms.aggregate import weighted_average
from fedseg.algorithms.registry import AlgorithmSpec
from fedseg.algorithms.robust import RobustOptions, robust_merge
from fedseg.config import BudgetConfig, TrainConfig
from fedseg.data.dataset import CaseSet
from fedseg.engine.context import ClientContext, ReusedModels, State, Task
from fedseg.engine.messages import Message, MetaValue, prefixed, weights_of
from fedseg.engine.sampling import sample_sites
from fedseg.evaluate.inference import sample_prediction, score_caseset
from fedseg.evaluate.metrics import Scores
from fedseg.evaluate.tables import eval_rows, site_dice
from fedseg.train import (
    LossFn,
    Trainer,
    TrainHooks,
    TrainStats,
    load_optimizer_state,
    optimizer_state,
    round_train_config,
)

MODEL = "model"  # message prefix of model weights
OPT = "opt"  # client-state prefix of optimizer moments
LOCAL_BEST = "localbest"  # client-state prefix of the site's best local model (weights)
SCORE, ROUND = "_score", "_round"  # suffixes of a kept model's entries: validation Dice float64 (), round int64 ()
LOCAL_BEST_SCORE = LOCAL_BEST + SCORE  # client-state entry: the kept local model's validation Dice
LOCAL_BEST_ROUND = LOCAL_BEST + ROUND  # client-state entry: the round it was trained in
SHARE_MODEL = "share_model"  # the action that uploads a site's own model (evaluation traffic)
SURFACE = "surface"  # evaluate meta (bool): also compute HD95 and NSD (with eval.hd95); absent = Dice only


def surface_meta(split: str) -> dict[str, MetaValue]:
    """The ``surface`` entry of an evaluate message scoring a method's own model on ``split``: HD95/NSD only
    for the test (the tables report them for it); validation selects on Dice alone. The site decides nothing
    itself, so every engine (simulator, worker pool, Flower) scores the same metrics."""
    return {SURFACE: split == "test"}


def wants_surface(msg: Message, ctx: ClientContext) -> bool:
    """Whether an evaluate message asks for HD95/NSD: its ``surface`` meta and ``eval.hd95``."""
    return bool(msg.meta.get(SURFACE, False)) and ctx.cfg.eval.hd95


def local_model_name(site: str) -> str:
    """Name of ``site``'s locally trained model in result rows (``local``'s naming)."""
    return f"local:{site}"


def validated_round(rnd: int, cfg) -> bool:
    """Whether the run validates round ``rnd`` (``fl.validate_every`` and always the last)."""
    return rnd % cfg.fl.validate_every == 0 or rnd == cfg.fl.rounds


class BudgetOptions(BaseModel):
    """Local-budget option shared by every method built on the FedAvg pair."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    local_steps: int | None = Field(
        None, ge=1, description="U optimizer steps per round (FedAvg w/ fixed iterations); None = train.budget"
    )


class FedAvgOptions(RobustOptions, BudgetOptions):
    """FedAvg variants (FeTS section 3.2.2): fixed epochs (default), fixed iterations, uniform averaging;
    the merge's ``aggregator`` (mean, krum, multikrum, bulyan, clipped: ``RobustOptions``)."""

    weighting: Literal["samples", "uniform"] | None = Field(
        None, description="p_k = n_k / N (samples) or 1 / K (uniform); None = fl.weighting"
    )


class FedAvgStepsOptions(FedAvgOptions):
    """``fedavg-steps``: U local steps per site and round, samples-weighted. The paper does not
    state its U; 20 is about one epoch of the mean synthetic-retina site at batch 8."""

    local_steps: int | None = Field(20, ge=1)


class FedAvgUniformOptions(FedAvgOptions):
    """``fedavg-uniform``: fixed epochs, uniform averaging (p_k = 1 / K)."""

    weighting: Literal["samples", "uniform"] | None = "uniform"


def local_budget(options) -> BudgetConfig | None:
    """The local budget of one round: ``options.local_steps`` steps if the method's options set it,
    else None (the Trainer's own ``budget``, i.e. ``train.budget``)."""
    steps = getattr(options, "local_steps", None)
    return BudgetConfig(unit="steps", amount=steps) if steps else None


def state_group(state: State, prefix: str) -> dict[str, torch.Tensor]:
    """Entries of a client state store under ``prefix/``, prefix stripped."""
    head = prefix + "/"
    return {k[len(head) :]: v for k, v in state.items() if k.startswith(head)}


def keep_if_better(state: State, prefix: str, model: nn.Module, score: float, rnd: int) -> bool:
    """Keep ``model``'s weights under ``prefix/`` in a client state store, with ``score`` (a mean
    validation Dice) and round ``rnd`` (``prefix_score``, ``prefix_round``), if ``score`` beats the
    kept one. A NaN score ranks below every number; ties keep the earlier round. Returns whether it kept."""
    best = state.get(prefix + SCORE)
    low = lambda x: -math.inf if math.isnan(x) else x  # noqa: E731
    if best is not None and not low(score) > low(float(best)):
        return False
    put_group(state, prefix, weights_of(model))
    state[prefix + SCORE] = torch.tensor(score, dtype=torch.float64)
    state[prefix + ROUND] = torch.tensor(rnd, dtype=torch.int64)
    return True


def put_group(state: State, prefix: str, tensors: dict[str, torch.Tensor]) -> None:
    """Replace the ``prefix/`` entries of a client state store by ``tensors``."""
    for key in [k for k in state if k.startswith(prefix + "/")]:
        del state[key]
    state.update(prefixed(prefix, tensors))


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
        """Score the just-trained ``model`` on the site's validation split and keep it in the state
        store if it beats the best so far (see the module docstring; ``eval.local_models``).

        Only in validated rounds. The score is the site's mean validation Dice as the run's
        selection computes it (``score_caseset`` at ``cfg.eval`` without HD95; per case the mean
        over regions, NaN not counted; then the mean over cases). A NaN score ranks below every
        number; ties keep the earlier round. Runs inside the train handling: its time is in the
        train row's seconds. Draws no random numbers; leaves ``model``'s train/eval mode as it was.
        """
        cfg = ctx.cfg
        if not (cfg.eval.local_models and validated_round(ctx.round, cfg)):
            return
        data, ev, training = ctx.data.val, cfg.eval, model.training
        dice = score_caseset(model, data, ev.batch_size, ev.threshold, False, ctx.task.device)["dice"]
        model.train(training)
        keep_if_better(ctx.state, LOCAL_BEST, model, site_dice(dice, data.ids, ctx.site, ctx.task.regions), ctx.round)

    def on_share_model(self, msg: Message, ctx: ClientContext) -> Message:
        """Reply with the site's kept best local model (empty if it has none)."""
        return Message(prefixed(MODEL, state_group(ctx.state, LOCAL_BEST)))

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
        stats = trainer.fit(
            model,
            ctx.data.train if data is None else data,
            ctx.generator if generator is None else generator,
            optimizer,
            budget=budget or local_budget(ctx.options),
            hooks=hooks,
            loss_fn=loss_fn,
        )
        if keep:
            put_group(ctx.state, state_key, optimizer_state(optimizer))
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
        scores = score_at_site(model, data, ctx, wants_surface(msg, ctx))
        if msg.meta.get("sample") and ctx.artifacts is not None and len(data):
            write_sample(model, data, ctx, str(msg.meta["model"]))
        meta: dict[str, MetaValue] = {
            "cases": json.dumps(data.ids),
            "model": str(msg.meta["model"]),
            "split": str(msg.meta["split"]),
            **self.after_evaluate(model, scores["dice"], msg, ctx),
        }
        return Message({m: torch.from_numpy(v) for m, v in scores.items()}, meta)

    def after_evaluate(self, model: nn.Module, dice: np.ndarray, msg: Message, ctx: ClientContext) -> dict:
        """What a site does after scoring ``model`` (per-case Dice ``(N, R)``): extra reply metadata
        (default: nothing; per-site selection keeps its best model, ``fedseg.algorithms.persite``)."""
        return {}

    def eval_model(self, msg: Message, ctx: ClientContext) -> nn.Module:
        """The model to score: the one in the message (a global or another site's model)."""
        return self.reused_model("eval", msg.group(MODEL), ctx)


def reused_models(client: object) -> ReusedModels:
    """``client``'s reused networks (made on first use: clients are built without arguments)."""
    held = client.__dict__.get("_reused_models")
    if held is None:
        held = client.__dict__["_reused_models"] = ReusedModels()
    return held


def score_at_site(model: nn.Module, data: CaseSet, ctx: ClientContext, surface: bool) -> Scores:
    """``score_caseset`` of ``model`` on ``data`` at the run's ``eval`` settings on the site's device: Dice
    ``(N, R)``, and HD95/NSD when ``surface`` (else NaN)."""
    ev = ctx.cfg.eval
    return score_caseset(
        model,
        data,
        ev.batch_size,
        ev.threshold,
        surface,
        ctx.task.device,
        ev.hd95_worst,
        ctx.task.nsd_tolerances,
        ev.surface_device,
    )


def train_meta(stats: TrainStats, ctx: ClientContext) -> dict:
    return {
        "steps": stats.steps,
        "samples": stats.samples,
        "loss": stats.mean_loss,
        "num_examples": len(ctx.data.train),
    }


def write_sample(model: nn.Module, data, ctx: ClientContext, model_name: str) -> None:
    """Write the site's first case with its prediction: ``samples/<algorithm>__<site>.npz`` (2D; 3D: middle slice)."""
    image, truth, pred = sample_prediction(model, data, ctx.cfg.eval.threshold, ctx.task.device)
    if image.dim() == 4:  # (C, D, H, W): keep the middle slice
        mid = image.shape[1] // 2
        image, truth, pred = image[:, mid], truth[:, mid], pred[:, mid]
    assert ctx.artifacts is not None  # callers check
    ctx.artifacts.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(
        Path(ctx.artifacts) / f"{ctx.algorithm}__{ctx.site}.npz",
        image=image.numpy().astype(np.float32),
        truth=truth.numpy().astype(np.uint8),
        pred=pred.numpy().astype(np.uint8),
        case=np.array(data.ids[0]),
        model=np.array(model_name),
    )


class FedAvgServer:
    """Holds the global model; each round broadcasts it, collects local models and averages them."""

    # Whether this method's sites keep their best local model (FedAvgClient.keep_best_local): False
    # where no site trains a model of its own in ``train`` (centralized), where the local models are
    # the method's own (local) or where the client trains otherwise (the FedSM family).
    KEEPS_LOCAL_MODELS = True
    # Whether each site is tested with its own model at its own best validation round
    # (fedseg.algorithms.persite); False: every site at the round with the best mean validation Dice.
    SELECTS_PER_SITE = False
    # Client sampling (fl.clients_per_round, ``participants``): None if this method may train a sample of
    # the sites per round, else why it cannot (checked before any work: ``sampling_refusal``).
    NO_CLIENT_SAMPLING: str | None = None

    def __init__(self, engine, task: Task, options):
        self.engine = engine
        self.task = task
        self.options = options
        model = task.new_model()
        self.global_weights = weights_of(model)
        self.buffers = sorted(set(self.global_weights) - {name for name, _ in model.named_parameters()})
        self.local_models: dict[str, dict[str, torch.Tensor]] = {}  # site -> its best local model, for the test
        self.robust_rows: list[dict] = []  # round_metrics rows of the last robust merge (aggregator != mean)

    # --- one round ---------------------------------------------------------------
    def run_round(self, rnd: int) -> dict[str, float]:
        """Train one round on this round's ``participants``; return the mean local training loss per site."""
        replies = self.engine.exchange({s: self.train_message(s) for s in self.participants(rnd)}, "train")
        self.aggregate(replies)
        self.average_buffers(replies)
        return {s: float(r.meta["loss"]) for s, r in replies.items()}

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
        weights = self.aggregation_weights(replies)
        sites = list(replies)
        stats = weighted_average(
            [{b: replies[s].tensors[k] for b, k in zip(self.buffers, keys)} for s in sites], [weights[s] for s in sites]
        )
        self.global_weights = {**self.global_weights, **stats}

    def train_message(self, site: str) -> Message:
        return Message(prefixed(MODEL, self.global_weights))

    def aggregate(self, replies: dict[str, Message]) -> None:
        """FedAvg's weighted average, or the robust merge of ``options.aggregator`` (module docstring)."""
        sites = list(replies)
        weights = self.aggregation_weights(replies)
        models, p = [replies[s].group(MODEL) for s in sites], [weights[s] for s in sites]
        aggregator = getattr(getattr(self, "options", None), "aggregator", "mean")
        if aggregator == "mean":
            self.global_weights = weighted_average(models, p)
            return
        merge = robust_merge(self.options, self.global_weights, models, p, getattr(self.engine, "algorithm", "fedavg"))
        self.global_weights, self.robust_rows = merge.weights, merge.rows(sites)

    def aggregation_weights(self, replies: dict[str, Message]) -> dict[str, float]:
        """``samples``: n_k (the site's training-set size, as it reports); ``uniform``: 1 per site.
        ``options.weighting`` if set, else ``fl.weighting``."""
        weighting = getattr(getattr(self, "options", None), "weighting", None) or self.task.cfg.fl.weighting
        if weighting == "uniform":
            return {s: 1.0 for s in replies}
        return {s: float(r.meta["num_examples"]) for s, r in replies.items()}

    def round_metrics(self) -> list[dict]:
        """Method-specific metrics of the round just validated: rows ``{site, metric, value}``
        written to ``round_metrics.csv`` (e.g. FedSM's selector accuracy). Default: none; with a robust
        ``aggregator``, its per-site rows (module docstring)."""
        return list(getattr(self, "robust_rows", []))

    def selectable(self, rnd: int) -> bool:
        """Whether round ``rnd``'s models may be chosen as the best round (on validation Dice)."""
        return True

    def finalize(self) -> None:
        """After the best round is restored and before the single test evaluation: last choices
        made on validation data only (e.g. FedSM's threshold gamma). Default: nothing."""

    # --- evaluation --------------------------------------------------------------
    def site_model(self, site: str) -> str:
        """Name of the model ``site`` would actually use (what its summary numbers report)."""
        return "global"

    def eval_messages(self, split: str, sample: bool) -> dict[str, Message]:
        meta: dict[str, MetaValue] = {"split": split, "model": "global", "sample": sample, **surface_meta(split)}
        return {s: Message(prefixed(MODEL, self.global_weights), dict(meta)) for s in self.engine.sites}

    def evaluate(self, split: str, sample: bool = False) -> list[dict]:
        """Score on every site's ``split``; tidy rows ``algorithm, model, site, case, region, metric, value``.
        The test adds the cross-site rows of the collected local models (``collect_local_models``)."""
        replies = self.engine.exchange(self.eval_messages(split, sample), "evaluate")
        rows = eval_rows(self.engine.algorithm, replies, self.task.regions)
        if split == "test" and self.local_models:
            rows += self.cross_site_rows(self.local_models)
        return rows

    # --- local models (Auto-FedAvg Table 2; the module docstring) ------------------
    def collect_local_models(self) -> None:
        """Fetch every site's kept best local model for the test's cross-site rows. The run calls
        this after the last round and before it restores the best global round's client states
        (which would put back each site's best only up to that round). Nothing is exchanged when
        the method keeps none (``KEEPS_LOCAL_MODELS``) or ``eval.local_models`` is off."""
        keeps = self.KEEPS_LOCAL_MODELS and self.task.cfg.eval.local_models
        self.local_models = self.collect_models() if keeps else {}

    def collect_models(self) -> dict[str, dict[str, torch.Tensor]]:
        """Every site's own model (a ``share_model`` exchange: evaluation traffic, outside
        ``floats_sent``); a site that has none replies empty and is left out."""
        replies = self.engine.exchange({s: Message() for s in self.engine.sites}, SHARE_MODEL)
        return {s: r.group(MODEL) for s, r in replies.items() if r.group(MODEL)}

    def cross_site_rows(self, models: dict[str, dict[str, torch.Tensor]], skip_own: bool = False) -> list[dict]:
        """``models[owner]`` scored on every site's test split, one ``evaluate`` exchange per owner;
        rows ``model = "local:<owner>"``. ``skip_own``: not on the owner's own split (already scored). Dice
        only unless ``eval.cross_site_hd95`` (HD95/NSD NaN: the tables show a dash)."""
        rows = []
        for owner, weights in models.items():
            meta: dict[str, MetaValue] = {
                "split": "test",
                "model": local_model_name(owner),
                "sample": False,
                SURFACE: self.task.cfg.eval.cross_site_hd95,
            }
            msgs = {
                s: Message(prefixed(MODEL, weights), dict(meta))
                for s in self.engine.sites
                if not (skip_own and s == owner)
            }
            rows += eval_rows(self.engine.algorithm, self.engine.exchange(msgs, "evaluate"), self.task.regions)
        return rows

    # --- state -------------------------------------------------------------------
    def state_dict(self) -> dict[str, torch.Tensor]:
        return prefixed("global", self.global_weights)

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        self.global_weights = Message(state).group("global")

    def bundle(self) -> dict[str, dict[str, torch.Tensor]]:
        """The trained models to ship: ``{model name: weights}``."""
        return {"global": self.global_weights}


def sampling_refusal(spec: AlgorithmSpec) -> str | None:
    """Why method ``spec`` cannot train a sample of the sites per round (``fl.clients_per_round``), or None:
    it needs every site's reply (``needs_every_site``), its round is not FedAvg's (the one that samples:
    ``FedAvgServer.run_round``), or its server says why not (``NO_CLIENT_SAMPLING``)."""
    if spec.needs_every_site:
        return "it needs every site's reply in each round"
    server = spec.server
    if not (isinstance(server, type) and issubclass(server, FedAvgServer)) or server.run_round is not (
        FedAvgServer.run_round
    ):
        return "its rounds are its own (not FedAvg's broadcast and merge, which samples the sites)"
    return server.NO_CLIENT_SAMPLING


SPECS = (
    AlgorithmSpec(
        "fedavg",
        "FedAvg",
        FedAvgServer,
        FedAvgClient,
        "FedAvg (McMahan et al.): weighted (samples | uniform) averaging of local models",
        FedAvgOptions,
    ),
    AlgorithmSpec(
        "fedavg-steps",
        "FedAvg (fixed steps)",
        FedAvgServer,
        FedAvgClient,
        "FedAvg with fixed local iterations (U steps per site and round, FeTS 3.2.2)",
        FedAvgStepsOptions,
    ),
    AlgorithmSpec(
        "fedavg-uniform",
        "FedAvg (uniform)",
        FedAvgServer,
        FedAvgClient,
        "FedAvg with fixed local epochs and uniform averaging (FeTS 3.2.2)",
        FedAvgUniformOptions,
    ),
)
