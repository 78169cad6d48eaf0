"""FedBN (Li et al., ICLR 2021, "FedBN: Federated Learning on Non-IID Features via Local Batch Normalization"):
each site keeps its normalization layers private; everything else is averaged as in FedAvg.

A partial-sharing method (``fedseg.algorithms.partial``; FeTS 2022 names it with FedPer and LG-FedAvg in its
Sec. 2.2, "retaining local ... the batch normalization parameters", while its Sec. 3.3.5 benchmarks only
those two): only the rule for the private entries w_l is its own. w_l is every floating-point state entry
owned by a normalization module (``NORM_TYPES``: torch's
``BatchNorm1d/2d/3d``, ``SyncBatchNorm``, ``InstanceNorm1d/2d/3d``, ``GroupNorm`` and ``LayerNorm``, the
modules MONAI's ``Norm`` factory builds for ``model.norm``, subclasses included): its affine ``weight`` and
``bias`` and its running statistics ``running_mean`` and ``running_var`` (the integer ``num_batches_tracked``
never travels in fedseg: no integer entry does). The paper keeps the BN layers' affine parameters and
statistics local (its Alg. 1); an instance, group or layer norm with entries is treated alike.

What differs from FedAvg is then ``fedseg.algorithms.partial``'s: only w_g travels, down and up (the ledger
counts it), only w_g is averaged (sample-weighted, ``weighting`` as FedAvg); each site keeps its w_l in its
state store from one round to the next (the common initialization before its first round); site k's model is
w_g with its own w_l, validated and tested as a per-site model (``fedseg.algorithms.persite``). The run records
the private share (``private_fraction``: private parameters / all; running statistics are buffers, not
counted) in summary.json and in its log.

A network without normalization entries would make FedBN FedAvg: it is refused before any work. That is the
default ``model.norm: instance`` (MONAI's instance norm has no affine weights and no running statistics);
``model.norm: batch`` (BatchNorm, the paper's) is the setting to use: ``model.norm`` takes ``instance`` or
``batch`` (MONAI's group and layer norms need arguments a name cannot give).
"""

from __future__ import annotations

from typing import Any

from torch import nn

from fedseg.algorithms.partial import PartialOptions, PartialSharingClient, PartialSharingServer
from fedseg.algorithms.registry import AlgorithmSpec
from fedseg.engine.context import Task
from fedseg.models.state import float_state

NORM_TYPES: tuple[type[nn.Module], ...] = (
    nn.BatchNorm1d,
    nn.BatchNorm2d,
    nn.BatchNorm3d,
    nn.SyncBatchNorm,
    nn.InstanceNorm1d,
    nn.InstanceNorm2d,
    nn.InstanceNorm3d,
    nn.GroupNorm,
    nn.LayerNorm,
)


def norm_entries(model: nn.Module) -> dict[str, list[str]]:
    """``{norm module path: [its float state entries]}`` for the normalization modules (``NORM_TYPES``) that own
    any (affine weights, running statistics), in module order; a module registered twice (DynUNet's
    ``skip_layers``) is found under the name ``float_state`` keeps."""
    norms = {name for name, m in model.named_modules(remove_duplicate=False) if isinstance(m, NORM_TYPES)}
    grouped: dict[str, list[str]] = {}
    for entry in float_state(model):
        owner = entry.rpartition(".")[0]
        if owner in norms:
            grouped.setdefault(owner, []).append(entry)
    return grouped


def no_norm_problem(model: nn.Module, task: Task) -> str:
    """The refusal of a network without normalization entries (one line, after ``methods.fedbn: ``)."""
    kinds = sorted({type(m).__name__ for m in model.modules() if isinstance(m, NORM_TYPES)})
    has = f"its {'/'.join(kinds)} layers have" if kinds else "it has no normalization layers, so"
    return (
        f"the {task.cfg.model.name} (model.norm={task.cfg.model.norm!r}) has nothing for FedBN to keep on the sites: "
        f"{has} no affine weights and no running statistics, and FedBN would be FedAvg; set model.norm=batch "
        "(BatchNorm, as in the FedBN paper)"
    )


class FedBNOptions(PartialOptions):
    """FedBN: the normalization layers' parameters and running statistics stay on each site (no option of its own);
    FedAvg's ``weighting``, ``local_steps`` and ``aggregator`` over the other entries."""

    def private_names(self, model: nn.Module, task: Task) -> frozenset[str]:
        """Every entry of a normalization module (``norm_entries``); a ValueError if there is none."""
        private = frozenset(name for entries in norm_entries(model).values() for name in entries)
        if not private:
            raise ValueError(no_norm_problem(model, task))
        return private

    def private_what(self, model: nn.Module) -> str:
        grouped = norm_entries(model)
        kinds = "/".join(sorted({type(model.get_submodule(n)).__name__ for n in grouped}))
        return f"the weights and running statistics of the {len(grouped)} normalization layers ({kinds})"

    def private_record(self, model: nn.Module) -> dict[str, Any]:
        """``norm_layers``: how many normalization modules stay private; ``private_buffers``: the floats of their
        running statistics (not in ``private_parameters``)."""
        grouped = norm_entries(model)
        params = {name for name, _ in model.named_parameters()}
        state = float_state(model)
        buffers = sum(state[e].numel() for entries in grouped.values() for e in entries if e not in params)
        return {"norm_layers": len(grouped), "private_buffers": buffers}


SPECS = (
    AlgorithmSpec(
        "fedbn",
        "FedBN",
        PartialSharingServer,
        PartialSharingClient,
        "FedBN (Li et al. 2021): the normalization layers' parameters and running statistics stay on each site; "
        "needs model.norm: batch",
        FedBNOptions,
        kind="personalized",
        on_secure_aggregation=None,
    ),
)
