"""The on-disk cache of prepared cases (``$FEDSEG_PREPARED_CACHE``, ``fedseg.data.prepared``), on real NIfTI files:
a warm read gives the same tensors to the bit as preparing (volume path with resampling, whole-image path with the
original-grid truth), a changed file or setting is a new key (never a stale hit), a corrupt or truncated entry is
logged, removed and prepared again, an unwritable folder is one line, a dead writer's temp file is removed, and a
whole run gives the same results with the cache cold and warm."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from tests.test_prepare_threads import SPLITS, _assert_same, _federation, _site

from fedseg.config import DataConfig, VolumeConfig
from fedseg.data.federation import Federation
from fedseg.data.folder import load_folder
from fedseg.data.folder_write import write_folder
from fedseg.data.prepared import PREPARED_CACHE_ENV, SUFFIX, TEMP_PREFIX, read_case, remove_dead_temps

VOLUME = {"volume": VolumeConfig(patch_size=(8, 8, 8), spacing=(1.0, 1.0, 1.0))}  # resampled, cropped, padded
WHOLE = {"resize": "pad"}  # whole-image path: the original-grid truth of the scored splits


@pytest.fixture
def folder(tmp_path) -> Federation:
    return load_folder(write_folder(_federation(), tmp_path / "fed" / "blobs"))


@pytest.fixture
def cache(tmp_path, monkeypatch) -> Path:
    root = tmp_path / "prepared"
    monkeypatch.setenv(PREPARED_CACHE_ENV, str(root))
    return root


def _entries(root: Path) -> list[Path]:
    return sorted(root.glob(f"*/*/*{SUFFIX}"))


def _uncached(fed: Federation, monkeypatch, threads: int = 1, **data):
    with monkeypatch.context() as m:
        m.delenv(PREPARED_CACHE_ENV)
        return _site(fed, threads, **data)


@pytest.mark.parametrize("data", [VOLUME, WHOLE], ids=["volume", "whole-image"])
def test_a_warm_read_gives_the_same_tensors_as_preparing(folder, cache, monkeypatch, caplog, data):
    plain = _uncached(folder, monkeypatch, **data)
    with caplog.at_level(logging.INFO, "fedseg.data"):
        cold = _site(folder, 2, **data)
        warm = _site(folder, 2, **data)
    assert len(_entries(cache)) == len(folder.sites[0].cases)
    lines = [r.getMessage() for r in caplog.records if "prepared-case cache" in r.getMessage()]
    assert lines[0].startswith("site s: 0 of 9 cases read") and lines[0].endswith("9 prepared and stored there")
    assert lines[1].startswith("site s: 9 of 9 cases read") and lines[1].endswith("0 prepared and stored there")
    for split in SPLITS:
        _assert_same(plain.split(split), cold.split(split))
        _assert_same(plain.split(split), warm.split(split))
    if "volume" in data:  # the scored volumes kept their truth, the training ones none, as prepared
        assert all(v.truth is None for v in warm.train.volumes) and all(v.truth is not None for v in warm.val.volumes)


def test_a_volume_is_mapped_from_the_file_not_copied(folder, cache):
    _site(folder, 1, **VOLUME)
    prepared = read_case(_entries(cache)[0])
    assert prepared.volume is not None
    storage = prepared.volume.image.untyped_storage()
    assert storage.nbytes() == _entries(cache)[0].stat().st_size  # the whole file's mapping, not a copy
    prepared.volume.image.add_(1.0)  # copy on write: the file does not change
    assert torch.equal(read_case(_entries(cache)[0]).volume.image + 1.0, prepared.volume.image)


def test_a_changed_file_or_setting_is_a_new_key_never_a_stale_hit(folder, cache, monkeypatch, tmp_path):
    _site(folder, 1, **VOLUME)
    assert len(_entries(cache)) == 9
    _site(folder, 1, volume=VolumeConfig(patch_size=(8, 8, 8), spacing=(1.0, 1.0, 1.0), sw_overlap=0.25))
    assert len(_entries(cache)) == 9  # the sliding window never touches a prepared case: same keys
    _site(folder, 1, volume=VolumeConfig(patch_size=(8, 8, 8), spacing=(1.0, 1.0, 2.0)))
    assert len(_entries(cache)) == 18  # another spacing: every case prepared again
    # rewrite one image with other voxels: that case (and only it) gets a new key, and the new tensors
    other = _federation()
    other.sites[0].cases[0] = type(other.sites[0].cases[0]).from_arrays(
        "c0",
        other.sites[0].cases[1].arrays()[0][:, :14, :12, :10],
        other.sites[0].cases[0].arrays()[1],
        spacing=(1.0, 0.8, 1.5),
    )
    root = tmp_path / "fed" / "blobs"
    write_folder(other, tmp_path / "fed2" / "blobs")
    image = next((root / "s" / "images").glob("c0*"))
    image.write_bytes(next((tmp_path / "fed2" / "blobs" / "s" / "images").glob("c0*")).read_bytes())
    changed = load_folder(root)
    warm = _site(changed, 1, **VOLUME)
    assert len(_entries(cache)) == 19
    plain = _uncached(changed, monkeypatch, **VOLUME)
    for split in SPLITS:
        _assert_same(plain.split(split), warm.split(split))


@pytest.mark.parametrize("damage", ["flip", "truncate", "magic"])
def test_a_corrupt_entry_is_removed_and_prepared_again_not_trusted(folder, cache, monkeypatch, caplog, damage):
    _site(folder, 1, **VOLUME)
    victim = _entries(cache)[3]
    data = bytearray(victim.read_bytes())
    if damage == "flip":
        data[-100] ^= 0xFF  # one byte of the last tensor
    elif damage == "truncate":
        data = data[: len(data) // 2]
    else:
        data[:8] = b"NOTACASE"
    victim.write_bytes(bytes(data))
    with caplog.at_level(logging.INFO, "fedseg.data"):
        warm = _site(folder, 1, **VOLUME)
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and str(victim) in warnings[0] and "prepared again" in warnings[0]
    expected = {"flip": "content digest mismatch", "truncate": "truncated", "magic": "not a prepared-case file"}
    assert expected[damage] in warnings[0]
    assert any("8 of 9 cases read" in r.getMessage() for r in caplog.records)
    read_case(victim)  # rewritten sound
    plain = _uncached(folder, monkeypatch, **VOLUME)
    for split in SPLITS:
        _assert_same(plain.split(split), warm.split(split))


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into a read-only folder")
def test_an_unwritable_folder_is_one_line_and_the_run_goes_on(folder, cache, monkeypatch, caplog):
    cache.mkdir()
    cache.chmod(0o500)
    try:
        with caplog.at_level(logging.INFO, "fedseg.data"):
            site = _site(folder, 2, **VOLUME)
            _site(folder, 2, **VOLUME)
    finally:
        cache.chmod(0o700)
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) <= 1 and all("cannot write there" in w for w in warnings)  # once per process
    assert not _entries(cache)
    plain = _uncached(folder, monkeypatch, **VOLUME)
    _assert_same(plain.train, site.train)


def test_a_dead_writers_temp_file_is_removed_a_live_ones_kept(cache):
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    shard = cache / ("f" * 16) / "ab"
    shard.mkdir(parents=True)
    gone = shard / f"{TEMP_PREFIX}{int(dead.stdout)}-0000-ab12{SUFFIX}"
    live = shard / f"{TEMP_PREFIX}{os.getpid()}-0000-ab34{SUFFIX}"
    gone.write_bytes(b"half")
    live.write_bytes(b"half")
    assert remove_dead_temps(cache) == 1
    assert not gone.exists() and live.exists()


def test_a_run_gives_the_same_results_with_the_cache_cold_and_warm(folder, tmp_path):
    """The whole run on a federation folder: results.csv and the weights identical without the cache, cold, warm, and
    warm on the worker pool (its sites' volumes cross to the workers as copies)."""
    import hashlib

    root = tmp_path / "fed" / "blobs"
    outs = {}
    runs = (("off", None, 1), ("cold", tmp_path / "prepared", 1), ("warm", tmp_path / "prepared", 1))
    for name, env, workers in (*runs, ("warm-workers", tmp_path / "prepared", 2)):
        environ = {k: v for k, v in os.environ.items() if k != PREPARED_CACHE_ENV}
        if env is not None:
            environ[PREPARED_CACHE_ENV] = str(env)
        out = tmp_path / f"run-{name}"
        sets = "data.image_size=16 data.volume.patch_size=8 model.channels=[4,8] eval.hd95=false threads=1".split()
        command = f"run --preset fets-cpu --algorithms fedavg --rounds 1 --workers {workers}".split()
        done = subprocess.run(
            [sys.executable, "-m", "fedseg", *command, "--data", str(root), "--out", str(out)]
            + [arg for s in sets for arg in ("--set", s)],
            env=environ,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert done.returncode == 0, done.stderr[-2000:]
        said = {"off": None, "cold": "0 of 9 cases read", "warm": "9 of 9 cases read", "warm-workers": "9 of 9"}[name]
        noted = [line for line in done.stdout.splitlines() if "prepared-case cache" in line]
        assert (noted == []) if said is None else (len(noted) == 1 and said in noted[0]), done.stdout[-2000:]
        weights = sorted((out / "fedavg").rglob("*.safetensors"))
        outs[name] = ((out / "results.csv").read_text(), [hashlib.sha256(w.read_bytes()).hexdigest() for w in weights])
    assert outs["off"] == outs["cold"] == outs["warm"] == outs["warm-workers"]  # the pool: bit-identical on CPU
    assert len(_entries(tmp_path / "prepared")) == 9


def test_cache_list_and_clear_prepared(folder, cache):
    """``fedseg data cache list --prepared`` tells this fedseg's entries from another version's; ``clear --prepared``
    removes both and nothing else in the folder."""
    from typer.testing import CliRunner

    from fedseg.cli import app

    _site(folder, 1, **VOLUME)
    other = cache / ("0" * 16) / "ab"
    other.mkdir(parents=True)
    (other / f"{'ab' * 32}{SUFFIX}").write_bytes(b"an older fedseg's case")
    (cache / "notes.txt").write_text("mine\n")
    runner = CliRunner()
    listed = runner.invoke(app, ["data", "cache", "list", "--prepared"])
    assert listed.exit_code == 0, listed.output
    assert "9 prepared cases (this fedseg's)" in listed.output
    assert "1 prepared cases (another fedseg or library version's: never read by this one)" in listed.output
    assert "10 prepared cases" in listed.output.splitlines()[-1]
    stale = runner.invoke(app, ["data", "cache", "clear", "--stale"])
    assert stale.exit_code != 0 and "give --prepared too" in stale.output and "Traceback" not in stale.output
    notes = cache / "notes.txt"
    wrong = runner.invoke(app, ["data", "cache", "clear", "--prepared"], env={PREPARED_CACHE_ENV: str(notes)})
    assert wrong.exit_code != 0 and f"{PREPARED_CACHE_ENV}={notes}: not a folder" in wrong.output, wrong.output
    stale = runner.invoke(app, ["data", "cache", "clear", "--prepared", "--stale"])
    assert stale.exit_code == 0 and "removed 1 prepared cases prepared by other versions" in stale.output
    assert not (cache / ("0" * 16)).exists() and len(_entries(cache)) == 9  # this fedseg's left alone
    # a folder named like the cache's holding someone's files (an audit: it went whole): only the cache's files go
    mine = cache / ("1" * 16)
    (mine / "ab").mkdir(parents=True)
    (mine / "important.txt").write_text("mine\n")
    (mine / "ab" / "scan.nii.gz").write_bytes(b"not a case")
    (mine / "ab" / f"{'cd' * 32}{SUFFIX}").write_bytes(b"an older fedseg's case")
    stale = runner.invoke(app, ["data", "cache", "clear", "--prepared", "--stale"])
    assert stale.exit_code == 0 and "removed 1 prepared cases prepared by other versions" in stale.output
    assert f"note: {mine}: kept: it holds files fedseg did not write" in " ".join(stale.output.split())
    assert sorted(p.relative_to(mine).as_posix() for p in mine.rglob("*")) == ["ab", "ab/scan.nii.gz", "important.txt"]
    (mine / "ab" / "scan.nii.gz").rename(cache / "scan.nii.gz")
    (mine / "important.txt").rename(cache / "important.txt")
    cleared = runner.invoke(app, ["data", "cache", "clear", "--prepared"])
    assert cleared.exit_code == 0 and "removed 9 prepared cases" in cleared.output, cleared.output
    assert sorted(p.name for p in cache.iterdir()) == ["important.txt", "notes.txt", "scan.nii.gz"]  # mine: emptied


def test_other_versions_entries_are_named_once_when_they_hold_a_gigabyte(cache, caplog):
    """A run's cache, opened, names the space other fedseg versions' entries take (never read again, never removed
    automatically) in one line per process, from 1 GiB on; below it, nothing."""
    from fedseg.data import prepared

    def opened() -> list[str]:
        with caplog.at_level(logging.INFO, logger="fedseg.data.prepared"):
            caplog.clear()
            assert prepared.open_root() == (cache, True)
            return [r.getMessage() for r in caplog.records if "other fedseg" in r.getMessage()]

    old = cache / ("0" * 16) / "ab"
    old.mkdir(parents=True)
    with open(old / f"{'ab' * 32}{SUFFIX}", "wb") as f:
        f.truncate(prepared.STALE_NOTE_BYTES - 1)  # sparse: a size, no disk
    prepared._warned.discard(f"stale:{cache}")
    assert opened() == []
    with open(old / f"{'cd' * 32}{SUFFIX}", "wb") as f:
        f.truncate(1)
    (cache / ("1" * 16)).mkdir()  # an empty folder of another version, and a link: no version's entries
    (cache / ("2" * 16)).symlink_to(old.parent, target_is_directory=True)
    prepared._warned.discard(f"stale:{cache}")
    (line,) = opened()
    assert "1.1 GB (2 cases) prepared by 1 other fedseg or library version(s)" in line, line
    assert "fedseg data cache clear --prepared --stale" in line
    assert opened() == []  # once per process


def test_cache_list_prepared_without_the_variable_is_one_line(monkeypatch):
    from typer.testing import CliRunner

    from fedseg.cli import app

    monkeypatch.delenv(PREPARED_CACHE_ENV, raising=False)
    listed = CliRunner().invoke(app, ["data", "cache", "list", "--prepared"])
    assert listed.exit_code != 0 and f"{PREPARED_CACHE_ENV} is not set" in listed.output
    assert "Traceback" not in listed.output


def _blank_and_checked(tmp_path: Path) -> Path:
    """The blobs folder with one blank image (a warning the check gives) and a second site."""
    import numpy as np

    fed = _federation()
    image, label = fed.sites[0].cases[4].arrays()
    fed.sites[0].cases[4] = type(fed.sites[0].cases[4]).from_arrays("c4", np.zeros_like(image), label)
    return write_folder(fed, tmp_path / "checked" / "blobs")


def test_the_data_check_reads_no_image_of_an_unchanged_case_and_finds_the_same(tmp_path, cache, monkeypatch):
    """With the cache the check keeps what it found of each sound case (shape, label values, blank, orientation);
    a second check of unchanged files reads no image and gives the same federation and warnings; a changed file is
    checked again (its new fault found)."""
    import numpy as np

    from fedseg.data import check as check_module
    from fedseg.data.check import check_folder

    root = _blank_and_checked(tmp_path)
    found = []
    for _ in range(2):
        warnings: list[str] = []
        fed = check_folder(root, warnings=warnings)
        found.append(([dict(c.meta) for c in fed.sites[0].cases], warnings))
    assert any("every voxel holds the same value" in w for w in found[0][1])
    assert found[0] == found[1]
    assert len(list(cache.glob("*/*/*.check"))) == 9
    read: list[Path] = []
    real = check_module._check_case
    monkeypatch.setattr(check_module, "_check_case", lambda i, lb, h: read.append(i) or real(i, lb, h))
    check_folder(root)
    assert read == []  # nothing read: every case known
    label = next((root / "s" / "labels").glob("c2*"))
    import nibabel as nib

    img = nib.load(label)
    data = np.asarray(img.dataobj).copy()
    data[0, 0, 0] = 7  # a value no region has
    nib.save(nib.Nifti1Image(data, img.affine), label)
    with pytest.raises(Exception, match="label values 7 are not in any region"):
        check_folder(root)
    assert [p.name.split(".")[0] for p in read] == ["c2"]  # only the changed case read again


def test_a_damaged_check_record_is_checked_again(tmp_path, cache):
    from fedseg.data.check import check_folder

    root = _blank_and_checked(tmp_path)
    first = [dict(c.meta) for c in check_folder(root).sites[0].cases]
    for record in cache.glob("*/*/*.check"):
        record.write_text("{not json")
    again = [dict(c.meta) for c in check_folder(root).sites[0].cases]
    assert first == again
    assert all(record.read_text().startswith('{"shape"') for record in cache.glob("*/*/*.check"))


def test_the_checks_lines_do_not_depend_on_the_number_of_threads(tmp_path, monkeypatch):
    """Problems of several cases come in the cases' order whether one thread or several read them."""
    import gzip

    from fedseg.data import check as check_module
    from fedseg.data import dataset
    from fedseg.data.check import check_folder
    from fedseg.data.federation import FederationError

    root = write_folder(_federation(), tmp_path / "bad" / "blobs")
    for bad in ("c1", "c4", "c7"):
        path = root / "s" / "images" / f"{bad}.nii.gz"
        path.write_bytes(gzip.compress(gzip.decompress(path.read_bytes())[:400]))
    texts = []
    for cpus in (1, 4):
        monkeypatch.setattr(dataset, "usable_cpus", lambda cpus=cpus: cpus)
        assert check_module.check_threads(9) == (0 if cpus == 1 else cpus)
        with pytest.raises(FederationError) as caught:
            check_folder(root)
        texts.append(str(caught.value))
    assert texts[0] == texts[1]
    assert texts[0].index("c1.nii.gz") < texts[0].index("c4.nii.gz") < texts[0].index("c7.nii.gz")


# --- from a review: keys that missed what a case depends on, and a warm run on the worker pool ------------------
def _same_as_uncached(fed: Federation, monkeypatch, **data):
    """The site prepared with the cache, checked against one prepared without it; returned."""
    warm = _site(fed, 1, **data)
    plain = _uncached(fed, monkeypatch, **data)
    for split in SPLITS:
        _assert_same(plain.split(split), warm.split(split))
    return warm


def test_reordered_regions_are_a_new_key(folder, cache, monkeypatch, tmp_path):
    """The regions' order is the masks' channel order: a sorted key gave the old order's masks."""
    import yaml

    _site(folder, 1, **VOLUME)
    header = tmp_path / "fed" / "blobs" / "federation.yaml"
    spec = yaml.safe_load(header.read_text())
    spec["regions"] = dict(reversed(list(spec["regions"].items())))
    header.write_text(yaml.safe_dump(spec, sort_keys=False))
    reordered = load_folder(tmp_path / "fed" / "blobs")
    assert reordered.regions.names != folder.regions.names
    _same_as_uncached(reordered, monkeypatch, **VOLUME)
    assert len(_entries(cache)) == 18


def test_a_same_size_same_time_replacement_is_a_new_key(cache, monkeypatch, tmp_path):
    """``cp -p`` of a corrected label with the old size and modification time (uncompressed NIfTI of one shape always
    has one size): its inode and change time differ, which no tool sets back."""
    import gzip
    import shutil

    import nibabel as nib
    import numpy as np

    root = write_folder(_federation(), tmp_path / "plain" / "blobs")
    for packed in list(root.rglob("*.nii.gz")):
        packed.with_name(packed.name[:-3]).write_bytes(gzip.decompress(packed.read_bytes()))
        packed.unlink()
    _site(load_folder(root), 1, **VOLUME)
    label = root / "s" / "labels" / "c0.nii"
    old = label.stat()
    image = nib.load(label)
    data = np.asarray(image.dataobj).copy()
    data[data == 2] = 1  # the core relabelled as the rest
    corrected = tmp_path / "corrected" / label.name
    corrected.parent.mkdir()
    nib.save(nib.Nifti1Image(data, image.affine, image.header), corrected)
    os.utime(corrected, ns=(old.st_atime_ns, old.st_mtime_ns))
    shutil.copy2(corrected, label)
    assert (label.stat().st_size, label.stat().st_mtime_ns) == (old.st_size, old.st_mtime_ns)
    _same_as_uncached(load_folder(root), monkeypatch, **VOLUME)


def test_a_metaimage_data_file_is_in_the_key(cache, monkeypatch, tmp_path):
    """A ``.mhd`` header's voxels live in its ``ElementDataFile``: rewriting it is a new key (prepared and checked)."""
    itk = pytest.importorskip("itk")
    import numpy as np
    import yaml

    from fedseg.data.check import check_folder

    root = tmp_path / "mhd"
    for sub in ("s/images", "s/labels"):
        (root / sub).mkdir(parents=True)
    (root / "federation.yaml").write_text(
        yaml.safe_dump({"name": "m", "kind": "3d", "channels": 1, "regions": {"fg": [1]}})
    )
    rng = np.random.default_rng(0)
    for i in range(3):
        image = rng.normal(0, 1, (10, 12, 14)).astype(np.float32)
        label = np.zeros((10, 12, 14), np.uint8)
        label[2:6, 3:7, 4:9] = 1
        for array, path in ((image + 3 * label, root / f"s/images/c{i}.mhd"), (label, root / f"s/labels/c{i}.mhd")):
            itk.imwrite(itk.image_from_array(array), str(path))
    check_folder(root)
    fed = load_folder(root)
    _site(fed, 1, **VOLUME)
    data = root / "s/images/c1.raw"
    data.write_bytes(np.frombuffer(data.read_bytes(), np.float32)[::-1].tobytes())  # other voxels, same size
    _same_as_uncached(load_folder(root), monkeypatch, **VOLUME)
    label_data = root / "s/labels/c2.raw"
    label_data.write_bytes(label_data.read_bytes()[:100])  # an interrupted copy: the check must see it
    with pytest.raises(Exception, match="ends after 100 of 1680 bytes"):
        check_folder(root)


def test_a_federation_from_user_code_is_never_cached(folder, cache, monkeypatch):
    """A builder reusing a folder's cases with its own loader names the same files: its cases must not be keyed on
    them (it may transform the arrays)."""
    from dataclasses import replace

    import numpy as np

    def flipped(case):
        def load(case=case):
            image, label = case.arrays()
            return np.ascontiguousarray(image[:, ::-1]), np.ascontiguousarray(label[::-1])

        return replace(case, loader=load)

    _site(folder, 1, **VOLUME)
    user = replace(folder, sites=[replace(s, cases=[flipped(c) for c in s.cases]) for s in folder.sites])
    _same_as_uncached(user, monkeypatch, **VOLUME)
    assert len(_entries(cache)) == 9  # none added for the user's cases


def test_a_spacing_column_and_settings_that_do_not_shape_a_case(folder, cache, monkeypatch, tmp_path):
    """A ``cases.csv`` spacing (a string) is keyed as given; ``eval.score_grid`` (``originals``) does not shape a
    volume: the same entries."""
    root = tmp_path / "fed" / "blobs"
    (root / "s" / "cases.csv").write_text("case,spacing\n" + "".join(f"c{i},1.5\n" for i in range(9)))
    spaced = load_folder(root)
    _same_as_uncached(spaced, monkeypatch, **VOLUME)
    cfg = DataConfig(source="folder", image_size=16, normalize="zscore_foreground", **VOLUME)
    from fedseg.data.dataset import build_site_data

    splits = {case.id: SPLITS[i % 3] for i, case in enumerate(spaced.sites[0].cases)}
    build_site_data(spaced, spaced.sites[0], 0, splits, cfg, originals=False)
    assert len(_entries(cache)) == 9  # originals=True before: no case prepared again


def test_a_warm_site_pickles_as_small_as_a_cold_one(folder, cache, monkeypatch):
    """A volume mapped from its file is sent as a copy of its tensors (a mapping cannot be shared with a worker
    process: ``--workers 2`` failed with a bad file descriptor), not as the whole mapped file. A cold site's cases
    are read back once stored: mapped too (so a run that fills the cache holds no more than one that reads it)."""
    import pickle

    held = _uncached(folder, monkeypatch, **VOLUME)
    cold = _site(folder, 1, **VOLUME)
    warm = _site(folder, 1, **VOLUME)
    assert all(v.mapped for v in warm.train.volumes + cold.train.volumes)
    assert not any(v.mapped for v in held.train.volumes)
    sizes = [len(pickle.dumps(s.train)) for s in (held, cold, warm)]
    assert sizes[1] <= sizes[0] * 1.01 and sizes[2] <= sizes[0] * 1.01, sizes
    _assert_same(held.train, pickle.loads(pickle.dumps(warm.train)))


def test_a_mapped_volume_crosses_to_every_worker_as_one_copy(folder, cache):
    """The worker pool pickles the sites once per worker (``ForkingPickler``: a tensor's storage moves to shared
    memory once and every worker maps it): a mapped volume was copied anew for each, W copies of the volumes where a
    held one crosses once. Its copy is made once and sent to every worker."""
    from multiprocessing.reduction import ForkingPickler

    volume = _site(folder, 1, **VOLUME).train.volumes[0]
    assert volume.mapped
    first, second = volume.__getstate__(), volume.__getstate__()
    assert first["image"] is second["image"] and first["label"] is second["label"]
    assert first["mapped"] is False and first["image"].data_ptr() != volume.image.data_ptr()
    assert torch.equal(first["image"], volume.image)
    back = ForkingPickler.loads(ForkingPickler.dumps(volume))
    assert not back.mapped and torch.equal(back.image, volume.image) and torch.equal(back.label, volume.label)
    assert volume._sent is not None and volume._sent["image"].is_shared()  # pickled to shared memory in place


def test_an_empty_last_tensor_reads_back(tmp_path):
    from fedseg.data.prepared import PreparedCase, write_case

    path = tmp_path / "x.case"
    write_case(path, PreparedCase(torch.ones(2, 3), torch.zeros(0, 5), None, None))
    back = read_case(path)
    assert torch.equal(back.x, torch.ones(2, 3)) and back.y.shape == (0, 5)


def test_a_cache_that_cannot_be_written_is_read_and_never_written(folder, cache, monkeypatch, caplog):
    """A lab prepares once on a shared disk mounted read-only elsewhere: its entries are read, nothing is stored
    (the folder's write probe fails here as it does on a read-only mount; root ignores chmod)."""
    from pathlib import Path as RealPath

    from fedseg.data import prepared

    _site(folder, 1, **VOLUME)
    real_write = RealPath.write_bytes

    def read_only(self, data):
        if self.name.startswith(TEMP_PREFIX):
            raise PermissionError(30, "Read-only file system")
        return real_write(self, data)

    monkeypatch.setattr(RealPath, "write_bytes", read_only)
    monkeypatch.setattr(prepared, "write_case", lambda *a: pytest.fail("a read-only cache was written"))
    monkeypatch.setattr(prepared, "_warned", set())
    with caplog.at_level(logging.INFO, "fedseg.data"):
        warm = _site(folder, 1, volume=VolumeConfig(patch_size=(8, 8, 8), spacing=(1.0, 1.0, 1.0)))
        _site(folder, 1, volume=VolumeConfig(patch_size=(8, 8, 8), spacing=(2.0, 2.0, 2.0)))  # misses: not stored
    lines = [r.getMessage() for r in caplog.records]
    assert sum("reading what it holds, storing nothing" in line for line in lines) == 1
    assert any("9 of 9 cases read" in line for line in lines)
    assert len(_entries(cache)) == 9
    plain = _uncached(folder, monkeypatch, **VOLUME)
    _assert_same(plain.train, warm.train)


def test_prepared_cases_are_readable_by_their_owner_only(folder, cache):
    """A prepared case is a patient's image: its file is 0600 and the folders fedseg makes for it 0700 (the check
    records too), whatever the umask lets a normal file be."""
    import stat

    _site(folder, 1, **VOLUME)
    from fedseg.data.check import check_folder

    check_folder(folder.sites[0].cases[0].meta["image"].rsplit("/s/images/", 1)[0])
    files = _entries(cache) + sorted(cache.glob("*/*/*.check"))
    assert files and {stat.S_IMODE(f.stat().st_mode) for f in files} == {0o600}
    folders = {f.parent for f in files} | {f.parent.parent for f in files} | {cache}
    assert {stat.S_IMODE(d.stat().st_mode) for d in folders} == {0o700}


# --- from a second review -------------------------------------------------------------------------------------
def test_a_detached_nrrd_data_file_is_in_the_key(tmp_path):
    """A NRRD header naming its voxels' file (``data file:``): that file is keyed as a MetaImage's is."""
    import functools

    import numpy as np

    from fedseg.data.case_files import load_case
    from fedseg.data.federation import Case, Regions, Site
    from fedseg.data.prepared import case_files, case_key

    (tmp_path / "img.raw").write_bytes(np.zeros((4, 4, 4), np.float32).tobytes())
    (tmp_path / "lab.raw").write_bytes(np.zeros((4, 4, 4), np.uint8).tobytes())
    for name, kind in (("img", "float"), ("lab", "uint8")):
        header = f"NRRD0004\ntype: {kind}\ndimension: 3\nsizes: 4 4 4\nencoding: raw\nendian: little\n"
        (tmp_path / f"{name}.nrrd").write_text(header + f"data file: {name}.raw\n")
    image, label = tmp_path / "img.nrrd", tmp_path / "lab.nrrd"
    case = Case("c", functools.partial(load_case, image, label, "3d", 1), {"image": str(image), "label": str(label)})
    assert [p.name for p in case_files(case)] == ["img.nrrd", "img.raw", "lab.nrrd", "lab.raw"]
    fed = Federation("n", "3d", 1, Regions.from_mapping({"fg": [1]}), [Site("s", [case])])
    cfg = DataConfig(source="folder", image_size=16)
    before = case_key(fed, case, cfg, scored=True, originals=False)
    (tmp_path / "img.raw").unlink()
    (tmp_path / "img.raw").write_bytes(np.ones((4, 4, 4), np.float32).tobytes())
    assert case_key(fed, case, cfg, scored=True, originals=False) != before
    assert float(case.arrays()[0].sum()) == 64.0


def test_the_check_records_are_keyed_by_the_checks_own_code(tmp_path, cache, monkeypatch):
    """The data check's rules live in fedseg.data.check, which prepares no case: its records are keyed by it too, so
    a fedseg whose check finds more reads every case again (a new rule would otherwise pass stale records)."""
    from fedseg.data import check as check_module
    from fedseg.data import prepared
    from fedseg.data.check import check_folder

    assert any(p.name == "check.py" for p in prepared.preparing_modules(prepared.CHECKING_ROOTS))
    assert not any(p.name == "check.py" for p in prepared.preparing_modules())
    root = _blank_and_checked(tmp_path)
    check_folder(root)
    real = prepared.code_digest
    newer = {prepared.CHECKING_ROOTS: "-a-newer-check"}  # the check's code changed, the preparation's did not

    monkeypatch.setattr(
        prepared, "code_digest", lambda roots=prepared.PREPARING_ROOTS: real(roots) + newer.get(roots, "")
    )
    read: list[Path] = []
    real_check = check_module._check_case
    monkeypatch.setattr(check_module, "_check_case", lambda i, lb, h: read.append(i) or real_check(i, lb, h))
    check_folder(root)
    assert len(read) == 9


def test_an_entry_in_a_folder_this_user_cannot_read_is_a_miss_not_a_crash(folder, cache, monkeypatch):
    """A shared cache where another user's run made a code folder 0700: looking an entry up there is a miss."""
    from pathlib import Path as RealPath

    _site(folder, 1, **VOLUME)
    real_is_file = RealPath.is_file

    def forbidden(self):
        if self.suffix == SUFFIX:
            raise PermissionError(13, "Permission denied", str(self))
        return real_is_file(self)

    monkeypatch.setattr(RealPath, "is_file", forbidden)
    site = _same_as_uncached(folder, monkeypatch, **VOLUME)
    assert site.cache_counts[0] == 0  # every lookup a miss, none a crash


def test_a_runs_check_reads_with_data_prepare_threads(tmp_path, monkeypatch):
    """``data.prepare_threads: 1`` (memory, or a reader that is not thread-safe) holds for the run's data check too."""
    from fedseg.config_load import config_from_cli
    from fedseg.data import check as check_module
    from fedseg.run.preparation import load_federation

    root = write_folder(_federation(), tmp_path / "t" / "blobs")
    counts: list[int] = []
    real = check_module.check_threads
    monkeypatch.setattr(check_module, "check_threads", lambda n, t=None: counts.append(real(n, t)) or counts[-1])
    for threads in (1, 3):
        cfg = config_from_cli("fets-cpu", None, str(root), "fedavg", 1, None, [f"data.prepare_threads={threads}"])
        load_federation(cfg)
    assert counts == [0, 3]  # 1: the caller's thread
