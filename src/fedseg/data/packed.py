"""Boolean masks of different shapes in one buffer: the original-grid truth of a set's resized cases
(``CaseSet.originals``, ``eval.score_grid: original``).

One bit a voxel (``np.packbits``) in one tensor, whatever the number of cases: a tensor per case cost one open file
per case where a set crossed to a worker process (torch's shared-memory file descriptors: a review's 300 resized
cases hit "Too many open files"), and a bool per region and voxel cost 8 times the memory (REFUGE's 2124x2056
fundus photographs with disc and cup: 8.7 MB a case; packed: 1.1 MB).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch


@dataclass(frozen=True)
class PackedMasks:
    """Per case a bool mask ``(R, *S_i)`` or None. ``bits``: uint8 ``(n_bytes,)``, every present mask packed one
    after another (each starting on a byte); ``shapes``: per case its mask's shape, None where it has none;
    ``starts``: per case its first byte in ``bits`` (-1 where none)."""

    bits: torch.Tensor
    shapes: tuple[tuple[int, ...] | None, ...]
    starts: tuple[int, ...]

    @classmethod
    def pack(cls, masks: Sequence[np.ndarray | torch.Tensor | None]) -> PackedMasks | None:
        """``masks`` (each bool or 0/1, any shape, or None) packed; None where every one is None."""
        if all(m is None for m in masks):
            return None
        parts: list[np.ndarray] = []
        shapes: list[tuple[int, ...] | None] = []
        starts: list[int] = []
        at = 0
        for mask in masks:
            if mask is None:
                shapes.append(None)
                starts.append(-1)
                continue
            array = np.asarray(mask).astype(bool, copy=False)
            packed = np.packbits(array.ravel())
            parts.append(packed)
            shapes.append(tuple(array.shape))
            starts.append(at)
            at += packed.size
        return cls(torch.from_numpy(np.concatenate(parts)), tuple(shapes), tuple(starts))

    def __len__(self) -> int:
        return len(self.shapes)

    def get(self, case: int) -> torch.Tensor | None:
        """Case ``case``'s mask as a bool tensor (a new one), or None."""
        shape = self.shapes[case]
        if shape is None:
            return None
        count, start = math.prod(shape), self.starts[case]
        raw = self.bits[start : start + (count + 7) // 8].numpy()
        return torch.from_numpy(np.unpackbits(raw, count=count).reshape(shape).astype(bool))

    def select(self, cases: Sequence[int]) -> PackedMasks | None:
        """The masks of ``cases``, in that order (None where none of them has one)."""
        return PackedMasks.pack([self.get(i) for i in cases])

    @staticmethod
    def join(sets: Sequence[tuple[PackedMasks | None, int]]) -> PackedMasks | None:
        """The masks of several sets one after another; ``sets``: ``(their masks or None, their number of cases)``."""
        return PackedMasks.pack([None if m is None else m.get(i) for m, n in sets for i in range(n)])
