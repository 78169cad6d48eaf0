"""Export a federation as an nnU-Net v2 raw dataset, so a centralized nnU-Net baseline trains and is tested
on exactly the cases and splits of a federated run.

What ``export_nnunet`` writes under ``OUT`` (``$nnUNet_raw``)::

    OUT/DatasetNNN_Name/dataset.json         channel_names, labels (+ regions_class_order), numTraining,
                                             file_ending, name, description
    OUT/DatasetNNN_Name/imagesTr/<id>_XXXX<file_ending>, labelsTr/<id><file_ending>   train + val cases
    OUT/DatasetNNN_Name/imagesTs/..., labelsTs/...                                     test cases
    OUT/DatasetNNN_Name/splits_final.json    [{"train": [ids], "val": [ids]}, ...]

- **Cases**: every site (pooled; case id ``<site>__<case>``, unique across sites) or one site (``site``; case id
  as is). ``fedseg data import nnunet DatasetNNN_Name --site-by '^(?P<site>.+?)__(?P<case>.+)$'`` gives the
  sites and case ids back.
- **Splits** (``folds``: the run's splits, one ``{site: {case: split}}`` per fold): with one (the run's ratio
  split, or one fold of a k-fold), train+val go to ``imagesTr`` and ``splits_final.json`` holds one fold
  ``{"train": train, "val": val}``, test goes to ``imagesTs``/``labelsTs``. With several (every fold of a
  federated k-fold, ``--all-folds``), every case goes to ``imagesTr`` and fold ``k`` is ``{"train": the
  train+val cases of fedseg fold k, "val": its test cases}``: nnU-Net's 5-fold cross-validation then trains
  on what fedseg fold ``k`` trains on (train+val; nnU-Net selects nothing on its val fold) and predicts
  exactly fedseg fold ``k``'s test cases. ``splits_final.json`` belongs in
  ``$nnUNet_preprocessed/DatasetNNN_Name/`` (copy it there after ``nnUNetv2_plan_and_preprocess``).
- **Channels**: the federation's ``channel_names`` (``federation.yaml``; an ``import nnunet`` federation's are its
  source's), else the sites' ``channel_names`` metadata (as older ``import nnunet`` folders hold it), else their
  ``modality`` (``import msd``), else for a one-channel federation of DICOM series the series' Modality where every
  exported site's says the same (``CT``, ``MR``: nnU-Net normalizes a channel named ``CT`` in Hounsfield windows,
  every other one per image), else ``R, G, B`` for a 2D 3-channel federation, else ``channel0``, ``channel1``...
- **Name**: ``dataset.json``'s ``name`` is the dataset's folder name ``DatasetNNN_Name`` (``--id`` and ``--name``, by
  default the federation's name), as nnU-Net names a dataset, never a stale one: a federation imported from
  nnU-Net is named after its source dataset, ``Dataset004_Hippocampus`` exported as ``--id 501`` is
  ``Dataset501_Hippocampus`` inside too.
- **Files**: 3D: ``.nii.gz``, one per channel, with the affine of the case's image (NIfTI, NRRD, MetaImage or
  DICOM series: origin, directions and spacing kept, so the files lie where the source and fedseg's predictions
  lie; NPY: ``diag(spacing)``, :func:`case_affine`); labels the same. 2D: ``.png``; 3-channel uint8 images as one RGB
  ``_0000`` file (nnU-Net's natural-image reader), other channel counts one grey PNG per channel (uint8 or
  uint16); labels uint8 PNGs.
- **Labels**: disjoint one-value regions (``PZ = [1]``, ``TZ = [2]``) become plain labels ``{"background": 0,
  "PZ": 1, "TZ": 2}``; any other regions (nested ``WT = [1, 2, 3]``, ``TC = [2, 3]``, ``ET = [3]``)
  nnU-Net's region-based labels, listed from the largest region to the smallest (nnU-Net paints them in that
  order), with ``regions_class_order`` (region ``i``'s smallest value in no later region). nnU-Net needs
  consecutive label values: others (BraTS ``1, 2, 4``) are renumbered ``1, 2, 3`` in order, in the label files
  too, and ``description`` says so. A federation's ignore label (``ignore_label``, partial annotations) is written
  as nnU-Net's ``"ignore"``, the value after the regions' (its voxels keep it in the label files).

Everything is written into a temporary folder next to the dataset and renamed at the end: on any error
nothing is left at ``OUT/DatasetNNN_Name``; one left by an export killed before it could clean up is removed by
the next export into ``OUT`` (``fedseg.data.folder_write.clear_dead_staging``).
"""

from __future__ import annotations

import json
import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from fedseg.atomic_files import current_umask
from fedseg.data import dicom_series, readers
from fedseg.data.federation import Case, Federation, FederationError, Regions
from fedseg.data.folder_write import clear_dead_staging, new_staging, write_nifti, write_png
from fedseg.data.importers.nnunet import DATASET_JSON, SPLITS_FINAL, channel_file
from fedseg.data.splits import Splits

POOLED_SEPARATOR = "__"  # pooled case id: <site>__<case>
IMPORT_REGEX = r"^(?P<site>.+?)__(?P<case>.+)$"  # what gives the site and case back on import
DEFAULT_ID = 500


@dataclass(frozen=True)
class ExportSummary:
    """What was written: the dataset folder, its training and test case counts and its number of folds."""

    path: Path
    training: int
    test: int
    folds: int


def dataset_folder_name(dataset_id: int, name: str) -> str:
    """``(500, "fets2022-partitioning1") -> "Dataset500_fets2022-partitioning1"``; other characters than letters,
    digits, ``-`` and ``_`` become ``_``, a leading ``DatasetNNN_`` (a federation imported from nnU-Net) is
    dropped. ``FederationError`` for an id outside 1..999."""
    if not 1 <= dataset_id <= 999:
        raise FederationError(f"--id {dataset_id}: an nnU-Net dataset id is 1..999")
    clean = re.sub(r"[^A-Za-z0-9_-]+", "_", re.sub(r"^Dataset\d{3}_", "", name)).strip("_") or "fedseg"
    return f"Dataset{dataset_id:03d}_{clean}"


def labels_for(regions: Regions) -> tuple[dict[str, Any], list[int] | None, dict[int, int]]:
    """``(nnU-Net labels, regions_class_order or None for plain labels, old -> new label value)`` (module docstring);
    an ignore label (``Regions.ignore``) as nnU-Net's ``"ignore"``, the value after the regions'."""
    labels, order, renumber = _region_labels(regions)
    if regions.ignore is not None:
        renumber[regions.ignore] = len(renumber) + 1
        labels["ignore"] = renumber[regions.ignore]
    return labels, order, renumber


def _region_labels(regions: Regions) -> tuple[dict[str, Any], list[int] | None, dict[int, int]]:
    """:func:`labels_for` of the regions alone."""
    values = sorted(regions.label_values)
    renumber = {v: i + 1 for i, v in enumerate(values)}
    if "background" in regions.names:
        raise FederationError("region 'background': nnU-Net reserves that name for label 0; rename the region")
    if "ignore" in regions.names:
        raise FederationError("region 'ignore': nnU-Net reserves that name for unannotated voxels; rename the region")
    singles = [vals[0] for vals in regions.values if len(vals) == 1]
    if len(singles) == len(regions) and len(set(singles)) == len(singles):
        return {"background": 0, **{n: renumber[v[0]] for n, v in zip(regions.names, regions.values)}}, None, renumber
    if all(len(vals) == 1 for vals in regions.values):
        raise FederationError(f"regions {regions.as_dict()}: two regions hold the same single label; nnU-Net cannot")
    try:
        painted = regions.paint_order()  # nnU-Net paints a later region over an earlier one: the largest first
    except ValueError as e:
        raise FederationError(f"{e}, so nnU-Net's regions_class_order cannot paint it") from None
    labels: dict[str, Any] = {"background": 0}
    for i, _ in painted:
        labels[regions.names[i]] = sorted(renumber[v] for v in regions.values[i])
    return labels, [renumber[value] for _, value in painted], renumber


def channel_names(fed: Federation, sites: list[str]) -> list[str]:
    """The channel names (module docstring, **Channels**)."""
    if fed.channel_names is not None and len(fed.channel_names) == fed.channels:
        return list(fed.channel_names)
    for key in ("channel_names", "modality"):
        found = {str(fed.site(s).meta.get(key, "")) for s in sites}
        if len(found) == 1:
            names = found.pop().split(",")
            if len(names) == fed.channels and all(names):
                return names
    if fed.channels == 1:
        modalities = dicom_series.dicom_modalities(fed)
        said = {modalities.get(s) for s in sites}
        if len(said) == 1 and None not in said:
            return [str(said.pop())]
    if fed.kind == "2d" and fed.channels == 3:
        return ["R", "G", "B"]
    return [f"channel{c}" for c in range(fed.channels)]


def case_affine(case: Case) -> np.ndarray:
    """The 4x4 affine (voxel index -> RAS+ mm) for a 3D case's files: its image's grid when the image is a volume
    file or DICOM series (NIfTI, NRRD, MetaImage, DICOM: origin and directions kept, ``readers.volume_grid``, the
    grid ``fedseg predict`` writes its masks on), else ``diag(spacing)`` with the case's spacing as
    ``volumes.case_spacing`` gives it (NPY files carry no grid)."""
    image = case.meta.get("image")
    if image is not None and readers.volume_format(Path(str(image))) is not None:
        return readers.volume_grid(Path(str(image))).affine
    from fedseg.data.volumes import case_spacing

    return np.diag([*case_spacing(case, 3), 1.0])


def _renumbered(label: np.ndarray, renumber: dict[int, int], where: str) -> np.ndarray:
    """``label`` with each value ``v`` as ``renumber[v]`` (0 stays 0), uint8 (uint16 for more than 255 values)."""
    present = {int(v) for v in np.unique(label)} - {0}
    unknown = sorted(present - set(renumber))
    if unknown:
        raise FederationError(f"{where}: label values {unknown} are in no region")
    out = np.zeros(label.shape, np.uint8 if len(renumber) < 256 else np.uint16)
    for old, new in renumber.items():
        out[label == old] = new
    return out


def _write_case(
    case: Case, cid: str, kind: str, images_dir: Path, labels_dir: Path, renumber: dict[int, int], where: str
) -> None:
    """One case's channel files and label file (module docstring, **Files**)."""
    image, label = (np.asarray(a) for a in case.arrays())
    label = _renumbered(label, renumber, where)
    if kind == "3d":
        affine = case_affine(case)
        for c in range(image.shape[0]):
            write_nifti(images_dir / channel_file(cid, c, ".nii.gz"), image[c], affine)
        write_nifti(labels_dir / f"{cid}.nii.gz", label, affine)
        return
    if image.shape[0] == 3:
        if image.dtype != np.uint8:
            raise FederationError(f"{where}: a 3-channel 2D image must be uint8 for an RGB PNG, got {image.dtype}")
        write_png(images_dir / channel_file(cid, 0, ".png"), np.moveaxis(image, 0, -1))
    else:
        if image.dtype not in (np.uint8, np.uint16):
            raise FederationError(f"{where}: 2D images must be uint8 or uint16 for nnU-Net's PNGs, got {image.dtype}")
        for c in range(image.shape[0]):
            write_png(images_dir / channel_file(cid, c, ".png"), image[c])
    if label.dtype != np.uint8:
        raise FederationError(f"{where}: more than 255 label values do not fit a PNG label map")
    write_png(labels_dir / f"{cid}.png", label)


def export_nnunet(
    fed: Federation,
    folds: list[Splits],
    out: str | Path,
    *,
    dataset_id: int = DEFAULT_ID,
    name: str | None = None,
    site: str | None = None,
) -> ExportSummary:
    """Write ``fed`` (every site, or ``site``) as ``out/DatasetNNN_Name`` with the splits ``folds`` (one per
    fold; see the module docstring). ``FederationError`` naming the problem, leaving nothing behind."""
    if not folds:
        raise FederationError("export: no splits given")
    if site is not None and site not in fed.site_names:
        raise FederationError(f"--site {site!r}: no such site (sites: {', '.join(fed.site_names)})")
    sites = [site] if site is not None else fed.site_names
    out = Path(out)
    folder_name = dataset_folder_name(dataset_id, name or fed.name)
    # staging folders of exports killed before they could clean up (any dataset's); one of this dataset being
    # written by a running export: refused
    clear_dead_staging(out, r"Dataset[0-9]+_.+\.exporting", re.escape(f"{folder_name}.exporting"))
    taken = sorted(p.name for p in out.glob(f"Dataset{dataset_id:03d}_*")) if out.is_dir() else []
    if taken:
        raise FederationError(f"{out / taken[0]}: exists; nnU-Net dataset ids are unique, choose another --id")
    labels, order, renumber = labels_for(fed.regions)
    names = channel_names(fed, sites)
    kind, ending = fed.kind, (".png" if fed.kind == "2d" else ".nii.gz")

    def nn_id(site_name: str, cid: str) -> str:
        return cid if site is not None else f"{site_name}{POOLED_SEPARATOR}{cid}"

    all_folds = len(folds) > 1
    test = set() if all_folds else {(s, c) for s in sites for c, split in folds[0][s].items() if split == "test"}
    created = not out.exists()
    out.mkdir(parents=True, exist_ok=True)
    tmp = new_staging(out, f"{folder_name}.exporting")
    try:
        for sub in ("imagesTr", "labelsTr") + (("imagesTs", "labelsTs") if test else ()):
            (tmp / sub).mkdir()
        training = 0
        for site_name in sites:
            for case in fed.site(site_name).cases:
                is_test = (site_name, case.id) in test
                images_dir, labels_dir = (
                    (tmp / "imagesTs", tmp / "labelsTs") if is_test else (tmp / "imagesTr", tmp / "labelsTr")
                )
                where = f"site {site_name!r} case {case.id!r}"
                _write_case(case, nn_id(site_name, case.id), kind, images_dir, labels_dir, renumber, where)
                training += not is_test
        # one fold: nnU-Net trains on train, validates on val; every fold: on train+val, "validates" on test
        fit, held_out = (("train", "val"), ("test",)) if all_folds else (("train",), ("val",))
        entries = [
            {
                "train": [nn_id(s, c) for s in sites for c, split in splits[s].items() if split in fit],
                "val": [nn_id(s, c) for s in sites for c, split in splits[s].items() if split in held_out],
            }
            for splits in folds
        ]
        description = f"exported by fedseg from federation {fed.name!r}" + (f", site {site!r}" if site else "")
        moved = {old: new for old, new in renumber.items() if old != new}
        if moved:
            description += f"; label values renumbered (fedseg -> nnU-Net): {moved}"
        dataset: dict[str, Any] = {
            "name": folder_name,
            "description": description,
            "channel_names": {str(c): n for c, n in enumerate(names)},
            "labels": labels,
            "numTraining": training,
            "file_ending": ending,
        }
        if order is not None:
            dataset["regions_class_order"] = order
        (tmp / DATASET_JSON).write_text(json.dumps(dataset, indent=2) + "\n", encoding="utf-8")
        (tmp / SPLITS_FINAL).write_text(json.dumps(entries, indent=2) + "\n", encoding="utf-8")
        tmp.chmod(0o777 & ~current_umask())  # mkdtemp's 0700 would hide the dataset from the other users of $nnUNet_raw
        tmp.rename(out / folder_name)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        if created and not any(out.iterdir()):
            out.rmdir()  # made here, held only tmp
        raise
    return ExportSummary(out / folder_name, training, len(test), len(folds))
