"""Drawing machinery shared by the built-in 2D synthetic federations (``fedseg.data.synthetic``).

Both federations are drawn on a normalized grid ``u, v`` in ``[-1, 1]`` (``u`` left -> right, ``v`` top ->
bottom; ``grid``): wobbly-ellipse outlines (``Blob``, a batch of them ``Blobs``) painted with anti-aliased
edges (``soft_inside``, ``paint``), smooth random fields as sums of plane waves (``draw_waves``,
``smooth_field``), a Gaussian blur, line maps (``splat_lines``), additive or Rician noise and a tone-curve
lookup table (``acquire``). Randomness lives only in the per-case ``draw_*`` functions of the federations
(``fedseg.data.synthetic_retina``, ``fedseg.data.synthetic_prostate``), which return a small "recipe";
their ``render_*`` turns a batch of N recipes into arrays with the vectorized numpy of this module (arrays
``(N, H, W)``, images ``(C, N, H, W)`` while painting).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from functools import lru_cache
from typing import TypedDict

import numpy as np

REF_PX = 2.0 / 64  # one pixel of a 64 x 64 image in grid units: the unit of style blur/edge widths
EDGE_REACH = 3.0  # anti-aliased edges ramp over +-EDGE_REACH edge widths (see soft_inside)


@lru_cache(maxsize=16)
def axis(size: int) -> np.ndarray:
    """Pixel-centre coordinates along one axis: float32 ``(size,)`` in ``(-1, 1)``."""
    t = ((np.arange(size, dtype=np.float64) + 0.5) / size * 2.0 - 1.0).astype(np.float32)
    t.flags.writeable = False
    return t


@lru_cache(maxsize=16)
def grid(size: int) -> tuple[np.ndarray, np.ndarray]:
    """Pixel-centre coordinates ``(u, v)``, each float32 ``(size, size)``; ``u`` = column, ``v`` = row."""
    t = axis(size)
    u, v = np.broadcast_to(t[None, :], (size, size)).copy(), np.broadcast_to(t[:, None], (size, size)).copy()
    u.flags.writeable = v.flags.writeable = False
    return u, v


@dataclass(frozen=True)
class Blob:
    """A wobbly ellipse of one case: centre ``(x, y)`` and radii ``(rx, ry)`` in grid units, ``angle`` in
    radians, outline harmonics ``amps[k] * cos((k + 2) * theta + phases[k])`` relative to the radius."""

    center: tuple[float, float]
    radii: tuple[float, float]
    angle: float = 0.0
    amps: tuple[float, ...] = ()
    phases: tuple[float, ...] = ()

    def scaled(self, sx: float, sy: float | None = None) -> Blob:
        """The same blob with radii multiplied by ``sx`` (and ``sy`` for the second axis)."""
        return replace(self, radii=(self.radii[0] * sx, self.radii[1] * (sx if sy is None else sy)))

    def smooth(self) -> Blob:
        """The plain ellipse without outline harmonics."""
        return replace(self, amps=(), phases=())


class Wobble(TypedDict):
    """Outline harmonics of a ``Blob``, as its keyword arguments."""

    amps: tuple[float, ...]
    phases: tuple[float, ...]


def random_wobble(rng: np.random.Generator, n: int, amp: float) -> Wobble:
    """``n`` outline harmonics (orders 2..n+1) with amplitudes ~ ``amp / order``; ``Blob`` keyword args."""
    amps = rng.normal(0.0, amp, n) * 2.0 / np.arange(2, n + 2)
    phases = rng.uniform(0.0, 2 * np.pi, n)
    return {"amps": tuple(amps.tolist()), "phases": tuple(phases.tolist())}


OUTSIDE = Blob((10.0, 10.0), (0.1, 0.1))  # stands in for an absent organ: far outside the image


@dataclass(frozen=True)
class Blobs:
    """One ``Blob`` per case of a batch of N: parameters as float32 ``(N, 1, 1)`` arrays, harmonic
    coefficients ``amp * exp(i * phase)`` as complex64 ``(K, N, 1, 1)`` (orders 2..K+1) or None."""

    cx: np.ndarray
    cy: np.ndarray
    rx: np.ndarray
    ry: np.ndarray
    cos_a: np.ndarray
    sin_a: np.ndarray
    coef: np.ndarray | None

    @classmethod
    def of(cls, blobs: Sequence[Blob]) -> Blobs:
        p = np.array([(*b.center, *b.radii, math.cos(b.angle), math.sin(b.angle)) for b in blobs], dtype=np.float32)
        k = max(len(b.amps) for b in blobs)
        coef: np.ndarray | None = None
        if k:
            coef = np.zeros((k, len(blobs)), dtype=np.complex128)
            for i, b in enumerate(blobs):
                coef[: len(b.amps), i] = np.asarray(b.amps) * np.exp(1j * np.asarray(b.phases))
            coef = coef.astype(np.complex64)[:, :, None, None]
        cx, cy, rx, ry, cos_a, sin_a = (p[:, j, None, None] for j in range(6))
        return cls(cx, cy, rx, ry, cos_a, sin_a, coef)

    def window(self, size: int, margin: float = 0.0) -> tuple[slice, slice]:
        """Rows and columns of the ``size`` x ``size`` grid outside of which every blob's signed distance
        exceeds ``margin`` grid units: the only pixels worth evaluating (the union over the batch)."""
        r_max, r_min = np.maximum(self.rx, self.ry).ravel(), np.minimum(self.rx, self.ry).ravel()
        wobble = 0.0 if self.coef is None else np.abs(self.coef).sum(axis=0).ravel()
        reach = (1.0 + wobble) * r_max * (1.0 + margin / r_min)

        def span(center: np.ndarray) -> slice:
            lo = math.floor((float(np.min(center.ravel() - reach)) + 1.0) * size / 2 - 0.5)
            hi = math.ceil((float(np.max(center.ravel() + reach)) + 1.0) * size / 2 - 0.5) + 1
            return slice(min(max(lo, 0), size), min(max(hi, 0), size))

        return span(self.cy), span(self.cx)

    def ratio(self, size: int, window: tuple[slice, slice] = (slice(None), slice(None))) -> np.ndarray:
        """Normalized radius float32 ``(N, h, w)`` on ``window`` of the ``size`` x ``size`` grid (default:
        all of it): < 1 inside, 1 on the outline, > 1 outside."""
        u, v = grid(size)
        x, y = u[window] - self.cx, v[window] - self.cy
        xr = (self.cos_a * x + self.sin_a * y) / self.rx
        yr = (self.cos_a * y - self.sin_a * x) / self.ry
        r = np.sqrt(xr * xr + yr * yr)
        if self.coef is None:
            return r
        # outline(theta) = 1 + Re(sum_k c_k z^k) with z = exp(i theta), by Horner's rule (no arctan2)
        z = (xr + 1j * yr) / np.maximum(r, 1e-6)
        acc = self.coef[-1] * z
        for c in self.coef[-2::-1]:
            acc += c
            acc *= z
        acc *= z  # the lowest order is 2
        return r / (1.0 + acc.real)

    def signed_distance(
        self, size: int, scale=1.0, window: tuple[slice, slice] = (slice(None), slice(None))
    ) -> np.ndarray:
        """Approximate signed distance ``(N, h, w)`` in grid units (negative inside) to the outline with
        radii times ``scale`` (a number or an ``(N, 1, 1)`` array), on ``window`` of the grid."""
        return (self.ratio(size, window) - scale) * np.sqrt(self.rx * self.ry)

    def mask(self, size: int) -> np.ndarray:
        """Hard masks bool ``(N, size, size)``: pixel centres inside the outline (what an annotator draws)."""
        out = np.zeros((len(self.cx), size, size), dtype=bool)
        window = self.window(size)
        out[(slice(None), *window)] = self.ratio(size, window) < 1.0
        return out


def soft_inside(signed_distance: np.ndarray, width: float) -> np.ndarray:
    """Anti-aliased inside-weight in ``[0, 1]``: a smoothstep from 1 (``d <= -EDGE_REACH * width``) to 0
    (``d >= EDGE_REACH * width``), 0.5 on the outline, as steep there as ``1 / (1 + exp(d / width))``.
    Exactly 0 and 1 outside the ramp, so evaluating only a window around a blob changes nothing."""
    t = np.clip(0.5 - signed_distance * (0.5 / (EDGE_REACH * width)), 0.0, 1.0)
    return t * t * (3.0 - 2.0 * t)


def paint(image: np.ndarray, blobs: Blobs, layers, width: float, within: Blobs | None = None) -> None:
    """Alpha-blend values over ``image (C, N, H, W)`` inside ``blobs``, in place.

    ``layers`` is a value or a list of ``(scale, value)`` painted in order, each inside the blob with
    radii times ``scale`` (concentric shells share one evaluation of the outline). A value is a scalar,
    an ``(N, H, W)`` array (same for every channel) or a ``(C, N|1, H|1, W|1)`` array (per channel).
    Edges ramp over ``width`` grid units; with ``within``, painting stays inside those blobs too.
    Only the blobs' window is touched (beyond it, every weight is exactly 0).
    """
    if not isinstance(layers, list):
        layers = [(1.0, layers)]
    size = image.shape[-1]
    outer = max(float(np.max(scale)) for scale, _ in layers)
    window = replace(blobs, rx=blobs.rx * outer, ry=blobs.ry * outer).window(size, EDGE_REACH * width)
    ratio = blobs.ratio(size, window)
    to_distance = np.sqrt(blobs.rx * blobs.ry)
    clip = 1.0 if within is None else soft_inside(within.signed_distance(size, window=window), width)
    for scale, value in layers:
        weight = soft_inside((ratio - scale) * to_distance, width) * clip
        if np.ndim(value) >= 3 and np.shape(value)[-1] > 1:  # an image-sized value: cut the window
            value = value[(Ellipsis, *window)]
        for c, channel in enumerate(image):  # channel by channel: numpy broadcasts (C, ...) x (...) slowly
            sub = channel[(slice(None), *window)]
            sub += ((value[c] if np.ndim(value) == 4 else value) - sub) * weight


def draw_waves(rng: np.random.Generator, n_waves: int, max_freq: float) -> np.ndarray:
    """Random plane waves ``(3, n_waves)``: frequency (cycles per grid unit, up to ``max_freq``),
    direction and phase (radians); see ``smooth_field``."""
    freq = rng.uniform(0.25, max_freq, n_waves)
    direction = rng.uniform(0.0, 2 * np.pi, n_waves)
    phase = rng.uniform(0.0, 2 * np.pi, n_waves)
    return np.stack([freq, direction, phase])


def smooth_field(waves: np.ndarray, size: int) -> np.ndarray:
    """Smooth random fields float32 ``(N, size, size)`` from ``waves (N, 3, K)`` (``draw_waves``): sums of
    plane waves with amplitude ~ 1 / frequency, zero mean and unit variance (over draws).

    Plane waves are separable, ``cos(a u + b v + p) = cos(a u) cos(b v + p) - sin(a u) sin(b v + p)``,
    so each field is two small products over K (einsum, no BLAS) instead of K full-image cosines.
    """
    freq, direction, phase = waves[:, 0, :, None], waves[:, 1, :, None], waves[:, 2, :, None]  # (N, K, 1)
    amp = 1.0 / freq
    amp = amp / np.sqrt(0.5 * np.sum(amp**2, axis=1, keepdims=True))
    t = axis(size).astype(np.float64)
    col = 2 * np.pi * freq * np.cos(direction) * t  # (N, K, W)
    row = 2 * np.pi * freq * np.sin(direction) * t + phase  # (N, K, H)
    cos_part = np.einsum("nkh,nkw->nhw", amp * np.cos(row), np.cos(col))
    field = cos_part - np.einsum("nkh,nkw->nhw", amp * np.sin(row), np.sin(col))
    return field.astype(np.float32)


@lru_cache(maxsize=64)
def blur_kernel(sigma_px: float) -> np.ndarray:
    """Gaussian weights float32 ``(2 r + 1,)`` for offsets ``-r..r`` pixels, truncated at 3 sigma."""
    radius = int(3.0 * sigma_px)
    return np.exp(-0.5 * (np.arange(-radius, radius + 1) / sigma_px) ** 2).astype(np.float32)


def blur(image: np.ndarray, sigma_px: float) -> np.ndarray:
    """Gaussian blur of ``image (..., H, W)`` over the last two axes, ``sigma_px`` in pixels. Separable, as
    shifted adds (no BLAS: its threads stall on a busy machine); at the border the kernel is renormalized
    over the pixels inside, so edges do not darken."""
    if sigma_px <= 0:
        return image
    kernel = blur_kernel(round(sigma_px, 4))
    radius = len(kernel) // 2
    for axis in (image.ndim - 1, image.ndim - 2):
        n = image.shape[axis]
        padded = np.pad(image, [(radius, radius) if a == axis else (0, 0) for a in range(image.ndim)])
        inside = np.pad(np.ones(n, dtype=np.float32), radius)
        out, norm = np.zeros_like(image), np.zeros(n, dtype=np.float32)
        for i, w in enumerate(kernel):
            out += w * padded[(slice(None),) * axis + (slice(i, i + n),)]
            norm += w * inside[i : i + n]
        image = out / norm.reshape((n,) + (1,) * (image.ndim - 1 - axis))
    return image


def splat_lines(x, y, weight, case, n_cases: int, sigma_px: float, size: int) -> np.ndarray:
    """Line maps float32 ``(n_cases, size, size)`` from points sampled along curves: ``x, y`` in grid
    units, ``weight`` = arc length per point in pixels (times an intensity), ``case`` = the point's case.
    Points are splatted bilinearly and blurred by a Gaussian of ``sigma_px`` pixels, scaled so that a
    straight unit-intensity line peaks at about 1."""
    padded = size + 3  # a one-pixel ring around the image (plus one) catches the points outside it
    col = np.clip((x + 1.0) * (size / 2) - 0.5, -1.0, size)
    row = np.clip((y + 1.0) * (size / 2) - 0.5, -1.0, size)
    c0, r0 = np.floor(col), np.floor(row)
    fc, fr = col - c0, row - r0
    base = (case * padded * padded + (r0 + 1) * padded + (c0 + 1)).astype(np.intp)
    index = np.concatenate([base, base + 1, base + padded, base + padded + 1])
    w = np.concatenate([(1 - fr) * (1 - fc), (1 - fr) * fc, fr * (1 - fc), fr * fc]) * np.tile(weight, 4)
    acc = np.bincount(index, w, minlength=n_cases * padded * padded).reshape(n_cases, padded, padded)
    lines = blur(acc[:, 1 : size + 1, 1 : size + 1].astype(np.float32), sigma_px)
    return lines * (math.sqrt(2 * math.pi) * sigma_px)


@lru_cache(maxsize=64)
def tone_curve(gain: float, gamma: float, levels: int = 4096) -> np.ndarray:
    """Lookup table uint8 ``(levels,)``: intensity ``x`` in [0, 1] -> ``255 * clip(gain * x ** gamma)``."""
    x = np.linspace(0.0, 1.0, levels)
    return np.clip(np.rint(255.0 * gain * x**gamma), 0, 255).astype(np.uint8)


def acquire(
    image: np.ndarray, noise: np.ndarray, blur_px: float, noise_std: float, gain: float, gamma: float
) -> np.ndarray:
    """Acquisition shared by both federations: ``image (C, N, H, W)`` float in [0, 1] -> ``uint8 (N, C, H, W)``.

    Blur (``blur_px`` pixels), noise from standard normals ``noise (N, K, C, H, W)`` times ``noise_std``
    (K = 1: additive; K = 2: Rician, the magnitude of a complex Gaussian, as in MR), then the site's
    tone curve ``gain * x ** gamma`` (brightness and contrast).
    """
    image = blur(image, blur_px)
    noise = np.moveaxis(noise, 0, 2) * np.float32(noise_std)  # (K, C, N, H, W)
    image = image + noise[0] if len(noise) == 1 else np.sqrt((image + noise[0]) ** 2 + noise[1] ** 2)
    lut = tone_curve(gain, gamma)
    out = lut[(np.clip(image, 0.0, 1.0) * (len(lut) - 1) + 0.5).astype(np.intp)]
    return np.ascontiguousarray(out.transpose(1, 0, 2, 3))


def colour(rgb: Sequence[float]) -> np.ndarray:
    """An RGB colour as a paint value float32 ``(3, 1, 1, 1)``."""
    return np.asarray(rgb, dtype=np.float32)[:, None, None, None]


def per_case(values: Sequence[float]) -> np.ndarray:
    """One number per case as float32 ``(N, 1, 1)``, to broadcast against ``(N, H, W)``."""
    return np.asarray(values, dtype=np.float32)[:, None, None]
