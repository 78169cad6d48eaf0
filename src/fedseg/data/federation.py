"""Federation contract: sites, cases, regions and per-site splits.

A *case* is one image with its integer label map. Images are channel-first
``(C, *spatial)`` arrays (``spatial`` is ``(H, W)`` or ``(D, H, W)``; for NIfTI files the
spatial axes are the file's voxel axes ``(X, Y, Z)`` in stored order, not reoriented), labels are
``(*spatial)`` integer arrays whose values map to named *regions* (sets of label
values, see ``Regions``). Arrays are kept in their stored dtype (``uint8`` for the
built-in federations, anything numeric for folder federations); conversion to model
input happens in ``fedseg.data.preprocess``.

Sites and cases may carry *metadata* (see ``fedseg.data.metadata``): ``Site.meta`` (site-level,
scalar values) and the case-level columns in ``Case.meta`` (``Case.metadata``). It describes
the data (grade, vendor, the patient a slice comes from); it is never a model input unless a
method says so.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Literal

import numpy as np

if TYPE_CHECKING:
    import torch

Split = Literal["train", "val", "test"]
SPLITS: tuple[Split, ...] = ("train", "val", "test")


class FederationError(ValueError):
    """A federation (folder, config or split file) is malformed. The message names the file and the problem."""


@dataclass(frozen=True)
class Regions:
    """Named regions, each a set of label values: ``{"disc": (1, 2), "cup": (2,)}``.

    The network predicts one sigmoid channel per region, in this order.

    ``ignore``: nnU-Net's ``ignore`` label (partial or sparse annotations, ``federation.yaml`` ``ignore_label``),
    the label value of unannotated voxels, or None. It lies in no region and above every region's value; training
    takes no loss from its voxels and the metrics count only the others. The region masks the data pipeline carries
    (:meth:`target`) then hold one more, last channel: the known (annotated) voxels; the model's channels stay one
    per region.
    """

    names: tuple[str, ...]
    values: tuple[tuple[int, ...], ...]
    ignore: int | None = None

    @classmethod
    def from_mapping(cls, mapping: Mapping[str, list[int] | tuple[int, ...]], ignore: int | None = None) -> Regions:
        """Regions from ``{name: label values}`` in order, e.g. ``{"disc": [1, 2], "cup": [2]}``: a pixel of a
        case's label map ``(*spatial)`` whose value is listed belongs to that region (0 is background; a value may
        lie in several, nested regions). A ``FederationError`` for no region, or one without positive values, or an
        ``ignore`` value (:func:`ignore_problem`) that is not an integer above every region's value."""
        if not mapping:
            raise FederationError("regions: at least one region is required")
        names, values = [], []
        for name, vals in mapping.items():
            vals = tuple(int(v) for v in vals)
            if not vals or any(v <= 0 for v in vals):
                raise FederationError(f"regions.{name}: needs one or more positive label values, got {list(vals)}")
            names.append(str(name))
            values.append(vals)
        if ignore is not None and (problem := ignore_problem(ignore, {v for vals in values for v in vals})):
            raise FederationError(f"ignore_label: {problem}")
        return cls(tuple(names), tuple(values), None if ignore is None else int(ignore))

    def as_dict(self) -> dict[str, list[int]]:
        return {n: list(v) for n, v in zip(self.names, self.values)}

    @property
    def label_values(self) -> set[int]:
        """Every label value that belongs to some region (0 = background is not included)."""
        return {v for vals in self.values for v in vals}

    def one_hot(self, label: np.ndarray) -> np.ndarray:
        """Label map ``(*spatial)`` -> region masks ``(R, *spatial)`` of dtype uint8."""
        return np.stack([np.isin(label, vals) for vals in self.values]).astype(np.uint8)

    @property
    def target_channels(self) -> int:
        """The channels of :meth:`target`'s masks: one per region, plus the known-voxel mask with an ``ignore``."""
        return len(self) + (self.ignore is not None)

    def target(self, label: np.ndarray) -> np.ndarray:
        """Label map ``(*spatial)`` -> the masks training and scoring read, uint8: :meth:`one_hot`'s ``(R, *spatial)``
        without an ``ignore`` label (the very same array), else ``(R + 1, *spatial)``, its last channel the known
        voxels (``label != ignore``; an ignored voxel lies in no region). :func:`split_known` takes them apart."""
        masks = self.one_hot(label)
        if self.ignore is None:
            return masks
        return np.concatenate([masks, (np.asarray(label) != self.ignore)[None].astype(np.uint8)])

    def paint_order(self) -> list[tuple[int, int]]:
        """nnU-Net's ``regions_class_order``: ``(region index, label value)`` pairs, the largest region first (ties
        keep this order), each region painted with its own value, the smallest of its values that lies in no later
        (smaller) region. Painting a label map in this order over background gives every pixel the value of the
        smallest region it is predicted in, whatever the larger ones say (BraTS: an ET voxel is 4 even where TC or WT
        missed it). A ValueError where no order paints them: two regions that overlap without one containing the
        other, or a region whose every value lies in a smaller region."""
        sets = [set(v) for v in self.values]
        for i in range(len(self)):
            for j in range(i + 1, len(self)):
                if sets[i] & sets[j] and not (sets[i] <= sets[j] or sets[j] <= sets[i]):
                    raise ValueError(
                        f"regions {self.names[i]!r} {list(self.values[i])} and {self.names[j]!r} "
                        f"{list(self.values[j])} overlap without one containing the other"
                    )
        order = sorted(range(len(self)), key=lambda i: -len(self.values[i]))
        painted = []
        for pos, i in enumerate(order):
            later = {v for j in order[pos + 1 :] for v in sets[j]}
            own = sorted(sets[i] - later)
            if not own:
                raise ValueError(
                    f"region {self.names[i]!r} {list(self.values[i])}: every value lies in a smaller region"
                )
            painted.append((i, own[0]))
        return painted

    def to_label(self, masks: np.ndarray) -> np.ndarray:
        """Region masks ``(R, *spatial)`` (bool or 0/1) -> label map ``(*spatial)``, the inverse of ``one_hot``.

        Regions that are nested or disjoint (BraTS WT/TC/ET, disc/cup, separate organs) are painted in
        :meth:`paint_order`, as nnU-Net writes region-based predictions and ``data export nnunet`` orders them: a
        pixel gets the value of the smallest region it is predicted in (an ET voxel without TC or WT -> 4; cup
        without disc -> 2). Other regions (overlapping without nesting) get, per pixel, the label value (0 =
        background included) whose set of regions differs from the predicted ones in the fewest regions; ties go to
        the value that lies in more of the predicted regions, then to the smaller value. Either way every mask
        ``one_hot`` can produce maps back exactly. dtype: the smallest unsigned integer type that holds the largest
        label value.
        """
        m = np.asarray(masks).astype(bool)
        if m.shape[0] != len(self):
            raise ValueError(f"expected {len(self)} region masks ({', '.join(self.names)}), got {m.shape[0]}")
        values = [0, *sorted(self.label_values)]
        dtype = np.min_scalar_type(values[-1])
        try:
            order = self.paint_order()
        except ValueError:
            return self._closest_label(m, values).astype(dtype)
        label = np.zeros(m.shape[1:], dtype)
        for region, value in order:
            label[m[region]] = value
        return label

    def _closest_label(self, m: np.ndarray, values: list[int]) -> np.ndarray:
        """Per pixel the label value whose regions differ least from ``m``'s (:meth:`to_label`)."""
        flat = m.reshape(len(self), -1)  # (R, P)
        best = np.zeros(flat.shape[1], np.int64)
        best_key = np.full(flat.shape[1], np.iinfo(np.int64).max)
        for i, v in enumerate(values):
            member = np.array([v in vals for vals in self.values])  # (R,): the regions value v lies in
            differ = (flat != member[:, None]).sum(0)
            hits = flat[member].sum(0)
            key = (differ * (len(self) + 1) - hits) * len(values) + i  # lexicographic: differ, -hits, value
            better = key < best_key
            best[better], best_key[better] = v, key[better]
        return best.reshape(m.shape[1:])

    def __len__(self) -> int:
        return len(self.names)


def ignore_problem(value: object, region_values: set[int]) -> str | None:
    """What is wrong with ``value`` as an ignore label over regions using ``region_values`` (nnU-Net's rule: an
    integer, the highest label value, in no region), or None."""
    if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or value <= 0:
        return f"expected a positive integer label value, got {value!r}"
    if int(value) in region_values:
        return f"{value} is a region's label value; the ignore label must lie in no region"
    if int(value) < max(region_values, default=0):
        return f"{value} must be the highest label value (nnU-Net's rule), above the regions' {max(region_values)}"
    return None


def split_known(masks: torch.Tensor, regions: int) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Masks ``(B, R or R + 1, *S)`` of ``regions`` (= R) regions -> ``(region masks (B, R, *S), the known-voxel mask
    (B, 1, *S) or None)``: with one channel more than the regions the last is the known voxels (:meth:`Regions.target`
    of a federation with an ignore label), else there is none."""
    if masks.shape[1] == regions + 1:
        return masks[:, :regions], masks[:, regions:]
    return masks, None


@dataclass(frozen=True)
class Case:
    """One image and its label map. Arrays are held in memory or read lazily by ``loader`` (called from the threads
    that prepare a site's cases, ``data.prepare_threads``: it must be safe to call from several at once).

    ``meta``: the case's case-level metadata (the columns of its site's ``cases.csv``, e.g.
    ``group``) plus, for folder federations, the reader's bookkeeping (``FILE_META_KEYS``: the
    file paths and, after ``data check``, the image shape); ``metadata`` is the former alone.

    ``spacing``: the voxel size in mm along each spatial axis of the arrays, in array order (NIfTI:
    the image's header zooms; built-in 3D federations: their generator's), or ``None`` when unknown;
    ``voxel_spacing(dims)`` reads it with 1.0 mm per axis for ``None``.
    """

    id: str
    loader: Callable[[], tuple[np.ndarray, np.ndarray]] = field(repr=False, compare=False)
    meta: Mapping[str, object] = field(default_factory=dict, compare=False)
    spacing: tuple[float, ...] | None = field(default=None, compare=False)

    @classmethod
    def from_arrays(
        cls, id: str, image: np.ndarray, label: np.ndarray, *, spacing: tuple[float, ...] | None = None, **meta
    ) -> Case:
        """A case held in memory: ``image`` ``(C, *spatial)`` channel-first (``(C, H, W)`` for a ``2d`` federation,
        ``(C, D, H, W)`` for ``3d``; C the federation's ``channels``, even 1), ``label`` ``(*spatial)`` an integer
        label map of the same spatial shape, its values those of the federation's :class:`Regions` (0: background; its
        ``ignore`` value for unannotated voxels where it has one).
        Any numeric image dtype; kept as given (not copied: do not change the arrays afterwards). ``spacing``: voxel
        size in mm per spatial axis (None: 1 mm); further keywords are the case's metadata (``meta``). The run checks
        shapes, dtypes and values before any work (``fedseg.data.user_federation``)."""
        return cls(id, lambda: (image, label), meta, None if spacing is None else tuple(float(s) for s in spacing))

    def arrays(self) -> tuple[np.ndarray, np.ndarray]:
        """Return ``(image (C, *spatial), label (*spatial))``."""
        return self.loader()

    def voxel_spacing(self, dims: int) -> tuple[float, ...]:
        """Voxel size in mm per spatial axis, ``dims`` of them: ``spacing``, or ``(1.0,) * dims`` when unknown;
        a ``ValueError`` when ``spacing`` has another length."""
        if self.spacing is None:
            return (1.0,) * dims
        if len(self.spacing) != dims:
            raise ValueError(f"case {self.id!r}: spacing {self.spacing} has {len(self.spacing)} axes, expected {dims}")
        return tuple(self.spacing)

    @property
    def metadata(self) -> dict[str, object]:
        """Case-level metadata: ``meta`` without the folder reader's bookkeeping (``FILE_META_KEYS``)."""
        return {k: v for k, v in self.meta.items() if k not in FILE_META_KEYS}


# What the folder reader and ``data check`` keep in ``Case.meta`` besides metadata: not metadata,
# and not allowed as ``cases.csv`` columns.
UNANNOTATED = "_unannotated"  # set by ``data check``: no voxel annotated (an ignore label); a rare column name
FILE_META_KEYS: tuple[str, ...] = ("image", "label", "image_shape", UNANNOTATED)


@dataclass
class Site:
    """One hospital: an ordered list of cases, optionally with fixed splits (case id -> split)
    and site-level metadata ``meta`` (key -> str, int, float or bool; ``federation.yaml`` ``sites:``)."""

    name: str
    cases: list[Case]
    fixed_splits: dict[str, Split] | None = None
    meta: dict[str, object] = field(default_factory=dict)


PLACEHOLDER_CHANNEL = re.compile(r"channel\d+")  # what an export writes for channels it cannot name


def channel_order(model: list[str], data: list[str]) -> Literal["same", "reordered", "other names", "unknown"]:
    """How the channel names of ``data`` (a dataset, a federation) stand to the ``model``'s, name by name with
    whitespace trimmed and case ignored (``T1`` = ``t1 ``; FeTS's ``t1ce`` = an nnU-Net ``T1ce``): ``same``;
    ``reordered``, the same names in another order (FLAIR, T1 for a model that read T1, FLAIR: the inputs would be
    swapped), or a name both lists hold at another position (``flair, T1w`` for T1, FLAIR: the FLAIR the model reads
    second comes first); ``other names`` (``T1w`` for ``T1``, ``MRI`` for ``T2``: no order can be read from them);
    ``unknown`` where a list is missing, of another length, or holds the ``channel0``, ``channel1`` placeholders an
    export writes for unnamed channels."""
    ours, theirs = ([n.strip().casefold() for n in names] for names in (model, data))
    if len(ours) != len(theirs) or any(PLACEHOLDER_CHANNEL.fullmatch(n) for n in ours + theirs):
        return "unknown"
    if ours == theirs:
        return "same"
    moved = any(name in theirs and theirs.index(name) != i for i, name in enumerate(ours))
    return "reordered" if sorted(ours) == sorted(theirs) or moved else "other names"


@dataclass
class Federation:
    """An ordered list of sites sharing one task (kind, channels, regions).

    ``channel_names``: what each image channel holds, in channel order (``["T1", "FLAIR"]``), where the source says
    it (``federation.yaml`` ``channel_names``, filled by the importers of layouts that name their channels), else
    ``None``. A trained bundle records them, so ``fedseg predict`` can refuse images whose channels come in
    another order (an nnU-Net ``dataset.json`` that numbers them otherwise)."""

    name: str
    kind: Literal["2d", "3d"]
    channels: int
    regions: Regions
    sites: list[Site]
    label_names: dict[int, str] | None = None
    channel_names: list[str] | None = None
    # label value -> its other names after ``label_names``' (``federation.yaml`` ``label_names: {1: [tumor, GTV
    # Tumour]}``), matched when a folder's RTSTRUCT ROIs and SEG segments are read; None: none (every other source)
    label_synonyms: dict[int, tuple[str, ...]] | None = None

    @property
    def spatial_dims(self) -> int:
        return 2 if self.kind == "2d" else 3

    @property
    def site_names(self) -> list[str]:
        return [s.name for s in self.sites]

    def site(self, name: str) -> Site:
        for s in self.sites:
            if s.name == name:
                return s
        raise KeyError(f"no site named {name!r}; sites are {self.site_names}")

    def without(self, name: str) -> Federation:
        """The same federation (name, task, site order) minus site ``name`` (unseen-site studies);
        a KeyError listing the site names when there is no such site."""
        self.site(name)
        return replace(self, sites=[s for s in self.sites if s.name != name])
