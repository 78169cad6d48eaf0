"""Reading the small CSV files of a federation (``cases.csv``, ``splits.csv``, importers' partition files)."""

from __future__ import annotations

import csv
import unicodedata
from collections.abc import Collection
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


def normal_form(name: str) -> str:
    """``NFC``, ``NFD`` or ``mixed``: how ``name``'s accented letters are spelt (``é`` as one character, NFC as typed on
    Linux or Windows, or ``e`` + a combining accent, NFD as macOS writes file names)."""
    return next((form for form in ("NFC", "NFD") if unicodedata.is_normalized(form, name)), "mixed")


def unknown_case(case: str, known: Collection[str]) -> str:
    """Why the case id ``case`` of a row of a site's CSV file names none of the site's cases ``known``: unknown, or,
    where one of them differs from it only in Unicode normalisation (``Müller`` typed on Linux, the file named on a
    Mac), that, with the spelling of each: the two print alike, so "unknown case 'Müller'" beside a case 'Müller'
    would say nothing. The case ids are the files' names as they are, and the row must spell one so."""
    nfc = unicodedata.normalize("NFC", case)
    twin = next((k for k in known if unicodedata.normalize("NFC", k) == nfc), None)
    if twin is None:
        return f"unknown case {case!r} (no such image in this site)"
    return (
        f"case {case!r} ({normal_form(case)}) differs from the site's case {twin!r} ({normal_form(twin)}) only in "
        "Unicode normalisation (names typed on another system than the files'?), so it names no case; spell it as "
        "the case's files are named"
    )
