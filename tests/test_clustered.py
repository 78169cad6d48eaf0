"""Clustered FL: Sattler's CFL (Eq. 26-30, and FeTS 2022's forced split) and prior clustering by
site metadata (prior-cfl): who ends up with whom, and that a cluster's sites share one model."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
import torch

from fedseg.algorithms import get_algorithm
from fedseg.algorithms.aggregate import weighted_average
from fedseg.algorithms.cfl import bipartition, cosine_matrix, flat_update, max_cross
from fedseg.algorithms.prefixes import MODEL
from fedseg.config import SplitConfig
from fedseg.data.federation import Case, Federation, Regions, Site
from fedseg.data.splits import site_splits
from fedseg.run import prepare, run_algorithm, run_experiment

FOUR = ["site1", "site2", "site3", "site4"]
SATTLER = {"eps1": 1e9, "eps2": 0.0, "gamma_max": 0.5}  # Eq. 26-27 always hold: Eq. 30 decides


def _binary(case: Case, invert: bool, name: str | None = None) -> Case:
    image, label = case.arrays()
    label = (label == 0) if invert else (label > 0)
    return Case.from_arrays(name or case.id, image, label.astype(np.uint8))


def inverted_federation(disc_federation, inverted=(1, 3)) -> Federation:
    """4 disc sites with one region ``fg``; at the sites ``inverted`` (indices) the background is foreground."""
    fed = disc_federation(n_sites=4)
    sites = [Site(s.name, [_binary(c, i in inverted) for c in s.cases]) for i, s in enumerate(fed.sites)]
    return Federation("halves", "2d", 3, Regions.from_mapping({"fg": [1]}), sites)


def identical_federation(disc_federation) -> Federation:
    """4 sites holding the same cases (renamed) with the same splits."""
    source = disc_federation(n_sites=1).sites[0]
    splits = site_splits(source, SplitConfig(), 0)
    sites = []
    for k, name in enumerate(FOUR):
        cases = [_binary(c, False, f"c{k}_{c.id}") for c in source.cases]
        sites.append(Site(name, cases, fixed_splits={f"c{k}_{cid}": v for cid, v in splits.items()}))
    return Federation("same", "2d", 3, Regions.from_mapping({"fg": [1]}), sites)


def clusters_by_round(result) -> dict[int, dict[str, int]]:
    """``{round: {site: cluster}}`` from the ``cluster`` rows of ``round_metrics``."""
    out: dict[int, dict[str, int]] = {}
    for row in result.metric_rows:
        if row["metric"] == "cluster":
            out.setdefault(row["round"], {})[row["site"]] = int(row["value"])
    return out


def groups(clusters: dict[str, int]) -> set[frozenset[str]]:
    by: dict[int, set[str]] = {}
    for site, c in clusters.items():
        by.setdefault(c, set()).add(site)
    return {frozenset(v) for v in by.values()}


def _cfl(tiny_config, rounds=2, **options):
    return tiny_config(algorithms=["cfl"], fl={"rounds": rounds}, eval={"hd95": False}, methods={"cfl": options})


def _same(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


# --- Eq. 29 ------------------------------------------------------------------------------------------


def brute_force(similarity: torch.Tensor) -> tuple[float, set[frozenset[int]]]:
    """min over all bipartitions of the largest cross similarity, and the bipartition(s) reaching it."""
    n = similarity.shape[0]
    best, argbest = math.inf, set()
    for mask in range(1, 2 ** (n - 1)):  # index n-1 always in the second part: each bipartition once
        a = [i for i in range(n) if mask >> i & 1]
        b = [i for i in range(n) if not mask >> i & 1]
        value = float(similarity[a][:, b].max())
        if value < best:
            best, argbest = value, {frozenset({frozenset(a), frozenset(b)})}
        elif value == best:
            argbest.add(frozenset({frozenset(a), frozenset(b)}))
    return best, argbest


@pytest.mark.parametrize("n", [2, 3, 4, 5, 6, 7])
def test_bipartition_minimizes_the_largest_cross_similarity(n):
    g = torch.Generator().manual_seed(n)
    for _ in range(6):
        raw = torch.rand(n, n, generator=g, dtype=torch.float64) * 2 - 1
        similarity = (raw + raw.T) / 2
        similarity.fill_diagonal_(1.0)
        first, second = bipartition(similarity)
        assert first and second and sorted(first + second) == list(range(n))
        assert 0 in first  # the group holding index 0 comes first
        best, argbest = brute_force(similarity)
        assert max_cross(similarity, first, second) == best
        assert frozenset({frozenset(first), frozenset(second)}) in argbest
    # cosine matrices of actual updates: two opposite directions plus noise split into those two
    base = torch.randn(50, generator=g, dtype=torch.float64)
    signs = [1, -1, 1, 1, -1]
    updates = torch.stack([s * base + 0.3 * torch.randn(50, generator=g, dtype=torch.float64) for s in signs])
    assert bipartition(cosine_matrix(updates)) == ([0, 2, 3], [1, 4])


# --- Sattler's criterion on whole runs -----------------------------------------------------------


def test_cfl_splits_inverted_sites_from_the_others(tmp_path, tiny_config, disc_federation):
    result = run_algorithm(
        "cfl", prepare(_cfl(tiny_config, **SATTLER), inverted_federation(disc_federation)), tmp_path, resume=False
    )
    by_round = clusters_by_round(result)
    assert list(by_round) == [1, 2]
    expected = {frozenset({"site1", "site3"}), frozenset({"site2", "site4"})}
    for rnd, clusters in by_round.items():
        assert set(clusters) == set(FOUR)
        assert groups(clusters) == expected, (rnd, clusters)
        assert clusters["site1"] == 0 and clusters["site2"] == 1  # the part holding the first site keeps 0
    stats = {(r["round"], r["site"], r["metric"]): r["value"] for r in result.metric_rows if r["metric"] != "cluster"}
    assert stats[(1, "cluster0", "separation")] > SATTLER["gamma_max"]
    # round 2: each cluster tested again, no further split
    assert stats[(2, "cluster0", "separation")] <= SATTLER["gamma_max"]
    assert stats[(2, "cluster1", "separation")] <= SATTLER["gamma_max"]


@pytest.mark.parametrize(
    "options", [{"eps1": 0.0}, {"eps2": 1e9}, {"gamma_max": 0.99}], ids=["eq26-fails", "eq27-fails", "eq30-fails"]
)
def test_cfl_does_not_split_when_one_condition_fails(options, tmp_path, tiny_config, disc_federation):
    cfg = _cfl(tiny_config, rounds=1, **{**SATTLER, **options})
    result = run_algorithm("cfl", prepare(cfg, inverted_federation(disc_federation)), tmp_path, resume=False)
    assert clusters_by_round(result) == {1: dict.fromkeys(FOUR, 0)}


def test_cfl_never_splits_identical_sites(tmp_path, tiny_config, disc_federation):
    cfg = _cfl(tiny_config, rounds=3, **SATTLER)
    result = run_algorithm("cfl", prepare(cfg, identical_federation(disc_federation)), tmp_path, resume=False)
    assert clusters_by_round(result) == {r: dict.fromkeys(FOUR, 0) for r in (1, 2, 3)}
    separations = [r["value"] for r in result.metric_rows if r["metric"] == "separation"]
    assert len(separations) == 3 and max(separations) < SATTLER["gamma_max"]


def test_split_round_splits_once_by_eq29_and_each_part_averages_its_own_members(tmp_path, tiny_config, disc_federation):
    """eps1 = 0: Eq. 26 never holds, so only ``split_round`` splits. The split is Eq. 29 on the cosine
    matrix of the round's updates (recomputed from the messages), the merge right after it is per part,
    and no cluster splits again."""
    cfg = _cfl(tiny_config, rounds=3, eps1=0.0, split_round=2)
    seen = []
    result = run_algorithm(
        "cfl",
        prepare(cfg, inverted_federation(disc_federation)),
        tmp_path,
        resume=False,
        observers=[lambda s, a, m, r: seen.append((a, s, m, r))],
    )
    train = [(s, m, r) for a, s, m, r in seen if a == "train"]
    by_round = {rnd: {s: (m, r) for s, m, r in train[4 * (rnd - 1) : 4 * rnd]} for rnd in (1, 2, 3)}
    assert all(list(x) == FOUR for x in by_round.values())
    clusters = clusters_by_round(result)
    assert clusters[1] == dict.fromkeys(FOUR, 0)
    # round 2: Eq. 29 on the updates w_i - w_c
    two = by_round[2]
    updates = torch.stack([flat_update(two[s][1].group(MODEL), two[s][0].group(MODEL)) for s in FOUR])
    first, second = bipartition(cosine_matrix(updates))
    assert clusters[2] == {s: 0 if i in first else 1 for i, s in enumerate(FOUR)}
    assert groups(clusters[2]) == {frozenset({"site1", "site3"}), frozenset({"site2", "site4"})}
    assert clusters[3] == clusters[2]  # split_round only: no second split of a 2-site cluster
    # round 3's models: the sample-weighted average of the part's round-2 replies; one per cluster
    three = {s: by_round[3][s][0].group(MODEL) for s in FOUR}
    for part in (first, second):
        members = [FOUR[i] for i in part]
        expected = weighted_average(
            [two[s][1].group(MODEL) for s in members], [float(two[s][1].meta["num_examples"]) for s in members]
        )
        assert all(_same(three[s], expected) for s in members)
    assert not _same(three[FOUR[first[0]]], three[FOUR[second[0]]])
    # the split statistics recorded for round 2 are those of these updates
    stats = {r["metric"]: r["value"] for r in result.metric_rows if r["round"] == 2 and r["site"] == "cluster0"}
    sim = cosine_matrix(updates)
    assert stats["separation"] == pytest.approx(math.sqrt((1 - max_cross(sim, first, second)) / 2), rel=1e-12)
    assert stats["update_norm_mean"] == pytest.approx(float(updates.mean(0).norm()), rel=1e-12)
    assert stats["update_norm_max"] == pytest.approx(float(updates.norm(dim=1).max()), rel=1e-12)


# --- prior clustering by metadata ----------------------------------------------------------------------

GRADES = {"site1": "LGG", "site2": "HGG", "site3": "LGG"}  # site4: from its cases' column (mostly HGG)
NUMBERS = {"site1": 1, "site2": 0, "site3": 1, "site4": 0}  # clusters numbered in sorted value order


def graded_federation(disc_federation, missing: str | None = None) -> Federation:
    fed = disc_federation(n_sites=4, cases_per_site=8)
    for site in fed.sites:
        if site.name == missing:
            continue
        if site.name in GRADES:
            site.meta = {"grade": GRADES[site.name], "scanner": "X"}
        else:
            site.cases = [
                dataclasses.replace(c, meta={"grade": "LGG" if i < 3 else "HGG"}) for i, c in enumerate(site.cases)
            ]
    if missing:
        fed.site(missing).meta = {"scanner": "X"}
    return fed


def _prior(tiny_config, **options):
    return tiny_config(
        algorithms=["fedavg", "prior-cfl"],
        fl={"rounds": 2},
        eval={"hd95": False},
        methods={"prior-cfl": {"cluster_by": "grade", **options}},
    )


@pytest.fixture(scope="module")
def prior_run(tmp_path_factory, tiny_config, disc_federation):
    cfg = _prior(tiny_config)
    prep = prepare(cfg, graded_federation(disc_federation))
    out = tmp_path_factory.mktemp("prior")
    fedavg = run_algorithm("fedavg", prep, out, resume=False)
    seen = []
    result = run_algorithm(
        "prior-cfl",
        prep,
        out,
        resume=False,
        earlier={"fedavg": fedavg},
        observers=[lambda s, a, m, r: seen.append((a, s, m, r))],
    )
    return fedavg, result, seen


def test_prior_cfl_clusters_follow_the_metadata(prior_run):
    _, result, seen = prior_run
    assert clusters_by_round(result) == {1: NUMBERS, 2: NUMBERS}
    # the values were asked once, before any training, and cost no floats
    actions = [a for a, *_ in seen]
    assert actions[:4] == ["metadata"] * 4 and actions.count("metadata") == 4
    asked = {s: (m.meta["key"], r.meta["value"]) for a, s, m, r in seen if a == "metadata"}
    assert asked == {**{s: ("grade", g) for s, g in GRADES.items()}, "site4": ("grade", "HGG")}
    rows = [r for r in result.ledger if r["action"] == "metadata"]
    assert len(rows) == 4 and all(r["floats_down"] == r["floats_up"] == r["steps"] == 0 for r in rows)


def test_prior_cfl_sites_of_a_cluster_share_one_model(prior_run):
    fedavg, result, seen = prior_run
    train = [(s, m, r) for a, s, m, r in seen if a == "train"]
    assert len(train) == 8
    rounds = {1: {s: (m, r) for s, m, r in train[:4]}, 2: {s: (m, r) for s, m, r in train[4:]}}
    # round 1: every site starts from FedAvg's selected global model
    for s in FOUR:
        assert _same(rounds[1][s][0].group(MODEL), fedavg.bundle["global"])
    # round 2: one model per cluster, the sample-weighted average of its members' replies
    received = {s: rounds[2][s][0].group(MODEL) for s in FOUR}
    for c in (0, 1):
        members = [s for s in FOUR if NUMBERS[s] == c]
        replies = [rounds[1][s][1] for s in members]
        expected = weighted_average([r.group(MODEL) for r in replies], [float(r.meta["num_examples"]) for r in replies])
        assert all(_same(received[s], expected) for s in members)
    assert not _same(received["site1"], received["site2"])  # the two clusters' models differ after training
    # the validation of a site sends its cluster's model
    val = [(s, m) for a, s, m, _ in seen if a == "evaluate" and m.meta["split"] == "val"]
    assert len(val) == 8
    for s, m in val[:4]:
        assert _same(m.group(MODEL), received[s])


def test_prior_cfl_fails_on_a_site_without_the_key_before_any_training(tmp_path, tiny_config, disc_federation):
    cfg = _prior(tiny_config)
    prep = prepare(cfg, graded_federation(disc_federation, missing="site3"))
    fedavg = run_algorithm("fedavg", prep, tmp_path, resume=False)
    seen = []
    with pytest.raises(ValueError, match=r"site 'site3' has no metadata 'grade'.*keys it has: scanner"):
        run_algorithm(
            "prior-cfl",
            prep,
            tmp_path,
            resume=False,
            earlier={"fedavg": fedavg},
            observers=[lambda s, a, m, r: seen.append(a)],
        )
    assert "train" not in seen


def test_prior_cfl_without_cluster_by_is_refused_before_any_work(tmp_path, tiny_config, disc_federation):
    spec = get_algorithm("prior-cfl")
    with pytest.raises(ValueError, match=r"federation 'discs': methods\.prior-cfl\.cluster_by: required"):
        spec.check_sites(4, "federation 'discs'", {})
    spec.check_sites(4, "federation 'discs'", {"cluster_by": "grade"})
    cfg = tiny_config(algorithms=["fedavg", "prior-cfl"], fl={"rounds": 1})
    seen = []
    with pytest.raises(ValueError, match=r"methods\.prior-cfl\.cluster_by: required"):
        run_experiment(
            cfg, tmp_path / "run", federation=graded_federation(disc_federation), observers=[lambda *x: seen.append(x)]
        )
    assert not seen and not (tmp_path / "run").exists()


def test_prior_cfl_needs_the_model_it_starts_from(tmp_path, tiny_config, disc_federation):
    cfg = _prior(tiny_config).model_copy(update={"algorithms": ["prior-cfl"]})
    with pytest.raises(ValueError, match=r"methods\.prior-cfl\.start_from='fedavg'.*must run before it"):
        run_experiment(cfg, tmp_path / "run", federation=graded_federation(disc_federation))
    assert not (tmp_path / "run").exists()


def test_identical_federation_really_is_identical(disc_federation):
    """Guard for the no-split test: the four sites differ only in their names."""
    fed = identical_federation(disc_federation)
    prep_splits = [sorted((c.id.split("_", 1)[1], s.fixed_splits[c.id]) for c in s.cases) for s in fed.sites]
    assert all(p == prep_splits[0] for p in prep_splits)
    arrays = [[c.arrays() for c in s.cases] for s in fed.sites]
    for other in arrays[1:]:
        assert all(np.array_equal(a[0], b[0]) and np.array_equal(a[1], b[1]) for a, b in zip(arrays[0], other))
