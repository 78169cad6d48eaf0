"""nnU-Net v2's planning rules, re-implemented on a merged dataset fingerprint (``fedseg.plan.merge``).

Where each rule comes from in nnU-Net v2 (``nnunetv2/experiment_planning/experiment_planners/``):

- :func:`target_spacing`: ``ExperimentPlanner.determine_fullres_target_spacing`` (median spacing; the
  anisotropy rule for the low-resolution axis);
- :func:`resampled_median_shape`: ``ExperimentPlanner`` (``compute_new_shape`` of every case, then the median);
- :func:`pool_and_conv_props`: ``network_topology.get_pool_and_conv_props`` (per-axis pooling until the
  bottleneck would drop below ``min_edge`` voxels, pooling only axes within a factor 2 of the finest spacing,
  kernel 1 on axes still too coarse);
- :func:`patch_and_topology`: ``ExperimentPlanner.get_plans_for_configuration`` (the initial patch, a
  256^3-voxel box shaped by the spacing, capped by the median shape; then the axis largest relative to the
  median shape shrinks by its divisibility factor until the patch fits). nnU-Net's stopping test is a VRAM
  estimate of the network on the patch; here it is ``model.plan.voxel_budget``, the most voxels a patch may
  hold (the FeTS preset's 128^3 patch is the GPU-scale analogue, fets-cpu's 32^3 the CPU one);
- :func:`stage_features`: ``min(base * 2^i, cap)`` per stage (nnU-Net: 32 and 320 in 3D, 512 in 2D);
- :func:`channel_normalization`: ``determine_normalization_scheme_and_whether_mask_is_used_for_norm`` with
  ``ZScoreNormalization`` (MR and anything not CT; the non-zero mask when the crop shrinks the median case below
  3/4) and ``CTNormalization`` (clip to the foreground 0.5 / 99.5 percentiles, global foreground mean and std).

Not planned (kept from the config): batch size, the number of convolutions per stage (DynUNet's two),
deep supervision (off), the 3d_lowres / cascade configurations.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field

import numpy as np

from fedseg.config import PlanConfig, RunConfig, network_input_problem
from fedseg.plan.merge import DatasetFingerprint

INITIAL_PATCH_VOXELS = {2: 2048**2, 3: 256**3}  # nnU-Net's initial patch volume before its VRAM loop
MIN_STAGES = 3  # MONAI DynUNet's fewest levels (two downsamplings)


@dataclass(frozen=True)
class Topology:
    """A network shape for one patch (``get_pool_and_conv_props``): ``num_pool`` poolings per axis, ``strides``
    per stage (stage 0: 1 on every axis), ``kernels`` per stage (3, or 1 on an axis still too coarse), the
    ``patch`` padded to a multiple of ``divisor`` = 2^num_pool per axis."""

    num_pool: tuple[int, ...]
    strides: tuple[tuple[int, ...], ...]
    kernels: tuple[tuple[int, ...], ...]
    patch: tuple[int, ...]
    divisor: tuple[int, ...]


@dataclass
class Plan:
    """The plan of one federation (serialized as ``plan.json`` and under ``plan`` in ``summary.json``).

    ``target_spacing`` mm per axis; ``median_shape`` voxels after resampling to it; ``patch_size`` voxels;
    ``strides`` / ``kernel_sizes`` one per stage (DynUNet's, stage 0 stride 1); ``filters`` per stage;
    ``normalization`` one per channel (``scheme`` ``zscore`` | ``ct``, ``use_mask``, and for ``ct`` the clip
    bounds and the mean/std); ``anisotropic_axis``: the axis whose target spacing the anisotropy rule set (None
    if it did not apply); ``fingerprint``: :meth:`DatasetFingerprint.summary`; ``settings``: the
    ``model.plan`` it was planned with; ``applied``: for each planned item, the config key it set in the run, or
    why it was not applied."""

    spatial_dims: int
    target_spacing: list[float]
    median_shape: list[float]
    patch_size: list[int]
    strides: list[list[int]]
    kernel_sizes: list[list[int]]
    filters: list[int]
    normalization: list[dict]
    anisotropic_axis: int | None
    fingerprint: dict
    settings: dict
    applied: dict[str, str] = field(default_factory=dict)

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> Plan:
        return cls(**d)


def target_spacing(spacings: np.ndarray, shapes: np.ndarray, threshold: float) -> tuple[np.ndarray, int | None]:
    """The fullres target spacing (mm per axis) of cases with ``spacings`` / ``shapes`` (after the crop) ``(N, D)``,
    and the axis the anisotropy rule changed (None if it did not apply).

    nnU-Net's rule: the median spacing per axis. If its coarsest axis is more than ``threshold`` (3) times
    coarser than the finest other axis AND the median shape along it times ``threshold`` is still smaller than
    the smallest other median size, that axis takes the 10th percentile of its spacings instead (resampling
    thick-slice cases to the median would interpolate many slices), but at least the largest other spacing
    (+1e-5 if raised)."""
    target = np.percentile(spacings, 50, axis=0)
    sizes = np.percentile(shapes, 50, axis=0)
    worst = int(np.argmax(target))
    others = [i for i in range(len(target)) if i != worst]
    if not others:
        return target, None
    other_spacings, other_sizes = target[others], sizes[others]
    aniso_spacing = target[worst] > threshold * max(other_spacings)
    aniso_voxels = sizes[worst] * threshold < min(other_sizes)
    if not (aniso_spacing and aniso_voxels):
        return target, None
    value = float(np.percentile(spacings[:, worst], 10))
    if value < max(other_spacings):
        value = max(float(max(other_spacings)), value) + 1e-5
    target = target.copy()
    target[worst] = value
    return target, worst


def resampled_median_shape(spacings: np.ndarray, shapes: np.ndarray, target: np.ndarray) -> np.ndarray:
    """The median over cases of ``round(spacing / target * shape)`` per axis (voxels; nnU-Net's
    ``compute_new_shape``), ``(D,)`` float."""
    return np.median(np.round(spacings / target * shapes), axis=0)


def pool_and_conv_props(spacing: Sequence[float], patch: Sequence[int], min_edge: int) -> Topology:
    """nnU-Net's ``get_pool_and_conv_props`` (``max_numpool`` unbounded, as v2's planner).

    Each stage pools (stride 2) every axis that (a) is still at least ``2 min_edge`` voxels, and (b) has a
    current spacing within a factor 2 of the finest current spacing among those; a lone such axis pools only
    while it is at least ``3 min_edge`` voxels. An axis's kernel is 1 until its spacing is within a factor 2 of
    the finest, 3 from then on; the bottleneck's kernel is 3 on every axis. The patch is padded to a multiple of
    2^poolings per axis."""
    dims = len(spacing)
    current_spacing = [float(s) for s in spacing]
    current_size = [float(p) for p in patch]
    strides: list[tuple[int, ...]] = [(1,) * dims]
    kernels: list[tuple[int, ...]] = []
    num_pool = [0] * dims
    kernel = [1] * dims
    while True:
        valid = [i for i in range(dims) if current_size[i] >= 2 * min_edge]
        if not valid:
            break
        finest = min(current_spacing[i] for i in valid)
        valid = [i for i in valid if current_spacing[i] / finest < 2]
        if len(valid) == 1 and current_size[valid[0]] < 3 * min_edge:
            break
        if not valid:
            break
        for d in range(dims):
            if kernel[d] != 3 and current_spacing[d] / min(current_spacing) < 2:
                kernel[d] = 3
        stride = [1] * dims
        for v in valid:
            stride[v] = 2
            num_pool[v] += 1
            current_spacing[v] *= 2
            current_size[v] = float(np.ceil(current_size[v] / 2))
        strides.append(tuple(stride))
        kernels.append(tuple(kernel))
    kernels.append((3,) * dims)
    divisor = tuple(2**n for n in num_pool)
    padded = tuple(int(np.ceil(p / d) * d) for p, d in zip(patch, divisor))
    return Topology(tuple(num_pool), tuple(strides), tuple(kernels), padded, divisor)


def initial_patch(spacing: Sequence[float], median_shape: Sequence[float]) -> list[int]:
    """nnU-Net's starting patch: a box of ``INITIAL_PATCH_VOXELS`` voxels whose sides in mm are equal
    (``1 / spacing`` scaled to that volume), capped by the median shape, voxels per axis."""
    inverse = 1.0 / np.asarray(spacing, dtype=np.float64)
    volume = INITIAL_PATCH_VOXELS[len(spacing)]
    box = [round(float(v)) for v in inverse * (volume / np.prod(inverse)) ** (1.0 / len(spacing))]
    return [int(min(b, m)) for b, m in zip(box, np.round(median_shape))]


def patch_and_topology(spacing: Sequence[float], median_shape: Sequence[float], budget: int, min_edge: int) -> Topology:
    """The patch and network of ``get_plans_for_configuration``, with the voxel ``budget`` in place of nnU-Net's
    VRAM estimate (module docstring): while the patch holds more than ``budget`` voxels, the axis with the
    largest ``patch / median_shape`` shrinks by its divisibility factor (computed for the shrunk patch), and the
    topology is planned again. Terminates: a patch of at most ``budget`` >= 64 voxels always exists (4^3, 8^2);
    a budget too small for the network's depth shows in :func:`apply_plan`."""
    topology = pool_and_conv_props(spacing, initial_patch(spacing, median_shape), min_edge)
    patch = list(topology.patch)
    while int(np.prod(patch)) > budget:
        axis = int(np.argsort([p / m for p, m in zip(patch, median_shape)])[-1])
        trial = list(patch)
        trial[axis] = max(trial[axis] - topology.divisor[axis], 1)
        patch[axis] = max(patch[axis] - pool_and_conv_props(spacing, trial, min_edge).divisor[axis], 1)
        topology = pool_and_conv_props(spacing, patch, min_edge)
        patch = list(topology.patch)
    return topology


def stage_features(stages: int, base: int, cap: int) -> list[int]:
    """Feature maps per stage: ``min(base * 2^i, cap)`` (nnU-Net: 32 doubling to 320 in 3D)."""
    return [min(base * 2**i, cap) for i in range(stages)]


def channel_normalization(fingerprint: DatasetFingerprint, modalities: Sequence[str]) -> list[dict]:
    """One scheme per channel (``modalities[c]`` ``MR`` | ``CT``).

    ``CT`` (``CTNormalization``): clip to ``[percentile_00_5, percentile_99_5]`` of the foreground intensities,
    then subtract their mean and divide by their std (``max(std, 1e-8)``), all over every training case.
    ``MR`` (``ZScoreNormalization``): per image and channel, subtract the mean and divide by the std; within the
    non-zero mask (background kept at 0) when the median relative size after cropping is below 3/4 (the crop
    removed much background, as skull-stripped brains), else over all voxels."""
    mask = float(np.median(fingerprint.crop_fractions)) < 0.75
    schemes = []
    for modality, stats in zip(modalities, fingerprint.intensity):
        if modality == "CT":
            schemes.append(
                {
                    "scheme": "ct",
                    "use_mask": False,
                    "lower": stats.percentile_00_5,
                    "upper": stats.percentile_99_5,
                    "mean": stats.mean,
                    "std": max(stats.std, 1e-8),
                }
            )
        else:
            schemes.append({"scheme": "zscore", "use_mask": mask})
    return schemes


def channel_modalities(settings: PlanConfig, channels: int) -> list[str]:
    """``model.plan.modality`` as one modality per channel; ``ValueError`` when a list has another length."""
    given = settings.modality
    if isinstance(given, str):
        return [given] * channels
    if len(given) != channels:
        raise ValueError(f"model.plan.modality: {len(given)} modalities {given} for {channels} channels")
    return list(given)


def make_plan(fingerprint: DatasetFingerprint, settings: PlanConfig) -> Plan:
    """The plan of a dataset fingerprint under ``settings`` (``model.plan``); the rules of the module docstring."""
    if len(fingerprint.spacings) == 0:
        raise ValueError("model.name planned: the sites hold no training case to plan from")
    dims = fingerprint.spacings.shape[1]
    spacing, aniso = target_spacing(fingerprint.spacings, fingerprint.shapes, settings.anisotropy_threshold)
    median = resampled_median_shape(fingerprint.spacings, fingerprint.shapes, spacing)
    spacing_mm, median_shape = [float(s) for s in spacing], [float(m) for m in median]
    topology = patch_and_topology(spacing_mm, median_shape, settings.voxel_budget, settings.min_edge)
    return Plan(
        spatial_dims=dims,
        target_spacing=spacing_mm,
        median_shape=median_shape,
        patch_size=list(topology.patch),
        strides=[list(s) for s in topology.strides],
        kernel_sizes=[list(k) for k in topology.kernels],
        filters=stage_features(len(topology.strides), settings.base_features, settings.max_features),
        normalization=channel_normalization(fingerprint, channel_modalities(settings, len(fingerprint.intensity))),
        anisotropic_axis=aniso,
        fingerprint=fingerprint.summary(),
        settings=settings.model_dump(mode="json"),
    )


def normalize_settings(plan: Plan) -> tuple[dict, str]:
    """The ``data`` settings that carry out the plan's normalization, and a note: ``normalize`` =
    ``zscore_foreground`` (z-score with the non-zero mask), ``zscore_channel`` (without) or ``ct`` with
    ``ct_windows``; none (and the reason) when the channels mix schemes, which one ``data.normalize`` cannot do."""
    schemes = {(n["scheme"], n["use_mask"]) for n in plan.normalization}
    if schemes == {("zscore", True)}:
        return {"normalize": "zscore_foreground"}, "data.normalize = zscore_foreground"
    if schemes == {("zscore", False)}:
        return {"normalize": "zscore_channel"}, "data.normalize = zscore_channel"
    if schemes == {("ct", False)}:
        windows = [(n["lower"], n["upper"], n["mean"], n["std"]) for n in plan.normalization]
        return {"normalize": "ct", "ct_windows": windows}, "data.normalize = ct, data.ct_windows"
    return {}, "planned but not applied: the channels mix CT and MR schemes; the run keeps data.normalize"


def apply_plan(cfg: RunConfig, plan: Plan) -> RunConfig:
    """The config the run trains with: ``cfg`` with the planned DynUNet (``model``: ``dynunet``, ``channels`` =
    filters, ``strides`` / ``kernel_sizes`` per stage), ``data.volume.patch_size`` and ``data.volume.spacing``
    (the volume path resamples every case to it), and ``data.normalize`` (and ``data.ct_windows``) where they can
    carry out the planned normalization (:func:`normalize_settings`). Records in ``plan.applied`` what was
    applied, and what not (and why)."""
    if len(plan.strides) < MIN_STAGES:
        raise ValueError(
            f"model.name planned: the plan has {len(plan.strides)} stages (patch {plan.patch_size}, bottleneck of at "
            f"least model.plan.min_edge = {plan.settings['min_edge']} voxels) and MONAI's DynUNet needs at least "
            f"{MIN_STAGES}: lower model.plan.min_edge or raise model.plan.voxel_budget"
        )
    normalize, note = normalize_settings(plan)
    model = cfg.model.model_copy(
        update={
            "name": "dynunet",
            "channels": tuple(plan.filters),
            "strides": tuple(tuple(s) for s in plan.strides[1:]),
            "kernel_sizes": tuple(tuple(k) for k in plan.kernel_sizes),
        }
    )
    volume = cfg.data.volume.model_copy(
        update={"patch_size": tuple(plan.patch_size), "spacing": tuple(plan.target_spacing)}
    )
    data = cfg.data.model_copy(update={"volume": volume, **normalize})
    plan.applied = {
        "network": "model: dynunet (channels, strides, kernel_sizes)",
        "patch_size": "data.volume.patch_size",
        "target_spacing": "data.volume.spacing (every case resampled to it; metrics on its own grid)",
        "normalization": note,
        "batch_size": f"not planned: train.batch_size = {cfg.train.batch_size} kept",
    }
    planned = cfg.model_copy(update={"model": model, "data": data})
    if (problem := network_input_problem(planned.model, planned.data)) is not None:  # a check of the planner
        raise ValueError(f"the planned network does not fit its planned patch: {problem}; raise model.plan.min_edge")
    return RunConfig.model_validate(planned.model_dump())
