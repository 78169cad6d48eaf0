"""Reading the files a page is drawn from, each problem one ``ValueError`` naming the file and what is wrong.

A run's, a study's or a bench's files may be damaged (a disk fault, a copy cut short) or edited by hand; the
pages must then stop with one line saying which file and why (``fedseg report`` prints it), never draw a page of
"–" as if the numbers were missing, nor fail later somewhere inside a table with a bare ``KeyError``:

* :func:`read_text`: UTF-8 text (``PATH: not UTF-8 text (at byte offset N)``);
* :func:`read_json`: a JSON object (``PATH: empty``, ``PATH: not valid JSON (...)``, ``PATH: not a JSON object
  but a list``);
* :func:`read_csv`: rows as dicts, checked against the columns the caller indexes (``PATH: no column 'case'
  (its header: ...)``), every row as long as the header (``PATH: line 9 has 4 fields, the header 7 (cut
  short?)``) and the number columns numbers (``PATH: line 9: value 'abc' is not a number``);
* :func:`load_npz`: the ``.npz`` files of a folder; an unreadable one is left out (and listed: the page says so);
* :func:`check_summary`: ``summary.json``'s shape (``PATH: algorithms.fedavg.dice is null, not an object``).

A missing optional file is not an error: :func:`read_csv` gives ``[]`` and the page leaves its sections out.
"""

from __future__ import annotations

import csv
import io
import json
import math
import zipfile
import zlib
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from fedseg.atomic_files import read_text

__all__ = ["REWRITE_HINT", "check_summary", "kind_of", "load_npz", "read_csv", "read_json", "read_text"]

#: what makes a run's damaged ``summary.json`` again
REWRITE_HINT = "`fedseg run` with the run's command and --resume writes it again"


def kind_of(value: object) -> str:
    """``value`` as a reader names it: "null", "a list", "an empty list", "an object", "a string ('x')", "a number
    (3)"."""
    if value is None:
        return "null"
    if isinstance(value, Mapping):
        return "an object"
    if isinstance(value, list):
        return "a list" if value else "an empty list"
    if isinstance(value, bool):
        return f"a yes/no value ({str(value).lower()})"
    kind = "a string" if isinstance(value, str) else "a number" if isinstance(value, int | float) else "a value"
    return f"{kind} ({str(value)[:40]!r})" if isinstance(value, str) else f"{kind} ({value})"


def read_json(path: Path, hint: str = "") -> dict[str, Any]:
    """``path`` parsed as a JSON object; a ValueError naming it (and ``hint``: what writes it again) when it is not
    UTF-8, empty, not valid JSON, or valid JSON of another kind (a list, a number)."""
    after = f"; {hint}" if hint else ""
    text = read_text(path)  # not UTF-8: its message names the file
    if not text.strip():
        raise ValueError(f"{path}: empty (a copy cut short?){after}")
    try:
        content = json.loads(text)
    except ValueError as e:  # JSONDecodeError
        raise ValueError(f"{path}: not valid JSON ({e}){after}") from None
    if not isinstance(content, dict):
        raise ValueError(f"{path}: not a JSON object but {kind_of(content)}{after}")
    return content


def read_csv(
    path: Path, columns: Iterable[str] = (), numbers: Mapping[str, Callable[[str], object]] | None = None
) -> list[dict]:
    """CSV rows as dicts of strings; ``[]`` when the file does not exist.

    A ValueError naming ``path`` when it is not UTF-8 text or not CSV, has none of a header or lacks one of
    ``columns`` (those the caller indexes), when a row has more or fewer fields than the header (a file cut short
    mid-row), or when a non-blank cell of a column of ``numbers`` (``{column: int | float}``) is not such a number.
    """
    path = Path(path)
    if not path.is_file():
        return []
    text = read_text(path)
    need = list(columns)
    try:
        reader = csv.DictReader(io.StringIO(text, newline=""))
        header = reader.fieldnames or []
        if need and not header:
            raise ValueError(f"{path}: empty, without a header (expected the columns {','.join(need)})")
        if missing := [c for c in need if c not in header]:
            raise ValueError(f"{path}: no column {missing[0]!r} (its header: {','.join(header)[:200]})")
        rows = []
        for row in reader:
            if None in row or None in row.values():  # more fields than the header / fewer
                fields = len(row) - 1 + len(row[None]) if None in row else sum(v is not None for v in row.values())
                short = " (cut short?)" if fields < len(header) else ""
                raise ValueError(f"{path}: line {reader.line_num} has {fields} fields, the header {len(header)}{short}")
            _check_numbers(path, reader.line_num, row, numbers or {})
            rows.append(row)
    except csv.Error as e:
        raise ValueError(f"{path}: not a CSV table ({e})") from None
    return rows


def _check_numbers(path: Path, line: int, row: dict, numbers: Mapping[str, Callable[[str], object]]) -> None:
    for column, kind in numbers.items():
        cell = (row.get(column) or "").strip()
        try:
            if cell:
                kind(cell)
        except ValueError:
            what = "a whole number" if kind is int else "a number"
            raise ValueError(f"{path}: line {line}: {column} {cell[:40]!r} is not {what}") from None


def load_npz(
    folder: Path, pattern: str, required: set[str], skipped: list[Path] | None = None
) -> dict[str, dict[str, np.ndarray]]:
    """``{file stem: arrays}`` of the ``.npz`` files in ``folder`` matching ``pattern`` that hold the ``required``
    arrays; unreadable files (damaged, cut short, not an ``.npz``) are skipped, and appended to ``skipped`` when
    given: they hold what a figure shows, which the page can leave out and say so."""
    out = {}
    for path in sorted(folder.glob(pattern)) if folder.is_dir() else []:
        try:
            with np.load(path, allow_pickle=False) as z:
                arrays = {k: z[k] for k in z.files}
        except (OSError, ValueError, EOFError, zipfile.BadZipFile, zlib.error):
            if skipped is not None:
                skipped.append(path)
            continue
        if required <= arrays.keys():
            out[path.stem] = arrays
    return out


# --------------------------------------------------------------------------- summary.json
#: the keys of a method's summary.json entry the pages read as objects, with how many levels of objects they
#: nest (``cross_site``: metric -> model's site -> test site -> number)
ENTRY_OBJECTS = {
    "dice": 1,
    "hd95": 1,
    "nsd": 1,
    "cost": 1,
    "convergence": 1,
    "privacy": 1,
    "selected_rounds": 1,
    "train_samples": 1,
    "site_models": 1,
    "cross_site": 3,
}
ENTRY_COUNTS = ("rounds", "best_round")  # whole numbers where present


def check_summary(summary: dict[str, Any], path: Path) -> dict[str, Any]:
    """``summary`` (a run's ``summary.json``, read from ``path``) if it has the shape the pages read: ``sites`` a
    non-empty list of names, ``regions`` (if any) a list, ``algorithms`` an object of one object per finished
    method whose :data:`ENTRY_OBJECTS` are objects and :data:`ENTRY_COUNTS` whole numbers; else a ValueError
    naming the file and the first field that is wrong."""

    def wrong(field: str, value: object, expected: str) -> ValueError:
        what = f"no {field} ({expected})" if value is _MISSING else f"{field} is {kind_of(value)}, not {expected}"
        return ValueError(f"{path}: {what}; {REWRITE_HINT}")

    sites = summary.get("sites", _MISSING)
    if not isinstance(sites, list) or not sites or not all(isinstance(s, str) for s in sites):
        raise wrong("sites", sites, "a list of the federation's site names")
    regions = summary.get("regions", [])
    if not isinstance(regions, list) or not all(isinstance(r, str) for r in regions):
        raise wrong("regions", regions, "a list of region names")
    algorithms = summary.get("algorithms", _MISSING)
    if not isinstance(algorithms, dict):
        raise wrong("algorithms", algorithms, "an object of each finished method's results")
    for name, entry in algorithms.items():
        if not isinstance(entry, dict):
            raise wrong(f"algorithms.{name}", entry, "an object of the method's results")
        for key, levels in ENTRY_OBJECTS.items():
            if key in entry and (bad := _not_objects(entry[key], f"algorithms.{name}.{key}", levels)):
                raise wrong(*bad, "an object")
        for key in ENTRY_COUNTS:
            if key in entry and not _whole(entry[key]):
                raise wrong(f"algorithms.{name}.{key}", entry[key], "a whole number")
    return summary


_MISSING = object()


def _whole(value: object) -> bool:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return False
    return isinstance(value, int) or (math.isfinite(value) and value.is_integer())


def _not_objects(value: object, field: str, levels: int) -> tuple[str, object] | None:
    """``(field, value)`` of the first of ``levels`` nested levels of ``value`` that is not an object, else None."""
    if not isinstance(value, dict):
        return field, value
    if levels > 1:
        for key, inner in value.items():
            if bad := _not_objects(inner, f"{field}.{key}", levels - 1):
                return bad
    return None
