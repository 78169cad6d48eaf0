"""Worker pool: the sites of an exchange answered in parallel by long-lived worker processes.

``fedseg run --workers W`` (config ``engine.workers``, W > 1). :class:`WorkerPool` starts W processes
(from a ``forkserver``, else ``spawn``: a fork of a process with torch threads running is unsafe) once per
run; each sets its own
torch thread count (``threads``) and device slot (``engine.devices``, round-robin; default the run's
``device``) and receives every site's ``SiteData`` once at start (its tensors cross as shared memory:
one copy for all workers). :class:`PoolEngine` is the engine of one algorithm on that pool; it adds
nothing to the exchange but ``deliver``: validation, failure policy, ledger and observers are
:class:`fedseg.engine.base.BaseEngine`'s, as on every engine.

Delivery. The sites of an exchange are sorted by expected cost (their split's size, largest first) and
each goes to whichever worker is free. A worker answers with :func:`fedseg.engine.context.answer` (the
same call as the simulator's, fault injection included), so a site's random stream depends on (seed,
site, round, action) only, never on the worker; ``BaseEngine`` then merges the replies in federation
order. Hence results are bit-identical for any W on CPU (same thread count per process: every worker
runs the same kernels as the simulator). On GPUs they are as reproducible as the simulator on the same
devices: identical where the kernels are deterministic (``torch.use_deterministic_algorithms``), and
only if every slot is the same GPU model.

Where the state stores live. In this process, in the run's :class:`fedseg.engine.state.StateStore`
(RAM or disk, as for the simulator): a site's store travels with its message to the worker and back
with the reply, and is saved only when the client returned (a site that fails keeps its store). So
any worker can serve any site, and checkpoints, resume and best-round restores work unchanged. Cost:
per message, the store crosses to the worker as shared memory (for FedAvg with Adam moments that is 3x the
model; the messages themselves are 1x), and back only if the client changed it (:func:`changed`; an
evaluation usually does not).

Transport. A message's tensors (and a store's) are packed into one buffer (:func:`pack`: one copy, 64-byte
aligned) and unpacked as views of it (no copy, same dtypes, shapes and bits). A buffer of at least
:data:`SHM_BYTES` crosses as shared memory (``torch.multiprocessing``: one handle, mapped by the receiver;
the message sent to every site is packed once and mapped by each worker); a smaller one as bytes in the
pipe. One handle per message, not one per tensor: handing a file descriptor over costs a socket
round-trip, which for a model of 30 tensors made an exchange of tiny sites 10x slower than its compute.

Failures. A worker that dies while answering (killed, ``os._exit``, out of memory) is the answer of
the site it served (:class:`WorkerDied`, naming the site, the worker's pid and exit code): under
``fl.on_failure = stop`` the run stops with a ``SiteFailure`` naming the site; under ``skip`` the site
is skipped and a new worker takes the dead one's place. ``fl.timeout_s`` works as on the simulator (a
reply later than that is refused); in addition a site still silent ``2 * fl.timeout_s +``
:data:`KILL_GRACE_S` seconds after it was sent has its worker killed and replaced. No worker outlives
the pool (``close``: asked to stop, then terminated, then killed; also on errors and Ctrl-C).

Imports. A worker imports every class of what it receives (a method's client, task, options) by module and name.
What it could not import is refused before it has to, in one ValueError (``fedseg.engine.worker_imports``): a
method whose classes are defined in a notebook's ``__main__`` or inside a function (``register``), a script that
starts the run at its top level, not under ``if __name__ == "__main__":`` (each worker runs the script's top level
again as it starts), or one read from standard input (``WorkerPool``). A context a worker still fails to load is
that method's error at every site it is asked to answer (one line), not a traceback from each worker.
"""

from __future__ import annotations

import math
import multiprocessing.connection as mpc
import pickle
import time
import traceback
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from itertools import count
from multiprocessing.reduction import ForkingPickler
from pathlib import Path
from types import CodeType
from typing import Any

import torch
import torch.multiprocessing as tmp

from fedseg.data.dataset import SiteData
from fedseg.engine.base import Observer
from fedseg.engine.context import Client, Delivery, MethodOptions, Task, answer
from fedseg.engine.forkserver import START_METHOD, ensure_server, import_while_waiting
from fedseg.engine.messages import Message, MetaValue
from fedseg.engine.own_code import keep_own_place, own_code
from fedseg.engine.simulator import SitesHereEngine
from fedseg.engine.state import StateStore
from fedseg.engine.worker_imports import check_main, check_sendable

KILL_GRACE_S = 30.0  # seconds past 2 * fl.timeout_s before a silent worker is killed (module docstring)
STOP_WAIT_S = 5.0  # seconds a worker gets to exit when the pool closes, before it is terminated

Answer = tuple[Message, float] | BaseException


# --- how tensors cross ---------------------------------------------------------------------------------------
SHM_BYTES = 1 << 20  # a packed payload this large crosses as shared memory; a smaller one as bytes in the pipe
ALIGN = 64  # bytes: every tensor of a pack starts at a multiple of this (any dtype can view it)


@dataclass
class Packed:
    """Named tensors in one buffer: ``index`` ``(name, dtype, shape, byte offset)``; ``data`` the buffer, a
    uint8 tensor (sent as shared memory: one handle instead of one per tensor) or ``bytes`` (small payloads)."""

    index: list[tuple[str, torch.dtype, tuple[int, ...], int]]
    data: torch.Tensor | bytes


def pack(tensors: dict[str, torch.Tensor]) -> Packed:
    """``tensors`` copied once into one buffer (module docstring: a pipe message per tensor costs far more)."""
    index, size = [], 0
    for name, t in tensors.items():
        index.append((name, t.dtype, tuple(t.shape), size))
        size += -(-t.numel() * t.element_size() // ALIGN) * ALIGN
    buffer = torch.empty(size, dtype=torch.uint8)
    for (_, dtype, shape, start), t in zip(index, tensors.values()):
        if t.numel():
            buffer[start : start + t.numel() * t.element_size()].view(dtype).view(shape).copy_(t.detach())
    return Packed(index, buffer if size >= SHM_BYTES else buffer.numpy().tobytes())


def unpack(packed: Packed) -> dict[str, torch.Tensor]:
    """The tensors of ``pack``: views of its buffer (no copy), same dtypes, shapes and bits."""
    data = packed.data
    if isinstance(data, torch.Tensor):
        buffer = data
    else:
        buffer = torch.frombuffer(bytearray(data), dtype=torch.uint8) if data else torch.empty(0, dtype=torch.uint8)
    out = {}
    for name, dtype, shape, start in packed.index:
        count = math.prod(shape)
        out[name] = buffer[start : start + count * dtype.itemsize].view(dtype).view(shape)
    return out


def pack_message(msg: Message) -> tuple[Packed, dict[str, MetaValue]]:
    return pack(msg.tensors), dict(msg.meta)


TensorsKey = tuple[tuple[str, int, int], ...]  # (name, id, version) per tensor


def tensors_key(tensors: dict[str, torch.Tensor]) -> TensorsKey:
    """What makes two messages' tensors the same (while both are alive): the same tensor objects under the same
    names, unchanged (version counters; an inference-mode tensor has none and cannot change outside it)."""
    return tuple((name, id(t), -1 if t.is_inference() else t._version) for name, t in tensors.items())


def unpack_message(packed: tuple[Packed, dict[str, MetaValue]]) -> Message:
    return Message(unpack(packed[0]), packed[1])


class WorkerDied(RuntimeError):
    """The worker process serving a site died before it replied."""


class RemoteError(RuntimeError):
    """A site's exception that could not be sent back as itself (not picklable): its type and message."""


# --- the worker process -------------------------------------------------------------------------------------
def worker_main(conn: Any, threads: int, device: str) -> None:
    """A worker's loop: ``("data", [SiteData])`` once, then ``("context", key, pickled)`` per algorithm
    (``pickled``: its ``(client, task, options, artifacts)``, :meth:`WorkerPool.context_item`),
    ``("answer", key, site, message, delivery, state)`` per message (replies ``("ok", reply, seconds, state)``,
    ``state`` None when the client left it unchanged, or ``("error", exception)``), ``("forget", key)``; ``None``
    ends it. A context this process cannot load (a class it cannot import) is every answer's error for that
    algorithm (one line per site in the parent), not a traceback and the end of the worker."""
    torch.set_num_threads(threads)
    data: dict[str, SiteData] = {}
    contexts: dict[str, tuple[Any, ...]] = {}
    unloadable: dict[str, str] = {}  # key -> why its context could not be loaded here
    method_codes: dict[str, set[CodeType]] = {}  # key -> a registered method's own client code (own_code)
    try:
        while True:
            try:
                item = conn.recv()
            except (EOFError, ConnectionResetError):  # the pool is gone (killed with a reply unread: a reset)
                return
            if item is None:
                return
            kind = item[0]
            if kind == "data":
                data = {d.name: d for d in item[1]}
            elif kind == "context":
                key, pickled = item[1:]
                try:
                    client, task, options, artifacts = ForkingPickler.loads(pickled)
                except Exception as e:  # noqa: BLE001 - reported by every answer of that algorithm
                    unloadable[key] = unloadable_text(key, e)
                    continue
                if task.cfg.device != device:  # this worker's device slot
                    task = replace(task, cfg=task.cfg.model_copy(update={"device": device}))
                contexts[key] = (client, task, options, artifacts)
                method_codes[key] = own_code(client if isinstance(client, type) else type(client))
                warm_up(task)
            elif kind == "forget":
                contexts.pop(item[1], None)
                method_codes.pop(item[1], None)
                unloadable.pop(item[1], None)
            elif kind == "answer":
                key, site, msg, to, state = item[1:]
                result: tuple[Any, ...]
                try:
                    if key in unloadable:
                        raise RuntimeError(unloadable[key])
                    client, task, options, artifacts = contexts[key]
                    state = unpack(state)
                    received = versions(state)
                    reply, seconds = answer(
                        client, unpack_message(msg), to, data[site], state, task, options, artifacts
                    )
                    result = ("ok", pack_message(reply), seconds, pack(state) if changed(state, received) else None)
                except Exception as e:  # noqa: BLE001 - the site's failure: the parent applies the policy
                    keep_own_place(e, method_codes.get(key, ()))  # its traceback stays here
                    result = ("error", portable(e))
                try:
                    conn.send(result)
                except (BrokenPipeError, ConnectionResetError):  # the pool is gone (its process killed): stop quietly
                    return
    except KeyboardInterrupt:  # Ctrl-C reaches the whole process group: the parent closes the pool
        return


def algorithm_of(key: str) -> str:
    """The algorithm's name in a pool key (``PoolEngine``: ``name#n``)."""
    return key.rsplit("#", 1)[0]


def unloadable_text(key: str, error: Exception) -> str:
    """The one line a site answers with when its worker could not load algorithm ``key``'s client, task, options."""
    return (
        f"the worker process could not load method {algorithm_of(key)!r} ({type(error).__name__}: {error}); "
        "define its classes in a .py module importable by the workers, or use engine.workers: 1"
    )


def versions(state: dict[str, torch.Tensor]) -> dict[str, tuple[torch.Tensor, int]]:
    """name -> (tensor, its version counter): what :func:`same_tensors` and :func:`changed` compare against."""
    return {k: (t, t._version) for k, t in state.items()}


def kept_in_ram(payload: Packed, site: str, store: StateStore) -> bool:
    """Whether ``site``'s store may keep ``payload``'s buffer: one in shared memory, for a store in RAM (in a file,
    keeping the buffer would defeat the memory budget)."""
    return isinstance(payload.data, torch.Tensor) and site not in store.on_disk


def same_tensors(state: dict[str, torch.Tensor], recorded: dict[str, tuple[torch.Tensor, int]]) -> bool:
    """Whether ``state`` holds exactly the ``recorded`` tensors (name -> (tensor, its version counter)): no entry
    added, removed or replaced, none changed in place."""
    return state.keys() == recorded.keys() and all(
        state[k] is t and t._version == version for k, (t, version) in recorded.items()
    )


def changed(state: dict[str, torch.Tensor], received: dict[str, tuple[torch.Tensor, int]]) -> bool:
    """Whether a client changed its store while answering: an entry added, removed or replaced (the store's
    contract, ``fedseg.engine.state``: a client changes the dict, never a stored tensor in place), or, to be safe,
    a received tensor changed in place (its version counter moved). An unchanged store is not sent back (an
    evaluation usually changes nothing: FedSM's stores, 3 models and their moments, crossed twice per site).
    ``received``: name -> (tensor, its version counter) as the worker received the store."""
    return not same_tensors(state, received)


def warm_up(task: Task) -> None:
    """Build ``task``'s network template now (``Task.new_model``; seeded in a forked RNG, so results are unchanged),
    while the parent still sets the algorithm up, instead of at the worker's first message. A failure is left
    for that message to report."""
    try:
        task.new_model()
    except Exception:  # noqa: BLE001 - reported where the site answers
        pass


def portable(error: Exception) -> BaseException:
    """``error`` with the worker's traceback as a note, if it pickles; else a ``RemoteError`` saying what it was."""
    error.add_note("in the worker process:\n" + "".join(traceback.format_exception(error)))
    try:
        pickle.loads(pickle.dumps(error))
        return error
    except Exception:  # noqa: BLE001 - any pickling problem
        return RemoteError(f"{type(error).__name__}: {error}")


# --- the pool -----------------------------------------------------------------------------------------------
@dataclass
class Worker:
    slot: int
    device: str
    process: Any
    conn: Any
    site: str | None = None  # the site it is answering, None when idle
    sent: float = 0.0  # time.monotonic() when that message was sent

    @property
    def pid(self) -> int:
        return int(self.process.pid)


@dataclass
class WorkerPool:
    """``workers`` long-lived worker processes holding ``site_data``; use as a context manager (``close``).

    ``threads``: torch threads per worker; ``devices``: device slots, assigned round-robin."""

    site_data: Sequence[SiteData]
    workers: int
    threads: int = 1
    devices: Sequence[str] = ("cpu",)
    slots: list[Worker] = field(default_factory=list, init=False)
    contexts: dict[str, tuple[Any, ...]] = field(
        default_factory=dict, init=False
    )  # key -> (client, task, options, artifacts)
    replaced: int = field(default=0, init=False)  # workers started to replace dead ones
    # (engine key, site) -> the store as last packed (a worker's reply or ``store_payload``), as saved (views of
    # its buffer), and that buffer: sent again as it is while the site's store is still exactly that (no copy)
    returned: dict[tuple[str, str], tuple[dict[str, tuple[torch.Tensor, int]], Packed]] = field(
        default_factory=dict, init=False
    )

    def __post_init__(self) -> None:
        if self.workers < 1:
            raise ValueError(f"engine.workers must be >= 1, got {self.workers}")
        if not self.devices:
            raise ValueError("engine.devices: give at least one device")
        check_main()  # a script every worker would fail to load (``fedseg.engine.worker_imports``)
        self._mp: Any = tmp.get_context(START_METHOD)
        ensure_server()  # started early by `fedseg run`; here for any other caller
        loading = import_while_waiting()  # the workers start once the process server has imported PRELOAD
        try:
            self.slots = [self._start(i) for i in range(self.workers)]
            for worker in self.slots:
                self._setup(worker)
        except BaseException:
            self.close()
            raise
        finally:
            loading.join()

    @property
    def pids(self) -> list[int]:
        return [w.pid for w in self.slots]

    def _start(self, slot: int) -> Worker:
        device = self.devices[slot % len(self.devices)]
        parent, child = self._mp.Pipe()
        process = self._mp.Process(
            target=worker_main, args=(child, self.threads, device), name=f"fedseg-worker-{slot}", daemon=True
        )
        process.start()
        child.close()
        return Worker(slot, device, process, parent)

    def _setup(self, worker: Worker) -> None:
        worker.conn.send(("data", list(self.site_data)))
        for key in self.contexts:
            worker.conn.send(self.context_item(key))

    def replace(self, worker: Worker) -> Worker:
        """Kill ``worker`` (if still alive) and start a new one in its slot."""
        _stop(worker, wait=0.0)
        new = self._start(worker.slot)
        self.slots[worker.slot] = new
        self.replaced += 1
        self._setup(new)
        return new

    def register(
        self, key: str, client: Client, task: Task, options: MethodOptions | None, artifacts: Path | None
    ) -> None:
        """Make an algorithm's client known to every worker (and to the workers started later). A ValueError, before
        any worker has it, where a worker could not load it (``fedseg.engine.worker_imports.check_sendable``: a
        class defined in a notebook's ``__main__`` or inside a function) or it cannot be pickled."""
        context = (client, replace(task), options, artifacts)  # replace: without the parent's model cache
        check_sendable(algorithm_of(key), context)
        self.contexts[key] = context
        try:
            item = self.context_item(key)
        except Exception as e:
            del self.contexts[key]
            raise ValueError(
                f"engine.workers > 1: method {algorithm_of(key)!r} cannot be sent to the worker processes "
                f"({type(e).__name__}: {e}); use engine.workers: 1"
            ) from e
        for i, worker in enumerate(list(self.slots)):
            self._send(worker, item if i == 0 else self.context_item(key))

    def context_item(self, key: str) -> tuple[str, str, bytes]:
        """The message that gives a worker context ``key``: pickled here, unpickled by the worker where it can
        report a failure (a class it cannot import) as the algorithm's error instead of dying. Pickled anew for
        each worker: a tensor crossing as a file descriptor can be taken once."""
        return ("context", key, bytes(ForkingPickler.dumps(self.contexts[key])))

    def forget(self, key: str) -> None:
        self.returned = {k: v for k, v in self.returned.items() if k[0] != key}
        if self.contexts.pop(key, None) is not None:
            for worker in list(self.slots):
                self._send(worker, ("forget", key))

    def _send(self, worker: Worker, item: tuple[Any, ...]) -> Worker:
        """Send ``item`` to ``worker``; a dead worker is replaced first (the item goes to its successor)."""
        for _ in range(2):
            if worker.process.is_alive():
                try:
                    worker.conn.send(item)
                    return worker
                except (BrokenPipeError, ConnectionResetError, EOFError):
                    pass
            worker = self.replace(worker)
        raise WorkerDied(
            f"a new worker process in slot {worker.slot} died at once (exit code {worker.process.exitcode})"
        )

    def close(self) -> None:
        """Ask every worker to stop, then terminate (and kill) any that does not within ``STOP_WAIT_S``."""
        for worker in self.slots:
            try:
                worker.conn.send(None)
            except (OSError, EOFError, ValueError):
                pass
        deadline = time.monotonic() + STOP_WAIT_S
        for worker in self.slots:
            _stop(worker, wait=max(0.0, deadline - time.monotonic()))
        self.contexts.clear()
        self.returned.clear()

    def __enter__(self) -> WorkerPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- one exchange -------------------------------------------------------------------------------------
    def run(
        self, key: str, jobs: list[tuple[str, Message, Delivery]], store: StateStore, timeout: float | None
    ) -> dict[str, Answer]:
        """Answer every ``(site, message, delivery)`` of ``jobs`` (in that order as workers free up) with
        context ``key``; each site's store is loaded from ``store`` and saved back when its client returned."""
        queue, answered = list(jobs), dict[str, Answer]()
        # each distinct set of tensors packed once: the sites' messages of an exchange usually carry the same
        # model (one Message per site, the same tensors), so it is copied and shared once, not once per site
        keys = {id(msg): tensors_key(msg.tensors) for _, msg, _ in jobs}
        packed: dict[TensorsKey, Packed] = {}
        for _, msg, _ in jobs:
            if keys[id(msg)] not in packed:
                packed[keys[id(msg)]] = pack(msg.tensors)
        limit = None if timeout is None else 2 * timeout + KILL_GRACE_S
        while queue or any(w.site is not None for w in self.slots):
            for worker in list(self.slots):
                if not queue:
                    break
                if worker.site is None:
                    site, msg, to = queue.pop(0)
                    payload = self.store_payload(key, site, store)
                    message = (packed[keys[id(msg)]], dict(msg.meta))
                    worker = self._send(worker, ("answer", key, site, message, to, payload))
                    worker.site, worker.sent = site, time.monotonic()
            busy = [w for w in self.slots if w.site is not None]
            ready = set(mpc.wait([w.conn for w in busy] + [w.process.sentinel for w in busy], timeout=1.0))
            for worker in busy:
                current = worker.site
                assert current is not None
                if worker.conn in ready or worker.process.sentinel in ready:
                    answered[current] = self._receive(worker, current, store, key)
                elif limit is not None and time.monotonic() - worker.sent > limit:
                    worker.site = None
                    answered[current] = TimeoutError(
                        f"no reply within fl.timeout_s = {timeout:g} s; the worker (pid {worker.pid}) was still "
                        f"silent after {limit:g} s and was replaced"
                    )
                    self.replace(worker)
        return answered

    def store_payload(self, key: str, site: str, store: StateStore) -> Packed:
        """``site``'s store packed for a worker: the buffer it was last packed in (by a worker's reply or here),
        while the store still holds exactly the tensors of that buffer (same objects, unchanged: as the
        simulator, the pool relies on clients changing a store's entries, never its tensors in place); otherwise
        a fresh copy (after a restore, a resume, a store on disk), which the store then holds (``keep``).
        Workers only read the buffer, so sending it again costs no copy: an evaluation after a best-round
        restore packs each site's store once, not once per exchange."""
        state = store.load(site)
        kept = self.returned.get((key, site))
        if kept is not None and same_tensors(state, kept[0]):
            return kept[1]
        self.returned.pop((key, site), None)
        payload = pack(state)
        if kept_in_ram(payload, site, store):
            self.keep(key, site, store, payload)
        return payload

    def keep(self, key: str, site: str, store: StateStore, payload: Packed) -> None:
        """Make the tensors packed in ``payload`` (views of its buffer, the same values) ``site``'s store, and
        remember the buffer for ``store_payload`` where :func:`kept_in_ram`."""
        views = unpack(payload)
        store.save(site, views)
        if kept_in_ram(payload, site, store):
            self.returned[(key, site)] = (versions(views), payload)

    def _receive(self, worker: Worker, site: str, store: StateStore, key: str) -> Answer:
        """The answer ``worker`` sent for ``site`` (its store saved if the client returned); a dead worker is
        replaced and its death is the answer."""
        worker.site = None
        try:
            if not worker.conn.poll():
                raise EOFError
            result = worker.conn.recv()
        except Exception:  # noqa: BLE001 - EOF, a broken pipe or a reply whose shared memory is gone
            worker.process.join(1.0)
            code = worker.process.exitcode
            self.replace(worker)
            return WorkerDied(
                f"the worker process answering site {site!r} (pid {worker.pid}) died"
                + (f" with exit code {code}" if code is not None else "")
            )
        if result[0] == "error":
            error: BaseException = result[1]
            return error
        _, reply, seconds, state = result
        if state is not None:  # None: the client left its store as it was (``changed``)
            self.returned.pop((key, site), None)  # the buffer of the store it replaces is freed with it
            self.keep(key, site, store, state)
        return unpack_message(reply), seconds


def _stop(worker: Worker, wait: float) -> None:
    """Make sure ``worker``'s process has ended: join for ``wait`` seconds, then terminate, then kill."""
    process = worker.process
    process.join(wait)
    if process.is_alive():
        process.terminate()
        process.join(2.0)
    if process.is_alive():
        process.kill()
        process.join()
    worker.conn.close()


# --- the engine ---------------------------------------------------------------------------------------------
_KEYS = count(1)


class PoolEngine(SitesHereEngine):
    """The engine of one algorithm on a :class:`WorkerPool` (see the module docstring)."""

    def __init__(
        self,
        algorithm: str,
        client: Client,
        pool: WorkerPool,
        site_data: list[SiteData],
        task: Task,
        options: MethodOptions | None = None,
        artifacts: Path | None = None,
        observers: list[Observer] | None = None,
        store: StateStore | None = None,
    ):
        super().__init__(algorithm, site_data, task, options, observers, store)
        self.pool = pool
        self.key = f"{algorithm}#{next(_KEYS)}"
        pool.register(self.key, client, task, options, artifacts)

    def expected_cost(self, site: str, msg: Message) -> int:
        """How long ``site`` is expected to take with ``msg``: the size of the split it works on."""
        split = msg.meta.get("split", "train")
        return self.num_samples(site, split if split in ("train", "val", "test") else "train")

    def deliver(self, order: list[str], messages: dict[str, Message], action: str) -> dict[str, Answer]:
        """Every site of ``order`` on the pool, most expensive first; a site's exception (or its worker's death)
        is its answer (``BaseEngine.exchange`` applies the failure policy)."""
        ranked = sorted(order, key=lambda s: (-self.expected_cost(s, messages[s]), order.index(s)))
        jobs = [(s, messages[s], self.delivery(s, action)) for s in ranked]
        return self.pool.run(self.key, jobs, self.store, self.task.cfg.fl.timeout_s)

    def close(self) -> None:
        """Forget this algorithm on the workers; remove the state files of ``engine.state: disk``."""
        self.pool.forget(self.key)
        super().close()
