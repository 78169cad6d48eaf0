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
executor would have imported it). Before that the runner starts only the task of the run the coordinator submitted
(``OUT/flower/submitted-run``, :func:`run_verdict`): any other run's task fails without a process started (fedseg's
own app with someone's configuration, or a second run resuming the coordinator's in its folder). The runner ignores
SIGINT and SIGTERM and ends when the SuperLink does (a stop reaches the SuperLink's process group, the task processes
too, which also end with the runner: Flower's parent-process monitor).
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from fedseg.flower import task_runner
from fedseg.flower.deploy import COORDINATOR_OUT

log = logging.getLogger("fedseg.flower.serverapp_runner")


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
    the task of the run the coordinator submitted (:func:`run_verdict`) in a new process, given its token on its
    standard input, and fail any other run's task without starting anything (its run fails naming why)."""
    from fedseg.flower import flwr_internals as internals

    insecure = root_certificates is None
    out = os.environ.get(COORDINATOR_OUT)
    client = task_runner.runtime_client(address, insecure, root_certificates, secret, "the SuperLink's Runtime API")
    log.info("ServerApp runner polling %s every %g s", address, poll)
    pending: dict[str, tuple[int, float]] = {}  # token -> (run id, when acquired): runs not yet known to be ours
    running: list[subprocess.Popen] = []

    def handle(acquired: tuple[str, int] | None) -> None:
        if acquired is not None:
            pending[acquired[0]] = (acquired[1], time.monotonic())
        for token, (run_id, since) in list(pending.items()):
            refusal = run_verdict(run_id, out, time.monotonic() - since)
            if refusal == WAIT:
                continue
            del pending[token]
            # one task's failure is not the coordinator's: its run fails on its own
            with task_runner.one_task(log, "run %d: its ServerApp task could not be started or refused", run_id):
                if refusal is None:
                    running.append(task_runner.start_task(task_command(address, root_certificates), token))
                elif internals.fail_serverapp_task(address, insecure, root_certificates, token, refusal):
                    log.warning("%s", refusal)
        running[:] = [task for task in running if task.poll() is None]  # reaped: no zombie per finished run

    task_runner.poll(lambda: internals.acquire_server_app_task(client), handle, poll)


WAIT = "wait"  # run_verdict: not yet known (the coordinator records its run once the SuperLink has taken it)
# s a run's task waits for the coordinator to record it as its run (it does so as soon as the SuperLink has taken it):
# less than the 30 s in which Flower expires a task's token without a heartbeat, or the refusal could never be sent
SUBMITTED_WAIT = 15.0


def run_verdict(run_id: int, out: str | None, waited: float) -> str | None:
    """None where run ``run_id`` is the one the coordinator of ``out`` (its ``FEDSEG_OUT``) submitted
    (``fedseg.flower.deploy.submitted_run``); :data:`WAIT` while it may still be (no run recorded yet, for
    :data:`SUBMITTED_WAIT` s after its task was acquired); otherwise why it is refused, one line. Someone with the
    SuperLink's (loopback) Control API could start fedseg's own app with their own configuration, or resume the
    coordinator's run in its OUT beside it (a security test had two runs training into one folder)."""
    from fedseg.flower.deploy import submitted_run

    if not out:
        return (
            f"run {run_id} refused: no {COORDINATOR_OUT} in the coordinator's environment (start it with fedseg flower)"
        )
    ours = submitted_run(Path(out))
    if ours == run_id:
        return None
    if ours is None and waited < SUBMITTED_WAIT:
        return WAIT
    which = f"it runs run {ours}" if ours is not None else "it submitted none"
    return f"run {run_id} refused: the coordinator did not submit it ({which}); someone started it on its Control API"


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
    parser = task_runner.arguments(__doc__.splitlines()[0], "SuperLink", "seconds between two AcquireTask calls")
    args, secret_or_token = task_runner.parse(parser)  # first of all: nothing this process starts sees it
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
    task_runner.configure_logging()  # Flower's retry lines left out: the SuperLink stopping, it ends with it, unsaid
    with task_runner.exits_in_one_line("ServerApp runner"):
        serve(args.runtime_api_address, certificates, args.poll, task_runner.signing_secret(secret_or_token))


if __name__ == "__main__":
    main()
