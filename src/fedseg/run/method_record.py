"""What each method of a run resolved its options to, recorded when the run starts and checked when it resumes.

``config.yaml`` keeps the keys the user gave, so a resume compares those (``fedseg.run.preflight.check_resume``), but
a method's defaults can change under the same configuration: a registered method's code edited between the
interruption and the resume (``momentum: float = 0.9`` now ``0.0``), another version of fedseg. Resuming then
would train the remaining rounds with other options than the first ones, without a word. So a run writes
``OUT/.methods.json`` at its start: for each algorithm, every option as its options model resolved it
(``AlgorithmSpec.parse_options(cfg.methods.get(name)).model_dump(mode="json")``), and for a registered method the
digest of its own code (:func:`code_digest`). A resume refuses to continue an algorithm that has trained in the
run (its checkpoint exists) whose resolved options differ, naming each ``option: recorded -> now``
(:func:`check_method_options`); an option the method did not have when the run started is not compared (a method
that gains one keeps its behaviour at the new option's default). A changed code digest is a warning line, not a
refusal (:func:`code_notes`): the digest covers the functions of the method's server and client classes only, and
any edit there counts (a fix, a log line), so it says what to look at, without forbidding it. A method installed as
a package records its package's name and version too; another version on resume is a warning line as well
(:func:`plugin_notes`). So does fedseg's own code (``fedseg``: its version, git commit and uncommitted edits,
``fedseg.run.provenance.source_state``): a resume under another version or commit, or other edits, is one warning
line naming the methods it continues (:func:`fedseg_notes`; a built-in method's code is fedseg's).

A run recorded before this record existed (no file) resumes as before; the record then starts with that resume. An
algorithm that has not trained yet is recorded as it resolves now (nothing of it ran with the old options).
"""

from __future__ import annotations

import enum
import hashlib
import json
import math
import sys
from pathlib import Path
from types import CodeType
from typing import Any

from fedseg.algorithms import get_algorithm, plugin_records
from fedseg.atomic_files import atomic_write_text, read_text
from fedseg.config import RunConfig
from fedseg.engine.own_code import own_code
from fedseg.run.preflight import shown_value
from fedseg.run.provenance import source_state, source_text
from fedseg.run.resume import checkpoint_path, is_finished

RECORD = ".methods.json"
PYTHON = f"{sys.version_info[0]}.{sys.version_info[1]}"  # bytecode (the code digest) differs between versions


def resolved_options(cfg: RunConfig, name: str) -> dict[str, Any]:
    """Every option of algorithm ``name`` in ``cfg`` as its options model resolves it (defaults included), as JSON
    reads it back and the same in every process (:func:`comparable`)."""
    options = get_algorithm(name).parse_options(cfg.methods.get(name))
    resolved: dict[str, Any] = json.loads(json.dumps(comparable(options.model_dump()), default=str))
    return resolved


def comparable(value: object) -> object:
    """``value`` as strict JSON that compares equal whenever the values are: a set's items sorted (its order
    follows string hashing, which differs between processes), a tuple as a list, NaN and infinities as the strings
    ``"nan"``/``"inf"``/``"-inf"`` (NaN equals no number, and strict JSON has none)."""
    if isinstance(value, dict):
        return {str(k): comparable(v) for k, v in value.items()}
    if isinstance(value, set | frozenset):
        return sorted((comparable(v) for v in value), key=repr)
    if isinstance(value, list | tuple):
        return [comparable(v) for v in value]
    if isinstance(value, enum.Enum):  # its value, as JSON mode records it
        return comparable(value.value)
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, str | int | float | bool) or value is None:
        return value
    return str(value)


def code_digest(name: str) -> str | None:
    """A digest of the bytecode of algorithm ``name``'s own code (``fedseg.engine.own_code.own_code`` of its server
    and client: the functions that are neither fedseg's nor a library's), its constants and names, not its line
    numbers or comments; None for a method without any (a built-in one: fedseg's version says its code)."""
    spec = get_algorithm(name)
    codes = own_code(spec.server, spec.client)
    if not codes:
        return None
    digest = hashlib.sha256()
    for text in sorted(_code_text(code) for code in codes):
        digest.update(text.encode())
    return digest.hexdigest()


def _code_text(code: CodeType) -> str:
    fields = (
        code.co_qualname,
        code.co_code.hex(),
        tuple(_constant(c) for c in code.co_consts),
        code.co_names,
        code.co_varnames,
        code.co_freevars,
        code.co_cellvars,
        code.co_argcount,
        code.co_kwonlyargcount,
    )
    return repr(fields)


def _constant(value: object) -> object:
    if isinstance(value, CodeType):  # nested functions are digested on their own (own_code includes them)
        return f"<code {value.co_qualname}>"
    if isinstance(value, frozenset):  # its order follows string hashing, which differs between processes
        return ("frozenset", sorted(repr(_constant(v)) for v in value))
    if isinstance(value, tuple):
        return tuple(_constant(v) for v in value)
    return repr(value)


def method_record(cfg: RunConfig) -> dict[str, dict[str, Any]]:
    """``{algorithm: {"options": resolved options, "code": digest or None, "python": "3.11", "plugin":
    {"distribution", "version"} or None}}`` for ``cfg`` (``plugin``: the installed package a method comes from)."""
    plugins = plugin_records(cfg.algorithms)
    source = source_state()
    return {
        name: {
            "options": resolved_options(cfg, name),
            "code": code_digest(name),
            "python": PYTHON,
            "plugin": plugins.get(name),
            "fedseg": source,
        }
        for name in cfg.algorithms
    }


def read_record(out: Path) -> dict[str, dict[str, Any]] | None:
    """The record of the run in ``out``, or None without one (a run of an older fedseg) or an unreadable one (a
    record is fedseg's own, written atomically: nothing to compare then, as without one)."""
    path = Path(out) / RECORD
    if not path.is_file():
        return None
    try:
        record = json.loads(read_text(path))
    except (OSError, ValueError):
        return None
    if not isinstance(record, dict):
        return None
    return {k: v for k, v in record.items() if isinstance(v, dict) and isinstance(v.get("options"), dict)}


def started(out: Path, name: str) -> bool:
    """Whether algorithm ``name`` has trained in the run in ``out`` (its checkpoint exists: half-done or finished)."""
    return checkpoint_path(Path(out), name).is_file()


def option_changes(recorded: dict[str, Any], now: dict[str, Any]) -> list[str]:
    """``option: recorded -> now`` for every recorded option whose value differs now (``<none>``: the method no
    longer has it); options added since are not compared."""
    lines = []
    for key in sorted(recorded):
        if key not in now:
            lines.append(f"{key}: {shown_value(recorded[key])} -> <none>")
        elif now[key] != recorded[key]:
            lines.append(f"{key}: {shown_value(recorded[key])} -> {shown_value(now[key])}")
    return lines


def check_method_options(out: Path, cfg: RunConfig) -> None:
    """A ValueError, in one line, where an algorithm of ``cfg`` that has trained in the run in ``out`` now resolves
    its options to other values than the run recorded at its start (the configuration being the same, checked
    before: its method's defaults changed). Nothing to check without a record."""
    record = read_record(out)
    if record is None:
        return
    changed = []
    for name in cfg.algorithms:
        if name in record and started(out, name):
            lines = option_changes(record[name]["options"], resolved_options(cfg, name))
            if lines:
                changed.append(f"{name} ({', '.join(lines)})")
    if changed:
        raise ValueError(
            f"{Path(out) / RECORD}: cannot resume: {'; '.join(changed)}: the options differ from those the run "
            "trained with (it would mix the two) while the configuration is the same, so the method's defaults "
            "changed: another version of its code, or of fedseg, than the run started with; resume with that "
            "version, or start a new run (another --out)"
        )


def code_notes(out: Path, cfg: RunConfig) -> list[str]:
    """A warning line for each registered method of ``cfg`` that has half-done training in the run in ``out`` and
    whose own code (:func:`code_digest`) differs from the code recorded at the run's start (same Python only)."""
    record = read_record(out) or {}
    notes = []
    for name in cfg.algorithms:
        recorded = record.get(name) or {}
        before = recorded.get("code")
        if before is None or recorded.get("python") != PYTHON or not started(out, name):
            continue
        if code_digest(name) != before and not is_finished(checkpoint_path(Path(out), name)):
            spec = get_algorithm(name)
            notes.append(
                f"warning: {name}: the code of {spec.server.__name__} or {spec.client.__name__} differs from the code "
                "the run started with (a digest of their functions): the rounds trained now run the new code; if it "
                "changes what the method computes, the run mixes two versions (start a new run, another --out)"
            )
    return notes


def plugin_notes(out: Path, cfg: RunConfig) -> list[str]:
    """A warning line for each method of ``cfg`` installed as a package (``fedseg.method_plugins``) that has half-done
    training in the run in ``out`` and whose package's version differs from the one recorded at the run's start (or
    that no longer comes from that package). A note, not a refusal, as for another fedseg version: a new version may
    be a fix that leaves the numbers as they were; what it would change silently, its options' defaults, is refused
    by :func:`check_method_options`. The line goes to the run's log; ``.methods.json`` keeps the version the method
    started with, ``summary.json``'s provenance and the model card the one that finished it."""
    record = read_record(out) or {}
    now = plugin_records(cfg.algorithms)
    notes = []
    for name in cfg.algorithms:
        before = (record.get(name) or {}).get("plugin")
        after = now.get(name)
        if not before or before == after or not started(out, name):
            continue
        if is_finished(checkpoint_path(Path(out), name)):
            continue  # its rounds are all trained: nothing runs the new version
        was = f"{before.get('distribution')} {before.get('version')}"
        is_now = f"{after['distribution']} {after['version']}" if after else "no installed package"
        notes.append(
            f"warning: {name}: the run started with its method package {was}, this process has {is_now}: the rounds "
            f"trained now run that version; if it changes what the method computes, the run mixes two versions "
            f"(install {was} to resume as it started, or start a new run, another --out)"
        )
    return notes


def same_source(before: dict[str, Any], now: dict[str, Any]) -> bool:
    """Whether two :func:`~fedseg.run.provenance.source_state` are the same code, as far as they tell: the version,
    the commit where both know one, and the uncommitted edits (their digest) where both are checkouts."""
    if before.get("version") != now.get("version"):
        return False
    if before.get("commit") is None or now.get("commit") is None:
        return True  # an installed package: its version says its code
    return before.get("commit") == now.get("commit") and before.get("changes") == now.get("changes")


def fedseg_notes(out: Path, cfg: RunConfig) -> list[str]:
    """One warning line when methods of ``cfg`` with half-done training in the run in ``out`` started under other
    fedseg code than this process runs (another version, commit or uncommitted edits: :func:`same_source`): the rounds
    trained now run this code, and a fix between the two (a resampling, a metric) would mix two versions in one run
    without a word. A note, not a refusal (most commits change nothing a run computes); nothing for a record written
    before it held fedseg's state."""
    record = read_record(out) or {}
    now = source_state()
    moved: dict[str, list[str]] = {}
    for name in cfg.algorithms:
        before = (record.get(name) or {}).get("fedseg")
        if not isinstance(before, dict) or same_source(before, now) or not started(out, name):
            continue
        if not is_finished(checkpoint_path(Path(out), name)):
            moved.setdefault(source_text(before), []).append(name)
    return [
        f"warning: {', '.join(names)} started under {was} and {'continue' if len(names) > 1 else 'continues'} under "
        f"{source_text(now)}: the rounds trained now run this code; if it changes what is computed, the run mixes two "
        "versions (resume with the code it started with, or start a new run, another --out)"
        for was, names in moved.items()
    ]


def write_record(out: Path, cfg: RunConfig) -> None:
    """Write ``out/.methods.json`` for ``cfg``: the recorded entry kept for every algorithm that has trained in the
    run (a resume checked it), the entry of now for the others."""
    recorded = read_record(out) or {}
    now = method_record(cfg)
    kept = {name: recorded[name] for name in cfg.algorithms if name in recorded and started(out, name)}
    atomic_write_text(Path(out) / RECORD, json.dumps({**now, **kept}, indent=1, sort_keys=True))
