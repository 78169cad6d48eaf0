"""Write the generated tables of docs/results.md from the committed benchmark results.

docs/results.md is prose around tables; the tables between its markers ``<!-- generated: NAME -->`` and
``<!-- end of NAME -->`` are this script's, read from the committed aggregates under ``benchmarks/results/``, so a
number in them is the number the bench wrote (tests/test_docs.py checks the page equals this script's output):

- ``headline <folder> <federation>``: one bench folder's test table for one federation, condensed from its
  ``tables.json`` (the full layout is the folder's ``tables.md``): setting chosen on validation (grid edges
  flagged), rounds and SGD steps (the budget), test Dice, client average, Δ against the bench's reference with its
  95% hierarchical bootstrap CI and Wilcoxon p (Holm-adjusted over the table), and how often the method held its
  most frequent rank across the bootstrap samples;
- ``personalized <personalized.json>``: ``benchmarks/personalized.py``'s methods, one row each, per federation the
  test Dice, Δ against FedAvg and Δ against the continuation control ``fedavg-continue`` with their 95% CIs;
- ``surface <folder>``: FedSM's Figure 4 read off the ``loss_surface_<site>.csv`` files ``fedseg loss-surface``
  wrote into the folder: per model (rows) and site (columns), the site's training loss at the model (t = 0, mean
  over the random directions) and how much it rises half a step away (the mean over directions and both sides of
  loss(t = ±0.5) − loss(0): larger is sharper), and for each global → personalized line its barrier (the highest
  loss for t in [0, 1] minus the higher of its two ends; 0: no barrier);
- ``claims <claims.json>``: the papers' claims table that ``benchmarks/claims.py`` wrote.

    python docs/gen_results.py            # rewrite the generated tables of docs/results.md
    python docs/gen_results.py --check    # exit 1 if any differs
"""

from __future__ import annotations

import csv
import importlib.util
import json
import math
import re
import sys
from pathlib import Path

from fedseg.bench.tables import correct_tests
from fedseg.evaluate.stats import (
    DIFF_DIGITS,
    caution_text,
    ci_text,
    correct_family,
    dagger,
    p_value_text,
    signed_text,
)
from fedseg.presentation.kit import fmt, fmt_int

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "results.md"
BLOCK = re.compile(r"(<!-- generated: (?P<what>[^>]*?) -->\n)(?P<body>.*?)(<!-- end of (?P=what) -->)", re.DOTALL)


def claims_module():
    """``benchmarks/claims.py`` (one renderer of the claims table: its ``table``)."""
    spec = importlib.util.spec_from_file_location("claims", ROOT / "benchmarks" / "claims.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("claims", module)  # its dataclasses look their module up while it executes
    spec.loader.exec_module(module)
    return module


def read_json(path: Path) -> dict:
    """A committed result file; a missing one is one clear line (the bench or script that writes it has not run). A
    number that is not finite reads as ``null`` (None: a bench's tables.json from this version on) or ``NaN`` (one
    written before); every cell below shows either as missing."""
    if not path.is_file():
        raise SystemExit(f"error: {path.relative_to(ROOT)}: no such file (run the benchmark that writes it first)")
    return json.loads(path.read_text())


def mean_std(x: dict, digits: int = 3) -> str:
    """``mean ± std`` of a tables.json summary (``{"mean", "std", "n"}``); no ± where the std is undefined."""
    if x is None or x.get("mean") is None or math.isnan(x["mean"]):
        return "–"
    std = x.get("std")
    return f"{x['mean']:.{digits}f}" + ("" if std is None or math.isnan(std) else f" ± {std:.{digits}f}")


def headline(folder: str, federation: str) -> str:
    """The condensed test table of one federation of one bench folder (module docstring)."""
    tables = read_json(ROOT / folder / "tables.json")
    reference = tables["bench"]["reference"]
    fed = tables["federations"][federation]
    correct_tests(fed)  # Holm within the table (a tables.json written before the correction gains it here)
    ranks = fed.get("rank_stability", {})
    head = ["method", "setting", "rounds", "SGD steps", "Dice", "client avg", f"Δ vs {reference}", "95% CI"]
    head.append("p (Holm)")
    head.append("most frequent rank")
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for name, m in fed["methods"].items():
        setting = m.get("setting") or ""
        if m.get("at_edge"):
            setting += " (grid edge: " + ", ".join(m["at_edge"]) + ")"
        conv = m["convergence"]
        rounds = fmt(conv["rounds"]["mean"], 0)
        if conv.get("not_converged"):
            rounds += f" ({conv['not_converged']}/{conv['runs']} may not have converged)"
        test = m.get("wilcoxon") or {}
        delta, ci = split_delta_ci(test)
        p = p_value_text(test) + caution_text(test) if test else "ref"
        shares = ranks.get(name, {})
        top = max(shares, key=lambda r: shares[r]) if shares else None
        rank = f"{top} ({shares[top]:.0%})" if top is not None else ""
        steps = fmt_int(m["cost"]["sgd_steps"])
        cells = [name, setting, rounds, steps, mean_std(m["dice"]), mean_std(m["client_avg"]), delta, ci, p, rank]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def split_delta_ci(test: dict | None) -> tuple[str, str]:
    """``(Δ, "[low, high]")`` of a ``fedseg.evaluate.stats.compare`` result to 4 decimals, as the bench tables print
    them (``fedseg.evaluate.stats.signed_text``: a nonzero number never prints as ±0.0000, so a † never sits next to
    a bound that reads as 0), Δ with † where the comparison is significant (the CI excludes 0 and the Holm-adjusted
    p < 0.05: ``fedseg.evaluate.stats.significant``); "–" for a missing Δ, empty strings where there is no test."""
    if not test:
        return "", ""
    delta = signed_text(test.get("mean_diff"), DIFF_DIGITS) or "–"
    return delta + dagger(test), ci_text(test, DIFF_DIGITS)


def delta_ci(test: dict | None) -> str:
    """``Δ [low, high]`` in one cell (``split_delta_ci``)."""
    delta, ci = split_delta_ci(test)
    return f"{delta} {ci}" if delta else ""


def personalized(path: str) -> str:
    """``benchmarks/personalized.py``'s methods by federation (module docstring)."""
    feds = read_json(ROOT / path)["federations"]
    for block in feds.values():  # Holm within each column of the table
        correct_family(block["wilcoxon"].values())
        correct_family(block["vs_continued"].values())
    head = ["method"]
    for fed in feds:
        head += [f"{fed}: Dice", f"{fed}: Δ vs fedavg [95% CI]", f"{fed}: Δ vs fedavg-continue [95% CI]"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    names = dict.fromkeys(name for block in feds.values() for name in block["rows"])  # every method, in order
    for name in names:
        cells = [name]
        for block in feds.values():
            row = block["rows"].get(name)
            cells += [mean_std(row["dice"]) if row else "–", delta_ci(block["wilcoxon"].get(name))]
            cells.append(delta_ci(block["vs_continued"].get(name)))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def surface(folder: str) -> str:
    """FedSM Figure 4's numbers per model and site (module docstring)."""
    files = sorted((ROOT / folder).glob("loss_surface_*.csv"))
    if not files:
        raise SystemExit(f"error: {folder}: no loss_surface_<site>.csv (run fedseg loss-surface --out {folder})")
    cells: dict[str, dict[str, str]] = {}
    sites = []
    for path in files:
        with open(path, newline="") as f:
            rows = list(csv.DictReader(f))
        site = rows[0]["site"]
        sites.append(site)
        curves: dict[tuple[str, str], dict[float, list[float]]] = {}
        for r in rows:
            label = f"{r['model'].replace(site, 'SITE')} ({Path(r['run']).name})"
            kind = "line" if r["direction"] == "line" else "directions"
            curves.setdefault((label, kind), {}).setdefault(float(r["t"]), []).append(float(r["loss"]))
        for (label, kind), by_t in curves.items():
            if kind == "line":
                inside = max(sum(v) / len(v) for t, v in by_t.items() if 0 <= t <= 1)
                ends = max(sum(by_t[0.0]) / len(by_t[0.0]), sum(by_t[1.0]) / len(by_t[1.0]))
                cells.setdefault(label, {})[site] = f"barrier {inside - ends:+.3f}"
            else:
                at = sum(by_t[0.0]) / len(by_t[0.0])
                rise = sum(by_t[-0.5] + by_t[0.5]) / len(by_t[-0.5] + by_t[0.5]) - at
                cells.setdefault(label, {})[site] = f"{at:.3f} ({rise:+.3f})"
    head = ["model (run)", *sites]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for label in sorted(cells):
        lines.append("| " + " | ".join([label, *(cells[label].get(site, "–") for site in sites)]) + " |")
    return "\n".join(lines) + "\n"


def claims(path: str) -> str:
    """The claims table of a ``claims.json`` written by ``benchmarks/claims.py``."""
    return claims_module().table(read_json(ROOT / path)["claims"])


def generated(what: str) -> str:
    kind, *args = what.split()
    if kind == "headline":
        return headline(*args)
    if kind == "personalized":
        return personalized(*args)
    if kind == "surface":
        return surface(*args)
    if kind == "claims":
        return claims(*args)
    raise SystemExit(f"error: {PAGE}: unknown generated block {what!r} (headline, personalized, surface or claims)")


def render(page: str) -> str:
    """``page`` with every generated block rewritten (a start marker without its end marker is refused)."""
    starts = re.findall(r"<!-- generated: ([^>]*?) -->", page)
    matched = [m.group("what") for m in BLOCK.finditer(page)]
    if starts != matched:
        unmatched = next(w for w in starts if w not in matched)
        raise SystemExit(f"error: {PAGE}: '<!-- generated: {unmatched} -->' has no '<!-- end of {unmatched} -->'")
    return BLOCK.sub(lambda m: m.group(1) + generated(m.group("what")) + m.group(4), page)


def main() -> None:
    page = PAGE.read_text()
    out = render(page)
    if "--check" in sys.argv[1:]:
        if out != page:
            print(f"{PAGE.relative_to(ROOT)} is stale: run python docs/gen_results.py", file=sys.stderr)
            raise SystemExit(1)
        return
    PAGE.write_text(out)
    print(f"wrote {PAGE.relative_to(ROOT)} ({len(BLOCK.findall(out))} generated tables)")


if __name__ == "__main__":
    main()
