"""Studies: unseen-site evaluation (FedSM Table 5: --holdout / --leave-one-out) and sweeps (Table 7: --sweep)."""

from __future__ import annotations

import csv
import json
import math

import numpy as np
import pytest
import torch
import yaml
from safetensors.torch import load_file
from typer.testing import CliRunner

from fedseg.cli import app
from fedseg.config_load import ConfigError
from fedseg.data.folder_write import write_folder
from fedseg.engine.context import Task
from fedseg.engine.messages import load_weights
from fedseg.evaluate.inference import score_caseset
from fedseg.flower.launch import check_new_or_resumed
from fedseg.report.studies import render_study, study_sections
from fedseg.run import cost_warnings, run_experiment
from fedseg.studies import (
    STUDY_FILE,
    parse_sweep,
    plan_holdout,
    plan_sweep,
    run_label,
    run_study,
    unseen_caseset,
    unseen_columns,
)
from test_cli import TINY_SETS as TINY

SITES = ["site1", "site2", "site3"]
FREQS = ["freq_GM"] + [f"freq_PM_{s}" for s in SITES]
runner = CliRunner()


@pytest.fixture
def make_cfg(tiny_config):
    """Factory ``make_cfg(algorithms, **fedsm)``: 1 round, a tiny selector (4..32 channels), no HD95."""

    def make(algorithms, **fedsm):
        return tiny_config(
            algorithms=algorithms,
            fl={"rounds": 1},
            eval={"hd95": False},
            methods={"fedsm": {"selector_width": 0.0625, **fedsm}},
        )

    return make


def _rows(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def _files(folder):
    """``{relative path: (size, mtime_ns)}`` of every file under ``folder``: what a refused command must not touch."""
    return {p.relative_to(folder).as_posix(): (p.stat().st_size, p.stat().st_mtime_ns) for p in folder.rglob("*")}


def _freq_sum(row, unseen):
    assert row[f"freq_PM_{unseen}"] == "", "the unseen site has no personalized model"
    return sum(float(row[c]) for c in FREQS if c != f"freq_PM_{unseen}")


# --- holdout ----------------------------------------------------------------------------------
def test_holdout_trains_without_the_site_and_scores_all_of_its_cases(tmp_path, make_cfg, disc_federation):
    fed = disc_federation(n_sites=3, cases_per_site=8)
    cfg = make_cfg(["fedavg", "fedsm"])
    run_study(plan_holdout(cfg, tmp_path, ["site2"], fed))

    sub = tmp_path / "holdout" / "site2"
    assert json.loads((sub / "summary.json").read_text())["sites"] == ["site1", "site3"]
    assert {r["site"] for r in _rows(sub / "ledger.csv")} == {"site1", "site3"}
    assert "site2" not in {r["site"] for r in _rows(sub / "results.csv")}

    with open(tmp_path / "unseen.csv", newline="") as f:
        assert next(csv.reader(f)) == unseen_columns(SITES)
    rows = {r["algorithm"]: r for r in _rows(tmp_path / "unseen.csv")}
    assert set(rows) == {"fedavg", "fedsm"}
    assert all(r["unseen_site"] == "site2" and r["cases"] == "8" and r["run"] == "holdout/site2" for r in rows.values())
    assert _rows(sub / "unseen.csv") == list(rows.values())

    # FedSM at gamma = 0: always a personalized model of a training site
    sm = rows["fedsm"]
    assert float(sm["gamma"]) == 0.0 and float(sm["freq_GM"]) == 0.0
    assert _freq_sum(sm, "site2") == pytest.approx(1.0)
    assert float(sm["best_dice"]) >= float(sm["dice"])
    grid = json.loads((tmp_path / "unseen.json").read_text())["rows"][1]["curve"]
    assert [p["gamma"] for p in grid] == [0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 0.99, 1.0]
    assert grid[-1]["freq_GM"] == 1.0  # gamma = 1: the global model for every image
    assert max(p["dice"] for p in grid) == pytest.approx(float(sm["best_dice"]))
    assert float(sm["val_gamma"]) in [p["gamma"] for p in grid]

    # fedavg: one model, no selection columns; its Dice = the saved global model on all of site2's cases
    avg = rows["fedavg"]
    assert avg["gamma"] == avg["freq_GM"] == avg["best_dice"] == ""
    task = Task.of(cfg, fed)
    model = task.new_model()
    tensors = load_file(sub / "model" / "fedavg" / "weights.safetensors")
    load_weights(model, {k.split("/", 1)[1]: v for k, v in tensors.items() if k.startswith("global/")})
    data = unseen_caseset(fed, "site2", cfg)
    assert sorted(data.ids) == sorted(c.id for c in fed.site("site2").cases)
    dice = score_caseset(model, data, 16, 0.5, False, torch.device("cpu"), regions=task.scored_regions)["dice"]
    assert float(avg["dice"]) == pytest.approx(float(np.nanmean(dice, axis=1).mean()), abs=1e-9)

    sections = study_sections(tmp_path)
    assert len(sections) == 1 and "Unseen sites (FedSM Table 5 layout)" in sections[0] and "N/A" in sections[0]
    assert all(r["converged"] == "no" for r in rows.values())  # 1 round: the page says so (it said nothing)
    assert "<b>May not have converged</b>: FedAvg without site2, FedSM without site2 (" in sections[0]
    page = render_study(tmp_path).read_text()
    assert 'href="holdout/site2/report.html"' in page and (sub / "report.html").is_file()


def test_leave_one_out_resumes_finished_holdouts_and_writes_one_row_per_site(tmp_path, make_cfg, disc_federation):
    fed = disc_federation(n_sites=3, cases_per_site=8)
    cfg = make_cfg(["fedsm"])
    run_study(plan_holdout(cfg, tmp_path, ["site1"], fed))  # an interrupted leave-one-out: site1 done
    ckpt = tmp_path / "holdout" / "site1" / "checkpoints" / "fedsm.pt"
    stamp, first = ckpt.stat().st_mtime_ns, _rows(tmp_path / "unseen.csv")[0]

    with pytest.raises(FileExistsError, match="--resume"):
        run_study(plan_holdout(cfg, tmp_path, None, fed))
    run_study(plan_holdout(cfg, tmp_path, None, fed), resume=True)
    assert ckpt.stat().st_mtime_ns == stamp  # site1 reused, not retrained
    rows = _rows(tmp_path / "unseen.csv")
    assert [r["unseen_site"] for r in rows] == SITES and rows[0] == first
    for r in rows:
        assert _freq_sum(r, r["unseen_site"]) == pytest.approx(1.0)
        assert json.loads((tmp_path / r["run"] / "summary.json").read_text())["sites"] == [
            s for s in SITES if s != r["unseen_site"]
        ]

    # the leave-one-out resumed as a holdout of one site would drop site2 and site3 from the study: refused
    before = _files(tmp_path)
    with pytest.raises(ValueError, match=r"holdout sites site1, site2, site3 -> site1 .*drops site2, site3"):
        run_study(plan_holdout(cfg, tmp_path, ["site1"], fed), resume=True)
    assert _files(tmp_path) == before


# --- sweep ------------------------------------------------------------------------------------
def test_sweep_runs_one_complete_run_per_value_with_that_value_in_its_config(tmp_path, make_cfg, disc_federation):
    fed = disc_federation(n_sites=3, cases_per_site=8)
    run_study(plan_sweep(make_cfg(["fedavg", "fedsm"]), tmp_path, "methods.fedsm.lam=0.5,1.0", fed))
    rows = _rows(tmp_path / "sweep.csv")
    assert [(r["value"], r["algorithm"]) for r in rows] == [
        ("0.5", "fedavg"),
        ("0.5", "fedsm"),
        ("1.0", "fedavg"),
        ("1.0", "fedsm"),
    ]
    assert list(rows[0]) == [
        "key",
        "value",
        "algorithm",
        "val_dice",
        "converged",
        *(f"dice_{s}" for s in SITES),
        "dice_client_avg",
        "dice_global",
        "hd95_client_avg",
        "nsd_client_avg",
        "run",
    ]
    for r in rows:
        sub = tmp_path / r["run"]
        assert sub == tmp_path / "sweep" / f"methods.fedsm.lam={r['value']}"
        assert yaml.safe_load((sub / "config.yaml").read_text())["methods"]["fedsm"]["lam"] == float(r["value"])
        summary = json.loads((sub / "summary.json").read_text())["algorithms"][r["algorithm"]]
        assert float(r["dice_client_avg"]) == pytest.approx(summary["dice"]["client_avg"])
        nsd = summary["nsd"]["client_avg"]  # eval.hd95 off: no NSD either (summary.json: null, or NaN before that)
        assert r["nsd_client_avg"] == "" and (nsd is None or math.isnan(nsd))
        assert float(r["dice_site2"]) == pytest.approx(summary["dice"]["site2"])
        assert float(r["val_dice"]) == pytest.approx(summary["convergence"]["best_val_dice"])
        assert r["converged"] == "no" and summary["convergence"]["converged"] is False  # 1 round: its best the last
    assert json.loads((tmp_path / "sweep.json").read_text())["rows"][1]["dice_global"] == pytest.approx(
        float(rows[1]["dice_global"])
    )
    (section,) = study_sections(tmp_path)
    assert "Sweep over methods.fedsm.lam (FedSM Table 7 layout)" in section
    assert "<b>May not have converged</b>: FedAvg: 0.5, FedSM: 0.5, FedAvg: 1.0, FedSM: 1.0 (" in section


def test_sweep_resumed_with_other_values_is_refused_and_may_only_add_values(tmp_path, make_cfg, disc_federation):
    """A resume that drops a recorded value would leave its sub-run out of sweep.csv and study.json: refused (old ->
    new) before anything is written; a resume that keeps every recorded value may add new ones."""
    fed = disc_federation(n_sites=3, cases_per_site=4)
    cfg = make_cfg(["fedavg"])
    run_study(plan_sweep(cfg, tmp_path, "train.lr=0.001", fed))
    before = _files(tmp_path)
    with pytest.raises(ValueError, match=r"train.lr=0.001 -> train.lr=0.01,0.1 .*drops 0.001.*train.lr=0.001,0.01,0.1"):
        run_study(plan_sweep(cfg, tmp_path, "train.lr=0.01,0.1", fed), resume=True)
    assert _files(tmp_path) == before

    run_study(plan_sweep(cfg, tmp_path, "train.lr=0.01,0.001", fed), resume=True)  # 0.001 reused, 0.01 added
    assert [r["value"] for r in _rows(tmp_path / "sweep.csv")] == ["0.01", "0.001"]
    assert json.loads((tmp_path / STUDY_FILE).read_text())["values"] == ["0.01", "0.001"]


def test_a_study_and_a_plain_run_refuse_each_others_folders(tmp_path, make_cfg, disc_federation):
    """A study on a run's folder would add its tables and replace the run's report; a run on a study's folder would
    train into it and replace the study's report: each is refused, with or without --resume, before writing."""
    fed = disc_federation(n_sites=3, cases_per_site=4)
    plain, study = tmp_path / "plain", tmp_path / "study"
    run_experiment(make_cfg(["fedavg"]), plain, federation=fed)
    run_study(plan_sweep(make_cfg(["fedavg"]), study, "train.lr=0.01", fed))
    runs, studies = _files(plain), _files(study)
    cfg = make_cfg(["fedavg", "fedsm"])
    for resume in (False, True):
        for plan in (plan_sweep(cfg, plain, "train.lr=0.01", fed), plan_holdout(cfg, plain, ["site1"], fed)):
            with pytest.raises(FileExistsError, match=r"plain: holds a run \(config.yaml\), not a study; .*--out"):
                run_study(plan, resume)
        with pytest.raises(FileExistsError, match=r"study: holds a study \(study.json\), not a run; .*another --out"):
            run_experiment(cfg, study, resume, federation=fed)
        with pytest.raises(FileExistsError, match=r"study: holds a study"):  # the Flower coordinator's check
            check_new_or_resumed(study, resume, cfg.data.root)
    assert _files(plain) == runs and _files(study) == studies


@pytest.mark.parametrize(
    "spec, named",
    [
        ("fl.lambda=0.1,0.3", "fl.lambda"),  # no such key
        ("methods.fedsm.lamm=0.5", "lamm"),  # no such option
        ("methods.fedsm.lam=0.5,2", "lam"),  # 2 > 1
        ("methods.fedsm.lam=0.5,0", "lam"),  # lambda must be > 0 (below 1/K is allowed, with a warning)
        ("methods.fedprox.mu=0.1", "fedprox"),  # not among the run's algorithms
        ("train.lr=0.1,", "empty value"),
    ],
)
def test_bad_sweep_fails_before_writing_anything(tmp_path, spec, named, make_cfg, disc_federation):
    with pytest.raises(ConfigError, match=named):
        plan_sweep(make_cfg(["fedsm"]), tmp_path / "out", spec, disc_federation(n_sites=3, cases_per_site=4))
    assert not (tmp_path / "out").exists()


def test_sweep_values_keep_commas_inside_yaml_lists():
    assert parse_sweep("model.channels=[4,8],[8, 16]") == ("model.channels", ["[4,8]", "[8, 16]"])
    assert run_label("data.root", "/a b") == "data.root=_a_b"


# --- command line -----------------------------------------------------------------------------


def test_cli_holdout_on_a_folder_federation_and_study_report(tmp_path, disc_federation):
    root = write_folder(disc_federation(n_sites=3, cases_per_site=6), tmp_path / "fed")
    out = tmp_path / "study"
    result = runner.invoke(
        app,
        [
            "run",
            "--preset",
            "demo",
            "--data",
            str(root),
            "--algorithms",
            "fedavg",
            "--rounds",
            "1",
            "--holdout",
            "site3",
            "--out",
            str(out),
            *TINY,
        ],
    )
    assert result.exit_code == 0, result.output
    (row,) = _rows(out / "unseen.csv")
    assert row["unseen_site"] == "site3" and row["cases"] == "6" and not math.isnan(float(row["dice"]))
    assert (out / "report.html").is_file() and (out / "holdout" / "site3" / "report.html").is_file()
    (out / "report.html").unlink()
    result = runner.invoke(app, ["report", str(out)])
    assert result.exit_code == 0, result.output
    assert "Unseen sites" in (out / "report.html").read_text()


def test_a_method_without_an_unseen_site_row_is_said_once_on_the_terminal_and_in_unseen_json(tmp_path, disc_federation):
    """``local`` keeps one model per training site: no row in unseen.csv (docs/benchmark-protocol.md), and the
    terminal says so in one line for the whole leave-one-out (not one per held-out site), naming its sites and why;
    unseen.json (the study's and each sub-run's) lists the same lines under ``no_row``."""
    root = write_folder(disc_federation(n_sites=3, cases_per_site=4), tmp_path / "fed")
    out = tmp_path / "study"
    args = ["run", "--preset", "demo", "--data", str(root), "--algorithms", "fedavg,local", "--rounds", "1"]
    result = runner.invoke(app, [*args, "--leave-one-out", "--out", str(out), *TINY])
    assert result.exit_code == 0, result.output
    said = " ".join(result.output.split())
    line = (
        "local (unseen site1, site2, site3): it has no global or super model to score on a site it never trained on, "
        "only local:site1, local:site2, local:site3 (docs/benchmark-protocol.md: such a method gets no row)"
    )
    assert said.count("no unseen-site row for") == 1 and f"no unseen-site row for {line}" in said, said
    assert {r["algorithm"] for r in _rows(out / "unseen.csv")} == {"fedavg"}
    assert json.loads((out / "unseen.json").read_text())["no_row"] == [line]
    assert json.loads((out / "holdout" / "site2" / "unseen.json").read_text())["no_row"] == [
        "local (unseen site2): it has no global or super model to score on a site it never trained on, only "
        "local:site1, local:site3 (docs/benchmark-protocol.md: such a method gets no row)"
    ]
    from fedseg.report.study_tables import unseen_section

    page = " ".join(unseen_section(out).split())  # the study's report says it under the table too
    assert f"<b>No row</b>: {line}." in page.replace("&#x27;", "'"), page[-600:]


def test_cli_rejects_unknown_holdout_site_bad_sweep_and_combinations(tmp_path, disc_federation):
    root = write_folder(disc_federation(n_sites=2, cases_per_site=4), tmp_path / "fed")
    out = tmp_path / "out"
    base = ["run", "--preset", "demo", "--data", str(root), "--out", str(out), *TINY]
    result = runner.invoke(app, [*base, "--holdout", "nowhere"])
    assert (
        result.exit_code == 1 and "nowhere" in result.output and "site1" in result.output and "site2" in result.output
    )
    result = runner.invoke(app, [*base, "--sweep", "fl.lambda=0.1,0.3"])
    assert result.exit_code == 1 and "fl.lambda" in result.output
    result = runner.invoke(app, [*base, "--sweep", "train.lr=0.1", "--leave-one-out"])
    assert result.exit_code == 1 and "cannot be combined" in result.output
    assert not out.exists()


def test_fedsm_leave_one_out_on_two_sites_fails_before_writing_anything(tmp_path, tiny_config, disc_federation):
    """Each sub-run would train FedSM on one site (K = 1): refused when the study is planned."""
    cfg = tiny_config(algorithms=["fedavg", "fedsm"])
    with pytest.raises(ValueError, match="fedsm needs at least 2 sites"):
        plan_holdout(cfg, tmp_path / "s", federation=disc_federation(n_sites=2))
    assert not (tmp_path / "s").exists()


def test_fedsm_holdout_with_lambda_below_1_over_k_of_the_training_sites_is_planned(tmp_path, make_cfg, disc_federation):
    """lam = 0.4 is below 1/K for the K - 1 = 2 sites each holdout sub-run trains on: allowed (FedSM's own Table 7
    runs lambda below 1/K); the run announces it when it starts (fedseg.run.cost_warnings)."""
    cfg = make_cfg(["fedavg", "fedsm"], lam=0.4)
    study = plan_holdout(cfg, tmp_path / "s", federation=disc_federation(n_sites=3, cases_per_site=4))
    assert [r.label for r in study.runs] == ["site1", "site2", "site3"]
    assert "below 1/K = 0.5 for K = 2" in cost_warnings(cfg, 2)[0]
