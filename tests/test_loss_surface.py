"""``fedseg loss-surface`` (FedSM Figure 4) on a tiny finished run: the curves pass through each model's own loss,
the directions are filter-normalized, the global -> personalized line ends at both models, the result is seeded."""

from __future__ import annotations

import csv
import json
import shutil

import pytest
import torch
from typer.testing import CliRunner

from fedseg.cli import app
from fedseg.config_load import load_config
from fedseg.engine.messages import load_weights
from fedseg.evaluate.loss_surface import filter_norms, random_direction
from fedseg.loss_surface import compute, write_csv
from fedseg.run import prepare
from fedseg.run.bundles import load_bundle
from fedseg.train import Trainer

runner = CliRunner()
SITE = "site2"
TINY_DEMO = [
    "--preset",
    "demo",
    "--algorithms",
    "local,fedavg,fedsm",
    "--rounds",
    "2",
    "--set",
    "data.image_size=32",
    "--set",
    "data.scale=0.05",
    "--set",
    "model.channels=[4,8,16]",
    "--set",
    "methods.fedsm.selector_width=0.0625",
    "--set",
    "eval.hd95=false",
]


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """A finished tiny run of the demo preset (local, FedAvg, FedSM; 2 rounds at 32x32)."""
    out = tmp_path_factory.mktemp("loss-surface") / "run"
    result = runner.invoke(app, ["run", *TINY_DEMO, "--out", str(out)])
    assert result.exit_code == 0, result.output
    return out


@pytest.fixture(scope="module")
def rows(run):
    """The CSV rows of 2 directions for SITE (seed 0)."""
    return compute([run], SITE, directions=2, seed=0)


def own_loss(run, algorithm: str, name: str) -> float:
    """The loss of one bundle model on SITE's training split, computed without ``fedseg.loss_surface``: the run's
    data through ``fedseg.run.prepare``, the Trainer's loss on the whole split as one batch."""
    cfg = load_config(file=run / "config.yaml")
    prep = prepare(cfg)
    train = prep.site_data[prep.federation.site_names.index(SITE)].train
    bundle = load_bundle(run / "model" / algorithm)
    model = bundle.new_segmenter()
    load_weights(model, bundle.models[name])
    model.eval()
    x, y = train.batch(torch.arange(len(train)), torch.device("cpu"))
    with torch.no_grad():
        return float(Trainer(cfg.train, torch.device("cpu")).loss_fn(model(x), y))


def at(rows, model: str, direction: str, t: float) -> list[float]:
    return [r["loss"] for r in rows if r["model"] == model and r["direction"] == direction and r["t"] == t]


def test_models_of_the_site(rows):
    models = {r["model"] for r in rows}
    assert models == {
        "local/local:site2",
        "fedavg/global",
        "fedsm/global",
        "fedsm/personal:site2",
        "fedsm/global->personal:site2",
    }
    assert {r["direction"] for r in rows} == {"1", "2", "line"}
    assert len([r for r in rows if r["model"] == "fedavg/global"]) == 2 * 21


def test_t0_of_every_direction_is_the_models_own_loss(run, rows):
    for model in ("local/local:site2", "fedavg/global", "fedsm/personal:site2"):
        algorithm, name = model.split("/")
        expected = own_loss(run, algorithm, name)
        for direction in ("1", "2"):
            (value,) = at(rows, model, direction, 0.0)
            assert value == pytest.approx(expected, abs=1e-6)
        # away from t = 0 the loss changes: the direction moved the weights
        assert at(rows, model, "1", 1.0)[0] != pytest.approx(expected, abs=1e-6)


def test_directions_are_filter_normalized(run):
    bundle = load_bundle(run / "model" / "fedavg")
    model = bundle.new_segmenter()
    weights = bundle.models["global"]
    d0, d0_again, d1 = (random_direction(model, weights, 0, j) for j in (0, 0, 1))
    checked = 0
    for name, _ in model.named_parameters():
        w = weights[name]
        assert d0[name].shape == w.shape
        if w.dim() <= 1:  # biases, norm layers: no move (Li et al.)
            assert not d0[name].any()
            continue
        torch.testing.assert_close(filter_norms(d0[name]), filter_norms(w), rtol=1e-5, atol=1e-7)
        assert not torch.equal(d0[name], d1[name])
        checked += 1
    assert checked >= 4
    assert all(torch.equal(d0[k], d0_again[k]) for k in d0)


def test_line_ends_at_the_global_and_the_personalized_model(run, rows):
    line = "fedsm/global->personal:site2"
    assert at(rows, line, "line", 0.0)[0] == pytest.approx(own_loss(run, "fedsm", "global"), abs=1e-6)
    assert at(rows, line, "line", 1.0)[0] == pytest.approx(own_loss(run, "fedsm", "personal:site2"), abs=1e-6)
    assert {r["t"] for r in rows if r["direction"] == "line"} >= {-0.25, 0.5, 1.25}


def test_same_seed_same_csv(run, rows, tmp_path):
    again = compute([run], SITE, directions=2, seed=0)
    other = compute([run], SITE, directions=2, seed=1)
    a, b, c = (write_csv(r, tmp_path / f"{k}.csv").read_text() for k, r in enumerate((rows, again, other)))
    assert a == b
    assert a != c


def test_cli_writes_csv_and_png_and_refuses_bad_input(run, tmp_path):
    out = tmp_path / "surface"
    result = runner.invoke(app, ["loss-surface", str(run), "--site", SITE, "--directions", "1", "--out", str(out)])
    assert result.exit_code == 0, result.output
    png = out / f"loss_surface_{SITE}.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    with (out / f"loss_surface_{SITE}.csv").open() as f:
        table = list(csv.DictReader(f))
    assert list(table[0]) == ["model", "run", "site", "direction", "t", "loss"]
    assert str(png) in result.output.replace("\n", "")

    bad = runner.invoke(app, ["loss-surface", str(run), "--site", "nowhere", "--out", str(tmp_path / "x")])
    assert bad.exit_code != 0
    assert bad.output.strip().count("\n") == 0, bad.output
    assert "no site 'nowhere'" in bad.output and "site1" in bad.output

    empty = tmp_path / "empty"
    empty.mkdir()
    none = runner.invoke(app, ["loss-surface", str(empty), "--site", SITE, "--out", str(tmp_path / "y")])
    assert none.exit_code != 0
    assert none.output.strip().count("\n") == 0, none.output
    assert "no trained models" in none.output

    fake = tmp_path / "fake3d"  # the run's FedAvg bundle, its manifest saying 3D
    shutil.copytree(run / "model" / "fedavg", fake / "model" / "fedavg")
    manifest = fake / "model" / "fedavg" / "manifest.json"
    manifest.write_text(json.dumps({**json.loads(manifest.read_text()), "spatial_dims": 3}))
    shutil.copy(run / "config.yaml", fake / "config.yaml")
    three = runner.invoke(app, ["loss-surface", str(fake), "--site", SITE, "--out", str(tmp_path / "z")])
    assert three.exit_code != 0
    assert three.output.strip().count("\n") == 0, three.output
    assert "2D runs only" in three.output
    assert not any((tmp_path / d).exists() for d in "xyz")


def test_a_case_sample_is_the_same_for_every_model_and_changes_the_loss(run, rows):
    from fedseg.loss_surface import case_sample, open_run

    train = open_run(run, SITE).train
    sample = case_sample(train, 3, seed=0)
    assert (
        len(sample) == 3 and set(sample.ids) <= set(train.ids) and sample.ids == sorted(sample.ids, key=train.ids.index)
    )
    assert case_sample(train, 3, seed=0).ids == sample.ids and case_sample(train, len(train) + 5, 0) is train
    sampled = compute([run], SITE, directions=2, seed=0, cases=3)
    assert [(r["model"], r["direction"], r["t"]) for r in sampled] == [
        (r["model"], r["direction"], r["t"]) for r in rows
    ]
    assert [r["loss"] for r in sampled] != [r["loss"] for r in rows]  # other cases, other losses
    everything = compute([run], SITE, directions=2, seed=0, cases=len(train))
    assert [r["loss"] for r in everything] == [r["loss"] for r in rows]
    with pytest.raises(ValueError, match="--cases 0"):
        compute([run], SITE, directions=2, cases=0)


def test_a_write_that_fails_leaves_no_folder_and_no_half_of_the_pair(run, tmp_path):
    """On a full disk the command said so but left an empty --out behind (an audit). A real write failure: the
    process may write no file over 300 bytes (RLIMIT_FSIZE; the kernel's EFBIG, as ENOSPC, is an OSError)."""
    import os
    import resource
    import signal
    import subprocess
    import sys

    def small_files() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # EFBIG instead of the signal that kills
        resource.setrlimit(resource.RLIMIT_FSIZE, (300, 300))

    out = tmp_path / "surface"
    script = "from fedseg.command import entry; entry()"
    args = [sys.executable, "-c", script, "loss-surface", str(run), "--site", SITE, "--directions", "1"]
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1", "MPLCONFIGDIR": str(tmp_path / "mpl")}
    done = subprocess.run(
        [*args, "--out", str(out)], capture_output=True, text=True, timeout=300, preexec_fn=small_files, env=env
    )
    assert done.returncode == 1, done.stderr
    errors = [line for line in done.stderr.splitlines() if line.startswith("error: ")]  # (matplotlib's font cache
    assert len(errors) == 1 and "File too large" in errors[0], done.stderr  # cannot be saved either: its own line)
    assert "Traceback" not in done.stderr and not out.exists()

    # a failed rerun into a folder holding a pair: the old pair stays whole (it left the figure without its CSV)
    first = subprocess.run([*args, "--out", str(out)], capture_output=True, text=True, timeout=300, env=env)
    assert first.returncode == 0, first.stderr
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    assert sorted(before) == [f"loss_surface_{SITE}.csv", f"loss_surface_{SITE}.png"]
    again = subprocess.run(
        [*args, "--out", str(out)], capture_output=True, text=True, timeout=300, preexec_fn=small_files, env=env
    )
    assert again.returncode == 1 and "File too large" in again.stderr, again.stderr
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
