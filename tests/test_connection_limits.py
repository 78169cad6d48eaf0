"""A SuperLink listener holds a bounded number of connections and closes silent ones (fedseg.flower.connection_limits):
a security test had held 20,000 idle connections on the SuperLink until it ran out of file descriptors and the run
stopped. Checked on real sockets: a uvicorn server in this process with small limits and a two-second deadline, and
a real SuperLink process with the defaults."""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import resource
import socket
import ssl
import struct
import subprocess
import sys
import threading
import time

import httpx
import pytest
from flwr.proto.control_pb2 import ListRunsRequest

from fedseg.flower import connection_limits as cl
from fedseg.flower.certs import make_certs
from fedseg.flower.deploy import Processes, flower_env, free_ports
from fedseg.flower.superlink import LinkSettings, start_superlink


def _closed_at_once(conn: socket.socket, within: float = 0.5) -> bool:
    """Whether the server has closed ``conn`` (EOF or reset) within ``within`` seconds."""
    conn.settimeout(within)
    try:
        return conn.recv(1) == b""
    except TimeoutError:
        return False
    except OSError:
        return True


def _seconds_until_closed(conn: socket.socket, most: float = 10.0) -> float:
    began = time.monotonic()
    assert _closed_at_once(conn, most), f"still open after {most} s"
    return time.monotonic() - began


def _connect(port: int, source: str = "127.0.0.1") -> socket.socket:
    conn = socket.socket()
    conn.bind((source, 0))
    conn.connect(("127.0.0.1", port))
    return conn


@contextlib.contextmanager
def _serving(app, limits: cl.ConnectionLimits, port: int | None = None, **options):
    """A ``limited_server`` of ``app`` within ``limits`` on a loopback port (a free one unless given), served on a
    thread meanwhile: ``(server, port, refused)``, ``refused`` the texts it was told; stopped at the end."""
    (port,) = (port,) if port is not None else free_ports(1)
    refused: list[str] = []
    server = cl.limited_server(app, ("127.0.0.1", port), limits, refused.append, log_level="error", **options)
    thread = threading.Thread(target=cl.serve_listeners, args=([server],), daemon=True)
    thread.start()
    try:
        began = time.monotonic()
        while not server.started:
            assert thread.is_alive() and time.monotonic() - began < 30, "the server did not start"
            time.sleep(0.05)
        yield server, port, refused
    finally:
        server.should_exit = True
        thread.join(timeout=10)
    assert not thread.is_alive()


async def _app(scope, receive, send):
    """Answers ``ok``; ``/slow`` after 3 s (longer than the deadline: a request being served is not cut)."""
    if scope["type"] != "http":
        return
    if scope["path"] == "/slow":
        await asyncio.sleep(3.0)
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]})
    await send({"type": "http.response.body", "body": b"ok"})


def test_a_listener_holds_at_most_its_connections_and_closes_those_that_say_nothing(tmp_path):
    certs = make_certs(tmp_path / "certs")
    limits = cl.ConnectionLimits(total=6, per_client=4, head_s=2.0)
    tls_files = {"ssl_keyfile": str(certs.key), "ssl_certfile": str(certs.cert)}
    tls = ssl.create_default_context(cafile=str(certs.ca))
    with _serving(_app, limits, **tls_files) as (server, port, refused):
        url = f"https://127.0.0.1:{port}"
        # one address's share: the fifth connection from 127.0.0.1 is closed as it is accepted, before any TLS
        first = [_connect(port) for _ in range(5)]
        assert [_closed_at_once(conn, 0.1) for conn in first] == [False] * 4 + [True]
        assert refused[-1] == "a connection from 127.0.0.1: it holds 4 connections, the most one address may"
        # the listener's total: 127.0.0.2 gets the two places left, its third is closed
        other = [_connect(port, "127.0.0.2") for _ in range(3)]
        assert [_closed_at_once(conn, 0.1) for conn in other] == [False, False, True]
        assert refused[-1] == "a connection from 127.0.0.2: the listener holds 6 connections, its most"
        assert server.connections.total == 6
        for conn in first + other:  # closing gives the places back
            conn.close()
        deadline = time.monotonic() + 5
        while server.connections.total and time.monotonic() < deadline:
            time.sleep(0.05)
        assert server.connections.total == 0 and server.connections.by_client == {}
        # a connection that never starts its TLS handshake, one that finishes it and says nothing, one that sends
        # half a request head: each closed once the deadline (2 s) has passed, not before
        silent_tcp = _connect(port)
        silent_tls = tls.wrap_socket(_connect(port), server_hostname="127.0.0.1")
        half_head = tls.wrap_socket(_connect(port), server_hostname="127.0.0.1")
        half_head.sendall(b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\n")
        opened = time.monotonic()
        for conn in (silent_tcp, silent_tls, half_head):
            waited = time.monotonic() - opened
            assert 1.5 <= _seconds_until_closed(conn) + waited <= 6.0
            conn.close()
        assert refused[-1] == "a connection from 127.0.0.1: no request head within 2 s"
        # a request served for longer than the deadline is answered; a kept-alive connection serves a second request
        with httpx.Client(verify=tls) as client:
            assert client.get(f"{url}/slow").text == "ok"
            time.sleep(0.5)
            assert client.get(f"{url}/").text == "ok"
            assert server.connections.total == 1  # the same connection
            time.sleep(3.0)  # idle past the deadline after its answer: closed, the place given back
            assert server.connections.total == 0
            assert client.get(f"{url}/").text == "ok"  # a new connection


def _listener_threads() -> list[str]:
    """The names of this process's threads that serve a listener (``serve_listeners``)."""
    return [thread.name for thread in threading.enumerate() if thread.name.startswith("listener ")]


def test_the_first_listener_answers_while_another_listeners_event_loop_is_blocked():
    """Each listener after the first (the SuperLink's Fleet listener) is served on an event loop of its own, in a
    thread of its own: one whose loop is held up (here its app blocks it; a flood of TLS handshakes on the Fleet
    port had slowed the coordinator's control calls 40-fold) does not hold up the first (the control address). On
    one loop, the control call below would wait until the block ends (20 s) and time out. Stopping the first stops
    the other, its thread gone."""
    blocked, release = threading.Event(), threading.Event()
    served_on: dict[str, tuple[int, int]] = {}

    def answering(name: str):
        async def app(scope, receive, send):
            if scope["type"] != "http":
                return
            served_on[name] = (threading.get_ident(), id(asyncio.get_running_loop()))
            if scope["path"] == "/block":
                blocked.set()
                release.wait(20.0)  # the whole event loop stops here
            await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]})
            await send({"type": "http.response.body", "body": b"ok"})

        return app

    control_port, fleet_port = free_ports(2)
    control = cl.limited_server(answering("control"), ("127.0.0.1", control_port), cl.ConnectionLimits(8), print)
    fleet = cl.limited_server(
        answering("fleet"), ("127.0.0.1", fleet_port), cl.ConnectionLimits(8), print, lifespan="off"
    )
    serving = threading.Thread(target=cl.serve_listeners, args=([control, fleet],), daemon=True)
    serving.start()
    blocking = threading.Thread(
        target=lambda: httpx.get(f"http://127.0.0.1:{fleet_port}/block", timeout=30.0), daemon=True
    )
    try:
        began = time.monotonic()
        while not (control.started and fleet.started):
            assert serving.is_alive() and time.monotonic() - began < 30, "the listeners did not start"
            time.sleep(0.05)
        assert httpx.get(f"http://127.0.0.1:{fleet_port}/", timeout=10.0).text == "ok"
        assert httpx.get(f"http://127.0.0.1:{control_port}/", timeout=10.0).text == "ok"
        assert served_on["control"][0] != served_on["fleet"][0], "both listeners on one thread"
        assert served_on["control"][1] != served_on["fleet"][1], "both listeners on one event loop"
        blocking.start()
        assert blocked.wait(10.0), "the Fleet listener's app was not called"
        assert httpx.get(f"http://127.0.0.1:{control_port}/", timeout=5.0).text == "ok"  # while the other is held
    finally:
        release.set()
        blocking.join(timeout=30)
        control.should_exit = True
        serving.join(timeout=30)
    assert not serving.is_alive() and not _listener_threads()
    assert fleet.should_exit


def test_a_listener_that_fails_on_its_own_thread_stops_the_first_and_its_error_is_raised(tmp_path):
    """The Fleet listener's TLS files unreadable as it starts (on its own thread): the control listener stops too,
    and ``serve_listeners`` raises that error, as one event loop did."""
    certs = make_certs(tmp_path / "certs")
    control_port, fleet_port = free_ports(2)
    control = cl.limited_server(_app, ("127.0.0.1", control_port), cl.ConnectionLimits(8), print, log_level="error")
    fleet = cl.limited_server(
        _app,
        ("127.0.0.1", fleet_port),
        cl.ConnectionLimits(8),
        print,
        lifespan="off",
        log_level="error",
        ssl_keyfile=str(tmp_path / "gone.key"),
        ssl_certfile=str(certs.cert),
    )
    failed: list[BaseException] = []

    def serve() -> None:
        try:
            cl.serve_listeners([control, fleet])
        except BaseException as e:  # noqa: BLE001 - what the test looks at
            failed.append(e)

    serving = threading.Thread(target=serve, daemon=True)
    serving.start()
    serving.join(timeout=30)
    assert not serving.is_alive() and not _listener_threads()
    assert control.started and control.should_exit
    assert len(failed) == 1 and isinstance(failed[0], OSError), failed


def test_a_body_still_coming_on_another_listener_does_not_hold_up_the_stop():
    """Anyone reaching the Fleet port can open a request and send its body a byte at a time. Once the first listener
    stops (a signal), the others get OTHERS_GRACE_S to answer, then stop without waiting: a graceful wait for that
    body had held the SuperLink's stop for 10 s, past the 5 s the coordinator gives it before SIGKILL (which left its
    secret's folder behind)."""

    async def reading(scope, receive, send):
        if scope["type"] != "http":
            return
        while (await receive()).get("more_body"):  # the whole body, as the Fleet listener reads it
            pass
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]})
        await send({"type": "http.response.body", "body": b"ok"})

    control_port, fleet_port = free_ports(2)
    control = cl.limited_server(reading, ("127.0.0.1", control_port), cl.ConnectionLimits(8), print, log_level="error")
    fleet = cl.limited_server(
        reading, ("127.0.0.1", fleet_port), cl.ConnectionLimits(8), print, lifespan="off", log_level="critical"
    )
    serving = threading.Thread(target=cl.serve_listeners, args=([control, fleet],), daemon=True)
    serving.start()
    began = time.monotonic()
    while not (control.started and fleet.started):
        assert serving.is_alive() and time.monotonic() - began < 30, "the listeners did not start"
        time.sleep(0.05)
    with socket.create_connection(("127.0.0.1", fleet_port), timeout=10) as slow:
        slow.sendall(b"POST /x HTTP/1.1\r\nHost: x\r\nContent-Length: 1000000\r\n\r\n" + b"a")
        time.sleep(0.5)  # the request is being served, its body still coming
        control.should_exit = True  # as a signal stops it
        stopping = time.monotonic()
        serving.join(timeout=30)
        took = time.monotonic() - stopping
    assert not serving.is_alive() and not _listener_threads()
    assert took < cl.OTHERS_GRACE_S + cl.OTHERS_FORCED_S + 1.5 < 5.0, f"the stop took {took:.1f} s"


async def _big_app(scope, receive, send):
    """Answers 1 MB to every request, 10 MB to ``/big``."""
    if scope["type"] != "http":
        return
    size = 10_000_000 if scope["path"] == "/big" else 1_000_000
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", str(size).encode())]})
    await send({"type": "http.response.body", "body": b"x" * size})


def test_a_client_that_reads_none_of_its_answers_is_closed_after_the_stall_deadline():
    """Requests sent back to back and no answer read: the answer waits in a full send buffer, "being served" for
    ever, past the head deadline (a review held a connection so); closed once the client has read none of it for
    ``stall_s``. A client that reads, however slowly, gets its answers."""
    limits = cl.ConnectionLimits(total=4, head_s=1.0, stall_s=2.0)
    with _serving(_big_app, limits) as (server, port, refused):
        greedy = _connect(port)
        requests = cl.PIPELINED_MOST - 1  # within the pipelining cap: 70 MB of answers, none read
        greedy.sendall(b"GET /big HTTP/1.1\r\nHost: x\r\n\r\n" * requests)
        began = time.monotonic()
        while not refused and time.monotonic() - began < 15.0:  # told as it is closed
            time.sleep(0.05)
        assert 1.5 <= time.monotonic() - began <= 10.0, refused
        greedy.close()
        assert refused[-1] == "a connection from 127.0.0.1: read none of its answer for 2 s"
        slow = _connect(port)  # reads 1 MB in 4 s: longer than the stall deadline, and never still for that long
        slow.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        received = 0
        slow.settimeout(5.0)
        while received < 1_000_000 + 30:
            chunk = slow.recv(65536)
            assert chunk, f"closed after {received} bytes"
            received += len(chunk)
            time.sleep(0.25)
        slow.close()
        assert not [line for line in refused[1:] if "read none" in line], refused  # at most idle after it


def test_a_client_sending_many_requests_ahead_of_their_answers_is_closed():
    """An attack sent a million pipelined requests on one connection and the SuperLink held 2.5 GB of queued
    requests (httptools' protocol queues them all); more than PIPELINED_MOST waiting closes the connection."""
    with _serving(_app, cl.ConnectionLimits(total=4)) as (server, port, refused):
        few = _connect(port)  # a client that pipelines a few: every answer
        few.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n" * 3)
        answers = b""
        few.settimeout(5.0)
        while answers.count(b"ok") < 3:
            chunk = few.recv(4096)
            assert chunk, answers
            answers += chunk
        few.close()
        greedy = _connect(port)
        greedy.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n" * 1000)
        assert _seconds_until_closed_reading(greedy) < 5.0
        assert refused == [
            f"a connection from 127.0.0.1: more than {cl.PIPELINED_MOST} requests ahead of their answers"
        ]


def _seconds_until_closed_reading(conn: socket.socket, most: float = 10.0) -> float:
    """Seconds until ``conn`` is closed (EOF or reset), reading and dropping what arrives meanwhile."""
    began = time.monotonic()
    conn.settimeout(most)
    try:
        while conn.recv(65536):
            pass
    except OSError:
        pass
    return time.monotonic() - began


@pytest.mark.parametrize(
    ("host", "counted_as"),
    [
        ("127.0.0.1", "127.0.0.1"),
        ("::ffff:10.1.2.3", "10.1.2.3"),
        ("2001:db8:0:1::7", "2001:db8:0:1::/64"),
        ("2001:db8:0:1:ffff::9", "2001:db8:0:1::/64"),
        ("fe80::1%eth0", "fe80::/64"),
    ],
)
def test_an_ipv6_client_counts_as_its_64_network(host, counted_as):
    """One host often holds a whole /64: an attack filled the Fleet port from 40 addresses of one."""
    assert cl.client_key(host) == counted_as


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="netlink sock_diag: Linux")
def test_a_control_connection_whose_process_cannot_be_found_is_refused():
    """A socket bound to a device (SO_BINDTODEVICE lo, which an unprivileged user may do since Linux 5.7) is
    skipped by the kernel's exact lookup: an attack held 255 of the control address's 256 places so. Where the
    lookup works, a connection it cannot place is refused."""
    with _serving(_app, cl.ConnectionLimits(total=8, own_user_only=True)) as (server, port, refused):
        bound = socket.socket()
        try:
            bound.setsockopt(socket.SOL_SOCKET, socket.SO_BINDTODEVICE, b"lo")
        except OSError as e:
            bound.close()
            pytest.skip(f"SO_BINDTODEVICE not allowed here: {e}")
        bound.connect(("127.0.0.1", port))
        assert _closed_at_once(bound, 2.0)
        bound.close()
        assert refused == [
            f"a connection from 127.0.0.1: its process's user cannot be found; only user id {os.geteuid()}'s here"
        ]
        plain = _connect(port)  # the coordinator's own processes: admitted
        assert not _closed_at_once(plain, 0.3)
        plain.close()


def test_the_limits_fit_the_processs_file_descriptors():
    control, fleet = cl.listener_limits(20000, fleet=True)
    assert control == cl.ConnectionLimits(cl.CONTROL_CONNECTIONS, own_user_only=True)
    assert fleet == cl.ConnectionLimits(cl.FLEET_CONNECTIONS, cl.FLEET_CONNECTIONS_PER_CLIENT)
    control, fleet = cl.listener_limits(1024, fleet=True)  # a common default soft limit that cannot be raised
    assert fleet is not None and control.total + fleet.total + cl.FD_RESERVE <= 1024
    assert control.total >= 16 and fleet.total >= 16 and fleet.per_client == cl.FLEET_CONNECTIONS_PER_CLIENT
    assert control.own_user_only and not fleet.own_user_only
    assert cl.listener_limits(20000, fleet=False) == (
        cl.ConnectionLimits(cl.CONTROL_CONNECTIONS, own_user_only=True),
        None,
    )


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the peer's user is asked of Linux (sock_diag)")
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="netlink sock_diag: Linux")
def test_the_peer_lookup_finds_the_clients_own_socket_and_never_a_listener():
    """The socket found is the client's (its inode), not the accepted one; a port where only a listener is, asked
    as a peer (a remote client whose source port happens to be a local listener's), is no local peer."""
    from fedseg.flower.peer_user import local_peer_socket, local_peer_uid

    with socket.create_server(("127.0.0.1", 0)) as server, socket.create_server(("0.0.0.0", 0)) as other:
        client = socket.create_connection(server.getsockname())
        accepted, _ = server.accept()
        with client, accepted:
            found = local_peer_socket(accepted.getsockname(), accepted.getpeername())
            assert found == (os.getuid(), os.fstat(client.fileno()).st_ino)
            assert os.fstat(accepted.fileno()).st_ino != found[1]
            listener_port = other.getsockname()[1]
            assert local_peer_uid(accepted.getsockname(), ("127.0.0.1", listener_port)) is None
            assert local_peer_uid(accepted.getsockname(), ("192.0.2.7", listener_port)) is None


def test_the_control_address_refuses_another_users_processes():
    """Only the coordinator's own processes belong on the control address: a process of this machine run by another
    user (nobody) is closed as it connects, in one refusal line; this user's is served."""
    from fedseg.flower.peer_user import local_peer_uid

    with socket.create_server(("127.0.0.1", 0)) as listening, socket.create_connection(listening.getsockname()):
        accepted, peer = listening.accept()
        with accepted:
            assert local_peer_uid(accepted.getsockname(), peer) == os.geteuid()
            assert local_peer_uid(accepted.getsockname(), ("127.0.0.1", 1)) is None  # no such socket here
    if os.geteuid() != 0:
        pytest.skip("starting a process as another user needs root")
    (port,) = free_ports(1)
    theirs = _connecting_as_nobody(port)  # forked before the server's thread starts
    limits = cl.ConnectionLimits(total=8, own_user_only=True)
    with _serving(_app, limits, port) as (server, port, refused):
        assert theirs() == "closed"
        assert refused == ["a connection from 127.0.0.1: a process of user id 65534; only user id 0's here"]
        assert server.connections.total == 0
        assert httpx.get(f"http://127.0.0.1:{port}/").text == "ok"  # this user's


def _connecting_as_nobody(port: int):
    """Fork a process that becomes user nobody and, once told, connects to ``port`` and says whether the server
    closed the connection within 2 s (``closed``) or kept it (``open``); returns the function that tells it and
    reads the answer."""
    go_read, go_write = os.pipe()
    said_read, said_write = os.pipe()
    child = os.fork()
    if child == 0:  # the child: nothing but these few calls, then out
        answer = b"failed"
        try:
            os.setgid(65534)
            os.setuid(65534)
            os.read(go_read, 1)
            with socket.create_connection(("127.0.0.1", port)) as conn:
                answer = b"closed" if _closed_at_once(conn, 2.0) else b"open"
        finally:
            os.write(said_write, answer)
            os._exit(0)
    os.close(go_read)
    os.close(said_write)

    def go() -> str:
        os.write(go_write, b"1")
        said = os.read(said_read, 16).decode()
        os.waitpid(child, 0)
        for fd in (go_write, said_read):
            os.close(fd)
        return said

    return go


def test_fd_budget_raises_a_low_soft_file_descriptor_limit_to_the_hard_one():
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard <= 256:
        pytest.skip(f"the hard limit here is {hard} file descriptors")
    low = 256

    def lowered() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (low, hard))

    code = (
        "import resource; from fedseg.flower.connection_limits import fd_budget; "
        "print(fd_budget(), resource.getrlimit(resource.RLIMIT_NOFILE)[0])"
    )
    out = subprocess.run(  # noqa: S603
        [sys.executable, "-c", code], capture_output=True, text=True, preexec_fn=lowered, check=True
    ).stdout.split()
    expected = cl.FD_WANTED if hard == resource.RLIM_INFINITY else min(hard, cl.FD_WANTED)
    assert [int(n) for n in out] == [expected, expected]


def test_a_superlink_whose_fleet_port_one_address_fills_still_answers_its_coordinator(tmp_path):
    """A real SuperLink (TLS, the default limits): one address holding 40 idle connections on the Fleet port gets
    32, the others closed at once, in one line of the SuperLink's log; the coordinator's Control API calls on the
    other listener are answered meanwhile."""
    certs = make_certs(tmp_path / "certs")
    fleet, control = free_ports(2)
    link = LinkSettings("127.0.0.1", fleet, certs, control=f"127.0.0.1:{control}")
    with Processes() as procs:
        running = start_superlink(procs, link, tmp_path, flower_env(tmp_path))
        time.sleep(1.0)  # start_superlink's own probe of the port has gone
        held = [_connect(fleet) for _ in range(40)]
        try:
            closed = [_closed_at_once(conn, 0.05) for conn in held]
            assert closed.count(False) == cl.FLEET_CONNECTIONS_PER_CLIENT, closed
            client = running.control_client()
            assert list(client.ListRuns(ListRunsRequest()).run_dict) == []
        finally:
            for conn in held:
                conn.close()
        said = "fedseg: refused a connection from 127.0.0.1: it holds 32 connections, the most one address may"
        deadline = time.monotonic() + 20  # the burst's last line is written once the interval (10 s) is over
        while time.monotonic() < deadline:
            lines = [line for line in (tmp_path / "superlink.log").read_text().splitlines() if said in line]
            if sum(_refusals_in(line) for line in lines) >= 8:
                break
            time.sleep(0.2)
        assert len(lines) == 2 and [_refusals_in(line) for line in lines] == [1, 7], lines  # at once, then the rest
    text = (tmp_path / "superlink.log").read_text()  # the limits it serves with: listener_limits(fd_budget())
    control_limits, fleet_limits = cl.listener_limits(cl.fd_budget(), True)  # the same hard limit as this process
    assert fleet_limits is not None
    assert f"fedseg: at most {control_limits.total} connections on 127.0.0.1:{control}" in text
    assert f"at most {fleet_limits.total} connections on 127.0.0.1:{fleet}, {fleet_limits.per_client} from" in text


def _refusals_in(line: str) -> int:
    """How many refusals a RefusalLog line counts: the one it names and the ``(N more refused ...)``."""
    more = re.search(r"\((\d+) more refused since the last such line\)", line)
    return 1 + (int(more.group(1)) if more else 0)


def _reset(conn: socket.socket) -> None:
    """Close ``conn`` with a TCP reset (``SO_LINGER`` on, 0 s), no TLS close: a client dropping the connection."""
    conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    socket.socket(fileno=conn.detach()).close()


@pytest.mark.slow
def test_requests_uvicorn_answers_itself_on_the_fleet_port_are_one_line_per_interval(tmp_path):
    """A real SuperLink (TLS, the default limits): 50 connections each sending a head uvicorn cannot parse and 50 each
    asking for a websocket, every one reset at once, grow its log by a few lines, the refusal log's, no traceback.
    uvicorn had logged "Invalid HTTP request received." for each of the first (80 bytes), and for each websocket
    handshake three lines (163 bytes) and, once the handshake's connection had been handed to uvicorn's websocket
    protocol, its head deadline firing 15 s later on the closed transport: an AttributeError traceback (0.9 kB)."""
    n = 50
    certs = make_certs(tmp_path / "certs")
    fleet, control = free_ports(2)
    link = LinkSettings("127.0.0.1", fleet, certs, control=f"127.0.0.1:{control}")
    log = tmp_path / "superlink.log"
    tls = ssl.create_default_context(cafile=str(certs.ca))
    websocket = (
        b"GET /v1/fleet/pull-messages HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n"
        b"Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n"
    )
    with Processes() as procs:
        start_superlink(procs, link, tmp_path, flower_env(tmp_path))
        time.sleep(1.0)  # start_superlink's own probe of the port has gone, the start-up lines written
        before = log.stat().st_size
        began = time.monotonic()
        for head in [b"\x01\x02 nonsense\r\n\r\n"] * n + [websocket] * n:
            conn = tls.wrap_socket(
                socket.create_connection(("127.0.0.1", fleet), timeout=10), server_hostname="127.0.0.1"
            )
            conn.sendall(head)
            time.sleep(0.01)  # read by the server, perhaps answered: then reset
            _reset(conn)

        def grown() -> list[str]:
            return log.read_bytes()[before:].decode(errors="replace").splitlines()

        unparsed = "fedseg: refused a request: 400 Bad Request: Invalid HTTP request received."
        upgrades = "fedseg: refused GET /v1/fleet/pull-messages from 127.0.0.1:"
        deadline = time.monotonic() + 20  # a burst's last line is written once the interval (10 s) is over
        while time.monotonic() < deadline:
            said = [sum(_refusals_in(line) for line in grown() if what in line) for what in (unparsed, upgrades)]
            if min(said) >= n * 0.8 and time.monotonic() - began > cl.HEAD_DEADLINE_S + 1.0:
                break  # every refusal counted, and a head deadline left running would have fired
            time.sleep(0.2)
        lines = grown()  # before the stop's own lines
    assert not [line for line in lines if "Traceback" in line or "Exception" in line], lines
    assert not [line for line in lines if "[uvicorn." in line], lines  # no line of uvicorn's own per request
    assert len(lines) <= 5, lines  # each kind at once, then the rest of the burst; a refusal of the port's share
    assert [sum(_refusals_in(line) for line in lines if what in line) >= n * 0.8 for what in (unparsed, upgrades)] == [
        True,
        True,
    ], lines


def test_a_listeners_connections_send_at_once_without_waiting_for_the_clients_ack():
    """Every connection a listener admits has ``TCP_NODELAY`` set, as asyncio sets it on the listeners it makes
    itself: without it uvicorn's answer, written as a head and then a body, waited for the client's delayed ACK of
    the head (~40 ms per request on Linux, more than half of a ``fedseg flower local`` exchange)."""
    listener = cl.listening_socket("127.0.0.1", 0, cl.OpenConnections(cl.ConnectionLimits(total=4), print))
    listener.listen()
    with listener, socket.create_connection(listener.getsockname()[:2], timeout=5) as client:
        connection, _ = listener.accept()
        with connection:
            assert connection.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY)
            assert not client.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY)  # a plain socket's default: off
