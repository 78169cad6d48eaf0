"""Engine overhead: N FedAvg rounds through fedseg vs the same work in a plain PyTorch loop.

Both sides use the same model, data, splits, batch order (the same per-(seed, site, round)
streams), optimizer (Adam, moments kept per site), loss, FedAvg merge and per-round
validation (Dice/HD95 per case). The plain loop keeps one model object and per-site
optimizer states in dicts: what a researcher would write by hand. Target: ratio <= 1.05.

    .venv/bin/python benchmarks/overhead.py [--rounds 3] [--scale 0.25] [--repeats 2]

Writes benchmarks/results/overhead.json.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import torch

from fedseg.algorithms.aggregate import weighted_average
from fedseg.config import load_config
from fedseg.engine.context import seeded_generator, stream_seed
from fedseg.engine.messages import load_weights, weights_of
from fedseg.evaluate.inference import score_caseset
from fedseg.run import prepare, run_algorithm
from fedseg.train import Trainer

RESULTS = Path(__file__).parent / "results"


def plain_fedavg(prep, rounds: int) -> float:
    """FedAvg written by hand over the same prepared data; returns wall seconds."""
    cfg, task = prep.task.cfg, prep.task
    start = time.perf_counter()
    model = task.new_model()
    global_w = weights_of(model)
    trainer = Trainer(cfg.train, task.device)
    opt_states = {}
    for rnd in range(1, rounds + 1):
        local, sizes = [], []
        for site in prep.site_data:
            load_weights(model, global_w)
            opt = trainer.new_optimizer(model)
            if site.name in opt_states:
                opt.load_state_dict(opt_states[site.name])
            gen = seeded_generator(stream_seed(cfg.seed, site.index, rnd, "train"))
            trainer.fit(model, site.train, gen, opt)
            opt_states[site.name] = opt.state_dict()
            local.append(weights_of(model))
            sizes.append(len(site.train))
        global_w = weighted_average(local, sizes)
        load_weights(model, global_w)
        for site in prep.site_data:
            score_caseset(model, site.val, cfg.eval.batch_size, cfg.eval.threshold, cfg.eval.hd95, task.device)
    return time.perf_counter() - start


def engine_fedavg(prep, rounds: int) -> float:
    """The same rounds through fedseg's engine (with checkpoints); test evaluation excluded."""
    with tempfile.TemporaryDirectory() as out:
        start = time.perf_counter()
        times = {}
        run_algorithm(
            "fedavg",
            prep,
            Path(out),
            resume=False,
            on_round_end=lambda n, r, log: times.setdefault("end", time.perf_counter()) if r == rounds else None,
        )
        return times["end"] - start


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--scale", type=float, default=0.25)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    cfg = load_config(
        preset="demo", overrides=[f"fl.rounds={args.rounds}", f"data.scale={args.scale}", f"threads={args.threads}"]
    )
    torch.set_num_threads(cfg.threads)
    prep = prepare(cfg)
    plain_fedavg(prep, 1)  # warm-up (allocator, MONAI imports)
    plain, engine = [], []
    for _ in range(args.repeats):  # interleaved, best of each: the machine is shared and noisy
        plain.append(plain_fedavg(prep, args.rounds))
        engine.append(engine_fedavg(prep, args.rounds))
    result = {
        "rounds": args.rounds,
        "scale": args.scale,
        "threads": args.threads,
        "sites": len(prep.site_data),
        "train_cases": sum(len(s.train) for s in prep.site_data),
        "plain_seconds": plain,
        "engine_seconds": engine,
        "ratio_best": min(engine) / min(plain),
        "ratio_mean": (sum(engine) / len(engine)) / (sum(plain) / len(plain)),
        "target": 1.05,
    }
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "overhead.json").write_text(json.dumps(result, indent=2))
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
