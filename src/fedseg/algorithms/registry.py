"""What everything outside a method needs to know about it: one ``AlgorithmSpec`` per method.

A method module defines its ``Server`` and ``Client`` classes, its options model and, at its
end, ``SPECS = (AlgorithmSpec(...),)``; ``fedseg.algorithms`` lists the modules once. The run,
the report, the Flower app, the studies, the benchmarks and the README's method table read
these entries; nothing else keeps a list of methods.

A *family* of methods (FedSM and its variants) may add what its Server/Client cannot express:
files written after the test evaluation, report sections, unseen-site scoring. It does so with
one ``Family`` object shared by its specs; every hook is optional and the callers (``run``,
``report``, ``studies``, ``predict``) know nothing about a particular family.

Options come from the config's ``methods.<name>`` section and are validated by the method's
pydantic model, a ``fedseg.engine.context.MethodOptions``, before anything runs (errors name
``methods.<name>.<key>``). They are parsed once per distinct value (cached: a run, a study or a
Flower node asking again gets the same frozen object). The options' hooks (``check_sites``,
``check_task``, ``run_rounds``, ``local_budget``) are the typed members of ``MethodOptions``.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Protocol

from pydantic import ValidationError

from fedseg.config import RunConfig
from fedseg.config_load import validation_problems
from fedseg.engine.context import MethodOptions

if TYPE_CHECKING:  # types only: the report kit and the data layer sit below the algorithms
    import torch
    from torch import nn

    from fedseg.data.dataset import CaseSet, SiteData
    from fedseg.engine.context import Task
    from fedseg.presentation.kit import RunFiles, Section

Kind = Literal["baseline", "global", "personalized", "clustered"]
# ``AlgorithmSpec.on_secure_aggregation``'s default: a method is refused under secure aggregation unless it opts in
NOT_SECURE = (
    "it does not declare that its server merges only the weighted sum of the updates "
    "(AlgorithmSpec.on_secure_aggregation=None)"
)
Bundle = dict[str, dict[str, "torch.Tensor"]]


class RoutedModel(Protocol):
    """A trained bundle that routes each image among several of its networks (FedSM's super model), as
    ``fedseg predict`` applies it: ``network`` maps images ``(B, C, *S)`` to region logits ``(B, R, *S)``;
    ``candidates`` are the networks' bundle names and ``prob_names`` the candidate of each routing score;
    ``choices(x)`` is, per image, the ``model`` chosen, its ``confidence`` and one ``prob:<candidate>`` per score;
    ``round_key(model)`` the key of the bundle's model card (``manifest.json`` ``trained``, ``fedseg.run.model_card``)
    that holds the round a ``model`` of ``choices`` was selected at."""

    @property
    def network(self) -> nn.Module: ...

    @property
    def candidates(self) -> list[str]: ...

    @property
    def prob_names(self) -> list[str]: ...

    def choices(self, x: torch.Tensor) -> list[dict[str, Any]]: ...

    def round_key(self, model: str) -> str: ...


@dataclass(frozen=True)
class BundleRouting:
    """How ``fedseg predict`` applies a family's bundle that routes images among its networks.

    ``owns(model_names)``: whether a bundle listing ``model_names`` is such a bundle.
    ``option_problem(bundle, gamma, folder)``: why the ``--gamma`` override does not apply to it (a message
    naming ``folder`` or the option), or None. ``build(bundle, new_segmenter, in_channels, spatial_dims,
    gamma)``: the ``RoutedModel`` (``gamma``: None = the stored routing threshold)."""

    owns: Callable[[Collection[str]], bool]
    option_problem: Callable[[Bundle, float | None, str], str | None]
    build: Callable[[Bundle, Callable[[], nn.Module], int, int, float | None], RoutedModel]


class NoOptions(MethodOptions):
    """Options model of a method without options (``methods.<name>`` must be empty)."""


@dataclass(frozen=True)
class Family:
    """Hooks a family of methods adds to a run; each defaults to "nothing".

    ``after_test(out, algorithm, bundle, site_data, task)``: write files of the family's own
    into the run directory after the single test evaluation (FedSM: the selector's features
    of the test images). ``site_data`` is empty on an engine whose sites hold their data.

    ``report_sections(run, algorithms, fig_dir)``: extra report sections (title, HTML, note)
    for the run's ``algorithms`` of this family, read from the run's files only.

    ``unseen_cells(bundle, data, task, options)``: the unseen-site table cells (FedSM paper
    Table 5) of a trained bundle on all cases of a site it never saw, or None to score the
    bundle's global model like any other method.

    ``routing``: how ``fedseg predict`` applies the family's bundles that route images among their networks.

    ``report_imports``: the modules ``report_sections`` imports (``fedseg run`` loads them while its worker pool
    starts, time it would otherwise wait).
    """

    name: str
    after_test: Callable[[Path, str, Bundle, Sequence[SiteData], Task], None] | None = None
    report_sections: Callable[[RunFiles, Sequence[str], Path], list[Section]] | None = None
    unseen_cells: Callable[[Bundle, CaseSet, Task, MethodOptions], dict[str, Any] | None] | None = None
    routing: BundleRouting | None = None
    report_imports: tuple[str, ...] = ()


@dataclass(frozen=True)
class AlgorithmSpec:
    """One method. ``kind``: ``baseline`` (not federated learning: centralized, local),
    ``global`` (one model for every site), ``personalized`` (each site uses its own model),
    ``clustered`` (a model per cluster of sites). ``family``: the family it belongs to (shared
    hooks, grouped last in the report's tables), None for a stand-alone method.
    ``needs_every_site``: the method cannot complete a round without every site's reply (e.g.
    SoftPull averages every personalized model). ``on_flower``: None if it runs on real sites,
    else the reason it cannot. ``on_secure_aggregation``: None if its server needs nothing but the weighted
    average of the train replies (``fl.secure_aggregation: secagg+`` then hides each site's update:
    ``fedseg.flower.secure``), else the reason it cannot use it (the default: a method opts in)."""

    name: str
    display_name: str
    server: type
    client: type
    description: str
    options: type[MethodOptions] = NoOptions
    kind: Kind = "global"
    family: Family | None = None
    min_sites: int = 1
    needs_every_site: bool = False
    on_flower: str | None = None
    on_secure_aggregation: str | None = NOT_SECURE
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def federated(self) -> bool:
        return self.kind != "baseline"

    @property
    def personalized(self) -> bool:
        return self.kind == "personalized"

    @property
    def clustered(self) -> bool:
        return self.kind == "clustered"

    @property
    def family_name(self) -> str | None:
        return self.family.name if self.family else None

    def parse_options(self, raw: dict[str, Any] | None) -> MethodOptions:
        """The validated options of ``methods.<name>`` (cached per distinct value; do not mutate)."""
        return _parse_options(self.name, self.options, json.dumps(raw or {}, sort_keys=True, default=str))

    def run_config(self, cfg: RunConfig) -> RunConfig:
        """The run config as this method sees it: ``fl.rounds`` replaced by the options' ``rounds`` where a
        method sets its own (e.g. ``finetune``'s ``epochs``), or by ``run_rounds(fl.rounds)`` where its options
        compute them (``fedsm-extra``: model rounds + selector rounds); ``cfg`` itself otherwise. The run and every
        site (Flower nodes too) build the method's ``Task`` from this, so the rounds, the validated rounds
        and the learning-rate schedule agree everywhere."""
        rounds = self.parse_options(cfg.methods.get(self.name)).run_rounds(cfg.fl.rounds)
        if rounds == cfg.fl.rounds:
            return cfg
        return cfg.model_copy(update={"fl": cfg.fl.model_copy(update={"rounds": rounds})})

    def check_sites(self, num_sites: int, where: str, raw_options: dict[str, Any] | None = None) -> None:
        """Raise a ValueError before any work if ``where`` (a federation of ``num_sites`` sites) has too
        few sites for this method, or if its options do not hold for that many sites."""
        if num_sites < self.min_sites:
            raise ValueError(f"{self.name} needs at least {self.min_sites} sites; {where} has {num_sites}")
        try:
            self.parse_options(raw_options).check_sites(num_sites, self.name)
        except ValueError as e:
            raise ValueError(f"{where}: {e}") from None

    def check_task(self, task: Task, raw_options: dict[str, Any] | None = None) -> None:
        """Raise a ValueError before any work if the options do not fit the run's network and task
        (an options model's ``check_task(task, algorithm)``, e.g. FedPer's ``private_layers``)."""
        self.parse_options(raw_options).check_task(task, self.name)

    def summary_fields(self) -> dict[str, Any]:
        """What ``summary.json`` records about the method, so readers never hard-code names: display
        name, family, kind and the spec's ``extra`` (e.g. Auto-FedAvg's parameterization, granularity)."""
        return {"display_name": self.display_name, "family": self.family_name, "kind": self.kind, **self.extra}


@lru_cache(maxsize=256)
def _parse_options(name: str, model: type[MethodOptions], raw_json: str) -> MethodOptions:
    try:
        return model.model_validate(json.loads(raw_json))
    except ValidationError as e:
        problems = validation_problems(e, f"methods.{name}.", model)
        raise ValueError(problems) from None
