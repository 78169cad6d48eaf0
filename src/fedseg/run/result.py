"""What training one algorithm gives back: its rows, ledger, summary entry and trained models."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

Row = dict[str, Any]  # a row of results.csv / rounds.csv / ledger.csv / metrics.csv


@dataclass
class AlgorithmResult:
    """One algorithm's results: the test and per-round rows, its ledger, its ``summary.json`` entry and models."""

    name: str
    test_rows: list[Row]
    rounds_rows: list[Row]
    ledger: list[Row]
    summary: dict[str, Any]
    bundle: dict[str, dict[str, torch.Tensor]] = field(default_factory=dict)
    metric_rows: list[Row] = field(default_factory=list)  # method-specific per-round metrics
    card: dict[str, Any] = field(default_factory=dict)  # the bundle's model card (fedseg.run.model_card), if any
