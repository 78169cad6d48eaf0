"""A warm ClientApp worker: Flower's SuperExec + ``flwr-clientapp`` in one long-lived process.

In Flower's default ``subprocess`` isolation, the SuperNode's SuperExec starts one
``flwr-clientapp`` process per message; each imports Flower, PyTorch and MONAI again (several
seconds on a busy CPU) before doing a few hundred milliseconds of work. With the SuperNode in
``--isolation process``, Flower expects the ClientApp executor to be run separately; this
module is that executor, kept warm: it polls the SuperNode's Runtime API for ClientApp tasks
(``AcquireTask``) and runs each one in this process through the same steps as
``flwr.supernode.runtime.run_clientapp`` (pull the task input, install the FAB, load its
ClientApp, call it, push the reply and the updated ``Context``, task heartbeats). Only the
process start is saved: messages, contexts and FABs go through the SuperNode as before, the
ClientApp still keeps its state in ``Context.state`` only. Per-run dependency installation is
not supported (the node's environment is used). Flower has no public way to run ClientApp
tasks in a process of one's own: the steps taken from Flower are in ``fedseg.flower.flwr_internals``.

Run by ``fedseg flower supernode --isolation warm``; exits when its parent process exits.
"""

from __future__ import annotations

import argparse
import logging
import os
import threading
import time
from collections.abc import Callable

log = logging.getLogger("fedseg.flower.worker")


def _watch_parent(parent: int) -> None:
    def watch() -> None:
        while True:
            time.sleep(0.2)
            if os.getppid() != parent:
                os._exit(0)

    threading.Thread(target=watch, daemon=True).start()


def run_task(address: str, insecure: bool, root_certificates: str | None, token: str) -> None:
    """One ClientApp task, as ``flwr-clientapp --token TOKEN`` would run it, without exiting."""
    from flwr.app import Error, Message

    from fedseg.flower import flwr_internals as internals

    client = internals.clientapp_runtime_client(address, insecure, root_certificates, token)
    stop_heartbeat: Callable[[], None] | None = None
    message = context = reply = None
    completed, details = False, "ClientApp task failed due to unknown reason"
    try:
        stop_heartbeat = internals.start_task_heartbeat(client)
        t0 = time.perf_counter()
        message, context, run, fab = internals.pull_task_input(client)
        t1 = time.perf_counter()
        app = internals.load_client_app(run, fab)
        t2 = time.perf_counter()
        reply = app(message=message, context=context)
        t3 = time.perf_counter()
        completed, details = True, ""
        log.info(
            "%s: pulled in %.3f s, app loaded in %.3f s, handled in %.3f s",
            message.metadata.message_type,
            t1 - t0,
            t2 - t1,
            t3 - t2,
        )
    except Exception as ex:  # noqa: BLE001 - reported to the SuperNode like flwr-clientapp does
        log.exception("ClientApp raised an exception")
        details = f"{type(ex)}:<'{ex}'>"
        if message is not None:
            reply = Message(Error(code=internals.client_app_error_code(ex), reason=details), reply_to=message)
    finally:
        try:
            if reply is not None and context is not None:
                internals.push_reply(client, reply, context)
            internals.push_task_output(client, context, completed, details)
            log.info("reply pushed")
        finally:
            if stop_heartbeat is not None:
                stop_heartbeat()
            client.close()


def serve(address: str, insecure: bool, root_certificates: str | None, poll: float) -> None:
    """Poll the SuperNode's Runtime API for ClientApp tasks forever; run each in this process."""
    import fedseg.algorithms  # noqa: F401  (warm: PyTorch, MONAI and fedseg are imported once, here)
    import fedseg.flower.apps  # noqa: F401
    from fedseg.flower import flwr_internals as internals

    internals.cap_object_pull_backoff(poll)

    client = internals.superexec_runtime_client(address, insecure, root_certificates)
    log.info("warm ClientApp worker polling %s every %.2f s", address, poll)
    while True:
        token = internals.acquire_client_app_task(client)
        if token:
            run_task(address, insecure, root_certificates, token)
        else:
            time.sleep(poll)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runtime-api-address", required=True, help="the SuperNode's Runtime API, host:port")
    parser.add_argument("--insecure", action="store_true")
    parser.add_argument("--root-certificates", default=None)
    parser.add_argument("--poll", type=float, default=1.0, help="seconds between task polls (Flower's SuperExec: 1)")
    parser.add_argument("--parent-pid", type=int, default=None)
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)
    if args.parent_pid:
        _watch_parent(args.parent_pid)
    serve(args.runtime_api_address, args.insecure, args.root_certificates, args.poll)


if __name__ == "__main__":
    main()
