"""How fedseg's messages list things: one rule for every "a, b and c" and "a, b and 3 more" a user reads."""

from __future__ import annotations

from collections.abc import Iterable


def listed(words: Iterable[str], shown: int | None = None) -> str:
    """``a``, ``a and b``, ``a, b and c``; past ``shown`` words, the first ``shown`` and ``and N more`` (N ≥ 2: a
    single word left over is named instead, as short as its count); ``""`` for none."""
    words = list(words)
    if shown is not None and len(words) > shown + 1:
        words = [*words[:shown], f"{len(words) - shown} more"]
    return f"{', '.join(words[:-1])} and {words[-1]}" if len(words) > 1 else "".join(words)
