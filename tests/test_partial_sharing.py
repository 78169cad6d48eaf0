"""Partial model sharing (FedPer, LG-FedAvg): what travels, what stays on the site, how the shared
part is merged, the traffic it costs, and the network blocks the split is made of."""

from __future__ import annotations

from itertools import combinations

import pytest
import torch

from fedseg.algorithms import get_algorithm
from fedseg.algorithms.aggregate import weighted_average
from fedseg.algorithms.fedavg import MODEL, state_group
from fedseg.algorithms.partial import PRIVATE, FedPerOptions, LGFedAvgOptions, private_entries
from fedseg.config import ModelConfig
from fedseg.data.federation import Federation, Site
from fedseg.engine.context import Task
from fedseg.engine.messages import Message, float_state, prefixed, weights_of
from fedseg.engine.simulator import Simulator
from fedseg.models.blocks import entries_by_block, network_blocks
from fedseg.run import prepare, run_algorithm, run_experiment

SHARING = ("fedper", "lg-fedavg")
FOUR_LEVELS = {"channels": [4, 8, 16, 32]}  # 7 blocks: 3 down, the bottom, 3 up
P = 2  # private blocks in the runs below (nested module paths on both ends)


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


def _simulator(name, cfg, fed: Federation, observers=None):
    prep = prepare(cfg, fed)
    spec = get_algorithm(name)
    options = spec.parse_options(cfg.methods.get(name))
    engine = Simulator(name, spec.client(), prep.site_data, prep.task, options, observers=observers)
    return engine, spec.server(engine, prep.task, options), options


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
    engine, server, options = _simulator(name, cfg, fed, [lambda s, a, m, r: seen.append((engine.round, s, a, m, r))])
    plain, _, _ = _simulator("fedavg", cfg, fed)
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
    engine, server, options = _simulator(
        name, cfg, uneven, [lambda s, a, m, r: seen.append((engine.round, s, a, m, r))]
    )
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
    fedper = private_entries(task, FedPerOptions(private_layers=p))
    lg = private_entries(task, LGFedAvgOptions(private_layers=p))
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
        assert private_entries(task, FedPerOptions(private_layers=p - 1)) < fedper


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
    assert private_entries(task, options(private_layers=4))
    for p in (5, 6):
        with pytest.raises(ValueError, match=rf"private_layers={p} leaves no federated block: the unet has 5 blocks"):
            private_entries(task, options(private_layers=p))
    default = Task(tiny_config(model=ModelConfig().model_dump()), 2, 3, ("x",))  # 9 blocks
    assert private_entries(default, options())  # the default private_layers = 4 fits the default network


@pytest.mark.parametrize("name", SHARING)
def test_too_many_private_blocks_fails_before_any_round(name, tmp_path, tiny_config, disc_federation):
    cfg = tiny_config(algorithms=[name], methods={name: {"private_layers": 5}})  # the tiny UNet has 5 blocks
    seen = []
    with pytest.raises(ValueError, match=r"private_layers=5 leaves no federated block"):
        run_algorithm(
            name, prepare(cfg, disc_federation()), tmp_path, resume=False, observers=[lambda *x: seen.append(x)]
        )
    assert not seen


def test_too_many_private_blocks_fails_before_any_work_in_a_run(tmp_path, tiny_config, disc_federation):
    cfg = tiny_config(algorithms=["fedavg", "fedper"], methods={"fedper": {"private_layers": 5}})  # 5 blocks
    seen = []
    with pytest.raises(ValueError, match=r"private_layers=5 leaves no federated block"):
        run_experiment(cfg, tmp_path / "run", federation=disc_federation(), observers=[lambda *x: seen.append(x[1])])
    assert not seen, f"{len(seen)} exchanges (fedavg trained) before the error"
