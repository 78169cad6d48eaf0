"""``msd``: Medical Segmentation Decathlon task folders, one site per folder.

Expected layout of each ``SRC`` (e.g. ``Task07_Pancreas``; several may be given, e.g. MSD pancreas with
other collections converted to the same layout, as Auto-FedAvg combines them)::

    SRC/dataset.json      {"name": ..., "modality": {"0": "CT"}, "labels": {"0": "background", "1": "pancreas",
                           "2": "cancer"}, "training": [{"image": "./imagesTr/x.nii.gz",
                           "label": "./labelsTr/x.nii.gz"}, ...]}
    SRC/imagesTr/*.nii.gz images, (X, Y, Z) or (X, Y, Z, C) for C modalities (.nii, .nrrd, .mha as well)
    SRC/labelsTr/*.nii.gz label maps with the values of "labels" (.nii, .nrrd, .mha as well)

nnU-Net v1 task folders (``Task0XX_Name``, e.g. under ``$nnUNet_raw_data``) have this layout too, except that each
listed image ``imagesTr/<case>.nii.gz`` is stored as one file per modality, ``imagesTr/<case>_0000.nii.gz``,
``<case>_0001.nii.gz``, ... (as many as ``modality`` lists, in its order): where the listed image is absent, these are
read instead, checked to lie on the ``_0000`` file's grid and stacked into one 4D NIfTI as the ``nnunet`` importer
stacks them (``nnunet.channels_source``).

Only the ``training`` entries are imported (the test images have no labels); files not listed (such as
the ``._*`` files of the original archives) are ignored. Images and labels are linked as they are (NIfTI
kept with its affine); case id = the image's file name without ``.nii.gz`` (``.nrrd``, ...); site = the
folder's name, with site-level metadata ``task`` (dataset.json ``name``) and ``modality`` (its modalities,
comma-separated). ``federation.yaml`` ``channel_names``: the ``modality`` names in channel order, where every task
gives the same ones (else none: the channels are then known by number only).

Regions, one per non-background label, named after it (spaces -> ``_``):

- ``nested`` (the lesion lies inside the organ): label ``k``'s region holds every value ``>= k``: Pancreas
  ``pancreas = [1, 2]``, ``cancer = [2]``; Liver ``liver = [1, 2]``, ``cancer = [2]``; BrainTumour (1 edema,
  2 non-enhancing, 3 enhancing) becomes the BraTS regions ``WT = [1, 2, 3]``, ``TC = [2, 3]``, ``ET = [3]``;
- ``disjoint``: label ``k``'s region is ``[k]`` (Prostate's PZ/TZ, Hippocampus's anterior/posterior,
  HepaticVessel's vessel/tumour).

``auto`` (the default) picks ``nested`` for the tasks named in ``NESTED_TASKS`` (matched in dataset.json
``name`` or the folder name) and ``disjoint`` otherwise. Every task given must have the same modality
count and the same labels (an error names the folders that differ).
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from fedseg.data import readers
from fedseg.data.case_files import split_name
from fedseg.data.federation import FederationError, channel_order
from fedseg.data.importers.nnunet import channel_file, channels_source
from fedseg.data.importers.writer import (
    Plan,
    PlannedCase,
    PlannedSite,
    Source,
    check_distinct_names,
    existing_folder,
    near_miss,
    raise_problems,
)
from fedseg.data.structured import read_mapping

RegionMode = Literal["auto", "nested", "disjoint"]
REGION_MODES: tuple[RegionMode, ...] = ("auto", "nested", "disjoint")
NESTED_TASKS = ("BrainTumour", "Liver", "Pancreas")
BRATS_REGION_NAMES = ("WT", "TC", "ET")  # BrainTumour's nested regions, by BraTS convention
DATASET_JSON = "dataset.json"
MSD_EXTS = ("nii.gz", "nii", "nrrd", "mha")  # images and labels, linked as they are (read by fedseg.data.readers)


def read_dataset_json(task: Path) -> dict:
    """``TASK/dataset.json`` with ``labels``, ``modality`` and ``training`` checked; ``FederationError`` naming
    the file and the key otherwise."""
    path = task / DATASET_JSON
    data = read_mapping(
        path,
        "an MSD task folder holds dataset.json, imagesTr/ and labelsTr/",
        "a JSON object with labels, modality and training",
    )
    labels, modality, training = data.get("labels"), data.get("modality"), data.get("training")
    problems = [
        f'{path}: missing "{k}"{near_miss(k, data)}' for k in ("labels", "modality", "training") if k not in data
    ]
    if "labels" in data and (not isinstance(labels, dict) or not labels or not all(str(k).isdigit() for k in labels)):
        problems.append(f'{path}: "labels": expected an object label value -> name, got {labels!r}')
    if "modality" in data and (not isinstance(modality, dict) or not modality):
        problems.append(f'{path}: "modality": expected an object channel -> modality name, got {modality!r}')
    if "training" not in data:
        pass  # said above
    elif not isinstance(training, list) or not training:
        problems.append(f'{path}: "training": expected a non-empty list of {{"image": ..., "label": ...}}')
    elif not all(
        isinstance(t, dict) and isinstance(t.get("image"), str) and isinstance(t.get("label"), str) for t in training
    ):
        problems.append(f'{path}: "training": every entry needs "image" and "label" paths')
    raise_problems(problems)
    return data


def msd_regions(labels: dict[int, str], mode: RegionMode, task_name: str) -> dict[str, list[int]]:
    """Regions from a task's labels (see the module docstring); ``task_name`` decides ``auto``."""
    values = sorted(v for v in labels if v > 0)
    if not values:
        raise FederationError(f"{task_name}: dataset.json labels have no foreground label (only {labels})")
    nested = mode == "nested" or (mode == "auto" and any(t.lower() in task_name.lower() for t in NESTED_TASKS))
    names = [labels[v].strip().replace(" ", "_") or f"label{v}" for v in values]
    if nested and "braintumour" in task_name.lower() and len(values) == len(BRATS_REGION_NAMES):
        names = list(BRATS_REGION_NAMES)
    if nested:
        return {name: [w for w in values if w >= v] for name, v in zip(names, values)}
    return {name: [v] for name, v in zip(names, values)}


def plan_msd(sources: list[Path], regions: RegionMode = "auto") -> Plan:
    """Plan the import of MSD task folders ``sources`` (one site each; see the module docstring)."""
    if not sources:
        raise FederationError("msd: expected one or more task folders (dataset.json, imagesTr/, labelsTr/)")
    if regions not in REGION_MODES:
        raise FederationError(f"msd: --regions must be one of {', '.join(REGION_MODES)}, got {regions!r}")
    tasks = [existing_folder(s, "an MSD task folder: dataset.json, imagesTr/, labelsTr/") for s in sources]
    check_distinct_names("msd", tasks)
    infos = [read_dataset_json(t) for t in tasks]
    channels = {t: len(info["modality"]) for t, info in zip(tasks, infos)}
    if len(set(channels.values())) > 1:
        shown = ", ".join(f"{t} ({n})" for t, n in channels.items())
        raise FederationError(f"msd: the task folders differ in their number of modalities: {shown}")
    labels = [{int(k): str(v) for k, v in info["labels"].items()} for info in infos]
    if any(lab != labels[0] for lab in labels):
        shown = "; ".join(f"{t}: {lab}" for t, lab in zip(tasks, labels))
        raise FederationError(f"msd: the task folders differ in their labels: {shown}")
    problems: list[str] = []
    sites = []
    for task, info in zip(tasks, infos):
        cases, seen = [], set()
        for entry in info["training"]:
            image, label = task / entry["image"], task / entry["label"]
            parsed = split_name(image.name, MSD_EXTS)
            if parsed is None:
                problems.append(f"{image}: not a NIfTI, NRRD or MHA file (listed in {task / DATASET_JSON} training)")
                continue
            if parsed[0] in seen:
                problems.append(f"{image}: listed twice in {task / DATASET_JSON} training")
                continue
            seen.add(parsed[0])
            if not label.is_file():
                problems.append(f"{label}: missing (listed in {task / DATASET_JSON} training)")
            if (source := image_source(image, parsed, channels[task], task / DATASET_JSON, problems)) is not None:
                cases.append(PlannedCase(parsed[0], source, Source(label)))
        modality = ",".join(str(info["modality"][k]) for k in sorted(info["modality"], key=str))
        meta: dict[str, object] = {"task": str(info.get("name", task.name)), "modality": modality}
        sites.append(PlannedSite(task.name, cases, meta))
    raise_problems(problems)
    task_names = [str(info.get("name", task.name)) for task, info in zip(tasks, infos)]
    name = "+".join(dict.fromkeys(task_names))
    region_map = msd_regions(labels[0], regions, f"{task_names[0]} {tasks[0].name}")
    given = f"{tasks[0] / DATASET_JSON} modality"  # named in a channel-count problem: the user wrote no federation.yaml
    return Plan(
        name,
        "3d",
        channels[tasks[0]],
        region_map,
        sites,
        labels[0],
        channel_names=modality_names(infos),
        channels_from=given,
    )


def image_source(
    image: Path, parsed: tuple[str, str], channels: int, listed_in: Path, problems: list[str]
) -> Source | None:
    """The image listed as ``image`` (``parsed``: its case id and extension), linked as is; where it is absent, an
    nnU-Net v1 task's channel files beside it (``<case>_0000.<ext>``, ... one per ``modality``, in order), stacked as
    the nnunet importer stacks them (``nnunet.channels_source``). None, with a line in ``problems``, where neither
    is there (or a channel file is missing or on another grid than the first)."""
    if image.is_file():
        return Source(image)
    files = [image.with_name(channel_file(parsed[0], c, "." + parsed[1])) for c in range(channels)]
    present = [f.is_file() for f in files]
    if not any(present):
        problems.append(
            f"{image}: missing (listed in {listed_in} training; nor is there an nnU-Net v1 channel file "
            f"{files[0].name})"
        )
    elif not all(present):
        c = present.index(False)
        problems.append(
            f"{files[c]}: missing (channel {c} of case {parsed[0]!r}; {listed_in} lists {channels} modalities)"
        )
    elif (off_grid := readers.channels_grid_problem(files)) is not None:
        problems.append(off_grid)
    else:
        return channels_source(files, "3d")
    return None


def modality_names(infos: list[dict]) -> list[str] | None:
    """The channel names the tasks' ``modality`` objects give, in channel order (``"0"``, ``"1"``, ...), where every
    task gives the same ones (``channel_order``: as ``fedseg predict`` compares them); else None."""
    named = []
    for info in infos:
        modality = info["modality"]
        keys = sorted(modality, key=lambda k: int(k) if str(k).isdigit() else -1)
        if [str(k) for k in keys] != [str(i) for i in range(len(keys))]:
            return None  # not numbered 0, 1, ...: no order to trust
        named.append([str(modality[k]).strip() for k in keys])
    if not all(named[0]) or any(channel_order(named[0], names) != "same" for names in named):
        return None
    return named[0]
