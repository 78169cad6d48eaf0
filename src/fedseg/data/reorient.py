"""``fedseg data reorient``: a copy of a 3D federation folder whose volumes all lie in one voxel orientation.

fedseg reads every volume in its stored voxel order, never reoriented (``fedseg.data.readers``), and ``fedseg data
check`` warns when a federation's volumes lie in several orientations (``check.orientation_warnings``): a network
trained on them sees one site's anatomy turned or mirrored against another's. This writes a new federation folder
in which each volume's voxel axes are permuted and flipped to the orientation ``target`` names, in the axis codes
``nibabel.aff2axcodes`` gives (the direction each array axis runs towards; ``RAS``, the default and nibabel's
closest canonical: array axis 0 runs towards the patient's Right, 1 Anterior, 2 Superior; DICOM's and ITK's
``LPS``). No voxel is resampled or changed, and each keeps its place in the patient (the affine, voxel index ->
RAS+ mm, is permuted with the array: :func:`reoriented`), so its world position, spacing (mm, permuted with the
axes) and value are the source's.

What is written: ``federation.yaml`` and each site's ``splits.csv`` and ``cases.csv`` copied as they are; each case
whose image is a volume with a grid (NIfTI, NRRD, MetaImage, a DICOM series) as ``images/<case>.nii.gz`` and
``labels/<case>.nii.gz`` (its label read as a run reads it: a DICOM-SEG or RT Structure Set painted on the image's
grid), in the image's dtype and the label's values; a case stored as NumPy arrays (no grid, so no orientation to
turn) copied as it is. Written into a staging folder inside ``out`` and moved into place when complete
(``fedseg.data.folder_write``): an interrupted or failed command leaves nothing half-written.

On Flower no one machine holds every site's files: each SuperNode reports its own site's orientations with its data
check (:func:`site_orientations`: counts per orientation, no case id), the coordinator compares them
(``fedseg.data.check.site_orientation_warnings``: one warning line, as ``fedseg run``'s data check warns) and its
federation carries the one they agree on (:func:`deployment_orientation`, :class:`ReportedFederation`), which its
model bundles record as ``fedseg run``'s do.
"""

from __future__ import annotations

import dataclasses
import functools
import shutil
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from fedseg.data import dicom_series, readers, voxel_grid
from fedseg.data.federation import Case, Federation, FederationError
from fedseg.data.folder import HEADER_FILE, SPLITS_FILE
from fedseg.data.folder_write import (
    check_root,
    move_in,
    new_site_folder,
    staging_folder,
    write_case_image,
    write_case_label,
)
from fedseg.data.metadata import CASES_FILE

DEFAULT_TARGET = "RAS"
_AXES = ("RL", "AP", "SI")  # each anatomical axis's two directions: a target names one of each
NO_GRID = "none"  # in a site's orientation counts (:func:`site_orientations`): its cases without a grid


@dataclass(frozen=True)
class ReorientSummary:
    """What :func:`reorient_folder` wrote: ``turned`` cases whose voxel axes were permuted or flipped, ``kept``
    volumes already in the target orientation (rewritten as NIfTI all the same), ``copied`` cases without a grid
    (NumPy files) copied as they are, ``before``: orientation codes -> number of cases in the source, the most
    common first (ties by code)."""

    turned: int
    kept: int
    copied: int
    before: dict[str, int]


def check_target(target: str) -> str:
    """``target`` upper-cased if it names an orientation (three letters, one of R/L, A/P and S/I each, in any order:
    ``RAS``, ``LPS``, ``PIR``...), else a ``FederationError`` saying what one is."""
    codes = target.upper()
    if len(codes) != 3 or sorted(next((i for i, a in enumerate(_AXES) if c in a), 9) for c in codes) != [0, 1, 2]:
        raise FederationError(
            f"--to {target}: not an orientation; give three letters, one of R/L, A/P and S/I each (e.g. RAS, LPS)"
        )
    return codes


def reoriented(
    array: np.ndarray, affine: np.ndarray, target: str, spatial_axis: int = 0
) -> tuple[np.ndarray, np.ndarray]:
    """``array`` (its 3 spatial axes from ``spatial_axis`` on: 0 for a label ``(X, Y, Z)``, 1 for an image
    ``(C, X, Y, Z)``) with its voxel axes permuted and flipped so that they point as ``target`` says, and the 4x4
    affine (voxel index -> RAS+ mm) of the result: the same voxel values at the same world positions. The axes are
    matched by nibabel's ``io_orientation`` (each array axis to the world axis it is closest to); a grid that is
    oblique keeps its obliquity (no resampling)."""
    from nibabel.orientations import apply_orientation, axcodes2ornt, inv_ornt_aff, io_orientation, ornt_transform

    transform = ornt_transform(io_orientation(affine), axcodes2ornt(tuple(target)))
    spatial = np.moveaxis(array, range(spatial_axis), range(-spatial_axis, 0)) if spatial_axis else array
    turned = apply_orientation(spatial, transform)
    if spatial_axis:
        turned = np.moveaxis(turned, range(-spatial_axis, 0), range(spatial_axis))
    return np.ascontiguousarray(turned), affine @ inv_ornt_aff(transform, spatial.shape[:3])


def orientation_codes(affine: np.ndarray) -> str:
    """Where a grid's array axes point (``LPS``, ``RAS``...: ``nibabel.aff2axcodes``)."""
    from nibabel.orientations import aff2axcodes

    return "".join(str(code) for code in aff2axcodes(affine))


def voxel_orientation(image_path: Path) -> str | None:
    """The axis codes of a volume's stored voxel order (nibabel's ``aff2axcodes`` of its RAS grid: ``RAS``, ``LPS``,
    ``PRS``...), from its header(s) alone; ``None`` for a 2D image or NumPy array (no grid) or an unreadable header."""
    fmt = readers.volume_format(image_path)
    if fmt is None:
        return None
    try:
        if fmt == readers.DICOM:  # one slice says it: rows, columns, then slices stacked along their normal
            first = dicom_series.series_entries(image_path)[0]
            iop = np.asarray(dicom_series.read_dicom(first, stop_before_pixels=True).ImageOrientationPatient, float)
            axes = np.eye(4)
            axes[:3, :3] = np.column_stack([iop[:3], iop[3:], np.cross(iop[:3], iop[3:])])
            affine = voxel_grid.LPS_TO_RAS @ axes
        else:
            affine = readers.volume_grid(image_path).affine
        return orientation_codes(affine)
    except Exception:  # noqa: BLE001 — an unreadable header: the case's own check already said so
        return None


@dataclass
class ReportedFederation(Federation):
    """A federation whose cases lie on other machines: a Flower deployment's coordinator holds its header and site
    names only (``fedseg.flower.server.federation_from_record``). ``orientation``: the one voxel orientation every
    volume of every site lies in as the sites' SuperNodes reported it from their data check
    (:func:`deployment_orientation`), None where there is not one: what :func:`federation_orientation` says of it."""

    orientation: str | None = None


def with_reported_orientation(fed: Federation, orientation: str | None) -> ReportedFederation:
    """``fed`` (a coordinator's case-less federation) holding the orientation its sites reported."""
    fields = {f.name: getattr(fed, f.name) for f in dataclasses.fields(Federation)}
    return ReportedFederation(**fields, orientation=orientation)


def federation_orientation(fed: Federation) -> str | None:
    """The voxel orientation (:func:`voxel_orientation`) every case of ``fed`` lies in, from the headers alone; None
    where there is not one: the cases lie in several, or some case has no volume file with a grid (a built-in
    federation, NumPy files). A deployment's coordinator, which holds no site's files, has its sites' word for it
    (a :class:`ReportedFederation`). What a model bundle records as the orientation it was trained on
    (``orientation`` in its manifest), so that ``fedseg predict`` turns inputs lying otherwise to it."""
    if isinstance(fed, ReportedFederation):
        return fed.orientation
    images = [case.meta.get("image") for site in fed.sites for case in site.cases]
    if None in images:
        return None
    try:  # each file as it is now: a file replaced since gets read again
        stamped = tuple((Path(str(i)), *_stamp(Path(str(i)))) for i in images)
    except OSError:
        return None
    return _images_orientation(stamped)


def site_orientations(codes: Mapping[str, Sequence[object]], cases: int) -> dict[str, int]:
    """What a Flower SuperNode reports of its site's voxel orientations: axis codes -> number of its ``cases`` lying
    in them (``codes``: the data check's ``orientations`` of the site, codes -> its volumes), the cases without a grid
    (NumPy arrays, a 2D image) under :data:`NO_GRID`; the most common first (ties by code)."""
    counts = {code: len(volumes) for code, volumes in codes.items() if volumes}
    if (rest := cases - sum(counts.values())) > 0:
        counts[NO_GRID] = rest
    return dict(sorted(counts.items(), key=lambda item: (-item[1], item[0])))


def orientation_counts_problem(counts: object) -> str | None:
    """Why ``counts`` (a site's reply, :func:`site_orientations`, read from JSON) is not orientation counts: a mapping
    of axis codes (``RAS``...: three letters, one of R/L, A/P and S/I each) or :data:`NO_GRID` to whole numbers > 0;
    None where it is."""
    if not isinstance(counts, dict):
        return "not a mapping of orientations to case counts"
    for code, n in counts.items():
        if code != NO_GRID and not _is_orientation(str(code)):
            return f"{str(code)[:12]!r} is no orientation (three letters, one of R/L, A/P and S/I each)"
        if isinstance(n, bool) or not isinstance(n, int) or n <= 0:
            return f"{code}: {str(n)[:20]!r} cases is no whole number > 0"
    return None


def _is_orientation(code: str) -> bool:
    try:
        return check_target(code) == code
    except FederationError:
        return False


def deployment_orientation(sites: list[str], reports: Mapping[str, Mapping[str, int]]) -> str | None:
    """:func:`federation_orientation` of a federation whose ``sites`` hold their own files, from what each site
    reported (``reports``: site -> :func:`site_orientations`): the one orientation every case of every site lies in;
    None where a site reported none (a site without volumes with a grid), some case has no grid, or the cases lie in
    several."""
    codes = set()
    for site in sites:
        counts = reports.get(site)
        if not counts or NO_GRID in counts:
            return None
        codes |= set(counts)
    return codes.pop() if len(codes) == 1 else None


def _stamp(path: Path) -> tuple[int, int]:
    stat = path.stat()
    return stat.st_mtime_ns, stat.st_size


@functools.lru_cache(maxsize=4)
def _images_orientation(images: tuple[tuple[Path, int, int], ...]) -> str | None:
    """:func:`federation_orientation` of these image files (path, modification time in ns, size): their headers read
    once per run, not once per algorithm's bundle."""
    codes: set[str | None] = set()
    for image, _, _ in images:
        codes.add(voxel_orientation(image))
        if None in codes or len(codes) > 1:
            return None
    return codes.pop() if codes else None


def _write_case(case: Case, site_dir: Path, target: str) -> str | None:
    """Write one case into ``site_dir`` (module docstring); its source orientation codes, None where it has no grid
    (copied)."""
    image_path, label_path = Path(str(case.meta["image"])), Path(str(case.meta["label"]))
    if readers.volume_format(image_path) is None:  # NumPy arrays: no grid to turn
        for path, sub in ((image_path, "images"), (label_path, "labels")):
            shutil.copy2(path, site_dir / sub / path.name)
        return None
    affine = readers.volume_grid(image_path).affine
    image, label = (np.asarray(a) for a in case.arrays())
    image, new_affine = reoriented(image, affine, target, spatial_axis=1)
    label, _ = reoriented(label, affine, target)
    write_case_image(site_dir / "images", case.id, image, "3d", new_affine)
    write_case_label(site_dir / "labels", case.id, label, "3d", new_affine)
    return orientation_codes(affine)


def reorient_folder(fed: Federation, root: Path, out: Path, target: str = DEFAULT_TARGET) -> ReorientSummary:
    """Write ``fed`` (loaded from the folder ``root``) into the new folder ``out`` with every volume in the
    orientation ``target`` (module docstring). ``FederationError`` naming the problem (a 2D federation, a bad
    ``target``, an ``out`` that holds something, a case that cannot be read), leaving nothing behind."""
    target = check_target(target)
    if fed.kind != "3d":
        raise FederationError(f"{root}: a 2D federation; its images have no voxel orientation to turn")
    if out.resolve() == root.resolve() or root.resolve() in out.resolve().parents:
        raise FederationError(f"--out {out}: lies inside the federation folder {root}; choose a folder outside it")
    check_root(out, overwrite=False)
    before: dict[str, int] = {}
    turned = kept = copied = 0
    with staging_folder(out, "reorienting") as tmp:
        shutil.copy2(root / HEADER_FILE, tmp / HEADER_FILE)
        for site in fed.sites:
            site_dir = new_site_folder(tmp, site.name)
            for name in (SPLITS_FILE, CASES_FILE):
                if (root / site.name / name).is_file():
                    shutil.copy2(root / site.name / name, site_dir / name)
            for case in site.cases:
                codes = _write_case(case, site_dir, target)
                if codes is None:
                    copied += 1
                    continue
                before[codes] = before.get(codes, 0) + 1
                kept, turned = (kept + 1, turned) if codes == target else (kept, turned + 1)
        move_in(tmp, out)
    return ReorientSummary(turned, kept, copied, dict(sorted(before.items(), key=lambda item: (-item[1], item[0]))))
