"""The documentation cannot go stale where it is generated or executable: docs/methods.md is what
docs/gen_methods.py writes from the method registry (run ``python docs/gen_methods.py`` after changing a method or
its options), and the README's Python example runs as printed."""

from __future__ import annotations

import contextlib
import importlib.util
import io
import re
from pathlib import Path

from fedseg.algorithms import ALGORITHMS, BUILTIN_ALGORITHMS

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


def test_readme_method_table_is_what_the_registry_generates():
    readme = (ROOT / "README.md").read_text()
    assert _generator().render_readme(readme) == readme, (
        "README.md's method table is stale: run python docs/gen_methods.py"
    )


def test_methods_page_has_one_section_per_registered_method():
    text = (ROOT / "docs" / "methods.md").read_text()
    for name in BUILTIN_ALGORITHMS:
        assert f"\n## `{name}`\n" in text


def test_the_algorithms_page_has_one_row_per_registered_method_in_registry_order():
    text = (ROOT / "docs" / "algorithms.md").read_text()
    section = text[text.index("## Algorithms\n") : text.index("\n## ", text.index("## Algorithms\n") + 1)]
    builtin = [name for name in ALGORITHMS if name in BUILTIN_ALGORITHMS]
    assert re.findall(r"^\| `([a-z0-9-]+)` \|", section, flags=re.MULTILINE) == builtin, (
        "docs/algorithms.md's table and the registry disagree: add / remove / reorder its rows"
    )


def test_the_readme_python_example_runs_as_printed(tmp_path, monkeypatch):
    """The README's one ```python block: one round on a tenth of the demo federation (~15 s on one CPU thread)."""
    blocks = re.findall(r"^```python\n(.*?)^```", (ROOT / "README.md").read_text(), flags=re.MULTILINE | re.DOTALL)
    assert len(blocks) == 1, "the README has one Python example; this test runs it"
    monkeypatch.chdir(tmp_path)
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        exec(compile(blocks[0], "README.md", "exec"), {"__name__": "readme_example"})
    lines = printed.getvalue().splitlines()
    assert lines[0].startswith("{'local': ") and "'fedavg': " in lines[0]  # results.dice()
    assert lines[-1] == "runs/quick/report.html" and (tmp_path / lines[-1]).is_file()
