"""What a newcomer reads of a run: the terminal's Dice table (its ``pooled`` column and legend), the progress bar's
validation Dice, the note that FedProx trains as FedAvg when a round is one local step, and 3D HD95 in voxels."""

from __future__ import annotations

import io
import json
import re
import sys
from dataclasses import replace

import torch
from rich.console import Console

from fedseg.console_tables import print_dice
from fedseg.data.federation import Case, Federation, Regions, Site
from fedseg.run import method_notes, prepare, run_experiment
from fedseg.run.outputs import RunResults, hd95_unit, summary_dict
from fedseg.run.progress import run_with_progress
from volume_cases import boxed_case

ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


def test_the_dice_table_heads_the_pooled_mean_pooled_and_says_what_its_columns_mean():
    out = io.StringIO()
    dice = {
        "local": {"site1": 0.71, "site2": 0.88, "client_avg": 0.7975, "global": 0.8854},
        "fedavg": {"site1": 0.8, "site2": float("nan"), "client_avg": 0.8, "global": 0.8},
    }
    print_dice(Console(file=out, width=80), "Test Dice (discs)", ["site1", "site2"], dice)
    lines = out.getvalue().splitlines()
    header = next(line for line in lines if "algorithm" in line)
    assert re.findall(r"\w+", header) == ["algorithm", "site1", "site2", "client_avg", "pooled"]
    local = next(line for line in lines if "local" in line)
    assert local.split("│")[-2].strip() == "0.8854"  # summary.json's dice.global, under "pooled"
    legend = lines[-1]  # under the table, one line
    assert legend.startswith("per site: ") and "client_avg: mean of the site means" in legend
    assert "pooled: mean over all test cases pooled (summary.json dice.global), not the global model" in legend


def test_the_progress_bar_shows_the_last_validated_rounds_mean_val_dice(
    tmp_path, tiny_config, disc_federation, monkeypatch
):
    monkeypatch.setattr(sys.stdout, "isatty", lambda: True)
    out = io.StringIO()
    console = Console(file=out, force_terminal=True, width=200)
    cfg = tiny_config(algorithms=["fedavg"], fl={"rounds": 2})
    run_with_progress(cfg, tmp_path / "run", False, console, disc_federation(cases_per_site=6))
    text = ANSI.sub("", out.getvalue())
    round_lines = (tmp_path / "run" / "run.log").read_text().splitlines()
    last = re.search(r"round 2/2 mean val Dice (\S+)", "\n".join(round_lines)).group(1)
    assert re.search(r"round 2 mean loss \d\.\d{3} \| val Dice " + re.escape(last) + r"\s*$", text)  # as run.log


def test_fedprox_is_said_to_train_as_fedavg_when_a_round_is_one_local_step(tiny_config, disc_federation):
    cfg = tiny_config(algorithms=["fedavg", "fedprox"], train={"batch_size": 4})
    prep = prepare(cfg, disc_federation(cases_per_site=6))
    train = {d.name: len(d.train) for d in prep.site_data}
    assert all(0 < n <= 4 for n in train.values())  # one batch: one SGD step per round
    notes = [n for n in method_notes(cfg, prep.task, train) if "one local SGD step" in n]
    sites = ", ".join(f"{s} ({n} training cases)" for s, n in train.items())
    assert notes == [
        f"fedprox: {sites} train one local SGD step per round (batch size 4, train.budget: 1 epoch): the proximal "
        "term is zero on a round's first step, so FedProx trains exactly as FedAvg; a larger local budget "
        "(train.budget, methods.fedprox.local_steps) lets it differ"
    ]
    steps = tiny_config(algorithms=["fedprox"], methods={"fedprox": {"local_steps": 1}})
    assert (
        "every site trains one local SGD step per round (methods.fedprox.local_steps = 1)"
        in method_notes(steps, replace(prep.task, cfg=steps), train)[0]
    )
    two = tiny_config(algorithms=["fedprox"], train={"batch_size": 2})  # two steps: the term acts from the second
    assert method_notes(two, replace(prep.task, cfg=two), train) == []
    assert method_notes(cfg, prep.task) == []  # no site data (a Flower coordinator): nothing said


def test_a_one_step_fedprox_run_says_so_and_scores_as_fedavg(tmp_path, tiny_config, disc_federation):
    cfg = tiny_config(algorithms=["fedavg", "fedprox"], fl={"rounds": 1})
    lines: list[str] = []
    results = run_experiment(
        cfg, tmp_path / "run", federation=disc_federation(cases_per_site=6), on_log_line=lines.append
    )
    assert any(line.startswith("fedprox: ") and "trains exactly as FedAvg" in line for line in lines)
    fedavg, fedprox = (a.bundle["global"] for a in results.algorithms)
    assert all(torch.equal(fedprox[k], v) for k, v in fedavg.items())  # what the note says


def test_a_one_step_scaffold_run_says_so_and_scores_as_fedavg_but_not_where_a_site_takes_more(
    tmp_path, tiny_config, disc_federation
):
    """A user's bench found SCAFFOLD equal to FedAvg on every case, unexplained: with one local step at every site
    its corrections c - c_k cancel in the average (c is the sites' weighted mean), so its model is FedAvg's (to
    rounding: the corrections are added, then averaged away), from round 2 on too, when they are not zero. Said
    only where it holds: every site one step, every site each round, server rate 1."""
    cfg = tiny_config(algorithms=["fedavg", "scaffold"], fl={"rounds": 2})
    lines: list[str] = []
    results = run_experiment(
        cfg, tmp_path / "run", federation=disc_federation(cases_per_site=6), on_log_line=lines.append
    )
    said = [line for line in lines if line.startswith("scaffold: ")]
    assert said and "SCAFFOLD's model is exactly FedAvg's" in said[0] and "site3 (3 training cases)" in said[0], lines
    fedavg, scaffold = (a.bundle["global"] for a in results.algorithms)
    assert all(torch.allclose(scaffold[k], v, atol=1e-6) for k, v in fedavg.items())
    prep = prepare(cfg, disc_federation(cases_per_site=6))
    train = {d.name: len(d.train) for d in prep.site_data}
    for other in (
        {"methods": {"scaffold": {"global_lr": 0.5}}},
        {"fl": {"clients_per_round": 0.5}},
        {"fl": {"clients_per_round": 1}},  # one site a round (1 == 1.0: taken for every site before the review)
        {"methods": {"scaffold": {"weighting": "uniform"}}},
        {"train": {"batch_size": 2}},
    ):
        changed = tiny_config(algorithms=["scaffold"], **other)
        assert method_notes(changed, replace(prep.task, cfg=changed), train) == [], other


def _volumes() -> Federation:
    regions = Regions.from_mapping({"box": [1, 2]})
    sites = [
        Site(f"site{k + 1}", [Case.from_arrays(f"v{k}{i}", *boxed_case((16, 16, 12), 10 * k + i, 1)) for i in range(5)])
        for k in range(2)
    ]
    return Federation("boxes", "3d", 2, regions, sites)


def test_hd95_of_a_3d_federation_on_the_whole_volume_path_is_in_voxels(tiny_config, disc_federation):
    cfg = tiny_config(algorithms=["fedavg"], data={"image_size": 16})
    assert summary_dict(RunResults(cfg, _volumes(), []))["hd95_unit"] == "voxels"
    assert summary_dict(RunResults(cfg, disc_federation(), []))["hd95_unit"] == "pixels"
    patches = tiny_config(data={"volume": {"patch_size": 16}})
    assert hd95_unit(patches, "3d") == "mm" and hd95_unit(cfg, "3d") == "voxels" and hd95_unit(cfg, "2d") == "pixels"


def test_a_3d_run_records_voxels_and_its_report_says_so(tmp_path, tiny_config):
    from fedseg.report.html import render_report

    cfg = tiny_config(algorithms=["fedavg"], data={"image_size": 16}, fl={"rounds": 1})
    run_experiment(cfg, tmp_path / "run", federation=_volumes())
    assert json.loads((tmp_path / "run" / "summary.json").read_text())["hd95_unit"] == "voxels"
    html = render_report(tmp_path / "run").read_text()
    assert "Test HD95 (voxels)" in html and "HD95 (pixels)" not in html
