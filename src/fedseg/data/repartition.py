"""Repartitions of a federation (``data.repartition``; FeTS 2022 benchmark Sec. 4.3), applied by ``fedseg.run.prepare``
before any training, and recorded in the run's ``config.yaml``.

* ``iid`` (Sec. 4.3.1): the cases of every site are pooled and dealt i.i.d. and balanced to ``sites`` synthetic
  sites ``iid1 .. iidN``. Each case keeps the split the run's split settings give it on its *original* site
  (so fold ``f`` of a k-fold study tests the same cases in both partitions, and paired tests between the
  original and the IID partition are possible), and the cases of each split are dealt apart: shuffled with a
  stream of ``(seed, "iid", split)`` and dealt round-robin, so every synthetic site gets ``n // N`` or
  ``n // N + 1`` cases of each split. A case becomes ``<site>--<case>`` (its ``origin_site`` in its metadata, its
  ``group`` prefixed by its site); the cases of one group travel together.
* ``limited`` (Sec. 4.3.2): drop the sites named in ``drop_sites``, drop every case without a value for the
  metadata key ``require`` (case-level, else site-level; the paper: the tumour grade), cap each site at
  ``max_cases`` cases drawn at random (a stream of ``(seed, site, "limited")``, whole groups), and drop the sites
  left empty.
* ``holdout`` (any mode): the site left out of training after the repartition, an unseen site
  (:func:`repartition_all` keeps it: its cases are what the trained models are scored on).

All are pure functions of the federation, the settings and the seed.
"""

from __future__ import annotations

from dataclasses import replace

from fedseg.config import RepartitionConfig, SplitConfig
from fedseg.data.federation import SPLITS, Case, Federation, FederationError, Site, Split
from fedseg.data.metadata import GROUP, case_groups
from fedseg.data.splits import _rng, _units, make_splits

ORIGIN = "origin_site"  # case metadata: the site an IID case came from
SEPARATOR = "--"  # <origin site>--<case id>


def repartition(fed: Federation, cfg: RepartitionConfig, split: SplitConfig, seed: int) -> Federation:
    """``fed`` repartitioned as ``cfg`` says, then without the ``holdout`` site (the training federation)."""
    full = repartition_all(fed, cfg, split, seed)
    if cfg.holdout is None:
        return full
    if cfg.holdout not in full.site_names:
        raise FederationError(f"data.repartition.holdout: no site named {cfg.holdout!r}; sites are {full.site_names}")
    return full.without(cfg.holdout)


def repartition_all(fed: Federation, cfg: RepartitionConfig, split: SplitConfig, seed: int) -> Federation:
    """``fed`` repartitioned by ``cfg.mode``, every site kept (the held-out one too; ``mode: none``: ``fed``)."""
    if cfg.mode == "iid":
        return iid(fed, cfg.sites, split, seed)
    if cfg.mode == "limited":
        return limited(fed, cfg.max_cases, cfg.drop_sites, cfg.require, seed)
    return fed


def repartitioned_site_count(cfg: RepartitionConfig, sites: int) -> int:
    """How many sites a repartition leaves of ``sites`` without reading any case (``limited``: an upper bound)."""
    held = 1 if cfg.holdout is not None else 0
    if cfg.mode == "iid":
        return cfg.sites - held
    return (sites - len(cfg.drop_sites) if cfg.mode == "limited" else sites) - held


def iid(fed: Federation, n_sites: int, split: SplitConfig, seed: int) -> Federation:
    """The IID setup: every case of ``fed`` dealt to ``n_sites`` synthetic sites, split by split (module docstring)."""
    if n_sites < 1:
        raise FederationError(f"data.repartition.sites must be >= 1, got {n_sites}")
    splits = make_splits(fed, split, seed)
    dealt: list[list[Case]] = [[] for _ in range(n_sites)]
    fixed: list[dict[str, Split]] = [{} for _ in range(n_sites)]
    for name in SPLITS:
        units = [
            [_relabelled(site, case) for case in unit]
            for site in fed.sites
            for unit in _site_units(site, {c.id for c in site.cases if splits[site.name][c.id] == name})
        ]
        order = _rng(seed, "iid", name).permutation(len(units))
        for position, index in enumerate(order):
            target = position % n_sites
            dealt[target] += units[index]
            fixed[target].update({c.id: name for c in units[index]})
    empty = [f"iid{k + 1}" for k in range(n_sites) if not dealt[k]]
    if empty:
        raise FederationError(
            f"data.repartition: {len(empty)} of {n_sites} IID sites get no case ({fed.name!r} has "
            f"{sum(len(s.cases) for s in fed.sites)} cases); use fewer sites"
        )
    sites = [Site(f"iid{k + 1}", dealt[k], fixed_splits=fixed[k]) for k in range(n_sites)]
    return replace(fed, name=f"{fed.name}-iid{n_sites}", sites=sites)


def _site_units(site: Site, ids: set[str]) -> list[list[Case]]:
    """The cases of ``site`` with an id in ``ids`` as units dealt together (a group, or a single case)."""
    by_id = {c.id: c for c in site.cases}
    return [[by_id[cid] for cid in unit] for unit in _units(sorted(ids), case_groups(site.cases))]


def _relabelled(site: Site, case: Case) -> Case:
    meta = dict(case.meta)
    meta[ORIGIN] = site.name
    if GROUP in meta and meta[GROUP] not in (None, ""):
        meta[GROUP] = f"{site.name}{SEPARATOR}{meta[GROUP]}"
    return replace(case, id=f"{site.name}{SEPARATOR}{case.id}", meta=meta)


def limited(
    fed: Federation, max_cases: int | None, drop_sites: list[str] | tuple[str, ...], require: str | None, seed: int
) -> Federation:
    """The limited setup (module docstring); a FederationError naming an unknown site in ``drop_sites`` or a
    federation left without sites."""
    unknown = [s for s in drop_sites if s not in fed.site_names]
    if unknown:
        raise FederationError(f"data.repartition.drop_sites: no site named {unknown} in {fed.name!r} {fed.site_names}")
    sites = []
    for site in fed.sites:
        if site.name in drop_sites:
            continue
        cases = [c for c in site.cases if require is None or _has(c.metadata.get(require, site.meta.get(require)))]
        if max_cases is not None and len(cases) > max_cases:
            cases = _capped(site, cases, max_cases, seed)
        if cases:
            kept = {c.id for c in cases}
            fixed = {k: v for k, v in (site.fixed_splits or {}).items() if k in kept} or None
            sites.append(replace(site, cases=cases, fixed_splits=fixed))
    if not sites:
        raise FederationError(f"data.repartition (limited) leaves no site of {fed.name!r} with a case")
    return replace(fed, name=f"{fed.name}-limited", sites=sites)


def _has(value: object) -> bool:
    return value is not None and str(value).strip() != ""


def _capped(site: Site, cases: list[Case], max_cases: int, seed: int) -> list[Case]:
    """At most ``max_cases`` of ``cases``, whole groups drawn at random; in ``site.cases`` order."""
    units = _site_units(replace(site, cases=cases), {c.id for c in cases})
    kept: set[str] = set()
    for index in _rng(seed, site.name, "limited").permutation(len(units)):
        if len(kept) + len(units[index]) <= max_cases:
            kept.update(c.id for c in units[index])
    return [c for c in cases if c.id in kept]
