"""What the tables need to know about each per-case metric (no MONAI import: reports and trackers use it).

:data:`METRICS` lists Dice, HD95 and normalized surface Dice (NSD) in table order (computed in
:mod:`fedseg.evaluate.metrics`); a table loops over them instead of naming each. NSD's tolerance
(``eval.nsd_tolerance``) is a number or one per region, in the HD95 unit (``summary.json`` ``hd95_unit``:
mm on the volume path, else pixels).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from fedseg.config import DEFAULT_NSD_TOLERANCE, region_tolerances  # eval.nsd_tolerance: config semantics

__all__ = [
    "Metric",
    "METRICS",
    "METRIC_NAMES",
    "SCORED_ON",
    "SCORED_GRID",
    "scoring_text",
    "DEFAULT_NSD_TOLERANCE",
    "region_tolerances",
    "tolerance_text",
]


@dataclass(frozen=True)
class Metric:
    """How tables show one metric.

    ``name``: the ``metric`` of ``results.csv`` rows and the key in ``summary.json``; ``label``: the heading;
    ``higher_is_better``: the direction (bold best, the sign of a good difference); ``digits``: decimals of a
    mean ± std, ``mean_digits``: of a lone mean; ``distance``: values are in the HD95 unit (``hd95_unit``);
    ``tolerance``: scored at a tolerance in that unit (NSD's ``eval.nsd_tolerance``)."""

    name: str
    label: str
    higher_is_better: bool
    digits: int
    mean_digits: int
    distance: bool = False
    tolerance: bool = False

    def title(self, unit: str = "", tolerance: float | Mapping[str, float] | None = None) -> str:
        """The heading with what a reader needs: HD95's ``unit`` (``"HD95 (mm)"``), NSD's ``tolerance`` in it
        (``"NSD (τ 1 mm)"``); the bare label when not known (a run written before it was recorded)."""
        if self.distance and unit:
            return f"{self.label} ({unit})"
        if self.tolerance and tolerance is not None:
            return f"{self.label} (τ {tolerance_text(tolerance, unit)})"
        return self.label


DICE = Metric("dice", "Dice", True, 3, 4)
HD95 = Metric("hd95", "HD95", False, 2, 2, distance=True)
NSD = Metric("nsd", "NSD", True, 3, 4, tolerance=True)
METRICS = (DICE, HD95, NSD)
METRIC_NAMES = tuple(m.name for m in METRICS)


def tolerance_text(tolerance: float | Mapping[str, float], unit: str = "") -> str:
    """``1 mm``, or per region ``WT 2, TC 1 mm``."""
    text = (
        ", ".join(f"{k} {v:g}" for k, v in tolerance.items())
        if isinstance(tolerance, Mapping)
        else f"{float(tolerance):g}"
    )
    return f"{text} {unit}".strip()


SCORED_ON = {  # summary.json ``score_on`` (eval.score_on; absent from a run of an older fedseg: said nothing of)
    "label_map": "Scored on the label map the thresholded predictions paint (eval.score_on: label_map), as fedseg "
    "predict writes it. ",
    "channels": "Scored on each region's thresholded channel (eval.score_on: channels): with nested regions a "
    "written mask (which paints a smaller region predicted outside a larger one into it) can score otherwise. ",
}

SCORED_GRID = {  # summary.json ``score_grid`` (eval.score_grid; absent from a run of an older fedseg: said nothing of)
    "original": "Scored on each image's own grid (eval.score_grid: original; on the whole-image path the predictions "
    "resized back to it, nearest, as fedseg predict writes them). ",
    "model": "Scored on the model's data.image_size grid (eval.score_grid: model; each truth resized to it, "
    "nearest): fedseg predict writes masks on each image's own grid, where they can score otherwise. ",
}


def scoring_text(score_on: object, score_grid: object, ignore_label: object = None) -> str:
    """What a run scored, in the sentences of :data:`SCORED_ON` and :data:`SCORED_GRID` ("" for what an older
    run did not record), and with an ``ignore_label`` (summary.json's, partial annotations) that only annotated
    voxels count (``fedseg.evaluate.metrics``)."""
    text = SCORED_ON.get(str(score_on), "") + SCORED_GRID.get(str(score_grid), "")
    if ignore_label is not None:
        text += (
            f"Partial annotations (ignore label {ignore_label}): scores count annotated voxels only; HD95 and NSD "
            "only of cases annotated everywhere (else not computed), no score for a case without annotated voxels. "
        )
    return text
