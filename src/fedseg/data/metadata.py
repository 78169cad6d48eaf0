"""Site- and case-level metadata: what it may hold, how it is stored, what a site answers about it.

Metadata describes the data (the tumour grade, the scanner vendor, the patient a slice comes
from); it is never a model input unless a method says so. Splits keep a case-level ``group``
together (``fedseg.data.splits``); methods such as prior clustering read a key with
``SiteData.metadata_value``.

- **Site-level**, ``federation.yaml``: an optional ``sites:`` mapping, site name -> mapping
  key -> scalar (string, integer, float or boolean), kept with its YAML type in ``Site.meta``.
  Sites not listed have no site-level metadata.
- **Case-level**, ``<site>/cases.csv`` (optional): a header row with a ``case`` column and any
  other columns, then one row per case of that site. Values are kept as strings (stripped) in
  ``Case.meta``; an empty cell means *no value*. Cases not listed have no case-level metadata.
  The column names ``image``, ``label``, ``image_shape`` and ``_unannotated`` are reserved (``FILE_META_KEYS``).
- ``group`` (case-level) names the unit that must stay within one split, e.g. the patient or
  volume a 2D slice was cut from.

::

    # federation.yaml
    sites:
      site1: {grade: LGG, vendor: Siemens}
      site2: {grade: HGG}

    # site1/cases.csv
    case,group,grade
    s1_000,patient07,LGG
    s1_001,patient07,LGG
    s1_002,patient09,
"""

from __future__ import annotations

import csv
import datetime
from collections import Counter
from collections.abc import Collection, Iterable, Mapping
from pathlib import Path

import numpy as np

from fedseg.data.csv_rows import read_csv_rows, unknown_case
from fedseg.data.federation import FILE_META_KEYS, Case, Federation, FederationError, Site

CASES_FILE = "cases.csv"
CASE_COLUMN = "case"
GROUP = "group"
SCALAR_TYPES = (str, int, float, bool)


def _kind_of(value: object) -> str:
    """How to name a non-scalar YAML value in a message."""
    if value is None:
        return "null (write '' for an empty string)"
    if isinstance(value, list | tuple):
        return "a list"
    if isinstance(value, Mapping):
        return "a mapping"
    if isinstance(value, datetime.date | datetime.datetime):
        return f"a date ({value}; quote it to keep it as text)"
    return f"a {type(value).__name__}"


def scalar_problem(value: object) -> str | None:
    """``None`` if ``value`` is a metadata scalar (str, int, float, bool), else what is wrong with it."""
    if isinstance(value, SCALAR_TYPES):
        return None
    return f"must be a scalar (string, number or boolean), got {_kind_of(value)}"


def site_metadata_problems(sites: object, site_names: Collection[str] | None = None) -> list[str]:
    """Problems of ``federation.yaml``'s ``sites:`` value, one line each, starting with the field
    (``sites.site1.grade: ...``; the caller adds the file). With ``site_names`` (the site folders),
    a site that is not among them is a problem."""
    if not isinstance(sites, Mapping):
        return [f"sites: expected a mapping site name -> {{key: value}}, got {sites!r}"]
    problems = []
    for name, meta in sites.items():
        if site_names is not None and str(name) not in site_names:
            known = ", ".join(sorted(site_names)) or "none"
            problems.append(f"sites.{name}: no such site folder (sites are {known})")
        if meta is None:
            continue
        if not isinstance(meta, Mapping):
            problems.append(f"sites.{name}: expected a mapping key -> value (string, number or boolean), got {meta!r}")
            continue
        for key, value in meta.items():
            if not (isinstance(key, str) and key.strip()):
                problems.append(f"sites.{name}: key {key!r} must be a non-empty string (quote it)")
                continue
            problem = scalar_problem(value)
            if problem:
                problems.append(f"sites.{name}.{key}: {problem}")
    return problems


def read_site_metadata(sites: Mapping | None) -> dict[str, dict[str, object]]:
    """A validated ``sites:`` value -> ``{site name: {key: value}}`` (sites with no keys left out)."""
    return {str(name): dict(meta) for name, meta in (sites or {}).items() if meta}


def _plain(value: object, where: str) -> str | int | float | bool:
    """``value`` as a Python scalar (NumPy scalars unwrapped); ``FederationError`` naming ``where`` otherwise."""
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, SCALAR_TYPES):
        return value
    raise FederationError(f"{where}: {scalar_problem(value)}")


def site_metadata_for_yaml(site: Site) -> dict[str, str | int | float | bool]:
    """``site.meta`` ready for ``federation.yaml`` (plain scalars); ``FederationError`` for a bad key or value."""
    out = {}
    for key, value in site.meta.items():
        if not (isinstance(key, str) and key.strip()):
            raise FederationError(f"site {site.name!r}: metadata key {key!r} must be a non-empty string")
        out[key] = _plain(value, f"site {site.name!r}: metadata {key!r}")
    return out


# --- cases.csv ---------------------------------------------------------------------------------


def read_cases_csv(path: str | Path, case_ids: Collection[str] | None = None) -> dict[str, dict[str, str]]:
    """Read a site's ``cases.csv`` -> ``{case id: {column: value}}`` (non-empty values only; every
    listed case appears, possibly with no columns).

    The header must name a ``case`` column; column names must be non-empty, distinct and not
    reserved. Every problem (bad header; a row with more cells than the header, an empty,
    duplicate or, given ``case_ids``, unknown case id) is collected and raised together as one
    ``FederationError``, one ``"<path>:<line>: <problem>"`` line each.
    """
    table = read_csv_rows(path, f"a header with a {CASE_COLUMN!r} column")
    path, header, header_line = table.path, table.header, table.header_line
    at = f"{path}:{header_line}"
    problems = []
    if CASE_COLUMN not in header:
        problems.append(
            f"{at}: missing column {CASE_COLUMN!r} (header is {','.join(header)}; "
            f"expected {CASE_COLUMN} plus any other columns)"
        )
    for i, name in enumerate(header):
        if not name:
            problems.append(f"{at}: empty column name (column {i + 1})")
        elif name in FILE_META_KEYS:
            problems.append(f"{at}: column {name!r} is reserved (fedseg keeps the case's files there); rename it")
        elif name in header[:i]:
            problems.append(f"{at}: duplicate column {name!r} (columns {header.index(name) + 1} and {i + 1})")
    if problems:
        raise FederationError("\n".join(problems))
    index = header.index(CASE_COLUMN)
    known = None if case_ids is None else set(case_ids)
    rows: dict[str, dict[str, str]] = {}
    first_seen: dict[str, int] = {}
    for cells, line in table.rows:
        if len(cells) > len(header):
            problems.append(
                f"{path}:{line}: {len(cells)} cells but the header has {len(header)} columns "
                "(quote values that contain commas)"
            )
            continue
        case = cells[index] if index < len(cells) else ""
        if not case:
            problems.append(f"{path}:{line}: empty {CASE_COLUMN!r}")
            continue
        if known is not None and case not in known:
            problems.append(f"{path}:{line}: {unknown_case(case, known)}")
        if case in first_seen:
            problems.append(f"{path}:{line}: duplicate case {case!r} (first on line {first_seen[case]})")
            continue
        first_seen[case] = line
        rows[case] = {name: value for name, value in zip(header, cells) if name != CASE_COLUMN and value}
    if problems:
        raise FederationError("\n".join(problems))
    return rows


def site_case_metadata(site: Site) -> dict[str, dict[str, object]]:
    """``{case id: Case.metadata}`` for the cases of ``site`` that have any (``None`` values dropped)."""
    out = {}
    for case in site.cases:
        meta = {k: v for k, v in case.metadata.items() if v is not None}
        if meta:
            out[case.id] = meta
    return out


def cases_csv_table(site: Site) -> list[list[str]]:
    """``site``'s case-level metadata as ``cases.csv`` rows: the header (``case`` first, then the columns
    in order of first appearance), then one row per case that has any (a missing value is an empty
    cell); ``[]`` when no case has metadata. ``FederationError`` for a key or value that cannot be written."""
    rows = site_case_metadata(site)
    if not rows:
        return []
    columns: list[str] = []
    for meta in rows.values():
        for key in meta:
            if key in columns:
                continue
            if not (isinstance(key, str) and key.strip() and key == key.strip()) or key == CASE_COLUMN:
                raise FederationError(f"site {site.name!r}: case metadata key {key!r} cannot be a cases.csv column")
            columns.append(key)
    table = [[CASE_COLUMN, *columns]]
    for cid, meta in rows.items():
        where = f"site {site.name!r}: case {cid!r}: metadata"
        table.append([cid, *(str(_plain(meta[k], f"{where} {k!r}")) if k in meta else "" for k in columns)])
    return table


def write_cases_csv(path: str | Path, site: Site) -> bool:
    """Write ``site``'s case-level metadata as ``cases.csv`` (see ``cases_csv_table``); writes nothing and
    returns ``False`` when no case has metadata."""
    table = cases_csv_table(site)
    if not table:
        return False
    with Path(path).open("w", newline="", encoding="utf-8") as f:
        csv.writer(f, lineterminator="\n").writerows(table)
    return True


# --- questions about the metadata ------------------------------------------------------------------


def _has_value(value: object) -> bool:
    return value is not None and str(value).strip() != ""


def case_groups(cases: Iterable[Case]) -> dict[str, str]:
    """``{case id: group}`` for the cases with a non-empty case-level ``group`` value (as a string)."""
    return {c.id: str(c.meta[GROUP]) for c in cases if _has_value(c.meta.get(GROUP))}


def metadata_value(
    site: str, key: str, site_meta: Mapping[str, object], case_meta: Mapping[str, Mapping[str, object]]
) -> str:
    """What site ``site`` says about ``key``, as a string: its site-level value if it has one, else the
    most common non-empty value of the case-level column ``key`` over its cases (``case_meta``:
    case id -> columns), ties going to the smallest value in string order; a ``ValueError`` naming the
    keys it has when neither exists. A pure function of its arguments."""
    if key in site_meta and site_meta[key] is not None:
        return str(site_meta[key])
    counts = Counter(str(cols[key]) for cols in case_meta.values() if _has_value(cols.get(key)))
    if counts:
        return min(counts, key=lambda value: (-counts[value], value))
    keys = sorted(set(site_meta) | {k for cols in case_meta.values() for k, v in cols.items() if _has_value(v)})
    has = f"keys it has: {', '.join(keys)}" if keys else "it has no metadata"
    raise ValueError(
        f"site {site!r} has no metadata {key!r} (neither in federation.yaml sites.{site} "
        f"nor in {site}/{CASES_FILE}); {has}"
    )


def metadata_summary(fed: Federation) -> str | None:
    """One line naming the metadata keys present and how many sites / cases have each, or ``None`` if none:
    ``metadata: site-level grade (2/3 sites); case-level group (40/60 cases)``."""
    site_keys: Counter[str] = Counter()
    case_keys: Counter[str] = Counter()
    for site in fed.sites:
        site_keys.update(k for k, v in site.meta.items() if v is not None)
        for case in site.cases:
            case_keys.update(k for k, v in case.metadata.items() if _has_value(v))
    if not site_keys and not case_keys:
        return None
    n_sites, n_cases = len(fed.sites), sum(len(s.cases) for s in fed.sites)
    parts = []
    if site_keys:
        parts.append("site-level " + ", ".join(f"{k} ({n}/{n_sites} sites)" for k, n in sorted(site_keys.items())))
    if case_keys:
        parts.append("case-level " + ", ".join(f"{k} ({n}/{n_cases} cases)" for k, n in sorted(case_keys.items())))
    return "metadata: " + "; ".join(parts)
