"""HD95/NSD on the GPU (torch, ``surface_pairs``) against the CPU path (``cpu_surface_pairs``, MONAI's numbers
bit for bit, tests/test_surface.py) on BraTS-sized 3D masks: agreement and seconds per case.

Masks: ``--cases`` cases of 3 regions on a 240 x 240 x 155 grid at 1 mm, nested blobs (smoothed noise
thresholded) with a perturbed prediction, as a tumour segmentation looks. Needs only torch, numpy and scipy.
Writes ``benchmarks/results/surface_speed.json`` (or ``--out``).

    PYTHONPATH=src python benchmarks/surface_speed.py --cases 4
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from fedseg.evaluate.surface import cpu_surface_pairs, surface_pairs

HERE = Path(__file__).parent
SHAPE = (240, 240, 155)


def blob(g: torch.Generator, level: float) -> torch.Tensor:
    """A smooth random blob ``SHAPE`` (bool): low-resolution noise upsampled, plus a centred ellipsoid."""
    noise = torch.rand((1, 1, 15, 15, 10), generator=g)
    field = F.interpolate(noise, size=SHAPE, mode="trilinear", align_corners=False)[0, 0]
    axes = [torch.linspace(-1, 1, n) for n in SHAPE]
    x, y, z = torch.meshgrid(*axes, indexing="ij")
    return (field * 0.6 + (1 - (x**2 + y**2 + z**2)) * 0.8) > level


def case(g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    truth = torch.stack([blob(g, level) for level in (0.75, 0.85, 0.95)])
    pred = torch.stack([blob(g, level + 0.02) for level in (0.75, 0.85, 0.95)])
    return pred, truth


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", type=int, default=4)
    ap.add_argument("--out", type=Path, default=HERE / "results" / "surface_speed.json")
    args = ap.parse_args()
    g = torch.Generator().manual_seed(0)
    cases = [case(g) for _ in range(args.cases)]
    taus = [1.0, 1.0, 1.0]
    rows = []
    for pred, truth in cases:
        t0 = time.perf_counter()
        hd_c, nsd_c = cpu_surface_pairs(pred, truth, [1.0, 1.0, 1.0], 95.0, taus)
        cpu_s = time.perf_counter() - t0
        row = {"pred_voxels": int(pred.sum()), "cpu_s": cpu_s, "hd95": hd_c.tolist(), "nsd": nsd_c.tolist()}
        if torch.cuda.is_available():
            p, t = pred.cuda(), truth.cuda()
            surface_pairs(p, t, [1.0, 1.0, 1.0], 95.0, taus)  # warm-up
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            hd_g, nsd_g = surface_pairs(p, t, [1.0, 1.0, 1.0], 95.0, taus)
            row["gpu_s"] = time.perf_counter() - t0
            row["hd95_max_rel_diff"] = float(((hd_g - hd_c).abs() / hd_c.abs().clamp_min(1e-12)).max())
            row["nsd_max_abs_diff"] = float((nsd_g - nsd_c).abs().max())
        rows.append(row)
        print(row, flush=True)
    result = {
        "shape": SHAPE,
        "regions": 3,
        "device": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu",
    }
    result["cases"] = rows
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
