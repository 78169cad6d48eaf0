"""The report's verdict, its legend lines and layout, the sample contours and ``fedseg algorithms`` at 80 columns
(hand-made run folders of ``test_report.make_run``: no training)."""

from __future__ import annotations

import csv
import json
import re

import numpy as np
import pytest
from matplotlib.figure import Figure
from typer.testing import CliRunner

from fedseg.cli import app, print_verdict
from fedseg.evaluate import stats
from fedseg.presentation import figures
from fedseg.presentation.kit import CSS
from fedseg.report.html import load_run, render_report
from fedseg.report.verdict import CHOSEN_AFTER, routing_notes, summary_lines, verdict
from test_report import copy_algorithm_rows, make_run, table

FEDAVG, FEDPROX = (
    np.mean([0.8123, 0.8456, 0.7789]),
    np.mean([0.8011, 0.8567, 0.7655]),
)  # Client Avg of test_report's FedAvg and FedProx rows


def add_fedsm_routed_to_global(run):
    """A FedSM entry whose scores are FedAvg's (every test image routed to the global model: selector_features)."""
    summary = json.loads((run / "summary.json").read_text())
    summary["algorithms"]["fedsm"] = {**summary["algorithms"]["fedavg"], "display_name": "FedSM", "family": "FedSM"}
    (run / "summary.json").write_text(json.dumps(summary))
    with open(run / "results.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    copied = [{**r, "algorithm": "fedsm", "model": "fedsm"} for r in rows if r["algorithm"] == "fedavg"]
    with open(run / "results.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows + copied)
    copy_algorithm_rows(run, "fedavg", "fedsm")
    (run / "selector_features").mkdir()
    n = 6
    np.savez(
        run / "selector_features" / "fedsm.npz",
        features=np.random.default_rng(0).random((n, 4)),
        probs=np.full((n, 3), 1 / 3),
        chosen=np.zeros(n, dtype=np.int64),
        site=np.repeat(np.arange(3), 2),
        sites=np.array(["A", "B", "C"]),
        gamma=np.array(1.0),
    )


def test_verdict_names_the_best_federated_method_and_tests_the_runner_up(tmp_path):
    run = make_run(tmp_path / "run")
    v = verdict(load_run(run))
    assert (
        v is not None and v.best == "fedavg" and v.score == pytest.approx(FEDAVG)
    )  # Centralized scores higher: a baseline
    assert v.runner_up == "fedprox" and v.differences["fedprox"].table_diff == pytest.approx(FEDAVG - FEDPROX)
    test = v.differences["fedprox"].test
    # 6 cases paired (site, case): FedAvg - FedProx = +0.0112 (A), -0.0111 (B), +0.0134 (C), two cases each
    assert test["n"] == 6 and test["mean_diff"] == pytest.approx(np.mean([0.0112, -0.0111, 0.0134]))
    assert test["ci_low"] < 0 < test["ci_high"] and v.within_noise == ["fedprox"] and not v.clear

    html = render_report(run).read_text()
    top = html[: html.index("<h2>")]
    assert '<div class="verdict">' in top
    assert f"Best on test Dice, Client Avg: FedAvg at {FEDAVG:.4f}." in top
    # the CI is of the number ranked on, the Client Avg difference (of the paired cases: each site's mean, averaged)
    assert test["site_mean_diff"] == pytest.approx(np.mean([0.0112, -0.0111, 0.0134]))
    assert (
        f"Over the runner-up FedProx ({FEDPROX:.4f}): Client Avg +{FEDAVG - FEDPROX:.4f} (site means averaged), "
        "95% CI [" in top
    )
    assert "per-case Wilcoxon p = " in top and "(6 cases): within noise" in top
    assert "Within noise of the best (CI includes 0 or Holm-adjusted p ≥ 0.05): FedProx" in top
    assert "Not ranked (baselines, references only): Centralized, Local." in top
    assert "converged" not in top  # best round 3 of 4: no warning
    # the terminal says so right under the headline: the Dice table above it shows Centralized higher
    assert summary_lines(run)[:3] == [
        f"Best on test Dice, Client Avg: FedAvg at {FEDAVG:.4f}.",
        "Not ranked (baselines, references only): Centralized, Local.",
        CHOSEN_AFTER,  # the report's note says it too: the best was picked on the scores it is compared on
    ]


def test_verdict_says_when_methods_have_not_converged(tmp_path):
    run = make_run(tmp_path / "run")
    summary = json.loads((run / "summary.json").read_text())
    summary["algorithms"]["fedprox"]["convergence"] = {"converged": False}
    (run / "summary.json").write_text(json.dumps(summary))
    lines = summary_lines(run)
    assert lines[-1].startswith("May not have converged: FedProx (the round selected on validation")
    for e in summary["algorithms"].values():
        e["convergence"] = {"converged": False}
    (run / "summary.json").write_text(json.dumps(summary))
    assert summary_lines(run)[-1].startswith("Not converged: none of the 4 methods had reached a plateau")


def test_a_run_of_one_round_is_said_not_shown_converged(tmp_path):
    """One round trained: its summary says converged false (nothing showed a plateau), and so does the verdict (it
    skipped such runs: a 1-round run on the reader's own data was ranked with no warning)."""
    run = make_run(tmp_path / "run")
    summary = json.loads((run / "summary.json").read_text())
    for e in summary["algorithms"].values():
        e["rounds"], e["best_round"], e["convergence"] = 1, 1, {"converged": False}
    summary["algorithms"]["fedavg"]["convergence"] = {"converged": True}  # as a plateau rule could say
    (run / "summary.json").write_text(json.dumps(summary))
    assert summary_lines(run)[-1].startswith("May not have converged: Centralized, Local, FedProx (the round")


def test_the_legend_says_what_was_scored_and_the_worst_hd95_used(tmp_path):
    run = make_run(tmp_path / "run")
    html = render_report(run).read_text()  # a run of an older fedseg: neither recorded
    assert "eval.hd95_worst, by default the diagonal of the case's grid" in html and "eval.score_on" not in html
    summary = json.loads((run / "summary.json").read_text())
    scoring = {"score_on": "label_map", "score_grid": "original"}
    (run / "summary.json").write_text(json.dumps({**summary, "hd95_worst": 373.13, **scoring}))
    html = render_report(run).read_text()
    assert "(373.13 pixels / voxels, eval.hd95_worst)" in html and "(eval.score_on: label_map), as fedseg" in html
    assert "Scored on each image's own grid (eval.score_grid: original;" in html
    (run / "summary.json").write_text(json.dumps({**summary, "hd95_worst": None, "score_on": "channels"}))
    html = render_report(run).read_text()
    assert "(the diagonal of the case's grid, eval.hd95_worst unset)" in html
    assert "(eval.score_on: channels): with nested regions a written mask" in html


def test_fedsm_routed_to_the_global_model_is_said_in_the_terminal_summary(tmp_path, capsys):
    run = make_run(tmp_path / "run")
    add_fedsm_routed_to_global(run)
    assert routing_notes(load_run(run)) == [
        "FedSM routed all 6 test images to its global model (threshold γ = 1.00, chosen on validation): its test "
        "scores are the global model's, equal to fedavg's; its personalized models were never used."
    ]
    print_verdict(run)
    out = " ".join(capsys.readouterr().out.split())
    assert out.startswith(f"verdict: Best on test Dice, Client Avg: FedAvg at {FEDAVG:.4f}, tied with FedSM")
    assert "(identical scores on every test case)" in out
    assert "FedSM routed all 6 test images to its global model (threshold γ = 1.00" in out
    assert "equal to FedAvg's; its personalized models were never used." in out
    html = render_report(run).read_text()
    assert "FedSM routed all 6 test images to its global model" in html[: html.index("<h2>")]


@pytest.mark.parametrize("columns", [60, 80, 300])
def test_the_terminal_verdict_puts_each_comparison_s_finding_first_and_its_numbers_under_it(
    tmp_path, capsys, monkeypatch, columns
):
    """A comparison line (runner-up, each baseline) ran to some 270 characters, its finding last: on a wide terminal
    one line that long, on a narrow one a block. The terminal now prints the comparison and its finding, then the
    test's numbers four spaces in, within the terminal's width and at most 100 columns; every number of the lines
    is still printed, and the lines themselves (the report's sentences) are unchanged."""
    from fedseg import cli

    run = make_run(tmp_path / "run")
    lines = summary_lines(run)
    assert max(len(line) for line in lines) > 200  # the sentences, as the HTML report prints them
    monkeypatch.setattr(cli.console, "width", columns)
    print_verdict(run)
    out = capsys.readouterr().out.splitlines()
    assert max(len(line) for line in out) <= min(columns, 100)
    said = " ".join(" ".join(out).split())
    for baseline, diff in (("Local", "−0.0711"), ("Centralized", "−0.1299")):
        start = said.index(f"- FedAvg − {baseline} (baseline, ")
        finding = said.index(f"Client Avg {diff} (site means averaged): within noise.", start)
        assert finding < said.index("95% CI [", start)
    details = [k for k, line in enumerate(out) if line.startswith("    95% CI [")]
    assert len(details) == 3 and all(out[k - 1].endswith(" noise.") for k in details)
    numbers = re.compile(r"[−+]?\d+(?:\.\d+)?")
    assert sorted(numbers.findall(" ".join(out))) == sorted(numbers.findall(" ".join(lines)))


def test_no_verdict_without_scores(tmp_path):
    run = make_run(tmp_path / "run")
    summary = json.loads((run / "summary.json").read_text())
    for e in summary["algorithms"].values():
        e.pop("dice")
    (run / "summary.json").write_text(json.dumps(summary))
    assert verdict(load_run(run)) is None and summary_lines(run) == []


def test_a_federated_method_without_a_score_is_no_baseline(tmp_path):
    """Every federated method unscored (its Client Avg null): the baselines are ranked, as in a run of baselines
    only, and the unscored federated methods were listed among them as "Not ranked (baselines...)" (a reviewer)."""
    run = make_run(tmp_path / "run")
    summary = json.loads((run / "summary.json").read_text())
    federated = [a for a, e in summary["algorithms"].items() if a in ("fedavg", "fedprox")]
    for a in federated:
        summary["algorithms"][a]["dice"]["client_avg"] = None
    (run / "summary.json").write_text(json.dumps(summary))
    v = verdict(load_run(run))
    assert v is not None and v.best not in federated and not v.baselines
    assert not [line for line in summary_lines(run) if line.startswith("Not ranked")]


def test_every_table_that_bolds_has_a_legend_and_client_k_local_rows_have_their_own_section(tmp_path):
    html = render_report(make_run(tmp_path / "run")).read_text()
    tables = re.findall(r"<table.*?</table></div>(.{0,80})", html, flags=re.S)
    bolding = [
        t for t in re.findall(r"<table.*?</table></div>.{0,80}", html, flags=re.S) if "<b>" in t.split("</table>")[0]
    ]
    assert tables and bolding
    for t in bolding:
        assert t.split("</table></div>")[1].startswith('<p class="legend"><b>Bold</b>: the best number of each column')
    assert "Client 1 Local" not in table(html, "Test Dice") + table(html, "Test HD95 (pixels / voxels)")
    section = html[html.index("<h2>Local models on every site (Client k Local)</h2>") :]
    assert "<h3>Test Dice</h3>" in section and "Client 3 Local (C)" in section
    assert "Nothing is bold" in section and "<b>0." not in section[: section.index("</table>")]


def test_tables_wrap_their_headers_instead_of_widening_the_page():
    th = re.search(r"table\.scores thead th \{([^}]*)\}", CSS).group(1)
    assert "max-width" in th and "overflow-wrap: anywhere" in th
    assert "white-space: nowrap" not in re.search(r"table\.scores th, table\.scores td \{([^}]*)\}", CSS).group(1)
    assert re.search(r"\.wide \{[^}]*overflow-x: auto", CSS)


def test_sample_contours_tell_regions_and_truth_from_prediction_apart():
    assert figures.REGION_COLORS[:2] == ("#56B4E9", "#F0E442")  # Okabe–Ito sky blue and yellow
    assert set(figures.REGION_COLORS) <= set(figures.PALETTE)
    yy, xx = np.mgrid[:32, :32]
    truth = np.stack([(yy - 16) ** 2 + (xx - 16) ** 2 < 100, (yy - 16) ** 2 + (xx - 16) ** 2 < 25]).astype(np.uint8)
    ax = Figure().subplots()
    figures._draw_panel(ax, np.random.default_rng(0).random((3, 32, 32)), np.roll(truth, 2, axis=2), truth=truth)
    drawn = [(c.get_linestyle()[0][1] is not None, tuple(c.get_edgecolor()[0].round(3))) for c in ax.collections]
    assert len(drawn) == 4  # truth of 2 regions (dashed), then the prediction's (solid)
    assert [dashed for dashed, _ in drawn] == [True, True, False, False]
    assert drawn[0][1] == drawn[2][1] != drawn[1][1] == drawn[3][1]  # one colour per region


def test_algorithms_fits_80_columns_and_long_prints_everything():
    from fedseg.algorithms import ALGORITHMS

    result = CliRunner().invoke(app, ["algorithms"], env={"COLUMNS": "80"})
    assert result.exit_code == 0
    lines = result.output.splitlines()
    assert lines[0].split() == ["name", "kind", "summary"] and max(map(len, lines)) <= 80
    assert [line.split()[:2] for line in lines[1 : 1 + len(ALGORITHMS)]] == [[n, s.kind] for n, s in ALGORITHMS.items()]
    assert "fedseg algorithms --long" in result.output
    wide = CliRunner().invoke(app, ["algorithms"], env={"COLUMNS": "250"})
    assert ALGORITHMS["fedavg"].description.split(": ", 1)[1][1:] in wide.output  # whole when it fits
    long = CliRunner().invoke(app, ["algorithms", "--long"], env={"COLUMNS": "400"})
    assert long.exit_code == 0 and "display name" in long.output and "min sites" in long.output
    assert ALGORITHMS["bulyan"].description in long.output


def test_verdict_compares_with_fedavg_when_it_is_not_the_runner_up(tmp_path):
    run = make_run(tmp_path / "run")
    summary = json.loads((run / "summary.json").read_text())
    with open(run / "results.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    fedprox = summary["algorithms"]["fedprox"]
    for name, gain in (("scaffold", 0.05), ("fedadam", 0.04)):  # FedProx's scores + gain: above FedAvg
        summary["algorithms"][name] = {**fedprox, "dice": {k: v + gain for k, v in fedprox["dice"].items()}}
        rows += [
            {**r, "algorithm": name, "value": float(r["value"]) + gain * (r["metric"] == "dice")}
            for r in rows
            if r["algorithm"] == "fedprox"
        ]
    (run / "summary.json").write_text(json.dumps(summary))
    with open(run / "results.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    head, baselines, chosen, *lines = summary_lines(run)
    assert head == f"Best on test Dice, Client Avg: SCAFFOLD at {FEDPROX + 0.05:.4f}."
    assert baselines == "Not ranked (baselines, references only): Centralized, Local." and chosen == CHOSEN_AFTER
    lines = [head, *lines]
    # every case 0.01 better than FedAdam's: a constant paired difference, its CI a single point above 0, but 6
    # cases give a two-sided Wilcoxon p of 1/32 at best, times 3 comparisons with the best (Holm): within noise
    assert lines[1].startswith(
        f"Over the runner-up FedAdam ({FEDPROX + 0.04:.4f}): Client Avg +0.0100 (site means averaged), 95% CI "
        "[+0.0100, +0.0100], "
    )
    assert lines[1].endswith("per-case Wilcoxon p = 0.094 (Holm, 3 comparisons) (6 cases): within noise.")
    assert lines[2].startswith(f"Over FedAvg ({FEDAVG:.4f}): Client Avg +{FEDPROX + 0.05 - FEDAVG:.4f} (site means ")


def write_two_methods(run, summary: dict, rows: list[dict], means: dict) -> None:
    """The run's summary.json with FedAvg's and FedProx's Client Avg ``means`` and its results.csv of ``rows``."""
    summary["algorithms"] = {
        name: {**summary["algorithms"][name], "dice": {"client_avg": means[name]}} for name in ("fedavg", "fedprox")
    }
    (run / "summary.json").write_text(json.dumps(summary))
    with open(run / "results.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)


def test_a_lead_from_one_small_site_is_within_noise_not_contradicted_by_the_pooled_cases(tmp_path):
    """Client Avg weighs sites equally, a pooled test the cases: a small site where the best wins by much and large
    sites where it loses by a little rank it first while the pooled cases favour the other. The CI was of the pooled
    mean, so the verdict reported the pooled cases against the ranking (an auditor: it ranks on one number and tests
    another). Now the CI is of the Client Avg difference, resampling the sites: a lead that rests on one small site
    is within noise; the signed-rank test, pooled, points the other way, and neither is called beyond noise."""
    run = make_run(tmp_path / "run")
    summary = json.loads((run / "summary.json").read_text())
    sizes = {"A": 2, "B": 30, "C": 30, "D": 30, "E": 30}
    rng = np.random.default_rng(0)
    rows = []
    for site, n in sizes.items():
        for i in range(n):
            base = 0.8 + 0.05 * rng.standard_normal()
            gain = 0.3 if site == "A" else -0.05 + 0.005 * rng.standard_normal()  # fedavg - fedprox
            for name, value in (("fedavg", base + gain), ("fedprox", base)):
                rows.append(
                    {
                        "algorithm": name,
                        "model": "global",
                        "site": site,
                        "case": f"{site}{i}",
                        "region": "r",
                        "metric": "dice",
                        "value": value,
                    }
                )
    means = {
        name: float(
            np.mean([np.mean([r["value"] for r in rows if r["algorithm"] == name and r["site"] == s]) for s in sizes])
        )
        for name in ("fedavg", "fedprox")
    }
    write_two_methods(run, summary, rows, means)
    loaded = load_run(run)
    v = verdict(loaded)
    assert v is not None and v.best == "fedavg" and means["fedavg"] > means["fedprox"]
    d = v.differences["fedprox"]
    assert d.test["mean_diff"] < 0 < d.test["site_mean_diff"] == pytest.approx(means["fedavg"] - means["fedprox"])
    assert d.test["ci_low"] < 0 < d.test["ci_high"] and d.test["rank_sign"] < 0
    assert d.within_noise and not d.disagrees and not d.split and v.clear == [] and v.within_noise == ["fedprox"]
    text = " ".join(summary_lines(run))
    assert "Within noise of the best (CI includes 0 or Holm-adjusted p ≥ 0.05): FedProx" in text
    assert "beyond noise" not in text


def test_a_mean_and_ranks_that_point_opposite_ways_are_said_neither_noise_nor_a_win(tmp_path):
    """FedAvg much better on one case of every site and a little worse on the other nine: its mean is above
    FedProx's and the CI excludes 0, but the signed-rank test favours FedProx. It was listed "within noise" (CI
    includes 0 or p >= 0.05: false here; a review); now the verdict says the two disagree and neither wins."""
    run = make_run(tmp_path / "run")
    summary = json.loads((run / "summary.json").read_text())
    rng = np.random.default_rng(0)
    rows = []
    for k in range(12):
        for i in range(10):
            base = 0.7 + 0.02 * rng.standard_normal()
            gain = 0.5 if i == 0 else -0.01 + 0.001 * rng.standard_normal()  # fedavg - fedprox
            for name, value in (("fedavg", base + gain), ("fedprox", base)):
                row = {"algorithm": name, "model": "global", "site": f"s{k}", "case": f"c{i}", "region": "r"}
                rows.append({**row, "metric": "dice", "value": value})
    means = {n: float(np.mean([r["value"] for r in rows if r["algorithm"] == n])) for n in ("fedavg", "fedprox")}
    write_two_methods(run, summary, rows, means)
    v = verdict(load_run(run))
    assert v is not None and v.best == "fedavg"
    d = v.differences["fedprox"]
    assert d.test["mean_diff"] > 0 and d.test["rank_sign"] == -1 and d.split  # fedavg - fedprox: ranks favour fedprox
    assert v.split == ["fedprox"] and v.within_noise == [] and v.clear == [] and v.disagreeing == []
    text = " ".join(summary_lines(run))
    assert "Mean and ranks disagree with the best: FedProx" in text and "Within noise" not in text, text
    assert "(mean and ranks disagree): neither wins" in text


def test_a_ci_bound_near_zero_keeps_its_side_of_zero():
    """The verdict printed a CI of [+0.0000, +0.0002] whose lower bound was 3e-05 (a fresh-eyes study): a reader
    could not tell it excluded 0; the bench's rule (one significant digit) holds here too."""
    from fedseg.report.verdict import _signed

    assert (_signed(3e-5), _signed(-2e-5), _signed(0.0), _signed(0.00123)) == ("+3e−05", "−2e−05", "+0.0000", "+0.0012")


def test_the_best_is_compared_with_each_baseline_by_the_verdicts_own_statistics(tmp_path):
    """The demo (centralized, local, fedavg) said only "FedAvg at 0.8535 (the only method ranked)": nothing on whether
    federating beats training alone or how far it is from pooling the data (a newcomer's review). Now a reference line
    per baseline (unranked), Local first, with the numbers of fedseg.evaluate.stats called on the same rows: each
    method's own models on the same cases (Local: each site's own model on that site's cases)."""
    from fedseg.evaluate.stats import compare, correct_family, signed_text
    from fedseg.evaluate.tables import case_means, own_site_model, read_rows

    run = make_run(tmp_path / "run")
    v = verdict(load_run(run))
    assert v is not None and v.best == "fedavg" and list(v.references) == ["local", "centralized"]
    assert "local" not in v.differences and v.baselines == ["centralized", "local"]  # still unranked

    rows = read_rows(run / "results.csv")
    fedavg = case_means(rows, "fedavg", "dice", lambda r: ":" not in r["model"])
    own = {
        "local": case_means(rows, "local", "dice", own_site_model),
        "centralized": case_means(rows, "centralized", "dice", lambda r: ":" not in r["model"]),
    }
    expected = {name: compare({0: fedavg}, {0: cases}, site_means=True) for name, cases in own.items()}
    correct_family(expected.values())  # the baselines: a family of their own
    # Local's own models, not its cross-site ones: FedAvg - Local = -0.0889 (A), -0.0372 (B), -0.0871 (C), 2 cases each
    assert expected["local"]["mean_diff"] == pytest.approx(np.mean([-0.0889, -0.0372, -0.0871]))
    for name, test in expected.items():
        got = v.references[name].test
        for key in ("n", "mean_diff", "site_mean_diff", "ci_low", "ci_high", "p", "p_holm", "family"):
            assert got[key] == pytest.approx(test[key]), (name, key)

    def line(name, label, score, pairing=""):
        t = expected[name]
        return (
            f"FedAvg − {label} (baseline, {score:.4f}{pairing}): Client Avg "
            f"{signed_text(FEDAVG - score).replace('-', '−')} (site means averaged), 95% CI "
            f"[{signed_text(t['ci_low']).replace('-', '−')}, {signed_text(t['ci_high']).replace('-', '−')}], "
            f"per-case Wilcoxon p = {t['p_holm']:.2g} (Holm, 2 comparisons) (6 cases): within noise."
        )

    local = np.mean([0.9012, 0.8828, 0.8660])
    centralized = np.mean([0.9511, 0.9422, 0.9333])
    lines = summary_lines(run)
    assert lines[-2:] == [
        line("local", "Local", local, "; Local: each site's own model on that site's cases"),
        line("centralized", "Centralized", centralized),
    ]
    assert lines[1] == "Not ranked (baselines, references only): Centralized, Local."  # no ranking of them


def named(run_dir):
    """The run loaded with its display names, as the report and the terminal summary load it."""
    from fedseg.report.methods import display_name

    run = load_run(run_dir)
    run.names = {a: display_name(a, e) for a, e in run.algorithms.items()}
    return run


def test_how_differences_were_tested_is_said_only_where_one_is_shown(tmp_path):
    """The report printed "Each difference pairs the two methods' own models…" under a verdict that showed no
    difference (one ranked method): now only where a difference with its CI and p is shown."""
    from fedseg.report.verdict import verdict_html

    run = make_run(tmp_path / "run")
    summary = json.loads((run / "summary.json").read_text())
    alone = {**summary, "algorithms": {"fedavg": summary["algorithms"]["fedavg"]}}
    (run / "summary.json").write_text(json.dumps(alone))
    html = verdict_html(verdict(named(run)))
    assert "the only method ranked" in html and "Each difference pairs" not in html and '<p class="note">' not in html

    # with baselines but no per-case scores to test against them: the unranked ones named, no note on tests
    summary["algorithms"].pop("fedprox")
    (run / "summary.json").write_text(json.dumps(summary))
    (run / "results.csv").unlink()
    html = verdict_html(verdict(named(run)))
    assert "Not ranked (baselines, references only): Centralized, Local." in html
    assert "no per-case scores (results.csv) to test it" in html and "Each difference pairs" not in html

    # a difference shown (here a baseline's): the note is there
    html = verdict_html(verdict(named(make_run(tmp_path / "again"))))
    assert "Each difference pairs the two methods&#x27; own models" in html


def two_method_rows(gain, sites=3, cases=10, seed=0):
    """results.csv rows of FedAvg and FedProx (FedProx = FedAvg's case score + ``gain(rng)``), one region."""
    rng = np.random.default_rng(seed)
    rows = []
    for k in range(sites):
        for i in range(cases):
            base = 0.6 + 0.05 * rng.standard_normal()
            for name, value in (("fedavg", base), ("fedprox", base + gain(rng))):
                row = {"algorithm": name, "model": "global", "site": f"s{k}", "case": f"c{i}", "region": "r"}
                rows.append({**row, "metric": "dice", "value": value})
    return rows


def test_a_tie_is_equal_scores_not_scores_that_print_alike(tmp_path):
    """FedProx 0.36173 and FedAvg 0.36169 were called "tied" (both print 0.3617), the runner-up line skipped FedAvg
    and its test, counted in Holm's family, was never shown (a newcomer's review). Now close scores are two numbers,
    the runner-up's CI says whether they differ; an exact tie is named and its per-case test shown."""
    run = make_run(tmp_path / "run")
    summary = json.loads((run / "summary.json").read_text())
    rows = two_method_rows(lambda rng: 0.002 * rng.standard_normal())
    write_two_methods(run, summary, rows, {"fedavg": 0.36169, "fedprox": 0.36173})
    v = verdict(load_run(run))
    assert v is not None and v.best == "fedprox" and v.ties == [] and v.runner_up == "fedavg"
    head, chosen, over, *_ = summary_lines(run)
    assert head == "Best on test Dice, Client Avg: FedProx at 0.3617." and chosen == CHOSEN_AFTER
    assert over.startswith("Over the runner-up FedAvg (0.3617): Client Avg +4e−05 (site means averaged), ")
    assert "95% CI [" in over  # after the paired cases' own Client Avg: this summary.json's are made up
    assert "per-case Wilcoxon p = " in over

    write_two_methods(run, summary, rows, {"fedavg": 0.36169, "fedprox": 0.36169})  # equal: a tie
    v = verdict(load_run(run))
    assert v is not None and v.best == "fedavg" and v.ties == ["fedprox"] and v.runner_up is None
    assert not v.differences["fedprox"].identical
    head, chosen, tied, *_ = summary_lines(run)
    assert head == "Best on test Dice, Client Avg: FedAvg at 0.3617, tied with FedProx." and chosen == CHOSEN_AFTER
    test = v.differences["fedprox"].test
    assert tied.startswith("Tied on Client Avg with FedProx, not case by case: ") and "95% CI [" in tied
    assert f"per-case Wilcoxon p = {test['p']:.2g} (30 cases): within noise." in tied


def test_beyond_noise_of_one_seed_says_what_its_ci_leaves_out(tmp_path):
    """ "Beyond noise" of a one-seed, 3-round run read as a win of the method (a newcomer's review): the sentence that
    says it now says that its CI has no training noise in it (as the bench's † needs 2 seeds)."""
    run = make_run(tmp_path / "run")
    summary = json.loads((run / "summary.json").read_text())
    rows = two_method_rows(lambda rng: -0.05 + 0.005 * rng.standard_normal())  # FedProx worse on every case
    write_two_methods(run, summary, rows, {"fedavg": 0.6, "fedprox": 0.55})
    v = verdict(load_run(run))
    assert v is not None and v.clear == ["fedprox"] and v.differences["fedprox"].test["seeds"] == 1
    over = summary_lines(run)[2]  # after the headline and CHOSEN_AFTER
    assert over.startswith("Over the runner-up FedProx (0.5500): Client Avg +0.0500 (site means averaged), ")
    assert over.endswith(
        "(30 cases): beyond noise across the test cases (one seed: the CI holds no training noise, so two trained "
        "models differ, not yet two methods)."
    )


def test_a_client_avg_that_holds_unpaired_cases_prints_the_paired_one_beside_its_ci(tmp_path):
    """The CI is of the Client Avg difference over the cases both methods scored; where the table's Client Avg also
    holds cases only one of them scored (FedProx has no row at one site), the sentence prints the paired number too,
    so no printed difference lies outside the CI printed as its own (a reviewer's find)."""
    run = make_run(tmp_path / "run")
    summary = json.loads((run / "summary.json").read_text())
    rows = [
        r
        for r in two_method_rows(lambda rng: -0.02 + 0.001 * rng.standard_normal())
        if not (r["algorithm"] == "fedprox" and r["site"] == "s0")
    ]
    write_two_methods(run, summary, rows, client_avgs(rows))
    v = verdict(load_run(run))
    assert v is not None and v.best == "fedavg"
    t = v.differences["fedprox"].test
    assert t["n"] == 20 and t["ci_low"] <= t["site_mean_diff"] <= t["ci_high"]
    over = next(line for line in summary_lines(run) if line.startswith("Over the runner-up FedProx"))
    paired = stats.signed_text(t["site_mean_diff"]).replace("-", "−")
    table = stats.signed_text(v.differences["fedprox"].table_diff).replace("-", "−")
    assert (
        f"Client Avg {table} (site means averaged), Client Avg of the 20 cases both scored {paired}, 95% CI [" in over
    )
    assert table != paired
    same = two_method_rows(lambda rng: -0.02 + 0.001 * rng.standard_normal())  # every case paired: printed once
    write_two_methods(run, summary, same, client_avgs(same))
    assert "cases both scored" not in " ".join(summary_lines(run))


def client_avgs(rows: list[dict]) -> dict[str, float]:
    """Each method's Client Avg of ``rows`` (the mean of its site means), as summary.json gives it."""
    out = {}
    for name in ("fedavg", "fedprox"):
        sites = sorted({r["site"] for r in rows if r["algorithm"] == name})
        out[name] = float(
            np.mean([np.mean([r["value"] for r in rows if r["algorithm"] == name and r["site"] == s]) for s in sites])
        )
    return out
