"""The run output files (names and schemas from DESIGN.md "Run outputs"; other tools read them)."""

from __future__ import annotations

import csv
import io
import json
from dataclasses import dataclass, field
from pathlib import Path

from safetensors.torch import save

from fedseg.config import RunConfig, dump_config
from fedseg.data.federation import Federation
from fedseg.engine.checkpoint import atomic_write_bytes, atomic_write_text
from fedseg.provenance import finish

RESULTS_COLUMNS = ["algorithm", "model", "site", "case", "region", "metric", "value"]
ROUNDS_COLUMNS = ["algorithm", "round", "site", "val_dice", "train_loss"]
METRICS_COLUMNS = ["algorithm", "round", "site", "metric", "value"]
LEDGER_COLUMNS = ["algorithm", "round", "site", "action", "steps", "floats_down", "floats_up", "seconds"]


@dataclass
class RunResults:
    cfg: RunConfig
    federation: Federation
    algorithms: list  # list[fedseg.run.AlgorithmResult]
    provenance: dict = field(default_factory=dict)  # fedseg.provenance.begin; summary.json adds the end


def csv_text(columns: list[str], rows: list[dict]) -> str:
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=columns, lineterminator="\n")
    writer.writeheader()
    for row in rows:
        writer.writerow({c: row[c] for c in columns})
    return buf.getvalue()


def summary_dict(results: RunResults) -> dict:
    fed = results.federation
    return {
        "dataset": fed.name,
        "sites": fed.site_names,
        "regions": list(fed.regions.names),
        "algorithms": {a.name: a.summary for a in results.algorithms},
        **({"provenance": finish(results.provenance)} if results.provenance else {}),
    }


def write_outputs(out: Path, results: RunResults) -> None:
    """Write config.yaml, summary.json, results.csv, rounds.csv, round_metrics.csv (method-specific
    per-round metrics, e.g. FedSM's selector accuracy), ledger.csv and model/ (each atomically)."""
    algos = results.algorithms
    atomic_write_text(out / "config.yaml", dump_config(results.cfg))
    atomic_write_text(out / "summary.json", json.dumps(summary_dict(results), indent=2, allow_nan=True))
    atomic_write_text(out / "results.csv", csv_text(RESULTS_COLUMNS, [r for a in algos for r in a.test_rows]))
    atomic_write_text(out / "rounds.csv", csv_text(ROUNDS_COLUMNS, [r for a in algos for r in a.rounds_rows]))
    atomic_write_text(out / "round_metrics.csv", csv_text(METRICS_COLUMNS, [r for a in algos for r in a.metric_rows]))
    ledger = [{"algorithm": a.name, **row} for a in algos for row in a.ledger]
    atomic_write_text(out / "ledger.csv", csv_text(LEDGER_COLUMNS, ledger))
    for a in algos:
        write_bundle(out / "model" / a.name, a.bundle, results)


def write_bundle(folder: Path, bundle: dict, results: RunResults) -> None:
    """``model/<algorithm>/weights.safetensors`` (tensors named ``<model>/<param>``) + ``manifest.json``."""
    cfg, fed = results.cfg, results.federation
    tensors = {f"{model}/{k}": v.contiguous() for model, weights in bundle.items() for k, v in weights.items()}
    atomic_write_bytes(folder / "weights.safetensors", lambda f: f.write(save(tensors)))
    manifest = {
        "models": sorted(bundle),
        "network": cfg.model.model_dump(mode="json"),
        "spatial_dims": fed.spatial_dims,
        "in_channels": fed.channels,
        "regions": fed.regions.as_dict(),
        "image_size": cfg.data.image_size,
        "normalize": cfg.data.normalize,
        "threshold": cfg.eval.threshold,
    }
    atomic_write_text(folder / "manifest.json", json.dumps(manifest, indent=2))
