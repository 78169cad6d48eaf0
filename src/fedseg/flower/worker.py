"""A site's ClientApp runner: Flower's SuperExec + ``flwr-clientapp``, running fedseg's app only.

The SuperNode runs in Flower's ``--isolation process``: it expects its ClientApp executor to be
run separately, and this module is that executor. It polls the SuperNode's Runtime API for
ClientApp tasks (``AcquireTask``) and runs each one through the same steps as
``flwr.supernode.runtime.run_clientapp`` (pull the task input, call the ClientApp, push the reply
and the updated ``Context``, task heartbeats) -- except that it never installs or imports the
task's FAB: a task whose FAB is not fedseg's own app is refused (``fedseg.flower.bundles``), any
other is answered by ``fedseg.flower.apps.client_app``, the ClientApp that FAB names. Flower's own
executor (``flower-superexec`` / ``flwr-clientapp``) would import whatever FAB a run brings.

- warm (``fedseg flower supernode --isolation warm``): every task in this long-lived process, so
  PyTorch and MONAI are imported once, not per message;
- fresh (``--isolation subprocess``): every task in a new process (its token on that process's standard input,
  not in its arguments, which every user of the machine sees in ``ps``), as Flower's default isolation runs
  ``flwr-clientapp``.

Only this runner may acquire the SuperNode's tasks: ``fedseg flower supernode`` starts Flower's SuperNode with
a secret drawn at each start (``--superexec-auth-secret-file``, a 0600 file in a 0700 folder) and hands it to the
runner on its standard input (``fedseg.flower.runtime_secret``), with which it signs its ``AcquireTask`` calls
(Flower's SuperExec authentication). Without it any process on the machine could take the site's tasks from the
Runtime API on 127.0.0.1, read its messages and state and answer in its place (a security audit did).

Messages and contexts go through the SuperNode as with Flower's executor; the ClientApp keeps its
state in ``Context.state`` only. Per-run dependency installation is not supported (the node's
environment is used). Flower has no public way to run ClientApp tasks in a process of one's own:
the steps taken from Flower are in ``fedseg.flower.flwr_internals``. Exits when its parent exits.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
from collections.abc import Callable

from fedseg.flower import task_runner

log = logging.getLogger("fedseg.flower.worker")


def _watch_parent(parent: int) -> None:
    def watch() -> None:
        while True:
            time.sleep(0.2)
            if os.getppid() != parent:
                os._exit(0)

    threading.Thread(target=watch, daemon=True).start()


def run_task(address: str, insecure: bool, root_certificates: str | None, token: str) -> None:
    """One ClientApp task, as ``flwr-clientapp --token TOKEN`` would run it (without exiting), if its FAB is
    fedseg's app; otherwise an error reply naming the refusal (``fedseg.flower.bundles``)."""
    from flwr.app import Error, Message

    from fedseg.flower import flwr_internals as internals
    from fedseg.flower.bundles import BundleRefused, check_bundle
    from fedseg.flower.node import NotThisSite

    client = internals.clientapp_runtime_client(address, insecure, root_certificates, token)
    stop_heartbeat: Callable[[], None] | None = None
    message = context = reply = None
    completed, details = False, "ClientApp task failed due to unknown reason"
    try:
        stop_heartbeat = internals.start_task_heartbeat(client)
        t0 = time.perf_counter()
        message, context, run, fab = internals.pull_task_input(client)
        t1 = time.perf_counter()
        check_bundle(run.run_id, fab.content)  # before anything of the run's app is used
        from fedseg.flower.apps import client_app

        t2 = time.perf_counter()
        reply = client_app(message=message, context=context)
        t3 = time.perf_counter()
        completed, details = True, ""
        log.info(
            "%s: pulled in %.3f s, app checked in %.3f s, handled in %.3f s",
            message.metadata.message_type,
            t1 - t0,
            t2 - t1,
            t3 - t2,
        )
    except BundleRefused as ex:  # the run's ServerApp gets the reason; the site's log names it once
        log.error("%s", ex)
        details = str(ex)
        if message is not None:  # always: the bundle is checked once the message is pulled
            reply = Message(Error(code=internals.invalid_fab_error_code(), reason=details), reply_to=message)
    except NotThisSite as ex:  # raised through SecAgg+'s mod (other messages are refused by node.handle)
        if context is not None:
            ex.say(context)
        details = str(ex)
        if message is not None:
            reply = Message(Error(code=internals.client_app_error_code(ex), reason=details), reply_to=message)
    except Exception as ex:  # noqa: BLE001 - reported to the SuperNode like flwr-clientapp does
        log.exception("ClientApp raised an exception")
        details = f"{type(ex)}:<'{ex}'>"
        if message is not None:
            reply = Message(Error(code=internals.client_app_error_code(ex), reason=details), reply_to=message)
    finally:
        try:
            try:
                if reply is not None and context is not None:
                    internals.push_reply(client, reply, context)
            finally:
                # Heartbeats stop before the task output is pushed: that push ends the task and its token, and a
                # heartbeat sent after it is refused (401), on which Flower's HTTP retry sends SIGINT to this
                # process -- harmless to flwr-clientapp, which exits anyway, but it ended a warm runner and left
                # the site's SuperNode with no one to answer its messages (a run waiting forever). A short task on
                # a loaded machine hit it: the heartbeat thread's first beat came after the task had finished.
                if stop_heartbeat is not None:
                    stop_heartbeat()
            internals.push_task_output(client, context, completed, details)
            log.info("reply pushed")
        finally:
            client.close()


def task_command(address: str, insecure: bool, root_certificates: str | None, poll: float) -> list[str]:
    """This module as a command running one task in a fresh process (``--isolation subprocess``), whose token
    it is given on its standard input."""
    cmd = [sys.executable, "-m", "fedseg.flower.worker", "--runtime-api-address", address, "--task"]
    cmd += ["--insecure"] if insecure else []
    cmd += ["--root-certificates", root_certificates] if root_certificates else []
    return [*cmd, "--poll", str(poll), "--parent-pid", str(os.getpid())]


def serve(
    address: str,
    insecure: bool,
    root_certificates: str | None,
    poll: float,
    fresh: bool = False,
    secret: bytes | None = None,
) -> None:
    """Poll the SuperNode's Runtime API for ClientApp tasks forever (``secret``: the SuperNode's, signing each
    ``AcquireTask``); run each in this process (warm) or, with ``fresh``, in a new process each, given its token on
    its standard input (the SuperNode hands out one message at a time: it waits for it)."""
    from fedseg.flower import flwr_internals as internals

    if not fresh:
        import fedseg.algorithms  # noqa: F401  (warm: PyTorch, MONAI and fedseg are imported once, here)
        import fedseg.flower.apps  # noqa: F401
    what = "the SuperNode's Runtime API"
    client = task_runner.runtime_client(address, insecure, root_certificates, secret, what)
    log.info("%s ClientApp runner polling %s every %.2f s", "fresh" if fresh else "warm", address, poll)

    def handle(token: str | None) -> None:
        if token and fresh:
            task_runner.run_task_process(task_command(address, insecure, root_certificates, poll), token)
        elif token:
            with task_runner.one_task(log, "ClientApp task not completed; the runner goes on with the next one"):
                run_task(address, insecure, root_certificates, token)

    task_runner.poll(lambda: internals.acquire_client_app_task(client), handle, poll)


def main() -> None:
    poll_help = "seconds between task polls, first object-pull backoff (Flower's: 1)"
    parser = task_runner.arguments(__doc__.splitlines()[0], "SuperNode", poll_help)
    parser.add_argument("--fresh", action="store_true", help="run every task in a new process")
    # first of all, before anything of a method is imported: the SuperNode's secret (or a fresh task's token)
    args, secret_or_token = task_runner.parse(parser)
    task_runner.configure_logging()
    if args.parent_pid:
        _watch_parent(args.parent_pid)
    from fedseg.flower.flwr_internals import cap_object_pull_backoff

    # flat retries: the objects come from this site's own SuperNode (loopback), which is often still pulling them
    # from the SuperLink when this runner takes the task; doubling delays overshot their arrival by ~50-200 ms
    cap_object_pull_backoff(args.poll, cap=args.poll)
    with task_runner.exits_in_one_line("ClientApp runner"):
        if args.task:
            run_task(args.runtime_api_address, args.insecure, args.root_certificates, secret_or_token)
        else:
            address, insecure, certificates = args.runtime_api_address, args.insecure, args.root_certificates
            secret = task_runner.signing_secret(secret_or_token)
            serve(address, insecure, certificates, args.poll, args.fresh, secret)


if __name__ == "__main__":
    main()
