"""``nnunet``: an nnU-Net v2 raw dataset folder, split into sites by a regex on the case id or a CSV.

Expected layout (``SRC`` = ``DatasetNNN_Name``, as under ``$nnUNet_raw``)::

    SRC/dataset.json        {"channel_names": {"0": "T2", "1": "ADC"}, "labels": {"background": 0, "PZ": 1,
                             "TZ": 2}, "numTraining": 32, "file_ending": ".nii.gz"}
    SRC/imagesTr/<case>_<XXXX><file_ending>    one file per channel XXXX = 0000, 0001, ... (channel_names)
    SRC/labelsTr/<case><file_ending>           integer label map
    SRC/imagesTs/, SRC/labelsTs/               optional: test cases (imported only where labelsTs/ exists)
    SRC/splits_final.json                      optional: nnU-Net's folds [{"train": [...], "val": [...]}]

What it writes:

- **sites** (``--site-by``): a regex searched in each case id whose named group ``site`` (else its first
  group) is the site; a named group ``case`` (optional) is the case id within the site, else the whole
  id (``fedseg data export nnunet --pooled`` writes ``<site>__<case>`` ids, which
  ``'^(?P<site>.+?)__(?P<case>.+)$'`` undoes). Or a CSV file with header ``case,site``. Without
  ``--site-by`` every case goes to one site named after the dataset. Site-level metadata ``dataset`` (the
  folder's name) and ``channel_names`` (comma-separated). Several dataset folders (one per hospital, each its own
  ``DatasetNNN_Name``) are one federation, each read as one and giving its own sites; they must agree on the kind,
  ``channel_names`` (in order) and ``labels``, and no site may come from two of them.
- **channel names**: ``channel_names`` in ``federation.yaml``, in channel order (``"0"``, ``"1"``, ...), so a
  trained bundle knows which file is which channel and ``fedseg predict`` refuses a test set that numbers them
  otherwise.
- **kind**: ``2d`` for a PNG/JPEG ``file_ending``, and for nnU-Net's 2D data stored in a volume format (NIfTI
  ``(X, Y, 1)``: the first case's ``_0000`` header has a third axis of size 1), else ``3d``; any other ending is
  accepted when fedseg's folder format reads it (``case_files.IMAGE_EXTS`` and ``LABEL_EXTS``, read at run time).
- **images**: a single-channel case's file is linked as is (a NIfTI keeps its affine, hence its spacing);
  several channel files are stacked in channel order into one file: a 4D NIfTI ``(X, Y, Z, C)`` on the
  ``_0000`` file's grid (3D: its affine, with a NRRD's or MetaImage's direction and origin; a NIfTI's qform and
  sform with their codes), an ``.npy`` ``(C, H, W)`` (2D). A 2D dataset may keep all channels in its
  ``_0000`` file (RGB PNG with ``channel_names`` R, G, B): ``data check`` then checks the channel count.
- **labels**: ``labelsTr/<case>`` linked as is. **Regions**: plain labels (``"liver": 1``) give one region
  per non-background label, ``liver = [1]`` (nnU-Net's classes are disjoint); region-based labels
  (``"whole tumor": [1, 2, 3]``, with ``regions_class_order``) give those regions as listed. Region names
  are the label names with spaces as ``_``.
- **ignore label** (partial or sparse annotations, nnU-Net v2's ``"ignore": V``): ``ignore_label: V`` in
  ``federation.yaml``, with plain and region-based labels alike. As nnU-Net requires, ``V`` is one integer, higher
  than every other label value (so in no region); voxels labelled ``V`` are unannotated: training takes no loss and
  no gradient from them and Dice, HD95 and NSD count only the annotated voxels (``fedseg.data.federation.Regions``).
- **splits** (``<site>/splits.csv``): the imported ``imagesTs`` cases are ``test``; with
  ``splits_final.json`` (fold ``FOLD``, default 0) its ``train`` and ``val`` lists give the split of every
  ``imagesTr`` case; without it the ``imagesTr`` cases are left to the run's split settings (which draw test
  cases from them too). A fold that leaves a site without any test case (every ``imagesTr`` case in train or
  val, no labelled ``imagesTs`` case) is refused: a run needs every site's test cases.

Errors (one line each, naming the file, field or case; several at once come as one error, ``cannot import (N
problems):`` then a line each, at most 3 of one kind, as ``writer.raise_problems`` lists them):

- ``dataset.json``, every fault of the file in one pass (and of every dataset folder's, where several are given,
  before any case is read): the file missing or not a JSON object; ``channel_names``, ``labels``, ``numTraining``
  or ``file_ending`` missing (naming a misspelt key the file has) or ill-typed; an unknown ``file_ending``; an
  ``ignore`` label that is not one integer above every other label value; a label value, background entry or
  region name at fault;
  region-based ``labels`` without ``regions_class_order``. A check that needs a field at fault is skipped rather
  than reported as a second fault (no ``regions_class_order`` check where ``labels`` is at fault, no background
  check where a label value is); an nnU-Net v1 / MSD ``dataset.json`` is one line saying which import reads it.
- the cases, every dataset's problems together (``imagesTr`` and ``imagesTs`` alike): a missing ``imagesTr/`` or
  ``labelsTr/``, a case missing a channel file, a channel not in ``channel_names``, a channel file on another grid
  than the case's ``_0000`` file (shape, spacing, a flipped axis or origin, from the headers), a missing label file
  (naming the file beside it under another ending, if any), a label without images, a case in both ``imagesTr/``
  and ``imagesTs/``; ``numTraining`` not matching ``imagesTr`` where its cases had no other problem.
- the first of the rest: a ``--site-by`` regex that does not match a case or a case the CSV does not list (with
  a count of the others), a ``splits_final.json`` fold at fault, datasets that disagree.
"""

from __future__ import annotations

import functools
import glob
import json
import os
import re
import shlex
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np

from fedseg.data import case_files, folder_write, readers
from fedseg.data.csv_rows import read_csv_rows
from fedseg.data.federation import FederationError, Split, ignore_problem
from fedseg.data.importers.writer import (
    Plan,
    PlannedCase,
    PlannedSite,
    Source,
    existing_folder,
    near_miss,
    raise_problems,
    single_source,
)
from fedseg.data.structured import read_mapping

DATASET_JSON = "dataset.json"
IGNORE = "ignore"  # nnU-Net v2's ignore label: the labels entry naming the value of unannotated voxels
SPLITS_FINAL = "splits_final.json"
CHANNEL_DIGITS = 4  # nnU-Net's _XXXX channel suffix
SITE_CSV_COLUMNS = ("case", "site")
# a channel file's name without its ending: <case>_XXXX
CHANNEL_FILE = re.compile(rf"^(?P<case>.+)_(?P<channel>\d{{{CHANNEL_DIGITS}}})$")


def fail(problems: list[str]) -> None:
    """Raise ``problems``: one line for one problem, else ``raise_problems``' list."""
    if len(problems) == 1:
        raise FederationError(problems[0])
    raise_problems(problems)


def _ending(name: str) -> str:
    """A file name's ending as nnU-Net's ``file_ending`` writes it: ``.nii.gz`` for ``x_0000.nii.gz``, ``.png``."""
    parts = name.split(".")
    return (
        "." + ".".join(parts[-2:])
        if len(parts) > 2 and parts[-1] == "gz"
        else ("." + parts[-1] if len(parts) > 1 else "")
    )


def channel_file(case: str, channel: int, file_ending: str) -> str:
    """nnU-Net's image file name of ``case``'s ``channel``: ``("la_003", 1, ".nii.gz") -> "la_003_0001.nii.gz"``."""
    return f"{case}_{channel:0{CHANNEL_DIGITS}d}{file_ending}"


UNLINKABLE = {"mhd": "a MetaImage .mhd header is a file apart from its data: convert the dataset to .mha"}


def readable_endings() -> list[str]:
    """The ``file_ending`` values fedseg can import now: the extensions the folder format reads as both
    image and label (``case_files.IMAGE_EXTS`` and ``LABEL_EXTS`` at call time), with their dot, but those of
    ``UNLINKABLE`` (the import places one file per image)."""
    return ["." + e for e in case_files.IMAGE_EXTS if e in case_files.LABEL_EXTS and e not in UNLINKABLE]


def kind_of(file_ending: str) -> Literal["2d", "3d"]:
    """``2d`` for the 2D image files the folder format reads with PIL (PNG, JPEG), ``3d`` for the rest (NIfTI...)."""
    return "2d" if file_ending.lower().lstrip(".") in case_files.PIL_EXTS else "3d"


@dataclass(frozen=True)
class DatasetInfo:
    """``dataset.json``, checked: ``channel_names`` in channel order, ``regions`` (name -> label values),
    ``label_names`` (value -> name; plain labels only), ``file_ending`` (with its dot), ``ignore`` (the ``ignore``
    label's value, or None)."""

    path: Path
    name: str
    channel_names: list[str]
    regions: dict[str, list[int]]
    label_names: dict[int, str] | None
    file_ending: str
    num_training: int
    ignore: int | None = None


def _label_values(name: str, value: Any, path: Path, problems: list[str]) -> list[int] | None:
    """A label's values (``1`` -> ``[1]``, ``[1, 2]`` as is); None, with a line in ``problems``, for anything else."""
    values = value if isinstance(value, list) else [value]
    if not values or not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in values):
        problems.append(f'{path}: "labels": {name!r}: expected a label value or a list of them, got {value!r}')
        return None
    return values


def regions_from_labels(
    labels: dict[str, Any], path: Path, problems: list[str]
) -> tuple[dict[str, list[int]], dict[int, str] | None, int | None] | None:
    """nnU-Net ``labels`` -> ``(regions, label names or None for region-based labels, the ignore label's value or
    None)`` (see the module); each fault a line in ``problems``. None where the regions cannot be known (a label
    value, the background, a region name or a shared value at fault); an ``ignore`` label at fault (nnU-Net's rule:
    one integer, above every other label value) is a line too, the regions then those of the other labels. A check
    that needs what an earlier one refused is skipped (a label value at fault: no background check; no background
    entry: no check of the others against it; a label at fault: no "no foreground label")."""
    given = {str(name): value for name, value in labels.items() if str(name) != IGNORE}
    parsed = {name: _label_values(name, value, path, problems) for name, value in given.items()}
    if any(values is None for values in parsed.values()):
        return None
    valid = {name: values for name, values in parsed.items() if values is not None}  # all of them: for mypy
    background = [name for name, values in valid.items() if values == [0]]
    if len(background) != 1:
        problems.append(f'{path}: "labels": expected one background entry with value 0, got {labels}')
        return None
    region_based = any(len(values) > 1 for values in valid.values())
    regions: dict[str, list[int]] = {}
    before = len(problems)
    for name, values in valid.items():
        if name == background[0]:
            continue
        region = name.strip().replace(" ", "_")
        if 0 in values:
            problems.append(f'{path}: "labels": {name!r} contains 0 (background) besides {background[0]!r}')
        elif not region or region in regions:
            problems.append(f'{path}: "labels": {name!r} gives an empty or duplicate region name {region!r}')
        else:
            regions[region] = sorted(values) if region_based else values
    names = {0: background[0], **{values[0]: name for name, values in valid.items() if name != background[0]}}
    if not region_based and len(names) != len(valid):  # plain labels: one value each
        problems.append(f'{path}: "labels": two labels share a value ({labels})')
    if len(problems) > before:
        return None
    if not regions:
        problems.append(f'{path}: "labels": no foreground label (only {labels})')
        return None
    ignore = labels.get(IGNORE)
    if ignore is not None and (problem := ignore_problem(ignore, {v for values in valid.values() for v in values})):
        problems.append(f'{path}: "labels": "{IGNORE}": {problem}')  # the regions stand: regions_class_order checked
    return regions, None if region_based else dict(sorted(names.items())), ignore


DATASET_JSON_KEYS = ("channel_names", "labels", "numTraining", "file_ending")
DATASET_FOLDER = "an nnU-Net v2 dataset folder: dataset.json, imagesTr/, labelsTr/"


def check_dataset_json(src: Path, problems: list[str]) -> DatasetInfo | None:
    """``SRC/dataset.json`` checked: every fault of the file a line in ``problems``, naming the file and the field
    (None then). A field's checks are independent of the others' but for ``regions_class_order``, checked only where
    ``labels`` is sound (its length is the regions'); a folder or file that cannot be read, or an nnU-Net v1 / MSD
    dataset.json (its fields mean other things), is one line."""
    path = src / DATASET_JSON
    try:
        existing_folder(src, DATASET_FOLDER)
        data = read_mapping(
            path,
            "an nnU-Net v2 dataset folder holds dataset.json, imagesTr/, labelsTr/",
            "a JSON object with channel_names, labels, numTraining, file_ending",
        )
    except FederationError as e:
        problems.append(str(e))
        return None
    before = len(problems)
    if "dataset" in data:
        problems.append(f'{path}: "dataset" (explicit file lists) is not supported; use imagesTr/ and labelsTr/')
    missing = [key for key in DATASET_JSON_KEYS if key not in data]
    if missing and "modality" in data:  # another format: the fields it has say other things (labels: value -> name)
        msd = f"fedseg data import msd {shlex.quote(str(src))}"
        problems.append(
            f'{path}: missing "{missing[0]}" (an nnU-Net v1 task or MSD dataset.json: import it with "{msd}")'
        )
        return None
    problems += [f'{path}: missing "{key}"{near_miss(key, data)}' for key in missing]
    channels = data.get("channel_names")
    if "channel_names" in data and (
        not isinstance(channels, dict) or not channels or set(channels) != {str(i) for i in range(len(channels))}
    ):
        problems.append(f'{path}: "channel_names": expected {{"0": name, "1": name, ...}}, got {channels!r}')
    parsed = None
    if "labels" in data and not isinstance(data["labels"], dict):
        problems.append(f'{path}: "labels": expected an object name -> value, got {data["labels"]!r}')
    elif "labels" in data:
        parsed = regions_from_labels(data["labels"], path, problems)
    order = data.get("regions_class_order")
    if parsed is not None and parsed[1] is None and not (isinstance(order, list) and len(order) == len(parsed[0])):
        problems.append(
            f'{path}: "regions_class_order": region-based labels need a list of {len(parsed[0])} label values, '
            f"got {order!r}{near_miss('regions_class_order', data) if order is None else ''}"
        )
    ending = data.get("file_ending")
    if "file_ending" in data:
        if isinstance(ending, str) and (why := UNLINKABLE.get(ending.lower().lstrip("."))) is not None:
            problems.append(f'{path}: "file_ending" {ending!r}: {why}')
        elif not isinstance(ending, str) or ending not in readable_endings():
            dotted = f".{ending}" if isinstance(ending, str) and f".{ending}" in readable_endings() else None
            problems.append(
                f'{path}: "file_ending" {ending!r} is not a format fedseg reads (readable: '
                f"{', '.join(readable_endings())})" + (f"; missing the leading dot? {dotted!r}" if dotted else "")
            )
    num = data.get("numTraining")
    if "numTraining" in data and (not isinstance(num, int) or isinstance(num, bool) or num < 1):
        problems.append(f'{path}: "numTraining": expected a positive integer, got {num!r}')
    if len(problems) > before or parsed is None:
        return None
    regions, label_names, ignore = parsed
    names = [str(data["channel_names"][str(i)]) for i in range(len(data["channel_names"]))]  # all there and sound
    name = str(data.get("name") or src.name)
    return DatasetInfo(path, name, names, regions, label_names, data["file_ending"], data["numTraining"], ignore)


def read_dataset_jsons(sources: Sequence[Path]) -> list[DatasetInfo]:
    """Each dataset folder's ``dataset.json`` checked (:func:`check_dataset_json`); every fault of every file in one
    ``FederationError`` (:func:`fail`: one line each, the file and field named), so a dataset.json with three
    mistakes, or three dataset folders with one each, takes one import to see them all."""
    problems: list[str] = []
    infos = [check_dataset_json(Path(src), problems) for src in sources]
    fail(problems)
    return [info for info in infos if info is not None]  # all of them (no problem)


@dataclass(frozen=True)
class RawCase:
    """One nnU-Net case: its id, channel files (channel order) and label file; ``test`` for imagesTs."""

    id: str
    images: list[Path]
    label: Path
    test: bool


def _channel_files(
    images_dir: Path, ending: str, info: DatasetInfo, problems: list[str]
) -> tuple[dict[str, list[Path]], set[str]]:
    """``imagesX/`` -> ``(case id -> its channel files in channel order, every case id seen)``; a missing channel,
    a channel not in ``channel_names`` or a misnamed file is a problem (and the case is left out of the first)."""
    found: dict[str, dict[int, Path]] = {}
    for path in sorted(images_dir.iterdir()):
        if path.name.startswith(".") or not path.name.endswith(ending):
            continue
        match = CHANNEL_FILE.match(path.name[: -len(ending)])
        if match is None:
            problems.append(f"{path}: not named <case>_XXXX{ending} (XXXX: the channel, 0000 for the first)")
            continue
        found.setdefault(match["case"], {})[int(match["channel"])] = path
    n = len(info.channel_names)
    one_file_2d = kind_of(ending) == "2d" and n > 1  # e.g. an RGB PNG holding R, G, B in its _0000 file
    cases = {}
    for cid, files in sorted(found.items()):
        for c in sorted(set(files) - set(range(n))):
            problems.append(f"{files[c]}: channel {c} of case {cid!r} is not in {info.path} channel_names (0..{n - 1})")
        expected = [0] if one_file_2d and set(files) == {0} else list(range(n))
        for c in expected:
            if c not in files:
                missing = images_dir / channel_file(cid, c, ending)
                problems.append(
                    f"{missing}: missing (channel {c} {info.channel_names[c]!r} of case {cid!r}"
                    f"{_other_ending_hint(missing, info)})"
                )
        if all(c in files for c in expected):
            cases[cid] = [files[c] for c in expected]
    return cases, set(found)


def unlabelled_note(src: Path, ending: str) -> list[str]:
    """A note on the ``imagesTs/`` cases (files ending ``ending``) without a label in ``labelsTs/`` (all of them
    when there is no ``labelsTs/``): they are not imported (a test case needs its label)."""
    images, labels = src / "imagesTs", src / "labelsTs"
    if not images.is_dir():
        return []
    names = [p.name[: -len(ending)] for p in images.iterdir() if p.name.endswith(ending)]
    cases = sorted({m["case"] for name in names if (m := CHANNEL_FILE.match(name))})
    if labels.is_dir():
        cases = [c for c in cases if not (labels / f"{c}{ending}").exists()]
        shown = ", ".join(cases[:3]) + (", ..." if len(cases) > 3 else "")
        what = f"without a label in labelsTs/ ({shown}) are not imported (a test case needs its label)"
    else:
        what = "are not imported (no labelsTs/: a test case needs its label)"
    if not cases:
        return []
    return [
        f"{images}: its {len(cases)} case(s) {what}; to segment them after training: fedseg predict --model "
        f"RUN/model --input {shlex.quote(str(images))} --out MASKS"
    ]


def _other_ending_hint(missing: Path, info: DatasetInfo) -> str:
    """A hint where a missing label or channel file ``missing`` (``<name><file_ending>``) lies beside it under another
    ending (a ``.nii`` in a ``.nii.gz`` dataset), as the ``numTraining`` check gives one for images; else ``""``."""
    case = missing.name[: -len(info.file_ending)]
    others = sorted(
        p.name for p in missing.parent.glob(f"{glob.escape(case)}.*") if p.name[: -len(_ending(p.name))] == case
    )
    if not others:
        return ""
    return (
        f'; {", ".join(others)} lies there, not ending with the "file_ending" {info.file_ending!r} of {info.path}: '
        f"store it as {missing.name}"
    )


def find_cases(src: Path, info: DatasetInfo, problems: list[str]) -> list[RawCase]:
    """The training cases (``imagesTr``/``labelsTr``) and the labelled test cases (``imagesTs``/``labelsTs``) of
    ``src``; each problem of its cases a line in ``problems`` (those of ``imagesTs`` too, whatever ``imagesTr``'s)."""
    before = len(problems)
    cases: list[RawCase] = []
    for images_name, labels_name, test in (("imagesTr", "labelsTr", False), ("imagesTs", "labelsTs", True)):
        images_dir, labels_dir = src / images_name, src / labels_name
        if test and not (images_dir.is_dir() and labels_dir.is_dir()):
            continue  # test images without labels are not imported
        missing = [folder for folder in (images_dir, labels_dir) if not folder.is_dir()]
        if missing:  # imagesTr/ or labelsTr/: no training case to read
            problems += [f"{f}: missing folder (an nnU-Net dataset has imagesTr/ and labelsTr/)" for f in missing]
            continue
        channel_files, seen = _channel_files(images_dir, info.file_ending, info, problems)
        labelled = {
            p.name[: -len(info.file_ending)]
            for p in labels_dir.iterdir()
            if p.name.endswith(info.file_ending) and not p.name.startswith(".")
        }
        for cid, images in channel_files.items():
            label = labels_dir / f"{cid}{info.file_ending}"
            if cid not in labelled and test:
                continue  # an unlabelled test image: left out, with a note (unlabelled_note)
            if cid not in labelled:
                problems.append(f"{label}: missing (the label of case {cid!r}{_other_ending_hint(label, info)})")
            elif (off_grid := readers.channels_grid_problem(images)) is not None:
                problems.append(off_grid)
            else:
                cases.append(RawCase(cid, images, label, test))
        for cid in sorted(labelled - seen):
            problems.append(f"{labels_dir / (cid + info.file_ending)}: label without images in {images_dir}")
        if not test and len(problems) == before and len(seen) != info.num_training:
            others = sorted({_ending(p.name) for p in images_dir.iterdir() if not p.name.endswith(info.file_ending)})
            hint = (
                f' (none ends with its "file_ending" {info.file_ending!r}; the files there end with '
                f"{', '.join(repr(e) for e in others if e)})"
                if not seen and any(others)
                else ""
            )
            problems.append(
                f'{info.path}: "numTraining" is {info.num_training} but {images_dir} holds {len(seen)} cases{hint}'
            )
    ids = [c.id for c in cases]
    problems += [
        f"{src}: case {cid!r} is in both imagesTr/ and imagesTs/"
        for cid in sorted({i for i in ids if ids.count(i) > 1})
    ]
    return cases


def read_cases(sources: Sequence[Path], infos: Sequence[DatasetInfo]) -> list[list[RawCase]]:
    """Each dataset folder's cases (:func:`find_cases`); every problem of every dataset's cases in one
    ``FederationError`` (:func:`fail`), so one import shows them all."""
    problems: list[str] = []
    found = [find_cases(Path(src), info, problems) for src, info in zip(sources, infos)]
    fail(problems)
    return found


SiteAssigner = Callable[[str], tuple[str, str]]  # nnU-Net case id -> (site, case id within the site)


def site_assigner(site_by: str | None, default: str) -> SiteAssigner:
    """``--site-by`` -> a function ``case id -> (site, case id within the site)``, raising ``FederationError``.

    ``None``: every case in site ``default``; a ``.csv`` file: its ``case,site`` rows; else a regex (see the module)."""
    if site_by is None:
        return lambda cid: (default, cid)
    if site_by.lower().endswith(".csv"):
        return _csv_assigner(Path(site_by))
    try:
        pattern = re.compile(site_by)
    except re.error as e:
        raise FederationError(f"--site-by {site_by!r}: not a regular expression ({e})") from None
    if pattern.groups == 0:
        raise FederationError(f"--site-by {site_by!r}: needs a group that captures the site, e.g. '^([A-Za-z]+)_'")

    def assign(cid: str) -> tuple[str, str]:
        match = pattern.search(cid)
        if match is None:
            raise FederationError(f"--site-by {site_by!r}: does not match case {cid!r}")
        site = match["site"] if "site" in pattern.groupindex else match[1]
        case = match["case"] if "case" in pattern.groupindex else cid
        if not site or not case:
            raise FederationError(f"--site-by {site_by!r}: gives an empty site or case id for case {cid!r}")
        folder_write.safe_name(site, f"--site-by {site_by!r}: case {cid!r} gets site")
        return site, folder_write.safe_name(case, f"--site-by {site_by!r}: case {cid!r} gets case id")

    return assign


def _csv_assigner(path: Path) -> SiteAssigner:
    if not path.is_file():
        raise FederationError(f"{path}: missing (--site-by takes a regex or a CSV file with header case,site)")
    table = read_csv_rows(path, "a header case,site")
    missing = [c for c in SITE_CSV_COLUMNS if c not in table.header]
    if missing:
        raise FederationError(
            f"{path}:{table.header_line}: missing column {', '.join(map(repr, missing))} (expected case,site)"
        )
    col_case, col_site = (table.header.index(c) for c in SITE_CSV_COLUMNS)
    sites: dict[str, str] = {}
    for cells, line in table.rows:
        cid = cells[col_case] if col_case < len(cells) else ""
        site = cells[col_site] if col_site < len(cells) else ""
        if not cid or not site:
            raise FederationError(f"{path}:{line}: empty case or site")
        if cid in sites:
            raise FederationError(f"{path}:{line}: case {cid!r} listed twice")
        sites[cid] = folder_write.safe_name(site, f"{path}:{line}: site")

    def assign(cid: str) -> tuple[str, str]:
        if cid not in sites:
            raise FederationError(f"{path}: no site for case {cid!r} (add a row {cid},<site>)")
        return sites[cid], cid

    return assign


def find_splits_final(src: Path, given: Path | None) -> Path | None:
    """Where the dataset's ``splits_final.json`` is: ``given`` (``--splits``), else ``SRC/splits_final.json``, else
    ``$nnUNet_preprocessed/<SRC's name>/splits_final.json``, where nnU-Net v2 writes and reads it; None if none."""
    if given is not None:
        if not given.is_file():
            raise FederationError(f"{given}: missing (--splits names nnU-Net's splits_final.json)")
        return given
    candidates = [src / SPLITS_FINAL]
    if preprocessed := os.environ.get("nnUNet_preprocessed"):
        candidates.append(Path(preprocessed) / src.name / SPLITS_FINAL)
    return next((p for p in candidates if p.is_file()), None)


def read_splits_final(
    src: Path, fold: int | None, train_ids: set[str], given: Path | None = None
) -> tuple[dict[str, Split], Path | None]:
    """Fold ``fold`` (default 0) of the dataset's ``splits_final.json`` (:func:`find_splits_final`) -> nnU-Net case
    id -> ``train``/``val`` (every ``imagesTr`` case), and the file used; ``({}, None)`` without one (the run's split
    then applies), unless a ``fold`` was asked for: then one line saying where it was looked for."""
    path = find_splits_final(src, given)
    if path is None:
        if fold is not None:
            raise FederationError(
                f"--fold {fold}: no {SPLITS_FINAL} in {src} or $nnUNet_preprocessed/{src.name}/ (give it with --splits)"
            )
        return {}, None
    fold = 0 if fold is None else fold
    try:
        folds = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise FederationError(f"{path}: cannot read ({type(e).__name__}: {e})") from None
    if not isinstance(folds, list) or not all(
        isinstance(f, dict) and isinstance(f.get("train"), list) and isinstance(f.get("val"), list) for f in folds
    ):
        raise FederationError(f'{path}: expected a list of folds [{{"train": [...], "val": [...]}}, ...]')
    if not 0 <= fold < len(folds):
        raise FederationError(f"{path}: no fold {fold} (it holds {len(folds)} folds)")
    splits: dict[str, Split] = {str(c): "train" for c in folds[fold]["train"]}
    both = sorted(set(splits) & {str(c) for c in folds[fold]["val"]})
    if both:
        raise FederationError(f"{path}: fold {fold} lists case {both[0]!r} in both train and val")
    splits.update({str(c): "val" for c in folds[fold]["val"]})
    unknown = sorted(set(splits) - train_ids)
    if unknown:
        raise FederationError(f"{path}: fold {fold} names case {unknown[0]!r}, which is not in imagesTr/")
    missing = sorted(train_ids - set(splits))
    if missing:
        raise FederationError(f"{path}: fold {fold} does not list imagesTr case {missing[0]!r} in train or val")
    return (splits, path)


def stacked_channels(paths: tuple[Path, ...], kind: Literal["2d", "3d"]) -> np.ndarray:
    """The channel files ``paths`` (each ``(1, *spatial)`` as ``case_files.read_image`` reads it) as one channel-first
    array ``(C, *spatial)`` in their common dtype; ``FederationError`` naming a file of another shape, or on another
    grid (``readers.channels_grid_problem``, from the headers before any voxel is read)."""
    if (off_grid := readers.channels_grid_problem(paths)) is not None:
        raise FederationError(off_grid)
    arrays = [case_files.read_image(p, kind) for p in paths]
    for path, array in zip(paths[1:], arrays[1:]):
        if array.shape[1:] != arrays[0].shape[1:]:
            raise FederationError(
                f"{path}: shape {array.shape[1:]} differs from that of channel 0 {arrays[0].shape[1:]} ({paths[0]})"
            )
    dtype = np.result_type(*arrays)
    return np.concatenate([a.astype(dtype, copy=False) for a in arrays])


def _write_stacked_nifti(paths: tuple[Path, ...], dest: Path) -> None:
    """3D channel files -> one NIfTI ``(X, Y, Z, C)`` at ``dest`` on the ``_0000`` file's grid: a NIfTI's spatial
    header (its qform and sform with their codes, ``folder_write.write_nifti_like``), another format's affine as
    ``readers.volume_grid`` reads it (RAS, with its direction and origin: a NRRD or MetaImage is LPS)."""
    data = np.moveaxis(stacked_channels(paths, "3d"), 0, -1)
    if readers.volume_format(paths[0]) in readers.NIFTI_EXTS:
        folder_write.write_nifti_like(dest, data, readers.load_nifti(paths[0]))
    else:
        folder_write.write_nifti(dest, data, readers.volume_grid(paths[0]).affine)


def channels_source(paths: Sequence[Path], kind: Literal["2d", "3d"]) -> Source:
    """The image ``Source`` of a case stored as one file per channel ``paths`` (channel order, nnU-Net's
    ``<case>_XXXX`` files): a single file linked as is, several stacked (3D, and 2D stored in a volume format such
    as nnU-Net's 2D NIfTI ``(X, Y, 1)``: ``_write_stacked_nifti``, keeping the first file's grid and so its pixel
    spacing; 2D pictures (PNG): an ``.npy`` ``(C, H, W)``)."""
    if len(paths) == 1:
        return Source(paths[0])
    files = tuple(paths)
    if kind == "3d" or readers.volume_format(files[0]) is not None:
        return Source(files[0], functools.partial(_write_stacked_nifti, files), "nii.gz")
    return Source(files[0], lambda dest: np.save(dest, stacked_channels(files, "2d")), "npy")


def dataset_kind(info: DatasetInfo, cases: list[RawCase]) -> Literal["2d", "3d"]:
    """``kind_of`` the ``file_ending``, except for 2D data stored in a volume format (nnU-Net's 2D NIfTI
    ``(X, Y, 1)``): ``2d`` where every case's ``_0000`` file has a third axis of size 1 (from the headers: a 3D
    dataset may hold a one-slice case). A ``FederationError`` naming a case of each kind where some have one slice
    and others more."""
    kind = kind_of(info.file_ending)
    if kind == "2d" or not cases or readers.volume_format(cases[0].images[0]) is None:
        return kind
    flat = {case.images[0]: _one_slice(readers.volume_grid(case.images[0]).shape) for case in cases}
    if all(flat.values()):
        return "2d"
    if any(flat.values()):
        one = next(p for p, f in flat.items() if f)
        more = next(p for p, f in flat.items() if not f)
        raise FederationError(
            f"{one}: one slice (2D data stored as a volume), but {more} has more: a dataset is 2D or 3D; move the "
            "one-slice cases out or store them with their neighbouring slices"
        )
    return "3d"


def _one_slice(shape: tuple[int, ...]) -> bool:
    return len(shape) >= 3 and shape[2] == 1


def plan_nnunet(
    sources: list[Path], site_by: str | None = None, fold: int | None = None, splits_file: Path | None = None
) -> Plan:
    """Plan the import of nnU-Net v2 dataset folders ``sources`` (see the module docstring): one (``[SRC]``), or
    several, one per hospital as each keeps its own ``DatasetNNN_Name``, merged into one federation. Several must
    agree on the kind, ``channel_names`` (in order) and ``labels``; each gives its own sites (without ``--site-by``
    one, named after its folder), and no site may come from two of them."""
    if len(sources) < 2:
        src = single_source(sources, "nnunet", DATASET_FOLDER)
        info = read_dataset_jsons([src])[0]
        plan = _plan_dataset(src, info, read_cases([src], [info])[0], site_by, fold, splits_file)
        if len(plan.sites) == 1:  # a federation of one: no --site-by, or one that names a single hospital
            site = plan.sites[0]
            plan.notes.append(
                f"one site ({site.name}) holds all {len(site.cases)} cases: a federated run needs several; give "
                "--site-by (a regex or a case,site CSV naming each case's hospital) or import one dataset per hospital"
            )
        return plan
    if splits_file is not None:
        raise FederationError(
            f"--splits {splits_file}: one splits_final.json for {len(sources)} datasets; put each dataset's own in its "
            "folder (or $nnUNet_preprocessed/<it>/), where the import finds it"
        )
    infos = read_dataset_jsons(sources)  # every dataset's dataset.json faults at once, before any case is read
    found = read_cases(sources, infos)  # then every dataset's case problems at once
    plans = [
        _plan_dataset(Path(src), info, cases, site_by, fold, None) for src, info, cases in zip(sources, infos, found)
    ]
    first, first_json = plans[0], Path(sources[0]) / DATASET_JSON
    origin: dict[str, Path] = {}
    for src, plan in zip(sources, plans):
        here = Path(src) / DATASET_JSON
        differs = [
            (field, f"{field} {_as_written(plan, field)} vs {_as_written(first, field)}")
            for field, mine, theirs in (
                ("kind", plan.kind, first.kind),
                ("channel_names", _channels_said(plan), _channels_said(first)),
                ("regions", plan.regions, first.regions),
                ("labels", plan.label_names, first.label_names),
                ("ignore label", plan.ignore_label, first.ignore_label),
            )
            if mine != theirs
        ]
        if differs:
            field, said = differs[0]
            raise FederationError(
                f"{here}: does not describe the data as {first_json} does ({said}); {_merge_advice(field, plan, first)}"
            )
        for site in plan.sites:
            if site.name in origin:
                raise FederationError(
                    f"site {site.name!r} comes from both {origin[site.name]} and {src}: a site is one hospital's; "
                    "give --site-by a pattern that names them apart, or import the datasets one by one"
                )
            origin[site.name] = Path(src)
    return Plan(
        "+".join(plan.name for plan in plans),
        first.kind,
        first.channels,
        first.regions,
        sorted((site for plan in plans for site in plan.sites), key=lambda site: site.name),
        first.label_names,
        [note for plan in plans for note in plan.notes],
        first.channel_names,
        first.channels_from,
        first.ignore_label,
    )


def _as_written(plan: Plan, field: str) -> object:
    """``plan``'s ``field`` as its dataset.json says it (channel names as written, not as compared)."""
    if field == "channel_names":
        return plan.channel_names if plan.channel_names else plan.channels
    if field == "ignore label" and plan.ignore_label is None:
        return "none"
    fields = {"kind": plan.kind, "regions": plan.regions, "labels": plan.label_names, "ignore label": plan.ignore_label}
    return fields[field]


def _merge_advice(field: str, plan: Plan, first: Plan) -> str:
    """What to do about two datasets that differ in ``field`` (``plan_nnunet``): channels named alike in another order
    can be reordered; other channels (another modality) cannot be one federation unless they are in fact the same."""
    if field == "kind":
        return "the datasets of one federation need images of one kind (all 2D or all 3D)"
    if field == "ignore label" and None in (plan.ignore_label, first.ignore_label):
        return 'partial annotations in one only: give both dataset.json files the same "ignore" entry'
    if field in ("regions", "labels", "ignore label"):
        return "the datasets of one federation need the same labels with the same values (renumber one's labels)"
    mine, theirs = _channels_said(plan), _channels_said(first)
    if isinstance(mine, list) and isinstance(theirs, list) and sorted(mine) == sorted(theirs):
        return (
            "the same channels in another order: reorder one (renumber its _XXXX channel files and its channel_names "
            "to the other's order)"
        )
    return (
        "the datasets of one federation need the same channels (modalities) in the same order: datasets of different "
        "modalities cannot be one federation (import each as its own); only where a channel is the same modality "
        "under another name, rename it in that dataset.json (and reorder to match)"
    )


def _channels_said(plan: Plan) -> list[str] | int:
    """A plan's channels as compared between datasets: their names trimmed and in lower case (as ``fedseg predict``
    compares them), else their count."""
    return [n.strip().lower() for n in plan.channel_names] if plan.channel_names else plan.channels


def _plan_dataset(
    src: Path,
    info: DatasetInfo,
    cases: list[RawCase],
    site_by: str | None,
    fold: int | None,
    splits_file: Path | None,
) -> Plan:
    """``plan_nnunet`` of one dataset folder ``src`` whose ``dataset.json`` is ``info`` (:func:`read_dataset_jsons`)
    and whose cases are ``cases`` (:func:`read_cases`)."""
    assign = site_assigner(site_by, src.name)
    fixed, splits_path = read_splits_final(src, fold, {c.id for c in cases if not c.test}, splits_file)
    kind = dataset_kind(info, cases)
    by_site: dict[str, list[PlannedCase]] = {}
    splits: dict[str, dict[str, Split]] = {}
    seen: dict[tuple[str, str], str] = {}
    assigned, unassigned = [], []
    for case in cases:
        try:
            assigned.append((case, *assign(case.id)))
        except FederationError as e:
            unassigned.append(str(e))
    if unassigned:  # the first case in one line, with a count of the others
        more = f" (and {len(unassigned) - 1} more cases)" if len(unassigned) > 1 else ""
        raise FederationError(unassigned[0] + more)
    for case, site, cid in assigned:
        if (site, cid) in seen:
            raise FederationError(
                f"--site-by {site_by!r}: cases {seen[(site, cid)]!r} and {case.id!r} both become case {cid!r} "
                f"of site {site!r}"
            )
        seen[(site, cid)] = case.id
        by_site.setdefault(site, []).append(PlannedCase(cid, channels_source(case.images, kind), Source(case.label)))
        split: Split | None = "test" if case.test else fixed.get(case.id)
        if split is not None:
            splits.setdefault(site, {})[cid] = split
    untested = [  # every case given a split, none of them test: the run's split has nothing left to draw one from
        site
        for site, site_cases in by_site.items()
        if len(splits.get(site, {})) == len(site_cases) and "test" not in splits[site].values()
    ]
    if untested:
        raise FederationError(
            f"{splits_path}: fold {fold or 0} puts every imagesTr case of site {untested[0]!r} in train or val and the "
            "site has no labelled imagesTs case: it would have no test cases (add its test cases to imagesTs/ and "
            f"labelsTs/, or move {SPLITS_FINAL} aside: the run's split then draws train, val and test cases)"
        )
    meta: dict[str, object] = {"dataset": src.name, "channel_names": ",".join(info.channel_names)}
    sites = [
        PlannedSite(name, site_cases, dict(meta), splits.get(name, {})) for name, site_cases in sorted(by_site.items())
    ]
    notes = unlabelled_note(src, info.file_ending) + [
        f'{info.path}: "labels": {name!r} is imported as a region to segment; nnU-Net\'s ignore label (unannotated '
        f'voxels) is spelled "{IGNORE}", in lower case'
        for name in info.regions
        if name.lower() == IGNORE
    ]
    channel_names = info.channel_names if all(n.strip() for n in info.channel_names) else None
    return Plan(
        info.name,
        kind,
        len(info.channel_names),
        info.regions,
        sites,
        info.label_names,
        notes,
        channel_names,
        f"{info.path} channel_names",
        info.ignore,
    )
