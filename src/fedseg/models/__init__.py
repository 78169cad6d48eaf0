"""Model factory over MONAI networks."""

from fedseg.models.factory import build_segmenter, count_parameters

__all__ = ["build_segmenter", "count_parameters"]
