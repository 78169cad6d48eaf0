"""The FedSM family's hooks on a run, shared by the specs of ``fedsm``, ``fedsm-extra`` and ``fedsm-ensemble``."""

from __future__ import annotations

from fedseg.algorithms.fedsm.features import write_selector_features
from fedseg.algorithms.fedsm.report import sections
from fedseg.algorithms.fedsm.routing import ROUTING
from fedseg.algorithms.fedsm.unseen import unseen_cells
from fedseg.algorithms.registry import Family

FEDSM = Family(
    "FedSM", after_test=write_selector_features, report_sections=sections, unseen_cells=unseen_cells, routing=ROUTING
)
