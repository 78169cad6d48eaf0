"""``fets2022``: the FeTS2022 challenge training data (BraTS2021 volumes with their institutions).

Expected layout (``SRC`` = the folder holding the subjects, e.g. ``MICCAI_FeTS2022_TrainingData``)::

    SRC/partitioning_1.csv            Partition_ID,Subject_ID   (23 real institutions)
    SRC/partitioning_2.csv            Partition_ID,Subject_ID   (33: the large institutions split further)
    SRC/FeTS2022_00000/FeTS2022_00000_t1.nii.gz
                       FeTS2022_00000_t1ce.nii.gz
                       FeTS2022_00000_t2.nii.gz
                       FeTS2022_00000_flair.nii.gz
                       FeTS2022_00000_seg.nii.gz     labels 0, 1 (necrotic core), 2 (edema), 4 (enhancing)

(``.nii`` is accepted as well as ``.nii.gz``.) A BraTS 2021 training folder (``BraTS2021_NNNNN/`` subjects, files
named alike) imports the same way with a partitioning CSV of its subjects: a folder the CSV names is a subject
whatever its prefix. What it writes: one site per partition ID of the chosen
partitioning, ``inst01``, ``inst02``... (zero-padded so they sort numerically; site-level metadata
``partition_id`` and ``partitioning``); per subject one case of that id whose image is a 4D NIfTI
``(X, Y, Z, 4)`` with the channels ``t1, t1ce, t2, flair`` (``MODALITIES``; ``federation.yaml``
``channel_names``), the common dtype of the four files and the t1's grid and spatial header (its qform and sform
with their codes; ``nnunet.channels_source``), and whose label is the ``_seg``
file as is (linked). Regions
``WT = [1, 2, 4]``, ``TC = [1, 4]``, ``ET = [4]``; a label value outside ``{0, 1, 2, 4}`` fails ``data check``.

Errors (all collected, then raised as one): a missing partitioning file or column, a partition ID that is
not an integer, a subject listed twice, a subject listed without a folder, a subject folder that the
partitioning does not list, a missing modality or segmentation file, a modality on another grid than the t1 (shape,
spacing, a flipped axis or origin, from the headers).
"""

from __future__ import annotations

from pathlib import Path

from fedseg.data import readers
from fedseg.data.csv_rows import read_csv_rows
from fedseg.data.federation import FederationError
from fedseg.data.importers.nnunet import channels_source
from fedseg.data.importers.writer import (
    Plan,
    PlannedCase,
    PlannedSite,
    Source,
    raise_problems,
    single_source,
)

MODALITIES = ("t1", "t1ce", "t2", "flair")
SEGMENTATION = "seg"
SUBJECT_PREFIX = "FeTS2022_"
PARTITIONINGS = (1, 2)
REGIONS = {"WT": [1, 2, 4], "TC": [1, 4], "ET": [4]}
LABEL_NAMES = {0: "background", 1: "necrotic core", 2: "edema", 4: "enhancing tumour"}
COLUMNS = ("Partition_ID", "Subject_ID")


def read_partitioning(path: Path) -> tuple[dict[str, int], list[str]]:
    """``partitioning_N.csv`` -> ``({subject id: partition id}, problems)``, one ``"<path>:<row>: ..."`` each."""
    table = read_csv_rows(path, f"a header {','.join(COLUMNS)}")
    missing = [c for c in COLUMNS if c not in table.header]
    if missing:
        raise FederationError(
            f"{path}:{table.header_line}: missing column {', '.join(map(repr, missing))} "
            f"(header is {','.join(table.header)}; expected {','.join(COLUMNS)})"
        )
    col_p, col_s = (table.header.index(c) for c in COLUMNS)
    partition: dict[str, int] = {}
    first: dict[str, int] = {}
    problems = []
    for cells, line in table.rows:
        pid = cells[col_p] if col_p < len(cells) else ""
        sid = cells[col_s] if col_s < len(cells) else ""
        if not sid:
            problems.append(f"{path}:{line}: empty Subject_ID")
        elif not pid.isdigit():
            problems.append(f"{path}:{line}: Partition_ID {pid!r} of {sid!r} is not a non-negative integer")
        elif sid in first:
            problems.append(f"{path}:{line}: subject {sid!r} listed twice (first on row {first[sid]})")
        else:
            partition[sid], first[sid] = int(pid), line
    return partition, problems


def modality_files(subject_dir: Path) -> tuple[dict[str, Path], list[str]]:
    """``{t1, t1ce, t2, flair, seg: path}`` of one subject folder and the problems (a missing file)."""
    sid = subject_dir.name
    files, problems = {}, []
    for part in (*MODALITIES, SEGMENTATION):
        found = [subject_dir / f"{sid}_{part}.{ext}" for ext in ("nii.gz", "nii")]
        found = [p for p in found if p.is_file()]
        if found:
            files[part] = found[0]
        else:
            expected = ", ".join(f"{sid}_{m}.nii.gz" for m in (*MODALITIES, SEGMENTATION))
            problems.append(f"{subject_dir / f'{sid}_{part}.nii.gz'}: missing (each subject folder holds {expected})")
    return files, problems


def plan_fets2022(sources: list[Path], partitioning: int = 1) -> Plan:
    """Plan the import of FeTS2022 training data ``sources == [SRC]`` with ``partitioning`` 1 or 2 (see the module)."""
    src = single_source(sources, "fets2022", "the FeTS2022 training data: FeTS2022_NNNNN/ folders, partitioning_N.csv")
    if partitioning not in PARTITIONINGS:
        raise FederationError(f"fets2022: --partitioning must be 1 or 2, got {partitioning}")
    csv_path = src / f"partitioning_{partitioning}.csv"
    if not csv_path.is_file():
        raise FederationError(
            f"{csv_path}: missing (FeTS2022 ships partitioning_1.csv and partitioning_2.csv, "
            f"columns {','.join(COLUMNS)}, next to the {SUBJECT_PREFIX}NNNNN folders)"
        )
    partition, problems = read_partitioning(csv_path)
    # FeTS2022_NNNNN folders, and any subject folder the CSV names (a BraTS 2021 BraTS2021_NNNNN/ layout, its
    # files named alike, with a partitioning CSV of its subjects)
    folders = {
        p.name: p
        for p in sorted(src.iterdir())
        if p.is_dir() and (p.name.startswith(SUBJECT_PREFIX) or p.name in partition)
    }
    for sid in sorted(set(folders) - set(partition)):
        problems.append(f"{folders[sid]}: subject {sid!r} is not in {csv_path} (every subject needs a Partition_ID)")
    for sid in sorted(set(partition) - set(folders)):
        problems.append(f"{csv_path}: subject {sid!r} has no folder {src / sid}")
    by_site: dict[int, list[PlannedCase]] = {}
    for sid in sorted(set(partition) & set(folders)):
        files, missing = modality_files(folders[sid])
        problems += missing
        if missing:
            continue
        modalities = tuple(files[m] for m in MODALITIES)
        if (off_grid := readers.channels_grid_problem(modalities)) is not None:
            problems.append(off_grid)
            continue
        image = channels_source(modalities, "3d")  # the t1's grid and header (qform, sform and their codes)
        by_site.setdefault(partition[sid], []).append(PlannedCase(sid, image, Source(files[SEGMENTATION])))
    raise_problems(problems)
    if not by_site:
        raise FederationError(f"{src}: no subjects found (expected {SUBJECT_PREFIX}NNNNN folders listed in {csv_path})")
    width = max(2, len(str(max(by_site))))
    sites = [
        PlannedSite(f"inst{pid:0{width}d}", cases, {"partition_id": pid, "partitioning": partitioning})
        for pid, cases in sorted(by_site.items())
    ]
    name = f"fets2022-partitioning{partitioning}"
    return Plan(name, "3d", len(MODALITIES), REGIONS, sites, LABEL_NAMES, channel_names=list(MODALITIES))
