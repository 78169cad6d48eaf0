"""``fedseg predict``: apply a run's trained bundle (``RUN/model/<algorithm>/``) to new image files.

Pipeline, per image file (PNG/JPEG/NPY/NIfTI/NRRD/MetaImage) or DICOM series folder (read by
``fedseg.data.folder.read_image``), or per nnU-Net case: the ``<case>_XXXX.<ext>`` channel files of a folder such
as a dataset's ``imagesTs/`` are read one case at a time, stacked as ``fedseg data import nnunet`` stacks them, the
mask named ``<case>.<ext>`` (``nnunet_cases``; one channel file given alone brings its case):

1. preprocess exactly as training did (``fedseg.data.preprocess.case_tensors`` with the
   manifest's ``image_size`` and ``normalize``): ``x`` ``(C, *S)``, ``S = (image_size,) * dims``;
2. bundles that route each image among their networks (a family's ``routing``, e.g. FedSM's super model,
   ``fedseg.algorithms.fedsm.routing``: the selector picks a network per image, ``gamma`` overrides its
   threshold) apply that routing. Single-model bundles
   (``global``: FedAvg and relatives, centralized; ``local:<site>``: pick one with ``site``) apply
   that network. Masks = ``sigmoid(logits) > threshold`` (manifest ``threshold``), ``(R, *S)``,
   exactly as evaluation computes them (``fedseg.evaluate.inference.predict_masks``); with ``tta`` the network
   that segments an image (the routed one, chosen on the image as given) is mirrored: its logits averaged over
   every flip of the spatial axes (``fedseg.evaluate.mirror``, nnU-Net's test-time augmentation; evaluation does
   not do this);
3. resize the masks back to the file's spatial shape (nearest, ``preprocess.restore_size``) and
   turn them into a label map with the federation's label values (``Regions.to_label``);
   volume bundles (manifest ``volume.patch_size`` set, ``data.volume``): steps 1-3 are the volume
   pipeline instead, exactly as evaluation runs it: the file is preprocessed on its own grid
   (``fedseg.data.volumes.preprocess`` with its spacing, ``file_spacing``: the volume header's, else 1),
   predicted by sliding window and mapped back to its grid (``fedseg.evaluate.sliding.predict_on_grid``);
   a selector still routes on the fixed-size view of step 1 (ensemble mode: the super model slides);
4. write the label map in the input's format: PNG for PNG/JPEG (lossless), ``.npy``, or NIfTI
   with the input's affine (NRRD/MetaImage inputs and DICOM series get a NIfTI mask on their grid; a 2D image
   stored ``(X, Y, 1)``, as NIfTI, NRRD or MetaImage, an ``(X, Y, 1)`` mask, the shape of its image); plus
   ``predictions.csv``: per image ``file``, ``mask``, ``model``
   (the routed bundle's chosen candidate, or the single model's name), ``confidence`` (empty without
   routing) and the routing's ``prob:<candidate>`` scores;
5. with ``overlay``: ``<name>_overlay.png`` per input, the image (3D: its middle slice) with the
   predicted regions filled and outlined in the Okabe-Ito colours (``overlay_image``);
6. with ``dicom_seg``: ``<name>.dcm`` per DICOM series input, a DICOM-SEG of the region masks of step 3 (before they
   are painted to a label map) referencing the source slices (``fedseg.predict_seg``; other inputs get none, and
   ``predictions.csv`` gains a ``dicom_seg`` column after ``mask``, empty for them).

Channel order: a bundle whose federation named its channels (manifest ``channel_names``) reads them in that order;
where the input belongs to an nnU-Net dataset whose ``dataset.json`` names them too (``check_dataset_channels``;
an MSD task's ``modality``), the same names in another order are refused (nothing is predicted; one line says both
orders); ``notes`` receives the order the model reads, and what the dataset.json says where its names are others
(``T1w`` for ``T1``: no order can be read from them), for the user to check.

Every input is listed and read and checked (readable, channel count, spatial dimensions, no NaN or Inf pixels)
before any model runs: an entry of the input folder that cannot be an input (another file type, a broken link, a
folder of DICOM files that is no series) is reported, never skipped. ``out`` must not be or lie inside the input
folder, and no folder may sit where an output file goes. Outputs go to a hidden staging folder inside
``out`` (``folder.staging_folder``) and are moved into place only when all of them are written, all together
(``folder.move_in``: files they replace, with ``--force``, are put back if a move fails or is interrupted), so a
failure or interruption while reading, predicting or writing leaves ``out`` as it was. Errors are ``PredictError``
(or ``FederationError`` from the readers, ``OSError`` from the file system), each naming the file; the same problem
on many files is grouped (``folder.group_problems``).
"""

from __future__ import annotations

import json
import shlex
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Literal, cast

import numpy as np
import torch
from torch import nn

from fedseg.algorithms.registry import RoutedModel
from fedseg.atomic_files import strict_json_text
from fedseg.data import readers
from fedseg.data.federation import FederationError, channel_order
from fedseg.data.folder import _PIL_EXTS as PLANE_EXTS
from fedseg.data.folder import (
    IMAGE_EXTS,
    _write_nifti,
    _write_png,
    case_problems,
    group_problems,
    move_in,
    read_image,
    split_name,
    staging_folder,
    write_nifti_like,
)
from fedseg.data.importers.nnunet import CHANNEL_DIGITS, CHANNEL_FILE, DATASET_JSON, stacked_channels
from fedseg.data.preprocess import case_tensors, normalization, restore_size
from fedseg.data.volumes import Grid, file_spacing, preprocess
from fedseg.engine.messages import load_weights
from fedseg.evaluate.inference import predict_masks
from fedseg.evaluate.mirror import MirrorAveraged
from fedseg.evaluate.sliding import network_for, predict_on_grid
from fedseg.predict_seg import SegWriter, seg_name, seg_writer
from fedseg.run.bundles import (
    MANIFEST,
    WEIGHTS,
    Bundle,
    BundleError,
    find_bundle,
    load_bundle,
    run_bundles,
)
from fedseg.run.model_card import RECORD_NAME, card_line, prediction_record
from fedseg.run.outputs import csv_text
from fedseg.run.preflight import check_device, check_out_dir

if TYPE_CHECKING:
    from nibabel.nifti1 import Nifti1Image

CSV_NAME = "predictions.csv"
BASE_COLUMNS = ["file", "mask", "model", "confidence"]


PredictError = BundleError  # a bad model folder, option or input file; the message names it


# --- the predictor ---------------------------------------------------------------------------------
@dataclass
class Predictor:
    """``model`` maps images ``(B, C, *S)`` to region logits ``(B, R, *S)``. A routed bundle (``routed``):
    ``candidates`` are its networks' names and ``prob_names`` the candidate of each routing score; a
    single model: ``candidates = [the model's name]`` and ``prob_names = []``."""

    model: nn.Module
    candidates: list[str]
    prob_names: list[str]
    routed: RoutedModel | None = None

    @property
    def columns(self) -> list[str]:
        return BASE_COLUMNS + [f"prob:{n}" for n in self.prob_names]

    @torch.no_grad()
    def choices(self, x: torch.Tensor) -> list[dict]:
        """Per image of ``x`` ``(B, C, *S)``: ``model``, ``confidence`` and ``prob:<candidate>``."""
        if self.routed is None:
            return [{"model": self.candidates[0], "confidence": ""} for _ in range(len(x))]
        return self.routed.choices(x)


def find_model(model: Path, algorithm: str | None = None) -> Path:
    """The bundle folder ``--model`` names (``run.bundles.find_bundle``); a study folder (or another folder of runs),
    whose bundles lie deeper, is refused naming the model folders of its runs to choose from."""
    try:
        return find_bundle(model, algorithm)
    except BundleError:
        if (deeper := runs_below(Path(model))) is not None:
            raise PredictError(deeper) from None
        raise


def runs_below(path: Path, shown: int = 4) -> str | None:
    """Why ``path`` is no run although runs lie below it (a study's ``holdout/<site>/``, ``sweep/<key>=<value>/``):
    one line listing their model folders (the first ``shown``); None where ``path`` is no study and holds none."""
    if not path.is_dir() or (path / MANIFEST).is_file() or run_bundles(path):
        return None
    models = sorted({m for pattern in ("*/model", "*/*/model") for m in path.glob(pattern) if run_bundles(m.parent)})
    from fedseg.report.study_tables import is_study_dir  # only here: it imports the report's figures

    study = is_study_dir(path)
    if not models:
        return f"{path}: is a study, not a run; none of its sub-runs has a model yet" if study else None
    what, runs = ("is a study, not a run", "of its sub-runs") if study else ("is not a run", "of the runs in it")
    listed = ", ".join(str(m.relative_to(path)) for m in models[:shown])
    more = f" and {len(models) - shown} more" if len(models) > shown else ""
    example = shlex.quote(str(models[0]))
    return f"{path}: {what}; choose the model of one {runs}: {listed}{more} (e.g. --model {example})"


def build_predictor(bundle: Bundle, gamma: float | None = None, site: str | None = None) -> Predictor:
    """The network(s) of ``bundle``; ``gamma`` overrides a threshold bundle's gamma, ``site`` picks
    the model of a bundle with one model per site (``local``)."""
    m = bundle.manifest
    routing = bundle.routing
    if routing is not None:
        if site is not None:
            raise PredictError(
                f"{bundle.folder}: --site applies to bundles with one model per site (local); "
                "this one routes every image with its selector"
            )
        problem = routing.option_problem(bundle.models, gamma, str(bundle.folder))
        if problem is not None:
            raise PredictError(problem)
        with weights_fit(bundle):
            routed = routing.build(bundle.models, bundle.new_segmenter, m["in_channels"], m["spatial_dims"], gamma)
        return Predictor(routed.network, routed.candidates, routed.prob_names, routed)
    if gamma is not None:
        raise PredictError(f"{bundle.folder}: --gamma applies to FedSM bundles; this one has no selector")
    names = list(bundle.models)
    if site is not None:
        by_site = {n.split(":", 1)[1]: n for n in names if ":" in n}
        if site not in by_site:
            raise PredictError(f"{bundle.folder}: no model for --site {site!r} (models: {', '.join(names)})")
        names = [by_site[site]]
    elif "global" in names:
        names = ["global"]
    if len(names) != 1:
        raise PredictError(f"{bundle.folder}: holds one model per site ({', '.join(names)}); choose one with --site")
    model = bundle.new_segmenter()
    with weights_fit(bundle):
        load_weights(model, bundle.models[names[0]])
    return Predictor(model.eval(), names, [])


@contextmanager
def weights_fit(bundle: Bundle):
    """Turn a weights/network mismatch while loading ``bundle`` into a ``PredictError`` naming its files."""
    try:
        yield
    except (KeyError, RuntimeError) as e:
        raise PredictError(
            f"{bundle.folder / WEIGHTS}: does not fit the network of {bundle.folder / MANIFEST} "
            f"({type(e).__name__}: {e})"
        ) from None


# --- inputs and outputs ----------------------------------------------------------------------------
@dataclass
class Input:
    """One image file: ``x`` ``(C, *S)`` preprocessed, ``spatial`` its original spatial shape; on the volume
    path also ``volume``: the image on its own grid ``(C, *P)`` and the ``Grid`` to map back."""

    path: Path  # the image file or DICOM series folder; an nnU-Net case's _0000 file (its grid and affine)
    name: str  # as written in predictions.csv: relative to the input folder (a case's channel files joined by +)
    mask_name: str
    x: torch.Tensor
    spatial: tuple[int, ...]
    volume: tuple[torch.Tensor, Grid] | None = None
    channel_files: tuple[Path, ...] = ()  # an nnU-Net case of several channel files: all of them, in channel order

    @property
    def files(self) -> tuple[Path, ...]:
        """Every file this input was read from."""
        return self.channel_files or (self.path,)


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


def mask_name(path: Path, case: str | None = None) -> str:
    """Output file name of ``path``'s mask: the same name (an nnU-Net channel file: its ``case``'s, without the
    ``_XXXX``), PNG for JPEG (masks must be lossless), NIfTI for a DICOM series folder (named after the folder)."""
    if path.is_dir():
        return f"{path.name}.nii.gz"
    found = split_name(path.name, IMAGE_EXTS)
    assert found is not None  # inputs are image files of a supported type (list_inputs, read_image)
    stem, ext = case or found[0], found[1]
    if ext.lower() in readers.ITK_EXTS:
        return f"{stem}.nii.gz"  # NRRD/MetaImage inputs: a NIfTI mask on the same grid
    return f"{stem}.{'png' if ext in ('jpg', 'jpeg') else ext}"


def overlay_name(mask: str) -> str:
    """``<name>_overlay.png``: the overlay written next to mask ``mask`` (``--overlay``)."""
    found = split_name(mask, IMAGE_EXTS)
    return f"{found[0] if found else mask}_overlay.png"


# Okabe-Ito colours (colour-blind safe), one per region in the order of the federation's regions
OVERLAY_COLOURS = ("#E69F00", "#56B4E9", "#009E73", "#D55E00", "#0072B2", "#CC79A7", "#F0E442")


def overlay_image(image: np.ndarray, masks: np.ndarray, alpha: float = 0.4) -> np.ndarray:
    """An RGB ``uint8`` picture of ``image`` ``(C, *spatial)`` with region ``masks`` ``(R, *spatial)``
    filled semi-transparently and outlined in the Okabe-Ito colours; 3D: the middle slice of the last axis.
    The image is scaled to 0-255 (min-max); 3 channels are shown as RGB, otherwise the first channel as grey."""
    if image.ndim == 4:
        image, masks = image[..., image.shape[-1] // 2], masks[..., masks.shape[-1] // 2]
    pixels = image.astype(np.float64)
    low, high = float(pixels.min()), float(pixels.max())
    pixels = (pixels - low) / (high - low) * 255 if high > low else np.zeros_like(pixels)
    rgb = np.moveaxis(pixels, 0, -1) if pixels.shape[0] == 3 else np.repeat(pixels[0][..., None], 3, axis=-1)
    for i, mask in enumerate(masks.astype(bool)):
        colour = np.array([int(OVERLAY_COLOURS[i % len(OVERLAY_COLOURS)][k : k + 2], 16) for k in (1, 3, 5)])
        rgb[mask] = (1 - alpha) * rgb[mask] + alpha * colour
        padded = np.pad(mask, 1)
        inner = padded[:-2, 1:-1] & padded[2:, 1:-1] & padded[1:-1, :-2] & padded[1:-1, 2:]
        rgb[mask & ~inner] = colour  # the region's outline, opaque
    return np.clip(np.rint(rgb), 0, 255).astype(np.uint8)


def is_series(path: Path) -> bool:
    """Whether ``path`` is a DICOM series folder (its files, by name, the first with a DICOM preamble)."""
    return path.is_dir() and readers.series_folder_problem(path) is None


def series_problem(folder: Path) -> str | None:
    """Why ``folder`` is no DICOM series (``readers.series_folder_problem``'s text, without its advice for a
    federation's ``images/``), or None."""
    problem = readers.series_folder_problem(folder)
    if problem is None:
        return None
    why, sep, _ = problem.rpartition("; ")
    return f"{why if sep else problem}; a DICOM series folder holds the .dcm files of one series and nothing else"


def holds_dicom(folder: Path) -> bool:
    """Whether ``folder`` holds a DICOM file (by its ``.dcm`` name, or the DICM preamble of a file of no image
    type): meant as a series, so when it is none, predict says why rather than ignoring it."""
    try:
        files = [p for p in readers.series_entries(folder) if p.is_file()]
    except OSError:
        return False
    if any(p.name.lower().endswith(".dcm") for p in files):
        return True
    for p in files:
        if split_name(p.name, IMAGE_EXTS) is None:
            try:
                with open(p, "rb") as f:
                    if f.read(132)[128:] == b"DICM":
                        return True
            except OSError:
                continue
    return False


def list_inputs(path: Path) -> list[Path]:
    """``path`` itself (an image file or a DICOM series folder), or the inputs of folder ``path``: its image
    files and the DICOM series folders in it (not recursive; hidden entries and folders without DICOM files ignored).
    Every entry that cannot be an input is reported in one ``PredictError``, the same problem on many entries grouped
    (``group_problems``): a file of another type, a broken link, a folder of DICOM files that is no series (a stray
    file or sub-folder in it: ``series_problem``); ``path`` itself such a folder: why it is no series."""
    path = Path(path)
    problems: list[str] = []
    if path.is_file() or is_series(path):
        files = [path]
    elif path.is_dir():
        images = [path / d for d in ("imagesTs", "imagesTr") if (path / d).is_dir()]
        if (path / "dataset.json").is_file() and images:  # an nnU-Net (or MSD) dataset's root
            given = shlex.quote(str(images[0]))
            raise PredictError(f"{path}: a dataset folder (dataset.json); give the folder of images: --input {given}")
        companions = readers.mhd_data_files(path)  # the data files of .mhd headers are no inputs of their own
        entries = [p for p in sorted(path.iterdir()) if not p.name.startswith(".") and p.name not in companions]
        files = []
        for entry in entries:
            if entry.is_file():
                files.append(entry)
            elif entry.is_dir():
                if (problem := series_problem(entry)) is None:
                    files.append(entry)
                elif holds_dicom(entry):
                    problems.append(problem)
            else:
                problems.append(f"{entry}: neither a file nor a folder (a broken symbolic link or a link loop)")
        images_in = [p for p in files if p.is_dir() or split_name(p.name, IMAGE_EXTS) is not None]
        if not images_in and holds_dicom(path):  # the folder of a series, with something else in it
            raise PredictError(series_problem(path) or f"{path}: not a DICOM series folder")
        if not files and not problems:
            raise PredictError(f"{path}: no image files (expected {', '.join(IMAGE_EXTS)}) or DICOM series folders")
    elif path.is_symlink():
        raise PredictError(f"{path}: a broken symbolic link")
    else:
        raise PredictError(f"{path}: no such file or folder")
    for p in files:
        if p.is_file() and split_name(p.name, IMAGE_EXTS) is None:
            dicom = "; a DICOM image is given as its series' folder" if p.suffix.lower() == ".dcm" else ""
            problems.append(f"{p}: unsupported file type (expected one of {', '.join(IMAGE_EXTS)}){dicom}")
    if problems:  # the same problem on many entries: the first few, then a count
        raise PredictError("\n".join(group_problems(problems)))
    return files


def read_input(source: Source, root: Path, bundle: Bundle) -> Input:
    """Read one image (an nnU-Net case: its channel files, stacked) and preprocess it as training did; raises naming
    the file if it does not fit the bundle."""
    m, path = bundle.manifest, source.files[0]
    named = split_name(path.name, IMAGE_EXTS)
    flat = named is not None and named[1] in PLANE_EXTS
    if flat and bundle.kind == "3d":
        raise PredictError(
            f"{path}: a 2D {path.suffix[1:].upper()} image, but this model segments 3D volumes "
            f"({bundle.folder / MANIFEST}: spatial_dims 3)"
        )
    image = read_source(source, bundle.kind)
    if image.shape[0] != m["in_channels"]:
        a_volume = bundle.kind == "2d" and not flat and (named is None or named[1] != "npy")  # None: DICOM series
        what = "a DICOM series' slices read" if named is None else "a 3D volume's third axis reads"
        raise PredictError(
            f"{path}: image has {image.shape[0]} channels but the model expects {m['in_channels']} "
            f"({bundle.folder / MANIFEST}: in_channels)"
            + (f"; this model segments 2D images: {what} as channels" if a_volume else "")
        )
    if min(image.shape[1:]) < 1:
        raise PredictError(f"{path}: empty image (shape {tuple(image.shape)})")
    if problems := nonfinite_problems(image, source.files):
        raise PredictError("\n".join(problems))
    norm = normalization(m["normalize"], m.get("ct_windows"))
    x, _ = case_tensors(image, None, bundle.regions, m["image_size"], norm)
    volume = None
    if bundle.volume is not None:
        spacing = file_spacing(path, m["spatial_dims"])
        xv, _, grid = preprocess(image, None, bundle.regions, spacing, bundle.volume, norm)
        volume = (xv, grid)
    base = root if root.is_dir() else root.parent  # a file given itself: named as in its folder
    name = "+".join(p.name if p == root else str(p.relative_to(base)) for p in source.files)
    channel_files = source.files if len(source.files) > 1 else ()
    return Input(path, name, mask_name(path, source.case), x, tuple(image.shape[1:]), volume, channel_files)


def nonfinite_problems(image: np.ndarray, files: tuple[Path, ...]) -> list[str]:
    """NaN or Inf pixels of ``image`` ``(C, *spatial)``, read from ``files`` (one file, or an nnU-Net case's channel
    files: the one holding them is named), refused as training and ``fedseg data check`` refuse them: the check of
    ``folder.case_problems``, given a label of the image's own shape and channel count (nothing else to report)."""
    per_file = 1 < len(files) == image.shape[0]
    parts = [(image[c : c + 1], f) for c, f in enumerate(files)] if per_file else [(image, files[0])]
    problems = []
    for part, path in parts:
        fits = np.broadcast_to(np.uint8(0), part.shape[1:])
        problems += case_problems(part, fits, path, path, part.shape[0])
    return problems


def read_source(source: Source, kind: Literal["2d", "3d"]) -> np.ndarray:
    """The image ``(C, *spatial)`` of one input: its file's, or an nnU-Net case's channel files stacked in channel
    order (as ``fedseg data import nnunet`` stacks them)."""
    return read_image(source.files[0], kind) if len(source.files) == 1 else stacked_channels(source.files, kind)


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


def read_inputs(path: Path, bundle: Bundle, overlay: bool = False, notes: list[str] | None = None) -> list[Input]:
    """Every input of ``path``, all checked before any is used; one error names the bad files (the first few of each
    kind of problem, then a count). An nnU-Net dataset's channels are checked against the model's first
    (``check_dataset_channels``); ``notes``, when given, receives the line of ``channels_note``."""
    inputs, problems, channels = [], [], bundle.manifest["in_channels"]
    listed = list_inputs(path)  # a dataset's root given as the input: said before its channels are compared
    dataset = check_dataset_channels(Path(path), channels, bundle)
    if notes is not None and (note := channels_note(bundle, dataset)) is not None:
        notes.append(note)
    if Path(path).is_file() and channel_file(Path(path)) is not None:  # a channel file: as its folder reads it
        sources = [given_source(Path(path), channels, bundle.kind)]
    else:
        sources = nnunet_cases(listed, channels, bundle.kind)
    for source in sources:
        try:
            inputs.append(read_input(source, Path(path), bundle))
        except (FederationError, PredictError) as e:
            problems += str(e).splitlines()
    if problems:  # the same problem on many files: the first few, then a count
        raise PredictError("\n".join(group_problems(problems)))
    names = [i.mask_name for i in inputs] + ([overlay_name(i.mask_name) for i in inputs] if overlay else [])
    clashes = sorted({n for n in names if names.count(n) > 1})
    if clashes:
        raise PredictError(f"{path}: several inputs would write the same mask file: {', '.join(clashes)}")
    return inputs


def stored_shape(label: np.ndarray, stored: tuple[int, ...]) -> np.ndarray:
    """A 2D ``label`` ``(X, Y)`` as ``(X, Y, 1)`` where its image file stores the slice so (``stored``, the file's
    spatial shape or more: ``(X, Y, 1[, C])``, as nnU-Net's 2D NIfTI, or a NRRD/MetaImage of three dimensions, the
    third of size 1), so that the mask has its image's shape; any other ``label`` (a file stored ``(X, Y)``, a
    volume) as it is."""
    return label[:, :, None] if label.ndim == 2 and len(stored) > 2 and stored[2] == 1 else label


def write_mask(path: Path, label: np.ndarray, source: Path) -> None:
    """``label`` ``(*spatial)`` in ``source``'s format: NIfTI (with ``source``'s affine; NIfTI too for NRRD, MetaImage
    and DICOM series sources, with their grid's affine), ``.npy`` or PNG. A 2D image stored with a third axis of
    size 1 (NIfTI, NRRD, MetaImage, a one-slice DICOM series) gets its ``(X, Y, 1)`` shape (``stored_shape``), that
    axis's spacing, direction and origin in the affine."""
    found = None if source.is_dir() else split_name(source.name, IMAGE_EXTS)
    ext = "dcm" if found is None else found[1]  # a folder: a DICOM series (read_inputs accepted every ``source``)
    if ext == "dcm" or ext.lower() in readers.ITK_EXTS:
        grid = readers.volume_grid(source)  # ITK's dimensions (vector components not among them) and LPS grid as RAS
        _write_nifti(path, stored_shape(label, grid.shape), grid.affine)
    elif ext in ("nii", "nii.gz"):
        import nibabel as nib

        # a NIfTI file: nib.load gives a Nifti1Image/Nifti2Image, typed as the FileBasedImage base
        image = cast("Nifti1Image", nib.load(source))
        write_nifti_like(path, stored_shape(label, image.shape), image)
    elif ext == "npy":
        np.save(path, label)
    else:
        _write_png(path, label)


def output_names(inputs: list[Input], overlay: bool, dicom_seg: bool = False) -> list[str]:
    """The files ``predict`` writes into ``out``: masks, overlays (``overlay``), the DICOM-SEGs of DICOM series inputs
    (``dicom_seg``), predictions.csv and predict.json (which model made them: ``fedseg.run.model_card``)."""
    overlays = [overlay_name(i.mask_name) for i in inputs if overlay]
    segs = [name for i in inputs if dicom_seg and (name := seg_name(i.path)) is not None]
    return [i.mask_name for i in inputs] + overlays + segs + [CSV_NAME, RECORD_NAME]


def input_folder_problem(out: Path, given: Path) -> str | None:
    """One line if ``out`` is the input folder ``given`` (``given`` a file: its folder) or lies inside it (``given``
    a folder): the masks and predictions.csv would join the images (a site's ``images/``, an ``imagesTs/``), where the
    next predict or ``fedseg data check`` reads them; else None. A folder holding the input folder is fine (``--input
    scans --out .``): the masks lie beside the scans, not among them."""
    folder = given if given.is_dir() else given.parent
    where, inputs = out.resolve(), folder.resolve()
    if where == inputs:
        relation, why = "is", f"the masks and {CSV_NAME} would join its images, and the next predict read them"
    elif given.is_dir() and where.is_relative_to(inputs):
        relation, why = "is inside", "a folder of masks would sit among its images (data check refuses such a folder)"
    else:
        return None
    return f"--out {out}: {relation} the input folder {folder}; {why}: choose an --out outside it"


def check_out(
    out: Path,
    inputs: list[Input],
    force: bool,
    overlay: bool = False,
    given: Path | None = None,
    dicom_seg: bool = False,
) -> None:
    """Refuse an ``out`` that is a file or under one, that is or lies inside the input folder ``given``
    (``input_folder_problem``) or a DICOM series input, that would overwrite an input, where a folder (or anything but
    a file) sits where an output file goes, or (without ``force``) existing outputs."""
    try:
        check_out_dir(out)
    except ValueError as e:
        raise PredictError(str(e)) from None
    inside = [i.path for i in inputs if i.path.is_dir() and out.resolve().is_relative_to(i.path.resolve())]
    if inside:  # the masks would join the series' files (and the folder would no longer read as one series)
        raise PredictError(f"{out}: is inside the DICOM series folder {inside[0]} (an input); choose another --out")
    if given is not None and (problem := input_folder_problem(out, Path(given))) is not None:
        raise PredictError(problem)
    targets = [out / name for name in output_names(inputs, overlay, dicom_seg)]
    sources = {f.resolve() for i in inputs for f in i.files}
    overwrite_input = [t for t in targets if t.resolve() in sources]
    if overwrite_input:
        raise PredictError(f"{overwrite_input[0]}: is an input image; choose another --out")
    not_files = [t for t in targets if t.exists() and not t.is_file()]
    if not_files:  # no file can replace it, even with --force: refused before anything is written
        what = "a folder" if not_files[0].is_dir() else "not a regular file"
        raise PredictError(f"{not_files[0]}: is {what}, not a file predict writes; remove it or choose another --out")
    existing = [t for t in targets if t.exists()]
    if existing and not force:
        raise PredictError(
            f"{existing[0]}: exists ({len(existing)} output file(s) in {out}); "
            "overwrite with --force or choose another --out"
        )


# --- the command -----------------------------------------------------------------------------------
def predict(
    model: Path,
    input: Path,
    out: Path,
    gamma: float | None = None,
    algorithm: str | None = None,
    site: str | None = None,
    force: bool = False,
    batch_size: int = 8,
    overlay: bool = False,
    notes: list[str] | None = None,
    dicom_seg: bool = False,
    device: str = "cpu",
    tta: bool = False,
) -> list[dict]:
    """Predict a mask for every image of ``input`` (a file or a folder) into ``out``; returns the
    rows of ``predictions.csv``. Nothing is written unless every input is valid. ``overlay``: also
    ``<name>_overlay.png`` per input, the image with its predicted regions drawn on it (``overlay_image``).
    ``dicom_seg``: also ``<name>.dcm`` per DICOM series input, its regions as a DICOM-SEG (``fedseg.predict_seg``);
    refused where no input is a DICOM series. ``predict.json`` records the bundle (its weights' SHA-256 and model
    card) and the options. ``notes``, when given, receives lines for the user: what the model is (its card, where
    it has one: ``card_line``), the channel order it reads, where it knows it (``channels_note``). ``device``: where
    the networks run (``cpu``, ``cuda[:N]``, ``mps``; float32, sliding-window blending on the CPU); ``tta``: mirroring
    test-time augmentation (``fedseg.evaluate.mirror``; 4 passes per 2D image, 8 per 3D window)."""
    run_on = check_device(device, "--device cpu")
    bundle = load_bundle(find_model(model, algorithm))
    predictor = build_predictor(bundle, gamma, site)
    predictor.model.to(run_on)
    if notes is not None and (line := card_line(bundle.manifest.get("trained"))) is not None:
        notes.append(line)
    inputs = read_inputs(input, bundle, overlay, notes)
    seg = seg_writer(bundle, [i.path for i in inputs], Path(input)) if dicom_seg else None  # before any prediction
    out = Path(out)
    check_out(out, inputs, force, overlay, Path(input), dicom_seg)
    replaced = [t for t in (out / n for n in output_names(inputs, overlay, dicom_seg)) if t.exists() or t.is_symlink()]
    with staging_folder(out, "predict") as staging:  # removed, and out if it made it, on any error or interruption
        rows = write_predictions(predictor, bundle, inputs, staging, batch_size, overlay, seg, run_on, tta)
        options = {"algorithm": bundle.folder.name, "threshold": bundle.manifest["threshold"], "gamma": gamma}
        options |= {"tta": tta, "device": str(run_on)}
        record = prediction_record(bundle.folder, bundle.manifest, {**options, "site": site}, len(inputs))
        (staging / RECORD_NAME).write_text(strict_json_text(record, indent=2) + "\n", encoding="utf-8")
        move_in(staging, out, replaced)  # all together: a failed or interrupted move puts back what it replaced
    return rows


def write_predictions(
    predictor: Predictor,
    bundle: Bundle,
    inputs: list[Input],
    folder: Path,
    batch_size: int,
    overlay: bool = False,
    seg: SegWriter | None = None,
    device: torch.device = torch.device("cpu"),
    tta: bool = False,
) -> list[dict]:
    """Masks of every input and ``predictions.csv`` into ``folder`` (with ``seg``: the DICOM-SEG of each DICOM
    series input too, its name in the ``dicom_seg`` column); returns the CSV rows. The networks run on ``device``
    (where ``predictor.model`` is), mirrored with ``tta`` (:class:`fedseg.evaluate.mirror.MirrorAveraged`)."""
    regions, threshold = bundle.regions, float(bundle.manifest["threshold"])
    model = MirrorAveraged(predictor.model, bundle.manifest["spatial_dims"]) if tta else predictor.model
    rows = []
    for start in range(0, len(inputs), batch_size):
        batch = inputs[start : start + batch_size]
        x = torch.stack([i.x for i in batch])
        masks = [None] * len(batch) if bundle.volume else predict_masks(model, x, batch_size, threshold, device)
        for item, mask, choice in zip(batch, masks, predictor.choices(x.to(device))):
            if item.volume is not None and bundle.volume is not None:  # sliding window, on the file's own grid
                image, grid = item.volume
                network = network_for(model, item.x, device)  # a selector routes on the fixed-size view
                restored = predict_on_grid(network, image, grid, bundle.volume, threshold, device).numpy()
            else:
                restored = restore_size(mask, item.spatial).numpy()
            write_mask(folder / item.mask_name, regions.to_label(restored), item.path)
            if overlay:
                picture = overlay_image(read_source(Source(item.files), bundle.kind), restored)
                _write_png(folder / overlay_name(item.mask_name), picture)
            row = {"file": item.name, "mask": item.mask_name, **choice}
            if seg is not None:  # a DICOM series' SEG (named), none for other inputs ("")
                row["dicom_seg"] = seg.write_for(folder, restored, item.path, choice["model"])
            rows.append(row)
    columns = list(predictor.columns)
    if seg is not None:  # the SEG's column right after the mask's
        columns.insert(columns.index("mask") + 1, "dicom_seg")
    (folder / CSV_NAME).write_text(csv_text(columns, rows), encoding="utf-8")
    return rows
