"""What a site's client sees while it answers one message, built the same way by every engine.

``Task`` is what every participant knows about the model (network config, input channels,
regions). ``ClientContext`` is everything local to one site for one message: its data, its
persistent state store, a random stream derived from (seed, site, round, action) only — so a
site's numbers do not depend on the engine, on the order sites run in, or on which process
answers. :func:`answer` is the one place a client handles a message: the simulator, the
Flower node (and any later engine) call it.
"""

from __future__ import annotations

import copy
import time
import zlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar, Protocol, TypeVar

import torch
from pydantic import ConfigDict
from torch import nn

from fedseg.accel import prepare_model, resolve
from fedseg.config import BudgetConfig, NoBoolNumbers, RunConfig, region_tolerances
from fedseg.data.dataset import SiteData
from fedseg.data.federation import Federation, Regions
from fedseg.engine.faults import inject, matching_faults
from fedseg.engine.messages import Message, load_weights
from fedseg.engine.state import state_problem
from fedseg.models import build_segmenter
from fedseg.train import seed_from

State = dict[str, torch.Tensor]


@dataclass(frozen=True)
class Task:
    """What every participant knows about the model: network config and input/output channels (one per region),
    and the label values of each region (``region_values``, in ``regions``' order: the label map its masks paint).
    A run builds it with :meth:`of`; a task built without ``region_values`` can build models but not score."""

    cfg: RunConfig
    spatial_dims: int
    in_channels: int
    regions: tuple[str, ...]
    region_values: tuple[tuple[int, ...], ...] = ()
    ignore_label: int | None = None  # the label value of unannotated voxels (``Regions.ignore``), or None

    @classmethod
    def of(cls, cfg: RunConfig, fed: Federation) -> Task:
        """The task of training on ``fed`` under ``cfg``."""
        return cls(cfg, fed.spatial_dims, fed.channels, fed.regions.names, fed.regions.values, fed.regions.ignore)

    def new_model(self) -> nn.Module:
        """The segmentation network with the run's initial weights (same seed -> same weights).

        Built once per Task and copied after that: a copy costs about 60% of a build with random init.
        Clients that need a network per message reuse one instead (``ReusedModels``)."""
        template = self.__dict__.get("_template")
        if template is None:
            template = build_segmenter(
                self.cfg.model, self.spatial_dims, self.in_channels, len(self.regions), self.cfg.seed
            ).to(self.device)
            prepare_model(template, resolve(self.cfg.train, self.device))  # train.amp, channels_last, cuDNN
            object.__setattr__(self, "_template", template)  # a cache on a frozen dataclass
        return copy.deepcopy(template)

    @property
    def device(self) -> torch.device:
        return torch.device(self.cfg.device)

    @property
    def scored_regions(self) -> Regions | None:
        """What the metrics score (``eval.score_on``): ``label_map``, the region masks of the label map the
        thresholded channels paint (these regions, for ``fedseg.evaluate.metrics.label_map_masks``): what
        ``fedseg predict`` writes, so a run's scores are its written masks' scores; ``channels`` (None), each
        thresholded channel as it is (a nested region predicted outside its parent is not added to it)."""
        if self.cfg.eval.score_on == "channels":
            return None
        if not self.region_values:
            raise ValueError(
                "eval.score_on: label_map needs each region's label values: build the Task with Task.of(cfg, "
                "federation), or give region_values"
            )
        return Regions(self.regions, self.region_values)

    @property
    def nsd_tolerances(self) -> list[float]:
        """``eval.nsd_tolerance`` per region, in ``regions``' order (a ValueError when a mapping does not name
        exactly the task's regions; ``fedseg.config.region_tolerances``)."""
        return region_tolerances(self.cfg.eval.nsd_tolerance, self.regions)


class MethodOptions(NoBoolNumbers):
    """A method's validated options (config ``methods.<name>``; every method's options model extends this
    one) and the hooks through which they shape a run. Each hook defaults to "nothing differs"; built once
    per run from the config (``AlgorithmSpec.parse_options``) and handed to the server and every client.

    ``check_sites(num_sites, algorithm)`` and ``check_task(task, algorithm)`` raise a ValueError before any
    work when the options do not hold for that many sites (FedSM's SoftPull ``lam >= 1/K``) or for the
    run's network (FedPer's ``private_layers``); ``run_rounds(rounds)`` is the number of rounds the method
    trains for ``fl.rounds = rounds`` (``finetune``'s ``epochs``); ``rounds_dependency()`` says why a run of it
    cannot be extended to more rounds on resume; ``local_budget()`` is a site's local
    budget of one round, None for ``train.budget``."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    # Whether the method trains in phases whose first rounds cannot be selected (FedSM-extra's model phase before its
    # selector phase, ``run_rounds``): a bench's budget could stop it only after them (``fedseg.bench.plan.phased``).
    PHASED: ClassVar[bool] = False
    # Why the method trains exactly as FedAvg when a round is one local step (its change to FedAvg's local objective
    # is zero on a round's first step, FedProx's proximal term): the run's note on a site whose local budget is one
    # step (``fedseg.run.checks.one_step_notes``); None: the method's first step differs from FedAvg's.
    ONE_STEP_AS_FEDAVG: ClassVar[str | None] = None
    # Whether that holds only where every site trains one step each round, all of them (SCAFFOLD: its corrections
    # c - c_k cancel in the average of all sites only), rather than at each such site (FedProx).
    ONE_STEP_EVERY_SITE: ClassVar[bool] = False

    def one_step_as_fedavg(self) -> bool:
        """Whether these options keep ``ONE_STEP_AS_FEDAVG`` true (e.g. SCAFFOLD's server rate 1)."""
        return self.ONE_STEP_AS_FEDAVG is not None

    def check_sites(self, num_sites: int, algorithm: str) -> None:
        """Raise a ValueError if the options do not hold for a federation of ``num_sites`` sites."""

    def site_warnings(self, num_sites: int, algorithm: str) -> list[str]:
        """Warnings (not errors) about these options on ``num_sites`` sites, e.g. SoftPull's λ below 1/K."""
        return []

    def check_task(self, task: Task, algorithm: str) -> None:
        """Raise a ValueError if the options do not fit the run's network and task."""

    def run_rounds(self, rounds: int) -> int:
        """The rounds this method trains for ``fl.rounds = rounds`` (default: those)."""
        return rounds

    def rounds_dependency(self) -> str | None:
        """Why the rounds these options train depend on ``fl.rounds`` itself, beyond ``run_rounds`` and the
        learning-rate schedule (e.g. fedavg-dp's ``select_round: last``), so a run cannot be extended to more rounds
        on resume as if configured with them (``fedseg.run.extend``); None: they do not."""
        return None

    def local_budget(self) -> BudgetConfig | None:
        """A site's local budget of one round; None: the Trainer's own (``train.budget``)."""
        return None

    def run_note(self, task: Task, algorithm: str) -> str | None:
        """A line the run shows once when it starts, saying what the options mean on this run's network (e.g.
        FedPer's share of private parameters); None: nothing to say."""
        return None


class ReusedModels:
    """Networks a client keeps from one message to the next, one per slot name, instead of building one per
    message (``Task.new_model`` deep-copies a template: about 15 ms for the default U-Net, ten times loading its
    weights; FedSM's validation built K + 1 of them per site and round).

    ``get(slot, owner, build, weights)`` returns the slot's network with ``weights`` loaded (every float entry,
    ``load_weights``) and everything else reset to what ``build()`` made: each submodule's train/eval mode, each
    parameter's ``requires_grad``, no ``.grad``, the integer state entries (BatchNorm's ``num_batches_tracked``).
    So the network equals a fresh ``build()`` with ``weights`` loaded, and a result never depends on reuse. The
    slot is built again when ``owner`` (a tuple compared by identity, e.g. ``(task,)``) changes. A slot's network
    belongs to one message at a time: callers use distinct slots for networks alive at once and never keep one
    after the message. Pickling (worker pool, Ray) leaves the networks behind."""

    def __init__(self) -> None:
        self._slots: dict[str, _Slot] = {}

    def __reduce__(self) -> tuple[type[ReusedModels], tuple[()]]:
        return (ReusedModels, ())

    def get(
        self, slot: str, owner: tuple[object, ...], build: Callable[[], nn.Module], weights: Mapping[str, torch.Tensor]
    ) -> nn.Module:
        held = self._slots.get(slot)
        if held is None or len(held.owner) != len(owner) or any(a is not b for a, b in zip(held.owner, owner)):
            held = self._slots[slot] = _Slot(owner, build())
        else:
            held.reset()
        load_weights(held.model, weights)
        return held.model


class _Slot:
    """One reused network and what ``reset`` puts back (``ReusedModels``)."""

    def __init__(self, owner: tuple[object, ...], model: nn.Module):
        self.owner, self.model = owner, model
        self.modes = [m.training for m in model.modules()]
        self.requires_grad = [p.requires_grad for p in model.parameters()]
        self.fixed = {k: v.clone() for k, v in model.state_dict().items() if not v.is_floating_point()}

    def reset(self) -> None:
        """Everything but the float state entries as built (``ReusedModels``)."""
        for m, training in zip(self.model.modules(), self.modes):
            m.training = training
        for p, flag in zip(self.model.parameters(), self.requires_grad):
            p.grad = None
            p.requires_grad_(flag)
        if self.fixed:
            state = self.model.state_dict()
            with torch.no_grad():
                for k, v in self.fixed.items():
                    state[k].copy_(v)


Options = TypeVar("Options", bound=MethodOptions)


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
    options: MethodOptions = field(default_factory=MethodOptions)  # config ``methods.<name>``, validated

    @property
    def cfg(self) -> RunConfig:
        return self.task.cfg


def options_as(options: MethodOptions, kind: type[Options]) -> Options:
    """A method's ``options`` (e.g. ``ctx.options``) as its own options model ``kind``: a client reads its fields
    through this; a TypeError for another method's options."""
    if not isinstance(options, kind):
        raise TypeError(f"the options are {type(options).__name__}, not {kind.__name__}")
    return options


class Client(Protocol):
    def handle(self, action: str, msg: Message, ctx: ClientContext) -> Message: ...


def stream_seed(seed: int, site_index: int, round: int, action: str) -> int:
    """A 63-bit seed for the random stream of one (seed, site, round, action)."""
    return seed_from(seed, site_index, round, zlib.crc32(action.encode()))


def seeded_generator(seed: int) -> torch.Generator:
    """Seed torch's global RNG (dropout, initializers) and return a generator for data order."""
    torch.manual_seed(seed)
    return torch.Generator().manual_seed(seed)


@dataclass(frozen=True)
class Delivery:
    """Who receives a message: the fields of the ``ClientContext`` that come from the engine."""

    algorithm: str
    site: str
    site_index: int
    num_sites: int
    round: int
    action: str


def answer(
    client: Client,
    msg: Message,
    to: Delivery,
    data: SiteData,
    state: State,
    task: Task,
    options: MethodOptions | None = None,
    artifacts: Path | None = None,
) -> tuple[Message, float]:
    """Build the site's ``ClientContext`` (its random stream from (seed, site index, round, action)),
    let ``client`` handle ``msg`` and return the reply with the compute seconds it took.
    ``state`` is the site's store: the client updates it in place, with tensors only (a TypeError naming the entry
    otherwise, ``fedseg.engine.state.state_problem``: the site's failure, before any engine stores it)."""
    ctx = ClientContext(
        algorithm=to.algorithm,
        site=to.site,
        site_index=to.site_index,
        num_sites=to.num_sites,
        round=to.round,
        data=data,
        state=state,
        task=task,
        generator=seeded_generator(stream_seed(task.cfg.seed, to.site_index, to.round, to.action)),
        artifacts=artifacts,
        options=MethodOptions() if options is None else options,
    )
    faults = matching_faults(task.cfg, to.site, to.round, to.action)  # config ``faults``: injected ones
    start = time.perf_counter()
    inject(faults, msg, None, task.cfg)
    reply = client.handle(to.action, msg, ctx)
    if not isinstance(reply, Message):  # a method's client returned something else (a dict of tensors?)
        raise TypeError(f"the client replied a {type(reply).__name__}, not a Message (fedseg.engine.messages)")
    if (problem := state_problem(state, "ctx.state")) is not None:  # an int kept there: said here, in every engine
        raise TypeError(problem)
    if faults:
        reply = inject(faults, msg, reply, task.cfg) or reply
    return reply, time.perf_counter() - start
