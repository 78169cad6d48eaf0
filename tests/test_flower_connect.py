"""``fedseg.flower.engine.connect_sites`` against a Grid whose SuperNodes answer late (the order a loaded machine gave
the real deployment test): a node refused for the key it uses is asked again, once at a time, so its restarted
SuperNode's answers cannot name the one node twice for its site.

The Grid here is Flower's ``Grid`` interface as ``connect_sites`` uses it (node ids, push, pull) with real Flower
messages, so that the answers' timing can be chosen; ``tests/test_flower_security.py`` runs the same refusal on a
real deployment."""

from __future__ import annotations

from collections import Counter

import pytest
from flwr.app import ConfigRecord, Error, Metadata, RecordDict
from flwr.app import Message as FlowerMessage
from flwr.supercore.task_identity import TaskIdentity

from fedseg.flower import engine
from fedseg.flower.engine import Courier, SiteError, connect_sites
from fedseg.flower.flwr_internals import node_left_error_code
from fedseg.flower.records import ENGINE


@pytest.fixture(autouse=True)
def serverapp_identity(monkeypatch):
    """The task, run and node ids Flower's runtime gives a ServerApp process (its messages carry them)."""
    monkeypatch.setattr(TaskIdentity, "_run_id", 1)
    monkeypatch.setattr(TaskIdentity, "_node_id", 0)
    monkeypatch.setattr(TaskIdentity, "_task_id", 1)


def answer(query_id: str, node: int, site: str, train: int = 2) -> FlowerMessage:
    """A SuperNode's reply to an ``info`` query: the site it declares and its split sizes; ``LEFT``: the reply the
    SuperLink gives in its place when the node stopped sending heartbeats before it answered."""
    metadata = _metadata(query_id, node)
    if site == LEFT:
        return FlowerMessage(metadata=metadata, error=Error(code=node_left_error_code(), reason="Node Unavailable"))
    content = RecordDict({ENGINE: ConfigRecord({"site": site, "cases": 4, "train": train, "val": 1, "test": 1})})
    return FlowerMessage(content, metadata=metadata)


LEFT = "<the node stopped>"


def _metadata(query_id: str, node: int) -> Metadata:
    """The metadata of node ``node``'s reply to message ``query_id``."""
    return Metadata(
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


class LateGrid:
    """Nodes that answer a query only after ``late`` pulls; ``declares[node]``: the sites it names, one per answer
    (the last one repeated)."""

    def __init__(self, declares: dict[int, list[str]], late: int):
        self.declares, self.late = declares, late
        self.queries: dict[str, list[int]] = {}  # query id -> [node, pulls before its answer]
        self.notices: set[str] = set()  # ids of refusal notices (a node answers them without declaring a site)
        self.asked: Counter[int] = Counter()  # info queries per node
        self.notified: Counter[int] = Counter()  # refusal notices per node

    def get_node_ids(self) -> list[int]:
        return list(self.declares)

    def push_messages(self, messages: list[FlowerMessage]) -> list[str]:
        ids = []
        for m in messages:
            ids.append(f"q{len(self.queries)}")
            self.queries[ids[-1]] = [m.metadata.dst_node_id, self.late]
            if m.metadata.message_type == "query.refused":
                self.notices.add(ids[-1])
                self.notified[m.metadata.dst_node_id] += 1
            else:
                self.asked[m.metadata.dst_node_id] += 1
        return ids

    def pull_messages(self, ids: list[str]) -> list[FlowerMessage]:
        replies = []
        for i in ids:
            node, left = self.queries[i]
            if left > 0:
                self.queries[i][1] -= 1
                continue
            if i in self.notices:
                replies.append(FlowerMessage(RecordDict(), metadata=_metadata(i, node)))
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
    assert grid.notified == {7: 1}  # told why, in its own log


def test_two_nodes_naming_one_site_still_fail_the_run():
    grid = LateGrid({7: ["site1"], 8: ["site1"]}, late=1)
    with pytest.raises(SiteError, match=r"two SuperNodes \(7 and 8\) both serve site 'site1'"):
        connect_sites(Courier(grid, poll=0.0), ["site1", "site2"], {}, wait=30)


def test_a_refused_node_that_stops_while_asked_again_does_not_end_the_run(monkeypatch, caplog):
    """The deployment guide tells a hospital to restart a refused SuperNode with the right --site: stopping it while
    the coordinator's next query is in flight (the SuperLink answers that query with NODE_UNAVAILABLE) is waited
    out, and its restart joins. The refusal is one WARNING however often the node is asked again."""
    monkeypatch.setattr(engine, "REFUSED_RETRY", 0.0)
    # node 7 (site2's key): declares site1 three times (refused), stops, is restarted declaring site2
    grid = LateGrid({7: ["site1", "site1", "site1", LEFT, "site2"], 8: ["site1"]}, late=1)
    with caplog.at_level("DEBUG", logger=engine.log.name):
        found = connect_sites(Courier(grid, poll=0.0), ["site1", "site2"], {}, 30, node_sites={7: "site2", 8: "site1"})
    assert found.nodes == {"site1": 8, "site2": 7}
    assert grid.notified == {7: 1}  # once, however often it was refused for that reason; none for stopping
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert warnings == [
        "SuperNode 7 refused: it declares site 'site1' but authenticated with the key of site 'site2'",
        "SuperNode 7 stopped before it answered; its site is waited for (a restart is asked again)",
    ]


def test_a_node_that_stops_before_answering_is_named_when_its_site_never_comes():
    grid = LateGrid({7: [LEFT], 8: ["site1"]}, late=0)
    with pytest.raises(SiteError, match=r"site site2 did not connect within 0 s .*SuperNode 7 stopped before it"):
        connect_sites(Courier(grid, poll=0.0), ["site1", "site2"], {}, wait=0.0, node_sites={7: "site2", 8: "site1"})


def test_a_negative_split_size_in_the_data_check_answer_is_refused_naming_the_node(monkeypatch):
    """The sizes a node declares are what its aggregation weights are checked against: -5 training cases fails the
    run before round 1, naming the node and its site."""
    grid = LateGrid({7: ["site1"]}, late=0)
    monkeypatch.setattr(
        grid, "pull_messages", lambda ids: [answer(i, grid.queries[i][0], "site1", train=-5) for i in ids]
    )
    with pytest.raises(SiteError, match=r"SuperNode 7 \(site 'site1'\) reported train = -5 cases"):
        connect_sites(Courier(grid, poll=0.0), ["site1"], {}, wait=30)


def test_a_nodes_data_check_answer_without_a_split_size_is_refused_naming_it():
    """The engine reads every site's train, val and test sizes: an answer without one was a KeyError later, naming
    no site (a trust-boundary audit)."""
    from fedseg.flower.engine import split_sizes

    assert split_sizes({"cases": 4, "train": 2, "val": 1, "test": 1}, "SuperNode 7") == {
        "cases": 4,
        "train": 2,
        "val": 1,
        "test": 1,
    }
    with pytest.raises(SiteError, match="SuperNode 7 reported no size of its val split"):
        split_sizes({"cases": 4, "train": 2, "test": 1}, "SuperNode 7")
    with pytest.raises(SiteError, match=r"reported \\x1b\[2J = -1 cases"):
        split_sizes({"\x1b[2J": -1, "train": 2, "val": 1, "test": 1}, "SuperNode 7")
