"""The built-in federation ``synthetic-prostate`` (built by ``fedseg.data.synthetic``): high similarity between sites.

Its site styles (``PROSTATE_STYLES``: acquisition only), the pelvic anatomy all sites share (``draw_pelvis``) and the
drawing and rendering of its cases (``draw_slice``, ``render_slices``).

Grayscale T2-like axial MR slices of the male pelvis: air, subcutaneous fat,
pelvic muscles, femoral heads and pubic bones (dark cortex, medium marrow), the
levator sling, a fatty pelvic cavity holding the bladder (bright fluid, present
in about half of the slices), the rectum (dark wall and lumen) and the prostate
(dark capsule, bright peripheral zone, darker nodular transition zone). Label 1 =
prostate, region ``prostate = {1}``; every slice shows the prostate, with
per-case size (apex/base slices are smaller), shape, tilt and position, and a
per-patient capsule and peripheral-zone contrast. Anatomy is drawn from *one*
distribution for all sites and annotated the same way; sites differ only in
acquisition:

======  =====  =====  ==========================  =====  =====  ====
site    gain   gamma  bias std, brighter side     coil   noise  blur
======  =====  =====  ==========================  =====  =====  ====
site1   1.10   1.00   0.08, posterior             0.45   0.015  0.4
site2   1.30   0.90   0.06, right                 --     0.020  0.6
site3   0.95   1.15   0.10, anterior (weak)       0.30   0.012  0.3
site4   1.40   1.00   0.05, left                  --     0.025  0.5
site5   1.20   1.25   0.07, anterior              --     0.015  0.5
site6   1.35   0.85   0.09, --                    --     0.015  0.4
======  =====  =====  ==========================  =====  =====  ====

(gain and gamma: the tone curve ``gain * x ** gamma``, saturating at white; bias:
a smooth multiplicative field; coil: the log-intensity of an endorectal-coil hot
spot around the rectum; noise: Rician, in units of full scale; blur in pixels
at 64 x 64.)

Drawn with the shared machinery of ``fedseg.data.synthetic_draw``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from fedseg.data.synthetic_draw import (
    OUTSIDE,
    REF_PX,
    Blob,
    Blobs,
    acquire,
    draw_waves,
    grid,
    paint,
    per_case,
    random_wobble,
    smooth_field,
)


@dataclass(frozen=True)
class ProstateStyle:
    """Acquisition settings of one prostate MR site (the anatomy is shared by all sites).
    Intensities in [0, 1], ``bias_gradient`` per grid unit, blur in pixels of a 64 x 64 image."""

    gain: float  # brightness multiplier (tone curve, saturates at 1)
    gamma: float  # contrast curve (tone curve)
    bias_strength: float  # std of the smooth log bias field
    bias_gradient: tuple[float, float]  # linear log-bias across the image (coil position)
    coil: float  # endorectal coil hot spot (log-intensity at the rectum)
    noise: float  # Rician noise std
    blur_px: float


PROSTATE_STYLES = (
    ProstateStyle(
        gain=1.1, gamma=1.0, bias_strength=0.08, bias_gradient=(0.0, 0.1), coil=0.45, noise=0.015, blur_px=0.4
    ),
    ProstateStyle(
        gain=1.3, gamma=0.9, bias_strength=0.06, bias_gradient=(0.12, 0.0), coil=0.0, noise=0.02, blur_px=0.6
    ),
    ProstateStyle(
        gain=0.95, gamma=1.15, bias_strength=0.1, bias_gradient=(0.0, -0.05), coil=0.3, noise=0.012, blur_px=0.3
    ),
    ProstateStyle(
        gain=1.4, gamma=1.0, bias_strength=0.05, bias_gradient=(-0.1, 0.05), coil=0.0, noise=0.025, blur_px=0.5
    ),
    ProstateStyle(
        gain=1.2, gamma=1.25, bias_strength=0.07, bias_gradient=(0.05, -0.12), coil=0.0, noise=0.015, blur_px=0.5
    ),
    ProstateStyle(
        gain=1.35, gamma=0.85, bias_strength=0.09, bias_gradient=(0.0, 0.0), coil=0.0, noise=0.015, blur_px=0.4
    ),
)

# T2-weighted tissue signal in [0, 1] before the bias field and the site's tone curve
T2 = {
    "air": 0.015,
    "fat": 0.55,
    "muscle": 0.21,
    "cortex": 0.06,
    "marrow": 0.35,
    "bladder": 0.68,
    "wall": 0.15,
    "rectum": 0.08,
    "tz": 0.28,  # capsule and peripheral zone: per patient, see Pelvis
}


@dataclass(frozen=True)
class Pelvis:
    """One axial slice's anatomy (outlines in grid units, anterior = top of the image) and the few
    tissue contrasts that vary between patients."""

    body: Blob
    cavity: Blob  # fatty pelvic cavity inside the muscles
    bones: tuple[Blob, ...]  # femoral heads (left, right) and the pubic bones (left, right)
    levator: Blob  # muscular sling around the prostate and the rectum
    bladder: Blob | None
    rectum: Blob
    prostate: Blob
    transition_zone: Blob
    capsule: float  # T2 signal of the capsule (how visible the prostate outline is)
    pz: float  # T2 signal of the peripheral zone


@dataclass(frozen=True)
class SliceRecipe:
    """Everything random about one prostate case."""

    pelvis: Pelvis
    texture: np.ndarray  # (3, 12) plane waves of the tissue texture
    nodules: np.ndarray  # (3, 16) plane waves of the transition-zone texture
    bias: np.ndarray  # (3, 6) plane waves of the bias field
    noise: np.ndarray  # (2, 1, size, size) standard normals (real and imaginary part)


def draw_slice(rng: np.random.Generator, style: ProstateStyle, size: int) -> SliceRecipe:
    """Draw one prostate case of a site (only the acquisition depends on ``style``)."""
    pelvis = draw_pelvis(rng)
    texture, nodules, bias = draw_waves(rng, 12, 5.0), draw_waves(rng, 16, 9.0), draw_waves(rng, 6, 0.8)
    return SliceRecipe(pelvis, texture, nodules, bias, rng.standard_normal((2, 1, size, size), dtype=np.float32))


def draw_pelvis(rng: np.random.Generator) -> Pelvis:
    """Draw the per-case anatomy, from the same distribution for every site."""
    n = lambda sd, mean=0.0: rng.normal(mean, sd)  # noqa: E731
    body_scale = math.exp(n(0.05))
    body = Blob((n(0.02), n(0.02, 0.05)), (1.0 * body_scale, 0.82 * body_scale), n(0.03), **random_wobble(rng, 3, 0.03))
    cavity_center = (n(0.02), n(0.02, 0.1))
    cavity_radii = (rng.uniform(0.46, 0.54), rng.uniform(0.46, 0.54))
    cavity = Blob(cavity_center, cavity_radii, 0.0, **random_wobble(rng, 3, 0.05))
    bone_r = rng.uniform(0.16, 0.21)
    femoral = [
        Blob(
            (side * rng.uniform(0.64, 0.72), rng.uniform(0.0, 0.12)),
            (bone_r, bone_r * rng.uniform(1.0, 1.2)),
            **random_wobble(rng, 2, 0.05),
        )
        for side in (-1.0, 1.0)
    ]
    pubis_y, pubis_r = cavity.center[1] - cavity.radii[1] - rng.uniform(0.06, 0.1), rng.uniform(0.07, 0.09)
    pubic = [
        Blob((side * rng.uniform(0.09, 0.12), pubis_y), (pubis_r, 1.2 * pubis_r), side * 0.4) for side in (-1.0, 1.0)
    ]
    size = rng.uniform(0.65, 1.15)  # apex and base slices are smaller than mid-gland
    rx, ry = 0.3 * size * math.exp(n(0.06)), 0.24 * size * math.exp(n(0.06))
    cx, cy = n(0.04), n(0.05, 0.02)
    prostate = Blob((cx, cy), (rx, ry), n(0.12), **random_wobble(rng, 4, 0.06))
    tz_scale = rng.uniform(0.55, 0.75)
    tz = Blob((cx, cy - 0.3 * ry), (rx * tz_scale, ry * tz_scale), prostate.angle, **random_wobble(rng, 3, 0.1))
    rectum = Blob(
        (cx + n(0.03), cy + ry + rng.uniform(0.12, 0.18)),
        (rng.uniform(0.14, 0.2), rng.uniform(0.09, 0.13)),
        n(0.1),
        **random_wobble(rng, 3, 0.08),
    )
    top, bottom = cy - 0.6 * ry, rectum.center[1] + rectum.radii[1]
    levator = Blob(
        (cx, 0.5 * (top + bottom)),
        (max(rx, rectum.radii[0]) + 0.1, 0.5 * (bottom - top) + 0.08),
        0.0,
        **random_wobble(rng, 2, 0.05),
    )
    bladder = None
    if rng.random() < 0.5:
        b_rx, b_ry = rng.uniform(0.25, 0.42), rng.uniform(0.12, 0.25)
        b_center = (cx + n(0.04), cy - ry - b_ry * rng.uniform(0.6, 1.0))
        bladder = Blob(b_center, (b_rx, b_ry), n(0.1), **random_wobble(rng, 3, 0.05))
    return Pelvis(
        body,
        cavity,
        (*femoral, *pubic),
        levator,
        bladder,
        rectum,
        prostate,
        tz,
        capsule=rng.uniform(0.12, 0.26),
        pz=rng.uniform(0.34, 0.48),
    )


def render_slices(recipes: Sequence[SliceRecipe], style: ProstateStyle, size: int) -> tuple[np.ndarray, np.ndarray]:
    """A batch of prostate cases: ``(images uint8 (N, 1, size, size), labels uint8 (N, size, size))``."""
    pelvis = [r.pelvis for r in recipes]
    organ = lambda get: Blobs.of([get(p) for p in pelvis])  # noqa: E731
    u, v = grid(size)
    px = 2.0 / size
    edge = 0.6 * px
    texture = 0.03 * smooth_field(np.stack([r.texture for r in recipes]), size)
    image = np.full((1, len(recipes), size, size), T2["air"], dtype=np.float32)
    paint(image, organ(lambda p: p.body), [(1.0, T2["fat"] + texture), (0.87, T2["muscle"] + 2 * texture)], edge)
    paint(image, organ(lambda p: p.cavity), T2["fat"] + texture, edge)
    for k in range(len(pelvis[0].bones)):
        paint(image, organ(lambda p: p.bones[k]), [(1.0, T2["cortex"]), (0.75, T2["marrow"] + 2 * texture)], edge)
    paint(image, organ(lambda p: p.levator), [(1.0, T2["muscle"] + texture), (0.88, T2["fat"] + texture)], edge)
    paint(image, organ(lambda p: p.bladder or OUTSIDE), [(1.08, T2["wall"]), (1.0, T2["bladder"])], edge)
    paint(image, organ(lambda p: p.rectum), [(1.0, T2["wall"]), (0.6, T2["rectum"] + texture)], edge)
    # prostate: dark capsule, bright peripheral zone, darker nodular transition zone
    prostate = organ(lambda p: p.prostate)
    gland = 1.0 - 1.5 * REF_PX / np.sqrt(prostate.rx * prostate.ry)  # (N, 1, 1): inside the capsule
    capsule, pz = per_case([p.capsule for p in pelvis]), per_case([p.pz for p in pelvis])
    paint(image, prostate, [(1.0, capsule), (gland, pz + texture)], edge)
    nodules = T2["tz"] + 0.06 * smooth_field(np.stack([r.nodules for r in recipes]), size)
    gland_blobs = Blobs.of([p.prostate.scaled(float(g)) for p, g in zip(pelvis, gland.ravel())])
    paint(image, organ(lambda p: p.transition_zone), nodules, 1.5 * REF_PX, within=gland_blobs)
    # acquisition: a smooth multiplicative bias field (+ endorectal coil hot spot), noise, tone curve
    log_bias = style.bias_strength * smooth_field(np.stack([r.bias for r in recipes]), size)
    log_bias += style.bias_gradient[0] * u + style.bias_gradient[1] * v
    coil = organ(lambda p: Blob(p.rectum.center, (0.35, 0.35))).ratio(size)
    image *= np.exp(log_bias + style.coil * np.exp(-0.5 * coil * coil))
    noise = np.stack([r.noise for r in recipes])
    images = acquire(image, noise, style.blur_px * REF_PX / px, style.noise, style.gain, style.gamma)
    return images, prostate.mask(size).astype(np.uint8)
