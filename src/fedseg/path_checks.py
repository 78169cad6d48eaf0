"""The checks of the paths ``fedseg run`` and ``fedseg predict`` are given that need only file look-ups, made before
the command imports torch and MONAI (seconds; tens of seconds on a busy machine), so that a wrong path is said at once.

Each is a check the command's own work makes first anyway, by the same function, so the line said is the same; only
where a command is given several wrong things may it now name a path before another problem (an unknown algorithm,
a device this torch cannot use) that needs torch to be found.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from fedseg.atomic_files import check_out_creatable, check_out_dir
from fedseg.data.federation import FederationError
from fedseg.data.folder import root_problem
from fedseg.run.bundle_folders import BundleError, find_bundle
from fedseg.run.preflight import check_out_kind, check_out_outside, folder_root

if TYPE_CHECKING:
    from fedseg.config import RunConfig


def check_run_paths(cfg: RunConfig, out: Path, resume: bool) -> None:
    """A run's (not a study's) paths: ``out`` a folder or one that can be made, holding no other kind of folder and
    outside the federation folder (as ``fedseg.run.experiment.check_before_data`` checks them first); then, unless
    it resumes a run in an ``out`` that exists (its recorded configuration and data are compared first), the
    federation folder (``--data``, ``data.root``) one (``fedseg.data.folder.root_problem``, as ``check_folder``
    says it) and ``out`` creatable (``check_out_creatable``: the error that making it once the data is prepared
    would raise)."""
    check_out_dir(out)
    check_out_kind(out, "run")
    root = folder_root(cfg)
    check_out_outside(out, root)
    if resume and out.exists():
        return
    if root is not None and (problem := root_problem(Path(root))) is not None:
        raise FederationError(problem)
    check_out_creatable(out)


def input_problem(path: Path) -> str:
    """Why ``path``, an input to predict, is none: a link that leads nowhere, or nothing there."""
    return f"{path}: a broken symbolic link" if path.is_symlink() else f"{path}: no such file or folder"


def check_predict_paths(model: Path, input_: Path, out: Path, algorithm: str | None) -> None:
    """``fedseg predict``'s paths, in the order ``fedseg.predict.predict`` checks them: the bundle ``model`` names
    (``find_bundle``; a folder without one is left to ``fedseg.predict_model.find_model``, which may name the runs
    below it, and nothing after it is checked here), an ``input_`` that exists (``fedseg.predict_inputs.list_inputs``
    says :func:`input_problem` of one that does not) and an ``out`` that is a folder or can be one (``check_out_dir``).
    A ``BundleError`` (the command's ``PredictError``) or a ValueError."""
    try:
        find_bundle(model, algorithm)
    except BundleError:
        if not model.is_dir():  # no runs lie below it: find_model raises this very error
            raise
        return
    if not input_.exists():
        raise BundleError(input_problem(input_))
    check_out_dir(out)
