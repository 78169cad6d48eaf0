"""Traffic and compute accounting: one row per (round, site, exchange action)."""

from __future__ import annotations

from dataclasses import asdict, dataclass

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
        }

    def failures(self) -> list[dict]:
        """The skipped replies: ``{round, site, action, reason}`` per ledger row with a failure."""
        return [
            {"round": r.round, "site": r.site, "action": r.action, "reason": r.failure} for r in self.rows if r.failure
        ]

    def as_dicts(self) -> list[dict]:
        return [asdict(r) for r in self.rows]

    @classmethod
    def from_dicts(cls, rows: list[dict]) -> Ledger:
        return cls([LedgerRow(**r) for r in rows])
