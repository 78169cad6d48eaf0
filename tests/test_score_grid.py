"""Where the whole-image path scores (``eval.score_grid``): on each image's own grid by default, so that the Dice
and HD95 of results.csv are those of the masks ``fedseg predict`` writes for images of other sizes than the model's
(a fresh-eyes run re-scored them: Dice up to 0.047 lower, HD95 13-15 pixels higher than results.csv said when the
run scored on the 32x32 model grid); ``model`` keeps the resized grid's scores (runs recorded before the option)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from fedseg.data.case_files import read_label
from fedseg.data.federation import Case, Federation, Regions, Site
from fedseg.data.folder_write import write_folder
from fedseg.data.preprocess import fit_box, resize, restore_image, restore_size
from fedseg.engine.messages import load_weights
from fedseg.evaluate.inference import predict_masks, sample_prediction, score_caseset
from fedseg.evaluate.metrics import batch_metrics
from fedseg.evaluate.tables import read_rows
from fedseg.predict import load_bundle, predict
from fedseg.run import prepare, run_experiment

DISC_CUP = Regions.from_mapping({"disc": [1, 2], "cup": [2]})
SHAPES = [(40, 52), (32, 32), (28, 44)]  # one site per shape: the middle one on the model grid (image_size 32)


def _federation(seed: int = 0) -> Federation:
    """Three sites of disc/cup images, each site at its own (non-square) size."""
    rng = np.random.default_rng(seed)
    sites = []
    for s, (h, w) in enumerate(SHAPES):
        yy, xx = np.mgrid[:h, :w]
        cases = []
        for i in range(8):
            cy, cx, r = rng.integers(h // 3, 2 * h // 3), rng.integers(w // 3, 2 * w // 3), min(h, w) / 5
            d2 = (yy - cy) ** 2 + (xx - cx) ** 2
            label = np.zeros((h, w), np.uint8)
            label[d2 < r * r], label[d2 < (r / 2) ** 2] = 1, 2
            image = rng.integers(0, 40, (3, h, w)).astype(np.uint8) + 10 * s
            image[:, label > 0] += 100
            image[:, label == 2] += 60
            cases.append(Case.from_arrays(f"s{s + 1}_{i:03d}", image, label))
        sites.append(Site(f"site{s + 1}", cases))
    return Federation("shapes", "2d", 3, DISC_CUP, sites)


@pytest.fixture(scope="module")
def shapes_run(tmp_path_factory, tiny_config):
    tmp = tmp_path_factory.mktemp("grid")
    root = write_folder(_federation(), tmp / "fed")
    cfg = tiny_config(algorithms=["fedavg"], fl={"rounds": 1}, data={"source": "folder", "root": str(root)})
    run_experiment(cfg, tmp / "run")
    return tmp / "run", root, cfg


def _rows(run, metric):
    return {
        (r["case"], r["region"]): r["value"]
        for r in read_rows(run / "results.csv")
        if r["algorithm"] == "fedavg" and r["metric"] == metric and not r["model"].startswith("local:")
    }


def test_results_csv_scores_the_masks_predict_writes_on_each_images_own_grid(shapes_run, tmp_path):
    run, root, _ = shapes_run
    assert _written_masks_score_as_results_csv(run, root, tmp_path) >= 2  # test cases of both resized sites


def test_padded_inputs_keep_the_aspect_ratio_and_score_as_the_masks_predict_writes(tiny_config, tmp_path):
    """``data.resize: pad``: a non-square image is scaled by one factor into the 32x32 input, zeros around it
    (not squashed); predictions are cropped back before the resize, in evaluation and in ``fedseg predict`` (the
    bundle records the mode), so the written masks score as results.csv says."""
    root = write_folder(_federation(), tmp_path / "fed")
    data = {"source": "folder", "root": str(root), "resize": "pad"}
    cfg = tiny_config(algorithms=["fedavg"], fl={"rounds": 1}, data=data)
    run_experiment(cfg, tmp_path / "run")
    assert json.loads((tmp_path / "run" / "model" / "fedavg" / "manifest.json").read_text())["resize"] == "pad"
    site1 = prepare(cfg).site_data[0].test  # 40 x 52 images: 25 x 32 in the input, rows 3..27
    assert site1.fit == "pad" and torch.all(site1.x[:, :, :3] == 0) and torch.all(site1.x[:, :, 28:] == 0)
    assert torch.all(site1.y[:, :, :3] == 0) and site1.x[:, :, 3:28].abs().sum() > 0
    assert _written_masks_score_as_results_csv(tmp_path / "run", root, tmp_path) >= 2


def test_pad_places_an_image_by_one_factor_and_restores_it_exactly_at_scale_one():
    """fit_box: the longest side fills the input, the other keeps the ratio, centred; at scale 1 (16 x 32 into 32)
    resize + restore_size give back the mask voxel for voxel, which stretch (16 -> 32 -> 16 rows) cannot promise."""
    assert fit_box((40, 52), 32, "pad") == ((25, 32), (3, 0))
    assert fit_box((52, 40), 32, "pad") == ((32, 25), (0, 3))
    assert fit_box((40, 52), 32, "stretch") == ((32, 32), (0, 0))
    assert fit_box((30, 30, 60), 32, "pad") == ((16, 16, 32), (8, 8, 0))
    rng = np.random.default_rng(0)
    label = torch.from_numpy(rng.integers(0, 3, (16, 32)))
    image = torch.rand(3, 16, 32)
    x, y = resize(image, label, 32, "pad")
    assert x.shape == (3, 32, 32) and torch.equal(x[:, 8:24], image) and torch.all(x[:, :8] == 0)
    assert torch.equal(y[8:24], label) and torch.all(y[:8] == 0) and torch.all(y[24:] == 0)
    masks = torch.from_numpy(DISC_CUP.one_hot(y.numpy())).bool()
    assert torch.equal(restore_size(masks, (16, 32), "pad"), torch.from_numpy(DISC_CUP.one_hot(label.numpy())).bool())
    assert torch.equal(restore_image(x, (16, 32), "pad"), image)


def _written_masks_score_as_results_csv(run, root, tmp_path) -> int:
    """``fedseg predict`` of the run's model on its test images: the masks it writes have each image's size and
    score (Dice, HD95 against the original truth) what results.csv says; returns how many of the cases compared
    were resized for the model."""
    images = tmp_path / "new"
    images.mkdir()
    dice, hd95 = _rows(run, "dice"), _rows(run, "hd95")
    cases = sorted({case for case, _ in dice})
    for case in cases:
        site = f"site{case[1]}"
        (images / f"{case}.png").write_bytes((root / site / "images" / f"{case}.png").read_bytes())
    predict(run / "model", images, tmp_path / "out")
    resized = 0
    for case in cases:
        truth = read_label(root / f"site{case[1]}" / "labels" / f"{case}.png", "2d")
        written = read_label(tmp_path / "out" / f"{case}.png", "2d")
        assert written.shape == truth.shape
        resized += truth.shape != (32, 32)
        scores = batch_metrics(DISC_CUP.one_hot(written)[None], DISC_CUP.one_hot(truth)[None])
        for j, region in enumerate(DISC_CUP.names):
            assert scores["dice"][0, j] == pytest.approx(dice[(case, region)], abs=1e-6), (case, region)
            assert scores["hd95"][0, j] == pytest.approx(hd95[(case, region)], abs=1e-5), (case, region)
    return resized


def test_model_grid_scoring_scores_the_resized_truth_and_is_recorded(shapes_run, tiny_config, tmp_path):
    """``eval.score_grid: model``: the same model scored against the truth resized to 32x32 (what every run did
    before the option); the summary says which grid a run scored."""
    import json

    run, root, cfg = shapes_run
    assert json.loads((run / "summary.json").read_text())["score_grid"] == "original"
    model_grid = cfg.model_copy(update={"eval": cfg.eval.model_copy(update={"score_grid": "model"})})
    on_model, on_own = prepare(model_grid), prepare(cfg)
    bundle = load_bundle(run / "model" / "fedavg")
    model = bundle.new_segmenter()
    load_weights(model, bundle.models["global"])
    regions, device = on_own.task.scored_regions, torch.device("cpu")
    differ = 0
    for own, resized in zip(on_own.site_data, on_model.site_data):
        assert resized.test.originals is None and resized.train.originals is None and own.train.originals is None
        theirs = score_caseset(model, resized.test, 4, 0.5, True, device, regions=regions)
        masks = predict_masks(model, resized.test.x, 4, 0.5, device, regions=regions)
        expected = batch_metrics(masks, resized.test.y.bool())  # the model grid: truth resized, nearest
        np.testing.assert_allclose(theirs["dice"], expected["dice"], atol=1e-12)
        np.testing.assert_allclose(theirs["hd95"], expected["hd95"], atol=1e-12)
        ours = score_caseset(model, own.test, 4, 0.5, True, device, regions=regions)
        packed = own.test.originals  # None for the site on the model grid
        assert packed is None or len(packed) == len(own.test)
        for i, truth in enumerate(packed.get(i) if packed else None for i in range(len(own.test))):
            if truth is None:  # a case on the model grid scores the same on both
                np.testing.assert_array_equal(ours["dice"][i], theirs["dice"][i])
                continue
            pred = restore_size(masks[i], tuple(truth.shape[1:]))
            np.testing.assert_allclose(ours["dice"][i], batch_metrics(pred[None], truth[None])["dice"][0])
            differ += not np.allclose(ours["hd95"][i], theirs["hd95"][i])
        image, truth, pred = sample_prediction(model, own.test, 0.5, device, regions=regions)  # the report's panel
        assert image.shape[1:] == truth.shape[1:] == pred.shape[1:]
        sample = batch_metrics(pred[None], truth[None], hd95=False)["dice"][0]
        np.testing.assert_allclose(sample, ours["dice"][0], atol=1e-12)  # its Dice: results.csv's
    assert differ  # some case's HD95 differs between the grids (pixels of another size)


def test_packed_masks_give_back_each_mask_and_cross_to_a_process_as_one_buffer():
    """The original-grid truth of a set in one packed buffer: each mask back bit for bit (odd sizes, None entries),
    subsets and joins keep the order, and the pickled set holds one tensor whatever the number of cases (a tensor
    per case ran out of file descriptors crossing to the worker pool: a review)."""
    import pickle

    from fedseg.data.packed import PackedMasks

    rng = np.random.default_rng(0)
    masks = [rng.random((2, 5, 7 + i)) > 0.5 if i % 3 else None for i in range(10)]
    packed = PackedMasks.pack(masks)
    assert packed is not None and len(packed) == 10 and packed.bits.dtype == torch.uint8
    for i, mask in enumerate(masks):
        got = packed.get(i)
        assert (got is None) if mask is None else torch.equal(got, torch.from_numpy(mask))
    picked = packed.select([8, 1, 0])
    assert picked is not None and picked.get(2) is None and torch.equal(picked.get(0), torch.from_numpy(masks[8]))
    assert PackedMasks.pack([None, None]) is None and packed.select([0, 3]) is None
    joined = PackedMasks.join([(picked, 3), (None, 2)])
    assert joined is not None and len(joined) == 5 and torch.equal(joined.get(1), torch.from_numpy(masks[1]))
    tensors = [v for v in vars(pickle.loads(pickle.dumps(packed))).values() if isinstance(v, torch.Tensor)]
    assert len(tensors) == 1
