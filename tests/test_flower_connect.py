"""``fedseg.flower.engine.connect_sites`` against a Grid whose SuperNodes answer late (the order a loaded machine gave
the real deployment test): a node refused for the key it uses is asked again, once at a time, so its restarted
SuperNode's answers cannot name the one node twice for its site.

The Grid here is Flower's ``Grid`` interface as ``connect_sites`` uses it (node ids, push, pull) with real Flower
messages, so that the answers' timing can be chosen; ``tests/test_flower_security.py`` runs the same refusal on a
real deployment."""

from __future__ import annotations

from collections import Counter

import pytest
from flwr.app import ConfigRecord, Metadata, RecordDict
from flwr.app import Message as FlowerMessage
from flwr.supercore.task_identity import TaskIdentity

from fedseg.flower import engine
from fedseg.flower.engine import Courier, SiteError, connect_sites
from fedseg.flower.records import ENGINE


@pytest.fixture(autouse=True)
def serverapp_identity(monkeypatch):
    """The task, run and node ids Flower's runtime gives a ServerApp process (its messages carry them)."""
    monkeypatch.setattr(TaskIdentity, "_run_id", 1)
    monkeypatch.setattr(TaskIdentity, "_node_id", 0)
    monkeypatch.setattr(TaskIdentity, "_task_id", 1)


def answer(query_id: str, node: int, site: str) -> FlowerMessage:
    """A SuperNode's reply to an ``info`` query: the site it declares and its split sizes."""
    content = RecordDict({ENGINE: ConfigRecord({"site": site, "cases": 4, "train": 2, "val": 1, "test": 1})})
    metadata = Metadata(
        run_id=1,
        message_id=f"r{query_id}",
        src_node_id=node,
        dst_node_id=0,
        reply_to_message_id=query_id,
        group_id="",
        created_at=0.0,
        ttl=60.0,
        message_type="query.info",
    )
    return FlowerMessage(content, metadata=metadata)


class LateGrid:
    """Nodes that answer a query only after ``late`` pulls; ``declares[node]``: the sites it names, one per answer
    (the last one repeated)."""

    def __init__(self, declares: dict[int, list[str]], late: int):
        self.declares, self.late = declares, late
        self.queries: dict[str, list[int]] = {}  # query id -> [node, pulls before its answer]
        self.asked: Counter[int] = Counter()

    def get_node_ids(self) -> list[int]:
        return list(self.declares)

    def push_messages(self, messages: list[FlowerMessage]) -> list[str]:
        ids = []
        for m in messages:
            ids.append(f"q{len(self.queries)}")
            self.queries[ids[-1]] = [m.metadata.dst_node_id, self.late]
            self.asked[m.metadata.dst_node_id] += 1
        return ids

    def pull_messages(self, ids: list[str]) -> list[FlowerMessage]:
        replies = []
        for i in ids:
            node, left = self.queries[i]
            if left > 0:
                self.queries[i][1] -= 1
                continue
            sites = self.declares[node]
            replies.append(answer(i, node, sites.pop(0) if len(sites) > 1 else sites[0]))
        return replies


def test_a_refused_node_is_asked_again_once_at_a_time_and_serves_its_site_once(monkeypatch):
    monkeypatch.setattr(engine, "REFUSED_RETRY", 0.0)  # ask a refused node again at once
    # node 7 holds site2's key: its first SuperNode declares site1 (refused), the restarted one site2
    grid = LateGrid({7: ["site1", "site2"], 8: ["site1"]}, late=3)
    found = connect_sites(Courier(grid, poll=0.0), ["site1", "site2"], {}, wait=30, node_sites={7: "site2", 8: "site1"})
    assert found.nodes == {"site1": 8, "site2": 7}
    assert grid.asked == {7: 2, 8: 1}  # the refusal's query, then one more: never two in flight


def test_two_nodes_naming_one_site_still_fail_the_run():
    grid = LateGrid({7: ["site1"], 8: ["site1"]}, late=1)
    with pytest.raises(SiteError, match=r"two SuperNodes \(7 and 8\) both serve site 'site1'"):
        connect_sites(Courier(grid, poll=0.0), ["site1", "site2"], {}, wait=30)
