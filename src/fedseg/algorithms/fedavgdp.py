"""FedAvg with central differential privacy (``fedavg-dp``): FedAvg whose merge clips each site's
update and adds Gaussian noise to the average (DP-FedAvg, McMahan et al. 2018; Flower's server-side
fixed clipping). The mechanism and the (ε, δ) accounting: :mod:`fedseg.algorithms.privacy`.

What differs from FedAvg, and nothing else:

* ``aggregate``: w ← w + (Σ_k clip(w_k − w, C)) / n + N(0, (z · C / n)²) per coordinate, uniform
  weights over the n sites of the federation (``weighting`` does not exist here: the noise is
  calibrated to a uniform average), noise from a stream of (seed, round);
* the released model: by default the *last* round's (``select_round: last``), so the tested model is a
  function of the private sequence of global models only. ``best`` picks the round with the best mean
  validation Dice as FedAvg does: that choice reads the sites' validation data without noise, so it
  is outside the guarantee (a small, data-dependent choice among T rounds, but not covered);
* no site keeps or uploads a model of its own (``eval.local_models`` is ignored: the sites' best local
  models would leave the sites unclipped and un-noised);
* a network with buffers is refused before any work: BatchNorm's running statistics are computed
  from the sites' data and averaged as they are, outside the clipping and the noise (use
  ``model.norm: instance``, the default);
* reporting: summary.json ``privacy`` (ε at ``delta`` after the run's rounds, the parameters),
  round_metrics.csv ``epsilon`` (site ``server``: ε spent up to that round) and ``update_norm`` per
  site (before clipping: what to choose C from; a diagnostic, not private).

Why a method and not a ``dp`` option of every FedAvg-family method: a method here says only what
differs from FedAvg, and this is FedAvg with another merge; as its own name it runs next to
``fedavg`` in one run (the report shows the cost of privacy in Dice side by side), and the methods
whose merge is their own (FedAdam, FedNova, SCAFFOLD, the FedSM family, ...) cannot be given a
``dp`` option that their merge would silently ignore.

Options (``methods.fedavg-dp``): ``noise_multiplier`` z = 1.0 (0 = no noise, ε = ∞), ``clip_norm`` C =
1.0 (None = no clipping, only with z = 0: then the merge is FedAvg's uniform average, bit for bit),
``delta`` = 1e-5, ``select_round`` = last and FedAvg's ``local_steps``.

The default C is read off measured update norms (McMahan et al. and Andrew et al. 2019 clip near
the median norm): the default UNet (660,570 parameters) on the demo's federation (synthetic-retina,
6 sites, scale 0.25, Adam 1e-3, one epoch per round) has per-site norms ‖w_k − w‖ with median 2.7 in
round 1, 1.5 in round 2 and 1.1-1.2 in rounds 3-4, the largest site's 3-5.4 (and CFL's benchmark run:
the largest 2.1-5.4 over 30 rounds); so C = 1 clips about half the sites once training settles and
the large early updates always. C is a norm of the whole network's update: another network or
learning rate needs its own (``round_metrics.csv`` ``update_norm``; ``benchmarks/privacy.py``).
Whatever C is, the noise norm over the network relative to C is z · √d / n (d parameters, n sites):
with 6 sites and d ≈ 0.66M that is about 135 · z, so site-level central DP on a handful of hospitals
costs the model at any useful ε (``benchmarks/results/privacy.md``).
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator
from torch import nn

from fedseg.algorithms.aggregate import weighted_average
from fedseg.algorithms.fedavg import BudgetOptions, FedAvgClient, FedAvgServer
from fedseg.algorithms.prefixes import MODEL
from fedseg.algorithms.privacy import accounting, epsilon, noise_generator, private_mean
from fedseg.algorithms.registry import AlgorithmSpec
from fedseg.engine.context import ClientContext, Task
from fedseg.engine.messages import Message, weights_of

SERVER_ROW = "server"  # the site column of the run-level rows in round_metrics.csv (epsilon)


class FedAvgDPOptions(BudgetOptions):
    """Central DP on FedAvg's merge (see the module docstring)."""

    noise_multiplier: float = Field(
        1.0, ge=0, description="z: noise std on the sum of clipped updates = z * clip_norm (0: no noise, epsilon inf)"
    )
    clip_norm: float | None = Field(
        1.0,
        gt=0,
        description="C: each site's update w_k - w is scaled to L2 norm <= C (all float entries together); "
        "None: no clipping (only with noise_multiplier 0)",
    )
    delta: float = Field(1e-5, gt=0, lt=1, description="the delta epsilon is reported at")
    select_round: Literal["last", "best"] = Field(
        "last",
        description="the tested model: the last round's (covered by the guarantee) or the best round on "
        "validation Dice (that choice reads the sites' validation data without noise: not covered)",
    )

    @model_validator(mode="after")
    def _noise_needs_clipping(self) -> FedAvgDPOptions:
        if self.clip_norm is None and self.noise_multiplier > 0:
            raise ValueError(
                f"noise_multiplier={self.noise_multiplier} needs a clip_norm: the noise std is "
                "noise_multiplier * clip_norm / sites (clip_norm: null only with noise_multiplier: 0)"
            )
        return self

    def rounds_dependency(self) -> str | None:
        """``select_round: last``: only the last round may be selected, so the shorter run's last round was."""
        if self.select_round == "last":
            return (
                "select_round: last makes only round fl.rounds selectable, and the shorter run selected its last "
                "round (a longer run could not)"
            )
        return None

    def check_task(self, task: Task, algorithm: str) -> None:
        """Refuse a network with buffers (checked before any work): they would be averaged unprotected."""
        model = task.new_model()
        buffers = sorted(set(weights_of(model)) - {name for name, _ in model.named_parameters()})
        if buffers:
            raise ValueError(buffer_problem(algorithm, task.cfg.model.norm, buffers))


def buffer_problem(algorithm: str, norm: str, buffers: list[str]) -> str:
    return (
        f"{algorithm}: the network has {len(buffers)} float buffers (e.g. {buffers[0]}; model.norm={norm!r}): "
        "statistics computed from the sites' data (BatchNorm's running mean and variance) that would be averaged "
        "without clipping or noise, outside the privacy guarantee; use model.norm: instance (the default)"
    )


class FedAvgDPServer(FedAvgServer):
    """FedAvg's server with the private merge (:func:`fedseg.algorithms.privacy.private_mean`)."""

    options: FedAvgDPOptions  # this method's options (``FedAvgServer.options``)

    KEEPS_LOCAL_MODELS = False  # a site's own model would leave it unclipped and un-noised
    NO_CLIENT_SAMPLING = "its noise and privacy accounting assume every site in every round"

    def __init__(self, engine, task: Task, options: FedAvgDPOptions):
        super().__init__(engine, task, options)
        if self.buffers:  # check_task refuses these before any work; this guards a direct use
            raise ValueError(buffer_problem(engine.algorithm, task.cfg.model.norm, self.buffers))
        self.norms: dict[str, float] = {}  # the last round's update norms before clipping, per site

    def aggregate(self, replies: dict[str, Message]) -> None:
        opts = self.options
        models = {s: r.group(MODEL) for s, r in replies.items()}
        num_sites = len(self.engine.sites)
        merged = private_mean(
            self.global_weights,
            models,
            opts.clip_norm,
            opts.noise_multiplier,
            num_sites,
            noise_generator(self.task.cfg.seed, num_sites, self.engine.round),
        )
        self.norms = merged.norms
        if opts.clip_norm is None and opts.noise_multiplier == 0:  # no mechanism: FedAvg's uniform average
            self.global_weights = weighted_average(list(models.values()), [1.0] * len(models))
        else:
            self.global_weights = merged.weights

    def average_buffers(self, replies: dict[str, Message]) -> None:
        """Nothing to average: a network with buffers is refused."""

    def selectable(self, rnd: int) -> bool:
        return self.options.select_round == "best" or rnd == self.task.cfg.fl.rounds

    def convergence_scores(self, validated: dict[int, float]) -> dict[int, float]:
        """The whole curve: ``select_round: last`` fixes which round is tested, not what a round's score means (its
        selected round is always the last, so whether validation had plateaued decides)."""
        return dict(validated)

    def round_metrics(self) -> list[dict]:
        """ε spent up to this round (site ``server``) and each site's update norm before clipping."""
        opts = self.options
        spent = epsilon(opts.noise_multiplier, self.engine.round, opts.delta)
        rows = [{"site": SERVER_ROW, "metric": "epsilon", "value": spent}]
        return rows + [{"site": s, "metric": "update_norm", "value": n} for s, n in self.norms.items()]

    def summary_fields(self) -> dict:
        """summary.json's ``privacy`` entry: the accounting of the run's rounds."""
        opts = self.options
        rounds = self.task.cfg.fl.rounds
        privacy = accounting(opts.noise_multiplier, opts.clip_norm, opts.delta, rounds, len(self.engine.sites))
        return {"privacy": {**privacy, "select_round": opts.select_round}}


class FedAvgDPClient(FedAvgClient):
    """FedAvg's client without kept local models (they would leave the site unprotected)."""

    def keep_best_local(self, model: nn.Module, ctx: ClientContext) -> None:
        return None


SPECS = (
    AlgorithmSpec(
        "fedavg-dp",
        "FedAvg (central DP)",
        FedAvgDPServer,
        FedAvgDPClient,
        "FedAvg with central DP: per-site update clipping + Gaussian noise on the uniform average, (ε, δ) reported",
        FedAvgDPOptions,
        on_secure_aggregation=(
            "its server clips each site's update before adding the noise (central DP needs every update)"
        ),
    ),
)
