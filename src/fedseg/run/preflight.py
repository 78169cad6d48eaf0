"""Checks made before a run does any work (nothing is created when one fails):

* ``check_device``: ``device`` parses and this torch can use it (CUDA / MPS available, index in range);
* ``check_out_dir``: ``--out`` is a folder or can become one (not a file, not under a file); ``check_out_kind``:
  it holds no other kind of folder (a study's, a bench's, a federation's); ``check_out_outside``: it lies outside the
  federation folder (``folder_root``: the one a configuration names);
* ``resume_conflicts`` / ``check_resume``: the one comparison of a run's (or study's) recorded
  configuration with the new one. On resume every key must be equal except:

  - ``threads`` (torch intra-op threads), ``name`` (a label; the MLflow experiment), ``tracking`` and
    ``tracking_uri`` (where metrics are copied to; ``fedseg.tracking``), ``engine.workers``, ``engine.state``
    and ``engine.memory_budget_mb`` (how many processes answer, where client states wait), ``train.loader_workers``
    and ``data.prepare_threads`` (threads preparing batches and cases): they cannot change results;
  - ``algorithms`` may be extended at the end (the recorded list a prefix of the new one): the finished
    methods are reused, the new ones run after them;
  - ``methods.<name>`` of an algorithm the recorded run does not train (each algorithm reads only its own
    options: a preset that gains FedSM options must not refuse the resume of a FedAvg run, and a method appended
    on resume may be given its own).

  - ``fl.rounds`` may grow on a run's resume (not a study's) when nothing else changes: the run continues to more
    rounds where that trains as a run configured with them from the start would (``fedseg.run.extend`` checks it,
    in one line otherwise).

  Anything else (``train.lr``, ``device``, ``data.*``, ...) would mix results of two
  configurations, so the resume is refused with every differing key as ``key: recorded -> new``. The keys not
  given, a method's options at their defaults, are compared by ``fedseg.run.method_record`` (a method's defaults
  may change under the same configuration)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from fedseg.atomic_files import check_out_dir as check_out_dir  # --out checks live with the file helpers

if TYPE_CHECKING:
    import torch

    from fedseg.config import RunConfig

MAY_DIFFER_ON_RESUME = (
    "threads",  # said when it does (resume_notes): the numbers then differ in their last digits
    "train.loader_workers",  # results do not depend on it (tests/test_accel.py)
    "data.prepare_threads",  # nor on this (tests/test_prepare_threads.py)
    "name",
    "tracking",
    "tracking_uri",
    "engine.workers",
    "engine.state",
    "engine.memory_budget_mb",
)


def check_device(name: str, cpu: str = "device: cpu (--set device=cpu)") -> torch.device:
    """``torch.device(name)`` after checking that this torch can use it; a ValueError naming ``device``
    and what to do otherwise (``cpu``: how the command is told to use the CPU)."""
    import torch

    try:
        device = torch.device(name)
    except (RuntimeError, TypeError, ValueError):
        raise ValueError(f"device {name!r}: not a torch device; use cpu, cuda, cuda:N or mps ({cpu})") from None
    fix = f"or use {cpu}"
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(
                f"device {name!r}: this torch ({torch.__version__}) has no CUDA (or sees no GPU); install a CUDA "
                f"build of torch (see https://pytorch.org/get-started/locally/) {fix}"
            )
        count = torch.cuda.device_count()
        if device.index is not None and device.index >= count:
            raise ValueError(f"device {name!r}: this machine has {count} CUDA device(s) (cuda:0..cuda:{count - 1})")
    elif device.type == "mps":
        if not torch.backends.mps.is_available():
            raise ValueError(f"device {name!r}: MPS (Apple GPU) is not available to this torch {fix}")
    elif device.type != "cpu":
        raise ValueError(f"device {name!r}: fedseg runs on cpu, cuda[:N] or mps {fix}")
    return device


STUDY_FILE = "study.json"  # a study's record (fedseg.studies): the folder holding it is a study's, not a run's

#: the files that say what a folder holds: each command writes its own kind of output folder and refuses another's
#: (a run's report.html or results.csv written into a bench's folder, or a run's outputs among a federation's site
#: folders, would destroy what was there)
FOLDER_MARKS = {
    "run": ("config.yaml", "checkpoints"),
    "study": (STUDY_FILE,),
    "bench": ("bench.json", "tables.json"),
    "federation": ("federation.yaml",),
}
RESUME_STUDY = "resume it with the same study options (--sweep, --holdout or --leave-one-out) or choose another --out"


def check_out_kind(out: Path, kind: str) -> None:
    """A FileExistsError where ``out`` holds another kind of folder than ``kind`` (:data:`FOLDER_MARKS`: a run's,
    a study's, a bench's, or a federation's own data), naming the file that says so."""
    for other, marks in FOLDER_MARKS.items():
        mark = next((m for m in marks if (Path(out) / m).exists()), None) if other != kind else None
        if mark is None:
            continue
        if other == "federation":
            raise FileExistsError(
                f"{out}: is a federation folder ({mark}): the {kind}'s files would join its sites' data; choose "
                "an --out outside it"
            )
        hint = RESUME_STUDY if other == "study" and kind == "run" else "choose another --out"
        raise FileExistsError(f"{out}: holds a {other} ({mark}), not a {kind}; {hint}")


def folder_root(cfg: RunConfig) -> str | None:
    """``cfg.data.root`` if the data is a federation folder, None for a built-in federation."""
    if cfg.data.source == "folder" or cfg.data.root:
        if not cfg.data.root:
            raise ValueError("data.source is 'folder' but data.root is not set (use --data ROOT)")
        return cfg.data.root
    return None


def check_out_outside(out: Path, data: str | Path | None) -> None:
    """A FileExistsError where ``out`` lies inside the federation folder ``data`` (``--data``, ``data.root``): its
    files would sit among the sites' folders, where ``fedseg data check`` and the next run read them."""
    if data is not None and Path(out).resolve().is_relative_to(Path(data).resolve()):
        raise FileExistsError(
            f"{out}: lies inside the federation folder {data} (--data or data.root): its files would join the "
            "sites' data; choose an --out outside it"
        )


def _flat(d: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    flat = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict) and v:
            flat.update(_flat(v, key + "."))
        else:
            flat[key] = v
    return flat


def shown_value(v: object) -> str:
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(map(shown_value, v)) + "]"
    if v is None:
        return "null"
    if isinstance(v, bool):
        return str(v).lower()
    return str(v)


_UNSET = object()


def resume_conflicts(recorded: dict[str, Any], new: dict[str, Any], rounds_may_grow: bool = False) -> list[str]:
    """``key: recorded -> new`` (dotted keys, sorted) for every difference that forbids resuming ``recorded``
    with ``new`` (both ``RunConfig.model_dump(mode="json")``-like dicts); see the module docstring.
    ``rounds_may_grow``: a larger ``fl.rounds`` as the only difference is no conflict (a run's resume checks it:
    ``fedseg.run.extend``)."""
    from fedseg.config_load import without_idle_methods

    ran = recorded.get("algorithms", [])  # the options of an algorithm the run has not trained change nothing in it
    old_flat, new_flat = _flat(without_idle_methods(recorded, ran)), _flat(without_idle_methods(new, ran))
    lines = []
    for key in sorted(set(old_flat) | set(new_flat)):
        a, b = old_flat.get(key, _UNSET), new_flat.get(key, _UNSET)
        if a == b or key in MAY_DIFFER_ON_RESUME:
            continue
        if key == "algorithms" and isinstance(a, list) and isinstance(b, list) and b[: len(a)] == a:
            continue  # methods appended at the end
        before, after = ("<unset>" if v is _UNSET else shown_value(v) for v in (a, b))
        lines.append(f"{key}: {before} -> {after}")
    grown = [line for line in lines if line.startswith("fl.rounds:") and _more_rounds(recorded, new)]
    if rounds_may_grow and lines == grown:
        return []  # only more rounds: the run continues to them (fedseg.run.extend checks that it can)
    return lines


def _more_rounds(recorded: dict[str, Any], new: dict[str, Any]) -> bool:
    a, b = ((d.get("fl") or {}).get("rounds") if isinstance(d.get("fl"), dict) else None for d in (recorded, new))
    return isinstance(a, int) and isinstance(b, int) and b > a


GROW_ROUNDS = "\nfl.rounds alone may grow on resume: the run continues to more rounds if nothing else changes"
MORE_ROUNDS = (
    "\nto train a finished model for more rounds: a new run (another --out) of fedavg-continue starting from it, "
    "e.g. --algorithms fedavg-continue --set methods.fedavg-continue.start_from=OUT/model/fedavg "
    "--set methods.fedavg-continue.rounds=N (its optimizer and client states start afresh and each site keeps its own "
    "best round: not the numbers of one longer run)"
)


def resume_notes(recorded: dict[str, Any] | None, new: dict[str, Any]) -> list[str]:
    """What a resume allowed to differ from ``recorded`` changes in the numbers: another ``threads`` (torch sums
    in another order, so the rounds trained now are not bit-identical to an uninterrupted run's; a determinism
    audit measured a Dice 8e-6 apart at 64x64)."""
    before, now = (recorded or {}).get("threads"), new.get("threads")
    if before is None or before == now:
        return []
    return [
        f"resumed with threads {now}, the run started with {before}: the rounds trained now are not bit-identical to "
        f"an uninterrupted run's (torch sums in another order); resume with --threads {before} to keep them"
    ]


def check_resume(recorded: dict[str, Any], new: dict[str, Any], where: str, rounds_may_grow: bool = False) -> None:
    """A ValueError listing ``resume_conflicts`` (``where``: the file holding ``recorded``) if there are any."""
    lines = resume_conflicts(recorded, new, rounds_may_grow)
    if lines:
        raise ValueError(
            f"{where}: cannot resume with another configuration (it would mix results of the two); differs in:\n  "
            + "\n  ".join(lines)
            + f"\nuse the recorded values or another --out (may differ: {', '.join(MAY_DIFFER_ON_RESUME)}; "
            "algorithms may be appended at the end)"
            + (GROW_ROUNDS if rounds_may_grow and any(line.startswith("fl.rounds:") for line in lines) else "")
            + (MORE_ROUNDS if any(line.startswith("fl.rounds:") for line in lines) else "")
        )


def recorded_config(path: Path) -> dict[str, Any] | None:
    """The configuration recorded in a run's ``config.yaml`` (normalized through ``RunConfig``, so keys added
    by a later fedseg compare at their defaults, except ``data.seed``, which compares at the run seed that the
    old run's data came from, and method options whose default changed what the method does, which compare at
    the old behaviour, e.g. ``methods.fedper.private_unit: blocks``, and ``eval.score_on``, which compares at
    ``channels``: ``fedseg.config_load.with_recorded_defaults``); None without one."""
    from fedseg.config import RunConfig
    from fedseg.config_load import with_recorded_defaults

    if not path.is_file():
        return None
    from fedseg.atomic_files import read_text
    from fedseg.config_load import ConfigError, read_yaml_mapping

    try:
        data = read_yaml_mapping(read_text(path), str(path))
    except (ConfigError, ValueError) as e:  # not YAML (one line, naming its line), not UTF-8, not a mapping
        raise ValueError(f"{e}; cannot check the configuration to resume") from None
    data = with_recorded_defaults(data)
    try:
        return RunConfig.model_validate(data).model_dump(mode="json")
    except ValueError:  # pydantic's ValidationError: compare as written
        return data
