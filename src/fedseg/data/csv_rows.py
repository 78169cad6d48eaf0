"""Reading the small CSV files of a federation (``cases.csv``, ``splits.csv``, importers' partition files)."""

from __future__ import annotations

import csv
from dataclasses import dataclass
from pathlib import Path

from fedseg.data.federation import FederationError


@dataclass(frozen=True)
class CsvRows:
    """A CSV file without its blank rows: ``header`` (cells stripped) on row ``header_line``, then ``rows``
    as ``(cells stripped, row number)``; row numbers count from 1 and include the blank rows skipped."""

    path: Path
    header: list[str]
    header_line: int
    rows: list[tuple[list[str], int]]


def read_csv_rows(path: str | Path, expected: str) -> CsvRows:
    """Read ``path`` (UTF-8, a BOM allowed) as a header and its rows, skipping rows whose cells are all blank.

    ``FederationError("<path>: cannot read (...)")`` for an unreadable file, ``"<path>: empty file,
    expected <expected>"`` when no row is left (``expected`` describes the header, e.g. ``a header case,split``).
    """
    path = Path(path)
    try:
        with path.open(newline="", encoding="utf-8-sig") as f:
            lines = [
                ([cell.strip() for cell in row], n + 1)
                for n, row in enumerate(csv.reader(f))
                if any(cell.strip() for cell in row)
            ]
    except (OSError, UnicodeDecodeError, csv.Error) as e:
        raise FederationError(f"{path}: cannot read ({type(e).__name__}: {e})") from None
    if not lines:
        raise FederationError(f"{path}: empty file, expected {expected}")
    (header, header_line), rows = lines[0], lines[1:]
    return CsvRows(path, header, header_line, rows)
