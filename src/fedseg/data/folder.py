"""The on-disk federation format (``folder``): read it lazily, write it exactly.

::

    ROOT/federation.yaml                       name, kind (2d|3d), channels, regions, [label_names],
                                               [channel_names], [sites], [ignore_label]
    ROOT/<site>/images/<case>.<png|jpg|jpeg|npy|nii|nii.gz|nrrd|mha|mhd>, or images/<case>/ (a DICOM series)
    ROOT/<site>/labels/<case>.<png|npy|nii|nii.gz|nrrd|mha|mhd|dcm>      integer label map (.dcm: DICOM-SEG or
                                                                          RTSTRUCT)
    ROOT/<site>/splits.csv                     optional, header ``case,split``
    ROOT/<site>/cases.csv                      optional case-level metadata, header ``case,<any columns>``

``sites:`` in ``federation.yaml`` holds optional site-level metadata (``sites: {site1: {grade: LGG}}``);
see ``fedseg.data.metadata`` for both kinds of metadata. ``channel_names`` (optional) names what each image channel
holds, in channel order (``[T1, FLAIR]``: one non-empty name per channel): a trained bundle records it, and
``fedseg predict`` refuses nnU-Net images whose ``dataset.json`` orders the channels otherwise. Without it (older
folders, sources that do not say) the channels are known by their number only.
``ignore_label`` (optional; nnU-Net's ``ignore`` label, partial or sparse annotations): the label value of
unannotated voxels, a positive integer above every region's value and in no region. Training takes no loss from
those voxels and the metrics count only the others (``fedseg.data.federation.Regions``).

This module holds the federation as a whole: ``federation.yaml`` (``Header``, ``read_header``, ``write_header``),
scanning the site folders and pairing their files (``scan_folder``), grouping the problems found
(``group_problems``) and ``load_folder``. Reading one case's files, with the array conventions a case loader
follows: ``fedseg.data.case_files``; writing a federation folder (``write_folder``, its staging folder, the NIfTI
and PNG writers): ``fedseg.data.folder_write``.
"""

from __future__ import annotations

import functools
import os
import re
import shlex
import unicodedata
from collections import Counter
from collections.abc import Collection
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml

from fedseg.data import dicom_seg, dicom_series, folder_entries, readers
from fedseg.data.case_files import DCM_IMAGE_HINT, IMAGE_EXTS, LABEL_EXTS, load_case, split_name
from fedseg.data.csv_rows import normal_form
from fedseg.data.federation import Case, Federation, FederationError, Regions, Site, Split, ignore_problem
from fedseg.data.metadata import (
    CASES_FILE,
    GROUP,
    read_cases_csv,
    read_site_metadata,
    site_metadata_for_yaml,
    site_metadata_problems,
)
from fedseg.data.splits import group_split_problems, read_site_splits_csv
from fedseg.data.structured import read_yaml
from fedseg.wording import listed

HEADER_FILE = "federation.yaml"
SPLITS_FILE = "splits.csv"
HEADER_KEYS = (
    "name",
    "kind",
    "channels",
    "regions",
    "label_names",
    "channel_names",
    "sites",
    "site_order",
    "ignore_label",
)


# --- federation.yaml -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Header:
    """The contents of ``federation.yaml``."""

    name: str
    kind: Literal["2d", "3d"]
    channels: int
    regions: Regions
    label_names: dict[int, str] | None = None
    sites: dict[str, dict[str, object]] = field(default_factory=dict)  # site-level metadata, by site name
    channel_names: list[str] | None = None  # what each channel holds, in channel order; None: not said
    site_order: list[str] | None = None  # the sites' order (site indices, the order sums run in); None: by name
    # label value -> the other names it is given after its first (``label_names: {1: [tumor, GTV Tumour]}``: a
    # structure each hospital spells its own way), matched when RTSTRUCT ROIs and SEG segments are read; None: none
    label_synonyms: dict[int, tuple[str, ...]] | None = None


def _is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _header_problems(data: dict, site_names: Collection[str] | None = None) -> list[str]:
    """Problems of a parsed ``federation.yaml`` mapping, without the file name prefix."""
    problems = [f"missing key {k!r}" for k in HEADER_KEYS[:4] if k not in data]
    problems += [f"unknown key {k!r} (allowed: {', '.join(HEADER_KEYS)})" for k in data if k not in HEADER_KEYS]
    if "name" in data and not (isinstance(data["name"], str) and data["name"].strip()):
        problems.append(f"name: expected a non-empty string, got {data['name']!r}")
    if "kind" in data and data["kind"] not in ("2d", "3d"):
        problems.append(f"kind: expected 2d or 3d, got {data['kind']!r}")
    if "channels" in data and not (_is_int(data["channels"]) and data["channels"] > 0):
        problems.append(f"channels: expected a positive integer, got {data['channels']!r}")
    if "regions" in data:
        regions = data["regions"]
        if not isinstance(regions, dict):
            problems.append(f"regions: expected a mapping region name -> list of label values, got {regions!r}")
        elif not regions:
            problems.append("regions: empty; at least one region is required")
        else:
            for name, vals in regions.items():
                if not isinstance(vals, list) or not vals or not all(_is_int(v) and v > 0 for v in vals):
                    problems.append(
                        f"regions.{name}: expected a non-empty list of positive integer label values, got {vals!r}"
                    )
    if data.get("ignore_label") is not None:
        regions = data.get("regions")
        lists = regions.values() if isinstance(regions, dict) else []
        used = {int(x) for v in lists if isinstance(v, list) for x in v if _is_int(x)}
        if problem := ignore_problem(data["ignore_label"], used):
            problems.append(f"ignore_label: {problem}")
    names = data.get("label_names")
    if names is not None:
        problems += label_names_problems(names)
    if data.get("channel_names") is not None:
        problems += channel_names_problems(data["channel_names"], data.get("channels"))
    if data.get("sites") is not None:
        problems += site_metadata_problems(data["sites"], site_names)
    if data.get("site_order") is not None:
        problems += site_order_problems(data["site_order"], site_names)
    return problems


def label_names_problems(names: Any) -> list[str]:
    """``label_names`` that is not a mapping label value (integer >= 0) -> a name, or -> a list of names (the first
    the label's name, the others the names other sites give the same structure: ``{1: [tumor, GTV Tumour]}``): one
    line per problem. A list must hold one or more non-empty strings, and none of its names (compared as structure
    names are: ``dicom_seg.normalized_name``) may be a name of another value; the single-name form is checked as it
    always was (two values named alike are left to the readers, which say so where a structure names both)."""
    if not isinstance(names, dict) or not all(
        _is_int(k) and k >= 0 and isinstance(v, (str, list)) for k, v in names.items()
    ):
        return [
            f"label_names: expected a mapping label value (integer >= 0) -> name (or a list of names, the first the "
            f"label's), got {names!r}"
        ]
    problems = []
    for value, entry in names.items():
        if isinstance(entry, list) and not entry:
            problems.append(f"label_names {value}: an empty list; give the label's name (then any other names for it)")
        elif isinstance(entry, list) and not all(isinstance(n, str) and n.strip() for n in entry):
            bad = next(n for n in entry if not (isinstance(n, str) and n.strip()))
            problems.append(
                f"label_names {value}: {bad!r} in {entry!r} is not a name; list the names as non-empty strings"
            )
    if not any(isinstance(entry, list) for entry in names.values()):
        return problems
    owner: dict[str, tuple[int, str]] = {}  # a name as compared -> the first value listing it, as it spells it
    for value, entry in names.items():
        for name in [entry] if isinstance(entry, str) else [n for n in entry if isinstance(n, str)]:
            first, spelled = owner.setdefault(dicom_seg.normalized_name(name), (value, name))
            if first != value:
                problems.append(
                    f"label_names {value}: {name!r} is also a name of label {first} ({spelled!r}; names compare "
                    "case-insensitively, `_` and `-` as spaces); a name may name one label value only"
                )
    return list(dict.fromkeys(problems))


def label_names_read(names: dict | None) -> tuple[dict[int, str] | None, dict[int, tuple[str, ...]] | None]:
    """``(label_names, label_synonyms)`` of a valid ``label_names`` mapping (``label_names_problems``): each value's
    name (a list's first) and, for values listed with more names, the others in the order given (``None`` where
    no value has more: the single-name form reads as it always did)."""
    if not names:
        return None, None
    first = {int(k): v if isinstance(v, str) else v[0] for k, v in names.items()}
    others = {int(k): tuple(v[1:]) for k, v in names.items() if isinstance(v, list) and len(v) > 1}
    return first, others or None


def site_order_problems(order: Any, site_names: Collection[str] | None = None) -> list[str]:
    """``site_order`` that is not a list of distinct site names, or (``site_names``: the site folders, all of
    them) does not list each of them once: one line saying what is wrong."""
    if not isinstance(order, list) or not all(isinstance(n, str) and n.strip() for n in order):
        shown = repr(order) if len(repr(order)) <= 200 else repr(order)[:200] + "..."
        return [f"site_order: expected a list of the site names, e.g. [site1, site2, site10], got {shown}"]
    if twice := sorted(n for n, count in Counter(order).items() if count > 1):
        return [f"site_order: lists {_named(twice)} twice; list every site once"]
    if site_names is None:
        return []
    listed, folders = set(order), set(site_names)
    missing, unknown = [n for n in site_names if n not in listed], [n for n in order if n not in folders]
    if unknown:
        return [f"site_order: names {_named(unknown)}, which has no site folder here; list the site folders"]
    if missing:
        return [f"site_order: leaves out {_named(missing)}; list every site folder once (or drop site_order)"]
    return []


def _named(found: list[str], shown: int = 5) -> str:
    """Site names as a message lists them: quoted (a name's control characters escaped), the first ``shown``."""
    return listed(map(repr, found), shown)


def ordered_site_names(names: Collection[str], header: Header) -> list[str]:
    """``names`` in the federation's order: ``federation.yaml``'s ``site_order`` where it has one (written for a
    federation whose order is not its names' sort order, e.g. the built-in ``site1``...``site11``, so that a run on
    its folder or on Flower sums and seeds the sites as the built-in one does), else sorted by name; a name it does
    not list after those it does."""
    if header.site_order is None:
        return sorted(names)
    position = {name: i for i, name in enumerate(header.site_order)}
    return sorted(names, key=lambda n: (position.get(n, len(position)), n))


def channel_names_problems(names: Any, channels: Any) -> list[str]:
    """``channel_names`` that is not a list of ``channels`` non-empty strings (one per channel, in channel order; two
    may be equal, as an nnU-Net dataset's ``noNorm, noNorm``): one line saying what was expected and what was found;
    the count is checked only against a valid ``channels``."""
    count = channels if _is_int(channels) and channels > 0 else None
    expected = f"a list of {count if count else 'the'} channel names, one per channel in channel order"
    if not isinstance(names, list) or not all(isinstance(n, str) and n.strip() for n in names):
        return [f"channel_names: expected {expected} (e.g. [T1, FLAIR]), got {names!r}"]
    if count is not None and len(names) != count:
        return [f"channel_names: lists {len(names)} names ({', '.join(names)}) but channels is {count}"]
    return []


def read_header(root: str | Path, site_names: Collection[str] | None = None) -> Header:
    """Read and validate ``ROOT/federation.yaml``; raises ``FederationError`` listing every problem.

    With ``site_names`` (the site folders found), ``sites:`` may only name those sites.
    """
    path = Path(root) / HEADER_FILE
    data = read_yaml(
        path, f"every federation folder needs a {HEADER_FILE}", f"a mapping with keys {', '.join(HEADER_KEYS)}"
    )
    problems = _header_problems(data, site_names)
    if problems:
        raise FederationError("\n".join(f"{path}: {p}" for p in problems))
    label_names, label_synonyms = label_names_read(data.get("label_names"))
    return Header(
        name=data["name"],
        kind=data["kind"],
        channels=data["channels"],
        regions=Regions.from_mapping(data["regions"], data.get("ignore_label")),
        label_names=label_names,
        label_synonyms=label_synonyms,
        sites=read_site_metadata(data.get("sites")),
        channel_names=list(data["channel_names"]) if data.get("channel_names") is not None else None,
        site_order=list(data["site_order"]) if data.get("site_order") is not None else None,
    )


def write_header(root: Path, fed: Federation) -> None:
    """``ROOT/federation.yaml`` of ``fed``; ``channel_names`` written when known (checked as ``read_header`` checks
    it: ``FederationError`` before anything is written)."""
    data: dict[str, Any] = {
        "name": fed.name,
        "kind": fed.kind,
        "channels": int(fed.channels),
        "regions": fed.regions.as_dict(),
    }
    if fed.regions.ignore is not None:
        data["ignore_label"] = int(fed.regions.ignore)
    if fed.label_names:
        others = fed.label_synonyms or {}
        data["label_names"] = {
            int(k): [str(v), *map(str, others[k])] if others.get(k) else str(v) for k, v in fed.label_names.items()
        }
    if fed.channel_names is not None:
        names = list(fed.channel_names)
        if problems := channel_names_problems(names, int(fed.channels)):
            raise FederationError(f"federation {fed.name!r}: {problems[0]}")
        data["channel_names"] = [str(n) for n in names]
    sites = {site.name: site_metadata_for_yaml(site) for site in fed.sites if site.meta}
    if sites:
        data["sites"] = sites
    if (order := fed.site_names) != sorted(order):  # read back by name otherwise: site10 before site2
        data["site_order"] = order
    (root / HEADER_FILE).write_text(yaml.safe_dump(data, sort_keys=False, default_flow_style=None), encoding="utf-8")


# --- scanning sites --------------------------------------------------------------------------------


@dataclass
class SiteFiles:
    """One site folder's paired files: ``cases`` maps case id -> (image path, label path), sorted by id;
    ``case_meta``: the case-level metadata read from ``cases_csv`` (case id -> column -> value)."""

    name: str
    dir: Path
    cases: dict[str, tuple[Path, Path]] = field(default_factory=dict)
    splits_csv: Path | None = None
    cases_csv: Path | None = None
    case_meta: dict[str, dict[str, str]] = field(default_factory=dict)


def _list_files(
    folder: Path, exts: tuple[str, ...], what: str, problems: list[str]
) -> tuple[dict[str, Path], set[str]]:
    """Case id -> file in ``folder`` (hidden files and OS junk such as ``Thumbs.db`` ignored:
    ``folder_entries.ignored_entry``); returns ``(files, ids said already)`` and appends problems. The ids said
    already are those of several files (duplicates) and of series folders that are no DICOM series: their partners
    are not "without image" too.

    In ``images/``, a sub-folder is a DICOM series whose case id is the folder's name; the data files
    of ``.mhd`` headers are part of their header (``readers.mhd_data_files``)."""
    if not folder.is_dir():
        what = "is a file, not a folder" if os.path.lexists(folder) else "missing"
        problems.append(f"{folder}: {what} (a site holds an images/ and a labels/ folder)")
        return {}, set()
    found: dict[str, list[Path]] = {}
    unreadable: set[str] = set()  # series folders said to be no series: the case is there, its label has an image
    companions = readers.mhd_data_files(folder)
    for path in sorted(folder.iterdir()):
        if folder_entries.ignored_entry(path.name) or (path.name in companions and path.is_file()):
            continue
        if path.is_dir() and what == "image":
            problem = dicom_series.series_folder_problem(path)
            if problem is not None:
                problems.append(problem)
                unreadable.add(path.name)
            else:
                found.setdefault(path.name, []).append(path)
            continue
        if not path.is_file() and not path.is_dir():
            problems.append(f"{path}: neither a file nor a folder (a broken symbolic link or a link loop)")
            continue
        parsed = split_name(path.name, exts) if path.is_file() else None
        if parsed is None:
            hint = f"; {DCM_IMAGE_HINT}" if path.name.lower().endswith(".dcm") else ""
            problems.append(
                f"{path}: unsupported {what} file (expected a file ending in {', '.join('.' + e for e in exts)}){hint}"
            )
            continue
        found.setdefault(parsed[0], []).append(path)
    ambiguous = {cid for cid, paths in found.items() if len(paths) > 1}
    for cid in sorted(ambiguous):
        problems.append(f"{folder}: duplicate case id {cid!r} ({', '.join(p.name for p in found[cid])})")
    return {cid: paths[0] for cid, paths in found.items() if cid not in ambiguous}, ambiguous | unreadable


def _normalisation_pairs(images: dict[str, Path], labels: dict[str, Path]) -> dict[str, str]:
    """Image id -> label id for the unpaired cases whose ids differ only in Unicode normalisation (``José`` as ``e`` +
    combining accent, NFD as macOS writes names, beside ``é``, NFC as typed on Linux or Windows): each pair one
    image and one label that would pair if spelt alike."""
    by_form: dict[str, tuple[list[str], list[str]]] = {}
    for ids, side in ((set(images) - set(labels), 0), (set(labels) - set(images), 1)):
        for cid in ids:
            by_form.setdefault(unicodedata.normalize("NFC", cid), ([], []))[side].append(cid)
    return {found[0][0]: found[1][0] for found in by_form.values() if len(found[0]) == 1 and len(found[1]) == 1}


def _normalisation_problem(site_dir: Path, image: Path, label: Path) -> str:
    """One line for an image and a label whose names differ only in Unicode normalisation (``_normalisation_pairs``).

    Reported rather than paired: the case id is also the key of ``splits.csv``, ``cases.csv`` and of what a run and
    ``fedseg predict`` write, and on Linux both spellings can name two different files, so which one is the case is
    for the data manager to say by renaming, not for the reader to guess."""
    return (
        f"{site_dir}: images/{image.name} ({normal_form(image.name)}) and labels/{label.name} "
        f"({normal_form(label.name)}) differ only in Unicode normalisation (names copied from a Mac?), so they do not "
        f"pair; rename one to the other's spelling, e.g. all to NFC: convmv -r -f utf8 -t utf8 --nfc --notest "
        f"{shlex.quote(str(site_dir))}"
    )


def scan_site(site_dir: Path) -> tuple[SiteFiles, list[str]]:
    """Pair ``images/`` and ``labels/`` of one site folder by case id; returns the pairs and every problem found
    (a folder with neither: one line saying it is not a site, e.g. a ``notes/`` folder beside the sites)."""
    problems: list[str] = []
    if not (site_dir / "images").exists() and not (site_dir / "labels").exists():
        problems.append(
            f"{site_dir}: not a site folder (no images/ and no labels/); every folder of a federation is a site: move "
            "it out, or hide it with a name starting with '.'"
        )
        return SiteFiles(site_dir.name, site_dir), problems
    images, bad_images = _list_files(site_dir / "images", IMAGE_EXTS, "image", problems)
    labels, bad_labels = _list_files(site_dir / "labels", LABEL_EXTS, "label", problems)
    renamed = _normalisation_pairs(images, labels)
    problems += [_normalisation_problem(site_dir, images[i], labels[lb]) for i, lb in sorted(renamed.items())]
    # said once for the pair: neither is also "without" its partner
    bad_images, bad_labels = bad_images | set(renamed.values()), bad_labels | set(renamed)
    for files, other, what, bad in ((images, labels, "image", bad_labels), (labels, images, "label", bad_images)):
        if not other and not bad and files:  # one line for the empty (or missing: said) folder, not one per file
            folder = "labels" if what == "image" else "images"
            if (site_dir / folder).is_dir():
                problems.append(
                    f"{site_dir / folder}: no {folder[:-1]} files, for the {len(files)} {what}s of the site"
                )
            continue
        for cid in sorted(set(files) - set(other) - bad):
            exts = "|".join(LABEL_EXTS if what == "image" else IMAGE_EXTS)
            partner = "label" if what == "image" else "image"
            problems.append(f"{files[cid]}: {what} without {partner} (no {partner}s/{cid}.<{exts}>)")
    cases = {cid: (images[cid], labels[cid]) for cid in sorted(set(images) & set(labels))}
    if not cases and images and labels and not renamed:
        problems.append(f"{site_dir}: empty site (no case with both an image and a label)")
    elif not cases and not images and not labels:
        problems.append(f"{site_dir}: empty site (no image and no label files)")
    splits_csv = _site_file(site_dir / SPLITS_FILE, "the site's fixed splits, header case,split", problems)
    cases_csv = _site_file(site_dir / CASES_FILE, "the site's case metadata, header case,<columns>", problems)
    return SiteFiles(site_dir.name, site_dir, cases, splits_csv, cases_csv), problems


def _site_file(path: Path, holds: str, problems: list[str]) -> Path | None:
    """``path``, an optional file of a site (``splits.csv``, ``cases.csv``; ``holds``: what it holds), if it is
    one; else None, with a problem when something else bears its name (a folder, a broken link): ignoring it would
    pass a folder whose splits or metadata are silently not there."""
    if path.is_file():
        return path
    if os.path.lexists(path):
        what = "a folder" if path.is_dir() else "neither a file nor a folder (a broken symbolic link or a link loop)"
        problems.append(f"{path}: is {what}, not a file ({holds})")
    return None


def scan_sites(root: str | Path) -> tuple[list[SiteFiles], list[str]]:
    """Scan every site sub-folder of ``root`` (sorted by name, hidden folders ignored). The sites' paths are
    absolute (``root`` made absolute, links kept): cases are read in threads, and a relative path opened while
    another thread changes the working directory (ITK's module loading does: ``readers.load_itk``) would miss."""
    root = Path(root).absolute()
    if not root.is_dir():
        return [], [f"{root}: not a folder"]
    sites, problems = [], []
    # a folder named federation.yaml is no site: read_header names it
    for site_dir in sorted(
        p for p in root.iterdir() if p.is_dir() and not p.name.startswith(".") and p.name != HEADER_FILE
    ):
        site, site_problems = scan_site(site_dir)
        sites.append(site)
        problems += site_problems
    if not sites:
        problems.append(f"{root}: no site folders (expected ROOT/<site>/images and ROOT/<site>/labels)")
    return sites, problems


def build_federation(
    header: Header,
    sites: list[SiteFiles],
    fixed_splits: dict[str, dict[str, Split]],
    meta: dict[tuple[str, str], dict[str, Any]] | None = None,
) -> Federation:
    """Federation with lazy cases: each ``Case.loader`` is a picklable ``load_case`` partial.

    ``Case.meta`` holds ``image`` and ``label`` (file paths as strings), the case's ``cases.csv``
    columns (``site.case_meta``) and ``meta[(site, case)]``; ``Site.meta`` is the header's
    ``sites:`` entry.
    """
    meta = meta or {}
    order = ordered_site_names([s.name for s in sites], header)
    sites = sorted(sites, key=lambda s: order.index(s.name))

    def case(site: SiteFiles, cid: str, image: Path, label: Path) -> Case:
        synonyms = {"label_synonyms": header.label_synonyms} if header.label_synonyms else {}  # else as before
        loader = functools.partial(
            load_case, image, label, header.kind, header.channels, header.label_names, header.regions, **synonyms
        )
        files = {"image": str(image), "label": str(label)}
        return Case(cid, loader, {**files, **site.case_meta.get(cid, {}), **meta.get((site.name, cid), {})})

    return Federation(
        name=header.name,
        kind=header.kind,
        channels=header.channels,
        regions=header.regions,
        sites=[
            Site(
                s.name,
                [case(s, cid, *paths) for cid, paths in s.cases.items()],
                fixed_splits.get(s.name),
                dict(header.sites.get(s.name, {})),
            )
            for s in sites
        ],
        label_names=header.label_names,
        channel_names=None if header.channel_names is None else list(header.channel_names),
        label_synonyms=header.label_synonyms,
    )


def scan_folder(
    root: str | Path, *, all_sites: bool = True
) -> tuple[Header | None, list[SiteFiles], dict[str, dict[str, Split]], list[str]]:
    """Read ``federation.yaml``, pair every site's files and read the sites' ``splits.csv`` and ``cases.csv``.

    Returns ``(header or None if invalid, sites, fixed splits per site, problems)``; a site whose
    ``splits.csv`` is invalid gets no fixed splits, one whose ``cases.csv`` is invalid no case
    metadata (``SiteFiles.case_meta``). A ``splits.csv`` that puts the cases of one ``group``
    (``cases.csv``) in different splits is a problem. No image or label is read.

    ``all_sites``: the folder holds every site of the federation, so ``federation.yaml``'s
    ``sites:`` may only name site folders found here; ``False`` for a folder with only some of
    them (a hospital's copy in a Flower deployment: the coordinator's ``federation.yaml`` and
    its own site folder).
    """
    root = Path(root)
    sites, problems = scan_sites(root)
    try:
        header = read_header(root, [s.name for s in sites] if sites and all_sites else None)
    except FederationError as e:
        header, problems = None, str(e).splitlines() + problems
    fixed: dict[str, dict[str, Split]] = {}
    for site in sites:
        if site.splits_csv is not None:
            try:
                fixed[site.name] = read_site_splits_csv(site.splits_csv, site.cases)
            except FederationError as e:
                problems += str(e).splitlines()
        if site.cases_csv is not None:
            try:
                site.case_meta = read_cases_csv(site.cases_csv, site.cases)
            except FederationError as e:
                problems += str(e).splitlines()
        if site.splits_csv is not None and site.name in fixed and site.case_meta:
            groups = {cid: cols[GROUP] for cid, cols in site.case_meta.items() if cols.get(GROUP)}
            problems += [f"{site.splits_csv}: {p}" for p in group_split_problems(fixed[site.name], groups)]
    return header, sites, fixed, problems


SHOWN_PER_KIND = 3


def _problem_kind(line: str) -> str:
    """What a problem line says once its location is removed: the text after the leading
    ``"<path>: "`` / ``"<path>:<line>: "`` / ``"site '<name>': "``, with path-like words
    (anything containing ``/``), quoted names (case ids) and numbers blanked, so the same check
    failing on many files gives the same kind."""
    _, sep, rest = line.partition(": ")
    text = rest if sep else line
    text = re.sub(r"\S*[/\\]\S*", "<path>", text)
    text = re.sub(r"'[^']*'", "'…'", text)
    return re.sub(r"\d+", "#", text)


def group_problems(problems: list[str], shown: int = SHOWN_PER_KIND) -> list[str]:
    """``problems`` grouped by kind (see ``_problem_kind``), in order of first appearance: the first
    ``shown`` lines of each kind in full, then ``"... and N more like this"`` if there are more.

    A wrong ``federation.yaml`` (``kind: 3d`` for PNGs, the wrong ``channels``) fails every case
    the same way; this keeps the message to a few lines that still name the first files.
    """
    groups: dict[str, list[str]] = {}
    for line in problems:
        groups.setdefault(_problem_kind(line), []).append(line)
    out: list[str] = []
    for lines in groups.values():
        out += lines[:shown]
        if len(lines) > shown:
            out.append(f"... and {len(lines) - shown} more like this")
    return out


def problems_text(header: str, problems: list[str]) -> str:
    """One message for ``problems`` found in one place: ``header: the problem`` for one (one line), else ``header
    (N problems):`` and the problems (:func:`group_problems`), one indented line each."""
    if len(problems) == 1:
        return f"{header}: {problems[0]}"
    return f"{header} ({len(problems)} problems):\n" + "\n".join(f"  {p}" for p in group_problems(problems))


def root_problem(root: Path) -> str | None:
    """The one line a federation folder ``root`` is refused with before anything in it is read: it does not exist or
    is a file, or it is a raw dataset to import first (:func:`raw_dataset_problem`); else None. A few file look-ups:
    ``fedseg run --data`` says it before torch is imported (``fedseg.path_checks``), ``check_folder`` says it too."""
    if not root.is_dir():
        what = "does not exist" if not root.exists() else "is a file"
        hint = f" (give the folder that holds it: {root.parent})" if root.name == HEADER_FILE else ""
        return f"{root}: {what}; a federation is a folder with {HEADER_FILE} and a folder per site{hint}"
    return raw_dataset_problem(root)


def raw_dataset_problem(root: Path) -> str | None:
    """One line for a raw nnU-Net v2 dataset, or Medical Segmentation Decathlon or nnU-Net v1 task (``dataset.json``
    and ``imagesTr/``, no ``federation.yaml``) given where a federation folder is expected: which import makes one of
    it (a folder of 2D ``images/`` + ``masks/`` collections: ``binary``, :func:`_mask_collections_problem`); else
    None."""
    if (root / HEADER_FILE).exists():
        return None
    if not ((root / "dataset.json").is_file() and (root / "imagesTr").is_dir()):
        return _mask_collections_problem(root) or _msd_tasks_problem(root) or _site_folder_problem(root)
    import json

    try:
        keys = json.loads((root / "dataset.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        keys = {}
    msd = isinstance(keys, dict) and "channel_names" not in keys and ("modality" in keys or "training" in keys)
    what = "Medical Segmentation Decathlon (or nnU-Net v1) task" if msd else "nnU-Net v2 dataset"
    command = "msd" if msd else "nnunet"
    site_by = "" if msd else " --site-by REGEX"
    return (
        f"{root}: a raw {what} (dataset.json, imagesTr/), not a federation folder (no {HEADER_FILE}); import it "
        f"first: fedseg data import {command} {shlex.quote(str(root))}{site_by} --out FED, then use FED"
    )


def _mask_collections_problem(root: Path) -> str | None:
    """One line for ``root`` holding ``images/`` + ``masks/`` (one collection) or sub-folders that do (one per site),
    with no ``federation.yaml``: import it with the ``binary`` layout (``fundus`` for 0/128/255 optic disc/cup
    masks); else None."""

    def collection(folder: Path) -> bool:
        return (folder / "images").is_dir() and (folder / "masks").is_dir()

    if collection(root):
        sites = [root]
    elif not (sites := sorted(p for p in root.iterdir() if p.is_dir() and collection(p)) if root.is_dir() else []):
        return None
    what = "an images/ + masks/ collection" if sites == [root] else f"{len(sites)} images/ + masks/ collections"
    return (
        f"{root}: {what}, not a federation folder (no {HEADER_FILE}); import it first, one site per collection: "
        f"fedseg data import binary {' '.join(shlex.quote(str(p)) for p in sites)} --out FED (masks 0/128/255 of "
        "optic disc and cup: fundus), then use FED"
    )


def _is_site(folder: Path) -> bool:
    return (folder / "images").is_dir() and (folder / "labels").is_dir()


def _site_folder_problem(root: Path) -> str | None:
    """One line for one site's folder (``images/`` and ``labels/`` inside, no ``federation.yaml``), or a site's
    ``images/`` or ``labels/`` folder, given where the federation folder is expected: give the federation root
    (named when a folder above holds ``federation.yaml``), not a line per sub-folder that is no site; else None."""
    if _is_site(root):
        what, give, federation = "a site folder (it holds images/ and labels/)", "its parent", root.parent
    elif root.name in ("images", "labels") and _is_site(root.parent):
        what, give, federation = f"a site's {root.name} folder", "the folder above its site", root.parent.parent
    else:
        return None
    where = (
        f": {federation}"
        if (federation / HEADER_FILE).is_file()
        else f" ({federation} has no {HEADER_FILE} either: a federation root holds it and one folder per site)"
    )
    return f"{root}: {what}, not a federation folder (no {HEADER_FILE}); give {give}, the federation root{where}"


def _msd_tasks_problem(root: Path) -> str | None:
    """One line for ``root`` holding several raw task folders (``dataset.json`` + ``imagesTr/`` each: MSD or nnU-Net
    v1 tasks, one per institution) and no ``federation.yaml``: import them with the ``msd`` layout, one site per task;
    else None."""
    tasks = (
        sorted(p for p in root.iterdir() if p.is_dir() and (p / "dataset.json").is_file() and (p / "imagesTr").is_dir())
        if root.is_dir()
        else []
    )
    if not tasks:
        return None
    v2 = [task for task in tasks if _nnunet_v2(task)]
    msd = [task for task in tasks if task not in v2]
    commands = [
        f"fedseg data import {layout} {' '.join(shlex.quote(str(p)) for p in group)} --out FED"
        for layout, group in (("nnunet", v2), ("msd", msd))
        if group
    ]
    which = "" if len(commands) == 1 else " (nnU-Net v2 datasets and Decathlon tasks are imported apart)"
    return (
        f"{root}: {len(tasks)} raw task folder(s) (dataset.json, imagesTr/), not a federation folder (no "
        f"{HEADER_FILE}); import them first, one site per task{which}: {'; '.join(commands)}, then use FED"
    )


def _nnunet_v2(task: Path) -> bool:
    """Whether the raw task folder ``task``'s ``dataset.json`` is nnU-Net v2's (``channel_names``), not a Decathlon
    or nnU-Net v1 one (``modality``), as :func:`raw_dataset_problem` tells them apart."""
    import json

    try:
        keys = json.loads((task / "dataset.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(keys, dict) and "channel_names" in keys


def _link_target(link: Path) -> Path:
    """Where symbolic link ``link`` points, as an absolute path (not resolved further)."""
    target = Path(os.readlink(link))
    return target if target.is_absolute() else link.parent / target


def _first_missing(path: Path) -> Path:
    """The outermost part of ``path`` that does not exist: the folder that moved, or the file itself."""
    return next(p for p in [*reversed(path.parents), path] if not os.path.lexists(p))


def moved_links_problem(root: Path) -> str | None:
    """One line for the files of the federation ``root`` that link to files which no longer exist (a linked import,
    ``fedseg data import`` without ``--copy``, whose source dataset was moved or deleted): how many, where they
    pointed and what to do; else None. Said once, instead of a line per link and the lines that follow from them
    (images without labels, empty sites, cases ``splits.csv`` no longer finds). A link loop is not counted (the site
    scan names it)."""
    if not root.is_dir():
        return None
    dangling = [
        entry
        for site in sorted(root.iterdir())
        if site.is_dir() and not site.name.startswith(".")
        for folder in (site / "images", site / "labels")
        if folder.is_dir()
        for entry in sorted(folder.iterdir())
        if entry.is_symlink() and not os.path.lexists(_link_target(entry))
    ]
    if not dangling:
        return None
    places = list(dict.fromkeys(_first_missing(_link_target(link)) for link in dangling))
    shown = listed(map(str, places), 3)
    files = f"{len(dangling)} file{'s' if len(dangling) > 1 else ''}"
    example = f"{dangling[0].relative_to(root)} -> {_link_target(dangling[0])}"
    return (
        f"{files} of {root} link to {shown}, which no longer exist{'s' if len(places) == 1 else ''} (e.g. {example}); "
        "the raw data moved? import it again, or restore it where it was"
    )


def load_folder(root: str | Path, *, all_sites: bool = True) -> Federation:
    """Read a federation folder lazily (only file names, ``federation.yaml``, ``splits.csv``,
    ``cases.csv``, ``.mhd`` headers and the first bytes of one file per DICOM series folder are read).

    Raises ``FederationError`` listing every structural problem (pairing, duplicates, empty
    sites, bad ``federation.yaml``, ``splits.csv`` or ``cases.csv``), or one line for links whose source moved
    (``moved_links_problem``). Array contents are validated
    when a case is loaded, or all at once by ``fedseg.data.check.check_folder``. ``all_sites``: see
    ``scan_folder``.
    """
    for problem in (raw_dataset_problem(Path(root)), moved_links_problem(Path(root))):
        if problem is not None:
            raise FederationError(problem)
    header, sites, fixed, problems = scan_folder(root, all_sites=all_sites)
    if problems:
        raise FederationError("\n".join(group_problems(problems)))
    assert header is not None  # scan_folder reports a problem whenever federation.yaml is invalid
    load_itk_for(sites)
    return build_federation(header, sites, fixed)


def load_itk_for(sites: list[SiteFiles]) -> None:
    """Load ITK's modules now (``readers.load_itk``, on the caller's thread: before threads read the cases) where
    some case of ``sites`` is read with ITK (a DICOM series, NRRD or MetaImage file); nothing otherwise."""
    if readers.needs_itk(path for site in sites for pair in site.cases.values() for path in pair):
        readers.load_itk()
