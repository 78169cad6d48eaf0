"""Every non-public part of Flower fedseg relies on (``fedseg.flower.flwr_internals``) is still there.

These tests fail loudly when a Flower upgrade removes or reshapes one of them: module attributes,
keyword defaults that fedseg replaces, functions and their parameters as fedseg calls them. Each
message names the ``flwr_internals`` function to update. Where cheap, a patch is also applied and
its effect checked (and undone, so that other tests see Flower unmodified). The last tests cover
the public API fedseg's ClientApp relies on instead of Flower internals (any action name routed
through ``@app.train(action)`` / ``@app.evaluate(action)``; the lifespan entered by Flower), then the
Control API client (real calls to a real local HTTP server, every header and request field checked) and
the records of Flower's SecAgg+ protocol fedseg reads and writes.
"""

from __future__ import annotations

import importlib
import inspect
import io
import re
import threading
import time
import types
import zipfile

import pytest

from fedseg.flower import flwr_internals


def changed(what: str, function: str) -> str:
    return f"Flower changed {what}: fedseg.flower.flwr_internals.{function} must be updated"


def module(name: str, function: str) -> types.ModuleType:
    try:
        return importlib.import_module(name)
    except ImportError as e:  # pragma: no cover - only when Flower changed
        pytest.fail(changed(f"module {name} ({e})", function))


def attribute(module_name: str, name: str, function: str):
    mod = module(module_name, function)
    assert hasattr(mod, name), changed(f"{module_name}.{name} (gone)", function)
    return getattr(mod, name)


def assert_parameters(fn, names: list[str], what: str, function: str) -> None:
    have = inspect.signature(fn).parameters
    missing = [n for n in names if n not in have]
    assert not missing, changed(f"the parameters of {what} (no {', '.join(missing)})", function)


# -- cap_node_polling -----------------------------------------------------------------------------


def test_node_polling_sleeps_through_the_module_time():
    loop = module("flwr.supernode.start_client_internal", "cap_node_polling")
    assert isinstance(getattr(loop, "time", None), types.ModuleType), changed(
        "flwr.supernode.start_client_internal.time (no module attribute 'time')", "cap_node_polling"
    )
    source = inspect.getsource(loop)
    assert "time.sleep(3)" in source and "time.sleep(0.5)" in source, changed(
        "the SuperNode's polling sleeps in flwr.supernode.start_client_internal", "cap_node_polling"
    )
    assert "from time import" not in source, changed(
        "how flwr.supernode.start_client_internal imports sleep", "cap_node_polling"
    )


def test_cap_node_polling_caps_the_sleeps():
    import flwr.supernode.start_client_internal as loop

    saved = loop.time
    try:
        flwr_internals.cap_node_polling(0.01)
        start = time.perf_counter()
        loop.time.sleep(3)
        assert time.perf_counter() - start < 1.0
        assert loop.time.time is time.time and loop.time.monotonic is time.monotonic  # the rest is untouched
    finally:
        loop.time = saved
    assert loop.time is time


# -- cap_object_pull_backoff ----------------------------------------------------------------------

PULL_CALLERS = (
    "flwr.supernode.start_client_internal",
    "flwr.supernode.runtime.run_clientapp",
    "flwr.superlink.grid.http_grid",
)


def test_object_pull_functions_have_the_keyword_defaults():
    for name in ("pull_objects", "pull_and_inflate_object_from_tree"):
        fn = attribute("flwr.supercore.inflatable.inflatable_utils", name, "object_pull_functions")
        defaults = fn.__kwdefaults__ or {}
        for key in (*flwr_internals.OBJECT_PULL_DEFAULTS, "max_time"):
            assert key in defaults, changed(f"the keyword defaults of {name} (no {key})", "cap_object_pull_backoff")
    assert len(flwr_internals.object_pull_functions()) == 2


def test_object_pull_callers_rely_on_the_defaults():
    """Flower's callers pass no backoff of their own (else capping the defaults does nothing)."""
    for name in PULL_CALLERS:
        source = inspect.getsource(module(name, "cap_object_pull_backoff"))
        assert "pull_objects(" in source or "pull_and_inflate_object_from_tree(" in source, changed(
            f"where objects are pulled ({name} no longer pulls them)", "cap_object_pull_backoff"
        )
        for key in flwr_internals.OBJECT_PULL_DEFAULTS:
            assert f"{key}=" not in source, changed(
                f"how {name} pulls objects (it passes {key})", "cap_object_pull_backoff"
            )


def test_cap_object_pull_backoff_sets_the_defaults():
    functions = flwr_internals.object_pull_functions()
    saved = [dict(fn.__kwdefaults__ or {}) for fn in functions]
    try:
        flwr_internals.cap_object_pull_backoff(0.2)
        for fn in functions:
            defaults = fn.__kwdefaults__ or {}
            assert defaults["initial_backoff"] == 0.2
            assert defaults["backoff_cap"] == 1.0
            assert defaults["max_tries_per_object"] == 10**6
        flwr_internals.cap_object_pull_backoff(2.0)
        assert all((fn.__kwdefaults__ or {})["backoff_cap"] == 2.0 for fn in functions)  # cap >= first wait
    finally:
        for fn, defaults in zip(functions, saved):
            fn.__kwdefaults__ = defaults
    assert [fn.__kwdefaults__ for fn in functions] == saved


# -- on_flower_exit -------------------------------------------------------------------------------


def test_on_flower_exit_runs_the_callback_before_the_force_exit_timer():
    add = attribute("flwr.supercore.exit", "add_exit_handler", "on_flower_exit")
    assert_parameters(add, ["exit_handler", "run_before_force_exit"], "add_exit_handler", "on_flower_exit")
    handlers = module("flwr.supercore.exit.exit_handler", "on_flower_exit")
    for name in ("registered_exit_handlers", "trigger_exit_handlers"):
        assert hasattr(handlers, name), changed(f"flwr.supercore.exit.exit_handler.{name} (gone)", "on_flower_exit")
    saved = list(handlers.registered_exit_handlers)
    called = []
    try:
        handlers.registered_exit_handlers.clear()
        flwr_internals.on_flower_exit(lambda: called.append(True))
        handlers.trigger_exit_handlers(run_before_force_exit=True)  # what flwr_exit does first
        assert called == [True]
    finally:
        handlers.registered_exit_handlers[:] = saved


def test_a_stop_signal_once_flower_registered_its_handlers_no_longer_interrupts():
    """A SuperNode's own handler (``supernode_main.StopSignals``) interrupts a SuperNode still starting; once Flower
    registered its handlers (``flower_handles_signals``), one reaching ours means Flower put it back as its exit
    began: raising then (a second reviewer found the window between the put-back and Flower's exit handlers) cut
    Flower's exit short. Flower's real ``register_signal_handlers``; the process's handlers restored after."""
    import signal

    from flwr.supercore.telemetry import EventType

    from fedseg.flower.supernode_main import StopSignals

    register = attribute("flwr.supercore.exit.signal_handler", "register_signal_handlers", "flower_handles_signals")
    handlers = module("flwr.supercore.exit.exit_handler", "flower_handles_signals")
    saved = list(handlers.registered_exit_handlers)
    signals = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGQUIT)}
    try:
        handlers.registered_exit_handlers.clear()
        stop = StopSignals()
        assert not flwr_internals.flower_handles_signals()
        with pytest.raises(KeyboardInterrupt):
            stop(signal.SIGTERM, None)  # still starting: ends through the finally blocks, as Ctrl-C would
        stop.stopping.clear()
        register(event_type=EventType.RUN_SUPERNODE_LEAVE, exit_message="test")
        assert flwr_internals.flower_handles_signals()
        stop(signal.SIGTERM, None)  # Flower's exit under way: ignored
        assert stop.stopping.is_set()
    finally:
        handlers.registered_exit_handlers[:] = saved
        for sig, handler in signals.items():
            signal.signal(sig, handler)


# -- show_log_timestamps, build_fab ---------------------------------------------------------------


def test_show_log_timestamps():
    handler = attribute("flwr.supercore.logger", "console_handler", "show_log_timestamps")
    assert hasattr(handler, "timestamps"), changed(
        "flwr.supercore.logger.console_handler.timestamps", "show_log_timestamps"
    )
    saved = handler.timestamps
    try:
        flwr_internals.show_log_timestamps()
        assert handler.timestamps is True
    finally:
        handler.timestamps = saved


def test_build_fab():
    build = attribute("flwr.cli.build", "build_fab_from_files", "build_fab")
    assert_parameters(build, ["files"], "flwr.cli.build.build_fab_from_files", "build_fab")
    from fedseg.flower.apps import MODULE, build_fab

    fab = build_fab()
    assert isinstance(fab, bytes), changed("what build_fab_from_files returns", "build_fab")
    names = set(zipfile.ZipFile(io.BytesIO(fab)).namelist())
    assert {"pyproject.toml", f"{MODULE}.py", ".info/CONTENT"} <= names, changed("the FAB's layout", "build_fab")
    assert build_fab() == fab  # deterministic: the same app gives the same FAB hash


# -- the warm ClientApp worker --------------------------------------------------------------------


def test_runtime_client_parts():
    client = attribute("flwr.supercore.runtime", "RuntimeHttpClient", "_runtime_client")
    assert_parameters(
        client.from_server_address,
        ["server_address", "insecure", "root_certificates", "interceptors", "retry_invoker"],
        "RuntimeHttpClient.from_server_address",
        "_runtime_client",
    )
    for method in ("AcquireTask", "close"):
        assert callable(getattr(client, method, None)), changed(
            f"flwr.supercore.runtime.RuntimeHttpClient.{method}", "acquire_client_app_task / worker"
        )
    attribute("flwr.supercore.retry", "make_simple_http_retry_invoker", "_runtime_client")
    resolve = attribute("flwr.supercore.tls", "validate_and_resolve_root_certificates", "_runtime_client")
    assert_parameters(
        resolve, ["root_cert_path", "insecure"], "validate_and_resolve_root_certificates", "_runtime_client"
    )
    version = attribute("flwr.supercore.interceptors", "RuntimeVersionHttpInterceptor", "superexec_runtime_client")
    assert_parameters(version, ["component_name"], "RuntimeVersionHttpInterceptor", "superexec_runtime_client")
    token = attribute("flwr.supercore.interceptors", "RuntimeTokenHttpInterceptor", "clientapp_runtime_client")
    assert_parameters(token, ["token"], "RuntimeTokenHttpInterceptor", "clientapp_runtime_client")
    attribute("flwr.supercore.runtime.tracing", "RuntimeTracingInterceptor", "clientapp_runtime_client")

    # Opening a client does not connect: both kinds can be built and closed here.
    for opened in (
        flwr_internals.superexec_runtime_client("127.0.0.1:1", True, None),
        flwr_internals.clientapp_runtime_client("127.0.0.1:1", True, None, "token"),
    ):
        assert isinstance(opened, client)
        opened.close()


def test_a_refused_task_token_fails_the_call_and_sends_no_sigint(monkeypatch):
    """A 401 from the Runtime API (a task the SuperNode expired or failed): Flower's HTTP retry would SIGINT its own
    process, ending the warm runner that serves every task of the site; the runner's clients raise it instead,
    and keep Flower's decision for every other error (a 503 is retried)."""
    import os
    import signal

    import httpx

    signals: list[int] = []
    monkeypatch.setattr(os, "kill", lambda pid, sig: signals.append(sig))
    monkeypatch.setattr(time, "sleep", lambda seconds: None)  # Flower sleeps through its own SIGINT
    request = httpx.Request("POST", "http://127.0.0.1:1/v1/runtime/send-task-heartbeat")
    for opened in (
        flwr_internals.superexec_runtime_client("127.0.0.1:1", True, None),
        flwr_internals.clientapp_runtime_client("127.0.0.1:1", True, None, "token"),
    ):
        give_up = opened._retry_invoker.should_giveup
        refused = httpx.HTTPStatusError("401", request=request, response=httpx.Response(401, request=request))
        assert give_up(refused) is True
        busy = httpx.HTTPStatusError("503", request=request, response=httpx.Response(503, request=request))
        assert give_up(busy) is False
        opened.close()
    assert signal.SIGINT not in signals, signals


def test_acquire_task_parts():
    request = attribute("flwr.proto.runtime_pb2", "AcquireTaskRequest", "acquire_client_app_task")
    response = attribute("flwr.proto.runtime_pb2", "AcquireTaskResponse", "acquire_client_app_task")
    task_type = attribute("flwr.supercore.constant", "TaskType", "acquire_client_app_task")
    assert hasattr(task_type, "CLIENT_APP"), changed(
        "flwr.supercore.constant.TaskType.CLIENT_APP", "acquire_client_app_task"
    )
    assert "supported_task_types" in request.DESCRIPTOR.fields_by_name, changed(
        "AcquireTaskRequest.supported_task_types", "acquire_client_app_task"
    )
    request(supported_task_types=[task_type.CLIENT_APP.value])
    assert {"task", "token"} <= set(response.DESCRIPTOR.fields_by_name), changed(
        "AcquireTaskResponse (task, token)", "acquire_client_app_task"
    )


def test_server_app_task_parts():
    """What the coordinator's ServerApp runner (``fedseg.flower.serverapp_runner``) takes from Flower: the task type,
    ``flwr-serverapp``'s runtime function and the FAB installer it calls (replaced by the checking one), the task
    identity naming the run, the output a failed start pushes, and where ``flwr-serverapp`` mirrors its output."""
    task_type = attribute("flwr.supercore.constant", "TaskType", "acquire_server_app_task")
    assert hasattr(task_type, "SERVER_APP"), changed("TaskType.SERVER_APP", "acquire_server_app_task")
    runtime = module("flwr.superlink.runtime.run_serverapp", "run_serverapp_task")
    source = inspect.getsource(runtime)
    assert "from flwr.cli.install import install_from_fab" in source and "install_from_fab(fab.content" in source, (
        changed("how run_serverapp installs a run's FAB (install_from_fab)", "run_serverapp_task")
    )
    assert source.index("TaskIdentity.run_id = ") < source.index("install_from_fab(fab.content"), changed(
        "the order of TaskIdentity.run_id and the FAB's installation in run_serverapp", "run_serverapp_task"
    )
    assert_parameters(
        runtime.run_serverapp,
        ["runtime_api_address", "log_queue", "token", "insecure", "certificates", "parent_pid"]
        + ["runtime_dependency_install"],
        "run_serverapp",
        "run_serverapp_task",
    )
    identity = attribute("flwr.supercore.task_identity", "TaskIdentity", "run_serverapp_task")
    assert isinstance(inspect.getattr_static(type(identity), "run_id", None), property), changed(
        "TaskIdentity.run_id", "run_serverapp_task"
    )
    attribute("flwr.supercore.logger", "mirror_output_to_queue", "run_serverapp_task")
    request = attribute("flwr.proto.runtime_pb2", "PushTaskOutputRequest", "fail_serverapp_task")
    request(sub_status="failed", details="x")
    attribute("flwr.supercore.interceptors", "RuntimeTokenHttpInterceptor", "fail_serverapp_task")


def test_heartbeat_parts():
    sender = attribute("flwr.supercore.heartbeat", "HeartbeatSender", "start_task_heartbeat")
    attribute("flwr.supercore.heartbeat", "make_task_heartbeat_fn_http", "start_task_heartbeat")
    for member in ("start", "stop", "is_running"):
        assert hasattr(sender, member), changed(f"HeartbeatSender.{member}", "start_task_heartbeat")
    assert_parameters(sender, ["heartbeat_fn"], "HeartbeatSender", "start_task_heartbeat")


def test_task_input_and_output_parts():
    runtime = "flwr.supernode.runtime.run_clientapp"
    pull = attribute(runtime, "pull_task_input", "pull_task_input")
    assert_parameters(pull, ["client"], f"{runtime}.pull_task_input", "pull_task_input")
    push = attribute(runtime, "push_message", "push_reply")
    assert_parameters(push, ["client", "message", "context"], f"{runtime}.push_message", "push_reply")
    output = attribute(runtime, "push_task_output", "push_task_output")
    assert_parameters(
        output, ["client", "context", "sub_status", "details"], f"{runtime}.push_task_output", "push_task_output"
    )
    sub_status = attribute("flwr.common.constant", "SubStatus", "push_task_output")
    for status in ("COMPLETED", "FAILED"):
        assert hasattr(sub_status, status), changed(f"SubStatus.{status}", "push_task_output")


def test_task_input_fields_the_runner_reads():
    """The runner checks the task's FAB bytes against fedseg's app (``fedseg.flower.bundles``), naming the run."""
    run = attribute("flwr.supercore.run", "Run", "pull_task_input")
    fab = attribute("flwr.supercore.fab", "Fab", "pull_task_input")
    for cls, fields in ((run, ("run_id",)), (fab, ("content",))):
        have = set(inspect.signature(cls).parameters)
        assert set(fields) <= have, changed(f"{cls.__qualname__}'s fields {fields}", "pull_task_input")


def test_client_app_error_code():
    error_code = attribute("flwr.common.constant", "ErrorCode", "client_app_error_code")
    load_error = attribute("flwr.clientapp.client_app", "LoadClientAppError", "client_app_error_code")
    for code in ("LOAD_CLIENT_APP_EXCEPTION", "CLIENT_APP_RAISED_EXCEPTION"):
        assert hasattr(error_code, code), changed(f"ErrorCode.{code}", "client_app_error_code")
    assert flwr_internals.client_app_error_code(load_error("x")) == error_code.LOAD_CLIENT_APP_EXCEPTION
    assert flwr_internals.client_app_error_code(ValueError("x")) == error_code.CLIENT_APP_RAISED_EXCEPTION
    assert flwr_internals.client_app_raised_error_code() == error_code.CLIENT_APP_RAISED_EXCEPTION
    assert hasattr(error_code, "INVALID_FAB"), changed("ErrorCode.INVALID_FAB", "invalid_fab_error_code")
    assert flwr_internals.invalid_fab_error_code() == error_code.INVALID_FAB


# -- public API fedseg relies on instead of internals ---------------------------------------------


def test_flower_supernode_command():
    from fedseg.flower.supernode_main import flower_supernode_command

    assert callable(flower_supernode_command())  # flwr's `flower-supernode` console-script entry point


def test_client_app_routes_any_action_through_public_registration(monkeypatch):
    from flwr.app import Context, Message, Metadata, RecordDict
    from flwr.app.message import make_message
    from flwr.clientapp import ClientApp

    from fedseg.flower import apps, node

    action_default = inspect.signature(ClientApp.train).parameters["action"].default
    assert action_default == apps.DEFAULT_ACTION, "Flower changed ClientApp.train's default action: update apps.py"

    seen: list[str] = []
    events: list[str] = []

    def handle(message, context):
        seen.append(message.metadata.message_type)
        return Message(RecordDict(), reply_to=message)

    monkeypatch.setattr(node, "handle", handle)
    app = apps.FedsegClientApp()

    @app.lifespan()
    def lifespan(context):
        events.append("enter")
        yield
        events.append("exit")

    @app.query(node.INFO)
    def info(message, context):
        return node.handle(message, context)

    def delivered(message_type: str) -> Message:
        """A message as the SuperNode delivers it to the ClientApp (metadata set by the SuperLink)."""
        meta = Metadata(
            run_id=1,
            message_id="",
            src_node_id=0,
            dst_node_id=1,
            reply_to_message_id="",
            group_id="",
            created_at=time.time(),
            ttl=60.0,
            message_type=message_type,
        )
        message = make_message(meta, RecordDict())
        message.metadata.__dict__["_message_id"] = message.object_id
        return message

    context = Context(run_id=1, node_id=1, node_config={}, state=RecordDict(), run_config={})
    types_sent = [
        "train.train",
        "train.loss",
        "train",
        "train.default",
        "evaluate.evaluate",
        "evaluate.share_model",
        "train.train",
        "query.info",
    ]
    for message_type in types_sent:
        assert not app(delivered(message_type), context).has_error()
    assert seen == types_sent
    assert events == ["enter", "exit"] * len(types_sent)
    with pytest.raises(ValueError, match="No query function registered"):
        app(delivered("query.other"), context)


# -- superlink_app, fleet_routes, uvicorn_log_config (fedseg.flower.superlink_main) ------------------------


def test_the_superlink_app_is_built_as_flower_superlink_builds_it():
    cli = module("flwr.superlink.cli.flower_superlink", "superlink_app")
    for name in ("_parse_superlink_lifespan_config", "SuperLinkLifespan"):
        assert hasattr(cli, name), changed(f"flwr.superlink.cli.flower_superlink.{name} (gone)", "superlink_app")
    assert_parameters(
        attribute("flwr.superlink.main", "create_app", "superlink_app"),
        ["config", "superlink_lifespan_class"],
        "flwr.superlink.main.create_app",
        "superlink_app",
    )
    source = inspect.getsource(cli._run_superlink_http_api)
    assert "create_app(lifespan_config, SuperLinkLifespan)" in source and "uvicorn.run(" in source, changed(
        "how flower-superlink serves its app", "superlink_app"
    )


def test_the_fleet_routes_are_the_supernodes_calls_and_nothing_else():
    routes = flwr_internals.fleet_routes()
    assert ("POST", "/v1/fleet/pull-messages") in routes and ("POST", "/v1/fleet/activate-node") in routes, changed(
        "the Fleet API's routes", "fleet_routes"
    )
    assert all(path.startswith("/v1/fleet/") for _, path in routes)
    assert isinstance(flwr_internals.uvicorn_log_config(), dict)


# -- control_client, register_node_key, start_run, run_status (fedseg.flower.deploy) ------------------------------


class ControlServer:
    """A real HTTP server on loopback answering Control API calls as a SuperLink would (one canned protobuf
    response per path, ``answers``), recording each request's path, headers and body; paths in ``refuse`` get a 401,
    those in ``busy`` a 503 (the SuperLink's "retry shortly").
    ``port``: the loopback port to serve on (0: a free one)."""

    def __init__(self, answers: dict, port: int = 0):
        import http.server
        import threading

        self.answers, self.refuse, self.busy, self.calls = answers, set(), set(), []
        server = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("content-length", 0)))
                server.calls.append((self.path, {k.lower(): v for k, v in self.headers.items()}, body))
                status, payload = (
                    (401, b"no key")
                    if self.path in server.refuse
                    else (503, b"retry shortly")
                    if self.path in server.busy
                    else (200, server.answers[self.path].SerializeToString())
                )
                self.send_response(status)
                self.send_header("content-type", "application/protobuf")
                self.send_header("content-length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            def log_message(self, *args):
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self.address = f"127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join(timeout=10)


def control_answers(run_id: int = 7, node_id: int = 42) -> dict:
    from flwr.proto.control_pb2 import ListRunsResponse, RegisterNodeResponse, StartRunResponse
    from flwr.proto.run_pb2 import Run, RunStatus

    status = RunStatus(status="finished", sub_status="failed", details="refused")
    return {
        "/v1/control/register-node": RegisterNodeResponse(node_id=node_id),
        "/v1/control/start-run": StartRunResponse(run_id=run_id),
        "/v1/control/list-runs": ListRunsResponse(run_dict={run_id: Run(run_id=run_id, status=status)}),
    }


def test_control_client_parts():
    client = attribute("flwr.supercore.control", "ControlHttpClient", "control_client")
    assert_parameters(
        client.from_server_address,
        ["server_address", "insecure", "root_certificates", "interceptors"],
        "ControlHttpClient.from_server_address",
        "control_client",
    )
    for method, function in (
        ("RegisterNode", "register_node_key"),
        ("StartRun", "start_run"),
        ("ListRuns", "run_status"),
        ("close", "control_client"),
    ):
        assert callable(getattr(client, method, None)), changed(f"ControlHttpClient.{method}", function)
    cli = attribute("flwr.cli.cli_client_interceptor", "CliClientHttpInterceptor", "control_client")
    version = attribute("flwr.supercore.interceptors", "RuntimeVersionHttpInterceptor", "control_client")
    assert_parameters(version, ["component_name"], "RuntimeVersionHttpInterceptor", "control_client")
    # the interceptor protocol fedseg's header interceptor (flwr_internals._AddHeaders) follows
    protocol = attribute("flwr.supercore.protobuf.client", "ProtobufClientInterceptor", "control_client")
    for interceptor in (protocol, cli, version, flwr_internals._AddHeaders):
        assert_parameters(
            interceptor.intercept, ["context", "call_next"], f"{interceptor.__qualname__}.intercept", "control_client"
        )
    request_context = attribute("flwr.supercore.protobuf.client", "ProtobufRequestContext", "control_client")
    assert "request" in inspect.signature(request_context).parameters, changed(
        "ProtobufRequestContext.request", "control_client"
    )


def test_control_calls_parts():
    fields = {
        "RegisterNodeRequest": {"public_key", "name"},
        "RegisterNodeResponse": {"node_id"},
        "StartRunRequest": {"fab", "override_config", "federation", "override_federation_config"},
        "StartRunResponse": {"run_id", "note"},
        "ListRunsRequest": {"run_id"},
        "ListRunsResponse": {"run_dict"},
    }
    users = {"Register": "register_node_key", "Start": "start_run", "List": "run_status"}
    for name, wanted in fields.items():
        function = next(f for prefix, f in users.items() if name.startswith(prefix))
        message = attribute("flwr.proto.control_pb2", name, function)
        missing = wanted - set(message.DESCRIPTOR.fields_by_name)
        assert not missing, changed(f"flwr.proto.control_pb2.{name} (no {', '.join(sorted(missing))})", function)
    simulation = attribute("flwr.proto.federation_config_pb2", "SimulationConfig", "start_run")
    assert "num_supernodes" in simulation.DESCRIPTOR.fields_by_name, changed(
        "SimulationConfig.num_supernodes", "start_run"
    )
    fab = attribute("flwr.supercore.fab", "Fab", "start_run")
    assert list(inspect.signature(fab).parameters)[:3] == ["hash_str", "content", "verifications"], changed(
        "flwr.supercore.fab.Fab's fields", "start_run"
    )
    for name, function in (
        ("fab_to_proto", "start_run"),
        ("user_config_to_proto", "start_run"),
        ("run_from_proto", "run_status"),
    ):
        attribute("flwr.common.serde", name, function)
    attribute("flwr.supercore.primitives.asymmetric", "public_key_to_bytes", "register_node_key")


def test_the_control_client_sends_the_cli_headers_and_ours_on_each_real_call():
    """Every call of a client built by ``control_client`` reaches a real (local) server with the ``flwr`` CLI's
    headers (its client name, Flower's package and version, component ``flwr CLI``) and ours; the requests carry what
    ``register_node_key``, ``start_run`` and ``run_status`` put in them, and their answers are read back."""
    import hashlib

    import flwr
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat
    from flwr.common.serde import user_config_from_proto
    from flwr.proto.control_pb2 import ListRunsRequest, RegisterNodeRequest, StartRunRequest

    key = ec.generate_private_key(ec.SECP384R1()).public_key()
    fab = b"PK not really a zip"
    with ControlServer(control_answers()) as server:
        client = flwr_internals.control_client(server.address, True, None, {"fedseg-control-key": "k3y"})
        try:
            assert flwr_internals.register_node_key(client, key, "site1") == 42
            assert flwr_internals.start_run(client, fab, {"nodes": 2, "report": "r.json"}) == (7, None)
            assert flwr_internals.start_run(client, fab, {}, {"num_supernodes": 3}) == (7, None)
            status = flwr_internals.run_status(client, 7)
        finally:
            client.close()
    assert (status.status, status.sub_status, status.details) == ("finished", "failed", "refused"), changed(
        "how a run's status is read (run_from_proto)", "run_status"
    )
    assert [path for path, _, _ in server.calls] == [
        "/v1/control/register-node",
        "/v1/control/start-run",
        "/v1/control/start-run",
        "/v1/control/list-runs",
    ], changed("the Control API's paths", "control_client")
    for path, headers, _ in server.calls:
        assert headers.get("fedseg-control-key") == "k3y", changed(
            f"how interceptors set headers ({path})", "control_client"
        )
        assert headers.get("x-flwr-client") == "cli", changed("the CLI's client header", "control_client")
        assert headers.get("flwr-component-name") == "flwr CLI", changed(
            "the runtime-version headers", "control_client"
        )
        assert headers.get("flwr-package-version") == flwr.__version__, changed(
            "the runtime-version headers", "control_client"
        )
        assert headers.get("flwr-package-name"), changed("the runtime-version headers", "control_client")
    register = RegisterNodeRequest.FromString(server.calls[0][2])
    assert register.public_key == key.public_bytes(Encoding.PEM, PublicFormat.SubjectPublicKeyInfo), changed(
        "how a SuperNode's key is sent (public_key_to_bytes)", "register_node_key"
    )
    assert register.name == "site1"
    start = StartRunRequest.FromString(server.calls[1][2])
    assert start.fab.content == fab and start.fab.hash_str == hashlib.sha256(fab).hexdigest(), changed(
        "how a FAB is sent (fab_to_proto)", "start_run"
    )
    assert user_config_from_proto(start.override_config) == {"nodes": 2, "report": "r.json"}, changed(
        "how run config overrides are sent (user_config_to_proto)", "start_run"
    )
    assert start.federation == "" and not start.HasField("override_federation_config")
    simulated = StartRunRequest.FromString(server.calls[2][2])
    assert simulated.override_federation_config.num_supernodes == 3
    assert ListRunsRequest.FromString(server.calls[3][2]).run_id == 7


def test_fedsegs_control_calls_through_a_real_server(tmp_path):
    """``fedseg.flower.deploy``'s Control API functions on top of these: the coordinator's key in its header, an
    OpenSSH key file registered, a refused call (401) raised as the HTTP error the deployment tests expect, and a
    run the SuperLink did not start said with its note."""
    import httpx
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat
    from flwr.proto.control_pb2 import StartRunResponse

    from fedseg.flower import deploy

    public = tmp_path / "site1.pub"
    public.write_bytes(
        ec.generate_private_key(ec.SECP384R1()).public_key().public_bytes(Encoding.OpenSSH, PublicFormat.OpenSSH)
    )
    with ControlServer(control_answers(run_id=9, node_id=5)) as server:
        client = deploy.control_client(server.address, None, key="coordinator-key")
        try:
            assert deploy.register_node(client, public, "site1") == 5
            assert deploy.submit_run(client, b"fab", {"nodes": 1}) == 9
            assert deploy.wait_run(client, 9).sub_status == "failed"
            server.answers["/v1/control/start-run"] = StartRunResponse(note="the SuperLink is busy")
            with pytest.raises(RuntimeError, match="did not start the run: the SuperLink is busy"):
                deploy.submit_run(client, b"fab", {})
            server.answers["/v1/control/start-run"] = StartRunResponse()
            with pytest.raises(RuntimeError, match="did not start the run$"):
                deploy.submit_run(client, b"fab", {})
            server.refuse.add("/v1/control/register-node")
            with pytest.raises(httpx.HTTPStatusError, match="401 Unauthorized"):
                deploy.register_node(client, public, "site1")
        finally:
            client.close()
    assert {headers.get(deploy.CONTROL_KEY_HEADER) for _, headers, _ in server.calls} == {"coordinator-key"}


# -- secure aggregation (fedseg.flower.secure) ----------------------------------------------------------------------


def test_secure_aggregation_records_parts():
    """What fedseg's SecAgg+ site function and Grid read and write of Flower's SecAgg+ protocol."""
    from flwr.common import Code, FitIns, FitRes, Status, ndarrays_to_parameters, parameters_to_ndarrays

    compat = module("flwr.compat.common.recorddict_compat", "fitres_to_recorddict")
    for name, function in (
        ("fitres_to_recorddict", "fitres_to_recorddict"),
        ("recorddict_to_fitres", "fitres_to_recorddict"),
        ("fitins_to_recorddict", "fitins_to_recorddict"),
        ("recorddict_to_fitins", "fitins_to_recorddict"),
    ):
        assert_parameters(attribute(compat.__name__, name, function), ["keep_input"], name, function)
    # the mods read what fedseg writes with the readers tested here
    for mod, readers in (
        ("flwr.client.mod.secure_aggregation.secaggplus_mod", ("recorddict_to_fitres(",)),
        ("flwr.client.mod.localdp_mod", ("recorddict_to_fitins(", "recorddict_to_fitres(")),
    ):
        source = inspect.getsource(module(mod, "fitres_to_recorddict"))
        for reader in readers:
            assert f"compat.{reader}" in source, changed(
                f"how {mod} reads a reply or an instruction", "fitres_to_recorddict"
            )
    import numpy as np

    arrays = [np.arange(3.0)]
    fitres = FitRes(Status(Code.OK, ""), ndarrays_to_parameters(arrays), 4, {"m": 1})
    back = compat.recorddict_to_fitres(flwr_internals.fitres_to_recorddict(fitres), keep_input=True)
    assert back.num_examples == 4 and back.metrics == {"m": 1}
    assert np.array_equal(parameters_to_ndarrays(back.parameters)[0], arrays[0])
    fitins = compat.recorddict_to_fitins(
        flwr_internals.fitins_to_recorddict(FitIns(ndarrays_to_parameters(arrays), {})), keep_input=True
    )
    assert np.array_equal(parameters_to_ndarrays(fitins.parameters)[0], arrays[0])


def test_secaggplus_record_keys_and_workflow_state():
    from flwr.app import ConfigRecord, RecordDict

    from fedseg.flower.secure import STAGE_ACTIONS

    constants = module("flwr.common.secure_aggregation.secaggplus_constants", "secaggplus_stage")
    for name in ("RECORD_KEY_CONFIGS", "Key", "Stage"):
        assert hasattr(constants, name), changed(f"{constants.__name__}.{name} (gone)", "secaggplus_stage")
    for key in ("STAGE", "MASKED_PARAMETERS"):
        assert hasattr(constants.Key, key), changed(f"secaggplus_constants.Key.{key}", "secaggplus_masked_vector")
    assert set(STAGE_ACTIONS) | {"unmask"} == set(constants.Stage.all()), changed(
        "SecAgg+'s stages (fedseg.flower.secure.STAGE_ACTIONS)", "secaggplus_stage"
    )
    content = RecordDict(
        {
            constants.RECORD_KEY_CONFIGS: ConfigRecord(
                {constants.Key.STAGE: "setup", constants.Key.MASKED_PARAMETERS: [b"x"]}
            )
        }
    )
    assert flwr_internals.secaggplus_stage(content) == "setup"
    assert flwr_internals.secaggplus_masked_vector(content) == [b"x"]
    assert flwr_internals.secaggplus_masked_vector(RecordDict()) is None

    workflow = module("flwr.server.workflow.constant", "workflow_state")
    for name in ("MAIN_CONFIGS_RECORD", "MAIN_PARAMS_RECORD", "Key"):
        assert hasattr(workflow, name), changed(f"flwr.server.workflow.constant.{name} (gone)", "workflow_state")
    source = inspect.getsource(module("flwr.server.workflow.secure_aggregation.secaggplus_workflow", "workflow_state"))
    assert "config_records[MAIN_CONFIGS_RECORD]" in source and "WorkflowKey.CURRENT_ROUND" in source, changed(
        "how SecAggPlusWorkflow reads its round", "workflow_state"
    )
    state = flwr_internals.workflow_state(3)
    assert state.config_records[workflow.MAIN_CONFIGS_RECORD][workflow.Key.CURRENT_ROUND] == 3
    assert workflow.MAIN_PARAMS_RECORD in state.array_records


# -- Flower's log lines fedseg reads (fedseg.flower.supernode_main, task_runner) --------------------------------------


def test_the_retry_log_lines_the_supernode_wrapper_shortens_are_flowers():
    """``supernode_main.QuietRetries`` and the runners' filter (``task_runner``) recognise Flower's connection-retry
    lines by their text: no name of Flower's is imported, so only this test sees them change."""
    from fedseg.flower.supernode_main import CONNECTED, RETRY_REASON, RETRYING

    source = inspect.getsource(module("flwr.supercore.retry.http_retry", "supernode_main.QuietRetries"))
    for text in (RETRYING, RETRY_REASON, CONNECTED):
        assert f'"{text.strip()}' in source, (
            f"Flower changed its retry log line {text!r} (flwr.supercore.retry.http_retry): "
            "fedseg.flower.supernode_main.QuietRetries must be updated"
        )


def test_a_run_the_superlink_does_not_list_is_a_key_error_and_wait_run_one_line():
    """A protobuf map gives an empty run for a missing key (status ''), on which ``wait_run`` polled for ever."""
    from fedseg.flower.deploy import wait_run

    with ControlServer(control_answers(run_id=7)) as server:
        client = flwr_internals.control_client(server.address, True, None, {"fedseg-control-key": "k3y"})
        try:
            with pytest.raises(KeyError, match="the SuperLink lists no run 8"):
                flwr_internals.run_status(client, 8)
            with pytest.raises(RuntimeError, match=r"^the SuperLink no longer lists run 8 \(was it restarted\?\)$"):
                wait_run(client, 8, poll=0.01)
        finally:
            client.close()


def _list_runs(run_id: int, status: str) -> dict:
    """``control_answers`` whose ``list-runs`` says run ``run_id`` is ``status`` (sub-status completed)."""
    from flwr.proto.control_pb2 import ListRunsResponse
    from flwr.proto.run_pb2 import Run, RunStatus

    answers = control_answers(run_id=run_id)
    run = Run(run_id=run_id, status=RunStatus(status=status, sub_status="completed" if status == "finished" else ""))
    answers["/v1/control/list-runs"] = ListRunsResponse(run_dict={run_id: run})
    return answers


def test_wait_run_polls_on_through_a_superlink_that_stops_answering_for_a_second():
    """A poll that fails for a transport error (here: nothing listens for ~1 s, then a server on the same port
    answers again) no longer ends the run: ``wait_run`` tries again, ``tick()`` called meanwhile, one line said as
    the failures start, and returns the status once the run is finished."""
    from fedseg.flower.deploy import wait_run

    said: list[str] = []
    ticks = [0]
    first = ControlServer(_list_runs(7, "running")).__enter__()
    port = first.httpd.server_address[1]
    back: list[ControlServer] = []

    def come_back() -> None:
        time.sleep(1.0)
        back.append(ControlServer(_list_runs(7, "finished"), port).__enter__())

    restarting = threading.Thread(target=come_back, daemon=True)

    def tick() -> None:
        ticks[0] += 1
        if ticks[0] == 2:  # two answered polls, then the server goes away for a second
            first.__exit__()
            restarting.start()

    client = flwr_internals.control_client(first.address, True, None, {"fedseg-control-key": "k3y"})
    try:
        began = time.monotonic()
        status = wait_run(client, 7, poll=0.05, tick=tick, say=said.append, outage_s=30.0)
        assert time.monotonic() - began < 20.0
    finally:
        client.close()
        restarting.join(timeout=10)
        for server in back:
            server.__exit__()
    assert (status.status, status.sub_status) == ("finished", "completed")
    assert back and back[0].calls, "the poll after the server came back"
    assert len(said) == 1 and "\n" not in said[0], said
    assert said[0].startswith("the SuperLink's Control API did not answer (") and "retrying for up to 30 s" in said[0]
    assert ticks[0] > 4  # ticked through the failures too


def test_wait_run_gives_up_on_a_superlink_that_never_answers_again_in_one_line():
    """Nothing listening any more: a RuntimeError of one line naming the problem and the last error once the
    failures have lasted ``outage_s``, not before; one line said as they started."""
    from fedseg.flower.deploy import wait_run

    with ControlServer(_list_runs(7, "running")) as server:
        address = server.address
    said: list[str] = []
    client = flwr_internals.control_client(address, True, None, {"fedseg-control-key": "k3y"})
    try:
        began = time.monotonic()
        with pytest.raises(RuntimeError) as failed:
            wait_run(client, 7, poll=0.05, say=said.append, outage_s=1.0)
        waited = time.monotonic() - began
    finally:
        client.close()
    assert 1.0 <= waited < 10.0
    text = str(failed.value)
    assert "\n" not in text and re.match(r"^the SuperLink's Control API has not answered for \d+\.\d s ", text), text
    assert text.endswith("Connection refused"), text
    assert len(said) == 1, said


def test_wait_run_says_a_superlink_answering_busy_is_busy_not_silent():
    """A SuperLink answering every poll 503 ("retry shortly": its bodies' budget full) did answer: both lines say it
    is busy, not that it has not answered."""
    from fedseg.flower.deploy import wait_run

    said: list[str] = []
    with ControlServer(_list_runs(7, "running")) as server:
        server.busy.add("/v1/control/list-runs")
        client = flwr_internals.control_client(server.address, True, None, {"fedseg-control-key": "k3y"})
        try:
            with pytest.raises(RuntimeError) as failed:
                wait_run(client, 7, poll=0.05, say=said.append, outage_s=0.5)
        finally:
            client.close()
    assert len(server.calls) > 2
    assert len(said) == 1 and said[0].startswith("the SuperLink's Control API is busy (") and "503" in said[0], said
    text = str(failed.value)
    assert re.match(r"^the SuperLink's Control API has answered only that it is busy for \d+\.\d s ", text), text
    assert "\n" not in text and "503" in text, text


def test_wait_run_raises_a_refused_poll_at_once():
    """A 401 (the key refused) is no outage: raised as it is, never retried, nothing said."""
    import httpx

    from fedseg.flower.deploy import wait_run

    said: list[str] = []
    with ControlServer(_list_runs(7, "running")) as server:
        server.refuse.add("/v1/control/list-runs")
        client = flwr_internals.control_client(server.address, True, None, {"fedseg-control-key": "wrong"})
        try:
            with pytest.raises(httpx.HTTPStatusError, match="401 Unauthorized"):
                wait_run(client, 7, poll=0.05, say=said.append, outage_s=30.0)
        finally:
            client.close()
    assert len(server.calls) == 1 and said == []


def test_which_control_errors_are_transient():
    """Network errors, timeouts and a 503 are tried again; a certificate that fails verification (which httpx says
    as a ConnectError), another status or an unknown error is not."""
    import ssl

    import httpx

    from fedseg.flower.deploy import transient

    request = httpx.Request("POST", "https://127.0.0.1:1/v1/control/list-runs")

    def status(code: int) -> httpx.HTTPStatusError:
        return httpx.HTTPStatusError(str(code), request=request, response=httpx.Response(code, request=request))

    refused = httpx.ConnectError("[Errno 111] Connection refused")
    assert transient(refused) and transient(httpx.ReadTimeout("timed out")) and transient(httpx.ReadError("reset"))
    assert transient(httpx.RemoteProtocolError("Server disconnected without sending a response."))
    assert transient(status(503)) and not transient(status(401)) and not transient(status(500))
    try:
        try:
            raise ssl.SSLCertVerificationError(1, "certificate verify failed: certificate has expired")
        except ssl.SSLError as e:
            raise httpx.ConnectError(str(e)) from e
    except httpx.ConnectError as e:
        assert not transient(e)
    assert not transient(ValueError("Invalid protobuf response payload"))
