"""Auto-FedAvg (Xia et al., 2021, Alg. 1): FedAvg whose aggregation weights alpha = gamma(beta) are
learned by the sites from their own data.

What differs from FedAvg: the merge. Each round the sites train the received global model as in
FedAvg (same local loop, same reply); the server merges with ``w = sum_k alpha_k w_k`` (per layer
group for layer-wise weights) instead of ``n_k / n``. In rounds t with ``t mod t0 = 0``
(``learn_steps`` S > 0) the server first runs LearnAggWeight on the K fresh local models:

1. exchange ``learn_models`` (``INSTALL``): site k receives the K - 1 other sites' models (it
   kept its own when it trained) — the ``(K - 1) |w|`` floats down per site that make the extra
   traffic ``(K - 1) / (2 t0)`` of FedAvg's (Sec. 3.3); the reply is empty;
2. S learning steps, ``sync_every`` per exchange ``learn_weights`` (``LEARN``; default 1: one
   exchange per step, the paper's algorithm): the server sends beta (``(G, K)`` floats), each
   site takes ``count`` steps — sample a mini-batch of its training split (the input training feeds
   the model: whole images, or on the volume path one random patch per case, ``CaseSet.training_batch``), form
   ``sum_k alpha_k w_k`` with alpha from its current beta (softmax, or a Dirichlet sample), compute
   the segmentation loss of that model (eval mode: the model as it will be deployed), step beta —
   and replies its beta; the server averages the K replies into the next beta. With
   ``sync_every`` > 1 a site takes several steps on its own beta between averages: fewer
   exchanges, not the paper's exact iteration.

Between learning rounds the server reuses the last beta (the paper's default); ``reinit`` restarts
beta at ``beta_init`` (and the sites' beta-optimizer moments) before every learning round (the
experiment of Sec. 4.2.2's text, 61.84% against 63.11% test Dice; the text calls it "N-Dirichlet*", but Table 2's *
marks t0 = 10, option ``t0``). Before the first learning round alpha = gamma(beta_init):
uniform. Options: ``methods.<name>.{t0, learn_steps, sync_every, beta_init, beta_lr,
beta_optimizer, reinit, local_steps}``; the parameterization (softmax | dirichlet, Eq. 4-6) and
granularity (network | layer) are fixed by the registered name (:mod:`.weights` defines both).

Randomness: step s of a round uses the stream of (seed, site, round, ``"learn_weights/<s>"``) for
its mini-batch (cases, then on the volume path their patch positions) and its Dirichlet sample, so
the numbers do not depend on the engine or on ``sync_every``'s grouping. The beta optimizer (Adam or
SGD at ``beta_lr``) keeps its moments in the site's state across learning rounds. Model buffers
(BatchNorm statistics) are merged with their layer's alpha like the weights (FedAvg's
samples-weighted buffer average is not applied).

Round metrics (``round_metrics.csv``, per site): ``alpha`` and ``beta`` (layer-wise: the mean
over groups), ``learned`` (1 in a learning round), and layer-wise ``alpha@<group>``,
``beta@<group>``.
"""

from __future__ import annotations

from typing import Literal

import torch
from pydantic import Field, model_validator
from torch import nn
from torch.func import functional_call

from fedseg.algorithms.aggregate import combine
from fedseg.algorithms.autofedavg.family import AUTOFEDAVG
from fedseg.algorithms.autofedavg.weights import (
    BETA_FLOOR,
    LayerGroups,
    blend,
    learning_alpha,
    merge_alpha,
    stack_models,
)
from fedseg.algorithms.client_state import put_group, state_group
from fedseg.algorithms.fedavg import BudgetOptions, FedAvgClient, FedAvgServer
from fedseg.algorithms.prefixes import MODEL
from fedseg.algorithms.registry import AlgorithmSpec
from fedseg.engine.context import ClientContext, State, Task, options_as, stream_seed
from fedseg.engine.messages import Message, prefixed
from fedseg.train import TrainStats, load_optimizer_state, optimizer_state, segmentation_loss

INSTALL = "learn_models"  # exchange: the other sites' local models, once per learning round
LEARN = "learn_weights"  # exchange: beta down, a site's updated beta up
BETA = "beta"  # message tensor (G, K) float64
MODELS = "autofedavg/models"  # client-state prefix: the K local models, "<prefix>/<site index>/<key>"
BETA_OPT = "autofedavg/beta_opt"  # client-state prefix: the beta optimizer's moments

ADAM_STEP_BOUND = 10.0  # an Adam step moves an entry about lr (at most ~3 lr early on): 10 lr is no honest one


class AutoFedAvgOptions(BudgetOptions):
    """``methods.<autofedavg-*>``: Auto-FedAvg (Alg. 1). ``parameterization``/``granularity`` are
    set by each registered variant and cannot be changed."""

    parameterization: Literal["softmax", "dirichlet"]
    granularity: Literal["network", "layer"]
    t0: int = Field(
        1, ge=1, description="learn the weights in rounds t with t mod t0 = 0 (paper: 1; starred rows 10, 5)"
    )
    learn_steps: int = Field(10, ge=0, description="S: beta steps per learning round (0: never learn)")
    sync_every: int = Field(1, ge=1, description="beta steps a site takes between two server averages (1 = Alg. 1)")
    beta_init: float = Field(6.0, description="initial beta_k (every site, every group; paper: 6.0 for Dirichlet)")
    beta_lr: float = Field(
        0.005,
        gt=0,
        description="learning rate of the beta optimizer (chosen on validation, see docs/algorithms.md)",
    )
    beta_optimizer: Literal["adam", "sgd"] = Field("adam", description="optimizer of beta on the sites")
    reinit: bool = Field(
        False, description="restart beta at beta_init before every learning round (Sec. 4.2.2's text experiment)"
    )

    @model_validator(mode="after")
    def _positive_concentration(self) -> AutoFedAvgOptions:
        if self.parameterization == "dirichlet" and self.beta_init <= 0:
            raise ValueError(f"beta_init must be > 0 for a Dirichlet concentration, got {self.beta_init}")
        return self


class NetworkDirichletOptions(AutoFedAvgOptions):
    parameterization: Literal["dirichlet"] = "dirichlet"
    granularity: Literal["network"] = "network"


class NetworkSoftmaxOptions(AutoFedAvgOptions):
    parameterization: Literal["softmax"] = "softmax"
    granularity: Literal["network"] = "network"


class LayerDirichletOptions(AutoFedAvgOptions):
    parameterization: Literal["dirichlet"] = "dirichlet"
    granularity: Literal["layer"] = "layer"


class LayerSoftmaxOptions(AutoFedAvgOptions):
    parameterization: Literal["softmax"] = "softmax"
    granularity: Literal["layer"] = "layer"


def learns(options: AutoFedAvgOptions, rnd: int) -> bool:
    """Whether round ``rnd`` runs LearnAggWeight (Alg. 1: ``t mod t0 = 0``, and S > 0)."""
    return options.learn_steps > 0 and rnd % options.t0 == 0


class AutoFedAvgServer(FedAvgServer):
    """FedAvg's server with a learned merge (see the module docstring). State: the global model and beta."""

    options: AutoFedAvgOptions  # this method's options (``FedAvgServer.options``)

    def __init__(self, engine, task: Task, options: AutoFedAvgOptions):
        super().__init__(engine, task, options)
        self.groups = LayerGroups.of_model(task.new_model(), options.granularity)
        self.beta = self.initial_beta()

    def initial_beta(self) -> torch.Tensor:
        """``(G, K)`` float64, every entry ``beta_init`` (alpha uniform under both parameterizations)."""
        return torch.full(
            (len(self.groups), len(self.engine.sites)), float(self.options.beta_init), dtype=torch.float64
        )

    @property
    def alpha(self) -> torch.Tensor:
        """``(G, K)`` float64: the weights of the merge, gamma(beta) (Eq. 4 or Eq. 6)."""
        return merge_alpha(self.beta, self.options.parameterization)

    def aggregate(self, replies: dict[str, Message]) -> None:
        """Learn beta first in a learning round, then ``w_p = sum_k alpha_{k,p} w_{k,p}`` per layer group p."""
        if learns(self.options, self.engine.round):
            self.beta = self.learn_beta(replies)
        sites = self.engine.sites
        rows = self.alpha.tolist()  # python floats (float64), one row per group
        self.global_weights = combine([replies[s].group(MODEL) for s in sites], lambda key: rows[self.groups.of[key]])

    def average_buffers(self, replies: dict[str, Message]) -> None:
        """Nothing: ``aggregate`` merged the buffers with their layer's alpha (a convex combination of
        statistics is a valid statistic), so they follow the learned weights."""

    def learn_beta(self, replies: dict[str, Message]) -> torch.Tensor:
        """LearnAggWeight (Alg. 1) on the sites' fresh local models; returns the new beta ``(G, K)``."""
        sites, opts = self.engine.sites, self.options
        models = {s: replies[s].group(MODEL) for s in sites}
        self.engine.exchange(
            {
                s: Message(
                    {
                        k: v
                        for j, o in enumerate(sites)
                        if o != s
                        for k, v in prefixed(f"{MODELS}/{j}", models[o]).items()
                    }
                )
                for s in sites
            },
            INSTALL,
        )
        beta = self.initial_beta() if opts.reinit else self.beta
        for first in range(0, opts.learn_steps, opts.sync_every):
            count = min(opts.sync_every, opts.learn_steps - first)
            meta = {
                "step": first,
                "count": count,
                "last": first + count == opts.learn_steps,
                "reset": opts.reinit and first == 0,
            }
            answers = self.engine.exchange(
                {s: Message({BETA: beta}, dict(meta)) for s in sites}, LEARN, self.beta_reply_problem
            )
            beta = torch.stack([answers[s].tensors[BETA].to(torch.float64) for s in sites]).mean(dim=0)
        return beta

    def beta_reply_problem(self, site: str, sent: Message, reply: Message) -> str | None:
        """A site's beta after ``count`` learning steps from the beta sent (the engine checks its shape, dtype and
        NaN/Inf): under Dirichlet at least ``BETA_FLOOR`` (a concentration), and with Adam within
        :data:`ADAM_STEP_BOUND` x ``beta_lr`` per step of it (Adam's step is about ``beta_lr`` whatever the
        gradient): beta is averaged over the sites, so one site's beta of 1e30 made its model the global one. With
        SGD the step is the gradient's, and a site's beta its word."""
        beta, start, opts = reply.tensors[BETA].double(), sent.tensors[BETA].double(), self.options
        if opts.parameterization == "dirichlet" and bool((beta < BETA_FLOOR).any()):
            return f"its beta holds {float(beta.min()):g}, below the Dirichlet floor {BETA_FLOOR:g}"
        if opts.beta_optimizer == "adam":
            bound = ADAM_STEP_BOUND * opts.beta_lr * int(sent.meta["count"])
            moved = float((beta - start).abs().max())
            if moved > bound:
                return f"its beta moved {moved:.3g} in {sent.meta['count']} Adam steps of beta_lr {opts.beta_lr:g}"
        return None

    def round_metrics(self) -> list[dict]:
        alpha, beta = self.alpha, self.beta
        learned = float(learns(self.options, self.engine.round))
        rows = []
        for i, site in enumerate(self.engine.sites):
            rows += [
                {"site": site, "metric": "alpha", "value": float(alpha[:, i].mean())},
                {"site": site, "metric": "beta", "value": float(beta[:, i].mean())},
                {"site": site, "metric": "learned", "value": learned},
            ]
            if self.options.granularity == "layer":
                for g, name in enumerate(self.groups.names):
                    rows += [
                        {"site": site, "metric": f"alpha@{name}", "value": float(alpha[g, i])},
                        {"site": site, "metric": f"beta@{name}", "value": float(beta[g, i])},
                    ]
        return rows

    def state_dict(self) -> dict[str, torch.Tensor]:
        return {**super().state_dict(), "autofedavg/beta": self.beta.clone()}

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        super().load_state_dict(state)
        self.beta = state["autofedavg/beta"].clone()


class AutoFedAvgClient(FedAvgClient):
    """FedAvg's local training; in learning rounds it keeps its model and learns beta on its data."""

    def after_fit(self, model: nn.Module, stats: TrainStats, msg: Message, ctx: ClientContext) -> Message:
        reply = super().after_fit(model, stats, msg, ctx)
        if learns(
            options_as(ctx.options, AutoFedAvgOptions), ctx.round
        ):  # its own w_k, for LearnAggWeight (the server sends the others)
            put_group(ctx.state, f"{MODELS}/{ctx.site_index}", reply.group(MODEL))
        return reply

    def on_learn_models(self, msg: Message, ctx: ClientContext) -> Message:
        """Keep the other sites' models until the last learning step of the round."""
        for j in range(ctx.num_sites):
            if j != ctx.site_index:
                put_group(ctx.state, f"{MODELS}/{j}", msg.group(f"{MODELS}/{j}"))
        return Message({}, {"steps": 0})

    def on_learn_weights(self, msg: Message, ctx: ClientContext) -> Message:
        """``count`` beta steps from the received beta on mini-batches of the site's training split."""
        opts = options_as(ctx.options, AutoFedAvgOptions)
        models = [state_group(ctx.state, f"{MODELS}/{j}") for j in range(ctx.num_sites)]
        if not all(models):
            raise ValueError(
                f"site {ctx.site}: {LEARN} before {INSTALL} in round {ctx.round}: the local models are missing"
            )
        device = ctx.task.device
        model = ctx.task.new_model().eval()  # the loss of the merged model as it will be deployed
        groups = LayerGroups.of_model(model, opts.granularity)
        buffers = {name for name, _ in model.named_buffers()}  # BatchNorm's statistics: blended, not learned through
        stacked = stack_models(models, device)
        beta = msg.tensors[BETA].to(torch.float64).clone().requires_grad_(True)  # stays on the CPU: (G, K)
        optimizer = beta_optimizer(opts, beta)
        restore_moments(optimizer, ctx.state, reset=bool(msg.meta["reset"]))
        loss_fn = segmentation_loss(ctx.cfg.train)
        first, count = int(msg.meta["step"]), int(msg.meta["count"])
        losses = []
        for step in range(first, first + count):
            seed = stream_seed(ctx.cfg.seed, ctx.site_index, ctx.round, f"{LEARN}/{step}")
            generator = torch.Generator().manual_seed(seed)
            order = torch.randperm(len(ctx.data.train), generator=generator)
            x, y = ctx.data.train.training_batch(order[: ctx.cfg.train.batch_size], device, generator)
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(seed)
                alpha = learning_alpha(beta, opts.parameterization)
            blended = blend(stacked, alpha, groups.of, buffers)
            loss = loss_fn(functional_call(model, blended, (x,)), y)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            if opts.parameterization == "dirichlet":
                with torch.no_grad():
                    beta.clamp_(min=BETA_FLOOR)
            losses.append(float(loss.detach()))
        put_group(ctx.state, BETA_OPT, optimizer_state(optimizer))
        if msg.meta["last"]:
            put_group(ctx.state, MODELS, {})
        return Message({BETA: beta.detach().clone()}, {"steps": count, "loss": sum(losses) / len(losses)})


def beta_optimizer(options: AutoFedAvgOptions, beta: torch.Tensor) -> torch.optim.Optimizer:
    if options.beta_optimizer == "adam":
        return torch.optim.Adam([beta], lr=options.beta_lr)
    return torch.optim.SGD([beta], lr=options.beta_lr)


def restore_moments(optimizer: torch.optim.Optimizer, state: State, reset: bool) -> None:
    """Continue the site's beta-optimizer moments from its state (none: fresh), or drop them (``reset``)."""
    if reset:
        put_group(state, BETA_OPT, {})
    elif moments := state_group(state, BETA_OPT):
        load_optimizer_state(optimizer, moments)


def _spec(name: str, display: str, options: type[AutoFedAvgOptions], what: str) -> AlgorithmSpec:
    defaults = options.model_fields
    return AlgorithmSpec(
        name,
        display,
        AutoFedAvgServer,
        AutoFedAvgClient,
        f"Auto-FedAvg: {what} aggregation weights learned by the sites every t0 rounds",
        options,
        family=AUTOFEDAVG,
        min_sites=2,
        needs_every_site=True,
        extra={
            "parameterization": defaults["parameterization"].default,
            "granularity": defaults["granularity"].default,
        },
        on_secure_aggregation="it learns the aggregation weights from every site's individual model",
    )


SPECS = (
    _spec("autofedavg-n-dirichlet", "Auto-FedAvg-N-Dirichlet", NetworkDirichletOptions, "network-wise Dirichlet"),
    _spec("autofedavg-n-softmax", "Auto-FedAvg-N-Softmax", NetworkSoftmaxOptions, "network-wise softmax"),
    _spec("autofedavg-l-dirichlet", "Auto-FedAvg-L-Dirichlet", LayerDirichletOptions, "layer-wise Dirichlet"),
    _spec("autofedavg-l-softmax", "Auto-FedAvg-L-Softmax", LayerSoftmaxOptions, "layer-wise softmax"),
)
