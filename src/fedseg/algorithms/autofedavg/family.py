"""The Auto-FedAvg family's hooks on a run, shared by its four registered variants: report sections
(aggregation weights per round, validation Dice against FedAvg, the learned Dirichlet distribution)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from fedseg.algorithms.registry import Family

if TYPE_CHECKING:
    from collections.abc import Sequence

    from fedseg.presentation.kit import RunFiles, Section


def report_sections(run: RunFiles, algorithms: Sequence[str], fig_dir: Path) -> list[Section]:
    """:func:`fedseg.algorithms.autofedavg.report.sections`, imported when a report is drawn (not when
    the method is registered: training never needs matplotlib)."""
    from fedseg.algorithms.autofedavg.report import sections

    return sections(run, algorithms, fig_dir)


AUTOFEDAVG = Family(
    "Auto-FedAvg", report_sections=report_sections, report_imports=("fedseg.algorithms.autofedavg.report",)
)
