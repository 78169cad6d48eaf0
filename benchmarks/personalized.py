"""FeTS 2022's personalized and clustered methods next to FedAvg and local training, both built-in
federations, 3 seeds: Table 1 (Dice per region, HD95) and Table 2 (cost) rows.

    .venv/bin/python benchmarks/personalized.py [--spec benchmarks/specs/personalized.yaml] [--jobs 2]

The runs are the bench file ``benchmarks/specs/personalized.yaml``, trained and resumed by ``fedseg bench``
(``common.bench_entries``; runs under ``benchmarks/runs/personalized/``). Budget: ``benchmarks/common.py``'s
(64x64, batch 4, one local epoch per round, 30 rounds), with the paper's protocol scaled down:

* ``fedavg``, then in the same run ``finetune`` and ``ditto-ft`` (10 local epochs from FedAvg's
  selected model; their cost includes FedAvg's) and ``prior-cfl`` (10 rounds of FedAvg per
  cluster from that model; clusters: ``collection`` riga | other on synthetic-retina, ``coil``
  endorectal | none on synthetic-prostate): the paper fine-tunes 30 epochs / rounds after 300;
  and their control ``fedavg-continue`` (FedAvg continued 10 rounds from that model, per-site
  selection: prior-cfl with one cluster), so a gain over FedAvg that is only the extra training shows;
* ``ditto`` (concurrent form), ``fedper``, ``lg-fedavg`` (``private_layers`` = 4 parameterized
  layers, FeTS's reading, the default ``private_unit: layers``; the committed
  ``results/personalized.*`` predate it and kept 4 of the default UNet's 9 blocks, which the override
  ``methods.<name>.private_unit=blocks`` reproduces), ``cfl`` with the paper's simplification
  (one split at round 20 of 30, as its 200 of 300) and ``local``, each its own run.

Every personalized / clustered method is tested per site at its own best validation round. The
paired test: two-sided Wilcoxon signed-rank on per-case test Dice (mean over regions, the model
each site uses) against FedAvg's, pooled over seeds; and the methods that start from FedAvg's model
(``CONTROLLED``) against ``fedavg-continue``'s, the same extra training without their prior; and the ``PAIRS``.
Next to each p (Holm-adjusted within its table), the 95% hierarchical bootstrap CI of the mean difference (sites,
cases within sites, seeds); † marks a difference whose CI excludes 0 and whose adjusted p < 0.05 (the bench's
rule, ``fedseg.evaluate.stats.significant``). Writes
``benchmarks/results/personalized.json`` and ``personalized.md``.
"""

from __future__ import annotations

import argparse
import json
import math
from collections import defaultdict
from pathlib import Path

from common import RESULTS, ROUNDS, SPECS, bench_entries, case_dice
from fedseg.bench.table_rows import per_seed_text
from fedseg.evaluate.stats import caution_text, ci_text, correct_family, dagger, mean_std, p_value_text

CONTINUED = "fedavg-continue"  # the control: FedAvg continued from the model the CONTROLLED methods start from
ORDER = ["fedavg", "local", "finetune", "ditto-ft", "ditto", "fedper", "lg-fedavg", "cfl", "prior-cfl", CONTINUED]
CONTROLLED = ["finetune", "ditto-ft", "prior-cfl"]
# FeTS Sec. 5.2: "the regularization in Ditto does not enable solving the problems of local finetuning, giving very
# similar performances" -- Ditto-FT tested against fine-tuning on the same cases
PAIRS = [("ditto-ft", "finetune")]
PRIOR = {"synthetic-retina": "collection", "synthetic-prostate": "coil"}
COST_KEYS = ["sgd_steps", "parallel_sgd_steps", "floats", "simulated_hours"]


# FeTS 2022 searched the fine-tuning learning rate per institution: each site picks its rate on its own validation
LR_GRIDS = ["methods.finetune.lr_grid=[0.0003,0.001,0.003]", "methods.ditto-ft.lr_grid=[0.0003,0.001,0.003]"]


def extra(federation: str) -> list[str]:
    """The options on top of the budget (``specs/personalized.yaml`` sets them: the bench's and the federation's)."""
    return [
        "methods.finetune.epochs=10",
        "methods.ditto-ft.epochs=10",
        "methods.prior-cfl.rounds=10",
        "methods.fedavg-continue.rounds=10",
        f"methods.prior-cfl.cluster_by={PRIOR[federation]}",
        "methods.cfl.split_round=20",
        *LR_GRIDS,
    ]


def entries_of(done: dict) -> dict[str, list[dict]]:
    """``{algorithm: [entry per seed]}`` from bench_entries' ``{(fed, seed, method): entry}`` (chains unpacked)."""
    out: dict[str, list[dict]] = defaultdict(list)
    for (_, _, job), entry in sorted(done.items(), key=lambda kv: kv[0][1]):
        for e in entry.get("chain", [entry]):
            out[e["algorithm"]].append({**e, "job": job})
    return out


def wilcoxon_vs(entries: dict[str, list[dict]], algorithm: str, reference: str = "fedavg") -> dict:
    """Per-case test Dice against ``reference``'s (``fedseg.evaluate.stats.compare``): a two-sided paired Wilcoxon
    test over the test cases, each case's differences averaged over the seeds, and the hierarchical bootstrap CI."""
    from fedseg.evaluate.stats import compare

    ours = {e["seed"]: case_dice(e, algorithm) for e in entries[algorithm]}
    theirs = {f["seed"]: case_dice(f, reference) for f in entries[reference]}
    test = compare(ours, theirs)
    return {"pairs": test["n"], "mean_difference": test["mean_diff"], **test}


def row(entries: list[dict], regions: list[str]) -> dict:
    """Mean over seeds (and std over seeds) of the Table 1 and Table 2 numbers of one method."""
    stats = [e["stats"] for e in entries]
    summ = [e["summary"] for e in entries]
    return {
        "seeds": [e["seed"] for e in entries],
        "dice": mean_std([s["case_dice"]["mean"] for s in stats]),
        "dice_std_over_cases": mean_std([s["case_dice"]["std"] for s in stats])["mean"],
        **{f"dice_{r}": mean_std([s["region_dice"][r]["mean"] for s in stats]) for r in regions},
        "hd95": mean_std([s["case_hd95"]["mean"] for s in stats]),
        "local_avg": mean_std([x.get("local_avg", math.nan) for x in summ]),
        "local_gen": mean_std([x.get("local_gen", math.nan) for x in summ]),
        "selected_rounds": [x.get("selected_rounds") or x.get("best_round") for x in summ],
        "cost": {k: mean_std([x["cost"][k] for x in summ])["mean"] for k in COST_KEYS},
        "cost_includes": summ[0]["cost"].get("includes"),
        "rounds": summ[0]["rounds"],
    }


def clusters(entries: list[dict]) -> list[dict]:
    """Final cluster per site and seed, from round_metrics (metric ``cluster``)."""
    out = []
    for e in entries:
        last = max((r["round"] for r in e["round_metrics"] if r["metric"] == "cluster"), default=None)
        rows = [r for r in e["round_metrics"] if r["metric"] == "cluster" and r["round"] == last]
        out.append({r["site"]: int(r["value"]) for r in rows})
    return out


def fmt(x: dict, digits: int = 3) -> str:
    m, s = x["mean"], x["std"]
    if math.isnan(m):
        return "–"
    return f"{m:.{digits}f}" + ("" if math.isnan(s) else f" ± {s:.{digits}f}")


TEST_HEAD = ["95% CI", "Δ per seed", "p (Holm)"]  # after a Δ column: test_cells' other cells


def test_cells(w: dict) -> list[str]:
    """Δ (with † where significant: the CI excludes 0 and the Holm-adjusted p < 0.05), the 95% CI, the Δ of each
    seed and that p (with "(seeds disagree)" where the seeds' Δ do not all share Δ's sign, "(mean and ranks
    disagree)" where the signed-rank statistic favours the other side: ``fedseg.evaluate.stats.caution_text``) of
    one ``wilcoxon_vs`` result, as table cells."""
    p = p_value_text(w) + caution_text(w)
    return [f"{w['mean_difference']:+.4f}{dagger(w)}", ci_text(w, digits=4), per_seed_text(w), p]


def correct_families(block: dict) -> None:
    """Holm within each table of a federation (``fedseg.evaluate.stats.correct_family``): the comparisons with
    FedAvg, those with the continuation control, the pairs; idempotent (a stored report is corrected again)."""
    correct_family(block["wilcoxon"].values())
    correct_family(block.get("vs_continued", {}).values())
    correct_family(block.get("pairs", []))


def markdown(report: dict) -> str:
    lines = [
        "# FeTS 2022 personalized and clustered methods (`benchmarks/personalized.py`)",
        "",
        f"Command: `{report['command']}`. Budget: {report['budget']}. Mean ± std over seeds {report['seeds']};",
        "Dice/HD95 per test case with the model each site uses (personalized/clustered: each site at its own",
        "best validation round). Δ: mean over the test cases (each averaged over the seeds) of the per-case Dice",
        "difference; 95% CI: its hierarchical bootstrap interval (sites, cases within sites, seeds); p: two-sided",
        "paired Wilcoxon over the same cases (`fedseg.evaluate.stats.compare`), Holm-adjusted within each table; †",
        "the CI excludes 0 and that p < 0.05. Δ per seed: s0 is run seed 0's Δ; (seeds disagree): they do not all",
        "share Δ's sign, so a small p (each image the unit) is no evidence across training runs: read the CI.",
        "(mean and ranks disagree): the signed-rank statistic favours the other side than Δ; no †.",
        "",
    ]
    for fed, block in report["federations"].items():
        correct_families(block)
        regions = block["regions"]
        lines += [f"## {fed}", "", "### Table 1", ""]
        head = ["method", "Dice", *[f"Dice {r}" for r in regions], "HD95", "local avg", "local gen", "Δ vs FedAvg"]
        head += TEST_HEAD
        lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        for name, r in block["rows"].items():
            w = block["wilcoxon"].get(name, {})
            cells = [
                name,
                fmt(r["dice"]),
                *[fmt(r[f"dice_{x}"]) for x in regions],
                fmt(r["hd95"], 2),
                fmt(r["local_avg"]),
                fmt(r["local_gen"]),
                *(test_cells(w) if w else [""] * (1 + len(TEST_HEAD))),
            ]
            lines.append("| " + " | ".join(cells) + " |")
        lines += ["", f"### Against the continuation control ({CONTINUED}: the same start and extra training)", ""]
        head = ["method", f"Δ Dice vs {CONTINUED}", *TEST_HEAD, "pairs"]
        lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        for name, w in block.get("vs_continued", {}).items():
            lines.append(f"| {name} | " + " | ".join(test_cells(w)) + f" | {w['pairs']} |")
        if block.get("pairs"):
            lines += [
                "",
                "### Pairs",
                "",
                "| " + " | ".join(["method", "against", "Δ Dice", *TEST_HEAD, "pairs"]) + " |",
                "|" + "---|" * (4 + len(TEST_HEAD)),
            ]
            for w in block["pairs"]:
                lines.append(f"| {w['method']} | {w['against']} | " + " | ".join(test_cells(w)) + f" | {w['pairs']} |")
        lines += ["", "### Table 2 (cost; fine-tuning methods include FedAvg's)", ""]
        head = ["method", "rounds", "SGD steps", "max parallel steps", "floats", "simulated h"]
        lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        for name, r in block["rows"].items():
            c = r["cost"]
            lines.append(
                f"| {name} | {r['rounds']} | {c['sgd_steps']:.0f} | {c['parallel_sgd_steps']:.0f} | "
                f"{c['floats']:.3g} | {c['simulated_hours']:.3f} |"
            )
        lines += [
            "",
            f"Clusters at the end (per seed): cfl {block['clusters']['cfl']}; "
            f"prior-cfl {block['clusters']['prior-cfl']}",
            "",
        ]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--spec", type=Path, default=SPECS / "personalized.yaml", help="the bench file of the runs")
    parser.add_argument("--jobs", type=int, default=2)
    args = parser.parse_args()
    bench, done = bench_entries(args.spec, args.jobs)
    report = {
        "command": f"python benchmarks/personalized.py --jobs {args.jobs}",
        "budget": f"64x64, batch 4, 1 local epoch per round, {ROUNDS} rounds; " + "; ".join(extra("synthetic-retina")),
        "seeds": list(bench.seeds),
        "federations": {},
    }
    for fed in (f.name for f in bench.federations):
        entries = entries_of({key: entry for key, entry in done.items() if key[0] == fed})
        regions = entries["fedavg"][0]["regions"]
        report["federations"][fed] = {
            "regions": regions,
            "rows": {name: row(entries[name], regions) for name in ORDER},
            "wilcoxon": {name: wilcoxon_vs(entries, name) for name in ORDER if name != "fedavg"},
            "vs_continued": {name: wilcoxon_vs(entries, name, CONTINUED) for name in CONTROLLED},
            "pairs": [{"method": a, "against": b, **wilcoxon_vs(entries, a, b)} for a, b in PAIRS],
            "clusters": {name: clusters(entries[name]) for name in ("cfl", "prior-cfl")},
        }
        correct_families(report["federations"][fed])
    (RESULTS / "personalized.json").write_text(json.dumps(report, indent=1, allow_nan=True))
    (RESULTS / "personalized.md").write_text(markdown(report))
    print(markdown(report))


if __name__ == "__main__":
    main()
