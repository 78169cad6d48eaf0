"""FedBN (Li et al. 2021): each site keeps its normalization layers' parameters and running statistics, every other
entry travels and is averaged (the partial-sharing machinery of FedPer, ``fedseg.algorithms.partial``, with another
rule); a network without normalization entries is refused before any work, naming the setting that gives it some."""

from __future__ import annotations

import json
import re
from itertools import combinations

import pytest
import torch
from torch import nn

from fedseg.algorithms import get_algorithm
from fedseg.algorithms.aggregate import weighted_average
from fedseg.algorithms.client_state import state_group
from fedseg.algorithms.fedbn import FedBNOptions, norm_entries
from fedseg.algorithms.partial import PRIVATE, FedPerOptions, PartialSharingClient, private_entries, private_fraction
from fedseg.algorithms.prefixes import MODEL
from fedseg.engine.context import Task
from fedseg.engine.messages import weights_of
from fedseg.engine.simulator import Simulator
from fedseg.models.state import float_state
from fedseg.run import prepare, run_experiment

BATCH = {"channels": [4, 8, 16], "norm": "batch"}  # the tiny UNet with BatchNorm: 4 norm layers


class RecordingClient(PartialSharingClient):
    """FedBN's client, recording the weights of the model each site starts a round's training from."""

    def __init__(self):
        super().__init__()
        self.starts: dict[tuple[int, str], dict[str, torch.Tensor]] = {}

    def start_model(self, msg, ctx):
        model = super().start_model(msg, ctx)
        self.starts[(ctx.round, ctx.site)] = {k: v.detach().clone() for k, v in weights_of(model).items()}
        return model


def _norm_names(model: nn.Module) -> frozenset[str]:
    """The entries of ``model``'s BatchNorm modules, found independently of ``fedseg.algorithms.fedbn``."""
    return frozenset(
        f"{path}.{entry}"
        for path, m in model.named_modules()
        if isinstance(m, nn.modules.batchnorm._BatchNorm)
        for entry in ("weight", "bias", "running_mean", "running_var")
    )


def test_norm_entries_stay_on_each_site_and_every_other_entry_is_the_merged_global_model(tiny_config, disc_federation):
    cfg = tiny_config(algorithms=["fedbn"], model=BATCH, eval={"hd95": False}, train={"keep_optimizer_state": False})
    prep = prepare(cfg, disc_federation(n_sites=3))
    spec = get_algorithm("fedbn")
    options = spec.parse_options(cfg.methods.get("fedbn"))
    client = RecordingClient()
    seen: list[tuple] = []
    engine = Simulator("fedbn", client, prep.site_data, prep.task, options, observers=[lambda *x: seen.append(x)])
    server = spec.server(engine, prep.task, options)
    init = weights_of(prep.task.new_model())
    private = private_entries(prep.task, options)
    norms = _norm_names(prep.task.new_model())
    assert private == norms and len(norms) == 4 * 4  # weight, bias, running mean and variance of each BatchNorm
    assert any(n.endswith("running_mean") for n in private)
    federated = frozenset(init) - private
    merged = {k: v for k, v in init.items() if k in federated}  # what every site receives in round 1
    before = {s: {k: init[k] for k in private} for s in engine.sites}  # the common initialization
    for rnd in (1, 2):
        engine.round = rnd
        seen.clear()
        server.run_round(rnd)
        train = {site: (msg, reply) for site, action, msg, reply in seen if action == "train"}
        assert set(train) == set(engine.sites)
        for site, (msg, reply) in train.items():
            for message in (msg, reply):  # no norm entry travels, every other entry does
                assert set(message.group(MODEL)) == federated, sorted(set(message.group(MODEL)) & private)[:3]
            # the site starts from the merged global model (every non-norm entry) with its own norm entries
            start = client.starts[(rnd, site)]
            assert all(torch.equal(start[k], merged[k]) for k in federated), (rnd, site)
            assert all(torch.equal(start[k], before[site][k]) for k in private), (rnd, site)
        # the server merged the replies' federated entries (sample-weighted) and holds no norm entry
        replies = [train[s][1] for s in engine.sites]
        expected = weighted_average([r.group(MODEL) for r in replies], [float(r.meta["num_examples"]) for r in replies])
        assert set(server.global_weights) == federated
        assert all(torch.equal(server.global_weights[k], expected[k]) for k in federated)
        merged = server.global_weights
        # each site kept the norm entries it trained: changed by training, different from every other site's
        after = {s: state_group(engine.client_states[s], PRIVATE) for s in engine.sites}
        for s in engine.sites:
            assert set(after[s]) == private
            assert all(not torch.equal(after[s][k], init[k]) for k in private if k.endswith("running_mean")), s
        for a, b in combinations(engine.sites, 2):
            for k in private:
                assert not torch.equal(after[a][k], after[b][k]), (rnd, a, b, k)
        before = {s: {k: v.clone() for k, v in w.items()} for s, w in after.items()}


def test_a_run_records_its_private_share_and_sends_only_the_federated_entries(tmp_path, tiny_config, disc_federation):
    cfg = tiny_config(algorithms=["fedbn"], model=BATCH, fl={"rounds": 1}, eval={"hd95": False})
    out = tmp_path / "run"
    lines: list[str] = []
    run_experiment(cfg, out, federation=disc_federation(), on_log_line=lines.append)
    entry = json.loads((out / "summary.json").read_text())["algorithms"]["fedbn"]
    task = prepare(cfg, disc_federation()).task
    model = task.new_model()
    params = dict(model.named_parameters())
    norm_params = sum(params[n].numel() for n in _norm_names(model) if n in params)
    assert norm_params == 2 * (4 + 8 + 16 + 4)  # weight and bias of the 4 BatchNorms (channels 4, 8, 16, 4)
    assert entry["private_fraction"] == pytest.approx(norm_params / sum(p.numel() for p in params.values()))
    assert entry["private_sharing"] == {
        "private_fraction": entry["private_fraction"],
        "private_parameters": norm_params,
        "parameters": sum(p.numel() for p in params.values()),
        "norm_layers": 4,
        "private_buffers": norm_params,  # a running mean and variance per channel, as many as weight and bias
    }
    assert entry["kind"] == "personalized" and set(entry["selected_rounds"]) == {"site1", "site2", "site3"}
    note = [line for line in lines if line.startswith("fedbn: the weights and running statistics of the 4 ")]
    assert len(note) == 1 and f"{entry['private_fraction']:.2%}" in note[0], lines
    assert note[0] in (out / "run.log").read_text().splitlines()
    federated = sum(v.numel() for k, v in float_state(model).items() if k not in _norm_names(model))
    ledger = (out / "ledger.csv").read_text().splitlines()
    header = ledger[0].split(",")
    train = [dict(zip(header, row.split(","))) for row in ledger[1:] if ",train," in row]
    assert len(train) == 3 and all(int(r["floats_down"]) == int(r["floats_up"]) == federated for r in train)


def test_a_network_without_norm_entries_is_refused_in_one_line_before_any_work(tmp_path, tiny_config, disc_federation):
    cfg = tiny_config(algorithms=["fedavg", "fedbn"])  # the default model.norm: instance, no weights, no statistics
    seen: list = []
    with pytest.raises(ValueError) as e:
        run_experiment(cfg, tmp_path / "run", federation=disc_federation(), observers=[lambda *x: seen.append(x)])
    text = str(e.value)
    assert not seen, f"{len(seen)} exchanges (fedavg trained) before the refusal"
    assert "\n" not in text and text.startswith("methods.fedbn: the unet (model.norm='instance') ")
    assert "InstanceNorm2d layers have no affine weights and no running statistics" in text
    assert text.endswith("set model.norm=batch (BatchNorm, as in the FedBN paper)"), text
    # the setting it names is one the model factory builds, and one FedBN then accepts
    setting = re.search(r"set model\.norm=(\w+)", text)
    assert setting is not None
    fixed = tiny_config(algorithms=["fedbn"], model={"norm": setting.group(1)})
    get_algorithm("fedbn").check_task(Task(fixed, 2, 3, ("disc", "cup")))
    # a 3D DynUNet with instance norm (the fets preset's) is refused alike
    dyn = Task(tiny_config(model={"name": "dynunet", "channels": [4, 8, 16]}), 3, 4, ("WT",))
    with pytest.raises(ValueError, match=r"^methods\.fedbn: the dynunet \(model\.norm='instance'\) .*InstanceNorm3d"):
        get_algorithm("fedbn").check_task(dyn)


class Mixed(nn.Module):
    """Every kind of norm module FedBN keeps, one of each, next to a convolution and a PReLU (not norms)."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(2, 4, 3)
        self.bn = nn.BatchNorm2d(4)
        self.gn = nn.GroupNorm(2, 4)
        self.ln = nn.LayerNorm(4)
        self.plain = nn.InstanceNorm2d(4)  # no affine weights, no running statistics: owns nothing
        self.tracked = nn.InstanceNorm2d(4, affine=True, track_running_stats=True)
        self.act = nn.PReLU()
        self.again = self.bn  # registered twice, as DynUNet's skip_layers are


def test_the_private_entries_are_exactly_the_norm_modules_parameters_and_running_statistics():
    grouped = norm_entries(Mixed())
    assert grouped == {
        "bn": ["bn.weight", "bn.bias", "bn.running_mean", "bn.running_var"],
        "gn": ["gn.weight", "gn.bias"],
        "ln": ["ln.weight", "ln.bias"],
        "tracked": ["tracked.weight", "tracked.bias", "tracked.running_mean", "tracked.running_var"],
    }  # conv and act are no norms, plain owns nothing, the alias "again" is bn (float_state keeps one name)


def test_the_private_rule_is_the_methods_own_fedpers_is_unchanged(tiny_config):
    """FedBN and FedPer share the machinery, not the rule: on the same BatchNorm network FedPer's last layer is the
    output convolution (its norms are averaged unless among its P layers), FedBN's private entries are the norms'."""
    task = Task(tiny_config(model=BATCH), 2, 3, ("disc", "cup"))
    model = task.new_model()
    fedbn = private_entries(task, FedBNOptions())
    fedper = private_entries(task, FedPerOptions(private_layers=1))
    assert fedbn == _norm_names(model)
    assert fedper == {"model.2.conv.weight", "model.2.conv.bias"} and not fedper & fedbn
    record = private_fraction(task, FedPerOptions(private_layers=1))
    assert (record["private_unit"], record["private_layers"]) == ("layers", 1) and "norm_layers" not in record
