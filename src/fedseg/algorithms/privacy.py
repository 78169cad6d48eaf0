"""Central differential privacy for federated averaging: the mechanism and its (ε, δ) accounting.

**Mechanism** (DP-FedAvg, McMahan et al. 2018, "Learning differentially private recurrent language
models"; Geyer et al. 2017), with the conventions of Flower's server-side fixed clipping
(``flwr.server.strategy.DifferentialPrivacyServerSideFixedClipping`` and
``flwr.supercore.differential_privacy``: ``compute_clip_model_update``, ``add_gaussian_noise_to_params``,
``compute_stdv``). In round t, with global model w and site k's locally trained model w_k:

1. the update Δ_k = w_k − w is clipped to L2 norm C over *all* its float entries together
   (Flower's FlatClip: Δ_k · min(1, C / ‖Δ_k‖));
2. the clipped updates are averaged with uniform weights over the n sites of the federation (a fixed
   denominator: n is the number of sites, not the number of replies, so a site that does not answer
   lowers the average instead of raising every other site's share);
3. Gaussian noise N(0, σ²) with σ = z · C / n (Flower's ``compute_stdv(noise_multiplier,
   clipping_norm, num_sampled_clients)``) is added to every coordinate of the average;
4. w ← w + that noisy average.

Differences from Flower's wrapper, on purpose: Flower passes the clipped models to the wrapped
strategy, whose FedAvg weights them by ``num_examples``, which breaks the C / n sensitivity the
noise is calibrated to unless every client has as many examples; here the average is uniform, as
the noise calibration assumes. Flower draws its noise from NumPy's global generator in each array's
dtype; here it is drawn in float64 from a stream derived from (seed, round) only
(:func:`noise_generator`, fedseg's ``stream_seed``), so a run is deterministic and every engine
(simulator, Flower) adds the same noise. Arithmetic is float64, cast back to each tensor's dtype.

**What is protected** (the unit of privacy). The noisy sum Σ_k clip(Δ_k) changes by a vector of
norm at most C when one site's contribution is added or removed, whatever that site's data: the
guarantee is *user-level* DP with a whole site (a hospital's entire training set) as the "user"
(add/remove adjacency; for replace-one adjacency the sensitivity is 2C: the same numbers hold
for a noise multiplier z / 2). It bounds what the released sequence of global models reveals about
*whether a given hospital took part and what all of its data was*, which implies the same bound for
any single patient in it (a patient is part of one site's data), usually very loosely. It assumes a
trusted server: the server sees every site's raw update (central DP; secure aggregation or local
noise are what remove that trust). Only the global models are covered: a run's own diagnostics
(per-site losses, validation and test Dice, update norms in ``round_metrics.csv``) are computed
from the sites' data without noise.

**Accounting.** Every site takes part in every round (no client sampling, so no amplification by
subsampling): T rounds are T adaptive compositions of the Gaussian mechanism with noise multiplier
z (σ / sensitivity). Rényi DP: ε_RDP(α) = T · α / (2 z²) (Mironov 2017, Prop. 7 and composition),
converted to (ε, δ)-DP with the conversion of Balle et al. 2020 (Theorem 21; also Canonne, Kamath
and Steinke 2020) ε = ε_RDP(α) + log((α − 1) / α) − (log δ + log α) / (α − 1), minimised over the
orders ``ORDERS`` (Opacus's ``RDPAccountant`` default grid, extended to larger orders) — exactly
what Opacus 1.6's ``RDPAccountant`` returns for ``sample_rate = 1`` and these orders
(``tests/test_privacy.py`` checks it when Opacus is installed). :func:`epsilon_exact` adds the tight
value: a composition of Gaussian mechanisms is itself a Gaussian mechanism, μ-GDP with μ = √T / z
(Dong, Roth and Su 2019, Cor. 3.3), whose exact (ε, δ) curve is δ(ε) = Φ(−ε/μ + μ/2) − e^ε Φ(−ε/μ − μ/2)
(their Cor. 2.13; Balle and Wang 2018); it is never above the RDP value. z = 0 means ε = ∞.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import torch

from fedseg.algorithms.robust import clip_factors, update_norms
from fedseg.engine.context import stream_seed

Weights = dict[str, torch.Tensor]

# Opacus's RDPAccountant.DEFAULT_ALPHAS (1.1 .. 10.9 by 0.1, 12 .. 63), then larger orders: a large
# noise multiplier over few rounds has its best order above 63 (α* − 1 ≈ z · sqrt(2 log(1/δ) / T)).
ORDERS: tuple[float, ...] = tuple(
    [1 + x / 10.0 for x in range(1, 100)] + list(range(12, 64)) + list(range(64, 257, 8)) + [384, 512, 768, 1024]
)
NOISE_STREAM = "dp_noise"  # the action name of the server's noise stream (fedseg.engine.context.stream_seed)


# --------------------------------------------------------------------------------------------- the mechanism
def update_norm(update: Mapping[str, torch.Tensor]) -> float:
    """L2 norm of ``update`` over all its floating-point entries together (Flower's ``get_norm``), in
    float64: the norm robust aggregation clips with (:func:`fedseg.algorithms.robust.update_norms`)."""
    return update_norms([update])[0]


def clip_update(update: Mapping[str, torch.Tensor], clip_norm: float | None) -> tuple[Weights, float]:
    """``(update · min(1, clip_norm / ‖update‖), ‖update‖)``: the update scaled down, all entries by
    one factor, to L2 norm at most ``clip_norm`` (Flower's ``clip_inputs_inplace``; the factor is
    :func:`fedseg.algorithms.robust.clip_factors`'), in float64, and its norm before clipping.
    ``clip_norm`` None: no clipping."""
    norm = update_norm(update)
    scale = 1.0 if clip_norm is None else clip_factors([norm], clip_norm)[0]
    return {k: v.to(torch.float64) * scale for k, v in update.items()}, norm


def noise_std(noise_multiplier: float, clip_norm: float, num_sites: int) -> float:
    """σ = z · C / n, the per-coordinate noise std on the average of n clipped updates (Flower's
    ``compute_stdv``): z · C on their sum, whose sensitivity is C."""
    if num_sites < 1:
        raise ValueError(f"num_sites must be >= 1, got {num_sites}")
    return float(noise_multiplier * clip_norm / num_sites)


def noise_generator(seed: int, num_sites: int, rnd: int) -> torch.Generator:
    """The server's noise stream of round ``rnd``: from (seed, round) only, through ``stream_seed``
    with site index ``num_sites`` (past every site's, as ``centralized``'s server stream) and its own
    action name, so it is none of the sites' streams. Leaves torch's global RNG alone."""
    return torch.Generator().manual_seed(stream_seed(seed, num_sites, rnd, NOISE_STREAM))


def gaussian_noise(like: Mapping[str, torch.Tensor], std: float, generator: torch.Generator) -> Weights:
    """Independent N(0, std²) float64 noise for every coordinate of ``like``'s tensors, in ``like``'s order."""
    return {
        k: torch.randn(v.shape, generator=generator, dtype=torch.float64) * std
        if std > 0
        else torch.zeros(v.shape, dtype=torch.float64)
        for k, v in like.items()
    }


@dataclass
class PrivateMean:
    """One round's private merge: the new global ``weights`` (each tensor in the current model's
    dtype), each site's update norm before clipping (``norms``) and the noise std per coordinate."""

    weights: Weights
    norms: dict[str, float]
    std: float


def private_mean(
    current: Mapping[str, torch.Tensor],
    models: Mapping[str, Mapping[str, torch.Tensor]],
    clip_norm: float | None,
    noise_multiplier: float,
    num_sites: int,
    generator: torch.Generator,
) -> PrivateMean:
    """w + (Σ_k clip(w_k − w, C)) / n + N(0, (z · C / n)²) per coordinate (the module docstring).

    ``current``: the global model w the sites started from; ``models``: ``{site: w_k}`` of the sites
    that replied (each with every entry of ``current``); ``num_sites``: n, the federation's number of
    sites (the fixed denominator); ``generator``: the round's noise stream (:func:`noise_generator`).
    ``clip_norm`` None (no clipping) requires ``noise_multiplier == 0``."""
    if noise_multiplier < 0:
        raise ValueError(f"noise_multiplier must be >= 0, got {noise_multiplier}")
    if clip_norm is None and noise_multiplier > 0:
        raise ValueError("noise needs a clipping norm: the noise std is noise_multiplier * clip_norm / num_sites")
    if not models:
        raise ValueError("private_mean needs at least one site's model")
    if len(models) > num_sites:
        raise ValueError(f"{len(models)} models for a federation of {num_sites} sites")
    base = {k: v.to(torch.float64) for k, v in current.items()}
    total = {k: torch.zeros_like(v) for k, v in base.items()}
    norms = {}
    for site, model in models.items():
        clipped, norms[site] = clip_update({k: model[k].to(torch.float64) - base[k] for k in base}, clip_norm)
        for k in total:
            total[k] += clipped[k]
    std = 0.0 if clip_norm is None else noise_std(noise_multiplier, clip_norm, num_sites)
    noise = gaussian_noise(base, std, generator)
    weights = {k: (base[k] + total[k] / num_sites + noise[k]).to(current[k].dtype) for k in base}
    return PrivateMean(weights, norms, std)


# --------------------------------------------------------------------------------------------- the accountant
def rdp_gaussian(noise_multiplier: float, rounds: int, orders: tuple[float, ...] = ORDERS) -> np.ndarray:
    """ε_RDP(α) = T · α / (2 z²) at each order α: T compositions of the Gaussian mechanism with noise
    multiplier z and no subsampling (Opacus's ``compute_rdp`` with ``q = 1``). ∞ for z = 0."""
    a = np.asarray(orders, dtype=np.float64)
    if rounds == 0:
        return np.zeros_like(a)
    if noise_multiplier == 0:
        return np.full_like(a, np.inf)
    return rounds * a / (2.0 * noise_multiplier**2)


def rdp_to_dp(orders: tuple[float, ...], rdp: np.ndarray, delta: float) -> tuple[float, float]:
    """``(ε, best order)``: the smallest ε over ``orders`` of the RDP → (ε, δ) conversion of Balle et
    al. 2020, Theorem 21 (Opacus's ``get_privacy_spent``): ε_RDP(α) + log((α − 1)/α) − (log δ + log α)/(α − 1).
    ε is never negative; ∞ (order NaN) where the RDP curve is ∞ at every order."""
    if not 0 < delta < 1:
        raise ValueError(f"delta must be in (0, 1), got {delta}")
    a = np.asarray(orders, dtype=np.float64)
    eps = np.asarray(rdp, dtype=np.float64) - (math.log(delta) + np.log(a)) / (a - 1) + np.log((a - 1) / a)
    if not np.isfinite(eps).any():
        return math.inf, math.nan
    best = int(np.nanargmin(eps))
    return max(0.0, float(eps[best])), float(a[best])


def epsilon(noise_multiplier: float, rounds: int, delta: float, orders: tuple[float, ...] = ORDERS) -> float:
    """ε (RDP accountant) of ``rounds`` rounds of the mechanism at noise multiplier z and ``delta``."""
    if rounds == 0:
        return 0.0
    return rdp_to_dp(orders, rdp_gaussian(noise_multiplier, rounds, orders), delta)[0]


def gdp_delta(eps: float, mu: float) -> float:
    """δ(ε) of a μ-GDP mechanism: Φ(−ε/μ + μ/2) − e^ε Φ(−ε/μ − μ/2) (Dong, Roth and Su 2019, Cor. 2.13)."""
    from scipy.special import log_ndtr, ndtr

    return float(ndtr(-eps / mu + mu / 2) - math.exp(eps + float(log_ndtr(-eps / mu - mu / 2))))


def epsilon_exact(noise_multiplier: float, rounds: int, delta: float) -> float:
    """The exact ε at ``delta`` of ``rounds`` rounds: the composition is μ-GDP with μ = √T / z, and ε
    solves :func:`gdp_delta` (ε, μ) = δ (bisection on a decreasing function). ∞ for z = 0."""
    if not 0 < delta < 1:
        raise ValueError(f"delta must be in (0, 1), got {delta}")
    if rounds == 0:
        return 0.0
    if noise_multiplier == 0:
        return math.inf
    from scipy.optimize import brentq

    mu = math.sqrt(rounds) / noise_multiplier
    if gdp_delta(0.0, mu) <= delta:
        return 0.0
    high = 1.0
    while gdp_delta(high, mu) > delta:
        high *= 2.0
    return float(brentq(lambda e: gdp_delta(e, mu) - delta, 0.0, high, xtol=1e-12, rtol=1e-12))


def accounting(noise_multiplier: float, clip_norm: float | None, delta: float, rounds: int, num_sites: int) -> dict:
    """What ``summary.json`` records as an algorithm's ``privacy``: ε (RDP accountant, the headline
    number) and ``epsilon_exact`` at ``delta`` after ``rounds`` rounds, the mechanism's parameters and
    its noise std per coordinate of the average."""
    return {
        "epsilon": epsilon(noise_multiplier, rounds, delta),
        "epsilon_exact": epsilon_exact(noise_multiplier, rounds, delta),
        "delta": delta,
        "noise_multiplier": noise_multiplier,
        "clip_norm": clip_norm,
        "rounds": rounds,
        "sites": num_sites,
        "noise_std": 0.0 if clip_norm is None else noise_std(noise_multiplier, clip_norm, num_sites),
        "mechanism": "gaussian, per-site update clipping, uniform fixed-denominator average (server-side, central)",
        "accountant": "rdp (Balle et al. 2020 conversion); epsilon_exact: Gaussian DP",
        "unit": "site (user-level: add/remove one site's whole data)",
    }
