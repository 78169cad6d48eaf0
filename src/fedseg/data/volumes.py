"""Cases on their own grid: the volumetric pre-processing, its exact inverse and random patches.

On when ``data.volume.patch_size`` is set (``fedseg.config.VolumeConfig``); FeTS 2022 benchmark
Sec. 4.4.1-4.4.2 and Auto-FedAvg Sec. 4.2.1. Every step is a MONAI transform, in this order:

1. optional resampling to ``data.volume.spacing`` (mm per axis; MONAI ``Spacing``, bilinear for the
   image, nearest for the label map), from the case's own spacing (:func:`case_spacing`);
2. foreground crop to the bounding box of the voxels that are non-zero in any channel (MONAI
   ``CropForeground`` / ``SpatialCrop``; ``crop_foreground``);
3. intensity normalization ``data.normalize`` (``zscore_foreground``: per modality within its
   non-zero voxels, :func:`fedseg.data.preprocess.normalize_image`);
4. zero-padding to at least the patch size on every axis (MONAI ``SpatialPad``, symmetric).

:class:`Grid` records what 1, 2 and 4 did, and :func:`restore` undoes them on a prediction: remove the
padding, put the crop back into a zero array of the resampled shape, resample back to the original
shape and spacing (MONAI ``Spacing`` with the original grid as output). Crop and padding are undone
exactly (a prediction lands on the very voxels it was made for); resampling is undone by
interpolation on the original grid. The same code serves 2D images (two spatial axes).

Shapes: an image is ``(C, *S)``, region masks ``(R, *S)``; ``O`` is the original spatial shape, ``P``
the preprocessed (padded) one, ``K`` the patch size.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from fedseg.config import VolumeConfig
from fedseg.data import readers
from fedseg.data.federation import Case, Regions
from fedseg.data.preprocess import CTWindows, Normalize, normalize_image


def axes(value: float | int | Sequence[float] | Sequence[int], dims: int, field: str) -> tuple:
    """A config value given as one number or one per axis -> a tuple of ``dims`` numbers; a
    ``ValueError`` naming ``field`` when the count does not fit the federation's spatial dims."""
    values = tuple(value) if isinstance(value, (tuple, list)) else (value,) * dims
    if len(values) != dims:
        raise ValueError(f"{field}: {len(values)} values {list(values)} for a federation with {dims} spatial axes")
    return values


def patch_size(cfg: VolumeConfig, dims: int) -> tuple[int, ...]:
    """``data.volume.patch_size`` as ``dims`` ints (voxels)."""
    assert cfg.patch_size is not None  # callers use this on the volume path only
    return tuple(int(v) for v in axes(cfg.patch_size, dims, "data.volume.patch_size"))


def file_spacing(path: str | Path | None, dims: int) -> tuple[float, ...]:
    """Spacing (mm per spatial axis, array order) of an image file or DICOM series folder: the voxel
    sizes in its header (the lengths of its affine's first ``dims`` columns: NIfTI zooms, NRRD/MetaImage
    spacing, DICOM pixel spacing and slice distance; ``fedseg.data.readers.volume_grid``), 1.0 per axis
    for any other file (PNG, JPEG, NPY carry none) or no file."""
    if path is None or readers.volume_format(Path(path)) is None:
        return (1.0,) * dims
    return readers.volume_grid(Path(path)).spacing(dims)


def case_spacing(case: Case, dims: int) -> tuple[float, ...]:
    """A case's spacing, mm per spatial axis: its ``spacing`` attribute or metadata when the federation
    gives one, else that of its image file (:func:`file_spacing`: NIfTI affine, else 1.0)."""
    given = getattr(case, "spacing", None) or case.meta.get("spacing")
    if given is not None:
        return tuple(float(v) for v in axes(given, dims, f"case {case.id}: spacing"))  # type: ignore[arg-type]
    image = case.meta.get("image")
    return file_spacing(str(image) if image is not None else None, dims)


def spacing_affine(spacing: Sequence[float]) -> torch.Tensor:
    """The 4x4 affine of a grid with ``spacing`` and its origin at 0 (MONAI's ``MetaTensor.affine``)."""
    diag = [float(s) for s in spacing] + [1.0] * (4 - len(spacing))
    return torch.diag(torch.tensor(diag, dtype=torch.float64))


@dataclass(frozen=True)
class Grid:
    """What pre-processing did to one case, enough to map a prediction back (:func:`restore`).

    ``shape``/``spacing``: the original grid (voxels, mm); ``resampled``: the shape after resampling
    (``shape`` without it) and ``affine`` its 4x4 affine (None without resampling); ``start``/``end``:
    the foreground box in the resampled grid (``end`` exclusive); ``pad``: (before, after) zero voxels
    per axis added to the crop.
    """

    shape: tuple[int, ...]
    spacing: tuple[float, ...]
    resampled: tuple[int, ...]
    affine: torch.Tensor | None
    start: tuple[int, ...]
    end: tuple[int, ...]
    pad: tuple[tuple[int, int], ...]


@dataclass
class Volume:
    """One case on its own grid: ``image`` ``(C, *P)`` float32 (model input), ``label`` ``(R, *P)``
    bool region masks on the same grid (training targets: float32 in a batch, ``draw_patches``; bool keeps a 3D
    case's masks at a quarter of the memory), ``truth`` ``(R, *O)`` bool region masks on the original grid
    (metrics; None for a training case, which is never scored: a quarter of a BraTS case's memory,
    ``benchmarks/case_memory.py``) and the ``grid`` to map predictions back. ``known``: ``label`` and ``truth`` hold
    one more, last channel, the known (annotated) voxels (a federation with an ignore label, ``Regions.target``)."""

    image: torch.Tensor
    label: torch.Tensor
    truth: torch.Tensor | None
    grid: Grid
    known: bool = False
    _foreground: torch.Tensor | None = field(default=None, init=False, repr=False, compare=False)
    _known: torch.Tensor | None = field(default=None, init=False, repr=False, compare=False)  # known_voxels()
    mapped: bool = field(default=False, init=False, repr=False, compare=False)  # tensors mapped from a cache file
    _sent: dict | None = field(default=None, init=False, repr=False, compare=False)  # a mapped volume's sent copy

    def __getstate__(self) -> dict:
        state = {**self.__dict__, "_foreground": None, "_known": None, "_sent": None}  # recomputed where needed
        if self.mapped:  # fedseg.data.prepared: a file mapping cannot be shared with a worker; its copy can
            if self._sent is None:  # one copy for every worker (pickled to shared memory once), as a held volume
                parts = ("image", "label", "truth")
                self._sent = {k: None if state[k] is None else state[k].clone() for k in parts}
            state.update(self._sent, mapped=False)
        return state

    @property
    def spacing(self) -> tuple[float, ...]:
        """The original spacing (mm per axis), in which metrics are computed."""
        return self.grid.spacing

    def foreground(self) -> torch.Tensor:
        """Flat (row-major over ``P``) indices of the voxels of ``label`` in any region, ascending, ``(F,)`` on the
        CPU (int32 when ``P`` allows: half the memory of a large organ's list): what ``label.any(0).nonzero()`` lists,
        computed once (a patch draw reads it every step). The known-voxel channel (``known``) is no region: an
        ignored voxel is never foreground."""
        if self._foreground is None:
            regions = self.label[:-1] if self.known else self.label
            flat = regions.any(0).flatten().nonzero().flatten().cpu()
            self._foreground = flat.int() if self.label[0].numel() < 2**31 else flat
        return self._foreground

    def known_voxels(self) -> torch.Tensor:
        """With the known-voxel channel (``known``, an ignore label): flat indices of the known (annotated) voxels of
        ``label`` as :meth:`foreground` lists its voxels, computed once; empty when every voxel is known (a patch
        anywhere holds annotated voxels: it is drawn as without an ignore label, and no list of every voxel is
        kept), when none is, or without the channel."""
        if self._known is None:
            mask = self.label[-1] if self.known else None
            if mask is None or bool(mask.all()):
                self._known = torch.zeros(0, dtype=torch.int32)
            else:
                flat = mask.flatten().nonzero().flatten().cpu()
                self._known = flat.int() if mask.numel() < 2**31 else flat
        return self._known


def _nonzero(x: torch.Tensor) -> torch.Tensor:
    return x != 0


def foreground_box(x: torch.Tensor) -> tuple[tuple[int, ...], tuple[int, ...]] | None:
    """The bounding box ``(start, end)`` (``end`` exclusive, voxels per spatial axis) of the voxels of ``x``
    ``(C, *S)`` that are non-zero in any channel (MONAI ``CropForeground``; nnU-Net's ``crop_to_nonzero``
    box); None for an all-zero image."""
    from monai.transforms import CropForeground

    box = CropForeground(select_fn=_nonzero, allow_smaller=True).compute_bounding_box(x)
    if not all(int(e) > int(s) for s, e in zip(*box)):
        return None
    return tuple(int(v) for v in box[0]), tuple(int(v) for v in box[1])


def preprocess(
    image: np.ndarray,
    label: np.ndarray | None,
    regions: Regions,
    spacing: Sequence[float],
    cfg: VolumeConfig,
    normalize: Normalize | CTWindows,
) -> tuple[torch.Tensor, torch.Tensor | None, Grid]:
    """Steps 1-4 of the module docstring on ``image`` ``(C, *O)`` and integer ``label`` ``(*O)`` (or None)
    with the case's ``spacing`` (mm per axis). Returns ``(image (C, *P) float32, region masks (R, *P)
    bool or None, grid)``, ``P >= patch size`` on every axis; the masks with an ignore label as ``Regions.target``
    (the known voxels last: padding is known background)."""
    from monai.data import MetaTensor
    from monai.transforms import Spacing, SpatialCrop, SpatialPad

    dims = image.ndim - 1
    shape, spacing = tuple(int(n) for n in image.shape[1:]), tuple(float(s) for s in spacing)
    x = torch.from_numpy(image.astype(np.float32))
    lab = None if label is None else torch.from_numpy(label.astype(np.float32))[None]
    affine = None
    if cfg.spacing is not None:
        target = axes(cfg.spacing, dims, "data.volume.spacing")
        resampled = Spacing(pixdim=target, mode="bilinear")(MetaTensor(x, affine=spacing_affine(spacing)))
        assert isinstance(resampled, MetaTensor)  # MONAI keeps the affine of a MetaTensor input
        affine = resampled.affine.clone()
        x = _plain(resampled)
        if lab is not None:
            lab = _plain(Spacing(pixdim=target, mode="nearest")(MetaTensor(lab, affine=spacing_affine(spacing))))
    resampled_shape = tuple(int(n) for n in x.shape[1:])
    start, end = (0,) * dims, resampled_shape
    if cfg.crop_foreground:
        box = foreground_box(x)
        if box is not None:
            start, end = box
            crop = SpatialCrop(roi_start=start, roi_end=end)
            x = _plain(crop(x))
            lab = None if lab is None else _plain(crop(lab))
    x = torch.from_numpy(normalize_image(x.numpy(), normalize))
    padder = SpatialPad(spatial_size=patch_size(cfg, dims), mode="constant")
    widths: Sequence[tuple[int, int]] = padder.compute_pad_width(x.shape[1:])[1:]
    pad = tuple((int(before), int(after)) for before, after in widths)
    x = _plain(padder(x))
    masks = None
    if lab is not None:
        lab = _plain(padder(lab))[0].round().long()
        masks = torch.from_numpy(regions.target(lab.numpy())).bool()
    return x, masks, Grid(shape, spacing, resampled_shape, affine, start, end, pad)


def _plain(x) -> torch.Tensor:
    """A MONAI output (``MetaTensor`` or tensor) as a plain contiguous tensor."""
    from monai.data import MetaTensor

    return (x.as_tensor() if isinstance(x, MetaTensor) else torch.as_tensor(x)).contiguous()


def restore(values: torch.Tensor, grid: Grid, threshold: float | None = None) -> torch.Tensor:
    """Map ``values`` ``(R, *P)`` (probabilities, or anything 0 outside the foreground) from the
    preprocessed grid back to the original one, ``(R, *O)`` float32 (module docstring): padding removed,
    the crop put back into zeros, resampling undone (bilinear onto the original grid).

    ``threshold``: the bool masks ``restore(values, grid) > threshold`` ``(R, *O)``, the same to the bit, made one
    region at a time, so that one region's float copies on the original grid exist at once rather than all of them
    (this function's float32 array, MONAI ``Spacing``'s float64 input and output); bilinear resampling
    (``grid_sample``) computes each channel alone from the same sampling grid. Without resampling no float copy of
    the original grid is made at all. MONAI's sampling grid (``affine_grid``: 56 bytes per original voxel while it is
    built, 24 after) is made once per region: its memory does not depend on R."""
    from monai.data import MetaTensor
    from monai.transforms import Spacing

    def back(full: torch.Tensor) -> torch.Tensor:  # resampling undone: (R, *resampled) -> (R, *O) float32
        out = Spacing(pixdim=grid.spacing, mode="bilinear")(
            MetaTensor(full, affine=grid.affine), output_spatial_shape=grid.shape
        )
        return _plain(out).float()

    inner = tuple(slice(b, n - a) for (b, a), n in zip(grid.pad, values.shape[1:]))
    box = tuple(slice(s, e) for s, e in zip(grid.start, grid.end))
    regions = values.shape[0]
    if threshold is None:
        values = values.float()
        full = values.new_zeros((regions, *grid.resampled))
        full[(slice(None), *box)] = values[(slice(None), *inner)]
        return full if grid.affine is None else back(full)
    if grid.affine is None:  # the crop's voxels thresholded in place; around it, what a zero thresholds to
        zero = bool(torch.zeros((), dtype=torch.float32) > threshold)
        masks = torch.full((regions, *grid.shape), zero, dtype=torch.bool, device=values.device)
        masks[(slice(None), *box)] = values[(slice(None), *inner)].float() > threshold
        return masks
    masks = torch.empty((regions, *grid.shape), dtype=torch.bool, device=values.device)
    for r in range(regions):
        full = torch.zeros((1, *grid.resampled), dtype=torch.float32, device=values.device)
        full[(slice(None), *box)] = values[(slice(r, r + 1), *inner)]
        masks[r] = back(full)[0] > threshold
        del full
    return masks


def build_volume(
    image: np.ndarray,
    label: np.ndarray,
    regions: Regions,
    spacing: Sequence[float],
    cfg: VolumeConfig,
    normalize,
    *,
    scored: bool = True,
) -> Volume:
    """One case's :class:`Volume` (pre-processing of the module docstring, plus, for a case that is ``scored`` (a
    validation or test case), the original-grid truth)."""
    x, masks, grid = preprocess(image, label, regions, spacing, cfg, normalize)
    assert masks is not None  # a label was given
    truth = torch.from_numpy(regions.target(label.astype(np.int64))).bool() if scored else None
    return Volume(x, masks, truth, grid, known=regions.ignore is not None)


def draw_patches(
    volumes: Sequence[Volume],
    size: Sequence[int],
    foreground: float,
    generator: torch.Generator,
    pin: bool = False,
    sources: Sequence[tuple[torch.Tensor, torch.Tensor]] | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One random patch of ``size`` voxels from each of ``volumes`` (FeTS Sec. 4.4.1-4.4.2: an epoch is
    one patch per case): ``(x (B, C, *K), y (B, R, *K))`` float32, in pinned memory if ``pin`` (a CUDA copy
    then needs no staging copy). ``sources``: copies of each volume's ``(image, label)`` to crop from instead
    (``CaseSet.resident``: on the GPU, the label may be bool); the batch is then on their device. The values
    are the same either way (crops are copies; a 0/1 mask converts exactly).

    Per volume, from ``generator`` only (so the draw is a function of the step's random stream): a
    uniform number ``u``; if ``u < foreground`` and the volume has a labelled voxel, the patch is centred
    on a labelled voxel drawn uniformly (clipped to the volume); else, with an ignore label (``Volume.known``)
    and a case only partly annotated, as nnU-Net does, on a known (annotated) voxel drawn uniformly
    (``Volume.known_voxels``: no patch without an annotated voxel, which would give no loss); else its corner is
    uniform over all positions. Each crop is copied straight into the batch (the voxels MONAI ``SpatialCrop`` gives).
    Nothing here waits for a device: positions come from the CPU (``Volume.foreground``)."""
    first = volumes[0]
    device = first.image.device if sources is None else sources[0][0].device
    pin = pin and device.type == "cpu"
    x = torch.empty((len(volumes), first.image.shape[0], *size), dtype=first.image.dtype, device=device, pin_memory=pin)
    y = torch.empty((len(volumes), first.label.shape[0], *size), dtype=torch.float32, device=device, pin_memory=pin)
    for i, vol in enumerate(volumes):
        shape = vol.image.shape[1:]
        top = [n - k for n, k in zip(shape, size)]
        u = float(torch.rand((), generator=generator))
        fg = vol.foreground() if u < foreground else None
        if fg is None or not len(fg):
            fg = vol.known_voxels() if vol.known else None  # an annotated voxel, not any (an ignore label)
        if fg is not None and len(fg):
            centre = np.unravel_index(int(fg[int(torch.randint(len(fg), (), generator=generator))]), shape)
            start = [min(max(int(c) - k // 2, 0), t) for c, k, t in zip(centre, size, top)]
        else:
            start = [int(torch.randint(t + 1, (), generator=generator)) for t in top]
        box = (slice(None), *(slice(s, s + k) for s, k in zip(start, size)))
        image, label = (vol.image, vol.label) if sources is None else sources[i]
        x[i].copy_(image[box])
        y[i].copy_(label[box])
    return x, y
