"""``fedseg predict``'s inputs: listing them (``list_inputs``: image files and DICOM series folders), reading and
checking each one and preprocessing it as training did (``read_input``, ``Input``), all of them checked before any
model runs (``read_inputs``), and the names of the files an input's outputs get (``mask_name``, ``overlay_name``).
nnU-Net cases and channel names: ``fedseg.predict_nnunet``.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np
import torch

from fedseg.data import dicom_series, folder_entries, readers
from fedseg.data.case_files import IMAGE_EXTS, case_problems, read_image, split_name
from fedseg.data.case_files import PIL_EXTS as PLANE_EXTS
from fedseg.data.federation import FederationError
from fedseg.data.folder import group_problems
from fedseg.data.importers.nnunet import stacked_channels
from fedseg.data.preprocess import case_tensors, normalization
from fedseg.data.reorient import orientation_codes, reoriented
from fedseg.data.volume_write import written_ext
from fedseg.data.volumes import Grid, file_spacing, preprocess
from fedseg.data.voxel_grid import VoxelGrid
from fedseg.path_checks import input_problem
from fedseg.predict_model import PredictError
from fedseg.predict_nnunet import (
    Source,
    channel_file,
    channels_note,
    check_dataset_channels,
    given_source,
    nnunet_cases,
)
from fedseg.run.bundles import MANIFEST, Bundle
from fedseg.wording import listed


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
    # a volume turned to the model's orientation (its manifest's): the turned grid's affine and the stored order's
    # axis codes, to turn its mask back (stored_order)
    turned: tuple[np.ndarray, str] | None = None

    @property
    def files(self) -> tuple[Path, ...]:
        """Every file this input was read from."""
        return self.channel_files or (self.path,)

    def stored_order(self, label: np.ndarray) -> np.ndarray:
        """``label`` (``(*spatial)``, on the input as the model read it) in the input's stored voxel order: turned
        back where the input was turned to the model's orientation (:func:`turned_to_model`), else as it is."""
        if self.turned is None:
            return label
        affine, codes = self.turned
        return reoriented(label, affine, codes)[0]


def mask_name(path: Path, case: str | None = None) -> str:
    """Output file name of ``path``'s mask: the same name (an nnU-Net channel file: its ``case``'s, without the
    ``_XXXX``), PNG for JPEG (masks must be lossless), ``.mha`` for a ``.mhd`` header (one file, no ``.raw`` beside
    it: ``volume_write.written_ext``), NIfTI for a DICOM series folder (named after the folder)."""
    if path.is_dir():
        return f"{path.name}.nii.gz"
    found = split_name(path.name, IMAGE_EXTS)
    assert found is not None  # inputs are image files of a supported type (list_inputs, read_image)
    stem, ext = case or found[0], found[1]
    if ext.lower() in readers.ITK_EXTS:
        return f"{stem}.{written_ext(ext)}"  # NRRD/MetaImage inputs: a mask of their format on the same grid
    return f"{stem}.{'png' if ext in ('jpg', 'jpeg') else ext}"


def overlay_name(mask: str) -> str:
    """``<name>_overlay.png``: the overlay written next to mask ``mask`` (``--overlay``)."""
    found = split_name(mask, IMAGE_EXTS)
    return f"{found[0] if found else mask}_overlay.png"


def is_series(path: Path) -> bool:
    """Whether ``path`` is a DICOM series folder (its files, by name, the first with a DICOM preamble)."""
    return path.is_dir() and dicom_series.series_folder_problem(path) is None


def series_problem(folder: Path) -> str | None:
    """Why ``folder`` is no DICOM series (``dicom_series.series_folder_problem``'s text, without its advice for a
    federation's ``images/``), or None."""
    problem = dicom_series.series_folder_problem(folder)
    if problem is None:
        return None
    why, sep, _ = problem.rpartition("; ")
    return f"{why if sep else problem}; a DICOM series folder holds the .dcm files of one series and nothing else"


def holds_dicom(folder: Path) -> bool:
    """Whether ``folder`` holds a DICOM file (by its ``.dcm`` name, or for a file of no image type its DICM preamble
    or, without one, a raw DICOM data set: ``dicom_series.is_dicom_file``): meant as a series, so when it is none,
    predict says why rather than ignoring it."""
    try:
        files = [p for p in dicom_series.series_entries(folder) if p.is_file()]
    except OSError:
        return False
    if any(p.name.lower().endswith(".dcm") for p in files):
        return True
    for p in files:
        if split_name(p.name, IMAGE_EXTS) is None:
            try:
                if dicom_series.is_dicom_file(p):
                    return True
            except (OSError, FederationError):  # unreadable, or no pydicom to read a file without the preamble
                continue
    return False


NOT_IMAGES = ("txt", "md", "csv", "tsv", "json", "yaml", "yml", "pdf", "html", "xlsx", "xls", "doc", "docx", "log")
"""Extensions of the notes a folder of images often holds (a README, a case list): left out of a folder's inputs
(said in one note), never taken for an unsupported image."""


def list_inputs(path: Path, notes: list[str] | None = None, problems_out: list[str] | None = None) -> list[Path]:
    """``path`` itself (an image file or a DICOM series folder), or the inputs of folder ``path``: its image
    files and the DICOM series folders in it (not recursive; hidden entries and folders without DICOM files ignored,
    but a folder whose one entry is a series, one level too deep, is reported).
    Every entry that cannot be an input is reported in one ``PredictError``, the same problem on many entries grouped
    (``group_problems``): a file of another type, a broken link, a folder of DICOM files that is no series (a stray
    file or sub-folder in it: ``series_problem``); ``path`` itself such a folder: why it is no series. A folder's
    document files (:data:`NOT_IMAGES`: notes.txt, cases.csv...) are left out, in one line of ``notes``. With
    ``problems_out``, the entries that cannot be inputs are added to it (one line each) and left out instead, so that
    the caller reports them together with the problems of the inputs it reads (``read_inputs``: one error, not one
    per pass)."""
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
        entries = [
            p for p in sorted(path.iterdir()) if not folder_entries.ignored_entry(p.name) and p.name not in companions
        ]
        documents = [p for p in entries if p.is_file() and p.suffix.lower().lstrip(".") in NOT_IMAGES]
        entries = [p for p in entries if p not in documents]
        if documents and notes is not None:
            shown = listed((p.name for p in documents), 3)
            notes.append(f"{path}: left out {len(documents)} file(s) that hold no image ({shown})")
        files = []
        for entry in entries:
            if entry.is_file():
                files.append(entry)
            elif entry.is_dir():
                if (problem := series_problem(entry)) is None:
                    files.append(entry)
                elif holds_dicom(entry) or dicom_series.nested_series(entry):  # a PACS export's case/series/*.dcm too
                    problems.append(problem)
            else:
                problems.append(f"{entry}: neither a file nor a folder (a broken symbolic link or a link loop)")
        images_in = [p for p in files if p.is_dir() or split_name(p.name, IMAGE_EXTS) is not None]
        if not images_in and holds_dicom(path):  # the folder of a series, with something else in it
            raise PredictError(series_problem(path) or f"{path}: not a DICOM series folder")
        if not files and not problems:
            raise PredictError(f"{path}: no image files (expected {', '.join(IMAGE_EXTS)}) or DICOM series folders")
    else:  # nothing there (fedseg predict says it before torch is imported: fedseg.path_checks)
        raise PredictError(input_problem(path))
    unsupported = [p for p in files if p.is_file() and split_name(p.name, IMAGE_EXTS) is None]
    for p in unsupported:
        dicom = "; a DICOM image is given as its series' folder" if a_dicom_slice(p) else ""
        problems.append(f"{p}: unsupported file type (expected one of {', '.join(IMAGE_EXTS)}){dicom}")
    if problems and problems_out is None:  # the same problem on many entries: the first few, then a count
        raise PredictError("\n".join(group_problems(problems)))
    if problems_out is not None:
        problems_out += problems
    return [p for p in files if p not in unsupported]


def a_dicom_slice(path: Path) -> bool:
    """Whether the file ``path`` (of no image type) is a DICOM file: by its ``.dcm`` name, or, as PACS exports name
    slices without one (``IM000123``, ``1.2.840...``), by its content (``dicom_series.is_dicom_file``), so that one
    slice given alone is told to be given as its series' folder rather than "unsupported file type" alone."""
    if path.suffix.lower() == ".dcm":
        return True
    try:
        return dicom_series.is_dicom_file(path)
    except (OSError, FederationError):  # unreadable, or no pydicom to tell
        return False


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
    for file in source.files:  # the reader's own words for an empty file: "cannot identify image file", "not gzip"
        if file.is_file() and file.stat().st_size == 0:
            raise PredictError(f"{file}: empty file (0 bytes; an interrupted copy or download?): copy it again")
    image = read_source(source, bundle.kind)
    if image.shape[0] != m["in_channels"]:
        a_volume = bundle.kind == "2d" and not flat and (named is None or named[1] != "npy")  # None: DICOM series
        what = "a DICOM series' slices read" if named is None else "a 3D volume's third axis reads"
        one_series = named is None and bundle.kind == "3d"  # a DICOM series is one channel
        last = named is not None and named[1] == "npy" and image.ndim > 2 and image.shape[-1] == m["in_channels"]
        raise PredictError(
            f"{path}: image has {image.shape[0]} channels but the model expects {m['in_channels']} "
            f"({bundle.folder / MANIFEST}: in_channels)"
            + (f"; this model segments 2D images: {what} as channels" if a_volume else "")
            + (
                "; a DICOM series is one channel: give each case as one multi-channel NIfTI, or as nnU-Net channel "
                "files <case>_0000.nii.gz, <case>_0001.nii.gz, ... in a folder named imagesTs"
                if one_series
                else ""
            )
            + (
                f"; a .npy image is stored channels first, (C, *spatial): this one's last axis holds "
                f"{m['in_channels']} (channels last, as a picture's array): save it with np.moveaxis(a, -1, 0)"
                if last
                else ""
            )
        )
    if min(image.shape[1:]) < 1:
        raise PredictError(f"{path}: empty image (shape {tuple(image.shape)})")
    if problems := nonfinite_problems(image, source.files):
        raise PredictError("\n".join(problems))
    image, turned = turned_to_model(image, path, bundle)
    norm = normalization(m["normalize"], m.get("ct_windows"))
    x, _ = case_tensors(image, None, bundle.regions, m["image_size"], norm, m.get("resize", "stretch"))
    volume = None
    if bundle.volume is not None:
        spacing = (
            file_spacing(path, m["spatial_dims"])
            if turned is None
            else VoxelGrid(image.shape[1:], turned[0]).spacing(3)
        )
        xv, _, grid = preprocess(image, None, bundle.regions, spacing, bundle.volume, norm)
        volume = (xv, grid)
    name = "+".join(input_name(p, root) for p in source.files)
    channel_files = source.files if len(source.files) > 1 else ()
    spatial = tuple(image.shape[1:])
    return Input(path, name, mask_name(path, source.case), x, spatial, volume, channel_files, turned)


def turned_note(inputs: list[Input], bundle: Bundle) -> str | None:
    """One line on the inputs turned to the model's orientation (:func:`turned_to_model`), by their own
    orientation; None where none was."""
    found: dict[str, int] = {}
    for item in inputs:
        if item.turned is not None:
            found[item.turned[1]] = found.get(item.turned[1], 0) + 1
    if not found:
        return None
    counts = ", ".join(f"{n} from {codes}" for codes, n in sorted(found.items()))
    return (
        f"{sum(found.values())} input volume(s) turned to {bundle.manifest['orientation']}, the voxel orientation "
        f"the model was trained on ({counts}; axes permuted and flipped, nothing resampled); their masks are "
        "written in each input's own voxel order"
    )


def turned_to_model(image: np.ndarray, path: Path, bundle: Bundle) -> tuple[np.ndarray, tuple[np.ndarray, str] | None]:
    """``image`` ``(C, X, Y, Z)`` of the volume ``path`` turned to the voxel orientation the model was trained on
    (``orientation`` in its manifest: every training volume lay in it) where it lies in another (its axes permuted
    and flipped, nothing resampled: ``fedseg.data.reorient.reoriented``), with the turned grid's affine and the
    input's own axis codes to turn its mask back (:meth:`Input.stored_order`); else ``(image, None)``: a model
    that recorded no orientation, a 2D model, an input without a grid (NumPy) or already in the model's."""
    target = bundle.manifest.get("orientation")
    if not target or bundle.manifest["spatial_dims"] != 3 or readers.volume_format(path) is None:
        return image, None
    affine = readers.volume_grid(path).affine
    codes = orientation_codes(affine)
    if codes == target:
        return image, None
    turned, turned_affine = reoriented(image, affine, target, spatial_axis=1)
    return turned, (turned_affine, codes)


def input_name(path: Path, root: Path) -> str:
    """``path`` (an input file or series folder) as ``predictions.csv`` names it: relative to the input folder
    ``root``, or its own name where it is ``root`` itself (a file or series given alone)."""
    base = root if root.is_dir() else root.parent  # a file given itself: named as in its folder
    return path.name if path == root else str(path.relative_to(base))


def nonfinite_problems(image: np.ndarray, files: tuple[Path, ...]) -> list[str]:
    """NaN or Inf pixels of ``image`` ``(C, *spatial)``, read from ``files`` (one file, or an nnU-Net case's channel
    files: the one holding them is named), refused as training and ``fedseg data check`` refuse them: the check of
    ``case_files.case_problems``, given a label of the image's own shape and channel count (nothing else to report)."""
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


@dataclass(frozen=True)
class Skipped:
    """A DICOM series input left out because its files cannot be read as one volume (``dicom_series.SeriesError``: a
    missing slice, uneven spacing...): ``path`` its folder, ``name`` as ``predictions.csv`` would name it (relative
    to the input folder), ``problem`` the one line saying what is wrong."""

    path: Path
    name: str
    problem: str

    @property
    def line(self) -> str:
        """One line for the user: the problem (naming the folder or its file) and that the series was skipped."""
        named = self.problem if self.problem.startswith(str(self.path)) else f"{self.path}: {self.problem}"
        return f"{named} (series skipped, not predicted)"


def read_inputs(
    path: Path,
    bundle: Bundle,
    overlay: bool = False,
    notes: list[str] | None = None,
    skipped: list[Skipped] | None = None,
) -> list[Input]:
    """Every input of ``path``, all checked before any is used; one error names the bad files (the first few of each
    kind of problem, then a count). An nnU-Net dataset's channels are checked against the model's first
    (``check_dataset_channels``); ``notes``, when given, receives the line of ``channels_note``.

    With ``skipped`` (``fedseg predict`` on a PACS folder of many series): a DICOM series whose files cannot be read
    as one volume (``dicom_series.SeriesError``: a missing slice, uneven spacing, a damaged slice) is left out and added
    to it, so the other inputs are predicted; refused as without it where every input is such a series (nothing to
    predict) or where any input has another problem (a wrong channel count, NaN pixels, an entry that is no input:
    the series' lines are said with them)."""
    inputs, channels = [], bundle.manifest["in_channels"]
    problems: list[str] = []
    unreadable: list[Skipped] = []  # series whose files cannot be read as one volume
    series_lines = 0  # their lines among the problems
    # a dataset's root given as the input: said before its channels are compared; entries that cannot be inputs
    # (another file type, a broken link, a folder that is no series): said with the problems of the files read
    listed = list_inputs(path, notes, problems)
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
        except dicom_series.SeriesError as e:
            problems += (lines := str(e).splitlines())
            series_lines += len(lines)
            folder = source.files[0]
            unreadable.append(Skipped(folder, input_name(folder, Path(path)), " ".join(str(e).split())))
        except (FederationError, PredictError) as e:
            problems += str(e).splitlines()
    if skipped is not None and unreadable and inputs and len(problems) == series_lines:
        skipped += unreadable  # only series unreadable as volumes, and inputs left to predict
        problems = []
    if problems:  # the same problem on many files: the first few, then a count
        raise PredictError("\n".join(group_problems(problems)))
    if notes is not None and (note := turned_note(inputs, bundle)) is not None:
        notes.append(note)
    names = [i.mask_name for i in inputs] + ([overlay_name(i.mask_name) for i in inputs] if overlay else [])
    clashes = sorted({n for n in names if names.count(n) > 1})
    if clashes:
        raise PredictError(f"{path}: several inputs would write the same mask file: {', '.join(clashes)}")
    return inputs
