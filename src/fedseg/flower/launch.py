"""What ``fedseg flower local | server | supernode`` do.

- ``run_supernode``: one hospital. Checks its data folder with ``data check`` first (a bad
  folder fails here, with the data check's message, before anything connects), then runs
  Flower's SuperNode with node config ``site=NAME data=ROOT samples=DIR``; TLS to the SuperLink
  (``--root-certificates``) and SuperNode authentication (``--auth-supernode-private-key``) as
  given. The SuperNode runs in Flower's ``process`` isolation with fedseg's ClientApp runner
  (``fedseg.flower.worker``), which runs fedseg's own app only (``fedseg.flower.bundles``: any other
  app bundle is refused before any of it runs): ``warm``, every message in one long-lived process,
  or ``subprocess``, a new process per message (as Flower's ``subprocess`` isolation, whose
  ``flwr-clientapp`` would import whatever bundle a run brings).
- ``serve_experiment``: the coordinator. Starts a SuperLink (TLS and ``--enable-supernode-auth``
  as given), registers the SuperNodes' public keys, submits fedseg's app with the run's
  config (``flwr run``), waits for it, and returns; the ServerApp writes the run's outputs.
- ``simulate``: ``serve_experiment`` on a SuperLink in simulation mode (Flower's Simulation Runtime, Ray):
  one virtual SuperNode per site (``fedseg.flower.node.NodeSettings.of``), each ClientApp a Ray actor.
- ``local``: ``serve_experiment`` plus one ``fedseg flower supernode`` process per site on this
  machine (127.0.0.1, free ports). Each site gets a folder holding only its own data (a
  ``federation.yaml`` copy and a link to its site folder) and a ``--state`` folder
  (``OUT/flower/state/<site>``); a built-in federation is written to a folder first.

Resume (``--resume``): the coordinator checkpoints its state every round (``OUT/checkpoints``); each
site keeps the snapshots of its state store in its SuperNode's ``--state`` folder. A resumed run is a
new Flower run with the same run key (``OUT/flower/run-key``): the coordinator restores its checkpoint
and asks every site to restore the snapshot that checkpoint names, then goes on with the next round.

Every process started here is stopped on return, on error and on Ctrl-C / SIGTERM.
"""

from __future__ import annotations

import json
import re
import shutil
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path

import fedseg
from fedseg.config import RunConfig
from fedseg.data.federation import Federation, FederationError
from fedseg.flower.certs import PUBLIC_KEYS, SITE_KEYS, TlsFiles, make_certs
from fedseg.flower.deploy import (
    BIN,
    COORDINATOR_OUT,
    DEFAULT_POLL,
    Processes,
    Started,
    control_client,
    flower_env,
    flower_home,
    free_ports,
    register_node,
    stop_when_child_exits,
    submit_run,
    wait_for_port,
    wait_run,
)
from fedseg.interrupts import terminate_on_signals
from fedseg.run.preflight import check_device, check_out_dir, check_out_kind, check_out_outside

ISOLATIONS = ("subprocess", "warm")
FLOWER_TASK_POLL = 1.0  # flwr's default SuperExec task polling interval (FLWR_SUPEREXEC_TASK_POLL_INTERVAL)


class FlowerRunError(RuntimeError):
    """The Flower run failed; the message is the coordinator's (e.g. a site's data check)."""


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

    @property
    def address(self) -> str:
        """Where processes on this machine reach the Fleet API."""
        host = "127.0.0.1" if self.host in ("0.0.0.0", "::", "") else self.host
        return f"{host}:{self.port}"

    @property
    def control_address(self) -> str:
        """Where the coordinator (and an operator's SSH tunnel) reaches the Control API."""
        return self.control or f"127.0.0.1:{self.port + 1}"


def parse_address(address: str, what: str) -> tuple[str, int]:
    """``(host, port)`` of ``HOST:PORT`` (``[v6]:PORT`` too); a malformed one is a one-line ``ValueError``."""
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"{what} {address!r}: expected HOST:PORT, e.g. 127.0.0.1:9093")
    return host.strip("[]"), int(port)


# --- the SuperLink --------------------------------------------------------------------------------


def superlink_command(link: LinkSettings) -> list[str]:
    """``fedseg.flower.superlink_main``: Flower's SuperLink with every API on the control address and only the
    Fleet API on ``host:port`` (a simulation SuperLink has no SuperNodes: everything on the control address)."""
    control_host, control_port = parse_address(link.control_address, "--control-address")
    cmd = [sys.executable, "-m", "fedseg.flower.superlink_main"]
    if not link.simulation:
        cmd += ["--fleet-address", f"{link.host}:{link.port}"]
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


def start_superlink(procs: Processes, link: LinkSettings, logs: Path, env: dict, timeout: float = 60) -> Started:
    started = procs.start("superlink", superlink_command(link), logs / "superlink.log", env)
    try:
        for address in [link.control_address] if link.simulation else [link.control_address, link.address]:
            host, port = parse_address(address, "address")
            wait_for_port(host, port, timeout, alive=lambda: started.proc.poll() is None, what="the SuperLink")
    except (RuntimeError, TimeoutError) as e:
        raise RuntimeError(f"{e}:\n{log_tail(started.log)}") from None
    return started


def log_tail(path: Path, lines: int = 15) -> str:
    try:
        text = path.read_text(errors="replace").splitlines()
    except OSError:
        return "(no log)"
    return "\n".join("    " + line for line in text[-lines:])


# --- a SuperNode ----------------------------------------------------------------------------------


def node_config(site: str, data: Path, samples: Path | None, state: Path | None = None) -> str:
    """Flower node config ``site='..' data='..' samples='..' state='..'`` (TOML literal strings)."""
    values = {"site": site, "data": str(Path(data).resolve())}
    if samples is not None:
        values["samples"] = str(Path(samples).resolve())
    if state is not None:
        values["state"] = str(Path(state).resolve())
    for key, value in values.items():
        if "'" in value or "\n" in value:
            raise ValueError(f"{key} {value!r}: quotes and newlines cannot be passed in a Flower node config")
    return " ".join(f"{k}='{v}'" for k, v in values.items())


def check_site_folder(site: str, data: Path) -> Federation:
    """``data check`` of a SuperNode's folder (structure and every file); its site must be there."""
    from fedseg.data.check import check_folder

    fed = check_folder(data, all_sites=False)  # a hospital folder: its own site; sites: may name the others
    if site not in fed.site_names:
        raise FederationError(f"{data}: no folder for site {site!r} (site folders here: {', '.join(fed.site_names)})")
    return fed


def check_port_free(port: int, host: str = "127.0.0.1") -> None:
    """Refuse a ``--port`` another process listens on, in one line (Flower's SuperNode stops with "address already in
    use" and "Runtime HTTP API failed to start", which does not say which option to change)."""
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn binds: a port in TIME_WAIT is free
        try:
            probe.bind((host, port))
        except OSError as e:
            raise ValueError(
                f"--port {port}: {host}:{port} is in use ({e.strerror}; another SuperNode on this machine?): give each "
                "SuperNode on a machine its own --port (its Runtime API listens there)"
            ) from None


def supernode_argv(
    site: str,
    data: Path,
    superlink: str,
    port: int,
    samples: Path | None,
    root_certificates: Path | None,
    insecure: bool,
    auth_key: Path | None,
    isolation: str,
    max_wait: float | None,
    state: Path | None = None,
) -> list[str]:
    """Arguments of Flower's ``flower-supernode`` for one site."""
    argv = [
        "--superlink",
        superlink,
        "--port",
        str(port),
        "--node-config",
        node_config(site, data, samples, state),
        "--isolation",
        "process",  # every isolation: fedseg's runner (run_supernode), never Flower's flwr-clientapp
    ]
    if insecure:
        argv.append("--insecure")
    if root_certificates is not None:  # absolute: Flower refuses relative paths
        argv += ["--root-certificates", str(Path(root_certificates).resolve())]
    if auth_key is not None:
        argv += ["--auth-supernode-private-key", str(Path(auth_key).resolve())]
    if max_wait is not None:
        argv += ["--max-wait-time", str(max_wait)]
    return argv


def runner_command(port: int, isolation: str, poll: float | None) -> list[str]:
    """fedseg's ClientApp runner for the SuperNode whose Runtime API is on 127.0.0.1:``port``: it runs fedseg's
    app only, every message in itself (``warm``) or in a new process each (``subprocess``)."""
    import os

    cmd = [sys.executable, "-m", "fedseg.flower.worker", "--runtime-api-address", f"127.0.0.1:{port}", "--insecure"]
    cmd += ["--parent-pid", str(os.getpid())]
    cmd += ["--fresh"] if isolation == "subprocess" else []
    return cmd + (["--poll", str(poll)] if poll is not None else [])


def check_address(address: str, option: str) -> None:
    """A ValueError naming ``option`` unless ``address`` is ``HOST:PORT`` (an IPv6 host in brackets) with a port
    in 1..65535: Flower said so only in its own log, among a screen of others, after starting."""
    host, _, port = address.rpartition(":")
    if not host.strip("[]") or not port.isdigit() or not 1 <= int(port) <= 65535:
        raise ValueError(
            f"{option} {address}: expected HOST:PORT with a port 1-65535 (e.g. coordinator.example.org:9092)"
        )


def run_supernode(
    site: str,
    data: Path,
    superlink: str,
    *,
    port: int = 9094,
    samples: Path | None = None,
    root_certificates: Path | None = None,
    insecure: bool = False,
    auth_key: Path | None = None,
    isolation: str = "subprocess",
    poll: float | None = None,
    max_wait: float | None = None,
    state: Path | None = None,
    echo: Callable[[str], None] = print,
) -> None:
    """Check the data, then become this site's SuperNode (blocks until it stops). See the module docstring.
    ``state``: folder for the snapshots of the site's state store (needed to resume a run; keep it)."""
    import os
    import subprocess

    if isolation not in ISOLATIONS:
        raise ValueError(f"isolation must be one of {ISOLATIONS}, got {isolation!r}")
    check_address(superlink, "--superlink")
    fed = check_site_folder(site, data)
    echo(f"data check passed: site {site} of {fed.name!r}, {len(fed.site(site).cases)} cases in {data}")
    check_port_free(port)
    argv = supernode_argv(
        site, data, superlink, port, samples, root_certificates, insecure, auth_key, isolation, max_wait, state
    )
    os.environ.setdefault("FLWR_TELEMETRY_ENABLED", "0")
    os.environ["FLWR_DISABLE_UPDATE_CHECK"] = "1"
    os.environ["PATH"] = f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}"
    if poll is not None:
        os.environ["FEDSEG_FLOWER_NODE_POLL"] = str(poll)
    runner = subprocess.Popen(runner_command(port, isolation, poll))  # noqa: S603 - exits with this process (--parent-pid)
    runner_died = stop_when_child_exits(runner, f"site {site!r}: the ClientApp runner")
    from fedseg.flower import supernode_main

    sys.argv = ["flower-supernode", *argv]
    try:
        supernode_main.main()
    except SystemExit:  # Flower exits with 0 on SIGTERM; a supervisor must see the failure
        if runner_died.is_set():
            raise SystemExit(1) from None
        raise


def supernode_command(
    site: str,
    data: Path,
    superlink: str,
    port: int,
    samples: Path | None,
    root_certificates: Path | None,
    auth_key: Path | None,
    isolation: str,
    poll: float | None,
    state: Path | None = None,
) -> list[str]:
    """``fedseg flower supernode ...`` as a command line (what ``local`` starts per site)."""
    cmd = [
        sys.executable,
        "-m",
        "fedseg.cli",
        "flower",
        "supernode",
        "--site",
        site,
        "--data",
        str(data),
        "--superlink",
        superlink,
        "--port",
        str(port),
        "--isolation",
        isolation,
    ]
    if samples is not None:
        cmd += ["--samples", str(samples)]
    cmd += ["--root-certificates", str(root_certificates)] if root_certificates is not None else ["--insecure"]
    if auth_key is not None:
        cmd += ["--auth-key", str(auth_key)]
    if poll is not None:
        cmd += ["--poll", str(poll)]
    if state is not None:
        cmd += ["--state", str(state)]
    return cmd


# --- the experiment -------------------------------------------------------------------------------


def run_config(
    cfg: RunConfig, fed: Federation, wait: float, poll: float, resume: bool = False, run_key: str = ""
) -> dict:
    """The run config fedseg's ServerApp reads (``fedseg.flower.server``); every site receives it too, so it holds
    nothing of the coordinator's machine (its output folder travels in the ServerApp's environment)."""
    from fedseg.flower.server import federation_record

    return {
        "fedseg-config": cfg.model_dump_json(),
        "fedseg-federation": federation_record(fed),
        "fedseg-wait": float(wait),
        "fedseg-poll": float(poll),
        "fedseg-version": fedseg.__version__,
        "fedseg-resume": bool(resume),
        "fedseg-run-key": run_key,
    }


def run_key(out: Path, resume: bool) -> str:
    """The experiment's name for the sites' snapshot folders: ``OUT/flower/run-key``, kept by a resume, new (a
    random id: it travels to every site, which need not learn the coordinator's folders) for a new run, so a reused
    ``--state`` folder never mixes two runs."""
    import uuid

    from fedseg.atomic_files import atomic_write_text

    path = Path(out) / "flower" / "run-key"
    if resume and path.is_file() and path.read_text().strip():
        return path.read_text().strip()
    key = uuid.uuid4().hex
    atomic_write_text(path, key + "\n")
    return key


PROTECTION_FILE = "protection.json"  # OUT/flower/: the TLS and SuperNode authentication a run started with


def keep_protection(out: Path, link: LinkSettings, resume: bool) -> None:
    """A run's coordinator keeps the protection it started with: ``OUT/flower/protection.json`` records TLS and
    SuperNode authentication at the first start; a resume without one of them is refused (a coordinator restarted
    without ``--auth-keys`` ran unauthenticated without a word: any SuperNode could then claim a site)."""
    from fedseg.atomic_files import atomic_write_text

    path = Path(out) / "flower" / PROTECTION_FILE
    now = {"tls": bool(link.tls), "auth": bool(link.auth)}
    if resume and path.is_file():
        try:
            started = json.loads(path.read_text())
        except (OSError, ValueError):
            started = {}
        lost = [
            flag
            for key, flag in (("tls", "TLS (--certs)"), ("auth", "SuperNode authentication (--auth-keys)"))
            if started.get(key) and not now[key]
        ]
        if lost:
            raise FlowerRunError(
                f"{out}: this run started with {' and '.join(lost)}; resume it with the flags it was started with "
                "(without them any SuperNode could claim a site)"
            )
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, json.dumps(now) + "\n")


def check_new_or_resumed(out: Path, resume: bool, data: str | None) -> None:
    """A coordinator's ``--out``: a new run needs a folder without checkpoints; ``--resume`` continues one; a study's,
    bench's or federation's folder, or one inside the federation folder ``data`` (``data.root``), is refused either
    way, before any Flower process starts or a site's folder is written."""
    check_out_dir(out)
    check_out_kind(out, "run")
    check_out_outside(out, data)
    if (out / "checkpoints").exists() and not resume:
        raise FileExistsError(f"{out}: already holds a run; use --resume to continue it or choose another --out")


LOG_LINE = re.compile(r"^\d{4}-\d\d-\d\d \S+ (DEBUG|INFO|WARNING|ERROR|CRITICAL) \S+: (.*)$")  # server.log format


class LogTail:
    """Lines appended to a file since the last call."""

    def __init__(self, path: Path):
        self.path, self.offset = path, 0

    def new_lines(self) -> list[str]:
        try:
            with open(self.path, "rb") as f:
                f.seek(self.offset)
                data = f.read()
        except OSError:
            return []
        end = data.rfind(b"\n") + 1
        self.offset += end
        return data[:end].decode(errors="replace").splitlines()


ACTIVATION_REFUSED = re.compile(  # superlink.log: a refused activation, with the public key and the cause
    r"activate-node\]\[ApiError:\d+\] .*public key: (.*?), exception: (.*)$"
)
NODE_ALREADY_ON = re.compile(r"SuperNode with node ID (\d+) could not be activated")
KEY_UNKNOWN = "No SuperNode found with the given public key"


class ActivationRefusals:
    """The SuperLink's refusals to activate a SuperNode, from its log (from ``offset``: the bytes an earlier
    coordinator in the same ``--out`` wrote), as one console line each: the SuperNode is told only "Failed to activate
    SuperNode" (``fedseg.flower.supernode_main.ExplainActivation``); the coordinator says which cause it was and, for
    a registered key, whose. Each node (registered key) or unregistered key is said once (a SuperNode restarted
    every few seconds by systemd is refused as often); another cause is said as the SuperLink gives it."""

    def __init__(self, log: Path, node_sites: dict[str, str], offset: int = 0) -> None:
        self.tail, self.node_sites, self.said = LogTail(log), node_sites, set[str]()
        self.tail.offset = offset

    def new_lines(self) -> list[str]:
        lines = []
        for line in self.tail.new_lines():
            if not (m := ACTIVATION_REFUSED.search(line)):
                continue
            key, cause = m.group(1), m.group(2).strip().rstrip(".")
            if already := NODE_ALREADY_ON.search(cause):
                node = already.group(1)
                site = self.node_sites.get(node)
                whose = f"site {site!r}'s key" if site else "a registered key"
                said = (
                    f"a SuperNode with {whose} (node id {node}) was refused: the SuperNode of that key is connected "
                    "(a second process with its key?), or stopped without saying goodbye less than a minute ago "
                    "(the SuperLink counts it online until then: it may start again after that)"
                )
                key = node
            elif cause == KEY_UNKNOWN:
                said = f"a SuperNode whose key is not registered (--auth-keys) was refused: {cause}"
            else:
                said = f"the SuperLink refused to activate a SuperNode: {cause}"
                key = cause
            if key not in self.said:
                self.said.add(key)
                lines.append(said)
        return lines


def serve_experiment(
    cfg: RunConfig,
    fed: Federation,
    out: Path,
    link: LinkSettings,
    procs: Processes,
    env: dict,
    *,
    register: dict[str, Path] | None = None,
    start_nodes: Callable[[], dict[str, Started]] | None = None,
    wait: float = 600,
    poll: float = DEFAULT_POLL,
    resume: bool = False,
    simulation: dict | None = None,
    echo: Callable[[str], None] = print,
) -> None:
    """Start the SuperLink, register keys, (start local nodes,) submit the run and wait for it to finish.
    ``simulation``: run on Flower's Simulation Runtime (``submit_run``; the SuperLink has ``--simulation``).

    Raises ``FlowerRunError`` with the coordinator's message if the run fails, or naming the
    SuperNode that died and its log if one of ours exits first (under ``fl.on_failure = skip`` a
    SuperNode that exits is reported and the run goes on without its site)."""
    from fedseg.flower.apps import build_fab

    out = Path(out).resolve()
    logs = out / "flower" / "logs"
    keep_protection(out, link, resume)
    link_log = logs / "superlink.log"  # appended to by each start in this --out: only this one's lines are read
    link_log_start = link_log.stat().st_size if link_log.is_file() else 0
    link_proc = start_superlink(procs, link, logs, env)
    fleet = "no Fleet API (simulation)" if link.simulation else f"Fleet API (SuperNodes) on {link.host}:{link.port}"
    echo(
        f"SuperLink: {fleet} ({'TLS' if link.tls else 'insecure'}"
        f"{', SuperNode authentication' if link.auth else ''}); Control API on {link.control_address} only"
    )
    client = control_client(link.control_address, link.tls.ca if link.tls else None)
    try:
        node_sites = {}  # node id -> site: with authentication, a node's site is that of its key
        for name, key in (register or {}).items():
            node_id = register_node(client, key, name)
            node_sites[str(node_id)] = name
            echo(f"registered SuperNode key {key.name} ({name}): node id {node_id}")
        nodes = start_nodes() if start_nodes else {}
        for stale in ("server.log", "error.txt"):  # left by an earlier attempt in the same --out
            (out / "flower" / stale).unlink(missing_ok=True)
        config = run_config(cfg, fed, wait, poll, resume, run_key(out, resume))
        if node_sites:
            config["fedseg-node-sites"] = json.dumps(node_sites)
        if simulation is not None:
            config["fedseg-simulation"] = json.dumps(simulation.pop("fedseg"))
        run_id = submit_run(client, build_fab(), config, simulation)
        echo(f"run {run_id} submitted; sites: {', '.join(fed.site_names)}")
        tail, last_observe = LogTail(out / "flower" / "server.log"), 0.0
        refusals = ActivationRefusals(link_proc.log, node_sites, link_log_start)
        showing = False  # whether the last log record was shown: its continuation lines are shown too

        def show_progress() -> None:
            nonlocal showing
            for line in tail.new_lines():
                if m := LOG_LINE.match(line):
                    showing = m.group(1) != "ERROR"  # errors (and their tracebacks) end in error.txt, printed once
                    if showing:
                        echo(m.group(2))
                elif showing and line.strip():  # a message of several lines (a site's reason under its own)
                    echo(f"  {line.strip()}")

        def tick() -> None:
            nonlocal last_observe
            show_progress()
            for line in refusals.new_lines():
                echo(line)
            if time.monotonic() - last_observe > 1.0:
                procs.observe()
                last_observe = time.monotonic()
            if link_proc.proc.poll() is not None:
                raise FlowerRunError(
                    f"the SuperLink exited (code {link_proc.proc.returncode}):\n{log_tail(link_proc.log)}"
                )
            for site, node in list(nodes.items()):
                if node.proc.poll() is not None:
                    said = f"the SuperNode of site {site!r} exited (code {node.proc.returncode})"
                    if cfg.fl.on_failure != "skip":
                        raise FlowerRunError(f"{said}:\n{log_tail(node.log)}")
                    echo(f"{said}; fl.on_failure = skip: the run goes on without it")
                    del nodes[site]

        status = wait_run(client, run_id, poll=0.25, tick=tick)
        show_progress()
        if status.sub_status != "completed":
            error = out / "flower" / "error.txt"
            reason = error.read_text() if error.is_file() else status.details or status.sub_status
            raise FlowerRunError(f"the Flower run {status.sub_status}: {reason}")
    finally:
        client.close()


def federation_folder(cfg: RunConfig, work: Path) -> tuple[Path, Federation]:
    """The run's federation as a checked folder: ``data.root``, or the built-in (or registered) one written
    under ``work``."""
    from fedseg.data.check import check_folder

    if cfg.data.source == "folder" or cfg.data.root:
        if not cfg.data.root:
            raise ValueError("data.source is 'folder' but data.root is not set (use --data ROOT)")
        root = Path(cfg.data.root).resolve()
    else:
        from fedseg.data.folder import write_folder
        from fedseg.data.sources import build_federation

        root = write_folder(build_federation(cfg), work / "federation", overwrite=True).resolve()
    return root, check_folder(root, cfg.data.split, cfg.data.seed)


def site_views(root: Path, fed: Federation, folder: Path) -> dict[str, Path]:
    """Per site, a folder federation holding only that site: ``federation.yaml`` + a link to ``root/<site>``."""
    views = {}
    for site in fed.site_names:
        view = folder / site
        if view.exists():
            shutil.rmtree(view)
        view.mkdir(parents=True)
        shutil.copy(root / "federation.yaml", view / "federation.yaml")
        (view / site).symlink_to(root / site, target_is_directory=True)
        views[site] = view
    return views


def sites_on_this_machine(
    cfg: RunConfig, out: Path, resume: bool
) -> tuple[RunConfig, Path, Federation, dict[str, Path]]:
    """For ``local`` and ``simulate`` (every site computes here): check the device and ``out``, write the
    federation to a checked folder and one folder per site holding only its data (``site_views``); returns
    the config reading that folder, the resolved ``out``, the federation and the site folders."""
    check_device(cfg.device)
    out = Path(out).resolve()
    check_new_or_resumed(out, resume, cfg.data.root)
    root, fed = federation_folder(cfg, out / "flower")
    cfg = cfg.model_copy(update={"data": cfg.data.model_copy(update={"source": "folder", "root": str(root)})})
    return cfg, out, fed, site_views(root, fed, out / "flower" / "sites")


@contextmanager
def deployment(work: Path) -> Iterator[Processes]:
    """A deployment's processes in ``work`` (stopped on the way out, also on SIGTERM / SIGHUP), Flower's CLI state in
    ``work/home``, which every process it starts inherits as its FLWR_HOME (how ``Processes`` finds them all)."""
    with terminate_on_signals(), flower_home(work / "home"), Processes(work / "processes.json", work / "home") as procs:
        yield procs


def waits(poll: float) -> tuple[float | None, float]:
    """``(SuperNode poll or None = Flower's, SuperExec task poll)`` for ``--poll`` (0 = Flower's defaults)."""
    return (poll, poll) if poll > 0 else (None, FLOWER_TASK_POLL)


def local(
    cfg: RunConfig,
    out: Path,
    *,
    tls: bool = False,
    isolation: str = "warm",
    poll: float = DEFAULT_POLL,
    wait: float = 300,
    resume: bool = False,
    echo: Callable[[str], None] = print,
) -> Path:
    """Run ``cfg`` on a Flower deployment on this machine; the same outputs as ``fedseg run`` in ``out``.

    ``poll`` > 0 shortens every wait inside Flower to that many seconds (``fedseg.flower.flwr_internals``);
    0 keeps Flower's defaults. ``resume``: continue the run in ``out`` from its last checkpoint (the sites'
    snapshots are in ``out/flower/state``)."""
    from fedseg.flower.server import check_run

    check_run(cfg)
    if isolation not in ISOLATIONS:
        raise ValueError(f"isolation must be one of {ISOLATIONS}, got {isolation!r}")
    cfg, out, fed, views = sites_on_this_machine(cfg, out, resume)
    work = out / "flower"
    link_port, control_port, *node_ports = free_ports(2 + len(fed.site_names))
    certs = make_certs(work / "certs", nodes=fed.site_names) if tls else None
    link = LinkSettings("127.0.0.1", link_port, certs, auth=tls, control=f"127.0.0.1:{control_port}")
    node_poll, task_poll = waits(poll)
    env = flower_env(work / "home", task_poll, {COORDINATOR_OUT: str(out)})
    keys = work / "certs" / SITE_KEYS  # <site>.key stays with the site, supernodes/<site>.pub is registered

    def start_nodes() -> dict[str, Started]:
        return {
            site: procs.start(
                f"supernode-{site}",
                supernode_command(
                    site,
                    views[site],
                    link.address,
                    port,
                    out / "samples",
                    certs.ca if certs else None,
                    keys / f"{site}.key" if tls else None,
                    isolation,
                    node_poll,
                    work / "state" / site,
                ),
                work / "logs" / f"supernode-{site}.log",
                env,
            )
            for site, port in zip(fed.site_names, node_ports)
        }

    with deployment(work) as procs:
        serve_experiment(
            cfg,
            fed,
            out,
            link,
            procs,
            env,
            register={s: work / "certs" / PUBLIC_KEYS / f"{s}.pub" for s in fed.site_names} if tls else None,
            start_nodes=start_nodes,
            wait=wait,
            poll=poll,
            resume=resume,
            echo=echo,
        )
    return out


def server(
    cfg: RunConfig,
    fed: Federation,
    out: Path,
    link: LinkSettings,
    *,
    auth_keys: dict[str, Path] | None = None,
    poll: float = DEFAULT_POLL,
    wait: float = 600,
    resume: bool = False,
    echo: Callable[[str], None] = print,
) -> Path:
    """The coordinator of a multi-machine deployment (SuperNodes started by the hospitals); ``poll``: the
    coordinator's waits inside Flower (SuperExec, ServerApp; 0 = Flower's defaults). ``resume``: continue
    the run in ``out``; every SuperNode must have been started with ``--state DIR`` and be restarted with
    the same folder."""
    from fedseg.flower.server import check_run

    check_run(cfg)
    out = Path(out).resolve()
    check_new_or_resumed(out, resume, cfg.data.root)
    work = out / "flower"
    env = flower_env(work / "home", waits(poll)[1], {COORDINATOR_OUT: str(out)})
    link = replace(link, auth=link.auth or bool(auth_keys))
    echo(
        f"hospitals start: fedseg flower supernode --site NAME --data ROOT --superlink <this host>:{link.port}"
        + (" --root-certificates ca.crt" if link.tls else " --insecure")
        + (" --auth-key NAME.key" if link.auth else "")
        + " --state DIR (a folder the site keeps: needed to resume the run)"
    )
    with deployment(work) as procs:
        serve_experiment(
            cfg, fed, out, link, procs, env, register=auth_keys, wait=wait, poll=poll, resume=resume, echo=echo
        )
    return out


def simulate(
    cfg: RunConfig,
    out: Path,
    *,
    cpus_per_site: int = 1,
    gpus_per_site: float = 0.0,
    ray_address: str | None = None,
    poll: float = DEFAULT_POLL,
    wait: float = 300,
    resume: bool = False,
    echo: Callable[[str], None] = print,
) -> Path:
    """Run ``cfg`` on Flower's Simulation Runtime (Ray): a SuperLink with ``--simulation`` runs fedseg's app with
    one virtual SuperNode per site, each ClientApp a Ray actor with ``cpus_per_site`` CPUs and ``gpus_per_site``
    of a GPU; ``ray_address``: an existing Ray cluster to spread them over (``RAY_ADDRESS``; its machines need
    fedseg and this run's folders at the same paths). The same outputs as ``fedseg run`` in ``out``; sites keep
    their snapshots in ``out/flower/state/<site>`` (``resume``)."""
    import importlib.util

    from fedseg.flower.server import check_run

    check_run(cfg)
    if importlib.util.find_spec("ray") is None:
        raise ValueError(
            "Flower's Simulation Runtime needs Ray: pip install 'fedseg[simulation]' (flwr[simulation], ray 2.55.1)"
        )
    cfg, out, fed, _ = sites_on_this_machine(cfg, out, resume)
    work = out / "flower"
    (control_port,) = free_ports(1)
    link = LinkSettings("127.0.0.1", 0, simulation=True, control=f"127.0.0.1:{control_port}")
    env = flower_env(
        work / "home",
        waits(poll)[1],
        {COORDINATOR_OUT: str(out), **({"RAY_ADDRESS": ray_address} if ray_address else {})},
    )
    simulation = {
        "num_supernodes": len(fed.site_names),
        "client_resources_num_cpus": cpus_per_site,
        "client_resources_num_gpus": gpus_per_site,
        "fedseg": {"data": str(work / "sites"), "samples": str(out / "samples"), "state": str(work / "state")},
    }
    with deployment(work) as procs:
        serve_experiment(
            cfg,
            fed,
            out,
            link,
            procs,
            env,
            wait=wait,
            poll=poll,
            resume=resume,
            simulation=simulation,
            echo=echo,
        )
    return out
