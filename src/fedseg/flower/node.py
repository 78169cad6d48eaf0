"""The site side of a Flower deployment: what fedseg's ClientApp does with each message.

A SuperNode is started with node config ``site=NAME data=ROOT [samples=DIR] [state=DIR]``: ``ROOT``
is a folder federation (``federation.yaml`` + at least the folder of ``NAME``); data never leaves
the node; ``state`` keeps the snapshots of the site's state store on disk, so that the run can be
resumed (``fedseg.flower.snapshots``). For every message the ClientApp

1. reads the run's fedseg config (run config ``fedseg-config``) and the engine header of the
   message (algorithm, action, site index, round: the server's, so the random stream
   ``stream_seed(seed, site_index, round, action)`` is the simulator's);
2. loads its site's splits (``site_splits``: they depend only on seed, site name and case ids,
   so they equal the simulator's) at model resolution; every case id (a hospital's file name) is then
   replaced by an opaque one (``case-0001``, ...: ``opaque_case_ids``) before the algorithm sees the
   data, so nothing the site sends names a file; the mapping stays on the site
   (``<samples>/case-ids__<site>.csv``, ``case_ids_file``);
3. restores the site's persistent state store for the algorithm from Flower's ``Context.state``
   (Flower runs one process per message: nothing else survives), builds the algorithm's
   Client, answers through ``Client.handle`` exactly as the simulator would, and writes the state
   back; sample predictions go to the node-local ``samples`` folder.

Engine-level queries (not algorithm traffic, not in the ledger): ``info`` (full ``data check``
of the node's folder for the run's split settings, header agreement, split sizes, the voxel
orientations its volumes lie in, counted per orientation, and how many of its cases hold each region's label
value: counts, no case id, which the coordinator compares across sites),
``snapshot`` / ``restore`` (copy the state store to / from the snapshot of a round, for best-round
selection and resume; ``fedseg.flower.snapshots``). Every failure is answered with a Flower
``Error`` reply whose reason is the fedseg message (e.g. the data check's list of problems), not a
traceback from inside Flower.
"""

from __future__ import annotations

import hashlib
import json
import logging
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, cast

from flwr.app import ConfigRecord, Context, Error, RecordDict
from flwr.app import Message as FlowerMessage

from fedseg.config import RunConfig
from fedseg.data.federation import Federation, FederationError, Site, channel_order
from fedseg.flower.flwr_internals import client_app_raised_error_code
from fedseg.flower.log_text import printable
from fedseg.flower.snapshots import ContextSnapshots, DiskSnapshots, Snapshots, prune
from fedseg.flower.supernode import ALLOW_FAULTS

if TYPE_CHECKING:
    from fedseg.data.check import SiteLabels

# PyTorch, MONAI and the algorithms are imported only by algorithm messages: in Flower's
# one-process-per-message isolation, the engine's queries (info, snapshot, restore) then start
# in about the time Flower itself takes to import.
ENGINE = "fedseg.engine"  # = fedseg.flower.records.ENGINE

log = logging.getLogger("fedseg.flower.node")

RUN_CONFIG_KEY = "fedseg-config"  # run config entry: the resolved RunConfig as JSON
STATE = "fedseg.state."  # Context.state slot of a site's store, per algorithm (+ ".index")
RUN_KEY = "fedseg-run-key"  # run config entry: names the experiment across Flower runs (resume)
SIMULATION = "fedseg-simulation"  # run config entry (Flower's simulation runtime): {data, samples, state} folders
INFO, SNAPSHOT, RESTORE, REFUSED, RELEASE = "info", "snapshot", "restore", "refused", "release"  # query actions
ORIENTATIONS = "orientations"  # info reply entry: the site's voxel orientations (JSON: axis codes -> cases)
LABELS = "labels"  # info reply entry: what the site's label files hold (JSON, fedseg.data.check.SiteLabels.record)


@dataclass(frozen=True)
class NodeSettings:
    """What the SuperNode's node config says: its site, its data folder, where samples go, where the
    snapshots of its state store go (None: in the Flower run's memory only)."""

    site: str
    data: Path
    samples: Path | None
    state: Path | None = None
    config_sha256: str | None = None  # the agreed configuration's digest: any other run is refused
    allow_faults: bool = False  # a test deployment: a run whose config injects faults is not refused

    @property
    def records(self) -> Path | None:
        """Where the site keeps its own records of a run (the case-id mapping, the run's configuration): the
        samples folder, else the state folder; None with neither."""
        return self.samples or self.state

    @classmethod
    def from_node_config(cls, node_config: dict) -> NodeSettings:
        missing = [k for k in ("site", "data") if not str(node_config.get(k, "")).strip()]
        if missing:
            raise ValueError(
                f"this SuperNode's node config lacks {', '.join(missing)} (start it with "
                "`fedseg flower supernode --site NAME --data ROOT`, "
                'or flower-supernode --node-config \'site="NAME" data="ROOT"\')'
            )
        samples = str(node_config.get("samples", "")).strip()
        state = str(node_config.get("state", "")).strip()
        agreed = str(node_config.get("config-sha256", "")).strip()
        return cls(
            str(node_config["site"]),
            Path(str(node_config["data"])),
            Path(samples) if samples else None,
            Path(state) if state else None,
            agreed or None,
            str(node_config.get(ALLOW_FAULTS, "")).strip() == "true",
        )

    @classmethod
    def of(cls, context: Context) -> NodeSettings:
        """The settings of the node ``context`` belongs to. On Flower's simulation runtime the virtual nodes have
        no node config of ours: node ``partition-id`` i serves the federation's i-th site (``fedseg-federation``,
        sorted names, as site indices), with the folders of run config ``fedseg-simulation``."""
        node_config = dict(context.node_config)
        simulated = str(context.run_config.get(SIMULATION, ""))
        if "site" in node_config or not simulated or "partition-id" not in node_config:
            return cls.from_node_config(node_config)
        sites = json.loads(str(context.run_config["fedseg-federation"]))["sites"]
        index = int(cast(int, node_config["partition-id"]))
        if not 0 <= index < len(sites):
            raise ValueError(f"virtual SuperNode {index} has no site: the federation has {len(sites)} ({sites})")
        folders = json.loads(simulated)
        site = sites[index]
        return cls(
            site,
            Path(folders["data"]) / site,  # a folder holding the federation.yaml and this site only
            Path(folders["samples"]) if folders.get("samples") else None,
            Path(folders["state"]) / site if folders.get("state") else None,
            allow_faults=True,  # every virtual site is the one researcher's
        )

    def snapshots(self, context: Context) -> Snapshots:
        """This node's snapshot store for the run of ``context``."""
        if self.state is None:
            return ContextSnapshots(context)
        return DiskSnapshots(self.state, str(context.run_config.get(RUN_KEY, "")))


def run_config(context: Context) -> RunConfig:
    import fedseg

    raw = context.run_config.get(RUN_CONFIG_KEY)
    if not raw:
        raise ValueError(f"run config has no {RUN_CONFIG_KEY!r}: this run was not started by fedseg")
    version = str(context.run_config.get("fedseg-version", ""))
    if version and version != fedseg.__version__:
        raise RuntimeError(
            f"the run uses fedseg {version} but this SuperNode has fedseg {fedseg.__version__} installed"
        )
    from fedseg.method_plugins import RUN_CONFIG_KEY as PLUGINS_KEY
    from fedseg.method_plugins import version_problem

    plugins = version_problem(context.run_config.get(PLUGINS_KEY, ""), "this SuperNode")
    if plugins:
        raise Refused(f"the run's method packages: {plugins}")
    return RunConfig.model_validate(json.loads(str(raw)))


def federation_header(fed: Federation) -> dict:
    """The parts of a federation every participant must agree on (JSON-safe; region order matters:
    it is the order of the network's output channels), and its channel names (``on_info`` refuses a site whose
    ``channel_names`` are the coordinator's in another order). An ignore label (partial annotations) is part of it
    where the federation has one (``ignore_label``; absent otherwise, the header as before)."""
    header = {
        "kind": fed.kind,
        "channels": int(fed.channels),
        "regions": [[k, list(v)] for k, v in fed.regions.as_dict().items()],
        "channel_names": fed.channel_names,
    }
    if fed.regions.ignore is not None:
        header["ignore_label"] = int(fed.regions.ignore)
    return header


def load_site(
    settings: NodeSettings,
    cfg: RunConfig,
    check: bool,
    orientations: dict[str, list[tuple[str, str]]] | None = None,
    labels: dict[str, SiteLabels] | None = None,
) -> tuple[Federation, Site]:
    """``(federation, site)`` of this node; ``check``: run the full ``data check`` (every file read), which puts the
    voxel orientation of every volume in ``orientations`` and what the label files hold in ``labels`` where given
    (``check_folder``)."""
    from fedseg.data.check import check_folder
    from fedseg.data.dataset import prepare_threads
    from fedseg.data.folder import load_folder

    # a hospital's folder holds the federation's federation.yaml and only its own site folder
    if check:
        threads = prepare_threads(cfg.data)
        fed = check_folder(
            settings.data,
            cfg.data.split,
            cfg.data.seed,
            all_sites=False,
            threads=threads,
            orientations=orientations,
            labels=labels,
        )
    else:
        fed = load_folder(settings.data, all_sites=False)
    if settings.site not in fed.site_names:
        raise FederationError(
            f"{settings.data}: no folder for site {settings.site!r} "
            f"(site folders here: {', '.join(fed.site_names) or 'none'})"
        )
    return fed, fed.site(settings.site)


def get_state(context: Context, slot: str) -> dict:
    """The tensor store kept in ``context.state`` under ``slot`` (empty if none)."""
    from fedseg.flower.records import unpack

    if slot not in context.state:
        return {}
    return unpack(context.state.array_records[slot], context.state.config_records[slot + ".index"])


def put_state(context: Context, slot: str, state: dict) -> None:
    from fedseg.flower.records import pack

    context.state[slot], context.state[slot + ".index"] = pack(state)


def forget_other_algorithms(context: Context, algorithm: str, snapshots: Snapshots) -> None:
    """Drop the stores and snapshots of the run's earlier algorithms: ``run_experiment`` runs them one after
    another, and the whole ``Context`` travels with every message."""
    for key in list(context.state):
        if key.startswith(STATE) and key.removesuffix(".index") != STATE + algorithm:
            del context.state[key]
    snapshots.forget_others(algorithm)


_SITE_CACHE: dict[tuple, tuple] = {}


def site_data(settings: NodeSettings, cfg: RunConfig, index: int):
    """This site's train/val/test ``SiteData`` at model resolution, as the simulator builds it.

    Kept in memory for the process's next messages (a warm worker); a one-process-per-message
    ClientApp reloads it each time."""
    from fedseg.data import rtstruct
    from fedseg.data.dataset import build_site_data
    from fedseg.data.splits import site_splits

    key = (str(settings.data), settings.site, index, cfg.data.model_dump_json(), cfg.eval.score_grid)
    if key not in _SITE_CACHE:
        fed, site = load_site(settings, cfg, check=False)
        if fed.regions.ignore is not None:  # partial annotations: which training cases have an annotated voxel is
            # the data check's verdict, as on_info declared the training size (split_sizes): the same n_k
            fed, site = load_site(settings, cfg, check=True)
        splits = site_splits(site, cfg.data.split, cfg.data.seed)  # from the real ids: the simulator's splits
        opaque = opaque_case_ids(site)
        write_case_ids(settings, opaque)
        _SITE_CACHE.clear()
        originals = cfg.eval.score_grid == "original"
        with rtstruct.noting():  # said by the data check of the run's info query, not once per message
            data = build_site_data(fed, site, index, splits, cfg.data, originals=originals)
        _SITE_CACHE[key] = (fed, with_case_ids(data, opaque))
    return _SITE_CACHE[key]


def opaque_case_ids(site: Site) -> dict[str, str]:
    """Real case id -> the id that leaves the site: ``case-0001``, ... (1-based position in the site's case
    list, whose order is the folder's). Case ids are hospital file names; the coordinator sees only these."""
    from fedseg.flower.records import opaque_case_id

    return {case.id: opaque_case_id(i) for i, case in enumerate(site.cases, start=1)}


def case_ids_file(settings: NodeSettings) -> Path | None:
    """Where the site keeps its opaque-id mapping: ``<samples>/case-ids__<site>.csv`` (else in ``--state``);
    None when the SuperNode has neither folder (the ids are then the positions in the site's case list)."""
    folder = settings.records
    return None if folder is None else Path(folder) / f"case-ids__{settings.site}.csv"


def write_case_ids(settings: NodeSettings, opaque: dict[str, str]) -> None:
    """Write the mapping (``opaque,case`` rows) on the site, so it can read the coordinator's results.csv: readable
    by the SuperNode's user only (0600; a folder it creates 0700), as it links the ids that leave the site to the
    hospital's file names (often patient identifiers)."""
    import csv
    import io

    from fedseg.atomic_files import atomic_write_text

    path = case_ids_file(settings)
    if path is None:
        return
    text = io.StringIO()
    writer = csv.writer(text, lineterminator="\n")
    writer.writerow(["opaque", "case"])
    writer.writerows((o, c) for c, o in opaque.items())
    if not path.is_file() or path.read_text() != text.getvalue():
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        atomic_write_text(path, text.getvalue(), private=True)
    else:
        path.chmod(0o600)  # written by an older fedseg with the usual mode


def with_case_ids(data, opaque: dict[str, str]):
    """``data`` (a ``SiteData``) with every case id replaced by its opaque id: everything the site's Client
    sends (per-case metrics, sample names) then names cases only by those."""
    for split in ("train", "val", "test"):
        cases = data.split(split)
        cases.ids = [opaque[i] for i in cases.ids]
    data.case_metadata = {opaque[i]: meta for i, meta in data.case_metadata.items()}
    return data


class NotThisSite(ValueError):
    """A message addressed to another site than this SuperNode's ``--site``: the coordinator sends each site's
    messages to the node it connected as that site; with SuperNode authentication that node is the one holding the
    site's key, so a SuperNode restarted mid-run with one site's key and another's ``--site`` receives the key's site's
    messages. Refused (one line in each log), never answered with this site's data, state or snapshots."""

    def __init__(self, addressee: str, site: str) -> None:
        super().__init__(
            f"site {site!r}: refused a message for site {addressee!r}: the coordinator knows this SuperNode (with "
            f"SuperNode authentication: its key) as site {addressee!r}'s, but it was started with --site {site}; "
            f"restart it with --site {addressee}, or with site {site!r}'s key"
        )

    def say(self, context: Context) -> None:
        """Log it once per Flower run on this node, without a traceback (a skipped site is asked every exchange)."""
        log_once(context, str(self), logging.ERROR)


class Refused(ValueError):
    """A coordinator's message this site will not act on (an algorithm the run does not run, a path for a name, a
    tag that is no round number): refused in one line in each log, no traceback, nothing on disk touched."""


SAID = "fedseg.said"  # Context.state slot: digests of the lines this node has logged once in this Flower run


def log_once(context: Context, text: str, level: int) -> None:
    """Log ``text`` the first time this node says it in this Flower run. Kept in ``Context.state``, which travels
    from message to message: with one ClientApp process per message (``--isolation subprocess``) a set in the
    process would say it for every message."""
    key = hashlib.sha256(text.encode()).hexdigest()[:16]
    said = context.state.config_records.get(SAID)
    if said is None:
        said = context.state[SAID] = ConfigRecord({})
    if key not in said:
        said[key] = True
        log.log(level, "%s", text)


ANONYMOUS = (INFO, REFUSED)  # queries sent to a node before its site is known: their header names site "?"


def check_addressee(head: dict, settings: NodeSettings, anonymous: bool = False) -> None:
    """A ``NotThisSite`` unless the engine header's ``site`` is this SuperNode's (or, for an ``anonymous`` message,
    an ``info`` or ``refused`` query, ``?``)."""
    addressee = str(head.get("site", "?"))
    if addressee != settings.site and not (anonymous and addressee == "?"):
        raise NotThisSite(addressee, settings.site)


def handle(message: FlowerMessage, context: Context) -> FlowerMessage:
    """Answer one message (any ``train.<action>``, ``evaluate.<action>`` or engine query)."""
    category, _, action = message.metadata.message_type.partition(".")
    site = str(context.node_config.get("site", "?"))
    try:
        settings = NodeSettings.of(context)
        cfg = run_config(context)
        if ENGINE in message.content.config_records:
            head = dict(message.content.config_records[ENGINE])
            check_addressee(head, settings, anonymous=category == "query" and action in ANONYMOUS)
        if category == "query":
            handler = {
                INFO: on_info,
                SNAPSHOT: on_snapshot,
                RESTORE: on_restore,
                REFUSED: on_refused,
                RELEASE: on_release,
            }.get(action)
            if handler is None:
                raise ValueError(f"unknown fedseg query {action!r}")
            content = handler(message.content, context, settings, cfg)
        else:
            content = on_algorithm_message(action or category, message.content, context, settings, cfg)
        return FlowerMessage(content, reply_to=message)
    except FederationError as e:
        reason = f"data check failed on site {site!r}:\n{e}"
    except NotThisSite as e:
        e.say(context)
        return FlowerMessage(Error(code=client_app_raised_error_code(), reason=str(e)), reply_to=message)
    except Refused as e:
        reason = f"site {site!r}: {message.metadata.message_type}: {e}"
    except Exception as e:  # noqa: BLE001 - every failure goes back to the server as a readable reason
        log.error("site %s: %s failed:\n%s", site, message.metadata.message_type, traceback.format_exc())
        reason = f"site {site!r}: {type(e).__name__}: {e}"
    log.error(reason)
    return FlowerMessage(Error(code=client_app_raised_error_code(), reason=reason), reply_to=message)


def on_algorithm_message(
    action: str, content: RecordDict, context: Context, settings: NodeSettings, cfg: RunConfig
) -> RecordDict:
    """Run the algorithm's Client on one message, with the simulator's ClientContext (``answer``)."""
    from fedseg.flower.records import to_recorddict

    reply, seconds, _ = answer_algorithm(action, content, context, settings, cfg)
    return to_recorddict(reply, {"seconds": seconds})


def answer_algorithm(action: str, content: RecordDict, context: Context, settings: NodeSettings, cfg: RunConfig):
    """``(reply, compute seconds, received message)`` of the algorithm's Client for one fedseg message."""
    import torch

    from fedseg.algorithms import get_algorithm
    from fedseg.engine.context import Delivery, Task, answer
    from fedseg.flower.records import from_recorddict

    torch.set_num_threads(cfg.threads)
    msg, head = from_recorddict(content)
    check_addressee(head, settings)
    record_run_config(settings, cfg, context)  # every message, not only the data check: a pinned site refuses a run
    # of another configuration whatever its coordinator skips (a security re-test skipped the data check)
    to = Delivery(
        run_algorithm_named(head, cfg),
        settings.site,
        int(head["site_index"]),
        int(head["num_sites"]),
        int(head["round"]),
        action,
    )
    spec = get_algorithm(to.algorithm)
    fed, data = site_data(settings, cfg, to.site_index)
    forget_other_algorithms(context, to.algorithm, settings.snapshots(context))
    state = get_state(context, STATE + to.algorithm)
    task = Task.of(spec.run_config(cfg), fed)  # the method's rounds
    options = spec.parse_options(cfg.methods.get(to.algorithm))  # cached: parsed once per node process
    reply, seconds = answer(spec.client(), msg, to, data, state, task, options, settings.samples)
    put_state(context, STATE + to.algorithm, state)
    return reply, seconds, msg


def _loaded_plugins():
    """``fedseg.algorithms.loaded_plugins``, imported (torch, the methods) only when a run's plugin methods are
    checked."""
    from fedseg.algorithms import loaded_plugins

    return loaded_plugins()


def on_info(content: RecordDict, context: Context, settings: NodeSettings, cfg: RunConfig) -> RecordDict:
    """Full data check of this node's folder for the run's split settings; the site's split sizes and, where some of
    its cases are volumes with a grid, its voxel orientations (``orientations``: JSON, axis codes -> number of cases,
    ``fedseg.data.reorient.site_orientations``; absent otherwise, the reply as before) and what its label files hold
    (``labels``: JSON, ``fedseg.data.check.SiteLabels.record``), which the coordinator compares across sites
    (``fedseg.flower.engine.connect_sites``). First, the
    start-up check of the run's method packages beyond their versions (``run_config`` checks those for every
    message): each must load here (``fedseg.method_plugins.load_problem``), or the site refuses now, in one line
    naming the package, the method and the import error, rather than in round 1 (a dependency of the package
    missing on this machine; it imports the methods, so only this query, sent as the run starts, checks it)."""
    from fedseg.data.reorient import site_orientations
    from fedseg.data.splits import site_splits, split_sizes
    from fedseg.method_plugins import RUN_CONFIG_KEY as PLUGINS_KEY
    from fedseg.method_plugins import load_problem

    plugins = load_problem(context.run_config.get(PLUGINS_KEY, ""), "this SuperNode", _loaded_plugins)
    if plugins:
        raise Refused(f"the run's method packages: {plugins}")
    head = dict(content.config_records[ENGINE])
    volumes: dict[str, list[tuple[str, str]]] = {}  # axis codes -> (site, case) of each volume checked
    labels: dict[str, SiteLabels] = {}  # site -> what its label files hold, counted
    fed, site = load_site(settings, cfg, check=True, orientations=volumes, labels=labels)
    expected = json.loads(str(head["header"]))
    mine = federation_header(fed)
    names, theirs = mine.pop("channel_names"), expected.pop("channel_names", None)
    if mine != expected:
        raise FederationError(
            f"{settings.data}/federation.yaml: {mine} does not match the coordinator's federation "
            f"{printable(str(expected))}"  # the coordinator's text, escaped to one line in this site's log
        )
    if names and theirs and channel_order(theirs, names) == "reordered":  # other names: no order to compare
        raise FederationError(
            f"{settings.data}/federation.yaml: channel_names {', '.join(names)} are the coordinator's "
            f"{printable(', '.join(map(str, theirs)))} in another order: this site's images would reach the model "
            "with their channels swapped; reorder this site's channels (and channel_names) to the coordinator's"
        )
    splits = site_splits(site, cfg.data.split, cfg.data.seed)
    sizes = split_sizes(site, splits)  # its training size: the cases it trains on, its aggregation weight
    record_run_config(settings, cfg, context)
    reply: dict = {"site": settings.site, "cases": len(site.cases), **sizes}
    own = {code: [c for s, c in cases if s == site.name] for code, cases in volumes.items()}
    if any(own.values()):  # the site's cases only (a folder may hold other sites' too); no case id leaves it
        reply[ORIENTATIONS] = json.dumps(site_orientations(own, len(site.cases)))
    if site.name in labels:  # counts only, as the orientations: the coordinator compares the regions sites annotate
        reply[LABELS] = json.dumps(labels[site.name].record(fed.regions))
    return RecordDict({ENGINE: ConfigRecord(reply)})


def record_run_config(settings: NodeSettings, cfg: RunConfig, context: Context) -> None:
    """What this site's data is used for, in the site's own records: one log line (the run's algorithms, rounds,
    seed, the SHA-256 of its configuration, ``config_load.config_record``) and, where the SuperNode has a samples or
    state folder, the whole configuration as ``run-config__<site>__<sha256 prefix>.json`` (whose ``sha256sum`` is the
    digest logged) beside the case-id mapping (0600), so a hospital can audit long after what it trained (the
    coordinator chooses the configuration; the site checks it, and with ``--config-sha256`` refuses any other than
    the one it agreed to: a ValueError, which the data check's reply carries to the coordinator)."""
    from fedseg.atomic_files import atomic_write_text
    from fedseg.config_load import config_record

    text, digest = config_record(cfg)
    line = (
        f"site {settings.site}: the coordinator's run: {', '.join(cfg.algorithms)}, {cfg.fl.rounds} rounds, seed "
        f"{cfg.seed}, secure aggregation {cfg.fl.secure_aggregation}, "
        + (f"{len(cfg.faults)} injected faults, " if cfg.faults else "")
        + f"configuration sha256 {digest}"
    )
    log_once(context, printable(line), logging.INFO)
    folder, path = settings.records, None
    if folder is not None:
        path = Path(folder) / f"run-config__{settings.site}__{digest[:16]}.json"
        if not path.exists():
            path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            atomic_write_text(path, text, private=True)  # 0600 from the start; sha256sum of it: the digest logged
    if cfg.faults and not settings.allow_faults:
        raise Refused(
            f"site {settings.site}: refused the coordinator's run before any of its data trains: its configuration "
            f"injects faults ({fault_summary(cfg)}), a testing tool that makes sites send altered updates (with "
            "secure aggregation, sites sending no change would leave the coordinator one site's update); start this "
            "SuperNode with --allow-injected-faults only in a test deployment"
        )
    if settings.config_sha256 is not None and digest != settings.config_sha256:
        raise Refused(
            f"site {settings.site}: refused the coordinator's run before any of its data trains: its configuration "
            f"(sha256 {digest}{', kept as ' + str(path) if path else ''}) is not the one this site agreed to "
            f"(--config-sha256 {settings.config_sha256}); compare it with the agreed one (`fedseg flower "
            "config-digest --write FILE` with the study's options)"
        )


def fault_summary(cfg: RunConfig) -> str:
    """The run's injected faults in a few words: ``"scale x0 at site1, site2; crash at site3 round 2"``."""
    parts = []
    for f in cfg.faults[:3]:
        factor = f" x{f.factor:g}" if f.kind in ("scale", "weight") else ""
        parts.append(f"{f.kind}{factor} at {f.site}" + (f" round {f.round}" if f.round is not None else ""))
    more = f"; {len(cfg.faults) - 3} more" if len(cfg.faults) > 3 else ""
    return printable("; ".join(parts) + more)


def on_refused(content: RecordDict, context: Context, settings: NodeSettings, cfg: RunConfig) -> RecordDict:
    """The coordinator refused this SuperNode (``fedseg.flower.engine.connect_sites``): say why in this site's log,
    where its operator looks (the coordinator's log is not theirs)."""
    why = printable(str(content.config_records[ENGINE]["why"]))
    log.warning("site %s: this SuperNode was %s", settings.site, why)
    return RecordDict()


def run_algorithm_named(head: dict, cfg: RunConfig) -> str:
    """The ``algorithm`` an engine query of the coordinator names (it names this site's snapshot folder in
    ``--state``): one of the run's algorithms (``cfg.algorithms``, the configuration this site checked its data
    against); anything else, a path or ``..`` above all, is ``Refused`` (one line in the site's log and the
    coordinator's error) and never reaches the file system."""
    from fedseg.flower.snapshots import SAFE_NAME

    algorithm = str(head.get("algorithm", ""))
    if algorithm not in cfg.algorithms or not SAFE_NAME.fullmatch(algorithm):  # the coordinator writes both
        raise Refused(
            f"the coordinator named algorithm {algorithm!r}, not one of this run's ({', '.join(cfg.algorithms)}): "
            "refused, nothing of this site's --state folder was touched"
        )
    return algorithm


MAX_TAG = 2**31 - 1  # no run has more rounds


def snapshot_tags(head: dict) -> tuple[int, list[int]]:
    """``(tag, keep)`` of a snapshot query: round numbers (integers >= 0), else ``Refused``."""
    tag, text = head.get("tag"), str(head.get("keep", "[]"))
    try:
        keep = json.loads(text) if len(text) < 100_000 else None
    except ValueError:
        keep = None
    tags = [tag, *keep] if isinstance(keep, list) else [tag, keep]
    if not isinstance(keep, list) or not all(
        isinstance(t, int) and not isinstance(t, bool) and 0 <= t <= MAX_TAG for t in tags
    ):
        raise Refused(f"snapshot tags {str(tags)[:200]}: expected round numbers (integers 0..{MAX_TAG}); refused")
    return cast(int, tag), cast(list[int], keep)


def on_snapshot(content: RecordDict, context: Context, settings: NodeSettings, cfg: RunConfig) -> RecordDict:
    """Save the algorithm's state store as snapshot ``tag``; delete the snapshots not in ``keep`` (JSON list
    of the tags the coordinator may still restore)."""
    head = dict(content.config_records[ENGINE])
    algorithm, (tag, keep) = run_algorithm_named(head, cfg), snapshot_tags(head)
    snapshots = settings.snapshots(context)
    snapshots.save(algorithm, tag, get_state(context, STATE + algorithm))
    prune(snapshots, algorithm, {tag, *keep})
    return RecordDict({ENGINE: ConfigRecord({"site": settings.site})})


def on_restore(content: RecordDict, context: Context, settings: NodeSettings, cfg: RunConfig) -> RecordDict:
    """Put snapshot ``tag`` back as the algorithm's state store (after a resume: from the ``--state`` folder)."""
    head = dict(content.config_records[ENGINE])
    algorithm, (tag, _) = run_algorithm_named(head, cfg), snapshot_tags(head)
    put_state(context, STATE + algorithm, settings.snapshots(context).load(algorithm, tag))
    return RecordDict({ENGINE: ConfigRecord({"site": settings.site})})


def on_release(content: RecordDict, context: Context, settings: NodeSettings, cfg: RunConfig) -> RecordDict:
    """The algorithm finished (the coordinator's finished checkpoint is on disk): drop its state store and delete its
    snapshots (``Snapshots.release``)."""
    algorithm = run_algorithm_named(dict(content.config_records[ENGINE]), cfg)
    for key in (STATE + algorithm, STATE + algorithm + ".index"):
        if key in context.state:
            del context.state[key]
    settings.snapshots(context).release(algorithm)
    return RecordDict({ENGINE: ConfigRecord({"site": settings.site})})
