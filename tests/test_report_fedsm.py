"""The report's FedSM parts: Table 3 layout, selector table and figures, selector features, t-SNE."""

from __future__ import annotations

import csv
import json
import re
import shutil
from collections import defaultdict

import numpy as np
import pytest
import torch
from PIL import Image
from safetensors.torch import load_file

from fedseg.algorithms.fedsm.model import super_model_from_bundle
from fedseg.algorithms.fedsm.selector import build_selector
from fedseg.report.html import algorithm_order, render_report
from fedseg.run import prepare, run_experiment
from test_report import copy_algorithm_rows, embedded, local_models, make_run, row_cells, table

SEL = {"selector_width": 0.0625}


def _png(path, colored: int = 0):
    """A readable PNG file of a sensible size with at least ``colored`` saturated pixels (drawn
    data, not just black/grey axes and text)."""
    with Image.open(path) as im:
        assert im.format == "PNG" and im.width > 200 and im.height > 150
        hsv = np.asarray(im.convert("RGB").convert("HSV"))
    assert ((hsv[..., 1] > 100) & (hsv[..., 2] > 60)).sum() >= colored, path


def _body_labels(table_html):
    return re.findall(r"<tr[^>]*><th>(.*?)</th>", table_html.split("<tbody>")[1])


@pytest.fixture(scope="module")
def fedsm_run(tmp_path_factory, tiny_config, disc_federation):
    """A real 2-round run of fedsm, local and fedavg (listed out of table order) on 3 tiny sites."""
    out = tmp_path_factory.mktemp("fedsm_report")
    cfg = tiny_config(algorithms=["fedsm", "local", "fedavg"], eval={"hd95": True}, methods={"fedsm": SEL})
    fed = disc_federation(n_sites=3, cases_per_site=8)
    run_experiment(cfg, out, federation=fed)
    return out, cfg, fed, render_report(out).read_text()


def test_table3_layout_from_a_real_run(fedsm_run):
    out, _, _, html = fedsm_run
    summary = json.loads((out / "summary.json").read_text())
    sites = summary["sites"]
    for title in ("Test Dice", "Test HD95 (pixels)"):
        assert _body_labels(table(html, title)) == ["Local (own site)", "FedAvg", "FedSM"]
        assert _body_labels(local_models(html, title)) == [
            "Client 1 Local (site1)",
            "Client 2 Local (site2)",
            "Client 3 Local (site3)",
            "Local (own site)",
        ]
    dice = table(html, "Test Dice")
    cross = summary["algorithms"]["local"]["cross_site"]["dice"]
    for k, train in enumerate(sites, start=1):
        cells = row_cells(local_models(html, "Test Dice"), f"Client {k} Local ({train})")
        assert cells[:3] == [f"{cross[train][s]:.4f}" for s in sites]
        assert cells[4] != "–"  # Global: pooled over test cases, from results.csv
    fedsm = [c.replace("<b>", "").replace("</b>", "") for c in row_cells(dice, "FedSM")]
    assert fedsm == [f"{summary['algorithms']['fedsm']['dice'][k]:.4f}" for k in sites + ["client_avg", "global"]]


def test_selector_section_figures_and_features(fedsm_run):
    out, cfg, fed, html = fedsm_run
    summary = json.loads((out / "summary.json").read_text())
    assert "<h2>Model selector (FedSM)</h2>" in html
    for name in ("selector.png", "selector_tsne.png"):
        assert embedded(out, name) in html
        _png(out / "figures" / name, colored=100)

    # validation row = round_metrics.csv at the selected round
    best = summary["algorithms"]["fedsm"]["best_round"]
    with open(out / "round_metrics.csv") as f:
        metrics = [r for r in csv.DictReader(f) if r["algorithm"] == "fedsm" and int(r["round"]) == best]
    acc = {r["site"]: float(r["value"]) for r in metrics if r["metric"] == "selector_acc"}
    sel = table(html, "Model selector (FedSM)")
    cells = row_cells(sel, f"FedSM: validation, round {best}")
    assert cells[:4] == [f"{acc[s]:.3f}" for s in summary["sites"]] + [f"{np.mean(list(acc.values())):.3f}"]
    gamma = next(float(r["value"]) for r in metrics if r["metric"] == "gamma")
    assert cells[5] == f"{gamma:.3f}"

    # only the FedSM family gets a features file; it holds the saved selector's view of every test image
    assert sorted(p.name for p in (out / "selector_features").iterdir()) == ["fedsm.npz"]
    z = np.load(out / "selector_features" / "fedsm.npz")
    bundle = defaultdict(dict)
    for name, t in load_file(out / "model" / "fedsm" / "weights.safetensors").items():
        model, _, key = name.partition("/")
        bundle[model][key] = t
    prep = prepare(cfg, fed)
    sm = super_model_from_bundle(bundle, prep.task.new_model, fed.channels, fed.spatial_dims)
    x = torch.cat([sd.test.x for sd in prep.site_data])
    with torch.no_grad():
        torch.testing.assert_close(torch.from_numpy(z["features"]), sm.selector.embed(x))
        torch.testing.assert_close(torch.from_numpy(z["probs"]), sm.scores(x))
        assert z["chosen"].tolist() == sm.choose(x).tolist()
    assert float(z["gamma"]) == float(bundle["gamma"]["value"])
    assert z["site"].tolist() == [i for i, sd in enumerate(prep.site_data) for _ in range(len(sd.test))]
    assert z["case"].tolist() == [c for sd in prep.site_data for c in sd.test.ids]
    test_cells = row_cells(sel, "FedSM: test")
    own = z["probs"].argmax(1) == z["site"]
    assert test_cells[0] == f"{own[z['site'] == 0].mean():.3f}"


def test_selector_embed_is_the_penultimate_layer():
    sel = build_selector(3, 4, width=0.0625).eval()
    x = torch.rand(5, 3, 32, 32)
    with torch.no_grad():
        feats = sel.embed(x)
        assert feats.shape == (5, sel.head[0].out_features) and (feats >= 0).all()
        torch.testing.assert_close(sel(x), sel.head[-1](feats))


def test_fedavg_only_run_has_no_selector_parts(fedsm_run, tmp_path):
    """The same run's files reduced to FedAvg render without any FedSM section or figure."""
    out = fedsm_run[0]
    summary = json.loads((out / "summary.json").read_text())
    summary["algorithms"] = {"fedavg": summary["algorithms"]["fedavg"]}
    (tmp_path / "summary.json").write_text(json.dumps(summary))
    for name in ("results.csv", "rounds.csv", "round_metrics.csv", "ledger.csv"):
        with open(out / name) as f:
            rows = list(csv.DictReader(f))
        with open(tmp_path / name, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=list(rows[0]))
            w.writeheader()
            w.writerows(r for r in rows if r["algorithm"] == "fedavg")
    html = render_report(tmp_path).read_text()
    assert "Model selector" not in html and "Training curves per model" not in html and "Client 1 Local" not in html
    assert _body_labels(table(html, "Test Dice")) == ["FedAvg"]
    assert not (tmp_path / "figures" / "selector.png").exists()
    assert not (tmp_path / "figures" / "selector_tsne.png").exists()


# --- hand-made inputs ---------------------------------------------------------------------------
def test_algorithm_order_follows_the_paper():
    algs = {a: {} for a in ("fedsm-extra", "fedprox", "fedsm", "local", "scaffold", "fedavg", "centralized")}
    assert algorithm_order({"algorithms": algs}) == [
        "centralized",
        "local",
        "fedavg",
        "fedprox",
        "scaffold",
        "fedsm",
        "fedsm-extra",
    ]


def _features(path, probs, site, chosen, gamma):
    n = len(site)
    np.savez_compressed(
        path,
        features=np.random.default_rng(0).random((n, 6), dtype=np.float32),
        probs=np.array(probs, np.float32),
        chosen=np.array(chosen),
        site=np.array(site),
        sites=np.array(["A", "B", "C"]),
        gamma=np.float64(gamma),
        case=np.array([f"c{i}" for i in range(n)]),
    )


def _fake_run(root):
    """test_report's hand-made run without the example predictions (not needed here, slow to draw)."""
    run = make_run(root)
    shutil.rmtree(run / "samples")
    return run


def test_test_selector_rows_for_k_and_k_plus_1_classes(tmp_path):
    """FedSM: class k = site k; FedSM-extra: class 0 = global model, class k + 1 = site k."""
    run = _fake_run(tmp_path / "run")
    summary = json.loads((run / "summary.json").read_text())
    summary["algorithms"]["fedsm"] = summary["algorithms"]["fedavg"]
    summary["algorithms"]["fedsm-extra"] = summary["algorithms"]["fedavg"]
    (run / "summary.json").write_text(json.dumps(summary))
    copy_algorithm_rows(run, "fedavg", "fedsm", "fedsm-extra")
    (run / "selector_features").mkdir()
    site = [0, 0, 1, 1, 2, 2]
    # FedSM (3 classes): argmax 0,1 | 1,1 | 2,0 -> accuracy A 0.5, B 1, C 0.5; chosen 0 twice at site A
    fedsm_probs = [[0.9, 0.1, 0], [0.4, 0.6, 0], [0, 1, 0], [0, 0.7, 0.3], [0, 0, 1], [0.8, 0.1, 0.1]]
    _features(run / "selector_features" / "fedsm.npz", fedsm_probs, site, [1, 0, 2, 0, 3, 1], 0.5)
    # FedSM-extra (4 classes): argmax 1,0 | 2,3 | 3,3 -> accuracy A 0.5, B 0.5, C 1; argmax global once (A)
    extra = [[0, 1, 0, 0], [1, 0, 0, 0], [0, 0, 1, 0], [0, 0, 0, 1], [0, 0, 0, 1], [0, 0.2, 0, 0.8]]
    _features(run / "selector_features" / "fedsm-extra.npz", extra, site, [1, 0, 2, 3, 3, 3], float("nan"))
    html = render_report(run).read_text()
    sel = table(html, "Model selector (FedSM)")
    assert _body_labels(sel) == ["FedSM: test", "FedSM-extra: test"]
    assert row_cells(sel, "FedSM: test") == [
        "0.500",
        "1.000",
        "0.500",
        "0.667",
        f"{np.mean([0.5, 0.5, 0]):.3f}",
        "0.500",
    ]
    assert row_cells(sel, "FedSM-extra: test") == [
        "0.500",
        "0.500",
        "1.000",
        "0.667",
        f"{np.mean([0.5, 0, 0]):.3f}",
        "–",
    ]
    _png(run / "figures" / "selector_tsne.png", colored=100)
    assert not (run / "figures" / "selector.png").exists()  # no round_metrics.csv


def test_per_model_curves_from_round_metrics(tmp_path):
    run = _fake_run(tmp_path / "run")
    summary = json.loads((run / "summary.json").read_text())
    summary["algorithms"]["fedsm"] = {**summary["algorithms"]["fedavg"], "best_round": 2}
    (run / "summary.json").write_text(json.dumps(summary))
    copy_algorithm_rows(run, "fedavg", "fedsm")
    rows = []
    for rnd in (1, 2, 3):
        for s in ("A", "B", "C"):
            for metric, value in (
                ("selector_acc", 0.3 * rnd),
                ("global_frac", 1 - 0.3 * rnd),
                ("val_dice_global", 0.2 * rnd),
                ("val_dice_personal", 0.25 * rnd),
                ("train_loss_selector", 1 / rnd),
            ):
                rows.append({"algorithm": "fedsm", "round": rnd, "site": s, "metric": metric, "value": value})
        rows.append({"algorithm": "fedsm", "round": rnd, "site": "all", "metric": "gamma", "value": 0.5})
    with open(run / "round_metrics.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=["algorithm", "round", "site", "metric", "value"])
        w.writeheader()
        w.writerows(rows)
    html = render_report(run).read_text()
    assert "<h2>Training curves per model</h2>" in html and embedded(run, "curves_fedsm.png") in html
    _png(run / "figures" / "curves_fedsm.png", colored=500)
    _png(run / "figures" / "selector.png", colored=500)
    assert row_cells(table(html, "Model selector (FedSM)"), "FedSM: validation, round 2")[:4] == ["0.600"] * 4
    # FedSM is last in every table (after FedAvg and FedProx)
    assert _body_labels(table(html, "Test Dice"))[-3:] == ["FedAvg", "FedProx", "FedSM"]
    # a later render without those metrics leaves no stale curve figure behind
    (run / "round_metrics.csv").unlink()
    render_report(run)
    assert not (run / "figures" / "curves_fedsm.png").exists()


def test_t_sne_map_is_skipped_for_degenerate_features():
    """All-zero (identical) or non-finite selector features have no neighbourhoods: no map, not a crash (the
    Barnes-Hut t-SNE used to take the process down on them); real features get one."""
    import numpy as np

    from fedseg.presentation.figures import project_2d

    assert project_2d(np.zeros((20, 64))) is None
    assert project_2d(np.full((20, 4), np.nan)) is None
    xy = project_2d(np.random.default_rng(0).normal(size=(30, 8)))
    assert xy is not None and xy.shape == (30, 2) and np.isfinite(xy).all()
