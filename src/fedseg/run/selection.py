"""Which rounds' models may be selected, and how validation scores compare (NaN ranks lowest)."""

from __future__ import annotations

import math
from typing import Any


def selectable_scores(validated: dict[int, float], server: Any) -> dict[int, float]:
    """The validated rounds' mean validation Dice, of the rounds whose model may be selected (the plateau rule's)."""
    return {rnd: score for rnd, score in validated.items() if server.selectable(rnd)}


def nan_low(score: float) -> float:
    """A validation score for comparisons: NaN (no site could be scored) ranks below every number."""
    return -math.inf if math.isnan(score) else score


def is_better(score: float, best_score: float | None) -> bool:
    """Whether a round validated at ``score`` beats the best so far (``best_score``; None: no best yet)."""
    return best_score is None or nan_low(score) > nan_low(best_score)
