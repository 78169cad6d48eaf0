"""fedseg Message <-> Flower RecordDict: exact round trips, through Flower's own object
serialization (deflate/inflate of every nested object, as between SuperLink and SuperNode)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from flwr.app import Context, RecordDict
from flwr.supercore.inflatable.inflatable_object import get_all_nested_objects
from flwr.supercore.inflatable.inflatable_utils import inflate_object_from_contents

from fedseg.engine.messages import Message
from fedseg.flower.node import forget_other_algorithms, get_state, put_state
from fedseg.flower.records import from_recorddict, to_recorddict
from fedseg.flower.snapshots import ContextSnapshots


def _through_the_wire(content: RecordDict) -> RecordDict:
    """Deflate every object to bytes and inflate them again, as Flower does between processes."""
    objects = get_all_nested_objects(content)
    return inflate_object_from_contents(content.object_id, {oid: obj.deflate() for oid, obj in objects.items()})


def _assert_same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert list(a) == list(b)  # names and their order
    for name in a:
        assert a[name].dtype == b[name].dtype and a[name].shape == b[name].shape, name
        assert a[name].contiguous().numpy().tobytes() == b[name].contiguous().numpy().tobytes(), name  # bit for bit


def test_tensors_meta_and_header_round_trip_exactly():
    g = torch.Generator().manual_seed(0)
    tensors = {
        "model/enc.0.weight": torch.randn(4, 3, 3, 3, generator=g),  # float32
        "personal/site 1/enc.0.bias": torch.randn(4, generator=g, dtype=torch.float64),  # nested name, space
        "control/steps": torch.arange(-3, 9, dtype=torch.int64).reshape(3, 4),
        "scalar": torch.tensor(2.5),  # 0-d stays 0-d
        "empty": torch.empty(0, 7),
        "mask": torch.tensor([True, False, True]),
        "transposed": torch.randn(3, 5, generator=g).t(),  # non-contiguous
        "tiny": torch.tensor([1e-45, -0.0, float("inf"), float("nan")]),  # subnormal, signed zero, inf, nan bits
    }
    meta = {"steps": 7, "loss": 0.125, "split": "val", "sample": True, "cases": '["a", "b"]', "zero": 0.0}
    msg, head = from_recorddict(_through_the_wire(to_recorddict(Message(tensors, meta), {"site": "site1", "round": 3})))
    _assert_same(msg.tensors, tensors)
    assert msg.meta == meta and [type(v) for v in msg.meta.values()] == [type(v) for v in meta.values()]
    assert head == {"site": "site1", "round": 3}
    assert msg.num_floats() == Message(tensors, meta).num_floats()  # what the ledger counts


def test_empty_message_and_empty_metadata_round_trip():
    msg, head = from_recorddict(_through_the_wire(to_recorddict(Message())))
    assert msg.tensors == {} and msg.meta == {} and head == {}
    only_meta, _ = from_recorddict(_through_the_wire(to_recorddict(Message({}, {"split": "test"}))))
    assert only_meta.tensors == {} and only_meta.meta == {"split": "test"}


def test_a_message_is_a_handful_of_flower_objects_whatever_its_tensor_count():
    many = Message({f"layer{i}/weight": torch.full((3,), float(i)) for i in range(200)})
    assert len(get_all_nested_objects(to_recorddict(many))) <= 8


def test_the_node_reads_the_same_engine_record_the_engine_writes():
    from fedseg.flower import node, records

    assert node.ENGINE == records.ENGINE  # node.py does not import records (and torch) for engine queries


def test_exotic_dtypes_are_refused_by_name():
    with pytest.raises(TypeError, match="'half'.*bfloat16"):
        to_recorddict(Message({"half": torch.zeros(2, dtype=torch.bfloat16)}))


def test_client_state_survives_flower_context_state_and_snapshots():
    state = {
        "opt/exp_avg.0": torch.randn(5, 2),
        "scaffold_c/w": torch.randn(3, dtype=torch.float64),
        "qfedavg/F": torch.tensor(0.5),
    }
    context = Context(run_id=1, node_id=2, node_config={}, state=RecordDict(), run_config={})
    put_state(context, "fedseg.state.x", state)
    context.state = _through_the_wire(context.state)
    _assert_same(get_state(context, "fedseg.state.x"), state)
    snapshots = ContextSnapshots(context)
    snapshots.save("x", 3, get_state(context, "fedseg.state.x"))
    context.state = _through_the_wire(context.state)
    put_state(context, "fedseg.state.x", {"other": torch.zeros(1)})
    put_state(context, "fedseg.state.x", snapshots.load("x", 3))
    _assert_same(get_state(context, "fedseg.state.x"), state)
    assert get_state(context, "fedseg.state.never") == {}
    put_state(context, "fedseg.state.y", {"other": torch.zeros(1)})
    forget_other_algorithms(context, "y", snapshots)  # the next algorithm of the run starts: x's stores go
    assert sorted(context.state) == ["fedseg.state.y", "fedseg.state.y.index"]


def test_the_coordinator_takes_only_opaque_case_ids_from_a_site():
    """A site names its cases ``case-0001``, ... (``opaque_case_id``, the node's mapping); anything else a site sends
    as a case id (a formula a spreadsheet would run when opening results.csv, terminal codes, a file name) is refused
    in one printable line."""
    import json

    from fedseg.flower.node import opaque_case_ids
    from fedseg.flower.records import case_ids_problem

    def scores(*cases: str) -> Message:
        return Message({"dice": torch.zeros(len(cases), 1)}, {"cases": json.dumps(list(cases))})

    honest = list(opaque_case_ids(SimpleNamespace(cases=[SimpleNamespace(id=f"P{i}") for i in range(12000)])).values())
    assert honest[0] == "case-0001" and honest[-1] == "case-12000"
    assert case_ids_problem("site1", Message(), scores(*honest)) is None
    assert case_ids_problem("site1", Message(), Message({}, {})) is None  # no scores (share_model)
    for rogue in ('=HYPERLINK("http://x","y")', "case-0001\x1b[2J", "BraTS_0001", "case-1", "case-0001 "):
        problem = case_ids_problem("site1", Message(), scores("case-0002", rogue))
        assert problem is not None and "is not an opaque one" in problem and "\x1b" not in problem
