"""fedseg's q-FedAvg (FeTS Eq. 14, 16, 17) against Flower's QFedAvg (flwr 1.41.0), same inputs.

Both compute ``Delta_k = L F_k^q (w_k - w)`` and ``w + sum Delta_k / sum h_k`` (Flower with the
opposite sign convention ``L (w - w_k)`` and ``w - ...``). Where the definitions differ:

1. ``h_k``'s first term. FeTS Eq. 16 (fedseg's default ``h_norm = "fets"``) uses the unscaled
   update, ``q F^(q-1) ||w_k - w||^2``; Flower (and Li et al.'s Algorithm 3, fedseg's
   ``h_norm = "li"``) uses ``q F^(q-1) ||L (w_k - w)||^2``. So the two agree fully with
   ``h_norm = "li"``, and with ``"fets"`` only at ``q = 0`` or ``L = 1``; otherwise the
   first terms differ by exactly ``L^2``, which is checked.
2. The loss. fedseg's site computes ``F_k(w^t)`` itself, with a forward-only pass of the global
   model over its training split before training (Eq. 15). Flower's ``serverapp`` QFedAvg
   takes whatever number the client reports under ``train_loss`` (usually the mean loss
   *during* local training); the legacy ``flwr.server.strategy.QFedAvg`` uses the server-side
   ``evaluate_fn`` loss of the global model — one value for every client. The tests feed the
   same numbers to both sides.
3. Flower adds 1e-10 to the loss before taking powers (a relative change of ~1e-10 here).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from flwr.app import Array, ArrayRecord, Message, Metadata, MetricRecord, RecordDict
from flwr.common import Code, FitRes, Status, ndarrays_to_parameters, parameters_to_ndarrays
from flwr.server.strategy import QFedAvg as LegacyQFedAvg
from flwr.serverapp.strategy import QFedAvg
from flwr.serverapp.strategy.qfedavg import compute_delta_and_h

from fedseg.algorithms.qfedavg import delta_and_h, qffl_update

SHAPES = {"enc.weight": (3, 4), "enc.bias": (5,), "dec.weight": (2, 2, 3)}
LOSSES = [0.8, 0.35, 1.7, 0.5]  # F_k, unequal
LR = 0.1  # L = 1 / lr = 10
# Flower's message-API strategies collect garbage once per reply (conftest's ``frozen_heap``)
pytestmark = pytest.mark.usefixtures("frozen_heap")


def _updates(seed: int = 0) -> tuple[dict, list[dict]]:
    """A global model and 4 local models (float32, unequal update sizes)."""
    g = torch.Generator().manual_seed(seed)
    glob = {k: torch.randn(s, generator=g) for k, s in SHAPES.items()}
    local = [
        {k: v + 0.05 * (i + 1) * torch.randn(v.shape, generator=g) for k, v in glob.items()} for i in range(len(LOSSES))
    ]
    return glob, local


def _fedseg(glob, local, losses, q, L, h_norm):
    pairs = [delta_and_h(glob, w, F, q, L, h_norm) for w, F in zip(local, losses)]
    return qffl_update(glob, [d for d, _ in pairs], [h for _, h in pairs]), [h for _, h in pairs]


def _reply(weights: dict, loss: float, node: int) -> Message:
    content = RecordDict(
        {
            "arrays": ArrayRecord({k: Array(v.numpy()) for k, v in weights.items()}),
            "metrics": MetricRecord({"train_loss": loss, "num-examples": 10 + node}),
        }
    )
    meta = Metadata(
        run_id=0,
        message_id="",
        src_node_id=node + 1,
        dst_node_id=0,
        reply_to_message_id="",
        group_id="",
        created_at=0.0,
        ttl=3600.0,
        message_type="train",
    )
    return Message(content=content, metadata=meta)


def _flower(glob, local, losses, q, lr) -> dict:
    strategy = QFedAvg(client_learning_rate=lr, q=q)
    strategy.current_arrays = ArrayRecord({k: Array(v.numpy()) for k, v in glob.items()})
    arrays, _ = strategy.aggregate_train(1, [_reply(w, F, i) for i, (w, F) in enumerate(zip(local, losses))])
    return {k: torch.from_numpy(np.asarray(v)) for k, v in zip(glob, arrays.to_numpy_ndarrays())}


def _assert_close(a: dict, b: dict, atol: float = 1e-6):
    assert a.keys() == b.keys()
    for k in a:
        assert torch.allclose(a[k].double(), b[k].double(), rtol=0, atol=atol), (
            k,
            (a[k].double() - b[k].double()).abs().max(),
        )


@pytest.mark.parametrize("q", [0.0, 0.5, 1.0, 2.0])
def test_li_norm_merge_equals_flower_qfedavg(q):
    glob, local = _updates()
    ours, _ = _fedseg(glob, local, LOSSES, q, 1 / LR, "li")
    _assert_close(ours, _flower(glob, local, LOSSES, q, LR))
    assert any((ours[k] - glob[k]).abs().max() > 1e-3 for k in glob)  # a real step was taken


@pytest.mark.parametrize("q", [0.5, 1.0, 2.0])
def test_fets_eq16_differs_from_flower_only_by_L_squared_in_the_norm_term(q):
    glob, local = _updates(1)
    L = 1 / LR
    for w, F in zip(local, LOSSES):
        ours_delta, ours_h = delta_and_h(glob, w, F, q, L, "fets")
        flower_delta, flower_h = compute_delta_and_h(
            [v.numpy().copy() for v in glob.values()], [v.numpy().copy() for v in w.values()], q, L, F
        )
        for (k, d), fd in zip(ours_delta.items(), flower_delta):  # Eq. 14: identical up to the sign convention
            assert np.allclose(d.numpy(), -fd, rtol=1e-6, atol=1e-6), k
        base = L * F**q  # the common second term L F^q
        assert (flower_h - base) == pytest.approx(L**2 * (ours_h - base), rel=1e-6)
        assert (flower_h - base) > 10 * (ours_h - base) > 0  # so the merges really differ for L != 1
    ours, _ = _fedseg(glob, local, LOSSES, q, L, "fets")
    theirs = _flower(glob, local, LOSSES, q, LR)
    assert max(float((ours[k].double() - theirs[k].double()).abs().max()) for k in glob) > 1e-4


@pytest.mark.parametrize("q", [0.0, 1.0])
def test_fets_eq16_equals_flower_where_the_definitions_coincide(q):
    """q = 0 (no norm term) for any L; L = 1 (L^2 = 1) for any q."""
    glob, local = _updates(2)
    _assert_close(_fedseg(glob, local, LOSSES, 0.0, 1 / LR, "fets")[0], _flower(glob, local, LOSSES, 0.0, LR))
    _assert_close(_fedseg(glob, local, LOSSES, q, 1.0, "fets")[0], _flower(glob, local, LOSSES, q, 1.0))


def test_legacy_flower_strategy_with_one_server_side_loss():
    """flwr.server.strategy.QFedAvg takes F from its evaluate_fn (the same for every client)."""
    glob, local = _updates(3)
    q, F = 1.0, 0.6
    strategy = LegacyQFedAvg(q_param=q, qffl_learning_rate=LR, evaluate_fn=lambda rnd, nds, cfg: (F, {}))
    strategy.pre_weights = [v.numpy() for v in glob.values()]
    ok = Status(code=Code.OK, message="")
    results = [(None, FitRes(ok, ndarrays_to_parameters([v.numpy() for v in w.values()]), 10, {})) for w in local]
    params, _ = strategy.aggregate_fit(1, results, [])
    theirs = {k: torch.from_numpy(np.asarray(v)) for k, v in zip(glob, parameters_to_ndarrays(params))}
    ours, _ = _fedseg(glob, local, [F] * len(local), q, 1 / LR, "li")
    _assert_close(ours, theirs)
