"""The volume pipeline (fedseg.data.volumes, fedseg.data.augment): cases on their own grid, the exact
inverse mapping, per-modality z-score, seeded patches and augmentations, and whole runs on patches."""

from __future__ import annotations

import json

import nibabel as nib
import numpy as np
import pytest
import torch

from fedseg.config import AugmentConfig, VolumeConfig
from fedseg.config_load import ConfigError, load_config
from fedseg.data.augment import DeviceGaussianNoised, augment_batch
from fedseg.data.federation import Case, Federation, Regions, Site
from fedseg.data.volumes import build_volume, draw_patches, preprocess, restore
from fedseg.evaluate.metrics import case_metrics

torch.set_num_threads(1)
BRATS = Regions.from_mapping({"wt": [1, 2, 4], "tc": [1, 4], "et": [4]})


def tumour_case(shape=(22, 26, 15), seed=0, offset=(0, 0, 0)) -> tuple[np.ndarray, np.ndarray]:
    """A 2-modality 'head' (non-zero box inside a zero border) with a nested tumour (labels 2 > 1 > 4)."""
    rng = np.random.default_rng(seed)
    image = np.zeros((2, *shape), np.float32)
    head = tuple(slice(2 + o, n - 3 + o) for n, o in zip(shape, offset))
    image[(slice(None), *head)] = rng.normal(
        [[[[100.0]]], [[[7.0]]]], [[[[20.0]]], [[[2.0]]]], (2, *image[0][head].shape)
    )
    label = np.zeros(shape, np.uint8)
    c = [n // 2 + o for n, o in zip(shape, offset)]
    label[c[0] - 4 : c[0] + 4, c[1] - 4 : c[1] + 4, c[2] - 3 : c[2] + 3] = 2
    label[c[0] - 2 : c[0] + 2, c[1] - 2 : c[1] + 3, c[2] - 2 : c[2] + 2] = 1
    label[c[0] - 1 : c[0] + 1, c[1] - 1 : c[1] + 1, c[2] - 1 : c[2] + 1] = 4
    return image, label


def test_crop_and_pad_are_undone_exactly():
    image, label = tumour_case(offset=(1, -2, 0))
    cfg = VolumeConfig(patch_size=(16, 16, 16))  # larger than the crop along the last axis: padded there
    x, masks, grid = preprocess(image, label, BRATS, (1.0, 1.0, 2.5), cfg, "zscore_foreground")
    assert masks is not None and x.shape[1:] == masks.shape[1:]
    assert all(p >= k for p, k in zip(x.shape[1:], (16, 16, 16)))
    assert grid.start != (0, 0, 0) and any(b + a > 0 for b, a in grid.pad)  # both crop and pad happened
    back = restore(masks, grid)
    assert back.shape == (3, *label.shape)
    assert torch.equal(back.bool(), torch.from_numpy(BRATS.one_hot(label)).bool())  # same voxels, same place


def test_resampling_is_undone_onto_the_original_grid():
    image, label = tumour_case(shape=(24, 24, 12))
    cfg = VolumeConfig(patch_size=8, spacing=(1.0, 1.0, 1.0))
    x, masks, grid = preprocess(image, label, BRATS, (1.0, 1.0, 2.0), cfg, "none")
    assert masks is not None and grid.resampled[2] == pytest.approx(2 * 12 - 1, abs=1)  # 2 mm -> 1 mm slices
    back = restore(masks, grid) > 0.5
    truth = torch.from_numpy(BRATS.one_hot(label)).bool()
    assert back.shape == truth.shape
    dice = case_metrics(back, truth, spacing=(1.0, 1.0, 2.0))["dice"]
    assert dice[0] > 0.95  # the whole tumour lands where it was (interpolation costs only its border)
    centre = lambda m: torch.nonzero(m).float().mean(0)  # noqa: E731
    torch.testing.assert_close(centre(back[0]), centre(truth[0]), atol=0.5, rtol=0)


def test_zscore_foreground_per_modality():
    image, label = tumour_case()
    vol = build_volume(image, label, BRATS, (1.0, 1.0, 1.0), VolumeConfig(patch_size=8), "zscore_foreground")
    fg = torch.from_numpy(image != 0)
    fg = fg[(slice(None), *(slice(s, e) for s, e in zip(vol.grid.start, vol.grid.end)))]  # the crop
    inner = vol.image[(slice(None), *(slice(b, n - a) for (b, a), n in zip(vol.grid.pad, vol.image.shape[1:])))]
    for c in range(2):
        values = inner[c][fg[c]].double()
        assert values.mean().item() == pytest.approx(0.0, abs=1e-5)
        assert values.std(unbiased=False).item() == pytest.approx(1.0, abs=1e-4)
        assert (inner[c][~fg[c]] == 0).all()  # the background stays 0


def test_patches_and_augmentations_are_deterministic_per_seed():
    vols = [
        build_volume(*tumour_case(seed=s), BRATS, (1.0,) * 3, VolumeConfig(patch_size=8), "zscore_foreground")
        for s in range(3)
    ]
    aug = AugmentConfig(enabled=True, noise_prob=1.0, smooth_prob=0.5, scale_prob=0.5, contrast_prob=0.5)

    def draw(seed: int):
        g = torch.Generator().manual_seed(seed)
        x, y = draw_patches(vols, (8, 8, 8), 0.5, g)
        return augment_batch(x, y, aug, g)

    (xa, ya), (xb, yb), (xc, _) = draw(1), draw(1), draw(2)
    assert xa.shape == (3, 2, 8, 8, 8) and ya.shape == (3, 3, 8, 8, 8)
    assert torch.equal(xa, xb) and torch.equal(ya, yb)
    assert not torch.equal(xa, xc)
    assert set(ya.unique().tolist()) <= {0.0, 1.0}  # flips move masks, never blend them
    g = torch.Generator().manual_seed(0)
    _, y = draw_patches(vols, (8, 8, 8), 1.0, g)
    assert all(y[i, 0].any() for i in range(3))  # foreground_oversample = 1: every patch holds tumour


def test_noise_is_drawn_by_torch_on_the_images_device_from_the_transforms_seed():
    """DeviceGaussianNoised: N(0, std^2) added to the image only, the same noise for the same seed, none at prob 0."""
    image, label = torch.zeros(2, 32, 32, 32), torch.ones(3, 32, 32, 32)

    def noised(seed: int, prob: float = 1.0) -> dict:
        return DeviceGaussianNoised(keys="image", prob=prob, std=0.1).set_random_state(seed)(
            {"image": image, "label": label}
        )

    a, b, c = noised(1), noised(1), noised(2)
    assert torch.equal(a["image"], b["image"]) and not torch.equal(a["image"], c["image"])
    assert a["image"].dtype == torch.float32 and a["label"] is label
    assert float(a["image"].mean()) == pytest.approx(0.0, abs=2e-3)
    assert float(a["image"].std()) == pytest.approx(0.1, rel=1e-2)
    assert noised(1, prob=0.0)["image"] is image


@pytest.mark.parametrize("noise_prob", [1.0, 0.5, 0.0])
def test_the_other_augmentations_draw_what_they_drew_with_monais_noise(noise_prob):
    """Drawing the noise on the device changed only the noise: with ``noise_std = 0`` (and with no noise at all)
    augment_batch equals the pipeline with MONAI's ``RandGaussianNoised``, bit for bit (flips, smoothing, scaling
    and contrast draw the same numbers: each transform is seeded on its own by ``Compose.set_random_state``)."""
    from monai.transforms import (
        Compose,
        RandAdjustContrastd,
        RandFlipd,
        RandGaussianNoised,
        RandGaussianSmoothd,
        RandScaleIntensityd,
    )

    aug = AugmentConfig(enabled=True, noise_prob=noise_prob, noise_std=0.0, smooth_prob=0.5, scale_prob=0.5)
    lo, hi = aug.smooth_sigma
    monai = Compose(
        [
            *(RandFlipd(keys=["image", "label"], prob=aug.flip_prob, spatial_axis=a) for a in range(3)),
            RandGaussianNoised(keys="image", prob=aug.noise_prob, mean=0.0, std=0.0, sample_std=False),
            RandGaussianSmoothd(
                keys="image", prob=aug.smooth_prob, sigma_x=(lo, hi), sigma_y=(lo, hi), sigma_z=(lo, hi)
            ),
            RandScaleIntensityd(
                keys="image", prob=aug.scale_prob, factors=(aug.scale_range[0] - 1, aug.scale_range[1] - 1)
            ),
            RandAdjustContrastd(keys="image", prob=aug.contrast_prob, gamma=aug.contrast_gamma),
        ]
    )
    g = torch.Generator().manual_seed(3)
    x, y = torch.rand(6, 2, 8, 8, 8, generator=g), (torch.rand(6, 3, 8, 8, 8, generator=g) > 0.5).float()
    for seed in range(8):
        ours = augment_batch(x, y, aug, torch.Generator().manual_seed(seed))
        monai.set_random_state(seed=int(torch.randint(0, 2**31 - 1, (), generator=torch.Generator().manual_seed(seed))))
        theirs = [monai({"image": i.clone(), "label": m.clone()}) for i, m in zip(x, y)]
        assert torch.equal(ours[0], torch.stack([torch.as_tensor(t["image"]).float() for t in theirs])), seed
        assert torch.equal(ours[1], torch.stack([torch.as_tensor(t["label"]).float() for t in theirs])), seed


def reference_patches(vols, size, foreground, generator):
    """The patch draw as its docstring states it, with ``label.any(0).nonzero()`` listing the labelled voxels
    at every draw (what draw_patches did before it cached them)."""
    xs, ys = [], []
    for vol in vols:
        top = [n - k for n, k in zip(vol.image.shape[1:], size)]
        u = float(torch.rand((), generator=generator))
        fg = vol.label.any(0).nonzero() if u < foreground else None
        if fg is not None and len(fg):
            centre = fg[int(torch.randint(len(fg), (), generator=generator))]
            start = [min(max(int(c) - k // 2, 0), t) for c, k, t in zip(centre, size, top)]
        else:
            start = [int(torch.randint(t + 1, (), generator=generator)) for t in top]
        box = (slice(None), *(slice(s, s + k) for s, k in zip(start, size)))
        xs.append(vol.image[box])
        ys.append(vol.label[box])
    return torch.stack(xs), torch.stack(ys)


@pytest.mark.parametrize("where", ["host", "copies with bool masks"])
def test_patches_are_the_crops_the_step_stream_draws_wherever_they_are_cut(where):
    """draw_patches (cached foreground positions; on the GPU cut from the resident copies, masks as bool) gives
    the very crops of the stated algorithm, for the same stream, over many draws and oversampling rates."""
    vols = [
        build_volume(*tumour_case(seed=s, offset=(s, -s, 0)), BRATS, (1.0,) * 3, VolumeConfig(patch_size=8), "none")
        for s in range(3)
    ]
    sources = None if where == "host" else [(v.image.clone(), v.label.bool()) for v in vols]
    for foreground, seed in [(0.0, 0), (0.5, 1), (1.0, 2), (0.66, 3)]:
        g, ref_g = torch.Generator().manual_seed(seed), torch.Generator().manual_seed(seed)
        for _ in range(20):
            x, y = draw_patches(vols, (8, 7, 6), foreground, g, sources=sources)
            ref_x, ref_y = reference_patches(vols, (8, 7, 6), foreground, ref_g)
            assert x.dtype == y.dtype == torch.float32
            assert torch.equal(x, ref_x) and torch.equal(y, ref_y)
        assert torch.equal(g.get_state(), ref_g.get_state())  # the same number of draws from the stream


def test_a_case_is_blended_on_the_accelerator_only_where_its_output_fits(monkeypatch):
    """Sliding-window blending and the mapping back stay on the GPU for a case whose estimated memory fits the bound,
    else the CPU; on the CPU it is always the CPU (results there unchanged: the blend device is the CPU as before)."""
    from fedseg.evaluate import sliding

    vol = build_volume(*tumour_case(), BRATS, (1.0,) * 3, VolumeConfig(patch_size=8), "none")
    cuda, cpu = torch.device("cuda", 0), torch.device("cpu")
    assert sliding.blend_device(vol, cuda) == cuda and sliding.blend_device(vol, cpu) == cpu
    padded, original = vol.label[0].numel(), vol.truth[0].numel()  # no resampling: the resampled grid is the original
    expected_mb = (4 * padded * (2 + 3 + 1) + 3 * original) / 2**20  # image, logits (sigmoid in place), count; masks
    assert sliding.case_mapping_mb(vol) == pytest.approx(expected_mb)
    monkeypatch.setattr(sliding, "BLEND_ON_DEVICE_MAX_MB", expected_mb)
    assert sliding.blend_device(vol, cuda) == cuda
    monkeypatch.setattr(sliding, "BLEND_ON_DEVICE_MAX_MB", expected_mb * 0.99)
    assert sliding.blend_device(vol, cuda) == cpu
    resampled = build_volume(*tumour_case(), BRATS, (1.0,) * 3, VolumeConfig(patch_size=8, spacing=2.0), "none")
    assert resampled.grid.affine is not None  # float64 resampling counted too
    assert sliding.case_mapping_mb(resampled) > 4 * resampled.label[0].numel() * (2 + 3 + 1) / 2**20


def test_config_errors_name_the_field():
    with pytest.raises(ConfigError, match="data.volume.patch_size"):
        load_config(preset="demo", overrides=["data.volume.patch_size=0"])
    with pytest.raises(ConfigError, match="train.augment.contrast_gamma"):
        load_config(preset="demo", overrides=["train.augment.contrast_gamma=[2, 1]"])
    image, label = tumour_case()
    with pytest.raises(ValueError, match="data.volume.patch_size"):
        build_volume(image, label, BRATS, (1.0,) * 3, VolumeConfig(patch_size=(8, 8)), "none")


# --- whole runs on patches ----------------------------------------------------------------------------
TUMOUR = Regions.from_mapping({"tumour": [1, 2, 4]})  # one region: a label map holds any prediction exactly


def tumour_federation() -> Federation:
    """2 sites x 4 cases of different sizes; site b has anisotropic 1 x 1 x 2.5 mm voxels."""
    sites = []
    for k, (name, spacing) in enumerate((("a", (1.0, 1.0, 1.0)), ("b", (1.0, 1.0, 2.5)))):
        cases = []
        for i in range(4):
            image, label = tumour_case(shape=(20 + 2 * i, 22 + k, 14 + i), seed=10 * k + i)
            cases.append(Case.from_arrays(f"{name}{i}", image, label, spacing=spacing))
        sites.append(Site(name, cases))
    return Federation("tumours", "3d", 2, TUMOUR, sites)


@pytest.fixture(scope="module")
def tumour_folder(tmp_path_factory):
    from fedseg.data.folder_write import write_folder

    return write_folder(tumour_federation(), tmp_path_factory.mktemp("tumours") / "fed")


def _patch_cfg(tiny_config, root, rounds: int):
    from fedseg.config import RunConfig

    cfg = tiny_config(
        algorithms=["fedavg"],
        data={
            "source": "folder",
            "root": str(root),
            "image_size": 16,
            "normalize": "zscore_foreground",
            "volume": {"patch_size": 16, "foreground_oversample": 0.5, "sw_batch_size": 2},
        },
        train={"batch_size": 2, "dice_smooth": 1.0, "augment": {"enabled": True}},
        fl={"rounds": rounds},
        eval={"local_models": False},
    )
    return RunConfig.model_validate(cfg.model_dump())


def test_fedavg_on_patches_reports_hd95_in_mm_on_the_original_grid(tmp_path, tiny_config, tumour_folder):
    """A 1-round FedAvg run on patches completes; its per-case HD95 and NSD (tolerance in mm) equal the metrics
    of ``fedseg predict``'s masks (sliding window, mapped back to each file's grid) against the truth with the
    file's spacing."""
    from fedseg.predict import predict
    from fedseg.run import run_experiment

    run_experiment(_patch_cfg(tiny_config, tumour_folder, 1), tmp_path / "run")
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    hd95 = summary["algorithms"]["fedavg"]["hd95"]
    assert np.isfinite(hd95["client_avg"]) and hd95["client_avg"] > 0  # every case counts (empty-mask rule)
    assert summary["hd95_unit"] == "mm" and summary["nsd_tolerance"] == 1.0
    rows = [
        r
        for r in (line.split(",") for line in (tmp_path / "run" / "results.csv").read_text().splitlines()[1:])
        if r[0] == "fedavg" and r[1] == "global" and r[5] in ("hd95", "nsd")
    ]
    site = "b"  # anisotropic: HD95 in mm differs from voxels
    expected = {(r[3], r[4]): float(r[6]) for r in rows if r[2] == site and r[5] == "hd95"}
    expected_nsd = {(r[3], r[4]): float(r[6]) for r in rows if r[2] == site and r[5] == "nsd"}
    assert expected_nsd.keys() == expected.keys()
    assert expected
    cases = sorted({c for c, _ in expected})
    images = tmp_path / "in"
    images.mkdir()
    for c in cases:
        (images / f"{c}.nii.gz").symlink_to(tumour_folder / site / "images" / f"{c}.nii.gz")
    predict(tmp_path / "run", images, tmp_path / "out")
    for c in cases:
        pred_img = nib.load(tmp_path / "out" / f"{c}.nii.gz")
        truth_img = nib.load(tumour_folder / site / "labels" / f"{c}.nii.gz")
        assert np.allclose(np.asarray(pred_img.header.get_zooms()), (1.0, 1.0, 2.5))
        pred = TUMOUR.one_hot(np.asarray(pred_img.dataobj))
        truth = TUMOUR.one_hot(np.asarray(truth_img.dataobj))
        scores = case_metrics(pred, truth, spacing=(1.0, 1.0, 2.5))
        for r, name in enumerate(TUMOUR.names):
            assert scores["hd95"][r] == pytest.approx(expected[(c, name)], rel=1e-6), (c, name)
            assert scores["nsd"][r] == pytest.approx(expected_nsd[(c, name)], abs=1e-6), (c, name)


def test_resumed_patch_run_equals_an_uninterrupted_one(tmp_path, tiny_config, tumour_folder):
    from fedseg.run import run_experiment

    cfg = _patch_cfg(tiny_config, tumour_folder, 2)
    full = run_experiment(cfg, tmp_path / "full")

    class Stop(Exception):
        pass

    def stop(name, rnd, losses):
        if rnd == 1:
            raise Stop

    with pytest.raises(Stop):
        run_experiment(cfg, tmp_path / "cut", on_round_end=stop)
    resumed = run_experiment(cfg, tmp_path / "cut", resume=True)
    for k, v in full.algorithms[0].bundle["global"].items():
        assert torch.equal(v, resumed.algorithms[0].bundle["global"][k]), k
    numbers = lambda p: {k: v for k, v in json.loads(p.read_text())["algorithms"]["fedavg"].items() if k != "seconds"}  # noqa: E731
    assert numbers(tmp_path / "full" / "summary.json") == numbers(tmp_path / "cut" / "summary.json")


@pytest.mark.parametrize("name", ["unet", "dynunet"])
@pytest.mark.parametrize(
    "strides, sizes",
    [
        (None, [(n, n) for n in (4, 6, 8, 12, 14, 16)]),  # 2 levels of stride 2: multiples of 4, more than one voxel
        (((2, 2, 1), 2), [(8, 8, 4), (8, 8, 6), (12, 8, 2), (4, 4, 2), (8, 8, 3)]),  # anisotropic: z pooled once
    ],
)
@pytest.mark.parametrize("norm, batch", [("instance", 2), ("batch", 1)])  # batch norm fails on a batch of one
def test_the_input_size_check_refuses_exactly_the_sizes_the_network_cannot_train_on(name, strides, sizes, norm, batch):
    import torch

    from fedseg.config import DataConfig, ModelConfig, network_input_problem
    from fedseg.models.factory import build_segmenter

    model = ModelConfig(name=name, channels=(2, 4, 8), strides=strides, norm=norm)
    for size in sizes:
        data = DataConfig(volume={"patch_size": size})
        problem = network_input_problem(model, data)
        net = build_segmenter(model, len(size), 1, 1, 0).train()
        try:
            net(torch.zeros(batch, 1, *size)).sum().backward()
            trains = True
        except (RuntimeError, ValueError):
            trains = False
        assert (problem is None) == trains, (size, problem)
        if problem is not None:
            assert problem.startswith(f"data.volume.patch_size={list(size)}: ")


def test_training_sets_share_one_budget_on_a_device_and_give_it_back_when_freed():
    """train.resident_mb bounds the training sets one process keeps on a device in all (it was per set: 33 sites
    could each keep 1 GiB), first come first served, given back when a set is freed; never on the CPU. The meta
    device stands in for a GPU here (copies without memory): the same code path, no data."""
    import gc

    from fedseg.data import dataset
    from fedseg.data.dataset import CaseSet

    vols = [build_volume(*tumour_case(seed=s), BRATS, (1.0,) * 3, VolumeConfig(patch_size=8), "none") for s in range(2)]
    x = torch.zeros(2, 2, 8, 8, 8)

    def new_set() -> CaseSet:
        return CaseSet("site", ["a", "b"], x, x[:, :1], vols, VolumeConfig(patch_size=8))

    one_mb = sum(v.image.nbytes + v.label.numel() for v in vols) / 2**20  # images float32, masks as bool
    meta, cpu = torch.device("meta"), torch.device("cpu")
    dataset.RESIDENT_MB.clear()
    first, second = new_set(), new_set()
    assert not first.resident(cpu, 1e9)
    assert first.resident(meta, 1.5 * one_mb) and first.resident(meta, 0.0)  # kept once copied
    assert [label.dtype for _, label in first._resident_volumes["meta"]] == [torch.bool, torch.bool]
    assert dataset.RESIDENT_MB["meta"] == pytest.approx(one_mb)
    assert not second.resident(meta, 1.5 * one_mb)  # both would exceed the budget
    del first
    gc.collect()
    assert dataset.RESIDENT_MB["meta"] == pytest.approx(0.0)
    assert second.resident(meta, 1.5 * one_mb)


def test_a_gpu_sized_patch_on_the_cpu_is_said_before_training():
    """``fedseg run --preset fets --device cpu`` trained 128^3 patches of a 22.6M-parameter DynUNet for 11 minutes
    without a line (a fresh-eyes audit): a note now says so, and points to fets-cpu; fets-cpu and a GPU say nothing."""
    from fedseg.config_load import load_config
    from fedseg.run.checks import device_notes

    (note,) = device_notes(load_config(preset="fets"), torch.device("cpu"))
    assert note.startswith("note: 128-voxel patches on the CPU") and "fets-cpu preset" in note
    assert device_notes(load_config(preset="fets"), torch.device("cuda")) == []
    assert device_notes(load_config(preset="fets-cpu"), torch.device("cpu")) == []
    assert device_notes(load_config(preset="demo"), torch.device("cpu")) == []


def test_a_sites_sample_reuses_the_scored_prediction_of_its_first_case(
    tmp_path, tiny_config, tumour_folder, monkeypatch
):
    """The test exchange writes each site's sample from the logits its first case was scored with: no case is
    predicted twice (the sample's own sliding window was a quarter of the `fets` final evaluation), and the
    sample's masks are that prediction's on the preprocessed grid."""
    from fedseg.evaluate import inference, sliding
    from fedseg.run import run_experiment

    predicted, again = [], []
    real = sliding.sliding_logits
    monkeypatch.setattr(sliding, "sliding_logits", lambda *a, **k: predicted.append(a[1].shape) or real(*a, **k))
    monkeypatch.setattr(inference, "sliding_logits", lambda *a, **k: again.append(a[1].shape) or real(*a, **k))
    run_experiment(_patch_cfg(tiny_config, tumour_folder, 1), tmp_path / "run")
    assert predicted and not again
    for site in ("a", "b"):
        sample = np.load(tmp_path / "run" / "samples" / f"fedavg__{site}.npz")
        assert sample["pred"].shape == sample["truth"].shape and sample["pred"].dtype == np.uint8
