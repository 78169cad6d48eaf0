"""Traffic and compute accounting: one row per (round, site, exchange action).

``seconds`` is the site's own compute time (measured around its client's ``handle``); ``wall_seconds``
is the wall time of the whole exchange the row belongs to (numbered by ``exchange``, 1, 2, ... within
one algorithm's run), the same on every row of that exchange: on the simulator about the sum of the
sites' seconds (one after another), on the worker pool about the longest worker's share. A round's
wall time is the sum of ``wall_seconds`` over its distinct exchanges (:meth:`Ledger.round_wall_seconds`).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

EVAL_ACTIONS = frozenset({"evaluate", "share_model"})  # evaluation traffic, not training
FORWARD_ONLY_ACTIONS = frozenset({"loss"})  # steps of these rows are forward-only batches (q-FedAvg's F_k pass)


@dataclass
class LedgerRow:
    round: int
    site: str
    action: str
    steps: int
    floats_down: int
    floats_up: int
    seconds: float
    failure: str = ""  # why the site's reply was skipped (fl.on_failure = skip; fedseg.engine.faults); "" = answered
    exchange: int = 0  # which exchange of the run the row belongs to (1, 2, ...; 0: recorded by an older fedseg)
    wall_seconds: float = 0.0  # wall time of that whole exchange, seconds (module docstring)
    bytes_down: int = 0  # bytes of the message as it travelled (Flower only; 0 where not measured)
    bytes_up: int = 0  # bytes of the reply as it travelled (Flower only; SecAgg+'s key exchanges: fedseg.flower.secure)


class Ledger:
    """Rows recorded by the engine for every message it passes (floats are counted, not computed)."""

    def __init__(self, rows: list[LedgerRow] | None = None):
        self.rows: list[LedgerRow] = list(rows or [])

    def record(self, row: LedgerRow) -> None:
        self.rows.append(row)

    def training_rows(self) -> list[LedgerRow]:
        """Rows of training-related exchanges (everything but evaluation)."""
        return [r for r in self.rows if r.action not in EVAL_ACTIONS]

    def totals(self) -> dict[str, float]:
        """``floats_sent`` (down + up, training exchanges), ``sgd_steps`` (optimizer steps; forward-only
        batches excluded), ``seconds`` (all compute)."""
        train = self.training_rows()
        return {
            "floats_sent": sum(r.floats_down + r.floats_up for r in train),
            "sgd_steps": sum(r.steps for r in train if r.action not in FORWARD_ONLY_ACTIONS),
            "seconds": sum(r.seconds for r in self.rows),
            "bytes_sent": sum(r.bytes_down + r.bytes_up for r in train),
        }

    def next_exchange(self) -> int:
        """The number of the next exchange (one more than the last recorded; resumed ledgers continue)."""
        return 1 + max((r.exchange for r in self.rows), default=0)

    def round_wall_seconds(self) -> dict[int, float]:
        """Wall time per round, seconds: ``wall_seconds`` summed over the round's distinct exchanges."""
        walls: dict[int, dict[int, float]] = {}
        for r in self.rows:
            walls.setdefault(r.round, {})[r.exchange] = r.wall_seconds
        return {rnd: sum(w.values()) for rnd, w in walls.items()}

    def failures(self) -> list[dict[str, Any]]:
        """The skipped replies: ``{round, site, action, reason}`` per ledger row with a failure."""
        return [
            {"round": r.round, "site": r.site, "action": r.action, "reason": r.failure} for r in self.rows if r.failure
        ]

    def as_dicts(self) -> list[dict[str, Any]]:
        return [asdict(r) for r in self.rows]

    @classmethod
    def from_dicts(cls, rows: list[dict[str, Any]]) -> Ledger:
        return cls([LedgerRow(**r) for r in rows])
