"""``python -m fedseg.flower.supernode_main [flower-supernode args]``: Flower's ``flower-supernode``,
optionally with shorter waits.

With ``FEDSEG_FLOWER_NODE_POLL=<seconds>`` set, the SuperNode's idle polling (3 s) and its
object-pull backoff (1 s doubling to 10 s) start at that value (``fedseg.flower.flwr_internals``);
everything else is the unmodified ``flower-supernode``. Worth it on a LAN or loopback, where a
poll costs microseconds; on a WAN with many sites, Flower's defaults keep the SuperLink's load low.

Flower's retry warnings while the SuperLink cannot be reached (one per attempt, for as long as the coordinator is
not up) become one line with the reason and one every 5 minutes (``QuietRetries``); Flower's "Failed to activate
SuperNode" says its two possible causes, a missing key and a plain connection to a TLS port say what to add
(``ExplainActivation``). A SuperLink that no longer knows this SuperNode (the coordinator was restarted: every
``fedseg flower server`` is a new SuperLink) answers its next request with HTTP 401 and Flower stops the SuperNode
("SuperNode terminated gracefully", exit code 0), often after a traceback of its heartbeat thread: fedseg says why and
what to do in one line instead (``NodeForgotten``) and exits with ``FORGOTTEN_EXIT`` (75, EX_TEMPFAIL), not 0, so a
supervisor that restarts failed services (systemd ``Restart=on-failure``) starts it again for the new run.
"""

from __future__ import annotations

import logging
import os
import re
import signal
import sys
import threading
import time
from collections.abc import Callable
from importlib.metadata import distribution

from fedseg.flower.deploy import split_option
from fedseg.flower.flwr_internals import (
    cap_node_polling,
    cap_object_pull_backoff,
    flower_handles_signals,
    on_flower_exit,
    show_log_timestamps,
)

RETRYING = "Connection attempt failed, retrying in"  # Flower's retry warning (flwr.supercore.retry)
RETRY_REASON = "Connection attempt failed with exception: "  # its DEBUG line before it, with the reason
CONNECTED = "Connection successful after"


class QuietRetries(logging.Filter):
    """Flower's retry warnings while the SuperLink cannot be reached, as a few lines instead of one per attempt.

    A hospital starts its SuperNode before the coordinator is up, and Flower logs every attempt (backing off to
    ~20 s apart: some 200 identical lines an hour). The first failure becomes one line with the reason (Flower's
    DEBUG line before it: connection refused, no route to host, a 503 from a proxy...), then one line every
    ``every`` seconds with the count of attempts; a success, or another kind of reason (its first line, without the
    URL an HTTP error names), starts afresh: a connection lost mid-run is said at once. Certificate errors are not
    retried by Flower (it gives up and says so). Installed on Flower's logger (``flwr``), whose records can come from
    several threads: one lock."""

    def __init__(self, address: str, every: float = 300.0, clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__()
        self.address, self.every, self.clock = address, every, clock
        self.reason, self.said_reason = "", ""
        self.first: float | None = None
        self.last_said, self.attempts = 0.0, 0
        self.lock = threading.Lock()

    def filter(self, record: logging.LogRecord) -> bool:
        with self.lock:
            return self._filter(record)

    def _filter(self, record: logging.LogRecord) -> bool:
        text = record.getMessage()
        if text.startswith(RETRY_REASON):
            reason = text[len(RETRY_REASON) :].strip().splitlines()
            self.reason = re.sub(r" for url '[^']*'", "", reason[0]) if reason else ""
            return True  # DEBUG: its handler decides (not shown at Flower's default level)
        if text.startswith(CONNECTED):
            self.first, self.said_reason = None, ""
            return True
        if not text.startswith(RETRYING):
            return True
        now = self.clock()
        self.attempts += 1
        if self.first is None or self.reason != self.said_reason:
            self.first, self.last_said, self.attempts, self.said_reason = now, now, 1, self.reason
            because = f" ({self.reason})" if self.reason else ""
            what = f"cannot reach the SuperLink at {self.address}{because}"
            if "503" in self.reason:  # fedseg's Fleet API before the coordinator registered the keys (or a proxy's)
                what = (
                    f"the SuperLink at {self.address} is up but not open to SuperNodes yet ({self.reason}: its "
                    "coordinator is registering the sites' keys, or a proxy before it is unavailable)"
                )
            self._say(record, f"{what}; retrying quietly until it connects (a line every {self.every / 60:g} min)")
            return True
        if now - self.last_said >= self.every:
            self.last_said = now
            minutes = (now - self.first) / 60
            self._say(
                record,
                f"still cannot reach the SuperLink at {self.address}: {self.attempts} attempts in "
                f"{minutes:.0f} min; retrying",
            )
            return True
        return False

    @staticmethod
    def _say(record: logging.LogRecord, text: str) -> None:
        record.msg, record.args = text, ()


NOT_ACTIVATED = "Failed to activate SuperNode"  # Flower's public message for both causes below
WHY_NOT_ACTIVATED = (
    "fedseg: the SuperLink refused to activate this SuperNode. Either its key (--auth-key) is not one the coordinator "
    "registered (its `fedseg flower server --auth-keys` folder must hold <site>.pub, this key's public half), or a "
    "SuperNode with this key is already connected: another process, or this SuperNode's previous one if it stopped "
    "without saying goodbye (killed, a lost network), which the SuperLink counts as online for up to a minute: "
    "start it again after that. The coordinator's console names which."
)


NOT_REGISTERED = "SuperNode authentication is enabled. All SuperNodes must be registered"  # Flower's, no key given
WHY_NOT_REGISTERED = (
    "fedseg: the coordinator accepts only SuperNodes with a registered key: start this SuperNode with --auth-key "
    "<site>.key (the key the coordinator gave this hospital, or the one whose .pub it registered)."
)
PLAIN_REFUSED = "Server disconnected without sending a response"  # an --insecure node at a TLS port, among others
WHY_PLAIN_REFUSED = (
    "fedseg: this SuperNode runs --insecure (no TLS); a SuperLink started with TLS drops such a connection: start it "
    "with --root-certificates ca.crt (the coordinator's CA) instead of --insecure."
)


class ExplainActivation(logging.Filter):
    """Flower's exit lines that name no cause a site's operator can act on get fedseg's explanation appended:
    "Failed to activate SuperNode." (the SuperLink keeps the cause in its own log; the coordinator's console shows
    it, ``fedseg.flower.log_watch.ActivationRefusals``): ``WHY_NOT_ACTIVATED``, the two causes; authentication on and no
    key given: ``WHY_NOT_REGISTERED``; and, for a SuperNode started ``insecure``, a connection dropped without an
    answer: ``WHY_PLAIN_REFUSED`` (a TLS port)."""

    def __init__(self, insecure: bool = False) -> None:
        super().__init__()
        self.explanations = [(NOT_ACTIVATED, WHY_NOT_ACTIVATED), (NOT_REGISTERED, WHY_NOT_REGISTERED)]
        if insecure:
            self.explanations.append((PLAIN_REFUSED, WHY_PLAIN_REFUSED))

    def filter(self, record: logging.LogRecord) -> bool:
        text = record.getMessage()
        for said, why in self.explanations:
            if said in text and why not in text:
                record.msg, record.args = f"{text}\n{why}", ()
                break
        return True


class ExplainRuntimeSecret(logging.Filter):
    """Flower's warning that its SuperExec authentication is experimental becomes what it means here (an INFO
    line): the Runtime API answers this SuperNode's own ClientApp runner only (``fedseg.flower.worker``)."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.getMessage().startswith(EXPERIMENTAL_SECRET):
            record.msg, record.args = RUNTIME_SECRET, ()
            record.levelno, record.levelname = logging.INFO, "INFO"
        return True


EXPERIMENTAL_SECRET = "EXPERIMENTAL: SuperExec authentication"
RUNTIME_SECRET = (
    "fedseg: this SuperNode's Runtime API gives its tasks to its own ClientApp runner only (a secret drawn at this "
    "start; Flower's SuperExec authentication)"
)


FORGOTTEN = (
    "fedseg: the SuperLink at {address} no longer knows this SuperNode (HTTP 401 Unauthorized on {what}): the "
    "coordinator was restarted (every `fedseg flower server`, --resume too, is a new SuperLink) or unregistered this "
    "site's key, or this machine's clock is off by more than a few seconds (Flower refuses such requests: check its "
    "NTP time). This SuperNode stops now: start it again with the same command (the same --state) to join the "
    "coordinator's new run."
)
UNAUTHORIZED = 401
FORGOTTEN_EXIT = 75  # sysexits' EX_TEMPFAIL: stopped by a new SuperLink, to be started again (not a clean end)
ACTIVATION = ("activate-node", "register-node")  # a refusal there is Flower's "Failed to activate" (ExplainActivation)


class NodeForgotten(logging.Handler):
    """Watches httpx's request lines (logger ``httpx``, INFO: method, URL, HTTP version, status, reason; a public
    log of httpx, written before the caller sees the response) for a 401 from the SuperLink's Fleet API after this
    SuperNode was activated. Flower answers such a 401 by stopping the SuperNode (a SIGINT to itself: "SuperNode
    terminated gracefully.", exit code 0), and its heartbeat thread, which got it, dies with a traceback of httpx's
    ``HTTPStatusError`` (seen in a rehearsal on 1 of 2 SuperNodes: a race with the exit). This handler says once, on
    Flower's logger, why the SuperNode stops and what to do (``FORGOTTEN``); ``excepthook`` then drops that thread's
    traceback. The lines themselves are not shown (they were not before: httpx's logger was below INFO)."""

    def __init__(self, address: str) -> None:
        super().__init__(logging.INFO)
        self.address = address
        self.said = threading.Event()

    def emit(self, record: logging.LogRecord) -> None:
        args = record.args
        if not isinstance(args, tuple) or len(args) < 4 or args[3] != UNAUTHORIZED:
            return
        path = str(args[1]).split("?")[0].rstrip("/")
        if "/fleet/" not in path or path.endswith(ACTIVATION) or self.said.is_set():
            return
        self.said.set()
        what = path.rsplit("/", 1)[-1]
        logging.getLogger("flwr").warning(FORGOTTEN.format(address=self.address, what=what))

    def excepthook(self, previous: Callable[[threading.ExceptHookArgs], object]):
        """A ``threading.excepthook`` that drops the traceback of a thread that died of the 401 said above (Flower's
        heartbeat thread); any other exception goes to ``previous``."""

        def hook(args: threading.ExceptHookArgs) -> None:
            response = getattr(args.exc_value, "response", None)
            if self.said.is_set() and getattr(response, "status_code", None) == UNAUTHORIZED:
                return
            previous(args)

        return hook


def watch_for_a_forgotten_node(address: str) -> NodeForgotten:
    """Install ``NodeForgotten`` on httpx's logger (INFO, not propagated: the request lines stay unshown) and its
    thread excepthook."""
    forgotten = NodeForgotten(address)
    httpx_log = logging.getLogger("httpx")
    httpx_log.setLevel(logging.INFO)
    httpx_log.propagate = False
    httpx_log.addHandler(forgotten)
    threading.excepthook = forgotten.excepthook(threading.excepthook)
    return forgotten


CERTIFICATE_REFUSED = "CERTIFICATE_VERIFY_FAILED"  # Flower's exit text for a TLS handshake this node refused


def why_certificate_refused(text: str, address: str, ca: str) -> str:
    """fedseg's explanation of a SuperLink certificate this SuperNode did not accept (Flower said only "SSL/TLS
    handshake error detected" and OpenSSL's reason: a rehearsal's hospital given another study's ca.crt)."""
    if "mismatch" in text:
        return (
            f"fedseg: the SuperLink's certificate does not name the host of --superlink {address}: connect with a name "
            "the coordinator gave `fedseg flower certs --host` (127.0.0.1 and localhost are always in), or ask it for "
            "a certificate that names this one."
        )
    if "expired" in text or "not yet valid" in text:
        return (
            "fedseg: the SuperLink's certificate has expired or is not yet valid (check this machine's clock): the "
            "coordinator makes new ones (`fedseg flower certs`) and gives the sites the new ca.crt."
        )
    return (
        f"fedseg: the SuperLink's certificate is not signed by --root-certificates {ca}: use the ca.crt the "
        "coordinator gave this hospital (from the same `fedseg flower certs` as its superlink.crt)."
    )


class ExplainCertificate(logging.Filter):
    """Flower's exit lines for a refused SuperLink certificate get fedseg's explanation appended
    (``why_certificate_refused``): which option to change."""

    def __init__(self, address: str, ca: str) -> None:
        super().__init__()
        self.address, self.ca = address, ca

    def filter(self, record: logging.LogRecord) -> bool:
        text = record.getMessage()
        if CERTIFICATE_REFUSED in text and "fedseg: the SuperLink's certificate" not in text:
            record.msg, record.args = f"{text}\n{why_certificate_refused(text, self.address, self.ca)}", ()
        return True


class StopSignals:
    """The SIGTERM / SIGINT handler of a SuperNode process, installed before Flower's (``install``), for the times
    Flower's own is not in place.

    Flower's handler, on the first stop signal, puts back the handlers it found and exits gracefully (the Runtime API
    server and the SuperLink told, up to 5 s). With Python's defaults back, a second signal meanwhile killed the
    process mid-exit: ``fedseg flower local`` ending a run sent each SuperNode two SIGTERMs (its process group's and
    its own), and a site's log ended at "Sent successfully", its ``--state`` lock file left behind. Here such a
    signal is ignored (``stopping``: set when Flower's exit begins, ``flwr_internals.on_flower_exit``, or found once
    Flower's handlers were registered, ``flower_handles_signals``: a signal between Flower putting this handler back
    and its exit handlers starting raised inside them, cutting its exit short); one that comes
    before Flower's handler is in place (the SuperNode still starting) raises ``KeyboardInterrupt``, so the process
    ends through its ``finally`` blocks (its ``--state`` let go), as Ctrl-C would end it."""

    SIGNALS = (signal.SIGINT, signal.SIGTERM)

    def __init__(self) -> None:
        self.stopping = threading.Event()

    def __call__(self, signum: int, frame: object) -> None:
        if self.stopping.is_set() or flower_handles_signals():  # Flower put this back: its exit is under way
            self.stopping.set()
            return
        self.stopping.set()
        raise KeyboardInterrupt(f"signal {signum}")

    def install(self) -> StopSignals:
        """This handler for ``SIGNALS``, and ``stopping`` set when Flower's graceful exit begins (main thread only)."""
        for sig in self.SIGNALS:
            signal.signal(sig, self)
        on_flower_exit(self.stopping.set)
        return self


def option_value(argv: list[str], option: str, default: str) -> str:
    """The value of ``option`` on a command line (``default`` if absent; ``deploy.split_option`` reads it)."""
    value, _ = split_option(argv, option)
    return default if value is None else value


def superlink_address(argv: list[str]) -> str:
    """The ``--superlink`` value of a ``flower-supernode`` command line ("(its --superlink)" if absent)."""
    return option_value(argv, "--superlink", "(its --superlink)")


def flower_supernode_command() -> Callable[[], object]:
    """The function behind Flower's ``flower-supernode`` command, found as the command finds it (flwr's
    console-script entry point), so that it runs in this process, after the patches above."""
    (entry,) = distribution("flwr").entry_points.select(group="console_scripts", name="flower-supernode")
    return entry.load()


def main() -> None:
    poll = os.environ.get("FEDSEG_FLOWER_NODE_POLL")
    if poll:
        cap_node_polling(float(poll))
        cap_object_pull_backoff(float(poll))
    flower_supernode = flower_supernode_command()
    show_log_timestamps()  # a site's log is read later, next to the coordinator's

    address = superlink_address(sys.argv)
    logging.getLogger("flwr").addFilter(QuietRetries(address))
    logging.getLogger("flwr").addFilter(ExplainActivation(insecure="--insecure" in sys.argv))
    logging.getLogger("flwr").addFilter(ExplainRuntimeSecret())
    forgotten = watch_for_a_forgotten_node(address)
    ca = option_value(sys.argv, "--root-certificates", "ca.crt")
    logging.getLogger("flwr").addFilter(ExplainCertificate(address, ca))
    sys.argv[0] = "flower-supernode"
    try:
        flower_supernode()
    except SystemExit as e:  # Flower's "terminated gracefully" after the 401: exit code 0
        if forgotten.said.is_set() and not e.code:
            raise SystemExit(FORGOTTEN_EXIT) from None
        raise
    if forgotten.said.is_set():
        raise SystemExit(FORGOTTEN_EXIT)


if __name__ == "__main__":
    main()
