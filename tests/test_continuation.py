"""``fedavg-continue``, the control of the methods that start from a trained global model: FedAvg resumed
from the same model for the same rounds with prior-CFL's per-site selection. With one cluster of every site
prior-CFL must be exactly it, so any gain of prior-CFL over it is the clusters' and not the extra rounds'."""

from __future__ import annotations

import pytest
import torch

from fedseg.algorithms import get_algorithm
from fedseg.algorithms.prefixes import MODEL
from fedseg.run import run_experiment

CHAIN = ["fedavg", "prior-cfl", "fedavg-continue"]


def _same(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def _scores(result) -> list[dict]:
    """The test rows without the algorithm's name, one per (model, site, case, region, metric); values as their
    ``repr`` (exact for floats, and NaN, e.g. an HD95 of an empty prediction, equals itself)."""
    return [{k: repr(v) for k, v in row.items() if k != "algorithm"} for row in result.test_rows]


def _federation(disc_federation):
    fed = disc_federation(n_sites=3, cases_per_site=8)
    for site in fed.sites:
        site.meta = {"scanner": "X"}  # one value: prior-cfl's one cluster is every site
    return fed


def _config(tiny_config, algorithms, **overrides):
    return tiny_config(
        algorithms=algorithms,
        fl={"rounds": 2},
        eval={"hd95": False},
        methods={"prior-cfl": {"cluster_by": "scanner", "rounds": 1}, "fedavg-continue": {"rounds": 1}},
        **overrides,
    )


@pytest.fixture(scope="module")
def chain(tmp_path_factory, tiny_config, disc_federation):
    """fedavg (2 rounds), then prior-cfl clustering by a key every site shares, then fedavg-continue (1 round
    each from fedavg's selected model); every message each method sent, in order."""
    fed = _federation(disc_federation)
    cfg = _config(tiny_config, CHAIN)
    sent: dict[str, list] = {name: [] for name in CHAIN}
    current: list[str] = []
    results = run_experiment(
        cfg,
        tmp_path_factory.mktemp("continue") / "run",
        federation=fed,
        on_algorithm_start=current.append,
        observers=[lambda site, action, msg, reply: sent[current[-1]].append((action, site, msg))],
    )
    return {r.name: r for r in results.algorithms}, sent


def test_prior_cfl_with_one_cluster_is_fedavg_continued_exactly(chain):
    results, _ = chain
    prior, cont = results["prior-cfl"], results["fedavg-continue"]
    assert len(_scores(cont)) > 0 and _scores(prior) == _scores(cont)  # every Dice, NSD... per case: bit-identical
    assert prior.summary["selected_rounds"] == cont.summary["selected_rounds"]
    assert prior.bundle.keys() == cont.bundle.keys()
    assert all(_same(prior.bundle[k], cont.bundle[k]) for k in prior.bundle)
    assert _scores(cont) != _scores(results["fedavg"])  # the extra round did change the models


def test_fedavg_continue_starts_from_fedavgs_selected_model(chain):
    results, sent = chain
    train = [(site, msg) for action, site, msg in sent["fedavg-continue"] if action == "train"]
    assert [site for site, _ in train] == ["site1", "site2", "site3"]  # 1 round, every site
    start = results["fedavg"].bundle["global"]
    assert all(_same(msg.group(MODEL), start) for _, msg in train)
    assert not any(action == "metadata" for action, *_ in sent["fedavg-continue"])  # no clustering prior asked
    assert results["fedavg-continue"].summary["cost"]["includes"] == ["fedavg", "this method"]  # FeTS Table 2


def test_fedavg_continue_on_the_worker_pool_gives_the_simulators_rows(chain, tmp_path, tiny_config, disc_federation):
    """Two worker processes (engine.workers = 2, site states on disk): the same start and the same rows."""
    results, _ = chain
    cfg = _config(tiny_config, ["fedavg", "fedavg-continue"], engine={"workers": 2, "state": "disk"})
    pool = run_experiment(cfg, tmp_path / "run", federation=_federation(disc_federation))
    assert pool.algorithms[1].name == "fedavg-continue"
    assert _scores(pool.algorithms[1]) == _scores(results["fedavg-continue"])


def test_fedavg_continue_options_are_prior_cfls_without_the_clusters():
    spec = get_algorithm("fedavg-continue")
    options = spec.parse_options({})
    assert (options.start_from, options.rounds, options.run_rounds(7)) == ("fedavg", None, 7)
    assert spec.parse_options({"rounds": 10}).run_rounds(30) == 10
    assert spec.kind == get_algorithm("prior-cfl").kind == "clustered"
    with pytest.raises(ValueError, match=r"methods\.fedavg-continue\.cluster_by"):
        spec.parse_options({"cluster_by": "grade"})
    with pytest.raises(ValueError, match=r"'krum' is not available: fedavg-continue averages"):
        spec.parse_options({"aggregator": "krum"})
