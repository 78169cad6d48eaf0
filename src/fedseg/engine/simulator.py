"""In-process simulator: sites run one after another in one process, deterministically.

The server calls ``exchange({site: message}, action)``; the simulator hands each message
to the algorithm's client with that site's ``ClientContext`` (its local data, its persistent
state store, a random stream derived from (seed, site, round, action)), records the traffic
and compute time in the ledger, and returns the replies. Nothing but ``Message`` objects
passes between server and client.
"""

from __future__ import annotations

import copy
import time
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Protocol

import numpy as np
import torch
from torch import nn

from fedseg.config import RunConfig
from fedseg.data.dataset import SiteData
from fedseg.engine.ledger import Ledger, LedgerRow
from fedseg.engine.messages import Message
from fedseg.models import build_segmenter

State = dict[str, torch.Tensor]


@dataclass(frozen=True)
class Task:
    """What every participant knows about the model: network config and input/output channels."""

    cfg: RunConfig
    spatial_dims: int
    in_channels: int
    regions: tuple[str, ...]

    def new_model(self) -> nn.Module:
        """The segmentation network with the run's initial weights (same seed -> same weights).

        Built once per Task and copied after that: clients build a network for every message
        and overwrite its weights, and a copy costs about 60% of a build with random init."""
        template = self.__dict__.get("_template")
        if template is None:
            template = build_segmenter(self.cfg.model, self.spatial_dims, self.in_channels, len(self.regions),
                                       self.cfg.seed).to(self.device)
            object.__setattr__(self, "_template", template)  # a cache on a frozen dataclass
        return copy.deepcopy(template)

    @property
    def device(self) -> torch.device:
        return torch.device(self.cfg.device)


@dataclass
class ClientContext:
    """Everything a client may use while answering one message; all of it is local to the site."""

    algorithm: str
    site: str
    site_index: int
    num_sites: int
    round: int
    data: SiteData
    state: State
    task: Task
    generator: torch.Generator
    artifacts: Path | None = None  # site-local folder for files the site writes itself (report samples)
    options: object = None  # the algorithm's validated options (config ``methods.<name>``)

    @property
    def cfg(self) -> RunConfig:
        return self.task.cfg


class Client(Protocol):
    def handle(self, action: str, msg: Message, ctx: ClientContext) -> Message: ...


def stream_seed(seed: int, site_index: int, round: int, action: str) -> int:
    """A 63-bit seed for the random stream of one (seed, site, round, action)."""
    entropy = [seed, site_index, round, zlib.crc32(action.encode())]
    return int(np.random.SeedSequence(entropy).generate_state(2, dtype=np.uint64)[0] >> np.uint64(1))


def seeded_generator(seed: int) -> torch.Generator:
    """Seed torch's global RNG (dropout, initializers) and return a generator for data order."""
    torch.manual_seed(seed)
    return torch.Generator().manual_seed(seed)


class Simulator:
    """The engine for one algorithm run on one machine. See the module docstring."""

    def __init__(
        self,
        algorithm: str,
        client: Client,
        site_data: list[SiteData],
        task: Task,
        options: object = None,
        artifacts: Path | None = None,
        observers: list[Callable[[str, str, Message, Message], None]] | None = None,
    ):
        self.algorithm = algorithm
        self.client = client
        self.site_data = {d.name: d for d in site_data}
        self.sites = [d.name for d in site_data]
        self.task = task
        self.options = options
        self.artifacts = artifacts
        self.observers = list(observers or [])
        self.client_states: dict[str, State] = {s: {} for s in self.sites}
        self.ledger = Ledger()
        self.round = 0

    def num_samples(self, site: str, split: str = "train") -> int:
        """Size of a site's split: the sample count every site reports for weighting."""
        return len(self.site_data[site].split(split))

    def exchange(self, messages: dict[str, Message], action: str) -> dict[str, Message]:
        """Deliver ``messages[site]`` to each site's client under ``action``; return the replies."""
        replies = {}
        for site in self.sites:
            if site not in messages:
                continue
            msg = messages[site]
            data = self.site_data[site]
            ctx = ClientContext(
                algorithm=self.algorithm,
                site=site,
                site_index=data.index,
                num_sites=len(self.sites),
                round=self.round,
                data=data,
                state=self.client_states[site],
                task=self.task,
                generator=seeded_generator(stream_seed(self.task.cfg.seed, data.index, self.round, action)),
                artifacts=self.artifacts,
                options=self.options,
            )
            start = time.perf_counter()
            reply = self.client.handle(action, msg, ctx)
            seconds = time.perf_counter() - start
            steps = int(reply.meta.get("steps", 0))
            self.ledger.record(LedgerRow(self.round, site, action, steps, msg.num_floats(), reply.num_floats(), seconds))
            for observe in self.observers:
                observe(site, action, msg, reply)
            replies[site] = reply
        return replies

    # --- checkpointing -------------------------------------------------------------
    def snapshot_clients(self) -> dict[str, State]:
        """A deep copy of every site's state store (best-round selection keeps one)."""
        return {s: {k: v.clone() for k, v in st.items()} for s, st in self.client_states.items()}

    def restore_clients(self, states: dict[str, State]) -> None:
        self.client_states = {s: {k: v.clone() for k, v in st.items()} for s, st in states.items()}
