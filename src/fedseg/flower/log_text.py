"""Text a site receives from the coordinator, as it goes into the site's log."""

from __future__ import annotations


def printable(text: str) -> str:
    """``text`` from the coordinator (a bundle's name, a refusal's reason) as one line of a site's log: newlines,
    terminal escape codes and every other character that is not printable written as escapes (``\\n``, ``\\x1b``),
    so a coordinator cannot forge log lines or clear an operator's screen."""
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


SITE_TEXT_LIMIT = 4000  # characters of a site's own text the coordinator shows (a data check's list fits)


SITE_LINE = "\n  | "  # what starts each further line of a site's text: none can pass for the coordinator's own


def site_text(text: str) -> str:
    """A site's own text (an error's reason, a data check's list of problems) as the coordinator shows it in its
    console, log, ledger and summary: its lines kept, each after the first behind :data:`SITE_LINE` (a rogue site
    wrote "FAKE: all sites OK" as a line of the coordinator's), every other character that is not printable escaped
    (no terminal codes), at most :data:`SITE_TEXT_LIMIT` characters."""
    cut = text[:SITE_TEXT_LIMIT]
    shown = SITE_LINE.join(printable(line) for line in cut.replace("\r\n", "\n").split("\n"))
    return shown + (f" … ({len(text) - SITE_TEXT_LIMIT} more characters)" if len(text) > SITE_TEXT_LIMIT else "")
