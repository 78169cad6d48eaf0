"""The part every importer shares: a plan of files -> a checked folder federation, written atomically.

An importer (one module per layout) reads a dataset's own layout and returns a ``Plan``: the
federation's header (name, kind, channels, regions, label names, channel names where the layout says them, site
metadata), per site its fixed
splits if the layout gives them (``splits.csv``) and, per case, where its image and label come from
(``Source``). ``write_plan`` then

1. refuses an ``--out`` that exists and is not empty;
2. writes everything into a hidden temporary folder inside ``--out`` (``.importing-*``): a file usable
   as is is symlinked (absolute path; ``copy=True``: copied), anything else is converted and written
   (NIfTI with the source's affine, PNG for 2D);
3. runs ``data check`` on it (``fedseg.data.check.check_folder``); a problem it finds names the *source*
   file (the link's target) rather than the temporary copy;
4. moves its contents into ``--out`` (``fedseg.data.folder_write.move_in``).

Any error removes the temporary folder: ``--out`` is either complete and checked, or untouched.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Literal

import numpy as np

from fedseg.data.case_files import IMAGE_EXTS, LABEL_EXTS, split_name
from fedseg.data.federation import UNANNOTATED, Case, Federation, FederationError, Regions, Site, Split
from fedseg.data.folder import SPLITS_FILE, group_problems, load_folder, write_header
from fedseg.data.folder_write import (
    clear_dead_staging,
    move_in,
    new_site_folder,
    staging_folder,
    write_nifti,
    write_png,
)
from fedseg.data.metadata import CASES_FILE, write_cases_csv
from fedseg.data.splits import write_site_splits_csv
from fedseg.folder_lock import has_entries

Writer = Callable[[Path], None]  # writes the converted file to the path it is given (extension included)

log = logging.getLogger(__name__)
CHECKED = ("image_shape", UNANNOTATED)  # the case meta ``data check`` adds (``fedseg.data.check.check_folder``)


@dataclass(frozen=True)
class Source:
    """Where one file of a case comes from: ``path`` used as is (linked or copied, keeping its extension),
    or, with ``convert``, a function that writes the converted data to a path ending in ``ext``
    (``path`` is then the file it was made from, named in error messages)."""

    path: Path
    convert: Writer | None = None
    ext: str | None = None

    @classmethod
    def nifti(cls, path: Path, read: Callable[[], tuple[np.ndarray, np.ndarray]]) -> Source:
        """A NIfTI written from ``read() -> (array as stored, 4x4 affine)``."""
        return cls(path, lambda dest: write_nifti(dest, *read()), "nii.gz")

    @classmethod
    def png(cls, path: Path, read: Callable[[], np.ndarray]) -> Source:
        """A PNG written from ``read() -> uint8 (H, W) or (H, W, 3)``."""
        return cls(path, lambda dest: write_png(dest, read()), "png")

    def extension(self) -> str:
        """The extension of the written file: ``ext``, else the source's own (``nii.gz``, ``nrrd``, ``png``...;
        any of the folder format's ``IMAGE_EXTS`` and ``LABEL_EXTS``)."""
        if self.ext is not None:
            return self.ext
        parsed = split_name(self.path.name, tuple(dict.fromkeys(IMAGE_EXTS + LABEL_EXTS)))
        if parsed is None:
            raise FederationError(
                f"{self.path}: cannot be used as is (not a NIfTI, NRRD, MHA, PNG, JPEG, npy or DICOM-SEG file)"
            )
        if parsed[1].lower() == "mhd":  # a link to the header alone would lose its data file
            raise FederationError(
                f"{self.path}: a MetaImage .mhd header cannot be linked without its data file; store it as .mha"
            )
        return parsed[1].lower()


@dataclass(frozen=True)
class PlannedCase:
    id: str
    image: Source
    label: Source
    meta: dict[str, object] = field(default_factory=dict)  # case-level metadata (cases.csv)


@dataclass(frozen=True)
class PlannedSite:
    name: str
    cases: list[PlannedCase]
    meta: dict[str, object] = field(default_factory=dict)  # site-level metadata (federation.yaml sites:)
    fixed_splits: dict[str, Split] = field(default_factory=dict)  # case id -> split (<site>/splits.csv), if any


@dataclass(frozen=True)
class Plan:
    """What an importer found: the federation's header and, per site, its cases' sources."""

    name: str
    kind: Literal["2d", "3d"]
    channels: int
    regions: dict[str, list[int]]
    sites: list[PlannedSite]
    label_names: dict[int, str] | None = None
    notes: list[str] = field(default_factory=list)  # what the import leaves out on purpose, said once
    channel_names: list[str] | None = None  # what each channel holds, in order, where the layout says it
    channels_from: str | None = None  # the source that gave ``channels`` (``SRC/dataset.json channel_names``)
    ignore_label: int | None = None  # nnU-Net's ignore label: the value of unannotated voxels (``Regions.ignore``)


def read_nifti(path: Path) -> tuple[np.ndarray, np.ndarray]:
    """A NIfTI file's ``(data array as stored (scaling applied), 4x4 affine)``; ``FederationError`` naming it if
    it cannot be read."""
    import nibabel as nib

    try:
        image = nib.load(path)
        return np.asanyarray(image.dataobj), np.asarray(image.affine)  # type: ignore[attr-defined]
    except Exception as e:  # noqa: BLE001 — any decoder failure means "corrupt file" to the user
        raise FederationError(f"{path}: cannot read ({type(e).__name__}: {e})") from None


def single_source(sources: list[Path], layout: str, what: str) -> Path:
    """The one folder a layout takes (``what`` describes it); ``FederationError`` for several or a missing one."""
    if len(sources) != 1:
        raise FederationError(f"{layout}: expected one source folder ({what}), got {len(sources)}")
    return existing_folder(sources[0], what)


def existing_folder(path: Path, what: str) -> Path:
    if not path.is_dir():
        raise FederationError(f"{path}: not a folder (expected {what})")
    return path


def check_distinct_names(layout: str, folders: list[Path]) -> None:
    """A ``FederationError`` naming the two folders where two source folders have one name (a site is named after
    its folder), with the way out: a link under another name."""
    seen: dict[str, Path] = {}
    for folder in folders:
        if (other := seen.setdefault(folder.name, folder)) is not folder:
            raise FederationError(
                f"{layout}: {other} and {folder} would both be site {folder.name!r} (a site is named after its "
                f"folder): give one another name, e.g. a link: ln -s {folder} {folder.parent / (folder.name + '-2')}"
            )


def folder_sites(
    folders: list[Path], site_cases: Callable[[Path], tuple[list[PlannedCase], list[str]]]
) -> list[PlannedSite]:
    """One site per folder, named after it, with the cases ``site_cases`` finds there; every problem of every folder
    in one ``FederationError`` (:func:`raise_problems`)."""
    sites, problems = [], []
    for folder in folders:
        cases, site_problems = site_cases(folder)
        sites.append(PlannedSite(folder.name, cases))
        problems += site_problems
    raise_problems(problems)
    return sites


def near_miss(key: str, data: dict) -> str:
    """`` (the file has "channel_name": misspelt?)`` where ``data`` (a dataset.json) holds a near-miss of the missing
    ``key``, else ""."""
    import difflib

    close = difflib.get_close_matches(key, [str(k) for k in data], n=1, cutoff=0.75)
    return f' (the file has "{close[0]}": misspelt?)' if close else ""


def raise_problems(problems: list[str]) -> None:
    """One ``FederationError`` listing ``problems`` (the same problem on many files: the first 3, then a count)."""
    from fedseg.data.folder import problems_text

    if problems:
        raise FederationError(problems_text("cannot import", problems))


def _no_arrays() -> tuple[np.ndarray, np.ndarray]:
    raise RuntimeError("a planned case only carries metadata")


def header_federation(plan: Plan) -> Federation:
    """The plan as a ``Federation`` whose cases carry only ids and metadata (for ``federation.yaml`` and
    ``cases.csv``; their arrays are not readable). Its sites in name order, the order a folder without ``site_order``
    reads them in: an import's federation is ordered as imports before ``site_order`` existed were."""
    sites = [
        Site(s.name, [Case(c.id, _no_arrays, c.meta) for c in s.cases], s.fixed_splits or None, s.meta)
        for s in sorted(plan.sites, key=lambda s: s.name)
    ]
    regions = Regions.from_mapping(plan.regions, plan.ignore_label)
    return Federation(plan.name, plan.kind, plan.channels, regions, sites, plan.label_names, plan.channel_names)


def check_out(out: Path) -> None:
    """Refuse an ``--out`` that exists and is not an empty folder (a staging folder left by an import killed before
    it could clean up is removed first: ``clear_dead_staging``)."""
    if out.is_dir():
        clear_dead_staging(out, "importing")
    if out.exists() and (not out.is_dir() or has_entries(out)):
        raise FederationError(f"{out}: exists and is not an empty folder; importing needs a new or empty --out")


def _place(source: Source, dest: Path, copy: bool) -> None:
    if source.convert is not None:
        source.convert(dest)
    elif copy:
        shutil.copy2(source.path, dest)
    else:
        os.symlink(source.path.resolve(), dest)


def _sources_named(message: str, written: dict[str, Path], tmp: Path, out: Path) -> str:
    """``message`` with each written file's path replaced by its source, the temporary folder by ``out``."""
    for dest in sorted(written, key=len, reverse=True):
        message = message.replace(dest, str(written[dest]))
    return message.replace(str(tmp), str(out))


def write_plan(plan: Plan, out: str | Path, *, copy: bool = False) -> Federation:
    """Write ``plan`` as a folder federation at ``out`` (see the module docstring); returns the checked
    federation (read from ``out``, its cases carrying ``meta["image_shape"]`` as ``check_folder`` gives it).
    ``FederationError`` naming the file and
    the problem for any bad input, leaving nothing at ``out``."""
    from fedseg.data.check import check_folder

    out = Path(out)
    check_out(out)
    fed = header_federation(plan)  # validates regions and metadata before anything is written
    written: dict[str, Path] = {}
    with staging_folder(out, "importing") as tmp:
        write_header(tmp, fed)
        for site in plan.sites:
            site_dir = new_site_folder(tmp, site.name)
            for case in site.cases:
                for folder, source in (("images", case.image), ("labels", case.label)):
                    dest = site_dir / folder / f"{case.id}.{source.extension()}"
                    _place(source, dest, copy)
                    written[str(dest)] = source.path
            write_cases_csv(site_dir / CASES_FILE, next(s for s in fed.sites if s.name == site.name))
            if site.fixed_splits:
                write_site_splits_csv(site_dir / SPLITS_FILE, site.fixed_splits)
        notices: list[str] = []  # said once the folder has its final name (not the staging folder's)
        try:
            checked = check_folder(tmp, warnings=notices)
        except FederationError as e:
            said = _sources_named(str(e), written, tmp, out)
            said = said.replace(f"{out}: federation folder is invalid", "cannot import", 1)  # the user wrote no out
            if (given := plan.channels_from) is not None:  # the user never wrote that federation.yaml: name theirs
                said = re.sub(r"federation\.yaml says channels: (\d+)", lambda m: f"{given} lists {m[1]}", said)
            raise FederationError(said) from None
        move_in(tmp, out)  # out is empty (check_out) but for tmp
    for line in group_problems([notice.replace(str(tmp), str(out)) for notice in notices]):
        log.warning(line)
    # what the check found of each case (its image shape; a case without an annotated voxel), as check_folder's own
    found = {(s.name, c.id): {k: c.meta[k] for k in CHECKED if k in c.meta} for s in checked.sites for c in s.cases}
    final = load_folder(out)
    for written_site in final.sites:
        written_site.cases = [
            replace(c, meta={**c.meta, **found[(written_site.name, c.id)]}) for c in written_site.cases
        ]
    return final
