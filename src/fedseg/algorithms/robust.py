"""Byzantine-robust aggregation: Krum, Multi-Krum, Bulyan and norm-clipped averaging.

Pure functions on lists of named-tensor dicts (like :mod:`fedseg.algorithms.aggregate`): distances,
norms and means in float64, results cast back to each tensor's dtype. Distances and norms run over
every floating-point entry, all names together (integer entries such as BatchNorm's
``num_batches_tracked`` are counters: they do not count, and ``FedAvgServer.average_buffers``
resets every buffer to FedAvg's average after the merge anyway). With ``n`` updates of which at most
``f`` (``num_malicious``) are Byzantine:

* **Krum** (Blanchard et al., NeurIPS 2017, Sec. 4): the score of update i is
  ``s(i) = sum_{i -> j} ||V_i - V_j||^2`` over the ``n - f - 2`` updates j closest to V_i
  (``i -> j``); Krum returns the update with the smallest score. Needs ``n > 2f + 2``.
* **Multi-Krum** (same paper, Sec. 5): the average of the ``m`` updates with the smallest scores
  (``m = 1`` is Krum, ``m = n`` the plain mean); weighted by ``weights`` if given (Flower's
  ``MultiKrum`` weights by ``num-examples``), uniform otherwise (the paper). Needs ``n > 2f + 2``.
* **Bulyan** (El Mhamdi et al., ICML 2018, Sec. 3): ``theta = n - 2f`` updates are selected by
  applying Krum recursively (each round picks the remaining update with the smallest score among
  the remaining updates, ``n' - f - 2`` closest of the ``n'`` remaining ones, and removes it); then per
  coordinate the ``beta = theta - 2f`` selected values closest to their coordinate-wise median are
  averaged. Unweighted. Needs ``n >= 4f + 3``.
* **Clipped mean** (norm bounding, e.g. Sun et al. 2019 "Can you really backdoor federated
  learning?"; Flower's fixed clipping without noise): each update ``u_k = w_k - w`` is scaled to an
  L2 norm of at most C, ``u_k * min(1, C / ||u_k||)``, and the weighted average of the clipped
  updates is added to ``w``. With C above every ``||u_k||`` it is FedAvg's merge.

Krum, Multi-Krum and Bulyan are translation-invariant: merging the models ``w_k`` or the updates
``w_k - w`` (and adding ``w``) selects the same sites and gives the same model, so the server applies
them to the models.

Conventions matched with Flower (flwr 1.41; ``tests/test_robust_aggregation.py`` checks them):

* ``n - f - 2`` closest: ``max(1, n - f - 2)`` (Flower's ``num_closest``; only Bulyan's inner Krum on
  few remaining updates gets below 1), distances squared L2 over all entries flattened together;
* Multi-Krum / Krum selection: the ``m`` lowest scores (``np.argsort(scores)[:m]``); on equal scores
  fedseg keeps the lower index (a stable sort); the kept models are averaged with the weights
  (``flwr.serverapp.strategy.MultiKrum``: weighted by ``num-examples``; ``flwr.server.strategy.aggregate.
  aggregate_krum`` with ``to_keep > 0`` also; ``to_keep = 0`` there is Krum, ``to_keep = 1`` here);
* Bulyan, ``selection = "recursive"`` (default): El Mhamdi et al.'s recursive Krum, as
  ``flwr.server.strategy.aggregate.aggregate_bulyan`` with ``aggregate_krum, to_keep=0``;
  ``selection = "multikrum"``: one Multi-Krum pass keeping the ``theta`` lowest scores of the full
  set, as ``flwr.serverapp.strategy.Bulyan`` (the message-API strategy) does. Both then take the
  coordinate-wise median (``numpy.median``: the mean of the two middle values for an even ``theta``)
  and average the ``beta`` values closest to it. Flower's message-API ``Bulyan`` skips the round
  (returns no model) below ``4f + 3`` replies; fedseg raises.
* clipping: ``min(1, C / ||u_k||)`` over all entries (``flwr.supercore.differential_privacy.
  clip_inputs_inplace``); a zero update stays zero (Flower divides by zero there).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import ClassVar, Literal

import torch
from pydantic import Field, ValidationInfo, field_validator

from fedseg.algorithms.aggregate import _stacked, combine, stacked_median, weighted_average
from fedseg.engine.context import MethodOptions
from fedseg.engine.messages import l2_norm

Weights = dict[str, torch.Tensor]
Aggregator = Literal["mean", "krum", "multikrum", "bulyan", "clipped"]
Selection = Literal["recursive", "multikrum"]


# --- requirements ------------------------------------------------------------------------------
def check_krum(n: int, num_malicious: int, what: str = "Krum") -> None:
    """``n > 2f + 2`` (Blanchard et al., Proposition 1), else a ValueError naming ``num_malicious``."""
    if num_malicious < 0:
        raise ValueError(f"{what}: num_malicious must be >= 0, got {num_malicious}")
    if n <= 2 * num_malicious + 2:
        raise ValueError(
            f"{what} needs n > 2 * num_malicious + 2 updates (Blanchard et al. 2017): got n = {n} with "
            f"num_malicious = {num_malicious}, so at least {2 * num_malicious + 3} are needed"
        )


def check_bulyan(n: int, num_malicious: int) -> None:
    """``n >= 4f + 3`` (El Mhamdi et al. 2018), else a ValueError naming ``num_malicious``."""
    if num_malicious < 0:
        raise ValueError(f"Bulyan: num_malicious must be >= 0, got {num_malicious}")
    if n < 4 * num_malicious + 3:
        raise ValueError(
            f"Bulyan needs n >= 4 * num_malicious + 3 updates (El Mhamdi et al. 2018): got n = {n} with "
            f"num_malicious = {num_malicious}, so at least {4 * num_malicious + 3} are needed"
        )


def check_keep(n: int, to_keep: int) -> None:
    if not 1 <= to_keep <= n:
        raise ValueError(f"Multi-Krum: multikrum_keep (m) must lie in [1, n] = [1, {n}], got {to_keep}")


# --- Krum ------------------------------------------------------------------------------------
def _float_names(update: Mapping[str, torch.Tensor]) -> list[str]:
    return [name for name, t in update.items() if t.is_floating_point()]


def squared_distances(updates: Sequence[Mapping[str, torch.Tensor]]) -> torch.Tensor:
    """``(n, n)`` float64 matrix of ``||V_i - V_j||^2`` over every floating-point entry (all names
    flattened together), summed tensor by tensor (no concatenated copy of the models)."""
    n = len(updates)
    d = torch.zeros(n, n, dtype=torch.float64)
    for name in _float_names(updates[0]):
        x = _stacked(updates, name).reshape(n, -1)
        for i in range(n - 1):
            d[i, i + 1 :] += (x[i + 1 :] - x[i]).pow(2).sum(dim=1)
    return d + d.T


def krum_scores(distances: torch.Tensor, num_malicious: int) -> torch.Tensor:
    """Blanchard et al.'s ``s(i)``: the sum of the ``max(1, n - f - 2)`` smallest squared distances from
    update i to the others, for a ``(n, n)`` distance matrix. ``(n,)`` float64."""
    n = distances.shape[0]
    closest = max(1, n - num_malicious - 2)
    scores = torch.zeros(n, dtype=torch.float64)
    for i in range(n):
        others = torch.cat([distances[i, :i], distances[i, i + 1 :]])
        scores[i] = others.sort().values[:closest].sum()
    return scores


def lowest(scores: torch.Tensor, m: int) -> list[int]:
    """Indices of the ``m`` smallest scores, smallest first; equal scores: the lower index first."""
    return [int(i) for i in torch.sort(scores, stable=True).indices[:m]]


def krum_select(updates: Sequence[Mapping[str, torch.Tensor]], num_malicious: int, to_keep: int = 1) -> list[int]:
    """Indices of the ``to_keep`` updates with the lowest Krum scores (smallest first). Needs ``n > 2f + 2``."""
    n = len(updates)
    check_krum(n, num_malicious, "Krum" if to_keep == 1 else "Multi-Krum")
    check_keep(n, to_keep)
    return lowest(krum_scores(squared_distances(updates), num_malicious), to_keep)


def krum(
    updates: Sequence[Mapping[str, torch.Tensor]],
    num_malicious: int,
    to_keep: int = 1,
    weights: Sequence[float] | None = None,
) -> Weights:
    """Krum (``to_keep = 1``: the update with the lowest score, returned exactly) or Multi-Krum (the
    average of the ``to_keep`` lowest-score updates, weighted by ``weights[k]`` if given, else
    uniform). Needs ``n > 2 * num_malicious + 2`` and ``1 <= to_keep <= n`` (module docstring)."""
    if weights is not None and len(weights) != len(updates):
        raise ValueError(f"need one weight per update, got {len(updates)} updates and {len(weights)} weights")
    chosen = krum_select(updates, num_malicious, to_keep)
    if to_keep == 1:
        return {name: t.clone() for name, t in updates[chosen[0]].items()}
    shares = [1.0] * len(chosen) if weights is None else [float(weights[i]) for i in chosen]
    return weighted_average([updates[i] for i in chosen], shares)


# --- Bulyan ----------------------------------------------------------------------------------
def bulyan_select(
    updates: Sequence[Mapping[str, torch.Tensor]], num_malicious: int, selection: Selection = "recursive"
) -> list[int]:
    """The ``theta = n - 2f`` indices Bulyan keeps, in the order selected: ``recursive`` (El Mhamdi et
    al.; Flower's ``aggregate_bulyan``) or ``multikrum`` (one pass; Flower's message-API ``Bulyan``)."""
    n = len(updates)
    check_bulyan(n, num_malicious)
    theta = n - 2 * num_malicious
    distances = squared_distances(updates)
    if selection == "multikrum":
        return lowest(krum_scores(distances, num_malicious), theta)
    if selection != "recursive":
        raise ValueError(f"Bulyan selection must be 'recursive' or 'multikrum', got {selection!r}")
    remaining, chosen = list(range(n)), []
    for _ in range(theta):
        sub = distances[remaining][:, remaining]
        best = remaining[lowest(krum_scores(sub, num_malicious), 1)[0]]
        chosen.append(best)
        remaining.remove(best)
    return chosen


def closest_to_median_mean(updates: Sequence[Mapping[str, torch.Tensor]], beta: int) -> Weights:
    """Bulyan's second step, per coordinate: the mean of the ``beta`` values closest (absolute
    difference) to the coordinate-wise median (``numpy.median``'s: mean of the two middle values for an
    even count); equal distances: the value of the lower update index. Every entry, float64, cast back."""
    k = len(updates)
    if not 1 <= beta <= k:
        raise ValueError(f"beta must lie in [1, {k}], got {beta}")
    merged = {}
    for name, first in updates[0].items():
        x = _stacked(updates, name)
        nearest = (x - stacked_median(x)).abs().argsort(dim=0, stable=True)[:beta]
        merged[name] = torch.take_along_dim(x, nearest, dim=0).mean(dim=0).to(first.dtype)
    return merged


def bulyan(
    updates: Sequence[Mapping[str, torch.Tensor]], num_malicious: int, selection: Selection = "recursive"
) -> Weights:
    """Bulyan (El Mhamdi et al. 2018) with Krum as its selection rule: ``theta = n - 2f`` updates
    selected (``bulyan_select``), then per coordinate the mean of the ``beta = theta - 2f`` selected
    values closest to their median. Unweighted. Needs ``n >= 4 * num_malicious + 3``."""
    chosen = bulyan_select(updates, num_malicious, selection)
    beta = len(chosen) - 2 * num_malicious
    return closest_to_median_mean([updates[i] for i in chosen], beta)


# --- norm clipping ---------------------------------------------------------------------------
def update_norms(updates: Sequence[Mapping[str, torch.Tensor]]) -> list[float]:
    """``||u_k||``: the L2 norm over every floating-point entry of each update (float64)."""
    return [l2_norm(u) for u in updates]


def clip_factors(norms: Sequence[float], clip_norm: float) -> list[float]:
    """``min(1, C / ||u_k||)`` per update (1 for a zero update)."""
    if not clip_norm > 0:
        raise ValueError(f"clip_norm (C) must be > 0, got {clip_norm}")
    return [1.0 if norm <= clip_norm else clip_norm / norm for norm in norms]


def clipped_mean(updates: Sequence[Mapping[str, torch.Tensor]], weights: Sequence[float], clip_norm: float) -> Weights:
    """``sum_k p_k * min(1, C / ||u_k||) * u_k`` with ``p_k = weights[k] / sum(weights)``: the weighted
    average of the updates ``u_k = w_k - w`` after each is clipped to L2 norm ``C`` over its
    floating-point entries (integer entries are averaged unclipped). Add it to ``w`` for the merged model
    (:func:`clipped_merge`)."""
    if not updates or len(updates) != len(weights):
        raise ValueError(f"need one weight per update, got {len(updates)} updates and {len(weights)} weights")
    total = float(sum(weights))
    if total <= 0:
        raise ValueError(f"aggregation weights must sum to a positive number, got {list(weights)}")
    factors = clip_factors(update_norms(updates), clip_norm)
    shares = [w / total for w in weights]
    clipped = [s * c for s, c in zip(shares, factors)]
    floats = set(_float_names(updates[0]))
    return combine(updates, lambda name: clipped if name in floats else shares)


def model_updates(current: Mapping[str, torch.Tensor], models: Sequence[Mapping[str, torch.Tensor]]) -> list[Weights]:
    """``w_k - w`` in float64 for every floating-point entry of the models (integer entries left out)."""
    return [{n: m[n].to(torch.float64) - current[n].to(torch.float64) for n in _float_names(m)} for m in models]


def clipped_merge(
    current: Mapping[str, torch.Tensor],
    models: Sequence[Mapping[str, torch.Tensor]],
    weights: Sequence[float],
    clip_norm: float,
) -> Weights:
    """``w + clipped_mean(w_k - w)`` per floating-point entry (float64, cast to ``w``'s dtype); integer
    entries are FedAvg's weighted average of the models."""
    step = clipped_mean(model_updates(current, models), weights, clip_norm)
    merged = weighted_average([{n: t for n, t in m.items() if not t.is_floating_point()} for m in models], weights)
    for name, delta in step.items():
        base = current[name]
        merged[name] = (base.to(torch.float64) + delta).to(base.dtype)
    return merged


# --- the FedAvg pair's option ----------------------------------------------------------------
class RobustOptions(MethodOptions):
    """``aggregator`` and its parameters, part of ``FedAvgOptions`` (so of every method built on the
    FedAvg pair's merge: fedavg and its variants, fedprox, ditto's global model, fedper, lg-fedavg).

    A method whose merge is its own sets ``OWN_MERGE`` (why) and refuses every aggregator but
    ``mean``: FedAdam (server Adam step), FedNova (normalized average), SCAFFOLD (control variates),
    FedPIDAvg (its Eq. 18 weights), FedSM and its variants, CFL, prior-CFL and FedAvg continued (per-cluster averages).
    q-FedAvg, Auto-FedAvg, FedMedian and FedTrimmedAvg have no ``aggregator`` option (their merge is
    the method)."""

    OWN_MERGE: ClassVar[str | None] = None  # set by a method that merges otherwise: why only "mean" is allowed

    aggregator: Aggregator = Field(
        "mean",
        description="mean (FedAvg's weighted average) | krum | multikrum | bulyan | clipped "
        "(fedseg.algorithms.robust); the shared buffers (BatchNorm statistics) stay FedAvg's average",
    )
    num_malicious: int = Field(1, ge=0, description="f: Byzantine sites tolerated by krum, multikrum, bulyan")
    multikrum_keep: int | None = Field(
        None, ge=1, validate_default=True, description="m: models multikrum averages; None = n - f"
    )
    clip_norm: float | None = Field(
        None, gt=0, validate_default=True, description="C: L2 bound on each site's update w_k - w (clipped)"
    )

    @field_validator("aggregator")
    @classmethod
    def _own_merge(cls, value: str) -> str:
        if value != "mean" and cls.OWN_MERGE:
            raise ValueError(f"{value!r} is not available: {cls.OWN_MERGE}; only 'mean'")
        return value

    @field_validator("multikrum_keep", "clip_norm")
    @classmethod
    def _belongs_to_aggregator(cls, value: float | None, info: ValidationInfo) -> float | None:
        owner = {"multikrum_keep": "multikrum", "clip_norm": "clipped"}[str(info.field_name)]
        aggregator = info.data.get("aggregator")
        if aggregator is None:  # the aggregator itself was refused: that error suffices
            return value
        if owner == "clipped" and aggregator == "clipped" and value is None:
            raise ValueError("aggregator 'clipped' needs clip_norm (C > 0: the L2 bound on each site's update)")
        if value is not None and aggregator != owner:
            raise ValueError(f"only read with aggregator {owner!r} (aggregator is {aggregator!r})")
        return value

    def check_sites(self, num_sites: int, algorithm: str) -> None:
        """Krum / Multi-Krum need ``n > 2f + 2`` sites, Bulyan ``n >= 4f + 3`` (checked before any work);
        then the next options class's own rule, if any."""
        try:
            if self.aggregator in ("krum", "multikrum"):
                check_krum(num_sites, self.num_malicious, "Krum" if self.aggregator == "krum" else "Multi-Krum")
                if self.multikrum_keep is not None:
                    check_keep(num_sites, self.multikrum_keep)
            elif self.aggregator == "bulyan":
                check_bulyan(num_sites, self.num_malicious)
        except ValueError as e:
            raise ValueError(f"methods.{algorithm}.aggregator = {self.aggregator}: {e}") from None
        super().check_sites(num_sites, algorithm)


@dataclass
class RobustMerge:
    """A robust merge's model and what it did per reply (in reply order): the L2 norm of ``w_k - w``,
    and whether the update was kept (Krum, Multi-Krum, Bulyan) or its clip factor (clipped)."""

    weights: Weights
    norms: list[float]
    kept: list[bool] | None = None
    clip: list[float] | None = None

    def rows(self, sites: Sequence[str]) -> list[dict]:
        """``round_metrics.csv`` rows: ``update_norm`` and ``robust_kept`` (1/0) or ``clip_factor`` per site."""
        rows = [{"site": s, "metric": "update_norm", "value": v} for s, v in zip(sites, self.norms)]
        if self.kept is not None:
            rows += [{"site": s, "metric": "robust_kept", "value": float(k)} for s, k in zip(sites, self.kept)]
        if self.clip is not None:
            rows += [{"site": s, "metric": "clip_factor", "value": c} for s, c in zip(sites, self.clip)]
        return rows


def robust_merge(
    options: RobustOptions,
    current: Mapping[str, torch.Tensor],
    models: Sequence[Mapping[str, torch.Tensor]],
    weights: Sequence[float],
    algorithm: str = "fedavg",
) -> RobustMerge:
    """The merge of the received ``models`` under ``options.aggregator`` (not ``mean``) from the global
    model ``current``: Krum (the selected model), Multi-Krum (the ``weights``-weighted average of the
    ``multikrum_keep`` = m, default ``n - f``, selected models), Bulyan (unweighted) or the clipped
    mean. Too few replies (a site skipped under ``fl.on_failure = skip``) raise a ValueError naming
    ``methods.<algorithm>.num_malicious`` and ``fl.min_sites``."""
    n, f, name = len(models), options.num_malicious, options.aggregator
    norms = update_norms(model_updates(current, models))
    try:
        if name == "clipped":
            assert options.clip_norm is not None  # the options refuse clipped without clip_norm
            merged = clipped_merge(current, models, weights, options.clip_norm)
            return RobustMerge(merged, norms, clip=clip_factors(norms, options.clip_norm))
        if name in ("krum", "multikrum"):
            keep = 1 if name == "krum" else (options.multikrum_keep or n - f)
            chosen = krum_select(models, f, keep)
            if keep == 1:
                merged = {k: t.clone() for k, t in models[chosen[0]].items()}
            else:
                merged = weighted_average([models[i] for i in chosen], [weights[i] for i in chosen])
        elif name == "bulyan":
            chosen = bulyan_select(models, f)
            merged = closest_to_median_mean([models[i] for i in chosen], len(chosen) - 2 * f)
        else:
            raise ValueError(f"unknown aggregator {name!r}")
    except ValueError as e:
        raise ValueError(
            f"methods.{algorithm}.aggregator = {name} with {n} replies: {e} (lower methods.{algorithm}.num_malicious, "
            "or raise fl.min_sites so that a round with too few replies stops earlier)"
        ) from None
    kept = set(chosen)
    return RobustMerge(merged, norms, kept=[i in kept for i in range(n)])


def robust_aggregator(options: object) -> RobustOptions | None:
    """``options`` when they ask for a robust merge (an ``aggregator`` other than ``mean``), else None:
    the FedAvg pair then merges by its weighted average."""
    return options if isinstance(options, RobustOptions) and options.aggregator != "mean" else None
