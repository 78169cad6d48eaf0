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

    def parse_options(self, raw: dict | None) -> BaseModel:
        try:
            return self.options.model_validate(raw or {})
        except ValidationError as e:
            problems = "; ".join(f"methods.{self.name}.{'.'.join(map(str, err['loc']))}: {err['msg']}" for err in e.errors())
            raise ValueError(problems) from None


ALGORITHMS: dict[str, AlgorithmSpec] = {}


def register(name: str, server: type, client: type, description: str, options: type[BaseModel] = NoOptions) -> None:
    ALGORITHMS[name] = AlgorithmSpec(name, server, client, description, options)


def get_algorithm(name: str) -> AlgorithmSpec:
    import fedseg.algorithms  # noqa: F401  (registers the built-in algorithms)

    if name not in ALGORITHMS:
        raise KeyError(f"unknown algorithm {name!r}; available: {', '.join(sorted(ALGORITHMS))}")
    return ALGORITHMS[name]
