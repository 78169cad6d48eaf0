"""The FL methods' local models (Auto-FedAvg Table 2: "local avg" / "local gen", ``eval.local_models``).

Each site keeps the model it held right after local training in the round where that model scored
best on its own validation split; the test scores every kept model on every site's test split.
The numbers are recomputed here from the train replies (the locally trained models) seen by an
observer, independently of the client's bookkeeping.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch

import fedseg.run.experiment
from fedseg.algorithms.fedavg import FedAvgServer
from fedseg.algorithms.prefixes import MODEL
from fedseg.engine.messages import load_weights
from fedseg.evaluate.inference import score_caseset
from fedseg.evaluate.tables import site_dice
from fedseg.report.html import render_report
from fedseg.run import prepare, run_experiment

SITES = ["site1", "site2", "site3"]
CROSS_KEYS = {"cross_site", "local_avg", "local_gen"}


def _numbers(summary: dict) -> dict:
    """summary.json without wall-clock seconds."""
    return {a: {k: v for k, v in e.items() if k != "seconds"} for a, e in summary["algorithms"].items()}


def _config(tiny_config, **eval_overrides):
    """FedAvg, 3 rounds, a rate at which the tiny model improves from round to round."""
    return tiny_config(algorithms=["fedavg"], fl={"rounds": 3}, train={"lr": 0.01}, eval=eval_overrides)


def _run(cfg, out, federation, **kwargs):
    """A run whose best *global* round is forced to round 1 (only round 1 is selectable), so the
    restored client states are round 1's while the sites' best local rounds come later."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(FedAvgServer, "selectable", lambda self, rnd: rnd == 1)
        return run_experiment(cfg, out, federation=federation, **kwargs)


class Recorder:
    """Observer keeping every site's train replies (in round order) and share_model replies."""

    def __init__(self):
        self.trained: dict[str, list[dict]] = {s: [] for s in SITES}
        self.shared: dict[str, dict] = {}

    def __call__(self, site, action, msg, reply):
        if action == "train":
            self.trained[site].append({k: v.clone() for k, v in reply.group(MODEL).items()})
        elif action == "share_model":
            self.shared[site] = reply.group(MODEL)


@pytest.fixture(scope="module")
def fedavg_run(tmp_path_factory, tiny_config, disc_federation):
    out = tmp_path_factory.mktemp("fedavg")
    cfg = _config(tiny_config)
    recorder = Recorder()
    result = _run(cfg, out, disc_federation(), observers=[recorder])
    return cfg, out, result, recorder


def _dice(weights: dict, data, task) -> float:
    model = task.new_model()
    load_weights(model, weights)
    ev = task.cfg.eval
    regions = task.scored_regions
    dice = score_caseset(model, data, ev.batch_size, ev.threshold, False, task.device, regions=regions)["dice"]
    return site_dice(dice, data.ids, data.name, task.regions)


def test_cross_site_matrix_is_the_best_local_models_over_all_rounds(fedavg_run, disc_federation):
    cfg, out, result, rec = fedavg_run
    entry = json.loads((out / "summary.json").read_text())["algorithms"]["fedavg"]
    assert CROSS_KEYS <= entry.keys() and entry["best_round"] == 1
    prep = prepare(cfg, disc_federation())
    data = {d.name: d for d in prep.site_data}
    kept_rounds = {}
    for owner in SITES:
        assert len(rec.trained[owner]) == cfg.fl.rounds
        val = [_dice(w, data[owner].val, prep.task) for w in rec.trained[owner]]
        best = int(np.argmax([-math.inf if math.isnan(v) else v for v in val]))  # first on ties, as kept
        kept_rounds[owner] = best + 1
        kept = rec.trained[owner][best]
        assert rec.shared[owner].keys() == kept.keys()
        assert all(torch.equal(rec.shared[owner][k], kept[k]) for k in kept)  # the model of that round
        for test_site in SITES:
            expected = _dice(kept, data[test_site].test, prep.task)
            assert entry["cross_site"]["dice"][owner][test_site] == pytest.approx(expected, abs=1e-12)
    # the case the test is for: a site's best local round comes after the best global round
    assert any(r > entry["best_round"] for r in kept_rounds.values()), kept_rounds
    m = np.array([[entry["cross_site"]["dice"][a][b] for b in SITES] for a in SITES])
    assert entry["local_avg"] == pytest.approx(np.mean(np.diag(m)))
    assert entry["local_gen"] == pytest.approx(np.mean(m[~np.eye(3, dtype=bool)]))
    # the summary's dice stays the global model's: recomputed from the global rows only
    global_rows = [r for r in result.algorithms[0].test_rows if r["model"] == "global"]
    local_rows = [r for r in result.algorithms[0].test_rows if r["model"].startswith("local:")]
    assert len(local_rows) == 3 * len(global_rows)  # every kept model on every site's test split
    assert {r["model"] for r in result.algorithms[0].test_rows} == {"global", *(f"local:{s}" for s in SITES)}


def test_switch_off_gives_no_local_models_and_the_same_global_numbers(
    fedavg_run, tmp_path, tiny_config, disc_federation
):
    cfg, out, on_result, _ = fedavg_run
    off = _run(_config(tiny_config, local_models=False), tmp_path, disc_federation())
    on_entry, off_entry = on_result.algorithms[0].summary, off.algorithms[0].summary
    assert not CROSS_KEYS & off_entry.keys()
    for key in ("dice", "hd95", "best_round", "floats_sent", "sgd_steps", "rounds"):
        assert off_entry[key] == on_entry[key], key
    assert not [r for r in off.algorithms[0].ledger if r["action"] == "share_model"]
    assert {r["model"] for r in off.algorithms[0].test_rows} == {"global"}
    train = lambda res: [  # noqa: E731
        (r["round"], r["site"], r["steps"], r["floats_down"], r["floats_up"])
        for r in res.algorithms[0].ledger
        if r["action"] == "train"
    ]
    assert train(off) == train(on_result)  # same training traffic, no extra message


@pytest.mark.parametrize("stop_round", [2, 3])
def test_resume_gives_identical_summary(stop_round, fedavg_run, tmp_path, tiny_config, disc_federation):
    """Stopped after round 2 (a round is left) and after the last round (only the test is left)."""
    cfg, out, _, _ = fedavg_run

    class Stop(Exception):
        pass

    def stop(name, rnd, losses):
        if rnd == stop_round:
            raise Stop

    with pytest.raises(Stop):
        _run(cfg, tmp_path, disc_federation(), on_round_end=stop)
    _run(cfg, tmp_path, disc_federation(), resume=True)
    full = json.loads((out / "summary.json").read_text())
    resumed = json.loads((tmp_path / "summary.json").read_text())
    assert CROSS_KEYS <= resumed["algorithms"]["fedavg"].keys()
    assert _numbers(resumed) == _numbers(full)


@pytest.mark.parametrize("name, has", [("qfedavg", True), ("fedsm", False), ("centralized", False)])
def test_which_methods_have_local_models(name, has, tmp_path, tiny_config, disc_federation):
    result = run_experiment(tiny_config(algorithms=[name]), tmp_path, federation=disc_federation())
    entry = result.algorithms[0].summary
    assert (CROSS_KEYS <= entry.keys()) == has and (CROSS_KEYS & entry.keys() == set()) == (not has)
    assert any(r["action"] == "share_model" for r in result.algorithms[0].ledger) == has


def test_report_shows_the_table2_layout(fedavg_run):
    _, out, result, _ = fedavg_run
    page = render_report(out).read_text()
    assert "Auto-FedAvg Table 2 layout" in page
    section = page[page.index("Auto-FedAvg Table 2 layout") :]
    head = section[: section.index("</thead>")]
    assert all(h in head for h in ("Global test avg", "Local avg", "Local gen"))
    entry = result.algorithms[0].summary
    row = section[section.index("<th>FedAvg</th>") :].split("</tr>")[0]
    for value in (entry["dice"]["client_avg"], entry["local_avg"], entry["local_gen"]):
        assert f"{value:.4f}" in row


class StopAtFirstAlgorithm(Exception):
    """Raised instead of training: the run's start is all the warning tests need."""


def _start(cfg, out, federation, monkeypatch, **kwargs) -> str:
    """Start a run of ``cfg`` and stop it before its first algorithm trains; returns ``out/run.log``."""

    def stop(*args, **kw):
        raise StopAtFirstAlgorithm

    monkeypatch.setattr(fedseg.run.experiment, "run_algorithm", stop)
    with pytest.raises(StopAtFirstAlgorithm):
        run_experiment(cfg, out, federation=federation, **kwargs)
    return (out / "run.log").read_text() if (out / "run.log").exists() else ""


def test_many_sites_warn_once_of_the_k_by_k_local_model_evaluations(
    tmp_path, tiny_config, disc_federation, monkeypatch, capsys
):
    """Above 20 sites, eval.local_models' K x K test evaluations are announced once at the start (run.log and the
    run's line output, else stderr), naming the switch that turns them off; not at 20 sites, not when off."""
    many = disc_federation(n_sites=21, cases_per_site=6)
    cfg = tiny_config(algorithms=["local", "fedavg"])
    shown: list[str] = []
    log = _start(cfg, tmp_path / "a", many, monkeypatch, on_log_line=shown.append)
    warning = [line for line in shown if "eval.local_models=false" in line]
    assert len(warning) == 1 and "21 x 21 = 441" in warning[0] and "fedavg" in warning[0]
    assert log.count("eval.local_models=false") == 1
    _start(cfg, tmp_path / "b", many, monkeypatch)  # no line output: stderr
    assert capsys.readouterr().err.count("eval.local_models=false") == 1
    off = tiny_config(algorithms=["fedavg"], eval={"local_models": False})
    assert "eval.local_models" not in _start(off, tmp_path / "c", many, monkeypatch)
    few = disc_federation(n_sites=20, cases_per_site=6)
    assert "eval.local_models" not in _start(cfg, tmp_path / "d", few, monkeypatch)
    assert "eval.local_models" not in capsys.readouterr().err


class EvalRecorder:
    """Observer keeping every evaluate exchange: ``(split, model, meta surface, reply hd95, reply nsd)``."""

    def __init__(self):
        self.seen: list[tuple] = []

    def __call__(self, site, action, msg, reply):
        if action == "evaluate":
            m = msg.meta
            self.seen.append((m["split"], m["model"], m.get("surface"), reply.tensors["hd95"], reply.tensors["nsd"]))


@pytest.mark.parametrize("cross_site_hd95", [False, True])
def test_surface_metrics_only_where_a_table_reports_them(
    cross_site_hd95, fedavg_run, tmp_path, tiny_config, disc_federation
):
    """Validation: Dice only; the test of the selected model: HD95/NSD; the cross-site rows only with
    eval.cross_site_hd95. Dice (and so the selection and every Dice number) is the same either way."""
    rec = EvalRecorder()
    cfg = _config(tiny_config, cross_site_hd95=cross_site_hd95)
    _run(cfg, tmp_path, disc_federation(), observers=[rec])
    surfaced = {
        (split, model.split(":")[0]): bool(torch.isfinite(torch.cat([hd.flatten(), nsd.flatten()])).all())
        for split, model, _, hd, nsd in rec.seen
    }
    nan = {
        (split, model.split(":")[0]): bool(torch.isnan(torch.cat([hd.flatten(), nsd.flatten()])).all())
        for split, model, _, hd, nsd in rec.seen
    }
    assert nan[("val", "global")] and surfaced[("test", "global")]
    assert (surfaced if cross_site_hd95 else nan)[("test", "local")]
    assert {(s, m.split(":")[0], f) for s, m, f, _, _ in rec.seen} == {
        ("val", "global", False),
        ("test", "global", True),
        ("test", "local", cross_site_hd95),
    }
    base = json.loads((fedavg_run[1] / "summary.json").read_text())["algorithms"]["fedavg"]
    entry = json.loads((tmp_path / "summary.json").read_text())["algorithms"]["fedavg"]
    assert entry["dice"] == base["dice"] and entry["cross_site"] == base["cross_site"]
    assert entry["hd95"] == base["hd95"] and entry["nsd"] == base["nsd"]  # the selected model's, as before
    assert "Auto-FedAvg Table 2 layout" in render_report(tmp_path).read_text()  # renders with NaN local HD95
