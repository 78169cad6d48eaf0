"""Scaling: round wall time with W worker processes, start-up time, peak memory, and cost against the number of sites.

Three groups of configurations, each configuration one ``run_experiment`` (one algorithm, ``threads=1`` per
process) in a fresh subprocess of its own (clean peak memory, no warm caches shared between configurations):

- ``demo``: the ``demo`` preset (synthetic-retina at scale 0.25, 6 sites, 227 training images), FedAvg and
  FedSM, ``--demo-rounds`` rounds, W = 1 (the in-process simulator) and W = 2 (``engine.workers=2``), plus
  W = 1 with ``threads=2`` (the other way to use both cores: intra-op threads) as a second baseline;
- ``retina``: the ``synthetic-retina`` preset at full scale (data.scale 1: 904 training images), FedAvg and
  FedSM, ``--retina-rounds`` rounds, W = 1 and 2;
- ``sites``: a synthetic federation of K small sites (``many-sites``: :func:`many_sites`, 12 cases of 64x64
  each, registered with ``fedseg.data.sources.register_federation``) with the demo network, FedAvg,
  ``--sites-rounds`` rounds, K = 6, 24, 100 at W = 1, and at K = 100 also W = 2, ``engine.state: disk``
  and ``fl.clients_per_round=10``; with ``eval.local_models=false`` (``NO_CROSS_SITE``: FedAvg's test would
  otherwise score every site's local model on every site, K^2 evaluations, minutes at K = 100).

Measured in each subprocess: the wall time of every round (between ``on_round_end`` calls; round 1 from the
start of the algorithm, so it includes building the engine and the workers' first model); from the ledger,
per round the exchanges' wall time (``Ledger.round_wall_seconds``) and the sites' summed compute seconds,
whose ``/ W`` is the ideal round time; start-up = seconds from the subprocess's launch (by the parent) to
the start of the algorithm (interpreter, imports, data, worker pool); memory, sampled every 0.25 s over the
process tree (the run's process, the forkserver and the workers, from ``/proc``): the peak of the summed PSS
(proportional set size: shared pages such as the sites' data in shared memory counted once), the peak of
the summed RSS, the parent's peak RSS (``ru_maxrss``) and the largest worker's peak RSS (``VmHWM``).

Round times are reported as medians over rounds >= 2 (round 1 carries allocator and first-call warm-up) and
repeats, with min and max. The W = 1 and W = 2 runs of a configuration alternate (which goes first flips
every repeat) so that slow phases of the shared machine hit both sides. Speed-up at W = 2 = median W = 1
round / median W = 2 round.

    .venv/bin/python benchmarks/scaling.py [--repeats 2] [--retina-repeats 1] [--sites-repeats 1]
        [--groups demo retina sites] [--only NAME ...] [--merge]

Writes ``benchmarks/results/scaling.json`` and ``scaling.md``.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from fedseg.flower.deploy import descendants

HERE = Path(__file__).parent
RESULTS = HERE / "results"
MANY_SITES = "many-sites"
SAMPLE_EVERY_S = 0.25
# the K-sites group: FedAvg's test also scores every site's kept local model on every site's test split (K^2
# evaluations: at K = 100 more than 8 minutes after 3 rounds of 15 s), which is not what this group measures
NO_CROSS_SITE = "eval.local_models=false"


# --- the federation of K small sites ------------------------------------------------------------------------
def many_sites(num_sites: int, cases_per_site: int = 12, size: int = 64, seed: int = 0):
    """K sites of ``cases_per_site`` RGB ``size``x``size`` images: the tests' disc federation
    (``fedseg.data.discs``), sites ``site001``..., the brightness shifted per site in a cycle of 8."""
    from fedseg.data.discs import disc_federation

    return disc_federation(
        num_sites,
        cases_per_site,
        size,
        seed,
        name=MANY_SITES,
        site_name=lambda s: f"site{s + 1:03d}",
        brightness=lambda s: (s % 8) * 10,
    )


# --- memory of the process tree -----------------------------------------------------------------------------
def _tree(root: int) -> list[int]:
    """``root`` and all its descendants (from ``/proc/*/stat``)."""
    return [root, *descendants(root)]


def _kb(path: str, field: str) -> int:
    try:
        for line in Path(path).read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


class MemorySampler(threading.Thread):
    """Every ``SAMPLE_EVERY_S``: summed PSS and RSS of this process's tree, each process's peak RSS (VmHWM)."""

    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.stop = threading.Event()
        self.peak_pss_kb = self.peak_rss_kb = 0
        self.hwm_kb: dict[int, int] = {}
        self.max_processes = 0

    def run(self) -> None:
        me = os.getpid()
        while not self.stop.wait(SAMPLE_EVERY_S):
            pids = _tree(me)
            self.max_processes = max(self.max_processes, len(pids))
            self.peak_pss_kb = max(self.peak_pss_kb, sum(_kb(f"/proc/{p}/smaps_rollup", "Pss") for p in pids))
            self.peak_rss_kb = max(self.peak_rss_kb, sum(_kb(f"/proc/{p}/status", "VmRSS") for p in pids))
            for p in pids:
                if p != me:
                    self.hwm_kb[p] = max(self.hwm_kb.get(p, 0), _kb(f"/proc/{p}/status", "VmHWM"))


# --- one configuration, in a subprocess ---------------------------------------------------------------------
def child(spec: dict, out_json: Path) -> None:
    """Run ``spec`` (preset, overrides, optional ``sites``) once and write its measurements to ``out_json``."""
    t_imports0 = time.time()
    from fedseg.config_load import load_config
    from fedseg.data.sources import register_federation
    from fedseg.engine.ledger import Ledger
    from fedseg.run import run_experiment

    if spec.get("sites"):
        register_federation(MANY_SITES, lambda cfg: many_sites(spec["sites"]), sites=spec["sites"])
    overrides = list(spec["overrides"])
    if spec.get("sites") and not any(o.startswith("eval.local_models=") for o in overrides):
        overrides.append(NO_CROSS_SITE)
    cfg = load_config(preset=spec["preset"], overrides=overrides)
    t_imported = time.time()
    sampler = MemorySampler()
    sampler.start()
    marks: dict[str, float] = {}
    ends: list[float] = []
    replies = [0]  # ledger rows so far (one observer call per recorded reply)
    rows_at_end: list[int] = []  # rows recorded by the end of each round (later rows: test evaluation)

    def round_end(name: str, rnd: int, losses: dict) -> None:
        ends.append(time.time())
        rows_at_end.append(replies[0])

    def observe(site, action, msg, reply) -> None:
        replies[0] += 1

    with tempfile.TemporaryDirectory() as tmp:
        t_run = time.time()
        results = run_experiment(
            cfg,
            Path(tmp) / "run",
            on_algorithm_start=lambda name: marks.setdefault("algorithm_start", time.time()),
            on_round_end=round_end,
            observers=[observe],
        )
        t_done = time.time()
    sampler.stop.set()
    sampler.join()
    algo = results.algorithms[0]
    # rows recorded after the last round (test evaluation, FedSM's final gamma choice) carry round = fl.rounds:
    # keep only those recorded inside the timed rounds
    ledger = Ledger.from_dicts(algo.ledger[: rows_at_end[-1]])
    exchange_wall = ledger.round_wall_seconds()
    compute: dict[int, float] = {}
    by_exchange: dict[tuple[int, int], list[float]] = {}
    for row in ledger.rows:
        compute[row.round] = compute.get(row.round, 0.0) + row.seconds
        by_exchange.setdefault((row.round, row.exchange), []).append(row.seconds)
    workers = cfg.engine.workers
    # the best W workers can do with whole sites: per exchange max(sum / W, the slowest site), summed per round
    bound: dict[int, float] = {}
    for (rnd, _), seconds in by_exchange.items():
        bound[rnd] = bound.get(rnd, 0.0) + max(sum(seconds) / workers, max(seconds))
    starts = [marks["algorithm_start"], *ends[:-1]]
    rounds = sorted(exchange_wall)
    in_rounds: dict[int, list] = {r: [] for r in rounds}
    for row in ledger.rows:
        in_rounds[row.round].append(row)
    result = {
        "spec": spec,
        "overrides": overrides,
        "algorithm": algo.name,
        "workers": workers,
        "threads": cfg.threads,
        "sites": len(results.federation.site_names),
        "train_cases": sum(algo.summary["train_samples"].values()),
        "launched_at": spec["launched_at"],
        "startup_seconds": marks["algorithm_start"] - spec["launched_at"],
        "imports_seconds": t_imported - t_imports0,
        "run_seconds": t_done - t_run,
        "round_seconds": [b - a for a, b in zip(starts, ends)],
        "exchange_wall_seconds": [exchange_wall[r] for r in rounds],
        "compute_seconds": [compute[r] for r in rounds],
        "ideal_seconds": [compute[r] / workers for r in rounds],
        "ideal_whole_sites_seconds": [bound[r] for r in rounds],
        "site_seconds": {r: [[row.site, row.action, row.seconds] for row in in_rounds[r]] for r in rounds},
        "exchanges_per_round": [len({row.exchange for row in in_rounds[r]}) for r in rounds],
        "peak_pss_mb": sampler.peak_pss_kb / 1024,
        "peak_rss_sum_mb": sampler.peak_rss_kb / 1024,
        "parent_peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "worker_peak_rss_mb": max(sampler.hwm_kb.values(), default=0) / 1024,
        "processes": sampler.max_processes,
    }
    out_json.write_text(json.dumps(result, indent=1))


def launch(spec: dict) -> dict:
    """``spec`` in a fresh subprocess; its measurements."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "result.json"
        spec = {**spec, "launched_at": time.time()}
        proc = subprocess.run(
            [sys.executable, __file__, "--child", json.dumps(spec), str(out)], capture_output=True, text=True
        )
        if proc.returncode != 0:
            raise RuntimeError(f"{spec['name']} failed:\n{proc.stderr[-4000:]}")
        return json.loads(out.read_text())


# --- the configurations -------------------------------------------------------------------------------------
def spec(name: str, group: str, preset: str, algorithm: str, rounds: int, workers: int, extra=(), **kw) -> dict:
    threads = kw.pop("threads", 1)
    overrides = [
        f"algorithms=[{algorithm}]",
        f"fl.rounds={rounds}",
        f"threads={threads}",
        f"engine.workers={workers}",
        *extra,
    ]
    return {"name": name, "group": group, "preset": preset, "overrides": overrides, **kw}


def configurations(args) -> list[list[dict]]:
    """Blocks of configurations; the members of a block alternate order from one repeat to the next."""
    blocks = []
    if "demo" in args.groups:
        for algo in ("fedavg", "fedsm"):
            blocks.append(
                [
                    spec(f"demo/{algo}/W1", "demo", "demo", algo, args.demo_rounds, 1),
                    spec(f"demo/{algo}/W2", "demo", "demo", algo, args.demo_rounds, 2),
                    spec(f"demo/{algo}/W1-threads2", "demo", "demo", algo, args.demo_rounds, 1, threads=2),
                ]
            )
    if "retina" in args.groups:
        for algo in ("fedavg", "fedsm"):
            blocks.append(
                [spec(f"retina/{algo}/W{w}", "retina", "synthetic-retina", algo, args.retina_rounds, w) for w in (1, 2)]
            )
    if "sites" in args.groups:
        many = [f"data.source={MANY_SITES}", NO_CROSS_SITE]
        for k in args.sites:
            blocks.append([spec(f"sites/K{k}/W1", "sites", "demo", "fedavg", args.sites_rounds, 1, many, sites=k)])
        k = max(args.sites)
        blocks.append(
            [
                spec(f"sites/K{k}/W2", "sites", "demo", "fedavg", args.sites_rounds, 2, many, sites=k),
                spec(
                    f"sites/K{k}/W1-disk",
                    "sites",
                    "demo",
                    "fedavg",
                    args.sites_rounds,
                    1,
                    [*many, "engine.state=disk"],
                    sites=k,
                ),
                spec(
                    f"sites/K{k}/W1-sample10",
                    "sites",
                    "demo",
                    "fedavg",
                    args.sites_rounds,
                    1,
                    [*many, "fl.clients_per_round=10"],
                    sites=k,
                ),
            ]
        )
    return blocks


def spread(values: list[float]) -> dict:
    return (
        {"median": statistics.median(values), "min": min(values), "max": max(values), "n": len(values)}
        if values
        else {}
    )


def summarize(name: str, runs: list[dict]) -> dict:
    """Medians (min, max) of one configuration's runs; round times over rounds >= 2."""
    later = lambda key: [v for r in runs for v in r[key][1:]]  # noqa: E731
    first = runs[0]
    return {
        "name": name,
        "algorithm": first["algorithm"],
        "workers": first["workers"],
        "threads": first["threads"],
        "sites": first["sites"],
        "train_cases": first["train_cases"],
        "repeats": len(runs),
        "round_seconds": spread(later("round_seconds")),
        "round1_seconds": spread([r["round_seconds"][0] for r in runs]),
        "exchange_wall_seconds": spread(later("exchange_wall_seconds")),
        "compute_seconds": spread(later("compute_seconds")),
        "ideal_seconds": spread(later("ideal_seconds")),
        "ideal_whole_sites_seconds": spread(later("ideal_whole_sites_seconds")),
        "startup_seconds": spread([r["startup_seconds"] for r in runs]),
        "peak_pss_mb": spread([r["peak_pss_mb"] for r in runs]),
        "peak_rss_sum_mb": spread([r["peak_rss_sum_mb"] for r in runs]),
        "parent_peak_rss_mb": spread([r["parent_peak_rss_mb"] for r in runs]),
        "worker_peak_rss_mb": spread([r["worker_peak_rss_mb"] for r in runs]),
    }


def speedups(summary: dict[str, dict]) -> dict:
    """Per (group, algorithm): W = 1 round / W = 2 round (medians), and W = 2 round / ideal."""
    out = {}
    for name, s in summary.items():
        if not name.endswith("/W2"):
            continue
        base = summary.get(name[: -len("W2")] + "W1")
        if base is None or not s["round_seconds"]:
            continue
        one, two = base["round_seconds"]["median"], s["round_seconds"]["median"]
        out[name[: -len("/W2")]] = {
            "w1_round_s": one,
            "w2_round_s": two,
            "speedup_w2": one / two,
            "w2_over_ideal_same_run": two / s["ideal_seconds"]["median"],  # ideal: that run's compute / 2
            "w2_over_ideal_from_w1": two / (one / 2),  # ideal: the W = 1 round / 2
            "w2_exchange_over_ideal": s["exchange_wall_seconds"]["median"] / s["ideal_seconds"]["median"],
            "w2_over_ideal_whole_sites": two / s["ideal_whole_sites_seconds"]["median"],
            "w2_compute_over_w1_compute": s["compute_seconds"]["median"] / base["compute_seconds"]["median"],
        }
        t2 = summary.get(name[: -len("W2")] + "W1-threads2")
        if t2:
            out[name[: -len("/W2")]]["w1_threads2_round_s"] = t2["round_seconds"]["median"]
    return out


def markdown(report: dict) -> str:
    lines = [
        "# Scaling (benchmarks/scaling.py)",
        "",
        f"Machine: {report['cpus']} CPU cores (shared, noisy), CPU only; `threads=1` per process unless named. "
        "Round times: median (min–max) over rounds ≥ 2 and repeats; ideal = the run's summed per-site compute "
        "seconds (ledger) / W. Memory: peak summed PSS of the process tree.",
        "",
        f"Command: `{report['command']}`",
        "",
        "| configuration | sites | train cases | round s | ideal s | compute s | start-up s | peak PSS MB "
        "| parent RSS MB | worker RSS MB |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for s in report["summary"].values():

        def f(key: str, digits: int = 1, s=s) -> str:
            v = s[key]
            return f"{v['median']:.{digits}f} ({v['min']:.{digits}f}–{v['max']:.{digits}f})" if v else "–"

        lines.append(
            f"| {s['name']} | {s['sites']} | {s['train_cases']} | {f('round_seconds', 2)} | {f('ideal_seconds', 2)} "
            f"| {f('compute_seconds', 2)} | {f('startup_seconds')} | {f('peak_pss_mb', 0)} "
            f"| {f('parent_peak_rss_mb', 0)} | {f('worker_peak_rss_mb', 0)} |"
        )
    lines += [
        "",
        "Ideal (whole sites): per exchange max(compute / W, the slowest site), since a site is never split.",
        "",
        "| configuration | W=1 round s | W=2 round s | speed-up | W=2 / ideal (same run) | W=2 / ideal (whole sites) "
        "| W=2 / (W=1 / 2) |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, s in report["speedups"].items():
        lines.append(
            f"| {name} | {s['w1_round_s']:.2f} | {s['w2_round_s']:.2f} | {s['speedup_w2']:.2f} "
            f"| {s['w2_over_ideal_same_run']:.2f} | {s['w2_over_ideal_whole_sites']:.2f} "
            f"| {s['w2_over_ideal_from_w1']:.2f} |"
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--child", nargs=2, metavar=("SPEC", "OUT"), help=argparse.SUPPRESS)
    ap.add_argument("--groups", nargs="+", default=["demo", "retina", "sites"], choices=["demo", "retina", "sites"])
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--retina-repeats", type=int, default=1, help="repeats of the full-scale retina group")
    ap.add_argument("--sites-repeats", type=int, default=1, help="repeats of the K-sites group")
    ap.add_argument("--demo-rounds", type=int, default=3)
    ap.add_argument("--retina-rounds", type=int, default=2)
    ap.add_argument("--sites-rounds", type=int, default=3)
    ap.add_argument("--sites", type=int, nargs="+", default=[6, 24, 100])
    ap.add_argument("--out", default=str(RESULTS / "scaling.json"))
    ap.add_argument("--only", nargs="+", help="run only these configurations (names as in the JSON)")
    ap.add_argument("--merge", action="store_true", help="keep the other configurations' runs from --out")
    args = ap.parse_args()
    if args.child:
        child(json.loads(args.child[0]), Path(args.child[1]))
        return
    runs: dict[str, list[dict]] = {}
    out = Path(args.out)
    if args.merge and out.exists():  # keep the other configurations' runs; those run now replace theirs
        runs = json.loads(out.read_text())["runs"]
    blocks = [[s for s in block if not args.only or s["name"] in args.only] for block in configurations(args)]
    for block in filter(None, blocks):
        for s in block:
            runs.pop(s["name"], None)
        group = block[0]["group"]
        repeats = {"sites": args.sites_repeats, "retina": args.retina_repeats}.get(group, args.repeats)
        for i in range(repeats):
            order = block if i % 2 == 0 else block[::-1]  # alternate which side goes first
            for s in order:
                r = launch(s)
                runs.setdefault(s["name"], []).append(r)
                print(
                    f"{s['name']} #{i + 1}: rounds {[round(x, 2) for x in r['round_seconds']]} s, ideal "
                    f"{[round(x, 2) for x in r['ideal_seconds']]} s, start-up {r['startup_seconds']:.1f} s, "
                    f"peak PSS {r['peak_pss_mb']:.0f} MB",
                    flush=True,
                )
    summary = {name: summarize(name, rs) for name, rs in runs.items()}
    command = ("python benchmarks/scaling.py " + " ".join(sys.argv[1:])).strip()
    previous = json.loads(out.read_text()) if args.merge and out.exists() else {}
    commands = previous.get("commands", [previous["command"]] if "command" in previous else [])
    report = {
        "command": " ; ".join([*commands, command]),
        "commands": [*commands, command],
        "cpus": os.cpu_count(),
        "summary": summary,
        "speedups": speedups(summary),
        "runs": runs,
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=1))
    out.with_suffix(".md").write_text(markdown(report))
    print(markdown(report))


if __name__ == "__main__":
    main()
