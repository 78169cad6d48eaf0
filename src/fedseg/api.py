"""The Python API, for notebooks and scripts: build a config, run it, read the results.

    import fedseg

    cfg = fedseg.load_config(preset="demo", overrides=["fl.rounds=2"])   # or a dict, or a RunConfig
    results = fedseg.Experiment(cfg, "runs/demo").run()                 # = fedseg run --preset demo ...
    results.dice()              # {"centralized": 0.52, "local": 0.32, "fedavg": 0.41}: test Dice, client avg
    results.cases(scored=True)  # the per-case rows those scores average (list of dicts; .dataframe() with pandas)
    results.report()            # re-render report.html
    fedseg.Results.load("runs/demo")                                     # a finished run, later

``Experiment.run`` does what ``fedseg run`` does (the same functions): the checks made before any work
(device, output folder, options, data, a resume's recorded configuration), every algorithm trained and
tested, the run's files and ``report.html``. Errors are raised (``ConfigError``, ``FederationError``,
``ValueError``, ``FileExistsError``...), not printed; every configuration mistake is a ``ValueError`` (``ConfigError``,
``FederationError``, ``UnknownAlgorithm`` and ``MethodError`` are subclasses). A run leaves the calling process as it
found it: torch's thread count and every global random generator are restored afterwards. Custom methods and
federations: see ``fedseg.algorithms.register_algorithm`` and ``fedseg.data.sources.register_federation``.

Paths: ``Experiment``'s ``out`` and ``Results``' folder are made absolute when the object is created (a later
``os.chdir`` does not move them); a relative ``data.root`` is read relative to the working directory when the run
starts (the configuration records it as given).
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fedseg.atomic_files import json_number
from fedseg.config import RunConfig
from fedseg.config_load import ConfigError, load_config, validate_config
from fedseg.data.federation import Federation
from fedseg.evaluate.metric_info import METRIC_NAMES
from fedseg.presentation.files import REWRITE_HINT, check_summary, read_json

if TYPE_CHECKING:
    from fedseg.run.outputs import RunResults

__all__ = ["Experiment", "Results", "as_config", "render_run_report"]

ConfigLike = RunConfig | Mapping[str, Any] | str | Path


def as_config(config: ConfigLike) -> RunConfig:
    """A validated ``RunConfig`` from a RunConfig, a dict (both validated like a YAML config file: every bad key
    named in a ``ConfigError``) or the path of a YAML config file. A preset: ``load_config(preset=NAME)``.

    A RunConfig is validated again (a copy is returned): pydantic does not check an assignment, so one changed
    after it was built (``cfg.fl.rounds = 0`` in a notebook) would otherwise reach the run unchecked."""
    if isinstance(config, RunConfig):
        # python mode: whatever was assigned reaches the validator as it is (no serializer warning, no conversion)
        return validate_config(config.model_dump(warnings=False), "config")
    if isinstance(config, Mapping):
        data = json.loads(
            json.dumps(config, default=str)
        )  # a deep copy as YAML would give: tuples as lists, paths as str
        data.pop("description", None)
        return validate_config(data, "config")
    if isinstance(config, (str, Path)):
        try:
            return load_config(file=config)
        except ConfigError as e:
            raise _preset_hint(e, config) from None
    raise TypeError(f"config: expected a RunConfig, a dict or a YAML file path, got {type(config).__name__}")


def _preset_hint(error: ConfigError, file: str | Path) -> ConfigError:
    """``error`` with, where ``file`` is a missing file named like a preset (``Experiment("demo", out)``), how to ask
    for the preset instead."""
    from fedseg.config_load import preset_names

    name = str(file)
    if Path(file).exists() or name not in preset_names():
        return error
    return ConfigError(
        f"{error}; {name!r} is a preset: pass load_config(preset={name!r}) (a file path is read as YAML)"
    )


def check_config(config: RunConfig, federation: Federation | None = None) -> None:
    """The checks :meth:`Experiment.run` makes before any work that need no data, no output folder and write
    nothing (the same functions): every algorithm's name and options (``UnknownAlgorithm``, ``ConfigError``), every
    key of ``methods``, the device, secure aggregation (refused in process) and, without ``federation``,
    ``data.source`` (a ``FederationError`` listing the known ones; ``folder`` needs ``data.root``)."""
    from fedseg.algorithms import check_method_names, get_algorithm
    from fedseg.data.sources import source_names, unknown_source
    from fedseg.run.checks import check_secure_aggregation
    from fedseg.run.preflight import check_device
    from fedseg.run.preparation import folder_root

    for name in config.algorithms:
        get_algorithm(name).parse_options(config.methods.get(name))
    check_method_names(config.methods)
    check_device(config.device)
    check_secure_aggregation(config, in_process=True)
    root = folder_root(config)  # a ValueError for data.source folder without data.root (as the run's check)
    if federation is None and root is None and config.data.source not in source_names():
        raise unknown_source(config.data.source)


#: what a resume in a process that lacks a registration needs (the run named a method or a federation of user code)
REGISTER_ALGORITHM_AGAIN = (
    "a method added with register_algorithm exists only in the process that registered it: "
    "register it again before resuming its run"
)


def with_resume_hint(error: Exception, recorded: set[str] | None = None) -> Exception | None:
    """``error`` (an unknown algorithm or ``data.source`` met while resuming) with the hint to register it again in
    this process; None for another error, or for a name the run did not record (``recorded``: the names its
    ``config.yaml`` holds, :func:`recorded_names`; None: any name)."""
    from fedseg.algorithms import UnknownAlgorithm
    from fedseg.data.sources import REGISTER_AGAIN, UnknownSource

    if not isinstance(error, UnknownAlgorithm | UnknownSource) or (recorded is not None and error.name not in recorded):
        return None
    if isinstance(error, UnknownAlgorithm):
        return UnknownAlgorithm(error.name, f"{error}; {REGISTER_ALGORITHM_AGAIN}")
    return UnknownSource(error.name, f"{error}; {REGISTER_AGAIN}")


def resume_error(error: Exception, out: str | Path) -> Exception:
    """``error`` with the hint to register again (:func:`with_resume_hint`) where it is an unknown algorithm or
    ``data.source`` that the run (or bench) in ``out`` recorded, else ``error`` itself: what ``Experiment`` raises
    and ``fedseg run --resume`` / ``fedseg bench --resume`` print. A bench file's error names the algorithm in its
    text (``bench.yaml: methods[1]: unknown algorithm 'fedavgm'; ...``): the same hint where it names a recorded one
    that this process does not know."""
    from fedseg.algorithms import ALGORITHMS

    package = _recorded_package(error, Path(out))
    if package is not None:
        return package
    recorded = recorded_names(Path(out))
    hinted = with_resume_hint(error, recorded)
    if hinted is not None:
        return hinted
    text = str(error)
    if isinstance(error, ValueError) and any(
        f"unknown algorithm {name!r}" in text for name in recorded if name not in ALGORITHMS
    ):
        message = f"{text}; {REGISTER_ALGORITHM_AGAIN}"
        try:
            return type(error)(message)
        except TypeError:  # a class built from other arguments
            return ValueError(message)
    return error


def _recorded_package(error: Exception, out: Path) -> Exception | None:
    """An unknown algorithm that the run in ``out`` trained from an installed method package (its ``.methods.json``,
    ``fedseg.run.method_record``): the error saying to install that package again (it is no registration to
    repeat), or why it failed to load here; None otherwise."""
    from fedseg.algorithms import PLUGIN_FAILURES, UnknownAlgorithm
    from fedseg.run.method_record import read_record

    if not isinstance(error, UnknownAlgorithm):
        return None
    package = ((read_record(out) or {}).get(error.name) or {}).get("plugin")
    if not isinstance(package, dict) or any(error.name in f.names for f in PLUGIN_FAILURES):
        return None  # a failed plugin: the error says why already
    dist, version = package.get("distribution"), package.get("version")
    return UnknownAlgorithm(
        error.name,
        f"{error}; the run trained it from the method package {dist} {version}, which this environment does not "
        f"have: install it (pip install '{dist}=={version}') before resuming its run",
    )


def recorded_names(out: Path) -> set[str]:
    """The algorithms and the ``data.source`` the run in ``out`` recorded (its ``config.yaml``), or the algorithms
    of a bench's methods (its ``bench.json``); empty without a readable one."""
    from fedseg.run.preflight import recorded_config

    if not (out / "config.yaml").is_file() and (out / "bench.json").is_file():
        return _bench_names(out / "bench.json")
    try:
        recorded = recorded_config(out / "config.yaml") or {}
    except ValueError:  # unreadable: the run says so itself
        return set()
    algorithms, data = recorded.get("algorithms"), recorded.get("data")
    names = {a for a in algorithms if isinstance(a, str)} if isinstance(algorithms, list) else set()
    source = data.get("source") if isinstance(data, dict) else None
    return names | ({source} if isinstance(source, str) else set())


def _bench_names(path: Path) -> set[str]:
    """Every algorithm a bench's methods train (``bench.json``: ``methods[].algorithms``, default the name)."""
    try:
        methods = json.loads(path.read_text()).get("methods")
    except (OSError, ValueError, AttributeError):
        return set()
    names: set[str] = set()
    for method in methods if isinstance(methods, list) else []:
        if isinstance(method, dict):
            trained = method.get("algorithms") or [method.get("name")]
            names |= {a for a in trained if isinstance(a, str)} if isinstance(trained, list) else set()
    return names


class Experiment:
    """One run: ``Experiment(config, out).run()`` trains and evaluates every configured algorithm into
    folder ``out`` and returns its :class:`Results`.

    ``config``: a RunConfig (``load_config(preset=..., overrides=[...])``), a dict or a YAML file path.
    ``federation``: an in-memory :class:`~fedseg.data.federation.Federation` replacing ``data.source``
    (give the same one to resume; ``register_federation`` lets the config name it instead).
    ``keep_checkpoints``: keep the trained models in the finished checkpoints too (``--keep-checkpoints``).
    ``progress``: print each round's line (progress bars on a terminal), as ``fedseg run`` does; without it
    the rounds go to ``out/run.log`` only, and the run's one-line notes (cost warnings, a resume of a finished
    run) to stderr.

    The config is validated here, with the checks :meth:`run` makes before any work that need no data
    (:func:`check_config`: algorithm names and options, ``methods`` keys, device, ``data.source``), and again by
    :meth:`run` (``experiment.config`` may be changed in between). Every such mistake is a ``ValueError``
    (``ConfigError``, ``FederationError``, ``UnknownAlgorithm`` are subclasses); where ``out`` holds a run whose
    ``config.yaml`` names the unknown algorithm or ``data.source`` (a resume in a process that did not register it),
    the error says to register it again. ``out`` is made absolute here (:attr:`out`: a later ``os.chdir`` does not
    move the run)."""

    def __init__(
        self,
        config: ConfigLike,
        out: str | Path,
        *,
        federation: Federation | None = None,
        keep_checkpoints: bool = False,
        progress: bool = True,
    ) -> None:
        self.config = as_config(config)
        self.out = Path(out)
        self.federation = federation
        self.keep_checkpoints = keep_checkpoints
        self.progress = progress
        try:
            check_config(self.config, federation)
        except ValueError as e:  # out holds a run of a method or federation registered in the process that ran it?
            hinted = resume_error(e, self.out)
            if hinted is e:
                raise
            raise hinted from None

    @property
    def out(self) -> Path:
        """The run's folder, absolute: a relative one is read against the working directory when it is set."""
        return self._out

    @out.setter
    def out(self, value: str | Path) -> None:
        self._out = Path(value).absolute()

    @classmethod
    def from_run(cls, out: str | Path, **kwargs) -> Experiment:
        """The experiment recorded in ``out/config.yaml`` (a run started earlier), e.g. to resume it:
        ``Experiment.from_run(out).run(resume=True)``; keys a later fedseg added read as that run used them
        (``fedseg.run.preflight.recorded_config``: an older run's ``eval.score_on`` is ``channels``). A device this
        machine lacks (a CUDA run on a laptop) is a ValueError pointing at :meth:`Results.load`, which reads the run
        anywhere."""
        from fedseg.run.preflight import check_device, recorded_config

        path = Path(out).absolute() / "config.yaml"
        recorded = recorded_config(path)
        if recorded is None:
            raise FileNotFoundError(f"{path} not found: is {out} a fedseg run directory?")
        # e.g. a CUDA run opened on a laptop: its results can still be read (a resume keeps the recorded device)
        read_here = (
            f"Results.load({str(path.parent)!r}) to read the run here ({path} records the device; a resume keeps it)"
        )
        check_device(str(recorded.get("device", "cpu")), cpu=read_here)
        return cls(validate_config(recorded, str(path)), path.parent, **kwargs)  # a bad key named with the file

    def run(self, resume: bool = False, report: bool = True) -> Results:
        """Run (``resume``: continue the run in ``out`` from its checkpoints; finished algorithms are
        reused, or continued to more rounds where ``config.fl.rounds`` grew: ``fedseg.run.extend``), render
        ``report.html`` (unless ``report`` is False) and return the results.

        The config is validated first (a ``ConfigError`` before anything is written). Torch's thread count
        (``threads``), its CPU (and initialized CUDA) random generators, cuDNN autotuning, Python's ``random``
        and numpy's global generator are restored when the run ends, however it ends."""
        from fedseg.run import run_experiment

        self.config = as_config(self.config)
        try:
            with process_state_kept():
                if self.progress:
                    from rich.console import Console

                    from fedseg.run.progress import run_with_progress

                    raw = run_with_progress(
                        self.config,
                        self.out,
                        resume,
                        Console(),
                        self.federation,
                        keep_checkpoints=self.keep_checkpoints,
                    )
                else:
                    raw = run_experiment(
                        self.config,
                        self.out,
                        resume,
                        federation=self.federation,
                        keep_checkpoints=self.keep_checkpoints,
                    )
        except ValueError as e:  # an unknown algorithm or data.source: registered in another process?
            hinted = with_resume_hint(e) if resume else None
            if hinted is None:
                raise
            raise hinted from None
        results = Results.load(self.out)
        results.raw = raw
        if report:
            render_run_report(self.out, self.config)
        return results

    def __repr__(self) -> str:
        return f"Experiment({', '.join(self.config.algorithms)} on {self.config.data.source!r}, out={str(self.out)!r})"


@contextmanager
def process_state_kept() -> Iterator[None]:
    """Restore, after the block (however it ends), the process-wide state a run sets: torch's intra-op thread
    count, ``torch.backends.cudnn.benchmark``, torch's CPU random generator (its seed too: ``torch.initial_seed``),
    the CUDA generators where CUDA was initialized before the block, Python's ``random`` and numpy's global
    generator (``np.random``)."""
    import random

    import numpy as np
    import torch

    threads, benchmark = torch.get_num_threads(), torch.backends.cudnn.benchmark
    cpu, python, numpy = torch.get_rng_state(), random.getstate(), np.random.get_state()
    cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_initialized() else None
    try:
        yield
    finally:
        torch.set_num_threads(threads)
        torch.backends.cudnn.benchmark = benchmark
        torch.set_rng_state(cpu)
        if cuda is not None:
            torch.cuda.set_rng_state_all(cuda)
        random.setstate(python)
        np.random.set_state(numpy)


def render_run_report(out: Path, cfg: RunConfig | None = None) -> Path:
    """What ``fedseg run`` does once a run is done: render ``report.html`` and give it to the run's
    experiment trackers (config ``tracking``; none: nothing). Returns the report's path."""
    from fedseg.report.html import render_report
    from fedseg.tracking import log_report

    path = render_report(out)
    log_report(out, cfg, path)
    return path


@dataclass
class Results:
    """The files of a run, read back: ``summary`` (``summary.json`` as a dict), ``config``
    (``config.yaml``), per-case scores (:meth:`cases`), paths (:attr:`out`, :attr:`report_path`,
    :meth:`model_dir`). ``raw``: the in-memory results (models included) when it comes from
    :meth:`Experiment.run`, else None. An interrupted run opens too, with the algorithms it finished:
    :attr:`missing` names the configured ones it did not (``finished`` is False, the repr says so). ``out`` is made
    absolute when the object is created (a later ``os.chdir`` does not move it)."""

    out: Path
    """The run's folder (absolute)."""
    summary: dict
    """``summary.json`` as a dict (per algorithm its scores, ``site_models``, and the traffic: ``floats_sent``;
    ``bytes_sent`` is measured on Flower only, 0 in the simulator and the worker pool)."""
    config: RunConfig | None = None
    """``config.yaml`` as a RunConfig (the configuration as given, recorded when the run started); None where the
    run has none or this fedseg cannot read it."""
    raw: RunResults | None = field(default=None, repr=False)
    """The in-memory results (``fedseg.run.outputs.RunResults``: the federation, each algorithm's trained models,
    rows and ledger) when these come from :meth:`Experiment.run`; None for :meth:`load`."""

    def __post_init__(self) -> None:
        self.out = Path(self.out).absolute()

    @classmethod
    def load(cls, out: str | Path) -> Results:
        """Open a run (its ``summary.json``, written after each algorithm; a FileNotFoundError if there is none,
        a ValueError naming the file if it is not a run summary, e.g. cut short)."""
        out = Path(out)
        path = out / "summary.json"
        if not path.is_file():
            raise FileNotFoundError(f"{path} not found: is {out} a finished fedseg run?")
        summary = read_summary(path)
        try:
            config = load_config(file=out / "config.yaml")
        except ConfigError:  # none, or one this fedseg cannot read
            config = None
        return cls(out, summary, config)

    # --- what was run ------------------------------------------------------------------------
    @property
    def algorithms(self) -> list[str]:
        """The algorithms with results (``summary.json``), in the run's order."""
        return list(self.summary.get("algorithms", {}))

    @property
    def missing(self) -> list[str]:
        """The algorithms ``config.yaml`` lists that have no results in ``summary.json``: those an interrupted
        run did not finish (:meth:`resume` continues it). Empty for a finished run, or without a readable
        ``config.yaml``."""
        configured = self.config.algorithms if self.config is not None else []
        return [a for a in configured if a not in self.summary.get("algorithms", {})]

    @property
    def finished(self) -> bool:
        """Whether every configured algorithm has results (:attr:`missing` is empty)."""
        return not self.missing

    @property
    def sites(self) -> list[str]:
        """The federation's site names (``summary.json``'s ``sites``), in its order: the names :meth:`dice` takes."""
        return list(self.summary.get("sites", []))

    def dice(self, average: str = "client_avg") -> dict[str, float]:
        """Test Dice per algorithm: ``client_avg`` (mean of the site means), ``global`` (mean over all
        test cases) or a site name (a ValueError listing them for another name). Each site's scores are those
        of the model it uses (summary.json's ``site_models``): :meth:`cases` with ``scored=True``."""
        return self._scores("dice", average)

    def hd95(self, average: str = "client_avg") -> dict[str, float]:
        """Test HD95 per algorithm, in ``summary["hd95_unit"]`` (as :meth:`dice`; NaN where it was not computed)."""
        return self._scores("hd95", average)

    def nsd(self, average: str = "client_avg") -> dict[str, float]:
        """Test normalized surface Dice per algorithm (as :meth:`dice`; tolerance: ``summary["nsd_tolerance"]``
        in ``summary["hd95_unit"]``); NaN for a run written before NSD existed."""
        return self._scores("nsd", average)

    def _scores(self, metric: str, average: str) -> dict[str, float]:
        """``{algorithm: summary.json's metric at average}`` (NaN where an algorithm's entry lacks it); a
        ValueError naming the known averages and sites for an unknown ``average``."""
        entries = self.summary.get("algorithms", {})
        known = dict.fromkeys(
            ["client_avg", "global", *self.sites, *(k for e in entries.values() for k in e.get("dice", {}))]
        )
        if average not in known:
            raise ValueError(
                f"{metric}({average!r}): {self.out} has no site {average!r}; choose one of {', '.join(known)}"
            )
        return {a: json_number(e.get(metric, {}).get(average)) for a, e in entries.items()}  # null: NaN

    # --- tables --------------------------------------------------------------------------------
    def cases(
        self,
        algorithm: str | None = None,
        metric: str | None = None,
        model: str | None = None,
        scored: bool = False,
    ) -> list[dict]:
        """``results.csv``: one dict per test case, region and metric (``algorithm, model, site, case,
        region, metric, value``; ``value`` a float, NaN where undefined), optionally only those of
        ``algorithm`` / ``metric`` (``dice`` | ``hd95`` | ``nsd``) / ``model`` (e.g. ``global``, ``local:site1``);
        a ValueError naming the ones there are (and the closest) for a value the run has none of (``metric="dicee"``,
        an algorithm it did not train), rather than no rows.

        ``results.csv`` holds every model an algorithm tested: besides the one each site uses, e.g. FedAvg's
        ``local:siteN`` models (``eval.local_models``) and ``local``'s models on the other sites. ``scored``: only
        the rows of the model each site uses (summary.json's ``site_models``), those :meth:`dice`, :meth:`hd95`
        and :meth:`nsd` average (per case: the mean over regions; per site: the mean over cases).

        The file is read as the report reads it: a damaged one (cut short, not UTF-8, a column missing) is a
        ValueError naming it; a missing one a FileNotFoundError saying to resume the run where ``summary.json``
        lists finished algorithms. No row matching the filters: ``[]``."""
        rows = self._run_csv("results.csv")
        want = {"algorithm": algorithm, "metric": metric, "model": model}
        known = {
            "algorithm": [*self.algorithms, *(r["algorithm"] for r in rows)],
            "metric": [*METRIC_NAMES, *(r["metric"] for r in rows)],
            "model": [r["model"] for r in rows],
        }
        for key, value in want.items():
            if value is not None and known[key] and value not in known[key]:  # (no rows: no model to name)
                raise ValueError(self._unknown(f"cases({key}={value!r})", key, value, list(dict.fromkeys(known[key]))))
        rows = [r for r in rows if all(v is None or r[k] == v for k, v in want.items())]
        if not scored:
            return rows
        used = {a: self.site_models(a) for a in {r["algorithm"] for r in rows}}
        return [r for r in rows if r["model"] == used[r["algorithm"]].get(r["site"])]

    def _unknown(self, call: str, what: str, value: str, known: list[str]) -> str:
        """``CALL: OUT has no WHAT 'value'; did you mean 'x'? choose one of a, b`` (the did-you-mean where one is
        close), as :meth:`dice` says of a site."""
        import difflib

        close = difflib.get_close_matches(value, known, n=1)
        hint = f"did you mean {close[0]!r}? " if close else ""
        return f"{call}: {self.out} has no {what} {value!r}; {hint}choose one of {', '.join(known)}"

    def site_models(self, algorithm: str) -> dict[str, str]:
        """``{site: the model its test scores come from}`` of ``algorithm`` (summary.json's ``site_models``:
        ``global`` for a method with one model, ``local:site1``... for each site's own); a ValueError for a run
        written before fedseg recorded it."""
        self._known_algorithm("site_models", algorithm)
        models = self.summary["algorithms"][algorithm].get("site_models")
        if not isinstance(models, dict):
            raise ValueError(
                f"{self.out / 'summary.json'}: {algorithm} records no site_models (written by an older fedseg); "
                "select the rows with cases(model=...) instead"
            )
        return models

    def rounds(self) -> list[dict]:
        """``rounds.csv``: validation Dice and training loss per algorithm, round and site (``round`` an int, the
        others floats, NaN where blank). A damaged file is a ValueError naming it, as for :meth:`cases`."""
        from fedseg.presentation.kit import num

        rows = self._run_csv("rounds.csv")
        for i, r in enumerate(rows, start=1):
            if not str(r["round"]).strip().isdigit():
                raise ValueError(f"{self.out / 'rounds.csv'}: row {i}: round {r['round']!r} is not a round number")
        return [
            {**r, "round": int(r["round"]), "val_dice": num(r["val_dice"]), "train_loss": num(r.get("train_loss"))}
            for r in rows
        ]

    def _run_csv(self, name: str) -> list[dict]:
        """The rows of the run's ``name`` (``results.csv``: ``value`` a float, NaN where blank), read as the report
        reads them (:func:`fedseg.presentation.files.read_csv` with the columns and numbers the report checks): a
        ValueError naming the file where it is not UTF-8 text, lacks a column, has a row cut short or a number that
        is not one. Missing: a FileNotFoundError saying what to do where the run's ``summary.json`` lists finished
        algorithms (written before ``name``: the run stopped in between), else ``[]`` (no results yet)."""
        from fedseg.presentation.files import read_csv
        from fedseg.presentation.kit import RUN_COLUMNS, RUN_NUMBERS, num

        path = self.out / name
        if not path.exists() and self.algorithms and (self.out / "summary.json").is_file():
            raise FileNotFoundError(
                f"{path}: missing, though summary.json lists finished algorithms ({', '.join(self.algorithms)}): the "
                "run stopped before writing it; resume it to write it again (results.resume(), or `fedseg run` with "
                "the run's command and --resume)"
            )
        if path.exists() and not path.is_file():
            raise ValueError(f"{path}: is not a file (a folder?), not the run's {name}")
        rows = read_csv(path, RUN_COLUMNS[name], RUN_NUMBERS.get(name))
        if name == "results.csv":
            for r in rows:
                r["value"] = num(r["value"])
        return rows

    def dataframe(self, **filters):
        """:meth:`cases` as a pandas DataFrame (pandas is not a dependency of fedseg: install it to use this), in the
        same long format: one row per case, region and metric, the score in ``value``. Select one metric before
        averaging (``dataframe(metric="dice", scored=True).groupby("algorithm")["value"].mean()``): a mean over
        every row mixes Dice, HD95 and NSD."""
        try:
            import pandas as pd
        except ImportError:
            raise ImportError(
                "Results.dataframe needs pandas (pip install pandas); Results.cases() gives the same rows"
            ) from None
        return pd.DataFrame(self.cases(**filters))

    # --- files ---------------------------------------------------------------------------------
    @property
    def report_path(self) -> Path:
        """``out/report.html`` (absolute), written by :meth:`Experiment.run` and :meth:`report`."""
        return self.out / "report.html"

    def model_dir(self, algorithm: str) -> Path:
        """``out/model/<algorithm>/``: the trained models (``weights.safetensors`` + ``manifest.json``),
        what ``fedseg predict --model`` reads. An algorithm the run has no results of: an ``UnknownAlgorithm``
        (a KeyError and a ValueError) naming those it has and the closest."""
        self._known_algorithm("model_dir", algorithm)
        return self.out / "model" / algorithm

    def _known_algorithm(self, call: str, algorithm: str) -> None:
        """An ``UnknownAlgorithm`` (a KeyError and a ValueError) naming ``call``, the run's algorithms and the closest,
        for an ``algorithm`` the run has no results of."""
        if algorithm not in self.summary.get("algorithms", {}):
            from fedseg.algorithms import UnknownAlgorithm

            where = f"{call}({algorithm!r})"
            raise UnknownAlgorithm(algorithm, self._unknown(where, "algorithm", algorithm, self.algorithms))

    @property
    def model_dirs(self) -> dict[str, Path]:
        """``{algorithm: out/model/<algorithm>/}`` for every algorithm with results (:meth:`model_dir`)."""
        return {a: self.model_dir(a) for a in self.algorithms}

    def bundle(self, algorithm: str) -> dict:
        """The trained models of ``algorithm``: ``{model name: {parameter: tensor}}``."""
        from fedseg.run.outputs import read_bundle

        self._known_algorithm("bundle", algorithm)
        return read_bundle(self.model_dir(algorithm))

    def report(self) -> Path:
        """Render ``report.html`` (and ``figures/``) again from the run's files; returns its path."""
        from fedseg.report.html import render_report

        return render_report(self.out)

    def resume(self, **kwargs) -> Results:
        """Run the recorded experiment again with ``resume``: unfinished algorithms continue from their
        checkpoints, finished ones are reused (keyword arguments: see :class:`Experiment`)."""
        return Experiment.from_run(self.out, **kwargs).run(resume=True)

    def __repr__(self) -> str:
        scores = ", ".join(f"{a} {d:.4f}" for a, d in self.dice().items())
        unfinished = f"; not finished: {', '.join(self.missing)}" if self.missing else ""
        return f"Results({str(self.out)!r}: {self.summary.get('dataset', '?')}, test Dice {scores}{unfinished})"


def read_summary(path: Path) -> dict:
    """A run's ``summary.json`` in the shape the report reads (:func:`fedseg.presentation.files.check_summary`),
    each algorithm's entry holding its ``dice``; a ValueError naming ``path`` and what is wrong otherwise (e.g. an
    empty or cut-short copy; a resume of the run writes the file again from its checkpoints)."""
    summary = check_summary(read_json(path, REWRITE_HINT), path)
    for name, entry in summary["algorithms"].items():
        if not isinstance(entry.get("dice"), dict):
            raise ValueError(f"{path}: algorithms.{name} holds no 'dice' object; {REWRITE_HINT}")
    return summary
