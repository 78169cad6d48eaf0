"""``FlowerEngine``: the simulator's interface over a Flower ``Grid`` (runs inside the ServerApp).

Algorithm servers see the same engine as in the simulator: ``sites``, ``algorithm``, ``round``,
``exchange({site: Message}, action) -> {site: reply}``, ``ledger``, ``num_samples``,
``snapshot_clients`` / ``restore_clients`` / ``client_states``. Underneath,

- sites are mapped to Flower node ids by asking every connected SuperNode which site its node
  config names (``connect_sites``), never by position;
- each ``exchange`` becomes one Flower message per site, of type ``train.<action>`` (or
  ``evaluate.<action>`` for the evaluation actions of ``fedseg.engine.ledger.EVAL_ACTIONS``),
  group id = round, carrying the fedseg message (``fedseg.flower.records``) and a header with
  the algorithm, site, site index and round; all sites work in parallel;
- the ledger counts the floats of the fedseg messages, as the simulator does; ``seconds`` is
  the compute time the site measured around ``Client.handle``;
- client states live on the nodes (Flower's ``Context.state``): ``snapshot_clients`` asks every
  node to save its store as the snapshot of the current round and returns a token naming it (the
  checkpoint holds the token); ``restore_clients`` asks every node to put a snapshot back. Nothing of
  a site's state reaches the server. Each snapshot request names the snapshots the coordinator may
  still restore (those of the last checkpoint on disk, of its best round, and any taken since);
  nodes delete the rest (``fedseg.flower.snapshots``). A run can be resumed from its checkpoint when
  every SuperNode keeps its snapshots on disk (``--state DIR``): the coordinator then asks each site
  to restore the snapshot of the checkpointed round.
"""

from __future__ import annotations

import json
import logging
import math
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, cast

import torch
from flwr.app import ConfigRecord, Error, RecordDict
from flwr.app import Message as FlowerMessage

from fedseg.engine.base import BaseEngine, ClientStates, ReplyCheck, both_checks
from fedseg.engine.context import Task
from fedseg.engine.ledger import EVAL_ACTIONS
from fedseg.engine.messages import Message
from fedseg.flower.log_text import SITE_LINE, printable, site_text
from fedseg.flower.node import INFO, LABELS, ORIENTATIONS, REFUSED, RELEASE, RESTORE, SNAPSHOT
from fedseg.flower.records import ENGINE, case_ids_problem, from_recorddict, record_bytes, to_recorddict

if TYPE_CHECKING:
    from fedseg.data.check import SiteLabels
    from fedseg.data.federation import Regions

log = logging.getLogger("fedseg.flower.engine")

SNAPSHOT_KEY = "flower_snapshot"  # token returned by snapshot_clients: {site: {SNAPSHOT_KEY: tensor(round)}}


class SiteError(RuntimeError):
    """A site answered with an error (data check, exception in its client): the message says which and why."""


@dataclass
class SiteMap:
    """Which Flower node serves which site, and each site's split sizes and voxel orientations (from its ``info``
    reply; ``orientations``: axis codes -> number of cases, ``fedseg.data.reorient.site_orientations``, of the sites
    that reported any)."""

    sites: list[str]
    nodes: dict[str, int] = field(default_factory=dict)
    sizes: dict[str, dict[str, int]] = field(default_factory=dict)
    orientations: dict[str, dict[str, int]] = field(default_factory=dict)
    labels: dict[str, SiteLabels] = field(default_factory=dict)  # what each site's label files hold, counted

    def orientation(self) -> str | None:
        """The one voxel orientation every case of every site lies in, as they reported it; None where there is not
        one (``fedseg.data.reorient.deployment_orientation``): what the run's model bundles record."""
        from fedseg.data.reorient import deployment_orientation

        return deployment_orientation(self.sites, self.orientations)

    def orientation_warnings(self) -> list[str]:
        """One line where the sites' volumes lie in several voxel orientations, naming each site with its own and
        what to do (``fedseg.data.check.site_orientation_warnings``); none otherwise."""
        from fedseg.data.check import site_orientation_warnings

        return site_orientation_warnings({s: self.orientations[s] for s in self.sites if s in self.orientations})

    def label_warnings(self, regions: Regions) -> list[str]:
        """One line per region some sites' labels hold and others' never do (sites annotating different structures,
        ``fedseg.data.check.region_site_warnings``, as ``fedseg run``'s data check says it); none otherwise."""
        from fedseg.data.check import region_site_warnings

        return region_site_warnings(regions, {s: self.labels[s] for s in self.sites if s in self.labels})


class Courier:
    """Push messages through the Grid and collect their replies, polling every ``poll`` seconds
    (Flower's ``Grid.send_and_receive`` polls every 3 s)."""

    def __init__(self, grid, poll: float = 0.05, timeout: float | None = None):
        self.grid, self.poll, self.timeout = grid, poll, timeout

    def push(self, messages: list[FlowerMessage], refusals: bool = False) -> list[str]:
        """The ids of ``messages`` once pushed. The SuperLink refuses a message for a SuperNode it no longer
        counts as connected (one that stopped): its id is ``""`` with ``refusals``, else a RuntimeError."""
        ids = [i or "" for i in self.grid.push_messages(messages)]
        if len(ids) != len(messages) or (not refusals and not all(ids)):
            raise RuntimeError(f"the SuperLink accepted only {sum(map(bool, ids))} of {len(messages)} messages")
        return ids

    def collect(
        self, ids: list[str], what: str, names: list[str], timeout: float | None = None, partial: bool = False
    ) -> list[FlowerMessage | None]:
        """Replies to ``ids`` (same order); ``names`` label the messages in a timeout error. ``timeout``
        (default: the courier's) ends the wait; with ``partial`` a missing reply is None instead of an error."""
        pending, replies = set(ids), {}
        timeout = self.timeout if timeout is None else timeout
        deadline = None if timeout is None else time.monotonic() + timeout
        while pending:
            before = len(pending)
            for reply in self.grid.pull_messages(list(pending)):
                replies[reply.metadata.reply_to_message_id] = reply
                pending.discard(reply.metadata.reply_to_message_id)
            if not pending:
                break
            if deadline is not None and time.monotonic() > deadline:
                if partial:
                    break
                late = [n for n, i in zip(names, ids) if i in pending]
                raise TimeoutError(f"{what}: no reply from {', '.join(late)} within {timeout:.0f} s")
            if len(pending) == before:  # after replies, pull again at once: sites answer together, Flower pulls them
                time.sleep(self.poll)  # one after another, so the next is often in already (50 ms saved per exchange)
        return [replies.get(i) for i in ids]

    def send(
        self,
        messages: list[FlowerMessage],
        what: str,
        names: list[str],
        timeout: float | None = None,
        partial: bool = False,
    ) -> list[FlowerMessage | None]:
        """The reply to each of ``messages`` (same order), None where none came within ``timeout`` (with
        ``partial``, else a TimeoutError). A message the SuperLink refused gets an error reply saying so, as a
        message to a SuperNode that stopped after it was sent gets Flower's node-unavailable error: the site
        failed (``fl.on_failure`` applies), not the run."""
        from fedseg.flower.flwr_internals import node_left_error_code

        start = time.perf_counter()
        ids = self.push(messages, refusals=True)
        pushed = time.perf_counter()
        accepted = [(i, n) for i, n in zip(ids, names) if i]
        replies = iter(self.collect([i for i, _ in accepted], what, [n for _, n in accepted], timeout, partial))
        log.debug("%s: pushed in %.3f s, replies after %.3f s", what, pushed - start, time.perf_counter() - pushed)
        refused = Error(
            code=node_left_error_code(),
            reason="the SuperLink refused the message: it no longer counts this site's SuperNode as connected",
        )
        return [next(replies) if i else FlowerMessage(refused, reply_to=m) for i, m in zip(ids, messages)]


def check_reply(reply: FlowerMessage, who: str, what: str) -> None:
    """Raise ``SiteError`` with the site's own reason if ``reply`` is an error."""
    if reply.has_error():
        raise SiteError(f"{who} failed during {what}:{SITE_LINE}{site_text(reply.error.reason or '')}")


def query(site: str, node: int, action: str, header: dict) -> FlowerMessage:
    return FlowerMessage(
        RecordDict({ENGINE: ConfigRecord({"site": site, **header})}), dst_node_id=node, message_type=f"query.{action}"
    )


MAX_REPORT_CHARS = 10_000  # characters of one JSON entry of a node's info reply (counts: a few hundred at most)


def reported(info: dict, key: str, who: str, what: str, problem: Callable[[object], str | None]) -> object:
    """The JSON entry ``key`` of a node's answer to the data check (``info``; taken out of it), or None where the
    node sent none; ``SiteError`` naming ``who`` and ``what`` it is where the text is no JSON, longer than
    :data:`MAX_REPORT_CHARS`, or what ``problem`` (None: fine) refuses (none of it reaches a log line or a bundle)."""
    if key not in info:
        return None
    raw, found = str(info.pop(key)), None
    if len(raw) > MAX_REPORT_CHARS:
        why: str | None = f"longer than {MAX_REPORT_CHARS:,} characters"
    else:
        try:
            found = json.loads(raw)
            why = problem(found)
        except RecursionError:  # JSON nested deeper than Python's stack (not a ValueError)
            why = "nested too deep"
        except ValueError as e:  # not JSON; what ``problem`` raises
            why = str(e) or "not JSON"
    if why is not None:
        raise SiteError(f"{who} reported {what} as {printable(raw)[:60]!r}: {printable(why)}")
    return found


def site_orientations(info: dict, who: str) -> dict[str, int] | None:
    """A node's voxel orientations from its answer to the data check (``info``, whose ``orientations`` entry is
    taken out): axis codes -> number of cases (``fedseg.data.reorient.site_orientations``); None where it reports
    none (a site without volumes with a grid: the reply as before); ``SiteError`` naming ``who`` for anything else
    than such counts."""
    from fedseg.data.reorient import orientation_counts_problem

    def problem(counts: object) -> str | None:
        return orientation_counts_problem(counts) or (None if counts else "no orientation")

    return cast(dict[str, int] | None, reported(info, ORIENTATIONS, who, "its voxel orientations", problem))


def site_labels(info: dict, who: str) -> SiteLabels | None:
    """What a node's label files hold (``info``'s ``labels`` entry, taken out: ``fedseg.data.check.SiteLabels``);
    None where it reports none (the reply as before); ``SiteError`` naming ``who`` for anything else."""
    from fedseg.data.check import SiteLabels

    def problem(record: object) -> None:
        SiteLabels.from_record(record)  # a ValueError says why not

    record = reported(info, LABELS, who, "what its label files hold", problem)
    return None if record is None else SiteLabels.from_record(record)


def split_sizes(info: dict, who: str) -> dict[str, int]:
    """A node's answer to the data check, ``{split: number of cases}`` (the sizes its aggregation weights are checked
    against, ``fedseg.engine.faults.reply_problem``); ``SiteError`` naming ``who`` for a size that is not a whole
    number >= 0 or for a train, val or test split it does not report (the engine reads all three)."""
    sizes = {}
    for split, value in info.items():
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise SiteError(
                f"{who} reported {printable(str(split))[:40]} = {value!r:.40} cases; a split's size is a whole "
                "number >= 0"
            )
        sizes[split] = value
    missing = [split for split in ("train", "val", "test") if split not in sizes]
    if missing:
        raise SiteError(f"{who} reported no size of its {missing[0]} split")
    return sizes


RELEASE_WAIT = 60.0  # s the coordinator waits for the sites to delete a finished algorithm's snapshots
REFUSED_RETRY = 5.0  # seconds before a refused node is asked again (its SuperNode may have been restarted)


def connect_sites(
    courier: Courier, sites: list[str], header: dict, wait: float, node_sites: dict[int, str] | None = None
) -> SiteMap:
    """Map every site of the federation to the SuperNode that serves it.

    Every connected node gets an ``info`` query; it answers with the site of its node config
    after a full data check of its folder (an error reply -- e.g. the data check's list of
    problems -- fails the run at once; a node that stops before it answers is forgotten, logged once, and its
    site waited for, e.g. a refused SuperNode the hospital stops to restart it). Every site is required: the run
    fails with a clear
    message if one has not answered within ``wait`` seconds (e.g. its SuperNode is down or, with
    node authentication on, its public key is not registered). Nodes naming a site outside the
    federation are ignored (logged); two nodes naming the same site fail the run.

    ``node_sites`` (with SuperNode authentication: node id -> the site whose public key was registered
    under that id, ``fedseg flower server --auth-keys``): a node's identity is its key, not what it
    declares. A node whose id is not there, or that declares another site than its key's, is refused
    (a WARNING naming it in the coordinator's log and console and in the node's own log, once per node and reason)
    and asked again every
    ``REFUSED_RETRY`` seconds (the hospital may restart it with the right settings).
    """
    from fedseg.flower.flwr_internals import node_left_error_code

    grid = courier.grid
    found = SiteMap(list(sites))
    asked: dict[int, str] = {}  # node id -> message id of its info query
    pending: dict[str, int] = {}  # message id -> node id
    refused: dict[int, tuple[float, str]] = {}  # node id -> (when to ask again, why it was refused)
    deadline = time.monotonic() + wait
    head = {"header": json.dumps(header)}

    notices: set[str] = set()  # message ids of refusal notices (their replies are not info answers)

    def refuse(node: int, why: str, notify: bool = True) -> None:
        """Not (yet) this site's node: ask again in ``REFUSED_RETRY`` s. The first time for this reason a WARNING here
        and, if ``notify``, the same line in the node's own log (a ``refused`` query), so its hospital sees why."""
        repeated = refused.get(node, (0.0, ""))[1] == why  # asked again and refused for the same reason: no new line
        (log.debug if repeated else log.warning)("SuperNode %s %s", node, why)
        refused[node] = (time.monotonic() + REFUSED_RETRY, why)
        if notify and not repeated:
            try:  # a courtesy: a node the SuperLink no longer knows cannot be told, and the run goes on
                (notice,) = courier.push([query("?", node, REFUSED, {"why": why})])
            except RuntimeError as e:
                log.debug("SuperNode %s: refusal notice not sent (%s)", node, e)
                return
            notices.add(notice)
            pending[notice] = node

    while True:
        now = time.monotonic()
        awaiting = set(pending.values())  # a node is asked again only once it answered: two queries in flight to
        # a refused node both answered by its restarted SuperNode would name that one node twice for its site
        new = [
            n
            for n in grid.get_node_ids()
            if n not in awaiting
            and (n not in asked or (n in refused and now >= refused[n][0]))
            and n not in found.nodes.values()
        ]
        for n in [n for n in new if node_sites is not None and n not in node_sites]:
            new.remove(n)
            asked[n] = ""
            if n not in refused:
                refuse(n, "refused: its key is not among the registered sites' keys (--auth-keys)")
        if new:
            ids = courier.push([query("?", n, INFO, head) for n in new], refusals=True)
            sent = [(n, i) for n, i in zip(new, ids) if i]  # a node gone since it was listed is not asked
            asked.update(sent)
            pending.update((i, n) for n, i in sent)
        for reply in grid.pull_messages(list(pending)) if pending else []:
            node = pending.pop(reply.metadata.reply_to_message_id)
            if reply.metadata.reply_to_message_id in notices:
                continue  # the node logged its refusal
            if reply.has_error() and reply.error.code == node_left_error_code():
                refuse(node, "stopped before it answered; its site is waited for (a restart is asked again)", False)
                continue
            check_reply(reply, f"SuperNode {node}", "the data check before round 1")
            info = dict(reply.content[ENGINE]) if ENGINE in reply.content.config_records else {}
            if "site" not in info:
                raise SiteError(f"SuperNode {node} answered the data check without naming its site: not fedseg's")
            site = str(info.pop("site"))
            if node_sites is not None and node_sites[node] != site:
                key_site = node_sites[node]
                refuse(node, f"refused: it declares site {site!r} but authenticated with the key of site {key_site!r}")
                continue
            refused.pop(node, None)
            if site not in found.sites:
                log.warning(
                    "SuperNode %s serves site %r, which is not in this federation (%s): ignored", node, site, sites
                )
                continue
            if site in found.nodes:
                raise SiteError(
                    f"two SuperNodes ({found.nodes[site]} and {node}) both serve site {site!r}; stop one of them"
                )
            who = f"SuperNode {node} (site {site!r})"
            orientations, labels = site_orientations(info, who), site_labels(info, who)
            found.nodes[site], found.sizes[site] = node, split_sizes(info, who)
            if orientations is not None:
                found.orientations[site] = orientations
            if labels is not None:
                found.labels[site] = labels
            seen = f"; orientations: {', '.join(f'{c} {n}' for c, n in orientations.items())}" if orientations else ""
            log.info("site %s -> SuperNode %s (%s%s)", site, node, found.sizes[site], seen)
        missing = [s for s in found.sites if s not in found.nodes]
        if not missing:
            return found
        if time.monotonic() > deadline:
            also = "".join(f"; SuperNode {n} {why}" for n, (_, why) in refused.items())
            raise SiteError(
                f"site{'s' if len(missing) > 1 else ''} {', '.join(missing)} did not connect within {wait:.0f} s "
                f"(connected: {', '.join(found.nodes) or 'none'}{also}). Every site of the federation is required: "
                "start its SuperNode (`fedseg flower supernode --site NAME ...`); "
                "with node authentication on, register its public key."
            )
        time.sleep(courier.poll)


class FlowerEngine(BaseEngine):
    """The engine for one algorithm run over Flower. See the module docstring."""

    def __init__(self, algorithm: str, courier: Courier, site_map: SiteMap, task: Task, options=None, observers=None):
        super().__init__(algorithm, site_map.sites, task, options, observers)
        self.courier = courier
        self.site_map = site_map
        self.client_states: dict = {}  # client states live on the SuperNodes
        self._exchanges = 0  # exchanges so far; a restore right after its snapshot changes nothing
        self._snapshot: tuple[int, int] | None = None  # (tag, exchanges at that time) of the last snapshot
        self._taken: set[int] = set()  # snapshot tags the coordinator may still restore (see ``checkpointed``)
        self._taken_lock = threading.Lock()  # ``checkpointed`` runs on the checkpoint writer's thread
        self._bytes: dict[str, tuple[int, int]] = {}  # site -> bytes (down, up) of the exchange under way

    def num_samples(self, site: str, split: str = "train") -> int:
        return self.site_map.sizes[site][split]

    @property
    def secure(self) -> bool:
        """Whether the ``train`` exchanges run Flower's SecAgg+ (``fl.secure_aggregation``; fedseg.flower.secure)."""
        from fedseg.flower.secure import SECAGG, secure_methods

        return self.task.cfg.fl.secure_aggregation == SECAGG and self.algorithm in secure_methods()

    def exchange(
        self, messages: dict[str, Message], action: str, check: ReplyCheck | None = None
    ) -> dict[str, Message]:
        """``BaseEngine.exchange``; under secure aggregation the ``train`` exchange is SecAgg+'s (every reply is
        the weighted average; ``fedseg.flower.secure``; ``check`` runs on the reply each site's description of its
        vector rebuilds). Rows of plain exchanges get the bytes each message had.
        Evaluation replies must name their cases by the opaque ids every site sends (``case_ids_problem``)."""
        if action == "train" and self.secure:
            return self.secure_exchange(messages, check)
        if action in EVAL_ACTIONS:
            check = both_checks(case_ids_problem, check)
        number = self.ledger.next_exchange()
        self._bytes = {}
        replies = super().exchange(messages, action, check)
        for row in self.ledger.rows:
            if row.exchange == number and row.site in self._bytes:
                row.bytes_down, row.bytes_up = self._bytes[row.site]
        return replies

    def secure_exchange(self, messages: dict[str, Message], check: ReplyCheck | None = None) -> dict[str, Message]:
        from fedseg.engine.faults import SiteFailure
        from fedseg.flower.secure import secure_train

        unknown = sorted(set(messages) - set(self.sites))
        if unknown:
            raise KeyError(f"messages for unknown sites {unknown}; sites are {self.sites}")
        order = [s for s in self.sites if s in messages]
        self._exchanges += 1
        replies = secure_train(self, order, messages, check)
        if len(replies) < len(order) and (self.all_sites_required or len(replies) < self.task.cfg.fl.min_sites):
            raise SiteFailure(
                f"round {self.round}: only {len(replies)} of {len(order)} sites took part in the secure aggregation"
            )
        for site, reply in replies.items():
            for observe in self.observers:
                observe(site, "train", messages[site], reply)
        return replies

    def deliver(
        self, order: list[str], messages: dict[str, Message], action: str
    ) -> dict[str, tuple[Message, float] | BaseException]:
        """One Flower message per site (all in parallel); ``seconds`` is what the site measured. A site's error
        reply, or no reply within ``fl.timeout_s``, is its answer (``BaseEngine.exchange`` applies the policy)."""
        category = "evaluate" if action in EVAL_ACTIONS else "train"
        out = [
            FlowerMessage(
                to_recorddict(messages[s], asdict(self.delivery(s, action))),
                dst_node_id=self.site_map.nodes[s],
                message_type=f"{category}.{action}",
                group_id=str(self.round),
            )
            for s in order
        ]
        what = f"{self.algorithm} {action} (round {self.round})"
        self._exchanges += 1
        answered: dict[str, tuple[Message, float] | BaseException] = {}
        timeout = self.task.cfg.fl.timeout_s
        replies = self.courier.send(out, what, order, timeout, timeout is not None)
        for site, sent, flower_reply in zip(order, out, replies):
            if flower_reply is None:
                answered[site] = TimeoutError(f"no reply within fl.timeout_s = {timeout:g} s")
            elif flower_reply.has_error():
                answered[site] = SiteError(site_text(flower_reply.error.reason or "an error"))
            else:
                try:  # a reply fedseg's ClientApp did not write is the site's failure, not the coordinator's crash
                    reply, head = from_recorddict(flower_reply.content)
                    seconds = float(head.get("seconds", 0.0))
                except (KeyError, ValueError, TypeError, AttributeError) as error:
                    answered[site] = SiteError(f"its reply is no fedseg message ({type(error).__name__}: {error})")
                    continue
                if not (math.isfinite(seconds) and seconds >= 0):  # the ledger's compute time, the cost model's
                    answered[site] = SiteError(f"its compute time {seconds!r} is no number of seconds >= 0")
                    continue
                answered[site] = (reply, seconds)
                self._bytes[site] = (record_bytes(sent.content), record_bytes(flower_reply.content))
        return answered

    def _query_all(self, action: str, header: dict[str, dict]) -> None:
        """Send query ``action`` with ``header[site]`` to every site; under ``fl.on_failure = skip`` a site that
        fails or does not answer within ``fl.timeout_s`` is logged and left out (else the run stops)."""
        msgs = [
            query(s, self.site_map.nodes[s], action, {"algorithm": self.algorithm, **header[s]}) for s in self.sites
        ]
        what = f"{self.algorithm} {action} (round {self.round})"
        timeout = self.task.cfg.fl.timeout_s
        skip = self.skips_failures
        for site, reply in zip(self.sites, self.courier.send(msgs, what, self.sites, timeout, skip)):
            try:
                if reply is None:
                    raise SiteError(f"site {site!r}: no reply to {what} within fl.timeout_s = {timeout:g} s")
                check_reply(reply, f"site {site!r}", what)
            except SiteError as e:
                if not skip:
                    raise
                if site not in self.failing:  # as BaseEngine.failure: once, until the site answers again
                    self.failing.add(site)
                    log.warning("%s (fl.on_failure = skip: left out until it answers again)", e)

    def snapshot_clients(self) -> ClientStates:
        """Every node saves its store as the snapshot of this round; the token names it (its round). Nodes
        delete their snapshots the coordinator can no longer ask for."""
        with self._taken_lock:
            self._taken.add(self.round)
            keep = json.dumps(sorted(self._taken))
        self._query_all(SNAPSHOT, {s: {"tag": self.round, "keep": keep} for s in self.sites})
        self._snapshot = (self.round, self._exchanges)
        return {s: {SNAPSHOT_KEY: torch.tensor(self.round)} for s in self.sites}

    def checkpointed(self, kept: list[ClientStates]) -> None:
        """A checkpoint naming the snapshots ``kept`` (its round's and its best round's tokens) is on disk:
        the snapshots taken before it that it does not name will never be restored (they are deleted at the
        next snapshot). Runs on the checkpoint writer's thread: only updates the set of tags."""
        named = {int(states[SNAPSHOT_KEY]) for token in kept for states in token.values() if SNAPSHOT_KEY in states}
        if named:
            with self._taken_lock:
                self._taken = named | {t for t in self._taken if t > max(named)}

    def close(self) -> None:
        """The algorithm finished and its finished checkpoint is on disk (a resume reads nothing of the sites): every
        site drops its state store and deletes its snapshots of it (``release``), so a ``--state`` folder does not
        grow with every run. Best effort, within ``RELEASE_WAIT`` s: a site that fails or does not answer keeps its
        files (a WARNING names it; a site already left out under ``fl.on_failure: skip`` is not asked); the results
        stand."""
        sites = [s for s in self.sites if s not in self.failing]  # a site left out (on_failure: skip): not asked
        msgs = [query(s, self.site_map.nodes[s], RELEASE, {"algorithm": self.algorithm}) for s in sites]
        what = f"{self.algorithm} release of the sites' snapshots"
        timeout = min(RELEASE_WAIT, self.task.cfg.fl.timeout_s or RELEASE_WAIT)
        try:
            replies = self.courier.send(msgs, what, sites, timeout, partial=True)
        except Exception as e:  # noqa: BLE001 - the results are on disk: a lost request only leaves files behind
            log.warning("%s not sent (%s): their --state folders keep them", what, e)
            return
        for site, reply in zip(sites, replies):
            if reply is None or reply.has_error():
                why = "no reply" if reply is None else site_text(reply.error.reason or "an error").partition("\n")[0]
                log.warning(
                    "site %r did not delete its snapshots of %s (%s): its --state folder keeps them",
                    site,
                    self.algorithm,
                    why,
                )

    def restore_clients(self, states: dict[str, dict[str, torch.Tensor]]) -> None:
        """Every node puts back the snapshot named by ``states`` (a token from ``snapshot_clients``).
        Skipped when that snapshot is the last one and no exchange happened since (the states are it)."""
        missing = [s for s in self.sites if SNAPSHOT_KEY not in states.get(s, {})]
        if missing:
            raise ValueError(
                f"the checkpoint names no snapshot on the sites for {missing}: it was not written by a Flower run "
                "(a run resumes on the engine that started it)"
            )
        tags = {s: int(states[s][SNAPSHOT_KEY]) for s in self.sites}
        if (
            self._snapshot is not None
            and set(tags.values()) == {self._snapshot[0]}
            and self._exchanges == self._snapshot[1]
        ):
            log.debug("%s restore of snapshot %d skipped: nothing changed since", self.algorithm, self._snapshot[0])
            return
        self._query_all(RESTORE, {s: {"tag": tags[s]} for s in self.sites})
        with self._taken_lock:
            self._taken |= set(tags.values())
