"""``fedseg predict`` on image files written by the test, against the masks evaluation computed."""

from __future__ import annotations

import csv
import json
import math
import shutil
from pathlib import Path

import nibabel as nib
import numpy as np
import pytest
import torch
from PIL import Image
from typer.testing import CliRunner

import fedseg
from fedseg.algorithms.fedsm.model import bundle_entries, candidate_names, route, super_model_from_bundle
from fedseg.algorithms.fedsm.selector import build_selector
from fedseg.cli import app
from fedseg.config_load import dump_config, load_config
from fedseg.data import readers, voxel_grid
from fedseg.data.case_files import read_label
from fedseg.data.federation import Federation, Regions
from fedseg.data.folder_write import write_folder
from fedseg.engine.messages import load_weights, weights_of
from fedseg.evaluate.inference import predict_masks
from fedseg.evaluate.metrics import batch_metrics
from fedseg.evaluate.tables import read_rows
from fedseg.models.factory import build_segmenter
from fedseg.predict import Bundle, load_bundle, predict
from fedseg.predict_model import PredictError, build_predictor
from fedseg.predict_outputs import CSV_NAME
from fedseg.run import prepare
from fedseg.run.model_card import model_card
from fedseg.run.outputs import write_bundle_files

runner = CliRunner()
DISC_CUP = Regions.from_mapping({"disc": [1, 2], "cup": [2]})
DISJOINT = Regions.from_mapping({"organ": [1], "lesion": [2]})


@pytest.fixture(scope="module")
def trained(tmp_path_factory, tiny_config, disc_federation):
    """``fedseg run --data`` (fedsm + fedavg, 1 round) on a 3-site folder federation; returns
    ``(run dir, federation root, RunConfig of the run, Prepared data)``."""
    tmp = tmp_path_factory.mktemp("predict")
    root = write_folder(disc_federation(n_sites=3, cases_per_site=8), tmp / "fed")
    cfg = tiny_config(
        algorithms=["fedsm", "fedavg"],
        fl={"rounds": 1},
        eval={"hd95": False},
        methods={"fedsm": {"selector_width": 0.0625}},
    )
    (tmp / "cfg.yaml").write_text(dump_config(cfg))
    run = tmp / "run"
    result = runner.invoke(app, ["run", "--config", str(tmp / "cfg.yaml"), "--data", str(root), "--out", str(run)])
    assert result.exit_code == 0, result.output
    cfg = load_config(file=run / "config.yaml")
    return run, root, cfg, prepare(cfg)


def copy_test_images(trained, folder):
    """Copy every site's test images (as the run split them) into ``folder``; returns ``{case id: site}``."""
    run, root, _, prep = trained
    folder.mkdir(parents=True)
    cases = {}
    for data in prep.site_data:
        for case in data.test.ids:
            shutil.copy(root / data.name / "images" / f"{case}.png", folder)
            cases[case] = data.name
    return cases


def read_csv(path):
    with open(path, newline="") as f:
        return {r["file"]: r for r in csv.DictReader(f)}


def dice_rows(run, algorithm):
    """Test Dice per (case, region) of ``algorithm``'s own model (not its sites' local models, ``local:<site>``)."""
    return {
        (r["case"], r["region"]): r["value"]
        for r in read_rows(run / "results.csv")
        if r["algorithm"] == algorithm and r["metric"] == "dice" and not r["model"].startswith("local:")
    }


def assert_written_masks(out, model, prep, expected_dice=None):
    """The label maps in ``out`` equal ``model``'s masks of every site's test split (computed as
    evaluation does, ``predict_masks``) painted into one label map; with ``expected_dice`` (results.csv) the
    written maps' region masks score it, i.e. the run's scores are those of the masks it writes (nested regions,
    disc/cup: a cup pixel predicted outside the disc is in the written disc, ``eval.score_on: label_map``)."""
    regions, threshold = prep.federation.regions, prep.task.cfg.eval.threshold
    for data in prep.site_data:
        masks = predict_masks(model, data.test.x, 4, threshold, torch.device("cpu"))
        written = np.stack([read_label(out / f"{case}.png", "2d") for case in data.test.ids])
        dice = batch_metrics(np.stack([regions.one_hot(w) for w in written]), data.test.y.bool(), hd95=False)["dice"]
        for i, case in enumerate(data.test.ids):
            np.testing.assert_array_equal(written[i], regions.to_label(masks[i].numpy()), err_msg=case)
            if expected_dice is not None:
                for j, region in enumerate(regions.names):
                    assert dice[i, j] == pytest.approx(expected_dice[(case, region)], abs=1e-6), (case, region)


def global_model(bundle_dir, name="global"):
    bundle = load_bundle(bundle_dir)
    model = bundle.new_segmenter()
    load_weights(model, bundle.models[name])
    return model.eval()


def test_predict_reproduces_the_masks_evaluation_computed(trained, tmp_path):
    run, _, _, prep = trained
    cases = copy_test_images(trained, tmp_path / "new")
    rows = predict(run / "model", tmp_path / "new", tmp_path / "out")  # default: the only FedSM bundle
    assert sorted(r["file"] for r in rows) == sorted(f"{c}.png" for c in cases)
    bundle = load_bundle(run / "model" / "fedsm").models
    sm = super_model_from_bundle(bundle, prep.task.new_model, 3, 2)  # rebuilt as in test_fedsm, not by predict
    assert_written_masks(tmp_path / "out", sm, prep, dice_rows(run, "fedsm"))
    names = candidate_names(bundle)
    table = read_csv(tmp_path / "out" / "predictions.csv")
    for data in prep.site_data:
        with torch.no_grad():
            probs = sm.scores(data.test.x)
        chosen = route(probs, "threshold", sm.gamma)
        for i, case in enumerate(data.test.ids):
            row = table[f"{case}.png"]
            assert row["model"] == names[int(chosen[i])] and row["mask"] == f"{case}.png"
            assert float(row["confidence"]) == pytest.approx(float(probs[i].max()), abs=1e-6)
            site_probs = [float(row[f"prob:{n}"]) for n in names[1:]]
            np.testing.assert_allclose(site_probs, probs[i].numpy(), atol=1e-6)


def test_gamma_one_always_uses_the_global_model_and_zero_the_argmax_personal(trained, tmp_path):
    run, _, _, prep = trained
    copy_test_images(trained, tmp_path / "new")
    always_global = predict(run / "model", tmp_path / "new", tmp_path / "g1", gamma=1.0)
    assert {r["model"] for r in always_global} == {"global"}
    assert_written_masks(tmp_path / "g1", global_model(run / "model" / "fedsm"), prep)
    always_personal = predict(run / "model", tmp_path / "new", tmp_path / "g0", gamma=0.0)
    sites = prep.federation.site_names
    for r in always_personal:
        argmax = max(sites, key=lambda s: float(r[f"prob:personal:{s}"]))
        assert r["model"] == f"personal:{argmax}"


def test_single_model_bundle_reproduces_fedavg_evaluation(trained, tmp_path):
    run, _, _, prep = trained
    copy_test_images(trained, tmp_path / "new")
    rows = predict(run / "model", tmp_path / "new", tmp_path / "out", algorithm="fedavg")
    assert {r["model"] for r in rows} == {"global"} and {r["confidence"] for r in rows} == {""}
    assert_written_masks(tmp_path / "out", global_model(run / "model" / "fedavg"), prep, dice_rows(run, "fedavg"))
    with pytest.raises(PredictError, match="--gamma"):
        predict(run / "model" / "fedavg", tmp_path / "new", tmp_path / "x", gamma=0.5)
    with pytest.raises(PredictError, match="--site"):
        predict(run / "model", tmp_path / "new", tmp_path / "x", site="site1")
    with pytest.raises(PredictError, match="fedavg, fedsm"):
        predict(run / "model", tmp_path / "new", tmp_path / "x", algorithm="fedprox")
    with pytest.raises(PredictError, match="must lie in"):
        predict(run / "model", tmp_path / "new", tmp_path / "x", gamma=1.5)
    assert not (tmp_path / "x").exists()


def test_masks_keep_the_input_size_and_format(trained, tmp_path):
    run, root, _, prep = trained
    case = prep.site_data[0].test.ids[0]
    src = root / prep.site_data[0].name / "images" / f"{case}.png"
    rgb = np.asarray(Image.open(src))  # (32, 32, 3) uint8
    new = tmp_path / "new"
    new.mkdir()
    Image.fromarray(rgb).resize((48, 40), Image.BILINEAR).save(new / "big.png")
    Image.fromarray(rgb).save(new / "photo.jpg", quality=95)
    np.save(new / "array.npy", np.moveaxis(rgb, -1, 0))  # (C, H, W)
    affine = np.diag([0.5, 0.25, 1.0, 1.0])
    nib.save(nib.Nifti1Image(rgb.copy(), affine), new / "scan.nii.gz")  # 2D NIfTI: (X, Y, C)
    nib.save(nib.Nifti1Image(rgb[:, :, None, :].copy(), affine), new / "slice.nii.gz")  # 2D as nnU-Net: (X, Y, 1, C)
    scanner = nib.Nifti1Image(rgb[:, :, None, :].copy(), None)  # a scanner's file: a rotated qform, no sform
    rotated = np.array([[0.0, -0.5, 0, 12], [0.25, 0, 0, -3], [0, 0, 2.0, 7], [0, 0, 0, 1]])
    scanner.set_qform(rotated, code=1)
    scanner.set_sform(None, code=0)
    nib.save(scanner, new / "scanner.nii.gz")
    shutil.copy(src, new / "same.png")
    rows = predict(run / "model", new, tmp_path / "out")
    assert {r["file"]: r["mask"] for r in rows} == {
        "array.npy": "array.npy",
        "big.png": "big.png",
        "photo.jpg": "photo.png",
        "same.png": "same.png",
        "scan.nii.gz": "scan.nii.gz",
        "scanner.nii.gz": "scanner.nii.gz",
        "slice.nii.gz": "slice.nii.gz",
    }
    out = tmp_path / "out"
    same = read_label(out / "same.png", "2d")
    assert read_label(out / "big.png", "2d").shape == (40, 48)
    assert read_label(out / "photo.png", "2d").shape == (32, 32)
    np.testing.assert_array_equal(np.load(out / "array.npy"), same)
    scan = nib.load(out / "scan.nii.gz")
    np.testing.assert_array_equal(np.asarray(scan.dataobj), same)
    np.testing.assert_array_equal(scan.affine, affine)
    one_slice = nib.load(out / "slice.nii.gz")  # the mask lies on the image's (X, Y, 1) grid, as nnU-Net's would
    assert one_slice.shape == (32, 32, 1)
    np.testing.assert_array_equal(np.asarray(one_slice.dataobj)[:, :, 0], same)
    from_scanner = nib.load(out / "scanner.nii.gz")  # the image's spatial header: qform only, as the scanner wrote it
    assert (int(from_scanner.header["qform_code"]), int(from_scanner.header["sform_code"])) == (1, 0)
    np.testing.assert_allclose(from_scanner.affine, rotated, atol=1e-6)
    np.testing.assert_array_equal(np.asarray(from_scanner.dataobj)[:, :, 0], same)
    assert same.dtype == np.uint8 and set(np.unique(same)) <= {0, 1, 2}


def write_itk_rgb(path: Path, rgb: np.ndarray, spacing, origin, direction) -> Path:
    """``rgb`` ``(X, Y[, 1], 3)`` (array order) as an ITK vector image (MetaImage or NRRD by ``path``'s extension) on
    the grid ``spacing``, ``origin``, ``direction`` (LPS, one column per axis); ITK's NumPy view is reversed."""
    itk = pytest.importorskip("itk")
    view = np.ascontiguousarray(np.moveaxis(rgb, -1, 0).T)  # (k, j, i, components)
    image = itk.image_from_array(view, is_vector=True)
    image.SetSpacing([float(s) for s in spacing])
    image.SetOrigin([float(o) for o in origin])
    image.SetDirection(itk.matrix_from_array(np.asarray(direction, dtype=np.float64)))
    itk.imwrite(image, str(path))
    return path


def png_mask_of(trained, tmp_path):
    """``(the first test image's RGB (X, Y, 3), its mask predicted from the PNG)``."""
    run, root, _, prep = trained
    src = root / prep.site_data[0].name / "images" / f"{prep.site_data[0].test.ids[0]}.png"
    (tmp_path / "png").mkdir()
    shutil.copy(src, tmp_path / "png" / "same.png")
    predict(run / "model", tmp_path / "png", tmp_path / "png_out")
    return np.asarray(Image.open(src)), read_label(tmp_path / "png_out" / "same.png", "2d")


def header_fields(path: Path) -> dict[str, str]:
    """The header of the MetaImage (``key = value`` lines up to ``ElementDataFile``) or NRRD (``key: value`` lines up
    to the blank line, the magic line and comments left out) file ``path``, as its text says it."""
    raw = path.read_bytes()
    if raw.startswith(b"NRRD"):
        lines = raw[: raw.index(b"\n\n")].decode("ascii").splitlines()[1:]
        return {k.strip(): v.strip() for k, _, v in (line.partition(":") for line in lines if not line.startswith("#"))}
    fields = {}
    for line in raw.split(b"\n"):
        key, _, value = line.decode("ascii").partition("=")
        fields[key.strip()] = value.strip()
        if key.strip() == "ElementDataFile":
            return fields
    raise AssertionError(f"{path}: no ElementDataFile line")


def numbers(text: str) -> list[float]:
    """``"0.5 0.25 3"`` or ``"(0,0.5,0) (0.25,0,0)"``: the numbers, in order."""
    return [float(v) for v in text.replace("(", " ").replace(")", " ").replace(",", " ").split()]


def assert_mask_on_its_grid(mask: Path, source: Path, exact: bool = True) -> None:
    """``mask`` (a ``.mha`` or ``.nrrd`` fedseg predict wrote) is a uint8 file of ``source``'s format and shape on its
    grid, as fedseg's readers read both (ITK: spacing, origin, directions in LPS) and as the header text states it:
    dimensions, sizes, spacing, origin, directions, element type, compressed voxels in one file. ``exact``: to the
    last bit (a NRRD's oblique ``space directions``, spacing folded in, read back to within its last bit)."""
    expected, got = readers.itk_geometry(source), readers.itk_geometry(mask)
    assert got.shape == expected.shape
    tolerance = {"rtol": 0, "atol": 0} if exact else {"rtol": 1e-14, "atol": 1e-14}
    np.testing.assert_allclose(got.spacing, expected.spacing, **tolerance)
    np.testing.assert_allclose(got.origin, expected.origin, **tolerance)
    np.testing.assert_allclose(got.direction, expected.direction, **tolerance)
    np.testing.assert_allclose(readers.volume_grid(mask).affine, readers.volume_grid(source).affine, **tolerance)
    assert voxel_grid.grid_mismatch(readers.volume_grid(mask), readers.volume_grid(source)) is None
    assert readers.read_volume(mask).dtype == np.uint8
    n, fields = len(expected.shape), header_fields(mask)
    if mask.suffix == ".mha":
        assert (fields["ObjectType"], fields["NDims"], fields["ElementType"]) == ("Image", str(n), "MET_UCHAR")
        assert (fields["CompressedData"], fields["BinaryDataByteOrderMSB"], fields["ElementDataFile"]) == (
            "True",
            "False",
            "LOCAL",
        )
        assert numbers(fields["DimSize"]) == list(expected.shape)
        assert numbers(fields["ElementSpacing"]) == list(expected.spacing)
        assert numbers(fields["Offset"]) == list(expected.origin)
        assert numbers(fields["TransformMatrix"]) == list(expected.direction.T.ravel())  # axis 0's direction first
        assert readers.metaimage_problem(mask) is None  # its compressed data as long as the header says
    else:
        assert (fields["type"], fields["dimension"], fields["encoding"]) == ("uint8", str(n), "gzip")
        assert fields["space"] == "left-posterior-superior" if n == 3 else fields["space dimension"] == str(n)
        assert numbers(fields["sizes"]) == list(expected.shape)
        assert numbers(fields["space origin"]) == list(expected.origin)
        vectors = np.reshape(numbers(fields["space directions"]), (n, n)).T  # one column per axis, spacing folded in
        np.testing.assert_allclose(vectors, expected.direction * expected.spacing, **tolerance)


def test_a_2d_metaimage_or_nrrd_stored_x_y_1_gets_an_x_y_1_mask_of_its_format_on_its_grid(trained, tmp_path):
    """A 2D image stored as a one-slice MetaImage (``.mha``, or a ``.mhd`` header and its ``.raw``) or NRRD: its mask
    is a ``.mha`` (one file) or ``.nrrd`` of shape ``(X, Y, 1)`` on the image's grid, the slice's 3 mm and position
    too, and holds the mask predicted from the same pixels as a PNG."""
    run = trained[0]
    rgb, same = png_mask_of(trained, tmp_path)
    spacing, origin = (0.5, 0.25, 3.0), (10.0, -5.0, 7.0)  # the third axis: a slice 3 mm thick at z = 7 mm
    direction = [[0.0, 1.0, 0.0], [1.0, 0.0, 0.0], [0.0, 0.0, -1.0]]
    new = tmp_path / "new"
    new.mkdir()
    for name in ("meta.mha", "header.mhd", "raster.nrrd"):  # .mhd: header and .raw data file
        write_itk_rgb(new / name, rgb[:, :, None, :], spacing, origin, direction)
    rows = predict(run / "model", new, tmp_path / "out")
    masks = {r["file"]: r["mask"] for r in rows}
    assert masks == {"header.mhd": "header.mha", "meta.mha": "meta.mha", "raster.nrrd": "raster.nrrd"}
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == sorted([*masks.values(), CSV_NAME, "predict.json"])
    for name, mask_name in masks.items():
        source, mask = new / name, tmp_path / "out" / mask_name
        assert readers.volume_grid(source).shape == (32, 32, 1)
        assert_mask_on_its_grid(mask, source)
        stored = readers.read_volume(mask)
        assert stored.shape == (32, 32, 1), name  # the image's shape: viewers and nnU-Net compare them
        np.testing.assert_array_equal(stored[:, :, 0], same, err_msg=name)
        np.testing.assert_array_equal(read_label(mask, "2d"), same, err_msg=name)  # read as a 2D label map: the slice
        np.testing.assert_allclose(readers.volume_grid(mask).spacing(3), spacing, err_msg=name)  # the 3 mm too


def test_a_genuinely_2d_metaimage_or_nrrd_still_gets_a_2d_mask(trained, tmp_path):
    run = trained[0]
    rgb, same = png_mask_of(trained, tmp_path)
    new = tmp_path / "new"
    new.mkdir()
    for name in ("meta.mha", "raster.nrrd"):  # stored (X, Y): two dimensions, three components
        write_itk_rgb(new / name, rgb, (0.5, 0.25), (10.0, -5.0), [[0.0, 1.0], [1.0, 0.0]])
        assert readers.volume_grid(new / name).shape == (32, 32)
    predict(run / "model", new, tmp_path / "out")
    for name in ("meta.mha", "raster.nrrd"):  # NDims = 2 / dimension: 2 (space dimension: 2), as ITK writes them
        mask = tmp_path / "out" / name
        assert_mask_on_its_grid(mask, new / name)
        np.testing.assert_array_equal(read_label(mask, "2d"), same, err_msg=name)
        np.testing.assert_allclose(readers.volume_grid(mask).spacing(2), (0.5, 0.25))


def untrained_bundle(folder: Path, tiny_config, kind: str) -> Path:
    """A ``global`` bundle of an untrained one-channel network (organ / lesion), written by the run's own
    ``write_bundle_files``, without a model card."""
    cfg = tiny_config(algorithms=["fedavg"], data={"image_size": 16})
    network = build_segmenter(cfg.model, 3 if kind == "3d" else 2, 1, len(DISJOINT), seed=0)
    write_bundle_files(folder, {"global": weights_of(network)}, cfg, Federation("ct", kind, 1, DISJOINT, []))
    return folder


def test_a_volumes_mask_is_a_file_of_its_format_on_its_grid(tmp_path, tiny_config):
    """A 3D MetaImage (``.mha``; a ``.mhd`` header with its ``.raw``) or NRRD, written by ITK on an oblique grid
    (anisotropic spacing, axes rotated and swapped, the slice axis towards the feet, an origin), and a NRRD that
    pynrrd states in RAS (ITK reads it as LPS): each mask is a ``.mha`` (one file) or ``.nrrd`` on its image's grid,
    holding the mask of the same voxels given as a NIfTI."""
    itk = pytest.importorskip("itk")
    nrrd = pytest.importorskip("nrrd")
    bundle = untrained_bundle(tmp_path / "model" / "fedavg", tiny_config, "3d")
    values = np.random.default_rng(0).integers(0, 1000, (12, 10, 8)).astype(np.uint16)
    spacing, origin = (0.7, 1.3, 2.5), (10.25, -5.5, 3.75)
    turn = np.array([[np.cos(0.3), -np.sin(0.3), 0.0], [np.sin(0.3), np.cos(0.3), 0.0], [0.0, 0.0, 1.0]])
    direction = turn @ np.array([[0.0, 1.0, 0.0], [1.0, 0.0, 0.0], [0.0, 0.0, -1.0]])  # LPS, one column per axis
    new = tmp_path / "new"
    new.mkdir()
    image = itk.image_from_array(np.ascontiguousarray(values.T))  # ITK's NumPy view is (k, j, i)
    image.SetSpacing(spacing)
    image.SetOrigin(origin)
    image.SetDirection(itk.matrix_from_array(direction.copy()))
    for name in ("image.mha", "header.mhd", "raster.nrrd"):
        itk.imwrite(image, str(new / name))
    ras = readers.volume_grid(new / "image.mha").affine  # the same grid stated in RAS
    header = {"space": "right-anterior-superior", "space directions": ras[:3, :3].T, "space origin": ras[:3, 3]}
    nrrd.write(str(new / "ras.nrrd"), values, header, index_order="F")
    (tmp_path / "nifti").mkdir()
    nib.save(nib.Nifti1Image(values, ras), tmp_path / "nifti" / "image.nii.gz")
    predict(bundle, tmp_path / "nifti", tmp_path / "from_nifti")
    reference = np.asarray(nib.load(tmp_path / "from_nifti" / "image.nii.gz").dataobj)
    assert reference.any()  # some region predicted: the comparison below compares masks, not empty files

    rows = predict(bundle, new, tmp_path / "out")
    masks = {r["file"]: r["mask"] for r in rows}
    assert masks == {
        "header.mhd": "header.mha",
        "image.mha": "image.mha",
        "raster.nrrd": "raster.nrrd",
        "ras.nrrd": "ras.nrrd",
    }
    assert not list((tmp_path / "out").glob("*.raw")) and not list((tmp_path / "out").glob("*.nii.gz"))
    for name, mask_name in masks.items():
        mask = tmp_path / "out" / mask_name
        assert_mask_on_its_grid(mask, new / name, exact=mask.suffix == ".mha")  # NRRD: oblique vectors, last bit
        np.testing.assert_allclose(readers.volume_grid(mask).affine, ras, atol=1e-12, err_msg=name)
        np.testing.assert_array_equal(readers.read_volume(mask), reference, err_msg=name)
        np.testing.assert_array_equal(read_label(mask, "3d"), reference, err_msg=name)
    assert header_fields(tmp_path / "out" / "ras.nrrd")["space"] == "left-posterior-superior"  # as ITK reads it


def test_region_masks_to_label_map():
    label = np.array([[0, 1], [2, 2]], np.uint8)
    np.testing.assert_array_equal(DISC_CUP.to_label(DISC_CUP.one_hot(label)), label)
    # (disc, cup) per pixel: none -> 0, disc -> 1, both -> 2, cup without disc -> 2 (closest value)
    masks = np.array([[[0, 1, 1, 0]], [[0, 0, 1, 1]]], bool)  # (R=2, 1, 4)
    np.testing.assert_array_equal(DISC_CUP.to_label(masks), [[0, 1, 2, 2]])
    brats = Regions.from_mapping({"wt": [1, 2, 4], "tc": [1, 4], "et": [4]})
    label = np.array([0, 1, 2, 4, 4, 1])
    out = brats.to_label(brats.one_hot(label))
    np.testing.assert_array_equal(out, label)
    assert out.dtype == np.uint8
    with pytest.raises(ValueError, match="expected 3 region masks"):
        brats.to_label(masks)


def test_bad_inputs_fail_naming_the_file_and_write_nothing(trained, tmp_path):
    run, root, _, prep = trained
    new = tmp_path / "new"
    copy_test_images(trained, new)
    out = tmp_path / "out"
    (new / "broken.png").write_bytes(b"\x89PNG\r\n\x1a\n this is not a png")
    with pytest.raises(PredictError, match="broken.png: cannot read"):
        predict(run / "model", new, out)
    (new / "broken.png").unlink()
    Image.fromarray(np.zeros((32, 32), np.uint8)).save(new / "gray.png")
    with pytest.raises(PredictError, match="gray.png: image has 1 channels but the model expects 3"):
        predict(run / "model", new, out)
    (new / "gray.png").unlink()
    np.save(new / "volume.npy", np.zeros((3, 8, 32, 32), np.uint8))
    with pytest.raises(PredictError, match="volume.npy: expected a channel-first array"):
        predict(run / "model", new, out)
    (new / "volume.npy").unlink()
    (new / "scan.xyz").write_text("hello")
    with pytest.raises(PredictError, match="scan.xyz: unsupported file type"):
        predict(run / "model", new, out)
    (new / "scan.xyz").unlink()
    (tmp_path / "empty").mkdir()
    with pytest.raises(PredictError, match="empty: no image files"):
        predict(run / "model", tmp_path / "empty", out)
    with pytest.raises(PredictError, match="no manifest.json"):
        predict(tmp_path / "empty", new, out)
    assert not out.exists()
    with pytest.raises(PredictError, match="is the input folder"):
        predict(run / "model", new, new)
    two = tmp_path / "two"
    shutil.copytree(run / "model", two)
    shutil.copytree(two / "fedsm", two / "fedsm-copy")
    with pytest.raises(PredictError, match="choose one with --algorithm"):
        predict(two, new, out)
    assert not out.exists()
    predict(run / "model", new, out)
    with pytest.raises(PredictError, match="--force"):
        predict(run / "model", new, out)
    predict(run / "model", new, out, force=True)


def test_a_folders_notes_are_left_out_in_one_line_not_refused(trained, tmp_path):
    """A README or case list beside the images refused the whole folder ("unsupported file type", a fresh-eyes run):
    a document is no image; it is left out and said."""
    run, _, _, _ = trained
    new = tmp_path / "new"
    cases = copy_test_images(trained, new)
    (new / "notes.txt").write_text("scanner B")
    (new / "cases.csv").write_text("case\n")
    result = runner.invoke(
        app, ["predict", "--model", str(run / "model"), "--input", str(new), "--out", str(tmp_path / "o")]
    )
    assert result.exit_code == 0, result.output
    said = " ".join(result.output.split())
    assert f"{new}: left out 2 file(s) that hold no image (cases.csv and notes.txt)" in said
    assert len(read_csv(tmp_path / "o" / "predictions.csv")) == len(cases)


def test_cli_predict(trained, tmp_path):
    run, _, _, _ = trained
    new = tmp_path / "new"
    cases = copy_test_images(trained, new)
    out = tmp_path / "out"
    result = runner.invoke(
        app, ["predict", "--model", str(run / "model"), "--input", str(new), "--out", str(out), "--gamma", "1"]
    )
    assert result.exit_code == 0, result.output
    assert {r["model"] for r in read_csv(out / "predictions.csv").values()} == {"global"}
    assert sorted(p.name for p in out.iterdir()) == sorted(
        [f"{c}.png" for c in cases] + ["predictions.csv", "predict.json"]
    )
    Image.fromarray(np.zeros((32, 32, 4), np.uint8)).save(new / "rgba.png")
    result = runner.invoke(
        app, ["predict", "--model", str(run / "model"), "--input", str(new), "--out", str(tmp_path / "o2")]
    )
    assert result.exit_code == 1
    output = " ".join(result.output.split())  # rich wraps long lines at spaces
    assert "rgba.png: image has 4 channels" in output
    assert not (tmp_path / "o2").exists()


@pytest.mark.parametrize("mode", ["argmax", "ensemble"])
def test_k_plus_one_class_bundles_route_by_argmax_or_ensemble(mode, tmp_path, tiny_config):
    """FedSM-extra / -ensemble bundles (built here from untrained models): K+1 selector classes,
    the column ``prob:global`` first, no --gamma."""
    cfg = tiny_config()
    sites = ["a", "b"]
    segmenter = build_segmenter(cfg.model, 2, 3, 2, seed=0)
    selector = build_selector(3, len(sites) + 1, width=0.0625, norm="instance")
    entries = bundle_entries(
        weights_of(segmenter),
        {s: weights_of(segmenter) for s in sites},
        weights_of(selector),
        math.nan,
        mode,
        selector,
        0.0625,
        "instance",
    )
    manifest = {
        "models": sorted(entries),
        "network": cfg.model.model_dump(mode="json"),
        "spatial_dims": 2,
        "in_channels": 3,
        "regions": DISC_CUP.as_dict(),
        "image_size": 32,
        "normalize": "minmax",
        "threshold": 0.5,
    }
    bundle = Bundle(tmp_path, manifest, entries)
    predictor = build_predictor(bundle)
    assert predictor.columns[-3:] == ["prob:global", "prob:personal:a", "prob:personal:b"]
    x = torch.rand(3, 3, 32, 32, generator=torch.Generator().manual_seed(0))
    for row, probs in zip(predictor.choices(x), torch.softmax(selector(x), dim=1).tolist()):
        expected = "ensemble" if mode == "ensemble" else predictor.candidates[int(np.argmax(probs))]
        assert row["model"] == expected
        np.testing.assert_allclose([row[c] for c in predictor.columns[-3:]], probs, atol=1e-6)
    with pytest.raises(PredictError, match=f"routes by {mode}"):
        build_predictor(bundle, gamma=0.5)
    # the candidates are the best phase-1 round's (the selected round is the selector's): that round, where the card
    # records it; none where it does not (a card of a selected round only, or no card)
    assert {row["round"] for row in predictor.choices(x)} == {""}
    for card, expected in (({"selected_round": 9, "phase1_best_round": 4}, 4), ({"selected_round": 9}, "")):
        rows = build_predictor(Bundle(tmp_path, {**manifest, "trained": card}, entries)).choices(x)
        assert {row["round"] for row in rows} == {expected}


def test_cli_predict_overlay_writes_a_picture_per_input(trained, tmp_path):
    run, _, _, _ = trained
    new = tmp_path / "new"
    cases = copy_test_images(trained, new)
    out = tmp_path / "out"
    args = ["predict", "--model", str(run / "model"), "--input", str(new), "--out", str(out), "--overlay"]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    assert f"{len(cases)} mask(s), {len(cases)} overlay(s), predictions.csv and predict.json written" in result.output
    assert sorted(p.name for p in out.iterdir()) == sorted(
        [f"{c}.png" for c in cases] + [f"{c}_overlay.png" for c in cases] + ["predictions.csv", "predict.json"]
    )
    for case in cases:
        with Image.open(new / f"{case}.png") as source, Image.open(out / f"{case}_overlay.png") as picture:
            assert picture.mode == "RGB" and picture.size == source.size
    assert runner.invoke(app, args).exit_code == 1  # existing overlays need --force


def test_overlay_image_fills_and_outlines_regions():
    from fedseg.predict_outputs import overlay_image

    image = np.zeros((1, 6, 6), np.float32)
    mask = np.zeros((1, 6, 6), bool)
    mask[0, 1:5, 1:5] = True
    picture = overlay_image(image, mask)
    assert picture.shape == (6, 6, 3) and picture.dtype == np.uint8
    assert tuple(picture[1, 1]) == (0xE6, 0x9F, 0x00)  # outline: opaque
    assert 0 < picture[2, 2, 0] < 0xE6  # inside: semi-transparent fill
    assert tuple(picture[0, 0]) == (0, 0, 0)
    volume = overlay_image(np.random.default_rng(0).random((1, 5, 7, 9)), np.zeros((2, 5, 7, 9), bool))
    assert volume.shape == (5, 7, 3)


def test_out_inside_a_dicom_series_input_is_refused(tmp_path):
    """--out inside (or equal to) a series folder given as input: the masks would join its slices."""
    from fedseg.predict_inputs import Input
    from fedseg.predict_model import PredictError
    from fedseg.predict_outputs import check_out

    series = tmp_path / "series"
    series.mkdir()
    item = Input(series, "series", "series.nii.gz", torch.zeros(1, 4, 4), (4, 4), None)
    for out in (series, series / "masks"):
        with pytest.raises(PredictError, match="inside the DICOM series folder"):
            check_out(out, [item], force=False)
    check_out(tmp_path / "elsewhere", [item], force=False)  # anywhere else is fine


# --- bad inputs and outputs: one line each, nothing half-written ---------------------------------------------------
def test_images_with_nan_or_inf_are_refused_naming_the_file_and_the_count(trained, tmp_path):
    """As training and ``fedseg data check`` refuse them: normalization would turn such an image into another one and
    the mask would be silently wrong. An nnU-Net case names the channel file that holds them."""
    run = trained[0]
    new = tmp_path / "new"
    copy_test_images(trained, new)
    image = np.random.default_rng(0).random((3, 32, 32)).astype(np.float32)
    image[:, :5, :5] = np.nan
    np.save(new / "corner.npy", image)
    nib.save(nib.Nifti1Image(np.full((32, 32, 3), np.nan, np.float32), np.eye(4)), new / "blank.nii.gz")
    channels = np.random.default_rng(1).random((3, 32, 32)).astype(np.float32)
    channels[1, 0, :2] = [np.inf, np.nan]
    for c in range(3):
        np.save(new / f"case_{c:04d}.npy", channels[c])
    out = tmp_path / "out"
    with pytest.raises(PredictError) as e:
        predict(run / "model", new, out)
    assert str(e.value).splitlines() == [
        f"{new / 'blank.nii.gz'}: image has 3072 NaN and 0 Inf values (of 3072); replace them",
        f"{new / 'case_0001.npy'}: image has 1 NaN and 1 Inf values (of 1024); replace them",
        f"{new / 'corner.npy'}: image has 75 NaN and 0 Inf values (of 3072); replace them",
    ]
    assert not out.exists()
    (new / "blank.nii.gz").unlink()
    for c in range(3):
        (new / f"case_{c:04d}.npy").unlink()
    result = runner.invoke(app, ["predict", "--model", str(run / "model"), "--input", str(new), "--out", str(out)])
    assert result.exit_code == 1 and "Traceback" not in result.output
    assert " ".join(result.output.split()) == f"error: {new / 'corner.npy'}: image has 75 NaN and 0 Inf values " + (
        "(of 3072); replace them"
    )
    assert not out.exists()


def fake_series(folder, slices=4):
    """A folder of files that read as DICOM slices by name and preamble (``dicom_series.series_folder_problem``)."""
    folder.mkdir(parents=True)
    for k in range(slices):
        (folder / f"slice{k:02d}.dcm").write_bytes(bytes(128) + b"DICM" + bytes(16))
    return folder


def test_inputs_that_cannot_be_read_are_reported_not_skipped_and_grouped(tmp_path):
    from fedseg.predict_inputs import list_inputs

    pngs = tmp_path / "pngs"
    pngs.mkdir()
    for name in ("a.png", "b.png"):
        (pngs / name).write_bytes(b"")
    (pngs / "gone.png").symlink_to(tmp_path / "nowhere.png")
    (pngs / "notes").mkdir()  # a folder without DICOM files is no input: ignored, as before
    (pngs / "notes" / "todo.txt").write_text("later")
    with pytest.raises(PredictError) as e:
        list_inputs(pngs)
    assert str(e.value) == f"{pngs / 'gone.png'}: neither a file nor a folder (a broken symbolic link or a link loop)"
    (pngs / "gone.png").unlink()
    assert list_inputs(pngs) == [pngs / "a.png", pngs / "b.png"]

    series = tmp_path / "series"
    fake_series(series / "ok")
    (fake_series(series / "readme") / "README.txt").write_text("scanner notes")
    (fake_series(series / "nested") / "extra").mkdir()
    with pytest.raises(PredictError) as e:
        list_inputs(series)
    lines = str(e.value).splitlines()
    assert len(lines) == 2, lines
    assert lines[0].startswith(f"{series / 'nested'}: holds 'extra', which is not a file; ")
    assert lines[1].startswith(f"{series / 'readme' / 'README.txt'}: not a DICOM file (no DICM preamble); ")
    assert "images/" not in str(e.value)  # the reader's text, without the federation's wording
    # a series folder given itself: why it is no series, one line (not one "unsupported file type" per slice)
    for folder, line in (("readme", lines[1]), ("nested", lines[0])):
        with pytest.raises(PredictError) as e:
            list_inputs(series / folder)
        assert str(e.value) == line
    assert list_inputs(series / "ok") == [series / "ok"]

    tifs = tmp_path / "tifs"
    tifs.mkdir()
    for i in range(50):
        (tifs / f"scan{i:02d}.tif").write_bytes(b"II*\x00")
    with pytest.raises(PredictError) as e:
        list_inputs(tifs)
    lines = str(e.value).splitlines()
    assert len(lines) == 4 and lines[-1] == "... and 47 more like this", lines
    assert lines[0].startswith(f"{tifs / 'scan00.tif'}: unsupported file type")


def test_an_out_that_cannot_be_written_is_one_error_line(trained, tmp_path):
    run = trained[0]
    new = tmp_path / "new"
    copy_test_images(trained, new)
    if not Path("/proc/self").is_dir():
        pytest.skip("needs /proc, where no folder can be made")
    args = ["predict", "--model", str(run / "model"), "--input", str(new), "--out", "/proc/fedseg-no-such"]
    result = runner.invoke(app, args)
    assert result.exit_code == 1
    assert result.output.strip() == "error: /proc/fedseg-no-such: No such file or directory"


def test_a_folder_where_a_mask_goes_is_refused_before_anything_is_written(trained, tmp_path):
    run = trained[0]
    new = tmp_path / "new"
    cases = copy_test_images(trained, new)
    out = tmp_path / "out"
    taken = out / sorted(f"{c}.png" for c in cases)[1]
    taken.mkdir(parents=True)
    for force in ([], ["--force"]):
        args = ["predict", "--model", str(run / "model"), "--input", str(new), "--out", str(out), *force]
        result = runner.invoke(app, args)
        assert result.exit_code == 1 and "Traceback" not in result.output, result.output
        output = " ".join(result.output.split())
        assert output.startswith(f"error: {taken}: is a folder, not a file") and output.count("error:") == 1, output
        assert [p.name for p in out.iterdir()] == [taken.name]


def test_a_failure_while_moving_the_masks_in_puts_the_previous_ones_back(trained, tmp_path, monkeypatch):
    """--force replaces the masks of an earlier predict all together or not at all."""
    run = trained[0]
    new = tmp_path / "new"
    copy_test_images(trained, new)
    out = tmp_path / "out"
    predict(run / "model", new, out)
    for path in out.iterdir():
        path.write_bytes(f"earlier {path.name}".encode())
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    rename, moved = Path.rename, []

    def full_disk_on_the_third(self, target):
        if self.parent.name.startswith(".predict-") and Path(target).parent == out:
            moved.append(self.name)
            if len(moved) == 3:
                raise OSError(28, "No space left on device", str(target))
        return rename(self, target)

    monkeypatch.setattr(Path, "rename", full_disk_on_the_third)
    with pytest.raises(OSError, match="No space left"):
        predict(run / "model", new, out, force=True)
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before  # no hidden folder left either


@pytest.mark.skipif(not Path("/proc/self").is_dir(), reason="POSIX signals (Linux)")
@pytest.mark.parametrize("stop", ["SIGTERM", "SIGHUP"])
def test_kill_or_a_closed_terminal_stops_predict_like_ctrl_c(trained, tmp_path, stop):
    """A real ``fedseg predict`` process, stopped by a real signal while it writes its masks: the staging folder is
    removed, ``out`` (which it created) with it, and it says how to resume, as Ctrl-C does."""
    import signal
    import subprocess
    import sys
    import time

    run, root, _, prep = trained
    new = tmp_path / "new"
    new.mkdir()
    image = root / prep.site_data[0].name / "images" / f"{prep.site_data[0].test.ids[0]}.png"
    for i in range(1500):
        (new / f"img{i:04d}.png").symlink_to(image)
    out = tmp_path / "out"
    command = [sys.executable, "-m", "fedseg.cli", "predict", "--model", str(run / "model"), "--input", str(new)]
    proc = subprocess.Popen([*command, "--out", str(out)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 240
        while not any(out.glob(".predict-*/*")) and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.02)
        assert proc.poll() is None, "predict ended before it was stopped"
        proc.send_signal(getattr(signal, stop))
        output, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 130, output
    assert " ".join(output.split()) == f"error: interrupted: no mask was written to {out}; run the same command again"
    assert not out.exists()


def test_an_out_that_is_or_lies_inside_the_input_folder_is_refused(trained, tmp_path):
    """The masks and predictions.csv would join the images (a site's images/, an imagesTs/): the next predict or
    data check would read them. A folder that holds the input folder is fine: the masks lie beside it."""
    run = trained[0]
    new = tmp_path / "fed" / "site1" / "images"
    copy_test_images(trained, new)
    for out, relation in ((new, "is"), (new / "masks", "is inside")):
        with pytest.raises(PredictError) as e:
            predict(run / "model", new, out)
        assert str(e.value).startswith(f"--out {out}: {relation} the input folder {new}; "), str(e.value)
        assert len(str(e.value).splitlines()) == 1
    assert [p.name for p in new.parent.iterdir()] == ["images"] and not (new / "masks").exists()
    predict(run / "model", new, new.parent)  # beside the images
    masks = list(new.parent.glob("*.png"))
    assert (new.parent / "predictions.csv").is_file() and len(masks) == len(list(new.iterdir()))
    one = next(new.iterdir())
    shutil.copy(one, new / "photo.jpg")
    with pytest.raises(PredictError, match="is the input folder"):  # a file given: its PNG mask would join them
        predict(run / "model", new / "photo.jpg", new)
    predict(run / "model", new / "photo.jpg", tmp_path / "masks")


def test_a_numbered_file_given_alone_gets_the_mask_name_it_gets_in_its_folder(trained, tmp_path):
    """``site1_0000.png`` beside ``site1_0001.png`` (images of a numbered series, each holding the model's three
    channels) keeps its name, given alone or with its folder; a lone ``_0000`` file is named after its case both
    ways, as nnU-Net names it."""
    run, root, _, prep = trained
    image = root / prep.site_data[0].name / "images" / f"{prep.site_data[0].test.ids[0]}.png"
    frames, lone = tmp_path / "frames", tmp_path / "lone"
    frames.mkdir()
    lone.mkdir()
    for i in range(2):
        shutil.copy(image, frames / f"site1_{i:04d}.png")
    shutil.copy(image, lone / "site2_0000.png")
    written = {}
    for given in (frames, frames / "site1_0000.png", lone, lone / "site2_0000.png"):
        out = tmp_path / "out" / given.name
        written[given.name] = sorted(r["mask"] for r in predict(run / "model", given, out))
        assert sorted(p.name for p in out.iterdir()) == sorted(
            [*written[given.name], "predictions.csv", "predict.json"]
        )
    assert written["frames"] == ["site1_0000.png", "site1_0001.png"]
    assert written["site1_0000.png"] == ["site1_0000.png"]
    assert written["lone"] == written["site2_0000.png"] == ["site2.png"]


def test_a_study_folder_as_model_lists_its_sub_runs_models(trained, tmp_path):
    run = trained[0]
    new = tmp_path / "new"
    copy_test_images(trained, new)
    study = tmp_path / "study"
    study.mkdir()
    (study / "study.json").write_text("{}")
    with pytest.raises(PredictError, match="is a study, not a run; none of its sub-runs has a model yet"):
        predict(study, new, tmp_path / "out")
    for site in ("site1", "site2"):
        (study / "holdout" / site).mkdir(parents=True)
        (study / "holdout" / site / "model").symlink_to(run / "model", target_is_directory=True)
    with pytest.raises(PredictError) as e:
        predict(study, new, tmp_path / "out")
    assert str(e.value) == (
        f"{study}: is a study, not a run; choose the model of one of its sub-runs: holdout/site1/model "
        f"and holdout/site2/model (e.g. --model {study / 'holdout' / 'site1' / 'model'})"
    )
    assert not (tmp_path / "out").exists()
    predict(study / "holdout" / "site1" / "model", new, tmp_path / "out")
    bench = tmp_path / "bench"  # a bench's runs lie 6 folders down: it said "no manifest.json" (a fresh-eyes run)
    deep = bench / "runs" / "fed" / "fold0" / "seed0" / "fedsm" / "default"
    deep.mkdir(parents=True)
    (bench / "bench.json").write_text("{}")
    (deep / "model").symlink_to(run / "model", target_is_directory=True)
    with pytest.raises(
        PredictError, match=r"is a bench, not a run; choose the model of one of its sub-runs: runs/fed/"
    ):
        predict(bench, new, tmp_path / "out2")


def test_a_manifest_without_channel_names_still_loads_and_predicts_and_a_malformed_one_is_refused(
    tmp_path, tiny_config, disc_federation
):
    """Bundles written before ``channel_names`` existed have no such key: they load, with the channels unknown, and
    predict as before (no channel line). A manifest whose ``channel_names`` does not fit ``in_channels`` is refused
    naming the file and the key."""
    import json

    from fedseg.run.outputs import write_bundle_files

    cfg, fed = tiny_config(algorithms=["fedavg"]), disc_federation(n_sites=1, cases_per_site=1)
    folder = tmp_path / "model" / "fedavg"
    network = build_segmenter(cfg.model, 2, fed.channels, len(fed.regions), seed=0)
    write_bundle_files(folder, {"global": weights_of(network)}, cfg, fed)
    manifest = json.loads((folder / "manifest.json").read_text())
    assert manifest["channel_names"] is None  # the federation names no channels
    del manifest["channel_names"]  # as every bundle written before the field
    (folder / "manifest.json").write_text(json.dumps(manifest))
    assert load_bundle(folder).channel_names is None
    scans = tmp_path / "scans"
    scans.mkdir()
    Image.fromarray(np.full((32, 32, 3), 90, np.uint8)).save(scans / "a.png")
    notes: list[str] = []
    assert [r["mask"] for r in predict(folder, scans, tmp_path / "out", notes=notes)] == ["a.png"]
    assert notes == []
    (folder / "manifest.json").write_text(json.dumps({**manifest, "channel_names": ["R", "G"]}))
    with pytest.raises(PredictError) as e:
        load_bundle(folder)
    assert str(e.value) == (
        f"{folder / 'manifest.json'}: channel_names is ['R', 'G']; expected null or a list of 3 channel names "
        "(in_channels)"
    )


def test_a_bundle_carries_its_model_card_and_predict_records_which_model_made_the_masks(trained, tmp_path):
    """A bundle that has left its run folder still says what it is (manifest ``trained``: the method, federation,
    sites, round selected on validation, test Dice, config digest, software); predict prints that in one line and
    writes predict.json: the weights' SHA-256 and card, the options, how many inputs. A bundle written before cards
    predicts as before, its record's card null."""
    import hashlib

    run = trained[0]
    bundle = run / "model" / "fedsm"
    card = json.loads((bundle / "manifest.json").read_text())["trained"]
    summary = json.loads((run / "summary.json").read_text())
    fedsm = summary["algorithms"]["fedsm"]
    assert (card["algorithm"], card["method"], card["federation"]) == (
        "fedsm",
        fedsm["display_name"],
        summary["dataset"],
    )
    assert card["sites"] == summary["sites"] and card["train_cases"] == fedsm["train_samples"]
    assert (card["selected_round"], card["rounds_trained"]) == (fedsm["best_round"], fedsm["rounds"])
    assert card["test_dice"] == fedsm["dice"] and card["fedseg"] == fedseg.__version__
    assert card["config_sha256"] == hashlib.sha256((run / "config.yaml").read_bytes()).hexdigest()
    conv = fedsm["convergence"]  # the rule of every page: a late selected round and no plateau
    assert card["may_not_have_converged"] is (conv["late_best"] and not conv["plateaued"])

    new = tmp_path / "new"
    cases = copy_test_images(trained, new)
    out = tmp_path / "out"
    said = runner.invoke(app, ["predict", "--model", str(bundle), "--input", str(new), "--out", str(out)])
    assert said.exit_code == 0, said.output
    line = " ".join(said.output.split())
    assert f"model: {fedsm['display_name']} trained on {summary['dataset']} (3 sites), round 1 of 1" in line
    record = json.loads((out / "predict.json").read_text())
    assert record["weights_sha256"] == hashlib.sha256((bundle / "weights.safetensors").read_bytes()).hexdigest()
    assert record["trained"] == card and record["inputs"] == len(cases) and record["model"] == str(bundle.resolve())
    assert (record["algorithm"], record["gamma"], record["site"]) == ("fedsm", None, None)

    old = tmp_path / "old-bundle"  # as written before model cards
    shutil.copytree(bundle, old)
    manifest = json.loads((old / "manifest.json").read_text())
    del manifest["trained"]
    (old / "manifest.json").write_text(json.dumps(manifest))
    said = runner.invoke(app, ["predict", "--model", str(old), "--input", str(new), "--out", str(tmp_path / "o")])
    assert said.exit_code == 0 and "model:" not in said.output, said.output
    assert json.loads((tmp_path / "o" / "predict.json").read_text())["trained"] is None


def test_predictions_csv_tells_the_round_of_the_model_that_made_each_mask(trained, tmp_path):
    """``predictions.csv``'s ``round``: the round at which the model that made the row's mask was selected on
    validation, as the bundle's model card says it. A global model's and FedSM's (whichever candidate an image is
    routed to: the run restores the selected round's whole super model) the card's ``selected_round``; a site's own
    model (``--site``) its site's (``selected_rounds``); empty where the card does not say (a bundle written before
    cards, a site's model whose round it does not record)."""
    run, _, cfg, prep = trained
    summary = json.loads((run / "summary.json").read_text())["algorithms"]
    new = tmp_path / "new"
    copy_test_images(trained, new)
    for algorithm in ("fedavg", "fedsm"):
        rows = predict(run / "model", new, tmp_path / algorithm, algorithm=algorithm)
        assert {r["round"] for r in rows} == {summary[algorithm]["best_round"]}, algorithm
        assert {r["round"] for r in read_csv(tmp_path / algorithm / CSV_NAME).values()} == {"1"}, algorithm
    header = (tmp_path / "fedsm" / CSV_NAME).read_text().splitlines()[0]
    assert header == "file,mask,model,round,confidence," + ",".join(
        f"prob:personal:{s}" for s in prep.federation.site_names
    )
    assert (tmp_path / "fedavg" / CSV_NAME).read_text().startswith("file,mask,model,round,confidence\n")

    def edited(name: str, card) -> Path:  # a copy of a bundle whose card says ``card`` (None: no card)
        folder = tmp_path / name / "fedsm"
        shutil.copytree(run / "model" / "fedsm", folder)
        manifest = json.loads((folder / "manifest.json").read_text())
        manifest.pop("trained")
        (folder / "manifest.json").write_text(json.dumps({**manifest, **({"trained": card} if card else {})}))
        return folder

    card = json.loads((run / "model" / "fedsm" / "manifest.json").read_text())["trained"]
    later = edited("later", {**card, "selected_round": 4})
    for gamma in (0.0, 1.0):  # every image to a site's personalized model, then to the global one
        rows = predict(later, new, tmp_path / f"later-{gamma}", gamma=gamma)
        assert {r["model"].split(":")[0] for r in rows} == {"personal" if gamma == 0 else "global"}
        assert {r["round"] for r in rows} == {4}
    rows = predict(edited("old", None), new, tmp_path / "old-out")  # a bundle written before model cards
    assert {r["round"] for r in rows} == {""}
    assert {r["round"] for r in read_csv(tmp_path / "old-out" / CSV_NAME).values()} == {""}

    # a per-site bundle (FedBN, Ditto, Local): one model per site, the card naming site1's round only
    weights = load_bundle(run / "model" / "fedavg").models["global"]
    models = {name: {k: v.clone() for k, v in weights.items()} for name in ("global", "local:site1", "local:site2")}
    persite = tmp_path / "persite" / "ditto"
    write_bundle_files(
        persite, models, cfg, prep.federation, {**card, "selected_round": 7, "selected_rounds": {"site1": 3}}
    )
    for site, expected in ((None, 7), ("site1", 3), ("site2", "")):
        rows = predict(persite, new, tmp_path / f"persite-{site}", site=site)
        assert {(r["model"], r["round"]) for r in rows} == {(f"local:{site}" if site else "global", expected)}


def test_a_card_records_the_phase1_round_whose_networks_fedsm_extra_routes_among(tiny_config, discs):
    """FedSM-extra/-ensemble freeze their candidates at the best phase-1 round (``summary.json``
    ``phase1_best_round``) and select a selector round on validation: the card records both."""
    card = model_card("fedsm-extra", discs, tiny_config(), {"best_round": 9, "rounds": 10, "phase1_best_round": 4})
    assert (card["selected_round"], card["phase1_best_round"]) == (9, 4)
    assert "phase1_best_round" not in model_card("fedsm", discs, tiny_config(), {"best_round": 9, "rounds": 10})


def test_tta_routes_each_image_as_given_and_mirrors_the_chosen_network(trained, tmp_path):
    """``--tta`` on a FedSM bundle: the selector decides on the image as given (the same choices and selector
    scores as without it), and each mask is the chosen candidate's logits averaged over the 4 flips, thresholded."""
    run, _, _, prep = trained
    copy_test_images(trained, tmp_path / "new")
    predict(run / "model", tmp_path / "new", tmp_path / "plain")
    predict(run / "model", tmp_path / "new", tmp_path / "tta", tta=True)
    mirrored = read_csv(tmp_path / "tta" / "predictions.csv")
    assert mirrored == read_csv(tmp_path / "plain" / "predictions.csv")  # models chosen, confidences, scores
    bundle = load_bundle(run / "model" / "fedsm").models
    sm, names = super_model_from_bundle(bundle, prep.task.new_model, 3, 2), candidate_names(bundle)
    regions, threshold = prep.federation.regions, prep.task.cfg.eval.threshold
    differs = False
    for data in prep.site_data:
        for i, case in enumerate(data.test.ids):
            chosen = sm.candidates[names.index(mirrored[f"{case}.png"]["model"])].eval()
            x = data.test.x[i : i + 1]
            with torch.no_grad():
                logits = torch.stack([chosen(x)] + [chosen(x.flip(a)).flip(a) for a in [(2,), (3,), (2, 3)]]).mean(0)
            expected = regions.to_label((torch.sigmoid(logits[0]) > threshold).numpy())
            np.testing.assert_array_equal(read_label(tmp_path / "tta" / f"{case}.png", "2d"), expected, err_msg=case)
            differs |= bool((expected != read_label(tmp_path / "plain" / f"{case}.png", "2d")).any())
    assert differs  # mirroring changed some mask: the test compares more than the plain prediction
    assert json.loads((tmp_path / "tta" / "predict.json").read_text())["tta"] is True


def test_a_sites_model_is_described_by_its_own_round_and_test_dice():
    """``--site`` picks one site's model of a per-site bundle (FedBN, FedPer, Local): the line named the round of the
    mean validation curve and the client average, which no site-2 model came from (a fresh-eyes FedBN study)."""
    from fedseg.run.model_card import card_line

    card = {
        "method": "FedBN",
        "federation": "retina",
        "sites": ["site1", "site2"],
        "rounds_trained": 10,
        "selected_round": 9,
        "selected_rounds": {"site1": 9, "site2": 6},
        "test_dice": {"site1": 0.83, "site2": 0.662, "client_avg": 0.745},
        "fedseg": "0.1.0",
        "finished": "2026-11-30",
    }
    assert "round 9 of 10, test Dice 0.745 (client avg)" in card_line(card)  # a card without selected_val_dice
    card["selected_val_dice"] = 0.7712
    assert card_line(card, "site2").startswith(
        "model: FedBN (site2's model) trained on retina (2 sites), round 6 of 10, test Dice 0.662 on site2's test cases"
    )
    assert "round 9 of 10 (validation Dice 0.771), test Dice 0.745 (client avg)" in card_line(card)
    assert card_line({**card, "selected_rounds": None}, "site2") == card_line({**card, "selected_rounds": None})


def test_force_replaces_the_earlier_predict_as_a_whole_leaving_no_mask_the_records_do_not_describe(trained, tmp_path):
    """A fresh-eyes run: FedSM masks of four photos with overlays, then ``--algorithm fedavg --force`` on one of them
    into the same folder left the three other FedSM masks and the FedSM overlay of the re-predicted photo beside the
    FedAvg mask, while predictions.csv and predict.json named only that one FedAvg mask: nothing said which model
    made the others, and the overlay showed another mask than the one beside it. --force replaces the earlier
    prediction as a whole (files that are not its outputs stay); without --force it is still refused."""
    run = trained[0]
    new = tmp_path / "new"
    cases = sorted(copy_test_images(trained, new))
    out = tmp_path / "out"
    predict(run / "model", new, out, overlay=True)
    (out / "my-notes.txt").write_text("reviewed by Dr. X")  # not an output of predict: kept
    one = new / f"{cases[0]}.png"
    with pytest.raises(PredictError, match="--force"):
        predict(run / "model", one, out, algorithm="fedavg")
    notes: list[str] = []
    predict(run / "model", one, out, algorithm="fedavg", force=True, notes=notes)
    assert sorted(p.name for p in out.iterdir()) == sorted([f"{cases[0]}.png", "my-notes.txt", *RECORDS])
    assert list(read_csv(out / "predictions.csv")) == [f"{cases[0]}.png"]
    assert json.loads((out / "predict.json").read_text())["algorithm"] == "fedavg"
    assert any(n.startswith(f"--force: removed {2 * len(cases) - 1} file(s) of the earlier predict") for n in notes)


RECORDS = ("predictions.csv", "predict.json")


def test_predict_json_records_the_gamma_that_routed_the_images(trained, tmp_path):
    """predict.json said ``"gamma": null`` for a FedSM bundle predicting with its stored γ (the option, not given):
    which threshold chose between the global and the personalized models was nowhere in the record of the masks.
    ``gamma_used`` is the γ that routed them: the bundle's, or ``--gamma``; null for a model without a selector."""
    run = trained[0]
    new = tmp_path / "new"
    copy_test_images(trained, new)
    stored = float(load_bundle(run / "model" / "fedsm").models["gamma"]["value"])
    for options, used in (({}, stored), ({"gamma": 0.25}, 0.25), ({"algorithm": "fedavg"}, None)):
        out = tmp_path / f"out-{len(options)}-{options.get('algorithm', options.get('gamma'))}"
        predict(run / "model", new, out, **options)
        record = json.loads((out / "predict.json").read_text())
        assert record["gamma_used"] == used and record["gamma"] == options.get("gamma"), record


def test_a_phone_photo_turned_by_exif_gets_a_mask_and_overlay_turned_as_the_photo_is_shown(trained, tmp_path):
    """A phone JPEG stores its pixels landscape and asks viewers (EXIF orientation 6) to show it portrait: fedseg
    segments the stored pixels (as training read them), and the mask PNG had no EXIF, so a viewer showed the
    photograph portrait and its mask landscape, a quarter turn apart. The mask and overlay carry the photo's EXIF
    orientation: stored on the same pixel grid, shown turned alike; a photo without one gets plain PNGs."""
    from PIL import ImageOps

    new = tmp_path / "new"
    cases = sorted(copy_test_images(trained, new))
    photo = tmp_path / "photos" / "phone.jpg"
    photo.parent.mkdir()
    exif = Image.Exif()
    exif[0x0112] = 6  # rotate 90° clockwise to show
    wide = Image.open(new / f"{cases[0]}.png").convert("RGB").resize((40, 24))
    wide.save(photo, exif=exif.tobytes())
    shutil.copy(new / f"{cases[1]}.png", photo.parent / "plain.png")
    out = tmp_path / "out"
    predict(trained[0] / "model", photo.parent, out, overlay=True)
    for name in ("phone.png", "phone_overlay.png"):
        with Image.open(out / name) as mask:
            assert mask.size == (40, 24) and mask.getexif().get(0x0112) == 6, name
            assert ImageOps.exif_transpose(mask).size == ImageOps.exif_transpose(Image.open(photo)).size == (24, 40)
    for name in ("plain.png", "plain_overlay.png"):
        with Image.open(out / name) as mask:
            assert 0x0112 not in mask.getexif(), name


def test_a_channels_last_npy_is_told_to_be_saved_channels_first(trained, tmp_path):
    """An RGB picture's array saved as it is, ``(H, W, 3)`` (a fresh-eyes run): "image has 300 channels but the
    model expects 3" alone; the line says a .npy image is channels first and how to save it so."""
    new = tmp_path / "new"
    cases = sorted(copy_test_images(trained, new))
    picture = np.asarray(Image.open(new / f"{cases[0]}.png").convert("RGB"))  # (H, W, 3)
    wrong = tmp_path / "npy" / "hwc.npy"
    wrong.parent.mkdir()
    np.save(wrong, picture)
    with pytest.raises(PredictError) as refused:
        predict(trained[0] / "model", wrong, tmp_path / "out")
    said = str(refused.value)
    assert said.startswith(f"{wrong}: image has {picture.shape[0]} channels but the model expects 3"), said
    assert "\n" not in said
    assert "channels first" in said and "np.moveaxis(a, -1, 0)" in said
    np.save(wrong, np.moveaxis(picture, -1, 0))  # as it says
    predict(trained[0] / "model", wrong, tmp_path / "out")
    assert np.load(tmp_path / "out" / "hwc.npy").shape == picture.shape[:2]


def test_a_folder_s_entries_and_its_unreadable_images_are_reported_in_one_error(trained, tmp_path):
    """A folder with a stray .bmp and a broken link beside a greyscale PNG and a truncated one (a fresh-eyes run):
    the first predict named only the .bmp and the link; once they were moved out, the next named the two PNGs. Every
    bad entry is named in the one error, each in one line, and nothing is written."""
    new = tmp_path / "new"
    cases = sorted(copy_test_images(trained, new))
    (new / "scan.bmp").write_bytes(b"BM junk")
    (new / "link.png").symlink_to(tmp_path / "gone.png")
    Image.open(new / f"{cases[0]}.png").convert("L").save(new / "grey.png")
    (new / "cut.png").write_bytes((new / f"{cases[1]}.png").read_bytes()[:200])
    args = ["predict", "--model", str(trained[0] / "model"), "--input", str(new), "--out", str(tmp_path / "out")]
    result = runner.invoke(app, args)
    assert result.exit_code == 1 and "Traceback" not in result.output, result.output
    lines = result.output.replace("error: ", "").splitlines()
    for name in ("scan.bmp", "link.png", "grey.png", "cut.png"):
        assert sum(line.startswith(str(new / name)) for line in lines) == 1, (name, result.output)
    assert not (tmp_path / "out").exists()


def test_an_out_in_the_model_folder_is_refused_even_with_force(trained, tmp_path):
    """``--out`` naming the model folder (``--out RUN/model/fedsm``, a fresh-eyes run) wrote the masks, predictions.csv
    and predict.json into the trained bundle, which is copied, shipped and audited as it is. Refused, with --force too,
    in one line; beside the run (``RUN/masks``) is fine."""
    run = tmp_path / "run"
    shutil.copytree(trained[0] / "model", run / "model")
    new = tmp_path / "new"
    copy_test_images(trained, new)
    before = sorted(p.relative_to(run) for p in run.rglob("*"))
    for out in (run / "model" / "fedsm", run / "model" / "fedsm" / "masks", run / "model"):
        args = ["predict", "--model", str(run / "model"), "--input", str(new), "--out", str(out), "--force"]
        result = runner.invoke(app, args)
        assert result.exit_code == 1 and "Traceback" not in result.output, result.output
        said = " ".join(result.output.split())
        assert said.startswith(f"error: --out {out}: ") and "the masks would join the trained model" in said, said
    assert sorted(p.relative_to(run) for p in run.rglob("*")) == before
    predict(run / "model", new, run / "masks")
    assert (run / "masks" / "predictions.csv").is_file()


def test_an_empty_file_is_named_as_empty_not_as_an_unidentified_image(trained, tmp_path):
    """A 0-byte ``.jpg`` and ``.nii.gz`` (a copy or download that stopped at once) read "cannot read
    (UnidentifiedImageError: cannot identify image file ...)" and a gzip error: the line says the file is empty."""
    new = tmp_path / "new"
    copy_test_images(trained, new)
    for name in ("empty.jpg", "empty2.png"):
        (new / name).write_bytes(b"")
    with pytest.raises(PredictError) as refused:
        predict(trained[0] / "model", new, tmp_path / "out")
    lines = str(refused.value).splitlines()
    assert lines == [
        f"{new / n}: empty file (0 bytes; an interrupted copy or download?): copy it again"
        for n in ("empty.jpg", "empty2.png")
    ]
    assert not (tmp_path / "out").exists()


def test_a_trained_fedsm_extra_or_ensemble_bundle_predicts_with_its_phase1_round(
    tmp_path, tiny_config, disc_federation
):
    """FedSM-extra/-ensemble keep no threshold: their bundle's gamma is NaN on purpose, which predict's check of
    damaged weights refused ("tensor 'gamma/value' holds NaN or Inf"), so no such bundle could segment anything (a
    reviewer's run of the real methods; the tests before built their bundles by hand)."""
    root = write_folder(disc_federation(n_sites=2, cases_per_site=6), tmp_path / "fed")
    cfg = tiny_config(
        algorithms=["fedsm-extra", "fedsm-ensemble"],
        fl={"rounds": 2},
        eval={"hd95": False},
        methods={m: {"selector_width": 0.0625} for m in ("fedsm-extra", "fedsm-ensemble")},
    )
    (tmp_path / "cfg.yaml").write_text(dump_config(cfg))
    run = tmp_path / "run"
    result = runner.invoke(app, ["run", "--config", str(tmp_path / "cfg.yaml"), "--data", str(root), "--out", str(run)])
    assert result.exit_code == 0, result.output
    image = next((root / "site1" / "images").iterdir())
    (tmp_path / "new").mkdir()
    shutil.copy(image, tmp_path / "new")
    for algorithm in ("fedsm-extra", "fedsm-ensemble"):
        out = tmp_path / f"pred-{algorithm}"
        said = runner.invoke(
            app,
            ["predict", "--model", str(run / "model" / algorithm), "--input", str(tmp_path / "new"), "--out", str(out)],
        )
        assert said.exit_code == 0, said.output
        card = json.loads((run / "model" / algorithm / "manifest.json").read_text())["trained"]
        (row,) = read_csv(out / CSV_NAME).values()
        assert row["round"] == str(card["phase1_best_round"]), (algorithm, row, card)


def test_a_fedsm_bundle_whose_gamma_was_damaged_is_refused_unless_gamma_is_given(trained, tmp_path):
    """NaN is allowed in a bundle's gamma since FedSM-extra/-ensemble store it so; a threshold bundle (FedSM) with a
    NaN gamma then sent every image to the global model without a word (a reviewer)."""
    from safetensors.torch import load_file, save_file

    run = trained[0]
    bundle = tmp_path / "fedsm"
    shutil.copytree(run / "model" / "fedsm", bundle)
    tensors = load_file(bundle / "weights.safetensors")
    tensors["gamma/value"] = torch.tensor(float("nan"), dtype=torch.float64)
    save_file(tensors, bundle / "weights.safetensors")
    (tmp_path / "new").mkdir()
    image = next((trained[1] / "site1" / "images").iterdir())
    shutil.copy(image, tmp_path / "new")
    args = ["predict", "--model", str(bundle), "--input", str(tmp_path / "new")]
    refused = runner.invoke(app, [*args, "--out", str(tmp_path / "a")])
    assert refused.exit_code != 0 and "Traceback" not in refused.output
    said = " ".join(refused.output.split())
    assert f"{bundle}/weights.safetensors: gamma/value is nan, and threshold routing needs a gamma in [0, 1]" in said
    given = runner.invoke(app, [*args, "--out", str(tmp_path / "b"), "--gamma", "0.5"])
    assert given.exit_code == 0, given.output
