"""Where a volume's voxels lie (``VoxelGrid``: its spatial shape and the affine from voxel indices to RAS+ mm,
nibabel's convention; ITK and DICOM state LPS, converted by ``LPS_TO_RAS``), and whether two grids agree
(``grid_mismatch``, from the headers alone). The readers (``fedseg.data.readers``, ``fedseg.data.dicom_series``) make
these grids; the label readers (DICOM-SEG, RTSTRUCT) and a case's image/label check compare them."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

LPS_TO_RAS = np.diag([-1.0, -1.0, 1.0, 1.0])


@dataclass(frozen=True)
class VoxelGrid:
    """Where a volume's voxels lie: ``shape`` the spatial shape (array order), ``affine`` 4x4 voxel index ->
    RAS+ mm (a 2D grid is embedded with a unit third axis)."""

    shape: tuple[int, ...]
    affine: np.ndarray

    def spacing(self, dims: int) -> tuple[float, ...]:
        """Voxel size in mm along the first ``dims`` array axes."""
        return tuple(float(v) for v in np.linalg.norm(self.affine[:3, :dims], axis=0))


def numbers_text(values: np.ndarray) -> str:
    """``(0.8, 0.8, 2.5)``: numbers as a reader writes them (rounded, no numpy reprs)."""
    return "(" + ", ".join(f"{float(x):g}" for x in np.round(values, 3)) + ")"


def grid_mismatch(grid: VoxelGrid, reference: VoxelGrid) -> str | None:
    """How ``grid``'s voxels lie elsewhere than ``reference``'s, in words ending in ``mm`` (its spacing, an axis
    flipped or rotated, its origin), or ``None`` when they agree: voxel axes (direction x spacing) to 0.1 %, origins
    to half the smallest voxel (header rounding). Shapes are not compared."""
    a, b = grid.affine, reference.affine
    spacing_a, spacing_b = np.linalg.norm(a[:3, :3], axis=0), np.linalg.norm(b[:3, :3], axis=0)
    if not np.allclose(spacing_a, spacing_b, rtol=1e-3, atol=1e-3):
        return f"spacing {numbers_text(spacing_a)} vs {numbers_text(spacing_b)} mm"
    if not np.allclose(a[:3, :3], b[:3, :3], rtol=1e-3, atol=1e-3):
        axes = lambda m: np.array2string(m[:3, :3].round(3) + 0.0, separator=",").replace("\n", "")  # noqa: E731
        return f"an axis flipped or rotated: voxel axes {axes(a)} vs {axes(b)} mm"
    if np.linalg.norm(a[:3, 3] - b[:3, 3]) > 0.5 * min(spacing_b):
        return f"origin {numbers_text(a[:3, 3])} vs {numbers_text(b[:3, 3])} mm"
    return None


def embed_affine(affine: np.ndarray) -> np.ndarray:
    """A ``(n+1, n+1)`` affine (n <= 3 spatial axes) as 4x4, the missing axes unit and orthogonal."""
    n = affine.shape[0] - 1
    out = np.eye(4)
    out[:n, :n], out[:n, 3] = affine[:n, :n], affine[:n, n]
    return out
