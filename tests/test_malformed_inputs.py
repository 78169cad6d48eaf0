"""Malformed input and what it gets: every row of the table "Malformed input" in docs/data.md is run here for real.

Each case breaks a small valid folder federation (or the command line), runs the CLI in-process and checks that the
command fails (or warns) with exactly the line in ``CASES``: one line naming the file, field or site, never a
traceback. The table is rendered from ``CASES`` (``python tests/test_malformed_inputs.py`` prints it) and
``test_the_readme_table_is_this_catalogue`` keeps the two equal, so the table lists what the tests saw.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
from PIL import Image
from typer.testing import CliRunner

from fedseg.cli import app

README = Path(__file__).resolve().parents[1] / "docs" / "data.md"  # the table lives on the "Your own data" page
BEGIN, END = "<!-- malformed-inputs: begin -->", "<!-- malformed-inputs: end -->"
TINY = ["model.channels=[4,8,16]", "data.image_size=32", "train.batch_size=4", "threads=1", "eval.hd95=false"]
RUN = ["run", "--preset", "demo", "--data", "fed", "--algorithms", "fedavg", "--rounds", "1", "--out", "out"]


@dataclass(frozen=True)
class Case:
    """``what`` is broken (README wording), ``args`` the CLI call (relative to the test's folder, which holds a
    valid federation ``fed/`` with sites ``site1``, ``site2``), ``breaks`` changes ``fed/`` first, ``line`` is the
    output line expected (paths relative to that folder), ``code`` the exit code."""

    what: str
    args: list[str]
    line: str
    breaks: Callable[[Path], object] = lambda fed: None
    code: int = 1
    needs_root_mount: bool = False


def _npy(fed: Path, case: str, value: float) -> None:
    """Replace ``site1``'s case image with an ``.npy`` holding ``value`` in two pixels."""
    (fed / "site1" / "images" / f"{case}.png").unlink()
    image = np.zeros((3, 32, 32), np.float32)
    image[0, 0, :2] = value
    np.save(fed / "site1" / "images" / f"{case}.npy", image)


def _one_case_site(fed: Path) -> None:
    (fed / "site3" / "images").mkdir(parents=True)
    (fed / "site3" / "labels").mkdir()
    Image.fromarray(np.zeros((32, 32, 3), np.uint8)).save(fed / "site3" / "images" / "z.png")
    Image.fromarray(np.zeros((32, 32), np.uint8)).save(fed / "site3" / "labels" / "z.png")


def _folder_named_like_an_image(fed: Path) -> None:
    (fed / "site1" / "images" / "c4.png").mkdir()
    (fed / "site1" / "images" / "c4.png" / "a.png").write_bytes(b"\x89PNG not dicom")


def _links_to_a_moved_dataset(fed: Path) -> None:
    """Link ``site1``'s images to a raw dataset (as an import without ``--copy`` does), then move that dataset."""
    raw = fed.parent / "raw"
    raw.mkdir()
    for image in sorted((fed / "site1" / "images").iterdir()):
        image.rename(raw / image.name)
        image.symlink_to(raw / image.name)
    raw.rename(fed.parent / "raw-moved")


def _read_only(root: Path) -> None:
    (root / "ro").mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=64k", "tmpfs", str(root / "ro")], check=True)


CASES = [
    Case(
        "NaN pixels in an image",
        ["data", "check", "fed"],
        "fed/site1/images/s1_000.npy: image has 2 NaN and 0 Inf values (of 3072); replace them",
        lambda fed: _npy(fed, "s1_000", np.nan),
    ),
    Case(
        "Inf pixels in an image (training also refuses it)",
        [*RUN, *(a for s in TINY for a in ("--set", s))],
        "fed/site1/images/s1_001.npy: image has 0 NaN and 2 Inf values (of 3072); replace them",
        lambda fed: _npy(fed, "s1_001", np.inf),
    ),
    Case(
        "a site with one case",
        ["data", "check", "fed"],
        "site 'site3': no validation cases and no test cases after splitting (1 cases: 1 train, 0 val, 0 test); "
        "every trained site needs training, validation and test cases (more cases, another split, or a splits.csv)",
        _one_case_site,
    ),
    Case(
        "a folder named like an image in `images/`",
        ["data", "check", "fed"],
        "fed/site1/images/c4.png/a.png: not a DICOM file (no DICM preamble); a case folder in images/ must hold "
        "the .dcm files of one DICOM series",
        _folder_named_like_an_image,
    ),
    Case(
        "a symbolic link loop in `images/`",
        ["data", "check", "fed"],
        "fed/site1/images/c6: neither a file nor a folder (a broken symbolic link or a link loop)",
        lambda fed: (fed / "site1" / "images" / "c6").symlink_to(fed / "site1" / "images" / "c6"),
    ),
    Case(
        "an import's links to a raw dataset that moved (not a line per link and its follow-on problems)",
        ["data", "check", "fed"],
        "error: 8 files of fed link to raw, which no longer exists (e.g. site1/images/s1_000.png -> raw/s1_000.png); "
        "the raw data moved? import it again, or restore it where it was",
        _links_to_a_moved_dataset,
    ),
    Case(
        "an image above `--max-image-mb` (a warning; the check passes)",
        ["data", "check", "fed", "--max-image-mb", "0.01"],
        "warning: fed/site1/images/s1_000.png: image is 0.0123 MB as float32 (3x32x32), above 0.01 MB; a run keeps "
        "every case in memory",
        code=0,
    ),
    Case(
        "a misspelt method in `methods.NAME`",
        [*RUN, "--set", "methods.fedsmm.lam=0.5"],
        "error: methods.fedsmm: no algorithm is named 'fedsmm'; did you mean 'fedsm'?",
    ),
    Case(
        "a fault aimed at a site that does not exist",
        [*RUN, "--set", "faults=[{site: site9, kind: crash}]"],
        "error: faults[0].site: federation 'discs' has no site 'site9'; its sites: site1, site2",
    ),
    Case(
        "a value outside a choice (the message keeps its quotes)",
        [*RUN, "--set", "train.optimizer=adamw"],
        "error: --set train.optimizer must be 'adam' or 'sgd', got 'adamw'",
    ),
    Case(
        "an image size the network cannot halve down to its bottom level",
        [*RUN, "--set", "data.image_size=40"],
        "error: --set data.image_size=40: 40 is not a multiple of 16, the product of the strides of the unet's 4 "
        "downsampling levels (model.channels, model.strides), so its decoder cannot meet the skip connections; use 32 "
        "or 48",
    ),
    Case(
        "an image size that leaves one voxel at the network's bottom",
        [*RUN, "--set", "data.image_size=16"],
        "error: --set data.image_size=16: the unet's 4 downsampling levels (model.channels, model.strides) leave one "
        "voxel at the bottom, where instance norm needs more than one; use at least 32, or fewer levels",
    ),
    Case(
        "a read-only `--out`",
        [*RUN[:-1], "ro/out"],
        "error: --out ro/out: no folder can be made there (ro/out: Read-only file system)",
        breaks=lambda fed: _read_only(fed.parent),
        needs_root_mount=True,
    ),
]


def markdown_table() -> str:
    """The docs/data.md table, from ``CASES``."""
    rows = ["| malformed input | command | what it gets (exit code) |", "|---|---|---|"]
    for case in CASES:
        args = " ".join(a if " " not in a else f"'{a}'" for a in case.args)
        command = "fedseg " + args.replace("".join(f" --set {s}" for s in TINY), "")  # the test's small sizes
        line = case.line.replace("|", "\\|")
        rows.append(f"| {case.what} | `{command}` | `{line}` ({case.code}) |")
    return "\n".join(rows)


@pytest.fixture
def workdir(tmp_path, disc_federation, monkeypatch):
    from fedseg.data.folder_write import write_folder

    write_folder(disc_federation(n_sites=2, cases_per_site=8), tmp_path / "fed")
    monkeypatch.chdir(tmp_path)
    yield tmp_path
    if (tmp_path / "ro").is_mount():
        subprocess.run(["umount", "-l", str(tmp_path / "ro")], check=False)


@pytest.mark.parametrize("case", CASES, ids=[c.what for c in CASES])
def test_each_malformed_input_gets_its_one_line(workdir, case):
    if case.needs_root_mount and subprocess.run(["mount", "--version"], capture_output=True).returncode:
        pytest.skip("needs mount")
    try:
        case.breaks(workdir / "fed")
    except subprocess.CalledProcessError:
        pytest.skip("cannot mount a tmpfs here (needs root)")
    result = CliRunner().invoke(app, case.args, catch_exceptions=False)
    output = " ".join(result.output.replace(f"{workdir}/", "").split())  # rich folds long lines at the width
    assert result.exit_code == case.code, output
    assert case.line in output, output
    assert "Traceback" not in output
    if case.code:
        assert not (workdir / "out").exists()  # nothing written


def test_the_readme_table_is_this_catalogue():
    text = README.read_text()
    assert BEGIN in text and END in text, f"docs/data.md lacks the {BEGIN} ... {END} block"
    table = text.split(BEGIN, 1)[1].split(END, 1)[0].strip()
    assert table == markdown_table(), "docs/data.md's table is stale: python tests/test_malformed_inputs.py"


if __name__ == "__main__":
    sys.stdout.write(markdown_table() + "\n")
