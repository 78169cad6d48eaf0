"""What the steps of one algorithm's training share: the run's pieces (``AlgorithmRun``), who hears of its
progress (``RunHooks``) and where training stands (``RoundState``)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fedseg.algorithms.registry import AlgorithmSpec
from fedseg.config import RunConfig
from fedseg.engine.base import Engine
from fedseg.run.preparation import Prepared
from fedseg.run.result import AlgorithmResult, Row
from fedseg.tracking import Tracker

RoundCallback = Callable[[str, int, dict[str, float]], None]  # (algorithm, round, the sites' training losses)
ValidatedCallback = Callable[[str, int, float], None]  # (algorithm, round, its mean validation Dice over sites)
BestRound = dict[str, Any]  # {"round", "score", "server", "clients"[, "file"]}: the best round so far and its states


@dataclass
class RunHooks:
    """Who hears of an algorithm's progress: ``on_round_end`` after each round, ``on_log_line`` each ``run.log``
    line, ``tracker`` (``fedseg.tracking``) each checkpointed round and the test results, ``on_validated`` each
    validated round's mean validation Dice (the selection metric) as soon as it is scored, and on a resume the last
    one its checkpoint holds."""

    on_round_end: RoundCallback | None = None
    on_log_line: Callable[[str], None] | None = None
    tracker: Tracker | None = None
    on_validated: ValidatedCallback | None = None


@dataclass
class AlgorithmRun:
    """The pieces of one algorithm's training: its spec and options, the prepared data (under the method's own
    config), the engine and the server (``server``: the method's Server, whatever its class), where its
    checkpoint and outputs go, and what it may start from (``earlier``: results of the run's earlier algorithms)."""

    name: str
    spec: AlgorithmSpec
    options: Any  # the method's options model (AlgorithmSpec.parse_options)
    prep: Prepared
    engine: Engine
    server: Any
    out: Path
    ckpt_path: Path
    earlier: dict[str, AlgorithmResult]
    keep_checkpoints: bool
    hooks: RunHooks

    @property
    def cfg(self) -> RunConfig:
        """The config the method trains under (its own rounds: ``AlgorithmSpec.run_config``)."""
        return self.prep.task.cfg

    @property
    def sites(self) -> list[str]:
        """The engine's sites, in federation order."""
        return self.engine.sites

    def val_cases(self) -> dict[str, int]:
        """Every site's number of validation cases (the stop budgets count validation work)."""
        return {s: self.engine.num_samples(s, "val") for s in self.sites}


@dataclass
class RoundState:
    """Where training stands: the next round (``start``), the rows so far, the best round (with its states),
    the fl.stop rule that ended training early (``fedseg.run.stopping``) and round -> mean validation Dice."""

    start: int = 1
    rounds_rows: list[Row] = field(default_factory=list)
    metric_rows: list[Row] = field(default_factory=list)
    best: BestRound | None = None
    stopped: str | None = None
    validated: dict[int, float] = field(default_factory=dict)
