"""A federation built by user code — passed in memory (``Experiment(..., federation=fed)``) or made by a
builder registered with ``fedseg.data.sources.register_federation`` — checked as ``fedseg data check`` checks a
folder, and fingerprinted so that a resume can tell whether it is given the same data.

A folder federation is checked when it is read (``fedseg.data.check``) and recorded by its files
(``fedseg.run.data_record``); a built-in one is made by fedseg's generators from the configuration. The arrays of a
user-code federation come from anywhere, so :func:`check_user_federation` reads every case once and refuses, in one
``FederationError`` listing every problem (grouped as ``data check`` groups them):

* site names and case ids that cannot name a file (results, samples and models are written under them), duplicate
  site names or case ids within a site, a site without cases;
* an image that is not ``(C, *S)`` with ``C`` = the federation's ``channels`` and ``S`` 2D or 3D as its ``kind``
  says, a label that is not ``S``-shaped like its image, NaN or Inf pixels;
* a label map that is not integer (fractional or non-finite values) or holds values outside the regions (0 is
  background).

The fingerprint is a SHA-256 over the federation's task (kind, channels, regions), its sites in order and, per case,
its id, spacing and both arrays (dtype, shape, bytes): the same data gives the same fingerprint in any process. It
costs one pass over the data at every start (about 1 GB/s).
"""

from __future__ import annotations

import hashlib
import json

import numpy as np

from fedseg.data.check import label_value_problems
from fedseg.data.federation import Federation, FederationError
from fedseg.data.folder import group_problems

SHOWN_PROBLEMS = 12  # lines in the error before "... and N more problems"


def check_user_federation(fed: Federation) -> str:
    """Check ``fed`` (module docstring) and return its fingerprint (64 hex digits); a ``FederationError`` naming
    every problem (the federation, site and case of each) otherwise."""
    digest = hashlib.sha256()
    task: list = [fed.kind, fed.channels, fed.regions.as_dict()]
    if fed.regions.ignore is not None:  # nnU-Net's ignore label; absent: the fingerprint as before
        task.append({"ignore_label": fed.regions.ignore})
    digest.update(json.dumps(task).encode())
    problems = _site_problems(fed)
    for site in fed.sites:
        ids = [case.id for case in site.cases]
        dupes = sorted({i for i in ids if ids.count(i) > 1})
        if dupes:
            problems.append(f"site {site.name!r}: duplicate case ids {dupes}")
        for case in site.cases:
            where = f"site {site.name!r}, case {case.id!r}"
            if (why := _name_problem(case.id)) is not None:
                problems.append(f"{where}: the case id {why}")
            image, label = (np.asarray(a) for a in case.arrays())
            problems += _case_problems(fed, image, label, where)
            digest.update(json.dumps([site.name, case.id, case.spacing]).encode())
            for array in (image, label):
                contiguous = np.ascontiguousarray(array)
                digest.update(f"{contiguous.dtype.str}{contiguous.shape}".encode())
                digest.update(contiguous.data if contiguous.size else b"")
    if problems:
        lines = group_problems(problems)
        more = len(lines) - SHOWN_PROBLEMS
        shown = lines[:SHOWN_PROBLEMS] + ([f"... and {more} more problems"] if more > 0 else [])
        raise FederationError(f"federation {fed.name!r} (given by your code):\n  " + "\n  ".join(shown))
    return digest.hexdigest()


def _site_problems(fed: Federation) -> list[str]:
    names = fed.site_names
    problems = [f"site {n!r}: {why}" for n in names if (why := _name_problem(n)) is not None]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        problems.append(f"duplicate site names {dupes}")
    problems += [f"site {site.name!r}: has no cases" for site in fed.sites if not site.cases]
    if not fed.sites:
        problems.append("has no sites")
    return problems


def _name_problem(name: object) -> str | None:
    """Why ``name`` cannot name a file (fedseg writes files and folders under site names and case ids), or None."""
    if not isinstance(name, str) or not name:
        return f"{name!r} is not a non-empty string"
    if name.startswith(".") or any(c in name for c in "/\\\0") or name != name.strip():
        return f"{name!r} cannot name a file (no '/', '\\', leading '.' or surrounding spaces)"
    return None


def _case_problems(fed: Federation, image: np.ndarray, label: np.ndarray, where: str) -> list[str]:
    """One line per problem of one case's arrays (module docstring)."""
    dims = fed.spatial_dims
    if image.ndim != dims + 1:
        return [f"{where}: image shape {image.shape} is not (channels, {', '.join('HWD'[:dims])}) ({fed.kind})"]
    problems = []
    if image.shape[0] != fed.channels:
        problems.append(f"{where}: image has {image.shape[0]} channels, the federation says channels: {fed.channels}")
    if label.shape != image.shape[1:]:
        problems.append(f"{where}: label shape {label.shape} differs from the image's spatial shape {image.shape[1:]}")
    if not (np.issubdtype(image.dtype, np.number) or image.dtype == bool):
        problems.append(f"{where}: image dtype {image.dtype} is not numeric")
    elif np.issubdtype(image.dtype, np.floating) and not (finite := np.isfinite(image)).all():
        problems.append(f"{where}: image has {int((~finite).sum())} NaN/Inf values (of {image.size}); replace them")
    return problems + _label_problems(fed, label, where)


def _label_problems(fed: Federation, label: np.ndarray, where: str) -> list[str]:
    """An integer (or integral float) label map with values among the regions' and 0 (background)."""
    if np.issubdtype(label.dtype, np.floating):
        if not np.isfinite(label).all() or (label != np.round(label)).any():
            return [f"{where}: label map is not integer (dtype {label.dtype} with fractional or NaN/Inf values)"]
    elif not (label.dtype == bool or np.issubdtype(label.dtype, np.integer)):
        return [f"{where}: label dtype {label.dtype} is not an integer type"]
    return label_value_problems(label, fed.regions, where)


def is_user_federation(source: str, given: Federation | None) -> bool:
    """Whether the run's federation comes from user code: ``given`` in memory, or ``data.source`` a registered
    builder's name (not a folder, not a built-in generator)."""
    from fedseg.data.sources import REGISTERED

    return given is not None or source in REGISTERED
