"""fedseg: cross-silo federated learning for medical image segmentation."""

__version__ = "0.1.0"
