"""A run whose prepared cases will not fit in memory is refused early, in one line (``fedseg.data.memory_guard``):
on real NIfTI folders, a preparation that a tiny (fake ``/proc/meminfo``) memory cannot hold stops after the first
cases with the numbers and what to do; with room it gives the same tensors as no check; volumes mapped from the
prepared-case cache count nothing (but once per worker of the pool); ``FEDSEG_MEMORY_CHECK=off`` skips it; and
``fedseg run`` says it in one line, leaving its ``--out`` as any failed preparation does."""

from __future__ import annotations

import functools
import os
import re
from pathlib import Path

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from fedseg.config import RunConfig
from fedseg.data import memory_guard
from fedseg.data.dataset import SiteData, build_site_data
from fedseg.data.federation import Case, Federation, Regions, Site
from fedseg.data.folder import load_folder
from fedseg.data.folder_write import write_folder
from fedseg.data.memory_guard import (
    MEMORY_CHECK_ENV,
    MEMORY_SHARE_ENV,
    MEMORY_SHARED_ENV,
    MemoryGuard,
    NotEnoughMemory,
    cgroup_memory_headroom,
    meminfo_available,
)
from fedseg.data.prepared import PREPARED_CACHE_ENV, PreparedCase
from fedseg.run.preparation import federation_splits, prepared_sites
from test_bad_input_cli import _one_error_line
from test_prepare_threads import SPLITS, _assert_same, _federation

# resampled to half the voxel size: the volumes (about 270 kB a case) dwarf the model-size views (8 kB)
VOLUME = {"image_size": 8, "volume": {"patch_size": 8, "spacing": [0.5, 0.5, 0.5]}}
WHOLE = {"image_size": 8, "resize": "pad"}  # whole-image path; the scored cases keep their original-grid truth
TINY_KB = 1000  # MemAvailable that the 18 cases' volumes (about 5 MB) exceed and their views (150 kB) do not


@pytest.fixture(scope="module")
def root(tmp_path_factory) -> Path:
    """Two sites (a, b) of the 9 blob cases each, as a federation folder."""
    fed = _federation()
    two = Federation(fed.name, fed.kind, fed.channels, fed.regions, [Site(n, list(fed.sites[0].cases)) for n in "ab"])
    return write_folder(two, tmp_path_factory.mktemp("fed") / "blobs")


@pytest.fixture
def memory(tmp_path, monkeypatch):
    """Set the memory the check sees: a fake ``/proc/meminfo`` and no cgroup (this machine's own would cap it)."""
    monkeypatch.setattr(memory_guard, "CGROUPS", tmp_path / "no-cgroup-list")
    monkeypatch.delenv(MEMORY_CHECK_ENV, raising=False)
    monkeypatch.delenv(PREPARED_CACHE_ENV, raising=False)

    def available(kb: int | None) -> None:
        meminfo = tmp_path / "meminfo"
        meminfo.write_text("MemTotal:       64000000 kB\nMemFree:  1 kB\n" + (f"MemAvailable: {kb} kB\n" if kb else ""))
        monkeypatch.setattr(memory_guard, "MEMINFO", meminfo)

    return available


def _cfg(root: Path, workers: int = 1, **data) -> RunConfig:
    data = {"source": "folder", "root": str(root), "normalize": "zscore_foreground", "prepare_threads": 1, **data}
    return RunConfig.model_validate({"data": data, "model": {"channels": [4, 8]}, "engine": {"workers": workers}})


class Counting(functools.partial):
    """A folder case's loader (still the folder reader's, so the cache keys it) counting its calls."""

    calls: list[str] = []

    def __call__(self, *args, **kwargs):
        Counting.calls.append(self.func.__name__)
        return super().__call__(*args, **kwargs)


def _prepare(cfg: RunConfig) -> tuple[list[SiteData], int]:
    """Every site prepared as a run prepares them (``prepared_sites``), and how many cases were read."""
    fed, splits, _ = federation_splits(cfg, None)
    for site in fed.sites:
        site.cases = [Case(c.id, _counting(c.loader), c.meta, c.spacing) for c in site.cases]
    Counting.calls = []
    return prepared_sites(cfg, fed, splits).site_data, len(Counting.calls)


def _counting(loader) -> Counting:
    assert isinstance(loader, functools.partial)  # the folder reader's
    return Counting(loader.func, *loader.args, **loader.keywords)


def _refusal(cfg: RunConfig) -> tuple[str, int]:
    with pytest.raises(NotEnoughMemory) as caught:
        _prepare(cfg)
    return str(caught.value), len(Counting.calls)


def _kept_bytes(sets) -> list[int]:
    """Per case, in the order the jobs are prepared (train, val, test), the bytes its set keeps of it (counted
    from the sets, not by the module): its rows of ``x``/``y``, its volume's tensors."""
    sizes = []
    for s in sets:
        for i in range(len(s)):
            size = s.x[i].nbytes + s.y[i].nbytes
            vol = s.volumes[i] if s.volumes else None
            if vol is not None:
                size += sum(t.nbytes for t in (vol.image, vol.label, vol.truth) if t is not None)
            sizes.append(size)
    return sizes


def test_a_preparation_that_will_not_fit_is_refused_after_its_first_cases(root, memory, monkeypatch):
    monkeypatch.setenv(MEMORY_CHECK_ENV, "off")
    full, read = _prepare(_cfg(root, **VOLUME))
    assert read == 18
    sets = [full[0].split(s) for s in SPLITS]
    first = _kept_bytes(sets)[:8]  # site a's jobs: its 9 cases, train first
    trained = first[: len(sets[0])]
    scored = first[len(sets[0]) :]  # validation and test cases keep their truth: projected at their own mean
    scored_total = sum(len(d.split(s)) for d in full for s in SPLITS[1:])
    scored_left, train_left = scored_total - len(scored), 18 - 8 - (scored_total - len(scored))
    expected = sum(first) + train_left * sum(trained) / len(trained) + scored_left * sum(scored) / len(scored)
    monkeypatch.delenv(MEMORY_CHECK_ENV)
    memory(TINY_KB)
    line, read = _refusal(_cfg(root, **VOLUME))
    assert read == 8  # stopped at the early check: 8 of 18 cases read, site b never started
    assert "\n" not in line
    mb = f"{expected / 18 / 1e6:.3g}"
    assert f"not enough memory to prepare this run's 18 cases: at {mb} MB a case (projected from the first 8)" in line
    projected = float(re.search(r"would hold about ([\d.e+-]+) GB", line)[1])
    assert projected == pytest.approx(expected / 1e9, rel=1e-2)
    assert f"more than 90% of the {TINY_KB * 1024 / 1e9:.3g} GB this process can have (MemAvailable)" in line
    assert f"set {PREPARED_CACHE_ENV}=DIR" in line and "data.volume.spacing" in line and "fewer sites" in line
    assert line.endswith(f"{MEMORY_CHECK_ENV}=off skips this check (with swap to spare)")


def test_a_site_prepared_alone_is_checked_over_its_own_cases(root, memory):
    """A Flower SuperNode prepares its own site through ``build_site_data`` without a guard: one is made for that
    site's 9 cases (not the federation's 18), and fewer sites is no advice to a site."""
    memory(TINY_KB)
    fed = load_folder(root)
    splits = {case.id: SPLITS[i % 3] for i, case in enumerate(fed.sites[1].cases)}
    with pytest.raises(NotEnoughMemory, match=r"this run's 9 cases: .* \(projected from the first 8\)") as caught:
        build_site_data(fed, fed.sites[1], 1, splits, _cfg(root, **VOLUME).data, originals=False)
    assert "fewer sites" not in str(caught.value)


def _case(mb: float, scored: bool) -> PreparedCase:
    """A prepared whole-image case holding ``mb`` MB (float32 ``x``), with its packed truth if ``scored``."""
    x = torch.zeros(int(mb * 1e6) // 4)
    return PreparedCase(x, torch.zeros(0), None, np.zeros(8, bool) if scored else None)


def test_a_later_site_of_larger_cases_or_heavier_scored_cases_are_refused_when_they_come():
    """The guard checked once, after the first 8 cases: sites ordered small to large slipped through (10 cases of 1 MB,
    then 100 of 1 GB: 100 GB held of 20 available), and so did a site whose validation and test cases (prepared after
    its training cases, keeping their truth too) are larger than the first ones. Each case is checked now, the cases to
    come projected at the larger of the mean and the scored cases' mean."""
    small_then_large = MemoryGuard(110, 2, available=(int(20e9), "test"))
    for _ in range(10):
        small_then_large.add(_case(1, False), None)  # type: ignore[arg-type]
    with pytest.raises(NotEnoughMemory):
        for _ in range(100):
            small_then_large.add(_case(1000, False), None)  # type: ignore[arg-type]
    assert small_then_large.measured < 30 and small_then_large.held < 18e9  # refused before the memory was full
    heavier = MemoryGuard(100, available=(int(11.5e6), "test"), scored_cases=30)
    for _ in range(70):
        heavier.add(_case(0.1, False), None)  # type: ignore[arg-type]
    with pytest.raises(NotEnoughMemory):
        for _ in range(30):
            heavier.add(_case(0.13, True), None, scored=True)  # type: ignore[arg-type]
    assert heavier.measured < 100 and heavier.projected() > 0.9 * 11.5e6


def test_the_training_cases_to_come_are_not_projected_at_the_scored_cases_size():
    """A second reviewer: every case to come was projected at the scored cases' mean once one was measured, and a
    whole-image run whose scored cases keep large originals (4 sites of 400 training cases, then 100 scored ones
    ten times their size: 1.68 GB of 2 GB) was refused at its first scored case, projecting 1.8 times what it held.
    The training cases to come are projected at the training mean, the scored ones at theirs: it runs."""
    fits = MemoryGuard(2000, 4, available=(int(2e9), "test"), scored_cases=400)
    for _ in range(4):
        for _ in range(400):
            fits.add(_case(0.3, False), None)  # type: ignore[arg-type]
        for _ in range(100):
            fits.add(_case(3.0, True), None, scored=True)  # type: ignore[arg-type]
        fits.site_done()
    assert fits.measured == 2000 and 1.6e9 < fits.held < 0.9 * 2e9


def _federation_2d() -> Federation:
    rng = np.random.default_rng(5)
    cases = []
    for i in range(6):
        label = np.zeros((20 + i, 24), np.uint8)
        label[5:12, 6:15] = 1
        cases.append(Case.from_arrays(f"p{i}", rng.normal(0, 1, (1, 20 + i, 24)).astype(np.float32) + label, label))
    sites = [Site(n, list(cases)) for n in "ab"]
    return Federation("flat", "2d", 1, Regions.from_mapping({"fg": [1]}), sites)


@pytest.mark.parametrize("kind", ["volume", "whole-image", "2d"])
def test_with_room_the_check_passes_and_the_tensors_are_those_without_it(root, memory, monkeypatch, tmp_path, kind):
    """The machine's real memory (a 2D federation's few MB always fit) or ample fake memory: the same tensors as
    with the check off, and the guard counted what the sets keep."""
    if kind == "2d":
        cfg = _cfg(write_folder(_federation_2d(), tmp_path / "flat"), image_size=16, resize="pad")
        monkeypatch.setattr(memory_guard, "MEMINFO", Path("/proc/meminfo"))
    else:
        cfg = _cfg(root, **(VOLUME if kind == "volume" else WHOLE))
        memory(64_000_000)
    checked, read = _prepare(cfg)
    assert read == sum(len(d.train) + len(d.val) + len(d.test) for d in checked)
    monkeypatch.setenv(MEMORY_CHECK_ENV, "off")
    plain, _ = _prepare(cfg)
    for a, b in zip(checked, plain, strict=True):
        for split in SPLITS:
            _assert_same(a.split(split), b.split(split))
    # what the guard counts is what the sets keep (views, volumes, packed truth), case by case
    monkeypatch.delenv(MEMORY_CHECK_ENV)
    fed, splits, _ = federation_splits(cfg, None)
    guard = MemoryGuard(len(fed.sites[0].cases), available=(2**62, "test"))
    site = build_site_data(fed, fed.sites[0], 0, splits[fed.sites[0].name], cfg.data, originals=True, guard=guard)
    sets = [site.split(s) for s in SPLITS]
    packed = sum(s.originals.bits.nbytes for s in sets if s.originals is not None)
    assert guard.measured == len(fed.sites[0].cases)
    assert guard.held == sum(_kept_bytes(sets)) + packed
    assert (packed > 0) == (kind != "volume") and (guard.volumes > 0) == (kind == "volume")


def test_volumes_mapped_from_the_prepared_cache_count_nothing(root, memory, monkeypatch, tmp_path):
    """The limit that refused the run without the cache lets it prepare with it, cold (each case read back mapped
    once stored) and warm; the worker pool keeps one copy of the mapped volumes in shared memory: refused again."""
    monkeypatch.setenv(PREPARED_CACHE_ENV, str(tmp_path / "prepared"))
    memory(TINY_KB)
    cold, read = _prepare(_cfg(root, **VOLUME))
    warm, _ = _prepare(_cfg(root, **VOLUME))
    assert read == 18 and len(list((tmp_path / "prepared").glob("*/*/*.case"))) == 18
    for data in (cold, warm):
        assert all(v.mapped for d in data for s in SPLITS for v in d.split(s).volumes or [])
    monkeypatch.delenv(PREPARED_CACHE_ENV)
    _refusal(_cfg(root, **VOLUME))  # the same limit refuses the volumes held
    monkeypatch.setenv(PREPARED_CACHE_ENV, str(tmp_path / "prepared"))
    line, read = _refusal(_cfg(root, workers=2, **VOLUME))
    assert read == 0 and "(projected from the first 8)" in line  # warm: no file read
    assert "--workers 1 (the worker pool keeps a copy" in line and f"set {PREPARED_CACHE_ENV}" not in line


def test_the_check_is_off_with_the_variable_or_without_meminfo(root, memory, monkeypatch, tmp_path):
    memory(TINY_KB)
    for off in ("off", "OFF"):
        monkeypatch.setenv(MEMORY_CHECK_ENV, off)
        _, read = _prepare(_cfg(root, **VOLUME))
        assert read == 18
    monkeypatch.setenv(MEMORY_CHECK_ENV, "on")  # any other value: checked
    _refusal(_cfg(root, **VOLUME))
    monkeypatch.setattr(memory_guard, "MEMINFO", tmp_path / "no-proc-meminfo")  # macOS: no check, no word
    _, read = _prepare(_cfg(root, **VOLUME))
    assert read == 18


def test_fedseg_run_says_it_in_one_line_and_leaves_out_as_a_failed_preparation(root, memory, tmp_path):
    """The CLI's one ``error:`` line, no traceback; a new ``--out`` not made, an existing one left as a run whose
    preparation fails leaves it (here: a spacing of two axes for 3D cases, found when the first case is prepared)."""
    from fedseg.cli import app

    memory(TINY_KB)
    sets = ["data.image_size=8", "data.volume.patch_size=8", "data.volume.spacing=[0.5,0.5,0.5]", "threads=1"]
    sets += ["data.prepare_threads=1", "model.channels=[4,8]"]

    def run(out: Path, *more: str):
        args = ["run", "--preset", "fets-cpu", "--rounds", "1", "--data", str(root), "--out", str(out)]
        return CliRunner().invoke(app, args + [a for s in [*sets, *more] for a in ("--set", s)])

    line = _one_error_line(run(tmp_path / "new"))
    assert line.startswith("error: not enough memory to prepare this run's 18 cases") and "GB" in line
    assert not (tmp_path / "new").exists()
    for name, more in (("refused", ()), ("failed", ("data.volume.spacing=[0.5,0.5]",))):
        (tmp_path / name).mkdir()
        _one_error_line(run(tmp_path / name, *more))
    assert sorted(p.name for p in (tmp_path / "refused").iterdir()) == sorted(
        p.name for p in (tmp_path / "failed").iterdir()
    )


@pytest.mark.parametrize(
    ("files", "cgroups", "expected"),
    [
        (
            {"memory.max": "4000\n", "memory.current": "1500\n", "memory.stat": "anon 1\ninactive_file 500\n"},
            "0::/\n",
            3000,
        ),
        ({"memory.max": "max\n", "memory.current": "1500\n"}, "0::/\n", None),  # v2 without a limit
        (
            {"kubepods/memory.max": "8000\n", "kubepods/memory.current": "7000\n", "kubepods/pod1/memory.max": "max\n"},
            "0::/kubepods/pod1\n",
            1000,
        ),  # the pod's parent sets the limit
        (
            {
                "memory.limit_in_bytes": "4000\n",
                "memory.usage_in_bytes": "1000\n",
                "memory.stat": "total_inactive_file 200\n",
            },
            "4:memory:/docker/abc\n2:cpu,cpuacct:/docker/abc\n",
            3200,
        ),  # v1; the container's own cgroup is the mount's root
        ({"memory.limit_in_bytes": "9223372036854771712\n"}, "4:memory:/\n", None),  # v1 unlimited
        ({"memory.max": "lots\n"}, "0::/\n", None),  # unreadable: no limit, never an error
    ],
    ids=["v2", "v2-max", "v2-parent", "v1", "v1-unlimited", "garbled"],
)
def test_the_cgroup_memory_headroom_is_read_from_v1_and_v2(tmp_path, files, cgroups, expected):
    base = tmp_path / "sys-fs-cgroup"
    mount = base / "memory" if "memory:" in cgroups else base
    for rel, text in files.items():
        (mount / rel).parent.mkdir(parents=True, exist_ok=True)
        (mount / rel).write_text(text)
    listing = tmp_path / "proc-self-cgroup"
    listing.write_text(cgroups)
    assert cgroup_memory_headroom(listing, base) == expected
    assert cgroup_memory_headroom(tmp_path / "no-such-file", base) is None  # not Linux


def test_meminfo_available_and_the_cgroup_cap(tmp_path, monkeypatch):
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal: 16000 kB\nMemAvailable:    12000 kB\nBuffers: 3 kB\n")
    assert meminfo_available(meminfo) == 12000 * 1024
    meminfo.write_text("MemTotal: 16000 kB\nMemFree: 9 kB\n")  # a kernel before 3.14
    assert meminfo_available(meminfo) is None
    assert meminfo_available(tmp_path / "absent") is None
    meminfo.write_text("MemAvailable: 12000 kB\n")
    cgroup = tmp_path / "cg"
    cgroup.mkdir()
    (cgroup / "memory.max").write_text("1000000\n")
    (cgroup / "memory.current").write_text("0\n")
    (tmp_path / "list").write_text("0::/\n")
    monkeypatch.setattr(memory_guard, "MEMINFO", meminfo)
    monkeypatch.setattr(memory_guard, "CGROUPS", tmp_path / "list")
    monkeypatch.setattr(memory_guard, "CGROUP_ROOT", cgroup)
    assert memory_guard.memory_available() == (1000000, "the headroom its cgroup's memory limit leaves")
    (cgroup / "memory.max").write_text("max\n")
    assert memory_guard.memory_available() == (12000 * 1024, "MemAvailable")


def test_a_view_keeps_its_whole_storage(tmp_path):
    """A volume whose tensors are views of a larger buffer holds that buffer: counted whole, once."""
    from fedseg.data.memory_guard import storage_bytes

    base = torch.zeros(1000)
    assert storage_bytes([base[:10], base[500:]]) == 4000
    assert storage_bytes([torch.zeros(10), torch.zeros(10)]) == 80


def test_a_bench_job_is_checked_against_its_share_of_the_memory(memory, monkeypatch):
    """``fedseg bench --jobs N`` runs N runs at once, each seeing the same free memory: each was judged alone, so two
    runs of 12 GB each passed on 20 GB. Told its share (``FEDSEG_MEMORY_SHARE=2`` of ``FEDSEG_MEMORY_SHARED`` bytes,
    as the bench sets it), a run is checked against half of what the bench found, and the line says so; with less
    available now than its share, against what it finds; without the bytes, against half of what it finds."""
    memory(int(20e9 / 1024))  # 20 GB MemAvailable

    def projected_gb(cases: int = 10, mb: float = 1200) -> MemoryGuard:
        guard = MemoryGuard.start(cases)
        for _ in range(cases - 1):  # the guard checks until the last case is in
            guard.add(_case(mb, False), None)  # type: ignore[arg-type]
        return guard

    assert projected_gb().available == (20_000_000_000 - 20_000_000_000 % 1024, "MemAvailable")  # alone: 12 GB fit
    monkeypatch.setenv(MEMORY_SHARE_ENV, "2")
    monkeypatch.setenv(MEMORY_SHARED_ENV, str(int(16e9)))
    with pytest.raises(NotEnoughMemory) as caught:
        projected_gb()
    line = str(caught.value)
    assert "they would hold about 12 GB, more than 90% of the 8 GB this process can have (this job's 1/2 share" in line
    assert "of the 16 GB of what the bench found available, FEDSEG_MEMORY_SHARE=2)" in line
    assert "fewer runs at once (fedseg bench --jobs below 2)" in line and "\n" not in line
    guard = projected_gb(mb=700)  # 7 GB: 90% of 8 GB is 7.2
    assert guard.available is not None and guard.available[0] == 8_000_000_000 and guard.share is not None
    monkeypatch.setenv(MEMORY_SHARED_ENV, str(int(60e9)))  # 30 GB a job, but 20 GB available now: checked on 20
    assert projected_gb().available == (20_000_000_000 - 20_000_000_000 % 1024, "MemAvailable")
    monkeypatch.delenv(MEMORY_SHARED_ENV)  # set by hand: half of what the process finds
    halved = r"of the 10 GB this process can have \(this job's 1/2 share of the 20 GB"
    with pytest.raises(NotEnoughMemory, match=halved):
        projected_gb()
    monkeypatch.setenv(MEMORY_SHARE_ENV, "1")
    projected_gb()
    bad = ("two", "0", "1_0", "+2", "²")  # int() reads the underscore, the plus sign and the superscript digit
    for name, value in [(MEMORY_SHARE_ENV, b) for b in bad] + [(MEMORY_SHARED_ENV, b) for b in ("-5", "0", "1_000")]:
        monkeypatch.setenv(name, value)
        with pytest.raises(ValueError, match=rf"^{name}='{re.escape(value)}': not a whole number of at least 1 \("):
            MemoryGuard.start(10)
        monkeypatch.setenv(MEMORY_SHARE_ENV, "2")
        monkeypatch.delenv(MEMORY_SHARED_ENV, raising=False)
    monkeypatch.delenv(MEMORY_SHARE_ENV)
    monkeypatch.setenv(MEMORY_SHARED_ENV, "1000")
    with pytest.raises(ValueError, match=f"^{MEMORY_SHARED_ENV} is set without {MEMORY_SHARE_ENV}"):
        MemoryGuard.start(10)


BENCH_WITH_FAKE_MEMORY = """
import sys
from pathlib import Path

from fedseg.data import memory_guard

# the bench's own process sees this MemAvailable (its run processes, fresh, read the machine's)
memory_guard.MEMINFO, memory_guard.CGROUPS = Path(sys.argv[1]), Path(sys.argv[2])
sys.argv = ["fedseg", *sys.argv[3:]]
from fedseg.cli import entry

entry()
"""


@pytest.mark.slow
def test_bench_jobs_tells_each_run_process_its_share(tmp_path):
    """``fedseg bench --jobs 2`` in a fresh process whose own MemAvailable reads 2 MB (its run processes, started by
    the forkserver, read this machine's real memory): each run is checked against 1 MB, half of what the bench
    found, and refused in one line (alone, each run process would have seen the machine's gigabytes and trained)."""
    import subprocess
    import sys

    import yaml

    from test_interrupts import TINY_SET

    (tmp_path / "meminfo").write_text("MemTotal: 64000000 kB\nMemAvailable: 2000 kB\n")
    spec = {
        "name": "shared",
        "base": {"preset": "synthetic-retina"},
        "set": [*TINY_SET, "eval.local_models=false"],
        "federations": ["synthetic-retina"],
        "methods": ["fedavg"],
        "seeds": [0, 1],
        "split": {"mode": "ratio"},
        "budget": {"rounds": 1},
    }
    (tmp_path / "bench.yaml").write_text(yaml.safe_dump(spec))
    bench = ["bench", str(tmp_path / "bench.yaml"), "--out", str(tmp_path / "out"), "--jobs", "2"]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("FEDSEG_MEMORY", "FEDSEG_PREPARED"))}
    args = [sys.executable, "-c", BENCH_WITH_FAKE_MEMORY, str(tmp_path / "meminfo"), str(tmp_path / "no-cgroups")]
    done = subprocess.run([*args, *bench], capture_output=True, text=True, env=env, timeout=600)
    output = done.stdout + done.stderr
    assert done.returncode == 1, output
    (line,) = [line for line in output.splitlines() if line.startswith("error:")]
    assert line.startswith("error: not enough memory to prepare this run's"), output
    assert "GB this process can have (this job's 1/2 share of the 0.00205 GB of what the bench found" in line
    assert "fewer runs at once (fedseg bench --jobs below 2)" in line and "Traceback" not in output
