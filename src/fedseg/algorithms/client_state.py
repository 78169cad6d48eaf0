"""Groups of entries in a site's client state store (``fedseg.engine.context.State``), shared by the methods.

A method keeps what a site carries from round to round (optimizer moments, a personalized model,
control variates, ...) under a prefix: ``prefix/<name>`` entries form one group.
"""

from __future__ import annotations

import torch
from torch import nn

from fedseg.engine.context import State
from fedseg.engine.messages import prefixed, weights_of
from fedseg.evaluate.tables import is_better

SCORE, ROUND = "_score", "_round"  # suffixes of a kept model's entries: validation Dice float64 (), round int64 ()


def state_group(state: State, prefix: str) -> dict[str, torch.Tensor]:
    """Entries of a client state store under ``prefix/``, prefix stripped."""
    head = prefix + "/"
    return {k[len(head) :]: v for k, v in state.items() if k.startswith(head)}


def put_group(state: State, prefix: str, tensors: dict[str, torch.Tensor]) -> None:
    """Replace the ``prefix/`` entries of a client state store by ``tensors``."""
    for key in [k for k in state if k.startswith(prefix + "/")]:
        del state[key]
    state.update(prefixed(prefix, tensors))


def keep_if_better(state: State, prefix: str, model: nn.Module, score: float, rnd: int) -> bool:
    """Keep ``model``'s weights under ``prefix/`` in a client state store, with ``score`` (a mean
    validation Dice) and round ``rnd`` (``prefix_score``, ``prefix_round``), if ``score`` beats the
    kept one. A NaN score ranks below every number; ties keep the earlier round. Returns whether it kept."""
    best = state.get(prefix + SCORE)
    if not is_better(score, None if best is None else float(best)):
        return False
    put_group(state, prefix, weights_of(model))
    state[prefix + SCORE] = torch.tensor(score, dtype=torch.float64)
    state[prefix + ROUND] = torch.tensor(rnd, dtype=torch.int64)
    return True
