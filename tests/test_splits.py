"""Per-site splits: ratio and federated k-fold, fixed splits, CSV round trip and errors."""

from __future__ import annotations

import re

import numpy as np
import pytest

from fedseg.config import SplitConfig
from fedseg.data.federation import Case, Federation, FederationError, Regions, Site
from fedseg.data.splits import (
    check_splits,
    kfold_assignment,
    make_splits,
    ratio_counts,
    read_site_splits_csv,
    read_splits_csv,
    write_splits_csv,
)


def _site(name: str, n: int, fixed=None) -> Site:
    image, label = np.zeros((1, 4, 4), np.uint8), np.zeros((4, 4), np.uint8)
    return Site(name, [Case.from_arrays(f"{name}-{i:03d}", image, label) for i in range(n)], fixed)


def _fed(*sites: Site) -> Federation:
    return Federation("toy", "2d", 1, Regions.from_mapping({"fg": [1]}), list(sites))


def _ids(splits: dict, site: str, which: str) -> set[str]:
    return {c for c, s in splits[site].items() if s == which}


def test_ratio_split_is_deterministic_disjoint_covering_and_respects_ratios():
    fed = _fed(_site("a", 20), _site("b", 7), _site("c", 3))
    cfg = SplitConfig(ratios=(0.5, 0.25, 0.25))
    splits = make_splits(fed, cfg, seed=3)
    assert splits == make_splits(fed, cfg, seed=3)
    assert splits != make_splits(fed, cfg, seed=4)
    for site in fed.sites:
        assert list(splits[site.name]) == [c.id for c in site.cases]  # every case exactly once, in site order
    assert [len(_ids(splits, "a", s)) for s in ("train", "val", "test")] == [10, 5, 5]
    assert [len(_ids(splits, "b", s)) for s in ("train", "val", "test")] == list(ratio_counts(7, (0.5, 0.25, 0.25)))
    assert [len(_ids(splits, "c", s)) for s in ("train", "val", "test")] == [1, 1, 1]


def test_ratio_counts_rounding():
    assert ratio_counts(10, (0.7, 0.2, 0.1)) == (7, 2, 1)
    assert ratio_counts(3, (0.9, 0.05, 0.05)) == (1, 1, 1)  # >= 3 cases: every split gets one
    assert ratio_counts(2, (0.5, 0.25, 0.25)) == (1, 1, 0)
    assert ratio_counts(1, (0.5, 0.25, 0.25)) == (1, 0, 0)
    assert ratio_counts(5, (0.8, 0.2, 0.0)) == (4, 1, 0)  # a zero ratio stays empty
    for n in range(30):
        assert sum(ratio_counts(n, (0.6, 0.3, 0.1))) == n


def test_split_of_a_site_does_not_depend_on_other_sites_or_case_order():
    a = _site("a", 12)
    alone = make_splits(_fed(a), SplitConfig(), seed=0)["a"]
    with_more = make_splits(_fed(_site("z", 5), a, _site("b", 9)), SplitConfig(), seed=0)["a"]
    reversed_site = Site("a", list(reversed(a.cases)))
    reordered = make_splits(_fed(reversed_site), SplitConfig(), seed=0)["a"]
    assert alone == with_more == reordered


def test_kfold_folds_partition_each_site_with_near_equal_sizes():
    ids = [f"c{i}" for i in range(23)]
    folds = kfold_assignment(ids, 5, seed=1, site="a")
    assert set(folds) == set(ids) and set(folds.values()) == set(range(5))
    sizes = sorted(list(folds.values()).count(k) for k in range(5))
    assert sizes == [4, 4, 5, 5, 5]
    assert folds == kfold_assignment(list(reversed(ids)), 5, seed=1, site="a")
    assert folds != kfold_assignment(ids, 5, seed=1, site="b")


def test_kfold_each_fold_is_test_once_and_rest_is_80_20_train_val():
    fed = _fed(_site("a", 25), _site("b", 10))
    tests = {"a": [], "b": []}
    for k in range(5):
        splits = make_splits(fed, SplitConfig(mode="kfold", folds=5, fold=k, train_fraction=0.8), seed=7)
        folds = {s.name: kfold_assignment([c.id for c in s.cases], 5, 7, s.name) for s in fed.sites}
        for site in ("a", "b"):
            test = _ids(splits, site, "test")
            assert test == {c for c, f in folds[site].items() if f == k}
            tests[site].append(test)
        assert (len(_ids(splits, "a", "train")), len(_ids(splits, "a", "val"))) == (16, 4)
        assert (len(_ids(splits, "b", "train")), len(_ids(splits, "b", "val"))) == (6, 2)  # 8 cases -> 6.4/1.6
    for site, n in (("a", 25), ("b", 10)):
        union = set().union(*tests[site])
        assert len(union) == n == sum(len(t) for t in tests[site])  # disjoint and covering


def test_fixed_splits_win_and_the_rest_is_computed():
    fixed = {"a-000": "test", "a-001": "test", "a-002": "val"}
    fed = _fed(_site("a", 10, fixed))
    splits = make_splits(fed, SplitConfig(), seed=0)["a"]
    assert {c: splits[c] for c in fixed} == fixed
    rest = [s for c, s in splits.items() if c not in fixed]
    assert [rest.count(s) for s in ("train", "val", "test")] == [3, 2, 2]  # 7 cases at 0.5/0.25/0.25
    kfold = make_splits(fed, SplitConfig(mode="kfold"), seed=0)["a"]
    assert {c: kfold[c] for c in fixed} == fixed


def test_check_splits_names_a_site_without_training_cases():
    fed = _fed(_site("a", 4), _site("lonely", 2, {"lonely-000": "val", "lonely-001": "test"}))
    expected = r"site 'lonely': no training cases after splitting \(2 cases: 0 train, 1 val, 1 test\)"
    with pytest.raises(FederationError, match=expected):
        check_splits(fed, make_splits(fed, SplitConfig(), seed=0))
    one_case = _fed(_site("single", 1))
    with pytest.raises(FederationError, match="site 'single': no training cases"):
        check_splits(one_case, make_splits(one_case, SplitConfig(mode="kfold", folds=2, fold=0), seed=0))
    lonely_two = _fed(_site("a", 4), _site("lonely", 2))  # 2 cases: a train and a val case, no test case
    with pytest.raises(FederationError, match=r"site 'lonely': no test cases after splitting \(2 cases: 1 train"):
        check_splits(lonely_two, make_splits(lonely_two, SplitConfig(), seed=0))
    check_splits(
        _fed(_site("a", 4), _site("three", 3)),
        make_splits(_fed(_site("a", 4), _site("three", 3)), SplitConfig(), seed=0),
    )


def test_a_site_without_test_cases_is_refused_before_training_not_after(tmp_path):
    """It trained, then failed the final evaluation (an nnU-Net import whose splits_final.json fold gives every case
    to train or val, a splits.csv without test rows): refused by the check every run makes first."""
    fed = _fed(_site("a", 4), _site("b", 4, {f"b-00{i}": "train" if i % 2 else "val" for i in range(4)}))
    with pytest.raises(FederationError, match=r"site 'b': no test cases after splitting \(4 cases: 2 train, 2 val, 0"):
        check_splits(fed, make_splits(fed, SplitConfig(), seed=0))


def test_check_splits_names_a_site_without_validation_cases():
    """A site of one case trained, then failed on its empty validation split; now it is refused up front."""
    fed = _fed(_site("a", 4), _site("single", 1))
    expected = r"site 'single': no validation cases and no test cases after splitting \(1 cases: 1 train"
    with pytest.raises(FederationError, match=expected):
        check_splits(fed, make_splits(fed, SplitConfig(), seed=0))


def test_splits_csv_round_trip(tmp_path):
    fed = _fed(_site("a", 6), _site("b", 4))
    splits = make_splits(fed, SplitConfig(), seed=0)
    path = tmp_path / "splits.csv"
    write_splits_csv(path, splits)
    assert path.read_text().splitlines()[0] == "site,case,split"
    assert read_splits_csv(path) == splits


@pytest.mark.parametrize(
    "text, problem",
    [
        ("site,case,split\na,x,train\na,y,holdout\n", r":3: unknown split 'holdout'"),
        ("site,case,split\na,x,train\nb,x,val\na,x,test\n", r":4: duplicate site 'a' case 'x' \(first on line 2\)"),
        ("site,case\na,x\n", r":1: missing column 'split'"),
        ("site,case,split\na,,train\n", r":2: empty 'case'"),
        ("", r": empty file, expected a header site,case,split"),
    ],
)
def test_bad_splits_csv_errors_name_the_file_and_line(tmp_path, text, problem):
    path = tmp_path / "bad.csv"
    path.write_text(text)
    with pytest.raises(FederationError, match=re.escape(str(path)) + problem):
        read_splits_csv(path)


def test_bad_splits_csv_lists_every_problem(tmp_path):
    path = tmp_path / "bad.csv"
    path.write_text("site,case,split\na,x,foo\na,y,bar\n")
    with pytest.raises(FederationError) as err:
        read_splits_csv(path)
    assert str(err.value).splitlines() == [
        f"{path}:2: unknown split 'foo' (expected one of train, val, test)",
        f"{path}:3: unknown split 'bar' (expected one of train, val, test)",
    ]


def test_site_splits_csv_rejects_unknown_case(tmp_path):
    path = tmp_path / "splits.csv"
    path.write_text("case,split\nx,train\nghost,val\n")
    assert read_site_splits_csv(path) == {"x": "train", "ghost": "val"}
    with pytest.raises(FederationError, match=re.escape(str(path)) + r":3: unknown case 'ghost'"):
        read_site_splits_csv(path, ["x", "y"])
