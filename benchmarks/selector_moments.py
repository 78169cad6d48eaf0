"""FedSM selector accuracy: averaging its Adam moments or not, BatchNorm or InstanceNorm.

Every site trains the selector on its own label only (Eq. 2). This runs the real ``fedsm``
algorithm for each variant with everything else equal and reports the selector accuracy on the
validation splits per round (``round_metrics.csv`` ``selector_acc``: fraction of a site's
validation images whose selector argmax is that site; mean over sites), the first round it
reaches 0.9 and the training floats per site and round (the moments are real traffic).

Variants: ``methods.fedsm.selector_norm`` (instance | batch) x
``methods.fedsm.average_selector_moments`` (true | false), plus ``reset``: moments neither
kept nor sent (``train.keep_optimizer_state=false``).

The segmentation network is shrunk to a 3-level UNet (4, 8, 16 channels) because only the
selector is measured: its training does not depend on the segmentation models.

    .venv/bin/python benchmarks/selector_moments.py [--scale 0.25] [--rounds 40] [--seeds 0]

Writes benchmarks/results/selector_moments.json.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import numpy as np

from fedseg.config_load import load_config
from fedseg.run import run_experiment

RESULTS = Path(__file__).parent / "results"
VARIANTS = {
    "instance+avg": ["methods.fedsm.selector_norm=instance", "methods.fedsm.average_selector_moments=true"],
    "instance+local": ["methods.fedsm.selector_norm=instance", "methods.fedsm.average_selector_moments=false"],
    "batch+avg": ["methods.fedsm.selector_norm=batch", "methods.fedsm.average_selector_moments=true"],
    "batch+local": ["methods.fedsm.selector_norm=batch", "methods.fedsm.average_selector_moments=false"],
    "instance+reset": [
        "methods.fedsm.selector_norm=instance",
        "methods.fedsm.average_selector_moments=false",
        "train.keep_optimizer_state=false",
    ],
}


def one_run(args, seed: int, variant: str) -> dict:
    overrides = [
        f"data.scale={args.scale}",
        f"fl.rounds={args.rounds}",
        f"seed={seed}",
        f"threads={args.threads}",
        "algorithms=[fedsm]",
        "eval.hd95=false",
        "model.channels=[4,8,16]",
        *VARIANTS[variant],
    ]
    cfg = load_config(preset=args.preset, overrides=overrides)
    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as out:
        res = run_experiment(cfg, Path(out)).algorithms[0]
    acc = []
    for rnd in range(1, args.rounds + 1):
        vals = [r["value"] for r in res.metric_rows if r["round"] == rnd and r["metric"] == "selector_acc"]
        acc.append(round(float(np.mean(vals)), 4))
    first = [r["floats_down"] for r in res.ledger if r["action"] == "train" and r["round"] == 1]
    reach = next((i + 1 for i, a in enumerate(acc) if a >= 0.9), None)
    return {
        "seed": seed,
        "variant": variant,
        "selector_acc_by_round": acc,
        "final": acc[-1],
        "first_round_ge_0.9": reach,
        "floats_down_per_site_round1": first,
        "seconds": round(time.perf_counter() - start, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="synthetic-retina")
    parser.add_argument("--scale", type=float, default=0.25)
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0])
    parser.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS))
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    runs = []
    for seed in args.seeds:
        for variant in args.variants:
            run = one_run(args, seed, variant)
            runs.append(run)
            print(
                f"seed {seed} {variant:<15} final {run['final']:.3f}, >=0.9 at round {run['first_round_ge_0.9']}, "
                f"by round {run['selector_acc_by_round']} ({run['seconds']:.0f} s)",
                flush=True,
            )
    summary = {
        v: {
            "final_mean": float(np.mean([r["final"] for r in runs if r["variant"] == v])),
            "first_round_ge_0.9": [r["first_round_ge_0.9"] for r in runs if r["variant"] == v],
        }
        for v in args.variants
    }
    RESULTS.mkdir(parents=True, exist_ok=True)
    out = {
        "preset": args.preset,
        "scale": args.scale,
        "rounds": args.rounds,
        "seeds": args.seeds,
        "summary": summary,
        "runs": runs,
    }
    (RESULTS / "selector_moments.json").write_text(json.dumps(out, indent=2))
    print(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
