"""Centralized training: all sites' train splits pooled and trained through the same Trainer.

The upper bound of the papers, and deliberately not federated: the server reads every
site's training data. Evaluation still runs where the test data lives (a client action).
"""

from __future__ import annotations

import time

from fedseg.algorithms.fedavg import FedAvgClient, FedAvgServer
from fedseg.algorithms.prefixes import GRAD_SCALE
from fedseg.algorithms.registry import AlgorithmSpec
from fedseg.data.dataset import CaseSet
from fedseg.engine.context import seeded_generator, stream_seed
from fedseg.engine.ledger import LedgerRow
from fedseg.engine.messages import Message, load_weights, prefixed, weights_of
from fedseg.train import (
    GradScale,
    Trainer,
    grad_scale_from,
    grad_scale_tensor,
    load_optimizer_state,
    optimizer_state,
    round_train_config,
)

POOLED = "pooled"


class CentralizedServer(FedAvgServer):
    KEEPS_LOCAL_MODELS = False  # no site trains: nothing local to keep

    def __init__(self, engine, task, options):
        super().__init__(engine, task, options)
        self.pooled = CaseSet.concat(POOLED, [engine.site_data[s].train for s in engine.sites])
        self.optimizer_moments: dict = {}
        self.grad_scale: GradScale | None = None

    def run_round(self, rnd: int) -> dict[str, float]:
        cfg = self.task.cfg
        start = time.perf_counter()
        generator = seeded_generator(stream_seed(cfg.seed, len(self.engine.sites), rnd, "centralized"))
        model = self.task.new_model()
        load_weights(model, self.global_weights)
        trainer = Trainer(round_train_config(cfg.train, rnd, cfg.fl.rounds), self.task.device)  # the round's lr
        optimizer = trainer.new_optimizer(model)
        if cfg.train.keep_optimizer_state and self.optimizer_moments:
            load_optimizer_state(optimizer, self.optimizer_moments)
        stats = trainer.fit(model, self.pooled, generator, optimizer, grad_scale=self.grad_scale)
        self.grad_scale = stats.grad_scale  # fp16: the next round's scaler starts where this one ended
        self.optimizer_moments = optimizer_state(optimizer) if cfg.train.keep_optimizer_state else {}
        self.global_weights = weights_of(model)
        self.engine.ledger.record(LedgerRow(rnd, POOLED, "train", stats.steps, 0, 0, time.perf_counter() - start))
        return {POOLED: stats.mean_loss}

    def state_dict(self) -> dict:
        scale = {} if self.grad_scale is None else {GRAD_SCALE: grad_scale_tensor(self.grad_scale)}
        return {**super().state_dict(), **prefixed("opt", self.optimizer_moments), **scale}

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        self.optimizer_moments = Message(state).group("opt")
        self.grad_scale = grad_scale_from(state.get(GRAD_SCALE))


CentralizedClient = FedAvgClient


SPECS = (
    AlgorithmSpec(
        "centralized",
        "Centralized",
        CentralizedServer,
        CentralizedClient,
        "pooled training of every site's train split (upper bound, not private)",
        kind="baseline",
        on_flower="it pools every site's training data in one place, which a federation never does",
        on_secure_aggregation="it pools every site's data in one place",
    ),
)
