"""Why FedSM's selector collapsed on synthetic-prostate, and the fix (issue 15).

Two measurements on the benchmark budget's data (seed 0; synthetic-prostate at scale 0.1, synthetic-retina at 0.25;
64x64):

1. **Are the sites distinguishable?** The selector network (VGG-11 x 0.25, instance norm) trained *centrally* on the
   pooled training images with their site labels (Adam 1e-3, batch 4, ``--epochs`` epochs); validation accuracy,
   mean over sites (chance = 1/K).
2. **Federated selector, the paper's merge vs fedseg's default.** FedSM for ``--rounds`` rounds with
   ``selector_weighting: samples`` + ``selector_steps: null`` (Alg. 1: each site trains its selector for its local
   budget, steps ~ n_k, and the server merges by n_k/n) and with the default (uniform merge, 10 selector steps per
   site): ``selector_acc`` per round (validation images classified as their own site, mean over sites) and
   ``global_frac`` (images the threshold gamma routes to the global model).

    .venv/bin/python benchmarks/selector_balance.py [--rounds 10] [--epochs 20]

Writes benchmarks/results/selector_balance.json.
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict
from pathlib import Path

import numpy as np
import torch
from torch import nn

from fedseg.algorithms.fedsm.selector import build_selector
from fedseg.config_load import load_config
from fedseg.run import prepare, run_experiment

RESULTS = Path(__file__).parent / "results"
SCALE = {"synthetic-prostate": "0.1", "synthetic-retina": "0.25"}
VARIANTS = {"paper": ["methods.fedsm.selector_weighting=samples", "methods.fedsm.selector_steps=null"], "default": []}


def overrides(federation: str) -> list[str]:
    return [f"data.scale={SCALE[federation]}", "data.image_size=64", "train.batch_size=4", "threads=1", "seed=0"]


def centralized_accuracy(federation: str, epochs: int) -> list[float]:
    """Validation accuracy (mean over sites) per epoch of the selector trained on the pooled site-labelled images."""
    prep = prepare(load_config(preset=federation, overrides=overrides(federation)))
    sites = prep.site_data
    x = torch.cat([s.train.x for s in sites])
    y = torch.cat([torch.full((len(s.train),), k) for k, s in enumerate(sites)])
    xv = torch.cat([s.val.x for s in sites])
    yv = torch.cat([torch.full((len(s.val),), k) for k, s in enumerate(sites)])
    torch.manual_seed(0)
    net = build_selector(x.shape[1], len(sites), 0.25, "instance", None, 2, seed=0)
    opt = torch.optim.Adam(net.parameters(), lr=1e-3)
    order = torch.Generator().manual_seed(0)
    loss_fn, curve = nn.CrossEntropyLoss(), []
    for _ in range(epochs):
        net.train()
        for idx in torch.randperm(len(x), generator=order).split(4):
            opt.zero_grad()
            loss_fn(net(x[idx]), y[idx]).backward()
            opt.step()
        net.eval()
        with torch.no_grad():
            pred = torch.cat([net(b).argmax(1) for b in xv.split(64)])
        curve.append(float(np.mean([(pred[yv == k] == k).float().mean() for k in range(len(sites))])))
    return curve


def federated(federation: str, variant: list[str], rounds: int, out: Path) -> dict:
    cfg = load_config(
        preset=federation,
        overrides=[*overrides(federation), "algorithms=[fedsm]", f"fl.rounds={rounds}", "eval.local_models=false"]
        + variant,
    )
    result = run_experiment(cfg, out).algorithms[0]
    per: dict[str, dict[int, list[float]]] = {"selector_acc": defaultdict(list), "global_frac": defaultdict(list)}
    for r in result.metric_rows:
        if r["metric"] in per:
            per[r["metric"]][int(r["round"])].append(float(r["value"]))
    return {
        **{m: [float(np.mean(v[k])) for k in sorted(v)] for m, v in per.items()},
        "test_dice": result.summary["dice"]["client_avg"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--epochs", type=int, default=20)
    args = parser.parse_args()
    torch.set_num_threads(1)
    import tempfile

    out: dict = {"rounds": args.rounds, "epochs": args.epochs, "federations": {}}
    with tempfile.TemporaryDirectory() as tmp:
        for fed in SCALE:
            entry = {"centralized_val_accuracy": centralized_accuracy(fed, args.epochs)}
            for name, variant in VARIANTS.items():
                entry[name] = federated(fed, variant, args.rounds, Path(tmp) / f"{fed}-{name}")
                print(fed, name, json.dumps(entry[name]), flush=True)
            print(fed, "centralized", [round(a, 3) for a in entry["centralized_val_accuracy"]], flush=True)
            out["federations"][fed] = entry
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "selector_balance.json").write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
