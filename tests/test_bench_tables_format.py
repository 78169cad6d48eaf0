"""What a bench's tables print and what its tables.json holds, so that a published number is readable and
recomputable: differences of fractions to 4 decimals (never a nonzero one as ±0.0000), the cases each Δ pairs, Δ per
seed labelled with its seed, the not-converged tuning runs of each setting, and tables.json as strict JSON (null, not
NaN) that renders the same tables as the NaN it replaced."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import numpy as np
import pytest
import yaml

from fedseg.atomic_files import json_ready
from fedseg.bench import legend, render, report, table_rows
from fedseg.bench.execute import Finished
from fedseg.bench.plan import load_bench, tuning_runs
from fedseg.bench.select import tuning_rows
from fedseg.evaluate.stats import compare

RESULTS = Path(__file__).parents[1] / "benchmarks" / "results"
BENCHES = sorted(p.parent.name for p in RESULTS.glob("*/tables.json"))


def _no_nan(constant: str):
    raise ValueError(f"{constant} is not JSON")


def _strict(text: str) -> dict:
    """``text`` parsed as JSON.parse or R's jsonlite would: a bare NaN / Infinity is an error."""
    return json.loads(text, parse_constant=_no_nan)


def test_the_committed_benches_tables_md_is_the_rendering_of_their_tables_json():
    """Every committed bench's tables.md is what ``fedseg report`` renders from its tables.json by the current rules."""
    assert BENCHES
    for name in BENCHES:
        bench, content = report.read_tables(RESULTS / name / "tables.json")
        md = render.markdown(bench, content["federations"], content["tuning"], content.get("analysis_changes", []))
        assert md == (RESULTS / name / "tables.md").read_text(), f"{name}: run fedseg report on a copy of it"
        tex = render.latex(bench, content["federations"], content["tuning"], content.get("analysis_changes", []))
        assert tex == (RESULTS / name / "tables.tex").read_text(), f"{name}: run fedseg report on a copy of it"


def _tex_rows(tex: str) -> list[list[str]]:
    """The cells of every tabular row of ``tables.tex`` (between \\midrule and \\bottomrule)."""
    rows, inside = [], False
    for line in tex.splitlines():
        if line in ("\\midrule", "\\bottomrule"):
            inside = line == "\\midrule"
        elif inside:
            assert line.endswith(" \\\\"), line
            rows.append(line[: -len(" \\\\")].split(" & "))
    return rows


def test_tables_tex_holds_every_cell_of_tables_md_escaped_for_latex():
    """tables.tex (for a paper) has the same tables, rows and cells as tables.md, each cell escaped (no bare LaTeX
    special character, no Unicode symbol pdflatex would refuse), one unique label per table, the shared legend as
    comments; the captions carry the tables' own notes (the convergence caution among them)."""
    import re

    from fedseg.presentation.latex import SYMBOLS, tex_text

    bench, content = report.read_tables(RESULTS / "headline-equal" / "tables.json")
    feds, tuning = content["federations"], content["tuning"]
    tex = render.latex(bench, feds, tuning)
    sections, floats = render.sections(bench, feds, tuning), render.tex_floats(bench, feds, tuning)
    assert tex.count("\\begin{table}") == len(floats) == tex.count("\\end{table}")
    labels = re.findall(r"\\label\{([^}]*)\}", tex)
    assert len(set(labels)) == len(floats) and "tab:headline-equal:synthetic-retina:test" in labels
    expected = [[tex_text(c) for c in row] for f in floats for row in f.table[1]]
    assert _tex_rows(tex) == expected and len(expected) > 40
    # the test table in parts (scores, Dice paired, HD95/NSD paired): its every cell in one part, the method in each
    test = next(sec for sec in sections if sec.short == "test")
    parts = [f for f in floats if f.label.startswith("tab:headline-equal:synthetic-retina:")][:3]
    assert [f.short for f in parts] == [
        "synthetic-retina: test",
        "synthetic-retina: test, paired with fedavg",
        "synthetic-retina: test, HD95 and NSD",
    ]
    assert sorted(h for f in parts for h in f.table[0][1:]) == sorted(test.table[0][1:])
    for i, row in enumerate(test.table[1]):
        assert all(f.table[1][i][0] == row[0] for f in parts)
        assert sorted(c for f in parts for c in f.table[1][i][1:]) == sorted(row[1:])
    assert all(len(f.table[0]) <= 12 for f in parts)  # 17 columns in one table shrank it to a fifth of a page
    assert parts[1].caption.startswith(
        "synthetic-retina: test, paired with fedavg. Test Dice paired with fedavg per case and seed: Δ, the mean"
    )
    body = "".join(line for line in tex.splitlines(keepends=True) if not line.startswith("%"))
    cells = body.replace(" & ", " ").replace("{%\n", "{\n")  # column separators, the line-end comment
    assert not re.search(r"(?<!\\)[%&#_]", cells), "an unescaped special character"
    assert not set(body) & set(SYMBOLS), "a Unicode symbol left as it is"
    assert body.count("{") == body.count("}")
    assert "\\textbf{May not have converged}" in tex and "$^\\dagger$" in tex and "$\\pm$" in tex
    assert re.search(r"\$[0-9.]+\\times10\^\{-\d+\}\$", tex)  # a p such as 5.9e-14
    legend = "".join(line[2:] for line in tex.splitlines() if line.startswith("% "))
    assert "hierarchical bootstrap" in legend.replace("\n", " ")


@pytest.mark.skipif(
    shutil.which("pdflatex") is None, reason="pdflatex is not installed (the test above checks the text)"
)
def test_tables_tex_compiles_with_pdflatex(tmp_path):
    """Every committed bench's tables.tex inside a minimal article compiles without an error."""
    import subprocess

    for name in BENCHES:
        doc = tmp_path / f"{name}.tex"
        doc.write_text(
            "\\documentclass{article}\n\\usepackage{booktabs,graphicx}\n\\begin{document}\n"
            f"\\input{{{RESULTS / name / 'tables.tex'}}}\n\\end{{document}}\n"
        )
        proc = subprocess.run(
            ["pdflatex", "-interaction=nonstopmode", "-halt-on-error", doc.name],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=120,
        )
        errors = [line for line in proc.stdout.splitlines() if line.startswith("!")]
        assert proc.returncode == 0 and not errors, (name, errors[:3], proc.stdout[-1500:])


def test_tables_json_is_strict_json_and_a_round_trip_renders_the_same_tables(tmp_path):
    """A tables.json as written before null (bare NaN: a one-seed bench has no std over seeds) re-rendered: the new
    tables.json has null where NaN was and parses as strict JSON; rendered again from it, tables.md and report.html
    are unchanged."""
    source = RESULTS / "fets_limited"
    content = json.loads((source / "tables.json").read_text())
    content["federations"]["synthetic-brats"]["methods"]["fedavg"]["client_avg"]["std"] = math.nan
    old = json.dumps(content, indent=1)
    assert "NaN" in old
    with pytest.raises(ValueError, match="NaN"):
        _strict(old)
    folder = tmp_path / "bench"
    shutil.copytree(source, folder)
    (folder / "tables.json").write_text(old)
    report.rewrite_report(folder)
    first = {f: (folder / f).read_text() for f in ("tables.md", "tables.tex", "report.html")}
    written = (folder / "tables.json").read_text()
    strict = _strict(written)
    assert "NaN" not in written and written.count("null") >= old.count("NaN")
    nan = json.loads(old)["federations"]["synthetic-brats"]["methods"]["fedavg"]["client_avg"]
    null = strict["federations"]["synthetic-brats"]["methods"]["fedavg"]["client_avg"]
    assert math.isnan(nan["std"]) and null["std"] is None and null["mean"] == nan["mean"]
    assert first["tables.md"] == (source / "tables.md").read_text()
    report.rewrite_report(folder)
    assert {f: (folder / f).read_text() for f in first} == first
    assert (folder / "tables.json").read_text() == written


def test_json_ready_writes_every_non_finite_float_as_null():
    value = {"a": [1.0, math.nan, (math.inf, np.float64("nan"))], "b": {"c": -math.inf, "d": 2, "e": None, "f": "x"}}
    text = json.dumps(json_ready(value), allow_nan=False)
    assert _strict(text) == {"a": [1.0, None, [None, None]], "b": {"c": None, "d": 2, "e": None, "f": "x"}}


def _test(mean_diff: float, low: float, high: float, n: int, **more) -> dict:
    per_seed = more.pop("per_seed", {"0": mean_diff, "1": mean_diff})
    test = {"n": n, "p": 0.5, "mean_diff": mean_diff, "ci_low": low, "ci_high": high, "ci_excludes_0": low > 0}
    return {**test, "seeds": len(per_seed), "per_seed_diff": per_seed, **more}


def _fed(**tests) -> dict:
    summary = {"mean": 0.9, "std": 0.01, "n": 40}
    method = {
        "setting": "default",
        "dice": summary,
        "regions": {"disc": summary},
        "hd95": {"mean": 2.0, "std": 1.0, "n": 40},
        "nsd": summary,
        "client_avg": summary,
        "convergence": {"runs": 2, "not_converged": 0},
    }
    return {
        "regions": ["disc"],
        "runs": 2,
        "sites": ["site1"],
        "hd95_unit": "pixels",
        "nsd_tolerance": 1.0,
        "methods": {
            "fedavg": {**method, "wilcoxon": None, "hd95_wilcoxon": None, "nsd_wilcoxon": None},
            "fedprox": {**method, **tests},
        },
    }


def test_a_comparison_keeps_the_names_of_its_methods_next_to_the_test_keys():
    """The bench's comparisons are ``{"method": a, "against": b, **compare(...)}``: the test records its Wilcoxon
    method as ``p_method``, so the method's name is not overwritten."""
    a = {0: {("s", str(i)): 0.5 + 0.01 * i for i in range(6)}}
    b = {0: {("s", str(i)): 0.5 for i in range(6)}}
    test = compare(a, b, resamples=50)
    assert not {"method", "against"} & set(test) and test["p_method"] == "exact"  # of the 5 that differ
    assert {"method": "fedprox", "against": "fedavg", **test}["method"] == "fedprox"


def test_the_test_table_prints_dice_differences_to_4_decimals_with_the_cases_they_pair():
    """A CI bound that is above 0 but below 0.00005 reads as above 0, Δ per seed names its seed, the cases paired
    are a column (HD95's and NSD's Δ say theirs only where they differ), HD95 keeps its own 2 decimals."""
    dice = _test(0.00213, 0.00002, 0.0041, 40, per_seed={"0": 0.0018, "1": -0.00003, "2": 0.0028})
    hd95 = _test(-0.234, -0.5, 0.004, 40)
    nsd = _test(0.0, -0.0031, 0.0, 38)
    head, rows = table_rows.test_table(_fed(wilcoxon=dice, hd95_wilcoxon=hd95, nsd_wilcoxon=nsd), "fedavg")
    ref, row = (dict(zip(head, r, strict=True)) for r in rows)
    assert head[head.index("Δ vs fedavg") :][:5] == ["Δ vs fedavg", "cases paired", "95% CI", "Δ per seed", "p (Holm)"]
    assert row["Δ vs fedavg"] == "+0.0021" and row["cases paired"] == "40"
    assert row["95% CI"] == "[+2e-05, +0.0041]"  # not [+0.0000, +0.0041]: it excludes 0, and reads so
    assert row["Δ per seed"] == "s0 +0.0018 / s1 -3e-05 / s2 +0.0028"
    assert row["HD95 Δ vs fedavg"] == "-0.23" and row["HD95 95% CI"] == "[-0.50, +0.004]"
    assert row["NSD Δ vs fedavg"] == "+0.0000 ‡ (n=38)" and row["NSD 95% CI"] == "[-0.0031, +0.0000]"
    assert ref["cases paired"] == "" and ref["p (Holm)"] == "ref"
    fed = _fed(wilcoxon=dice, hd95_wilcoxon=hd95, nsd_wilcoxon=nsd)
    fed["comparisons"] = [{"method": "fedprox", "against": "fedavg", **dice}]
    head, (pair,) = table_rows.comparison_table(fed)
    cells = dict(zip(head, pair, strict=True))
    assert (cells["cases"], cells["Δ Dice"], cells["95% CI"]) == ("40", "+0.0021", "[+2e-05, +0.0041]")
    assert cells["Δ per seed"] == "s0 +0.0018 / s1 -3e-05 / s2 +0.0028"


def test_a_test_read_back_with_null_renders_as_the_nan_it_was():
    """null where NaN was (no pair in a seed, no CI): the cells are the missing ones NaN gave."""
    nan = _test(0.001, math.nan, math.nan, 3, per_seed={"0": 0.001, "1": math.nan})
    null = json.loads(json.dumps(json_ready(nan)))
    assert null["ci_low"] is None and null["per_seed_diff"]["1"] is None
    cells = [table_rows.test_table(_fed(wilcoxon=t), "fedavg")[1][1] for t in (nan, null)]
    assert cells[0] == cells[1]
    assert "s0 +0.0010 / s1 –" in cells[1] and "–" in cells[1]
    assert table_rows.p_text({**null, "p": None}) == "–"


def _finished(run, late_best: bool, plateaued: bool) -> Finished:
    convergence = {"late_best": late_best, "plateaued": plateaued, "rounds": 30, "best_val_dice": 0.8}
    entry = {"convergence": convergence, "dice": {"client_avg": 0.7}, "cost": {"sgd_steps": 100}}
    return Finished(run, Path("."), {"algorithms": {"fedprox": entry}}, 0.0)


def test_the_tuning_table_counts_the_runs_of_each_setting_that_may_not_have_converged(tmp_path):
    spec = {
        "name": "tiny",
        "base": {"preset": "synthetic-retina"},
        "federations": ["synthetic-retina"],
        "methods": ["fedavg", {"name": "fedprox", "grid": {"methods.fedprox.mu": [0.1, 1.0, 10.0]}}],
        "seeds": [0],
    }
    (tmp_path / "bench.yaml").write_text(yaml.safe_dump(spec))
    bench, _ = load_bench(tmp_path / "bench.yaml")
    low, mid, high = tuning_runs(bench)
    # late best without a plateau: may not have converged; with a plateau, or a best round before the end: converged
    tuning = {low: _finished(low, True, False), mid: _finished(mid, True, True), high: _finished(high, False, False)}
    rows = tuning_rows(bench, tuning, {("synthetic-retina", "fedprox"): mid.setting})
    assert [r["not_converged"] for r in rows] == [1, 0, 0]
    assert "not_converged" in report.TUNING_COLUMNS
    head, body = table_rows.tune_table(rows, "synthetic-retina")
    assert [dict(zip(head, r, strict=True))["converged"] for r in body] == ["0/1", "1/1", "1/1"]
    md = render._md_table(head, body)
    assert "| converged | selected |" in md
    old = [{k: v for k, v in r.items() if k != "not_converged"} for r in rows]  # a tables.json written before
    assert "converged" not in table_rows.tune_table(old, "synthetic-retina")[0]


def test_every_p_says_when_its_seeds_disagree_and_the_paired_cell_how_many_differ():
    """HD95's and NSD's p showed no "(seeds disagree)" (their Δ per seed are in tables.json only), and "cases
    paired" gave n where the Wilcoxon p ranks the n_nonzero that differ (a statistics audit: 181 paired, 80 differ)."""
    split = {"0": -0.025, "1": 0.015, "2": -0.031}
    dice = _test(0.002, -0.001, 0.004, 181, n_nonzero=80)
    nsd = _test(-0.0137, -0.0349, 0.0127, 181, per_seed=split)
    hd95 = _test(-0.05, -0.2, 0.1, 181, per_seed=split)
    head, rows = table_rows.test_table(_fed(wilcoxon=dice, hd95_wilcoxon=hd95, nsd_wilcoxon=nsd), "fedavg")
    row = dict(zip(head, rows[1], strict=True))
    assert row["cases paired"] == "181 (80 differ)"
    assert row["NSD p (Holm)"].endswith("(seeds disagree)") and row["HD95 p (Holm)"].endswith("(seeds disagree)")
    assert row["p (Holm)"] == "0.5"  # the Dice seeds agree
    assert table_rows.paired_text(_test(0.002, -0.001, 0.004, 40, n_nonzero=40)) == "40"


def test_the_per_site_table_marks_a_site_test_that_paired_fewer_cases_than_its_cells_average():
    """A site whose test paired 38 of the 40 cases its two cells average (a failed evaluation of two cases) gets ‡
    after its cell, as the test table's Δ does; one that paired all 40 does not. A cell's ``n`` counts seeds (its ±
    is over seeds): a site of 2 test cases in a 3-seed bench got ‡ on every cell (a fresh-eyes study), and a site
    that lost cases but kept more of them than the bench has seeds got none. Tables written before ``site_cases``
    was recorded cannot say: no ‡."""
    fed = _fed(wilcoxon=_test(0.002, 0.001, 0.003, 40))
    fed["sites"] = ["site1", "site2", "site3"]
    for method in fed["methods"].values():
        method["sites"] = {site: {"mean": 0.9, "std": 0.01, "n": 3} for site in fed["sites"]}
        method["site_cases"] = {"site1": 40, "site2": 40, "site3": 2}
        method["site_wilcoxon"] = {}
        method["local_avg"] = method["local_gen"] = None
    fed["methods"]["fedprox"]["site_wilcoxon"] = {
        "site1": _test(0.0, 0.0, 0.0, 38),
        "site2": _test(0.0, 0.0, 0.0, 40),
        "site3": _test(0.0, 0.0, 0.0, 2),
    }
    head, rows = table_rows.site_table(fed, "fedavg")
    cells = {row[0]: dict(zip(head, row, strict=True)) for row in rows}
    assert cells["fedprox"]["site1"].endswith(" ‡") and not cells["fedprox"]["site2"].endswith("‡")
    assert not cells["fedprox"]["site3"].endswith("‡") and not cells["fedavg"]["site1"].endswith("‡")
    for method in fed["methods"].values():
        del method["site_cases"]
    head, rows = table_rows.site_table(fed, "fedavg")
    assert not any("‡" in cell for row in rows for cell in row)


def test_the_legend_says_what_trained_the_runs_where_the_tables_recorded_it():
    """tables.json ``provenance`` (fedseg, commit, torch, MONAI, Python, device of the runs) in one legend sentence;
    tables written before it render as they did."""
    provenance = {
        "fedseg": ["0.1.0"],
        "commit": ["9183785cb9f09700137606c1b62c3f47c6d40e86"],
        "torch": ["2.13.0+cpu"],
        "monai": ["1.6.1"],
        "python": ["3.11.7"],
        "device": ["cpu"],
        "dirty": [False, True],
    }
    assert legend.provenance_note({"fed": {"provenance": provenance}}) == (
        " Trained with fedseg 0.1.0 (commit 9183785cb9f0, some runs with uncommitted changes), torch 2.13.0+cpu, "
        "MONAI 1.6.1, Python 3.11.7 on cpu; every run's summary.json says its own."
    )
    assert legend.provenance_note({"fed": {}}) == ""


def test_the_test_tables_note_names_methods_whose_runs_never_improved_on_validation():
    fed = _fed(wilcoxon=_test(0.002, 0.001, 0.003, 40))
    assert "Never improved" not in table_rows.not_converged(fed)  # tables written before the count: no sentence
    fed["methods"]["fedprox"]["convergence"] = {"runs": 2, "not_converged": 0, "never_improved": 2}
    note = table_rows.not_converged(fed)
    assert "**Never improved**" in note and "fedprox (2/2)" in note and "fedavg (" not in note


def test_the_legend_says_where_tuning_touches_the_test_scores():
    """A grid searched on fold 0's validation cases (test cases of folds 1-2) or at a final seed is said in the
    legend; tuning seeds outside the final seeds, one ratio split, or no grid say nothing."""
    from fedseg.bench.spec import BenchSpec

    def spec(**more) -> BenchSpec:
        base = {
            "base": {"preset": "synthetic-retina"},
            "federations": ["retina"],
            "methods": [{"name": "fedavg", "grid": {"train.lr": [0.01, 0.1]}}, {"name": "fedprox"}],
            "seeds": [0, 1],
        }
        return BenchSpec.model_validate({**base, **more})

    kfold = legend.tuning_note(spec(split={"mode": "kfold", "folds": 3}))
    assert "**Tuned** (fedavg)" in kfold and "fold 0" in kfold and "at seed 0" in kfold
    apart = legend.tuning_note(spec(tune={"seeds": [100]}))
    assert apart == ""
    assert legend.tuning_note(spec(split={"mode": "kfold", "folds": 3}, methods=["fedavg", "fedprox"])) == ""


def test_the_test_table_says_what_the_runs_scored_and_warns_when_they_differ(tmp_path):
    """tables.json ``score_on`` and ``score_grid``: one value each, said next to the test table; runs scored
    differently (a bench resumed across versions) are named; tables written before they were recorded say nothing
    (they render as committed)."""
    from fedseg.bench.execute import DONE_FILE
    from fedseg.bench.tables import scored

    def run(summary: dict, config: dict | None = None) -> Finished:
        folder = tmp_path / str(len(list(tmp_path.iterdir())))
        folder.mkdir()
        if config is not None:
            (folder / DONE_FILE).write_text(json.dumps({"config": config}))
        return Finished(run=None, dir=folder, summary=summary, seconds=0.0)

    assert scored("score_on", [run({"score_on": "label_map"}), run({"score_on": "label_map"})]) == "label_map"
    assert scored("score_on", [run({})]) == "channels"  # an older fedseg scored each channel
    folder = {"data": {"source": "folder", "root": "/d"}, "eval": {}}
    assert scored("score_grid", [run({}, folder)]) == "model"  # ... a folder's images on the model grid
    volumes = {"data": {"source": "folder", "root": "/d", "volume": {"patch_size": 32}}, "eval": {}}
    assert scored("score_grid", [run({}, volumes), run({"score_grid": "original"})]) == "original"  # not "mixed"
    assert scored("score_on", [run({"score_on": "label_map"}), run({})]) == "mixed"
    note = table_rows.scoring_note({"score_on": "channels", "score_grid": "original"})
    assert note.startswith("Scored on each region's thresholded channel") and "each image's own grid" in note
    assert "eval.score_grid differs" in table_rows.scoring_note({"score_on": "label_map", "score_grid": "mixed"})
    assert table_rows.scoring_note({}) == ""


def test_unequal_training_under_a_rounds_budget_is_named_with_its_factor():
    """budget.rule: rounds gives FedSM 3 model updates a round (2.9x FedAvg's SGD steps in a fresh-eyes study): the
    test table names each method beyond 1.25x (either way) of the reference's steps; sgd_steps budgets say nothing."""

    def fed(**steps):
        return {"methods": {name: {"cost": {"sgd_steps": value}} for name, value in steps.items()}}

    note = table_rows.budget_note(fed(fedavg=180, fedsm=520, fedprox=200, local=100), "fedavg", "rounds")
    assert note.startswith("**Unequal training** (budget.rule: rounds): SGD steps against fedavg's: fedsm ×2.9, ")
    assert "local ×0.6." in note and "fedprox" not in note  # 1.11x: within the band
    assert table_rows.budget_note(fed(fedavg=180, fedsm=520), "fedavg", "sgd_steps") == ""
    assert table_rows.budget_note(fed(fedavg=180, fedprox=150), "fedavg", "rounds") == ""
    assert table_rows.budget_note(fed(fedsm=520), "fedavg", "rounds") == ""  # no reference run


def _legend_spec(methods: list, **more):
    from fedseg.bench.spec import BenchSpec

    base = {"base": {"preset": "synthetic-retina"}, "federations": ["retina"], "methods": methods, "seeds": [0, 1]}
    return BenchSpec.model_validate({**base, **more})


def _methods_fed(*names: str, sets: dict[str, list[str]] | None = None) -> dict:
    """A federation's tables with ``names`` (each a copy of :func:`_fed`'s fedavg entry) and, for the methods in
    ``sets``, their tables.json ``method_set``."""
    entry = _fed()["methods"]["fedavg"]
    methods = {name: dict(entry) for name in names}
    for name, own in (sets or {}).items():
        methods[name]["method_set"] = own
    return {**_fed(), "methods": methods}


def test_the_legend_names_the_methods_that_ran_a_configuration_of_their_own():
    """A method's own ``set:`` (FedBN on BatchNorm next to FedAvg on the base's InstanceNorm) shows nowhere in the
    tables' setting column: the legend names each method's where methods differ in it, and says nothing where they
    all ran the same configuration or the tables were written before ``method_set`` was recorded."""
    sets = {"fedavg": [], "fedavg-bn": ["model.norm=batch"], "fedbn": ["model.norm=batch"], "fedprox": []}
    tables = {"retina": _methods_fed(*sets, sets=sets)}
    sentence = (
        " **Methods with their own configuration** (set: in the bench file, on top of the bench's and the "
        "federation's): fedavg-bn: model.norm=batch; fedbn: model.norm=batch; the others run the bench's "
        "configuration alone, so a difference between methods that ran different configurations is not their "
        "algorithms' alone."
    )
    assert legend.own_set_note(tables) == sentence
    spec = _legend_spec(
        [
            "fedavg",
            {"name": "fedavg-bn", "algorithms": ["fedavg"], "set": ["model.norm=batch"]},
            {"name": "fedbn", "set": ["model.norm=batch"]},
            "fedprox",
        ]
    )
    assert legend.notes(spec, tables).count(sentence) == 1
    two = {
        "retina": _methods_fed("a", "b", sets={"a": ["model.norm=batch", "train.lr=0.01"], "b": ["model.norm=batch"]})
    }
    assert legend.own_set_note(two).endswith(  # every method has its own: no "the others"
        "(set: in the bench file, on top of the bench's and the federation's): a: model.norm=batch, train.lr=0.01; "
        "b: model.norm=batch, so a difference between methods that ran different configurations is not their "
        "algorithms' alone."
    )
    same = {
        "retina": _methods_fed("fedavg", "fedbn", sets={"fedavg": ["model.norm=batch"], "fedbn": ["model.norm=batch"]})
    }
    assert legend.own_set_note(same) == legend.own_set_note({"retina": _methods_fed("fedavg", "fedbn")}) == ""
    old = {"retina": _methods_fed("fedavg", "fedavg-bn", "fedbn", "fedprox")}  # a tables.json written before
    assert "own configuration" not in legend.notes(spec, old)
    assert legend.notes(spec, old) == legend.notes(spec, tables).replace(sentence, "")


def test_the_tables_record_each_methods_own_set(tmp_path):
    """tables.json ``method_set``: each method's own ``set:`` of the bench file (``[]`` for none), what the legend
    names (fedseg.bench.tables.federation_tables on two finished runs written by hand)."""
    from fedseg.bench.phases import BenchRuns
    from fedseg.bench.plan import final_runs
    from fedseg.bench.tables import federation_tables

    spec = _legend_spec(
        ["fedavg", {"name": "fedavg-bn", "algorithms": ["fedavg"], "set": ["model.norm=batch"]}],
        seeds=[0],
        federations=["synthetic-retina"],
    )
    final = {}
    for i, run in enumerate(final_runs(spec, {})):
        folder = tmp_path / str(i)
        folder.mkdir()
        (folder / "config.yaml").write_text("{}\n")
        rows = ["algorithm,model,site,case,region,metric,value"]
        rows += [f"fedavg,global,site1,c{j},disc,dice,{0.8 + 0.01 * j + 0.001 * i}" for j in range(6)]
        (folder / "results.csv").write_text("\n".join(rows) + "\n")
        entry = {"site_models": {"site1": "global"}, "convergence": {"rounds": 2}, "cost": {}}
        summary = {"algorithms": {"fedavg": entry}, "sites": ["site1"], "regions": ["disc"]}
        final[run] = Finished(run, folder, summary, 0.0)
    tables, _ = federation_tables(spec, BenchRuns({}, {}, final))
    methods = tables["synthetic-retina"]["methods"]
    assert methods["fedavg"]["method_set"] == [] and methods["fedavg-bn"]["method_set"] == ["model.norm=batch"]
    assert "fedavg-bn: model.norm=batch; the others run" in legend.notes(spec, tables)


def test_the_legend_names_the_methods_whose_sites_select_their_own_round():
    """FedBN, a fine-tuning entry (scored: finetune), local and the clustered methods test each site with its own
    model (or its cluster's) at its own best validation round: the legend names them against the other methods'
    one round per run; FedSM (one round for its super model) and the global methods are not named; a bench without
    such a method, or with it only in a leave-one-out federation (no site's own model there), says nothing."""
    spec = _legend_spec(
        [
            "fedavg",
            "fedbn",
            {"name": "ft", "algorithms": ["fedavg", "finetune"]},
            "fedsm",
            "local",
            "centralized",
            "prior-cfl",
        ]
    )
    names = ("fedavg", "fedbn", "ft", "fedsm", "local", "centralized")
    sentence = (
        " **Per-site selection** (fedbn, ft, local): each site is tested with its own model from the round where it "
        "scored best on its own validation split, where each run of the other methods tests every site at one round, "
        "that of the best mean validation Dice over the sites; Δ, CI and p still pair the same test cases."
    )
    assert legend.per_site_methods(spec, {"retina": _methods_fed(*names)}) == {
        "fedbn": "personalized",
        "ft": "personalized",
        "local": "baseline",
    }
    assert legend.per_site_note(spec, {"retina": _methods_fed(*names)}) == sentence
    assert legend.notes(spec, {"retina": _methods_fed(*names)}).count(sentence) == 1
    clustered = legend.per_site_note(spec, {"retina": _methods_fed("fedavg", "prior-cfl")})
    assert clustered.startswith(
        " **Per-site selection** (prior-cfl): each site is tested with its own model (a "
        "clustered method: its cluster's) from the round"
    )
    alone = legend.per_site_note(spec, {"retina": _methods_fed("fedbn")})  # nothing to contrast with
    assert alone.endswith("on its own validation split; Δ, CI and p still pair the same test cases.")
    for global_only in (
        _methods_fed("fedavg", "fedsm", "centralized"),
        {**_methods_fed("fedbn"), "leave_one_out": True},
    ):
        assert legend.per_site_note(spec, {"retina": global_only}) == ""
        assert "Per-site selection" not in legend.notes(spec, {"retina": global_only})


def test_the_legend_says_how_settings_were_chosen_only_where_a_method_has_a_grid():
    """ "Settings chosen on validation only ... (grid edge)" where some method has a grid (a method taking another's
    setting, settings_from, has one through it); a bench without a grid (an empty tuning.csv) does not say it."""
    tables = {"retina": _methods_fed("fedavg", "fedprox")}
    grid = {"name": "fedavg", "grid": {"train.lr": [0.01, 0.1]}}
    for methods, said in (
        (["fedavg", "fedprox"], False),
        ([grid, "fedprox"], True),
        ([grid, {"name": "fedprox", "settings_from": "fedavg"}], True),
    ):
        text = legend.notes(_legend_spec(methods), tables)
        assert (legend.GRID_NOTE in text) == said and ("(grid edge)" in text) == said
        assert "Settings chosen on validation only" in text if said else "Settings chosen" not in text
