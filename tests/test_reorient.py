"""``fedseg data reorient``: every volume of a federation turned to one voxel orientation, each voxel keeping its
value and its place in the patient (``fedseg.data.reorient``)."""

from __future__ import annotations

import itertools
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml

from fedseg.data.federation import FederationError
from fedseg.data.folder import load_folder
from fedseg.data.reorient import check_target, orientation_codes, reorient_folder, reoriented

nib = pytest.importorskip("nibabel")

SHAPE = (4, 5, 6)
# two hospitals' grids, voxel index -> RAS+ mm: a's axes run R, A, S; b's array axis 0 runs towards Posterior
# (2 mm), axis 1 towards Inferior (3 mm), axis 2 towards Left (0.5 mm), from an origin away from 0
GRIDS = {
    "a": np.diag([1.0, 1.0, 2.5, 1.0]),
    "b": np.array([[0.0, 0.0, -0.5, 40.0], [-2.0, 0.0, 0.0, 12.0], [0.0, -3.0, 0.0, -7.0], [0.0, 0.0, 0.0, 1.0]]),
}


def write_federation(root: Path, channels: int = 1, npy_site: bool = False) -> dict[tuple[str, str], tuple]:
    """A 3D federation whose site a is stored RAS and site b PIL (three cases each; site c of NumPy arrays with
    ``npy_site``); returns (site, case) -> (image (C, X, Y, Z), label, affine) as written."""
    root.mkdir()
    header = {"name": "two-grids", "kind": "3d", "channels": channels, "regions": {"organ": [1, 2], "core": [2]}}
    (root / "federation.yaml").write_text(yaml.safe_dump(header))
    rng = np.random.default_rng(0)
    written = {}
    for site, affine in GRIDS.items():
        (root / site / "images").mkdir(parents=True)
        (root / site / "labels").mkdir()
        (root / site / "cases.csv").write_text("case,scanner\n" + "".join(f"{site}{k},S{k}\n" for k in range(3)))
        for k in range(3):
            image = rng.normal(100, 10, (channels, *SHAPE)).astype(np.float32)
            label = rng.integers(0, 3, SHAPE).astype(np.uint8)
            stored = image[0] if channels == 1 else np.moveaxis(image, 0, -1)
            nib.save(nib.Nifti1Image(stored, affine), root / site / "images" / f"{site}{k}.nii.gz")
            nib.save(nib.Nifti1Image(label, affine), root / site / "labels" / f"{site}{k}.nii.gz")
            written[(site, f"{site}{k}")] = (image, label, affine)
    if npy_site:
        (root / "c" / "images").mkdir(parents=True)
        (root / "c" / "labels").mkdir()
        np.save(root / "c" / "images" / "c0.npy", rng.normal(0, 1, (channels, *SHAPE)).astype(np.float32))
        np.save(root / "c" / "labels" / "c0.npy", rng.integers(0, 3, SHAPE).astype(np.uint8))
    return written


def assert_same_voxels_in_place(before: tuple, path_image: Path, path_label: Path, target: str) -> None:
    """Every voxel of the written case has the value the source had at the same world position (mm)."""
    image, label, affine = before
    written_image, written_label = nib.load(path_image), nib.load(path_label)
    new_affine = written_image.affine
    assert orientation_codes(new_affine) == target
    np.testing.assert_allclose(written_label.affine, new_affine)
    new_image = np.asarray(written_image.dataobj)
    new_image = new_image[None] if new_image.ndim == 3 else np.moveaxis(new_image, -1, 0)
    new_label = np.asarray(written_label.dataobj)
    assert new_image.dtype == image.dtype and new_label.dtype == label.dtype
    assert sorted(new_label.shape) == sorted(label.shape)
    to_source = np.linalg.inv(affine) @ new_affine  # a written voxel index -> the source's index of that point
    for index in itertools.product(*(range(n) for n in new_label.shape)):
        source = to_source @ np.array([*index, 1.0])
        assert np.allclose(source, np.round(source), atol=1e-6), (index, source)
        i = tuple(int(v) for v in np.round(source[:3]))
        assert new_label[index] == label[i]
        np.testing.assert_array_equal(new_image[(slice(None), *index)], image[(slice(None), *i)])
    spacing = lambda a: sorted(np.linalg.norm(a[:3, :3], axis=0))  # noqa: E731
    np.testing.assert_allclose(spacing(new_affine), spacing(affine))


@pytest.mark.parametrize(("channels", "target"), [(1, "RAS"), (2, "LPS"), (1, "pir")])
def test_every_voxel_keeps_its_value_and_its_place_in_the_patient(tmp_path, channels, target):
    root, out = tmp_path / "fed", tmp_path / "turned"
    written = write_federation(root, channels)
    summary = reorient_folder(load_folder(root), root, out, target)
    target = target.upper()
    assert summary.turned + summary.kept == 6 and summary.copied == 0
    assert summary.before == {"PIL": 3, "RAS": 3}
    assert summary.kept == (3 if target == "RAS" else 0)
    for (site, case), before in written.items():
        folder = out / site
        assert_same_voxels_in_place(
            before, folder / "images" / f"{case}.nii.gz", folder / "labels" / f"{case}.nii.gz", target
        )
    assert (out / "federation.yaml").read_text() == (root / "federation.yaml").read_text()
    assert (out / "b" / "cases.csv").read_text() == (root / "b" / "cases.csv").read_text()
    fed = load_folder(out)  # a federation folder again, its cases read by fedseg's readers
    assert [c.id for c in fed.site("b").cases] == ["b0", "b1", "b2"]
    image, label = fed.site("b").cases[0].arrays()
    assert image.shape[0] == channels and label.shape == image.shape[1:]
    assert [k for k in out.iterdir() if k.name.startswith(".")] == []  # no staging folder left


def test_data_check_no_longer_warns_about_orientations_after_reorient(tmp_path):
    from fedseg.config import SplitConfig
    from fedseg.data.check import check_folder

    root, out = tmp_path / "fed", tmp_path / "turned"
    write_federation(root)
    warnings: list[str] = []
    check_folder(root, SplitConfig(), 0, warnings=warnings)
    assert any("2 voxel orientations" in w and "fedseg data reorient" in w for w in warnings), warnings
    reorient_folder(load_folder(root), root, out)
    warnings = []
    check_folder(out, SplitConfig(), 0, warnings=warnings)
    assert not any("orientation" in w for w in warnings), warnings


def test_numpy_cases_have_no_grid_and_are_copied_as_they_are(tmp_path):
    root, out = tmp_path / "fed", tmp_path / "turned"
    write_federation(root, npy_site=True)
    summary = reorient_folder(load_folder(root), root, out)
    assert summary.copied == 1
    for sub, name in (("images", "c0.npy"), ("labels", "c0.npy")):
        assert (out / "c" / sub / name).read_bytes() == (root / "c" / sub / name).read_bytes()


def test_a_dicom_series_comes_out_as_nifti_with_every_voxel_in_place(tmp_path):
    """A hospital's DICOM series (LPS, axes swapped: test_readers' grid) and its MetaImage label on the same grid."""
    pytest.importorskip("itk")
    pytest.importorskip("pydicom")
    pytest.importorskip("highdicom")
    pytest.importorskip("nrrd")
    from fedseg.data import readers
    from test_readers import LABEL, VALUES, write_itk, write_series

    root, out = tmp_path / "fed", tmp_path / "turned"
    root.mkdir()
    header = {"name": "pacs", "kind": "3d", "channels": 1, "regions": {"organ": [1, 2]}}
    (root / "federation.yaml").write_text(yaml.safe_dump(header))
    for k in range(3):
        write_series(root / "s" / "images" / f"c{k}", VALUES)
        write_itk(root / "s" / "labels" / f"c{k}.mha", LABEL)
    fed = load_folder(root)
    before = {}
    for case in fed.site("s").cases:
        image, label = (np.asarray(a) for a in case.arrays())
        before[case.id] = (image, label, readers.volume_grid(Path(str(case.meta["image"]))).affine)
    summary = reorient_folder(fed, root, out)
    assert (summary.turned, summary.kept, list(summary.before)) == (3, 0, ["PLI"])
    for cid, source in before.items():
        images, labels = out / "s" / "images", out / "s" / "labels"
        assert_same_voxels_in_place(source, images / f"{cid}.nii.gz", labels / f"{cid}.nii.gz", "RAS")


def test_reoriented_round_trips_through_the_inverse_turn():
    rng = np.random.default_rng(1)
    label = rng.integers(0, 5, SHAPE)
    turned, affine = reoriented(label, GRIDS["b"], "RAS")
    back, back_affine = reoriented(turned, affine, "PIL")
    np.testing.assert_array_equal(back, label)
    np.testing.assert_allclose(back_affine, GRIDS["b"])


@pytest.mark.parametrize("bad", ["RAX", "RRS", "RA", "RASL", "LRS"])
def test_a_target_that_is_no_orientation_is_refused(bad):
    with pytest.raises(FederationError, match=rf"^--to {bad}: not an orientation; give three letters"):
        check_target(bad)


def fedseg(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "fedseg", "data", *args], capture_output=True, text=True, timeout=300)


def test_the_command_says_what_it_did_and_refuses_bad_input_in_one_line(tmp_path):
    root, out = tmp_path / "fed", tmp_path / "turned"
    write_federation(root)
    done = fedseg("reorient", str(root), "--out", str(out))
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(
        f"reoriented {root} -> {out} to RAS: 3 case(s) turned, 3 already RAS (orientations found: PIL 3, RAS 3)"
    ), done.stdout
    again = fedseg("reorient", str(root), "--out", str(out))  # out holds a federation now
    assert again.returncode == 1 and len(again.stderr.strip().splitlines()) == 1, again.stderr
    assert str(out) in again.stderr and "Traceback" not in again.stderr
    inside = fedseg("reorient", str(root), "--out", str(root / "turned"))
    assert inside.returncode == 1 and "lies inside the federation folder" in inside.stderr, inside.stderr
    assert not (root / "turned").exists()
    flat = tmp_path / "flat"
    flat.mkdir()
    (flat / "federation.yaml").write_text(
        yaml.safe_dump({"name": "f", "kind": "2d", "channels": 1, "regions": {"x": [1]}})
    )
    (flat / "s" / "images").mkdir(parents=True)
    (flat / "s" / "labels").mkdir()
    np.save(flat / "s" / "images" / "c.npy", np.zeros((1, 4, 4), np.float32))
    np.save(flat / "s" / "labels" / "c.npy", np.zeros((4, 4), np.uint8))
    two_d = fedseg("reorient", str(flat), "--out", str(tmp_path / "flat2"))
    assert two_d.stderr.strip() == f"error: {flat}: a 2D federation; its images have no voxel orientation to turn"
    assert not (tmp_path / "flat2").exists()


def test_a_hospitals_folder_whose_federation_yaml_names_other_sites_is_reoriented(tmp_path):
    """A SuperNode's --data folder holds the federation's federation.yaml, which names every site, and its own site
    folder only: the coordinator's orientation warning tells such a site to run `data reorient` on it."""
    root, out = tmp_path / "fed", tmp_path / "turned"
    write_federation(root)
    shutil.rmtree(root / "a")
    header = yaml.safe_load((root / "federation.yaml").read_text())
    sites = {"a": {"scanner": "GE"}, "b": {"scanner": "Siemens"}}
    (root / "federation.yaml").write_text(yaml.safe_dump({**header, "sites": sites}))
    done = fedseg("reorient", str(root), "--out", str(out))
    assert done.returncode == 0, done.stderr
    assert "3 case(s) turned" in done.stdout and sorted(p.name for p in out.iterdir() if p.is_dir()) == ["b"]
    assert done.stdout.rstrip().endswith(
        f"its federation.yaml names sites it does not hold (a hospital's folder?): `fedseg data check {out} --site b` "
        "checks it"
    ), done.stdout
    checked = fedseg("check", str(out), "--site", "b")  # the command it names passes
    assert checked.returncode == 0, checked.stderr


def test_a_bundle_records_the_one_orientation_its_training_volumes_lay_in(tmp_path):
    from fedseg.data.reorient import federation_orientation

    root, out = tmp_path / "fed", tmp_path / "turned"
    write_federation(root)
    assert federation_orientation(load_folder(root)) is None  # RAS and PIL: no one orientation
    reorient_folder(load_folder(root), root, out, "LPS")
    assert federation_orientation(load_folder(out)) == "LPS"
    write_federation(tmp_path / "with-npy", npy_site=True)
    reorient_folder(load_folder(tmp_path / "with-npy"), tmp_path / "with-npy", tmp_path / "npy-turned", "LPS")
    assert federation_orientation(load_folder(tmp_path / "npy-turned")) is None  # a NumPy case has no grid


def test_a_bundle_keeps_the_orientation_its_model_trained_on_when_a_resume_writes_it_again(tmp_path, tiny_config):
    """The model card records the orientation as the algorithm finishes; a resume writes every finished algorithm's
    bundle again, after a site may have turned its data (the coordinator's warning says to): its manifest keeps the
    orientation the model trained on, not the data's now. A card of an older fedseg (none recorded): the data's."""
    import json

    import torch

    from fedseg.run.model_card import model_card
    from fedseg.run.outputs import write_bundle_files

    root = tmp_path / "fed"
    write_federation(root)
    turned = {}
    for target in ("RAS", "LPS"):
        reorient_folder(load_folder(root), root, tmp_path / target, target)
        turned[target] = load_folder(tmp_path / target)
    cfg = tiny_config()
    card = model_card("fedavg", turned["RAS"], cfg, {})
    assert card["orientation"] == "RAS"
    bundle = {"global": {"w": torch.zeros(2)}}

    def written(fed, card) -> dict:
        write_bundle_files(tmp_path / "model", bundle, cfg, fed, card)
        return json.loads((tmp_path / "model" / "manifest.json").read_text())

    assert written(turned["LPS"], card)["orientation"] == "RAS"  # trained on RAS, the data LPS by now
    assert written(turned["LPS"], {**card, "orientation": None}).get("orientation") is None  # trained on a mix
    older = {k: v for k, v in card.items() if k != "orientation"}
    assert written(turned["LPS"], older)["orientation"] == "LPS"


def test_predict_turns_an_input_to_the_models_orientation_and_its_mask_back(tmp_path, tiny_config):
    """A model trained on RAS volumes: the same volume stored PIL gets the mask of the RAS one, in PIL voxel order
    on its own grid, and one note; a bundle without an orientation (older, or mixed data) turns nothing."""
    import json

    from fedseg.data.federation import Regions
    from fedseg.engine.messages import weights_of
    from fedseg.models.factory import build_segmenter
    from fedseg.predict import predict
    from fedseg.run.outputs import write_bundle_files

    root = tmp_path / "fed"
    write_federation(root)
    ras = load_folder(root)
    ras.sites[:] = [ras.site("a")]  # site a's volumes only: all RAS
    cfg = tiny_config(algorithms=["fedavg"], data={"image_size": 16})
    regions = Regions.from_mapping({"organ": [1, 2], "core": [2]})
    network = build_segmenter(cfg.model, 3, 1, len(regions), seed=0)
    bundle = tmp_path / "model" / "fedavg"
    write_bundle_files(bundle, {"global": weights_of(network)}, cfg, ras)
    assert json.loads((bundle / "manifest.json").read_text())["orientation"] == "RAS"

    values = np.random.default_rng(0).integers(0, 1000, (12, 10, 8)).astype(np.float32)
    affine = np.diag([0.8, 1.2, 2.0, 1.0])
    turned, turned_affine = reoriented(values, affine, "PIL")
    for folder, data, grid in (("ras", values, affine), ("pil", turned, turned_affine)):
        (tmp_path / folder).mkdir()
        nib.save(nib.Nifti1Image(data, grid), tmp_path / folder / "image.nii.gz")
    predict(bundle, tmp_path / "ras", tmp_path / "from_ras")
    reference = np.asarray(nib.load(tmp_path / "from_ras" / "image.nii.gz").dataobj)
    assert reference.any() and not reference.all()  # a mask with something in it: the comparison compares
    notes: list[str] = []
    predict(bundle, tmp_path / "pil", tmp_path / "from_pil", notes=notes)
    mask = nib.load(tmp_path / "from_pil" / "image.nii.gz")
    np.testing.assert_allclose(mask.affine, turned_affine)
    np.testing.assert_array_equal(np.asarray(mask.dataobj), reoriented(reference, affine, "PIL")[0])
    assert any(
        n.startswith("1 input volume(s) turned to RAS, the voxel orientation the model was trained on (1 from PIL")
        for n in notes
    ), notes

    manifest = json.loads((bundle / "manifest.json").read_text())
    del manifest["orientation"]  # a bundle of mixed data, or written before bundles recorded it
    (bundle / "manifest.json").write_text(json.dumps(manifest))
    notes = []
    predict(bundle, tmp_path / "pil", tmp_path / "unturned", notes=notes)
    assert not any("turned" in n for n in notes), notes
    assert np.asarray(nib.load(tmp_path / "unturned" / "image.nii.gz").dataobj).shape == turned.shape
