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
    tune: {folds: [0], seeds: [0]}          # where grids are searched (validation only; seeds: see TuneSpec)
                                            # or {per_fold: true}: searched in every fold, for that fold (nested)
    budget: {rule: rounds, rounds: 30}      # or sgd_steps / simulated_time: the cost of ``rounds`` reference rounds
    stop: {patience: 10, min_delta: 0.001}  # early stop on the validation plateau (fl.stop)
    reference: fedavg                       # what the Wilcoxon tests compare against
    comparisons: [[fedsm, centralized]]     # further paired tests: [method, against]
    tests: {alternative: greater}           # one-tailed Wilcoxon (FeTS 2022); default two-sided

Everything is validated when the file is read (every run's configuration included, ``fedseg.bench.plan``). A bench
file is also refused what no run would use (``split.folds`` without ``mode: kfold``, ``budget.reference`` under
``rule: rounds``, ``tune`` without a grid...) and, in any ``set:`` or grid, a run configuration key the bench sets
itself in every run (``BenchSpec.run_keys``: ``fl.rounds`` is ``budget.rounds``, ``seed`` is ``seeds``...), which
would be overwritten; a recorded bench (``bench.json``, ``tables.json``: every field dumped, perhaps by an older
fedseg) is validated without these checks (``AS_WRITTEN``).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import ConfigDict, Field, ValidationError, ValidationInfo, field_validator, model_validator

from fedseg.config import SEED_MAX, NoBoolNumbers
from fedseg.config_load import (
    ConfigError,
    read_config_text,
    read_yaml_mapping,
    validation_problems,
)
from fedseg.evaluate.stats import Alternative


class Strict(NoBoolNumbers):
    model_config = ConfigDict(extra="forbid", frozen=True)


AS_WRITTEN = {"as_written": True}  # the validation context of a bench file as a person wrote it (load_bench)


def as_written(info: ValidationInfo) -> bool:
    """Whether a bench is validated as written (``AS_WRITTEN``): then a field given that no run would use, or a run
    key the bench overwrites, is refused. A recorded bench holds every field (``model_dump``), so it cannot tell a
    field given from a default, and keeps what an older fedseg accepted."""
    return bool(info.context and info.context.get("as_written"))


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

    @model_validator(mode="after")
    def _used(self, info: ValidationInfo) -> SplitSpec:
        if as_written(info) and self.mode != "kfold" and "folds" in self.model_fields_set:
            raise ValueError(
                f"folds applies only to mode: kfold (mode: {self.mode} is one split, by the base configuration's "
                "data.split.ratios); add mode: kfold or remove folds"
            )
        return self


def seed_list(cls: type, value: Any) -> Any:
    """A ``seeds`` field's input: ``0,1,2`` (YAML reads a string) is [0, 1, 2]; a bare number (``3`` or ``"3"``) is
    refused, being seed 3 or 3 seeds; anything else but a list of integers (a mapping, ``[0, 1.5]``) is refused
    saying what to write."""
    if isinstance(value, bool) or (isinstance(value, (list, tuple)) and any(isinstance(s, bool) for s in value)):
        return value  # refused by NoBoolNumbers, which says so
    if value is None and cls is not BenchSpec:
        return value  # tune.seeds: null (as a bench records it) is the bench's first seed
    if isinstance(value, int) or (isinstance(value, str) and value.strip().isdigit()):
        raise ValueError(f"give a list: [{value}] for seed {value} alone, [0, 1, 2] for three seeds")
    if isinstance(value, str):
        try:
            return [int(seed) for seed in value.split(",")]
        except ValueError:
            raise ValueError(f"give a list of integers such as [0, 1, 2], got {value!r}") from None
    if not isinstance(value, (list, tuple)) or not all(map(_integer, value)):
        shown = yaml.safe_dump(list(value) if isinstance(value, tuple) else value, default_flow_style=True)
        got = "nothing" if value is None else shown.strip().removesuffix("\n...")  # as the YAML file wrote it
        raise ValueError(f"give a list of integers such as [0, 1, 2], got {got}")
    return value


def _integer(value: Any) -> bool:
    """Whether a seed list's item reads as an integer (``2``, ``2.0``, ``"2"``), as the field's type takes it."""
    if isinstance(value, float):
        return value.is_integer()
    if isinstance(value, str):
        try:
            int(value)
        except ValueError:
            return False
    return isinstance(value, (int, float, str))


class TuneSpec(Strict):
    """Where grids are searched: these folds and seeds (None = the first fold / the first seed; FeTS: folds 1-4).

    A tuning seed among the bench's ``seeds`` makes its selected run that seed's final run (no run twice), whose
    test score is then the best of the grid on validation: run-to-run luck that lifts validation lifts test too,
    so that seed is optimistic, and more so for a larger grid. Tuning seeds outside ``seeds`` (``seeds: [0, 1, 2]``,
    ``tune: {seeds: [100]}``) keep every final run out of the selection, at one more run per method and cell.

    One tuning (``folds``) selects one setting for every fold; in a k-fold bench the tuning folds' validation cases
    are test cases of the other folds, whose test scores are then not fully independent of the tuning.
    ``per_fold`` (nested tuning) searches the grids in every fold instead, at the tuning seeds, and each fold's
    final runs take the setting selected on its own validation cases: k times the tuning runs, and the folds may
    take different settings. A leave-one-out federation's folds are its held-out sites: with ``per_fold`` it tunes
    at every held-out site, on the validation cases of the sites it trains on (without it: at its first site)."""

    folds: tuple[int, ...] | None = None
    seeds: tuple[int, ...] | None = None
    per_fold: bool = Field(
        default=False,
        description="nested tuning: every grid is searched in every fold (at the tuning seeds) and each fold's final "
        "runs take the setting selected on that fold's own validation cases, which never include its test cases "
        "(a leave-one-out federation: at every held-out site); the settings may differ between folds, at k times "
        "the tuning runs. Recorded only when true, so a bench without it records exactly as before",
        exclude_if=lambda per_fold: not per_fold,
    )

    _seed_list = field_validator("seeds", mode="before")(seed_list)

    @model_validator(mode="after")
    def _nested(self) -> TuneSpec:
        if self.per_fold and self.folds is not None:
            raise ValueError(
                "per_fold and folds: per_fold tunes in every fold, each for itself; folds names the folds of one "
                "tuning shared by every fold: give one of them"
            )
        return self


class BudgetSpec(Strict):
    """Equal budgets (FeTS Sec. 4.4.7): ``rounds`` = every method trains ``rounds`` rounds; ``sgd_steps`` /
    ``simulated_time`` = every method gets the total local SGD steps (Eq. 34) / simulated training time (Eq. 36-38)
    of ``rounds`` rounds of ``reference`` (with its base options; measured by running it), and may train up to
    ``max_factor`` x ``rounds`` rounds to spend it."""

    rule: Literal["rounds", "sgd_steps", "simulated_time"] = "rounds"
    rounds: int = Field(default=30, ge=1)
    reference: str = "fedavg"
    max_factor: float = Field(default=3.0, ge=1.0)

    @model_validator(mode="after")
    def _used(self, info: ValidationInfo) -> BudgetSpec:
        unused = [k for k in ("reference", "max_factor") if k in self.model_fields_set]
        if as_written(info) and self.rule == "rounds" and unused:
            raise ValueError(
                f"{' and '.join(unused)}: used only by rule: sgd_steps or simulated_time (rule: rounds trains every "
                "method budget.rounds rounds, with no reference run)"
            )
        return self


class StopSpec(Strict):
    """``fl.stop``'s plateau rule for every run: ``patience``, ``min_delta`` and ``min_rounds`` (no stop before)."""

    patience: int | None = Field(default=None, ge=1)
    min_delta: float = Field(default=0.001, ge=0)
    min_rounds: int = Field(default=0, ge=0)

    @model_validator(mode="after")
    def _used(self, info: ValidationInfo) -> StopSpec:
        if as_written(info) and self.patience is None and "min_rounds" in self.model_fields_set:
            raise ValueError("min_rounds applies only with patience (it delays the plateau rule, off without one)")
        return self


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

    @model_validator(mode="before")
    @classmethod
    def _folder_names(cls, data: Any) -> Any:
        """A federation or method name that cannot name its runs' folder, refused in one line naming the entry; a
        path given for a federation says how a bench gives a federation folder."""
        for what in ("federations", "methods") if isinstance(data, dict) else ():
            items = data.get(what)
            for i, item in enumerate(items if isinstance(items, list) else []):
                name = item.get("name") if isinstance(item, dict) else item
                if not isinstance(name, str) or _folder_name_ok(name):
                    continue
                if what == "federations" and isinstance(item, str):
                    called = Path(name).name if _folder_name_ok(Path(name).name) else "my-federation"
                    raise ValueError(
                        f"federations[{i}]: {name!r} is a path, not a federation name; give a federation folder "
                        f"as {{name: {called}, set: [data.source=folder, data.root={name}]}}"
                    )
                shown = f"{what}[{i}]" if isinstance(item, str) else f"{what}[{i}].name"
                raise ValueError(
                    f"{shown}: {name!r} cannot name a folder (it names the {what[:-1]}'s runs' folder: no '/', "
                    "'\\' or leading '.'); choose another name"
                )
        return data

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
            twice = next((name for name in names if names.count(name) > 1), None)
            if twice is not None:
                first, second = [i for i, name in enumerate(names) if name == twice][:2]
                raise ValueError(
                    f"{what}[{second}]: the name {twice!r} is taken by {what}[{first}]; give each its own name (its "
                    "tables and folders are named by it)"
                )
        if not self.seeds or len(set(self.seeds)) != len(self.seeds):
            raise ValueError(f"seeds: give distinct seeds, got {list(self.seeds)}")
        for what, seeds in (("seeds", self.seeds), ("tune.seeds", self.tune.seeds or ())):
            if not all(0 <= seed <= SEED_MAX for seed in seeds):  # else the runs' seed refuses it, naming a run
                raise ValueError(f"{what}: give seeds from 0 to {SEED_MAX}, got {list(seeds)}")
        for fold in self.tune.folds or ():
            if fold not in self.folds:
                raise ValueError(f"tune.folds: {fold} is not a fold of this bench {list(self.folds)}")
        if self.tune.per_fold and self.split.mode != "kfold" and not any(f.leave_one_out for f in self.federations):
            raise ValueError(
                f"tune.per_fold: split mode: {self.split.mode} is one split (fold 0), which the tuning uses already, "
                "and no federation is leave_one_out; use split: {mode: kfold} or remove per_fold"
            )
        if self.tune.seeds is not None and len(set(self.tune.seeds)) != len(self.tune.seeds):
            raise ValueError(f"tune.seeds: give distinct seeds, got {list(self.tune.seeds)}")
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
            self._misspelt_algorithm()  # ``methods: [fedavgg]``: the entry is wrong, not the reference
            if "reference" not in self.model_fields_set:  # the default: the file never named it
                raise ValueError(
                    f"reference: not given, so {self.reference!r}, which is not among the methods "
                    f"{self.method_names}; give the method the paired tests compare against (reference: NAME)"
                )
            raise ValueError(f"reference: {self.reference!r} is not among the methods {self.method_names}")
        for pair in self.comparisons:
            unknown = [name for name in pair if name not in self.method_names]
            if unknown or pair[0] == pair[1]:
                raise ValueError(
                    f"comparisons: {list(pair)} must name two different methods of the bench {self.method_names}"
                )
        return self

    def _misspelt_algorithm(self) -> None:
        """A ValueError naming the first method entry whose name, its algorithm, is no algorithm
        (``methods[0]: unknown algorithm 'fedavgg'; did you mean 'fedavg'?``), as ``fedseg.bench.plan.check_methods``
        words it once the file is read; nothing where every one is known."""
        from fedseg.algorithms import get_algorithm
        from fedseg.config_load import error_text

        for i, m in enumerate(self.methods):
            if not m.algorithms:
                try:
                    get_algorithm(m.name)
                except KeyError as e:
                    raise ValueError(f"methods[{i}]: {error_text(e)}") from None

    @model_validator(mode="after")
    def _written(self, info: ValidationInfo) -> BenchSpec:
        """A bench file: no ``set:`` or grid key the bench sets itself, nothing given that no run uses, a known
        ``budget.reference`` (all problems in one line)."""
        if not as_written(info):
            return self
        problems = self._overwritten()
        if self.tune.model_fields_set and not any(m.grid for m in self.methods):
            problems.append("tune: unused, no method has a grid to tune")
        elif self.tune.folds is not None and all(f.leave_one_out for f in self.federations):
            problems.append("tune.folds: unused, a leave-one-out federation tunes on its first site (fold 0)")
        if self.budget.rule != "rounds" and self.budget.reference not in self.method_names:
            from fedseg.algorithms import get_algorithm

            try:
                get_algorithm(self.budget.reference)
            except KeyError as e:
                problems.append(f"budget.reference: {e.args[0]} (give a method of the bench or an algorithm)")
        if problems:
            raise ValueError("; ".join(problems))
        return self

    def run_keys(self, federation: FederationSpec | None = None) -> dict[str, str]:
        """The run configuration keys the bench sets in every run of ``federation`` (None: of any), after every
        ``set:`` and grid value (``fedseg.bench.plan.make_run``, and the budget caps), each with the bench field that
        sets it: a ``set:`` or grid giving one would be overwritten."""
        keys = dict(RUN_KEYS)
        if self.data_seed == "per-seed":
            keys["data.seed"] = "data_seed: fixed to give it (per-seed makes it each run's seed)"
        if federation.leave_one_out if federation else any(f.leave_one_out for f in self.federations):
            keys["data.repartition.holdout"] = (
                "it in a federation without leave_one_out (one holds out each site in turn)"
            )
        if self.budget.rule != "rounds":
            for key in BUDGET_KEYS:
                keys[key] = f"budget (rule: {self.budget.rule} caps every run from budget.reference)"
        return keys

    def _overwritten(self) -> list[str]:
        """``WHERE: KEY: ...`` for each key of a ``set:`` or grid that the bench sets itself (``run_keys``) or that
        its split mode does not use, and for a ``data.source`` of the bench's ``set:`` that a federation named by a
        built-in federation overwrites (``fedseg.bench.plan.federation_overrides``)."""
        places: list[tuple[str, tuple[str, ...], FederationSpec | None]] = [("set", self.set, None)]
        places += [(f"federation {f.name}: set", f.set, f) for f in self.federations]  # None: in every federation
        for m in self.methods:
            grid = tuple(f"{key}={json.dumps(v, default=str)}" for key, values in m.grid.items() for v in values)
            places += [(f"method {m.name}: set", m.set, None), (f"method {m.name}: grid", grid, None)]
        unused = SPLIT_UNUSED[self.split.mode]
        problems = []
        for where, assignments, federation in places:
            keys = self.run_keys(federation)
            for key in dict.fromkeys(k for a in assignments for k in assigned_keys(a)):
                if key in keys:
                    problems.append(
                        f"{where}: {key}: the bench sets it in every run, overwriting this; use {keys[key]}"
                    )
                elif key in unused:
                    problems.append(f"{where}: {key}: {unused[key]}")
        if "data.source" in {k for a in self.set for k in assigned_keys(a)}:  # a built-in's name sets it after
            from fedseg.data.sources import source_names

            named = [f.name for f in self.federations if f.name in source_names()]
            if named:
                problems.append(
                    f"set: data.source: federation {named[0]} sets it (its name is a built-in federation), "
                    "overwriting this; use the set: of the federations it is for"
                )
        return problems

    @property
    def method_names(self) -> list[str]:
        return [m.name for m in self.methods]

    @property
    def folds(self) -> tuple[int, ...]:
        """The folds run as test: every k-fold fold, or the one ratio split (0)."""
        return tuple(range(self.split.folds)) if self.split.mode == "kfold" else (0,)

    @property
    def tune_folds(self) -> tuple[int, ...]:
        """The folds whose validation cases tune the grids: ``tune.folds`` (default the first), every fold with
        ``tune.per_fold`` (each for itself)."""
        if self.tune.per_fold:
            return self.folds
        return self.tune.folds if self.tune.folds is not None else self.folds[:1]

    @property
    def tune_seeds(self) -> tuple[int, ...]:
        return self.tune.seeds if self.tune.seeds is not None else self.seeds[:1]

    def method(self, name: str) -> MethodSpec:
        return next(m for m in self.methods if m.name == name)


RUN_KEYS = {  # run configuration key -> the bench field that sets it in every run (see BenchSpec.run_keys)
    "seed": "seeds",
    "algorithms": "a method's algorithms (default: its name)",
    "fl.rounds": "budget.rounds",
    "fl.stop.patience": "stop.patience",
    "fl.stop.min_delta": "stop.min_delta",
    "fl.stop.min_rounds": "stop.min_rounds",
    "data.split.mode": "split.mode",
    "data.split.folds": "split.folds",
    "data.split.fold": "split (mode: kfold tests every fold)",
}
BUDGET_KEYS = ("fl.stop.sgd_steps", "fl.stop.simulated_hours")  # the caps of a budget rule other than rounds
SPLIT_UNUSED = {  # split mode -> run configuration keys of data.split no run of that mode uses, and why
    "ratio": {"data.split.train_fraction": "used only by split mode: kfold (mode: ratio splits by data.split.ratios)"},
    "kfold": {"data.split.ratios": "used only by split mode: ratio (kfold splits by data.split.train_fraction)"},
}


def assigned_keys(assignment: str) -> Iterator[str]:
    """The run configuration keys a ``key=value`` override sets: ``key``, and every key of a mapping value
    (``fl.stop={patience: 3}`` sets ``fl.stop.patience``); a value that is not YAML: its key only (the run's
    configuration reports it)."""
    key, _, raw = assignment.partition("=")
    yield key.strip()
    try:
        value = yaml.safe_load(raw)
    except yaml.YAMLError:
        return
    stack = [(key.strip(), value)]
    while stack:
        prefix, value = stack.pop()
        for sub, inner in value.items() if isinstance(value, dict) else ():
            yield f"{prefix}.{sub}"
            stack.append((f"{prefix}.{sub}", inner))


def _folder_name_ok(name: str) -> bool:
    return bool(name) and not any(ch in name for ch in "/\\") and not name.startswith(".")


def _folder_name(name: str, what: str) -> str:
    if not _folder_name_ok(name):
        raise ValueError(f"{what}: {name!r} cannot name a folder (no '/', '\\', leading '.')")
    return name


def read_bench(path: str | Path) -> tuple[BenchSpec, Path]:
    """The bench file at ``path`` and the folder relative paths in it are read from; a ConfigError naming the file
    and every bad key otherwise, a bad value worded plainly (``fedseg.config_load.validation_problems``: ``split.folds
    must be at least 2, got 1``). Its runs' configurations are not checked here: ``fedseg.bench.plan.load_bench``
    reads a bench file and checks them too."""
    path = Path(path)
    data = read_yaml_mapping(read_config_text(path, "bench"), str(path))
    try:
        return BenchSpec.model_validate(data, context=AS_WRITTEN), path.resolve().parent
    except ValidationError as e:
        problems = validation_problems(e, model=BenchSpec, where=str(path))
        raise ConfigError(_method_names(problems, data)) from None


def _method_names(text: str, data: dict) -> str:
    """``methods[1].sett`` (``methods[1] must ...``) in a problem's text as ``methods[1] (fedprox).sett``: the
    entry's method named (not in ``methods[1]: 'a/b' cannot name a folder``, which names it)."""
    methods = data.get("methods")
    entries = methods if isinstance(methods, list) else []
    names = [m if isinstance(m, str) else m.get("name") if isinstance(m, dict) else None for m in entries]

    def named(m: re.Match[str]) -> str:
        i = int(m[1])
        return m[0] + (f" ({names[i]})" if i < len(names) and isinstance(names[i], str) else "")

    return re.sub(r"\bmethods\[(\d+)\](?=\.|\s(?!\())", named, text)  # not in a refusal of the name itself
