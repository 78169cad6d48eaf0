"""The three papers' claims read off a bench's tables: one row per (claim, federation) with Δ, its 95% CI, p and a
verdict, for the README's claims table and a closing note.

    .venv/bin/python benchmarks/claims.py benchmarks/results/headline-equal benchmarks/results/headline-fedsm-equal \
        benchmarks/results/personalized.json benchmarks/results/fets_limited benchmarks/results/fets_setups_iid.json

Each source is a ``fedseg bench --out`` folder, of which only ``tables.json`` is read (so it works on a committed
bench too), or the JSON of ``benchmarks/personalized.py`` (FeTS's personalized and clustered methods) or of
``benchmarks/fets_setups.py`` (FeTS Sec. 4.3: FedAvg on the challenge partition against IID ones, federation
``synthetic-brats partitions``, methods ``<method>@<partition>``), read as the same tables (:func:`as_table`). A
claim names two methods; its difference is found, per federation, as the first of: the comparison
``[method, against]`` of the bench's ``comparisons``, the reverse one (Δ, CI negated; p unchanged: the Wilcoxon
test is symmetric when two-sided), or a method's test against the bench's reference. Everything comes from
``fedseg.evaluate.stats.compare`` run by the bench: Δ = mean over the test cases (each averaged over the seeds) of
(method − against), its 95% hierarchical bootstrap CI (sites, cases within sites, seeds) and the paired Wilcoxon p.

The verdict follows the CI (the tables' † also needs the Holm-adjusted p; each claim here is one pre-stated
hypothesis, and every better/worse claim that holds or fails on the committed tables has p <= 2e-6):

- ``better`` (the paper says the method beats the other): **holds** when the CI lies above 0, **fails** when it
  lies below 0, **not shown** when it covers 0; ``worse`` mirrors it;
- ``matches`` (the paper says the two are equal, e.g. FedSM-extra and FedSM): **holds** when the CI lies within
  ± ``margin``, **fails** when it lies wholly outside, **not shown** otherwise;
- ``not worse`` (at most ``margin`` below): **holds** when the CI's low end is above −``margin``, **fails** when its
  high end is below −``margin``; ``not better`` (the paper finds no significant gain) mirrors it: **holds** when the
  CI's high end is below +``margin``, **fails** when its low end is above +``margin``;
- **cannot test** when a method or the federation is not in any of the tables;
- with **one seed** every verdict is **not shown** (the row says "one seed"): the bootstrap then has no run-to-run
  variance, so its CI is too narrow to decide — the protocol's rule that gives no † at one seed.

The margins are this script's (stated in every row), not the papers': they read "the same performance" as a
Dice difference under 0.01. Writes ``claims.json`` and ``claims.md`` into ``--out`` (default: the first folder).
"""

from __future__ import annotations

import argparse
import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path

RETINA, PROSTATE = "synthetic-retina", "synthetic-prostate"
BRATS_LIMITED = "synthetic-brats (limited)"  # benchmarks/results/fets_limited: FeTS's limited setup (Sec. 4.3.2)
# a bench's federations carry its setup's name where the bench runs one of FeTS's alternative setups (as_table)
SETUP_OF_BENCH = {"fets-limited": "limited"}
BRATS_PARTITIONS = "synthetic-brats partitions"  # benchmarks/results/fets_setups_iid.json (as_table)
MARGIN = 0.01  # Dice: "the same performance" (module docstring)


@dataclass(frozen=True)
class Claim:
    """One claim of a paper: ``method`` against ``against`` is ``kind`` on each of ``federations``."""

    paper: str
    where: str  # table / figure / section of the paper
    text: str
    method: str
    against: str
    kind: str  # better | worse | matches | not worse | not better
    federations: tuple[str, ...] = (RETINA, PROSTATE)
    margin: float = MARGIN


# retina: low similarity (the sites differ in appearance); prostate: high similarity (FedSM Tables 3 and 4)
CLAIMS = [
    Claim("FedSM", "Tables 3-4", "FedSM beats FedAvg", "fedsm", "fedavg", "better"),
    Claim(
        "FedSM",
        "Tables 3-4, Sec. 4.1",
        "FedSM matches centralized training (on prostate: 'similar patterns', a smaller gap)",
        "fedsm",
        "centralized",
        "matches",
    ),
    Claim("FedSM", "Tables 3-4", "FedSM beats FedProx", "fedsm", "fedprox", "better"),
    Claim("FedSM", "Tables 3-4", "FedSM beats SCAFFOLD", "fedsm", "scaffold", "better"),
    Claim(
        "FedSM",
        "Tables 3-4",
        "FedSM beats local training (here: each site's own model on its own cases)",
        "fedsm",
        "local",
        "better",
    ),
    Claim(
        "FedSM",
        "Sec. 4.1",
        "FedSM-extra performs as FedSM (the simplification of Eq. 1 to Eq. 2 costs nothing)",
        "fedsm-extra",
        "fedsm",
        "matches",
    ),
    Claim("FedSM", "Table 6", "SoftPull beats fine-tuning", "fedsm", "fedsm-ft", "better", (RETINA,)),
    Claim("FedSM", "Table 6", "SoftPull beats APFL", "fedsm", "fedsm-apfl", "better", (RETINA,)),
    Claim("FedSM", "Table 6", "SoftPull beats Per-FedAvg", "fedsm", "fedsm-perfedavg", "better", (RETINA,)),
    Claim("FedSM", "Table 6", "SoftPull beats pFedMe", "fedsm", "fedsm-pfedme", "better", (RETINA,)),
    Claim(
        "Auto-FedAvg",
        "Tables 1-3",
        "learned aggregation weights beat FedAvg",
        "autofedavg-n-dirichlet",
        "fedavg",
        "better",
    ),
    Claim(
        "Auto-FedAvg",
        "Tables 2-3",
        "learned aggregation weights beat uniform weights",
        "autofedavg-n-dirichlet",
        "fedavg-uniform",
        "better",
    ),
    Claim(
        "Auto-FedAvg",
        "Fig. 4",
        "learning the weights every t0 = 10 rounds costs little against every round",
        "autofedavg-t0-10",
        "autofedavg-n-dirichlet",
        "not worse",
    ),
    Claim(
        "Auto-FedAvg",
        "Sec. 4.3, Table 3",
        "learning the weights every t0 = 5 rounds does as well as every round ('even better')",
        "autofedavg-t0-5",
        "autofedavg-n-dirichlet",
        "not worse",
    ),
    Claim(
        "Auto-FedAvg",
        "Sec. 4.2.2, Table 2",
        "re-initializing α before each learning round is worse than continuing it (both at t0 = 10, as the paper)",
        "autofedavg-reinit-t0-10",
        "autofedavg-t0-10",
        "worse",
    ),
    Claim(
        "Auto-FedAvg",
        "Sec. 4.2.2",
        "the same at t0 = 1 (not in the paper: every round re-initializes α)",
        "autofedavg-reinit",
        "autofedavg-n-dirichlet",
        "worse",
    ),
    Claim("FeTS 2022", "Table 1, Sec. 5.2.1", "centralized training beats FedAvg", "centralized", "fedavg", "better"),
    Claim(
        "FeTS 2022",
        "Table 1, Sec. 5.2.1",
        "uniform aggregation is worse than FedAvg's weighted one",
        "fedavg-uniform",
        "fedavg",
        "worse",
    ),
    Claim("FeTS 2022", "Table 1, Sec. 5.2.2", "SCAFFOLD beats FedAvg", "scaffold", "fedavg", "better"),
    Claim(
        "FeTS 2022",
        "Table 1, Sec. 5.2.2",
        "FedAdam does not improve on FedAvg",
        "fedadam",
        "fedavg",
        "not better",
    ),
    Claim("FeTS 2022", "Table 1, Sec. 5.2.2", "FedNova is worse than FedAvg", "fednova", "fedavg", "worse"),
    # FeTS's personalized and clustered methods (benchmarks/personalized.py: 30 FedAvg rounds, then 10 more)
    Claim("FeTS 2022", "Table 1, Sec. 5.2.3", "local fine-tuning beats FedAvg", "finetune", "fedavg", "better"),
    Claim(
        "FeTS 2022",
        "Sec. 5.2.3",
        "Ditto gives performance very similar to local fine-tuning",
        "ditto-ft",
        "finetune",
        "matches",
    ),
    Claim(
        "FeTS 2022", "Table 1, Sec. 5.2.3", "CFL gives no significant gain over FedAvg", "cfl", "fedavg", "not better"
    ),
    Claim(
        "FeTS 2022",
        "Table 1, Sec. 5.2.3",
        "partial model sharing decreases performance: LG-FedAvg is worse than FedAvg",
        "lg-fedavg",
        "fedavg",
        "worse",
    ),
    Claim("FeTS 2022", "Table 1, Sec. 6.1", "prior-knowledge clusters beat FedAvg", "prior-cfl", "fedavg", "better"),
    Claim(
        "FeTS 2022 (our control)",
        "Sec. 5.2.3",
        "prior CFL's gain is the clustering's, not its 10 extra rounds (against FedAvg continued as long)",
        "prior-cfl",
        "fedavg-continue",
        "better",
        (RETINA, PROSTATE, BRATS_LIMITED),
    ),
    Claim(
        "FeTS 2022 (our control)",
        "Sec. 5.2.3",
        "fine-tuning's gain is the personalization's, not its extra epochs (against FedAvg continued)",
        "finetune",
        "fedavg-continue",
        "better",
    ),
    # FeTS Sec. 4.3 setups at CPU scale (synthetic-brats, one seed)
    Claim(
        "FeTS 2022",
        "Table 3, Sec. 5.5",
        "centralized beats FedAvg in the limited setup",
        "centralized",
        "fedavg",
        "better",
        (BRATS_LIMITED,),
    ),
    Claim(
        "FeTS 2022",
        "Table 3, Sec. 5.5",
        "SCAFFOLD does not improve on FedAvg in the limited setup (the paper: worse in median Dice)",
        "scaffold",
        "fedavg",
        "not better",
        (BRATS_LIMITED,),
    ),
    Claim(
        "FeTS 2022",
        "Table 3, Sec. 5.5",
        "prior CFL gives no significant gain over FedAvg in the limited setup",
        "prior-cfl",
        "fedavg",
        "not better",
        (BRATS_LIMITED,),
    ),
    Claim(
        "FeTS 2022",
        "Table 1 (IID rows), Sec. 5.4",
        "FedAvg on 5 IID institutions does at least as well as on the challenge partition",
        "fedavg@iid-5",
        "fedavg@challenge",
        "not worse",
        (BRATS_PARTITIONS,),
    ),
    Claim(
        "FeTS 2022",
        "Table 1 (IID rows), Sec. 5.4",
        "FedAvg on as many IID institutions as the challenge partition (here 11) is worse than on the challenge one",
        "fedavg@iid-11",
        "fedavg@challenge",
        "worse",
        (BRATS_PARTITIONS,),
    ),
]


def read_tables(sources: list[Path]) -> list[dict]:
    """Every source as a bench's tables (module docstring; a missing one is one clear line, not a traceback)."""
    tables = []
    for source in sources:
        path = source if source.suffix == ".json" else source / "tables.json"
        if not path.is_file():
            hint = "" if source.suffix == ".json" else f" (run `fedseg bench ... --out {source}` first)"
            raise SystemExit(f"error: {path}: no such file{hint}")
        try:
            tables.append(as_table(json.loads(path.read_text())))
        except (ValueError, KeyError, TypeError) as e:
            why = f"not a bench's tables.json nor a benchmark script's results ({e})"
            raise SystemExit(f"error: {path}: {why}") from None
    return tables


def as_table(data: dict) -> dict:
    """A source's JSON in the shape of a bench's ``tables.json``: ``{"bench": {"reference"}, "federations": {name:
    {"methods": {m: {"dice": {"mean"}}}, "comparisons": [compare(...) + method, against]}}}``.

    ``personalized.json``: its tests against FedAvg, against ``fedavg-continue`` and its pairs become comparisons;
    ``fets_setups_iid.json``: each partition's test against the challenge partition, as ``m@partition`` against
    ``m@challenge`` in the federation ``BRATS_PARTITIONS``; a bench of ``SETUP_OF_BENCH`` (FeTS's limited setup):
    its federations renamed ``<name> (<setup>)``, so that only its tables answer that setup's claims."""
    if "bench" in data and "federations" in data:  # a bench's tables.json
        setup = SETUP_OF_BENCH.get(data["bench"].get("name", ""))
        if setup is not None:
            data = {**data, "federations": {f"{k} ({setup})": v for k, v in data["federations"].items()}}
        return data
    if "federations" in data:  # benchmarks/personalized.py
        feds = {}
        for name, block in data["federations"].items():
            tests = [{"method": m, "against": "fedavg", **t} for m, t in block["wilcoxon"].items()]
            tests += [{"method": m, "against": "fedavg-continue", **t} for m, t in block["vs_continued"].items()]
            tests += block.get("pairs", [])
            methods = {m: {"dice": {"mean": row["dice"]["mean"]}} for m, row in block["rows"].items()}
            feds[name] = {"methods": methods, "comparisons": tests}
        return {"bench": {"reference": "fedavg"}, "federations": feds}
    if "rows" in data:  # benchmarks/fets_setups.py
        methods = {f"{r['method']}@{r['federation']}": {"dice": {"mean": r["dice"]}} for r in data["rows"]}
        seeds = {"seeds": bench_seeds(data["bench"])} if "bench" in data else {}  # rows written before they said
        tests = [
            {**seeds, **r, "method": f"{r['method']}@{r['federation']}", "against": f"{r['method']}@challenge"}
            for r in data["rows"]
            if "mean_diff" in r
        ]
        return {"bench": {}, "federations": {BRATS_PARTITIONS: {"methods": methods, "comparisons": tests}}}
    raise ValueError("no 'federations' or 'rows'")


def bench_seeds(bench_file: str) -> int:
    """How many seeds the bench file ``bench_file`` (relative to the repository) runs."""
    import yaml

    return len(yaml.safe_load((Path(__file__).resolve().parents[1] / bench_file).read_text(encoding="utf-8"))["seeds"])


def negated(test: dict) -> dict:
    """``test`` of (a − b) as the test of (b − a): the differences and the CI negated (a ``null`` of tables.json,
    a number that was not finite, stays None); p as it is, a one-tailed test's side swapped (``greater`` of a − b is
    ``less`` of b − a)."""
    out = dict(test)
    for key in ("mean_diff", "median_diff"):
        if out.get(key) is not None:
            out[key] = -out[key]
    out["ci_low"], out["ci_high"] = (None if v is None else -v for v in (test["ci_high"], test["ci_low"]))
    out["per_seed_diff"] = {s: None if d is None else -d for s, d in test.get("per_seed_diff", {}).items()}
    swapped = {"greater": "less", "less": "greater"}
    alternative = str(test.get("alternative") or "two-sided")
    out["alternative"] = swapped.get(alternative, alternative)  # one-tailed: the other side
    return out


def find_test(tables: list[dict], federation: str, method: str, against: str) -> tuple[dict, dict] | None:
    """``(test of method − against, the federation's table)`` from the first table that has it, else None."""
    for table in tables:
        fed = table.get("federations", {}).get(federation)
        if fed is None:
            continue
        reference = table.get("bench", {}).get("reference")
        for c in fed.get("comparisons", []):
            if (c["method"], c["against"]) == (method, against):
                return c, fed
            if (c["method"], c["against"]) == (against, method):
                return negated(c), fed
        methods = fed.get("methods", {})
        if against == reference and method in methods and methods[method].get("wilcoxon"):
            return methods[method]["wilcoxon"], fed
        if method == reference and against in methods and methods[against].get("wilcoxon"):
            return negated(methods[against]["wilcoxon"]), fed
    return None


def verdict(kind: str, low: float, high: float, margin: float) -> str:
    """The claim's verdict from the 95% CI ``[low, high]`` of (method − against) (module docstring)."""
    if kind in ("worse", "not better"):  # mirrored: (against − method) is better / not worse
        low, high, kind = -high, -low, {"worse": "better", "not better": "not worse"}[kind]
    if kind == "better":
        return "holds" if low > 0 else "fails" if high < 0 else "not shown"
    if kind == "matches":
        return (
            "holds" if -margin <= low and high <= margin else "fails" if high < -margin or low > margin else "not shown"
        )
    if kind == "not worse":
        return "holds" if low > -margin else "fails" if high < -margin else "not shown"
    raise ValueError(f"unknown claim kind {kind!r}")


def assess(claims: list[Claim], tables: list[dict]) -> list[dict]:
    """One row per (claim, federation)."""
    rows = []
    for claim in claims:
        for federation in claim.federations:
            row = {**asdict(claim), "federation": federation}
            del row["federations"]
            found = find_test(tables, federation, claim.method, claim.against)
            if found is None or found[0].get("ci_low") is None or math.isnan(found[0]["ci_low"]):
                rows.append({**row, "verdict": "cannot test"})
                continue
            test, fed = found
            keys = ("mean_diff", "ci_low", "ci_high", "p", "alternative", "n", "seeds", "per_seed_diff")
            one_seed = isinstance(test.get("seeds"), int) and test["seeds"] < 2
            rows.append(
                {
                    **row,
                    "verdict": "not shown"
                    if one_seed
                    else verdict(claim.kind, test["ci_low"], test["ci_high"], claim.margin),
                    "cautions": (["one seed"] if one_seed else []) + cautions(test, fed, (claim.method, claim.against)),
                    "dice": finite(fed["methods"].get(claim.method, {}).get("dice", {}).get("mean")),
                    "dice_against": finite(fed["methods"].get(claim.against, {}).get("dice", {}).get("mean")),
                    **{k: finite(test.get(k)) for k in keys},
                }
            )
    return rows


def cautions(test: dict, fed: dict, methods: tuple[str, ...]) -> list[str]:
    """What a verdict is read with: each of ``methods`` with runs that may not have converged (``k/n runs may not
    have converged``, from the table's ``convergence``; more rounds may change Δ), and the comparison's own
    warnings (``fedseg.evaluate.stats.cautions``: the seeds' Δ or the ranks disagree with Δ's sign)."""
    from fedseg.evaluate.stats import cautions as comparison_cautions

    out = []
    for name in methods:
        conv = fed.get("methods", {}).get(name, {}).get("convergence") or {}
        late, runs = conv.get("not_converged"), conv.get("runs")
        if isinstance(late, int) and late > 0:
            out.append(f"{name}: {late}/{runs} runs may not have converged")
    return out + comparison_cautions(test)


def finite(x: object) -> object:
    """``x`` with NaN as None (a test without a p, a method without a Dice), so claims.json stays strict JSON."""
    return None if isinstance(x, float) and math.isnan(x) else x


def table(rows: list[dict]) -> str:
    """The claims as one Markdown table, one row per (claim, federation), and the count of each verdict."""

    def num(x: float | None, fmt: str = "+.4f") -> str:
        return "" if x is None else format(x, fmt)

    lines = [
        "| paper | where | claim | federation | Δ | 95% CI | p (unadjusted) | verdict | read with |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        margined = r["kind"] in ("matches", "not worse", "not better")
        kind = r["kind"] + (f" (margin {r['margin']:g})" if margined else "")
        ci = f"[{num(r.get('ci_low'))}, {num(r.get('ci_high'))}]" if r.get("ci_low") is not None else ""
        p = "" if r.get("p") is None else f"{r['p']:.2g}"
        if p and (r.get("alternative") or "two-sided") != "two-sided":  # one-tailed: say for which side
            p += f" ({r['alternative']}, {r['method']} − {r['against']})"
        lines.append(
            f"| {r['paper']} | {r['where']} | {r['text']}: {r['method']} vs {r['against']}, {kind} | "
            f"{r['federation']} | {num(r.get('mean_diff'))} | {ci} | {p} | **{r['verdict']}** | "
            f"{'; '.join(r.get('cautions') or [])} |"
        )
    counts = {v: sum(r["verdict"] == v for r in rows) for v in ("holds", "fails", "not shown", "cannot test")}
    lines += ["", "Verdicts: " + ", ".join(f"{n} {v}" for v, n in counts.items()) + "."]
    return "\n".join(lines) + "\n"


def markdown(rows: list[dict], sources: list[str]) -> str:
    return "\n".join(
        [
            "# The papers' claims against fedseg's benchmarks",
            "",
            f"From {', '.join(f'`{s}`' for s in sources)} (`python benchmarks/claims.py`). Δ: mean over the test "
            "cases (each averaged over the seeds) of (method − against); CI: its 95% hierarchical bootstrap interval "
            "(sites, cases within sites, seeds); p: the paired Wilcoxon test. Verdict from the CI: a better/worse "
            "claim holds when the CI excludes 0 on its side and fails when it excludes 0 on the other; a 'matches' "
            "claim holds when the CI lies within ± the margin; 'not worse' when its low end is above −margin, 'not "
            "better' when its high end is below +margin; otherwise not shown. Read with: a method whose runs may not "
            "have converged (more rounds may change Δ), seeds whose Δ do not all share its sign, a rank test that "
            "favours the other side than Δ.",
            "",
            table(rows),
        ]
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "sources", nargs="+", type=Path, help="fedseg bench --out folders (their tables.json) or benchmark JSONs"
    )
    parser.add_argument("--out", type=Path, default=None, help="where claims.json/.md go (default: the first folder)")
    args = parser.parse_args()
    rows = assess(CLAIMS, read_tables(args.sources))
    out = args.out or (args.sources[0].parent if args.sources[0].suffix == ".json" else args.sources[0])
    out.mkdir(parents=True, exist_ok=True)
    sources = [str(f) for f in args.sources]
    (out / "claims.json").write_text(json.dumps({"sources": sources, "claims": rows}, indent=1) + "\n")
    (out / "claims.md").write_text(markdown(rows, sources))
    for r in rows:
        print(f"{r['verdict']:>11}  {r['federation']:<18} {r['method']} vs {r['against']} ({r['kind']})")
    print(f"wrote {out / 'claims.md'}")


if __name__ == "__main__":
    main()
