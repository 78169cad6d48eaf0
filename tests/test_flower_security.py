"""What a hospital's security officer asks of a deployment (issue 28), checked on real processes: a coordinator
(`fedseg flower server`, TLS, the keys of site1 and site2 registered) and SuperNodes on 127.0.0.1.

- the control plane is private: the Control API answers only on the loopback ``--control-address``; the
  SuperNodes' port serves the Fleet API alone, so a caller holding ``ca.crt`` and a fresh key can neither
  ``RegisterNode`` nor ``ListRuns`` through it;
- a site is the holder of its key: a SuperNode with site2's key declaring site1 is refused, as is one whose key
  is not listed (Flower refuses it at activation) or was registered behind fedseg's back;
- what leaves a site names no case file: every byte between the sites and the SuperLink (recorded by a TLS
  proxy in between) and the coordinator's results.csv carry opaque ids; the site keeps the mapping;
- ``--certs`` may be relative.
"""

from __future__ import annotations

import asyncio
import contextlib
import csv
import hashlib
import io
import json
import logging
import os
import re
import secrets
import signal
import socket
import ssl
import stat
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx
import pytest
import yaml
from flwr.proto.control_pb2 import ListRunsRequest, StopRunRequest

from fedseg.data.folder_write import write_folder
from fedseg.flower import flwr_internals, superlink_main
from fedseg.flower.certs import TlsFiles, make_certs, make_node_key
from fedseg.flower.deploy import (
    BIN,
    COORDINATOR_OUT,
    Processes,
    control_client,
    descendants,
    flower_env,
    free_ports,
    is_running,
    register_node,
    run_status,
    submit_run,
    wait_for_port,
    wait_run,
)
from fedseg.flower.launch import FlowerRunError
from fedseg.flower.superlink import LinkSettings, superlink_command
from fedseg.flower.superlink_main import (
    BUSY,
    FLEET_ONLY,
    NO_KEY,
    NO_KEY_GIVEN,
    REFUSED,
    SLOW,
    BodyLimits,
    answer_json,
    control_guard,
    fleet_only,
)
from fedseg.flower.supernode import supernode_argv, supernode_command
from fedseg.flower.supernode_main import WHY_NOT_REGISTERED


def _open_body(port: int, route: str, piece: bytes, source: str = "127.0.0.1") -> socket.socket:
    """A connection from ``source`` that sends a POST to ``route`` with a chunked body: one piece of it, and no end."""
    conn = socket.create_connection(("127.0.0.1", port), source_address=(source, 0))
    head = f"POST {route} HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n".encode()
    conn.sendall(head + f"{len(piece):x}\r\n".encode() + piece + b"\r\n")
    return conn


def _status(conn: socket.socket) -> int:
    conn.settimeout(10)
    return int(conn.recv(4096).split(b" ", 2)[1])


def test_the_fleet_listener_bounds_what_it_holds_of_request_bodies(tmp_path):
    """Flower reads a request's whole body before it checks the sender's key: anyone reaching the Fleet port could
    have the SuperLink hold gigabytes, one huge body or many unfinished ones. The listener (uvicorn on a real socket,
    fedseg's filter in front of an app that counts what reaches it; the same code with limits of megabytes and a
    second) answers 413 past a request's limit (by Content-Length or by the bytes streamed), 503 past the bytes held
    over every connection, 408 to a body that pauses, and passes a request within them whole."""
    import uvicorn

    reached: list[int] = []

    async def counting_app(scope, receive, send):  # stands for Flower's app: what would it have read?
        message, body = {"more_body": True}, b""
        while message.get("more_body"):
            message = await receive()
            body += message.get("body", b"")
        reached.append(len(body))
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]})
        await send({"type": "http.response.body", "body": b"ok"})

    (port,) = free_ports(1)
    route = "/v1/fleet/push-object"
    mib = 1 << 20
    limits = BodyLimits(max_body=mib, max_buffered=mib + mib // 2, idle_s=1.0, min_rate=256 << 10)
    filtered = fleet_only(counting_app, frozenset({("POST", route)}), None, limits)
    server = uvicorn.Server(uvicorn.Config(filtered, port=port, log_level="error"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        while not server.started:
            time.sleep(0.05)
        url = f"http://127.0.0.1:{port}{route}"
        assert httpx.post(url, content=b"x" * mib).status_code == 200
        declared = httpx.post(url, content=b"x" * (mib + 1))
        assert declared.status_code == 413 and declared.json() == {"detail": limits.too_large}

        def streamed():  # chunked transfer: no Content-Length to refuse it by
            for _ in range(4):
                yield b"y" * (mib // 2)

        assert httpx.post(url, content=streamed()).status_code == 413
        assert reached == [mib]  # only the request within the limit reached the app, whole
        # unfinished bodies: the first holds 0.9 MiB; another client's would take the total past 1.5 MiB, and the
        # first client's own second body past one request's worth: 503 both (a SuperNode retries)
        first = _open_body(port, route, b"a" * (9 * mib // 10))
        time.sleep(0.2)
        second = _open_body(port, route, b"b" * (9 * mib // 10), source="127.0.0.2")
        again = _open_body(port, route, b"c" * (2 * mib // 10))
        assert _status(second) == 503 and _status(again) == 503
        assert _status(first) == 408  # and the first, paused past idle_s, lets go of its bytes
        # a trickle (a byte every 0.3 s: never idle for 1 s) falls below min_rate once it has taken idle_s: 408
        trickle = _open_body(port, route, b"t")
        status = None
        for _ in range(20):
            time.sleep(0.3)
            try:
                trickle.sendall(b"1\r\nt\r\n")
            except OSError:
                break
            trickle.setblocking(False)
            try:
                status = int(trickle.recv(4096).split(b" ", 2)[1])
                break
            except BlockingIOError:
                pass
            finally:
                trickle.setblocking(True)
        assert (status or _status(trickle)) == 408
        for conn in (first, second, again, trickle):
            conn.close()
        assert httpx.post(url, content=b"z" * mib).status_code == 200 and reached[-1] == mib  # it serves again
    finally:
        server.should_exit = True
        thread.join(timeout=10)
    default = BodyLimits.of_environment()
    assert default.max_body == 64 << 20 and default.max_buffered == 512 << 20 and "64 MiB" in default.too_large
    assert BUSY and SLOW.startswith("a request body paused")


def test_the_control_api_defaults_to_loopback_and_the_public_port_serves_the_fleet_api_only():
    """What `fedseg flower server` starts by default: Fleet API on 0.0.0.0:9092, every other API on 127.0.0.1:9093."""
    cmd = superlink_command(LinkSettings("0.0.0.0", 9092))
    assert cmd[1:3] == ["-m", "fedseg.flower.superlink_main"]
    assert cmd[cmd.index("--fleet-address") + 1] == "0.0.0.0:9092"
    assert (cmd[cmd.index("--host") + 1], cmd[cmd.index("--port") + 1]) == ("127.0.0.1", "9093")


async def _call(app, path: str, headers=(), kind: str = "http", body: bytes = b"", client=("127.0.0.1", 40000)):
    """Send one request (``kind`` http or websocket) to the ASGI ``app``; its status (a websocket: its close code)."""
    scope = {"type": kind, "method": "POST", "path": path, "headers": list(headers), "client": client}
    sent: list[dict] = []

    async def receive():
        return {"type": "http.request", "body": body, "more_body": False}

    async def send(message):
        sent.append(message)

    await app(scope, receive, send)
    return sent[0].get("status", sent[0].get("code"))


def test_the_control_address_answers_the_control_api_only_with_the_coordinators_key():
    """Flower's Control API asks no key in the open-source build: any process on the coordinator's machine could list,
    start and stop its runs and register SuperNode keys. Behind ``control_guard`` the Control API (and any path not
    known to need none) answers only requests with the coordinator's key; the Runtime and Fleet APIs (their own
    authentication) and /health answer as before."""
    key = secrets.token_hex(32)
    reached: list[str] = []

    async def flower(scope, receive, send):
        reached.append(scope["path"])
        await answer_json(send, 200, b"{}")

    guarded = control_guard(flower, key)

    async def calls(*args):
        return [await _call(guarded, path, [] if given is None else [(b"Fedseg-Control-Key", given.encode())], *kind)
                for path, given, *kind in args]  # fmt: skip

    answers = asyncio.run(
        calls(
            ("/v1/control/start-run", None),
            ("/v1/control/register-node", "0" * 64),
            ("/v1/control/stop-run", key[:-1]),
            ("/docs", None),
            ("/v1/control/list-runs", None, "websocket"),
            ("/v1/control/list-runs", key),
            ("/v1/runtime/get-run", None),
            ("/v1/fleet/pull-messages", None),
            ("/health", None),
        )
    )
    assert answers == [401, 401, 401, 401, 1008, 200, 200, 200, 200]
    assert reached == ["/v1/control/list-runs", "/v1/runtime/get-run", "/v1/fleet/pull-messages", "/health"]


def test_the_control_address_bounds_bodies_and_every_refusal_is_logged_in_one_escaped_line_per_interval(monkeypatch):
    """From a security test: on the control address a local process, no key needed, had the SuperLink hold 1.5 GiB
    on a Fleet path (only the Fleet port bounded bodies); its refusals wrote one access line each (60 MB in 11 s) and
    its path put forged lines and terminal codes in the log. Now bodies there are bounded as on the Fleet port, but
    with no per-client share (every client there is 127.0.0.1: the coordinator's own processes at once); every
    refusal, fedseg's or Flower's own (its 401 to a failed SuperNode authentication), is counted in one line per
    interval naming the latest (path escaped and cut) and the count, the burst's last line written once the
    interval is over; uvicorn's access lines of refusals are left out; a list-runs refusal is not hidden by the
    status-poll filter."""
    reached: list[int] = []

    async def flower(scope, receive, send):
        message, body = {"more_body": True}, b""
        while message.get("more_body"):
            message = await receive()
            body += message.get("body", b"")
        reached.append(len(body))
        if scope["path"] == "/v1/fleet/pull-messages":  # Flower's own refusal
            await answer_json(send, 401, b'{"detail": "Invalid SuperNode authentication"}')
        else:
            await answer_json(send, 200, b"{}")

    lines: list[str] = []
    mib = 1 << 20
    limits = BodyLimits(max_body=mib, max_buffered=3 * mib, per_client=False)
    app = superlink_main.refusals_logged(
        control_guard(superlink_main.body_limited(flower, limits), "k" * 64), superlink_main.RefusalLog(lines.append)
    )
    monkeypatch.setattr(superlink_main, "REFUSALS_LOGGED_EVERY_S", 0.2)
    forged = "/v1/control/stop-run\n\x1b[32mINFO: run finished OK\x1b]0;pwned\x07" + "a" * 300

    async def scenario():
        post = lambda path, size=0: _call(app, path, [(b"content-length", str(size).encode())], body=b"x" * size)  # noqa: E731
        too_big = await post("/v1/fleet/push-messages", mib + 1)
        both = await asyncio.gather(post("/v1/runtime/push-object", mib), post("/v1/runtime/push-object", mib))
        flowers = await post("/v1/fleet/pull-messages")
        forged_answer = await post(forged)
        said_at_once = list(lines)
        await asyncio.sleep(0.4)  # the interval is over: the burst's line
        return too_big, both, flowers, forged_answer, said_at_once

    too_big, both, flowers, forged_answer, said_at_once = asyncio.run(scenario())
    assert (too_big, both, flowers, forged_answer) == (413, [200, 200], 401, 401)
    assert reached == [mib, mib, 0]  # two bodies of one address at once: no per-client share; the refused not read
    assert said_at_once == [
        "fedseg: refused POST /v1/fleet/push-messages from 127.0.0.1:40000: 413 Request Entity Too Large: a request "
        "to the SuperLink carries at most 1 MiB"
    ]
    assert len(lines) == 2 and lines[1].startswith(
        "fedseg: refused POST /v1/control/stop-run\\n\\x1b[32mINFO: run finished OK\\x1b]0;pwned\\x07aaa"
    ), lines
    assert lines[1].endswith("... from 127.0.0.1:40000: 401 Unauthorized: " + NO_KEY + " (1 more refused since the "
                             "last such line)")  # fmt: skip
    assert "\n" not in lines[1] and "\x1b" not in lines[1]

    def access(status: int, path: str = "/v1/control/start-run") -> logging.LogRecord:
        args = ("127.0.0.1:1", "POST", path, "1.1", status)
        return logging.LogRecord("uvicorn.access", logging.INFO, "", 0, '%s - "%s %s HTTP/%s" %d', args, None)

    quiet = superlink_main.QuietRefusals()
    assert [quiet.filter(access(status)) for status in (200, 401, 404, 408, 413, 503)] == [
        True, False, False, False, False, False
    ]  # fmt: skip
    polls = superlink_main.QuietStatusPolls()
    said = "fedseg: refused POST /v1/control/list-runs from 127.0.0.1:1: 401 Unauthorized"
    refusal = logging.LogRecord("flwr", logging.WARNING, "", 0, "%s", (said,), None)
    assert polls.filter(refusal) and not polls.filter(access(200, "/v1/control/list-runs"))


@pytest.mark.parametrize("given", [None, "short", "\xff\xfe" * 32])
def test_a_superlink_started_without_a_control_key_says_so_in_one_line(given):
    said = subprocess.run(
        [sys.executable, "-m", "fedseg.flower.superlink_main", "--insecure"],
        stdin=subprocess.DEVNULL if given is None else None,
        input=None if given is None else f"{given}\n",
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert said.returncode == 1 and said.stderr.strip() == NO_KEY_GIVEN and not said.stdout


def test_the_serverapp_runner_reaches_the_runtime_api_where_the_superlink_serves_it(tmp_path):
    """The coordinator's ServerApp runner dials the SuperLink's every-API address (loopback for an every-interface
    one, which no certificate names) with the SuperLink's CA, or without TLS where it has none; its secret is not in
    its command line."""
    from fedseg.flower import serverapp_runner
    from fedseg.flower.superlink_main import runtime_api

    tls = TlsFiles(tmp_path / "ca.crt", tmp_path / "s.crt", tmp_path / "s.key")
    for link, expected in (
        (LinkSettings("0.0.0.0", 9092, tls=tls, control="0.0.0.0:9093"), ("127.0.0.1:9093", str(tls.ca))),
        (LinkSettings("127.0.0.1", 9092), ("127.0.0.1:9093", None)),
        (LinkSettings("10.0.0.5", 9092, control="10.0.0.5:7000"), ("10.0.0.5:7000", None)),
    ):
        argv = superlink_command(link)[3:]
        assert runtime_api(argv) == expected
        command = serverapp_runner.command(*runtime_api(argv), 0.5)
        assert ("--insecure" in command) == (expected[1] is None)


def test_the_runner_serves_the_run_the_coordinator_recorded_and_waits_for_it_less_than_flower_keeps_a_task(tmp_path):
    """A run the coordinator has not recorded yet (it records it once the SuperLink took it) waits, but for less than
    the 30 s in which Flower expires an unheartbeaten task's token (or the refusal could never be sent); then, or at
    once where the coordinator recorded another run, it is refused in one line."""
    from fedseg.flower.serverapp_runner import SUBMITTED_WAIT, WAIT, run_verdict

    assert SUBMITTED_WAIT < 30
    assert run_verdict(7, str(tmp_path), 0.0) == WAIT
    none = "run 7 refused: the coordinator did not submit it (it submitted none); someone started it on its Control API"
    assert run_verdict(7, str(tmp_path), SUBMITTED_WAIT) == none
    (tmp_path / "flower").mkdir()
    (tmp_path / "flower" / "submitted-run").write_text("5\n")
    assert run_verdict(5, str(tmp_path), 0.0) is None
    assert run_verdict(7, str(tmp_path), 0.0) == none.replace("it submitted none", "it runs run 5")
    assert run_verdict(5, None, 0.0) == (
        "run 5 refused: no FEDSEG_OUT in the coordinator's environment (start it with fedseg flower)"
    )


def test_a_malformed_control_address_is_one_clear_line():
    with pytest.raises(ValueError, match=r"--control-address localhost: expected HOST:PORT"):
        superlink_command(LinkSettings(control="localhost"))


# --- one deployment: the coordinator, the attacks, then the real sites ------------------------------------


def _listening(pids: set[int]) -> set[tuple[str, int]]:
    """``(ip, port)`` of every IPv4/IPv6 TCP socket in LISTEN state held by ``pids`` (Linux /proc)."""
    inodes = set()
    for pid in pids:
        try:
            for fd in Path(f"/proc/{pid}/fd").iterdir():
                with_link = os.readlink(fd)
                if with_link.startswith("socket:["):
                    inodes.add(with_link[8:-1])
        except OSError:
            continue
    found = set()
    for table, size in (("/proc/net/tcp", 4), ("/proc/net/tcp6", 16)):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] != "0A" or fields[9] not in inodes:  # 0A: LISTEN
                continue
            hex_ip, hex_port = fields[1].split(":")
            raw = bytes.fromhex(hex_ip)
            if size == 4:
                ip = ".".join(str(b) for b in raw[::-1])
            else:
                ip = ":".join(raw[i : i + 4][::-1].hex() for i in range(0, 16, 4))
            found.add((ip, int(hex_port, 16)))
    return found


class TlsRecorder:
    """A TLS proxy on 127.0.0.1 in front of the SuperLink's Fleet port, presenting the SuperLink's own certificate
    (so SuperNodes trusting ``ca.crt`` connect through it) and recording every byte both ways in plaintext."""

    def __init__(self, upstream: int, certs: Path):
        self.upstream, self.traffic, self.lock = upstream, [], threading.Lock()
        self.server_ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        self.server_ctx.load_cert_chain(certs / "superlink.crt", certs / "superlink.key")
        self.client_ctx = ssl.create_default_context(cafile=str(certs / "ca.crt"))
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.server = asyncio.run_coroutine_threadsafe(
            asyncio.start_server(self._handle, "127.0.0.1", 0, ssl=self.server_ctx), self.loop
        ).result()
        self.port = self.server.sockets[0].getsockname()[1]

    async def _handle(self, reader, writer) -> None:
        up_reader, up_writer = await asyncio.open_connection(
            "127.0.0.1", self.upstream, ssl=self.client_ctx, server_hostname="127.0.0.1"
        )
        sent, received = bytearray(), bytearray()
        with self.lock:
            self.traffic += [sent, received]

        async def pump(src, dst, record: bytearray) -> None:
            try:
                while data := await src.read(1 << 16):
                    record += data
                    dst.write(data)
                    await dst.drain()
            except (ConnectionError, ssl.SSLError):
                pass
            finally:
                dst.close()

        await asyncio.gather(pump(reader, up_writer, sent), pump(up_reader, writer, received))

    def everything(self) -> bytes:
        with self.lock:
            return b"\n".join(bytes(t) for t in self.traffic)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.server.close)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=10)


def _wait_for(path: Path, text: str, timeout: float = 240, alive=lambda: True) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        said = " ".join(path.read_text().split()) if path.is_file() else ""
        if text in said:
            return said
        assert alive(), f"exited before {text!r} appeared in {path}:\n{said[-3000:]}"
        time.sleep(0.2)
    raise TimeoutError(f"{text!r} not in {path} after {timeout} s:\n{path.read_text() if path.is_file() else ''}")


def _stop(item) -> None:
    """Stop one started SuperNode and its children (its process group)."""
    os.killpg(item.proc.pid, signal.SIGTERM)
    try:
        item.proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        os.killpg(item.proc.pid, signal.SIGKILL)
        item.proc.wait(timeout=10)


@pytest.mark.slow
def test_private_control_plane_key_bound_sites_and_opaque_case_ids_on_a_real_deployment(
    tmp_path, disc_federation, tiny, monkeypatch
):
    monkeypatch.chdir(tmp_path)  # --certs and --auth-keys given relative to the coordinator's folder
    fed = disc_federation(n_sites=2, cases_per_site=6)
    folder = write_folder(fed, tmp_path / "fed")
    real_ids = {site.name: {case.id for case in site.cases} for site in fed.sites}
    made = subprocess.run(
        [sys.executable, "-m", "fedseg.cli", "flower", "certs", "--out", "certs", "--node", "site1", "--node", "site2"],
        capture_output=True,
        text=True,
    )
    assert made.returncode == 0, made.stdout + made.stderr
    certs = tmp_path / "certs"
    cfg = tmp_path / "cfg.yaml"
    # eval.local_models off and `warm` isolation: what this test checks is the control plane, identity and the ids on
    # the wire, not how a site runs its tasks (TLS and keys in `subprocess` isolation: test_flower_deploy); a fresh
    # process per message cost ~5 s each, 9 messages per site
    run = {**tiny, "algorithms": ["fedavg"], "fl": {"rounds": 1}, "eval": {**tiny["eval"], "local_models": False}}
    cfg.write_text(yaml.safe_dump(run))
    fleet_port, control_port, *node_ports = free_ports(8)
    fleet, control = f"127.0.0.1:{fleet_port}", f"127.0.0.1:{control_port}"
    out, hospitals = tmp_path / "out", tmp_path / "hospitals"
    env = flower_env(hospitals / "home")
    recorder = TlsRecorder(fleet_port, certs)
    try:
        with Processes(hospitals / "processes.json") as procs:
            coordinator = procs.start(
                "coordinator",
                [sys.executable, "-m", "fedseg.cli", "flower", "server", "--config", str(cfg)]
                + ["--federation", str(folder), "--out", str(out), "--host", "127.0.0.1", "--port", str(fleet_port)]
                + ["--control-address", control, "--certs", "certs", "--auth-keys", "certs/supernodes"]
                + ["--wait", "240"],
                hospitals / "coordinator.log",
                env,
            )
            running = lambda: coordinator.proc.poll() is None  # noqa: E731
            said = _wait_for(coordinator.log, "submitted", alive=running)
            assert f"Control API on {control} only" in said
            node_ids = dict(re.findall(r"registered SuperNode key \S+ \((\w+)\): node id (\d+)", said))

            # 1. the control plane: what the SuperLink process listens on, and who answers Control calls where
            started = json.loads((out / "flower" / "processes.json").read_text())["started"]
            (link_pid,) = [int(pid) for pid, name in started.items() if name == "superlink"]
            assert _listening({link_pid, *descendants(link_pid)}) == {
                ("127.0.0.1", fleet_port),
                ("127.0.0.1", control_port),
            }
            intruder_key, rogue_pub = make_node_key(tmp_path / "rogue", "intruder")
            public = control_client(fleet, certs / "ca.crt", key="")
            try:
                with pytest.raises(httpx.HTTPStatusError, match="404 Not Found"):
                    register_node(public, rogue_pub, "site1")
                with pytest.raises(httpx.HTTPStatusError, match="404 Not Found"):
                    run_status(public, 1)
            finally:
                public.close()
            raw = httpx.post(f"https://{fleet}/v1/control/list-runs", verify=str(certs / "ca.crt"), content=b"")
            assert raw.status_code == 404 and FLEET_ONLY in raw.text
            huge = httpx.post(  # no key needed to make Flower hold a body: refused by its size, before Flower reads it
                f"https://{fleet}/v1/fleet/push-object",
                verify=str(certs / "ca.crt"),
                content=b"x" * (BodyLimits.of_environment().max_body + 1),
                timeout=60,
            )
            assert huge.status_code == 413 and BodyLimits.of_environment().too_large in huge.text
            # on loopback, an insider on the coordinator's machine without the coordinator's key: neither list the
            # runs nor register a key fedseg was not given nor stop the run (401, Flower never sees the request)
            _, insider_pub = make_node_key(tmp_path / "rogue", "insider")
            for key in ("", "0" * 64):
                private = control_client(control, certs / "ca.crt", key=key)
                try:
                    for call in (
                        lambda: private.ListRuns(ListRunsRequest()),
                        lambda: register_node(private, insider_pub, "site1"),
                        lambda: private.StopRun(StopRunRequest(run_id=1)),
                    ):
                        with pytest.raises(httpx.HTTPStatusError, match="401 Unauthorized") as refused:
                            call()
                        assert NO_KEY in refused.value.response.text
                finally:
                    private.close()
            for path in ("/docs", "/openapi.json", "/v1/control/stop-run/", "/v1/Control/stop-run", "/v2/anything"):
                raw = httpx.post(f"https://{control}{path}", verify=str(certs / "ca.crt"), content=b"")
                assert raw.status_code == 401, (path, raw.status_code)

            def node(name, site, key, port, via=fleet, state=None):
                cmd = supernode_command(
                    site, folder, via, port, hospitals / name, Path("certs/ca.crt"), key, "warm", 0.05, state
                )
                return procs.start(name, cmd, hospitals / f"{name}.log", env)

            # 2. identity from keys: site2's key declaring site1; an unlisted key; a key registered behind our back
            server_log = out / "flower" / "server.log"
            wrong_site = node("wrong-site", "site1", Path("certs/site-keys/site2.key"), node_ports[0])
            _wait_for(
                server_log,
                f"SuperNode {node_ids['site2']} refused: it declares site 'site1' but authenticated with the key of "
                "site 'site2'",
                alive=running,
            )
            _wait_for(  # the hospital sees why in its own SuperNode's log, not only the coordinator
                wrong_site.log,
                "this SuperNode was refused: it declares site 'site1' but authenticated with the key of site 'site2'",
                timeout=60,
            )
            _stop(wrong_site)  # stopped right after a refusal, as a hospital restarting it: the run goes on
            unlisted = node("unlisted", "site1", intruder_key, node_ports[1])
            assert unlisted.proc.wait(timeout=120) == 1
            assert "Failed to activate SuperNode" in " ".join(unlisted.log.read_text().split())
            keyless = node("keyless", "site1", None, node_ports[5])  # no --auth-key: Flower named no remedy
            assert keyless.proc.wait(timeout=120) == 1
            assert WHY_NOT_REGISTERED in " ".join(keyless.log.read_text().split()), keyless.log.read_text()[-3000:]

            # 3. the real hospitals, through the recording proxy
            via = f"127.0.0.1:{recorder.port}"
            sites = {
                s: node(s, s, Path(f"certs/site-keys/{s}.key"), port, via)
                for s, port in zip(("site1", "site2"), node_ports[3:])
            }
            assert coordinator.proc.wait(timeout=600) == 0, coordinator.log.read_text()[-5000:]
            for item in sites.values():
                assert item.proc.poll() is None
    finally:
        recorder.close()
    said = " ".join(coordinator.log.read_text().split())
    for site in ("site1", "site2"):
        assert f"site {site} -> SuperNode {node_ids[site]}" in " ".join(server_log.read_text().split())
    assert "SuperNode" in said and "refused" in said  # the console shows the refusals too

    # what left the sites: opaque ids only, on the wire and in the coordinator's results
    wire = recorder.everything()
    leaked = sorted(i for ids in real_ids.values() for i in ids if i.encode() in wire)
    assert not leaked, f"case ids on the wire: {leaked}"
    with open(out / "results.csv") as f:
        rows = list(csv.DictReader(f))
    assert rows and all(re.fullmatch(r"case-\d{4}", r["case"]) for r in rows)
    assert all(f'"{r["case"]}"'.encode() in wire for r in rows)  # the proxy saw the per-case replies
    for site in ("site1", "site2"):  # each site maps the coordinator's ids back to its own cases
        with open(hospitals / site / f"case-ids__{site}.csv") as f:
            mapping = {r["opaque"]: r["case"] for r in csv.DictReader(f)}
        assert set(mapping.values()) == real_ids[site]
        assert {mapping[r["case"]] for r in rows if r["site"] == site} <= real_ids[site]
    record = json.loads((out / "flower" / "processes.json").read_text())["pids"]
    assert not [p for p in {*procs.seen, *record} if is_running(p)]


def test_relative_certificate_and_key_paths_reach_flower_absolute(tmp_path, monkeypatch):
    """Flower refuses relative paths ("expected absolute path"): `--certs certs`, `--root-certificates ca.crt` and
    `--auth-key site.key` are resolved first."""
    make_certs(tmp_path / "certs", nodes=["site1"])
    monkeypatch.chdir(tmp_path)
    cmd = superlink_command(LinkSettings(tls=TlsFiles.in_folder(Path("certs")), auth=True))
    argv = supernode_argv(
        "site1", Path("fed"), "127.0.0.1:9092", 9094, None, Path("certs/ca.crt"), False,
        Path("certs/site-keys/site1.key"), "subprocess", None,
    )  # fmt: skip
    given = [c[c.index(flag) + 1] for c in (cmd,) for flag in ("--ssl-ca-certfile", "--ssl-certfile", "--ssl-keyfile")]
    given += [argv[argv.index(flag) + 1] for flag in ("--root-certificates", "--auth-supernode-private-key")]
    assert all(Path(p).is_absolute() and Path(p).is_file() for p in given), given


# --- only the coordinator's code runs on a site (fedseg.flower.bundles) ---------------------------------------


def foreign_fab(marker: Path) -> bytes:
    """A benign foreign app bundle (Flower's build function): its ClientApp module creates ``marker``/imported when
    imported and ``marker``/ran when it answers; its ServerApp sends every node a query and writes the replies'
    errors to the run config's ``report``."""
    from fedseg.flower.flwr_internals import build_fab

    pyproject = """[build-system]
requires = ["hatchling"]
build-backend = "hatchling.build"

[project]
name = "friendly-app"
version = "1.0.0"
license = "Apache-2.0"
dependencies = ["flwr"]

[tool.flwr.app]
publisher = "someone"

[tool.flwr.app.components]
serverapp = "friendly.server:app"
clientapp = "friendly.client:app"

[tool.flwr.app.config]
report = ""
nodes = 2
"""
    client = f"""from pathlib import Path
from flwr.app import Message, RecordDict
from flwr.clientapp import ClientApp

MARKER = Path({str(marker)!r})
MARKER.mkdir(parents=True, exist_ok=True)
(MARKER / "imported").touch()
app = ClientApp()


@app.query()
def hello(message, context):
    (MARKER / "ran").touch()
    return Message(RecordDict(), reply_to=message)
"""
    server = """import json, time
from pathlib import Path
from flwr.app import Message, RecordDict
from flwr.serverapp import ServerApp

app = ServerApp()


@app.main()
def main(grid, context):
    deadline, nodes = time.monotonic() + 240, []
    while len(nodes) < int(context.run_config["nodes"]) and time.monotonic() < deadline:
        nodes = list(grid.get_node_ids())
        time.sleep(0.2)
    asks = [Message(RecordDict(), dst_node_id=n, message_type="query") for n in nodes]
    replies = grid.send_and_receive(asks, timeout=180)
    said = {r.metadata.src_node_id: r.error.reason if r.has_error() else "answered" for r in replies}
    Path(str(context.run_config["report"])).write_text(json.dumps(said))
"""
    return build_fab(
        {
            "pyproject.toml": pyproject.encode(),
            "friendly/__init__.py": b"",
            "friendly/client.py": client.encode(),
            "friendly/server.py": server.encode(),
        }
    )


def test_a_site_refuses_every_bundle_but_fedseg_own_app_and_says_why(tmp_path):
    from fedseg import __version__
    from fedseg.flower.apps import MODULE, build_fab, pyproject
    from fedseg.flower.bundles import BundleRefused, check_bundle, refusal
    from fedseg.flower.flwr_internals import build_fab as build

    assert refusal(build_fab()) is None
    check_bundle(1, build_fab())
    assert refusal(foreign_fab(tmp_path / "m")) == "it is not fedseg's app (someone/friendly-app 1.0.0)"
    module = {f"{MODULE}.py": b"from fedseg.flower import apps\nclient_app = apps.client_app  # and more\n"}
    modified = build({"pyproject.toml": pyproject().encode(), **module})
    assert "claims to be fedseg/fedseg-flower" in refusal(modified) and "(modified)" in refusal(modified)
    older = build({"pyproject.toml": pyproject().replace(f'"{__version__}"', '"0.0.1"').encode(), **module})
    assert refusal(older).startswith("it is fedseg's app of another version (fedseg/fedseg-flower 0.0.1)")
    assert refusal(b"PK\x03\x04 not a zip") == "it is not a readable Flower app bundle"
    with pytest.raises(BundleRefused, match=r"^run 42 refused: its app bundle \(FAB sha256 [0-9a-f]{64}\)"):
        check_bundle(42, modified)
    assert not (tmp_path / "m").exists()


def test_every_isolation_runs_the_supernode_with_fedsegs_checking_runner():
    """Flower's own executor (`flwr-clientapp`, its `subprocess` isolation) imports any bundle: never used."""
    from fedseg.flower.supernode import runner_command

    for isolation in ("subprocess", "warm"):
        argv = supernode_argv("s", Path("f"), "127.0.0.1:1", 9094, None, None, True, None, isolation, None)
        assert argv[argv.index("--isolation") + 1] == "process"
    assert "--fresh" in runner_command(9094, "subprocess", None)
    assert "--fresh" not in runner_command(9094, "warm", 0.2)


def test_only_the_sites_own_runner_may_take_its_tasks_and_no_token_is_in_a_process_argument(
    tmp_path, disc_federation, monkeypatch
):
    """An attack: the SuperNode's Runtime API (127.0.0.1) handed the site's tasks to any local process that asked
    first (it read the site's messages and state and answered for it), and a fresh task's token was in its
    arguments (``ps``). Now the SuperNode starts with a secret drawn at its start (Flower's SuperExec
    authentication, a 0600 file in a 0700 folder, removed when it stops) that only its runner holds: an unsigned
    AcquireTask is refused (401)."""
    from fedseg.flower import flwr_internals
    from fedseg.flower.deploy import wait_for_port
    from fedseg.flower.worker import task_command

    data, fed = tmp_path / "fed", disc_federation(n_sites=2, cases_per_site=6)
    write_folder(fed, data)
    (port, closed) = free_ports(2)
    own_tmp = tmp_path / "tmp"
    own_tmp.mkdir()
    env = {**os.environ, "TMPDIR": str(own_tmp)}
    cmd = [sys.executable, "-m", "fedseg.cli", "flower", "supernode", "--site", fed.site_names[0]]
    cmd += ["--data", str(data), "--superlink", f"127.0.0.1:{closed}", "--insecure", "--port", str(port)]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)  # noqa: S603
    try:
        wait_for_port("127.0.0.1", port, 120, alive=lambda: proc.poll() is None, what="the SuperNode")
        (held,) = own_tmp.iterdir()
        assert stat.S_IMODE(held.stat().st_mode) == 0o700
        assert stat.S_IMODE((held / "superexec.secret").stat().st_mode) == 0o600
        stranger = flwr_internals.superexec_runtime_client(f"127.0.0.1:{port}", True, None)
        with pytest.raises(httpx.HTTPStatusError) as refused:
            flwr_internals.acquire_client_app_task(stranger)
        assert refused.value.response.status_code == 401
        guess = flwr_internals.superexec_runtime_client(f"127.0.0.1:{port}", True, None, b"\0" * 32)
        with pytest.raises(httpx.HTTPStatusError):
            flwr_internals.acquire_client_app_task(guess)
        secret = (held / "superexec.secret").read_bytes()  # its owner (this test's user) may
        owner = flwr_internals.superexec_runtime_client(f"127.0.0.1:{port}", True, None, secret)
        assert flwr_internals.acquire_client_app_task(owner) is None  # accepted: no task pending
    finally:
        proc.send_signal(signal.SIGTERM)
        said, _ = proc.communicate(timeout=60)
    assert "gives its tasks to its own ClientApp runner only" in said and "EXPERIMENTAL" not in said, said
    assert list(own_tmp.iterdir()) == []  # the secret's folder goes with the SuperNode
    # one a SuperNode killed with -9 left (its pid gone) is removed by the next start; a live one's is not
    from fedseg.flower.runtime_secret import folder_prefix, remove_dead_secrets

    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    prefix, other = folder_prefix("supernode"), folder_prefix("superlink")
    left, alive = own_tmp / f"{prefix}{dead.stdout.strip()}-x", own_tmp / f"{prefix}{os.getpid()}-y"
    not_its = own_tmp / f"{other}{dead.stdout.strip()}-z"  # another purpose's: its own starts remove it
    for folder in (left, alive, not_its):
        folder.mkdir()
        (folder / "superexec.secret").write_bytes(b"s")
    monkeypatch.setattr(tempfile, "tempdir", str(own_tmp))
    remove_dead_secrets("supernode")
    assert sorted(own_tmp.iterdir()) == sorted([alive, not_its])
    remove_dead_secrets("superlink")
    assert sorted(own_tmp.iterdir()) == [alive]
    assert "--task" in task_command(f"127.0.0.1:{port}", True, None, 0.1)


def test_the_runner_reads_the_secret_on_its_standard_input_and_gives_a_task_process_its_token_there(monkeypatch):
    """The runner reads the SuperNode's secret from its standard input before it imports anything (not from its
    environment, which `/proc/PID/environ` shows and a method package's child process would inherit), signs with it,
    and starts a fresh task's process with the token on that process's standard input: in no process's arguments
    and in no environment."""
    from fedseg.flower import flwr_internals, task_runner, worker

    real_serve, seen = worker.serve, {}

    def spy(address, insecure, certificates, poll, fresh, secret):
        seen.update(secret=secret, fresh=fresh, stdin_closed=sys.stdin.closed)

    monkeypatch.setattr(worker, "serve", spy)
    monkeypatch.setattr(flwr_internals, "cap_object_pull_backoff", lambda seconds, cap=1.0: None)
    monkeypatch.setattr(sys, "stdin", io.StringIO("ab" * 32 + "\n"))
    flower_log = logging.getLogger("flwr")  # the runner's filter of Flower's retry lines goes with this test
    monkeypatch.setattr(flower_log, "filters", list(flower_log.filters))
    monkeypatch.setattr(sys, "argv", ["worker", "--runtime-api-address", "127.0.0.1:9", "--fresh"])
    worker.main()
    assert seen == {"secret": bytes.fromhex("ab" * 32), "fresh": True, "stdin_closed": True}
    # a fresh task: its token on its standard input only
    tokens, started, signed = iter(["t0ken-of-one-task", None]), [], []
    monkeypatch.setattr(flwr_internals, "superexec_runtime_client", lambda *args: signed.append(args[-1]))
    monkeypatch.setattr(flwr_internals, "acquire_client_app_task", lambda client: next(tokens))
    monkeypatch.setattr("fedseg.flower.deploy.wait_for_port", lambda *args, **kwargs: None)

    class Task:
        def __init__(self, command, **kwargs):
            self.stdin = io.BytesIO()
            self.stdin.close = lambda: started.append((command, kwargs, self.stdin.getvalue()))  # type: ignore[method-assign]

        def wait(self):
            return 0

        def poll(self):
            return 0

    monkeypatch.setattr(task_runner.subprocess, "Popen", Task)

    def stop(seconds):
        raise KeyboardInterrupt

    monkeypatch.setattr(task_runner.time, "sleep", stop)
    with pytest.raises(KeyboardInterrupt):
        real_serve("127.0.0.1:9", True, None, 0.01, True, b"the secret")
    assert signed == [b"the secret"]
    ((command, kwargs, given),) = started
    assert given == b"t0ken-of-one-task\n" and "t0ken-of-one-task" not in " ".join(command)
    assert kwargs == {"stdin": subprocess.PIPE}  # this process's environment, which holds no secret


def _two_sites(procs: Processes, folder: Path, link: str, ports: list[int], hospitals: Path, env: dict) -> dict:
    """SuperNodes site1 (``subprocess`` isolation) and site2 (``warm``) of ``folder``, on ``ports``, connecting to the
    Fleet API at ``link``; logs ``hospitals/<site>.log``."""
    return {
        site: procs.start(
            site,
            supernode_command(site, folder, link, port, hospitals / site, None, None, isolation, 0.05),
            hospitals / f"{site}.log",
            env,
        )
        for site, port, isolation in zip(("site1", "site2"), ports, ("subprocess", "warm"))
    }


def _command_lines(*homes: Path) -> list[str]:
    """The command line of every process of the deployments whose ``FLWR_HOME`` is one of ``homes`` (``/proc``: the
    processes whose environment names it, as ``Processes`` finds them). Not every process of the machine: another
    run beside this test (``fedseg flower simulate`` keeps Flower's isolation, its token in ``ps``) failed it."""
    lines, markers = [], {f"FLWR_HOME={home}".encode() for home in homes}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                if markers & set((entry / "environ").read_bytes().split(b"\0")):
                    lines.append((entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace"))
    return lines


@pytest.mark.slow
def test_a_foreign_app_bundle_is_refused_by_the_coordinator_and_fedseg_still_trains(tmp_path, disc_federation, tiny):
    """A coordinator and two sites; while fedseg's run waits for them, someone on the coordinator's machine submits a
    foreign bundle on the (loopback) Control API without the coordinator's key: 401, no run (Flower's own executor
    would have imported and run its ServerApp on the coordinator's machine), no site hears of it, and fedseg's run on
    the same deployment trains to the end. No process took the ServerApp task without the SuperLink's secret (an
    unsigned request: 401), and no process had a task token or the Control API key in its arguments
    (``flwr-serverapp --token``, which ``ps`` shows every user). The runner's own refusal of a run the coordinator did
    not submit, for whoever has the key: the next test."""
    folder = write_folder(disc_federation(n_sites=2, cases_per_site=6), tmp_path / "fed")
    cfg = tmp_path / "cfg.yaml"
    # eval.local_models off: its model upload, restore and cross-site test evaluations are 4 more messages per
    # site after training, each a fresh process in `subprocess` isolation, and have nothing to do with the bundle
    run = {**tiny, "algorithms": ["fedavg"], "fl": {"rounds": 1}, "eval": {**tiny["eval"], "local_models": False}}
    cfg.write_text(yaml.safe_dump(run))
    fleet_port, control_port, *node_ports = free_ports(4)
    fleet, control = f"127.0.0.1:{fleet_port}", f"127.0.0.1:{control_port}"
    out, hospitals, marker = tmp_path / "out", tmp_path / "hospitals", tmp_path / "ran-on-a-site"
    env = flower_env(hospitals / "home")
    fab = foreign_fab(marker)
    with Processes(hospitals / "processes.json") as procs:
        coordinator = procs.start(
            "coordinator",
            [sys.executable, "-m", "fedseg.cli", "flower", "server", "--config", str(cfg), "--insecure"]
            + ["--federation", str(folder), "--out", str(out), "--host", "127.0.0.1", "--port", str(fleet_port)]
            + ["--control-address", control, "--wait", "240"],
            hospitals / "coordinator.log",
            env,
        )
        _wait_for(coordinator.log, "submitted", alive=lambda: coordinator.proc.poll() is None)
        client = control_client(control, None, key="")
        try:  # the first refusal: its log line is written at once (RefusalLog)
            with pytest.raises(httpx.HTTPStatusError, match="401 Unauthorized"):
                submit_run(client, fab, {"report": str(tmp_path / "foreign-replies.json"), "nodes": 2})
        finally:
            client.close()
        stranger = flwr_internals.superexec_runtime_client(control, True, None)
        with pytest.raises(httpx.HTTPStatusError) as refused:
            flwr_internals.acquire_server_app_task(stranger)
        assert refused.value.response.status_code == 401
        sites = _two_sites(procs, folder, fleet, node_ports, hospitals, env)
        arguments: set[str] = set()  # every command line seen while fedseg's run trains
        deadline = time.monotonic() + 600
        while coordinator.proc.poll() is None and time.monotonic() < deadline:
            arguments.update(_command_lines(hospitals / "home", out / "flower" / "home"))  # sites', coordinator's
            time.sleep(0.5)
        assert coordinator.proc.wait(timeout=5) == 0, coordinator.log.read_text()[-5000:]
        for item in sites.values():
            assert item.proc.poll() is None
    assert stat.S_IMODE((out / "flower" / "submitted-run").stat().st_mode) == 0o600
    assert not marker.exists() and not (tmp_path / "foreign-replies.json").exists()
    refusals = [
        line for line in (out / "flower" / "logs" / "superlink.log").read_text().splitlines() if REFUSED in line
    ]
    # one line per interval: the start-run refusal named at once, or (another refusal within 10 s before it) folded
    # into the count of the line naming the stranger's
    assert any("POST /v1/control/start-run from 127.0.0.1" in line for line in refusals) or any(
        "POST /v1/runtime/acquire-task" in line and "more refused" in line for line in refusals
    ), refusals
    assert any("fedseg.flower.serverapp_runner --runtime-api-address" in line for line in arguments)
    assert not [line for line in arguments if "--token" in line or "flwr-serverapp" in line or "control-key" in line]
    assert json.loads((out / "summary.json").read_text())["algorithms"]["fedavg"]["dice"]


def test_the_coordinators_runner_starts_its_own_run_only_and_that_with_fedsegs_bundle_only(tmp_path):
    """A SuperLink as `fedseg flower server` starts it, its OUT named in its environment; two runs of a foreign
    bundle are submitted on its Control API. The one OUT/flower/submitted-run names (as the coordinator records the
    run it submitted) gets a task process, which refuses the bundle before Flower installs any of it; the other is
    refused by the runner without a process, naming the run the coordinator runs. Nothing of the bundle ran."""
    out, marker = tmp_path / "out", tmp_path / "ran"
    (out / "flower").mkdir(parents=True)
    fleet_port, control_port = free_ports(2)
    link = LinkSettings("127.0.0.1", fleet_port, control=f"127.0.0.1:{control_port}")
    env = flower_env(tmp_path / "home", 0.05, {COORDINATOR_OUT: str(out)})
    fab = foreign_fab(marker)
    with Processes(tmp_path / "processes.json") as procs:
        key = secrets.token_hex(32)
        superlink = procs.start("superlink", superlink_command(link), tmp_path / "superlink.log", env, secret=key)
        wait_for_port("127.0.0.1", control_port, 120, alive=lambda: superlink.proc.poll() is None, what="SuperLink")
        client = control_client(link.control_address, None, key)
        try:
            submitted = submit_run(client, fab, {"report": str(tmp_path / "r.json"), "nodes": 1})
            (out / "flower" / "submitted-run").write_text(f"{submitted}\n")
            other = submit_run(client, fab, {"report": str(tmp_path / "r.json"), "nodes": 1})
            first = wait_run(client, submitted, poll=0.2, tick=lambda: time.sleep(0.2))
            second = wait_run(client, other, poll=0.2, tick=lambda: time.sleep(0.2))
        finally:
            client.close()
        procs.stop(grace=120)  # SIGTERM, as a deployment stops it; time for a loaded machine to shut down
    assert superlink.proc.returncode == 128 + signal.SIGTERM  # it exited, not killed
    digest = hashlib.sha256(fab).hexdigest()
    assert first.sub_status == "failed" and (
        f"run {submitted} refused: its app bundle (FAB sha256 {digest}) is not the one the coordinator runs"
    ) in " ".join(first.details.split())
    assert "it is not fedseg's app (someone/friendly-app 1.0.0)" in first.details
    assert second.sub_status == "failed" and second.details == (
        f"run {other} refused: the coordinator did not submit it (it runs run {submitted}); someone started it on "
        "its Control API"
    )
    assert not marker.exists() and not (tmp_path / "r.json").exists()
    # stopped with SIGTERM (as a deployment stops it), the SuperLink removed its secret's folder
    assert not list(Path(tempfile.gettempdir()).glob(f"fedseg-superlink-{superlink.proc.pid}-*"))


@pytest.mark.slow
def test_a_site_refuses_a_foreign_bundle_from_a_coordinator_that_runs_it_in_both_isolations(tmp_path, disc_federation):
    """A coordinator that is not fedseg's (Flower's own SuperLink, whose executor runs any bundle's ServerApp) sends a
    foreign bundle's messages to two sites (site1 in `subprocess`, site2 in `warm` isolation). Each refuses it (a log
    line naming the run and the FAB hash), the foreign ServerApp receives the refusal, nothing of the bundle ran on
    a site, and both stay up."""
    folder = write_folder(disc_federation(n_sites=2, cases_per_site=6), tmp_path / "fed")
    port, *node_ports = free_ports(3)
    link = f"127.0.0.1:{port}"
    hospitals, marker, report = tmp_path / "hospitals", tmp_path / "ran-on-a-site", tmp_path / "foreign-replies.json"
    env = flower_env(hospitals / "home")
    fab = foreign_fab(marker)
    with Processes(hospitals / "processes.json") as procs:
        superlink = procs.start(
            "superlink",
            [str(BIN / "flower-superlink"), "--insecure", "--host", "127.0.0.1", "--port", str(port)],
            hospitals / "superlink.log",
            env,
        )
        wait_for_port("127.0.0.1", port, 120, alive=lambda: superlink.proc.poll() is None, what="Flower's SuperLink")
        client = control_client(link, None, key="")  # Flower's own SuperLink asks no key
        try:
            foreign = submit_run(client, fab, {"report": str(report), "nodes": 2})
            sites = _two_sites(procs, folder, link, node_ports, hospitals, env)
            status = wait_run(client, foreign, poll=0.5, tick=lambda: time.sleep(0.5))
        finally:
            client.close()
        assert status.sub_status == "completed", status.details
        for item in sites.values():
            assert item.proc.poll() is None  # refusing a bundle leaves the site up
    digest = hashlib.sha256(fab).hexdigest()
    refused = f"run {foreign} refused: its app bundle (FAB sha256 {digest}) is not the one this site runs"
    for site in ("site1", "site2"):
        said = " ".join((hospitals / f"{site}.log").read_text().split())
        assert refused in said and "it is not fedseg's app (someone/friendly-app 1.0.0)" in said, said[-3000:]
    replies = json.loads(report.read_text())
    assert len(replies) == 2 and all(refused in reason for reason in replies.values()), replies
    assert not marker.exists(), sorted(p.name for p in marker.iterdir())


def _certs(*args: str) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "fedseg.cli", "flower", "certs", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120)


def test_certs_that_fail_while_writing_leave_the_folder_as_it_was(tmp_path):
    """A key that cannot be written (a site name too long for the file system: a real OSError after the CA and
    the SuperLink certificate were made) leaves no new folder, and with --force over an existing CA not one file
    changed; a name that is not a plain file name is refused before anything is made. One error line each."""
    long_name = "s" * 300
    fresh = tmp_path / "fresh"
    done = _certs("--out", str(fresh), "--node", "site1", "--node", long_name)
    assert (done.returncode, done.stdout) == (1, ""), done.stderr
    assert done.stderr.startswith("error: ") and "File name too long" in done.stderr and "Traceback" not in done.stderr
    assert done.stderr.strip().endswith(f"nothing was written to {fresh}") and len(done.stderr.splitlines()) == 1
    assert not fresh.exists()

    kept = tmp_path / "kept"
    assert _certs("--out", str(kept), "--node", "site1").returncode == 0
    before = {p: p.read_bytes() for p in kept.rglob("*") if p.is_file()}
    assert _certs("--out", str(kept), "--node", "site1", "--node", long_name, "--force").returncode == 1
    assert {p: p.read_bytes() for p in kept.rglob("*") if p.is_file()} == before  # no file replaced, none added
    assert not [p for p in kept.iterdir() if p.name.startswith(".")]  # no staging folder left

    for bad in ["../outside", ".hidden", ""]:
        done = _certs("--out", str(tmp_path / "named"), "--node", bad)
        assert done.returncode == 1 and done.stderr.startswith(f"error: --node {bad!r}: not a site name"), done.stderr
    assert not (tmp_path / "named").exists() and not (tmp_path / "outside.key").exists()
    done = _certs("--out", str(tmp_path / "named"), "--host", "bad host name!!")  # was put in the certificate
    assert done.returncode == 1 and done.stderr.startswith("error: --host 'bad host name!!': not an IP address or a")
    assert not (tmp_path / "named").exists()


def test_a_superlink_name_is_an_ip_address_or_a_dns_name():
    from fedseg.flower.certs import host_problem

    for good in ["10.0.0.7", "::1", "superlink.hospital.org", "link-1", "*.hospital.org", "a" * 63 + ".org", "p_sl_1"]:
        assert host_problem(good) is None, good
    for bad in ["bad host", "-lead.org", "trail-.org", "a" * 64 + ".org", "", "x..org", "é.org", "a!b"]:
        assert host_problem(bad) is not None, bad


def test_a_resumed_coordinator_without_the_authentication_it_started_with_is_refused(tmp_path, tiny, disc_federation):
    """A run started with TLS and SuperNode authentication (OUT/flower/protection.json) resumed with --certs but
    without --auth-keys: refused in one line before the SuperLink starts (it ran unauthenticated without a word,
    and the docs' resume command omitted the flag); an older run folder without the record resumes as before."""
    from fedseg.flower.launch import keep_protection
    from fedseg.flower.superlink import LinkSettings

    folder = write_folder(disc_federation(n_sites=2, cases_per_site=6), tmp_path / "fed")
    tls = make_certs(tmp_path / "certs", nodes=["site1", "site2"])
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text(yaml.safe_dump({**tiny, "algorithms": ["fedavg"], "fl": {"rounds": 1}}))
    out = tmp_path / "out"
    keep_protection(out, LinkSettings(tls=tls, auth=True), resume=False)  # what the first start recorded
    assert json.loads((out / "flower" / "protection.json").read_text()) == {"tls": True, "auth": True}
    said = subprocess.run(
        [sys.executable, "-m", "fedseg.cli", "flower", "server", "--config", str(cfg), "--federation", str(folder)]
        + ["--certs", str(tmp_path / "certs"), "--out", str(out), "--resume", "--wait", "5"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert said.returncode == 1, said.stdout + said.stderr
    error = " ".join(said.stderr.split())
    assert (
        f"{out}: this run started with SuperNode authentication (--auth-keys); resume it with the flags it was "
        "started with" in error
    ), error
    assert "Traceback" not in said.stderr and "SuperLink:" not in said.stdout  # nothing was started
    keep_protection(out, LinkSettings(tls=tls, auth=True), resume=True)  # the same flags: resumes
    (out / "flower" / "protection.json").unlink()
    keep_protection(out, LinkSettings(), resume=True)  # a run folder from before the record: as before
    # the sites' order is kept too: another federation.yaml site_order swapped the sites' indices mid-run
    again = tmp_path / "again"
    keep_protection(again, LinkSettings(tls=tls, auth=True), resume=False, sites=["site2", "site1"])
    with pytest.raises(FlowerRunError, match=r"started with its sites in the order site2, site1, now site1, site2"):
        keep_protection(again, LinkSettings(tls=tls, auth=True), resume=True, sites=["site1", "site2"])
    keep_protection(again, LinkSettings(tls=tls, auth=True), resume=True, sites=["site2", "site1"])


def test_certs_keep_the_sites_private_keys_apart_and_the_coordinator_warns_of_one_it_holds(
    tmp_path, tiny, disc_federation
):
    """The private keys were written into supernodes/, the folder the docs' coordinator registers (--auth-keys):
    its disk held every hospital's key (a security audit). Now site-keys/ (0700) holds them, supernodes/ only the
    public halves, and a coordinator whose --auth-keys folder holds a private key says so before it starts."""
    import shutil
    import stat

    from fedseg.flower.launch import keep_protection
    from fedseg.flower.superlink import LinkSettings

    tls = make_certs(tmp_path / "certs", nodes=["site1", "site2"])
    certs = tmp_path / "certs"
    assert sorted(p.name for p in (certs / "supernodes").iterdir()) == ["site1.pub", "site2.pub"]
    assert sorted(p.name for p in (certs / "site-keys").iterdir()) == ["site1.key", "site2.key"]
    assert stat.S_IMODE((certs / "site-keys").stat().st_mode) == 0o700
    assert stat.S_IMODE((certs / "site-keys" / "site1.key").stat().st_mode) == 0o600

    old = tmp_path / "old"  # certs written by an older fedseg (private keys in supernodes/), given a new site
    make_certs(old, nodes=["site1"])
    (old / "site-keys" / "site1.key").rename(old / "supernodes" / "site1.key")
    (old / "site-keys").rmdir()
    make_certs(old, nodes=["site2"])
    assert sorted(p.name for p in (old / "supernodes").iterdir()) == ["site1.pub", "site2.pub"]
    assert sorted(p.name for p in (old / "site-keys").iterdir()) == ["site1.key", "site2.key"]

    keys = tmp_path / "keys"  # an older layout: private and public keys in one folder
    shutil.copytree(certs / "supernodes", keys)
    shutil.copy(certs / "site-keys" / "site1.key", keys / "site1.key")
    folder = write_folder(disc_federation(n_sites=2, cases_per_site=6), tmp_path / "fed")
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text(yaml.safe_dump({**tiny, "algorithms": ["fedavg"], "fl": {"rounds": 1}}))
    out = tmp_path / "out"
    keep_protection(out, LinkSettings(tls=tls, auth=True), resume=False)  # started with TLS: --insecure refused
    said = subprocess.run(
        [sys.executable, "-m", "fedseg.cli", "flower", "server", "--config", str(cfg), "--federation", str(folder)]
        + ["--insecure", "--auth-keys", str(keys), "--out", str(out), "--resume", "--wait", "5"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    warning = " ".join(said.stdout.split())
    assert f"warning: {keys} holds private SuperNode keys (site1.key): whoever reads" in warning, said.stdout
    assert said.returncode == 1 and "Traceback" not in said.stderr  # then refused, as the resume test shows


def test_a_coordinator_config_that_cannot_run_is_refused_before_any_site_connects(tmp_path, tiny, disc_federation):
    """data.source: folder without data.root was refused only after every hospital had connected (a security
    audit); now in one line before the SuperLink starts."""
    folder = write_folder(disc_federation(n_sites=2, cases_per_site=6), tmp_path / "fed")
    cfg = tmp_path / "cfg.yaml"
    data = {**tiny.get("data", {}), "source": "folder"}
    cfg.write_text(yaml.safe_dump({**tiny, "data": data, "algorithms": ["fedavg"], "fl": {"rounds": 1}}))
    said = subprocess.run(
        [sys.executable, "-m", "fedseg.cli", "flower", "server", "--config", str(cfg), "--federation", str(folder)]
        + ["--insecure", "--out", str(tmp_path / "out"), "--wait", "5"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert said.returncode == 1 and "Traceback" not in said.stderr, said.stdout + said.stderr
    assert "data.source is 'folder' but data.root is not set: set data.root" in " ".join(said.stderr.split())
    assert "SuperLink" not in said.stdout  # nothing was started


def test_a_private_key_other_users_can_read_is_refused(tmp_path):
    """A site's key of mode 0644 connected without a word (a security audit); ssh refuses such keys."""
    from fedseg.flower.supernode import check_private_key

    key = tmp_path / "site1.key"
    key.write_text("private")
    key.chmod(0o644)
    with pytest.raises(ValueError, match=r"other users can read or change it \(mode 644\).*chmod 600"):
        check_private_key(key)
    key.chmod(0o600)
    check_private_key(key)
    with pytest.raises(ValueError, match="cannot be read"):
        check_private_key(tmp_path / "missing.key")


def test_the_coordinator_registers_one_key_per_site_of_the_run(tmp_path, capsys):
    """--sites without site1 still registered site1.pub, and a site without a key waited out --wait (an audit): a
    site without a key is refused before the run starts, a key of no site is said and not registered; --sites takes
    file-name-safe names only."""
    from fedseg.flower.cli import coordinator_federation, site_keys

    keys = {name: tmp_path / f"{name}.pub" for name in ("site1", "site2", "site3")}
    assert site_keys(keys, ["site2", "site3"], tmp_path) == {"site2": keys["site2"], "site3": keys["site3"]}
    assert f"--auth-keys {tmp_path}: site1.pub name no site of this run: not registered" in capsys.readouterr().out
    with pytest.raises(ValueError, match=r"no key for site 'site4' \(expected .*site4.pub\)"):
        site_keys(keys, ["site2", "site4"], tmp_path)
    with pytest.raises(ValueError, match=r"--sites: site '\.\./\.\./etc': not usable as a file name"):
        coordinator_federation(tmp_path / "federation.yaml", "../../etc,site2")


def test_a_coordinator_that_cannot_listen_or_reach_its_superlink_says_so_in_one_message(tmp_path):
    """An audit: a Fleet port in use, an expired superlink.crt and --control-address 0.0.0.0 each ended in a
    370-line traceback. A port this process cannot listen on is refused before the SuperLink starts; a failed
    Control API call is one message with its likely cause and the SuperLink's log; an every-interface control
    address is dialled on 127.0.0.1 (no certificate names 0.0.0.0)."""
    import socket

    import httpx

    from fedseg.flower.launch import control_problem
    from fedseg.flower.superlink import start_superlink

    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        link = LinkSettings("127.0.0.1", port, control=f"127.0.0.1:{free_ports(1)[0]}")
        refused = rf"the Fleet API \(--host, --port\) cannot listen on 127.0.0.1:{port}: .*another process listens"
        with pytest.raises(RuntimeError, match=refused):
            start_superlink(None, link, tmp_path, {})  # type: ignore[arg-type]  # refused before any process starts
    assert not list(tmp_path.iterdir())
    elsewhere = LinkSettings("10.255.255.1", free_ports(1)[0], control=f"127.0.0.1:{free_ports(1)[0]}")
    with pytest.raises(RuntimeError, match=r"10.255.255.1 is no address of this machine"):
        start_superlink(None, elsewhere, tmp_path, {})  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"^--control-address 127.0.0.1: expected HOST:PORT"):
        start_superlink(None, LinkSettings(control="127.0.0.1"), tmp_path, {})  # type: ignore[arg-type]
    same = free_ports(1)[0]  # a re-test: both APIs on one port died in a traceback
    with pytest.raises(RuntimeError, match=rf"--control-address 127.0.0.1:{same} and --port {same}: one port"):
        start_superlink(None, LinkSettings("127.0.0.1", same, control=f"127.0.0.1:{same}"), tmp_path, {})  # type: ignore[arg-type]
    a, b = make_certs(tmp_path / "a"), make_certs(tmp_path / "b")  # a's certificate with b's key: 17 lines before
    mixed = LinkSettings(
        "127.0.0.1", free_ports(1)[0], TlsFiles(a.ca, a.cert, b.key), control=f"127.0.0.1:{free_ports(1)[0]}"
    )
    with pytest.raises(RuntimeError, match=r"the key is not this certificate's"):
        start_superlink(None, mixed, tmp_path, {})  # type: ignore[arg-type]
    from fedseg.flower.cli import coordinator_federation

    with pytest.raises(ValueError, match=r"--sites: site 'site1' given twice"):
        coordinator_federation(tmp_path / "federation.yaml", "site1,site1")
    assert LinkSettings(control="0.0.0.0:9093").control_dial == "127.0.0.1:9093"
    assert LinkSettings(control="10.0.0.5:9093").control_dial == "10.0.0.5:9093"
    log = tmp_path / "superlink.log"
    log.write_text("INFO: starting\n")
    expired = httpx.ConnectError("[SSL: CERTIFICATE_VERIFY_FAILED] certificate verify failed: certificate has expired")
    said = control_problem(expired, "127.0.0.1:9093", log)
    assert said.startswith("the coordinator cannot reach its SuperLink's Control API on 127.0.0.1:9093: [SSL:")
    assert "a certificate has expired: make new ones" in said and said.endswith("INFO: starting")
