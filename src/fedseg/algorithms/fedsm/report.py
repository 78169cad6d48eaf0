"""The FedSM family's sections of the run report (``Family.report_sections``, see :data:`family.FEDSM`).

:func:`sections` reads the run's files only (as the whole report does) and draws with the
report's presentation primitives (:mod:`fedseg.presentation.kit`, :mod:`fedseg.presentation.figures`):

* a note for the run report's "Validation Dice per round" section: what a FedSM curve shows;
* "Training curves per model": per-model curves of each family member from the
  ``val_dice_<model>`` / ``train_loss_<model>`` rows of ``round_metrics.csv`` (global,
  personalized models, selector) with the routed super model's validation Dice (``rounds.csv``);
* "Model selector (FedSM)": the selector's accuracy per site at the selected round
  (validation, ``round_metrics.csv``) and on the test images (``selector_features/<algorithm>.npz``,
  :mod:`fedseg.algorithms.fedsm.features`), its accuracy, routing and gamma per round, and a
  t-SNE map of its features on the test images coloured by site (paper Fig. 3).
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
from matplotlib.figure import Figure

from fedseg.algorithms.fedsm.features import FEATURES_DIR
from fedseg.presentation import figures
from fedseg.presentation.figures import LINE_STYLES, mean_per_round, round_axes, save, series_color
from fedseg.presentation.kit import RunFiles, Section, TableRow, esc, load_npz, nanmean, num, score_table

__all__ = ["sections", "selector_curves"]

SELECTOR_FIGURE, TSNE_FIGURE = "selector.png", "selector_tsne.png"
MODEL_CURVES = "curves_{}.png"  # per-model training curves of one algorithm
MODEL_LABELS = {"global": "global model", "personal": "personalized models", "selector": "selector"}
FEATURE_ARRAYS = {"features", "probs", "chosen", "site"}  # what a selector_features file must hold

VALIDATION_NOTE = (
    "FedSM family: the validation Dice of the routed super model; the training loss is the global "
    "model's (in the selector-only rounds of FedSM-extra/-ensemble: the selector's loss)."
)
CURVES_NOTE = (
    "Validation Dice (mean over sites) of each model a method trains and of the routed super model "
    "(star: the selected round); training loss per model. The selector's training loss is each site's loss on its "
    "own label (one class per site): it falls even while the selector cannot tell the sites apart; its accuracy on "
    "validation images (below) says whether it can."
)
SELECTOR_NOTE = (
    '<p class="note">Site columns: selector accuracy, the fraction of that site\'s images whose selector argmax '
    "is the site's own personalized model (Mean: over sites). Global model used: fraction of images Algorithm 2 "
    "routes to the global model (mean over sites; FedSM-extra/-ensemble: the argmax is the global model). "
    "γ: the threshold (– without one). Validation: <code>round_metrics.csv</code> at the selected round; "
    "test: <code>selector_features/</code>, the final super model.</p>"
)


def sections(run: RunFiles, algorithms: Sequence[str], fig_dir: Path) -> list[Section]:
    """The family's report sections for its ``algorithms`` of ``run`` (in table order); a section
    without anything to show has an empty body (left out of the page)."""
    features = {
        a: arrays for a, arrays in load_npz(run.dir / FEATURES_DIR, "*.npz", FEATURE_ARRAYS).items() if a in algorithms
    }
    return [
        Section("Validation Dice per round", None, VALIDATION_NOTE),  # a note for the run report's own section
        Section("Training curves per model", model_curves_section(run, algorithms, fig_dir), CURVES_NOTE),
        Section("Model selector (FedSM)", selector_section(run, algorithms, features, fig_dir)),
    ]


# --------------------------------------------------------------------------- per-model curves
def model_curves_section(run: RunFiles, algorithms: Sequence[str], fig_dir: Path) -> str | None:
    """Per-model training curves of each of ``algorithms`` whose ``round_metrics.csv`` has ``val_dice_<model>``
    or ``train_loss_<model>`` rows (global / personalized / selector), with the routed super model's
    validation Dice from ``rounds.csv``."""
    images = []
    for alg in algorithms:
        rows = [
            {"algorithm": r["metric"][len(key) + 1 :], "round": r["round"], "site": r["site"], key: r["value"]}
            for r in run.round_metrics
            for key in ("val_dice", "train_loss")
            if r["algorithm"] == alg and r["metric"].startswith(key + "_")
        ]
        if not rows:
            continue
        routed = f"{run.label(alg)} (routed)"
        rows += [
            {"algorithm": routed, "round": r["round"], "site": r["site"], "val_dice": r["val_dice"]}
            for r in run.rounds
            if r["algorithm"] == alg
        ]
        models: list[str] = [routed] + sorted({r["algorithm"] for r in rows} - {routed})
        names = {m: MODEL_LABELS.get(m, m) for m in models}
        best = {routed: int(num(run.algorithms[alg]["best_round"]))} if "best_round" in run.algorithms[alg] else None
        path = figures.validation_curves(rows, fig_dir / MODEL_CURVES.format(alg), models, names, best)
        if path is not None:
            images.append(f'<img src="figures/{path.name}" alt="{esc(run.label(alg))} training curves per model">')
    return "".join(images) or None


# --------------------------------------------------------------------------- the model selector
def _point_sites(run: RunFiles, arrays: Mapping[str, np.ndarray]) -> np.ndarray:
    """Site name of every row of a ``selector_features`` file ``(N,)``."""
    names = [str(x) for x in arrays["sites"]] if "sites" in arrays else run.sites
    return np.array(names)[np.asarray(arrays["site"], dtype=np.int64)]


def validation_selector_row(run: RunFiles, alg: str) -> TableRow | None:
    """``round_metrics.csv`` of ``alg`` at its selected round (the last round with rows if unknown)."""
    rows = [r for r in run.round_metrics if r["algorithm"] == alg]
    if not rows:
        return None
    best = num(run.algorithms.get(alg, {}).get("best_round"))
    rnd = int(best) if any(num(r["round"]) == best for r in rows) else max(int(num(r["round"])) for r in rows)
    at = [r for r in rows if int(num(r["round"])) == rnd]
    values = {r["site"]: num(r["value"]) for r in at if r["metric"] == "selector_acc"}
    values["mean"] = nanmean(values.values())
    values["global_frac"] = nanmean(r["value"] for r in at if r["metric"] == "global_frac")
    values["gamma"] = nanmean(r["value"] for r in at if r["metric"] == "gamma")
    return TableRow(f"{run.label(alg)}: validation, round {rnd}", values, False, alg)


def test_selector_row(run: RunFiles, alg: str, arrays: Mapping[str, np.ndarray] | None) -> TableRow | None:
    """Selector accuracy and routing on the test images, from ``selector_features/<alg>.npz`` (``arrays``).

    Accuracy of an image: the selector's argmax class is its own site's personalized model
    (class ``k`` of K for FedSM, ``k + 1`` of K+1 when class 0 is the global model)."""
    if arrays is None:
        return None
    names = _point_sites(run, arrays)
    probs, index = np.asarray(arrays["probs"]), np.asarray(arrays["site"])
    num_sites = len(arrays["sites"]) if "sites" in arrays else len(run.sites)
    correct = probs.argmax(axis=1) == index + (probs.shape[1] - num_sites)
    routed_global = np.asarray(arrays["chosen"]) == 0
    values = {site: float(correct[names == site].mean()) for site in np.unique(names)}
    values["mean"] = nanmean(values.values())
    values["global_frac"] = nanmean(routed_global[names == site].mean() for site in np.unique(names))
    values["gamma"] = num(arrays["gamma"]) if "gamma" in arrays else math.nan
    return TableRow(f"{run.label(alg)}: test", values, False, alg)


def selector_section(
    run: RunFiles,
    algorithms: Sequence[str],
    features: Mapping[str, Mapping[str, np.ndarray]],
    fig_dir: Path,
) -> str | None:
    """Table (selected round / test), accuracy and routing per round, t-SNE of the features, for the
    ``algorithms`` with a selector (``selector_acc`` rows per round or a ``features`` file)."""
    has = {r["algorithm"] for r in run.round_metrics if r.get("metric") == "selector_acc"} | set(features)
    algs = [a for a in algorithms if a in has]
    rows = [
        r
        for a in algs
        for r in (validation_selector_row(run, a), test_selector_row(run, a, features.get(a)))
        if r is not None
    ]
    if not rows:
        return None
    labels = {a: run.label(a) for a in algs}
    columns = [(s, s) for s in run.sites] + [("mean", "Mean"), ("global_frac", "Global model used"), ("gamma", "γ")]
    parts = [score_table(rows, columns, True, 3), SELECTOR_NOTE]
    if selector_curves(run.round_metrics, fig_dir / SELECTOR_FIGURE, algs, run.sites, labels):
        parts.append(
            f'<img src="figures/{SELECTOR_FIGURE}" alt="selector accuracy and routing per round">'
            '<p class="note">Per validated round. Left: selector accuracy per site (thin) and its mean '
            "(black). Right: fraction routed to the global model and the threshold γ chosen that round.</p>"
        )
    maps = {}
    for a in algs:
        arrays = features.get(a)
        xy = None if arrays is None else figures.project_2d(arrays["features"])
        if arrays is not None and xy is not None:
            maps[a] = (xy, _point_sites(run, arrays))
    if figures.feature_map(maps, run.sites, fig_dir / TSNE_FIGURE, labels, what="selector features"):
        parts.append(
            f'<img src="figures/{TSNE_FIGURE}" alt="t-SNE map of the selector features">'
            '<p class="note">t-SNE (scikit-learn, seed 0) of the selector\'s penultimate features on every '
            "test image, coloured by the site the image comes from (the selector never sees it): the FedSM "
            "paper's Figure 3. Sites whose points mix look alike to the selector.</p>"
        )
    return "".join(parts)


def selector_curves(
    metric_rows: Sequence[Mapping],
    out: Path,
    algorithms: Sequence[str],
    sites: Sequence[str],
    labels: Mapping[str, str] | None = None,
) -> Path | None:
    """FedSM's model selector per round, one row of two panels per algorithm.

    Left: validation selector accuracy (``selector_acc``) per site (thin) and its mean over sites
    (thick, black). Right: the fraction of validation images routed to the global model
    (``global_frac``, mean over sites) and the threshold ``gamma`` (if the algorithm has one).

    Args:
        metric_rows: ``round_metrics.csv`` rows (``algorithm, round, site, metric, value``).
        out: PNG path.
        algorithms: algorithms to draw, in order (those without ``selector_acc`` are skipped).
        sites: site order (line colours).
        labels: display name per algorithm.

    Returns:
        ``out``, or None when no algorithm has a ``selector_acc`` row.
    """
    labels = labels or {}
    by_alg: dict[str, dict[str, list[dict]]] = defaultdict(lambda: defaultdict(list))
    for r in metric_rows:  # long rows -> per algorithm and metric, "value" under the metric's name
        by_alg[r["algorithm"]][r["metric"]].append({**r, r["metric"]: r["value"]})
    algs = [a for a in algorithms if a in mean_per_round(by_alg.get(a, {}).get("selector_acc", []), "selector_acc")]
    if not algs:
        return None
    fig = Figure(figsize=(11, 3.4 * len(algs)))
    axes = fig.subplots(len(algs), 2, squeeze=False)
    for (ax_acc, ax_route), alg in zip(axes, algs):
        metrics = by_alg[alg]
        per_site = mean_per_round(metrics["selector_acc"], "selector_acc", by="site")
        for i, site in enumerate(sites):  # dash patterns keep overlapping sites visible
            if site in per_site:
                ax_acc.plot(
                    *per_site[site],
                    lw=1.3,
                    alpha=0.8,
                    color=series_color(i),
                    ls=LINE_STYLES[i % len(LINE_STYLES)],
                    marker="o",
                    ms=2.5,
                    label=site,
                )
        mean = mean_per_round(metrics["selector_acc"], "selector_acc")[alg]
        ax_acc.plot(*mean, lw=2.4, color="black", label="mean")
        name = labels.get(alg, alg)
        round_axes(ax_acc, f"{name}: selector accuracy (validation)", "own site chosen (fraction)")
        ax_acc.set_ylim(-0.03, 1.03)
        # beside the panel: the lines reach 0 and 1
        ax_acc.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.01, 0.5), frameon=False)
        for k, (metric, style) in enumerate((("global_frac", "-"), ("gamma", "--"))):
            series = mean_per_round(metrics.get(metric, []), metric).get(alg)
            if series is not None:
                text = "global model used (mean over sites)" if metric == "global_frac" else "threshold γ"
                ax_route.plot(*series, color=series_color(k), ls=style, marker="o", ms=3, lw=1.6, label=text)
        round_axes(ax_route, f"{name}: routing (validation)", "fraction / γ")
        ax_route.set_ylim(-0.03, 1.03)
        ax_route.legend(fontsize=7, loc="best")
    fig.tight_layout()
    return save(fig, out)
