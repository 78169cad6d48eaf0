"""Start-up and end-to-end: ``fedseg run`` from process start to the first algorithm, and to its exit, W = 1 vs 2.

Every measurement is one real ``fedseg run`` (the CLI, in a fresh subprocess) of the ``demo`` preset with
``--algorithms fedavg,fedsm --rounds 2 --threads 1`` (``--rounds N``: N rounds), its built-in federation read
from a cache folder of this script's own (``FEDSEG_CACHE_DIR``, filled before the timed runs: the warm case;
``--cold`` also times runs with the cache emptied before each). Measured from the parent's launch of the
subprocess: ``startup_s`` to the first call of ``fedseg.run.run_algorithm`` (round 1 starts after that
algorithm's engine and server are built; recorded by a thread of the child harness that wraps the function once
``fedseg.run.experiment`` has it, so the CLI's import order is unchanged) and ``total_s`` to the process's exit.
W = 1 and W = 2 runs alternate (which goes first flips every pair) so slow phases of the shared machine hit
both; reported: median, min, max over ``--pairs`` pairs, and the speed-up W=1 total / W=2 total per pair.

    .venv/bin/python benchmarks/startup.py [--pairs 3] [--cold] [--rounds 2] [--out PATH]
    .venv/bin/python benchmarks/startup.py --generation   # synthetic-retina scale 1 at 128^2: serial vs pool
    .venv/bin/python benchmarks/startup.py --imports 5    # MONAI's import with and without fedseg.lean_monai

Writes ``benchmarks/results/startup.json`` (``--generation``: ``generation.json``; ``--imports``: ``imports.json``).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

HERE = Path(__file__).parent
RESULTS = HERE / "results"
RUN_ARGS = ["run", "--preset", "demo", "--algorithms", "fedavg,fedsm", "--threads", "1"]  # + --rounds N
MARKS_ENV = "FEDSEG_BENCH_MARKS"  # the child writes its time marks (JSON) to this file


def spread(values: list[float]) -> dict:
    if not values:
        return {}
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "n": len(values)}


# --- the child: the CLI with a timer on run_algorithm (as fedseg.run.experiment calls it) ---------------------
def child(argv: list[str]) -> None:
    marks: dict[str, float] = {}
    done = threading.Event()

    def wrap() -> None:  # wrap run_algorithm once fedseg.run.experiment has imported it (run_experiment calls it late)
        while not done.is_set():
            module = sys.modules.get("fedseg.run.experiment")
            original = getattr(module, "run_algorithm", None)
            if original is not None:

                def timed(*args, **kwargs):
                    marks.setdefault("first_algorithm", time.time())
                    return original(*args, **kwargs)

                module.run_algorithm = timed  # type: ignore[union-attr]
                return
            time.sleep(0.002)

    threading.Thread(target=wrap, daemon=True).start()
    from fedseg.cli import app

    try:
        code = app(argv, standalone_mode=False)  # a typer.Exit's code (a failed run's 1), else the command's None
    finally:
        done.set()
        marks["exit"] = time.time()
        Path(os.environ[MARKS_ENV]).write_text(json.dumps(marks))
    from fedseg.process_exit import exit_now

    exit_now(code if isinstance(code, int) else 0)  # as the ``fedseg`` command ends (``fedseg.cli.entry``)


def launch(workers: int, cache: Path, clear_cache: bool = False, rounds: int = 2) -> dict:
    """One ``fedseg run`` W = ``workers`` in a fresh subprocess: its start-up and total seconds."""
    if clear_cache:
        subprocess.run([sys.executable, "-m", "fedseg.cli", "data", "cache", "clear"], env=_env(cache), check=True)
    with tempfile.TemporaryDirectory() as tmp:
        marks_file = Path(tmp) / "marks.json"
        argv = [*RUN_ARGS, "--rounds", str(rounds), "--workers", str(workers), "--out", str(Path(tmp) / "run")]
        env = {**_env(cache), MARKS_ENV: str(marks_file)}
        start = time.time()
        proc = subprocess.run([sys.executable, __file__, "--child", *argv], env=env, capture_output=True, text=True)
        end = time.time()
        if proc.returncode != 0:
            raise RuntimeError(f"W={workers} failed:\n{proc.stderr[-4000:]}")
        marks = json.loads(marks_file.read_text())
    return {"workers": workers, "startup_s": marks["first_algorithm"] - start, "total_s": end - start}


def generation(source: str, scale: float, size: int, repeats: int) -> dict:
    """Seconds to generate ``source`` (no cache) serially and with the process pool, alternating."""
    from fedseg.data import cache
    from fedseg.data.sources import build_builtin

    seconds: dict[str, list[float]] = {"serial": [], "parallel": []}
    for i in range(repeats):
        for mode in ("serial", "parallel") if i % 2 == 0 else ("parallel", "serial"):
            cache.PARALLEL_MIN_VOXELS = 10**15 if mode == "serial" else 0
            start = time.perf_counter()
            build_builtin(source, scale, size, 0, cache=False)
            seconds[mode].append(time.perf_counter() - start)
    cache.PARALLEL_MIN_VOXELS = 0
    return {
        "federation": f"{source} scale {scale} image_size {size}",
        "workers": cache.generate_workers(10**6, 10**12),
        **{mode: spread(values) for mode, values in seconds.items()},
        "speedup": spread([a / b for a, b in zip(seconds["serial"], seconds["parallel"])]),
    }


IMPORT_CHILD = """
import resource, sys, time
start = time.perf_counter()
if sys.argv[1] == "lean":
    from fedseg import lean_monai
    lean_monai.install()
import monai.networks.nets, monai.losses, monai.inferers, monai.transforms
r = resource.getrusage(resource.RUSAGE_SELF)
print(r.ru_utime + r.ru_stime, time.perf_counter() - start)
"""


def imports(pairs: int) -> dict:
    """CPU and wall seconds of importing MONAI's parts fedseg uses, with and without ``fedseg.lean_monai``'s hook
    (each in a fresh interpreter, the two alternating; CPU time is the steadier figure on a shared machine)."""
    seconds: dict[str, dict[str, list[float]]] = {m: {"cpu_s": [], "wall_s": []} for m in ("full", "lean")}
    for i in range(pairs):
        for mode in ("full", "lean") if i % 2 == 0 else ("lean", "full"):
            out = subprocess.run([sys.executable, "-c", IMPORT_CHILD, mode], capture_output=True, text=True, check=True)
            cpu, wall = map(float, out.stdout.split())
            seconds[mode]["cpu_s"].append(cpu)
            seconds[mode]["wall_s"].append(wall)
    return {
        "what": "import monai.networks.nets, monai.losses, monai.inferers, monai.transforms (fresh interpreter)",
        **{m: {k: spread(v) for k, v in values.items()} for m, values in seconds.items()},
        "cpu_saved_s": spread([a - b for a, b in zip(seconds["full"]["cpu_s"], seconds["lean"]["cpu_s"])]),
    }


def _env(cache: Path) -> dict[str, str]:
    return {**os.environ, "FEDSEG_CACHE_DIR": str(cache)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--child", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)
    ap.add_argument("--pairs", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=2, help="rounds of each run (the issue's measure: 2)")
    ap.add_argument("--cold", action="store_true", help="also one W=1 and one W=2 run with an empty cache")
    ap.add_argument("--out", default=str(RESULTS / "startup.json"))
    ap.add_argument("--generation", action="store_true", help="only: serial vs pool generation")
    ap.add_argument("--imports", type=int, metavar="PAIRS", help="only: MONAI's import with/without fedseg.lean_monai")
    args = ap.parse_args()
    if args.child is not None:
        child(args.child)
        return
    if args.imports:
        report = {"command": ("python benchmarks/startup.py " + " ".join(sys.argv[1:])).strip(), "cpus": os.cpu_count()}
        report.update(imports(args.imports))
        (RESULTS / "imports.json").write_text(json.dumps(report, indent=1))
        print(json.dumps(report, indent=1))
        return
    if args.generation:
        report = generation("synthetic-retina", 1.0, 128, 3)
        report["command"] = ("python benchmarks/startup.py " + " ".join(sys.argv[1:])).strip()
        (RESULTS / "generation.json").write_text(json.dumps(report, indent=1))
        print(json.dumps(report, indent=1))
        return
    runs: list[dict] = []
    with tempfile.TemporaryDirectory() as cache_dir:
        cache = Path(cache_dir)
        if args.cold:
            for w in (1, 2):
                runs.append({**launch(w, cache, clear_cache=True, rounds=args.rounds), "cache": "cold"})
                print(runs[-1], flush=True)
        else:  # fill the cache (not timed)
            subprocess.run(
                [
                    sys.executable,
                    "-c",
                    "from fedseg.data.sources import build_builtin as b; "
                    "from fedseg.config_load import load_config as c; d = c(preset='demo').data; "
                    "b(d.source, d.scale, d.image_size, d.seed)",
                ],
                env=_env(cache),
                check=True,
            )
        for i in range(args.pairs):
            for w in (1, 2) if i % 2 == 0 else (2, 1):
                runs.append({**launch(w, cache, rounds=args.rounds), "cache": "warm", "pair": i})
                print(runs[-1], flush=True)
    warm = [r for r in runs if r["cache"] == "warm"]
    by_pair = {i: {r["workers"]: r for r in warm if r["pair"] == i} for i in range(args.pairs)}
    summary = {
        f"W{w}": {
            "startup_s": spread([r["startup_s"] for r in warm if r["workers"] == w]),
            "total_s": spread([r["total_s"] for r in warm if r["workers"] == w]),
        }
        for w in (1, 2)
    }
    summary["speedup_w2_total"] = spread([p[1]["total_s"] / p[2]["total_s"] for p in by_pair.values()])
    report = {
        "command": ("python benchmarks/startup.py " + " ".join(sys.argv[1:])).strip(),
        "cpus": os.cpu_count(),
        "run": "fedseg " + " ".join(RUN_ARGS) + f" --rounds {args.rounds} --workers W",
        "summary": summary,
        "runs": runs,
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=1))
    print(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
