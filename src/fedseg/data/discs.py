"""The disc federation: a hand-made 2D RGB federation of bright discs holding brighter cups, small and fast to
generate, for tests (``fedseg.testing``'s ``disc_federation``) and benchmarks of many sites
(``benchmarks/scaling.py``)."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from fedseg.data.federation import Case, Federation, Regions, Site


def disc_federation(
    n_sites: int = 3,
    cases_per_site: int = 12,
    size: int = 32,
    seed: int = 0,
    *,
    name: str = "discs",
    site_name: Callable[[int], str] = lambda s: f"site{s + 1}",
    brightness: Callable[[int], int] = lambda s: 10 * s,
) -> Federation:
    """Per case an image ``(3, size, size)`` uint8 of noise (0..39) with a bright disc (label 1, radius ``size / 5``,
    +100) holding a brighter cup (label 2, half the radius, +60 more) and its label map ``(size, size)``; regions
    ``disc`` = {1, 2} and ``cup`` = {2}. Site ``s`` (0-based) is named ``site_name(s)`` and its images are
    ``brightness(s)`` brighter (uint8 arithmetic: keep it below 56), so the sites differ a little; its cases are
    ``s<s+1>_000``, ... Every draw comes from one generator seeded with ``seed``, site after site."""
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[:size, :size]
    sites = []
    for s in range(n_sites):
        cases = []
        for i in range(cases_per_site):
            cy, cx = rng.integers(size // 4, 3 * size // 4, 2)
            r = size / 5
            d2 = (yy - cy) ** 2 + (xx - cx) ** 2
            label = np.zeros((size, size), np.uint8)
            label[d2 < r * r] = 1
            label[d2 < (r / 2) ** 2] = 2
            image = rng.integers(0, 40, (3, size, size)).astype(np.uint8) + brightness(s)
            image[:, label > 0] += 100
            image[:, label == 2] += 60
            cases.append(Case.from_arrays(f"s{s + 1}_{i:03d}", image.astype(np.uint8), label))
        sites.append(Site(site_name(s), cases))
    return Federation(name, "2d", 3, Regions.from_mapping({"disc": [1, 2], "cup": [2]}), sites)
