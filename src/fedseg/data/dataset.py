"""Preprocessed tensors of one site's split, and a site's three splits together."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import torch

from fedseg.config import DataConfig
from fedseg.data.federation import Federation, Site
from fedseg.data.metadata import metadata_value
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
    """What one site holds locally: its name, index in the federation, three splits and its metadata.

    ``metadata``: the site-level metadata (``federation.yaml`` ``sites:``); ``case_metadata``: case id ->
    case-level metadata (``cases.csv`` columns) for every case of the site, whatever its split (``{}``
    for a case without any). Metadata is never a model input unless a method says so.
    """

    name: str
    index: int
    train: CaseSet
    val: CaseSet
    test: CaseSet
    metadata: dict[str, object] = field(default_factory=dict)
    case_metadata: dict[str, dict[str, object]] = field(default_factory=dict)

    def split(self, name: str) -> CaseSet:
        return {"train": self.train, "val": self.val, "test": self.test}[name]

    def metadata_value(self, key: str) -> str:
        """The site's value of metadata ``key``, as a string: the site-level value if there is one, else
        the most common non-empty value of the case-level column ``key`` over all the site's cases (ties:
        the smallest value in string order). Raises ``ValueError`` naming the keys the site has when
        neither exists. Deterministic: a function of the metadata alone."""
        return metadata_value(self.name, key, self.metadata, self.case_metadata)


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
    return SiteData(
        site.name,
        index,
        sets["train"],
        sets["val"],
        sets["test"],
        metadata=dict(site.meta),
        case_metadata={case.id: case.metadata for case in site.cases},
    )
