"""LaTeX of the tables a report shows as Markdown and HTML: the same cells, escaped, in ``booktabs`` tables a paper
can ``\\input`` (``\\usepackage{booktabs,graphicx}``; UTF-8 input, LaTeX's default since 2018).

A cell's text is written as it prints elsewhere: LaTeX's special characters escaped, the symbols the tables use
(±, Δ, †, ‡, −, ×, τ, ≤, ✓ ...) as their math-mode commands, a minus sign before a number as ``$-$`` (not a
hyphen), a p like ``1.9e-16`` as ``$1.9\\times10^{-16}$``, Markdown ``**bold**`` as ``\\textbf``. Other characters are
written as they are: pdflatex takes Latin letters with accents (``Zürich``); site or method names in other scripts
(Chinese, Greek, ...) need LuaLaTeX or XeLaTeX with a font that has them."""

from __future__ import annotations

import re
import textwrap
from collections.abc import Sequence

SPECIAL = {
    "\\": r"\textbackslash{}",
    "&": r"\&",
    "%": r"\%",
    "$": r"\$",
    "#": r"\#",
    "_": r"\_",
    "{": r"\{",
    "}": r"\}",
    "~": r"\textasciitilde{}",
    "^": r"\textasciicircum{}",
    "<": r"\textless{}",
    ">": r"\textgreater{}",
}
SYMBOLS = {
    "±": r"$\pm$",
    "Δ": r"$\Delta$",
    "†": r"$^\dagger$",
    "‡": r"$^\ddagger$",
    "°": r"$^\circ$",
    "−": r"$-$",
    "×": r"$\times$",
    "τ": r"$\tau$",
    "α": r"$\alpha$",
    "β": r"$\beta$",
    "λ": r"$\lambda$",
    "γ": r"$\gamma$",
    "μ": r"$\mu$",
    "≤": r"$\leq$",
    "≥": r"$\geq$",
    "≈": r"$\approx$",
    "→": r"$\rightarrow$",
    "²": r"$^2$",
    "³": r"$^3$",
    "…": r"\ldots{}",
    "–": "--",
    "—": "---",
    "✓": r"$\surd$",
}
TOKENS = re.compile(
    r"\*\*(?P<bold>.+?)\*\*"  # Markdown bold
    r"|(?<![\w.])(?P<mantissa>\d+(?:\.\d+)?)e(?P<sign>[+-]?)0*(?P<power>\d+)(?![\w.])"  # 1.9e-16
    r"|(?<![\w.])(?P<minus>-)(?=\d)"  # a minus sign before a number
    r"|.",
    re.DOTALL,
)


def tex_text(text: str) -> str:
    """``text`` as LaTeX (module docstring)."""

    def one(match: re.Match) -> str:
        if match["bold"] is not None:
            return r"\textbf{" + tex_text(match["bold"]) + "}"
        if match["mantissa"] is not None:
            sign = "-" if match["sign"] == "-" else ""
            return rf"${match['mantissa']}\times10^{{{sign}{match['power']}}}$"
        if match["minus"] is not None:
            return "$-$"
        char = match.group(0)
        return SPECIAL.get(char) or SYMBOLS.get(char) or char

    return "".join(one(m) for m in TOKENS.finditer(text))


def tex_table(
    head: Sequence[str], rows: Sequence[Sequence[str]], caption: str, label: str, short: str | None = None
) -> str:
    """One ``table`` float: ``caption`` (plain text, escaped here; ``short``: the list of tables' entry),
    ``\\label{label}``, the header and the rows in a ``booktabs`` tabular (first column left-aligned, the others
    centred), scaled down to the text width when wider."""
    spec = "l" + "c" * (len(head) - 1)
    lines = [
        r"\begin{table}[htbp]",
        r"\centering",
        r"\caption" + ("" if short is None else "[{" + tex_text(short) + "}]") + "{" + tex_text(caption) + "}",
        r"\label{" + label + "}",
        r"\resizebox{\ifdim\width>\linewidth\linewidth\else\width\fi}{!}{%",
        r"\begin{tabular}{" + spec + "}",
        r"\toprule",
        " & ".join(tex_text(h) for h in head) + r" \\",
        r"\midrule",
        *(" & ".join(tex_text(c) for c in row) + r" \\" for row in rows),
        r"\bottomrule",
        r"\end{tabular}}",
        r"\end{table}",
    ]
    return "\n".join(lines) + "\n"


def tex_comment(text: str, width: int = 100) -> str:
    """``text`` as LaTeX comment lines (``% ...``), wrapped at ``width``."""
    return "".join(f"% {line}\n" for para in text.split("\n") for line in (textwrap.wrap(para, width - 2) or [""]))


def tex_label(*parts: str) -> str:
    """A ``\\label`` key from ``parts``: lower case, runs of anything but letters and digits as one ``-``."""
    return ":".join(re.sub(r"[^a-z0-9]+", "-", p.lower()).strip("-") for p in parts)
