"""Exporters: a federation -> another tool's dataset layout, on exactly the federation's cases and splits.

``nnunet`` (``fedseg.data.exporters.nnunet``): an nnU-Net v2 raw dataset ``DatasetNNN_Name/`` with
``splits_final.json``, for a centralized nnU-Net baseline (the CLI: ``fedseg data export nnunet FED --out DIR``).
"""

FORMATS = ("nnunet",)
