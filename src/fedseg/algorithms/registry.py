"""Algorithms by name: each is a ``Server`` class, a ``Client`` class and an options model.

Options come from the config's ``methods.<name>`` section and are validated by the
algorithm's pydantic model before anything runs (errors name ``methods.<name>.<key>``).
"""

from __future__ import annotations

from dataclasses import dataclass

from pydantic import BaseModel, ConfigDict, ValidationError


class NoOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")


@dataclass(frozen=True)
class AlgorithmSpec:
    name: str
    server: type
    client: type
    description: str
    options: type[BaseModel] = NoOptions
    min_sites: int = 1  # e.g. FedSM: SoftPull and the selector need K >= 2

    def check_sites(self, num_sites: int, where: str) -> None:
        """Raise a ValueError before any work if ``where`` (a federation) has too few sites for this algorithm."""
        if num_sites < self.min_sites:
            raise ValueError(f"{self.name} needs at least {self.min_sites} sites; {where} has {num_sites}")

    def parse_options(self, raw: dict | None) -> BaseModel:
        try:
            return self.options.model_validate(raw or {})
        except ValidationError as e:
            problems = "; ".join(f"methods.{self.name}.{'.'.join(map(str, err['loc']))}: {err['msg']}" for err in e.errors())
            raise ValueError(problems) from None


ALGORITHMS: dict[str, AlgorithmSpec] = {}


def register(name: str, server: type, client: type, description: str, options: type[BaseModel] = NoOptions,
             min_sites: int = 1) -> None:
    ALGORITHMS[name] = AlgorithmSpec(name, server, client, description, options, min_sites)


def get_algorithm(name: str) -> AlgorithmSpec:
    import fedseg.algorithms  # noqa: F401  (registers the built-in algorithms)

    if name not in ALGORITHMS:
        raise KeyError(f"unknown algorithm {name!r}; available: {', '.join(sorted(ALGORITHMS))}")
    return ALGORITHMS[name]
