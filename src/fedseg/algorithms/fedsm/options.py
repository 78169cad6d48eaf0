"""The FedSM family's options (config ``methods.<name>``): the selector's (``SelectorOptions``, every variant)
and the threshold routing's (``FedSMOptions``, ``fedsm``); the personalization's come from ``personalize``."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator, model_validator

from fedseg.algorithms.fedavg import FedAvgOptions
from fedseg.algorithms.fedsm.personalize import PersonalizationOptions
from fedseg.engine.context import Task

DEFAULT_GRID = (0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 0.99, 1.0)


class SelectorOptions(FedAvgOptions, PersonalizationOptions):
    """Options shared by the FedSM variants (config ``methods.<name>``); ``weighting`` and
    ``local_steps`` as for FedAvg (the models' local budget; the selector trains ``selector_steps``);
    ``personalization``, ``lam`` and each strategy's hyperparameters from ``PersonalizationOptions``."""

    OWN_MERGE = "the FedSM family merges the global model, the selector and the personalized models itself"

    selector_width: float = Field(0.25, gt=0, description="VGG-11 channel multiplier (1 = VGG-11; 0.25: CPU default)")
    selector_input_size: int | None = Field(
        None,
        ge=1,
        description="side the selector resamples images to (area mean); None = model input. A smaller side is "
        "cheaper: on fets-cpu (3D, 48^3) 24 made a FedSM round 5.3x faster with the same test Dice; the fets presets "
        "set it",
    )
    selector_norm: Literal["batch", "instance"] = Field(
        "instance", description="selector normalization layers (see module doc)"
    )
    selector_lr: float | None = Field(
        None, gt=0, description="selector learning rate eta_s; None = train.lr (scaled per round by train.lr_schedule)"
    )
    average_selector_moments: bool = Field(
        True, description="send the selector's optimizer moments with w_s and average them (extra traffic, counted)"
    )
    selector_weighting: Literal["samples", "uniform"] = Field(
        "uniform",
        description="how the selector and its moments merge: uniform (default; every site's label weighs the same) "
        "or samples (the paper's n_k/n, Alg. 1: with one label per site it favours the largest sites — the selector "
        "collapsed to them on synthetic-prostate)",
    )
    selector_steps: int | None = Field(
        10,
        ge=1,
        description="local selector steps per site and round (default 10: every site's label gets the same pull); "
        "None = the round's local budget, as the models (the paper: steps grow with n_k)",
    )

    @model_validator(mode="after")
    def _selector_side(self) -> SelectorOptions:
        side = self.selector_input_size
        if side is not None and (problem := self.side_problem(side, f"selector_input_size {side}")) is not None:
            raise ValueError(problem)
        return self

    def side_problem(self, side: int, setting: str) -> str | None:
        """Why the selector cannot train on images of ``side`` voxels per axis (``setting``: what gives that side,
        as the line names it), or None: with instance norm its last block needs more than one voxel."""
        from fedseg.algorithms.fedsm.selector import LAST_BLOCK_STRIDE, MIN_INSTANCE_SIDE

        if self.selector_norm != "instance" or side >= MIN_INSTANCE_SIDE:
            return None
        return (
            f"{setting} leaves the selector's last block one voxel per axis (after four 2x pools: "
            f"ceil({side} / {LAST_BLOCK_STRIDE}) = 1), which instance norm cannot normalize: give "
            f"selector_input_size at least {MIN_INSTANCE_SIDE}, or selector_norm: batch"
        )

    def check_task(self, task: Task, algorithm: str) -> None:
        """Before any work: the selector's input side (``selector_input_size``, else ``data.image_size``) fits it."""
        super().check_task(task, algorithm)
        side = task.cfg.data.image_size
        setting = f"data.image_size {side} (the selector's input: selector_input_size is unset)"
        if self.selector_input_size is None and (problem := self.side_problem(side, setting)) is not None:
            raise ValueError(f"methods.{algorithm}: {problem}")

    def check_sites(self, num_sites: int, algorithm: str) -> None:
        """FedSM needs K >= 2 sites (SoftPull averages the other K-1 personalized models, the selector
        chooses among sites). Called before any work (``AlgorithmSpec.check_sites``) and when a server starts."""
        if num_sites < 2:
            raise ValueError(
                f"{algorithm} needs at least 2 sites (SoftPull, Eq. 11, averages the other K-1 personalized "
                f"models and the selector chooses among sites); this federation has {num_sites}"
            )


class FedSMOptions(SelectorOptions):
    """``fedsm``: Algorithm 1 training, Algorithm 2 inference with threshold gamma."""

    gamma_grid: tuple[float, ...] = Field(DEFAULT_GRID, min_length=1, description="thresholds tried on validation data")
    val_gamma: float | None = Field(
        None, ge=0, le=1, description="fixed gamma for per-round validation; None = best on the grid"
    )

    @field_validator("gamma_grid")
    @classmethod
    def _grid(cls, grid: tuple[float, ...]) -> tuple[float, ...]:
        if any(not 0.0 <= g <= 1.0 for g in grid):
            raise ValueError(f"every gamma must lie in [0, 1], got {list(grid)}")
        return tuple(sorted(set(grid)))
