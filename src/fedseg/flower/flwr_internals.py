"""Every use of a non-public part of Flower (flwr 1.41) in fedseg, each behind one small function.

Everything else in ``fedseg.flower`` uses Flower's public API (``flwr.app``, ``flwr.clientapp``,
``flwr.serverapp``; for SecAgg+ also ``flwr.server``, ``flwr.server.workflow``, ``flwr.client.mod`` and the legacy
types ``flwr.common`` exports), its documented settings (``FLWR_SUPEREXEC_TASK_POLL_INTERVAL``, ...) and its
commands (``flower-supernode``, ``flower-superlink``). What is here has no public equivalent in
flwr 1.41 (nor in 1.42, which does not install here: it needs a newer certifi than the registry has).
``tests/test_flwr_internals.py`` checks that every name, keyword default and signature used here is
still there, so a Flower upgrade that changes one fails there, naming the function to update.

**Shorter waits** (off unless a poll interval is given). Flower's deployment runtime is built
for many sites on slow links: between "a message exists" and "its payload is there" every
component waits with fixed sleeps. Measured on loopback (``benchmarks/flower_overhead.py``),
these waits, not the work, dominate a tiny round:

- a SuperNode asks the SuperLink for new messages every **3 s** when idle, and checks for its
  ClientApp's reply every 0.5 s (``time.sleep`` calls in ``flwr.supernode.start_client_internal``);
- whoever pulls a message's objects (arrays) before the sender has finished pushing them
  backs off **1 s, 2 s, 4 s ... (cap 10 s)** per object (``pull_objects`` /
  ``pull_and_inflate_object_from_tree`` in ``flwr.supercore.inflatable.inflatable_utils``):
  a site starting on a message as soon as it appears, or the server collecting a reply, hits
  this nearly every time;
- a SuperExec looks for new tasks every 1 s (``FLWR_SUPEREXEC_TASK_POLL_INTERVAL``, an official
  setting: ``fedseg.flower.deploy.flower_env`` sets it) and ``Grid.send_and_receive`` every 3 s
  (fedseg's engine has its own loop, ``fedseg.flower.engine.Courier``).

``cap_node_polling`` and ``cap_object_pull_backoff`` shorten the first two in the calling
process (they replace a module's ``time`` and two functions' keyword defaults; nothing else of
Flower changes). fedseg applies them in its SuperNode wrapper (``supernode_main``) and warm
worker when ``--poll`` is given, and in its ServerApp.

**The ClientApp runner** (``fedseg.flower.worker``) runs ClientApp tasks the way
``flwr-clientapp`` does (``flwr.supernode.runtime.run_clientapp``), but many in one process (warm),
and only for fedseg's own app (``fedseg.flower.bundles``): Flower's only public runner exits after
one task and runs whatever FAB the run brings. The steps it takes from Flower are here.

**The ServerApp runner** (``fedseg.flower.serverapp_runner``) acquires the coordinator's ServerApp tasks with the
SuperLink's secret and runs each as ``flwr-serverapp`` does (``run_serverapp_task``), checking the run's bundle
before Flower installs it.

**The Control API** (``fedseg.flower.deploy``: what ``flwr run`` and ``flwr supernode register`` do): a client
as the ``flwr`` CLI opens it, with headers of fedseg's own (``control_client``), and the calls fedseg makes with it
(``register_node_key``, ``start_run``, ``run_status``).

**Secure aggregation** (``fedseg.flower.secure``): Flower's SecAgg+ workflow and mods are public, but fedseg's site
function and Grid speak their protocol: the legacy ``FitRes`` / ``FitIns`` records (``fitres_to_recorddict``,
``fitins_to_recorddict``), SecAgg+'s record keys (``secaggplus_stage``, ``secaggplus_masked_vector``) and the state
a legacy workflow reads (``workflow_state``).

**Also:** the SuperNode's log timestamps (``show_log_timestamps``) and the in-memory FAB build
(``build_fab``).

Flower is imported only inside the functions: importing this module costs nothing.
"""

from __future__ import annotations

import contextlib
import time
import types
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, cast

if TYPE_CHECKING:
    from cryptography.hazmat.primitives.asymmetric.ec import EllipticCurvePublicKey
    from flwr.app import Context, Message, RecordDict
    from flwr.supercore.control import ControlHttpClient
    from flwr.supercore.fab import Fab
    from flwr.supercore.run import Run
    from flwr.supercore.runtime import RuntimeHttpClient

# The keyword defaults of Flower's object-pull functions that ``cap_object_pull_backoff`` replaces.
OBJECT_PULL_DEFAULTS = ("initial_backoff", "backoff_cap", "max_tries_per_object")


# -- shorter waits --------------------------------------------------------------------------------


def cap_node_polling(seconds: float) -> None:
    """Cap every ``time.sleep`` of the SuperNode's main loop at ``seconds``.

    Touches ``flwr.supernode.start_client_internal.time`` (the module's ``time`` is replaced by a copy
    whose ``sleep`` is capped). No public way: the 3 s idle poll and the 0.5 s reply poll are literals
    in ``start_client_internal``; ``flower-supernode`` has no option or environment variable for them."""
    import flwr.supernode.start_client_internal as loop

    capped = types.ModuleType("time")
    capped.__dict__.update(time.__dict__)
    capped.__dict__["sleep"] = lambda s: time.sleep(min(s, seconds))
    loop.time = capped


def object_pull_functions() -> tuple[Callable, ...]:
    """Flower's two functions that pull a message's objects with backoff:
    ``flwr.supercore.inflatable.inflatable_utils.pull_objects`` and ``pull_and_inflate_object_from_tree``."""
    from flwr.supercore.inflatable import inflatable_utils as iu

    return iu.pull_objects, iu.pull_and_inflate_object_from_tree


def cap_object_pull_backoff(seconds: float, cap: float = 1.0) -> None:
    """Retry an unavailable object after ``seconds`` (doubling up to ``cap``) instead of 1 s (up to 10 s);
    the number of tries is raised so the total patience (up to Flower's 2 h limit) stays as long.

    Touches the keyword defaults ``initial_backoff``, ``backoff_cap`` and ``max_tries_per_object`` of
    ``object_pull_functions()``. No public way: every caller inside Flower (SuperNode, ``flwr-clientapp``,
    ``Grid``) relies on these defaults, which come from constants in ``flwr.supercore.constant``; no option,
    setting or environment variable changes them."""
    for fn in object_pull_functions():
        defaults = fn.__kwdefaults__
        if defaults is None or not set(OBJECT_PULL_DEFAULTS) <= set(defaults):
            raise RuntimeError(
                f"Flower changed {fn.__module__}.{fn.__name__}: its keyword defaults lack "
                f"{OBJECT_PULL_DEFAULTS}; fedseg.flower.flwr_internals.cap_object_pull_backoff "
                "must be updated"
            )
        defaults.update(initial_backoff=seconds, backoff_cap=max(cap, seconds), max_tries_per_object=int(1e6))


# -- stopping -------------------------------------------------------------------------------------


def on_flower_exit(callback: Callable[[], None]) -> None:
    """Call ``callback`` when Flower's graceful exit begins in this process (``flwr_exit``: the SuperNode's handler of
    SIGTERM / SIGINT / SIGQUIT, or an exit of its own), before Flower's other exit handlers and its 5 s force-exit
    timer start.

    Uses ``flwr.supercore.exit.add_exit_handler`` (``run_before_force_exit=True``). No public way: Flower's handler
    puts back the signal handlers it found and says nothing else to them (``supernode_main.StopSignals``)."""
    from flwr.supercore.exit import add_exit_handler

    add_exit_handler(callback, run_before_force_exit=True)


def flower_handles_signals() -> bool:
    """Whether Flower's signal handlers have been registered in this process (``register_signal_handlers`` adds its
    ``_wait_to_stop`` exit handler as it registers them): from then on a stop signal reaches a handler of ours only
    after Flower's put it back, its graceful exit under way.

    Uses ``flwr.supercore.exit.exit_handler.registered_exit_handlers``. No public way."""
    from flwr.supercore.exit import exit_handler

    return any(
        getattr(h.exit_handler, "__name__", "") == "_wait_to_stop" for h in exit_handler.registered_exit_handlers
    )


# -- logging and packaging ------------------------------------------------------------------------


def show_log_timestamps() -> None:
    """Put timestamps in Flower's console log lines (a site's log is read later, next to the coordinator's).

    Touches ``flwr.supercore.logger.console_handler.timestamps``. No public way: Flower shows timestamps
    only with ``FLWR_LOG_LEVEL=DEBUG``, which also turns on debug output."""
    from flwr.supercore.logger import console_handler

    console_handler.timestamps = True


def build_fab(files: Mapping[str, bytes]) -> bytes:
    """A Flower App Bundle of in-memory ``files`` (relative path -> content), as ``flwr build`` writes it.

    Uses ``flwr.cli.build.build_fab_from_files``, the function behind ``flwr build``. The public way,
    the ``flwr build --app DIR`` command, gives the same bytes but needs a subprocess (about 1 s more per
    run), a temporary app folder, and a FAB module whose names its static check can see."""
    from flwr.cli.build import build_fab_from_files

    return build_fab_from_files(dict(files))[0]


# -- the Control API (fedseg.flower.deploy: what `flwr run` / `flwr supernode register` do) --------------------------

CONTROL_CLI_COMPONENT = "flwr CLI"  # the component name the ``flwr`` CLI declares in its runtime-version headers


class _AddHeaders:
    """An interceptor of Flower's protobuf-over-HTTP clients (``flwr.supercore.protobuf.client``) adding ``headers``
    to each request: Flower calls ``intercept(context, call_next)`` with a ``ProtobufRequestContext`` whose
    ``request`` is the ``httpx.Request`` about to be sent, and takes the ``httpx.Response`` ``call_next`` returns."""

    def __init__(self, headers: Mapping[str, str]):
        self.headers = dict(headers)

    def intercept(self, context: Any, call_next: Callable[[Any], Any]) -> Any:
        for name, value in self.headers.items():
            context.request.headers[name] = value
        return call_next(context)


def control_client(
    address: str, insecure: bool, root_certificates: str | None, headers: Mapping[str, str]
) -> ControlHttpClient:
    """A client of the SuperLink's Control API at ``address`` (``HOST:PORT``) as the ``flwr`` CLI opens it: plain HTTP
    if ``insecure``, else HTTPS checked against the CA certificate file ``root_certificates`` (None: the system's
    CAs); every call also carries ``headers`` (fedseg's coordinator key, ``fedseg.flower.deploy.control_client``).

    Uses ``flwr.supercore.control.ControlHttpClient.from_server_address`` (``server_address``, ``insecure``,
    ``root_certificates``, ``interceptors``), ``flwr.cli.cli_client_interceptor.CliClientHttpInterceptor`` (the
    CLI's ``x-flwr-client: cli`` header), ``flwr.supercore.interceptors.RuntimeVersionHttpInterceptor`` (component
    ``flwr CLI``: the ``flwr-package-name`` / ``-version`` and ``flwr-component-name`` headers, with which the
    SuperLink refuses a caller of another Flower minor version) and the interceptor protocol (``_AddHeaders``). No
    public way: Flower's Python API has no Control API client; its ``flwr`` CLI reads the SuperLink's address from a
    federation config, keeps its state in ``FLWR_HOME`` and sends no header of one's own. If Flower renames any of
    these, builds its clients otherwise or changes the protocol, a deployment cannot submit its run or register its
    sites' keys (``tests/test_flwr_internals.py`` sends real calls to a local server and checks every header)."""
    from flwr.cli.cli_client_interceptor import CliClientHttpInterceptor
    from flwr.supercore.control import ControlHttpClient
    from flwr.supercore.interceptors import RuntimeVersionHttpInterceptor

    return ControlHttpClient.from_server_address(
        server_address=address,
        insecure=insecure,
        root_certificates=root_certificates,
        interceptors=[
            CliClientHttpInterceptor(),
            RuntimeVersionHttpInterceptor(component_name=CONTROL_CLI_COMPONENT),
            _AddHeaders(headers),
        ],
    )


def register_node_key(client: ControlHttpClient, public_key: EllipticCurvePublicKey, name: str | None) -> int:
    """The node id the SuperLink gives the SuperNode holding ``public_key``'s private key, as ``flwr supernode
    register`` asks for it (0: refused); ``name``: the node's name (None: none).

    Uses ``ControlHttpClient.RegisterNode``, ``flwr.proto.control_pb2.RegisterNodeRequest`` (``public_key``,
    ``name``) and its response's ``node_id``, and ``flwr.supercore.primitives.asymmetric.public_key_to_bytes`` (the
    key as the SuperLink compares it with the one a SuperNode signs with). No public way (see
    :func:`control_client`)."""
    from flwr.proto.control_pb2 import RegisterNodeRequest
    from flwr.supercore.primitives.asymmetric import public_key_to_bytes

    res = client.RegisterNode(RegisterNodeRequest(public_key=public_key_to_bytes(public_key), name=name))
    return int(res.node_id)


def start_run(
    client: ControlHttpClient, fab: bytes, run_config: Mapping, simulation: Mapping | None = None
) -> tuple[int | None, str | None]:
    """Submit the FAB ``fab`` with ``run_config`` overrides, as ``flwr run`` does; ``simulation``: the fields of
    Flower's ``SimulationConfig`` (``num_supernodes``, ...) for a SuperLink started with ``--simulation``. Returns
    ``(run id, None)``, or ``(None, the SuperLink's note or None)`` where it did not start the run.

    Uses ``ControlHttpClient.StartRun``, ``flwr.proto.control_pb2.StartRunRequest`` (``fab``, ``override_config``,
    ``federation``, ``override_federation_config``) and its response's ``run_id`` and ``note``,
    ``flwr.proto.federation_config_pb2.SimulationConfig``, ``flwr.supercore.fab.Fab`` (hash: the content's SHA-256
    hex digest) and ``flwr.common.serde``'s ``fab_to_proto`` and ``user_config_to_proto``. No public way (see
    :func:`control_client`)."""
    import hashlib

    from flwr.common.serde import fab_to_proto, user_config_to_proto
    from flwr.proto.control_pb2 import StartRunRequest
    from flwr.proto.federation_config_pb2 import SimulationConfig
    from flwr.supercore.fab import Fab

    request = StartRunRequest(
        fab=fab_to_proto(Fab(hashlib.sha256(fab).hexdigest(), fab, {})),
        override_config=user_config_to_proto(dict(run_config)),
        federation="",
    )
    if simulation is not None:
        request.override_federation_config.CopyFrom(SimulationConfig(**simulation))
    res = client.StartRun(request)
    if not res.HasField("run_id"):
        return None, res.note if res.HasField("note") else None
    return int(res.run_id), None


def run_status(client: ControlHttpClient, run_id: int) -> Any:
    """Flower's ``RunStatus`` of run ``run_id`` (``status``: pending | starting | running | finished; ``sub_status``:
    completed | failed | stopped once finished; ``details``), as ``flwr ls`` reads it; a KeyError where the SuperLink
    lists no such run.

    Uses ``ControlHttpClient.ListRuns``, ``flwr.proto.control_pb2.ListRunsRequest`` (``run_id``), its response's
    ``run_dict`` and ``flwr.common.serde.run_from_proto`` (``flwr.supercore.run.Run.status``). No public way (see
    :func:`control_client`)."""
    from flwr.common.serde import run_from_proto
    from flwr.proto.control_pb2 import ListRunsRequest

    res = client.ListRuns(ListRunsRequest(run_id=run_id))
    if run_id not in res.run_dict:  # a protobuf map: indexing a missing key would make an empty run, status ''
        raise KeyError(f"the SuperLink lists no run {run_id}")
    return run_from_proto(res.run_dict[run_id]).status


# -- secure aggregation (fedseg.flower.secure) ----------------------------------------------------------------------
# fedseg runs Flower's SecAgg+ (public: ``flwr.server.workflow.SecAggPlusWorkflow`` on the coordinator,
# ``flwr.client.mod.secaggplus_mod`` and ``LocalDpMod`` on the sites), but with its own site function and Grid: the
# mod and the workflow talk in Flower's legacy ``FitIns`` / ``FitRes`` records and SecAgg+'s own record keys.


def fitres_to_recorddict(fitres: Any) -> RecordDict:
    """A legacy ``FitRes`` as the ``RecordDict`` a ClientApp's reply carries, as Flower's message handler writes it
    (input kept): what ``secaggplus_mod`` reads a site's parameters and weight from.

    Uses ``flwr.compat.common.recorddict_compat.fitres_to_recorddict`` (``keep_input=True``). No public way:
    ``flwr.common`` exports ``FitRes`` but not its conversion to a message's content."""
    import flwr.compat.common.recorddict_compat as compat

    return compat.fitres_to_recorddict(fitres, keep_input=True)


def fitins_to_recorddict(fitins: Any) -> RecordDict:
    """A legacy ``FitIns`` as the ``RecordDict`` of a training message (input kept): what ``LocalDpMod`` reads the
    parameters it clips against from.

    Uses ``flwr.compat.common.recorddict_compat.fitins_to_recorddict`` (``keep_input=True``). No public way (see
    :func:`fitres_to_recorddict`)."""
    import flwr.compat.common.recorddict_compat as compat

    return compat.fitins_to_recorddict(fitins, keep_input=True)


def secaggplus_stage(content: RecordDict) -> str:
    """The SecAgg+ stage (``setup``, ``share_keys``, ``collect_masked_vectors``, ``unmask``) a message of
    ``SecAggPlusWorkflow`` is for; a KeyError for a message that is none of its.

    Uses ``flwr.common.secure_aggregation.secaggplus_constants`` (``RECORD_KEY_CONFIGS``, ``Key.STAGE``). No public
    way: the workflow's messages are its own protocol."""
    from flwr.common.secure_aggregation.secaggplus_constants import RECORD_KEY_CONFIGS, Key

    return str(content.config_records[RECORD_KEY_CONFIGS][Key.STAGE])


def secaggplus_masked_vector(content: RecordDict) -> list[bytes] | None:
    """The masked vector a site's reply to SecAgg+'s ``collect_masked_vectors`` stage carries (one serialized NumPy
    array per part), None where the reply has no SecAgg+ record; a KeyError where it has one without a vector.

    Uses ``flwr.common.secure_aggregation.secaggplus_constants`` (``RECORD_KEY_CONFIGS``,
    ``Key.MASKED_PARAMETERS``). No public way (see :func:`secaggplus_stage`)."""
    from flwr.common.secure_aggregation.secaggplus_constants import RECORD_KEY_CONFIGS, Key

    configs = content.config_records.get(RECORD_KEY_CONFIGS)
    return None if configs is None else cast(list, configs[Key.MASKED_PARAMETERS])


def workflow_state(server_round: int) -> RecordDict:
    """The state a legacy workflow (``SecAggPlusWorkflow``) reads from its ``LegacyContext`` to run round
    ``server_round``: the current round and empty global parameters, as ``DefaultWorkflow`` leaves them.

    Uses ``flwr.server.workflow.constant`` (``MAIN_CONFIGS_RECORD``, ``MAIN_PARAMS_RECORD``,
    ``Key.CURRENT_ROUND``). No public way: ``DefaultWorkflow`` writes them, and fedseg runs SecAgg+'s workflow
    without it."""
    from flwr.app import ArrayRecord, ConfigRecord, RecordDict
    from flwr.server.workflow.constant import MAIN_CONFIGS_RECORD, MAIN_PARAMS_RECORD, Key

    return RecordDict(
        {
            MAIN_CONFIGS_RECORD: ConfigRecord({Key.CURRENT_ROUND: server_round}),
            MAIN_PARAMS_RECORD: ArrayRecord(),
        }
    )


# -- the ClientApp runner (fedseg.flower.worker) -------------------------------------------------


def _runtime_client(
    address: str, insecure: bool, root_certificates: str | None, interceptors: list
) -> RuntimeHttpClient:
    """A Runtime API client with Flower's HTTP retries, except on a refused token (401): Flower's retry then sends
    SIGINT to its own process (``flwr.supercore.retry.http_retry``, ``_should_giveup``) -- the end of a one-task
    ``flwr-clientapp``, but here the end of a warm runner serving every task of the site. A 401 (a task the
    SuperNode expired or failed) is raised to the caller instead: that task fails, the runner goes on."""
    import httpx
    from flwr.supercore.retry import make_simple_http_retry_invoker
    from flwr.supercore.runtime import RuntimeHttpClient
    from flwr.supercore.tls import validate_and_resolve_root_certificates

    invoker = make_simple_http_retry_invoker()
    flower_giveup = invoker.should_giveup

    def give_up(exc: Exception) -> bool:
        if isinstance(exc, httpx.HTTPStatusError) and exc.response.status_code == httpx.codes.UNAUTHORIZED:
            return True
        return flower_giveup(exc) if flower_giveup is not None else False

    invoker.should_giveup = give_up
    return RuntimeHttpClient.from_server_address(
        server_address=address,
        insecure=insecure,
        root_certificates=validate_and_resolve_root_certificates(root_certificates, insecure),
        interceptors=interceptors,
        retry_invoker=invoker,
    )


SUPEREXEC_SIGNED = frozenset({"/flwr.proto.Runtime/AcquireTask"})  # what Flower's SuperExec signs (run_superexec)


def superexec_runtime_client(
    address: str, insecure: bool, root_certificates: str | None, secret: bytes | None = None
) -> RuntimeHttpClient:
    """A client of the SuperNode's Runtime API as Flower's SuperExec opens it (to acquire tasks); ``secret``: the
    SuperNode's ``--superexec-auth-secret-file`` bytes, with which it signs ``AcquireTask`` as Flower's SuperExec does.

    Uses ``flwr.supercore.runtime.RuntimeHttpClient``, ``flwr.supercore.retry.make_simple_http_retry_invoker``,
    ``flwr.supercore.tls.validate_and_resolve_root_certificates``,
    ``flwr.supercore.interceptors.RuntimeVersionHttpInterceptor`` and
    ``flwr.supercore.interceptors.http.superexec_auth.SuperExecAuthHttpInterceptor``. No public way: the Runtime
    API is Flower's internal protocol between a SuperNode and its executors."""
    from flwr.supercore.interceptors import RuntimeVersionHttpInterceptor
    from flwr.supercore.interceptors.http.superexec_auth import SuperExecAuthHttpInterceptor

    interceptors: list = [RuntimeVersionHttpInterceptor(component_name="SuperExec")]
    if secret is not None:
        interceptors.append(SuperExecAuthHttpInterceptor(master_secret=secret, protected_methods=SUPEREXEC_SIGNED))
    return _runtime_client(address, insecure, root_certificates, interceptors)


def clientapp_runtime_client(
    address: str, insecure: bool, root_certificates: str | None, token: str
) -> RuntimeHttpClient:
    """A client of the SuperNode's Runtime API for one task, as ``flwr-clientapp --token TOKEN`` opens it.

    Uses what ``superexec_runtime_client`` uses, plus ``flwr.supercore.runtime.tracing.RuntimeTracingInterceptor``
    and ``flwr.supercore.interceptors.RuntimeTokenHttpInterceptor``. No public way (see there)."""
    from flwr.supercore.interceptors import RuntimeTokenHttpInterceptor, RuntimeVersionHttpInterceptor
    from flwr.supercore.runtime.tracing import RuntimeTracingInterceptor

    return _runtime_client(
        address,
        insecure,
        root_certificates,
        [
            RuntimeTracingInterceptor(),
            RuntimeVersionHttpInterceptor(component_name="flwr-clientapp"),
            RuntimeTokenHttpInterceptor(token),
        ],
    )


def acquire_client_app_task(client: RuntimeHttpClient) -> str | None:
    """The token of a pending ClientApp task (``None`` if there is none), as Flower's SuperExec acquires it from a
    SuperNode. No public way: Flower's SuperExec starts one ``flwr-clientapp`` process per task and has no hook to run
    a task in a process of one's own (see :func:`_acquire_task`)."""
    res = _acquire_task(client, "CLIENT_APP")
    return None if res is None else str(res.token)


def acquire_server_app_task(client: RuntimeHttpClient) -> tuple[str, int] | None:
    """``(token, run id)`` of a pending ServerApp task (``None`` if there is none), as Flower's SuperExec acquires it
    from a SuperLink in ``--isolation process`` (``fedseg.flower.serverapp_runner``; see :func:`_acquire_task`)."""
    res = _acquire_task(client, "SERVER_APP")
    return None if res is None else (str(res.token), int(res.task.run_id))


def _acquire_task(client: RuntimeHttpClient, task_type: str) -> Any:
    """The ``AcquireTaskResponse`` of a pending task of ``task_type`` (the ``TaskType`` member's name), or None.
    Uses ``RuntimeHttpClient.AcquireTask``, ``flwr.proto.runtime_pb2.AcquireTaskRequest`` (its response's ``task``,
    ``token`` and ``task.run_id``) and ``flwr.supercore.constant.TaskType``."""
    from flwr.proto.runtime_pb2 import AcquireTaskRequest
    from flwr.supercore.constant import TaskType

    res = client.AcquireTask(AcquireTaskRequest(supported_task_types=[TaskType[task_type].value]))
    return res if res.HasField("task") and res.token else None


def run_serverapp_task(
    address: str,
    insecure: bool,
    root_certificates: str | None,
    token: str,
    parent_pid: int | None,
    check_fab: Callable[[int, bytes], None],
) -> None:
    """Run one ServerApp task as ``flwr-serverapp --token TOKEN`` does (``flwr.superlink.cli.flwr_serverapp``), except
    that ``check_fab(run_id, fab_content)`` is called on the run's app bundle before Flower installs and imports it:
    an exception it raises fails the task, with its text as the run's failure details, before any of the bundle runs.
    Runtime dependency installation off (as ``flower-superlink --disable-runtime-dependency-installation``). Exits the
    process (Flower's ``flwr_exit``), as ``flwr-serverapp`` does.

    Uses ``flwr.superlink.runtime.run_serverapp`` (``run_serverapp``, and its module's ``install_from_fab``, replaced
    for this process by the checking one), ``flwr.supercore.task_identity.TaskIdentity``,
    ``flwr.supercore.logger.mirror_output_to_queue`` and ``flwr.supercore.tls.validate_and_resolve_root_certificates``.
    No public way: ``flwr-serverapp`` takes its token from its arguments or a file and imports whatever bundle the run
    brings."""
    import importlib
    from queue import Queue

    from flwr.supercore.logger import mirror_output_to_queue
    from flwr.supercore.task_identity import TaskIdentity
    from flwr.supercore.tls import validate_and_resolve_root_certificates

    # the module (``flwr.superlink.runtime`` exports its function under the module's own name)
    runtime = importlib.import_module("flwr.superlink.runtime.run_serverapp")
    install = runtime.install_from_fab

    def checked_install(fab_content: bytes, *args, **kwargs):
        check_fab(TaskIdentity.run_id, fab_content)  # set by run_serverapp once it pulled the task
        return install(fab_content, *args, **kwargs)

    runtime.install_from_fab = checked_install  # type: ignore[attr-defined]
    log_queue: Queue[str | None] = Queue()
    mirror_output_to_queue(log_queue)
    runtime.run_serverapp(
        runtime_api_address=address,
        log_queue=log_queue,
        token=token,
        insecure=insecure,
        certificates=validate_and_resolve_root_certificates(root_certificates, insecure),
        parent_pid=parent_pid,
        runtime_dependency_install=False,
    )


def fail_serverapp_task(address: str, insecure: bool, root_certificates: str | None, token: str, details: str) -> bool:
    """End the ServerApp task ``token`` as failed, with ``details`` as the run's failure details, as ``flwr-serverapp``
    does on its way out (``PushTaskOutput``, after ``PullTaskInput`` where the task has not started): for a run the
    runner refuses, or a task process that failed before Flower's runtime took over (the run would otherwise wait for
    it). Whether the task was ended so; a refusal (the task already ended, its token expired) is not raised.

    Uses ``RuntimeHttpClient.PullTaskInput`` and ``PushTaskOutput``, ``flwr.proto.runtime_pb2``'s requests,
    ``flwr.common.constant.SubStatus``, ``flwr.supercore.run.RunNotRunningException`` and
    ``flwr.supercore.interceptors.RuntimeTokenHttpInterceptor``. No public way
    (see :func:`run_serverapp_task`)."""
    import httpx
    from flwr.common.constant import SubStatus
    from flwr.proto.runtime_pb2 import PullTaskInputRequest, PushTaskOutputRequest
    from flwr.supercore.interceptors import RuntimeTokenHttpInterceptor, RuntimeVersionHttpInterceptor
    from flwr.supercore.run import RunNotRunningException  # a BaseException: Flower's answer to a 403

    interceptors = [RuntimeVersionHttpInterceptor(component_name="flwr-serverapp"), RuntimeTokenHttpInterceptor(token)]
    client = _runtime_client(address, insecure, root_certificates, interceptors)
    try:
        with contextlib.suppress(httpx.HTTPError, RunNotRunningException):  # a task not started is started first
            client.PullTaskInput(PullTaskInputRequest())
        try:
            client.PushTaskOutput(PushTaskOutputRequest(sub_status=SubStatus.FAILED, details=details))
        except (httpx.HTTPError, RunNotRunningException):
            return False
        return True
    finally:
        client.close()


def start_task_heartbeat(client: RuntimeHttpClient) -> Callable[[], None]:
    """Start the task heartbeats ``flwr-clientapp`` sends while it runs; returns the function stopping them.

    Uses ``flwr.supercore.heartbeat.HeartbeatSender`` and ``make_task_heartbeat_fn_http``. No public way
    (the task protocol is internal)."""
    from flwr.supercore.heartbeat import HeartbeatSender, make_task_heartbeat_fn_http

    sender = HeartbeatSender(make_task_heartbeat_fn_http(client))
    sender.start()

    def stop() -> None:
        if sender.is_running:
            sender.stop()

    return stop


def pull_task_input(client: RuntimeHttpClient) -> tuple[Message, Context, Run, Fab]:
    """The task's message, context, run and FAB, as ``flwr-clientapp`` pulls them.

    Uses ``flwr.supernode.runtime.run_clientapp.pull_task_input``. No public way (the task protocol is
    internal; ``run_clientapp`` itself exits the process after one task)."""
    from flwr.supernode.runtime.run_clientapp import pull_task_input as pull

    return pull(client)


def client_app_error_code(error: BaseException) -> int:
    """The ``Error`` code ``flwr-clientapp`` replies with when loading (``LOAD_CLIENT_APP_EXCEPTION``) or
    running (``CLIENT_APP_RAISED_EXCEPTION``) the ClientApp raised ``error``.

    Uses ``flwr.clientapp.client_app.LoadClientAppError`` and ``flwr.common.constant.ErrorCode``. No public
    way: neither is exported by ``flwr.app`` or ``flwr.clientapp``."""
    from flwr.clientapp.client_app import LoadClientAppError
    from flwr.common.constant import ErrorCode

    if isinstance(error, LoadClientAppError):
        return int(ErrorCode.LOAD_CLIENT_APP_EXCEPTION)
    return client_app_raised_error_code()


def client_app_raised_error_code() -> int:
    """The ``Error`` code of a ClientApp that raised (``CLIENT_APP_RAISED_EXCEPTION``): what fedseg's ClientApp
    (``fedseg.flower.node.handle``) replies with when it refuses or fails a message, with its own reason.

    Uses ``flwr.common.constant.ErrorCode``. No public way: it is not exported by ``flwr.app``."""
    from flwr.common.constant import ErrorCode

    return int(ErrorCode.CLIENT_APP_RAISED_EXCEPTION)


def invalid_fab_error_code() -> int:
    """The ``Error`` code a SuperNode replies with when it refuses a run's FAB (``INVALID_FAB``, as Flower's
    own ``--trusted-entities`` check does): fedseg's runner refuses any FAB but fedseg's app.

    Uses ``flwr.common.constant.ErrorCode``. No public way: it is not exported by ``flwr.app``."""
    from flwr.common.constant import ErrorCode

    return int(ErrorCode.INVALID_FAB)


def push_reply(client: RuntimeHttpClient, reply: Message, context: Context) -> None:
    """Send the ClientApp's reply to the SuperNode, as ``flwr-clientapp`` does.

    Uses ``flwr.supernode.runtime.run_clientapp.push_message``. No public way (see ``pull_task_input``)."""
    from flwr.supernode.runtime.run_clientapp import push_message

    push_message(client, reply, context)


def push_task_output(client: RuntimeHttpClient, context: Context | None, completed: bool, details: str) -> None:
    """End the task: send the updated ``Context`` and the task's status (completed or failed, ``details``).

    Uses ``flwr.supernode.runtime.run_clientapp.push_task_output`` and ``flwr.common.constant.SubStatus``.
    No public way (see ``pull_task_input``)."""
    from flwr.common.constant import SubStatus
    from flwr.supernode.runtime.run_clientapp import push_task_output as push

    push(
        client=client,
        context=context,
        sub_status=SubStatus.COMPLETED if completed else SubStatus.FAILED,
        details=details,
    )


# -- the SuperLink on two addresses ---------------------------------------------------------------


def superlink_app():
    """``(app, config)``: the SuperLink's FastAPI app (Fleet, Control and Runtime routers, its lifespan
    starting the SuperExec) and its ``SuperLinkLifespanConfig``, from ``flower-superlink``'s arguments in
    ``sys.argv``, exactly as ``flower-superlink`` builds them before serving the app on one address.

    Uses ``flwr.superlink.cli.flower_superlink._parse_superlink_lifespan_config`` and ``SuperLinkLifespan``,
    and ``flwr.superlink.main.create_app``. No public way: flwr 1.41 serves the Fleet, Control and Runtime
    APIs on one ``--host``/``--port`` (``--control-api-address`` / ``--fleet-api-address`` are deprecated
    and ignored), so the unauthenticated Control API would share the SuperNodes' public port
    (``fedseg.flower.superlink_main`` serves the routers on two addresses instead)."""
    from flwr.superlink.cli.flower_superlink import SuperLinkLifespan, _parse_superlink_lifespan_config
    from flwr.superlink.main import create_app

    config = _parse_superlink_lifespan_config()
    return create_app(config, SuperLinkLifespan), config


def fleet_routes() -> frozenset[tuple[str, str]]:
    """``(method, path)`` of every route of the SuperLink's Fleet API (``flwr.superlink.routers.fleet.router``):
    what a SuperNode calls. No public way: the router is Flower's internal HTTP API."""
    from flwr.superlink.routers.fleet.router import router

    return frozenset(
        (method, str(getattr(route, "path", ""))) for route in router.routes for method in getattr(route, "methods", ())
    )


def uvicorn_log_config() -> dict:
    """The logging configuration ``flower-superlink`` gives uvicorn (``flwr.supercore.http_logging``)."""
    from flwr.supercore.http_logging import get_uvicorn_log_config
    from flwr.supercore.logger import console_handler

    return get_uvicorn_log_config(console_handler.level)


def node_left_error_code() -> int:
    """The ``Error`` code the SuperLink replies with for a message whose destination SuperNode stopped sending
    heartbeats before it answered (``NODE_UNAVAILABLE``): the node left, it did not fail.

    Uses ``flwr.common.constant.ErrorCode``. No public way: it is not exported by ``flwr.app``."""
    from flwr.common.constant import ErrorCode

    return int(ErrorCode.NODE_UNAVAILABLE)
