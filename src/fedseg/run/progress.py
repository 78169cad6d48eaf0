"""Progress of ``fedseg run``: on a terminal one rich bar per algorithm (round, site and loss as they
happen, and the last validated round's mean validation Dice: the selection metric); otherwise the plain per-round
lines of ``run.log``."""

from __future__ import annotations

import sys
from pathlib import Path

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskID, TextColumn, TimeElapsedColumn

from fedseg.config import RunConfig
from fedseg.data.federation import Federation
from fedseg.engine.messages import Message
from fedseg.run.experiment import run_experiment
from fedseg.run.outputs import RunResults
from fedseg.run.runlog import val_dice_text


def run_with_progress(
    cfg: RunConfig,
    out: Path,
    resume: bool,
    console: Console,
    federation: Federation | None = None,
    keep_checkpoints: bool = False,
) -> RunResults:
    """``run_experiment`` with progress bars; ``federation``: an in-memory federation
    (e.g. one without a held-out site); ``keep_checkpoints``: see ``fedseg.run.run_algorithm``. When stdout
    is not a terminal (CI, nohup, a pipe), no bar: each round's ``run.log`` line is printed instead."""
    if not sys.stdout.isatty():
        return run_experiment(
            cfg, out, resume, federation=federation, on_log_line=print_line, keep_checkpoints=keep_checkpoints
        )
    columns = [
        TextColumn("{task.description}"),
        BarColumn(bar_width=20),  # room for the status: loss and the last validation Dice
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TextColumn("{task.fields[status]}"),
    ]
    with Progress(*columns, console=console, transient=False) as progress:
        tasks: dict[str, TaskID] = {}
        validated: dict[str, tuple[int, float]] = {}  # algorithm -> its last validated round and mean val Dice

        def status(name: str, text: str, rnd: int | None = None) -> str:
            """``text``, then the last validated round's mean validation Dice (its round, unless it is ``rnd``)."""
            if name not in validated:
                return text
            last, dice = validated[name]
            return f"{text} | val Dice {val_dice_text(dice)}" + ("" if last == rnd else f" (round {last})")

        def on_algorithm_start(name: str) -> None:
            tasks[name] = progress.add_task(f"{name:<12}", total=cfg.fl.rounds, status="")

        def on_message(site: str, action: str, msg: Message, reply: Message) -> None:
            if action == "train" and "loss" in reply.meta and tasks:
                name = list(tasks)[-1]
                progress.update(tasks[name], status=status(name, f"{site} loss {float(reply.meta['loss']):.3f}"))

        def on_round_end(name: str, rnd: int, losses: dict[str, float]) -> None:
            mean = sum(losses.values()) / max(len(losses), 1)
            progress.update(tasks[name], completed=rnd, status=status(name, f"round {rnd} mean loss {mean:.3f}", rnd))

        def on_validated(name: str, rnd: int, dice: float) -> None:
            validated[name] = (rnd, dice)

        return run_experiment(
            cfg,
            out,
            resume,
            [on_message],
            on_round_end,
            on_algorithm_start,
            federation,
            keep_checkpoints=keep_checkpoints,
            on_validated=on_validated,
        )


def print_line(line: str) -> None:
    print(line, flush=True)
