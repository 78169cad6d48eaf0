"""FedSM (Xu et al., CVPR 2022): global model + SoftPull (or other) personalized models + model selector.

Training, Algorithm 1 (one ``train`` exchange per round):

* site k receives the global model w_g, **its own** personalized model w_p,k and the selector
  w_s (the server keeps every w_p,k; a site receives no other site's personalized model for
  training. Validation and test do send every site the whole super model, all K personalized
  models included: the ledger counts that as evaluation traffic, outside ``floats_sent``). It
  trains all three on its train split through the Trainer: w_g and w_p,k with the segmentation loss, w_s with
  cross-entropy against its label ``y_s = one_hot(k)`` (Eq. 2; the
  label is the site's position in the server's site order, sent as ``meta.label``). w_g and w_p,k
  run one local budget, the selector ``selector_steps`` steps (10 by default; see below); the three never
  interact, so training them one after another equals
  the interleaved loop of Algorithm 1 (up to the batch order, which each model draws from the
  site's round stream). It replies with all three.
* the server merges w_g by weighted averaging (``fl.weighting``: n_k/n by default, Algorithm 1 line 15), w_s by
  ``selector_weighting`` (uniform by default, where the paper weights it by n_k/n too; see below) and the
  personalized models by SoftPull, Eq. (11) (:func:`fedseg.algorithms.aggregate.softpull`),
  ``lambda = methods.fedsm.lam`` in (0, 1] (the paper assumes [1/K, 1]; below 1/K is allowed with a warning).
* Personalization alternatives (paper Table 6), ``methods.fedsm.personalization``: ``softpull``
  (the above, default), ``ft`` (local fine-tuning of the received global model), ``apfl``
  (Deng et al.), ``perfedavg`` (Per-FedAvg, first-order, Fallah et al.), ``pfedme`` (Dinh et
  al.). Each only changes how the personalized models w_p,k are produced (what travels with
  w_g, what the site trains, how the server merges); w_g and w_s train as above. The
  personalized track trains whenever w_g does. Equations, choices and traffic per strategy:
  :mod:`fedseg.algorithms.fedsm.personalize`.
* Ledger (SoftPull): per round and site ``2|w_g| + |w_s|`` floats down and the same up (the paper's
  cost, Sec. 3.3) plus, with ``average_selector_moments`` (the default, see below), the
  selector's moments: ``2|w_s| + t`` more each way (t = number of selector parameter tensors,
  Adam's step counters). With ``average_selector_moments: false`` the ledger is the paper's
  exactly.

Selector optimizer moments: every site trains the selector on its own label only, so a site's
Adam moments push every image towards that label; carried over to the next round they undo
the averaging and the selector collapses onto the largest sites. Averaging the moments with
the weights (and sending them back) fixes it. Measured with ``fedsm`` on synthetic-retina
(scale 0.25, 6 sites, 40 rounds, seed 0; ``benchmarks/selector_moments.py``), validation
selector accuracy, mean of the last 10 rounds: InstanceNorm 0.87 averaged vs 0.33 local
(first >= 0.9 at round 25 vs never); BatchNorm 0.65 vs 0.33; moments reset every round
(``train.keep_optimizer_state: false``) 0.22. Hence the default is on; the moments are real
traffic and the ledger counts them (+2|w_s| + t per site and direction, about +60% over the
paper's cost with the default UNet and selector). The selector's default normalization is
``instance`` by the same measurement: BatchNorm normalizes each training batch with one site's
statistics (every batch comes from one site) but evaluates with the averaged running statistics.

Evaluation, Algorithm 2: the server sends every site the super model (global, all K
personalized, selector: evaluation traffic, as the paper's one-time deployment). For each
image the site reports the selector's softmax and the Dice/HD95 of the global model and of the
argmax personalized model, so the score at *any* threshold gamma follows without another pass
(:func:`fedseg.algorithms.fedsm.model.route` picks, per image, which of the two counts).
Per-round validation uses ``val_gamma`` if set, else the gamma of ``gamma_grid`` with the best
mean validation Dice over sites (the run's selection criterion), so a round is scored as the
super model it would be if the run stopped there. ``finalize`` (after the best round is
restored) chooses gamma on the validation splits from ``gamma_grid`` again (ties go to the
larger gamma: the global model covers the joint distribution) and records it; the test
splits are then scored once at that gamma. ``round_metrics`` reports per site the selector
accuracy on the validation split (fraction of images whose selector argmax is their own
site), the fraction routed to the global model at the round's gamma, and the gamma.
"""

from __future__ import annotations

import itertools
import json
import math
from functools import partial

import numpy as np
import torch
from torch import nn

from fedseg.algorithms.aggregate import weighted_average
from fedseg.algorithms.client_state import put_group, state_group
from fedseg.algorithms.fedavg import FedAvgClient, FedAvgServer, reused_models
from fedseg.algorithms.fedsm.family import FEDSM
from fedseg.algorithms.fedsm.model import (
    GLOBAL_INDEX,
    Deferred,
    LabeledImages,
    Mode,
    SuperModel,
    bundle_entries,
    route,
)
from fedseg.algorithms.fedsm.options import FedSMOptions, SelectorOptions
from fedseg.algorithms.fedsm.personalize import PERSONAL, TRACK, personalization
from fedseg.algorithms.fedsm.selector import Selector, build_selector
from fedseg.algorithms.registry import AlgorithmSpec
from fedseg.algorithms.site_scoring import score_at_site, surface_meta, wants_surface
from fedseg.config import BudgetConfig
from fedseg.data.dataset import CaseSet
from fedseg.engine.context import ClientContext, Task, options_as
from fedseg.engine.messages import Message, MetaValue, load_weights, prefixed, weights_of
from fedseg.evaluate.metric_info import METRIC_NAMES
from fedseg.evaluate.metrics import Scores
from fedseg.evaluate.tables import eval_rows, nan_low, site_summary
from fedseg.train import LossFn, TrainHooks, TrainStats

GLOBAL, SELECTOR, SELECTOR_OPT = "global", "selector", "selector_opt"  # message groups (and PERSONAL, TRACK)
MODEL_NAME = "fedsm"  # the ``model`` of every result row: each site uses the super model


ROUTE, OWN_SITE = "route", "own"  # evaluation meta: route every image to its own site's personalized model


def new_selector(task: Task, options: SelectorOptions, num_classes: int) -> Selector:
    return build_selector(
        task.in_channels,
        num_classes,
        options.selector_width,
        options.selector_norm,
        options.selector_input_size,
        task.spatial_dims,
        seed=task.cfg.seed,
    ).to(task.device)


def score_routed(
    models: list[nn.Module], choice: torch.Tensor, data: CaseSet, ctx: ClientContext, surface: bool
) -> Scores:
    """Dice, HD95 and NSD ``(N, R)`` of every case scored with the candidate ``choice[i]`` picks (HD95/NSD
    NaN unless ``surface``)."""
    scores = {m: np.full((len(data), len(ctx.task.regions)), np.nan) for m in METRIC_NAMES}
    for c in choice.unique().tolist():
        idx = (choice == c).nonzero().flatten()
        part = score_at_site(models[c], data.subset(idx), ctx, surface)
        for m in METRIC_NAMES:
            scores[m][idx.numpy()] = part[m]
    return scores


class FedSMClient(FedAvgClient):
    """Trains whatever models a message carries (global, personalized, selector) and scores the super model."""

    MODE: Mode = "threshold"
    EXTRA_CLASSES = 0  # selector classes beyond the K sites (1 for the global model in -extra/-ensemble)

    # --- models from messages ----------------------------------------------------------
    REUSED_CANDIDATES = 3  # candidate networks a client reuses across evaluations (the first ones built)

    def segmenter(self, weights: dict, ctx: ClientContext, slot: str | None = None) -> nn.Module:
        """A segmentation network with ``weights``: a new one, or this client's reused network of ``slot``
        (``FedAvgClient.reused_model``: one that is not kept after the message)."""
        if slot is not None:
            return self.reused_model(slot, weights, ctx)
        model = ctx.task.new_model()
        load_weights(model, weights)
        return model

    def selector(self, weights: dict, ctx: ClientContext, slot: str | None = None) -> Selector:
        """The selector with ``weights``: a new one, or this client's reused selector of ``slot`` (as ``segmenter``)."""
        classes = ctx.num_sites + self.EXTRA_CLASSES

        def build() -> Selector:
            return new_selector(ctx.task, options_as(ctx.options, SelectorOptions), classes)

        if slot is not None:
            return reused_models(self).get(f"{slot}/{classes}", (ctx.task, ctx.options), build, weights)  # type: ignore[return-value]
        model = build()
        load_weights(model, weights)
        return model

    def super_model(self, msg: Message, ctx: ClientContext) -> SuperModel:
        """The super model of an evaluation message. Its candidates are built when the selector first routes an
        image to them (``Deferred``): threshold mode scores the global model and the argmax personalized models,
        usually a few of the K + 1; the first ``REUSED_CANDIDATES`` built reuse this client's networks."""
        sites = json.loads(str(msg.meta["sites"]))
        built = itertools.count()

        def build(group: str) -> nn.Module:
            n = next(built)
            return self.segmenter(msg.group(group), ctx, f"candidate/{n}" if n < self.REUSED_CANDIDATES else None)

        candidates = [Deferred(partial(build, group)) for group in [GLOBAL, *(f"{PERSONAL}/{s}" for s in sites)]]
        return SuperModel(
            candidates[0],
            candidates[1:],
            self.selector(msg.group(SELECTOR), ctx, slot="eval/selector"),
            float(msg.meta.get("gamma", 0.5)),
            self.MODE,
        ).eval()

    # --- training ----------------------------------------------------------------------
    def on_train(self, msg: Message, ctx: ClientContext) -> Message:
        stats: dict[str, TrainStats] = {}
        out: dict[str, torch.Tensor] = {}
        if msg.group(GLOBAL):  # the global model, then the personalized track (which always trains with it)
            model = self.segmenter(msg.group(GLOBAL), ctx, slot=f"train/{GLOBAL}")
            stats[GLOBAL] = self.fit(model, msg, ctx, state_key=f"opt_{GLOBAL}")
            out.update(prefixed(GLOBAL, weights_of(model)))
            tensors, stats[PERSONAL] = personalization(options_as(ctx.options, SelectorOptions)).train(
                self, msg, msg.group(GLOBAL), ctx
            )
            out.update(tensors)
        if msg.group(SELECTOR):
            selector = self.selector(msg.group(SELECTOR), ctx, slot=f"train/{SELECTOR}")
            key = f"opt_{SELECTOR}"
            if msg.group(SELECTOR_OPT):  # averaged moments from the server replace the local ones
                put_group(ctx.state, key, msg.group(SELECTOR_OPT))
            data, loss_fn, hooks = self.selector_task(selector, msg, ctx)
            opts = options_as(ctx.options, SelectorOptions)
            train_cfg = ctx.cfg.train.model_copy(update={"lr": opts.selector_lr or ctx.cfg.train.lr})
            steps = opts.selector_steps
            budget = None if steps is None else BudgetConfig(unit="steps", amount=steps)
            stats[SELECTOR] = self.fit(
                selector, msg, ctx, key, data=data, loss_fn=loss_fn, train_cfg=train_cfg, budget=budget, hooks=hooks
            )
            out.update(prefixed(SELECTOR, weights_of(selector)))
            if opts.average_selector_moments:
                out.update(prefixed(SELECTOR_OPT, state_group(ctx.state, key)))
        meta: dict[str, MetaValue] = {
            "steps": sum(s.steps for s in stats.values()),  # optimizer steps of every model trained
            "num_examples": len(ctx.data.train),
            "loss": next(iter(stats.values())).mean_loss,  # the global model's (the selector's if alone)
            **{f"loss_{g}": s.mean_loss for g, s in stats.items()},
        }
        return Message(out, meta)

    def selector_task(
        self, selector: Selector, msg: Message, ctx: ClientContext
    ) -> tuple[object, LossFn | None, TrainHooks]:
        """``(data, loss, hooks)`` the selector trains with: Eq. (2), cross-entropy against the site's label."""
        labels = torch.full((len(ctx.data.train),), int(msg.meta["label"]), dtype=torch.long)
        return LabeledImages(ctx.data.train.name, ctx.data.train.x, labels), nn.CrossEntropyLoss(), TrainHooks()

    # --- evaluation (Algorithm 2) ------------------------------------------------------
    def choose(self, probs: torch.Tensor, sm: SuperModel, msg: Message, ctx: ClientContext) -> torch.Tensor:
        """The candidate each image goes to ``(N,)``: the selector's (Algorithm 2), or with ``meta.route`` =
        ``own`` this site's personalized model for every image (a perfect site classifier: FedSM-extra's model
        phase, whose selector is not trained yet)."""
        if msg.meta.get(ROUTE) == OWN_SITE:
            return torch.full((probs.shape[0],), ctx.site_index + 1, dtype=torch.long)
        return route(probs, sm.mode, sm.gamma)

    def on_evaluate(self, msg: Message, ctx: ClientContext) -> Message:
        """Score the super model on ``meta.split``. Replies ``probs`` ``(N, C)`` (selector softmax),
        ``choice`` ``(N,)`` and ``dice``/``hd95``/``nsd`` ``(N, R)`` at ``meta.gamma``; in threshold mode also
        ``<metric>_global`` and ``<metric>_personal`` for each (argmax personalized model) from which the
        server scores any other gamma."""
        sm = self.super_model(msg, ctx)
        data = ctx.data.split(str(msg.meta["split"]))
        probs = sm.scores_of(data.x, ctx.cfg.eval.batch_size, ctx.task.device)
        choice = self.choose(probs, sm, msg, ctx)
        models, surface = list(sm.candidates), wants_surface(msg, ctx)
        tensors = {"probs": probs, "choice": choice}
        if sm.mode == "threshold":
            glob = score_routed(models, torch.full_like(choice, GLOBAL_INDEX), data, ctx, surface)
            personal = score_routed(models, probs.argmax(dim=1) + 1, data, ctx, surface)
            use_p = (choice != GLOBAL_INDEX).numpy()[:, None]
            scores = {m: np.where(use_p, personal[m], glob[m]) for m in METRIC_NAMES}
            for m in METRIC_NAMES:
                tensors.update(
                    {f"{m}_global": torch.from_numpy(glob[m]), f"{m}_personal": torch.from_numpy(personal[m])}
                )
        elif sm.mode == "argmax" or msg.meta.get(ROUTE) == OWN_SITE:
            scores = score_routed(models, choice, data, ctx, surface)
        else:
            scores = score_at_site(sm, data, ctx, surface)
        tensors.update({m: torch.from_numpy(v) for m, v in scores.items()})
        return self.eval_reply(tensors, sm, data, msg, ctx)


class FedSMServer(FedAvgServer):
    """Keeps w_g, every w_p,k, w_s (and optionally the selector's averaged moments), gamma and the
    personalization's shared track model (Per-FedAvg's meta-model, pFedMe's w; else empty)."""

    options: SelectorOptions  # this method's options (``FedAvgServer.options``)

    MODE: Mode = "threshold"
    EXTRA_CLASSES = 0
    KEEPS_LOCAL_MODELS = False  # the personalized models are the family's own; no FedAvg local models
    RETURNED_GROUPS = (GLOBAL, SELECTOR)  # each comes back whenever it was sent (train_reply_problem)

    def __init__(self, engine, task: Task, options):
        super().__init__(engine, task, options)
        self.sites = list(engine.sites)
        options.check_sites(len(self.sites), engine.algorithm)
        self.personal = {s: {k: v.clone() for k, v in self.global_weights.items()} for s in self.sites}
        self.personalization = personalization(options)
        self.track = self.personalization.initial_track(self.global_weights)
        self.selector_weights = weights_of(new_selector(task, options, len(self.sites) + self.EXTRA_CLASSES))
        self.selector_moments: dict[str, torch.Tensor] = {}
        self.gamma = self.fixed_gamma()
        self.last_eval: dict[str, dict[str, Message]] = {}  # split -> site -> evaluation reply
        self.last_train_losses: dict[str, dict[str, float]] = {}  # site -> trained group -> mean loss

    @property
    def threshold_options(self) -> FedSMOptions:
        """The options of threshold routing (``MODE = "threshold"``: FedSM's own, with ``gamma_grid``)."""
        if not isinstance(self.options, FedSMOptions):
            raise TypeError(
                f"{self.algorithm}: threshold routing needs FedSMOptions, got {type(self.options).__name__}"
            )
        return self.options

    def fixed_gamma(self) -> float:
        """The gamma before any validation: ``val_gamma``, else the middle of the grid; NaN without a threshold."""
        if self.MODE != "threshold":
            return math.nan
        opts = self.threshold_options
        grid = opts.gamma_grid
        return float(grid[len(grid) // 2]) if opts.val_gamma is None else float(opts.val_gamma)

    # --- one round (Algorithm 1) -------------------------------------------------------
    def model_tensors(self, site: str) -> dict[str, torch.Tensor]:
        """The segmentation part of ``site``'s train message: w_g and the personalization's tensors."""
        return {**prefixed(GLOBAL, self.global_weights), **self.personalization.down(site, self.personal, self.track)}

    def train_message(self, site: str) -> Message:
        tensors = {
            **self.model_tensors(site),
            **prefixed(SELECTOR, self.selector_weights),
            **prefixed(SELECTOR_OPT, self.selector_moments),
        }
        return Message(tensors, {"label": self.sites.index(site)})

    def aggregate(self, replies: dict[str, Message]) -> None:
        """Weighted averages of w_g and w_s (and the selector moments, if sent); the personalized
        models (SoftPull, Eq. 11, by default) by the personalization's ``merge``, after w_g. Only
        the groups the replies carry change."""
        sites = [s for s in self.sites if s in replies]
        weights = self.checked_aggregation_weights(replies)
        self.last_train_losses = {
            s: {k[len("loss_") :]: float(v) for k, v in replies[s].meta.items() if k.startswith("loss_")} for s in sites
        }

        def merge(group: str, by: dict[str, float] = weights) -> dict[str, torch.Tensor]:
            return weighted_average([replies[s].group(group) for s in sites], [by[s] for s in sites])

        selector_weights = {s: 1.0 for s in sites} if self.options.selector_weighting == "uniform" else weights

        first = replies[sites[0]]
        if first.group(GLOBAL):
            self.global_weights = merge(GLOBAL)
            self.personal, self.track = self.personalization.merge(
                {s: replies[s] for s in sites}, weights, self.global_weights, self.track
            )
        if first.group(SELECTOR):
            self.selector_weights = merge(SELECTOR, selector_weights)
        if first.group(SELECTOR_OPT):
            self.selector_moments = merge(SELECTOR_OPT, selector_weights)

    # --- evaluation (Algorithm 2) ------------------------------------------------------
    def site_model(self, site: str) -> str:
        return MODEL_NAME

    def super_tensors(self) -> dict[str, torch.Tensor]:
        personal = {f"{s}/{k}": v for s in self.sites for k, v in self.personal[s].items()}
        return {
            **prefixed(GLOBAL, self.global_weights),
            **prefixed(PERSONAL, personal),
            **prefixed(SELECTOR, self.selector_weights),
        }

    def eval_messages(self, split: str, sample: bool) -> dict[str, Message]:
        tensors = self.super_tensors()
        meta: dict[str, MetaValue] = {
            "split": split,
            "model": MODEL_NAME,
            "sample": sample,
            "gamma": self.gamma,
            "sites": json.dumps(self.sites),
            **surface_meta(split),
        }
        return {s: Message(dict(tensors), dict(meta)) for s in self.sites}

    def train_reply_problem(self, site: str, sent: Message, reply: Message) -> str | None:
        """FedAvg's check (``global/`` and ``selector/`` come back when sent), and with the global model the
        personalization's own groups (``Personalization.reply_problem``)."""
        if problem := super().train_reply_problem(site, sent, reply):
            return problem
        return self.personalization.reply_problem(reply, self.global_weights) if reply.group(GLOBAL) else None

    def eval_reply_problem(self, site: str, sent: Message, reply: Message) -> str | None:
        """The selector's softmax ``probs`` is ``(cases, K + EXTRA_CLASSES)`` and, in threshold mode, the candidates'
        scores the server re-routes at every gamma are there (``dice_global``, ``dice_personal``...; the engine
        checks their shapes and ranges): a 1-D ``probs`` or a missing candidate was an error naming no site."""
        probs, classes = reply.tensors.get("probs"), len(self.sites) + self.EXTRA_CLASSES
        if probs is None or probs.dim() != 2 or probs.shape[1] != classes:
            shape = None if probs is None else tuple(probs.shape)
            return f"its selector probabilities have shape {shape}, expected (cases, {classes})"
        if self.MODE == "threshold":
            missing = [
                f"{m}_{c}" for m in METRIC_NAMES for c in ("global", "personal") if f"{m}_{c}" not in reply.tensors
            ]
            if missing:
                return f"its candidates' scores lack {missing[0]!r} (threshold mode re-routes them)"
        return None

    def evaluate(self, split: str, sample: bool = False) -> list[dict]:
        replies = self.engine.exchange(self.eval_messages(split, sample), "evaluate", self.eval_reply_problem)
        self.last_eval[split] = replies
        if self.MODE == "threshold":
            if split == "val" and isinstance(self.options, FedSMOptions) and self.options.val_gamma is None:
                self.gamma = self.best_gamma(replies)
            replies = {s: at_gamma(r, self.gamma) for s, r in replies.items()}
        return eval_rows(self.engine.algorithm, replies, self.task.regions)

    def best_gamma(self, replies: dict[str, Message]) -> float:
        """The gamma of ``gamma_grid`` with the best mean validation Dice over sites (ties: the larger)."""
        grid = self.threshold_options.gamma_grid
        best, best_score = float(grid[-1]), -math.inf
        for gamma in grid:
            rows = eval_rows(
                self.engine.algorithm, {s: at_gamma(r, gamma) for s, r in replies.items()}, self.task.regions
            )
            score = site_summary(rows, self.engine.algorithm, "dice", self.sites)["client_avg"]
            score = nan_low(score)
            if score >= best_score:  # a tie: the larger gamma (later in the grid)
                best, best_score = gamma, score
        return float(best)

    def finalize(self) -> None:
        """Choose gamma on the validation splits from ``gamma_grid`` with the restored best-round models."""
        if self.MODE == "threshold":
            replies = self.engine.exchange(self.eval_messages("val", False), "evaluate", self.eval_reply_problem)
            self.gamma = self.best_gamma(replies)

    def round_metrics(self) -> list[dict]:
        replies = self.last_eval.get("val", {})
        rows = []
        for s, r in replies.items():
            own = self.sites.index(s) + self.EXTRA_CLASSES
            probs = r.tensors["probs"]
            rows.append({"site": s, "metric": "selector_acc", "value": float((probs.argmax(1) == own).double().mean())})
            choice = route(probs, self.MODE, self.gamma)
            rows.append({"site": s, "metric": "global_frac", "value": float((choice == GLOBAL_INDEX).double().mean())})
            for model in ("global", "personal"):  # threshold mode: each candidate's own validation Dice
                if f"dice_{model}" in r.tensors:
                    rows.append(
                        {"site": s, "metric": f"val_dice_{model}", "value": case_mean(r.tensors[f"dice_{model}"])}
                    )
        for s, losses in self.last_train_losses.items():
            rows += [{"site": s, "metric": f"train_loss_{group}", "value": v} for group, v in losses.items()]
        if replies and self.MODE == "threshold":
            rows.append({"site": "all", "metric": "gamma", "value": self.gamma})
        return rows

    # --- state ---------------------------------------------------------------------------
    def state_dict(self) -> dict[str, torch.Tensor]:
        gamma = {"gamma/value": torch.tensor(self.gamma, dtype=torch.float64)}
        return {
            **self.super_tensors(),
            **prefixed(SELECTOR_OPT, self.selector_moments),
            **prefixed(TRACK, self.track),
            **gamma,
        }

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        msg = Message(state)
        self.global_weights = msg.group(GLOBAL)
        self.personal = {s: msg.group(f"{PERSONAL}/{s}") for s in self.sites}
        self.selector_weights = msg.group(SELECTOR)
        self.selector_moments = msg.group(SELECTOR_OPT)
        self.track = msg.group(TRACK)
        self.gamma = float(state["gamma/value"])

    def bundle(self) -> dict[str, dict[str, torch.Tensor]]:
        """global, personal:<site>, selector, gamma/value and selector_spec/*
        (see ``fedseg.algorithms.fedsm.model.bundle_entries``)."""
        selector = new_selector(self.task, self.options, len(self.sites) + self.EXTRA_CLASSES)
        return bundle_entries(
            self.global_weights,
            self.personal,
            self.selector_weights,
            self.gamma,
            self.MODE,
            selector,
            self.options.selector_width,
            self.options.selector_norm,
        )


def case_mean(dice: torch.Tensor) -> float:
    """Mean over cases of the per-case mean over regions of ``(N, R)`` scores (NaN = not counted)."""
    per_case = torch.nanmean(dice.double(), dim=1)
    per_case = per_case[~per_case.isnan()]
    return float(per_case.mean()) if per_case.numel() else math.nan


def at_gamma(reply: Message, gamma: float) -> Message:
    """An evaluation reply re-scored at threshold ``gamma`` (Algorithm 2 applied to the reported candidates)."""
    use_personal = (route(reply.tensors["probs"], "threshold", gamma) != GLOBAL_INDEX)[:, None]
    tensors = dict(reply.tensors)
    for metric in METRIC_NAMES:
        tensors[metric] = torch.where(
            use_personal, reply.tensors[f"{metric}_personal"], reply.tensors[f"{metric}_global"]
        )
    return Message(tensors, dict(reply.meta))


SPECS = (
    AlgorithmSpec(
        "fedsm",
        "FedSM",
        FedSMServer,
        FedSMClient,
        "FedSM (Xu et al.): global + SoftPull personalized models + selector, threshold gamma (Alg. 1-2)",
        FedSMOptions,
        kind="personalized",
        family=FEDSM,
        min_sites=2,
        needs_every_site=True,
        on_secure_aggregation=(
            "its server SoftPulls every site's personalized model and trains the selector on individual replies"
        ),
    ),
)
