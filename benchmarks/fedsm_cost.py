"""FedSM round cost against the raw compute of its three models, paired per round (target <= 1.1x).

The engine side is a ``fedsm`` run (``run_algorithm`` on the in-process simulator: SoftPull, selector moments
averaged, per-round validation with the gamma search, checkpoints). The raw side (:class:`RawFedSM`) does the
same compute by hand, per round: at every site one local budget for each of the three models (global U-Net,
the site's personalized U-Net, the selector with cross-entropy against the site's label: ``selector_steps`` steps
when set, as the FedSM client), each with its own Adam state kept per site; the merges (weighted averages of the
global model and the selector, the selector's by ``selector_weighting``, SoftPull of the personalized models);
and the validation passes (the selector's softmax, the global model and the site's personalized model scored on
the site's validation split, Dice and HD95 per case). What it leaves out is what
FedSM adds around that compute: messages, the super model sent to every site for validation, routing, the
gamma search, ledger and checkpoints.

The two sides alternate round by round exactly as in ``benchmarks/overhead.py`` (E1 R1 | R2 E2 | E3 R3 ...,
the engine's background checkpoint write billed to the engine); each pair gives one ratio E_r / R_r; round 1
is left out. Reported: the median of the ratios, IQR, min/max and the ratio of the sums.

``--profile``: additionally profiles an engine-only FedSM run of ``--profile-rounds`` rounds (cProfile, in
this process) and writes the top entries by cumulative and by own time to ``fedsm_cost_profile.txt``.

    .venv/bin/python benchmarks/fedsm_cost.py [--rounds 12] [--scale 0.25] [--threads 1] [--profile]

Writes benchmarks/results/fedsm_cost.json (and fedsm_cost_profile.txt).
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import pstats
import tempfile
import time
from pathlib import Path

import torch
from torch import nn

from common import RESULTS
from fedseg.algorithms import get_algorithm
from fedseg.algorithms.aggregate import softpull, weighted_average
from fedseg.algorithms.fedsm.method import new_selector
from fedseg.algorithms.fedsm.model import LabeledImages
from fedseg.config import BudgetConfig
from fedseg.config_load import load_config
from fedseg.engine.context import seeded_generator, stream_seed
from fedseg.engine.messages import load_weights, weights_of
from fedseg.evaluate.inference import score_caseset
from fedseg.run import prepare, run_algorithm
from fedseg.train import Trainer
from overhead import paired_rounds, ratio_stats


class RawFedSM:
    """FedSM's three models trained, merged and validated by hand (module docstring), one round per call."""

    def __init__(self, prep):
        self.prep, self.cfg, self.task = prep, prep.task.cfg, prep.task
        self.options = get_algorithm("fedsm").parse_options(self.cfg.methods.get("fedsm"))
        sites = prep.site_data
        self.segmenter = self.task.new_model()
        self.selector = new_selector(self.task, self.options, len(sites))
        self.global_w = weights_of(self.segmenter)
        self.personal = {s.name: {k: v.clone() for k, v in self.global_w.items()} for s in sites}
        self.selector_w = weights_of(self.selector)
        self.seg_trainer = Trainer(self.cfg.train, self.task.device)
        lr = self.options.selector_lr or self.cfg.train.lr
        self.sel_trainer = Trainer(self.cfg.train.model_copy(update={"lr": lr}), self.task.device)
        self.opt_states: dict[tuple[str, str], dict] = {}
        self.write_s = 0.0  # no checkpoint: raw compute only (module docstring)

    def fit(self, key: tuple[str, str], model, weights, trainer, data, gen, loss_fn=None, budget=None) -> dict:
        load_weights(model, weights)
        opt = trainer.new_optimizer(model)
        if key in self.opt_states:
            opt.load_state_dict(self.opt_states[key])
        trainer.fit(model, data, gen, opt, budget=budget, loss_fn=loss_fn)
        self.opt_states[key] = opt.state_dict()
        return weights_of(model)

    def round(self, rnd: int) -> float:
        """Train the three models at every site, merge, validate; returns wall seconds."""
        start = time.perf_counter()
        cfg, ev, device = self.cfg, self.cfg.eval, self.task.device
        glob, pers, sel, sizes = [], {}, [], []
        for label, site in enumerate(self.prep.site_data):
            gen = seeded_generator(stream_seed(cfg.seed, site.index, rnd, "train"))
            glob.append(self.fit((site.name, "g"), self.segmenter, self.global_w, self.seg_trainer, site.train, gen))
            pers[site.name] = self.fit(
                (site.name, "p"), self.segmenter, self.personal[site.name], self.seg_trainer, site.train, gen
            )
            labels = torch.full((len(site.train),), label, dtype=torch.long)
            data = LabeledImages(site.train.name, site.train.x, labels)
            ce, steps = nn.CrossEntropyLoss(), getattr(self.options, "selector_steps", None)
            budget = None if steps is None else BudgetConfig(unit="steps", amount=steps)  # as the FedSM client
            sel.append(
                self.fit((site.name, "s"), self.selector, self.selector_w, self.sel_trainer, data, gen, ce, budget)
            )
            sizes.append(len(site.train))
        self.global_w = weighted_average(glob, sizes)
        uniform = getattr(self.options, "selector_weighting", "samples") == "uniform"  # as the FedSM server
        self.selector_w = weighted_average(sel, [1.0] * len(sel) if uniform else sizes)
        self.personal = softpull(pers, self.options.lam)
        load_weights(self.selector, self.selector_w)
        self.selector.eval()
        for site in self.prep.site_data:
            with torch.no_grad():
                batches = site.val.x.split(ev.batch_size)
                torch.cat([torch.softmax(self.selector(xb.to(device)), 1).cpu() for xb in batches])
            for weights in (self.global_w, self.personal[site.name]):  # Dice only, as the engine's validation
                load_weights(self.segmenter, weights)
                regions = self.task.scored_regions  # scored as the engine scores (eval.score_on)
                score_caseset(self.segmenter, site.val, ev.batch_size, ev.threshold, False, device, regions=regions)
        return time.perf_counter() - start


def profile(prep, rounds: int, top: int = 40) -> str:
    """cProfile of an engine-only FedSM run of ``rounds`` rounds: top entries by cumulative and by own time."""
    from dataclasses import replace

    cfg = prep.task.cfg.model_copy(update={"fl": prep.task.cfg.fl.model_copy(update={"rounds": rounds})})
    prep = replace(prep, task=replace(prep.task, cfg=cfg))
    prof = cProfile.Profile()
    with tempfile.TemporaryDirectory() as out:
        prof.enable()
        run_algorithm("fedsm", prep, Path(out), resume=False)
        prof.disable()
    text = io.StringIO()
    for order in ("cumulative", "tottime"):
        text.write(f"=== fedsm, {rounds} rounds (test evaluation included), sorted by {order} ===\n")
        pstats.Stats(prof, stream=text).sort_stats(order).print_stats(top)
    return text.getvalue()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=12, help="rounds per repeat (round 1 is left out)")
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--preset", default="synthetic-retina")
    ap.add_argument("--scale", type=float, default=0.25)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--profile", action="store_true")
    ap.add_argument("--profile-rounds", type=int, default=3)
    args = ap.parse_args()
    cfg = load_config(
        preset=args.preset,
        overrides=[
            f"fl.rounds={args.rounds}",
            f"data.scale={args.scale}",
            f"threads={args.threads}",
            "algorithms=[fedsm]",
        ],
    )
    torch.set_num_threads(cfg.threads)
    prep = prepare(cfg)
    RawFedSM(prep).round(1)  # warm-up (allocator, MONAI imports)
    pairs = []
    for i in range(args.repeats):
        for p in paired_rounds(prep, args.rounds, lambda prep, folder: RawFedSM(prep), "fedsm"):
            if p["round"] > 1:
                pairs.append({"repeat": i + 1, **p})
        print(f"repeat {i + 1}: {json.dumps(ratio_stats(pairs))}", flush=True)
    result = {
        "command": f"python benchmarks/fedsm_cost.py --rounds {args.rounds} --repeats {args.repeats} "
        f"--preset {args.preset} --scale {args.scale} --threads {args.threads}"
        + (" --profile" if args.profile else ""),
        "preset": args.preset,
        "scale": args.scale,
        "image_size": cfg.data.image_size,
        "threads": args.threads,
        "sites": len(prep.site_data),
        "train_cases": sum(len(s.train) for s in prep.site_data),
        "ratio_to_raw": ratio_stats(pairs),
        "target": 1.1,
        "pairs": pairs,
    }
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "fedsm_cost.json").write_text(json.dumps(result, indent=2))
    print(json.dumps({k: v for k, v in result.items() if k != "pairs"}, indent=2))
    if args.profile:
        (RESULTS / "fedsm_cost_profile.txt").write_text(profile(prep, args.profile_rounds))


if __name__ == "__main__":
    main()
