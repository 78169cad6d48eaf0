"""The report's Auto-FedAvg parts (paper Fig. 3a-c, the weights of the tested model) from hand-made run
directories, and the study page's figure of a numeric sweep (paper Fig. 4)."""

from __future__ import annotations

import csv
import json
import re

import numpy as np
import pytest
from PIL import Image
from scipy import stats

import fedseg.algorithms
from fedseg.algorithms.autofedavg.report import (
    ALPHA_TITLE,
    DICE_TITLE,
    DIRICHLET_TITLE,
    TABLE_TITLE,
    beta_pdf,
    dirichlet_log_pdf,
    distribution_rounds,
    load_weights,
    merge_point,
    sections,
    simplex_grid,
)
from fedseg.presentation.kit import load_run
from fedseg.report.html import render_report
from fedseg.report.studies import render_study
from fedseg.report.study_tables import SWEEP_FIGURE
from fedseg.studies import SWEEP, Study, SubRun, run_label, sweep_columns, write_study_file, write_table
from test_report import assert_self_contained, embedded

ROUNDS = 6
T0 = 2
GROUPS = ["model.0.conv", "model.1.submodule.0.conv", "model.1.submodule.1.conv", "model.2.conv"]
BEST = 4  # summary.json best_round of every algorithm
DISPLAY = {
    "autofedavg-n-dirichlet": "Auto-FedAvg-N-Dirichlet",
    "autofedavg-n-softmax": "Auto-FedAvg-N-Softmax",
    "autofedavg-l-dirichlet": "Auto-FedAvg-L-Dirichlet",
    "autofedavg-l-softmax": "Auto-FedAvg-L-Softmax",
    "fedavg": "FedAvg",
    "fedavg-uniform": "FedAvg (uniform)",
}


def write_csv(path, columns, rows):
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=columns)
        w.writeheader()
        w.writerows(rows)


def softmax(b):
    e = np.exp(b - b.max())
    return e / e.sum()


def merge(beta, dirichlet):
    """What the method merges with (computed here independently of the report module)."""
    if not dirichlet:
        return softmax(beta)
    return (beta - 1) / (beta.sum() - len(beta)) if (beta > 1).all() else beta / beta.sum()


def beta_at(rnd, k, n_sites, group=0, dirichlet=True):
    """A concentration that grows with the round (the distribution sharpens), different per site and group."""
    base = 6.0 if dirichlet else 0.0
    return base + (0.8 if dirichlet else 0.1) * rnd * (k + 1) / n_sites + 0.3 * group * (k % 2)


def make_autofedavg_run(root, sites, algorithms, baselines=("fedavg",), with_metrics=True):
    """A run directory: summary.json, rounds.csv, round_metrics.csv (the Auto-FedAvg data contract),
    config.yaml. ``algorithms``: Auto-FedAvg names (variant from the name). Returns the expected
    ``{algorithm: {"alpha": (R, K), "beta": (R, K)}}`` (layer-wise: the means over groups)."""
    root.mkdir(parents=True, exist_ok=True)
    k_sites = len(sites)
    expected, metric_rows, round_rows, entries = {}, [], [], {}
    for alg in [*algorithms, *baselines]:
        dice = {s: 0.7 + 0.01 * i for i, s in enumerate(sites)}
        entries[alg] = {
            "dice": {**dice, "client_avg": float(np.mean(list(dice.values()))), "global": 0.71},
            "hd95": {**dict.fromkeys(sites, 3.0), "client_avg": 3.0, "global": 3.0},
            "rounds": ROUNDS,
            "best_round": BEST,
            "display_name": DISPLAY[alg],
            "kind": "global",
            "family": "Auto-FedAvg" if alg in algorithms else None,
        }
        for rnd in range(1, ROUNDS + 1):
            for i, s in enumerate(sites):
                val = 0.4 + 0.05 * rnd + (0.02 if alg in algorithms else 0.0) + 0.001 * i
                round_rows.append(dict(algorithm=alg, round=rnd, site=s, val_dice=val, train_loss=1.0 / rnd))
    for alg in algorithms:
        dirichlet, layer = "dirichlet" in alg, "-l-" in alg
        n_groups = len(GROUPS) if layer else 1
        alphas, betas = np.zeros((ROUNDS, k_sites)), np.zeros((ROUNDS, k_sites))
        for t, rnd in enumerate(range(1, ROUNDS + 1)):
            beta = np.array([[beta_at(rnd, k, k_sites, g, dirichlet) for k in range(k_sites)] for g in range(n_groups)])
            alpha = np.stack([merge(b, dirichlet) for b in beta])
            alphas[t], betas[t] = alpha.mean(axis=0), beta.mean(axis=0)
            learned = float(rnd % T0 == 0)
            for i, s in enumerate(sites):
                base = dict(algorithm=alg, round=rnd, site=s)
                metric_rows += [
                    {**base, "metric": "alpha", "value": alphas[t, i]},
                    {**base, "metric": "beta", "value": betas[t, i]},
                    {**base, "metric": "learned", "value": learned},
                ]
                if layer:
                    for g, name in enumerate(GROUPS):
                        metric_rows += [
                            {**base, "metric": f"alpha@{name}", "value": alpha[g, i]},
                            {**base, "metric": f"beta@{name}", "value": beta[g, i]},
                        ]
        expected[alg] = {"alpha": alphas, "beta": betas}
    summary = {"dataset": "toy", "sites": list(sites), "regions": ["disc"], "algorithms": entries}
    (root / "summary.json").write_text(json.dumps(summary, indent=2))
    write_csv(root / "rounds.csv", ["algorithm", "round", "site", "val_dice", "train_loss"], round_rows)
    if with_metrics:
        write_csv(root / "round_metrics.csv", ["algorithm", "round", "site", "metric", "value"], metric_rows)
    methods = "".join(f"  {a}:\n    t0: {T0}\n" for a in algorithms)
    (root / "config.yaml").write_text(
        f"seed: 0\nalgorithms: [{', '.join([*algorithms, *baselines])}]\nmethods:\n{methods}"
    )
    return expected


def png_ok(path):
    """A readable, non-trivial PNG."""
    assert path.is_file() and path.stat().st_size > 2000, path
    with Image.open(path) as im:
        assert im.format == "PNG" and im.width > 200 and im.height > 150


def by_title(found):
    return {s.title: s for s in found}


def images(body):
    return re.findall(r'src="figures/([^"]+)"', body or "")


def table_row(html, label_start):
    m = re.search(rf"<tr[^>]*><th>{re.escape(label_start)}[^<]*</th>(.*?)</tr>", html)
    assert m, f"no row starting {label_start!r}"
    return [c.replace("<b>", "").replace("</b>", "") for c in re.findall(r"<td>(.*?)</td>", m.group(1))]


# --------------------------------------------------------------------------- sections from hand-made runs
def test_three_sites_network_and_layer_wise_sections(tmp_path):
    sites = ["A", "B", "C"]
    algs = ["autofedavg-n-dirichlet", "autofedavg-n-softmax", "autofedavg-l-dirichlet"]
    expected = make_autofedavg_run(tmp_path / "run", sites, algs, baselines=("fedavg", "fedavg-uniform"))
    run = load_run(tmp_path / "run")
    fig_dir = tmp_path / "run" / "figures"
    found = by_title(sections(run, algs, fig_dir))
    assert list(found) == [ALPHA_TITLE, DICE_TITLE, DIRICHLET_TITLE, TABLE_TITLE]

    alpha = found[ALPHA_TITLE].body
    assert images(alpha) == ["autofedavg_alpha.png", "autofedavg_layers_autofedavg-l-dirichlet.png"]
    assert images(found[DICE_TITLE].body) == ["autofedavg_dice.png"]
    # Fig. 3c: network-wise Dirichlet only
    assert images(found[DIRICHLET_TITLE].body) == ["autofedavg_dirichlet_autofedavg-n-dirichlet.png"]
    for body in (alpha, found[DICE_TITLE].body, found[DIRICHLET_TITLE].body):
        for name in images(body):
            png_ok(fig_dir / name)

    # the table: alpha and beta at the selected round, as in round_metrics.csv
    table = found[TABLE_TITLE].body
    for alg in algs:
        label = run.label(alg)
        cells = table_row(table, f"{label}: α, selected round {BEST}")
        assert cells == [f"{v:.3f}" for v in expected[alg]["alpha"][BEST - 1]]
        cells = table_row(table, f"{label}: β, selected round {BEST}")
        assert cells == [f"{v:.3f}" for v in expected[alg]["beta"][BEST - 1]]
    assert f"weights learned in {ROUNDS // T0} of {ROUNDS} validated rounds (t<sub>0</sub> = {T0})" in table


def test_four_sites_marginals_layer_heatmap_and_no_baseline_note(tmp_path):
    sites = ["s1", "s2", "s3", "s4"]
    algs = ["autofedavg-n-dirichlet", "autofedavg-l-softmax"]
    expected = make_autofedavg_run(tmp_path / "run", sites, algs, baselines=())
    run = load_run(tmp_path / "run")
    fig_dir = tmp_path / "figs"
    found = by_title(sections(run, algs, fig_dir))
    assert images(found[ALPHA_TITLE].body) == ["autofedavg_alpha.png", "autofedavg_layers_autofedavg-l-softmax.png"]
    assert images(found[DIRICHLET_TITLE].body) == ["autofedavg_dirichlet_autofedavg-n-dirichlet.png"]
    for name in ("autofedavg_alpha.png", "autofedavg_layers_autofedavg-l-softmax.png"):
        png_ok(fig_dir / name)
    png_ok(fig_dir / "autofedavg_dirichlet_autofedavg-n-dirichlet.png")
    # no FedAvg ran: a note instead of the comparison figure
    dice = found[DICE_TITLE].body
    assert dice and "No FedAvg baseline" in dice and not images(dice)
    assert not (fig_dir / "autofedavg_dice.png").exists()

    w = load_weights(run, "autofedavg-l-softmax")
    assert w is not None and w.layer_wise and w.groups == GROUPS and w.sites == sites
    assert w.alpha_groups.shape == (ROUNDS, len(GROUPS), len(sites))
    np.testing.assert_allclose(w.alpha_groups.mean(axis=1), expected["autofedavg-l-softmax"]["alpha"])
    np.testing.assert_allclose(w.alpha_groups.sum(axis=2), 1.0)  # softmax per group
    assert w.learned.tolist() == [rnd % T0 == 0 for rnd in range(1, ROUNDS + 1)]
    table = found[TABLE_TITLE].body
    assert table_row(table, "Auto-FedAvg-L-Softmax: α") == [
        f"{v:.3f}" for v in expected["autofedavg-l-softmax"]["alpha"][BEST - 1]
    ]


def test_no_rows_no_sections_and_no_exception(tmp_path):
    algs = ["autofedavg-n-dirichlet", "autofedavg-l-softmax"]
    make_autofedavg_run(tmp_path / "run", ["A", "B", "C"], algs, with_metrics=False)
    run = load_run(tmp_path / "run")
    found = by_title(sections(run, algs, tmp_path / "figs"))
    for title in (ALPHA_TITLE, DIRICHLET_TITLE, TABLE_TITLE):
        assert not found[title].body
    assert images(found[DICE_TITLE].body) == ["autofedavg_dice.png"]  # rounds.csv still has the curves

    run.rounds, run.summary = [], {}  # nothing at all: not even sites
    assert all(not s.body for s in sections(run, algs, tmp_path / "figs2"))
    assert not (tmp_path / "figs2").exists()

    # rows of other metrics, other algorithms, blanks and unparsable numbers are ignored
    run.round_metrics = [
        {"algorithm": "autofedavg-n-dirichlet", "round": "1", "site": "A", "metric": "learned", "value": "1.0"},
        {"algorithm": "autofedavg-n-dirichlet", "round": "", "site": "A", "metric": "alpha", "value": "0.5"},
        {"algorithm": "fedsm", "round": "1", "site": "A", "metric": "alpha", "value": "0.5"},
        {"algorithm": "autofedavg-n-dirichlet", "round": "2", "site": "A", "metric": "selector_acc", "value": "x"},
    ]
    assert all(not s.body for s in sections(run, algs, tmp_path / "figs3"))

    # softmax betas (negative: no Dirichlet) and a single row still draw without a Dirichlet figure
    run.round_metrics = [
        {"algorithm": "autofedavg-n-softmax", "round": "3", "site": s, "metric": m, "value": v}
        for s, a in (("A", 0.2), ("B", 0.8))
        for m, v in (("alpha", a), ("beta", -a))
    ]
    found = by_title(sections(run, ["autofedavg-n-softmax"], tmp_path / "figs4"))
    assert images(found[ALPHA_TITLE].body) == ["autofedavg_alpha.png"]
    assert not found[DIRICHLET_TITLE].body
    assert "last round with weights 3" in found[TABLE_TITLE].body  # no best_round in summary.json


def test_selected_round_falls_back_to_the_last_round_before_it(tmp_path):
    algs = ["autofedavg-n-softmax"]
    expected = make_autofedavg_run(tmp_path / "run", ["A", "B", "C"], algs, baselines=())
    run = load_run(tmp_path / "run")
    run.round_metrics = [r for r in run.round_metrics if r["round"] != str(BEST)]  # e.g. not validated then
    table = by_title(sections(run, algs, tmp_path / "figs"))[TABLE_TITLE].body
    assert table_row(table, f"Auto-FedAvg-N-Softmax: α, last round with weights {BEST - 1}") == [
        f"{v:.3f}" for v in expected["autofedavg-n-softmax"]["alpha"][BEST - 2]
    ]


# --------------------------------------------------------------------------- the Dirichlet numbers
@pytest.mark.parametrize("beta", [(6.0, 6.0, 6.0), (1.0, 1.0, 1.0), (2.0, 3.5, 9.0), (30.0, 12.0, 4.0)])
def test_dirichlet_density_integrates_to_one_on_the_simplex_grid(beta):
    grid = simplex_grid(200)
    assert grid.triangles.shape == (200**2, 3)
    np.testing.assert_allclose(grid.centroids.sum(axis=1), 1.0)
    assert (grid.centroids > 0).all()
    # every cell has the same area, and together they cover the simplex (area 1/2 in (α1, α2))
    v = grid.vertices[grid.triangles]
    areas = 0.5 * np.abs(
        (v[:, 1, 0] - v[:, 0, 0]) * (v[:, 2, 1] - v[:, 0, 1]) - (v[:, 2, 0] - v[:, 0, 0]) * (v[:, 1, 1] - v[:, 0, 1])
    )
    np.testing.assert_allclose(areas, grid.cell_area)
    assert areas.sum() == pytest.approx(0.5)
    density = np.exp(dirichlet_log_pdf(grid.centroids, beta))
    assert (density * grid.cell_area).sum() == pytest.approx(1.0, abs=2e-3)
    # and it is the Dirichlet density (scipy's), point by point
    pts = grid.centroids[::997]
    np.testing.assert_allclose(dirichlet_log_pdf(pts, beta), [stats.dirichlet.logpdf(p, beta) for p in pts])


def test_beta_marginal_and_merge_point():
    x = np.linspace(1e-3, 1 - 1e-3, 50)
    np.testing.assert_allclose(beta_pdf(x, 6.0, 12.0), stats.beta.pdf(x, 6.0, 12.0))
    point, kind = merge_point([6.0, 4.0, 2.0])
    assert kind == "mode"
    np.testing.assert_allclose(point, [5 / 9, 3 / 9, 1 / 9])  # (β_k - 1) / (Σβ - K)
    point, kind = merge_point([0.5, 1.5, 2.0])
    assert kind == "mean"
    np.testing.assert_allclose(point, [0.5 / 4, 1.5 / 4, 2.0 / 4])


def test_distribution_rounds_first_two_between_last(tmp_path):
    make_autofedavg_run(tmp_path / "run", ["A", "B", "C"], ["autofedavg-n-dirichlet"], baselines=())
    w = load_weights(load_run(tmp_path / "run"), "autofedavg-n-dirichlet")
    assert w is not None
    assert [int(w.rounds[i]) for i in distribution_rounds(w)] == [1, 3, 4, 6]
    w.beta[0, 0] = 0.0  # not a concentration: skipped
    assert [int(w.rounds[i]) for i in distribution_rounds(w)] == [2, 3, 5, 6]


# --------------------------------------------------------------------------- the whole page
@pytest.mark.skipif(
    "autofedavg-n-dirichlet" not in fedseg.algorithms.ALGORITHMS, reason="Auto-FedAvg is not registered yet"
)
def test_run_report_has_the_autofedavg_sections(tmp_path):
    algs = ["autofedavg-n-dirichlet", "autofedavg-l-softmax"]
    make_autofedavg_run(tmp_path / "run", ["A", "B", "C"], algs)
    html = render_report(tmp_path / "run").read_text()
    for title in (ALPHA_TITLE, DICE_TITLE, DIRICHLET_TITLE, TABLE_TITLE):
        assert f"<h2>{title}</h2>" in html
    for name in (
        "autofedavg_alpha.png",
        "autofedavg_layers_autofedavg-l-softmax.png",
        "autofedavg_dice.png",
        "autofedavg_dirichlet_autofedavg-n-dirichlet.png",
    ):
        assert embedded(tmp_path / "run", name) in html
        png_ok(tmp_path / "run" / "figures" / name)


# --------------------------------------------------------------------------- Fig. 4: a numeric sweep
def make_sweep(root, tiny_config, key, values, algorithms=("autofedavg-n-dirichlet",)):
    """A study directory as :func:`fedseg.studies.run_study` writes it (study.json, sweep.csv/.json),
    without running: the sub-runs are listed but not finished."""
    cfg = tiny_config(algorithms=list(algorithms))
    runs = [SubRun(run_label(key, v), root / "sweep" / run_label(key, v), cfg, None, v) for v in values]
    study = Study("sweep", root, cfg, runs, key=key)
    root.mkdir(parents=True, exist_ok=True)
    write_study_file(study)
    rows = [
        {
            "key": key,
            "value": v,
            "algorithm": alg,
            "dice_A": 0.6 + 0.01 * i,
            "dice_B": 0.7 - 0.01 * i,
            "dice_client_avg": 0.65 - 0.005 * i - 0.01 * j,
            "dice_global": 0.66,
            "hd95_client_avg": 3.0,
            "run": f"sweep/{run_label(key, v)}",
        }
        for i, v in enumerate(values)
        for j, alg in enumerate(algorithms)
    ]
    write_table(root, SWEEP, sweep_columns(rows), rows)
    return rows


def test_numeric_sweep_page_has_the_dice_figure(tmp_path, tiny_config):
    algs = ("autofedavg-n-dirichlet", "fedavg")
    make_sweep(tmp_path, tiny_config, "methods.autofedavg-n-dirichlet.t0", ["1", "5", "10", "20"], algs)
    page = render_study(tmp_path, sub_reports=False).read_text()
    assert f'src="figures/{SWEEP_FIGURE}"' not in page  # embedded, so the page travels alone
    figure = embedded(tmp_path, SWEEP_FIGURE)
    assert page.index("<h2>Sweep over methods.autofedavg-n-dirichlet.t0") < page.index(figure)
    assert_self_contained(page)
    png_ok(tmp_path / "figures" / SWEEP_FIGURE)


def test_non_numeric_sweep_gets_no_figure(tmp_path, tiny_config):
    make_sweep(tmp_path, tiny_config, "model.channels", ["[4,8,16]", "[8,16,32]"], ("fedavg",))
    page = render_study(tmp_path, sub_reports=False).read_text()
    assert "<h2>Sweep over model.channels" in page
    assert SWEEP_FIGURE not in page and not (tmp_path / "figures" / SWEEP_FIGURE).exists()
