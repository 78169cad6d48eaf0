"""Preprocessed tensors of one site's split, and a site's three splits together."""

from __future__ import annotations

import logging
import weakref
from collections.abc import Mapping
from contextlib import closing
from dataclasses import dataclass, field
from itertools import islice

import torch

from fedseg.config import DataConfig, VolumeConfig
from fedseg.data.federation import UNANNOTATED, Case, Federation, FederationError, Site
from fedseg.data.memory_guard import MemoryGuard
from fedseg.data.metadata import metadata_value
from fedseg.data.packed import PackedMasks
from fedseg.data.prefetch import ordered_map, usable_cpus
from fedseg.data.prepared import PreparedCache, PreparedCase, prepare_case
from fedseg.data.preprocess import Fit, fit_box, normalization
from fedseg.data.volumes import Volume, draw_patches, patch_size

log = logging.getLogger("fedseg.data.dataset")
RESIDENT_MB: dict[str, float] = {}  # device -> MiB of training sets this process keeps there (CaseSet.resident)


def _give_back(device: str, size_mb: float) -> None:
    RESIDENT_MB[device] -= size_mb


@dataclass
class CaseSet:
    """Cases of one split.

    ``x``: ``(N, C, *S)`` float32 images, ``y``: ``(N, R, *S)`` float32 region masks, ``ids``: N case ids,
    every case resized to ``S = (data.image_size,) * dims``: the model input on the whole-image path.

    On the volume path (``data.volume.patch_size`` set) ``volumes`` holds every case on its own grid
    (``fedseg.data.volumes.Volume``: variable-size tensors, the original-grid truth, the inverse mapping)
    and ``volume`` the config they were built with: training draws patches from them (:meth:`patches`),
    evaluation slides a window over them (``fedseg.evaluate.sliding``). ``x``/``y`` stay as a fixed-size
    view for what needs one input size (FedSM's selector, which classifies whole images).

    ``originals`` (whole-image path, scored sets, ``eval.score_grid: original``): per case its region masks
    ``(R, *S_i)`` on its own grid (``fedseg.data.packed.PackedMasks``: one bit a voxel, one buffer), None for a
    case already on the model grid (then ``y`` is its truth); evaluation scores the predictions resized back there
    (``fedseg.evaluate.inference.score_caseset``) from where ``fit`` (``data.resize``: ``stretch`` | ``pad``,
    ``fedseg.data.preprocess.fit_box``) placed each case in the model input.

    ``known`` (a federation with an ignore label, ``Regions.target``): ``y``, ``originals`` and the volumes' masks
    hold one more, last channel, the known (annotated) voxels; :attr:`regions` is R either way.
    """

    name: str
    ids: list[str]
    x: torch.Tensor
    y: torch.Tensor
    volumes: list[Volume] | None = None
    volume: VolumeConfig | None = None
    originals: PackedMasks | None = None
    fit: Fit = "stretch"
    known: bool = False
    _resident: dict[str, tuple[torch.Tensor, torch.Tensor]] = field(default_factory=dict, repr=False, compare=False)
    _resident_volumes: dict[str, list[tuple[torch.Tensor, torch.Tensor]]] = field(
        default_factory=dict, repr=False, compare=False
    )

    def __len__(self) -> int:
        return len(self.ids)

    @property
    def regions(self) -> int:
        """R, the regions (the model's output channels): ``y``'s channels but the known-voxel mask (``known``)."""
        return self.y.shape[1] - self.known

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_resident": {}, "_resident_volumes": {}}  # a device copy stays in its process

    def batch(self, idx: torch.Tensor, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """The fixed-size view of cases ``idx``: ``(x (B, C, *S), y (B, R, *S))`` on ``device`` (indexed on the
        device when the set is resident there, :meth:`resident`)."""
        x, y = self._resident.get(str(device), (self.x, self.y))
        idx = idx.to(x.device)
        return to_device(x[idx], device), to_device(y[idx], device)

    def resident(self, device: torch.device, budget_mb: float) -> bool:
        """Keep a copy of the training input on accelerator ``device`` (CUDA; copied once, kept with the set) while
        the sets this process keeps there take at most ``budget_mb`` MiB in all (``train.resident_mb``; first come,
        first served: sites train in a fixed order, so the same sets each time): the fixed-size view ``x``, ``y`` on
        the whole-image path (:meth:`batch` then indexes there), or every volume's image and label on the volume path
        (the label as bool, a quarter of its float32 size; :meth:`patches` then crops there, so a training batch is
        never copied from the host). Returns whether the set is resident on ``device``. Values unchanged (copies; a
        0/1 mask converts exactly). A set's share of the budget is given back when the set is freed."""
        key = str(device)
        if key in self._resident or key in self._resident_volumes:
            return True
        if device.type == "cpu" or not len(self):
            return False
        if self.volumes is None:
            size_mb = (self.x.nbytes + self.y.nbytes) / 2**20
        else:
            size_mb = sum(v.image.nbytes + v.label.numel() for v in self.volumes) / 2**20
        if RESIDENT_MB.get(key, 0.0) + size_mb > budget_mb:
            return False
        if self.volumes is None:
            self._resident[key] = (self.x.to(device), self.y.to(device))
        else:
            self._resident_volumes[key] = [(v.image.to(device), v.label.to(device, torch.bool)) for v in self.volumes]
        RESIDENT_MB[key] = RESIDENT_MB.get(key, 0.0) + size_mb
        weakref.finalize(self, _give_back, key, size_mb)
        return True

    def patches(
        self, idx: torch.Tensor, generator: torch.Generator, pin: bool = False, device: torch.device | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """One random patch per case ``idx`` (volume path; ``fedseg.data.volumes.draw_patches``):
        ``(x (B, C, *K), y (B, R, *K))`` with ``K`` the patch size, cropped on ``device`` where the set is
        resident there (:meth:`resident`), else on the CPU (in pinned memory if ``pin``)."""
        assert self.volumes is not None and self.volume is not None  # the volume path
        cases = idx.tolist()
        vols = [self.volumes[i] for i in cases]
        resident = self._resident_volumes.get(str(device))
        sources = None if resident is None else [resident[i] for i in cases]
        size = patch_size(self.volume, self.x.dim() - 2)
        return draw_patches(vols, size, self.volume.foreground_oversample, generator, pin, sources)

    def training_batch(
        self, idx: torch.Tensor, device: torch.device, generator: torch.Generator
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The input a training step of cases ``idx`` feeds the model (before augmentation), on ``device``:
        the fixed-size view (:meth:`batch`, ``generator`` unused) on the whole-image path, one random patch
        per case (:meth:`patches`, drawn from ``generator``) on the volume path. What the Trainer draws
        (``fedseg.train.Trainer.draw``) and what the methods that score a model on training batches use
        (Auto-FedAvg's beta steps, q-FedAvg's F_k, Per-FedAvg's second batch)."""
        if self.volumes is None:
            return self.batch(idx, device)
        x, y = self.patches(idx, generator, pin=device.type == "cuda", device=device)
        return to_device(x, device), to_device(y, device)

    def subset(self, idx: torch.Tensor) -> CaseSet:
        """Cases ``idx`` (a 1-D index tensor) as a set of the same name."""
        cases = idx.tolist()
        vols = None if self.volumes is None else [self.volumes[i] for i in cases]
        originals = None if self.originals is None else self.originals.select(cases)
        x, y = self.x[idx], self.y[idx]
        ids = [self.ids[i] for i in cases]
        return CaseSet(self.name, ids, x, y, vols, self.volume, originals, self.fit, self.known)

    @classmethod
    def concat(cls, name: str, sets: list[CaseSet]) -> CaseSet:
        """Pool several sets (centralized training); ids are prefixed with their set's name."""
        ids = [f"{s.name}/{i}" for s in sets for i in s.ids]
        x, y = torch.cat([s.x for s in sets]), torch.cat([s.y for s in sets])
        originals = PackedMasks.join([(s.originals, len(s)) for s in sets])
        fit = sets[0].fit if sets else "stretch"  # one run's sets: one data.resize
        known = sets[0].known if sets else False  # one federation's sets: one ignore label or none
        if not sets or any(s.volumes is None for s in sets):
            return cls(name, ids, x, y, originals=originals, fit=fit, known=known)
        vols = [v for s in sets for v in s.volumes or []]
        return cls(name, ids, x, y, vols, sets[0].volume, fit=fit, known=known)


def to_device(x: torch.Tensor, device: torch.device) -> torch.Tensor:
    """``x`` on ``device``: a CPU tensor bound for CUDA goes through pinned memory and is copied without
    blocking (ordered on the current stream before any kernel that reads it); otherwise ``x.to(device)``."""
    if device.type == "cuda" and x.device.type == "cpu":
        return (x if x.is_pinned() else x.pin_memory()).to(device, non_blocking=True)
    return x.to(device)


@dataclass
class SiteData:
    """What one site holds locally: its name, index in the federation, three splits and its metadata.

    ``metadata``: the site-level metadata (``federation.yaml`` ``sites:``); ``case_metadata``: case id ->
    case-level metadata (``cases.csv`` columns) for every case of the site, whatever its split (``{}``
    for a case without any). Metadata is never a model input unless a method says so.

    ``train`` holds the training cases the site trains on: with an ignore label (partial annotations) a training case
    without an annotated voxel (:func:`trains_nothing`) is left out, so that every consumer of ``len(train)`` (FedAvg's
    aggregation weight n_k, the declared training-set size, samplers, local steps per epoch, ``train_samples``)
    counts only cases it trains on; ``unannotated_train`` is how many were left out (0 without an ignore label).
    """

    name: str
    index: int
    train: CaseSet
    val: CaseSet
    test: CaseSet
    metadata: dict[str, object] = field(default_factory=dict)
    case_metadata: dict[str, dict[str, object]] = field(default_factory=dict)
    sources: list[Case] = field(default_factory=list)  # raw training cases, only for planning (fedseg.plan)
    cache_counts: tuple[int, int] = (0, 0)  # cases (read from, stored in) $FEDSEG_PREPARED_CACHE (fedseg.data.prepared)
    unannotated_train: int = 0  # training cases left out of ``train``: no annotated voxel (trains_nothing)

    def split(self, name: str) -> CaseSet:
        return {"train": self.train, "val": self.val, "test": self.test}[name]

    def metadata_value(self, key: str) -> str:
        """The site's value of metadata ``key``, as a string: the site-level value if there is one, else
        the most common non-empty value of the case-level column ``key`` over all the site's cases (ties:
        the smallest value in string order). Raises ``ValueError`` naming the keys the site has when
        neither exists. Deterministic: a function of the metadata alone."""
        return metadata_value(self.name, key, self.metadata, self.case_metadata)


MAX_PREPARE_THREADS = 8  # data.prepare_threads = 0: the CPUs this process may use, at most this many


def prepare_threads(cfg: DataConfig) -> int:
    """Threads pre-processing a site's cases at once: ``data.prepare_threads``, or for 0 the CPUs this process may
    use (``fedseg.data.prefetch.usable_cpus``: its affinity and cgroup CPU quota), at most
    :data:`MAX_PREPARE_THREADS`."""
    if cfg.prepare_threads:
        return cfg.prepare_threads
    return min(usable_cpus(), MAX_PREPARE_THREADS)


def trains_nothing(case: Case, prepared: PreparedCase, cfg: DataConfig) -> bool:
    """Whether training case ``case`` (``prepared`` under ``cfg``) of a federation with an ignore label holds no
    annotated voxel, so it would train nothing (the loss takes only annotated voxels): ``data check``'s verdict
    (``meta[UNANNOTATED]``: every voxel of its label file holds the ignore label) where the check examined the case
    (``meta["image_shape"]``, which it sets on every sound case), else its prepared label: the known-voxel channel
    (``Regions.target``, the last) holds no voxel outside the padding pre-processing added (padding is known
    background: the volume path's ``Grid.pad``; the whole-image path's ``data.resize: pad`` box, :func:`_padded_only`).
    """
    if "image_shape" in case.meta or UNANNOTATED in case.meta:
        return bool(case.meta.get(UNANNOTATED))
    if prepared.volume is not None:  # the volume path trains on the volume's patches
        vol = prepared.volume
        known = vol.label[-1]
        inner = tuple(slice(before, n - after) for (before, after), n in zip(vol.grid.pad, known.shape))
        return not bool(known[inner].any())
    known = prepared.y[-1] > 0.5
    if cfg.resize == "stretch":  # the image fills the model input: no padding
        return not bool(known.any())
    return _padded_only(known, prepared.x, cfg)


def _padded_only(known: torch.Tensor, x: torch.Tensor, cfg: DataConfig) -> bool:
    """``data.resize: pad`` without the case's shape: whether the known voxels ``known`` ``(*S)`` are exactly the
    padding around an image placed as ``fit_box`` places one (the unknown voxels fill a centred box whose longest side
    spans the input, where ``fit_box`` of that shape puts it), the image ``x`` zero in every channel there. A label
    of only the ignore label always is; a case with annotated voxels only where its ignore voxels form such a box
    and its image is exactly 0 at every annotated voxel would be taken for one too (the data check's verdict, which
    reads the label file, decides wherever it was run: a run given the folder as ``data.root``)."""
    unknown = ~known
    if not bool(unknown.any()):
        return False  # every voxel known
    where = unknown.nonzero()
    start, end = where.min(0).values.tolist(), (where.max(0).values + 1).tolist()
    shape = tuple(e - s for s, e in zip(start, end))
    box = tuple(slice(s, e) for s, e in zip(start, end))
    if int(unknown[box].sum()) != unknown[box].numel():
        return False
    if fit_box(shape, cfg.image_size, "pad") != (shape, tuple(start)):
        return False
    return not bool(x[:, known].any())


def build_site_data(
    fed: Federation,
    site: Site,
    index: int,
    splits: Mapping[str, str],
    cfg: DataConfig,
    *,
    originals: bool,
    guard: MemoryGuard | None = None,
) -> SiteData:
    """Load and preprocess one site's cases into its train/val/test ``CaseSet``s (with their volumes
    when ``cfg.volume.patch_size`` is set: ``fedseg.data.volumes``; with ``originals``, ``eval.score_grid:
    original``, the truth of every validation and test case the whole-image path resizes, ``CaseSet.originals``).

    The cases are read and pre-processed by :func:`prepare_threads` threads at once (reading a file, resampling
    and normalizing mostly run outside Python's lock), in order, at most ``threads + 1`` cases ahead of the one
    being stored, each split's prepared cases let go once stacked: each case is a function of its files and ``cfg``
    alone, so the tensors are the same to the bit for any number of threads (``tests/test_prepare_threads.py``);
    the first case that fails raises, as it would alone. Memory: a case being prepared takes several times its
    prepared size for a moment (a BraTS case about 1 GB), per thread. A federation from your own code
    (``Case.loader``) must then be safe to read from several threads (else ``data.prepare_threads: 1``).

    With an ignore label, a training case without an annotated voxel (:func:`trains_nothing`) is prepared but left out
    of ``train`` (counted in ``SiteData.unannotated_train``); a site left with none raises ``FederationError``.
    Validation and test cases are all kept (their metrics are NaN for such a case). Without an ignore label nothing
    is looked at: the sets are what they were.

    ``guard``: the memory check of the process's whole preparation (``fedseg.data.memory_guard``: each prepared case
    measured, a ``NotEnoughMemory`` raised as soon as the cases are projected not to fit); None: one for this site's
    cases alone (a Flower SuperNode's)."""
    by_split: dict[str, list] = {"train": [], "val": [], "test": []}
    for case in site.cases:
        by_split[splits[case.id]].append(case)
    on_grid = cfg.volume.patch_size is not None
    norm = normalization(cfg.normalize, cfg.ct_windows)
    cache = PreparedCache.open(fed, cfg, originals)
    if guard is None:
        guard = MemoryGuard.start(len(site.cases), scored_cases=len(by_split["val"]) + len(by_split["test"]))

    def prepare(job: tuple[str, Case]) -> PreparedCase:
        split, case = job
        scored = split != "train"
        if cache is not None:
            return cache.prepare(case, norm, scored=scored)
        return prepare_case(fed, case, cfg, norm, scored=scored, originals=originals)

    jobs = [(split, case) for split, cases in by_split.items() for case in cases]
    threads = min(prepare_threads(cfg), len(jobs))
    sets = {}
    ignore = fed.regions.ignore
    unannotated = 0  # training cases without an annotated voxel (trains_nothing): left out of the training set
    with closing(ordered_map(prepare, jobs, threads if threads > 1 else 0, name="prepare")) as stream:
        for split, cases in by_split.items():  # the jobs' order: a split's cases are let go once stacked
            cases_done = []
            kept = []
            for case, prepared in zip(cases, islice(stream, len(cases))):
                guard.add(prepared, case, scored=split != "train")
                if split == "train" and ignore is not None and trains_nothing(case, prepared, cfg):
                    unannotated += 1
                    continue
                cases_done.append(prepared)
                kept.append(case)
            if split == "train" and cases and not kept:
                raise FederationError(
                    f"site {site.name!r}: none of its {len(cases)} training cases has an annotated voxel (every one "
                    f"holds only the ignore label {ignore}): the site has nothing to train on"
                )
            cases = kept
            shape_x = (0, fed.channels) + (cfg.image_size,) * fed.spatial_dims
            shape_y = (0, fed.regions.target_channels) + (cfg.image_size,) * fed.spatial_dims
            vols = [c.volume for c in cases_done if c.volume is not None]
            sets[split] = CaseSet(
                f"{site.name}:{split}",
                [c.id for c in cases],
                torch.stack([c.x for c in cases_done]) if cases_done else torch.empty(shape_x),
                torch.stack([c.y for c in cases_done]) if cases_done else torch.empty(shape_y),
                vols if on_grid else None,
                cfg.volume if on_grid else None,
                PackedMasks.pack([c.truth for c in cases_done]),
                cfg.resize,
                fed.regions.ignore is not None,
            )
            del cases_done
    guard.site_done()
    if cache is not None and (cache.hits or cache.stored):
        log.info(
            f"site {site.name}: {cache.hits} of {len(jobs)} cases read from the prepared-case cache {cache.root}, "
            f"{cache.stored} prepared and stored there"
        )
    return SiteData(
        site.name,
        index,
        sets["train"],
        sets["val"],
        sets["test"],
        metadata=dict(site.meta),
        case_metadata={case.id: case.metadata for case in site.cases},
        cache_counts=(0, 0) if cache is None else (cache.hits, cache.stored),
        unannotated_train=unannotated,
    )


def raw_site_data(fed: Federation, site: Site, index: int, splits: Mapping[str, str]) -> SiteData:
    """One site before any pre-processing: empty splits (nothing loaded) and its training cases as
    ``sources`` (lazy arrays), what a site's planning client reads (``fedseg.plan.fingerprint``)."""
    shape = (0, fed.channels) + (1,) * fed.spatial_dims
    empty = lambda split: CaseSet(f"{site.name}:{split}", [], torch.empty(shape), torch.empty(shape))  # noqa: E731
    train = [case for case in site.cases if splits[case.id] == "train"]
    return SiteData(site.name, index, empty("train"), empty("val"), empty("test"), dict(site.meta), {}, train)
