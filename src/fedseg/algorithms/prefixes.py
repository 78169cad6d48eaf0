"""Names shared by the methods' messages and client state stores."""

from __future__ import annotations

MODEL = "model"  # message prefix of model weights
OPT = "opt"  # client-state prefix of optimizer moments
GRAD_SCALE = (
    "grad_scale"  # client-state prefix of fp16 GradScaler states, ``grad_scale/<optimizer key>``: (scale, tracker)
)
