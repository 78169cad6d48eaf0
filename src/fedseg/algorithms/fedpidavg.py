"""FedPIDAvg (Mächler et al. 2023, FeTS 2022 challenge winner) as specified by the FeTS
benchmark, section 3.2.7, Eq. 18-22 and Algorithm 1 (lines 21-22, 33, 52).

Aggregation (Eq. 18), per round t over the K sites:

    w^{t+1} = w^t + sum_k (alpha p_k + beta Delta l_k / L + gamma m_k / M) Delta w_k

* ``p_k``: the FedAvg share (``n_k / N`` with ``weighting = samples``; ``1 / K`` with uniform);
* ``l_k^t`` (Eq. 19): site k's validation loss — the training loss ``train.loss`` summed over
  the cases of its own *validation* split — of its model *after* this round's local training
  (Algorithm 1, line 52: ``Local_Validation(w_k^t)``, returned with ``Delta w_k^t`` and used in
  the same round's merge; Eq. 19 writes the model as ``w_k^{t-1}``, an index shifted by one).
  The site computes it and sends it as ``meta.val_loss`` (its forward batches as
  ``meta.val_batches``; they run inside the train exchange and are not ledger steps). Each case is
  the model's real prediction over the whole validation case: its fixed-size image on the whole-image
  path (``ceil(n_val / train.batch_size)`` forward batches), and on the volume path its sliding-window
  prediction as evaluation makes it (``qfedavg.sliding_loss``: ``ceil(windows / sw_batch_size)`` forward
  passes per case, one evaluation of the validation split per site and round), never a resized cube;
* ``Delta l_k^t = max(0, l_k^{t-1} - l_k^t)`` (Eq. 22, the benchmark's version,
  ``positive_only = True``) or ``l_k^{t-1} - l_k^t`` (Eq. 20, the original); ``L = sum_k Delta l_k``;
* ``m_k^t = sum_{j=0}^{history-1} l_k^{t-j}`` (Eq. 21, history 6: this round's loss and the 5
  before), ``M = sum_k m_k``.

The loss history is server state (Algorithm 1 computes Delta l and m on the server): a
``(K, history)`` tensor in ``state_dict`` (NaN = no loss yet), so a resumed run continues it.
Rounds with fewer losses sum the ones there are. When a normalizer is 0 — ``L`` in the first
round (no ``l^{t-1}``: Delta l = 0) or when no site improved under Eq. 22 — its term falls back to
``p_k``, so the coefficients always sum to ``alpha + beta + gamma``.

Eq. 18 is applied as ``sum_k c_k w_k + (1 - alpha - beta - gamma) w^t``: with the paper's
coefficients (0.45, 0.45, 0.1; FeTS Table 4) the last term is 0 and the merge is a weighted
average of the local models, and ``alpha = 1, beta = gamma = 0`` is FedAvg bit for bit.
"""

from __future__ import annotations

import math

import torch
from pydantic import Field

from fedseg.algorithms.aggregate import weighted_average
from fedseg.algorithms.fedavg import FedAvgClient, FedAvgOptions, FedAvgServer
from fedseg.algorithms.prefixes import MODEL
from fedseg.algorithms.qfedavg import dataset_loss
from fedseg.algorithms.registry import AlgorithmSpec
from fedseg.engine.context import ClientContext
from fedseg.engine.faults import is_loss
from fedseg.engine.messages import Message
from fedseg.train import TrainStats

HISTORY = "pid/history"  # server-state tensor (K, history): l_k^{t-j} in column j, NaN = none yet


class FedPIDAvgOptions(FedAvgOptions):
    """``methods.fedpidavg``: FedPIDAvg (FeTS Eq. 18-22); defaults from FeTS Table 4."""

    OWN_MERGE = "FedPIDAvg's merge weights are its own (Eq. 18)"

    alpha: float = Field(0.45, ge=0, description="weight of the sample share p_k")
    beta: float = Field(0.45, ge=0, description="weight of the validation-loss improvement Delta l_k / L")
    gamma: float = Field(0.1, ge=0, description="weight of the summed recent losses m_k / M")
    history: int = Field(6, ge=1, description="losses summed in m_k (Eq. 21: j = 0..5)")
    positive_only: bool = Field(True, description="Delta l_k = max(0, .) (Eq. 22, FeTS) instead of Eq. 20 (original)")


def pid_terms(
    shares: torch.Tensor, losses: torch.Tensor, history: torch.Tensor, positive_only: bool = True
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The normalized D and I terms of Eq. 18 and the updated loss history.

    Args:
        shares: ``p_k``, ``(K,)`` float64 summing to 1 (the fallback of a zero normalizer).
        losses: ``l_k^t`` (Eq. 19), ``(K,)`` float64.
        history: ``(K, H)`` float64, column j = ``l_k^{t-1-j}``, NaN where unknown.
    Returns:
        ``Delta l_k / L`` (Eq. 20 or 22), ``m_k / M`` (Eq. 21) — each ``(K,)``, replaced by
        ``shares`` when its normalizer is 0 — and the ``(K, H)`` history with ``l^t`` in column 0.
    """
    prev = history[:, 0]
    dl = torch.where(torch.isnan(prev), torch.zeros_like(losses), prev - losses)  # Eq. 20; 0 without l^{t-1}
    if positive_only:
        dl = dl.clamp(min=0.0)  # Eq. 22
    new_history = torch.cat([losses[:, None], history[:, :-1]], dim=1)
    m = torch.nan_to_num(new_history, nan=0.0).sum(dim=1)  # Eq. 21
    big_l, big_m = float(dl.sum()), float(m.sum())
    improvement = dl / big_l if big_l != 0 else shares.clone()
    momentum = m / big_m if big_m != 0 else shares.clone()
    return improvement, momentum, new_history


class FedPIDAvgClient(FedAvgClient):
    """FedAvg's client that also reports the validation loss of its trained model (Eq. 19)."""

    def after_fit(self, model, stats: TrainStats, msg: Message, ctx: ClientContext) -> Message:
        reply = super().after_fit(model, stats, msg, ctx)
        val_loss, batches = dataset_loss(model, ctx.data.val, ctx.cfg.train, ctx.task.device, whole_cases=True)
        reply.meta.update({"val_loss": val_loss, "val_batches": batches})
        return reply


class FedPIDAvgServer(FedAvgServer):
    """FedAvg's server with the Eq. 18 weights; the validation-loss history is server state."""

    options: FedPIDAvgOptions  # this method's options (``FedAvgServer.options``)

    NO_CLIENT_SAMPLING = "its Eq. 18 weights need every site's validation-loss history in every round"

    def __init__(self, engine, task, options):
        super().__init__(engine, task, options)
        self.history = torch.full((len(engine.sites), options.history), math.nan, dtype=torch.float64)
        self.last_coefficients: dict[str, float] = {}

    def train_reply_problem(self, site: str, sent: Message, reply: Message) -> str | None:
        """FedAvg's check, and the ``val_loss`` Eq. 18-22 weigh the site by: a finite number >= 0 (a sum of losses;
        its value is the site's word, like n_k)."""
        if problem := super().train_reply_problem(site, sent, reply):
            return problem
        loss = reply.meta.get("val_loss")
        if not is_loss(loss):
            return f"its val_loss = {loss!r:.80} is not a finite loss >= 0"
        return None

    def aggregate(self, replies: dict[str, Message]) -> None:
        sites = self.engine.sites
        if set(replies) != set(sites):
            raise ValueError(f"FedPIDAvg needs a reply from every site every round, got {sorted(replies)}")
        o = self.options
        raw = torch.tensor([self.checked_aggregation_weights(replies)[s] for s in sites], dtype=torch.float64)
        total = float(raw.sum())
        losses = torch.tensor([float(replies[s].meta["val_loss"]) for s in sites], dtype=torch.float64)
        improvement, momentum, self.history = pid_terms(raw / total, losses, self.history, o.positive_only)
        # Eq. 18 coefficients in units of FedAvg's raw weights (c_k * total), so that alpha = 1,
        # beta = gamma = 0 hands weighted_average exactly FedAvg's weights.
        weights = [
            o.alpha * float(raw[k]) + total * (o.beta * float(improvement[k]) + o.gamma * float(momentum[k]))
            for k in range(len(sites))
        ]
        self.last_coefficients = {s: w / total for s, w in zip(sites, weights)}
        models = [replies[s].group(MODEL) for s in sites]
        rest = 1.0 - (o.alpha + o.beta + o.gamma)
        if abs(rest) > 1e-12:  # coefficients not summing to 1: w^t keeps the remainder (Eq. 18)
            models.append(self.global_weights)
            weights.append(total * rest)
        self.global_weights = weighted_average(models, weights)

    def round_metrics(self) -> list[dict]:
        """The Eq. 18 coefficient ``c_k`` and validation loss ``l_k`` of the last merge, per site."""
        rows = [{"site": s, "metric": "pid_weight", "value": c} for s, c in self.last_coefficients.items()]
        latest = self.history[:, 0]
        rows += [
            {"site": s, "metric": "val_loss", "value": float(latest[i])}
            for i, s in enumerate(self.engine.sites)
            if self.last_coefficients and not math.isnan(float(latest[i]))
        ]
        return rows

    def state_dict(self) -> dict[str, torch.Tensor]:
        return {**super().state_dict(), HISTORY: self.history.clone()}

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        super().load_state_dict(state)
        self.history = state[HISTORY].clone()


SPECS = (
    AlgorithmSpec(
        "fedpidavg",
        "FedPIDAvg",
        FedPIDAvgServer,
        FedPIDAvgClient,
        "FedPIDAvg (Maechler et al.): weights from samples, val-loss gain and loss sum (FeTS Eq. 18-22)",
        FedPIDAvgOptions,
        on_secure_aggregation="its server weights each site by that site's own validation-loss history (PID terms)",
    ),
)
