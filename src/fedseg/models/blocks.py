"""The blocks of a segmentation network, in the order the input flows through them.

Partial model sharing (FedPer keeps the *last* blocks private, LG-FedAvg the *first*; FeTS 2022
Sec. 3.3.5) counts "layers" as these blocks. A block is a module path; every floating-point
entry of the network's state (parameters and buffers, e.g. BatchNorm statistics) belongs to
exactly one block: the block whose path is the longest prefix of the entry's name.

* MONAI ``UNet`` (2D/3D, any depth, with or without residual units): the encoder layers from the
  input down, the bottom layer, then the decoder layers back up to the output layer. With
  ``channels = (16, 32, 64, 128, 256)``: 4 down, 1 bottom, 4 up = 9 blocks, e.g. ``model.0`` (first
  down), ``model.1.submodule.0`` (second down), ..., ``model.1.submodule.2`` (second-to-last up),
  ``model.2`` (last up, producing the logits). MONAI nests each level as
  ``Sequential(down, SkipConnection(Sequential(...)), up)``; the walk follows that nesting.
* MONAI ``DynUNet``: ``input_block``, ``downsamples.0`` ... , ``bottleneck``, ``upsamples.0`` (the
  deepest) ..., ``output_block`` (and ``deep_supervision_heads.<i>`` last, if any). With 4 filter
  levels: 8 blocks (the two input convolutions are one block, as is each transposed convolution
  with the convolutions after it).
"""

from __future__ import annotations

from monai.networks.layers.simplelayers import SkipConnection
from monai.networks.nets import DynUNet, UNet
from torch import nn

from fedseg.models.state import float_state


def network_blocks(model: nn.Module) -> list[str]:
    """Module paths of ``model``'s blocks in forward order (see the module docstring)."""
    if isinstance(model, UNet):
        assert isinstance(model.model, nn.Sequential)
        return _unet_blocks(model.model, "model")
    if isinstance(model, DynUNet):
        names = [name for name, _ in model.named_children()]
        blocks = ["input_block"]
        blocks += [f"downsamples.{i}" for i in range(len(model.downsamples))]
        blocks += ["bottleneck"]
        blocks += [f"upsamples.{i}" for i in range(len(model.upsamples))]
        blocks += ["output_block"]
        if "deep_supervision_heads" in names:
            blocks += [f"deep_supervision_heads.{i}" for i in range(len(model.deep_supervision_heads))]
        return blocks
    raise ValueError(f"no block structure known for {type(model).__name__} (known: MONAI UNet, DynUNet)")


def _unet_blocks(level: nn.Sequential, path: str) -> list[str]:
    """``level`` = ``Sequential(down, SkipConnection(inner), up)``; ``inner`` is the next level or the bottom layer."""
    skip = level[1]
    assert isinstance(skip, SkipConnection), f"{path}.1 is a {type(skip).__name__}, not MONAI's SkipConnection"
    inner = skip.submodule
    inner_path = f"{path}.1.submodule"
    if isinstance(inner, nn.Sequential) and len(inner) == 3 and isinstance(inner[1], SkipConnection):
        middle = _unet_blocks(inner, inner_path)
    else:
        middle = [inner_path]
    return [f"{path}.0", *middle, f"{path}.2"]


def block_of(entry: str, blocks: list[str]) -> str:
    """The block a state entry (``"model.0.conv.weight"``) belongs to: the longest prefix path."""
    owners = [b for b in blocks if entry.startswith(b + ".")]
    if not owners:
        raise ValueError(f"state entry {entry!r} belongs to no block of {blocks}")
    return max(owners, key=len)


def entries_by_block(model: nn.Module) -> dict[str, list[str]]:
    """``{block: [state entry names]}`` for every floating-point state entry, blocks in forward order."""
    blocks = network_blocks(model)
    grouped: dict[str, list[str]] = {b: [] for b in blocks}
    for name in float_state(model):
        grouped[block_of(name, blocks)].append(name)
    return grouped
