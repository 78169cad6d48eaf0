"""Preprocessed tensors of one site's split, and a site's three splits together."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import torch

from fedseg.config import DataConfig
from fedseg.data.federation import Federation, Site
from fedseg.data.preprocess import case_tensors


@dataclass
class CaseSet:
    """Cases of one split at model resolution.

    ``x``: ``(N, C, *S)`` float32 images, ``y``: ``(N, R, *S)`` float32 region masks, ``ids``: N case ids.
    """

    name: str
    ids: list[str]
    x: torch.Tensor
    y: torch.Tensor

    def __len__(self) -> int:
        return len(self.ids)

    def batch(self, idx: torch.Tensor, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        return self.x[idx].to(device), self.y[idx].to(device)

    @classmethod
    def concat(cls, name: str, sets: list[CaseSet]) -> CaseSet:
        """Pool several sets (centralized training); ids are prefixed with their set's name."""
        ids = [f"{s.name}/{i}" for s in sets for i in s.ids]
        return cls(name, ids, torch.cat([s.x for s in sets]), torch.cat([s.y for s in sets]))


@dataclass
class SiteData:
    """What one site holds locally: its name, index in the federation and three splits."""

    name: str
    index: int
    train: CaseSet
    val: CaseSet
    test: CaseSet

    def split(self, name: str) -> CaseSet:
        return {"train": self.train, "val": self.val, "test": self.test}[name]


def build_site_data(fed: Federation, site: Site, index: int, splits: Mapping[str, str], cfg: DataConfig) -> SiteData:
    """Load and preprocess one site's cases into its train/val/test ``CaseSet``s."""
    by_split: dict[str, list] = {"train": [], "val": [], "test": []}
    for case in site.cases:
        by_split[splits[case.id]].append(case)
    sets = {}
    for split, cases in by_split.items():
        xs, ys = [], []
        for case in cases:
            image, label = case.arrays()
            x, y = case_tensors(image, label, fed.regions, cfg.image_size, cfg.normalize)
            xs.append(x)
            ys.append(y)
        shape_x = (0, fed.channels) + (cfg.image_size,) * fed.spatial_dims
        shape_y = (0, len(fed.regions)) + (cfg.image_size,) * fed.spatial_dims
        sets[split] = CaseSet(
            f"{site.name}:{split}",
            [c.id for c in cases],
            torch.stack(xs) if xs else torch.empty(shape_x),
            torch.stack(ys) if ys else torch.empty(shape_y),
        )
    return SiteData(site.name, index, sets["train"], sets["val"], sets["test"])
