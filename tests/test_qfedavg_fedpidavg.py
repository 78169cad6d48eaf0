"""q-FedAvg (FeTS Eq. 13-17) and FedPIDAvg (FeTS Eq. 18-22): hand-computed merges, reductions to
FedAvg, the forward-only loss pass in the ledger, resume."""

from __future__ import annotations

import json
import math
from types import SimpleNamespace

import pytest
import torch
from monai.losses import DiceLoss

from fedseg.algorithms import get_algorithm
from fedseg.algorithms.fedpidavg import FedPIDAvgOptions, FedPIDAvgServer, pid_terms
from fedseg.algorithms.prefixes import MODEL
from fedseg.algorithms.qfedavg import DELTA, LOSS_ACTION, H, QFedAvgOptions, QFedAvgServer, delta_and_h
from fedseg.config import TrainConfig
from fedseg.data.federation import Federation, Site
from fedseg.engine.messages import Message, prefixed
from fedseg.evaluate.cost import FORWARD_ACTIONS
from fedseg.models import count_parameters
from fedseg.run import prepare, run_algorithm, run_experiment


@pytest.fixture(scope="module")
def uneven_federation(disc_federation):
    """Factory ``uneven_federation() -> Federation`` (module scope: ``q0_runs`` uses it)."""

    def make() -> Federation:
        """Three disc sites of 16, 12 and 8 cases (train splits 8, 6, 4)."""
        fed = disc_federation(n_sites=3, cases_per_site=16)
        fed.sites = [Site(s.name, s.cases[:n]) for s, n in zip(fed.sites, (16, 12, 8))]
        return fed

    return make


def _global(result) -> dict[str, torch.Tensor]:
    return result.bundle["global"]


# --------------------------------------------------------------------------- q-FedAvg, by hand
def _qffl_server(q: float, L: float, h_norm: str) -> QFedAvgServer:
    server = QFedAvgServer.__new__(QFedAvgServer)
    server.options = QFedAvgOptions(q=q, L=L, h_norm=h_norm)
    server.global_weights = {"w": torch.zeros(2, dtype=torch.float64)}
    return server


def _qffl_replies(start: dict, models: list[torch.Tensor], losses: list[float], server: QFedAvgServer) -> dict:
    o = server.options
    out = {}
    for i, (w, F) in enumerate(zip(models, losses)):
        d, h = delta_and_h(start, {"w": w}, F, o.q, o.L, o.h_norm)
        out[f"s{i}"] = Message({**prefixed(DELTA, d), H: torch.tensor([h], dtype=torch.float64)})
    return out


def test_qfedavg_refuses_a_reply_whose_h_or_F_does_not_follow_eq16():
    """A site weighs its update in Eq. 17 by its h_k: the server recomputes Eq. 16 from the F and Delta the site sent,
    so a forged h (or F that is NaN, negative, or 0 under q > 0, or a Delta missing a tensor) is a site failure,
    not a merge that one site steers."""
    server = _qffl_server(1.0, 2.0, "fets")
    server.task = SimpleNamespace(cfg=SimpleNamespace(train=TrainConfig(), fl=SimpleNamespace(rounds=1)))
    server.engine = SimpleNamespace(round=1)
    start = dict(server.global_weights)
    (honest,) = _qffl_replies(start, [torch.tensor([1.0, 0.5], dtype=torch.float64)], [3.0], server).values()
    honest = Message(honest.tensors, {"F": 3.0, "num_examples": 4})
    assert server.train_reply_problem("s0", Message(), honest) is None

    def forged(tensors: dict | None = None, **meta) -> str | None:
        return server.train_reply_problem(
            "s0", Message(), Message({**honest.tensors, **(tensors or {})}, {**honest.meta, **meta})
        )

    assert "Eq. 16" in forged({H: honest.tensors[H] * 1000})
    assert "Eq. 16" in forged(F=30.0)  # the same h claimed for another loss
    for bad in (math.nan, -1.0, 0.0, "3", True):
        assert "F = " in forged(F=bad)
    assert "not one number" in forged({H: torch.ones(2, dtype=torch.float64)})
    for huge_or_tiny in (1e200, 1e-300):  # F**q beyond floating point: the site's failure, not the coordinator's
        server.options = QFedAvgOptions(q=2.0, L=2.0)
        assert "F = " in forged(F=huge_or_tiny)
    # F = 0 (an easy site's saturated loss): the honest reply has Delta = 0 and h = q ||w_k - w^t||^2, unverifiable
    server.options = QFedAvgOptions(q=1.0, L=2.0)
    (zero,) = _qffl_replies(start, [torch.tensor([1.0, 0.5], dtype=torch.float64)], [0.0], server).values()
    assert server.train_reply_problem("s0", Message(), Message(zero.tensors, {**honest.meta, "F": 0.0})) is None
    # q = 0: h = L whatever F (F^0 = 1), so any F passes and only h is checked
    server.options = QFedAvgOptions(q=0.0, L=2.0)
    (plain,) = _qffl_replies(start, [torch.tensor([1.0, 0.5], dtype=torch.float64)], [3.0], server).values()
    for F in (3.0, math.nan, math.inf):
        assert server.train_reply_problem("s0", Message(), Message(plain.tensors, {**honest.meta, "F": F})) is None
    tripled = Message({**plain.tensors, H: plain.tensors[H] * 3}, honest.meta)
    assert "not L = 2" in server.train_reply_problem("s0", Message(), tripled)
    assert "delta/" in server.train_reply_problem("s0", Message(), Message({H: honest.tensors[H]}, honest.meta))
    assert "num_examples" in server.train_reply_problem("s0", Message(), Message(honest.tensors, {"F": 3.0}))


def test_qfedavg_skips_a_site_whose_delta_is_incomplete(tmp_path, uneven_federation, tiny_config):
    """A reply missing a Delta tensor (which Eq. 17 indexes by the model's names: a KeyError naming no site before)
    is a site failure under fl.on_failure = skip: the round merges the other sites."""
    faults = [{"site": "site2", "round": 1, "kind": "missing"}]
    cfg = tiny_config(fl={"rounds": 1, "on_failure": "skip"}, faults=faults)
    result = run_algorithm("qfedavg", prepare(cfg, uneven_federation()), tmp_path, False)
    (failure,) = result.summary["failures"]
    assert (failure["site"], failure["action"]) == ("site2", "train") and "delta/" in failure["reason"]


@pytest.mark.parametrize(
    "q, h_norm, expected",
    [
        # w = 0, w_1 = (1, 0), w_2 = (0, 2), F = (1, 4), L = 2.
        # fets: Delta_1 = 2 * 1 * (1, 0), h_1 = 1 * 1 + 2 * 1 = 3; Delta_2 = 2 * 4 * (0, 2), h_2 = 1 * 4 + 2 * 4 = 12
        (1.0, "fets", [2 / 15, 16 / 15]),
        # li: h_1 = 1 * ||2 (1, 0)||^2 + 2 = 6; h_2 = 1 * ||2 (0, 2)||^2 + 8 = 24
        (1.0, "li", [2 / 30, 16 / 30]),
        # q = 0: Delta_k = 2 Delta w_k, h_k = 2 -> (2, 0) + (0, 4) over 4: the uniform mean (0.5, 1)
        (0.0, "fets", [0.5, 1.0]),
    ],
)
def test_qfedavg_merge_by_hand(q, h_norm, expected):
    server = _qffl_server(q, 2.0, h_norm)
    start = dict(server.global_weights)
    server.aggregate(
        _qffl_replies(
            start,
            [torch.tensor([1.0, 0.0], dtype=torch.float64), torch.tensor([0.0, 2.0], dtype=torch.float64)],
            [1.0, 4.0],
            server,
        )
    )
    torch.testing.assert_close(
        server.global_weights["w"], torch.tensor(expected, dtype=torch.float64), rtol=0, atol=1e-12
    )


def test_qfedavg_at_q0_is_the_uniform_mean_of_the_local_models():
    g = torch.Generator().manual_seed(0)
    server = _qffl_server(0.0, 7.0, "fets")
    server.global_weights = {"w": torch.randn(6, dtype=torch.float64, generator=g)}
    start = dict(server.global_weights)
    models = [torch.randn(6, dtype=torch.float64, generator=g) for _ in range(4)]
    server.aggregate(_qffl_replies(start, models, [0.3, 2.0, 9.0, 0.01], server))
    torch.testing.assert_close(server.global_weights["w"], torch.stack(models).mean(0), rtol=0, atol=1e-12)


def test_qfedavg_options_are_validated():
    with pytest.raises(ValueError, match="methods.qfedavg.q"):
        get_algorithm("qfedavg").parse_options({"q": -1})
    with pytest.raises(ValueError, match="methods.qfedavg.L"):
        get_algorithm("qfedavg").parse_options({"L": 0})
    with pytest.raises(ValueError, match="methods.fedpidavg.history"):
        get_algorithm("fedpidavg").parse_options({"history": 0})


# --------------------------------------------------------------------------- q-FedAvg, whole runs
@pytest.fixture(scope="module")
def q0_runs(tmp_path_factory, uneven_federation, tiny_config):
    """q-FedAvg with q = 0, FedAvg uniform and FedAvg samples-weighted, 2 rounds (only round 2 validated,
    so the three keep the same round), the q-FedAvg exchanges recorded. Plain SGD: Adam's
    m / sqrt(v) would blow the float32 rounding of round 1's Delta_k up to ~1e-4 in round 2."""
    fed = uneven_federation()
    seen = []
    observe = lambda site, action, msg, reply: seen.append((site, action, msg, reply))  # noqa: E731
    cfg = tiny_config(
        fl={"rounds": 2, "validate_every": 2, "weighting": "uniform"},
        train={"optimizer": "sgd", "lr": 0.05},
        methods={"qfedavg": {"q": 0}},
    )
    prep = prepare(cfg, fed)
    out = tmp_path_factory.mktemp("q0")
    runs = {
        "qfedavg": run_algorithm("qfedavg", prep, out, False, observers=[observe]),
        "uniform": run_algorithm("fedavg", prep, out, False),
    }
    prep_s = prepare(tiny_config(fl={"rounds": 2, "validate_every": 2}, train={"optimizer": "sgd", "lr": 0.05}), fed)
    runs["samples"] = run_algorithm("fedavg", prep_s, tmp_path_factory.mktemp("samples"), False)
    return prep, runs, seen


def test_qfedavg_with_q0_equals_uniform_fedavg(q0_runs):
    """Eq. 17 at q = 0 is w + (1/K) sum_k Delta w_k: FedAvg with uniform weights (up to float32
    rounding of the Delta_k messages), not the samples-weighted FedAvg."""
    _, runs, _ = q0_runs
    q, uni, smp = _global(runs["qfedavg"]), _global(runs["uniform"]), _global(runs["samples"])
    for k in q:
        torch.testing.assert_close(q[k], uni[k], rtol=0, atol=2e-6)
    assert max(float((q[k] - smp[k]).abs().max()) for k in q) > 1e-4  # 100x the tolerance above


def test_qfedavg_loss_pass_is_its_own_forward_only_exchange_in_the_ledger(q0_runs):
    prep, runs, _ = q0_runs
    assert LOSS_ACTION in FORWARD_ACTIONS
    params = count_parameters(prep.task.new_model())
    bs = prep.task.cfg.train.batch_size
    n_train = {d.name: len(d.train) for d in prep.site_data}
    assert sorted(n_train.values()) == [4, 6, 8]
    ledger = runs["qfedavg"].ledger
    for rnd in (1, 2):
        for site, n in n_train.items():
            (loss,) = [r for r in ledger if (r["round"], r["site"], r["action"]) == (rnd, site, LOSS_ACTION)]
            (train,) = [r for r in ledger if (r["round"], r["site"], r["action"]) == (rnd, site, "train")]
            assert (loss["steps"], loss["floats_down"], loss["floats_up"]) == (math.ceil(n / bs), params, 0)
            # one epoch of SGD from the w^t kept since the loss exchange; reply Delta_k (|w|) + h_k (1)
            assert (train["steps"], train["floats_down"], train["floats_up"]) == (math.ceil(n / bs), 0, params + 1)
    q_cost, f_cost = runs["qfedavg"].summary["cost"], runs["uniform"].summary["cost"]
    assert q_cost["forward_batches"] == 2 * sum(math.ceil(n / bs) for n in n_train.values()) == 2 * (1 + 2 + 2)
    assert f_cost["forward_batches"] == 0
    assert q_cost["sgd_steps"] == f_cost["sgd_steps"] and q_cost["parallel_sgd_steps"] == f_cost["parallel_sgd_steps"]
    assert q_cost["floats"] == f_cost["floats"] + 2 * 3  # FedAvg's traffic + one h_k per site and round
    # Ledger.totals (summary.json sgd_steps) adds the forward-only batches to the SGD steps
    assert runs["qfedavg"].summary["sgd_steps"] == q_cost["sgd_steps"]  # forward-only batches are not SGD steps


def test_qfedavg_F_is_the_summed_loss_of_the_received_global_model(q0_runs):
    """Eq. 15: F_k(w^t) = sum over the site's training cases of l(w^t, x, y), before local training."""
    prep, _, seen = q0_runs
    loss_fn = DiceLoss(sigmoid=True)
    model = prep.task.new_model().eval()  # w^1: the initial global model
    for data in prep.site_data:
        (reply,) = [r for s, a, _, r in seen if s == data.name and a == LOSS_ACTION][:1]
        with torch.no_grad():
            expected = sum(
                float(loss_fn(model(data.train.x[i : i + 1]), data.train.y[i : i + 1])) for i in range(len(data.train))
            )
        assert reply.meta["F"] == pytest.approx(expected, rel=1e-5)
    msgs = [(a, m) for _, a, m, _ in seen]
    assert all(m.num_floats() == 0 for a, m in msgs if a == "train")  # the train message is empty
    assert all(m.group(MODEL) for a, m in msgs if a == LOSS_ACTION)


def test_qfedavg_F_is_taken_with_the_training_losss_dice_smoothing(tmp_path, uneven_federation, tiny_config):
    """F_k is the loss training minimizes: with ``train.dice_smooth: 1`` (FeTS Eq. 31, the ``fets`` presets) its
    soft Dice has eps = 1, not MONAI's 1e-5 (which F_k used while the Trainer used 1: a case without a region then
    lost ~1 instead of ~1/3)."""
    seen = []
    observe = lambda site, action, msg, reply: seen.append((site, action, reply))  # noqa: E731
    prep = prepare(tiny_config(fl={"rounds": 1}, train={"dice_smooth": 1.0}), uneven_federation())
    run_algorithm("qfedavg", prep, tmp_path, False, observers=[observe])
    smooth, monai = DiceLoss(sigmoid=True, smooth_nr=1.0, smooth_dr=1.0), DiceLoss(sigmoid=True)
    model = prep.task.new_model().eval()
    for data in prep.site_data:
        (reply,) = [r for s, a, r in seen if s == data.name and a == LOSS_ACTION]
        with torch.no_grad():
            cases = [(model(data.train.x[i : i + 1]), data.train.y[i : i + 1]) for i in range(len(data.train))]
        assert reply.meta["F"] == pytest.approx(sum(float(smooth(p, y)) for p, y in cases), rel=1e-5)
        assert reply.meta["F"] != pytest.approx(sum(float(monai(p, y)) for p, y in cases), rel=1e-3)


# --------------------------------------------------------------------------- FedPIDAvg, by hand
def test_fedpidavg_refuses_a_val_loss_that_is_no_finite_loss():
    """Eq. 18-22 weigh each site by its validation loss: a string stopped the coordinator (``float()``), NaN or a
    negative loss steered the weights; each is that site's failure now."""
    server = FedPIDAvgServer.__new__(FedPIDAvgServer)
    meta = {"num_examples": 4, "val_loss": 2.5}
    assert server.train_reply_problem("s0", Message(), Message({}, meta)) is None
    for bad in ("1e9", math.nan, -1.0, math.inf, True):
        assert "val_loss" in server.train_reply_problem("s0", Message(), Message({}, {**meta, "val_loss": bad}))


def test_pid_terms_by_hand():
    shares = torch.tensor([0.5, 0.3, 0.2], dtype=torch.float64)
    nan = math.nan
    history = torch.tensor([[4.0, 5.0, nan], [3.0, nan, nan], [2.0, 2.5, nan]], dtype=torch.float64)
    now = torch.tensor([3.0, 3.5, 1.0], dtype=torch.float64)
    imp, mom, new = pid_terms(shares, now, history, positive_only=True)
    # Eq. 22: Delta l = max(0, (4 - 3, 3 - 3.5, 2 - 1)) = (1, 0, 1), L = 2
    torch.testing.assert_close(imp, torch.tensor([0.5, 0.0, 0.5], dtype=torch.float64))
    # Eq. 21 over (now, 2 previous): m = (3 + 4 + 5, 3.5 + 3, 1 + 2 + 2.5) = (12, 6.5, 5.5), M = 24
    torch.testing.assert_close(mom, torch.tensor([12 / 24, 6.5 / 24, 5.5 / 24], dtype=torch.float64))
    torch.testing.assert_close(
        new, torch.tensor([[3.0, 4.0, 5.0], [3.5, 3.0, nan], [1.0, 2.0, 2.5]], dtype=torch.float64), equal_nan=True
    )
    imp20, _, _ = pid_terms(shares, now, history, positive_only=False)  # Eq. 20: (1, -0.5, 1), L = 1.5
    torch.testing.assert_close(imp20, torch.tensor([1 / 1.5, -0.5 / 1.5, 1 / 1.5], dtype=torch.float64))
    # first round: no l^{t-1} -> L = 0 -> the improvement term falls back to p_k
    first, mom1, _ = pid_terms(shares, now, torch.full((3, 6), nan, dtype=torch.float64))
    torch.testing.assert_close(first, shares)
    torch.testing.assert_close(mom1, now / now.sum())


def _pid_server(cfg, alpha, beta, gamma, sites=("a", "b", "c")) -> FedPIDAvgServer:
    server = FedPIDAvgServer.__new__(FedPIDAvgServer)
    server.task = SimpleNamespace(cfg=cfg)
    server.options = FedPIDAvgOptions(alpha=alpha, beta=beta, gamma=gamma, history=6)
    server.engine = SimpleNamespace(sites=list(sites))
    server.history = torch.full((len(sites), 6), math.nan, dtype=torch.float64)
    server.global_weights = {"w": torch.tensor([1.0, -1.0, 0.5], dtype=torch.float64)}
    server.last_coefficients = {}
    return server


def test_fedpidavg_merge_by_hand_over_two_rounds(tiny_config):
    """Eq. 18 with alpha + beta + gamma = 0.8: w^{t+1} = w^t + sum_k c_k (w_k - w^t)."""
    server = _pid_server(tiny_config(), 0.5, 0.2, 0.1)
    n = [10.0, 30.0, 60.0]
    p = [x / 100 for x in n]
    g = torch.Generator().manual_seed(3)
    for losses, prev in (([2.0, 4.0, 2.0], None), ([1.0, 4.5, 1.5], [2.0, 4.0, 2.0])):
        models = [torch.randn(3, dtype=torch.float64, generator=g) for _ in n]
        replies = {
            s: Message(prefixed(MODEL, {"w": w}), {"num_examples": nk, "val_loss": lk})
            for s, w, nk, lk in zip("abc", models, n, losses)
        }
        w0 = server.global_weights["w"].clone()
        if prev is None:  # round 1: improvement -> p_k; m_k = l_k
            c = [0.5 * pk + 0.2 * pk + 0.1 * lk / 8.0 for pk, lk in zip(p, losses)]
        else:  # Delta l = (1, 0, 0.5), L = 1.5; m = (3, 8.5, 3.5), M = 15
            c = [0.5 * pk + 0.2 * dl / 1.5 + 0.1 * m / 15.0 for pk, dl, m in zip(p, [1.0, 0.0, 0.5], [3.0, 8.5, 3.5])]
        server.aggregate(replies)
        expected = w0 + sum(ck * (w - w0) for ck, w in zip(c, models))
        torch.testing.assert_close(server.global_weights["w"], expected, rtol=0, atol=1e-12)
        assert list(server.last_coefficients.values()) == pytest.approx(c, abs=1e-12)
    assert server.state_dict()["pid/history"][:, :2].tolist() == [[1.0, 2.0], [4.5, 4.0], [1.5, 2.0]]


# --------------------------------------------------------------------------- FedPIDAvg, whole runs
def test_fedpidavg_with_alpha_1_beta_gamma_0_equals_fedavg_exactly(tmp_path, uneven_federation, tiny_config):
    fed = uneven_federation()
    cfg = tiny_config(methods={"fedpidavg": {"alpha": 1.0, "beta": 0.0, "gamma": 0.0}})
    prep = prepare(cfg, fed)
    pid = run_algorithm("fedpidavg", prep, tmp_path, False)
    avg = run_algorithm("fedavg", prep, tmp_path, False)
    for k, v in _global(avg).items():
        assert torch.equal(_global(pid)[k], v), k
    # the paper's coefficients (0.45, 0.45, 0.1) do change the model
    default = run_algorithm("fedpidavg", prepare(tiny_config(), fed), tmp_path / "default", False)
    assert any(not torch.equal(_global(default)[k], v) for k, v in _global(avg).items())
    weights = [r for r in default.metric_rows if r["metric"] == "pid_weight" and r["round"] == 2]
    assert len(weights) == 3 and sum(r["value"] for r in weights) == pytest.approx(1.0)


# --------------------------------------------------------------------------- resume
class _Stop(Exception):
    pass


def _numbers(summary: dict) -> dict:
    return {a: {k: v for k, v in e.items() if k != "seconds"} for a, e in summary["algorithms"].items()}


def test_resume_after_interruption_equals_uninterrupted_run(tmp_path, uneven_federation, tiny_config):
    """FedPIDAvg's loss history (server state) and q-FedAvg's two exchanges survive a restart."""
    cfg = tiny_config(algorithms=["fedpidavg", "qfedavg"], fl={"rounds": 3})
    full = run_experiment(cfg, tmp_path / "full", federation=uneven_federation())
    pending = {("fedpidavg", 2), ("qfedavg", 2)}

    def stop(name, rnd, losses):
        if (name, rnd) in pending:
            pending.discard((name, rnd))
            raise _Stop

    with pytest.raises(_Stop):
        run_experiment(cfg, tmp_path / "cut", on_round_end=stop, federation=uneven_federation())
    with pytest.raises(_Stop):
        run_experiment(cfg, tmp_path / "cut", resume=True, on_round_end=stop, federation=uneven_federation())
    resumed = run_experiment(cfg, tmp_path / "cut", resume=True, federation=uneven_federation())
    assert not pending
    for a, b in zip(full.algorithms, resumed.algorithms):
        for k, v in _global(a).items():
            assert torch.equal(v, _global(b)[k]), (a.name, k)
    s_full = json.loads((tmp_path / "full" / "summary.json").read_text())
    s_cut = json.loads((tmp_path / "cut" / "summary.json").read_text())
    assert _numbers(s_full) == _numbers(s_cut)
    assert s_full["algorithms"]["qfedavg"]["cost"]["forward_batches"] == 3 * (2 + 2 + 1)
