"""How long one Flower exchange takes when the sites' work is negligible: the deployment's own latency.

    .venv/bin/python benchmarks/flower_exchange.py [--runs 3] [--poll 0.05] [--label after] [--other PATH]
        [--other-label before]

Runs ``fedseg flower local`` (warm ClientApp runners, insecure loopback) on a tiny 2-site federation (the test
suite's discs, 32² images, a UNet of channels 4-8-16: each site's compute is 10-30 ms an exchange) for FedAvg, 2
rounds, ``--runs`` times. Per run: the median and spread of the exchanges' wall seconds (``ledger.csv``'s
``wall_seconds``, one per exchange: the ServerApp pushing a message to both sites until it holds both replies),
leaving out the first (start-up), the run's wall seconds, and the machine's busy fraction (``/proc/stat``).

``--other PATH``: a ``src`` folder of another fedseg (``git worktree add /tmp/old COMMIT``, then
``--other /tmp/old/src``), run alternately with this one, each ``--runs`` times: the two sides see the same machine.
Both must give the same Dice (checked). Appends to ``benchmarks/results/flower_exchange.json`` under ``--label``.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

import yaml

HERE = Path(__file__).parent


def cpu_ticks() -> tuple[int, int]:
    """All and idle (idle + iowait) jiffies of the machine so far."""
    with open("/proc/stat") as f:
        ticks = [int(v) for v in f.readline().split()[1:]]
    return sum(ticks), ticks[3] + ticks[4]


def one_run(src: Path | None, config: Path, data: Path, out: Path, poll: float) -> dict:
    """One ``flower local`` with the fedseg in ``src`` (None: this one): its exchanges' seconds and its Dice."""
    env = dict(os.environ)
    if src is not None:
        env["PYTHONPATH"] = str(src)
    command = [sys.executable, "-m", "fedseg.cli", "flower", "local", "--isolation", "warm", "--poll", str(poll)]
    command += ["--config", str(config), "--data", str(data), "--out", str(out)]
    began, (all0, idle0) = time.monotonic(), cpu_ticks()
    proc = subprocess.run(command, capture_output=True, text=True, env=env, timeout=600)
    wall, (all1, idle1) = time.monotonic() - began, cpu_ticks()
    if proc.returncode != 0:
        raise SystemExit(f"flower local failed ({proc.returncode}): {(proc.stdout + proc.stderr)[-2000:]}")
    with open(out / "ledger.csv") as f:
        exchanges = {int(r["exchange"]): float(r["wall_seconds"]) for r in csv.DictReader(f)}
    later = [s for e, s in sorted(exchanges.items()) if e > 1]
    summary = json.loads((out / "summary.json").read_text())
    return {
        "exchange_median_s": statistics.median(later),
        "exchange_min_s": min(later),
        "exchange_max_s": max(later),
        "exchanges": len(later),
        "first_exchange_s": exchanges[1],
        "wall_s": wall,
        "busy_fraction": 1 - (idle1 - idle0) / max(all1 - all0, 1),
        "dice": summary["algorithms"]["fedavg"]["dice"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--poll", type=float, default=0.05)
    parser.add_argument("--label", default="this")
    parser.add_argument("--other", type=Path, default=None, help="another fedseg's src folder, run alternately")
    parser.add_argument("--other-label", default=None, help="its name in the results (default: other:PATH)")
    parser.add_argument("--out", type=Path, default=HERE / "results" / "flower_exchange.json")
    args = parser.parse_args()
    sys.path.insert(0, str(HERE.parent / "src"))
    from fedseg.data.folder_write import write_folder
    from fedseg.testing import TINY, make_disc_federation

    sides: dict[str, Path | None] = {args.label: None}
    if args.other is not None:
        sides[args.other_label or f"other:{args.other}"] = args.other
    results: dict[str, list[dict]] = {side: [] for side in sides}
    with tempfile.TemporaryDirectory(prefix="flower-exchange-") as tmp:
        work = Path(tmp)
        data = write_folder(make_disc_federation(n_sites=2, cases_per_site=8), work / "fed")
        config = work / "cfg.yaml"
        config.write_text(yaml.safe_dump({**TINY, "algorithms": ["fedavg"], "fl": {"rounds": 2}}))
        for run in range(args.runs):
            for number, (side, src) in enumerate(sides.items()):
                result = one_run(src, config, data, work / f"side{number}-run{run}", args.poll)
                results[side].append(result)
                print(f"{side}: run {run + 1}: exchange median {result['exchange_median_s']:.3f} s", flush=True)
    dice = {side: [r["dice"] for r in runs] for side, runs in results.items()}
    if len({json.dumps(d, sort_keys=True) for ds in dice.values() for d in ds}) != 1:
        raise SystemExit(f"the runs' Dice differ: {dice}")
    record = {
        "label": args.label,
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "command": " ".join([Path(sys.argv[0]).name, *sys.argv[1:]]),
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "python": platform.python_version()},
        "poll_s": args.poll,
        "sides": {
            side: {
                "runs": runs,
                "exchange_median_s": statistics.median(r["exchange_median_s"] for r in runs),
                "exchange_run_medians_s": [round(r["exchange_median_s"], 3) for r in runs],
            }
            for side, runs in results.items()
        },
    }
    earlier = json.loads(args.out.read_text()) if args.out.exists() else []
    args.out.write_text(json.dumps([*earlier, record], indent=2) + "\n")
    for side, runs in record["sides"].items():
        print(f"{side}: exchange median {runs['exchange_median_s']:.3f} s (runs {runs['exchange_run_medians_s']})")


if __name__ == "__main__":
    main()
