"""SCAFFOLD (Karimireddy et al., ICML 2020), as in the FeTS benchmark (Eq. 6-9, Algorithm 1).

Down: the global model ``w`` and the server control variate ``c``. Each site keeps its own
control variate ``c_k`` in its client state (zeros before its first round) and trains with the
corrected gradient ``g + c - c_k`` (Eq. 9; added by ``DriftCorrection.after_backward``). After ``s_k`` local
steps with learning rate ``eta_l`` (``train.lr``; under ``train.lr_schedule`` the round's rate, ``local_lr``)
it updates (Eq. 6-7, option II of Karimireddy et al., ``s_k`` = the steps actually taken, which differ
between sites under an epoch budget):

    c_k+ = c_k - c + (w - w_k) / (s_k * eta_l),    delta_c_k = c_k+ - c_k

Up: ``w_k`` and ``delta_c_k``. The server (Eq. 3 and 8; Karimireddy et al.'s Algorithm 1 with the
sites ``S`` that answered this round, of ``N``):

    w <- w + eta_g * sum_{k in S} p_k (w_k - w),   c <- c + (|S| / N) sum_{k in S} p_k delta_c_k

with ``p_k`` FedAvg's aggregation weights over ``S`` (summing to 1). With every site (|S| = N) this is
FeTS Eq. 3 and 8; under client sampling (``fl.clients_per_round``) or a skipped site it is the
standard partial-participation update ``c <- c + (1/N) sum_{k in S} delta_c_k`` (uniform weights): the
sites that did not train keep their ``c_k``, so ``c`` stays the mean of all ``N`` control variates.
Every message carries the model and one control variate, so training traffic is twice FedAvg's
(measured by the ledger).

Sign convention: this is Karimireddy et al.'s (``c`` estimates the gradient). The FeTS paper's
Eq. 6 and Algorithm 1 line 44 use the negated variates ``c' = -c`` (step ``+ eta_l (c' - c'_k)``,
update ``+ (w_k - w) / (s_k eta_l)``), which is the same algorithm; its Eq. 9 as printed mixes
the two conventions. Control variates cover the trainable parameters (buffers get no gradient).

Local optimizer (option ``correction``): the FeTS benchmark uses plain SGD "for consistency with
SCAFFOLD" (its Sec. 6). With SGD, ``gradient`` adds ``c - c_k`` to the gradient before the step:
Eq. 9 exactly. With Adam that is inconsistent: ``(w - w_k) / (s_k eta_l)`` then measures the mean
*Adam step direction* (entries of order 1), not the mean gradient, and adding it to raw gradients
(entries of order 1e-3) swamps them: measured on the benchmark budget (synthetic-retina, seed 0,
Adam), SCAFFOLD with the gradient correction reached a test Dice of 0.42 vs FedAvg's 0.85. ``step``
applies the correction in the units it was measured in: after each optimizer step,
``w <- w - eta_l (c - c_k)``, so every local step is the optimizer's step plus the drift
correction. With plain SGD both are the same update. ``auto`` (default): ``gradient`` for SGD
without momentum, ``step`` otherwise. SGD with momentum must not use ``gradient``: the momentum
buffer amplifies ``c - c_k`` by up to ``1 / (1 - rho)``, so ``(w - w_k) / (s_k eta_l)`` measures an
amplified correction and the control variates grow geometrically from round to round (seen on a
two-site quadratic: ``c_k`` multiplied by about -30 per round at rho = 0.9, 20 local steps).
"""

from __future__ import annotations

from typing import Literal

import torch
from pydantic import Field
from torch import nn

from fedseg.algorithms.aggregate import server_step, weighted_average
from fedseg.algorithms.client_state import put_group, state_group
from fedseg.algorithms.fedavg import FedAvgClient, FedAvgOptions, FedAvgServer, train_meta
from fedseg.algorithms.prefixes import MODEL
from fedseg.algorithms.registry import AlgorithmSpec
from fedseg.config import TrainConfig
from fedseg.engine.context import ClientContext, options_as
from fedseg.engine.messages import Message, prefixed, weights_of
from fedseg.train import TrainHooks, TrainStats, round_lr

CONTROL = "control"  # message prefix of c (down) and delta_c_k (up)
LOCAL_CONTROL = "scaffold_c"  # client-state prefix of c_k
SERVER_CONTROL = "control"  # server-state prefix of c


class ScaffoldOptions(FedAvgOptions):
    OWN_MERGE = "SCAFFOLD merges the models and the control variates with FedAvg's weights together (Eq. 3, 8)"
    # one step: w_k = w - eta_l (g_k + c - c_k) and c = sum_k p_k c_k (every site, fixed p_k), so sum_k p_k w_k is
    # FedAvg's model (a user's bench found the two equal on every case, unexplained)
    ONE_STEP_AS_FEDAVG = (
        "its corrections c - c_k cancel in the average of every site's one step (c is their weighted mean), so "
        "SCAFFOLD's model is exactly FedAvg's with fl.weighting (to rounding)"
    )
    ONE_STEP_EVERY_SITE = True
    global_lr: float = Field(1.0, gt=0, description="server learning rate eta_g on the averaged model update")

    def one_step_as_fedavg(self) -> bool:
        # eta_g != 1 scales the averaged step, and another weighting averages otherwise: not FedAvg's
        return self.global_lr == 1.0 and self.weighting is None

    correction: Literal["auto", "gradient", "step"] = Field(
        "auto",
        description="where c - c_k enters a local step: gradient (Eq. 9, SGD without momentum) | step (after "
        "the optimizer step: Adam, SGD with momentum) | auto = gradient for SGD without momentum, "
        "step otherwise (module doc)",
    )


def correction_mode(ctx: ClientContext) -> str:
    """``gradient`` or ``step``: the option, with ``auto`` resolved by the local optimizer."""
    mode = options_as(ctx.options, ScaffoldOptions).correction
    if mode == "auto":
        return "gradient" if plain_sgd(ctx.cfg.train) else "step"
    if mode == "gradient" and not plain_sgd(ctx.cfg.train):
        raise ValueError(
            "methods.scaffold.correction: 'gradient' needs train.optimizer 'sgd' with train.momentum 0 "
            f"(got {ctx.cfg.train.optimizer}, momentum {ctx.cfg.train.momentum}); the control variates "
            "diverge otherwise (see fedseg.algorithms.scaffold) -- use 'step' or 'auto'"
        )
    return mode


def plain_sgd(train: TrainConfig) -> bool:
    """True for SGD without momentum: the optimizer of Eq. 9, for which ``gradient`` is exact."""
    return train.optimizer == "sgd" and train.momentum == 0


def parameter_names(model: nn.Module) -> list[str]:
    """Names of the trainable parameters: the entries control variates are kept for."""
    return [name for name, p in model.named_parameters() if p.requires_grad]


def zeros_like_parameters(model: nn.Module) -> dict[str, torch.Tensor]:
    return {name: torch.zeros_like(p, device="cpu") for name, p in model.named_parameters() if p.requires_grad}


class DriftCorrection(TrainHooks):
    """SCAFFOLD's correction of every local step by ``c - c_k`` (``pairs``: parameter, correction).

    ``gradient`` (Eq. 9): ``grad <- grad + (c - c_k)`` before the optimizer step; ``step``:
    ``w <- w - eta_l (c - c_k)`` after it (module doc)."""

    def __init__(self, pairs: list[tuple[nn.Parameter, torch.Tensor]], mode: str, lr: float):
        self.pairs, self.mode = pairs, mode
        self.shifts = [(p, correction * lr) for p, correction in pairs] if mode == "step" else []

    def after_backward(self, model: nn.Module) -> None:
        if self.mode == "gradient":
            for p, correction in self.pairs:
                if p.grad is not None:
                    p.grad.add_(correction)

    def after_step(self, model: nn.Module) -> None:
        with torch.no_grad():
            for p, shift in self.shifts:
                p.sub_(shift)


def local_lr(ctx: ClientContext) -> float:
    """``eta_l``: the rate this round's local steps use (``train.lr`` under ``train.lr_schedule``)."""
    return round_lr(ctx.cfg.train, ctx.round, ctx.cfg.fl.rounds)


class ScaffoldClient(FedAvgClient):
    def local_control(self, model: nn.Module, ctx: ClientContext) -> dict[str, torch.Tensor]:
        """``c_k`` from the client state, zeros before the site's first round."""
        return state_group(ctx.state, LOCAL_CONTROL) or zeros_like_parameters(model)

    def corrections(
        self, model: nn.Module, msg: Message, ctx: ClientContext
    ) -> list[tuple[nn.Parameter, torch.Tensor]]:
        """``(parameter, c - c_k)`` for every trainable parameter."""
        c, c_k = msg.group(CONTROL), self.local_control(model, ctx)
        params = dict(model.named_parameters())
        return [(params[n], (c[n] - c_k[n]).to(params[n].device)) for n in parameter_names(model)]

    def train_hooks(self, model: nn.Module, msg: Message, ctx: ClientContext) -> TrainHooks:
        """The drift correction ``c - c_k`` on every trainable parameter, where ``correction_mode`` says."""
        return DriftCorrection(self.corrections(model, msg, ctx), correction_mode(ctx), local_lr(ctx))

    def after_fit(self, model: nn.Module, stats: TrainStats, msg: Message, ctx: ClientContext) -> Message:
        """Eq. 6-7 with ``s_k = stats.steps``; reply ``w_k`` and ``delta_c_k``."""
        w, w_k = msg.group(MODEL), weights_of(model)
        c, c_k = msg.group(CONTROL), self.local_control(model, ctx)
        scale = 1.0 / (stats.steps * local_lr(ctx))
        new_c_k = {n: c_k[n] - c[n] + (w[n] - w_k[n]) * scale for n in c_k}
        put_group(ctx.state, LOCAL_CONTROL, new_c_k)
        delta = {n: new_c_k[n] - c_k[n] for n in c_k}
        return Message({**prefixed(MODEL, w_k), **prefixed(CONTROL, delta)}, train_meta(stats, ctx))


class ScaffoldServer(FedAvgServer):
    options: ScaffoldOptions  # this method's options (``FedAvgServer.options``)

    def __init__(self, engine, task, options):
        super().__init__(engine, task, options)
        self.control = zeros_like_parameters(task.new_model())

    def train_message(self, site: str) -> Message:
        return Message({**prefixed(MODEL, self.global_weights), **prefixed(CONTROL, self.control)})

    def aggregate(self, replies: dict[str, Message]) -> None:
        """Eq. 3 with server rate ``eta_g`` and Eq. 8, both with FedAvg's ``p_k``; ``c`` moves by the
        answering fraction |S| / N of the mean ``delta_c_k`` (partial participation, module docstring)."""
        sites = list(replies)
        weights = self.checked_aggregation_weights(replies)
        p = [weights[s] for s in sites]
        merged = weighted_average([replies[s].group(MODEL) for s in sites], p)
        self.global_weights = server_step(self.global_weights, merged, self.options.global_lr)
        delta_c = weighted_average([replies[s].group(CONTROL) for s in sites], p)
        if len(sites) < len(self.engine.sites):  # |S| / N < 1 (with every site: Eq. 8 exactly, unscaled)
            fraction = len(sites) / len(self.engine.sites)
            delta_c = {n: d * fraction for n, d in delta_c.items()}
        self.control = {n: self.control[n] + delta_c[n] for n in self.control}

    def state_dict(self) -> dict[str, torch.Tensor]:
        return {**super().state_dict(), **prefixed(SERVER_CONTROL, self.control)}

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        super().load_state_dict(state)
        self.control = Message(state).group(SERVER_CONTROL)


SPECS = (
    AlgorithmSpec(
        "scaffold",
        "SCAFFOLD",
        ScaffoldServer,
        ScaffoldClient,
        "SCAFFOLD (Karimireddy et al.): control-variate corrected local steps (FeTS Eq. 6-9)",
        ScaffoldOptions,
        on_secure_aggregation=(
            "its server needs the control-variate updates c_k, averaged over all sites, beside the model's sum"
        ),
    ),
)
