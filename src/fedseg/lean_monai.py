"""Keep MONAI's unused optional integrations out of its import (stdlib only; installed by fedseg's own processes).

``import monai`` (so any ``from monai.x import y``) imports every MONAI subpackage (MONAI's ``load_submodules``),
and with them, when they are installed, the packages of integrations fedseg never uses through MONAI:

==============  ==========================================  ==========================================
package         pulled in by                                CPU seconds (2-core machine, all extras)
==============  ==========================================  ==========================================
mlflow          ``monai.handlers.mlflow_handler``           ~1.0 (with FastAPI), via monai.apps.pathology
sklearn         ``monai.metrics.embedding_collapse``        ~0.15
matplotlib      ``monai.utils.jupyter_utils``               ~0.15
scipy.signal    ``monai.data.ultrasound_confidence_map``    ~0.4 (with scipy.stats)
requests        ``monai.apps`` (dataset downloads)          ~0.13 (with urllib3)
tensorboard     ``monai.visualize.img2tensorboard``         ~0.06 (with protobuf, fsspec)
jsonschema      ``monai.bundle`` (bundle validation)        ~0.04
==============  ==========================================  ==========================================

Every fedseg process pays MONAI's import once: the command line, each worker pool's process server, each Flower
process (``benchmarks/startup.py --imports`` measures it with and without this module: ``imports.json``).

:func:`install` adds an import hook that answers "not installed" for these packages **only while MONAI's own
``__init__`` runs** (in any thread of the process); MONAI's ``optional_import`` then records its MLflow handler,
embedding-collapse metric, notebook plots, ultrasound confidence maps and signal filters (``iirnotch``) as
unavailable for the rest of the process, and likewise MONAI's downloads, TensorBoard image summaries and bundle
schema checks (fedseg uses none of them). After MONAI's import the hook lets everything through, so fedseg's
tracking (mlflow, tensorboard, wandb's requests), FedSM's t-SNE (scikit-learn), the report's figures (matplotlib)
and the statistics (scipy.stats) import the real packages. Nothing MONAI computes for fedseg changes (networks,
losses, metrics, transforms, inferers, the ITK and NIfTI readers).

Only fedseg's own processes install it: the ``fedseg`` command, the worker pool's process server (so also a pool
that a Python program starts through ``engine.workers``: its workers lack the MONAI integrations above) and the
Flower apps. ``import fedseg`` does not, so a program that uses fedseg as a library in its own process keeps every
MONAI integration.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
from collections.abc import Sequence
from types import ModuleType

# the packages (and their submodules) of the table above
UNUSED_BY_FEDSEG = ("mlflow", "sklearn", "matplotlib", "scipy.signal", "requests", "tensorboard", "jsonschema")


def monai_initializing() -> bool:
    """True while ``monai/__init__.py`` runs (its module exists but its spec says it is not finished)."""
    monai: ModuleType | None = sys.modules.get("monai")
    spec = getattr(monai, "__spec__", None)
    return bool(getattr(spec, "_initializing", False))


class SkipDuringMonaiImport(importlib.abc.MetaPathFinder):
    """Refuses ``UNUSED_BY_FEDSEG`` (and their submodules) while MONAI initializes; finds nothing otherwise."""

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if any(fullname == p or fullname.startswith(p + ".") for p in UNUSED_BY_FEDSEG) and monai_initializing():
            raise ModuleNotFoundError(f"{fullname}: not imported during MONAI's import (fedseg.lean_monai)")
        return None  # the normal finders decide


def install() -> None:
    """Put the hook first on ``sys.meta_path`` (once per process). No effect when MONAI is already imported."""
    if not any(isinstance(f, SkipDuringMonaiImport) for f in sys.meta_path):
        sys.meta_path.insert(0, SkipDuringMonaiImport())
