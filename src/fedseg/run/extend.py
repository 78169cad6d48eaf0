"""A resume that extends a run to more rounds: ``fl.rounds`` grown, nothing else changed (``fedseg run --resume
--rounds M``, ``--set fl.rounds=M``, ``Experiment(cfg, out).run(resume=True)`` with ``cfg.fl.rounds = M``).

The extended run must equal a run configured with ``M`` rounds from the start (same seed: the same weights and test
numbers), so it is refused, before any work, with one line naming the algorithm and the reason, wherever the
rounds trained so far depend on the total (:func:`extension_refusal`):

* ``train.lr_schedule: cosine``: each round's rate depends on ``T = fl.rounds`` (``fedseg.train.round_lr``);
  ``constant`` and ``exponential`` (``lr * lr_decay^(t-1)``) do not;
* a method whose rounds are computed from ``fl.rounds`` (``MethodOptions.run_rounds`` neither the identity nor
  fixed: ``fedsm-extra``'s phases); a method with rounds of its own (``finetune``'s ``epochs``, ``cfl``'s
  ``rounds``) is not extended at all;
* a method's own dependency (``MethodOptions.rounds_dependency``: ``fedavg-dp`` with ``select_round: last``);
* the last round of the shorter run was validated only because it was the last (``fl.validate_every`` not
  dividing ``N``): a fresh ``M``-round run does not validate it, and validation decides the selected round, the
  stop rules and the local models sites keep;
* a method that starts from an extended algorithm's model (``start_from``) and has trained already;
* a finished algorithm whose last round's states were not kept (a run of an older fedseg, or client states in
  ``engine.state: disk`` snapshots); and any run whose sites keep their own states (Flower: ``check_before_data``).

What else depends on ``fl.rounds`` is the same either way: the stop rules are checked again after the old last
round (``fedseg.run.steps.resume_state``: a run stopped by one in a fresh ``M``-round run stops there too), a run that
stopped early trains no more (its stop rule does not depend on ``fl.rounds``), and the selection, test, summary,
convergence entry and model card are made again for the new last round over all validated rounds.

To make it possible for a finished run, a run made with ``--keep-checkpoints`` (``keep_checkpoints``) keeps each
finished algorithm's last round's checkpoint (best round's states inlined) in ``checkpoints/<name>.last.pt``
(:func:`keep_last_round`: the size of the checkpoint during training, which a finished run otherwise shrinks to a
small record, 0.5 MB instead of 122 MB for ``--preset demo``); an interrupted run can always be extended. The
extension puts it back as the algorithm's checkpoint
(:func:`reopen_finished`), so the rest is an ordinary resume of a half-done run."""

from __future__ import annotations

from pathlib import Path
from typing import Any, BinaryIO

from fedseg.algorithms import get_algorithm
from fedseg.atomic_files import atomic_write_bytes
from fedseg.config import RunConfig
from fedseg.engine.checkpoint import load_checkpoint, save_checkpoint
from fedseg.engine.state import SNAPSHOT_KEY
from fedseg.run.resume import checkpoint_path
from fedseg.run.start_from import start_name

Checkpoint = dict[str, Any]


def last_path(ckpt_path: Path) -> Path:
    """Where a finished algorithm keeps its last round's checkpoint (for an extension to more rounds)."""
    return ckpt_path.with_name(f"{ckpt_path.stem}.last.pt")


def _on_disk(clients: Any) -> bool:
    """Whether a checkpoint's client states are tokens naming snapshots kept elsewhere (``engine.state: disk``:
    ``SNAPSHOT_KEY``; a Flower site's own snapshot: ``flower_snapshot``), which do not outlive the run's training."""
    if not isinstance(clients, dict):
        return True
    return any(
        not isinstance(state, dict) or SNAPSHOT_KEY in state or any(str(k).endswith("_snapshot") for k in state)
        for state in clients.values()
    )


def keep_last_round(ckpt_path: Path) -> str | None:
    """Before the finished record replaces it: a copy of the last round's checkpoint at ``ckpt_path``, with the
    best round's states inlined (the best file goes with the finished record), as ``<name>.last.pt``; its file
    name, or None where it cannot be kept (client states in snapshots on disk, which the engine removes)."""
    target = last_path(ckpt_path)
    ckpt = load_checkpoint(ckpt_path)
    if ckpt is None or ckpt.get("finished") or _on_disk(ckpt["clients"]):
        target.unlink(missing_ok=True)
        return None
    best = ckpt.get("best")
    if best and "file" in best:
        states = load_checkpoint(ckpt_path.with_name(best["file"]))
        if states is None or _on_disk(states["clients"]):
            target.unlink(missing_ok=True)
            return None
        ckpt["best"] = {"round": best["round"], "score": best["score"], **states}
    save_checkpoint(target, ckpt)
    return target.name


def trained_rounds(ckpt: Checkpoint) -> tuple[int, str | None]:
    """(the last round trained, the stop rule that ended training early or None) of a checkpoint."""
    if not ckpt.get("finished"):
        return int(ckpt["round"]), ckpt.get("stopped")
    summary = ckpt.get("summary") or {}
    return int(summary.get("rounds", 0)), (summary.get("convergence") or {}).get("stopped")


def with_rounds(cfg: RunConfig, rounds: int) -> RunConfig:
    return cfg.model_copy(update={"fl": cfg.fl.model_copy(update={"rounds": rounds})})


def extended_algorithms(out: Path, cfg: RunConfig, before: int) -> dict[str, tuple[int, int]]:
    """The algorithms of the run in ``out`` that train more rounds under ``cfg`` than under ``fl.rounds = before``
    (started, not stopped early): name -> (their rounds before, now)."""
    extended = {}
    for name in cfg.algorithms:
        ckpt = load_checkpoint(checkpoint_path(out, name))
        if ckpt is None:
            continue
        spec = get_algorithm(name)
        old, new = spec.run_config(with_rounds(cfg, before)).fl.rounds, spec.run_config(cfg).fl.rounds
        trained, stopped = trained_rounds(ckpt)
        if new > old and stopped is None and trained < new:
            extended[name] = (old, new)
    return extended


def resume_progress(out: Path, cfg: RunConfig) -> str:
    """Where a resume of the run in ``out`` takes each algorithm of ``cfg`` up: ``fedavg after round 7 of 40, local
    not begun`` (``finished`` for a finished one). The console's sign that a run resumed (``run.log`` has its
    ``resumed`` event; the console said nothing: a user's audit)."""
    said = []
    for name in cfg.algorithms:
        ckpt = load_checkpoint(checkpoint_path(out, name))
        if ckpt is None:
            said.append(f"{name} not begun")
        elif ckpt.get("finished"):
            said.append(f"{name} finished")
        else:
            rounds = get_algorithm(name).run_config(cfg).fl.rounds
            said.append(f"{name} after round {trained_rounds(ckpt)[0]} of {rounds}")
    return ", ".join(said)


def unstarted_algorithms(out: Path, cfg: RunConfig) -> list[str]:
    """The algorithms of ``cfg`` the run in ``out`` has not begun (no checkpoint: interrupted before them); a resume
    trains them from round 1."""
    return [name for name in cfg.algorithms if load_checkpoint(checkpoint_path(out, name)) is None]


def rounds_left_text(out: Path, cfg: RunConfig, before: int) -> str | None:
    """Where no algorithm of the run in ``out`` has rounds left to train under ``cfg`` (every one finished, none of
    them in :func:`extended_algorithms`: each stopped early by a stop rule, or has rounds of its own): why, one
    clause per algorithm (``fedavg stopped early after round 2 (plateau)``); else None."""
    if extended_algorithms(out, cfg, before):
        return None
    reasons = []
    for name in cfg.algorithms:
        ckpt = load_checkpoint(checkpoint_path(out, name))
        if ckpt is None or not ckpt.get("finished"):  # not started, or not done: it has rounds (or a test) left
            return None
        trained, stopped = trained_rounds(ckpt)
        spec = get_algorithm(name)
        if stopped is not None:
            reasons.append(f"{name} stopped early after round {trained} ({stopped})")
        elif spec.run_config(with_rounds(cfg, before)).fl.rounds >= spec.run_config(cfg).fl.rounds:
            reasons.append(f"{name} has rounds of its own ({trained}), not fl.rounds")
        else:
            reasons.append(f"{name} trained {trained} rounds already")
    return ", ".join(reasons)


def extension_refusal(out: Path, cfg: RunConfig, before: int) -> str | None:
    """Why the run in ``out`` (recorded with ``fl.rounds = before``) cannot continue to ``cfg.fl.rounds`` rounds
    as a run configured with those from the start would train (module docstring); None: it can."""
    after = cfg.fl.rounds
    extended = extended_algorithms(out, cfg, before)
    for name in cfg.algorithms:
        ckpt = load_checkpoint(checkpoint_path(out, name))
        if ckpt is None:
            continue
        options = get_algorithm(name).parse_options(cfg.methods.get(name))
        source = start_name(options)
        if source in extended and name not in extended:
            return (
                f"{name}: starts from {source}'s trained model (methods.{name}.start_from), which the extension "
                f"changes, and has trained from the {before}-round one already"
            )
        if name not in extended:
            continue
        old, new = extended[name]
        if (old, new) != (before, after):
            return (
                f"{name}: its rounds depend on fl.rounds ({old} for fl.rounds={before}, {new} for {after}), so its "
                "phases would fall on other rounds"
            )
        if cfg.train.lr_schedule == "cosine":
            return (
                f"{name}: lr schedule cosine depends on fl.rounds: every round's learning rate so far was set for "
                f"{before} rounds, not {after}"
            )
        if (why := options.rounds_dependency()) is not None:
            return f"{name}: {why}"
        trained, _ = trained_rounds(ckpt)
        every = cfg.fl.validate_every
        if trained == before and before % every:
            return (
                f"{name}: round {before} was validated only because it was the last (fl.validate_every={every}); "
                f"a {after}-round run does not validate it, and validation chooses the selected round"
            )
        last = ckpt.get("last")
        if ckpt.get("finished") and not (last and (checkpoint_path(out, name).parent / str(last)).is_file()):
            return (
                f"{name}: finished without keeping its last round's states (a run made without --keep-checkpoints, "
                "a run of an older fedseg, or engine.state: disk), so it cannot continue; to extend runs later, "
                "make them with --keep-checkpoints"
            )
    return None


def check_extension(out: Path, cfg: RunConfig, before: int) -> None:
    """A one-line ValueError where ``fl.rounds`` shrank on resume, or where the grown one cannot be honoured
    (:func:`extension_refusal`); nothing is written."""
    after = cfg.fl.rounds
    if after < before:
        raise ValueError(
            f"{Path(out) / 'config.yaml'}: fl.rounds {before} -> {after}: a resume can only add rounds to the "
            f"run; resume with --rounds {before} or more, or start a new run (another --out)"
        )
    if after == before:
        return
    why = extension_refusal(Path(out), cfg, before)
    if why is not None:
        raise ValueError(
            f"cannot extend the run in {out} from {before} to {after} rounds: {why}; resume with --rounds {before}, "
            "or start a new run (another --out)"
        )


def reopen_finished(out: Path, cfg: RunConfig, before: int) -> list[str]:
    """Put each finished algorithm that trains more rounds under ``cfg`` back to its last round's checkpoint
    (``<name>.last.pt``), so the run resumes it; returns the algorithms the extension continues."""
    extended = extended_algorithms(out, cfg, before)
    for name in extended:
        ckpt_path = checkpoint_path(out, name)
        ckpt = load_checkpoint(ckpt_path)
        if ckpt is not None and ckpt.get("finished"):
            data = (ckpt_path.parent / str(ckpt["last"])).read_bytes()

            def write(f: BinaryIO, data: bytes = data) -> None:
                f.write(data)

            atomic_write_bytes(ckpt_path, write)
    return list(extended)
