"""Text a site receives from the coordinator, as it goes into the site's log."""

from __future__ import annotations


def printable(text: str) -> str:
    """``text`` from the coordinator (a bundle's name, a refusal's reason) as one line of a site's log: newlines,
    terminal escape codes and every other character that is not printable written as escapes (``\\n``, ``\\x1b``),
    so a coordinator cannot forge log lines or clear an operator's screen."""
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)
