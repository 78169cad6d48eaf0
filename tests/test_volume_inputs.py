"""On the volume path (``data.volume.patch_size`` set) the computations that run a model on training data
outside the Trainer feed it what it trains on — patches (or sliding windows of patch size) — never the
fixed-size resized cube: Auto-FedAvg's beta steps, q-FedAvg's F_k, Per-FedAvg's second batch, FedSM-extra's
Eq. (1) labels and FedPIDAvg's validation loss (Eq. 19: sliding windows over each whole case). A forward
pre-hook on the real MONAI UNet records the input shapes while the computation runs (issue 27, item 5)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import pytest
import torch
from monai.networks.nets import UNet
from torch.nn.modules.module import register_module_forward_pre_hook

from fedseg.algorithms import get_algorithm
from fedseg.algorithms.autofedavg.method import AutoFedAvgClient
from fedseg.algorithms.fedpidavg import FedPIDAvgClient
from fedseg.algorithms.fedsm.extra import FedSMExtraClient
from fedseg.algorithms.fedsm.personalize import FirstOrderMAML
from fedseg.algorithms.qfedavg import QFedAvgClient
from fedseg.data.federation import Case, Federation, Regions, Site
from fedseg.engine.simulator import Simulator
from fedseg.run import prepare
from volume_cases import boxed_case

torch.set_num_threads(1)
TUMOUR = Regions.from_mapping({"tumour": [1, 2, 4]})
CUBE, PATCH = (32, 32, 32), (8, 8, 8)  # data.image_size = 32 (the resized view), data.volume.patch_size = 8


@pytest.fixture(scope="module")
def tumours() -> Federation:
    """2 sites x 4 cases, each case larger than a patch and of its own size."""
    sites = []
    for k, name in enumerate(("a", "b")):
        cases = [
            Case.from_arrays(f"{name}{i}", *boxed_case((14 + i, 16, 12 + k), 10 * k + i, 4), spacing=(1.0, 1.0, 1.0))
            for i in range(4)
        ]
        sites.append(Site(name, cases))
    return Federation("tumours", "3d", 2, TUMOUR, sites)


def _cfg(tiny_config, name: str, rounds: int = 1, **method):
    return tiny_config(
        algorithms=[name],
        data={
            "image_size": CUBE[0],
            "normalize": "zscore_foreground",
            "volume": {"patch_size": PATCH[0], "foreground_oversample": 0.5, "sw_batch_size": 2},
        },
        train={"batch_size": 2, "dice_smooth": 1.0},
        fl={"rounds": rounds},
        eval={"hd95": False, "local_models": False},
        methods={name: method},
    )


def _run(cfg, fed: Federation, rounds: int) -> None:
    """``rounds`` rounds of the config's one method in the in-process simulator."""
    name = cfg.algorithms[0]
    prep = prepare(cfg, fed)
    spec = get_algorithm(name)
    options = spec.parse_options(cfg.methods.get(name))
    engine = Simulator(name, spec.client(), prep.site_data, prep.task, options)
    server = spec.server(engine, prep.task, options)
    for rnd in range(1, rounds + 1):
        engine.round = rnd
        server.run_round(rnd)


@contextmanager
def unet_inputs(monkeypatch, cls, method: str) -> Iterator[list[tuple[int, ...]]]:
    """The spatial shapes of every input the MONAI UNet gets while ``cls.method`` runs."""
    shapes: list[tuple[int, ...]] = []
    inside = [False]
    original = getattr(cls, method)

    def wrapped(*args, **kwargs):
        inside[0] = True
        try:
            return original(*args, **kwargs)
        finally:
            inside[0] = False

    def hook(module, args):
        if inside[0] and isinstance(module, UNet):
            shapes.append(tuple(args[0].shape[2:]))

    monkeypatch.setattr(cls, method, wrapped)
    handle = register_module_forward_pre_hook(hook)
    try:
        yield shapes
    finally:
        handle.remove()


def test_autofedavg_learns_beta_on_patches(monkeypatch, tiny_config, tumours):
    cfg = _cfg(tiny_config, "autofedavg-n-softmax", t0=1, learn_steps=2)
    with unet_inputs(monkeypatch, AutoFedAvgClient, "on_learn_weights") as shapes:
        _run(cfg, tumours, 1)
    assert len(shapes) == 2 * 2  # 2 sites x 2 beta steps
    assert set(shapes) == {PATCH}


def test_qfedavg_loss_is_taken_on_patches(monkeypatch, tiny_config, tumours):
    cfg = _cfg(tiny_config, "qfedavg")
    with unet_inputs(monkeypatch, QFedAvgClient, "on_loss") as shapes:
        _run(cfg, tumours, 1)
    assert shapes and set(shapes) == {PATCH}


def test_perfedavg_second_batch_is_patches(monkeypatch, tiny_config, tumours):
    cfg = _cfg(tiny_config, "fedsm", personalization="perfedavg", selector_width=0.0625, average_selector_moments=False)
    with unet_inputs(monkeypatch, FirstOrderMAML, "after_backward") as shapes:
        _run(cfg, tumours, 1)
    assert shapes and set(shapes) == {PATCH}


def test_fedsm_extra_labels_come_from_sliding_windows(monkeypatch, tiny_config, tumours):
    cfg = _cfg(
        tiny_config,
        "fedsm-extra",
        rounds=2,
        extra_rounds=1,
        extra_on_top=False,
        selector_width=0.0625,
        average_selector_moments=False,
    )
    labels = []
    original = FedSMExtraClient.on_install

    def keep(self, msg, ctx):
        reply = original(self, msg, ctx)
        labels.append((len(ctx.data.train), ctx.state["extra_labels/value"].clone()))
        return reply

    monkeypatch.setattr(FedSMExtraClient, "on_install", keep)
    with unet_inputs(monkeypatch, FedSMExtraClient, "on_install") as shapes:
        _run(cfg, tumours, 2)
    assert shapes and set(shapes) <= {PATCH}  # windows of the patch size (sw_batch_size 2 per forward)
    assert len(labels) == 2  # one install per site
    for n, y in labels:
        assert y.shape == (n,) and y.dtype == torch.int64 and int(y.max()) <= 2  # one label per case, K + 1 = 3


def test_fedpidavg_validation_loss_comes_from_sliding_windows(monkeypatch, tiny_config, tumours):
    cfg = _cfg(tiny_config, "fedpidavg")
    replies = []
    original = FedPIDAvgClient.after_fit

    def keep(self, model, stats, msg, ctx):
        reply = original(self, model, stats, msg, ctx)
        replies.append((len(ctx.data.val), reply.meta))
        return reply

    monkeypatch.setattr(FedPIDAvgClient, "after_fit", keep)
    with unet_inputs(monkeypatch, FedPIDAvgClient, "after_fit") as shapes:
        _run(cfg, tumours, 1)
    assert len(replies) == 2 and all(n > 0 for n, _ in replies)  # every site validates
    assert shapes and set(shapes) <= {PATCH}  # windows of the patch size over the whole case, never the cube
    assert sum(meta["val_batches"] for _, meta in replies) == len(shapes)  # the forward passes it reports
    assert all(meta["val_loss"] > 0 for _, meta in replies)
