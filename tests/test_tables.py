"""Aggregations over hand-made tidy rows, with hand-computed expectations."""

from __future__ import annotations

import csv
import math

import numpy as np
import pytest

from fedseg.evaluate.tables import (
    RESULT_COLUMNS,
    case_means,
    cross_site_matrix,
    own_site_model,
    read_rows,
    region_summary,
    site_summary,
)

NAN = float("nan")


def row(site, case, region, value, metric="dice", algorithm="fedavg", model="global"):
    return dict(algorithm=algorithm, model=model, site=site, case=case, region=region, metric=metric, value=value)


@pytest.fixture
def rows():
    # Site A: 2 cases, Site B: 1 case; regions disc/cup.
    r = [
        row("A", "a1", "disc", 0.9),
        row("A", "a1", "cup", 0.7),  # case mean 0.8
        row("A", "a2", "disc", 0.8),
        row("A", "a2", "cup", 0.4),  # case mean 0.6
        row("B", "b1", "disc", 0.5),
        row("B", "b1", "cup", 0.3),  # case mean 0.4
        # HD95: a1 has one NaN region, a2 all NaN (excluded), b1 normal
        row("A", "a1", "disc", 2.0, "hd95"),
        row("A", "a1", "cup", NAN, "hd95"),
        row("A", "a2", "disc", NAN, "hd95"),
        row("A", "a2", "cup", NAN, "hd95"),
        row("B", "b1", "disc", 4.0, "hd95"),
        row("B", "b1", "cup", 8.0, "hd95"),
        # other algorithm: must be ignored
        row("A", "a1", "disc", 0.0, algorithm="fedprox"),
        row("A", "a1", "cup", 0.0, algorithm="fedprox"),
    ]
    return r


def test_case_means(rows):
    d = case_means(rows, "fedavg", "dice")
    assert d.keys() == {("A", "a1"), ("A", "a2"), ("B", "b1")}
    assert d[("A", "a1")] == pytest.approx(0.8)
    assert d[("A", "a2")] == pytest.approx(0.6)
    assert d[("B", "b1")] == pytest.approx(0.4)
    h = case_means(rows, "fedavg", "hd95")
    assert h == {("A", "a1"): pytest.approx(2.0), ("B", "b1"): pytest.approx(6.0)}


def test_site_summary_client_avg_vs_global(rows):
    s = site_summary(rows, "fedavg", "dice", ["A", "B"])
    assert s["A"] == pytest.approx(0.7)
    assert s["B"] == pytest.approx(0.4)
    assert s["client_avg"] == pytest.approx((0.7 + 0.4) / 2)  # 0.55
    assert s["global"] == pytest.approx((0.8 + 0.6 + 0.4) / 3)  # 0.6
    h = site_summary(rows, "fedavg", "hd95", ["A", "B"])
    assert h["A"] == pytest.approx(2.0) and h["B"] == pytest.approx(6.0)
    assert h["client_avg"] == pytest.approx(4.0) and h["global"] == pytest.approx(4.0)
    assert site_summary(rows, "fedprox", "dice", ["A", "B"])["A"] == 0.0


def test_site_summary_missing_site_is_nan_and_not_averaged(rows):
    s = site_summary(rows, "fedavg", "dice", ["A", "C"])
    assert math.isnan(s["C"])
    assert s["client_avg"] == pytest.approx(0.7)
    assert s["global"] == pytest.approx(0.7)  # only A's cases: B is not in `sites`


def test_site_summary_model_filter():
    # Personalized-style rows: each site's own model vs another site's model.
    r = [
        row("A", "a1", "disc", 0.9, algorithm="local", model="local:A"),
        row("A", "a1", "disc", 0.2, algorithm="local", model="local:B"),
        row("B", "b1", "disc", 0.8, algorithm="local", model="local:B"),
        row("B", "b1", "disc", 0.1, algorithm="local", model="local:A"),
    ]
    s = site_summary(r, "local", "dice", ["A", "B"], model_filter=own_site_model)
    assert s == {
        "A": pytest.approx(0.9),
        "B": pytest.approx(0.8),
        "client_avg": pytest.approx(0.85),
        "global": pytest.approx(0.85),
    }
    assert own_site_model(row("A", "a1", "disc", 1.0, model="global"))
    unfiltered = site_summary(r, "local", "dice", ["A", "B"])
    assert unfiltered["A"] == pytest.approx(0.55)


def test_region_summary(rows):
    s = region_summary(rows, "fedavg", "dice", regions=["disc", "cup"])
    assert list(s) == ["disc", "cup"]
    assert s["disc"]["mean"] == pytest.approx((0.9 + 0.8 + 0.5) / 3)
    assert s["disc"]["std"] == pytest.approx(np.std([0.9, 0.8, 0.5], ddof=1))
    assert s["cup"]["mean"] == pytest.approx((0.7 + 0.4 + 0.3) / 3)
    assert s["cup"]["n"] == 3
    h = region_summary(rows, "fedavg", "hd95")
    assert h["disc"] == {"mean": pytest.approx(3.0), "std": pytest.approx(math.sqrt(2)), "n": 2}
    assert h["cup"]["n"] == 1 and h["cup"]["mean"] == 8.0 and math.isnan(h["cup"]["std"])
    only_b = region_summary(rows, "fedavg", "dice", sites=["B"], ddof=0)
    assert only_b["disc"] == {"mean": pytest.approx(0.5), "std": 0.0, "n": 1}


def test_cross_site_matrix():
    r = []
    scores = {("A", "A"): 0.9, ("A", "B"): 0.3, ("B", "A"): 0.5, ("B", "B"): 0.8}
    for (train, test), v in scores.items():
        for case, delta in [("c1", +0.05), ("c2", -0.05)]:
            r.append(row(test, f"{test}{case}", "disc", v + delta, algorithm="local", model=f"local:{train}"))
            r.append(row(test, f"{test}{case}", "cup", v + delta, algorithm="local", model=f"local:{train}"))
    r.append(row("A", "x", "disc", 0.0, algorithm="fedavg", model="local:A"))  # other algorithm
    m = cross_site_matrix(r, "dice", ["A", "B", "C"])
    assert m.shape == (3, 3)
    np.testing.assert_allclose(m[:2, :2], [[0.9, 0.3], [0.5, 0.8]])
    assert np.isnan(m[2]).all() and np.isnan(m[:, 2]).all()


def test_read_rows_roundtrip(tmp_path, rows):
    p = tmp_path / "results.csv"
    with open(p, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=RESULT_COLUMNS)
        w.writeheader()
        for r in rows:
            w.writerow(r)
    back = read_rows(p)
    assert len(back) == len(rows)
    assert isinstance(back[0]["value"], float)
    assert site_summary(back, "fedavg", "dice", ["A", "B"]) == site_summary(rows, "fedavg", "dice", ["A", "B"])
    assert case_means(back, "fedavg", "hd95").keys() == {("A", "a1"), ("B", "b1")}
