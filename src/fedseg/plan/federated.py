"""Federated planning: the two planning exchanges, the merge and the plan, before any case is pre-processed.

``model.name: planned`` (``fedseg.run.run_experiment``): the sites' training cases are read where they are, by
:class:`fedseg.plan.fingerprint.FingerprintClient` through an engine's ``exchange`` (so the traffic is counted
in a ledger, round 0, algorithm ``plan``):

1. ``fingerprint`` (empty message down): each site replies with its geometry per case and its foreground
   moments per channel;
2. ``histogram`` (down: the agreed range per channel, the merged min / max, ``(C,)`` twice, and ``bins``):
   each site replies with one ``(bins,)`` histogram per channel.

The server merges them (``fedseg.plan.merge``) and plans (``fedseg.plan.planner``). Every site must answer
(``fl.on_failure = skip`` does not apply: a plan from some sites would differ from the one the run records).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from fedseg.config import RunConfig
from fedseg.data.dataset import raw_site_data
from fedseg.data.federation import Federation, Split
from fedseg.engine.base import Engine
from fedseg.engine.context import Task
from fedseg.engine.messages import Message
from fedseg.engine.simulator import Simulator
from fedseg.plan.fingerprint import FINGERPRINT, HISTOGRAM, FingerprintClient, SiteFingerprint
from fedseg.plan.merge import DatasetFingerprint, agreed_range, merge_fingerprints, merge_moments
from fedseg.plan.planner import Plan, make_plan

PLAN = "plan"  # the planning exchanges' algorithm name (ledger.csv rows)


@dataclass
class PlannedRun:
    """A run's plan and the ledger rows of the exchanges that collected its fingerprint (``plan.json``)."""

    plan: Plan
    ledger: list[dict]

    def to_dict(self) -> dict:
        return {"plan": self.plan.to_dict(), "ledger": self.ledger}

    @classmethod
    def from_dict(cls, d: dict) -> PlannedRun:
        return cls(Plan.from_dict(d["plan"]), list(d["ledger"]))

    def summary(self) -> dict:
        """The plan with its traffic (floats down / up over both exchanges), for ``summary.json``."""
        down = sum(int(r["floats_down"]) for r in self.ledger)
        up = sum(int(r["floats_up"]) for r in self.ledger)
        seconds = sum(float(r["seconds"]) for r in self.ledger)
        return {**self.plan.to_dict(), "traffic": {"floats_down": down, "floats_up": up, "seconds": seconds}}


def collect_fingerprint(engine: Engine, bins: int) -> DatasetFingerprint:
    """The two planning exchanges on ``engine`` (module docstring) and their merge."""
    replies = engine.exchange({site: Message() for site in engine.sites}, FINGERPRINT)
    sites = [SiteFingerprint.from_message(replies[s]) for s in engine.sites]
    low, high = agreed_range(merge_moments(sites))
    agreed = {"low": torch.from_numpy(low), "high": torch.from_numpy(high)}
    answers = engine.exchange({s: Message(dict(agreed), {"bins": bins}) for s in engine.sites}, HISTOGRAM)
    histograms = [{int(k.split("/")[1]): v.numpy() for k, v in answers[s].tensors.items()} for s in engine.sites]
    return merge_fingerprints(sites, histograms, low, high)


def planning_engine(cfg: RunConfig, fed: Federation, splits: dict[str, dict[str, Split]]) -> Simulator:
    """The in-process engine of the planning exchanges: every site's training cases as they are
    (``fedseg.data.dataset.raw_site_data``), its store in memory, every site required."""
    sites = [raw_site_data(fed, site, i, splits[site.name]) for i, site in enumerate(fed.sites)]
    task = Task.of(cfg, fed)  # no network is built
    engine = Simulator(PLAN, FingerprintClient(), sites, task)
    engine.all_sites_required = True
    return engine


def plan_federation(engine: Engine, cfg: RunConfig) -> PlannedRun:
    """Collect the fingerprint on ``engine`` and plan under ``cfg.model.plan``."""
    fingerprint = collect_fingerprint(engine, cfg.model.plan.bins)
    return PlannedRun(make_plan(fingerprint, cfg.model.plan), engine.ledger.as_dicts())
