"""The import architecture of fedseg, read from the source with ``ast`` (no module is imported):

- no import cycles between fedseg modules;
- layers import downwards only: LOWER < ALGORITHMS < TOP, a module never imports a module of a higher layer.

Every ``import`` statement counts, at module level and inside functions (``if TYPE_CHECKING:`` ones too, marked as
such in the messages). ``import fedseg.x.y`` is an edge to ``fedseg.x.y``; ``from fedseg.x import y`` is an edge to
``fedseg.x.y`` when that is a module, else to ``fedseg.x``; relative imports are resolved the same way. A package is
its ``__init__``. Importing ``fedseg.x.y`` also runs ``fedseg.x``'s ``__init__``, but that is not counted as an edge.
"""

from __future__ import annotations

import ast
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src"
PACKAGE = "fedseg"

# --- the layers ------------------------------------------------------------------------------------------------
# "name" is that module (or package __init__) only; "name.*" is that module or package and everything inside it.
LOWER = (
    "fedseg",  # the package's __init__
    "fedseg.config",
    "fedseg.config_load",
    "fedseg.console_tables",
    "fedseg.data.*",
    "fedseg.models.*",
    "fedseg.engine.*",
    "fedseg.train",
    "fedseg.atomic_files",  # stdlib only: atomic file writes (a report writes its page without importing torch)
    "fedseg.lean_monai",  # stdlib only: MONAI's unused integrations kept out of fedseg's processes
    "fedseg.interrupts",  # stdlib only: stopping cleanly, whether a process runs (the data cache's prune too)
    "fedseg.folder_lock",  # stdlib only: one writer per output folder (its lock file left out of emptiness checks)
    "fedseg.wording",  # stdlib only: how messages list names ("a, b and 3 more")
    "fedseg.method_plugins",  # stdlib only: the installed method packages (a SuperNode checks their versions)
    "fedseg.cli_errors",  # typer and rich only: the one error line every command prints
    "fedseg.accel",  # the device switches (train.amp, channels-last, ...) of training and inference
    "fedseg.evaluate.*",
    "fedseg.presentation",  # presentation primitives that a method's own report sections may use
    "fedseg.presentation.*",
)
ALGORITHMS = ("fedseg.algorithms.*",)
# TOP: every other module (fedseg.run and the run wing fedseg.run.*: outputs, progress, ...; fedseg.studies,
# fedseg.predict, fedseg.cli, fedseg.flower.*, fedseg.report (its __init__), fedseg.report.html, fedseg.report.studies,
# ...).
LAYERS = {"LOWER": LOWER, "ALGORITHMS": ALGORITHMS, "TOP": ()}  # from the bottom up


def layer_of(module: str) -> str:
    for layer, patterns in LAYERS.items():
        for pattern in patterns:
            base = pattern.removesuffix(".*")
            if module == base or (pattern.endswith(".*") and module.startswith(base + ".")):
                return layer
    return "TOP"


# --- the import graph ------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Import:
    source: str  # the importing module
    target: str  # the imported module (or package)
    line: int
    statement: str  # the statement on one line (shortened when long)
    type_only: bool  # under ``if TYPE_CHECKING:``

    def __str__(self) -> str:
        note = " [TYPE_CHECKING only]" if self.type_only else ""
        return f"{self.source} -> {self.target} (line {self.line}: {self.statement}){note}"


def find_modules(src: Path, package: str = PACKAGE) -> dict[str, Path]:
    """``{dotted module name: file}`` for every ``.py`` file of ``src/package``."""
    modules = {}
    for path in sorted((src / package).rglob("*.py")):
        parts = list(path.relative_to(src).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        modules[".".join(parts)] = path
    return modules


def _type_checking_nodes(tree: ast.AST) -> set[int]:
    """ids of the nodes inside ``if TYPE_CHECKING:`` / ``if typing.TYPE_CHECKING:`` bodies."""
    inside = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and ast.unparse(node.test) in ("TYPE_CHECKING", "typing.TYPE_CHECKING"):
            for stmt in node.body:
                inside.update(id(n) for n in ast.walk(stmt))
    return inside


def imports_of(module: str, path: Path, modules: dict[str, Path], package: str = PACKAGE) -> list[Import]:
    """Every import of a ``package`` module in ``path`` (the file of ``module``), at any depth."""
    source = path.read_text()
    tree = ast.parse(source, filename=str(path))
    type_only = _type_checking_nodes(tree)
    is_package = path.name == "__init__.py"
    found, seen = [], set()

    def add(node: ast.stmt, target: str) -> None:
        if (target == package or target.startswith(package + ".")) and (target, node.lineno) not in seen:
            seen.add((target, node.lineno))
            text = ast.unparse(node)
            text = text if len(text) <= 100 else text[:97] + "..."
            found.append(Import(module, target, node.lineno, text, id(node) in type_only))

    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                add(node, alias.name)
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: from the module's package, one package up per extra dot
                base = module.split(".") if is_package else module.split(".")[:-1]
                if node.level > 1:
                    base = base[: len(base) - (node.level - 1)]
                base_name = ".".join(base + ([node.module] if node.module else []))
            else:
                base_name = node.module or ""
            for alias in node.names:
                sub = f"{base_name}.{alias.name}"
                add(node, sub if alias.name != "*" and sub in modules else base_name)
    return found


def import_graph(src: Path = SRC, package: str = PACKAGE) -> tuple[dict[str, Path], list[Import]]:
    modules = find_modules(src, package)
    return modules, [imp for module, path in modules.items() for imp in imports_of(module, path, modules, package)]


def strongly_connected(graph: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's strongly connected components (iterative), each sorted; every node of ``graph`` and its targets."""
    nodes = sorted(set(graph) | {t for targets in graph.values() for t in targets})
    index, low, on_stack, stack, components = {}, {}, set(), [], []
    for root in nodes:
        if root in index:
            continue
        work = [(root, iter(sorted(graph.get(root, ()))))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                components.append(sorted(component))
    return components


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module, and the modules that import themselves."""
    return sorted(c for c in strongly_connected(graph) if len(c) > 1 or c[0] in graph.get(c[0], ()))


def describe_cycles(imports: list[Import]) -> str:
    graph = defaultdict(set)
    for imp in imports:
        graph[imp.source].add(imp.target)
    found = cycles(graph)
    if not found:
        return ""
    out = [f"{len(found)} import cycle(s):"]
    for k, members in enumerate(found, start=1):
        inside = set(members)
        out.append(f"cycle {k}: {', '.join(members)}")
        ties = sorted(
            (i for i in imports if i.source in inside and i.target in inside),
            key=lambda i: (i.source, i.line, i.target),
        )
        out.extend(f"  {imp}" for imp in ties)
    return "\n".join(out)


def layer_violations(imports: list[Import]) -> list[str]:
    rank = {layer: r for r, layer in enumerate(LAYERS)}
    bad = sorted(
        (i for i in imports if rank[layer_of(i.target)] > rank[layer_of(i.source)]),
        key=lambda i: (i.source, i.line, i.target),
    )
    return [
        f"{i.source} -> {i.target} (line {i.line}): {layer_of(i.source)} imports {layer_of(i.target)}"
        f"{' [TYPE_CHECKING only]' if i.type_only else ''}"
        for i in bad
    ]


@pytest.fixture(scope="module")
def graph() -> tuple[dict[str, Path], list[Import]]:
    modules, imports = import_graph()
    assert modules, f"no modules found under {SRC / PACKAGE}"
    return modules, imports


# --- the tests -------------------------------------------------------------------------------------------------
def test_no_import_cycles(graph):
    _, imports = graph
    message = describe_cycles(imports)
    assert not message, message


def test_layers(graph):
    _, imports = graph
    violations = layer_violations(imports)
    order = " < ".join(LAYERS)
    assert not violations, (
        f"{len(violations)} import(s) against the layers ({order}: a module never imports a higher layer; "
        "see LAYERS in tests/test_architecture.py):\n  " + "\n  ".join(violations)
    )


# --- the checker itself ----------------------------------------------------------------------------------------
def test_cycle_finder_finds_a_two_module_cycle_and_a_self_import():
    graph = {"a": {"b"}, "b": {"a", "c"}, "c": set(), "d": {"d", "a"}}
    assert cycles(graph) == [["a", "b"], ["d"]]
    assert cycles({"a": {"b"}, "b": {"c"}}) == []
    imports = [
        Import("a", "b", 3, "from b import x", False),
        Import("b", "a", 7, "import a", False),
        Import("b", "c", 8, "import c", False),
    ]
    assert describe_cycles(imports) == (
        "1 import cycle(s):\ncycle 1: a, b\n  a -> b (line 3: from b import x)\n  b -> a (line 7: import a)"
    )


def test_imports_are_resolved_to_modules_at_any_depth(tmp_path):
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    files = {
        "__init__.py": "",
        "top.py": "",
        "sub/__init__.py": "from . import leaf\nfrom .leaf import thing\n",
        "sub/leaf.py": (
            "from typing import TYPE_CHECKING\n"
            "import pkg.top\n"
            "from pkg import sub, top as t, name_in_init\n"
            "from .. import top\n"
            "from ..sub import leaf\n"
            "import os\n"
            "if TYPE_CHECKING:\n"
            "    from pkg.top import Thing\n"
            "def late():\n"
            "    from pkg.sub import *\n"
        ),
    }
    for name, text in files.items():
        (pkg / name).write_text(text)
    modules, imports = import_graph(tmp_path, "pkg")
    assert sorted(modules) == ["pkg", "pkg.sub", "pkg.sub.leaf", "pkg.top"]
    got = [(i.source, i.target, i.line, i.type_only) for i in sorted(imports, key=lambda i: (i.source, i.line))]
    assert got == [
        ("pkg.sub", "pkg.sub.leaf", 1, False),
        ("pkg.sub", "pkg.sub.leaf", 2, False),
        ("pkg.sub.leaf", "pkg.top", 2, False),
        ("pkg.sub.leaf", "pkg.sub", 3, False),
        ("pkg.sub.leaf", "pkg.top", 3, False),
        ("pkg.sub.leaf", "pkg", 3, False),
        ("pkg.sub.leaf", "pkg.top", 4, False),
        ("pkg.sub.leaf", "pkg.sub.leaf", 5, False),
        ("pkg.sub.leaf", "pkg.top", 8, True),
        ("pkg.sub.leaf", "pkg.sub", 10, False),
    ]
    # pkg.sub and pkg.sub.leaf import each other (and leaf itself, line 5)
    assert describe_cycles(imports).splitlines()[:3] == [
        "1 import cycle(s):",
        "cycle 1: pkg.sub, pkg.sub.leaf",
        "  pkg.sub -> pkg.sub.leaf (line 1: from . import leaf)",
    ]
    assert cycles({"leaf": {"leaf"}}) == [["leaf"]]


def test_layer_of():
    assert [
        layer_of(m)
        for m in (
            "fedseg",
            "fedseg.data",
            "fedseg.data.folder",
            "fedseg.train",
            "fedseg.presentation.kit",
            "fedseg.algorithms",
            "fedseg.algorithms.fedsm.model",
            "fedseg.report",
            "fedseg.report.html",
            "fedseg.run",
            "fedseg.flower.node",
            "fedseg.training",
        )
    ] == ["LOWER", "LOWER", "LOWER", "LOWER", "LOWER", "ALGORITHMS", "ALGORITHMS", "TOP", "TOP", "TOP", "TOP", "TOP"]
