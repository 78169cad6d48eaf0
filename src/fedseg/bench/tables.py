"""A bench's numbers: per-case results pooled over folds, mean ± std, paired Wilcoxon tests, convergence, cost.

For each federation and method (its final runs, ``fedseg.bench.execute``):

* ``results.csv`` rows: the test rows of the model each site uses (``site_models`` in summary.json), one per (fold,
  seed, site, case, region, metric); on an IID repartition a case is listed under its original site (a run
  recorded before ``data.seed`` dealt the synthetic sites anew for every seed), so seeds and methods pair the same
  case; in a k-fold bench each case is
  tested in exactly one fold, so pooling the folds scores every case once per seed (FeTS Sec. 4.4.4);
* ``dice`` / ``hd95`` / ``nsd`` / ``regions``: mean ± std over cases of the per-case value (mean over regions; per
  region), each case first averaged over the seeds (the FeTS Table 1 convention, "± std over samples of all folds");
* ``client_avg``: the mean of per-site means, per seed, then mean ± std over seeds (Auto-FedAvg Table 2);
  ``sites``: per-site mean ± std over seeds (``n``: seeds); ``site_cases``: the cases each site's means average;
* ``wilcoxon`` (pooled) and ``site_wilcoxon``: paired comparisons against the bench's reference method
  (:func:`fedseg.evaluate.stats.compare`: the Wilcoxon test on the per-case differences averaged over the seeds,
  ``tests.alternative`` sided, and the 95% CI of the mean difference from a hierarchical bootstrap over sites,
  cases and seeds); ``dagger`` when the comparison is :func:`fedseg.evaluate.stats.significant_over_seeds` (the CI
  excludes 0 on the alternative's side, the Holm-adjusted p < 0.05 and 2 seeds or more; families:
  :func:`correct_tests`);
* ``rank_stability`` (per federation): how often each method holds each rank by mean Dice over the same bootstrap
  samples (:func:`fedseg.evaluate.stats.rank_stability`);
* ``hd95_wilcoxon`` / ``nsd_wilcoxon``: the same pooled comparison on HD95 / NSD (None when the method or the
  reference has none: ``eval.hd95`` off, or NSD of runs written before it existed); HD95's alternative is the
  reverse of ``tests.alternative`` (:func:`metric_alternative`: lower is better), its Δ in the HD95 unit;
* ``method_set``: the method's own ``set:`` overrides of the bench file (on top of the bench's and the federation's;
  ``[]`` for none), which the legend names where methods differ in them (a ``tables.json`` written before has none
  and renders as it did);
* ``convergence``: runs, how many selected a round in the last 10% of their rounds without a validation plateau
  (``not_converged``, ``fedseg.run.stopping.not_converged``), stop rules;
* ``learned_weights`` (a method whose sites learn their aggregation weights, Auto-FedAvg: ``round_metrics.csv``
  metric ``alpha``): each site's alpha_k at each run's last learning round, mean ± std over the runs (folds x seeds);
  absent for other methods;
* ``cost``: the mean over runs of the FeTS Table 2 quantities, with the floats per site as the paper reports them
  (``floats_per_site`` = total / K) next to the total over sites, and the evaluation traffic per site apart
  (``eval_floats_per_site``: validation and test messages, e.g. FedSM's super model every validated round).
"""

from __future__ import annotations

import json
import math
from collections import defaultdict
from collections.abc import Iterable
from pathlib import Path

import numpy as np
import yaml

from fedseg.bench.execute import DONE_FILE, Finished
from fedseg.bench.phases import BenchRuns
from fedseg.bench.plan import BenchRun, folds_of
from fedseg.bench.select import edge_keys
from fedseg.bench.spec import BenchSpec, MethodSpec
from fedseg.config_load import RECORDED_SCORING, with_recorded_scoring
from fedseg.data.repartition import SEPARATOR
from fedseg.evaluate.metric_info import HD95, NSD, Metric
from fedseg.evaluate.stats import (
    Alternative,
    compare,
    correct_family,
    mean_std,
    rank_stability,
    seed_averaged,
    significant_over_seeds,
)
from fedseg.evaluate.tables import case_means, own_site_model, read_rows
from fedseg.presentation.kit import routed_to_global
from fedseg.run.stopping import recorded_not_converged

RESULT_COLUMNS = ["federation", "method", "fold", "seed", "site", "case", "region", "metric", "value"]
TESTED_METRICS = (HD95, NSD)  # tested against the reference besides Dice (whose tests also run per site)
COST_KEYS = ("sgd_steps", "parallel_sgd_steps", "floats", "eval_floats", "simulated_hours")


def method_rows(bench: BenchSpec, run: BenchRun, fin: Finished) -> list[dict]:
    """The run's own-model test rows of the method's scored algorithm, labelled with the run's cell (a
    leave-one-out run: its models' Dice on every case of the held-out site, :func:`unseen_case_rows`)."""
    scored = bench.method(run.method).scored
    cell = {"federation": run.federation, "method": run.method, "fold": run.fold, "seed": run.seed}
    if run.holdout is not None:
        return [{**cell, **r, "algorithm": scored} for r in unseen_case_rows(fin.dir, scored, run.holdout)]
    rows = [r for r in read_rows(fin.dir / "results.csv") if r["algorithm"] == scored]
    used = site_model_filter(fin.entry(scored), rows)
    keys = ("site", "case", "region", "metric", "value")
    out = [{**cell, **{k: r[k] for k in keys}, "algorithm": scored} for r in rows if used(r)]
    if is_iid(fin):  # cases are dealt anew per seed: a case is known by its original site (FeTS Fig. 7)
        for r in out:
            r["site"] = r["case"].split(SEPARATOR, 1)[0]
    return out


def routed_runs(pairs: list[tuple[BenchRun, Finished]], scored: str) -> list[str]:
    """The runs (``s<seed>``, ``f<fold> s<seed>`` with several folds) in which ``scored``'s selector routed every test
    image to its global model (``kit.routed_to_global``): there its scores are its global model's. A leave-one-out
    run is scored on its held-out site, whose routing selector_features (the training sites' test images) does not
    hold: not named."""
    folds = len({run.fold for run, _ in pairs}) > 1
    return [
        (f"f{run.fold} " if folds else "") + f"s{run.seed}"
        for run, fin in pairs
        if run.holdout is None and scored in routed_to_global(fin.dir)
    ]


def is_iid(fin: Finished) -> bool:
    """Whether the run trained on an IID repartition (its config.yaml's data.repartition.mode)."""
    cfg = yaml.safe_load((fin.dir / "config.yaml").read_text()) or {}
    return cfg.get("data", {}).get("repartition", {}).get("mode") == "iid"


def site_model_filter(entry: dict, rows: list[dict]):
    """The rows of the model each site uses (``site_models`` in summary.json). A summary written before it was
    recorded: the shared model where there is one (an FL method that also kept local models), else each site's own."""
    if "site_models" in entry:
        models = entry["site_models"]
        return lambda r: r["model"] == models.get(r["site"])
    shared = any(":" not in r["model"] for r in rows)
    return lambda r: (":" not in r["model"]) if shared else own_site_model(r)


def unseen_case_rows(folder: Path, algorithm: str, site: str) -> list[dict]:
    """Per case and region, the Dice of ``algorithm``'s deployed model on the unseen ``site`` (``unseen.json``:
    FedSM at the gamma chosen on validation, a global model as it is); none for a method without such a model."""
    for row in json.loads((folder / "unseen.json").read_text())["rows"]:
        if row["algorithm"] == algorithm:
            dice = row.get("deployed_case_dice") or row["case_dice"]
            return [
                {
                    "site": site,
                    "case": case,
                    "region": region,
                    "metric": "dice",
                    "value": math.nan if v is None else float(v),
                }
                for case, values in zip(row["case_ids"], dice)
                for region, v in zip(row["regions"], values)
            ]
    return []


def per_seed_cases(rows: list[dict], metric: str, region: str | None = None) -> dict[int, dict]:
    """``{seed: {(site, case): value}}``: per case the mean over regions (or ``region``'s value), folds pooled."""
    by_seed: dict[int, list[dict]] = defaultdict(list)
    for r in rows:
        if region is None or r["region"] == region:
            by_seed[int(r["seed"])].append(r)
    return {seed: case_means(rs, rs[0]["algorithm"], metric) for seed, rs in by_seed.items() if rs}


def site_means(cases: dict) -> dict[str, float]:
    by_site: dict[str, list[float]] = defaultdict(list)
    for (site, _), v in cases.items():
        by_site[site].append(v)
    return {s: float(np.mean(v)) for s, v in by_site.items()}


def method_stats(rows: list[dict], runs: list[Finished], scored: str, regions: list[str]) -> dict:
    """Every number of one method on one federation (module docstring), without the tests against the reference."""
    dice_seeds = per_seed_cases(rows, "dice")
    surface_seeds = {m.name: per_seed_cases(rows, m.name) for m in TESTED_METRICS}  # {seed: {}} without its rows
    dice_cases = seed_averaged(dice_seeds)
    per_seed_sites = {seed: site_means(cases) for seed, cases in dice_seeds.items()}
    sites = sorted({s for m in per_seed_sites.values() for s in m}, key=_site_order(runs))
    entries = [fin.entry(scored) for fin in runs]
    return {
        "dice": mean_std(dice_cases.values()),
        **{name: mean_std(seed_averaged(seeds).values()) for name, seeds in surface_seeds.items()},
        "regions": {reg: mean_std(seed_averaged(per_seed_cases(rows, "dice", reg)).values()) for reg in regions},
        "client_avg": mean_std(float(np.mean(list(m.values()))) for m in per_seed_sites.values()),
        "sites": {s: mean_std(m.get(s, math.nan) for m in per_seed_sites.values()) for s in sites},
        "site_cases": {
            s: sum(1 for site, _ in dice_cases if site == s) for s in sites
        },  # what each site's mean averages
        "local_avg": seed_mean_std(runs, [e.get("local_avg", math.nan) for e in entries]),
        "local_gen": seed_mean_std(runs, [e.get("local_gen", math.nan) for e in entries]),
        "convergence": convergence_counts(entries),
        "cost": cost_means(entries, [len(fin.summary["sites"]) for fin in runs]),
        "cases": len(dice_cases),
        "train_samples": _mean_sizes(entries),
        "_seed_cases": dice_seeds,  # {seed: {(site, case): Dice}}: what the paired tests pair (add_tests)
        **{f"_seed_{name}": seeds for name, seeds in surface_seeds.items()},  # the same of HD95 and NSD
    }


def seed_mean_std(runs: list[Finished], values: list[float]) -> dict[str, float]:
    """One number per run (``values``, in ``runs``' order) as the per-site columns show theirs: per seed the mean
    over its folds (k-fold and leave-one-out benches), then ``mean_std`` over the seeds (not over folds × seeds,
    which would mix the folds' spread into the seeds'). Non-finite values are left out."""
    by_seed: dict[int, list[float]] = defaultdict(list)
    for fin, value in zip(runs, values, strict=True):
        if value is not None and math.isfinite(value):
            by_seed[fin.run.seed].append(float(value))
    return mean_std(float(np.mean(v)) for v in by_seed.values())


def _mean_sizes(entries: list[dict]) -> dict[str, float]:
    """Each site's training-set size, averaged over the runs that trained on it (summary.json train_samples)."""
    sizes: dict[str, list[float]] = defaultdict(list)
    for e in entries:
        for site, n in e.get("train_samples", {}).items():
            sizes[site].append(float(n))
    return {site: float(np.mean(v)) for site, v in sizes.items()}


def _site_order(runs: list[Finished]):
    """Sites in the federation's order (a leave-one-out federation: the order its sites are held out)."""
    held = list(dict.fromkeys(fin.run.holdout for fin in runs if fin.run.holdout is not None))
    order = {s: i for i, s in enumerate(held or (runs[0].summary["sites"] if runs else []))}
    return lambda s: (order.get(s, len(order)), s)


def convergence_counts(entries: list[dict]) -> dict:
    conv = [e.get("convergence", {}) for e in entries]
    stopped: dict[str, int] = defaultdict(int)
    for c in conv:
        if c.get("stopped"):
            stopped[c["stopped"]] += 1
    return {
        "runs": len(conv),
        "late_best": sum(1 for c in conv if c.get("late_best")),
        "not_converged": sum(1 for e in entries if recorded_not_converged(e)),
        "never_improved": sum(1 for c in conv if c.get("improved") is False),  # fedseg.run.stopping.improved
        "plateaued": sum(1 for c in conv if c.get("plateaued")),
        "stopped": dict(stopped),
        "rounds": mean_std(c.get("rounds", math.nan) for c in conv),
        "best_round": mean_std(c.get("best_round", math.nan) for c in conv),
    }


def cost_means(entries: list[dict], sites: list[int]) -> dict:
    costs = [e.get("cost", {}) for e in entries]
    out = {key: _mean(c.get(key, math.nan) for c in costs) for key in COST_KEYS}
    out["floats_per_site"] = _mean(c.get("floats", math.nan) / k for c, k in zip(costs, sites))
    out["eval_floats_per_site"] = _mean(c.get("eval_floats", math.nan) / k for c, k in zip(costs, sites))
    return out


def _mean(values: Iterable[float]) -> float:
    return mean_std(values)["mean"]


def final_setting(method: MethodSpec, runs: list[BenchRun]) -> tuple[str, list[str]]:
    """The setting label of ``method``'s final ``runs`` (sorted by fold) and its grid keys at an edge
    (:func:`fedseg.bench.select.edge_keys`, the selected grid values); where the folds took different settings
    (``tune.per_fold``), each fold's (``fold 0: lr=0.001; fold 1: lr=0.01``, a leave-one-out federation's by its
    held-out site) and the keys at an edge in any of them."""
    by_fold = {run.fold: run for run in runs}
    if len({run.setting_label for run in by_fold.values()}) == 1:
        return runs[0].setting_label, edge_keys(method, runs[0].setting)
    label = "; ".join(
        f"{'fold ' + str(fold) if run.holdout is None else 'holdout ' + run.holdout}: {run.setting_label}"
        for fold, run in by_fold.items()
    )
    return label, list(dict.fromkeys(key for run in by_fold.values() for key in edge_keys(method, run.setting)))


def federation_tables(bench: BenchSpec, runs: BenchRuns) -> tuple[dict, list[dict]]:
    """``{federation: {"sites": [...], "regions": [...], "methods": {method: stats}}}`` and the results rows."""
    by_key: dict[tuple[str, str], list[tuple[BenchRun, Finished]]] = defaultdict(list)
    for run, fin in runs.final.items():
        by_key[(run.federation, run.method)].append((run, fin))
    out: dict[str, dict] = {}
    all_rows: list[dict] = []
    for fed in bench.federations:
        methods: dict[str, dict] = {}
        regions: list[str] = []
        for method in bench.methods:
            pairs = sorted(by_key[(fed.name, method.name)], key=lambda p: (p[0].fold, p[0].seed))
            if not pairs:  # a bench collected while running: no final run of this method yet
                continue
            rows = [r for run, fin in pairs for r in method_rows(bench, run, fin)]
            if not rows:  # e.g. local on a leave-one-out federation: no model for an unseen site
                continue
            all_rows += rows
            regions = regions or list(pairs[0][1].summary["regions"])
            stats = method_stats(rows, [fin for _, fin in pairs], method.scored, regions)
            stats["setting"], stats["at_edge"] = final_setting(method, [run for run, _ in pairs])
            stats["routed_to_global"] = routed_runs(pairs, method.scored)
            stats["method_set"] = list(method.set)  # its own overrides (fedseg.bench.legend.own_set_note)
            if (weights := learned_weights([fin for _, fin in pairs], method.scored)) is not None:
                stats["learned_weights"] = weights
            methods[method.name] = stats
        if not methods:
            continue
        per_seed = {name: stats.pop("_seed_cases") for name, stats in methods.items()}
        alternative = bench.tests.alternative
        add_tests(methods, per_seed, bench.reference, alternative)
        for metric in TESTED_METRICS:
            scores = {name: stats.pop(f"_seed_{metric.name}") for name, stats in methods.items()}
            add_metric_tests(methods, scores, bench.reference, alternative, metric)
        first_method, first = next(iter(methods.items()))
        expected = len(folds_of(bench, fed, runs.holdouts)) * len(bench.seeds)  # final runs planned per method
        out[fed.name] = {
            "sites": list(first["sites"]),
            "regions": regions,
            "methods": methods,
            "runs": expected,
            "leave_one_out": fed.leave_one_out,
            "comparisons": [
                {"method": a, "against": b, **compare(per_seed[a], per_seed[b], alternative, with_cases=True)}
                for a, b in bench.comparisons
                if a in per_seed and b in per_seed
            ],
            "rank_stability": rank_stability(per_seed),
            "hd95_unit": by_key[(fed.name, first_method)][0][1].summary.get("hd95_unit", ""),
            "provenance": runs_provenance([fin for m in methods for _, fin in by_key[(fed.name, m)]]),
            "nsd_tolerance": by_key[(fed.name, first_method)][0][1].summary.get("nsd_tolerance"),  # in hd95_unit
            **{
                key: scored(key, [fin for m in methods for _, fin in by_key[(fed.name, m)]]) for key in RECORDED_SCORING
            },
        }
        correct_tests(out[fed.name])
    return out, all_rows


def learned_weights(runs: list[Finished], algorithm: str) -> dict[str, dict[str, float]] | None:
    """``{site: mean ± std}`` over ``runs`` of the aggregation weight alpha_k each site learned (``round_metrics.csv``
    of ``algorithm``, metric ``alpha``: Auto-FedAvg's, the mean over layer groups for its layer-wise variant) at each
    run's last round that recorded it; None when no run recorded one (a method that learns no weights)."""
    finals: list[dict[str, float]] = []
    for fin in runs:
        path = fin.dir / "round_metrics.csv"
        if not path.is_file():
            continue
        rows = [r for r in read_rows(path) if r.get("algorithm") == algorithm and r.get("metric") == "alpha"]
        if rows:
            last = max(int(r["round"]) for r in rows)
            finals.append({r["site"]: float(r["value"]) for r in rows if int(r["round"]) == last})
    if not finals:
        return None
    sites = list(dict.fromkeys(site for final in finals for site in final))
    return {site: mean_std(final[site] for final in finals if site in final) for site in sites}


PROVENANCE_KEYS = ("fedseg", "commit", "torch", "monai", "python", "device")


def runs_provenance(runs: list[Finished]) -> dict[str, list]:
    """What trained the federation's final runs (summary.json ``provenance``): each of :data:`PROVENANCE_KEYS`'s
    distinct values, sorted (several where runs of a resumed bench differ), and ``dirty``: whether any run came
    from a checkout with uncommitted changes ([true], [false] or both)."""
    provenances = [fin.summary.get("provenance") or {} for fin in runs]
    out: dict[str, list] = {
        key: sorted({str(p[key]) for p in provenances if p.get(key) is not None}) for key in PROVENANCE_KEYS
    }
    out["dirty"] = sorted({bool(p["dirty"]) for p in provenances if "dirty" in p})
    return out


def scored(key: str, runs: list[Finished]) -> str:
    """What the runs scored, by summary.json's ``key`` (``score_on``: eval.score_on, ``score_grid``: eval.score_grid;
    for a run of an older fedseg, which does not record it, what its recorded configuration says it did,
    ``config_load.with_recorded_scoring``): the one value, or ``mixed`` where the runs differ."""
    values = {fin.summary.get(key) or _recorded_eval(fin.dir).get(key, RECORDED_SCORING[key]) for fin in runs}
    return values.pop() if len(values) == 1 else "mixed"


def _recorded_eval(folder: Path) -> dict:
    """The ``eval`` section a finished bench run recorded (its done marker's config), older keys filled in as its
    run used them; ``{}`` where there is none to read."""
    try:
        recorded = json.loads((folder / DONE_FILE).read_text()).get("config", {})
    except (OSError, ValueError, AttributeError):
        return {}
    ev = with_recorded_scoring(recorded).get("eval") if isinstance(recorded, dict) else None
    return ev if isinstance(ev, dict) else {}


def correct_tests(fed: dict) -> None:
    """Holm-adjust (:func:`fedseg.evaluate.stats.correct_family`) each family of a federation's comparisons, the
    tests a reader scans together: the pooled Dice comparisons of every method against the reference (the test
    table's Δ column), the HD95 ones, the NSD ones, every cell of the per-site table, and the bench's
    ``comparisons``; then set each method's ``dagger``. Works on a ``tables.json`` entry read back too (a bench
    written before the correction)."""
    methods = fed["methods"].values()
    correct_family(s.get("wilcoxon") for s in methods)
    for metric in TESTED_METRICS:
        correct_family(s.get(f"{metric.name}_wilcoxon") for s in methods)
    correct_family(t for s in methods for t in (s.get("site_wilcoxon") or {}).values())
    correct_family(fed.get("comparisons") or [])
    for s in methods:
        s["dagger"] = significant_over_seeds(s.get("wilcoxon"))


def add_tests(methods: dict[str, dict], per_seed: dict[str, dict], reference: str, alternative: Alternative) -> None:
    """Paired comparisons (:func:`fedseg.evaluate.stats.compare`) of every method against ``reference``, pooled and
    per site (the site's cases only); none while the reference has no run (``dagger``: :func:`correct_tests`)."""
    for name, stats in methods.items():
        if name == reference or reference not in per_seed:
            stats.update(wilcoxon=None, dagger=False, site_wilcoxon={})
            continue
        ours, ref = per_seed[name], per_seed[reference]
        stats["wilcoxon"] = compare(ours, ref, alternative, with_cases=True)  # its p recomputable from tables.json
        stats["site_wilcoxon"] = {site: compare(_of_site(ours, site), ref, alternative) for site in stats["sites"]}


def _of_site(per_seed: dict[int, dict], site: str) -> dict[int, dict]:
    return {seed: {k: v for k, v in cases.items() if k[0] == site} for seed, cases in per_seed.items()}


def metric_alternative(alternative: Alternative, metric: Metric) -> Alternative:
    """The Wilcoxon alternative of ``metric``'s tests: ``tests.alternative`` is said of Dice (``greater``: the
    method scores higher, i.e. better); for a metric where lower is better (HD95) the better side is ``less``."""
    if metric.higher_is_better or alternative == "two-sided":
        return alternative
    return "less" if alternative == "greater" else "greater"


def add_metric_tests(
    methods: dict[str, dict], per_seed: dict[str, dict], reference: str, alternative: Alternative, metric: Metric
) -> None:
    """``<metric>_wilcoxon``: the pooled comparison (:func:`fedseg.evaluate.stats.compare`, with the case
    differences) of every method's ``metric`` against ``reference``'s (``per_seed``: ``{method: {seed: {(site,
    case): value}}}``), on the better side of :func:`metric_alternative`; None for the reference and where either
    has no values of ``metric``."""
    has = {name: any(cases for cases in seeds.values()) for name, seeds in per_seed.items()}
    side = metric_alternative(alternative, metric)
    for name, stats in methods.items():
        ok = name != reference and has.get(name) and has.get(reference)
        test = compare(per_seed[name], per_seed[reference], side, with_cases=True) if ok else None
        stats[f"{metric.name}_wilcoxon"] = test
