"""Importers: a real multi-site dataset in its own layout -> a checked folder federation.

``import_dataset(layout, sources, out)`` (the CLI: ``fedseg data import LAYOUT SRC... --out ROOT``) plans
the import with the layout's module, then ``writer.write_plan`` writes it atomically and runs ``data
check``. One module per layout, each documenting what it expects and what it writes:

==================  ==============================================================  ======================
layout              expects                                                         sites
==================  ==============================================================  ======================
``fets2022``        ``FeTS2022_NNNNN/`` with ``_t1/_t1ce/_t2/_flair/_seg.nii.gz``,  one per partition ID
                    ``partitioning_1.csv`` / ``partitioning_2.csv``
``msd``             Decathlon task folders: ``dataset.json``, ``imagesTr/``,         one per task folder
                    ``labelsTr/``; nnU-Net v1 ``Task0XX_Name/`` (``<case>_XXXX``)
``prostate-6site``  ``<SITE>/CaseNN.nii.gz`` + ``CaseNN_segmentation.nii.gz``      one per sub-folder
``fundus``          ``images/`` + ``masks/`` (0 cup, 128 rim, 255 background)        one per source folder
``binary``          ``images/<id>`` + ``masks/<id>[_mask|_segmentation|...]``,       one per source folder
                    binary masks (0/255, 0/1, JPEG); one region ``--region``
``nnunet``          nnU-Net v2 ``DatasetNNN_Name/``: ``dataset.json``,               ``--site-by`` regex on
                    ``imagesTr/<case>_XXXX.<ext>``, ``labelsTr/``, [``imagesTs/``,  the case id, or a CSV
                    ``labelsTs/``, ``splits_final.json``]                           ``case,site``
==================  ==============================================================  ======================
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from fedseg.data.federation import Federation, FederationError
from fedseg.data.importers.binary import DEFAULT_REGION, plan_binary
from fedseg.data.importers.fets2022 import plan_fets2022
from fedseg.data.importers.fundus import plan_fundus
from fedseg.data.importers.msd import RegionMode, plan_msd
from fedseg.data.importers.nnunet import plan_nnunet
from fedseg.data.importers.prostate import plan_prostate
from fedseg.data.importers.writer import Plan, write_plan


@dataclass(frozen=True)
class ImportOptions:
    """Layout-specific options: ``partitioning`` (fets2022: 1 or 2), ``regions`` (msd: auto, nested, disjoint),
    ``site_by`` (nnunet: a regex on the case id or a ``case,site`` CSV), ``fold`` (nnunet: the fold of
    ``splits_final.json`` that gives train/val, default 0), ``splits`` (nnunet: that file, when it is neither in the
    dataset folder nor in ``$nnUNet_preprocessed/<dataset>/``), ``region`` (binary: the foreground region's name,
    default ``foreground``)."""

    partitioning: int | None = None
    regions: RegionMode | None = None
    site_by: str | None = None
    fold: int | None = None
    splits: Path | None = None
    region: str | None = None


LAYOUTS: dict[str, Callable[[list[Path], ImportOptions], Plan]] = {
    "fets2022": lambda sources, o: plan_fets2022(sources, 1 if o.partitioning is None else o.partitioning),
    "msd": lambda sources, o: plan_msd(sources, o.regions or "auto"),
    "prostate-6site": lambda sources, o: plan_prostate(sources),
    "fundus": lambda sources, o: plan_fundus(sources),
    "binary": lambda sources, o: plan_binary(sources, DEFAULT_REGION if o.region is None else o.region),
    "nnunet": lambda sources, o: plan_nnunet(sources, o.site_by, o.fold, o.splits),
}
OPTION_LAYOUTS = {
    "partitioning": "fets2022",
    "regions": "msd",
    "site_by": "nnunet",
    "fold": "nnunet",
    "splits": "nnunet",
    "region": "binary",
}  # which layout each option belongs to


def plan_import(layout: str, sources: list[Path], options: ImportOptions = ImportOptions()) -> Plan:
    """What ``layout`` finds in ``sources``; ``FederationError`` for an unknown layout, an option of another
    layout or anything malformed (naming the file and what was expected)."""
    if layout not in LAYOUTS:
        raise FederationError(f"unknown layout {layout!r}; layouts: {', '.join(LAYOUTS)}")
    for option, owner in OPTION_LAYOUTS.items():
        if getattr(options, option) is not None and layout != owner:
            raise FederationError(f"--{option.replace('_', '-')} applies to the {owner} layout only, not {layout}")
    return LAYOUTS[layout](sources, options)


def import_dataset(
    layout: str,
    sources: list[Path],
    out: str | Path,
    *,
    copy: bool = False,
    options: ImportOptions = ImportOptions(),
    notes: list[str] | None = None,
) -> Federation:
    """Import ``sources`` in ``layout`` as a folder federation at ``out`` (links, or copies with ``copy``),
    checked by ``data check``; returns it. Nothing is written at ``out`` on error. ``notes``, when given, receives
    a line per thing the import left out on purpose (e.g. nnU-Net test images without labels)."""
    from fedseg.data.importers.writer import check_out

    check_out(Path(out))  # before reading any source
    plan = plan_import(layout, sources, options)
    fed = write_plan(plan, out, copy=copy)
    if notes is not None:
        notes += plan.notes
    return fed
