"""The FeTS benchmark's cost table (Table 2, Eq. 34-38) from one algorithm's ledger rows.

With ``s_{k,r}`` the SGD steps of participant k in round r (ledger rows of training
exchanges; evaluation exchanges excluded as in ``Ledger.totals``):

* total SGD steps (Eq. 34, ``R sum_k s_k``): ``sum_r sum_k s_{k,r}``;
* total maximum parallel SGD steps (Eq. 35, ``R max_k s_k``): ``sum_r max_k s_{k,r}``;
* total communicated floats: ``sum`` of floats down + up of the training exchanges;
* simulated training time (Eq. 36-38): ``sum_r max_k (T^comp_{k,r} + T^comm_{k,r})`` with
  ``T^comp = s t_batch + f t_forward + n^eval t_eval`` (Eq. 37) and
  ``T^comm = down * B / D + up * B / U`` (Eq. 38: the measured floats of that site and round,
  ``B`` bytes per float, bandwidths ``D``/``U`` in MB/s of 10^6 bytes).

The paper's ``R * max_k(...)`` assumes identical rounds; summing per round is the same number
then, and stays right when rounds differ. Conventions:

* forward-only batches ``f`` are the ``steps`` of the actions in ``FORWARD_ACTIONS`` (q-FedAvg's
  loss pass, :mod:`fedseg.algorithms.qfedavg`): counted apart (``forward_batches``), not in
  Eq. 34/35, and timed at ``t_forward``;
* ``n^eval_{k,r}`` = site k's validation cases when site k has an ``evaluate`` row in round r
  (the run validates every ``fl.validate_every`` rounds; the final round's extra test rows do
  not add cases). In a round with a ``POOLED`` participant (centralized training) the pooled
  participant validates every site's validation cases, as for the paper's centralized row;
* ``timing = config``: ``t_batch``, ``t_eval`` from the config and
  ``t_forward = forward_fraction * t_batch``; ``timing = measured``: ``t_batch`` = seconds /
  steps of the SGD rows, ``t_forward`` = seconds / steps of the forward-only rows, ``t_eval`` =
  seconds of each validated (round, site)'s first ``evaluate`` row / its validation cases.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import asdict, is_dataclass
from typing import TypedDict

from fedseg.config import CostConfig
from fedseg.engine.ledger import EVAL_ACTIONS, LedgerRow

FORWARD_ACTIONS = frozenset({"loss"})  # steps = forward-only batches (fedseg.algorithms.qfedavg.LOSS_ACTION)
EVALUATE = "evaluate"
POOLED = "pooled"  # participant name of centralized training (fedseg.algorithms.centralized.POOLED)
MB = 1e6


class _CostRow(TypedDict):
    """The ledger fields the cost model reads, with their types."""

    round: int
    site: str
    action: str
    steps: int
    floats_down: int
    floats_up: int
    seconds: float


def _row(r: LedgerRow | Mapping) -> _CostRow:
    d = asdict(r) if is_dataclass(r) else dict(r)
    return {
        "round": int(d["round"]),
        "site": str(d["site"]),
        "action": str(d["action"]),
        "steps": int(d["steps"]),
        "floats_down": int(d["floats_down"]),
        "floats_up": int(d["floats_up"]),
        "seconds": float(d["seconds"]),
    }


def _ratio(num: float, den: float) -> float:
    return num / den if den else 0.0


def cost_table(rows: Iterable[LedgerRow | Mapping], cfg: CostConfig, val_cases: Mapping[str, int]) -> dict:
    """Table 2 of the FeTS benchmark for one algorithm.

    Args:
        rows: its ledger rows (``LedgerRow`` or dicts with the ledger's fields).
        cfg: the cost model (``RunConfig.cost``).
        val_cases: validation cases per site (``n^eval_k``).
    Returns:
        ``sgd_steps`` (Eq. 34), ``parallel_sgd_steps`` (Eq. 35), ``forward_batches``, ``floats`` (training
        exchanges, the paper's communication), ``eval_floats`` (validation and test exchanges: e.g. FedSM's super
        model sent for every validation; reported apart, not in Eq. 38),
        ``simulated_seconds`` and ``simulated_hours`` (Eq. 36-38), and the inputs used:
        ``timing``, ``t_batch``, ``t_forward``, ``t_eval`` (s), ``download_mb_s``, ``upload_mb_s``,
        ``bytes_per_float``.
    """
    records = [_row(r) for r in rows]
    train = [r for r in records if r["action"] not in EVAL_ACTIONS]
    sgd = [r for r in train if r["action"] not in FORWARD_ACTIONS]
    forward = [r for r in train if r["action"] in FORWARD_ACTIONS]

    # per (round, participant): SGD steps, forward batches, floats down, floats up
    per: dict[int, dict[str, list[int]]] = defaultdict(lambda: defaultdict(lambda: [0, 0, 0, 0]))
    for r in train:
        acc = per[r["round"]][r["site"]]
        acc[0 if r["action"] not in FORWARD_ACTIONS else 1] += r["steps"]
        acc[2] += r["floats_down"]
        acc[3] += r["floats_up"]
    first_eval: dict[tuple[int, str], _CostRow] = {}
    for r in records:
        if r["action"] == EVALUATE:
            first_eval.setdefault((r["round"], r["site"]), r)
            per[r["round"]].setdefault(r["site"], [0, 0, 0, 0])

    if cfg.timing == "measured":
        t_batch = _ratio(sum(r["seconds"] for r in sgd if r["steps"]), sum(r["steps"] for r in sgd))
        t_forward = _ratio(sum(r["seconds"] for r in forward if r["steps"]), sum(r["steps"] for r in forward))
        scored = [
            (r["seconds"], val_cases.get(site, 0)) for (_, site), r in first_eval.items() if val_cases.get(site, 0)
        ]
        t_eval = _ratio(sum(s for s, _ in scored), sum(n for _, n in scored))
    else:
        t_batch, t_eval = cfg.batch_seconds, cfg.eval_seconds
        t_forward = cfg.forward_fraction * cfg.batch_seconds
    down_s = cfg.bytes_per_float / (cfg.download_mb_s * MB)  # seconds per float downloaded
    up_s = cfg.bytes_per_float / (cfg.upload_mb_s * MB)

    total_seconds, parallel = 0.0, 0
    for rnd, sites in sorted(per.items()):
        evaluated = {k: val_cases.get(k, 0) for k in sites if (rnd, k) in first_eval}
        if POOLED in sites:  # centralized: one participant trains and validates everything
            evaluated = {POOLED: sum(evaluated.values())}
            sites = {POOLED: sites[POOLED]}
        times = [
            s * t_batch + f * t_forward + evaluated.get(k, 0) * t_eval + down * down_s + up * up_s
            for k, (s, f, down, up) in sites.items()
        ]
        total_seconds += max(times)
        parallel += max(s for s, _, _, _ in sites.values())

    return {
        "sgd_steps": sum(r["steps"] for r in sgd),
        "parallel_sgd_steps": parallel,
        "forward_batches": sum(r["steps"] for r in forward),
        "floats": sum(r["floats_down"] + r["floats_up"] for r in train),
        "eval_floats": sum(r["floats_down"] + r["floats_up"] for r in records if r["action"] in EVAL_ACTIONS),
        "simulated_seconds": total_seconds,
        "simulated_hours": total_seconds / 3600.0,
        "timing": cfg.timing,
        "t_batch": t_batch,
        "t_forward": t_forward,
        "t_eval": t_eval,
        "download_mb_s": cfg.download_mb_s,
        "upload_mb_s": cfg.upload_mb_s,
        "bytes_per_float": cfg.bytes_per_float,
    }
