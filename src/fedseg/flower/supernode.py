"""One hospital's SuperNode: what ``fedseg flower supernode`` does (``run_supernode``) and its command line
(``supernode_command``, what ``fedseg flower local`` starts per site).

``run_supernode``: checks its data folder with ``data check`` first (a bad
folder fails here, with the data check's message, before anything connects), then runs
Flower's SuperNode with node config ``site=NAME data=ROOT samples=DIR``; TLS to the SuperLink
(``--root-certificates``) and SuperNode authentication (``--auth-supernode-private-key``) as
given. The SuperNode runs in Flower's ``process`` isolation with fedseg's ClientApp runner
(``fedseg.flower.worker``), which runs fedseg's own app only (``fedseg.flower.bundles``: any other
app bundle is refused before any of it runs): ``warm``, every message in one long-lived process,
or ``subprocess``, a new process per message (as Flower's ``subprocess`` isolation, whose
``flwr-clientapp`` would import whatever bundle a run brings).
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
from collections.abc import Callable
from pathlib import Path

from fedseg.data.federation import Federation, FederationError
from fedseg.flower.deploy import BIN, cannot_listen, parse_address, stop_when_child_exits
from fedseg.flower.runtime_secret import drawn_secret, hand_over
from fedseg.folder_lock import holding

ISOLATIONS = ("subprocess", "warm")


SHA256 = re.compile(r"[0-9a-f]{64}")
ALLOW_FAULTS = "allow-faults"  # node config: 'true' where the run's config may inject faults (a test deployment)


def node_config(
    site: str,
    data: Path,
    samples: Path | None,
    state: Path | None = None,
    config_sha256: str | None = None,
    allow_faults: bool = False,
) -> str:
    """Flower node config ``site='..' data='..' samples='..' state='..' config-sha256='..' allow-faults='true'``
    (TOML literal strings)."""
    values = {"site": site, "data": str(Path(data).resolve())}
    if samples is not None:
        values["samples"] = str(Path(samples).resolve())
    if state is not None:
        values["state"] = str(Path(state).resolve())
    if config_sha256 is not None:
        values["config-sha256"] = config_sha256
    if allow_faults:
        values[ALLOW_FAULTS] = "true"
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
    if (why := cannot_listen(host, port)) is not None:
        raise ValueError(
            f"--port {port}: {host}:{port} is in use ({why}; another SuperNode on this machine?): give each "
            "SuperNode on a machine its own --port (its Runtime API listens there)"
        )


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
    config_sha256: str | None = None,
    allow_faults: bool = False,
) -> list[str]:
    """Arguments of Flower's ``flower-supernode`` for one site."""
    argv = [
        "--superlink",
        superlink,
        "--port",
        str(port),
        "--node-config",
        node_config(site, data, samples, state, config_sha256, allow_faults),
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
    cmd = [sys.executable, "-m", "fedseg.flower.worker", "--runtime-api-address", f"127.0.0.1:{port}", "--insecure"]
    cmd += ["--parent-pid", str(os.getpid())]
    cmd += ["--fresh"] if isolation == "subprocess" else []
    return cmd + (["--poll", str(poll)] if poll is not None else [])


def check_private_key(path: Path) -> None:
    """A ValueError unless the site's private key ``path`` is a file only its owner can read or write (as ssh
    refuses its keys; an audit's key of mode 0644 connected without a word)."""
    import stat

    try:
        mode = stat.S_IMODE(path.stat().st_mode)
    except OSError as e:
        raise ValueError(f"--auth-key {path}: cannot be read ({e.strerror or e})") from None
    if os.name == "posix" and mode & 0o077:
        raise ValueError(
            f"--auth-key {path}: other users can read or change it (mode {mode:o}): whoever reads it connects as this "
            f"site; chmod 600 {path}"
        )


CA_FILE_MAX_BYTES = 1 << 20  # a CA bundle is a few kB; a larger "certificate" (/dev/zero) is refused unread


def check_root_certificates(path: Path) -> None:
    """A ValueError in one line unless ``path`` is a regular file of at most ``CA_FILE_MAX_BYTES`` that TLS loads as
    PEM certificates (Flower said "Path argument `--root-certificates` does not point to a file." after the data
    check, naming no file; a file of another kind failed at the first connection, and one with a damaged
    certificate block ended in a wrong message and a SuperNode that never exited; a named pipe or /dev/zero hung or
    filled the memory)."""
    ask = "give the ca.crt the coordinator sent this hospital (`fedseg flower certs` wrote it)"
    if not path.is_file():
        what = "no such file" if not path.exists() else "not a regular file"
        raise ValueError(f"--root-certificates {path}: {what}; {ask}")
    try:
        with path.open("rb") as f:
            text = f.read(CA_FILE_MAX_BYTES + 1)
    except OSError as e:
        raise ValueError(f"--root-certificates {path}: cannot be read ({e.strerror or e}); {ask}") from None
    if len(text) > CA_FILE_MAX_BYTES:
        raise ValueError(f"--root-certificates {path}: over {CA_FILE_MAX_BYTES >> 20} MB, no certificate file; {ask}")
    if b"-----BEGIN CERTIFICATE-----" not in text:
        raise ValueError(f"--root-certificates {path}: not a PEM certificate (no BEGIN CERTIFICATE); {ask}")
    import ssl

    try:
        ssl.create_default_context().load_verify_locations(cadata=text.decode("ascii", "replace"))
    except (ssl.SSLError, ValueError) as e:
        reason = " ".join(str(getattr(e, "reason", None) or e).split())
        raise ValueError(f"--root-certificates {path}: a damaged PEM certificate ({reason}); {ask}") from None


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
    config_sha256: str | None = None,
    allow_faults: bool = False,
    echo: Callable[[str], None] = print,
) -> None:
    """Check the data, then become this site's SuperNode (blocks until it stops). See the module docstring.
    ``state``: folder for the snapshots of the site's state store (needed to resume a run; keep it);
    ``config_sha256``: the agreed configuration's digest (``config_load.config_record``): any other run is refused at
    its data check; ``allow_faults``: a run whose configuration injects faults (``faults``) is not refused (a test
    deployment: ``fedseg flower local``)."""
    if isolation not in ISOLATIONS:
        raise ValueError(f"isolation must be one of {ISOLATIONS}, got {isolation!r}")
    parse_address(superlink, "--superlink", "coordinator.example.org:9092")
    if config_sha256 is not None and not SHA256.fullmatch(config_sha256 := config_sha256.strip().lower()):
        raise ValueError(f"--config-sha256 {config_sha256}: expected 64 hex digits (`fedseg flower config-digest`)")
    if auth_key is not None:
        check_private_key(Path(auth_key))
    if root_certificates is not None:
        check_root_certificates(Path(root_certificates))
    fed = check_site_folder(site, data)
    echo(f"data check passed: site {site} of {fed.name!r}, {len(fed.site(site).cases)} cases in {data}")
    check_port_free(port)
    argv = supernode_argv(
        site,
        data,
        superlink,
        port,
        samples,
        root_certificates,
        insecure,
        auth_key,
        isolation,
        max_wait,
        state,
        config_sha256,
        allow_faults,
    )
    if state is not None:
        Path(state).mkdir(parents=True, exist_ok=True)
        Path(state).chmod(0o700)  # the site's models: its owner's alone (a folder an older fedseg made 0755 too)
    # one SuperNode keeps a --state folder: a second one (a supervisor's restart racing a manual start) would write the
    # same site's snapshots; held until this SuperNode exits
    hint = "wait for that SuperNode to end or stop it, then start this one again"
    with holding(Path(state), hint=hint, keep=False) if state is not None else contextlib.nullcontext():
        become_supernode(site, argv, port, isolation, poll)


def become_supernode(site: str, argv: list[str], port: int, isolation: str, poll: float | None) -> None:
    """``run_supernode``'s last step, its data and options checked: start the ClientApp runner and run Flower's
    SuperNode (``argv``: ``supernode_argv``) in this process until it stops."""
    import subprocess

    os.environ.setdefault("FLWR_TELEMETRY_ENABLED", "0")
    os.environ["FLWR_DISABLE_UPDATE_CHECK"] = "1"
    os.environ["PATH"] = f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}"
    if poll is not None:
        os.environ["FEDSEG_FLOWER_NODE_POLL"] = str(poll)
    from fedseg.flower import supernode_main
    from fedseg.process_exit import discard_at_exit

    # stopped before Flower's exit handlers are in place, the SuperNode leaves its Runtime API server's threads: the
    # process hung at exit, its runner polling it (a test hung so)
    discard_at_exit("supernode-runtime-http-api", "AnyIO worker thread")
    # a second stop signal while Flower exits no longer kills it mid-exit (its --state lock left behind)
    stop = supernode_main.StopSignals().install()
    # only the runner may take the site's tasks from the Runtime API (any local process could): a secret drawn now,
    # read by the SuperNode from a file only this user can read, by the runner from its standard input
    with drawn_secret(SECRET_PURPOSE) as (secret, secret_file):
        runner = subprocess.Popen(runner_command(port, isolation, poll), stdin=subprocess.PIPE)  # noqa: S603 - exits with us (--parent-pid)
        hand_over(runner, secret.hex())
        runner_died = stop_when_child_exits(runner, f"site {site!r}: the ClientApp runner", stopping=stop.stopping)
        sys.argv = ["flower-supernode", *argv, "--superexec-auth-secret-file", str(secret_file)]
        try:
            supernode_main.main()
        except (SystemExit, KeyboardInterrupt):  # Flower exits with 0 on SIGTERM; a supervisor must see the failure
            if runner_died.is_set():
                raise SystemExit(1) from None
            raise


SECRET_PURPOSE = "supernode"  # its secret's temporary folder: fedseg-supernode-<pid>-* (fedseg.flower.runtime_secret)


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
    allow_faults: bool = False,
) -> list[str]:
    """``fedseg flower supernode ...`` as a command line (what ``local`` starts per site, with ``allow_faults``:
    one researcher's test deployment, where a run whose configuration injects faults is not refused)."""
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
    cmd += ["--allow-injected-faults"] if allow_faults else []
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
