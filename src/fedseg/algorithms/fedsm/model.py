"""FedSM's "super model" (paper Sec. 3.1, Fig. 1): global model, personalized models, model selector.

Candidates are indexed ``0 = global model h_0, k = personalized model h_k of the k-th site``
(``k = 1..K``, site order of the server). The selector f_s(w_s; x) scores an image; how the
scores pick the output depends on the variant (``mode``):

* ``threshold`` (FedSM, Algorithm 2): K selector classes (class k-1 = site k, Eq. 2). With
  ``y_s = softmax(f_s(x))``: if ``max y_s > gamma`` use personalized model ``argmax y_s + 1``,
  else the global model. ``gamma = 1`` always uses the global model, ``gamma = 0`` always the
  argmax personalized model (a softmax maximum is at least 1/K > 0).
* ``argmax`` (FedSM-extra, Sec. 3.1.2): K+1 classes (class c = candidate c); no threshold.
* ``ensemble`` (Sec. 3.1.1): K+1 classes; the output is ``h = sum_c y_s,c sigmoid(h_c)``, a
  probability per region, returned as its logit so every consumer applies one sigmoid.

Images ``(B, C, *S)`` in, region logits ``(B, R, *S)`` out, as every segmentation network here.
The site an image came from is never used.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Literal

import torch
from torch import nn

from fedseg.algorithms.fedsm.selector import Selector, build_selector
from fedseg.engine.messages import load_weights
from fedseg.train import LossFn, TrainHooks

Mode = Literal["threshold", "argmax", "ensemble"]
MODES: tuple[Mode, ...] = ("threshold", "argmax", "ensemble")
GLOBAL_INDEX = 0
EPS = 1e-6  # ensemble probabilities are clamped to [EPS, 1 - EPS] before the logit


def route(probs: torch.Tensor, mode: Mode, gamma: float = 0.5) -> torch.Tensor:
    """Selector scores ``(B, C)`` -> chosen candidate per image ``(B,)`` (0 = global, k = site k).

    ``threshold`` (Algorithm 2): ``argmax + 1`` where ``max > gamma``, else 0; ``argmax``/``ensemble``:
    ``argmax`` over the K+1 candidates (for ``ensemble`` the most weighted candidate, for reports).
    """
    if mode == "threshold":
        conf, k = probs.max(dim=1)
        return torch.where(conf > gamma, k + 1, torch.zeros_like(k))
    if mode in ("argmax", "ensemble"):
        return probs.argmax(dim=1)
    raise ValueError(f"unknown super-model mode {mode!r} ({' | '.join(MODES)})")


def ensemble_logits(weights: torch.Tensor, logits: Sequence[torch.Tensor]) -> torch.Tensor:
    """Sec. 3.1.1: ``logit(sum_c weights[:, c] * sigmoid(logits[c]))``; weights ``(B, K+1)`` sum to 1,
    each ``logits[c]`` is ``(B, R, *S)``."""
    probs = torch.stack([torch.sigmoid(h) for h in logits], dim=1)  # (B, K+1, R, *S)
    w = weights.reshape(weights.shape + (1,) * (probs.dim() - 2))
    return torch.logit((w * probs).sum(dim=1).clamp(EPS, 1 - EPS))


class FixedEnsemble(nn.Module):
    """The candidates' ensemble (Sec. 3.1.1) with fixed selector weights ``(1, K+1)``, for any batch."""

    def __init__(self, candidates: Iterable[nn.Module], weights: torch.Tensor):
        super().__init__()
        self.candidates, self.weights = list(candidates), weights

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return ensemble_logits(self.weights.expand(len(x), -1), [c(x) for c in self.candidates])


class Deferred(nn.Module):
    """A network built at its first use (forward, or ``network()``) by ``build()``, in this module's train/eval
    mode: a super model whose selector routes every image to a few candidates builds only those."""

    def __init__(self, build: Callable[[], nn.Module]):
        super().__init__()
        self.build = build
        self.net: nn.Module | None = None

    def network(self) -> nn.Module:
        if self.net is None:
            self.net = self.build().train(self.training)
        return self.net

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.network()(x)


class SuperModel(nn.Module):
    """Global model, K personalized models and the selector, applied as in the module docstring."""

    def __init__(
        self,
        global_model: nn.Module,
        personal: Sequence[nn.Module],
        selector: Selector,
        gamma: float = 0.5,
        mode: Mode = "threshold",
    ):
        super().__init__()
        if mode not in MODES:
            raise ValueError(f"unknown super-model mode {mode!r} ({' | '.join(MODES)})")
        self.candidates = nn.ModuleList([global_model, *personal])
        self.selector: Selector = selector
        self.gamma = float(gamma)
        self.mode = mode

    @property
    def num_sites(self) -> int:
        return len(self.candidates) - 1

    def scores(self, x: torch.Tensor) -> torch.Tensor:
        """Softmax of the selector, ``(B, C)``."""
        return torch.softmax(self.selector(x), dim=1)

    @torch.no_grad()
    def scores_of(self, images: torch.Tensor, batch_size: int, device: torch.device) -> torch.Tensor:
        """Selector softmax of a whole split ``(N, C, *S)`` in batches on ``device``, ``(N, C)`` on the CPU."""
        return torch.cat([self.scores(xb.to(device)).cpu() for xb in images.split(batch_size)])

    def choose(self, x: torch.Tensor) -> torch.Tensor:
        """The candidate each image is routed to, ``(B,)`` (0 = global)."""
        return route(self.scores(x), self.mode, self.gamma)

    @torch.no_grad()
    def for_image(self, x: torch.Tensor) -> nn.Module:
        """The network that segments one whole image ``x`` ``(1, C, *S)`` window by window (volume path,
        ``fedseg.evaluate.sliding``): the selector routes once on the whole (fixed-size) image, not per
        window; threshold/argmax: the chosen candidate; ensemble: the candidates blended with this image's
        weights."""
        probs = self.scores(x)
        if self.mode == "ensemble":
            return FixedEnsemble(self.candidates, probs)
        return self.candidates[int(route(probs, self.mode, self.gamma)[0])]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        probs = self.scores(x)
        if self.mode == "ensemble":
            return ensemble_logits(probs, [m(x) for m in self.candidates])
        choice = route(probs, self.mode, self.gamma)
        out = None
        for c in choice.unique().tolist():
            idx = (choice == c).nonzero().flatten()
            y = self.candidates[c](x[idx])
            if out is None:
                out = y.new_empty((len(x),) + tuple(y.shape[1:]))
            out[idx] = y
        assert out is not None  # choice has one entry per image, so some candidate ran
        return out


class EnsembleForward(TrainHooks):
    """The selector trained through the ensemble loss (Sec. 3.1.1): ``forward`` gives the ensemble's
    logits of the K+1 frozen ``candidates`` (kept in eval mode, no gradients) weighted by the trained
    selector's softmax; the optimizer and ``train()`` see the selector alone."""

    def __init__(self, candidates: Sequence[nn.Module]):
        self.frozen = tuple(candidates)
        for m in self.frozen:
            m.eval().requires_grad_(False)

    def forward(self, model: nn.Module, x: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            outputs = [m(x) for m in self.frozen]
        return ensemble_logits(torch.softmax(model(x), dim=1), outputs)


@dataclass
class LabeledImages:
    """``(image, class index)`` view of a split for training a classifier through the Trainer:
    ``x`` ``(N, C, *S)`` images, ``labels`` ``(N,)`` int64."""

    name: str
    x: torch.Tensor
    labels: torch.Tensor

    def __len__(self) -> int:
        return len(self.labels)

    def batch(self, idx: torch.Tensor, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        return self.x[idx].to(device), self.labels[idx].to(device)


def per_case_loss(loss_fn: LossFn, logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """``loss_fn`` applied to every case alone: ``(B, R, *S)`` twice -> ``(B,)``."""
    return torch.stack([loss_fn(logits[i : i + 1], target[i : i + 1]) for i in range(len(logits))])


def extra_labels(outputs: Sequence[torch.Tensor], target: torch.Tensor, loss_fn: LossFn) -> torch.Tensor:
    """FedSM-extra's selector labels, Eq. (1): ``argmin_k L(h_k, y)`` over the K+1 candidates.

    ``outputs[k]``: logits ``(B, R, *S)`` of candidate k (0 = global); ``target``: region masks
    ``(B, R, *S)``; ``L`` the segmentation loss per case. Returns ``(B,)`` int64; ties go to the
    lower index (the global model first). The paper writes ``L(h, h_k)``; the loss is taken
    against the ground truth y, as the text around Eq. (1) describes.
    """
    losses = torch.stack([per_case_loss(loss_fn, h, target) for h in outputs], dim=1)  # (B, K+1)
    return losses.argmin(dim=1)


# --- the trained bundle --------------------------------------------------------------------
SELECTOR_SPEC = "selector_spec"  # bundle entry describing the selector and the routing


def bundle_entries(
    global_w: dict,
    personal: dict[str, dict],
    selector_w: dict,
    gamma: float,
    mode: Mode,
    selector: Selector,
    width: float,
    norm: str,
) -> dict[str, dict[str, torch.Tensor]]:
    """The super model as bundle entries: ``global``, ``personal:<site>``, ``selector``,
    ``gamma/value`` (0-d float64; NaN for the variants without a threshold) and ``selector_spec/*``
    (0-d tensors: ``width``, ``input_size`` (0 = none), ``batchnorm`` (1/0), ``num_classes``,
    ``mode`` (index in ``MODES``), ``class:<site>`` = the candidate index of that site's
    personalized model)."""
    spec = {
        "width": torch.tensor(float(width)),
        "input_size": torch.tensor(int(selector.input_size or 0)),
        "batchnorm": torch.tensor(int(norm == "batch")),
        "num_classes": torch.tensor(int(selector.num_classes)),
        "mode": torch.tensor(MODES.index(mode)),
    }
    spec.update({f"class:{s}": torch.tensor(k + 1) for k, s in enumerate(personal)})
    return {
        "global": global_w,
        **{f"personal:{s}": w for s, w in personal.items()},
        "selector": selector_w,
        "gamma": {"value": torch.tensor(float(gamma), dtype=torch.float64)},
        SELECTOR_SPEC: spec,
    }


def candidate_names(bundle: dict[str, dict[str, torch.Tensor]]) -> list[str]:
    """Bundle entry names of the candidates in candidate order: ``["global", "personal:<site>", ...]``
    (index 0 = global model h_0, k = site k's personalized model)."""
    sites = sorted((int(v), k.split(":", 1)[1]) for k, v in bundle[SELECTOR_SPEC].items() if k.startswith("class:"))
    return ["global"] + [f"personal:{s}" for _, s in sites]


def super_model_from_bundle(
    bundle: dict[str, dict[str, torch.Tensor]],
    new_segmenter: Callable[[], nn.Module],
    in_channels: int,
    spatial_dims: int,
    gamma: float | None = None,
) -> SuperModel:
    """Rebuild the ``SuperModel`` from ``bundle_entries`` (e.g. the tensors of ``model/<algorithm>/``
    grouped by their first path component); ``gamma`` overrides the stored one."""
    spec = bundle[SELECTOR_SPEC]
    selector = build_selector(
        in_channels,
        int(spec["num_classes"]),
        float(spec["width"]),
        "batch" if int(spec["batchnorm"]) else "instance",
        int(spec["input_size"]) or None,
        spatial_dims,
    )
    load_weights(selector, bundle["selector"])
    models = []
    for name in candidate_names(bundle):
        m = new_segmenter()
        load_weights(m, bundle[name])
        models.append(m)
    g = float(bundle["gamma"]["value"]) if gamma is None else gamma
    return SuperModel(models[0], models[1:], selector, g, MODES[int(spec["mode"])]).eval()
