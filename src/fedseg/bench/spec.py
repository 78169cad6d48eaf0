"""The declarative study of ``fedseg bench CONFIG.yaml``: federations x methods (with option grids) x folds x seeds.

A bench file (YAML)::

    name: headline
    base: {preset: synthetic-retina}        # the run configuration every run starts from (preset: or config:)
    set: [data.scale=0.25, threads=1]       # overrides for every run (``--set`` syntax)
    federations:                            # one table each; a name alone = that built-in federation / preset
      - synthetic-retina
      - {name: retina-iid3, set: [data.repartition.mode=iid, data.repartition.sites=3]}
      - {name: retina-unseen, set: [data.source=synthetic-retina], leave_one_out: true}   # FedSM Table 5
    methods:
      - centralized
      - {name: fedavg, grid: {train.lr: [0.001, 0.003, 0.01]}}
      - {name: fedprox, settings_from: fedavg, grid: {methods.fedprox.mu: [0.001, 0.01, 0.1]}}  # at FedAvg's lr
      - {name: fedsm-lam0.1, algorithms: [fedsm], set: [methods.fedsm.lam=0.1]}
      - {name: finetune, algorithms: [fedavg, finetune]}   # a method that starts from another's model
    seeds: [0, 1, 2]                        # run seeds: training only; the data comes from data.seed (fixed)
    split: {mode: kfold, folds: 5}          # or {mode: ratio} (the base config's ratios)
    tune: {folds: [0], seeds: [0]}          # where grids are searched (validation only)
    budget: {rule: rounds, rounds: 30}      # or sgd_steps / simulated_time: the cost of ``rounds`` reference rounds
    stop: {patience: 10, min_delta: 0.001}  # early stop on the validation plateau (fl.stop)
    reference: fedavg                       # what the Wilcoxon tests compare against
    comparisons: [[fedsm, centralized]]     # further paired tests: [method, against]
    tests: {alternative: greater}           # one-tailed Wilcoxon (FeTS 2022); default two-sided

Everything is validated when the file is read (every run's configuration included, ``fedseg.bench.plan``).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Literal

from pydantic import ConfigDict, Field, ValidationError, field_validator, model_validator

from fedseg.config import ConfigError, NoBoolNumbers, read_yaml_mapping, validation_problems
from fedseg.evaluate.stats import Alternative


class Strict(NoBoolNumbers):
    model_config = ConfigDict(extra="forbid", frozen=True)


class BaseSpec(Strict):
    """The run configuration every run starts from: a preset name or a config file (relative to the bench file)."""

    preset: str | None = None
    config: str | None = None

    @model_validator(mode="after")
    def _one(self) -> BaseSpec:
        if (self.preset is None) == (self.config is None):
            raise ValueError("base: give exactly one of preset or config")
        return self


class FederationSpec(Strict):
    """One federation (a table of its own): ``set`` overrides on top of the bench's (``data.source``, ``data.root``,
    ``data.repartition.*``, ``data.scale``...); a name alone that is a built-in federation sets ``data.source``."""

    name: str
    set: tuple[str, ...] = ()
    leave_one_out: bool = Field(
        default=False,
        description="each site in turn is left out of training and every trained model is scored on all its cases "
        "(an unseen site; FedSM Table 5): the folds of this federation are its sites",
    )

    @field_validator("name")
    @classmethod
    def _safe(cls, name: str) -> str:
        return _folder_name(name, "federations")


class MethodSpec(Strict):
    """One row of the tables: ``algorithms`` trained in one run (default ``[name]``; the last one is scored),
    ``set`` fixed overrides, ``grid`` values searched on validation (``key: [v1, v2]``, all combinations),
    ``settings_from``: another method (listed before, with a grid of its own) whose setting selected on validation
    in the same federation this one takes first (two-stage tuning: e.g. FedAvg's learning rate, then FedProx's mu
    searched at it)."""

    name: str
    algorithms: tuple[str, ...] = ()
    set: tuple[str, ...] = ()
    grid: dict[str, tuple[Any, ...]] = Field(default_factory=dict)
    settings_from: str | None = None

    @field_validator("name")
    @classmethod
    def _safe(cls, name: str) -> str:
        return _folder_name(name, "methods")

    @field_validator("grid")
    @classmethod
    def _values(cls, grid: dict[str, tuple[Any, ...]]) -> dict[str, tuple[Any, ...]]:
        for key, values in grid.items():
            if not values:
                raise ValueError(f"grid: {key} has no value")
            if len(set(map(repr, values))) != len(values):
                raise ValueError(f"grid: {key} repeats a value")
        return grid

    @property
    def trained(self) -> tuple[str, ...]:
        return self.algorithms or (self.name,)

    @property
    def scored(self) -> str:
        """The algorithm whose results are this method's (the last one trained)."""
        return self.trained[-1]


class SplitSpec(Strict):
    """``kfold``: every fold of ``folds`` is run as test (federated k-fold, FeTS Sec. 4.4.4); ``ratio``: the base
    configuration's ratio split (``data.split.ratios``), one "fold"."""

    mode: Literal["ratio", "kfold"] = "ratio"
    folds: int = Field(default=5, ge=2)


def seed_list(cls: type, value: Any) -> Any:
    """A ``seeds`` field's input: ``0,1,2`` (YAML reads a string) is [0, 1, 2]; a bare number (``3`` or ``"3"``) is
    refused, being seed 3 or 3 seeds."""
    if isinstance(value, bool):
        return value  # refused by the field's own type
    if isinstance(value, int) or (isinstance(value, str) and value.strip().isdigit()):
        raise ValueError(f"give a list: [{value}] for seed {value} alone, [0, 1, 2] for three seeds")
    if isinstance(value, str):
        try:
            return [int(seed) for seed in value.split(",")]
        except ValueError:
            raise ValueError(f"give a list of integers such as [0, 1, 2], got {value!r}") from None
    return value


class TuneSpec(Strict):
    """Where grids are searched: these folds and seeds (None = the first fold / the first seed; FeTS: folds 1-4)."""

    folds: tuple[int, ...] | None = None
    seeds: tuple[int, ...] | None = None

    _seed_list = field_validator("seeds", mode="before")(seed_list)


class BudgetSpec(Strict):
    """Equal budgets (FeTS Sec. 4.4.6): ``rounds`` = every method trains ``rounds`` rounds; ``sgd_steps`` /
    ``simulated_time`` = every method gets the total local SGD steps (Eq. 34) / simulated training time (Eq. 36-38)
    of ``rounds`` rounds of ``reference`` (with its base options; measured by running it), and may train up to
    ``max_factor`` x ``rounds`` rounds to spend it."""

    rule: Literal["rounds", "sgd_steps", "simulated_time"] = "rounds"
    rounds: int = Field(default=30, ge=1)
    reference: str = "fedavg"
    max_factor: float = Field(default=3.0, ge=1.0)


class StopSpec(Strict):
    """``fl.stop``'s plateau rule for every run: ``patience``, ``min_delta`` and ``min_rounds`` (no stop before)."""

    patience: int | None = Field(default=None, ge=1)
    min_delta: float = Field(default=0.001, ge=0)
    min_rounds: int = Field(default=0, ge=0)


class TestsSpec(Strict):
    """The paired tests of the tables (``fedseg.evaluate.stats.compare``): the Wilcoxon test's ``alternative``
    (``greater``: the method's Dice higher than the reference's / the compared one's, one-tailed as FeTS 2022
    reports; ``less``; ``two-sided``), which also picks the side of 0 the bootstrap CI must lie on to mark a
    comparison."""

    alternative: Alternative = "two-sided"


class BenchSpec(Strict):
    name: str = "bench"
    base: BaseSpec
    set: tuple[str, ...] = ()
    federations: tuple[FederationSpec, ...]
    methods: tuple[MethodSpec, ...]
    seeds: tuple[int, ...] = (0,)
    data_seed: Literal["fixed", "per-seed"] = Field(
        default="fixed",
        description="fixed: every run takes the base configuration's data.seed, so a case id is the same image and "
        "split in every seed and the seeds vary only the training; per-seed: data.seed = the run's seed, as benches "
        "ran before data.seed existed (a case id is another image in each seed), to render or resume such a bench",
    )
    split: SplitSpec = SplitSpec()
    tune: TuneSpec = TuneSpec()
    budget: BudgetSpec = BudgetSpec()
    stop: StopSpec = StopSpec()
    reference: str = "fedavg"
    tests: TestsSpec = Field(default=TestsSpec(), description="the paired tests' options; only the tables change")
    comparisons: tuple[tuple[str, str], ...] = Field(
        default=(),
        description="paired tests beyond the reference, each [method, against] (e.g. [fedsm, centralized]); they "
        "change only the tables, so a resumed bench may add them",
    )

    @field_validator("federations", "methods", mode="before")
    @classmethod
    def _names(cls, items: Any) -> Any:
        """A plain string is ``{name: string}``."""
        if not isinstance(items, (list, tuple)) or not items:
            raise ValueError("give a non-empty list")
        return [{"name": item} if isinstance(item, str) else item for item in items]

    _seed_list = field_validator("seeds", mode="before")(seed_list)

    @model_validator(mode="after")
    def _consistent(self) -> BenchSpec:
        for what, names in (("federations", [f.name for f in self.federations]), ("methods", self.method_names)):
            if len(set(names)) != len(names):
                raise ValueError(f"{what}: a name appears twice ({names})")
        if not self.seeds or len(set(self.seeds)) != len(self.seeds):
            raise ValueError(f"seeds: give distinct seeds, got {list(self.seeds)}")
        for fold in self.tune.folds or ():
            if fold not in self.folds:
                raise ValueError(f"tune.folds: {fold} is not a fold of this bench {list(self.folds)}")
        for seed in self.tune.seeds or ():
            if seed not in self.seeds:
                raise ValueError(f"tune.seeds: {seed} is not among seeds {list(self.seeds)}")
        for i, m in enumerate(self.methods):
            if m.settings_from is None:
                continue
            earlier = {e.name: e for e in self.methods[:i]}
            source = earlier.get(m.settings_from)
            if source is None or not source.grid or source.settings_from is not None:
                raise ValueError(
                    f"methods: {m.name}: settings_from: {m.settings_from!r} must name a method listed before it, "
                    "with a grid of its own and no settings_from"
                )
        if self.reference not in self.method_names:
            raise ValueError(f"reference: {self.reference!r} is not among the methods {self.method_names}")
        for pair in self.comparisons:
            unknown = [name for name in pair if name not in self.method_names]
            if unknown or pair[0] == pair[1]:
                raise ValueError(
                    f"comparisons: {list(pair)} must name two different methods of the bench {self.method_names}"
                )
        return self

    @property
    def method_names(self) -> list[str]:
        return [m.name for m in self.methods]

    @property
    def folds(self) -> tuple[int, ...]:
        """The folds run as test: every k-fold fold, or the one ratio split (0)."""
        return tuple(range(self.split.folds)) if self.split.mode == "kfold" else (0,)

    @property
    def tune_folds(self) -> tuple[int, ...]:
        return self.tune.folds if self.tune.folds is not None else self.folds[:1]

    @property
    def tune_seeds(self) -> tuple[int, ...]:
        return self.tune.seeds if self.tune.seeds is not None else self.seeds[:1]

    def method(self, name: str) -> MethodSpec:
        return next(m for m in self.methods if m.name == name)


def _folder_name(name: str, what: str) -> str:
    if not name or any(ch in name for ch in "/\\") or name.startswith("."):
        raise ValueError(f"{what}: {name!r} cannot name a folder (no '/', '\\', leading '.')")
    return name


def load_bench(path: str | Path) -> tuple[BenchSpec, Path]:
    """The bench file at ``path`` and the folder relative paths in it are read from; a ConfigError naming the file
    and every bad key otherwise."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"{path}: bench file not found")
    data = read_yaml_mapping(path.read_text(), str(path))
    try:
        return BenchSpec.model_validate(data), path.resolve().parent
    except ValidationError as e:
        raise ConfigError(_method_names(validation_problems(e, model=BenchSpec, where=str(path)), data)) from None


def _method_names(text: str, data: dict) -> str:
    """``methods.1.sett`` in a problem's text as ``methods.1 (fedprox).sett``: the entry's method named."""
    methods = data.get("methods")
    entries = methods if isinstance(methods, list) else []
    names = [m if isinstance(m, str) else m.get("name") if isinstance(m, dict) else None for m in entries]

    def named(m: re.Match[str]) -> str:
        i = int(m[1])
        return m[0] + (f" ({names[i]})" if i < len(names) and isinstance(names[i], str) else "")

    return re.sub(r"\bmethods\.(\d+)(?=[.:])", named, text)
