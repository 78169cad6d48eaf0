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

    def check_sites(self, num_sites: int, where: str, raw_options: dict | None = None) -> None:
        """Raise a ValueError before any work if ``where`` (a federation of ``num_sites`` sites) has too
        few sites for this algorithm, or if its options (``methods.<name>``) do not hold for that many
        sites: an options model may define ``check_sites(num_sites, algorithm)`` (e.g. FedSM's
        SoftPull needs ``lam >= 1/K``, so a leave-one-out study must check it for K - 1 sites)."""
        if num_sites < self.min_sites:
            raise ValueError(f"{self.name} needs at least {self.min_sites} sites; {where} has {num_sites}")
        check = getattr(self.parse_options(raw_options), "check_sites", None)
        if check is not None:
            try:
                check(num_sites, self.name)
            except ValueError as e:
                raise ValueError(f"{where}: {e}") from None

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


def check_sites(cfg, num_sites: int, where: str) -> None:
    """``AlgorithmSpec.check_sites`` for every algorithm of run config ``cfg`` with its ``methods.<name>`` options."""
    for name in cfg.algorithms:
        get_algorithm(name).check_sites(num_sites, where, cfg.methods.get(name))


def get_algorithm(name: str) -> AlgorithmSpec:
    import fedseg.algorithms  # noqa: F401  (registers the built-in algorithms)

    if name not in ALGORITHMS:
        raise KeyError(f"unknown algorithm {name!r}; available: {', '.join(sorted(ALGORITHMS))}")
    return ALGORITHMS[name]
