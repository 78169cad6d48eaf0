"""Before any work: the federation of a run's config, its splits and every site's pre-processed data."""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

from fedseg.config import RunConfig
from fedseg.data.dataset import SiteData, build_site_data, prepare_threads
from fedseg.data.federation import Federation, Split
from fedseg.data.memory_guard import MemoryGuard
from fedseg.data.repartition import repartition, repartitioned_site_count
from fedseg.engine.context import Task
from fedseg.run.preflight import folder_root as folder_root  # where the checks before any work need it

if TYPE_CHECKING:
    from fedseg.plan.federated import PlannedRun

Splits = dict[str, dict[str, Split]]  # {site: {case id: split}}
PLAN_FILE = "plan.json"


@dataclass
class Prepared:
    """A validated federation, its splits and every site's preprocessed data; ``plan``: with ``model.name:
    planned``, the plan the data and the task's config follow (``prepare_planned``); ``fingerprint``: of a
    federation given by user code, which a resume must be given again (``fedseg.run.data_record``)."""

    federation: Federation
    splits: Splits
    site_data: list[SiteData]
    task: Task
    plan: PlannedRun | None = None
    fingerprint: str | None = None  # of a federation from user code (fedseg.data.user_federation), else None


def load_federation(cfg: RunConfig) -> Federation:
    """The federation named by ``cfg.data``: a folder (validated by ``data check``), a built-in one or one
    registered from user code (``fedseg.data.sources.register_federation``)."""
    if root := folder_root(cfg):
        from fedseg.data.check import check_folder

        return check_folder(root, cfg.data.split, cfg.data.seed, threads=prepare_threads(cfg.data))
    from fedseg.data.sources import build_federation

    return build_federation(cfg)


def count_sites(cfg: RunConfig) -> int:
    """Number of sites of the federation ``cfg.data`` names, without reading or generating any image
    (for checks made before any work, e.g. when a study is planned)."""
    if root := folder_root(cfg):
        from fedseg.data.folder import load_folder

        count = len(load_folder(root).sites)
    else:
        from fedseg.data.sources import count_source_sites

        count = count_source_sites(cfg)
    return repartitioned_site_count(cfg.data.repartition, count)


def federation_splits(cfg: RunConfig, federation: Federation | None) -> tuple[Federation, Splits, str | None]:
    """The (repartitioned) federation, its checked splits (``{site: {case id: split}}``) and, for a federation
    from user code (in memory or a registered builder), the fingerprint of its check
    (:func:`fedseg.data.user_federation.check_user_federation`; None for a folder or a built-in one)."""
    from fedseg.data.splits import check_splits, make_splits
    from fedseg.data.user_federation import check_user_federation, is_user_federation

    given = federation or load_federation(cfg)
    fingerprint = check_user_federation(given) if is_user_federation(cfg.data.source, federation) else None
    fed = repartition(given, cfg.data.repartition, cfg.data.split, cfg.data.seed)
    splits = make_splits(fed, cfg.data.split, cfg.data.seed)
    check_splits(fed, splits)
    return fed, splits, fingerprint


def prepare(cfg: RunConfig, federation: Federation | None = None) -> Prepared:
    """Load (unless an in-memory ``federation`` is given) and validate everything before any file is written."""
    fed, splits, fingerprint = federation_splits(cfg, federation)
    return replace(prepared_sites(cfg, fed, splits), fingerprint=fingerprint)


def prepared_sites(cfg: RunConfig, fed: Federation, splits: Splits) -> Prepared:
    """Every site's data pre-processed under ``cfg.data``, and the task of ``cfg``; refused as soon as the sites'
    cases are projected not to fit in memory (``fedseg.data.memory_guard``: one check over every site, the worker
    pool's copies of the volumes mapped from the prepared-case cache counted)."""
    originals = cfg.eval.score_grid == "original"
    cases = sum(len(site.cases) for site in fed.sites)
    scored = sum(split != "train" for site in fed.sites for split in splits[site.name].values())
    guard = MemoryGuard.start(cases, len(fed.sites), cfg.engine.workers, scored)
    site_data = [
        build_site_data(fed, site, i, splits[site.name], cfg.data, originals=originals, guard=guard)
        for i, site in enumerate(fed.sites)
    ]
    task = Task.of(cfg, fed)
    task.nsd_tolerances  # noqa: B018 - a mapping eval.nsd_tolerance must name the regions: fail before training
    return Prepared(fed, splits, site_data, task)


def prepare_planned(cfg: RunConfig, out: Path, resume: bool, federation: Federation | None = None) -> Prepared:
    """``model.name: planned``: the federation and splits, then the plan (``fedseg.plan``): the one in
    ``out/plan.json`` when resuming a run that recorded one (reused, never planned again), else planned from the
    sites' fingerprints collected through the planning exchanges; then every site's data pre-processed and the
    task built under the config with the plan applied (``fedseg.plan.planner.apply_plan``)."""
    from fedseg.plan.federated import PlannedRun, plan_federation, planning_engine
    from fedseg.plan.planner import apply_plan

    fed, splits, fingerprint = federation_splits(cfg, federation)
    stored = out / PLAN_FILE
    if resume and stored.is_file():
        planned = PlannedRun.from_dict(json.loads(stored.read_text()))
    else:
        planned = plan_federation(planning_engine(cfg, fed, splits), cfg)
    prep = prepared_sites(apply_plan(cfg, planned.plan), fed, splits)
    return replace(prep, plan=planned, fingerprint=fingerprint)
