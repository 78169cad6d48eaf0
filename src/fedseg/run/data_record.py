"""The files of a run's federation folder, recorded when the run starts and checked when it resumes.

``--resume`` compares the configuration (``fedseg.run.preflight.check_resume``), but a federation folder can change
under the same configuration: a label corrected, a case added or removed. Resuming then would train the remaining
rounds (and test) on other images than the finished ones, and mix the two in one table. So a run on a federation
folder writes ``OUT/.data-files.json`` at its start: every file of the folder (``federation.yaml``, each site's
images, labels, ``splits.csv`` and ``cases.csv``; links followed) with its size in bytes and modification time in
ns, without what the readers skip (``folder_entries.ignored_entry``: hidden files, and Windows Explorer's
``Thumbs.db`` and ``desktop.ini``, which Explorer writes by merely showing a folder, so they would make a resume
refuse unchanged data). A resume reads the folder again and refuses to continue if any file was changed, added or
removed, naming them.

Sizes and times, not contents: a stat per file costs nothing even for thousands of volumes, where hashing their
contents would read the whole dataset at every start. A copy that does not keep modification times (``cp -r``
without ``-p``) therefore looks changed; the message says how to accept the data as it is now (delete the record).
A built-in federation needs no list of files: the configuration (source, scale, size, seed) determines its images;
nor does a folder inside ``OUT`` (fedseg's own output: ``fedseg flower local`` writes a built-in federation there at
every start). A run folder inside the data folder is left out of the record.

A federation given by user code (``Experiment(..., federation=fed)``, or a builder registered under
``data.source``) is recorded by the fingerprint of its arrays (``fedseg.data.user_federation``), and ``data`` in the
record says where the data came from (``folder``, ``memory`` or ``config``; a record without it is a folder's), so a
resume given other data, or data from elsewhere (an in-memory run resumed without its federation would otherwise
train on the config's built-in ``data.source``), is refused (:func:`check_data_origin`).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from fedseg.atomic_files import atomic_write_text, strict_json_text
from fedseg.data.folder_entries import ignored_entry
from fedseg.wording import listed

RECORD = ".data-files.json"
SHOWN = 3  # files named in the message, per kind of change


def folder_files(root: Path, leave_out: Path | None = None) -> dict[str, list[int]]:
    """``{path relative to root: [size in bytes, modification time in ns]}`` of every file under ``root``, the
    entries no reader takes for data left out (``folder_entries.ignored_entry``: hidden files and folders, Windows' junk
    files), and ``leave_out`` (the run's own folder, when it lies inside the data), links followed (an imported
    federation links to its source files)."""
    files: dict[str, list[int]] = {}
    skip = None if leave_out is None else Path(leave_out).resolve()
    for folder, subfolders, names in os.walk(root, followlinks=True):
        subfolders[:] = sorted(d for d in subfolders if not ignored_entry(d) and (Path(folder) / d).resolve() != skip)
        for name in sorted(names):
            if ignored_entry(name):
                continue
            path = Path(folder) / name
            try:
                stat = path.stat()
            except OSError:  # a broken link: the federation check names it
                continue
            files[path.relative_to(root).as_posix()] = [stat.st_size, stat.st_mtime_ns]
    return files


def watched(out: Path, root: str | Path | None) -> Path | None:
    """The federation folder a run's record covers: ``root``, unless there is none (a built-in federation) or it
    lies inside ``out`` (fedseg wrote it there, e.g. ``fedseg flower local`` writes a built-in federation to
    ``OUT/flower/federation`` at every start: its own output, not the researcher's data)."""
    if root is None:
        return None
    folder = Path(root).resolve()
    return None if folder.is_relative_to(Path(out).resolve()) else folder


def record_data_files(out: Path, root: str | Path | None, fingerprint: str | None = None) -> None:
    """Write ``out/.data-files.json``: the files of the federation folder ``root``, the ``fingerprint`` of a
    federation from user code, or that the configuration determines the data (a built-in federation)."""
    if fingerprint is not None:
        record: dict[str, object] = {"data": "memory", "fingerprint": fingerprint}
    elif (folder := watched(out, root)) is None:
        record = {"data": "config"}
    else:
        record = {"data": "folder", "root": str(folder), "files": folder_files(folder, leave_out=out)}
    atomic_write_text(Path(out) / RECORD, strict_json_text(record))


ORIGINS = {
    "folder": "a federation folder",
    "memory": "a federation given by your code (federation=, or a registered builder)",
    "config": "the configuration's built-in data.source",
}


def _origin(out: Path, root: str | Path | None, fingerprint: str | None) -> str:
    return "memory" if fingerprint is not None else ("config" if watched(out, root) is None else "folder")


def _read_record(record_path: Path) -> dict[str, Any]:
    try:
        record = json.loads(record_path.read_text())
        if not isinstance(record, dict):
            raise TypeError
        return record
    except (OSError, ValueError, TypeError):
        raise ValueError(f"{record_path}: unreadable; delete it to resume with the data as it is now") from None


def check_data_origin(out: Path, root: str | Path | None, fingerprint: str | None) -> None:
    """On ``--resume``, once the data is loaded: a ValueError if it comes from elsewhere than the run's record says
    (a folder, user code, the config), or, from user code, is not the same (another fingerprint). Nothing to compare
    without a record (a run of an older fedseg)."""
    record_path = Path(out) / RECORD
    if not record_path.is_file():
        return
    record = _read_record(record_path)
    then, now = record.get("data", "folder"), _origin(out, root, fingerprint)
    if then != now:
        raise ValueError(
            f"{out}: this run started on {ORIGINS.get(then, then)}, not {ORIGINS[now]}; resuming would mix results "
            "of two datasets: resume it with the same data (an in-memory federation: pass it again), or start a new "
            "run (another out)"
        )
    if now == "memory" and record.get("fingerprint") != fingerprint:
        raise ValueError(
            f"{out}: the federation given is not the one this run started on (other sites, case ids, spacing or "
            "arrays); resuming would mix results of two datasets: pass the same federation, or start a new run "
            "(another out)"
        )


def changes(recorded: dict[str, list[int]], now: dict[str, list[int]]) -> list[str]:
    """``changed: a, b`` / ``added: c`` / ``removed: d`` (each at most ``SHOWN`` names, then how many more), for the
    files whose size or time differ, that are new, or that are gone."""
    kinds = {
        "changed": [f for f in recorded if f in now and now[f] != recorded[f]],
        "added": [f for f in now if f not in recorded],
        "removed": [f for f in recorded if f not in now],
    }
    parts = []
    for kind, names in kinds.items():
        if names:
            parts.append(f"{kind}: {listed(names, SHOWN)}")
    return parts


def check_data_files(out: Path, root: str | Path | None) -> None:
    """On ``--resume``: a ValueError if the federation folder ``root`` is not as ``out``'s record says (a run of an
    older fedseg has no record: nothing to compare; a record is written when the run goes on)."""
    record_path = Path(out) / RECORD
    folder = watched(out, root)
    if folder is None or not record_path.is_file():
        return
    record = _read_record(record_path)
    if record.get("data", "folder") != "folder":  # the run started on other data: check_data_origin says so
        return
    recorded = record.get("files")
    if not isinstance(recorded, dict):
        raise ValueError(f"{record_path}: unreadable; delete it to resume with the data as it is now")
    recorded = {k: v for k, v in recorded.items() if not any(ignored_entry(part) for part in k.split("/"))}  # older
    found = changes(recorded, folder_files(folder, leave_out=out))  # records listed Windows' junk files too
    if found:
        raise ValueError(
            f"{root}: the data changed since this run started ({'; '.join(found)}); resuming would mix results of "
            f"two datasets: restore the files, or start a new run (another --out); if only their times changed "
            f"(a copy), delete {record_path} to resume with the data as it is now"
        )
