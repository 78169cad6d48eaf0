"""Whole runs through the simulator: outputs, determinism, resume, message contents."""

from __future__ import annotations

import csv
import json
import os
import stat

import pytest
import torch

from fedseg.engine.checkpoint import CheckpointWriter, load_checkpoint
from fedseg.run import run_experiment


def _numbers(summary: dict) -> dict:
    """summary.json without wall-clock seconds."""
    return {a: {k: v for k, v in e.items() if k != "seconds"} for a, e in summary["algorithms"].items()}


def test_run_writes_every_output_file(tmp_path, tiny_config, disc_federation):
    cfg = tiny_config(algorithms=["centralized", "local", "fedavg"])
    umask = os.umask(0o022)  # a usual umask: files would be 0644 unless written private
    try:
        run_experiment(cfg, tmp_path, federation=disc_federation())
    finally:
        os.umask(umask)
    for name in ("config.yaml", "summary.json", "results.csv", "rounds.csv", "ledger.csv"):
        assert (tmp_path / name).is_file(), name
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["sites"] == ["site1", "site2", "site3"] and summary["regions"] == ["disc", "cup"]
    for algo in ("centralized", "local", "fedavg"):
        entry = summary["algorithms"][algo]
        assert set(entry["dice"]) == {"site1", "site2", "site3", "client_avg", "global"}
        assert 0.0 <= entry["dice"]["global"] <= 1.0 and entry["rounds"] == 2
        assert (tmp_path / "model" / algo / "weights.safetensors").is_file()
    assert set(summary["algorithms"]["local"]["cross_site"]["dice"]) == {"site1", "site2", "site3"}
    with open(tmp_path / "results.csv") as f:
        header = next(csv.reader(f))
    assert header == ["algorithm", "model", "site", "case", "region", "metric", "value"]
    # each site's sample is a patient's image with its prediction: its owner's only, as its folder
    samples = sorted((tmp_path / "samples").glob("*.npz"))
    assert len(samples) == 9 and stat.S_IMODE((tmp_path / "samples").stat().st_mode) == 0o700
    assert {stat.S_IMODE(p.stat().st_mode) for p in samples} == {0o600}


def test_same_seed_gives_identical_numbers(tmp_path, tiny_config, disc_federation):
    cfg = tiny_config(algorithms=["local", "fedavg"])
    a = run_experiment(cfg, tmp_path / "a", federation=disc_federation())
    run_experiment(cfg, tmp_path / "b", federation=disc_federation())
    sa = json.loads((tmp_path / "a" / "summary.json").read_text())
    sb = json.loads((tmp_path / "b" / "summary.json").read_text())
    assert _numbers(sa) == _numbers(sb)
    other = run_experiment(tiny_config(algorithms=["fedavg"], seed=1), tmp_path / "c", federation=disc_federation())
    assert other.algorithms[0].summary["dice"] != a.algorithms[1].summary["dice"]


class _Stop(Exception):
    pass


@pytest.mark.parametrize("validate_every, stop_round, best_is_current", [(1, 2, True), (2, 3, False)])
def test_resume_after_interruption_equals_uninterrupted_run(
    tmp_path, validate_every, stop_round, best_is_current, tiny_config, disc_federation
):
    """Both checkpoint forms of the best round: the checkpointed round itself (stored as a marker)
    and an earlier round (stored as a copy of the states)."""
    cfg = tiny_config(algorithms=["local", "fedavg"], fl={"rounds": 4, "validate_every": validate_every})
    full = run_experiment(cfg, tmp_path / "full", federation=disc_federation())

    def stop_after_fedavg_round(name, rnd, losses):
        if name == "fedavg" and rnd == stop_round:
            raise _Stop

    with pytest.raises(_Stop):
        run_experiment(cfg, tmp_path / "cut", on_round_end=stop_after_fedavg_round, federation=disc_federation())
    folder = tmp_path / "cut" / "checkpoints"
    best = load_checkpoint(folder / "fedavg.pt")["best"]
    assert bool(best.get("current")) == best_is_current
    best_files = sorted(p.name for p in folder.glob("fedavg.best-*.pt"))
    assert best_files == ([] if best_is_current else [best["file"]])  # written once, stale ones deleted
    with pytest.raises(FileExistsError):
        run_experiment(cfg, tmp_path / "cut", federation=disc_federation())
    resumed = run_experiment(cfg, tmp_path / "cut", resume=True, federation=disc_federation())
    assert not list(folder.glob("*.best-*.pt"))  # a finished run keeps no best-round files

    for a, b in zip(full.algorithms, resumed.algorithms):
        assert a.name == b.name
        for model in a.bundle:
            for k in a.bundle[model]:
                assert torch.equal(a.bundle[model][k], b.bundle[model][k]), (a.name, model, k)
    s_full = json.loads((tmp_path / "full" / "summary.json").read_text())
    s_cut = json.loads((tmp_path / "cut" / "summary.json").read_text())
    assert _numbers(s_full) == _numbers(s_cut)


def test_no_message_carries_image_or_label_data(tmp_path, tiny_config, disc_federation):
    fed = disc_federation()
    images = [c.arrays()[0] for s in fed.sites for c in s.cases]
    image_shapes = {tuple(i.shape) for i in images} | {(3, 32, 32), (32, 32), (2, 32, 32), (1, 3, 32, 32)}
    seen = []

    def inspect(site, action, msg, reply):
        for m in (msg, reply):
            for name, t in m.tensors.items():
                seen.append(name)
                # An image or mask would appear as a tensor with an image's spatial shape.
                assert tuple(t.shape[-2:]) != (32, 32), f"{action} {site} {name} has image shape {tuple(t.shape)}"
                assert tuple(t.shape) not in image_shapes, name

    cfg = tiny_config(algorithms=["centralized", "local", "fedavg"])
    run_experiment(cfg, tmp_path, observers=[inspect], federation=fed)
    assert any(n.startswith("model/") for n in seen) and "dice" in seen


def test_checkpoint_writer_writes_the_last_snapshot_and_reports_errors(tmp_path):
    t = torch.zeros(3)
    with CheckpointWriter() as writer:
        writer.save(tmp_path / "a.pt", {"t": torch.ones(3)})
        writer.save(tmp_path / "a.pt", {"t": t})
        t += 1  # the bytes were taken at save(): later changes must not reach the file
    assert torch.equal(load_checkpoint(tmp_path / "a.pt")["t"], torch.zeros(3))
    (tmp_path / "file").write_text("x")
    writer = CheckpointWriter()
    writer.save(tmp_path / "file" / "b.pt", {"t": t})  # parent is a file: the background write fails
    cleaned = []
    with pytest.raises(OSError):  # raised by the next call on the writer or by close, whichever comes first
        try:
            writer.then(lambda: cleaned.append(True))  # a clean-up never follows a failed write
        finally:
            writer.close()
    assert cleaned == []


@pytest.mark.parametrize("source", ["synthetic-retina", "synthetic-prostate", "folder"])
def test_count_sites_agrees_with_the_loaded_federation_without_loading_it(
    tmp_path, source, tiny_config, disc_federation
):
    from fedseg.data.folder_write import write_folder
    from fedseg.run import count_sites, load_federation

    data = {"source": source, "scale": 0.02, "image_size": 32}
    if source == "folder":
        data = {
            "source": "folder",
            "root": str(write_folder(disc_federation(n_sites=4, cases_per_site=4), tmp_path / "fed")),
        }
    cfg = tiny_config(data=data)
    assert count_sites(cfg) == len(load_federation(cfg).sites) == (4 if source == "folder" else 6)


def test_nsd_is_a_third_metric_of_results_and_summary(tmp_path, tiny_config, disc_federation):
    """NSD rows next to Dice and HD95 in results.csv, its summary.json entry and tolerance; the tolerance changes
    NSD only (per region: disc 0.5 px, cup 3 px vs 3 px everywhere)."""
    runs = {}
    for name, tol in (("tight", {"disc": 0.5, "cup": 3.0}), ("loose", 3.0)):
        cfg = tiny_config(algorithms=["fedavg"], fl={"rounds": 1}, eval={"local_models": False, "nsd_tolerance": tol})
        run_experiment(cfg, tmp_path / name, federation=disc_federation())
        with open(tmp_path / name / "results.csv") as f:
            rows = list(csv.DictReader(f))
        runs[name] = ({(r["case"], r["region"], r["metric"]): float(r["value"]) for r in rows}, rows)
    values, rows = runs["tight"]
    metrics = [r["metric"] for r in rows]
    assert metrics.count("nsd") == metrics.count("dice") == metrics.count("hd95") > 0
    summary = json.loads((tmp_path / "tight" / "summary.json").read_text())
    assert summary["nsd_tolerance"] == {"disc": 0.5, "cup": 3.0} and summary["hd95_unit"] == "pixels"
    nsd = summary["algorithms"]["fedavg"]["nsd"]
    assert set(nsd) == {"site1", "site2", "site3", "client_avg", "global"}
    assert all(0.0 <= v <= 1.0 for v in nsd.values())
    for (case, region, metric), v in values.items():
        if metric == "nsd":
            assert 0.0 <= v <= 1.0
            if values[(case, region, "dice")] == 1.0:  # identical masks (or both empty): every boundary point fits
                assert v == 1.0
    loose = runs["loose"][0]
    assert {k: v for k, v in values.items() if k[2] != "nsd"} == {k: v for k, v in loose.items() if k[2] != "nsd"}
    disc = [k for k in values if k[2] == "nsd" and k[1] == "disc"]
    cup = [k for k in values if k[2] == "nsd" and k[1] == "cup"]
    assert all(loose[k] >= values[k] for k in disc) and any(loose[k] > values[k] for k in disc)
    assert all(loose[k] == values[k] for k in cup)  # the same 3 px for the cup


def test_an_nsd_tolerance_mapping_must_name_every_region_before_training(tmp_path, tiny_config, disc_federation):
    cfg = tiny_config(algorithms=["fedavg"], eval={"nsd_tolerance": {"disc": 1.0}})
    with pytest.raises(ValueError, match=r"eval.nsd_tolerance: .*missing \['cup'\]"):
        run_experiment(cfg, tmp_path / "out", federation=disc_federation())
    assert not (tmp_path / "out" / "summary.json").exists()
