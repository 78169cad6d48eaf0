"""Bad input on the command line gets one line naming the option, file or field and what is wrong: no traceback,
no output folder (options and config files), nothing half-written (a report on a full disk). Found by an audit that
tried a researcher's usual mistakes; each case here printed a traceback or trained silently before."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from typer.testing import CliRunner

from fedseg.cli import app

# a run's hidden files: provenance, where its data came from, its methods' resolved options
RUN_RECORDS = (".provenance.json", ".data-files.json", ".methods.json")

TINY_SET = ["data.scale=0.05", "data.image_size=32", "model.channels=[4,8]", "model.strides=[2]", "threads=1"]


def _run(args: list[str]):
    return CliRunner().invoke(app, args)


def _one_error_line(result) -> str:
    lines = [line for line in result.output.strip().splitlines() if line.strip()]
    assert result.exit_code == 1, result.output
    assert len(lines) == 1 and lines[0].startswith("error: "), result.output
    assert "Traceback" not in result.output
    return lines[0]


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["--set", "model.channels=[4,8"], "--set model.channels: '[4,8' is not a valid YAML value (expected ','"),
        (["--sweep", "train.lr=[0.1,0.2"], "--sweep train.lr: '[0.1,0.2' is not a valid YAML value"),
        (["--algorithms", "fedavg,,local"], "--algorithms 'fedavg,,local': an empty name"),
        (["--algorithms", "fedavg,"], "--algorithms 'fedavg,': an empty name"),
        (["--algorithms", ""], "--algorithms is empty: name at least one algorithm"),
        (["--algorithms", "fedavg,local,fedavg"], "error: --algorithms: fedavg named more than once"),
        (
            ["--algorithms", "fedavg", "--set", "methods.fedprox.mu=abc"],
            "methods.fedprox.mu must be a number, got 'abc'",
        ),
        (["--set", "train.batch_size=true"], "train.batch_size: expects a number, not a yes/no value (true)"),
        # a union field: one line saying every kind it may be, or the item that is wrong; no branch tag as a key
        (
            ["--set", "data.volume.patch_size=abc"],
            "--set data.volume.patch_size must be an integer or a list, got 'abc'",
        ),
        (["--set", "data.volume.spacing=[1,x]"], "--set data.volume.spacing[1] must be a number, got 'x'"),
        (["--set", "model.channels=[4,yes]"], "model.channels: expects a number, not a yes/no value ([4, true])"),
        (["--set", "methods.fedprox.mu=false"], "methods.fedprox.mu: expects a number, not a yes/no value (false)"),
        (["--set", "fl.round=3"], "error: --set fl.round: unknown key (did you mean 'rounds'?)"),
        (["--set", "trian.lr=0.1"], "error: --set trian: unknown key (did you mean 'train'?)"),
        (["--algorithms", "fedavgg"], "unknown algorithm 'fedavgg'; did you mean 'fedavg'?"),
    ],
)
def test_a_bad_option_value_gets_one_line_and_no_output_folder(tmp_path, args, expected):
    out = tmp_path / "run"
    line = _one_error_line(_run(["run", "--preset", "demo", "--rounds", "1", *args, "--out", str(out)]))
    assert expected in line, line
    assert not out.exists()


def test_an_empty_or_non_utf8_config_file_is_refused_not_trained_with_the_defaults(tmp_path):
    empty, binary = tmp_path / "empty.yaml", tmp_path / "latin1.yaml"
    empty.write_text("\n  # only a comment\n")
    binary.write_bytes("name: caf\xe9\n".encode("latin-1"))
    out = tmp_path / "run"
    line = _one_error_line(_run(["run", "--config", str(empty), "--out", str(out)]))
    assert line == f"error: {empty}: the config file is empty (start from `fedseg presets show demo > empty.yaml`)"
    line = _one_error_line(_run(["run", "--config", str(binary), "--out", str(out)]))
    assert line == f"error: {binary}: not UTF-8 text (at byte offset 9); save the config file as UTF-8"
    assert not out.exists()


LAYOUT = "a federation is a folder with federation.yaml and a folder per site"


def test_a_data_path_that_is_not_a_federation_folder_gets_one_line(tmp_path):
    out = tmp_path / "run"
    missing = tmp_path / "nowhere"
    line = _one_error_line(_run(["run", "--preset", "demo", "--data", str(missing), "--out", str(out)]))
    assert (
        line == f"error: {missing}: does not exist; a federation is a folder with federation.yaml and a folder per site"
    )
    header = tmp_path / "federation.yaml"  # the file given instead of its folder
    header.write_text("kind: 2d\n")
    line = _one_error_line(_run(["run", "--preset", "demo", "--data", str(header), "--out", str(out)]))
    assert line.endswith(f"is a file; {LAYOUT} (give the folder that holds it: {tmp_path})"), line
    assert not out.exists()


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory) -> tuple[Path, list[str]]:
    """A finished 1-round FedAvg run of ``demo`` (tiny) and the arguments that made it."""
    out = tmp_path_factory.mktemp("bad_input") / "run"
    args = ["run", "--preset", "demo", "--algorithms", "fedavg", "--rounds", "1", "--out", str(out)]
    args += [a for s in TINY_SET for a in ("--set", s)]
    result = _run(args)
    assert result.exit_code == 0, result.output
    return out, args


def test_a_damaged_checkpoint_on_resume_is_named_with_what_to_do(finished_run, tmp_path):
    run, args = finished_run
    copy = tmp_path / "run"
    shutil.copytree(run, copy)
    checkpoint = copy / "checkpoints" / "fedavg.pt"
    checkpoint.write_bytes(checkpoint.read_bytes()[:100])  # truncated, as by a disk fault or a bad copy
    line = _one_error_line(
        _run([*args[: args.index("--out")], "--out", str(copy), *args[args.index("--out") + 2 :], "--resume"])
    )
    assert line.startswith(f"error: {checkpoint}: the checkpoint cannot be read ("), line
    assert line.endswith(
        "if it is damaged, delete it and run again with --resume to train that algorithm again from its first round"
    )


def test_the_report_of_a_damaged_summary_names_the_file(finished_run, tmp_path):
    run, _ = finished_run
    copy = tmp_path / "run"
    shutil.copytree(run, copy)
    (copy / "summary.json").write_text('{"algorithms": ')
    line = _one_error_line(_run(["report", str(copy)]))
    assert line.startswith(f"error: the report was not drawn: {copy / 'summary.json'}: not valid JSON ("), line


def test_a_report_that_does_not_fit_on_the_disk_leaves_no_half_page(finished_run, tmp_path):
    run, _ = finished_run
    disk = tmp_path / "disk"
    disk.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(disk)], capture_output=True).returncode:
        pytest.skip("cannot mount a tmpfs here (needs root)")
    try:
        copy = disk / "run"
        shutil.copytree(run, copy, ignore=shutil.ignore_patterns("report.html", "figures"))
        with open(disk / "filler", "wb") as f:  # leave about 20 kB: less than one figure
            f.write(b"\0" * (shutil.disk_usage(disk).free - 20_000))
        line = _one_error_line(_run(["report", str(copy)]))
        assert "No space left on device" in line and f"`fedseg report {copy}` draws it again" in line, line
        assert not (copy / "report.html").exists()
        leftovers = [p.name for p in copy.rglob(".*") if p.is_file() and p.name not in RUN_RECORDS]
        assert not leftovers, leftovers  # no temp file of a figure or of the page
    finally:
        subprocess.run(["umount", "-l", str(disk)], check=False)


def test_the_report_of_a_stopped_run_says_which_methods_did_not_finish(finished_run, tmp_path):
    import yaml

    run, _ = finished_run
    copy = tmp_path / "run"
    shutil.copytree(run, copy)
    config = yaml.safe_load((copy / "config.yaml").read_text())
    config["algorithms"] = ["fedavg", "local", "fedsm"]  # as if stopped after fedavg: summary.json holds fedavg only
    (copy / "config.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    result = _run(["report", str(copy)])
    assert result.exit_code == 0, result.output
    assert "note: incomplete run: local, fedsm did not finish" in result.output, result.output
    assert "Incomplete run: local, fedsm did not finish" in (copy / "report.html").read_text()
    complete = _run(["report", str(run)])
    assert complete.exit_code == 0 and "incomplete" not in complete.output.lower(), complete.output


def test_resume_refuses_a_federation_folder_changed_since_the_run_started(tmp_path):
    fed, out = tmp_path / "fed", tmp_path / "run"
    assert (
        _run(["data", "synth", "--preset", "demo", "--scale", "0.1", "--image-size", "32", "--out", str(fed)]).exit_code
        == 0
    )
    args = ["run", "--preset", "demo", "--algorithms", "fedavg", "--rounds", "1", "--data", str(fed), "--out", str(out)]
    args += [a for s in TINY_SET for a in ("--set", s)]
    assert _run(args).exit_code == 0
    assert _run([*args, "--resume"]).exit_code == 0  # unchanged: resumes (nothing left to train)
    label = sorted((fed / "site1" / "labels").iterdir())[0]
    label.write_bytes(label.read_bytes())  # rewritten (a corrected label): another modification time
    case = sorted((fed / "site2" / "labels").iterdir())[-1].name
    for folder in ("images", "labels"):  # a case taken out
        (fed / "site2" / folder / case).unlink()
    line = _one_error_line(_run([*args, "--resume"]))
    assert f"error: {fed}: the data changed since this run started (changed: site1/labels/{label.name}; " in line, line
    assert (
        f"removed: site2/images/{case} and site2/labels/{case})" in line
        and "resuming would mix results of two datasets" in line
    ), line
    (out / ".data-files.json").unlink()  # accepting the data as it is now, as the message says
    assert _run([*args, "--resume"]).exit_code == 0


@pytest.mark.parametrize(
    ("key", "value", "expected"),
    [
        ("in_channels", "one", "in_channels is 'one'; expected a positive integer"),
        ("image_size", -5, "image_size is -5; expected a positive integer"),  # was a traceback from the resize
        ("image_size", 0, "image_size is 0; expected a positive integer"),
        ("threshold", 1.5, "threshold is 1.5; expected a number between 0 and 1"),
        ("normalize", "zscor", "normalize is 'zscor'; expected one of minmax, zscore, zscore_foreground,"),
        ("volume", {"patch_size": -1}, "invalid network, regions or volume (1 validation error for VolumeConfig"),
        ("models", [], "models is empty; expected the names of the models it holds"),  # was 'one model per site ()'
    ],
)
def test_predict_with_a_hand_edited_manifest_names_the_key(finished_run, tmp_path, key, value, expected):
    import json

    import numpy as np
    from PIL import Image

    run, _ = finished_run
    copy = tmp_path / "run"
    shutil.copytree(run, copy)
    manifest = copy / "model" / "fedavg" / "manifest.json"
    manifest.write_text(json.dumps({**json.loads(manifest.read_text()), key: value}))
    image = tmp_path / "in" / "eye.png"
    image.parent.mkdir()
    Image.fromarray(np.zeros((32, 32, 3), np.uint8)).save(image)
    line = _one_error_line(
        _run(["predict", "--model", str(copy / "model"), "--input", str(image.parent), "--out", str(tmp_path / "out")])
    )
    assert line.startswith(f"error: {manifest}: {expected}"), line


def test_predict_says_when_a_volume_is_given_to_a_2d_model(finished_run, tmp_path):
    import nibabel as nib
    import numpy as np

    run, _ = finished_run
    volume = tmp_path / "in" / "ct.nii.gz"
    volume.parent.mkdir()
    nib.save(nib.Nifti1Image(np.zeros((32, 32, 12), np.float32), np.eye(4)), volume)
    line = _one_error_line(
        _run(["predict", "--model", str(run / "model"), "--input", str(volume), "--out", str(tmp_path / "out")])
    )
    assert line.startswith(f"error: {volume}: image has 12 channels but the model expects 3"), line
    assert line.endswith("this model segments 2D images: a 3D volume's third axis reads as channels"), line


def test_predict_says_when_a_dicom_series_is_given_to_a_2d_model(finished_run, tmp_path):
    """A series folder is a volume too: its slices read as channels (the hint was missing for DICOM, which a
    newcomer met first)."""
    pytest.importorskip("pydicom")
    pytest.importorskip("highdicom")
    from test_readers import write_series

    run, _ = finished_run
    series = tmp_path / "in" / "s1"
    write_series(series, np.zeros((32, 32, 12), np.uint16), spacing=(1.0, 1.0, 2.0))
    line = _one_error_line(
        _run(["predict", "--model", str(run / "model"), "--input", str(series.parent), "--out", str(tmp_path / "o")])
    )
    assert line.startswith(f"error: {series}: image has 12 channels but the model expects 3"), line
    assert line.endswith("this model segments 2D images: a DICOM series' slices read as channels"), line


def test_the_data_record_leaves_out_fedsegs_own_folders(tmp_path):
    from fedseg.run.data_record import RECORD, check_data_files, record_data_files

    out = tmp_path / "run"
    inside = out / "flower" / "federation"  # fedseg flower local writes a built-in federation here at every start
    inside.mkdir(parents=True)
    (inside / "federation.yaml").write_text("kind: 2d\n")
    record_data_files(out, inside)
    assert json.loads((out / RECORD).read_text()) == {"data": "config"}  # no files: fedseg's own output
    data = tmp_path / "data"  # a run folder inside the data folder: its files are not the data
    (data / "site1").mkdir(parents=True)
    (data / "site1" / "a.png").write_bytes(b"x")
    run = data / "runs" / "r1"
    run.mkdir(parents=True)
    record_data_files(run, data)
    (run / "summary.json").write_text("{}")  # the run writes its outputs
    check_data_files(run, data)  # not a change of the data
    (data / "site1" / "a.png").write_bytes(b"xy")
    with pytest.raises(ValueError, match=r"changed: site1/a\.png\)"):
        check_data_files(run, data)


def test_a_forced_rewrite_that_fails_puts_the_old_federation_back(discs, tmp_path):
    from fedseg.data.folder_write import write_folder

    root = write_folder(discs, tmp_path / "fed")
    before = sorted(p.relative_to(root).as_posix() for p in root.rglob("*"))
    blocker = root / "notes"  # a folder of the user's in the way of a new site's name, not a site: not replaced
    blocker.mkdir()
    (blocker / "keep.txt").write_text("mine")
    renamed = type(discs)(discs.name, discs.kind, discs.channels, discs.regions, discs.sites[:1])
    renamed.sites[0].name = "notes"
    with pytest.raises(OSError):
        write_folder(renamed, root, overwrite=True)
    after = sorted(p.relative_to(root).as_posix() for p in root.rglob("*") if not p.is_relative_to(blocker))
    assert after == before  # the old federation as it was, no temporary folder left
    assert (blocker / "keep.txt").read_text() == "mine"


def test_a_config_problem_names_the_option_or_file_it_came_from(tmp_path):
    """A --set key, a typed option (--rounds) and a problem of the file itself are each named by their source."""
    out = tmp_path / "run"
    cases = [
        (
            ["--preset", "demo", "--rounds", "0"],
            "error: --rounds (fl.rounds) must be at least 1, got 0",
        ),
        (["--preset", "demo", "--set", "data.normalize=off"], "error: --set data.normalize must be 'minmax'"),
    ]
    config = tmp_path / "mine.yaml"
    config.write_text("train:\n  lr: 0.001\n  lr_min: 0.01\n  lr_schedule: cosine\n")
    cases.append(
        (["--config", str(config), "--set", "train.batch_size=4"], f"error: {config}: train.lr_min=0.01 must be")
    )
    for args, expected in cases:
        line = _one_error_line(_run(["run", *args, "--out", str(out)]))
        assert line.startswith(expected), line
        assert not out.exists()


def test_a_bench_file_that_is_binary_or_a_folder_is_named(tmp_path):
    """A binary bench file said only `'utf-8' codec can't decode byte 0x9e...`; a folder said `bench file not found`."""
    binary = tmp_path / "bin.yaml"
    binary.write_bytes(b"\x9e\x00\xff" * 10)
    line = _one_error_line(_run(["bench", str(binary), "--out", str(tmp_path / "b")]))
    assert line.startswith(f"error: {binary}: not UTF-8 text (at byte offset 0)"), line
    line = _one_error_line(_run(["bench", str(tmp_path), "--out", str(tmp_path / "b")]))
    assert line == f"error: {tmp_path}: is a folder, not a bench file (YAML)", line
    assert not (tmp_path / "b").exists()


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="needs /dev/full (Linux)")
def test_output_to_a_full_disk_is_one_line_naming_what_could_not_be_written(tmp_path):
    """`fedseg presets show demo > my.yaml` on a full disk was a traceback; Pillow's full-disk error named no file
    (predict's masks, data synth's and export's images)."""
    import numpy as np

    from fedseg.data.folder_write import write_png

    shown = subprocess.run(
        [sys.executable, "-c", "from fedseg.command import entry; entry()", "presets", "show", "demo"],
        stdout=open("/dev/full", "w"),  # noqa: SIM115  (the child's stdout)
        stderr=subprocess.PIPE,
        text=True,
        timeout=120,
    )
    assert shown.returncode == 1 and "Traceback" not in shown.stderr, shown.stderr
    assert shown.stderr.strip() == "error: could not write the command's output: [Errno 28] No space left on device"
    mask = tmp_path / "mask.png"
    mask.symlink_to("/dev/full")  # a PNG written to a full disk
    with pytest.raises(OSError) as caught:
        write_png(mask, np.zeros((64, 64, 3), np.uint8))
    assert caught.value.errno == 28 and caught.value.filename == str(mask)


def _listing(folder: Path) -> dict[str, int]:
    return {str(p.relative_to(folder)): p.stat().st_size for p in sorted(folder.rglob("*"))}


def test_an_out_that_is_a_federation_or_another_command_s_folder_is_refused_and_left_as_it_was(finished_run, tmp_path):
    """--out on the data (or inside it) would put a run's folders among the sites' (``data check`` then refuses the
    federation); a bench's tables over a run's results.csv and report.html, or a run's report over a bench's,
    destroy the other's outputs. Each is one line naming the file that says what the folder holds; nothing changes.
    (A study's folder was refused already.)"""
    run, _ = finished_run
    fed = tmp_path / "fed"
    assert (
        _run(
            ["data", "synth", "--preset", "demo", "--scale", "0.05", "--image-size", "32", "--out", str(fed)]
        ).exit_code
        == 0
    )
    before = _listing(fed)
    base = ["run", "--preset", "demo", "--algorithms", "fedavg", "--rounds", "1", "--data", str(fed)]
    line = _one_error_line(_run([*base, "--out", str(fed)]))
    assert line.startswith(f"error: {fed}: is a federation folder (federation.yaml): the run's files would join"), line
    line = _one_error_line(_run([*base, "--out", str(fed / "runs" / "x")]))
    assert line.startswith(
        f"error: {fed / 'runs' / 'x'}: lies inside the federation folder {fed} (--data or data.root)"
    ), line
    assert _listing(fed) == before
    before_fed = before

    bench = tmp_path / "bench.yaml"
    spec = {"name": "b", "base": {"preset": "demo"}, "set": TINY_SET, "federations": ["synthetic-retina"]}
    spec |= {"methods": ["fedavg"], "seeds": [0], "split": {"mode": "ratio"}, "budget": {"rounds": 1}}
    bench.write_text(json.dumps(spec))
    copy = shutil.copytree(run, tmp_path / "run")
    before = _listing(copy)
    line = _one_error_line(_run(["bench", str(bench), "--out", str(copy)]))
    assert line == f"error: {copy}: holds a run (config.yaml), not a bench; choose another --out", line
    line = _one_error_line(_run(["bench", str(bench), "--out", str(fed)]))
    assert line.startswith(f"error: {fed}: is a federation folder (federation.yaml): the bench's files"), line
    assert _listing(copy) == before
    on_fed = tmp_path / "on-fed.yaml"  # a bench over the folder federation, its --out inside it
    on_fed.write_text(json.dumps({**spec, "federations": [{"name": "f", "set": [f"data.root={fed}"]}]}))
    line = _one_error_line(_run(["bench", str(on_fed), "--out", str(fed / "bench")]))
    assert line.startswith(f"error: {fed / 'bench'}: lies inside the federation folder {fed}"), line
    flower = ["flower", "local", "--preset", "demo", "--algorithms", "fedavg", "--data", str(fed)]
    line = _one_error_line(_run([*flower, "--out", str(fed / "f")]))
    assert line.startswith(f"error: {fed / 'f'}: lies inside the federation folder {fed}"), line
    assert _listing(fed) == before_fed

    benched = tmp_path / "benched"
    benched.mkdir()
    (benched / "bench.json").write_text(json.dumps(spec))
    line = _one_error_line(_run(["run", "--preset", "demo", "--rounds", "1", "--out", str(benched)]))
    assert line == f"error: {benched}: holds a bench (bench.json), not a run; choose another --out", line
    assert sorted(p.name for p in benched.iterdir()) == ["bench.json"]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("model: {channels: [-4, 8], strides: [2]}\n", "model.channels: at least 2 levels of >= 1 feature maps"),
        ("model: {channels: [4, 8, 16], strides: [2]}\n", "model.strides: needs 2 entries (len(channels) = 3), got 1"),
        ("train: {lr: .inf}\n", "train.lr must be a finite number, got .inf"),
        ("seed: -1\n", "seed must be at least 0, got -1"),
        ("seed: 99999999999999999999999\n", "seed must be at most 4294967295, got 99999999999999999999999"),
        ("name: x\n\x00\x00\n", "not valid YAML: unacceptable character #x0000"),
        ("data: [1, 2]\n", "data: expected a section (key: value lines), got [1, 2]"),
    ],
)
def test_a_config_value_that_would_fail_in_training_is_refused_up_front_naming_the_file(tmp_path, text, expected):
    """Each of these passed the config's checks and failed later (a traceback, an unnamed Overflow or Inf weights
    after round 1), or blamed a --set nobody gave (``data: [1, 2]`` with --data): one line naming the file."""
    config, out = tmp_path / "c.yaml", tmp_path / "run"
    config.write_text(text)
    fed = tmp_path / "fed"  # --data sets data.source and data.root: the config's data section must take them
    fed.mkdir()
    line = _one_error_line(_run(["run", "--config", str(config), "--data", str(fed), "--out", str(out)]))
    assert line.startswith(f"error: {config}: ") and expected in line, line
    assert not out.exists()


def test_links_that_lead_nowhere_and_devices_are_named_as_such(tmp_path):
    """A symlink loop given as --data, --out, --config or a loss-surface run, and /dev/null as --config: one line
    saying what the path is (a traceback for --data and loss-surface before; "File exists", "not found")."""
    loop = tmp_path / "loopA"
    loop.symlink_to(tmp_path / "loopB")
    (tmp_path / "loopB").symlink_to(loop)
    out = tmp_path / "run"
    line = _one_error_line(_run(["run", "--preset", "demo", "--data", str(loop), "--out", str(out)]))
    assert line.startswith(f"error: --data {loop}: cannot be resolved"), line
    line = _one_error_line(_run(["run", "--preset", "demo", "--out", str(loop)]))
    assert line == f"error: --out {loop}: {loop} is a link that leads nowhere (a loop or a missing target)", line
    line = _one_error_line(_run(["run", "--config", str(loop), "--out", str(out)]))
    assert line == f"error: {loop}: is a link that leads nowhere (a loop or a missing target), not a config file"
    line = _one_error_line(_run(["run", "--config", "/dev/null", "--out", str(out)]))
    assert line == "error: /dev/null: is not a regular file (a device or a pipe), not a config file (YAML)", line
    line = _one_error_line(_run(["loss-surface", str(loop), "--site", "site1", "--out", str(out)]))
    assert line == f"error: {loop}: does not exist (expected a finished run's folder)", line
    assert not out.exists()


def test_a_resume_without_a_readable_config_yaml_is_refused(finished_run, tmp_path):
    """--resume compares the new configuration with the run's config.yaml: without it (deleted) a changed lr was
    accepted and recorded over the old one; a Latin-1 or unparseable one gave a codec error or 5 lines of YAML."""
    run, args = finished_run
    resume = [*args[:-2], "--set", "train.lr=0.01", "--resume"]  # args end with --out RUN
    for damage, expected in [
        (None, "config.yaml: missing, so the configuration of the run in"),
        (b"name: caf\xe9\n", "config.yaml: not UTF-8 text (at byte offset 9); cannot check the configuration"),
        (b"algorithms: [\n", "config.yaml: not valid YAML: "),
    ]:
        copy = tmp_path / f"run{len(list(tmp_path.iterdir()))}"
        shutil.copytree(run, copy)
        if damage is None:
            (copy / "config.yaml").unlink()
        else:
            (copy / "config.yaml").write_bytes(damage)
        before = _listing(copy)
        line = _one_error_line(_run([*resume, "--out", str(copy)]))
        assert line.startswith(f"error: {copy / 'config.yaml'}") and expected in line, line
        assert _listing(copy) == before
    copy = shutil.copytree(run, tmp_path / "file-checkpoints")  # said "checkpoints: File exists"
    shutil.rmtree(copy / "checkpoints")
    (copy / "checkpoints").write_text("")
    line = _one_error_line(_run([*args[:-2], "--resume", "--out", str(copy)]))
    assert line == f"error: {copy / 'checkpoints'}: is a file where the run keeps its checkpoints (a folder)", line


def test_a_results_csv_cut_short_emptied_or_missing_is_not_drawn_silently(finished_run, tmp_path):
    """``fedseg report`` drew a page from whatever rows were left (the tables and the verdict's tests resting on
    them) when results.csv was cut at a row boundary, emptied to its header, missing or a folder: now one line
    naming the file, the algorithm and site whose rows disagree with summary.json, and the page is left as it was."""
    run, _ = finished_run
    text = (run / "results.csv").read_text()
    lines = text.splitlines(keepends=True)
    for name, damage in [
        ("cut", lambda p: p.write_text("".join(lines[: len(lines) // 2]))),
        ("header", lambda p: p.write_text(lines[0])),
        (
            "hd95",
            lambda p: p.write_text("".join(r for r in lines if ",hd95," not in r or not r.endswith(("5\n", "7\n")))),
        ),
        ("missing", lambda p: p.unlink()),
        ("folder", lambda p: (p.unlink(), p.mkdir())),
    ]:
        copy = shutil.copytree(run, tmp_path / name)
        page = (copy / "report.html").read_bytes()
        damage(copy / "results.csv")
        line = _one_error_line(_run(["report", str(copy)]))
        assert f"{copy / 'results.csv'}: " in line and "--resume writes it again" in line, (name, line)
        assert (
            ("is missing" in line)
            if name == "missing"
            else ("is not a file" in line)
            if name == "folder"
            else ("where summary.json reports" in line)
        ), (name, line)
        assert (copy / "report.html").read_bytes() == page


def test_predict_refuses_nan_weights_and_takes_a_bundle_file_for_its_folder(finished_run, tmp_path):
    """A bundle whose weights hold NaN wrote all-zero masks and said "written"; --model given the manifest.json
    said "no manifest.json here"; a folder where the weights file goes said "missing"."""
    from safetensors.torch import load_file, save_file

    run, _ = finished_run
    images = tmp_path / "images"
    images.mkdir()
    Image.fromarray(np.full((32, 32, 3), 90, np.uint8)).save(images / "a.png")
    bundle = shutil.copytree(run / "model" / "fedavg", tmp_path / "fedavg")
    said = _run(
        ["predict", "--model", str(bundle / "manifest.json"), "--input", str(images), "--out", str(tmp_path / "o1")]
    )
    assert said.exit_code == 0, said.output
    tensors = load_file(bundle / "weights.safetensors")
    first = next(iter(tensors))
    tensors[first] = torch.full_like(tensors[first], float("nan"))
    save_file(tensors, bundle / "weights.safetensors")
    line = _one_error_line(
        _run(["predict", "--model", str(bundle), "--input", str(images), "--out", str(tmp_path / "o2")])
    )
    assert (
        line
        == f"error: {bundle / 'weights.safetensors'}: tensor {first!r} holds NaN or Inf; it cannot segment anything"
    )
    (bundle / "weights.safetensors").unlink()
    (bundle / "weights.safetensors").mkdir()
    line = _one_error_line(
        _run(["predict", "--model", str(bundle), "--input", str(images), "--out", str(tmp_path / "o3")])
    )
    assert line == f"error: {bundle / 'weights.safetensors'}: is not a file", line
    assert not (tmp_path / "o2").exists() and not (tmp_path / "o3").exists()


def test_flower_options_a_deployment_gets_wrong_are_one_line_before_anything_starts(tmp_path):
    """A SuperLink address without a port (or a port out of range) started Flower, which logged 17 lines around
    "cannot be parsed"; a site named twice to `flower certs` printed its key's line twice."""
    for address in ("nohost", "127.0.0.1:99999", ":9092"):
        args = ["flower", "supernode", "--site", "site1", "--data", str(tmp_path / "fed"), "--superlink", address]
        line = _one_error_line(_run([*args, "--insecure"]))
        assert line.startswith(f"error: --superlink {address}: expected HOST:PORT with a port 1-65535"), line
    args = ["flower", "supernode", "--site", "site1", "--data", str(tmp_path / "fed"), "--superlink", "127.0.0.1:9092"]
    line = _one_error_line(_run([*args, "--insecure", "--config-sha256", "abc"]))
    assert line == "error: --config-sha256 abc: expected 64 hex digits (`fedseg flower config-digest`)", line
    line = _one_error_line(_run(["flower", "certs", "--out", str(tmp_path / "certs"), "--node", "a", "--node", "a"]))
    assert line == "error: --node 'a': given 2 times; one key pair per site"
    assert not (tmp_path / "certs").exists()
