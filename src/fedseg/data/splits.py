"""Per-site train/val/test splits: ratio splits (FedSM), federated k-fold (FeTS), CSV I/O.

Splits are computed per site and depend only on ``(seed, site name, the site's case
ids and their groups)``: adding or removing a site never changes another site's split, and
the order in which a site lists its cases does not matter (case ids are sorted before
shuffling). A site's ``fixed_splits`` (its ``splits.csv`` in a folder federation) win over the
computed split; cases it does not list are split by the run's settings.

**Groups.** Cases with the same case-level ``group`` value (``cases.csv``; e.g. the patient a
slice comes from) always land in the same split and the same k-fold fold; a case without a
group is a group of its own. The site's groups (in order of their smallest case id) are
shuffled as single cases would be, and the shuffled sequence is cut at the group boundaries
nearest the case counts of the ratios (``ratio_counts``; k-fold: the near-equal fold sizes);
ties go to the earlier boundary, and every split (fold) with a positive target gets at least
one group as far as there are groups (train first, then val, then test). So the ratios hold as
closely as whole groups allow: a site with a few large groups can end up far from them
(``data check`` prints the counts).
Without groups (or with groups of one case) this is exactly the ungrouped split. A group with
cases in ``fixed_splits`` takes the fixed split of its smallest such case id for its other
cases (``load_folder`` and ``data check`` refuse a ``splits.csv`` that splits a group).

A *splits* mapping is ``{site name: {case id: "train" | "val" | "test"}}``.
"""

from __future__ import annotations

import csv
import hashlib
import math
from collections.abc import Collection, Iterable, Mapping, Sequence
from pathlib import Path
from typing import cast

import numpy as np

from fedseg.config import SplitConfig
from fedseg.data.csv_rows import read_csv_rows, unknown_case
from fedseg.data.federation import SPLITS, UNANNOTATED, Federation, FederationError, Site, Split
from fedseg.data.metadata import case_groups

Splits = dict[str, dict[str, Split]]


def _rng(seed: int, site: str, *salt: object) -> np.random.Generator:
    """A random stream that depends only on ``seed``, ``site`` and ``salt``
    (stable across runs and Python processes)."""
    key = "\x1f".join(str(part) for part in (seed, site, *salt)).encode()
    return np.random.default_rng(int.from_bytes(hashlib.sha256(key).digest()[:8], "little"))


def _units(case_ids: Iterable[str], groups: Mapping[str, str]) -> list[list[str]]:
    """The cases as units that are never split: the case ids of each group together, every case without
    a group alone; ids sorted within a unit, units in order of their smallest id."""
    units: dict[tuple[str, str], list[str]] = {}
    for cid in sorted(case_ids):
        units.setdefault(("group", groups[cid]) if cid in groups else ("case", cid), []).append(cid)
    return list(units.values())


def _shuffled(case_ids: Iterable[str], rng: np.random.Generator, groups: Mapping[str, str]) -> list[list[str]]:
    """The units of ``case_ids`` (see ``_units``) in random order; single cases without groups."""
    units = _units(case_ids, groups)
    return [units[i] for i in rng.permutation(len(units))]


def _cut_units(units: Sequence[list[str]], counts: Sequence[int]) -> list[list[str]]:
    """Cut the ordered ``units`` into ``len(counts)`` consecutive parts whose case counts approximate
    ``counts``: part ``j`` ends at the unit boundary nearest ``sum(counts[:j + 1])`` cases (ties: the
    earlier one). A part with count 0 stays empty; the parts with a positive count get at least one
    unit each, as far as there are units (the first parts first). Single-case units are cut at exactly
    ``counts``."""
    m = len(units)
    cum = [0]
    for unit in units:
        cum.append(cum[-1] + len(unit))
    required = [j for j, c in enumerate(counts) if c > 0][:m]  # parts that get at least one unit
    cuts = [0]
    for j in range(1, len(counts)):
        prev = cuts[-1]
        if counts[j - 1] == 0:
            cuts.append(prev)
        elif not any(counts[j:]):
            cuts.append(m)
        else:
            lo = prev + (1 if j - 1 in required else 0)
            hi = m - sum(1 for i in required if i >= j)
            target = sum(counts[:j])
            cuts.append(min(range(lo, hi + 1), key=lambda k: (abs(cum[k] - target), k)))
    cuts.append(m)
    return [[cid for unit in units[a:b] for cid in unit] for a, b in zip(cuts, cuts[1:])]


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


def _cut(ordered: list[list[str]], ratios: tuple[float, float, float]) -> dict[str, Split]:
    """Assign the ordered units to train, val and test in ``ratios`` (see ``_cut_units``): single cases
    get exactly ``ratio_counts``."""
    parts = _cut_units(ordered, ratio_counts(sum(len(u) for u in ordered), ratios))
    return {cid: split for split, part in zip(SPLITS, parts) for cid in part}


def kfold_assignment(
    case_ids: Iterable[str], folds: int, seed: int, site: str, groups: Mapping[str, str] | None = None
) -> dict[str, int]:
    """Assign each case id to one of ``folds`` near-equal folds (sizes differ by at most one).

    Deterministic from ``(seed, site)`` and the set of ids; independent of which fold is later
    used as test, so running folds ``0..folds-1`` uses every case as test exactly once. With
    ``groups`` (case id -> group), the cases of a group share a fold and fold sizes are as near
    equal as whole groups allow (see the module docstring).
    """
    if folds < 1:
        raise ValueError(f"folds must be >= 1, got {folds}")
    ordered = _shuffled(case_ids, _rng(seed, site, "kfold", folds), groups or {})
    n = sum(len(u) for u in ordered)
    sizes = [n // folds + (1 if k < n % folds else 0) for k in range(folds)]  # np.array_split's sizes
    return {cid: fold for fold, part in enumerate(_cut_units(ordered, sizes)) for cid in part}


def _computed_site_splits(
    case_ids: list[str], cfg: SplitConfig, seed: int, site: str, groups: Mapping[str, str]
) -> dict[str, Split]:
    if cfg.mode == "ratio":
        return _cut(_shuffled(case_ids, _rng(seed, site, "ratio"), groups), cfg.ratios)
    folds = kfold_assignment(case_ids, cfg.folds, seed, site, groups)
    rest = [cid for cid in case_ids if folds[cid] != cfg.fold]
    ordered = _shuffled(rest, _rng(seed, site, "trainval", cfg.folds, cfg.fold), groups)
    out = _cut(ordered, (cfg.train_fraction, 1 - cfg.train_fraction, 0.0))
    out.update({cid: "test" for cid in case_ids if folds[cid] == cfg.fold})
    return out


def site_splits(site: Site, cfg: SplitConfig, seed: int) -> dict[str, Split]:
    """Split one site: its ``fixed_splits`` win; the remaining cases are split by ``cfg``, the cases of
    one ``group`` together (a group with fixed cases follows them; see the module docstring).
    Keys follow ``site.cases`` order."""
    fixed = site.fixed_splits or {}
    ids = [c.id for c in site.cases]
    groups = case_groups(site.cases)
    fixed_group: dict[str, Split] = {}
    for cid in sorted(c for c in fixed if c in groups):
        fixed_group.setdefault(groups[cid], fixed[cid])
    follow = {cid: fixed_group[groups[cid]] for cid in ids if cid not in fixed and groups.get(cid) in fixed_group}
    free = [cid for cid in ids if cid not in fixed and cid not in follow]
    computed = _computed_site_splits(free, cfg, seed, site.name, groups)
    return {cid: fixed[cid] if cid in fixed else follow[cid] if cid in follow else computed[cid] for cid in ids}


def group_split_problems(splits: Mapping[str, str], groups: Mapping[str, str]) -> list[str]:
    """One line per group whose cases ``splits`` (case id -> split) puts in more than one split, naming
    the first case in each split: ``group 'p1' is split: 'a' train, 'b' test (its cases must share one split)``."""
    by_group: dict[str, dict[str, str]] = {}
    for cid in sorted(splits):
        if cid in groups:
            by_group.setdefault(groups[cid], {})[cid] = splits[cid]
    problems = []
    for group, cases in by_group.items():
        if len(set(cases.values())) > 1:
            first: dict[str, str] = {}
            for cid, split in cases.items():
                first.setdefault(split, cid)
            shown = ", ".join(f"{cid!r} {split}" for split, cid in first.items())
            problems.append(f"group {group!r} is split: {shown} (its cases must share one split)")
    return problems


def make_splits(fed: Federation, cfg: SplitConfig, seed: int) -> Splits:
    """Split every site of ``fed``: ``{site: {case id: "train" | "val" | "test"}}`` (see ``site_splits``)."""
    return {site.name: site_splits(site, cfg, seed) for site in fed.sites}


_SPLIT_WORDS = {"train": "training", "val": "validation", "test": "test"}


def split_problems(fed: Federation, splits: Splits) -> list[str]:
    """Problems of ``splits`` for ``fed``, one line each: a site without training, validation or test cases (a site
    of one case: training failed on its empty validation split; one without test cases failed the final evaluation,
    after all the training, in every method that scores per site), sites or cases not covered.

    With an ignore label (partial annotations) a case without an annotated voxel (``meta[UNANNOTATED]``, set by
    ``data check``) counts in no split: it trains nothing and gets no score, so a site whose validation cases are all
    such would have no Dice to select a round by (its per-site models stayed at round 1) and one whose training cases
    are all such would send an untrained model to be averaged."""
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
        unannotated = unannotated_ids(site)
        annotated = {s: counts[s] - sum(1 for cid in unannotated if assigned.get(cid) == s) for s in SPLITS}
        # training needs train; the round selection and the local models score every site's val; the final
        # evaluation every site's test
        empty = [s for s in SPLITS if annotated[s] == 0]
        if ids and empty:
            summary = ", ".join(f"{counts[s]} {s}" for s in SPLITS)
            if unannotated:
                summary += f"; {len(unannotated)} without an annotated voxel, counted in none"
            lacking = " and no ".join(_split_cases(s, counts[s] > 0) for s in empty)
            problems.append(
                f"site {site.name!r}: no {lacking} after splitting "
                f"({len(ids)} cases: {summary}); every trained site needs training, validation and test cases "
                "(more cases, another split, or a splits.csv)"
            )
    for name in sorted(set(splits) - set(fed.site_names)):
        problems.append(f"site {name!r}: in the splits but not in federation {fed.name!r}")
    return problems


def unannotated_ids(site: Site) -> set[str]:
    """The ids of ``site``'s cases that ``data check`` found without an annotated voxel (``meta[UNANNOTATED]``)."""
    return {c.id for c in site.cases if c.meta.get(UNANNOTATED)}


def split_sizes(site: Site, assigned: Mapping[str, Split]) -> dict[str, int]:
    """``{split: cases}`` of ``site`` under ``assigned`` (its case id -> split), as its data is loaded
    (``fedseg.data.dataset.build_site_data``): the training count leaves out the cases ``data check`` found without an
    annotated voxel (``meta[UNANNOTATED]``), which the site does not train on; validation and test count every case.
    What a site declares as its training-set size (its aggregation weight n_k) where it has not prepared its data."""
    unannotated = unannotated_ids(site)
    sizes: dict[str, int] = {s: sum(1 for v in assigned.values() if v == s) for s in SPLITS}
    sizes["train"] -= sum(1 for cid, v in assigned.items() if v == "train" and cid in unannotated)
    return sizes


def _split_cases(split: Split, unannotated: bool) -> str:
    """``"validation cases"``, or ``"annotated validation cases"`` where the split holds only unannotated ones."""
    return ("annotated " if unannotated else "") + _SPLIT_WORDS[split] + " cases"


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
    columns = (*keys, "split")
    table = read_csv_rows(path, f"a header {','.join(columns)}")
    path, header, header_line = table.path, table.header, table.header_line
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
    for row, line in table.rows:
        values = [row[i] if i < len(row) else "" for i in index]
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
        unknown = [f"{path}:{line}: {unknown_case(case, known)}" for (case,), _, line in rows if case not in known]
        if unknown:
            raise FederationError("\n".join(unknown))
    return {case: split for (case,), split, _ in rows}


def write_site_splits_csv(path: str | Path, splits: dict[str, Split]) -> None:
    """Write one site's splits as CSV with header ``case,split``."""
    with Path(path).open("w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f, lineterminator="\n")
        writer.writerow(["case", "split"])
        writer.writerows([case, split] for case, split in splits.items())
