"""nnU-Net's ignore label (partial / sparse annotations) end to end: ``fedseg data import nnunet`` accepts a
``dataset.json`` whose ``labels`` hold ``"ignore": V`` (nnU-Net's rule: one integer above every other label value)
and records it as ``ignore_label`` in ``federation.yaml``; the masks the data pipeline carries then hold the known
voxels in one more, last channel; the loss takes no loss and no gradient from ignored voxels, the metrics count only
the known ones, a short run on a 2D and on a 3D volume-path dataset completes, and the export writes the ignore label
back. Without an ignore label every tensor and number is what it was (the loss is MONAI's very call)."""

from __future__ import annotations

import csv
import json
import pickle
from dataclasses import replace
from pathlib import Path

import nibabel as nib
import numpy as np
import pytest
import torch
import yaml
from monai.losses import DiceLoss
from PIL import Image

from fedseg.config import DataConfig, SplitConfig, TrainConfig, VolumeConfig
from fedseg.data.check import check_folder
from fedseg.data.exporters.nnunet import export_nnunet
from fedseg.data.federation import UNANNOTATED, Case, Federation, FederationError, Regions, Site, split_known
from fedseg.data.folder import load_folder, read_header
from fedseg.data.prepared import prepare_case, reader_fields
from fedseg.data.preprocess import case_tensors
from fedseg.data.splits import make_splits
from fedseg.data.volumes import build_volume, draw_patches
from fedseg.evaluate.metrics import batch_metrics
from fedseg.flower.node import federation_header
from fedseg.flower.server import federation_from_record, federation_record
from fedseg.train import segmentation_loss
from test_nnunet import _nifti, cli, error_lines, one_line_error

SIZE = 24


def _disc_case(rng: np.random.Generator, size: int = SIZE) -> tuple[np.ndarray, np.ndarray]:
    """A grey image with a bright disc (label 1); the right third of the rows unannotated (the ignore value 2) but for
    a scribble of background and disc: a partially annotated slice."""
    yy, xx = np.mgrid[:size, :size]
    cy, cx = rng.uniform(size * 0.35, size * 0.65, 2)
    disc = (yy - cy) ** 2 + (xx - cx) ** 2 < (size / 4) ** 2
    image = (rng.normal(60, 8, (size, size)) + 120 * disc).clip(0, 255).astype(np.uint8)
    label = disc.astype(np.uint8)
    label[:, 2 * size // 3 :] = 2
    label[int(cy), 2 * size // 3 :] = disc[int(cy), 2 * size // 3 :]  # a scribble across the unannotated part
    return image, label


def png_dataset(root: Path, labels: dict | None = None, sites=("A", "B"), per_site: int = 5) -> Path:
    """An nnU-Net v2 2D dataset in its real layout: ``imagesTr/<site>_NNN_0000.png``, ``labelsTr/<site>_NNN.png``
    (0 background, 1 disc, 2 unannotated), ``dataset.json`` with ``"ignore": 2``."""
    rng = np.random.default_rng(0)
    for site in sites:
        for i in range(per_site):
            image, label = _disc_case(rng)
            for folder, name, array in (
                ("imagesTr", f"{site}_{i:03d}_0000.png", image),
                ("labelsTr", f"{site}_{i:03d}.png", label),
            ):
                (root / folder).mkdir(parents=True, exist_ok=True)
                Image.fromarray(array).save(root / folder / name)
    dataset = {
        "channel_names": {"0": "grey"},
        "labels": labels or {"background": 0, "disc": 1, "ignore": 2},
        "numTraining": len(sites) * per_site,
        "file_ending": ".png",
    }
    (root / "dataset.json").write_text(json.dumps(dataset))
    return root


VOLUME = (20, 18, 12)


def nifti_dataset(root: Path, sites=("X", "Y"), per_site: int = 4) -> Path:
    """An nnU-Net v2 3D dataset with region-based labels and an ignore label: nested boxes (whole = 1, 2; core = 2),
    every other slice along the last axis unannotated (3), as sparse slice annotations are."""
    rng = np.random.default_rng(1)
    for site in sites:
        for i in range(per_site):
            label = np.zeros(VOLUME, np.uint8)
            a, b = rng.integers(3, 6, 2)
            label[a : a + 10, b : b + 9, 2:10] = 1
            label[a + 3 : a + 7, b + 3 : b + 6, 4:8] = 2
            label[:, :, 1::2] = 3
            image = (rng.normal(100, 10, VOLUME) + 60 * np.isin(label, (1, 2)) + 40 * (label == 2)).astype(np.float32)
            _nifti(root / "imagesTr" / f"{site}_{i:03d}_0000.nii.gz", image, np.diag([1.0, 1.0, 2.0, 1.0]))
            _nifti(root / "labelsTr" / f"{site}_{i:03d}.nii.gz", label, np.diag([1.0, 1.0, 2.0, 1.0]))
    dataset = {
        "channel_names": {"0": "T1"},
        "labels": {"background": 0, "whole": [1, 2], "core": 2, "ignore": 3},
        "regions_class_order": [1, 2],
        "numTraining": len(sites) * per_site,
        "file_ending": ".nii.gz",
    }
    (root / "dataset.json").write_text(json.dumps(dataset))
    return root


def import_folder(src: Path, out: Path, site_by: str = r"^([A-Z]+)_\d+$") -> Path:
    result = cli("import", "nnunet", str(src), "--site-by", site_by, "--out", str(out))
    assert result.exit_code == 0, result.output
    assert "data check OK" in result.output, result.output
    return out


# --- import and data check ---------------------------------------------------------------------------------------


def test_import_records_the_ignore_label_and_the_check_takes_its_voxels_as_no_unknown_label(tmp_path):
    out = import_folder(png_dataset(tmp_path / "Dataset601_Scribbles"), tmp_path / "fed")
    header = yaml.safe_load((out / "federation.yaml").read_text())
    assert header["regions"] == {"disc": [1]} and header["ignore_label"] == 2
    fed = load_folder(out)
    assert fed.regions == Regions(("disc",), ((1,),), ignore=2) and fed.regions.target_channels == 2
    # a value in no region and not the ignore label is still one: the check says which is the ignore label
    Image.fromarray(np.full((SIZE, SIZE), 3, np.uint8)).save(out / "A" / "labels" / "A_000.png")
    result = cli("check", str(out))
    assert result.exit_code != 0 and "label values 3 are not in any region" in result.output, result.output
    assert "2 is the ignore label" in result.output


def test_the_check_warns_of_a_case_with_no_annotated_voxel_and_the_import_of_a_capitalised_ignore(tmp_path):
    """A fresh-eyes run: a label file of only the ignore value passed the check, then trained nothing and got no
    score without a word; a dataset.json saying "Ignore" (nnU-Net spells it in lower case) imported a region
    "Ignore" to segment silently. Both are now a warning line; two datasets, one with an ignore label, are told to
    add it to the other rather than to renumber."""
    out = import_folder(png_dataset(tmp_path / "Dataset601_Scribbles"), tmp_path / "fed")
    trained = min(cid for cid, s in make_splits(load_folder(out), SplitConfig(), 0)["B"].items() if s == "train")
    unannotated = out / "B" / "labels" / f"{trained}.png"  # a training case: one of its validation or test cases
    # would leave the site no scored case there (the next test)
    Image.fromarray(np.full((SIZE, SIZE), 2, np.uint8)).save(unannotated)
    result = cli("check", str(out))
    assert result.exit_code == 0, result.output
    said = " ".join(result.output.split())
    assert f"{unannotated}: no annotated voxel (every voxel holds the ignore label 2)" in said, result.output
    assert said.count("no annotated voxel") == 1
    capital = png_dataset(tmp_path / "Dataset602_Capital", labels={"background": 0, "disc": 1, "Ignore": 2})
    result = cli("import", "nnunet", str(capital), "--site-by", r"^([A-Z]+)_\d+$", "--out", str(tmp_path / "cap"))
    assert result.exit_code == 0, result.output
    assert "'Ignore' is imported as a region to segment" in " ".join(result.output.split()), result.output
    plain = png_dataset(tmp_path / "Dataset603_Plain", labels={"background": 0, "disc": 1}, sites=("C",))
    result = cli(
        "import",
        "nnunet",
        str(tmp_path / "Dataset601_Scribbles"),
        str(plain),
        "--site-by",
        r"^([A-Z]+)_\d+$",
        "--out",
        str(tmp_path / "both"),
    )
    said = " ".join(result.output.split())
    assert result.exit_code != 0 and 'give both dataset.json files the same "ignore" entry' in said, result.output


def test_a_site_whose_validation_cases_hold_no_annotated_voxel_is_refused_before_any_work(tmp_path):
    """A case of only the ignore label counts in no split: a site whose validation split held only such cases had
    no Dice to select a round by (its per-site models stayed at round 1), and the run said nothing of it. Its
    check (and so every run's) now names the site, as for a site with no validation cases."""
    out = import_folder(png_dataset(tmp_path / "Dataset607_Scribbles", per_site=8), tmp_path / "fed")
    split = SplitConfig()
    splits = make_splits(load_folder(out), split, 0)
    val = sorted(cid for cid, s in splits["A"].items() if s == "val")
    assert len(val) >= 2
    first = (out / "A" / "labels" / f"{val[0]}.png").read_bytes()
    for cid in val:
        Image.fromarray(np.full((SIZE, SIZE), 2, np.uint8)).save(out / "A" / "labels" / f"{cid}.png")
    with pytest.raises(FederationError) as e:
        check_folder(out, split, 0)
    said = str(e.value)
    assert "site 'A': no annotated validation cases after splitting (8 cases: " in said, said
    assert f"; {len(val)} without an annotated voxel, counted in none)" in said, said
    assert "site 'B'" not in said
    fed = check_folder(out)  # without a split (a folder's own check of its files): warnings only
    assert not any(UNANNOTATED in c.metadata for c in fed.site("A").cases)  # bookkeeping, not metadata
    # one unannotated validation case among annotated ones is no problem: it just gets no score
    (out / "A" / "labels" / f"{val[0]}.png").write_bytes(first)
    assert check_folder(out, split, 0).site("A")


def test_an_import_whose_site_holds_no_annotated_case_does_not_say_data_check_ok(tmp_path, caplog):
    """An audit: the import of a dataset whose site B held only the ignore label printed "data check OK", and
    `fedseg data check` then refused it; its warnings named the staging folder (gone after the import). The import
    keeps the sound files but says the default split fails, with the check's line, and names the final files."""
    src = png_dataset(tmp_path / "Dataset608_Scribbles")
    for path in (src / "labelsTr").glob("B_*.png"):
        Image.fromarray(np.full((SIZE, SIZE), 2, np.uint8)).save(path)
    out = tmp_path / "fed"
    result = cli("import", "nnunet", str(src), "--site-by", r"^([A-Z]+)_\d+$", "--out", str(out))
    said = " ".join(result.output.split())
    assert result.exit_code == 0 and "data check OK" not in said, result.output
    assert "files checked, but the default split fails (below)" in said
    assert "warning: site 'B': no annotated training cases" in said and f"`fedseg data check {out}`" in said
    logged = " ".join(" ".join(r.getMessage() for r in caplog.records).split())
    assert f"{out / 'B' / 'labels' / 'B_000.png'}: no annotated voxel" in logged, logged
    assert ".importing-" not in said + logged
    checked = cli("check", str(out))
    assert checked.exit_code != 0 and "site 'B': no annotated training cases" in " ".join(checked.output.split())


def test_region_based_labels_with_an_ignore_label_import(tmp_path):
    out = import_folder(nifti_dataset(tmp_path / "Dataset602_Sparse"), tmp_path / "fed")
    header = yaml.safe_load((out / "federation.yaml").read_text())
    assert header["regions"] == {"whole": [1, 2], "core": [2]} and header["ignore_label"] == 3


@pytest.mark.parametrize(
    ("labels", "said"),
    [
        (
            {"background": 0, "disc": 1, "ignore": 1},
            "1 is a region's label value; the ignore label must lie in no region",
        ),
        ({"background": 0, "disc": 1, "ignore": [2]}, "expected a positive integer label value, got [2]"),
        ({"background": 0, "disc": 1, "ignore": 2.0}, "expected a positive integer label value, got 2.0"),
        ({"background": 0, "disc": 1, "ignore": 0}, "expected a positive integer label value, got 0"),
        (
            {"background": 0, "disc": 1, "rim": 3, "ignore": 2},
            "2 must be the highest label value (nnU-Net's rule), above the regions' 3",
        ),
    ],
    ids=["a-region-value", "a-list", "a-float", "background", "not-the-highest"],
)
def test_a_bad_ignore_label_is_one_line_naming_the_file_and_field(tmp_path, labels, said):
    src = png_dataset(tmp_path / "Dataset603_Bad", labels=labels, sites=("A",), per_site=2)
    message = one_line_error(cli("import", "nnunet", str(src), "--out", str(tmp_path / "fed")))
    assert message == f'{src}/dataset.json: "labels": "ignore": {said}'
    assert not (tmp_path / "fed").exists()


def test_a_bad_ignore_label_comes_with_the_other_faults_of_the_file(tmp_path):
    src = png_dataset(tmp_path / "Dataset604_Bad", labels={"background": 0, "disc": 1, "ignore": 1}, sites=("A",))
    data = json.loads((src / "dataset.json").read_text())
    (src / "dataset.json").write_text(json.dumps({**data, "numTraining": 0}))
    assert error_lines(cli("import", "nnunet", str(src), "--out", str(tmp_path / "fed"))) == [
        f'{src}/dataset.json: "labels": "ignore": 1 is a region\'s label value; the ignore label must lie in no region',
        f'{src}/dataset.json: "numTraining": expected a positive integer, got 0',
    ]


def test_a_federation_folder_declares_its_ignore_label_and_a_bad_one_is_named(tmp_path):
    out = import_folder(png_dataset(tmp_path / "Dataset605_Own", sites=("A",), per_site=3), tmp_path / "fed")
    header_file = out / "federation.yaml"
    header = yaml.safe_load(header_file.read_text())
    header_file.write_text(yaml.safe_dump({**header, "ignore_label": 1}))
    with pytest.raises(FederationError) as e:
        read_header(out)
    assert str(e.value) == (
        f"{header_file}: ignore_label: 1 is a region's label value; the ignore label must lie in no region"
    )
    header_file.write_text(yaml.safe_dump({**header, "ignore_label": "x"}))
    assert "ignore_label: expected a positive integer label value, got 'x'" in cli("check", str(out)).output
    without = {k: v for k, v in header.items() if k != "ignore_label"}
    header_file.write_text(yaml.safe_dump(without))  # the ignore value is then an unknown label value
    assert "label values 2 are not in any region" in cli("check", str(out)).output


# --- the masks, the loss and the metrics ---------------------------------------------------------------------------


def _masked_batch(regions: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Logits ``(2, R, 12, 12)``, a target ``(2, R + 1, 12, 12)`` (known voxels last: the right half unknown) and
    the unknown voxels' mask ``(2, 1, 12, 12)``."""
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn((2, regions, 12, 12), generator=g)
    truth = (torch.rand((2, regions, 12, 12), generator=g) > 0.6).float()
    known = torch.ones((2, 1, 12, 12))
    known[..., 6:] = 0
    return logits, torch.cat([truth * known, known], 1), known == 0


@pytest.mark.parametrize("loss", ["dice", "dice_bce"])
@pytest.mark.parametrize("regions", [1, 2])
def test_the_loss_takes_nothing_from_ignored_voxels(loss, regions):
    loss_fn = segmentation_loss(TrainConfig(loss=loss))
    logits, target, unknown = _masked_batch(regions)
    base = loss_fn(logits, target)
    elsewhere = logits + 5.0 * torch.randn(logits.shape, generator=torch.Generator().manual_seed(3)) * unknown
    assert torch.equal(loss_fn(elsewhere, target), base)  # the logits changed at ignored voxels only
    known_change = logits.clone()
    known_change[:, :, :, :6] += 1.0
    assert not torch.allclose(loss_fn(known_change, target), base)
    leaf = logits.clone().requires_grad_(True)
    loss_fn(leaf, target).backward()
    assert leaf.grad is not None
    assert torch.count_nonzero(leaf.grad * unknown) == 0 and torch.count_nonzero(leaf.grad) > 0
    # every voxel known: MONAI's loss on the region masks, to float rounding
    everything = torch.cat([target[:, :regions], torch.ones_like(target[:, :1])], 1)
    torch.testing.assert_close(loss_fn(logits, everything), loss_fn(logits, target[:, :regions]))


def test_without_an_ignore_label_the_masks_the_loss_and_the_metrics_are_what_they_were():
    """No ignore label: ``Regions.target`` is ``one_hot`` (the very array), the loss is MONAI's very call (equal to the
    bit), the tensors keep R channels and the metrics are unchanged."""
    regions = Regions.from_mapping({"disc": [1, 2], "cup": [2]})
    label = np.random.default_rng(0).integers(0, 3, (10, 10)).astype(np.uint8)
    np.testing.assert_array_equal(regions.target(label), regions.one_hot(label))
    assert regions.target_channels == 2 and regions.ignore is None
    image = np.random.default_rng(1).normal(size=(1, 10, 10)).astype(np.float32)
    _, y = case_tensors(image, label, regions, 16, "zscore")
    assert y.shape == (2, 16, 16)
    g = torch.Generator().manual_seed(0)
    logits, target = torch.randn((2, 2, 8, 8), generator=g), (torch.rand((2, 2, 8, 8), generator=g) > 0.5).float()
    dice = DiceLoss(sigmoid=True, smooth_nr=1e-5, smooth_dr=1e-5)(logits, target)
    assert torch.equal(segmentation_loss(TrainConfig(loss="dice"))(logits, target), dice)
    bce = torch.nn.BCEWithLogitsLoss()(logits, target)
    assert torch.equal(segmentation_loss(TrainConfig(loss="dice_bce"))(logits, target), dice + bce)
    # what keys the prepared-case cache, the data fingerprint and Flower's federation record: no new field
    fed = Federation("f", "2d", 1, regions, [Site("s", [Case.from_arrays("c", image, label)])])
    assert "ignore_label" not in reader_fields(fed) and "ignore_label" not in federation_record(fed)
    case, cfg = fed.sites[0].cases[0], DataConfig(image_size=16)
    prepared = prepare_case(fed, case, cfg, "zscore", scored=True, originals=True)
    assert prepared.y.shape == (2, 16, 16) and prepared.truth is not None
    np.testing.assert_array_equal(prepared.truth, regions.one_hot(label))
    masked = Regions.from_mapping({"disc": [1, 2], "cup": [2]}, ignore=3)
    assert reader_fields(replace(fed, regions=masked))["ignore_label"] == 3
    assert json.loads(federation_record(replace(fed, regions=masked)))["ignore_label"] == 3
    assert federation_from_record(federation_record(replace(fed, regions=masked))).regions == masked
    # a Flower site must agree with the coordinator on it (the header both compare), and only then is it there
    assert (
        "ignore_label" not in federation_header(fed)
        and federation_header(replace(fed, regions=masked))["ignore_label"] == 3
    )


def test_the_metrics_count_only_annotated_voxels():
    logits, target, unknown = _masked_batch(2, seed=5)
    pred = logits > 0
    scores = batch_metrics(pred, target.bool(), hd95=True)
    flipped = pred ^ unknown  # the prediction changed at every ignored voxel, nowhere else
    for key, value in batch_metrics(flipped, target.bool(), hd95=True).items():
        np.testing.assert_array_equal(value, scores[key])
    known = ~unknown
    # nnU-Net's counts: tp, fp, fn inside the known mask
    truth = target[:, :2].bool()
    tp, fp, fn = ((a & b & known).sum((2, 3)) for a, b in ((pred, truth), (pred, ~truth), (~pred, truth)))
    np.testing.assert_allclose(scores["dice"], (2 * tp / (2 * tp + fp + fn)).double().numpy(), rtol=1e-6)
    moved = pred.clone()
    moved[:, :, :, :6] = ~moved[:, :, :, :6]
    assert not np.array_equal(batch_metrics(moved, target.bool(), hd95=False)["dice"], scores["dice"])


def test_volumes_carry_the_known_voxels_and_draw_no_patch_on_an_ignored_one():
    regions = Regions.from_mapping({"box": [1]}, ignore=2)
    label = np.full((16, 16, 16), 2, np.uint8)  # everything unannotated but for a known background corner
    label[:4, :4, :4] = 0
    image = np.random.default_rng(0).normal(size=(1, 16, 16, 16)).astype(np.float32)
    vol = build_volume(
        image, label, regions, (1.0, 1.0, 1.0), VolumeConfig(patch_size=8, crop_foreground=False), "none"
    )
    assert vol.known and vol.label.shape == (2, 16, 16, 16) and vol.truth is not None and vol.truth.shape[0] == 2
    assert int(vol.label[1].sum()) == 64 and len(vol.foreground()) == 0  # an ignored voxel is no foreground
    x, y = draw_patches([vol], (8, 8, 8), 1.0, torch.Generator().manual_seed(0))
    assert x.shape == (1, 1, 8, 8, 8) and y.shape == (1, 2, 8, 8, 8)


def _ball(centre: tuple[int, int, int], radius: float = 6.0, size: int = 32) -> np.ndarray:
    grid = np.mgrid[:size, :size, :size]
    return sum((g - c) ** 2 for g, c in zip(grid, centre)) <= radius**2


def test_surface_metrics_of_a_partly_annotated_case_are_not_computed_and_of_a_wholly_annotated_one_as_ever():
    """Masking both masks before taking edges made every annotated/unannotated border an edge (a ball predicted 3
    voxels off, every other slice annotated: HD95 2.24 for 3.0, NSD 0.86 for 0.43): the true surface is unknown
    there, so HD95 and NSD are NaN for a case with an unannotated voxel; Dice still counts the annotated ones."""
    truth = torch.from_numpy(_ball((16, 16, 16)))[None, None]
    pred = torch.from_numpy(_ball((19, 16, 16)))[None, None]
    sparse = torch.ones_like(truth)
    sparse[..., 1::2] = False  # every other slice unannotated
    partial = batch_metrics(pred, torch.cat([truth & sparse, sparse], 1), hd95=True)
    assert np.isnan(partial["hd95"]).all() and np.isnan(partial["nsd"]).all()
    t, p, k = truth & sparse, pred & sparse, sparse
    np.testing.assert_allclose(partial["dice"], [[2 * (t & p).sum() / (t.sum() + p.sum())]], rtol=1e-12)
    plain = batch_metrics(pred, truth, hd95=True)
    assert plain["hd95"][0, 0] == pytest.approx(3.0)
    wholly = batch_metrics(pred, torch.cat([truth, torch.ones_like(truth)], 1), hd95=True)
    for key in ("dice", "hd95", "nsd"):
        np.testing.assert_array_equal(wholly[key], plain[key])  # every voxel annotated: as without an ignore label
    # a batch of both: each case by its own annotation
    both = batch_metrics(
        torch.cat([pred, pred]), torch.cat([torch.cat([truth & k, k], 1), torch.cat([truth, k | True], 1)]), hd95=True
    )
    assert np.isnan(both["hd95"][0, 0]) and both["hd95"][1, 0] == pytest.approx(3.0)


def test_a_case_without_an_annotated_voxel_has_no_score_and_an_absent_region_the_both_empty_rule():
    truth = torch.zeros((3, 2, 8, 8), dtype=torch.bool)
    pred = torch.zeros_like(truth)
    pred[0, :, 2:4, 2:4] = True
    known = torch.ones((3, 1, 8, 8), dtype=torch.bool)
    known[0] = False  # case 0: nothing annotated (its prediction lies in the unannotated voxels)
    known[1, :, :, 4:] = False  # case 1: half annotated, neither region there nor predicted
    truth[2, 0, 5:7, 5:7] = True  # case 2: wholly annotated, region 1 absent from truth and prediction
    pred[2, 0, 5:7, 5:7] = True
    scores = batch_metrics(pred, torch.cat([truth, known], 1), hd95=True)
    for key in ("dice", "hd95", "nsd"):
        assert np.isnan(scores[key][0]).all(), key  # carries no information (was Dice 1, HD95 0, NSD 1)
    np.testing.assert_array_equal(scores["dice"][1], [1.0, 1.0])  # both empty among the annotated voxels
    assert np.isnan(scores["hd95"][1]).all() and np.isnan(scores["nsd"][1]).all()  # partly annotated
    np.testing.assert_array_equal(scores["dice"][2], [1.0, 1.0])
    np.testing.assert_array_equal(scores["hd95"][2], [0.0, 0.0])
    np.testing.assert_array_equal(scores["nsd"][2], [1.0, 1.0])


def test_the_masked_loss_of_a_batch_is_the_mean_of_its_cases_losses():
    """q-FedAvg / FedPIDAvg take ``batch loss x B`` as the sum of per-case losses and FedSM scores cases alone: the
    masked cross-entropy is a per-case mean over that case's known voxels, then a mean over the cases (a case with no
    known voxel gives 0), not one pool over the batch."""
    g = torch.Generator().manual_seed(7)
    logits = torch.randn((4, 2, 12, 12), generator=g)
    truth = (torch.rand((4, 2, 12, 12), generator=g) > 0.6).float()
    known = torch.ones((4, 1, 12, 12))
    known[0, ..., 3:] = 0  # a quarter known
    known[1, ..., 1:] = 0  # a twelfth known
    known[3] = 0  # nothing known
    target = torch.cat([truth * known, known], 1)
    for loss in ("dice", "dice_bce"):
        loss_fn = segmentation_loss(TrainConfig(loss=loss))
        cases = torch.stack([loss_fn(logits[i : i + 1], target[i : i + 1]) for i in range(4)])
        torch.testing.assert_close(loss_fn(logits, target), cases.mean())
        assert float(cases[3]) == 0.0


def test_the_fingerprint_takes_no_ignored_voxel_for_foreground():
    from fedseg.config import RunConfig
    from fedseg.engine.context import Task
    from fedseg.plan.fingerprint import case_fingerprint

    image = np.arange(1, 17, dtype=np.float32).reshape(1, 4, 4)
    label = np.zeros((4, 4), np.uint8)
    label[0, :2] = 1
    label[3, :] = 2  # unannotated
    fp = case_fingerprint(image, label, (1.0, 1.0), ignore=2)
    np.testing.assert_array_equal(fp.foreground, [[1, 2]])
    assert case_fingerprint(image, label, (1.0, 1.0)).foreground.shape == (1, 6)  # no ignore label: label > 0
    fed = Federation("f", "2d", 1, Regions.from_mapping({"disc": [1]}, ignore=2), [Site("s", [])])
    assert Task.of(RunConfig(), fed).ignore_label == 2  # what the planning client passes
    assert Task.of(RunConfig(), replace(fed, regions=Regions.from_mapping({"disc": [1]}))).ignore_label is None


def _scribble_volume(known: bool) -> object:
    """A 24^3 volume annotated in one 3^3 scribble of background (an ignore label's) or everywhere (without one)."""
    regions = Regions.from_mapping({"box": [1]}, ignore=2 if known else None)
    label = np.zeros((24, 24, 24), np.uint8)
    if known:
        label[:] = 2
        label[20:23, 20:23, 20:23] = 0
    image = np.random.default_rng(0).normal(size=(1, 24, 24, 24)).astype(np.float32)
    return build_volume(
        image, label, regions, (1.0, 1.0, 1.0), VolumeConfig(patch_size=8, crop_foreground=False), "none"
    )


def test_a_patch_not_forced_onto_foreground_is_centred_on_an_annotated_voxel():
    """With an ignore label a draw not forced onto foreground is centred on a random known voxel (nnU-Net's rule: no
    patch without an annotated voxel, which gives no loss), from the same generator; without one, the corner is
    uniform, the very draws as before."""
    vol = _scribble_volume(known=True)
    draws = [draw_patches([vol] * 8, (8, 8, 8), 0.0, torch.Generator().manual_seed(s))[1] for s in range(4)]
    assert all(int(y[i, 1].sum()) > 0 for y in draws for i in range(8))  # every patch holds annotated voxels
    assert len(vol.known_voxels()) == 27 and len(vol.foreground()) == 0
    again = draw_patches([vol] * 8, (8, 8, 8), 0.0, torch.Generator().manual_seed(3))[1]
    assert torch.equal(again, draws[3])  # a function of the generator
    assert pickle.loads(pickle.dumps(vol))._known is None  # recomputed where needed, as the foreground index
    plain = _scribble_volume(known=False)
    g, mine = torch.Generator().manual_seed(5), torch.Generator().manual_seed(5)
    x, _ = draw_patches([plain] * 3, (8, 8, 8), 0.0, g)
    for i in range(3):  # the draw as it was: u, then a uniform corner
        torch.rand((), generator=mine)
        start = [int(torch.randint(17, (), generator=mine)) for _ in range(3)]
        assert torch.equal(
            x[i], plain.image[:, start[0] : start[0] + 8, start[1] : start[1] + 8, start[2] : start[2] + 8]
        )
    assert len(plain.known_voxels()) == 0 and len(_wholly_known_volume().known_voxels()) == 0


def _wholly_known_volume() -> object:
    regions = Regions.from_mapping({"box": [1]}, ignore=2)
    image = np.zeros((1, 12, 12, 12), np.float32)
    return build_volume(
        image,
        np.zeros((12, 12, 12), np.uint8),
        regions,
        (1.0,) * 3,
        VolumeConfig(patch_size=8, crop_foreground=False),
        "none",
    )


def test_the_scoring_note_says_only_annotated_voxels_count():
    from fedseg.evaluate.metric_info import scoring_text

    assert scoring_text("channels", "original") == scoring_text("channels", "original", None)
    assert "annotated voxels only" not in scoring_text("channels", "original")
    assert "annotated voxels only" in scoring_text("channels", "original", 3)


# --- runs ----------------------------------------------------------------------------------------------------------


def _count_masked_losses(monkeypatch) -> list[bool]:
    """Record, for every call of the training loss, whether its target carried the known-voxel channel."""
    import fedseg.train

    seen: list[bool] = []

    def recording(masks, regions):
        parts = split_known(masks, regions)
        seen.append(parts[1] is not None)
        return parts

    monkeypatch.setattr(fedseg.train, "split_known", recording)
    return seen


def _test_dice(run: Path) -> list[float]:
    """Every test case's Dice in ``results.csv`` (one row per case, region and metric)."""
    with open(run / "results.csv", newline="") as f:
        dice = [float(row["value"]) for row in csv.DictReader(f) if row["metric"] == "dice"]
    assert dice
    return dice


def test_a_short_run_on_an_imported_2d_dataset_with_an_ignore_label(tmp_path, tiny_config, monkeypatch):
    from fedseg.api import Experiment

    masked = _count_masked_losses(monkeypatch)
    src = png_dataset(tmp_path / "Dataset606_Scribbles")
    for path in (src / "labelsTr").glob("B_*.png"):  # site B annotated everywhere, site A partly
        label = np.asarray(Image.open(path))
        Image.fromarray(np.where(label == 2, 0, label).astype(np.uint8)).save(path)
    out = import_folder(src, tmp_path / "fed")
    cfg = tiny_config(
        algorithms=["fedavg"],
        data={"image_size": 16},
        fl={"rounds": 1},
        train={"loss": "dice_bce"},
        eval={"hd95": True, "local_models": False},
    )
    run = tmp_path / "run"
    Experiment(cfg, run, federation=load_folder(out), progress=False).run(report=True)
    dice = _test_dice(run)
    assert all(np.isfinite(dice)) and all(0.0 <= d <= 1.0 for d in dice)
    assert masked and all(masked)  # every training step's loss took the known voxels only
    # HD95 and NSD: not computed (NaN) for a partly annotated case, a number for a wholly annotated one; the tables,
    # summary.json and the report take both
    with open(run / "results.csv", newline="") as f:
        surface = [(row["site"], float(row["value"])) for row in csv.DictReader(f) if row["metric"] in ("hd95", "nsd")]
    assert {site for site, _ in surface} == {"A", "B"}
    assert all(np.isnan(v) == (site == "A") for site, v in surface), surface
    summary = json.loads((run / "summary.json").read_text())
    assert summary["ignore_label"] == 2 and summary["regions"] == ["disc"]
    report = (run / "report.html").read_text()
    assert "scores count annotated voxels only" in report and "Test HD95" in report


def test_a_short_run_on_the_volume_path_of_a_3d_dataset_with_an_ignore_label(tmp_path, tiny_config, monkeypatch):
    from fedseg.api import Experiment

    masked = _count_masked_losses(monkeypatch)
    out = import_folder(nifti_dataset(tmp_path / "Dataset607_Sparse"), tmp_path / "fed")
    cfg = tiny_config(
        algorithms=["fedavg"],
        data={"image_size": 16, "volume": {"patch_size": 16}, "normalize": "zscore_channel"},
        fl={"rounds": 1},
        eval={"hd95": True, "local_models": False},
    )
    Experiment(cfg, tmp_path / "run", federation=load_folder(out), progress=False).run(report=False)
    dice = _test_dice(tmp_path / "run")
    assert all(np.isfinite(dice)) and all(0.0 <= d <= 1.0 for d in dice)
    assert masked and all(masked)  # every training step's loss took the known voxels only


def test_the_export_writes_the_ignore_label_back(tmp_path):
    fed = load_folder(import_folder(nifti_dataset(tmp_path / "Dataset608_Sparse", sites=("X",)), tmp_path / "fed"))
    splits = make_splits(fed, SplitConfig(ratios=(0.5, 0.25, 0.25)), 0)
    written = export_nnunet(fed, [splits], tmp_path, dataset_id=998)
    dataset = json.loads((written.path / "dataset.json").read_text())
    assert dataset["labels"] == {"background": 0, "whole": [1, 2], "core": [2], "ignore": 3}
    label = next((written.path / "labelsTr").iterdir())
    assert set(np.unique(np.asarray(nib.load(label).dataobj)).tolist()) == {0, 1, 2, 3}
    back = import_folder(written.path, tmp_path / "back", r"^(?P<site>.+?)__(?P<case>.+)$")
    assert yaml.safe_load((back / "federation.yaml").read_text())["ignore_label"] == 3


def test_the_terminal_dice_legend_says_only_annotated_voxels_count():
    """The terminal's Dice table looked like a fully annotated run's (a fresh-eyes run): its legend now says, where
    the run has an ignore label, that only annotated voxels count and what a blank site is."""
    import io

    from rich.console import Console

    from fedseg.console_tables import DICE_LEGEND, print_dice

    def printed(ignore_label):
        out = io.StringIO()
        dice = {"fedavg": {"A": 0.8, "B": float("nan"), "client_avg": 0.8, "global": 0.8}}
        print_dice(Console(file=out, width=200), "Test Dice", ["A", "B"], dice, ignore_label)
        return " ".join(out.getvalue().split())

    assert "partial annotations" not in printed(None) and DICE_LEGEND in printed(None)
    said = printed(2)
    assert "partial annotations (ignore label 2): annotated voxels only, – a site with no scored case" in said
