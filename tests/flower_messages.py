"""Flower reply Messages as a strategy's ``aggregate_train`` receives them (flwr 1.41 message API): shared by
the agreement tests of the server merges (``test_flower_agreement.py``, ``test_robust_aggregation.py``)."""

from __future__ import annotations

import numpy as np
from flwr.app import Array, ArrayRecord, Metadata, MetricRecord, RecordDict
from flwr.app import Message as FlwrMessage


def flower_replies(models: list[dict[str, np.ndarray]], samples: list[int]) -> list[FlwrMessage]:
    """One train reply per model: an ArrayRecord ``arrays`` of its tensors and ``num-examples`` = its sample
    count, from node i + 1."""
    replies = []
    for i, (m, n) in enumerate(zip(models, samples)):
        content = RecordDict(
            {
                "arrays": ArrayRecord({k: Array(v.copy()) for k, v in m.items()}),
                "metrics": MetricRecord({"num-examples": n}),
            }
        )
        metadata = Metadata(
            run_id=1,
            message_id=f"r{i}",
            src_node_id=i + 1,
            dst_node_id=0,
            reply_to_message_id=f"i{i}",
            group_id="1",
            created_at=0.0,
            ttl=60.0,
            message_type="train",
        )
        replies.append(FlwrMessage(content, metadata=metadata))
    return replies
