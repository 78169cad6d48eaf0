"""Per-site train/val/test splits: ratio splits (FedSM), federated k-fold (FeTS), CSV I/O.

Splits are computed per site and depend only on ``(seed, site name, the site's case
ids)``: adding or removing a site never changes another site's split, and the order in
which a site lists its cases does not matter (case ids are sorted before shuffling).
A site's ``fixed_splits`` (its ``splits.csv`` in a folder federation) win over the
computed split; cases it does not list are split by the run's settings.

A *splits* mapping is ``{site name: {case id: "train" | "val" | "test"}}``.
"""

from __future__ import annotations

import csv
import hashlib
import math
from collections.abc import Collection, Iterable
from pathlib import Path
from typing import cast

import numpy as np

from fedseg.config import SplitConfig
from fedseg.data.federation import SPLITS, Federation, FederationError, Site, Split

Splits = dict[str, dict[str, Split]]


def _rng(seed: int, site: str, *salt: object) -> np.random.Generator:
    """A random stream that depends only on ``seed``, ``site`` and ``salt``
    (stable across runs and Python processes)."""
    key = "\x1f".join(str(part) for part in (seed, site, *salt)).encode()
    return np.random.default_rng(int.from_bytes(hashlib.sha256(key).digest()[:8], "little"))


def _shuffled(case_ids: Iterable[str], rng: np.random.Generator) -> list[str]:
    ids = sorted(case_ids)
    return [ids[i] for i in rng.permutation(len(ids))]


def ratio_counts(n: int, ratios: tuple[float, float, float]) -> tuple[int, int, int]:
    """Split ``n`` cases into three counts proportional to ``ratios`` (largest remainder rounding).

    When ``n`` is at least the number of positive ratios, every split with a positive ratio
    gets at least one case (taken from the largest split), e.g. ``n=3, (0.5, 0.25, 0.25) -> (1, 1, 1)``.
    """
    exact = [round(n * r, 9) for r in ratios]
    counts = [math.floor(x) for x in exact]
    by_remainder = sorted(range(3), key=lambda i: (-(exact[i] - counts[i]), i))
    for i in by_remainder[: n - sum(counts)]:
        counts[i] += 1
    if n >= sum(r > 0 for r in ratios):
        for i in range(3):
            if ratios[i] > 0 and counts[i] == 0:
                largest = max(range(3), key=lambda k: counts[k])
                counts[largest] -= 1
                counts[i] += 1
    return counts[0], counts[1], counts[2]


def _cut(ordered: list[str], counts: tuple[int, int, int]) -> dict[str, Split]:
    """Assign the first ``counts[0]`` ids to train, the next ``counts[1]`` to val, the rest to test."""
    n_train, n_val, _ = counts
    return {
        cid: ("train" if i < n_train else "val" if i < n_train + n_val else "test") for i, cid in enumerate(ordered)
    }


def kfold_assignment(case_ids: Iterable[str], folds: int, seed: int, site: str) -> dict[str, int]:
    """Assign each case id to one of ``folds`` near-equal folds (sizes differ by at most one).

    Deterministic from ``(seed, site)`` and the set of ids; independent of which fold is later
    used as test, so running folds ``0..folds-1`` uses every case as test exactly once.
    """
    if folds < 1:
        raise ValueError(f"folds must be >= 1, got {folds}")
    ordered = _shuffled(case_ids, _rng(seed, site, "kfold", folds))
    return {
        cid: int(fold)
        for fold, chunk in enumerate(np.array_split(np.array(ordered, dtype=object), folds))
        for cid in chunk
    }


def _computed_site_splits(case_ids: list[str], cfg: SplitConfig, seed: int, site: str) -> dict[str, Split]:
    if cfg.mode == "ratio":
        ordered = _shuffled(case_ids, _rng(seed, site, "ratio"))
        return _cut(ordered, ratio_counts(len(ordered), cfg.ratios))
    folds = kfold_assignment(case_ids, cfg.folds, seed, site)
    rest = [cid for cid in case_ids if folds[cid] != cfg.fold]
    ordered = _shuffled(rest, _rng(seed, site, "trainval", cfg.folds, cfg.fold))
    out = _cut(ordered, ratio_counts(len(ordered), (cfg.train_fraction, 1 - cfg.train_fraction, 0.0)))
    out.update({cid: "test" for cid in case_ids if folds[cid] == cfg.fold})
    return out


def site_splits(site: Site, cfg: SplitConfig, seed: int) -> dict[str, Split]:
    """Split one site: its ``fixed_splits`` win; the remaining cases are split by ``cfg``.
    Keys follow ``site.cases`` order."""
    fixed = site.fixed_splits or {}
    ids = [c.id for c in site.cases]
    computed = _computed_site_splits([cid for cid in ids if cid not in fixed], cfg, seed, site.name)
    return {cid: fixed[cid] if cid in fixed else computed[cid] for cid in ids}


def make_splits(fed: Federation, cfg: SplitConfig, seed: int) -> Splits:
    """Split every site of ``fed``: ``{site: {case id: "train" | "val" | "test"}}`` (see ``site_splits``)."""
    return {site.name: site_splits(site, cfg, seed) for site in fed.sites}


def split_problems(fed: Federation, splits: Splits) -> list[str]:
    """Problems of ``splits`` for ``fed``, one line each: a site without training cases, sites or cases not covered."""
    problems = []
    for site in fed.sites:
        assigned = splits.get(site.name)
        if assigned is None:
            problems.append(f"site {site.name!r}: not in the splits")
            continue
        ids = {c.id for c in site.cases}
        unknown = sorted(set(assigned) - ids)
        missing = sorted(ids - set(assigned))
        if unknown:
            problems.append(f"site {site.name!r}: splits name unknown cases {_preview(unknown)}")
        if missing:
            problems.append(f"site {site.name!r}: {len(missing)} cases have no split, e.g. {_preview(missing)}")
        counts = {s: sum(1 for cid, v in assigned.items() if v == s and cid in ids) for s in SPLITS}
        if ids and counts["train"] == 0:
            summary = ", ".join(f"{counts[s]} {s}" for s in SPLITS)
            problems.append(f"site {site.name!r}: no training cases after splitting ({len(ids)} cases: {summary})")
    for name in sorted(set(splits) - set(fed.site_names)):
        problems.append(f"site {name!r}: in the splits but not in federation {fed.name!r}")
    return problems


def check_splits(fed: Federation, splits: Splits) -> None:
    """Raise ``FederationError`` listing every problem of ``split_problems`` (e.g. a site with no training cases)."""
    problems = split_problems(fed, splits)
    if problems:
        raise FederationError("\n".join(problems))


def _preview(items: list[str], limit: int = 5) -> str:
    shown = ", ".join(repr(x) for x in items[:limit])
    return shown + (f", ... ({len(items)} in all)" if len(items) > limit else "")


# --- CSV -------------------------------------------------------------------------------------


def _read_split_rows(path: Path, keys: tuple[str, ...]) -> list[tuple[tuple[str, ...], Split, int]]:
    """Read a split CSV with columns ``keys + ("split",)`` -> ``[(key values, split, line number)]``.

    Every problem (missing column, empty value, unknown split, duplicate key) is collected and
    raised together as one ``FederationError``, one ``"<path>:<line>: <problem>"`` line each.
    """
    path = Path(path)
    columns = (*keys, "split")
    try:
        with path.open(newline="", encoding="utf-8-sig") as f:
            lines = [(row, n + 1) for n, row in enumerate(csv.reader(f)) if any(cell.strip() for cell in row)]
    except (OSError, UnicodeDecodeError, csv.Error) as e:
        raise FederationError(f"{path}: cannot read ({type(e).__name__}: {e})") from None
    if not lines:
        raise FederationError(f"{path}: empty file, expected a header {','.join(columns)}")
    header, header_line = [cell.strip() for cell in lines[0][0]], lines[0][1]
    missing = [c for c in columns if c not in header]
    if missing:
        raise FederationError(
            f"{path}:{header_line}: missing column {', '.join(repr(c) for c in missing)} "
            f"(header is {','.join(header)}; expected {','.join(columns)})"
        )
    index = [header.index(c) for c in columns]
    rows: list[tuple[tuple[str, ...], Split, int]] = []
    problems: list[str] = []
    first_seen: dict[tuple[str, ...], int] = {}
    for row, line in lines[1:]:
        values = [row[i].strip() if i < len(row) else "" for i in index]
        empty = [c for c, v in zip(columns, values) if not v]
        if empty:
            problems.append(f"{path}:{line}: empty {', '.join(repr(c) for c in empty)}")
            continue
        key, split = tuple(values[:-1]), values[-1]
        if split not in SPLITS:
            problems.append(f"{path}:{line}: unknown split {split!r} (expected one of {', '.join(SPLITS)})")
        if key in first_seen:
            what = " ".join(f"{c} {v!r}" for c, v in zip(keys, key))
            problems.append(f"{path}:{line}: duplicate {what} (first on line {first_seen[key]})")
        else:
            first_seen[key] = line
        rows.append((key, cast(Split, split), line))  # rows are returned only when every split is in SPLITS
    if problems:
        raise FederationError("\n".join(problems))
    return rows


def read_splits_csv(path: str | Path) -> Splits:
    """Read a federation-wide split file with header ``site,case,split``."""
    splits: Splits = {}
    for (site, case), split, _ in _read_split_rows(Path(path), ("site", "case")):
        splits.setdefault(site, {})[case] = split
    return splits


def write_splits_csv(path: str | Path, splits: Splits) -> None:
    """Write ``splits`` as CSV with header ``site,case,split`` (sites and cases in mapping order)."""
    with Path(path).open("w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f, lineterminator="\n")
        writer.writerow(["site", "case", "split"])
        for site, cases in splits.items():
            writer.writerows([site, case, split] for case, split in cases.items())


def read_site_splits_csv(path: str | Path, case_ids: Collection[str] | None = None) -> dict[str, Split]:
    """Read a site's ``splits.csv`` (header ``case,split``); with ``case_ids``, unknown cases are errors."""
    path = Path(path)
    rows = _read_split_rows(path, ("case",))
    if case_ids is not None:
        known = set(case_ids)
        unknown = [
            f"{path}:{line}: unknown case {case!r} (no such image in this site)"
            for (case,), _, line in rows
            if case not in known
        ]
        if unknown:
            raise FederationError("\n".join(unknown))
    return {case: split for (case,), split, _ in rows}


def write_site_splits_csv(path: str | Path, splits: dict[str, Split]) -> None:
    """Write one site's splits as CSV with header ``case,split``."""
    with Path(path).open("w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f, lineterminator="\n")
        writer.writerow(["case", "split"])
        writer.writerows([case, split] for case, split in splits.items())
