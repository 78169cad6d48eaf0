"""Paper equations checked by hand through the real servers and clients (numpy / plain torch on the side):
Auto-FedAvg's layer-wise merge (Sec. 3.2 with Eq. 4 and Eq. 6) and one LearnAggWeight step (Alg. 1)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch.func import functional_call

from fedseg.algorithms import get_algorithm
from fedseg.algorithms.autofedavg.weights import LayerGroups, blend, stack_models
from fedseg.algorithms.prefixes import MODEL
from fedseg.engine.context import stream_seed
from fedseg.engine.simulator import Simulator
from fedseg.run import prepare
from fedseg.train import segmentation_loss


def _first_round(name: str, options: dict, tiny_config, disc_federation):
    """(prep, engine, server, replies): ``name``'s server after round 1's local training (not merged yet), on
    three sites of unequal sizes."""
    fed = disc_federation()
    fed.sites[0].cases = fed.sites[0].cases[:8]
    prep = prepare(tiny_config(), fed)
    spec = get_algorithm(name)
    parsed = spec.parse_options(options)
    engine = Simulator(spec.name, spec.client(), prep.site_data, prep.task, parsed)
    engine.round = 1
    server = spec.server(engine, prep.task, parsed)
    replies = engine.exchange({s: server.train_message(s) for s in engine.sites}, "train")
    return prep, engine, server, replies


@pytest.mark.parametrize("name", ["autofedavg-l-dirichlet", "autofedavg-l-softmax"])
def test_autofedavg_layerwise_merge_is_the_per_layer_sum_of_alpha_times_the_local_layers(
    name, tiny_config, disc_federation
):
    """w_p = sum_k alpha_{k,p} w_{k,p} (Sec. 3.2), alpha_p = softmax(beta_p) (Eq. 4) or the mode
    (beta_{k,p} - 1) / (sum_k beta_{k,p} - K) of Dir(beta_p) (Eq. 6), one beta row per layer group."""
    _, engine, server, replies = _first_round(name, {"learn_steps": 0}, tiny_config, disc_federation)
    groups, k = len(server.groups), len(engine.sites)
    assert groups > 1
    beta = 1.5 + 6.0 * torch.rand((groups, k), generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    server.beta = beta
    b = beta.numpy()
    if name.endswith("softmax"):
        alpha = np.exp(b) / np.exp(b).sum(axis=1, keepdims=True)
    else:
        alpha = (b - 1.0) / (b.sum(axis=1, keepdims=True) - k)
    server.aggregate(replies)
    for key, merged in server.global_weights.items():
        p = server.groups.of[key]
        local = [replies[s].group(MODEL)[key].double().numpy() for s in engine.sites]
        expected = sum(alpha[p, j] * local[j] for j in range(k))
        np.testing.assert_allclose(merged.double().numpy(), expected, rtol=0, atol=1e-6, err_msg=key)


def test_one_learnaggweight_step_is_each_sites_gradient_step_averaged_by_the_server(tiny_config, disc_federation):
    """Alg. 1, LearnAggWeight with S = 1: site k takes one gradient step on beta from the loss of the model
    sum_k alpha_k w_k (alpha = softmax(beta)) on a mini-batch of its own data; the server averages the K betas,
    and the merge uses alpha = softmax of that average."""
    lr = 5.0
    options = {"learn_steps": 1, "beta_optimizer": "sgd", "beta_lr": lr}
    prep, engine, server, replies = _first_round("autofedavg-n-softmax", options, tiny_config, disc_federation)
    beta0 = server.beta.clone()
    models = [replies[s].group(MODEL) for s in engine.sites]
    server.aggregate(replies)

    model = prep.task.new_model().eval()
    groups = LayerGroups.of_model(model, "network")
    stacked = stack_models(models, torch.device("cpu"))
    loss_fn = segmentation_loss(prep.task.cfg.train)
    stepped = []
    for i, site in enumerate(prep.site_data):
        beta = beta0.clone().requires_grad_(True)
        generator = torch.Generator().manual_seed(stream_seed(prep.task.cfg.seed, i, 1, "learn_weights/0"))
        order = torch.randperm(len(site.train), generator=generator)
        x, y = site.train.training_batch(order[: prep.task.cfg.train.batch_size], torch.device("cpu"), generator)
        loss = loss_fn(functional_call(model, blend(stacked, torch.softmax(beta, dim=-1), groups.of), (x,)), y)
        loss.backward()
        stepped.append((beta - lr * beta.grad).detach())
    expected = torch.stack(stepped).mean(dim=0)
    assert not torch.equal(expected, beta0)  # the step moved beta
    torch.testing.assert_close(server.beta, expected, rtol=0, atol=1e-12)
    alpha = torch.softmax(expected, dim=-1)[0].tolist()
    for key, merged in server.global_weights.items():
        want = sum(a * m[key].double() for a, m in zip(alpha, models))
        torch.testing.assert_close(merged.double(), want, rtol=0, atol=1e-6)
