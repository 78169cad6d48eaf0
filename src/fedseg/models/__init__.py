"""Model factory over MONAI networks, and FedSM's selector classifier."""

from fedseg.models.factory import build_segmenter, count_parameters
from fedseg.models.selector import Selector, build_selector

__all__ = ["build_segmenter", "count_parameters", "Selector", "build_selector"]
