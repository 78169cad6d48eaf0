"""FeTS 2022 Table 1's IID rows at CPU scale: FedAvg trained on the challenge partition of ``synthetic-brats``
against FedAvg trained on the same training cases dealt i.i.d. to 11 and to 5 synthetic sites, paired on the
same test images (the IID setups keep every case's split, FeTS Sec. 5.4), from the per-case rows of the bench
``benchmarks/fets-setups.yaml``.

A case is known by its id (``site1_0006``: its institution in the challenge partition, the site the hierarchical
bootstrap resamples, ``fedseg.evaluate.stats.compare``); its score is its Dice averaged over WT, TC, ET (the bench's
convention). One seed: the CI carries the case-to-case variance only. Centralized training sees the same pooled
cases in every setup, so its spread across the three setups shows the run-to-run noise of one seed here.

    .venv/bin/fedseg bench benchmarks/fets-setups.yaml --out benchmarks/results/fets_setups --resume
    .venv/bin/python benchmarks/fets_setups.py        # -> results/fets_setups_iid.json + .md
"""

from __future__ import annotations

import csv
import json
from collections import defaultdict
from pathlib import Path

from fedseg.evaluate.stats import compare

HERE = Path(__file__).parent
BENCH = HERE / "results" / "fets_setups"
REFERENCE = "challenge"


def case_dice(rows: list[dict]) -> dict[tuple[str, str], dict[int, dict[tuple[str, str], float]]]:
    """``{(federation, method): {seed: {(institution, case): Dice averaged over regions}}}`` from results.csv."""
    regions: dict[tuple[str, str, int, str], list[float]] = defaultdict(list)
    for r in rows:
        if r["metric"] == "dice":
            regions[(r["federation"], r["method"], int(r["seed"]), r["case"])].append(float(r["value"]))
    out: dict[tuple[str, str], dict[int, dict[tuple[str, str], float]]] = defaultdict(lambda: defaultdict(dict))
    for (federation, method, seed, case), values in regions.items():
        case = case.rsplit("--", 1)[-1]  # a repartitioned case is "<its site there>--<its id>"
        out[(federation, method)][seed][(case.rsplit("_", 1)[0], case)] = sum(values) / len(values)
    return out


def main() -> None:
    with open(BENCH / "results.csv", newline="") as f:
        scores = case_dice(list(csv.DictReader(f)))
    federations = sorted({fed for fed, _ in scores}, key=lambda f: (f != REFERENCE, f))
    report: dict = {"command": "python benchmarks/fets_setups.py", "bench": "benchmarks/fets-setups.yaml", "rows": []}
    for method in ("fedavg", "centralized"):
        for fed in federations:
            per_seed = scores[(fed, method)]
            values = [v for cases in per_seed.values() for v in cases.values()]
            row = {"method": method, "federation": fed, "cases": len(values), "dice": sum(values) / len(values)}
            if fed != REFERENCE:
                c = compare(per_seed, scores[(REFERENCE, method)])
                row.update({k: c[k] for k in ("mean_diff", "ci_low", "ci_high", "p", "n", "seeds")})
            report["rows"].append(row)
    (HERE / "results" / "fets_setups_iid.json").write_text(json.dumps(report, indent=1))
    lines = [
        "# FeTS Table 1's IID rows at CPU scale (synthetic-brats, fets-cpu, one seed)",
        "",
        f"Δ: mean over the same test cases of (setup − {REFERENCE}), its 95% hierarchical bootstrap CI (institutions, "
        "then cases; one seed) and the two-sided paired Wilcoxon p. Centralized trains on the same pooled cases in "
        "every setup: its spread is one seed's run-to-run noise.",
        "",
        "| method | setup | cases | Dice | Δ vs challenge | 95% CI | p |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in report["rows"]:
        ci = f"[{r['ci_low']:+.3f}, {r['ci_high']:+.3f}]" if "ci_low" in r else ""
        delta = f"{r['mean_diff']:+.3f}" if "mean_diff" in r else ""
        p = f"{r['p']:.2g}" if "p" in r else ""
        lines.append(f"| {r['method']} | {r['federation']} | {r['cases']} | {r['dice']:.3f} | {delta} | {ci} | {p} |")
    bench_command = __doc__.strip().splitlines()[-2].strip()
    lines += ["", f"Reproduce: `{bench_command}`, then `python benchmarks/fets_setups.py`."]
    (HERE / "results" / "fets_setups_iid.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
