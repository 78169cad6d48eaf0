"""The site-state store (fedseg.engine.state): exact round trips through safetensors, one file per site holding
only that site's entries, and runs with ``engine.state: disk`` (or a memory budget) equal to in-memory runs."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors import safe_open

from fedseg.engine.state import StateStore, site_file_name
from fedseg.run import run_experiment, simulator_engine


def _state(seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    base = torch.randn(4, 6, generator=g)
    return {
        "model/w": torch.randn(3, 3, generator=g),
        "opt/0/exp_avg": base.t(),  # not contiguous
        "opt/0/step": torch.tensor(7.0),
        "view": base[1],  # shares memory with the entry above
        "localbest_score": torch.tensor(0.123456789, dtype=torch.float64),
        "localbest_round": torch.tensor(3, dtype=torch.int64),
        "mask": torch.tensor([True, False]),
        "empty": torch.zeros(0, 5),
    }


def _equal(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return set(a) == set(b) and all(a[k].dtype == b[k].dtype and torch.equal(a[k], b[k]) for k in a)


def test_disk_store_round_trips_every_dtype_bit_for_bit_one_file_per_site(tmp_path):
    store = StateStore(["site 1", "site2"], tmp_path / "states", budget_bytes=0)
    one, two = _state(1), _state(2)
    store.save("site 1", dict(one))
    store.save("site2", dict(two))
    assert {p.name for p in (tmp_path / "states").iterdir()} == {site_file_name("site 1"), "site2.safetensors"}
    assert site_file_name("site 1") != site_file_name("site_1")
    assert store.memory == {}  # nothing of theirs in RAM
    assert _equal(store.load("site 1"), one) and _equal(store.load("site2"), two)
    with safe_open(str(tmp_path / "states" / "site2.safetensors"), "pt") as f:  # only site2's own entries
        assert sorted(f.keys()) == sorted(two) and f.metadata() is None
    snap = store.snapshot()
    store.restore({"site2": one})
    assert store.load("site 1") == {} and _equal(store.load("site2"), one)  # a site missing from it: empty
    store.restore(snap)
    assert _equal(store.load("site 1"), one)
    assert not list((tmp_path / "states").glob(".*"))  # no temp file left by the atomic writes
    store.close()
    assert not (tmp_path / "states").exists()


def test_a_memory_budget_keeps_what_fits_in_ram_and_spills_the_rest(tmp_path):
    small, large = {"a": torch.ones(10)}, {"b": torch.ones(1000)}
    store = StateStore(["s1", "s2"], tmp_path, budget_bytes=100)
    store.save("s1", small)
    store.save("s2", large)
    assert set(store.memory) == {"s1"} and store.on_disk == {"s2"}
    assert store.memory["s1"] is small  # in RAM: kept as given, no copy
    store.save("s2", {"b": torch.ones(2)})  # fits now: back in RAM, its file removed
    assert store.on_disk == set() and not (tmp_path / "s2.safetensors").exists()


@pytest.fixture(scope="module")
def in_memory(tmp_path_factory, tiny_config, disc_federation):
    """scaffold (control variates, optimizer moments and kept local models in the stores), 2 rounds, in RAM;
    every site's store at the end of each round."""
    out = tmp_path_factory.mktemp("stores") / "memory"
    stores = _run(tiny_config(algorithms=["scaffold"]), out, disc_federation())
    return out, stores


def _run(cfg, out, federation) -> dict[int, dict]:
    """Run ``cfg``; return ``{round: {site: store}}`` read at each round's end (from the files on disk, if any)."""
    engines, stores, spilled = [], {}, []

    def factory(*args):
        engines.append(simulator_engine(*args))
        return engines[-1]

    def read(name, rnd, losses):
        store = engines[-1].store
        stores[rnd] = {s: {k: v.clone() for k, v in store.load(s).items()} for s in store.sites}
        spilled.append(len(store.on_disk))
        for site in store.on_disk:  # the files hold exactly that: nothing else
            with safe_open(str(store.path(site)), "pt") as f:
                assert _equal({k: f.get_tensor(k) for k in f.keys()}, stores[rnd][site])

    run_experiment(cfg, out, federation=federation, engine_factory=factory, on_round_end=read)
    stores["spilled"] = spilled  # stores on disk at each round's end
    return stores


@pytest.mark.parametrize("engine, spilled", [({"state": "disk"}, [3, 3]), ({"memory_budget_mb": 0.05}, [2, 2])])
def test_a_run_with_stores_on_disk_equals_the_in_memory_run(
    engine, spilled, in_memory, tmp_path, tiny_config, disc_federation
):
    """Every store, every round, equal to the in-memory run's (keys and bits); so are the results."""
    out = tmp_path / "disk"
    stores = _run(tiny_config(algorithms=["scaffold"], engine=engine), out, disc_federation())
    assert stores["spilled"] == spilled  # disk: every site's store; a 50 kB budget: all but one
    memory_out, memory_stores = in_memory
    assert memory_stores["spilled"] == [0, 0]
    for rnd in (1, 2):
        for site, state in memory_stores[rnd].items():
            assert state and _equal(stores[rnd][site], state), (rnd, site)  # same keys, same bits
    summary = json.loads((out / "summary.json").read_text())["algorithms"]["scaffold"]
    expect = json.loads((memory_out / "summary.json").read_text())["algorithms"]["scaffold"]
    assert {k: v for k, v in summary.items() if k != "seconds"} == {k: v for k, v in expect.items() if k != "seconds"}
    weights = "model/scaffold/weights.safetensors"
    assert (out / weights).read_bytes() == (memory_out / weights).read_bytes()
    assert not (out / "states").exists()  # removed once the algorithm finished


def test_checkpoints_name_disk_stores_and_a_resumed_disk_run_equals_the_uninterrupted_one(
    in_memory, tmp_path, tiny_config, disc_federation
):
    """engine.state: disk: a checkpoint holds a token per site (no tensor of the stores), the store files are
    linked into OUT/states/<algorithm>/snapshots/<n>/ and only the snapshots a checkpoint on disk names are
    kept; interrupted after round 1 and resumed, the run equals the uninterrupted in-memory one."""

    class Stop(Exception):
        pass

    def stop(name, rnd, losses):
        raise Stop

    cfg = tiny_config(algorithms=["scaffold"], engine={"state": "disk"}, fl={"rounds": 3})
    fed, out = disc_federation(), tmp_path / "disk"
    with pytest.raises(Stop):
        run_experiment(cfg, out, on_round_end=stop, federation=fed)
    ckpt = torch.load(out / "checkpoints" / "scaffold.pt", weights_only=True)
    assert {s: sorted(st) for s, st in ckpt["clients"].items()} == {s: ["disk_snapshot"] for s in fed.site_names}
    snapshots = out / "states" / "scaffold" / "snapshots"
    files = sorted(p.relative_to(snapshots).as_posix() for p in snapshots.rglob("*.safetensors"))
    assert files == [f"1/{site_file_name(s)}" for s in fed.site_names]  # round 1's, one file per site
    with safe_open(str(snapshots / "1" / site_file_name("site2")), "pt") as f:
        assert all(not k.startswith(("site1", "site3")) for k in f.keys())  # nothing of the other sites
    run_experiment(cfg, out, resume=True, federation=fed)
    uninterrupted = tmp_path / "memory3"
    run_experiment(tiny_config(algorithms=["scaffold"], fl={"rounds": 3}), uninterrupted, federation=fed)
    summary = json.loads((out / "summary.json").read_text())["algorithms"]["scaffold"]
    expect = json.loads((uninterrupted / "summary.json").read_text())["algorithms"]["scaffold"]
    assert {k: v for k, v in summary.items() if k != "seconds"} == {k: v for k, v in expect.items() if k != "seconds"}
    weights = "model/scaffold/weights.safetensors"
    assert (out / weights).read_bytes() == (uninterrupted / weights).read_bytes()
    assert not (out / "states").exists()  # snapshots removed once the algorithm finished
