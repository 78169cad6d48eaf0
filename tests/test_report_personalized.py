"""The report's parts for methods whose sites use models of their own (FeTS 2022): the Table 1 section,
the Fig. 6-style per-site bars, the cluster table, a cross-site heatmap per method, and how per-site
selection is read (no validation star; the "may not have converged" note).

One tiny run (module-scoped) of every kind: Centralized, Local, FedAvg, Local fine-tuning (from FedAvg),
FedPer, CFL (split at round 1) and Prior CFL (clusters from site metadata, from FedAvg); sites of
different training-set sizes."""

from __future__ import annotations

import json
import re
import shutil

import pytest

from fedseg.config import StopConfig
from fedseg.presentation.figures import sites_by_size
from fedseg.presentation.kit import RunFiles
from fedseg.report import persite
from fedseg.report.html import render_report
from fedseg.run import run_experiment
from fedseg.run.stopping import convergence, recorded_late_sites
from test_report import assert_self_contained, make_run, row_cells, table

ALGORITHMS = ["centralized", "local", "fedavg", "finetune", "fedper", "cfl", "prior-cfl"]
PER_SITE = ["finetune", "fedper", "cfl", "prior-cfl"]
LABELS = {
    "centralized": "Centralized",
    "local": "Local (own site)",
    "fedavg": "FedAvg",
    "finetune": "Local fine-tuning",
    "fedper": "FedPer",
    "cfl": "CFL",
    "prior-cfl": "Prior CFL",
}
CASES = {"site1": 8, "site2": 16, "site3": 12}  # training splits of different sizes


def section(page: str, title: str) -> str:
    """The HTML of section ``title``, up to the next section."""
    start = page.index(f"<h2>{title}</h2>")
    return page[start : page.find("<h2>", start + 4)]


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory, tiny_config, disc_federation):
    fed = disc_federation(n_sites=3, cases_per_site=16)
    for site, grade in zip(fed.sites, ("HGG", "LGG", "HGG")):
        site.cases = site.cases[: CASES[site.name]]
        site.meta = {"grade": grade}
    cfg = tiny_config(
        algorithms=ALGORITHMS,
        fl={"rounds": 2},
        eval={"hd95": True, "local_models": True},
        methods={
            "finetune": {"epochs": 2},
            "cfl": {"split_round": 1},
            "prior-cfl": {"cluster_by": "grade", "rounds": 1},
        },
    )
    out = tmp_path_factory.mktemp("personalized")
    run_experiment(cfg, out, federation=fed)
    render_report(out)
    return out


@pytest.fixture(scope="module")
def page(run_dir) -> str:
    return (run_dir / "report.html").read_text()


@pytest.fixture(scope="module")
def summary(run_dir) -> dict:
    return json.loads((run_dir / "summary.json").read_text())


def test_table1_has_the_references_then_the_per_site_methods_with_their_selected_rounds(page, summary):
    t1 = table(page, persite.TABLE1_TITLE)
    labels = re.findall(r"<tr[^>]*><th>(.*?)</th>", t1.split("<tbody>")[1])
    assert labels == [LABELS[a] for a in ALGORITHMS]
    head = t1.split("<tbody>")[0]
    for column in ("Dice", "disc Dice", "cup Dice", "HD95", "NSD", "Selected round", "Total SGD steps"):
        assert f"<th>{column}</th>" in head
    for name in ("local", *PER_SITE):
        sel = summary["algorithms"][name]["selected_rounds"]
        cell = row_cells(t1, LABELS[name])[5]
        tip = " · ".join(f"{s} {sel[s]}" for s in summary["sites"])
        assert f'title="{tip}"' in cell
        lo, hi = min(sel.values()), max(sel.values())
        assert (f"{lo} (every site)" if lo == hi else f"{lo}–{hi} (per site)") in cell
    # a global method: the round with the best mean validation Dice
    assert row_cells(t1, "FedAvg")[5] == str(summary["algorithms"]["fedavg"]["best_round"])
    # mean over cases with std; the pooled mean is summary.json's Global
    mean, _, std = row_cells(t1, "FedPer")[0].removeprefix("<b>").removesuffix("</b>").partition(" ± ")
    assert mean == f"{summary['algorithms']['fedper']['dice']['global']:.4f}" and float(std) >= 0
    nsd_mean = row_cells(t1, "FedPer")[4].removeprefix("<b>").removesuffix("</b>").partition(" ± ")[0]
    assert nsd_mean == f"{summary['algorithms']['fedper']['nsd']['global']:.3f}"
    # the cost of a method started from FedAvg includes FedAvg's training, and says so
    ft = summary["algorithms"]["finetune"]["cost"]
    assert ft["includes"] == ["fedavg", "this method"]
    assert row_cells(t1, "Local fine-tuning")[6] == f"{ft['sgd_steps']:,} †"
    assert row_cells(t1, "FedPer")[6] == f"{summary['algorithms']['fedper']['cost']['sgd_steps']:,}"
    assert "Local fine-tuning: FedAvg + its own" in page and "Prior CFL: FedAvg + its own" in page


def test_per_site_figure_and_cluster_table(run_dir, page, summary):
    assert summary["algorithms"]["fedavg"]["train_samples"] == {"site1": 4, "site2": 8, "site3": 6}
    assert (run_dir / "figures" / persite.FIGURE).stat().st_size > 1000
    fig = section(page, persite.FIGURE_TITLE)
    assert "<img" in fig and "Centralized (solid) and FedAvg (dashed)" in fig

    clusters = table(page, persite.CLUSTERS_TITLE)
    # CFL: split in two at round 1 (membership is recorded after the round's training)
    cfl = row_cells(clusters, "CFL, round 1 (first)")
    assert cfl[-1] == "2" and "CFL, round 2 (final)" in clusters
    # Prior CFL: clusters from the sites' grade, fixed
    assert row_cells(clusters, "Prior CFL, round 1 (first, final)") == ["0", "1", "0", "2"]
    assert "FedPer" not in clusters and "Local fine-tuning" not in clusters


def test_a_cross_site_heatmap_for_every_method_with_per_site_models(run_dir, page):
    tiles = section(page, "Per-site models across sites")
    for name in ("local", "fedavg", *PER_SITE):
        file = "cross_site.png" if name == "local" else f"cross_site_{name}.png"
        assert (run_dir / "figures" / file).stat().st_size > 1000
        label = "Local" if name == "local" else LABELS[name]
        assert f'alt="{label} cross-site Dice heatmap"' in tiles
        assert re.search(rf"{re.escape(label)} \d\.\d{{4}} / \d\.\d{{4}}", tiles)  # local avg / local gen
    assert "Local training across sites" not in page
    assert_self_contained(page)


def test_no_validation_star_for_per_site_selection(page):
    note = section(page, "Validation Dice per round")
    assert "No star for Local, Local fine-tuning, FedPer, CFL, Prior CFL" in note


def test_the_sections_are_absent_without_per_site_methods(tmp_path):
    run = make_run(tmp_path / "run")  # centralized, local, fedavg, fedprox
    page = render_report(run).read_text()
    for title in (persite.TABLE1_TITLE, persite.FIGURE_TITLE, persite.CLUSTERS_TITLE, "Per-site models across"):
        assert title not in page
    assert "Local training across sites" in page and "No star" not in page
    assert not (run / "figures" / persite.FIGURE).exists()


def _judged(entry: dict) -> None:
    """``entry``'s convergence as a run of 4 rounds whose validation still rose records it (no plateau)."""
    rising = {r: r / 10 for r in range(1, 5)}
    sel = entry.get("selected_rounds")
    entry["convergence"] = convergence(rising, 4, entry["best_round"], StopConfig(), None, selected_rounds=sel)


def test_a_per_site_method_is_flagged_when_half_its_sites_selected_a_late_round(tmp_path, run_dir):
    run = tmp_path / "run"
    shutil.copytree(run_dir, run)
    summary = json.loads((run / "summary.json").read_text())
    for entry in summary["algorithms"].values():
        entry["rounds"], entry["best_round"] = 4, 2
        if "selected_rounds" in entry:
            entry["selected_rounds"] = {"site1": 1, "site2": 2, "site3": 2}
    # of 4 rounds the late window is the last 2 (fedseg.run.stopping.late_window): rounds 3 and 4
    summary["algorithms"]["fedper"]["selected_rounds"] = {"site1": 4, "site2": 2, "site3": 3}  # 2 of 3
    summary["algorithms"]["cfl"]["selected_rounds"] = {"site1": 4, "site2": 2, "site3": 1}  # 1 of 3
    summary["algorithms"]["cfl"]["best_round"] = 4  # the server's state: not what is tested
    for entry in summary["algorithms"].values():
        _judged(entry)
    (run / "summary.json").write_text(json.dumps(summary))
    (run / "rounds.csv").unlink()  # its 2 rounds would contradict the 4 said above (the report checks them)
    page = render_report(run).read_text()
    assert "May not have converged</b>: FedPer (2 of 3 sites) —" in page
    assert "2–4 (per site)</span>" in row_cells(table(page, persite.TABLE1_TITLE), "FedPer")[5]
    assert "at least half its sites selected a round among those last ones" in page
    assert "CFL (" not in page.split("May not have converged")[1].split("</p>")[0]
    summary["algorithms"]["fedper"]["selected_rounds"]["site3"] = 2
    _judged(summary["algorithms"]["fedper"])
    (run / "summary.json").write_text(json.dumps(summary))
    assert "May not have converged" not in render_report(run).read_text()
    summary["algorithms"]["fedavg"]["best_round"] = 4  # its selected round among the last 2, no plateau
    _judged(summary["algorithms"]["fedavg"])
    (run / "summary.json").write_text(json.dumps(summary))
    assert "May not have converged</b>: FedAvg —" in render_report(run).read_text()


def test_sites_are_ordered_by_training_set_size():
    sizes = {"a": 4, "b": 20, "c": 11, "d": 11, "e": 5}
    assert sites_by_size(["a", "b", "c", "d", "e"], sizes) == ["b", "c", "d", "e", "a"]  # ties: given order
    assert sites_by_size(["x", "a", "b"], {"a": 1, "b": 2}) == ["b", "a", "x"]  # unknown size: last
    assert sites_by_size(["a", "b"], {}) == ["a", "b"]


def test_cluster_table_rows_and_the_tested_models_clusters(tmp_path):
    sites = ["A", "B", "C", "D"]
    per_round = {1: [0, 0, 0, 0], 2: [0, 0, 0, 0], 3: [0, 1, 0, 1], 4: [0, 1, 2, 1], 5: [0, 1, 2, 1]}
    rows = [
        {"algorithm": "cfl", "round": str(rnd), "site": s, "metric": "cluster", "value": f"{c}.0"}
        for rnd, clusters in per_round.items()
        for s, c in zip(sites, clusters)
    ] + [{"algorithm": "cfl", "round": "3", "site": "cluster0", "metric": "separation", "value": "0.4"}]
    entry = {"kind": "clustered", "display_name": "CFL", "rounds": 5, "best_round": 5}
    entry["selected_rounds"] = {"A": 5, "B": 2, "C": 3, "D": 5}  # C's tested model: its cluster at round 3
    run = RunFiles(tmp_path, {"sites": sites, "algorithms": {"cfl": entry}}, round_metrics=rows)
    membership = persite.cluster_membership(run, "cfl")
    assert persite.cluster_changes(membership) == [1, 3, 4]
    t = persite.clusters_table(run, ["cfl"])
    labels = re.findall(r"<tr[^>]*><th>(.*?)</th>", t.split("<tbody>")[1])
    assert labels == [
        "CFL, round 1 (first)",
        "CFL, round 3 (changed)",
        "CFL, round 4 (changed)",
        "CFL, round 5 (final)",
        "CFL, tested model (selected round)",
    ]
    assert row_cells(t, "CFL, round 3 (changed)") == ["0", "<b>1</b>", "0", "<b>1</b>", "2"]
    assert row_cells(t, "CFL, round 4 (changed)") == ["0", "1", "<b>2</b>", "1", "3"]
    assert row_cells(t, "CFL, tested model (selected round)") == ["0", "0", "0", "1", "2"]
    # the selected rounds: a range over sites, each site's round in the tooltip
    assert persite.rounds_cell(run, "cfl") == '<span title="A 5 · B 2 · C 3 · D 5">2–5 (per site)</span>'
    assert recorded_late_sites(entry) == (2, 4)
