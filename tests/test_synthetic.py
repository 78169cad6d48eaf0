"""Built-in synthetic federations: contract, determinism, site sizes and the documented site design."""

from __future__ import annotations

from functools import cache

import numpy as np
import pytest

from fedseg.data.federation import FederationError
from fedseg.data.synthetic import SYNTHETIC_NAMES, build_synthetic

SIZE, SCALE, SEED = 32, 0.05, 3
# FedSM paper, Tables 1 and 2: train + val + test cases per site
PAPER_TOTALS = {
    "synthetic-retina": [50 + 25 + 26, 98 + 49 + 48, 47 + 24 + 23, 230 + 115 + 115, 80 + 40 + 39, 400 + 200 + 200],
    "synthetic-prostate": [
        153 + 77 + 61,
        404 + 215 + 245,
        464 + 219 + 198,
        361 + 162 + 150,
        609 + 289 + 329,
        1179 + 582 + 532,
    ],
}
CHANNELS = {"synthetic-retina": 3, "synthetic-prostate": 1}
LABELS = {"synthetic-retina": {0, 1, 2}, "synthetic-prostate": {0, 1}}


@cache
def built(name: str, scale: float = SCALE, size: int = SIZE, seed: int = SEED):
    """Each federation is generated once per test session."""
    return build_synthetic(name, scale, size, seed)


@pytest.fixture(params=SYNTHETIC_NAMES)
def fed(request):
    return built(request.param)


def all_arrays(federation):
    return [(case.id, *case.arrays()) for site in federation.sites for case in site.cases]


def test_contract(fed):
    assert fed.kind == "2d" and fed.spatial_dims == 2
    assert fed.channels == CHANNELS[fed.name]
    assert fed.site_names == [f"site{k}" for k in range(1, 7)]
    assert set(fed.label_names) == LABELS[fed.name]
    assert fed.regions.label_values <= LABELS[fed.name]
    for site in fed.sites:
        assert site.fixed_splits is None
        assert [c.id for c in site.cases] == [f"{site.name}_{i:04d}" for i in range(len(site.cases))]
        for case in site.cases:
            image, label = case.arrays()
            assert image.shape == (fed.channels, SIZE, SIZE) and image.dtype == np.uint8
            assert label.shape == (SIZE, SIZE) and label.dtype == np.uint8
            assert set(np.unique(label).tolist()) <= LABELS[fed.name]


def test_site_sizes_follow_paper_times_scale(fed):
    expected = [max(8, round(SCALE * n)) for n in PAPER_TOTALS[fed.name]]
    assert [len(s.cases) for s in fed.sites] == expected


@pytest.mark.parametrize("name", SYNTHETIC_NAMES)
def test_small_scale_keeps_eight_cases_per_site(name):
    tiny = build_synthetic(name, 0.01, 16, SEED)
    assert [len(s.cases) for s in tiny.sites] == [max(8, round(0.01 * n)) for n in PAPER_TOTALS[name]]
    assert min(len(s.cases) for s in tiny.sites) == 8


def test_same_arguments_give_identical_arrays(fed):
    again = build_synthetic(fed.name, SCALE, SIZE, SEED)  # a fresh build, not the cached one
    for (id_a, img_a, lab_a), (id_b, img_b, lab_b) in zip(all_arrays(fed), all_arrays(again), strict=True):
        assert id_a == id_b
        np.testing.assert_array_equal(img_a, img_b)
        np.testing.assert_array_equal(lab_a, lab_b)


def test_other_seed_gives_other_cases(fed):
    other = built(fed.name, seed=SEED + 1)
    pairs = list(zip(all_arrays(fed), all_arrays(other)))
    assert all(not np.array_equal(a[1], b[1]) for a, b in pairs)
    assert sum(not np.array_equal(a[2], b[2]) for a, b in pairs) > 0.9 * len(pairs)


def test_scale_only_adds_cases_at_the_end(fed):
    bigger = built(fed.name, scale=2 * SCALE)
    for site, big in zip(fed.sites, bigger.sites):
        assert len(big.cases) >= len(site.cases)
        for case, same in zip(site.cases, big.cases):
            assert case.id == same.id
            np.testing.assert_array_equal(case.arrays()[0], same.arrays()[0])
            np.testing.assert_array_equal(case.arrays()[1], same.arrays()[1])


def test_every_case_shows_its_regions(fed):
    for _, image, label in all_arrays(fed):
        masks = fed.regions.one_hot(label)
        assert masks.sum(axis=(1, 2)).min() > 0, "every region is present in every case"
        assert image.max() > image.min()
    if fed.name == "synthetic-retina":
        for _, _, label in all_arrays(fed):
            disc, cup = fed.regions.one_hot(label)
            assert np.all(cup <= disc) and 0 < cup.sum() < disc.sum()


def test_retina_cup_is_surrounded_by_rim():
    """At 64 x 64 no cup pixel touches the background (annotators leave a rim around the cup)."""
    fed = build_synthetic("synthetic-retina", 0.02, 64, SEED)
    for _, _, label in all_arrays(fed):
        background = np.pad(label == 0, 1)
        near_background = background[:-2, 1:-1] | background[2:, 1:-1] | background[1:-1, :-2] | background[1:-1, 2:]
        assert not np.any((label == 2) & near_background)


def test_retina_sites_differ_in_zoom_and_colour():
    """The documented low similarity: site5 is zoomed in (large disc), site2 is dark, site3 is pale."""
    fed = built("synthetic-retina")
    disc_area = [np.mean([(c.arrays()[1] > 0).mean() for c in s.cases]) for s in fed.sites]
    brightness = [np.mean([c.arrays()[0].mean() for c in s.cases]) for s in fed.sites]
    assert disc_area[4] > 2 * disc_area[1]
    assert brightness[1] < 0.5 * brightness[2]


def test_prostate_sites_share_anatomy():
    """The documented high similarity: per-site prostate size has the same distribution."""
    fed = built("synthetic-prostate", scale=2 * SCALE)
    area = [np.mean([c.arrays()[1].mean() for c in s.cases]) for s in fed.sites]
    assert max(area) < 1.3 * min(area)


def test_geometry_does_not_depend_on_image_size():
    """A seed draws the same anatomy at every resolution: region areas (as image fractions) agree."""
    for name in SYNTHETIC_NAMES:
        small, large = built(name), built(name, size=2 * SIZE)
        for site_s, site_l in zip(small.sites, large.sites):
            for case_s, case_l in zip(site_s.cases, site_l.cases):
                area_s = small.regions.one_hot(case_s.arrays()[1]).mean(axis=(1, 2))
                area_l = large.regions.one_hot(case_l.arrays()[1]).mean(axis=(1, 2))
                np.testing.assert_allclose(area_s, area_l, rtol=0.2, atol=3 / SIZE**2)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"name": "synthetic-brain"}, "synthetic-retina, synthetic-prostate"),
        ({"scale": 0.0}, "scale"),
        ({"image_size": 8}, "image_size"),
    ],
)
def test_bad_arguments_raise(kwargs, match):
    args = {"name": "synthetic-retina", "scale": SCALE, "image_size": SIZE, "seed": SEED} | kwargs
    with pytest.raises(FederationError, match=match):
        build_synthetic(**args)


def test_batching_does_not_change_a_case(monkeypatch):
    """Cases are rendered in vectorized batches; the batch size must not leak into the pixels."""
    import fedseg.data.synthetic as synthetic

    for name in SYNTHETIC_NAMES:
        reference = built(name, scale=0.02)
        monkeypatch.setattr(synthetic, "BATCH_PIXELS", 3 * SIZE * SIZE)
        rebatched = build_synthetic(name, 0.02, SIZE, SEED)
        monkeypatch.undo()
        for (_, img_a, lab_a), (_, img_b, lab_b) in zip(all_arrays(reference), all_arrays(rebatched), strict=True):
            np.testing.assert_array_equal(img_a, img_b)
            np.testing.assert_array_equal(lab_a, lab_b)
