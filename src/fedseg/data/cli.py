"""``fedseg data``: validate a folder federation, write a built-in federation to disk, import a real dataset."""

from __future__ import annotations

import math
import os
import shlex
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Annotated, NoReturn, cast

import typer
from rich.console import Console
from rich.table import Table

from fedseg.cli_errors import fail
from fedseg.config import DataConfig, SplitConfig
from fedseg.config_load import ConfigError, error_text, load_config, preset_names
from fedseg.data.federation import SPLITS, Federation, FederationError
from fedseg.interrupts import INTERRUPTED_EXIT, terminate_on_signals

data_app = typer.Typer(
    help="Federation data: validate a folder federation (check), write a built-in one to disk (synth), import a "
    "real dataset (import), export one for another tool (export), turn its volumes to one orientation (reorient) or "
    "manage the cache of built-in ones (cache).",
    no_args_is_help=True,
)


Entries = dict[str, tuple[int, int]]


def _entries(out: Path) -> Entries:
    """Name -> (device, inode) of each entry of the folder ``out`` but hidden ones (a command's temporary folders):
    what a command finds there before it writes, to tell afterwards what it moved in. Empty when ``out`` is no
    folder that can be read."""
    entries: Entries = {}
    try:
        with os.scandir(out) as found:
            for entry in found:
                if not entry.name.startswith("."):
                    stat = entry.stat(follow_symlinks=False)
                    entries[entry.name] = (stat.st_dev, stat.st_ino)
    except OSError:
        pass  # gone meanwhile, or unreadable: what was read so far
    return entries


def _interrupted(out: Path, before: Entries) -> NoReturn:
    """Ctrl-C (or SIGTERM) while writing ``out`` (``before``: its :func:`_entries` when the command began): one
    line saying what is there. These commands write into a temporary folder and move it into place at the end (all
    of it, or nothing), so either nothing was written, or, interrupted after the move (a check, a read back), the
    entries moved in are complete: a federation (its ``federation.yaml`` is new) or an exported dataset."""
    from fedseg.data.folder import HEADER_FILE

    new = sorted(name for name, identity in _entries(out).items() if before.get(name) != identity)
    if not new:
        fail(f"interrupted: nothing was written to {out}; run the same command again", INTERRUPTED_EXIT)
    if HEADER_FILE in new:
        done = f"{out} was written completely; `fedseg data check {shlex.quote(str(out))}` checks it"
    else:
        done = f"{', '.join(str(out / name) for name in new)} was written completely"
    fail(f"interrupted after the write had finished: {done}; no need to run the command again", INTERRUPTED_EXIT)


def _shape_text(shapes: list[tuple[int, ...]]) -> str:
    """``[(3, 64, 64)] -> "3×64×64"``; differing sizes per axis show as ``min–max``."""
    if not shapes:
        return "-"
    dims = zip(*shapes)
    return "×".join(str(lo) if lo == hi else f"{lo}–{hi}" for lo, hi in ((min(d), max(d)) for d in dims))


def summary_table(fed: Federation, splits: Mapping[str, Mapping[str, str]]) -> Table:
    """A rich table: per site, cases, train/val/test counts and image shape ``C×spatial``."""
    regions = ", ".join(f"{n}={list(v)}" for n, v in zip(fed.regions.names, fed.regions.values))
    if fed.regions.ignore is not None:
        regions += f"; ignore label {fed.regions.ignore} (unannotated voxels)"
    table = Table(title=f"{fed.name}: {fed.kind}, {fed.channels} channel(s)", caption=f"regions: {regions}")
    for column in ("site", "cases", *SPLITS, "image shape (C×spatial)"):
        table.add_column(column, justify="left" if column.startswith(("site", "image")) else "right")
    for site in fed.sites:
        counts = {s: sum(1 for v in splits.get(site.name, {}).values() if v == s) for s in SPLITS}
        # meta["image_shape"] is the (C, *spatial) tuple set by check_folder
        shapes: list[tuple[int, ...]] = [
            tuple(cast(Iterable[int], c.meta["image_shape"])) for c in site.cases if "image_shape" in c.meta
        ]
        if not shapes and site.cases:
            shapes = [tuple(site.cases[0].arrays()[0].shape)]
        table.add_row(site.name, str(len(site.cases)), *(str(counts[s]) for s in SPLITS), _shape_text(shapes))
    return table


def _split_settings(preset: str | None, config: Path | None, seed: int | None) -> tuple[SplitConfig, int]:
    if preset is None and config is None:
        return SplitConfig(), seed if seed is not None else DataConfig().seed
    cfg = load_config(preset=preset, file=config)
    return cfg.data.split, seed if seed is not None else cfg.data.seed


@data_app.command("check")
def check(
    root: Annotated[Path, typer.Argument(help="federation folder (ROOT/federation.yaml, ROOT/<site>/images|labels)")],
    preset: Annotated[str | None, typer.Option(help="take split settings and data.seed from this run preset")] = None,
    config: Annotated[Path | None, typer.Option(help="take split settings and data.seed from this run config")] = None,
    seed: Annotated[int | None, typer.Option(help="split seed (default: the preset's data.seed, else 0)")] = None,
    max_image_mb: Annotated[
        float, typer.Option(help="warn about images larger than this as float32 (MB); a run holds every case in RAM")
    ] = 512.0,
    site: Annotated[
        str | None,
        typer.Option(
            help="a hospital's folder: it must hold this site; the federation.yaml may name sites it does not hold "
            "(as `fedseg flower supernode` checks it)"
        ),
    ] = None,
) -> None:
    """Validate a federation folder and list every problem; exit 1 if there is any."""
    from fedseg.data.folder import group_problems, root_problem

    warnings: list[str] = []
    _check_positive(max_image_mb, "--max-image-mb", "MB")
    try:
        split, split_seed = _split_settings(preset, config, seed)
        if (problem := root_problem(root)) is not None:  # said before fedseg.data.check imports torch
            raise FederationError(problem)
        from fedseg.data.check import check_folder, volume_memory_note

        fed = check_folder(
            root, split, split_seed, max_image_mb=max_image_mb, warnings=warnings, all_sites=site is None
        )
        if site is not None and site not in fed.site_names:
            raise FederationError(
                f"{root}: no folder for site {site!r} (site folders here: {', '.join(fed.site_names)})"
            )
    except (FederationError, ConfigError, OSError) as e:  # OSError: e.g. a ROOT whose name is too long
        fail(error_text(e))
    for line in group_problems(warnings):
        typer.echo(f"warning: {line}", err=True)
    _print_summary(fed, split, split_seed, f"OK: {root} — {{sites}}, {{cases}} ({split.mode} split, seed {split_seed})")
    if (memory := volume_memory_note(fed)) is not None:
        Console().print(memory, highlight=False, soft_wrap=True)


def _check_positive(value: float, option: str, unit: str) -> None:
    """Refuse (one line naming ``option``) a ``value`` that is not a positive finite number: ``nan`` or ``-1`` as a
    limit would pass or flag every file without saying why."""
    if not (math.isfinite(value) and value > 0):
        fail(f"{option} {value:g}: expected a positive number ({unit})")


def _print_summary(fed, split: SplitConfig, seed: int, line: str) -> None:
    """Print the per-site table, then ``line`` with ``{sites}`` and ``{cases}`` filled in ("3 sites", "1 case"), then
    the metadata keys present (if any)."""
    from fedseg.data.metadata import metadata_summary
    from fedseg.data.splits import make_splits

    console = Console()
    console.print(summary_table(fed, make_splits(fed, split, seed)))
    n_cases = sum(len(s.cases) for s in fed.sites)
    sites, cases = f"{len(fed.sites)} site{'s' * (len(fed.sites) != 1)}", f"{n_cases} case{'s' * (n_cases != 1)}"
    console.print(line.format(sites=sites, cases=cases), highlight=False, soft_wrap=True)
    metadata = metadata_summary(fed)
    if metadata:
        console.print(metadata, highlight=False, soft_wrap=True)


def _synth_source(name: str) -> tuple[str, float, int, int, SplitConfig]:
    """``--preset`` -> (source, scale, image size, data.seed, split): a run preset's settings,
    or a source name with defaults."""
    if name in preset_names():
        cfg = load_config(preset=name)
        return cfg.data.source, cfg.data.scale, cfg.data.image_size, cfg.data.seed, cfg.data.split
    defaults = DataConfig()
    return name, defaults.scale, defaults.image_size, defaults.seed, defaults.split


@data_app.command("synth")
def synth(
    preset: Annotated[
        str,
        typer.Option(help="built-in federation (synthetic-retina, synthetic-prostate, synthetic-brats) or run preset"),
    ],
    out: Annotated[Path, typer.Option(help="folder to write the federation to")],
    scale: Annotated[float | None, typer.Option(help="site sizes = paper sizes x scale")] = None,
    image_size: Annotated[
        int | None, typer.Option(help="side of the square/cubic images, pixels (synthetic-brats: in-plane)")
    ] = None,
    seed: Annotated[int | None, typer.Option(help="generator seed (default: the preset's data.seed, else 0)")] = None,
    force: Annotated[bool, typer.Option(help="replace an existing federation folder at --out")] = False,
) -> None:
    """Generate a built-in federation and write it in the folder format (then check it)."""
    from fedseg.data.check import check_folder
    from fedseg.data.folder_write import check_root, write_folder

    before = _entries(out)
    try:
        check_root(out, force)  # before generating: an existing --out is refused at once
        source, default_scale, default_size, default_seed, split = _synth_source(preset)
        from fedseg.data.sources import BUILTIN_NAMES, build_builtin

        if source not in BUILTIN_NAMES:
            raise ConfigError(
                f"--preset {preset}: data source {source!r} is not a built-in federation "
                f"({', '.join(BUILTIN_NAMES)}); "
                f"run presets: {', '.join(preset_names())}"
            )
        scale = default_scale if scale is None else scale
        image_size = default_size if image_size is None else image_size
        seed = default_seed if seed is None else seed
        with terminate_on_signals():  # kill and a closed terminal clean up as Ctrl-C does
            fed = build_builtin(source, scale, image_size, seed)
            write_folder(fed, out, overwrite=force)
            written = check_folder(out)
    except (FederationError, ConfigError, OSError) as e:  # OSError: e.g. a read-only or full --out
        fail(error_text(e))
    except KeyboardInterrupt:
        _interrupted(out, before)
    _print_summary(
        written,
        split,
        seed,
        f"wrote {source} (scale {scale}, image size {image_size}, seed {seed}): {{sites}}, {{cases}} -> {out}",
    )


@data_app.command("import")
def import_(
    layout: Annotated[
        str, typer.Argument(help="dataset layout: fets2022, msd, prostate-6site, fundus, binary or nnunet")
    ],
    sources: Annotated[
        list[Path],
        typer.Argument(help="source folder(s): fets2022/prostate-6site/nnunet one; msd/fundus/binary one per site"),
    ],
    out: Annotated[Path, typer.Option(help="new (or empty) folder to write the federation to")],
    copy: Annotated[bool, typer.Option("--copy/--link", help="copy files, or symlink those usable as is")] = False,
    partitioning: Annotated[int | None, typer.Option(help="fets2022: partitioning_1.csv or _2.csv (default 1)")] = None,
    regions: Annotated[
        str | None, typer.Option(help="msd: regions from labels: auto (default), nested or disjoint")
    ] = None,
    site_by: Annotated[
        str | None,
        typer.Option(
            help="nnunet: a regex on the case id whose group 'site' (else its first group) is the site (a group "
            "'case' gives the case id), or a CSV file with header case,site (default: one site)"
        ),
    ] = None,
    fold: Annotated[
        int | None, typer.Option(help="nnunet: the fold of splits_final.json giving train/val (default 0)")
    ] = None,
    splits: Annotated[
        Path | None,
        typer.Option(help="nnunet: splits_final.json (default: in the dataset folder, else $nnUNet_preprocessed/<it>)"),
    ] = None,
    region: Annotated[
        str | None, typer.Option(help="binary: name of the masks' foreground region (default foreground)")
    ] = None,
) -> None:
    """Import a real multi-site dataset into a folder federation, then check it. Layouts: fets2022 SRC (FeTS2022_NNNNN/
    folders, partitioning_N.csv), msd TASK... (Decathlon task folders; nnU-Net v1 Task0XX_Name folders too),
    prostate-6site SRC (SRC/<SITE>/CaseNN.nii.gz, CaseNN_segmentation.nii.gz), fundus SRC... (images/ + masks/, 0 cup,
    128 rim, 255 background), binary SRC... (images/<id> + masks/<id>[_mask|_segmentation|...]: polyp, skin lesion
    and other binary masks, 0/255, 0/1 or JPEG; one region, --region), nnunet DatasetNNN_Name... (nnU-Net v2:
    dataset.json, imagesTr/<case>_XXXX.<ext>, labelsTr/; sites by --site-by, or one dataset per hospital)."""
    from fedseg.data.importers import ImportOptions, import_dataset

    notes: list[str] = []
    before = _entries(out)
    try:
        options = ImportOptions(partitioning, regions, site_by, fold, splits, region)  # type: ignore[arg-type]  # plan_msd checks regions
        with terminate_on_signals():
            fed = import_dataset(layout, sources, out, copy=copy, options=options, notes=notes)
    except (FederationError, OSError) as e:  # OSError: e.g. a full disk, a folder that cannot be written
        fail(error_text(e))
    except KeyboardInterrupt:
        _interrupted(out, before)
    from fedseg.data.splits import make_splits, split_problems

    split, seed = SplitConfig(), DataConfig().seed
    how = "copied" if copy else "linked where usable as is"
    # the files are sound; `data check` (and a run) also splits every site: said here, not "OK" (an audit)
    unsplit = split_problems(fed, make_splits(fed, split, seed))
    verdict = "data check OK" if not unsplit else "files checked, but the default split fails (below)"
    _print_summary(fed, split, seed, f"imported {layout} ({how}): {{sites}}, {{cases}} -> {out}; {verdict}")
    for line in unsplit:
        typer.echo(f"warning: {line}; `fedseg data check {out}` and a run refuse this split", err=True)
    for line in notes:
        typer.echo(f"note: {line}")


def _export_source(
    fed: str, preset: str | None, config: Path | None, seed: int | None
) -> tuple[Federation, SplitConfig, int]:
    """``FED`` of ``data export`` -> ``(federation, split settings, split seed)``: a federation folder (checked), or
    a built-in federation / run preset as ``data synth --preset`` takes it (its generator settings)."""
    from fedseg.data.check import check_folder
    from fedseg.data.sources import BUILTIN_NAMES, build_builtin

    split, split_seed = _split_settings(preset, config, seed)
    if Path(fed).is_dir():
        return check_folder(fed, split, split_seed), split, split_seed
    if fed not in BUILTIN_NAMES and fed not in preset_names():
        raise FederationError(
            f"{fed}: not a federation folder, a built-in federation ({', '.join(BUILTIN_NAMES)}) nor a run preset"
        )
    source, scale, image_size, default_seed, default_split = _synth_source(fed)
    if source not in BUILTIN_NAMES:
        raise FederationError(f"{fed}: the preset's data source {source!r} is not a built-in federation")
    generator_seed = default_seed if seed is None else seed
    if preset is None and config is None:
        split, split_seed = default_split, generator_seed
    return build_builtin(source, scale, image_size, generator_seed), split, split_seed


@data_app.command("export")
def export(
    format: Annotated[str, typer.Argument(help="target layout: nnunet (an nnU-Net v2 raw dataset)")],
    fed: Annotated[
        str,
        typer.Argument(help="federation folder, or a built-in federation / run preset (as data synth --preset takes)"),
    ],
    out: Annotated[Path, typer.Option(help="folder to write DatasetNNN_Name/ into (e.g. $nnUNet_raw)")],
    pooled: Annotated[
        bool, typer.Option("--pooled", help="every site in one dataset, case ids <site>__<case> (the default)")
    ] = False,
    site: Annotated[str | None, typer.Option(help="export this site only (case ids as they are)")] = None,
    dataset_id: Annotated[int, typer.Option("--id", help="nnU-Net dataset id, 1..999")] = 500,
    name: Annotated[str | None, typer.Option(help="dataset name (default: the federation's)")] = None,
    all_folds: Annotated[
        bool,
        typer.Option(
            "--all-folds", help="k-fold split: one nnU-Net fold per fedseg fold (val = that fold's test cases)"
        ),
    ] = False,
    preset: Annotated[str | None, typer.Option(help="take split settings and data.seed from this run preset")] = None,
    config: Annotated[Path | None, typer.Option(help="take split settings and data.seed from this run config")] = None,
    seed: Annotated[int | None, typer.Option(help="split seed (default: the preset's data.seed, else 0)")] = None,
) -> None:
    """Export a federation as an nnU-Net v2 raw dataset (imagesTr/labelsTr = train+val, imagesTs/labelsTs = test,
    splits_final.json = the run's split), so a centralized nnU-Net baseline uses exactly the same cases and splits."""
    from fedseg.atomic_files import check_out_dir
    from fedseg.data.exporters import FORMATS
    from fedseg.data.exporters.nnunet import IMPORT_REGEX, export_nnunet
    from fedseg.data.splits import make_splits

    before = _entries(out)
    try:
        if format not in FORMATS:
            raise FederationError(f"unknown export format {format!r}; formats: {', '.join(FORMATS)}")
        check_out_dir(out)  # before the federation is built
        if pooled and site is not None:
            raise FederationError("--pooled and --site exclude each other: export every site or one")
        with terminate_on_signals():
            federation, split, split_seed = _export_source(fed, preset, config, seed)
            if all_folds and split.mode != "kfold":
                raise FederationError(
                    f"--all-folds needs a k-fold split (split.mode: kfold), the split here is {split.mode}"
                )
            configs = [split.model_copy(update={"fold": k}) for k in range(split.folds)] if all_folds else [split]
            folds = [make_splits(federation, c, split_seed) for c in configs]
            written = export_nnunet(federation, folds, out, dataset_id=dataset_id, name=name, site=site)
    except (FederationError, ConfigError, OSError, ValueError) as e:  # ValueError: an --out that is a file
        fail(error_text(e))
    except KeyboardInterrupt:
        _interrupted(out, before)
    typer.echo(
        f"exported {federation.name} ({'site ' + site if site else 'pooled'}, {split.mode} split, seed {split_seed}): "
        f"{written.training} training and {written.test} test cases, {written.folds} fold(s) -> {written.path}"
    )
    typer.echo(
        f"  copy {shlex.quote(str(written.path / 'splits_final.json'))} to "
        f'"$nnUNet_preprocessed"/{shlex.quote(written.path.name)}/ before training'
    )
    if site is None:
        typer.echo(
            f"  back to a federation: fedseg data import nnunet {shlex.quote(str(written.path))} --site-by "
            f"{shlex.quote(IMPORT_REGEX)} --out DIR"
        )


@data_app.command("reorient")
def reorient(
    root: Annotated[Path, typer.Argument(help="a 3D federation folder")],
    out: Annotated[Path, typer.Option(help="a new (or empty) folder to write the reoriented federation into")],
    to: Annotated[
        str, typer.Option("--to", help="the orientation: where array axes 0, 1, 2 run (RAS, LPS, ...)")
    ] = "RAS",
) -> None:
    """Write a copy of a 3D federation folder with every volume in one voxel orientation (its axes permuted and
    flipped, nothing resampled; each voxel keeps its value and its place in the patient), as NIfTI files."""
    from fedseg.atomic_files import check_out_dir
    from fedseg.data.folder import load_folder, read_header, root_problem
    from fedseg.data.reorient import check_target, reorient_folder

    before = _entries(out)
    try:
        target = check_target(to)
        if (problem := root_problem(root)) is not None:
            raise FederationError(problem)
        check_out_dir(out)
        with terminate_on_signals():
            # a hospital's folder (a SuperNode's --data) holds its own site only; federation.yaml names the others
            fed = load_folder(root, all_sites=False)
            summary = reorient_folder(fed, root, out, target)
    except (FederationError, OSError, ValueError) as e:  # ValueError: an --out that is a file
        fail(error_text(e))
    except KeyboardInterrupt:
        _interrupted(out, before)
    found = ", ".join(f"{codes} {n}" for codes, n in summary.before.items()) or "none"
    copied = f", {summary.copied} NumPy case(s) copied as they are (no grid)" if summary.copied else ""
    command = f"fedseg data check {shlex.quote(str(out))}"
    check = f"`{command}` checks it"
    try:
        read_header(out, fed.site_names)
    except FederationError:  # its federation.yaml names sites it does not hold: a hospital's folder (or a typo)
        site = shlex.quote(fed.site_names[0]) if len(fed.site_names) == 1 else "SITE"
        check = f"its federation.yaml names sites it does not hold (a hospital's folder?): `{command} --site {site}`"
        check += " checks it"
    typer.echo(
        f"reoriented {root} -> {out} to {target}: {summary.turned} case(s) turned, {summary.kept} already {target}"
        f"{copied} (orientations found: {found}); {check}"
    )


cache_app = typer.Typer(
    help="The on-disk caches: built-in federations ($FEDSEG_CACHE_DIR, else ~/.cache/fedseg/federations) and, when "
    "$FEDSEG_PREPARED_CACHE is set, the prepared cases of federation folders: list their entries with their sizes, "
    "or clear them.",
    no_args_is_help=True,
)
data_app.add_typer(cache_app, name="cache")


def _cache_root() -> Path:
    from fedseg.data.cache import CACHE_ENV, cache_root

    root = cache_root()
    if root is None:
        fail(f"the federation cache is off ({CACHE_ENV}=off)")
    return root


def _prepared_root() -> Path:
    from fedseg.data.prepared import PREPARED_CACHE_ENV, cache_root

    root = cache_root()
    if root is None:
        fail(f"no prepared-case cache: {PREPARED_CACHE_ENV} is not set")
    if root.exists() and not root.is_dir():
        fail(f"{PREPARED_CACHE_ENV}={root}: not a folder; set it to the prepared-case cache's folder")
    return root


def _mb(size: int) -> str:
    return f"{size / 1e6:.1f} MB"


@cache_app.command("list")
def cache_list(
    prepared: bool = typer.Option(
        False, "--prepared", help="list the prepared-case cache ($FEDSEG_PREPARED_CACHE) instead"
    ),
) -> None:
    """Every cached federation (key = source, scale, image size, seed, generator version) and its size on disk; with
    --prepared, the prepared cases per version of the code that prepared them."""
    if prepared:
        return _prepared_list(_prepared_root())
    from fedseg.data.cache import entries

    root = _cache_root()
    found = entries(root)
    for name, size, complete in found:
        typer.echo(f"{_mb(size):>10}  {name}{'' if complete else '  (incomplete: removed by clear)'}")
    typer.echo(f"{len(found)} entries, {_mb(sum(size for _, size, _ in found))} in {root}{_not_ours(root)}")


def _prepared_list(root: Path) -> None:
    from fedseg.data.prepared import code_folders

    found = code_folders(root)
    for folder, count, size, current in found:
        whose = "this fedseg's" if current else "another fedseg or library version's: never read by this one"
        typer.echo(f"{_mb(size):>10}  {folder.name}  {count} prepared cases ({whose})")
    total = sum(size for *_, size, _ in found)
    typer.echo(f"{sum(n for _, n, _, _ in found)} prepared cases, {_mb(total)} in {root}")


def _not_ours(root: Path) -> str:
    """``; left alone: N other files or folders (a, b, ...)`` for what lies in the cache folder but is not the
    cache's (``fedseg.data.cache.others``); empty when nothing does."""
    from fedseg.data.cache import others

    names = others(root)
    if not names:
        return ""
    shown = ", ".join(names[:3]) + (", ..." if len(names) > 3 else "")
    return f"; left alone: {len(names)} other file(s) or folder(s), not the cache's ({shown})"


@cache_app.command("clear")
def cache_clear(
    prepared: bool = typer.Option(
        False, "--prepared", help="clear the prepared-case cache ($FEDSEG_PREPARED_CACHE) instead"
    ),
    stale: bool = typer.Option(
        False,
        "--stale",
        help="with --prepared: only the cases prepared by another fedseg or library version (never read by this one)",
    ),
) -> None:
    """Remove every cached federation (they are generated again when a run needs them); with --prepared, every
    prepared case (prepared again when a run needs them), with --stale only other versions'. Nothing else in the
    folder is touched."""
    if stale and not prepared:
        fail(
            "--stale applies to the prepared-case cache: give --prepared too (built-in federations of older "
            "generator versions are removed automatically)"
        )
    if prepared:
        from fedseg.data.prepared import clear as clear_prepared

        root = _prepared_root()
        removed, size, kept = clear_prepared(root, stale_only=stale)
        whose = " prepared by other versions" if stale else ""
        typer.echo(f"removed {removed} prepared cases{whose} ({_mb(size)}) from {root}")
        for folder in kept:
            typer.echo(f"note: {folder}: kept: it holds files fedseg did not write (look at them, remove it yourself)")
        return
    from fedseg.data.cache import clear

    root = _cache_root()
    removed, size = clear(root)
    typer.echo(f"removed {removed} entries ({_mb(size)}) from {root}{_not_ours(root)}")
