"""RAM one BraTS-sized case takes once prepared for the volume path (``fedseg.data.volumes.Volume``), per part.

A 240 x 240 x 155 case of 4 modalities at 1 mm whose non-zero "brain" is an ellipsoid of about 141 x 171 x 141
voxels (what the crop to the foreground keeps of a BraTS volume), with nested WT/TC/ET blobs, prepared with the
``fets`` preset's volume settings (``build_volume``): the float32 image on the cropped grid, its region masks (bool
since 4d20c3d; float32 before: 4x), the original grid's truth for the metrics (bool; validation and test cases
only: ``mb_per_training_case`` is without it), and the ``data.image_size`` view every case also keeps
(``case_tensors``). A run keeps every case so: multiply by the number of cases.
Writes ``benchmarks/results/case_memory.json`` (or ``--out``).

    PYTHONPATH=src python benchmarks/case_memory.py
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from fedseg.config_load import config_from_cli
from fedseg.data.federation import Regions
from fedseg.data.preprocess import case_tensors, normalization
from fedseg.data.volumes import build_volume

HERE = Path(__file__).parent
SHAPE = (240, 240, 155)
REGIONS = {"WT": [1, 2, 4], "TC": [1, 4], "ET": [4]}


def brats_like_case() -> tuple[np.ndarray, np.ndarray]:
    """``(image (4, *SHAPE) float32, label SHAPE int64)``: an ellipsoidal brain of noise, edema around a core."""
    z, y, x = np.ogrid[: SHAPE[0], : SHAPE[1], : SHAPE[2]]

    def ball(cz: float, cy: float, cx: float, rz: float, ry: float, rx: float) -> np.ndarray:
        return ((z - cz) / rz) ** 2 + ((y - cy) / ry) ** 2 + ((x - cx) / rx) ** 2 <= 1

    brain = ball(120, 120, 77, 70, 85, 70)
    image = (np.random.default_rng(0).random((4, *SHAPE), dtype=np.float32) + 1) * brain
    label = np.zeros(SHAPE, np.int64)
    label[ball(120, 110, 70, 20, 25, 20)] = 2
    label[ball(120, 110, 70, 12, 14, 12)] = 1
    label[ball(120, 110, 70, 6, 7, 6)] = 4
    return image, label


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=HERE / "results" / "case_memory.json")
    args = parser.parse_args()
    cfg = config_from_cli("fets", None, None, None, None, None, ["device=cpu"])
    image, label = brats_like_case()
    regions = Regions.from_mapping(REGIONS)
    norm = normalization(cfg.data.normalize, cfg.data.ct_windows)
    vol = build_volume(image, label, regions, (1.0, 1.0, 1.0), cfg.data.volume, norm)
    x, y = case_tensors(image, label, regions, cfg.data.image_size, norm, cfg.data.resize)
    parts = {
        "image": vol.image.nbytes,
        "region_masks": vol.label.nbytes,
        "original_grid_truth": vol.truth.nbytes,
        "view": x.nbytes + y.nbytes,
    }
    result = {
        "case": {"shape": list(SHAPE), "channels": 4, "regions": list(REGIONS), "cropped": list(vol.image.shape[1:])},
        "preset": "fets",
        "region_mask_dtype": str(vol.label.dtype).removeprefix("torch."),
        "mb": {k: round(v / 1e6, 1) for k, v in parts.items()},
        "mb_per_case": round(sum(parts.values()) / 1e6, 1),
        "mb_per_training_case": round((sum(parts.values()) - parts["original_grid_truth"]) / 1e6, 1),
    }
    args.out.write_text(json.dumps(result) + "\n")
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
