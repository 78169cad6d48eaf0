"""Where a run's federation comes from (``data.source``): ``folder`` (``data.root``), a built-in
synthetic federation, or a federation registered from user code with :func:`register_federation`.

A registered source is a *builder*: a callable taking the run's ``RunConfig`` and returning a
``Federation`` (it may read ``cfg.data.scale``, ``cfg.data.image_size``, ``cfg.data.seed``...), or a
ready ``Federation``. Registration lives in the registering process only: a run that names the source
(``data.source: NAME``), a resume of it and a study plan it must run where it was registered.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from fedseg.data.federation import Federation, FederationError
from fedseg.data.synthetic import SYNTHETIC_NAMES
from fedseg.data.synthetic_brats import SYNTHETIC_BRATS

if TYPE_CHECKING:
    from fedseg.config import RunConfig

FOLDER = "folder"
FederationBuilder = Callable[["RunConfig"], Federation]
NAME_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")


@dataclass(frozen=True)
class RegisteredFederation:
    name: str
    builder: FederationBuilder
    sites: int | None = None  # the number of sites, if known without building (study plans)


REGISTERED: dict[str, RegisteredFederation] = {}


BUILTIN_NAMES = (*SYNTHETIC_NAMES, SYNTHETIC_BRATS)  # the built-in federations, 2D then 3D


def builtin_sources() -> tuple[str, ...]:
    return (FOLDER, *BUILTIN_NAMES)


def build_builtin(name: str, scale: float, image_size: int, seed: int, *, cache: bool = True) -> Federation:
    """The built-in federation ``name`` (one of ``BUILTIN_NAMES``) at ``scale`` with ``image_size`` voxels per
    (in-plane) axis: from the on-disk cache, else generated in parallel (``fedseg.data.cache``; ``cache=False``:
    generated, the cache neither read nor written). Identical arrays either way."""
    from fedseg.data.cache import BuiltinParams, cached_builtin, generate

    if name not in BUILTIN_NAMES:
        raise unknown_source(name)
    check_builtin(name, scale, image_size)
    params = BuiltinParams(name, scale, image_size, seed)
    return cached_builtin(params) if cache else generate(params)


def check_builtin(name: str, scale: float, image_size: int) -> None:
    """``FederationError`` for a non-positive ``scale`` or an ``image_size`` below the generator's minimum
    (before any cache lookup or process pool)."""
    from fedseg.data import synthetic, synthetic_brats

    minimum = synthetic_brats.MIN_IMAGE_SIZE if name == SYNTHETIC_BRATS else synthetic.MIN_IMAGE_SIZE
    if not (scale > 0 and math.isfinite(scale)):
        raise FederationError(f"synthetic federation scale must be a finite number > 0, got {scale}")
    if image_size < minimum:
        raise FederationError(f"{name}: image_size must be >= {minimum}, got {image_size}")
    needed, memory = builtin_bytes(name, scale, image_size), physical_memory()
    if memory is not None and needed > memory:
        raise FederationError(
            f"{name} at scale {scale:g} and image size {image_size} holds ~{needed / 2**30:,.0f} GiB in memory, more "
            f"than this machine's {memory / 2**30:,.0f} GiB (its memory, or its container's limit): choose a smaller "
            "scale or image size"
        )


def builtin_bytes(name: str, scale: float, image_size: int) -> int:
    """About the bytes built-in federation ``name`` holds in memory once generated: per voxel its image (3D: 4
    int16 channels; 2D: one uint8 per channel) and its uint8 label."""
    from fedseg.data.cache import builtin_voxels
    from fedseg.data.synthetic import synthetic_spec

    _, voxels = builtin_voxels(name, scale, image_size)
    return voxels * (4 * 2 + 1 if name == SYNTHETIC_BRATS else synthetic_spec(name).channels + 1)


CGROUP_LIMITS = (Path("/sys/fs/cgroup/memory.max"), Path("/sys/fs/cgroup/memory/memory.limit_in_bytes"))  # v2, v1


def physical_memory(cgroup_files: Sequence[Path] = CGROUP_LIMITS) -> int | None:
    """The memory this process may use, in bytes: the machine's physical memory, or a container's lower limit
    (the cgroup's ``memory.max``, v2, or ``memory.limit_in_bytes``, v1: a container given 8 GB on a 64 GB host is
    killed past 8 GB); None where the platform says neither."""
    import os

    known = []
    try:
        known.append(int(os.sysconf("SC_PAGE_SIZE")) * int(os.sysconf("SC_PHYS_PAGES")))
    except (AttributeError, OSError, ValueError):
        pass
    for path in cgroup_files:
        try:
            text = path.read_text().strip()
        except OSError:
            continue
        if text.isdigit():  # "max" (v2) or a number near 2**63 (v1): no limit below the machine's
            known.append(int(text))
        break
    return min(known) if known else None


def source_names() -> list[str]:
    """Every name ``data.source`` accepts: ``folder``, the built-in federations, then the registered ones."""
    return [*builtin_sources(), *REGISTERED]


def register_federation(
    name: str, builder: FederationBuilder | Federation, *, sites: int | None = None, replace: bool = False
) -> None:
    """Make ``data.source: NAME`` build a federation with ``builder(cfg)`` (or use a ready ``Federation``).

    ``sites``: its number of sites, if known without building it (a study plan checks it before any
    work; else the builder is called). A built-in name is refused; a name already registered is refused
    unless ``replace`` (e.g. a notebook cell run again)."""
    if not isinstance(name, str) or not NAME_PATTERN.fullmatch(name):
        raise ValueError(f"federation name {name!r}: use letters, digits, '.', '_' and '-' (not starting with one)")
    if name in builtin_sources():
        raise ValueError(f"federation name {name!r} is built in; choose another name")
    if name in REGISTERED and not replace:
        raise ValueError(
            f"federation {name!r} is already registered; choose another name or pass replace=True to replace it"
        )
    if isinstance(builder, Federation):
        ready = builder
        REGISTERED[name] = RegisteredFederation(name, lambda cfg: ready, len(ready.sites) if sites is None else sites)
        return
    if not callable(builder):
        raise TypeError(f"register_federation({name!r}, ...): expected a callable cfg -> Federation or a Federation")
    REGISTERED[name] = RegisteredFederation(name, builder, sites)


def unregister_federation(name: str) -> None:
    """Forget a registered federation (a KeyError if ``name`` is not a registered one)."""
    if name not in REGISTERED:
        raise KeyError(f"{name!r} is not a registered federation; registered: {', '.join(REGISTERED) or 'none'}")
    del REGISTERED[name]


#: what a resume in a fresh process needs when its run named a registered federation (the API adds it to the error)
REGISTER_AGAIN = (
    "a federation added with register_federation exists only in the process that registered it: register it again "
    "(fedseg.data.sources.register_federation) before resuming its run"
)


class UnknownSource(FederationError):
    """``data.source`` names no federation: neither ``folder``, a built-in one nor one registered in this process
    (``name``: the name, e.g. a registered one's, in a process that did not register it: :data:`REGISTER_AGAIN`)."""

    def __init__(self, name: str, message: str) -> None:
        super().__init__(message)
        self.name = name

    def __reduce__(self):  # pickled as built (a worker process's error reaches the run)
        return type(self), (self.name, self.args[0])


def unknown_source(name: str) -> UnknownSource:
    return UnknownSource(name, f"unknown data.source {name!r}; available: {', '.join(source_names())}")


def build_federation(cfg: RunConfig) -> Federation:
    """The federation of a built-in or registered ``cfg.data.source`` (not ``folder``)."""
    name = cfg.data.source
    if name in REGISTERED:
        fed = REGISTERED[name].builder(cfg)
        if not isinstance(fed, Federation):
            raise FederationError(f"federation builder {name!r} returned {type(fed).__name__}, not a Federation")
        return fed
    if name not in BUILTIN_NAMES:
        raise unknown_source(name)
    return build_builtin(name, cfg.data.scale, cfg.data.image_size, cfg.data.seed)


def count_source_sites(cfg: RunConfig) -> int:
    """Number of sites of a built-in or registered ``cfg.data.source`` (a registered one without a
    declared count is built)."""
    name = cfg.data.source
    if name in REGISTERED:
        entry = REGISTERED[name]
        return entry.sites if entry.sites is not None else len(build_federation(cfg).sites)
    if name == SYNTHETIC_BRATS:
        from fedseg.data.synthetic_brats import INSTITUTIONS

        return len(INSTITUTIONS)
    if name not in SYNTHETIC_NAMES:
        raise unknown_source(name)
    from fedseg.data.synthetic import synthetic_spec

    return len(synthetic_spec(name).styles)
