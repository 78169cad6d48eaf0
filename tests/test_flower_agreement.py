"""fedseg's server merges agree with Flower's own strategies (flwr 1.41.0, message API:
``flwr.serverapp.strategy.<Strategy>.aggregate_train`` on reply Messages carrying one
ArrayRecord and one MetricRecord with ``num-examples``) on the same client models.

Definition differences, stated where they matter:
- FedAdam: Flower multiplies eta by a bias correction ``sqrt(1 - beta2^(t+1)) / (1 - beta1^(t+1))``
  with ``t`` the server round (one power ahead of Kingma & Ba's ``t``); the FeTS benchmark (Eq. 12,
  Algorithm 1) and Reddi et al. use no bias correction. Everything else (pseudo-gradient = weighted
  mean of ``w_k - w``, moments, ``tau`` added to ``sqrt(v)``) is the same, so the test runs fedseg
  with ``eta_s`` set to Flower's corrected rate of each round and asserts agreement.
- FedProx: the proximal term is client-side (Flower only forwards ``proximal-mu`` in the train
  config); the server merge is FedAvg's in both.
- FedMedian / FedTrimmedAvg: unweighted in both; the trim count is ``int(beta * K)`` in both.
Flower accumulates in float32, fedseg in float64: agreement is asserted to 1e-6.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from flwr.app import ArrayRecord
from flwr.serverapp.strategy import FedAdam, FedAvg, FedMedian, FedProx, FedTrimmedAvg
from torch import nn

from fedseg.algorithms import get_algorithm
from fedseg.algorithms.prefixes import MODEL
from fedseg.engine.messages import Message, prefixed
from flower_messages import flower_replies

SHAPES = {"enc.weight": (6, 3, 3), "enc.bias": (6,), "head.weight": (2, 6)}
SAMPLES = [13, 40, 7, 25]  # unequal sample counts


def client_models(n_sites: int, seed: int, center: dict[str, np.ndarray] | None = None) -> list[dict[str, np.ndarray]]:
    """Random float32 models (around ``center`` if given, as after a local round)."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n_sites):
        out.append(
            {
                k: ((center[k] if center else 0) + rng.normal(0, 0.1 if center else 1, s)).astype(np.float32)
                for k, s in SHAPES.items()
            }
        )
    return out


class _Params(nn.Module):
    """A 'network' whose state has the names and shapes of ``SHAPES``."""

    def __init__(self):
        super().__init__()
        for name, shape in SHAPES.items():
            owner, leaf = name.split(".")
            if not hasattr(self, owner):
                self.add_module(owner, nn.Module())
            getattr(self, owner).register_parameter(leaf, nn.Parameter(torch.zeros(shape)))


class _Task:
    def __init__(self, cfg):
        self.cfg = cfg

    def new_model(self):
        return _Params()


@pytest.fixture
def fedseg_merge(tiny_config):
    """The function ``fedseg_merge(name, models, samples, options=None, server=None, start=None)``."""

    def merge(name: str, models, samples, options: dict | None = None, server=None, start=None):
        """One fedseg server merge of ``models`` (with ``samples``) from global model ``start``."""
        spec = get_algorithm(name)
        if server is None:
            server = spec.server(None, _Task(tiny_config()), spec.parse_options(options))
        if start is not None:
            server.global_weights = {k: torch.from_numpy(v.copy()) for k, v in start.items()}
        replies = {
            f"site{i}": Message(
                prefixed(MODEL, {k: torch.from_numpy(v.copy()) for k, v in m.items()}), {"num_examples": n}
            )
            for i, (m, n) in enumerate(zip(models, samples))
        }
        server.aggregate(replies)
        return server

    return merge


def assert_agree(fedseg_weights: dict[str, torch.Tensor], flower_arrays: ArrayRecord):
    assert set(fedseg_weights) == set(flower_arrays.keys())
    for k, t in fedseg_weights.items():
        np.testing.assert_allclose(t.numpy(), flower_arrays[k].numpy(), rtol=0, atol=1e-6, err_msg=k)


@pytest.mark.parametrize("n_sites", [3, 4])
def test_fedavg_samples_weighted_agrees_with_flower(n_sites, fedseg_merge):
    models, samples = client_models(n_sites, seed=n_sites), SAMPLES[:n_sites]
    arrays, _ = FedAvg().aggregate_train(1, flower_replies(models, samples))
    assert_agree(fedseg_merge("fedavg", models, samples).global_weights, arrays)


def test_fedprox_server_merge_agrees_with_flower(fedseg_merge):
    models = client_models(4, seed=11)
    arrays, _ = FedProx(proximal_mu=0.01).aggregate_train(1, flower_replies(models, SAMPLES))
    assert_agree(fedseg_merge("fedprox", models, SAMPLES, {"mu": 0.01}).global_weights, arrays)


@pytest.mark.parametrize("n_sites", [3, 4])
def test_fedmedian_agrees_with_flower(n_sites, fedseg_merge):
    models, samples = client_models(n_sites, seed=20 + n_sites), SAMPLES[:n_sites]
    arrays, _ = FedMedian().aggregate_train(1, flower_replies(models, samples))
    assert_agree(fedseg_merge("fedmedian", models, samples).global_weights, arrays)


@pytest.mark.parametrize("beta", [0.2, 0.25, 0.3])  # with 4 sites: cut 0, 1, 1 per end
def test_fedtrimmedavg_agrees_with_flower(beta, fedseg_merge):
    models = client_models(4, seed=30)
    arrays, _ = FedTrimmedAvg(beta=beta).aggregate_train(1, flower_replies(models, SAMPLES))
    assert_agree(fedseg_merge("fedtrimmedavg", models, SAMPLES, {"beta": beta}).global_weights, arrays)


def flower_eta_norm(eta: float, beta1: float, beta2: float, server_round: int) -> float:
    """Flower's bias-corrected server rate (``FedAdam.aggregate_train``)."""
    return eta * np.sqrt(1 - beta2 ** (server_round + 1.0)) / (1 - beta1 ** (server_round + 1.0))


@pytest.mark.parametrize("tau", [1e-3, 1e-8])
def test_fedadam_one_and_two_server_steps_agree_with_flower(tau, fedseg_merge):
    eta, beta1, beta2 = 0.01, 0.9, 0.99
    rng = np.random.default_rng(5)
    start = {k: rng.normal(0, 1, s).astype(np.float32) for k, s in SHAPES.items()}
    strategy = FedAdam(eta=eta, beta_1=beta1, beta_2=beta2, tau=tau)
    server, current = None, start
    for rnd in (1, 2):
        models = client_models(4, seed=40 + rnd, center=current)
        strategy.current_arrays = {k: v.copy() for k, v in current.items()}  # what configure_train records
        arrays, _ = strategy.aggregate_train(rnd, flower_replies(models, SAMPLES))
        # same step with fedseg, at Flower's bias-corrected rate of this round (the one definition difference)
        options = {"eta_s": flower_eta_norm(eta, beta1, beta2, rnd), "beta1": beta1, "beta2": beta2, "tau": tau}
        if server is None:
            server = fedseg_merge("fedadam", models, SAMPLES, options, start=current)
        else:
            server.options = get_algorithm("fedadam").parse_options(options)
            fedseg_merge("fedadam", models, SAMPLES, server=server)
        assert_agree(server.global_weights, arrays)
        for k in SHAPES:  # the server moments agree too
            np.testing.assert_allclose(server.m[k].numpy(), strategy.m_t[k], rtol=0, atol=1e-6)
            np.testing.assert_allclose(server.v[k].numpy(), strategy.v_t[k], rtol=0, atol=1e-6)
        current = {k: arrays[k].numpy() for k in SHAPES}
