"""``fedseg data import``: each layout, written in its real form by the test, imports into a folder federation
that passes ``data check`` and trains for a round; malformed sources fail with one message naming the file."""

from __future__ import annotations

import json
import re
from pathlib import Path

import nibabel as nib
import numpy as np
import pytest
import yaml
from PIL import Image
from typer.testing import CliRunner

from fedseg.data.case_files import read_image, read_label
from fedseg.data.check import check_folder
from fedseg.data.cli import data_app

SHAPE = (12, 12, 8)
SPACING = (0.9, 0.9, 2.5)  # anisotropic, as most clinical MR
AFFINE = np.diag([*SPACING, 1.0])
AFFINE[:3, 3] = (-5.0, 3.0, 10.0)


def _nifti(path: Path, data: np.ndarray, affine: np.ndarray = AFFINE) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    nib.save(nib.Nifti1Image(data, affine), path)


def _spheres(rng: np.random.Generator, shape=SHAPE) -> tuple[np.ndarray, np.ndarray]:
    """Three nested balls around a random centre: distance map in voxels and the centre."""
    grid = np.stack(np.meshgrid(*(np.arange(n) for n in shape), indexing="ij"), -1)
    center = np.array(shape) / 2 + rng.uniform(-1.5, 1.5, 3)
    return np.linalg.norm(grid - center, axis=-1), center


def brats_label(rng: np.random.Generator, dtype=np.uint8) -> np.ndarray:
    """BraTS labels: edema 2 around a core 1 with an enhancing rim 4."""
    dist, _ = _spheres(rng)
    label = np.zeros(SHAPE, np.uint8)
    label[dist < 4.5] = 2
    label[dist < 3.0] = 4
    label[dist < 1.8] = 1
    return label.astype(dtype)


def fets_layout(root: Path, partition_sizes=(3, 3), extra_split: bool = True) -> Path:
    """A FeTS2022 training folder: subjects FeTS2022_00000... with t1 (int16), t1ce, t2 (float32), flair (int16),
    seg (uint8 for even subjects, float32 for odd ones, as in the real release), and both partitionings."""
    rng = np.random.default_rng(0)
    rows1, rows2, k = [], [], 0
    for pid, n in enumerate(partition_sizes, start=1):
        for _ in range(n):
            sid = f"FeTS2022_{k:05d}"
            label = brats_label(rng, np.uint8 if k % 2 == 0 else np.float32)
            for m, dtype in (("t1", np.int16), ("t1ce", np.float32), ("t2", np.float32), ("flair", np.int16)):
                image = rng.normal(300, 30, SHAPE) + 400 * (label > 0)
                _nifti(root / sid / f"{sid}_{m}.nii.gz", image.astype(dtype))
            _nifti(root / sid / f"{sid}_seg.nii.gz", label)
            rows1.append(f"{pid},{sid}")
            rows2.append(f"{pid + (10 if extra_split and pid == 1 and k % 2 else 0)},{sid}")
            k += 1
    (root / "partitioning_1.csv").write_text("Partition_ID,Subject_ID\n" + "\n".join(rows1) + "\n")
    (root / "partitioning_2.csv").write_text("Partition_ID,Subject_ID\n" + "\n".join(rows2) + "\n")
    return root


def msd_task(
    root: Path, name: str = "Pancreas", n: int = 3, modalities=("CT",), seed: int = 0, channel_files: bool = False
) -> Path:
    """An MSD task folder: dataset.json, imagesTr/ (float32, or 4D for several modalities), labelsTr/ (uint8),
    and a stray ``._`` file as the original archives hold. ``channel_files``: an nnU-Net v1 task instead, each listed
    image stored as one file per modality, ``imagesTr/<case>_0000.nii.gz``, ``<case>_0001.nii.gz``, ..."""
    rng = np.random.default_rng(seed)
    training = []
    for i in range(n):
        cid = f"{name.lower()}_{i:03d}"
        dist, _ = _spheres(rng)
        label = np.zeros(SHAPE, np.uint8)
        label[dist < 4.0] = 1
        label[dist < 2.0] = 2
        image = rng.normal(0, 20, (*SHAPE, len(modalities))) + 100 * (label > 0)[..., None]
        if channel_files:
            for c in range(len(modalities)):
                _nifti(root / "imagesTr" / f"{cid}_{c:04d}.nii.gz", image[..., c])
        else:
            _nifti(root / "imagesTr" / f"{cid}.nii.gz", image[..., 0] if len(modalities) == 1 else image)
        _nifti(root / "labelsTr" / f"{cid}.nii.gz", label)
        training.append({"image": f"./imagesTr/{cid}.nii.gz", "label": f"./labelsTr/{cid}.nii.gz"})
    (root / "imagesTr" / f"._{name.lower()}_000.nii.gz").write_bytes(b"\x00\x05\x16\x07 AppleDouble")
    dataset = {
        "name": name,
        "modality": {str(i): m for i, m in enumerate(modalities)},
        "labels": {"0": "background", "1": "pancreas", "2": "cancer"},
        "numTraining": n,
        "training": training,
        "test": [],
    }
    (root / "dataset.json").write_text(json.dumps(dataset, indent=4))
    return root


def prostate_layout(root: Path) -> Path:
    """Two sites: BIDMC (``_segmentation``, labels 0/1 uint8) and HK (``_Segmentation``, float 0/255)."""
    rng = np.random.default_rng(2)
    for site, suffix, value, dtype in (("BIDMC", "segmentation", 1, np.uint8), ("HK", "Segmentation", 255, np.float32)):
        for i in range(3):
            dist, _ = _spheres(rng)
            _nifti(
                root / site / f"Case{i:02d}.nii.gz", (rng.normal(200, 20, SHAPE) + 150 * (dist < 3.5)).astype(np.int16)
            )
            _nifti(root / site / f"Case{i:02d}_{suffix}.nii.gz", ((dist < 3.5) * value).astype(dtype))
    return root


def fundus_source(root: Path, image_ext: str, mask_ext: str, n: int = 3, size: int = 20) -> Path:
    """A fundus collection: RGB images and grey masks 0 (cup), 128 (rim), 255 (background)."""
    rng = np.random.default_rng(len(image_ext))
    yy, xx = np.mgrid[:size, :size]
    for i in range(n):
        d = np.hypot(yy - size / 2 - rng.uniform(-2, 2), xx - size / 2)
        mask = np.full((size, size), 255, np.uint8)
        mask[d < size / 3] = 128
        mask[d < size / 6] = 0
        image = np.stack([200 - 0.4 * mask, 100 - 0.2 * mask, 50 + 0 * mask], -1) + rng.integers(0, 20, (size, size, 3))
        (root / "images").mkdir(parents=True, exist_ok=True)
        (root / "masks").mkdir(parents=True, exist_ok=True)
        Image.fromarray(image.astype(np.uint8)).save(root / "images" / f"img{i:03d}.{image_ext}")
        Image.fromarray(mask).save(root / "masks" / f"img{i:03d}.{mask_ext}")
    return root


def run_import(*args: str):
    return CliRunner().invoke(data_app, ["import", *args])


def one_round(root: Path, run_dir: Path, tiny_config, image_size: int) -> dict:
    """One round of FedAvg on the imported folder; its summary.json."""
    from fedseg.run import run_experiment

    cfg = tiny_config(
        algorithms=["fedavg"],
        data={"source": "folder", "root": str(root), "image_size": image_size},
        fl={"rounds": 1},
        model={"channels": [4, 8]},
    )
    run_experiment(cfg, run_dir)
    return json.loads((run_dir / "summary.json").read_text())


def assert_nothing_written(out: Path) -> None:
    assert not out.exists()
    assert not [p for p in out.parent.iterdir() if p.name.startswith(f".{out.name}.importing-")]


# --- fets2022 -----------------------------------------------------------------------------------


def test_fets2022_imports_checks_and_trains(tmp_path, tiny_config):
    src, out = fets_layout(tmp_path / "FeTS2022"), tmp_path / "fed"
    result = run_import("fets2022", str(src), "--partitioning", "1", "--out", str(out))
    assert result.exit_code == 0, result.output
    assert "data check OK" in result.output and "2 sites, 6 cases" in result.output
    header = yaml.safe_load((out / "federation.yaml").read_text())
    assert header["kind"] == "3d" and header["channels"] == 4
    assert header["regions"] == {"WT": [1, 2, 4], "TC": [1, 4], "ET": [4]}
    assert header["sites"] == {
        "inst01": {"partition_id": 1, "partitioning": 1},
        "inst02": {"partition_id": 2, "partitioning": 1},
    }
    # the image: the 4 modalities as channels (t1, t1ce, t2, flair) with the t1's affine; the seg linked as is
    written = nib.load(out / "inst01" / "images" / "FeTS2022_00000.nii.gz")
    np.testing.assert_allclose(written.affine, AFFINE)
    image = read_image(out / "inst01" / "images" / "FeTS2022_00000.nii.gz", "3d")
    assert image.shape == (4, *SHAPE) and image.dtype == np.float32
    for c, m in enumerate(("t1", "t1ce", "t2", "flair")):
        source = np.asanyarray(nib.load(src / "FeTS2022_00000" / f"FeTS2022_00000_{m}.nii.gz").dataobj)
        np.testing.assert_array_equal(image[c], source)
    seg = out / "inst02" / "labels" / "FeTS2022_00003.nii.gz"
    assert seg.is_symlink() and seg.resolve() == (src / "FeTS2022_00003" / "FeTS2022_00003_seg.nii.gz").resolve()
    assert set(np.unique(read_label(seg, "3d")).tolist()) == {0, 1, 2, 4}
    summary = one_round(out, tmp_path / "run", tiny_config, image_size=12)
    assert summary["sites"] == ["inst01", "inst02"] and summary["regions"] == ["WT", "TC", "ET"]
    # the whole-image path on 3D data says what it does to the volumes, once
    log = (tmp_path / "run" / "run.log").read_text()
    assert log.count("note: every volume is resized to 12x12x12 voxels (data.image_size") == 1


def test_a_brats2021_folder_imports_with_a_partitioning_csv_of_its_subjects(tmp_path):
    """BraTS 2021's own layout (``BraTS2021_NNNNN/BraTS2021_NNNNN_<modality>.nii.gz``): a folder the partitioning CSV
    names is a subject whatever its prefix (it was reported as having no folder, though it had one)."""
    src = fets_layout(tmp_path / "FeTS2022")
    for folder in sorted(src.glob("FeTS2022_*")):
        renamed = src / folder.name.replace("FeTS2022", "BraTS2021")
        folder.rename(renamed)
        for file in renamed.iterdir():
            file.rename(renamed / file.name.replace("FeTS2022", "BraTS2021"))
    csv_path = src / "partitioning_1.csv"
    csv_path.write_text(csv_path.read_text().replace("FeTS2022", "BraTS2021"))
    result = run_import("fets2022", str(src), "--partitioning", "1", "--out", str(tmp_path / "fed"))
    assert result.exit_code == 0, result.output
    fed = check_folder(tmp_path / "fed")
    assert [c.id for s in fed.sites for c in s.cases] == [f"BraTS2021_{k:05d}" for k in range(6)]


def test_fets2022_partitioning_2_and_copy(tmp_path):
    src, out = fets_layout(tmp_path / "FeTS2022"), tmp_path / "fed"
    result = run_import("fets2022", str(src), "--partitioning", "2", "--copy", "--out", str(out))
    assert result.exit_code == 0, result.output
    fed = check_folder(out)
    assert fed.site_names == ["inst01", "inst02", "inst11"]
    assert fed.channel_names == ["t1", "t1ce", "t2", "flair"]  # the order the 4D image stacks them in
    assert [len(s.cases) for s in fed.sites] == [2, 3, 1]
    assert not any(p.is_symlink() for p in out.rglob("*"))


@pytest.mark.parametrize(
    ("breaks", "expected"),
    [
        (
            lambda src: (src / "FeTS2022_00001" / "FeTS2022_00001_t1ce.nii.gz").unlink(),
            r"FeTS2022_00001/FeTS2022_00001_t1ce\.nii\.gz: missing \(each subject folder holds "
            r"FeTS2022_00001_t1\.nii\.gz, FeTS2022_00001_t1ce\.nii\.gz",
        ),
        (
            lambda src: (src / "partitioning_1.csv").write_text(
                "\n".join((src / "partitioning_1.csv").read_text().splitlines()[:-1]) + "\n"
            ),
            r"FeTS2022_00005: subject 'FeTS2022_00005' is not in \S+partitioning_1\.csv "
            r"\(every subject needs a Partition_ID\)",
        ),
        (
            lambda src: _nifti(src / "FeTS2022_00002" / "FeTS2022_00002_seg.nii.gz", np.full(SHAPE, 3, np.uint8)),
            r"FeTS2022_00002/FeTS2022_00002_seg\.nii\.gz: label values 3 are not in any region "
            r"\(regions use 1, 2, 4; 0 is background\)",
        ),
        (
            lambda src: (src / "partitioning_1.csv").write_text("Site,Subject_ID\n1,FeTS2022_00000\n"),
            r"partitioning_1\.csv:1: missing column 'Partition_ID'",
        ),
        (
            lambda src: (src / "partitioning_1.csv").unlink(),
            r"partitioning_1\.csv: missing \(FeTS2022 ships partitioning_1\.csv and partitioning_2\.csv",
        ),
        (
            lambda src: _nifti(
                src / "FeTS2022_00003" / "FeTS2022_00003_flair.nii.gz",
                np.zeros(SHAPE, np.int16),
                AFFINE @ np.diag([1, 1, 2, 1]),
            ),  # twice the t1's slice spacing
            r"FeTS2022_00003/FeTS2022_00003_flair\.nii\.gz: not on the grid of the first channel "
            r"FeTS2022_00003_t1\.nii\.gz \(spacing \(0\.9, 0\.9, 5\) vs \(0\.9, 0\.9, 2\.5\) mm\)",
        ),
    ],
    ids=["missing-modality", "subject-not-in-csv", "label-value", "csv-column", "no-csv", "modality-grid"],
)
def test_fets2022_bad_input_names_the_file_and_writes_nothing(tmp_path, breaks, expected):
    src, out = fets_layout(tmp_path / "FeTS2022"), tmp_path / "fed"
    breaks(src)
    result = run_import("fets2022", str(src), "--out", str(out))
    assert result.exit_code == 1
    assert "Traceback" not in result.output
    assert re.search(expected, " ".join(result.output.split())), result.output
    assert_nothing_written(out)


# --- msd -------------------------------------------------------------------------------------------


def test_msd_tasks_become_sites_with_nested_regions_and_train(tmp_path, tiny_config):
    a = msd_task(tmp_path / "Task07_Pancreas")
    b = msd_task(tmp_path / "NIH_Pancreas", seed=1)
    out = tmp_path / "fed"
    result = run_import("msd", str(a), str(b), "--out", str(out))
    assert result.exit_code == 0, result.output
    header = yaml.safe_load((out / "federation.yaml").read_text())
    assert header["regions"] == {"pancreas": [1, 2], "cancer": [2]}  # the tumour lies inside the pancreas
    assert header["channels"] == 1
    assert header["sites"]["Task07_Pancreas"] == {"task": "Pancreas", "modality": "CT"}
    image = out / "Task07_Pancreas" / "images" / "pancreas_000.nii.gz"
    assert image.is_symlink() and np.allclose(nib.load(image).affine, AFFINE)
    assert sorted(p.name for p in (out / "NIH_Pancreas" / "images").iterdir())[0] == "pancreas_000.nii.gz"
    summary = one_round(out, tmp_path / "run", tiny_config, image_size=12)
    assert summary["sites"] == ["NIH_Pancreas", "Task07_Pancreas"]


def test_msd_disjoint_regions_and_multimodal_task(tmp_path):
    task = msd_task(tmp_path / "Task05_Prostate", name="Prostate", modalities=("T2", "ADC"))
    out = tmp_path / "fed"
    result = run_import("msd", str(task), "--regions", "disjoint", "--out", str(out))
    assert result.exit_code == 0, result.output
    fed = check_folder(out)
    assert fed.channels == 2 and fed.regions.as_dict() == {"pancreas": [1], "cancer": [2]}
    assert fed.channel_names == ["T2", "ADC"]  # dataset.json "modality", in channel order


def test_msd_channel_names_only_where_every_task_names_them_alike(tmp_path):
    """Two tasks whose one modality is named alike (case aside) give ``channel_names``; named otherwise, none
    (which name would a model trained on both read?)."""
    a = msd_task(tmp_path / "Task07_Pancreas", modalities=("CT",))
    b = msd_task(tmp_path / "NIH_Pancreas", modalities=("ct",), seed=1)
    c = msd_task(tmp_path / "Other_Pancreas", modalities=("portal-venous CT",), seed=2)
    assert run_import("msd", str(a), str(b), "--out", str(tmp_path / "alike")).exit_code == 0
    assert yaml.safe_load((tmp_path / "alike" / "federation.yaml").read_text())["channel_names"] == ["CT"]
    assert run_import("msd", str(a), str(c), "--out", str(tmp_path / "unlike")).exit_code == 0
    assert "channel_names" not in yaml.safe_load((tmp_path / "unlike" / "federation.yaml").read_text())


def test_msd_tasks_must_agree_on_modalities(tmp_path):
    a = msd_task(tmp_path / "Task01", modalities=("FLAIR", "T1w"))
    b = msd_task(tmp_path / "Task02")
    out = tmp_path / "fed"
    result = run_import("msd", str(a), str(b), "--out", str(out))
    assert result.exit_code == 1
    assert f"msd: the task folders differ in their number of modalities: {a} (2), {b} (1)" in result.output
    assert_nothing_written(out)


def test_msd_missing_listed_file_and_bad_dataset_json(tmp_path):
    task = msd_task(tmp_path / "Task07_Pancreas")
    (task / "labelsTr" / "pancreas_001.nii.gz").unlink()
    result = run_import("msd", str(task), "--out", str(tmp_path / "fed"))
    assert result.exit_code == 1
    assert f"{task}/labelsTr/pancreas_001.nii.gz: missing (listed in {task}/dataset.json training)" in result.output
    (task / "dataset.json").write_text('{"labels": {"0": "background"}, "training": []}')
    result = run_import("msd", str(task), "--out", str(tmp_path / "fed"))
    assert result.exit_code == 1 and f'{task}/dataset.json: missing "modality"' in result.output
    (task / "dataset.json").write_text('{"label": {"0": "background"}, "modality": {"0": "CT"}, "training": []}')
    result = run_import("msd", str(task), "--out", str(tmp_path / "fed"))  # a typo: named, not "got None"
    said = " ".join(result.output.split())
    assert result.exit_code == 1 and 'missing "labels" (the file has "label": misspelt?)' in said, said
    assert_nothing_written(tmp_path / "fed")


def test_an_nnunet_v1_task_has_its_channel_files_stacked_as_the_listed_image(tmp_path):
    """An nnU-Net v1 task (``Task082_BraTS``): dataset.json lists ``imagesTr/<case>.nii.gz``, which is stored as
    ``<case>_0000.nii.gz``, ``<case>_0001.nii.gz`` (one per ``modality``): they are stacked in that order; a missing
    one is named; the nnunet import and ``data check`` given the folder both point at this import."""
    from fedseg.data.federation import FederationError
    from fedseg.data.folder import load_folder

    task = msd_task(tmp_path / "Task082_BraTS", name="BraTS", modalities=("T1", "FLAIR"), channel_files=True)
    out = tmp_path / "fed"
    result = run_import("msd", str(task), "--out", str(out))
    assert result.exit_code == 0, result.output
    fed = check_folder(out)
    assert fed.channels == 2 and fed.channel_names == ["T1", "FLAIR"]
    stacked = nib.load(out / "Task082_BraTS" / "images" / "brats_001.nii.gz")
    np.testing.assert_allclose(stacked.affine, AFFINE)
    for c in range(2):
        channel = np.asarray(nib.load(task / "imagesTr" / f"brats_001_{c:04d}.nii.gz").dataobj)
        np.testing.assert_array_equal(np.asarray(stacked.dataobj)[..., c], channel)
    (task / "imagesTr" / "brats_002_0001.nii.gz").unlink()
    result = run_import("msd", str(task), "--out", str(tmp_path / "fed2"))
    assert result.exit_code == 1
    assert (
        f"{task}/imagesTr/brats_002_0001.nii.gz: missing (channel 1 of case 'brats_002'; {task}/dataset.json lists 2 "
        "modalities)"
    ) in " ".join(result.output.split())
    assert_nothing_written(tmp_path / "fed2")
    result = run_import("nnunet", str(task), "--out", str(tmp_path / "fed3"))
    assert result.exit_code == 1 and f'import it with "fedseg data import msd {task}"' in result.output
    with pytest.raises(FederationError, match=r"nnU-Net v1\) task .* fedseg data import msd "):
        load_folder(task)


# --- prostate-6site ----------------------------------------------------------------------------------


def test_prostate_imports_checks_and_trains(tmp_path, tiny_config):
    src, out = prostate_layout(tmp_path / "Prostate"), tmp_path / "fed"
    result = run_import("prostate-6site", str(src), "--out", str(out))
    assert result.exit_code == 0, result.output
    fed = check_folder(out)
    assert fed.site_names == ["BIDMC", "HK"] and fed.regions.as_dict() == {"prostate": [1]}
    label = out / "HK" / "labels" / "Case01.nii.gz"
    assert not label.is_symlink()  # converted: label > 0
    assert set(np.unique(read_label(label, "3d")).tolist()) == {0, 1}
    np.testing.assert_allclose(nib.load(label).affine, AFFINE)
    assert (out / "HK" / "images" / "Case01.nii.gz").is_symlink()
    summary = one_round(out, tmp_path / "run", tiny_config, image_size=12)
    assert summary["sites"] == ["BIDMC", "HK"]


def test_prostate_image_without_segmentation_is_named(tmp_path):
    src, out = prostate_layout(tmp_path / "Prostate"), tmp_path / "fed"
    (src / "HK" / "Case02_Segmentation.nii.gz").unlink()
    result = run_import("prostate-6site", str(src), "--out", str(out))
    assert result.exit_code == 1
    assert f"{src}/HK/Case02.nii.gz: image without segmentation (expected {src}/HK/Case02_segmentation.nii.gz)" in (
        result.output.replace("\n", "")
    )
    assert_nothing_written(out)


# --- fundus -------------------------------------------------------------------------------------------


def test_fundus_imports_checks_and_trains(tmp_path, tiny_config):
    refuge = fundus_source(tmp_path / "REFUGE", "jpg", "bmp")
    riga = fundus_source(tmp_path / "RIGA", "tif", "png")
    out = tmp_path / "fed"
    result = run_import("fundus", str(refuge), str(riga), "--out", str(out))
    assert result.exit_code == 0, result.output
    fed = check_folder(out)
    assert fed.kind == "2d" and fed.channels == 3 and fed.regions.as_dict() == {"disc": [1, 2], "cup": [2]}
    assert (out / "REFUGE" / "images" / "img000.jpg").is_symlink()  # RGB JPEG: usable as is
    assert (out / "RIGA" / "images" / "img000.png").is_file()  # TIFF: converted to PNG
    mask = np.asarray(Image.open(refuge / "masks" / "img001.bmp"))
    label = read_label(out / "REFUGE" / "labels" / "img001.png", "2d")
    np.testing.assert_array_equal(label, np.select([mask == 0, mask == 128], [2, 1], 0))
    summary = one_round(out, tmp_path / "run", tiny_config, image_size=16)
    assert summary["sites"] == ["REFUGE", "RIGA"] and summary["regions"] == ["disc", "cup"]


def test_fundus_mask_with_other_values_is_named(tmp_path):
    src, out = fundus_source(tmp_path / "REFUGE", "png", "png"), tmp_path / "fed"
    mask = np.asarray(Image.open(src / "masks" / "img002.png")).copy()
    mask[0, :3] = 100
    Image.fromarray(mask).save(src / "masks" / "img002.png")
    result = run_import("fundus", str(src), "--out", str(out))
    assert result.exit_code == 1
    assert (
        f"{src}/masks/img002.png: mask values 100 are not in the REFUGE/RIGA convention "
        "(expected only 0 = cup, 128 = rim, 255 = background)"
    ) in result.output.replace("\n", "")
    assert "Traceback" not in result.output
    assert_nothing_written(out)


def test_binary_0_255_masks_given_to_fundus_are_refused_not_imported_inverted(tmp_path):
    """A polyp-style 0/255 mask read by the fundus convention made 255 background and 0 cup: the foreground became
    background and the rest of the image "cup", and the data check passed (a fresh-eyes run). A cup with no rim is
    no real eye: refused, naming the binary layout."""
    src, out = fundus_source(tmp_path / "hospA", "png", "png"), tmp_path / "fed"
    mask = np.full((20, 20), 0, np.uint8)
    mask[5:9, 5:9] = 255
    Image.fromarray(mask).save(src / "masks" / "img001.png")
    result = run_import("fundus", str(src), "--out", str(out))
    assert result.exit_code == 1
    said = result.output.replace("\n", "")
    assert f"{src}/masks/img001.png: cup (0) with no rim (128) around it: a binary mask (0/255)?" in said
    assert "fedseg data import binary" in said and "Traceback" not in said
    assert_nothing_written(out)


# --- every layout -------------------------------------------------------------------------------------


def test_unknown_layout_and_non_empty_out_are_refused(tmp_path):
    result = run_import("brats2019", str(tmp_path), "--out", str(tmp_path / "fed"))
    assert result.exit_code == 1
    assert "unknown layout 'brats2019'; layouts: fets2022, msd, prostate-6site, fundus" in result.output
    src = fets_layout(tmp_path / "FeTS2022")
    out = tmp_path / "full"
    out.mkdir()
    (out / "notes.txt").write_text("keep me")
    result = run_import("fets2022", str(src), "--out", str(out))
    assert result.exit_code == 1 and "exists and is not an empty folder" in result.output
    assert [p.name for p in out.iterdir()] == ["notes.txt"]
    result = run_import("msd", str(src), "--partitioning", "2", "--out", str(tmp_path / "x"))
    assert result.exit_code == 1 and "--partitioning applies to the fets2022 layout only, not msd" in result.output


def test_empty_out_folder_is_used(tmp_path):
    src, out = prostate_layout(tmp_path / "Prostate"), tmp_path / "fed"
    out.mkdir()
    result = run_import("prostate-6site", str(src), "--out", str(out))
    assert result.exit_code == 0, result.output
    assert (out / "federation.yaml").is_file()


def test_an_msd_image_missing_a_modality_is_one_line_naming_the_dataset_json(tmp_path):
    """An MSD task's image with fewer channels than dataset.json's ``modality`` lists: one line, "cannot import",
    naming the image and the dataset.json the user wrote (not the federation.yaml the import writes, nor ``--out``),
    and nothing is written."""
    task = msd_task(tmp_path / "Task01_BrainTumour", name="BrainTumour", modalities=("FLAIR", "T1w"))
    image = task / "imagesTr" / "braintumour_001.nii.gz"
    _nifti(image, np.asarray(nib.load(image).dataobj)[..., 0])  # one modality of the two
    result = run_import("msd", str(task), "--out", str(tmp_path / "fed"))
    assert result.exit_code == 1
    said = " ".join(result.output.split())
    assert said.startswith("error: cannot import: ") and len(result.output.strip().splitlines()) <= 2, result.output
    assert f"{image}: image has 1 channels but {task}/dataset.json modality lists 2" in said, said
    assert "federation.yaml" not in said and str(tmp_path / "fed") not in said
    assert not (tmp_path / "fed").exists()
