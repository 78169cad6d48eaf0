"""Client sampling (fl.clients_per_round): deterministic per (seed, round), recorded in the ledger and summary,
unsampled sites' stores untouched, methods that need every site refused before any work, SCAFFOLD's
partial-participation update."""

from __future__ import annotations

import pytest
import torch

from fedseg.algorithms import get_algorithm
from fedseg.algorithms.scaffold import CONTROL
from fedseg.config_load import ConfigError, load_config
from fedseg.engine.messages import Message, prefixed
from fedseg.engine.sampling import sample_count, sample_sites
from fedseg.engine.simulator import Simulator
from fedseg.run import prepare, run_experiment, simulator_engine

SITES = [f"site{i}" for i in range(1, 11)]


def test_the_sample_is_a_function_of_seed_and_round_only():
    draws = {(seed, rnd): sample_sites(SITES, 0.3, seed, rnd) for seed in (0, 1) for rnd in range(1, 6)}
    assert draws == {(seed, rnd): sample_sites(list(SITES), 0.3, seed, rnd) for seed, rnd in draws}
    assert all(len(d) == 3 and d == [s for s in SITES if s in d] for d in draws.values())  # federation order
    assert len({tuple(d) for d in draws.values()}) > 5  # rounds and seeds draw differently
    assert sample_sites(SITES, 4, 0, 1) != sample_sites(SITES, 4, 0, 2) and len(sample_sites(SITES, 4, 0, 1)) == 4
    assert sample_sites(SITES, None, 0, 1) == SITES == sample_sites(SITES, 1.0, 0, 1) == sample_sites(SITES, 10, 0, 1)
    assert sample_count(10, 0.01) == 1  # at least one site
    with pytest.raises(ValueError, match="clients_per_round = 11 sites, but the federation has only 10"):
        sample_count(10, 11)


@pytest.mark.parametrize("value, message", [(0.0, "fraction must lie in"), (1.5, "fraction must lie in"), (0, ">= 1")])
def test_bad_values_are_refused_naming_the_key(value, message):
    with pytest.raises(ConfigError, match=rf"fl.clients_per_round.*{message}"):
        load_config("demo", overrides=[f"fl.clients_per_round={value}"])


def test_sampled_sites_train_others_keep_their_store_untouched(tmp_path, tiny_config, disc_federation):
    cfg = tiny_config(algorithms=["local", "fedavg"], fl={"rounds": 4, "clients_per_round": 2}, seed=3)
    engines, stores = {}, {}

    def factory(name, *args):
        engines[name] = simulator_engine(name, *args)
        return engines[name]

    def keep(name, rnd, losses):
        if name == "fedavg":
            stores[rnd] = engines[name].snapshot_clients()

    results = run_experiment(cfg, tmp_path, federation=disc_federation(), engine_factory=factory, on_round_end=keep)
    local, fedavg = results.algorithms
    sites = ["site1", "site2", "site3"]
    expect = {rnd: sample_sites(sites, 2, 3, rnd) for rnd in range(1, 5)}
    trained = {
        rnd: [r["site"] for r in fedavg.ledger if r["round"] == rnd and r["action"] == "train"] for rnd in expect
    }
    assert trained == expect  # the ledger records exactly the sampled sites
    assert fedavg.summary["sampled_sites"] == {str(r): s for r, s in expect.items()}
    assert "sampled_sites" not in local.summary  # the baselines do not sample
    assert {r["site"] for r in local.ledger if r["action"] == "train" and r["round"] == 1} == set(sites)
    untouched = 0
    for rnd in range(2, 5):
        for site in sites:
            if site not in expect[rnd] and stores[rnd - 1][site]:
                before, after = stores[rnd - 1][site], stores[rnd][site]
                assert set(before) == set(after) and all(torch.equal(before[k], after[k]) for k in before)
                untouched += 1
            elif site in expect[rnd] and stores[rnd - 1][site]:
                assert any(not torch.equal(stores[rnd][site][k], v) for k, v in stores[rnd - 1][site].items())
    assert untouched  # this seed leaves a site that trained before out of a later round
    val = [r for r in fedavg.ledger if r["action"] == "evaluate" and r["round"] == 2]
    assert {r["site"] for r in val} == set(sites)  # validation uses every site


@pytest.mark.parametrize(
    "method, reason", [("fedsm", "every site's reply"), ("fedpidavg", "Eq. 18"), ("qfedavg", "its rounds are its own")]
)
def test_methods_that_cannot_sample_are_refused_before_any_work(method, reason, tmp_path, tiny_config, discs):
    cfg = tiny_config(algorithms=["fedavg", method], fl={"clients_per_round": 0.5})
    with pytest.raises(ValueError, match=rf"clients_per_round = 0.5: {method} cannot train a sample.*{reason}"):
        run_experiment(cfg, tmp_path / "run", federation=discs)
    assert not (tmp_path / "run").exists()


def test_too_many_clients_per_round_is_refused_before_any_work(tmp_path, tiny_config, discs):
    with pytest.raises(ValueError, match="clients_per_round = 5 sites, but the federation has only 3"):
        run_experiment(
            tiny_config(algorithms=["fedavg"], fl={"clients_per_round": 5}), tmp_path / "r", federation=discs
        )
    assert not (tmp_path / "r").exists()


def test_scaffold_moves_c_by_the_answering_fraction_of_the_mean_update(tiny_config, discs):
    """Karimireddy et al., partial participation: c <- c + (|S| / N) * mean_{k in S} delta_c_k."""
    cfg = tiny_config(algorithms=["scaffold"], fl={"weighting": "uniform"})
    prep = prepare(cfg, discs)
    spec = get_algorithm("scaffold")
    options = spec.parse_options(None)
    server = spec.server(Simulator("scaffold", spec.client(), prep.site_data, prep.task, options), prep.task, options)
    c0 = {k: torch.full_like(v, 0.5) for k, v in server.control.items()}
    server.control = dict(c0)
    deltas = {s: {k: torch.full_like(v, float(i + 1)) for k, v in c0.items()} for i, s in enumerate(["site1", "site3"])}
    replies = {
        s: Message({**prefixed("model", server.global_weights), **prefixed(CONTROL, d)}) for s, d in deltas.items()
    }
    server.aggregate(replies)
    for k, v in server.control.items():
        assert torch.allclose(v, c0[k] + (2 / 3) * 1.5), k  # mean of 1 and 2, times 2 of 3 sites
    server.control = dict(c0)
    server.aggregate({**replies, "site2": replies["site1"]})  # every site: FeTS Eq. 8, unscaled
    for k, v in server.control.items():
        assert torch.allclose(v, c0[k] + (1 + 2 + 1) / 3), k


def test_ditto_samples_a_site_without_a_personal_model_validates_the_global_one(tmp_path, tiny_config, disc_federation):
    """Under client sampling a site not sampled in round 1 had no personal model to validate: Ditto failed with
    "weights are missing" in every engine (a determinism audit). It now validates the global model, the one its
    personal model would start from, until it is sampled."""
    cfg = tiny_config(algorithms=["ditto"], fl={"rounds": 3, "clients_per_round": 1}, seed=0)
    results = run_experiment(cfg, tmp_path, federation=disc_federation())
    (ditto,) = results.algorithms
    first = ditto.summary["sampled_sites"]["1"]
    assert len(first) == 1 and ditto.summary["failures"] == []
    assert {r["site"] for r in ditto.ledger if r["round"] == 1 and r["action"] == "evaluate"} == {
        "site1",
        "site2",
        "site3",
    }
