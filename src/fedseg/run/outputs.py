"""The run output files (names and schemas from docs/design.md §3 "Run outputs"; other tools read them)."""

from __future__ import annotations

import csv
import hashlib
import io
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save

from fedseg.atomic_files import atomic_write_bytes, atomic_write_text, strict_json_text
from fedseg.config import RunConfig
from fedseg.config_load import dump_config
from fedseg.data.federation import Federation
from fedseg.data.reorient import federation_orientation
from fedseg.run.bundle_folders import BUNDLE_MANIFEST as BUNDLE_MANIFEST
from fedseg.run.bundle_folders import BUNDLE_WEIGHTS as BUNDLE_WEIGHTS
from fedseg.run.provenance import finish
from fedseg.run.result import AlgorithmResult, Row

Bundle = dict[str, dict[str, torch.Tensor]]  # the trained models, by name

RESULTS_COLUMNS = ["algorithm", "model", "site", "case", "region", "metric", "value"]
ROUNDS_COLUMNS = ["algorithm", "round", "site", "val_dice", "train_loss"]
METRICS_COLUMNS = ["algorithm", "round", "site", "metric", "value"]
# exchange, wall_seconds: the number and wall time of the exchange a row belongs to (fedseg.engine.ledger);
# bytes_down, bytes_up: what each message weighed on the wire (Flower; 0 elsewhere)
LEDGER_COLUMNS = ["algorithm", "round", "site", "action", "steps", "floats_down", "floats_up", "seconds", "failure"]
LEDGER_COLUMNS += ["exchange", "wall_seconds", "bytes_down", "bytes_up"]  # bytes: measured on Flower only


@dataclass
class RunResults:
    cfg: RunConfig  # as given (config.yaml; a resume compares with it)
    federation: Federation
    algorithms: list[AlgorithmResult]
    provenance: dict[str, Any] = field(default_factory=dict)  # fedseg.run.provenance.begin; summary.json adds the end
    plan: dict[str, Any] | None = None  # model.name planned: the plan, its traffic (summary.json "plan"; fedseg.plan)
    plan_ledger: list[Row] = field(default_factory=list)  # the planning exchanges' ledger rows (algorithm "plan")
    planned_cfg: RunConfig | None = None  # model.name planned: the config the run trained with (the plan applied)

    @property
    def trained_cfg(self) -> RunConfig:
        """The config the models were trained with: ``cfg``, or the planned one (what ``fedseg predict`` rebuilds)."""
        return self.planned_cfg or self.cfg


def csv_text(columns: list[str], rows: list[Row]) -> str:
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=columns, lineterminator="\n")
    writer.writeheader()
    for row in rows:
        writer.writerow({c: row[c] for c in columns})
    return buf.getvalue()


def summary_dict(results: RunResults) -> dict[str, Any]:
    fed = results.federation
    return {
        "dataset": fed.name,
        "sites": fed.site_names,
        "regions": list(fed.regions.names),
        **({"ignore_label": fed.regions.ignore} if fed.regions.ignore is not None else {}),  # scored: annotated voxels
        "hd95_unit": hd95_unit(results.trained_cfg, fed.kind),
        "nsd_tolerance": results.cfg.eval.nsd_tolerance,  # in hd95_unit; a number, or one per region
        "hd95_worst": results.cfg.eval.hd95_worst,  # in hd95_unit; None: each case's grid diagonal
        "score_grid": score_grid(results.trained_cfg),  # each case's own grid (original) or the model's
        "score_on": results.cfg.eval.score_on,  # label_map: the written masks' regions; channels: each channel
        "algorithms": {a.name: a.summary for a in results.algorithms},
        **({"plan": results.plan} if results.plan is not None else {}),
        **({"provenance": finish(results.provenance)} if results.provenance else {}),
    }


def hd95_unit(cfg: RunConfig, kind: str) -> str:
    """What HD95 and NSD's tolerance are measured in: mm on the volume path (each case's own grid and spacing,
    ``fedseg.evaluate.sliding``), else pixels of a 2D federation (``kind``), voxels of a 3D one (the whole-volume
    path, without spacing): of each case's own grid (``eval.score_grid: original``) or of the model input
    (``model``). Older runs recorded ``pixels`` for a 3D federation too; readers show what a run recorded."""
    if cfg.data.volume.patch_size is not None:
        return "mm"
    return "voxels" if kind == "3d" else "pixels"


def score_grid(cfg: RunConfig) -> str:
    """Where the test cases were scored: ``original`` (each case's own grid: always on the volume path) or
    ``model`` (the whole-image path's resized grid, ``eval.score_grid: model``)."""
    return "original" if cfg.data.volume.patch_size is not None else cfg.eval.score_grid


def write_outputs(out: Path, results: RunResults) -> None:
    """Write config.yaml, summary.json, results.csv, rounds.csv, round_metrics.csv (method-specific
    per-round metrics, e.g. FedSM's selector accuracy), ledger.csv and model/ (each atomically)."""
    algos = results.algorithms
    atomic_write_text(out / "config.yaml", dump_config(results.cfg))
    atomic_write_text(out / "summary.json", strict_json_text(summary_dict(results), indent=2))  # NaN: null
    atomic_write_text(out / "results.csv", csv_text(RESULTS_COLUMNS, [r for a in algos for r in a.test_rows]))
    atomic_write_text(out / "rounds.csv", csv_text(ROUNDS_COLUMNS, [r for a in algos for r in a.rounds_rows]))
    atomic_write_text(out / "round_metrics.csv", csv_text(METRICS_COLUMNS, [r for a in algos for r in a.metric_rows]))
    ledger = [{"algorithm": "plan", **row} for row in results.plan_ledger]  # model.name planned: its exchanges
    ledger += [{"algorithm": a.name, **row} for a in algos for row in a.ledger]
    atomic_write_text(out / "ledger.csv", csv_text(LEDGER_COLUMNS, ledger))
    for a in algos:
        write_bundle_files(out / "model" / a.name, a.bundle, results.trained_cfg, results.federation, a.card)


def write_bundle_files(
    folder: Path, bundle: Bundle, cfg: RunConfig, fed: Federation, card: dict[str, Any] | None = None
) -> str:
    """``model/<algorithm>/weights.safetensors`` (tensors named ``<model>/<param>``) + ``manifest.json`` from the
    run's config and federation; returns the weights file's SHA-256 (see ``read_bundle``). The manifest's
    ``channel_names`` are the federation's (what each input channel holds, in order; null when the federation does
    not say), so ``fedseg predict`` can refuse images whose channels come in another order; ``orientation``: the
    voxel orientation every training volume lay in (``fedseg.data.reorient.federation_orientation``; absent where
    there was not one), to which ``fedseg predict`` turns its inputs: the ``card``'s, recorded when the algorithm
    finished, where it has one (a resume rewrites a finished algorithm's bundle after its data may have been turned),
    else ``fed``'s now; ``trained``: the model ``card`` (:mod:`fedseg.run.model_card`), where there is one."""
    tensors = {f"{model}/{k}": v.contiguous() for model, weights in bundle.items() for k, v in weights.items()}
    data = save(tensors)
    atomic_write_bytes(folder / BUNDLE_WEIGHTS, lambda f: f.write(data))
    manifest = {
        "models": sorted(bundle),
        "network": cfg.model.model_dump(mode="json"),
        "spatial_dims": fed.spatial_dims,
        "in_channels": fed.channels,
        "channel_names": None if fed.channel_names is None else [str(n) for n in fed.channel_names],
        "regions": fed.regions.as_dict(),
        "image_size": cfg.data.image_size,
        "resize": cfg.data.resize,  # how an image reached the input (absent in older bundles: stretch)
        "normalize": cfg.data.normalize,
        **({"ct_windows": cfg.data.ct_windows} if cfg.data.ct_windows else {}),  # normalize: ct
        "volume": cfg.data.volume.model_dump(mode="json"),  # the volume pipeline (fedseg predict on patches)
        "threshold": cfg.eval.threshold,
        **({"orientation": orientation} if (orientation := trained_orientation(fed, card)) else {}),
        **({"trained": card} if card else {}),
    }
    atomic_write_text(folder / BUNDLE_MANIFEST, strict_json_text(manifest, indent=2))  # a NaN Dice: null
    return hashlib.sha256(data).hexdigest()


def trained_orientation(fed: Federation, card: dict[str, Any] | None) -> str | None:
    """The voxel orientation a bundle's model trained on: its ``card``'s (recorded as its algorithm finished), else
    ``fed``'s (``fedseg.data.reorient.federation_orientation``; a card of an older fedseg has none)."""
    return card["orientation"] if card and "orientation" in card else federation_orientation(fed)


def read_bundle(folder: Path, sha256: str | None = None, order: dict[str, list[str]] | None = None) -> Bundle:
    """The bundle ``write_bundle`` wrote to ``folder``: ``{model: {param: tensor}}`` (the models its
    manifest lists). ``sha256``: the weights file must have this digest (the one ``write_bundle``
    returned), else a ValueError, as for a missing or unreadable file. ``order``: ``bundle_order`` of the
    bundle that was written, to get back the same dicts, in the same order (the file sorts them).
    See also ``fedseg.run.bundles.load_bundle`` (manifest checks, for inference)."""
    from safetensors.torch import load

    weights, manifest = Path(folder) / BUNDLE_WEIGHTS, Path(folder) / BUNDLE_MANIFEST
    try:
        data = weights.read_bytes()
        models = json.loads(manifest.read_text())["models"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise ValueError(f"{folder}: cannot read the model bundle ({type(e).__name__}: {e})") from None
    if sha256 is not None and hashlib.sha256(data).hexdigest() != sha256:
        raise ValueError(f"{weights}: not the weights this run wrote (its SHA-256 differs)")
    tensors = load(data)
    if order is not None:
        try:
            return {m: {k: tensors[f"{m}/{k}"] for k in keys} for m, keys in order.items()}
        except KeyError as e:
            raise ValueError(f"{weights}: no tensor {e.args[0]!r}") from None
    bundle: Bundle = {m: {} for m in models}
    for key, value in tensors.items():
        model = max((m for m in models if key.startswith(m + "/")), key=len, default=None)
        if model is None:
            raise ValueError(f"{weights}: tensor {key!r} belongs to no model of {manifest}")
        bundle[model][key[len(model) + 1 :]] = value
    return bundle


def bundle_order(bundle: Bundle) -> dict[str, list[str]]:
    """The models of ``bundle`` and each one's tensor names, in order (for ``read_bundle``)."""
    return {model: list(weights) for model, weights in bundle.items()}
