"""Options shared by ``fedseg run`` and ``fedseg flower local`` whose help text needs the algorithm registry.

The registry imports torch (seconds), so its names are filled into the ``--algorithms`` help only when a
help page is printed (``AlgorithmsHelp``), not on every start of the command line.
"""

from __future__ import annotations

import typer
from typer.core import TyperCommand

ALGORITHMS_PLACEHOLDER = "{algorithms}"
FLOWER_ALGORITHMS_PLACEHOLDER = "{flower_algorithms}"
DEVICE_HELP = "torch device, overriding the config's `device` (e.g. cpu, cuda, cuda:1)"
THREADS_HELP = "torch intra-op threads, overriding the config's `threads`"
TRACK_HELP = (
    "experiment tracker, overriding the config's `tracking`: tensorboard (OUT/tb/<algorithm>/), mlflow "
    "(OUT/mlruns, or the config's `tracking_uri`; both need pip install 'fedseg\\[tracking]') or wandb (offline "
    "runs in OUT/wandb/, upload with `wandb sync OUT/wandb/offline-run-*`; needs pip install 'fedseg\\[wandb]'); "
    "repeatable or comma-separated"
)


def algorithm_names(flower: bool = False) -> str:
    """The registered algorithm names, comma-separated, in registry order (``flower``: those that run on Flower)."""
    from fedseg.algorithms import ALGORITHMS

    return ", ".join(name for name, spec in ALGORITHMS.items() if not (flower and spec.on_flower))


class AlgorithmsHelp(TyperCommand):
    """A command whose options' help may contain ``{algorithms}`` / ``{flower_algorithms}``: replaced by the
    registered names (those that run on Flower) when the help page is printed."""

    def format_help(self, ctx, formatter) -> None:
        for param in self.params:
            text = getattr(param, "help", None)
            if text and ALGORITHMS_PLACEHOLDER in text:
                text = text.replace(ALGORITHMS_PLACEHOLDER, algorithm_names())
            if text and FLOWER_ALGORITHMS_PLACEHOLDER in text:
                text = text.replace(FLOWER_ALGORITHMS_PLACEHOLDER, algorithm_names(flower=True))
            if text != getattr(param, "help", None):
                param.help = text
        super().format_help(ctx, formatter)


def device_option():
    return typer.Option(None, "--device", help=DEVICE_HELP)


def threads_option():
    return typer.Option(None, "--threads", min=1, help=THREADS_HELP)


def track_option():
    return typer.Option([], "--track", help=TRACK_HELP)
