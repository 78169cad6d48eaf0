"""Clustered federated learning (FeTS 2022 Sec. 3.4, Eq. 25): FedAvg run separately in each cluster of sites.

:class:`ClusteredServer` is FedAvg per cluster: site k receives the model of its cluster, and each
cluster's model becomes the (sample- or uniformly) weighted average of its members' replies,
buffers included. What decides the clusters is the method's:

* ``prior-cfl`` (Sec. 3.4.2, "Prior CFL HGG/LGG"): clusters fixed before training from site
  metadata (``cluster_by: <key>``; a site-level key of ``federation.yaml``'s ``sites:``, else the
  most common value of a case-level column of ``<site>/cases.csv``), as federated fine-tuning of
  a base method's global model (``start_from``, default ``fedavg``; paper: 30 rounds from the best
  FedAvg model). Sites report their own value (a ``metadata`` exchange before the first round,
  no floats): a site that lacks the key fails the run there, before any training, with a message
  naming the site and key;
* ``fedavg-continue`` ("FedAvg continued"): the same start, rounds and per-site selection as
  ``prior-cfl`` with one cluster of every site, i.e. FedAvg resumed from the start model for
  ``rounds`` more rounds: the control that tells what prior-CFL owes to its clusters rather than to
  its extra rounds. Its kind is ``clustered`` (one cluster), not ``global``: like prior-CFL, each site
  is tested with its own selected model, and the reports must put both in the same per-site table;
* ``cfl`` (Sattler et al., Eq. 26-30): ``fedseg.algorithms.cfl``.

Clusters are numbered 0, 1, ...; a split keeps the number for the part holding the cluster's
first site and gives the other part the next free number. Membership is written each validated
round to ``round_metrics.csv`` (metric ``cluster``, one row per site) and kept in the server's
checkpointed state, so a resumed run continues with the same clusters (on Flower: the
coordinator holds them). Each site is validated and tested with its cluster's model at its own
best validation round (per-site selection, ``fedseg.algorithms.persite``).
"""

from __future__ import annotations

import torch
from pydantic import Field

from fedseg.algorithms.aggregate import weighted_average
from fedseg.algorithms.fedavg import FedAvgOptions, train_losses
from fedseg.algorithms.persite import PerSiteClient, PerSiteServer
from fedseg.algorithms.prefixes import MODEL
from fedseg.algorithms.registry import AlgorithmSpec
from fedseg.engine.context import ClientContext
from fedseg.engine.messages import Message, prefixed

Weights = dict[str, torch.Tensor]
CLUSTERS = "clusters"  # server-state entry: cluster number per site, int64 (K,), federation order
METADATA = "metadata"  # action: a site reports its value of a metadata key


class ClusteredServer(PerSiteServer):
    """FedAvg per cluster; ``split(rnd, replies)`` may change the clusters after a round's training."""

    def __init__(self, engine, task, options):
        super().__init__(engine, task, options)
        self.clusters: dict[str, int] = {}  # site -> cluster number
        self.models: dict[int, Weights] = {}  # cluster number -> its model

    def initial_clusters(self) -> dict[str, int]:
        """The clusters before the first round (default: every site in cluster 0)."""
        return dict.fromkeys(self.engine.sites, 0)

    def members(self) -> dict[int, list[str]]:
        """``{cluster: its sites in federation order}``, clusters in number order."""
        groups: dict[int, list[str]] = {}
        for site in self.engine.sites:
            groups.setdefault(self.clusters[site], []).append(site)
        return dict(sorted(groups.items()))

    def run_round(self, rnd: int) -> dict[str, float]:
        if not self.clusters:  # first round (a resumed run has them from its checkpoint)
            self.clusters = self.initial_clusters()
            self.models = {c: dict(self.global_weights) for c in sorted(set(self.clusters.values()))}
        sent = {s: self.models[self.clusters[s]] for s in self.engine.sites}
        messages = {s: Message(prefixed(MODEL, w)) for s, w in sent.items()}
        replies = self.engine.exchange(messages, "train", self.train_reply_problem)
        self.split(rnd, replies, sent)
        weights = self.checked_aggregation_weights(replies)
        for c, sites in self.members().items():  # a cluster none of whose sites answered keeps its model
            answered = [s for s in sites if s in replies]  # (fl.on_failure = skip)
            if answered:
                self.models[c] = weighted_average(
                    [replies[s].group(MODEL) for s in answered], [weights[s] for s in answered]
                )
        return train_losses(replies)

    def split(self, rnd: int, replies: dict[str, Message], sent: dict[str, Weights]) -> None:
        """Change ``self.clusters`` after round ``rnd``'s training (before the per-cluster merge). Default: never."""

    def site_weights(self, site: str) -> Weights:
        return self.models[self.clusters[site]]

    def round_metrics(self) -> list[dict]:
        return [{"site": s, "metric": "cluster", "value": float(c)} for s, c in self.clusters.items()]

    def state_dict(self) -> dict[str, torch.Tensor]:
        state = dict(super().state_dict())
        if self.clusters:
            state[CLUSTERS] = torch.tensor([self.clusters[s] for s in self.engine.sites], dtype=torch.int64)
            for c, weights in self.models.items():
                state.update(prefixed(f"cluster{c}", weights))
        return state

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        super().load_state_dict(state)
        if CLUSTERS in state:
            self.clusters = {s: int(c) for s, c in zip(self.engine.sites, state[CLUSTERS].tolist())}
            self.models = {c: Message(state).group(f"cluster{c}") for c in sorted(set(self.clusters.values()))}
        else:
            self.clusters, self.models = {}, {}


class ClusteredClient(PerSiteClient):
    """FedAvg's client; also answers which value of a metadata key its data carries."""

    def on_metadata(self, msg: Message, ctx: ClientContext) -> Message:
        return Message({}, {"value": ctx.data.metadata_value(str(msg.meta["key"]))})


# --- prior clustering and its control -----------------------------------------------------------
class ContinuedOptions(FedAvgOptions):
    """Federated training resumed from a trained global model: ``prior-cfl`` and ``fedavg-continue``."""

    start_from: str = Field(
        "fedavg", description="algorithm of the same run (listed before) or RUN/model/<algorithm> folder to start from"
    )
    rounds: int | None = Field(
        None, ge=1, description="federated rounds from the start model; None = fl.rounds (prior-CFL paper: 30)"
    )

    def run_rounds(self, rounds: int) -> int:
        """``rounds`` if set, else ``fl.rounds`` (``AlgorithmSpec.run_config``)."""
        return rounds if self.rounds is None else self.rounds


class FedAvgContinueOptions(ContinuedOptions):
    OWN_MERGE = "fedavg-continue averages within its one cluster of all sites, as prior-cfl does"


class PriorCFLOptions(ContinuedOptions):
    OWN_MERGE = "prior-cfl averages within each cluster of sites"
    cluster_by: str | None = Field(
        None, min_length=1, description="site metadata key whose values are the clusters (e.g. grade, collection)"
    )

    def check_sites(self, num_sites: int, algorithm: str) -> None:
        """``cluster_by`` is required (checked before any work; no key is right for every federation)."""
        if self.cluster_by is None:
            raise ValueError(
                f"methods.{algorithm}.cluster_by: required: the site metadata key whose values are the clusters "
                "(built-in federations: collection for synthetic-retina, coil for synthetic-prostate)"
            )


class PriorCFLServer(ClusteredServer):
    """Clusters = the distinct values of ``cluster_by`` the sites report, numbered in sorted value order."""

    options: PriorCFLOptions  # this method's options (``FedAvgServer.options``)

    def initial_clusters(self) -> dict[str, int]:
        key = self.options.cluster_by
        assert key is not None  # the options refuse a run without it (check_sites)
        replies = self.engine.exchange({s: Message({}, {"key": key}) for s in self.engine.sites}, METADATA)
        values = {s: str(r.meta["value"]) for s, r in replies.items()}
        number = {v: i for i, v in enumerate(sorted(set(values.values())))}
        return {s: number[v] for s, v in values.items()}


SPECS = (
    AlgorithmSpec(
        "prior-cfl",
        "Prior CFL",
        PriorCFLServer,
        ClusteredClient,
        "FedAvg fine-tuning per cluster of sites fixed by metadata (cluster_by), from a trained global model",
        PriorCFLOptions,
        kind="clustered",
        on_secure_aggregation="it averages within clusters of sites (one sum per cluster, not one per round)",
    ),
    AlgorithmSpec(  # ClusteredServer's default clusters: every site in cluster 0
        "fedavg-continue",
        "FedAvg continued",
        ClusteredServer,
        ClusteredClient,
        "FedAvg resumed from a trained global model (start_from) for rounds more rounds, per-site selection: "
        "prior-cfl's control (one cluster)",
        FedAvgContinueOptions,
        kind="clustered",
        on_secure_aggregation="it merges as prior-cfl does (per cluster, from the individual replies)",
    ),
)
