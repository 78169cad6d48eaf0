"""The documentation cannot go stale where it is generated or executable: docs/methods.md is what
docs/gen_methods.py writes from the method registry (run ``python docs/gen_methods.py`` after changing a method or
its options), docs/results.md's tables are what docs/gen_results.py writes from the committed benchmark results, and
the README's Python example runs as printed."""

from __future__ import annotations

import contextlib
import importlib.util
import io
import json
import re
from pathlib import Path

from fedseg.algorithms import ALGORITHMS, BUILTIN_ALGORITHMS

ROOT = Path(__file__).resolve().parents[1]
CLAIMS = "benchmarks/results/headline-equal/claims.json"  # the claims the README and docs/results.md count


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


def test_results_page_tables_are_what_the_benchmarks_wrote():
    """docs/results.md's tables between its generated markers equal docs/gen_results.py's rendering of the committed
    benchmark results (bench tables.json, personalized.json, claims.json), so no number there is copied by hand."""
    spec = importlib.util.spec_from_file_location("gen_results", ROOT / "docs" / "gen_results.py")
    assert spec is not None and spec.loader is not None
    gen_results = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gen_results)
    page = (ROOT / "docs" / "results.md").read_text()
    blocks = [m.group("what").split()[0] for m in gen_results.BLOCK.finditer(page)]
    assert {"headline", "personalized", "claims"} <= set(blocks)
    assert page.count("<!-- generated: ") == len(blocks)  # every block closed, none skipped
    assert gen_results.render(page) == page, "docs/results.md's tables are stale: run python docs/gen_results.py"
    # each headline column holds the tables.json field it names
    for match in gen_results.BLOCK.finditer(page):
        kind, *args = match.group("what").split()
        if kind != "headline":
            continue
        methods = json.loads((ROOT / args[0] / "tables.json").read_text())["federations"][args[1]]["methods"]
        head, _, *body = match.group("body").strip().splitlines()
        names = [h.strip() for h in head.strip("|").split("|")]
        for line in body:
            row = dict(zip(names, (c.strip() for c in line.strip("|").split("|")), strict=True))
            m = methods[row["method"]]
            assert row["Dice"].startswith(f"{m['dice']['mean']:.3f} ± {m['dice']['std']:.3f}")
            assert row["SGD steps"] == f"{m['cost']['sgd_steps']:,.0f}"
            delta = next(v for k, v in row.items() if k.startswith("Δ vs"))
            if m.get("wilcoxon"):
                assert delta.startswith(f"{m['wilcoxon']['mean_diff']:+.4f}")
                assert delta.endswith("†") == bool(m["wilcoxon"]["ci_excludes_0"])


def test_the_verdict_counts_in_prose_are_the_committed_claims():
    """The README's and docs/results.md's sentences that count the claims' verdicts (written by hand around the
    generated table) say what the committed claims.json says, so a new claim or a re-run cannot leave them stale."""
    verdicts = [c["verdict"] for c in json.loads((ROOT / CLAIMS).read_text())["claims"]]
    counts = {v: verdicts.count(v) for v in ("holds", "fails", "not shown")}
    readme = (ROOT / "README.md").read_text()
    said = re.search(r"give (\d+) \(claim, federation\) pairs[^.]*\. Here (\d+) hold, (\d+) fail and (\d+)", readme)
    assert said is not None, "README: the claims' count sentence is gone"
    assert tuple(map(int, said.groups())) == (len(verdicts), counts["holds"], counts["fails"], counts["not shown"])
    page = (ROOT / "docs" / "results.md").read_text()
    said = re.search(r"Reading the verdicts: (\d+) of the (\d+) .*? rows hold, (\d+) fail and (\d+) are", page)
    assert said is not None, "docs/results.md: the verdicts' count sentence is gone"
    assert tuple(map(int, said.groups())) == (counts["holds"], len(verdicts), counts["fails"], counts["not shown"])


def test_the_citation_file_is_valid_cff_with_the_package_version_and_the_three_papers():
    import tomllib

    import yaml

    cff = yaml.safe_load((ROOT / "CITATION.cff").read_text(encoding="utf-8"))
    version = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]["version"]
    assert cff["cff-version"] == "1.2.0" and cff["message"] and cff["authors"] and cff["type"] == "software"
    assert str(cff["version"]) == version  # bumped with the package, or the citation names another release
    titles = " | ".join(r["title"] for r in cff["references"])
    assert all(t in titles for t in ("Generalization Gap", "Auto-FedAvg", "brain tumor segmentation"))
    assert "CITATION.cff" in (ROOT / "README.md").read_text(encoding="utf-8")
