"""Client sampling (``fl.clients_per_round``): which methods may train a sample of the sites per round.

The draw itself is the engine's (``fedseg.engine.sampling.sample_sites``, called by
``FedAvgServer.participants``); whether a method may sample is decided here, before any work.
"""

from __future__ import annotations

from fedseg.algorithms.fedavg import FedAvgServer
from fedseg.algorithms.registry import AlgorithmSpec


def sampling_refusal(spec: AlgorithmSpec) -> str | None:
    """Why method ``spec`` cannot train a sample of the sites per round (``fl.clients_per_round``), or None:
    it needs every site's reply (``needs_every_site``), its round is not FedAvg's (the one that samples:
    ``FedAvgServer.run_round``), or its server says why not (``NO_CLIENT_SAMPLING``)."""
    if spec.needs_every_site:
        return "it needs every site's reply in each round"
    server = spec.server
    if not (isinstance(server, type) and issubclass(server, FedAvgServer)) or server.run_round is not (
        FedAvgServer.run_round
    ):
        return "its rounds are its own (not FedAvg's broadcast and merge, which samples the sites)"
    return server.NO_CLIENT_SAMPLING
