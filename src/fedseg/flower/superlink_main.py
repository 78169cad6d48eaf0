"""``python -m fedseg.flower.superlink_main --fleet-address HOST:PORT [flower-superlink args]``: Flower's
SuperLink with its control plane kept off the SuperNodes' port.

flwr 1.41 serves its three HTTP APIs on one address (``--host``/``--port``): the Fleet API (SuperNodes:
register, pull and push messages; SuperNode authentication applies here), the Control API (register
SuperNode keys, start and list runs: unauthenticated in the open-source build; account authentication is
OIDC, an Enterprise-only plugin, ``FLWR_OIDC_ENABLED``) and the Runtime API (the SuperExec and ServerApp,
unauthenticated in ``subprocess`` isolation). On one public port, anyone holding ``ca.crt`` could register
a key of their own and start runs.

Here the same app (one SuperLink state, one lifespan: the SuperExec) is served twice:

- on ``--host``/``--port`` (``flower-superlink``'s own arguments; fedseg passes the loopback
  ``--control-address``): every API, for the coordinator's own processes (the Control API with its key, below);
- on ``--fleet-address``: only the exact ``(method, path)`` pairs of the Fleet API
  (``fedseg.flower.flwr_internals.fleet_routes``); any other request gets 404 before Flower sees it.

Both use the SuperLink's TLS certificate. SIGINT/SIGTERM stop both (the lifespan stops the SuperExec). The control
address is served on the main thread's event loop, with the lifespan; the Fleet listener on an event loop of its own,
in a thread of its own (``fedseg.flower.connection_limits.serve_listeners``): on one loop, TLS handshakes replayed
on the Fleet port (349/s) had slowed the coordinator's control calls from 75 ms to 3.1 s; now its calls wait behind
none of them (``docs/deployment.md``, *Handshake floods*: a median of 12-16 ms against 101-121 ms on one loop, measured
with ``benchmarks/handshake_flood.py``; requests flooding the Fleet port still share the process's CPU). Sharing
the app across two loops is safe as Flower 1.41 builds it: its
handlers and middlewares' blocking work are synchronous, run in each loop's thread pool (as they ran on one loop),
its state (LinkState, ObjectStore) takes its own thread locks, and it holds no asyncio object bound to a loop; the
app's middleware stack is built by the lifespan, before the Fleet listener starts. Each listener has its own body
budget (:func:`body_limited`) and refusal log (:class:`RefusalLog`), each used on that listener's loop only.

The Control API asks for a key on the control address too (:func:`control_guard`): in the open-source build any process
on the coordinator's machine could otherwise list and stop its runs, start runs, and register a SuperNode key of its
own. The coordinator draws a key at each start and gives it on this process's standard input
(``fedseg.flower.superlink.start_superlink``; never in arguments or the environment); a request without it, in the
``fedseg-control-key`` header, gets 401 and Flower never sees it. Only the Runtime API (which the SuperExec's secret and
each task's token protect in a deployment; a simulation SuperLink keeps Flower's own isolation, where a local process of
the researcher's user may take its task), the Fleet API (SuperNode authentication) and ``/health`` answer without the
key: every other path, known or not, needs it; bodies there are read within the Fleet listener's limits too
(:func:`body_limited`, no per-client share: every client there is local). Refusals on either address, fedseg's and
Flower's own, are logged one line per 10 s at most (:class:`RefusalLog`; uvicorn's access line for each is left out,
and its own line for a head it cannot parse counted the same way: :class:`QuietUvicornRefusals`).
Each address holds a bounded number of connections and closes silent ones; on Linux the control address refuses other
users' processes (``fedseg.flower.connection_limits``). A process of the coordinator's own user can still slow or stall
a run (holding the control address's connections, slow bodies filling the budget the coordinator's own calls share); it
cannot read or change it. Flower's own ``flwr`` CLI cannot send the key: ``flwr ls`` / ``flwr stop`` no longer reach a
fedseg coordinator (its console shows the run; Ctrl-C or SIGTERM stops it, ``--resume`` goes on).

Flower reads a request's whole body into memory before it checks who sent it
(``flwr.supercore.protobuf.translation``), so anyone who can reach the port, no key needed, could have the SuperLink
hold bodies of any size (gigabytes: the coordinator's machine out of memory, the study stopped). The Fleet listener
reads each body itself first, within :class:`BodyLimits`: a request carries at most 64 MiB (or four of Flower's array
chunks, ``FLWR_PRIVATE_MAX_ARRAY_CHUNK_SIZE``, where that is more; a SuperNode's largest request is one 5 MB chunk
and its envelope): more is 413 Content Too Large, by its ``Content-Length`` before a byte is read, else once that
many bytes have come; the bodies held at once, over every connection, stay within 512 MiB, and one client address's
within one request's limit (more: 503, which a SuperNode retries); a body that pauses 30 s between two pieces, or
averages less than 64 KiB/s once it has taken 30 s, is 408 (a connection that sends a little and waits, or
trickles a byte now and then, no longer holds its bytes and the budget).

With ``--fleet-gate PATH`` the Fleet API answers 503 Service Unavailable (which a SuperNode retries, quietly) until
the file ``PATH`` exists: the coordinator creates it once it has registered the sites' keys. A hospital whose
SuperNode was already trying to connect got in between: refused as a key never registered ("Failed to activate
SuperNode"), it exited.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, replace
from pathlib import Path

from fedseg.flower.deploy import CONTROL_KEY_HEADER, loopback_if_any, split_option, stop_when_child_exits
from fedseg.flower.runtime_secret import drawn_secret, hand_over, handed_over

FLEET_ONLY = "only the Fleet API (SuperNodes) is served on this address"
NOT_YET = "the coordinator is registering the SuperNodes' keys: retry shortly"
MIN_FLEET_BODY = 64 << 20  # bytes of one Fleet API request at least (module docstring): 12x Flower's 5 MB chunk
FLEET_BUFFERED = 512 << 20  # bytes of request bodies the listener holds at once, over every connection
BODY_IDLE_S = 30.0  # seconds a request body may pause between two of its pieces
BODY_MIN_RATE = 64 << 10  # bytes a second a body must average once it has taken BODY_IDLE_S (a trickle holds bytes)
BUSY = "the SuperLink holds as many request bodies as it takes: retry shortly"
SLOW = f"a request body paused more than {BODY_IDLE_S:g} s, or came slower than {BODY_MIN_RATE >> 10} KiB/s"
NO_KEY = "the Control API answers only the fedseg coordinator that started this SuperLink (its key is missing or wrong)"
WITHOUT_KEY = ("/v1/runtime/", "/v1/fleet/")  # path prefixes answered without the key; and /health (control_guard)
REFUSALS_LOGGED_EVERY_S = 10.0  # seconds: at most one log line of refused requests this often (RefusalLog)


@dataclass(frozen=True)
class BodyLimits:
    """What the Fleet listener buffers (module docstring): ``max_body`` bytes a request (more: 413),
    ``max_buffered`` bytes over every request being read or served at once, and ``max_body`` of them from one client
    address (more: 503, which a SuperNode retries), ``idle_s`` seconds between two pieces of a body, and
    ``min_rate`` bytes a second on average once a body has taken ``idle_s`` (less: 408; a few connections trickling a
    byte now and then held the bytes they had sent, the budget full, every SuperNode answered 503)."""

    max_body: int
    max_buffered: int = FLEET_BUFFERED
    idle_s: float = BODY_IDLE_S
    min_rate: float = BODY_MIN_RATE
    per_client: bool = True  # a client address holds at most max_body at once (False: the control address, all local)

    @classmethod
    def of_environment(cls) -> BodyLimits:
        """The limits for this SuperLink: a request may carry four of the array chunks Flower sends
        (``FLWR_PRIVATE_MAX_ARRAY_CHUNK_SIZE``, 5 MB unless set), at least :data:`MIN_FLEET_BODY`; the bodies held
        at once at least eight such requests."""
        try:
            chunk = int(os.environ.get("FLWR_PRIVATE_MAX_ARRAY_CHUNK_SIZE", "5242880"))
        except ValueError:
            chunk = 5242880
        body = max(MIN_FLEET_BODY, 4 * chunk)
        return cls(body, max(FLEET_BUFFERED, 8 * body))

    @property
    def too_large(self) -> str:
        return f"a request to the SuperLink carries at most {self.max_body / (1 << 20):g} MiB"


class Refused(Exception):
    """A request body not taken: ``status`` and the ``detail`` to answer with."""

    def __init__(self, status: int, detail: str) -> None:
        super().__init__(detail)
        self.status, self.detail = status, detail


async def answer_json(send, status: int, text: bytes, close: bool = False) -> None:
    """Answer an HTTP request with ``status`` and the JSON ``text``; ``close``: end the connection with it (the rest
    of a body left unread)."""
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(text)).encode())]
    if close:
        headers.append((b"connection", b"close"))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": text})


def needs_key(path: str) -> bool:
    """Whether a request for ``path`` on the control address needs the coordinator's key (module docstring): all but
    the Runtime and Fleet APIs' paths and ``/health``, so that a path Flower adds later is closed until looked at."""
    return path != "/health" and not path.startswith(WITHOUT_KEY)


REFUSED_PATH_SHOWN = 200  # characters of a refused request's path in the log line (a path may be 64 KiB long)
REFUSED_DETAIL_SHOWN = 300  # characters of a refusal's own reason (its JSON "detail") in the log line


class RefusalLog:
    """The log of the requests a listener answers with a refusal (:data:`REFUSED_STATUSES`, fedseg's and Flower's
    alike: :func:`refusals_logged`): one line every :data:`REFUSALS_LOGGED_EVERY_S` s at most, naming the latest
    (method, path escaped to one printable line and cut to :data:`REFUSED_PATH_SHOWN` characters, client address,
    status and reason) and the count since the last line, the last of a burst written once the interval is over;
    uvicorn's own access line for those answers is left out (:class:`QuietRefusals`), so a local process, or anyone
    reaching the Fleet port, sending thousands of requests fills no disk (a security test grew the log by 5.5 MB a
    second). ``log(text)``: default Flower's log, WARNING. One per listener: it is used on that listener's event loop
    only (``fedseg.flower.connection_limits.serve_listeners`` gives each listener its own), so it takes no lock."""

    def __init__(self, log=None) -> None:
        if log is None:
            from flwr.common import log as flower_log

            def log(text: str) -> None:
                flower_log(logging.WARNING, "%s", text)

        self.log = log
        self.unlogged = 0  # refusals not yet in a line
        self.latest = ""  # the latest of them, as a line names it
        self.last = float("-inf")  # when the last line was written (the event loop's clock)
        self.pending: asyncio.TimerHandle | None = None  # the line of a burst's end, due at the interval's end

    def note(self, what: str) -> None:
        """Count a refusal (``what``: one printable line naming it, :func:`request_refused`) and write a line if one
        is due, else have one written at the interval's end."""
        self.latest = what
        self.unlogged += 1
        loop = asyncio.get_running_loop()
        wait = self.last + REFUSALS_LOGGED_EVERY_S - loop.time()
        if wait <= 0:
            self.write()
        elif self.pending is None:
            self.pending = loop.call_later(wait, self.write)

    def write(self) -> None:
        """The line of the refusals not yet said (none: nothing)."""
        self.pending = None
        if not self.unlogged:
            return
        more = f" ({self.unlogged - 1} more refused since the last such line)" if self.unlogged > 1 else ""
        self.log(f"{REFUSED} {self.latest}{more}")
        self.unlogged, self.last = 0, asyncio.get_running_loop().time()


def request_refused(scope, why: str) -> str:
    """The refusal of request ``scope`` (``why``: its status and reason) as a :class:`RefusalLog` line names it:
    method, path (escaped to one printable line, cut to :data:`REFUSED_PATH_SHOWN` characters), client address."""
    from fedseg.flower.log_text import printable

    path = printable(str(scope.get("path", "")))
    path = path if len(path) <= REFUSED_PATH_SHOWN else path[:REFUSED_PATH_SHOWN] + "..."
    client = ":".join(str(part) for part in scope.get("client") or ("?",))
    return f"{printable(str(scope.get('method', '?')))} {path} from {client}: {printable(why)}"


REFUSED = "fedseg: refused"  # how each RefusalLog line starts (QuietStatusPolls keeps them)
# the answers counted as refusals (RefusalLog's lines say them; their access lines are left out)
REFUSED_STATUSES = range(400, 600)  # every 4xx and 5xx answer: an attack flooded the log with 412s and 415s


def refusals_logged(app, refusals: RefusalLog):
    """An ASGI app passing every request to ``app`` and noting each HTTP answer with a refusal status
    (:data:`REFUSED_STATUSES`: fedseg's listeners' and Flower's own, e.g. a failed SuperNode authentication) in
    ``refusals``, with its status and its JSON ``detail`` where it has one."""
    from http import HTTPStatus

    async def logged(scope, receive, send):
        if scope["type"] != "http":
            await app(scope, receive, send)
            return
        status = [0]

        async def watched(message) -> None:
            if message["type"] == "http.response.start":
                status[0] = int(message.get("status", 0))
            elif message["type"] == "http.response.body" and status[0] in REFUSED_STATUSES:
                why = f"{status[0]} {HTTPStatus(status[0]).phrase}{detail(message.get('body', b''))}"
                refusals.note(request_refused(scope, why))
                status[0] = 0  # once per answer
            await send(message)

        await app(scope, receive, watched)

    return logged


def detail(body: bytes) -> str:
    """``": <detail>"`` of a JSON answer ``{"detail": ...}`` (cut to :data:`REFUSED_DETAIL_SHOWN` characters), else
    ``""``."""
    try:
        said = json.loads(body[:4096]).get("detail") if body[:1] == b"{" else None
    except (ValueError, AttributeError):
        said = None
    return f": {str(said)[:REFUSED_DETAIL_SHOWN]}" if said else ""


def control_guard(app, key: str):
    """An ASGI app passing to ``app`` the requests that either do not need the key (:func:`needs_key`) or carry
    ``key`` in :data:`fedseg.flower.deploy.CONTROL_KEY_HEADER` (compared in constant time); any other HTTP request
    gets 401 (:data:`NO_KEY`), a websocket is closed, and ``app`` never sees them."""
    expected = key.encode()
    header = CONTROL_KEY_HEADER.encode()
    refusal = json.dumps({"detail": NO_KEY}).encode()

    async def guarded(scope, receive, send):
        if scope["type"] in ("http", "websocket") and needs_key(scope.get("path", "")):
            given = next((value for name, value in scope.get("headers", ()) if name.lower() == header), b"")
            if not hmac.compare_digest(given, expected):
                if scope["type"] == "http":
                    await answer_json(send, 401, refusal, close=True)
                else:
                    await send({"type": "websocket.close", "code": 1008})
                return
        await app(scope, receive, send)

    return guarded


def body_limited(app, limits: BodyLimits):
    """An ASGI app reading each HTTP request's body within ``limits`` (:func:`bounded_body`: beyond them 413, 503 or
    408, ``app`` never called) and handing it to ``app`` whole; it counts among the bodies held until ``app`` has
    answered. Flower reads a whole body before it checks who sent it: on the control address too, a local process
    without any key made the SuperLink hold 1.5 GiB on a Fleet path there (a security test)."""
    held = [0]  # bytes of the bodies being read or served now (one listener's: its one event loop, no lock needed)
    by_client: dict[str, int] = {}  # of those, each client address's

    async def limited(scope, receive, send):
        if scope["type"] != "http":
            await app(scope, receive, send)
            return
        taken = [0]
        client = str((scope.get("client") or ("?",))[0]) if limits.per_client else None
        try:
            content = await bounded_body(scope, receive, limits, held, taken, by_client, client)
            await app(scope, replay(content, receive), send)
        except Refused as refused:
            await answer_json(send, refused.status, json.dumps({"detail": refused.detail}).encode(), close=True)
        except ConnectionClosed:
            pass  # the client left: nobody to answer
        finally:
            held[0] -= taken[0]
            if client is not None and client in by_client:
                by_client[client] -= taken[0]
                if by_client[client] <= 0:
                    del by_client[client]

    return limited


def fleet_only(app, allowed: frozenset[tuple[str, str]], gate: Path | None = None, limits: BodyLimits | None = None):
    """An ASGI app passing only HTTP requests whose ``(method, path)`` is in ``allowed`` to ``app``; anything
    else (another API's path, a websocket, a lifespan event) gets 404 / is refused without reaching it. With
    ``gate``, an allowed request gets 503 (``NOT_YET``) until that file exists. An allowed request's body is read
    here within ``limits`` (default :meth:`BodyLimits.of_environment`; :func:`body_limited`)."""
    body = json.dumps({"detail": FLEET_ONLY}).encode()
    not_yet = json.dumps({"detail": NOT_YET}).encode()
    opened = gate is None
    limited = body_limited(app, limits or BodyLimits.of_environment())

    async def filtered(scope, receive, send):
        nonlocal opened
        if scope["type"] == "http" and (scope.get("method", ""), scope.get("path", "")) in allowed:
            if not opened and not (opened := gate is not None and gate.exists()):
                await answer_json(send, 503, not_yet)
                return
            await limited(scope, receive, send)
            return
        if scope["type"] == "http":
            await answer_json(send, 404, body)
        elif scope["type"] == "websocket":
            await send({"type": "websocket.close", "code": 1008})

    return filtered


class ConnectionClosed(Exception):
    """The client disconnected before its body was read."""


async def bounded_body(
    scope,
    receive,
    limits: BodyLimits,
    held: list[int],
    taken: list[int],
    by_client: dict[str, int],
    client: str | None,
) -> bytes:
    """The body of the HTTP request ``scope``, read from ``receive`` within ``limits``; each piece is added to
    ``held[0]`` (every request's bytes), ``by_client[client]`` (unless ``client`` is None: no per-client limit) and
    ``taken[0]`` (this one's, which the caller gives back). ``Refused`` as soon as it is known to exceed
    ``max_body`` (its ``Content-Length``, else the bytes come so far: 413), the bodies held would exceed
    ``max_buffered``, or the client's ``max_body`` (503), or a piece takes more than ``idle_s`` or the body averages
    less than ``min_rate`` after ``idle_s`` (408); ``ConnectionClosed`` when the client disconnects."""
    too_large = Refused(413, limits.too_large)
    for name, value in scope.get("headers", ()):
        if name.lower() == b"content-length":
            try:
                if int(value) > limits.max_body:
                    raise too_large
            except ValueError:
                raise Refused(400, "Content-Length is no number") from None
    parts: list[bytes] = []
    began = asyncio.get_running_loop().time()
    while True:
        try:
            message = await asyncio.wait_for(receive(), limits.idle_s)
        except TimeoutError:
            raise Refused(408, SLOW) from None
        if message["type"] != "http.request":  # http.disconnect
            raise ConnectionClosed
        part = message.get("body", b"")
        if taken[0] + len(part) > limits.max_body:
            raise too_large
        mine = 0 if client is None else by_client.get(client, 0)
        if held[0] + len(part) > limits.max_buffered or mine + len(part) > limits.max_body:
            raise Refused(503, BUSY)
        elapsed = asyncio.get_running_loop().time() - began
        if elapsed > limits.idle_s and (taken[0] + len(part)) / elapsed < limits.min_rate:
            raise Refused(408, SLOW)
        held[0] += len(part)
        if client is not None:
            by_client[client] = mine + len(part)
        taken[0] += len(part)
        parts.append(part)
        if not message.get("more_body", False):
            return b"".join(parts)


def replay(content: bytes, receive):
    """An ASGI ``receive`` that gives ``content`` as the whole body, then what ``receive`` gives (a disconnect)."""
    sent = False

    async def replayed():
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": content, "more_body": False}
        return await receive()

    return replayed


def split_fleet_address(argv: list[str]) -> tuple[tuple[str, int] | None, list[str]]:
    """``((host, port) or None, the other arguments)`` from ``--fleet-address HOST:PORT`` in ``argv``."""
    address, rest = split_option(argv, "--fleet-address")
    if address is None:
        return None, rest
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit():
        raise SystemExit(f"--fleet-address {address!r}: expected HOST:PORT (where SuperNodes connect)")
    return (host.strip("[]"), int(port)), rest


def serve(fleet: tuple[str, int] | None, control_key: str, gate: Path | None = None) -> None:
    """Serve the SuperLink built from ``sys.argv`` on its own address, its Control API only to requests carrying
    ``control_key`` (:func:`control_guard`), and its Fleet API on ``fleet`` (None: no Fleet listener, e.g. a
    simulation SuperLink), closed (503) until ``gate`` exists if given. Each listener holds a bounded number of
    connections and closes silent ones, and the Fleet listener is served on an event loop and a thread of its own
    (``fedseg.flower.connection_limits``), with its own body budget and refusal log."""
    from flwr.common import log

    from fedseg.flower import connection_limits as limits
    from fedseg.flower.flwr_internals import fleet_routes, superlink_app, uvicorn_log_config

    app, config = superlink_app()
    control_limits, fleet_limits = limits.listener_limits(limits.fd_budget(), fleet is not None)
    uvicorn_options = {
        "ssl_keyfile": config.ssl_keyfile,
        "ssl_certfile": config.ssl_certfile,
        "log_config": uvicorn_log_config(),
        # Flower serves no websocket (both listeners refused each with 403): without uvicorn's websocket protocol a
        # handshake is a plain request, refused (404 on the Fleet port) and counted as any other. Handed to that
        # protocol, a connection kept its head deadline (fedseg.flower.connection_limits), which fired on the closed
        # transport 15 s later: an AttributeError traceback per handshake (0.9 kB), after three INFO lines (163 bytes)
        "ws": "none",
    }
    private_refusals = RefusalLog()
    private = limits.limited_server(
        refusals_logged(
            control_guard(body_limited(app, replace(BodyLimits.of_environment(), per_client=False)), control_key),
            private_refusals,
        ),
        (config.host, config.port),
        control_limits,
        private_refusals.note,
        proxy_headers=False,  # no proxy here: a local process's X-Forwarded-For named another client in the logs
        **uvicorn_options,
    )
    log(logging.INFO, "fedseg: at most %d connections on %s:%d", control_limits.total, config.host, config.port)
    servers = [private]
    if fleet is not None and fleet_limits is not None:
        public_refusals = RefusalLog()
        public = refusals_logged(fleet_only(app, fleet_routes(), gate), public_refusals)
        fleet_server = limits.limited_server(
            public, fleet, fleet_limits, public_refusals.note, lifespan="off", **uvicorn_options
        )
        servers.append(fleet_server)
        log(
            logging.INFO,
            "fedseg: at most %d connections on %s:%d, %d from one address",
            fleet_limits.total,
            *fleet,
            fleet_limits.per_client,
        )
    try:
        limits.serve_listeners(servers)
    except limits.CannotListen as e:
        raise SystemExit(f"the SuperLink could not listen on {e.strerror}") from None
    except OSError as e:  # its TLS files, checked before it started, unreadable now
        where = e.filename or f"{config.ssl_certfile}, {config.ssl_keyfile}"
        raise SystemExit(f"the SuperLink stopped: {where}: {e.strerror or e}") from None
    if not private.started:
        raise SystemExit(f"the SuperLink could not start on {config.host}:{config.port}")


LIST_RUNS = ("/control/list-runs", "ControlServicer.ListRuns")  # the coordinator's own status polls, as logged


class QuietStatusPolls(logging.Filter):
    """Leaves out the log lines of the coordinator's run-status polls (``list-runs``, several a second while a run
    lasts: ~4 lines a second, most of ``superlink.log``, which grew without bound over a long run)."""

    def filter(self, record: logging.LogRecord) -> bool:
        text = record.getMessage()
        return text.startswith(REFUSED) or not any(said in text for said in LIST_RUNS)  # a refusal is kept


ACTIVATION_PATH = "[/v1/fleet/activate-node]"  # its refusals' lines tell the coordinator why (log_watch)
ACTIVATION_LINES_EVERY_S = (20, 10.0)  # at most 20 such lines per 10 s


class QuietFlowerRequestErrors(logging.Filter):
    """Leaves out Flower's ERROR line for each request its HTTP handlers refuse or fail
    (``flwr.supercore.error.http``: ``[PATH][ApiError:CODE] ...``, ``[PATH][UnexpectedError:...] ...``, the
    request's own text in it): each is an answer of :data:`REFUSED_STATUSES`, said by the :class:`RefusalLog` with
    its status and detail, one line per interval (an attack's 60 kB Content-Type grew the log by 17.7 MB/s). The
    refusals to activate a SuperNode are kept, which the coordinator reads to say why a hospital's SuperNode was
    refused (``fedseg.flower.log_watch.ActivationRefusals``), at most :data:`ACTIVATION_LINES_EVERY_S`."""

    def __init__(self) -> None:
        super().__init__()
        self.window_start, self.in_window = float("-inf"), 0

    def filter(self, record: logging.LogRecord) -> bool:
        text = record.getMessage()
        if not (text.startswith("[/") and ("][ApiError:" in text or "][UnexpectedError:" in text)):
            return True
        if not text.startswith(ACTIVATION_PATH):
            return False
        most, every_s = ACTIVATION_LINES_EVERY_S
        now = time.monotonic()
        if now - self.window_start >= every_s:
            self.window_start, self.in_window = now, 0
        self.in_window += 1
        return self.in_window <= most


class QuietRefusals(logging.Filter):
    """Leaves out uvicorn's access lines of the listeners' refusals (:data:`REFUSED_STATUSES`): a
    :class:`RefusalLog` says them, one line per interval (each request's line let a flood fill the disk)."""

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args if isinstance(record.args, tuple) else ()
        return not (len(args) == 5 and args[4] in REFUSED_STATUSES)  # uvicorn: client, method, path, version, status


class QuietStopCancellations(logging.Filter):
    """Leaves out uvicorn's "Exception in ASGI application" of a request cancelled as the SuperLink stops (a listener
    stopped without waiting, ``fedseg.flower.connection_limits.serve_listeners``): one traceback per connection still
    sending a body, up to the listener's 1,024, was no failure of the app."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not (record.exc_info and isinstance(record.exc_info[1], asyncio.CancelledError))


UNPARSED = "Invalid HTTP request received."  # uvicorn's line for a request head it cannot parse (it answers 400)
# uvicorn's lines for a head asking to upgrade the connection (a websocket, h2c), which it then serves as HTTP/1.1:
# the listeners serve no websocket (uvicorn's ``ws="none"``, :func:`serve`)
NOT_UPGRADED = ("Unsupported upgrade request.", "No supported WebSocket library detected.")


class QuietUvicornRefusals(logging.Filter):
    """Leaves out the lines ``uvicorn.error`` writes for each request itself, one a connection for anyone reaching
    the Fleet port (the standard: bad input is one line, not one per request). A head uvicorn cannot parse
    (:data:`UNPARSED`, answered 400 before the app, and so the listener's :class:`RefusalLog`, sees it: 80 bytes of
    log each, 71 kB per 1,000 connections) is counted instead in a :class:`RefusalLog` of the event loop that wrote
    it (each listener has its own loop, ``serve_listeners``), one line per :data:`REFUSALS_LOGGED_EVERY_S` s at most;
    uvicorn names no client there, so neither does that line. A head asking for an upgrade (:data:`NOT_UPGRADED`,
    two lines) is then served as HTTP/1.1: its answer is counted as any other's."""

    def __init__(self) -> None:
        super().__init__()
        self.logs: dict[asyncio.AbstractEventLoop, RefusalLog] = {}  # one per listener's loop, made on first use

    def filter(self, record: logging.LogRecord) -> bool:
        text = str(record.msg)
        if text.startswith(NOT_UPGRADED):
            return False
        if text != UNPARSED:
            return True
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # not on a listener's event loop: said as uvicorn said it
            return True
        refusals = self.logs.get(loop)
        if refusals is None:
            refusals = self.logs[loop] = RefusalLog()
        refusals.note(f"a request: 400 Bad Request: {UNPARSED} (uvicorn could not parse its head)")
        return False


MIN_KEY_CHARACTERS = 32  # of the Control API key on standard input (fedseg draws 64 hexadecimal digits)
NO_KEY_GIVEN = (
    f"fedseg.flower.superlink_main: no Control API key (at least {MIN_KEY_CHARACTERS} printable ASCII characters) on "
    "its standard input: it is started by `fedseg flower server`, `local` or `simulate` "
    "(fedseg.flower.superlink.start_superlink), which give it one"
)


def main() -> None:
    """:func:`serve_superlink`, then end this process with its exit status at once (``os._exit``, after the output is
    flushed and the secret's folder removed): a SIGTERM that uvicorn raised again after its shutdown could reach the
    handler only once the interpreter was waiting for its threads, and an AnyIO worker thread the stopped event loop
    never released kept it waiting for ever (the SuperLink hung on SIGTERM until killed, one start in two)."""
    code = 0
    try:
        serve_superlink()
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else 0 if e.code is None else 1
        if isinstance(e.code, str):
            print(e.code, file=sys.stderr)
    except BaseException:  # noqa: BLE001 - said as Python would, then the same exit status
        import traceback

        traceback.print_exc()
        code = 1
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # a late one changes nothing now
        code = TERMINATED[0] if TERMINATED else code
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


TERMINATED: list[int] = []  # the exit status a SIGTERM chose (serve_superlink), once one came


def serve_superlink() -> None:
    control_key = handed_over()
    if len(control_key) < MIN_KEY_CHARACTERS or not control_key.isascii() or not control_key.isprintable():
        raise SystemExit(NO_KEY_GIVEN)
    gate, rest = split_option(sys.argv[1:], "--fleet-gate")
    fleet, rest = split_fleet_address(rest)
    from flwr.common import log

    for name in ("flwr", "uvicorn.access"):
        logging.getLogger(name).addFilter(QuietStatusPolls())
    logging.getLogger("uvicorn.access").addFilter(QuietRefusals())
    logging.getLogger("uvicorn.error").addFilter(QuietStopCancellations())
    logging.getLogger("uvicorn.error").addFilter(QuietUvicornRefusals())
    logging.getLogger("flwr").addFilter(QuietFlowerRequestErrors())
    if fleet is None:  # a simulation SuperLink (one researcher's machine): Flower's own isolation runs its task
        sys.argv = ["flower-superlink", *rest]
        serve(None, control_key, Path(gate) if gate else None)
        return
    log(logging.INFO, "fedseg: Fleet API only on %s:%d; every API on --host/--port", *fleet)
    runner_died = threading.Event()

    def exit_on_sigterm(signum: int, frame) -> None:
        TERMINATED[:] = [1 if runner_died.is_set() else 128 + signum]  # the runner's death is a failure (supervisor)
        sys.exit(TERMINATED[0])

    # uvicorn stops on SIGTERM, then raises it again with the handler it found: an exit, not a death by the signal,
    # so that the secret's folder is removed (a security test found them left by every SIGTERM)
    signal.signal(signal.SIGTERM, exit_on_sigterm)
    with drawn_secret(SECRET_PURPOSE) as (secret, secret_file):
        sys.argv = [
            "flower-superlink",
            *rest,
            "--isolation",
            "process",
            "--superexec-auth-secret-file",
            str(secret_file),
        ]
        runner = start_serverapp_runner(rest, secret)
        runner_died = stop_when_child_exits(runner, "the coordinator's ServerApp runner")
        serve(fleet, control_key, Path(gate) if gate else None)
        if runner_died.is_set():
            raise SystemExit(1)


SECRET_PURPOSE = "superlink"  # its secret's temporary folder: fedseg-superlink-<pid>-* (fedseg.flower.runtime_secret)


def start_serverapp_runner(argv: list[str], secret: bytes) -> subprocess.Popen:
    """Start ``fedseg.flower.serverapp_runner`` for the SuperLink that ``argv`` (``flower-superlink``'s arguments)
    describes (:func:`runtime_api`), polling every ``FLWR_SUPEREXEC_TASK_POLL_INTERVAL`` s (1 s unless set, as
    Flower's SuperExec); ``secret`` goes on its standard input."""
    from fedseg.flower import serverapp_runner

    try:
        poll = max(0.01, float(os.environ.get("FLWR_SUPEREXEC_TASK_POLL_INTERVAL", "1")))
    except ValueError:
        poll = 1.0
    runner = subprocess.Popen(serverapp_runner.command(*runtime_api(argv), poll), stdin=subprocess.PIPE)  # noqa: S603 - ends with this process (--parent-pid)
    hand_over(runner, secret.hex())
    return runner


def runtime_api(argv: list[str]) -> tuple[str, str | None]:
    """``(HOST:PORT, CA file or None)``: where a process on this machine reaches the Runtime API of the SuperLink that
    ``argv`` (``flower-superlink``'s arguments) describes -- ``--host``/``--port``, 127.0.0.1 for an every-interface
    host -- and the CA certificate it verifies it with (``--ssl-ca-certfile``; None with ``--insecure``)."""
    host, _ = split_option(argv, "--host")
    port, _ = split_option(argv, "--port")
    ca, _ = split_option(argv, "--ssl-ca-certfile")
    return f"{loopback_if_any(host or '127.0.0.1')}:{port or 9091}", None if "--insecure" in argv else ca


if __name__ == "__main__":
    main()
