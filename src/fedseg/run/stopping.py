"""When an algorithm stops training, and whether its run converged (``fl.stop``; FeTS 2022 Sec. 4.4.7-4.4.8).

Three stop rules, checked after each round by :func:`fedseg.run.run_algorithm`:

* **plateau** (``patience``, ``min_delta``): the *reference round* is the first validated round, replaced by any
  later round whose mean validation Dice beats the reference's by more than ``min_delta``; training stops once
  ``patience`` rounds have passed since it (:func:`plateau_round`), and not before round ``min_rounds``;
* **SGD-step budget** (``sgd_steps``): the algorithm's own total local SGD steps, Eq. 34 of the FeTS benchmark
  (:func:`fedseg.evaluate.cost.cost_table`), reach the budget;
* **simulated-time budget** (``simulated_hours``): its simulated training time, Eq. 36-38 under the run's
  ``cost`` model, reaches the budget.

Budgets are met at round granularity: the round in which the total reaches the budget is the last one, so the
ledger's total lies in ``[budget, budget + one round's)``.

Convergence (:func:`convergence`): a run whose selected round lies in the last 10% of the rounds it trained, at
least its last 2 (``round > rounds - max(2, ceil(0.1 * rounds))``: of 10 rounds, a best round 9 before a dip in
round 10 is late too) is flagged ``late_best``; ``plateaued`` says whether its validation Dice had stopped
improving (the plateau rule, with ``patience`` or, when that is unset, 10% of the rounds trained, at least 2); a
run with a late best round whose validation had not plateaued may not have converged (``converged`` False). A
method that selects each site's round (``selected_rounds``) is late when at least half its sites selected a round in
that window (``late_sites``); a method whose tested round is fixed by rule (``fedavg-dp`` with ``select_round: last``)
is judged on its whole validation curve (its selected round is always the last, so the plateau decides). Every page
reads a run's entry through :func:`recorded_not_converged`, one rule for the report, the bench and the model card.
A run whose validation Dice never rose more than ``min_delta`` above its first validated round (``improved``
False: a learning rate too small to move the model, labels it cannot learn, a model that only got worse) counts as
neither: its flat curve is no plateau reached by training, and every page says so (:data:`NEVER_IMPROVED_WHY`).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any

from fedseg.config import CostConfig, StopConfig
from fedseg.evaluate.cost import cost_table

PLATEAU, SGD_STEPS, SIMULATED_TIME = "plateau", "sgd_steps", "simulated_time"
LATE_FRACTION = 0.1  # a selected round in the last 10% of the trained rounds: possibly not converged
RULE = 2  # summary.json convergence "rule": 2 records the per-site and fixed-round rules (module docstring)


def plateau_round(scores: Mapping[int, float], min_delta: float) -> int | None:
    """The reference round of the plateau rule over ``scores`` (round -> mean validation Dice, NaN = unscored):
    the first scored round, replaced by each later round that beats it by more than ``min_delta``."""
    ref: int | None = None
    for rnd in sorted(scores):
        score = scores[rnd]
        if math.isnan(score):
            continue
        if ref is None or score > scores[ref] + min_delta:
            ref = rnd
    return ref


def plateaued(scores: Mapping[int, float], rnd: int, patience: int, min_delta: float) -> bool:
    """Whether, at round ``rnd``, ``patience`` rounds have passed since the plateau rule's reference round."""
    ref = plateau_round(scores, min_delta)
    return ref is not None and rnd - ref >= patience


def improved(scores: Mapping[int, float], min_delta: float) -> bool | None:
    """Whether validation Dice ever rose more than ``min_delta`` above round 1's (the plateau rule's reference moved
    on), for a run that starts from its initial weights; None where that cannot be told: fewer than 2 scored rounds,
    or a first scored round after round 1 (``fl.validate_every`` > 1, a round 1 not selectable: the model had
    trained before its first score, and a flat curve from there is a plateau)."""
    scored = sorted(r for r, s in scores.items() if not math.isnan(s))
    if len(scored) < 2 or scored[0] != 1:
        return None
    return plateau_round(scores, min_delta) != scored[0]


NEVER_IMPROVED = "never improved"  # a study table's converged cell for such a run (improved False)
NEVER_IMPROVED_WHY = (  # what every page says of a run whose validation never improved (improved False)
    "validation Dice never rose more than fl.stop.min_delta above its first validated round: did the model train "
    "(train.lr, the labels)? Its flat curve is no plateau"
)


def budget_used(ledger_rows: Iterable[Any], cost: CostConfig, val_cases: Mapping[str, int]) -> dict[str, float]:
    """This algorithm's ``sgd_steps`` (Eq. 34) and ``simulated_hours`` (Eq. 36-38) so far, from its ledger rows."""
    table = cost_table(ledger_rows, cost, val_cases)
    return {SGD_STEPS: float(table["sgd_steps"]), SIMULATED_TIME: float(table["simulated_hours"])}


def budget_reached(stop: StopConfig, used: Mapping[str, float]) -> str | None:
    """The budget that ``used`` (:func:`budget_used`) has reached (``sgd_steps`` | ``simulated_time``), or None."""
    if stop.sgd_steps is not None and used[SGD_STEPS] >= stop.sgd_steps:
        return SGD_STEPS
    if stop.simulated_hours is not None and used[SIMULATED_TIME] >= stop.simulated_hours * (1 - 1e-9):
        return SIMULATED_TIME  # (a float sum of per-round times: equal totals may differ in the last bits)
    return None


def stop_reason(
    stop: StopConfig, scores: Mapping[int, float], rnd: int, used: Mapping[str, float] | None
) -> str | None:
    """The rule that ends training after round ``rnd`` (``plateau`` | ``sgd_steps`` | ``simulated_time``) or None;
    ``scores``: round -> mean validation Dice of the selectable validated rounds; ``used``: :func:`budget_used`
    (None: no budget set)."""
    if (
        stop.patience is not None
        and rnd in scores
        and rnd >= stop.min_rounds
        and plateaued(scores, rnd, stop.patience, stop.min_delta)
    ):
        return PLATEAU
    return budget_reached(stop, used) if used is not None else None


def has_budget(stop: StopConfig) -> bool:
    return stop.sgd_steps is not None or stop.simulated_hours is not None


def not_converged(late_best: bool, plateaued: bool) -> bool:
    """A run may not have converged when its selected round lies in the last 10% (at least 2) of its rounds and its
    validation Dice had not plateaued (a plateau-stopped run's last gains were below ``min_delta``: converged to
    that)."""
    return late_best and not plateaued


NOT_CONVERGED_WHY = (  # what every page says of a run that may not have converged (not_converged)
    "the round selected on validation is among the last 10% (at least 2) of the rounds trained and validation Dice "
    "had not plateaued"
)


def late_window(rounds: int) -> int:
    """The last rounds of ``rounds`` trained in which a selected round may not have converged: 10%, at least 2."""
    return max(2, math.ceil(LATE_FRACTION * rounds))


def late_best(best_round: int, rounds: int) -> bool:
    """Whether ``best_round`` lies in the :func:`late_window` of ``rounds`` (one rule for every table)."""
    return best_round > rounds - late_window(rounds)


def late_sites(selected_rounds: Mapping[str, int], rounds: int) -> tuple[int, int]:
    """``(sites whose selected round lies in the late window of rounds, sites)`` of a method that selects per site."""
    return sum(late_best(r, rounds) for r in selected_rounds.values()), len(selected_rounds)


def convergence(
    scores: Mapping[int, float],
    rounds: int,
    best_round: int,
    stop: StopConfig,
    stopped: str | None,
    from_initial_weights: bool = True,
    selected_rounds: Mapping[str, int] | None = None,
) -> dict[str, Any]:
    """The ``convergence`` entry of ``summary.json``: ``rounds`` trained, ``best_round`` and its mean validation Dice
    ``best_val_dice`` (the selection score: hyper-parameters are chosen on it), ``stopped`` (the rule
    that ended training early, or None), ``late_best`` (best round in the last 10% of the rounds trained, at least
    the last 2: may not have converged; with ``selected_rounds``, a method's ``{site: round}`` of its tested models:
    at least half of them there, ``late_sites`` ``[k, n]``), ``plateaued`` (of ``scores``, round -> mean validation
    Dice of the rounds the run is judged on) and the plateau rule's ``patience`` / ``min_delta`` used for it,
    ``improved`` (:func:`improved`; None for a method that starts from another's trained model,
    ``from_initial_weights`` False; False: ``converged`` is False too, whatever the plateau) and ``rule``
    (:data:`RULE`)."""
    patience = stop.patience or late_window(rounds)
    per_site = late_sites(selected_rounds, rounds) if selected_rounds else None
    late = 2 * per_site[0] >= per_site[1] if per_site else late_best(best_round, rounds)
    flat = stopped == PLATEAU or plateaued(scores, rounds, patience, stop.min_delta)
    rose = improved(scores, stop.min_delta) if from_initial_weights else None
    return {
        "rounds": rounds,
        "best_round": best_round,
        "best_val_dice": scores.get(best_round, math.nan),
        "stopped": stopped,
        "late_best": late,
        **({"late_sites": list(per_site)} if per_site else {}),
        "plateaued": flat,
        "converged": not_converged(late, flat) is False and rose is not False,
        "improved": rose,
        "patience": patience,
        "min_delta": stop.min_delta,
        "rule": RULE,
    }


def selected_round_of_sites(entry: Mapping[str, Any]) -> dict[str, int]:
    """summary.json ``selected_rounds`` (``{site: round}``) of a method that selects per site; {} otherwise."""
    sel = entry.get("selected_rounds")
    if not isinstance(sel, Mapping):
        return {}
    from fedseg.presentation.kit import num  # a JSON value as a float (None, strings that are no number: NaN)

    rounds = {str(s): num(r) for s, r in sel.items()}
    return {s: int(r) for s, r in rounds.items() if not math.isnan(r)}


def recorded_late_sites(entry: Mapping[str, Any]) -> tuple[int, int]:
    """``(k, n)``: of the ``n`` sites of a per-site method's summary.json ``entry``, the ``k`` whose selected round was
    late (recorded ``late_sites``; computed from ``selected_rounds`` for a run written before rule 2)."""
    recorded = (entry.get("convergence") or {}).get("late_sites")
    if isinstance(recorded, list) and len(recorded) == 2:
        return int(recorded[0]), int(recorded[1])
    rounds = entry.get("rounds")
    sel = selected_round_of_sites(entry)
    return late_sites(sel, rounds) if isinstance(rounds, int) else (0, len(sel))


def recorded_not_converged(entry: Mapping[str, Any]) -> bool:
    """Whether the run of a summary.json algorithm ``entry`` may not have converged (:func:`not_converged` of its
    ``convergence`` entry), for runs of every fedseg: one written before rule 2 (:data:`RULE`) is read as that rule
    says (a per-site method's late sites counted from ``selected_rounds``; ``fedavg-dp`` with ``select_round: last``
    recorded its last round alone, so nothing can be told: not flagged); an entry that records only ``converged``:
    False (unless its validation never improved, which pages say apart); one written before the ``convergence``
    entry: its selected round is its last."""
    conv = entry.get("convergence") or {}
    fixed_round = (entry.get("privacy") or {}).get("select_round") == "last"
    if "late_best" not in conv:  # an entry that says only whether it converged is read so
        if "converged" in conv:
            return conv["converged"] is False and conv.get("improved") is not False
        rounds = entry.get("rounds")  # an entry without rounds trained says nothing of convergence
        return isinstance(rounds, int) and rounds > 0 and entry.get("best_round") == rounds and not fixed_round
    if conv.get("rule") != RULE:
        if fixed_round:
            return False
        if selected_round_of_sites(entry):
            k, n = recorded_late_sites(entry)
            return not_converged(2 * k >= n > 0, bool(conv.get("plateaued")))
    return not_converged(bool(conv.get("late_best")), bool(conv.get("plateaued")))
