"""A site's dataset fingerprint: what one site computes on its training cases for planning, and sends.

nnU-Net v2's ``DatasetFingerprintExtractor`` (``nnunetv2/experiment_planning/dataset_fingerprint/
fingerprint_extractor.py``) reads every training case, crops it to its non-zero region (``crop_to_nonzero``)
and records per case the spacing, the shape after cropping and the relative size after cropping, and per
channel the intensities of the foreground voxels (label > 0), from which it keeps mean, median, std, min,
max and the 0.5 / 99.5 percentiles (``foreground_intensity_properties_per_channel``). Here the same is
computed by each site on its own training cases, and only statistics leave the site, in two exchanges
(``fedseg.plan.federated``):

1. ``fingerprint``: per case the spacing (mm), the shape after the crop and the crop fraction, ``(N, D)`` /
   ``(N,)`` for N training cases and D spatial axes (nnU-Net keeps these per case too); per channel the exact
   sufficient statistics of the foreground intensities (:class:`Moments`: count, mean, sum of squared
   deviations, min, max), ``(C,)`` each;
2. ``histogram``: given the intensity range the server agreed from every site's min and max, per channel a
   histogram of the foreground intensities with ``bins`` equal bins over that range, ``(bins,)`` counts.

Between the two the site keeps its foreground intensities in its own state store (never sent) and drops them
after the histogram. nnU-Net samples at most 10^8 / N foreground voxels per case; every voxel is used here.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from fedseg.data.volumes import case_spacing, foreground_box
from fedseg.engine.context import ClientContext
from fedseg.engine.messages import Message

FINGERPRINT, HISTOGRAM = "fingerprint", "histogram"  # the two planning actions (exchanges)
KEPT = "plan_foreground"  # state-store prefix of the site's foreground intensities between the two exchanges


@dataclass
class CaseFingerprint:
    """One case: ``spacing`` (mm per axis), ``shape`` after the crop to the non-zero box (voxels),
    ``crop_fraction`` = prod(shape after crop) / prod(shape before) (nnU-Net's relative size after cropping)
    and ``foreground``: per channel the intensities of the labelled voxels (label > 0, not the ignore label) inside
    the box, float64 ``(C, n)`` (stays on the site)."""

    spacing: tuple[float, ...]
    shape: tuple[int, ...]
    crop_fraction: float
    foreground: np.ndarray


def case_fingerprint(
    image: np.ndarray, label: np.ndarray, spacing: Sequence[float], ignore: int | None = None
) -> CaseFingerprint:
    """The fingerprint of one case, ``image`` ``(C, *S)``, integer ``label`` ``(*S)``, ``spacing`` mm per axis;
    ``ignore``: the federation's ignore label (``Regions.ignore``), whose unannotated voxels are no foreground.

    The box is the one the volume path crops to (``fedseg.data.volumes.foreground_box``: non-zero in any
    channel, nnU-Net's ``create_nonzero_mask`` box; its hole filling does not change the box); an all-zero
    image keeps its whole grid."""
    x = torch.from_numpy(np.ascontiguousarray(image))
    box = foreground_box(x)
    full = tuple(int(n) for n in image.shape[1:])
    start, end = box if box is not None else ((0,) * len(full), full)
    inner = tuple(slice(s, e) for s, e in zip(start, end))
    shape = tuple(e - s for s, e in zip(start, end))
    labelled = np.asarray(label)[inner] > 0
    if ignore is not None:  # an unannotated voxel is not known to be foreground
        labelled &= np.asarray(label)[inner] != ignore
    foreground = np.asarray(image)[(slice(None), *inner)][:, labelled].astype(np.float64)
    fraction = float(np.prod(shape, dtype=np.float64) / np.prod(full, dtype=np.float64))
    return CaseFingerprint(tuple(float(s) for s in spacing), shape, fraction, foreground)


@dataclass
class Moments:
    """Exact sufficient statistics of one set of values per channel, each ``(C,)``: ``count``, ``mean``, ``m2``
    (sum of squared deviations from the mean), ``low`` / ``high`` (min / max; 0 where ``count`` is 0).
    Two sets merge exactly (Chan, Golub, LeVeque's pairwise update, :meth:`merge`), up to float64 rounding."""

    count: np.ndarray
    mean: np.ndarray
    m2: np.ndarray
    low: np.ndarray
    high: np.ndarray

    @classmethod
    def of(cls, values: Sequence[np.ndarray]) -> Moments:
        """Moments of ``values``: one 1-D array per channel."""
        count = np.array([v.size for v in values], dtype=np.int64)
        mean = np.array([v.mean() if v.size else 0.0 for v in values], dtype=np.float64)
        m2 = np.array([((v - m) ** 2).sum() if v.size else 0.0 for v, m in zip(values, mean)], dtype=np.float64)
        low = np.array([v.min() if v.size else 0.0 for v in values], dtype=np.float64)
        high = np.array([v.max() if v.size else 0.0 for v in values], dtype=np.float64)
        return cls(count, mean, m2, low, high)

    def merge(self, other: Moments) -> Moments:
        """The moments of the union of both sets (``n = na + nb``, ``delta = mean_b - mean_a``,
        ``mean = mean_a + delta nb / n``, ``m2 = m2_a + m2_b + delta^2 na nb / n``)."""
        na, nb = self.count.astype(np.float64), other.count.astype(np.float64)
        n = na + nb
        safe = np.where(n > 0, n, 1.0)
        delta = other.mean - self.mean
        mean = np.where(n > 0, self.mean + delta * nb / safe, 0.0)
        m2 = self.m2 + other.m2 + delta**2 * na * nb / safe
        low = np.where(na == 0, other.low, np.where(nb == 0, self.low, np.minimum(self.low, other.low)))
        high = np.where(na == 0, other.high, np.where(nb == 0, self.high, np.maximum(self.high, other.high)))
        return Moments(self.count + other.count, mean, m2, low, high)

    @property
    def std(self) -> np.ndarray:
        """Population standard deviation per channel (``np.std``, ddof 0, as nnU-Net); 0 where ``count`` is 0."""
        return np.sqrt(np.where(self.count > 0, self.m2 / np.maximum(self.count, 1), 0.0))


@dataclass
class SiteFingerprint:
    """What a site replies to ``fingerprint``: ``spacings`` ``(N, D)`` mm, ``shapes`` ``(N, D)`` voxels after the
    crop, ``crop_fractions`` ``(N,)`` (N training cases) and the foreground ``moments`` per channel."""

    spacings: np.ndarray
    shapes: np.ndarray
    crop_fractions: np.ndarray
    moments: Moments

    def message(self) -> Message:
        m = self.moments
        arrays = {
            "spacings": self.spacings,
            "shapes": self.shapes,
            "crop_fractions": self.crop_fractions,
            "count": m.count,
            "mean": m.mean,
            "m2": m.m2,
            "low": m.low,
            "high": m.high,
        }
        return Message({k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in arrays.items()})

    @classmethod
    def from_message(cls, msg: Message) -> SiteFingerprint:
        t = {k: v.numpy() for k, v in msg.tensors.items()}
        moments = Moments(t["count"], t["mean"], t["m2"], t["low"], t["high"])
        return cls(t["spacings"], t["shapes"], t["crop_fractions"], moments)


def site_fingerprint(cases: Sequence[CaseFingerprint], channels: int, dims: int) -> SiteFingerprint:
    """The fingerprint of a site's training ``cases`` (in their order)."""
    spacings = np.array([c.spacing for c in cases], dtype=np.float64).reshape(len(cases), dims)
    shapes = np.array([c.shape for c in cases], dtype=np.float64).reshape(len(cases), dims)
    fractions = np.array([c.crop_fraction for c in cases], dtype=np.float64)
    return SiteFingerprint(spacings, shapes, fractions, Moments.of(pooled_foreground(cases, channels)))


def pooled_foreground(cases: Sequence[CaseFingerprint], channels: int) -> list[np.ndarray]:
    """Per channel, the foreground intensities of all ``cases`` together (1-D float64 arrays)."""
    return [np.concatenate([c.foreground[ch] for c in cases] or [np.zeros(0)]) for ch in range(channels)]


def histogram(values: np.ndarray, low: float, high: float, bins: int) -> np.ndarray:
    """Counts ``(bins,)`` int64 of ``values`` in ``bins`` equal bins over ``[low, high]`` (the last bin includes
    ``high``; ``numpy.histogram``). Values outside the range (none, when the range is the agreed min/max) are
    not counted."""
    return np.histogram(values, bins=bins, range=(low, high))[0].astype(np.int64)


class FingerprintClient:
    """A site's planning client: answers ``fingerprint`` and ``histogram`` (module docstring) from the site's
    training cases (``SiteData.sources``, read where the site is), each with the spacing the volume path uses
    (``fedseg.data.volumes.case_spacing``: the case's own, else its NIfTI header's)."""

    def handle(self, action: str, msg: Message, ctx: ClientContext) -> Message:
        channels = ctx.task.in_channels
        if action == FINGERPRINT:
            cases = []
            for case in ctx.data.sources:
                image, label = case.arrays()
                spacing = case_spacing(case, ctx.task.spatial_dims)
                cases.append(case_fingerprint(image, label, spacing, ctx.task.ignore_label))
            for ch, values in enumerate(pooled_foreground(cases, channels)):
                ctx.state[f"{KEPT}/{ch}"] = torch.from_numpy(values)  # the site's own store: never sent
            return site_fingerprint(cases, channels, ctx.task.spatial_dims).message()
        if action == HISTOGRAM:
            low, high, bins = msg.tensors["low"].numpy(), msg.tensors["high"].numpy(), int(msg.meta["bins"])
            kept = {ch: ctx.state.pop(f"{KEPT}/{ch}").numpy() for ch in range(channels)}
            counts = {f"hist/{ch}": histogram(kept[ch], float(low[ch]), float(high[ch]), bins) for ch in kept}
            return Message({k: torch.from_numpy(v) for k, v in counts.items()})
        raise ValueError(f"{type(self).__name__} has no handler for action {action!r}")
