"""One case pre-processed (:func:`prepare_case`), and an on-disk cache of prepared cases for federation folders.

Pre-processing a BraTS-sized case (reading four NIfTI files, resampling, cropping, normalizing, the model-size view)
takes about 3 s on one core and the data check reads it once more (0.8 s), so a run on FeTS 2022's 1251 cases spends
over an hour of CPU on them before round 1, every run. With ``$FEDSEG_PREPARED_CACHE`` set to a folder, each prepared
case of a federation folder is stored there once (:class:`PreparedCache`) and later runs read it back instead: the
same tensors to the bit (``tests/test_prepared_cache.py``), in a fraction of the time
(``benchmarks/prepared_cache.py``); and what the data check found of each sound case is kept beside them
(:class:`CheckCache`), so a check of unchanged files reads no image. The cache is a property of the machine, not of
the experiment (like ``$FEDSEG_CACHE_DIR`` for the built-in federations): it changes no result, so it is no config
field and a resume may switch it on or off. It is off unless set, since prepared cases take more disk than the
compressed files they come from (a BraTS case 100-150 MB: FeTS 2022 well over 100 GB): point it at a disk with
room (nnU-Net's ``nnUNet_preprocessed`` is the same trade).

Key. An entry is found by the SHA-256 of everything a prepared case is a function of: each of its files (a MetaImage
header's data file too; its resolved path, size in bytes, modification time and status change time in ns and inode:
a changed file makes a new key, even a corrected copy put in its place with the old size and times by ``cp -p``;
contents are not hashed, which would read the whole dataset at every start), the spacing the federation gives it,
the federation's kind, channels, regions (in order: the masks' channels) and label names (what the reader reads it
under), every ``data.*`` setting except those that never touch a prepared case (:data:`NOT_PREPARING`), whether
it keeps its original-grid truth (a scored volume; a scored whole image under ``eval.score_grid: original``) and
the code that prepares it (:func:`code_digest`: the sources of the fedseg modules that read and prepare a case and
the versions of the libraries that read and resample images). Only cases the folder reader reads are cached:
built-in federations and federations from user code (whose loader may do anything with the files it names) never.

Entries. ``<root>/<code>/<key[:2]>/<key>.case``, one file per case, ``<code>`` the first digits of
:func:`code_digest` (so ``fedseg data cache list --prepared`` tells this fedseg's entries from another version's,
which it never reads; ``fedseg data cache clear --prepared`` removes both): 8 bytes of magic, the header's length
(8 bytes, little-endian), a JSON header (per tensor its dtype, shape, byte offset and CRC-32; the volume's grid)
and the tensors' bytes, each at an offset that is a multiple of :data:`ALIGN`. Written to a temp file in the same
folder and renamed when complete (``os.replace``), so an interrupted write leaves no entry, only a temp file that
the next run on the machine removes once its process is gone. Read with every check (magic, header, sizes, every
tensor's CRC-32): an entry that fails one is logged in one line naming the file and the problem, removed and
prepared again, never trusted. The tensors stay mapped from the file (``torch.from_file``, copy on write: the file
never changes), so a volume (the bulk of a 3D case) lives in the operating system's page cache, which it can drop
and re-read under memory pressure, not in the process's own memory (sent to a worker process, ``--workers``, a
volume crosses as a copy, one per worker); a case prepared and stored is read back the same way, so a run that
fills the cache holds no more than one that reads it (``fedseg.data.memory_guard`` counts what a run holds). A
cache folder that cannot be written gives one log line: the run reads what it holds (a cache prepared once on a
shared read-only disk) and stores nothing, or, where it cannot be read either, goes on without it.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import importlib.metadata
import json
import logging
import os
import secrets
import threading
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np
import torch

from fedseg.atomic_files import atomic_write_text
from fedseg.config import DataConfig
from fedseg.data.federation import Case, Federation
from fedseg.data.preprocess import case_tensors
from fedseg.data.volumes import Grid, Volume, build_volume, case_spacing

log = logging.getLogger("fedseg.data.prepared")

PREPARED_CACHE_ENV = "FEDSEG_PREPARED_CACHE"
MAGIC = b"FSPCASE1"  # the file format's version is its last byte
ALIGN = 64  # every tensor starts at a multiple of this many bytes (any dtype's view is aligned)
SUFFIX = ".case"
CHECK_SUFFIX = ".check"  # what the data check found of an unchanged case (CheckCache)
PRIVATE_FILE, PRIVATE_FOLDER = 0o600, 0o700  # prepared cases are images of patients: their owner's only
CODE_DIGITS = 16  # an entry's folder: the first hex digits of the code that prepared it (code_digest)
TEMP_PREFIX = ".tmp-"
# data.* settings that never touch a prepared case (where the data comes from, how it is split and dealt,
# how many threads prepare it, how patches are drawn and windows slid): left out of the key
NOT_PREPARING = ("source", "root", "seed", "scale", "prepare_threads", "split", "repartition")
NOT_PREPARING_VOLUME = ("foreground_oversample", "sw_overlap", "sw_mode", "sw_batch_size")
# libraries whose version can change a prepared case's bytes (readers, resampling, normalization)
LIBRARIES = ("torch", "monai", "numpy", "scipy", "nibabel", "pydicom", "pillow", "itk", "itk-io", "itk-core")
_DTYPES = {"float32": torch.float32, "float64": torch.float64, "bool": torch.bool, "uint8": torch.uint8}
_warned: set[str] = set()  # cache folders reported unwritable, "stale:<root>" those named stale: once per process


@dataclass
class PreparedCase:
    """One case pre-processed: its model-size view ``x`` ``(C, *S)`` and masks ``y`` ``(R, *S)``, its
    :class:`Volume` on the volume path, and on the whole-image path of a scored split its original-grid truth
    (``(R, *O)`` region masks, None when the case is already on the model grid)."""

    x: torch.Tensor
    y: torch.Tensor
    volume: Volume | None
    truth: np.ndarray | None


def prepare_case(
    fed: Federation, case: Case, cfg: DataConfig, norm: Any, *, scored: bool, originals: bool
) -> PreparedCase:
    """``case`` read and pre-processed under ``cfg`` (``norm``: ``fedseg.data.preprocess.normalization`` of it):
    the model-size view, the volume on the volume path (with its original-grid truth if ``scored``), and on the
    whole-image path the original-grid truth of a ``scored`` case when ``originals`` (``eval.score_grid:
    original``) and the case is not on the model grid already."""
    on_grid = cfg.volume.patch_size is not None
    image, label = case.arrays()
    x, y = case_tensors(image, label, fed.regions, cfg.image_size, norm, cfg.resize)
    truth = None
    if originals and scored and not on_grid and tuple(label.shape) != tuple(y.shape[1:]):
        truth = fed.regions.target(label)
    volume = None
    if on_grid:
        spacing = case_spacing(case, fed.spatial_dims)
        volume = build_volume(image, label, fed.regions, spacing, cfg.volume, norm, scored=scored)
    return PreparedCase(x, y, volume, truth)


# --- the key ------------------------------------------------------------------------------------------------
# fedseg modules a prepared case never depends on, though the modules that prepare it import them: the config's
# values are in the key (its classes' defaults are not), the rest writes files, handles signals or runs threads
NOT_PREPARING_MODULES = ("fedseg.config", "fedseg.atomic_files", "fedseg.interrupts", "fedseg.data.prefetch")


PREPARING_ROOTS = ("fedseg.data.prepared", "fedseg.data.case_files")  # a prepared case: this module, the reader's
CHECKING_ROOTS = ("fedseg.data.check",)  # what the data check finds of a case (its rules live there)


def preparing_modules(roots: tuple[str, ...] = PREPARING_ROOTS) -> list[Path]:
    """The source files of the fedseg modules that read and prepare a case: the ``roots`` (this module and the
    folder reader's ``load_case``; the data check's for its records) and what they import, directly or through one
    another (their ``import`` statements, read statically), but :data:`NOT_PREPARING_MODULES`, sorted."""
    import ast
    import importlib.util

    seen: dict[str, Path] = {}
    todo = list(roots)
    while todo:
        name = todo.pop()
        if name in seen or name in NOT_PREPARING_MODULES:
            continue
        try:
            spec = importlib.util.find_spec(name)
        except (ImportError, ValueError):  # a name imported from a module (a class, a function): no module of its own
            continue
        if spec is None or spec.origin is None or not spec.origin.endswith(".py"):
            continue
        seen[name] = Path(spec.origin)
        for node in ast.walk(ast.parse(seen[name].read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                todo += [node.module] + [f"{node.module}.{a.name}" for a in node.names]
            elif isinstance(node, ast.Import):
                todo += [a.name for a in node.names]
        todo = [t for t in todo if t.startswith("fedseg.")]
    return sorted(seen.values())


_DIGESTING = threading.Lock()


def code_digest(roots: tuple[str, ...] = PREPARING_ROOTS) -> str:
    """SHA-256 of the code that prepares a case: the sources of :func:`preparing_modules` of ``roots`` and the
    installed versions of :data:`LIBRARIES` (absent: ``-``). An edit there makes new keys (the old entries are not
    read); an edit elsewhere in fedseg (a method, the CLI, a synthetic generator) keeps them. Computed once per
    process, by one thread at a time: the data check's threads asked for it at once, and ``ast.parse`` in several
    threads of CPython 3.11 fails (``SystemError: AST constructor recursion depth mismatch``)."""
    with _DIGESTING:
        return _code_digest(roots)


@cache
def _code_digest(roots: tuple[str, ...]) -> str:
    digest = hashlib.sha256()
    for source in preparing_modules(roots):
        digest.update(source.name.encode() + b"\0" + source.read_bytes() + b"\0")
    for name in LIBRARIES:
        try:
            version = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            version = "-"
        digest.update(f"{name}={version}\0".encode())
    return digest.hexdigest()


def case_files(case: Case) -> list[Path] | None:
    """The files a folder case is read from (its image and label; every file of a DICOM series folder; a MetaImage
    header's data file), or None for a case that is not read by the folder reader (built-in, from user code: its
    loader may do anything with the files it names) or whose files cannot all be named (gone: the reader will say
    so; a ``.mhd`` whose data is a list or a pattern of files)."""
    from fedseg.data.case_files import load_case

    loader = case.loader
    if not (isinstance(loader, functools.partial) and loader.func is load_case):
        return None
    paths = [case.meta.get("image"), case.meta.get("label")]
    if not all(isinstance(p, str) for p in paths):
        return None
    files: list[Path] = []
    for path in (Path(p) for p in paths):  # type: ignore[arg-type]
        if path.is_dir():
            files += sorted(p for p in path.rglob("*") if p.is_file())
        elif path.is_file():
            files.append(path)
        else:
            return None
    return with_data_files(files)


DETACHED_HEADERS = {".mhd": "ElementDataFile", ".nrrd": "data file", ".nhdr": "data file"}  # header -> its data key


def detached_data_file(header: Path) -> Path | None:
    """The data file a MetaImage (``.mhd``: ``ElementDataFile``) or NRRD header (``.nrrd``/``.nhdr``: ``data file``)
    names: the header itself when it holds its voxels (``LOCAL``; a NRRD without the field), None for a list or
    pattern of files, a file that is not there, or a header that cannot be read (the case is then not cached)."""
    suffix = next((s for s in DETACHED_HEADERS if header.name.lower().endswith(s)), None)
    if suffix is None:
        return header
    try:
        with open(header, "rb") as f:
            text = f.read(10000).decode("latin-1")
    except OSError:
        return None
    key = DETACHED_HEADERS[suffix]
    for line in text.splitlines():
        if suffix != ".mhd" and not line.strip():
            break  # a NRRD header ends at its first blank line; the voxels follow
        name, sep, value = line.partition("=" if suffix == ".mhd" else ":")
        if sep and name.strip().lower() in (key.lower(), key.lower().replace(" ", "")):
            value = value.strip()
            if value == "LOCAL":
                return header
            if value.startswith("LIST") or "%" in value or " " in value:
                return None
            data = header.parent / value
            return data if data.is_file() else None
    return header if suffix != ".mhd" else None


def with_data_files(files: list[Path]) -> list[Path] | None:
    """``files`` and the data files their headers name (:func:`detached_data_file`), or None where one cannot be
    named."""
    out: list[Path] = []
    for path in files:
        data = detached_data_file(path)
        if data is None:
            return None
        out += [path] if data == path else [path, data]
    return out


def data_settings(cfg: DataConfig) -> dict[str, Any]:
    """The ``data.*`` settings a prepared case depends on: all but :data:`NOT_PREPARING` (and the volume's
    :data:`NOT_PREPARING_VOLUME`), so a setting added later is in the key until someone shows it need not be."""
    settings = cfg.model_dump(mode="json", exclude=set(NOT_PREPARING))
    settings["volume"] = {k: v for k, v in settings["volume"].items() if k not in NOT_PREPARING_VOLUME}
    return settings


def file_stats(files: list[Path]) -> list[list[Any]]:
    """``[resolved path, size in bytes, modification time in ns, inode, status change time in ns]`` per file: what a
    key knows of a file (a corrected copy put in its place with the old size and modification time, ``cp -p`` or
    ``rsync -t``, still has another inode and change time, which no tool sets back)."""
    stats = []
    for path in files:
        stat = path.stat()
        stats.append([str(path.resolve()), stat.st_size, stat.st_mtime_ns, stat.st_ino, stat.st_ctime_ns])
    return stats


def reader_fields(fed: Federation | Any) -> dict[str, Any]:
    """What the folder reader reads a case under (``federation.yaml``'s kind, channels, regions and label names, with
    the other names a label is given: a changed list re-reads every label, never a stale one), of a
    :class:`Federation` or a ``fedseg.data.folder.Header``."""
    fields = {
        "kind": fed.kind,
        "channels": fed.channels,
        "regions": [[name, list(values)] for name, values in fed.regions.as_dict().items()],  # in order: channels
        "label_names": None if fed.label_names is None else {str(k): v for k, v in fed.label_names.items()},
    }
    if fed.regions.ignore is not None:  # the masks' known-voxel channel; absent: the keys as before
        fields["ignore_label"] = fed.regions.ignore
    if synonyms := getattr(fed, "label_synonyms", None):  # the other names of a label; absent: the keys as before
        fields["label_synonyms"] = {str(k): list(v) for k, v in sorted(synonyms.items())}
    return fields


def _sha256(described: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps({"code": code_digest(), **described}, sort_keys=True).encode()).hexdigest()


def case_key(fed: Federation, case: Case, cfg: DataConfig, *, scored: bool, originals: bool) -> str | None:
    """The cache key of ``case`` prepared under ``cfg`` (module docstring), or None when it cannot be cached.
    ``scored`` and ``originals`` count only where :func:`prepare_case` reads them (a volume keeps its truth when
    scored; a whole image when scored and ``originals``)."""
    files = case_files(case)
    if files is None:
        return None
    on_grid = cfg.volume.patch_size is not None
    return _sha256(
        {
            "files": file_stats(files),
            "spacing": repr(case.spacing or case.meta.get("spacing")),  # as given: parsed by the preparation
            "federation": reader_fields(fed),
            "data": data_settings(cfg),
            "truth": scored and (on_grid or originals),
        }
    )


# --- the files ------------------------------------------------------------------------------------------------
class CacheFileError(ValueError):
    """A prepared-case file that cannot be trusted (truncated, wrong magic, bad header, CRC mismatch)."""


def _tensors(prepared: PreparedCase) -> dict[str, torch.Tensor]:
    named = {"x": prepared.x, "y": prepared.y}
    if prepared.truth is not None:
        named["truth"] = torch.from_numpy(np.ascontiguousarray(prepared.truth))
    if prepared.volume is not None:
        named["volume.image"] = prepared.volume.image
        named["volume.label"] = prepared.volume.label
        if prepared.volume.truth is not None:
            named["volume.truth"] = prepared.volume.truth
    return named


def _grid_record(grid: Grid) -> dict[str, Any]:
    return {
        "shape": list(grid.shape),
        "spacing": list(grid.spacing),
        "resampled": list(grid.resampled),
        "affine": None if grid.affine is None else grid.affine.tolist(),
        "start": list(grid.start),
        "end": list(grid.end),
        "pad": [list(p) for p in grid.pad],
    }


def _grid(record: dict[str, Any]) -> Grid:
    affine = record["affine"]
    return Grid(
        tuple(int(v) for v in record["shape"]),
        tuple(float(v) for v in record["spacing"]),
        tuple(int(v) for v in record["resampled"]),
        None if affine is None else torch.tensor(affine, dtype=torch.float64),
        tuple(int(v) for v in record["start"]),
        tuple(int(v) for v in record["end"]),
        tuple((int(a), int(b)) for a, b in record["pad"]),
    )


def _bytes(tensor: torch.Tensor) -> np.ndarray:
    """A tensor's bytes as a flat uint8 array (no copy when it is contiguous)."""
    return tensor.detach().contiguous().numpy().reshape(-1).view(np.uint8)


def _aligned(n: int) -> int:
    return -(-n // ALIGN) * ALIGN


def write_case(path: Path, prepared: PreparedCase) -> None:
    """Write ``prepared`` as cache file ``path`` atomically (module docstring)."""
    blobs = {name: _bytes(t) for name, t in _tensors(prepared).items()}
    records: dict[str, dict[str, Any]] = {}
    header: dict[str, Any] = {"tensors": records, "grid": None}
    if prepared.volume is not None:
        header["grid"] = _grid_record(prepared.volume.grid)
        if prepared.volume.known:  # its masks carry the known voxels last (an ignore label)
            header["known"] = True
    named = _tensors(prepared)
    for name, blob in blobs.items():
        tensor = named[name]
        records[name] = {
            "dtype": str(tensor.dtype).removeprefix("torch."),
            "shape": list(tensor.shape),
            "nbytes": int(blob.nbytes),
            "crc32": zlib.crc32(blob.data),
        }
    # the offsets depend on the header's length, which depends on the offsets' digits: give each a fixed width
    for record in records.values():
        record["offset"] = 10**15
    start = _aligned(len(MAGIC) + 8 + len(json.dumps(header).encode()))
    for record in records.values():
        record["offset"] = start
        start = _aligned(start + record["nbytes"])
    text = json.dumps(header).encode()  # shorter than the estimate: the first tensor still starts after it
    tmp = path.with_name(f"{TEMP_PREFIX}{os.getpid()}-{secrets.token_hex(4)}-{path.name}")
    try:
        with open(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, PRIVATE_FILE), "wb") as f:
            f.write(MAGIC + len(text).to_bytes(8, "little") + text)
            for name, blob in blobs.items():
                f.seek(records[name]["offset"])
                f.write(blob.data)
            f.truncate(max(r["offset"] + r["nbytes"] for r in records.values()))  # an empty last tensor too
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def read_case(path: Path) -> PreparedCase:
    """The prepared case of cache file ``path``, every tensor checked (``CacheFileError``) and mapped from the file
    (module docstring; ``build_site_data`` copies the model-size views into its stacks and packs the truth)."""
    size = path.stat().st_size
    with open(path, "rb") as f:
        if f.read(len(MAGIC)) != MAGIC:
            raise CacheFileError("not a prepared-case file of this fedseg (its first bytes differ)")
        length = int.from_bytes(f.read(8), "little")
        if length > size:
            raise CacheFileError(f"truncated: its header claims {length} bytes, the file has {size}")
        try:
            header = json.loads(f.read(length))
            records = header["tensors"]
        except (ValueError, KeyError, TypeError) as e:
            raise CacheFileError(f"header unreadable ({type(e).__name__}: {e})") from None
    mapped = torch.from_file(str(path), shared=False, size=size, dtype=torch.uint8)
    tensors = {}
    try:
        for name, record in records.items():
            start, nbytes = int(record["offset"]), int(record["nbytes"])
            if start % ALIGN or start + nbytes > size:
                raise CacheFileError(
                    f"truncated or malformed: {name} lies at bytes {start}..{start + nbytes} of {size}"
                )
            raw = mapped[start : start + nbytes]
            if zlib.crc32(raw.numpy().data) != record["crc32"]:
                raise CacheFileError(f"{name}: content digest mismatch (corrupt)")
            tensors[name] = raw.view(_DTYPES[record["dtype"]]).view(record["shape"])
        volume = None
        if header["grid"] is not None:
            scored_truth = tensors.get("volume.truth")
            image, label, known = tensors["volume.image"], tensors["volume.label"], bool(header.get("known", False))
            volume = Volume(image, label, scored_truth, _grid(header["grid"]), known)
            volume.mapped = True  # pickled as copies: a file mapping cannot cross to another process
        truth = tensors["truth"].numpy() if "truth" in tensors else None
        return PreparedCase(tensors["x"], tensors["y"], volume, truth)
    except (KeyError, TypeError, ValueError, RuntimeError, AttributeError) as e:
        if isinstance(e, CacheFileError):
            raise
        raise CacheFileError(f"header malformed ({type(e).__name__}: {e})") from None


# --- the cache ----------------------------------------------------------------------------------------------
def cache_root() -> Path | None:
    """``$FEDSEG_PREPARED_CACHE`` (None when unset or empty)."""
    env = os.environ.get(PREPARED_CACHE_ENV, "").strip()
    return Path(env).expanduser() if env else None


def open_root() -> tuple[Path, bool] | None:
    """:func:`cache_root` and whether this process can write there (the temp files of writes whose process is gone
    then removed), or None when it is unset, or neither exists nor can be made. A folder that exists but cannot be
    written (a cache prepared once on a shared read-only disk) is read, never written: one log line per folder."""
    root = cache_root()
    if root is None:
        return None
    try:
        root.mkdir(mode=PRIVATE_FOLDER, parents=True, exist_ok=True)
        probe = root / f"{TEMP_PREFIX}{os.getpid()}-probe"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as e:
        readable = root.is_dir() and os.access(root, os.R_OK | os.X_OK)
        if str(root) not in _warned:
            _warned.add(str(root))
            then = "reading what it holds, storing nothing" if readable else "preparing every case without it"
            log.warning(
                f"prepared-case cache {root}: cannot write there ({e.strerror or e}); {then} "
                f"(set {PREPARED_CACHE_ENV} to a writable folder, or unset it)"
            )
        return (root, False) if readable else None
    remove_dead_temps(root)
    note_stale(root)
    return root, True


STALE_NOTE_BYTES = 1 << 30  # other versions' entries worth a line at a run's start: 1 GiB


def note_stale(root: Path) -> None:
    """One log line per process where the folders of other fedseg or library versions under ``root`` hold at least
    :data:`STALE_NOTE_BYTES`: every upgrade prepares the cases again in a new folder (170 GB at FeTS 2022's scale)
    and the old one is never read again, nor removed automatically (another version may still be running from it)."""
    if f"stale:{root}" in _warned:
        return
    _warned.add(f"stale:{root}")
    current = code_digest()[:CODE_DIGITS]
    stale = [(count, size) for _, count, size, _ in code_folders(root, skip=current) if count]
    size = sum(s for _, s in stale)
    if size >= STALE_NOTE_BYTES:
        log.info(
            f"prepared-case cache {root}: {size / 1e9:.1f} GB ({sum(n for n, _ in stale)} cases) prepared by "
            f"{len(stale)} other fedseg or library version(s), never read by this one; "
            "`fedseg data cache clear --prepared --stale` removes them"
        )


class PreparedCache:
    """The prepared cases under ``root`` for one site's preparation (:func:`fedseg.data.dataset.build_site_data`):
    :meth:`prepare` returns a case from the cache or prepares and stores it; ``hits``/``stored`` count them.
    Safe to call from several threads (each case its own file)."""

    def __init__(self, root: Path, fed: Federation, cfg: DataConfig, originals: bool, writable: bool = True):
        self.root, self.fed, self.cfg, self.originals, self.writable = root, fed, cfg, originals, writable
        self.hits = self.stored = 0
        self._count = threading.Lock()

    @classmethod
    def open(cls, fed: Federation, cfg: DataConfig, originals: bool) -> PreparedCache | None:
        """The cache of ``$FEDSEG_PREPARED_CACHE`` (:func:`open_root`: read-only where it cannot be written), or
        None when it is unset or unusable."""
        opened = open_root()
        return None if opened is None else cls(opened[0], fed, cfg, originals, opened[1])

    def prepare(self, case: Case, norm: Any, *, scored: bool) -> PreparedCase:
        """``case`` prepared (:func:`prepare_case`): read from the cache when it holds a sound entry for it, else
        prepared, stored and read back (mapped, as a later run reads it: the same tensors, their CRC-32 checked once
        more; a write that fails is logged once and the case used as prepared)."""
        key = case_key(self.fed, case, self.cfg, scored=scored, originals=self.originals)
        if key is None:
            return prepare_case(self.fed, case, self.cfg, norm, scored=scored, originals=self.originals)
        path = entry_path(self.root, key, SUFFIX)
        try:  # a folder another user made 0700 in a shared cache: a miss, as a missing entry
            present = path.is_file()
        except OSError:
            present = False
        if present:
            try:
                prepared = read_case(path)
                with self._count:
                    self.hits += 1
                return prepared
            except (CacheFileError, OSError) as e:
                gone = "removed, the case is prepared again" if self.writable else "the case is prepared without it"
                log.warning(f"prepared-case cache {path} (case {case.id}): {e}; {gone}")
                with contextlib.suppress(OSError):
                    path.unlink(missing_ok=True)
        prepared = prepare_case(self.fed, case, self.cfg, norm, scored=scored, originals=self.originals)
        if not self.writable:
            return prepared
        try:
            private_folders(self.root, path.parent)
            write_case(path, prepared)
            with self._count:
                self.stored += 1
        except OSError as e:
            if str(self.root) not in _warned:
                _warned.add(str(self.root))
                log.warning(f"prepared-case cache {self.root}: cannot store case {case.id} ({e.strerror or e})")
            return prepared
        try:  # read back: mapped from the file as a later run's, so a first run does not hold its volumes either
            return read_case(path)
        except (CacheFileError, OSError):  # removed or replaced meanwhile: the case as prepared
            return prepared


def is_code_folder(name: str) -> bool:
    """Whether ``name`` is a folder of entries (:data:`CODE_DIGITS` hex digits of a :func:`code_digest`)."""
    return len(name) == CODE_DIGITS and all(c in "0123456789abcdef" for c in name)


def code_folders(root: Path, skip: str | None = None) -> list[tuple[Path, int, int, bool]]:
    """``(folder, entries, bytes, current)`` per folder of entries under ``root`` (but ``skip``, a folder name, not
    walked); ``current``: written by this code (an entry of another fedseg or library version is never read by this
    one). Nothing else under ``root`` is the cache's."""
    found = []
    for folder in _code_folder_paths(root):
        if folder.name == skip:
            continue
        sizes = [_size(f) for f in folder.glob(f"??/*{SUFFIX}")]
        files = [n for n in sizes if n is not None]
        found.append((folder, len(files), sum(files), folder.name == code_digest()[:CODE_DIGITS]))
    return found


def _code_folder_paths(root: Path) -> list[Path]:
    """The folders of entries under ``root`` (:func:`is_code_folder`), sorted."""
    if not root.is_dir():
        return []
    return [f for f in sorted(root.iterdir()) if f.is_dir() and not f.is_symlink() and is_code_folder(f.name)]


def _size(file: Path) -> int | None:
    """A file's size, or None where it is no file or cannot be seen (another user's folder in a shared cache)."""
    try:
        return file.stat().st_size if file.is_file() else None
    except OSError:
        return None


def private_folders(root: Path, folder: Path) -> None:
    """Make ``folder`` and the folders between it and ``root`` (which exists), readable by their owner only."""
    for part in reversed([folder, *[p for p in folder.parents if root in p.parents]]):
        part.mkdir(mode=PRIVATE_FOLDER, exist_ok=True)


def entry_path(root: Path, key: str, suffix: str) -> Path:
    """Where the entry of ``key`` lies: ``<root>/<code>/<key[:2]>/<key><suffix>`` (module docstring)."""
    return root / code_digest()[:CODE_DIGITS] / key[:2] / f"{key}{suffix}"


class CheckCache:
    """The data check's findings on the cases it found sound (``fedseg.data.check.check_folder``), kept beside the
    prepared cases: per case its image shape, label values, whether its image is blank and its voxel orientation,
    keyed by its two files (path, size, modification time), the reader's ``federation.yaml`` fields and the code (as
    a prepared case's key), so a later check of unchanged files reads no image. Only a case of two plain files and
    no DICOM label is kept (reading an RT Structure Set or a DICOM-SEG gives notices that the check summarises)."""

    def __init__(self, root: Path, header: Any, writable: bool = True):
        self.root, self.fields, self.writable = root, reader_fields(header), writable

    @classmethod
    def open(cls, header: Any) -> CheckCache | None:
        """The check cache under ``$FEDSEG_PREPARED_CACHE`` for a folder of ``header`` (a
        ``fedseg.data.folder.Header``), or None (unset, unusable, or no valid header)."""
        opened = None if header is None else open_root()
        return None if opened is None else cls(opened[0], header, opened[1])

    def _path(self, image: Path, label: Path) -> Path | None:
        if image.is_dir() or label.suffix.lower() == ".dcm" or not (image.is_file() and label.is_file()):
            return None
        files = with_data_files([image, label])
        if files is None:
            return None
        described = {"files": file_stats(files), "reader": self.fields, "check": code_digest(CHECKING_ROOTS)}
        return entry_path(self.root, _sha256(described), CHECK_SUFFIX)

    def get(self, image: Path, label: Path) -> dict[str, Any] | None:
        """What the check found for this case's files when they were last checked sound, or None (none yet, or a
        record that is not one: checked again and rewritten)."""
        path = self._path(image, label)
        try:
            found = None if path is None else json.loads(path.read_text())
        except (OSError, ValueError):
            return None
        kinds: dict[str, type | tuple[type, ...]] = {
            "shape": list,
            "values": list,
            "blank": bool,
            "orientation": (str, type(None)),
        }
        if not (isinstance(found, dict) and all(isinstance(found.get(k), t) for k, t in kinds.items())):
            return None
        return found

    def put(self, image: Path, label: Path, found: dict[str, Any]) -> None:
        """Keep what the check found for a sound case (best effort: a write that fails is skipped)."""
        path = None if not self.writable else self._path(image, label)
        if path is None:
            return
        with contextlib.suppress(OSError):
            private_folders(self.root, path.parent)
            atomic_write_text(path, json.dumps(found), private=True)


def _temps(root: Path) -> Iterator[Path]:
    for folder in _code_folder_paths(root):  # without sizing every entry: this runs at every site's start
        yield from folder.glob(f"??/{TEMP_PREFIX}*")


def remove_dead_temps(root: Path) -> int:
    """Remove the temp files under ``root`` whose writing process is gone (an interrupted run); returns how many."""
    from fedseg.interrupts import is_running

    removed = 0
    for temp in _temps(root):
        pid = temp.name.removeprefix(TEMP_PREFIX).split("-", 1)[0]
        if pid.isdigit() and not is_running(int(pid)):
            temp.unlink(missing_ok=True)
            removed += 1
    return removed


def clear(root: Path, stale_only: bool = False) -> tuple[int, int, list[Path]]:
    """Remove the entries under ``root``: the ``.case`` and ``.check`` files and temp files of every folder of
    entries (:func:`code_folders`; ``stale_only``: only those of another fedseg or library version, which this one
    never reads), then the folders left empty, and nothing else: ``(cases removed, bytes freed, the folders kept
    because they hold other files)`` (an audit: a folder of 16 hex digits holding a user's files went whole). A run
    of another version that is using a removed entry keeps it (a mapped file stays readable); it prepares the case
    again next time."""
    found = [f for f in code_folders(root) if not (stale_only and f[3])]
    kept = []
    for folder, *_ in found:
        for pattern in (f"??/*{SUFFIX}", f"??/*{CHECK_SUFFIX}", f"??/{TEMP_PREFIX}*"):
            for file in folder.glob(pattern):
                if file.is_file() and not file.is_symlink():
                    file.unlink(missing_ok=True)
        for sub in [*sorted(folder.glob("??")), folder]:
            with contextlib.suppress(OSError):  # not empty: it holds what fedseg did not write
                sub.rmdir()
        if folder.exists():
            kept.append(folder)
    return sum(n for _, n, _, _ in found), sum(size for _, _, size, _ in found), kept
