"""q-FedAvg (Li et al., ICLR 2020) as specified by the FeTS benchmark, section 3.2.6, Eq. 13-17.

Fair objective (Eq. 13): ``min_w sum_k p_k / (q + 1) * F_k(w)^(q + 1)``; ``q = 0`` is FedAvg,
larger ``q`` gives more weight to the sites where the global model does worse. One round t:

1. exchange ``"loss"`` (``LOSS_ACTION``): the server sends ``w^t``; site k computes
   ``F_k(w^t)`` (Eq. 15) with a forward-only pass over its training split (on the volume path:
   one random training patch per case, from the stream of (seed, site, round, ``"loss"``)) and keeps ``w^t`` and
   ``F_k`` in its state until the train exchange of the same round. Reply: no tensors;
   ``meta.steps`` = the forward-only batches (``ceil(n_k / train.batch_size)``).
2. exchange ``"train"``: an empty message; site k trains from the ``w^t`` it kept (the local
   loop, ``train.budget`` or ``local_steps``) and replies
   ``Delta_k = L F_k^q Delta w_k`` (Eq. 14, ``Delta w_k = w_k - w^t``, all float entries of
   the model, sent as the model's dtype) and ``h_k`` (Eq. 16, one float).
3. the server applies Eq. 17: ``w^{t+1} = w^t + sum_k Delta_k / sum_k h_k``.

Ledger convention: the loss pass is its own exchange, so the ledger shows it distinctly — rows
with ``action = "loss"`` whose ``steps`` are forward-only batches (no optimizer step), with
the model download in their ``floats_down``; the ``"train"`` rows carry the SGD steps and the
upload (``|w| + 1`` floats). The train message is empty so that ``w^t`` is downloaded once per
round: traffic per round is FedAvg's plus one float per site (``h_k``), as in FeTS Table 2.
``Ledger.totals()["sgd_steps"]`` (summary.json ``sgd_steps``) counts only the optimizer steps (Eq. 34);
the cost table (:mod:`fedseg.evaluate.cost`) reports the forward-only batches apart (``forward_batches``).

Definitions, where the sources differ:

* ``F_k`` is Eq. 15's **sum** of the per-case losses over the site's training split
  (``loss_reduction = "sum"``); Eq. 13 and Li et al. use the mean (``"mean"``). The per-case
  loss is the training loss (``train.loss``) in eval mode, without gradients. With the sum,
  ``F_k^q = n_k^q Fbar_k^q`` (``Fbar_k`` the mean): at the paper's ``q = 1`` the merge weights
  site k by ``n_k Fbar_k``, Eq. 13's ``p_k Fbar_k^q``; with the mean the ``p_k`` drop out (Li et
  al. sample sites with probability ``p_k`` instead).
* ``h_k`` follows Eq. 16 as printed, ``q F^(q-1) ||Delta w_k||^2 + L F^q`` with the unscaled
  update (``h_norm = "fets"``). Li et al.'s Algorithm 3 (and Flower's ``QFedAvg``) use the
  scaled update ``||L Delta w_k||^2`` in the first term (``h_norm = "li"``).
* ``L`` (the Lipschitz estimate, ``1 / eta_l`` in Eq. 14 and 16) defaults to ``1 / train.lr`` (the
  round's rate under ``train.lr_schedule``, the one the local steps use).

At ``q = 0``: ``Delta_k = L Delta w_k`` and ``h_k = L``, so Eq. 17 is
``w^t + (1 / K) sum_k Delta w_k`` — FedAvg with *uniform* weights (the ``p_k`` of Eq. 13 do
not appear in the update).
"""

from __future__ import annotations

import math
from typing import Literal

import torch
from pydantic import Field
from torch import nn

from fedseg.algorithms.client_state import put_group, state_group
from fedseg.algorithms.fedavg import BudgetOptions, FedAvgClient, FedAvgServer, train_meta
from fedseg.algorithms.prefixes import MODEL
from fedseg.algorithms.registry import AlgorithmSpec
from fedseg.config import TrainConfig
from fedseg.data.dataset import CaseSet
from fedseg.engine.context import ClientContext, options_as
from fedseg.engine.faults import is_loss
from fedseg.engine.messages import Message, load_weights, prefixed, weights_of
from fedseg.train import TrainStats, round_lr, segmentation_loss

LOSS_ACTION = "loss"  # the forward-only exchange (fedseg.evaluate.cost.FORWARD_ACTIONS)
DELTA = "delta"  # message prefix of Delta_k (Eq. 14)
H = "h"  # message tensor name of h_k (Eq. 16), shape (1,)
START = "qfedavg/start"  # client-state prefix: w^t kept between the loss and the train exchange
F_KEY = "qfedavg/F"  # client-state entry: F_k(w^t), shape ()
H_RTOL = 1e-4  # a reply's h_k against Eq. 16 recomputed from its F and Delta (Delta travels as float32)

Weights = dict[str, torch.Tensor]


class QFedAvgOptions(BudgetOptions):
    """``methods.qfedavg``: q-FedAvg (FeTS Eq. 13-17)."""

    q: float = Field(1.0, ge=0, description="fairness exponent q (FeTS Table 4: q = 1.0); 0 = uniform FedAvg")
    L: float | None = Field(
        None, gt=0, description="Lipschitz estimate L = 1 / eta_l in Eq. 14, 16; None = 1 / train.lr (the round's rate)"
    )
    loss_reduction: Literal["sum", "mean"] = Field(
        "sum", description="F_k = sum (Eq. 15) or mean (Eq. 13, Li et al.) of the per-case training losses"
    )
    h_norm: Literal["fets", "li"] = Field(
        "fets", description="first term of h_k: ||Delta w_k||^2 (Eq. 16) or ||L Delta w_k||^2 (Li et al., Flower)"
    )


def lipschitz(options: QFedAvgOptions, lr: float) -> float:
    """``L``: the option if set, else ``1 / lr`` (Li et al.)."""
    return float(options.L) if options.L is not None else 1.0 / lr


def dataset_loss(
    model: nn.Module,
    data: CaseSet,
    train: TrainConfig,
    device: torch.device,
    generator: torch.Generator | None = None,
    whole_cases: bool = False,
) -> tuple[float, int]:
    """``sum_{(x, y) in data} l(w, x, y)`` (Eq. 15 / Eq. 19): the per-case training loss (``train.loss`` with
    ``train.dice_smooth``, ``fedseg.train.segmentation_loss``) summed over every case of ``data``, forward only
    (eval mode, no gradients), in order, ``train.batch_size`` cases per batch. Returns ``(sum, number of forward
    batches)``.

    With a ``generator``, each case is the input training feeds the model (``CaseSet.training_batch``):
    its whole fixed-size image, or on the volume path one random training patch per case drawn from
    ``generator`` (the same draw as the Trainer's, without augmentation) — the loss of the model on
    what it trains on. Without one, the fixed-size view (``CaseSet.batch``).

    With ``whole_cases`` (a validation loss: the model as it is deployed), on the volume path each case is
    the model's prediction over the whole case, :func:`sliding_loss`; on the whole-image path it changes
    nothing (the fixed-size image is the whole case and the model's input).

    The MONAI losses average per-case losses over a batch, so ``batch loss * batch length`` is
    the sum of that batch's per-case losses. An empty set gives ``(0.0, 0)``.
    """
    loss_fn, batch_size = segmentation_loss(train), train.batch_size
    if whole_cases and data.volumes is not None and data.volume is not None:
        return sliding_loss(model, data, loss_fn, device)
    was_training = model.training
    model.eval()
    total, batches = 0.0, 0
    with torch.no_grad():
        for idx in torch.arange(len(data)).split(batch_size):
            x, y = data.batch(idx, device) if generator is None else data.training_batch(idx, device, generator)
            total += float(loss_fn(model(x), y).double()) * len(idx)
            batches += 1
    model.train(was_training)
    return total, batches


def sliding_loss(model: nn.Module, data: CaseSet, loss_fn: nn.Module, device: torch.device) -> tuple[float, int]:
    """Volume path: ``sum_case l(sliding(w, image), label)``, the loss ``loss_fn`` of the model's sliding-window
    prediction over each whole preprocessed case (``fedseg.evaluate.sliding.sliding_logits``, as evaluation runs
    it: windows of ``data.volume.patch_size``, ``sw_overlap``, ``sw_mode`` blending) against the case's region
    masks on the same grid ``(1, R, *P)``, one case at a time, eval mode, no gradients.

    Returns ``(sum, forward passes)``. Cost: per case ``ceil(windows / sw_batch_size)`` forward passes, with
    ``windows = prod_axes (ceil((P_a - k_a) / (k_a (1 - sw_overlap))) + 1)`` for a case of ``P_a`` voxels and a
    patch of ``k_a`` per axis (MONAI's scan), i.e. one evaluation of the set; a patch-sized case takes 1."""
    from fedseg.evaluate.sliding import sliding_logits

    assert data.volumes is not None and data.volume is not None  # the volume path
    was_training = model.training
    passes = [0]
    handle = model.register_forward_pre_hook(lambda *_: passes.__setitem__(0, passes[0] + 1))
    total = 0.0
    try:
        for vol in data.volumes:
            logits = sliding_logits(model, vol.image, data.volume, device)[None]  # (1, R, *P), CPU
            total += float(loss_fn(logits, vol.label[None].float()).double())
    finally:
        handle.remove()
        model.train(was_training)
    return total, passes[0]


def delta_and_h(
    start: Weights, local: Weights, F: float, q: float, L: float, h_norm: str = "fets"
) -> tuple[Weights, float]:
    """Site k's reply (Eq. 14, 16) from ``w^t`` (``start``), its trained ``w_k`` (``local``) and
    ``F = F_k(w^t)``: ``Delta_k = L F^q (w_k - w^t)`` per tensor (float64 math, cast to each
    tensor's dtype) and ``h_k = q F^(q-1) ||w_k - w^t||^2 + L F^q`` (``h_norm = "fets"``) or
    with ``||L (w_k - w^t)||^2`` (``"li"``). The norm runs over every tensor; ``q = 0`` drops
    the first term (no ``F^(-1)``).
    """
    diff = {k: local[k].double() - start[k].double() for k in start}
    deltas = {k: (L * F**q * d).to(start[k].dtype) for k, d in diff.items()}
    return deltas, h_of(math.fsum(float(d.pow(2).sum()) for d in diff.values()), F, q, L, h_norm)


def h_of(moved: float, F: float, q: float, L: float, h_norm: str = "fets") -> float:
    """Eq. 16's ``h_k`` from ``moved = ||w_k - w^t||^2`` (over every tensor): ``q F^(q-1) moved + L F^q``
    (``h_norm = "fets"``), with ``L^2 moved`` for ``"li"``; ``q = 0`` drops the first term (no ``F^(-1)``)."""
    h = L * F**q
    if q != 0:
        h += q * F ** (q - 1) * moved * (L * L if h_norm == "li" else 1.0)
    return h


def qffl_update(current: Weights, deltas: list[Weights], hs: list[float]) -> Weights:
    """Eq. 17: ``w^t + sum_k Delta_k / sum_k h_k`` per tensor (float64 math, cast back)."""
    total = math.fsum(hs)
    if not deltas or len(deltas) != len(hs):
        raise ValueError(f"need one h_k per Delta_k, got {len(deltas)} deltas and {len(hs)} h values")
    if not total > 0:
        raise ValueError(f"q-FedAvg: sum of h_k must be positive, got {hs}")
    out = {}
    for name, w in current.items():
        acc = torch.zeros_like(w, dtype=torch.float64)
        for d in deltas:
            acc += d[name].double()
        out[name] = (w.double() + acc / total).to(w.dtype)
    return out


class QFedAvgClient(FedAvgClient):
    def on_loss(self, msg: Message, ctx: ClientContext) -> Message:
        """Eq. 15 on the received ``w^t``; keeps ``w^t`` and ``F_k`` for this round's train exchange."""
        model = super().start_model(msg, ctx)
        total, batches = dataset_loss(model, ctx.data.train, ctx.cfg.train, ctx.task.device, ctx.generator)
        F = (
            total
            if options_as(ctx.options, QFedAvgOptions).loss_reduction == "sum"
            else total / max(len(ctx.data.train), 1)
        )
        put_group(ctx.state, START, msg.group(MODEL))
        ctx.state[F_KEY] = torch.tensor(F, dtype=torch.float64)
        return Message({}, {"steps": batches, "F": F})

    def start_model(self, msg: Message, ctx: ClientContext) -> nn.Module:
        """The ``w^t`` received in this round's loss exchange (the train message is empty)."""
        start = state_group(ctx.state, START)
        if not start:
            raise RuntimeError(f"q-FedAvg: site {ctx.site} got a train message before its loss exchange")
        model = ctx.task.new_model()
        load_weights(model, start)
        return model

    def after_fit(self, model: nn.Module, stats: TrainStats, msg: Message, ctx: ClientContext) -> Message:
        start = state_group(ctx.state, START)
        F = float(ctx.state.pop(F_KEY))
        put_group(ctx.state, START, {})  # w^t is only needed within the round
        opts = options_as(ctx.options, QFedAvgOptions)
        L = lipschitz(opts, round_lr(ctx.cfg.train, ctx.round, ctx.cfg.fl.rounds))  # 1 / the round's eta_l
        deltas, h = delta_and_h(start, weights_of(model), F, opts.q, L, opts.h_norm)
        tensors = {**prefixed(DELTA, deltas), H: torch.tensor([h], dtype=torch.float64)}
        return Message(tensors, {**train_meta(stats, ctx), "F": F})


class QFedAvgServer(FedAvgServer):
    """Loss exchange (sends ``w^t``), train exchange (empty message), Eq. 17 merge."""

    def run_round(self, rnd: int) -> dict[str, float]:
        self.engine.exchange({s: self.loss_message(s) for s in self.engine.sites}, LOSS_ACTION)
        return super().run_round(rnd)

    def loss_message(self, site: str) -> Message:
        return Message(prefixed(MODEL, self.global_weights))

    def train_message(self, site: str) -> Message:
        return Message()

    def train_reply_problem(self, site: str, sent: Message, reply: Message) -> str | None:
        """A reply Eq. 17 can merge: ``delta/`` holds every model tensor (name, shape, dtype), ``h`` is one number,
        and ``h`` is Eq. 16's value for the ``F`` (a finite loss >= 0) and the Delta the site sent
        (``||w_k - w^t|| = ||Delta_k|| / (L F^q)``, relative tolerance :data:`H_RTOL`); at ``q = 0``, ``h = L``
        whatever F. F itself, the site's loss, is its word (like n_k): a site cannot weigh its update at will beyond
        what a loss could say. Where ``L F^q`` is 0 (F = 0), Delta must be 0 and ``h`` (then ``q F^(q-1)
        ||w_k - w^t||^2``, with ``w_k`` unseen) any number >= 0: such a site moves nothing and can only slow the
        merge."""
        if problem := super().train_reply_problem(site, sent, reply):
            return problem
        deltas = reply.group(DELTA)
        missing, unknown = (
            sorted(set(self.global_weights) - set(deltas)),
            sorted(set(deltas) - set(self.global_weights)),
        )
        if missing or unknown:
            which = f"lacks {missing[0]!r}" if missing else f"has {unknown[0]!r}, not a tensor of the model"
            return f"its Delta ({DELTA}/) {which}"
        for name, delta in deltas.items():
            w = self.global_weights[name]
            if delta.shape != w.shape or delta.dtype != w.dtype:
                model = f"{tuple(w.shape)} {w.dtype}"
                return f"its Delta {name!r} is {tuple(delta.shape)} {delta.dtype}, the model's {model}"
        h, F = reply.tensors.get(H), reply.meta.get("F")
        if h is None or h.numel() != 1 or not h.is_floating_point():
            return f"its h ({H!r}) is not one number"
        opts = options_as(self.options, QFedAvgOptions)
        L = lipschitz(opts, round_lr(self.task.cfg.train, self.engine.round, self.task.cfg.fl.rounds))
        if opts.q == 0:  # F^0 = 1: Delta_k = L Delta w_k and h_k = L whatever F
            return None if math.isclose(float(h), L, rel_tol=H_RTOL) else f"its h = {float(h):.6g} is not L = {L:.6g}"
        if not is_loss(F):
            return f"its F = {F!r} is not a finite loss >= 0"
        try:
            scale = L * F**opts.q
            moved = math.fsum(float(d.double().pow(2).sum()) for d in deltas.values())
            if scale == 0:  # F = 0 (or F^q below the smallest float): Delta is 0 and h cannot be checked from it
                return None if moved == 0 and float(h) >= 0 else f"its F = {F:g} comes with a nonzero Delta"
            expected = h_of(moved / scale**2, F, opts.q, L, opts.h_norm)
        except (OverflowError, ZeroDivisionError):
            return f"its F = {F:g} takes Eq. 16 beyond floating point at q = {opts.q:g}"
        if not math.isclose(float(h), expected, rel_tol=H_RTOL):
            return f"its h = {float(h):.6g} is not Eq. 16's {expected:.6g} for its F = {F:.6g} and Delta"
        return None

    def aggregate(self, replies: dict[str, Message]) -> None:
        sites = list(replies)
        self.global_weights = qffl_update(
            self.global_weights, [replies[s].group(DELTA) for s in sites], [float(replies[s].tensors[H]) for s in sites]
        )


SPECS = (
    AlgorithmSpec(
        "qfedavg",
        "q-FedAvg",
        QFedAvgServer,
        QFedAvgClient,
        "q-FedAvg (Li et al.): loss-powered fair merge, forward-only loss pass (FeTS Eq. 13-17)",
        QFedAvgOptions,
        on_secure_aggregation="its server weights each site's update by that site's own loss (q-FFL's Delta_k and h_k)",
    ),
)
