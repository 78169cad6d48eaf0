"""Global methods of the FeTS benchmark (FedAvg variants, FedProx, SCAFFOLD, FedNova, FedAdam,
FedMedian, FedTrimmedAvg): equivalences with FedAvg, hand-computed steps, traffic, resume."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from torch import nn

from fedseg.algorithms import get_algorithm
from fedseg.algorithms.aggregate import coordinate_median, trimmed_mean
from fedseg.algorithms.fedadam import FedAdamOptions, FedAdamServer
from fedseg.algorithms.fedmedian import FedMedianOptions, FedMedianServer
from fedseg.algorithms.fednova import FedNovaOptions, FedNovaServer, momentum_norm
from fedseg.algorithms.fedtrimmedavg import FedTrimmedAvgOptions, FedTrimmedAvgServer
from fedseg.algorithms.prefixes import MODEL, OPT
from fedseg.algorithms.proximal import proximal_term
from fedseg.algorithms.scaffold import CONTROL, LOCAL_CONTROL, correction_mode
from fedseg.data.federation import Federation, Site
from fedseg.engine.messages import Message, prefixed
from fedseg.models import count_parameters
from fedseg.run import prepare, run_algorithm
from fedseg.testing import simulate

SGD = {"optimizer": "sgd", "lr": 0.05, "momentum": 0.0}


@pytest.fixture
def uneven_federation(disc_federation):
    """Factory ``uneven_federation(sizes=(8, 16, 24)) -> Federation``."""

    def make(sizes=(8, 16, 24)) -> Federation:
        """Disc federation whose sites hold ``sizes`` cases (train splits 4, 8, 12: 1, 2, 3 steps per epoch at
        batch 4)."""
        fed = disc_federation(n_sites=len(sizes), cases_per_site=max(sizes))
        fed.sites = [Site(s.name, s.cases[:n]) for s, n in zip(fed.sites, sizes)]
        return fed

    return make


@pytest.fixture
def run(uneven_federation):
    """The function ``run(name, cfg, tmp_path, fed=None)``: one algorithm, on ``uneven_federation()`` by default."""

    def run_one(name, cfg, tmp_path, fed=None):
        return run_algorithm(name, prepare(cfg, fed or uneven_federation()), tmp_path / name, resume=False)

    return run_one


def assert_same_bundle(a, b, model="global"):
    assert a.bundle[model].keys() == b.bundle[model].keys()
    for k in a.bundle[model]:
        assert torch.equal(a.bundle[model][k], b.bundle[model][k]), k


def assert_different_bundle(a, b, model="global"):
    assert any(not torch.equal(a.bundle[model][k], b.bundle[model][k]) for k in a.bundle[model])


# --- server-side tests on hand-made models -----------------------------------------------


class _Params(nn.Module):
    """A 'network' whose parameters are the hand-made tensors' shapes (names ``a``, ``b``)."""

    def __init__(self, shapes):
        super().__init__()
        for name, shape in shapes.items():
            self.register_parameter(name, nn.Parameter(torch.zeros(shape)))


class _Task:
    def __init__(self, shapes, cfg):
        self.cfg = cfg
        self.shapes = shapes

    def new_model(self):
        return _Params(self.shapes)


def hand_models(n_sites=4, seed=3):
    g = torch.Generator().manual_seed(seed)
    return [{"a": torch.randn(4, 3, generator=g), "b": torch.randn(5, generator=g)} for _ in range(n_sites)]


@pytest.fixture
def make_server(tiny_config):
    """The function ``make_server(cls, options, models, **cfg)``: a server of hand-made models' shapes."""

    def make(cls, options, models, **cfg):
        return cls(None, _Task({k: v.shape for k, v in models[0].items()}, tiny_config(**cfg)), options)

    return make


def replies_of(models, n):
    return {f"s{i}": Message(prefixed(MODEL, m), {"num_examples": k}) for i, (m, k) in enumerate(zip(models, n))}


def test_coordinate_median_and_trimmed_mean_on_hand_made_arrays():
    col = lambda *v: [{"x": torch.tensor([float(a)])} for a in v]  # noqa: E731
    assert coordinate_median(col(3, 1, 2))["x"].item() == 2.0
    assert coordinate_median(col(1, 5, 2, 100))["x"].item() == 3.5  # even K: mean of the two middle values
    assert trimmed_mean(col(1, 5, 2, 100), 0.25)["x"].item() == 3.5  # cut 1 each end: mean(2, 5)
    assert trimmed_mean(col(1, 5, 2, 100), 0.2)["x"].item() == 27.0  # int(0.8) = 0: plain mean
    assert trimmed_mean(col(1, 2, 3, 4, 100), 0.2)["x"].item() == 3.0  # cut 1 each end: mean(2, 3, 4)
    two_d = [
        {"x": torch.tensor([[1.0, -4.0], [7.0, 0.0]])},
        {"x": torch.tensor([[2.0, 9.0], [5.0, 1.0]])},
        {"x": torch.tensor([[3.0, 8.0], [6.0, -2.0]])},
    ]
    assert torch.equal(coordinate_median(two_d)["x"], torch.tensor([[2.0, 8.0], [6.0, 0.0]]))
    with pytest.raises(ValueError):
        trimmed_mean(two_d, 0.5)


def test_median_and_trimmed_servers_ignore_sample_counts(make_server):
    models = hand_models(5)
    replies = replies_of(models, [1, 1000, 3, 4, 5])
    median = make_server(FedMedianServer, FedMedianOptions(), models)
    median.aggregate(replies)
    stacked = torch.stack([m["a"] for m in models])
    assert torch.equal(median.global_weights["a"], stacked.median(dim=0).values)  # odd K: the middle value
    trimmed = make_server(FedTrimmedAvgServer, FedTrimmedAvgOptions(beta=0.2), models)
    trimmed.aggregate(replies)
    expected = stacked.sort(dim=0).values[1:4].to(torch.float64).mean(dim=0).to(torch.float32)
    torch.testing.assert_close(trimmed.global_weights["a"], expected, rtol=0, atol=1e-7)


def test_fedadam_one_and_two_server_steps_equal_the_hand_computed_adam_steps(make_server):
    models, n = hand_models(3), [10, 30, 60]
    opts = FedAdamOptions(eta_s=0.01, beta1=0.9, beta2=0.99, tau=1e-3)
    server = make_server(FedAdamServer, opts, models)
    w0 = {"a": torch.full((4, 3), 0.5), "b": torch.linspace(-1, 1, 5)}
    server.global_weights = dict(w0)
    p = [k / 100.0 for k in n]

    def hand_step(w, models, m, v):
        d = {k: sum(pk * (mod[k].double() - w[k].double()) for pk, mod in zip(p, models)) for k in w}
        m = {k: 0.9 * m[k] + 0.1 * d[k] for k in w}
        v = {k: 0.99 * v[k] + 0.01 * d[k] ** 2 for k in w}
        return {k: w[k].double() + 0.01 * m[k] / (v[k].sqrt() + 1e-3) for k in w}, m, v

    zeros = {k: torch.zeros_like(t, dtype=torch.float64) for k, t in w0.items()}
    server.aggregate(replies_of(models, n))
    w1, m1, v1 = hand_step(w0, models, zeros, zeros)
    for k in w0:
        torch.testing.assert_close(server.global_weights[k].double(), w1[k], rtol=0, atol=1e-6)
        # first step from zero moments: w + eta (1 - b1) d / (sqrt(1 - b2) |d| + tau), about eta * 1.0 * sign(d)
    models2 = hand_models(3, seed=4)
    server.aggregate(replies_of(models2, n))
    w2, _, _ = hand_step({k: t.float() for k, t in w1.items()}, models2, m1, v1)
    for k in w0:
        torch.testing.assert_close(server.global_weights[k].double(), w2[k], rtol=0, atol=1e-6)
    # the moments are server state: a fresh server loaded from state_dict continues identically
    clone = make_server(FedAdamServer, opts, models)
    clone.load_state_dict(server.state_dict())
    models3 = hand_models(3, seed=5)
    server.aggregate(replies_of(models3, n))
    clone.aggregate(replies_of(models3, n))
    for k in w0:
        assert torch.equal(server.global_weights[k], clone.global_weights[k])


def test_fednova_merges_by_hand(make_server):
    models, n = hand_models(3), [10, 30, 60]
    w0 = {"a": torch.zeros(4, 3), "b": torch.zeros(5)}
    # general form: w + tau_eff sum_k p_k (w_k - w) / a_k, tau_eff = sum_k p_k a_k
    a = [2.0, 5.0, 7.0]
    server = make_server(FedNovaServer, FedNovaOptions(variant="general"), models)
    server.global_weights = dict(w0)
    replies = replies_of(models, n)
    for r, ak in zip(replies.values(), a):
        r.meta["nova_a"] = ak
    server.aggregate(replies)
    p = [k / 100.0 for k in n]
    tau_eff = sum(pk * ak for pk, ak in zip(p, a))
    expected = tau_eff * sum(pk * m["a"].double() / ak for pk, m, ak in zip(p, models, a))
    torch.testing.assert_close(server.global_weights["a"].double(), expected, rtol=0, atol=1e-6)
    # FeTS simplification (Eq. 4-5): uniform average with server rate gamma = K sum p_k^2
    fets = make_server(FedNovaServer, FedNovaOptions(variant="fets"), models)
    fets.global_weights = dict(w0)
    fets.aggregate(replies)
    gamma = 3 * sum(pk**2 for pk in p)
    expected = gamma / 3 * sum(m["a"].double() for m in models)
    torch.testing.assert_close(fets.global_weights["a"].double(), expected, rtol=0, atol=1e-6)


def test_fednova_general_refuses_an_a_k_that_is_not_its_steps_momentum_norm(make_server):
    """The general form divides each update by the a_k the site reports: one site's a_k of 1e-9 set the server's rate
    and the merge (a trust-boundary audit), and a_k = 0 divided by zero naming no site. a_k must be the momentum
    norm of the steps it reports (its word is its steps); none trained is its failure."""
    from fedseg.algorithms.fednova import momentum_norm

    models = hand_models(2)
    train = {"optimizer": "sgd", "momentum": 0.9}
    server = make_server(FedNovaServer, FedNovaOptions(variant="general"), models, train=train)
    a = momentum_norm(5, 0.9)
    honest = Message(prefixed(MODEL, models[0]), {"num_examples": 4, "steps": 5, "nova_a": a})
    assert server.train_reply_problem("s0", Message(), honest) is None
    for meta, said in (
        ({"nova_a": 1e-9}, "is not the momentum norm"),
        ({"nova_a": "2"}, "is not the momentum norm"),
        ({"steps": 0, "nova_a": 0.0}, "it trained no SGD step"),
    ):
        problem = server.train_reply_problem("s0", Message(), Message(honest.tensors, {**honest.meta, **meta}))
        assert problem is not None and said in problem, (meta, problem)


@pytest.mark.parametrize("rho", [0.0, 0.5, 0.9])
def test_fednova_momentum_norm_is_the_total_step_weight_of_heavy_ball_sgd(rho):
    """a_k = total displacement of tau SGD steps with momentum rho on a unit gradient (lr 1)."""
    x = nn.Parameter(torch.zeros((), dtype=torch.float64))
    opt = torch.optim.SGD([x], lr=1.0, momentum=rho)
    for _ in range(7):
        opt.zero_grad()
        x.backward()  # d x / d x = 1
        opt.step()
    assert momentum_norm(7, rho) == pytest.approx(-x.item(), rel=1e-12)


# --- whole runs through the simulator -----------------------------------------------------


def test_fedavg_variants_fixed_iterations_and_uniform_averaging(tmp_path, run, tiny_config):
    assert get_algorithm("fedavg-steps").parse_options({}).local_steps == 10  # FeTS 2022 Sec. 4.4.8
    assert get_algorithm("fedavg-uniform").parse_options({}).weighting == "uniform"
    cfg = tiny_config(fl={"rounds": 1}, methods={"fedavg-steps": {"local_steps": 3}})
    steps = run("fedavg-steps", cfg, tmp_path)
    assert [r["steps"] for r in steps.ledger if r["action"] == "train"] == [3, 3, 3]
    epochs = run("fedavg", cfg, tmp_path)
    assert [r["steps"] for r in epochs.ledger if r["action"] == "train"] == [1, 2, 3]  # one epoch of 4, 8, 12 cases
    uniform = run("fedavg-uniform", cfg, tmp_path)
    assert_different_bundle(uniform, epochs)
    assert_same_bundle(uniform, run("fedavg", tiny_config(fl={"rounds": 1, "weighting": "uniform"}), tmp_path / "u"))


def test_fedprox_with_mu_zero_equals_fedavg(tmp_path, run, tiny_config):
    cfg = tiny_config(fl={"rounds": 2}, methods={"fedprox": {"mu": 0.0}})
    fedavg, prox0 = run("fedavg", cfg, tmp_path), run("fedprox", cfg, tmp_path)
    assert_same_bundle(fedavg, prox0)
    assert [r["val_dice"] for r in fedavg.rounds_rows] == [r["val_dice"] for r in prox0.rounds_rows]
    prox = run("fedprox", tiny_config(fl={"rounds": 2}, methods={"fedprox": {"mu": 1.0}}), tmp_path / "mu1")
    assert_different_bundle(prox, fedavg)


def test_proximal_term_is_half_mu_squared_distance_with_gradient_mu_times_difference():
    model = nn.Linear(3, 2)
    anchor = {k: torch.randn_like(v) for k, v in model.state_dict().items()}
    term = proximal_term(model, anchor, mu=0.3)
    expected = 0.15 * sum(((p - anchor[k]) ** 2).sum() for k, p in model.named_parameters())
    torch.testing.assert_close(term, expected)
    term.backward()
    for k, p in model.named_parameters():
        torch.testing.assert_close(p.grad, 0.3 * (p.detach() - anchor[k]))


def test_fednova_with_equal_steps_and_plain_sgd_equals_fedavg(tmp_path, run, tiny_config):
    cfg = tiny_config(
        train={**SGD, "budget": {"unit": "steps", "amount": 2}}, methods={"fednova": {"variant": "general"}}
    )
    fedavg, nova = run("fedavg", cfg, tmp_path), run("fednova", cfg, tmp_path)
    assert_same_bundle(fedavg, nova)
    # unequal step counts (one epoch on 4, 8, 12 cases) make the general form differ from FedAvg
    epochs = tiny_config(train=SGD, methods={"fednova": {"variant": "general"}})
    assert_different_bundle(run("fednova", epochs, tmp_path / "e"), run("fedavg", epochs, tmp_path / "e"))


def test_scaffold_round_one_is_fedavg_and_traffic_is_twice_fedavg(tmp_path, run, uneven_federation, tiny_config):
    cfg = tiny_config(fl={"rounds": 1})
    fedavg, scaffold = run("fedavg", cfg, tmp_path), run("scaffold", cfg, tmp_path)
    assert_same_bundle(fedavg, scaffold)  # c = c_k = 0: same local steps, same merge
    params = count_parameters(prepare(cfg, uneven_federation()).task.new_model())
    for row in scaffold.ledger:
        if row["action"] == "train":
            assert row["floats_down"] == row["floats_up"] == 2 * params
    assert scaffold.summary["floats_sent"] == 2 * fedavg.summary["floats_sent"] > 0


def test_scaffold_control_variates_use_the_steps_actually_taken(tmp_path, uneven_federation, tiny_config):
    """Unequal sites (1, 2, 3 steps per epoch): c_k+ = c_k - c + (w - w_k) / (s_k eta_l), checked
    from the messages of rounds 1 and 2, and the server's c follows Eq. 8."""
    cfg = tiny_config(train=SGD)
    seen = []
    engine, server, _ = simulate(
        "scaffold", cfg, uneven_federation(), [lambda s, a, m, r: seen.append((engine.round, s, m, r))]
    )
    for rnd in (1, 2):
        engine.round = rnd
        server.run_round(rnd)
    by = {(rnd, s): (m, r) for rnd, s, m, r in seen}
    assert [int(by[(1, s)][1].meta["steps"]) for s in engine.sites] == [1, 2, 3]
    lr = cfg.train.lr
    delta_1 = {s: by[(1, s)][1].group(CONTROL) for s in engine.sites}
    for s in engine.sites:
        msg, reply = by[(2, s)]
        c, w, w_k, steps = msg.group(CONTROL), msg.group(MODEL), reply.group(MODEL), int(reply.meta["steps"])
        c_k_before = delta_1[s]  # c_k was zero before round 1
        c_k = {
            k[len(LOCAL_CONTROL) + 1 :]: v
            for k, v in engine.client_states[s].items()
            if k.startswith(LOCAL_CONTROL + "/")
        }
        assert c_k.keys() == c.keys()
        for k in c:
            expected = c_k_before[k] - c[k] + (w[k] - w_k[k]) / (steps * lr)
            torch.testing.assert_close(c_k[k], expected, rtol=1e-5, atol=1e-6)
            torch.testing.assert_close(reply.group(CONTROL)[k], c_k[k] - c_k_before[k], rtol=1e-5, atol=1e-6)
    n = {s: len(engine.site_data[s].train) for s in engine.sites}
    c2 = by[(2, engine.sites[0])][0].group(CONTROL)
    for k in c2:
        expected = c2[k] + sum(n[s] / sum(n.values()) * by[(2, s)][1].group(CONTROL)[k] for s in engine.sites)
        torch.testing.assert_close(server.control[k], expected, rtol=1e-5, atol=1e-6)


MOMENTUM_SGD = {**SGD, "momentum": 0.9}


@pytest.mark.parametrize(
    "train, correction", [(SGD, "gradient"), (SGD, "step"), ({"optimizer": "adam"}, "auto"), (MOMENTUM_SGD, "auto")]
)
def test_scaffold_local_step_is_the_optimizer_step_corrected_by_c_minus_c_k(
    train, correction, uneven_federation, tiny_config
):
    """One local step: w_k = step(w) - eta (c - c_k), where step(w) is a FedAvg client's optimizer
    step on the same batch (same random stream). With SGD the gradient correction (Eq. 9) and the
    step correction give exactly this; with Adam (``auto`` -> ``step``) the step correction does."""
    cfg = tiny_config(
        train={**train, "keep_optimizer_state": False, "budget": {"unit": "steps", "amount": 1}},
        methods={"scaffold": {"correction": correction}},
    )
    fed = uneven_federation()
    seen = []
    engine, server, _ = simulate("scaffold", cfg, fed, [lambda s, a, m, r: seen.append((engine.round, s, m, r))])
    for rnd in (1, 2):
        engine.round = rnd
        server.run_round(rnd)
    plain, _, _ = simulate("fedavg", cfg, fed)
    plain.round = 2
    msgs = {s: m for rnd, s, m, r in seen if rnd == 2}
    replies = plain.exchange({s: Message(prefixed(MODEL, m.group(MODEL))) for s, m in msgs.items()}, "train")
    for rnd, s, m, r in seen:
        if rnd != 2:
            continue
        c = m.group(CONTROL)
        c_k = next(r1.group(CONTROL) for rnd1, s1, _, r1 in seen if rnd1 == 1 and s1 == s)
        assert any(float((c[k] - c_k[k]).abs().max()) > 0 for k in c)
        for k in c:
            expected = replies[s].group(MODEL)[k] - cfg.train.lr * (c[k] - c_k[k])
            torch.testing.assert_close(r.group(MODEL)[k], expected, rtol=0, atol=1e-6)


@pytest.mark.parametrize(
    "train, expected", [(SGD, "gradient"), (MOMENTUM_SGD, "step"), ({"optimizer": "adam"}, "step")]
)
def test_scaffold_auto_correction_is_gradient_only_for_sgd_without_momentum(train, expected, tiny_config):
    ctx = SimpleNamespace(cfg=tiny_config(train=train), options=get_algorithm("scaffold").parse_options({}))
    assert correction_mode(ctx) == expected


def test_scaffold_refuses_the_gradient_correction_with_momentum_sgd(uneven_federation, tiny_config):
    """The momentum buffer would amplify c - c_k and the control variates diverge (module doc)."""
    cfg = tiny_config(train=MOMENTUM_SGD, methods={"scaffold": {"correction": "gradient"}})
    engine, server, _ = simulate("scaffold", cfg, uneven_federation())
    engine.round = 1
    with pytest.raises(ValueError, match=r"methods\.scaffold\.correction.*momentum 0\.9"):
        server.run_round(1)


def test_fednova_general_with_momentum_sgd_starts_every_round_from_a_zero_momentum_buffer(
    uneven_federation, tiny_config
):
    """a_k assumes a zero buffer at the start of the round, so the general variant keeps no optimizer
    state even with ``keep_optimizer_state: true``; FedAvg with the same config keeps it."""
    cfg = tiny_config(
        fl={"rounds": 1},
        train={**MOMENTUM_SGD, "keep_optimizer_state": True},
        methods={"fednova": {"variant": "general"}},
    )
    kept = {}
    for name in ("fednova", "fedavg"):
        engine, server, _ = simulate(name, cfg, uneven_federation())
        engine.round = 1
        server.run_round(1)
        kept[name] = [any(k.startswith(OPT + "/") for k in engine.client_states[s]) for s in engine.sites]
    assert kept == {"fednova": [False] * 3, "fedavg": [True] * 3}


@pytest.mark.parametrize("name, options", [("fedadam", {}), ("fednova", {"variant": "fets"}), ("fedmedian", {})])
def test_batchnorm_statistics_are_averaged_like_fedavg_whatever_the_server_rule(
    name, options, uneven_federation, tiny_config
):
    """Buffers (running mean/var) get FedAvg's weighted average; the parameters get the method's rule."""
    cfg = tiny_config(model={"norm": "batch"}, methods={name: options})
    seen = []
    engine, server, _ = simulate(name, cfg, uneven_federation(), [lambda s, a, m, r: seen.append((s, a, r))])
    engine.round = 1
    before = dict(server.global_weights)
    server.run_round(1)
    replies = {s: r for s, a, r in seen if a == "train"}
    n = {s: float(r.meta["num_examples"]) for s, r in replies.items()}
    assert "running_var" in " ".join(server.buffers)
    for b in server.buffers:
        expected = sum(n[s] / sum(n.values()) * replies[s].group(MODEL)[b].double() for s in replies)
        torch.testing.assert_close(
            server.global_weights[b].double(), expected.to(server.global_weights[b].dtype).double()
        )
    param = next(k for k in server.global_weights if k not in server.buffers and k.endswith("weight"))
    fedavg = sum(n[s] / sum(n.values()) * replies[s].group(MODEL)[param].double() for s in replies)
    assert not torch.allclose(server.global_weights[param].double(), fedavg)  # the method's own rule
    assert not torch.equal(server.global_weights[param], before[param])


class _Stop(Exception):
    pass


@pytest.mark.parametrize("name", ["scaffold", "fedadam"])
def test_resume_after_interruption_equals_uninterrupted_run(tmp_path, name, uneven_federation, tiny_config):
    # validation (and so best-round selection) only after round 3: the bundle is the model of the round after resuming
    cfg = tiny_config(fl={"rounds": 3, "validate_every": 3}, methods={"fedadam": {"eta_s": 0.01}})
    prep = prepare(cfg, uneven_federation())
    full = run_algorithm(name, prep, tmp_path / "full", resume=False)

    def stop(algo, rnd, losses):
        if rnd == 2:
            raise _Stop

    with pytest.raises(_Stop):
        run_algorithm(name, prep, tmp_path / "cut", resume=False, on_round_end=stop)
    resumed = run_algorithm(name, prep, tmp_path / "cut", resume=True)
    assert_same_bundle(full, resumed)
    assert full.rounds_rows == resumed.rounds_rows
    assert (
        full.summary["dice"] == resumed.summary["dice"]
        and full.summary["floats_sent"] == resumed.summary["floats_sent"]
    )
    assert full.summary["best_round"] == resumed.summary["best_round"] == 3
