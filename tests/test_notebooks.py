"""The notebooks in examples/ run top to bottom in a real Python kernel (nbclient), on a tiny configuration, in a
temporary working directory; what they print is checked against the files their runs wrote. They are committed
without outputs.

The tiny configuration replaces the values of each notebook's cell tagged ``parameters`` the way papermill does:
a cell assigning the tiny values is inserted right after it (in memory only). The kernel runs this checkout's
fedseg: ``src/`` first on its ``PYTHONPATH``, this interpreter's ``bin/`` (the ``fedseg`` command) first on its
``PATH``."""

from __future__ import annotations

import ast
import json
import os
import re
import sys
import time
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat", reason="needs the test extra: pip install 'fedseg[test]'")
nbclient = pytest.importorskip("nbclient", reason="needs the test extra: pip install 'fedseg[test]'")

REPO = Path(__file__).resolve().parents[1]
EXAMPLES = REPO / "examples"
NOTEBOOKS = sorted(p.name for p in EXAMPLES.glob("*.ipynb"))
TINY = {"SCALE": 0.05, "IMAGE_SIZE": 32, "CHANNELS": [4, 8, 16], "ROUNDS": 2}  # each notebook's own sizes
CELL_TIMEOUT_S = 300


def _read(name: str):
    return nbformat.read(EXAMPLES / name, as_version=4)


def _kernel_env() -> dict[str, str]:
    """This process's environment, with this checkout's ``src`` first and this interpreter's ``bin`` left out of
    ``PATH``: a Jupyter kernel started without activating the environment has no ``fedseg`` command (the notebooks
    run ``python -m fedseg``)."""
    own_bin = Path(sys.executable).parent.resolve()
    path = [p for p in os.environ.get("PATH", "").split(os.pathsep) if p and Path(p).resolve() != own_bin]
    return {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(REPO / "src"), *filter(None, [os.environ.get("PYTHONPATH")])]),
        "PATH": os.pathsep.join(path),
    }


def _with_tiny_parameters(book):
    """``book`` with a cell assigning :data:`TINY` right after its ``parameters`` cell (which must assign them all)."""
    (index,) = [i for i, c in enumerate(book.cells) if "parameters" in c.metadata.get("tags", [])]
    assigned = {t.id for node in ast.parse(book.cells[index].source).body if isinstance(node, ast.Assign)
                for t in node.targets if isinstance(t, ast.Name)}  # fmt: skip
    assert set(TINY) <= assigned, f"the parameters cell no longer assigns {sorted(set(TINY) - assigned)}"
    source = "\n".join(f"{k} = {v!r}" for k, v in TINY.items())
    injected = nbformat.v4.new_code_cell(source, metadata={"tags": ["injected-parameters"]})
    book.cells.insert(index + 1, injected)
    return book


def _text(cell) -> str:
    """What a code cell showed: its streams and the plain text of its results."""
    parts = []
    for output in cell.get("outputs", []):
        if output.output_type == "stream":
            parts.append(output.text)
        elif output.output_type in ("execute_result", "display_data"):
            parts.append(output.data.get("text/markdown", output.data.get("text/plain", "")))
    return "".join(parts)


def _execute(name: str, workdir: Path):
    book = _with_tiny_parameters(_read(name))
    client = nbclient.NotebookClient(
        book,
        timeout=CELL_TIMEOUT_S,
        startup_timeout=120,
        kernel_name="python3",
        resources={"metadata": {"path": str(workdir)}},
    )
    start = time.monotonic()
    client.execute(env=_kernel_env())
    print(f"{name}: executed in {time.monotonic() - start:.1f} s")
    return book


@pytest.mark.parametrize("name", NOTEBOOKS)
def test_notebooks_are_committed_without_outputs_and_with_one_parameters_cell(name):
    book = _read(name)
    nbformat.validate(book)
    code = [c for c in book.cells if c.cell_type == "code"]
    assert all(c.outputs == [] and c.execution_count is None for c in code), f"{name}: clear its outputs"
    assert sum("parameters" in c.metadata.get("tags", []) for c in code) == 1
    assert book.metadata.kernelspec.name == "python3"


def test_every_notebook_in_examples_is_executed_below():
    assert NOTEBOOKS == ["01_your_federation.ipynb", "02_compare_methods.ipynb"]  # a new one gets a test here


def test_your_federation_notebook_checks_the_folder_trains_two_methods_prints_their_test_dice_and_reruns(tmp_path):
    from fedseg import Results

    book = _execute("01_your_federation.ipynb", tmp_path)
    code = [c for c in book.cells if c.cell_type == "code"]
    shown = [_text(c) for c in code]
    assert any(text.startswith("OK: ") or "\nOK: " in text for text in shown), "fedseg data check passed"
    results = Results.load(tmp_path / "runs" / "notebook-01" / "run")
    assert results.algorithms == ["fedavg", "local"] and results.config is not None
    assert results.config.fl.rounds == 2 and results.config.data.source == "folder"
    printed = dict(re.findall(r"(\w+) (\d\.\d{3})", shown[-1].split(":", 1)[1]))
    assert set(printed) == {"fedavg", "local"}, shown[-1]
    for algorithm, dice in results.dice().items():
        assert 0.0 <= dice <= 1.0 and printed[algorithm] == f"{dice:.3f}"
    assert results.report_path.is_file()

    # "Run All" again in the same folder: the federation is kept as written (a resume refuses rewritten data files)
    # and the finished run is resumed, nothing trained again
    federation = tmp_path / "runs" / "notebook-01" / "federation"
    written = {p: p.stat().st_mtime_ns for p in federation.rglob("*")}
    again = [_text(c) for c in _execute("01_your_federation.ipynb", tmp_path).cells if c.cell_type == "code"]
    assert {p: p.stat().st_mtime_ns for p in federation.rglob("*")} == written
    assert again[-1] == shown[-1]


def test_compare_methods_notebook_runs_the_bench_and_prints_the_paired_test(tmp_path):
    book = _execute("02_compare_methods.ipynb", tmp_path)
    last = _text([c for c in book.cells if c.cell_type == "code"][-1])
    out = tmp_path / "runs" / "notebook-02" / "bench"
    assert sorted(p.name for p in (out / "runs" / "synthetic-retina" / "fold0").iterdir()) == ["seed0", "seed1"]
    methods = json.loads((out / "tables.json").read_text())["federations"]["synthetic-retina"]["methods"]
    assert sorted(methods) == ["fedavg", "fedprox"]
    lines = {m: line for line in last.splitlines() for m in methods if f" {m} " in line}
    assert sorted(lines) == ["fedavg", "fedprox"], last
    for method, row in methods.items():
        dice = float(re.search(r"Dice (\d\.\d{3})", lines[method]).group(1))
        assert 0.0 <= dice <= 1.0 and dice == pytest.approx(row["dice"]["mean"], abs=5e-4)
    test = methods["fedprox"]["wilcoxon"]
    assert test["seeds"] == 2 and 0.0 <= test["p"] <= 1.0
    assert f"Wilcoxon p = {test['p']:.3g}" in lines["fedprox"] and "reference" in lines["fedavg"]
