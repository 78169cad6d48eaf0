"""A command's console output outlives its reader (``fedseg.console_streams``): `fedseg run ... | head` ended the run
at the first line after ``head`` had exited (``error: [Errno 32] Broken pipe``, status 1, no results)."""

from __future__ import annotations

import subprocess
import sys

TINY_SET = ["data.scale=0.05", "data.image_size=32", "model.channels=[4,8]", "model.strides=[2]", "threads=1"]


def test_a_run_whose_stdout_reader_goes_away_finishes_silently_with_its_results(tmp_path):
    out = tmp_path / "run"
    run = ["run", "--preset", "demo", "--algorithms", "fedavg", "--rounds", "3", "--out", str(out)]
    proc = subprocess.Popen(
        [sys.executable, "-m", "fedseg", *run, *(a for s in TINY_SET for a in ("--set", s))],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None and proc.stderr is not None
    try:
        first = proc.stdout.read(10)  # the first round's line has begun: `head -c 10`
        proc.stdout.close()  # the reader exits; rounds 2 and 3, the Dice table and the report's line are still to say
        errors = proc.stderr.read()
        status = proc.wait(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert len(first) == 10
    assert status == 0, errors
    assert "Broken pipe" not in errors and "Traceback" not in errors, errors
    assert (out / "results.csv").is_file() and (out / "report.html").is_file()
    assert (out / "run.log").read_text().rstrip().endswith("finished")
