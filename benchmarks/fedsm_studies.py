"""FedSM studies of the paper at the benchmark budget (``benchmarks/common.py``), per seed:

* Table 5 (unseen sites): ``--leave-one-out`` with ``fedsm`` on ``synthetic-retina``;
* Table 6 (personalization inside FedSM): ``--sweep methods.fedsm.personalization=softpull,ft,apfl,perfedavg,pfedme``
  on ``synthetic-retina``;
* Table 7 (SoftPull lambda): ``--sweep methods.fedsm.lam=...`` on both federations.

    .venv/bin/python benchmarks/fedsm_studies.py [--seeds 0 1 2] [--studies table5 table6 table7-retina table7-prostate]

Each (study, seed) runs through fedseg's own study runner into ``benchmarks/runs/studies/`` (with
``--resume``) and its table is kept in ``benchmarks/runs/studies/<study>/seed<S>.json``
(git-ignored; a study whose JSON exists is not run again). Writes ``benchmarks/results/fedsm_studies.json``
and ``.md`` with the tables averaged over the seeds that are done.
"""

from __future__ import annotations

import argparse
import json
import math
from collections import defaultdict
from pathlib import Path

import numpy as np

from common import BUDGET, RESULTS, RUNS

# The paper's Table 7 grid is 0.1, 0.3, ..., 0.9, but 0.1 < 1/K = 1/6 lies outside SoftPull's
# range [1/K, 1] (Sec. 3.2), which fedseg enforces: the lowest value here is 1/K itself (FedAvg-like).
LAMBDAS = "0.1667,0.3,0.5,0.7,0.9"
STUDIES = {
    "table5": ("synthetic-retina", "holdout", None),
    "table6": ("synthetic-retina", "sweep", "methods.fedsm.personalization=softpull,ft,apfl,perfedavg,pfedme"),
    "table7-retina": ("synthetic-retina", "sweep", f"methods.fedsm.lam={LAMBDAS}"),
    "table7-prostate": ("synthetic-prostate", "sweep", f"methods.fedsm.lam={LAMBDAS}"),
}


def run_one(study: str, seed: int) -> dict:
    import torch

    from fedseg.config import load_config
    from fedseg.studies import plan_holdout, plan_sweep, run_study

    federation, kind, spec = STUDIES[study]
    cfg = load_config(preset=federation, overrides=[*BUDGET[federation], f"seed={seed}", "algorithms=[fedsm]"])
    torch.set_num_threads(cfg.threads)
    out = RUNS / "studies" / study / f"seed{seed}"
    plan = plan_holdout(cfg, out) if kind == "holdout" else plan_sweep(cfg, out, spec)
    result = run_study(plan, resume=True)
    entry = {
        "study": study,
        "federation": federation,
        "seed": seed,
        "spec": spec,
        "overrides": BUDGET[federation],
        "columns": result.columns,
        "rows": result.rows,
    }
    path = seed_path(study, seed)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(entry, indent=1, allow_nan=True, default=str))
    return entry


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
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--studies", nargs="+", default=list(STUDIES), choices=list(STUDIES))
    args = ap.parse_args()
    for study in args.studies:
        for seed in args.seeds:
            if not seed_path(study, seed).exists():
                run_one(study, seed)
            print(f"done {study} seed {seed}", flush=True)
    tables = {}  # every study and seed done so far (also by other invocations running at the same time)
    for study, (federation, kind, _) in STUDIES.items():
        entries = [json.loads(p.read_text()) for p in sorted((RUNS / "studies" / study).glob("seed*.json"))]
        if entries:
            tables[study] = {
                "federation": federation,
                "seeds": [e["seed"] for e in entries],
                "rows": average(entries, "unseen_site" if kind == "holdout" else "value"),
            }
    (RESULTS / "fedsm_studies.json").write_text(json.dumps(tables, indent=1))
    (RESULTS / "fedsm_studies.md").write_text(markdown(tables))
    print(markdown(tables))


def seed_path(study: str, seed: int) -> Path:
    return RUNS / "studies" / study / f"seed{seed}.json"


if __name__ == "__main__":
    main()
