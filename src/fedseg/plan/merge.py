"""The server's merge of the sites' fingerprints into the dataset fingerprint nnU-Net plans from.

What is exact and what is approximate, against nnU-Net's fingerprint of the pooled training cases:

- per-case spacings, shapes after the crop and crop fractions: exact (concatenated in federation order);
- per channel, the foreground intensities' count, mean, std (population), min and max: exact up to float64
  rounding (pairwise merge of :class:`fedseg.plan.fingerprint.Moments`);
- the 0.5 / 50 / 99.5 percentiles: approximate, from the sum of the sites' histograms over the agreed range
  ``[min, max]`` of the channel (``bins`` equal bins, width ``w = (max - min) / bins``):
  :func:`histogram_percentile` estimates each order statistic inside the bin that holds it, so the error is at
  most one bin width ``w`` (nnU-Net itself estimates them from a random sample of the foreground voxels).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from fedseg.plan.fingerprint import Moments, SiteFingerprint

PERCENTILES = (0.5, 50.0, 99.5)  # nnU-Net's percentile_00_5, median, percentile_99_5


@dataclass
class ChannelIntensity:
    """Foreground intensities of one channel over every training case (nnU-Net's
    ``foreground_intensity_properties_per_channel``); ``bin_width``: the percentiles' error bound."""

    count: int
    mean: float
    std: float
    min: float
    max: float
    percentile_00_5: float
    median: float
    percentile_99_5: float
    bin_width: float


@dataclass
class DatasetFingerprint:
    """The merged fingerprint: ``spacings`` ``(N, D)`` mm, ``shapes`` ``(N, D)`` voxels after the crop,
    ``crop_fractions`` ``(N,)`` over every training case of every site, and ``intensity`` per channel."""

    spacings: np.ndarray
    shapes: np.ndarray
    crop_fractions: np.ndarray
    intensity: list[ChannelIntensity]

    def summary(self) -> dict:
        """A small JSON-safe description (no per-case arrays): case count, median spacing / shape / crop fraction."""
        return {
            "cases": int(len(self.spacings)),
            "median_spacing": [float(v) for v in np.median(self.spacings, axis=0)],
            "median_shape_after_crop": [float(v) for v in np.median(self.shapes, axis=0)],
            "median_relative_size_after_cropping": float(np.median(self.crop_fractions)),
            "foreground_intensity_per_channel": [vars(c) for c in self.intensity],
        }


def merge_moments(sites: Sequence[SiteFingerprint]) -> Moments:
    """The exact foreground moments of every site's cases together."""
    merged = sites[0].moments
    for site in sites[1:]:
        merged = merged.merge(site.moments)
    return merged


def agreed_range(moments: Moments) -> tuple[np.ndarray, np.ndarray]:
    """The histogram range per channel, ``(low (C,), high (C,))``: the merged min and max (a channel with one
    value, or none, gets ``[low, low + 1]`` so that its bins have a width)."""
    low = moments.low.astype(np.float64)
    high = np.where(moments.high > low, moments.high, low + 1.0).astype(np.float64)
    return low, high


def histogram_percentile(counts: np.ndarray, low: float, high: float, q: float) -> float:
    """The ``q``-th percentile (numpy's linear definition: position ``q / 100 (n - 1)`` among the sorted values)
    of the values a histogram ``counts`` ``(bins,)`` over ``[low, high]`` counts. The order statistics on
    either side of the position are each placed inside their bin, the ``j``-th of the bin's ``m`` values at
    ``edge + (j + 0.5) / m * width``, and interpolated; each lies in its bin, so the error is at most one bin
    width. NaN for an empty histogram."""
    n = int(counts.sum())
    if n == 0:
        return float("nan")
    width = (high - low) / len(counts)
    cumulative = np.cumsum(counts)

    def order_statistic(k: int) -> float:
        b = int(np.searchsorted(cumulative, k, side="right"))  # the bin holding the k-th value (0-based)
        before = int(cumulative[b - 1]) if b > 0 else 0
        return low + (b + (k - before + 0.5) / int(counts[b])) * width

    position = q / 100.0 * (n - 1)
    below = int(np.floor(position))
    above = min(below + 1, n - 1)
    fraction = position - below
    return order_statistic(below) + fraction * (order_statistic(above) - order_statistic(below))


def merge_fingerprints(
    sites: Sequence[SiteFingerprint], histograms: Sequence[dict[int, np.ndarray]], low: np.ndarray, high: np.ndarray
) -> DatasetFingerprint:
    """The dataset fingerprint from every site's ``fingerprint`` reply and its ``histogram`` reply (``{channel:
    counts (bins,)}``) over the agreed range ``low``/``high`` ``(C,)`` (module docstring: exact vs approximate)."""
    moments = merge_moments(sites)
    intensity = []
    for ch in range(len(moments.count)):
        counts = np.sum([h[ch] for h in histograms], axis=0)
        lo, hi = float(low[ch]), float(high[ch])
        p_low, p_mid, p_high = (histogram_percentile(counts, lo, hi, q) for q in PERCENTILES)
        intensity.append(
            ChannelIntensity(
                int(moments.count[ch]),
                float(moments.mean[ch]),
                float(moments.std[ch]),
                float(moments.low[ch]),
                float(moments.high[ch]),
                p_low,
                p_mid,
                p_high,
                (hi - lo) / len(counts),
            )
        )
    return DatasetFingerprint(
        np.concatenate([s.spacings for s in sites]),
        np.concatenate([s.shapes for s in sites]),
        np.concatenate([s.crop_fractions for s in sites]),
        intensity,
    )
