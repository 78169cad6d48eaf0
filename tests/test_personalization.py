"""FedSM personalization alternatives (paper Table 6): softpull | ft | apfl | perfedavg | pfedme."""

from __future__ import annotations

import math
from collections import defaultdict

import pytest
import torch

from fedseg.algorithms import get_algorithm
from fedseg.algorithms.client_state import state_group
from fedseg.algorithms.fedsm.method import new_selector
from fedseg.algorithms.fedsm.personalize import APFL_ALPHA, APFL_V, PERSONAL, TRACK, personalization
from fedseg.engine.messages import Message, load_weights, prefixed
from fedseg.models import count_parameters
from fedseg.run import prepare, run_algorithm
from fedseg.train import segmentation_loss
from test_fedsm import _engine, _round

SEL = {"selector_width": 0.0625, "average_selector_moments": False}  # tiny selector, the paper's ledger
STRATEGIES = ("softpull", "ft", "apfl", "perfedavg", "pfedme")


@pytest.fixture
def make_cfg(tiny_config):
    """Factory ``make_cfg(strategy, name="fedsm", rounds=2, train=None, **method)``."""

    def make(strategy, name="fedsm", rounds=2, train=None, **method):
        return tiny_config(
            algorithms=[name],
            fl={"rounds": rounds},
            eval={"hd95": False},
            train=train or {},
            methods={name: {**SEL, "personalization": strategy, **method}},
        )

    return make


def _recorder():
    """An engine observer keeping each site's last train message and reply."""
    seen = {}

    def observe(site, action, msg, reply):
        if action == "train":
            seen[site] = (msg, reply)

    return seen, observe


def _equal(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


# --- every strategy end to end -----------------------------------------------------------------
# floats of the personalized track per site and round beyond w_g (+ w_s): (down, up) in units of |w|
TRAFFIC = {"softpull": (1, 1), "ft": (0, 1), "apfl": (0, 1), "perfedavg": (1, 2), "pfedme": (1, 2)}


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_each_personalization_trains_two_rounds_with_finite_results_and_honest_ledger(
    tmp_path, strategy, make_cfg, disc_federation
):
    fed = disc_federation(n_sites=3, cases_per_site=8)
    cfg = make_cfg(strategy)
    prep = prepare(cfg, fed)
    result = run_algorithm("fedsm", prep, tmp_path, resume=False)
    dice = result.summary["dice"]
    assert set(dice) == {"site1", "site2", "site3", "client_avg", "global"}
    assert all(math.isfinite(v) and 0.0 <= v <= 1.0 for v in dice.values())
    for name, weights in result.bundle.items():
        if name.startswith("personal:"):
            assert all(torch.isfinite(t).all() for t in weights.values()), name
            assert not _equal(weights, result.bundle["global"]), name  # a trained personalized model, not w_g
    w = count_parameters(prep.task.new_model())
    w_s = count_parameters(new_selector(prep.task, get_algorithm("fedsm").parse_options(cfg.methods["fedsm"]), 3))
    down, up = TRAFFIC[strategy]
    extra_up = 1 if strategy == "apfl" else 0  # alpha_k
    rows = [(r["round"], r["floats_down"], r["floats_up"]) for r in result.ledger if r["action"] == "train"]
    assert rows == [(rnd, w + w_s + down * w, w + w_s + up * w + extra_up) for rnd in (1, 2) for _ in range(3)]


def test_fedsm_extra_accepts_a_personalization(tmp_path, make_cfg, disc_federation):
    """Phase 1 of fedsm-extra trains the personalized track of the option (here pFedMe: w down, w_k and theta_k up)."""
    fed = disc_federation(n_sites=3, cases_per_site=8)
    cfg = make_cfg("pfedme", name="fedsm-extra", rounds=3, extra_rounds=1)
    prep = prepare(cfg, fed)
    result = run_algorithm("fedsm-extra", prep, tmp_path, resume=False)
    assert all(math.isfinite(v) for v in result.summary["dice"].values())
    w = count_parameters(prep.task.new_model())
    by = defaultdict(list)
    for r in result.ledger:
        by[(r["round"], r["action"])].append((r["floats_down"], r["floats_up"]))
    assert by[(1, "train")] == by[(2, "train")] == [(2 * w, 3 * w)] * 3


def test_unknown_personalization_is_rejected_naming_the_field():
    with pytest.raises(ValueError, match=r"methods\.fedsm\.personalization must be .*'softpull'.*, got 'ditto'$"):
        get_algorithm("fedsm").parse_options({"personalization": "ditto"})
    with pytest.raises(ValueError, match=r"methods\.fedsm-extra\.personalization"):
        get_algorithm("fedsm-extra").parse_options({"personalization": "FT"})
    with pytest.raises(ValueError, match=r"methods\.fedsm\.apfl_alpha"):
        get_algorithm("fedsm").parse_options({"personalization": "apfl", "apfl_alpha": 1.5})


# --- APFL ----------------------------------------------------------------------------------------
def test_apfl_fixed_alpha_one_gives_the_local_model_and_zero_the_global_model(make_cfg, disc_federation):
    fed = disc_federation(n_sites=3, cases_per_site=8)
    for alpha in (1.0, 0.0):
        seen, observe = _recorder()
        cfg = make_cfg("apfl", apfl_alpha=alpha, apfl_adaptive=False)
        engine, server = _engine("fedsm", cfg, fed, observers=[observe])
        for rnd in (1, 2):
            _round(engine, server, rnd)
        for site in engine.sites:
            reply = seen[site][1]
            assert float(reply.tensors[APFL_ALPHA]) == alpha
            v = reply.group(APFL_V)
            assert _equal(v, state_group(engine.client_states[site], APFL_V))  # v_k lives in the client state
            expected = v if alpha == 1.0 else server.global_weights
            assert _equal(server.personal[site], expected), (alpha, site)
            assert not _equal(v, server.global_weights)  # v_k trained (alpha = 1) / kept apart from w_g


def test_apfl_adaptive_alpha_moves_and_stays_in_unit_interval(make_cfg, disc_federation):
    fed = disc_federation(n_sites=3, cases_per_site=8)
    engine, server = _engine("fedsm", make_cfg("apfl", apfl_alpha=0.5, apfl_alpha_lr=1.0), fed)
    for rnd in (1, 2):
        _round(engine, server, rnd)
    alphas = [float(engine.client_states[s][APFL_ALPHA]) for s in engine.sites]
    assert all(0.0 <= a <= 1.0 for a in alphas) and any(a != 0.5 for a in alphas)


def test_apfl_is_deterministic(make_cfg, disc_federation):
    fed = disc_federation(n_sites=3, cases_per_site=8)
    runs = []
    for _ in range(2):
        engine, server = _engine("fedsm", make_cfg("apfl"), fed)
        for rnd in (1, 2):
            _round(engine, server, rnd)
        runs.append((server, engine.client_states))
    (s1, c1), (s2, c2) = runs
    assert _equal(s1.global_weights, s2.global_weights)
    assert all(_equal(s1.personal[s], s2.personal[s]) and _equal(c1[s], c2[s]) for s in s1.sites)


# --- pFedMe ----------------------------------------------------------------------------------------
def test_pfedme_server_update_equals_the_formula_on_hand_made_arrays():
    options = get_algorithm("fedsm").parse_options({"personalization": "pfedme", "pfedme_beta": 0.7})
    w = {"a": torch.tensor([1.0, -2.0, 4.0]), "b": torch.tensor([[0.5]])}
    local = {
        "s1": {"a": torch.tensor([3.0, 0.0, 1.0]), "b": torch.tensor([[1.5]])},
        "s2": {"a": torch.tensor([-1.0, 2.0, 5.0]), "b": torch.tensor([[-0.5]])},
    }
    theta = {s: {k: v + 10 for k, v in local[s].items()} for s in local}
    replies = {s: Message({**prefixed(TRACK, local[s]), **prefixed(PERSONAL, theta[s])}) for s in local}
    personal, new_w = personalization(options).merge(replies, {"s1": 2.0, "s2": 6.0}, {}, w)
    for k in w:  # w <- (1 - beta) w + beta sum_k p_k w_k, p = (2, 6) / 8
        expected = 0.3 * w[k] + 0.7 * (0.25 * local["s1"][k] + 0.75 * local["s2"][k])
        torch.testing.assert_close(new_w[k], expected, rtol=0, atol=1e-6)
    assert all(_equal(personal[s], theta[s]) for s in local)  # w_p,k = theta_k


def test_server_state_round_trips_the_shared_track(make_cfg, disc_federation):
    """Resume and best-round restore go through ``state_dict``: pFedMe's server model must be in it."""
    fed = disc_federation(n_sites=3, cases_per_site=8)
    engine, server = _engine("fedsm", make_cfg("pfedme"), fed)
    _round(engine, server, 1)
    _, fresh = _engine("fedsm", make_cfg("pfedme"), fed)
    fresh.load_state_dict(server.state_dict())
    assert _equal(fresh.track, server.track) and not _equal(server.track, server.global_weights)
    assert _equal(fresh.train_message("site2").tensors, server.train_message("site2").tensors)


# --- Per-FedAvg ------------------------------------------------------------------------------------
def test_perfedavg_personalized_model_is_the_meta_model_after_one_sgd_step(make_cfg, disc_federation):
    """One batch holds the whole train split (batch size 64), so the adaptation step is
    ``theta - alpha * grad f_k(theta)`` exactly, computed here by hand from the meta-model sent."""
    fed = disc_federation(n_sites=3, cases_per_site=8)
    alpha = 0.05
    cfg = make_cfg("perfedavg", train={"batch_size": 64}, perfedavg_alpha=alpha, perfedavg_adapt_steps=1)
    seen, observe = _recorder()
    engine, server = _engine("fedsm", cfg, fed, observers=[observe])
    _round(engine, server, 1)
    task, loss_fn = engine.task, segmentation_loss(cfg.train)
    for site in engine.sites:
        msg, reply = seen[site]
        meta, adapted = msg.group(TRACK), reply.group(PERSONAL)
        model = task.new_model()
        load_weights(model, meta)
        model.train()
        data = engine.site_data[site].train
        x, y = data.batch(torch.arange(len(data)), task.device)
        loss_fn(model(x), y).backward()
        for name, p in model.named_parameters():
            torch.testing.assert_close(adapted[name], meta[name] - alpha * p.grad, rtol=1e-5, atol=1e-7)
        assert not _equal(adapted, meta)
        assert not _equal(reply.group(TRACK), meta)  # the meta-model trained too (FO-MAML)
        assert _equal(server.personal[site], adapted)


# --- the trainee steps, checked against hand-computed equations ---------------------------------------
# One batch holds the whole train split (batch size 64) and the optimizer is plain SGD, so each
# step of the strategy is a closed-form expression of full-batch gradients computed here by hand.
SGD = {"batch_size": 64, "optimizer": "sgd", "momentum": 0.0}


def _grads(task, weights, params, data, loss_fn):
    """``grad f(params; whole train split)`` by name, buffers from ``weights``."""
    model = task.new_model()
    load_weights(model, {**weights, **params})
    model.train()
    x, y = data.batch(torch.arange(len(data)), task.device)
    loss_fn(model(x), y).backward()
    return {n: p.grad.detach().clone() for n, p in model.named_parameters()}


def _params(task, weights):
    return {n: weights[n] for n, _ in task.new_model().named_parameters()}


def _assert_params_close(got, expected):
    for n, t in expected.items():
        torch.testing.assert_close(got[n], t, rtol=1e-4, atol=1e-6, msg=n)


@pytest.fixture
def one_sgd_round(make_cfg, disc_federation):
    """Factory ``one_sgd_round(strategy, **method)``."""

    def run(strategy, **method):
        """Round 1 of ``fedsm`` with ``strategy`` under ``SGD`` and one local step; (engine, last train
        message and reply per site, segmentation loss)."""
        cfg = make_cfg(strategy, train=SGD, local_steps=1, **method)
        seen, observe = _recorder()
        engine, server = _engine("fedsm", cfg, disc_federation(n_sites=3, cases_per_site=8), observers=[observe])
        _round(engine, server, 1)
        return engine, seen, segmentation_loss(cfg.train)

    return run


def test_perfedavg_meta_step_is_first_order_maml(one_sgd_round):
    """``theta <- theta - beta grad f(theta - alpha grad f(theta; D); D')`` (Per-FedAvg FO), one local step."""
    alpha, beta = 0.05, 0.1
    engine, seen, loss_fn = one_sgd_round("perfedavg", perfedavg_alpha=alpha, perfedavg_beta=beta)
    task = engine.task
    for site in engine.sites:
        msg, reply = seen[site]
        theta = msg.group(TRACK)
        data = engine.site_data[site].train
        g1 = _grads(task, theta, {}, data, loss_fn)
        temp = {n: t - alpha * g1[n] for n, t in _params(task, theta).items()}
        g2 = _grads(task, theta, temp, data, loss_fn)
        _assert_params_close(reply.group(TRACK), {n: t - beta * g2[n] for n, t in _params(task, theta).items()})


def test_pfedme_inner_steps_and_local_update_follow_algorithm_1(one_sgd_round):
    """One outer step, K = 2: ``theta_{i+1} = theta_i - lr (grad f(theta_i) + lambda (theta_i - w))``
    from ``theta_0 = w``, then ``w_k = w - eta lambda (w - theta_2)``; w_p,k = theta_2."""
    lr, lam, eta = 0.05, 3.0, 0.1
    engine, seen, loss_fn = one_sgd_round(
        "pfedme", pfedme_inner_steps=2, pfedme_personal_lr=lr, pfedme_lambda=lam, pfedme_lr=eta
    )
    task = engine.task
    for site in engine.sites:
        msg, reply = seen[site]
        w_all = msg.group(TRACK)
        w = _params(task, w_all)
        theta = dict(w)
        for _ in range(2):
            g = _grads(task, w_all, theta, engine.site_data[site].train, loss_fn)
            theta = {n: t - lr * (g[n] + lam * (t - w[n])) for n, t in theta.items()}
        _assert_params_close(reply.group(PERSONAL), theta)
        _assert_params_close(reply.group(TRACK), {n: w[n] - eta * lam * (w[n] - theta[n]) for n in w})


def test_a_sites_personalized_model_and_apfl_alpha_are_checked_before_the_merge():
    """Groups only a reply carries (a personalized model, APFL's v_k and alpha_k) were merged unchecked: a malformed
    model became that site's personalized model, which every site then failed to load, and alpha = 1e6 extrapolated
    the site's own model (a trust-boundary audit)."""
    from fedseg.algorithms.fedsm.personalize import PersonalizationOptions

    w = {"conv.weight": torch.zeros(2, 1, 3, 3), "conv.bias": torch.zeros(2)}
    apfl, track = (personalization(PersonalizationOptions(personalization=p)) for p in ("apfl", "pfedme"))
    alpha = torch.tensor(0.3)
    assert apfl.reply_problem(Message({**prefixed(APFL_V, w), APFL_ALPHA: alpha}), w) is None
    assert "not one number in [0, 1]" in apfl.reply_problem(
        Message({**prefixed(APFL_V, w), APFL_ALPHA: alpha * 1e7}), w
    )
    assert "returned no apfl_v/ model" in apfl.reply_problem(Message({APFL_ALPHA: alpha}), w)
    both = {**prefixed(TRACK, w), **prefixed(PERSONAL, w)}
    assert track.reply_problem(Message(both), w) is None
    bad = {**both, f"{PERSONAL}/conv.bias": torch.zeros(3)}
    assert "its personal/ model: tensor 'conv.bias' has shape (3,)" in track.reply_problem(Message(bad), w)
