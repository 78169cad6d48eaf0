"""``prostate-6site``: the multi-site prostate MRI collection (T2-weighted volumes of six sources, as used by
FedSM/SAML-style studies), one site per sub-folder.

Expected layout (``SRC`` holds one folder per site, e.g. ``BIDMC, BMC, HK, I2CVB, RUNMC, UCL``)::

    SRC/<SITE>/Case00.nii.gz                  image (X, Y, Z)
    SRC/<SITE>/Case00_segmentation.nii.gz     label map (``_Segmentation`` too: the suffix is case-insensitive)

What it writes: sites named after the folders; per case the image linked as is (NIfTI with its affine)
and the label converted to ``uint8`` ``label > 0`` (some sources mark the prostate with another value or
split it into zones) with the segmentation's affine; region ``prostate = [1]``.

Errors (collected, raised as one): no site folder, a site folder without cases, an image without its
segmentation or a segmentation without its image (each names the file and the expected partner).
"""

from __future__ import annotations

import functools
import re
from pathlib import Path

import numpy as np

from fedseg.data.case_files import split_name
from fedseg.data.federation import FederationError
from fedseg.data.importers.writer import (
    Plan,
    PlannedCase,
    Source,
    folder_sites,
    read_nifti,
    single_source,
)

SEGMENTATION = re.compile(r"^(?P<case>.+)_segmentation$", re.IGNORECASE)
NIFTI = ("nii.gz", "nii")


def binary_label(path: Path) -> tuple[np.ndarray, np.ndarray]:
    """A segmentation as ``(uint8 label > 0, its affine)``."""
    data, affine = read_nifti(path)
    return (np.asarray(data) > 0).astype(np.uint8), affine


def site_cases(site_dir: Path) -> tuple[list[PlannedCase], list[str]]:
    """The cases of one site folder and the problems found (unpaired files)."""
    images: dict[str, Path] = {}
    labels: dict[str, Path] = {}
    for path in sorted(site_dir.iterdir()):
        parsed = split_name(path.name, NIFTI) if path.is_file() and not path.name.startswith(".") else None
        if parsed is None:
            continue
        seg = SEGMENTATION.match(parsed[0])
        (labels if seg else images)[seg["case"] if seg else parsed[0]] = path
    problems = [
        f"{images[c]}: image without segmentation (expected {site_dir / f'{c}_segmentation.nii.gz'})"
        for c in sorted(set(images) - set(labels))
    ]
    problems += [
        f"{labels[c]}: segmentation without image (expected {site_dir / f'{c}.nii.gz'})"
        for c in sorted(set(labels) - set(images))
    ]
    cases = [
        PlannedCase(c, Source(images[c]), Source.nifti(labels[c], functools.partial(binary_label, labels[c])))
        for c in sorted(set(images) & set(labels))
    ]
    if not cases:
        problems.append(f"{site_dir}: no case (expected CaseNN.nii.gz with CaseNN_segmentation.nii.gz)")
    return cases, problems


def plan_prostate(sources: list[Path]) -> Plan:
    """Plan the import of ``sources == [SRC]`` in the multi-site prostate layout (see the module docstring)."""
    src = single_source(sources, "prostate-6site", "a folder with one sub-folder per site")
    site_dirs = [p for p in sorted(src.iterdir()) if p.is_dir() and not p.name.startswith(".")]
    if not site_dirs:
        raise FederationError(
            f"{src}: no site folders (expected {src}/<SITE>/CaseNN.nii.gz + CaseNN_segmentation.nii.gz)"
        )
    sites = folder_sites(site_dirs, site_cases)
    return Plan(src.name or "prostate", "3d", 1, {"prostate": [1]}, sites, {0: "background", 1: "prostate"})
