"""What fedseg's two Flower task runners do alike: a site's ClientApp runner (``fedseg.flower.worker``, tasks from its
SuperNode) and the coordinator's ServerApp runner (``fedseg.flower.serverapp_runner``, tasks from its SuperLink).

Each is started by the process that runs its SuperNode or SuperLink, with that runtime's SuperExec secret on its
standard input (``fedseg.flower.runtime_secret``). It waits for the runtime's Runtime API on this machine to listen,
polls it for tasks with ``AcquireTask`` signed with the secret, starts a task's process with the task's token on that
process's standard input, and logs one task's failure and goes on with the next. One copy, so that how the two read
their secret, start a task and end on a failure cannot drift apart (the coordinator's runner ended on a Runtime API
error with one line while the site's still printed a traceback).
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, NoReturn, TypeVar

from fedseg.flower.runtime_secret import hand_over, handed_over

if TYPE_CHECKING:
    from flwr.supercore.runtime import RuntimeHttpClient

T = TypeVar("T")
RUNTIME_API_WAIT = 300.0  # s for the SuperNode or SuperLink that started the runner to listen (it starts in seconds)


def arguments(description: str, runtime: str, poll_help: str) -> argparse.ArgumentParser:
    """The options both runners take: the Runtime API of ``runtime`` (SuperNode, SuperLink) as HOST:PORT, TLS or
    ``--insecure``, ``--poll`` (s, ``poll_help``), ``--parent-pid`` and ``--task`` (one task, its token on standard
    input). A runner adds its own."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--runtime-api-address", required=True, help=f"the {runtime}'s Runtime API, host:port")
    parser.add_argument("--insecure", action="store_true")
    parser.add_argument("--root-certificates", default=None)
    parser.add_argument("--poll", type=float, default=1.0, help=poll_help)
    parser.add_argument("--parent-pid", type=int, default=None)
    parser.add_argument("--task", action="store_true", help="run one task and exit (its token on standard input)")
    return parser


def parse(parser: argparse.ArgumentParser) -> tuple[argparse.Namespace, str]:
    """The runner's options and the line its starter handed it: its Runtime API's secret (hex), or with ``--task``
    the task's token. Read first of all, before anything of a method is imported, and standard input then closed: no
    process the runner starts can read it."""
    args = parser.parse_args()
    return args, handed_over()


def signing_secret(handed: str) -> bytes | None:
    """The secret ``AcquireTask`` is signed with, from the hex line :func:`parse` read (None where there was none: a
    runner started by hand, whose calls Flower refuses). ValueError where it is not hex."""
    return bytes.fromhex(handed) or None


def no_retry_warnings(record: logging.LogRecord) -> bool:
    """Flower's retry warnings are none of a runner's to say: its Runtime API is that of the SuperNode or SuperLink
    that started it, on this machine, waited for before the first poll (:func:`runtime_client`); once that process
    stops (Ctrl-C, a restart), the polls the runner makes in the moment before it exits with it would each print one
    after that process's last line."""
    from fedseg.flower.supernode_main import RETRYING

    return not record.getMessage().startswith(RETRYING)


def configure_logging() -> None:
    """Log INFO and above to standard error with time, level and logger; httpx's line per request and Flower's retry
    warnings (:func:`no_retry_warnings`) left out."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)
    logging.getLogger("flwr").addFilter(no_retry_warnings)


@contextlib.contextmanager
def exits_in_one_line(runner: str) -> Iterator[None]:
    """End the process on a failure of the block without a traceback. Ctrl-C in the terminal, which reaches the whole
    process group (the SuperNode says that it stops), exits 130 unsaid; the Runtime API not listening within
    :data:`RUNTIME_API_WAIT` s (TimeoutError) or failing a call (``httpx.HTTPError``), a secret that is not hex
    (ValueError) and any other OSError or RuntimeError print ``<runner>: <reason>`` on standard error and exit 1."""
    import httpx

    try:
        yield
    except KeyboardInterrupt:
        sys.exit(130)
    except (OSError, RuntimeError, ValueError, httpx.HTTPError) as e:
        print(f"{runner}: {e}", file=sys.stderr, flush=True)
        sys.exit(1)


def runtime_client(
    address: str, insecure: bool, root_certificates: str | None, secret: bytes | None, what: str
) -> RuntimeHttpClient:
    """A client of the Runtime API at ``address`` (HOST:PORT, an IPv6 host in brackets) that signs ``AcquireTask``
    with ``secret``, once that API listens: Flower would print a retry line per poll meanwhile. TimeoutError naming
    ``what`` where it does not within :data:`RUNTIME_API_WAIT` s."""
    from fedseg.flower import flwr_internals as internals
    from fedseg.flower.deploy import wait_for_port

    host, _, port = address.rpartition(":")
    wait_for_port(host.strip("[]"), int(port), RUNTIME_API_WAIT, what=what)
    return internals.superexec_runtime_client(address, insecure, root_certificates, secret)


def poll(acquire: Callable[[], T | None], handle: Callable[[T | None], None], seconds: float) -> NoReturn:
    """Acquire tasks for ever: ``handle`` what each ``acquire`` (one ``AcquireTask``) returns, None where no task was
    pending (for a runner with work between tasks); wait ``seconds`` after such a call only, so that tasks queued in
    a row start at once."""
    while True:
        acquired = acquire()
        handle(acquired)
        if acquired is None:
            time.sleep(seconds)


def start_task(command: list[str], token: str) -> subprocess.Popen:
    """``command``, a process running one task, started with the task's ``token`` on its standard input: never in its
    arguments (``ps`` shows them to every user of the machine) nor in its environment (its children inherit it). Killed
    where the token cannot be handed over."""
    task = subprocess.Popen(command, stdin=subprocess.PIPE)  # noqa: S603
    try:
        hand_over(task, token)
    except BaseException:
        end(task)
        raise
    return task


def run_task_process(command: list[str], token: str) -> int:
    """:func:`start_task`, then wait for the task to end: its exit status. The runner stopping meanwhile (Ctrl-C) takes
    the task with it, as ``subprocess.run`` would."""
    task = start_task(command, token)
    try:
        return task.wait()
    finally:
        end(task)


def end(task: subprocess.Popen) -> None:
    """Kill ``task`` where it still runs, and reap it."""
    if task.poll() is None:
        task.kill()
        task.wait()


@contextlib.contextmanager
def one_task(log: logging.Logger, failed: str, *args: object) -> Iterator[None]:
    """Contain a failure of the block, which handles one task: log ``failed % args`` with its traceback and go on. One
    task's failure (its process not started, its reply not pushed) is not the runner's, which serves every other task
    of the site or the coordinator (a runner that ends takes its SuperNode or SuperLink with it)."""
    try:
        yield
    except Exception:  # noqa: BLE001 - logged with its traceback; the runner goes on with the next task
        log.exception(failed, *args)
