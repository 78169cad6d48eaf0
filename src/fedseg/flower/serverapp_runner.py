"""The coordinator's ServerApp runner: Flower's SuperExec + ``flwr-serverapp``, taking tasks only with the SuperLink's
secret and running fedseg's app only.

A deployment's SuperLink (``fedseg.flower.superlink_main``) runs in Flower's ``--isolation process`` with
``--superexec-auth-secret-file``: it hands the ServerApp task of a run (and, with its token, the run's configuration
and every message it sends and receives) only to a caller that signs ``AcquireTask`` with the secret drawn at its
start. This runner, started by it, is that caller. In Flower's default (``subprocess``) isolation any local process
could acquire the task first (a security audit read a run's configuration that way), and Flower's SuperExec put the
task's token in ``flwr-serverapp``'s arguments, which every user of the machine sees in ``ps``.

Each task runs in a new process (``--task``), given its token on its standard input
(``fedseg.flower.runtime_secret``), through the same steps as ``flwr-serverapp``, except that the run's app bundle must
be fedseg's own app (``fedseg.flower.bundles``) before Flower installs or imports it: a run someone else started on
the SuperLink's Control API with another bundle fails, its ServerApp never run on the coordinator's machine (Flower's
executor would have imported it). The runner ignores SIGINT and SIGTERM (a Ctrl-C or a stop reaches the SuperLink,
which stops its tasks) and ends when the SuperLink does.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import subprocess
import sys
import time

from fedseg.flower.runtime_secret import hand_over, handed_over

log = logging.getLogger("fedseg.flower.serverapp_runner")
RUNTIME_API_WAIT = 300.0  # s for the SuperLink that started the runner to listen


def command(address: str, root_certificates: str | None, poll: float) -> list[str]:
    """The runner's command line: the SuperLink's Runtime API at ``address`` (HOST:PORT), TLS with
    ``root_certificates`` (None: without TLS), ``poll`` s between two ``AcquireTask`` calls; its secret goes on its
    standard input (:func:`fedseg.flower.runtime_secret.hand_over`)."""
    cmd = [sys.executable, "-m", "fedseg.flower.serverapp_runner", "--runtime-api-address", address]
    cmd += ["--root-certificates", root_certificates] if root_certificates else ["--insecure"]
    return [*cmd, "--poll", f"{poll:g}", "--parent-pid", str(os.getpid())]


def task_command(address: str, root_certificates: str | None) -> list[str]:
    """This module as a command running one ServerApp task, whose token it is given on its standard input."""
    cmd = [sys.executable, "-m", "fedseg.flower.serverapp_runner", "--runtime-api-address", address, "--task"]
    cmd += ["--root-certificates", root_certificates] if root_certificates else ["--insecure"]
    return [*cmd, "--parent-pid", str(os.getpid())]


def serve(address: str, root_certificates: str | None, poll: float, secret: bytes | None) -> None:
    """Poll the SuperLink's Runtime API for ServerApp tasks forever, signing ``AcquireTask`` with ``secret``; start
    each task in a new process, given its token on its standard input (runs may overlap: it does not wait)."""
    from fedseg.flower import flwr_internals as internals
    from fedseg.flower.deploy import wait_for_port

    host, _, port = address.rpartition(":")
    insecure = root_certificates is None
    wait_for_port(host.strip("[]"), int(port), RUNTIME_API_WAIT, what="the SuperLink's Runtime API")
    client = internals.superexec_runtime_client(address, insecure, root_certificates, secret)
    log.info("ServerApp runner polling %s every %g s", address, poll)
    running: list[subprocess.Popen] = []
    while True:
        token = internals.acquire_server_app_task(client)
        running = [task for task in running if task.poll() is None]  # reaped: no zombie per finished run
        if token:
            task = subprocess.Popen(task_command(address, root_certificates), stdin=subprocess.PIPE)  # noqa: S603
            hand_over(task, token)
            running.append(task)
        else:
            time.sleep(poll)


def run_task(address: str, root_certificates: str | None, token: str, parent_pid: int | None) -> None:
    """One ServerApp task, as ``flwr-serverapp`` runs it, if its app bundle is fedseg's; exits the process. A failure
    before Flower's runtime takes over (fedseg's or Flower's modules that do not import) fails the task, naming it
    (without that the run would wait for the task for ever)."""
    from fedseg.flower import flwr_internals as internals

    insecure = root_certificates is None
    try:
        from fedseg.flower.bundles import check_bundle

        def check(run_id: int, content: bytes) -> None:
            check_bundle(run_id, content, who="the coordinator")

        internals.run_serverapp_task(address, insecure, root_certificates, token, parent_pid, check)
    except Exception as e:  # noqa: BLE001 - any failure here is the run's to see, not only this log's
        log.exception("ServerApp task not started")
        details = f"the coordinator's ServerApp task failed to start: {type(e).__name__}: {e}"
        internals.fail_serverapp_task(address, insecure, root_certificates, token, details)
        sys.exit(1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runtime-api-address", required=True, help="the SuperLink's Runtime API, host:port")
    parser.add_argument("--insecure", action="store_true")
    parser.add_argument("--root-certificates", default=None)
    parser.add_argument("--poll", type=float, default=1.0, help="seconds between two AcquireTask calls")
    parser.add_argument("--parent-pid", type=int, default=None)
    parser.add_argument("--task", action="store_true", help="run one task and exit (its token on standard input)")
    args = parser.parse_args()
    secret_or_token = handed_over()  # first of all: nothing this process starts sees it
    certificates = None if args.insecure else args.root_certificates
    if args.task:
        signal.signal(signal.SIGINT, signal.default_int_handler)  # the runner's SIG_IGN was inherited: Flower's own
        signal.signal(signal.SIGTERM, signal.SIG_DFL)  # handlers are set once the task starts
        run_task(args.runtime_api_address, certificates, secret_or_token, args.parent_pid)
        return
    from fedseg.engine.forkserver import die_with_parent

    for sig in (signal.SIGINT, signal.SIGTERM):  # the SuperLink stops; this runner goes with it
        signal.signal(sig, signal.SIG_IGN)
    if not die_with_parent(signal.SIGKILL, args.parent_pid):
        sys.exit(1)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)
    try:
        secret = bytes.fromhex(secret_or_token) or None
        serve(args.runtime_api_address, certificates, args.poll, secret)
    except (OSError, RuntimeError, ValueError) as e:  # TimeoutError: its SuperLink's Runtime API never listened
        print(f"ServerApp runner: {e}", file=sys.stderr, flush=True)
        sys.exit(1)


if __name__ == "__main__":
    main()
