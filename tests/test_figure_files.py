"""Report figures are stored compactly: charts as palette PNGs, image panels in full colour."""

from __future__ import annotations

import numpy as np
from PIL import Image

from fedseg.presentation.figures import DPI, PALETTE_COLORS, per_site_bars, sample_grid


def test_a_chart_is_a_palette_png_of_at_most_256_colours(tmp_path):
    values = {"fedavg": {"a": 0.8, "b": 0.6}, "local": {"a": 0.7, "b": 0.75}}
    out = per_site_bars(values, ["a", "b"], {"a": 10, "b": 5}, tmp_path / "bars.png")
    image = Image.open(out)
    assert image.mode == "P"
    assert image.getcolors(PALETTE_COLORS) is not None  # None: more colours than that
    assert round(image.info["dpi"][0]) == DPI


def test_image_panels_keep_every_grey_level(tmp_path):
    """A sample grid shows MR/CT grey levels: quantized to 256 colours they would band, so it stays RGB."""
    ramp = np.tile(np.linspace(0.0, 1.0, 64, dtype=np.float32), (64, 1))[None]  # (C=1, H, W)
    mask = np.zeros((1, 64, 64), dtype=np.uint8)
    mask[0, 20:40, 20:40] = 1
    samples = {"a": {"fedavg": {"image": ramp, "truth": mask, "pred": mask, "case": "case0"}}}
    out = sample_grid(samples, ["a"], ["fedavg"], ["disc"], tmp_path / "samples.png")
    assert Image.open(out).mode == "RGB"
