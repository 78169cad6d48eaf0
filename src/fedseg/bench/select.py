"""Hyper-parameters chosen on validation only (FeTS 2022 Table 4; FedSM Tables 6-7).

A method's grid is searched in the tuning cells; each setting's score is the mean, over its tuning runs, of the
run's selection score: the mean validation Dice over sites at its selected round (``convergence.best_val_dice`` in
``summary.json``). The setting with the highest score is selected (ties: the earlier one in grid order); test
scores of the tuning runs are reported next to it (:func:`tuning_rows`) and never used. One setting is selected
per (federation, method) for every fold, or, with ``tune.per_fold`` (nested tuning), per (federation, method,
fold) from that fold's tuning runs alone (``fedseg.bench.plan.selection_key``).

A selected value at the edge of its grid (the smallest or largest of a numeric key's values, :func:`edge_keys`) is
flagged (``at_edge``): the best value may lie outside the grid, so the grid should be extended before the result
is trusted. A tie (another setting scored the selected one's validation score exactly, :func:`selection_ties`) is
shown as one: validation did not prefer the setting the rule took, so its place at an edge is flagged only for a key
every tied setting shares (:func:`untied_edges`; a tie of ``lr=0.001`` and ``lr=0.003`` says nothing about the
smaller edge).
"""

from __future__ import annotations

import math
from collections import Counter

import numpy as np

from fedseg.atomic_files import json_number
from fedseg.bench.execute import Finished
from fedseg.bench.plan import (
    BenchRun,
    Holdouts,
    Selected,
    SelectionKey,
    Setting,
    selection_key,
    setting_label,
    settings,
)
from fedseg.bench.spec import BenchSpec, MethodSpec
from fedseg.evaluate.tables import nan_low
from fedseg.run.stopping import PLATEAU, recorded_not_converged


def validation_score(fin: Finished, algorithm: str) -> float:
    return json_number(fin.entry(algorithm).get("convergence", {}).get("best_val_dice"))


def test_score(fin: Finished, algorithm: str) -> float:
    return json_number(fin.entry(algorithm)["dice"].get("client_avg"))


def _mean(values: list[float]) -> float:
    finite = [v for v in values if np.isfinite(v)]
    return float(np.mean(finite)) if finite else math.nan


def setting_scores(bench: BenchSpec, tuning: dict[BenchRun, Finished]) -> dict[SelectionKey, dict]:
    """``{(federation, method): {setting: {"val": mean, "test": mean, "runs": n, "label": folder label,
    "plateau_stops": [the rounds at which the plateau rule stopped its tuning runs], "rounds": mean rounds trained,
    "sgd_steps": mean SGD steps (Eq. 34), "not_converged": how many of its runs may not have converged
    (``fedseg.run.stopping.recorded_not_converged``)}}}`` over the tuning runs; keyed (federation, method, fold)
    with ``tune.per_fold`` (``fedseg.bench.plan.selection_key``)."""
    scores: dict[SelectionKey, dict] = {}
    for run, fin in tuning.items():
        scored = bench.method(run.method).scored
        key = selection_key(bench, run.federation, run.method, run.fold)
        entry = scores.setdefault(key, {}).setdefault(
            run.setting,
            {"val": [], "test": [], "label": run.setting_label, "stops": [], "rounds": [], "steps": [], "late": 0},
        )  # label: with a settings_from setting
        entry["val"].append(validation_score(fin, scored))
        entry["test"].append(test_score(fin, scored))
        conv = fin.entry(scored).get("convergence", {})
        entry["rounds"].append(float(conv.get("rounds", math.nan)))
        entry["steps"].append(float(fin.entry(scored).get("cost", {}).get("sgd_steps", math.nan)))
        if conv.get("stopped") == PLATEAU:
            entry["stops"].append(int(conv.get("rounds", 0)))
        entry["late"] += recorded_not_converged(fin.entry(scored))
    return {
        key: {
            s: {
                "val": _mean(v["val"]),
                "test": _mean(v["test"]),
                "runs": len(v["val"]),
                "label": v["label"],
                "plateau_stops": sorted(v["stops"]),
                "rounds": _mean(v["rounds"]),
                "sgd_steps": _mean(v["steps"]),
                "not_converged": v["late"],
            }
            for s, v in per.items()
        }
        for key, per in scores.items()
    }


def select_settings(bench: BenchSpec, tuning: dict[BenchRun, Finished], planned: list[BenchRun]) -> Selected:
    """The setting each (federation, method with a grid) takes to its final runs (with ``tune.per_fold``: each
    (federation, method, fold), from that fold's tuning runs): the best on validation, once every ``planned``
    tuning run of it has finished (a bench collected while running selects nothing before)."""
    chosen: Selected = {}
    expected = Counter((selection_key(bench, r.federation, r.method, r.fold), r.setting) for r in planned)
    for key, per in setting_scores(bench, tuning).items():
        order = settings(bench.method(key[1]))
        if any(per.get(s, {}).get("runs", 0) < expected[(key, s)] for s in order):
            continue  # tuning not finished: nothing selected yet
        chosen[key] = max(order, key=lambda s: (nan_low(per[s]["val"]), -order.index(s)))
    return chosen


def edge_keys(method: MethodSpec, setting: Setting) -> list[str]:
    """The grid keys of ``setting`` whose value is the smallest or the largest of that key's grid values, as
    ``key (low)`` / ``key (high)``; numeric keys with at least two values only (a category has no edge)."""
    out = []
    for key, value in setting:
        values = method.grid.get(key, ())
        numeric = [v for v in values if isinstance(v, (int, float)) and not isinstance(v, bool)]
        if len(numeric) < 2 or len(numeric) != len(values) or value not in numeric:
            continue
        if value == min(numeric):
            out.append(f"{key} (low)")
        elif value == max(numeric):
            out.append(f"{key} (high)")
    return out


def _score(value: object) -> float | None:
    """A tuning row's validation score as the selection compares it: None where there is none (NaN in memory, ``null``
    in tables.json), ranked below every number and equal to another none (``nan_low``)."""
    score = json_number(value)
    return None if math.isnan(score) else score


def selection_ties(rows: list[dict]) -> dict[tuple, list[dict]]:
    """The tied selections among tuning rows (:func:`tuning_rows`, or ``tables.json``'s ``tuning``, which carries
    what this needs: ``val_dice`` as computed, ``selected``, ``fold``, ``values``): for each (federation, method) (a
    ``fold`` too with ``tune.per_fold``) whose selected setting's validation score another of its settings has
    exactly (the selection's own comparison; no score at all counts as equal), keyed ``(federation, method,
    fold or None)``, every setting of that score in grid order: the selected one first, since a tie selects the
    earliest (:func:`select_settings`)."""
    groups: dict[tuple, list[dict]] = {}
    for row in rows:
        groups.setdefault((row["federation"], row["method"], row.get("fold")), []).append(row)
    ties = {}
    for key, group in groups.items():
        chosen = next((r for r in group if r["selected"]), None)
        if chosen is None:
            continue
        tied = [r for r in group if r["runs"] and _score(r["val_dice"]) == _score(chosen["val_dice"])]
        if len(tied) > 1:
            ties[key] = [chosen, *(r for r in tied if r is not chosen)]
    return ties


def untied_edges(edges: list[str], tied: list[dict]) -> list[str]:
    """The ``edges`` of a tied selection (:func:`edge_keys`' ``key (low)`` / ``key (high)``) that its tie leaves
    standing: those of a key every ``tied`` setting gives the same value. Another value ties it from inside the grid
    (or from the other edge), so the edge was not better, only first; rows without ``values`` (written before they
    were recorded) leave none standing."""
    values = [r.get("values") for r in tied]
    known = [v for v in values if isinstance(v, dict)]

    def shared(key: str) -> bool:
        given = [v[key] for v in known if key in v]
        return len(given) == len(values) and all(v == given[0] for v in given)

    return [edge for edge in edges if shared(edge.rsplit(" (", 1)[0])]


def method_edges(edges: list[str], rows: list[dict]) -> tuple[list[str], bool]:
    """A method's ``at_edge`` (``tables.json``: its final setting's edges, :func:`edge_keys`; with ``tune.per_fold``
    over every fold's) with what its ties leave standing, and whether its selection (any fold's) was a tie; ``rows``:
    its tuning rows (one federation's). An edge stands where a fold selected it without a tie, or with one that
    leaves it (:func:`untied_edges`); without a tie ``edges`` are returned as they are."""
    ties = selection_ties(rows)
    if not ties:
        return edges, False
    standing: set[str] = set()
    for row in rows:
        if row["selected"]:
            own = [e for e in (row.get("at_edge") or "").split("; ") if e]
            tied = ties.get((row["federation"], row["method"], row.get("fold")))
            standing.update(untied_edges(own, tied) if tied else own)
    return [e for e in edges if e in standing], True


def held_out_site(holdouts: Holdouts, federation: str, fold: int) -> str:
    """The site fold ``fold`` of ``federation`` holds out: a leave-one-out federation's ``fold``-th site; "" for
    another federation."""
    return holdouts[federation][fold] if federation in holdouts else ""


def tuning_rows(
    bench: BenchSpec, tuning: dict[BenchRun, Finished], chosen: Selected, holdouts: Holdouts | None = None
) -> list[dict]:
    """One row per (federation, method, setting) (``tune.per_fold``: per fold too, with a ``fold`` column and each
    fold's own selection; a leave-one-out federation's fold ``k`` also names its held-out site, ``held_out``, the
    ``k``-th of ``holdouts``): validation and test scores, runs, the mean rounds trained and SGD steps (Eq. 34) of its
    runs, the rounds at which the plateau rule stopped its runs (``plateau_stops``: a losing
    setting stopped early may have lost to a warm-up stall, see ``stop.min_rounds``), how many of its runs may not
    have converged (``not_converged``: a setting compared on runs the budget cut short may not be the best one),
    whether it was selected and, on the selected row, the grid keys at an edge (``at_edge``, :func:`edge_keys`;
    empty when none; of a tie, only those every tied setting shares, :func:`untied_edges`)."""
    rows = []
    scores = setting_scores(bench, tuning)
    if bench.tune.per_fold:  # each federation's methods together, fold by fold
        feds, methods = [f.name for f in bench.federations], bench.method_names
        scores = dict(sorted(scores.items(), key=lambda kv: (feds.index(kv[0][0]), methods.index(kv[0][1]), kv[0][2:])))
    for key, per in scores.items():
        fed, method = key[0], key[1]
        for setting in settings(bench.method(method)):
            empty = {
                "val": math.nan,
                "test": math.nan,
                "runs": 0,
                "label": setting_label(setting),
                "plateau_stops": [],
                "rounds": math.nan,
                "sgd_steps": math.nan,
                "not_converged": 0,
            }
            score = per.get(setting, empty)
            selected = chosen.get(key) == setting
            rows.append(
                {
                    "federation": fed,
                    "method": method,
                    **({"fold": key[2]} if len(key) == 3 else {}),
                    **({"held_out": held_out_site(holdouts, fed, key[2])} if len(key) == 3 and holdouts else {}),
                    "setting": score["label"],
                    "values": {k: v for k, v in setting},
                    "val_dice": score["val"],
                    "test_dice": score["test"],
                    "runs": score["runs"],
                    "rounds": score["rounds"],
                    "sgd_steps": score["sgd_steps"],
                    "plateau_stops": " ".join(map(str, score["plateau_stops"])),
                    "not_converged": score["not_converged"],
                    "selected": selected,
                    "at_edge": "; ".join(edge_keys(bench.method(method), setting)) if selected else "",
                }
            )
    for tied in selection_ties(rows).values():
        tied[0]["at_edge"] = "; ".join(untied_edges([e for e in tied[0]["at_edge"].split("; ") if e], tied))
    return rows
