"""``synthetic-brats``: a built-in 3D federation modelled on FeTS2022 (BraTS gliomas, real institutions).

Every case is a skull-stripped brain MRI with four channels, in this order ``t1, t1ce, t2, flair``
(``MODALITIES``), as an ``int16`` array ``(4, X, Y, Z)`` in arbitrary scanner units (background is
exactly 0, as in BraTS), and a ``uint8`` label map ``(X, Y, Z)`` with the BraTS label values

- 0 background, 1 necrotic / non-enhancing tumour core, 2 peritumoral edema, 4 enhancing tumour;
- regions ``WT = [1, 2, 4]`` (whole tumour) ⊃ ``TC = [1, 4]`` (tumour core) ⊃ ``ET = [4]``.

Axes follow NIfTI storage: ``X`` left-right, ``Y`` posterior-anterior, ``Z`` inferior-superior (axial
slices). Anatomy is drawn on a normalized grid ``[-1, 1]^3`` that spans a field of view of ``FOV_MM``
= 240 mm per axis, so a seed gives the same anatomy at every ``image_size``: an isotropic site has
``image_size`` voxels per axis of ``240 / image_size`` mm (48 -> 5 mm, 240 -> BraTS's 1 mm); a site
with thick slices (``slice_factor`` k > 1) has ``round(image_size / k)`` slices along ``Z`` (at least
``MIN_SLICES``), each ``240 / n_slices`` mm thick. ``Case.spacing`` holds the voxel size in mm per axis
``(sx, sy, sz)``; ``fedseg data synth`` writes it into the NIfTI affine.

Each case is drawn from its own random stream, seeded by ``(seed, federation, site, case)``
(``fedseg.data.synthetic.case_rng``): ``scale`` adds or removes cases at the end of a site but never
changes the others. Cases are generated lazily, when ``Case.arrays()`` is called (a picklable loader;
calling it twice gives identical arrays), so building the federation is instant and memory is spent
only on the cases a run loads.

A case: a brain (wobbly ellipsoid: grey-matter cortex, white matter, two lateral ventricles of CSF)
with one tumour in a hemisphere: edema (label 2) around a core (label 1) holding the enhancing
tumour (label 4). The edema and the core are wobbly ellipsoids clipped to the brain, the core clipped
to the edema, the enhancing tumour is part of the core; so ET ⊂ TC ⊂ WT holds voxel by voxel.

- **HGG** (high grade): an irregular enhancing rim (bright on t1ce) around a necrotic centre (dark on
  t1 and t1ce, bright on t2), with wide edema bright on flair and t2.
- **LGG** (low grade): a homogeneous non-enhancing core (bright on t2 and flair), usually no enhancing
  tumour (a small enhancing focus in 35 % of cases), a thin margin of edema with less flair contrast.

Institutions (``INSTITUTIONS``) are unbalanced as FeTS2022's partitioning 1 (two large ones, many
small ones; institutions 12-15 of FeTS own only LGG cases, 3 and 4 both grades) and differ in
acquisition: per-modality intensity scale, contrast (gamma), bias field, Rician noise, blur, slice
thickness. At ``scale`` 1 there are 55 cases (``max(MIN_CASES_PER_SITE, round(scale * cases))`` per site):

=======  =====  ======  =============  ==========================  =====  =====  =====  =======
site     cases  grade   LGG cases      intensity scale (t1, t1ce,  gamma  bias   noise  blur mm
                                       t2, flair)
=======  =====  ======  =============  ==========================  =====  =====  =====  =======
site1    14     HGG     --             1000, 1100, 1200, 900       1.00   0.10   0.020  1.0
site2    3      HGG     --             600, 700, 800, 650          0.90   0.15   0.030  1.5
site3    4      HGG     every 2nd      2500, 2800, 3000, 2300      1.10   0.08   0.025  1.0
site4    6      HGG     every 3rd      900, 1000, 1500, 1100       1.00   0.20   0.020  2.0  (Z x2)
site5    3      HGG     --             400, 450, 500, 420          0.85   0.12   0.040  1.5  (Z x3)
site6    10     HGG     --             1800, 2000, 2100, 1700      1.05   0.10   0.015  1.0
site7    3      HGG     --             1200, 1300, 1400, 1200      1.20   0.25   0.030  2.5  (Z x2)
site8    3      LGG     all            700, 750, 900, 800          0.95   0.10   0.020  1.0
site9    3      LGG     all            1500, 1600, 1800, 1400      1.10   0.15   0.030  1.5  (Z x2)
site10   3      LGG     all            3000, 3200, 3500, 2800      0.90   0.12   0.025  1.0
site11   3      LGG     all            1000, 1000, 1300, 1000      1.00   0.18   0.035  2.0
=======  =====  ======  =============  ==========================  =====  =====  =====  =======

(gamma: the tone curve ``x ** gamma`` on intensities in [0, 1] before scaling; bias: std of the log of a
smooth multiplicative field; noise: Rician, in units of full scale; blur: Gaussian sigma in mm; Z xk:
slices k times thicker than the in-plane voxel size.)

Metadata: site-level ``grade`` (``federation.yaml`` ``sites:``) is the site's majority grade (``HGG`` or
``LGG``; sites 3 and 4 are mostly HGG with some LGG cases); every case carries its own case-level
``grade`` (``cases.csv``). Neither is a model input.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from scipy.ndimage import gaussian_filter

from fedseg.data.federation import Case, Federation, FederationError, Regions, Site
from fedseg.data.synthetic import JobMap, case_rng

SYNTHETIC_BRATS = "synthetic-brats"
FED_CODE = 2  # the federation's entry in each case's seed sequence (0, 1: the 2D built-ins)
MODALITIES = ("t1", "t1ce", "t2", "flair")
REGIONS = {"WT": [1, 2, 4], "TC": [1, 4], "ET": [4]}
LABEL_NAMES = {0: "background", 1: "necrotic core", 2: "edema", 4: "enhancing tumour"}
NECROTIC, EDEMA, ENHANCING = 1, 2, 4
FOV_MM = 240.0  # the field of view along every axis, mm
MIN_CASES_PER_SITE = 3
MIN_IMAGE_SIZE = 8
MIN_SLICES = 4
INT16_MAX = 32767


@dataclass(frozen=True)
class Institution:
    """One site of ``synthetic-brats``: its size at scale 1, grade mix and acquisition (see the module table)."""

    cases: int
    lgg_share: float  # fraction of LGG cases: 0 HGG only, 1 LGG only; case c is LGG when the share "ticks" at c
    intensity: tuple[float, float, float, float]  # full-scale intensity per modality (t1, t1ce, t2, flair)
    gamma: float
    bias: float
    noise: float
    blur_mm: float
    slice_factor: int = 1  # Z spacing / in-plane spacing

    @property
    def grade(self) -> str:
        """The site's majority grade: ``HGG`` or ``LGG``."""
        return "LGG" if self.lgg_share > 0.5 else "HGG"

    def is_lgg(self, case_index: int) -> bool:
        """Whether case ``case_index`` is LGG: ``floor((c + 1) * share) > floor(c * share)``, so every
        ``1 / share``-th case is (a share of 1/2 gives cases 1, 3, 5...), the same at every ``scale``."""
        return math.floor((case_index + 1) * self.lgg_share) > math.floor(case_index * self.lgg_share)


INSTITUTIONS: tuple[Institution, ...] = (
    Institution(14, 0.0, (1000, 1100, 1200, 900), 1.00, 0.10, 0.020, 1.0),
    Institution(3, 0.0, (600, 700, 800, 650), 0.90, 0.15, 0.030, 1.5),
    Institution(4, 1 / 2, (2500, 2800, 3000, 2300), 1.10, 0.08, 0.025, 1.0),
    Institution(6, 1 / 3, (900, 1000, 1500, 1100), 1.00, 0.20, 0.020, 2.0, slice_factor=2),
    Institution(3, 0.0, (400, 450, 500, 420), 0.85, 0.12, 0.040, 1.5, slice_factor=3),
    Institution(10, 0.0, (1800, 2000, 2100, 1700), 1.05, 0.10, 0.015, 1.0),
    Institution(3, 0.0, (1200, 1300, 1400, 1200), 1.20, 0.25, 0.030, 2.5, slice_factor=2),
    Institution(3, 1.0, (700, 750, 900, 800), 0.95, 0.10, 0.020, 1.0),
    Institution(3, 1.0, (1500, 1600, 1800, 1400), 1.10, 0.15, 0.030, 1.5, slice_factor=2),
    Institution(3, 1.0, (3000, 3200, 3500, 2800), 0.90, 0.12, 0.025, 1.0),
    Institution(3, 1.0, (1000, 1000, 1300, 1000), 1.00, 0.18, 0.035, 2.0),
)

# Tissue intensities in [0, 1] of full scale, per modality (t1, t1ce, t2, flair).
TISSUE = {
    "wm": (0.80, 0.78, 0.35, 0.45),
    "gm": (0.60, 0.60, 0.50, 0.55),
    "csf": (0.22, 0.22, 0.95, 0.12),
    "edema_hgg": (0.50, 0.50, 0.80, 0.90),
    "edema_lgg": (0.56, 0.56, 0.68, 0.66),  # LGG: less edema contrast
    "necrosis": (0.28, 0.26, 0.92, 0.50),  # HGG core inside the enhancing rim
    "core_lgg": (0.42, 0.42, 0.86, 0.80),  # LGG: homogeneous, t2/flair bright, not enhancing
    "enhancing": (0.55, 1.00, 0.65, 0.70),
}


def site_sizes(scale: float) -> list[int]:
    """Cases per site: ``max(MIN_CASES_PER_SITE, round(scale * cases))`` (55 in all at scale 1)."""
    return [max(MIN_CASES_PER_SITE, round(scale * inst.cases)) for inst in INSTITUTIONS]


def volume_shape(image_size: int, slice_factor: int) -> tuple[int, int, int]:
    """Voxels per axis ``(X, Y, Z)``: ``image_size`` in-plane, ``round(image_size / slice_factor)`` slices
    (at least ``MIN_SLICES``)."""
    return image_size, image_size, max(MIN_SLICES, round(image_size / slice_factor))


def voxel_spacing(shape: tuple[int, ...]) -> tuple[float, ...]:
    """Voxel size in mm per axis of a volume of ``shape`` spanning ``FOV_MM`` along every axis."""
    return tuple(FOV_MM / n for n in shape)


def build_synthetic_brats(scale: float, image_size: int, seed: int, map_jobs: JobMap | None = None) -> Federation:
    """The ``synthetic-brats`` federation: 11 sites, ``image_size`` voxels in-plane (see the module docstring).

    ``map_jobs`` None: cases are lazy (generated by ``Case.arrays()``); else every case is generated now by
    ``map_jobs(case_job, jobs)`` (``map`` or a process pool's, ``fedseg.data.cache``). The same ``(scale,
    image_size, seed)`` always gives identical arrays. ``FederationError`` for a non-positive ``scale`` or an
    ``image_size`` below ``MIN_IMAGE_SIZE``.
    """
    if not scale > 0:
        raise FederationError(f"synthetic federation scale must be > 0, got {scale}")
    if image_size < MIN_IMAGE_SIZE:
        raise FederationError(f"{SYNTHETIC_BRATS}: image_size must be >= {MIN_IMAGE_SIZE}, got {image_size}")
    jobs = [(seed, s, c, image_size) for s, n_cases in enumerate(site_sizes(scale)) for c in range(n_cases)]
    loaders: list[Callable[[], tuple[np.ndarray, np.ndarray]]]
    if map_jobs is None:
        loaders = [functools.partial(case_job, job) for job in jobs]
    else:
        loaders = [functools.partial(tuple, arrays) for arrays in map_jobs(case_job, jobs)]
    sites: list[Site] = [Site(f"site{s + 1}", [], meta={"grade": inst.grade}) for s, inst in enumerate(INSTITUTIONS)]
    for (_, s, c, _), loader in zip(jobs, loaders):
        inst = INSTITUTIONS[s]
        spacing = voxel_spacing(volume_shape(image_size, inst.slice_factor))
        meta = {"grade": "LGG" if inst.is_lgg(c) else "HGG"}
        sites[s].cases.append(Case(f"site{s + 1}_{c:04d}", loader, meta, spacing))
    return Federation(SYNTHETIC_BRATS, "3d", len(MODALITIES), Regions.from_mapping(REGIONS), sites, dict(LABEL_NAMES))


def case_job(job: tuple[int, int, int, int]) -> tuple[np.ndarray, np.ndarray]:
    """``generate_case(*job)``, ``job = (seed, site_index, case_index, image_size)`` (one argument: a pool's map)."""
    return generate_case(*job)


# ----------------------------------------------------------------------------------------
# Geometry: coordinates, smooth random fields, wobbly ellipsoids. Grid units: the volume spans [-1, 1].
# ----------------------------------------------------------------------------------------


def axis(n: int) -> np.ndarray:
    """Voxel-centre coordinates along one axis: float32 ``(n,)`` in ``(-1, 1)``."""
    return ((np.arange(n) + 0.5) / n * 2.0 - 1.0).astype(np.float32)


@dataclass(frozen=True)
class Grid:
    """Voxel-centre coordinates of a volume ``shape (X, Y, Z)``, as broadcastable float32 arrays
    ``x (X, 1, 1)``, ``y (1, Y, 1)``, ``z (1, 1, Z)``; ``voxel``: the in-plane voxel size in grid units."""

    shape: tuple[int, int, int]

    @property
    def coords(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        x, y, z = (axis(n) for n in self.shape)
        return x[:, None, None], y[None, :, None], z[None, None, :]

    @property
    def voxel(self) -> float:
        return 2.0 / self.shape[0]


def smooth_field(rng: np.random.Generator, grid: Grid, n_waves: int = 6, max_freq: float = 1.5) -> np.ndarray:
    """A smooth random field float32 ``(X, Y, Z)`` of about zero mean and unit std: a sum of ``n_waves``
    plane waves (frequency 0.25..``max_freq`` cycles per grid unit, amplitude ~ 1 / frequency), computed
    from separable complex exponentials."""
    freq = rng.uniform(0.25, max_freq, n_waves)
    direction = rng.normal(size=(n_waves, 3))
    direction /= np.linalg.norm(direction, axis=1, keepdims=True)
    phase = rng.uniform(0.0, 2 * np.pi, n_waves)
    amp = 1.0 / freq
    amp /= np.sqrt(0.5 * np.sum(amp**2))
    k = 2 * np.pi * freq[:, None] * direction  # (K, 3) radians per grid unit
    ex, ey, ez = (np.exp(1j * k[:, a, None] * axis(n)[None, :]) for a, n in enumerate(grid.shape))
    field = np.einsum("kx,ky,kz->xyz", (amp * np.exp(1j * phase))[:, None] * ex, ey, ez).real
    return field.astype(np.float32)


@dataclass(frozen=True)
class Ellipsoid:
    """A wobbly ellipsoid: centre and radii (grid units), rotation ``angle`` (radians) about ``Z``, and an
    outline modulated by ``1 + sum_k amp_k cos(w_k . d + phase_k)`` over the unit direction ``d``."""

    center: tuple[float, float, float]
    radii: tuple[float, float, float]
    angle: float = 0.0
    wobble: tuple[tuple[float, float, float, float, float], ...] = ()  # (amp, wx, wy, wz, phase) per term

    def ratio(self, grid: Grid) -> np.ndarray:
        """Normalized radius float32 ``(X, Y, Z)``: < 1 inside, 1 on the outline."""
        x, y, z = grid.coords
        dx, dy, dz = x - self.center[0], y - self.center[1], z - self.center[2]
        c, s = math.cos(self.angle), math.sin(self.angle)
        u = (c * dx + s * dy) / self.radii[0]
        v = (c * dy - s * dx) / self.radii[1]
        w = dz / self.radii[2]
        r = np.sqrt(u * u + v * v + w * w)
        if not self.wobble:
            return r
        inv = 1.0 / np.maximum(r, 1e-6)
        outline = np.ones_like(r)
        for amp, wx, wy, wz, phase in self.wobble:
            outline += amp * np.cos((wx * u + wy * v + wz * w) * inv + phase)
        return r / outline

    @property
    def mean_radius(self) -> float:
        return float(np.cbrt(np.prod(self.radii)))


def random_wobble(rng: np.random.Generator, n: int, amp: float) -> tuple[tuple[float, float, float, float, float], ...]:
    """``n`` outline terms for ``Ellipsoid.wobble``: amplitudes ~ ``amp``, directions of 1..3 radians per unit."""
    out = []
    for _ in range(n):
        d = rng.normal(size=3)
        wx, wy, wz = triple(d * rng.uniform(1.0, 3.0) / np.linalg.norm(d))
        out.append((float(rng.normal(0.0, amp)), wx, wy, wz, float(rng.uniform(0, 2 * np.pi))))
    return tuple(out)


def triple(values) -> tuple[float, float, float]:
    """Three numbers (an array or sequence of length 3) as a tuple of floats."""
    x, y, z = (float(v) for v in values)
    return x, y, z


def soft(ratio: np.ndarray, radius: float, width: float, level: float = 1.0) -> np.ndarray:
    """Anti-aliased inside weight float32 in [0, 1]: 0.5 where ``ratio == level``, ramping over about
    ``width`` grid units across the outline (``radius`` converts the ratio to a distance)."""
    t = np.clip(0.5 - (ratio - level) * (radius / (2.0 * width)), 0.0, 1.0)
    return t * t * (3.0 - 2.0 * t)


def at_least_one(mask: np.ndarray, ratio: np.ndarray, within: np.ndarray) -> np.ndarray:
    """``mask``, or, when it is empty (a structure smaller than a voxel), the voxel of ``within`` where ``ratio``
    is smallest: at a coarse resolution every structure keeps at least one voxel."""
    if mask.any() or not within.any():
        return mask
    out = np.zeros_like(mask)
    out.flat[int(np.argmin(np.where(within, ratio, np.inf)))] = True
    return out


def paint(image: np.ndarray, weight: np.ndarray, tissue: tuple[float, ...], texture: np.ndarray | float = 0.0) -> None:
    """Alpha-blend a tissue over ``image (4, X, Y, Z)`` in place: ``image += weight * (value - image)``,
    ``value`` = the tissue's intensity per modality times ``1 + texture``."""
    for m, value in enumerate(tissue):
        image[m] += weight * (value * (1.0 + texture) - image[m])


# ----------------------------------------------------------------------------------------
# One case
# ----------------------------------------------------------------------------------------


def generate_case(seed: int, site_index: int, case_index: int, image_size: int) -> tuple[np.ndarray, np.ndarray]:
    """Case ``case_index`` of site ``site_index``: ``(image int16 (4, X, Y, Z), label uint8 (X, Y, Z))``
    (see the module docstring), a pure function of its arguments."""
    inst = INSTITUTIONS[site_index]
    lgg = inst.is_lgg(case_index)
    rng = case_rng(seed, FED_CODE, site_index, case_index)
    grid = Grid(volume_shape(image_size, inst.slice_factor))
    edge = 0.6 * grid.voxel

    # brain, cortex, ventricles
    brain = Ellipsoid(
        triple(rng.normal(0.0, 0.03, 3)),
        triple(np.array([0.62, 0.78, 0.64]) * rng.uniform(0.93, 1.05, 3)),
        float(rng.normal(0.0, 0.08)),
        random_wobble(rng, 4, 0.025),
    )
    brain_ratio = brain.ratio(grid)
    brain_mask = brain_ratio < 1.0
    cortex = brain_ratio + 0.04 * smooth_field(rng, grid, max_freq=3.0)
    # tumour: edema (WT) around a core (TC); enhancing rim or focus (ET) inside the core
    direction = rng.normal(size=3) * np.array([1.0, 0.8, 0.6])
    direction /= np.linalg.norm(direction)
    center = np.array(brain.center) + direction * np.array(brain.radii) * rng.uniform(0.15, 0.45)
    r_wt = rng.uniform(0.20, 0.32) if lgg else rng.uniform(0.22, 0.36)
    wt = Ellipsoid(
        triple(center),
        triple(r_wt * rng.uniform(0.85, 1.15, 3)),
        float(rng.uniform(0, np.pi)),
        random_wobble(rng, 5, 0.14),
    )
    r_tc = r_wt * (rng.uniform(0.65, 0.85) if lgg else rng.uniform(0.50, 0.70))
    tc = Ellipsoid(
        triple(center + rng.normal(0.0, 0.12 * (r_wt - r_tc), 3)),
        triple(r_tc * rng.uniform(0.9, 1.1, 3)),
        float(rng.uniform(0, np.pi)),
        random_wobble(rng, 4, 0.06),
    )
    # ventricles, pushed away from the tumour (mass effect)
    push = -0.08 * direction
    ventricles = [
        Ellipsoid(
            triple(push + (side * 0.11 + rng.normal(0, 0.01), 0.02, 0.06)),
            triple(np.array([0.06, 0.24, 0.08]) * rng.uniform(0.8, 1.2, 3)),
            side * 0.15,
        )
        for side in (-1.0, 1.0)
    ]
    wt_ratio, tc_ratio = wt.ratio(grid), tc.ratio(grid)
    tumour_field = smooth_field(rng, grid, max_freq=4.0)
    if lgg:
        has_focus = rng.random() < 0.35
        focus = Ellipsoid(
            triple(np.array(tc.center) + rng.normal(0.0, 0.3 * r_tc, 3)),
            triple(r_tc * rng.uniform(0.25, 0.4, 3)),
        )
        et_weight = soft(tc_ratio, tc.mean_radius, edge) * soft(focus.ratio(grid), focus.mean_radius, edge)
        if not has_focus:
            et_weight = np.zeros_like(et_weight)
    else:
        rim = rng.uniform(0.3, 0.45)  # rim thickness, fraction of the core radius
        et_weight = (
            soft(tc_ratio, tc.mean_radius, edge)
            * (1.0 - soft(tc_ratio, tc.mean_radius, edge, level=1.0 - rim))
            * soft(-tumour_field, 1.0, 0.25, level=0.6)  # patchy: the rim is missing where the field is high
        )

    # labels: hard masks at the 0.5 level of the painted weights, clipped so that ET ⊂ TC ⊂ WT ⊂ brain
    wt_mask = at_least_one(brain_mask & (wt_ratio < 1.0), wt_ratio, brain_mask)
    tc_mask = at_least_one(wt_mask & (tc_ratio < 1.0), tc_ratio, wt_mask)
    et_mask = tc_mask & (et_weight > 0.5)
    if not lgg:
        et_mask = at_least_one(et_mask, -et_weight, tc_mask)
    label = np.zeros(grid.shape, np.uint8)
    label[wt_mask] = EDEMA
    label[tc_mask] = NECROTIC
    label[et_mask] = ENHANCING

    # image: paint tissues, then acquire
    image = np.empty((len(MODALITIES), *grid.shape), np.float32)
    texture = 0.03 * smooth_field(rng, grid, max_freq=4.0)
    for m, value in enumerate(TISSUE["wm"]):
        image[m] = value * (1.0 + texture)
    paint(image, 1.0 - soft(cortex, 0.7, edge, level=0.86), TISSUE["gm"])  # the outer shell of the brain
    for ventricle in ventricles:
        paint(image, soft(ventricle.ratio(grid), ventricle.mean_radius, edge), TISSUE["csf"])
    inside = soft(brain_ratio, brain.mean_radius, edge)
    wt_weight = soft(wt_ratio, wt.mean_radius, edge) * inside
    tc_weight = soft(tc_ratio, tc.mean_radius, edge) * wt_weight
    hetero = 0.08 * tumour_field
    paint(image, wt_weight, TISSUE["edema_lgg" if lgg else "edema_hgg"], hetero)
    paint(image, tc_weight, TISSUE["core_lgg" if lgg else "necrosis"], hetero)
    paint(image, et_weight * tc_weight, TISSUE["enhancing"], 0.5 * hetero)
    return acquire(image, brain_mask, inst, rng), label


def acquire(image: np.ndarray, brain_mask: np.ndarray, inst: Institution, rng: np.random.Generator) -> np.ndarray:
    """The site's scanner: ``image float32 (4, X, Y, Z)`` with intensities ~[0, 1] -> ``int16 (4, X, Y, Z)``.

    Tone curve ``x ** gamma``, a smooth multiplicative bias field (one per modality), a Gaussian blur of
    ``blur_mm`` (plus half a slice along thick ``Z`` slices), Rician noise, skull stripping (0 outside
    the brain) and the per-modality intensity scale.
    """
    shape = image.shape[1:]
    spacing = voxel_spacing(shape)
    grid = Grid((shape[0], shape[1], shape[2]))
    sigma = [inst.blur_mm / sp for sp in spacing]
    if inst.slice_factor > 1:
        sigma[2] = math.hypot(sigma[2], 0.5)
    noise = rng.standard_normal((2, *image.shape), dtype=np.float32) * np.float32(inst.noise)
    out = np.empty(image.shape, np.int16)
    for m in range(len(image)):
        channel = np.clip(image[m], 0.0, None) ** inst.gamma
        channel *= np.exp(inst.bias * smooth_field(rng, grid, n_waves=4, max_freq=0.8))
        channel = gaussian_filter(channel, sigma, mode="nearest")
        channel = np.sqrt((channel + noise[0, m]) ** 2 + noise[1, m] ** 2)
        channel *= brain_mask
        out[m] = np.clip(np.rint(channel * inst.intensity[m]), 0, INT16_MAX).astype(np.int16)
    return out
