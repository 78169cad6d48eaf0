"""FedTrimmedAvg (Yin et al., ICML 2018): the global model is the coordinate-wise trimmed mean
of the local models -- per coordinate the ``int(beta * K)`` lowest and highest values are dropped
(unweighted). Clients are FedAvg clients; ``local_steps`` applies."""

from __future__ import annotations

from pydantic import Field

from fedseg.algorithms.aggregate import trimmed_mean
from fedseg.algorithms.fedavg import BudgetOptions, FedAvgClient, FedAvgServer
from fedseg.algorithms.prefixes import MODEL
from fedseg.algorithms.registry import AlgorithmSpec
from fedseg.engine.messages import Message


class FedTrimmedAvgOptions(BudgetOptions):
    beta: float = Field(0.2, ge=0, lt=0.5, description="fraction cut at each end (Flower's default 0.2)")


class FedTrimmedAvgServer(FedAvgServer):
    options: FedTrimmedAvgOptions  # this method's options (``FedAvgServer.options``)

    def aggregate(self, replies: dict[str, Message]) -> None:
        self.global_weights = trimmed_mean([r.group(MODEL) for r in replies.values()], self.options.beta)


FedTrimmedAvgClient = FedAvgClient


SPECS = (
    AlgorithmSpec(
        "fedtrimmedavg",
        "FedTrimmedAvg",
        FedTrimmedAvgServer,
        FedTrimmedAvgClient,
        "FedTrimmedAvg: coordinate-wise trimmed mean (cut beta at each end)",
        FedTrimmedAvgOptions,
        on_secure_aggregation="its trimmed mean sorts every site's update per coordinate",
    ),
)
