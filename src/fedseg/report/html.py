"""The run report: one self-contained ``report.html`` plus PNGs in ``figures/``.

:func:`render_report` reads only the run's own files (DESIGN.md "Run outputs"):
``summary.json`` (required), and optionally ``results.csv``, ``rounds.csv``,
``round_metrics.csv``, ``ledger.csv``, ``samples/<algorithm>__<site>.npz``,
``selector_features/<algorithm>.npz`` and ``config.yaml``. Each missing optional file just
drops the sections that need it. The page uses no scripts and no network; figures are linked
relatively (``figures/*.png``).

Sections:

* test Dice and HD95 tables in the layout of the FedSM paper's Table 3: Centralized, one
  "Client k Local" row per site (the k-th site's local model on every site's test data) and
  Local's own-site row, FedAvg, the other federated methods, then the FedSM family; columns =
  sites, Client Avg, Global; best federated number per column bold;
* per-region mean +- std over test cases (FeTS Table 1 style);
* validation Dice and training loss per round (paper Fig. 2), per model for FedSM-family
  methods whose ``round_metrics.csv`` has ``val_dice_<model>`` / ``train_loss_<model>``;
* the model selector of FedSM-family methods: accuracy per site at the selected round
  (validation) and on the test images, its accuracy, routing and gamma per round, and a t-SNE
  map of its features on the test images coloured by site (paper Fig. 3);
* the local cross-site heatmap; example predictions;
* communication and compute totals from the ledger; the FeTS Table 2 cost table (summary.json
  ``cost``); the configuration.
"""

from __future__ import annotations

import csv
import html
import json
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from fedseg.engine.ledger import EVAL_ACTIONS
from fedseg.evaluate.selector_features import FEATURES_DIR
from fedseg.evaluate.tables import cross_site_matrix, own_site_model, read_rows, region_summary, site_summary
from fedseg.report import figures

__all__ = ["RunFiles", "load_run", "render_report", "BYTES_PER_FLOAT"]

BYTES_PER_FLOAT = 4
#: Algorithms that are baselines, not federated learning (never bold in the tables).
NON_FEDERATED = frozenset({"centralized", "local"})
DISPLAY_NAMES = {
    "centralized": "Centralized",
    "local": "Local",
    "fedavg": "FedAvg",
    "fedprox": "FedProx",
    "scaffold": "SCAFFOLD",
    "fedsm": "FedSM",
    "fedsm_extra": "FedSM-extra",
    "fedsm-extra": "FedSM-extra",
    "fedsm-ensemble": "FedSM-ensemble",
    "autofedavg": "Auto-FedAvg",
    "auto_fedavg": "Auto-FedAvg",
    "fedper": "FedPer",
    "ditto": "Ditto",
    "qfedavg": "q-FedAvg",
    "fedpidavg": "FedPIDAvg",
    "fednova": "FedNova",
    "fedadam": "FedAdam",
    "fedmedian": "FedMedian",
    "fedtrimmedavg": "FedTrimmedAvg",
    "fedavg-steps": "FedAvg (fixed steps)",
    "fedavg-uniform": "FedAvg (uniform)",
}
#: The FedSM family, last in the tables in this order (paper Table 3: ..., FedSM, FedSM-extra).
FEDSM_FAMILY = ("fedsm", "fedsm-extra", "fedsm-ensemble")
#: Figures this module writes (deleted before each render so none survives from an earlier one).
FIGURES = ("validation.png", "cross_site.png", "samples.png", "selector.png", "selector_tsne.png")
MODEL_CURVES = "curves_{}.png"  # per-model training curves of one algorithm
MODEL_LABELS = {"global": "global model", "personal": "personalized models", "selector": "selector"}


# --------------------------------------------------------------------------- loading
@dataclass
class RunFiles:
    """Everything the report reads from a run directory (optional parts empty if absent)."""

    dir: Path
    summary: dict
    results: list[dict] = field(default_factory=list)
    rounds: list[dict] = field(default_factory=list)
    ledger: list[dict] = field(default_factory=list)
    samples: dict[str, dict[str, dict[str, np.ndarray]]] = field(default_factory=dict)  # site -> algorithm -> arrays
    config: str | None = None
    round_metrics: list[dict] = field(default_factory=list)  # round_metrics.csv rows
    selector_features: dict[str, dict[str, np.ndarray]] = field(default_factory=dict)  # algorithm -> arrays

    @property
    def sites(self) -> list[str]:
        return list(self.summary.get("sites", []))

    @property
    def regions(self) -> list[str]:
        return list(self.summary.get("regions", []))

    @property
    def algorithms(self) -> dict[str, dict]:
        return self.summary.get("algorithms", {})


def _read_csv(path: Path) -> list[dict]:
    """CSV rows as dicts of strings; [] when the file does not exist."""
    if not path.is_file():
        return []
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def _load_npz(folder: Path, pattern: str, required: set[str]) -> dict[str, dict[str, np.ndarray]]:
    """``{file stem: arrays}`` of the ``.npz`` files in ``folder`` matching ``pattern`` that hold
    the ``required`` arrays; unreadable files are skipped (the report shows what it can)."""
    out = {}
    for path in sorted(folder.glob(pattern)) if folder.is_dir() else []:
        try:
            with np.load(path, allow_pickle=False) as z:
                arrays = {k: z[k] for k in z.files}
        except (OSError, ValueError):
            continue
        if required <= arrays.keys():
            out[path.stem] = arrays
    return out


def _load_samples(folder: Path) -> dict[str, dict[str, dict[str, np.ndarray]]]:
    """``samples/<algorithm>__<site>.npz`` -> ``{site: {algorithm: arrays}}``."""
    out: dict[str, dict[str, dict[str, np.ndarray]]] = {}
    for stem, arrays in _load_npz(folder, "*__*.npz", {"image", "truth", "pred"}).items():
        algorithm, _, site = stem.partition("__")
        out.setdefault(site, {})[algorithm] = arrays
    return out


def load_run(run_dir: str | Path) -> RunFiles:
    """Read a run directory. Raises FileNotFoundError when ``summary.json`` is missing."""
    run_dir = Path(run_dir)
    summary_path = run_dir / "summary.json"
    if not summary_path.is_file():
        raise FileNotFoundError(f"{summary_path} not found: is {run_dir} a fedseg run directory?")
    config = run_dir / "config.yaml"
    return RunFiles(
        dir=run_dir,
        summary=json.loads(summary_path.read_text()),
        results=read_rows(run_dir / "results.csv") if (run_dir / "results.csv").is_file() else [],
        rounds=_read_csv(run_dir / "rounds.csv"),
        ledger=_read_csv(run_dir / "ledger.csv"),
        samples=_load_samples(run_dir / "samples"),
        config=config.read_text() if config.is_file() else None,
        round_metrics=_read_csv(run_dir / "round_metrics.csv"),
        selector_features=_load_npz(run_dir / FEATURES_DIR, "*.npz", {"features", "probs", "chosen", "site"}),
    )


# --------------------------------------------------------------------------- helpers
def display_name(algorithm: str) -> str:
    return DISPLAY_NAMES.get(algorithm.lower(), algorithm)


def is_federated(name: str, entry: Mapping) -> bool:
    """Federated = not a baseline (centralized / local), unless the summary says otherwise."""
    return bool(entry.get("federated", name.lower() not in NON_FEDERATED))


def algorithm_order(summary: Mapping) -> list[str]:
    """Table order of the FedSM paper (Table 3): centralized-type baselines, local, FedAvg, the
    other federated methods (in the run's order), then FedSM, FedSM-extra, FedSM-ensemble."""
    algs = summary.get("algorithms", {})

    def rank(a: str) -> int:
        name = a.lower()
        if name == "local":
            return 1
        if not is_federated(a, algs[a]):
            return 0
        if name in FEDSM_FAMILY:
            return 4 + FEDSM_FAMILY.index(name)
        return 2 if name == "fedavg" else 3

    return sorted(algs, key=rank)  # stable: the run's order within a rank


def _num(x) -> float:
    """JSON / CSV number -> float (None, blank, non-numbers -> NaN)."""
    try:
        return math.nan if x is None or x == "" else float(x)
    except (TypeError, ValueError):
        return math.nan


def _fmt(x, digits: int) -> str:
    v = _num(x)
    return "–" if math.isnan(v) else f"{v:.{digits}f}"


def _fmt_int(x) -> str:
    v = _num(x)
    return "–" if math.isnan(v) else f"{int(round(v)):,}"


def _esc(x) -> str:
    return html.escape(str(x))


def _nanmean(xs) -> float:
    v = [x for x in (_num(x) for x in xs) if not math.isnan(x)]
    return float(np.mean(v)) if v else math.nan


def _metric_scalar(entry: Mapping, key: str, metric: str = "dice") -> float:
    """``entry[key]`` as a number, whether stored as a float or as ``{metric: float}``."""
    v = entry.get(key)
    return _num(v.get(metric) if isinstance(v, Mapping) else v)


# --------------------------------------------------------------------------- score tables
@dataclass
class TableRow:
    """One table row: a label, values per column key, and whether it competes for bold."""

    label: str
    values: dict[str, float]
    federated: bool
    group: str  # "baseline" | "local" | "federated": a rule is drawn between groups


def _cross_site_row(run: RunFiles, train: str, metric: str) -> dict[str, float] | None:
    """Site ``train``'s local model on every site (+ Client Avg, Global), or None if unknown.

    From ``results.csv`` when it has the rows (all columns, same code as summary.json),
    else from ``summary.json``'s ``cross_site`` (no Global: it needs the pooled cases).
    """
    sites = run.sites
    if run.results:
        model = f"local:{train}"
        row = site_summary(run.results, "local", metric, sites, model_filter=lambda r: r["model"] == model)
        if not all(math.isnan(row[s]) for s in sites):
            return row
    table = run.algorithms.get("local", {}).get("cross_site", {}).get(metric, {}).get(train)
    if not table:
        return None
    row = {s: _num(table.get(s)) for s in sites}
    row["client_avg"] = _nanmean(row[s] for s in sites)
    row["global"] = _num(table.get("global"))
    return row


def local_label(k: int, site: str) -> str:
    """Row label of the k-th site's (1-based) local model, as the paper's "Client k Local"."""
    return f"Client {k} Local ({site})"


def score_rows(run: RunFiles, metric: str) -> list[TableRow]:
    """Rows of the Dice / HD95 table: baselines, "Client k Local" rows + own-site local, federated."""
    rows = []
    for name in algorithm_order(run.summary):
        entry = run.algorithms[name]
        own = {k: _num(v) for k, v in entry.get(metric, {}).items()}
        if name.lower() == "local":
            for k, train in enumerate(run.sites, start=1):
                cross = _cross_site_row(run, train, metric)
                if cross is not None:
                    rows.append(TableRow(local_label(k, train), cross, False, "local"))
            rows.append(TableRow("Local (own site)", own, False, "local"))
        else:
            fed = is_federated(name, entry)
            rows.append(TableRow(display_name(name), own, fed, "federated" if fed else "baseline"))
    return rows


def _best(rows: Sequence[TableRow], key: str, higher_is_better: bool, fmt: Callable[[float], str]) -> set[str]:
    """Formatted best federated value(s) of a column (ties at display precision all win)."""
    vals = [r.values.get(key, math.nan) for r in rows if r.federated]
    vals = [v for v in vals if not math.isnan(v)]
    if not vals:
        return set()
    return {fmt(max(vals) if higher_is_better else min(vals))}


def score_table(
    rows: Sequence[TableRow],
    columns: Sequence[tuple[str, str]],
    higher_is_better: bool,
    digits: int,
) -> str:
    """HTML table of ``rows`` over ``columns`` (``(key, header)``), best federated value bold."""
    fmt = lambda v: _fmt(v, digits)  # noqa: E731
    best = {key: _best(rows, key, higher_is_better, fmt) for key, _ in columns}
    head = "".join(f"<th>{_esc(h)}</th>" for _, h in columns)
    body, prev_group = [], None
    for r in rows:
        cls = ' class="group"' if prev_group is not None and r.group != prev_group else ""
        prev_group = r.group
        cells = []
        for key, _ in columns:
            text = fmt(r.values.get(key, math.nan))
            bold = r.federated and text in best[key]
            cells.append(f"<td>{'<b>' + text + '</b>' if bold else text}</td>")
        body.append(f"<tr{cls}><th>{_esc(r.label)}</th>{''.join(cells)}</tr>")
    return _table(f"<tr><th>Method</th>{head}</tr>", body)


def _table(head_row: str, body_rows: Sequence[str]) -> str:
    """A score table (scrolls sideways inside the page when there are many sites)."""
    return (f'<div class="wide"><table class="scores"><thead>{head_row}</thead>'
            f'<tbody>{"".join(body_rows)}</tbody></table></div>')


def _site_columns(sites: Sequence[str]) -> list[tuple[str, str]]:
    return [(s, s) for s in sites] + [("client_avg", "Client Avg"), ("global", "Global")]


def region_table(run: RunFiles) -> str | None:
    """Per-region Dice and HD95, mean +- std over test cases (each algorithm's own models)."""
    if not run.results:
        return None
    regions = run.regions or sorted({r["region"] for r in run.results})
    head = "".join(f"<th>{_esc(g)} Dice</th>" for g in regions) + "".join(f"<th>{_esc(g)} HD95</th>" for g in regions)
    body = []
    for name in algorithm_order(run.summary):
        cells = []
        for metric, digits in (("dice", 3), ("hd95", 2)):
            stats = region_summary(run.results, name, metric, regions, model_filter=own_site_model)
            for g in regions:
                s = stats[g]
                text = "–" if s["n"] == 0 else f"{_fmt(s['mean'], digits)} ± {_fmt(s['std'], digits)}"
                cells.append(f"<td>{text}</td>")
        label = "Local (own site)" if name.lower() == "local" else display_name(name)
        body.append(f"<tr><th>{_esc(label)}</th>{''.join(cells)}</tr>")
    return _table(f"<tr><th>Method</th>{head}</tr>", body)


# --------------------------------------------------------------------------- ledger
def ledger_table(run: RunFiles) -> str | None:
    """Totals per algorithm: floats down/up/total (+ MB), SGD steps, seconds, rounds, best round.

    Floats and steps count training exchanges only (evaluation traffic excluded, as in
    ``summary.json``); seconds count all compute. ``summary.json`` numbers are shown;
    the down/up split comes from ``ledger.csv`` when present.
    """
    if not run.algorithms:
        return None
    split: dict[str, list[float]] = {}
    for r in run.ledger:
        if r.get("action") in EVAL_ACTIONS:
            continue
        acc = split.setdefault(r["algorithm"], [0.0, 0.0])
        acc[0] += np.nan_to_num(_num(r.get("floats_down")))
        acc[1] += np.nan_to_num(_num(r.get("floats_up")))
    head = ["Method", "Rounds", "Best round", "Floats down", "Floats up", "Floats sent", "MB sent", "SGD steps", "Seconds"]
    body = []
    for name in algorithm_order(run.summary):
        e = run.algorithms[name]
        down, up = split.get(name, (math.nan, math.nan))
        sent = _num(e.get("floats_sent"))
        if math.isnan(sent) and name in split:
            sent = down + up
        mb = sent * BYTES_PER_FLOAT / 1e6
        cells = [_fmt_int(e.get("rounds")), _fmt_int(e.get("best_round")), _fmt_int(down), _fmt_int(up),
                 _fmt_int(sent), _fmt(mb, 1), _fmt_int(e.get("sgd_steps")), _fmt(e.get("seconds"), 1)]
        body.append(f"<tr><th>{_esc(display_name(name))}</th>{''.join(f'<td>{c}</td>' for c in cells)}</tr>")
    return _table("<tr>" + "".join(f"<th>{h}</th>" for h in head) + "</tr>", body)


def cost_section(run: RunFiles) -> str | None:
    """FeTS Table 2 from each algorithm's ``cost`` object in summary.json (Eq. 34-38,
    :mod:`fedseg.evaluate.cost`), with a note on the timing and bandwidths used."""
    costs = {n: run.algorithms[n]["cost"] for n in algorithm_order(run.summary) if run.algorithms[n].get("cost")}
    if not costs:
        return None
    measured = any(c.get("timing") == "measured" for c in costs.values())
    head = ["Method", "Total SGD steps", "Total max. parallel SGD steps", "Forward-only batches",
            "Communicated floats", "Estimated training time (h)"] + (["t_batch (s)", "t_eval (s)"] if measured else [])
    body = []
    for name, c in costs.items():
        cells = [_fmt_int(c.get("sgd_steps")), _fmt_int(c.get("parallel_sgd_steps")), _fmt_int(c.get("forward_batches")),
                 _fmt_int(c.get("floats")), _fmt(c.get("simulated_hours"), 3)]
        if measured:
            cells += [_fmt(c.get("t_batch"), 4), _fmt(c.get("t_eval"), 4)]
        body.append(f"<tr><th>{_esc(display_name(name))}</th>{''.join(f'<td>{x}</td>' for x in cells)}</tr>")
    c = next(iter(costs.values()))
    timing = ("t_batch and t_eval measured from this run's ledger (per algorithm, columns on the right)" if measured else
              f"t_batch = {_fmt(c.get('t_batch'), 2)} s per training batch, t_forward = {_fmt(c.get('t_forward'), 2)} s, "
              f"t_eval = {_fmt(c.get('t_eval'), 2)} s per validation case (config <code>cost</code>; defaults: the "
              f"paper's V100 values)")
    note = (f"FeTS benchmark Table 2 (Eq. 34–38). SGD steps: sum over rounds and sites; max. parallel: sum over rounds of "
            f"the busiest site's steps. Forward-only batches (q-FedAvg's loss pass) are not SGD steps; they cost "
            f"t_forward each. Time: per round, the slowest site's steps × t_batch + forward batches × t_forward + "
            f"validation cases × t_eval + its floats down / up × {_esc(c.get('bytes_per_float', BYTES_PER_FLOAT))} bytes at "
            f"{_fmt(c.get('download_mb_s'), 1)} / {_fmt(c.get('upload_mb_s'), 1)} MB/s, summed over rounds; {timing}.")
    return _table("<tr>" + "".join(f"<th>{h}</th>" for h in head) + "</tr>", body) + f'<p class="note">{note}</p>'


# --------------------------------------------------------------------------- figures
def _local_matrix(run: RunFiles) -> np.ndarray | None:
    """Local cross-site Dice ``(train, test)`` from summary.json, else from results.csv."""
    sites = run.sites
    table = run.algorithms.get("local", {}).get("cross_site", {}).get("dice")
    if table:
        return np.array([[_num(table.get(a, {}).get(b)) for b in sites] for a in sites], dtype=np.float64)
    if run.results and any(r["model"].startswith("local:") for r in run.results):
        return cross_site_matrix(run.results, "dice", sites)
    return None


def cross_site_section(run: RunFiles, fig_dir: Path) -> str | None:
    """Heatmap of local models across sites with local avg (diagonal) / local gen (off-diagonal)."""
    m = _local_matrix(run)
    if m is None or not np.isfinite(m).any():
        return None
    figures.cross_site_heatmap(m, run.sites, fig_dir / "cross_site.png", "Dice")
    local = run.algorithms.get("local", {})
    off = ~np.eye(len(m), dtype=bool)
    avg = _metric_scalar(local, "local_avg")
    gen = _metric_scalar(local, "local_gen")
    avg = _nanmean(np.diag(m)) if math.isnan(avg) else avg
    gen = _nanmean(m[off]) if math.isnan(gen) else gen
    return (
        '<img src="figures/cross_site.png" alt="local cross-site Dice heatmap" class="square">'
        f'<p class="note"><b>Local avg</b> (diagonal: each site\'s model on its own test data) = {_fmt(avg, 4)}; '
        f"<b>Local gen</b> (off-diagonal: on the other sites' test data) = {_fmt(gen, 4)}.</p>"
    )


# --------------------------------------------------------------------------- FedSM: selector, per-model curves
def selector_algorithms(run: RunFiles) -> list[str]:
    """Algorithms with a model selector (``selector_acc`` per round or a features file), in table order."""
    has = {r["algorithm"] for r in run.round_metrics if r.get("metric") == "selector_acc"} | set(run.selector_features)
    return [a for a in algorithm_order(run.summary) if a in has]


def _point_sites(run: RunFiles, arrays: Mapping[str, np.ndarray]) -> np.ndarray:
    """Site name of every row of a ``selector_features`` file ``(N,)``."""
    names = [str(x) for x in arrays["sites"]] if "sites" in arrays else run.sites
    return np.array(names)[np.asarray(arrays["site"], dtype=np.int64)]


def _validation_selector_row(run: RunFiles, alg: str) -> TableRow | None:
    """``round_metrics.csv`` of ``alg`` at its selected round (the last round with rows if unknown)."""
    rows = [r for r in run.round_metrics if r["algorithm"] == alg]
    if not rows:
        return None
    best = _num(run.algorithms.get(alg, {}).get("best_round"))
    rnd = int(best) if any(_num(r["round"]) == best for r in rows) else max(int(_num(r["round"])) for r in rows)
    at = [r for r in rows if int(_num(r["round"])) == rnd]
    values = {r["site"]: _num(r["value"]) for r in at if r["metric"] == "selector_acc"}
    values["mean"] = _nanmean(values.values())
    values["global_frac"] = _nanmean(r["value"] for r in at if r["metric"] == "global_frac")
    values["gamma"] = _nanmean(r["value"] for r in at if r["metric"] == "gamma")
    return TableRow(f"{display_name(alg)}: validation, round {rnd}", values, False, alg)


def _test_selector_row(run: RunFiles, alg: str) -> TableRow | None:
    """Selector accuracy and routing on the test images, from ``selector_features/<alg>.npz``.

    Accuracy of an image: the selector's argmax class is its own site's personalized model
    (class ``k`` of K for FedSM, ``k + 1`` of K+1 when class 0 is the global model)."""
    arrays = run.selector_features.get(alg)
    if arrays is None:
        return None
    names = _point_sites(run, arrays)
    probs, index = np.asarray(arrays["probs"]), np.asarray(arrays["site"])
    num_sites = len(arrays["sites"]) if "sites" in arrays else len(run.sites)
    correct = probs.argmax(axis=1) == index + (probs.shape[1] - num_sites)
    routed_global = np.asarray(arrays["chosen"]) == 0
    values = {site: float(correct[names == site].mean()) for site in np.unique(names)}
    values["mean"] = _nanmean(values.values())
    values["global_frac"] = _nanmean(routed_global[names == site].mean() for site in np.unique(names))
    values["gamma"] = _num(arrays["gamma"]) if "gamma" in arrays else math.nan
    return TableRow(f"{display_name(alg)}: test", values, False, alg)


def selector_section(run: RunFiles, fig_dir: Path, labels: Mapping[str, str]) -> str | None:
    """Table (selected round / test), accuracy and routing per round, t-SNE of the features."""
    algs = selector_algorithms(run)
    rows = [r for a in algs for r in (_validation_selector_row(run, a), _test_selector_row(run, a)) if r is not None]
    if not rows:
        return None
    columns = [(s, s) for s in run.sites] + [("mean", "Mean"), ("global_frac", "Global model used"), ("gamma", "γ")]
    parts = [score_table(rows, columns, True, 3), (
        '<p class="note">Site columns: selector accuracy, the fraction of that site\'s images whose selector argmax '
        "is the site's own personalized model (Mean: over sites). Global model used: fraction of images Algorithm 2 "
        "routes to the global model (mean over sites; FedSM-extra/-ensemble: the argmax is the global model). "
        "γ: the threshold (– without one). Validation: <code>round_metrics.csv</code> at the selected round; "
        "test: <code>selector_features/</code>, the final super model.</p>")]
    if figures.selector_curves(run.round_metrics, fig_dir / "selector.png", algs, run.sites, labels):
        parts.append('<img src="figures/selector.png" alt="selector accuracy and routing per round">'
                     '<p class="note">Per validated round. Left: selector accuracy per site (thin) and its mean '
                     "(black). Right: fraction routed to the global model and the threshold γ chosen that round.</p>")
    maps = {}
    for a in algs:
        arrays = run.selector_features.get(a)
        xy = None if arrays is None else figures.project_2d(arrays["features"])
        if xy is not None:
            maps[a] = (xy, _point_sites(run, arrays))
    if figures.feature_map(maps, run.sites, fig_dir / "selector_tsne.png", labels):
        parts.append('<img src="figures/selector_tsne.png" alt="t-SNE map of the selector features">'
                     '<p class="note">t-SNE (scikit-learn, seed 0) of the selector\'s penultimate features on every '
                     "test image, coloured by the site the image comes from (the selector never sees it): the FedSM "
                     "paper's Figure 3. Sites whose points mix look alike to the selector.</p>")
    return "".join(parts)


def model_curves_section(run: RunFiles, fig_dir: Path) -> str | None:
    """Per-model training curves of each algorithm whose ``round_metrics.csv`` has ``val_dice_<model>``
    or ``train_loss_<model>`` rows (FedSM: global / personalized / selector), with the routed super
    model's validation Dice from ``rounds.csv``."""
    images = []
    for alg in algorithm_order(run.summary):
        rows = [{"algorithm": r["metric"][len(key) + 1:], "round": r["round"], "site": r["site"], key: r["value"]}
                for r in run.round_metrics for key in ("val_dice", "train_loss")
                if r["algorithm"] == alg and r["metric"].startswith(key + "_")]
        if not rows:
            continue
        routed = f"{display_name(alg)} (routed)"
        rows += [{"algorithm": routed, "round": r["round"], "site": r["site"], "val_dice": r["val_dice"]}
                 for r in run.rounds if r["algorithm"] == alg]
        models = [routed] + sorted({r["algorithm"] for r in rows} - {routed})
        names = {m: MODEL_LABELS.get(m, m) for m in models}
        best = {routed: int(_num(run.algorithms[alg]["best_round"]))} if "best_round" in run.algorithms[alg] else None
        path = figures.validation_curves(rows, fig_dir / MODEL_CURVES.format(alg), models, names, best)
        if path is not None:
            images.append(f'<img src="figures/{path.name}" alt="{_esc(display_name(alg))} training curves per model">')
    return "".join(images) or None


# --------------------------------------------------------------------------- page
CSS = """
body { font-family: -apple-system, "Segoe UI", Roboto, "Helvetica Neue", Arial, sans-serif; color: #1f2328;
       max-width: 1200px; margin: 24px auto; padding: 0 20px; line-height: 1.45; }
h1 { font-size: 1.6em; margin-bottom: 0.2em; }
h2 { font-size: 1.2em; margin-top: 2em; border-bottom: 1px solid #d0d7de; padding-bottom: 4px; }
.meta { color: #57606a; margin: 0.2em 0; }
.wide { overflow-x: auto; }
table.scores { border-collapse: collapse; margin: 10px 0 4px; font-size: 0.92em; font-variant-numeric: tabular-nums; }
table.scores th, table.scores td { padding: 4px 10px; border-bottom: 1px solid #eaeef2; text-align: right; white-space: nowrap; }
table.scores thead th { background: #f6f8fa; border-bottom: 2px solid #d0d7de; }
table.scores tbody th { text-align: left; font-weight: 600; }
table.scores thead th:first-child { text-align: left; }
table.scores tr.group th, table.scores tr.group td { border-top: 2px solid #d0d7de; }
table.scores b { color: #0a58ca; }
.note { color: #57606a; font-size: 0.88em; margin: 4px 0 0; max-width: 980px; }
img { max-width: 100%; height: auto; display: block; margin: 10px 0; }
img.square { max-width: 560px; }
details { margin-top: 2em; }
summary { cursor: pointer; font-weight: 600; }
pre { background: #f6f8fa; padding: 12px; overflow-x: auto; font-size: 0.85em; }
"""


def _section(title: str, body: str | None, note: str = "") -> str:
    if not body:
        return ""
    return f"<h2>{_esc(title)}</h2>{body}" + (f'<p class="note">{note}</p>' if note else "")


def _header(run: RunFiles) -> str:
    s = run.summary
    counts = {}
    for r in run.results:
        counts.setdefault(r["site"], set()).add(r["case"])
    sites = ", ".join(
        f"{_esc(x)} ({len(counts[x])})" if x in counts else _esc(x) for x in run.sites
    )
    algs = ", ".join(_esc(display_name(a)) for a in algorithm_order(s))
    return (
        f"<h1>fedseg report — {_esc(s.get('dataset', run.dir.name))}</h1>"
        f'<p class="meta">Run: <code>{_esc(run.dir.resolve().name)}</code></p>'
        f'<p class="meta">Sites{" (test cases)" if counts else ""}: {sites}</p>'
        f'<p class="meta">Regions: {_esc(", ".join(run.regions))} &nbsp;·&nbsp; Methods: {algs}</p>'
    )


def _score_sections(run: RunFiles) -> str:
    """Dice and HD95 tables (same renderer; higher vs lower is better)."""
    regions = ", ".join(run.regions) or "regions"
    common = (
        f"Per case: mean over regions ({_esc(regions)}); per site: mean over its test cases. "
        "Client Avg = mean of the site means; Global = mean over all test cases pooled. "
    ) + ("“Client <i>k</i> Local (<i>site</i>)”: the <i>k</i>-th site's locally trained model on every site's "
         "test data; “Local (own site)”: each site's own model on its own data. " if "local" in run.algorithms else "")
    out = []
    for metric, title, higher, digits, note in (
        ("dice", "Test Dice", True, 4, "Bold: best federated number per column (higher is better)."),
        ("hd95", "Test HD95 (pixels / voxels)", False, 2,
         "Bold: best federated number per column (lower is better). Cases with an empty predicted or true "
         "mask have no HD95 and are not counted."),
    ):
        rows = score_rows(run, metric)
        if any(not math.isnan(v) for r in rows for v in r.values.values()):  # e.g. no HD95 when eval.hd95 is off
            out.append(_section(title, score_table(rows, _site_columns(run.sites), higher, digits), common + note))
    return "".join(out)


def render_report(run_dir: str | Path) -> Path:
    """Write ``run_dir/report.html`` and ``run_dir/figures/*.png`` from the run's files.

    Returns:
        path of ``report.html``.
    """
    run = load_run(run_dir)
    fig_dir = run.dir / "figures"
    stale = [fig_dir / name for name in FIGURES] + list(fig_dir.glob(MODEL_CURVES.format("*")))
    for path in stale:  # no figure from an earlier render survives
        path.unlink(missing_ok=True)
    order = algorithm_order(run.summary)
    labels = {a: display_name(a) for a in order}

    curves = figures.validation_curves(
        run.rounds, fig_dir / "validation.png", order, labels,
        {a: int(e["best_round"]) for a, e in run.algorithms.items() if "best_round" in e},
    )
    samples = figures.sample_grid(run.samples, run.sites, order, run.regions, fig_dir / "samples.png", labels)

    parts = [
        _header(run),
        _score_sections(run),
        _section("Per-region scores (mean ± std over test cases)", region_table(run),
                 "Each method's own models (for Local: each site's model on its own site). "
                 "Std over cases (sample std); HD95 over cases where it is defined."),
        _section("Validation Dice per round", curves and '<img src="figures/validation.png" alt="validation curves">',
                 "Mean over sites of the validation Dice; the star marks the round selected on validation "
                 "(whose model is tested above)." + (
                     " FedSM family: the validation Dice of the routed super model; the training loss is the global "
                     "model's (in the selector-only rounds of FedSM-extra/-ensemble: the selector's loss)."
                     if any(a.lower() in FEDSM_FAMILY for a in order) else "")),
        _section("Training curves per model", model_curves_section(run, fig_dir),
                 "Validation Dice (mean over sites) of each model a method trains and of the routed super model "
                 "(star: the selected round); training loss per model."),
        _section("Model selector (FedSM)", selector_section(run, fig_dir, labels)),
        _section("Local training across sites", cross_site_section(run, fig_dir),
                 "Rows: the site a local model was trained on; columns: the site whose test data it is scored on."),
        _section("Example test predictions", samples and '<img src="figures/samples.png" alt="example predictions">',
                 "One test case per site; coloured contours, one colour per region. The Dice under each "
                 "prediction is for that single case. 3-channel images are shown as RGB, others by their "
                 "first channel; 3D cases by their middle slice."),
        _section("Communication and compute", ledger_table(run),
                 f"Floats and SGD steps count training exchanges (evaluation traffic excluded); "
                 f"MB = floats × {BYTES_PER_FLOAT} bytes / 10⁶. Seconds: all compute of the method."),
        _section("Cost (FeTS Table 2)", cost_section(run)),
    ]
    from fedseg.report.studies import study_sections  # here: report.studies imports this module

    parts += study_sections(run.dir)
    if run.config is not None:
        parts.append(f"<details><summary>config.yaml</summary><pre>{_esc(run.config)}</pre></details>")
    page = (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f"<title>fedseg report — {_esc(run.summary.get('dataset', ''))}</title>"
        f"<style>{CSS}</style></head><body>{''.join(parts)}</body></html>\n"
    )
    out = run.dir / "report.html"
    out.write_text(page, encoding="utf-8")
    return out
