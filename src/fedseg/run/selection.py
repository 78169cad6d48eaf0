"""Which rounds' models may be selected, and how validation scores compare (NaN ranks lowest)."""

from __future__ import annotations

from typing import Any

from fedseg.evaluate.tables import is_better, nan_low

__all__ = ["is_better", "nan_low", "selectable_scores"]


def selectable_scores(validated: dict[int, float], server: Any) -> dict[int, float]:
    """The validated rounds' mean validation Dice, of the rounds whose model may be selected (the plateau rule's)."""
    return {rnd: score for rnd, score in validated.items() if server.selectable(rnd)}
