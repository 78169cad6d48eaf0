"""fedseg ``Message`` <-> Flower ``RecordDict``, exactly.

A fedseg message travels as one Flower ``RecordDict`` with four records:

- ``"fedseg.tensors"``: an ``ArrayRecord`` with one ``uint8`` ``Array`` holding the raw bytes
  of every tensor, one after another;
- ``"fedseg.index"``: a ``ConfigRecord`` whose ``"index"`` (JSON) lists, in message order, each
  tensor's name (free-form paths such as ``"personal/site1/enc.0.weight"``), NumPy dtype with
  byte order (``"<f4"``, ``"<f8"``, ``"<i8"``, ``"|b1"``, ...) and shape: decoding gives the same
  names, order, dtypes, shapes and bits;
- ``"fedseg.meta"``: a ``ConfigRecord`` of the message's metadata (int, float, str and bool
  keep their types; empty metadata is an empty record);
- ``"fedseg.engine"``: a ``ConfigRecord`` the engines use for routing and accounting (site,
  site index, round, action, algorithm; compute seconds in replies). It never reaches the
  algorithm code.

Why one packed ``Array`` rather than one ``Array`` per tensor: Flower 1.41 moves every
``Array`` (and every 5 MB chunk of it) as its own HTTP request between SuperLink, SuperNode and
ClientApp. A FedSM message (global + K personalized models + selector, ~80 tensors) took ~80
requests per hop, seconds on a busy machine and worse over a WAN; packed it takes a handful,
while Flower still chunks large payloads. Only fedseg's own ServerApp and ClientApp read
these records.

Client state stores (``dict[str, Tensor]``) use the same encoding (``pack`` / ``unpack``; see
``fedseg.flower.node``), so a site's state survives Flower's one-process-per-message model
unchanged in Flower's ``Context.state``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch
from flwr.app import Array, ArrayRecord, ConfigRecord, RecordDict

from fedseg.engine.messages import Message
from fedseg.flower.log_text import printable

OPAQUE_CASE_ID = re.compile(r"case-[0-9]{4,9}")  # what a site calls its cases on the wire (``opaque_case_id``)


def opaque_case_id(position: int) -> str:
    """The id of a site's case on the wire: ``case-0001`` for the first of its case list (``position`` 1-based);
    a hospital's file names never leave the site (``fedseg.flower.node.opaque_case_ids``)."""
    return f"case-{position:04d}"


def case_ids_problem(site: str, sent: Message, reply: Message) -> str | None:
    """Why an evaluation reply's case ids are not the opaque ones every site sends (``OPAQUE_CASE_ID``), or None:
    they become rows of the coordinator's results.csv, where a rogue site's ``=HYPERLINK(...)`` would be a
    formula in a spreadsheet. ``reply.meta["cases"]`` was already checked as a JSON list of distinct strings
    (``fedseg.engine.faults.scores_problem``)."""
    if "cases" not in reply.meta:
        return None
    bad = next((c for c in json.loads(str(reply.meta["cases"])) if not OPAQUE_CASE_ID.fullmatch(c)), None)
    if bad is not None:
        return f"its case id {printable(bad)!r} is not an opaque one (case-0001, ...) as every site sends"
    return None


TENSORS = "fedseg.tensors"
INDEX = "fedseg.index"
META = "fedseg.meta"
ENGINE = "fedseg.engine"
PACKED = "packed"  # the Array's name in the TENSORS record


def _as_numpy(name: str, tensor: torch.Tensor) -> np.ndarray:
    try:
        return tensor.detach().cpu().numpy()
    except TypeError as e:  # bfloat16, float8, ...: no exact NumPy dtype
        raise TypeError(
            f"tensor {name!r}: dtype {tensor.dtype} cannot travel exactly ({e}); convert it before sending"
        ) from None


def pack(tensors: Mapping[str, torch.Tensor]) -> tuple[ArrayRecord, ConfigRecord]:
    """``{name: tensor}`` -> (one ``uint8`` Array of all raw bytes, the JSON index [name, dtype, shape])."""
    arrays = [(name, _as_numpy(name, t)) for name, t in tensors.items()]
    index = [[name, a.dtype.str, list(a.shape)] for name, a in arrays]
    buffer = b"".join(a.tobytes(order="C") for _, a in arrays)
    record = ArrayRecord({PACKED: Array(np.frombuffer(buffer, dtype=np.uint8))})
    return record, ConfigRecord({"index": json.dumps(index)})


def unpack(record: ArrayRecord, index: ConfigRecord) -> dict[str, torch.Tensor]:
    """``pack``'s inverse: writable CPU tensors with the original names, order, dtypes and shapes."""
    buffer = record[PACKED].numpy().tobytes() if PACKED in record else b""
    tensors, offset = {}, 0
    for name, dtype, shape in json.loads(str(index["index"])):
        dt = np.dtype(dtype)
        count = int(np.prod(shape, dtype=np.int64))
        array = np.frombuffer(buffer, dtype=dt, count=count, offset=offset).reshape(shape).copy()
        tensors[name] = torch.from_numpy(array)
        offset += count * dt.itemsize
    if offset != len(buffer):
        raise ValueError(f"packed tensors: index covers {offset} bytes, buffer has {len(buffer)}")
    return tensors


def to_recorddict(msg: Message, engine: Mapping[str, int | float | str | bool] | None = None) -> RecordDict:
    """A fedseg message (plus the engine's routing header) as a Flower ``RecordDict``."""
    record, index = pack(msg.tensors)
    return RecordDict(
        {TENSORS: record, INDEX: index, META: ConfigRecord(dict(msg.meta)), ENGINE: ConfigRecord(dict(engine or {}))}
    )


def from_recorddict(content: RecordDict) -> tuple[Message, dict]:
    """``to_recorddict``'s inverse: ``(message, engine header)``."""
    missing = [k for k in (TENSORS, INDEX, META, ENGINE) if k not in content]
    if missing:
        raise ValueError(f"not a fedseg message: records {missing} are missing (has {sorted(content)})")
    arrays, configs = content.array_records, content.config_records
    meta: dict = dict(configs[META])  # numbers, strings and bools only: written by to_recorddict
    return Message(unpack(arrays[TENSORS], configs[INDEX]), meta), dict(configs[ENGINE])


def record_bytes(content: RecordDict) -> int:
    """Bytes a Flower ``RecordDict`` carries: array data, plus config/metric values (numbers 8 bytes each)."""

    def size(v: Any) -> int:
        if isinstance(v, (bytes, str)):
            return len(v)
        if isinstance(v, list):
            return sum(size(x) for x in v)
        return 8

    total = 0
    for rec in content.array_records.values():
        total += sum(len(a.data) for a in rec.values())
    for crec in content.config_records.values():
        total += sum(len(k) + size(v) for k, v in crec.items())
    for mrec in content.metric_records.values():
        total += sum(len(k) + size(v) for k, v in mrec.items())
    return total
