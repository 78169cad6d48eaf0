"""An algorithm's checkpoint and what a resume reads back from it: the finished record, the best round's states.

The best round's states are needed to resume. If it is the checkpointed round itself, the checkpoint says so
(``{"current": True}``: its states are the checkpoint's own); if it is an earlier round, its states are written
once, to ``CHECKPOINT.best-<round>.pt``, the first time a later checkpoint needs them, and every checkpoint after
that names that file. A best file is deleted only after a checkpoint that no longer names it is on disk."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch

from fedseg.atomic_files import fsync_dir
from fedseg.engine.base import Engine
from fedseg.engine.checkpoint import CheckpointWriter, load_checkpoint
from fedseg.run.outputs import read_bundle
from fedseg.run.result import AlgorithmResult
from fedseg.run.summary import finite_mean

Checkpoint = dict[str, Any]  # what ``fedseg.engine.checkpoint`` stored: states, rows, records
Row = dict[str, Any]  # a row of rounds.csv / metrics.csv / results.csv
States = dict[str, torch.Tensor]
Bundle = dict[str, States]  # the trained models, by name


def checkpoint_path(out: Path, name: str) -> Path:
    """Where algorithm ``name``'s checkpoint of the run in ``out`` lives."""
    return out / "checkpoints" / f"{name}.pt"


def is_finished(ckpt_path: Path) -> bool:
    """Whether ``ckpt_path`` is a finished algorithm's checkpoint (a resume reuses it without training)."""
    ckpt = load_checkpoint(ckpt_path)
    return bool(ckpt and ckpt.get("finished"))


def all_finished(out: Path, algorithms: list[str]) -> bool:
    """Whether every one of ``algorithms`` has a finished checkpoint in ``out`` (a resume then trains nothing)."""
    return all(is_finished(checkpoint_path(out, name)) for name in algorithms)


def finished_bundle(ckpt: Checkpoint, ckpt_path: Path, folder: Path) -> Bundle:
    """The trained models of a finished checkpoint: in it (``keep_checkpoints``, or a run of an older
    fedseg), else read back from the run's ``model/<algorithm>/``, which must hold what was written then."""
    if "bundle" in ckpt:
        bundle: Bundle = ckpt["bundle"]
        return bundle
    try:
        return read_bundle(folder, ckpt.get("bundle_sha256"), ckpt.get("bundle_order"))
    except ValueError as e:
        raise ValueError(
            f"{ckpt_path}: finished, but its trained models cannot be reused: {e}; "
            f"delete {ckpt_path} to train it again, or start a new run (another --out)"
        ) from None


def best_path(ckpt_path: Path, rnd: int) -> Path:
    """The file holding round ``rnd``'s states once a later checkpoint needs them as the best round's."""
    return ckpt_path.with_name(f"{ckpt_path.stem}.best-{rnd}.pt")


def stored_best(best: Checkpoint | None, rnd: int, ckpt_path: Path, writer: CheckpointWriter) -> Checkpoint | None:
    """What round ``rnd``'s checkpoint records about ``best`` (queues the best file's write if needed)."""
    if best is None:
        return None
    if best["round"] == rnd:
        return {"round": rnd, "score": best["score"], "current": True}
    if "file" not in best:
        path = best_path(ckpt_path, best["round"])
        writer.save(path, {"server": best["server"], "clients": best["clients"]}, frozen=True)
        best["file"] = path.name
    return {"round": best["round"], "score": best["score"], "file": best["file"]}


def restore_best(stored: Checkpoint | None, ckpt: Checkpoint, ckpt_path: Path, engine: Engine) -> Checkpoint | None:
    """The in-memory best round (with its states) from a checkpoint's record (see ``stored_best``)."""
    if stored is None:
        return None
    if stored.get("current"):
        return {**stored, "server": clone(ckpt["server"]), "clients": engine.snapshot_clients()}
    if "server" in stored:  # inlined: a finished algorithm's last round put back (fedseg.run.extend)
        return dict(stored)
    states = load_checkpoint(ckpt_path.with_name(stored["file"]))
    if states is None:
        raise FileNotFoundError(
            f"{ckpt_path.with_name(stored['file'])}: missing (the best round's states; "
            f"{ckpt_path} names it); cannot resume, start a new run"
        )
    return {**stored, **states}


def remove_best_files(ckpt_path: Path, keep: str | None) -> None:
    """Delete the best-round files of ``ckpt_path`` but ``keep`` (None: all of them)."""
    for path in ckpt_path.parent.glob(f"{ckpt_path.stem}.best-*.pt"):
        if path.name != keep:
            path.unlink(missing_ok=True)
    fsync_dir(ckpt_path.parent)


def validated_from_rows(rounds_rows: list[Row]) -> dict[int, float]:
    """round -> mean validation Dice over sites (NaN sites left out), rebuilt from ``rounds.csv`` rows."""
    by_round: dict[int, list[float]] = {}
    for row in rounds_rows:
        by_round.setdefault(int(row["round"]), []).append(float(row["val_dice"]))
    return {rnd: finite_mean(np.array(values)) for rnd, values in by_round.items()}


def clone(state: States) -> States:
    """A copy of every tensor of ``state`` (a checkpoint must not change with training)."""
    return {k: v.clone() for k, v in state.items()}


def finished_result(name: str, ckpt: Checkpoint, ckpt_path: Path, out: Path) -> AlgorithmResult:
    """A finished checkpoint's results, reused without training (its best files go: the run may have stopped
    right after finishing)."""
    remove_best_files(ckpt_path, keep=None)
    return AlgorithmResult(
        name,
        ckpt["test_rows"],
        ckpt["rounds_rows"],
        ckpt["ledger"],
        ckpt["summary"],
        finished_bundle(ckpt, ckpt_path, out / "model" / name),
        ckpt["metric_rows"],
        ckpt.get("card") or {},  # a checkpoint of an older fedseg has none
    )
