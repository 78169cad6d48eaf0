"""A hospital's SuperNode when the coordinator comes back as a new SuperLink, on real processes: a SuperLink with TLS
and SuperNode authentication (fedseg's, as `fedseg flower server` starts it), a `fedseg flower supernode` connected to
it, then that SuperLink stopped and a new one started on the same address with the site's key registered again (what
a restarted or resumed coordinator does)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fedseg.data.folder_write import write_folder
from fedseg.flower.certs import make_certs
from fedseg.flower.deploy import Processes, flower_env, free_ports, register_node
from fedseg.flower.superlink import LinkSettings, start_superlink


def _wait_for(path: Path, text: str, timeout: float, proc: subprocess.Popen | None = None) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        said = path.read_text() if path.is_file() else ""
        if text in said:
            return said
        assert proc is None or proc.poll() is None, f"exited before {text!r}:\n{said[-3000:]}"
        time.sleep(0.3)
    raise TimeoutError(f"{text!r} not in {path} after {timeout} s:\n{path.read_text()[-3000:]}")


def _superlink(tmp_path: Path, name: str, link: LinkSettings, pub: Path) -> Processes:
    procs = Processes(tmp_path / f"{name}.json")
    client = start_superlink(procs, link, tmp_path / name, flower_env(tmp_path / f"{name}-home")).control_client()
    try:
        register_node(client, pub, "site1")
    finally:
        client.close()
    return procs


@pytest.mark.slow  # two SuperLinks and a SuperNode, about a minute
def test_a_supernode_whose_coordinator_restarted_says_so_in_one_line_without_a_traceback(tmp_path, disc_federation):
    """A rehearsal: sites idle after a finished run (or in a run whose coordinator was killed) stopped as soon as the
    coordinator started again, each with "SuperNode terminated gracefully." and, on some, a 25-line traceback of
    Flower's heartbeat thread (httpx.HTTPStatusError: 401 Unauthorized), nothing saying why or what to do."""
    folder = write_folder(disc_federation(1, 6), tmp_path / "fed")
    tls = make_certs(tmp_path / "certs", nodes=["site1"])
    key, pub = tmp_path / "certs" / "site-keys" / "site1.key", tmp_path / "certs" / "supernodes" / "site1.pub"
    fleet, control, node_port = free_ports(3)
    link = LinkSettings("127.0.0.1", fleet, tls, auth=True, control=f"127.0.0.1:{control}")
    log = tmp_path / "site1.log"
    first = _superlink(tmp_path, "first", link, pub)
    node = None
    try:
        with log.open("w") as out:
            node = subprocess.Popen(
                [sys.executable, "-m", "fedseg.cli", "flower", "supernode", "--site", "site1", "--data", str(folder)]
                + ["--superlink", link.address, "--root-certificates", str(tls.ca), "--auth-key", str(key)]
                + ["--port", str(node_port), "--samples", str(tmp_path / "samples"), "--isolation", "warm"],
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        _wait_for(log, "SuperNode ID:", 120, node)
        first.stop()
        with _superlink(tmp_path, "second", link, pub):
            code = node.wait(timeout=120)
            said = log.read_text()
    finally:
        first.stop()
        if node is not None and node.poll() is None:
            os.killpg(node.pid, signal.SIGKILL)
            node.wait(timeout=30)
    tail = said[said.index("SuperNode ID:") :]
    assert "Traceback" not in tail and "HTTPStatusError" not in tail, tail[-4000:]
    assert tail.count("no longer knows this SuperNode") == 1, tail[-4000:]
    line = " ".join(next(x for x in tail.splitlines() if "no longer knows this SuperNode" in x).split())
    assert f"the SuperLink at {link.address} no longer knows this SuperNode (HTTP 401 Unauthorized on " in line
    assert "the coordinator was restarted" in line and "start it again with the same command" in line, line
    assert code == 75  # EX_TEMPFAIL, not 0: a supervisor restarting failed services (Restart=on-failure) restarts it


def _supernode(folder: Path, superlink: str, ca: Path, port: int, tmp_path: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "fedseg.cli", "flower", "supernode", "--site", "site1", "--data", str(folder)]
        + ["--superlink", superlink, "--root-certificates", str(ca), "--port", str(port)]
        + ["--samples", str(tmp_path / "samples"), "--max-wait", "30"],
        capture_output=True,
        text=True,
        timeout=180,
    )


def test_a_root_certificate_that_is_missing_or_no_certificate_is_refused_in_one_line_before_the_data_check(
    tmp_path, disc_federation
):
    """A typo in --root-certificates got Flower's "Path argument `--root-certificates` does not point to a file."
    after the data check, naming no file."""
    folder = write_folder(disc_federation(1, 6), tmp_path / "fed")
    (port,) = free_ports(1)
    (tmp_path / "site1.key").write_text("-----BEGIN OPENSSH PRIVATE KEY-----\n")
    # a security test: a damaged certificate block got a wrong message and a SuperNode that never exited
    (tmp_path / "bad.crt").write_text("-----BEGIN CERTIFICATE-----\ngarbage\n-----END CERTIFICATE-----\n")
    for ca, why in (
        (tmp_path / "ca.crtt", "no such file"),
        (tmp_path, "not a regular file"),
        (tmp_path / "site1.key", "not a PEM certificate"),
        (tmp_path / "bad.crt", "a damaged PEM certificate"),
    ):
        proc = _supernode(folder, "127.0.0.1:9", ca, port, tmp_path)
        said = " ".join((proc.stdout + proc.stderr).split())
        assert proc.returncode == 1, said
        assert f"--root-certificates {ca}: {why}" in said and "Traceback" not in said, said
        assert "data check passed" not in said and "Starting Flower SuperNode" not in said, said


@pytest.mark.slow  # a SuperLink and a SuperNode
def test_a_supernode_given_another_studys_ca_says_which_option_to_change(tmp_path, disc_federation):
    """A rehearsal: a hospital given the ca.crt of another `fedseg flower certs` got Flower's "SSL/TLS handshake error
    detected ... certificate verify failed: unable to get local issuer certificate", naming no option; a --superlink
    host the certificate does not name got the same kind of message."""
    folder = write_folder(disc_federation(1, 6), tmp_path / "fed")
    tls, other = make_certs(tmp_path / "certs"), make_certs(tmp_path / "other")
    fleet, control, node_port = free_ports(3)
    link = LinkSettings("0.0.0.0", fleet, tls, control=f"127.0.0.1:{control}")
    with Processes(tmp_path / "link.json") as procs:
        start_superlink(procs, link, tmp_path / "link", flower_env(tmp_path / "home"))
        wrong_ca = _supernode(folder, f"127.0.0.1:{fleet}", other.ca, node_port, tmp_path)
        wrong_host = _supernode(folder, f"127.0.0.2:{fleet}", tls.ca, node_port, tmp_path)
    said = " ".join((wrong_ca.stdout + wrong_ca.stderr).split())
    assert wrong_ca.returncode != 0, said
    assert f"the SuperLink's certificate is not signed by --root-certificates {other.ca}: use the ca.crt" in said, said
    said = " ".join((wrong_host.stdout + wrong_host.stderr).split())
    assert wrong_host.returncode != 0, said
    assert f"does not name the host of --superlink 127.0.0.2:{fleet}" in said, said


@pytest.mark.slow  # a SuperLink and a SuperNode
def test_a_supernode_connecting_before_the_coordinator_registered_its_key_waits_for_it(tmp_path, disc_federation):
    """A hospital started before the coordinator retries until its SuperLink listens; the coordinator registers the
    sites' keys only after that (about half a second in a rehearsal), and a SuperNode trying in between was refused
    as unregistered ("Failed to activate SuperNode") and exited. Now the Fleet API answers 503 until the coordinator
    opens it (its gate file), which a SuperNode retries quietly."""
    folder = write_folder(disc_federation(1, 6), tmp_path / "fed")
    tls = make_certs(tmp_path / "certs", nodes=["site1"])
    key, pub = tmp_path / "certs" / "site-keys" / "site1.key", tmp_path / "certs" / "supernodes" / "site1.pub"
    fleet, control, node_port = free_ports(3)
    gate = tmp_path / "fleet-open"
    link = LinkSettings("127.0.0.1", fleet, tls, auth=True, control=f"127.0.0.1:{control}", gate=gate)
    log = tmp_path / "site1.log"
    node = None
    with Processes(tmp_path / "link.json") as procs:
        running = start_superlink(procs, link, tmp_path / "link", flower_env(tmp_path / "home"))
        try:
            with log.open("w") as out:
                node = subprocess.Popen(
                    [sys.executable, "-m", "fedseg.cli", "flower", "supernode", "--site", "site1"]
                    + ["--data", str(folder), "--superlink", link.address, "--root-certificates", str(tls.ca)]
                    + ["--auth-key", str(key), "--port", str(node_port), "--samples", str(tmp_path / "samples")],
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL,
                    start_new_session=True,
                )
            said = _wait_for(log, "503 Service Unavailable", 120, node)
            assert f"the SuperLink at {link.address} is up but not open to SuperNodes yet (Server error '503" in said
            client = running.control_client()
            try:
                register_node(client, pub, "site1")
            finally:
                client.close()
            gate.touch()
            said = _wait_for(log, "SuperNode ID:", 120, node)
            assert "Failed to activate" not in said, said[-3000:]
        finally:
            if node is not None and node.poll() is None:
                os.killpg(node.pid, signal.SIGTERM)
                node.wait(timeout=60)
