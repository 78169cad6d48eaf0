"""Robust aggregation (``fedseg.algorithms.robust``; the FedAvg pair's ``aggregator`` option).

Agreement with Flower (flwr 1.41.0) on random models, both APIs:
- ``flwr.server.strategy.aggregate.aggregate_krum`` (``to_keep = 0``: Krum; ``> 0``: Multi-Krum, the
  kept models averaged by num_examples) and ``aggregate_bulyan`` with ``aggregate_krum, to_keep=0``
  (El Mhamdi et al.'s recursive Krum selection);
- the message-API strategies ``flwr.serverapp.strategy.Krum``, ``MultiKrum`` and ``Bulyan`` (one
  Multi-Krum pass keeping ``theta`` models: fedseg's ``selection="multikrum"``);
- clipping: ``flwr.supercore.differential_privacy.compute_clip_model_update`` then Flower's weighted
  ``aggregate`` (server-side fixed clipping without noise).
Models are float64 here so that Flower's distances (float64 norms of differences; the message API
uses ``|x|^2 + |y|^2 - 2x.y``) order the sites exactly as fedseg's; agreement is asserted to 1e-6.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from flwr.app import ArrayRecord
from flwr.server.strategy.aggregate import aggregate, aggregate_bulyan, aggregate_krum
from flwr.serverapp.strategy import Bulyan, Krum, MultiKrum
from flwr.supercore.differential_privacy import compute_clip_model_update
from torch import nn

from fedseg.algorithms import get_algorithm
from fedseg.algorithms.aggregate import weighted_average
from fedseg.algorithms.fedavg import FedAvgClient, FedAvgOptions, FedAvgServer
from fedseg.algorithms.prefixes import MODEL
from fedseg.algorithms.registry import AlgorithmSpec
from fedseg.algorithms.robust import (
    bulyan,
    bulyan_select,
    clipped_mean,
    clipped_merge,
    krum,
    krum_select,
    update_norms,
)
from fedseg.engine.messages import Message, prefixed
from flower_messages import flower_replies

SHAPES = {"enc.weight": (4, 3, 3), "enc.bias": (4,), "head.weight": (2, 4)}


def models_np(n: int, seed: int, spread: float = 1.0) -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(seed)
    return [{k: rng.normal(0, spread, s) for k, s in SHAPES.items()} for _ in range(n)]


def as_torch(models: list[dict[str, np.ndarray]]) -> list[dict[str, torch.Tensor]]:
    return [{k: torch.from_numpy(v.copy()) for k, v in m.items()} for m in models]


def ndarrays(m: dict[str, np.ndarray]) -> list[np.ndarray]:
    return [m[k].copy() for k in SHAPES]


def assert_close(ours: dict[str, torch.Tensor], theirs: list[np.ndarray], atol: float = 1e-6) -> None:
    assert list(ours) == list(SHAPES)
    for (k, t), ref in zip(ours.items(), theirs):
        np.testing.assert_allclose(t.numpy(), np.asarray(ref), rtol=0, atol=atol, err_msg=k)


def samples(n: int, seed: int) -> list[int]:
    return [int(x) for x in np.random.default_rng(seed + 100).integers(5, 60, n)]


class _Params(nn.Module):
    """A 'network' whose state has the names and shapes of ``SHAPES`` (float64)."""

    def __init__(self):
        super().__init__()
        for name, shape in SHAPES.items():
            owner, leaf = name.split(".")
            if not hasattr(self, owner):
                self.add_module(owner, nn.Module())
            getattr(self, owner).register_parameter(leaf, nn.Parameter(torch.zeros(shape, dtype=torch.float64)))


class _Task:
    def __init__(self, cfg):
        self.cfg = cfg

    def new_model(self):
        return _Params()


def server_merge(tiny_config, name: str, models, weights, options=None, start=None) -> FedAvgServer:
    """One merge of ``models`` (numpy, with sample counts ``weights``) by the server of ``name``."""
    spec = get_algorithm(name)
    server = spec.server(None, _Task(tiny_config()), spec.parse_options(options))
    if start is not None:
        server.global_weights = {k: torch.from_numpy(v.copy()) for k, v in start.items()}
    replies = {
        f"site{i}": Message(prefixed(MODEL, m), {"num_examples": n})
        for i, (m, n) in enumerate(zip(as_torch(models), weights))
    }
    server.aggregate(replies)
    return server


def flower_arrays(record: ArrayRecord) -> list[np.ndarray]:
    return [record[k].numpy() for k in SHAPES]


# --- Krum / Multi-Krum ----------------------------------------------------------------------------
KRUM_CASES = [(n, f, seed) for n, f in [(5, 1), (6, 1), (7, 2), (9, 3), (10, 2)] for seed in (0, 1)]


@pytest.mark.parametrize("n, f, seed", KRUM_CASES)
def test_krum_is_flowers_aggregate_krum(n, f, seed):
    models = models_np(n, seed)
    ref = aggregate_krum([(ndarrays(m), 1) for m in models], f, to_keep=0)
    ours = krum(as_torch(models), f)
    assert_close(ours, ref, atol=0)  # the selected model itself


@pytest.mark.parametrize("n, f, seed", KRUM_CASES)
@pytest.mark.parametrize("keep", [2, 3, "n-f"])
def test_multikrum_is_flowers_aggregate_krum_weighted_by_samples(n, f, seed, keep):
    m = n - f if keep == "n-f" else keep
    models, counts = models_np(n, seed), samples(n, seed)
    ref = aggregate_krum([(ndarrays(x), c) for x, c in zip(models, counts)], f, to_keep=m)
    assert_close(krum(as_torch(models), f, to_keep=m, weights=counts), ref)


@pytest.mark.parametrize("n, f, seed", KRUM_CASES)
def test_krum_and_multikrum_servers_agree_with_flowers_message_api(n, f, seed, tiny_config):
    models, counts = models_np(n, seed), samples(n, seed)
    theirs, _ = Krum(num_malicious_nodes=f).aggregate_train(1, flower_replies(models, counts))
    ours = server_merge(tiny_config, "krum", models, counts, {"num_malicious": f}).global_weights
    assert_close(ours, flower_arrays(theirs))
    m = n - f - 1
    theirs, _ = MultiKrum(num_malicious_nodes=f, num_nodes_to_select=m).aggregate_train(
        1, flower_replies(models, counts)
    )
    options = {"num_malicious": f, "multikrum_keep": m}
    assert_close(server_merge(tiny_config, "multikrum", models, counts, options).global_weights, flower_arrays(theirs))


def test_multikrum_default_keeps_n_minus_f_and_uniform_weighting_is_the_papers_plain_average(tiny_config):
    models, counts = models_np(7, 3), samples(7, 3)
    chosen = krum_select(as_torch(models), 2, to_keep=5)
    server = server_merge(tiny_config, "multikrum", models, counts, {"num_malicious": 2, "weighting": "uniform"})
    expected = weighted_average([as_torch(models)[i] for i in chosen], [1.0] * 5)
    assert all(torch.equal(server.global_weights[k], expected[k]) for k in SHAPES)
    kept = {r["site"] for r in server.round_metrics() if r["metric"] == "robust_kept" and r["value"] == 1.0}
    assert kept == {f"site{i}" for i in chosen}


# --- Bulyan --------------------------------------------------------------------------------------
BULYAN_CASES = [(n, f, seed) for n, f in [(7, 1), (8, 1), (10, 1), (11, 2), (12, 2)] for seed in (0, 1, 2)]


@pytest.mark.parametrize("n, f, seed", BULYAN_CASES)
def test_bulyan_is_flowers_aggregate_bulyan_with_recursive_krum(n, f, seed):
    models = models_np(n, seed)
    ref = aggregate_bulyan([(ndarrays(m), 1) for m in models], f, aggregate_krum, to_keep=0)
    assert_close(bulyan(as_torch(models), f), ref)


@pytest.mark.parametrize("n, f, seed", BULYAN_CASES)
def test_bulyan_multikrum_selection_is_flowers_message_api_bulyan(n, f, seed, frozen_heap):
    models, counts = models_np(n, seed), samples(n, seed)
    theirs, _ = Bulyan(num_malicious_nodes=f).aggregate_train(1, flower_replies(models, counts))
    assert_close(bulyan(as_torch(models), f, selection="multikrum"), flower_arrays(theirs))


@pytest.mark.parametrize("n, f, seed", BULYAN_CASES[:6])
def test_bulyan_server_is_the_recursive_rule_and_ignores_sample_counts(n, f, seed, tiny_config):
    models, counts = models_np(n, seed), samples(n, seed)
    ref = aggregate_bulyan([(ndarrays(m), c) for m, c in zip(models, counts)], f, aggregate_krum, to_keep=0)
    assert_close(server_merge(tiny_config, "bulyan", models, counts, {"num_malicious": f}).global_weights, ref)


def test_the_two_bulyan_selections_differ_where_recursion_matters():
    """Recursive Krum re-scores the remaining models after each pick; one Multi-Krum pass does not.
    Some random sets must tell them apart (else the option would be pointless)."""
    differ = 0
    for seed in range(40):
        models = as_torch(models_np(7, seed))
        differ += set(bulyan_select(models, 1)) != set(bulyan_select(models, 1, "multikrum"))
    assert differ > 0


# --- clipped mean --------------------------------------------------------------------------------
@pytest.mark.parametrize("clip", [0.5, 2.0, 4.0])
def test_clipped_merge_is_flowers_fixed_clipping_then_weighted_average(clip):
    start = models_np(1, 7)[0]
    models, counts = models_np(5, 8), samples(5, 8)
    clipped = []
    for m in models:
        arrays = ndarrays(m)
        compute_clip_model_update(arrays, ndarrays(start), clip)  # arrays <- start + clip(arrays - start)
        clipped.append(arrays)
    ref = aggregate(list(zip(clipped, counts)))
    ours = clipped_merge(as_torch([start])[0], as_torch(models), counts, clip)
    assert_close(ours, ref)


def test_clipped_updates_respect_the_bound_and_large_c_is_the_plain_mean():
    updates, counts = as_torch(models_np(6, 9, spread=3.0)), samples(6, 9)
    norms = update_norms(updates)
    c = 0.25 * min(norms)
    for k, u in enumerate(updates):  # each clipped update alone: norm exactly C
        alone = clipped_mean([u], [1.0], c)
        assert update_norms([alone])[0] == pytest.approx(c, rel=1e-12)
        assert update_norms([clipped_mean([u], [1.0], 2 * norms[k])])[0] == pytest.approx(norms[k], rel=1e-12)
    mean = clipped_mean(updates, counts, c)
    assert update_norms([mean])[0] <= c * (1 + 1e-12)  # a convex combination of vectors of norm C
    large = clipped_mean(updates, counts, 10 * max(norms))
    plain = weighted_average(updates, counts)
    assert all(torch.allclose(large[k], plain[k], rtol=0, atol=1e-12) for k in SHAPES)
    zero = {k: torch.zeros_like(v) for k, v in updates[0].items()}
    assert all(torch.equal(t, torch.zeros_like(t)) for t in clipped_mean([zero], [1.0], 1.0).values())


def test_clipped_server_reports_clip_factors_and_keeps_the_model_dtype(tiny_config):
    start, models, counts = models_np(1, 1)[0], models_np(4, 2), samples(4, 2)
    server = server_merge(tiny_config, "fedavg", models, counts, {"aggregator": "clipped", "clip_norm": 1.0}, start)
    ref = clipped_merge(as_torch([start])[0], as_torch(models), counts, 1.0)
    assert all(torch.equal(server.global_weights[k], ref[k]) for k in SHAPES)
    rows = {(r["site"], r["metric"]): r["value"] for r in server.round_metrics()}
    for i, m in enumerate(models):
        norm = float(np.sqrt(sum(((m[k] - start[k]) ** 2).sum() for k in SHAPES)))
        assert rows[(f"site{i}", "update_norm")] == pytest.approx(norm)
        assert rows[(f"site{i}", "clip_factor")] == pytest.approx(min(1.0, 1.0 / norm))


# --- mean stays FedAvg, bit for bit ---------------------------------------------------------------
@pytest.mark.parametrize("options", [None, {"aggregator": "mean"}, {"aggregator": "mean", "num_malicious": 3}])
def test_mean_aggregator_is_fedavgs_weighted_average_bit_for_bit(options, tiny_config):
    models, counts = models_np(4, 4), samples(4, 4)
    models32 = [{k: v.astype(np.float32) for k, v in m.items()} for m in models]
    server = server_merge(tiny_config, "fedavg", models32, counts, options)
    before = weighted_average(as_torch(models32), [float(c) for c in counts])  # FedAvgServer.aggregate before
    assert all(torch.equal(server.global_weights[k], before[k]) for k in SHAPES)
    assert server.global_weights["enc.weight"].dtype == torch.float32
    assert server.round_metrics() == []


# --- one attacker scaling its update by 100 -------------------------------------------------------
def attacked(n_honest: int, seed: int = 0, factor: float = 100.0):
    """Honest models around a common update of w; the last site sends w + factor * (w_k - w)."""
    rng = np.random.default_rng(seed)
    w = {k: rng.normal(0, 1, s) for k, s in SHAPES.items()}
    step = {k: rng.normal(0, 0.1, s) for k, s in SHAPES.items()}
    honest = [{k: w[k] + step[k] + rng.normal(0, 0.02, s) for k, s in SHAPES.items()} for _ in range(n_honest)]
    attacker = {k: w[k] + factor * (honest[0][k] - w[k]) for k in SHAPES}
    honest_mean = {k: np.mean([h[k] for h in honest], axis=0) for k in SHAPES}
    return w, [*honest, attacker], honest_mean


def distance(a: dict[str, torch.Tensor], b: dict[str, np.ndarray]) -> float:
    return float(np.sqrt(sum(((a[k].numpy() - b[k]) ** 2).sum() for k in SHAPES)))


@pytest.mark.parametrize(
    "name, options, n_honest",
    [
        ("krum", {}, 5),
        ("multikrum", {}, 5),
        ("bulyan", {}, 6),  # 7 sites: Bulyan needs n >= 4f + 3
        ("fedavg", {"aggregator": "clipped", "clip_norm": 0.5}, 5),
    ],
)
def test_one_scaled_attacker_moves_fedavg_but_not_the_robust_merges(name, options, n_honest, tiny_config):
    w, models, honest_mean = attacked(n_honest)
    counts = [20] * len(models)
    step = float(np.sqrt(sum(((honest_mean[k] - w[k]) ** 2).sum() for k in SHAPES)))  # ~ the honest update norm
    fedavg = server_merge(tiny_config, "fedavg", models, counts, start=w).global_weights
    assert distance(fedavg, honest_mean) > 10 * step  # the attacker drags the plain mean far away
    robust = server_merge(tiny_config, name, models, counts, options, start=w)
    limit = 0.6 if options.get("aggregator") == "clipped" else 0.2  # clipping bounds, does not remove
    assert distance(robust.global_weights, honest_mean) < limit * step
    rows = {(r["site"], r["metric"]): r["value"] for r in robust.round_metrics()}
    attacker = f"site{len(models) - 1}"
    if name != "fedavg":
        assert rows[(attacker, "robust_kept")] == 0.0
    assert rows[(attacker, "update_norm")] > 50 * rows[("site0", "update_norm")]


class _ScalingClient(FedAvgClient):
    """FedAvg's client; site1 sends w + 100 (w_1 - w) (a model-poisoning attacker)."""

    def after_fit(self, model, stats, msg, ctx) -> Message:
        reply = super().after_fit(model, stats, msg, ctx)
        if ctx.site != "site1":
            return reply
        sent, mine = msg.group(MODEL), reply.group(MODEL)
        scaled = {k: sent[k] + 100.0 * (mine[k] - sent[k]) for k in mine}
        return Message(prefixed(MODEL, scaled), reply.meta)


def test_a_federation_with_an_attacking_site_krum_leaves_it_out(tmp_path, tiny_config, disc_federation):
    from fedseg.algorithms import register_algorithm, unregister_algorithm
    from fedseg.run import run_experiment

    spec = AlgorithmSpec("test-attacked", "Attacked", FedAvgServer, _ScalingClient, "test only", FedAvgOptions)
    register_algorithm(spec)
    try:
        cfg = tiny_config(
            algorithms=["test-attacked"],
            methods={"test-attacked": {"aggregator": "krum"}},
            fl={"rounds": 1},
            eval={"hd95": False, "local_models": False},
        )
        results = run_experiment(cfg, tmp_path, federation=disc_federation(n_sites=5, cases_per_site=6))
    finally:
        unregister_algorithm("test-attacked")
    rows = {(r["site"], r["metric"]): r["value"] for r in results.algorithms[0].metric_rows}
    assert rows[("site1", "robust_kept")] == 0.0 and sum(rows[(f"site{i}", "robust_kept")] for i in range(1, 6)) == 1
    assert rows[("site1", "update_norm")] > 20 * max(rows[(f"site{i}", "update_norm")] for i in range(2, 6))


# --- requirements and refusals --------------------------------------------------------------------
def test_too_few_updates_raise_naming_num_malicious():
    with pytest.raises(ValueError, match=r"Krum needs n > 2 \* num_malicious \+ 2 .* n = 4 with num_malicious = 1"):
        krum(as_torch(models_np(4, 0)), 1)
    with pytest.raises(ValueError, match=r"Multi-Krum needs .* at least 7"):
        krum(as_torch(models_np(6, 0)), 2, to_keep=3)
    with pytest.raises(ValueError, match=r"multikrum_keep \(m\) must lie in \[1, n\] = \[1, 5\], got 6"):
        krum(as_torch(models_np(5, 0)), 1, to_keep=6)
    with pytest.raises(ValueError, match=r"Bulyan needs n >= 4 \* num_malicious \+ 3 .* n = 6 with num_malicious = 1"):
        bulyan(as_torch(models_np(6, 0)), 1)


def test_site_count_is_checked_before_any_work_and_at_merge_time(tmp_path, tiny_config, disc_federation):
    from fedseg.run import run_experiment

    with pytest.raises(ValueError, match=r"methods\.bulyan\.aggregator = bulyan: Bulyan needs .* at least 7"):
        get_algorithm("bulyan").check_sites(6, "federation x")
    get_algorithm("bulyan").check_sites(6, "federation x", {"num_malicious": 0})
    with pytest.raises(ValueError, match=r"methods\.fedper\.aggregator = krum: Krum needs"):
        get_algorithm("fedper").check_sites(4, "federation x", {"aggregator": "krum"})
    with pytest.raises(ValueError, match=r"methods\.multikrum\.aggregator = multikrum: .* \[1, 5\], got 6"):
        get_algorithm("multikrum").check_sites(5, "federation x", {"multikrum_keep": 6})
    cfg = tiny_config(algorithms=["krum"], fl={"rounds": 1})
    with pytest.raises(ValueError, match=r"federation 'discs': methods\.krum\.aggregator = krum: Krum needs"):
        run_experiment(cfg, tmp_path, federation=disc_federation(n_sites=3, cases_per_site=6))
    # fewer replies than the rule needs (a skipped site): the merge says which option to change
    with pytest.raises(ValueError, match=r"methods\.fedavg\.aggregator = krum with 4 replies: .*num_malicious"):
        server_merge(tiny_config, "fedavg", models_np(4, 0), [1] * 4, {"aggregator": "krum"})


@pytest.mark.parametrize(
    "name", ["fedadam", "fednova", "scaffold", "fedpidavg", "cfl", "prior-cfl", "fedavg-continue", "fedsm"]
)
def test_methods_with_a_merge_of_their_own_refuse_a_robust_aggregator(name):
    with pytest.raises(ValueError, match=rf"methods\.{name}\.aggregator: .*'krum' is not available: .*only 'mean'"):
        get_algorithm(name).parse_options({"aggregator": "krum"})
    get_algorithm(name).parse_options({"aggregator": "mean"})


@pytest.mark.parametrize("name", ["qfedavg", "autofedavg-n-dirichlet", "fedmedian", "fedtrimmedavg"])
def test_methods_without_the_option_refuse_it_as_unknown(name):
    with pytest.raises(ValueError, match=rf"methods\.{name}\.aggregator: unknown key"):
        get_algorithm(name).parse_options({"aggregator": "krum"})


@pytest.mark.parametrize("name", ["fedavg", "fedavg-uniform", "fedprox", "ditto", "fedper", "lg-fedavg"])
def test_fedavg_family_methods_take_every_aggregator(name):
    for aggregator in ("krum", "multikrum", "bulyan"):
        assert get_algorithm(name).parse_options({"aggregator": aggregator}).aggregator == aggregator
    assert get_algorithm(name).parse_options({"aggregator": "clipped", "clip_norm": 1.5}).clip_norm == 1.5


def test_parameters_belong_to_their_aggregator():
    fedavg = get_algorithm("fedavg")
    with pytest.raises(ValueError, match=r"methods\.fedavg\.clip_norm: .*'clipped' needs clip_norm"):
        fedavg.parse_options({"aggregator": "clipped"})
    with pytest.raises(ValueError, match=r"methods\.fedavg\.clip_norm: .*only read with aggregator 'clipped'"):
        fedavg.parse_options({"aggregator": "krum", "clip_norm": 1.0})
    with pytest.raises(ValueError, match=r"methods\.krum\.multikrum_keep: .*only read with aggregator 'multikrum'"):
        get_algorithm("krum").parse_options({"multikrum_keep": 2})
    with pytest.raises(ValueError, match=r"methods\.fedavg\.num_malicious"):
        fedavg.parse_options({"aggregator": "krum", "num_malicious": -1})


def test_weighted_average_is_the_float64_sum_of_weighted_updates_to_the_last_bit():
    """The merge reuses one float64 buffer per tensor (no new tensors per update): its rounding must stay that
    of the plain formula, or results would move between versions."""
    gen = torch.Generator().manual_seed(3)
    updates = [
        {"w": torch.randn(1000, generator=gen), "b": torch.randn(3, 4, generator=gen).half(), "n": torch.tensor(k)}
        for k in range(7)
    ]
    weights = [float(k) + 0.3 for k in range(7)]
    merged = weighted_average(updates, weights)
    shares = [w / sum(weights) for w in weights]
    for name, first in updates[0].items():
        plain = sum(u[name].to(torch.float64) * c for u, c in zip(updates, shares)).to(first.dtype)
        assert merged[name].dtype == first.dtype
        assert torch.equal(merged[name], plain), name
