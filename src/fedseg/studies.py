"""Studies made of several complete runs: unseen sites (FedSM Table 5) and config sweeps (Tables 6, 7).

Each sub-run is an ordinary run directory written by :func:`fedseg.run.run_experiment`
(config.yaml, summary.json, checkpoints/, model/, ...), so it resumes, reports and predicts
like any run. A study directory ``OUT`` holds:

* ``study.json``: the study's kind (``holdout`` | ``sweep``), its sites or key and values,
  the sub-run folders and the base configuration;
* holdout (``--holdout SITE`` / ``--leave-one-out``): ``holdout/<site>/`` = a run on the
  federation without ``<site>`` (``Federation.without``; it also gets its own rows as
  ``unseen.csv``/``.json``), then ``unseen.csv`` + ``unseen.json``: one row per unseen site and
  algorithm, columns ``algorithm, unseen_site, cases, gamma, freq_GM, freq_PM_<site>`` (one per
  site of the whole federation, empty for the unseen site: the paper's N/A) ``, dice, best_gamma,
  best_dice, val_gamma, val_dice, converged, run`` (the sub-run folder relative to ``OUT``; ``converged``:
  ``yes``/``no``/``never improved`` from the sub-run's summary.json, ``fedseg.run.stopping.convergence``); empty = not
  applicable;
* sweep (``--sweep key=v1,v2,...``): ``sweep/<key>=<value>/`` = a run with ``--set key=value``
  on top of the base configuration, then ``sweep.csv`` + ``sweep.json``: one row per value and
  algorithm, columns ``key, value, algorithm, val_dice, converged, dice_<site>..., dice_client_avg, dice_global,
  hd95_client_avg, nsd_client_avg, run`` (``val_dice``: the mean validation Dice at the selected round, the
  score a choice among the values must be made on; the rest: the sub-run's summary.json test numbers).

The tables are rewritten after every sub-run. ``resume`` continues a study: finished sub-runs
return from their checkpoints without training, a half-done one continues from its last round.

Unseen-site evaluation (paper Sec. 4.2, Table 5). The held-out site never joins training (no
split, no selector class, no personalized model); it is scored on **all** of its cases (none
of them was seen), preprocessed as the training sites' images. Each algorithm's trained bundle
is evaluated in this process:

* a method whose family scores its own bundles (``Family.unseen_cells``; the FedSM family
  routes each image through its super model, :mod:`fedseg.algorithms.fedsm.unseen`): the cells
  it returns. ``gamma``/``best_*``/``val_*`` apply to methods with a threshold; ``freq_GM`` /
  ``freq_PM_<site>`` are how often each image went to the global / a personalized model;
  ``unseen.json`` also holds the whole Dice/frequency curve over the threshold grid (``curve``);
* an algorithm whose bundle has a ``global`` model (fedavg, fedprox, centralized, ...): that
  model's Dice; selection columns empty;
* anything else (``local``: one model per training site, no single model) gets no row; the study says so in one line
  per such method (``StudyResult.skipped``, printed by ``fedseg run``) and ``unseen.json`` lists them (``no_row``).

Dice: per case the mean over regions, then the mean over the site's cases
(:func:`fedseg.evaluate.tables.site_summary`, the convention of every table here).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from fedseg.algorithms import check_sites, get_algorithm
from fedseg.atomic_files import atomic_write_text, json_ready, strict_json_text
from fedseg.config import RunConfig
from fedseg.config_load import ConfigError, apply_override, error_text, validate_config, with_recorded_defaults
from fedseg.data.dataset import CaseSet, build_site_data
from fedseg.data.federation import Federation
from fedseg.engine.context import Task
from fedseg.engine.messages import load_weights
from fedseg.evaluate.inference import candidate_dice
from fedseg.evaluate.tables import site_dice
from fedseg.folder_lock import holding
from fedseg.run import count_sites, load_federation, run_experiment
from fedseg.run.outputs import RunResults, csv_text
from fedseg.run.preflight import (
    STUDY_FILE,
    check_device,
    check_out_dir,
    check_out_kind,
    check_out_outside,
    check_resume,
)
from fedseg.run.preparation import folder_root
from fedseg.run.stopping import NEVER_IMPROVED, recorded_not_converged

UNSEEN, SWEEP = "unseen", "sweep"  # table stems: OUT/unseen.csv|json, OUT/sweep.csv|json
HOLDOUT_DIR, SWEEP_DIR = "holdout", "sweep"
GM = "freq_GM"

# (config, run directory, resume, federation or None = load from the config) -> the run's results
Runner = Callable[[RunConfig, Path, bool, Federation | None], RunResults]


def default_runner(cfg: RunConfig, out: Path, resume: bool, federation: Federation | None) -> RunResults:
    return run_experiment(cfg, out, resume, federation=federation)


@dataclass
class SubRun:
    """One complete run of a study: ``label`` = the held-out site or ``<key>=<value>``."""

    label: str
    dir: Path
    cfg: RunConfig
    federation: Federation | None = None  # the training federation (None: loaded from ``cfg``)
    value: str | None = None  # sweep: the value as given (YAML text)


@dataclass
class Study:
    """A planned study; every sub-run's config is validated when the plan is made."""

    kind: Literal["holdout", "sweep"]
    out: Path
    cfg: RunConfig  # the base configuration
    runs: list[SubRun]
    key: str | None = None  # sweep: the config key
    federation: Federation | None = None  # holdout: the full federation (the unseen site's cases)

    @property
    def table(self) -> str:
        return UNSEEN if self.kind == "holdout" else SWEEP


@dataclass
class StudyResult:
    """What ``run_study`` wrote: the table's columns and rows, and algorithms without a row, one line each
    (``no_row_notes``: which, for which unseen sites, and why), as ``unseen.json`` lists them (``no_row``)."""

    study: Study
    columns: list[str]
    rows: list[dict]
    skipped: list[str] = field(default_factory=list)


# --------------------------------------------------------------------------- planning
def plan_holdout(
    cfg: RunConfig, out: Path, sites: list[str] | None = None, federation: Federation | None = None
) -> Study:
    """One sub-run per held-out site (``sites``; None = every site, leave-one-out) in ``OUT/holdout/<site>/``.
    Unknown site -> KeyError listing the site names; fewer than 2 sites -> ValueError."""
    check_algorithms(cfg, "config")
    fed = federation or load_federation(cfg)
    if len(fed.sites) < 2:
        raise ValueError(f"an unseen-site study needs at least 2 sites; {fed.name!r} has {len(fed.sites)}")
    names = fed.site_names if sites is None else list(sites)
    check_sites(cfg, len(fed.sites) - 1, f"{fed.name!r} without one site")  # each sub-run trains on one site fewer
    runs = [SubRun(s, Path(out) / HOLDOUT_DIR / s, cfg, fed.without(s)) for s in names]
    return Study("holdout", Path(out), cfg, runs, federation=fed)


def split_values(text: str) -> list[str]:
    """``"0.1,0.3"`` -> ``["0.1", "0.3"]``; commas inside ``[...]`` or ``{...}`` (YAML lists, maps) stay."""
    parts: list[str] = []
    current: list[str] = []
    depth = 0
    for ch in text:
        depth += (ch in "[{") - (ch in "]}")
        if ch == "," and depth == 0:
            parts.append("".join(current).strip())
            current = []
        else:
            current.append(ch)
    parts.append("".join(current).strip())
    return parts


def parse_sweep(spec: str) -> tuple[str, list[str]]:
    """``"key.sub=v1,v2"`` -> ``("key.sub", ["v1", "v2"])``;
    a ConfigError on a missing key, an empty or repeated value."""
    key, sep, raw = spec.partition("=")
    key = key.strip()
    if not sep or not key:
        raise ConfigError(f"--sweep {spec!r}: expected key.sub=v1,v2,...")
    values = split_values(raw)
    if any(not v for v in values):
        raise ConfigError(f"--sweep {spec!r}: empty value in {raw!r}")
    if len(set(values)) != len(values):
        raise ConfigError(f"--sweep {spec!r}: repeated value")
    return key, values


def run_label(key: str, value: str) -> str:
    """The sub-run folder name ``<key>=<value>`` (characters unsafe in a file name -> ``_``)."""
    return re.sub(r"[^\w.,=+\-\[\]{}:]", "_", f"{key}={value}")


def sweep_config(cfg: RunConfig, key: str, value: str) -> RunConfig:
    """``cfg`` with ``key = value`` (YAML), validated like ``--set``; every algorithm's options are
    checked too, and a ``methods.<name>.*`` key must name one of the run's algorithms."""
    where = f"--sweep {key}={value}"
    data = cfg.model_dump(mode="json")
    apply_override(data, f"{key}={value}", option="--sweep")
    variant = validate_config(data, where)
    parts = key.split(".")
    if parts[0] == "methods" and len(parts) > 1 and parts[1] not in variant.algorithms:
        raise ConfigError(f"{where}: {parts[1]!r} is not among the run's algorithms {variant.algorithms}")
    check_algorithms(variant, where)
    return variant


def check_algorithms(cfg: RunConfig, where: str) -> None:
    """Every algorithm of ``cfg`` exists and its ``methods.<name>`` options are valid (ConfigError naming ``where``)."""
    for name in cfg.algorithms:
        try:
            get_algorithm(name).parse_options(cfg.methods.get(name))
        except (KeyError, ValueError) as e:
            raise ConfigError(f"{where}: {error_text(e)}") from None


def plan_sweep(cfg: RunConfig, out: Path, spec: str, federation: Federation | None = None) -> Study:
    """One sub-run per value of ``spec`` (``key=v1,v2,...``) in ``OUT/sweep/<key>=<value>/``; every
    value is validated here, before anything runs. ``federation`` (in memory) serves every sub-run;
    None loads each sub-run's own ``data`` (so ``data.*`` keys can be swept)."""
    key, values = parse_sweep(spec)
    labels = [run_label(key, v) for v in values]
    if len(set(labels)) != len(labels):
        raise ConfigError(f"--sweep {spec!r}: two values give the same folder name ({labels})")
    runs = [
        SubRun(lab, Path(out) / SWEEP_DIR / lab, sweep_config(cfg, key, v), federation, v)
        for lab, v in zip(labels, values)
    ]
    for run in runs:  # each value with its own federation's site count (a data.* sweep may change it)
        try:
            check_sites(run.cfg, len(federation.sites) if federation else count_sites(run.cfg), run.label)
        except ValueError as e:  # FederationError included
            raise ConfigError(f"--sweep {spec!r}: {e}") from None
    return Study("sweep", Path(out), cfg, runs, key=key)


def check_out(study: Study, resume: bool) -> None:
    """Before any work: every sub-run's device usable and ``out`` a folder (or creatable) that holds no plain run,
    bench or federation (``fedseg.run.preflight.check_out_kind``: a run is refused a study's folder in turn) and
    lies outside the federation folder; without ``resume`` the study folder must not hold a study or sub-run; with
    it, ``study.json`` (if present) must describe the same kind of study and key, keep every recorded value or site
    (new ones may be added: ``check_same_variants``), and its base configuration may differ only as a run's may
    (``fedseg.run.preflight.check_resume``)."""
    out = study.out
    for device in dict.fromkeys(r.cfg.device for r in study.runs):
        check_device(device)
    check_out_dir(out)
    check_out_kind(out, "study")
    check_out_outside(out, folder_root(study.cfg))
    meta = out / STUDY_FILE
    if not resume:
        if meta.exists() or any((r.dir / "checkpoints").exists() for r in study.runs):
            raise FileExistsError(
                f"{out}: already holds a study; use --resume with the same study options to continue it "
                "or choose another --out"
            )
        return
    if meta.is_file():
        old = json.loads(meta.read_text())
        if (old.get("kind"), old.get("key")) != (study.kind, study.key):
            raise ValueError(
                f"{meta}: holds a {old.get('kind')} study (key {old.get('key')}); "
                f"cannot resume it as a {study.kind} study (key {study.key})"
            )
        check_same_variants(study, old, meta)
        check_resume(with_recorded_defaults(old.get("config", {})), study.cfg.model_dump(mode="json"), str(meta))


def check_same_variants(study: Study, old: dict, meta: Path) -> None:
    """A resume keeps every sweep value / held-out site ``study.json`` records (a dropped one would vanish from the
    table and ``study.json`` while its sub-run stays in the folder); new ones may be added, in any order. A
    ValueError naming recorded -> given, what is dropped and what to give."""
    if study.kind == "sweep":
        recorded, given = old.get("values"), [r.value or "" for r in study.runs]
        if recorded is None:  # a study.json without its values: compare the sub-run folders
            recorded, given = list(old.get("runs", {})), [r.label for r in study.runs]
    else:
        recorded, given = old.get("holdout") or list(old.get("runs", {})), [r.label for r in study.runs]
    dropped = [v for v in recorded if v not in given]
    if not dropped:
        return
    if study.kind == "sweep":
        both = ",".join([*recorded, *(v for v in given if v not in recorded)])
        raise ValueError(
            f"{meta}: sweep {study.key}={','.join(recorded)} -> {study.key}={','.join(given)} drops "
            f"{', '.join(dropped)}; a resume may add values but must keep every recorded one: "
            f"use --sweep {study.key}={both} or choose another --out"
        )
    raise ValueError(
        f"{meta}: holdout sites {', '.join(recorded)} -> {', '.join(given)} drops {', '.join(dropped)}; a resume may "
        "add sites but must keep every recorded one: use --leave-one-out (every site) or choose another --out"
    )


# --------------------------------------------------------------------------- running
def run_study(
    study: Study,
    resume: bool = False,
    runner: Runner | None = None,
    on_run_start: Callable[[SubRun], None] | None = None,
) -> StudyResult:
    """Run (or resume) every sub-run in order; after each, rewrite ``OUT/<table>.csv`` + ``.json``."""
    check_out(study, resume)
    runner = runner or default_runner
    study.out.mkdir(parents=True, exist_ok=True)
    with holding(study.out):  # one study writes this folder (each sub-run holds its own in turn)
        return run_sub_runs(study, resume, runner, on_run_start)


def run_sub_runs(
    study: Study, resume: bool, runner: Runner, on_run_start: Callable[[SubRun], None] | None
) -> StudyResult:
    """``run_study``'s work in the held study folder."""
    write_study_file(study)
    result = StudyResult(study, [], [])
    no_row: dict[str, dict[str, list[str]]] = {}  # algorithm -> {"unseen_sites": [...], "models": [...]}
    for sub in study.runs:
        if on_run_start:
            on_run_start(sub)
        results = runner(sub.cfg, sub.dir, resume, sub.federation)
        extra = None
        if study.kind == "holdout":
            assert study.federation is not None  # plan_holdout sets it
            rows, skipped = unseen_rows(results, study.federation, sub.label, sub.dir.relative_to(study.out).as_posix())
            for name, models in skipped.items():
                entry = no_row.setdefault(name, {"unseen_sites": [], "models": []})
                entry["unseen_sites"].append(sub.label)
                entry["models"] = sorted({*entry["models"], *models})
            result.skipped = no_row_notes(no_row)
            mine = no_row_notes({name: {"unseen_sites": [sub.label], "models": m} for name, m in skipped.items()})
            # the sub-run's own row(s)
            write_table(sub.dir, UNSEEN, unseen_columns(study.federation.site_names), rows, {"no_row": mine})
            extra = {"no_row": result.skipped}
        else:
            assert study.key is not None and sub.value is not None  # plan_sweep sets them
            rows = sweep_rows(results, study.key, sub.value, sub.dir.relative_to(study.out).as_posix())
        result.rows += rows
        result.columns = (
            unseen_columns(study.federation.site_names) if study.federation is not None else sweep_columns(result.rows)
        )
        write_table(study.out, study.table, result.columns, result.rows, extra)
    return result


def no_row_notes(no_row: dict[str, dict[str, list[str]]]) -> list[str]:
    """One line per algorithm without an unseen-site row (``{algorithm: {"unseen_sites", "models"}}``), to follow
    "no unseen-site row for ": ``local (unseen site3): it has no global or super model to score on a site it never
    trained on, only local:site1, local:site2 (docs/benchmark-protocol.md)``."""
    return [
        f"{name} (unseen {', '.join(entry['unseen_sites'])}): it has no global or super model to score on a site it "
        f"never trained on, only {', '.join(entry['models']) or 'no model'} (docs/benchmark-protocol.md: such a "
        "method gets no row)"
        for name, entry in no_row.items()
    ]


def write_study_file(study: Study) -> None:
    meta = {
        "kind": study.kind,
        "key": study.key,
        "runs": {r.label: r.dir.relative_to(study.out).as_posix() for r in study.runs},
        "values": [r.value for r in study.runs] if study.kind == "sweep" else None,
        "holdout": [r.label for r in study.runs] if study.kind == "holdout" else None,
        "config": study.cfg.model_dump(mode="json"),
    }
    atomic_write_text(study.out / STUDY_FILE, strict_json_text(meta, indent=2))


def write_table(out: Path, stem: str, columns: list[str], rows: list[dict], extra: dict | None = None) -> None:
    """``OUT/<stem>.csv`` (``columns`` only; empty = not applicable) and ``OUT/<stem>.json``
    (``{"columns", "rows"}``, rows with any extra detail keys, plus ``extra``'s keys: ``no_row``, the lines of the
    algorithms without a row)."""
    flat = [{c: json_ready(r.get(c)) for c in columns} for r in rows]
    atomic_write_text(out / f"{stem}.csv", csv_text(columns, flat))
    table = {"columns": columns, "rows": rows, **(extra or {})}
    atomic_write_text(out / f"{stem}.json", strict_json_text(table, indent=2))


# --------------------------------------------------------------------------- sweep table
def sweep_columns(rows: list[dict]) -> list[str]:
    """``key, value, algorithm, val_dice, converged, dice_<site>... (every site seen, in order), dice_client_avg,
    dice_global, hd95_client_avg, nsd_client_avg, run``."""
    sites = list(
        dict.fromkeys(
            c for r in rows for c in r if c.startswith("dice_") and c not in ("dice_client_avg", "dice_global")
        )
    )
    means = ["dice_client_avg", "dice_global", "hd95_client_avg", "nsd_client_avg"]
    return ["key", "value", "algorithm", "val_dice", "converged", *sites, *means, "run"]


def sweep_rows(results: RunResults, key: str, value: str, run: str) -> list[dict]:
    """One row per algorithm: its summary's test Dice per site, client_avg and global, HD95 and NSD client_avg
    (NSD empty for a run written before it existed)."""
    rows = []
    for algo in results.algorithms:
        dice, hd95 = algo.summary["dice"], algo.summary["hd95"]
        rows.append(
            {
                "key": key,
                "value": value,
                "algorithm": algo.name,
                "val_dice": json_ready(algo.summary.get("convergence", {}).get("best_val_dice")),
                "converged": converged_cell(algo.summary),
                **{f"dice_{s}": json_ready(dice.get(s)) for s in results.federation.site_names},
                "dice_client_avg": json_ready(dice["client_avg"]),
                "dice_global": json_ready(dice["global"]),
                "hd95_client_avg": json_ready(hd95["client_avg"]),
                "nsd_client_avg": json_ready(algo.summary.get("nsd", {}).get("client_avg")),
                "run": run,
            }
        )
    return rows


def converged_cell(summary: dict) -> str:
    """``yes`` / ``no`` from a sub-run algorithm's ``summary.json`` entry (``no``: it may not have converged,
    ``fedseg.run.stopping.recorded_not_converged``, every page's rule), ``NEVER_IMPROVED`` where its validation never
    improved on round 1 (``convergence.improved`` False), "" where it was not recorded."""
    convergence = summary.get("convergence", {})
    if convergence.get("improved") is False:
        return NEVER_IMPROVED
    if not isinstance(convergence.get("converged"), bool):
        return ""
    return "no" if recorded_not_converged(summary) else "yes"


# --------------------------------------------------------------------------- unseen table
def pm_column(site: str) -> str:
    return f"freq_PM_{site}"


def unseen_columns(sites: list[str]) -> list[str]:
    """Table 5 layout: one ``freq_PM_<site>`` per site of the full federation (empty for the unseen site)."""
    return [
        "algorithm",
        "unseen_site",
        "cases",
        "gamma",
        GM,
        *map(pm_column, sites),
        "dice",
        "best_gamma",
        "best_dice",
        "val_gamma",
        "val_dice",
        "converged",
        "run",
    ]


def unseen_caseset(fed: Federation, site: str, cfg: RunConfig) -> CaseSet:
    """Every case of ``site`` as the run's test sets are built (the unseen site has no splits: all of it is test
    data; its truth on each case's own grid with ``eval.score_grid: original``)."""
    s, tests = fed.site(site), {c.id: "test" for c in fed.site(site).cases}
    originals = cfg.eval.score_grid == "original"
    return build_site_data(fed, s, fed.site_names.index(site), tests, cfg.data, originals=originals).test


def unseen_rows(results: RunResults, fed: Federation, site: str, run: str) -> tuple[list[dict], dict[str, list[str]]]:
    """Table 5 rows of one holdout run (one per algorithm with a global or super model) and the
    skipped algorithms (``{algorithm: the models its bundle holds}``). A method's family may score its own bundles
    (``Family.unseen_cells``, e.g. FedSM's routed super model); any other bundle's global model
    is scored on every case."""
    cfg = results.trained_cfg  # model.name planned: the planned network and data settings
    data = unseen_caseset(fed, site, cfg)
    task = Task.of(cfg, fed)
    rows: list[dict] = []
    skipped: dict[str, list[str]] = {}
    for algo in results.algorithms:
        base = {
            "algorithm": algo.name,
            "unseen_site": site,
            "cases": len(data),
            "run": run,
            "converged": converged_cell(algo.summary),
            "training_sites": results.federation.site_names,
            "case_ids": list(data.ids),
            "regions": list(task.regions),
        }
        spec = get_algorithm(algo.name)
        hook = spec.family.unseen_cells if spec.family else None
        cells = hook(algo.bundle, data, task, spec.parse_options(cfg.methods.get(algo.name))) if hook else None
        if cells is not None:
            rows.append({**base, **flat_frequencies(cells)})
        elif "global" in algo.bundle:
            model = task.new_model()
            load_weights(model, algo.bundle["global"])
            dice = candidate_dice([model], data, cfg.eval, task.device, task.scored_regions)[0]
            rows.append(
                {
                    **base,
                    "mode": "single",
                    "dice": site_dice(dice, data.ids, site, task.regions),
                    "case_dice": dice.tolist(),
                }
            )
        else:
            skipped[algo.name] = sorted(algo.bundle)
    return rows, skipped


def flat_frequencies(cells: dict) -> dict:
    """``freq: {"global": f, site: f}`` of a row (and of each point of its ``curve``) as the table's
    ``freq_GM`` and ``freq_PM_<site>`` columns."""
    out = {k: v for k, v in cells.items() if k not in ("freq", "curve")}
    freq = cells.get("freq", {})
    if freq:
        out[GM] = freq["global"]
        out.update({pm_column(s): f for s, f in freq.items() if s != "global"})
    if "curve" in cells:
        out["curve"] = [flat_frequencies(p) for p in cells["curve"]]
    return out
