"""How FedSM produces its personalized models w_p,k (paper Table 6; config ``methods.<fedsm variant>.personalization``).

FedSM's global model (FedAvg) and selector train as always; only the *personalized track*
changes. Every strategy answers three questions through one interface (:class:`Personalization`):

* ``down``: what the server adds to site k's train message besides the global model;
* ``train``: what site k does with it (through ``FedSMClient.fit``, i.e. the Trainer) and replies;
* ``merge``: how the server turns the replies into the K personalized models (and its own
  shared track model, if the strategy has one).

Strategies (per site and round, floats of the personalized track beyond the global model;
``|w|`` = one segmentation model, the ledger counts exactly these):

* ``softpull`` (FedSM Eq. 11): down w_p,k, site trains it for the local budget, up w_p,k;
  server: SoftPull with ``lam``. ``|w|`` down, ``|w|`` up.
* ``ft`` (local fine-tuning, Wang et al. 2019, FedSM ref. [47]): site k fine-tunes the global
  model it received this round on its train split for ``ft_epochs`` epochs (default: the local
  budget) at ``ft_lr`` with a fresh optimizer (fine-tuning restarts from a new model each round)
  and replies it; w_p,k = that model. Nothing extra down (the global model is already there),
  ``|w|`` up. The personalized model is one round behind the aggregated global model.
* ``apfl`` (Deng et al. 2020, FedSM ref. [10], Eq. 3-5): site k keeps a local model v_k and a
  mixing weight alpha_k in its client state (v_k starts as the first global model, alpha_k as
  ``apfl_alpha``). Each round it trains v_k on the loss of the mixed model
  ``alpha_k v_k + (1 - alpha_k) w`` (parameters mixed; ``w`` = the received global model, held
  fixed), and with ``apfl_adaptive`` steps ``alpha_k <- clip(alpha_k - eta_a d/d alpha, 0, 1)``
  after every batch, ``d/d alpha = <v_k - w, grad f(mixed)>`` (APFL Algorithm 1; ``eta_a =
  apfl_alpha_lr``). APFL's own w_k is FedSM's global model, which already trains by FedAvg.
  Up: v_k and alpha_k (``|w| + 1``); nothing extra down. Server:
  ``w_p,k = alpha_k v_k + (1 - alpha_k) w_g`` with the new aggregated w_g (APFL's personalized
  model at synchronization; every float entry mixed, buffers included). APFL's reference code
  mixes the two models' outputs instead; FedSM needs one network per site, as in its Eq. 5.
  Deviation: APFL trains v against its concurrent local w iterate; here w is the round's
  received global model, the one w_p,k is built from.
* ``perfedavg`` (Per-FedAvg, Fallah et al. 2020, FedSM ref. [11]), **first-order (FO) version**:
  the server keeps a meta-model theta (the personalized track's shared model, FedAvg-weighted
  average of the sites' theta_k; separate from FedSM's FedAvg global model, which stays the
  selector's "global" choice). Down: theta (``|w|``). Site k first adapts the received theta
  with ``perfedavg_adapt_steps`` SGD steps of size alpha (``perfedavg_alpha``) on its batches:
  that is w_p,k (Per-FedAvg's personalized model of the meta-model it received). Then it trains
  theta for the local budget with the FO-MAML step: on batch D, ``temp = theta - alpha grad
  f(theta; D)``; on another batch D', ``theta <- theta - beta grad f(temp; D')`` (beta =
  ``perfedavg_beta`` through ``train.optimizer``; the Hessian term of the full version is
  dropped). Up: theta_k and w_p,k (``2|w|``).
* ``pfedme`` (Dinh et al. 2020, FedSM ref. [45], Algorithm 1): the server keeps pFedMe's global
  model w (down, ``|w|``). Site k sets w_k = theta_k = w; for R outer steps (R = the local
  budget in steps) it takes K = ``pfedme_inner_steps`` optimizer steps on theta_k for
  ``f_k(theta) + (lambda/2) ||theta - w_k||^2`` (lr ``pfedme_personal_lr``, ``train.optimizer``),
  then ``w_k <- w_k - eta lambda (w_k - theta_k)`` (eta = ``pfedme_lr``). Up: w_k and theta_k
  (``2|w|``). Server: ``w <- (1 - beta) w + beta sum_k p_k w_k`` (FedAvg weights p_k, beta =
  ``pfedme_beta``); w_p,k = theta_k. Deviation: pFedMe reuses one batch for the K inner steps;
  here each inner step draws its own batch (K times the batches, same number of gradient
  evaluations), so theta_k approximates the prox problem of the whole local loss f_k.

Every local step size above (``ft_lr``, ``apfl_alpha_lr``, ``perfedavg_alpha``/``beta``,
``pfedme_personal_lr``/``lr``) follows ``train.lr_schedule``: round t uses it times the schedule's
factor eta_t / ``train.lr`` (``fedseg.train.round_lr``); the server step ``pfedme_beta`` does not.

Per-FedAvg, APFL and pFedMe need a step the plain loop does not have (a second batch at a
shifted point, the mixed forward and alpha step, the proximal gradient and the w_k pull). Each
is a :class:`fedseg.train.TrainHooks` handed to the Trainer through ``FedSMClient.fit``; the
loop itself is the Trainer's.
"""

from __future__ import annotations

from typing import Literal

import torch
from pydantic import Field
from torch import nn
from torch.func import functional_call

from fedseg.algorithms.aggregate import server_step, softpull, weighted_average
from fedseg.algorithms.client_state import put_group, state_group
from fedseg.config import BudgetConfig
from fedseg.engine.context import ClientContext, MethodOptions
from fedseg.engine.faults import model_problem
from fedseg.engine.messages import Message, prefixed, weights_of
from fedseg.train import TrainHooks, TrainStats, batches, round_lr, segmentation_loss

Weights = dict[str, torch.Tensor]
Strategy = Literal["softpull", "ft", "apfl", "perfedavg", "pfedme"]

PERSONAL = "personal"  # message group: the personalized model w_p,k (down for softpull; up for all but apfl)
TRACK = "track"  # message/server-state group: the strategy's shared model (Per-FedAvg meta-model, pFedMe's w)
APFL_V, APFL_ALPHA = (
    "apfl_v",
    "apfl_alpha/value",
)  # client-state and message group of APFL's v_k; entry of alpha_k (0-d)
OPT_PERSONAL = "opt_personal"  # client-state prefix of the personalized track's optimizer moments


class PersonalizationOptions(MethodOptions):
    """The ``personalization`` choice and each strategy's hyperparameters (defaults from the cited
    papers where they fit a small Adam-trained UNet, see each description)."""

    personalization: Strategy = Field(
        "softpull", description="how the personalized models are produced: softpull | ft | apfl | perfedavg | pfedme"
    )
    lam: float = Field(
        0.7,
        gt=0,
        le=1,
        description="softpull: coefficient lambda of Eq. (11) in (0, 1] (paper: 0.7); below 1/K a site's own model "
        "weighs less than each other site's (outside the paper's [1/K, 1] assumption: allowed, with a warning)",
    )
    ft_epochs: int | None = Field(
        None, ge=1, description="ft: epochs fine-tuning the received global model per round; None = the local budget"
    )
    ft_lr: float | None = Field(None, gt=0, description="ft: fine-tuning learning rate; None = train.lr")
    apfl_alpha: float = Field(
        0.5,
        ge=0,
        le=1,
        description="apfl: initial (or, not adaptive, fixed) mixing weight alpha_k of the local model "
        "(APFL tries 0.25/0.5/0.75)",
    )
    apfl_adaptive: bool = Field(
        True, description="apfl: learn alpha_k by gradient steps (APFL's adaptive alpha); false = fixed"
    )
    apfl_alpha_lr: float | None = Field(
        None, gt=0, description="apfl: SGD step size on alpha_k; None = train.lr (APFL uses the models' step)"
    )
    perfedavg_alpha: float = Field(
        0.005, gt=0, description="perfedavg: inner/adaptation SGD step alpha (pFedMe's Per-FedAvg baseline: 0.005)"
    )
    perfedavg_beta: float | None = Field(
        None, gt=0, description="perfedavg: outer (meta) step size beta, train.optimizer; None = train.lr"
    )
    perfedavg_adapt_steps: int = Field(
        1, ge=1, description="perfedavg: SGD steps adapting the meta-model to a site (Per-FedAvg: 1)"
    )
    pfedme_lambda: float = Field(15.0, gt=0, description="pfedme: proximal weight lambda (pFedMe: 15)")
    pfedme_inner_steps: int = Field(
        5, ge=1, description="pfedme: K optimizer steps on theta_k per outer step (pFedMe: 5)"
    )
    pfedme_personal_lr: float | None = Field(
        None, gt=0, description="pfedme: learning rate of theta_k, train.optimizer; None = train.lr"
    )
    pfedme_lr: float = Field(
        0.005,
        gt=0,
        description="pfedme: eta of the local update w_k <- w_k - eta lambda (w_k - theta_k) (pFedMe: 0.005)",
    )
    pfedme_beta: float = Field(
        1.0, gt=0, description="pfedme: server step beta, w <- (1 - beta) w + beta avg(w_k) (pFedMe: 1 or 2)"
    )

    def site_warnings(self, num_sites: int, algorithm: str) -> list[str]:
        """SoftPull's ``lam`` below 1/K for K sites: outside FedSM's theory assumption (Sec. 3.2: the personalized
        model keeps at least the weight of a plain average) but a setting its own Table 7 runs (lambda = 0.1 with
        6 sites), so allowed, announced when the run starts; the other strategies have no such rule."""
        if self.personalization == "softpull" and self.lam < 1.0 / num_sites - 1e-12:
            return [
                f"warning: methods.{algorithm}.lam = {self.lam} is below 1/K = {1.0 / num_sites:.4g} for K = "
                f"{num_sites} sites: each site's own model weighs less than each other site's in SoftPull (Eq. 11), "
                "outside the paper's [1/K, 1] assumption"
            ]
        return []


def combined(main: TrainStats, *others: TrainStats) -> TrainStats:
    """Steps and samples of every fit of the track; the loss of the main one."""
    every = (main, *others)
    return TrainStats(sum(s.steps for s in every), sum(s.samples for s in every), main.mean_loss)


def round_budget(ctx: ClientContext) -> BudgetConfig:
    """The local budget of one round: ``local_steps`` if set, else ``train.budget``."""
    return ctx.options.local_budget() or ctx.cfg.train.budget


def round_rate(ctx: ClientContext, rate: float) -> float:
    """A configured local step size in this round: scaled like ``train.lr`` by ``train.lr_schedule``
    (``fedseg.train.round_lr``; the rates the Trainer uses are scaled by ``FedSMClient.fit`` itself)."""
    return round_lr(ctx.cfg.train, ctx.round, ctx.cfg.fl.rounds, rate)


class Personalization:
    """One way to produce the personalized models (see the module docstring). Stateless: the
    server keeps ``personal`` (site -> w_p,k) and ``track``; sites keep theirs in client state."""

    MODELS: tuple[str, ...] = (PERSONAL,)  # the reply groups that hold one model each (``reply_problem``)

    def __init__(self, options: PersonalizationOptions):
        self.options = options

    def initial_track(self, global_weights: Weights) -> Weights:
        """The server's shared track model before round 1 (none by default)."""
        return {}

    def down(self, site: str, personal: dict[str, Weights], track: Weights) -> dict[str, torch.Tensor]:
        """Tensors for ``site``'s train message besides the global model (none by default)."""
        return {}

    def train(
        self, client, msg: Message, global_weights: Weights, ctx: ClientContext
    ) -> tuple[dict[str, torch.Tensor], TrainStats]:
        """Site side: train the track (``client``: the FedSMClient, for ``segmenter`` and ``fit``);
        return the reply tensors and the training statistics."""
        raise NotImplementedError

    def reply_problem(self, reply: Message, global_weights: Weights) -> str | None:
        """Why ``merge`` cannot use a site's train reply: each group of :attr:`MODELS` is missing or not a model of
        the global model's names, shapes and dtypes (``fedseg.engine.faults.model_problem``; the engine checks
        only the groups it sent): a malformed one became a site's personalized model, which every site then
        failed to load at evaluation."""
        for group in self.MODELS:
            if not reply.group(group):
                return f"it returned no {group}/ model"
            if problem := model_problem(reply.group(group), global_weights):
                return f"its {group}/ model: {problem}"
        return None

    def merge(
        self, replies: dict[str, Message], weights: dict[str, float], global_weights: Weights, track: Weights
    ) -> tuple[dict[str, Weights], Weights]:
        """Server side: ``(personalized models by site, new track)`` from the replies; ``weights``
        are FedAvg's aggregation weights, ``global_weights`` the new global model."""
        return {s: r.group(PERSONAL) for s, r in replies.items()}, track


class SoftPull(Personalization):
    def down(self, site, personal, track):
        return prefixed(PERSONAL, personal[site])

    def train(self, client, msg, global_weights, ctx):
        model = client.segmenter(msg.group(PERSONAL), ctx, slot=f"train/{PERSONAL}")
        stats = client.fit(model, msg, ctx, state_key=OPT_PERSONAL)
        return prefixed(PERSONAL, weights_of(model)), stats

    def merge(self, replies, weights, global_weights, track):
        return softpull({s: r.group(PERSONAL) for s, r in replies.items()}, self.options.lam), track


class FineTune(Personalization):
    def train(self, client, msg, global_weights, ctx):
        opt = self.options
        model = client.segmenter(global_weights, ctx)
        cfg = ctx.cfg.train.model_copy(update={"lr": opt.ft_lr or ctx.cfg.train.lr, "keep_optimizer_state": False})
        budget = BudgetConfig(unit="epochs", amount=opt.ft_epochs) if opt.ft_epochs else None
        stats = client.fit(model, msg, ctx, state_key=OPT_PERSONAL, train_cfg=cfg, budget=budget)
        return prefixed(PERSONAL, weights_of(model)), stats


class APFLMixing(TrainHooks):
    """APFL's mixed model ``alpha v + (1 - alpha) w`` around the trained network v: ``forward`` runs v
    with mixed parameters (w fixed), ``after_backward`` steps the scalar alpha (not a parameter of the
    optimizer) if ``alpha_lr``."""

    def __init__(self, v: nn.Module, w: Weights, alpha: float, alpha_lr: float | None):
        device = next(v.parameters()).device
        self.w = {n: w[n].to(device) for n, _ in v.named_parameters()}
        self.alpha = torch.tensor(float(alpha), device=device, requires_grad=alpha_lr is not None)
        self.alpha_lr = alpha_lr

    def forward(self, model: nn.Module, x: torch.Tensor) -> torch.Tensor:
        a = self.alpha
        mixed = {n: a * p + (1 - a) * self.w[n] for n, p in model.named_parameters()}
        return functional_call(model, mixed, (x,))

    def after_backward(self, model: nn.Module) -> None:
        """APFL's alpha step: ``alpha <- clip(alpha - alpha_lr * dL/d alpha, 0, 1)``."""
        if self.alpha_lr is None or self.alpha.grad is None:
            return
        with torch.no_grad():
            self.alpha.copy_((self.alpha - self.alpha_lr * self.alpha.grad).clamp(0.0, 1.0))
        self.alpha.grad = None


class APFL(Personalization):
    MODELS = (APFL_V,)

    def reply_problem(self, reply: Message, global_weights: Weights) -> str | None:
        """Personalization's check, and the mixing weight alpha_k one number in [0, 1] (Eq. of APFL: the
        personalized model is ``alpha v_k + (1 - alpha) w``; an alpha of 1e6 extrapolated the site's own model)."""
        if problem := super().reply_problem(reply, global_weights):
            return problem
        alpha = reply.tensors.get(APFL_ALPHA)
        if alpha is None or alpha.numel() != 1 or not alpha.is_floating_point() or not 0 <= float(alpha) <= 1:
            return (
                f"its APFL alpha is {None if alpha is None else alpha.flatten()[:3].tolist()}, not one number in [0, 1]"
            )
        return None

    def train(self, client, msg, global_weights, ctx):
        opt = self.options
        v = client.segmenter(state_group(ctx.state, APFL_V) or global_weights, ctx)
        alpha = float(ctx.state.get(APFL_ALPHA, torch.tensor(opt.apfl_alpha)))
        alpha_lr = round_rate(ctx, opt.apfl_alpha_lr or ctx.cfg.train.lr) if opt.apfl_adaptive else None
        mixing = APFLMixing(v, global_weights, alpha, alpha_lr)
        stats = client.fit(v, msg, ctx, state_key=OPT_PERSONAL, hooks=mixing)
        v_k, alpha_k = weights_of(v), mixing.alpha.detach().cpu().reshape(())
        put_group(ctx.state, APFL_V, v_k)
        ctx.state[APFL_ALPHA] = alpha_k.clone()
        return {**prefixed(APFL_V, v_k), APFL_ALPHA: alpha_k}, stats

    def merge(self, replies, weights, global_weights, track):
        personal = {}
        for s, r in replies.items():
            a = float(r.tensors[APFL_ALPHA])
            personal[s] = weighted_average([r.group(APFL_V), global_weights], [a, 1.0 - a])
        return personal, track


class FirstOrderMAML(TrainHooks):
    """Per-FedAvg's FO step: after the Trainer's backward at theta on batch D, ``after_backward``
    moves to ``temp = theta - alpha g`` (SGD), computes ``grad f(temp; D')`` on a fresh batch D',
    and restores theta, leaving that gradient for the optimizer's step. D' is drawn like the Trainer's
    D (``CaseSet.training_batch``, without augmentation) from the site's stream: whole images, or on
    the volume path one random patch per case."""

    def __init__(self, ctx: ClientContext, alpha: float):
        self.alpha = alpha
        self.data = ctx.data.train
        self.device = ctx.task.device
        self.loss_fn = segmentation_loss(ctx.cfg.train)
        self.generator = ctx.generator
        self.second = batches(len(self.data), ctx.cfg.train.batch_size, ctx.generator, endless=True)

    def after_backward(self, model: nn.Module) -> None:
        params = [p for p in model.parameters() if p.grad is not None]
        theta = [p.detach().clone() for p in params]
        with torch.no_grad():
            for p in params:
                p.sub_(self.alpha * p.grad)  # type: ignore[operator]  # params are those with a gradient
        x, y = self.data.training_batch(next(self.second), self.device, self.generator)
        model.zero_grad(set_to_none=True)
        self.loss_fn(model(x), y).backward()
        with torch.no_grad():
            for p, t in zip(params, theta):
                p.copy_(t)


def sgd_steps(client, model: nn.Module, msg: Message, ctx: ClientContext, lr: float, steps: int) -> TrainStats:
    """``steps`` plain SGD steps of size ``lr`` on the site's batches (fresh optimizer, no momentum)."""
    cfg = ctx.cfg.train.model_copy(
        update={"optimizer": "sgd", "lr": lr, "momentum": 0.0, "weight_decay": 0.0, "keep_optimizer_state": False}
    )
    return client.fit(
        model, msg, ctx, state_key=OPT_PERSONAL, train_cfg=cfg, budget=BudgetConfig(unit="steps", amount=steps)
    )


class SharedTrack(Personalization):
    """A strategy whose server keeps one shared model (``TRACK``, starting as the initial global
    model): sent to every site, their trained versions come back under ``TRACK`` and are averaged
    with FedAvg's weights (then ``server_update``); w_p,k comes back under ``PERSONAL``."""

    MODELS = (TRACK, PERSONAL)

    def initial_track(self, global_weights):
        return {k: v.clone() for k, v in global_weights.items()}

    def down(self, site, personal, track):
        return prefixed(TRACK, track)

    def merge(self, replies, weights, global_weights, track):
        sites = list(replies)
        average = weighted_average([replies[s].group(TRACK) for s in sites], [weights[s] for s in sites])
        return {s: replies[s].group(PERSONAL) for s in sites}, self.server_update(track, average)

    def server_update(self, track: Weights, average: Weights) -> Weights:
        """The new shared model from the old one and the sites' average (default: the average)."""
        return average


class PerFedAvg(SharedTrack):
    def train(self, client, msg, global_weights, ctx):
        opt = self.options
        adapted = client.segmenter(msg.group(TRACK), ctx)
        adapt = sgd_steps(client, adapted, msg, ctx, opt.perfedavg_alpha, opt.perfedavg_adapt_steps)
        meta = client.segmenter(msg.group(TRACK), ctx)
        cfg = ctx.cfg.train.model_copy(update={"lr": opt.perfedavg_beta or ctx.cfg.train.lr})
        maml = FirstOrderMAML(ctx, round_rate(ctx, opt.perfedavg_alpha))
        stats = client.fit(meta, msg, ctx, state_key=OPT_PERSONAL, train_cfg=cfg, hooks=maml)
        return {**prefixed(TRACK, weights_of(meta)), **prefixed(PERSONAL, weights_of(adapted))}, combined(stats, adapt)


class Proximal(TrainHooks):
    """pFedMe's theta_k (the trained network) pulled towards the local model w_k (trainable parameters only).

    ``after_backward`` adds the proximal gradient ``lambda (theta - w_k)``; every ``inner`` steps
    (before the next block) and once after training (``pull``) it updates
    ``w_k <- w_k - eta lambda (w_k - theta_k)``."""

    def __init__(self, net: nn.Module, lam: float, eta: float, inner: int):
        self.net = net
        self.lam, self.eta, self.inner = lam, eta, inner
        self.w = {n: p.detach().clone() for n, p in net.named_parameters() if p.requires_grad}
        self.calls = 0

    def pull(self) -> None:
        with torch.no_grad():
            for n, p in self.net.named_parameters():
                if n in self.w:
                    self.w[n] -= self.eta * self.lam * (self.w[n] - p)

    def after_backward(self, model: nn.Module) -> None:
        if self.calls and self.calls % self.inner == 0:
            self.pull()
        self.calls += 1
        with torch.no_grad():
            for n, p in self.net.named_parameters():
                if n in self.w:
                    prox = self.lam * (p - self.w[n])
                    p.grad = prox if p.grad is None else p.grad + prox

    def local_weights(self) -> Weights:
        """w_k as a full weight dict (buffers, if any, from theta_k)."""
        return {**weights_of(self.net), **{n: t.detach().cpu() for n, t in self.w.items()}}


class PFedMe(SharedTrack):
    def train(self, client, msg, global_weights, ctx):
        opt = self.options
        theta = client.segmenter(msg.group(TRACK), ctx)
        prox = Proximal(theta, opt.pfedme_lambda, round_rate(ctx, opt.pfedme_lr), opt.pfedme_inner_steps)
        outer = round_budget(ctx)
        budget = BudgetConfig(
            unit=outer.unit, amount=outer.amount * opt.pfedme_inner_steps
        )  # K inner steps per outer step
        cfg = ctx.cfg.train.model_copy(update={"lr": opt.pfedme_personal_lr or ctx.cfg.train.lr})
        stats = client.fit(theta, msg, ctx, state_key=OPT_PERSONAL, train_cfg=cfg, budget=budget, hooks=prox)
        prox.pull()  # the last block's update of w_k
        return {**prefixed(TRACK, prox.local_weights()), **prefixed(PERSONAL, weights_of(theta))}, stats

    def server_update(self, track, average):
        """``w <- (1 - beta) w + beta avg(w_k)``."""
        return server_step(track, average, self.options.pfedme_beta)


STRATEGIES: dict[str, type[Personalization]] = {
    "softpull": SoftPull,
    "ft": FineTune,
    "apfl": APFL,
    "perfedavg": PerFedAvg,
    "pfedme": PFedMe,
}


def personalization(options: PersonalizationOptions) -> Personalization:
    """The strategy ``options.personalization`` names (the options model has already validated it)."""
    return STRATEGIES[options.personalization](options)
