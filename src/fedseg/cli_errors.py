"""The one line every ``fedseg`` command prints when it stops on a known error, and its exit.

``error: <message>`` on stderr (so a command's output piped or redirected stays clean, and the error still reaches
the terminal): ``error:`` in bold red on a terminal, the message as written (no markup, no wrapping: paths stay
copyable), then ``typer.Exit(code)`` (no traceback).
"""

from __future__ import annotations

from typing import NoReturn

import typer
from rich.console import Console

stderr_console = Console(stderr=True)


def fail(message: str, code: int = 1) -> NoReturn:
    """Print ``error: message`` to stderr and exit with status ``code`` (module docstring)."""
    stderr_console.print("[bold red]error:[/] ", end="", highlight=False)
    stderr_console.print(message, highlight=False, markup=False, soft_wrap=True)
    raise typer.Exit(code)
