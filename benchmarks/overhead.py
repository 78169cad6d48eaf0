"""Engine overhead: FedAvg rounds through fedseg vs the same rounds in a plain PyTorch loop, paired per round.

Both sides use the same model, data, splits, batch order (the same per-(seed, site, round) streams),
optimizer (Adam, moments kept per site), loss, FedAvg merge and per-round validation (Dice per case: the
engine's validation exchanges score Dice only). The plain loop keeps one model object and per-site optimizer
states in dicts: what a researcher would write by hand. Target: ratio <= 1.05.

The same work on both sides, so the ratio is the engine's overhead:

* The engine runs with ``eval.local_models=false``. Its default (on) scores every site's freshly trained local
  model on that site's validation split in every validated round (Auto-FedAvg's local models, one extra
  validation pass per site and round, Dice only), which the plain loop does not do.
* The engine writes a checkpoint every round (server state, every site's optimizer moments, ledger: about
  35 MB on ``demo``, atomic, fsynced). The plain loop writes the same state the same way
  (``save_checkpoint``: its global weights and per-site optimizer states), timed apart (``plain_write_s``).
  Reported: ``ratio`` against the plain loop with its checkpoint (the same work) and
  ``ratio_without_plain_checkpoint`` against the plain loop without it (the engine's checkpoint billed to it
  alone, as this benchmark reported before).

How it is robust to a busy machine: the engine runs ``--rounds`` rounds (``run_algorithm`` on the in-process
simulator, checkpoints included) and, from its ``on_round_end`` callback, the plain loop runs its rounds in
between, so the two sides alternate round by round: E1 P1 | P2 E2 | E3 P3 | P4 E4 ... (the side that goes
first flips every pair). Each pair (engine round r, plain round r: same round, same streams) gives one ratio
E_r / P_r; a slow phase of the machine hits both members of a pair, and the median over many pairs ignores
the pairs it hit unevenly. Round 1 of each repeat is left out (allocator and first-call warm-up). An engine
round is timed from the end of the previous plain work to its ``on_round_end`` plus the wait for its
background checkpoint write to finish (so the write is billed to the engine, never to the plain round that
would otherwise run beside it). Reported: median of the paired ratios, its interquartile range and min/max,
and the ratio of the summed times.

``--profile``: additionally profiles (cProfile, in this process) the engine's rounds 2..``--profile-rounds`` + 1
(between its round-end callbacks, so neither start-up nor the final test) and the plain loop's same rounds, and
writes the top entries by cumulative and by own time to ``overhead_profile.txt``.

    .venv/bin/python benchmarks/overhead.py [--rounds 15] [--repeats 2] [--scale 0.25] [--threads 1] [--profile]

Writes benchmarks/results/overhead.json (and overhead_profile.txt).
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import pstats
import statistics
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import torch

import fedseg.run.loop
from fedseg.algorithms.aggregate import weighted_average
from fedseg.config_load import load_config
from fedseg.engine.checkpoint import CheckpointWriter, save_checkpoint
from fedseg.engine.context import seeded_generator, stream_seed
from fedseg.engine.messages import load_weights, weights_of
from fedseg.evaluate.inference import score_caseset
from fedseg.run import prepare, run_algorithm
from fedseg.train import Trainer

RESULTS = Path(__file__).parent / "results"


class PlainFedAvg:
    """FedAvg written by hand over the same prepared data, one round per call; with ``checkpoint`` (a file) it
    saves its state there after each round, as the engine does."""

    def __init__(self, prep, checkpoint: Path | None = None):
        self.prep, self.cfg, self.task = prep, prep.task.cfg, prep.task
        self.model = self.task.new_model()
        self.global_w = weights_of(self.model)
        self.trainer = Trainer(self.cfg.train, self.task.device)
        self.opt_states: dict[str, dict] = {}
        self.checkpoint = checkpoint
        self.write_s = 0.0  # seconds the last round's checkpoint write took (part of what ``round`` returns)

    def round(self, rnd: int) -> float:
        """Train every site, merge, validate every site, save the checkpoint; returns wall seconds."""
        seconds = self.compute(rnd)
        start = time.perf_counter()
        if self.checkpoint is not None:
            save_checkpoint(self.checkpoint, {"round": rnd, "global": self.global_w, "opt": self.opt_states})
        self.write_s = time.perf_counter() - start
        return seconds + self.write_s

    def compute(self, rnd: int) -> float:
        """Train every site, merge, validate every site; returns wall seconds."""
        start = time.perf_counter()
        cfg, model = self.cfg, self.model
        local, sizes = [], []
        for site in self.prep.site_data:
            load_weights(model, self.global_w)
            opt = self.trainer.new_optimizer(model)
            if site.name in self.opt_states:
                opt.load_state_dict(self.opt_states[site.name])
            gen = seeded_generator(stream_seed(cfg.seed, site.index, rnd, "train"))
            self.trainer.fit(model, site.train, gen, opt)
            self.opt_states[site.name] = opt.state_dict()
            local.append(weights_of(model))
            sizes.append(len(site.train))
        self.global_w = weighted_average(local, sizes)
        load_weights(model, self.global_w)
        for site in self.prep.site_data:
            ev, task = cfg.eval, self.task  # scored as the engine scores (eval.score_on)
            score_caseset(model, site.val, ev.batch_size, ev.threshold, False, task.device, regions=task.scored_regions)
        return time.perf_counter() - start


class RecordingWriter(CheckpointWriter):
    """The engine's checkpoint writer, remembered so the benchmark can wait for its background writes."""

    last: RecordingWriter | None = None

    def __init__(self) -> None:
        super().__init__()
        RecordingWriter.last = self


def paired_rounds(prep, rounds: int, make_plain, algorithm: str = "fedavg") -> list[dict]:
    """One engine run of ``rounds`` rounds of ``algorithm`` with the rounds of a plain loop (``make_plain(prep, dir)``,
    with ``round(rnd) -> seconds`` and ``write_s``, its checkpoint's share; ``dir``: a folder for its files)
    interleaved (module docstring); ``{round, engine_s, plain_s, plain_write_s, first}`` per round."""
    with tempfile.TemporaryDirectory() as folder:
        return _paired_rounds(prep, rounds, make_plain(prep, Path(folder)), algorithm)


def _paired_rounds(prep, rounds: int, plain, algorithm: str) -> list[dict]:
    plain_s: dict[int, float] = {}
    write_s: dict[int, float] = {}
    engine_s: dict[int, float] = {}
    first: dict[int, str] = {}
    mark = [time.perf_counter()]

    def on_round_end(name: str, rnd: int, losses: dict) -> None:
        assert RecordingWriter.last is not None
        RecordingWriter.last.wait()  # its checkpoint write is on disk: billed to the engine
        engine_s[rnd] = time.perf_counter() - mark[0]
        if rnd % 2 == 1:  # E_r P_r, then P_{r+1} before E_{r+1}
            first[rnd] = "engine"
            plain_s[rnd], write_s[rnd] = plain.round(rnd), plain.write_s
            if rnd + 1 <= rounds:
                first[rnd + 1] = "plain"
                plain_s[rnd + 1], write_s[rnd + 1] = plain.round(rnd + 1), plain.write_s
        mark[0] = time.perf_counter()

    original = fedseg.run.loop.CheckpointWriter
    fedseg.run.loop.CheckpointWriter = RecordingWriter
    try:
        with tempfile.TemporaryDirectory() as out:
            mark[0] = time.perf_counter()
            run_algorithm(algorithm, prep, Path(out), resume=False, on_round_end=on_round_end)
    finally:
        fedseg.run.loop.CheckpointWriter = original
    return [
        {"round": r, "engine_s": engine_s[r], "plain_s": plain_s[r], "plain_write_s": write_s[r], "first": first[r]}
        for r in sorted(engine_s)
    ]


def without_plain_checkpoint(pairs: list[dict]) -> list[dict]:
    """``pairs`` with the plain loop's checkpoint write taken out of ``plain_s``."""
    return [{**p, "plain_s": p["plain_s"] - p.get("plain_write_s", 0.0)} for p in pairs]


def ratio_stats(pairs: list[dict]) -> dict:
    """Median, quartiles and min/max of ``engine_s / plain_s`` over ``pairs``, and the ratio of the sums."""
    ratios = sorted(p["engine_s"] / p["plain_s"] for p in pairs)
    q = statistics.quantiles(ratios, n=4) if len(ratios) >= 2 else [ratios[0]] * 3
    return {
        "pairs": len(ratios),
        "median": statistics.median(ratios),
        "q1": q[0],
        "q3": q[2],
        "iqr": q[2] - q[0],
        "min": ratios[0],
        "max": ratios[-1],
        "ratio_of_sums": sum(p["engine_s"] for p in pairs) / sum(p["plain_s"] for p in pairs),
        "median_engine_s": statistics.median(p["engine_s"] for p in pairs),
        "median_plain_s": statistics.median(p["plain_s"] for p in pairs),
    }


def profile(prep, rounds: int, top: int = 45) -> str:
    """cProfile of the engine's and the plain loop's rounds 2..rounds + 1 (module docstring), with both sides'
    seconds; the engine's background checkpoint write is on another thread (not in its profile, waited for
    before the window closes)."""
    engine, mark = cProfile.Profile(), {}

    def on_round_end(name: str, rnd: int, losses: dict) -> None:
        if rnd == 1:
            mark["start"] = time.perf_counter()
            engine.enable()
        elif rnd == rounds + 1:
            assert RecordingWriter.last is not None
            RecordingWriter.last.wait()
            engine.disable()
            mark["seconds"] = time.perf_counter() - mark["start"]

    cfg = prep.task.cfg.model_copy(update={"fl": prep.task.cfg.fl.model_copy(update={"rounds": rounds + 2})})
    prep = replace(prep, task=replace(prep.task, cfg=cfg))
    original, fedseg.run.loop.CheckpointWriter = fedseg.run.loop.CheckpointWriter, RecordingWriter
    try:
        with tempfile.TemporaryDirectory() as out:
            run_algorithm("fedavg", prep, Path(out), resume=False, on_round_end=on_round_end)
            plain, loop = PlainFedAvg(prep, Path(out) / "plain.pt"), cProfile.Profile()
            plain.round(1)
            start = time.perf_counter()
            loop.enable()
            for rnd in range(2, rounds + 2):
                plain.round(rnd)
            loop.disable()
            plain_seconds = time.perf_counter() - start
    finally:
        fedseg.run.loop.CheckpointWriter = original
    text = io.StringIO()
    for side, prof, seconds in (("engine", engine, mark["seconds"]), ("plain", loop, plain_seconds)):
        for order, only in (("cumulative", "fedseg/|overhead.py"), ("cumulative", ""), ("tottime", "")):
            what = f"sorted by {order}" + (f", only {only}" if only else "")
            text.write(f"=== {side}, rounds 2..{rounds + 1}: {seconds:.2f} s wall, {what} ===\n")
            pstats.Stats(prof, stream=text).sort_stats(order).print_stats(only, top)
    return text.getvalue()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=15, help="rounds per repeat (round 1 is left out)")
    ap.add_argument("--repeats", type=int, default=2, help="engine runs, each with its own interleaved plain loop")
    ap.add_argument("--scale", type=float, default=0.25)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--profile", action="store_true")
    ap.add_argument("--profile-rounds", type=int, default=4)
    args = ap.parse_args()
    overrides = [f"fl.rounds={args.rounds}", f"data.scale={args.scale}", f"threads={args.threads}"]
    cfg = load_config(preset="demo", overrides=[*overrides, "eval.local_models=false"])  # module docstring
    torch.set_num_threads(cfg.threads)
    prep = prepare(cfg)
    PlainFedAvg(prep).round(1)  # warm-up (allocator, MONAI imports)
    pairs = []
    for i in range(args.repeats):
        for p in paired_rounds(prep, args.rounds, lambda prep, folder: PlainFedAvg(prep, folder / "plain.pt")):
            if p["round"] > 1:
                pairs.append({"repeat": i + 1, **p})
        print(f"repeat {i + 1}: {json.dumps(ratio_stats(pairs))}", flush=True)
    result = {
        "command": f"python benchmarks/overhead.py --rounds {args.rounds} --repeats {args.repeats} "
        f"--scale {args.scale} --threads {args.threads}" + (" --profile" if args.profile else ""),
        "engine_overrides": ["eval.local_models=false"],
        "rounds": args.rounds,
        "repeats": args.repeats,
        "scale": args.scale,
        "threads": args.threads,
        "sites": len(prep.site_data),
        "train_cases": sum(len(s.train) for s in prep.site_data),
        "ratio": ratio_stats(pairs),
        "ratio_without_plain_checkpoint": ratio_stats(without_plain_checkpoint(pairs)),
        "median_plain_write_s": statistics.median(p["plain_write_s"] for p in pairs),
        "ratio_engine_first": ratio_stats([p for p in pairs if p["first"] == "engine"]),
        "ratio_plain_first": ratio_stats([p for p in pairs if p["first"] == "plain"]),
        "target": 1.05,
        "pairs": pairs,
    }
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "overhead.json").write_text(json.dumps(result, indent=2))
    print(json.dumps({k: v for k, v in result.items() if k != "pairs"}, indent=2))
    if args.profile:
        (RESULTS / "overhead_profile.txt").write_text(profile(prep, args.profile_rounds))


if __name__ == "__main__":
    main()
