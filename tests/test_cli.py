"""The command line on real folder federations written to disk by the test."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from fedseg.cli import app
from fedseg.data.folder import write_folder

runner = CliRunner()
TINY_SETS = [
    "--set",
    "model.channels=[4,8,16]",
    "--set",
    "data.image_size=32",
    "--set",
    "train.batch_size=4",
    "--set",
    "threads=1",
    "--set",
    "eval.hd95=false",
]


def test_run_on_a_folder_federation_writes_outputs_and_report(tmp_path, disc_federation):
    root = write_folder(disc_federation(n_sites=2, cases_per_site=8), tmp_path / "fed")
    out = tmp_path / "run"
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
            "--out",
            str(out),
            *TINY_SETS,
        ],
    )
    assert result.exit_code == 0, result.output
    summary = json.loads((out / "summary.json").read_text())
    assert summary["dataset"] == "discs" and list(summary["algorithms"]) == ["fedavg"]
    assert (out / "report.html").is_file()
    assert "fedavg" in result.output


def test_run_on_malformed_data_fails_naming_the_file_and_writes_nothing(tmp_path, disc_federation):
    root = write_folder(disc_federation(n_sites=2, cases_per_site=8), tmp_path / "fed")
    victim = sorted((root / "site2" / "labels").iterdir())[0]
    victim.unlink()
    out = tmp_path / "run"
    result = runner.invoke(app, ["run", "--preset", "demo", "--data", str(root), "--out", str(out), *TINY_SETS])
    assert result.exit_code == 1
    assert victim.stem in result.output and "label" in result.output
    assert not out.exists()


def test_bad_config_key_is_named(tmp_path):
    result = runner.invoke(app, ["run", "--preset", "demo", "--set", "train.lr=-1", "--out", str(tmp_path / "x")])
    assert result.exit_code == 1 and "train.lr" in result.output
    result = runner.invoke(app, ["run", "--preset", "nope", "--out", str(tmp_path / "x")])
    assert result.exit_code == 1 and "unknown preset" in result.output
    result = runner.invoke(app, ["run", "--preset", "demo", "--algorithms", "fedfoo", "--out", str(tmp_path / "x")])
    assert result.exit_code == 1 and "fedfoo" in result.output
    assert not (tmp_path / "x").exists()


def test_presets_lists_every_preset():
    result = runner.invoke(app, ["presets"])
    assert result.exit_code == 0
    for name in ("demo", "synthetic-retina", "synthetic-prostate"):
        assert name in result.output
