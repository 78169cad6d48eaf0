"""Central differential privacy (``fedavg-dp``, ``fedseg.algorithms.privacy``): the clipping bound per
site, the noise std, the (ε, δ) accounting against an independent computation and Opacus's
accountant, determinism, the mechanism switched off = FedAvg bit for bit, and a run end to end."""

from __future__ import annotations

import csv
import json
import math

import numpy as np
import pytest
import torch
from scipy import optimize, stats

from fedseg.algorithms import get_algorithm
from fedseg.algorithms.privacy import (
    ORDERS,
    accounting,
    clip_update,
    epsilon,
    epsilon_exact,
    gdp_delta,
    noise_generator,
    noise_std,
    private_mean,
    rdp_gaussian,
    rdp_to_dp,
    update_norm,
)
from fedseg.report.html import render_report
from fedseg.run import prepare, run_algorithm, run_experiment
from fedseg.run.outputs import read_bundle

SHAPES = {"conv.weight": (8, 3, 3, 3), "conv.bias": (8,), "head.weight": (2, 8)}


def weights(seed: int, scale: float = 1.0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {k: torch.randn(s, generator=g) * scale for k, s in SHAPES.items()}


def local_models(current, scales: list[float]) -> dict[str, dict[str, torch.Tensor]]:
    """One model per site, its update w_k - w of L2 norm about ``scales[k]`` * sqrt(numel)."""
    return {f"site{i}": {k: current[k] + d for k, d in weights(100 + i, s).items()} for i, s in enumerate(scales)}


# --------------------------------------------------------------------------------------------- clipping
def test_every_site_update_is_clipped_to_the_bound_and_keeps_its_direction():
    current = weights(0)
    models = local_models(current, [0.001, 0.05, 1.0, 10.0])
    clip = 0.5
    for site, model in models.items():
        update = {k: model[k] - current[k] for k in current}
        clipped, norm = clip_update(update, clip)
        assert norm == pytest.approx(update_norm(update))
        assert update_norm(clipped) <= clip * (1 + 1e-12), site
        if norm <= clip:  # small updates pass unchanged
            for k in update:
                assert torch.equal(clipped[k], update[k].to(torch.float64))
        else:  # large ones are scaled down to exactly the bound, all entries by one factor
            assert update_norm(clipped) == pytest.approx(clip, rel=1e-12)
            for k in update:
                torch.testing.assert_close(clipped[k], update[k].to(torch.float64) * (clip / norm))
    # the merge (no noise) is the average of exactly these clipped updates over the n sites
    merged = private_mean(current, models, clip, 0.0, len(models), noise_generator(0, len(models), 1))
    for k in current:
        total = sum(clip_update({j: m[j] - current[j] for j in current}, clip)[0][k] for m in models.values())
        torch.testing.assert_close(merged.weights[k], (current[k].double() + total / len(models)).float())
    assert merged.norms == pytest.approx({s: update_norm({k: m[k] - current[k] for k in m}) for s, m in models.items()})


def test_clipping_and_noise_std_agree_with_flower():
    """Flower's server-side fixed clipping (flwr 1.41: ``compute_clip_model_update``, float32 in place) clips
    each model's update exactly as ours, and its ``compute_stdv`` is our noise std."""
    flwr_dp = pytest.importorskip("flwr.supercore.differential_privacy")
    current = weights(0)
    for model in local_models(current, [0.01, 0.1, 1.0]).values():
        theirs = [model[k].numpy().copy() for k in current]
        flwr_dp.compute_clip_model_update(theirs, [current[k].numpy() for k in current], 0.5)
        ours, _ = clip_update({k: model[k] - current[k] for k in current}, 0.5)
        for array, k in zip(theirs, current):
            np.testing.assert_allclose(array, (current[k].double() + ours[k]).numpy(), rtol=0, atol=1e-6)
    assert flwr_dp.compute_stdv(1.3, 0.5, 6) == pytest.approx(noise_std(1.3, 0.5, 6), rel=1e-15)


def test_one_site_moves_the_noiseless_average_by_at_most_clip_over_n():
    """The sensitivity the noise is calibrated to: adding or removing one site (fixed denominator n)
    changes the average by at most C / n, however large that site's update."""
    current, clip, n = weights(0), 0.3, 5
    models = local_models(current, [0.1, 0.2, 5.0, 50.0, 500.0])
    gen = lambda: noise_generator(0, n, 1)  # noqa: E731
    full = private_mean(current, models, clip, 0.0, n, gen()).weights
    for site in models:
        rest = {s: m for s, m in models.items() if s != site}
        without = private_mean(current, rest, clip, 0.0, n, gen()).weights
        diff = {k: full[k].double() - without[k].double() for k in full}
        assert update_norm(diff) <= clip / n * (1 + 1e-5)


# --------------------------------------------------------------------------------------------- noise
@pytest.mark.parametrize("z, clip, n", [(1.0, 0.5, 6), (2.0, 0.1, 3), (0.3, 2.0, 10)])
def test_noise_std_is_z_times_clip_over_n(z, clip, n):
    """With every update zero the merge is the noise itself: over ~200k coordinates its sample std is
    z * C / n (Flower's compute_stdv) within 1%, its mean 0 and its distribution normal."""
    current = {"a": torch.zeros(400, 250, dtype=torch.float64), "b": torch.zeros(100_000, dtype=torch.float64)}
    models = {f"s{i}": {k: v.clone() for k, v in current.items()} for i in range(n)}
    merged = private_mean(current, models, clip, z, n, noise_generator(7, n, 3))
    noise = torch.cat([merged.weights[k].flatten() for k in current]).numpy()
    std = z * clip / n
    assert merged.std == noise_std(z, clip, n) == pytest.approx(std)
    assert noise.std(ddof=1) == pytest.approx(std, rel=0.01)
    assert abs(noise.mean()) < 5 * std / math.sqrt(noise.size)
    assert stats.kstest(noise / std, "norm").pvalue > 1e-3


def test_no_noise_without_a_multiplier_and_no_noise_without_a_clip_norm_is_refused():
    current = weights(0)
    models = local_models(current, [0.01, 0.02])
    merged = private_mean(current, models, None, 0.0, 2, noise_generator(0, 2, 1))
    for k in current:  # no clipping, no noise: the plain uniform average of the models
        torch.testing.assert_close(merged.weights[k], (models["site0"][k] + models["site1"][k]) / 2)
    with pytest.raises(ValueError, match="clipping norm"):
        private_mean(current, models, None, 1.0, 2, noise_generator(0, 2, 1))
    with pytest.raises(ValueError, match="methods.fedavg-dp.*needs a clip_norm"):
        get_algorithm("fedavg-dp").parse_options({"clip_norm": None, "noise_multiplier": 0.5})
    with pytest.raises(ValueError, match=r"methods\.fedavg-dp\.weighting"):  # the average is uniform by design
        get_algorithm("fedavg-dp").parse_options({"weighting": "samples"})


def test_noise_is_a_function_of_seed_and_round_only():
    current = weights(0)
    models = local_models(current, [0.1, 0.2, 0.3])

    def merge(seed: int, rnd: int, order=("site0", "site1", "site2")):
        return private_mean(current, {s: models[s] for s in order}, 0.5, 1.0, 3, noise_generator(seed, 3, rnd))

    a, b = merge(0, 4), merge(0, 4, order=("site2", "site0", "site1"))
    for k in current:  # same seed and round: the same noise, whatever order the replies came in
        torch.testing.assert_close(a.weights[k], b.weights[k], rtol=0, atol=1e-6)
    assert all(not torch.equal(a.weights[k], merge(0, 5).weights[k]) for k in current)  # another round
    assert all(not torch.equal(a.weights[k], merge(1, 4).weights[k]) for k in current)  # another seed
    state = torch.random.get_rng_state()
    merge(0, 4)
    assert torch.equal(state, torch.random.get_rng_state()), "the noise stream must not touch torch's global RNG"


# --------------------------------------------------------------------------------------------- accounting
def independent_epsilon(z: float, rounds: int, delta: float) -> float:
    """The same RDP bound, computed independently: minimise over a continuous order α > 1 with scipy."""

    def eps(a: float) -> float:
        return rounds * a / (2 * z * z) + math.log((a - 1) / a) - (math.log(delta) + math.log(a)) / (a - 1)

    res = optimize.minimize_scalar(eps, bounds=(1.0 + 1e-9, 1e5), method="bounded", options={"xatol": 1e-10})
    return float(res.fun)


CASES = [(0.5, 10), (1.0, 10), (2.0, 10), (1.0, 40), (4.0, 20), (5.0, 1), (1.1, 100)]


@pytest.mark.parametrize("z, rounds", CASES)
def test_epsilon_matches_an_independent_computation_of_the_rdp_bound(z, rounds):
    delta = 1e-5
    eps = epsilon(z, rounds, delta)
    exact = independent_epsilon(z, rounds, delta)
    assert exact <= eps + 1e-9  # a grid of orders can only be above the continuous minimum...
    assert eps == pytest.approx(exact, rel=0.01)  # ...and the grid is fine enough to be within 1% of it
    a = rounds / (2 * z * z)  # the classic conversion (Mironov 2017) in closed form: a + 2 sqrt(a log(1/delta))
    assert eps <= a + 2 * math.sqrt(a * math.log(1 / delta))
    # the tight value: Gaussian DP with mu = sqrt(T) / z; it solves delta(eps) = delta and is below the RDP bound
    tight = epsilon_exact(z, rounds, delta)
    assert gdp_delta(tight, math.sqrt(rounds) / z) == pytest.approx(delta, rel=1e-6)
    assert 0 < tight <= eps


@pytest.mark.parametrize("z, rounds", CASES)
def test_epsilon_equals_opacus_rdp_accountant(z, rounds):
    accountants = pytest.importorskip("opacus.accountants")
    acc = accountants.RDPAccountant()
    for _ in range(rounds):  # every site every round: the Gaussian mechanism without subsampling
        acc.step(noise_multiplier=z, sample_rate=1.0)
    assert epsilon(z, rounds, 1e-5) == pytest.approx(acc.get_epsilon(delta=1e-5, alphas=list(ORDERS)), rel=1e-12)


def test_known_values():
    # Opacus 1.6 RDPAccountant (sample_rate 1, delta 1e-5), recorded
    assert epsilon(1.0, 10, 1e-5) == pytest.approx(19.05359753, rel=1e-8)
    assert epsilon(2.0, 10, 1e-5) == pytest.approx(8.07940622, rel=1e-8)
    assert epsilon(5.0, 1, 1e-5) == pytest.approx(0.79452203, rel=1e-8)
    # the one-shot Gaussian mechanism: z = 1 is 1-GDP, whose delta at eps = 1 is Phi(-1/2) - e Phi(-3/2)
    assert gdp_delta(1.0, 1.0) == pytest.approx(stats.norm.cdf(-0.5) - math.e * stats.norm.cdf(-1.5), rel=1e-12)
    assert epsilon_exact(1.0, 1, gdp_delta(1.0, 1.0)) == pytest.approx(1.0, rel=1e-9)
    # T rounds at z cost what one round at z / sqrt(T) does
    assert epsilon_exact(2.0, 16, 1e-5) == pytest.approx(epsilon_exact(0.5, 1, 1e-5), rel=1e-9)
    # edge cases: no noise, no rounds
    assert epsilon(0.0, 3, 1e-5) == math.inf == epsilon_exact(0.0, 3, 1e-5)
    assert epsilon(1.0, 0, 1e-5) == 0.0 == epsilon_exact(1.0, 0, 1e-5)
    assert rdp_to_dp(ORDERS, rdp_gaussian(1.0, 10), 1e-5)[1] in ORDERS


# --------------------------------------------------------------------------------------------- runs
def test_mechanism_off_is_fedavg_uniform_bit_for_bit(tmp_path, tiny_config, disc_federation):
    fed = disc_federation(n_sites=3, cases_per_site=8)
    off = {"noise_multiplier": 0, "clip_norm": None, "select_round": "best"}  # FedAvg's selection too
    cfg = tiny_config(fl={"rounds": 2}, methods={"fedavg": {"weighting": "uniform"}, "fedavg-dp": off})
    prep = prepare(cfg, fed)
    plain = run_algorithm("fedavg", prep, tmp_path / "a", resume=False)
    private = run_algorithm("fedavg-dp", prep, tmp_path / "b", resume=False)
    assert [r["val_dice"] for r in private.rounds_rows] == [r["val_dice"] for r in plain.rounds_rows]
    for k, v in plain.bundle["global"].items():
        assert torch.equal(private.bundle["global"][k], v), k
    assert private.summary["privacy"]["epsilon"] == math.inf


def test_run_writes_privacy_to_summary_round_metrics_and_report(tmp_path, tiny_config, disc_federation):
    z, clip, rounds = 1.5, 0.2, 3
    cfg = tiny_config(
        algorithms=["fedavg", "fedavg-dp"],
        fl={"rounds": rounds},
        methods={"fedavg-dp": {"noise_multiplier": z, "clip_norm": clip}},
    )
    run_experiment(cfg, tmp_path, federation=disc_federation(n_sites=3, cases_per_site=8))
    entry = json.loads((tmp_path / "summary.json").read_text())["algorithms"]["fedavg-dp"]
    privacy = entry["privacy"]
    assert privacy == {**accounting(z, clip, 1e-5, rounds, 3), "select_round": "last"}
    assert privacy["epsilon"] == pytest.approx(epsilon(z, rounds, 1e-5)) and privacy["noise_std"] == z * clip / 3
    assert entry["best_round"] == rounds  # the last round's model is released
    assert "local_avg" not in entry  # no site uploads a model of its own
    rows = list(csv.DictReader((tmp_path / "round_metrics.csv").open()))
    spent = {int(r["round"]): float(r["value"]) for r in rows if r["metric"] == "epsilon"}
    assert spent == pytest.approx({t: epsilon(z, t, 1e-5) for t in range(1, rounds + 1)})
    assert spent[rounds] == pytest.approx(privacy["epsilon"])
    norms = [r for r in rows if r["metric"] == "update_norm"]
    assert len(norms) == 3 * rounds and all(float(r["value"]) > 0 for r in norms)
    html = render_report(tmp_path).read_text()
    assert "Differential privacy" in html and "user-level" in html
    bundle = read_bundle(tmp_path / "model" / "fedavg-dp")
    assert set(bundle) == {"global"}


def test_same_seed_same_private_model(tmp_path, tiny_config, disc_federation):
    fed = disc_federation(n_sites=2, cases_per_site=6)
    cfg = tiny_config(fl={"rounds": 1}, methods={"fedavg-dp": {"noise_multiplier": 1.0, "clip_norm": 0.1}})
    first = run_algorithm("fedavg-dp", prepare(cfg, fed), tmp_path / "a", resume=False)
    again = run_algorithm("fedavg-dp", prepare(cfg, fed), tmp_path / "b", resume=False)
    other = run_algorithm("fedavg-dp", prepare(cfg.model_copy(update={"seed": 1}), fed), tmp_path / "c", resume=False)
    for k, v in first.bundle["global"].items():
        assert torch.equal(again.bundle["global"][k], v), k
    assert any(not torch.equal(other.bundle["global"][k], v) for k, v in first.bundle["global"].items())


def test_batch_norm_is_refused_before_any_work(tmp_path, tiny_config, disc_federation):
    cfg = tiny_config(algorithms=["fedavg-dp"], model={"norm": "batch"})
    with pytest.raises(ValueError, match="fedavg-dp: the network has .* buffers .*running_mean"):
        run_experiment(cfg, tmp_path / "out", federation=disc_federation(n_sites=2, cases_per_site=6))
    assert not (tmp_path / "out").exists()


def test_methods_with_their_own_merge_have_no_dp_option():
    for name in ("fedavg", "fedadam", "scaffold", "fednova", "fedsm"):
        with pytest.raises(ValueError, match=rf"methods\.{name}\.noise_multiplier: unknown key"):
            get_algorithm(name).parse_options({"noise_multiplier": 1.0})


def test_accounting_is_reproducible_by_hand():
    p = accounting(1.0, 0.5, 1e-5, 10, 6)
    assert p["noise_std"] == pytest.approx(1.0 * 0.5 / 6)
    assert p["epsilon"] == pytest.approx(rdp_to_dp(ORDERS, rdp_gaussian(1.0, 10), 1e-5)[0])
    assert np.isfinite(p["epsilon_exact"]) and p["epsilon_exact"] < p["epsilon"]
