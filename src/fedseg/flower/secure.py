"""Secure aggregation on Flower (config ``fl.secure_aggregation: secagg+``, parameters ``fl.secagg``).

With it, the ``train`` exchange of each round runs Flower's SecAgg+ protocol
(``flwr.server.workflow.SecAggPlusWorkflow`` on the coordinator, ``flwr.client.mod.secaggplus_mod`` on the
sites) instead of one plain message per site: four round trips (setup: public keys; share keys: encrypted
key shares, forwarded by the coordinator; masked vectors: the training message and each site's masked,
quantized ``weight x update``; unmask: the key shares that remove the masks). The coordinator learns
only ``sum_k w_k (r_k - m)`` and ``sum_k w_k`` (``r_k``: site k's reply tensors, ``m``: what it received,
``w_k``: its aggregation weight, ``fl.weighting`` / the method's ``weighting``), i.e. the weighted average
update, plus each site's plain training metrics (loss, steps, sample count). Every site's reply is then
handed to the method's server as that average (``m`` + average update), so the server's weighted merge gives
it back unchanged: methods whose server needs nothing but that average (their ``AlgorithmSpec`` says so:
``on_secure_aggregation=None``; :func:`secure_methods`) may use it; every other method is refused before any work
with the reason its spec gives (``refusal``).

The update is clipped to ``[-clipping_range, clipping_range]`` and stochastically rounded to
``quantization_range`` levels (step ``2 clipping_range / quantization_range``, 3.8e-6 with Flower's
defaults), so the merged model differs from the plain run's by about that step (fedseg's
``tests/test_flower_secure.py`` holds the measured bound). A site that fails under ``fl.on_failure = skip``
is dropped by SecAgg+ itself (its masks are reconstructed from the others' shares).

Local differential privacy (``fl.local_dp``, Flower's ``LocalDpMod``; ``local_dp_mod``): each site clips its
update to L2 norm ``clipping_norm`` and adds Gaussian noise before SecAgg+ quantizes and masks it.

The ledger gets one row per site and stage (``secagg_setup``, ``secagg_share_keys``, ``train``,
``secagg_unmask``) with the bytes each message carried; the ``train`` row's ``floats_up`` counts the masked
vector's entries.
"""

from __future__ import annotations

import json
import logging
import math
import time
from dataclasses import asdict, dataclass, field
from types import SimpleNamespace
from typing import Any, cast

import numpy as np
import torch
from flwr.app import ConfigRecord, Context, RecordDict
from flwr.app import Message as FlowerMessage

from fedseg.algorithms import get_algorithm
from fedseg.algorithms.fedavg import weighting_of
from fedseg.engine.ledger import LedgerRow
from fedseg.engine.messages import Message
from fedseg.flower.log_text import site_text
from fedseg.flower.records import ENGINE, record_bytes
from fedseg.run.checks import SIMULATOR_REFUSAL as SIMULATOR_REFUSAL  # re-exported: the refusals in one place

log = logging.getLogger("fedseg.flower.secure")

SECAGG = "secagg+"
HEADER = "fedseg.secagg"  # ConfigRecord of the masked-vector stage: the site's weighting and the update's names


def secure_methods() -> frozenset[str]:
    """The registered methods whose server merges only the weighted average of the train replies (FedAvg's weights):
    those whose spec says so (``AlgorithmSpec.on_secure_aggregation`` None), installed and registered ones too."""
    from fedseg.algorithms import ALGORITHMS

    return frozenset(name for name, spec in ALGORITHMS.items() if spec.on_secure_aggregation is None)


def refusal(name: str, cfg) -> str | None:
    """Why method ``name`` cannot run under ``fl.secure_aggregation = secagg+`` with run config ``cfg``, or None:
    its spec's reason (``AlgorithmSpec.on_secure_aggregation``), else why its options or ``eval.local_models`` would
    show the coordinator individual updates."""
    spec = get_algorithm(name)
    if spec.on_secure_aggregation is not None:
        return spec.on_secure_aggregation
    options = spec.parse_options(cfg.methods.get(name))
    aggregator = getattr(options, "aggregator", "mean")
    if aggregator != "mean":
        return f"its aggregator {aggregator!r} needs every site's update (only 'mean' works on their sum)"
    keeps = getattr(spec.server, "KEEPS_LOCAL_MODELS", False)
    if keeps and cfg.eval.local_models:
        return "eval.local_models sends every site's own trained model to the coordinator; set eval.local_models=false"
    return None


def check(cfg) -> None:
    """Raise ``ValueError`` (one line per refused method) if ``fl.secure_aggregation`` is on and a method of the run
    cannot keep its sites' updates hidden."""
    if cfg.fl.secure_aggregation != SECAGG:
        return
    from flwr.server.workflow import SecAggPlusWorkflow

    sa = cfg.fl.secagg
    try:  # Flower's own checks of its parameters
        SecAggPlusWorkflow(
            sa.num_shares,
            sa.reconstruction_threshold,
            max_weight=sa.max_weight or 1.0,
            clipping_range=sa.clipping_range,
            quantization_range=sa.quantization_range,
            modulus_range=sa.modulus_range,
        )
    except (TypeError, ValueError) as e:
        raise ValueError(f"fl.secagg: {e}") from None
    bad = [(a, why) for a in cfg.algorithms if (why := refusal(a, cfg)) is not None]
    if bad:
        raise ValueError(
            "; ".join(f"fl.secure_aggregation = secagg+: {a} cannot use it: {why}" for a, why in bad)
            + f". Supported: {', '.join(sorted(secure_methods()))}"
        )


# --- the site ------------------------------------------------------------------------------------------------
def site_train(message: FlowerMessage, context: Context) -> FlowerMessage:
    """The masked-vector stage on a site (called by ``secaggplus_mod``): train as the plain ``train`` message
    would, then answer a Flower ``FitRes`` whose parameters are the update ``reply - received`` (float64, one
    array per reply tensor, float entries only) and whose weight is the site's aggregation weight. The mod
    masks the parameters and removes them from the reply; the metrics (the reply's meta, the compute seconds,
    the update's names, dtypes and shapes) travel in plain."""
    from flwr.common import Code, FitRes, Status, ndarrays_to_parameters

    from fedseg.engine.context import stream_seed
    from fedseg.flower import node
    from fedseg.flower.flwr_internals import fitres_to_recorddict

    settings = node.NodeSettings.of(context)
    cfg = node.run_config(context)
    head = dict(message.content.config_records[HEADER])
    engine_head: dict[str, Any] = dict(message.content.config_records[ENGINE])
    node.check_addressee(engine_head, settings)  # another site's message: said as such, before anything else
    site_index = int(engine_head["site_index"])
    spec = get_algorithm(str(engine_head["algorithm"]))
    weighting = weighting_of(spec.parse_options(cfg.methods.get(spec.name)), cfg)  # the run's, every node's
    weight = site_weight(head, weighting, len(node.site_data(settings, cfg, site_index)[1].train))  # before training
    reply, seconds, received = node.answer_algorithm("train", message.content, context, settings, cfg)
    arrays, index = [], []
    for name, t in reply.tensors.items():
        if not t.is_floating_point():
            raise TypeError(f"secure aggregation sums float tensors only; reply tensor {name!r} is {t.dtype}")
        base = received.tensors.get(name)
        delta = base is not None and base.shape == t.shape
        value = t.to(torch.float64) - (base.to(torch.float64) if delta else 0.0)
        if not torch.isfinite(value).all():
            raise ValueError(f"reply tensor {name!r} has NaN or Inf entries: not sent")
        if float(value.abs().max()) > cfg.fl.secagg.clipping_range:
            log.warning(
                "site %s: update of %r reaches %.3g, beyond fl.secagg.clipping_range = %g: clipped before masking",
                settings.site,
                name,
                float(value.abs().max()),
                cfg.fl.secagg.clipping_range,
            )
        arrays.append(value.numpy())
        index.append([name, str(t.dtype).removeprefix("torch."), list(t.shape), delta])
    if cfg.fl.local_dp is not None and [i[0] for i in index] != list(received.tensors):
        raise ValueError("fl.local_dp needs the reply to carry exactly the tensors the site received, in order")
    # the mod's stochastic rounding draws from NumPy's global stream: seeded per (seed, site, round), so a run
    # (and its resume) quantizes the same way every time; the masks stay os.urandom's
    np.random.seed(stream_seed(cfg.seed, site_index, int(engine_head["round"]), HEADER) % 2**32)
    metrics = {"fedseg.meta": json.dumps(reply.meta), "fedseg.index": json.dumps(index), "fedseg.seconds": seconds}
    fitres = FitRes(Status(Code.OK, ""), ndarrays_to_parameters(arrays), weight, cast(dict, metrics))
    content = fitres_to_recorddict(fitres)
    return FlowerMessage(content, reply_to=message)


def secure_weight(weighting: str, train_cases: int) -> int:
    """The integer weight a site's update is multiplied by under SecAgg+: 1 (``uniform``) or its training-set size;
    the coordinator sends it (``secure_train``), the site checks it (:func:`site_weight`)."""
    return 1 if weighting == "uniform" else train_cases


def site_weight(head: dict, weighting: str, train_cases: int) -> int:
    """The weight a site multiplies its update by, as the coordinator sent it (``head``: the ``HEADER`` record,
    ``weighting`` and ``weight``), checked against what the site knows: the run's ``weighting`` (from the run
    config every node holds, ``fedavg.weighting_of``), then 1 under ``uniform``, else its own training-set size
    ``train_cases``. A ValueError otherwise: a coordinator that sends 0 to every site but one, or ``uniform``
    weights to the others and ``samples`` to one, would unmask that one site's update from the secure sum (a
    security audit did the first, a review found the second)."""
    weight = head.get("weight")
    expected = secure_weight(weighting, train_cases)
    if head.get("weighting") != weighting:
        raise ValueError(
            f"secure aggregation refused: the coordinator sent this site {head.get('weighting')!r} weighting, not "
            f"the run's {weighting!r}; another weighting could single out this site's update from the secure sum"
        )
    if isinstance(weight, bool) or not isinstance(weight, int) or weight != expected:
        what = "1 (uniform weighting)" if weighting == "uniform" else f"its training-set size, {train_cases} cases"
        raise ValueError(
            f"secure aggregation refused: the coordinator asked this site to weight its update by {weight!r}, not "
            f"{what}; another weight could single out this site's update from the secure sum"
        )
    return weight


def local_dp_mod(message: FlowerMessage, context: Context, call_next) -> FlowerMessage:
    """Flower's ``LocalDpMod`` with the run's ``fl.local_dp`` (nothing when it is None), between ``secaggplus_mod``
    and ``site_train``: it clips ``reply - base`` and adds noise. ``site_train``'s parameters are already the update,
    so the base it is given is zeros shaped like the received tensors (on the site only; nothing travels)."""
    from flwr.client.mod import LocalDpMod
    from flwr.common import FitIns, ndarrays_to_parameters

    from fedseg.flower import node
    from fedseg.flower.records import from_recorddict

    dp = node.run_config(context).fl.local_dp
    if dp is None:
        return call_next(message, context)
    received, _ = from_recorddict(message.content)
    zeros = [np.zeros(tuple(t.shape)) for t in received.tensors.values()]
    base = compat_fitins(FitIns(ndarrays_to_parameters(zeros), {}))
    for key, rec in base.items():
        message.content[key] = rec
    return LocalDpMod(dp.clipping_norm, dp.sensitivity, dp.epsilon, dp.delta)(message, context, call_next)


def compat_fitins(fitins) -> RecordDict:
    from fedseg.flower.flwr_internals import fitins_to_recorddict

    return fitins_to_recorddict(fitins)


# --- the coordinator -----------------------------------------------------------------------------------------
STAGE_ACTIONS = {"setup": "secagg_setup", "share_keys": "secagg_share_keys", "collect_masked_vectors": "train"}
UNMASK_ACTION = "secagg_unmask"


@dataclass
class Traffic:
    """What one SecAgg+ exchange moved, per stage and site: bytes down/up, floats down/up, wall seconds."""

    rows: list[dict] = field(default_factory=list)


class MeteredGrid:
    """The Grid as SecAgg+'s workflow sees it: ``send_and_receive`` through fedseg's courier (its poll interval,
    not Flower's 3 s), every message measured; the masked-vector stage's messages get the fedseg message of
    each site (``fedseg.flower.records``) and the secure-aggregation header."""

    def __init__(
        self, courier, node_sites: dict[int, str], payload: dict[int, RecordDict], floats: dict[int, int], skip: bool
    ):
        self.courier, self.node_sites, self.payload, self.skip = courier, node_sites, payload, skip
        self.floats = floats  # node -> floats of its fedseg training message
        self.traffic = Traffic()

    def send_and_receive(self, messages, *, timeout: float | None = None):
        from fedseg.flower.flwr_internals import secaggplus_masked_vector, secaggplus_stage

        messages = list(messages)
        stage = secaggplus_stage(messages[0].content) if messages else ""
        action = STAGE_ACTIONS.get(stage, UNMASK_ACTION)
        for m in messages:
            if action == "train":
                for key, rec in self.payload[m.metadata.dst_node_id].items():
                    m.content[key] = rec
        names = [self.node_sites[m.metadata.dst_node_id] for m in messages]
        began = time.perf_counter()
        replies = self.courier.send(messages, f"secure aggregation, {stage}", names, timeout, timeout is not None)
        wall = time.perf_counter() - began
        out = []
        for m, site, r in zip(messages, names, replies):
            down = record_bytes(m.content)
            floats_down = self.floats.get(m.metadata.dst_node_id, 0) if action == "train" else 0
            row = {"site": site, "action": action, "bytes_down": down, "floats_down": floats_down, "wall": wall}
            if r is None or r.has_error():
                why = "no reply" if r is None else site_text(r.error.reason or "an error")
                if not self.skip:
                    from fedseg.engine.faults import SiteFailure

                    raise SiteFailure(f"site {site!r} failed during secure aggregation ({stage}):\n{why}")
                row["failure"] = why
            else:
                row["bytes_up"] = record_bytes(r.content)
                vector = secaggplus_masked_vector(r.content) if action == "train" else None
                if vector is not None:
                    from flwr.common import bytes_to_ndarray

                    row["floats_up"] = sum(bytes_to_ndarray(b).size for b in vector)
                out.append(r)
            self.traffic.rows.append(row)
        return out


class _Capture:
    """The Strategy SecAgg+'s workflow talks to: hands out the round's fit instructions and keeps the results
    (each result's parameters are the unmasked weighted average)."""

    def __init__(self, nodes: list[int]):
        self.nodes = nodes
        self.results: list = []
        self.failures: list = []

    def configure_fit(self, server_round, parameters, client_manager):
        from flwr.common import FitIns, Parameters

        return [(SimpleNamespace(node_id=n), FitIns(Parameters([], "numpy.ndarray"), {})) for n in self.nodes]

    def aggregate_fit(self, server_round, results, failures):
        self.results, self.failures = list(results), list(failures)
        return None, {}


class FlowerErrors(logging.Handler):
    """The ERROR lines Flower's logger (``flwr``) writes while the block runs, once each: the SecAgg+ workflow says
    why it halted only there (e.g. "Not enough shares to recover secret in unmask vectors stage")."""

    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        line = " ".join(record.getMessage().split())
        if line not in self.lines:
            self.lines.append(line)

    def __enter__(self) -> FlowerErrors:
        logging.getLogger("flwr").addHandler(self)
        return self

    def __exit__(self, *exc: object) -> None:
        logging.getLogger("flwr").removeHandler(self)


def secure_train(engine, order: list[str], messages: dict[str, Message], check=None) -> dict[str, Message]:
    """One ``train`` exchange under SecAgg+ (module docstring): ``{site: reply}``, every reply carrying the
    weighted average of the sites' replies; ledger rows recorded on ``engine.ledger``. Each site's description of
    its vector (:func:`index_problem`), its metadata and the method's ``check`` (``Engine.exchange``'s) on the
    reply rebuilt from it must hold: the round stops otherwise (its masked update is in the sum already)."""
    from flwr.common import parameters_to_ndarrays
    from flwr.server import LegacyContext
    from flwr.server.workflow import SecAggPlusWorkflow

    from fedseg.engine.faults import SiteFailure, group_problem, loss_problem, steps_problem, weight_problem
    from fedseg.flower.flwr_internals import workflow_state
    from fedseg.flower.records import to_recorddict

    cfg, sa = engine.task.cfg, engine.task.cfg.fl.secagg
    if len(order) < 2:
        raise SiteFailure(f"secure aggregation needs at least 2 sites in a round; round {engine.round} has {order}")
    first = messages[order[0]].tensors
    for s in order[1:]:
        t = messages[s].tensors
        if t.keys() != first.keys() or not all(torch.equal(t[k], first[k]) for k in first):
            raise ValueError(f"secure aggregation needs one broadcast message per round; {s!r} got another one")
    weighting = weighting_of(engine.options, cfg)
    weights = {s: secure_weight(weighting, engine.num_samples(s)) for s in order}
    nodes = {engine.site_map.nodes[s]: s for s in order}
    payload = {}
    for n, s in nodes.items():
        rd = to_recorddict(messages[s], asdict(engine.delivery(s, "train")))
        rd[HEADER] = ConfigRecord({"weighting": weighting, "weight": weights[s]})
        payload[n] = rd
    floats = {n: messages[s].num_floats() for n, s in nodes.items()}
    grid = MeteredGrid(engine.courier, nodes, payload, floats, engine.skips_failures)
    strategy = _Capture(list(nodes))
    context = LegacyContext(Context(0, 0, {}, workflow_state(engine.round), {}), strategy=cast(Any, strategy))
    workflow = SecAggPlusWorkflow(
        sa.num_shares,
        sa.reconstruction_threshold,
        max_weight=float(sa.max_weight or max(weights.values())),
        clipping_range=sa.clipping_range,
        quantization_range=sa.quantization_range,
        modulus_range=sa.modulus_range,
        timeout=cfg.fl.timeout_s,
    )
    with FlowerErrors() as errors:
        workflow(cast(Any, grid), context)
    if not strategy.results:
        record_traffic(engine, grid.traffic, {}, {})
        failed = "; ".join(f"{r['site']} ({r['action']}): {r['failure']}" for r in grid.traffic.rows if "failure" in r)
        raise SiteFailure(
            f"round {engine.round}: secure aggregation halted: {'; '.join(errors.lines) or 'no sum to unmask'} "
            f"(fl.secagg.reconstruction_threshold = {sa.reconstruction_threshold} of the shares must survive)"
            + (f"; failed: {failed}" if failed else "")
        )
    average = parameters_to_ndarrays(strategy.results[0][1].parameters)
    replies: dict[str, Message] = {}
    seconds: dict[str, float] = {}
    layout = None  # every site's index: the sum adds their vectors entry by entry, so they must describe one layout
    for proxy, fitres in strategy.results:
        site = nodes[proxy.node_id]
        try:
            index, meta, spent = _read_metrics(fitres.metrics)
            problem = (
                index_problem(index, first, average)
                or (None if layout in (None, index) else "its tensors are described unlike the other sites'")
                or group_problem(first, [entry[0] for entry in index])
                or weight_problem(meta, engine.num_samples(site))
                or steps_problem(Message({}, meta))
                or loss_problem(Message({}, meta))
            )
            reply = None if problem else Message(_rebuilt(index, average, first), meta)
            problem = problem or (check(site, messages[site], reply) if check and reply is not None else None)
        except (KeyError, ValueError, TypeError, ArithmeticError) as error:
            problem = f"its reply cannot be read ({type(error).__name__}: {site_text(str(error))})"
        if problem is not None or reply is None:  # its masked update is in the sum already: the round cannot drop it
            record_traffic(engine, grid.traffic, {}, {})
            raise SiteFailure(
                f"site {site!r}, round {engine.round}, {engine.algorithm} train (secure aggregation): {problem}"
            )
        layout = index
        replies[site], seconds[site] = reply, spent
    record_traffic(engine, grid.traffic, replies, seconds)
    return replies


def _read_metrics(metrics: dict) -> tuple[list, dict, float]:
    """A site's SecAgg+ reply metrics: its vector's index (``[name, dtype, shape, delta]`` per tensor), its reply
    metadata (a JSON object) and the compute seconds it measured (a number >= 0)."""
    index = json.loads(str(metrics["fedseg.index"]))
    meta = json.loads(str(metrics["fedseg.meta"]))
    spent = float(cast(float, metrics["fedseg.seconds"]))
    if not isinstance(index, list) or not isinstance(meta, dict):
        raise ValueError("its index is not a list or its metadata not an object")
    if not (math.isfinite(spent) and spent >= 0):
        raise ValueError(f"its compute time {spent!r} is no number of seconds >= 0")
    return index, meta, spent


def index_problem(index: list, first: dict[str, torch.Tensor], average: list) -> str | None:
    """Why a site's description of its summed vector cannot rebuild a reply: an entry that is not ``[name, dtype,
    shape, delta]`` of a float dtype, another number of entries than the sum's, an entry's size not its part of the
    sum, or a tensor it received (named in the broadcast ``first``) described with another dtype or shape or not as
    an update (``delta``: a rogue ``delta = False`` made the average it rebuilt another than the sites' one)."""
    if len(index) != len(average):
        return f"it describes {len(index)} tensors, the sum has {len(average)}"
    for entry, value in zip(index, average):
        if not (isinstance(entry, list) and len(entry) == 4 and isinstance(entry[0], str)):
            return f"an entry of its index is {str(entry)[:80]!r}, not [name, dtype, shape, delta]"
        name, dtype, shape, delta = entry
        if dtype not in FLOAT_DTYPES or not isinstance(shape, list) or not all(type(n) is int for n in shape):
            return f"tensor {name!r}: dtype {str(dtype)[:20]!r} and shape {str(shape)[:40]} are no float tensor's"
        if math.prod(shape) != np.asarray(value).size:
            return f"tensor {name!r} of shape {shape} is not its {np.asarray(value).size} entries of the sum"
        sent = first.get(name)
        if sent is not None and (delta is not True or dtype != str(sent.dtype).removeprefix("torch.") or
                                 list(sent.shape) != shape):  # fmt: skip
            return f"tensor {name!r} is described unlike the one it received (an update of its dtype and shape)"
    return None


FLOAT_DTYPES = frozenset({"float16", "bfloat16", "float32", "float64"})  # what site_train can send


def _rebuilt(index: list, average: list, first: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The reply the sum stands for: each tensor the average of the sites' (an update added to what they received)."""
    tensors = {}
    for (name, dtype, shape, delta), value in zip(index, average):
        v = torch.from_numpy(np.asarray(value, dtype=np.float64).reshape(shape))
        if delta:
            v = first[name].to(torch.float64) + v
        tensors[name] = v.to(getattr(torch, dtype))
    return tensors


def record_traffic(engine, traffic: Traffic, replies: dict[str, Message], seconds: dict[str, float]) -> None:
    """One ledger row per site and SecAgg+ stage; the train row has the site's steps and compute seconds."""
    stages: dict[str, int] = {}
    for row in traffic.rows:
        if row["action"] not in stages:
            stages[row["action"]] = engine.ledger.next_exchange() + len(stages)
    for row in traffic.rows:
        site, train = row["site"], row["action"] == "train" and not row.get("failure")
        engine.ledger.record(
            LedgerRow(
                engine.round,
                site,
                row["action"],
                int(replies[site].meta.get("steps", 0)) if train and site in replies else 0,
                int(row.get("floats_down", 0)),
                int(row.get("floats_up", 0)),
                seconds.get(site, 0.0) if train else 0.0,
                str(row.get("failure", "")),
                stages[row["action"]],
                float(row["wall"]),
                int(row["bytes_down"]),
                int(row.get("bytes_up", 0)),
            )
        )
