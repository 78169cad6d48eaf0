"""How many connections a SuperLink listener holds, and for how long one may stay silent.

Without these, a security test held 20,000 idle TCP connections open on the SuperLink's control address (uvicorn
sets no deadline on a request's head, and each connection is a file descriptor) until the process ran out of file
descriptors and the run stopped; anyone reaching the Fleet port could do the same. Here each listener:

- accepts at most :attr:`ConnectionLimits.total` connections at once, and at most
  :attr:`ConnectionLimits.per_client` from one client address (the Fleet listener; the control address's clients
  are all on this machine). A connection over either is closed as it is accepted (:class:`LimitedListener`: counted
  from ``accept`` to the socket's close, TLS handshake included), one line per interval in the refusal log;
- gives a connection :attr:`ConnectionLimits.head_s` seconds to finish its TLS handshake, and as long to send a
  request's head once it is open or its last answer was sent (:func:`head_deadline`): a connection that says
  nothing, or a head a byte at a time, is closed (the body then has the body limits of ``superlink_main``); and
  closes one whose client reads none of its answer for :attr:`ConnectionLimits.stall_s` seconds (a review held
  one open for ever by sending requests and never reading the answers, which kept a request "being served");
- on the control address, refuses a connection from another user's process on this machine (Linux:
  ``fedseg.flower.peer_user``): only the coordinator's own processes, run by its user, belong there, so another
  local user can no longer hold its connections;
- together stay within the process's file descriptors (:func:`fd_budget`: the soft limit raised to the hard one,
  a reserve kept for files, pipes and the coordinator's own processes).

A client that keeps opening connections still costs the SuperLink an ``accept`` and a ``close`` each (a flood is the
firewall's to stop); it can no longer exhaust the process. Filling one listener's share delays what comes through
that listener (a SuperNode retries); it does not stop the other, or the coordinator. Nor does the work of its
connections: :func:`serve_listeners` serves each listener after the first (the Fleet listener) on an event loop and
a thread of its own, so its TLS handshakes no longer queue ahead of the control address's requests on one loop
(3 processes replaying TLS handshakes on the Fleet port, 350-520/s, slowed a control call to a median of 101-121 ms
on one loop, 12-16 ms on its own: ``benchmarks/handshake_flood.py``, ``docs/deployment.md``). Each listener's
counters (:class:`OpenConnections`) and timers are used on its own loop's thread, bar a connection dropped without
``close`` that the garbage collector gives back on whichever thread it runs (as before, Flower's thread pool too).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass

from fedseg.flower.peer_user import local_peer_uid, peer_lookup_works

HEAD_DEADLINE_S = 15.0  # seconds for a TLS handshake, and for a request's head once a connection waits for one
SEND_STALL_S = 60.0  # seconds an answer may wait for its client to read any of it (a slow link still reads some)
FLEET_CONNECTIONS = 1024  # connections open at once on the Fleet listener (SuperNodes), at most
FLEET_CONNECTIONS_PER_CLIENT = 32  # of those from one client address (a hospital's SuperNode needs one or two)
CONTROL_CONNECTIONS = 256  # on the control address (the coordinator, its ServerApp runner and tasks: a few)
FD_RESERVE = 256  # file descriptors kept for everything else: files, pipes, the SuperLink's state, child processes
FD_WANTED = 65536  # the soft limit is raised towards the hard one up to this many
REFUSED_AT_ONCE = 64  # connections over the limits closed in one ``accept`` before the event loop runs other work
PIPELINED_MOST = 8  # requests a client may send ahead of their answers (an attack queued a million: 2.5 GB)


@dataclass(frozen=True)
class ConnectionLimits:
    """``total`` connections open at once on a listener, ``per_client`` of them from one client address (None: no
    share), ``head_s`` seconds for a TLS handshake and for each request's head; ``own_user_only``: a connection from
    a process of this machine run by another user is refused (``fedseg.flower.peer_user``; module docstring);
    ``stall_s``: seconds an answer may wait, its send buffer full, for the client to read any of it."""

    total: int
    per_client: int | None = None
    head_s: float = HEAD_DEADLINE_S
    own_user_only: bool = False
    stall_s: float = SEND_STALL_S


def fd_budget() -> int:
    """The file descriptors this process may hold: its soft ``RLIMIT_NOFILE``, raised first towards the hard limit
    (up to :data:`FD_WANTED`; a system's default soft limit is often 1,024 for a hard one of 524,288)."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = FD_WANTED if hard == resource.RLIM_INFINITY else min(hard, FD_WANTED)
    if soft != resource.RLIM_INFINITY and soft < wanted:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))
            soft = wanted
        except (ValueError, OSError):
            pass
    return FD_WANTED if soft == resource.RLIM_INFINITY else int(soft)


def listener_limits(budget: int, fleet: bool) -> tuple[ConnectionLimits, ConnectionLimits | None]:
    """``(control address's limits, Fleet listener's or None)`` within ``budget`` file descriptors (:func:`fd_budget`)
    less :data:`FD_RESERVE`: the defaults above where they fit, else shares of what there is (a quarter for the
    control address where there is a Fleet listener), at least 16 connections each."""
    usable = max(32, budget - FD_RESERVE)
    if not fleet:
        return ConnectionLimits(min(CONTROL_CONNECTIONS, usable), own_user_only=True), None
    if CONTROL_CONNECTIONS + FLEET_CONNECTIONS <= usable:
        control, public = CONTROL_CONNECTIONS, FLEET_CONNECTIONS
    else:
        control = max(16, usable // 4)
        public = max(16, usable - control)
    fleet_limits = ConnectionLimits(public, min(FLEET_CONNECTIONS_PER_CLIENT, public))
    return ConnectionLimits(control, own_user_only=True), fleet_limits


class OpenConnections:
    """The connections a listener holds: how many, and how many from each client address; ``refused(text)`` is told
    each connection closed over the limits (the refusal log)."""

    def __init__(self, limits: ConnectionLimits, refused: Callable[[str], None]) -> None:
        self.limits, self.refused = limits, refused
        self.total = 0
        self.by_client: dict[str, int] = {}

    def admit(self, client: str, user: int | None = None, user_known: bool = False) -> bool:
        """Count a connection from ``client`` and say True, or say False (and tell ``refused``) when it would exceed
        the listener's total or the client's share or, where the listener serves its own user only, comes from a
        process of this machine run by ``user``, another user than this process's, or (``user_known``: this system
        can tell, ``peer_user.peer_lookup_works``) from a process whose user cannot be found (``user`` None: a
        socket bound to a device, which an attack used to get past the check, or one closed already)."""
        if self.limits.own_user_only and user is not None and user != os.geteuid():
            self.refused(f"a connection from {client}: a process of user id {user}; only user id {os.geteuid()}'s here")
            return False
        if self.limits.own_user_only and user is None and user_known:
            self.refused(
                f"a connection from {client}: its process's user cannot be found; only user id {os.geteuid()}'s here"
            )
            return False
        mine = self.by_client.get(client, 0)
        if self.total >= self.limits.total:
            self.refused(f"a connection from {client}: the listener holds {self.total} connections, its most")
            return False
        if self.limits.per_client is not None and mine >= self.limits.per_client:
            self.refused(f"a connection from {client}: it holds {mine} connections, the most one address may")
            return False
        self.total += 1
        self.by_client[client] = mine + 1
        return True

    def release(self, client: str) -> None:
        """A connection from ``client`` closed."""
        self.total -= 1
        left = self.by_client.get(client, 0) - 1
        if left > 0:
            self.by_client[client] = left
        else:
            self.by_client.pop(client, None)


class CountedConnection(socket.socket):
    """An accepted connection that gives its place back (``on_close``) once, when it is closed."""

    on_close: Callable[[], None] | None = None

    def close(self) -> None:
        on_close, self.on_close = self.on_close, None
        try:
            super().close()
        finally:
            if on_close is not None:
                on_close()

    def __del__(self) -> None:  # a connection dropped without close still gives its place back
        self.close()


def client_key(host: str) -> str:
    """The client a connection from ``host`` counts against: an IPv4 address (an IPv4-mapped IPv6 one as IPv4), or
    an IPv6 address's /64 network (``2001:db8:0:1::/64``: one host often holds a whole /64, and an attack filled
    the Fleet port from 40 addresses of one)."""
    import ipaddress

    try:
        address = ipaddress.ip_address(host.split("%")[0])
    except ValueError:
        return host
    if isinstance(address, ipaddress.IPv6Address):
        if address.ipv4_mapped is not None:
            return str(address.ipv4_mapped)
        return str(ipaddress.IPv6Network((address, 64), strict=False))
    return str(address)


class LimitedListener(socket.socket):
    """A listening socket whose ``accept`` (the event loop's, for every connection, before any TLS) closes at once
    the connections over ``connections``' limits and returns the others as :class:`CountedConnection`. Under a
    flood it closes :data:`REFUSED_AT_ONCE` connections, then lets the event loop run (``BlockingIOError``: the
    loop calls again while more wait)."""

    connections: OpenConnections
    user_known = False  # whether this system can tell a local peer's user (set where the listener serves its own)

    def accept(self):
        for _ in range(REFUSED_AT_ONCE):
            fd, address = self._accept()
            connection = CountedConnection(self.family, self.type, self.proto, fileno=fd)
            client = client_key(str(address[0])) if isinstance(address, tuple) and address else "?"
            user = local_peer_uid(connection.getsockname(), address) if self.connections.limits.own_user_only else None
            if not self.connections.admit(client, user, self.user_known):
                connection.close()
                continue
            connection.on_close = lambda client=client: self.connections.release(client)
            no_delay(connection)
            return connection, address
        raise BlockingIOError


def no_delay(connection: socket.socket) -> None:
    """Send what the server writes at once (``TCP_NODELAY``), as asyncio does for the connections of a listener it
    creates itself. asyncio's private step (``base_events._set_nodelay``) skipped these while a
    :class:`LimitedListener` was made with protocol 0 (:func:`listening_socket` now says ``IPPROTO_TCP``); fedseg sets
    it here rather than rely on that step. Without it uvicorn's answer, written as two segments (head, then body),
    waits for the client's delayed ACK of the first: ~40 ms added to every request on Linux (measured: 44 ms against
    1.5 ms per request on loopback; 0.5-0.65 s of a 1.1-1.2 s exchange of ``fedseg flower local`` at ``--poll 0.05``,
    about 40 requests on its critical path)."""
    with contextlib.suppress(OSError):  # a connection already reset: uvicorn finds out itself
        connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


class CannotListen(OSError):
    """An address a listener cannot be bound to; its ``strerror`` names it: ``HOST:PORT: why``."""


def listening_socket(host: str, port: int, connections: OpenConnections) -> LimitedListener:
    """A :class:`LimitedListener` bound to ``(host, port)`` (IPv6 where ``host`` has a colon; address reuse on, as
    uvicorn binds), not yet listening (the event loop's ``create_server`` does that). :class:`CannotListen` where the
    address cannot be bound."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    listener = LimitedListener(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    try:
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind((host, port))
    except OSError as e:
        listener.close()
        raise CannotListen(e.errno, f"{host}:{port}: {e.strerror or e}") from None
    listener.connections = connections
    listener.user_known = connections.limits.own_user_only and peer_lookup_works()
    return listener


def head_deadline(base: type, limits: ConnectionLimits, refused: Callable[[str], None]) -> type:
    """A subclass of uvicorn's HTTP protocol ``base`` (``h11`` or ``httptools``) closing a connection that has not
    sent a whole request head within ``limits.head_s`` seconds of being opened (after its TLS handshake) or of its
    last answer (a request being read or served is left to the body limits and the app), or whose client has read
    none of an answer for ``limits.stall_s`` seconds (its send buffer full; an answer's end still in a buffer
    below that mark is waited for while it moves, then for ``head_s`` more). ``refused(text)`` is told of each
    connection so closed."""

    class HeadDeadline(base):
        head_timer: asyncio.TimerHandle | None = None
        pending_before = 0  # bytes of an answer still in the send buffer at the last deadline (none moved since?)

        def connection_made(self, transport) -> None:
            super().connection_made(transport)
            self.await_head()

        def on_response_complete(self) -> None:
            super().on_response_complete()
            if not self.transport.is_closing():
                self.await_head()

        def client_host(self) -> str:
            """The client's address, as a refusal names it."""
            return self.client[0] if self.client else "?"

        def on_headers_complete(self) -> None:
            """httptools' protocol queues each request a client sends before the answers to the earlier ones (its
            ``pipeline``): an attack sent a million at once and the SuperLink held 2.5 GB. More than
            :data:`PIPELINED_MOST` waiting: the connection is closed, and the rest of what it sent not queued."""
            pipeline = getattr(self, "pipeline", None)  # h11's protocol reads no further until it has answered
            if pipeline is not None and len(pipeline) >= PIPELINED_MOST:
                if not self.transport.is_closing():
                    ahead = f"more than {PIPELINED_MOST} requests ahead of their answers"
                    refused(f"a connection from {self.client_host()}: {ahead}")
                    self.transport.abort()
                return
            super().on_headers_complete()

        def connection_lost(self, exc) -> None:
            self.stop_waiting()
            self.stop_stall()
            super().connection_lost(exc)

        # the transport's flow control: paused while its send buffer is over the high-water mark, resumed once the
        # client has read enough of it; paused for limits.stall_s: the client reads nothing
        stall_timer: asyncio.TimerHandle | None = None

        def pause_writing(self) -> None:
            super().pause_writing()
            if self.stall_timer is None:
                self.stall_timer = asyncio.get_running_loop().call_later(limits.stall_s, self.stalled)

        def resume_writing(self) -> None:
            super().resume_writing()
            self.stop_stall()

        def stop_stall(self) -> None:
            if self.stall_timer is not None:
                self.stall_timer.cancel()
                self.stall_timer = None

        def stalled(self) -> None:
            self.stall_timer = None
            refused(f"a connection from {self.client_host()}: read none of its answer for {limits.stall_s:g} s")
            self.transport.abort()

        def await_head(self) -> None:
            self.stop_waiting()
            self.head_timer = asyncio.get_running_loop().call_later(limits.head_s, self.head_late)

        def stop_waiting(self) -> None:
            if self.head_timer is not None:
                self.head_timer.cancel()
                self.head_timer = None

        def head_late(self) -> None:
            self.head_timer = None
            if self.cycle is not None and not self.cycle.response_complete:
                return  # a request is being read or served: its answer arms the deadline again
            pending = self.transport.get_write_buffer_size()  # the end of the last answer, not yet sent
            if pending and pending != self.pending_before:  # still leaving: abort() would drop it
                self.pending_before = pending
                self.await_head()
                return
            why = "read none of its answer for" if pending else "no request head within"
            refused(f"a connection from {self.client_host()}: {why} {limits.head_s:g} s")
            self.transport.abort()  # at once: a TLS close would wait for the client's own close for a while

    HeadDeadline.__name__ = HeadDeadline.__qualname__ = f"HeadDeadline{base.__name__}"
    return HeadDeadline


class HandshakeDeadlineLoop(asyncio.SelectorEventLoop):
    """The event loop of the SuperLink's listeners: a TLS server it creates on a :class:`LimitedListener` gives a
    handshake, and a TLS close (the client's answer to it), that listener's ``head_s`` seconds (asyncio's defaults
    are 60 s and 30 s; uvicorn sets neither)."""

    async def create_server(self, *args, **kwargs):
        sock = kwargs.get("sock")
        if isinstance(sock, LimitedListener) and kwargs.get("ssl") is not None:
            kwargs["ssl_handshake_timeout"] = kwargs["ssl_shutdown_timeout"] = sock.connections.limits.head_s
        return await super().create_server(*args, **kwargs)


def limited_server(app, address: tuple[str, int], limits: ConnectionLimits, refused: Callable[[str], None], **options):
    """A uvicorn server of the ASGI ``app`` on ``address`` (host, port) holding its connections within ``limits``
    (its ``connections``, which :func:`serve_listeners` gives its listening socket) and closing silent ones
    (:func:`head_deadline`); ``refused(text)`` is told of each connection refused or closed; ``options``: more of
    uvicorn's settings (TLS files, log configuration, ``lifespan``, ...)."""
    import uvicorn
    from uvicorn.protocols.http.auto import AutoHTTPProtocol

    server = uvicorn.Server(
        uvicorn.Config(
            app, host=address[0], port=address[1], http=head_deadline(AutoHTTPProtocol, limits, refused), **options
        )
    )
    server.connections = OpenConnections(limits, refused)  # type: ignore[attr-defined]
    return server


# Once the first listener has stopped, the others get OTHERS_GRACE_S seconds to answer what they serve, then are
# stopped without waiting (OTHERS_FORCED_S at most): within the 5 s a coordinator gives its SuperLink to exit before
# SIGKILL (``fedseg.flower.deploy.Processes.stop``). One slow body on the Fleet port, sent by anyone, had held a
# graceful stop for 10 s, so the SuperLink was killed and its secret's folder left behind.
OTHERS_GRACE_S, OTHERS_FORCED_S = 1.0, 2.0


def join_by(threads: list, deadline: float) -> None:
    """Join ``threads`` until ``deadline`` (``time.monotonic()``) at the latest, all of them together."""
    for thread in threads:
        thread.join(max(0.0, deadline - time.monotonic()))


def serve_listeners(servers: list) -> None:
    """Serve every :func:`limited_server` of ``servers`` until a signal stops them all (SIGINT/SIGTERM, as uvicorn
    handles them for the first): the first's lifespan first (for a SuperLink, the one that starts its SuperExec), on
    this thread's event loop, and each of the others, once the first has started, on an event loop of its own in a
    thread of its own (every loop a :class:`HandshakeDeadlineLoop`), so that the connections and TLS handshakes one
    listener is flooded with cannot hold up what the first answers (on one loop, handshakes replayed on the Fleet
    port had slowed the coordinator's control calls from 75 ms to 3.1 s). The app's blocking work runs in the thread
    pool of the loop that called it, as on one loop (Flower's handlers are synchronous; its state takes its own
    locks). One listener that stops, or fails, stops the others; their threads are joined before this returns
    (:data:`OTHERS_GRACE_S` seconds, then :data:`OTHERS_FORCED_S` without waiting for their requests), and an error
    one of them raised is raised here. Each listens on a :func:`listening_socket` bound here: :class:`CannotListen`
    where one cannot be bound, before any serves."""
    import threading

    first, others = servers[0], servers[1:]
    sockets: list[LimitedListener] = []
    threads: list[threading.Thread] = []
    failed: list[BaseException] = []

    def on_own_loop(server, sock: LimitedListener) -> None:
        try:
            with asyncio.Runner(loop_factory=HandshakeDeadlineLoop) as runner:
                runner.run(server._serve([sock]))
        except BaseException as e:  # noqa: BLE001 - raised again by serve_listeners, on its thread
            failed.append(e)
        finally:
            first.should_exit = True  # one listener stopped: every one stops

    def stop_others(force: bool) -> None:
        """Have the others stop; ``force``: without waiting for the requests they are serving (uvicorn's second
        Ctrl-C)."""
        for server in others:
            server.should_exit = True
            server.force_exit = server.force_exit or force

    try:
        for server in servers:
            sockets.append(listening_socket(server.config.host, server.config.port, server.connections))
        stop_first = first.handle_exit

        def handle_exit(sig, frame) -> None:  # a signal stops every listener
            stop_first(sig, frame)
            stop_others(first.force_exit)

        first.handle_exit = handle_exit

        async def start_others() -> None:
            while not first.started and not first.should_exit:
                await asyncio.sleep(0.05)
            if first.should_exit:
                return
            for server, sock in zip(others, sockets[1:]):
                name = f"listener {server.config.host}:{server.config.port}"
                threads.append(threading.Thread(target=on_own_loop, args=(server, sock), name=name, daemon=True))
                threads[-1].start()

        async def every_listener() -> None:
            await asyncio.gather(first.serve([sockets[0]]), start_others())

        try:
            with asyncio.Runner(loop_factory=HandshakeDeadlineLoop) as runner:
                runner.run(every_listener())
        finally:  # the first stopped (a signal, uvicorn raising it again, a failure): the others do too
            stop_others(False)
            join_by(threads, time.monotonic() + OTHERS_GRACE_S)
            if any(thread.is_alive() for thread in threads):  # a request still being served: left unanswered
                stop_others(True)
                join_by(threads, time.monotonic() + OTHERS_FORCED_S)
        if failed:
            raise failed[0]
    finally:
        for sock in sockets:
            sock.close()
