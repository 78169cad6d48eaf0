"""``fedseg predict``'s model: finding the bundle ``--model`` names (``find_model``; a study's folder is refused
naming the model folders of its runs) and building its network(s) (``build_predictor``: a routed bundle's routing,
or the one model of a single-model bundle, ``--site`` choosing among per-site models), and ``PredictError``
(``run.bundles.BundleError``): a bad model folder, option or input file, raised by every step of ``fedseg predict``.
"""

from __future__ import annotations

import shlex
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from fedseg.algorithms.registry import RoutedModel
from fedseg.engine.messages import load_weights
from fedseg.run.bundles import MANIFEST, WEIGHTS, Bundle, BundleError, find_bundle, run_bundles
from fedseg.run.model_card import card_round, model_round
from fedseg.wording import listed

BASE_COLUMNS = ["file", "mask", "model", "round", "confidence"]


PredictError = BundleError  # a bad model folder, option or input file; the message names it


@dataclass
class Predictor:
    """``model`` maps images ``(B, C, *S)`` to region logits ``(B, R, *S)``. A routed bundle (``routed``):
    ``candidates`` are its networks' names and ``prob_names`` the candidate of each routing score; a
    single model: ``candidates = [the model's name]`` and ``prob_names = []``. ``card``: the bundle's model card
    (``manifest.json`` ``trained``; None before cards), which says the round each model was selected at."""

    model: nn.Module
    candidates: list[str]
    prob_names: list[str]
    routed: RoutedModel | None = None
    card: object = None

    @property
    def columns(self) -> list[str]:
        return BASE_COLUMNS + [f"prob:{n}" for n in self.prob_names]

    @torch.no_grad()
    def choices(self, x: torch.Tensor) -> list[dict]:
        """Per image of ``x`` ``(B, C, *S)``: ``model``, ``round``, ``confidence`` and ``prob:<candidate>``."""
        if self.routed is None:
            rows = [{"model": self.candidates[0], "confidence": ""} for _ in range(len(x))]
        else:
            rows = self.routed.choices(x)
        return [{"model": r["model"], "round": self.model_round(r["model"]), **r} for r in rows]

    def model_round(self, model: str) -> int | str:
        """The round at which ``model`` (a row's) was selected, from the card (``model_card.model_round``; a routed
        bundle: the card's entry its routing names, ``round_key``); ``""`` where the card does not say."""
        if self.routed is None:
            found = model_round(self.card, model)
        else:
            found = card_round(self.card, self.routed.round_key(model))
        return "" if found is None else found


def find_model(model: Path, algorithm: str | None = None) -> Path:
    """The bundle folder ``--model`` names (``run.bundles.find_bundle``); a study folder (or another folder of runs),
    whose bundles lie deeper, is refused naming the model folders of its runs to choose from."""
    try:
        return find_bundle(model, algorithm)
    except BundleError:
        if (deeper := runs_below(Path(model))) is not None:
            raise PredictError(deeper) from None
        raise


RUN_DEPTH = 6  # a bench's runs: runs/<federation>/fold<k>/seed<s>/<method>/<setting>/model


def runs_below(path: Path, shown: int = 4) -> str | None:
    """Why ``path`` is no run although runs lie below it (a study's ``holdout/<site>/``, ``sweep/<key>=<value>/``, a
    bench's ``runs/...``, up to ``RUN_DEPTH`` folders down): one line listing their model folders (the first
    ``shown``); None where ``path`` is no study or bench and holds none."""
    if not path.is_dir() or (path / MANIFEST).is_file() or run_bundles(path):
        return None
    patterns = ["/".join(["*"] * depth + ["model"]) for depth in range(1, RUN_DEPTH + 1)]
    models = sorted({m for pattern in patterns for m in path.glob(pattern) if run_bundles(m.parent)})
    from fedseg.bench.phases import BENCH_FILE  # only here: the bench's and the report's modules are large
    from fedseg.report.study_tables import is_study_dir

    kind = "a bench" if (path / BENCH_FILE).is_file() else "a study" if is_study_dir(path) else None
    if not models:
        return f"{path}: is {kind}, not a run; none of its sub-runs has a model yet" if kind else None
    what, runs = (f"is {kind}, not a run", "of its sub-runs") if kind else ("is not a run", "of the runs in it")
    named = listed((str(m.relative_to(path)) for m in models), shown)
    example = shlex.quote(str(models[0]))
    return f"{path}: {what}; choose the model of one {runs}: {named} (e.g. --model {example})"


def build_predictor(bundle: Bundle, gamma: float | None = None, site: str | None = None) -> Predictor:
    """The network(s) of ``bundle``; ``gamma`` overrides a threshold bundle's gamma, ``site`` picks
    the model of a bundle with one model per site (``local``)."""
    m = bundle.manifest
    routing = bundle.routing
    if routing is not None:
        if site is not None:
            raise PredictError(
                f"{bundle.folder}: --site applies to bundles with one model per site (local); "
                "this one routes every image with its selector"
            )
        problem = routing.option_problem(bundle.models, gamma, str(bundle.folder))
        if problem is not None:
            raise PredictError(problem)
        with weights_fit(bundle):
            routed = routing.build(bundle.models, bundle.new_segmenter, m["in_channels"], m["spatial_dims"], gamma)
        return Predictor(routed.network, routed.candidates, routed.prob_names, routed, m.get("trained"))
    if gamma is not None:
        raise PredictError(f"{bundle.folder}: --gamma applies to FedSM bundles; this one has no selector")
    names = list(bundle.models)
    if site is not None:
        by_site = {n.split(":", 1)[1]: n for n in names if ":" in n}
        if site not in by_site:
            raise PredictError(f"{bundle.folder}: no model for --site {site!r} (models: {', '.join(names)})")
        names = [by_site[site]]
    elif "global" in names:
        names = ["global"]
    if len(names) != 1:
        raise PredictError(f"{bundle.folder}: holds one model per site ({', '.join(names)}); choose one with --site")
    model = bundle.new_segmenter()
    with weights_fit(bundle):
        load_weights(model, bundle.models[names[0]])
    return Predictor(model.eval(), names, [], card=m.get("trained"))


@contextmanager
def weights_fit(bundle: Bundle):
    """Turn a weights/network mismatch while loading ``bundle`` into a ``PredictError`` naming its files."""
    try:
        yield
    except (KeyError, RuntimeError) as e:
        raise PredictError(
            f"{bundle.folder / WEIGHTS}: does not fit the network of {bundle.folder / MANIFEST} "
            f"({type(e).__name__}: {e})"
        ) from None
