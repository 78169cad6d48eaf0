"""NRRD and MetaImage files written on a source file's grid: the mirror of ``readers``' ITK formats
(``readers.ITK_EXTS``), for ``fedseg predict``'s masks of ``.nrrd``, ``.mha`` and ``.mhd`` inputs.

The grid is the source's as ITK reads its header (``readers.itk_geometry``: spacing, origin and one direction per
axis, in LPS and the file's own axis order), written as ITK writes these formats and as ITK (``readers``) reads them
back: MetaImage ``TransformMatrix`` (each axis's direction in turn), ``Offset``, ``ElementSpacing``; NRRD ``space:
left-posterior-superior`` (a 3D file; another dimension: ``space dimension``), ``space directions`` (each axis's
direction times its spacing), ``space origin``. Numbers are written as Python's ``repr`` (the shortest text that reads
back as the same double), so the written grid is the source's to the last bit (NRRD's ``space directions`` fold the
spacing into the vectors, which ITK splits again: to within a rounding of the last bit). Voxels in the file's index
order (array axis 0 fastest: ``readers``' orientation rule), little-endian, compressed (MetaImage
``CompressedData``: zlib; NRRD ``encoding: gzip``), in one file: a ``.mha`` (a ``.mhd`` source's mask too: one file,
no ``.raw`` beside it) or an ``.nrrd`` with its header attached. No ITK needed to write.
"""

from __future__ import annotations

import gzip
import zlib
from pathlib import Path

import numpy as np

from fedseg.atomic_files import naming_errors
from fedseg.data.readers import ItkGeometry

# MetaImage ElementType and NRRD type of each dtype written (readers._MET_BYTES / _NRRD_BYTES name them too)
MET_TYPES = {
    "uint8": "MET_UCHAR", "int8": "MET_CHAR", "uint16": "MET_USHORT", "int16": "MET_SHORT", "uint32": "MET_UINT",
    "int32": "MET_INT", "uint64": "MET_ULONG_LONG", "int64": "MET_LONG_LONG", "float32": "MET_FLOAT",
    "float64": "MET_DOUBLE",
}  # fmt: skip
NRRD_TYPES = {name: "float" if name == "float32" else "double" if name == "float64" else name for name in MET_TYPES}

WRITTEN_EXTS = {"mha": "mha", "mhd": "mha", "nrrd": "nrrd"}  # a source's format (readers.ITK_EXTS) -> its mask's


def written_ext(ext: str) -> str:
    """The extension of the file written for a source of extension ``ext`` (``readers.ITK_EXTS``, any case): one
    file, a ``.mhd`` header's (with its ``.raw``) as ``.mha``."""
    return WRITTEN_EXTS[ext.lower()]


def _number(value: float) -> str:
    """``repr`` of a double (reads back as the same double), without a trailing ``.0``: ``10``, ``0.7``, ``-2.5``."""
    text = repr(float(value) + 0.0)  # + 0.0: -0.0 (a flipped axis's zero) as 0
    return text[:-2] if text.endswith(".0") else text


def _numbers(values: np.ndarray | tuple[float, ...]) -> str:
    return " ".join(_number(v) for v in np.ravel(values))


def fitted(geometry: ItkGeometry, dims: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(spacing, origin, direction)`` of ``geometry``'s first ``dims`` axes (an array of fewer dimensions than its
    file), or its axes embedded with unit, orthogonal further ones (more)."""
    n = min(dims, len(geometry.shape))
    spacing, origin, direction = np.ones(dims), np.zeros(dims), np.eye(dims)
    spacing[:n], origin[:n], direction[:n, :n] = geometry.spacing[:n], geometry.origin[:n], geometry.direction[:n, :n]
    return spacing, origin, direction


def _voxels(data: np.ndarray) -> tuple[str, bytes]:
    """The dtype's name (bool as uint8) and the voxels as little-endian bytes, array axis 0 fastest."""
    data = data.astype(np.uint8) if data.dtype == bool else data
    name = data.dtype.name
    if name not in MET_TYPES:
        raise ValueError(f"cannot write {name} voxels as NRRD or MetaImage (expected one of {', '.join(MET_TYPES)})")
    return name, data.astype(data.dtype.newbyteorder("<"), copy=False).tobytes(order="F")


def metaimage_bytes(data: np.ndarray, geometry: ItkGeometry) -> bytes:
    """A ``.mha`` file (header and zlib-compressed voxels) of ``data`` ``(*spatial)`` on ``geometry``."""
    name, raw = _voxels(data)
    spacing, origin, direction = fitted(geometry, data.ndim)
    packed = zlib.compress(raw)
    header = [
        "ObjectType = Image",
        f"NDims = {data.ndim}",
        "BinaryData = True",
        "BinaryDataByteOrderMSB = False",
        "CompressedData = True",
        f"CompressedDataSize = {len(packed)}",
        f"TransformMatrix = {_numbers(direction.T)}",  # axis 0's direction, then axis 1's...
        f"Offset = {_numbers(origin)}",
        f"ElementSpacing = {_numbers(spacing)}",
        f"DimSize = {' '.join(str(n) for n in data.shape)}",
        f"ElementType = {MET_TYPES[name]}",
        "ElementDataFile = LOCAL",
    ]
    return ("\n".join(header) + "\n").encode("ascii") + packed


def nrrd_bytes(data: np.ndarray, geometry: ItkGeometry) -> bytes:
    """An ``.nrrd`` file (attached header, gzip-encoded voxels) of ``data`` ``(*spatial)`` on ``geometry``."""
    name, raw = _voxels(data)
    spacing, origin, direction = fitted(geometry, data.ndim)
    vectors = direction * spacing  # column k: axis k's step in mm
    header = [
        "NRRD0004",
        "# Complete NRRD file format specification at:",
        "# http://teem.sourceforge.net/nrrd/format.html",
        f"type: {NRRD_TYPES[name]}",
        f"dimension: {data.ndim}",
        "space: left-posterior-superior" if data.ndim == 3 else f"space dimension: {data.ndim}",
        f"sizes: {' '.join(str(n) for n in data.shape)}",
        "space directions: " + " ".join(f"({','.join(_number(v) for v in vectors[:, k])})" for k in range(data.ndim)),
        "kinds: " + " ".join(["domain"] * data.ndim),
        *(["endian: little"] if data.dtype.itemsize > 1 else []),
        "encoding: gzip",
        f"space origin: ({','.join(_number(v) for v in origin)})",
    ]
    return ("\n".join(header) + "\n\n").encode("ascii") + gzip.compress(raw, mtime=0)


def write_itk_volume(path: Path, data: np.ndarray, geometry: ItkGeometry) -> None:
    """``data`` ``(*spatial)`` as the MetaImage (``.mha``) or NRRD (``.nrrd``) file ``path`` on ``geometry`` (a
    source file's, ``readers.itk_geometry``), in the stored dtype (bool as uint8)."""
    ext = path.name.lower().rpartition(".")[2]
    if ext not in ("mha", "nrrd"):
        raise ValueError(f"{path}: writes .mha or .nrrd files")
    content = metaimage_bytes(data, geometry) if ext == "mha" else nrrd_bytes(data, geometry)
    with naming_errors(path):
        path.write_bytes(content)
