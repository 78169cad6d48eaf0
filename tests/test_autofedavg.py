"""Auto-FedAvg (Alg. 1): the map from beta to alpha, equivalences with FedAvg, what one learning
round learns, the ledger's extra traffic against the paper's (K - 1) / (2 t0), determinism and resume."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch

from fedseg.algorithms import get_algorithm
from fedseg.algorithms.aggregate import combine, weighted_average
from fedseg.algorithms.autofedavg.method import INSTALL, LEARN
from fedseg.algorithms.autofedavg.weights import LayerGroups, learning_alpha, merge_alpha
from fedseg.algorithms.prefixes import MODEL
from fedseg.config import BudgetConfig
from fedseg.engine.messages import Message, prefixed, weights_of
from fedseg.engine.simulator import Simulator
from fedseg.models import build_segmenter
from fedseg.run import prepare, run_experiment
from fedseg.train import Trainer

VARIANTS = ["autofedavg-n-dirichlet", "autofedavg-n-softmax", "autofedavg-l-dirichlet", "autofedavg-l-softmax"]


class _Stop(Exception):
    pass


# --------------------------------------------------------------------------- gamma: beta -> alpha
def test_softmax_alpha_lies_on_the_simplex_for_every_group():
    beta = torch.tensor([[0.3, -1.0, 2.0], [6.0, 6.0, 6.0]], dtype=torch.float64)
    for alpha in (merge_alpha(beta, "softmax"), learning_alpha(beta, "softmax")):
        assert alpha.shape == (2, 3)
        assert torch.allclose(alpha.sum(dim=-1), torch.ones(2, dtype=torch.float64), atol=1e-12)
        assert (alpha > 0).all()
    assert torch.allclose(merge_alpha(beta, "softmax")[0], torch.softmax(beta[0], dim=0))


def test_dirichlet_merge_uses_the_mode_and_falls_back_to_the_mean_without_one():
    beta = torch.tensor([[6.0, 2.5, 9.0], [0.5, 3.0, 2.0]], dtype=torch.float64)
    alpha = merge_alpha(beta, "dirichlet")
    expected_mode = (beta[0] - 1) / (beta[0].sum() - 3)  # Eq. 6
    assert torch.allclose(alpha[0], expected_mode, atol=1e-15)
    assert torch.allclose(alpha[1], beta[1] / beta[1].sum(), atol=1e-15)  # some beta_k <= 1: no mode
    uniform = merge_alpha(torch.full((1, 3), 6.0, dtype=torch.float64), "dirichlet")
    assert uniform.tolist() == [[1 / 3, 1 / 3, 1 / 3]]  # exactly: what FedAvg-uniform merges with


def test_dirichlet_rsample_gradients_reach_beta():
    beta = torch.tensor([[6.0, 6.0, 6.0]], dtype=torch.float64, requires_grad=True)
    torch.manual_seed(0)
    alpha = learning_alpha(beta, "dirichlet")
    assert torch.allclose(alpha.sum(), torch.tensor(1.0, dtype=torch.float64))
    (alpha * torch.tensor([[1.0, 0.0, -1.0]], dtype=torch.float64)).sum().backward()
    assert beta.grad is not None and torch.isfinite(beta.grad).all() and beta.grad.abs().sum() > 0


def test_layer_groups_follow_modules_with_parameters_and_keep_buffers_with_their_layer(tiny_config):
    cfg = tiny_config(model={"norm": "batch"})
    model = build_segmenter(cfg.model, 2, 3, 2, 0)
    groups = LayerGroups.of_model(model, "layer")
    float_keys = [k for k, v in model.state_dict().items() if v.is_floating_point()]
    assert sorted(groups.of) == sorted(float_keys)
    bn = "model.0.adn.N"
    assert bn in groups.names
    assert groups.of[f"{bn}.running_mean"] == groups.of[f"{bn}.weight"] == groups.names.index(bn)
    assert groups.of["model.0.conv.weight"] == groups.of["model.0.conv.bias"] != groups.of[f"{bn}.weight"]
    assert set(LayerGroups.of_model(model, "network").of.values()) == {0}


# --------------------------------------------------------------------------- equivalences with FedAvg
@pytest.mark.parametrize("variant", ["autofedavg-n-softmax", "autofedavg-l-dirichlet"])
def test_without_learning_steps_and_uniform_beta_it_is_fedavg_uniform_bit_for_bit(
    tmp_path, variant, tiny_config, disc_federation
):
    cfg = tiny_config(algorithms=["fedavg-uniform", variant], methods={variant: {"learn_steps": 0}})
    res = run_experiment(cfg, tmp_path / "run", federation=disc_federation())
    ref, auto = res.algorithms
    assert ref.bundle["global"].keys() == auto.bundle["global"].keys()
    for key, value in ref.bundle["global"].items():
        assert torch.equal(value, auto.bundle["global"][key]), key
    # NaN where a metric is not computed (the cross-site rows' HD95/NSD): equal NaNs count as equal
    np.testing.assert_array_equal([r["value"] for r in ref.test_rows], [r["value"] for r in auto.test_rows])
    strip = lambda rows: [{k: v for k, v in r.items() if k not in ("seconds", "wall_seconds")} for r in rows]  # noqa: E731
    assert strip(ref.ledger) == strip(auto.ledger)


def test_with_alpha_at_the_sample_shares_the_merge_is_fedavgs(tiny_config, disc_federation):
    """Dirichlet beta_k = 1 + n_k has the mode n_k / n exactly: the merge of one real round equals FedAvg's."""
    fed = disc_federation()
    fed.sites[0].cases = fed.sites[0].cases[:8]  # unequal n_k, so the shares differ from uniform
    prep = prepare(tiny_config(), fed)
    spec = get_algorithm("autofedavg-n-dirichlet")
    options = spec.parse_options({"learn_steps": 0})
    engine = Simulator(spec.name, spec.client(), prep.site_data, prep.task, options)
    engine.round = 1
    auto = spec.server(engine, prep.task, options)
    replies = engine.exchange({s: auto.train_message(s) for s in engine.sites}, "train")
    n = [float(replies[s].meta["num_examples"]) for s in engine.sites]
    assert len(set(n)) > 1
    auto.beta = torch.tensor([[1.0 + nk for nk in n]], dtype=torch.float64)
    auto.aggregate(replies)
    fedavg = get_algorithm("fedavg").server(engine, prep.task, get_algorithm("fedavg").parse_options({}))
    fedavg.aggregate(replies)
    for key, value in fedavg.global_weights.items():
        assert torch.equal(value, auto.global_weights[key]), key


def test_combine_with_normalized_weights_is_the_weighted_average():
    updates = [{"w": torch.randn(4, generator=torch.Generator().manual_seed(i))} for i in range(3)]
    n = [5.0, 7.0, 11.0]
    shares = [x / sum(n) for x in n]
    assert torch.equal(combine(updates, lambda name: shares)["w"], weighted_average(updates, n)["w"])


# --------------------------------------------------------------------------- what a learning round learns
def _trained_and_random_models(prep, steps: int = 60) -> list[dict[str, torch.Tensor]]:
    """Site 0's model trained on every site's data (it lowers every site's loss); sites 1, 2: random inits."""
    task = prep.task
    trained = task.new_model()
    trainer = Trainer(task.cfg.train, task.device)
    for site in prep.site_data:
        trainer.fit(
            trained, site.train, torch.Generator().manual_seed(0), budget=BudgetConfig(unit="steps", amount=steps)
        )
    models = [weights_of(trained)]
    for seed in (11, 12):
        net = build_segmenter(task.cfg.model, task.spatial_dims, task.in_channels, len(task.regions), seed)
        models.append(weights_of(net))
    return models


@pytest.mark.parametrize("variant", ["autofedavg-n-softmax", "autofedavg-n-dirichlet", "autofedavg-l-softmax"])
def test_one_learning_round_moves_beta_toward_the_site_whose_model_helps_the_others(
    variant, tiny_config, disc_federation
):
    prep = prepare(tiny_config(train={"batch_size": 4, "lr": 3e-3}), disc_federation())
    spec = get_algorithm(variant)
    options = spec.parse_options({"learn_steps": 15, "beta_lr": 0.1})
    engine = Simulator(spec.name, spec.client(), prep.site_data, prep.task, options)
    engine.round = 1
    server = spec.server(engine, prep.task, options)
    models = _trained_and_random_models(prep)
    # the sites keep their own model when they train; here each site is handed its model directly
    for i, site in enumerate(engine.sites):
        engine.client_states[site].update(prefixed(f"autofedavg/models/{i}", models[i]))
    replies = {s: Message(prefixed(MODEL, models[i])) for i, s in enumerate(engine.sites)}
    before = server.alpha.mean(dim=0)
    server.beta = server.learn_beta(replies)
    after = server.alpha.mean(dim=0)
    assert after[0] > before[0] + 0.02, (before, after)
    assert (after[1:] < before[1:]).all(), (before, after)
    assert server.beta[:, 0].mean() > server.beta[:, 1:].mean()
    assert all(not any(k.startswith("autofedavg/models/") for k in st) for st in engine.client_states.values())


# --------------------------------------------------------------------------- ledger: (K - 1) / (2 t0)
@pytest.mark.parametrize("t0, rounds", [(1, 2), (4, 4)])
def test_extra_traffic_is_the_papers_k_minus_1_over_2_t0(tmp_path, t0, rounds, tiny_config, disc_federation):
    variant = "autofedavg-n-dirichlet"
    cfg = tiny_config(algorithms=["fedavg-uniform", variant], fl={"rounds": rounds}, methods={variant: {"t0": t0}})
    res = run_experiment(cfg, tmp_path / "run", federation=disc_federation())
    fedavg, auto = (a.summary["floats_sent"] for a in res.algorithms)
    learn_rows = [r for r in res.algorithms[1].ledger if r["action"] == LEARN]
    beta_floats = sum(r["floats_down"] + r["floats_up"] for r in learn_rows)
    k = len(disc_federation().sites)
    assert beta_floats > 0 and all(r["floats_down"] == r["floats_up"] == k for r in learn_rows)  # (G=1) x K
    assert sum(1 for r in res.algorithms[1].ledger if r["action"] == INSTALL) == k * (rounds // t0)
    ratio = (auto - fedavg) / fedavg
    assert math.isclose(ratio - beta_floats / fedavg, (k - 1) / (2 * t0), rel_tol=0, abs_tol=1e-12)


# --------------------------------------------------------------------------- determinism, resume
def test_same_seed_same_numbers_and_resume_after_a_learning_round(tmp_path, tiny_config, disc_federation):
    variant = "autofedavg-l-dirichlet"
    cfg = tiny_config(algorithms=[variant], fl={"rounds": 3}, methods={variant: {"t0": 2, "learn_steps": 3}})
    full = run_experiment(cfg, tmp_path / "full", federation=disc_federation())
    again = run_experiment(cfg, tmp_path / "again", federation=disc_federation())

    def stop_after_learning_round(name, rnd, losses):
        if rnd == 2:
            raise _Stop

    with pytest.raises(_Stop):
        run_experiment(cfg, tmp_path / "cut", on_round_end=stop_after_learning_round, federation=disc_federation())
    resumed = run_experiment(cfg, tmp_path / "cut", resume=True, federation=disc_federation())
    for other in (again, resumed):
        a, b = full.algorithms[0], other.algorithms[0]
        for key, value in a.bundle["global"].items():
            assert torch.equal(value, b.bundle["global"][key]), key
        assert a.metric_rows == b.metric_rows
    summaries = [
        json.loads((tmp_path / d / "summary.json").read_text())["algorithms"][variant] for d in ("full", "cut")
    ]
    assert summaries[0]["dice"] == summaries[1]["dice"] and summaries[0]["floats_sent"] == summaries[1]["floats_sent"]
    learned = [r for r in full.algorithms[0].metric_rows if r["metric"] == "learned"]
    assert {r["round"] for r in learned if r["value"] == 1.0} == {2}


def test_options_are_checked_and_the_variant_cannot_be_changed():
    spec = get_algorithm("autofedavg-n-dirichlet")
    with pytest.raises(ValueError, match="methods.autofedavg-n-dirichlet.parameterization"):
        spec.parse_options({"parameterization": "softmax"})
    with pytest.raises(ValueError, match="beta_init"):
        spec.parse_options({"beta_init": 0.0})
    with pytest.raises(ValueError, match="t0"):
        spec.parse_options({"t0": 0})
    assert get_algorithm("autofedavg-l-softmax").parse_options({"beta_init": -1.0}).beta_init == -1.0


def test_a_sites_beta_is_checked_before_it_joins_the_average():
    """beta is the mean of the sites' learned betas: one site's 1e30 (softmax) made its model the global one, a
    negative Dirichlet concentration made NaN the method was blamed for (a trust-boundary audit). With Adam an
    honest beta moves about beta_lr per step; under Dirichlet it stays above its floor."""
    from fedseg.algorithms.autofedavg.method import BETA, AutoFedAvgServer
    from fedseg.algorithms.autofedavg.weights import BETA_FLOOR

    server = AutoFedAvgServer.__new__(AutoFedAvgServer)
    server.options = get_algorithm("autofedavg-l-dirichlet").parse_options({"beta_lr": 0.01})
    sent = Message({BETA: torch.ones(2, 3, dtype=torch.float64)}, {"count": 5})
    moved = lambda delta: Message({BETA: sent.tensors[BETA] + delta})  # noqa: E731
    assert server.beta_reply_problem("s", sent, moved(0.03)) is None  # 5 steps of about 0.01
    assert "moved 1e+30 in 5 Adam steps" in server.beta_reply_problem("s", sent, moved(1e30))
    assert "below the Dirichlet floor" in server.beta_reply_problem("s", sent, moved(-1.0 - BETA_FLOOR / 2))


def test_weights_are_learned_on_a_network_with_batchnorm(tmp_path, tiny_config, disc_federation):
    """BatchNorm's running statistics are blended with the learned alpha but not differentiated through (the layer
    cannot): learning beta on a model.norm = batch network stopped with a RuntimeError on every site."""
    cfg = tiny_config(algorithms=["autofedavg-l-dirichlet"], fl={"rounds": 1}, model={"norm": "batch"})
    (result,) = run_experiment(cfg, tmp_path, federation=disc_federation()).algorithms
    assert result.summary["failures"] == [] and any(k.endswith("running_mean") for k in result.bundle["global"])
