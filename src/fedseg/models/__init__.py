"""Model factory over MONAI networks (FedSM's selector classifier lives in ``fedseg.algorithms.fedsm.selector``)."""

from fedseg.models.factory import build_segmenter, count_parameters

__all__ = ["build_segmenter", "count_parameters"]
