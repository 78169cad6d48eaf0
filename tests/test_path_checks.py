"""A wrong path given to a command is said at once (``fedseg.path_checks``): before torch is imported (seconds; tens
of seconds on a busy machine), in the line the command's own checks say it in. A fresh-eyes study waited 7 s (20-50 s
under load) for `fedseg run --data /no/such/folder`'s one line. Each command runs in a real interpreter, which says
at its exit whether torch was imported."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

MISSING_MODEL = (
    "no manifest.json here or in its sub-folders (expected RUN/model or RUN/model/<algorithm> of a finished run)"
)
NOT_A_FEDERATION = "does not exist; a federation is a folder with federation.yaml and a folder per site"


def fedseg(*args: str) -> tuple[str, bool]:
    """The one line on stderr of the ``fedseg`` command ``args`` (it must exit 1), and whether it imported torch."""
    code = textwrap.dedent(
        """
        import atexit, os, sys
        atexit.register(lambda: os.write(2, b"torch imported\\n" if "torch" in sys.modules else b"no torch\\n"))
        sys.argv = ["fedseg", *sys.argv[1:]]
        from fedseg.command import entry
        entry()
        """
    )
    done = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=120)
    *lines, torch_said = done.stderr.strip().splitlines()
    assert done.returncode == 1 and len(lines) == 1 and "Traceback" not in done.stderr, done.stderr
    return lines[0], torch_said == "torch imported"


def test_run_with_a_missing_data_folder_says_so_before_importing_torch(tmp_path):
    missing, out = tmp_path / "no" / "such", tmp_path / "out"
    line, torch = fedseg("run", "--preset", "demo", "--data", str(missing), "--out", str(out))
    assert (line, torch) == (f"error: {missing}: {NOT_A_FEDERATION}", False)
    assert not out.exists()


def test_run_with_a_raw_dataset_for_data_says_to_import_it_before_importing_torch(tmp_path):
    raw = tmp_path / "Dataset001_X"
    (raw / "imagesTr").mkdir(parents=True)
    (raw / "dataset.json").write_text('{"channel_names": {"0": "MR"}}')
    line, torch = fedseg("run", "--preset", "demo", "--data", str(raw), "--out", str(tmp_path / "out"))
    assert line.startswith(f"error: {raw}: a raw nnU-Net v2 dataset") and "fedseg data import nnunet" in line, line
    assert not torch


def test_run_with_an_out_under_a_file_says_so_before_importing_torch(tmp_path):
    (tmp_path / "file").write_text("")
    out = tmp_path / "file" / "run"
    line, torch = fedseg("run", "--preset", "demo", "--out", str(out))
    assert (line, torch) == (
        f"error: --out {out}: {tmp_path / 'file'} is a file, so {out} cannot be created; choose a folder",
        False,
    )


@pytest.mark.skipif(not Path("/proc/self").is_dir(), reason="a folder no folder can be made in: /proc (Linux)")
def test_run_with_an_out_that_cannot_be_made_says_so_before_preparing_anything():
    """The error that making ``--out`` raised once the data was prepared (minutes on a real federation): now at
    once, the same line, and nothing made."""
    line, torch = fedseg("run", "--preset", "demo", "--out", "/proc/fedseg-no-such/run")
    assert (line, torch) == (
        "error: --out /proc/fedseg-no-such/run: no folder can be made there "
        "(/proc/fedseg-no-such: No such file or directory)",
        False,
    )


def test_run_with_an_out_inside_the_data_folder_says_so_before_importing_torch(tmp_path):
    (tmp_path / "fed").mkdir()
    out = tmp_path / "fed" / "run"
    line, torch = fedseg("run", "--preset", "demo", "--data", str(tmp_path / "fed"), "--out", str(out))
    assert line.startswith(f"error: {out}: lies inside the federation folder {tmp_path / 'fed'}") and not torch, line


def test_bench_with_a_missing_bench_file_says_so_before_importing_torch(tmp_path):
    line, torch = fedseg("bench", str(tmp_path / "bench.yaml"), "--out", str(tmp_path / "out"))
    assert (line, torch) == (f"error: {tmp_path / 'bench.yaml'}: bench file not found", False)


def test_predict_with_a_missing_model_says_so_before_importing_torch(tmp_path):
    model, out = tmp_path / "run" / "model", tmp_path / "masks"
    line, torch = fedseg("predict", "--model", str(model), "--input", str(tmp_path / "in"), "--out", str(out))
    assert (line, torch) == (f"error: {model}: {MISSING_MODEL}", False)
    assert not out.exists()


def test_predict_with_a_missing_input_or_out_under_a_file_says_so_before_importing_torch(tmp_path):
    bundle = tmp_path / "run" / "model" / "fedavg"  # found by its manifest (read after torch is imported)
    bundle.mkdir(parents=True)
    (bundle / "manifest.json").write_text("{}")
    (tmp_path / "image.png").write_bytes(b"")
    (tmp_path / "link.png").symlink_to(tmp_path / "gone.png")
    (tmp_path / "file").write_text("")
    model, out = str(tmp_path / "run" / "model"), str(tmp_path / "masks")
    for given, said in (("in.png", "no such file or folder"), ("link.png", "a broken symbolic link")):
        line, torch = fedseg("predict", "--model", model, "--input", str(tmp_path / given), "--out", out)
        assert (line, torch) == (f"error: {tmp_path / given}: {said}", False)
    under = tmp_path / "file" / "masks"
    line, torch = fedseg("predict", "--model", model, "--input", str(tmp_path / "image.png"), "--out", str(under))
    assert (line, torch) == (
        f"error: --out {under}: {tmp_path / 'file'} is a file, so {under} cannot be created; choose a folder",
        False,
    )


def test_data_check_of_a_missing_folder_says_so_before_importing_torch(tmp_path):
    line, torch = fedseg("data", "check", str(tmp_path / "fed"))
    assert (line, torch) == (f"error: {tmp_path / 'fed'}: {NOT_A_FEDERATION}", False)
