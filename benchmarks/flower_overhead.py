"""Flower's overhead: FedAvg on the ``demo`` federation through the simulator vs ``fedseg flower local``.

    python benchmarks/flower_overhead.py [--rounds 3] [--set key=value ...] [--variants sim,warm,...]

Every variant trains the same config on the same folder federation (``demo``'s built-in
federation written to disk once) and must give the simulator's test Dice (checked). Measured per
variant, wall clock:

- ``startup_s``: from the call to the first round's start (simulator: loading and preprocessing
  every site; Flower: SuperLink, SuperNodes, ServerApp process, every site's data check);
- ``rounds_s`` / ``round_mean_s``: each round (local training, validation, the engine's snapshot);
- ``finish_s``: from the last round to the return (test evaluation, outputs; Flower: stopping
  every process). Report rendering is not included (same cost for both);
- ``exchanges``: Flower only, per action, mean seconds the ServerApp spent pushing the messages
  and waiting for the replies (``FEDSEG_FLOWER_LOG_LEVEL=DEBUG`` lines of ``server.log``), and
  ``compute_per_round_s``: the slowest site's compute per round (from ``ledger.csv``): the rest
  of a round is Flower's.

Variants: ``sim`` (in-process simulator), ``warm`` (fedseg's warm ClientApp workers, waits
shortened to ``--poll`` 0.2 s, the default), ``warm-tls`` (+ TLS and SuperNode authentication),
``warm-poll-0.05`` (waits 0.05 s), ``warm-flower-waits`` (Flower's own polling intervals and
backoffs), ``subprocess`` (Flower's default isolation: one ClientApp process per message),
``subprocess-tls``. Sites run in parallel, each with ``threads`` torch threads: on a machine
with fewer cores than sites x threads, Flower's rounds also pay for oversubscription.
Writes ``benchmarks/results/flower_overhead.json``.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import platform
import re
import shutil
import sys
import time
from datetime import datetime
from pathlib import Path

import torch

from fedseg.config_load import load_config
from fedseg.data.folder_write import write_folder
from fedseg.data.synthetic import build_synthetic
from fedseg.flower.deploy import DEFAULT_POLL
from fedseg.flower.launch import local
from fedseg.run import run_experiment

VARIANTS = {
    "sim": None,
    "warm": {"isolation": "warm", "tls": False, "poll": DEFAULT_POLL},
    "warm-tls": {"isolation": "warm", "tls": True, "poll": DEFAULT_POLL},
    "warm-poll-0.05": {"isolation": "warm", "tls": False, "poll": 0.05},
    "warm-flower-waits": {"isolation": "warm", "tls": False, "poll": 0.0},
    "subprocess": {"isolation": "subprocess", "tls": False, "poll": DEFAULT_POLL},
    "subprocess-tls": {"isolation": "subprocess", "tls": True, "poll": DEFAULT_POLL},
}
ROUND_LINE = re.compile(r"fedavg round (\d+)/\d+")
EXCHANGE_LINE = re.compile(
    r"^(\S+ \S+) DEBUG fedseg\.flower\.engine: fedavg (\w+) \(round \d+\): "
    r"pushed in ([\d.]+) s, replies after ([\d.]+) s"
)


def simulator(cfg, out: Path) -> dict:
    marks: dict[str, float] = {}
    rounds: list[float] = []
    t0 = time.perf_counter()
    results = run_experiment(
        cfg,
        out,
        on_algorithm_start=lambda name: marks.setdefault("start", time.perf_counter()),
        on_round_end=lambda name, rnd, losses: rounds.append(time.perf_counter()),
    )
    end = time.perf_counter()
    return timing(t0, marks["start"], rounds, end) | {"dice": results.algorithms[0].summary["dice"]}


def flower(cfg, out: Path, isolation: str, tls: bool, poll: float) -> dict:
    marks: dict[str, float] = {}
    rounds: list[float] = []

    def echo(line: str) -> None:
        now = time.perf_counter()
        if "fedavg: start" in line:
            marks.setdefault("start", now)
        elif ROUND_LINE.search(line):
            rounds.append(now)

    os.environ["FEDSEG_FLOWER_LOG_LEVEL"] = "DEBUG"
    t0 = time.perf_counter()
    local(cfg, out, tls=tls, isolation=isolation, poll=poll, echo=echo)
    end = time.perf_counter()
    summary = json.loads((out / "summary.json").read_text())
    return timing(t0, marks["start"], rounds, end) | {
        "dice": summary["algorithms"]["fedavg"]["dice"],
        "exchanges": exchanges(out / "flower" / "server.log"),
        "compute_per_round_s": compute_per_round(out / "ledger.csv"),
    }


def timing(t0: float, start: float, rounds: list[float], end: float) -> dict:
    ends = [start, *rounds]
    per_round = [b - a for a, b in zip(ends, ends[1:])]
    return {
        "startup_s": start - t0,
        "rounds_s": per_round,
        "round_mean_s": sum(per_round) / len(per_round),
        "round_mean_after_first_s": sum(per_round[1:]) / max(len(per_round) - 1, 1),
        "finish_s": end - rounds[-1],
        "total_s": end - t0,
    }


def exchanges(server_log: Path) -> dict:
    """Mean push and reply-wait seconds per action, from the ServerApp's DEBUG lines."""
    stats: dict[str, list[tuple[float, float]]] = {}
    for line in server_log.read_text().splitlines():
        m = EXCHANGE_LINE.match(line)
        if m:
            stats.setdefault(m.group(2), []).append((float(m.group(3)), float(m.group(4))))
    return {
        a: {"n": len(v), "push_s": sum(p for p, _ in v) / len(v), "wait_s": sum(w for _, w in v) / len(v)}
        for a, v in stats.items()
    }


def compute_per_round(ledger: Path) -> list[float]:
    """Per round, the slowest site's compute seconds (sites work in parallel on Flower)."""
    per: dict[tuple[int, str], float] = {}
    with open(ledger) as f:
        for row in csv.DictReader(f):
            key = (int(row["round"]), row["site"])
            per[key] = per.get(key, 0.0) + float(row["seconds"])
    rounds = sorted({r for r, _ in per})
    return [max(v for (r, _), v in per.items() if r == rnd) for rnd in rounds]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--set", dest="sets", action="append", default=[], help="config override key=value (repeatable)"
    )
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--work", type=Path, default=Path("/tmp/fedseg-flower-overhead"))
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "flower_overhead.json")
    args = parser.parse_args()

    overrides = ["algorithms=[fedavg]", f"fl.rounds={args.rounds}", *args.sets]
    cfg = load_config(preset="demo", overrides=overrides)
    torch.set_num_threads(cfg.threads)
    if args.work.exists():
        shutil.rmtree(args.work)
    root = write_folder(
        build_synthetic(cfg.data.source, cfg.data.scale, cfg.data.image_size, cfg.seed), args.work / "fed"
    )
    cfg = cfg.model_copy(update={"data": cfg.data.model_copy(update={"source": "folder", "root": str(root)})})
    sites = {p.name: len(list((p / "images").iterdir())) for p in sorted(root.iterdir()) if p.is_dir()}

    results: dict[str, dict] = {}
    for name in args.variants.split(","):
        print(f"--- {name}", flush=True)
        load = os.getloadavg()[0]
        out = args.work / name
        results[name] = simulator(cfg, out) if VARIANTS[name] is None else flower(cfg, out, **VARIANTS[name])
        results[name]["load_avg_1min_before"] = load
        print(json.dumps({k: v for k, v in results[name].items() if k != "dice"}, indent=1), flush=True)
    if "sim" in results:
        for r in results.values():
            r["dice_equal_to_simulator"] = all(abs(r["dice"][k] - results["sim"]["dice"][k]) <= 1e-6 for k in r["dice"])

    report = {
        "command": "python benchmarks/flower_overhead.py " + " ".join(sys.argv[1:]),
        "date": datetime.now().isoformat(timespec="seconds"),
        "machine": {
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "torch": torch.__version__,
            "note": "shared machine: other jobs ran at the same time; see load_avg_1min_before",
        },
        "config": {
            "preset": "demo",
            "overrides": overrides,
            "sites": sites,
            "image_size": cfg.data.image_size,
            "model_channels": list(cfg.model.channels),
            "threads": cfg.threads,
            "batch_size": cfg.train.batch_size,
            "resolved": cfg.model_dump(mode="json"),
        },
        "variants": results,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
