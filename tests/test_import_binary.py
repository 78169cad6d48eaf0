"""``fedseg data import binary``: polyp / skin-lesion style collections (``images/`` + ``masks/``, one binary mask per
image), written by the test in their real layouts (Kvasir-SEG's JPEG masks, ISIC's ``_segmentation`` suffix, 0/1
masks, CVC-ClinicDB's ``Original/`` + ``Ground Truth/``), import into a checked folder federation whose labels are
0 background / 1 foreground; malformed sources fail with one line naming the file, and nothing is written."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
import yaml
from PIL import Image
from typer.testing import CliRunner

from fedseg.cli import app
from fedseg.data.case_files import read_image, read_label
from fedseg.data.check import check_folder

SIZE = (24, 32)  # (H, W): not square, so a transposed size is caught


def truth(i: int, shape: tuple[int, int] = SIZE) -> np.ndarray:
    """Case ``i``'s foreground: a rectangle (bool ``(H, W)``), smaller than half the image (an inverted label is
    then told apart by its foreground count alone)."""
    mask = np.zeros(shape, bool)
    mask[4 + i : 12 + i, 6 + 2 * i : 18 + 2 * i] = True
    return mask


def rgb(i: int, shape: tuple[int, int] = SIZE) -> np.ndarray:
    rng = np.random.default_rng(i)
    return rng.integers(0, 255, (*shape, 3), dtype=np.uint8)


def source(
    root: Path,
    image_ext: str = "png",
    mask_ext: str = "png",
    *,
    suffix: str = "",
    mask_values: tuple[int, int] = (0, 255),
    grey_images: bool = False,
    mask_rgb: bool = False,
    folders: tuple[str, str] = ("images", "masks"),
    n: int = 3,
) -> Path:
    """A collection ``root/images/case<i>.<image_ext>`` + ``root/masks/case<i><suffix>.<mask_ext>``."""
    images, masks = root / folders[0], root / folders[1]
    images.mkdir(parents=True)
    masks.mkdir(parents=True)
    for i in range(n):
        image = rgb(i)
        Image.fromarray(image[..., 0] if grey_images else image).save(images / f"case{i}.{image_ext}")
        mask = np.where(truth(i), mask_values[1], mask_values[0]).astype(np.uint8)
        if mask_rgb:
            mask = np.repeat(mask[..., None], 3, -1)
        Image.fromarray(mask).save(
            masks / f"case{i}{suffix}.{mask_ext}", **({"quality": 60} if mask_ext == "jpg" else {})
        )
    return root


def run(*args: str):
    return CliRunner().invoke(app, ["data", "import", "binary", *args])


def check(out: Path):
    return CliRunner().invoke(app, ["data", "check", str(out)])


def assert_refused(result, out: Path, *expected: str) -> None:
    """Exit 1, one ``error: cannot import`` line holding each of ``expected``, nothing at ``out``."""
    assert result.exit_code == 1, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.output
    for text in expected:
        assert text in lines[0], lines[0]
    assert "Traceback" not in result.output
    assert not out.exists()
    assert not [p for p in out.parent.iterdir() if p.name.startswith(f".{out.name}.")]


def test_polyp_collections_import_as_0_1_labels_with_one_region(tmp_path):
    kvasir = source(tmp_path / "Kvasir-SEG", "jpg", "jpg", mask_rgb=True)  # RGB JPEG masks, as Kvasir-SEG's
    isic = source(tmp_path / "ISIC", "jpg", "png", suffix="_segmentation")
    clinic = source(tmp_path / "CVC-ClinicDB", "tif", "tif", mask_values=(0, 1), folders=("Original", "Ground Truth"))
    etis = source(tmp_path / "ETIS", "png", "bmp", suffix="_mask", grey_images=True)
    for junk in ("Thumbs.db", "desktop.ini", ".DS_Store"):  # what Windows Explorer and macOS leave in folders
        (kvasir / "images" / junk).write_bytes(b"\0")
        (kvasir / "masks" / junk).write_bytes(b"\0")
    out = tmp_path / "fed"
    result = run(str(kvasir), str(isic), str(clinic), str(etis), "--region", "polyp", "--out", str(out))
    assert result.exit_code == 0, result.output
    assert check(out).exit_code == 0
    fed = check_folder(out)
    assert fed.kind == "2d" and fed.channels == 3
    assert fed.regions.as_dict() == {"polyp": [1]}
    header = yaml.safe_load((out / "federation.yaml").read_text())
    assert header["label_names"] == {0: "background", 1: "polyp"}
    assert sorted(fed.site_names) == ["CVC-ClinicDB", "ETIS", "ISIC", "Kvasir-SEG"]
    for site in fed.sites:
        assert [c.id for c in site.cases] == ["case0", "case1", "case2"]  # suffixes are not in the case ids
    for site in ("ISIC", "CVC-ClinicDB", "ETIS"):  # lossless masks: exactly the truth, foreground 1
        for i in range(3):
            label = read_label(out / site / "labels" / f"case{i}.png", "2d")
            assert label.dtype == np.uint8 and set(np.unique(label)) == {0, 1}
            np.testing.assert_array_equal(label, truth(i).astype(np.uint8), err_msg=f"{site} case{i}")
    assert (out / "Kvasir-SEG" / "images" / "case0.jpg").is_symlink()  # RGB JPEG: linked as is
    assert (out / "CVC-ClinicDB" / "images" / "case0.png").is_file()  # TIFF: converted
    grey = read_image(out / "ETIS" / "images" / "case1.png", "2d")  # grey PNG: converted to RGB
    assert grey.shape == (3, *SIZE)
    for channel in grey:
        np.testing.assert_array_equal(channel, rgb(1)[..., 0])


def test_jpeg_masks_with_compression_noise_are_thresholded_at_128(tmp_path):
    src = source(tmp_path / "Kvasir-SEG", "jpg", "jpg", mask_rgb=True)
    noisy = np.asarray(Image.open(src / "masks" / "case2.jpg"))
    assert len(np.unique(noisy)) > 2 and (noisy > 0).any() and (noisy < 255).any()  # JPEG noise is there
    tinted = np.where(truth(1)[..., None], [250, 255, 240], [9, 0, 4]).astype(np.uint8)  # channels a little apart
    Image.fromarray(tinted).save(src / "masks" / "case1.jpg", quality=60)
    spread = np.ptp(np.asarray(Image.open(src / "masks" / "case1.jpg")).astype(int), axis=-1).max()
    assert 0 < spread <= 48, spread  # under COLOUR_TOLERANCE: grey
    Image.fromarray(np.zeros((*SIZE, 3), np.uint8)).save(src / "masks" / "case0.jpg", quality=60)  # an empty mask
    out = tmp_path / "fed"
    assert run(str(src), "--out", str(out)).exit_code == 0
    assert check_folder(out).regions.as_dict() == {"foreground": [1]}  # the default region name
    for i in range(3):
        label = read_label(out / "Kvasir-SEG" / "labels" / f"case{i}.png", "2d")
        decoded = np.asarray(Image.open(src / "masks" / f"case{i}.jpg").convert("L"))
        np.testing.assert_array_equal(label, (decoded >= 128).astype(np.uint8))
        assert (label == (truth(i) if i else 0)).mean() > 0.99  # not inverted, not empty


def test_0_255_and_0_1_masks_give_the_same_labels(tmp_path):
    """A 0/255 mask and a 0/1 mask of one truth both give label 1 on the foreground: an inverted threshold, or 0/1
    masks read as ``>= 128``, would make them differ from the truth."""
    a = source(tmp_path / "a", suffix="_GT")
    b = source(tmp_path / "b", suffix="_Mask", mask_values=(0, 1))
    c = tmp_path / "c"
    source(c, n=1)
    Image.fromarray(truth(0)).save(c / "masks" / "case0.png")  # a 1-bit PNG (PIL mode "1")
    assert Image.open(c / "masks" / "case0.png").mode == "1"
    out = tmp_path / "fed"
    result = run(str(a), str(b), str(c), "--out", str(out))
    assert result.exit_code == 0, result.output
    for site, n in (("a", 3), ("b", 3), ("c", 1)):
        for i in range(n):
            label = read_label(out / site / "labels" / f"case{i}.png", "2d")
            np.testing.assert_array_equal(label, truth(i).astype(np.uint8), err_msg=f"{site} case{i}")


def _write(path: Path, array: np.ndarray) -> None:
    Image.fromarray(array).save(path)


BAD_INPUTS = {
    "image without mask": (
        lambda s: (s / "masks" / "case1.png").unlink(),
        ["{src}/images/case1.png: image without mask (expected", "masks/case1[_mask|_segmentation|_seg|_gt|_label]"],
    ),
    "mask without image": (
        lambda s: _write(s / "masks" / "case9_mask.png", np.zeros(SIZE, np.uint8)),
        ["{src}/masks/case9_mask.png: mask without image (expected", "images/case9.<jpg|"],
    ),
    "duplicate image id": (
        lambda s: _write(s / "images" / "case0.jpg", rgb(0)),
        ["{src}/images/case0.png: duplicate image id 'case0' (also case0.jpg)"],
    ),
    "two masks of one image": (
        lambda s: _write(s / "masks" / "case0_mask.png", np.zeros(SIZE, np.uint8)),
        ["{src}/images/case0.png: several masks (case0.png, case0_mask.png); keep one"],
    ),
    "size mismatch": (
        lambda s: _write(s / "masks" / "case2.png", np.zeros((SIZE[1], SIZE[0]), np.uint8)),
        ["{src}/images/case2.png is 32x24 but its mask", "{src}/masks/case2.png is 24x32 (width x height)"],
    ),
    "unreadable mask": (
        lambda s: (s / "masks" / "case1.png").write_bytes(b"not a png"),
        ["{src}/masks/case1.png: cannot read"],
    ),
    "colour-coded mask": (
        lambda s: _write(
            s / "masks" / "case1.png", np.stack([truth(1) * 255, truth(1) * 0, 0 * truth(1)], -1).astype(np.uint8)
        ),
        ["{src}/masks/case1.png: colour mask (its channels differ by up to 255 grey levels"],
    ),
    "class-index mask": (
        lambda s: _write(s / "masks" / "case0.png", (truth(0) * 2).astype(np.uint8)),
        ["{src}/masks/case0.png: mask values 0, 2: class indices of a multi-class mask?"],
    ),
    "missing masks folder": (
        lambda s: shutil.rmtree(s / "masks"),
        ["{src}/masks: missing masks/ folder (expected images/ and masks/"],
    ),
    "empty folders": (
        lambda s: [p.unlink() for p in [*(s / "masks").iterdir(), *(s / "images").iterdir()]],
        ["{src}: no case (images/ and masks/ are empty)"],
    ),
}


@pytest.mark.parametrize("breaks", BAD_INPUTS, ids=list(BAD_INPUTS))
def test_bad_input_is_one_line_naming_the_file_and_writes_nothing(tmp_path, breaks):
    src = source(tmp_path / "CVC-ColonDB")
    hurt, expected = BAD_INPUTS[breaks]
    hurt(src)
    out = tmp_path / "fed"
    assert_refused(run(str(src), "--out", str(out)), out, *(e.format(src=src) for e in expected))


def test_bad_region_names_same_site_names_and_region_of_another_layout_are_refused(tmp_path):
    src, out = source(tmp_path / "a" / "Kvasir"), tmp_path / "fed"
    assert_refused(run(str(src), "--region", "background", "--out", str(out)), out, "--region 'background'")
    assert_refused(run(str(src), "--region", "polyp mask", "--out", str(out)), out, "use letters, digits")
    twin = source(tmp_path / "b" / "Kvasir")
    assert_refused(run(str(src), str(twin), "--out", str(out)), out, f"{src} and {twin} would both be site 'Kvasir'")
    result = CliRunner().invoke(app, ["data", "import", "fundus", str(src), "--region", "polyp", "--out", str(out)])
    assert_refused(result, out, "--region applies to the binary layout only, not fundus")


def test_data_check_on_the_raw_collections_names_the_binary_import(tmp_path):
    """A researcher pointing `data check` (or a run) at their images/ + masks/ folders is told the import that makes
    a federation of them, with every collection as a site (a fresh-eyes run got no hint)."""
    for site in ("hospA", "hospB"):
        source(tmp_path / "raw" / site)
    (tmp_path / "raw" / "notes").mkdir()
    result = CliRunner().invoke(app, ["data", "check", str(tmp_path / "raw")])
    assert result.exit_code == 1
    said = " ".join(result.output.split())
    raw = tmp_path / "raw"
    assert f"{raw}: 2 images/ + masks/ collections, not a federation folder (no federation.yaml)" in said
    assert f"fedseg data import binary {raw / 'hospA'} {raw / 'hospB'} --out FED" in said


def test_a_0_1_mask_saved_as_jpeg_or_drawn_in_alpha_is_not_imported_empty(tmp_path):
    """A 0/1 mask saved as JPEG decodes to 0..2: thresholded at 128 it imported empty without a word (a review);
    refused, naming the file. A mask drawn in its alpha channel only (its colour constant) is read from the alpha."""
    src = source(tmp_path / "jpeg01", "png", "jpg", mask_values=(0, 1))
    yy, xx = np.mgrid[: SIZE[0], : SIZE[1]]
    disc = (((yy - 12) ** 2 + (xx - 15) ** 2) < 49).astype(np.uint8)  # its edge blurs to 2 at quality 95
    Image.fromarray(disc).save(src / "masks" / "case0.jpg", quality=95)
    assert np.asarray(Image.open(src / "masks" / "case0.jpg")).max() == 2
    result = run(str(src), "--out", str(tmp_path / "fed"))
    assert result.exit_code == 1
    said = " ".join(result.output.split())
    assert f"{src}/masks/case0.jpg: mask values 0, 1, " in said and "a 0/1 mask saved as JPEG" in said
    assert not (tmp_path / "fed").exists()
    alpha = source(tmp_path / "alpha", n=1)
    rgba = np.zeros((*SIZE, 4), np.uint8)
    rgba[..., 3] = np.where(truth(0), 255, 0)
    Image.fromarray(rgba).save(alpha / "masks" / "case0.png")
    assert run(str(alpha), "--out", str(tmp_path / "fed2")).exit_code == 0
    label = read_label(tmp_path / "fed2" / "alpha" / "labels" / "case0.png", "2d")
    np.testing.assert_array_equal(label, truth(0).astype(np.uint8))
