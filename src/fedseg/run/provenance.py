"""Provenance of a run (``summary.json`` ``provenance``): versions, git commit, host, device, times.

Collecting it never fails a run: whatever cannot be found (git, a package) is recorded as None."""

from __future__ import annotations

import json
import platform
import socket
import subprocess
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import fedseg

# The command line, set by the ``fedseg`` CLI (``fedseg.cli``); None when fedseg is used as a library.
COMMAND_LINE: list[str] | None = None
# Where a run keeps its first start and its resumes between processes (read on ``--resume``).
RECORD = ".provenance.json"


def utc_now() -> str:
    """The current UTC time, ISO 8601 to the second (``2024-05-01T12:00:00Z``)."""
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_utc(text: str) -> datetime:
    return datetime.strptime(text, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC)


def package_version(module: str) -> str | None:
    """``module.__version__`` when the process has imported it, else its distribution's version (the same string
    for torch, MONAI, flwr and numpy; no import: a plain run need not load flwr, 0.2 s with grpc and ssl, for a
    version), else (a distribution of another name, e.g. a nightly build) the module's ``__version__`` after
    importing it; None when it is not installed."""
    import sys
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as dist_version

    version = getattr(sys.modules.get(module), "__version__", None)
    if version is None:
        try:
            version = dist_version(module)
        except PackageNotFoundError:
            try:
                version = getattr(__import__(module), "__version__", None)
            except Exception:  # noqa: BLE001 - any import failure: not usable here
                return None
    return None if version is None else str(version)


def versions() -> dict[str, str | None]:
    return {
        "fedseg": fedseg.__version__,
        "python": platform.python_version(),
        **{name: package_version(name) for name in ("torch", "monai", "flwr", "numpy")},
    }


def _git_bytes(args: list[str], cwd: Path) -> bytes | None:
    """What ``git ARGS`` prints in ``cwd``, as bytes (a diff of a latin-1 file is no UTF-8); None where git is
    missing, fails or takes more than 5 s."""
    try:
        done = subprocess.run(["git", *args], cwd=cwd, capture_output=True, timeout=5, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout if done.returncode == 0 else None


def _git(args: list[str], cwd: Path) -> str | None:
    out = _git_bytes(args, cwd)
    return None if out is None else out.decode("utf-8", errors="replace")


def package_dir() -> Path:
    """The folder of the fedseg package this process runs."""
    return Path(fedseg.__file__).resolve().parent


def git_state(path: Path | None = None) -> tuple[str | None, bool | None]:
    """(commit, dirty) of the git checkout holding ``path`` (default: the fedseg package), ``dirty``: uncommitted edits
    or untracked files in ``path``'s folder (the package's own, not the repository's docs); (None, None) when it is
    not a checkout or git is missing, and for the package when git does not track it there (fedseg installed into
    a virtual environment inside a project's own repository: that commit says nothing of fedseg's code)."""
    where = path or package_dir()
    head = _git(["rev-parse", "HEAD"], where)
    if head is None or not head.strip():
        return None, None
    if path is None and _git(["ls-files", "--error-unmatch", "__init__.py"], where) is None:
        return None, None
    status = _git(["status", "--porcelain", "--", "."], where)  # the package's own edits (not a README's)
    return head.strip(), (bool(status.strip()) if status is not None else None)


def source_state() -> dict[str, Any]:
    """fedseg's own code as a run records it: ``version``, the git ``commit`` and ``dirty`` flag of the checkout it
    runs from (None, None for an installed package), and for a dirty checkout ``changes``, the SHA-256 of the
    package folder's uncommitted edits (``git diff HEAD`` of its tracked files, then the contents of its untracked
    ones; None for a clean checkout), so two states with the same commit tell whether fedseg's edits differ (edits
    elsewhere in the repository, docs or benchmarks, do not count)."""
    import hashlib

    commit, dirty = git_state()
    changes = None
    if dirty:
        where = package_dir()
        diff = _git_bytes(["diff", "HEAD", "--", "."], where)
        untracked = _git_bytes(["ls-files", "--others", "--exclude-standard", "-z", "--", "."], where)
        if diff is not None and untracked is not None:
            digest = hashlib.sha256(diff)
            for name in sorted(n for n in untracked.split(b"\0") if n):
                digest.update(b"\0" + name + b"\0")
                try:
                    digest.update((where / name.decode("utf-8", errors="surrogateescape")).read_bytes())
                except OSError:
                    digest.update(b"<unreadable>")
            changes = digest.hexdigest()
    return {"version": fedseg.__version__, "commit": commit, "dirty": dirty, "changes": changes}


def source_text(state: dict[str, Any]) -> str:
    """``fedseg 0.1.0 at commit 1a2b3c4d5e6f with uncommitted changes`` for a :func:`source_state`."""
    commit = state.get("commit")
    return (
        f"fedseg {state.get('version')}"
        + (f" at commit {str(commit)[:12]}" if commit else "")
        + (" with uncommitted changes" if state.get("dirty") else "")
    )


def begin(out: Path, resume: bool, device: str) -> dict[str, Any]:
    """The provenance of a run starting (or resuming) now; keeps the first start and records every
    resume in ``OUT/.provenance.json`` (read back on ``--resume``)."""
    now = utc_now()
    started, resumes, extended = now, [], []
    record = Path(out) / RECORD
    if resume:
        try:
            previous = json.loads(record.read_text())
            started, resumes = str(previous["start"]), [*previous.get("resumes", []), now]
            extended = list(previous.get("extended", []))
        except (OSError, ValueError, KeyError, TypeError):
            pass  # no record (e.g. a run of an older fedseg): this resume counts as the start
    try:
        from fedseg.atomic_files import atomic_write_text

        kept = {"start": started, "resumes": resumes, **({"extended": extended} if extended else {})}
        atomic_write_text(record, json.dumps(kept))
    except OSError:
        pass
    import torch

    commit, dirty = git_state()
    return {
        **versions(),
        "commit": commit,
        "dirty": dirty,
        "hostname": socket.gethostname(),
        "device": device,
        "threads": torch.get_num_threads(),
        "command": list(COMMAND_LINE) if COMMAND_LINE is not None else None,
        "start": started,
        "resumes": resumes,
        **({"extended": extended} if extended else {}),  # each resume that added rounds (record_extension)
    }


def record_extension(out: Path, before: int, after: int, algorithms: list[str]) -> None:
    """Record in ``OUT/.provenance.json`` (summary.json's ``provenance.extended`` once the run ends) that a resume
    extended the run from ``before`` to ``after`` rounds (``fl.rounds``), continuing ``algorithms``."""
    from fedseg.atomic_files import atomic_write_text

    record = Path(out) / RECORD
    try:
        previous = json.loads(record.read_text())
        if not isinstance(previous, dict):
            previous = {}
    except (OSError, ValueError):
        previous = {}
    entry = {"from": before, "to": after, "at": utc_now(), "algorithms": algorithms}
    previous["extended"] = [*previous.get("extended", []), entry]
    atomic_write_text(record, json.dumps(previous))


def unchanged(out: Path) -> dict[str, Any] | None:
    """The provenance recorded in ``OUT/summary.json``, for a resumed call that trains nothing (every algorithm
    finished): it keeps that run's end and wall time and records no resume (each such call used to add itself
    as a resume and the idle time since the run ended to its wall time). None when there is none to keep."""
    try:
        prov = json.loads((Path(out) / "summary.json").read_text())["provenance"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return prov if isinstance(prov, dict) and "end" in prov and "start" in prov else None


def finish(prov: dict[str, Any]) -> dict[str, Any]:
    """``prov`` (from :func:`begin`) with the end time (now) and the wall seconds since the first start
    (a resumed run's pauses included); one that has ended already (:func:`unchanged`) as it is."""
    if "end" in prov:
        return prov
    end = utc_now()
    wall = (datetime.now(UTC) - parse_utc(prov["start"])).total_seconds()
    return {**prov, "end": end, "wall_seconds": round(wall, 3)}


def version_text() -> str:
    """``fedseg --version``: fedseg's version, then the versions of what it runs on."""
    v = versions()
    deps = ", ".join(f"{name} {v[name] or 'not installed'}" for name in ("torch", "monai", "flwr"))
    return f"fedseg {v['fedseg']}\n{deps}, python {v['python']}"
