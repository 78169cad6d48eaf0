"""``fedseg predict``'s nnU-Net inputs: which files are one input (``Source``): an nnU-Net case's channel files
``<case>_XXXX.<ext>`` grouped and ordered (``nnunet_cases``, ``given_source``), and the channels an input's nnU-Net
``dataset.json`` names, checked against the model's (``check_dataset_channels``, ``channels_note``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from fedseg.data.case_files import IMAGE_EXTS, read_image, split_name
from fedseg.data.federation import FederationError, channel_order
from fedseg.data.folder import group_problems
from fedseg.data.importers.nnunet import CHANNEL_DIGITS, CHANNEL_FILE, DATASET_JSON
from fedseg.predict_model import PredictError
from fedseg.run.bundles import MANIFEST, Bundle


@dataclass(frozen=True)
class Source:
    """What one input is read from: ``files``, one image file or DICOM series folder, or an nnU-Net case's channel
    files in channel order; ``case``: the nnU-Net case id its mask is named after (else ``None``)."""

    files: tuple[Path, ...]
    case: str | None = None


def channel_file(path: Path) -> tuple[str, int, str] | None:
    """``(case, channel, ext)`` of an nnU-Net channel file ``<case>_XXXX.<ext>``, else None."""
    named = split_name(path.name, IMAGE_EXTS) if path.is_file() else None
    match = CHANNEL_FILE.match(named[0]) if named else None
    if named is None or match is None:
        return None
    return match["case"], int(match["channel"]), path.name[-len(named[1]) :]  # the extension as spelt


NNUNET_IMAGE_FOLDERS = ("imagesTs", "imagesTr")  # where a one-channel model's numbered volumes are a case's channels


def nnunet_cases(paths: list[Path], channels: int, kind: Literal["2d", "3d"]) -> list[Source]:
    """``paths`` (``list_inputs``) as inputs. The nnU-Net channel files among them (``<case>_XXXX.<ext>``, as in a
    dataset's ``imagesTs/``) are read one case at a time, its channel files stacked in channel order and its mask
    named ``<case>.<ext>`` as nnU-Net names its predictions, where the first such file holds one channel; every
    other path is one input. Where a file already holds the model's several channels (an RGB ``_0000`` file;
    ``img_0000.npy, img_0001.npy`` of two channels each for a two-channel model: numbered images, not the channels of
    case ``img``), only cases of a lone ``_0000`` file are named after the case; a name without a ``_0000`` file of
    its own (``scan_2019.png``) is an image. A case missing a channel file, or with one the model does not read,
    raises ``PredictError`` naming the files (the first few of each kind). For a one-channel model, 3D volumes
    ``<case>_0000``, ``<case>_0001`` in an nnU-Net dataset's ``imagesTs/`` or ``imagesTr/`` are a case's channels (a
    T2 beside the CT, refused: nnU-Net reads the folder so too); anywhere else, and 2D images anywhere, files so
    numbered are a series, each an image (``scan_0000.nii.gz``, ``frame_0001.png``)."""
    cases: dict[tuple[str, str], dict[int, Path]] = {}
    for path in paths:
        if (named := channel_file(path)) is not None:
            cases.setdefault((named[0], named[2]), {})[named[1]] = path
    cases = {key: found for key, found in cases.items() if 0 in found}  # scan_2019.png: no case without its _0000
    channel_files = {p for found in cases.values() for p in found.values()}
    others = [Source((p,)) for p in paths if p not in channel_files]
    grouped = [Source(tuple(found[c] for c in sorted(found)), case) for (case, _), found in cases.items()]
    if not cases:
        return others
    first = min(channel_files)
    try:
        nnunet_folder = kind == "3d" and first.parent.name in NNUNET_IMAGE_FOLDERS
        one_channel_files = read_image(first, kind).shape[0] == 1 and (channels > 1 or nnunet_folder)
    except FederationError:
        return [Source((p,)) for p in paths]  # read_inputs names the unreadable file
    if not one_channel_files:
        if all(set(found) == {0} for found in cases.values()):
            return sorted(grouped + others, key=lambda s: s.files[0])
        return [Source((p,)) for p in paths]
    problems = []
    reads = "one channel, _0000" if channels == 1 else f"{channels} channels, _0000 to _{channels - 1:04d}"
    for (case, ext), found in cases.items():
        folder = found[min(found)].parent
        problems += [
            f"{folder / f'{case}_{c:0{CHANNEL_DIGITS}d}.{ext}'}: missing (channel {c} of nnU-Net case {case!r}: the "
            f"model reads {reads})"
            for c in range(channels)
            if c not in found
        ]
        problems += [
            f"{found[c]}: channel {c} of nnU-Net case {case!r}, but the model reads {reads} (move the file out of "
            "the folder)"
            for c in sorted(set(found) - set(range(channels)))
        ]
    if problems:  # the same problem in many cases: the first few, then a count
        raise PredictError("\n".join(group_problems(problems)))
    return sorted(grouped + others, key=lambda s: s.files[0])


def given_source(path: Path, channels: int, kind: Literal["2d", "3d"]) -> Source:
    """What channel file ``path`` (``<case>_XXXX.<ext>``), given alone, is read as: as in its folder given as the input
    (``nnunet_cases`` of the folder's channel files), so its mask has the same name either way: its case (all its
    channel files, or a lone ``_0000`` file), or, among numbered images that are no case's channels
    (``site1_0000.png``, ``site1_0001.png``), the file itself under its own name. Where another case of the folder
    is incomplete, from its own case's files alone."""
    found = channel_file(path)
    entries = sorted(p for p in path.parent.iterdir() if not p.name.startswith("."))
    named = {p: c for p in entries if (c := channel_file(p)) is not None}
    try:
        sources = nnunet_cases(list(named), channels, kind)
    except PredictError:  # another case's problem, not this input's (its own case's are raised here)
        same_case = [p for p, c in named.items() if found is not None and c[::2] == found[::2]]
        sources = nnunet_cases(same_case, channels, kind)
    return next((s for s in sources if path.name in {f.name for f in s.files}), Source((path,)))


def input_dataset_json(path: Path) -> Path | None:
    """The nnU-Net ``dataset.json`` that describes the input ``path``: in its folder (``path`` itself, or a file's
    folder), else in that folder's parent (the ``DatasetNNN_Name/`` holding ``imagesTs/``); None without one."""
    folder = path if path.is_dir() else path.parent
    return next((f / DATASET_JSON for f in (folder, folder.parent) if (f / DATASET_JSON).is_file()), None)


@dataclass
class DatasetChannels:
    """What an input's nnU-Net ``dataset.json`` says of its channels, compared with the model's
    (``fedseg.data.federation.channel_order``)."""

    path: Path
    names: list[str]
    order: str  # same | other names | unknown (reordered is refused)


def check_dataset_channels(path: Path, channels: int, bundle: Bundle) -> DatasetChannels | None:
    """Refuse the images of an nnU-Net dataset (``path`` or its folder, in a ``DatasetNNN_Name/`` whose
    ``dataset.json`` lists ``channel_names``, or an MSD task's ``modality``; ``input_dataset_json``) for a model that
    reads another number of channels: under a one-channel model the files of a two-channel case would pass as two
    images. An RGB dataset's three names fit a 3-channel model (they are the three channels of one file). Where the
    model knows its channel names too (``Bundle.channel_names``) and the dataset lists the same names in another
    order (``channel_order``: ``reordered``), they are refused: a test set that numbers FLAIR ``_0000`` where the
    model read T1 from ``_0000`` would be segmented silently wrong. Other names (``T1w`` for ``T1``) give no order to
    compare: said in the note (``channels_note``), not refused. None where no dataset.json names channels."""
    found = input_dataset_json(path)
    if found is None:
        return None
    try:
        data = json.loads(found.read_text(encoding="utf-8"))
        names = data.get("channel_names") or data.get("modality")
    except (OSError, ValueError, AttributeError):
        return None
    if not isinstance(names, dict) or not names:
        return None
    if len(names) != channels:
        raise PredictError(
            f"{found}: lists {len(names)} channels ({', '.join(map(str, names.values()))}) "
            f"but the model reads {channels} ({bundle.folder / MANIFEST}: in_channels)"
        )
    if set(names) != {str(c) for c in range(channels)}:
        return None  # not numbered 0, 1, ...: no order to read
    theirs = [str(names[str(c)]) for c in range(channels)]
    ours = bundle.channel_names
    order = "unknown" if ours is None else channel_order(ours, theirs)
    if order == "reordered" and ours is not None:
        files = ", ".join(f"_{c:0{CHANNEL_DIGITS}d} = {n}" for c, n in enumerate(ours))
        raise PredictError(
            f"{found}: channel names {', '.join(theirs)} but the model reads {', '.join(ours)} (channel {files}; "
            f"{bundle.folder / MANIFEST}: channel_names): renumber the files (and dataset.json) to the model's "
            "order, or use a model trained on this one"
        )
    return DatasetChannels(found, theirs, order)


def channels_note(bundle: Bundle, dataset: DatasetChannels | None) -> str | None:
    """One line saying which channel the model reads where, for a user to check the inputs against (``predict``'s
    ``notes``), where the bundle knows its channel names; with what the input's dataset.json says of them. None
    where the bundle does not know them, or reads one channel (no order to get wrong; a DICOM series was told of
    nnU-Net channel files)."""
    names = bundle.channel_names
    if names is None or len(names) < 2:
        return None
    order = ", ".join(f"_{c:0{CHANNEL_DIGITS}d} = {n}" for c, n in enumerate(names))
    said = ""
    if dataset is not None and dataset.order == "same":
        said = f", as {dataset.path} lists them"
    elif dataset is not None:
        said = f"; {dataset.path} names them {', '.join(dataset.names)}: check they are these, in this order"
    return (
        f"the model reads {len(names)} channel{'s' if len(names) != 1 else ''} in this order: {order} (an nnU-Net "
        f"case's files; a file holding them all, in the same order){said}"
    )
