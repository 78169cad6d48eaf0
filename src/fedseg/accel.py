"""The device switches of training and inference (``train.amp``, ``train.channels_last``,
``train.cudnn_benchmark``, ``train.compile``), resolved once for a device.

What holds: on the CPU the defaults resolve to float32, contiguous tensors and no compilation, so CPU
results are bit-identical to a run without these switches. On CUDA ``auto`` means bf16 autocast and, for 2D
networks, channels-last weights/inputs (3D stays contiguous: ``channels_last_3d`` made the ``fets`` DynUNet's
bf16 step 1.44x slower on an H100, ``benchmarks/results/accel_gpu_h100_more.json``); GPU numbers then differ
from float32 within the precision of bf16.

Where they act: :func:`prepare_model` where a network is built for the device (``Task.new_model``:
weights' memory format, cuDNN autotuning, the precision inference runs at), :class:`fedseg.train.Trainer`
(autocast around the forward pass, GradScaler for fp16, inputs' memory format, compilation) and the
forward passes of ``fedseg.evaluate`` (:func:`inference_autocast`).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch
from torch import nn

from fedseg.config import TrainConfig

AMP_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}
_AMP_ATTR = "_fedseg_amp"  # the precision a network prepared by prepare_model runs inference at
_COMPILED_ATTR = "_fedseg_compiled"


@dataclass(frozen=True)
class Accel:
    """The effective switches for one device: ``amp`` the autocast dtype (None = float32); channels-last memory
    order for 2D (4-D tensors) and 3D (5-D tensors) networks."""

    amp: torch.dtype | None
    channels_last_2d: bool
    channels_last_3d: bool
    cudnn_benchmark: bool
    compile: bool

    def record(self) -> dict[str, object]:
        """The effective values, for ``summary.json`` provenance (``amp``: bf16 | fp16 | off)."""
        names = {dtype: name for name, dtype in AMP_DTYPES.items()}
        return {
            "amp": names[self.amp] if self.amp is not None else "off",
            "channels_last_2d": self.channels_last_2d,
            "channels_last_3d": self.channels_last_3d,
            "cudnn_benchmark": self.cudnn_benchmark,
            "compile": self.compile,
        }


def resolve(cfg: TrainConfig, device: torch.device | str) -> Accel:
    """``cfg``'s switches on ``device``: ``auto`` = bf16 autocast and 2D channels-last on CUDA, off elsewhere;
    cuDNN autotuning only on CUDA."""
    cuda = torch.device(device).type == "cuda"
    amp = ("bf16" if cuda else "off") if cfg.amp == "auto" else cfg.amp
    on = cfg.channels_last == "on"
    return Accel(
        AMP_DTYPES.get(amp), on or (cfg.channels_last == "auto" and cuda), on, cuda and cfg.cudnn_benchmark, cfg.compile
    )


def autocast(device: torch.device, dtype: torch.dtype | None) -> contextlib.AbstractContextManager:
    """``torch.autocast`` on ``device``'s type at ``dtype``; a no-op context for None (float32)."""
    if dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(device.type, dtype=dtype)


def memory_format(tensor: torch.Tensor, accel: Accel) -> torch.Tensor:
    """``tensor`` in channels-last order if it is 4-D and ``accel.channels_last_2d`` (``channels_last``) or 5-D
    and ``accel.channels_last_3d`` (``channels_last_3d``); otherwise ``tensor`` itself. Values unchanged."""
    if tensor.dim() == 4 and accel.channels_last_2d:
        return tensor.contiguous(memory_format=torch.channels_last)
    if tensor.dim() == 5 and accel.channels_last_3d:
        return tensor.contiguous(memory_format=torch.channels_last_3d)
    return tensor


def prepare_model(model: nn.Module, accel: Accel) -> nn.Module:
    """``model`` (already on its device) made ready for ``accel``, in place: 4-D/5-D weights channels-last,
    cuDNN autotuning switched on, and the inference precision recorded on the module (read by
    :func:`inference_autocast`; a deep copy keeps it). Returns ``model``."""
    if accel.channels_last_2d or accel.channels_last_3d:
        for tensor in (*model.parameters(), *model.buffers()):
            tensor.data = memory_format(tensor.data, accel)
    if accel.cudnn_benchmark:
        torch.backends.cudnn.benchmark = True
    setattr(model, _AMP_ATTR, accel.amp)
    return model


def inference_autocast(model: nn.Module, device: torch.device) -> contextlib.AbstractContextManager:
    """The autocast context a forward pass of ``model`` on ``device`` runs in: the precision
    :func:`prepare_model` recorded on ``model`` or its first submodule that has one (a FedSM super model's
    candidates), float32 for a network never prepared (e.g. one loaded for deployment)."""
    dtype = next((getattr(m, _AMP_ATTR) for m in model.modules() if hasattr(m, _AMP_ATTR)), None)
    return autocast(device, dtype)


def compile_once(model: nn.Module) -> None:
    """``torch.compile`` ``model`` in place (``nn.Module.compile``: parameters and state-dict names
    unchanged) unless it is already. A deep copy of a compiled network would still run the original's compiled
    forward: fedseg deep-copies only ``Task.new_model``'s template, which is never compiled."""
    if not getattr(model, _COMPILED_ATTR, False):
        model.compile()
        setattr(model, _COMPILED_ATTR, True)
