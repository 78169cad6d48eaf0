"""Device switches (``train.amp``, ``channels_last``, ``cudnn_benchmark``, ``compile``: ``fedseg.accel``) and
background batch preparation (``train.loader_workers``): AMP resolves to float32 on the CPU by default, bf16
autocast runs on the CPU close to float32, and the training result does not depend on the number of workers
(Trainer level, on patches with augmentation, and one short run end to end)."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn
from typer.testing import CliRunner

from fedseg.accel import resolve
from fedseg.cli import app
from fedseg.config import BudgetConfig, TrainConfig
from fedseg.data.dataset import CaseSet
from fedseg.data.federation import Case, Federation, Regions, Site
from fedseg.engine.context import Task
from fedseg.evaluate.inference import predict_masks
from fedseg.run import prepare, run_experiment
from fedseg.train import Trainer
from volume_cases import boxed_case

CPU = torch.device("cpu")
TUMOUR = Regions.from_mapping({"tumour": [1, 2]})


def _images(n=8) -> CaseSet:
    g = torch.Generator().manual_seed(0)
    x = torch.rand(n, 3, 32, 32, generator=g)
    y = (torch.rand(n, 2, 32, 32, generator=g) > 0.5).float()
    return CaseSet("toy", [str(i) for i in range(n)], x, y)


@pytest.fixture(scope="module")
def volumes() -> Federation:
    """2 sites x 4 cases of their own sizes, each larger than an 8^3 patch."""
    sites = [
        Site(name, [Case.from_arrays(f"{name}{i}", *boxed_case((14 + i, 16, 12 + k), 10 * k + i, 1)) for i in range(4)])
        for k, name in enumerate(("a", "b"))
    ]
    return Federation("boxes", "3d", 2, TUMOUR, sites)


def _volume_cfg(tiny_config, **train):
    return tiny_config(
        algorithms=["fedavg"],
        data={"image_size": 16, "normalize": "zscore_foreground", "volume": {"patch_size": 8, "sw_batch_size": 2}},
        train={"batch_size": 2, "augment": {"enabled": True, "smooth_prob": 0.5, "noise_prob": 0.5}, **train},
        fl={"rounds": 1},
        eval={"hd95": False, "local_models": False},
    )


def test_defaults_resolve_to_float32_on_the_cpu_and_bf16_2d_channels_last_on_cuda():
    cfg = TrainConfig()
    assert resolve(cfg, "cpu").record() == {
        "amp": "off",
        "channels_last_2d": False,
        "channels_last_3d": False,
        "cudnn_benchmark": False,
        "compile": False,
    }
    cuda = resolve(cfg, "cuda:0")
    assert cuda.amp == torch.bfloat16 and cuda.channels_last_2d and not cuda.channels_last_3d
    assert cuda.cudnn_benchmark and not cuda.compile
    assert resolve(TrainConfig(amp="fp16", channels_last="off"), "cuda").record()["amp"] == "fp16"
    on = resolve(TrainConfig(amp="bf16", channels_last="on"), "cpu")
    assert on.channels_last_2d and on.channels_last_3d and on.amp == torch.bfloat16
    assert TrainConfig.model_validate({"amp": False, "channels_last": True}).channels_last == "on"  # YAML's on
    assert TrainConfig.model_validate({"amp": False}).amp == "off"


@pytest.mark.parametrize(
    ("setting", "line"),
    [
        ("train.amp=fp8", "train.amp must be 'auto', 'bf16', 'fp16' or 'off', got 'fp8'"),
        ("train.loader_workers=-1", "train.loader_workers must be at least 0, got -1"),
        ("train.channels_last=sometimes", "train.channels_last must be 'auto', 'on' or 'off', got 'sometimes'"),
    ],
)
def test_an_invalid_switch_gets_one_line(tmp_path, setting, line):
    result = CliRunner().invoke(app, ["run", "--preset", "demo", "--set", setting, "--out", str(tmp_path / "out")])
    assert result.exit_code != 0 and "Traceback" not in result.output
    lines = result.output.strip().splitlines()
    assert lines == [f"error: --set {line}"], result.output


def _conv_output_dtypes(model: nn.Module) -> set[torch.dtype]:
    dtypes: set[torch.dtype] = set()
    for m in model.modules():
        if isinstance(m, nn.Conv2d):
            m.register_forward_hook(lambda mod, args, out: dtypes.add(out.dtype))
    return dtypes


def test_bf16_autocast_on_the_cpu_trains_and_predicts_close_to_float32(tiny_config):
    data, losses, masks, dtypes = _images(), {}, {}, {}
    for amp in ("off", "bf16"):
        cfg = tiny_config(train={"amp": amp})
        model = Task(cfg, 2, 3, ("a", "b")).new_model()
        dtypes[amp] = _conv_output_dtypes(model)
        stats = Trainer(cfg.train, CPU).fit(model, data, torch.Generator().manual_seed(0))
        losses[amp] = stats.mean_loss
        masks[amp] = predict_masks(model, data.x, 4, 0.5, CPU)
    assert dtypes == {"off": {torch.float32}, "bf16": {torch.bfloat16}}  # training and inference both
    assert math.isfinite(losses["bf16"]) and abs(losses["bf16"] - losses["off"]) < 0.02
    assert masks["bf16"].dtype == torch.bool and (masks["bf16"] == masks["off"]).float().mean() > 0.9


def test_fp16_with_a_grad_scaler_runs_on_the_cpu(tiny_config):
    cfg = tiny_config(train={"amp": "fp16"})
    model = Task(cfg, 2, 3, ("a", "b")).new_model()
    before = [p.detach().clone() for p in model.parameters()]
    stats = Trainer(cfg.train, CPU).fit(
        model, _images(), torch.Generator().manual_seed(0), budget=BudgetConfig(unit="steps", amount=3)
    )
    assert math.isfinite(stats.mean_loss) and stats.steps == 3
    assert any(not torch.equal(a, b) for a, b in zip(before, model.parameters()))


def test_fp16_scaler_continues_from_the_scale_it_is_given(tiny_config):
    """A local run starts its GradScaler where the last one ended (not at 2^16): the scale and the growth
    tracker (steps since the last overflow) continue from ``grad_scale``."""
    cfg = tiny_config(train={"amp": "fp16"})
    runs = {}
    for carried in (None, (256.0, 7)):
        model = Task(cfg, 2, 3, ("a", "b")).new_model()
        runs[carried] = (
            Trainer(cfg.train, CPU)
            .fit(
                model,
                _images(),
                torch.Generator().manual_seed(0),
                budget=BudgetConfig(unit="steps", amount=3),
                grad_scale=carried,
            )
            .grad_scale
        )
    fresh, continued = runs[None], runs[(256.0, 7)]
    assert fresh is not None and continued is not None
    assert continued[0] <= 256.0 and fresh[0] != continued[0]  # from 256 (halved on an overflow), not 65536
    if continued[0] == 256.0:  # no overflow at 256: the tracker counted on from 7
        assert continued[1] == 7 + 3
    off = Trainer(tiny_config().train, CPU).fit(
        Task(tiny_config(), 2, 3, ("a", "b")).new_model(),
        _images(),
        torch.Generator().manual_seed(0),
        budget=BudgetConfig(unit="steps", amount=1),
    )
    assert off.grad_scale is None  # float32 (and bf16): no scaler


def test_each_site_carries_its_fp16_scale_from_round_to_round(tiny_config, disc_federation):
    """FedAvg under fp16 on a simulator: after each round every site's store holds its scaler state
    (``grad_scale/opt``); round 2 starts from round 1's, so its tracker counts round 1's steps too (or, after
    an overflow in round 2, its scale is below round 1's)."""
    from fedseg.algorithms import get_algorithm
    from fedseg.algorithms.prefixes import GRAD_SCALE
    from fedseg.engine.simulator import Simulator

    cfg = tiny_config(train={"amp": "fp16"}, fl={"rounds": 2})
    prep = prepare(cfg, disc_federation())
    spec = get_algorithm("fedavg")
    options = spec.parse_options(cfg.methods.get("fedavg"))
    steps: dict[tuple[int, str], int] = {}
    engine = Simulator(
        "fedavg",
        spec.client(),
        prep.site_data,
        prep.task,
        options,
        observers=[lambda site, action, msg, reply: steps.update({(engine.round, site): int(reply.meta["steps"])})],
    )
    server = spec.server(engine, prep.task, options)
    scales = {}
    for rnd in (1, 2):
        engine.round = rnd
        server.run_round(rnd)
        scales[rnd] = {s: engine.store.load(s)[f"{GRAD_SCALE}/opt"].tolist() for s in engine.sites}
    for site in engine.sites:
        (scale_1, tracker_1), (scale_2, tracker_2) = scales[1][site], scales[2][site]
        assert tracker_1 <= steps[(1, site)]
        if scale_2 == scale_1:  # no overflow in round 2: its steps counted on from round 1's tracker
            assert tracker_2 == tracker_1 + steps[(2, site)], site
        else:
            assert scale_2 < scale_1, site


def _fit_weights(cfg, data, workers: int, steps: int) -> tuple[float, list[torch.Tensor]]:
    train = cfg.train.model_copy(update={"loader_workers": workers})
    model = Task(cfg, data.x.dim() - 2, data.x.shape[1], ("tumour",) * data.y.shape[1]).new_model()
    stats = Trainer(train, CPU).fit(
        model, data, torch.Generator().manual_seed(3), budget=BudgetConfig(unit="steps", amount=steps)
    )
    return stats.mean_loss, [p.detach().clone() for p in model.parameters()]


def test_loader_workers_give_bit_identical_training_on_augmented_patches(tiny_config, volumes):
    cfg = _volume_cfg(tiny_config)
    data = prepare(cfg, volumes).site_data[0].train
    assert data.volumes is not None
    runs = {w: _fit_weights(cfg, data, w, steps=5) for w in (0, 1, 2)}
    assert runs[0][0] == runs[1][0] == runs[2][0]
    for w in (1, 2):
        assert all(torch.equal(a, b) for a, b in zip(runs[0][1], runs[w][1]))


def test_loader_workers_give_bit_identical_training_on_augmented_whole_images(tiny_config):
    cfg = tiny_config(train={"augment": {"enabled": True}})
    runs = {w: _fit_weights(cfg, _images(), w, steps=4) for w in (0, 2)}
    assert runs[0][0] == runs[2][0]
    assert all(torch.equal(a, b) for a, b in zip(runs[0][1], runs[2][1]))


def test_a_run_with_two_loader_workers_equals_one_without(tiny_config, volumes, tmp_path):
    summaries = {}
    for workers in (0, 2):
        cfg = _volume_cfg(tiny_config, loader_workers=workers, budget={"unit": "steps", "amount": 4})
        results = run_experiment(cfg, tmp_path / str(workers), federation=volumes)
        summaries[workers] = results.algorithms[0].summary
        assert results.provenance["accel"]["amp"] == "off"
    assert summaries[0]["sgd_steps"] == 2 * 4 and math.isfinite(summaries[0]["dice"]["global"])
    assert summaries[0]["dice"] == summaries[2]["dice"]
    assert summaries[0]["convergence"]["best_val_dice"] == summaries[2]["convergence"]["best_val_dice"]


def test_channels_last_on_keeps_the_values_and_trains_like_contiguous(tiny_config):
    """The CUDA default for 2D networks, run on the CPU: weights and inputs in channels-last order, same numbers
    up to the kernels' summation order."""
    data, losses = _images(), {}
    for order in ("off", "on"):
        cfg = tiny_config(train={"channels_last": order})
        model = Task(cfg, 2, 3, ("a", "b")).new_model()
        convs = [p for p in model.parameters() if p.dim() == 4]
        assert convs and all(p.is_contiguous(memory_format=torch.channels_last) == (order == "on") for p in convs)
        losses[order] = Trainer(cfg.train, CPU).fit(model, data, torch.Generator().manual_seed(0)).mean_loss
    assert losses["on"] == pytest.approx(losses["off"], abs=1e-4)
