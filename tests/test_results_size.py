"""benchmarks/results holds aggregates only: its tracked files stay under 5 MB and hold no run folders."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
RESULTS = "benchmarks/results"
LIMIT = 5 * 1024 * 1024


def _tracked() -> list[str]:
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    out = subprocess.run(
        ["git", "ls-files", "-z", "--", RESULTS], cwd=ROOT, capture_output=True, check=True
    ).stdout.decode()
    return [p for p in out.split("\0") if p]


def test_tracked_results_stay_under_5_mb():
    files = _tracked()
    sizes = {p: (ROOT / p).stat().st_size for p in files if (ROOT / p).exists()}
    total = sum(sizes.values())
    largest = sorted(sizes.items(), key=lambda kv: -kv[1])[:5]
    assert total <= LIMIT, f"{RESULTS}: {total / 1e6:.1f} MB tracked (limit 5 MB); largest: {largest}"


def test_no_run_folders_tracked():
    runs = [p for p in _tracked() if "/runs/" in p or "/studies/" in p or p.endswith("/results.csv")]
    assert not runs, f"per-run files tracked under {RESULTS} (keep them under benchmarks/runs/): {runs[:5]}"
