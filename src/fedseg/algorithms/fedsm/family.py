"""The FedSM family's hooks on a run, shared by the specs of ``fedsm``, ``fedsm-extra`` and ``fedsm-ensemble``."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from fedseg.algorithms.fedsm.features import write_selector_features
from fedseg.algorithms.fedsm.routing import ROUTING
from fedseg.algorithms.fedsm.unseen import unseen_cells
from fedseg.algorithms.registry import Family

if TYPE_CHECKING:
    from collections.abc import Sequence

    from fedseg.presentation.kit import RunFiles, Section


def report_sections(run: RunFiles, algorithms: Sequence[str], fig_dir: Path) -> list[Section]:
    """:func:`fedseg.algorithms.fedsm.report.sections`, imported when a report is drawn (not when the method is
    registered: training never needs matplotlib, whose import costs 0.6 s of every run's start-up)."""
    from fedseg.algorithms.fedsm.report import sections

    return sections(run, algorithms, fig_dir)


FEDSM = Family(
    "FedSM",
    after_test=write_selector_features,
    report_sections=report_sections,
    unseen_cells=unseen_cells,
    routing=ROUTING,
    report_imports=("fedseg.algorithms.fedsm.report", "sklearn.manifold"),  # the selector's t-SNE map
)
