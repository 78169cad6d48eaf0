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

``lr_grid`` (both methods): FeTS 2022 searched the fine-tuning learning rate per institution. With a
grid eta_1..eta_G, site k fine-tunes G copies of w* side by side, candidate g at rate eta_g (in place of
``train.lr``, under ``train.lr_schedule``), each one local budget per round; every validated round the
site scores every candidate on its own validation split and keeps the best (eta, epoch) model over all
candidates and rounds (``keep_if_better``: ties keep the earlier round, then the earlier grid entry).
Its validation reply (the round's ``val_dice``) is the round's best candidate; each candidate's mean
validation Dice goes to ``round_metrics.csv`` (``val_dice_lr=<eta>``), the rate of each site's kept
model to ``summary.json`` ``selected_lrs``. Random streams: every candidate draws from the same stream,
the site's (seed, site, round, ``train``) stream, reseeded per candidate, so the candidates of one site
and round see the same batches and differ only by their rate (``lr_grid = [train.lr]`` is no grid,
bit for bit). Cost: G times the fine-tuning's training (each train reply counts all G candidates'
steps) and G times its validation scoring; the traffic is unchanged (w* once).
"""

from __future__ import annotations

import math

import torch
from pydantic import Field, field_validator
from torch import nn

from fedseg.algorithms.client_state import put_group, state_group
from fedseg.algorithms.fedavg import BudgetOptions, train_losses, train_meta
from fedseg.algorithms.local_models import local_model_name
from fedseg.algorithms.persite import SITE_BEST, USE_BEST, PerSiteClient, PerSiteServer
from fedseg.algorithms.prefixes import MODEL, OPT
from fedseg.algorithms.proximal import ProximalTerm
from fedseg.algorithms.registry import AlgorithmSpec
from fedseg.engine.context import ClientContext, options_as, seeded_generator
from fedseg.engine.faults import is_number
from fedseg.engine.messages import Message, MetaValue, load_weights, prefixed, weights_of
from fedseg.evaluate.tables import is_better, site_dice
from fedseg.train import TrainHooks, TrainStats

START = "start"  # client-state prefix of w*, the model the site started from (Ditto's anchor)
CANDIDATE = "candidate"  # eval meta: index g of the lr_grid candidate to score (the site's own model)
CANDIDATE_DICE = "val_dice_lr="  # reply meta / round_metrics metric: + the rate, a candidate's mean val Dice
SELECTED_LR = "selected_lr"  # reply meta to USE_BEST: the rate of the kept model
KEPT_LR = SITE_BEST + "_lr"  # client state: the rate of the kept model, float64 ()


class FinetuneOptions(BudgetOptions):
    start_from: str = Field(
        "fedavg", description="algorithm of the same run (listed before) or RUN/model/<algorithm> folder to start from"
    )
    epochs: int = Field(30, ge=1, description="fine-tuning rounds of one local budget each (FeTS 2022: 30 epochs)")
    lam: float = Field(0.0, ge=0, description="Ditto's pull (lam/2)||v - w*||^2 towards the start model; 0 = none")
    lr_grid: list[float] | None = Field(
        None,
        description="learning rates to fine-tune with, one copy of w* each; each site keeps its best (lr, epoch) "
        "on its validation split (FeTS 2022's per-institution search; |grid| x the cost); None = train.lr",
    )

    @field_validator("lr_grid")
    @classmethod
    def _grid(cls, grid: list[float] | None) -> list[float] | None:
        if grid is None:
            return None
        if not grid:
            raise ValueError("lists no learning rate (leave it out to fine-tune at train.lr)")
        bad = [lr for lr in grid if not (lr > 0 and math.isfinite(lr))]
        if bad:
            raise ValueError(f"every learning rate must be a finite number > 0, got {bad}")
        twice = sorted({lr for lr in grid if grid.count(lr) > 1})
        if twice:
            raise ValueError(f"lists {twice} more than once")
        return grid

    def run_rounds(self, rounds: int) -> int:
        """This method's number of rounds (``AlgorithmSpec.run_config``): one per fine-tuning epoch."""
        return self.epochs


class DittoFinetuneOptions(FinetuneOptions):
    lam: float = Field(0.1, ge=0, description="Ditto's lambda of Eq. 24 (FeTS grid: 0.001, 0.01, 0.1, 1)")


def candidate_prefix(prefix: str, index: int | None) -> str:
    """Client-state prefix of lr_grid candidate ``index``'s entries (``prefix`` itself without a grid)."""
    return prefix if index is None else f"{prefix}@lr{index}"


def lr_label(lr: float) -> str:
    """A rate as written in metric names (``val_dice_lr=0.001``)."""
    return repr(float(lr))


class FinetuneClient(PerSiteClient):
    """Round 1: keeps the received w*; every round: trains its own copy (one per lr_grid rate) one local budget."""

    def own_model(self, msg: Message, ctx: ClientContext) -> nn.Module:
        index = msg.meta.get(CANDIDATE)
        own = state_group(ctx.state, candidate_prefix(MODEL, None if index is None else int(index)))
        model = ctx.task.new_model()
        load_weights(model, own or state_group(ctx.state, START) or msg.group(MODEL))
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

    # --- lr_grid (module docstring) ------------------------------------------------------------
    def on_train(self, msg: Message, ctx: ClientContext) -> Message:
        """Without a grid: FedAvg's. With one: each candidate g trains one local budget at its rate, from the
        site's stream reseeded (the same batches for every g); the reply counts every candidate's steps and
        samples, its loss is their mean."""
        grid = options_as(ctx.options, FinetuneOptions).lr_grid
        if not grid:
            return super().on_train(msg, ctx)
        seed = ctx.generator.initial_seed()  # the (seed, site, round, "train") stream's seed
        runs = []
        for g, lr in enumerate(grid):
            model = self.start_model(Message(msg.tensors, {CANDIDATE: g}), ctx)
            train_cfg = ctx.cfg.train.model_copy(update={"lr": lr})
            opt_key = candidate_prefix(OPT, g)
            runs.append(self.fit(model, msg, ctx, opt_key, train_cfg=train_cfg, generator=seeded_generator(seed)))
            put_group(ctx.state, candidate_prefix(MODEL, g), weights_of(model))
        total = TrainStats(
            steps=sum(r.steps for r in runs),
            samples=sum(r.samples for r in runs),
            mean_loss=sum(r.mean_loss for r in runs) / len(runs),
        )
        return Message({}, train_meta(total, ctx))

    def on_evaluate(self, msg: Message, ctx: ClientContext) -> Message:
        """The site's own model with a grid: every candidate scored (and maybe kept, ``after_evaluate``); the
        reply is the best one's (ties: the earlier grid entry), with each candidate's mean Dice in its meta."""
        grid = options_as(ctx.options, FinetuneOptions).lr_grid
        if not grid or msg.meta.get(USE_BEST) or msg.meta.get("model") != local_model_name(ctx.site):
            return super().on_evaluate(msg, ctx)
        ids = ctx.data.split(str(msg.meta["split"])).ids
        best: Message | None = None
        best_score: float | None = None
        scores: dict[str, MetaValue] = {}
        for g, lr in enumerate(grid):
            sample = bool(msg.meta.get("sample")) and g == 0  # one example prediction, not one per candidate
            reply = super().on_evaluate(Message(msg.tensors, {**msg.meta, CANDIDATE: g, "sample": sample}), ctx)
            score = site_dice(reply.tensors["dice"].numpy(), ids, ctx.site, ctx.task.regions)
            scores[CANDIDATE_DICE + lr_label(lr)] = score
            if is_better(score, best_score):
                best, best_score = reply, score
        assert best is not None  # the grid is not empty
        return Message(best.tensors, {**best.meta, **scores})

    def on_kept(self, msg: Message, ctx: ClientContext) -> None:
        grid = options_as(ctx.options, FinetuneOptions).lr_grid
        if grid:
            ctx.state[KEPT_LR] = torch.tensor(grid[int(msg.meta[CANDIDATE])], dtype=torch.float64)

    def selected_meta(self, ctx: ClientContext) -> dict[str, MetaValue]:
        return {SELECTED_LR: float(ctx.state[KEPT_LR])} if KEPT_LR in ctx.state else {}


class FinetuneServer(PerSiteServer):
    """Sends w* in the first round; then only coordinates rounds (validation, per-site selection)."""

    def __init__(self, engine, task, options):
        super().__init__(engine, task, options)
        self.selected_lrs: dict[str, float] = {}  # site -> rate of its tested model (lr_grid; after the test)
        self.candidate_rows: list[dict] = []  # the last validation's val_dice_lr=<rate> rows (lr_grid)

    def run_round(self, rnd: int) -> dict[str, float]:
        down = prefixed(MODEL, self.global_weights) if rnd == 1 else {}
        replies = self.engine.exchange({s: Message(dict(down)) for s in self.engine.sites}, "train")
        return train_losses(replies)

    def site_weights(self, site: str) -> dict:
        return {}

    def eval_reply_problem(self, site: str, sent: Message, reply: Message) -> str | None:
        """PerSite's check; with ``lr_grid``, a test reply's selected rate is one of the grid's, and a candidate's
        Dice (``val_dice_lr=<rate>``, one per rate of the grid) a number in [0, 1] or NaN (they become rows of
        round_metrics.csv, named by the site's keys)."""
        if problem := super().eval_reply_problem(site, sent, reply):
            return problem
        grid = options_as(self.options, FinetuneOptions).lr_grid
        if not grid:
            return None
        chosen = reply.meta.get(SELECTED_LR)  # none where the site kept no model (every candidate NaN)
        if sent.meta.get(USE_BEST) and chosen is not None and chosen not in [float(lr) for lr in grid]:
            return f"its {SELECTED_LR} = {reply.meta.get(SELECTED_LR)!r:.40} is not a rate of lr_grid"
        allowed = {CANDIDATE_DICE + lr_label(lr) for lr in grid}
        for key, value in reply.meta.items():
            if not key.startswith(CANDIDATE_DICE):
                continue
            if key not in allowed:
                return f"its candidate score {key[:60]!r} names no rate of lr_grid"
            if not is_number(value) or not (math.isnan(value) or 0 <= value <= 1):
                return f"its {key} = {value!r:.40} is not a Dice in [0, 1]"
        return None

    def read_replies(self, split: str, replies: dict[str, Message]) -> None:
        """lr_grid: each candidate's validation Dice (for ``round_metrics``); the test's selected rates."""
        super().read_replies(split, replies)
        if not options_as(self.options, FinetuneOptions).lr_grid:
            return
        if split == "val":
            self.candidate_rows = [
                {"site": s, "metric": key, "value": float(value)}
                for s, r in replies.items()
                for key, value in r.meta.items()
                if key.startswith(CANDIDATE_DICE)
            ]
        if split == "test":
            self.selected_lrs = {s: float(r.meta.get(SELECTED_LR, math.nan)) for s, r in replies.items()}

    def round_metrics(self) -> list[dict]:
        return super().round_metrics() + self.candidate_rows

    def summary_fields(self) -> dict:
        """lr_grid: ``selected_lrs``, the rate of each site's tested model."""
        return {"selected_lrs": dict(self.selected_lrs)} if self.selected_lrs else {}


SPECS = (
    AlgorithmSpec(
        "finetune",
        "Local fine-tuning",
        FinetuneServer,
        FinetuneClient,
        "each site fine-tunes a trained global model (start_from, default fedavg) and keeps its best epoch",
        FinetuneOptions,
        kind="personalized",
        on_secure_aggregation="its sites train alone and nothing is merged",
    ),
    AlgorithmSpec(
        "ditto-ft",
        "Ditto (fine-tuning)",
        FinetuneServer,
        FinetuneClient,
        "Ditto as FeTS 2022 ran it: local fine-tuning of a global model with the pull (lam/2)||v - w*||^2",
        DittoFinetuneOptions,
        kind="personalized",
        on_secure_aggregation="its sites train alone and nothing is merged",
    ),
)
