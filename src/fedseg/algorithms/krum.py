"""Krum, Multi-Krum and Bulyan as methods of their own: the FedAvg pair with another ``aggregator``
default (like ``fedavg-uniform``), so that one run can compare them with ``fedavg``, ``fedmedian`` and
``fedtrimmedavg``. The rules, their requirements (Krum: n > 2f + 2 sites; Bulyan: n >= 4f + 3) and the
conventions shared with Flower: :mod:`fedseg.algorithms.robust`. Every option of ``fedavg`` applies
(``num_malicious`` f = 1 by default; ``multikrum_keep`` m = n - f by default).
"""

from __future__ import annotations

from fedseg.algorithms.fedavg import FedAvgClient, FedAvgOptions, FedAvgServer
from fedseg.algorithms.registry import AlgorithmSpec
from fedseg.algorithms.robust import Aggregator


class KrumOptions(FedAvgOptions):
    """``krum``: the local model with the lowest Krum score (Blanchard et al. 2017)."""

    aggregator: Aggregator = "krum"


class MultiKrumOptions(FedAvgOptions):
    """``multikrum``: the (``weighting``-)weighted average of the m lowest-score local models."""

    aggregator: Aggregator = "multikrum"


class BulyanOptions(FedAvgOptions):
    """``bulyan``: recursive Krum selection of n - 2f models, then the coordinate-wise mean of the
    n - 4f values closest to the median (El Mhamdi et al. 2018)."""

    aggregator: Aggregator = "bulyan"


SPECS = (
    AlgorithmSpec(
        "krum",
        "Krum",
        FedAvgServer,
        FedAvgClient,
        "Krum (Blanchard et al.): the local model closest to its n - f - 2 nearest others",
        KrumOptions,
        min_sites=3,
        on_secure_aggregation="Krum scores each site's update by its distances to the others'",
    ),
    AlgorithmSpec(
        "multikrum",
        "Multi-Krum",
        FedAvgServer,
        FedAvgClient,
        "Multi-Krum (Blanchard et al.): weighted average of the m lowest-Krum-score local models",
        MultiKrumOptions,
        min_sites=3,
        on_secure_aggregation="Multi-Krum scores each site's update by its distances to the others'",
    ),
    AlgorithmSpec(
        "bulyan",
        "Bulyan",
        FedAvgServer,
        FedAvgClient,
        "Bulyan (El Mhamdi et al.): recursive Krum selection, then a coordinate-wise trimmed mean around the median",
        BulyanOptions,
        min_sites=3,
        on_secure_aggregation="Bulyan selects and trims individual updates",
    ),
)
