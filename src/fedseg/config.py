"""Run configuration: the pydantic models of a run's configuration (``RunConfig`` and its sections: data, model,
train, fl, engine, eval, cost...) with their checks, and the config semantics other modules share
(``region_tolerances``, ``network_input_problem``, ``CHANGED_METHOD_DEFAULTS``). Reading one (presets, YAML files,
``--set key.sub=value`` overrides) and its error messages: ``fedseg.config_load``."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any, Literal, get_args

import yaml
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

# 1 mm: the MSD-derived "surface Dice at 1 mm" (COVID-19 lung lesion challenge 2020) and FLARE 2021-22's NSD;
# Metrics Reloaded asks for a tolerance from the inter-rater variability of the structure, which a config sets.
DEFAULT_NSD_TOLERANCE = 1.0


def region_tolerances(tolerance: float | Mapping[str, float], regions: Sequence[str]) -> list[float]:
    """``eval.nsd_tolerance`` -> one tolerance per region, in ``regions``' order (a ValueError naming the
    missing or unknown regions when a mapping does not name exactly ``regions``)."""
    if not isinstance(tolerance, Mapping):
        return [float(tolerance)] * len(regions)
    missing, unknown = [g for g in regions if g not in tolerance], [k for k in tolerance if k not in regions]
    if missing or unknown:
        raise ValueError(
            f"eval.nsd_tolerance: a mapping needs exactly the task's regions {list(regions)}"
            + (f"; missing {missing}" if missing else "")
            + (f"; unknown {unknown}" if unknown else "")
        )
    return [float(tolerance[g]) for g in regions]


def _admits(annotation: Any, kinds: tuple[Any, ...]) -> bool:
    """Whether a field's annotation admits one of ``kinds`` anywhere (``int | None``, ``tuple[float, ...]``;
    ``Any`` and ``dict[str, Any]`` admit everything)."""
    if annotation is Any or annotation in kinds:
        return True
    return any(_admits(arg, kinds) for arg in get_args(annotation))


def _bools_in(value: Any) -> bool:
    """Whether ``value`` is a bool or a (nested) list or tuple holding one."""
    if isinstance(value, list | tuple):
        return any(_bools_in(item) for item in value)
    return isinstance(value, bool)


SEED_MAX = 2**32 - 1  # numpy's and torch's seeds of every stream derive from it within 64 bits


class NoBoolNumbers(BaseModel):
    """Refuses ``true``/``false`` for a number: pydantic's lax mode reads ``fl.rounds=true`` as 1 round and
    ``lr: false`` as 0.0 (a YAML ``yes`` is a bool too), where strict mode would also refuse a list for a tuple
    and a string for a path or a Literal. Checked on the value and inside its lists and tuples, for fields that
    take a number and no bool (a text field's yes/no is pydantic's to refuse, naming what it takes). Every number
    is finite: ``lr: .inf`` passes ``gt=0`` but trains to Inf weights, failing after the first round."""

    model_config = ConfigDict(allow_inf_nan=False)

    @field_validator("*", mode="before")
    @classmethod
    def _no_bool_for_a_number(cls, value: Any, info: Any) -> Any:
        if _bools_in(value):
            field = cls.model_fields.get(info.field_name) if info.field_name else None
            if field is not None and _admits(field.annotation, (int, float)) and not _admits(field.annotation, (bool,)):
                shown = yaml.safe_dump(value, default_flow_style=True).strip().removesuffix("\n...")
                raise ValueError(f"expects a number, not a yes/no value ({shown})")
        return value


class Strict(NoBoolNumbers):
    model_config = ConfigDict(extra="forbid")


class SplitConfig(Strict):
    """Per-site splits. ``ratio``: train/val/test fractions (FedSM: 0.5/0.25/0.25).
    ``kfold``: ``folds`` folds per site, fold ``fold`` is test, the rest is split
    ``train_fraction``/(1 - ``train_fraction``) into train/val per site (FeTS)."""

    mode: Literal["ratio", "kfold"] = "ratio"
    ratios: tuple[float, float, float] = (0.5, 0.25, 0.25)
    folds: int = Field(default=5, ge=2)
    fold: int = Field(default=0, ge=0)
    train_fraction: float = Field(default=0.8, gt=0, lt=1)

    @model_validator(mode="after")
    def _check(self) -> SplitConfig:
        if abs(sum(self.ratios) - 1.0) > 1e-6 or min(self.ratios) < 0:
            raise ValueError(f"split.ratios must be non-negative and sum to 1, got {list(self.ratios)}")
        if self.fold >= self.folds:
            raise ValueError(f"split.fold={self.fold} must be < split.folds={self.folds}")
        return self


class VolumeConfig(Strict):
    """The volumetric pipeline (``fedseg.data.volumes``, ``fedseg.evaluate.sliding``; FeTS 2022 benchmark
    Sec. 4.4.1-4.4.2, Auto-FedAvg Sec. 4.2.1), on when ``patch_size`` is set: each case keeps its own grid
    (optionally resampled to ``spacing``), is cropped to its non-zero image mask, normalized and zero-padded
    to at least the patch size; training draws one random patch per case and epoch, validation, test and
    ``fedseg predict`` run a sliding window and map the prediction back to the case's original grid, where
    the metrics are computed with the case's spacing (HD95 in mm). ``patch_size`` None: every case is
    resized to ``data.image_size`` instead (the whole-image path). The same code serves 2D images."""

    patch_size: int | tuple[int, ...] | None = Field(
        default=None, description="voxels per spatial axis (one number = every axis; FeTS: 128); None = off"
    )
    spacing: float | tuple[float, ...] | None = Field(
        default=None,
        description="resample every case to this spacing, mm per spatial axis (MONAI Spacing); None = keep",
    )
    crop_foreground: bool = Field(default=True, description="crop to the bounding box of the non-zero image voxels")
    foreground_oversample: float = Field(
        default=0.0, ge=0, le=1, description="probability that a training patch is centred on a labelled voxel"
    )
    sw_overlap: float = Field(default=0.5, ge=0, lt=1, description="sliding window: overlap of adjacent windows")
    sw_mode: Literal["gaussian", "constant"] = Field(default="gaussian", description="sliding window: blending")
    sw_batch_size: int = Field(default=4, ge=1, description="sliding window: windows per forward pass")

    @field_validator("patch_size", "spacing")
    @classmethod
    def _positive(cls, value, info):
        values = value if isinstance(value, tuple) else (value,)
        if value is not None and (not values or any(v <= 0 for v in values)):
            raise ValueError(f"data.volume.{info.field_name} must be positive, got {value}")
        return value


class RepartitionConfig(Strict):
    """A synthetic repartition of the federation (``fedseg.data.repartition``; FeTS 2022 Sec. 4.3), applied before
    training: ``iid`` deals every case i.i.d. and balanced to ``sites`` synthetic sites (each case keeps the split
    it has on its own site); ``limited`` drops ``drop_sites``, the cases without the metadata value ``require`` and
    caps each site at ``max_cases``."""

    mode: Literal["none", "iid", "limited"] = "none"
    sites: int = Field(default=5, ge=1, description="iid: number of synthetic sites (FeTS: 23, 10, 5)")
    max_cases: int | None = Field(default=None, ge=1, description="limited: cases kept per site at most (FeTS: 35)")
    drop_sites: list[str] = Field(default_factory=list, description="limited: sites removed")
    require: str | None = Field(
        default=None, description="limited: cases without a value for this metadata key are removed (FeTS: grade)"
    )
    holdout: str | None = Field(
        default=None,
        description="leave this site out of training (after the mode's repartition): an unseen site, scored on all its "
        "cases by `fedseg bench` (FedSM Table 5; `fedseg run --holdout` is the same as a study)",
    )


class DataConfig(Strict):
    """Where the federation comes from. ``source`` is a built-in federation name or ``folder``."""

    source: str = "synthetic-retina"
    root: str | None = None
    seed: int = Field(
        default=0,
        ge=0,
        le=SEED_MAX,
        description="the dataset's seed, fixed across the seeds of a study: it generates the built-in federations "
        "(case ids name the same image under every run seed), deals an IID repartition / caps a limited one, and "
        "draws the train/val/test split (folder federations too). The run's `seed` seeds only the training: "
        "initial weights, batch order, augmentation, client sampling",
    )
    scale: float = Field(default=1.0, gt=0, description="built-in federations: site sizes = paper sizes x scale")
    image_size: int = Field(
        default=64,
        ge=8,
        description="side of the square/cubic model input, pixels (with data.volume.patch_size: only FedSM's "
        "selector view)",
    )
    resize: Literal["stretch", "pad"] = Field(
        default="stretch",
        description="how an image of another shape reaches the square (cubic) data.image_size input on the "
        "whole-image path: stretch = each axis resized on its own (a non-square image is squashed); pad = resized "
        "by one factor, its longest side to image_size, centred and padded with zeros (aspect ratio kept; "
        "predictions are cropped back before they are resized to the image)",
    )
    normalize: Literal["minmax", "zscore", "zscore_foreground", "zscore_channel", "ct", "none"] = Field(
        default="minmax",
        description="intensities: minmax / zscore per image; zscore_foreground per channel (modality) within its "
        "non-zero voxels (FeTS 2022 Sec. 4.4.2), background kept at 0; zscore_channel per channel over all voxels; "
        "ct: each channel clipped and scaled with data.ct_windows (nnU-Net's CTNormalization)",
    )
    ct_windows: list[tuple[float, float, float, float]] | None = Field(
        default=None,
        description="normalize: ct: per channel (lower, upper, mean, std): clip to [lower, upper], subtract mean, "
        "divide by std (a planned run sets them from the sites' fingerprints: fedseg.plan)",
    )
    prepare_threads: int = Field(
        default=0,
        ge=0,
        le=64,
        description="threads reading and pre-processing a site's cases at once before the run (each holds one case "
        "in memory); 0 = the CPUs this process may use, at most 8. The tensors are identical for any value "
        "(fedseg.data.dataset.build_site_data)",
    )
    volume: VolumeConfig = VolumeConfig()
    split: SplitConfig = SplitConfig()
    repartition: RepartitionConfig = RepartitionConfig()

    @model_validator(mode="after")
    def _ct_windows(self) -> DataConfig:
        if self.normalize == "ct" and not self.ct_windows:
            raise ValueError("data.normalize = ct needs data.ct_windows: (lower, upper, mean, std) per channel")
        if any(w[3] <= 0 or w[0] > w[1] for w in self.ct_windows or []):
            raise ValueError("data.ct_windows: each window needs lower <= upper and std > 0")
        return self


class PlanConfig(Strict):
    """``model.name: planned``: the settings of federated planning (``fedseg.plan``, nnU-Net v2's rules).

    Each site sends its training cases' fingerprint (spacings, shapes after the crop to non-zero, foreground
    intensity statistics per channel; statistics only), the server merges them and plans the target spacing,
    patch size, network and normalization."""

    voxel_budget: int = Field(
        default=128**3,
        ge=64,
        description="the patch holds at most this many voxels (nnU-Net shrinks the patch until its VRAM estimate "
        "fits; this budget is fedseg's analogue). The fets preset's patch: 128^3, fets-cpu's: 32^3",
    )
    base_features: int = Field(default=32, ge=1, description="feature maps of the first stage (nnU-Net: 32)")
    max_features: int = Field(
        default=320, ge=1, description="feature maps double per stage up to this cap (nnU-Net 3D: 320, 2D: 512)"
    )
    min_edge: int = Field(
        default=4,
        ge=2,
        description="the bottleneck keeps at least this many voxels per axis (nnU-Net: 4; 1 would leave instance "
        "norm a single voxel, and the planner's patch search would not end)",
    )
    anisotropy_threshold: float = Field(
        default=3.0, gt=1, description="nnU-Net's ratio above which the low-resolution axis is anisotropic"
    )
    modality: Literal["MR", "CT"] | list[Literal["MR", "CT"]] = Field(
        default="MR",
        description="the modality of every channel, or one per channel: MR = z-score per image (nnU-Net "
        "ZScoreNormalization), CT = clip to the 0.5/99.5 foreground percentiles, global mean/std (CTNormalization)",
    )
    bins: int = Field(
        default=1000, ge=10, description="histogram bins per channel over the agreed intensity range (percentiles)"
    )

    @model_validator(mode="after")
    def _cap(self) -> PlanConfig:
        if self.max_features < self.base_features:
            raise ValueError(
                f"model.plan.max_features={self.max_features} must be >= base_features={self.base_features}"
            )
        return self


class ModelConfig(Strict):
    """MONAI network for segmentation. Output channels = number of regions (sigmoid).

    ``planned``: a DynUNet whose stages, kernels, strides and feature maps are planned from the sites'
    fingerprints (``fedseg.plan``, settings in ``plan``); the run replaces it by the ``dynunet`` it planned
    (``channels``, ``strides``, ``kernel_sizes`` filled in), which ``model/<algorithm>/manifest.json`` records."""

    name: Literal["unet", "dynunet", "planned"] = "unet"
    channels: tuple[int, ...] = (16, 32, 64, 128, 256)
    strides: tuple[int | tuple[int, ...], ...] | None = Field(
        default=None,
        description="the downsampling between levels, len(channels) - 1 entries, each one number or one per axis; "
        "None = 2 between every level",
    )
    kernel_sizes: tuple[int | tuple[int, ...], ...] | None = Field(
        default=None,
        description="dynunet: the convolution kernel of each level, len(channels) entries, each one number or one "
        "per axis; None = 3 everywhere",
    )
    num_res_units: int = Field(default=0, ge=0)
    norm: Literal["instance", "batch"] = Field(
        default="instance",
        description="the networks' normalization: instance (no affine weights, no running statistics; FeTS 2022, "
        "nnU-Net) or batch (BatchNorm: weights and running statistics, what FedBN keeps on the sites). MONAI's group "
        "and layer norms need arguments a name cannot give",
    )
    dropout: float = Field(default=0.0, ge=0, le=1)
    plan: PlanConfig = PlanConfig()

    @model_validator(mode="after")
    def _levels(self) -> ModelConfig:
        """At least two levels of at least one feature map; ``strides`` one fewer entries, ``kernel_sizes`` one per
        level, each value at least 1 (else the network fails to build, or trains with a negative size)."""
        depth = len(self.channels)
        if depth < 2 or min(self.channels) < 1:
            raise ValueError(f"model.channels: at least 2 levels of >= 1 feature maps, got {list(self.channels)}")
        for name, need in (("strides", depth - 1), ("kernel_sizes", depth)):
            given = getattr(self, name)
            if given is None:
                continue
            if len(given) != need:
                raise ValueError(f"model.{name}: needs {need} entries (len(channels) = {depth}), got {len(given)}")
            values = [v for g in given for v in (g if isinstance(g, tuple) else (g,))]
            if min(values, default=1) < 1:
                raise ValueError(f"model.{name}: every value must be >= 1, got {list(given)}")
        return self


class BudgetConfig(Strict):
    unit: Literal["epochs", "steps"] = "epochs"
    amount: int = Field(default=1, ge=1)


class AugmentConfig(Strict):
    """On-the-fly augmentations of every training sample (patch or whole image), in this order, each a MONAI
    transform (the noise: MONAI's, drawn on the batch's device) seeded from the site's per-(seed, site, round)
    stream (``fedseg.data.augment``). Defaults: the FeTS 2022 benchmark, Sec. 4.4.3. Off unless ``enabled``."""

    enabled: bool = False
    flip_prob: float = Field(default=0.5, ge=0, le=1, description="flip along each spatial axis (RandFlip)")
    noise_prob: float = Field(
        default=0.15, ge=0, le=1, description="additive Gaussian noise (drawn on the batch's device)"
    )
    noise_std: float = Field(default=0.25, ge=0, description="its standard deviation, normalized intensity units")
    smooth_prob: float = Field(default=0.15, ge=0, le=1, description="Gaussian smoothing (RandGaussianSmooth)")
    smooth_sigma: tuple[float, float] = Field(default=(0.5, 1.0), description="its sigma range per axis, voxels")
    scale_prob: float = Field(default=0.15, ge=0, le=1, description="intensity scaling (RandScaleIntensity)")
    scale_range: tuple[float, float] = Field(default=(0.7, 1.3), description="its factor range")
    contrast_prob: float = Field(default=0.3, ge=0, le=1, description="gamma contrast (RandAdjustContrast)")
    contrast_gamma: tuple[float, float] = Field(default=(0.5, 2.0), description="its gamma range")

    @model_validator(mode="after")
    def _ranges(self) -> AugmentConfig:
        for name in ("smooth_sigma", "scale_range", "contrast_gamma"):
            lo, hi = getattr(self, name)
            if not 0 < lo <= hi:
                raise ValueError(f"train.augment.{name} must be (low, high) with 0 < low <= high, got {[lo, hi]}")
        return self


class TrainConfig(Strict):
    """The local optimization loop (``fedseg.train.Trainer``)."""

    optimizer: Literal["adam", "sgd"] = "adam"
    lr: float = Field(default=1e-3, gt=0)
    momentum: float = Field(default=0.9, ge=0)
    weight_decay: float = Field(default=0.0, ge=0)
    batch_size: int = Field(default=8, ge=1)
    budget: BudgetConfig = BudgetConfig()
    keep_optimizer_state: bool = True
    loss: Literal["dice", "dice_bce"] = Field(
        default="dice",
        description="dice: soft Dice over the region channels; dice_bce: + each region channel's binary cross-entropy",
    )
    adam_betas: tuple[float, float] = Field(
        default=(0.9, 0.999), description="Adam's (beta1, beta2), each in [0, 1) (Auto-FedAvg: (0.5, 0.99))"
    )
    lr_schedule: Literal["constant", "cosine", "exponential"] = Field(
        default="constant",
        description="local learning rate per round t = 1..fl.rounds (constant within a round; "
        "fedseg.train.round_lr): constant = lr; cosine = lr_min + (lr - lr_min)(1 + cos(pi (t-1)/T))/2 "
        "(Auto-FedAvg); exponential = lr * lr_decay^(t-1) (FeTS 2022 benchmark)",
    )
    lr_decay: float = Field(
        default=0.995,
        gt=0,
        le=1,
        description="exponential: factor per round (FeTS 2022 benchmark, section 4.4.8: 0.995 per round)",
    )
    lr_min: float = Field(default=0.0, ge=0, description="cosine: the rate the schedule approaches in the last round")
    dice_smooth: float | None = Field(
        default=None,
        gt=0,
        description="soft-Dice smoothing epsilon added to numerator and denominator (FeTS 2022 Eq. 31: 1); "
        "None = MONAI's defaults (1e-5)",
    )
    augment: AugmentConfig = AugmentConfig()
    amp: Literal["auto", "bf16", "fp16", "off"] = Field(
        default="auto",
        description="mixed precision of training and evaluation forward passes (torch.autocast; loss, extra "
        "loss terms and the logits' sigmoid/blending stay float32): auto = bf16 on CUDA, off elsewhere; fp16 adds "
        "a GradScaler, whose scale each site (and each of its models) carries from round to round; off (and auto "
        "on the CPU) keeps results bit-identical to float32",
    )
    channels_last: Literal["auto", "on", "off"] = Field(
        default="auto",
        description="channels-last memory format for the network's weights and inputs (channels_last_3d for 3D): "
        "auto = on for 2D networks on CUDA, off elsewhere (3D: 1.44x slower bf16 steps of the fets DynUNet on an "
        "H100); on = 2D and 3D; the same values in another memory order",
    )
    cudnn_benchmark: bool = Field(
        default=True,
        description="on CUDA, let cuDNN time its convolution algorithms once per input shape "
        "(torch.backends.cudnn.benchmark; GPU results are then not bit-reproducible); no effect elsewhere",
    )
    compile: bool = Field(
        default=False,
        description="torch.compile the network before local training (nn.Module.compile: weights and their names "
        "unchanged); the first steps of each network pay the compilation",
    )
    loader_workers: int = Field(
        default=0,
        ge=0,
        le=32,
        description="background threads preparing the next training batches (patch crops, augmentation) while "
        "the model trains; 0 = on the training thread. Results are identical for any value: step k draws from "
        "its own stream (fedseg.train.step_generator)",
    )
    resident_mb: float = Field(
        default=4096.0,
        ge=0,
        description="on CUDA, the sites' training sets are copied to the device once, while those of one process "
        "take at most this many MiB there in all (first come, first served), and their batches are made there: "
        "whole images (images + masks) are indexed, volumes (images + masks as bool) are cropped to patches on the "
        "device; 0 = never. Results are the same either way",
    )

    @field_validator("amp", "channels_last", mode="before")
    @classmethod
    def _on_off(cls, value: object) -> object:
        return {True: "on", False: "off"}.get(value, value) if isinstance(value, bool) else value  # YAML's on/off

    @model_validator(mode="after")
    def _check(self) -> TrainConfig:
        if not all(0 <= b < 1 for b in self.adam_betas):
            raise ValueError(f"train.adam_betas must each lie in [0, 1), got {list(self.adam_betas)}")
        if self.lr_schedule == "cosine" and self.lr_min > self.lr:
            raise ValueError(f"train.lr_min={self.lr_min} must be <= train.lr={self.lr}")
        return self


class StopConfig(Strict):
    """When an algorithm stops before ``fl.rounds`` (which is then the most it may train), checked after each
    round by ``fedseg.run.stopping``; a stop happens only in a round whose model may be selected (FedSM-extra's
    model phase always runs in full) and is recorded in the checkpoint, so a resumed run stops at the same round.

    ``patience``: the validation plateau, stop once the mean validation Dice over sites has not improved by more
    than ``min_delta`` for ``patience`` rounds, but not before round ``min_rounds``. ``sgd_steps`` /
    ``simulated_hours``: a budget (FeTS 2022 Sec. 4.4.7), stop after the round in which this algorithm's own total
    local SGD steps (Eq. 34) / simulated training time (Eq. 36-38 under the ``cost`` model) reach the value; the
    ledger's total then lies in [budget, budget + one round's)."""

    patience: int | None = Field(
        default=None, ge=1, description="rounds without a validation gain > min_delta before stopping; None = never"
    )
    min_delta: float = Field(default=0.001, ge=0, description="the smallest validation Dice gain that counts")
    min_rounds: int = Field(
        default=0,
        ge=0,
        description="the plateau rule stops no run before this round (a warm-up whose validation Dice stalls for a "
        "while, e.g. before the smaller structures are found, is not a converged run)",
    )
    sgd_steps: int | None = Field(default=None, ge=1, description="budget: total local SGD steps (FeTS Eq. 34)")
    simulated_hours: float | None = Field(
        default=None, gt=0, description="budget: simulated training time in hours (FeTS Eq. 36-38, the cost model)"
    )


class SecAggPlusConfig(Strict):
    """Flower's SecAgg+ parameters (``flwr.server.workflow.SecAggPlusWorkflow``, same names and meanings), for
    ``fl.secure_aggregation: secagg+``. What is summed is each site's update (its reply minus what it received),
    clipped to ``[-clipping_range, clipping_range]`` and stochastically quantized to ``quantization_range`` levels."""

    num_shares: int | float = Field(
        default=1.0,
        description="shares each site's secret is split into: a count (> 2) or a fraction of the round's sites "
        "(1.0: every site, i.e. SecAgg)",
    )
    reconstruction_threshold: int | float = Field(
        default=0.5,
        description="shares needed to reconstruct a secret: a count (< num_shares) or a fraction of num_shares "
        "(at least 2); as in Flower, the count 1 means 1.0: every share (a dropped site then stops the round)",
    )
    clipping_range: float = Field(default=8.0, gt=0, description="each update entry is clipped to +- this")
    quantization_range: int = Field(default=4194304, gt=0, description="quantization levels (2**22)")
    modulus_range: int = Field(default=4294967296, gt=0, description="the masks' modulus, a power of 2 (2**32)")
    max_weight: float | None = Field(
        default=None,
        gt=0,
        description="the largest aggregation weight a site may have (Flower: 1000); None = the largest weight of "
        "the round's sites (known to the coordinator), which keeps the weighting exact",
    )


class LocalDPConfig(Strict):
    """Flower's ``LocalDpMod`` (same names): each site clips its update to L2 norm ``clipping_norm`` and adds
    Gaussian noise of std ``sensitivity * sqrt(2 ln(1.25 / delta)) / epsilon`` to every entry before SecAgg+
    masks it (``fl.local_dp``; needs ``fl.secure_aggregation: secagg+``)."""

    clipping_norm: float = Field(gt=0)
    sensitivity: float = Field(ge=0)
    epsilon: float = Field(gt=0)
    delta: float = Field(gt=0, lt=1)


class FLConfig(Strict):
    """Federation-level options shared by every method."""

    rounds: int = Field(default=20, ge=1, description="rounds to train (the most, with fl.stop)")
    weighting: Literal["samples", "uniform"] = "samples"
    validate_every: int = Field(default=1, ge=1)
    on_failure: Literal["stop", "skip"] = Field(
        default="stop",
        description="a site that fails (raises, times out, replies NaN/Inf or wrong shapes): stop the run with a "
        "message naming it (the last checkpoint stays intact), or skip it for that exchange (the round goes on "
        "with the others, re-weighted; recorded in ledger.csv and summary.json)",
    )
    min_sites: int = Field(
        default=1, ge=1, description="with on_failure=skip: fewest replies an exchange may go on with"
    )
    timeout_s: float | None = Field(
        default=None, gt=0, description="seconds a site may take to answer one message (wall time); None = no limit"
    )
    clients_per_round: int | float | None = Field(
        default=None,
        description="client sampling: the sites that train each round, a fraction in (0, 1] of the sites (at least "
        "one) or a count (an integer >= 1); drawn per round from (seed, round) only (fedseg.engine.sampling); "
        "None = every site. Validation and test always use every site",
    )
    stop: StopConfig = StopConfig()
    secure_aggregation: Literal["off", "secagg+"] = Field(
        default="off",
        description="secagg+: on Flower, the coordinator learns only the weighted sum of the sites' training "
        "updates (Flower's SecAgg+ workflow; fl.secagg), never one site's; only for methods whose server needs "
        "nothing else (fedseg.flower.secure)",
    )
    secagg: SecAggPlusConfig = SecAggPlusConfig()
    local_dp: LocalDPConfig | None = Field(
        default=None,
        description="local differential privacy on each site's update (Flower's LocalDpMod), inside the SecAgg+ "
        "train exchange; None = off",
    )

    @model_validator(mode="after")
    def _local_dp_needs_secagg(self) -> FLConfig:
        if self.local_dp is not None and self.secure_aggregation != "secagg+":
            raise ValueError(
                "fl.local_dp runs inside the SecAgg+ train exchange on Flower: set fl.secure_aggregation=secagg+"
            )
        return self

    @field_validator("secure_aggregation", mode="before")
    @classmethod
    def _off(cls, value: object) -> object:
        return "off" if value is False or value is None else value  # YAML reads a bare `off` as false

    @field_validator("clients_per_round")
    @classmethod
    def _sampled(cls, value: int | float | None) -> int | float | None:
        if isinstance(value, bool):
            raise ValueError("fl.clients_per_round must be a fraction in (0, 1] or a count >= 1, not a boolean")
        if isinstance(value, float) and not 0 < value <= 1:
            raise ValueError(f"fl.clients_per_round: a fraction must lie in (0, 1], got {value} (a count: an integer)")
        if isinstance(value, int) and value < 1:
            raise ValueError(f"fl.clients_per_round: a count must be >= 1, got {value}")
        return value


class EngineConfig(Strict):
    """How the sites are run on this machine (``fedseg run``; Flower deployments run them on their nodes).

    ``workers`` = 1: the in-process simulator, sites one after another. ``workers`` > 1: a pool of that
    many worker processes (``fedseg.engine.pool``), each with ``threads`` torch threads, sites in parallel,
    results bit-identical to ``workers`` = 1 on CPU. ``devices``: the workers' device slots, assigned
    round-robin (``[cuda:0, cuda:0, cuda:1]``: two workers share GPU 0); None = the run's ``device``.
    ``state``: where the sites' state stores live between rounds (``fedseg.engine.state``): ``memory``,
    or ``disk`` (one safetensors file per site under OUT/states/<algorithm>/); ``memory_budget_mb`` (with
    ``memory``): stores beyond that many MB go to disk."""

    workers: int = Field(default=1, ge=1, description="worker processes; 1 = the in-process simulator")
    devices: list[str] | None = Field(
        default=None, description="device slot per worker, round-robin (e.g. [cuda:0, cuda:1]); None = `device`"
    )
    state: Literal["memory", "disk"] = Field(
        default="memory", description="where the sites' state stores live between rounds: memory | disk"
    )
    memory_budget_mb: float | None = Field(
        default=None, gt=0, description="state: memory: stores beyond this many MB (10^6 bytes) go to disk"
    )

    @field_validator("devices")
    @classmethod
    def _some_devices(cls, devices: list[str] | None) -> list[str] | None:
        if devices is not None and not devices:
            raise ValueError("engine.devices: give at least one device, or leave it unset (the run's `device`)")
        return devices


class FaultSpec(Strict):
    """One injected fault (config ``faults``), applied where the site answers (every engine): ``crash``
    (the site raises), ``hang`` (it answers only after ``fl.timeout_s``, which must be set), ``nan`` /
    ``inf`` (one reply tensor filled with NaN / Inf), ``shape`` (one reply tensor loses an element),
    ``missing`` (one reply tensor left out), ``extra`` (a tensor of a name it was not sent added to the reply's
    group), ``weight`` (its ``num_examples``, the aggregation weight it reports, times ``factor``), ``scale``
    (every reply tensor the site received moves ``factor`` times as far from what it received: a crude
    model-poisoning attack)."""

    site: str
    round: int | None = Field(default=None, ge=1, description="the round it happens in; None = every round")
    kind: Literal["crash", "hang", "nan", "inf", "shape", "missing", "extra", "weight", "scale"]
    factor: float = Field(default=100.0, description="scale: the update's multiplier; weight: num_examples' one")
    action: str = Field(default="train", description="the exchange it hits (train, evaluate, ...)")


class EvalConfig(Strict):
    threshold: float = Field(default=0.5, gt=0, lt=1)
    score_on: Literal["label_map", "channels"] = Field(
        default="label_map",
        description="what Dice, HD95 and NSD score: label_map = the region masks of the label map the thresholded "
        "channels paint (each pixel the value of the smallest region predicted there, as fedseg predict and "
        "nnU-Net write region-based predictions), so a run's scores are those of its written masks (on the grid "
        "it scores, eval.score_grid); channels = "
        "each thresholded channel as it is (a cup predicted outside the disc is not in the disc's mask, though "
        "the written mask puts it there; runs recorded before this option scored so)",
    )
    score_grid: Literal["original", "model"] = Field(
        default="original",
        description="where the whole-image path scores the validation and test cases: original = each case's own "
        "grid (the predicted masks resized back to it, nearest, as fedseg predict writes them; Dice, HD95 and NSD "
        "in its pixels), model = the data.image_size grid the model sees (each truth resized to it, nearest; runs "
        "recorded before this option scored so; papers that report on resized images do). The volume path always "
        "scores each case's own grid",
    )
    hd95: bool = True
    hd95_worst: float | None = Field(
        default=None,
        gt=0,
        description="HD95 of a region present in exactly one of truth and prediction (fedseg.evaluate.metrics), in "
        "the HD95 unit (mm with a spacing, else pixels); None = the diagonal of the case's grid (BraTS: 373.13 mm "
        "for 240x240x155 at 1 mm)",
    )
    nsd_tolerance: float | dict[str, float] = Field(
        default=DEFAULT_NSD_TOLERANCE,
        description="normalized surface Dice's tolerance (fedseg.evaluate.metrics), in the HD95 unit (mm with a "
        "spacing, else pixels): a boundary point counts as correct within this distance of the other mask's "
        "boundary; one number, or a mapping region -> number naming every region of the task. 1.0 = 1 mm / "
        "1 pixel (the MSD-derived surface Dice at 1 mm, FLARE 2021-22); computed with HD95 (eval.hd95)",
    )
    batch_size: int = Field(default=16, ge=1)
    cross_site_hd95: bool = Field(
        default=False,
        description="the test's cross-site rows (local:<site> models on every site, eval.local_models) also get "
        "HD95 and NSD (with eval.hd95); off: Dice only there (their HD95/NSD are NaN and render as a dash). "
        "Validation exchanges always score Dice only; the final test of the selected model gets HD95/NSD",
    )
    surface_device: Literal["cpu", "auto"] = Field(
        default="cpu",
        description="where HD95 and NSD are computed: cpu = on the CPU, MONAI's numbers bit for bit "
        "(fedseg.evaluate.surface.cpu_surface_pairs, a KD-tree); auto = where the model ran, in torch "
        "(surface_pairs: exact separable distance transforms of the edges, MONAI's numbers to float32 rounding: "
        "tests allow HD95 1e-4 relative + 1e-5 absolute, NSD 1e-6). cpu is the default until auto is timed on a GPU "
        "(benchmarks/surface_speed.py; the brute force it replaced was 16x slower than cpu on an H100 machine; on 2 "
        "CPU cores auto was ~9x slower than cpu at 81df772)",
    )
    local_models: bool = Field(
        default=True,
        description="each site keeps its best locally trained model (scored on its own validation split "
        "after local training in every validated round; Auto-FedAvg Table 2) and the test adds their "
        "cross-site matrix (summary.json local_avg / local_gen). Cost: one validation pass per site and "
        "validated round (counted in the train rows' seconds), one model per site in the client state and "
        "checkpoints, and at test time K model uploads and K x K test evaluations (evaluation traffic)",
    )

    @field_validator("nsd_tolerance", mode="before")
    @classmethod
    def _positive_tolerance(cls, value: Any) -> Any:
        values = list(value.values()) if isinstance(value, dict) else [value]
        ok = bool(values) and all(
            isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v) and v > 0 for v in values
        )
        if not ok:
            raise ValueError(
                "eval.nsd_tolerance must be a number > 0 (in the HD95 unit: mm with a spacing, else pixels) or a "
                f"mapping region -> number > 0, got {value!r}"
            )
        return value


class CostConfig(Strict):
    """The FeTS Table 2 cost model (Eq. 34-38), reported as ``cost`` per algorithm in summary.json.

    ``timing = config``: ``t_batch`` = ``batch_seconds`` and ``t_eval`` = ``eval_seconds``
    (defaults: the paper's V100 values for 3D BraTS, so the estimate is deterministic and on
    the paper's scale); ``measured``: both from this run's ledger (seconds per SGD step of the
    training exchanges, seconds per case of the validation exchanges). Bandwidths in MB/s
    (10^6 bytes), defaults from the paper (fastest FeTS challenge institution)."""

    timing: Literal["config", "measured"] = "config"
    batch_seconds: float = Field(default=1.86, gt=0, description="t_batch: seconds per training batch (timing=config)")
    eval_seconds: float = Field(default=0.80, gt=0, description="t_eval: seconds per validation case (timing=config)")
    forward_fraction: float = Field(
        default=1 / 3,
        gt=0,
        le=1,
        description="a forward-only batch (q-FedAvg's loss pass) costs this fraction of t_batch (timing=config)",
    )
    download_mb_s: float = Field(default=20.0, gt=0, description="site download bandwidth, MB/s")
    upload_mb_s: float = Field(default=13.3, gt=0, description="site upload bandwidth, MB/s")
    bytes_per_float: int = Field(default=4, ge=1)


class RunConfig(Strict):
    name: str = "run"
    seed: int = Field(
        default=0,
        ge=0,
        le=SEED_MAX,
        description="the run's seed: initial weights, batch order, augmentation, client sampling; the data "
        "(generation, repartition, split) comes from data.seed",
    )
    device: str = "cpu"
    threads: int = Field(default=1, ge=1, description="torch intra-op threads")
    algorithms: list[str] = ["centralized", "local", "fedavg"]
    data: DataConfig = DataConfig()
    model: ModelConfig = ModelConfig()
    train: TrainConfig = TrainConfig()
    fl: FLConfig = FLConfig()
    engine: EngineConfig = EngineConfig()
    eval: EvalConfig = EvalConfig()
    cost: CostConfig = CostConfig()
    methods: dict[str, dict[str, Any]] = Field(
        default_factory=dict, description="per-algorithm options, e.g. {fedprox: {mu: 0.01}}"
    )
    faults: list[FaultSpec] = Field(
        default_factory=list, description="injected faults for robustness tests and studies (fedseg.engine.faults)"
    )
    tracking: list[Literal["tensorboard", "mlflow", "wandb"]] = Field(
        default_factory=list,
        description="experiment trackers (fedseg.tracking; extras fedseg[tracking], fedseg[wandb]), one tracking "
        "run per algorithm: tensorboard = event files in OUT/tb/<algorithm>/, mlflow = runs in tracking_uri, "
        "wandb = offline W&B runs in OUT/wandb/ (wandb sync to upload); empty = off",
    )
    tracking_uri: str | None = Field(
        default=None, description="MLflow tracking URI (e.g. file:///path/mlruns); default: the file store OUT/mlruns"
    )

    @model_validator(mode="after")
    def _record_behaviour_changing_defaults(self) -> RunConfig:
        """Write out the method options whose default changed what a run does (``CHANGED_METHOD_DEFAULTS``), so
        ``config.yaml`` says which behaviour the run had and an older record (without them) is told apart."""
        for name, defaults in CHANGED_METHOD_DEFAULTS.items():
            if name in self.algorithms or name in self.methods:
                entry = self.methods.get(name) or {}
                self.methods[name] = {**{k: new for k, (_, new) in defaults.items()}, **entry}
        return self

    @model_validator(mode="after")
    def _input_fits_the_network(self) -> RunConfig:
        if (problem := network_input_problem(self.model, self.data)) is not None:
            raise ValueError(problem)
        return self

    @model_validator(mode="after")
    def _hang_needs_a_timeout(self) -> RunConfig:
        if any(f.kind == "hang" for f in self.faults) and self.fl.timeout_s is None:
            raise ValueError("faults: kind hang needs fl.timeout_s (how long the run waits for a site)")
        return self

    @field_validator("algorithms")
    @classmethod
    def _each_algorithm_once(cls, names: list[str]) -> list[str]:
        if not names:
            raise ValueError("name at least one algorithm")
        if twice := sorted({name for name in names if names.count(name) > 1}):
            raise ValueError(f"{', '.join(twice)} named more than once")
        return names

    @field_validator("tracking")
    @classmethod
    def _unique_trackers(cls, names: list[str]) -> list[str]:
        return list(dict.fromkeys(names))


def network_input_problem(model: ModelConfig, data: DataConfig) -> str | None:
    """Why the network's input (``data.volume.patch_size`` on the volume path, else ``data.image_size`` per axis)
    does not fit ``model`` (``unet``/``dynunet``; a ``planned`` one is sized by its planner), or None. Each axis must
    be a multiple of the product ``f`` of the strides between ``model.channels`` levels (the decoder upsamples by
    exactly ``f`` and must meet every skip connection), and with instance or batch norm the bottom level must keep
    more than one voxel (PyTorch's norms refuse a single value per channel in training: instance norm always, batch
    norm on a batch of one image, which ``train.batch_size: 1`` or an epoch's last batch gives)."""
    if model.name == "planned":
        return None
    key, size = (
        ("data.volume.patch_size", data.volume.patch_size)
        if data.volume.patch_size is not None
        else ("data.image_size", data.image_size)
    )
    strides = model.strides or (2,) * (len(model.channels) - 1)
    lengths = {len(x) for x in (size, *strides) if isinstance(x, tuple)}
    if len(lengths) > 1:
        return None  # axes that disagree: the federation's dimensions decide which is wrong (checked when it runs)
    axes = lengths.pop() if lengths else 1
    sizes = size if isinstance(size, tuple) else (size,) * axes
    factors = [math.prod(s if isinstance(s, int) else s[a] for s in strides) for a in range(axes)]
    levels = f"the {model.name}'s {len(strides)} downsampling levels (model.channels, model.strides)"
    norm = next((kind for kind in ("instance", "batch") if kind in str(model.norm).lower()), None)
    for n, f in zip(sizes, factors):
        if n % f:
            fits = " or ".join(str(k * f) for k in sorted({max(k, 1 + bool(norm)) for k in (n // f, n // f + 1)}))
            return (
                f"{key}={_plain(size)}: {n} is not a multiple of {f}, the product of the strides of {levels}, so its "
                f"decoder cannot meet the skip connections; use {fits}"
            )
    if norm and all(n == f for n, f in zip(sizes, factors)):
        needs = {
            "instance": "instance norm needs more than one",
            "batch": "batch norm needs more than one when a batch holds one image (train.batch_size 1, or an epoch's "
            "last batch)",
        }[norm]
        return (
            f"{key}={_plain(size)}: {levels} leave one voxel at the bottom, where {needs}; use at least "
            f"{2 * max(factors)}, or fewer levels"
        )
    return None


def _plain(value: object) -> str:
    """A config value as the user writes it: ``(16, 16)`` -> ``[16, 16]``."""
    return str(list(value)) if isinstance(value, tuple) else str(value)


# Method options added with a default that changed what the method does: {method: {key: (the behaviour a
# configuration recorded before the key existed ran with, the default now)}}. A RunConfig writes them out for the
# methods it names (so a newer config.yaml always holds them); ``fedseg.config_load.with_recorded_defaults`` gives an
# older record the value its run used, so resuming it under the new default is refused rather than mixing the two.
# FedPer / LG-FedAvg's private_unit (issue 27): private_layers counted network blocks before, parameterized layers
# now (FeTS 2022's reading; the default of fedseg.algorithms.partial.SharingOptions.private_unit).
CHANGED_METHOD_DEFAULTS: dict[str, dict[str, tuple[Any, Any]]] = {
    "fedper": {"private_unit": ("blocks", "layers")},
    "lg-fedavg": {"private_unit": ("blocks", "layers")},
}
