"""Where the sites' state stores live: in RAM (default) or in one safetensors file per site on disk.

A site's *state store* is what its client keeps between messages: personalized models, control
variates, optimizer moments (``ClientContext.state``: ``{name: tensor}``). Every engine that keeps
the stores itself (the in-process :class:`fedseg.engine.simulator.Simulator` and the worker pool
:class:`fedseg.engine.pool.PoolEngine`; on Flower they live on the nodes) keeps them in one
:class:`StateStore`:

* ``load(site)`` hands out a fresh dict the client may change (add, replace, delete entries) while it
  answers; ``save(site, state)`` makes it the site's store. An engine saves only after the client
  returned, so a site that fails keeps the store it had (the simulator's semantics since issue 17).
* ``engine.state: memory`` (default): the dicts stay in RAM (``memory``); no copy is made.
* ``engine.state: disk``: every store is a file ``<folder>/<site>.safetensors`` holding exactly that
  site's entries (nothing else: no other site's, no metadata of the run), written atomically (temp file
  + rename, :func:`fedseg.atomic_files.atomic_write_bytes`), so only the stores of the sites being
  answered are in RAM. ``engine.memory_budget_mb``: stores stay in RAM while their total fits the
  budget; a store that does not fit goes to disk.

safetensors keeps every tensor's dtype, shape and bits, so where a store lives never changes a result.

Checkpoints and best-round selection use ``snapshot`` / ``restore``. A store in RAM is deep-copied; a
store on disk is not read at all: its file is hard-linked (copied where links are impossible) into
``<folder>/snapshots/<n>/`` and the snapshot holds only a token naming ``n`` for that site
(``{SNAPSHOT_KEY: tensor(n)}``), so a checkpoint of 100 sites' stores on disk costs no RAM. A store file
is never changed in place (``save`` writes a new file and renames it), so the link keeps the snapshot's
bits. ``release(kept)`` deletes the snapshots taken before the ones a checkpoint on disk names
(``BaseEngine.checkpointed``); ``close`` (the algorithm finished) deletes them all.
"""

from __future__ import annotations

import os
import re
import shutil
import zlib
from pathlib import Path
from typing import BinaryIO

import torch
from safetensors.torch import load_file, save

from fedseg.atomic_files import atomic_write_bytes
from fedseg.config import RunConfig

State = dict[str, torch.Tensor]
ClientStates = dict[str, State]

SUFFIX = ".safetensors"
SNAPSHOT_KEY = "disk_snapshot"  # a site's entry in a snapshot of a store on disk: {SNAPSHOT_KEY: tensor(n)}


TENSORS_ONLY = "a method's state holds tensors only"


def state_problem(state: object, owner: str) -> str | None:
    """Why ``state`` (``owner``: how the method names it, ``ctx.state`` or ``FedAvgMServer.state_dict()``) cannot be
    a method's state, or None: it must map names (str) to tensors, which every engine can copy, checkpoint, write to
    safetensors (``engine.state: disk``) and send between processes bit for bit. One line: the first entry that
    is not, what it is and what to keep instead (a count as ``torch.tensor(n)``, a nested dict's tensors under
    ``'<key>/<name>'`` keys)."""
    if not isinstance(state, dict):
        return f"{owner} is a {type(state).__name__}, not a dict of tensors ({TENSORS_ONLY})"
    for key, value in state.items():
        if not isinstance(key, str):
            return f"{owner} has the key {key!r}, a {type(key).__name__}: {TENSORS_ONLY}, under names (str)"
        if isinstance(value, torch.Tensor):
            continue
        kind = type(value).__name__
        if isinstance(value, (bool, int, float)):
            hint = f"keep a number as torch.tensor({value!r})"
        elif isinstance(value, dict):
            hint = (
                f"put a nested dict's tensors under '{key}/<name>' keys: "
                f"fedseg.engine.messages.prefixed({key!r}, ...), read back with Message(state).group({key!r})"
            )
        elif isinstance(value, (list, tuple)):
            hint = f"stack them into one tensor, or give each its own key ('{key}/0', ...)"
        else:
            hint = "convert it to a tensor"
        article = "an" if kind[:1].lower() in "aeiou" else "a"
        return f"{owner}[{key!r}] is {article} {kind}; {TENSORS_ONLY} ({hint})"
    return None


def state_bytes(state: State) -> int:
    """Bytes held by the tensors of one store (``numel * element_size`` summed)."""
    return sum(t.numel() * t.element_size() for t in state.values())


def site_file_name(site: str) -> str:
    """The file name of ``site``'s store: the site name, or where it has characters other than ``[A-Za-z0-9._-]``
    those replaced by ``_`` and the name's CRC-32 appended (so two sites never share a file)."""
    clean = re.sub(r"[^A-Za-z0-9._-]", "_", site)
    return (clean if clean == site else f"{clean}-{zlib.crc32(site.encode()):08x}") + SUFFIX


def _writable(state: State) -> State:
    """``state`` as safetensors can write it: CPU, contiguous, no two entries sharing memory (copies
    only where needed)."""
    seen: set[int] = set()
    out = {}
    for name, t in state.items():
        t = t.detach()
        storage = t.untyped_storage()
        ptr = storage.data_ptr()
        whole = storage.nbytes() == t.numel() * t.element_size() and t.is_contiguous()
        if t.device.type != "cpu" or not whole or (ptr in seen and t.numel()):
            t = t.to("cpu").contiguous().clone()
        seen.add(t.untyped_storage().data_ptr())
        out[name] = t
    return out


class StateStore:
    """Every site's state store, in RAM or on disk (module docstring).

    ``folder`` None: RAM only. Else ``budget_bytes`` None or 0: every non-empty store on disk under
    ``folder``; > 0: in RAM while the stores there total at most that many bytes, the rest on disk.
    Stale files of these sites in ``folder`` (left by an earlier run) are removed."""

    def __init__(self, sites: list[str], folder: Path | None = None, budget_bytes: int | None = None):
        self.sites = list(sites)
        self.folder = None if folder is None else Path(folder)
        self.budget = budget_bytes or 0
        self.memory: ClientStates = {s: {} for s in self.sites}  # the stores kept in RAM (live dicts)
        self.on_disk: set[str] = set()
        if self.folder is not None:  # snapshots stay: a resumed run's checkpoint may name them
            for site in self.sites:
                self.path(site).unlink(missing_ok=True)
        self._next = 1 + max(self.snapshot_numbers(), default=0)

    @property
    def spills(self) -> bool:
        """Whether stores may go to disk."""
        return self.folder is not None

    def path(self, site: str) -> Path:
        assert self.folder is not None
        return self.folder / site_file_name(site)

    def load(self, site: str) -> State:
        """A new dict with ``site``'s entries (tensors shared with the store in RAM: replace, never change
        them in place)."""
        if site in self.on_disk:
            return load_file(self.path(site))
        return dict(self.memory[site])

    def save(self, site: str, state: State) -> None:
        """Make ``state`` ``site``'s store (in RAM or, see the class docstring, in its file)."""
        self.memory.pop(site, None)
        if not self.spills or not state or self.fits_in_ram(state):
            self.memory[site] = state
            if site in self.on_disk:
                self.on_disk.discard(site)
                self.path(site).unlink(missing_ok=True)
            return
        blob = save(_writable(state))
        atomic_write_bytes(self.path(site), lambda f: f.write(blob))
        self.on_disk.add(site)

    def fits_in_ram(self, state: State) -> bool:
        """Whether ``state`` fits the memory budget beside the stores kept in RAM (never without a budget)."""
        return self.budget > 0 and sum(state_bytes(s) for s in self.memory.values()) + state_bytes(state) <= self.budget

    # --- snapshots (module docstring) -----------------------------------------------------------------
    def snapshot_folder(self, number: int) -> Path:
        assert self.folder is not None
        return self.folder / "snapshots" / str(number)

    def snapshot_numbers(self) -> list[int]:
        root = None if self.folder is None else self.folder / "snapshots"
        return sorted(int(p.name) for p in root.iterdir() if p.name.isdigit()) if root and root.is_dir() else []

    def snapshot(self) -> ClientStates:
        """Every site's store as it is now (a checkpoint's ``clients``): a deep copy of a store in RAM, a token
        naming a linked copy of a store's file on disk."""
        number, states = self._next, {}
        for site in self.sites:
            if site not in self.on_disk:
                states[site] = {k: v.clone() for k, v in self.memory[site].items()}
                continue
            target = self.snapshot_folder(number) / site_file_name(site)
            target.parent.mkdir(parents=True, exist_ok=True)
            try:
                os.link(self.path(site), target)
            except OSError:  # a file system without hard links
                shutil.copyfile(self.path(site), target)
            states[site] = {SNAPSHOT_KEY: torch.tensor(number)}
        if any(SNAPSHOT_KEY in st for st in states.values()):
            self._next += 1
        return states

    def restore(self, states: ClientStates) -> None:
        """Make ``states`` (from ``snapshot``) the stores; a site missing from it gets an empty store."""
        for site in self.sites:
            state = states.get(site, {})
            if SNAPSHOT_KEY not in state:
                self.save(site, {k: v.clone() for k, v in state.items()})
                continue
            source = self.snapshot_folder(int(state[SNAPSHOT_KEY])) / site_file_name(site)
            if not source.is_file():
                raise FileNotFoundError(
                    f"{source}: missing (site {site!r}'s state store of a checkpoint); cannot resume"
                )
            self.memory.pop(site, None)

            def copy(f: BinaryIO, source: Path = source) -> None:
                f.write(source.read_bytes())

            atomic_write_bytes(self.path(site), copy)
            self.on_disk.add(site)

    def release(self, kept: list[ClientStates]) -> None:
        """Delete the snapshots older than the newest one ``kept`` names, except those it names."""
        named = {int(st[SNAPSHOT_KEY]) for token in kept for st in token.values() if SNAPSHOT_KEY in st}
        for number in self.snapshot_numbers():
            if named and number not in named and number < max(named):
                shutil.rmtree(self.snapshot_folder(number), ignore_errors=True)

    def close(self) -> None:
        """Remove the store files, and their folder and its parent if that leaves them empty (the run keeps what
        it needs in its checkpoints)."""
        if self.folder is None:
            return
        for site in list(self.on_disk):
            self.path(site).unlink(missing_ok=True)
        self.on_disk.clear()
        shutil.rmtree(self.folder / "snapshots", ignore_errors=True)
        for folder in (self.folder, self.folder.parent):  # OUT/states/<algorithm>, then OUT/states, when empty
            if folder.is_dir() and not any(folder.iterdir()):
                folder.rmdir()


def state_store(cfg: RunConfig, sites: list[str], folder: Path) -> StateStore:
    """The store ``cfg.engine`` asks for (``state``, ``memory_budget_mb``); ``folder``: where files go."""
    engine, budget_mb = cfg.engine, cfg.engine.memory_budget_mb
    if engine.state == "memory" and budget_mb is None:
        return StateStore(sites)
    budget = 0 if engine.state == "disk" or budget_mb is None else int(budget_mb * 1e6)
    return StateStore(sites, folder, budget)
