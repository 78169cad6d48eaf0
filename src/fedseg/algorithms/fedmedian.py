"""FedMedian (Yin et al., ICML 2018): the global model is the coordinate-wise median of the
local models (unweighted; robust to a minority of outlying sites). Clients are FedAvg clients;
``local_steps`` applies, ``weighting`` does not exist here."""

from __future__ import annotations

from fedseg.algorithms.aggregate import coordinate_median
from fedseg.algorithms.fedavg import BudgetOptions, FedAvgClient, FedAvgServer
from fedseg.algorithms.prefixes import MODEL
from fedseg.algorithms.registry import AlgorithmSpec
from fedseg.engine.messages import Message


class FedMedianOptions(BudgetOptions):
    pass


class FedMedianServer(FedAvgServer):
    def aggregate(self, replies: dict[str, Message]) -> None:
        self.global_weights = coordinate_median([r.group(MODEL) for r in replies.values()])


FedMedianClient = FedAvgClient


SPECS = (
    AlgorithmSpec(
        "fedmedian",
        "FedMedian",
        FedMedianServer,
        FedMedianClient,
        "FedMedian: coordinate-wise median of the local models",
        FedMedianOptions,
        on_secure_aggregation="its coordinate-wise median needs every site's update",
    ),
)
