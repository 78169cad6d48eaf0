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

import logging
import time
from collections.abc import Callable, Collection
from types import CodeType
from typing import Protocol

import torch

from fedseg.engine.context import Delivery, MethodOptions, Task
from fedseg.engine.faults import SiteFailure, outlying_updates, reply_problem, scores_problem
from fedseg.engine.ledger import EVAL_ACTIONS, Ledger, LedgerRow
from fedseg.engine.messages import Message
from fedseg.engine.own_code import own_place

log = logging.getLogger(__name__)

Observer = Callable[[str, str, Message, Message], None]  # (site, action, message, reply)
ClientStates = dict[str, dict[str, torch.Tensor]]
ReplyCheck = Callable[[str, Message, Message], str | None]  # a method's own check: (site, sent, reply) -> why not


def both_checks(first: ReplyCheck, second: ReplyCheck | None) -> ReplyCheck:
    """One reply check: ``first``'s problem, else ``second``'s (``second`` None: ``first`` alone)."""
    return first if second is None else lambda site, sent, reply: first(site, sent, reply) or second(site, sent, reply)


class Engine(Protocol):
    """What a Server may use (see the module docstring)."""

    algorithm: str
    sites: list[str]
    task: Task
    round: int
    ledger: Ledger
    supports_resume: bool
    all_sites_required: bool  # the method cannot skip a site (fl.on_failure = skip does not apply)
    method_code: Collection[CodeType]  # a registered method's own functions (fedseg.engine.own_code)

    def exchange(
        self, messages: dict[str, Message], action: str, check: ReplyCheck | None = None
    ) -> dict[str, Message]: ...

    def num_samples(self, site: str, split: str = "train") -> int: ...

    def snapshot_clients(self) -> ClientStates: ...

    def restore_clients(self, states: ClientStates) -> None: ...

    def checkpointed(self, kept: list[ClientStates]) -> None: ...

    def close(self) -> None: ...


class BaseEngine:
    """The shared half of every engine; subclasses implement ``deliver`` and the client-state methods."""

    supports_resume = True  # False where the sites' state stores cannot be put in a checkpoint

    def __init__(
        self,
        algorithm: str,
        sites: list[str],
        task: Task,
        options: MethodOptions | None = None,
        observers: list[Observer] | None = None,
    ):
        self.algorithm = algorithm
        self.sites = list(sites)
        self.task = task
        self.options = options
        self.observers = list(observers or [])
        self.ledger = Ledger()
        self.round = 0
        self.all_sites_required = False  # the method cannot skip a site (AlgorithmSpec.needs_every_site)
        self.method_code: Collection[CodeType] = ()  # a site's error raised in it names the place (own_place)
        self.failing: set[str] = set()  # sites left out (fl.on_failure = skip) since they last answered
        self.warned: set[str] = set()  # the current exchange's failures said in a WARNING line (``failure``)

    @property
    def skips_failures(self) -> bool:
        """``fl.on_failure = skip``: a failed site is left out of the exchange (else the run stops)."""
        return self.task.cfg.fl.on_failure == "skip"

    def delivery(self, site: str, action: str) -> Delivery:
        """The engine-side fields of ``site``'s ``ClientContext`` for ``action`` in the current round."""
        return Delivery(self.algorithm, site, self.sites.index(site), len(self.sites), self.round, action)

    def exchange(
        self, messages: dict[str, Message], action: str, check: ReplyCheck | None = None
    ) -> dict[str, Message]:
        """Deliver ``messages[site]`` to each site's client under ``action``; return the replies in
        federation order, each recorded in the ledger and shown to the observers. A reply that fails the engine's
        checks (``fedseg.engine.faults``) or the method's own ``check`` (``check(site, message, reply)``: why the method
        cannot use it, or None) is a site failure under ``fl.on_failure``."""
        unknown = sorted(set(messages) - set(self.sites))
        if unknown:
            raise KeyError(f"messages for unknown sites {unknown}; sites are {self.sites}")
        if not action.isidentifier():
            raise ValueError(f"action {action!r} must be a Python identifier (it names a message type on every engine)")
        order = [s for s in self.sites if s in messages]
        self.warned = set()
        began = time.perf_counter()
        answered = self.deliver(order, messages, action)
        wall, number = time.perf_counter() - began, self.ledger.next_exchange()
        replies: dict[str, Message] = {}
        failed: list[str] = []
        timeout = self.task.cfg.fl.timeout_s
        for site in order:
            msg, answer = messages[site], answered[site]
            if isinstance(answer, BaseException):
                error = f"{type(answer).__name__}: {answer}{own_place(answer, self.method_code)}"
                failed.append(self.failure(site, action, error, msg, 0.0, answer, (number, wall)))
                continue
            reply, seconds = answer
            problem = reply_problem(msg, reply, action not in EVAL_ACTIONS, self.num_samples(site))
            if problem is None and action in EVAL_ACTIONS:
                split = msg.meta.get("split")
                declared = self.num_samples(site, split) if split in ("train", "val", "test") else None
                problem = scores_problem(msg, reply, len(self.task.regions), declared)
            if problem is None and check is not None:
                try:  # a method's arithmetic on what a site sent (a rogue F**q overflowing) is that site's failure
                    problem = check(site, msg, reply)
                except (ArithmeticError, ValueError, TypeError, KeyError) as error:
                    problem = f"its reply cannot be checked ({type(error).__name__}: {error})"
            if timeout is not None and seconds > timeout:
                problem = f"no reply within fl.timeout_s = {timeout:g} s (took {seconds:.1f} s)"
            if problem is not None:
                failed.append(self.failure(site, action, problem, msg, seconds, None, (number, wall)))
                continue
            steps = int(reply.meta.get("steps", 0))
            self.ledger.record(
                LedgerRow(
                    self.round, site, action, steps, msg.num_floats(), reply.num_floats(), seconds, "", number, wall
                )
            )
            for observe in self.observers:
                observe(site, action, msg, reply)
            replies[site] = reply
            if site in self.failing:
                self.failing.discard(site)
                log.info("site %r answers again (round %d, %s %s)", site, self.round, self.algorithm, action)
        if action not in EVAL_ACTIONS:
            for site, (norm, median) in outlying_updates(messages, replies).items():
                log.warning(
                    "round %d, %s %s: site %r sent an update %.3g times %s (L2 norm %.3g against %.3g): a faulty or "
                    "poisoned site? A weighted average takes it in whole; a robust merge (methods.<method>.aggregator: "
                    "krum, bulyan, clipped; fedmedian, fedtrimmedavg) limits what one site can do",
                    self.round,
                    self.algorithm,
                    action,
                    site,
                    norm / median,
                    "the other site's" if len(replies) == 2 else "the median of the other sites'",
                    norm,
                    median,
                )
        if failed and self.all_sites_required:
            raise SiteFailure(
                f"{'; '.join(failed)}. {self.algorithm} needs every site's reply in each exchange, so it cannot skip "
                "a site (fl.on_failure = skip does not apply to it)"
            )
        if failed and len(replies) < self.task.cfg.fl.min_sites:
            said = [w for w in failed if w in self.warned]  # each said in its WARNING line above in this exchange
            unsaid = [w for w in failed if w not in self.warned]
            if unsaid:
                which = "; ".join(unsaid) + (f"; and {len(said)} more said in their warnings above" if said else "")
            else:
                which = "each said in its warning above" if len(said) > 1 else "said in its warning above"
            raise SiteFailure(
                f"{len(failed)} site(s) failed {self.algorithm} {action} in round {self.round} ({which}). Only "
                f"{len(replies)} sites answered; fl.min_sites = {self.task.cfg.fl.min_sites}"
            )
        return replies

    def failure(
        self,
        site: str,
        action: str,
        problem: str,
        msg: Message,
        seconds: float,
        error: BaseException | None = None,
        exchange: tuple[int, float] = (0, 0.0),
    ) -> str:
        """Handle one failed reply: raise under ``stop``; under ``skip`` record it in the ledger (``exchange``:
        the exchange's number and wall seconds) and return its description (the exchange goes on without it). The
        first failure of a site that answered before is a WARNING (its reason); its next ones, until it answers
        again, are in ``ledger.csv`` only: a site that is gone fails every exchange of every round."""
        what = f"site {site!r}, round {self.round}, {self.algorithm} {action}: {problem}"
        if not self.skips_failures:
            raise SiteFailure(what) from error
        self.ledger.record(LedgerRow(self.round, site, action, 0, msg.num_floats(), 0, seconds, problem, *exchange))
        if site not in self.failing:
            self.failing.add(site)
            log.warning("%s (fl.on_failure = skip: left out until it answers again; each failure in ledger.csv)", what)
            self.warned.add(what)
        return what

    def checkpointed(self, kept: list[ClientStates]) -> None:
        """A checkpoint is on disk that names the client states ``kept`` (``snapshot_clients`` results: its
        round's and its best round's). Engines whose snapshots live elsewhere may release older ones
        (Flower); here they are plain copies owned by the caller, so nothing to do. Called from the
        checkpoint writer's thread."""

    def close(self) -> None:
        """The algorithm is done: release what the engine holds for it (e.g. state files). Here: nothing."""

    def num_samples(self, site: str, split: str = "train") -> int:
        """The size of ``site``'s ``split`` (cases), as the site declared it: its aggregation weight n_k."""
        raise NotImplementedError

    def deliver(
        self, order: list[str], messages: dict[str, Message], action: str
    ) -> dict[str, tuple[Message, float] | BaseException]:
        """``{site: (reply, compute seconds measured around the client's handle)}`` for every site of ``order``;
        under ``fl.on_failure = skip`` a site that failed maps to its exception (under ``stop`` it is raised)."""
        raise NotImplementedError
