"""The documentation cannot go stale where it is generated: docs/methods.md is what docs/gen_methods.py writes
from the method registry (run ``python docs/gen_methods.py`` after changing a method or its options)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _generator():
    spec = importlib.util.spec_from_file_location("gen_methods", ROOT / "docs" / "gen_methods.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_methods_page_is_what_the_registry_generates():
    committed = (ROOT / "docs" / "methods.md").read_text()
    assert committed == _generator().render(), "docs/methods.md is stale: run python docs/gen_methods.py"


def test_methods_page_has_one_section_per_registered_method():
    from fedseg.algorithms import BUILTIN_ALGORITHMS

    text = (ROOT / "docs" / "methods.md").read_text()
    for name in BUILTIN_ALGORITHMS:
        assert f"\n## `{name}`\n" in text
