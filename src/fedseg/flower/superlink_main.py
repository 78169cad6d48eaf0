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
  ``--control-address``): every API, for the coordinator's own processes and an operator's SSH tunnel;
- on ``--fleet-address``: only the exact ``(method, path)`` pairs of the Fleet API
  (``fedseg.flower.flwr_internals.fleet_routes``); any other request gets 404 before Flower sees it.

Both use the SuperLink's TLS certificate. SIGINT/SIGTERM stop both (the lifespan stops the SuperExec).

With ``--fleet-gate PATH`` the Fleet API answers 503 Service Unavailable (which a SuperNode retries, quietly) until
the file ``PATH`` exists: the coordinator creates it once it has registered the sites' keys. A hospital whose
SuperNode was already trying to connect got in between: refused as a key never registered ("Failed to activate
SuperNode"), it exited.
"""

from __future__ import annotations

import asyncio
import json
import logging
import sys
from pathlib import Path

FLEET_ONLY = "only the Fleet API (SuperNodes) is served on this address"
NOT_YET = "the coordinator is registering the SuperNodes' keys: retry shortly"


def fleet_only(app, allowed: frozenset[tuple[str, str]], gate: Path | None = None):
    """An ASGI app passing only HTTP requests whose ``(method, path)`` is in ``allowed`` to ``app``; anything
    else (another API's path, a websocket, a lifespan event) gets 404 / is refused without reaching it. With
    ``gate``, an allowed request gets 503 (``NOT_YET``) until that file exists."""
    body = json.dumps({"detail": FLEET_ONLY}).encode()
    not_yet = json.dumps({"detail": NOT_YET}).encode()
    opened = gate is None

    async def answer(send, status: int, text: bytes) -> None:
        headers = [(b"content-type", b"application/json"), (b"content-length", str(len(text)).encode())]
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": text})

    async def filtered(scope, receive, send):
        nonlocal opened
        if scope["type"] == "http" and (scope.get("method", ""), scope.get("path", "")) in allowed:
            if not opened and not (opened := gate is not None and gate.exists()):
                await answer(send, 503, not_yet)
                return
            await app(scope, receive, send)
            return
        if scope["type"] == "http":
            await answer(send, 404, body)
        elif scope["type"] == "websocket":
            await send({"type": "websocket.close", "code": 1008})

    return filtered


def split_option(argv: list[str], option: str) -> tuple[str | None, list[str]]:
    """``(the value of option or None, the other arguments)``."""
    rest, value = [], None
    it = iter(argv)
    for arg in it:
        if arg == option:
            value = next(it, None)
        elif arg.startswith(option + "="):
            value = arg.split("=", 1)[1]
        else:
            rest.append(arg)
    return value, rest


def split_fleet_address(argv: list[str]) -> tuple[tuple[str, int] | None, list[str]]:
    """``((host, port) or None, the other arguments)`` from ``--fleet-address HOST:PORT`` in ``argv``."""
    address, rest = split_option(argv, "--fleet-address")
    if address is None:
        return None, rest
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit():
        raise SystemExit(f"--fleet-address {address!r}: expected HOST:PORT (where SuperNodes connect)")
    return (host.strip("[]"), int(port)), rest


def serve(fleet: tuple[str, int] | None, gate: Path | None = None) -> None:
    """Serve the SuperLink built from ``sys.argv`` on its own address and its Fleet API on ``fleet`` (None: no
    Fleet listener, e.g. a simulation SuperLink), closed (503) until ``gate`` exists if given."""
    import uvicorn

    from fedseg.flower.flwr_internals import fleet_routes, superlink_app, uvicorn_log_config

    app, config = superlink_app()
    tls = {"ssl_keyfile": config.ssl_keyfile, "ssl_certfile": config.ssl_certfile}
    log_config = uvicorn_log_config()
    private = uvicorn.Server(
        uvicorn.Config(app, host=config.host, port=config.port, log_config=log_config, workers=1, **tls)
    )
    if fleet is None:
        private.run()
        return
    public = uvicorn.Server(
        uvicorn.Config(
            fleet_only(app, fleet_routes(), gate),
            host=fleet[0],
            port=fleet[1],
            lifespan="off",
            log_config=log_config,
            **tls,
        )
    )
    stop_private = private.handle_exit

    def handle_exit(sig, frame) -> None:  # a signal stops both servers
        public.should_exit = True
        stop_private(sig, frame)

    private.handle_exit = handle_exit  # type: ignore[method-assign]

    async def both() -> None:
        async def public_after_private() -> None:
            while not private.started and not private.should_exit:  # the lifespan (SuperExec) first
                await asyncio.sleep(0.05)
            if not private.should_exit:
                await public._serve()

        await asyncio.gather(private.serve(), public_after_private())

    asyncio.run(both())
    if not private.started:
        raise SystemExit(f"the SuperLink could not listen on {config.host}:{config.port}")


LIST_RUNS = ("/control/list-runs", "ControlServicer.ListRuns")  # the coordinator's own status polls, as logged


class QuietStatusPolls(logging.Filter):
    """Leaves out the log lines of the coordinator's run-status polls (``list-runs``, several a second while a run
    lasts: ~4 lines a second, most of ``superlink.log``, which grew without bound over a long run)."""

    def filter(self, record: logging.LogRecord) -> bool:
        text = record.getMessage()
        return not any(said in text for said in LIST_RUNS)


def main() -> None:
    gate, rest = split_option(sys.argv[1:], "--fleet-gate")
    fleet, rest = split_fleet_address(rest)
    sys.argv = ["flower-superlink", *rest]
    from flwr.supercore import log

    for name in ("flwr", "uvicorn.access"):
        logging.getLogger(name).addFilter(QuietStatusPolls())

    if fleet is not None:
        log(logging.INFO, "fedseg: Fleet API only on %s:%d; every API on --host/--port", *fleet)
    serve(fleet, Path(gate) if gate else None)


if __name__ == "__main__":
    main()
