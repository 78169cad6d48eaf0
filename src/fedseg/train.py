"""The one local optimization loop. Every method trains through ``Trainer.fit``.

A method changes local training only through one :class:`TrainHooks` object (the base class
changes nothing; a method overrides what differs). No method copies the loop or wraps the
network to get into it.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Iterator
from contextlib import closing
from dataclasses import dataclass

import numpy as np
import torch
from monai.losses import DiceLoss
from torch import nn
from torch.nn import functional as F

from fedseg.accel import autocast, compile_once, memory_format, resolve
from fedseg.config import BudgetConfig, TrainConfig
from fedseg.data.augment import augment_batch
from fedseg.data.dataset import CaseSet
from fedseg.data.federation import split_known
from fedseg.data.prefetch import ordered_map

LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


class TrainHooks:
    """How a method changes one local training run; every hook defaults to plain training.

    Called by :meth:`Trainer.fit` at each step, in this order: ``forward`` (the output the loss
    is computed on), ``extra_loss`` (added to the loss before ``backward``), ``after_backward``
    (between ``backward`` and the optimizer step), ``after_step`` (after the optimizer step).
    ``parameters`` chooses what the optimizer trains when the Trainer builds it.

    Users: FedProx (``extra_loss``: the proximal term), SCAFFOLD (``after_backward`` or
    ``after_step``: the control-variate correction), FedSM's personalization strategies (APFL's
    mixed ``forward`` and alpha step, Per-FedAvg's first-order MAML gradient, pFedMe's proximal
    gradient) and FedSM's ensemble selector (``forward`` through the frozen candidates).
    """

    def parameters(self, model: nn.Module) -> Iterable[nn.Parameter]:
        """The parameters the optimizer trains (default: all of ``model``'s)."""
        return model.parameters()

    def forward(self, model: nn.Module, x: torch.Tensor) -> torch.Tensor:
        """Output for a batch ``x`` ``(B, C, *S)`` the loss is computed on (default: ``model(x)``)."""
        return model(x)

    def extra_loss(self, model: nn.Module) -> torch.Tensor | None:
        """A scalar added to the loss of every step (default: none)."""
        return None

    def after_backward(self, model: nn.Module) -> None:
        """Runs after ``backward``, before the optimizer step (gradients are in ``p.grad``)."""

    def after_step(self, model: nn.Module) -> None:
        """Runs after every optimizer step."""


PLAIN = TrainHooks()


# A GradScaler's (scale, growth tracker): what fp16 training carries from one local run to the next, so a
# round starts at the scale the last one found instead of 2^16 (whose first steps overflow and are skipped)
GradScale = tuple[float, int]


@dataclass
class TrainStats:
    steps: int
    samples: int
    mean_loss: float
    grad_scale: GradScale | None = None  # fp16 (``train.amp``): the GradScaler's state at the end


def new_grad_scaler(device: torch.device, carried: GradScale | None) -> torch.amp.GradScaler:
    """An fp16 GradScaler on ``device``, continuing from ``carried`` (None: PyTorch's initial 2^16)."""
    scaler = torch.amp.GradScaler(device.type)
    if carried is not None:
        scaler.load_state_dict({**scaler.state_dict(), "scale": float(carried[0]), "_growth_tracker": int(carried[1])})
    return scaler


def grad_scale_of(scaler: torch.amp.GradScaler) -> GradScale:
    state = scaler.state_dict()
    return float(state["scale"]), int(state["_growth_tracker"])


def grad_scale_tensor(scale: GradScale) -> torch.Tensor:
    """``scale`` as a float64 tensor ``(2,)`` (scale, growth tracker), for a state store or checkpoint."""
    return torch.tensor(scale, dtype=torch.float64)


def grad_scale_from(tensor: torch.Tensor | None) -> GradScale | None:
    """The :func:`grad_scale_tensor` ``tensor`` as a ``GradScale`` (None stays None)."""
    return None if tensor is None else (float(tensor[0]), int(tensor[1]))


def segmentation_loss(cfg: TrainConfig) -> nn.Module:
    """The training loss ``train.loss``: soft Dice over the region channels (no background channel exists),
    optionally + binary cross-entropy (``dice_bce``). Every loss a method computes besides the Trainer's (q-FedAvg's
    F_k, FedPIDAvg's validation loss, Auto-FedAvg's aggregation-weight loss, FedSM-extra's labels, Per-FedAvg's second
    batch) is this one, so that all of them take the whole training configuration, ``train.dice_smooth`` included.

    Input: logits ``(B, R, *S)``, target region masks ``(B, R, *S)`` in {0, 1}, or ``(B, R + 1, *S)`` with the
    known (annotated) voxels last (an ignore label's, ``fedseg.data.federation.Regions.target``): those alone then
    give loss and gradient (:class:`SegmentationLoss`). Output: scalar.
    ``train.dice_smooth``: epsilon in ``1 - (2 sum p g + eps) / (sum p + sum g + eps)`` (FeTS 2022 Eq. 31, eps = 1:
    a case without a region gives a finite, useful gradient); None = MONAI's defaults (1e-5 in numerator and
    denominator).
    """
    if cfg.loss not in ("dice", "dice_bce"):
        raise ValueError(f"train.loss: unknown loss {cfg.loss!r} (dice | dice_bce)")
    eps = 1e-5 if cfg.dice_smooth is None else float(cfg.dice_smooth)  # MONAI's default smooth_nr = smooth_dr
    return SegmentationLoss(DiceLoss(sigmoid=True, smooth_nr=eps, smooth_dr=eps), eps, with_bce=cfg.loss == "dice_bce")


class SegmentationLoss(nn.Module):
    """The training loss of :func:`segmentation_loss`: MONAI's sigmoid ``DiceLoss`` (``dice``), mean over cases and
    regions, plus with ``with_bce`` the binary cross-entropy of every region channel's sigmoid, mean over voxels and
    regions (``dice_bce``: each region its own yes/no, as nested regions need: an enhancing-tumour voxel is in ET, TC
    and WT at once; nnU-Net's region-based Dice + BCE. MONAI's ``DiceCELoss``, which this was, takes a softmax
    cross-entropy across the channels whenever there are several, making nested regions compete; with one region
    the two are the same numbers to the bit).

    On a target with the known-voxel mask last (an ignore label's, one channel more than the logits) the same loss
    over the known voxels alone, as nnU-Net trains with an ignore label: soft Dice with prediction and target zeroed
    at unknown voxels (per case and region, as MONAI's), the cross-entropy a mean over each case's known voxels and
    regions (0 for a case without a known voxel), then over the cases: as unmasked, a batch's loss times its length is
    the sum of its cases' losses (q-FedAvg's and FedPIDAvg's sums, FedSM's per-case losses). With every voxel known
    the numbers are the unmasked ones (to float rounding); an unknown voxel's logits give no loss and no gradient."""

    def __init__(self, dice: nn.Module, eps: float, *, with_bce: bool):
        super().__init__()
        self.dice, self.eps, self.with_bce = dice, eps, with_bce

    def forward(self, input: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        regions, known = split_known(target, input.shape[1]) if target.dim() == input.dim() else (target, None)
        if known is None:
            loss = self.dice(input, target)
            return loss + F.binary_cross_entropy_with_logits(input, target.to(input.dtype)) if self.with_bce else loss
        known = known.to(input.dtype)
        truth = regions.to(input.dtype) * known
        spatial = tuple(range(2, input.dim()))
        p = torch.sigmoid(input) * known
        overlap, total = (p * truth).sum(spatial), p.sum(spatial) + truth.sum(spatial)
        loss = (1.0 - (2.0 * overlap + self.eps) / (total + self.eps)).mean()
        if not self.with_bce:
            return loss
        bce = F.binary_cross_entropy_with_logits(input, truth, reduction="none")  # (B, R, *S)
        cases = (bce * known).flatten(1).sum(1) / (known.flatten(1).sum(1) * input.shape[1]).clamp_min(1.0)  # (B,)
        return loss + cases.mean()  # per case, then over the cases: batch loss x B = the sum of per-case losses


def make_optimizer(cfg: TrainConfig, params) -> torch.optim.Optimizer:
    """``train.optimizer`` at rate ``cfg.lr`` (Adam with ``train.adam_betas``, SGD with ``train.momentum``)."""
    if cfg.optimizer == "adam":
        return torch.optim.Adam(params, lr=cfg.lr, betas=cfg.adam_betas, weight_decay=cfg.weight_decay)
    return torch.optim.SGD(params, lr=cfg.lr, momentum=cfg.momentum, weight_decay=cfg.weight_decay)


def round_lr(cfg: TrainConfig, rnd: int, rounds: int, rate: float | None = None) -> float:
    """The local learning rate of round ``rnd`` (1-based) of ``rounds`` (= ``fl.rounds`` = T) under
    ``cfg.lr_schedule``; constant within a round (per round, not per iteration).

    With eta = ``cfg.lr`` and t = ``rnd``:

    * ``constant``: eta_t = eta (exactly ``cfg.lr``: runs without a schedule are unchanged);
    * ``cosine`` (Auto-FedAvg's pancreas study): eta_t = lr_min + (eta - lr_min) (1 + cos(pi (t - 1) / T)) / 2,
      so eta_1 = eta and eta_T is just above ``lr_min``;
    * ``exponential`` (FeTS 2022 benchmark, section 4.4.8, decay 0.995 per round):
      eta_t = eta * lr_decay^(t - 1).

    ``rate``: another configured local rate of the same round (FedSM's selector, a personalization
    step size) scaled by the same factor eta_t / eta; default ``cfg.lr`` (the result is eta_t).
    A pure function of its arguments, so every engine computes the same rate from the round it is
    told, and a resumed run the same rates as an uninterrupted one (no state to restore).
    """
    base = cfg.lr if rate is None else rate
    if cfg.lr_schedule == "constant":
        return base
    if not 1 <= rnd <= rounds:
        raise ValueError(f"train.lr_schedule={cfg.lr_schedule}: round {rnd} is outside 1..{rounds}")
    if cfg.lr_schedule == "cosine":
        lr = cfg.lr_min + (cfg.lr - cfg.lr_min) * (1 + math.cos(math.pi * (rnd - 1) / rounds)) / 2
    else:
        lr = cfg.lr * cfg.lr_decay ** (rnd - 1)
    return lr if rate is None or rate == cfg.lr else rate * (lr / cfg.lr)


def round_train_config(cfg: TrainConfig, rnd: int, rounds: int, train: TrainConfig | None = None) -> TrainConfig:
    """``train`` (default: ``cfg``) with its ``lr`` under ``cfg``'s schedule in round ``rnd`` of ``rounds``
    (:func:`round_lr`): the configuration a round's Trainer is built with. ``train`` itself if the
    rate does not change (e.g. ``constant``)."""
    train = cfg if train is None else train
    lr = round_lr(cfg, rnd, rounds, train.lr)
    return train if lr == train.lr else train.model_copy(update={"lr": lr})


def optimizer_state(opt: torch.optim.Optimizer) -> dict[str, torch.Tensor]:
    """Flatten the optimizer's per-parameter state into named tensors (``"<param index>/<key>"``)."""
    flat = {}
    for idx, state in opt.state_dict()["state"].items():
        for key, value in state.items():
            flat[f"{idx}/{key}"] = (
                value.detach().to("cpu", copy=True) if torch.is_tensor(value) else torch.tensor(value)
            )
    return flat


def load_optimizer_state(opt: torch.optim.Optimizer, flat: dict[str, torch.Tensor]) -> None:
    """Inverse of ``optimizer_state`` (hyperparameters come from the optimizer as built)."""
    state: dict[int, dict[str, torch.Tensor]] = {}
    for name, value in flat.items():
        idx, key = name.split("/", 1)
        state.setdefault(int(idx), {})[key] = value.clone()
    opt.load_state_dict({"state": state, "param_groups": opt.state_dict()["param_groups"]})


def batches(n: int, batch_size: int, generator: torch.Generator, endless: bool) -> Iterator[torch.Tensor]:
    """Index batches over a fresh permutation of ``range(n)`` per pass; ``endless`` repeats passes
    (the endless loader of step budgets)."""
    while True:
        yield from torch.randperm(n, generator=generator).split(batch_size)
        if not endless:
            return


def seed_from(*entropy: int) -> int:
    """A 63-bit seed drawn from the integers ``entropy`` (each >= 0; numpy ``SeedSequence``): distinct tuples give
    independent streams. Every random stream of a run is seeded through it (``fedseg.engine.context.stream_seed``,
    :func:`step_generator`)."""
    return int(np.random.SeedSequence(list(entropy)).generate_state(2, dtype=np.uint64)[0] >> np.uint64(1))


def step_generator(base: int, *path: int) -> torch.Generator:
    """A generator seeded from ``(base, *path)`` (numpy ``SeedSequence``, 63 bits), ``base`` >= 0: the streams
    of one local training run. ``Trainer.fit`` draws ``base`` from the site's stream and uses ``(base, 0)`` for
    the batch order and ``(base, 1, k)`` for step k's patch positions and augmentations, so every draw of a
    step is a function of (seed, site, round, action, step) whatever thread prepares it."""
    return torch.Generator().manual_seed(seed_from(base, *path))


class Trainer:
    """Local training of a segmentation model on one ``CaseSet``, under the device switches of ``cfg``
    (``fedseg.accel``: ``train.amp``, ``channels_last``, ``compile``) on ``device``."""

    def __init__(self, cfg: TrainConfig, device: torch.device):
        self.cfg = cfg
        self.device = device
        self.accel = resolve(cfg, device)
        self.loss_fn = segmentation_loss(cfg)

    def draw(self, data, idx: torch.Tensor, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        """The training batch of cases ``idx`` on the Trainer's device: ``data.batch`` (whole images),
        or one random patch per case for a ``CaseSet`` with volumes (``CaseSet.training_batch``: cropped on the
        CPU, then copied), then the ``train.augment`` augmentations for a ``CaseSet`` (``fedseg.data.augment``,
        on the device's tensors: on the GPU for CUDA). Patch positions and augmentations draw from
        ``generator``, in that order. Images channels-last when ``train.channels_last`` is in effect."""
        if not isinstance(data, CaseSet):
            x, y = data.batch(idx, self.device)
        else:
            x, y = data.training_batch(idx, self.device, generator)
            if self.cfg.augment.enabled:
                x, y = augment_batch(x, y, self.cfg.augment, generator)
        return memory_format(x, self.accel), y

    def new_optimizer(self, model: nn.Module, hooks: TrainHooks = PLAIN) -> torch.optim.Optimizer:
        return make_optimizer(self.cfg, hooks.parameters(model))

    def fit(
        self,
        model: nn.Module,
        data: CaseSet,
        generator: torch.Generator,
        optimizer: torch.optim.Optimizer | None = None,
        budget: BudgetConfig | None = None,
        hooks: TrainHooks = PLAIN,
        loss_fn: LossFn | None = None,
        grad_scale: GradScale | None = None,
    ) -> TrainStats:
        """Train ``model`` in place for ``budget`` (epochs over ``data`` or optimizer steps), changed by ``hooks``.

        ``loss_fn(output, target)`` replaces the segmentation loss (FedSM's selector trains with
        cross-entropy on ``data`` yielding ``(image, class index)``); ``data`` is anything with
        ``len``, ``name`` and ``batch(idx, device) -> (x, target)`` (a ``CaseSet`` by default; a
        ``CaseSet`` with volumes trains on one random patch per case, :meth:`draw`). An epoch is one
        pass over the cases (FeTS 2022 Sec. 4.4.1: one patch per case).

        Randomness: one draw from ``generator`` (the site's stream) seeds the run's batch order and each
        step's own stream (:func:`step_generator`); hooks may draw from ``generator`` further. The batches
        are prepared by :meth:`draw` on ``train.loader_workers`` background threads (0: this thread), in
        order, with the same result for any number. The forward pass runs under ``train.amp`` autocast; the
        loss (on float32 outputs) and ``extra_loss`` are float32; fp16 scales the loss (GradScaler) and
        unscales the gradients before ``after_backward``; its scaler starts from ``grad_scale`` (the last run's,
        ``TrainStats.grad_scale``) where given.
        Returns the steps done, samples seen, the mean loss per step (without ``extra_loss``) and, under fp16,
        the scaler's final state.
        """
        if len(data) == 0:
            raise ValueError(f"no training cases for {data.name}")
        budget = budget or self.cfg.budget
        optimizer = optimizer or self.new_optimizer(model, hooks)
        loss_fn = loss_fn or self.loss_fn
        model.train()
        if self.accel.compile:
            compile_once(model)
        if isinstance(data, CaseSet):
            data.resident(self.device, self.cfg.resident_mb)
        max_steps = budget_steps(budget, len(data), self.cfg.batch_size)
        base = int(torch.randint(0, 2**62, (), generator=generator))
        # One pass of the endless sampler = one epoch, so both budget units share this loop.
        order = zip(range(max_steps), batches(len(data), self.cfg.batch_size, step_generator(base, 0), endless=True))

        def prepare(step: tuple[int, torch.Tensor]) -> tuple[int, torch.Tensor, torch.Tensor]:
            k, idx = step
            with torch.no_grad():
                return (len(idx), *self.draw(data, idx, step_generator(base, 1, k)))

        scaler = new_grad_scaler(self.device, grad_scale) if self.accel.amp == torch.float16 else None
        steps, samples = 0, 0
        loss_sum = torch.zeros((), dtype=torch.float64, device=self.device)  # float64: as a Python sum; no sync
        extra_sum = torch.zeros((), dtype=torch.float64, device=self.device)
        with closing(ordered_map(prepare, order, self.cfg.loader_workers)) as prepared:
            for n, x, y in prepared:
                loss, extra = self._step(model, optimizer, hooks, loss_fn, scaler, x, y)
                loss_sum += loss.double()
                if extra is not None:  # a tensor of any shape, or a Python number (a sum of no terms is the int 0)
                    extra_sum += extra.to(extra_sum.device, torch.float64).sum()
                steps += 1
                samples += n
        if not math.isfinite(float(extra_sum)):  # a constant NaN penalty leaves the gradients as they were: silent
            raise ValueError(
                f"{type(hooks).__name__}.extra_loss was NaN or Inf in a training step: the penalty it adds to the "
                "loss cannot be trained with"
            )
        return TrainStats(
            steps=steps,
            samples=samples,
            mean_loss=float(loss_sum) / max(steps, 1),
            grad_scale=None if scaler is None else grad_scale_of(scaler),
        )

    def _step(
        self,
        model: nn.Module,
        optimizer: torch.optim.Optimizer,
        hooks: TrainHooks,
        loss_fn: LossFn,
        scaler: torch.amp.GradScaler | None,
        x: torch.Tensor,
        y: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """One optimizer step on batch ``(x, y)`` (order of the hooks: ``TrainHooks``); returns its loss and the
        hooks' ``extra_loss`` (detached float32 scalars on the device; None without one)."""
        optimizer.zero_grad(set_to_none=True)
        with autocast(self.device, self.accel.amp):
            out = hooks.forward(model, x)
        loss = loss_fn(out.float(), y)
        extra = hooks.extra_loss(model)
        total = loss if extra is None else loss + extra
        if scaler is None:
            total.backward()
            hooks.after_backward(model)
            optimizer.step()
        else:
            scaler.scale(total).backward()
            scaler.unscale_(optimizer)  # the hooks see true gradients
            hooks.after_backward(model)
            scaler.step(optimizer)
            scaler.update()
        hooks.after_step(model)
        return loss.detach(), None if extra is None else torch.as_tensor(extra).detach()


def budget_steps(budget: BudgetConfig, cases: int, batch_size: int) -> int:
    """The optimizer steps of one local ``budget`` on ``cases`` training cases in batches of ``batch_size`` (what
    :meth:`Trainer.fit` trains): ``amount`` steps, or ``amount`` epochs of ceil(cases / batch_size) batches."""
    return budget.amount if budget.unit == "steps" else budget.amount * _batches_per_epoch(cases, batch_size)


def _batches_per_epoch(n: int, batch_size: int) -> int:
    return -(-n // batch_size)
