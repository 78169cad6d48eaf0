"""Built-in federations generated in parallel and kept in an on-disk cache.

Generation. The cases of a built-in federation are drawn from their own random streams (``case_rng``: seeded by
``(seed, federation, site, case)``), so they can be generated in any order and any process: :func:`generate`
runs the builder's jobs (2D: one batch of one site's cases; 3D: one case) on a ``spawn`` process pool of
:func:`generate_workers` processes (the CPUs this process may use, at most :data:`MAX_GENERATE_WORKERS`) when
the federation is large enough to pay for the pool's start (:data:`PARALLEL_MIN_VOXELS`), else serially. The
arrays are bit-identical either way (the same job function computes the same batch). Interrupted (Ctrl-C, kill), the
workers are stopped and the pool let go in bounded time (:func:`_stop_pool`).

Cache. ``$FEDSEG_CACHE_DIR`` (``off``: no cache), else ``~/.cache/fedseg/federations``; one entry per
:func:`entry_key` (the generator version :data:`GENERATOR_VERSION` and every parameter that changes the data:
source, scale, image size, seed), a folder ``<key>/`` holding per site ``<site>.images.npy`` ``(N, C, *spatial)``
and ``<site>.labels.npy`` ``(N, *spatial)`` (uint8) and ``manifest.json`` (the parameters, the federation's
structure: regions, site and case metadata, spacings; per array file its shape, dtype and CRC-32 of its bytes).
The raw generated cases are cached, not the pre-processed tensors: pre-processing the ``demo`` federation takes
0.1 s against 0.4 s to generate it (and the tensors depend on every ``data.*`` setting).

Written atomically: into ``<key>.tmp-<pid>-<random>/``, renamed to ``<key>/`` when complete, so an interrupted write
leaves no entry (only a temp folder: removed by ``fedseg data cache clear``, or by :func:`prune` once its process is
gone). Read with every check: a missing file, an unreadable or truncated array, a CRC mismatch or parameters other
than the key's (stale) make the entry invalid: one log line names it and the problem, and it is removed and rebuilt,
never trusted. A cache folder that cannot be written (read-only HOME) gives one log line and the run goes on without
the cache. After each new entry, :func:`prune` removes the entries of older generator versions (never read again:
their key differs) and the temp folders of dead processes.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import re
import shutil
import tempfile
import zlib
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from fedseg.data.federation import Case, Federation, Regions, Site

log = logging.getLogger("fedseg.data.cache")

GENERATOR_VERSION = 1  # bump when a generator's output changes: every older entry becomes unused (a new key)
CACHE_ENV = "FEDSEG_CACHE_DIR"
CACHE_OFF = "off"  # FEDSEG_CACHE_DIR=off: no cache
MANIFEST = "manifest.json"
MAX_GENERATE_WORKERS = 16  # processes generating one federation, at most
PARALLEL_MIN_VOXELS = 4_000_000  # below this many voxels in all (~1 s serial) a pool costs more than it saves
_warned: set[str] = set()  # cache folders already reported unwritable (one line per process)


class CacheEntryError(ValueError):
    """A cache entry that cannot be trusted (missing file, bad array, digest mismatch, stale parameters)."""


@dataclass(frozen=True)
class BuiltinParams:
    """Everything that changes a built-in federation's arrays."""

    source: str
    scale: float
    image_size: int
    seed: int

    def as_dict(self) -> dict[str, Any]:
        return {
            "generator_version": GENERATOR_VERSION,
            "source": self.source,
            "scale": float(self.scale),
            "image_size": int(self.image_size),
            "seed": int(self.seed),
        }


def entry_key(params: BuiltinParams) -> str:
    """The entry's folder name: readable parameters plus a hash of all of them (``synthetic-retina-s0.25-i64-seed0-
    v1-<12 hex>``)."""
    digest = zlib.crc32(json.dumps(params.as_dict(), sort_keys=True).encode())
    return f"{params.source}-s{params.scale:g}-i{params.image_size}-seed{params.seed}-v{GENERATOR_VERSION}-{digest:08x}"


def cache_root() -> Path | None:
    """``$FEDSEG_CACHE_DIR`` (None for ``off``), else ``~/.cache/fedseg/federations``."""
    env = os.environ.get(CACHE_ENV, "").strip()
    if env.lower() == CACHE_OFF:
        return None
    if env:
        return Path(env).expanduser()
    try:
        return Path.home() / ".cache" / "fedseg" / "federations"
    except RuntimeError:  # no home folder to be found: no cache (``writable_root`` would say so for a folder)
        return None


def writable_root() -> Path | None:
    """:func:`cache_root` if it can be created and written; else None, with one log line (per folder)."""
    root = cache_root()
    if root is None:
        return None
    try:
        root.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=root, prefix=".probe-"):
            pass
    except OSError as e:
        if str(root) not in _warned:
            _warned.add(str(root))
            log.warning(
                f"federation cache {root}: cannot write there ({e.strerror or e}); generating without the cache "
                f"(set {CACHE_ENV} to a writable folder, or {CACHE_ENV}=off)"
            )
        return None
    return root


# --- generation ---------------------------------------------------------------------------------------------
def generate_workers(jobs: int, voxels: int) -> int:
    """Processes for generating ``jobs`` jobs of ``voxels`` voxels in all: 1 below ``PARALLEL_MIN_VOXELS``, else
    the CPUs this process may use, at most ``MAX_GENERATE_WORKERS`` and ``jobs``."""
    if voxels < PARALLEL_MIN_VOXELS or jobs < 2:
        return 1
    from fedseg.data.prefetch import usable_cpus

    return max(1, min(usable_cpus(), MAX_GENERATE_WORKERS, jobs))


def builtin_voxels(name: str, scale: float, image_size: int) -> tuple[int, int]:
    """``(cases, voxels)`` of built-in federation ``name`` (its size, without generating it)."""
    from fedseg.data.synthetic_brats import SYNTHETIC_BRATS

    if name == SYNTHETIC_BRATS:
        from fedseg.data.synthetic_brats import INSTITUTIONS, site_sizes, volume_shape

        sizes = site_sizes(scale)
        return sum(sizes), sum(
            n * math.prod(volume_shape(image_size, i.slice_factor)) for i, n in zip(INSTITUTIONS, sizes)
        )
    from fedseg.data.synthetic import site_sizes as sizes_2d
    from fedseg.data.synthetic import synthetic_spec

    cases = sum(sizes_2d(synthetic_spec(name).table, scale))
    return cases, cases * image_size**2


def generate(params: BuiltinParams) -> Federation:
    """The built-in federation ``params`` names, every case in memory, generated by :func:`generate_workers`
    processes (bit-identical to serial generation)."""
    cases, voxels = builtin_voxels(params.source, params.scale, params.image_size)
    workers = generate_workers(cases, voxels)
    if workers == 1:
        return _build(params, map)
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor
    from concurrent.futures.process import BrokenProcessPool

    # spawn: the parent may run torch threads (a fork of it is unsafe); a child imports only numpy and the generator
    from fedseg.interrupts import deferred_interrupts

    # the workers ignore Ctrl-C (the terminal sends it to them too): the parent stops them, without their tracebacks
    pool = ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn"), initializer=_ignore_sigint)
    try:

        def map_jobs(fn: Callable[..., Any], jobs: list[Any]) -> Iterable[Any]:
            # map submits every job, starting the workers: not stopped half-way, and they start deaf to Ctrl-C
            with deferred_interrupts(), _sigint_blocked():
                # about 4 chunks per process: one message per job costs more than a small job (2 cases at 128^2)
                return pool.map(fn, jobs, chunksize=max(1, len(jobs) // (4 * workers)))

        built = _build(params, map_jobs)
        pool.shutdown(wait=True)  # in the try: a Ctrl-C while the idle workers exit stops them too
    except BrokenProcessPool:  # e.g. a script without `if __name__ == "__main__":` (its children re-run it)
        pool.shutdown(wait=True)
        log.warning(f"{params.source}: the generation processes failed to start; generating in this process")
        return _build(params, map)
    except BaseException:  # Ctrl-C, kill: the workers stop now (a SIGINT to this process alone left them waiting)
        _stop_pool(pool)
        raise
    return built


STOP_WAIT_S = 5.0  # seconds an interrupted pool's workers get to exit (then they are killed), and its thread to end


def _stop_pool(pool: Any) -> None:
    """Stop ``pool`` (a ``ProcessPoolExecutor`` whose ``map`` or ``shutdown`` was interrupted) in bounded time: its
    jobs are dropped, its workers killed (:func:`_stop_workers`), then it is shut down without waiting and its
    manager thread is given :data:`STOP_WAIT_S` seconds to end. Waiting on that thread unbounded hung an interrupted
    ``data synth`` for good in about 1 try in 7. Further Ctrl-C / kill meanwhile are deferred (a second Ctrl-C would
    otherwise leave the workers running); the caller raises its interrupt afterwards.

    Seeing its workers die, the manager thread sets an exception on the jobs left, which map's iterator has
    cancelled: CPython 3.11 then raises (InvalidStateError, or KeyError for a job id whose item is gone) in that
    thread, which prints a traceback after the command's own line. The jobs are dropped first and that thread's
    errors, which only concern jobs nobody waits for, are not printed (while it runs: for good if it outlives the
    wait)."""
    import threading

    from fedseg.interrupts import deferred_interrupts

    manager = getattr(pool, "_executor_manager_thread", None)
    previous = threading.excepthook

    def quiet(args: threading.ExceptHookArgs) -> None:
        if args.thread is not manager:
            previous(args)

    threading.excepthook = quiet
    try:
        with deferred_interrupts():
            _drop_jobs(pool)
            _stop_workers(pool)
            pool.shutdown(wait=False, cancel_futures=True)
            if manager is not None:
                manager.join(STOP_WAIT_S)
    finally:
        if manager is None or not manager.is_alive():
            threading.excepthook = previous


def _drop_jobs(pool: Any) -> None:
    """Empty the queue of jobs ``pool`` has not yet handed to a worker, and its table of pending jobs: nothing is
    sent to a worker again, and the manager thread has no job to fail."""
    import queue

    work_ids = getattr(pool, "_work_ids", None)
    while work_ids is not None:
        try:
            work_ids.get_nowait()
        except queue.Empty:
            break
    pending = getattr(pool, "_pending_work_items", None)
    if isinstance(pending, dict):
        pending.clear()


def _stop_workers(pool: Any) -> None:
    """Terminate the worker processes of ``pool``, then kill those still running after :data:`STOP_WAIT_S` seconds,
    in bounded time, so that the pool's manager thread can end:

    * through their ``multiprocessing`` process objects, which record each exit: a worker reaped behind their back
      (``fedseg.interrupts.stop_processes`` waits with ``os.waitpid``) stays "alive" to the manager thread for
      good, which then loops forever sending it a stop message the full call queue refuses;
    * holding the lock the workers take to send a result, so none dies half-way through one: the manager thread
      would wait forever in ``recv`` for the rest of that message."""
    import time

    processes = list((getattr(pool, "_processes", None) or {}).values())
    results_lock: Any = getattr(getattr(pool, "_result_queue", None), "_wlock", None)
    held = results_lock is not None and results_lock.acquire(timeout=STOP_WAIT_S)
    try:
        for process in processes:
            process.terminate()
        deadline = time.monotonic() + STOP_WAIT_S
        for process in processes:
            process.join(max(0.0, deadline - time.monotonic()))
        for process in processes:
            if process.is_alive():
                process.kill()
                process.join(STOP_WAIT_S)
    finally:
        if held:
            results_lock.release()


@contextlib.contextmanager
def _sigint_blocked() -> Iterator[None]:
    """SIGINT blocked in this thread while the block runs (one arriving meanwhile is handled when it ends): the
    worker processes started meanwhile inherit the mask, so the terminal's Ctrl-C, sent to them too, cannot end one
    with a traceback while it imports, before :func:`_ignore_sigint` runs. Without ``pthread_sigmask`` (Windows) the
    block runs unchanged."""
    import signal

    if not hasattr(signal, "pthread_sigmask"):
        yield
        return
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


def _ignore_sigint() -> None:
    """A generation worker's initializer: Ctrl-C is its parent's to handle (``generate``)."""
    import signal

    signal.signal(signal.SIGINT, signal.SIG_IGN)


def _build(params: BuiltinParams, map_jobs: Callable[..., Iterable[Any]]) -> Federation:
    from fedseg.data.synthetic_brats import SYNTHETIC_BRATS, build_synthetic_brats

    if params.source == SYNTHETIC_BRATS:
        return build_synthetic_brats(params.scale, params.image_size, params.seed, map_jobs)
    from fedseg.data.synthetic import build_synthetic

    return build_synthetic(params.source, params.scale, params.image_size, params.seed, map_jobs)


# --- the cache ----------------------------------------------------------------------------------------------
def cached_builtin(params: BuiltinParams) -> Federation:
    """The built-in federation ``params`` names: from its cache entry if valid, else generated (and written to the
    cache, when it can be written)."""
    root = writable_root()
    if root is None:
        return generate(params)
    entry = root / entry_key(params)
    if entry.is_dir():
        try:
            return read_entry(entry, params)
        except CacheEntryError as e:
            log.warning(f"federation cache entry {entry}: {e}; rebuilding it")
            shutil.rmtree(entry, ignore_errors=True)
    fed = generate(params)
    try:
        write_entry(fed, entry, params)
    except OSError as e:  # e.g. a full disk: the run goes on with the generated federation
        log.warning(f"federation cache entry {entry}: could not be written ({e.strerror or e}); not cached")
        return fed
    try:
        removed, freed = prune(root)
    except OSError as e:  # pruning is housekeeping: the run goes on
        log.warning(f"federation cache {root}: could not remove unused folders ({e.strerror or e})")
        return fed
    if removed:
        log.info(f"federation cache {root}: removed {removed} unused folders ({freed / 1e6:.1f} MB): {PRUNED}")
    return fed


def _crc(array: np.ndarray) -> int:
    return zlib.crc32(np.ascontiguousarray(array).reshape(-1).view(np.uint8).data)


def write_entry(fed: Federation, entry: Path, params: BuiltinParams) -> None:
    """Write ``fed`` as cache entry ``entry`` atomically (a temp folder renamed when complete); an entry written
    meanwhile by another process is kept (theirs holds the same arrays)."""
    tmp = Path(tempfile.mkdtemp(prefix=f"{entry.name}.tmp-{os.getpid()}-", dir=entry.parent))
    try:
        arrays: dict[str, dict[str, Any]] = {}
        sites = []
        for site in fed.sites:
            pairs = [case.arrays() for case in site.cases]
            for kind, stacked in (("images", [p[0] for p in pairs]), ("labels", [p[1] for p in pairs])):
                array = np.stack(stacked)
                file = f"{site.name}.{kind}.npy"
                np.save(tmp / file, array)
                arrays[file] = {"shape": list(array.shape), "dtype": array.dtype.str, "crc32": _crc(array)}
            sites.append(
                {
                    "name": site.name,
                    "meta": site.meta,
                    "fixed_splits": site.fixed_splits,
                    "cases": [{"id": c.id, "meta": dict(c.meta), "spacing": c.spacing} for c in site.cases],
                }
            )
        manifest = {
            "params": params.as_dict(),
            "name": fed.name,
            "kind": fed.kind,
            "channels": fed.channels,
            "regions": fed.regions.as_dict(),
            "label_names": None if fed.label_names is None else {str(k): v for k, v in fed.label_names.items()},
            "sites": sites,
            "arrays": arrays,
        }
        (tmp / MANIFEST).write_text(json.dumps(manifest))
        try:
            tmp.rename(entry)
        except OSError:
            if not entry.is_dir():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def read_entry(entry: Path, params: BuiltinParams) -> Federation:
    """The federation of cache entry ``entry``, every array checked against the manifest (``CacheEntryError``)."""
    try:
        manifest = json.loads((entry / MANIFEST).read_text())
    except (OSError, ValueError) as e:
        raise CacheEntryError(f"{MANIFEST} unreadable ({e})") from None
    if manifest.get("params") != params.as_dict():
        raise CacheEntryError(f"stale: made for {manifest.get('params')}, expected {params.as_dict()}")
    try:
        sites = [_read_site(entry, site, manifest["arrays"]) for site in manifest["sites"]]
        label_names = manifest["label_names"]
        return Federation(
            manifest["name"],
            manifest["kind"],
            int(manifest["channels"]),
            Regions.from_mapping(manifest["regions"]),
            sites,
            None if label_names is None else {int(k): v for k, v in label_names.items()},
        )
    except (KeyError, TypeError) as e:
        raise CacheEntryError(f"{MANIFEST} malformed ({type(e).__name__}: {e})") from None


def _read_site(entry: Path, site: dict, index: dict) -> Site:
    images = _read_array(entry, f"{site['name']}.images.npy", index)
    labels = _read_array(entry, f"{site['name']}.labels.npy", index)
    if len(images) != len(site["cases"]) or len(labels) != len(site["cases"]):
        raise CacheEntryError(f"site {site['name']}: {len(site['cases'])} cases but {len(images)} images")
    cases = [
        Case.from_arrays(case["id"], image, label, spacing=case["spacing"], **case["meta"])
        for case, image, label in zip(site["cases"], images, labels)
    ]
    return Site(site["name"], cases, site["fixed_splits"], site["meta"])


def _read_array(entry: Path, file: str, index: dict) -> np.ndarray:
    """Array ``file`` of ``entry``, checked against its manifest record (shape, dtype, CRC-32)."""
    if file not in index:
        raise CacheEntryError(f"{file}: not in {MANIFEST}")
    try:
        array = np.load(entry / file, allow_pickle=False)
    except (OSError, ValueError, EOFError) as e:
        raise CacheEntryError(f"{file}: unreadable ({e})") from None
    record = index[file]
    if list(array.shape) != record["shape"] or array.dtype.str != record["dtype"]:
        raise CacheEntryError(
            f"{file}: {array.dtype.str} {list(array.shape)}, expected {record['dtype']} {record['shape']}"
        )
    if _crc(array) != record["crc32"]:
        raise CacheEntryError(f"{file}: content digest mismatch (corrupt)")
    return array


# --- fedseg data cache list / clear -------------------------------------------------------------------------
def entries(root: Path) -> list[tuple[str, int, bool]]:
    """``(name, bytes, complete)`` per cache folder under ``root`` (named as :func:`entry_key` names them): entries,
    and temp folders of interrupted writes (a file or folder another process removes meanwhile is not counted).
    Anything else there (a user's folder, in a ``$FEDSEG_CACHE_DIR`` pointed at a shared folder) is not the
    cache's: :func:`others`."""
    if not root.is_dir():
        return []
    out = []
    for path in sorted(root.iterdir()):
        if path.is_dir() and is_cache_folder(path.name):
            out.append((path.name, _size(path), ".tmp-" not in path.name and (path / MANIFEST).is_file()))
    return out


def others(root: Path) -> list[str]:
    """The names under ``root`` that are no cache folder (:func:`entries`): never listed as entries, never removed."""
    if not root.is_dir():
        return []
    return sorted(p.name for p in root.iterdir() if not (p.is_dir() and is_cache_folder(p.name)))


def _size(folder: Path) -> int:
    total = 0
    for f in folder.rglob("*"):
        with contextlib.suppress(OSError):  # gone meanwhile (another run pruning or rebuilding)
            total += f.stat().st_size if f.is_file() else 0
    return total


PRUNED = "entries of older generator versions and the temp folders of interrupted writes"
# entry_key's grammar: <source>-s<scale>-i<size>-seed<seed>-v<generator version>-<8 hex>, and write_entry's temp
# folder <key>.tmp-<pid>-<random>; nothing else in the cache folder is ever pruned
_KEY = r"[a-z0-9][a-z0-9-]*-s[0-9.e+-]+-i\d+-seed-?\d+-v(\d+)-[0-9a-f]{8}"
_ENTRY = re.compile(rf"^{_KEY}$")
_TEMP = re.compile(rf"^{_KEY}\.tmp-(\d{{1,9}})-[A-Za-z0-9_]+$")


def is_cache_folder(name: str) -> bool:
    """Whether ``name`` is an entry's (:func:`entry_key`) or the temp folder of an entry's write."""
    return bool(_ENTRY.match(name) or _TEMP.match(name))


def unused(root: Path, name: str) -> bool:
    """Whether the cache folder ``root/name`` can never be read again: an entry whose key and manifest both say
    a generator version older than :data:`GENERATOR_VERSION` (a newer one may belong to a newer fedseg sharing
    the folder: kept), or the temp folder of a write whose process is gone (an interrupted or killed run; a
    cache shared by several machines cannot tell, so there a folder is only removed by ``fedseg data cache
    clear``: set ``$FEDSEG_CACHE_DIR`` per machine). A name that does not follow :func:`entry_key` is never
    unused."""
    from fedseg.interrupts import is_running

    temp = _TEMP.match(name)
    if temp:
        return not is_running(int(temp.group(2)))
    entry = _ENTRY.match(name)
    if entry is None or int(entry.group(1)) >= GENERATOR_VERSION:
        return False
    try:
        recorded = json.loads((root / name / MANIFEST).read_text())["params"]["generator_version"]
    except (OSError, ValueError, KeyError, TypeError):
        return False  # not an entry fedseg wrote: left alone
    return isinstance(recorded, int) and recorded == int(entry.group(1))


def prune(root: Path) -> tuple[int, int]:
    """Remove the :func:`unused` folders under ``root`` (after each new entry is written, so a cache does not grow
    with every generator version): ``(folders removed, bytes freed)``. Best effort: a folder that another process
    removes meanwhile, or that cannot be removed, is skipped."""
    found = [(name, size) for name, size, _ in entries(root) if unused(root, name)]
    for name, _ in found:
        shutil.rmtree(root / name, ignore_errors=True)
    return len(found), sum(size for _, size in found)


def clear(root: Path) -> tuple[int, int]:
    """Remove every entry (and temp folder) under ``root``, nothing else there (:func:`others`): ``(folders
    removed, bytes freed)``."""
    found = entries(root)
    for name, _, _ in found:
        shutil.rmtree(root / name, ignore_errors=True)
    return len(found), sum(size for _, size, _ in found)
