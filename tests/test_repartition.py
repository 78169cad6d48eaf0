"""Repartitions (FeTS 2022 Sec. 4.3) and federated k-fold folds: what each keeps, deals and caps."""

from __future__ import annotations

from collections import Counter

import pytest

from fedseg.config import RepartitionConfig, SplitConfig
from fedseg.data.federation import Case, FederationError, Site
from fedseg.data.repartition import ORIGIN, iid, limited, repartition
from fedseg.data.splits import kfold_assignment, make_splits
from fedseg.run import count_sites, prepare


def _content(case: Case) -> bytes:
    image, label = case.arrays()
    return image.tobytes() + label.tobytes()


def test_folds_partition_each_sites_cases(discs):
    for site in discs.sites:
        ids = [c.id for c in site.cases]
        tests = []
        for fold in range(4):
            splits = make_splits(discs, SplitConfig(mode="kfold", folds=4, fold=fold), seed=3)[site.name]
            assert set(splits) == set(ids)
            tests += [cid for cid, s in splits.items() if s == "test"]
            train = [cid for cid, s in splits.items() if s == "train"]
            val = [cid for cid, s in splits.items() if s == "val"]
            assert len(train) == round(0.8 * (len(ids) - splits_count(splits, "test")))
            assert val
        assert sorted(tests) == sorted(ids)  # every case is test exactly once over the folds
        sizes = Counter(kfold_assignment(ids, 4, 3, site.name).values())
        assert max(sizes.values()) - min(sizes.values()) <= 1


def splits_count(splits: dict, name: str) -> int:
    return sum(1 for s in splits.values() if s == name)


@pytest.mark.parametrize("mode", ["ratio", "kfold"])
def test_iid_preserves_the_pooled_cases_and_their_splits_and_balances_the_sites(discs, mode):
    split = SplitConfig(mode=mode, folds=3, fold=1)
    original = make_splits(discs, split, seed=5)
    fed = iid(discs, 4, split, seed=5)
    assert fed.site_names == ["iid1", "iid2", "iid3", "iid4"]
    before = Counter(
        (site.name, c.id, original[site.name][c.id], _content(c)) for site in discs.sites for c in site.cases
    )
    dealt = make_splits(fed, split, seed=5)  # the fixed splits: each case keeps its own site's split
    after = Counter(
        (c.meta[ORIGIN], c.id.split("--", 1)[1], dealt[site.name][c.id], _content(c))
        for site in fed.sites
        for c in site.cases
    )
    assert before == after  # the pooled set, case for case, with the same split and the same pixels
    for name in ("train", "val", "test"):
        per_site = [splits_count(dealt[s], name) for s in fed.site_names]
        assert max(per_site) - min(per_site) <= 1, (name, per_site)
    mixed = [len({c.meta[ORIGIN] for c in site.cases}) for site in fed.sites]
    assert min(mixed) > 1  # dealt i.i.d.: every synthetic site holds cases of several original sites


def test_iid_is_deterministic_per_seed_and_refuses_more_sites_than_cases(discs):
    ids = lambda f: [[c.id for c in s.cases] for s in f.sites]  # noqa: E731
    split = SplitConfig()
    assert ids(iid(discs, 3, split, seed=1)) == ids(iid(discs, 3, split, seed=1))
    assert ids(iid(discs, 3, split, seed=1)) != ids(iid(discs, 3, split, seed=2))
    with pytest.raises(FederationError, match="get no case"):
        iid(discs, 100, split, seed=1)


def test_limited_caps_drops_and_requires(discs):
    graded = [
        Site(s.name, [Case.from_arrays(c.id, *c.arrays(), grade="HGG" if i % 3 else "") for i, c in enumerate(s.cases)])
        for s in discs.sites
    ]
    fed = limited(discs.__class__(**{**discs.__dict__, "sites": graded}), 5, ["site2"], "grade", seed=0)
    assert fed.site_names == ["site1", "site3"]
    for site in fed.sites:
        assert len(site.cases) == 5 and all(c.meta["grade"] == "HGG" for c in site.cases)
    again = limited(discs.__class__(**{**discs.__dict__, "sites": graded}), 5, ["site2"], "grade", seed=0)
    assert [[c.id for c in s.cases] for s in again.sites] == [[c.id for c in s.cases] for s in fed.sites]
    with pytest.raises(FederationError, match="nowhere"):
        limited(discs, None, ["nowhere"], None, seed=0)


def test_a_run_records_and_applies_its_repartition(tiny_config, discs):
    cfg = tiny_config(algorithms=["fedavg"], data={"repartition": {"mode": "iid", "sites": 2}})
    prep = prepare(cfg, discs)
    assert [s.name for s in prep.site_data] == ["iid1", "iid2"]
    assert sum(len(s.train) for s in prep.site_data) == sum(
        splits_count(v, "train") for v in make_splits(discs, cfg.data.split, cfg.seed).values()
    )
    assert repartition(discs, RepartitionConfig(), cfg.data.split, 0) is discs
    assert (
        count_sites(tiny_config(data={"source": "synthetic-retina", "repartition": {"mode": "iid", "sites": 4}})) == 4
    )
