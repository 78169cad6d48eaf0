"""Writing the federation folder format (``fedseg.data.folder``): ``write_folder`` (exactly: reading it back gives
equal arrays and dtypes), the NIfTI and PNG writers other writers share, and the staging folder in which a write
that fails or is interrupted leaves no half federation (``staging_folder``, ``move_in``)."""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import sys
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from fedseg.atomic_files import naming_errors
from fedseg.data.federation import Federation, FederationError
from fedseg.data.folder import HEADER_FILE, SPLITS_FILE, write_header
from fedseg.data.metadata import CASES_FILE, cases_csv_table, site_metadata_for_yaml, write_cases_csv
from fedseg.data.splits import Splits, write_site_splits_csv
from fedseg.folder_lock import has_entries


def safe_name(name: str, what: str) -> str:
    if not name or name.startswith(".") or any(c in name for c in "/\\\0") or name != name.strip():
        raise FederationError(f"{what} {name!r}: not usable as a file name")
    return name


def write_nifti(path: Path, data: np.ndarray, affine: np.ndarray | None = None) -> None:
    """``data`` as stored (bool -> uint8) with ``affine`` (default identity)."""
    import nibabel as nib

    data = data.astype(np.uint8) if data.dtype == bool else data
    affine = np.eye(4) if affine is None else affine
    with naming_errors(path):
        nib.save(nib.Nifti1Image(np.ascontiguousarray(data), affine, dtype=data.dtype), path)


def write_nifti_like(path: Path, data: np.ndarray, like: Any) -> None:
    """``data`` as stored (bool -> uint8) on the grid of ``like`` (a nibabel NIfTI image) with its spatial header:
    its qform and sform with their codes, and its units. ``write_nifti`` would code the affine as an "aligned" sform
    without a qform, which viewers and registration tools may read differently from a scanner's qform."""
    import nibabel as nib

    data = np.ascontiguousarray(data.astype(np.uint8) if data.dtype == bool else data)
    header = like.header
    image = nib.Nifti1Image(data, None, dtype=data.dtype)
    image.set_qform(like.get_qform(), code=int(header["qform_code"]))
    image.set_sform(like.get_sform(), code=int(header["sform_code"]))
    image.header.set_xyzt_units(*header.get_xyzt_units())
    with naming_errors(path):
        nib.save(image, path)


def write_png(path: Path, data: np.ndarray) -> None:
    from PIL import Image

    with naming_errors(path):
        Image.fromarray(np.ascontiguousarray(data)).save(path)


def spacing_affine(spacing: tuple[float, ...] | None) -> np.ndarray | None:
    """The NIfTI affine ``diag(sx, sy, sz, 1)`` of a case's ``spacing`` (mm per axis), ``None`` without one."""
    return None if spacing is None else np.diag([*(float(s) for s in spacing), 1.0])


def write_case_image(folder: Path, cid: str, image: np.ndarray, kind: str, affine: np.ndarray | None = None) -> None:
    """PNG for 2D uint8 with 1 or 3 channels, NIfTI for 3D (``(C, X, Y, Z)`` -> ``(X, Y, Z[, C])``, with
    ``affine``, default identity), npy otherwise."""
    if kind == "3d":
        write_nifti(folder / f"{cid}.nii.gz", image[0] if image.shape[0] == 1 else np.moveaxis(image, 0, -1), affine)
    elif image.dtype == np.uint8 and image.shape[0] in (1, 3):
        write_png(folder / f"{cid}.png", image[0] if image.shape[0] == 1 else np.moveaxis(image, 0, -1))
    else:
        np.save(folder / f"{cid}.npy", image)


def write_case_label(folder: Path, cid: str, label: np.ndarray, kind: str, affine: np.ndarray | None = None) -> None:
    """PNG for 2D uint8, NIfTI for 3D (with ``affine``, default identity), npy otherwise."""
    if kind == "3d":
        write_nifti(folder / f"{cid}.nii.gz", label, affine)
    elif label.dtype == np.uint8:
        write_png(folder / f"{cid}.png", label)
    else:
        np.save(folder / f"{cid}.npy", label)


# A staging folder's name: ``.<purpose>-<pid of its writer>-<mkdtemp's 8 random characters>``.
_STAGING = re.compile(r"\.(?P<purpose>.+)-(?P<pid>[0-9]+)-[a-z0-9_]{8}")


class StagingInUse(FederationError):
    """A staging folder of the same kind is being written by a running process (its name holds that pid)."""


def new_staging(parent: Path, purpose: str) -> Path:
    """A new hidden folder ``parent/.<purpose>-<pid>-XXXXXXXX`` (mode 0700): this process's pid in its name lets a
    later command tell a folder left by a writer that was killed (SIGKILL, a power cut: no clean-up ran) from one
    being written now (:func:`clear_dead_staging`)."""
    return Path(tempfile.mkdtemp(prefix=f".{purpose}-{os.getpid()}-", dir=parent))


def clear_dead_staging(parent: Path, purpose: str, blocking: str | None = None, refuse: bool = True) -> list[Path]:
    """Remove the staging folders in ``parent`` (:func:`new_staging`) whose ``purpose`` fully matches the regular
    expression ``purpose`` and whose writer no longer runs (as ``fedseg.folder_lock`` takes over a lock its holder
    left: the holder is gone), one ``note:`` line on stderr each; the folders removed. Nothing else is touched: not
    a name of another form, not a link, not a folder of a process that runs. ``StagingInUse`` where a running
    process writes one whose purpose matches ``blocking`` (default ``purpose``; it will become what this command
    is to write), saying what to do; ``refuse`` False: such a folder is left alone without a word."""
    from fedseg.interrupts import is_running

    removed: list[Path] = []
    if not parent.is_dir() or parent.is_symlink():
        return removed
    for entry in sorted(parent.iterdir()):
        match = _STAGING.fullmatch(entry.name)
        if match is None or not re.fullmatch(purpose, match["purpose"]) or entry.is_symlink() or not entry.is_dir():
            continue
        pid = int(match["pid"])
        if pid == os.getpid() or is_running(pid):
            if refuse and re.fullmatch(blocking or purpose, match["purpose"]):
                raise StagingInUse(
                    f"{entry}: being written by a running process (pid {pid}): wait for that command to end or stop "
                    f"it, then run this again (if pid {pid} is no fedseg command, remove that folder yourself)"
                )
            continue
        shutil.rmtree(entry, ignore_errors=True)
        print(
            f"note: {entry}: removed, a staging folder left by an interrupted command (pid {pid}, no longer running)",
            file=sys.stderr,
        )
        removed.append(entry)
    return removed


@contextlib.contextmanager
def staging_folder(final: Path, purpose: str) -> Iterator[Path]:
    """A new hidden folder inside ``final`` (``.<purpose>-*``; ``final`` is created if needed) to write a federation
    into before :func:`move_in` puts it in place, so an interrupted or failed write (Ctrl-C, a full disk, a bad
    file) leaves no half federation: if the block raises, the folder is removed with its contents, and ``final``
    too if this created it and it is empty. Inside ``final``, not next to it: the same file system as ``final``
    (a mount point, a link to another disk) and no need to write to its parent."""
    created = not final.exists()
    final.mkdir(parents=True, exist_ok=True)
    clear_dead_staging(final, re.escape(purpose), refuse=False)  # dead ones only: the callers refuse a busy --out
    tmp = new_staging(final, purpose)
    try:
        yield tmp
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        if created:
            with contextlib.suppress(OSError):
                final.rmdir()
        raise


def move_in(written: Path, root: Path, replace: Sequence[Path] = ()) -> None:
    """Move the entries of ``written`` (a :func:`staging_folder` of ``root``) into ``root``, replacing the entries
    ``replace`` (an older federation's ``federation.yaml`` and site folders): those are first moved aside, so if a
    move fails (an entry of that name that is not replaced) or is interrupted, everything is put back as it was.
    Once all are moved, the entries replaced are removed through Ctrl-C and kill (acted on when they are gone), which
    would otherwise leave them half-removed beside the new ones."""
    from fedseg.interrupts import deferred_interrupts

    aside = Path(tempfile.mkdtemp(prefix=".replaced-", dir=root))
    moved_aside: list[Path] = []
    moved_in: list[Path] = []
    try:
        for entry in replace:
            entry.rename(aside / entry.name)
            moved_aside.append(entry)
        for entry in sorted(written.iterdir()):
            entry.rename(root / entry.name)
            moved_in.append(root / entry.name)
    except BaseException:
        for entry in moved_in:
            entry.rename(written / entry.name)
        for entry in moved_aside:
            (aside / entry.name).rename(entry)
        aside.rmdir()
        raise
    with deferred_interrupts():
        shutil.rmtree(aside)
        written.rmdir()


def new_site_folder(root: Path, site: str) -> Path:
    """Create ``root/<site>/images`` and ``root/<site>/labels``; returns ``root/<site>``."""
    site_dir = root / site
    (site_dir / "images").mkdir(parents=True)
    (site_dir / "labels").mkdir()
    return site_dir


def check_root(root: Path, overwrite: bool) -> None:
    """Refuse a non-empty ``root`` unless ``overwrite`` and it is a federation folder (``FederationError``)."""
    if root.is_dir():
        clear_dead_staging(root, "writing")  # left by a write killed before it could clean up
    if root.exists() and has_entries(root):
        if not overwrite:
            raise FederationError(
                f"{root}: exists and is not empty (replace it with --force; from Python, overwrite=True)"
            )
        if not (root / HEADER_FILE).is_file():
            raise FederationError(
                f"{root}: not empty and not a federation folder (no {HEADER_FILE}); refusing to overwrite"
            )


def _federation_entries(root: Path) -> list[Path]:
    """The federation in ``root`` that ``--force`` replaces: its ``federation.yaml`` and site folders (those with
    ``images/`` or ``labels/``); other files stay."""
    sites = [p for p in root.iterdir() if p.is_dir() and ((p / "images").is_dir() or (p / "labels").is_dir())]
    return [*sites, *([root / HEADER_FILE] if (root / HEADER_FILE).is_file() else [])]


def write_folder(fed: Federation, root: str | Path, splits: Splits | None = None, *, overwrite: bool = False) -> Path:
    """Write ``fed`` in the folder format; reading it back with ``load_folder`` gives equal arrays and dtypes.

    2D images: PNG when uint8 with 1 or 3 channels, else ``.npy`` ``(C, H, W)``; 2D labels: PNG
    when uint8, else ``.npy``; 3D images and labels: ``.nii.gz`` (affine ``diag(Case.spacing)``, identity for
    a case without spacing). Writes
    ``<site>/splits.csv`` from ``splits`` when given, else from each site's ``fixed_splits``.
    Metadata: ``Site.meta`` goes to ``federation.yaml`` ``sites:``, ``Case.metadata`` to
    ``<site>/cases.csv`` (values as strings; neither is written when there is none).
    Returns ``root``.
    """
    root = Path(root)
    for site in fed.sites:
        safe_name(site.name, "site")
        ids = [safe_name(c.id, f"site {site.name!r}: case") for c in site.cases]
        if len(set(ids)) != len(ids):
            dupes = sorted({i for i in ids if ids.count(i) > 1})
            raise FederationError(f"site {site.name!r}: duplicate case ids {dupes}")
        site_metadata_for_yaml(site)  # refuse metadata that cannot be written before touching root
        cases_csv_table(site)
    check_root(root, overwrite)
    with staging_folder(root, "writing") as tmp:
        write_header(tmp, fed)
        for site in fed.sites:
            site_dir = new_site_folder(tmp, site.name)
            for case in site.cases:
                image, label = case.arrays()
                affine = spacing_affine(case.spacing)
                write_case_image(site_dir / "images", case.id, np.asarray(image), fed.kind, affine)
                write_case_label(site_dir / "labels", case.id, np.asarray(label), fed.kind, affine)
            site_split = splits.get(site.name) if splits is not None else site.fixed_splits
            if site_split:
                write_site_splits_csv(site_dir / SPLITS_FILE, site_split)
            write_cases_csv(site_dir / CASES_FILE, site)
        move_in(tmp, root, replace=_federation_entries(root))
    return root
