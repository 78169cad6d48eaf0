"""FedSM (Xu et al. 2022): SoftPull, selector labels, Algorithm 2 routing, Eq. 1 labels, ledger, runs."""

from __future__ import annotations

import json
import math
from collections import defaultdict

import numpy as np
import pytest
import torch
from safetensors.torch import load_file
from torch import nn

from fedseg.algorithms import get_algorithm
from fedseg.algorithms.aggregate import softpull, weighted_average
from fedseg.algorithms.fedsm.method import FedSMClient, at_gamma, new_selector
from fedseg.algorithms.fedsm.model import SuperModel, extra_labels, route, super_model_from_bundle
from fedseg.algorithms.fedsm.selector import build_selector
from fedseg.config import TrainConfig
from fedseg.engine.messages import Message, weights_of
from fedseg.engine.simulator import Simulator
from fedseg.evaluate.inference import score_caseset
from fedseg.models import count_parameters
from fedseg.run import cost_warnings, prepare, run_algorithm, run_experiment
from fedseg.train import segmentation_loss

SEL = {"selector_width": 0.0625}  # 4..32 channels: a tiny selector for tests


@pytest.fixture
def make_cfg(tiny_config):
    """Factory ``make_cfg(name="fedsm", rounds=2, **method)``: one method with a tiny selector, no HD95."""

    def make(name="fedsm", rounds=2, **method):
        return tiny_config(
            algorithms=[name], fl={"rounds": rounds}, eval={"hd95": False}, methods={name: {**SEL, **method}}
        )

    return make


def _engine(name, cfg, fed, client=None, observers=()):
    """Server and simulator as ``run_algorithm`` builds them, to drive rounds by hand."""
    prep = prepare(cfg, fed)
    spec = get_algorithm(name)
    options = spec.parse_options(cfg.methods.get(name))
    engine = Simulator(name, client or spec.client(), prep.site_data, prep.task, options, observers=list(observers))
    return engine, spec.server(engine, prep.task, options)


def _round(engine, server, rnd):
    engine.round = rnd
    return server.run_round(rnd)


def _random_models(k, seed=0):
    g = torch.Generator().manual_seed(seed)
    return {f"s{i}": {"a": torch.randn(3, 4, generator=g), "b": torch.randn(5, generator=g)} for i in range(k)}


# --- SoftPull (Eq. 11) ----------------------------------------------------------------------
def test_softpull_matches_eq11_and_its_two_limits():
    models = _random_models(4)
    out = softpull(models, 0.7)
    for k in models:
        others = [models[j]["a"] for j in models if j != k]
        expected = 0.7 * models[k]["a"] + 0.3 / 3 * sum(others)
        torch.testing.assert_close(out[k]["a"], expected, rtol=0, atol=1e-6)
    uniform = weighted_average(list(models.values()), [1.0] * 4)
    for w in softpull(models, 1 / 4).values():
        for name in w:
            torch.testing.assert_close(w[name], uniform[name], rtol=0, atol=1e-7)
    for k, w in softpull(models, 1.0).items():
        assert all(torch.equal(w[n], models[k][n]) for n in w)


def test_server_softpull_with_lambda_1_over_k_averages_and_lambda_1_keeps(tmp_path, make_cfg, disc_federation):
    fed = disc_federation(n_sites=3, cases_per_site=8)
    for lam in (1 / 3, 1.0):
        replies = {}
        observe = lambda site, action, msg, reply: replies.__setitem__(site, reply)  # noqa: E731
        engine, server = _engine("fedsm", make_cfg(lam=lam), fed, observers=[observe])
        _round(engine, server, 1)
        sent = {s: r.group("personal") for s, r in replies.items()}
        uniform = weighted_average(list(sent.values()), [1.0] * 3)
        for s in engine.sites:
            for name, value in server.personal[s].items():
                if lam == 1.0:
                    assert torch.equal(value, sent[s][name]), name
                else:
                    torch.testing.assert_close(value, uniform[name], rtol=0, atol=1e-7)
        assert not torch.equal(sent["site1"]["model.0.conv.weight"], sent["site2"]["model.0.conv.weight"])


def test_lambda_below_1_over_k_is_announced_and_out_of_range_values_and_single_site_are_rejected(
    make_cfg, disc_federation
):
    fed = disc_federation(n_sites=3, cases_per_site=8)
    _engine("fedsm", make_cfg(lam=0.2), fed)  # the paper's Table 7 runs lambda = 0.1 with K = 6: allowed
    (line,) = cost_warnings(make_cfg(lam=0.2), 3)
    assert "methods.fedsm.lam = 0.2 is below 1/K = 0.3333 for K = 3" in line
    assert cost_warnings(make_cfg(lam=0.5), 3) == [] and cost_warnings(make_cfg(lam=0.2), 5) == []
    assert "fedsm-extra.lam = 0.3" in cost_warnings(make_cfg("fedsm-extra", rounds=3, lam=0.3), 3)[0]
    with pytest.raises(ValueError, match=r"methods\.fedsm\.lam"):
        get_algorithm("fedsm").parse_options({"lam": 1.5})
    with pytest.raises(ValueError, match=r"methods\.fedsm\.lam"):
        get_algorithm("fedsm").parse_options({"lam": 0.0})
    with pytest.raises(ValueError, match="at least 2 sites"):
        _engine("fedsm", make_cfg(), disc_federation(n_sites=1, cases_per_site=8))
    with pytest.raises(ValueError, match=r"methods\.fedsm-extra\.extra_rounds = 2 must be smaller than fl\.rounds = 2"):
        _engine("fedsm-extra", make_cfg("fedsm-extra", rounds=2, extra_rounds=2, extra_on_top=False), fed)


# --- selector -------------------------------------------------------------------------------
def test_selector_shapes_buffers_and_width():
    sel = build_selector(3, 4, width=0.25, input_size=16)
    assert sel(torch.rand(2, 3, 40, 40)).shape == (2, 4)
    w = weights_of(sel)
    assert any(k.endswith("running_mean") for k in w) and not any("num_batches_tracked" in k for k in w)
    assert 0.55e6 < count_parameters(sel) < 0.65e6  # docs/design.md §6: 0.61M at width 0.25
    inst = build_selector(1, 3, width=0.0625, norm="instance", spatial_dims=3)
    assert inst(torch.rand(2, 1, 32, 32, 32)).shape == (2, 3)


def test_the_selector_reads_an_area_mean_of_the_image_in_3d_as_in_2d():
    """``selector_input_size`` downsamples by the mean of the voxels each output voxel covers (3D read trilinear
    samples before: 48 -> 32 skipped a third of the voxels)."""
    import torch.nn.functional as F

    sel = build_selector(2, 3, 0.25, "instance", input_size=32, spatial_dims=3).eval()
    x = torch.randn(2, 2, 48, 48, 48)
    with torch.no_grad():
        assert torch.allclose(sel(x), sel(F.adaptive_avg_pool3d(x, 32)), atol=1e-6)


def test_a_selector_side_that_instance_norm_cannot_normalize_is_refused_with_its_reason():
    from pydantic import ValidationError

    from fedseg.algorithms.fedsm.options import FedSMOptions
    from fedseg.algorithms.fedsm.selector import MIN_INSTANCE_SIDE

    with pytest.raises(
        ValidationError, match=r"ceil\(16 / 16\) = 1.*give selector_input_size at least 17, or selector_norm: batch"
    ):
        FedSMOptions(selector_input_size=16)
    assert FedSMOptions(selector_input_size=MIN_INSTANCE_SIDE).selector_input_size == 17
    assert FedSMOptions(selector_input_size=8, selector_norm="batch").selector_input_size == 8
    sel = build_selector(1, 3, 0.25, "instance", input_size=MIN_INSTANCE_SIDE, spatial_dims=3).train()
    sel(torch.randn(2, 1, 40, 40, 40)).sum().backward()  # the smallest side allowed trains


def test_a_methods_section_check_names_its_section_in_one_line(tmp_path):
    """A check over a method's options as a whole (no one key) is named ``methods.fedsm:``, not ``methods.fedsm.:``."""
    import subprocess
    import sys

    args = ["run", "--preset", "fets-cpu", "--algorithms", "fedsm", "--rounds", "1", "--out", str(tmp_path / "o")]
    done = subprocess.run(
        [sys.executable, "-m", "fedseg", *args, "--set", "methods.fedsm.selector_input_size=8"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode != 0 and "Traceback" not in done.stderr
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: methods.fedsm: selector_input_size 8 leaves"), lines
    assert not (tmp_path / "o").exists()
    unset = ["--set", "methods.fedsm.selector_input_size=null", "--set", "data.image_size=16"]
    done = subprocess.run([sys.executable, "-m", "fedseg", *args, *unset], capture_output=True, text=True, timeout=120)
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    said = "error: methods.fedsm: data.image_size 16 (the selector's input: selector_input_size is unset) leaves"
    assert done.returncode != 0 and len(lines) == 1 and lines[0].startswith(said), lines  # before any work
    assert not (tmp_path / "o").exists()


def test_selector_labels_equal_the_site_index(make_cfg, disc_federation):
    seen = {}

    class Spy(FedSMClient):
        def selector_task(self, selector, msg, ctx):
            data, loss, hooks = super().selector_task(selector, msg, ctx)
            seen[ctx.site] = data.labels.clone()
            return data, loss, hooks

    engine, server = _engine("fedsm", make_cfg(), disc_federation(n_sites=3, cases_per_site=8), client=Spy())
    _round(engine, server, 1)
    for k, site in enumerate(engine.sites):
        assert seen[site].tolist() == [k] * len(engine.site_data[site].train)


# --- Algorithm 2 ------------------------------------------------------------------------------
class _Const(nn.Module):
    """A "segmenter" whose logits are the constant ``value`` (identifies the candidate)."""

    def __init__(self, value):
        super().__init__()
        self.value = float(value)

    def forward(self, x):
        return torch.full((len(x), 1, 2, 2), self.value)


class _FixedSelector(nn.Module):
    """Selector returning preset logits, one row per image (images carry their row index)."""

    def __init__(self, logits):
        super().__init__()
        self.logits = logits

    def forward(self, x):
        return self.logits[x[:, 0, 0, 0].long()]


def test_gamma_one_uses_global_gamma_zero_the_argmax_personalized_model():
    logits = torch.tensor([[2.0, 0.0, 0.0], [0.0, 3.0, 0.0], [0.1, 0.0, 0.2], [0.0, 0.0, 5.0]])
    probs = torch.softmax(logits, 1)
    x = torch.arange(4.0).reshape(4, 1, 1, 1).expand(4, 1, 2, 2).clone()
    sm = SuperModel(_Const(0), [_Const(1), _Const(2), _Const(3)], _FixedSelector(logits))
    argmax = probs.argmax(1) + 1
    assert argmax.tolist() == [1, 2, 3, 3]
    for gamma, expected in ((1.0, [0, 0, 0, 0]), (0.0, argmax.tolist()), (0.6, [1, 2, 0, 3])):
        sm.gamma = gamma
        assert sm.choose(x).tolist() == expected
        assert sm(x)[:, 0, 0, 0].tolist() == [float(e) for e in expected]  # the chosen candidate's output
    # the server re-scores replies with the same rule
    reply = Message(
        {
            "probs": probs,
            "dice_global": torch.zeros(4, 1),
            "dice_personal": torch.ones(4, 1),
            "hd95_global": torch.zeros(4, 1),
            "hd95_personal": torch.ones(4, 1),
            "nsd_global": torch.zeros(4, 1),
            "nsd_personal": torch.ones(4, 1),
        }
    )
    assert at_gamma(reply, 1.0).tensors["dice"].flatten().tolist() == [0, 0, 0, 0]
    assert at_gamma(reply, 0.0).tensors["dice"].flatten().tolist() == [1, 1, 1, 1]
    assert at_gamma(reply, 0.0).tensors["nsd"].flatten().tolist() == [1, 1, 1, 1]
    # FedSM-extra routes by argmax over K+1 candidates (class 0 = global), with no threshold
    assert route(probs, "argmax", gamma=1.0).tolist() == [0, 1, 2, 2]


def test_extra_labels_are_the_argmin_of_the_loss_on_a_hand_made_example():
    # 2 images of 2x2 pixels, 1 region; ground truth: image 0 = top row, image 1 = all four pixels
    y = torch.tensor([[[[1.0, 1.0], [0.0, 0.0]]], [[[1.0, 1.0], [1.0, 1.0]]]])
    on, off = 30.0, -30.0  # saturated logits: sigmoid = 1 / 0 to float precision
    h0 = torch.full((2, 1, 2, 2), off)  # global: predicts nothing
    h1 = torch.tensor(
        [[[[on, on], [off, off]]], [[[on, off], [off, off]]]]
    )  # exact on image 0, 1 of 4 pixels on image 1
    h2 = torch.full((2, 1, 2, 2), on)  # everything
    # soft Dice loss 1 - (2|P.Y| + s) / (|P| + |Y| + s), s = 1e-5 (MONAI):
    # image 0: h0 -> 1 - s/(2+s) ~ 1, h1 -> 0, h2 -> 1 - 4/6 = 1/3          => argmin 1
    # image 1: h0 -> ~1, h1 -> 1 - 2/5 = 3/5, h2 -> 0                        => argmin 2
    assert extra_labels([h0, h1, h2], y, segmentation_loss(TrainConfig(loss="dice"))).tolist() == [1, 2]
    # ties go to the lower index (the global model)
    assert extra_labels([h2, h2, h1], y, segmentation_loss(TrainConfig(loss="dice"))).tolist() == [2, 0]


# --- traffic ----------------------------------------------------------------------------------
def test_ledger_shows_two_global_models_and_a_selector_per_site_and_round(tmp_path, make_cfg, disc_federation):
    fed = disc_federation(n_sites=3, cases_per_site=8)
    cfg = make_cfg(rounds=2, average_selector_moments=False)  # the paper's configuration
    prep = prepare(cfg, fed)
    result = run_algorithm("fedsm", prep, tmp_path / "paper", resume=False)
    w_g = count_parameters(prep.task.new_model())
    selector = new_selector(prep.task, get_algorithm("fedsm").parse_options(cfg.methods["fedsm"]), 3)
    w_s = count_parameters(selector)
    train = [r for r in result.ledger if r["action"] not in ("evaluate", "share_model")]
    assert {r["action"] for r in train} == {"train"}
    for rnd in (1, 2):
        rows = [r for r in train if r["round"] == rnd]
        assert len(rows) == 3 and all(r["floats_down"] == r["floats_up"] == 2 * w_g + w_s for r in rows)
        assert sum(r["floats_down"] + r["floats_up"] for r in rows) == (2 * w_g + w_s) * 2 * 3
    assert result.summary["floats_sent"] == 2 * (2 * w_g + w_s) * 2 * 3
    # default: the selector's Adam moments travel too (exp_avg, exp_avg_sq per parameter, one step
    # counter per tensor), up from round 1 and down from round 2 -- counted, nothing hidden
    moments = sum(2 * p.numel() + 1 for p in selector.parameters())
    result = run_algorithm("fedsm", prepare(make_cfg(rounds=2), fed), tmp_path / "default", resume=False)
    rows = [(r["round"], r["floats_down"], r["floats_up"]) for r in result.ledger if r["action"] == "train"]
    assert (
        rows
        == [(1, 2 * w_g + w_s, 2 * w_g + w_s + moments)] * 3
        + [(2, 2 * w_g + w_s + moments, 2 * w_g + w_s + moments)] * 3
    )


def test_fedsm_global_model_equals_fedavg(tiny_config, disc_federation):
    fed = disc_federation(n_sites=3, cases_per_site=8)
    cfg = tiny_config(algorithms=["fedavg", "fedsm"], methods={"fedsm": SEL})
    (e1, fedavg), (e2, fedsm) = _engine("fedavg", cfg, fed), _engine("fedsm", cfg, fed)
    for rnd in (1, 2):
        _round(e1, fedavg, rnd)
        _round(e2, fedsm, rnd)
    for name, value in fedavg.global_weights.items():
        assert torch.equal(value, fedsm.global_weights[name]), name


# --- whole runs -------------------------------------------------------------------------------
def _numbers(summary: dict) -> dict:
    return {a: {k: v for k, v in e.items() if k not in ("seconds", "cost")} for a, e in summary["algorithms"].items()}


class _Stop(Exception):
    pass


@pytest.mark.parametrize("personalization", ["softpull", "apfl", "pfedme"])
def test_fedsm_resume_and_determinism(tmp_path, personalization, make_cfg, disc_federation):
    """Also APFL's client state (v_k, alpha_k) and pFedMe's server model survive a stop after round 2 of 3.
    Determinism: the stopped run trains rounds 1-2 afresh in the same process after the full run, so a run that
    differed from one start to the next differs from the full run here too (a separate second full run, 1 of the
    test's 4 trainings, checked nothing more)."""
    cfg = make_cfg(rounds=3, personalization=personalization)
    fed = disc_federation(n_sites=3, cases_per_site=8)
    full = run_experiment(cfg, tmp_path / "full", federation=fed)

    def stop(name, rnd, losses):
        if rnd == 2:
            raise _Stop

    with pytest.raises(_Stop):
        run_experiment(cfg, tmp_path / "cut", on_round_end=stop, federation=fed)
    resumed = run_experiment(cfg, tmp_path / "cut", resume=True, federation=fed)
    a, b = full.algorithms[0], resumed.algorithms[0]
    assert a.bundle.keys() == b.bundle.keys()
    for model in a.bundle:
        for k in a.bundle[model]:
            assert torch.equal(a.bundle[model][k], b.bundle[model][k]), (model, k)
    assert a.metric_rows == b.metric_rows
    summaries = [json.loads((tmp_path / d / "summary.json").read_text()) for d in ("full", "cut")]
    assert _numbers(summaries[0]) == _numbers(summaries[1])


def test_end_to_end_fedsm_extra_and_ensemble(tmp_path, tiny_config, disc_federation):
    names = ["fedsm", "fedsm-extra", "fedsm-ensemble"]
    cfg = tiny_config(
        algorithms=names,
        fl={"rounds": 2},  # fedsm-extra / ensemble: 2 model rounds + 1 selector round on top
        eval={"hd95": False},
        methods={"fedsm": SEL, "fedsm-extra": {**SEL, "extra_rounds": 1}, "fedsm-ensemble": {**SEL, "extra_rounds": 1}},
    )
    fed = disc_federation(n_sites=3, cases_per_site=8)
    results = run_experiment(cfg, tmp_path, federation=fed)
    summary = json.loads((tmp_path / "summary.json").read_text())
    prep = prepare(cfg, fed)
    w_g = count_parameters(prep.task.new_model())
    for res in results.algorithms:
        entry = summary["algorithms"][res.name]
        assert set(entry["dice"]) == {"site1", "site2", "site3", "client_avg", "global"}
        assert all(0.0 <= v <= 1.0 for v in entry["dice"].values())
        assert {r["model"] for r in res.test_rows} == {"fedsm"}
        accuracy = [r for r in res.metric_rows if r["metric"] == "selector_acc"]
        assert entry["rounds"] == (2 if res.name == "fedsm" else 3)  # the selector round comes on top of fl.rounds
        assert len(accuracy) == 3 * entry["rounds"] and all(0.0 <= r["value"] <= 1.0 for r in accuracy)
        assert set(res.bundle) == {
            "global",
            "personal:site1",
            "personal:site2",
            "personal:site3",
            "selector",
            "gamma",
            "selector_spec",
        }
    # FedSM: gamma chosen from the grid and stored as a 0-d tensor
    fedsm = results.algorithms[0]
    gamma = float(fedsm.bundle["gamma"]["value"])
    assert gamma in get_algorithm("fedsm").parse_options({}).gamma_grid
    assert [r["value"] for r in fedsm.metric_rows if r["metric"] == "gamma"]
    # FedSM-extra / ensemble: 2 model rounds (2 w_g each way), then install (K+1) w_g down, then w_s each way
    selector = build_selector(3, 4, width=SEL["selector_width"], norm="instance")
    w_s, moments = count_parameters(selector), sum(2 * p.numel() + 1 for p in selector.parameters())
    for res in results.algorithms[1:]:
        by = defaultdict(list)
        for r in res.ledger:
            by[(r["round"], r["action"])].append((r["floats_down"], r["floats_up"]))
        assert by[(1, "train")] == by[(2, "train")] == [(2 * w_g, 2 * w_g)] * 3
        assert by[(3, "install")] == [(4 * w_g, 0)] * 3
        assert by[(3, "train")] == [(w_s, w_s + moments)] * 3  # the selector's first round: moments go up only
        assert math.isnan(float(res.bundle["gamma"]["value"]))
    # the saved bundle rebuilds the super model that produced the test scores
    tensors = load_file(tmp_path / "model" / "fedsm" / "weights.safetensors")
    bundle = defaultdict(dict)
    for name, t in tensors.items():
        model, _, key = name.partition("/")
        bundle[model][key] = t
    sm = super_model_from_bundle(bundle, prep.task.new_model, fed.channels, fed.spatial_dims)
    assert sm.gamma == gamma and sm.mode == "threshold"
    ev = cfg.eval
    for data in prep.site_data:
        dice = score_caseset(
            sm, data.test, ev.batch_size, ev.threshold, False, prep.task.device, regions=prep.task.scored_regions
        )["dice"]
        rows = {
            (r["case"], r["region"]): r["value"]
            for r in fedsm.test_rows
            if r["site"] == data.name and r["metric"] == "dice"
        }
        for i, case in enumerate(data.test.ids):
            for j, region in enumerate(prep.task.regions):
                assert dice[i, j] == pytest.approx(rows[(case, region)], abs=1e-9), (case, region)


def test_fedsm_extra_installs_the_best_model_phase_round_on_validation_and_resumes_it(
    tmp_path, tiny_config, disc_federation
):
    """The selector phase starts from the global and personalized models of the phase-1 round with the best
    validation Dice (each image routed to its own site's personalized model), not the last one; a run interrupted
    in phase 1 resumes to the same numbers (the kept candidates are in the checkpoint)."""
    cfg = tiny_config(
        algorithms=["fedsm-extra"],
        fl={"rounds": 4},
        eval={"hd95": False},
        methods={"fedsm-extra": {**SEL, "extra_rounds": 1}},
        faults=[{"site": "site1", "round": 4, "kind": "scale", "factor": -100.0}],  # round 4's models are wrecked
    )
    fed = disc_federation(n_sites=3, cases_per_site=8)
    seen: list[tuple[str, Message]] = []
    observe = lambda site, action, msg, reply: seen.append((action, msg)) if site == "site1" else None  # noqa: E731
    result = run_experiment(cfg, tmp_path / "full", observers=[observe], federation=fed).algorithms[0]
    val = defaultdict(list)
    for r in result.rounds_rows:
        val[r["round"]].append(r["val_dice"])
    phase1 = {rnd: float(np.mean(v)) for rnd, v in val.items() if rnd <= 4}
    best = result.summary["phase1_best_round"]
    assert best == max(phase1, key=lambda r: (phase1[r], -r)) and best < 4  # not the last phase-1 round
    evaluated = [msg for action, msg in seen if action == "evaluate"]  # one per validated round, in order
    (install,) = [msg for action, msg in seen if action == "install"]
    assert all(torch.equal(v, evaluated[best - 1].group("global")[k]) for k, v in install.group("candidate/0").items())
    assert evaluated[best - 1].meta["route"] == "own" and "route" not in evaluated[4].meta  # round 5: the selector's

    def stop_in_phase_one(name, rnd, losses):
        if rnd == 2:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        run_experiment(cfg, tmp_path / "cut", on_round_end=stop_in_phase_one, federation=fed)
    resumed = run_experiment(cfg, tmp_path / "cut", resume=True, federation=fed).algorithms[0]
    assert resumed.summary["dice"] == result.summary["dice"] and resumed.summary["phase1_best_round"] == best
