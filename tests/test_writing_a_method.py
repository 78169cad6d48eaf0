"""What a method author is given: one documented import place (``fedseg.algorithms.toolkit``), one list of the hooks
and class-level switches (``fedseg.algorithms.fedavg``'s docstring), the test fixtures (``fedseg.testing``), and a
robust ``aggregator`` that a method's own merge would ignore is refused rather than ignored."""

from __future__ import annotations

import ast
import inspect
import re
from pathlib import Path

import pytest

import fedseg.algorithms.toolkit as toolkit
from fedseg import train
from fedseg.algorithms import (
    ALGORITHMS,
    BUILTIN_ALGORITHMS,
    aggregate,
    client_state,
    fedavg,
    prefixes,
    proximal,
    register_algorithm,
    registry,
    unregister_algorithm,
)
from fedseg.algorithms.fedavg import FedAvgClient, FedAvgOptions, FedAvgServer
from fedseg.algorithms.robust import RobustOptions
from fedseg.engine import context, faults, messages
from fedseg.engine.context import MethodOptions
from fedseg.engine.faults import MethodError
from fedseg.testing import simulate

ROOT = Path(__file__).resolve().parents[1]
HOME = {  # where each name the toolkit gathers is defined: the toolkit re-exports, it defines nothing
    "weighted_average": aggregate,
    "state_group": client_state,
    "put_group": client_state,
    "MODEL": prefixes,
    "proximal_term": proximal,
    "ProximalTerm": proximal,
    "options_as": context,
    "ClientContext": context,
    "MethodOptions": context,
    "Task": context,
    "prefixed": messages,
    "weights_of": messages,
    "Message": messages,
    "MethodError": faults,
    "FedAvgServer": fedavg,
    "FedAvgClient": fedavg,
    "FedAvgOptions": fedavg,
    "AlgorithmSpec": registry,
    "TrainHooks": train,
    "TrainStats": train,
}


def test_the_toolkit_gathers_the_helpers_as_they_are_and_the_docs_list_each():
    assert sorted(toolkit.__all__) == sorted(HOME)
    for name, module in HOME.items():
        assert getattr(toolkit, name) is getattr(module, name), name
    api, contributing = ((ROOT / "docs" / page).read_text() for page in ("api.md", "contributing.md"))
    writing = api[api.index("### Writing a method") :]
    for name in toolkit.__all__:
        assert re.search(rf"`{name}[`(.]", writing), f"docs/api.md 'Writing a method' does not name {name}"
    assert "fedseg.algorithms.toolkit" in contributing


def _public_methods(cls: type) -> set[str]:
    return {name for name, value in vars(cls).items() if not name.startswith("_") and inspect.isfunction(value)}


def test_the_fedavg_docstring_names_every_hook_and_every_class_level_switch():
    """The one list of what a method overrides and declares: a new public method of the FedAvg pair or a new switch
    (an upper-case class attribute) is named there."""
    doc = fedavg.__doc__ or ""
    hooks = _public_methods(FedAvgServer) | _public_methods(FedAvgClient)
    switches = {
        f"{cls.__name__}.{name}"
        for cls in (FedAvgServer, MethodOptions, RobustOptions)
        for name in vars(cls)
        if name.isupper() and not name.startswith("_")
    }
    assert {"aggregate", "train_message", "after_fit", "train_hooks", "state_dict", "summary_fields"} <= hooks
    assert {"RobustOptions.OWN_MERGE", "MethodOptions.PHASED", "MethodOptions.ONE_STEP_AS_FEDAVG"} <= switches
    missing = sorted(h for h in hooks if f"``{h}(" not in doc) + sorted(s for s in switches if f"``{s}``" not in doc)
    assert not missing, f"fedseg.algorithms.fedavg's docstring does not name {missing}"
    for page in ("api.md", "contributing.md"):  # they point at it instead of keeping lists of their own
        assert "fedseg.algorithms.fedavg" in (ROOT / "docs" / page).read_text()


def test_every_built_in_method_that_merges_by_itself_declares_own_merge():
    """The rule the run enforces (below) holds for the built-in methods: a server with an ``aggregate`` of its own and
    options with an ``aggregator`` declare ``OWN_MERGE``."""
    for name in BUILTIN_ALGORITHMS:
        spec = ALGORITHMS[name]
        own_aggregate = spec.server.aggregate is not FedAvgServer.aggregate
        if own_aggregate and issubclass(spec.options, RobustOptions):
            assert spec.options.OWN_MERGE, name


class OwnMean(FedAvgServer):
    """A merge of its own (the plain mean) that never looks at ``aggregator``."""

    def aggregate(self, replies):
        self.global_weights = toolkit.weighted_average(
            [r.group(toolkit.MODEL) for r in replies.values()], [1.0] * len(replies)
        )


class LoggedMerge(FedAvgServer):
    """A merge of its own that merges through FedAvg's, robust merges included."""

    def aggregate(self, replies):
        super().aggregate(replies)
        self.merged_sites = sorted(replies)


class OwnMeanOptions(FedAvgOptions):
    OWN_MERGE = "its merge is the plain mean"


@pytest.fixture
def registered():
    names = []

    def register(name, server, options=FedAvgOptions):
        register_algorithm(toolkit.AlgorithmSpec(name, name, server, FedAvgClient, "test", options), replace=True)
        names.append(name)

    yield register
    for name in names:
        unregister_algorithm(name)


def test_a_robust_aggregator_an_own_merge_ignores_stops_the_run_and_one_it_honours_is_applied(
    registered, tiny_config, disc_federation
):
    registered("own-mean", OwnMean)
    registered("logged-merge", LoggedMerge)
    robust = {"aggregator": "krum", "num_malicious": 0}
    cfg = tiny_config(
        train={"budget": {"unit": "steps", "amount": 1}}, methods={"own-mean": robust, "logged-merge": robust}
    )
    fed = disc_federation(n_sites=3, cases_per_site=6)
    engine, server, _ = simulate("own-mean", cfg, fed)
    engine.round = 1
    with pytest.raises(MethodError, match=r"own-mean, round 1: methods.own-mean.aggregator = krum was not applied"):
        server.run_round(1)
    engine, server, _ = simulate("logged-merge", cfg, fed)
    engine.round = 1
    server.run_round(1)
    kept = [row for row in server.round_metrics() if row["metric"] == "robust_kept"]
    assert server.merged_sites == engine.sites and sum(row["value"] for row in kept) == 1  # Krum kept one model


def test_own_merge_refuses_every_aggregator_but_mean(registered):
    registered("own-mean-declared", OwnMean, OwnMeanOptions)
    spec = ALGORITHMS["own-mean-declared"]
    assert spec.parse_options({"aggregator": "mean"}).aggregator == "mean"
    with pytest.raises(ValueError, match="'krum' is not available: its merge is the plain mean"):
        spec.parse_options({"aggregator": "krum"})


def test_nothing_in_fedseg_imports_its_test_fixtures():
    """``fedseg.testing`` imports pytest, a test-only dependency: no module of the package may import it."""
    src = ROOT / "src" / "fedseg"
    importers = []
    for path in src.rglob("*.py"):
        if path.name == "testing.py" and path.parent == src:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
            if isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
            if any(re.fullmatch(r"fedseg\.testing(\..*)?", n) for n in names):
                importers.append(str(path.relative_to(src)))
    assert not importers


def test_the_fixtures_come_from_fedseg_testing(tiny_config, disc_federation):
    """fedseg's own tests get ``tiny_config`` and ``disc_federation`` as a method package does
    (``pytest_plugins = ["fedseg.testing"]``)."""
    import fedseg.testing

    assert tiny_config is fedseg.testing.make_tiny_config
    assert disc_federation is fedseg.testing.make_disc_federation
    assert tiny_config(fl={"rounds": 3}).fl.rounds == 3 and tiny_config().train.batch_size == 4
    fed = disc_federation(n_sites=2, cases_per_site=2)
    assert fed.site_names == ["site1", "site2"]
