"""``fedseg loss-surface``: FedSM's Figure 4 (Xu et al., CVPR 2022, Sec. 4.2) from finished run folders, no
retraining.

For one site k and the trained models of one or more runs (``RUN/model/<algorithm>/``, ``fedseg.run.bundles``),
the models that concern site k: every ``global`` model (FedAvg and relatives, centralized, FedSM's global model),
``local:<k>`` (local training) and ``personal:<k>`` (FedSM's personalized model). For each of them the loss along
filter-normalized random directions (what the paper's Figure 4 plots), and for each bundle with both ``global`` and
``personal:<k>`` the loss along the line from the global to the personalized model (the tracker's reading of the
figure); the numerics, the loss (the run's ``train.loss`` on site k's **training** split, eval mode) and the
normalization are in ``fedseg.evaluate.loss_surface``.

Each run's own ``config.yaml`` rebuilds its federation, splits and preprocessing exactly as the run did
(``fedseg.run.federation_splits``; ``model.name: planned``: with the run's recorded ``plan.json``). 2D runs on the
whole-image path only: a 3D run or one that trained on patches is refused with one line.

Writes ``OUT/loss_surface_<site>.csv`` (columns ``model, run, site, direction, t, loss``; ``model`` is
``<algorithm>/<model>``, ``direction`` is ``1..n`` for the random directions and ``line`` for the global ->
personalized line, whose ``model`` is ``<algorithm>/global->personal:<site>``) and ``OUT/loss_surface_<site>.png``
(``fedseg.presentation.figures.loss_surface_figure``).
"""

from __future__ import annotations

import csv
import io
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from fedseg.atomic_files import atomic_write_text
from fedseg.config import RunConfig
from fedseg.config_load import load_config
from fedseg.data.dataset import CaseSet, build_site_data
from fedseg.evaluate.loss_surface import DIRECTION_TS, LINE_TS, direction_losses, line_losses
from fedseg.presentation.figures import loss_surface_figure
from fedseg.run.bundles import Bundle, load_bundle, run_bundles
from fedseg.train import segmentation_loss

COLUMNS = ["model", "run", "site", "direction", "t", "loss"]
MODEL_PREFIXES = ("local:", "personal:")  # + "global": the models a site uses


@dataclass
class SiteModels:
    """One run's models for one site: ``bundles`` ``{algorithm: Bundle}`` and the training data ``train``
    with the run's loss config ``cfg``."""

    run: Path
    cfg: RunConfig
    train: CaseSet
    bundles: dict[str, Bundle]

    def names(self, algorithm: str, site: str) -> list[str]:
        """The models of ``algorithm``'s bundle that concern ``site``: ``global``, ``local:<site>``,
        ``personal:<site>`` (in that order, those present)."""
        models = self.bundles[algorithm].models
        return [n for n in ("global", *(p + site for p in MODEL_PREFIXES)) if n in models]


def run_config(run: Path) -> RunConfig:
    """The configuration recorded in ``run/config.yaml``."""
    if not (run / "config.yaml").is_file():
        raise ValueError(f"{run}: no config.yaml (not a fedseg run directory?)")
    return load_config(file=run / "config.yaml")


def site_training_data(run: Path, cfg: RunConfig, site: str) -> tuple[RunConfig, CaseSet]:
    """``site``'s training split, preprocessed as the run did, and the config the run trained under (with the
    plan applied for ``model.name: planned``)."""
    from fedseg.run import federation_splits

    fed, splits, _ = federation_splits(cfg, None)
    if site not in fed.site_names:
        raise ValueError(f"{run}: no site {site!r} (sites: {', '.join(fed.site_names)})")
    if fed.spatial_dims != 2:
        raise ValueError(f"{run}: a {fed.spatial_dims}D run; the loss surface supports 2D runs only")
    if cfg.model.name == "planned":
        import json

        from fedseg.plan.federated import PlannedRun
        from fedseg.plan.planner import apply_plan
        from fedseg.run import PLAN_FILE

        if not (run / PLAN_FILE).is_file():
            raise ValueError(f"{run}: model.name is planned but {PLAN_FILE} is missing")
        cfg = apply_plan(cfg, PlannedRun.from_dict(json.loads((run / PLAN_FILE).read_text())).plan)
    if cfg.data.volume.patch_size is not None:
        raise ValueError(f"{run}: trained on patches (data.volume.patch_size); the loss surface needs whole images")
    index = fed.site_names.index(site)
    data = build_site_data(fed, fed.sites[index], index, splits[site], cfg.data, originals=False)
    return cfg, data.train


def open_run(run: Path, site: str) -> SiteModels:
    """A finished run's bundles and ``site``'s training data; a ValueError naming the run otherwise."""
    run = Path(run)
    if not run.is_dir():  # missing, a file, or a link that leads nowhere (a loop)
        what = "not a folder" if run.exists() else "does not exist"
        raise ValueError(f"{run}: {what} (expected a finished run's folder)")
    folders = run_bundles(run)
    if not folders:
        raise ValueError(f"{run}: no trained models (expected RUN/model/<algorithm>/ of a finished run)")
    bundles = {f.name: load_bundle(f) for f in folders}
    if any(b.kind != "2d" for b in bundles.values()):
        raise ValueError(f"{run}: a 3D run; the loss surface supports 2D runs only")
    cfg, train = site_training_data(run, run_config(run), site)
    models = SiteModels(run, cfg, train, bundles)
    if not any(models.names(a, site) for a in bundles):
        raise ValueError(f"{run}: no model for site {site!r} (models: global, local:<site>, personal:<site>)")
    return models


def compute(
    runs: list[Path],
    site: str,
    directions: int = 10,
    ts: tuple[float, ...] = DIRECTION_TS,
    line_ts: tuple[float, ...] = LINE_TS,
    seed: int = 0,
    device: str = "cpu",
    cases: int | None = None,
) -> list[dict]:
    """The CSV rows (module doc) of every model of ``runs`` that concerns ``site``; ``cases``: the loss on that
    many of the site's training cases (:func:`case_sample`) instead of all of them."""
    if directions < 1:
        raise ValueError(f"--directions {directions}: must be at least 1")
    if cases is not None and cases < 1:
        raise ValueError(f"--cases {cases}: must be at least 1")
    opened = [open_run(Path(r), site) for r in runs]  # every run checked before any work
    if len({Path(r).resolve() for r in runs}) != len(runs):
        raise ValueError("a run is given twice")
    if cases is not None:
        for m in opened:
            m.train = case_sample(m.train, cases, seed)
    dev = torch.device(device)
    rows: list[dict] = []
    for m in opened:
        loss_fn = segmentation_loss(m.cfg.train)
        batch = m.cfg.train.batch_size
        for algorithm, bundle in m.bundles.items():
            network = bundle.new_segmenter()
            names = m.names(algorithm, site)
            for name in names:
                losses = direction_losses(
                    network, bundle.models[name], m.train, loss_fn, dev, batch, directions, ts, seed
                )
                rows += [
                    _row(f"{algorithm}/{name}", m.run, site, str(j + 1), t, losses[j, i])
                    for j in range(directions)
                    for i, t in enumerate(ts)
                ]
            if "global" in names and f"personal:{site}" in names:
                w = bundle.models
                line = line_losses(network, w["global"], w[f"personal:{site}"], m.train, loss_fn, dev, batch, line_ts)
                label = f"{algorithm}/global->personal:{site}"
                rows += [_row(label, m.run, site, "line", t, line[i]) for i, t in enumerate(line_ts)]
    return rows


def case_sample(train: CaseSet, cases: int, seed: int) -> CaseSet:
    """``cases`` of ``train``'s cases drawn without replacement by ``seed`` (in their order; all of them when
    there are no more): every model of a run, every direction and the line see the same cases. The loss of
    each point costs a pass over the cases, ``21 * directions`` passes per model and 13 per line (``DIRECTION_TS``,
    ``LINE_TS``), so a large site's curves are drawn on a sample."""
    if cases >= len(train):
        return train
    generator = torch.Generator().manual_seed(seed)
    idx = torch.randperm(len(train), generator=generator)[:cases].sort().values
    return train.subset(idx)


def _row(model: str, run: Path, site: str, direction: str, t: float, loss: float) -> dict:
    return {"model": model, "run": str(run), "site": site, "direction": direction, "t": t, "loss": float(loss)}


def write_csv(rows: list[dict], path: Path) -> Path:
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=COLUMNS, lineterminator="\n")
    writer.writeheader()
    writer.writerows({**r, "t": f"{r['t']:.6g}", "loss": repr(r["loss"])} for r in rows)
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, buf.getvalue())
    return path


def figure(rows: list[dict], site: str, path: Path) -> Path | None:
    """The figure of ``rows``: a series per (run, model); the run's folder name prefixes the label when the
    rows come from several runs."""
    several = len({r["run"] for r in rows}) > 1
    label = lambda r: f"{Path(r['run']).name}: {r['model']}" if several else r["model"]  # noqa: E731
    curves: dict[str, dict[str, dict[float, float]]] = {}
    lines: dict[str, dict[float, float]] = {}
    for r in rows:
        if r["direction"] == "line":
            lines.setdefault(label(r), {})[r["t"]] = r["loss"]
        else:
            curves.setdefault(label(r), {}).setdefault(r["direction"], {})[r["t"]] = r["loss"]
    ts = sorted({r["t"] for r in rows if r["direction"] != "line"})
    line_ts = sorted({r["t"] for r in rows if r["direction"] == "line"})
    arrays = {k: np.array([[d[t] for t in ts] for d in by_dir.values()]) for k, by_dir in curves.items()}
    line_arrays = {k: np.array([v[t] for t in line_ts]) for k, v in lines.items()}
    return loss_surface_figure(arrays, ts, path, site, line_arrays, line_ts)


def loss_surface(
    runs: list[Path],
    site: str,
    out: Path,
    directions: int = 10,
    seed: int = 0,
    device: str = "cpu",
    cases: int | None = None,
) -> tuple[Path, Path | None]:
    """Compute (:func:`compute`) and write ``OUT/loss_surface_<site>.csv`` and ``.png``; returns both paths.
    Errors (bad site, run, device, config) are ValueErrors (``ConfigError`` is one) naming the run or option."""
    from fedseg.run.preflight import check_device, check_out_dir

    check_out_dir(Path(out))  # a file given as --out: said before the losses are computed
    on = str(check_device(device, "--device cpu"))
    rows = compute([Path(r) for r in runs], site, directions, seed=seed, device=on, cases=cases)
    from fedseg.data.folder_write import move_in, staging_folder

    out = Path(out)
    names = (f"loss_surface_{site}.csv", f"loss_surface_{site}.png")
    # both written aside, then moved in together: a failure (a full disk, an interrupt) leaves the folder as it was,
    # neither a new CSV beside an old figure nor a folder made for nothing
    with staging_folder(out, "loss-surface") as tmp:
        write_csv(rows, tmp / names[0])
        drawn = figure(rows, site, tmp / names[1])
        move_in(tmp, out, [out / name for name in names if (out / name).exists()])
    return out / names[0], (out / names[1] if drawn is not None else None)
