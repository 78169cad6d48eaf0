"""The optional libraries of the volume formats (ITK, pydicom, highdicom: ``pip install 'fedseg[formats]'``):
``require_module`` imports one, or raises a ``FederationError`` that names the file it was needed for and the install
command, so that without them NIfTI, PNG, JPEG and NumPy files still work and the other formats fail with one line."""

from __future__ import annotations

import importlib
from pathlib import Path
from types import ModuleType

from fedseg.data.federation import FederationError

INSTALL_HINT = "pip install 'fedseg[formats]'"


def require_module(module: str, path: Path, what: str) -> ModuleType:
    """Import ``module`` (an optional dependency); ``FederationError`` naming ``path`` and the install command."""
    try:
        return importlib.import_module(module)
    except ImportError:
        raise FederationError(f"{path}: reading {what} needs {module}: {INSTALL_HINT}") from None
