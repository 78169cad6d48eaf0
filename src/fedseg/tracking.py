"""Experiment tracking: ``tracking: [tensorboard, mlflow, wandb]`` in the run config (``fedseg run --track NAME``).

One tracking run per algorithm, named after it, so the methods' curves are comparable:

* TensorBoard: event files in ``OUT/tb/<algorithm>/`` (``tensorboard --logdir OUT/tb``);
* MLflow: a run named ``<algorithm>`` in the experiment ``cfg.name`` of the store ``tracking_uri``
  (default: the local file store ``OUT/mlruns``; no server, no network: MLflow's usage telemetry is
  switched off), tagged ``fedseg.out`` (the run directory) and ``fedseg.algorithm``;
* Weights & Biases: offline, a W&B run named ``<algorithm>`` in the project ``cfg.name``, grouped by the fedseg
  run (group ``<OUT's name>-<8 hex digits of OUT's path>``), written to ``OUT/wandb/offline-run-*``; nothing
  goes to a server (no login, no telemetry, no system metrics) unless ``WANDB_MODE`` is set (``online``: W&B's
  own behaviour); upload later with ``wandb sync OUT/wandb/offline-run-*``. Details: :class:`WandbTracker`.

What is logged (MLflow metric / TensorBoard scalar / W&B history key names; ``step`` = the round):

* per round, once the round's checkpoint is on disk (as ``run.log``: a resumed run never logs a
  round twice and appends to the same tracking run): ``train_loss/<site>``, ``train_loss/mean`` and the
  ledger so far (``ledger/floats_sent``, ``ledger/sgd_steps``, ``ledger/seconds``: training traffic,
  optimizer steps, compute seconds); in validated rounds also ``val_dice/<site>``, ``val_dice/mean``
  (the mean over sites that selects the best round) and the method's ``round_metrics`` as
  ``<metric>/<site>`` (FedSM's ``selector_acc/<site>``, Auto-FedAvg's ``alpha/<site>``, ...);
* at the end of the algorithm (step = its last round; W&B: the run's summary), from its ``summary.json`` entry:
  ``test/dice/<site|client_avg|global>``, ``test/hd95/...``, ``test/nsd/...``, ``test/local_avg``, ``test/local_gen``
  (when present), ``best_round``, ``selected_round/<site>`` (per-site selection), ``total/floats_sent``,
  ``total/sgd_steps``, ``total/seconds`` and the FeTS cost model's numbers ``cost/<key>``; the configuration
  as params with dotted keys (MLflow params, logged when the run is created; TensorBoard: HParams and
  the YAML as text; W&B: the run's config) and, on MLflow, ``config.yaml`` as an artifact (W&B: the file
  ``fedseg-config.yaml``);
* the report: :func:`log_report` adds ``OUT/report.html`` to every algorithm's MLflow run (W&B: the run's
  file ``report.html``) once it is rendered (``fedseg run`` calls it after the report). TensorBoard has no
  artifact store.

The packages are imported only when tracking is asked for; :func:`check_available` (called by
``run_experiment`` before any work) fails naming the extra to install: ``pip install 'fedseg[tracking]'``
(TensorBoard, MLflow), ``pip install 'fedseg[wandb]'`` (W&B).
A metric or param name keeps letters, digits, ``_ - . /`` and spaces; other characters become ``_``.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol
from urllib.parse import urlparse

from fedseg.evaluate.metric_info import METRIC_NAMES

if TYPE_CHECKING:
    from fedseg.config import RunConfig
    from fedseg.engine.ledger import Ledger

TRACKERS = ("tensorboard", "mlflow", "wandb")
EXTRA = "pip install 'fedseg[tracking]'"
EXTRAS = {"tensorboard": EXTRA, "mlflow": EXTRA, "wandb": "pip install 'fedseg[wandb]'"}  # what to install
PACKAGES = {"tensorboard": "tensorboard", "mlflow": "mlflow-skinny (or mlflow)", "wandb": "wandb"}
TB_DIR = "tb"
MLRUNS_DIR = "mlruns"
WANDB_DIR = "wandb"  # OUT/wandb/: W&B's own folder (offline-run-*), and fedseg's record of the run ids
WANDB_IDS = "fedseg-runs.json"
REPORT = "report.html"
OUT_TAG, ALGORITHM_TAG = "fedseg.out", "fedseg.algorithm"


class TrackingUnavailable(ValueError):
    """Tracking was asked for but a package it needs is not installed (the message names the extra)."""


@dataclass(frozen=True)
class RoundRecord:
    """What one round logs: ``metrics`` by name (see the module docstring)."""

    algorithm: str
    round: int
    metrics: dict[str, float]


class Tracker(Protocol):
    """One experiment tracker. Algorithms run one after another: ``start`` (before its first round to
    train), ``log_round`` per round (on the checkpoint writer's thread, after ``start``, in round order),
    ``finish`` (after the test); ``log_report`` once the run's report exists."""

    def start(self, algorithm: str, cfg: RunConfig, first_round: int | None = None) -> None: ...

    def log_round(self, record: RoundRecord) -> None: ...

    def finish(self, algorithm: str, cfg: RunConfig, summary: dict) -> None: ...

    def log_report(self, algorithms: Sequence[str], path: Path) -> None: ...


# --- what is logged ----------------------------------------------------------------------------
def metric_name(*parts: object) -> str:
    """``a/b/c`` from the parts, each reduced to characters every tracker accepts (no empty or dot-only part)."""
    clean = [re.sub(r"[^\w.\- ]", "_", str(p)).strip() for p in parts]
    return "/".join(c if c.strip(".") else f"_{c}" for c in clean)


def round_record(
    algorithm: str,
    rnd: int,
    rounds_rows: list[dict],
    metric_rows: list[dict],
    val_mean: float | None,
    losses: dict[str, float],
    ledger: Ledger,
) -> RoundRecord:
    """Round ``rnd``'s metrics; ``val_mean`` None: the round was not validated (no Dice, no method metrics).
    Call it when the round ends (the ledger is read then)."""
    metrics: dict[str, float] = {metric_name("train_loss", s): float(v) for s, v in losses.items()}
    if losses:
        metrics["train_loss/mean"] = float(sum(float(v) for v in losses.values()) / len(losses))
    if val_mean is not None:
        metrics.update(
            {metric_name("val_dice", r["site"]): float(r["val_dice"]) for r in rounds_rows if r["round"] == rnd}
        )
        metrics["val_dice/mean"] = float(val_mean)
        metrics.update(
            {metric_name(r["metric"], r["site"]): float(r["value"]) for r in metric_rows if r["round"] == rnd}
        )
    metrics.update({f"ledger/{k}": float(v) for k, v in ledger.totals().items()})
    return RoundRecord(algorithm, rnd, metrics)


def final_metrics(summary: dict) -> dict[str, float]:
    """The numbers of an algorithm's ``summary.json`` entry that a tracker logs at its end."""
    metrics: dict[str, float] = {}
    for metric in METRIC_NAMES:
        metrics.update({metric_name("test", metric, k): float(v) for k, v in summary.get(metric, {}).items()})
    for key in ("local_avg", "local_gen"):
        if key in summary:
            metrics[f"test/{key}"] = float(summary[key])
    if "best_round" in summary:
        metrics["best_round"] = float(summary["best_round"])
    metrics.update({metric_name("selected_round", s): float(r) for s, r in summary.get("selected_rounds", {}).items()})
    metrics.update({metric_name("selected_lr", s): float(r) for s, r in summary.get("selected_lrs", {}).items()})
    metrics.update({f"total/{k}": float(summary[k]) for k in ("floats_sent", "sgd_steps", "seconds") if k in summary})
    metrics.update({metric_name("cost", k): float(v) for k, v in (summary.get("cost") or {}).items() if is_number(v)})
    return metrics


def is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def config_params(cfg: RunConfig, algorithm: str) -> dict[str, str | int | float | bool]:
    """The configuration as flat ``{dotted.key: value}`` (numbers, booleans and strings as they are; lists,
    null and empty mappings as JSON text), plus ``algorithm``."""
    params: dict[str, str | int | float | bool] = {"algorithm": algorithm}
    for key, value in flatten(cfg.model_dump(mode="json")).items():
        name = ".".join(metric_name(p) for p in key.split("."))
        params[name] = value if isinstance(value, str | int | float | bool) else json.dumps(value)
    return params


def param_text(value: str | int | float | bool) -> str:
    """A param value as MLflow stores it: strings as they are, everything else as JSON (``true``, ``0.001``)."""
    return value if isinstance(value, str) else json.dumps(value)


def flatten(data: dict, prefix: str = "") -> dict[str, Any]:
    flat: dict[str, Any] = {}
    for key, value in data.items():
        if isinstance(value, dict) and value:
            flat.update(flatten(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


# --- availability and the factory --------------------------------------------------------------
def check_available(names: Sequence[str]) -> None:
    """Import what each tracker in ``names`` needs; a :class:`TrackingUnavailable` naming the extra otherwise
    (and ValueError for an unknown name)."""
    for name in names:
        if name not in TRACKERS:
            raise ValueError(f"tracking: unknown tracker {name!r}; use {', '.join(TRACKERS)}")
        try:
            if name == "tensorboard":
                _summary_writer()
            elif name == "mlflow":
                _mlflow_client_class()
            else:
                _wandb()
        except ImportError as e:
            raise TrackingUnavailable(
                f"tracking: {name} needs the package {PACKAGES[name]}, which is not installed ({e}); "
                f"install the extra: {EXTRAS[name]} (or remove {name} from tracking / --track)"
            ) from None


def open_tracker(cfg: RunConfig, out: Path, resume: bool) -> Tracker | None:
    """The trackers ``cfg.tracking`` names for the run in ``out`` (None when tracking is off);
    ``resume``: an algorithm's tracking run from before is continued."""
    trackers: list[Tracker] = []
    for name in dict.fromkeys(cfg.tracking):
        if name == "tensorboard":
            trackers.append(TensorBoardTracker(Path(out) / TB_DIR))
        elif name == "mlflow":
            trackers.append(MLflowTracker(mlflow_uri(cfg, out), cfg.name, Path(out), resume))
        elif name == "wandb":
            trackers.append(WandbTracker(Path(out), cfg.name, resume))
        else:
            raise ValueError(f"tracking: unknown tracker {name!r}; use {', '.join(TRACKERS)}")
    if not trackers:
        return None
    return trackers[0] if len(trackers) == 1 else Trackers(trackers)


def log_report(out: Path, cfg: RunConfig | None = None, path: Path | None = None) -> None:
    """Add the report (``path``, default ``out/report.html``) to every algorithm's tracking run of the run in
    ``out`` (``cfg``: its configuration, default ``out/config.yaml``). Nothing when tracking is off or there
    is no report."""
    out = Path(out)
    if cfg is None:
        cfg = _recorded_config(out)
    path = Path(path) if path is not None else out / REPORT
    if cfg is None or not cfg.tracking or not path.is_file():
        return
    tracker = open_tracker(cfg, out, resume=True)
    if tracker is not None:
        tracker.log_report(cfg.algorithms, path)


def _recorded_config(out: Path) -> RunConfig | None:
    import yaml

    from fedseg.config import RunConfig

    file = out / "config.yaml"
    if not file.is_file():
        return None
    return RunConfig.model_validate(yaml.safe_load(file.read_text()) or {})


def mlflow_uri(cfg: RunConfig, out: Path) -> str:
    """``cfg.tracking_uri`` (a plain path becomes a ``file:`` URI), default the file store ``out/mlruns``."""
    uri = cfg.tracking_uri
    if not uri:
        return (Path(out) / MLRUNS_DIR).resolve().as_uri()
    return uri if len(urlparse(uri).scheme) > 1 else Path(uri).expanduser().resolve().as_uri()


class Trackers:
    """Several trackers as one (each call passed to each, in order)."""

    def __init__(self, trackers: list[Tracker]):
        self.trackers = trackers

    def start(self, algorithm: str, cfg: RunConfig, first_round: int | None = None) -> None:
        for t in self.trackers:
            t.start(algorithm, cfg, first_round)

    def log_round(self, record: RoundRecord) -> None:
        for t in self.trackers:
            t.log_round(record)

    def finish(self, algorithm: str, cfg: RunConfig, summary: dict) -> None:
        for t in self.trackers:
            t.finish(algorithm, cfg, summary)

    def log_report(self, algorithms: Sequence[str], path: Path) -> None:
        for t in self.trackers:
            t.log_report(algorithms, path)


# --- TensorBoard -------------------------------------------------------------------------------
def _summary_writer():
    import tensorboard  # noqa: F401  (torch.utils.tensorboard needs it; imported first for a clear error)
    from torch.utils.tensorboard import SummaryWriter

    return SummaryWriter


class TensorBoardTracker:
    """Event files in ``root/<algorithm>/`` (torch's ``SummaryWriter``)."""

    def __init__(self, root: Path):
        self.root = Path(root)
        self.writer: Any = None

    def start(self, algorithm: str, cfg: RunConfig, first_round: int | None = None) -> None:
        self._close()
        # purge_step: TensorBoard hides the steps >= first_round of earlier event files in the folder
        # (a resumed run never logged one; a folder reused by a new run starts clean)
        self.writer = _summary_writer()(str(self.root / algorithm), purge_step=first_round)

    def log_round(self, record: RoundRecord) -> None:
        for name, value in record.metrics.items():
            self.writer.add_scalar(name, value, record.round)
        self.writer.flush()  # the round's checkpoint is on disk: so are its scalars

    def finish(self, algorithm: str, cfg: RunConfig, summary: dict) -> None:
        from torch.utils.tensorboard.summary import hparams

        from fedseg.config_load import dump_config

        if self.writer is None:
            self.start(algorithm, cfg)
        step, metrics = cfg.fl.rounds, final_metrics(summary)
        for name, value in metrics.items():
            self.writer.add_scalar(name, value, step)
        headline = {k: v for k, v in metrics.items() if k.startswith("test/dice/")}
        for event in hparams(config_params(cfg, algorithm), headline or {"best_round": metrics.get("best_round", 0.0)}):
            self.writer.file_writer.add_summary(event)
        self.writer.add_text("config", "```yaml\n" + dump_config(cfg) + "```", step)
        self._close()

    def log_report(self, algorithms: Sequence[str], path: Path) -> None:
        """TensorBoard has no artifact store: the report stays ``OUT/report.html``."""

    def _close(self) -> None:
        if self.writer is not None:
            self.writer.close()
            self.writer = None


# --- MLflow ------------------------------------------------------------------------------------
def _mlflow_client_class():
    os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")  # no network (read when mlflow is imported)
    import mlflow  # noqa: F401  (first: a clear error even where mlflow.tracking was imported before)
    from mlflow.tracking import MlflowClient

    return MlflowClient


class MLflowTracker:
    """A run per algorithm in experiment ``experiment`` of the store ``uri``, found again on resume by its
    tags (``fedseg.out`` = the run directory, ``fedseg.algorithm``)."""

    def __init__(self, uri: str, experiment: str, out: Path, resume: bool):
        if urlparse(uri).scheme == "file":
            # MLflow 3 keeps its file store in maintenance mode and refuses it unless this is set
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
        self.client = _mlflow_client_class()(tracking_uri=uri)
        self.uri, self.experiment, self.out, self.resume = uri, experiment, str(Path(out).resolve()), resume
        self.run_id: str | None = None

    def _experiment_id(self) -> str:
        found = self.client.get_experiment_by_name(self.experiment)
        return found.experiment_id if found is not None else self.client.create_experiment(self.experiment)

    def find_run(self, algorithm: str) -> str | None:
        """The newest run of ``algorithm`` for this run directory (in any experiment: the run's ``name`` may
        have changed on resume), None if there is none."""
        experiments = [e.experiment_id for e in self.client.search_experiments()]
        if not experiments:
            return None
        where = f"tags.`{ALGORITHM_TAG}` = {_quoted(algorithm)}"
        if not set("'\\\"") & set(self.out):  # else compared below only
            where += f" and tags.`{OUT_TAG}` = {_quoted(self.out)}"
        runs = self.client.search_runs(experiments, filter_string=where, max_results=1000)
        mine = [r for r in runs if r.data.tags.get(OUT_TAG) == self.out]
        return max(mine, key=lambda r: r.info.start_time).info.run_id if mine else None

    def start(self, algorithm: str, cfg: RunConfig, first_round: int | None = None) -> None:
        run_id = self.find_run(algorithm) if self.resume else None
        if run_id is None:
            tags = {OUT_TAG: self.out, ALGORITHM_TAG: algorithm}
            run_id = self.client.create_run(self._experiment_id(), run_name=algorithm, tags=tags).info.run_id
        else:
            self.client.update_run(run_id, status="RUNNING")
        self.run_id = run_id
        self._log_params(run_id, config_params(cfg, algorithm))

    def _log_params(self, run_id: str, params: dict[str, str | int | float | bool]) -> None:
        """Params not yet in the run (an MLflow param cannot change: a resumed run keeps the recorded ones)."""
        from mlflow.entities import Param

        have = self.client.get_run(run_id).data.params
        new = [Param(k, param_text(v)[:6000]) for k, v in params.items() if k not in have]
        for i in range(0, len(new), 100):  # MLflow's batch limit for params
            self.client.log_batch(run_id, params=new[i : i + 100])

    def _log_metrics(self, metrics: dict[str, float], step: int) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        rows = [Metric(k, v, now, step) for k, v in metrics.items()]
        assert self.run_id is not None, "start() comes first"
        for i in range(0, len(rows), 1000):  # MLflow's batch limit for metrics
            self.client.log_batch(self.run_id, metrics=rows[i : i + 1000])

    def log_round(self, record: RoundRecord) -> None:
        self._log_metrics(record.metrics, record.round)

    def finish(self, algorithm: str, cfg: RunConfig, summary: dict) -> None:
        from fedseg.config_load import dump_config

        if self.run_id is None:
            self.start(algorithm, cfg)
        assert self.run_id is not None
        self._log_metrics(final_metrics(summary), cfg.fl.rounds)
        self.client.log_text(self.run_id, dump_config(cfg), "config.yaml")
        self.client.set_terminated(self.run_id, "FINISHED")
        self.run_id = None

    def log_report(self, algorithms: Sequence[str], path: Path) -> None:
        for algorithm in dict.fromkeys(algorithms):
            if (run_id := self.find_run(algorithm)) is not None:
                self.client.log_artifact(run_id, str(path))


def _quoted(text: str) -> str:
    """``text`` as a string literal of MLflow's search syntax."""
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


# --- Weights & Biases --------------------------------------------------------------------------
def _wandb():
    # wandb-core reports its own errors and usage to W&B unless this is off (read when a run starts)
    os.environ.setdefault("WANDB_ERROR_REPORTING", "false")
    if os.environ.get("WANDB_MODE") == "":  # set but empty = not set (W&B would refuse it)
        del os.environ["WANDB_MODE"]
    import wandb

    return wandb


def wandb_mode() -> str:
    """``WANDB_MODE`` when the user set it (``online``, ``disabled``...), else ``offline``."""
    return os.environ.get("WANDB_MODE", "").strip() or "offline"


def wandb_group(out: Path) -> str:
    """The W&B group of the fedseg run in ``out``: its folder's name and 8 hex digits of its absolute path
    (runs in folders of the same name stay apart)."""
    path = str(Path(out).resolve())
    return f"{Path(path).name[:100]}-{hashlib.sha1(path.encode()).hexdigest()[:8]}"


def wandb_project(name: str) -> str:
    """``WANDB_PROJECT`` when set, else ``name`` (the run config's ``name``) as W&B accepts it."""
    return os.environ.get("WANDB_PROJECT") or re.sub(r"[/\\#?%:]", "_", name)[:128] or "fedseg"


_OPEN_WANDB: dict[tuple[str, str], Any] = {}  # (OUT/wandb, algorithm) -> its W&B run, until finished
_OPEN_LOCK = threading.Lock()


class WandbTracker:
    """A W&B run per algorithm, offline: ``wandb.init(mode="offline", dir=OUT)`` writes
    ``OUT/wandb/offline-run-<time>-<id>/`` (the transaction log ``run-<id>.wandb`` and ``files/``).

    * project ``cfg.name`` (or ``WANDB_PROJECT``), group :func:`wandb_group` (the fedseg run), name
      ``<algorithm>``, notes = the run directory; config = :func:`config_params` (dotted keys, as MLflow's params);
    * history: each round's :class:`RoundRecord` metrics with ``step`` = the round; summary: :func:`final_metrics`;
      files: ``fedseg-config.yaml`` (the run's configuration) and ``report.html`` (by :meth:`log_report`).
    * resume: the W&B run ids are kept in ``OUT/wandb/fedseg-runs.json`` (``{algorithm: id}``). A resumed fedseg
      run continues the same W&B run (``resume="allow"``, same id): offline, W&B writes each continuation to a new
      folder ``offline-run-<time>-<id>`` and ``wandb sync OUT/wandb/offline-run-*`` uploads the folders of one id
      in order into one W&B run; its steps never repeat (a round is logged once, after its checkpoint). Adding
      the report is such a continuation too.
    * mode: ``offline`` unless the user sets ``WANDB_MODE`` (e.g. ``online``: logged in, live upload). Never any
      login, W&B telemetry (``WANDB_ERROR_REPORTING=false`` unless set), system metrics, machine metadata or
      console capture; W&B prints nothing (``silent``).
    """

    def __init__(self, out: Path, project: str, resume: bool):
        self.out = Path(out)
        self.root = self.out / WANDB_DIR
        self.project, self.group, self.resume = wandb_project(project), wandb_group(self.out), resume
        self.run: Any = None
        self.algorithm: str | None = None

    def run_ids(self) -> dict[str, str]:
        """``{algorithm: W&B run id}`` of the run in ``out`` (empty when W&B never ran there)."""
        file = self.root / WANDB_IDS
        return json.loads(file.read_text()) if file.is_file() else {}

    def _open(self, algorithm: str, run_id: str | None, config: dict | None = None) -> Any:
        wandb = _wandb()
        key = (str(self.root.resolve()), algorithm)
        with _OPEN_LOCK:
            stale = _OPEN_WANDB.pop(key, None)
        if stale is not None:  # left open by a run that failed in this process: closed before continuing it
            stale.finish(exit_code=1)
        settings = wandb.Settings(silent=True, console="off", x_disable_stats=True, x_disable_meta=True)
        run = wandb.init(
            dir=str(self.out),
            project=self.project,
            group=self.group,
            name=algorithm,
            notes=f"fedseg run {self.out.resolve()}",
            id=run_id,
            resume="allow",
            mode=wandb_mode(),
            config=config,
            settings=settings,
            reinit="create_new",  # other W&B runs of the process (a notebook's own) are left alone
        )
        with _OPEN_LOCK:
            _OPEN_WANDB[key] = run
        return run

    def _close(self, run: Any, algorithm: str) -> None:
        run.finish()
        with _OPEN_LOCK:
            _OPEN_WANDB.pop((str(self.root.resolve()), algorithm), None)

    def _save(self, run: Any, name: str, write) -> None:
        """``write(path)`` a file into the run's ``files/`` folder, then save it (uploaded as ``name``); nothing
        when ``WANDB_MODE=disabled``."""
        if run.disabled:
            return
        path = Path(run.dir) / name
        write(path)
        run.save(str(path), base_path=run.dir, policy="now")

    def start(self, algorithm: str, cfg: RunConfig, first_round: int | None = None) -> None:
        from fedseg.atomic_files import atomic_write_text

        if self.run is not None:
            self._close(self.run, self.algorithm or algorithm)
        ids = self.run_ids()
        run_id = ids.get(algorithm) if self.resume else None  # None: W&B makes a new one
        self.run, self.algorithm = self._open(algorithm, run_id, dict(config_params(cfg, algorithm))), algorithm
        if run_id is None:
            self.root.mkdir(parents=True, exist_ok=True)
            atomic_write_text(self.root / WANDB_IDS, json.dumps({**ids, algorithm: self.run.id}, indent=1) + "\n")

    def log_round(self, record: RoundRecord) -> None:
        self.run.log(dict(record.metrics), step=record.round)

    def finish(self, algorithm: str, cfg: RunConfig, summary: dict) -> None:
        from fedseg.config_load import dump_config

        if self.run is None:
            self.start(algorithm, cfg)
        self.run.summary.update(final_metrics(summary))
        self._save(self.run, "fedseg-config.yaml", lambda p: p.write_text(dump_config(cfg)))
        self._close(self.run, algorithm)
        self.run = self.algorithm = None

    def log_report(self, algorithms: Sequence[str], path: Path) -> None:
        """``report.html`` to each algorithm's W&B run (a continuation of it: see the class docstring)."""
        ids = self.run_ids()
        for algorithm in dict.fromkeys(algorithms):
            if (run_id := ids.get(algorithm)) is not None:
                run = self._open(algorithm, run_id)
                self._save(run, REPORT, lambda p: shutil.copyfile(path, p))
                self._close(run, algorithm)
