"""The folder federation format: lazy loading, channel-first conversion, exact write/read round trips."""

from __future__ import annotations

import pickle
from pathlib import Path

import nibabel as nib
import numpy as np
import pytest
import yaml
from PIL import Image

from fedseg.data.federation import Case, Federation, FederationError, Regions, Site
from fedseg.data.folder import load_folder, read_header
from fedseg.data.folder_write import write_folder

RNG = np.random.default_rng(0)


def _header(root: Path, kind: str = "2d", channels: int = 3, **extra) -> None:
    root.mkdir(parents=True, exist_ok=True)
    data = {"name": "toy", "kind": kind, "channels": channels, "regions": {"disc": [1, 2], "cup": [2]}, **extra}
    (root / "federation.yaml").write_text(yaml.safe_dump(data))


def _put(root: Path, site: str, folder: str, filename: str, array: np.ndarray) -> Path:
    """Write ``array`` as stored to ROOT/site/folder/filename (PNG via Pillow, NIfTI via nibabel, npy)."""
    path = root / site / folder / filename
    path.parent.mkdir(parents=True, exist_ok=True)
    if filename.endswith(".png"):
        Image.fromarray(array).save(path)
    elif filename.endswith((".nii", ".nii.gz")):
        nib.save(nib.Nifti1Image(array, np.eye(4), dtype=array.dtype), path)
    else:
        np.save(path, array)
    return path


def _labels(shape) -> np.ndarray:
    return RNG.integers(0, 3, size=shape, dtype=np.uint8)


def _all_arrays(fed: Federation) -> dict:
    return {(s.name, c.id): c.arrays() for s in fed.sites for c in s.cases}


def _assert_same(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for key in a:
        for x, y in zip(a[key], b[key]):
            assert x.dtype == y.dtype and x.shape == y.shape, key
            np.testing.assert_array_equal(x, y)


def _round_trip(fed: Federation, out: Path) -> Federation:
    write_folder(fed, out)
    again = load_folder(out)
    _assert_same(_all_arrays(fed), _all_arrays(again))
    assert (again.name, again.kind, again.channels, again.regions) == (fed.name, fed.kind, fed.channels, fed.regions)
    return again


def test_png_rgb_and_gray_load_channel_first_and_round_trip(tmp_path):
    rgb = RNG.integers(0, 256, size=(6, 5, 3), dtype=np.uint8)
    gray = RNG.integers(0, 256, size=(6, 5), dtype=np.uint8)
    lab = _labels((6, 5))
    root = tmp_path / "rgb"
    _header(root, channels=3, label_names={0: "background", 1: "rim", 2: "cup"})
    _put(root, "site-b", "images", "x.png", rgb)
    _put(root, "site-b", "labels", "x.png", lab)
    _put(root, "site-a", "images", "y.png", rgb[::-1].copy())
    _put(root, "site-a", "labels", "y.png", lab)
    fed = load_folder(root)
    assert fed.site_names == ["site-a", "site-b"]  # sorted by folder name
    assert fed.label_names == {0: "background", 1: "rim", 2: "cup"}
    image, label = fed.site("site-b").cases[0].arrays()
    assert image.shape == (3, 6, 5) and image.dtype == np.uint8 and label.dtype == np.uint8
    np.testing.assert_array_equal(image, np.moveaxis(rgb, -1, 0))
    np.testing.assert_array_equal(label, lab)
    again = _round_trip(fed, tmp_path / "rgb-out")
    assert again.label_names == fed.label_names
    assert (tmp_path / "rgb-out/site-b/images/x.png").is_file() and (tmp_path / "rgb-out/site-b/labels/x.png").is_file()

    root = tmp_path / "gray"
    _header(root, channels=1)
    _put(root, "s", "images", "g.png", gray)
    _put(root, "s", "labels", "g.png", lab)
    fed = load_folder(root)
    image, _ = fed.sites[0].cases[0].arrays()
    assert image.shape == (1, 6, 5)
    np.testing.assert_array_equal(image[0], gray)
    _round_trip(fed, tmp_path / "gray-out")


def test_npy_images_are_channel_first_and_round_trip(tmp_path):
    image = RNG.normal(size=(2, 7, 4)).astype(np.float32)
    label = _labels((7, 4)).astype(np.int16)
    root = tmp_path / "npy"
    _header(root, channels=2)
    _put(root, "s", "images", "c1.npy", image)
    _put(root, "s", "labels", "c1.npy", label)
    fed = load_folder(root)
    got_image, got_label = fed.sites[0].cases[0].arrays()
    assert got_image.dtype == np.float32 and got_label.dtype == np.int16
    np.testing.assert_array_equal(got_image, image)
    _round_trip(fed, tmp_path / "npy-out")
    assert (tmp_path / "npy-out/s/images/c1.npy").is_file() and (tmp_path / "npy-out/s/labels/c1.npy").is_file()


def test_single_channel_npy_without_channel_axis(tmp_path):
    root = tmp_path / "r"
    _header(root, channels=1)
    _put(root, "s", "images", "a.npy", np.arange(12, dtype=np.uint16).reshape(3, 4))
    _put(root, "s", "labels", "a.npy", np.zeros((3, 4), np.uint8))
    assert load_folder(root).sites[0].cases[0].arrays()[0].shape == (1, 3, 4)


def test_nifti_2d_with_trailing_channel_axis(tmp_path):
    image = RNG.normal(size=(8, 6, 3)).astype(np.float32)  # (X, Y, C)
    label = _labels((8, 6))
    root = tmp_path / "nii2d"
    _header(root, channels=3)
    _put(root, "s", "images", "a.nii.gz", image)
    _put(root, "s", "labels", "a.nii", label)
    _put(root, "s", "images", "b.nii.gz", image[:, :, None, :].copy())  # (X, Y, 1, C) NIfTI vector layout
    _put(root, "s", "labels", "b.nii.gz", label[:, :, None].copy())
    fed = load_folder(root)
    for case in fed.sites[0].cases:
        got_image, got_label = case.arrays()
        assert got_image.shape == (3, 8, 6) and got_image.dtype == np.float32
        np.testing.assert_array_equal(got_image, np.moveaxis(image, -1, 0))
        np.testing.assert_array_equal(got_label, label)
    _round_trip(fed, tmp_path / "nii2d-out")


def test_nifti_3d_volumes_single_and_multi_channel_round_trip(tmp_path):
    vol = RNG.integers(-100, 1000, size=(5, 6, 4), dtype=np.int16)
    multi = RNG.normal(size=(5, 6, 4, 2)).astype(np.float32)
    label = _labels((5, 6, 4))
    for channels, image, expected in ((1, vol, vol[None]), (2, multi, np.moveaxis(multi, -1, 0))):
        root = tmp_path / f"nii3d-{channels}"
        _header(root, kind="3d", channels=channels)
        _put(root, "s", "images", "v.nii.gz", image)
        _put(root, "s", "labels", "v.nii.gz", label)
        fed = load_folder(root)
        got_image, got_label = fed.sites[0].cases[0].arrays()
        assert got_image.shape == expected.shape and got_image.dtype == image.dtype
        np.testing.assert_array_equal(got_image, expected)
        np.testing.assert_array_equal(got_label, label)
        out = tmp_path / f"nii3d-{channels}-out"
        _round_trip(fed, out)
        assert (out / "s/images/v.nii.gz").is_file()


def test_write_folder_from_memory_round_trips_exactly(tmp_path):
    def case(i: int, image: np.ndarray, label: np.ndarray) -> Case:
        return Case.from_arrays(f"case{i}", image, label)

    regions = Regions.from_mapping({"prostate": [1]})
    fed2d = Federation(
        "mem2d",
        "2d",
        3,
        regions,
        [
            Site(
                "A", [case(i, RNG.integers(0, 256, (3, 8, 8), dtype=np.uint8), _labels((8, 8)) % 2) for i in range(3)]
            ),
            Site("B", [case(0, RNG.random((3, 8, 8)), (_labels((8, 8)) % 2).astype(np.int64))]),
        ],
    )
    _round_trip(fed2d, tmp_path / "mem2d")
    assert (tmp_path / "mem2d/A/images/case0.png").is_file() and (tmp_path / "mem2d/B/images/case0.npy").is_file()
    fed3d = Federation(
        "mem3d",
        "3d",
        1,
        regions,
        [Site("A", [case(0, RNG.integers(0, 256, (1, 4, 5, 6), dtype=np.uint8), _labels((4, 5, 6)) % 2)])],
    )
    _round_trip(fed3d, tmp_path / "mem3d")


def test_splits_csv_is_read_into_fixed_splits_and_written_back(tmp_path):
    root = tmp_path / "r"
    _header(root, channels=1)
    for cid in ("a", "b", "c"):
        _put(root, "s", "images", f"{cid}.png", np.zeros((4, 4), np.uint8))
        _put(root, "s", "labels", f"{cid}.png", np.zeros((4, 4), np.uint8))
    (root / "s/splits.csv").write_text("case,split\na,train\nc,test\n")
    fed = load_folder(root)
    assert fed.sites[0].fixed_splits == {"a": "train", "c": "test"}
    write_folder(fed, tmp_path / "out")
    assert load_folder(tmp_path / "out").sites[0].fixed_splits == {"a": "train", "c": "test"}
    write_folder(fed, tmp_path / "out2", splits={"s": {"a": "val", "b": "train", "c": "train"}})
    assert (tmp_path / "out2/s/splits.csv").read_text() == "case,split\na,val\nb,train\nc,train\n"


def test_rgba_png_needs_four_channels(tmp_path):
    rgba = RNG.integers(0, 256, size=(4, 4, 4), dtype=np.uint8)
    for channels in (3, 4):
        root = tmp_path / f"c{channels}"
        _header(root, channels=channels)
        _put(root, "s", "images", "a.png", rgba)
        _put(root, "s", "labels", "a.png", np.zeros((4, 4), np.uint8))
        case = load_folder(root).sites[0].cases[0]
        if channels == 3:
            with pytest.raises(
                FederationError, match=r"a\.png: image has 4 channels but federation.yaml says channels: 3"
            ):
                case.arrays()
        else:
            assert case.arrays()[0].shape == (4, 4, 4)


def test_cases_are_lazy_picklable_and_carry_their_paths(tmp_path):
    root = tmp_path / "r"
    _header(root, channels=1)
    img = _put(root, "s", "images", "a.png", np.zeros((4, 4), np.uint8))
    lab = _put(root, "s", "labels", "a.png", np.zeros((4, 4), np.uint8))
    case = load_folder(root).sites[0].cases[0]
    assert case.meta == {"image": str(img), "label": str(lab)}
    img.write_bytes(b"not a png")  # nothing was read at load time; the loader reads on demand
    with pytest.raises(FederationError, match="a.png: cannot read"):
        pickle.loads(pickle.dumps(case.loader))()


def test_write_folder_refuses_a_non_empty_folder_unless_overwriting(tmp_path):
    case = Case.from_arrays("a", np.zeros((1, 4, 4), np.uint8), np.zeros((4, 4), np.uint8))
    fed = Federation("t", "2d", 1, Regions.from_mapping({"fg": [1]}), [Site("s", [case])])
    write_folder(fed, tmp_path / "out")
    with pytest.raises(FederationError, match="exists and is not empty"):
        write_folder(fed, tmp_path / "out")
    fed.sites[0].name = "renamed"
    write_folder(fed, tmp_path / "out", overwrite=True)
    assert load_folder(tmp_path / "out").site_names == ["renamed"]
    (tmp_path / "other").mkdir()
    (tmp_path / "other/notes.txt").write_text("keep me")
    with pytest.raises(FederationError, match="not a federation folder"):
        write_folder(fed, tmp_path / "other", overwrite=True)


def test_channel_names_round_trip_and_old_folders_without_them_read_as_unknown(tmp_path):
    """``federation.yaml`` ``channel_names`` (optional): written from ``Federation.channel_names`` and read back in
    order; a folder without the field (every folder written before it) reads as before, with ``None``."""
    case = Case.from_arrays("a", np.zeros((2, 4, 4), np.float32), np.zeros((4, 4), np.uint8))
    fed = Federation(
        "t", "2d", 2, Regions.from_mapping({"fg": [1]}), [Site("s", [case])], channel_names=["T1", "FLAIR"]
    )
    write_folder(fed, tmp_path / "named")
    assert yaml.safe_load((tmp_path / "named/federation.yaml").read_text())["channel_names"] == ["T1", "FLAIR"]
    assert load_folder(tmp_path / "named").channel_names == ["T1", "FLAIR"]
    old = tmp_path / "old"
    _header(old, channels=1)
    _put(old, "s", "images", "a.png", np.zeros((4, 4), np.uint8))
    _put(old, "s", "labels", "a.png", np.zeros((4, 4), np.uint8))
    assert load_folder(old).channel_names is None
    fed.channel_names = ["T1"]  # one name for two channels: refused before anything is written
    with pytest.raises(FederationError, match=r"channel_names: lists 1 names \(T1\) but channels is 2"):
        write_folder(fed, tmp_path / "wrong")
    assert not (tmp_path / "wrong").exists()


@pytest.mark.parametrize(
    ("names", "expected"),
    [
        (["T1"], "channel_names: lists 1 names (T1) but channels is 2"),
        (["T1", 2], "channel_names: expected a list of 2 channel names, one per channel in channel order"),
        ("T1,FLAIR", "channel_names: expected a list of 2 channel names"),
        (["T1", " "], "channel_names: expected a list of 2 channel names"),
    ],
    ids=["wrong-length", "not-a-string", "not-a-list", "empty-name"],
)
def test_a_malformed_channel_names_is_one_line_naming_federation_yaml_and_the_field(tmp_path, names, expected):
    root = tmp_path / "r"
    _header(root, channels=2, channel_names=names)
    _put(root, "s", "images", "a.npy", np.zeros((2, 4, 4), np.float32))
    _put(root, "s", "labels", "a.png", np.zeros((4, 4), np.uint8))
    with pytest.raises(FederationError) as e:
        load_folder(root)
    message = str(e.value)
    assert len(message.splitlines()) == 1, message
    assert message.startswith(f"{root / 'federation.yaml'}: {expected}"), message


def test_a_federation_yaml_that_is_a_folder_is_said_so_not_missing(tmp_path):
    (tmp_path / "federation.yaml").mkdir()
    with pytest.raises(FederationError, match=r"federation.yaml: is a folder, not a file \(every federation folder"):
        read_header(tmp_path)


def test_a_federation_whose_sites_are_not_in_name_order_keeps_its_order_on_disk_and_its_numbers(
    tmp_path, disc_federation, tiny_config
):
    """site1..site11 written to a folder read back site1, site10, site11, site2... (sorted by name): a run on the
    folder (and on Flower, whose coordinator read the folder) summed and seeded the sites in another order than the
    built-in federation, and its numbers differed (a determinism audit: test Dice 0.032490 against 0.032420 on
    synthetic-brats). The folder now records the order (``site_order``) and gives the same numbers."""
    from fedseg.api import Experiment
    from fedseg.flower.cli import coordinator_federation

    fed = disc_federation(n_sites=11, cases_per_site=4, size=16)
    names = [f"site{k}" for k in range(1, 12)]
    root = write_folder(fed, tmp_path / "fed")
    assert yaml.safe_load((root / "federation.yaml").read_text())["site_order"] == names
    assert load_folder(root).site_names == names
    assert coordinator_federation(root / "federation.yaml", ",".join(sorted(names))).site_names == names
    assert coordinator_federation(root, None).site_names == names
    with pytest.raises(ValueError, match=r"federation\.yaml: site_order leaves out 'site12', a site of this run"):
        coordinator_federation(root / "federation.yaml", ",".join([*names, "site12"]))
    cfg = tiny_config(algorithms=["fedavg"], fl={"rounds": 1}, eval={"hd95": False, "local_models": False})
    runs = {}
    for name, given in (("memory", fed), ("folder", load_folder(root))):
        Experiment(cfg, tmp_path / name, federation=given, progress=False).run(report=False)
        runs[name] = (tmp_path / name / "results.csv").read_text()
    assert runs["memory"] == runs["folder"]
    # in name order already: no site_order written (a folder of an earlier fedseg reads as it did)
    three = write_folder(disc_federation(n_sites=3, cases_per_site=2, size=16), tmp_path / "three")
    assert "site_order" not in yaml.safe_load((three / "federation.yaml").read_text())


@pytest.mark.parametrize(
    "order, said",
    [
        ("site2", "site_order: expected a list of the site names, e.g. [site1, site2, site10], got 'site2'"),
        ([["site1"]], "site_order: expected a list of the site names"),
        (["site2", "site1", "site2"], "site_order: lists 'site2' twice; list every site once"),
        (["site2", "site1", "site9"], "site_order: names 'site9', which has no site folder here"),
        (["site2"], "site_order: leaves out 'site1'; list every site folder once (or drop site_order)"),
    ],
)
def test_a_bad_site_order_is_one_line_naming_federation_yaml(tmp_path, disc_federation, order, said):
    root = write_folder(disc_federation(n_sites=2, cases_per_site=2, size=16), tmp_path / "fed")
    header = yaml.safe_load((root / "federation.yaml").read_text())
    (root / "federation.yaml").write_text(yaml.safe_dump({**header, "site_order": order}))
    with pytest.raises(FederationError) as raised:
        load_folder(root)
    text = str(raised.value)
    assert len(text.splitlines()) == 1 and text.startswith(f"{root / 'federation.yaml'}: {said}"), text
