"""FedSM studies of the paper at the benchmark budget (``benchmarks/common.py``), per seed:

* Table 5 (unseen sites): ``--leave-one-out`` with ``fedsm`` on ``synthetic-retina``;
* Table 6 (personalization inside FedSM): ``--sweep methods.fedsm.personalization=softpull,ft,apfl,perfedavg,pfedme``
  on ``synthetic-retina``;
* Table 7 (SoftPull lambda): ``--sweep methods.fedsm.lam=...`` on both federations.

    .venv/bin/python benchmarks/fedsm_studies.py [--studies table5 table6 table7-retina table7-prostate] [--jobs 2]

The runs are three bench files (``benchmarks/specs/fedsm_table5.yaml``: a leave-one-out federation;
``fedsm_table6.yaml`` and ``fedsm_table7.yaml``: one method per swept value), trained and resumed by ``fedseg bench``
(``common.bench_entries``; runs under ``benchmarks/runs/fedsm-table<N>/``). Each (study, seed) table is read from
the runs' folders (Table 5: each held-out run's ``unseen.csv``; Tables 6 and 7: the ``fedseg study --sweep`` row of
each run, ``fedseg.studies.sweep_rows``). Writes ``benchmarks/results/fedsm_studies.json`` and ``.md`` with the
tables averaged over the seeds.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
from collections import defaultdict
from pathlib import Path

import numpy as np

from common import RESULTS, SPECS, bench_entries

STUDIES = {  # study -> (federation, kind, swept key, bench file in benchmarks/specs)
    "table5": ("synthetic-retina", "holdout", None, "fedsm_table5.yaml"),
    "table6": ("synthetic-retina", "sweep", "methods.fedsm.personalization", "fedsm_table6.yaml"),
    "table7-retina": ("synthetic-retina", "sweep", "methods.fedsm.lam", "fedsm_table7.yaml"),
    "table7-prostate": ("synthetic-prostate", "sweep", "methods.fedsm.lam", "fedsm_table7.yaml"),
}


def study_entries(study: str, bench, done: dict) -> list[dict]:
    """One entry per seed of ``study`` (its ``columns`` and ``rows``, as ``fedseg study`` writes them)."""
    from types import SimpleNamespace

    from fedseg.studies import sweep_columns, sweep_rows, unseen_columns

    federation, kind, key, _ = STUDIES[study]
    out = []
    for seed in bench.seeds:
        runs = [e for (fed, s, _), e in done.items() if fed.startswith(f"{federation}/holdout-") and s == seed]
        if kind == "holdout":
            rows = []
            for e in runs:
                with open(Path(e["dir"]) / "unseen.csv", newline="") as f:
                    rows += list(csv.DictReader(f))
            sites = sorted({r["unseen_site"] for r in rows})
            columns = unseen_columns(sites)
        else:
            rows = []
            for (fed, s, method), e in done.items():
                if fed == federation and s == seed:
                    value = method.partition("=")[2] or method
                    result = SimpleNamespace(
                        algorithms=[SimpleNamespace(name=e["algorithm"], summary=e["summary"])],
                        federation=SimpleNamespace(site_names=e["sites"]),
                    )
                    rows += sweep_rows(result, key, value, method)  # type: ignore[arg-type]
            columns = sweep_columns(rows)
        out.append({"study": study, "federation": federation, "seed": seed, "columns": columns, "rows": rows})
    return out


def number(x) -> float:
    try:
        return float(x)
    except (TypeError, ValueError):
        return math.nan


def average(entries: list[dict], key_column: str) -> list[dict]:
    """Rows with the same ``key_column`` value averaged over seeds (numeric columns; NaN-ignoring)."""
    groups: dict[str, list[dict]] = defaultdict(list)
    for e in entries:
        for row in e["rows"]:
            groups[str(row[key_column])].append(row)
    out = []
    for key, rows in groups.items():
        avg = {key_column: key, "seeds": len(rows)}
        for col in entries[0]["columns"]:
            if col in (key_column, "run", "algorithm", "key"):
                continue
            vals = [number(r.get(col)) for r in rows]
            vals = [v for v in vals if not math.isnan(v)]
            avg[col] = float(np.mean(vals)) if vals else None
        out.append(avg)
    return out


def cell(column: str, value) -> str:
    """A table cell: counts as integers, other numbers to 4 decimals, missing values blank."""
    if value is None:
        return ""
    if isinstance(value, float):
        return f"{value:.0f}" if column in ("cases", "seeds") else f"{value:.4f}"
    return str(value)


def markdown(tables: dict) -> str:
    lines = ["# FedSM studies (benchmark budget of benchmarks/common.py; mean over the seeds done)", ""]
    for study, t in tables.items():
        rows = t["rows"]
        if not rows:
            continue
        cols = [c for c in rows[0] if rows[0][c] is not None or any(r.get(c) is not None for r in rows)]
        lines += [
            f"## {study} ({t['federation']}, seeds {t['seeds']})",
            "",
            "| " + " | ".join(cols) + " |",
            "|---" * len(cols) + "|",
        ]
        for r in rows:
            lines.append("| " + " | ".join(cell(c, r.get(c)) for c in cols) + " |")
        lines.append("")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--studies", nargs="+", default=list(STUDIES), choices=list(STUDIES))
    ap.add_argument("--jobs", type=int, default=2, help="runs trained at once (one torch thread each)")
    args = ap.parse_args()
    path = RESULTS / "fedsm_studies.json"
    tables = json.loads(path.read_text()) if path.exists() else {}  # the studies not asked for stay as they are
    benches: dict[str, tuple] = {}
    for study in args.studies:
        federation, kind, _, spec = STUDIES[study]
        if spec not in benches:
            benches[spec] = bench_entries(SPECS / spec, args.jobs)
        entries = study_entries(study, *benches[spec])
        tables[study] = {
            "federation": federation,
            "seeds": [e["seed"] for e in entries],
            "rows": average(entries, "unseen_site" if kind == "holdout" else "value"),
        }
        print(f"done {study}", flush=True)
    tables = {study: tables[study] for study in STUDIES if study in tables}
    path.write_text(json.dumps(tables, indent=1))
    (RESULTS / "fedsm_studies.md").write_text(markdown(tables))
    print(markdown(tables))


if __name__ == "__main__":
    main()
