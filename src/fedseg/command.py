"""The ``fedseg`` command's entry point: imports the command line (``fedseg.cli``, a second or more: typer, rich,
the configuration models) where a Ctrl-C meanwhile ends it in one line, not in the import's traceback."""

from __future__ import annotations

import os


def entry() -> None:
    """Import ``fedseg.cli`` and run its :func:`fedseg.cli.entry`; interrupted while importing, exit 130 with one
    line (nothing was done yet)."""
    try:
        from fedseg.cli import entry as run_command
    except KeyboardInterrupt:
        os.write(2, b"error: interrupted while fedseg was starting: nothing was done\n")
        os._exit(130)
    run_command()
