"""Validate a federation folder before anything is trained or written.

``check_folder`` collects *every* problem it finds and raises one ``FederationError`` whose
message lists them one per line, each as ``"<path>: <problem>"`` (or ``"site '<name>': ..."``
for split problems), so a data manager can fix a folder in one pass. Problems of the same kind
(the same check failing on many files) show their first 3 lines, then ``... and N more like this``.

Warnings (a folder that trains, but maybe not as meant: volumes in several voxel orientations, a region no case holds,
a region some sites never hold while others do, ...) are lines apart from the problems; a Flower deployment's
coordinator, which holds no site's files, says the cross-site ones from the sites' reports, counts only
(:func:`site_orientation_warnings`, :func:`region_site_warnings` over :class:`SiteLabels`).
"""

from __future__ import annotations

import difflib
import logging
import math
from collections import Counter
from collections.abc import Iterable, Mapping
from contextlib import closing
from dataclasses import dataclass, field
from pathlib import Path
from typing import cast

import numpy as np

from fedseg.config import DataConfig, SplitConfig
from fedseg.data import dicom_seg, rtstruct
from fedseg.data.case_files import case_problems, grid_problems, read_array, read_image, read_label
from fedseg.data.federation import UNANNOTATED, Federation, FederationError, Regions
from fedseg.data.folder import (
    Header,
    build_federation,
    group_problems,
    load_itk_for,
    moved_links_problem,
    problems_text,
    root_problem,
    scan_folder,
)
from fedseg.data.prefetch import ordered_map
from fedseg.data.prepared import CheckCache
from fedseg.data.reorient import NO_GRID, voxel_orientation
from fedseg.data.splits import make_splits, split_problems
from fedseg.wording import listed

log = logging.getLogger("fedseg.data.check")


def label_value_problems(label: np.ndarray, regions: Regions, path: Path | str) -> list[str]:
    """Label values that are neither background (0), the ignore label (``Regions.ignore``: unannotated voxels) nor
    part of any region (``path``: the file, or where the label is, at the start of the line)."""
    ignored = set() if regions.ignore is None else {regions.ignore}
    allowed = regions.label_values | {0} | ignored
    unknown = [int(v) for v in np.unique(label) if int(v) not in allowed]
    if not unknown:
        return []
    shown = ", ".join(map(str, unknown[:10])) + (", ..." if len(unknown) > 10 else "")
    ignore = "" if regions.ignore is None else f"; {regions.ignore} is the ignore label"
    return [
        f"{path}: label values {shown} are not in any region "
        f"(regions use {', '.join(map(str, sorted(regions.label_values)))}; 0 is background{ignore})"
    ]


def _check_case(
    image_path: Path, label_path: Path, header: Header | None
) -> tuple[list[str], tuple[int, ...] | None, set[int], bool]:
    """Load one case and return ``(problems, image shape (C, *spatial) or None, its label's values, whether the
    image holds one value in every voxel)``, each problem once (a DICOM-SEG label is read on its image's grid, so a
    broken DICOM series fails the label with the image's own line).

    Without a valid header only readability is checked (kind, channels and regions are unknown).
    """
    problems: list[str] = []
    if header is None:
        for path, as_label in ((image_path, False), (label_path, True)):
            try:
                read_array(path, as_label=as_label)
            except FederationError as e:
                problems += str(e).splitlines()
        return problems, None, set(), False
    image = label = None
    try:
        image = read_image(image_path, header.kind)
    except FederationError as e:
        problems += str(e).splitlines()
    try:
        label = read_label(
            label_path,
            header.kind,
            image=image_path,
            label_names=header.label_names,
            regions=header.regions,
            label_synonyms=header.label_synonyms,
        )
    except FederationError as e:
        problems += str(e).splitlines()
    if label is not None:
        problems += label_value_problems(label, header.regions, label_path)
    if image is not None and label is not None:
        problems += case_problems(image, label, image_path, label_path, header.channels) or grid_problems(
            image_path, label_path
        )
    values = set() if label is None else {int(v) for v in np.unique(label)}
    blank = image is not None and image.size > 0 and bool(np.min(image) == np.max(image))
    return list(dict.fromkeys(problems)), None if image is None else tuple(image.shape), values, blank


def blank_image_warnings(paths: list[Path]) -> list[str]:
    """One line per image that holds one value in every voxel (a failed or blank export: trained and scored on
    without a word before); :func:`fedseg.data.folder.group_problems` shows the first few and a count."""
    return [
        f"{path}: every voxel holds the same value (a blank or failed export?): nothing to learn from" for path in paths
    ]


def unannotated_warnings(paths: list[Path], ignore: int) -> list[str]:
    """One line per label file whose every voxel holds the ignore label (partial annotations): the case would train
    nothing (no loss), so a run leaves it out of its site's training set and aggregation weight
    (``fedseg.data.dataset.build_site_data``), and it gets no score (it counts in no split:
    ``fedseg.data.splits.split_problems`` refuses a site left without an annotated case in one);
    :func:`fedseg.data.folder.group_problems` shows the first few and a count."""
    return [
        f"{path}: no annotated voxel (every voxel holds the ignore label {ignore}): this case trains nothing (a run "
        "leaves it out of its site's training set and aggregation weight) and gets no score"
        for path in paths
    ]


MAX_IMAGE_MB = 512.0  # data check's default: an image larger than this as float32 gets a warning
DEFAULT_IMAGE_SIZE = int(DataConfig.model_fields["image_size"].default)  # the whole-image path's input side


def size_warning(path: Path, shape: tuple[int, ...], max_mb: float) -> list[str]:
    """A warning line when an image of ``shape`` ``(C, *spatial)`` takes more than ``max_mb`` MB (10^6 bytes) as
    float32, the dtype training holds it in (every case stays in memory; a 12000 x 12000 RGB PNG is 1728 MB)."""
    mb = 4 * float(np.prod(shape)) / 1e6
    if mb <= max_mb:
        return []
    size = "x".join(map(str, shape))
    return [f"{path}: image is {mb:.3g} MB as float32 ({size}), above {max_mb:g} MB; a run keeps every case in memory"]


def volume_memory_note(fed: Federation) -> str | None:
    """For a 3D federation: the RAM a run on the volume path (``data.volume.patch_size``, the fets presets) keeps
    its cases in, estimated on the files' grids: per case the float32 image ``(C, *O)``, its region masks
    ``(R, *O)`` (bool) and their original-grid copy for the metrics (bool; validation and test cases only: an upper
    bound), from the shapes the check read
    (``meta["image_shape"]``); ``fedseg.data.volumes.Volume`` holds these, cropped to the foreground (a brain's crop
    keeps about half of a BraTS volume), padded to the patch size and resampled to ``data.volume.spacing``. Then what
    a run on the whole-image path keeps instead (no ``data.volume.patch_size``: ``--preset demo``...), where the files'
    size matters little: every case resized to ``data.image_size`` per axis (the default, ``DEFAULT_IMAGE_SIZE``),
    its float32 image and masks ``(C + R, S, S, S)`` (``fedseg.data.memory_guard``) and its original-grid truth packed
    a bit a voxel (an upper bound, as above). None for a 2D federation or without shapes."""
    if fed.kind != "3d":
        return None
    shapes = [
        [int(n) for n in cast(Iterable[int], c.meta["image_shape"])]
        for site in fed.sites
        for c in site.cases
        if "image_shape" in c.meta
    ]
    if not shapes:
        return None
    regions = fed.regions.target_channels
    total = sum((4 * shape[0] + 2 * regions) * math.prod(shape[1:]) for shape in shapes)
    side = DEFAULT_IMAGE_SIZE
    whole = sum(4 * (shape[0] + regions) * side**3 + regions * math.prod(shape[1:]) / 8 for shape in shapes)
    return (
        f"memory: a run on the volume path (data.volume.patch_size) keeps these {len(shapes)} cases in about "
        f"{total / 1e9:.3g} GB of RAM ({total / len(shapes) / 1e6:.3g} MB per case on the files' grids: float32 "
        "images, bool region masks and their original-grid copy, which training cases do not keep; less after the "
        "crop to the foreground, more where a case is padded to the patch size or resampled to a finer "
        f"data.volume.spacing){_prepared_cache_hint()}. That is not what a run on the whole-image path keeps (no "
        "data.volume.patch_size: --preset demo and the synthetic presets): it resizes every case to data.image_size "
        f"per axis, at the default {side}³ about {whole / 1e9:.3g} GB ({whole / len(shapes) / 1e6:.3g} MB per case: "
        "float32 image and masks, whatever the files' size, and the original-grid truth a bit a voxel)"
    )


def _prepared_cache_hint() -> str:
    """What the memory note adds about ``$FEDSEG_PREPARED_CACHE`` (``fedseg.data.prepared``)."""
    from fedseg.data.prepared import PREPARED_CACHE_ENV, cache_root

    if cache_root() is not None:
        return f"; with {PREPARED_CACHE_ENV} set, the volumes are mapped from its files (page cache) instead"
    return (
        f"; set {PREPARED_CACHE_ENV}=DIR to prepare each case once and map its volume from disk (page cache) "
        "instead of holding it"
    )


def rtstruct_warnings(
    painted: list[rtstruct.Painted],
    site_of: dict[Path, str],
    shown: int = 5,
    synonyms: dicom_seg.LabelSynonyms | None = None,
) -> list[str]:
    """The notices of the RT Structure Sets ``painted`` (``site_of``: label file -> site), one line per site and
    kind: per ``label_names`` entry that no ROI of some of them names (those cases read it as background; an ROI
    missing from a structure set usually means "not contoured", so training it as background may be a partial-label
    bug; an ROI declared without contours is explicitly empty and not reported), and for contours naming images
    outside their case's series (``rtstruct.ELSEWHERE``): how many files of how many, the first ``shown`` files.
    ``synonyms``: a label's other names (``label_names: {1: [tumor, GTV Tumour]}``), said beside its name."""
    read: dict[str, int] = {}
    missing: dict[tuple[str, tuple[int, str]], list[rtstruct.Painted]] = {}
    elsewhere: dict[str, list[rtstruct.Painted]] = {}
    for item in painted:
        site = site_of.get(item.path, "?")
        read[site] = read.get(site, 0) + 1
        for entry in item.unnamed:
            missing.setdefault((site, entry), []).append(item)
        if item.elsewhere is not None:
            elsewhere.setdefault(site, []).append(item)

    def files(items: list[rtstruct.Painted]) -> str:
        return ", ".join([i.path.name for i in items[:shown]] + (["..."] if len(items) > shown else []))

    def of(site: str, items: list[rtstruct.Painted]) -> str:
        return f"{len(items)} of {read[site]} RTSTRUCT{'s' if read[site] != 1 else ''} ({files(items)})"

    lines = []
    for (site, (value, name)), items in missing.items():
        rois = list(dict.fromkeys(roi for i in items for roi in i.rois))
        lines.append(
            f"site {site!r}: label {dicom_seg.names_text(value, name, synonyms)} ({value}) is named by no ROI in "
            f"{of(site, items)}: those cases read it as background (not contoured there?); their ROIs: "
            f"{rtstruct.rois_text(rois)}"
        )
    for site, items in elsewhere.items():
        lines.append(
            f"site {site!r}: contours in {of(site, items)} name images outside their case's series: "
            f"{rtstruct.ELSEWHERE}"
        )
    return lines


def rtstruct_problems(painted: list[rtstruct.Painted], synonyms: dicom_seg.LabelSynonyms | None = None) -> list[str]:
    """One problem per ``label_names`` entry that no ROI of any of the RT Structure Sets ``painted`` names by any of
    its names (``synonyms`` lists a value's names after its first; at least one structure set read): no case would
    hold it, which is a name that matches nothing (``Gross-Tumor`` for ``gross tumour``) far more often than a
    structure absent from every patient; the ROI names closest to any of its names are suggested. A structure truly
    absent everywhere is declared as an empty ROI of that name (explicitly empty: read as background)."""
    if not painted:
        return []
    unnamed = set.intersection(*(set(p.unnamed) for p in painted))
    rois = sorted({roi for p in painted for roi in p.rois})
    by_normal = {dicom_seg.normalized_name(r): r for r in rois}
    problems = []
    for value, name in sorted(unnamed):
        close: list[str] = []
        for spelled in (name, *(synonyms or {}).get(value, ())):
            close += difflib.get_close_matches(dicom_seg.normalized_name(spelled), list(by_normal), n=2, cutoff=0.6)
        close = list(dict.fromkeys(close))[:2]
        hint = f"; did you mean {' or '.join(repr(by_normal[c]) for c in close)}?" if close else ""
        problems.append(
            f"label_names {value}: {dicom_seg.names_text(value, name, synonyms)} is named by no ROI in any of the "
            f"{len(painted)} RTSTRUCTs read, so no case would hold it; their ROIs: {rtstruct.rois_text(rois)}{hint} "
            "(names compare case-insensitively, `_` and `-` as spaces; a structure absent from every case: an empty "
            "ROI of that name)"
        )
    return problems


def empty_region_warnings(regions: Regions, seen: set[int], cases: int) -> list[str]:
    """One line per region none of whose label values any of the ``cases`` checked holds (``seen``): every model
    learns it as background, a label value the annotations never use (another numbering?) more often than a
    structure absent from every case."""
    return [
        f"region {name!r} (label value{'s' if len(values) > 1 else ''} {', '.join(map(str, values))}): no voxel in "
        f"any of the {cases} cases: every model would learn it as background (do the labels number it otherwise?)"
        for name, values in zip(regions.names, regions.values)
        if not seen & set(values)
    ]


MIN_SITE_CASES = 3  # annotated cases a site needs before a region it never holds is worth a line
BY_CHANCE = 0.01  # a site is named where it would hold none of a region's voxels with at most this chance


@dataclass
class SiteLabels:
    """What a site's label files hold, counted (no case id): ``cases``, its annotated cases checked (a case of only
    the ignore label does not count); ``held``, label value -> how many of them hold a voxel of it."""

    cases: int = 0
    held: Counter[int] = field(default_factory=Counter)

    def add(self, values: set[int], ignore: int | None) -> None:
        """Count one case whose label holds ``values`` (none where it holds only the ignore label)."""
        if ignore is None or values != {ignore}:
            self.cases += 1
            self.held.update(values)

    def record(self, regions: Regions) -> dict:
        """What a Flower SuperNode reports (JSON): ``{"cases": n, "held": {"<label value>": cases}}``, the regions'
        values only."""
        held = {str(v): n for v, n in sorted(self.held.items()) if v in regions.label_values and n}
        return {"cases": self.cases, "held": held}

    @classmethod
    def from_record(cls, record: object) -> SiteLabels:
        """The :meth:`record` a site sent; a ValueError (one line) for anything else."""
        if not isinstance(record, dict) or set(record) != {"cases", "held"} or not isinstance(record["held"], dict):
            raise ValueError('not {"cases": n, "held": {label value: cases}}')
        cases = record["cases"]
        if isinstance(cases, bool) or not isinstance(cases, int) or cases < 0:
            raise ValueError(f"cases: {str(cases)[:20]!r} is no whole number >= 0")
        held: Counter[int] = Counter()
        for value, n in record["held"].items():
            if not (str(value).isascii() and str(value).isdigit()) or isinstance(n, bool) or not isinstance(n, int):
                raise ValueError(f"held: {str(value)[:12]!r}: {str(n)[:20]!r} is no label value and case count")
            if not 0 < n <= cases:
                raise ValueError(f"held: label value {value} in {n} of {cases} cases")
            held[int(value)] = n
        return cls(cases, held)


def region_site_warnings(regions: Regions, labels: Mapping[str, SiteLabels], shown: int = 8) -> list[str]:
    """One line per region that some sites' labels hold and others' never do, where chance does not explain it: the
    sign of institutions annotating different structures (one labels the organ only, another its tumour too), which
    fedseg does not model: every region is trained at every site, so such a site's cases teach every model that the
    region is background there.

    ``labels``: site -> :class:`SiteLabels`. A region's prevalence ``p`` is the lowest share of cases holding it at a
    site that holds it (of those with :data:`MIN_SITE_CASES` annotated cases or more; all of them pooled where none
    has as many), a case counted as holding it where it holds its most common value (a lower bound where a region has
    several values); a site of ``n`` >= :data:`MIN_SITE_CASES` annotated cases none of which holds it is named where
    ``(1 - p) ** n`` <= :data:`BY_CHANCE` (an organ every case holds: any such site; enhancing tumour in a third of the
    cases: a site of 12 cases, not one of 3). A region no site holds is :func:`empty_region_warnings`'. Counts only:
    a Flower coordinator, which holds the SuperNodes' counts and no file, says the same line
    (``fedseg.flower.engine.SiteMap.label_warnings``)."""
    lines = []
    for name, values in zip(regions.names, regions.values):
        holding = {s: max(found.held[v] for v in values) for s, found in labels.items()}
        holding = {s: n for s, n in holding.items() if n}
        if not holding:
            continue
        shares = [n / labels[s].cases for s, n in holding.items() if labels[s].cases >= MIN_SITE_CASES]
        pooled = sum(holding.values()) / sum(labels[s].cases for s in holding)
        prevalence = min(shares) if shares else pooled
        chance = {s: (1 - prevalence) ** found.cases for s, found in labels.items() if s not in holding}
        lacking = [s for s, c in chance.items() if labels[s].cases >= MIN_SITE_CASES and c <= BY_CHANCE]
        if not lacking:
            continue
        named = listed([f"{s} ({labels[s].cases} cases)" for s in lacking], shown)
        value_text = f"label value{'s' if len(values) > 1 else ''} {', '.join(map(str, values))}"
        sites = "site that does" if len(holding) == 1 else "sites that do"
        lines.append(
            f"region {name!r} ({value_text}): no voxel in any case of {named}, while at least {prevalence:.0%} of "
            f"the cases hold it at the {len(holding)} {sites} (none by chance: at most "
            f"{max(chance[s] for s in lacking):.2g}): if {listed(lacking, shown)} "
            f"{'does' if len(lacking) == 1 else 'do'} not annotate it, every model learns it as background there "
            "(fedseg trains every region at every site; sites that annotate different structures are not supported: "
            "train on sites that annotate the same ones)"
        )
    return lines


def orientation_warnings(orientations: dict[str, list[tuple[str, str]]], shown: int = 3) -> list[str]:
    """One line when the volumes of a federation lie in more than one voxel orientation (``orientations``: axis
    codes -> ``(site, case)`` of each volume): fedseg reads each in its stored voxel order, never reoriented (the
    format's rule), so a network trained on them sees one site's anatomy turned or mirrored against another's, with
    no word said before. Each orientation with its count and sites, the most common first."""
    if len(orientations) < 2:
        return []
    parts = []
    for code, cases in sorted(orientations.items(), key=lambda item: (-len(item[1]), item[0]))[:shown]:
        sites = sorted({site for site, _ in cases})
        named = listed(sites, shown)
        parts.append(f"{code} ({len(cases)} case{'s' if len(cases) > 1 else ''}: {named}, e.g. {cases[0][1]})")
    more = f" and {len(orientations) - shown} more" if len(orientations) > shown else ""
    return [
        f"the volumes lie in {len(orientations)} voxel orientations: {'; '.join(parts)}{more}; fedseg reads each in "
        "its stored voxel order, never reoriented, so a network sees these cases' anatomy turned or mirrored "
        "against one another: `fedseg data reorient` writes a copy with all in one (axes permuted and flipped, "
        "nothing resampled) unless your augmentation covers it"
    ]


def site_orientation_warnings(reports: Mapping[str, Mapping[str, int]], shown: int = 8) -> list[str]:
    """:func:`orientation_warnings` of a Flower deployment, said by its coordinator, which holds no site's files: one
    line when the sites' volumes lie in more than one voxel orientation (``reports``: site -> axis codes -> its cases
    lying in them, as each SuperNode reported its own folder, ``fedseg.data.reorient.site_orientations``; cases
    without a grid do not count), naming each site with its orientation (``mixed`` and its counts for a site whose own
    volumes differ) and what to do: the sites not wholly in the orientation most sites lie in (then most cases; RAS
    first on a tie) turn theirs to it with ``fedseg data reorient``. No case id: those never leave a site."""
    sites = {site: {c: n for c, n in counts.items() if c != NO_GRID} for site, counts in reports.items()}
    sites = {site: counts for site, counts in sites.items() if counts}
    found = {code for counts in sites.values() for code in counts}
    if len(found) < 2:
        return []
    whole = {code: [s for s, counts in sites.items() if set(counts) == {code}] for code in found}
    cases = {code: sum(counts.get(code, 0) for counts in sites.values()) for code in found}
    target = min(found, key=lambda code: (-len(whole[code]), -cases[code], code != "RAS", code))
    groups = {code: whole[code] for code in sorted(found, key=lambda code: (code != target, -len(whole[code]), code))}
    named = [f"{code} at {listed(names, shown)}" for code, names in groups.items() if names]
    mixed = [s for s, counts in sites.items() if len(counts) > 1]
    named += [
        f"mixed at {s} ({', '.join(f'{c} {n}' for c, n in sorted(sites[s].items(), key=lambda i: (-i[1], i[0])))})"
        for s in mixed[:shown]
    ] + ([f"mixed at {len(mixed) - shown} more sites"] if len(mixed) > shown else [])
    odd = [s for s in sites if set(sites[s]) != {target}]
    return [
        f"the sites' volumes lie in {len(found)} voxel orientations: {'; '.join(named)}; each SuperNode reads its "
        "volumes in their stored voxel order, never reoriented, so the model sees these sites' anatomy turned or "
        f"mirrored against one another: at {listed(odd, shown)}, `fedseg data reorient DATA --out NEW --to {target}` "
        f"(DATA: the SuperNode's --data folder) writes a copy in {target} (axes permuted and flipped, nothing "
        "resampled) to start its SuperNode on, unless your augmentation covers it"
    ]


def check_threads(cases: int, threads: int | None = None) -> int:
    """Threads checking ``cases`` cases at once: ``threads`` (a run's ``data.prepare_threads``, resolved), else
    those ``data.prepare_threads: 0`` gives (``fedseg.data.dataset.prepare_threads``); at most ``cases``; 0 (the
    caller's thread) for one. Each reads one case (its memory: several times a case's size each); the results are
    taken in the cases' order, so the check's lines do not depend on the count (fedseg's readers are safe to call
    from several threads)."""
    from fedseg.config import DataConfig
    from fedseg.data.dataset import prepare_threads

    count = min(threads or prepare_threads(DataConfig(prepare_threads=0)), cases)
    return count if count > 1 else 0


def check_folder(
    root: str | Path,
    split: SplitConfig | None = None,
    seed: int = 0,
    *,
    all_sites: bool = True,
    max_image_mb: float = MAX_IMAGE_MB,
    warnings: list[str] | None = None,
    threads: int | None = None,
    orientations: dict[str, list[tuple[str, str]]] | None = None,
    labels: dict[str, SiteLabels] | None = None,
    across_sites: bool = True,
) -> Federation:
    """Validate the federation folder ``root`` and return it (lazy, as ``load_folder`` would).

    Checks ``federation.yaml`` (keys, types, kind, regions), every site's file pairing
    (image without label and vice versa, duplicate case ids, unsupported files, empty sites),
    every ``splits.csv`` (columns, split values, unknown cases), the metadata (``sites:`` in
    ``federation.yaml``, every ``cases.csv``: columns, unknown or duplicate cases, a ``group``
    that ``splits.csv`` splits), every case's contents
    (readable, channel count, image/label spatial shape, integer labels, label values in the
    regions) and, given ``split`` and ``seed``, that every site keeps a training case.

    Every case is loaded once, in full, by :func:`check_threads` threads at once (``threads``: a run's
    ``data.prepare_threads``; a BraTS case about 0.8 s on one core: FeTS 2022's 1251 cases about 16 core-minutes),
    unless ``$FEDSEG_PREPARED_CACHE`` knows it unchanged (``fedseg.data.prepared.CheckCache``). The returned cases
    carry ``meta["image_shape"]`` ``(C, *spatial)``, and with an ignore label a case none of whose voxels is annotated
    ``meta[UNANNOTATED]`` (True): :func:`fedseg.data.splits.split_problems` does not count it.

    ``all_sites=False``: the folder holds only some of the federation's sites (a hospital's copy),
    so ``federation.yaml``'s ``sites:`` may name sites that are not here (see ``scan_folder``).

    Links whose targets no longer exist (an import's source dataset moved) stop the check at once with one line
    (``folder.moved_links_problem``), as a raw nnU-Net or MSD dataset given instead of a federation does.

    ``warnings``, when given, receives a line per image above ``max_image_mb`` (:func:`size_warning`): a large
    image is allowed, but a run holds every case in memory; and a line per site and ``label_names`` entry that no ROI
    of some of its RT Structure Sets names, or naming contours drawn on images outside their series
    (:func:`rtstruct_warnings`).
    Without ``warnings`` the latter are logged (WARNING, logger ``fedseg.data.check``) when the folder is valid.

    ``orientations``, when given, receives the voxel orientation of every volume checked (axis codes -> ``(site,
    case)`` of each, ``fedseg.data.reorient.voxel_orientation``; a case without a grid, NumPy arrays or a 2D image, is
    in none): what a Flower SuperNode reports of its site (``fedseg.flower.node.on_info``), so that the coordinator,
    which holds no site's files, can compare the sites' orientations. ``labels``, when given, receives what each
    site's label files hold (site -> :class:`SiteLabels`, counts only), which a SuperNode reports too: the regions
    some sites annotate and others never hold (:func:`region_site_warnings`). ``across_sites=False`` leaves those two
    comparisons of the sites (orientations, regions) unsaid: a Flower launcher's, whose coordinator says them from the
    sites' reports.

    Raises ``FederationError`` listing every problem, one per line (at most 3 of each kind, then
    ``... and N more like this``; the count in its first line is the total).
    """
    root = Path(root)
    for problem in (root_problem(root), moved_links_problem(root)):  # not a folder, a raw dataset, moved links
        if problem is not None:  # one line: the problems that follow from it would bury it
            raise FederationError(problem)
    header, sites, fixed, problems = scan_folder(root, all_sites=all_sites)
    meta: dict[tuple[str, str], dict[str, object]] = {}
    site_of: dict[Path, str] = {}
    labels = {} if labels is None else labels  # site -> what its label files hold, counted
    blanks: list[Path] = []  # images of one value in every voxel
    unannotated: list[Path] = []  # label files of only the ignore label (partial annotations)
    ignore = None if header is None else header.regions.ignore
    orientations = {} if orientations is None else orientations  # axis codes -> (site, case) of each volume
    jobs = [(site.name, cid, image, label) for site in sites for cid, (image, label) in site.cases.items()]

    load_itk_for(sites)  # here, before the threads: ITK's loading changes the working directory while it runs
    known = CheckCache.open(header)  # with $FEDSEG_PREPARED_CACHE: what earlier checks found in unchanged cases

    def check(job: tuple[str, str, Path, Path]) -> tuple[list[str], tuple[int, ...] | None, set[int], bool, str | None]:
        image, label = job[2], job[3]
        if known is not None and (found := known.get(image, label)) is not None:
            return [], tuple(found["shape"]), set(found["values"]), found["blank"], found["orientation"]
        case_probs, shape, values, blank = _check_case(image, label, header)
        volume = shape is not None and header is not None and header.kind == "3d"
        code = voxel_orientation(image) if volume else None
        if known is not None and not case_probs and shape is not None:
            known.put(image, label, {"shape": shape, "values": sorted(values), "blank": blank, "orientation": code})
        return case_probs, shape, values, blank, code

    with (
        rtstruct.noting() as painted,
        closing(ordered_map(check, jobs, check_threads(len(jobs), threads), "check")) as checked,
    ):
        for (site_name, cid, image_path, label_path), result in zip(jobs, checked):
            site_of[label_path] = site_name
            case_probs, shape, values, blank, code = result
            problems += case_probs
            labels.setdefault(site_name, SiteLabels()).add(values, ignore)
            blanks += [image_path] if blank else []
            nothing_known = ignore is not None and values == {ignore}
            unannotated += [label_path] if nothing_known else []
            if shape is not None:
                # unannotated: split_problems counts only cases it can train on or score
                meta[(site_name, cid)] = {"image_shape": shape, **({UNANNOTATED: True} if nothing_known else {})}
                if code:
                    orientations.setdefault(code, []).append((site_name, cid))
                if warnings is not None:
                    warnings += size_warning(image_path, shape, max_image_mb)
    order = {label: i for i, (*_, label) in enumerate(jobs)}
    painted.sort(key=lambda p: order.get(p.path, len(order)))  # the cases' order, whichever thread read them
    synonyms = None if header is None else header.label_synonyms
    problems += rtstruct_problems(painted, synonyms)
    notices = (
        rtstruct_warnings(painted, site_of, synonyms=synonyms)
        + blank_image_warnings(blanks)
        + (orientation_warnings(orientations) if across_sites else [])
    )
    notices += [] if ignore is None else unannotated_warnings(unannotated, ignore)
    if header is not None and not problems:
        seen = {value for found in labels.values() for value in found.held}
        notices += empty_region_warnings(header.regions, seen, sum(len(site.cases) for site in sites))
        notices += region_site_warnings(header.regions, labels) if across_sites else []
    if warnings is not None:
        warnings += notices
    fed = None if header is None else build_federation(header, sites, fixed, meta)
    if fed is not None and split is not None:
        problems += split_problems(fed, make_splits(fed, split, seed))
    if problems:
        raise FederationError(problems_text(f"{root}: federation folder is invalid", problems))
    assert fed is not None  # scan_folder reports a problem whenever federation.yaml is invalid
    for line in group_problems(notices) if warnings is None else []:  # the same on many files: a few, then a count
        log.warning(line)
    return fed
