"""The SuperLink of a deployment: how it listens (``LinkSettings``), its command line (``superlink_command``: Flower's
SuperLink run by ``fedseg.flower.superlink_main``) and starting it (``start_superlink``, a ``RunningLink``: the process
and the key its Control API asks of every call).

``serve_experiment`` (``fedseg.flower.launch``) starts one for every deployment: TLS and ``--enable-supernode-auth`` as
given; in simulation mode (Flower's Simulation Runtime) it has no Fleet API.
"""

from __future__ import annotations

import secrets
import sys
from dataclasses import dataclass, field
from pathlib import Path

from fedseg.flower.certs import TlsFiles
from fedseg.flower.deploy import (
    Processes,
    Started,
    cannot_listen,
    control_client,
    loopback_if_any,
    parse_address,
    wait_for_port,
)
from fedseg.flower.log_watch import log_tail


@dataclass(frozen=True)
class LinkSettings:
    """How the SuperLink listens: SuperNodes reach its Fleet API on ``host:port``; the Control and Runtime
    APIs (register keys, start runs, the ServerApp) answer only on ``control`` (loopback by default;
    ``fedseg.flower.superlink_main``). ``control`` None: the next port on 127.0.0.1."""

    host: str = "127.0.0.1"
    port: int = 9092
    tls: TlsFiles | None = None
    auth: bool = False  # --enable-supernode-auth (needs TLS)
    simulation: bool = False  # --simulation: runs are executed by Flower's Simulation Runtime (virtual SuperNodes)
    control: str | None = None  # HOST:PORT of the Control and Runtime APIs
    # the Fleet API answers 503 until this file exists (fedseg.flower.superlink_main): the coordinator creates it once
    # it has registered the sites' keys, so that a SuperNode already trying to connect is not refused as unregistered
    gate: Path | None = None

    @property
    def address(self) -> str:
        """Where processes on this machine reach the Fleet API."""
        host = "127.0.0.1" if self.host in ("0.0.0.0", "::", "") else self.host
        return f"{host}:{self.port}"

    @property
    def control_address(self) -> str:
        """Where the Control API listens; the coordinator (the only client with its key) reaches it there, or on
        127.0.0.1 for an every-interface address (:attr:`control_dial`)."""
        return self.control or f"127.0.0.1:{self.port + 1}"

    @property
    def control_dial(self) -> str:
        """Where the coordinator connects to the Control API: :attr:`control_address`, with 127.0.0.1 for ``0.0.0.0``
        or ``::`` (no certificate names those: an audit's ``--control-address 0.0.0.0:9093`` ended in a traceback)."""
        host, _, port = self.control_address.rpartition(":")
        return f"{loopback_if_any(host)}:{port}"


def superlink_command(link: LinkSettings) -> list[str]:
    """``fedseg.flower.superlink_main``: Flower's SuperLink with every API on the control address and only the
    Fleet API on ``host:port`` (a simulation SuperLink has no SuperNodes: everything on the control address)."""
    control_host, control_port = parse_address(link.control_address, "--control-address")
    cmd = [sys.executable, "-m", "fedseg.flower.superlink_main"]
    if not link.simulation:
        cmd += ["--fleet-address", f"{link.host}:{link.port}"]
        cmd += ["--fleet-gate", str(Path(link.gate).resolve())] if link.gate is not None else []
    cmd += [
        "--host",
        control_host,
        "--port",
        str(control_port),
        "--disable-runtime-dependency-installation",
    ]
    if link.tls is None:
        if link.auth:
            raise ValueError("SuperNode authentication needs TLS (give certificates, e.g. from `fedseg flower certs`)")
        cmd.append("--insecure")
    else:
        cmd += [
            "--ssl-ca-certfile",
            str(link.tls.ca),
            "--ssl-certfile",
            str(link.tls.cert),
            "--ssl-keyfile",
            str(link.tls.key),
        ]
    if link.auth:
        cmd.append("--enable-supernode-auth")
    if link.simulation:
        cmd.append("--simulation")
    return cmd


def check_certificate(cert: Path, key: Path) -> None:
    """A RuntimeError in one line where ``key`` is not ``cert``'s private key (or either cannot be read): the
    SuperLink died with a 17-line traceback (a security re-test)."""
    import ssl

    try:
        ssl.create_default_context(ssl.Purpose.CLIENT_AUTH).load_cert_chain(str(cert), str(key))
    except (ssl.SSLError, OSError) as e:
        raise RuntimeError(
            f"{cert} with {key}: {getattr(e, 'reason', None) or e} (the key is not this certificate's, or a file "
            "cannot be read): make them together (`fedseg flower certs`)"
        ) from None


CONTROL_KEY_BYTES = 32


@dataclass(frozen=True)
class RunningLink:
    """A started SuperLink: its process (``started``), how it listens (``link``), and the key its Control API asks
    of every call (``control_key``: drawn at each start, given to the SuperLink on its standard input, held in this
    process's memory only; ``fedseg.flower.superlink_main``)."""

    started: Started
    link: LinkSettings
    control_key: str = field(repr=False)

    def control_client(self):
        """A Control API client for this SuperLink (:func:`fedseg.flower.deploy.control_client`) with its key."""
        return control_client(self.link.control_dial, self.link.tls.ca if self.link.tls else None, self.control_key)


def start_superlink(procs: Processes, link: LinkSettings, logs: Path, env: dict, timeout: float = 60) -> RunningLink:
    """Start the SuperLink, with a Control API key drawn now, and wait until it listens on its addresses; an address
    this process cannot listen on is refused first, in one line (a Fleet port in use: the SuperLink died, and the
    coordinator's first call to it ended in a 370-line traceback)."""
    listens = [("the Control API", "--control-address", link.control_address)]
    listens += [] if link.simulation else [("the Fleet API", "--host, --port", f"{link.host}:{link.port}")]
    ports = [parse_address(address, option)[1] for _, option, address in listens]
    if len(set(ports)) < len(ports):
        raise RuntimeError(f"--control-address {link.control_address} and --port {link.port}: one port for both APIs")
    for what, option, address in listens:
        host, port = parse_address(address, option)
        if (why := cannot_listen(host, port)) is not None:
            raise RuntimeError(f"{what} ({option}) cannot listen on {address}: {why}")
    if link.tls is not None:
        check_certificate(link.tls.cert, link.tls.key)
    if link.gate is not None:  # an earlier start's: closed until this start has registered its keys
        Path(link.gate).unlink(missing_ok=True)
    key = secrets.token_hex(CONTROL_KEY_BYTES)
    started = procs.start("superlink", superlink_command(link), logs / "superlink.log", env, secret=key)
    try:
        for address in [link.control_address] if link.simulation else [link.control_address, link.address]:
            host, port = parse_address(address, "address")
            wait_for_port(host, port, timeout, alive=lambda: started.proc.poll() is None, what="the SuperLink")
    except (RuntimeError, TimeoutError) as e:
        raise RuntimeError(f"{e}:\n{log_tail(started.log)}") from None
    return RunningLink(started, link, key)
