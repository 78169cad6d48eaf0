"""The built-in federation ``synthetic-retina`` (built by ``fedseg.data.synthetic``): low similarity between sites.

Its site styles (``RETINA_STYLES``), the drawing and rendering of its cases (``draw_fundus``, ``render_fundus``) and
the sites' annotation protocols (``annotate_fundus``).

RGB optic-disc crops of fundus photographs. Label 1 = neuroretinal rim,
2 = cup; regions ``disc = {1, 2}``, ``cup = {2}``. Every case varies the disc
size (about +-10 %), position, tilt and outline, the cup-to-disc ratio, the eye
(left/right: which side the cup and the vessel arcades bend towards) and the
vessel tree. Sites differ the way the real sources (Drishti-GS, RIGA x3,
RIM-ONE, REFUGE) differ: the circular field of view and how much black border
it leaves, zoom (disc radius) and disc position, colour tint, brightness and
gamma, vignetting, blur, noise, vessel width/contrast, how sharp the pale cup
edge is, and the *annotation protocol* of the cup (scaled and/or reshaped
relative to the visible pallor, because each source had its own experts):

======  ==================  ===========  ==========  ====================================
site    look                border       disc r      cup annotation
======  ==================  ===========  ==========  ====================================
site1   bright orange-red   none         0.42        follows pallor, 15 % larger
site2   dark red-brown,     wide circle  0.30        smooth ellipse, 5 % smaller
        low contrast
site3   pale yellow, blurry corners      0.34        vertical ellipse (x1.2)
site4   orange, noisy       left side    0.31        tight: 15 % smaller
site5   greyish pink,       none         0.50        vertical ellipse (x1.3), 10 % smaller
        thick dark vessels
site6   dark olive-brown,   right side   0.34        follows pallor, 5 % larger
        bright disc
======  ==================  ===========  ==========  ====================================

(disc radius in half-widths of the image.) The disc outline is annotated on the
visible edge everywhere (site5 annotates it 4 % larger).

Drawn with the shared machinery of ``fedseg.data.synthetic_draw``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from fedseg.data.synthetic_draw import (
    REF_PX,
    Blob,
    Blobs,
    acquire,
    colour,
    draw_waves,
    grid,
    paint,
    per_case,
    random_wobble,
    smooth_field,
    soft_inside,
    splat_lines,
)

RIM_MIN = 0.85  # an annotated cup stays inside this fraction of the annotated disc


@dataclass(frozen=True)
class RetinaStyle:
    """What one retina site looks like and how its experts annotate. Lengths in grid units
    (image half-width = 1), colours RGB in [0, 1], blur and edge widths in pixels of a 64 x 64
    image (they scale with ``image_size``)."""

    fov_center: tuple[float, float]  # circular field of view (black outside)
    fov_radius: float
    disc_center: tuple[float, float]  # mean disc position
    disc_jitter: float  # std of the disc position
    disc_radius: float  # mean disc radius
    cdr: float  # mean cup-to-disc radius ratio (visible pallor)
    fundus_rgb: tuple[float, float, float]
    disc_rgb: tuple[float, float, float]
    cup_rgb: tuple[float, float, float]
    gain: float  # brightness (tone curve ``gain * x ** gamma``, saturates at white)
    gamma: float  # contrast (> 1 darkens mid-tones)
    vignette: float  # darkening towards the field-of-view edge
    texture: float  # strength of the choroidal texture
    blur_px: float
    noise: float  # additive Gaussian noise std, [0, 1] units
    vessel_width: float  # main vessel half-width, grid units
    vessel_contrast: float  # 0 = invisible, 1 = black
    n_vessels: int  # main trunks (+-1 per case), each with one branch
    cup_edge_px: float  # ramp width of the visible cup pallor
    cup_annot_scale: float = 1.0  # annotated cup radius / visible cup radius
    cup_annot_aspect: float = 1.0  # extra vertical stretch of the annotated cup
    cup_annot_smooth: bool = False  # annotate the cup as a plain ellipse
    disc_annot_scale: float = 1.0


RETINA_STYLES = (
    RetinaStyle(  # site1, Drishti-GS-like: centred large disc, bright orange, generous cup
        fov_center=(0.0, 0.0),
        fov_radius=3.0,
        disc_center=(0.0, 0.0),
        disc_jitter=0.05,
        disc_radius=0.42,
        cdr=0.55,
        fundus_rgb=(0.78, 0.36, 0.16),
        disc_rgb=(0.95, 0.66, 0.42),
        cup_rgb=(0.99, 0.88, 0.70),
        gain=1.0,
        gamma=1.0,
        vignette=0.15,
        texture=0.06,
        blur_px=0.6,
        noise=0.012,
        vessel_width=0.035,
        vessel_contrast=0.45,
        n_vessels=4,
        cup_edge_px=1.5,
        cup_annot_scale=1.15,
    ),
    RetinaStyle(  # site2, RIGA BinRushed-like: small field of view, dark red-brown, low contrast
        fov_center=(0.0, 0.0),
        fov_radius=0.98,
        disc_center=(0.12, 0.0),
        disc_jitter=0.08,
        disc_radius=0.30,
        cdr=0.45,
        fundus_rgb=(0.55, 0.20, 0.10),
        disc_rgb=(0.80, 0.42, 0.24),
        cup_rgb=(0.88, 0.58, 0.40),
        gain=0.85,
        gamma=1.3,
        vignette=0.45,
        texture=0.05,
        blur_px=0.8,
        noise=0.015,
        vessel_width=0.03,
        vessel_contrast=0.35,
        n_vessels=4,
        cup_edge_px=2.0,
        cup_annot_scale=0.95,
        cup_annot_smooth=True,
    ),
    RetinaStyle(  # site3, RIGA Magrabia-like: pale yellow, blurry, dark corners
        fov_center=(0.05, 0.0),
        fov_radius=1.22,
        disc_center=(0.0, 0.05),
        disc_jitter=0.08,
        disc_radius=0.34,
        cdr=0.5,
        fundus_rgb=(0.85, 0.60, 0.22),
        disc_rgb=(0.97, 0.82, 0.50),
        cup_rgb=(1.0, 0.95, 0.78),
        gain=1.0,
        gamma=0.85,
        vignette=0.3,
        texture=0.04,
        blur_px=1.4,
        noise=0.01,
        vessel_width=0.03,
        vessel_contrast=0.3,
        n_vessels=4,
        cup_edge_px=2.0,
        cup_annot_aspect=1.2,
        cup_annot_smooth=True,
    ),
    RetinaStyle(  # site4, RIGA MESSIDOR-like: orange, noisy, field-of-view edge on the left
        fov_center=(0.55, 0.0),
        fov_radius=1.45,
        disc_center=(0.1, 0.0),
        disc_jitter=0.1,
        disc_radius=0.31,
        cdr=0.5,
        fundus_rgb=(0.72, 0.30, 0.08),
        disc_rgb=(0.92, 0.60, 0.30),
        cup_rgb=(0.97, 0.80, 0.55),
        gain=0.95,
        gamma=1.1,
        vignette=0.35,
        texture=0.08,
        blur_px=0.5,
        noise=0.035,
        vessel_width=0.03,
        vessel_contrast=0.45,
        n_vessels=5,
        cup_edge_px=1.5,
        cup_annot_scale=0.85,
    ),
    RetinaStyle(  # site5, RIM-ONE-like: close crop, greyish pink, thick dark vessels, oval cup
        fov_center=(0.0, 0.0),
        fov_radius=3.0,
        disc_center=(0.0, 0.0),
        disc_jitter=0.04,
        disc_radius=0.50,
        cdr=0.5,
        fundus_rgb=(0.62, 0.40, 0.36),
        disc_rgb=(0.82, 0.66, 0.60),
        cup_rgb=(0.92, 0.84, 0.80),
        gain=1.0,
        gamma=1.15,
        vignette=0.1,
        texture=0.1,
        blur_px=0.7,
        noise=0.02,
        vessel_width=0.055,
        vessel_contrast=0.6,
        n_vessels=5,
        cup_edge_px=1.0,
        cup_annot_scale=0.9,
        cup_annot_aspect=1.3,
        cup_annot_smooth=True,
        disc_annot_scale=1.04,
    ),
    RetinaStyle(  # site6, REFUGE-like: dark olive-brown, bright disc, edge on the right, varied position
        fov_center=(-0.5, 0.0),
        fov_radius=1.4,
        disc_center=(-0.1, -0.05),
        disc_jitter=0.14,
        disc_radius=0.34,
        cdr=0.45,
        fundus_rgb=(0.42, 0.26, 0.08),
        disc_rgb=(0.90, 0.72, 0.40),
        cup_rgb=(0.98, 0.90, 0.66),
        gain=1.0,
        gamma=1.0,
        vignette=0.3,
        texture=0.05,
        blur_px=0.6,
        noise=0.012,
        vessel_width=0.03,
        vessel_contrast=0.4,
        n_vessels=4,
        cup_edge_px=1.2,
        cup_annot_scale=1.05,
    ),
)

# Which real collection each retina site is modelled on (site-level metadata ``collection``): sites 2-4
# on the three RIGA sub-collections (BinRushed, Magrabia, MESSIDOR), sites 1, 5, 6 on Drishti-GS,
# RIM-ONE and REFUGE.
RETINA_COLLECTIONS = ("other", "riga", "riga", "riga", "other", "other")


@dataclass(frozen=True)
class OpticDisc:
    """One eye's optic nerve head: disc and visible cup outlines, field of view, eye side."""

    disc: Blob
    cup: Blob
    fov: Blob
    temporal: float  # +1 if the temporal side (macula) is to the right, -1 if to the left


@dataclass(frozen=True)
class FundusRecipe:
    """Everything random about one retina case."""

    eye: OpticDisc
    texture: np.ndarray  # (3, 12) plane waves of the choroidal texture
    vessels: np.ndarray  # (V, 4) curves: theta0, slope, r0, intensity (see ``vessel_maps``)
    noise: np.ndarray  # (1, 3, size, size) standard normals


def draw_fundus(rng: np.random.Generator, style: RetinaStyle, size: int) -> FundusRecipe:
    """Draw one retina case of a site."""
    eye = draw_optic_disc(rng, style)
    texture = draw_waves(rng, 12, 4.0)
    vessels = draw_vessels(rng, style, eye)
    return FundusRecipe(eye, texture, vessels, rng.standard_normal((1, 3, size, size), dtype=np.float32))


def draw_optic_disc(rng: np.random.Generator, style: RetinaStyle) -> OpticDisc:
    """Draw the per-case geometry: disc size/tilt/outline/position, cup-to-disc ratio, eye side."""
    temporal = 1.0 if rng.random() < 0.5 else -1.0
    r = style.disc_radius * min(max(math.exp(rng.normal(0.0, 0.1)), 0.8), 1.25)
    radii = (r, r * rng.uniform(1.02, 1.15))  # discs are vertically oval
    fov = Blob(style.fov_center, (style.fov_radius * rng.uniform(0.98, 1.02),) * 2)
    x, y = (
        min(max(c + rng.normal(0.0, style.disc_jitter), -0.92 + radii[1]), 0.92 - radii[1]) for c in style.disc_center
    )
    # keep the whole disc (and a margin) inside the field of view
    dx, dy = x - fov.center[0], y - fov.center[1]
    shrink = min(1.0, (fov.radii[0] - 1.15 * radii[1]) / max(math.hypot(dx, dy), 1e-9))
    x, y = fov.center[0] + dx * shrink, fov.center[1] + dy * shrink
    disc = Blob((x, y), radii, rng.normal(0.0, 0.12), **random_wobble(rng, 3, 0.03))
    cdr = min(max(rng.normal(style.cdr, 0.08), 0.3), 0.72)
    cup_center = (x + temporal * r * rng.normal(0.1, 0.05), y + r * rng.normal(0.0, 0.04))
    cup_radii = (cdr * radii[0], cdr * radii[1] * rng.uniform(1.0, 1.12))
    cup = Blob(cup_center, cup_radii, rng.normal(0.0, 0.15), **random_wobble(rng, 3, 0.06))
    return OpticDisc(disc, cup, fov, temporal)


def draw_vessels(rng: np.random.Generator, style: RetinaStyle, eye: OpticDisc) -> np.ndarray:
    """Vessel curves ``(V, 4)``: trunks radiating from the cup (the two main arcades bend towards the
    temporal side, the others are fainter), each with one fainter branch. A row ``(theta0, slope, r0,
    intensity)`` is the polar curve ``phi(r) = theta0 + slope * (r - r0)``, ``r > r0``, around the cup centre."""
    curves = []
    for i in range(style.n_vessels + int(rng.integers(-1, 2))):
        if i < 2:  # superior and inferior arcades
            theta0 = (-0.5 if i == 0 else 0.5) * math.pi + rng.normal(0.0, 0.2)
            slope = -eye.temporal * math.copysign(1.0, math.sin(theta0)) * rng.uniform(0.4, 0.9)
        else:  # smaller nasal and temporal trunks
            theta0, slope = rng.uniform(0.0, 2 * math.pi), rng.normal(0.0, 0.3)
        r0, r_b = 0.3 * eye.cup.radii[0], rng.uniform(0.25, 0.8)
        bend = (1.0 if rng.random() < 0.5 else -1.0) * rng.uniform(0.5, 1.5)
        curves += [(theta0, slope, r0, 1.0 if i < 2 else 0.7), (theta0 + slope * (r_b - r0), slope + bend, r_b, 0.5)]
    return np.asarray(curves)


def vessel_maps(recipes: Sequence[FundusRecipe], style: RetinaStyle, size: int) -> np.ndarray:
    """Vessel maps float32 ``(N, size, size)`` in ``[0, 1]``: every curve sampled up to the farthest image
    corner with arc steps of at most one pixel, fading away from the disc, with a Gaussian cross-section
    of half-width ``style.vessel_width`` grid units."""
    curves = np.concatenate([r.vessels for r in recipes])
    case = np.repeat(np.arange(len(recipes)), [len(r.vessels) for r in recipes])
    center = np.array([r.eye.cup.center for r in recipes])[case]  # (V, 2)
    r_end = np.hypot(1.0 + np.abs(center[:, 0]), 1.0 + np.abs(center[:, 1]))  # the farthest image corner
    theta0, slope, r0, intensity = curves.T
    px = 2.0 / size
    count = (np.maximum(r_end - r0, 0.0) / px * np.sqrt(1.0 + (r_end * slope) ** 2)).astype(np.intp) + 2
    point = np.repeat(np.arange(len(curves)), count)  # the curve of every sample point
    t = (np.arange(point.size) - (np.cumsum(count) - count)[point]) / (count[point] - 1.0)
    theta0, slope, r0, r_end, intensity, count, case, center = (
        a[point] for a in (theta0, slope, r0, r_end, intensity, count, case, center)
    )
    r = r0 + (r_end - r0) * t
    phi = theta0 + slope * (r - r0)
    arc_px = (r_end - r0) / (count - 1) / px * np.sqrt(1.0 + (r * slope) ** 2)
    weight = arc_px * intensity * np.clip(1.0 - 0.25 * r, 0.4, 1.0)
    x, y = center[:, 0] + r * np.cos(phi), center[:, 1] + r * np.sin(phi)
    lines = splat_lines(x, y, weight, case, len(recipes), style.vessel_width / math.sqrt(2) / px, size)
    return np.minimum(lines, 1.0)


def render_fundus(recipes: Sequence[FundusRecipe], style: RetinaStyle, size: int) -> tuple[np.ndarray, np.ndarray]:
    """A batch of retina cases: ``(images uint8 (N, 3, size, size), labels uint8 (N, size, size))``."""
    eyes = [r.eye for r in recipes]
    u, _ = grid(size)
    px = 2.0 / size
    fov, disc, cup = (Blobs.of([getattr(e, part) for e in eyes]) for part in ("fov", "disc", "cup"))
    temporal = per_case([e.temporal for e in eyes])
    # background fundus: choroidal texture, vignetting, darker macula on the temporal side
    texture = smooth_field(np.stack([r.texture for r in recipes]), size)
    shade = (1.0 + style.texture * texture) * (1.0 - style.vignette * np.minimum(fov.ratio(size) ** 2, 1.0))
    macula = Blobs.of(
        [
            Blob((e.disc.center[0] + e.temporal * 5 * e.disc.radii[0], e.disc.center[1]), (1.5 * e.disc.radii[0],) * 2)
            for e in eyes
        ]
    ).ratio(size)
    image = colour(style.fundus_rgb) * (shade * (1.0 - 0.35 * np.exp(-0.5 * macula * macula)))
    # disc (slightly brighter on the temporal side), then the pale cup with a site-specific soft edge
    tilt = 1.0 + (0.08 * temporal / disc.rx) * (u - disc.cx)
    paint(image, disc, colour(style.disc_rgb) * tilt, 0.6 * px)
    paint(image, cup, colour(style.cup_rgb), style.cup_edge_px * REF_PX)
    # vessels absorb green and blue more than red; black outside the field of view
    image *= 1.0 - (style.vessel_contrast * vessel_maps(recipes, style, size)) * colour((0.55, 0.9, 0.9))
    image *= soft_inside(fov.signed_distance(size), px)
    noise = np.stack([r.noise for r in recipes])
    images = acquire(image, noise, style.blur_px * REF_PX / px, style.noise, style.gain, style.gamma)
    return images, annotate_fundus(eyes, style, size)


def annotate_fundus(eyes: Sequence[OpticDisc], style: RetinaStyle, size: int) -> np.ndarray:
    """Label maps ``uint8 (N, size, size)``: 0 background, 1 rim, 2 cup, per the site's annotation protocol."""
    disc = [e.disc.scaled(style.disc_annot_scale) for e in eyes]
    cups = [(e.cup.smooth() if style.cup_annot_smooth else e.cup) for e in eyes]
    cup = Blobs.of([c.scaled(style.cup_annot_scale, style.cup_annot_scale * style.cup_annot_aspect) for c in cups])
    rim = Blobs.of([d.scaled(RIM_MIN) for d in disc])  # annotators always leave a rim around the cup
    return Blobs.of(disc).mask(size).astype(np.uint8) + (cup.mask(size) & rim.mask(size)).astype(np.uint8)
