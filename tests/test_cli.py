"""The command line on real folder federations written to disk by the test."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from fedseg.cli import app
from fedseg.data.folder_write import write_folder

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


def test_error_lines_keep_their_quotes(tmp_path):
    result = runner.invoke(app, ["run", "--preset", "demo", "--set", "train.optimizer=adamw", "--out", str(tmp_path)])
    assert result.exit_code == 1
    assert "must be 'adam' or 'sgd', got 'adamw'" in " ".join(result.output.split())  # the closing quote too


def test_misspelt_method_options_and_fault_sites_are_refused_before_anything_is_written(tmp_path, disc_federation):
    root = write_folder(disc_federation(n_sites=2, cases_per_site=8), tmp_path / "fed")
    out = tmp_path / "run"
    base = ["run", "--preset", "demo", "--data", str(root), "--algorithms", "fedavg", "--out", str(out), *TINY_SETS]
    result = runner.invoke(app, [*base, "--set", "methods.fedsmm.lam=0.5"])
    assert result.exit_code == 1
    assert "methods.fedsmm" in result.output and "did you mean 'fedsm'?" in result.output
    result = runner.invoke(app, [*base, "--set", "faults=[{site: site9, kind: crash}]"])
    assert result.exit_code == 1
    assert "faults[0].site" in result.output and "'site9'" in result.output and "site1, site2" in result.output
    assert not out.exists()
    result = runner.invoke(app, [*base, "--rounds", "1", "--set", "methods.fedprox.mu=0.1"])  # another method's
    assert result.exit_code == 0, result.output  # options are fine: a preset holds options for methods one may add


def test_presets_lists_every_preset():
    result = runner.invoke(app, ["presets"])
    assert result.exit_code == 0
    for name in ("demo", "synthetic-retina", "synthetic-prostate"):
        assert name in result.output


def _flat(output: str) -> str:
    """CLI output as one line: rich's panel borders and line wrapping removed."""
    return " ".join(output.replace("│", " ").split())


def test_algorithms_option_help_lists_the_registered_names():
    from fedseg.algorithms import ALGORITHMS

    names = ", ".join(ALGORITHMS)
    result = runner.invoke(app, ["run", "--help"], env={"COLUMNS": "400", "TERMINAL_WIDTH": "400"})
    assert result.exit_code == 0
    assert names in _flat(result.output) and "--device" in result.output and "--threads" in result.output
    result = runner.invoke(app, ["flower", "local", "--help"], env={"COLUMNS": "400", "TERMINAL_WIDTH": "400"})
    assert result.exit_code == 0
    flower = ", ".join(n for n, s in ALGORITHMS.items() if not s.on_flower)
    assert flower in _flat(result.output) and "--device" in result.output


def test_a_key_given_by_an_option_and_by_set_is_refused_in_one_line(tmp_path):
    """``--rounds 1 --set fl.rounds=2`` trained 1 round without a word, and ``--rounds 1 --set fl.rounds=two`` ran
    (the named option won, the --set value went unchecked): one of the two was silently ignored."""
    from fedseg.config_load import ConfigError, config_from_cli

    with pytest.raises(ConfigError, match=r"^--rounds and --set fl.rounds=two both set fl.rounds: give it once$"):
        config_from_cli("demo", None, None, None, 1, None, ["fl.rounds=two"])
    with pytest.raises(ConfigError, match=r"^--device and --set device=cpu both set device"):
        config_from_cli("demo", None, None, None, None, None, ["device=cpu", "threads=5"], "cuda:1")
    with pytest.raises(ConfigError, match=r"^--rounds and --set fl=\{rounds: two\} both set fl.rounds"):
        config_from_cli("demo", None, None, None, 1, None, ["fl={rounds: two}"])  # the section holding it
    assert config_from_cli("demo", None, None, None, 5, None, ["fl={stop: {patience: 3}}"]).fl.rounds == 5  # not it
    cfg = config_from_cli("demo", None, None, None, None, None, ["threads=5"], "cpu")
    assert (cfg.device, cfg.threads) == ("cpu", 5)
    out = tmp_path / "out"
    result = runner.invoke(app, ["run", "--preset", "demo", "--rounds", "1", "--set", "fl.rounds=2", "--out", str(out)])
    assert result.exit_code != 0 and result.output.strip().splitlines() == [
        "error: --rounds and --set fl.rounds=2 both set fl.rounds: give it once"
    ]
    assert not out.exists()


def test_presets_show_round_trips_through_run_config(tmp_path):
    from fedseg.config_load import load_config, preset_description

    result = runner.invoke(app, ["presets", "show", "demo"])
    assert result.exit_code == 0
    assert result.output.splitlines()[1] == f"# {preset_description('demo')}"
    (tmp_path / "my.yaml").write_text(result.output)
    assert load_config(file=tmp_path / "my.yaml") == load_config(preset="demo")
    result = runner.invoke(app, ["presets", "show", "nope"])
    assert result.exit_code == 1
    assert "unknown preset 'nope'" in result.output and "synthetic-retina" in result.output


def test_a_run_that_fails_says_why_in_its_run_log_too(tmp_path, disc_federation):
    root = write_folder(disc_federation(n_sites=2, cases_per_site=8), tmp_path / "fed")
    out = tmp_path / "run"
    crash = "faults=[{site: site2, kind: crash, round: 2}]"
    args = ["run", "--preset", "demo", "--data", str(root), "--algorithms", "fedavg", "--rounds", "2", "--out"]
    args.append(str(out))
    result = runner.invoke(app, [*args, *TINY_SETS, "--set", crash])
    assert result.exit_code == 1 and "injected crash" in result.output
    lines = (out / "run.log").read_text().splitlines()
    assert " fedavg round 1/2 " in lines[0]
    assert lines[-1].endswith(
        " stopped: site 'site2', round 2, fedavg train: InjectedCrash: injected crash (faults: site2, round 2)"
    )
    # a command refused on that folder (it holds a run) does not write into the run's log
    assert runner.invoke(app, [*args, *TINY_SETS]).exit_code == 1
    assert (out / "run.log").read_text().splitlines() == lines
