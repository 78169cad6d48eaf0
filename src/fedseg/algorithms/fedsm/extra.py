"""FedSM-extra (paper Sec. 3.1.2, Eq. 1) and the ensemble selector (Sec. 3.1.1).

Both train in two phases (the paper: 100 model rounds, then 50 selector rounds). By default
(``extra_on_top``) the model phase has the run's ``fl.rounds`` rounds, like every other method's training,
and the selector rounds come on top (``extra_rounds``, default ``fl.rounds // 2``: the run trains
``fl.rounds + extra_rounds`` rounds; ``FedSMExtraOptions.run_rounds``); with ``extra_on_top: false`` both fit
in ``fl.rounds`` (the last ``extra_rounds``, default ``fl.rounds // 3``, are the selector's):

1. rounds ``1 .. R`` (R model rounds): the global model (weighted
   averaging) and the personalized models (SoftPull, Eq. 11, or the ``personalization`` chosen,
   :mod:`fedseg.algorithms.fedsm.personalize`) as in FedSM, without the selector: per site and round
   ``2|w_g|`` down and up with SoftPull (other personalizations: their own traffic, counted).
2. rounds ``R+1 .. R+E``: only the selector trains. At round R+1 the server first sends every
   site the K+1 frozen candidates (global + all personalized models; an ``install`` exchange,
   ``(K+1)|w_g|`` down per site, counted as training traffic); each selector round then moves
   ``|w_s|`` down and up (plus the selector's moments with ``average_selector_moments``, as in FedSM).

* ``fedsm-extra``: at ``install`` a site labels each training image with
  ``y_s = one_hot(argmin_k L(h_k, y))`` over the K+1 candidates (Eq. 1, against the ground
  truth, :func:`fedseg.algorithms.fedsm.model.extra_labels`; on the volume path ``h_k`` is the
  candidate's sliding-window prediction over the whole case, ``FedSMExtraClient.on_install``) and
  keeps only the labels; the selector (K+1 classes) trains with cross-entropy on them. Inference: the argmax candidate,
  no threshold.
* ``fedsm-ensemble``: a site keeps the K+1 candidates and trains the selector through the loss
  of the soft ensemble ``h = sum_k softmax(s)_k sigmoid(h_k)`` against the ground truth (the
  segmentation loss, Dice by default); inference uses the same weighted ensemble. The paper
  reports this variant as hard to train; it is here so the claim can be checked.

Validation in the model phase routes every image to its own site's personalized model (a perfect site
classifier: the selector is not trained yet; reported in ``rounds.csv``, never selected as the best round):
the server keeps the global and personalized models of the phase-1 round with the best such score, and the
selector phase starts from them (the paper took the last phase-1 models; choosing on validation is the
protocol every other method follows). The best round of the run is chosen among the selector rounds, so the
tested super model always has a trained selector. ``round_metrics``: ``selector_acc`` is the fraction of a site's
validation images whose selector argmax is that site's personalized model (not the Eq. 1
target), ``global_frac`` the fraction given (argmax) to the global model.
"""

from __future__ import annotations

import torch
from pydantic import Field
from torch import nn

from fedseg.algorithms.client_state import put_group, state_group
from fedseg.algorithms.fedavg import train_losses
from fedseg.algorithms.fedsm.family import FEDSM
from fedseg.algorithms.fedsm.method import (
    OWN_SITE,
    ROUTE,
    SELECTOR,
    SELECTOR_OPT,
    FedSMClient,
    FedSMServer,
)
from fedseg.algorithms.fedsm.model import EnsembleForward, LabeledImages, Mode, extra_labels
from fedseg.algorithms.fedsm.options import SelectorOptions
from fedseg.algorithms.fedsm.selector import Selector
from fedseg.algorithms.registry import AlgorithmSpec
from fedseg.engine.context import ClientContext, Task
from fedseg.engine.messages import Message, prefixed
from fedseg.evaluate.sliding import sliding_logits
from fedseg.evaluate.tables import is_better, site_summary
from fedseg.train import TrainHooks, segmentation_loss

INSTALL = "install"  # exchange action: the frozen K+1 candidates go to every site
PHASE1_BEST, SCORE, ROUND = "phase1_best", "score", "round"  # server state: the best phase-1 round's candidates
CANDIDATE = "candidate"  # message group: candidate/<c>/<param>, c = 0 (global), 1..K (personalized)
LABELS = "extra_labels/value"  # client state: Eq. (1) labels of the site's training images
FROZEN = "frozen"  # client state group of the ensemble's candidates


class FedSMExtraOptions(SelectorOptions):
    """``fedsm-extra`` / ``fedsm-ensemble``: the FedSM options plus the selector phase length."""

    PHASED = True  # the model rounds, then the selector rounds

    extra_rounds: int | None = Field(
        None,
        ge=1,
        description="selector-only rounds after the model rounds; None = fl.rounds // 2 on top (the paper: 50 after "
        "100), fl.rounds // 3 within",
    )
    extra_on_top: bool = Field(
        True,
        description="the selector rounds come after fl.rounds model rounds (the run trains fl.rounds + extra_rounds; "
        "the model phase gets the rounds every other method gets); false: both phases within fl.rounds",
    )

    def selector_rounds(self, rounds: int) -> int:
        """The selector phase's rounds for ``fl.rounds = rounds`` as configured (before ``run_rounds``)."""
        if self.extra_rounds is not None:
            return self.extra_rounds
        return max(1, rounds // 2) if self.extra_on_top else max(1, rounds // 3)

    def run_rounds(self, rounds: int) -> int:
        """The rounds this method trains for ``fl.rounds = rounds`` (``AlgorithmSpec.run_config``)."""
        return rounds + self.selector_rounds(rounds) if self.extra_on_top else rounds

    def phases(self, total: int) -> tuple[int, int]:
        """(model rounds, selector rounds) of a run of ``total`` rounds (= ``run_rounds(fl.rounds)``)."""
        if not self.extra_on_top:
            return total - self.selector_rounds(total), self.selector_rounds(total)
        model = next((r for r in range(total, 0, -1) if self.run_rounds(r) == total), None)
        if model is None:
            raise ValueError(f"{total} rounds are not model + selector rounds of this method")
        return model, total - model


class FedSMEnsembleOptions(FedSMExtraOptions):
    """``fedsm-ensemble``: same options as ``fedsm-extra``."""


class FedSMExtraServer(FedSMServer):
    MODE: Mode = "argmax"
    EXTRA_CLASSES = 1

    def __init__(self, engine, task: Task, options):
        super().__init__(engine, task, options)
        rounds = task.cfg.fl.rounds  # the method's own: model + selector rounds (AlgorithmSpec.run_config)
        if not options.extra_on_top and options.selector_rounds(rounds) >= rounds:
            raise ValueError(
                f"methods.{engine.algorithm}.extra_rounds = {options.selector_rounds(rounds)} "
                f"must be smaller than fl.rounds = {rounds} "
                "(with extra_on_top: false, fl.rounds counts the model-training rounds and the extra selector rounds)"
            )
        self.train_rounds, self.extra_rounds = options.phases(rounds)
        self.phase1_best: dict[str, torch.Tensor] = {}  # score, round and the K+1 candidates of the best phase-1 round

    def selectable(self, rnd: int) -> bool:
        """Only selector-phase rounds: a phase-1 super model has an untrained selector."""
        return rnd > self.train_rounds

    def eval_messages(self, split: str, sample: bool) -> dict[str, Message]:
        msgs = super().eval_messages(split, sample)
        if self.engine.round <= self.train_rounds:  # the model phase: each image to its own site's model
            for msg in msgs.values():
                msg.meta[ROUTE] = OWN_SITE
        return msgs

    def evaluate(self, split: str, sample: bool = False) -> list[dict]:
        rows = super().evaluate(split, sample)
        if split == "val" and self.engine.round <= self.train_rounds:
            score = site_summary(rows, self.engine.algorithm, "dice", self.sites)["client_avg"]
            if is_better(score, float(self.phase1_best[SCORE]) if self.phase1_best else None):
                self.phase1_best = {
                    SCORE: torch.tensor(score, dtype=torch.float64),
                    ROUND: torch.tensor(self.engine.round),
                    **{k: v.clone() for k, v in self.candidate_tensors().items()},
                }
        return rows

    def run_round(self, rnd: int) -> dict[str, float]:
        if rnd <= self.train_rounds:
            msgs = {s: Message(self.model_tensors(s)) for s in self.sites}
        else:
            if rnd == self.train_rounds + 1:
                self.restore_phase1_best()
                self.engine.exchange({s: Message(self.candidate_tensors()) for s in self.sites}, INSTALL)
            msgs = {
                s: Message(
                    {**prefixed(SELECTOR, self.selector_weights), **prefixed(SELECTOR_OPT, self.selector_moments)}
                )
                for s in self.sites
            }
        replies = self.engine.exchange(msgs, "train", self.train_reply_problem)
        self.aggregate(replies)
        return train_losses(replies)

    def candidate_tensors(self) -> dict[str, torch.Tensor]:
        models = [self.global_weights] + [self.personal[s] for s in self.sites]
        return {k: v for c, w in enumerate(models) for k, v in prefixed(f"{CANDIDATE}/{c}", w).items()}

    def restore_phase1_best(self) -> None:
        """The global and personalized models of the best phase-1 round on validation become the candidates."""
        if not self.phase1_best:
            return
        best = Message(self.phase1_best)
        self.global_weights = best.group(f"{CANDIDATE}/0")
        self.personal = {s: best.group(f"{CANDIDATE}/{c}") for c, s in enumerate(self.sites, start=1)}

    @property
    def phase1_best_round(self) -> int | None:
        return int(self.phase1_best[ROUND]) if self.phase1_best else None

    def state_dict(self) -> dict[str, torch.Tensor]:
        return {**super().state_dict(), **prefixed(PHASE1_BEST, self.phase1_best)}

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        super().load_state_dict(state)
        self.phase1_best = Message(state).group(PHASE1_BEST)

    def summary_fields(self) -> dict:
        """The phase-1 round whose models the selector phase started from (chosen on validation)."""
        return {"phase1_best_round": self.phase1_best_round}


class FedSMExtraClient(FedSMClient):
    MODE: Mode = "argmax"
    EXTRA_CLASSES = 1

    def candidates(self, msg: Message, ctx: ClientContext) -> list[nn.Module]:
        return [self.segmenter(msg.group(f"{CANDIDATE}/{c}"), ctx).eval() for c in range(ctx.num_sites + 1)]

    def on_install(self, msg: Message, ctx: ClientContext) -> Message:
        """Label every training image with Eq. (1) and keep the labels.

        The paper labels each training image x by the candidate whose output is closest to its ground
        truth, ``y_s = one_hot(argmin_k L(h_k(x), y))``: one label per *case*. On the whole-image path
        ``h_k(x)`` is candidate k on the case's fixed-size image. On the volume path a candidate never
        sees a whole case (it trains on patches and is deployed by sliding window), so ``h_k(x)`` is its
        sliding-window prediction over the whole preprocessed case (``fedseg.evaluate.sliding``: windows
        of ``data.volume.patch_size``, the deployed output) and ``L`` is taken against the case's masks on
        the same grid: the label is the candidate that segments the case best as it will be used.
        Deterministic (no random patches), so the label does not depend on where a patch happened to fall."""
        models, data = self.candidates(msg, ctx), ctx.data.train
        loss_fn = segmentation_loss(ctx.cfg.train)
        labels = []
        with torch.no_grad():
            if data.volumes is not None and data.volume is not None:  # the volume path
                for vol in data.volumes:
                    outputs = [sliding_logits(m, vol.image, data.volume, ctx.task.device)[None] for m in models]
                    labels.append(extra_labels(outputs, vol.label[None].float(), loss_fn).cpu())
            else:
                for idx in torch.arange(len(data)).split(ctx.cfg.eval.batch_size):
                    x, y = data.batch(idx, ctx.task.device)
                    labels.append(extra_labels([m(x) for m in models], y, loss_fn).cpu())
        ctx.state[LABELS] = torch.cat(labels)
        return Message({}, {"steps": 0})

    def selector_task(self, selector: Selector, msg: Message, ctx: ClientContext):
        train = ctx.data.train
        return LabeledImages(train.name, train.x, ctx.state[LABELS]), nn.CrossEntropyLoss(), TrainHooks()


class FedSMEnsembleServer(FedSMExtraServer):
    MODE = "ensemble"


class FedSMEnsembleClient(FedSMExtraClient):
    MODE = "ensemble"

    def on_install(self, msg: Message, ctx: ClientContext) -> Message:
        """Keep the K+1 frozen candidates for the selector phase."""
        put_group(ctx.state, FROZEN, msg.tensors)
        return Message({}, {"steps": 0})

    def selector_task(self, selector: Selector, msg: Message, ctx: ClientContext):
        frozen = Message(state_group(ctx.state, FROZEN))
        return ctx.data.train, None, EnsembleForward(self.candidates(frozen, ctx))


SPECS = (
    AlgorithmSpec(
        "fedsm-extra",
        "FedSM-extra",
        FedSMExtraServer,
        FedSMExtraClient,
        "FedSM-extra: models first, then extra selector rounds on Eq. 1 labels; argmax over K+1",
        FedSMExtraOptions,
        kind="personalized",
        family=FEDSM,
        min_sites=2,
        needs_every_site=True,
        on_secure_aggregation=(
            "its server SoftPulls every site's personalized model and trains the selector on individual replies"
        ),
    ),
    AlgorithmSpec(
        "fedsm-ensemble",
        "FedSM-ensemble",
        FedSMEnsembleServer,
        FedSMEnsembleClient,
        "FedSM ensemble: selector trained through the soft ensemble of K+1 models (Sec. 3.1.1)",
        FedSMEnsembleOptions,
        kind="personalized",
        family=FEDSM,
        min_sites=2,
        needs_every_site=True,
        on_secure_aggregation="its server SoftPulls every site's personalized model",
    ),
)
