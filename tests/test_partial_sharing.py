"""Partial model sharing (FedPer, LG-FedAvg): what travels, what stays on the site, how the shared
part is merged, the traffic it costs, the parameterized layers (FeTS's reading, the default) or network
blocks (``private_unit: blocks``) the split is made of, and the private share a run records."""

from __future__ import annotations

import json
from itertools import combinations

import pytest
import torch
import yaml

from fedseg.algorithms import get_algorithm
from fedseg.algorithms.aggregate import weighted_average
from fedseg.algorithms.client_state import state_group
from fedseg.algorithms.partial import (
    PRIVATE,
    FedPerOptions,
    LGFedAvgOptions,
    SharingOptions,
    parameterized_layers,
    private_entries,
    private_fraction,
)
from fedseg.algorithms.prefixes import MODEL
from fedseg.config import CHANGED_METHOD_DEFAULTS, ModelConfig
from fedseg.config_load import dump_config, load_config
from fedseg.data.federation import Site
from fedseg.engine.context import Task
from fedseg.engine.messages import Message, float_state, prefixed, weights_of
from fedseg.models.blocks import entries_by_block, network_blocks
from fedseg.run import prepare, run_algorithm, run_experiment
from fedseg.run.preflight import check_resume, recorded_config, resume_conflicts
from fedseg.testing import simulate

SHARING = ("fedper", "lg-fedavg")
FOUR_LEVELS = {"channels": [4, 8, 16, 32]}  # 7 blocks: 3 down, the bottom, 3 up
P = 2  # private layers in the runs below (private_unit: layers, the default)


@pytest.fixture
def uneven(disc_federation):
    """Disc federation whose sites hold 8, 16, 24 cases (train splits 4, 8, 12: unequal sample weights)."""
    fed = disc_federation(n_sites=3, cases_per_site=24)
    fed.sites = [Site(s.name, s.cases[:n]) for s, n in zip(fed.sites, (8, 16, 24))]
    return fed


def _cfg(tiny_config, name, rounds=2, **overrides):
    settings = {
        "algorithms": [name],
        "model": FOUR_LEVELS,
        "fl": {"rounds": rounds},
        "eval": {"hd95": False},
        "methods": {name: {"private_layers": P}},
    }
    return tiny_config(**{**settings, **overrides})


def _split_names(task, options) -> tuple[frozenset, frozenset]:
    """(private, federated) entry names of ``task``'s network."""
    private = private_entries(task, options)
    return private, frozenset(weights_of(task.new_model())) - private


def _differ(a: dict, b: dict) -> bool:
    return any(not torch.equal(a[k], b[k]) for k in a)


# --- what travels --------------------------------------------------------------------------------


@pytest.mark.parametrize("name", SHARING)
def test_private_entries_never_travel_and_every_federated_entry_does(name, tmp_path, tiny_config, uneven):
    cfg = _cfg(tiny_config, name)
    prep = prepare(cfg, uneven)
    private, federated = _split_names(prep.task, get_algorithm(name).parse_options(cfg.methods[name]))
    assert private and federated
    seen = []
    run_algorithm(name, prep, tmp_path, resume=False, observers=[lambda *x: seen.append(x)])
    train = [(m, r) for _, a, m, r in seen if a == "train"]
    assert len(train) == cfg.fl.rounds * len(uneven.sites)
    for msg, reply in train:
        for message in (msg, reply):
            assert all(k.startswith(MODEL + "/") for k in message.tensors)
            names = set(message.group(MODEL))
            assert not names & private, sorted(names & private)[:3]
            assert names == federated
    # the validation of a site's own model sends only w_g too (w_l is on the site)
    val = [m for _, a, m, _ in seen if a == "evaluate" and m.meta["split"] == "val"]
    assert val and all(set(m.group(MODEL)) == federated for m in val)


@pytest.mark.parametrize("name", SHARING)
def test_private_entries_stay_on_each_site_across_rounds_and_are_what_it_trained(name, tiny_config, disc_federation):
    """After each round, site k's ``private/`` group is the w_l of the model it just trained; that
    model is recomputed by FedAvg's client from the same start (received w_g + the site's w_l before
    the round, the common initialization in round 1) on the same random stream."""
    cfg = _cfg(tiny_config, name, train={"keep_optimizer_state": False})  # no optimizer moments to carry over
    fed = disc_federation(n_sites=3)
    seen = []
    engine, server, options = simulate(name, cfg, fed, [lambda s, a, m, r: seen.append((engine.round, s, a, m, r))])
    plain, _, _ = simulate("fedavg", cfg, fed)
    private, federated = _split_names(engine.task, options)
    init = weights_of(engine.task.new_model())
    before = {s: {k: init[k] for k in private} for s in engine.sites}
    for rnd in (1, 2):
        engine.round = plain.round = rnd
        server.run_round(rnd)
        exchanged = {s: (m, r) for r_, s, a, m, r in seen if r_ == rnd and a == "train"}
        start = {s: {**exchanged[s][0].group(MODEL), **before[s]} for s in engine.sites}
        trained = {
            s: r.group(MODEL)
            for s, r in plain.exchange({s: Message(prefixed(MODEL, w)) for s, w in start.items()}, "train").items()
        }
        after = {s: state_group(engine.client_states[s], PRIVATE) for s in engine.sites}
        for s in engine.sites:
            assert set(after[s]) == private
            assert all(torch.equal(after[s][k], trained[s][k]) for k in private), (rnd, s)
            reply = exchanged[s][1].group(MODEL)
            assert set(reply) == federated and all(torch.equal(reply[k], trained[s][k]) for k in federated)
            assert _differ(after[s], before[s]), (rnd, s)  # trained this round, kept for the next
        for a, b in combinations(engine.sites, 2):
            assert _differ(after[a], after[b]), (rnd, a, b)
        before = {s: {k: v.clone() for k, v in w.items()} for s, w in after.items()}


@pytest.mark.parametrize("name", SHARING)
def test_federated_entries_are_the_sample_weighted_average_of_the_replies(name, tiny_config, uneven):
    cfg = _cfg(tiny_config, name)
    seen = []
    engine, server, options = simulate(name, cfg, uneven, [lambda s, a, m, r: seen.append((engine.round, s, a, m, r))])
    _, federated = _split_names(engine.task, options)
    for rnd in (1, 2):
        engine.round = rnd
        server.run_round(rnd)
        replies = {s: r for r_, s, a, _, r in seen if r_ == rnd and a == "train"}
        n = [float(replies[s].meta["num_examples"]) for s in engine.sites]
        assert n == [float(len(d.train)) for d in engine.site_data.values()] and len(set(n)) == 3
        expected = weighted_average([replies[s].group(MODEL) for s in engine.sites], n)
        uniform = weighted_average([replies[s].group(MODEL) for s in engine.sites], [1.0] * 3)
        assert set(server.global_weights) == federated
        assert all(torch.equal(server.global_weights[k], expected[k]) for k in federated), rnd
        assert _differ(expected, uniform)  # the weights matter
    sent = [m.group(MODEL) for r_, _, a, m, _ in seen if r_ == 2 and a == "train"]
    assert all(not _differ(w, sent[0]) for w in sent)  # every site received the same w_g


@pytest.mark.parametrize("name", SHARING)
def test_federated_batchnorm_statistics_are_averaged_whatever_the_aggregator(name, tiny_config, disc_federation):
    """With a robust aggregator the shared weights follow it, but the shared running statistics are FedAvg's
    average of the replies' (``average_buffers``), as for every FedAvg-based method; the private ones never travel."""
    methods = {name: {"private_layers": P, "aggregator": "clipped", "clip_norm": 0.01}}
    cfg = _cfg(tiny_config, name, rounds=1, model={**FOUR_LEVELS, "norm": "batch"}, methods=methods)
    seen = []
    engine, server, options = simulate(name, cfg, disc_federation(n_sites=3), [lambda s, a, m, r: seen.append((a, r))])
    private, federated = _split_names(engine.task, options)
    params = {k for k, _ in engine.task.new_model().named_parameters()}
    shared_stats = sorted(k for k in federated if k not in params)
    assert shared_stats and not private & set(shared_stats)
    engine.round = 1
    server.run_round(1)
    replies = [r.group(MODEL) for a, r in seen if a == "train"]
    n = [float(len(d.train)) for d in engine.site_data.values()]
    expected = weighted_average([{k: r[k] for k in shared_stats} for r in replies], n)
    assert all(torch.equal(server.global_weights[k], expected[k]) for k in shared_stats)


@pytest.mark.parametrize("name", SHARING)
def test_training_traffic_is_fedavgs_times_the_federated_fraction(name, tmp_path, tiny_config, uneven):
    cfg = _cfg(tiny_config, name, algorithms=["fedavg", name])
    prep = prepare(cfg, uneven)
    private, federated = _split_names(prep.task, get_algorithm(name).parse_options(cfg.methods[name]))
    everything = weights_of(prep.task.new_model())
    n_all = sum(t.numel() for t in everything.values())
    n_fed = sum(everything[k].numel() for k in federated)
    assert 0 < n_fed < n_all
    fedavg = run_algorithm("fedavg", prep, tmp_path / "fedavg", resume=False)
    shared = run_algorithm(name, prep, tmp_path / name, resume=False)
    rows = lambda res: [r for r in res.ledger if r["action"] == "train"]  # noqa: E731
    assert len(rows(shared)) == len(rows(fedavg)) == cfg.fl.rounds * 3
    assert all(r["floats_down"] == r["floats_up"] == n_fed for r in rows(shared))
    assert all(r["floats_down"] == r["floats_up"] == n_all for r in rows(fedavg))
    assert shared.summary["floats_sent"] * n_all == fedavg.summary["floats_sent"] * n_fed
    assert shared.summary["sgd_steps"] == fedavg.summary["sgd_steps"]


# --- which blocks are private ----------------------------------------------------------------------


def _task(tiny_config, spatial_dims=2, in_channels=3, regions=("disc", "cup"), **model) -> Task:
    return Task(tiny_config(model=model), spatial_dims, in_channels, regions)


@pytest.mark.parametrize("p", [1, 2, 3])
def test_fedper_keeps_the_last_blocks_and_lg_fedavg_the_first(p, tiny_config):
    task = _task(tiny_config, **FOUR_LEVELS)
    model = task.new_model()
    blocks, grouped = network_blocks(model), entries_by_block(model)
    assert len(blocks) == 7
    fedper = private_entries(task, FedPerOptions(private_layers=p, private_unit="blocks"))
    lg = private_entries(task, LGFedAvgOptions(private_layers=p, private_unit="blocks"))
    assert fedper == {n for b in blocks[-p:] for n in grouped[b]}
    assert lg == {n for b in blocks[:p] for n in grouped[b]}
    assert not fedper & lg  # 2p < 7
    # the first convolution reads the 3 input channels; the output layer (a transposed conv: (in, out, ...)) makes 2
    first = [k for k, v in float_state(model).items() if k.endswith("weight") and v.dim() == 4 and v.shape[1] == 3]
    last = [k for k, v in float_state(model).items() if k.endswith("weight") and v.dim() == 4 and v.shape[1] == 2]
    assert first and last
    assert set(first) <= lg and not set(first) & fedper
    assert set(last) <= fedper and not set(last) & lg
    # more private blocks: a superset
    if p > 1:
        assert private_entries(task, FedPerOptions(private_layers=p - 1, private_unit="blocks")) < fedper


BLOCK_CASES = [
    ("unet", 2, {"channels": [4, 8, 16]}, 5),
    ("unet", 2, {"channels": [4, 8, 16, 32], "num_res_units": 1, "norm": "batch"}, 7),
    ("unet", 3, {"channels": [4, 8]}, 3),
    ("unet", 3, {"channels": [4, 8, 16], "num_res_units": 2}, 5),
    ("dynunet", 2, {"channels": [4, 8, 16, 32], "norm": "batch"}, 8),
    ("dynunet", 3, {"channels": [4, 8, 16]}, 6),
]


@pytest.mark.parametrize("name, dims, model, n_blocks", BLOCK_CASES)
def test_blocks_partition_the_state_in_forward_order(name, dims, model, n_blocks, tiny_config):
    in_channels, regions = 2, ("a", "b", "c")
    task = _task(tiny_config, dims, in_channels, regions, name=name, **model)
    net = task.new_model()
    blocks = network_blocks(net)
    assert len(blocks) == n_blocks == len(set(blocks))
    # every float entry (buffers too) belongs to exactly one block, and every block holds some
    state = float_state(net)
    for entry in state:
        owners = [b for b in blocks if entry.startswith(b + ".")]
        assert len(owners) == 1, (entry, owners)
    grouped = entries_by_block(net)
    assert list(grouped) == blocks and all(grouped.values())
    assert sorted(n for names in grouped.values() for n in names) == sorted(state)
    # forward order: the blocks are entered in the listed order, the first reads the input channels,
    # the last produces one channel per region
    entered, shapes = [], {}

    def record_out(module, args, out, block):
        shapes[block] = out.shape[1]  # returns None: the output is left as it is

    hooks = []
    for b in blocks:
        module = net.get_submodule(b)
        hooks.append(module.register_forward_pre_hook(lambda m, args, b=b: entered.append((b, args[0].shape[1]))))
        hooks.append(module.register_forward_hook(lambda m, args, out, b=b: record_out(m, args, out, b)))
    net.eval()
    with torch.no_grad():
        net(torch.zeros(1, in_channels, *([16] * dims)))
    for h in hooks:
        h.remove()
    order = list(dict.fromkeys(b for b, _ in entered))
    assert order == blocks
    assert entered[0] == (blocks[0], in_channels)
    assert shapes[blocks[-1]] == len(regions)


@pytest.mark.parametrize("options", [FedPerOptions, LGFedAvgOptions])
def test_as_many_private_blocks_as_the_network_has_is_a_clear_error(options, tiny_config):
    task = _task(tiny_config, channels=[4, 8, 16])  # 5 blocks
    assert private_entries(task, options(private_layers=4, private_unit="blocks"))
    for p in (5, 6):
        with pytest.raises(ValueError, match=rf"private_layers={p} leaves no federated block: the unet has 5 blocks"):
            private_entries(task, options(private_layers=p, private_unit="blocks"))
    default = Task(tiny_config(model=ModelConfig().model_dump()), 2, 3, ("x",))  # 9 blocks
    assert private_entries(default, options(private_unit="blocks"))  # private_layers = 4 fits the default network
    assert private_entries(default, options())  # so do 4 layers


@pytest.mark.parametrize("options", [FedPerOptions, LGFedAvgOptions])
def test_as_many_private_layers_as_the_network_has_is_a_clear_error(options, tiny_config):
    task = _task(tiny_config, channels=[4, 8, 16])
    n = len(parameterized_layers(task.new_model()))
    assert n > 5 and private_entries(task, options(private_layers=n - 1))
    for p in (n, n + 1):
        with pytest.raises(ValueError, match=rf"private_layers={p} leaves no federated layer: the unet has {n} layers"):
            private_entries(task, options(private_layers=p))


@pytest.mark.parametrize("name", SHARING)
def test_too_many_private_blocks_fails_before_any_round(name, tmp_path, tiny_config, disc_federation):
    cfg = tiny_config(algorithms=[name], methods={name: {"private_layers": 5, "private_unit": "blocks"}})  # 5 blocks
    seen = []
    with pytest.raises(ValueError, match=r"private_layers=5 leaves no federated block"):
        run_algorithm(
            name, prepare(cfg, disc_federation()), tmp_path, resume=False, observers=[lambda *x: seen.append(x)]
        )
    assert not seen


def test_too_many_private_blocks_fails_before_any_work_in_a_run(tmp_path, tiny_config, disc_federation):
    cfg = tiny_config(
        algorithms=["fedavg", "fedper"], methods={"fedper": {"private_layers": 5, "private_unit": "blocks"}}
    )
    seen = []
    with pytest.raises(ValueError, match=r"private_layers=5 leaves no federated block"):
        run_experiment(cfg, tmp_path / "run", federation=disc_federation(), observers=[lambda *x: seen.append(x[1])])
    assert not seen, f"{len(seen)} exchanges (fedavg trained) before the error"


# --- parameterized layers (FeTS's reading) and the private share -----------------------------------


def _fets_task() -> Task:
    """The ``fets`` preset's network (DynUNet 32 -> 512, 3D, the 4 FeTS modalities, 3 regions), built only."""
    cfg = load_config("fets", overrides=["device=cpu"])
    return Task(cfg, 3, 4, ("WT", "TC", "ET"))


def _conv_params(shape: tuple[int, ...], bias: bool = False) -> int:
    """Floats of a conv weight of ``shape`` (out, in, k, k, k), plus ``out`` biases."""
    n = 1
    for d in shape:
        n *= d
    return n + (shape[0] if bias else 0)


def test_four_private_layers_of_the_fets_dynunet_are_under_one_percent_and_blocks_keep_the_old_share():
    task = _fets_task()
    model = task.new_model()
    total = sum(p.numel() for p in model.parameters())
    assert total == 22_574_563
    layers = parameterized_layers(model)
    # by hand from the module list: instance norm without weights owns nothing, so the layers are the convolutions
    # (2 per encoder level and the bottleneck, transposed + 2 per decoder level, the 1x1 output)
    assert len(layers) == 2 * 5 + 3 * 4 + 1 == 23
    assert all(type(model.get_submodule(name)).__name__.startswith(("Conv", "ConvTranspose")) for name in layers)
    assert layers[:4] == [
        "input_block.conv1.conv",
        "input_block.conv2.conv",
        "downsamples.0.conv1.conv",
        "downsamples.0.conv2.conv",
    ]
    assert layers[-4:] == [
        "upsamples.3.transp_conv.conv",
        "upsamples.3.conv_block.conv1.conv",
        "upsamples.3.conv_block.conv2.conv",
        "output_block.conv.conv",
    ]
    first4 = _conv_params((32, 4, 3, 3, 3)) + _conv_params((32, 32, 3, 3, 3))
    first4 += _conv_params((64, 32, 3, 3, 3)) + _conv_params((64, 64, 3, 3, 3))
    last4 = _conv_params((64, 32, 2, 2, 2)) + _conv_params((32, 64, 3, 3, 3)) + _conv_params((32, 32, 3, 3, 3))
    last4 += _conv_params((3, 32, 1, 1, 1), bias=True)  # only the output convolution has a bias
    fedper, lg = private_fraction(task, FedPerOptions()), private_fraction(task, LGFedAvgOptions())
    assert (fedper["private_unit"], fedper["private_layers"]) == ("layers", 4)  # the defaults: FeTS 2022's setting
    assert fedper["private_parameters"] == last4 == 99_427
    assert lg["private_parameters"] == first4 == 196_992
    assert fedper["parameters"] == lg["parameters"] == total
    assert fedper["private_fraction"] == pytest.approx(last4 / total) and fedper["private_fraction"] < 0.01
    assert lg["private_fraction"] == pytest.approx(first4 / total) and lg["private_fraction"] < 0.01
    assert private_entries(task, FedPerOptions()) == {f"{name}.{p}" for name in layers[-4:] for p in ("weight",)} | {
        "output_block.conv.conv.bias"
    }
    # private_unit: blocks gives fedseg's old split: 4 network blocks, 9.2% / 15.6% of the parameters
    old_fedper = private_fraction(task, FedPerOptions(private_unit="blocks"))
    old_lg = private_fraction(task, LGFedAvgOptions(private_unit="blocks"))
    grouped = entries_by_block(model)
    blocks, params = list(grouped), dict(model.named_parameters())
    assert old_fedper["private_parameters"] == sum(params[n].numel() for b in blocks[-4:] for n in grouped[b])
    assert old_lg["private_parameters"] == sum(params[n].numel() for b in blocks[:4] for n in grouped[b])
    assert round(old_fedper["private_fraction"], 3) == 0.092 and round(old_lg["private_fraction"], 3) == 0.156


def test_a_layer_is_a_module_owning_parameters_with_its_own_buffers(tiny_config):
    """With BatchNorm a norm is a layer: its weights and running statistics are private together; a private
    convolution does not take its sibling norm along."""
    task = _task(tiny_config, name="dynunet", channels=[4, 8, 16], norm="batch")
    model = task.new_model()
    layers = parameterized_layers(model)
    owning = [n for n, m in model.named_modules() if any(True for _ in m.parameters(recurse=False))]
    # 2 convs + 2 norms per encoder level (input, 1 down, the bottleneck), a transposed conv + 2 convs + 2 norms
    # per decoder level, the 1x1 output
    assert layers == owning and len(layers) == 3 * 4 + 2 * 5 + 1
    lg = private_entries(task, LGFedAvgOptions(private_layers=3))  # registration order: conv1, conv2, norm1
    norm = layers[2]
    assert isinstance(model.get_submodule(norm), torch.nn.BatchNorm2d)
    assert lg == {
        f"{layers[0]}.weight",
        f"{layers[1]}.weight",
        f"{norm}.weight",
        f"{norm}.bias",
        f"{norm}.running_mean",
        f"{norm}.running_var",
    }
    fedper = private_entries(task, FedPerOptions(private_layers=1))
    assert fedper == {f"{layers[-1]}.weight", f"{layers[-1]}.bias"}
    assert private_entries(task, FedPerOptions(private_layers=2)) > fedper


def test_the_default_private_unit_is_the_one_a_config_records():
    """A RunConfig writes FedPer / LG-FedAvg's private_unit out at SharingOptions' default (so config.yaml says
    which split a run had), and only for the sharing methods it names."""
    default = SharingOptions.model_fields["private_unit"].default
    assert default == "layers"
    assert all(d["private_unit"] == ("blocks", default) for d in CHANGED_METHOD_DEFAULTS.values())
    cfg = load_config("demo", overrides=["algorithms=[fedavg,fedper]", "methods.lg-fedavg.private_layers=2"])
    assert cfg.methods["fedper"] == {"private_unit": "layers"}
    assert cfg.methods["lg-fedavg"] == {"private_unit": "layers", "private_layers": 2}
    assert "fedavg" not in cfg.methods
    blocks = load_config("demo", overrides=["algorithms=[fedper]", "methods.fedper.private_unit=blocks"])
    assert blocks.methods["fedper"] == {"private_unit": "blocks"}


@pytest.mark.parametrize("name", SHARING)
def test_a_run_records_its_private_fraction(name, tmp_path, tiny_config, disc_federation):
    cfg = _cfg(tiny_config, name, rounds=1)
    out = tmp_path / "run"
    lines: list[str] = []
    run_experiment(cfg, out, federation=disc_federation(), on_log_line=lines.append)
    entry = json.loads((out / "summary.json").read_text())["algorithms"][name]
    prep = prepare(cfg, disc_federation())
    expected = private_fraction(prep.task, get_algorithm(name).parse_options(cfg.methods[name]))
    assert (
        entry["private_fraction"] == pytest.approx(expected["private_fraction"]) and 0 < entry["private_fraction"] < 1
    )
    assert entry["private_sharing"] == {**expected, "private_fraction": entry["private_fraction"]}
    assert entry["private_sharing"]["private_unit"] == "layers"
    end = "last" if name == "fedper" else "first"
    note = [line for line in lines if line.startswith(f"{name}: the {end} {P} layers")]
    assert len(note) == 1 and f"{expected['private_fraction']:.2%}" in note[0]
    assert note[0] in (out / "run.log").read_text().splitlines()
    recorded = yaml.safe_load((out / "config.yaml").read_text())
    assert recorded["methods"][name] == {"private_unit": "layers", "private_layers": P}


@pytest.mark.parametrize("name", SHARING)
def test_resuming_a_run_recorded_before_private_unit_is_refused_unless_blocks_is_set(name, tmp_path, tiny_config):
    """A config.yaml written before the option (no private_unit) ran with blocks: resuming it under the new
    default would mix two splits, so it compares as ``blocks`` and is refused; setting blocks resumes it."""
    cfg = tiny_config(algorithms=["fedavg", name], methods={name: {"private_layers": 2}})
    old = cfg.model_dump(mode="json")
    old["methods"][name].pop("private_unit")  # as an older fedseg wrote it
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(old))
    recorded = recorded_config(path)
    assert recorded is not None and recorded["methods"][name]["private_unit"] == "blocks"
    assert resume_conflicts(recorded, cfg.model_dump(mode="json")) == [f"methods.{name}.private_unit: blocks -> layers"]
    with pytest.raises(ValueError, match=rf"methods\.{name}\.private_unit: blocks -> layers"):
        check_resume(recorded, cfg.model_dump(mode="json"), str(path))
    pinned = tiny_config(algorithms=["fedavg", name], methods={name: {"private_layers": 2, "private_unit": "blocks"}})
    assert resume_conflicts(recorded, pinned.model_dump(mode="json")) == []
    # a method named only in algorithms (its options all default) was recorded with blocks too
    bare = tiny_config(algorithms=[name]).model_dump(mode="json")
    bare["methods"] = {}
    path.write_text(yaml.safe_dump(bare))
    assert resume_conflicts(recorded_config(path), tiny_config(algorithms=[name]).model_dump(mode="json")) == [
        f"methods.{name}.private_unit: blocks -> layers"
    ]
    # a config.yaml this fedseg wrote compares as it is
    path.write_text(dump_config(cfg))
    assert resume_conflicts(recorded_config(path), cfg.model_dump(mode="json")) == []
