"""Peak memory and time of scoring one large resampled case (sliding window, mapping back, Dice/HD95/NSD), this
tree against another (``--base``, e.g. the last commit), each side in a fresh process per run.

One synthetic CT-like case, 1 channel, 3 nested regions (``a`` > ``b`` > ``c``), ``--shape`` voxels at ``--spacing``
mm, resampled to ``--target`` mm (``none``: not resampled, as the ``fets-cpu`` preset, which sets no spacing), otherwise
the ``fets-cpu`` preset's volume settings (32^3 patches, overlap 0.5, Gaussian blending, zscore_foreground), its
torch thread count (1) and its HD95 worst value. The network is the preset's UNet (channels 8-64), untrained (seed
0), plus ``4 * (image - level)`` per region, so that the masks are blobs with a ragged border as a real
prediction's, not speckle (an untrained network's output is ~0: its masks would be noise and HD95 would measure
millions of surface voxels). The case is built and saved once (its pre-processing resamples the image too, which
must not count); each run loads it and calls ``fedseg.evaluate.sliding.score_volumes`` on it, the evaluation's own
scoring function (label-map masks, ``eval.score_on: label_map``), and reports its seconds and the process's peak
RSS (``VmHWM``, the high-water mark of the process's own memory: ``ru_maxrss`` would also count the parent's RSS at
the fork, which Linux carries over an exec; the loaded case is in it on both sides). The sides alternate over
``--pairs`` pairs; the result holds the median and range of the peak-RSS and time ratios (this tree / base), of the
ratio of what scoring added to the loaded process, and whether the Dice, HD95 and NSD numbers of every run are the
same to the bit (the script fails if they are not).

    mkdir -p /tmp/wt-eval && git archive HEAD src | tar -x -C /tmp/wt-eval   # the base: the last commit
    PYTHONPATH=src python benchmarks/eval_memory.py --base /tmp/wt-eval/src
    PYTHONPATH=src python benchmarks/eval_memory.py --base /tmp/wt-eval/src --shape 512,512,300 \
        --out eval_memory_512.json

Writes ``benchmarks/results/eval_memory.json`` (or ``--out`` there).
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
import time
from pathlib import Path

HERE = Path(__file__).parent
REGIONS = {"a": [1, 2, 3], "b": [2, 3], "c": [3]}
LEVELS = (0.0, 0.6, 1.2)  # the z-scored intensity above which the added term votes for each region


def parse(text: str, kind=float) -> tuple:
    return tuple(kind(v) for v in text.split(","))


def make_case(shape: tuple[int, ...], spacing: tuple[float, ...], target: tuple[float, ...] | None, path: Path) -> dict:
    """The synthetic case, pre-processed (``build_volume``) and saved to ``path``."""
    import numpy as np
    import torch

    from fedseg.config_load import load_config
    from fedseg.data.federation import Regions
    from fedseg.data.volumes import build_volume

    cfg = load_config(preset="fets-cpu")
    volume = cfg.data.volume.model_copy(update={"spacing": target})
    rng = np.random.default_rng(0)
    axes = np.meshgrid(*[np.linspace(-1, 1, n, dtype=np.float32) for n in shape], indexing="ij", sparse=True)
    body = axes[0] ** 2 + axes[1] ** 2 < 0.85  # a cylinder along the last axis; air (0) around it
    r2 = sum((a / s) ** 2 for a, s in zip(axes, (0.6, 0.5, 0.7)))
    label = (r2 < 1.0).astype(np.uint8) + (r2 < 0.5) + (r2 < 0.2)  # nested ellipsoids: 1, 2, 3
    image = np.where(body, 40.0 + 30.0 * label + rng.normal(0, 10, shape).astype(np.float32), 0).astype(np.float32)
    vol = build_volume(image[None], label, Regions.from_mapping(REGIONS), spacing, volume, cfg.data.normalize)
    torch.save(vol, path)
    return {"original": list(shape), "resampled": list(vol.grid.resampled), "padded": list(vol.image.shape[1:])}


class Probe:
    """The preset's untrained UNet plus ``4 * (image - level)`` per region (module docstring)."""

    @staticmethod
    def build():
        import torch
        from torch import nn

        from fedseg.config_load import load_config
        from fedseg.models.factory import build_segmenter

        cfg = load_config(preset="fets-cpu")
        unet = build_segmenter(cfg.model, spatial_dims=3, in_channels=1, out_channels=len(REGIONS), seed=0)

        class Net(nn.Module):
            def __init__(self) -> None:
                super().__init__()
                self.unet = unet
                self.register_buffer("levels", torch.tensor(LEVELS).view(1, -1, 1, 1, 1))

            def forward(self, x: torch.Tensor) -> torch.Tensor:
                return self.unet(x) + 4.0 * (x[:, :1] - self.levels)

        return Net(), cfg


def peak_mb() -> float:
    """This process's peak RSS (MiB): ``VmHWM`` where Linux gives it, else ``ru_maxrss``."""
    status = Path("/proc/self/status")
    if status.exists():
        for line in status.read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def worker(path: Path) -> None:
    """One run: load the case, score it, print seconds, peak RSS and the numbers (JSON)."""
    import torch

    from fedseg.data.federation import Regions
    from fedseg.evaluate.sliding import score_volumes

    net, cfg = Probe.build()
    torch.set_num_threads(cfg.threads)
    vol = torch.load(path, weights_only=False)
    loaded_mb = peak_mb()
    start = time.perf_counter()
    scores = score_volumes(
        net,
        [vol],
        cfg.data.volume,
        cfg.eval.threshold,
        True,
        torch.device("cpu"),
        worst=cfg.eval.hd95_worst,
        regions=Regions.from_mapping(REGIONS),
    )
    seconds = time.perf_counter() - start
    peak = peak_mb()
    numbers = {m: [float(v).hex() for v in scores[m].ravel()] for m in ("dice", "hd95", "nsd")}
    print(json.dumps({"seconds": seconds, "peak_mb": peak, "loaded_mb": loaded_mb, "numbers": numbers}))


def run_side(src: str, *args: str) -> dict:
    """``--worker``/``--make`` in a fresh process with ``src`` first on its path; its last stdout line (JSON)."""
    env = {**os.environ, "PYTHONPATH": src}
    cmd = [sys.executable, __file__, *args]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False)
    if proc.returncode:
        raise RuntimeError(proc.stdout + proc.stderr)
    return json.loads(proc.stdout.strip().splitlines()[-1])


def spread(values: list[float]) -> dict:
    return {"median": round(statistics.median(values), 3), "min": round(min(values), 3), "max": round(max(values), 3)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--worker", type=Path, help=argparse.SUPPRESS)
    ap.add_argument("--make", type=Path, help=argparse.SUPPRESS)
    ap.add_argument("--base", required=False, help="the base's package folder (PYTHONPATH)")
    ap.add_argument("--src", default=str(HERE.parent / "src"), help="this side's package folder")
    ap.add_argument("--shape", default="400,400,200", help="original voxels per axis")
    ap.add_argument("--spacing", default="0.8,0.8,2.5", help="original mm per axis")
    ap.add_argument("--target", default="1.5,1.5,1.5", help="data.volume.spacing, mm per axis, or none")
    ap.add_argument("--pairs", type=int, default=3)
    ap.add_argument("--out", default="eval_memory.json", help="file name under benchmarks/results/")
    args = ap.parse_args()
    shape, spacing = parse(args.shape, int), parse(args.spacing)
    target = None if args.target == "none" else parse(args.target)
    if args.worker is not None:
        worker(args.worker)
        return
    if args.make is not None:
        print(json.dumps(make_case(shape, spacing, target, args.make)))
        return
    if not args.base:
        ap.error("--base is required")
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "case.pt"
        case = ["--shape", args.shape, "--spacing", args.spacing, "--target", args.target]
        grids = run_side(args.src, "--make", str(path), *case)  # this process stays small (see peak_mb)
        runs: dict[str, list[dict]] = {"new": [], "base": []}
        for i in range(args.pairs):  # alternate which side goes first (shared, noisy CPUs)
            order = ("base", "new") if i % 2 == 0 else ("new", "base")
            for side in order:
                runs[side].append(run_side(args.src if side == "new" else args.base, "--worker", str(path)))
                print(side, {k: round(v, 2) for k, v in runs[side][-1].items() if k != "numbers"}, flush=True)
    numbers = [r["numbers"] for side in runs.values() for r in side]
    same = all(n == numbers[0] for n in numbers)
    base, new = runs["base"], runs["new"]
    result = {
        "command": "PYTHONPATH=src python benchmarks/eval_memory.py --base BASE_SRC "
        f"--shape {args.shape} --spacing {args.spacing} --target {args.target} --pairs {args.pairs}",
        "grids": grids,
        "regions": len(REGIONS),
        "peak_mb": {s: [round(r["peak_mb"]) for r in runs[s]] for s in runs},
        "loaded_mb": {s: [round(r["loaded_mb"]) for r in runs[s]] for s in runs},
        "seconds": {s: [round(r["seconds"], 2) for r in runs[s]] for s in runs},
        "peak_ratio": spread([n["peak_mb"] / b["peak_mb"] for n, b in zip(new, base)]),
        "scoring_mb_ratio": spread(
            [(n["peak_mb"] - n["loaded_mb"]) / (b["peak_mb"] - b["loaded_mb"]) for n, b in zip(new, base)]
        ),
        "time_ratio": spread([n["seconds"] / b["seconds"] for n, b in zip(new, base)]),
        "same_numbers": same,
        "dice": [float.fromhex(v) for v in numbers[0]["dice"]],
        "hd95_mm": [float.fromhex(v) for v in numbers[0]["hd95"]],
    }
    out = HERE / "results" / args.out
    out.write_text(json.dumps(result, separators=(",", ":")) + "\n")
    print(json.dumps(result, indent=1))
    if not same:
        raise SystemExit("the two sides' Dice/HD95/NSD differ")


if __name__ == "__main__":
    main()
