"""Auto-FedAvg's four variants next to FedAvg and FedAvg-uniform on both built-in federations,
3 seeds: the paper's Table 2 layout (per-site test Dice of the global model, global test avg ± std
over seeds, local avg, local gen) and the extra communication cost against the paper's
``(K - 1) / (2 t0)``.

    .venv/bin/python benchmarks/autofedavg.py [--spec benchmarks/specs/autofedavg.yaml] [--jobs 2]

The runs are the bench file ``benchmarks/specs/autofedavg.yaml`` (the methods benchmark's budget), trained and
resumed by ``fedseg bench`` (``common.bench_entries``; runs under ``benchmarks/runs/autofedavg/``). Every method
runs with its defaults (Auto-FedAvg: t0 = 1, S = 10 beta steps, beta_init 6, Adam at 0.005, chosen on validation
once: results/autofedavg_beta_lr.json): nothing else is tuned.
Writes ``benchmarks/results/autofedavg.json``,
``benchmarks/results/autofedavg.md`` and, per federation, the alpha curves of seed 0
(``benchmarks/results/autofedavg_alpha_<federation>.png``, the report's Fig. 3a panel).
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

from common import RESULTS, SPECS, bench_entries, case_dice
from fedseg.algorithms import get_algorithm
from fedseg.evaluate.stats import mean_std as stats_mean_std

BASELINES = ["fedavg", "fedavg-uniform"]
VARIANTS = ["autofedavg-n-dirichlet", "autofedavg-n-softmax", "autofedavg-l-dirichlet", "autofedavg-l-softmax"]


def mean_std(values: list[float]) -> tuple[float, float]:
    """Mean and sample std over the finite ``values`` (``fedseg.evaluate.stats.mean_std``)."""
    ms = stats_mean_std(values)
    return ms["mean"], ms["std"]


def table_row(name: str, entries: list[dict], fedavg_floats: float) -> dict:
    """One method over seeds: Table 2's columns (mean over seeds; std over seeds for global test avg)."""
    sites = entries[0]["sites"]
    dice = [e["summary"]["dice"] for e in entries]
    floats = mean_std([e["summary"]["floats_sent"] for e in entries])[0]
    t0 = getattr(get_algorithm(name).parse_options({}), "t0", math.inf)  # every run uses the defaults
    return {
        "sites": {s: mean_std([d[s] for d in dice])[0] for s in sites},
        "global_test_avg": dict(zip(("mean", "std"), mean_std([d["client_avg"] for d in dice]))),
        "global_test_avg_per_seed": [d["client_avg"] for d in dice],
        "local_avg": mean_std([e["summary"].get("local_avg", math.nan) for e in entries])[0],
        "local_gen": mean_std([e["summary"].get("local_gen", math.nan) for e in entries])[0],
        "floats_sent": floats,
        "extra_cost_vs_fedavg": floats / fedavg_floats - 1,
        "paper_extra_cost": (len(sites) - 1) / (2 * t0),
        "best_round": [e["summary"]["best_round"] for e in entries],
        "wall_seconds": mean_std([e["wall_seconds"] for e in entries])[0],
        "seeds": [e["seed"] for e in entries],
    }


def wilcoxon_vs_fedavg(done: dict, fed: str, seeds: list[int], algorithm: str) -> dict:
    """Per-case test Dice against FedAvg's (``fedseg.evaluate.stats.compare``): a two-sided paired Wilcoxon test
    over the test cases, each case's differences averaged over the seeds, and the hierarchical bootstrap CI of the
    mean difference (the paper's dagger: p < 0.05)."""
    from fedseg.evaluate.stats import compare

    ours = {s: case_dice(done[(fed, s, algorithm)], algorithm) for s in seeds}
    test = compare(ours, {s: case_dice(done[(fed, s, "fedavg")], "fedavg") for s in seeds})
    return {"pairs": test["n"], "median_difference": test["median_diff"], **test}


def orderings(rows: dict[str, dict]) -> dict[str, dict]:
    """The paper's claims on global test avg: N > L, Dirichlet > softmax (strict), Auto-FedAvg ≥ FedAvg."""
    g = {a: r["global_test_avg"]["mean"] for a, r in rows.items()}
    claims = {
        "N > L (Dirichlet)": ("autofedavg-n-dirichlet", "autofedavg-l-dirichlet"),
        "N > L (softmax)": ("autofedavg-n-softmax", "autofedavg-l-softmax"),
        "Dirichlet > softmax (N)": ("autofedavg-n-dirichlet", "autofedavg-n-softmax"),
        "Dirichlet > softmax (L)": ("autofedavg-l-dirichlet", "autofedavg-l-softmax"),
        **{f"{get_algorithm(v).display_name} ≥ FedAvg": (v, "fedavg") for v in VARIANTS},
        **{
            f"{get_algorithm(v).display_name} ≥ FedAvg-uniform (not a paper claim)": (v, "fedavg-uniform")
            for v in VARIANTS
        },
    }
    return {
        claim: {
            "left": g[a],
            "right": g[b],
            "difference": g[a] - g[b],
            "holds": g[a] >= g[b] if "≥" in claim else g[a] > g[b],
        }
        for claim, (a, b) in claims.items()
        if a in g and b in g
    }


def markdown(report: dict) -> str:
    from fedseg.bench.table_rows import per_seed_text
    from fedseg.evaluate.stats import caution_text, correct_family, dagger, p_value_text

    lines = ["# Auto-FedAvg benchmark (Table 2 layout)", ""]
    for fed, block in report.items():
        # Holm over the table's comparisons with FedAvg (idempotent: a stored report is corrected again)
        correct_family(row.get("wilcoxon_vs_fedavg") or None for row in block["methods"].values())
        sites = block["sites"]
        lines += [
            f"## {fed} (seeds {block['seeds']})",
            "",
            "| method | " + " | ".join(sites) + " | global test avg | local avg | local gen | extra traffic vs FedAvg "
            "(paper (K-1)/(2 t0)) | Wilcoxon vs FedAvg: p, Holm-adjusted (median case difference) | Δ per seed |",
            "|---|" + "---|" * (len(sites) + 6),
        ]
        for name, row in block["methods"].items():
            g = row["global_test_avg"]
            std = "" if math.isnan(g["std"]) else f" ± {g['std']:.4f}"
            test = row.get("wilcoxon_vs_fedavg", {})
            mark = dagger(test).strip()  # † where significant: the CI excludes 0 and the adjusted p < 0.05
            extra = f"{row['extra_cost_vs_fedavg']:+.3f} ({row['paper_extra_cost']:.3f})" if name in VARIANTS else "—"
            disagree = caution_text(test)
            lines.append(
                f"| {get_algorithm(name).display_name} | "
                + " | ".join(f"{row['sites'][s]:.4f}" for s in sites)
                + f" | {g['mean']:.4f}{mark}{std} | {row['local_avg']:.4f} | {row['local_gen']:.4f} | {extra} | "
                + (f"{p_value_text(test)} ({test['median_difference']:+.4f}){disagree}" if test else "—")
                + f" | {per_seed_text(test) if test else '—'} |"
            )
        lines += [
            "",
            "† the 95% hierarchical bootstrap CI (sites, cases, seeds) of the mean per-case test Dice difference "
            "against FedAvg excludes 0 (fedseg.evaluate.stats.compare) and the Wilcoxon p, Holm-adjusted over the "
            "table, is below 0.05; the last column gives that p (two-sided, paired, over the test cases, each "
            "averaged over the seeds) and the median per-case difference; Δ per seed: each seed's mean per-case "
            "difference (s0: run seed 0); (seeds disagree): they do not all share the mean's sign, so a small p "
            "(each image the unit) is no evidence across training runs: read the CI; (mean and ranks disagree): the "
            "signed-rank statistic favours the other side than the mean: no †. ± std over the 3 seeds.",
            "",
            "Paper orderings (global test avg):",
            "",
        ]
        for claim, c in block["orderings"].items():
            verdict = "holds" if c["holds"] else "does not hold"
            lines.append(f"- {claim}: {c['left']:.4f} vs {c['right']:.4f} ({c['difference']:+.4f}): {verdict}")
        lines.append("")
    return "\n".join(lines)


def alpha_figure(done: dict, fed: str, seed: int) -> Path | None:
    """The report's alpha-per-round panels (Fig. 3a) of the four variants' runs of one seed."""
    from fedseg.algorithms.autofedavg.report import alpha_curves, load_weights, sample_shares
    from fedseg.presentation.kit import load_run

    weights, titles, shares = {}, {}, {}
    for name in VARIANTS:
        folder = Path(done[(fed, seed, name)]["dir"]) if (fed, seed, name) in done else None
        if folder is None or not (folder / "summary.json").is_file():
            continue
        run = load_run(folder)
        if (w := load_weights(run, name)) is not None:
            weights[name], titles[name] = w, get_algorithm(name).display_name
            shares[name] = sample_shares(run, name, w.sites)
    return alpha_curves(weights, RESULTS / f"autofedavg_alpha_{fed}.png", titles, shares)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--spec", type=Path, default=SPECS / "autofedavg.yaml", help="the bench file of the runs")
    ap.add_argument("--jobs", type=int, default=2)
    args = ap.parse_args()
    bench, done = bench_entries(args.spec, args.jobs)
    seeds, methods, federations = (
        list(bench.seeds),
        [m.name for m in bench.methods],
        [f.name for f in bench.federations],
    )
    report = {}
    for fed in federations:
        fedavg_floats = mean_std([done[(fed, s, "fedavg")]["summary"]["floats_sent"] for s in seeds])[0]
        rows = {a: table_row(a, [done[(fed, s, a)] for s in seeds], fedavg_floats) for a in methods}
        for name in methods[1:]:
            rows[name]["wilcoxon_vs_fedavg"] = wilcoxon_vs_fedavg(done, fed, seeds, name)
        report[fed] = {
            "seeds": seeds,
            "sites": done[(fed, seeds[0], "fedavg")]["sites"],
            "methods": rows,
            "orderings": orderings(rows),
        }
    text = markdown(report)  # first: it adds the Holm-adjusted p to the report's comparisons
    (RESULTS / "autofedavg.json").write_text(json.dumps(report, indent=1, allow_nan=True))
    (RESULTS / "autofedavg.md").write_text(text)
    print(text)
    for fed in federations:
        path = alpha_figure(done, fed, seeds[0])
        if path:
            print("alpha curves:", path)


if __name__ == "__main__":
    main()
