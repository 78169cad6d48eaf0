"""Voxel orientations across the sites of a Flower deployment: each SuperNode reports the orientations of its own
folder's volumes with its data check (``fedseg.flower.node.on_info``); the coordinator, which holds no site's files,
says in one WARNING line when the sites' volumes lie in different orientations (as ``fedseg run``'s data check warns
of a federation it holds) and, where every volume of every site lies in one, records it in each model bundle's
manifest, as ``fedseg run`` does (``fedseg.data.reorient.federation_orientation``).

Real NIfTI folders on disk, one per hospital (``federation.yaml`` and its own site folder); the SuperNode side is
fedseg's ClientApp handler (``node.handle``), the coordinator side ``connect_sites`` and the ServerApp's ``serve``,
over a Grid that hands each message to the handler of the node it is addressed to, in this process (no Flower
processes: ``tests/test_flower_deploy.py`` runs those)."""

from __future__ import annotations

import json
import logging
import time
from collections import Counter
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import yaml
from flwr.app import Context, Metadata, RecordDict
from flwr.app import Message as FlowerMessage
from flwr.app.message import make_message
from flwr.supercore.task_identity import TaskIdentity

from fedseg.data.check import check_folder, site_orientation_warnings
from fedseg.data.federation import Federation, Regions, Site
from fedseg.data.reorient import (
    NO_GRID,
    deployment_orientation,
    federation_orientation,
    orientation_counts_problem,
    with_reported_orientation,
)
from fedseg.data.reorient import site_orientations as reported_counts
from fedseg.flower import node
from fedseg.flower.engine import Courier, SiteError, connect_sites, site_orientations

nib = pytest.importorskip("nibabel")

SHAPE = (8, 10, 12)
AFFINES = {  # voxel index -> RAS+ mm
    "RAS": np.diag([1.0, 1.0, 2.0, 1.0]),
    "LPS": np.diag([-1.0, -1.0, 2.0, 1.0]),
}
SITES = ("north", "south")


def write_hospital(root: Path, site: str, orientations: list[str]) -> Path:
    """A hospital's folder as a SuperNode reads it: ``federation.yaml`` (naming the other site too) and its own site
    folder, one NIfTI case per entry of ``orientations`` (the orientation its image and label are stored in)."""
    (root / site / "images").mkdir(parents=True)
    (root / site / "labels").mkdir()
    header = {"name": "two-hospitals", "kind": "3d", "channels": 1, "regions": {"organ": [1]}}
    (root / "federation.yaml").write_text(yaml.safe_dump({**header, "site_order": list(SITES)}))
    rng = np.random.default_rng(len(site))
    for k, code in enumerate(orientations):
        label = np.zeros(SHAPE, np.uint8)
        label[2:6, 3:7, 4:9] = 1
        image = (rng.normal(0, 1, SHAPE) + 3 * label).astype(np.float32)
        nib.save(nib.Nifti1Image(image, AFFINES[code]), root / site / "images" / f"{site}{k}.nii.gz")
        nib.save(nib.Nifti1Image(label, AFFINES[code]), root / site / "labels" / f"{site}{k}.nii.gz")
    return root


def coordinator_federation(folder: Path) -> Federation:
    """The federation as the coordinator knows it: header and site names (``federation_from_record``)."""
    from fedseg.flower.server import federation_from_record, federation_record

    fed = replace(check_folder(folder, all_sites=False), sites=[Site(s, []) for s in SITES])
    return federation_from_record(federation_record(fed))


@pytest.fixture(autouse=True)
def serverapp_identity(monkeypatch):
    """The task, run and node ids Flower's runtime gives a ServerApp process (its messages carry them)."""
    monkeypatch.setattr(TaskIdentity, "_run_id", 1)
    monkeypatch.setattr(TaskIdentity, "_node_id", 0)
    monkeypatch.setattr(TaskIdentity, "_task_id", 1)


class SitesGrid:
    """Flower's ``Grid`` as the coordinator uses it (node ids, push, pull), each node a SuperNode of fedseg's ClientApp
    in this process: a pushed message is delivered to ``node.handle`` with that node's ``Context`` (its node config:
    site and data folder; its state kept from message to message, as a warm SuperNode keeps it) and answered at once."""

    def __init__(self, folders: dict[str, Path], run_config: dict):
        self.contexts = {
            10 + i: Context(
                run_id=1,
                node_id=10 + i,
                node_config={"site": site, "data": str(folder)},
                state=RecordDict(),
                run_config=run_config,
            )
            for i, (site, folder) in enumerate(folders.items())
        }
        self.replies: dict[str, FlowerMessage] = {}

    def get_node_ids(self) -> list[int]:
        return list(self.contexts)

    def push_messages(self, messages: list[FlowerMessage]) -> list[str]:
        ids = []
        for m in messages:
            node_id = m.metadata.dst_node_id
            meta = Metadata(
                run_id=1,
                message_id="",
                src_node_id=0,
                dst_node_id=node_id,
                reply_to_message_id="",
                group_id=m.metadata.group_id,
                created_at=time.time(),
                ttl=3600.0,
                message_type=m.metadata.message_type,
            )
            delivered = make_message(meta, m.content)
            delivered.metadata.__dict__["_message_id"] = delivered.object_id
            reply = node.handle(delivered, self.contexts[node_id])
            reply.metadata.__dict__["_src_node_id"] = node_id
            ids.append(delivered.metadata.message_id)
            self.replies[ids[-1]] = reply
        return ids

    def pull_messages(self, ids: list[str]) -> list[FlowerMessage]:
        return [self.replies.pop(i) for i in ids if i in self.replies]


def _info(fed: Federation) -> FlowerMessage:
    """The coordinator's data-check query, as the SuperNode delivers it (``test_flower_node._query``)."""
    from fedseg.flower.node import federation_header
    from test_flower_node import _query

    return _query(node.INFO, {"site": "?", "header": json.dumps(federation_header(fed))})


def test_a_supernode_reports_its_own_volumes_orientations_with_its_data_check(tmp_path, tiny_config):
    folder = write_hospital(tmp_path / "north", "north", ["LPS", "LPS", "RAS", "LPS"])
    context = Context(
        run_id=1,
        node_id=7,
        node_config={"site": "north", "data": str(folder)},
        state=RecordDict(),
        run_config={"fedseg-config": tiny_config().model_dump_json()},
    )
    reply = node.handle(_info(check_folder(folder, all_sites=False)), context)
    assert not reply.has_error(), reply.error.reason if reply.has_error() else ""
    info = dict(reply.content[node.ENGINE])
    assert json.loads(info[node.ORIENTATIONS]) == {"LPS": 3, "RAS": 1}  # counts only: no case id leaves the site
    assert json.loads(info[node.LABELS]) == {"cases": 4, "held": {"1": 4}}  # every case holds the organ (value 1)
    assert {k: v for k, v in info.items() if k not in (node.ORIENTATIONS, node.LABELS)} == {
        "site": "north",
        "cases": 4,
        "train": 2,
        "val": 1,
        "test": 1,
    }


def test_the_coordinator_reads_each_sites_orientations_and_refuses_what_is_no_such_report():
    info = {"orientations": json.dumps({"RAS": 4, NO_GRID: 1}), "train": 2}
    assert site_orientations(info, "SuperNode 7") == {"RAS": 4, NO_GRID: 1} and info == {"train": 2}
    assert site_orientations({"train": 2}, "SuperNode 7") is None  # a site without volumes: no word
    for bad in ('{"RRR": 2}', '{"ras": 2}', '{"RAS": 0}', '{"RAS": true}', "[1]", "{}", "not json\x1b[2J"):
        with pytest.raises(SiteError, match=r"^SuperNode 7 reported its voxel orientations as '") as refused:
            site_orientations({"orientations": bad}, "SuperNode 7")
        assert "\x1b" not in str(refused.value) and "\n" not in str(refused.value)
    assert orientation_counts_problem({"PIL": 3, NO_GRID: 2}) is None


def test_the_sites_orientations_give_the_runs_one_orientation_only_where_every_case_lies_in_it():
    sites = ["a", "b"]
    assert deployment_orientation(sites, {"a": {"LPS": 4}, "b": {"LPS": 2}}) == "LPS"
    assert deployment_orientation(sites, {"a": {"LPS": 4}, "b": {"RAS": 2}}) is None
    assert deployment_orientation(sites, {"a": {"LPS": 4}, "b": {"LPS": 2, NO_GRID: 1}}) is None  # a NumPy case
    assert deployment_orientation(sites, {"a": {"LPS": 4}}) is None  # site b said nothing (no volume with a grid)
    assert reported_counts({"LPS": ["a0", "a1"], "RAS": ["a2"], "PIL": []}, 4) == {"LPS": 2, "RAS": 1, NO_GRID: 1}
    fed = Federation("x", "3d", 1, Regions.from_mapping({"organ": [1]}), [])
    assert federation_orientation(with_reported_orientation(fed, "LPS")) == "LPS"
    assert federation_orientation(with_reported_orientation(fed, None)) is None


def test_the_warning_names_each_site_with_its_orientation_and_the_command_for_the_odd_ones():
    (line,) = site_orientation_warnings(
        {"a": {"RAS": 5}, "b": {"LPS": 9}, "c": {"RAS": 3}, "d": {"RAS": 2, "LPS": 1}, "npy": {NO_GRID: 4}}
    )
    assert line.startswith(
        "the sites' volumes lie in 2 voxel orientations: RAS at a and c; LPS at b; mixed at d (RAS 2, LPS 1); "
    )
    assert "at b and d, `fedseg data reorient DATA --out NEW --to RAS` (DATA: the SuperNode's --data folder)" in line
    assert "\n" not in line and "npy" not in line  # a site without volumes has no orientation to name
    assert site_orientation_warnings({"a": {"RAS": 5}, "b": {"RAS": 1, NO_GRID: 2}}) == []
    (tie,) = site_orientation_warnings({"a": {"PIL": 3}, "b": {"RAS": 3}})  # a tie: RAS, nibabel's canonical
    assert "RAS at b; PIL at a;" in tie and "at a, `fedseg data reorient DATA --out NEW --to RAS`" in tie


def _connect(folders: dict[str, Path], cfg) -> object:
    fed = coordinator_federation(next(iter(folders.values())))
    grid = SitesGrid(folders, {"fedseg-config": cfg.model_dump_json()})
    from fedseg.flower.node import federation_header

    return connect_sites(Courier(grid, poll=0.0), fed.site_names, federation_header(fed), wait=30)


def test_the_coordinator_compares_the_orientations_its_sites_report(tmp_path, tiny_config):
    cfg = tiny_config()
    folders = {
        "north": write_hospital(tmp_path / "n", "north", ["RAS"] * 4),
        "south": write_hospital(tmp_path / "s", "south", ["LPS"] * 4),
    }
    found = _connect(folders, cfg)
    assert found.orientations == {"north": {"RAS": 4}, "south": {"LPS": 4}}
    assert found.orientation() is None
    (line,) = found.orientation_warnings()
    assert line.startswith("the sites' volumes lie in 2 voxel orientations: RAS at north; LPS at south; ")
    assert "at south, `fedseg data reorient DATA --out NEW --to RAS`" in line

    folders["south"] = write_hospital(tmp_path / "s2", "south", ["RAS"] * 4)
    found = _connect(folders, cfg)
    assert found.orientation() == "RAS" and found.orientation_warnings() == []


def test_the_coordinator_says_which_sites_never_hold_a_region_the_others_annotate(tmp_path, tiny_config):
    """Hospitals annotating different structures: south's labels never hold the organ. Each SuperNode reports what its
    label files hold (counts, no case id) and the coordinator says it in the line `fedseg run`'s data check says of a
    federation it holds (``fedseg.data.check.region_site_warnings``)."""
    from fedseg.data.check import SiteLabels, region_site_warnings

    folders = {
        "north": write_hospital(tmp_path / "n", "north", ["RAS"] * 4),
        "south": write_hospital(tmp_path / "s", "south", ["RAS"] * 4),
    }
    for label in (folders["south"] / "south" / "labels").iterdir():
        stored = nib.load(label)
        nib.save(nib.Nifti1Image(np.zeros(SHAPE, np.uint8), stored.affine), label)
    found = _connect(folders, tiny_config())
    assert {s: (labels.cases, dict(labels.held)) for s, labels in found.labels.items()} == {
        "north": (4, {1: 4}),
        "south": (4, {}),
    }
    regions = Regions.from_mapping({"organ": [1]})
    (line,) = found.label_warnings(regions)
    assert line == region_site_warnings(regions, {"north": found.labels["north"], "south": found.labels["south"]})[0]
    assert line.startswith("region 'organ' (label value 1): no voxel in any case of south (4 cases), while at least ")

    info = {node.LABELS: json.dumps({"cases": 3, "held": {"1": 2}}), "train": 2}
    from fedseg.flower.engine import site_labels

    assert site_labels(info, "SuperNode 7") == SiteLabels(3, Counter({1: 2})) and info == {"train": 2}
    assert site_labels({"train": 2}, "SuperNode 7") is None  # an older site's reply: no word
    bad = ('{"cases": 2, "held": {"1": 3}}', '{"cases": -1, "held": {}}', '{"cases": 2, "held": {"x": 1}}', "[]", "{")
    bad += ("[" * 5000 + "]" * 5000, '{"cases": 3, "held": {' + ", ".join(f'"{v}": 1' for v in range(2000)) + "}}")
    for text in bad:
        with pytest.raises(SiteError, match=r"^SuperNode 7 reported what its label files hold as '"):
            site_labels({node.LABELS: text}, "SuperNode 7")


def _serve(tmp_path: Path, folders: dict[str, Path], cfg, monkeypatch, caplog) -> Path:
    """One Flower run of ``cfg`` by the ServerApp's ``serve`` over the sites' ``SitesGrid``; its output folder."""
    from fedseg.flower.deploy import COORDINATOR_OUT
    from fedseg.flower.launch import run_config
    from fedseg.flower.server import serve

    out = tmp_path / "out"
    monkeypatch.setenv(COORDINATOR_OUT, str(out))
    config = run_config(cfg, coordinator_federation(next(iter(folders.values()))), wait=30, poll=0)
    level = logging.getLogger("fedseg").level
    try:
        with caplog.at_level(logging.WARNING, logger="fedseg.flower.server"):
            serve(SitesGrid(folders, config), config)
    finally:
        logging.getLogger("fedseg").setLevel(level)  # serve sets the coordinator's level
    return out


@pytest.mark.parametrize("south", ["RAS", "LPS"])
def test_a_flower_run_warns_of_sites_in_different_orientations_and_records_the_one_they_agree_on(
    tmp_path, tiny_config, monkeypatch, caplog, south
):
    """The same as ``fedseg run`` on the same federation: a warning (no refusal) where the sites' volumes lie in
    different orientations, and ``orientation`` in the bundle's manifest where they all lie in one."""
    cfg = tiny_config(algorithms=["fedavg"], fl={"rounds": 1}, data={"image_size": 16}, eval={"hd95": False})
    folders = {
        "north": write_hospital(tmp_path / "n", "north", ["RAS"] * 4),
        "south": write_hospital(tmp_path / "s", "south", [south] * 4),
    }
    out = _serve(tmp_path, folders, cfg, monkeypatch, caplog)
    manifest = json.loads((out / "model" / "fedavg" / "manifest.json").read_text())
    said = [r.getMessage() for r in caplog.records if "voxel orientations" in r.getMessage()]
    log = (out / "flower" / "server.log").read_text()
    if south == "RAS":
        assert manifest["orientation"] == "RAS" and said == []
    else:
        assert "orientation" not in manifest
        assert len(said) == 1 and said[0].startswith("the sites' volumes lie in 2 voxel orientations: RAS at north; ")
        assert f"WARNING fedseg.flower.server: {said[0]}" in log  # the launcher shows the log's warnings
    assert (out / "summary.json").is_file()  # trained either way, as `fedseg run` trains


@pytest.mark.slow  # a real deployment: SuperLink, two SuperNodes, ServerApp and ClientApp processes (~50 s)
def test_flower_local_says_in_one_line_which_site_lies_otherwise_and_still_trains(tmp_path):
    """`fedseg flower local` on a federation whose hospital south stores its volumes LPS, north RAS: the coordinator's
    console says it in one line naming both sites and the command for south (once: the launcher's own data check of
    the folder leaves the sites' comparison to the coordinator); the run trains (as `fedseg run` does
    after its data check's warning) and its bundle records no orientation. No process outlives the run."""
    import subprocess
    import sys

    from test_flower_deploy import _survivors

    root = tmp_path / "fed"
    write_hospital(root, "north", ["RAS"] * 4)
    write_hospital(root, "south", ["LPS"] * 4)
    cfg = {
        "seed": 0,
        "threads": 1,
        "algorithms": ["fedavg"],
        "data": {"image_size": 16},
        "model": {"channels": [4, 8, 16]},
        "train": {"batch_size": 4},
        "fl": {"rounds": 1},
        "eval": {"hd95": False},
    }
    (tmp_path / "cfg.yaml").write_text(yaml.safe_dump(cfg))
    out = tmp_path / "out"
    argv = ["flower", "local", "--config", str(tmp_path / "cfg.yaml"), "--data", str(root), "--out", str(out)]
    proc = subprocess.run([sys.executable, "-m", "fedseg.cli", *argv], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    said = [line for line in (proc.stdout + proc.stderr).splitlines() if "voxel orientations" in line]
    assert len(said) == 1, proc.stdout + proc.stderr  # the coordinator's line; the launcher's check does not repeat it
    assert said[0].startswith("the sites' volumes lie in 2 voxel orientations: RAS at north; LPS at south; ")
    assert "at south, `fedseg data reorient DATA --out NEW --to RAS`" in said[0]
    assert "site south -> SuperNode" in proc.stdout and "orientations: LPS 4" in proc.stdout
    assert "orientation" not in json.loads((out / "model" / "fedavg" / "manifest.json").read_text())
    assert not _survivors(out / "flower")
