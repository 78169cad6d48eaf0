"""Secure aggregation (``fl.secure_aggregation: secagg+``, ``fedseg.flower.secure``): which methods may use it
(the others are refused before any work, one line with the reason), the simulator's refusal, and a real
``fedseg flower local`` deployment with Flower's SecAgg+ whose merged model matches the plain run's up to the
quantization error."""

from __future__ import annotations

import csv
import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from safetensors.torch import load_file
from typer.testing import CliRunner

from fedseg.algorithms import ALGORITHMS, BUILTIN_ALGORITHMS, register_algorithm, unregister_algorithm
from fedseg.algorithms.fedavg import FedAvgClient, FedAvgServer
from fedseg.algorithms.registry import NOT_SECURE, AlgorithmSpec
from fedseg.cli import app
from fedseg.data.folder_write import write_folder
from fedseg.flower.secure import SIMULATOR_REFUSAL, check, refusal, secure_methods

runner = CliRunner()
# What every built-in method said before the specs held it (fedseg.flower.secure's SECURE and REFUSALS lists):
# the methods whose server merges only the weighted sum, and every other one's reason, unchanged.
BUILTIN_SECURE = frozenset(
    {"ditto", "fedadam", "fedavg", "fedavg-steps", "fedavg-uniform", "fedbn", "fedper", "fedprox", "lg-fedavg"}
)
BUILTIN_REFUSALS = {
    "centralized": "it pools every site's data in one place",
    "local": "each site's own model is sent to the coordinator for the cross-site test",
    "fedavg-dp": "its server clips each site's update before adding the noise (central DP needs every update)",
    "scaffold": "its server needs the control-variate updates c_k, averaged over all sites, beside the model's sum",
    "fednova": "its server normalizes each site's update by that site's own step count tau_k",
    "fedmedian": "its coordinate-wise median needs every site's update",
    "fedtrimmedavg": "its trimmed mean sorts every site's update per coordinate",
    "krum": "Krum scores each site's update by its distances to the others'",
    "multikrum": "Multi-Krum scores each site's update by its distances to the others'",
    "bulyan": "Bulyan selects and trims individual updates",
    "qfedavg": "its server weights each site's update by that site's own loss (q-FFL's Delta_k and h_k)",
    "fedpidavg": "its server weights each site by that site's own validation-loss history (PID terms)",
    "autofedavg-n-dirichlet": "it learns the aggregation weights from every site's individual model",
    "autofedavg-n-softmax": "it learns the aggregation weights from every site's individual model",
    "autofedavg-l-dirichlet": "it learns the aggregation weights from every site's individual model",
    "autofedavg-l-softmax": "it learns the aggregation weights from every site's individual model",
    "finetune": "its sites train alone and nothing is merged",
    "ditto-ft": "its sites train alone and nothing is merged",
    "cfl": "it splits clusters by the cosine similarity of individual updates",
    "prior-cfl": "it averages within clusters of sites (one sum per cluster, not one per round)",
    "fedavg-continue": "it merges as prior-cfl does (per cluster, from the individual replies)",
    "fedsm": "its server SoftPulls every site's personalized model and trains the selector on individual replies",
    "fedsm-extra": "its server SoftPulls every site's personalized model and trains the selector on individual replies",
    "fedsm-ensemble": "its server SoftPulls every site's personalized model",
}
SECURE_CFG = {"fl": {"secure_aggregation": "secagg+"}, "eval": {"local_models": False}}


def test_only_methods_that_merge_the_weighted_sum_may_use_it_the_others_say_why(tiny_config):
    cfg = tiny_config(**SECURE_CFG)
    for name in ALGORITHMS:
        why = refusal(name, cfg)
        assert (why is None) == (name in secure_methods()), name
        if name in BUILTIN_REFUSALS:
            assert why == BUILTIN_REFUSALS[name]
    assert (
        refusal("autofedavg-l-dirichlet", cfg) == "it learns the aggregation weights from every site's individual model"
    )
    for name in secure_methods():
        check(cfg.model_copy(update={"algorithms": [name]}))  # no error
    with pytest.raises(ValueError) as e:
        check(cfg.model_copy(update={"algorithms": ["fedavg", "krum", "scaffold"]}))
    text = str(e.value)
    assert "\n" not in text and "fedavg cannot" not in text
    assert "krum cannot use it: Krum scores each site's update" in text and "scaffold cannot use it" in text


def test_the_specs_keep_every_built_in_methods_secure_capability_and_refusal_text(tiny_config):
    cfg = tiny_config(**SECURE_CFG)
    assert secure_methods() & BUILTIN_ALGORITHMS == BUILTIN_SECURE
    assert set(BUILTIN_REFUSALS) | BUILTIN_SECURE == BUILTIN_ALGORITHMS
    assert {name: refusal(name, cfg) for name in BUILTIN_REFUSALS} == BUILTIN_REFUSALS


@pytest.mark.parametrize("opts_in", [True, False])
def test_a_method_defined_outside_fedseg_opts_in_on_its_spec(opts_in, tiny_config):
    cfg = tiny_config(**SECURE_CFG)
    extra = {"on_secure_aggregation": None} if opts_in else {}
    register_algorithm(AlgorithmSpec("secure-plugin", "Plugin", FedAvgServer, FedAvgClient, "p_k", **extra))
    try:
        assert refusal("secure-plugin", cfg) == (None if opts_in else NOT_SECURE)
        assert ("secure-plugin" in secure_methods()) == opts_in
    finally:
        unregister_algorithm("secure-plugin")


def test_a_robust_aggregator_and_uploaded_local_models_are_refused(tiny_config):
    cfg = tiny_config(fl={"secure_aggregation": "secagg+"}, methods={"fedprox": {"aggregator": "krum"}})
    assert "aggregator 'krum' needs every site's update" in refusal("fedprox", cfg)
    assert "eval.local_models sends every site's own trained model" in refusal("fedavg", cfg)  # on by default
    assert refusal("ditto", cfg) is None  # its sites' own models never leave them
    check(tiny_config(algorithms=["krum"]))  # secure aggregation off: nothing refused


def test_flowers_own_checks_of_the_secagg_parameters_are_config_errors(tiny_config):
    cfg = tiny_config(**SECURE_CFG, algorithms=["fedavg"])
    bad = cfg.model_copy(
        update={"fl": cfg.fl.model_copy(update={"secagg": cfg.fl.secagg.model_copy(update={"modulus_range": 1000})})}
    )
    with pytest.raises(ValueError, match="fl.secagg: `modulus_range` must be"):
        check(bad)


def test_the_simulator_refuses_secure_aggregation_in_one_line(tmp_path, tiny, discs):
    path = tmp_path / "cfg.yaml"
    path.write_text(yaml.safe_dump({**tiny, "algorithms": ["fedavg"], **SECURE_CFG}))
    folder = write_folder(discs, tmp_path / "fed")
    res = runner.invoke(app, ["run", "--config", str(path), "--data", str(folder), "--out", str(tmp_path / "o")])
    assert res.exit_code != 0
    assert SIMULATOR_REFUSAL in " ".join(res.output.split())
    assert not (tmp_path / "o" / "ledger.csv").exists()


def _fedseg(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "fedseg.cli", *args], capture_output=True, text=True, timeout=900)


def _rows(run: Path) -> list[dict]:
    with open(run / "ledger.csv") as f:
        return list(csv.DictReader(f))


QUANTIZATION_ATOL = 2e-5  # |secure - plain| per weight after one merge (step 2*8/2**22 = 3.8e-6; measured 7.5e-6)
DICE_ATOL = 1e-4


def _start_flower_local(
    tmp_path: Path, tiny: dict, folder: Path, name: str, fl: dict, **extra
) -> tuple[subprocess.CompletedProcess, Path]:
    """``fedseg flower local`` of FedAvg on ``folder`` with ``fl`` (and ``extra`` config keys): the process, its OUT."""
    cfg = {**tiny, "algorithms": ["fedavg"], "fl": {**tiny.get("fl", {}), **fl}, **extra}
    cfg["eval"] = {**cfg.get("eval", {}), "local_models": False}
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(cfg))
    out = tmp_path / name
    return _fedseg("flower", "local", "--config", str(path), "--data", str(folder), "--out", str(out)), out


def _flower_local(tmp_path: Path, tiny: dict, folder: Path, name: str, fl: dict, **extra) -> Path:
    proc, out = _start_flower_local(tmp_path, tiny, folder, name, fl, **extra)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return out


def _failed_flower_local(tmp_path: Path, tiny: dict, folder: Path, name: str, fl: dict, **extra) -> str:
    """The error a failing ``fedseg flower local`` prints (status 1, no traceback), whitespace folded."""
    proc, _ = _start_flower_local(tmp_path, tiny, folder, name, fl, **extra)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr
    return " ".join(proc.stderr.split())


def _federation(disc_federation):
    return disc_federation(n_sites=3, cases_per_site=6)


@pytest.fixture(scope="module")
def three_sites(tmp_path_factory, disc_federation) -> Path:
    return write_folder(_federation(disc_federation), tmp_path_factory.mktemp("secure") / "fed")


@pytest.mark.slow
def test_secagg_plus_on_flower_local_matches_the_plain_run_to_the_quantization_error(tmp_path, tiny, three_sites):
    """FedAvg, 3 sites, one round on ``fedseg flower local``, with and without SecAgg+: the same merged model up to
    ``QUANTIZATION_ATOL`` per weight, the same test Dice to ``DICE_ATOL``; the SecAgg+ stages are in the ledger."""
    runs = {}
    for mode in ("off", "secagg+"):
        fl = {"rounds": 1, "secure_aggregation": mode}
        runs[mode] = _flower_local(tmp_path, tiny, three_sites, mode.replace("+", ""), fl)
    plain, secure = (load_file(runs[m] / "model" / "fedavg" / "weights.safetensors") for m in ("off", "secagg+"))
    assert sorted(plain) == sorted(secure)
    worst = max(float((plain[k].double() - secure[k].double()).abs().max()) for k in plain)
    assert 0 < worst <= QUANTIZATION_ATOL, worst  # quantized (not bit-identical), but within the bound
    a, b = (json.loads((runs[m] / "summary.json").read_text())["algorithms"]["fedavg"] for m in ("off", "secagg+"))
    assert b["dice"] == pytest.approx(a["dice"], abs=DICE_ATOL)

    rows = _rows(runs["secagg+"])
    assert [r["action"] for r in rows if r["round"] == "1"][:12] == (
        ["secagg_setup"] * 3 + ["secagg_share_keys"] * 3 + ["train"] * 3 + ["secagg_unmask"] * 3
    )
    key = lambda r: r["site"]  # noqa: E731
    train = sorted((r for r in rows if r["action"] == "train"), key=key)
    plain_train = sorted((r for r in _rows(runs["off"]) if r["action"] == "train"), key=key)
    assert len(train) == len(plain_train) == 3
    for r, p in zip(train, plain_train):
        assert r["floats_down"] == p["floats_down"] and r["steps"] == p["steps"]
        assert int(r["floats_up"]) == int(p["floats_up"]) + 1  # the masked vector carries the weight factor too
        assert int(r["bytes_up"]) > int(p["bytes_up"])  # 8-byte masked integers instead of 4-byte floats
    assert all(int(r["bytes_down"]) > 0 and int(r["bytes_up"]) > 0 for r in rows if r["action"].startswith("secagg"))
    assert b["floats_sent"] == a["floats_sent"] + 3 and b["bytes_sent"] > a["bytes_sent"] > 0


@pytest.mark.slow
def test_a_site_dropping_out_mid_protocol_is_skipped_and_the_others_sum_is_unmasked(tmp_path, tiny, three_sites):
    """Two rounds; site1 crashes in round 2 after the key exchange (fl.on_failure = skip): SecAgg+ reconstructs
    its masks from the other sites' shares and the round merges the other two."""
    fault = [{"site": "site1", "round": 2, "kind": "crash"}]
    out = _flower_local(
        tmp_path,
        tiny,
        three_sites,
        "drop",
        {"rounds": 2, "secure_aggregation": "secagg+", "on_failure": "skip"},
        faults=fault,
    )
    rows = _rows(out)
    failed = [r for r in rows if r["failure"]]
    assert [(r["round"], r["site"], r["action"]) for r in failed] == [("2", "site1", "train")]
    assert {r["site"] for r in rows if r["round"] == "2" and r["action"] == "secagg_unmask"} == {"site2", "site3"}
    assert json.loads((out / "summary.json").read_text())["algorithms"]["fedavg"]["rounds"] == 2


def test_a_bare_yaml_off_turns_it_off(tiny_config):
    assert tiny_config(fl={"secure_aggregation": False}).fl.secure_aggregation == "off"


@pytest.mark.slow
def test_local_dp_clips_every_sites_update_before_it_is_masked(tmp_path, tiny, three_sites, disc_federation):
    """``fl.local_dp`` (Flower's LocalDpMod) with no noise and clipping norm C: every site's update has L2 norm
    at most C, so the merged model is within C of the initial one (SecAgg+'s quantization made negligible)."""
    from fedseg.config import RunConfig
    from fedseg.engine.context import Task
    from fedseg.engine.messages import weights_of

    clip = 1e-4
    fl = {
        "rounds": 1,
        "secure_aggregation": "secagg+",
        "secagg": {"clipping_range": 0.01},  # quantization step 4.8e-9
        "local_dp": {"clipping_norm": clip, "sensitivity": 0.0, "epsilon": 1.0, "delta": 1e-5},
    }
    out = _flower_local(tmp_path, tiny, three_sites, "dp", fl)
    merged = load_file(out / "model" / "fedavg" / "weights.safetensors")
    fed = _federation(disc_federation)
    cfg = RunConfig.model_validate(yaml.safe_load((out / "config.yaml").read_text()))
    start = weights_of(Task.of(cfg, fed).new_model())
    moved = sum(float((merged[f"global/{k}"].double() - v.double()).square().sum()) for k, v in start.items()) ** 0.5
    assert 0 < moved <= clip * 1.01, moved


def test_local_dp_without_secure_aggregation_is_a_config_error(tiny_config):
    dp = {"clipping_norm": 1.0, "sensitivity": 1.0, "epsilon": 1.0, "delta": 1e-5}
    with pytest.raises(ValueError, match="fl.local_dp runs inside the SecAgg"):
        tiny_config(fl={"local_dp": dp})
    assert tiny_config(fl={"local_dp": dp, "secure_aggregation": "secagg+"}).fl.local_dp.epsilon == 1.0


@pytest.mark.slow
def test_under_secagg_a_site_masks_with_the_coordinators_weight_and_a_false_report_stops_the_round(
    tmp_path, tiny, three_sites
):
    """A site whose reply reports 100x its training-set size as num_examples (fault ``weight``): under SecAgg+ its
    update was masked with the weight the coordinator sent (its declared size), and the coordinator, seeing the false
    report in its plain metrics, stops the round naming it (its update is in the sum: it cannot be left out)."""
    fl = {"rounds": 1, "secure_aggregation": "secagg+"}
    said = _failed_flower_local(tmp_path, tiny, three_sites, "weight", fl, faults=[{"site": "site2", "kind": "weight"}])
    assert "site 'site2', round 1, fedavg train (secure aggregation): num_examples = " in said, said
    assert "but the site holds" in said


@pytest.mark.slow
def test_a_halted_secure_aggregation_says_why_and_which_site_failed(tmp_path, tiny, three_sites):
    """Every share needed (reconstruction_threshold 1.0) and site1 crashing after the key exchange: SecAgg+ cannot
    unmask the sum. The run stops with one line giving Flower's reason and the failed site (it pointed at a log that
    held only a traceback)."""
    fl = {
        "rounds": 1,
        "secure_aggregation": "secagg+",
        "on_failure": "skip",
        "secagg": {"reconstruction_threshold": 1.0},
    }
    said = _failed_flower_local(tmp_path, tiny, three_sites, "halt", fl, faults=[{"site": "site1", "kind": "crash"}])
    assert "round 1: secure aggregation halted: Insufficient available nodes. " in said, said  # Flower's reason
    assert "(fl.secagg.reconstruction_threshold = 1.0 of the shares must survive); failed: site1 (train): " in said
    assert "InjectedCrash" in said


def test_a_site_masks_only_with_its_own_weight():
    """A coordinator that sent weight 0 to every site but one unmasked that site's update from the "sum" (a security
    audit, with a modified coordinator on real processes), as would one sending ``uniform`` weights to the others and
    ``samples`` to one (a review): each site now checks the weighting against the run config every node holds and
    the weight against what it knows, 1 under uniform weighting, else its own training-set size, before it trains."""
    from fedseg.flower.secure import site_weight

    assert site_weight({"weighting": "samples", "weight": 5}, "samples", 5) == 5
    assert site_weight({"weighting": "uniform", "weight": 1}, "uniform", 5) == 1
    for head in ({"weighting": "samples", "weight": 0}, {"weighting": "samples", "weight": 50}):
        with pytest.raises(ValueError, match=r"^secure aggregation refused: the coordinator asked this site to "):
            site_weight(head, "samples", 5)
    with pytest.raises(ValueError, match=r"by 0, not 1 \(uniform weighting\); another weight could single out"):
        site_weight({"weighting": "uniform", "weight": 0}, "uniform", 5)
    with pytest.raises(ValueError, match="by True, not its training-set size, 1 cases"):
        site_weight({"weighting": "samples", "weight": True}, "samples", 1)
    with pytest.raises(ValueError, match="sent this site 'uniform' weighting, not the run's 'samples'"):
        site_weight({"weighting": "uniform", "weight": 1}, "samples", 5)


def test_a_sites_description_of_its_summed_vector_must_be_the_one_it_received():
    """Under SecAgg+ each site's reply is rebuilt from the sum with the index the site sends (name, dtype, shape,
    delta per tensor): a rogue ``delta = false`` made the coordinator rebuild another average than the sites' (the
    received weights left out), and a malformed entry was an exception naming no site (a trust-boundary audit)."""
    import numpy as np
    import torch

    from fedseg.flower.secure import index_problem

    first = {"model/w": torch.zeros(2, 3), "model/b": torch.zeros(3)}
    average = [np.zeros(6), np.zeros(3)]
    honest = [["model/w", "float32", [2, 3], True], ["model/b", "float32", [3], True]]
    assert index_problem(honest, first, average) is None
    rogue = {
        "not an update": ([["model/w", "float32", [2, 3], False], honest[1]], "described unlike the one it received"),
        "another dtype": ([["model/w", "float64", [2, 3], True], honest[1]], "described unlike the one it received"),
        "another shape": ([["model/w", "float32", [3, 2], True], honest[1]], "described unlike the one it received"),
        "too few": ([honest[0]], "it describes 1 tensors, the sum has 2"),
        "malformed": ([["model/w", "float32"], honest[1]], "not [name, dtype, shape, delta]"),
        "not a float": ([["model/w", "int64", [2, 3], True], honest[1]], "no float tensor's"),
        "wrong size": ([["model/w", "float32", [2, 2], True], honest[1]], "is not its 6 entries of the sum"),
    }
    for what, (index, said) in rogue.items():
        problem = index_problem(index, first, average)
        assert problem is not None and said in problem, (what, problem)
