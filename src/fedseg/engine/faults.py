"""Faults: injected where a site answers (config ``faults``), detected where a reply arrives (every
engine), and the failure policy (``fl.on_failure``, ``fl.min_sites``, ``fl.timeout_s``).

Detection, in :meth:`fedseg.engine.base.BaseEngine.exchange` for every reply before the server sees it:

* the site raised (its client failed, or an injected ``crash``) or answered after ``fl.timeout_s``
  seconds of wall time (an injected ``hang``; on Flower, no reply by then);
* a reply tensor of a training exchange holds NaN or Inf (evaluation replies may: an HD95 with an
  empty mask is NaN);
* a reply tensor named like a tensor of the message the site received has another shape or dtype.

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
import time

import torch

from fedseg.config import FaultSpec, RunConfig
from fedseg.engine.messages import Message


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


class InjectedCrash(RuntimeError):
    """Raised by a site whose ``faults`` entry says ``crash``."""


def matching_faults(cfg: RunConfig, site: str, rnd: int, action: str) -> list[FaultSpec]:
    return [f for f in cfg.faults if f.site == site and f.action == action and f.round in (None, rnd)]


def inject(faults: list[FaultSpec], msg: Message, reply: Message | None, cfg: RunConfig) -> Message | None:
    """Apply ``faults`` to a site's answer: ``reply`` None means before the client runs (crash, hang);
    otherwise returns the changed reply (nan, inf, shape, scale)."""
    for fault in faults:
        if reply is None:
            if fault.kind == "crash":
                raise InjectedCrash(f"injected crash (faults: {fault.site}, round {fault.round or 'every'})")
            if fault.kind == "hang":
                assert cfg.fl.timeout_s is not None  # RunConfig refuses a hang without a timeout
                time.sleep(cfg.fl.timeout_s * 1.2 + 0.05)
            continue
        tensors = dict(reply.tensors)
        floats = sorted(k for k, t in tensors.items() if t.is_floating_point() and t.numel())
        if fault.kind in ("nan", "inf") and floats:
            tensors[floats[0]] = torch.full_like(tensors[floats[0]], math.nan if fault.kind == "nan" else math.inf)
        elif fault.kind == "shape" and floats:
            tensors[floats[0]] = tensors[floats[0]].flatten()[1:]
        elif fault.kind == "scale":
            for k in floats:
                sent = msg.tensors.get(k)
                if sent is not None and sent.shape == tensors[k].shape:
                    tensors[k] = sent + fault.factor * (tensors[k] - sent)
                else:
                    tensors[k] = tensors[k] * fault.factor
        reply = Message(tensors, dict(reply.meta))
    return reply


def all_finite(tensor: torch.Tensor) -> bool:
    """Whether every value of the floating-point ``tensor`` is finite. First from its sum, which reads the tensor
    once and allocates no copy of it: NaN and Inf propagate through a sum (Inf - Inf is NaN), so a finite sum means
    finite values; only a non-finite sum (a NaN/Inf, or finite values whose sum overflows) is checked value by
    value, as ``isfinite(t).all()``, which writes a mask of the tensor's size."""
    return bool(torch.isfinite(tensor.sum())) or bool(torch.isfinite(tensor).all())


def reply_problem(msg: Message, reply: Message, check_finite: bool) -> str | None:
    """Why ``reply`` cannot be used, or None: a tensor with NaN/Inf (if ``check_finite``), or one named
    like a tensor of ``msg`` with another shape or dtype."""
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
    return None
