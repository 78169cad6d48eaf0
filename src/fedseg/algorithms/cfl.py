"""Sattler et al.'s clustered federated learning (CFL; FeTS 2022 Sec. 3.4.3, Eq. 26-30).

FedAvg per cluster (``fedseg.algorithms.clustered``), starting with one cluster of every site.
After each round's local training, for every cluster c of two or more sites, with
``dw_i = w_i - w_c`` the update of member i (its reply minus the cluster model it received;
trainable parameters and float buffers, flattened):

* Eq. 26: ``|| (1/|c|) sum_i dw_i || < eps1`` (the cluster is near a stationary point of its
  joint objective) and Eq. 27: ``max_i ||dw_i|| > eps2`` (some member is not);
* Eq. 28: cosine similarities ``a_ij = <dw_i, dw_j> / (||dw_i|| ||dw_j||)``;
* Eq. 29: the bipartition minimizing the largest cross similarity,
  ``argmin_{c1 U c2 = c} max_{i in c1, j in c2} a_ij``. That is exactly the 2-cluster cut of
  single-linkage clustering on similarities (cut the weakest edge of the maximum spanning tree):
  :func:`bipartition` merges sites by decreasing similarity until two groups remain;
* Eq. 30: split if ``gamma_max < sqrt((1 - max cross a_ij) / 2)``.

If all hold, c is split before the per-cluster merge, so each part's new model is the average
of its own members' replies. ``split_round`` is FeTS 2022's simplification (its eps and
gamma_max were "very hard to tune" on unbalanced sites): every cluster of two or more sites is
split by Eq. 29 at that round, and the Eq. 26-27/30 tests are not used (paper: round 200 of 300,
two clusters).

Defaults: ``eps1``, ``eps2`` are norms of whole-network updates, so they depend on the network,
the learning rate and the local budget. They were read off the default UNet with Adam at 1e-3, one
epoch per round, on synthetic-retina (64x64; ``benchmarks/results/runs/synthetic-retina/seed*/
cfl@personalized.json``, ``round_metrics``): the mean update's norm falls from about 2 in round 1
to 0.7-1.1 later, the largest member's lies between 2.2 and 5.5; so ``eps1`` = 1.0 and ``eps2`` =
2.0 let the similarity test decide once training has settled. Re-read them for another setting
(``round_metrics.csv`` has ``update_norm_mean`` / ``update_norm_max`` / ``separation`` per cluster
in every validated round). ``gamma_max`` = 0.75 splits only when the two parts' updates point
against each other (largest cross cosine below -0.125): Sattler et al. show that sites with
incongruent objectives have negatively correlated updates, while merely different sites give
nearly orthogonal ones (there, separation is about 0.7: sqrt((1 - 0) / 2) = 0.71).
"""

from __future__ import annotations

import math

import torch
from pydantic import Field

from fedseg.algorithms.clustered import ClusteredClient, ClusteredServer
from fedseg.algorithms.fedavg import FedAvgOptions
from fedseg.algorithms.prefixes import MODEL
from fedseg.algorithms.registry import AlgorithmSpec
from fedseg.engine.messages import Message


class CFLOptions(FedAvgOptions):
    OWN_MERGE = "CFL averages within each cluster of sites (fedseg.algorithms.clustered)"
    eps1: float = Field(1.0, ge=0, description="Eq. 26: split only if the mean update's norm is below eps1")
    eps2: float = Field(2.0, ge=0, description="Eq. 27: split only if the largest update's norm is above eps2")
    gamma_max: float = Field(
        0.75, ge=0, le=1, description="Eq. 30: split if sqrt((1 - max cross cosine) / 2) > gamma_max"
    )
    split_round: int | None = Field(
        None, ge=1, description="FeTS 2022's variant: split every cluster (Eq. 29) at this round only; None = Eq. 26-30"
    )


def flat_update(reply: dict[str, torch.Tensor], sent: dict[str, torch.Tensor]) -> torch.Tensor:
    """``w_i - w_c`` over every entry of ``sent`` (sorted by name; a model's float entries, ``weights_of``),
    flattened, float64 ``(P,)``."""
    return torch.cat([(reply[k].double() - sent[k].double()).flatten() for k in sorted(sent)])


def cosine_matrix(updates: torch.Tensor) -> torch.Tensor:
    """Eq. 28 for updates ``(n, P)``: ``(n, n)`` cosine similarities (0 where an update is zero)."""
    norms = updates.norm(dim=1, keepdim=True)
    unit = torch.where(norms > 0, updates / norms.clamp_min(1e-300), torch.zeros_like(updates))
    return unit @ unit.T


def bipartition(similarity: torch.Tensor) -> tuple[list[int], list[int]]:
    """Eq. 29 for an ``(n, n)`` similarity matrix, n >= 2: the two index groups whose largest cross
    similarity is smallest (single linkage: join pairs by decreasing similarity, ties by index,
    until two groups remain). The group holding index 0 comes first."""
    n = similarity.shape[0]
    group = list(range(n))
    edges = sorted((-float(similarity[i, j]), i, j) for i in range(n) for j in range(i + 1, n))
    groups = n
    for _, i, j in edges:
        if groups == 2:
            break
        gi, gj = group[i], group[j]
        if gi != gj:
            group = [gi if g == gj else g for g in group]
            groups -= 1
    first = [i for i in range(n) if group[i] == group[0]]
    return first, [i for i in range(n) if group[i] != group[0]]


def max_cross(similarity: torch.Tensor, a: list[int], b: list[int]) -> float:
    return float(similarity[a][:, b].max())


class CFLServer(ClusteredServer):
    """Splits clusters by Eq. 26-30 (or at ``split_round``); records the split statistics per cluster."""

    options: CFLOptions  # this method's options (``FedAvgServer.options``)

    def __init__(self, engine, task, options):
        super().__init__(engine, task, options)
        self.stats: list[dict] = []  # round_metrics rows of the last round's split tests

    def split(self, rnd: int, replies: dict[str, Message], sent: dict[str, dict[str, torch.Tensor]]) -> None:
        opts, self.stats = self.options, []
        for c, members in self.members().items():
            sites = [s for s in members if s in replies]  # those that answered (fl.on_failure = skip)
            if len(sites) < 2:
                continue
            updates = torch.stack([flat_update(replies[s].group(MODEL), sent[s]) for s in sites])
            mean_norm, max_norm = float(updates.mean(0).norm()), float(updates.norm(dim=1).max())
            similarity = cosine_matrix(updates)
            first, second = bipartition(similarity)
            separation = math.sqrt(max(0.0, 1.0 - max_cross(similarity, first, second)) / 2)
            self.stats += [
                {"site": f"cluster{c}", "metric": "update_norm_mean", "value": mean_norm},
                {"site": f"cluster{c}", "metric": "update_norm_max", "value": max_norm},
                {"site": f"cluster{c}", "metric": "separation", "value": separation},
            ]
            if opts.split_round is not None:
                split = rnd == opts.split_round
            else:
                split = mean_norm < opts.eps1 and max_norm > opts.eps2 and separation > opts.gamma_max
            if split:
                new = max(self.clusters.values()) + 1
                for i in second:
                    self.clusters[sites[i]] = new

    def round_metrics(self) -> list[dict]:
        return super().round_metrics() + self.stats


SPECS = (
    AlgorithmSpec(
        "cfl",
        "CFL",
        CFLServer,
        ClusteredClient,
        "Sattler's clustered FL: FedAvg per cluster, split by the cosine similarity of updates (Eq. 26-30)",
        CFLOptions,
        kind="clustered",
        min_sites=2,
        on_secure_aggregation="it splits clusters by the cosine similarity of individual updates",
    ),
)
