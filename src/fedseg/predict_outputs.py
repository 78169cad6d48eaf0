"""``fedseg predict``'s outputs: a mask in its input's format (``write_mask``), the overlay picture
(``overlay_image``), the names of every output file (``output_names``, ``CSV_NAME``) and the checks of ``--out``
before anything is written (``check_out``).
"""

from __future__ import annotations

import csv
from pathlib import Path
from typing import TYPE_CHECKING, cast

import numpy as np

from fedseg.atomic_files import naming_errors
from fedseg.data import readers
from fedseg.data.case_files import IMAGE_EXTS, PIL_EXTS, split_name
from fedseg.data.folder_write import write_nifti, write_nifti_like, write_png
from fedseg.data.volume_write import write_itk_volume
from fedseg.folder_lock import held_by_another
from fedseg.predict_inputs import Input, overlay_name
from fedseg.predict_model import PredictError
from fedseg.predict_seg import seg_name
from fedseg.run.model_card import RECORD_NAME
from fedseg.run.preflight import FOLDER_MARKS, check_out_dir

if TYPE_CHECKING:
    from nibabel.nifti1 import Nifti1Image

CSV_NAME = "predictions.csv"


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


def stored_shape(label: np.ndarray, stored: tuple[int, ...]) -> np.ndarray:
    """A 2D ``label`` ``(X, Y)`` as ``(X, Y, 1)`` where its image file stores the slice so (``stored``, the file's
    spatial shape or more: ``(X, Y, 1[, C])``, as nnU-Net's 2D NIfTI, or a NRRD/MetaImage of three dimensions, the
    third of size 1), so that the mask has its image's shape; any other ``label`` (a file stored ``(X, Y)``, a
    volume) as it is."""
    return label[:, :, None] if label.ndim == 2 and len(stored) > 2 and stored[2] == 1 else label


def write_mask(path: Path, label: np.ndarray, source: Path) -> None:
    """``label`` ``(*spatial)`` in ``source``'s format: NIfTI (with ``source``'s spatial header), NRRD or MetaImage
    (``path`` a ``.nrrd`` or ``.mha``, a ``.mhd`` source's too: ``mask_name``) on ``source``'s grid as ITK reads it
    (spacing, origin, directions in LPS: ``fedseg.data.volume_write``), ``.npy`` or PNG; NIfTI with the grid's affine
    for a DICOM series. A 2D image stored with a third axis of size 1 (NIfTI, NRRD, MetaImage, a one-slice DICOM
    series) gets its ``(X, Y, 1)`` shape (``stored_shape``), on that axis's spacing, direction and origin too."""
    found = None if source.is_dir() else split_name(source.name, IMAGE_EXTS)
    ext = "dcm" if found is None else found[1]  # a folder: a DICOM series (read_inputs accepted every ``source``)
    if ext == "dcm":
        grid = readers.volume_grid(source)  # the series' LPS grid as RAS
        write_nifti(path, stored_shape(label, grid.shape), grid.affine)
    elif ext.lower() in readers.ITK_EXTS:
        geometry = readers.itk_geometry(source)  # ITK's dimensions (vector components not among them), LPS
        write_itk_volume(path, stored_shape(label, geometry.shape), geometry)
    elif ext in ("nii", "nii.gz"):
        import nibabel as nib

        # a NIfTI file: nib.load gives a Nifti1Image/Nifti2Image, typed as the FileBasedImage base
        image = cast("Nifti1Image", nib.load(source))
        write_nifti_like(path, stored_shape(label, image.shape), image)
    elif ext == "npy":
        np.save(path, label)
    else:
        write_picture(path, label, source)


EXIF_ORIENTATION = 0x0112  # the EXIF tag a camera or phone sets where the picture is to be shown rotated or mirrored


def exif_orientation(source: Path) -> int | None:
    """The EXIF orientation of the PNG/JPEG ``source`` where it asks viewers to rotate or mirror the stored pixels
    (2-8, as phone photographs taken upright often do); None where it has none, 1 (as stored) or is no such file.
    fedseg reads the stored pixels, as training read them."""
    found = None if source.is_dir() else split_name(source.name, IMAGE_EXTS)
    if found is None or found[1] not in PIL_EXTS:
        return None
    from PIL import Image

    try:
        with Image.open(source) as image:
            value = image.getexif().get(EXIF_ORIENTATION)
    except (OSError, ValueError, SyntaxError):  # read before; a broken EXIF block: none
        return None
    return int(value) if isinstance(value, int) and 2 <= value <= 8 else None


def write_picture(path: Path, pixels: np.ndarray, source: Path) -> None:
    """A PNG mask or overlay of the PNG/JPEG ``source``: with its EXIF orientation (``exif_orientation``), so that a
    viewer shows the mask turned as it shows the photograph (both are on its stored pixel grid); else plain."""
    orientation = exif_orientation(source)
    if orientation is None:
        write_png(path, pixels)
        return
    from PIL import Image

    exif = Image.Exif()
    exif[EXIF_ORIENTATION] = orientation
    with naming_errors(path):
        Image.fromarray(np.ascontiguousarray(pixels)).save(path, exif=exif.tobytes())


def output_names(inputs: list[Input], overlay: bool, dicom_seg: bool = False) -> list[str]:
    """The files ``predict`` writes into ``out``: masks, overlays (``overlay``), the DICOM-SEGs of DICOM series inputs
    (``dicom_seg``), predictions.csv and predict.json (which model made them: ``fedseg.run.model_card``)."""
    overlays = [overlay_name(i.mask_name) for i in inputs if overlay]
    segs = [name for i in inputs if dicom_seg and (name := seg_name(i.path)) is not None]
    return [i.mask_name for i in inputs] + overlays + segs + [CSV_NAME, RECORD_NAME]


def earlier_outputs(out: Path, names: list[str], masks: list[str] | tuple[str, ...] = ()) -> list[Path]:
    """The files of an earlier ``predict`` in ``out`` that this one, writing ``names`` (its ``masks`` among them),
    would not replace: the masks and DICOM-SEGs its ``predictions.csv`` lists, their overlays
    (``<name>_overlay.png``) and those of ``masks`` (a predict without ``--overlay``: the overlay beside a mask shows
    an older one). ``--force`` replaces the earlier prediction as a whole, so that no mask is left beside the new ones
    that the new ``predictions.csv`` and ``predict.json`` do not describe (made by another model, or of another
    input), nor an overlay showing an older mask than the one beside it. Only plain files directly in ``out`` are
    taken; an unreadable CSV gives none."""
    try:
        with open(out / CSV_NAME, newline="", encoding="utf-8") as f:
            rows = list(csv.DictReader(f))
    except (OSError, UnicodeDecodeError, csv.Error):
        return []
    listed: list[str] = []
    for row in rows:
        for column in ("mask", "dicom_seg"):
            name = row.get(column) or ""
            if name and name == Path(name).name and name not in (".", ".."):
                listed += [name] + ([overlay_name(name)] if column == "mask" else [])
    listed += [overlay_name(m) for m in masks]
    keep = set(names)
    stale = [out / n for n in dict.fromkeys(listed) if n not in keep]
    return [p for p in stale if p.is_file() and not p.is_symlink()]


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


def model_folder_problem(out: Path, bundle_folder: Path) -> str | None:
    """One line if ``out`` is the model's bundle folder ``bundle_folder`` (``RUN/model/<algorithm>``), lies inside it,
    or is the folder holding it (a run's ``model/``): the masks would join the trained model, which is copied, shipped
    and audited (its weights' SHA-256) as it is; else None."""
    where, bundle = out.resolve(), bundle_folder.resolve()
    if where.is_relative_to(bundle):
        what = "is the model folder" if where == bundle else "is inside the model folder"
    elif where == bundle.parent:  # RUN/model: the run's bundles
        what = "holds the model folder"
    else:
        return None
    return f"--out {out}: {what} {bundle_folder}; the masks would join the trained model: choose an --out outside it"


def folder_mark(out: Path) -> str | None:
    """``"run (checkpoints)"`` where ``out`` is a run's, a study's, a bench's or a federation's folder
    (``fedseg.run.preflight.FOLDER_MARKS``, a run's ``config.yaml`` alone aside: a project folder may hold one of
    its own) or one a fedseg command is writing now (``folder_lock.held_by_another``); None otherwise."""
    if (holder := held_by_another(out)) is not None:
        return f"folder a fedseg command is writing ({holder})"
    marks = [(kind, m) for kind, names in FOLDER_MARKS.items() for m in names if (kind, m) != ("run", "config.yaml")]
    return next((f"{kind} ({m})" for kind, m in marks if (out / m).exists()), None)


def check_out(
    out: Path,
    inputs: list[Input],
    force: bool,
    overlay: bool = False,
    given: Path | None = None,
    dicom_seg: bool = False,
    bundle_folder: Path | None = None,
) -> None:
    """Refuse an ``out`` that is a file or under one, that is or lies inside the input folder ``given``
    (``input_folder_problem``), the model's ``bundle_folder`` (``model_folder_problem``) or a DICOM series input,
    that is a run's, study's, bench's or federation's folder (``folder_mark``),
    that would overwrite an input, where a folder (or anything but a file) sits where an output file goes, or
    (without ``force``) existing outputs."""
    try:
        check_out_dir(out)
    except ValueError as e:
        raise PredictError(str(e)) from None
    inside = [i.path for i in inputs if i.path.is_dir() and out.resolve().is_relative_to(i.path.resolve())]
    if inside:  # the masks would join the series' files (and the folder would no longer read as one series)
        raise PredictError(f"{out}: is inside the DICOM series folder {inside[0]} (an input); choose another --out")
    if given is not None and (problem := input_folder_problem(out, Path(given))) is not None:
        raise PredictError(problem)
    if bundle_folder is not None and (problem := model_folder_problem(out, bundle_folder)) is not None:
        raise PredictError(problem)  # with --force too: no output of predict belongs in a model
    if (mark := folder_mark(out)) is not None:  # with --force too: a run (still training?) writes its own files there
        raise PredictError(
            f"{out}: holds a {mark}; a prediction's masks go in a folder of their own: choose another --out"
        )
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
