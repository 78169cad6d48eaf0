"""Where a SuperNode keeps the snapshots of its site's state store (best-round selection, checkpoints, resume).

The coordinator's checkpoint of round ``t`` names, for every site, the snapshot ``t`` of that site's
state store (a token, ``fedseg.flower.engine.SNAPSHOT_KEY``); the best round's checkpoint entry names
the snapshot of that round. The snapshots themselves never leave the site. Each snapshot request says
which tags the coordinator may still ask for (``keep``); every other tag is deleted then.

- :class:`ContextSnapshots` (default): in Flower's ``Context.state`` of the run. They live as long as
  the Flower run: enough for best-round selection, not for a resume (a resumed run is a new Flower run
  with a fresh ``Context``).
- :class:`DiskSnapshots` (SuperNode started with ``--state DIR``): one safetensors file per (algorithm,
  tag) under ``DIR/<run key>/<algorithm>/``, written atomically. They outlive the SuperNode and the
  coordinator, so ``fedseg flower server|local --resume`` can continue the run: the coordinator asks
  each site to restore the snapshot its last checkpoint names. The run key (run config
  ``fedseg-run-key``) names the experiment across Flower runs; the files hold nothing but this site's
  own state store.

When an algorithm has finished (its finished checkpoint on the coordinator's disk), the coordinator asks every site
to ``release`` it: its snapshots are deleted (on disk, its folder, and the run's folder once empty), so a site's
``--state`` holds only what an unfinished run may still need.
"""

from __future__ import annotations

import hashlib
import re
import shutil
from pathlib import Path
from typing import TYPE_CHECKING

from flwr.app import Context

if TYPE_CHECKING:  # PyTorch is imported by the first snapshot, not by the node's info query
    import torch

SNAP = "fedseg.snap."  # Context.state slot prefix: fedseg.snap.<algorithm>@<tag> (+ ".index")


class SnapshotMissing(ValueError):
    """The coordinator asked for a snapshot this node does not have."""


class ContextSnapshots:
    """Snapshots in the run's ``Context.state`` (lost when the Flower run ends)."""

    def __init__(self, context: Context):
        self.context = context

    def _slot(self, algorithm: str, tag: int) -> str:
        return f"{SNAP}{algorithm}@{tag}"

    def tags(self, algorithm: str) -> list[int]:
        prefix = f"{SNAP}{algorithm}@"
        tags = (k[len(prefix) :] for k in self.context.state if k.startswith(prefix))
        return sorted(int(t) for t in tags if t.lstrip("-").isdigit())

    def save(self, algorithm: str, tag: int, state: dict[str, torch.Tensor]) -> None:
        from fedseg.flower.records import pack

        slot = self._slot(algorithm, tag)
        self.context.state[slot], self.context.state[slot + ".index"] = pack(state)

    def load(self, algorithm: str, tag: int) -> dict[str, torch.Tensor]:
        from fedseg.flower.records import unpack

        slot = self._slot(algorithm, tag)
        if slot not in self.context.state:
            raise SnapshotMissing(
                f"no snapshot of round {tag} of {algorithm!r} on this node (has {self.tags(algorithm) or 'none'}); "
                "to resume a Flower run, start every SuperNode with --state DIR (a folder kept across restarts)"
            )
        return unpack(self.context.state.array_records[slot], self.context.state.config_records[slot + ".index"])

    def delete(self, algorithm: str, tag: int) -> None:
        slot = self._slot(algorithm, tag)
        for key in (slot, slot + ".index"):
            if key in self.context.state:
                del self.context.state[key]

    def release(self, algorithm: str) -> None:
        """Drop every snapshot of ``algorithm`` (it finished: nothing will be restored)."""
        prune(self, algorithm, set())

    def forget_others(self, algorithm: str) -> None:
        """Drop the snapshots of the run's other algorithms (they run one after another)."""
        for key in list(self.context.state):
            if key.startswith(SNAP) and not key.startswith(f"{SNAP}{algorithm}@"):
                del self.context.state[key]


def run_folder_name(run_key: str) -> str:
    """A file-system-safe folder name for a run key (readable prefix + digest)."""
    readable = re.sub(r"[^A-Za-z0-9_.-]+", "-", run_key)[-40:].strip("-.") or "run"
    return f"{readable}-{hashlib.sha256(run_key.encode()).hexdigest()[:12]}"


SAFE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")  # a folder name of --state: an algorithm's registered name


class DiskSnapshots:
    """Snapshots as ``ROOT/<run folder>/<algorithm>/round-<tag>.safetensors`` (``ROOT``: the node's ``--state``)."""

    def __init__(self, root: Path, run_key: str):
        if not run_key:
            raise ValueError("the run config has no fedseg-run-key: this run cannot keep snapshots on disk")
        self.folder = Path(root) / run_folder_name(run_key)

    def _algorithm_folder(self, algorithm: str) -> Path:
        """``ROOT/<run folder>/<algorithm>``; a ``ValueError`` for a name that is no plain folder name (a path, ``..``:
        the name comes from the coordinator's message, and must never reach outside this run's folder), or when the
        run's folder or this one is a symbolic link (one planted in ``--state`` would send snapshot writes and
        deletions elsewhere)."""
        if not SAFE_NAME.fullmatch(algorithm) or algorithm in (".", ".."):
            raise ValueError(f"algorithm {algorithm!r}: not a plain name; no snapshot folder is made of it")
        for folder in (self.folder, self.folder / algorithm):
            if folder.is_symlink():
                raise ValueError(f"{folder}: a symbolic link in --state; snapshots are kept in real folders only")
        return self.folder / algorithm

    def _path(self, algorithm: str, tag: int) -> Path:
        if isinstance(tag, bool) or not isinstance(tag, int) or tag < 0:
            raise ValueError(f"snapshot tag {tag!r}: expected a round number (an integer >= 0)")
        return self._algorithm_folder(algorithm) / f"round-{tag}.safetensors"

    def tags(self, algorithm: str) -> list[int]:
        folder = self._algorithm_folder(algorithm)
        if not folder.is_dir():
            return []
        return sorted(int(p.stem.removeprefix("round-")) for p in folder.glob("round-*.safetensors"))

    def save(self, algorithm: str, tag: int, state: dict[str, torch.Tensor]) -> None:
        from safetensors.torch import save

        from fedseg.atomic_files import atomic_write_bytes

        data = save({k: v.contiguous() for k, v in state.items()}) if state else save({})
        path = self._path(algorithm, tag)
        # the site's own models (its best local, Ditto/FedPer/FedBN's personal ones): its owner's alone, as the
        # samples and prepared cases are
        self.folder.mkdir(parents=True, exist_ok=True, mode=0o700)
        path.parent.mkdir(exist_ok=True, mode=0o700)
        atomic_write_bytes(path, lambda f: f.write(data), private=True)

    def load(self, algorithm: str, tag: int) -> dict[str, torch.Tensor]:
        from safetensors.torch import load_file

        path = self._path(algorithm, tag)
        if not path.is_file():
            raise SnapshotMissing(
                f"{path}: no snapshot of round {tag} of {algorithm!r} (this node's --state folder has "
                f"{self.tags(algorithm) or 'none'}); was this SuperNode started with the same --state as before?"
            )
        return load_file(path)

    def delete(self, algorithm: str, tag: int) -> None:
        self._path(algorithm, tag).unlink(missing_ok=True)

    def release(self, algorithm: str) -> None:
        """Delete ``algorithm``'s folder, then the run's folder once no algorithm has one (the run finished: a
        resume only reads the coordinator's finished checkpoints)."""
        shutil.rmtree(self._algorithm_folder(algorithm), ignore_errors=True)
        try:
            self.folder.rmdir()  # only when empty: a later algorithm of the run keeps its own
        except OSError:
            pass

    def forget_others(self, algorithm: str) -> None:
        self._algorithm_folder(algorithm)  # a name that is no plain folder name is refused here too
        if self.folder.is_dir():
            for other in self.folder.iterdir():
                if other.is_dir() and other.name != algorithm:
                    shutil.rmtree(other, ignore_errors=True)


Snapshots = ContextSnapshots | DiskSnapshots


def prune(store: Snapshots, algorithm: str, keep: set[int]) -> None:
    """Delete every snapshot of ``algorithm`` whose tag is not in ``keep``."""
    for tag in store.tags(algorithm):
        if tag not in keep:
            store.delete(algorithm, tag)
