"""The method registry is the one list of methods: the README's table, summary.json and the CLI agree with it."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from fedseg.algorithms import ALGORITHMS, BUILTIN_ALGORITHMS, get_algorithm
from fedseg.algorithms.registry import AlgorithmSpec
from fedseg.run import run_experiment

README = Path(__file__).resolve().parents[1] / "README.md"


def readme_method_table() -> list[str]:
    """Names in the first column of the README's "### Algorithms" table, in order."""
    text = README.read_text()
    section = text[text.index("### Algorithms") :]
    section = section[: section.index("\n### ", 1)] if "\n### " in section[1:] else section
    return re.findall(r"^\| `([a-z0-9-]+)` \|", section, flags=re.MULTILINE)


def test_readme_table_lists_exactly_the_built_in_methods_in_registry_order():
    """The table docs/gen_methods.py writes: the built-in methods only (an installed method plugin, or one registered
    by another test, is not documented there)."""
    builtin = [name for name in ALGORITHMS if name in BUILTIN_ALGORITHMS]
    assert readme_method_table() == builtin, (
        "README.md's '### Algorithms' table and the built-in methods of fedseg.algorithms.ALGORITHMS disagree: "
        "run .venv/bin/python docs/gen_methods.py (it writes the table; do not edit it by hand)"
    )


@pytest.mark.parametrize("spec", ALGORITHMS.values(), ids=list(ALGORITHMS))
def test_every_spec_is_complete(spec: AlgorithmSpec):
    assert spec.display_name and spec.description and spec.kind in ("baseline", "global", "personalized", "clustered")
    assert spec.min_sites >= 1 and isinstance(spec.server, type) and isinstance(spec.client, type)
    assert spec.federated == (spec.kind != "baseline")
    options = spec.parse_options({})
    assert spec.parse_options({}) is options, "options must be parsed once per distinct value (cached)"
    fields = list(type(options).model_fields)
    if fields:  # shared between callers, so frozen: an assignment is refused
        with pytest.raises(ValueError, match="frozen"):
            setattr(options, fields[0], None)


def test_display_names_are_unique_and_family_members_share_one_family_object():
    names = [s.display_name for s in ALGORITHMS.values()]
    assert len(names) == len(set(names))
    fedsm = [s for s in ALGORITHMS.values() if s.family_name == "FedSM"]
    assert [s.name for s in fedsm] == ["fedsm", "fedsm-extra", "fedsm-ensemble"]
    assert len({id(s.family) for s in fedsm}) == 1


def test_unknown_method_and_bad_options_are_named():
    with pytest.raises(KeyError, match=r"unknown algorithm 'fedfoo'; did you mean 'fedprox'\?"):
        get_algorithm("fedfoo")
    with pytest.raises(ValueError, match=r"methods\.fedprox\.mu"):
        get_algorithm("fedprox").parse_options({"mu": -1})


def test_summary_records_display_name_family_and_kind(tmp_path, tiny_config, disc_federation):
    cfg = tiny_config(algorithms=["fedavg", "fedsm"], fl={"rounds": 1})
    run_experiment(cfg, tmp_path, federation=disc_federation(n_sites=2, cases_per_site=8))
    algos = json.loads((tmp_path / "summary.json").read_text())["algorithms"]
    assert {k: algos["fedavg"][k] for k in ("display_name", "family", "kind")} == {
        "display_name": "FedAvg",
        "family": None,
        "kind": "global",
    }
    assert {k: algos["fedsm"][k] for k in ("display_name", "family", "kind")} == {
        "display_name": "FedSM",
        "family": "FedSM",
        "kind": "personalized",
    }
