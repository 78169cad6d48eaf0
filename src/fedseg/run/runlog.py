"""``OUT/run.log``: one plain line per finished round, readable when the output goes to a file."""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from pathlib import Path

from fedseg.run.provenance import utc_now

RUN_LOG = "run.log"


def round_line(
    name: str, rnd: int, rounds: int, val_dice: float | None, losses: dict[str, float], seconds: float
) -> str:
    """``<UTC time> <algorithm> round r/R mean val Dice 0.xxxx loss 0.xxxx <seconds> s``
    (``val Dice -`` for a round that was not validated, ``loss -`` when no site trained)."""
    values = [float(v) for v in losses.values()]
    loss = f"{sum(values) / len(values):.4f}" if values else "-"
    dice = val_dice_text(val_dice)
    return f"{utc_now()} {name} round {rnd}/{rounds} mean val Dice {dice} loss {loss} {seconds:.1f} s"


def val_dice_text(val_dice: float | None) -> str:
    """A mean validation Dice as the round lines show it: 4 decimals, ``nan``, or ``-`` (a round not validated)."""
    return "-" if val_dice is None else "nan" if math.isnan(val_dice) else f"{val_dice:.4f}"


def selected_lrs_line(name: str, lrs: dict[str, float]) -> str:
    """``<UTC time> <algorithm> selected lr per site: <site> <lr>, ...`` (a method with ``lr_grid``)."""
    return f"{utc_now()} {name} selected lr per site: " + ", ".join(f"{s} {lr:g}" for s, lr in lrs.items())


def log_round(out: Path, line: str, echo: Callable[[str], None] | None = None) -> None:
    """Append ``line`` to ``out/run.log``, then pass it to ``echo`` (e.g. a print when stdout is no terminal)."""
    append_line(out, line)
    if echo:
        echo(line)


def append_line(out: Path, line: str) -> None:
    """Append ``line`` to ``out/run.log`` (created with the process umask) and flush it to disk."""
    with open(Path(out) / RUN_LOG, "a") as f:
        f.write(line + "\n")
        f.flush()
        os.fsync(f.fileno())


def log_event(out: Path, event: str) -> None:
    """``<UTC time> <event>`` appended to ``out/run.log``, not shown (``fedseg.run.run_experiment``): ``resumed``
    when ``--resume`` continues a run whose log does not end finished, ``finished`` when a run has written its
    outputs, so a run stopped and then resumed does not end its log on the ``stopped:`` line. Never an error of its
    own (a full disk or a read-only folder: the outputs are what matter)."""
    try:
        append_line(out, f"{utc_now()} {event}")
    except OSError:
        pass


def last_event(out: Path) -> str | None:
    """The last ``resumed``, ``finished`` or ``stopped`` of ``out/run.log`` (None: no log, or none yet)."""
    try:
        lines = (Path(out) / RUN_LOG).read_text().splitlines()
    except OSError:
        return None
    words = (line.split(" ", 2)[1:2] for line in reversed(lines))  # the word after the time
    return next((w[0].rstrip(":") for w in words if w and w[0] in ("resumed", "finished", "stopped:")), None)


def log_stop(out: Path, text: str) -> None:
    """``<UTC time> stopped: <text>`` (the error or interruption that ended the run) appended to ``out/run.log``
    (``fedseg.run.run_experiment``, once the run has begun); never an error of its own (:func:`log_event`)."""
    log_event(out, f"stopped: {' '.join(text.split())}")
