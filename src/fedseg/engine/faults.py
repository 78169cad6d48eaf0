"""Faults: injected where a site answers (config ``faults``), detected where a reply arrives (every
engine), and the failure policy (``fl.on_failure``, ``fl.min_sites``, ``fl.timeout_s``).

Detection, in :meth:`fedseg.engine.base.BaseEngine.exchange` for every reply before the server sees it:

* the site raised (its client failed, or an injected ``crash``) or answered after ``fl.timeout_s``
  seconds of wall time (an injected ``hang``; on Flower, no reply by then);
* a reply tensor of a training exchange holds NaN or Inf (evaluation replies may: an HD95 with an
  empty mask is NaN);
* a reply tensor named like a tensor of the message the site received has another shape or dtype;
* a group of tensors the site received (e.g. ``model/``) comes back incomplete or with names it was not sent;
* the reply's ``num_examples`` (the site's aggregation weight) is not the training-set size the site declared;
* its ``steps`` are no whole number >= 0 (they feed the ledger and the budgets), its ``loss`` no number;
* an evaluation reply (:func:`scores_problem`) reports another model than the one it was asked to score, a case
  list that is not distinct case ids, or scores of another shape than (cases, regions) or outside their range
  (Dice and NSD in [0, 1], HD95 >= 0; NaN allowed): a site's scores choose the selected round and make the tables;
* the method's own check of what it reads beyond these (``Engine.exchange``'s ``check``: e.g.
  ``FedAvgServer.train_reply_problem``, q-FedAvg's Eq. 16), an exception in it counted as the site's failure too.

``fl.on_failure = stop`` (default): the exchange raises :class:`SiteFailure` naming site, round,
action and reason; the run stops with the last round's checkpoint intact (a checkpoint is written
only after a round completes). ``skip``: the failed sites are left out of that exchange's replies
(the merge re-weights over the others), each recorded as a ledger row with its ``failure``
reason (``ledger.csv``, ``summary.json`` ``failures``); fewer than ``fl.min_sites`` replies, or a
method that needs every site's reply (``AlgorithmSpec.needs_every_site``, e.g. FedSM's SoftPull),
stops the run instead, saying why.

Injection (:func:`inject`, called by :func:`fedseg.engine.context.answer` on every engine): a
``faults`` entry matching the site, round and action changes what the site does or replies.
Timeouts are wall time, so unlike every other number of a run they depend on the machine.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Collection, Mapping
from typing import TypeGuard

import torch

from fedseg.config import FaultSpec, RunConfig
from fedseg.engine.messages import Message, l2_norm


def check_fault_sites(faults: list[FaultSpec], site_names: list[str], where: str) -> None:
    """Every ``faults`` entry names a site of the federation the run trains on (``where`` names it): a fault aimed
    at a misspelt site would silently never happen. ValueError naming the entry and the sites."""
    for i, fault in enumerate(faults):
        if fault.site not in site_names:
            raise ValueError(
                f"faults[{i}].site: {where} has no site {fault.site!r}; its sites: {', '.join(site_names)}"
            )


class SiteFailure(ValueError):
    """One or more sites failed an exchange (``fl.on_failure = stop``, or too few left to skip them); the
    message names site, round, method, action and reason (a ValueError: the CLI prints it, no traceback)."""


class MethodError(ValueError):
    """A method's server did something no site could use (a global model of other names or shapes, NaN), or its own
    code raised (``fedseg.run.method_code``); the message names the method, the round and what (a ValueError:
    the CLI prints its one line)."""


class InjectedCrash(RuntimeError):
    """Raised by a site whose ``faults`` entry says ``crash``."""


def matching_faults(cfg: RunConfig, site: str, rnd: int, action: str) -> list[FaultSpec]:
    return [f for f in cfg.faults if f.site == site and f.action == action and f.round in (None, rnd)]


def inject(faults: list[FaultSpec], msg: Message, reply: Message | None, cfg: RunConfig) -> Message | None:
    """Apply ``faults`` to a site's answer: ``reply`` None means before the client runs (crash, hang);
    otherwise returns the changed reply (nan, inf, shape, missing, extra, weight, scale)."""
    for fault in faults:
        if reply is None:
            if fault.kind == "crash":
                raise InjectedCrash(f"injected crash (faults: {fault.site}, round {fault.round or 'every'})")
            if fault.kind == "hang":
                assert cfg.fl.timeout_s is not None  # RunConfig refuses a hang without a timeout
                time.sleep(cfg.fl.timeout_s * 1.2 + 0.05)
            continue
        tensors, meta = dict(reply.tensors), dict(reply.meta)
        floats = sorted(k for k, t in tensors.items() if t.is_floating_point() and t.numel())
        if fault.kind in ("nan", "inf") and floats:
            tensors[floats[0]] = torch.full_like(tensors[floats[0]], math.nan if fault.kind == "nan" else math.inf)
        elif fault.kind == "shape" and floats:
            tensors[floats[0]] = tensors[floats[0]].flatten()[1:]
        elif fault.kind == "missing" and floats:
            del tensors[floats[0]]
        elif fault.kind == "extra" and floats:
            tensors[f"{_group(floats[0])}/../injected"] = torch.zeros(1)
        elif fault.kind == "weight" and "num_examples" in meta:
            meta["num_examples"] = int(float(meta["num_examples"]) * fault.factor)
        elif fault.kind == "scale":
            for k in floats:
                sent = msg.tensors.get(k)
                if sent is not None and sent.shape == tensors[k].shape:
                    tensors[k] = sent + fault.factor * (tensors[k] - sent)
                else:
                    tensors[k] = tensors[k] * fault.factor
        reply = Message(tensors, meta)
    return reply


def all_finite(tensor: torch.Tensor) -> bool:
    """Whether every value of the floating-point ``tensor`` is finite. First from its sum, which reads the tensor
    once and allocates no copy of it: NaN and Inf propagate through a sum (Inf - Inf is NaN), so a finite sum means
    finite values; only a non-finite sum (a NaN/Inf, or finite values whose sum overflows) is checked value by
    value, as ``isfinite(t).all()``, which writes a mask of the tensor's size."""
    return bool(torch.isfinite(tensor.sum())) or bool(torch.isfinite(tensor).all())


def reply_problem(msg: Message, reply: Message, check_finite: bool, train_cases: int) -> str | None:
    """Why ``reply`` cannot be used, or None (module docstring, **Detection**): a tensor with NaN/Inf (if
    ``check_finite``); one named like a tensor of ``msg`` with another shape or dtype; a group of tensors that
    ``msg`` sent (``model/...``) returned incomplete or with names that were not sent (a merge would silently
    lose the tensor, or fail at every site's next evaluation); a ``num_examples`` (the site's aggregation weight
    n_k) that is not ``train_cases``, the training-set size the site declared (its split; on Flower its answer
    to the data check before round 1)."""
    for name, tensor in reply.tensors.items():
        sent = msg.tensors.get(name)
        if sent is not None and (sent.shape != tensor.shape or sent.dtype != tensor.dtype):
            return (
                f"tensor {name!r} has shape {tuple(tensor.shape)} {tensor.dtype}, expected {tuple(sent.shape)} "
                f"{sent.dtype} (as sent)"
            )
        if check_finite and tensor.is_floating_point() and not all_finite(tensor):
            bad = "NaN" if bool(torch.isnan(tensor).any()) else "Inf"
            return f"tensor {name!r} holds {bad}"
    return (
        group_problem(msg.tensors, reply.tensors)
        or weight_problem(reply.meta, train_cases)
        or steps_problem(reply)
        or loss_problem(reply)
    )


def steps_problem(reply: Message) -> str | None:
    """Why a reply's ``steps`` (SGD steps or forward batches, for the ledger and the budgets) cannot be used."""
    steps = reply.meta.get("steps", 0)
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 0:
        return f"steps = {steps!r}, expected a whole number >= 0"
    return None


def is_number(value: object) -> TypeGuard[int | float]:
    """Whether a value a site sent in its metadata is a real number (an int or float; a bool is none)."""
    return isinstance(value, int | float) and not isinstance(value, bool)


def is_loss(value: object) -> TypeGuard[int | float]:
    """Whether a value a site sent is a loss: a finite number >= 0 (a sum or mean of per-case losses)."""
    return is_number(value) and math.isfinite(value) and value >= 0


def loss_problem(reply: Message) -> str | None:
    """Why a reply's ``loss`` (its mean local training loss: rounds.csv's ``train_loss``) cannot be used: it is not a
    number (NaN allowed: a diverged site says so in its loss)."""
    loss = reply.meta.get("loss", 0.0)
    return None if is_number(loss) else f"loss = {loss!r:.80}, expected a number"


# what an evaluation reply's tensors hold (NaN allowed: a score not computed); a metric's own names too (FedSM's
# ``dice_global``, ``dice_personal``: the candidates' scores it re-routes at any gamma), and the selector's softmax
SCORE_RANGES = {"dice": (0.0, 1.0), "nsd": (0.0, 1.0), "hd95": (0.0, math.inf), "probs": (0.0, 1.0)}
PER_REGION = ("dice", "nsd", "hd95")  # scores (cases, regions); every other tensor of the reply is per case too
SCORE_SLACK = 1e-6  # float rounding a site's scores may carry past their bounds


def scores_problem(msg: Message, reply: Message, regions: int, declared: int | None = None) -> str | None:
    """Why an evaluation reply cannot become result rows: the ``model`` it reports is not the one ``msg`` asked it
    to score; its ``cases`` are not a JSON list of distinct case ids, or not ``declared`` many (the size of the split
    ``msg`` names, as the site declared it); a tensor is not per case (first axis: the cases), a score (``PER_REGION``,
    and its ``<metric>_<candidate>`` variants) not ``(cases, regions)``, or a value leaves its ``SCORE_RANGES``
    range (a score that is not floating point: an integer 1000 passed the range check). None for a reply without
    ``cases`` to a message that names no ``split`` (no scores: ``share_model``)."""
    import json

    asked = msg.meta.get("model")
    if asked is not None and reply.meta.get("model") != asked:
        return f"it reports scores of model {reply.meta.get('model')!r}, asked to score {asked!r}"
    if "cases" not in reply.meta:
        return "it names no cases for its scores" if "split" in msg.meta else None
    try:
        cases = json.loads(str(reply.meta["cases"]))
    except ValueError:
        return "its case list is not JSON"
    if not isinstance(cases, list) or not all(isinstance(c, str) for c in cases) or len(set(cases)) != len(cases):
        return "its case list is not a list of distinct case ids"
    if declared is not None and len(cases) != declared:
        return f"it scored {len(cases)} cases of its {msg.meta.get('split')} split, which it declared as {declared}"
    for name, scores in reply.tensors.items():
        kind = name.split("_", 1)[0]
        if scores.dim() == 0 or scores.shape[0] != len(cases):
            return f"its {name!r} has shape {tuple(scores.shape)}, not one row per case ({len(cases)})"
        if kind in PER_REGION and tuple(scores.shape) != (len(cases), regions):
            expected = f"({len(cases)}, {regions}): cases x regions"
            return f"its {name} scores have shape {tuple(scores.shape)}, expected {expected}"
        if kind not in SCORE_RANGES:
            continue
        if not scores.is_floating_point():
            return f"its {name} scores are {scores.dtype}, not floating point"
        low, high = SCORE_RANGES[kind]
        values = scores[~torch.isnan(scores)].double()
        outside = values[(values < low - SCORE_SLACK) | (values > high + SCORE_SLACK)]
        if outside.numel():
            return f"its {name} scores leave [{low:g}, {high:g}] (e.g. {float(outside[0]):g})"
    return None


def model_problem(weights: Mapping[str, torch.Tensor], reference: Mapping[str, torch.Tensor]) -> str | None:
    """Why ``weights`` (a server's global model after its merge) cannot be sent to the sites in place of
    ``reference`` (the same model before): another set of names, a tensor of another shape or dtype, or one that is
    not a tensor or holds NaN/Inf; None when none of these."""
    if not isinstance(weights, Mapping):
        return f"it is a {type(weights).__name__}, not a mapping of tensor names to tensors"
    missing, unknown = sorted(set(reference) - set(weights)), sorted(set(weights) - set(reference))
    if missing:
        return f"{len(missing)} of its {len(reference)} tensors are missing, e.g. {missing[0]!r}"
    if unknown:
        return f"tensor {unknown[0]!r} is not one of the model's"
    for name, tensor in weights.items():
        before = reference[name]
        if not isinstance(tensor, torch.Tensor):
            return f"{name!r} is a {type(tensor).__name__}, not a tensor"
        if tensor.shape != before.shape or tensor.dtype != before.dtype:
            return (
                f"tensor {name!r} has shape {tuple(tensor.shape)} {tensor.dtype}, the model's is "
                f"{tuple(before.shape)} {before.dtype}"
            )
        if tensor.is_floating_point() and not all_finite(tensor):
            return f"tensor {name!r} holds {'NaN' if bool(torch.isnan(tensor).any()) else 'Inf'}"
    return None


def group_problem(sent: Collection[str], returned: Collection[str]) -> str | None:
    """Why the tensor names ``returned`` do not answer the names ``sent``: a group both use (``model/...``) with a
    name missing or one that was not sent, or a name sent in a group returned without it (``conv.weight`` for
    ``model/conv.weight``: the next exchange would find the group missing); None when every shared group comes back
    whole."""
    ungrouped = {n.split("/", 1)[1]: n for n in sent if _group(n)}
    bare = next((n for n in sorted(returned) if not _group(n) and n in ungrouped), None)
    if bare is not None:
        return f"tensor {bare!r} came back without its group: it was sent as {ungrouped[bare]!r}"
    for group in sorted({_group(n) for n in returned} & {_group(n) for n in sent} - {""}):
        sent_names = {n for n in sent if _group(n) == group}
        returned_names = {n for n in returned if _group(n) == group}
        if sent_names - returned_names:
            missing = sorted(sent_names - returned_names)
            return f"{len(missing)} of the {len(sent_names)} tensors sent as {group}/ are missing, e.g. {missing[0]!r}"
        if returned_names - sent_names:
            return (
                f"tensor {sorted(returned_names - sent_names)[0]!r} was not sent as part of {group}/ (an unknown name)"
            )
    return None


OUTLIER_RATIO = 100.0  # an update this many times the median of the other sites' (L2 norm) is said (outliers)


def update_norm(sent: Message, reply: Message) -> float:
    """The L2 norm of a reply's update: its float tensors minus the ones sent of the same name and shape (the
    others, e.g. a method's own statistics, left out); 0 where there is none. In float32, one tensor at a time
    (``torch.linalg.vector_norm``; relative error ~1e-3 on 22.6M weights): a number for the 100x outlier warning,
    not a result (robust merges and clipping use ``messages.l2_norm``, float64), which it falls back to where float32
    overflows (entries beyond ~1e19). The float64 sum of squares took 46 ms per site of DynUNet's 22.6M weights,
    0.5 s of a 3.5 s FeTS round on an H200's host (``benchmarks/gpu_profile.py``)."""
    update = {
        name: t - sent.tensors[name]
        for name, t in reply.tensors.items()
        if t.is_floating_point() and name in sent.tensors and sent.tensors[name].shape == t.shape
    }
    norm = math.sqrt(sum(float(torch.linalg.vector_norm(d)) ** 2 for d in update.values()))
    return norm if math.isfinite(norm) else l2_norm(update)


def outlying_updates(sent: Mapping[str, Message], replies: Mapping[str, Message]) -> dict[str, tuple[float, float]]:
    """``{site: (its update's norm, the median of the other sites')}`` for each site whose update is more than
    :data:`OUTLIER_RATIO` times the others' median: a site that sends a scaled or garbage update (a faulty site,
    or a poisoned one: plain FedAvg averages whatever each site sends, weighted by the size it declares). With two
    replies the other's norm is the median: the larger one is named (which of the two is faulty the numbers cannot
    say, but it is the one that dominates the average; a two-site audit merged a x10^4 update without a word)."""
    if len(replies) < 2:
        return {}
    norms = {site: update_norm(sent[site], reply) for site, reply in replies.items()}
    out = {}
    for site, norm in norms.items():
        median = statistics.median(v for s, v in norms.items() if s != site)
        if median > 0 and norm > OUTLIER_RATIO * median:
            out[site] = (norm, median)
    return out


def weight_problem(meta: Mapping[str, object], train_cases: int) -> str | None:
    """Why a reply's ``num_examples`` (the site's aggregation weight n_k) cannot be used: it is not ``train_cases``,
    the training-set size the site declared; None when it is, or when the reply reports none."""
    n_k = meta.get("num_examples")
    if n_k is not None and n_k != train_cases:
        return f"num_examples = {n_k!r} (its aggregation weight), but the site holds {train_cases} training cases"
    return None


def _group(name: str) -> str:
    """The group of a tensor name: ``"model/conv.weight"`` -> ``"model"`` (``""`` for a name without one)."""
    return name.split("/", 1)[0] if "/" in name else ""
