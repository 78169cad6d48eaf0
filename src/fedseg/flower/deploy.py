"""Start, talk to and stop the Flower processes of a deployment (SuperLink, SuperNodes).

- ``flower_env``: the environment every Flower process gets: the venv's ``bin`` first on PATH
  (Flower launches ``flower-superexec`` / ``flwr-serverapp`` / ``flwr-clientapp`` by name),
  a private ``FLWR_HOME``, telemetry and update checks off (unless the caller set
  ``FLWR_TELEMETRY_ENABLED`` itself), per-run dependency installation off, and the SuperExec's
  task polling interval.
- ``Processes``: every process started, each in its own process group; ``stop()`` terminates
  them and every descendant (found through ``/proc`` before anything is killed, so
  grandchildren re-parented to init are not missed), SIGKILLs what is left after a grace period,
  and writes the PIDs to a JSON file.
- Control API (what ``flwr run`` / ``flwr supernode register`` do): ``control_client``,
  ``register_node``, ``submit_run``, ``wait_run`` (which polls on through a minute of failed polls: a SuperLink
  not answering for a moment); every call carries the coordinator's key
  (:data:`CONTROL_KEY_HEADER`, checked by ``fedseg.flower.superlink_main``). What they take from Flower's
  internals is in ``fedseg.flower.flwr_internals``.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from fedseg.atomic_files import atomic_write_text
from fedseg.engine.forkserver import die_with_parent
from fedseg.flower.runtime_secret import hand_over
from fedseg.interrupts import is_running

BIN = Path(sys.executable).parent
# Waits inside Flower with --poll (fedseg.flower.flwr_internals). Measured on 2 busy cores with 6 sites
# (benchmarks/flower_overhead.py): 0.05 s made a dozen processes poll 20x a second each and
# slowed the SuperLink more than it saved; 0.2 s keeps most of the gain over Flower's 3 s / 1 s.
DEFAULT_POLL = 0.2  # here, not in launch: `fedseg flower --help` needs it without launch's imports


LAUNCHER_PID = "FEDSEG_LAUNCHER_PID"  # PID:start time of the fedseg process that started a deployment
COORDINATOR_OUT = "FEDSEG_OUT"  # the run's output folder, for the coordinator's ServerApp (never sent to the sites)
SUBMITTED_RUN = "submitted-run"  # OUT/flower/: the id of the run the coordinator submitted, the only one it serves


def submitted_run(out: Path) -> int | None:
    """The id of the run the coordinator submitted last for ``out`` (``OUT/flower/submitted-run``, written once the
    SuperLink has taken it, removed before each submission); None where there is none yet."""
    try:
        return int((Path(out) / "flower" / SUBMITTED_RUN).read_text().strip())
    except (OSError, ValueError):
        return None


def flower_env(home: Path, task_poll: float = 0.1, extra: dict | None = None) -> dict[str, str]:
    """Environment for Flower processes (see the module docstring); ``LAUNCHER_PID`` names this process, with which
    the ServerApp that Flower's SuperExec starts out of this process's reach stops (``server.stop_with_launcher``)."""
    from fedseg.interrupts import start_time

    env = dict(os.environ)
    env[LAUNCHER_PID] = f"{os.getpid()}:{start_time(os.getpid()) or ''}"
    env["PATH"] = f"{BIN}{os.pathsep}{env.get('PATH', '')}"
    env["FLWR_HOME"] = str(home)
    env.setdefault("FLWR_TELEMETRY_ENABLED", "0")
    env["FLWR_DISABLE_UPDATE_CHECK"] = "1"
    env["FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION"] = "1"
    env["FLWR_SUPEREXEC_TASK_POLL_INTERVAL"] = str(task_poll)
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra or {})
    home.mkdir(parents=True, exist_ok=True)
    return env


@contextlib.contextmanager
def flower_home(home: Path):
    """This process's Flower CLI state (credential store) in ``home``, not in ``~/.flwr``; telemetry off."""
    saved = {k: os.environ.get(k) for k in ("FLWR_HOME", "FLWR_TELEMETRY_ENABLED", "FLWR_DISABLE_UPDATE_CHECK")}
    home.mkdir(parents=True, exist_ok=True)
    os.environ["FLWR_HOME"] = str(home)
    os.environ.setdefault("FLWR_TELEMETRY_ENABLED", "0")
    os.environ["FLWR_DISABLE_UPDATE_CHECK"] = "1"
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def parse_address(address: str, option: str, example: str = "127.0.0.1:9093") -> tuple[str, int]:
    """``(host, port)`` of ``HOST:PORT`` (``[v6]:PORT`` too); a one-line ValueError naming ``option`` (with an
    ``example`` of it) otherwise (Flower said so only in its own log, among a screen of others, after starting)."""
    host, _, port = address.rpartition(":")
    if not host.strip("[]") or not port.isdigit() or not 1 <= int(port) <= 65535:
        raise ValueError(f"{option} {address}: expected HOST:PORT with a port 1-65535 (e.g. {example})")
    return host.strip("[]"), int(port)


def cannot_listen(host: str, port: int) -> str | None:
    """Why this process cannot listen on ``host:port``, or None where it can: another process listens there
    ("Address already in use"), or ``host`` is no address of this machine. Bound as uvicorn binds
    (``SO_REUSEADDR``: a port in TIME_WAIT is free)."""
    import errno

    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError as e:
            if e.errno == errno.EADDRINUSE:
                return f"{e.strerror}: another process listens there"
            if e.errno == errno.EADDRNOTAVAIL:
                return f"{e.strerror}: {host} is no address of this machine (give one of its interfaces, or 0.0.0.0)"
            return e.strerror or str(e)
    return None


def free_ports(n: int, host: str = "127.0.0.1") -> list[int]:
    """``n`` distinct TCP ports free on ``host`` right now."""
    socks = []
    try:
        for _ in range(n):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind((host, 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


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


def loopback_if_any(host: str) -> str:
    """Where a process on this machine reaches a server listening on ``host``: 127.0.0.1 for an every-interface
    address (``0.0.0.0``, ``::``, empty), which no certificate names; ``host`` otherwise."""
    return "127.0.0.1" if host.strip("[]") in ("0.0.0.0", "::", "") else host


def wait_for_port(host: str, port: int, timeout: float, alive=lambda: True, what: str = "server") -> None:
    """Return once ``host:port`` accepts TCP connections; raise if ``alive()`` turns False or on timeout."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not alive():
            raise RuntimeError(f"{what} exited before listening on {host}:{port}")
        with contextlib.suppress(OSError), socket.create_connection((host, port), timeout=0.5):
            return
        time.sleep(0.1)
    raise TimeoutError(f"{what} is not listening on {host}:{port} after {timeout:.0f} s")


@dataclass(frozen=True)
class ProcEntry:
    """One process as ``/proc`` shows it: ``carries`` is whether its environment holds the entry asked for."""

    pid: int
    ppid: int
    pgid: int
    carries: bool = False


def proc_table(environ_entry: str | None = None) -> list[ProcEntry]:
    """Every process, in one pass over ``/proc`` (Linux; empty elsewhere). ``environ_entry`` (``NAME=value``):
    also read each environment to fill ``carries`` (processes of other users are not readable: False)."""
    table: list[ProcEntry] = []
    if not Path("/proc").is_dir():
        return table
    wanted = None if environ_entry is None else environ_entry.encode()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        carries = False
        if wanted is not None:
            with contextlib.suppress(OSError):
                carries = wanted in (entry / "environ").read_bytes().split(b"\0")
        fields = stat[stat.rindex(")") + 2 :].split()
        table.append(ProcEntry(int(entry.name), int(fields[1]), int(fields[2]), carries))
    return table


def descendants_in(table: list[ProcEntry], roots: set[int]) -> set[int]:
    """Every descendant of ``roots`` in ``table`` (``roots`` themselves not included)."""
    children: dict[int, list[int]] = {}
    for proc in table:
        children.setdefault(proc.ppid, []).append(proc.pid)
    out: set[int] = set()
    todo = list(roots)
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in out:
                out.add(child)
                todo.append(child)
    return out


def descendants(pid: int) -> list[int]:
    """Every living descendant of ``pid`` (Linux ``/proc``; empty elsewhere)."""
    return sorted(descendants_in(proc_table(), {pid}))


def _die_with_parent(parent: int) -> None:
    """In the child, before exec: ask Linux for SIGTERM when the parent dies (prctl PR_SET_PDEATHSIG); a parent
    already gone (``parent``, its PID, no longer this process's parent) ends the child at once."""
    if not die_with_parent(signal.SIGTERM, parent):
        os._exit(1)


def stop_when_child_exits(
    child: subprocess.Popen,
    what: str,
    grace: float = 10.0,
    stopping: threading.Event | None = None,
    settle: float = 2.0,
) -> threading.Event:
    """Once ``child`` exits, stop this process; the returned event is set when that happened (the caller then exits
    with a failure code).

    A site's SuperNode and its ClientApp runner (``fedseg.flower.worker``) live and die together: a SuperNode whose
    runner has gone holds every message it receives unanswered, and a coordinator without ``fl.timeout_s`` waits
    for them for ever; a SuperNode that has stopped is seen by the SuperLink, which answers its messages with
    Flower's node-unavailable error (``fl.on_failure`` then applies), and by ``fedseg flower local``.

    While the process has a SIGTERM handler of its own (Flower's SuperNode, which then tells the SuperLink it
    leaves) it gets SIGTERM, with one line on stderr naming ``what`` and its exit code; without one it is starting
    or already stopping (a Ctrl-C or SIGTERM reaches the runner too): a second signal would cut its shutdown short,
    so it only gets ``os._exit(1)`` if it still runs ``grace`` s later.

    ``stopping``: set once this process is stopping of its own accord (``supernode_main.StopSignals``). A child that
    exits while it is set, or gets set within ``settle`` s (a Ctrl-C or SIGTERM to the process group reaches both, and
    the child may end before this process's main thread has run its handler), was stopped with this process: no
    failure, nothing said, no signal."""
    died = threading.Event()

    def watch() -> None:
        code = child.wait()
        stopped_with_us = stopping is not None and stopping.wait(settle)
        if not stopped_with_us and callable(signal.getsignal(signal.SIGTERM)):
            died.set()
            print(f"{what} exited (code {code}); this process stops with it", file=sys.stderr, flush=True)
            os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(grace)
        os._exit(1)

    threading.Thread(target=watch, name=f"watch {what}", daemon=True).start()
    return died


@dataclass
class Started:
    name: str
    proc: subprocess.Popen
    log: Path


@dataclass
class Processes:
    """The processes of one deployment; a context manager that always stops them."""

    record: Path | None = None  # JSON file listing every PID seen (for checks that none survived)
    # the deployment's private FLWR_HOME, which every process it starts inherits: how its processes are found once
    # the process between us and them has exited (Ray's actors, after Flower's simulation process shut Ray down)
    home: Path | None = None
    started: list[Started] = field(default_factory=list)
    seen: set[int] = field(default_factory=set)

    def start(self, name: str, cmd: list[str], log: Path, env: dict[str, str], secret: str | None = None) -> Started:
        """Start ``cmd`` in its own session (Ctrl-C reaches only us; we stop it), output appended to ``log``.
        On Linux it also gets SIGTERM if this process dies without cleaning up (even SIGKILL). ``secret``: one
        line given on its standard input (``fedseg.flower.runtime_secret.hand_over``); none: an empty input."""
        log.parent.mkdir(parents=True, exist_ok=True)
        with open(log, "ab") as f:
            proc = subprocess.Popen(
                cmd,
                stdout=f,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL if secret is None else subprocess.PIPE,
                env=env,
                start_new_session=True,
                preexec_fn=functools.partial(_die_with_parent, os.getpid()),
            )
        if secret is not None:
            hand_over(proc, secret)
        item = Started(name, proc, log)
        self.started.append(item)
        self.seen.add(proc.pid)
        self._write()
        return item

    def current(self) -> set[int]:
        """Our processes alive now: started ones not yet reaped, their descendants, members of their
        process groups (children that outlived their parent stay in its group), and (``home``) every process
        whose environment names the deployment's FLWR_HOME (one pass over ``/proc``). Never a recorded PID that may
        have been reused since."""
        started = {item.proc.pid for item in self.started}
        table = proc_table(None if self.home is None else f"FLWR_HOME={self.home}")
        live = {item.proc.pid for item in self.started if item.proc.poll() is None}
        live |= descendants_in(table, live)
        live |= {proc.pid for proc in table if proc.pgid in started or proc.carries}
        live.discard(os.getpid())
        return {pid for pid in live if is_running(pid)}

    def observe(self) -> None:
        """Record every process of ours alive now (Flower's SuperExec, ServerApp and ClientApp processes too)."""
        self.seen.update(self.current())
        self._write()

    def _write(self) -> None:
        if self.record is not None:
            self.record.parent.mkdir(parents=True, exist_ok=True)
            names = {str(s.proc.pid): s.name for s in self.started}
            # atomic: it is rewritten every second while others (a cleanup, a test) read it
            atomic_write_text(self.record, json.dumps({"started": names, "pids": sorted(self.seen)}, indent=1))

    def stop(self, grace: float = 5.0) -> None:
        """SIGTERM every process of ours; SIGKILL whatever is left after ``grace`` s. A second Ctrl-C
        while stopping is ignored (it would leave processes behind)."""
        main = threading.current_thread() is threading.main_thread()
        saved = signal.signal(signal.SIGINT, signal.SIG_IGN) if main else None
        try:
            self._stop(grace)
        finally:
            if main:
                signal.signal(signal.SIGINT, saved)

    def _signal(self, pids: set[int], sig: int) -> None:
        """``sig`` once to every process of ours: to the process groups of the started ones, then to each of ``pids``
        outside those groups. A process that got SIGTERM twice (its group's and its own) was killed by the second
        while exiting gracefully: Flower's handler puts back the default action once it starts (a SuperNode of
        ``fedseg flower local`` died mid-exit at a normal end, its log cut short and its ``--state`` lock left)."""
        groups = {item.proc.pid for item in self.started}
        for group in groups:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(group, sig)
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                if os.getpgid(pid) not in groups:
                    os.kill(pid, sig)

    def _stop(self, grace: float) -> None:
        ours = self.current()  # grows while stopping: orphans found once stay ours (a few seconds, no PID reuse)
        self._signal(ours, signal.SIGTERM)

        def alive() -> set[int]:
            ours.update(self.current())
            return {pid for pid in ours if is_running(pid)}

        deadline = time.monotonic() + grace
        while time.monotonic() < deadline and alive():
            time.sleep(0.05)
        if alive():
            self._signal(alive(), signal.SIGKILL)
            deadline = time.monotonic() + 5
            while time.monotonic() < deadline and alive():
                time.sleep(0.02)
        self.seen.update(ours)
        for item in self.started:
            with contextlib.suppress(subprocess.TimeoutExpired):
                item.proc.wait(timeout=5)
        self._write()

    def __enter__(self) -> Processes:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


# --- Control API (what the flwr CLI does) ------------------------------------------------------


CONTROL_KEY_HEADER = "fedseg-control-key"  # the HTTP header of the coordinator's key on each Control API call


def control_client(address: str, root_certificates: Path | None, key: str):
    """A Flower Control API client for the SuperLink at ``address`` (TLS if ``root_certificates``) sending ``key``,
    the coordinator's, in :data:`CONTROL_KEY_HEADER` with each call (``fedseg.flower.superlink.RunningLink``), and
    the headers the ``flwr`` CLI sends (its name and version; Flower's account login, an Enterprise plugin, is
    not used). Built by ``fedseg.flower.flwr_internals.control_client``."""
    from fedseg.flower import flwr_internals

    return flwr_internals.control_client(
        address,
        insecure=root_certificates is None,
        root_certificates=str(root_certificates) if root_certificates else None,
        headers={CONTROL_KEY_HEADER: key},
    )


def register_node(client, public_key: Path, name: str | None = None) -> int:
    """``flwr supernode register``: allow the SuperNode holding ``public_key``'s private key; returns its node id."""
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.hazmat.primitives.serialization import load_ssh_public_key

    from fedseg.flower.flwr_internals import register_node_key

    key = load_ssh_public_key(Path(public_key).read_bytes())
    if not isinstance(key, ec.EllipticCurvePublicKey):
        raise ValueError(f"{public_key}: not an EC public key (create keys with `fedseg flower certs`)")
    node_id = register_node_key(client, key, name)
    if not node_id:
        raise RuntimeError(f"the SuperLink refused to register {public_key}")
    return node_id


def submit_run(client, fab: bytes, run_config: dict, simulation: dict | None = None) -> int:
    """``flwr run``: submit the FAB with ``run_config`` overrides; returns the run id. ``simulation``: the
    fields of Flower's ``SimulationConfig`` (``num_supernodes``, ``client_resources_num_cpus``, ...) for a
    SuperLink started with ``--simulation``."""
    from fedseg.flower.flwr_internals import start_run

    run_id, note = start_run(client, fab, run_config, simulation)
    if run_id is None:
        raise RuntimeError(f"the SuperLink did not start the run{': ' + note if note is not None else ''}")
    return run_id


def run_status(client, run_id: int):
    """Flower's ``RunStatus`` of run ``run_id`` (``fedseg.flower.flwr_internals.run_status``)."""
    from fedseg.flower import flwr_internals

    return flwr_internals.run_status(client, run_id)


CONTROL_OUTAGE_S = 60.0  # seconds of consecutive failed status polls (a SuperLink not answering) before a run fails
RETRIED_STATUSES = (503,)  # HTTP answers a status poll retries: the SuperLink's "retry shortly" (its bodies' budget)


def transient(error: Exception) -> bool:
    """Whether a failed Control API call may succeed if tried again: httpx's network errors and timeouts (connection
    refused or reset, nothing answered in time: Flower's HTTP client raises httpx's errors as they are), a connection
    the server closed without an answer, or a 503 (:data:`RETRIED_STATUSES`); not a certificate that fails
    verification, another HTTP status (401: the key refused) or any other error."""
    import ssl

    import httpx

    if isinstance(error, httpx.HTTPStatusError):
        return error.response.status_code in RETRIED_STATUSES
    if not isinstance(error, httpx.TimeoutException | httpx.NetworkError | httpx.RemoteProtocolError):
        return False
    cause: BaseException | None = error
    while cause is not None:  # httpx says a certificate that fails verification as a ConnectError
        if isinstance(cause, ssl.SSLCertVerificationError):
            return False
        cause = cause.__cause__ or cause.__context__
    return True


def wait_run(
    client, run_id: int, poll: float = 0.5, tick=lambda: None, say=lambda text: None, outage_s: float | None = None
):
    """Block until the run is finished; return its ``RunStatus`` (``sub_status`` completed | failed | stopped),
    polling every ``poll`` s and calling ``tick()`` between two polls. A poll that fails for a :func:`transient`
    reason (the SuperLink restarting its listener, a connection reset) is tried again every ``poll`` s, ``tick()``
    still called, for up to ``outage_s`` s (default :data:`CONTROL_OUTAGE_S`) of consecutive failures (and the last
    try, which may take the client's own timeout, 30 s), ``say(text)`` told one line as they start; a RuntimeError
    (one line, naming the last error) once they have lasted that long. Both lines say whether the SuperLink answered
    (a 503: busy, its bodies' budget full) or not.
    A RuntimeError (one line) at once where the SuperLink no longer lists the run; any other error as raised."""
    outage_s = CONTROL_OUTAGE_S if outage_s is None else outage_s
    failing_since: float | None = None
    while True:
        try:
            status = run_status(client, run_id)
        except KeyError:
            raise RuntimeError(f"the SuperLink no longer lists run {run_id} (was it restarted?)") from None
        except Exception as e:
            if not transient(e):
                raise
            reason = " ".join(str(e).split()) or type(e).__name__
            busy = getattr(getattr(e, "response", None), "status_code", None) in RETRIED_STATUSES  # it did answer
            now = time.monotonic()
            if failing_since is None:
                failing_since = now
                what = "is busy" if busy else "did not answer"
                say(f"the SuperLink's Control API {what} ({reason}): retrying for up to {outage_s:g} s")
            elif now - failing_since >= outage_s:
                what = "has answered only that it is busy" if busy else "has not answered"
                raise RuntimeError(
                    f"the SuperLink's Control API {what} for {now - failing_since:.1f} s "
                    f"(run {run_id} may still go on there): {reason}"
                ) from None
        else:
            failing_since = None
            if status.status == "finished":
                return status
        tick()
        time.sleep(poll)
