"""The HTML report from a small hand-made run directory (test input written here)."""

from __future__ import annotations

import base64
import csv
import json
import re
import shutil

import numpy as np
import pytest

from fedseg.report.html import load_run, render_report

SITES = ["A", "B", "C"]
REGIONS = ["disc", "cup"]
# Dice per (algorithm, model, test site); each site has 2 cases at v +- 0.01, so site mean = v.
DICE = {
    ("centralized", "global"): {"A": 0.9511, "B": 0.9422, "C": 0.9333},
    ("fedavg", "global"): {"A": 0.8123, "B": 0.8456, "C": 0.7789},
    ("fedprox", "global"): {"A": 0.8011, "B": 0.8567, "C": 0.7655},
    ("local", "local:A"): {"A": 0.9012, "B": 0.3141, "C": 0.5926},
    ("local", "local:B"): {"A": 0.2718, "B": 0.8828, "C": 0.4142},
    ("local", "local:C"): {"A": 0.6180, "B": 0.5772, "C": 0.8660},
}
HD95 = {"centralized": 2.5, "fedavg": 4.25, "fedprox": 3.75, "local": 6.0}


def write_csv(path, columns, rows):
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=columns)
        w.writeheader()
        w.writerows(rows)


def site_entry(values):
    return {
        **values,
        "client_avg": float(np.mean(list(values.values()))),
        "global": float(np.mean(list(values.values()))),
    }


def copy_algorithm_rows(run, source: str, *names: str) -> None:
    """Append ``source``'s rows of ``rounds.csv`` and ``ledger.csv`` as ``names``' rows: a hand-made entry that copies
    ``source``'s summary.json entry has its training files too (the report checks each against summary.json)."""
    for file in ("rounds.csv", "ledger.csv"):
        with open(run / file, newline="") as f:
            rows = list(csv.DictReader(f))
        copies = [{**r, "algorithm": name} for name in names for r in rows if r["algorithm"] == source]
        with open(run / file, "a", newline="") as f:
            csv.DictWriter(f, list(rows[0])).writerows(copies)


def make_run(root):
    """A complete fake run directory: summary, results, rounds, ledger, samples, config."""
    root.mkdir(parents=True, exist_ok=True)
    results = []
    for (alg, model), per_site in DICE.items():
        for site, v in per_site.items():
            for case, d in ((f"{site}1", 0.01), (f"{site}2", -0.01)):
                for region in REGIONS:
                    base = dict(algorithm=alg, model=model, site=site, case=case, region=region)
                    results.append({**base, "metric": "dice", "value": v + d})
                    results.append(
                        {
                            **base,
                            "metric": "hd95",
                            "value": HD95[alg] + (1.0 if model != f"local:{site}" and alg == "local" else 0.0),
                        }
                    )
    write_csv(root / "results.csv", ["algorithm", "model", "site", "case", "region", "metric", "value"], results)

    algorithms = {}
    for alg in ("centralized", "local", "fedavg", "fedprox"):
        model = "local:{}" if alg == "local" else "global"
        dice = {s: DICE[(alg, model.format(s))][s] for s in SITES}
        algorithms[alg] = {
            "dice": site_entry(dice),
            "hd95": site_entry({s: HD95[alg] for s in SITES}),
            "rounds": 4,
            "best_round": 3,
            "floats_sent": 123456789 if alg == "fedavg" else 2000000,
            "sgd_steps": 480,
            "seconds": 12.5,
        }
    algorithms["local"]["cross_site"] = {
        "dice": {a: {b: DICE[("local", f"local:{a}")][b] for b in SITES} for a in SITES}
    }
    algorithms["local"]["local_avg"] = 0.8833
    algorithms["local"]["local_gen"] = 0.4647
    summary = {"dataset": "toy-retina", "sites": SITES, "regions": REGIONS, "algorithms": algorithms}
    (root / "summary.json").write_text(json.dumps(summary, indent=2))

    rounds, ledger = [], []
    for alg in algorithms:
        for rnd in range(1, 5):
            for site in SITES:
                rounds.append(dict(algorithm=alg, round=rnd, site=site, val_dice=0.5 + 0.1 * rnd, train_loss=1.0 / rnd))
                ledger.append(
                    dict(
                        algorithm=alg,
                        round=rnd,
                        site=site,
                        action="train",
                        steps=40,
                        floats_down=1000,
                        floats_up=500,
                        seconds=1.0,
                    )
                )
            ledger.append(
                dict(
                    algorithm=alg,
                    round=rnd,
                    site="A",
                    action="evaluate",
                    steps=0,
                    floats_down=99999,
                    floats_up=0,
                    seconds=0.5,
                )
            )
    write_csv(root / "rounds.csv", ["algorithm", "round", "site", "val_dice", "train_loss"], rounds)
    write_csv(
        root / "ledger.csv",
        ["algorithm", "round", "site", "action", "steps", "floats_down", "floats_up", "seconds"],
        ledger,
    )

    (root / "samples").mkdir(exist_ok=True)
    yy, xx = np.mgrid[:32, :32]
    disc = ((yy - 16) ** 2 + (xx - 16) ** 2 < 100).astype(np.uint8)
    cup = ((yy - 16) ** 2 + (xx - 16) ** 2 < 25).astype(np.uint8)
    truth = np.stack([disc, cup])
    for alg in algorithms:
        for site in SITES:
            np.savez_compressed(
                root / "samples" / f"{alg}__{site}.npz",
                image=np.random.default_rng(0).random((3, 32, 32), dtype=np.float32),
                truth=truth,
                pred=np.roll(truth, 2, axis=2),
                case=np.array(f"{site}1"),
            )
    (root / "config.yaml").write_text("seed: 0\nalgorithms: [centralized, local, fedavg, fedprox]\n")
    return root


def embedded(page_dir, name):
    """The ``src`` attribute of figure ``name`` embedded from ``page_dir/figures``."""
    return f'src="data:image/png;base64,{base64.b64encode((page_dir / "figures" / name).read_bytes()).decode()}"'


def assert_self_contained(html):
    """Every image is embedded PNG data: no ``src`` points to a file beside the page."""
    srcs = re.findall(r'<img[^>]*\ssrc="([^"]*)"', html)
    assert srcs and len(srcs) == html.count("<img")
    for src in srcs:
        assert src.startswith("data:image/png;base64,"), src[:60]
        assert base64.b64decode(src.split(",", 1)[1], validate=True).startswith(b"\x89PNG\r\n\x1a\n")
    assert not re.search(r'\ssrc="(?!data:)', html)


def table(html, title):
    """The HTML of the table following the section heading ``title``."""
    start = html.index(f"<h2>{title}</h2>")
    return html[start : html.index("</table>", start)]


def local_models(html, title):
    """The table under ``<h3>title</h3>`` of the section of the "Client k Local" rows."""
    start = html.index("<h3>" + title + "</h3>", html.index("<h2>Local models on every site (Client k Local)</h2>"))
    return html[start : html.index("</table>", start)]


def row_cells(table_html, label):
    m = re.search(rf"<tr[^>]*><th>{re.escape(label)}</th>(.*?)</tr>", table_html)
    assert m, f"no row {label!r}"
    return re.findall(r"<td>(.*?)</td>", m.group(1))


def test_full_report(tmp_path):
    run = make_run(tmp_path / "run")
    out = render_report(run)
    assert out == run / "report.html"
    html = out.read_text()

    dice = table(html, "Test Dice")
    labels = re.findall(r"<tr[^>]*><th>(.*?)</th>", dice.split("<tbody>")[1])
    assert labels == ["Centralized", "Local (own site)", "FedAvg", "FedProx"]  # "Client k Local": own section
    local_dice = local_models(html, "Test Dice")
    assert re.findall(r"<tr[^>]*><th>(.*?)</th>", local_dice.split("<tbody>")[1]) == [
        "Client 1 Local (A)",
        "Client 2 Local (B)",
        "Client 3 Local (C)",
        "Local (own site)",
    ]
    # federated rows: best per column bold (FedAvg wins A, C and the averages; FedProx wins B)
    assert row_cells(dice, "FedAvg")[:3] == ["<b>0.8123</b>", "0.8456", "<b>0.7789</b>"]
    assert row_cells(dice, "FedProx")[:3] == ["0.8011", "<b>0.8567</b>", "0.7655"]
    # centralized is better everywhere but is a baseline: never bold
    assert row_cells(dice, "Centralized")[:3] == ["0.9511", "0.9422", "0.9333"]
    # cross-site rows come from results.csv, with Client Avg and Global
    b_local = row_cells(local_dice, "Client 2 Local (B)")
    assert b_local[:3] == ["0.2718", "0.8828", "0.4142"]
    assert b_local[3] == f"{np.mean([0.2718, 0.8828, 0.4142]):.4f}"
    assert b_local[4] == b_local[3]  # equal case counts: global = client avg
    assert row_cells(dice, "Local (own site)")[:3] == ["0.9012", "0.8828", "0.8660"]

    hd = table(html, "Test HD95 (pixels / voxels)")
    assert row_cells(hd, "FedProx")[0] == "<b>3.75</b>"  # lower is better
    assert row_cells(hd, "FedAvg")[0] == "4.25"
    local_hd = local_models(html, "Test HD95 (pixels / voxels)")
    assert row_cells(local_hd, "Client 1 Local (A)")[:2] == ["6.00", "7.00"]  # off-diagonal cells have +1 in the rows

    regions = table(html, "Per-region scores (mean ± std over test cases)")
    assert (
        row_cells(regions, "FedAvg")[0]
        == f"{np.mean([0.8123, 0.8456, 0.7789]):.3f} ± "
        + f"{np.std([v + d for v in (0.8123, 0.8456, 0.7789) for d in (0.01, -0.01)], ddof=1):.3f}"
    )

    ledger = table(html, "Communication and compute")
    cells = row_cells(ledger, "FedAvg")
    # rounds, best, down, up (evaluation rows excluded), sent, MB, steps, wall time
    assert "<th>SGD steps</th><th>Wall time (s, load-dependent)</th>" in ledger
    assert cells == ["4", "3", "12,000", "6,000", "123,456,789", "493.8", "480", "12.5"]

    assert "Local avg</b> (diagonal" in html and "0.8833" in html and "0.4647" in html
    for name in ("validation.png", "cross_site.png", "samples.png"):
        assert (run / "figures" / name).stat().st_size > 1000
        assert f'src="figures/{name}"' not in html  # embedded, not linked
        assert embedded(run, name) in html
    assert_self_contained(html)
    assert "<details><summary>config.yaml</summary>" in html and "seed: 0" in html
    assert "http" not in html and "<script" not in html


def test_missing_optional_files(tmp_path):
    run = make_run(tmp_path / "run")
    render_report(run)  # leaves figures behind that must not survive the next render
    for name in ("results.csv", "rounds.csv", "ledger.csv", "config.yaml"):
        (run / name).unlink()
    shutil.rmtree(run / "samples")
    html = render_report(run).read_text()
    assert not (run / "figures" / "validation.png").exists()
    assert not (run / "figures" / "samples.png").exists()
    assert "figures/validation.png" not in html and "figures/samples.png" not in html
    assert "Per-region" not in html and "<details>" not in html
    # cross-site rows fall back to summary.json (Dice only; no Global without results.csv)
    assert row_cells(local_models(html, "Test Dice"), "Client 2 Local (B)") == [
        "0.2718",
        "0.8828",
        "0.4142",
        f"{np.mean([0.2718, 0.8828, 0.4142]):.4f}",
        "–",
    ]
    assert "Client 2 Local (B)" not in table(html, "Test HD95 (pixels / voxels)")
    assert (run / "figures" / "cross_site.png").exists()
    # ledger from summary.json alone: no down/up split
    assert row_cells(table(html, "Communication and compute"), "FedAvg")[2:5] == ["–", "–", "123,456,789"]


def test_no_local_and_minimal_summary(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    summary = {
        "dataset": "d",
        "sites": ["A"],
        "regions": ["prostate"],
        "algorithms": {"fedavg": {"dice": {"A": 0.5, "client_avg": 0.5, "global": 0.5}}},
    }
    (run / "summary.json").write_text(json.dumps(summary))
    (run / "samples").mkdir()
    (run / "samples" / "broken__A.npz").write_bytes(b"not a zip")
    html = render_report(run).read_text()
    assert "<b>0.5000</b>" in html
    assert "Local training across sites" not in html and "HD95" not in html.split("Communication")[0]
    assert "Model selector" not in html and "Training curves per model" not in html
    assert not (run / "figures" / "cross_site.png").exists()


def test_nan_values_render_as_dash(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    summary = {
        "sites": ["A", "B"],
        "regions": ["r"],
        "algorithms": {
            "fedavg": {
                "dice": {"A": 0.7, "B": 0.6, "client_avg": 0.65, "global": 0.65},
                "hd95": {"A": float("nan"), "B": 3.0, "client_avg": 3.0, "global": 3.0},
            }
        },
    }
    (run / "summary.json").write_text(json.dumps(summary))  # NaN, as run outputs wrote it before null
    hd = table(render_report(run).read_text(), "Test HD95 (pixels / voxels)")
    assert row_cells(hd, "FedAvg")[:2] == ["–", "<b>3.00</b>"]


def test_missing_summary_raises(tmp_path):
    with pytest.raises(FileNotFoundError):
        render_report(tmp_path)


def test_load_run_reads_samples(tmp_path):
    run = load_run(make_run(tmp_path / "run"))
    assert set(run.samples) == set(SITES)
    assert set(run.samples["A"]) == {"centralized", "local", "fedavg", "fedprox"}
    assert run.samples["B"]["fedavg"]["truth"].shape == (2, 32, 32)


def test_a_method_selected_at_its_last_round_is_flagged_as_maybe_not_converged(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    entry = {"dice": {"A": 0.5, "client_avg": 0.5, "global": 0.5}, "rounds": 5}
    summary = {
        "sites": ["A"],
        "regions": ["r"],
        "algorithms": {"fedavg": {**entry, "best_round": 5}, "fedprox": {**entry, "best_round": 3}},
    }
    (run / "summary.json").write_text(json.dumps(summary))
    html = render_report(run).read_text()
    assert "May not have converged</b>: FedAvg —" in html and "FedProx —" not in html
    summary["algorithms"]["fedavg"]["best_round"] = 4
    (run / "summary.json").write_text(json.dumps(summary))
    assert "May not have converged" not in render_report(run).read_text()


def test_cost_table_gives_floats_in_total_and_per_site_and_evaluation_floats_apart(tmp_path):
    run = make_run(tmp_path / "run")
    summary = json.loads((run / "summary.json").read_text())
    cost = {"sgd_steps": 480, "parallel_sgd_steps": 160, "forward_batches": 0, "simulated_hours": 0.5}
    summary["algorithms"]["fedavg"]["cost"] = {**cost, "floats": 6000 * len(SITES), "eval_floats": 300 * len(SITES)}
    (run / "summary.json").write_text(json.dumps(summary))
    cost_table = table(render_report(run).read_text(), "Cost (FeTS Table 2)")
    assert "<th>Communicated floats (all sites)</th>" in cost_table and "<th>per site</th>" in cost_table
    assert row_cells(cost_table, "FedAvg")[3:6] == [f"{6000 * len(SITES):,}", "6,000", "300"]


def test_the_hd95_table_names_the_unit_summary_json_records(tmp_path):
    run = make_run(tmp_path / "run")
    summary = json.loads((run / "summary.json").read_text())
    summary["hd95_unit"] = "mm"  # the volume path: each case's own grid and spacing
    (run / "summary.json").write_text(json.dumps(summary))
    assert "<h2>Test HD95 (mm)</h2>" in render_report(run).read_text()


@pytest.mark.parametrize(
    ("data", "shown", "absent"),
    [
        (
            {"split": {"mode": "ratio"}, "repartition": {"mode": "none"}},
            ["Data: synthetic-retina", "ratio split"],
            ["IID"],
        ),
        (
            {"split": {"mode": "kfold", "folds": 5, "fold": 2}, "repartition": {"mode": "iid", "sites": 10}},
            ["federated 5-fold split, fold 2 tested", "IID repartition: every case dealt to 10 synthetic sites"],
            ["limited"],
        ),
        (
            {
                "split": {"mode": "ratio"},
                "repartition": {
                    "mode": "limited",
                    "max_cases": 35,
                    "drop_sites": ["s1"],
                    "require": "grade",
                    "holdout": "s3",
                },
            },
            [
                "limited repartition (at most 35 cases per site; sites dropped: s1; "
                "cases without &#x27;grade&#x27; dropped)",
                "site s3 held out of training (unseen)",
            ],
            ["IID"],
        ),
    ],
)
def test_the_report_header_names_the_split_protocol_and_the_repartition(tmp_path, data, shown, absent):
    run = make_run(tmp_path / "run")
    (run / "config.yaml").write_text(json.dumps({"data": {"source": "synthetic-retina", **data}}))
    header = render_report(run).read_text().split("<h2", 1)[0]
    for text in shown:
        assert text in header
    for text in absent:
        assert text not in header


def add_nsd(run, tolerance=1.5) -> None:
    """``make_run``'s run as scored with NSD: per case and region NSD = Dice / 2 (site mean = Dice / 2)."""
    with open(run / "results.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    rows += [{**r, "metric": "nsd", "value": float(r["value"]) / 2} for r in rows if r["metric"] == "dice"]
    write_csv(run / "results.csv", list(rows[0]), rows)
    summary = json.loads((run / "summary.json").read_text())
    summary["nsd_tolerance"], summary["hd95_unit"] = tolerance, "mm"
    for entry in summary["algorithms"].values():
        entry["nsd"] = {k: v / 2 for k, v in entry["dice"].items()}
    (run / "summary.json").write_text(json.dumps(summary))


def test_nsd_gets_its_table_and_region_columns_and_an_old_run_renders_as_before(tmp_path):
    old = make_run(tmp_path / "old")
    before = render_report(old).read_text()
    assert "<h2>Test NSD" not in before and "NSD</th>" not in before  # written before NSD existed: no NSD table
    run = make_run(tmp_path / "run")
    add_nsd(run)
    html = render_report(run).read_text()
    nsd = table(html, "Test NSD (τ 1.5 mm)")
    fedavg = DICE[("fedavg", "global")]
    # NSD = Dice / 2 here: the same best numbers in bold as Dice (higher is better for both)
    dice_cells = row_cells(table(html, "Test Dice"), "FedAvg")[:3]
    halved = [c.replace(f"{fedavg[s]:.4f}", f"{fedavg[s] / 2:.4f}") for c, s in zip(dice_cells, SITES)]
    assert row_cells(nsd, "FedAvg")[:3] == halved and "<b>" in "".join(halved)
    assert "(higher is better)" in html[html.index("<h2>Test NSD") :]
    regions = table(html, "Per-region scores (mean ± std over test cases)")
    assert "<th>disc NSD</th><th>cup NSD</th>" in regions
    cases = [(fedavg[s] + d) / 2 for s in SITES for d in (0.01, -0.01)]
    assert row_cells(regions, "FedAvg")[4] == f"{np.mean(cases):.3f} ± {np.std(cases, ddof=1):.3f}"  # disc NSD
    # the Dice and HD95 tables as in the run without NSD
    assert table(html, "Test Dice") == table(before, "Test Dice")
    hd95, old_hd95 = table(html, "Test HD95 (mm)"), table(before, "Test HD95 (pixels / voxels)")
    assert hd95[hd95.index("<table") :] == old_hd95[old_hd95.index("<table") :]
