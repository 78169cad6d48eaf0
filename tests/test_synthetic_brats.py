"""``synthetic-brats``: the built-in 3D federation (BraTS labels, nested regions, grades, spacing, sites)."""

from __future__ import annotations

import json
from functools import cache

import nibabel as nib
import numpy as np
import pytest
from typer.testing import CliRunner

from fedseg.data.check import check_folder
from fedseg.data.cli import data_app
from fedseg.data.federation import FederationError
from fedseg.data.sources import build_federation, count_source_sites, source_names
from fedseg.data.synthetic_brats import (
    FOV_MM,
    INSTITUTIONS,
    MODALITIES,
    SYNTHETIC_BRATS,
    build_synthetic_brats,
    site_sizes,
)

SIZE, SCALE, SEED = 16, 0.05, 1


@cache
def built(scale: float = SCALE, size: int = SIZE, seed: int = SEED):
    """The federation and every case's arrays, generated once per test session."""
    fed = build_synthetic_brats(scale, size, seed)
    return fed, {c.id: c.arrays() for s in fed.sites for c in s.cases}


def test_contract_shapes_dtypes_labels_and_spacing():
    fed, arrays = built()
    assert (fed.name, fed.kind, fed.channels) == (SYNTHETIC_BRATS, "3d", len(MODALITIES))
    assert fed.regions.as_dict() == {"WT": [1, 2, 4], "TC": [1, 4], "ET": [4]}
    assert set(fed.label_names or {}) == {0, 1, 2, 4}
    assert fed.site_names == [f"site{k}" for k in range(1, len(INSTITUTIONS) + 1)]
    for site, inst in zip(fed.sites, INSTITUTIONS):
        for case in site.cases:
            image, label = arrays[case.id]
            assert image.dtype == np.int16 and label.dtype == np.uint8
            assert image.shape == (4, *label.shape) and label.shape[:2] == (SIZE, SIZE)
            assert set(np.unique(label).tolist()) <= {0, 1, 2, 4}
            assert image.min() >= 0 and (image[:, label > 0] > 0).all()  # skull-stripped: 0 only outside the brain
            assert case.voxel_spacing(3) == pytest.approx([FOV_MM / n for n in label.shape])
            assert label.shape[2] == (SIZE if inst.slice_factor == 1 else round(SIZE / inst.slice_factor))


def test_nested_regions_hold_in_every_case_with_edema_around_a_core():
    fed, arrays = built()
    for site in fed.sites:
        for case in site.cases:
            image, label = arrays[case.id]
            wt, tc, et = fed.regions.one_hot(label).astype(bool)
            assert not (et & ~tc).any() and not (tc & ~wt).any(), case.id  # ET ⊂ TC ⊂ WT
            assert tc.any() and (wt & ~tc).any(), case.id  # every case has a core and edema around it


def test_grades_lgg_sites_and_their_look():
    fed, arrays = built(scale=1.0)
    grades = {s.name: {c.metadata["grade"] for c in s.cases} for s in fed.sites}
    lgg_only = [s.name for s in fed.sites if grades[s.name] == {"LGG"}]
    mixed = [s.name for s in fed.sites if grades[s.name] == {"HGG", "LGG"}]
    assert len(lgg_only) >= 3 and len(mixed) >= 2
    assert all(fed.site(n).meta["grade"] == "LGG" for n in lgg_only)
    assert {s.meta["grade"] for s in fed.sites} == {"HGG", "LGG"}
    et_share = {"HGG": [], "LGG": []}
    for site in fed.sites:
        for case in site.cases:
            label = arrays[case.id][1]
            et_share[str(case.metadata["grade"])].append((label == 4).sum() / max((label > 0).sum(), 1))
    assert min(et_share["HGG"]) > 0  # every HGG case enhances
    assert np.mean(et_share["LGG"]) < 0.25 * np.mean(et_share["HGG"])  # LGG: little or no enhancing tumour
    assert sum(s == 0 for s in et_share["LGG"]) > len(et_share["LGG"]) / 2


def test_sizes_are_unbalanced_as_fets_partitioning_1():
    sizes = site_sizes(1.0)
    assert 40 <= sum(sizes) <= 60
    top_two = sorted(sizes)[-2:]
    assert sum(top_two) > 0.4 * sum(sizes) and min(top_two) >= 3 * min(sizes)
    assert sum(n <= 4 for n in sizes) > len(sizes) / 2  # many small institutions
    assert site_sizes(0.01) == [3] * len(INSTITUTIONS)


def test_sites_differ_in_intensity_and_spacing():
    fed, arrays = built(scale=1.0)
    median_t1 = {}
    for site in fed.sites:
        image = arrays[site.cases[0].id][0]
        median_t1[site.name] = float(np.median(image[0][image[0] > 0]))
    assert max(median_t1.values()) > 4 * min(median_t1.values())
    z_over_x = {s.name: s.cases[0].spacing[2] / s.cases[0].spacing[0] for s in fed.sites}
    assert {round(r) for r in z_over_x.values()} == {1, 2, 3}


def test_deterministic_per_seed_and_stable_under_scale():
    fed, arrays = built()
    again = build_synthetic_brats(SCALE, SIZE, SEED)
    for site in again.sites:
        for case in site.cases:
            image, label = case.arrays()
            np.testing.assert_array_equal(image, arrays[case.id][0])
            np.testing.assert_array_equal(label, arrays[case.id][1])
    other = build_synthetic_brats(SCALE, SIZE, SEED + 1).sites[0].cases[0].arrays()[0]
    assert not np.array_equal(other, arrays["site1_0000"][0])
    _, larger = built(scale=1.0)
    for cid, (image, label) in arrays.items():  # more cases per site never change the first ones
        np.testing.assert_array_equal(image, larger[cid][0])
        np.testing.assert_array_equal(label, larger[cid][1])


def test_bad_arguments_are_refused():
    with pytest.raises(FederationError, match="scale must be > 0"):
        build_synthetic_brats(0, SIZE, SEED)
    with pytest.raises(FederationError, match="image_size must be >= 8"):
        build_synthetic_brats(1.0, 4, SEED)


def test_registered_as_a_data_source(tiny_config):
    cfg = tiny_config(data={"source": SYNTHETIC_BRATS, "image_size": SIZE, "scale": SCALE})
    assert SYNTHETIC_BRATS in source_names()
    assert count_source_sites(cfg) == len(build_federation(cfg).sites) == len(INSTITUTIONS)


def test_written_folder_keeps_spacing_grades_and_passes_data_check(tmp_path):
    out = tmp_path / "brats"
    result = CliRunner().invoke(
        data_app, ["synth", "--preset", SYNTHETIC_BRATS, "--out", str(out), "--scale", "0.01", "--image-size", "12"]
    )
    assert result.exit_code == 0, result.output
    fed = check_folder(out)
    assert fed.site("site9").meta == {"grade": "LGG"}
    assert {c.metadata["grade"] for c in fed.site("site3").cases} == {"HGG", "LGG"}
    zooms = nib.load(out / "site5" / "images" / "site5_0000.nii.gz").header.get_zooms()
    assert zooms[:3] == pytest.approx((20.0, 20.0, 60.0)) and len(zooms) == 4  # (X, Y, Z, channels)
    assert nib.load(out / "site5" / "labels" / "site5_0000.nii.gz").header.get_zooms() == pytest.approx(zooms[:3])


def test_one_round_of_fedavg_runs(tmp_path, tiny_config):
    from fedseg.run import run_experiment

    cfg = tiny_config(
        algorithms=["fedavg"],
        data={"source": SYNTHETIC_BRATS, "image_size": 12, "scale": 0.01},
        fl={"rounds": 1},
        model={"channels": [4, 8]},
    )
    run_experiment(cfg, tmp_path / "run")
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["regions"] == ["WT", "TC", "ET"]
    dice = summary["algorithms"]["fedavg"]["dice"]
    assert set(dice) >= {f"site{k}" for k in range(1, 12)} and 0.0 <= dice["global"] <= 1.0
