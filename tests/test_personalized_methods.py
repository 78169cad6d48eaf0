"""Personalized methods: Ditto (concurrent), local fine-tuning (finetune, start_from), per-site model
selection (each site tested with its model of its own best validation round), and resume."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch

from fedseg.algorithms.client_state import state_group
from fedseg.algorithms.ditto import PERSONAL
from fedseg.algorithms.local_models import local_model_name
from fedseg.algorithms.partial import PRIVATE
from fedseg.algorithms.prefixes import MODEL
from fedseg.engine.messages import load_weights
from fedseg.evaluate.inference import score_caseset
from fedseg.evaluate.tables import site_dice
from fedseg.run import prepare, run_algorithm, run_experiment, simulator_engine
from fedseg.testing import simulate

SITES = ["site1", "site2", "site3"]


def _same(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def _distance(a: dict, b: dict) -> float:
    """Euclidean distance of two weight dicts (over ``a``'s entries)."""
    return math.sqrt(sum(float((a[k].double() - b[k].double()).pow(2).sum()) for k in a))


# --- Ditto -------------------------------------------------------------------------------------------


def test_ditto_with_lambda_zero_trains_locals_models_next_to_fedavgs_global_model(tiny_config, disc_federation):
    """lam = 0: v_k is ``local``'s model bit for bit, and Ditto's global model is FedAvg's bit for bit."""
    cfg = tiny_config(fl={"rounds": 2}, eval={"hd95": False}, methods={"ditto": {"lam": 0.0}})
    fed = disc_federation()
    runs = {name: simulate(name, cfg, fed)[:2] for name in ("ditto", "local", "fedavg")}
    for rnd in (1, 2):
        for engine, server in runs.values():
            engine.round = rnd
            server.run_round(rnd)
        (ditto, ditto_server), (local, _), (_, fedavg_server) = runs.values()
        for s in SITES:
            personal = state_group(ditto.client_states[s], PERSONAL)
            assert personal and _same(personal, state_group(local.client_states[s], MODEL)), (rnd, s)
            assert not _same(personal, ditto_server.global_weights)  # not vacuous: v_k is not w
        assert _same(ditto_server.global_weights, fedavg_server.global_weights), rnd


def test_ditto_with_a_large_lambda_keeps_each_personal_model_at_the_global_model(tiny_config, disc_federation):
    """SGD with lr * lam = 1: every step sets v to w^t - lr * grad, so v_k ends one gradient step from the
    global model w^t it is pulled towards (the one received this round); with lam = 0 it drifts away."""
    lr = 1e-3
    fed = disc_federation()
    distances = {}
    for lam in (0.0, 1 / lr):
        cfg = tiny_config(
            fl={"rounds": 2},
            train={"optimizer": "sgd", "lr": lr, "momentum": 0.0},
            methods={"ditto": {"lam": lam, "personal_steps": 6}},
        )
        seen = []
        engine, server, _ = simulate("ditto", cfg, fed, [lambda s, a, m, r: seen.append((engine.round, s, a, m))])
        for rnd in (1, 2):
            engine.round = rnd
            server.run_round(rnd)
        received = {s: m.group(MODEL) for rnd, s, a, m in seen if rnd == 2 and a == "train"}
        distances[lam] = {s: _distance(state_group(engine.client_states[s], PERSONAL), received[s]) for s in SITES}
        distances[lam, "global"] = {
            s: _distance(state_group(engine.client_states[s], PERSONAL), server.global_weights) for s in SITES
        }
    for s in SITES:
        assert 0 < distances[1 / lr][s] < 0.25 * distances[0.0][s], (s, distances)
        assert distances[1 / lr, "global"][s] < 0.5 * distances[0.0, "global"][s], (s, distances)


# --- per-site selection -----------------------------------------------------------------------------


def own_model(name: str, state: dict, msg) -> dict:
    """Site k's current model as its validation scores it: from its state store and the message."""
    if name == "local":
        return dict(state_group(state, MODEL))
    if name == "fedper":
        return {**state_group(state, PRIVATE), **msg.group(MODEL)}
    if name == "finetune":
        return dict(state_group(state, MODEL))
    raise KeyError(name)


class Snapshots:
    """Engine factory + observer: each site's own model at every validation (the ``val`` evaluate exchange)."""

    def __init__(self, name):
        self.name, self.engine, self.models, self.splits = name, None, {s: {} for s in SITES}, []

    def factory(self, *args):
        self.engine = simulator_engine(*args)
        return self.engine

    def __call__(self, site, action, msg, reply):
        if action == "evaluate":
            self.splits.append(str(msg.meta["split"]))
            if msg.meta["split"] == "val" and msg.meta["model"] == local_model_name(site):
                weights = own_model(self.name, self.engine.client_states[site], msg)
                self.models[site][self.engine.round] = {k: v.clone() for k, v in weights.items()}


def _scores(weights: dict, data, task) -> np.ndarray:
    model = task.new_model()
    load_weights(model, weights)
    ev = task.cfg.eval
    return score_caseset(model, data, ev.batch_size, ev.threshold, False, task.device, regions=task.scored_regions)[
        "dice"
    ]


def selected_by_rows(rounds_rows: list[dict]) -> dict[str, int]:
    """Per site, the validated round with the highest val_dice (NaN lowest, ties: earliest)."""
    out = {}
    for s in SITES:
        rows = [r for r in rounds_rows if r["site"] == s]
        scores = [-math.inf if math.isnan(r["val_dice"]) else r["val_dice"] for r in rows]
        out[s] = rows[int(np.argmax(scores))]["round"]
    return out


SELECTION = {
    # Adam at a high rate: val Dice goes up and down, sites pick different rounds
    "fluctuating": {"fl": {"rounds": 4}, "train": {"lr": 3.0}},
    # a rate too small to change a prediction: every round ties, the earliest is kept
    "flat": {"fl": {"rounds": 3}, "train": {"optimizer": "sgd", "lr": 1e-9, "momentum": 0.0}},
}


@pytest.mark.parametrize("case", list(SELECTION))
@pytest.mark.parametrize("name", ["local", "fedper"])
def test_each_site_is_tested_with_its_model_of_its_own_best_validation_round(
    name, case, tmp_path, tiny_config, disc_federation
):
    cfg = tiny_config(
        algorithms=[name], eval={"hd95": False}, methods={"fedper": {"private_layers": 1}}, **SELECTION[case]
    )
    prep = prepare(cfg, disc_federation())
    snap = Snapshots(name)
    result = run_algorithm(name, prep, tmp_path, resume=False, observers=[snap], engine_factory=snap.factory)
    rounds = cfg.fl.rounds
    data = {d.name: d for d in prep.site_data}
    assert {s: sorted(m) for s, m in snap.models.items()} == {s: list(range(1, rounds + 1)) for s in SITES}
    # the rows' val_dice are the snapshots' scores
    for row in result.rounds_rows:
        dice = _scores(snap.models[row["site"]][row["round"]], data[row["site"]].val, prep.task)
        assert row["val_dice"] == pytest.approx(
            site_dice(dice, data[row["site"]].val.ids, row["site"], prep.task.regions), abs=1e-12
        )
    selected = result.summary["selected_rounds"]
    assert selected == selected_by_rows(result.rounds_rows)
    if case == "fluctuating":  # the case the test is for: not every site's best is the last round
        assert any(r < rounds for r in selected.values()), selected
    else:
        assert all(len({r["val_dice"] for r in result.rounds_rows if r["site"] == s}) == 1 for s in SITES)
        assert selected == dict.fromkeys(SITES, 1)
    # each site's test rows are its selected model scored on its test split; the bundle holds that model
    assert set(result.bundle) == {local_model_name(s) for s in SITES}
    for s in SITES:
        kept = snap.models[s][selected[s]]
        assert _same(result.bundle[local_model_name(s)], kept)
        expected = _scores(kept, data[s].test, prep.task)
        rows = [
            r
            for r in result.test_rows
            if r["site"] == s and r["model"] == local_model_name(s) and r["metric"] == "dice"
        ]
        got = {(r["case"], r["region"]): r["value"] for r in rows}
        want = {
            (c, reg): float(expected[i, j])
            for i, c in enumerate(data[s].test.ids)
            for j, reg in enumerate(prep.task.regions)
        }
        assert got.keys() == want.keys()
        assert all(got[k] == want[k] or (math.isnan(got[k]) and math.isnan(want[k])) for k in want), s
    # the cross-site matrix: every kept model on every site's test split
    summary = result.summary
    assert {"selected_rounds", "local_avg", "local_gen", "cross_site"} <= summary.keys()
    matrix = np.array([[summary["cross_site"]["dice"][a][b] for b in SITES] for a in SITES])
    assert [summary["dice"][s] for s in SITES] == pytest.approx(np.diag(matrix).tolist(), abs=1e-12)
    for owner in SITES:
        for s in SITES:
            expected = _scores(result.bundle[local_model_name(owner)], data[s].test, prep.task)
            assert matrix[SITES.index(owner), SITES.index(s)] == pytest.approx(
                site_dice(expected, data[s].test.ids, s, prep.task.regions), abs=1e-12
            )
    assert summary["local_avg"] == pytest.approx(np.mean(np.diag(matrix)), abs=1e-12)
    assert summary["local_gen"] == pytest.approx(np.mean(matrix[~np.eye(3, dtype=bool)]), abs=1e-12)


# --- fine-tuning ------------------------------------------------------------------------------------


def _finetune_cfg(tiny_config, **finetune):
    return tiny_config(
        algorithms=["fedavg", "finetune"],
        fl={"rounds": 2},
        train={"lr": 1.0},
        eval={"hd95": False},
        methods={"finetune": {"epochs": 3, **finetune}},
    )


class Phases:
    """Observer + ``on_algorithm_start``: every exchange as (algorithm, action, split, site, message)."""

    def __init__(self):
        self.current, self.seen = None, []

    def start(self, name):
        self.current = name

    def __call__(self, site, action, msg, reply):
        self.seen.append((self.current, action, msg.meta.get("split"), site, msg))


@pytest.fixture(scope="module")
def finetune_run(tmp_path_factory, tiny_config, disc_federation):
    out = tmp_path_factory.mktemp("finetune")
    phases = Phases()
    results = run_experiment(
        _finetune_cfg(tiny_config),
        out,
        federation=disc_federation(),
        observers=[phases],
        on_algorithm_start=phases.start,
    )
    return out, {r.name: r for r in results.algorithms}, phases


def test_finetune_starts_from_the_selected_fedavg_model_once(finetune_run):
    _, results, phases = finetune_run
    train = [(site, msg) for alg, action, _, site, msg in phases.seen if alg == "finetune" and action == "train"]
    assert len(train) == 3 * 3  # 3 epochs, 3 sites
    assert [site for site, _ in train[:3]] == SITES
    for _, msg in train[:3]:  # round 1: w*, FedAvg's model of its selected round
        assert _same(msg.group(MODEL), results["fedavg"].bundle["global"])
    assert all(not msg.tensors for _, msg in train[3:])  # then nothing travels
    rows = [r for r in results["finetune"].ledger if r["action"] == "train"]
    assert [r["floats_down"] for r in rows] == [
        sum(t.numel() for t in results["fedavg"].bundle["global"].values())
    ] * 3 + [0] * 6
    assert all(r["floats_up"] == 0 for r in rows)


def test_finetune_selects_each_sites_best_epoch_and_reads_no_test_data_before_the_test(finetune_run):
    _, results, phases = finetune_run
    ft = results["finetune"]
    assert ft.summary["selected_rounds"] == selected_by_rows(ft.rounds_rows)
    assert len(set(ft.summary["selected_rounds"].values())) > 1  # the case the test is for: sites choose apart
    assert [r["round"] for r in ft.rounds_rows] == [1, 1, 1, 2, 2, 2, 3, 3, 3]
    for alg in ("fedavg", "finetune"):
        mine = [(action, split) for a, action, split, *_ in phases.seen if a == alg]
        last_train = max(i for i, (action, _) in enumerate(mine) if action == "train")
        first_test = min(i for i, (action, split) in enumerate(mine) if split == "test")
        assert last_train < first_test, alg
        assert {split for action, split in mine[:first_test] if action == "evaluate"} == {"val"}, alg


def test_finetune_cost_adds_the_training_of_the_model_it_started_from(finetune_run):
    out, results, _ = finetune_run
    fedavg, ft = results["fedavg"], results["finetune"]
    own = sum(r["steps"] for r in ft.ledger if r["action"] == "train")
    assert own > 0 and ft.summary["sgd_steps"] == own  # the ledger's totals: this method's own steps
    assert ft.summary["cost"]["sgd_steps"] == fedavg.summary["sgd_steps"] + own
    assert ft.summary["cost"]["includes"] == ["fedavg", "this method"]
    written = json.loads((out / "summary.json").read_text())["algorithms"]["finetune"]
    assert written["cost"]["sgd_steps"] == ft.summary["cost"]["sgd_steps"]


@pytest.mark.parametrize(
    "order, start", [(["finetune", "fedavg"], "fedavg"), (["finetune"], "fedavg"), (["fedavg", "finetune"], "fedprox")]
)
def test_start_from_an_algorithm_not_run_before_is_refused_before_any_work(
    order, start, tmp_path, tiny_config, disc_federation
):
    cfg = _finetune_cfg(tiny_config, start_from=start).model_copy(update={"algorithms": order})
    seen = []
    with pytest.raises(
        ValueError, match=rf"methods\.finetune\.start_from='{start}': finetune starts from .* must run before it"
    ):
        run_experiment(cfg, tmp_path / "run", federation=disc_federation(), observers=[lambda *x: seen.append(x)])
    assert not seen and not (tmp_path / "run").exists()


def test_start_from_a_model_folder_of_an_earlier_run(finetune_run, tmp_path, tiny_config, disc_federation):
    out, results, _ = finetune_run
    folder = out / "model" / "fedavg"
    assert (folder / "manifest.json").is_file()
    cfg = _finetune_cfg(tiny_config, start_from=str(folder)).model_copy(update={"algorithms": ["finetune"]})
    phases = Phases()
    again = run_experiment(cfg, tmp_path / "ft", federation=disc_federation(), observers=[phases])
    first = [msg for _, action, _, _, msg in phases.seen if action == "train"][:3]
    assert all(_same(m.group(MODEL), results["fedavg"].bundle["global"]) for m in first)
    ft = again.algorithms[0]
    assert ft.summary["cost"]["sgd_steps"] == ft.summary["sgd_steps"]  # the base model's cost is unknown here
    assert "unknown" in " ".join(ft.summary["cost"]["includes"])
    # the same fine-tuning as from the fedavg of the same run
    assert ft.summary["selected_rounds"] == results["finetune"].summary["selected_rounds"]
    for s in SITES:
        assert _same(ft.bundle[local_model_name(s)], results["finetune"].bundle[local_model_name(s)])


def test_start_from_a_folder_of_another_network_is_refused(finetune_run, tmp_path, tiny_config, disc_federation):
    out, _, _ = finetune_run
    cfg = _finetune_cfg(tiny_config, start_from=str(out / "model" / "fedavg")).model_copy(
        update={"algorithms": ["finetune"]}
    )
    cfg = cfg.model_copy(update={"model": cfg.model.model_copy(update={"channels": (4, 8)})})
    seen = []
    with pytest.raises(ValueError, match=r"methods\.finetune\.start_from=.*was trained with another network"):
        run_experiment(cfg, tmp_path / "run", federation=disc_federation(), observers=[lambda *x: seen.append(x)])
    assert not seen and not (tmp_path / "run").exists()
    missing = cfg.model_copy(update={"methods": {"finetune": {"start_from": str(tmp_path / "nowhere" / "fedavg")}}})
    with pytest.raises(ValueError, match=r"methods\.finetune\.start_from=.*manifest\.json: missing"):
        run_experiment(missing, tmp_path / "run", federation=disc_federation())


def test_start_from_a_folder_that_reads_the_channels_in_another_order_is_refused(
    finetune_run, tmp_path, tiny_config, disc_federation
):
    """A bundle that read R, G, B fine-tuned on a federation whose federation.yaml says its channels are B, G, R:
    the same network and channel count, swapped inputs; refused before any work, naming both orders."""
    import dataclasses
    import shutil

    out, _, _ = finetune_run
    folder = shutil.copytree(out / "model" / "fedavg", tmp_path / "model" / "fedavg")
    manifest = json.loads((folder / "manifest.json").read_text())
    (folder / "manifest.json").write_text(json.dumps({**manifest, "channel_names": ["R", "G", "B"]}))
    cfg = _finetune_cfg(tiny_config, start_from=str(folder)).model_copy(update={"algorithms": ["finetune"]})
    swapped = dataclasses.replace(disc_federation(), channel_names=["B", "G", "R"])
    seen = []
    with pytest.raises(
        ValueError,
        match=r"methods\.finetune\.start_from=.* reads the channels as R, G, B; this run's federation holds B, G, R",
    ):
        run_experiment(cfg, tmp_path / "run", federation=swapped, observers=[lambda *x: seen.append(x)])
    assert not seen and not (tmp_path / "run").exists()


def test_ditto_ft_pulls_towards_the_start_model_and_is_finetune_without_the_pull(
    finetune_run, tmp_path, tiny_config, disc_federation
):
    """lam = 0: ``finetune`` bit for bit. SGD with lr * lam = 1: each kept model is one gradient step from
    w* (FedAvg's model), while plain fine-tuning moves 8 steps per epoch away from it."""
    _, results, _ = finetune_run
    fedavg, lr = results["fedavg"], 1e-3

    def run(name, lam):
        cfg = tiny_config(
            algorithms=[name],
            train={"optimizer": "sgd", "lr": lr, "momentum": 0.0},
            eval={"hd95": False},
            methods={name: {"epochs": 2, "lam": lam, "local_steps": 8}},
        )
        prep = prepare(cfg, disc_federation())
        return run_algorithm(name, prep, tmp_path / f"{name}-{lam}", resume=False, earlier={"fedavg": fedavg})

    plain, zero, pulled = run("finetune", 0.0), run("ditto-ft", 0.0), run("ditto-ft", 1 / lr)
    assert plain.bundle.keys() == zero.bundle.keys() == pulled.bundle.keys()
    start = fedavg.bundle["global"]
    for model in plain.bundle:
        assert _same(plain.bundle[model], zero.bundle[model])
        assert 0 < _distance(pulled.bundle[model], start) < 0.25 * _distance(plain.bundle[model], start), model
    assert plain.summary["selected_rounds"] == zero.summary["selected_rounds"]
    assert not _same(run("ditto-ft", 0.1).bundle["local:site1"], plain.bundle["local:site1"])


def test_start_from_a_method_without_a_global_model_is_refused_before_any_work(tmp_path, tiny_config, disc_federation):
    cfg = _finetune_cfg(tiny_config, start_from="local").model_copy(update={"algorithms": ["local", "finetune"]})
    seen = []
    with pytest.raises(ValueError, match=r"start_from='local'.*no global model"):
        run_experiment(cfg, tmp_path / "run", federation=disc_federation(), observers=[lambda *x: seen.append(x[1])])
    assert not seen, f"{len(seen)} exchanges (local trained) before the error"


# --- resume -------------------------------------------------------------------------------------------


class _Stop(Exception):
    pass


RESUME = {
    "ditto": {"lam": 0.5},
    "fedper": {"private_layers": 2},
    "cfl": {"split_round": 2, "eps1": 0.0},  # the split of round 2 must survive the interruption
}


@pytest.mark.parametrize("name, stop_round", [("ditto", 1), ("fedper", 2), ("cfl", 2), ("cfl", 1)])
def test_resume_after_interruption_equals_uninterrupted_run(name, stop_round, tmp_path, tiny_config, disc_federation):
    cfg = tiny_config(fl={"rounds": 3}, eval={"hd95": False}, methods={name: RESUME[name]})
    prep = prepare(cfg, disc_federation())
    full = run_algorithm(name, prep, tmp_path / "full", resume=False)

    def stop(algo, rnd, losses):
        if rnd == stop_round:
            raise _Stop

    with pytest.raises(_Stop):
        run_algorithm(name, prep, tmp_path / "cut", resume=False, on_round_end=stop)
    resumed = run_algorithm(name, prep, tmp_path / "cut", resume=True)
    assert full.bundle.keys() == resumed.bundle.keys() == {local_model_name(s) for s in SITES}
    for model in full.bundle:
        assert _same(full.bundle[model], resumed.bundle[model]), model
    assert full.rounds_rows == resumed.rounds_rows
    assert full.metric_rows == resumed.metric_rows
    assert full.summary["dice"] == resumed.summary["dice"]
    assert full.summary["selected_rounds"] == resumed.summary["selected_rounds"]
    assert full.summary["floats_sent"] == resumed.summary["floats_sent"]
    if name == "cfl":  # one cluster in round 1, two from round 2 on
        clusters = [
            {r["value"] for r in full.metric_rows if r["metric"] == "cluster" and r["round"] == rnd}
            for rnd in (1, 2, 3)
        ]
        assert [len(c) for c in clusters] == [1, 2, 2]
