"""Report figures (PNG), drawn with matplotlib's object API on the Agg canvas.

No pyplot: figures are created with :class:`matplotlib.figure.Figure`, so rendering a
report never touches a GUI backend or global pyplot state. Every drawing function writes one
PNG and returns its path, or returns None when there is nothing to draw.

Like :mod:`fedseg.presentation.kit`, these are presentation primitives that know no method: a
method family's report module (e.g. :mod:`fedseg.algorithms.fedsm.report`) draws its own
figures with them (:func:`mean_per_round`, :func:`round_axes`, :func:`save`).
"""

from __future__ import annotations

import io
import math
from collections import defaultdict
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
from matplotlib.figure import Figure
from matplotlib.lines import Line2D

from fedseg.atomic_files import atomic_write_bytes
from fedseg.evaluate.metrics import batch_metrics

__all__ = [
    "LINE_STYLES",
    "PALETTE",
    "REGION_COLORS",
    "SERIES_COLORS",
    "series_color",
    "series_hatch",
    "series_style",
    "curve_with_selected_round",
    "legend_with_selected_round",
    "validation_curves",
    "cross_site_heatmap",
    "sites_by_size",
    "per_site_bars",
    "sample_grid",
    "display_image",
    "project_2d",
    "feature_map",
    "mean_per_round",
    "round_axes",
    "save",
    "loss_surface_figure",
]

DPI = 110
PALETTE_COLORS = 256  # colours of a chart's PNG (:func:`save`)
LINE_STYLES = ("-", "--", ":", "-.")
#: The Okabe–Ito colour-blind-safe palette: orange, sky blue, bluish green, yellow, blue,
#: vermillion, reddish purple, black. The one palette of every report figure.
PALETTE = ("#E69F00", "#56B4E9", "#009E73", "#F0E442", "#0072B2", "#D55E00", "#CC79A7", "#000000")
#: The palette's colours for series and regions: all but black, which is kept for reference lines
#: (means, baselines, "uniform") and would vanish as a contour on a dark MR background.
SERIES_COLORS = PALETTE[:-1]
#: Contour colours per region: sky blue, then yellow (opposite ends of the blue-yellow axis that every
#: common colour-vision deficiency keeps, and far apart in lightness), then bluish green and reddish
#: purple; orange and vermillion last, as they vanish on the orange/red fundus photographs. Every
#: contour is drawn over a dark halo (:data:`CONTOUR_HALO`), so it stands out on bright discs and on
#: dark MR/CT backgrounds alike.
REGION_COLORS = ("#56B4E9", "#F0E442", "#009E73", "#CC79A7", "#0072B2", "#D55E00", "#E69F00")
#: Line styles telling truth from prediction in the same panel, also in grey-scale print: the ground
#: truth dashed and thinner, a prediction solid.
TRUTH_STYLE = {"linestyles": "--", "linewidths": 1.1}
PREDICTION_STYLE = {"linestyles": "-", "linewidths": 1.6}
CONTOUR_HALO = "#1f2328"


def series_color(i: int) -> str:
    """The ``i``-th series colour (per site, per method, per region), cycling through
    :data:`SERIES_COLORS`; used instead of matplotlib's default ``C0``… cycle."""
    return SERIES_COLORS[i % len(SERIES_COLORS)]


def series_style(i: int) -> str:
    """Line style of the ``i``-th series: solid for the first round of :data:`SERIES_COLORS`, then the
    next of :data:`LINE_STYLES` each time the colours repeat (so series ``i`` and ``i + 7`` differ)."""
    return LINE_STYLES[(i // len(SERIES_COLORS)) % len(LINE_STYLES)]


def series_hatch(i: int) -> str:
    """Bar hatch of the ``i``-th series: none for the first round of :data:`SERIES_COLORS`, then a
    pattern each time the colours repeat."""
    return ("", "//", "..", "xx")[(i // len(SERIES_COLORS)) % 4]


def _region_color(i: int) -> str:
    return REGION_COLORS[i % len(REGION_COLORS)]


def save(fig: Figure, out: Path, exact_colors: bool = False) -> Path:
    """Write ``fig`` to ``out`` (PNG, white background, folders created; atomically: never half a file); returns
    ``out``.

    A chart (lines, bars, heatmaps, contours of a loss surface) is stored with a palette of at most
    :data:`PALETTE_COLORS` colours (Pillow's median cut, deterministic): it looks the same and takes about a third of
    the bytes of matplotlib's RGBA (the committed benchmark figures: 2.03 MB -> 0.72 MB), and every report embeds its
    figures. ``exact_colors``: full RGB, for panels that show images (:func:`sample_grid`: MR/CT grey levels and
    photographs would band)."""
    from PIL import Image

    rendered = io.BytesIO()
    fig.savefig(rendered, format="png", dpi=DPI, bbox_inches="tight", facecolor="white")
    image = Image.open(rendered).convert("RGB")
    if not exact_colors:
        image = image.quantize(PALETTE_COLORS, method=Image.Quantize.MEDIANCUT)
    atomic_write_bytes(out, lambda f: image.save(f, format="PNG", optimize=True, dpi=(DPI, DPI)))
    return out


def _float(x) -> float:
    """CSV cell -> float; blank -> NaN."""
    return math.nan if x is None or x == "" else float(x)


def mean_per_round(
    rows: Sequence[Mapping], key: str, by: str = "algorithm"
) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """``{row[by]: (rounds, mean of rows[key] over the other rows of that round)}`` ignoring NaN,
    rounds ascending (``by="algorithm"``: mean over sites; ``by="site"``: one series per site)."""
    acc: dict[str, dict[int, list[float]]] = defaultdict(lambda: defaultdict(list))
    for r in rows:
        v = _float(r.get(key))
        if not math.isnan(v):
            acc[r[by]][int(r["round"])].append(v)
    out = {}
    for group, by_round in acc.items():
        rounds = np.array(sorted(by_round))
        out[group] = (rounds, np.array([np.mean(by_round[k]) for k in rounds]))
    return out


def round_axes(ax, title: str, ylabel: str) -> None:
    """Title and labels of a per-round panel, light grid, integer round ticks."""
    ax.set(title=title, xlabel="round", ylabel=ylabel)
    ax.grid(alpha=0.3)
    ax.xaxis.get_major_locator().set_params(integer=True)


def validation_curves(
    rounds_rows: Sequence[Mapping],
    out: Path,
    algorithms: Sequence[str],
    labels: Mapping[str, str] | None = None,
    best_round: Mapping[str, int] | None = None,
) -> Path | None:
    """Validation Dice (mean over sites) and training loss (mean over sites) per round.

    Args:
        rounds_rows: ``rounds.csv`` rows (``algorithm, round, site, val_dice, train_loss``).
        out: PNG path.
        algorithms: algorithms to draw, in legend order (others are skipped).
        labels: display name per algorithm.
        best_round: optional selected round per algorithm, marked with a star.

    Returns:
        ``out``, or None when no algorithm has a validation value.
    """
    labels = labels or {}
    val = mean_per_round(rounds_rows, "val_dice")
    loss = mean_per_round(rounds_rows, "train_loss")
    algs = [a for a in algorithms if a in val or a in loss]
    if not any(a in val for a in algs):
        return None
    fig = Figure(figsize=(11, 3.8))
    ax_val, ax_loss = fig.subplots(1, 2)
    for i, alg in enumerate(algs):
        color, ls = series_color(i), series_style(i)
        label = labels.get(alg, alg)
        if alg in val:
            curve_with_selected_round(ax_val, *val[alg], color, label, (best_round or {}).get(alg), ls)
        if alg in loss:
            x, y = loss[alg]
            ax_loss.plot(x, y, marker="o", ms=3, lw=1.6, color=color, ls=ls, label=label)
    round_axes(ax_val, "Validation Dice (mean over sites)", "Dice")
    round_axes(ax_loss, "Training loss (mean over sites)", "loss")
    legend_with_selected_round(ax_val, bool(best_round))
    fig.tight_layout()
    return save(fig, out)


def curve_with_selected_round(ax, x, y, color: str, label: str, best: int | None, ls: str = "-") -> None:
    """A per-round curve with a star on the round selected on validation (``best``, if it is in ``x``)."""
    ax.plot(x, y, marker="o", ms=3, lw=1.6, color=color, ls=ls, label=label)
    if best is not None and best in x:
        ax.plot([best], [y[list(x).index(best)]], marker="*", ms=13, color=color, mec="black", mew=0.6)


def legend_with_selected_round(ax, starred: bool) -> None:
    """The axes' legend, with a "selected round" entry for the stars when any curve has one."""
    handles, names = ax.get_legend_handles_labels()
    if starred:
        handles.append(Line2D([], [], marker="*", ms=11, ls="", color="grey", mec="black", mew=0.6))
        names.append("selected round")
    ax.legend(handles, names, fontsize=8, loc="best")


def cross_site_heatmap(
    matrix: np.ndarray,
    sites: Sequence[str],
    out: Path,
    metric_label: str = "Dice",
    vmin: float = 0.0,
    vmax: float = 1.0,
    title: str | None = None,
    ylabel: str = "training site (local model)",
) -> Path:
    """Heatmap with numbers of per-site models across sites.

    Args:
        matrix: ``(model's site, test site)`` scores; NaN cells are left blank.
        sites: names for both axes.
        out: PNG path.
        metric_label: colour-bar label.
        vmin, vmax: colour range.
        title: axes title (e.g. the method's name), if any.
        ylabel: what a row is.
    """
    n = len(sites)
    size = max(3.6, 0.75 * n + 1.8)
    fig = Figure(figsize=(size + 0.8, size))
    ax = fig.subplots()
    im = ax.imshow(np.ma.masked_invalid(matrix), cmap="viridis", vmin=vmin, vmax=vmax)
    for i in range(n):
        for j in range(n):
            v = matrix[i, j]
            if np.isfinite(v):
                dark = (v - vmin) / max(vmax - vmin, 1e-12) > 0.6
                ax.text(
                    j,
                    i,
                    f"{v:.3f}",
                    ha="center",
                    va="center",
                    fontsize=9,
                    color="black" if dark else "white",
                    fontweight="bold" if i == j else "normal",
                )
    ax.set_xticks(range(n), sites, rotation=30, ha="right")
    ax.set_yticks(range(n), sites)
    ax.set_xlabel("test site")
    ax.set_ylabel(ylabel)
    if title:
        ax.set_title(title, fontsize=10)
    fig.colorbar(im, ax=ax, fraction=0.046, pad=0.04, label=metric_label)
    fig.tight_layout()
    return save(fig, out)


def sites_by_size(sites: Sequence[str], sizes: Mapping[str, float]) -> list[str]:
    """``sites`` by decreasing ``sizes`` (e.g. training cases), ties in the given order; sites without
    a size last, in the given order."""
    known = [s for s in sites if not math.isnan(_size(sizes, s))]
    return sorted(known, key=lambda s: -_size(sizes, s)) + [s for s in sites if s not in known]


def _size(sizes: Mapping[str, float], site: str) -> float:
    v = sizes.get(site)
    return math.nan if v is None or v == "" else float(v)


def per_site_bars(
    values: Mapping[str, Mapping[str, float]],
    sites: Sequence[str],
    sizes: Mapping[str, float],
    out: Path,
    references: Mapping[str, Mapping[str, float]] | None = None,
    ylabel: str = "test Dice",
    title: str | None = None,
    errors: Mapping[str, Mapping[str, float]] | None = None,
) -> Path | None:
    """Grouped bars of a per-site score, one bar per series at each site (the FeTS 2022 paper's
    Fig. 6), sites ordered by :func:`sites_by_size` and labelled with their size (``n=``), and
    reference series drawn as a short horizontal line across each site's group.

    Args:
        values: ``{series (e.g. method name): {site: score}}``, in legend order; coloured by
            :func:`series_color`; a NaN or missing score leaves a gap.
        sites: the sites to draw.
        sizes: ``{site: size}`` (e.g. training cases), for the order and the labels.
        out: PNG path.
        references: ``{name: {site: score}}``, drawn in black, one line style each
            (:data:`LINE_STYLES`), e.g. Centralized and FedAvg.
        ylabel, title: axis label and title.
        errors: ``{series: {site: half-height}}`` of an error bar on each bar (e.g. the std over seeds);
            NaN or missing: no bar.

    Returns:
        ``out``, or None when no series has a score.
    """
    references = references or {}
    order = sites_by_size(sites, sizes)
    scores = lambda series: np.array([_size(series, s) for s in order])  # noqa: E731 (NaN when missing)
    bars = {name: scores(v) for name, v in values.items()}
    refs = {name: scores(v) for name, v in references.items()}
    if not order or not any(np.isfinite(v).any() for v in bars.values()):
        return None
    n, k = len(order), max(len(bars), 1)
    group = 0.8  # width of a site's group of bars
    width = group / k
    fig = Figure(figsize=(min(18.0, max(6.0, 0.22 * n * k + 0.5 * n + 2.0)), 4.2))
    ax = fig.subplots()
    x = np.arange(n)
    for i, (name, y) in enumerate(bars.items()):
        yerr = scores((errors or {}).get(name, {}))
        ax.bar(
            x - group / 2 + (i + 0.5) * width,
            y,
            width * 0.92,
            yerr=np.where(np.isfinite(yerr), yerr, 0.0) if errors else None,
            error_kw={"elinewidth": 0.8, "capsize": 1.5, "ecolor": "#333333"},
            color=series_color(i),
            hatch=series_hatch(i),
            edgecolor="white",
            linewidth=0,
            label=name,
            zorder=2,
        )
    for j, (name, y) in enumerate(refs.items()):
        ls = LINE_STYLES[j % len(LINE_STYLES)]
        ok = np.isfinite(y)
        ax.hlines(
            y[ok],
            x[ok] - group / 2 - 0.04,
            x[ok] + group / 2 + 0.04,
            colors="black",
            linestyles=ls,  # type: ignore[arg-type]
            lw=1.8,
            zorder=3,
        )
        ax.plot([], [], color="black", ls=ls, lw=1.8, label=name)  # legend entry
    labels = [s if math.isnan(_size(sizes, s)) else f"{s}\nn={_fmt_size(_size(sizes, s))}" for s in order]
    ax.set_xticks(x, labels, fontsize=8, rotation=0 if n <= 12 else 90)
    ax.set_xlim(-0.6, n - 0.4)
    tops = [bars[name] + np.nan_to_num(scores((errors or {}).get(name, {}))) for name in bars]  # bar + its error
    top = max(float(np.nanmax(np.concatenate([*tops, *refs.values()]))), 0.0)
    ax.set_ylim(0.0, min(1.0, top * 1.12 + 0.02) if top <= 1.0 else top * 1.12)
    ax.set_ylabel(ylabel)
    sized = any(not math.isnan(_size(sizes, s)) for s in order)
    ax.set_xlabel("site (largest training set first)" if sized else "site")
    ax.grid(axis="y", alpha=0.3, zorder=0)
    if title:
        ax.set_title(title, fontsize=10)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
    fig.tight_layout()
    return save(fig, out)


def _fmt_size(v: float) -> str:
    """A size for a tick label: an integer without decimals, "?" when unknown."""
    return "?" if math.isnan(v) else f"{v:g}"


def display_image(image: np.ndarray) -> tuple[np.ndarray, str | None]:
    """``(C, H, W)`` image -> something ``imshow`` can draw, min-max scaled to [0, 1].

    3 channels are shown as RGB; otherwise the first channel in grey.

    Returns:
        ``(array (H, W) or (H, W, 3), colormap or None)``.
    """
    img = np.asarray(image, dtype=np.float64)
    if img.ndim == 2:
        img = img[None]
    img = img if img.shape[0] == 3 else img[:1]
    lo, hi = np.nanmin(img), np.nanmax(img)
    img = (img - lo) / (hi - lo) if hi > lo else np.zeros_like(img)
    return (np.transpose(img, (1, 2, 0)), None) if img.shape[0] == 3 else (img[0], "gray")


def _contours(ax, masks: np.ndarray | None, style: Mapping) -> None:
    """One contour per region mask ``(R, H, W)`` in the region's colour, over a dark halo."""
    from matplotlib import patheffects

    for r, m in enumerate(np.asarray(masks) if masks is not None else []):
        if m.any() and not m.all():
            cs = ax.contour(m.astype(float), levels=[0.5], colors=[_region_color(r)], **style)
            halo = [
                patheffects.Stroke(linewidth=style["linewidths"] + 1.2, foreground=CONTOUR_HALO),
                patheffects.Normal(),
            ]
            cs.set_path_effects(halo)


def _draw_panel(ax, image: np.ndarray, masks: np.ndarray | None, truth: np.ndarray | None = None) -> None:
    """Image with one coloured contour per region mask ``(R, H, W)``: ``masks`` solid (a prediction), ``truth``
    dashed (the ground truth; in a prediction panel, drawn under the prediction for comparison)."""
    img, cmap = display_image(image)
    ax.imshow(img, cmap=cmap, interpolation="nearest")
    _contours(ax, truth, TRUTH_STYLE)
    _contours(ax, masks, PREDICTION_STYLE)
    ax.set_xticks([])
    ax.set_yticks([])


def _sample_dice(sample: Mapping[str, np.ndarray]) -> float:
    """Dice (mean over regions) of a stored sample's prediction against its truth (its known voxels only where the
    truth holds a known-voxel channel, an ignore label's: ``batch_metrics``)."""
    dice = batch_metrics(np.asarray(sample["pred"])[None], np.asarray(sample["truth"])[None], hd95=False)["dice"]
    return float(dice.mean())


def _region_truth(sample: Mapping[str, np.ndarray]) -> np.ndarray:
    """A stored sample's truth as region masks, one per predicted channel: an ignore label's known-voxel channel
    (the truth's last, one more than the prediction's) is no region and is not drawn."""
    return np.asarray(sample["truth"])[: len(np.asarray(sample["pred"]))]


def sample_grid(
    samples: Mapping[str, Mapping[str, Mapping[str, np.ndarray]]],
    sites: Sequence[str],
    algorithms: Sequence[str],
    regions: Sequence[str],
    out: Path,
    labels: Mapping[str, str] | None = None,
) -> Path | None:
    """One row per site: image, ground truth, then each algorithm's prediction as contours.

    One colour per region (:data:`REGION_COLORS`); the ground truth dashed (also under each prediction, to compare),
    a prediction solid.

    Args:
        samples: ``{site: {algorithm: {"image" (C,H,W), "truth" (R,H,W), "pred" (R,H,W),
            "case"}}}`` as stored in ``samples/<algorithm>__<site>.npz`` (the truth of a federation with an ignore
            label holds the known voxels in one more, last channel: not drawn, no region).
        sites, algorithms: row and column order; missing entries give blank panels.
        regions: region names (legend; contour colour i = region i).
        out: PNG path.
        labels: display name per algorithm.

    Returns:
        ``out``, or None when there is no sample.
    """
    labels = labels or {}
    sites = [s for s in sites if samples.get(s)]
    algorithms = [a for a in algorithms if any(a in samples[s] for s in sites)]
    if not sites or not algorithms:
        return None
    ncol = 2 + len(algorithms)
    panel = 2.0
    fig = Figure(figsize=(panel * ncol, (panel + 0.25) * len(sites) + 0.7))
    axes = fig.subplots(len(sites), ncol, squeeze=False)
    headers = ["image", "ground truth"] + [labels.get(a, a) for a in algorithms]
    for j, h in enumerate(headers):
        axes[0, j].set_title(h, fontsize=10, fontweight="bold")
    for i, site in enumerate(sites):
        first = next(samples[site][a] for a in algorithms if a in samples[site])
        case = str(np.asarray(first.get("case", "")))
        _draw_panel(axes[i, 0], first["image"], None)
        _draw_panel(axes[i, 1], first["image"], None, truth=_region_truth(first))
        axes[i, 0].set_ylabel(f"{site}\n{case}", fontsize=9)
        for j, alg in enumerate(algorithms, start=2):
            s = samples[site].get(alg)
            if s is None:
                axes[i, j].axis("off")
                continue
            _draw_panel(axes[i, j], s["image"], s["pred"], truth=_region_truth(s))
            axes[i, j].set_xlabel(f"Dice {_sample_dice(s):.3f}", fontsize=9, labelpad=2)
    handles = [Line2D([], [], color=_region_color(r), lw=2.5) for r in range(len(regions))]
    handles += [
        Line2D([], [], color="#57606a", ls="--", lw=TRUTH_STYLE["linewidths"]),
        Line2D([], [], color="#57606a", ls="-", lw=PREDICTION_STYLE["linewidths"]),
    ]
    fig.legend(
        handles,
        [*regions, "ground truth (dashed)", "prediction (solid)"],
        loc="upper center",
        ncol=len(handles),
        fontsize=9,
        frameon=False,
        bbox_to_anchor=(0.5, 1.0),
    )
    fig.tight_layout(rect=(0, 0, 1, 1 - 0.3 / fig.get_figheight()), h_pad=0.4, w_pad=0.4)
    return save(fig, out, exact_colors=True)


EXACT_TSNE_MAX_POINTS = 600  # up to this many points the exact t-SNE is faster than Barnes-Hut (and exact)


def project_2d(features: np.ndarray, seed: int = 0) -> np.ndarray | None:
    """t-SNE (scikit-learn, PCA initialization, fixed seed) of ``(N, D)`` features -> ``(N, 2)``.

    Perplexity ``min(30, (N - 1) / 3)`` (sklearn needs it below N). The exact gradient up to
    ``EXACT_TSNE_MAX_POINTS`` points, Barnes-Hut above: on 2 cores the 113 test cases of ``demo`` took
    2.1 s with Barnes-Hut and 0.6 s exact, 300 random points 11.0 s and 6.4 s, 1,000 points 53 s and 76 s
    (sklearn 1.x; the report's slowest part). Returns None for fewer than 4 points, for features that are
    not all finite, and for identical points (e.g. a selector whose features are all zero; no meaningful
    neighbourhoods: sklearn would fail or, with Barnes-Hut, crash the process)."""
    from sklearn.manifold import TSNE  # imported here: only reports with feature maps need it

    x = np.asarray(features, dtype=np.float64)
    if len(x) < 4 or not np.isfinite(x).all() or (x == x[0]).all():
        return None
    perplexity = float(min(30.0, max(1.0, (len(x) - 1) / 3)))
    method = "exact" if len(x) <= EXACT_TSNE_MAX_POINTS else "barnes_hut"
    return TSNE(n_components=2, perplexity=perplexity, init="pca", random_state=seed, method=method).fit_transform(x)


def feature_map(
    maps: Mapping[str, tuple[np.ndarray, np.ndarray]],
    sites: Sequence[str],
    out: Path,
    labels: Mapping[str, str] | None = None,
    what: str = "features",
) -> Path | None:
    """2D maps of features coloured by site (e.g. the FedSM paper's Fig. 3), one panel per algorithm.

    Args:
        maps: ``{algorithm: (xy (N, 2), site name of every point (N,))}``.
        sites: site names in colour order.
        out: PNG path.
        labels: display name per algorithm.
        what: what the features are, for the panel titles ("<algorithm>: <what> (t-SNE)").

    Returns:
        ``out``, or None when ``maps`` is empty.
    """
    labels = labels or {}
    if not maps:
        return None
    fig = Figure(figsize=(4.6 * len(maps) + 1.4, 4.4))
    axes = fig.subplots(1, len(maps), squeeze=False)[0]
    for ax, (alg, (xy, site)) in zip(axes, maps.items()):
        size = float(np.clip(3000 / max(len(xy), 1), 6, 40))  # marker area: large for few points
        for i, name in enumerate(sites):
            pts = xy[np.asarray(site) == name]
            if len(pts):
                ax.scatter(
                    pts[:, 0], pts[:, 1], s=size, alpha=0.8, color=series_color(i), label=name, edgecolors="none"
                )
        ax.set_title(f"{labels.get(alg, alg)}: {what} (t-SNE)", fontsize=10)
        ax.set_xticks([])
        ax.set_yticks([])
    axes[-1].legend(fontsize=8, loc="center left", bbox_to_anchor=(1.02, 0.5), frameon=False, title="site")
    fig.tight_layout()
    return save(fig, out)


def loss_surface_figure(
    curves: Mapping[str, np.ndarray],
    ts: Sequence[float],
    out: Path,
    title: str,
    lines: Mapping[str, np.ndarray] | None = None,
    line_ts: Sequence[float] = (),
    ylabel: str = "training loss",
) -> Path | None:
    """A 1-D loss-surface figure in the style of FedSM's Figure 4 (``fedseg.evaluate.loss_surface``).

    Left panel: per series of ``curves`` (``{label: losses (directions, len(ts))}``) the mean over the directions
    against the step ``t`` with the min-max band of the directions. Right panel (when ``lines`` has any:
    ``{label: losses (len(line_ts),)}``): each interpolation line, with dotted verticals at ``t = 0`` and 1 (the
    two models). Writes ``out``; None when there is nothing to draw."""
    lines = lines or {}
    if not curves and not lines:
        return None
    panels = int(bool(curves)) + int(bool(lines))
    fig = Figure(figsize=(5.2 * panels, 4.0))
    axes = [fig.add_subplot(1, panels, k + 1) for k in range(panels)]
    if curves:
        ax = axes[0]
        x = np.asarray(ts, dtype=float)
        for i, (label, losses) in enumerate(curves.items()):
            losses = np.atleast_2d(np.asarray(losses, dtype=float))
            color = series_color(i)
            ax.fill_between(x, losses.min(axis=0), losses.max(axis=0), color=color, alpha=0.2, linewidth=0)
            ax.plot(x, losses.mean(axis=0), color=color, ls=series_style(i), lw=1.6, label=label)
        ax.set(title=f"{title}: random directions", xlabel="step t along a filter-normalized direction", ylabel=ylabel)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    if lines:
        ax = axes[-1]
        x = np.asarray(line_ts, dtype=float)
        for i, (label, losses) in enumerate(lines.items()):
            ax.plot(x, np.asarray(losses, dtype=float), color=series_color(i), ls=series_style(i), lw=1.6, label=label)
        for t in (0.0, 1.0):
            ax.axvline(t, color=PALETTE[-1], ls=":", lw=0.8)
        ax.set(title=f"{title}: global -> personalized", xlabel="t ((1 - t) global + t personalized)", ylabel=ylabel)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    return save(fig, out)
