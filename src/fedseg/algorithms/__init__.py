"""Federated algorithms, registered by name. Each module holds a Server and a Client class."""

from fedseg.algorithms.centralized import CentralizedClient, CentralizedServer
from fedseg.algorithms.fedavg import FedAvgClient, FedAvgServer
from fedseg.algorithms.local import LocalClient, LocalServer
from fedseg.algorithms.registry import ALGORITHMS, AlgorithmSpec, get_algorithm, register

register("centralized", CentralizedServer, CentralizedClient, "pooled training of every site's train split (upper bound, not private)")
register("local", LocalServer, LocalClient, "each site trains alone; cross-site matrix at test time")
register("fedavg", FedAvgServer, FedAvgClient, "FedAvg (McMahan et al.): weighted (samples | uniform) averaging of local models")

__all__ = ["ALGORITHMS", "AlgorithmSpec", "get_algorithm", "register"]
