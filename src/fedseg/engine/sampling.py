"""Client sampling (config ``fl.clients_per_round``): which sites train in a round.

The draw is a function of (``seed``, round) only: the same sites on every engine, for any number of
workers, after a resume, whatever happened in earlier rounds (failures included). ``K`` of the ``N``
sites are drawn without replacement, uniformly; they are returned in federation order, so the
exchange and the merge see them in the same order as without sampling. ``fl.clients_per_round``
is a fraction ``q`` in (0, 1] (``K = max(1, round(q N))``) or a count ``K`` (at most ``N``); None or
``K = N`` means every site (no draw).

Which methods may sample is the servers' business (``fedseg.algorithms.sampling.sampling_refusal``):
the sampling itself is this one function.
"""

from __future__ import annotations

import numpy as np

SAMPLING_STREAM = 0x5A3D1E  # separates this stream from every other (seed, ...) stream of a run


def sample_count(num_sites: int, clients_per_round: int | float | None) -> int:
    """``K``: how many of ``num_sites`` sites train per round; a ValueError if a count exceeds ``num_sites``."""
    if clients_per_round is None:
        return num_sites
    if isinstance(clients_per_round, float):
        return max(1, min(num_sites, round(clients_per_round * num_sites)))
    if clients_per_round > num_sites:
        raise ValueError(
            f"fl.clients_per_round = {clients_per_round} sites, but the federation has only {num_sites}; "
            "use a count <= the number of sites or a fraction in (0, 1]"
        )
    return clients_per_round


def sample_sites(sites: list[str], clients_per_round: int | float | None, seed: int, rnd: int) -> list[str]:
    """The sites that train in round ``rnd`` (federation order): ``K`` drawn from (``seed``, ``rnd``) alone."""
    k = sample_count(len(sites), clients_per_round)
    if k == len(sites):
        return list(sites)
    rng = np.random.default_rng(np.random.SeedSequence([seed, rnd, SAMPLING_STREAM]))
    chosen = set(rng.choice(len(sites), size=k, replace=False).tolist())
    return [s for i, s in enumerate(sites) if i in chosen]
