"""nnU-Net v2 datasets in and out: ``fedseg data import nnunet`` reads the raw layout (written here in its real form:
``dataset.json``, ``imagesTr/<case>_XXXX.nii.gz`` with spacing, ``labelsTr/``, ``imagesTs/``...) into a checked
folder federation; ``fedseg data export nnunet`` writes a federation back with its splits, and the round trip keeps
regions, channels, cases, spacing and splits. Bad input fails with one line naming the file, field or case (a
dataset.json's faults all in one error, a line each)."""

from __future__ import annotations

import functools
import json
from pathlib import Path

import nibabel as nib
import numpy as np
import pytest
import yaml
from PIL import Image
from typer.testing import CliRunner

from fedseg.config import SplitConfig
from fedseg.data import readers
from fedseg.data.case_files import read_image, read_label
from fedseg.data.check import check_folder
from fedseg.data.cli import data_app
from fedseg.data.exporters.nnunet import IMPORT_REGEX, export_nnunet, labels_for
from fedseg.data.federation import Case, Federation, FederationError, Regions, Site
from fedseg.data.folder import load_folder
from fedseg.data.folder_write import write_folder
from fedseg.data.importers.nnunet import readable_endings
from fedseg.data.splits import make_splits
from fedseg.data.volumes import case_spacing

SHAPE = (10, 9, 6)
SPACING = (0.8, 0.8, 2.5)
AFFINE = np.diag([*SPACING, 1.0])
AFFINE[:3, 3] = (-4.0, 7.0, 12.0)
PLAIN_LABELS = {"background": 0, "liver": 1, "tumour": 2}
REGION_LABELS = {"background": 0, "whole tumor": [1, 2, 3], "tumor core": [2, 3], "enhancing tumor": 3}


def _nifti(path: Path, data: np.ndarray, affine: np.ndarray = AFFINE) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    nib.save(nib.Nifti1Image(data, affine), path)


def _label(rng: np.random.Generator, top: int) -> np.ndarray:
    """Nested balls with values 1..top (the inner ball has the highest value)."""
    grid = np.stack(np.meshgrid(*(np.arange(n) for n in SHAPE), indexing="ij"), -1)
    dist = np.linalg.norm(grid - (np.array(SHAPE) / 2 + rng.uniform(-1, 1, 3)), axis=-1)
    label = np.zeros(SHAPE, np.uint8)
    for value in range(1, top + 1):
        label[dist < 4.0 - 1.2 * (value - 1)] = value
    return label


def nnunet_dataset(
    root: Path,
    sites=("AMC", "BWH", "CHU"),
    per_site: int = 3,
    channels=("T2", "ADC"),
    labels=None,
    test_per_site: int = 1,
) -> Path:
    """``root`` = ``DatasetNNN_Name``: cases ``<site>_NNN``, one float32/int16 NIfTI per channel with AFFINE, uint8
    labels; the last ``test_per_site`` cases of each site go to imagesTs/labelsTs."""
    labels = PLAIN_LABELS if labels is None else labels
    region_based = any(isinstance(v, list) for v in labels.values())
    rng = np.random.default_rng(len(root.name))
    training = 0
    for site in sites:
        for i in range(per_site + test_per_site):
            cid = f"{site}_{i:03d}"
            split = "Ts" if i >= per_site else "Tr"
            label = _label(rng, len(labels) - 1)
            for c in range(len(channels)):
                dtype = np.float32 if c == 0 else np.int16
                image = (rng.normal(100, 10, SHAPE) + 50 * (c + 1) * (label > 0)).astype(dtype)
                _nifti(root / f"images{split}" / f"{cid}_{c:04d}.nii.gz", image)
            _nifti(root / f"labels{split}" / f"{cid}.nii.gz", label)
            training += split == "Tr"
    dataset = {
        "channel_names": {str(c): name for c, name in enumerate(channels)},
        "labels": labels,
        "numTraining": training,
        "file_ending": ".nii.gz",
    }
    if region_based:
        dataset["regions_class_order"] = [1, 2, 3]
    (root / "dataset.json").write_text(json.dumps(dataset, indent=2))
    return root


def cli(*args: str):
    return CliRunner().invoke(data_app, list(args))


def one_line_error(result) -> str:
    """The error of a failed command (exit 1, no traceback, one line ``error: <message>``): its message."""
    assert result.exit_code == 1, result.output
    assert "Traceback" not in result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.output
    return lines[0].removeprefix("error: ")


def splits_of(root: Path) -> dict[str, dict[str, str]]:
    fed = load_folder(root)
    return {s.name: dict(s.fixed_splits or {}) for s in fed.sites}


# --- import ------------------------------------------------------------------------------------------------------


def test_import_sites_channels_plain_regions_spacing_and_test_split(tmp_path):
    src, out = nnunet_dataset(tmp_path / "Dataset501_Liver"), tmp_path / "fed"
    result = cli("import", "nnunet", str(src), "--site-by", r"^([A-Z]+)_\d+$", "--out", str(out))
    assert result.exit_code == 0, result.output
    assert "3 sites, 12 cases" in result.output and "data check OK" in result.output
    header = yaml.safe_load((out / "federation.yaml").read_text())
    assert header["kind"] == "3d" and header["channels"] == 2
    assert header["regions"] == {"liver": [1], "tumour": [2]}  # nnU-Net's classes are disjoint
    assert header["label_names"] == {0: "background", 1: "liver", 2: "tumour"}
    assert header["sites"]["BWH"] == {"dataset": "Dataset501_Liver", "channel_names": "T2,ADC"}
    # the two channel files stacked as one 4D NIfTI with the _0000 file's affine (so its spacing)
    written = out / "BWH" / "images" / "BWH_001.nii.gz"
    np.testing.assert_allclose(nib.load(written).affine, AFFINE)
    image = read_image(written, "3d")
    assert image.shape == (2, *SHAPE) and image.dtype == np.float32
    for c in range(2):
        source = nib.load(src / "imagesTr" / f"BWH_001_{c:04d}.nii.gz").get_fdata()
        np.testing.assert_array_equal(image[c], source)
    label = out / "BWH" / "labels" / "BWH_001.nii.gz"
    assert label.is_symlink() and label.resolve() == (src / "labelsTr" / "BWH_001.nii.gz").resolve()
    fed = check_folder(out)
    assert case_spacing(fed.site("AMC").cases[0], 3) == pytest.approx(SPACING)
    # imagesTs/labelsTs are the test cases; without splits_final.json the rest is left to the run's split
    assert splits_of(out) == {s: {f"{s}_003": "test"} for s in ("AMC", "BWH", "CHU")}


def test_one_dataset_per_hospital_imports_as_one_federation_and_datasets_that_disagree_are_refused(tmp_path):
    """Hospitals each keep their own DatasetNNN_Name (their own file_ending and grid): several dataset folders are
    one federation, a site per dataset (or per --site-by group), where they agree on channels and labels."""
    a = nnunet_dataset(tmp_path / "Dataset501_HospA", sites=("hospA",), per_site=3, test_per_site=0)
    b = nnunet_dataset(tmp_path / "Dataset502_HospB", sites=("hospB",), per_site=3, test_per_site=0)
    out = tmp_path / "fed"
    result = cli("import", "nnunet", str(a), str(b), "--out", str(out))
    assert result.exit_code == 0, result.output
    assert "2 sites, 6 cases" in result.output and "data check OK" in result.output
    header = yaml.safe_load((out / "federation.yaml").read_text())
    assert header["name"] == "Dataset501_HospA+Dataset502_HospB" and header["channel_names"] == ["T2", "ADC"]
    assert header["sites"] == {
        "Dataset501_HospA": {"dataset": "Dataset501_HospA", "channel_names": "T2,ADC"},
        "Dataset502_HospB": {"dataset": "Dataset502_HospB", "channel_names": "T2,ADC"},
    }
    image = read_image(out / "Dataset502_HospB" / "images" / "hospB_001.nii.gz", "3d")
    np.testing.assert_array_equal(image[1], nib.load(b / "imagesTr" / "hospB_001_0001.nii.gz").get_fdata())
    result = cli("import", "nnunet", str(a), str(b), "--site-by", r"^(hosp)", "--out", str(tmp_path / "f2"))
    assert one_line_error(result) == (
        f"site 'hosp' comes from both {a} and {b}: a site is one hospital's; give --site-by a pattern that names "
        "them apart, or import the datasets one by one"
    )
    swapped = nnunet_dataset(tmp_path / "Dataset503_HospC", sites=("hospC",), channels=("ADC", "T2"), test_per_site=0)
    result = cli("import", "nnunet", str(a), str(swapped), "--out", str(tmp_path / "f3"))
    assert one_line_error(result) == (
        f"{swapped}/dataset.json: does not describe the data as {a}/dataset.json does (channel_names ['ADC', 'T2'] "
        "vs ['T2', 'ADC']); the same channels in another order: reorder one (renumber its _XXXX channel files and its "
        "channel_names to the other's order)"
    )
    result = cli("import", "nnunet", str(a), str(b), "--splits", str(a / "none.json"), "--out", str(tmp_path / "f4"))
    assert "one splits_final.json for 2 datasets" in one_line_error(result)
    assert not any((tmp_path / f).exists() for f in ("f2", "f3", "f4"))


def test_datasets_of_different_modalities_are_refused_with_their_channel_names_as_written(tmp_path):
    """A CT and an MR dataset: the names as their dataset.json write them (not lower-cased), and advice that fits a
    modality mismatch (no "renumber or reorder one": no order makes CT an MR channel)."""
    ct = nnunet_dataset(tmp_path / "Dataset601_CT", sites=("hospA",), channels=("CT",), test_per_site=0)
    mr = nnunet_dataset(tmp_path / "Dataset602_MR", sites=("hospB",), channels=("MR",), test_per_site=0)
    line = one_line_error(cli("import", "nnunet", str(ct), str(mr), "--out", str(tmp_path / "fed")))
    assert line == (
        f"{mr}/dataset.json: does not describe the data as {ct}/dataset.json does (channel_names ['MR'] vs ['CT']); "
        "the datasets of one federation need the same channels (modalities) in the same order: datasets of different "
        "modalities cannot be one federation (import each as its own); only where a channel is the same modality "
        "under another name, rename it in that dataset.json (and reorder to match)"
    )
    assert "renumber or reorder one" not in line and not (tmp_path / "fed").exists()


def test_import_region_based_labels_with_a_csv_of_sites_and_splits_final(tmp_path):
    src = nnunet_dataset(tmp_path / "Dataset502_Brats", sites=("X", "Y"), per_site=2, labels=REGION_LABELS)
    rows = [f"{s}_{i:03d},{'north' if s == 'X' else 'south'}" for s in ("X", "Y") for i in range(3)]
    (tmp_path / "sites.csv").write_text("case,site\n" + "\n".join(rows) + "\n")
    (src / "splits_final.json").write_text(
        json.dumps([{"train": ["X_000", "Y_000"], "val": ["X_001", "Y_001"]}, {"train": [], "val": []}])
    )
    out = tmp_path / "fed"
    result = cli("import", "nnunet", str(src), "--site-by", str(tmp_path / "sites.csv"), "--out", str(out))
    assert result.exit_code == 0, result.output
    fed = check_folder(out)
    assert fed.regions.as_dict() == {"whole_tumor": [1, 2, 3], "tumor_core": [2, 3], "enhancing_tumor": [3]}
    assert fed.label_names is None and fed.site_names == ["north", "south"]
    assert splits_of(out)["north"] == {"X_000": "train", "X_001": "val", "X_002": "test"}


def test_a_splits_final_fold_that_leaves_a_site_without_test_cases_is_refused_at_import(tmp_path):
    """nnU-Net's folds split imagesTr into train and val; without labelled imagesTs the sites had no test case, and
    the run failed its final evaluation after all the training."""
    src = nnunet_dataset(tmp_path / "Dataset509_NoTs", sites=("X", "Y"), per_site=4, test_per_site=0)
    fold = {"train": ["X_000", "X_001", "Y_000", "Y_001"], "val": ["X_002", "X_003", "Y_002", "Y_003"]}
    (src / "splits_final.json").write_text(json.dumps([fold]))
    out = tmp_path / "fed"
    line = one_line_error(cli("import", "nnunet", str(src), "--site-by", "^([A-Z])_", "--out", str(out)))
    assert "splits_final.json: fold 0 puts every imagesTr case of site 'X' in train or val" in line
    assert "no test cases" in line and not out.exists()
    (src / "splits_final.json").unlink()  # the run's split then draws the test cases
    assert cli("import", "nnunet", str(src), "--site-by", "^([A-Z])_", "--out", str(out)).exit_code == 0


def test_splits_final_is_found_where_nnunet_keeps_it_and_a_fold_without_one_is_refused(tmp_path, monkeypatch):
    """nnU-Net v2 writes splits_final.json to $nnUNet_preprocessed/<dataset>/, not to the raw folder."""
    src = nnunet_dataset(tmp_path / "raw" / "Dataset505_Pre", sites=("X",), per_site=2)
    sites = ["--site-by", "^([A-Z])_"]
    refused = cli("import", "nnunet", str(src), *sites, "--fold", "1", "--out", str(tmp_path / "none"))
    assert "--fold 1: no splits_final.json in" in one_line_error(refused)
    preprocessed = tmp_path / "preprocessed"
    (preprocessed / src.name).mkdir(parents=True)
    folds = [{"train": ["X_000"], "val": ["X_001"]}, {"train": ["X_001"], "val": ["X_000"]}]
    (preprocessed / src.name / "splits_final.json").write_text(json.dumps(folds))
    monkeypatch.setenv("nnUNet_preprocessed", str(preprocessed))
    assert cli("import", "nnunet", str(src), *sites, "--fold", "1", "--out", str(tmp_path / "fed")).exit_code == 0
    assert splits_of(tmp_path / "fed")["X"] == {"X_000": "val", "X_001": "train", "X_002": "test"}
    monkeypatch.delenv("nnUNet_preprocessed")
    given = ["--splits", str(preprocessed / src.name / "splits_final.json")]
    assert cli("import", "nnunet", str(src), *sites, *given, "--out", str(tmp_path / "fed0")).exit_code == 0
    assert splits_of(tmp_path / "fed0")["X"] == {"X_000": "train", "X_001": "val", "X_002": "test"}


def test_import_2d_pngs_rgb_in_one_file_and_grey_channels_stacked(tmp_path):
    rng = np.random.default_rng(0)
    for name, channels in (("Dataset503_Rgb", ["R", "G", "B"]), ("Dataset504_Grey", ["a", "b"])):
        src = tmp_path / name
        for i in range(3):
            label = np.zeros((8, 7), np.uint8)
            label[2:5, 2:5] = 1
            if len(channels) == 3:
                files = [rng.integers(0, 255, (8, 7, 3), dtype=np.uint8)]  # nnU-Net's RGB: one _0000 file
            else:
                files = [rng.integers(0, 255, (8, 7), dtype=np.uint8) for _ in channels]
            for c, pixels in enumerate(files):
                (src / "imagesTr").mkdir(parents=True, exist_ok=True)
                Image.fromarray(pixels).save(src / "imagesTr" / f"s{i % 2}_{i:03d}_{c:04d}.png")
            (src / "labelsTr").mkdir(exist_ok=True)
            Image.fromarray(label).save(src / "labelsTr" / f"s{i % 2}_{i:03d}.png")
        dataset = {
            "channel_names": dict(enumerate(channels)),
            "labels": {"background": 0, "road": 1},
            "numTraining": 3,
            "file_ending": ".png",
        }
        (src / "dataset.json").write_text(json.dumps(dataset))
        out = tmp_path / f"fed-{name}"
        result = cli("import", "nnunet", str(src), "--site-by", "^(s[0-9])_", "--out", str(out))
        assert result.exit_code == 0, result.output
        fed = check_folder(out)
        assert fed.kind == "2d" and fed.channels == len(channels) and fed.site_names == ["s0", "s1"]
        image = fed.site("s1").cases[0].arrays()[0]
        first = np.asarray(Image.open(src / "imagesTr" / "s1_001_0000.png"))
        np.testing.assert_array_equal(image[0], first if first.ndim == 2 else first[..., 0])
        assert image.shape == (len(channels), 8, 7)
    # RGB files under a dataset.json that lists two channels: the line names the dataset.json the user wrote, not
    # the federation.yaml the import wrote from it
    rgb = tmp_path / "Dataset503_Rgb"
    _set_json(rgb, channel_names={"0": "R", "1": "G"})
    result = cli("import", "nnunet", str(rgb), "--site-by", "^(s[0-9])_", "--out", str(tmp_path / "x"))
    assert result.exit_code == 1 and "federation.yaml" not in result.output, result.output
    line = f"{rgb / 'imagesTr' / 's0_000_0000.png'}: image has 3 channels but {rgb / 'dataset.json'} channel_names"
    assert f"{line} lists 2" in " ".join(result.output.split()), result.output


@pytest.mark.parametrize("ending", [".nrrd", ".mha"])
def test_channel_files_in_nrrd_or_metaimage_stack_on_the_first_files_grid(tmp_path, ending):
    """Two channels stored as NRRD or MetaImage (LPS, axes swapped and flipped, an origin): the stacked NIfTI holds
    their voxels on the ``_0000`` file's grid (direction and origin too), so it lies on its label's grid."""
    pytest.importorskip("itk")
    pytest.importorskip("nrrd")
    from test_readers import LPS_TO_RAS, lps_affine, write_itk, write_pynrrd

    src, out = (
        nnunet_dataset(tmp_path / "Dataset502_Nrrd", sites=("AMC", "BWH"), per_site=2, test_per_site=0),
        tmp_path / "fed",
    )
    for nifti in sorted(src.glob("*/*.nii.gz")):
        written = (write_pynrrd if ending == ".nrrd" else write_itk)(
            nifti.with_name(nifti.name.replace(".nii.gz", ending)), np.asarray(nib.load(nifti).dataobj)
        )
        nifti.unlink()
    _set_json(src, file_ending=ending)
    result = cli("import", "nnunet", str(src), "--site-by", "^([A-Z]+)_", "--out", str(out))
    assert result.exit_code == 0, result.output
    stacked = nib.load(out / "BWH" / "images" / "BWH_001.nii.gz")
    np.testing.assert_allclose(stacked.affine, LPS_TO_RAS @ lps_affine())
    np.testing.assert_allclose(stacked.affine, readers.volume_grid(written).affine)
    for c in range(2):
        channel = readers.read_volume(src / "imagesTr" / f"BWH_001_{c:04d}{ending}")
        np.testing.assert_array_equal(np.asarray(stacked.dataobj)[..., c], channel)


def test_stacked_channels_keep_the_first_files_qform_and_sform_codes(tmp_path):
    """A ``_0000`` file with a scanner qform (code 1) and an aligned sform (code 2): the stacked file keeps both, not
    an sform alone."""
    src, out = (
        nnunet_dataset(tmp_path / "Dataset505_Codes", sites=("AMC",), per_site=2, test_per_site=0),
        tmp_path / "fed",
    )
    first = src / "imagesTr" / "AMC_001_0000.nii.gz"
    image = nib.load(first)
    image.set_qform(AFFINE, code=1)
    image.set_sform(AFFINE, code=2)
    nib.save(image, first)
    assert cli("import", "nnunet", str(src), "--out", str(out)).exit_code == 0
    stacked = nib.load(out / "Dataset505_Codes" / "images" / "AMC_001.nii.gz")
    assert (int(stacked.header["qform_code"]), int(stacked.header["sform_code"])) == (1, 2)
    np.testing.assert_allclose(stacked.get_qform(), AFFINE, atol=1e-6)
    np.testing.assert_allclose(stacked.get_sform(), AFFINE)


def test_2d_data_stored_as_nifti_with_one_slice_is_imported_as_2d(tmp_path):
    """nnU-Net's 2D data as NIfTI ``(X, Y, 1)`` (its ``file_ending`` ``.nii.gz`` alone does not tell): ``kind: 2d``,
    read from the first case's header, with the two channels stacked as a 2D case's."""
    src, out = tmp_path / "Dataset711_Nifti2D", tmp_path / "fed"
    rng, plane = np.random.default_rng(0), np.diag([0.5, 0.7, 2.0, 1.0])  # pixels of 0.5 x 0.7 mm
    for i in range(3):
        label = np.zeros((10, 9, 1), np.uint8)
        label[2:6, 3:7] = 1
        for c in range(2):
            image = rng.normal(size=(10, 9, 1)).astype(np.float32)
            _nifti(src / "imagesTr" / f"s{i % 2}_{i:03d}_{c:04d}.nii.gz", image, plane)
        _nifti(src / "labelsTr" / f"s{i % 2}_{i:03d}.nii.gz", label, plane)
    dataset = {"channel_names": {"0": "a", "1": "b"}, "labels": {"background": 0, "cell": 1}, "numTraining": 3}
    (src / "dataset.json").write_text(json.dumps({**dataset, "file_ending": ".nii.gz"}))
    result = cli("import", "nnunet", str(src), "--site-by", "^(s[0-9])_", "--out", str(out))
    assert result.exit_code == 0, result.output
    fed = check_folder(out)
    assert fed.kind == "2d" and fed.channels == 2
    image, label = fed.site("s1").cases[0].arrays()
    assert image.shape == (2, 10, 9) and label.shape == (10, 9)
    first = np.asarray(nib.load(src / "imagesTr" / "s1_001_0000.nii.gz").dataobj)
    np.testing.assert_array_equal(image[0], first[..., 0])
    second = np.asarray(nib.load(src / "imagesTr" / "s1_001_0001.nii.gz").dataobj)
    np.testing.assert_array_equal(image[1], second[..., 0])
    # stacked as a NIfTI on the first channel's grid (an .npy had no pixel spacing: HD95 came out in pixels)
    case = fed.site("s1").cases[0]
    assert Path(case.meta["image"]).name.endswith(".nii.gz")
    assert case_spacing(case, 2) == pytest.approx((0.5, 0.7))


def test_a_3d_dataset_whose_first_case_has_one_slice_is_not_taken_for_2d(tmp_path):
    """The kind was read from the first case alone: a 3D dataset whose first case had one slice was imported as 2D
    and failed on its other cases' labels (a review). Every case's header is read; one slice here and more there is
    said in one line naming one of each."""
    src = tmp_path / "Dataset712_Mixed"
    for i, depth in enumerate((1, 6, 5)):
        _nifti(src / "imagesTr" / f"s{i % 2}_{i:03d}_0000.nii.gz", np.zeros((10, 9, depth), np.float32))
        _nifti(src / "labelsTr" / f"s{i % 2}_{i:03d}.nii.gz", np.zeros((10, 9, depth), np.uint8))
    dataset = {"channel_names": {"0": "CT"}, "labels": {"background": 0, "organ": 1}, "numTraining": 3}
    (src / "dataset.json").write_text(json.dumps({**dataset, "file_ending": ".nii.gz"}))
    result = cli("import", "nnunet", str(src), "--site-by", "^(s[0-9])_", "--out", str(tmp_path / "fed"))
    said = " ".join(result.output.split())
    assert result.exit_code == 1 and "Traceback" not in result.output, result.output
    assert "s0_000_0000.nii.gz: one slice (2D data stored as a volume), but " in said and "s0_002_0000" in said, said
    assert not (tmp_path / "fed").exists()


# --- export and the round trip -------------------------------------------------------------------------------------


def test_pooled_export_then_import_keeps_regions_channels_cases_spacing_and_splits(tmp_path):
    src, fed_dir = nnunet_dataset(tmp_path / "Dataset501_Liver"), tmp_path / "fed"
    assert cli("import", "nnunet", str(src), "--site-by", "^([A-Z]+)_", "--out", str(fed_dir)).exit_code == 0
    result = cli("export", "nnunet", str(fed_dir), "--out", str(tmp_path / "raw"), "--id", "7", "--name", "liver 3")
    assert result.exit_code == 0, result.output
    dataset_dir = tmp_path / "raw" / "Dataset007_liver_3"
    copy = f'copy {dataset_dir / "splits_final.json"} to "$nnUNet_preprocessed"/Dataset007_liver_3/ before training'
    assert copy in result.output  # a line to paste into a shell: the variable quoted, the paths quoted where needed
    dataset = json.loads((dataset_dir / "dataset.json").read_text())
    assert dataset["channel_names"] == {"0": "T2", "1": "ADC"} and dataset["file_ending"] == ".nii.gz"
    assert dataset["labels"] == {"background": 0, "liver": 1, "tumour": 2} and "regions_class_order" not in dataset
    original = load_folder(fed_dir)
    splits = make_splits(original, SplitConfig(), 0)  # what a run with the default split uses
    test_ids = {f"{s}__{c}" for s, cases in splits.items() for c, split in cases.items() if split == "test"}
    assert {p.name.removesuffix(".nii.gz") for p in (dataset_dir / "labelsTs").iterdir()} == test_ids
    assert dataset["numTraining"] == 12 - len(test_ids) == len(list((dataset_dir / "labelsTr").iterdir()))
    (fold,) = json.loads((dataset_dir / "splits_final.json").read_text())
    for part in ("train", "val"):
        assert fold[part] == [f"{s}__{c}" for s, cases in splits.items() for c, split in cases.items() if split == part]
    # an nnU-Net channel file: one channel, the source's affine
    written = nib.load(dataset_dir / "imagesTr" / "AMC__AMC_000_0001.nii.gz")
    assert written.shape == SHAPE and np.allclose(written.affine, AFFINE)

    back = tmp_path / "back"
    result = cli("import", "nnunet", str(dataset_dir), "--site-by", IMPORT_REGEX, "--out", str(back))
    assert result.exit_code == 0, result.output
    again = check_folder(back)
    assert again.regions == original.regions and again.channels == original.channels
    assert again.label_names == original.label_names and again.kind == original.kind
    assert {s.name: [c.id for c in s.cases] for s in again.sites} == {
        s.name: [c.id for c in s.cases] for s in original.sites
    }
    assert splits_of(back) == splits
    for site in original.sites:
        for case, case_again in zip(site.cases, again.site(site.name).cases):
            assert case_spacing(case_again, 3) == pytest.approx(case_spacing(case, 3))
            np.testing.assert_allclose(nib.load(case_again.meta["image"]).affine, AFFINE)
            for a, b in zip(case.arrays(), case_again.arrays()):
                np.testing.assert_array_equal(a, b)


def test_region_based_round_trip_one_site_and_every_kfold_fold(tmp_path):
    src = nnunet_dataset(tmp_path / "Dataset502_Brats", labels=REGION_LABELS, sites=("X", "Y"), per_site=6)
    fed_dir = tmp_path / "f"  # 6 + 1 cases a site: each of 2 folds keeps training and validation cases
    assert cli("import", "nnunet", str(src), "--site-by", "^([A-Z])_", "--out", str(fed_dir)).exit_code == 0
    config = tmp_path / "kfold.yaml"
    config.write_text(yaml.safe_dump({"data": {"split": {"mode": "kfold", "folds": 2}}}))
    raw = tmp_path / "raw"
    result = cli(
        "export", "nnunet", str(fed_dir), "--site", "Y", "--all-folds", "--config", str(config), "--out", str(raw)
    )
    assert result.exit_code == 0, result.output
    dataset_dir = raw / "Dataset500_Brats"  # the DatasetNNN_ of the imported name is dropped
    dataset = json.loads((dataset_dir / "dataset.json").read_text())
    assert dataset["labels"] == {
        "background": 0,
        "whole_tumor": [1, 2, 3],
        "tumor_core": [2, 3],
        "enhancing_tumor": [3],
    }
    assert dataset["regions_class_order"] == [1, 2, 3]
    assert not (dataset_dir / "imagesTs").exists()  # every fold's test cases are its nnU-Net val cases
    folds = json.loads((dataset_dir / "splits_final.json").read_text())
    fed = load_folder(fed_dir)
    cfg = SplitConfig(mode="kfold", folds=2)
    for k, fold in enumerate(folds):
        splits = make_splits(fed, cfg.model_copy(update={"fold": k}), 0)["Y"]
        assert sorted(fold["val"]) == sorted(c for c, s in splits.items() if s == "test")
        assert sorted(fold["train"]) == sorted(c for c, s in splits.items() if s != "test")
    # Y's imagesTs case stays test in every fold (fixed in splits.csv), so it is val in both
    assert all("Y_006" in fold["val"] for fold in folds)
    back = tmp_path / "back"
    # every case in a fold's train or val, none test: a fedseg run on it would have no test case, so it is refused
    refused = cli("import", "nnunet", str(dataset_dir), "--site-by", "^([A-Z])_", "--fold", "1", "--out", str(back))
    assert "fold 1 puts every imagesTr case of site 'Y' in train or val" in one_line_error(refused)
    (dataset_dir / "splits_final.json").rename(tmp_path / "splits_final.json")  # aside: the run's split applies
    result = cli("import", "nnunet", str(dataset_dir), "--site-by", "^([A-Z])_", "--out", str(back))
    assert result.exit_code == 0, result.output
    again = check_folder(back)
    assert again.regions == fed.regions and again.site_names == ["Y"] and not splits_of(back)["Y"]


def test_export_renumbers_brats_labels_and_writes_spacing_of_in_memory_cases(tmp_path):
    rng = np.random.default_rng(3)
    cases = []
    for i in range(4):
        label = _label(rng, 3)
        label[label == 3] = 4  # BraTS: 1, 2, 4
        image = rng.normal(0, 1, (3, *SHAPE)).astype(np.float32)
        cases.append(Case.from_arrays(f"c{i}", image, label, spacing=(1.0, 1.5, 3.0)))
    regions = Regions.from_mapping({"WT": [1, 2, 4], "TC": [1, 4], "ET": [4]})
    fed = Federation("brats", "3d", 3, regions, [Site("inst1", cases)])
    splits = make_splits(fed, SplitConfig(ratios=(0.5, 0.5, 0.0)), 0)
    written = export_nnunet(fed, [splits], tmp_path, dataset_id=999)
    dataset = json.loads((written.path / "dataset.json").read_text())
    assert dataset["labels"] == {"background": 0, "WT": [1, 2, 3], "TC": [1, 3], "ET": [3]}
    assert dataset["regions_class_order"] == [2, 1, 3]  # WT alone is 2 (edema), TC without ET 1 (core), ET 3
    assert "renumbered (fedseg -> nnU-Net): {4: 3}" in dataset["description"]
    label = nib.load(written.path / "labelsTr" / "inst1__c0.nii.gz")
    assert set(np.unique(np.asarray(label.dataobj)).tolist()) == {0, 1, 2, 3}
    np.testing.assert_allclose(label.header.get_zooms(), (1.0, 1.5, 3.0))
    assert written.training == 4 and written.test == 0


def test_nested_regions_listed_smallest_first_are_exported_largest_first():
    """nnU-Net paints regions in the order listed: ET, TC, WT as a federation may list them (a YAML mapping dumped
    with sorted keys) go out as WT, TC, ET; regions that cannot be painted in any order are still refused."""
    labels, order, _ = labels_for(Regions.from_mapping({"ET": [4], "TC": [1, 4], "WT": [1, 2, 4]}))
    assert list(labels) == ["background", "WT", "TC", "ET"] and order == [2, 1, 3]
    with pytest.raises(FederationError, match="every value lies in a smaller region"):
        labels_for(Regions.from_mapping({"a": [1, 2], "b": [1], "c": [2]}))
    with pytest.raises(FederationError, match="overlap without one containing the other"):
        labels_for(Regions.from_mapping({"a": [1, 3], "b": [2, 3]}))


def test_predicted_regions_become_a_label_map_in_the_paint_order_the_export_uses():
    """``Regions.to_label`` paints nested regions largest first, as nnU-Net writes region-based predictions and the
    export orders them: each pixel gets the value of the smallest region predicted there, so the written map's
    innermost region is exactly the predicted one (an ET voxel the WT and TC channels missed is 4; the closest-value
    rule used before wrote 0 there); regions that overlap without nesting keep the closest-value rule."""
    brats = Regions.from_mapping({"ET": [4], "TC": [1, 4], "WT": [1, 2, 4]})
    _, order, renumber = labels_for(brats)
    assert [renumber[v] for _, v in brats.paint_order()] == order  # one order for the export and the masks
    # per pixel (columns): ET only, TC only, TC+ET, WT+TC+ET, WT only, WT+ET, none
    masks = np.array([[1, 0, 1, 1, 0, 1, 0], [0, 1, 1, 1, 0, 0, 0], [0, 0, 0, 1, 1, 1, 0]], bool)
    label = brats.to_label(masks)
    np.testing.assert_array_equal(label, [4, 1, 4, 4, 2, 4, 0])
    np.testing.assert_array_equal(brats.one_hot(label)[0], masks[0])  # ET written as predicted
    every = np.array([0, 1, 2, 4])
    np.testing.assert_array_equal(brats.to_label(brats.one_hot(every)), every)  # a consistent mask maps back
    crossing = Regions.from_mapping({"a": [1, 3], "b": [2, 3]})  # no paint order: the closest value
    np.testing.assert_array_equal(crossing.to_label(np.array([[1, 1, 0, 0], [1, 0, 1, 0]], bool)), [3, 1, 2, 0])


def test_the_federations_channel_names_are_what_the_export_names_the_channels(tmp_path, disc_federation):
    """``channel_names`` of ``federation.yaml`` (a FeTS import's t1, t1ce, ...; here a 2D federation's) name the
    exported dataset's channels, ahead of the R, G, B a 3-channel 2D federation otherwise gets."""
    import dataclasses

    fed = dataclasses.replace(disc_federation(n_sites=2, cases_per_site=4, size=16), channel_names=["fundus", "a", "b"])
    write_folder(fed, tmp_path / "discs")
    raw = tmp_path / "raw"
    assert cli("export", "nnunet", str(tmp_path / "discs"), "--pooled", "--out", str(raw)).exit_code == 0
    dataset = json.loads((raw / "Dataset500_discs" / "dataset.json").read_text())
    assert dataset["channel_names"] == {"0": "fundus", "1": "a", "2": "b"}


def test_2d_federation_exports_rgb_pngs_and_comes_back(tmp_path, disc_federation):
    fed = disc_federation(n_sites=2, cases_per_site=4, size=16)
    write_folder(fed, tmp_path / "discs")
    raw = tmp_path / "raw"
    assert cli("export", "nnunet", str(tmp_path / "discs"), "--pooled", "--out", str(raw)).exit_code == 0
    dataset_dir = raw / "Dataset500_discs"
    dataset = json.loads((dataset_dir / "dataset.json").read_text())
    assert dataset["channel_names"] == {"0": "R", "1": "G", "2": "B"} and dataset["file_ending"] == ".png"
    assert dataset["labels"] == {"background": 0, "disc": [1, 2], "cup": [2]} and dataset["regions_class_order"] == [
        1,
        2,
    ]
    rgb = np.asarray(Image.open(dataset_dir / "imagesTr" / "site1__s1_000_0000.png"))
    np.testing.assert_array_equal(np.moveaxis(rgb, -1, 0), fed.sites[0].cases[0].arrays()[0])
    back = tmp_path / "back"
    assert cli("import", "nnunet", str(dataset_dir), "--site-by", IMPORT_REGEX, "--out", str(back)).exit_code == 0
    again = check_folder(back)
    assert again.regions == fed.regions and again.kind == "2d" and again.channels == 3
    label = read_label(back / "site2" / "labels" / "s2_003.png", "2d")
    np.testing.assert_array_equal(label, fed.sites[1].cases[3].arrays()[1])


# --- errors: one line, nothing written ------------------------------------------------------------------------------


def _set_json(src: Path, **changes) -> None:
    data = json.loads((src / "dataset.json").read_text())
    data.update(changes)
    (src / "dataset.json").write_text(json.dumps(data))


def _rename_json_key(src: Path, key: str, to: str) -> None:
    data = json.loads((src / "dataset.json").read_text())
    data[to] = data.pop(key)
    (src / "dataset.json").write_text(json.dumps(data))


_FLIP_X = np.array([[-1, 0, 0, SHAPE[0] - 1], [0, 1, 0, 0], [0, 0, 1, 0], [0, 0, 0, 1.0]])  # the x axis reversed
_SHIFT_Y = np.array([[0, 0, 0, 0], [0, 0, 0, 5.0], [0, 0, 0, 0], [0, 0, 0, 0]])  # the origin 5 mm along y


def _second_channel_of_bwh_001(src: Path, shape: tuple[int, ...], affine: np.ndarray) -> None:
    """Rewrite case BWH_001's ``_0001`` file with ``shape`` and ``affine`` (its ``_0000`` keeps SHAPE and AFFINE)."""
    _nifti(src / "imagesTr" / "BWH_001_0001.nii.gz", np.zeros(shape, np.int16), affine)


@pytest.mark.parametrize(
    ("breaks", "site_by", "expected"),
    [
        (lambda src: (src / "dataset.json").unlink(), None, "{src}/dataset.json: missing (an nnU-Net v2 dataset"),
        (
            lambda src: (src / "imagesTr" / "BWH_001_0001.nii.gz").unlink(),
            None,
            "{src}/imagesTr/BWH_001_0001.nii.gz: missing (channel 1 'ADC' of case 'BWH_001')",
        ),
        (
            lambda src: (src / "imagesTr" / "BWH_001_0001.nii.gz").rename(src / "imagesTr" / "BWH_001_0001.nii"),
            None,
            "{src}/imagesTr/BWH_001_0001.nii.gz: missing (channel 1 'ADC' of case 'BWH_001'; BWH_001_0001.nii lies "
            "there, not ending with the \"file_ending\" '.nii.gz' of {src}/dataset.json: store it as "
            "BWH_001_0001.nii.gz)",
        ),
        (
            lambda src: (src / "labelsTr" / "AMC_002.nii.gz").unlink(),
            None,
            "{src}/labelsTr/AMC_002.nii.gz: missing (the label of case 'AMC_002')",
        ),
        (
            lambda src: (src / "labelsTr" / "AMC_002.nii.gz").rename(src / "labelsTr" / "AMC_002.nii"),
            None,
            "{src}/labelsTr/AMC_002.nii.gz: missing (the label of case 'AMC_002'; AMC_002.nii lies there, not ending "
            "with the \"file_ending\" '.nii.gz' of {src}/dataset.json: store it as AMC_002.nii.gz)",
        ),
        (lambda src: None, "^(AMC|BWH)_", "--site-by '^(AMC|BWH)_': does not match case 'CHU_000' (and 3 more cases)"),
        (
            lambda src: None,
            "{tmp}/sites.csv",
            "{tmp}/sites.csv: no site for case 'CHU_000' (add a row CHU_000,<site>) (and 3 more cases)",
        ),
        (
            lambda src: _set_json(src, file_ending=".tif"),
            None,
            "{src}/dataset.json: \"file_ending\" '.tif' is not a format fedseg reads (readable: .nii.gz, .nii",
        ),
        (
            lambda src: _set_json(src, file_ending="nii.gz"),  # nnU-Net's own files always have the dot
            None,
            "{src}/dataset.json: \"file_ending\" 'nii.gz' is not a format fedseg reads (readable: {readable}); "
            "missing the leading dot? '.nii.gz'",
        ),
        (
            lambda src: _set_json(src, file_ending=".mhd"),
            None,
            "{src}/dataset.json: \"file_ending\" '.mhd': a MetaImage .mhd header is a file apart from its data: "
            "convert the dataset to .mha",
        ),
        (
            lambda src: _rename_json_key(src, "channel_names", "channel_name"),
            None,
            '{src}/dataset.json: missing "channel_names" (the file has "channel_name": misspelt?)',
        ),
        (
            lambda src: _set_json(src, numTraining=8),
            None,
            '{src}/dataset.json: "numTraining" is 8 but {src}/imagesTr holds 9 cases',
        ),
        (
            lambda src: _set_json(src, file_ending=".nii"),  # the files are .nii.gz
            None,
            '{src}/dataset.json: "numTraining" is 9 but {src}/imagesTr holds 0 cases (none ends with its '
            "\"file_ending\" '.nii'; the files there end with '.nii.gz')",
        ),
        (
            lambda src: _set_json(src, labels={"background": 0, "liver": 1, "tumour": 2, "ignore": 1}),
            None,
            '{src}/dataset.json: "labels": "ignore": 1 is a region\'s label value; the ignore label must lie in no '
            "region",
        ),
        (
            lambda src: _set_json(src, labels={"background": 0, "a": [1, 2], "b": 2}),
            None,
            '{src}/dataset.json: "regions_class_order": region-based labels need a list of 2 label values, got None',
        ),
        (
            lambda src: (src / "imagesTr" / "AMC_000_0002.nii.gz").write_bytes(b""),
            None,
            "{src}/imagesTr/AMC_000_0002.nii.gz: channel 2 of case 'AMC_000' is not in {src}/dataset.json "
            "channel_names (0..1)",
        ),
        (
            lambda src: (src / "splits_final.json").write_text(
                json.dumps([{"train": ["AMC_000"], "val": ["AMC_000"]}])
            ),
            None,
            "{src}/splits_final.json: fold 0 lists case 'AMC_000' in both train and val",
        ),
        *(
            (
                functools.partial(_second_channel_of_bwh_001, shape=shape, affine=affine),
                None,
                "{src}/imagesTr/BWH_001_0001.nii.gz: not on the grid of the first channel BWH_001_0000.nii.gz (" + why,
            )
            for shape, affine, why in (
                (SHAPE, AFFINE @ np.diag([1, 1, 2, 1]), "spacing (0.8, 0.8, 5) vs (0.8, 0.8, 2.5) mm)"),
                (SHAPE, AFFINE @ _FLIP_X, "an axis flipped or rotated: voxel axes [[-0.8,"),
                (SHAPE, AFFINE + _SHIFT_Y, "origin (-4, 12, 12) vs (-4, 7, 12) mm)"),
                ((10, 9, 5), AFFINE, "shape (10, 9, 5) vs (10, 9, 6))"),
            )
        ),
    ],
    ids=[
        "no-dataset-json",
        "channel-file",
        "channel-other-ending",
        "label-file",
        "label-other-ending",
        "regex",
        "csv-site",
        "file-ending",
        "file-ending-without-dot",
        "mhd-file-ending",
        "misspelt-key",
        "num-training",
        "wrong-file-ending",
        "ignore-label",
        "regions-order",
        "extra-channel",
        "splits-final",
        "channel-spacing",
        "channel-flipped",
        "channel-origin",
        "channel-shape",
    ],
)
def test_bad_nnunet_input_fails_with_one_line_and_writes_nothing(tmp_path, breaks, site_by, expected):
    src = nnunet_dataset(tmp_path / "Dataset501_Liver")
    rows = [f"{s}_{i:03d},{s.lower()}" for s in ("AMC", "BWH") for i in range(4)]
    (tmp_path / "sites.csv").write_text("case,site\n" + "\n".join(rows) + "\n")
    breaks(src)
    out = tmp_path / "fed"
    args = ["import", "nnunet", str(src), "--out", str(out)]
    if site_by is not None:
        args += ["--site-by", site_by.format(tmp=tmp_path)]
    line = one_line_error(cli(*args))
    readable = ", ".join(readable_endings())
    assert expected.format(src=src, tmp=tmp_path, readable=readable) in line, line
    assert not out.exists() and not [p for p in tmp_path.iterdir() if p.name.startswith(".fed.")]


def error_lines(result) -> list[str]:
    """The errors of a failed command that found several problems (exit 1, no traceback, ``error: cannot import (N
    problems):`` then one indented line each): those lines."""
    assert result.exit_code == 1, result.output
    assert "Traceback" not in result.output
    header, *lines = result.output.strip().splitlines()
    assert header == f"error: cannot import ({len(lines)} problems):", result.output
    assert all(line.startswith("  ") for line in lines), result.output
    return [line.strip() for line in lines]


def test_a_dataset_json_with_three_mistakes_names_all_three_in_one_import(tmp_path):
    """A hand-written dataset.json with three independent mistakes: one import lists them all, a line each naming the
    file and the field (it stopped at the first: three imports to see them)."""
    src = nnunet_dataset(tmp_path / "Dataset501_Liver", sites=("AMC",), per_site=2, test_per_site=0)
    _rename_json_key(src, "channel_names", "channel_name")
    _set_json(src, file_ending=".mhd", numTraining="2")
    out = tmp_path / "fed"
    assert error_lines(cli("import", "nnunet", str(src), "--out", str(out))) == [
        f'{src}/dataset.json: missing "channel_names" (the file has "channel_name": misspelt?)',
        f"{src}/dataset.json: \"file_ending\" '.mhd': a MetaImage .mhd header is a file apart from its data: convert "
        "the dataset to .mha",
        f"{src}/dataset.json: \"numTraining\": expected a positive integer, got '2'",
    ]
    assert not out.exists()


@pytest.mark.parametrize(
    ("labels", "expected"),
    [
        (  # a label value at fault: the regions are unknown, so regions_class_order is not checked against them
            {"background": 0, "whole": [1, 2], "core": "2"},
            ["\"labels\": 'core': expected a label value or a list of them, got '2'"],
        ),
        (  # the background's value at fault: not also "expected one background entry"
            {"background": "0", "liver": 1},
            ["\"labels\": 'background': expected a label value or a list of them, got '0'"],
        ),
        (  # not an object: nothing in it is checked, nor regions_class_order
            [{"background": 0}, {"whole": [1, 2]}],
            ["\"labels\": expected an object name -> value, got [{'background': 0}, {'whole': [1, 2]}]"],
        ),
        (  # an ignore label at fault and a missing regions_class_order are two faults: the other labels' regions
            {"background": 0, "whole": [1, 2], "core": 2, "ignore": [3]},  # counted
            [
                '"labels": "ignore": expected a positive integer label value, got [3]',
                '"regions_class_order": region-based labels need a list of 2 label values, got None',
            ],
        ),
    ],
    ids=["label-value", "background-value", "labels-not-object", "ignore-and-regions-order"],
)
def test_a_check_that_needs_a_field_at_fault_is_skipped_not_reported_as_a_second_fault(tmp_path, labels, expected):
    """Each dataset.json below also has an unreadable file_ending (an independent fault, listed too); a check that
    needs a field at fault is skipped, so each fault is one line and no line follows from another."""
    src = nnunet_dataset(tmp_path / "Dataset502_Brats", sites=("X",), per_site=2, test_per_site=0)
    data = json.loads((src / "dataset.json").read_text())
    data.pop("regions_class_order", None)
    (src / "dataset.json").write_text(json.dumps({**data, "labels": labels, "file_ending": ".tif"}))
    lines = error_lines(cli("import", "nnunet", str(src), "--out", str(tmp_path / "fed")))
    assert lines[:-1] == [f"{src}/dataset.json: {line}" for line in expected]
    assert lines[-1].startswith(f"{src}/dataset.json: \"file_ending\" '.tif' is not a format fedseg reads"), lines


def test_several_dataset_folders_report_the_dataset_json_faults_of_each_in_one_import(tmp_path):
    """One dataset per hospital, two hand-written dataset.json files each with a fault (a third folder missing): one
    import names them all, each line its own file, before any case is read."""
    a = nnunet_dataset(tmp_path / "Dataset501_HospA", sites=("hospA",), per_site=2, test_per_site=0)
    b = nnunet_dataset(tmp_path / "Dataset502_HospB", sites=("hospB",), per_site=2, test_per_site=0)
    c = tmp_path / "Dataset503_HospC"
    _set_json(a, numTraining=0)
    _set_json(b, channel_names={"1": "T2", "2": "ADC"})
    (b / "labelsTr" / "hospB_000.nii.gz").unlink()  # a case-level fault: not reached while a dataset.json is at fault
    out = tmp_path / "fed"
    assert error_lines(cli("import", "nnunet", str(a), str(b), str(c), "--out", str(out))) == [
        f'{a}/dataset.json: "numTraining": expected a positive integer, got 0',
        f"{b}/dataset.json: \"channel_names\": expected {{\"0\": name, \"1\": name, ...}}, got {{'1': 'T2', '2': "
        "'ADC'}",
        f"{c}: not a folder (expected an nnU-Net v2 dataset folder: dataset.json, imagesTr/, labelsTr/)",
    ]
    assert not out.exists()


def test_the_case_problems_of_every_dataset_and_of_imagests_come_in_one_import(tmp_path):
    """Case-level problems stopped at the first dataset that had any, and imagesTr's hid imagesTs's: one import now
    lists a missing label in each of two datasets and a test case without its second channel."""
    a = nnunet_dataset(tmp_path / "Dataset501_HospA", sites=("hospA",), per_site=2, test_per_site=1)
    b = nnunet_dataset(tmp_path / "Dataset502_HospB", sites=("hospB",), per_site=2, test_per_site=0)
    (a / "labelsTr" / "hospA_000.nii.gz").unlink()
    (a / "imagesTs" / "hospA_002_0001.nii.gz").unlink()
    (b / "labelsTr" / "hospB_001.nii.gz").unlink()
    out = tmp_path / "fed"
    lines = error_lines(cli("import", "nnunet", str(a), str(b), "--out", str(out)))
    assert sorted(lines) == [  # grouped by kind (writer.raise_problems)
        f"{a}/imagesTs/hospA_002_0001.nii.gz: missing (channel 1 'ADC' of case 'hospA_002')",
        f"{a}/labelsTr/hospA_000.nii.gz: missing (the label of case 'hospA_000')",
        f"{b}/labelsTr/hospB_001.nii.gz: missing (the label of case 'hospB_001')",
    ]
    assert not out.exists()


def test_bad_export_requests_fail_with_one_line(tmp_path, disc_federation):
    write_folder(disc_federation(n_sites=2, cases_per_site=4, size=16), tmp_path / "discs")
    fed, raw = str(tmp_path / "discs"), str(tmp_path / "raw")
    assert one_line_error(cli("export", "nnunet", fed, "--id", "1000", "--out", raw)) == (
        "--id 1000: an nnU-Net dataset id is 1..999"
    )
    assert "no such site" in one_line_error(cli("export", "nnunet", fed, "--site", "site9", "--out", raw))
    assert "exclude each other" in one_line_error(
        cli("export", "nnunet", fed, "--pooled", "--site", "site1", "--out", raw)
    )
    assert "--all-folds needs a k-fold split" in one_line_error(
        cli("export", "nnunet", fed, "--all-folds", "--out", raw)
    )
    assert "unknown export format 'msd'" in one_line_error(cli("export", "msd", fed, "--out", raw))
    assert "not a federation folder" in one_line_error(cli("export", "nnunet", str(tmp_path / "nope"), "--out", raw))
    assert cli("export", "nnunet", fed, "--id", "12", "--out", raw).exit_code == 0
    taken = one_line_error(cli("export", "nnunet", fed, "--id", "12", "--name", "other", "--out", raw))
    assert taken == f"{raw}/Dataset012_discs: exists; nnU-Net dataset ids are unique, choose another --id"
    assert sorted(p.name for p in Path(raw).iterdir()) == ["Dataset012_discs"]  # no temporary folder left


def test_a_built_in_federation_exports_with_the_split_a_run_uses(tmp_path):
    from fedseg.data.cli import _synth_source
    from fedseg.data.sources import build_builtin

    # the demo run preset: synthetic-retina at scale 0.25
    result = cli("export", "nnunet", "demo", "--site", "site2", "--id", "42", "--out", str(tmp_path))
    assert result.exit_code == 0, result.output
    source, scale, size, seed, split = _synth_source("demo")  # what `data synth --preset demo` and a run use
    splits = make_splits(build_builtin(source, scale, size, seed), split, seed)["site2"]
    dataset_dir = tmp_path / "Dataset042_synthetic-retina"
    (fold,) = json.loads((dataset_dir / "splits_final.json").read_text())
    assert fold == {
        "train": [c for c, s in splits.items() if s == "train"],
        "val": [c for c, s in splits.items() if s == "val"],
    }
    assert sorted(p.name for p in (dataset_dir / "labelsTs").iterdir()) == sorted(
        f"{c}.png" for c, s in splits.items() if s == "test"
    )


# --- predict on an nnU-Net images folder --------------------------------------------------------------------------


def _two_channel_png_dataset(src: Path) -> Path:
    """A 2D nnU-Net dataset of two grey channels (``_0000`` bright where the square is, ``_0001`` noise), sites
    ``s0``/``s1``: 4 training and 2 labelled test cases each, 24x20 pixels."""
    rng = np.random.default_rng(3)
    for i in range(12):
        split, cid = ("Ts" if i % 6 >= 4 else "Tr"), f"s{i // 6}_{i:03d}"
        label = np.zeros((24, 20), np.uint8)
        top, left = rng.integers(2, 12, 2)
        label[top : top + 9, left : left + 7] = 1
        channels = [rng.integers(0, 60, (24, 20)) + 150 * label, rng.integers(0, 255, (24, 20))]
        for c, pixels in enumerate(channels):
            (src / f"images{split}").mkdir(parents=True, exist_ok=True)
            Image.fromarray(pixels.astype(np.uint8)).save(src / f"images{split}" / f"{cid}_{c:04d}.png")
        (src / f"labels{split}").mkdir(exist_ok=True)
        Image.fromarray(label).save(src / f"labels{split}" / f"{cid}.png")
    dataset = {"channel_names": {"0": "a", "1": "b"}, "labels": {"background": 0, "square": 1}, "numTraining": 8}
    (src / "dataset.json").write_text(json.dumps({**dataset, "file_ending": ".png"}))
    return src


def test_predict_reads_an_imagests_folder_case_by_case_as_the_import_stacked_it(tmp_path, tiny_config):
    from fedseg.cli import app
    from fedseg.config_load import dump_config

    src, fed = _two_channel_png_dataset(tmp_path / "Dataset505_Squares"), tmp_path / "fed"
    assert cli("import", "nnunet", str(src), "--site-by", "^(s[0-9])_", "--out", str(fed)).exit_code == 0
    (tmp_path / "cfg.yaml").write_text(dump_config(tiny_config(algorithms=["fedavg"], fl={"rounds": 1})))
    run = tmp_path / "run"
    runner = CliRunner()
    args = ["run", "--config", str(tmp_path / "cfg.yaml"), "--data", str(fed), "--out", str(run)]
    assert runner.invoke(app, args).exit_code == 0

    def predict(folder: Path, out: Path):
        return runner.invoke(app, ["predict", "--model", str(run / "model"), "--input", str(folder), "--out", str(out)])

    # the imagesTs folder: one input per case, named as nnU-Net names its predictions
    assert predict(src / "imagesTs", tmp_path / "from-nnunet").exit_code == 0
    test_cases = ["s0_004", "s0_005", "s1_010", "s1_011"]
    assert sorted(p.name for p in (tmp_path / "from-nnunet").iterdir()) == sorted(
        [f"{c}.png" for c in test_cases] + ["predictions.csv", "predict.json"]
    )
    rows = (tmp_path / "from-nnunet" / "predictions.csv").read_text().splitlines()
    assert rows[1].startswith("s0_004_0000.png+s0_004_0001.png,s0_004.png,global")
    # the same masks as from the imported federation's stacked images
    imported = tmp_path / "imported"
    imported.mkdir()
    for c in test_cases:
        (imported / f"{c}.npy").symlink_to(fed / c[:2] / "images" / f"{c}.npy")
    assert predict(imported, tmp_path / "from-fed").exit_code == 0
    for c in test_cases:
        mask = np.asarray(Image.open(tmp_path / "from-nnunet" / f"{c}.png"))
        assert mask.shape == (24, 20)
        np.testing.assert_array_equal(mask, np.load(tmp_path / "from-fed" / f"{c}.npy"))

    # one channel file given, the first or the last: its case, read from its folder
    for channel, out in (("0000", tmp_path / "one-first"), ("0001", tmp_path / "one")):
        said = predict(src / "imagesTs" / f"s0_004_{channel}.png", out)
        assert said.exit_code == 0, said.output
        assert sorted(p.name for p in out.iterdir()) == ["predict.json", "predictions.csv", "s0_004.png"]
        assert (out / "predictions.csv").read_text().splitlines()[1].startswith(rows[1].split(",global")[0])
        np.testing.assert_array_equal(
            np.asarray(Image.open(out / "s0_004.png")), np.load(tmp_path / "from-fed" / "s0_004.npy")
        )
    # nnU-Net cases beside an image of another name: each case, and the image
    mixed = tmp_path / "mixed"
    mixed.mkdir()
    for f in (src / "imagesTs").iterdir():
        (mixed / f.name).symlink_to(f)
    (mixed / "extra.npy").symlink_to(imported / "s0_004.npy")
    (mixed / "scan_2019.npy").symlink_to(imported / "s0_005.npy")  # named like a channel file, without a _0000
    assert predict(mixed, tmp_path / "from-mixed").exit_code == 0
    assert sorted(p.name for p in (tmp_path / "from-mixed").iterdir()) == sorted(
        [f"{c}.png" for c in test_cases] + ["extra.npy", "scan_2019.npy", "predictions.csv", "predict.json"]
    )
    # a dataset.json of another channel count than the model's: one line
    other = tmp_path / "Dataset509_Other"
    (other / "imagesTs").mkdir(parents=True)
    (other / "dataset.json").write_text(json.dumps({"channel_names": {"0": "CT"}, "file_ending": ".png"}))
    (other / "imagesTs" / "x_0000.png").symlink_to(src / "imagesTs" / "s0_004_0000.png")
    line = one_line_error(predict(other / "imagesTs", tmp_path / "broken"))
    assert f"{other / 'dataset.json'}: lists 1 channels (CT) but the model reads 2" in line
    # a channel the model does not read, a dataset's root instead of its images: one line each, nothing written
    (mixed / "s1_010_0002.png").symlink_to(src / "imagesTs" / "s1_010_0001.png")
    result = predict(mixed, tmp_path / "broken")
    assert "s1_010_0002.png: channel 2 of nnU-Net case 's1_010', but the model reads 2 channels" in one_line_error(
        result
    )
    result = predict(src, tmp_path / "broken")
    assert f"a dataset folder (dataset.json); give the folder of images: --input {src / 'imagesTs'}" in " ".join(
        result.output.split()
    )
    assert one_line_error(result) and not (tmp_path / "broken").exists()
    # a case without its second channel file: named; every case without it: the first three, then a count
    (src / "imagesTs" / "s1_011_0001.png").unlink()
    result = predict(src / "imagesTs", tmp_path / "broken")
    assert one_line_error(result) and not (tmp_path / "broken").exists()
    assert "s1_011_0001.png: missing (channel 1 of nnU-Net case 's1_011'" in " ".join(result.output.split())
    for c in test_cases[:-1]:
        (src / "imagesTs" / f"{c}_0001.png").unlink()
    result = predict(src / "imagesTs", tmp_path / "broken")
    output = " ".join(result.output.split())
    assert result.exit_code == 1 and "Traceback" not in output
    assert "s0_004_0001.png: missing" in output and output.endswith("... and 1 more like this")
    # numbered images that are not channels (img_0000, img_0001) are predicted one by one
    frames = tmp_path / "frames"
    frames.mkdir()
    for i, c in enumerate(test_cases[:2]):
        (frames / f"img_{i:04d}.npy").symlink_to(fed / c[:2] / "images" / f"{c}.npy")
    assert predict(frames, tmp_path / "from-frames").exit_code == 0
    assert sorted(p.name for p in (tmp_path / "from-frames").iterdir()) == [
        "img_0000.npy",
        "img_0001.npy",
        "predict.json",
        "predictions.csv",
    ]
    assert predict(frames / "img_0001.npy", tmp_path / "one-frame").exit_code == 0  # that image only
    assert sorted(p.name for p in (tmp_path / "one-frame").iterdir()) == [
        "img_0001.npy",
        "predict.json",
        "predictions.csv",
    ]


def test_channel_order_is_same_reordered_other_names_or_unknown():
    from fedseg.data.federation import channel_order

    assert channel_order(["T1", "FLAIR"], [" t1", "Flair "]) == "same"
    assert channel_order(["T1", "FLAIR"], ["FLAIR", "T1"]) == "reordered"
    assert channel_order(["T1", "FLAIR"], ["T1w", "FLAIR"]) == "other names"
    assert channel_order(["T1", "FLAIR"], ["flair", "T1w"]) == "reordered"  # FLAIR comes first there
    assert channel_order(["T1", "T2", "FLAIR"], ["T1", "FLAIR", "T2w"]) == "reordered"
    assert channel_order(["T2"], ["MRI"]) == "other names"  # one channel: never reordered
    assert channel_order(["T1", "FLAIR"], ["channel0", "channel1"]) == "unknown"  # an export's placeholders
    assert channel_order(["T1", "FLAIR"], ["T1"]) == "unknown"


def _bundle_of(fed_root: Path, folder: Path, tiny_config) -> Path:
    """A ``global`` bundle (untrained weights) written by the run's own ``write_bundle_files`` from the federation
    at ``fed_root``, as a run on it writes ``RUN/model/fedavg/``; returns ``folder``."""
    from fedseg.engine.messages import weights_of
    from fedseg.models.factory import build_segmenter
    from fedseg.run.outputs import write_bundle_files

    fed, cfg = load_folder(fed_root), tiny_config(algorithms=["fedavg"])
    network = build_segmenter(cfg.model, fed.spatial_dims, fed.channels, len(fed.regions), seed=0)
    write_bundle_files(folder, {"global": weights_of(network)}, cfg, fed)
    return folder


def test_channel_names_go_from_dataset_json_to_federation_yaml_and_the_bundle_manifest(tmp_path, tiny_config):
    src, fed = nnunet_dataset(tmp_path / "Dataset511_Brain", channels=("T1", "FLAIR")), tmp_path / "fed"
    assert cli("import", "nnunet", str(src), "--site-by", r"^([A-Z]+)_\d+$", "--out", str(fed)).exit_code == 0
    assert yaml.safe_load((fed / "federation.yaml").read_text())["channel_names"] == ["T1", "FLAIR"]
    assert load_folder(fed).channel_names == ["T1", "FLAIR"]
    bundle = _bundle_of(fed, tmp_path / "model" / "fedavg", tiny_config)
    manifest = json.loads((bundle / "manifest.json").read_text())
    assert manifest["in_channels"] == 2 and manifest["channel_names"] == ["T1", "FLAIR"]


def test_predict_refuses_a_dataset_that_numbers_the_channels_otherwise_and_reads_one_that_matches(
    tmp_path, tiny_config
):
    """The model read channel ``a`` from ``_0000`` and ``b`` from ``_0001`` (the training dataset's
    ``channel_names``, carried by the import into the bundle). A test set whose ``dataset.json`` says ``_0000`` is
    ``b`` is refused before anything is predicted, in one line giving both orders; one that says ``a, b`` (case and
    spaces aside) is predicted, and the channel order the model reads is said."""
    from fedseg.cli import app
    from fedseg.predict import predict

    src, fed = _two_channel_png_dataset(tmp_path / "Dataset512_Squares"), tmp_path / "fed"
    assert cli("import", "nnunet", str(src), "--site-by", "^(s[0-9])_", "--out", str(fed)).exit_code == 0
    bundle = _bundle_of(fed, tmp_path / "model" / "fedavg", tiny_config)
    dataset_json = json.loads((src / "dataset.json").read_text())

    _set_json(src, channel_names={"0": "b", "1": "a"})
    result = CliRunner().invoke(
        app, ["predict", "--model", str(bundle), "--input", str(src / "imagesTs"), "--out", str(tmp_path / "swapped")]
    )
    assert " ".join(one_line_error(result).split()) == (
        f"{src / 'dataset.json'}: channel names b, a but the model reads a, b (channel _0000 = a, _0001 = b; "
        f"{bundle / 'manifest.json'}: channel_names): renumber the files (and dataset.json) to the model's order, "
        "or use a model trained on this one"
    )
    assert not (tmp_path / "swapped").exists()
    one_file = src / "imagesTs" / "s0_004_0000.png"  # a channel file given alone: its dataset.json found too
    with pytest.raises(ValueError, match="channel names b, a but the model reads a, b"):
        predict(bundle, one_file, tmp_path / "one")

    _set_json(src, channel_names={"0": " A", "1": "b"})
    notes: list[str] = []
    rows = predict(bundle, src / "imagesTs", tmp_path / "matching", notes=notes)
    assert [r["mask"] for r in rows] == ["s0_004.png", "s0_005.png", "s1_010.png", "s1_011.png"]
    assert notes == [
        "the model reads 2 channels in this order: _0000 = a, _0001 = b (an nnU-Net case's files; a file holding "
        f"them all, in the same order), as {src / 'dataset.json'} lists them"
    ]
    said = CliRunner().invoke(
        app, ["predict", "--model", str(bundle), "--input", str(src / "imagesTs"), "--out", str(tmp_path / "cli")]
    )
    assert said.exit_code == 0 and notes[0] in " ".join(said.output.split()), said.output  # the command says it too
    _set_json(src, channel_names={"0": "a2", "1": "b"})  # other names: no order to compare; said, not refused
    notes = []
    assert len(predict(bundle, src / "imagesTs", tmp_path / "other-names", notes=notes)) == 4
    assert notes[0].endswith(f"; {src / 'dataset.json'} names them a2, b: check they are these, in this order")
    (src / "dataset.json").write_text(json.dumps({**dataset_json, "channel_names": None}))  # names nothing: as before
    notes = []
    assert len(predict(bundle, src / "imagesTs", tmp_path / "unnamed", notes=notes)) == 4
    assert notes == [
        "the model reads 2 channels in this order: _0000 = a, _0001 = b (an nnU-Net case's files; a file holding "
        "them all, in the same order)"
    ]


def test_a_one_channel_model_refuses_a_second_volume_channel_but_reads_numbered_series_as_images(tmp_path):
    """For a one-channel model, 3D ``<case>_0000``, ``<case>_0001`` files in an nnU-Net ``imagesTs/`` are a case's
    channels (a CT model given a T1 and a T2): the file it does not read is named, as a two-channel model's ``_0002``
    is, rather than each volume segmented as an image. Elsewhere numbered volumes, and 2D ``frame_0000.png``,
    ``frame_0001.png``, are a series: each an image, as before."""
    import shutil

    from fedseg.predict_model import PredictError
    from fedseg.predict_nnunet import Source, nnunet_cases

    src = nnunet_dataset(tmp_path / "Dataset508_Ct", sites=("AMC",), per_site=1)  # T2 and ADC channel files
    volumes = sorted((src / "imagesTs").glob("AMC_001_*.nii.gz"))
    with pytest.raises(PredictError) as e:
        nnunet_cases(volumes, 1, "3d")
    assert str(e.value) == (
        f"{volumes[1]}: channel 1 of nnU-Net case 'AMC_001', but the model reads one channel, _0000 (move the file "
        "out of the folder)"
    )
    assert nnunet_cases(volumes, 2, "3d") == [Source(tuple(volumes), "AMC_001")]
    series = tmp_path / "series"
    series.mkdir()
    scans = [Path(shutil.copy(v, series / f"scan_{k:04d}.nii.gz")) for k, v in enumerate(volumes)]
    assert nnunet_cases(scans, 1, "3d") == [Source((scans[0],)), Source((scans[1],))]
    frames = []
    for k in range(2):
        frames.append(tmp_path / f"frame_{k:04d}.png")
        Image.fromarray(np.full((8, 8), 10 * k, np.uint8)).save(frames[-1])
    assert nnunet_cases(frames, 1, "2d") == [Source((frames[0],)), Source((frames[1],))]


def test_stacked_channel_files_must_share_one_grid(tmp_path):
    """``fedseg predict`` stacks an nnU-Net case's channel files as the import does: only on one grid."""
    from fedseg.data.importers.nnunet import stacked_channels

    src = nnunet_dataset(tmp_path / "Dataset510_Grid", sites=("AMC",), per_site=1)
    channels = tuple(src / "imagesTs" / f"AMC_001_{c:04d}.nii.gz" for c in range(2))
    assert stacked_channels(channels, "3d").shape == (2, *SHAPE)
    _nifti(channels[1], np.zeros(SHAPE, np.int16), AFFINE + _SHIFT_Y)
    with pytest.raises(FederationError) as e:
        stacked_channels(channels, "3d")
    assert str(e.value).startswith(
        f"{channels[1]}: not on the grid of the first channel AMC_001_0000.nii.gz "
        "(origin (-4, 12, 12) vs (-4, 7, 12) mm)"
    )


def test_a_raw_dataset_given_as_a_federation_says_which_import_makes_one(tmp_path):
    src = nnunet_dataset(tmp_path / "Dataset506_Raw", sites=("AMC",), per_site=2)
    line = one_line_error(cli("check", str(src)))
    assert line == (
        f"{src}: a raw nnU-Net v2 dataset (dataset.json, imagesTr/), not a federation folder (no federation.yaml); "
        f"import it first: fedseg data import nnunet {src} --site-by REGEX --out FED, then use FED"
    )
    (src / "dataset.json").write_text(json.dumps({"name": "Prostate", "modality": {"0": "T2"}, "training": []}))
    with pytest.raises(
        FederationError, match=r"a raw Medical Segmentation Decathlon \(or nnU-Net v1\) task .* data import msd "
    ):
        load_folder(src)
    # a path with a space: quoted in the command, so that it pastes into a shell as one argument
    spaced = nnunet_dataset(tmp_path / "raw data" / "Dataset506_Raw", sites=("AMC",), per_site=2)
    line = one_line_error(cli("check", str(spaced)))
    assert f"import it first: fedseg data import nnunet '{spaced}' --site-by REGEX --out FED, then use FED" in line
    # the folder above several institutions' task folders (a fresh-eyes run got 5 lines and no hint)
    parent = tmp_path / "raw"
    for name in ("Task07_Pancreas", "Task90_NIH"):
        nnunet_dataset(parent / name, sites=("AMC",), per_site=2)
        (parent / name / "dataset.json").write_text(json.dumps({"modality": {"0": "CT"}, "training": []}))
    line = one_line_error(cli("check", str(parent)))
    assert line.startswith(f"{parent}: 2 raw task folder(s) (dataset.json, imagesTr/), not a federation folder")
    assert f"fedseg data import msd {parent / 'Task07_Pancreas'} {parent / 'Task90_NIH'} --out FED, then" in line
    # each hospital's own nnU-Net v2 dataset side by side: the nnunet import takes them all (not msd, which refuses
    # their dataset.json)
    hospitals = tmp_path / "nnUNet_raw"
    for name in ("Dataset501_HospA", "Dataset502_HospB"):
        nnunet_dataset(hospitals / name, sites=("AMC",), per_site=2)
    line = one_line_error(cli("check", str(hospitals)))
    assert line == (
        f"{hospitals}: 2 raw task folder(s) (dataset.json, imagesTr/), not a federation folder (no federation.yaml); "
        f"import them first, one site per task: fedseg data import nnunet {hospitals / 'Dataset501_HospA'} "
        f"{hospitals / 'Dataset502_HospB'} --out FED, then use FED"
    )


def test_a_linked_import_whose_raw_dataset_moved_is_one_line_naming_where_it_was(tmp_path):
    """The import links the source files; moving the raw dataset afterwards breaks every link at once: one line that
    says where the files were, not a line per link and the images without labels and empty sites that follow."""
    src, fed = (
        nnunet_dataset(tmp_path / "Dataset511_Moved", sites=("AMC", "BWH"), per_site=2, channels=("CT",)),
        tmp_path / "fed",
    )
    assert cli("import", "nnunet", str(src), "--site-by", r"^([A-Z]+)_\d+$", "--out", str(fed)).exit_code == 0
    src.rename(tmp_path / "elsewhere")
    where = src.resolve()
    expected = (
        f"12 files of {fed} link to {where}, which no longer exists (e.g. AMC/images/AMC_000.nii.gz -> "
        f"{where}/imagesTr/AMC_000_0000.nii.gz); the raw data moved? import it again, or restore it where it was"
    )
    assert one_line_error(cli("check", str(fed))) == expected
    with pytest.raises(FederationError) as e:
        load_folder(fed)  # what a run reads
    assert str(e.value) == expected
    (tmp_path / "elsewhere").rename(src)
    assert cli("check", str(fed)).exit_code == 0


def test_test_images_without_labels_are_left_out_with_a_note_that_says_how_to_segment_them(tmp_path):
    import shutil

    src = nnunet_dataset(tmp_path / "raw data" / "Dataset507_NoLabelsTs", sites=("AMC", "BWH"), per_site=3)
    shutil.rmtree(src / "labelsTs")
    for c in range(2):  # a case id with a dot
        shutil.copy(src / "imagesTs" / f"AMC_003_{c:04d}.nii.gz", src / "imagesTs" / f"la.001_{c:04d}.nii.gz")
    result = cli("import", "nnunet", str(src), "--site-by", r"^([A-Z]+)_\d+$", "--out", str(tmp_path / "fed"))
    assert result.exit_code == 0, result.output
    output = " ".join(result.output.split())
    assert "2 sites, 6 cases" in output
    assert (
        f"note: {src / 'imagesTs'}: its 3 case(s) are not imported (no labelsTs/: a test case needs its label); to "
        f"segment them after training: fedseg predict --model RUN/model --input '{src / 'imagesTs'}' --out MASKS"
    ) in output  # the path quoted: it holds a space


def test_an_unlabelled_test_image_beside_labelled_ones_is_left_out_with_a_note(tmp_path):
    """imagesTs/ with labelsTs/ where one case has no label (a case kept for inference): the labelled test cases are
    imported, that one is named in a note, as an imagesTs/ without any labels is (it used to stop the import)."""
    import shutil

    src = nnunet_dataset(tmp_path / "Dataset509_OneUnlabelled", sites=("AMC", "BWH"), per_site=3)
    for c in range(2):
        shutil.copy(src / "imagesTs" / f"AMC_003_{c:04d}.nii.gz", src / "imagesTs" / f"AMC_new_{c:04d}.nii.gz")
    result = cli("import", "nnunet", str(src), "--site-by", r"^([A-Z]+)_", "--out", str(tmp_path / "fed"))
    assert result.exit_code == 0, result.output
    output = " ".join(result.output.split())
    assert "2 sites, 8 cases" in output, output
    assert (
        f"note: {src / 'imagesTs'}: its 1 case(s) without a label in labelsTs/ (AMC_new) are not imported (a test "
        "case needs its label); to segment them after training:"
    ) in output
    assert "AMC_new" not in {c.id for s in load_folder(tmp_path / "fed").sites for c in s.cases}


def test_a_dataset_imported_without_site_by_as_one_site_gets_a_note(tmp_path):
    """Without --site-by every case of one dataset goes to one site (a fresh-eyes run found no word of it): the
    import says so and how to name the hospitals; with --site-by naming several, nothing is said."""
    src = nnunet_dataset(tmp_path / "Dataset503_Prostate", sites=("X", "Y"), per_site=3)
    one = cli("import", "nnunet", str(src), "--out", str(tmp_path / "one"))
    assert one.exit_code == 0, one.output
    said = " ".join(one.output.split())
    assert "one site (" in said and "holds all 8 cases: a federated run needs several; give --site-by" in said, said
    several = cli("import", "nnunet", str(src), "--site-by", "^([A-Z])_", "--out", str(tmp_path / "several"))
    assert several.exit_code == 0 and "a federated run needs several" not in several.output, several.output
