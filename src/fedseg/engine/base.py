"""The engine contract: what an algorithm's Server may use, and the exchange every engine shares.

An engine runs one algorithm on a federation. The Server sees only this protocol
(:class:`Engine`): the site names, the round, ``exchange({site: Message}, action) -> {site:
reply}``, the ledger, each site's sample counts and the snapshot/restore of the sites' state
stores (best-round selection). :class:`BaseEngine` writes once what every engine must do around
a delivery — refuse unknown sites and actions that cannot travel, record each exchange in the
ledger (floats counted from the messages themselves, steps from the reply), notify observers, and
return the replies in federation order — and leaves only ``deliver`` (how messages reach the
sites and replies come back) to each engine: in this process (``Simulator``) or over Flower
(``fedseg.flower.engine.FlowerEngine``). On the site side every engine calls
:func:`fedseg.engine.context.answer`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

import torch

from fedseg.engine.context import Delivery, Task
from fedseg.engine.ledger import Ledger, LedgerRow
from fedseg.engine.messages import Message

Observer = Callable[[str, str, Message, Message], None]  # (site, action, message, reply)
ClientStates = dict[str, dict[str, torch.Tensor]]


class Engine(Protocol):
    """What a Server may use (see the module docstring)."""

    algorithm: str
    sites: list[str]
    task: Task
    round: int
    ledger: Ledger
    supports_resume: bool

    def exchange(self, messages: dict[str, Message], action: str) -> dict[str, Message]: ...

    def num_samples(self, site: str, split: str = "train") -> int: ...

    def snapshot_clients(self) -> ClientStates: ...

    def restore_clients(self, states: ClientStates) -> None: ...


class BaseEngine:
    """The shared half of every engine; subclasses implement ``deliver`` and the client-state methods."""

    supports_resume = True  # False where the sites' state stores cannot be put in a checkpoint

    def __init__(
        self,
        algorithm: str,
        sites: list[str],
        task: Task,
        options: object = None,
        observers: list[Observer] | None = None,
    ):
        self.algorithm = algorithm
        self.sites = list(sites)
        self.task = task
        self.options = options
        self.observers = list(observers or [])
        self.ledger = Ledger()
        self.round = 0

    def delivery(self, site: str, action: str) -> Delivery:
        """The engine-side fields of ``site``'s ``ClientContext`` for ``action`` in the current round."""
        return Delivery(self.algorithm, site, self.sites.index(site), len(self.sites), self.round, action)

    def exchange(self, messages: dict[str, Message], action: str) -> dict[str, Message]:
        """Deliver ``messages[site]`` to each site's client under ``action``; return the replies in
        federation order, each recorded in the ledger and shown to the observers."""
        unknown = sorted(set(messages) - set(self.sites))
        if unknown:
            raise KeyError(f"messages for unknown sites {unknown}; sites are {self.sites}")
        if not action.isidentifier():
            raise ValueError(f"action {action!r} must be a Python identifier (it names a message type on every engine)")
        order = [s for s in self.sites if s in messages]
        answered = self.deliver(order, messages, action)
        replies = {}
        for site in order:
            msg, (reply, seconds) = messages[site], answered[site]
            steps = int(reply.meta.get("steps", 0))
            self.ledger.record(
                LedgerRow(self.round, site, action, steps, msg.num_floats(), reply.num_floats(), seconds)
            )
            for observe in self.observers:
                observe(site, action, msg, reply)
            replies[site] = reply
        return replies

    def deliver(self, order: list[str], messages: dict[str, Message], action: str) -> dict[str, tuple[Message, float]]:
        """``{site: (reply, compute seconds measured around the client's handle)}`` for every site of ``order``."""
        raise NotImplementedError
