"""Tables printed on the console (rich), never narrower than their content needs.

rich shrinks a table to the terminal width (80 columns when output is not a terminal), which
truncated numbers to ``0.95…``; these helpers print on a console at least as wide as the table.
"""

from __future__ import annotations

import math

from rich.console import Console
from rich.table import Table

from fedseg.atomic_files import json_number

CELL_WIDTH = 12  # characters per column, enough for "0.9096" or a short site name plus padding


def print_table(console: Console, title: str, columns: list[str], rows: list[list[str]]) -> None:
    """Print ``rows`` (strings) under ``columns``; the first column left-aligned, the rest right."""
    table = Table(title=title)
    for i, col in enumerate(columns):
        table.add_column(col, justify="left" if i == 0 else "right")
    for row in rows:
        table.add_row(*row)
    width = max(CELL_WIDTH * len(columns), max((len(r[0]) for r in rows), default=0) + CELL_WIDTH * (len(columns) - 1))
    Console(width=max(console.width, width), file=console.file).print(table)


# The Dice table's column of summary.json's ``dice.global`` (the mean over all test cases pooled): headed ``pooled``,
# as ``global`` read as a score of the global model (results.csv's ``model=global``), which Local has none of.
POOLED = "pooled"
DICE_LEGEND = (
    "per site: mean over the site's test cases; client_avg: mean of the site means; "
    "pooled: mean over all test cases pooled (summary.json dice.global), not the global model's score"
)


def print_dice(
    console: Console, title: str, sites: list[str], dice: dict[str, dict[str, float]], ignore_label: object = None
) -> None:
    """Test Dice per algorithm: ``dice[algorithm]`` = a summary's ``dice`` entry (sites, client_avg, global); ``–``
    where there is none (NaN, or ``null`` in summary.json: a site that failed, or whose test cases hold no annotated
    voxel). ``global`` is headed ``pooled``, and a legend under the table says what the columns are
    (:data:`DICE_LEGEND`; with an ``ignore_label``, summary.json's: that only annotated voxels count)."""
    keys = [*sites, "client_avg", "global"]
    headers = [*sites, "client_avg", POOLED]
    print_table(
        console, title, ["algorithm", *headers], [[name, *(_cell(d.get(k)) for k in keys)] for name, d in dice.items()]
    )
    partial = (
        ""
        if ignore_label is None
        else f"; partial annotations (ignore label {ignore_label}): annotated voxels only, – a site with no scored case"
    )
    console.print(DICE_LEGEND + partial, highlight=False, markup=False, soft_wrap=True)


def _cell(value: float | None) -> str:
    number = json_number(value)
    return "–" if math.isnan(number) else f"{number:.4f}"
