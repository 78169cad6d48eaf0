"""The Auto-FedAvg family's sections of the run report (``Family.report_sections``, see
:data:`fedseg.algorithms.autofedavg.family.AUTOFEDAVG`): the paper's "Learning process" analysis
(Sec. 4.2.2, Fig. 3).

:func:`sections` reads the run's files only (as the whole report does) and draws with matplotlib
``Figure`` objects (no pyplot state) through the report's :func:`fedseg.presentation.figures.save`:

* "Aggregation weights α per round (Auto-FedAvg Fig. 3a)": one panel per Auto-FedAvg algorithm,
  α_k of every site over the validated rounds (``round_metrics.csv`` metric ``alpha``; layer-wise:
  the mean over layer groups), triangles at the rounds whose weights were learned (metric
  ``learned``), the uniform 1/K and, when ``summary.json`` holds the sites' training-set sizes
  (:data:`SAMPLES_KEY`, written by every run), FedAvg's n_k/n as reference lines; for a
  layer-wise variant also a heat map of the last round's α per layer group (metrics
  ``alpha@<group>``);
* "Validation Dice vs FedAvg (Auto-FedAvg Fig. 3b)": mean validation Dice over sites per round of
  each Auto-FedAvg algorithm and of ``fedavg`` / ``fedavg-uniform`` when they ran in the same run
  (``rounds.csv``); a note when neither did;
* "Learned Dirichlet distribution (Auto-FedAvg Fig. 3c)": Dir(β) of each network-wise Dirichlet
  variant at up to four validated rounds (first, two in between, last; metric ``beta``): for K = 3
  its density on the simplex (a triangular heat map, :func:`simplex_grid`,
  :func:`dirichlet_log_pdf`) with the merge point marked, otherwise every site's marginal
  Beta(β_k, Σβ − β_k);
* "Aggregation weights of the tested model (Auto-FedAvg)": α and β per site at the selected round
  (``summary.json`` ``best_round``), the weights the tested model was merged with.

The variant of an algorithm comes from ``summary.json`` (its ``parameterization``, written from the
registry entry; for an older file, its registered name ``autofedavg-<n|l>-<softmax|dirichlet>``,
:func:`is_dirichlet`) and its rows (layer-wise: ``alpha@<group>`` rows). ``t0`` is shown when
``config.yaml`` sets ``methods.<name>.t0``.
A section with nothing to show has no body (it is left out of the page); no file is required.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import numpy.typing as npt
import torch
from matplotlib.figure import Figure
from matplotlib.tri import Triangulation

from fedseg.algorithms.autofedavg.weights import merge_alpha
from fedseg.presentation.figures import (
    LINE_STYLES,
    curve_with_selected_round,
    legend_with_selected_round,
    mean_per_round,
    round_axes,
    save,
    series_color,
)
from fedseg.presentation.kit import RunFiles, Section, TableRow, esc, num, score_table

__all__ = [
    "SAMPLES_KEY",
    "SimplexGrid",
    "Weights",
    "beta_pdf",
    "dirichlet_log_pdf",
    "is_dirichlet",
    "load_weights",
    "merge_point",
    "sections",
    "simplex_grid",
]

ALPHA_FIGURE = "autofedavg_alpha.png"
LAYER_FIGURE = "autofedavg_layers_{}.png"  # per layer-wise algorithm
DICE_FIGURE = "autofedavg_dice.png"
DIRICHLET_FIGURE = "autofedavg_dirichlet_{}.png"  # per network-wise Dirichlet algorithm
BASELINES = ("fedavg", "fedavg-uniform")  # Fig. 3b's comparison, when they ran in the same run
#: Optional ``{site: training-set size}`` in summary.json (top level or an algorithm's entry): FedAvg's n_k/n.
SAMPLES_KEY = "train_samples"
SIMPLEX_DIVISIONS = 60  # the K = 3 density is drawn on SIMPLEX_DIVISIONS² triangles
MAX_DISTRIBUTION_ROUNDS = 4  # first, two in between, last (the paper shows rounds 0, 30, 50, 300)
ANNOTATE_CELLS = 200  # heat-map cells up to which each cell shows its number

ALPHA_TITLE = "Aggregation weights α per round (Auto-FedAvg Fig. 3a)"
DICE_TITLE = "Validation Dice vs FedAvg (Auto-FedAvg Fig. 3b)"
DIRICHLET_TITLE = "Learned Dirichlet distribution (Auto-FedAvg Fig. 3c)"
TABLE_TITLE = "Aggregation weights of the tested model (Auto-FedAvg)"

ALPHA_NOTE = (
    "α<sub>k</sub>: the weight of site <i>k</i>'s local model in that round's merge "
    "w = Σ<sub>k</sub> α<sub>k</sub> w<sub>k</sub>, per validated round (<code>round_metrics.csv</code>); "
    "layer-wise variants: the mean of α<sub>k,p</sub> over the layer groups <i>p</i> (heat map: each group's own "
    "α at the last validated round). Grey triangles along the round axis: rounds whose weights were "
    "learned (LearnAggWeight, every t<sub>0</sub>-th round); in the others the last learned weights are reused. "
    "Dotted black: uniform 1/K; faint lines (when the run records the training-set sizes): FedAvg's "
    "n<sub>k</sub>/n."
)
DICE_NOTE = (
    "Mean over sites of the validation Dice per round (<code>rounds.csv</code>); dashed: the FedAvg baselines of "
    "the same run. Star: the round selected on validation (whose model is tested)."
)
DIRICHLET_NOTE = (
    "Network-wise Dirichlet variants: the distribution Dir(β) the sites sample α from while learning, at the "
    "first, two intermediate and the last validated round (β from <code>round_metrics.csv</code>). Three sites: "
    "its density on the simplex (corner <i>k</i>: all weight on site <i>k</i>; brighter = denser, each panel "
    "scaled to its own maximum); otherwise each site's marginal Beta(β<sub>k</sub>, Σβ − β<sub>k</sub>). The "
    "merge does not sample: it uses the mode (β<sub>k</sub> − 1)/(Σβ − K) when every β<sub>k</sub> &gt; 1, else "
    "the mean β<sub>k</sub>/Σβ (star / vertical lines). A larger Σβ: a more concentrated distribution, more "
    "certain weights."
)
TABLE_NOTE = (
    "α and β per site at each algorithm's selected round (the weights its tested model was merged with); "
    "layer-wise variants: the mean over the layer groups. Softmax variants: α = softmax(β); Dirichlet "
    "variants: α = the mode (β<sub>k</sub> − 1)/(Σβ − K) of Dir(β) when every β<sub>k</sub> &gt; 1, else the "
    "mean β<sub>k</sub>/Σβ."
)


# --------------------------------------------------------------------------- the rows
@dataclass
class Weights:
    """One algorithm's aggregation weights per validated round, from ``round_metrics.csv``.

    Arrays hold NaN where a value is missing; sites are columns (``sites`` order)."""

    rounds: np.ndarray  # (R,) validated rounds, ascending
    sites: list[str]  # K
    alpha: np.ndarray  # (R, K) metric "alpha"
    beta: np.ndarray  # (R, K) metric "beta"
    learned: np.ndarray  # (R,) bool, metric "learned"
    groups: list[str]  # layer groups in file order ([]: network-wise)
    alpha_groups: np.ndarray  # (R, G, K) metrics "alpha@<group>"
    beta_groups: np.ndarray  # (R, G, K) metrics "beta@<group>"

    @property
    def layer_wise(self) -> bool:
        return bool(self.groups)


def is_dirichlet(algorithm: str, entry: Mapping | None = None) -> bool:
    """Whether ``algorithm`` is a Dirichlet variant: its summary.json ``entry`` says so
    (``parameterization``), else its registered name (``autofedavg-*-dirichlet``)."""
    if entry and "parameterization" in entry:
        return entry["parameterization"] == "dirichlet"
    return "dirichlet" in algorithm.lower()


def load_weights(run: RunFiles, algorithm: str) -> Weights | None:
    """The ``alpha`` / ``beta`` / ``learned`` (and ``alpha@`` / ``beta@``) rows of ``algorithm``; None
    when it has no ``alpha`` row."""
    rows = [r for r in run.round_metrics if r.get("algorithm") == algorithm]
    values: dict[tuple[str, str, int], float] = {}
    groups: dict[str, None] = {}
    row_sites: dict[str, None] = {}
    for r in rows:
        metric, rnd = str(r.get("metric", "")), num(r.get("round"))
        base, _, group = metric.partition("@")
        if base not in ("alpha", "beta", "learned") or math.isnan(rnd) or (group and base == "learned"):
            continue
        site = str(r.get("site", ""))
        row_sites[site] = None
        if group:
            groups[group] = None
        values[(metric, site, int(rnd))] = num(r.get("value"))
    if not any(m == "alpha" for m, _, _ in values):
        return None
    sites = [s for s in run.sites if s in row_sites] + [s for s in row_sites if s not in run.sites]
    rounds = np.array(sorted({rnd for m, _, rnd in values if m != "learned"}), dtype=np.int64)

    def grid(metric: str) -> np.ndarray:
        return np.array([[values.get((metric, s, int(t)), math.nan) for s in sites] for t in rounds]).reshape(
            len(rounds), len(sites)
        )

    learned = grid("learned")
    names = list(groups)
    shape = (len(rounds), len(names), len(sites))
    return Weights(
        rounds=rounds,
        sites=sites,
        alpha=grid("alpha"),
        beta=grid("beta"),
        learned=np.nan_to_num(learned, nan=0.0).max(axis=1, initial=0.0) > 0.5,
        groups=names,
        alpha_groups=np.stack([grid(f"alpha@{g}") for g in names], axis=1) if names else np.zeros(shape),
        beta_groups=np.stack([grid(f"beta@{g}") for g in names], axis=1) if names else np.zeros(shape),
    )


def sample_shares(run: RunFiles, algorithm: str, sites: Sequence[str]) -> dict[str, float] | None:
    """FedAvg's weights n_k/n from summary.json's :data:`SAMPLES_KEY` (the algorithm's entry, else the
    top level); None when it is absent or does not cover every site with a positive size."""
    counts = run.algorithms.get(algorithm, {}).get(SAMPLES_KEY) or run.summary.get(SAMPLES_KEY)
    if not isinstance(counts, Mapping):
        return None
    n = {s: num(counts.get(s)) for s in sites}
    if not n or any(math.isnan(v) or v <= 0 for v in n.values()):
        return None
    total = sum(n.values())
    return {s: v / total for s, v in n.items()}


def method_options(run: RunFiles, algorithm: str) -> dict:
    """``methods.<algorithm>`` of the run's ``config.yaml`` ({} when absent or unreadable)."""
    methods = run.settings.get("methods")
    options = methods.get(algorithm) if isinstance(methods, dict) else None
    return options if isinstance(options, dict) else {}


def _title(run: RunFiles, algorithm: str) -> str:
    """Display name, with ``t0`` when the config sets it."""
    t0 = method_options(run, algorithm).get("t0")
    return run.label(algorithm) + (f" (t₀ = {t0})" if t0 is not None else "")


def _img(name: str, alt: str, square: bool = False) -> str:
    cls = ' class="square"' if square else ""
    return f'<img src="figures/{esc(name)}" alt="{esc(alt)}"{cls}>'


# --------------------------------------------------------------------------- the sections
def sections(run: RunFiles, algorithms: Sequence[str], fig_dir: Path) -> list[Section]:
    """The family's report sections for its ``algorithms`` of ``run`` (in table order); a section
    without anything to show has an empty body (left out of the page)."""
    weights = {a: w for a in algorithms if (w := load_weights(run, a)) is not None}
    return [
        Section(ALPHA_TITLE, alpha_section(run, weights, fig_dir), ALPHA_NOTE),
        Section(DICE_TITLE, dice_section(run, algorithms, fig_dir), DICE_NOTE),
        Section(DIRICHLET_TITLE, dirichlet_section(run, weights, fig_dir), DIRICHLET_NOTE),
        Section(TABLE_TITLE, weights_table(run, weights), TABLE_NOTE),
    ]


# --------------------------------------------------------------------------- Fig. 3a
def alpha_section(run: RunFiles, weights: Mapping[str, Weights], fig_dir: Path) -> str | None:
    """α per round of every algorithm with ``alpha`` rows, then each layer-wise one's heat map."""
    drawn = {a: w for a, w in weights.items() if np.isfinite(w.alpha).any()}
    if not drawn:
        return None
    titles = {a: _title(run, a) for a in drawn}
    shares = {a: sample_shares(run, a, w.sites) for a, w in drawn.items()}
    parts = []
    if alpha_curves(drawn, fig_dir / ALPHA_FIGURE, titles, shares) is not None:
        parts.append(_img(ALPHA_FIGURE, "aggregation weights per round"))
    for a, w in drawn.items():
        name = LAYER_FIGURE.format(a)
        if w.layer_wise and layer_heatmap(w, fig_dir / name, titles[a]) is not None:
            parts.append(_img(name, f"{run.label(a)}: aggregation weights per layer group"))
    return "".join(parts) or None


def alpha_curves(
    weights: Mapping[str, Weights],
    out: Path,
    titles: Mapping[str, str],
    shares: Mapping[str, Mapping[str, float] | None],
) -> Path | None:
    """One panel per algorithm: α_k per site over the rounds (colour and dash per site), ticks at the
    learned rounds, the uniform 1/K (dotted black) and n_k/n (faint, per site) when ``shares`` has them."""
    if not weights:
        return None
    fig = Figure(figsize=(11, 3.3 * len(weights)))
    axes = fig.subplots(len(weights), 1, squeeze=False)[:, 0]
    for ax, (alg, w) in zip(axes, weights.items()):
        for i, site in enumerate(w.sites):
            ok = np.isfinite(w.alpha[:, i])
            color, style = series_color(i), LINE_STYLES[i % len(LINE_STYLES)]
            ax.plot(w.rounds[ok], w.alpha[ok, i], color=color, ls=style, lw=1.5, marker="o", ms=2.5, label=site)
            share = (shares.get(alg) or {}).get(site)
            if share is not None:
                ax.axhline(share, color=color, lw=1.0, alpha=0.45, ls=(0, (1, 2)))
        ax.axhline(1 / max(len(w.sites), 1), color="black", lw=1.0, ls=":", label="uniform 1/K")
        if shares.get(alg):
            ax.plot([], [], color="grey", lw=1.0, alpha=0.6, ls=(0, (1, 2)), label="n_k / n (FedAvg)")
        learned = w.rounds[w.learned]
        if len(learned):  # small triangles along the bottom edge (axes coordinates vertically)
            ax.plot(
                learned,
                np.full(len(learned), 0.03),
                transform=ax.get_xaxis_transform(),
                ls="",
                marker="^",
                ms=4.5,
                color="0.35",
                label="weights learned",
            )
        round_axes(ax, f"{titles.get(alg, alg)}: aggregation weights α", "α (merge weight)")
        ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.01, 0.5), frameon=False)
    fig.tight_layout()
    return save(fig, out)


def layer_heatmap(w: Weights, out: Path, title: str) -> Path | None:
    """α per layer group (rows, in the model's order) and site (columns) at the last round that has them."""
    have = [i for i in range(len(w.rounds)) if np.isfinite(w.alpha_groups[i]).any()]
    if not w.layer_wise or not have:
        return None
    last = have[-1]
    matrix = w.alpha_groups[last]  # (G, K)
    n_groups, n_sites = matrix.shape
    fig = Figure(figsize=(max(4.5, 1.0 * n_sites + 4.0), max(3.0, 0.24 * n_groups + 1.4)))
    ax = fig.subplots()
    vmax = float(np.nanmax(matrix)) if np.isfinite(matrix).any() else 1.0
    im = ax.imshow(np.ma.masked_invalid(matrix), cmap="viridis", vmin=0.0, vmax=max(vmax, 1e-12), aspect="auto")
    if matrix.size <= ANNOTATE_CELLS:
        for g in range(n_groups):
            for k in range(n_sites):
                v = matrix[g, k]
                if np.isfinite(v):
                    color = "black" if v / max(vmax, 1e-12) > 0.6 else "white"
                    ax.text(k, g, f"{v:.2f}", ha="center", va="center", fontsize=6.5, color=color)
    ax.set_xticks(range(n_sites), w.sites, rotation=30, ha="right")
    ax.set_yticks(range(n_groups), w.groups, fontsize=7)
    ax.set_xlabel("site")
    ax.set_ylabel("layer group (model order)")
    ax.set_title(f"{title}: α per layer group, round {int(w.rounds[last])}", fontsize=10)
    fig.colorbar(im, ax=ax, fraction=0.046, pad=0.04, label="α")
    fig.tight_layout()
    return save(fig, out)


# --------------------------------------------------------------------------- Fig. 3b
def dice_section(run: RunFiles, algorithms: Sequence[str], fig_dir: Path) -> str | None:
    """Validation Dice per round of the Auto-FedAvg ``algorithms`` and the FedAvg baselines of the run."""
    val = mean_per_round(run.rounds, "val_dice")
    ours = [a for a in algorithms if a in val]
    if not ours:
        return None
    baselines = [b for b in BASELINES if b in val]
    if not baselines:
        return (
            '<p class="note">No FedAvg baseline (<code>fedavg</code> or <code>fedavg-uniform</code>) ran in this '
            "run: add one to <code>algorithms</code> to compare the validation curves (the run report's "
            "validation figure above shows the Auto-FedAvg curves).</p>"
        )
    best = {a: int(num(run.algorithms[a]["best_round"])) for a in [*ours, *baselines] if _has_best(run, a)}
    fig = Figure(figsize=(8.5, 3.8))
    ax = fig.subplots()
    lines = [(a, series_color(i), "-") for i, a in enumerate(ours)]
    lines += [(b, ("black", "0.45")[j % 2], "--") for j, b in enumerate(baselines)]
    for alg, color, style in lines:
        curve_with_selected_round(ax, *val[alg], color, run.label(alg), best.get(alg), ls=style)
    round_axes(ax, "Validation Dice (mean over sites)", "Dice")
    legend_with_selected_round(ax, bool(best))
    fig.tight_layout()
    save(fig, fig_dir / DICE_FIGURE)
    return _img(DICE_FIGURE, "validation Dice of Auto-FedAvg and FedAvg per round")


def _has_best(run: RunFiles, algorithm: str) -> bool:
    return not math.isnan(num(run.algorithms.get(algorithm, {}).get("best_round")))


# --------------------------------------------------------------------------- Fig. 3c
@dataclass(frozen=True)
class SimplexGrid:
    """A regular subdivision of the 2-simplex {α ∈ R³: α_k ≥ 0, Σα = 1} into ``n²`` equal triangles.

    ``vertices`` ``(V, 3)`` and ``centroids`` ``(n², 3)`` are barycentric (rows sum to 1; centroids
    lie strictly inside); ``triangles`` ``(n², 3)`` index ``vertices``; ``cell_area``: the area of
    one triangle in the coordinates (α_1, α_2) in which a Dirichlet density is a density (the
    simplex has area 1/2 there), so ``Σ pdf(centroids) * cell_area`` integrates over the simplex
    (midpoint rule)."""

    vertices: np.ndarray
    triangles: np.ndarray
    centroids: np.ndarray
    cell_area: float

    def xy(self, points: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Barycentric ``(M, 3)`` -> the plane of an equilateral triangle: site 1 at (0, 0), site 2
        at (1, 0), site 3 at (1/2, √3/2)."""
        p = np.asarray(points, dtype=np.float64)
        return p[:, 1] + 0.5 * p[:, 2], p[:, 2] * math.sqrt(3) / 2


def simplex_grid(n: int) -> SimplexGrid:
    """The 2-simplex cut into ``n²`` equal triangles: ``n`` divisions per edge (``n >= 1``)."""
    if n < 1:
        raise ValueError(f"simplex_grid needs n >= 1, got {n}")
    index: dict[tuple[int, int], int] = {}
    vertices: list[tuple[float, float, float]] = []
    for i in range(n + 1):
        for j in range(n + 1 - i):
            index[(i, j)] = len(vertices)
            vertices.append((i / n, j / n, (n - i - j) / n))
    triangles: list[tuple[int, int, int]] = []
    for i in range(n):
        for j in range(n - i):
            triangles.append((index[(i, j)], index[(i + 1, j)], index[(i, j + 1)]))  # pointing one way
            if i + j <= n - 2:
                triangles.append((index[(i + 1, j)], index[(i + 1, j + 1)], index[(i, j + 1)]))  # the other way
    v, t = np.array(vertices, dtype=np.float64), np.array(triangles, dtype=np.int64)
    return SimplexGrid(v, t, v[t].mean(axis=1), 0.5 / n**2)


def dirichlet_log_pdf(points: npt.ArrayLike, beta: npt.ArrayLike) -> np.ndarray:
    """log Dir(α | β) (paper Eq. 5) of every row α of ``points`` ``(M, K)`` (inside the simplex:
    every α_k > 0); ``beta``: K positive concentrations."""
    b = np.asarray(beta, dtype=np.float64)
    log_norm = math.lgamma(float(b.sum())) - sum(math.lgamma(float(x)) for x in b)
    return log_norm + (np.log(np.asarray(points, dtype=np.float64)) * (b - 1.0)).sum(axis=1)


def beta_pdf(x: np.ndarray, a: float, b: float) -> np.ndarray:
    """Density of Beta(a, b) at ``x`` in (0, 1): the marginal of α_k under Dir(β) is Beta(β_k, Σβ − β_k)."""
    x = np.asarray(x, dtype=np.float64)
    log_norm = math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b)
    return np.exp(log_norm + (a - 1.0) * np.log(x) + (b - 1.0) * np.log1p(-x))


def merge_point(beta: npt.ArrayLike) -> tuple[np.ndarray, str]:
    """The α a Dirichlet variant merges with: the mode (β_k − 1)/(Σβ − K) (Eq. 6) when every β_k > 1,
    else the mean β_k/Σβ; with which of the two it is (``"mode"`` | ``"mean"``)."""
    b = np.asarray(beta, dtype=np.float64)
    alpha = merge_alpha(torch.from_numpy(b)[None], "dirichlet")[0].numpy()
    return alpha, "mode" if (b > 1).all() else "mean"


def distribution_rounds(w: Weights) -> list[int]:
    """Rows of ``w`` whose β is a valid concentration (every β_k finite and > 0): the first, the last
    and evenly spaced ones in between, :data:`MAX_DISTRIBUTION_ROUNDS` at most."""
    ok = [i for i in range(len(w.rounds)) if np.isfinite(w.beta[i]).all() and (w.beta[i] > 0).all()]
    if not ok:
        return []
    picks = np.linspace(0, len(ok) - 1, min(MAX_DISTRIBUTION_ROUNDS, len(ok))).round().astype(int)
    return [ok[p] for p in dict.fromkeys(picks.tolist())]


def dirichlet_section(run: RunFiles, weights: Mapping[str, Weights], fig_dir: Path) -> str | None:
    """Dir(β) at a few rounds of every network-wise Dirichlet algorithm with ``beta`` rows."""
    parts = []
    for alg, w in weights.items():
        if not is_dirichlet(alg, run.algorithms.get(alg)) or w.layer_wise or len(w.sites) < 2:
            continue
        name = DIRICHLET_FIGURE.format(alg)
        if dirichlet_figure(w, fig_dir / name, _title(run, alg)) is not None:
            parts.append(_img(name, f"{run.label(alg)}: learned Dirichlet distribution"))
    return "".join(parts) or None


def dirichlet_figure(w: Weights, out: Path, title: str) -> Path | None:
    """One panel per round of :func:`distribution_rounds`: the K = 3 density on the simplex, else the
    marginal Beta densities per site; the merge point marked."""
    picks = distribution_rounds(w)
    if not picks or len(w.sites) < 2:
        return None
    simplex = len(w.sites) == 3
    fig = Figure(figsize=(3.6 * len(picks) + 0.6, 3.9 if simplex else 3.4))
    axes = fig.subplots(1, len(picks), squeeze=False)[0]
    for ax, i in zip(axes, picks):
        beta = w.beta[i]
        label = f"round {int(w.rounds[i])}\nβ = ({', '.join(f'{b:.2f}' for b in beta)})"
        if simplex:
            _simplex_panel(ax, beta, w.sites)
        else:
            _marginal_panel(ax, beta, w.sites)
        ax.set_title(label, fontsize=9)
    axes[-1].legend(fontsize=7, loc="center left", bbox_to_anchor=(1.02, 0.5), frameon=False)
    fig.suptitle(f"{title}: Dir(β)", fontsize=10)
    fig.tight_layout()
    return save(fig, out)


def _simplex_panel(ax, beta: np.ndarray, sites: Sequence[str]) -> None:
    grid = simplex_grid(SIMPLEX_DIVISIONS)
    density = np.exp(dirichlet_log_pdf(grid.centroids, beta))
    x, y = grid.xy(grid.vertices)
    ax.tripcolor(Triangulation(x, y, grid.triangles), facecolors=density, cmap="viridis", shading="flat")
    point, kind = merge_point(beta)
    px, py = grid.xy(point[None])
    ax.plot(px, py, marker="*", ms=13, color="white", mec="black", mew=0.8, ls="", label=f"merge α ({kind})")
    corners = ((0.0, 0.0, "right", "top"), (1.0, 0.0, "left", "top"), (0.5, math.sqrt(3) / 2, "center", "bottom"))
    for (cx, cy, ha, va), site in zip(corners, sites):
        ax.text(cx, cy, site, ha=ha, va=va, fontsize=8)
    ax.set_aspect("equal")
    ax.set_xlim(-0.12, 1.12)
    ax.set_ylim(-0.1, math.sqrt(3) / 2 + 0.1)
    ax.axis("off")


def _marginal_panel(ax, beta: np.ndarray, sites: Sequence[str]) -> None:
    x = np.linspace(1e-3, 1 - 1e-3, 500)
    total = float(beta.sum())
    point, kind = merge_point(beta)
    for k, site in enumerate(sites):
        color = series_color(k)
        ax.plot(x, beta_pdf(x, float(beta[k]), total - float(beta[k])), color=color, lw=1.5, label=site)
        ax.axvline(point[k], color=color, lw=0.9, ls=":")
    ax.plot([], [], color="grey", lw=0.9, ls=":", label=f"merge α ({kind})")
    ax.set(xlabel="α_k", ylabel="density", xlim=(0, 1))
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)


# --------------------------------------------------------------------------- table
def selected_index(run: RunFiles, algorithm: str, w: Weights) -> int | None:
    """Row of the selected round (summary.json ``best_round``), else of the latest round before it,
    else the last row with α; None without any α."""
    rows = [i for i in range(len(w.rounds)) if np.isfinite(w.alpha[i]).any()]
    if not rows:
        return None
    best = num(run.algorithms.get(algorithm, {}).get("best_round"))
    if math.isnan(best):
        return rows[-1]
    before = [i for i in rows if w.rounds[i] <= best]
    return before[-1] if before else rows[-1]


def weights_table(run: RunFiles, weights: Mapping[str, Weights]) -> str | None:
    """α and β per site (columns) of every algorithm at its selected round."""
    rows, notes = [], []
    sites = list(dict.fromkeys(s for w in weights.values() for s in w.sites))
    for alg, w in weights.items():
        i = selected_index(run, alg, w)
        if i is None:
            continue
        rnd = int(w.rounds[i])
        best = num(run.algorithms.get(alg, {}).get("best_round"))
        which = "selected round" if rnd == best else "last round with weights"
        label = run.label(alg)
        rows.append(TableRow(f"{label}: α, {which} {rnd}", dict(zip(w.sites, w.alpha[i])), False, alg))
        if np.isfinite(w.beta[i]).any():
            rows.append(TableRow(f"{label}: β, {which} {rnd}", dict(zip(w.sites, w.beta[i])), False, alg))
        learned = int(w.learned.sum())
        t0 = method_options(run, alg).get("t0")
        notes.append(
            f"{esc(label)}: weights learned in {learned} of {len(w.rounds)} validated rounds"
            + (f" (t<sub>0</sub> = {esc(t0)})" if t0 is not None else "")
        )
    if not rows:
        return None
    return score_table(rows, [(s, s) for s in sites], True, 3) + f'<p class="note">{"; ".join(notes)}.</p>'
