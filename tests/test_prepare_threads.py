"""Sites' cases read and pre-processed by several threads (``data.prepare_threads``): the same tensors to the bit as
one thread, on real files, on the volume path (resampled anisotropic cases) and the whole-image path with its
original-grid truth; the first failing case raises as it would alone."""

from __future__ import annotations

import contextvars
import gzip
import threading

import numpy as np
import pytest
import torch

from fedseg.config import DataConfig, VolumeConfig
from fedseg.data.dataset import CaseSet, SiteData, build_site_data, prepare_threads
from fedseg.data.federation import Case, Federation, Regions, Site
from fedseg.data.folder import load_folder
from fedseg.data.folder_write import write_folder

SPLITS = ("train", "val", "test")


def _federation() -> Federation:
    """One site of 9 3D cases of different shapes and spacings (a bright blob in noise, labels 1 and 2)."""
    rng = np.random.default_rng(3)
    cases = []
    for i in range(9):
        shape = (14 + i, 12 + 2 * (i % 3), 10 + i % 4)
        image = rng.normal(0, 1, (2, *shape)).astype(np.float32)
        label = np.zeros(shape, np.uint8)
        label[3:9, 4:8, 2:7] = 1
        label[5:7, 5:7, 3:5] = 2
        image[:, label > 0] += 3
        image[:, :2] = 0  # a zero border: the foreground crop has something to crop
        cases.append(Case.from_arrays(f"c{i}", image, label, spacing=(1.0, 0.8, 1.5 + 0.5 * (i % 2))))
    return Federation("blobs", "3d", 2, Regions.from_mapping({"whole": [1, 2], "core": [2]}), [Site("s", cases)])


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Federation:
    return load_folder(write_folder(_federation(), tmp_path_factory.mktemp("fed") / "blobs"))


def _splits(fed: Federation) -> dict[str, str]:
    return {case.id: SPLITS[i % 3] for i, case in enumerate(fed.sites[0].cases)}


def _site(fed: Federation, threads: int, **data) -> SiteData:
    cfg = DataConfig(source="folder", image_size=16, normalize="zscore_foreground", prepare_threads=threads, **data)
    return build_site_data(fed, fed.sites[0], 0, _splits(fed), cfg, originals=True)


def _assert_same(a: CaseSet, b: CaseSet) -> None:
    assert a.ids == b.ids
    assert torch.equal(a.x, b.x) and torch.equal(a.y, b.y)
    assert (a.originals is None) == (b.originals is None)
    if a.originals is not None and b.originals is not None:
        assert torch.equal(a.originals.bits, b.originals.bits)
        assert a.originals.shapes == b.originals.shapes
    assert (a.volumes is None) == (b.volumes is None)
    for va, vb in zip(a.volumes or [], b.volumes or [], strict=True):
        assert torch.equal(va.image, vb.image) and torch.equal(va.label, vb.label)
        assert (va.truth is None and vb.truth is None) or torch.equal(va.truth, vb.truth)
        assert va.grid.shape == vb.grid.shape and va.grid.start == vb.grid.start and va.grid.pad == vb.grid.pad
        assert (va.grid.affine is None and vb.grid.affine is None) or torch.equal(va.grid.affine, vb.grid.affine)


@pytest.mark.parametrize(
    "data",
    [
        {"volume": VolumeConfig(patch_size=(8, 8, 8), spacing=(1.0, 1.0, 1.0))},  # resampled, cropped, padded
        {"resize": "pad"},  # whole-image path: the original-grid truth of the scored splits
    ],
    ids=["volume", "whole-image"],
)
def test_any_number_of_threads_gives_the_same_tensors(folder, data):
    one = _site(folder, 1, **data)
    assert one.train.volumes is not None or one.val.originals is not None  # the path under test made its extra parts
    for threads in (2, 5):
        many = _site(folder, threads, **data)
        for split in SPLITS:
            _assert_same(one.split(split), many.split(split))


def test_the_first_case_that_fails_is_the_error_with_any_number_of_threads(tmp_path):
    fed = load_folder(write_folder(_federation(), tmp_path / "blobs"))
    for bad in ("c1", "c4"):  # a truncated gzip: readable header, missing voxels
        path = tmp_path / "blobs" / "s" / "images" / f"{bad}.nii.gz"
        data = gzip.decompress(path.read_bytes())
        path.write_bytes(gzip.compress(data[: len(data) // 2]))
    fed = load_folder(tmp_path / "blobs")
    errors = []
    for threads in (1, 4):
        with pytest.raises(Exception) as caught:  # noqa: PT011 - the reader's own error, whatever its type
            _site(fed, threads)
        errors.append((type(caught.value), str(caught.value)))
    assert errors[0] == errors[1]
    assert "c1" in errors[0][1] and "c4" not in errors[0][1]  # c1 comes first (train), as alone


def test_zero_means_the_usable_cpus_at_most_eight(monkeypatch):
    from fedseg.data import prefetch

    monkeypatch.setattr(prefetch, "cgroup_cpu_limit", lambda: None)  # the affinity alone (a CI container may cap it)
    cpus = len(__import__("os").sched_getaffinity(0))
    assert prepare_threads(DataConfig()) == max(1, min(cpus, 8))
    assert prepare_threads(DataConfig(prepare_threads=3)) == 3


def test_only_scored_cases_keep_their_original_grid_truth(folder):
    """A training case is never scored: its volume keeps no original-grid truth (a quarter of a BraTS case's memory);
    scoring it anyway is one clear error, not a crash inside the metrics."""
    from fedseg.config import ModelConfig
    from fedseg.evaluate.sliding import score_volumes
    from fedseg.models.factory import build_segmenter

    volume = VolumeConfig(patch_size=(8, 8, 8))
    site = _site(folder, 2, volume=volume)
    assert site.train.volumes and all(v.truth is None for v in site.train.volumes)
    for split in ("val", "test"):
        vols = site.split(split).volumes
        assert vols and all(v.truth is not None and v.truth.shape[1:] == v.grid.shape for v in vols)
    net = build_segmenter(ModelConfig(name="unet", channels=[4, 8]), 3, 2, 2, 0).eval()
    scores = score_volumes(net, site.val.volumes, volume, 0.5, False, torch.device("cpu"))
    assert scores["dice"].shape == (len(site.val.volumes), 2)
    with pytest.raises(ValueError, match="volume 0: a training case, without original-grid truth, cannot be scored"):
        score_volumes(net, site.train.volumes, volume, 0.5, False, torch.device("cpu"))


def test_an_error_returns_at_once_while_the_items_being_computed_finish_in_the_background():
    """``ordered_map`` raises the first failing item's error without waiting for the items other threads compute (a
    second Ctrl-C would otherwise land in that wait), and the command's exit does not wait for those threads."""
    from fedseg.data.prefetch import ordered_map
    from fedseg.interrupts import DISCARDABLE_THREADS
    from fedseg.process_exit import other_threads_running

    release = threading.Event()

    def fn(i: int) -> int:
        if i == 0:
            raise ValueError("case 0 is damaged")
        release.wait(60)
        return i

    try:
        with pytest.raises(ValueError, match="case 0 is damaged"):
            list(ordered_map(fn, range(4), 2, name="test"))
        running = [t for t in threading.enumerate() if t.name.startswith(f"{DISCARDABLE_THREADS}-test")]
        assert running and all(t.is_alive() for t in running)  # not waited for: still blocked in fn
        assert not other_threads_running()  # the command may exit now
    finally:
        release.set()


def test_each_item_runs_in_a_copy_of_the_callers_context():
    """A context variable the caller set (e.g. rtstruct's notices already given) is seen by every thread."""
    from fedseg.data.prefetch import ordered_map

    seen: contextvars.ContextVar[str] = contextvars.ContextVar("seen", default="unset")
    seen.set("the caller's")
    assert list(ordered_map(lambda i: (i, seen.get()), range(5), 3)) == [(i, "the caller's") for i in range(5)]


def _cgroup_tree(tmp_path, files: dict[str, str], cgroups: str):
    root = tmp_path / "sys-fs-cgroup"
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    listing = tmp_path / "proc-self-cgroup"
    listing.write_text(cgroups)
    return listing, root


@pytest.mark.parametrize(
    ("files", "cgroups", "expected"),
    [
        ({"cpu.max": "200000 100000\n"}, "0::/\n", 2.0),  # v2 in a container (docker --cpus 2)
        ({"cpu.max": "max 100000\n"}, "0::/\n", None),  # v2 without a quota
        ({"kubepods/cpu.max": "150000 100000\n", "kubepods/pod1/cpu.max": "max 100000\n"}, "0::/kubepods/pod1\n", 1.5),
        (
            {"cpu,cpuacct/cpu.cfs_quota_us": "50000\n", "cpu,cpuacct/cpu.cfs_period_us": "100000\n"},
            "4:memory:/x\n2:cpu,cpuacct:/docker/abc\n",
            0.5,
        ),  # v1; the container's own cgroup is the mount's root
        ({"cpu/cpu.cfs_quota_us": "-1\n", "cpu/cpu.cfs_period_us": "100000\n"}, "1:cpu:/\n", None),  # v1, none
        ({"cpu.max": "garbage\n"}, "0::/\n", None),  # unreadable: no quota, never an error
    ],
    ids=["v2", "v2-max", "v2-parent", "v1", "v1-none", "garbled"],
)
def test_the_cgroup_cpu_quota_is_read_from_v1_and_v2(tmp_path, files, cgroups, expected):
    from fedseg.data.prefetch import cgroup_cpu_limit

    listing, root = _cgroup_tree(tmp_path, files, cgroups)
    assert cgroup_cpu_limit(listing, root) == expected
    assert cgroup_cpu_limit(tmp_path / "no-such-file", root) is None  # not Linux


def test_usable_cpus_is_capped_by_the_cgroup_quota(monkeypatch):
    """docker --cpus 1.5 on a machine of more CPUs: 2 threads (rounded up), never more than the affinity allows."""
    from fedseg.data import prefetch

    cpus = len(__import__("os").sched_getaffinity(0))
    monkeypatch.setattr(prefetch, "cgroup_cpu_limit", lambda: 1.5)
    assert prefetch.usable_cpus() == min(cpus, 2)
    monkeypatch.setattr(prefetch, "cgroup_cpu_limit", lambda: 0.2)
    assert prefetch.usable_cpus() == 1
    monkeypatch.setattr(prefetch, "cgroup_cpu_limit", lambda: None)
    assert prefetch.usable_cpus() == cpus
