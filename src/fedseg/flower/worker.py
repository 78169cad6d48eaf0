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
not supported (the node's environment is used).

Run by ``fedseg flower supernode --isolation warm``; exits when its parent process exits.
"""

from __future__ import annotations

import argparse
import logging
import os
import threading
import time

log = logging.getLogger("fedseg.flower.worker")


def _watch_parent(parent: int) -> None:
    def watch() -> None:
        while True:
            time.sleep(0.2)
            if os.getppid() != parent:
                os._exit(0)

    threading.Thread(target=watch, daemon=True).start()


def _runtime_client(address: str, insecure: bool, root_certificates: str | None, interceptors: list):
    from flwr.supercore.retry import make_simple_http_retry_invoker
    from flwr.supercore.runtime import RuntimeHttpClient
    from flwr.supercore.tls import validate_and_resolve_root_certificates

    return RuntimeHttpClient.from_server_address(
        server_address=address,
        insecure=insecure,
        root_certificates=validate_and_resolve_root_certificates(root_certificates, insecure),
        interceptors=interceptors,
        retry_invoker=make_simple_http_retry_invoker(),
    )


def run_task(address: str, insecure: bool, root_certificates: str | None, token: str) -> None:
    """One ClientApp task, as ``flwr-clientapp --token TOKEN`` would run it, without exiting."""
    from flwr.app import Error, Message
    from flwr.cli.install import install_from_fab
    from flwr.clientapp.client_app import LoadClientAppError
    from flwr.clientapp.utils import get_load_client_app_fn
    from flwr.common.constant import ErrorCode, SubStatus
    from flwr.supercore.heartbeat import HeartbeatSender, make_task_heartbeat_fn_http
    from flwr.supercore.interceptors import RuntimeTokenHttpInterceptor, RuntimeVersionHttpInterceptor
    from flwr.supercore.runtime.tracing import RuntimeTracingInterceptor
    from flwr.supernode.runtime.run_clientapp import pull_task_input, push_message, push_task_output

    client = _runtime_client(address, insecure, root_certificates, [
        RuntimeTracingInterceptor(),
        RuntimeVersionHttpInterceptor(component_name="flwr-clientapp"),
        RuntimeTokenHttpInterceptor(token),
    ])
    heartbeat = HeartbeatSender(make_task_heartbeat_fn_http(client))
    message = context = reply = None
    sub_status, details = SubStatus.FAILED, "ClientApp task failed due to unknown reason"
    try:
        heartbeat.start()
        t0 = time.perf_counter()
        message, context, run, fab = pull_task_input(client)
        t1 = time.perf_counter()
        install_from_fab(fab.content, skip_prompt=True)
        app = get_load_client_app_fn(default_app_ref="", app_path=None, multi_app=True)(run.fab_id, run.fab_version, fab.hash_str)
        t2 = time.perf_counter()
        reply = app(message=message, context=context)
        t3 = time.perf_counter()
        sub_status, details = SubStatus.COMPLETED, ""
        log.info("%s: pulled in %.3f s, app loaded in %.3f s, handled in %.3f s", message.metadata.message_type, t1 - t0, t2 - t1, t3 - t2)
    except Exception as ex:  # noqa: BLE001 - reported to the SuperNode like flwr-clientapp does
        log.exception("ClientApp raised an exception")
        code = ErrorCode.LOAD_CLIENT_APP_EXCEPTION if isinstance(ex, LoadClientAppError) else ErrorCode.CLIENT_APP_RAISED_EXCEPTION
        details = f"{type(ex)}:<'{ex}'>"
        if message is not None:
            reply = Message(Error(code=code, reason=details), reply_to=message)
    finally:
        try:
            if reply is not None and context is not None:
                push_message(client, reply, context)
            push_task_output(client=client, context=context, sub_status=sub_status, details=details)
            log.info("reply pushed")
        finally:
            if heartbeat.is_running:
                heartbeat.stop()
            client.close()


def serve(address: str, insecure: bool, root_certificates: str | None, poll: float) -> None:
    """Poll the SuperNode's Runtime API for ClientApp tasks forever; run each in this process."""
    from flwr.proto.runtime_pb2 import AcquireTaskRequest
    from flwr.supercore.constant import TaskType
    from flwr.supercore.interceptors import RuntimeVersionHttpInterceptor

    import fedseg.algorithms  # noqa: F401  (warm: PyTorch, MONAI and fedseg are imported once, here)
    import fedseg.flower.apps  # noqa: F401
    from fedseg.flower.tuning import cap_object_pull_backoff

    cap_object_pull_backoff(poll)

    client = _runtime_client(address, insecure, root_certificates, [RuntimeVersionHttpInterceptor(component_name="SuperExec")])
    log.info("warm ClientApp worker polling %s every %.2f s", address, poll)
    while True:
        res = client.AcquireTask(AcquireTaskRequest(supported_task_types=[TaskType.CLIENT_APP.value]))
        if res.HasField("task") and res.token:
            run_task(address, insecure, root_certificates, res.token)
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
