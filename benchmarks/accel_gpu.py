"""Device check and timing of the training switches on CUDA (issue 26): ``train.amp``, ``train.channels_last``,
``train.loader_workers`` (``fedseg.accel``, ``fedseg.train.Trainer``).

1. Smoke runs, one round each: ``demo`` (2D whole images: resident on the device, bf16 inference), ``fets-cpu``
   (3D patches: pinned copies, augmentation on the device, bf16 sliding window) with 2 loader workers, and again
   with ``train.amp=fp16`` (GradScaler).
2. Timing, the ``fets`` preset's training step (DynUNet 32->512 on 128^3 patches, batch 4, FeTS augmentations)
   on synthetic 150^3 cases: steps/s of (amp off, channels-last off, 0 workers) = the loop before issue 26,
   then the defaults (bf16; 3D stays contiguous) with 0, 2 and 4 workers (``--more``: channels-last on, 8
   workers); and the device-only step time (one batch kept on the device), whose ratio to the step time is the
   share of time the GPU is busy. Results: ``benchmarks/results/accel_gpu_h100*.json`` (their variant names
   say what ran: those files were written while ``channels_last: auto`` still meant on for 3D).

Usage: ``PYTHONPATH=src python benchmarks/accel_gpu.py OUT [--steps 20]`` -> ``OUT/accel_gpu.json``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
import traceback
from pathlib import Path

import numpy as np
import torch

from fedseg.config import BudgetConfig
from fedseg.config_load import config_from_cli
from fedseg.data.dataset import CaseSet
from fedseg.data.federation import Regions
from fedseg.data.preprocess import normalization
from fedseg.data.volumes import build_volume
from fedseg.engine.context import Task
from fedseg.run import run_experiment
from fedseg.train import PLAIN, Trainer

BRATS = Regions.from_mapping({"wt": [1, 2, 4], "tc": [1, 4], "et": [4]})


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def smoke(out: Path, name: str, preset: str, sets: list[str], device: str) -> dict:
    """One round of ``preset`` on ``device`` with ``sets``; its test Dice and seconds (or the error)."""
    cfg = config_from_cli(preset, None, None, "fedavg", 1, None, sets, device, None)
    start = time.perf_counter()
    try:
        results = run_experiment(cfg, out / name)
    except Exception as exc:  # a device check: report and go on to the next
        traceback.print_exc()
        return {"error": f"{type(exc).__name__}: {exc}"}
    summary = results.algorithms[0].summary
    return {
        "dice": summary["dice"]["global"],
        "seconds": round(time.perf_counter() - start, 2),
        "accel": results.provenance.get("accel"),
    }


def synthetic_cases(n: int, size: int, cfg) -> CaseSet:
    """``n`` 4-channel ``size``^3 cases (noise in a zero border, a labelled box) as a volume-path CaseSet."""
    rng = np.random.default_rng(0)
    norm = normalization(cfg.data.normalize, None)
    vols = []
    for i in range(n):
        image = np.zeros((4, size, size, size), np.float32)
        image[:, 4:-4, 4:-4, 4:-4] = rng.normal(100.0, 20.0, (4, size - 8, size - 8, size - 8))
        label = np.zeros((size,) * 3, np.uint8)
        c = size // 2 + (i % 5) - 2
        label[c - 20 : c + 20, c - 15 : c + 15, c - 10 : c + 10] = 2
        label[c - 8 : c + 8, c - 8 : c + 8, c - 5 : c + 5] = 4
        vols.append(build_volume(image, label, BRATS, (1.0, 1.0, 1.0), cfg.data.volume, norm))
    view = torch.zeros(n, 4, 8, 8, 8)
    return CaseSet("synthetic", [str(i) for i in range(n)], view, torch.zeros(n, 3, 8, 8, 8), vols, cfg.data.volume)


def step_rate(cfg, data: CaseSet, steps: int, repeats: int) -> dict:
    """Steps/s of ``Trainer.fit`` under ``cfg.train`` (median and spread of ``repeats`` fits of ``steps``)."""
    device = torch.device(cfg.device)
    model = Task(cfg, 3, 4, BRATS.names).new_model()
    trainer = Trainer(cfg.train, device)
    opt = trainer.new_optimizer(model)
    gen = torch.Generator().manual_seed(0)
    trainer.fit(model, data, gen, opt, BudgetConfig(unit="steps", amount=3))  # warm-up: cuDNN autotuning
    rates = []
    for _ in range(repeats):
        sync(cfg.device)
        start = time.perf_counter()
        trainer.fit(model, data, gen, opt, BudgetConfig(unit="steps", amount=steps))
        sync(cfg.device)
        rates.append(steps / (time.perf_counter() - start))
    x, y = trainer.draw(data, torch.arange(cfg.train.batch_size), torch.Generator().manual_seed(1))
    sync(cfg.device)
    start = time.perf_counter()
    for _ in range(steps):
        trainer._step(model, opt, PLAIN, trainer.loss_fn, None, x, y)
    sync(cfg.device)
    device_only = (time.perf_counter() - start) / steps
    rate = statistics.median(rates)
    return {
        "steps_per_s": round(rate, 3),
        "spread": [round(min(rates), 3), round(max(rates), 3)],
        "device_only_s_per_step": round(device_only, 4),
        "gpu_busy_share": round(device_only * rate, 3),
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out", type=Path)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--skip-smoke", action="store_true")
    parser.add_argument("--device", default="cuda", help="cpu: a dry run of this script")
    parser.add_argument("--size", type=int, default=150, help="voxels per axis of the timing cases")
    parser.add_argument("--patch", type=int, default=128)
    parser.add_argument(
        "--more", action="store_true", help="also: channels-last off, float32 + channels-last, 8 workers"
    )
    parser.add_argument("--compile-check", action="store_true", help="also: 3 steps with train.compile=true")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    torch.set_num_threads(4)
    name = torch.cuda.get_device_name(0) if args.device.startswith("cuda") else args.device
    report: dict = {"torch": torch.__version__, "device": name, "steps": args.steps, "size": args.size}

    def save() -> None:
        (args.out / "accel_gpu.json").write_text(json.dumps(report, indent=2))
        print(json.dumps(report), flush=True)

    if not args.skip_smoke:
        report["smoke"] = {
            "demo": smoke(args.out, "demo", "demo", [], args.device),
            "fets-cpu-workers2": smoke(args.out, "fets-cpu", "fets-cpu", ["train.loader_workers=2"], args.device),
            "fets-cpu-fp16": smoke(args.out, "fets-cpu-fp16", "fets-cpu", ["train.amp=fp16"], args.device),
        }
        save()
    patch = [f"data.volume.patch_size={args.patch}"]
    base = config_from_cli("fets", None, None, None, None, None, patch, args.device, None)
    data = synthetic_cases(8, args.size, base)
    report["timing"] = {}
    variants = {
        "before: amp off, channels-last off, 0 workers": ["train.amp=off", "train.channels_last=off"],
        "defaults (bf16, 3D contiguous), 0 workers": ["train.loader_workers=0"],
        "defaults, 2 workers": ["train.loader_workers=2"],
        "defaults, 4 workers": ["train.loader_workers=4"],
    }
    if args.more:
        variants = {
            "float32, channels-last on, 4 workers": [
                "train.amp=off",
                "train.channels_last=on",
                "train.loader_workers=4",
            ],
            "bf16, channels-last on, 4 workers": ["train.channels_last=on", "train.loader_workers=4"],
            **variants,
            "defaults, 8 workers": ["train.loader_workers=8"],
        }
    for name, sets in variants.items():
        cfg = config_from_cli("fets", None, None, None, None, None, [*patch, *sets], args.device, None)
        try:
            report["timing"][name] = step_rate(cfg, data, args.steps, args.repeats)
        except Exception as exc:
            traceback.print_exc()
            report["timing"][name] = {"error": f"{type(exc).__name__}: {exc}"}
        save()
    if args.compile_check:
        report["compile"] = compile_check(
            config_from_cli("fets", None, None, None, None, None, [*patch, "train.compile=true"], args.device, None),
            data,
        )
        save()


def compile_check(cfg, data: CaseSet) -> dict:
    """Seconds and mean loss of two 3-step fits with ``train.compile`` (the first compiles)."""
    model = Task(cfg, 3, 4, BRATS.names).new_model()
    trainer = Trainer(cfg.train, torch.device(cfg.device))
    out = {}
    for name in ("first", "second"):
        start = time.perf_counter()
        try:
            stats = trainer.fit(
                model, data, torch.Generator().manual_seed(0), budget=BudgetConfig(unit="steps", amount=3)
            )
        except Exception as exc:
            traceback.print_exc()
            return {"error": f"{type(exc).__name__}: {exc}"}
        out[name] = {"seconds": round(time.perf_counter() - start, 2), "mean_loss": stats.mean_loss}
    return out


if __name__ == "__main__":
    sys.exit(main())
