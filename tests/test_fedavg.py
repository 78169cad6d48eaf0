"""FedAvg base pair: merge rule, traffic accounting, equivalence with local training."""

from __future__ import annotations

import torch

from fedseg.algorithms.aggregate import weighted_average
from fedseg.algorithms.fedavg import FedAvgServer
from fedseg.engine.messages import Message, prefixed
from fedseg.models import count_parameters
from fedseg.run import prepare, run_algorithm


def _updates(n_sites: int = 3):
    g = torch.Generator().manual_seed(1)
    return [{"a": torch.randn(4, 3, generator=g), "b": torch.randn(5, generator=g)} for _ in range(n_sites)]


def test_weighted_average_is_the_weighted_mean():
    updates, weights = _updates(), [10.0, 30.0, 60.0]
    merged = weighted_average(updates, weights)
    for name in ("a", "b"):
        expected = sum(w / 100.0 * u[name] for u, w in zip(updates, weights))
        torch.testing.assert_close(merged[name], expected, rtol=0, atol=1e-6)


class _FakeTask:
    def __init__(self, cfg):
        self.cfg = cfg


def test_server_merge_uses_samples_or_uniform_weights(tiny_config):
    updates = _updates()
    replies = {
        f"s{i}": Message(prefixed("model", u), {"num_examples": n})
        for i, (u, n) in enumerate(zip(updates, [5, 15, 80]))
    }
    for weighting, weights in (("samples", [5, 15, 80]), ("uniform", [1, 1, 1])):
        server = FedAvgServer.__new__(FedAvgServer)
        server.task = _FakeTask(tiny_config(fl={"weighting": weighting}))
        server.aggregate(replies)
        total = sum(weights)
        expected = sum(w / total * u["a"] for u, w in zip(updates, weights))
        torch.testing.assert_close(server.global_weights["a"], expected, rtol=0, atol=1e-6)


def test_ledger_counts_two_models_per_site_per_round(tmp_path, tiny_config, disc_federation):
    cfg = tiny_config(fl={"rounds": 2})
    prep = prepare(cfg, disc_federation(n_sites=3, cases_per_site=8))
    result = run_algorithm("fedavg", prep, tmp_path, resume=False)
    params = count_parameters(prep.task.new_model())
    train = [r for r in result.ledger if r["action"] == "train"]
    for rnd in (1, 2):
        rows = [r for r in train if r["round"] == rnd]
        assert len(rows) == 3
        assert sum(r["floats_down"] + r["floats_up"] for r in rows) == 2 * params * 3
    assert result.summary["floats_sent"] == 2 * 2 * params * 3


def test_fedavg_with_one_site_equals_local_training(tmp_path, tiny_config, disc_federation):
    cfg = tiny_config(fl={"rounds": 3}, algorithms=["fedavg", "local"])
    prep = prepare(cfg, disc_federation(n_sites=1, cases_per_site=16))
    fedavg = run_algorithm("fedavg", prep, tmp_path / "a", resume=False)
    local = run_algorithm("local", prep, tmp_path / "b", resume=False)
    g, loc = fedavg.bundle["global"], local.bundle["local:site1"]
    assert g.keys() == loc.keys()
    for k in g:
        assert torch.equal(g[k], loc[k]), k
    assert fedavg.summary["dice"] == local.summary["dice"]
    assert [r["val_dice"] for r in fedavg.rounds_rows] == [r["val_dice"] for r in local.rounds_rows]
