"""In-process simulator: sites answer one after another in this process, deterministically.

The engine contract (:mod:`fedseg.engine.base`): the server calls ``exchange({site: message},
action)``; the simulator hands each message to the algorithm's client through
:func:`fedseg.engine.context.answer` (the site's local data, its persistent state store kept
here in a :class:`fedseg.engine.state.StateStore` (RAM, or disk with ``engine.state: disk``), a random
stream derived from (seed, site, round, action)); ``BaseEngine`` records the traffic and compute time in
the ledger and returns the replies. Nothing but ``Message`` objects passes between server and client.
"""

from __future__ import annotations

from pathlib import Path

from fedseg.data.dataset import SiteData
from fedseg.engine.base import BaseEngine, ClientStates, Observer
from fedseg.engine.context import Client, MethodOptions, Task, answer
from fedseg.engine.messages import Message
from fedseg.engine.state import StateStore


class SitesHereEngine(BaseEngine):
    """The shared half of the engines whose sites' data and state stores are on this machine (``Simulator``,
    ``fedseg.engine.pool.PoolEngine``): sample counts from ``site_data``, the stores in a ``StateStore``
    (``store``; default: every site's in RAM), checkpoints through its snapshots."""

    def __init__(
        self,
        algorithm: str,
        site_data: list[SiteData],
        task: Task,
        options: MethodOptions | None = None,
        observers: list[Observer] | None = None,
        store: StateStore | None = None,
    ):
        super().__init__(algorithm, [d.name for d in site_data], task, options, observers)
        self.site_data = {d.name: d for d in site_data}
        self.store = store or StateStore(self.sites)

    @property
    def client_states(self) -> ClientStates:
        """The state stores kept in RAM, live (``engine.state: memory``: every site's)."""
        return self.store.memory

    def num_samples(self, site: str, split: str = "train") -> int:
        """Size of a site's split: the sample count every site reports for weighting."""
        return len(self.site_data[site].split(split))

    # --- checkpointing -------------------------------------------------------------
    def snapshot_clients(self) -> ClientStates:
        """Every site's state store as it is now (``StateStore.snapshot``: copies, or tokens for stores on disk)."""
        return self.store.snapshot()

    def restore_clients(self, states: ClientStates) -> None:
        self.store.restore(states)

    def checkpointed(self, kept: list[ClientStates]) -> None:
        """Stores on disk: the snapshots no checkpoint on disk needs go (``StateStore.release``)."""
        self.store.release(kept)

    def close(self) -> None:
        """Remove the state files of ``engine.state: disk`` (the checkpoints hold what a resume needs)."""
        self.store.close()


class Simulator(SitesHereEngine):
    """The engine for one algorithm run on one machine. See the module docstring."""

    def __init__(
        self,
        algorithm: str,
        client: Client,
        site_data: list[SiteData],
        task: Task,
        options: MethodOptions | None = None,
        artifacts: Path | None = None,
        observers: list[Observer] | None = None,
        store: StateStore | None = None,
    ):
        super().__init__(algorithm, site_data, task, options, observers, store)
        self.client = client
        self.artifacts = artifacts

    def deliver(
        self, order: list[str], messages: dict[str, Message], action: str
    ) -> dict[str, tuple[Message, float] | BaseException]:
        """Each site in turn, in this process, with its state store kept here. A site's exception is its answer
        (``BaseEngine.exchange`` applies the failure policy); its state store stays as it was."""
        answered: dict[str, tuple[Message, float] | BaseException] = {}
        for site in order:
            state = self.store.load(site)
            try:
                answered[site] = answer(
                    self.client,
                    messages[site],
                    self.delivery(site, action),
                    self.site_data[site],
                    state,
                    self.task,
                    self.options,
                    self.artifacts,
                )
            except Exception as e:  # noqa: BLE001 - the failure policy decides (fedseg.engine.faults)
                answered[site] = e
                continue
            self.store.save(site, state)
        return answered
