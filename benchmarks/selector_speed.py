"""Selector speed: forward + backward + Adam step time per batch, by width (1 torch thread).

Measures the VGG-11-style selector (``fedseg.models.Selector``, ``--norms``: instance (FedSM's
default) and batch, 3 input channels, 6 classes, cross-entropy) on batches of 8 random images, and the default
segmentation network (MONAI UNet 16..256, res0) for scale. The median over ``--repeats`` timed steps
after ``--warmup`` steps is reported. The machine is shared and noisy: compare widths
within one run.

    .venv/bin/python benchmarks/selector_speed.py [--sizes 64 128] [--repeats 20]

Writes benchmarks/results/selector_speed.json.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from pathlib import Path

import torch
from torch import nn

from fedseg.algorithms.fedsm.selector import build_selector
from fedseg.config import ModelConfig, TrainConfig
from fedseg.models import build_segmenter, count_parameters
from fedseg.train import segmentation_loss

RESULTS = Path(__file__).parent / "results"


def step_ms(model: nn.Module, x: torch.Tensor, target: torch.Tensor, loss_fn, warmup: int, repeats: int) -> float:
    """Median milliseconds of one zero_grad + forward + backward + Adam step."""
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    model.train()
    times = []
    for i in range(warmup + repeats):
        start = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        loss_fn(model(x), target).backward()
        opt.step()
        if i >= warmup:
            times.append((time.perf_counter() - start) * 1000)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--widths", type=float, nargs="+", default=[0.25, 0.5, 1.0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[64])
    parser.add_argument(
        "--downsampled",
        type=int,
        default=32,
        help="also time width 0.25 reading images resampled to this side (0: skip)",
    )
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--norms", nargs="+", choices=["instance", "batch"], default=["instance", "batch"])
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=15)
    args = parser.parse_args()
    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(0)
    rows = []
    for size in args.sizes:
        x = torch.rand(args.batch, 3, size, size, generator=g)
        labels = torch.randint(0, 6, (args.batch,), generator=g)
        variants = [(norm, w, None) for norm in args.norms for w in args.widths]
        if args.downsampled and args.downsampled < size:
            variants.append((args.norms[0], 0.25, args.downsampled))
        for norm, width, input_size in variants:
            model = build_selector(3, 6, width=width, norm=norm, input_size=input_size)
            ms = step_ms(model, x, labels, nn.CrossEntropyLoss(), args.warmup, args.repeats)
            rows.append(
                {
                    "model": "selector",
                    "norm": norm,
                    "width": width,
                    "size": size,
                    "input_size": input_size or size,
                    "params": count_parameters(model),
                    "ms_per_batch": ms,
                    "load_1min": os.getloadavg()[0],
                }
            )
            print(
                f"selector {norm:<8} width {width:<5} {size}x{size} read at {input_size or size}: "
                f"{count_parameters(model) / 1e6:.2f}M params, {ms:.0f} ms"
            )
        unet = build_segmenter(ModelConfig(), 2, 3, 2, 0)
        masks = (torch.rand(args.batch, 2, size, size, generator=g) > 0.5).float()
        ms = step_ms(unet, x, masks, segmentation_loss(TrainConfig(loss="dice")), args.warmup, args.repeats)
        rows.append(
            {
                "model": "unet16",
                "width": None,
                "size": size,
                "input_size": size,
                "params": count_parameters(unet),
                "ms_per_batch": ms,
                "load_1min": os.getloadavg()[0],
            }
        )
        print(f"UNet 16..256 (reference)   {size}x{size}: {count_parameters(unet) / 1e6:.2f}M params, {ms:.0f} ms")
    RESULTS.mkdir(parents=True, exist_ok=True)
    out = {
        "what": "forward+backward+Adam step per batch, median ms, 1 torch thread; load_1min: the machine's load "
        "average when the row was measured (other work on this shared 2-core machine inflates it)",
        "batch": args.batch,
        "torch": torch.__version__,
        "machine": platform.machine(),
        "rows": rows,
    }
    (RESULTS / "selector_speed.json").write_text(json.dumps(out, indent=2))
    print(f"wrote {RESULTS / 'selector_speed.json'}")


if __name__ == "__main__":
    main()
