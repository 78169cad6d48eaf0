"""Refusing, early and in one line, a run whose prepared cases will not fit in memory.

A run prepares every site's cases into memory before round 1 (``fedseg.data.dataset.build_site_data``): at FeTS
2022's scale (1251 BraTS cases, about 140 MB each on the volume path) that is some 170 GB, and the process was killed
for memory after an hour of preparation. :class:`MemoryGuard` measures, while the cases are prepared, the bytes the
process keeps of each (:func:`held_bytes`); once :func:`first_cases` of them are in (8, or 2% of the cases where that
is more), after each further case and at each site's end, it projects every case of every site this process
prepares (:meth:`MemoryGuard.projected`: the training cases still to come at the training cases' mean so far, the
validation and test cases, which keep their truth too, at theirs),
and where that exceeds :data:`MARGIN` (90%) of the memory the process could have when its preparation started
(:func:`memory_available`) it raises :class:`NotEnoughMemory` (a ``ValueError``: ``fedseg run`` prints it as its one
``error:`` line) before preparing further. The margin is for what the projection leaves out: the cases being prepared
(several times their prepared size for a moment, one per preparation thread), the foreground index a volume builds
when training first draws a patch from it, the model and training's batches. Nothing is checked once every case is
in (the last site's end: refusing then frees nothing that is not already held).

What a case holds (bytes): its model-size view ``x`` ``(C, *S)`` and masks ``y`` ``(R, *S)`` (float32: its share of
its set's stacks, ``CaseSet.x``/``y``), its original-grid truth on the whole-image path packed one bit a voxel
(``fedseg.data.packed.PackedMasks``), and on the volume path its ``Volume``'s image, label and (validation and test
cases) truth: the bytes of their storages, or none for a volume mapped from the prepared-case cache
(``$FEDSEG_PREPARED_CACHE``, ``fedseg.data.prepared``: page cache the system can drop and re-read, not the process's
own memory), except on the worker pool (``engine.workers`` > 1), where a mapped volume is copied once into shared
memory for every worker (``Volume.__getstate__``): one copy then, as a held volume, which crosses to the workers
once, as shared memory. Who prepares: the process that runs (the simulator and the worker pool: the main process,
for every site, one guard over them all, ``fedseg.run.preparation.prepared_sites``) or a Flower SuperNode (its own
site: the guard ``build_site_data`` makes when given none).

Available (bytes): ``MemAvailable`` of ``/proc/meminfo`` when the preparation starts, capped by the headroom of the
process's cgroup (:func:`cgroup_memory_headroom`: a container's or a Kubernetes pod's memory limit). Without
``/proc/meminfo`` (macOS, Windows) nothing is checked. ``FEDSEG_MEMORY_CHECK=off`` skips the check (swap to spare,
or a measure you trust more): an environment variable, not a config key, since it changes no result (as
``$FEDSEG_PREPARED_CACHE``), so it enters neither the run's digest nor a resume's checks. Runs preparing at once
share that memory, and each would see all of it free: ``fedseg bench --jobs N`` (``fedseg.bench.execute``) sets in
each of its run processes ``FEDSEG_MEMORY_SHARE=N`` (:data:`MEMORY_SHARE_ENV`: the runs at once) and
``FEDSEG_MEMORY_SHARED=B`` (:data:`MEMORY_SHARED_ENV`: the bytes :func:`memory_available` gave the bench as it
started them), and a process so told may take ``B/N``, or what it finds available where that is less
(:func:`memory_share`, :meth:`MemoryGuard.start`): N runs each judged to fit then fit together. ``B`` is measured
once, by the bench, not by each run as it starts: a run started while others hold their cases would see only what
they left and, dividing that by N again, be refused though it fits. Without ``FEDSEG_MEMORY_SHARED`` (set by hand,
e.g. for runs started side by side by a script) the share is 1/N of what the process finds available. The check
never changes a tensor: it only measures, and raises or not. A refusal leaves what any preparation that fails
leaves: a new ``--out`` not made (``fedseg.run.experiment`` makes it after the preparation), the cases stored in the
prepared-case cache so far. The line's MB and GB are 10^6 and 10^9 bytes.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

import torch

from fedseg.data.federation import Case
from fedseg.data.prefetch import cgroup_folders
from fedseg.data.prepared import PREPARED_CACHE_ENV, PreparedCase, cache_root, case_files

MEMORY_CHECK_ENV = "FEDSEG_MEMORY_CHECK"
MEMORY_SHARE_ENV = "FEDSEG_MEMORY_SHARE"  # N: this process is one of N runs at once, which share the memory
MEMORY_SHARED_ENV = "FEDSEG_MEMORY_SHARED"  # bytes the N share (measured by the bench as it started them)
OFF = ("off", "0", "false", "no")  # $FEDSEG_MEMORY_CHECK values that skip the check (any case)
MARGIN = 0.9  # refuse where the projection exceeds this share of the memory available
FIRST_CASES, FIRST_SHARE = 8, 0.02  # the early projection: after this many cases, or this share of them if more
NO_LIMIT = 2**60  # a cgroup v1 limit at least this large is none (unlimited reads 9223372036854771712)
MEMINFO = Path("/proc/meminfo")
CGROUPS, CGROUP_ROOT = Path("/proc/self/cgroup"), Path("/sys/fs/cgroup")


class NotEnoughMemory(ValueError):
    """A run whose prepared cases are projected not to fit in memory (the message says the numbers and what to do)."""


def check_off() -> bool:
    """Whether ``$FEDSEG_MEMORY_CHECK`` turns the check off (:data:`OFF`)."""
    return os.environ.get(MEMORY_CHECK_ENV, "").strip().lower() in OFF


def meminfo_available(meminfo: Path | None = None) -> int | None:
    """``MemAvailable`` of ``meminfo`` (default :data:`MEMINFO`, ``/proc/meminfo``) in bytes: the memory the system
    can give without swapping (free, and page cache it can drop); None where the file or the field is missing."""
    try:
        text = (meminfo or MEMINFO).read_text()
    except OSError:
        return None
    for line in text.splitlines():
        name, _, value = line.partition(":")
        if name == "MemAvailable":
            number, *unit = value.split()
            try:
                return int(number) * (1024 if unit == ["kB"] else 1)
            except ValueError:
                return None
    return None


def cgroup_memory_headroom(cgroups: Path | None = None, root: Path | None = None) -> int | None:
    """Bytes this process's cgroups let it take more, the least along its cgroup and their parents, or None where
    none sets a limit (or none can be read: not Linux). Per cgroup: its limit less its usage, plus the page cache it
    would drop first (``inactive_file``: Kubernetes' "working set" rule). cgroup v2: ``memory.max`` (``max``: none),
    ``memory.current``, ``memory.stat``'s ``inactive_file``; v1: ``memory.limit_in_bytes`` (:data:`NO_LIMIT` or more:
    none), ``memory.usage_in_bytes``, ``memory.stat``'s ``total_inactive_file``. ``cgroups``: the process's cgroup
    list (default :data:`CGROUPS`); ``root``: where they are mounted (default :data:`CGROUP_ROOT`); the folders as
    for the CPU quota (``fedseg.data.prefetch.cgroup_folders``)."""
    folders = cgroup_folders("memory", cgroups or CGROUPS, root or CGROUP_ROOT)
    found = [h for folder, v2 in folders if (h := _headroom(folder, v2)) is not None]
    return min(found) if found else None


def _headroom(folder: Path, v2: bool) -> int | None:
    """One cgroup folder's headroom (:func:`cgroup_memory_headroom`), or None (no file, no limit, unreadable)."""
    limit_file, usage_file, inactive = (
        ("memory.max", "memory.current", "inactive_file")
        if v2
        else ("memory.limit_in_bytes", "memory.usage_in_bytes", "total_inactive_file")
    )
    limit = _number(folder / limit_file)
    if limit is None or limit >= NO_LIMIT:
        return None
    usage = _number(folder / usage_file) or 0
    try:
        stat = dict(line.split()[:2] for line in (folder / "memory.stat").read_text().splitlines() if " " in line)
        dropped = int(stat.get(inactive, 0))
    except (OSError, ValueError):
        dropped = 0
    return max(0, limit - usage + min(dropped, usage))


def _number(file: Path) -> int | None:
    try:
        return int(file.read_text().strip())
    except (OSError, ValueError):  # missing, unreadable, or "max"
        return None


def memory_available() -> tuple[int, str] | None:
    """The bytes this process can take (:func:`meminfo_available` capped by :func:`cgroup_memory_headroom`) and
    what says so (``MemAvailable`` or ``its cgroup's memory limit``), or None where ``/proc/meminfo`` cannot say."""
    available = meminfo_available()
    if available is None:
        return None
    headroom = cgroup_memory_headroom()
    if headroom is not None and headroom < available:
        return headroom, "the headroom its cgroup's memory limit leaves"
    return available, "MemAvailable"


@dataclass(frozen=True)
class Share:
    """This process's share of the memory (:func:`memory_share`): one of ``runs`` runs at once, sharing ``shared``
    bytes (None: what the process finds available)."""

    runs: int
    shared: int | None = None


def _whole(name: str, least: int) -> int | None:
    """``$name`` as a whole number of at least ``least``, None where unset or empty; a ValueError (one line) else."""
    text = os.environ.get(name, "").strip()
    if not text:
        return None
    number = int(text) if text.isascii() and text.isdigit() else least - 1  # int() reads "1_0" and "+2" too
    if number < least:
        raise ValueError(
            f"{name}={text!r}: not a whole number of at least {least} ({MEMORY_SHARE_ENV}: how many runs share this "
            f"machine's memory at once; {MEMORY_SHARED_ENV}: the bytes they share; fedseg bench --jobs sets both)"
        )
    return number


def memory_share() -> Share | None:
    """This process's share (module docstring): ``$FEDSEG_MEMORY_SHARE`` runs at once sharing
    ``$FEDSEG_MEMORY_SHARED`` bytes, or None where unset or 1 (the process has the memory to itself); a ValueError
    (one line naming the variable) for a value that is not a whole number, or ``$FEDSEG_MEMORY_SHARED`` alone."""
    runs, shared = _whole(MEMORY_SHARE_ENV, 1), _whole(MEMORY_SHARED_ENV, 1)
    if runs is None and shared is not None:
        raise ValueError(f"{MEMORY_SHARED_ENV} is set without {MEMORY_SHARE_ENV} (how many runs share its bytes)")
    return Share(runs, shared) if runs is not None and runs > 1 else None


def shared_available(available: tuple[int, str] | None, share: Share | None) -> tuple[int, str] | None:
    """``available`` (:func:`memory_available`) under ``share``: its ``shared`` bytes (else ``available``'s) over its
    runs, and what says so, where that is less than ``available`` (else ``available``: the process cannot take more
    than it finds, share or not)."""
    if available is None or share is None:
        return available
    whole, what = (share.shared, "what the bench found available") if share.shared is not None else available
    part = whole // share.runs
    if part >= available[0]:
        return available
    return (
        part,
        f"this job's 1/{share.runs} share of the {whole / 1e9:.3g} GB of {what}, {MEMORY_SHARE_ENV}={share.runs}",
    )


def storage_bytes(tensors: Iterable[torch.Tensor]) -> int:
    """Bytes of the distinct storages behind ``tensors`` (a view keeps its whole storage alive)."""
    storages = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in tensors}
    return sum(storages.values())


def held_bytes(prepared: PreparedCase, mapped_copies: int = 0) -> tuple[int, int]:
    """``(bytes held, of which its volume's)`` of one prepared case (module docstring): its views ``x``/``y``, its
    packed original-grid truth, its volume's storages (a volume mapped from the prepared-case cache: ``mapped_copies``
    copies of its tensors: 1 on the worker pool, else 0)."""
    held = prepared.x.nbytes + prepared.y.nbytes
    if prepared.truth is not None:
        held += (prepared.truth.size + 7) // 8  # PackedMasks: one bit a voxel, each mask from a byte
    volume = prepared.volume
    if volume is None:
        return held, 0
    tensors = [t for t in (volume.image, volume.label, volume.truth) if t is not None]
    vol = mapped_copies * sum(t.nbytes for t in tensors) if volume.mapped else storage_bytes(tensors)
    return held + vol, vol


def first_cases(cases: int) -> int:
    """After how many of ``cases`` cases the early projection is made: :data:`FIRST_CASES`, or :data:`FIRST_SHARE`
    of them where that is more."""
    return max(FIRST_CASES, math.ceil(FIRST_SHARE * cases))


@dataclass
class MemoryGuard:
    """The check of one process's preparation (module docstring). ``cases``: every case of every site it prepares,
    ``scored_cases`` of them validation or test cases (which also keep their truth); ``sites``: how many sites;
    ``available``: bytes it may take and what says so, None for no check; ``mapped_copies``: copies kept of a volume
    mapped from the cache (1 on the worker pool, else 0). :meth:`add` each prepared case, :meth:`site_done` at each
    site's end: either raises :class:`NotEnoughMemory`."""

    cases: int
    sites: int = 1
    available: tuple[int, str] | None = None
    mapped_copies: int = 0
    scored_cases: int = 0
    share: Share | None = None  # set where available is this process's share (shared_available)
    measured: int = 0  # cases measured so far
    held: int = 0  # bytes they hold
    volumes: int = 0  # of which their volumes'
    scored: int = 0  # of the cases measured, the validation and test ones
    scored_held: int = 0  # bytes those hold
    _last: Case | None = field(default=None, repr=False)

    @classmethod
    def start(cls, cases: int, sites: int = 1, workers: int = 1, scored_cases: int = 0) -> MemoryGuard:
        """A guard for ``cases`` cases (``scored_cases`` of them validation or test) over ``sites`` sites, run on
        ``workers`` worker processes (1: the simulator, a Flower SuperNode), with the memory available now (none
        checked under ``FEDSEG_MEMORY_CHECK=off``): this process's share of it where it is one of several runs
        at once (:func:`memory_share`, set by ``fedseg bench --jobs``)."""
        if check_off():
            return cls(cases, sites, None, 1 if workers > 1 else 0, scored_cases)
        share, available = memory_share(), memory_available()
        shared = shared_available(available, share)
        return cls(
            cases, sites, shared, 1 if workers > 1 else 0, scored_cases, share if shared is not available else None
        )

    def add(self, prepared: PreparedCase, case: Case, scored: bool = False) -> None:
        """Count ``prepared`` (of ``case``, a validation or test case if ``scored``); from :func:`first_cases` cases
        on, check after each (a site of larger cases than the first ones is refused at its first cases, not after it
        filled the memory)."""
        if self.available is None:
            return
        held, volume = held_bytes(prepared, self.mapped_copies)
        self.measured += 1
        self.held += held
        self.volumes += volume
        if scored:
            self.scored += 1
            self.scored_held += held
        self._last = case
        if self.measured >= first_cases(self.cases):
            self.check()

    def site_done(self) -> None:
        """A site's cases are all in: check (unless every case is)."""
        self.check()

    def projected(self) -> float:
        """Bytes all :attr:`cases` would hold: those measured, and each case still to come at the mean of its kind
        so far (training; validation and test, which keep their truth too: about 30% more at BraTS size, many times
        more on the whole-image path with large originals), at the mean of all measured while none of its kind is."""
        mean = self.held / self.measured
        trained, train_held = self.measured - self.scored, self.held - self.scored_held
        train_mean = train_held / trained if trained else mean
        scored_mean = self.scored_held / self.scored if self.scored else mean
        scored_left = max(0, self.scored_cases - self.scored)
        train_left = max(0, self.cases - self.measured - scored_left)
        return self.held + train_left * train_mean + scored_left * scored_mean

    def check(self) -> None:
        """Raise :class:`NotEnoughMemory` where :meth:`projected` exceeds :data:`MARGIN` of the memory available;
        nothing when none is measured, every case is in, or there is no check."""
        if self.available is None or not self.measured or self.measured >= self.cases:
            return
        projected = self.projected()
        if projected > MARGIN * self.available[0]:
            raise NotEnoughMemory(self.refusal(projected))

    def refusal(self, projected: float) -> str:
        """The one line of a refusal: the numbers, then what to do."""
        assert self.available is not None
        available, source = self.available
        per_case = projected / self.cases
        return (
            f"not enough memory to prepare this run's {self.cases} cases: at {per_case / 1e6:.3g} MB a case "
            f"(projected from the first {self.measured}) they would hold about {projected / 1e9:.3g} GB, more "
            f"than {MARGIN:.0%} of the {available / 1e9:.3g} GB this process can have ({source}); "
            f"to fit them: {', '.join(self.remedies())}; {MEMORY_CHECK_ENV}=off skips this check (with swap to spare)"
        )

    def remedies(self) -> list[str]:
        """What would make the cases fit, most effective first."""
        said = []
        if self.volumes * 2 >= self.held:  # the volumes are most of it
            cached = cache_root() is not None
            if not cached and not self.mapped_copies and self._last and case_files(self._last) is not None:
                said.append(
                    f"set {PREPARED_CACHE_ENV}=DIR (a folder with room) to map the volumes from its files instead of "
                    "holding them"
                )
            if cached and self.mapped_copies:
                said.append("--workers 1 (the worker pool keeps a copy of the volumes mapped from the cache)")
            said.append("a coarser data.volume.spacing (fewer voxels per case)")
        else:
            said.append("a smaller data.image_size")
        if self.sites > 1:
            said.append("fewer sites")
        if self.share:
            said.append(f"fewer runs at once (fedseg bench --jobs below {self.share.runs})")
        return [*said, "or a machine with more memory"]
