"""Algorithms by name: each is a ``Server`` class and a ``Client`` class."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class AlgorithmSpec:
    name: str
    server: type
    client: type
    description: str


ALGORITHMS: dict[str, AlgorithmSpec] = {}


def register(name: str, server: type, client: type, description: str) -> None:
    ALGORITHMS[name] = AlgorithmSpec(name, server, client, description)


def get_algorithm(name: str) -> AlgorithmSpec:
    import fedseg.algorithms  # noqa: F401  (registers the built-in algorithms)

    if name not in ALGORITHMS:
        raise KeyError(f"unknown algorithm {name!r}; available: {', '.join(sorted(ALGORITHMS))}")
    return ALGORITHMS[name]
