"""A bench expanded into runs: each an ordinary ``fedseg run`` directory under ``OUT/runs/``.

A *cell* is (federation, fold, seed). Three kinds of runs, in three phases (each waits for the one before):

1. **budget references** (``budget.rule`` ``sgd_steps`` | ``simulated_time``): per cell, ``budget.reference``
   with its base options for ``budget.rounds`` rounds; its cost per round x ``budget.rounds`` is the cell's budget;
2. **tuning runs**: per method with a grid, every setting in every tuning cell (``tune.folds`` x ``tune.seeds``;
   ``tune.per_fold``: every fold x ``tune.seeds``); a method with ``settings_from`` is tuned after the method it
   names, at that method's selected setting (``tune.per_fold``: that fold's);
3. **final runs**: every method in every cell, with its setting selected on validation (``fedseg.bench.select``;
   ``tune.per_fold``: the one selected in the run's fold, :func:`selection_key`).

A leave-one-out federation's folds are its sites: fold ``k`` trains without site ``k`` (``data.repartition.holdout``)
and scores every trained model on all of that site's cases (``unseen.json`` in the run's folder).

A run's folder is ``OUT/runs/<federation>/fold<f>/seed<s>/<method>/<setting>`` (``holdout-<site>`` in place of
``fold<f>`` for a leave-one-out federation; ``default`` = no grid value; a ``settings_from`` method's folder names
the inherited values first, so a changed inheritance is a different run), so a
final run whose setting and cell a tuning run already had is that run, and the reference method's budget run is
its final run when it has no grid.
"""

from __future__ import annotations

import itertools
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from fedseg.bench.spec import BenchSpec, FederationSpec, MethodSpec, read_bench
from fedseg.config import RunConfig
from fedseg.config_load import ConfigError, error_text, load_config

if TYPE_CHECKING:
    from fedseg.data.federation import Federation

DEFAULT = "default"  # the setting label of a run without grid values
Setting = tuple[tuple[str, Any], ...]  # ((config key, value), ...) in the grid's key order


@dataclass(frozen=True)
class BenchRun:
    """One run of a bench; ``caps``: the budget overrides computed from the references (phase 2 and 3)."""

    federation: str
    fold: int
    seed: int
    method: str
    setting: Setting
    overrides: tuple[str, ...]
    caps: tuple[str, ...] = ()
    holdout: str | None = None  # a leave-one-out federation's unseen site (the fold is its index)
    inherited: Setting = ()  # settings_from: the other method's selected setting, applied before this one's

    @property
    def setting_label(self) -> str:
        return setting_label(self.inherited + self.setting)

    @property
    def cell(self) -> tuple[str, int, int]:
        return self.federation, self.fold, self.seed

    @property
    def label(self) -> str:
        fold = f"holdout-{self.holdout}" if self.holdout is not None else f"fold{self.fold}"
        return f"{self.federation}/{fold}/seed{self.seed}/{self.method}/{self.setting_label}"

    def dir(self, out: Path) -> Path:
        return Path(out) / "runs" / self.label


def setting_label(setting: Setting) -> str:
    """``default``, or ``key=value,key=value`` as a folder name (``fedseg.studies.run_label``)."""
    if not setting:
        return DEFAULT
    from fedseg.studies import run_label  # here: fedseg.studies imports torch, the bench file is read without it

    return ",".join(run_label(key.split(".")[-1], _yaml(value)) for key, value in setting)


def _yaml(value: Any) -> str:
    return yaml.safe_dump(value, default_flow_style=True).strip().removesuffix("...").strip()


def settings(method: MethodSpec) -> list[Setting]:
    """Every combination of the method's grid values (the first key varies slowest); ``[()]`` without a grid."""
    keys = list(method.grid)
    return [tuple(zip(keys, values)) for values in itertools.product(*(method.grid[k] for k in keys))]


def federation_overrides(fed: FederationSpec, where: str = "federations") -> list[str]:
    """A federation's overrides; a name that is a built-in (or registered) federation sets ``data.source``.
    ``where``: the federation's place, for the error of a name that is none and gives no data."""
    import difflib

    from fedseg.data.sources import source_names

    named = [f"data.source={fed.name}"] if fed.name in source_names() else []
    if not named and not fed.set:
        close = difflib.get_close_matches(fed.name, source_names(), n=1)
        raise ConfigError(
            f"{where}: {fed.name!r} is not a built-in federation ({', '.join(source_names())}); "
            + (f"did you mean {close[0]!r}? Otherwise " if close else "")
            + "give its data with set: [data.source=folder, data.root=PATH, ...]"
        )
    return [*named, *fed.set]


def phased(method: MethodSpec) -> bool:
    """Whether one of the method's algorithms trains in phases whose first rounds cannot be selected (FedSM-extra's
    model phase, ``run_rounds``): a budget could stop it only after them, so under a budget it trains
    ``budget.rounds`` model rounds (and its own phases on top) rather than up to ``max_factor`` times as many."""
    from fedseg.algorithms import get_algorithm

    try:
        return any(get_algorithm(name).options.PHASED for name in method.trained)
    except KeyError:  # an unknown name: check_plan reports it
        return False


def is_budget_reference(bench: BenchSpec, method: MethodSpec, setting: Setting) -> bool:
    return bench.budget.rule != "rounds" and method.name == bench.budget.reference and not setting


Holdouts = dict[str, list[str]]  # leave-one-out federation -> its sites: the folds of that federation
SelectionKey = tuple[str, str] | tuple[str, str, int]  # (federation, method) or, tune.per_fold, (..., fold)
Selected = dict[SelectionKey, Setting]  # the settings selected on validation (fedseg.bench.select)


def selection_key(bench: BenchSpec, federation: str, method: str, fold: int) -> SelectionKey:
    """Where the setting selected for ``method``'s runs of ``federation``'s fold ``fold`` is kept: (federation,
    method), one for every fold; with ``tune.per_fold`` (federation, method, fold), each fold its own."""
    return (federation, method, fold) if bench.tune.per_fold else (federation, method)


def make_run(
    bench: BenchSpec,
    fed: FederationSpec,
    method: MethodSpec,
    fold: int,
    seed: int,
    setting: Setting,
    holdouts: Holdouts | None = None,
    inherited: Setting = (),
) -> BenchRun:
    """The run of ``method`` in cell (``fed``, ``fold``, ``seed``); fold ``k`` of a leave-one-out federation holds out
    its ``k``-th site (``holdouts``) and splits the other sites by the bench's split (k-fold: fold 0).

    Its overrides, in the order they apply: the bench's, the federation's, the split (and the held-out site), the
    seed (and ``data.seed`` with ``data_seed: per-seed``), the method's algorithms and fixed options, the
    ``inherited`` setting of its ``settings_from`` method, its grid values, the stop rule (for tuning runs too: no
    plateau stop before ``stop.min_rounds``) and the round budget. Every key it sets after the ``set:`` lists and
    grid values is one of ``bench.run_keys(fed)``, which a bench file may not give in them (it would be
    overwritten)."""
    holdout = (holdouts or {})[fed.name][fold] if fed.leave_one_out else None
    split = [f"data.split.mode={bench.split.mode}"]
    if bench.split.mode == "kfold":
        split += [f"data.split.folds={bench.split.folds}", f"data.split.fold={0 if holdout else fold}"]
    if holdout is not None:
        split.append(f"data.repartition.holdout={_yaml(holdout)}")
    stop = [f"fl.stop.patience={_yaml(bench.stop.patience)}", f"fl.stop.min_delta={bench.stop.min_delta}"]
    if bench.stop.min_rounds:
        stop.append(f"fl.stop.min_rounds={bench.stop.min_rounds}")
    rounds = bench.budget.rounds
    if bench.budget.rule != "rounds" and not is_budget_reference(bench, method, setting) and not phased(method):
        rounds = math.ceil(bench.budget.rounds * bench.budget.max_factor)  # the most; the budget stops it
    overrides = (
        *bench.set,
        *federation_overrides(fed),
        *split,
        f"seed={seed}",
        *([f"data.seed={seed}"] if bench.data_seed == "per-seed" else []),
        f"algorithms=[{','.join(method.trained)}]",
        *method.set,
        *(f"{key}={_yaml(value)}" for key, value in inherited + setting),
        *stop,
        f"fl.rounds={rounds}",
    )
    return BenchRun(fed.name, fold, seed, method.name, setting, overrides, holdout=holdout, inherited=inherited)


def folds_of(bench: BenchSpec, fed: FederationSpec, holdouts: Holdouts | None, tuning: bool = False) -> tuple[int, ...]:
    """The folds of ``fed``: the bench's (``tuning``: its tuning folds), or one per site of a leave-one-out
    federation (``tuning``: the first site; every site with ``tune.per_fold``)."""
    if fed.leave_one_out:
        count = len((holdouts or {}).get(fed.name, []))
        return tuple(range(min(1, count) if tuning and not bench.tune.per_fold else count))
    return bench.tune_folds if tuning else bench.folds


def holdout_sites(bench: BenchSpec, root: Path) -> Holdouts:
    """The sites of every leave-one-out federation (its data loaded once, as its runs load it)."""
    from fedseg.data.repartition import repartition_all
    from fedseg.run import load_federation

    out: Holdouts = {}
    for fed in bench.federations:
        if fed.leave_one_out:
            cfg = run_config(
                bench,
                root,
                make_run(bench, fed.model_copy(update={"leave_one_out": False}), bench.methods[0], 0, 0, ()),
            )
            full = repartition_all(load_federation(cfg), cfg.data.repartition, cfg.data.split, cfg.data.seed)
            out[fed.name] = full.site_names
    return out


def reference_method(bench: BenchSpec) -> MethodSpec:
    """The budget's reference: that method of the bench, or a plain algorithm of that name."""
    name = bench.budget.reference
    return bench.method(name) if name in bench.method_names else MethodSpec(name=name)


def reference_runs(bench: BenchSpec, holdouts: Holdouts | None = None) -> list[BenchRun]:
    """Phase 1: one budget reference per cell, final and tuning (none under ``budget.rule: rounds``)."""
    if bench.budget.rule == "rounds":
        return []
    ref = reference_method(bench)
    final = [
        (f, fold, seed) for f in bench.federations for fold in folds_of(bench, f, holdouts) for seed in bench.seeds
    ]
    tuning = [  # tuning seeds outside the bench's seeds (spec.TuneSpec) need their own budget
        (f, fold, seed)
        for f in bench.federations
        for fold in folds_of(bench, f, holdouts, tuning=True)
        for seed in bench.tune_seeds
        if seed not in bench.seeds
    ]
    return [make_run(bench, f, ref, fold, seed, (), holdouts) for f, fold, seed in final + tuning]


def tuning_runs(bench: BenchSpec, holdouts: Holdouts | None = None, selected: Selected | None = None) -> list[BenchRun]:
    """Phase 2: every setting of every method with a grid, in every tuning cell. Without ``selected``: the methods
    tuned first (no ``settings_from``); with it (:func:`selection_key` -> setting chosen so far): the
    ``settings_from`` methods whose source has a selected setting (``tune.per_fold``: in that fold), each at that
    setting."""
    return [
        make_run(bench, f, m, fold, seed, s, holdouts, inherited)
        for f in bench.federations
        for m in bench.methods
        if m.grid and (m.settings_from is None) == (selected is None)
        for s in settings(m)
        for fold in folds_of(bench, f, holdouts, tuning=True)
        for inherited in _inherited(bench, m, f.name, fold, selected or {})
        for seed in bench.tune_seeds
    ]


def _inherited(bench: BenchSpec, method: MethodSpec, federation: str, fold: int, selected: Selected) -> list[Setting]:
    """``[()]`` for a method without ``settings_from``; ``[its source's selected setting]`` (for fold ``fold``), or
    ``[]`` before that source's tuning has finished (the method cannot run yet)."""
    if method.settings_from is None:
        return [()]
    source = selected.get(selection_key(bench, federation, method.settings_from, fold))
    return [] if source is None else [source]


def final_runs(bench: BenchSpec, selected: Selected, holdouts: Holdouts | None = None) -> list[BenchRun]:
    """Phase 3: every method in every cell; ``selected``: :func:`selection_key` -> setting (methods with a grid;
    one without an entry, whose tuning is not finished, has no final run yet, nor has a method whose
    ``settings_from`` source has none; with ``tune.per_fold``, fold by fold)."""
    return [
        make_run(bench, f, m, fold, seed, selected.get(key, ()), holdouts, inherited)
        for f in bench.federations
        for m in bench.methods
        for fold in folds_of(bench, f, holdouts)
        for key in [selection_key(bench, f.name, m.name, fold)]
        if not m.grid or key in selected
        for inherited in _inherited(bench, m, f.name, fold, selected)
        for seed in bench.seeds
    ]


def run_config(bench: BenchSpec, root: Path, run: BenchRun, file: str | Path | None = None) -> RunConfig:
    """The run's configuration: the bench's base, then the run's overrides and budget caps; a ConfigError otherwise,
    naming the place of the bench file that gave the bad key (``override_places``), after the bench ``file`` where
    it is known, or the run, and saying plainly what is wrong with a bad value
    (``fedseg.config_load.validation_problems``: ``train.lr must be a number, got 'abc'``)."""
    base = bench.base
    config = None if base.config is None else (root / base.config)
    places = override_places(bench, run)
    try:
        overrides = [*run.overrides, *run.caps]
        labels = {a.split("=", 1)[0].strip(): "the bench's" for a in overrides}  # its seed, split, budget
        return load_config(preset=base.preset, file=config, overrides=overrides, labels=labels | places)
    except ConfigError as e:
        text = str(e)
        raise ConfigError(_where(run, file, text.startswith(tuple(places.values()))) + text) from None


def override_places(bench: BenchSpec, run: BenchRun) -> dict[str, str]:
    """The keys of ``run``'s overrides that the bench file gives, each with its place there as an error names it (a
    label ending in ``:``, ``fedseg.config_load``): ``set[0] 'trian.lr=0.01':``, ``federations[1] (mine).set[0]
    '...':``, ``methods[2] (fedprox).set[0] '...':``, ``methods[2] (fedprox).grid 'train.lr: 0.01':`` (a
    ``settings_from`` method's inherited values: its source's grid). A key given in two places: the later one, whose
    value the run takes."""
    places: dict[str, str] = {}

    def add(where: str, assignments: tuple[str, ...]) -> None:
        for i, assignment in enumerate(assignments):
            places[assignment.split("=", 1)[0].strip()] = f"{where}[{i}] {assignment!r}:"

    add("set", bench.set)
    for i, fed in enumerate(bench.federations):
        if fed.name == run.federation:
            add(f"federations[{i}] ({fed.name}).set", fed.set)
    method = bench.method(run.method) if run.method in bench.method_names else None
    if method is not None:
        add(f"{method_place(bench, method.name)}.set", method.set)
    source = method.settings_from if method is not None else None
    for owner, setting in ((source, run.inherited), (run.method, run.setting)):
        for key, value in setting:
            places[key] = f"{method_place(bench, owner)}.grid '{key}: {_yaml(value)}':"
    return places


def method_place(bench: BenchSpec, name: str | None) -> str:
    """``methods[2] (fedprox)``: where the bench file gives method ``name``; ``budget.reference`` for the budget's
    reference algorithm when it is no method of the bench."""
    names = bench.method_names
    return f"methods[{names.index(name)}] ({name})" if name in names else "budget.reference"


def _where(run: BenchRun, file: str | Path | None, placed: bool) -> str:
    """What opens an error of ``run``: the bench ``file`` (where known), and the run unless the error names its
    place in the file (``placed``)."""
    opening = f"{file}: " if file is not None else ""
    return opening if placed and file is not None else f"{opening}bench run {run.label}: "


def check_methods(bench: BenchSpec, run: BenchRun, cfg: RunConfig, file: str | Path | None = None) -> None:
    """Every algorithm of ``run`` (configuration ``cfg``) exists, and every ``methods.<name>`` of ``cfg`` names one,
    with valid options (as the run checks before any work); a ConfigError naming the method's entry in the bench
    file (``methods[1]: unknown algorithm 'fedsmm'; did you mean 'fedsm'?``) or the place that gave the bad option
    (``methods[1] (fedprox).set[0] 'methods.fedprox.muu=0.01': methods.fedprox.muu: unknown key ...``), after the
    bench ``file`` where it is known."""
    from fedseg.algorithms import check_method_names, get_algorithm

    method = bench.method(run.method) if run.method in bench.method_names else None
    for i, name in enumerate(cfg.algorithms):
        try:
            get_algorithm(name)
        except KeyError as e:
            if method is None:  # the budget's reference (checked with the bench file, spec.BenchSpec._written)
                place = "budget.reference"
            elif method.algorithms:
                place = f"{method_place(bench, method.name)}.algorithms[{i}]"
            else:  # the method's name is its algorithm
                place = f"methods[{bench.method_names.index(method.name)}]"
            text = error_text(e)
            if method is not None and not method.algorithms and "did you mean" not in text:  # a name for a label
                text += f"; a method of another name gives its algorithms: {{name: {name}, algorithms: [fedavg]}}"
            raise ConfigError(f"{_where(run, file, True)}{place}: {text}") from None
    try:
        for name in cfg.algorithms:  # a bad option's value is worded plainly (``methods.fedprox.mu must be ...``)
            get_algorithm(name).parse_options(cfg.methods.get(name))
        check_method_names(cfg.methods)  # a misspelt methods.<name> would be ignored: the run refuses it too
    except ValueError as e:  # a ConfigError too: ``methods.KEY...: what`` or ``methods.KEY must ...``: the key a place
        text = error_text(e)  # of the file may give
        key = re.split(r"[:\s]", text, maxsplit=1)[0]
        places = override_places(bench, run)
        given = [o for o in places if key == o or key.startswith(o + ".") or o.startswith(key + ".")]
        text = f"{places[given[0]]} {text}" if given else text
        raise ConfigError(_where(run, file, bool(given)) + text) from None
    if method is not None:
        check_own_options(bench, method, run, cfg, file)


def check_own_options(
    bench: BenchSpec, method: MethodSpec, run: BenchRun, cfg: RunConfig, file: str | Path | None
) -> None:
    """A ``methods.<algorithm>.*`` key of ``method``'s own ``set:`` or grid names an algorithm the method trains: any
    other algorithm's options are read by no run of it, so a grid over one would tune nothing (its settings identical
    runs, a setting the tables print) and a ``set:`` would change nothing; a ConfigError naming the entry."""
    place = method_place(bench, method.name)
    given = [(f"{place}.set[{i}] {a!r}:", a.split("=", 1)[0].strip()) for i, a in enumerate(method.set)]
    given += [(f"{place}.grid '{key}: {_yaml(value)}':", key) for key, value in run.setting]
    for where, key in given:
        parts = key.split(".")
        if parts[0] == "methods" and len(parts) > 1 and parts[1] not in cfg.algorithms:
            raise ConfigError(
                f"{_where(run, file, True)}{where} {parts[1]} is not an algorithm this method trains "
                f"({list(cfg.algorithms)}): its runs would ignore the option; give the options of its own algorithms"
            )


def check_tested_once(splits: dict, fold: int, tested_in: dict[tuple[str, str], int], where: str) -> None:
    """Record fold ``fold``'s test cases (``splits``: site -> case -> split) in ``tested_in``; a ``ConfigError``
    naming the site, case and folds where a case was already tested in another fold."""
    for site, assigned in splits.items():
        tests = [case for case, split in assigned.items() if split == "test"]
        twice = [case for case in tests if tested_in.setdefault((site, case), fold) != fold]
        if twice:
            raise ConfigError(
                f"{where}: site {site!r} tests {len(twice)} case(s) also tested in fold {tested_in[(site, twice[0])]} "
                f"(e.g. {twice[0]!r}): its splits.csv fixes them to test, so every fold tests them and the tables "
                "would average their folds' scores into one case; remove their test rows from splits.csv (k-fold "
                "gives every case one test fold) or run one fold"
            )


def check_data(bench: BenchSpec, root: Path, holdouts: Holdouts, out: Path | None = None) -> None:
    """Every federation of the bench loads, repartitions and splits with a training, a validation and a test case at
    every site in every fold (a FederationError or ConfigError naming the federation, fold and site), before any
    work: a bad site name or too many folds for a small site would otherwise fail after hours of training. A case
    tested in two of the bench's folds (fixed to ``test`` by its site's ``splits.csv``, e.g. an nnU-Net import's
    ``imagesTs``) is refused: federated cross-validation tests each case once, and the tables, keyed by case,
    would average its folds' scores into one. With ``data_seed: per-seed`` every seed's data (the final runs' and
    the tuning runs') is checked: each splits anew.
    ``out``: the bench's folder, refused inside a federation folder (its runs' files would join the sites' data)."""
    from fedseg.data.federation import FederationError
    from fedseg.data.repartition import repartition
    from fedseg.data.splits import check_splits, make_splits
    from fedseg.run import load_federation
    from fedseg.run.preflight import check_out_outside
    from fedseg.run.preparation import folder_root

    data_seeds = dict.fromkeys([*bench.seeds, *bench.tune_seeds]) if bench.data_seed == "per-seed" else bench.seeds[:1]
    for fed, seed in itertools.product(bench.federations, data_seeds):
        loaded = None
        tested_in: dict[tuple[str, str], int] = {}  # (site, case) -> the first fold testing it
        for fold in folds_of(bench, fed, holdouts):
            run = make_run(bench, fed, bench.methods[0], fold, seed, (), holdouts)
            cfg = run_config(bench, root, run)
            if out is not None:
                check_out_outside(out, folder_root(cfg))
            where = f"bench federation {fed.name!r}, " + (f"holdout {run.holdout}" if run.holdout else f"fold {fold}")
            where += f", seed {seed}" if bench.data_seed == "per-seed" else ""
            try:
                loaded = loaded or load_federation(cfg)
                trained = repartition(loaded, cfg.data.repartition, cfg.data.split, cfg.data.seed)
                splits = make_splits(trained, cfg.data.split, cfg.data.seed)
            except (FederationError, ValueError) as e:
                raise ConfigError(f"{where}: {e}") from None
            for site, assigned in splits.items():  # first: what a bench can change (its folds, its ratios)
                empty = [name for name in ("val", "test") if name not in assigned.values()]
                if empty:
                    raise ConfigError(
                        f"{where}: site {site!r} gets no {' and no '.join(empty)} case ({len(assigned)} cases); use "
                        "fewer folds or other split ratios"
                    )
            try:
                check_splits(trained, splits)
            except FederationError as e:
                raise ConfigError(f"{where}: {e}") from None
            if not fed.leave_one_out:
                check_tested_once(splits, fold, tested_in, where)
        if loaded is not None:
            check_method_tasks(bench, root, fed, seed, loaded, holdouts)


def setting_pairs(bench: BenchSpec, method: MethodSpec) -> list[tuple[Setting, Setting]]:
    """Every (inherited, own) pair of settings a run of ``method`` can have: each setting of its ``settings_from``
    method's grid (``()`` without one) with each of its own grid's."""
    source = [()] if method.settings_from is None else settings(bench.method(method.settings_from))
    return list(itertools.product(source, settings(method)))


def check_method_tasks(
    bench: BenchSpec, root: Path, fed: FederationSpec, seed: int, loaded: Federation, holdouts: Holdouts
) -> None:
    """Every method's options fit its network on federation ``fed`` (``loaded``), at each of its grid settings (with
    each setting a ``settings_from`` method may inherit, as :func:`check_plan` combines them): what
    a run checks once its data is prepared (``MethodOptions.check_task``: FedBN on a network without normalization
    weights, FedPer's ``private_layers`` beyond the network's layers), checked before any run of the bench trains;
    a ConfigError naming the federation and the method's entry. A planned network (``model.name: planned``) is
    planned by its run, and checked there."""
    from fedseg.algorithms import get_algorithm
    from fedseg.engine.context import Task

    fold = folds_of(bench, fed, holdouts)[0]
    for method in bench.methods:
        for inherited, setting in setting_pairs(bench, method):
            run = make_run(bench, fed, method, fold, seed, setting, holdouts, inherited=inherited)
            cfg = run_config(bench, root, run)
            if cfg.model.name == "planned":
                continue
            task = Task.of(cfg.model_copy(update={"device": "cpu"}), loaded)  # its structure, on any machine
            for name in cfg.algorithms:
                try:
                    get_algorithm(name).check_task(task, cfg.methods.get(name))
                except ValueError as e:
                    where = f"bench federation {fed.name!r}: {method_place(bench, method.name)}"
                    values = inherited + setting
                    raise ConfigError(f"{where}{' ' + setting_label(values) if values else ''}: {e}") from None


def load_bench(path: str | Path) -> tuple[BenchSpec, Path]:
    """The bench file at ``path`` (``fedseg.bench.spec.read_bench``: a ConfigError naming the file and every bad
    key) with every run's configuration checked (:func:`check_plan`: a bad run option or algorithm named by its
    place in the file), and the folder relative paths in it are read from."""
    bench, root = read_bench(path)
    check_plan(bench, root, Path(path))
    return bench, root


def check_plan(bench: BenchSpec, root: Path, file: str | Path | None = None) -> None:
    """Every run the bench can make validates (each grid setting in the first cell), and every method's
    algorithms and options exist, before any work; a ConfigError naming the bench ``file`` (where given) and the
    place in it of what is wrong (:func:`run_config`, :func:`check_methods`)."""
    fold, seed = bench.folds[0], bench.seeds[0]
    trained: set[str] = set()  # every algorithm some run of the bench trains
    for i, fed in enumerate(bench.federations):
        federation_overrides(fed, f"{file}: federations[{i}]" if file is not None else f"federations[{i}]")
        plain = fed.model_copy(update={"leave_one_out": False})
        for method in [*bench.methods, reference_method(bench)]:
            for inherited, setting in setting_pairs(bench, method):
                run = make_run(bench, plain, method, fold, seed, setting, inherited=inherited)
                cfg = run_config(bench, root, run, file)
                check_methods(bench, run, cfg, file)
                trained.update(cfg.algorithms)
    shared = [
        ("set", bench.set),
        *((f"federations[{i}] ({f.name}).set", f.set) for i, f in enumerate(bench.federations)),
    ]
    for where, assignments in shared:
        for j, assignment in enumerate(assignments):
            parts = assignment.split("=", 1)[0].strip().split(".")
            if parts[0] == "methods" and len(parts) > 1 and parts[1] not in trained:
                raise ConfigError(
                    f"{f'{file}: ' if file is not None else ''}{where}[{j}] {assignment!r}: no method of the bench "
                    f"trains {parts[1]} ({sorted(trained)}): no run would read the option"
                )
