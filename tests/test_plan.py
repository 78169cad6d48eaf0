"""Federated planning (``fedseg.plan``): site fingerprint, merge, nnU-Net's planning rules, a planned run."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
import yaml

from fedseg.config import PlanConfig
from fedseg.data.federation import Case, Federation, Regions, Site
from fedseg.data.synthetic_brats import SYNTHETIC_BRATS
from fedseg.models import build_segmenter
from fedseg.plan.federated import collect_fingerprint, planning_engine
from fedseg.plan.fingerprint import Moments, case_fingerprint
from fedseg.plan.merge import ChannelIntensity, DatasetFingerprint
from fedseg.plan.planner import apply_plan, make_plan, pool_and_conv_props, target_spacing

BINS = 50


def tiny_case(rng: np.random.Generator, shape=(6, 5, 4), box=((1, 4), (1, 5), (0, 3))) -> tuple[np.ndarray, np.ndarray]:
    """A 2-channel image, non-zero only inside ``box``, with a label of 1 on some voxels inside it."""
    image = np.zeros((2, *shape), np.float32)
    inner = tuple(slice(a, b) for a, b in box)
    image[(slice(None), *inner)] = rng.integers(1, 100, size=(2, *[b - a for a, b in box]))
    label = np.zeros(shape, np.uint8)
    label[inner] = rng.random([b - a for a, b in box]) < 0.5
    return image, label


def federation(cases_per_site: list[list[tuple[np.ndarray, np.ndarray, tuple[float, ...]]]]) -> Federation:
    sites = [
        Site(f"s{k}", [Case.from_arrays(f"s{k}_{i}", im, lab, spacing=sp) for i, (im, lab, sp) in enumerate(cases)])
        for k, cases in enumerate(cases_per_site)
    ]
    return Federation("hand", "3d", 2, Regions.from_mapping({"fg": [1]}), sites)


def all_train(fed: Federation) -> dict[str, dict[str, str]]:
    return {site.name: {case.id: "train" for case in site.cases} for site in fed.sites}


def test_case_fingerprint_is_what_a_hand_count_gives():
    image = np.zeros((2, 4, 4, 4), np.float32)
    image[0, 1:3, 1:4, 2] = [[1, 2, 3], [4, 5, 6]]  # the non-zero box: x 1..2, y 1..3, z 2
    image[1, 1:3, 1:4, 2] = 10
    label = np.zeros((4, 4, 4), np.uint8)
    label[1, 1, 2] = label[2, 3, 2] = 1  # values 1 and 6 on channel 0
    label[0, 0, 0] = 1  # outside the non-zero box: not foreground (nnU-Net: seg outside the crop is -1)
    fp = case_fingerprint(image, label, (1.0, 2.0, 3.0))
    assert fp.shape == (2, 3, 1) and fp.spacing == (1.0, 2.0, 3.0)
    assert fp.crop_fraction == pytest.approx(6 / 64)
    np.testing.assert_array_equal(fp.foreground, [[1, 6], [10, 10]])
    m = Moments.of(list(fp.foreground))
    np.testing.assert_array_equal(m.count, [2, 2])
    np.testing.assert_allclose(m.mean, [3.5, 10.0])
    np.testing.assert_allclose(m.std, [2.5, 0.0])
    np.testing.assert_array_equal(m.low, [1, 10])
    np.testing.assert_array_equal(m.high, [6, 10])


def test_merge_of_two_sites_equals_the_pooled_fingerprint_and_replies_hold_statistics_only():
    rng = np.random.default_rng(0)
    spacings = [(1.0, 1.0, 2.0), (0.8, 0.8, 3.0), (1.2, 1.0, 2.5)]
    cases = [(*tiny_case(rng), sp) for sp in spacings]
    fed = federation([cases[:1], cases[1:]])
    engine = planning_engine(_cfg(PlanConfig(bins=BINS)), fed, all_train(fed))
    sizes: list[int] = []
    engine.observers.append(lambda site, action, msg, reply: sizes.extend(t.numel() for t in reply.tensors.values()))
    merged = collect_fingerprint(engine, BINS)

    pooled = [case_fingerprint(im, lab, sp) for im, lab, sp in cases]
    np.testing.assert_array_equal(merged.spacings, spacings)
    np.testing.assert_array_equal(merged.shapes, [c.shape for c in pooled])
    np.testing.assert_allclose(merged.crop_fractions, [c.crop_fraction for c in pooled])
    for ch, stats in enumerate(merged.intensity):
        values = np.concatenate([c.foreground[ch] for c in pooled])
        assert stats.count == values.size  # exact
        assert (stats.min, stats.max) == (values.min(), values.max())
        assert stats.mean == pytest.approx(values.mean(), rel=1e-12)
        assert stats.std == pytest.approx(values.std(), rel=1e-12)
        assert stats.bin_width == pytest.approx((values.max() - values.min()) / BINS)
        exact = np.percentile(values, [0.5, 50, 99.5])
        estimate = [stats.percentile_00_5, stats.median, stats.percentile_99_5]
        assert np.all(np.abs(np.array(estimate) - exact) <= stats.bin_width + 1e-9), (estimate, exact)
    assert sizes and max(sizes) <= BINS  # no reply array larger than the histogram
    rows = engine.ledger.as_dicts()
    assert [r["action"] for r in rows] == ["fingerprint"] * 2 + ["histogram"] * 2
    # up: per case spacing + shape + crop fraction (2 D + 1), per channel 5 moments; then C histograms
    assert [r["floats_up"] for r in rows] == [1 * 7 + 10, 2 * 7 + 10, 2 * BINS, 2 * BINS]
    assert [r["floats_down"] for r in rows] == [0, 0, 4, 4]  # the agreed range, low and high per channel


def hand_fingerprint(spacings, shapes, crop=0.5, modality_stats=None) -> DatasetFingerprint:
    stats = modality_stats or ChannelIntensity(10, 5.0, 2.0, 0.0, 10.0, 0.1, 5.0, 9.9, 0.01)
    return DatasetFingerprint(np.array(spacings, float), np.array(shapes, float), np.full(len(spacings), crop), [stats])


def test_isotropic_plan_pools_every_axis_to_a_bottleneck_of_four():
    plan = make_plan(hand_fingerprint([(1.0, 1.0, 1.0)] * 3, [(128, 128, 128)] * 3), PlanConfig())
    assert plan.target_spacing == [1.0, 1.0, 1.0] and plan.anisotropic_axis is None
    assert plan.patch_size == [128, 128, 128]  # the median shape fits the default budget (128^3)
    assert plan.strides == [[1, 1, 1]] + [[2, 2, 2]] * 5  # 128 / 2^5 = 4
    assert plan.kernel_sizes == [[3, 3, 3]] * 6
    assert plan.filters == [32, 64, 128, 256, 320, 320]
    assert plan.normalization == [{"scheme": "zscore", "use_mask": True}]  # crop fraction 0.5 < 3/4


def test_anisotropic_plan_takes_the_tenth_percentile_and_convolves_in_plane_first():
    spacings = [(3.0, 0.7, 0.7), (3.0, 0.7, 0.7), (5.0, 0.7, 0.7), (5.0, 0.7, 0.7)]
    shapes = [(40, 300, 300)] * 4
    spacing, axis = target_spacing(np.array(spacings), np.array(shapes, float), 3.0)
    # median 4.0 > 3 x 0.7 and 40 x 3 < 300: the 10th percentile of [3, 3, 5, 5] = 3.0
    assert axis == 0 and spacing.tolist() == pytest.approx([3.0, 0.7, 0.7])
    plan = make_plan(hand_fingerprint(spacings, shapes), PlanConfig(voxel_budget=40 * 160 * 160))
    assert plan.anisotropic_axis == 0
    assert plan.median_shape == [53.5, 300.0, 300.0]  # round(5 / 3 x 40) = 67 and 40 -> median 53.5
    # in-plane 0.7 -> 1.4 -> 2.8: Z (3.0) joins the pooling and the 3-kernels once within a factor 2
    assert plan.strides[:4] == [[1, 1, 1], [1, 2, 2], [1, 2, 2], [2, 2, 2]]
    assert plan.kernel_sizes[:4] == [[1, 3, 3], [1, 3, 3], [3, 3, 3], [3, 3, 3]]
    assert int(np.prod(plan.patch_size)) <= 40 * 160 * 160
    divisor = np.prod(np.array(plan.strides), axis=0)
    assert all(p % d == 0 for p, d in zip(plan.patch_size, divisor))


def test_no_anisotropy_rule_when_the_coarse_axis_has_many_voxels():
    spacing, axis = target_spacing(np.array([(4.0, 1.0, 1.0), (5.0, 1.0, 1.0)]), np.array([(200, 200, 200)] * 2), 3.0)
    assert axis is None and spacing.tolist() == [4.5, 1.0, 1.0]


def test_small_shapes_get_fewer_pooling_stages_and_a_budget_shrinks_the_patch():
    small = pool_and_conv_props((1.0, 1.0, 1.0), (16, 16, 16), 4)
    large = pool_and_conv_props((1.0, 1.0, 1.0), (128, 128, 128), 4)
    assert small.num_pool == (2, 2, 2) and large.num_pool == (5, 5, 5)
    assert pool_and_conv_props((1.0, 1.0, 1.0), (16, 16, 8), 4).num_pool == (2, 2, 1)
    plan = make_plan(hand_fingerprint([(1.0, 1.0, 1.0)], [(128, 128, 128)]), PlanConfig(voxel_budget=64**3))
    assert int(np.prod(plan.patch_size)) <= 64**3 < int(np.prod(plan.median_shape))
    divisor = np.prod(np.array(plan.strides), axis=0)
    assert all(p % d == 0 for p, d in zip(plan.patch_size, divisor))
    tiny = make_plan(hand_fingerprint([(1.0, 1.0, 1.0)], [(128, 128, 128)]), PlanConfig(voxel_budget=64))
    assert tiny.patch_size == [4, 4, 4] and tiny.strides == [[1, 1, 1]]  # no pooling left: DynUNet refuses it
    with pytest.raises(ValueError, match="the plan has 1 stages .* lower model.plan.min_edge or raise"):
        apply_plan(_cfg(PlanConfig(voxel_budget=64)), tiny)


def test_ct_and_unmasked_mr_normalization():
    stats = ChannelIntensity(100, 40.0, 12.0, -1000.0, 1500.0, -200.0, 35.0, 300.0, 2.5)
    plan = make_plan(hand_fingerprint([(1.0,) * 3], [(32,) * 3], crop=0.9, modality_stats=stats), PlanConfig())
    assert plan.normalization == [{"scheme": "zscore", "use_mask": False}]  # crop fraction 0.9 >= 3/4
    ct = make_plan(hand_fingerprint([(1.0,) * 3], [(32,) * 3], modality_stats=stats), PlanConfig(modality="CT"))
    assert ct.normalization == [
        {"scheme": "ct", "use_mask": False, "lower": -200.0, "upper": 300.0, "mean": 40.0, "std": 12.0}
    ]


def test_a_ct_plan_sets_ct_windows_that_clip_and_scale_each_channel():
    from fedseg.config_load import ConfigError, validate_config
    from fedseg.data.preprocess import normalization, normalize_image

    stats = ChannelIntensity(100, 40.0, 12.0, -1000.0, 1500.0, -200.0, 35.0, 300.0, 2.5)
    ct = make_plan(hand_fingerprint([(1.0,) * 3], [(32,) * 3], modality_stats=stats), PlanConfig(modality="CT"))
    cfg = apply_plan(_cfg(PlanConfig(modality="CT")), ct)
    assert cfg.data.normalize == "ct" and cfg.data.ct_windows == [(-200.0, 300.0, 40.0, 12.0)]
    assert ct.applied["normalization"] == "data.normalize = ct, data.ct_windows"
    image = np.array([[[-1000.0, 40.0, 52.0, 2000.0]]], np.float32)  # (C=1, 1, 4)
    out = normalize_image(image, normalization(cfg.data.normalize, cfg.data.ct_windows))
    np.testing.assert_allclose(out, [[[(-200 - 40) / 12, 0.0, 1.0, (300 - 40) / 12]]], rtol=1e-6)
    with pytest.raises(ConfigError, match="data.normalize = ct needs data.ct_windows"):
        validate_config({"data": {"normalize": "ct"}}, "test")


def test_a_planned_dynunet_has_per_axis_kernels_and_strides():
    from fedseg.config import ModelConfig

    cfg = ModelConfig(
        name="dynunet", channels=(4, 8, 16), strides=((1, 2, 2), (2, 2, 2)), kernel_sizes=((1, 3, 3), (3, 3, 3), 3)
    )
    net = build_segmenter(cfg, 3, 2, 3, seed=0)
    assert type(net).__name__ == "DynUNet"
    assert net.input_block.conv1.conv.weight.shape[2:] == (1, 3, 3)
    assert net(torch.zeros(1, 2, 4, 8, 8)).shape == (1, 3, 4, 8, 8)
    with pytest.raises(ValueError, match="resolved by the run"):
        build_segmenter(cfg.model_copy(update={"name": "planned"}), 3, 2, 3, seed=0)


def _cfg(plan: PlanConfig):
    from fedseg.config import RunConfig

    return RunConfig.model_validate({"model": {"name": "planned", "plan": plan.model_dump()}})


def test_a_planned_run_records_its_plan_and_traffic_and_a_resume_reuses_it(tmp_path, tiny_config):
    from fedseg.run import run_experiment

    cfg = tiny_config(
        algorithms=["fedavg"],
        data={
            "source": SYNTHETIC_BRATS,
            "image_size": 12,
            "scale": 0.01,
            "normalize": "minmax",
        },
        fl={"rounds": 1},
        model={"name": "planned", "plan": {"voxel_budget": 512, "base_features": 4, "max_features": 8, "min_edge": 2}},
        eval={"local_models": False},
    )
    out = tmp_path / "run"
    run_experiment(cfg, out)
    summary = json.loads((out / "summary.json").read_text())
    plan = summary["plan"]
    assert plan["filters"] == [4, 8, 8] and len(plan["strides"]) == 3
    assert np.prod(plan["patch_size"]) <= 512
    # synthetic-brats at 12: in-plane 20 mm, thick-slice sites 40 / 60 mm; the median is 20 mm
    assert plan["target_spacing"] == [20.0, 20.0, 20.0]
    assert plan["applied"]["normalization"] == "data.normalize = zscore_foreground"  # the brain: < 3/4 of the box
    manifest = json.loads((out / "model" / "fedavg" / "manifest.json").read_text())
    assert manifest["network"]["name"] == "dynunet" and manifest["normalize"] == "zscore_foreground"
    assert manifest["network"]["kernel_sizes"] == plan["kernel_sizes"]
    assert manifest["volume"]["patch_size"] == plan["patch_size"]
    assert manifest["volume"]["spacing"] == plan["target_spacing"]
    recorded = yaml.safe_load((out / "config.yaml").read_text())
    assert recorded["model"]["name"] == "planned" and recorded["data"]["normalize"] == "minmax"  # as given
    ledger = (out / "ledger.csv").read_text().splitlines()
    plan_rows = [line.split(",") for line in ledger if line.startswith("plan,")]
    assert len(plan_rows) == 2 * 11 and sum(int(r[6]) for r in plan_rows) == plan["traffic"]["floats_up"]
    assert plan["traffic"]["floats_up"] >= 11 * 4 * 1000  # 4 channels x 1000 bins per site
    stored = json.loads((out / "plan.json").read_text())
    stored["plan"]["fingerprint"]["cases"] = -1  # a resume must read the stored plan, not plan again
    (out / "plan.json").write_text(json.dumps(stored))
    run_experiment(cfg, out, resume=True)
    assert json.loads((out / "summary.json").read_text())["plan"]["fingerprint"]["cases"] == -1


def test_a_planned_run_is_refused_where_the_sites_prepare_their_own_data(tmp_path, tiny_config, discs):
    from fedseg.run import prepare, run_experiment

    cfg = tiny_config(algorithms=["fedavg"], model={"name": "planned"})
    prepared = prepare(tiny_config(algorithms=["fedavg"]), discs)
    with pytest.raises(ValueError, match="model.name planned: the sites' fingerprints are collected before"):
        run_experiment(cfg, tmp_path / "run", prepared=prepared)
