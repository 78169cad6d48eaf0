"""The Python API, for notebooks and scripts: build a config, run it, read the results.

    import fedseg

    cfg = fedseg.load_config(preset="demo", overrides=["fl.rounds=2"])   # or a dict, or a RunConfig
    results = fedseg.Experiment(cfg, "runs/demo").run()                 # = fedseg run --preset demo ...
    results.dice()              # {"centralized": 0.52, "local": 0.32, "fedavg": 0.41}: test Dice, client avg
    results.cases()             # results.csv's per-case rows (list of dicts; .dataframe() with pandas)
    results.report()            # re-render report.html
    fedseg.Results.load("runs/demo")                                     # a finished run, later

``Experiment.run`` does what ``fedseg run`` does (the same functions): the checks made before any work
(device, output folder, options, data, a resume's recorded configuration), every algorithm trained and
tested, the run's files and ``report.html``. Errors are raised (``ConfigError``, ``FederationError``,
``ValueError``, ``FileExistsError``...), not printed. Custom methods and federations: see
``fedseg.algorithms.register_algorithm`` and ``fedseg.data.sources.register_federation``.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fedseg.config import ConfigError, RunConfig, load_config, validate_config
from fedseg.data.federation import Federation

if TYPE_CHECKING:
    from fedseg.run.outputs import RunResults

__all__ = ["Experiment", "Results", "as_config", "render_run_report"]

ConfigLike = RunConfig | Mapping[str, Any] | str | Path


def as_config(config: ConfigLike) -> RunConfig:
    """A ``RunConfig`` from a RunConfig (as is), a dict (validated like a YAML config file: every bad key
    named in a ``ConfigError``) or the path of a YAML config file. A preset: ``load_config(preset=NAME)``."""
    if isinstance(config, RunConfig):
        return config
    if isinstance(config, Mapping):
        data = json.loads(
            json.dumps(config, default=str)
        )  # a deep copy as YAML would give: tuples as lists, paths as str
        data.pop("description", None)
        return validate_config(data, "config")
    if isinstance(config, (str, Path)):
        return load_config(file=config)
    raise TypeError(f"config: expected a RunConfig, a dict or a YAML file path, got {type(config).__name__}")


class Experiment:
    """One run: ``Experiment(config, out).run()`` trains and evaluates every configured algorithm into
    folder ``out`` and returns its :class:`Results`.

    ``config``: a RunConfig (``load_config(preset=..., overrides=[...])``), a dict or a YAML file path.
    ``federation``: an in-memory :class:`~fedseg.data.federation.Federation` replacing ``data.source``
    (give the same one to resume; ``register_federation`` lets the config name it instead).
    ``keep_checkpoints``: keep the trained models in the finished checkpoints too (``--keep-checkpoints``).
    ``progress``: print each round's line (progress bars on a terminal), as ``fedseg run`` does."""

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

    @classmethod
    def from_run(cls, out: str | Path, **kwargs) -> Experiment:
        """The experiment recorded in ``out/config.yaml`` (a run started earlier), e.g. to resume it:
        ``Experiment.from_run(out).run(resume=True)``."""
        path = Path(out) / "config.yaml"
        if not path.is_file():
            raise FileNotFoundError(f"{path} not found: is {out} a fedseg run directory?")
        return cls(load_config(file=path), out, **kwargs)

    def run(self, resume: bool = False, report: bool = True) -> Results:
        """Run (``resume``: continue the run in ``out`` from its checkpoints; finished algorithms are
        reused), render ``report.html`` (unless ``report`` is False) and return the results."""
        from fedseg.run import run_experiment

        if self.progress:
            from rich.console import Console

            from fedseg.run.progress import run_with_progress

            raw = run_with_progress(
                self.config, self.out, resume, Console(), self.federation, keep_checkpoints=self.keep_checkpoints
            )
        else:
            raw = run_experiment(
                self.config, self.out, resume, federation=self.federation, keep_checkpoints=self.keep_checkpoints
            )
        results = Results.load(self.out)
        results.raw = raw
        if report:
            render_run_report(self.out, self.config)
        return results

    def __repr__(self) -> str:
        return f"Experiment({', '.join(self.config.algorithms)} on {self.config.data.source!r}, out={str(self.out)!r})"


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
    """The files of a finished run, read back: ``summary`` (``summary.json`` as a dict), ``config``
    (``config.yaml``), per-case scores (:meth:`cases`), paths (:attr:`out`, :attr:`report_path`,
    :meth:`model_dir`). ``raw``: the in-memory results (models included) when it comes from
    :meth:`Experiment.run`, else None."""

    out: Path
    summary: dict
    config: RunConfig | None = None
    raw: RunResults | None = field(default=None, repr=False)

    @classmethod
    def load(cls, out: str | Path) -> Results:
        """Open a finished run (its ``summary.json``; a FileNotFoundError if there is none)."""
        out = Path(out)
        path = out / "summary.json"
        if not path.is_file():
            raise FileNotFoundError(f"{path} not found: is {out} a finished fedseg run?")
        try:
            config = load_config(file=out / "config.yaml")
        except ConfigError:  # none, or one this fedseg cannot read
            config = None
        return cls(out, json.loads(path.read_text()), config)

    # --- what was run ------------------------------------------------------------------------
    @property
    def algorithms(self) -> list[str]:
        return list(self.summary.get("algorithms", {}))

    @property
    def sites(self) -> list[str]:
        return list(self.summary.get("sites", []))

    def dice(self, average: str = "client_avg") -> dict[str, float]:
        """Test Dice per algorithm: ``client_avg`` (mean of the site means), ``global`` (mean over all
        test cases) or a site name."""
        return {a: float(e["dice"][average]) for a, e in self.summary.get("algorithms", {}).items()}

    def hd95(self, average: str = "client_avg") -> dict[str, float]:
        """Test HD95 per algorithm (as :meth:`dice`)."""
        return {a: float(e["hd95"][average]) for a, e in self.summary.get("algorithms", {}).items()}

    def nsd(self, average: str = "client_avg") -> dict[str, float]:
        """Test normalized surface Dice per algorithm (as :meth:`dice`; tolerance: ``summary["nsd_tolerance"]``
        in ``summary["hd95_unit"]``); NaN for a run written before NSD existed."""
        return {
            a: float(e.get("nsd", {}).get(average, math.nan)) for a, e in self.summary.get("algorithms", {}).items()
        }

    # --- tables --------------------------------------------------------------------------------
    def cases(self, algorithm: str | None = None, metric: str | None = None, model: str | None = None) -> list[dict]:
        """``results.csv``: one dict per test case, region and metric (``algorithm, model, site, case,
        region, metric, value``; ``value`` a float, NaN where undefined), optionally only those of
        ``algorithm`` / ``metric`` (``dice`` | ``hd95`` | ``nsd``) / ``model`` (e.g. ``global``, ``local:site1``)."""
        from fedseg.evaluate.tables import read_rows

        path = self.out / "results.csv"
        rows = read_rows(path) if path.is_file() else []
        want = {"algorithm": algorithm, "metric": metric, "model": model}
        return [r for r in rows if all(v is None or r[k] == v for k, v in want.items())]

    def rounds(self) -> list[dict]:
        """``rounds.csv``: validation Dice and training loss per algorithm, round and site (numbers as floats)."""
        from fedseg.presentation.kit import num, read_csv

        return [
            {**r, "round": int(r["round"]), "val_dice": num(r["val_dice"]), "train_loss": num(r["train_loss"])}
            for r in read_csv(self.out / "rounds.csv")
        ]

    def dataframe(self, **filters):
        """:meth:`cases` as a pandas DataFrame (pandas is not a dependency of fedseg: install it to use this)."""
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
        return self.out / "report.html"

    def model_dir(self, algorithm: str) -> Path:
        """``out/model/<algorithm>/``: the trained models (``weights.safetensors`` + ``manifest.json``),
        what ``fedseg predict --model`` reads."""
        if algorithm not in self.summary.get("algorithms", {}):
            raise KeyError(f"no algorithm {algorithm!r} in {self.out}; it has {', '.join(self.algorithms)}")
        return self.out / "model" / algorithm

    @property
    def model_dirs(self) -> dict[str, Path]:
        return {a: self.model_dir(a) for a in self.algorithms}

    def bundle(self, algorithm: str) -> dict:
        """The trained models of ``algorithm``: ``{model name: {parameter: tensor}}``."""
        from fedseg.run.outputs import read_bundle

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
        return f"Results({str(self.out)!r}: {self.summary.get('dataset', '?')}, test Dice {scores})"
