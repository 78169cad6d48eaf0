"""Faults (fedseg.engine.faults): every injected kind under fl.on_failure = stop and skip, reply
validation before any merge, the failure record, and nothing left half-written."""

from __future__ import annotations

import json
import logging
import math
import re

import pytest
import torch

from fedseg.engine.faults import SiteFailure, update_norm
from fedseg.engine.messages import Message, l2_norm
from fedseg.run import prepare, run_algorithm, run_experiment

KINDS = ["crash", "nan", "inf", "shape", "missing", "extra", "weight", "hang"]
EXPECTED = {  # what the failure message says for each kind
    "crash": "InjectedCrash",
    "nan": "holds NaN",
    "inf": "holds Inf",
    "shape": "has shape",
    "missing": "tensors sent as model/ are missing",
    "extra": "was not sent as part of model/",
    "weight": "but the site holds 6 training cases",
    "hang": "no reply within fl.timeout_s",
}


def _cfg(tiny_config, kind: str, policy: str, rounds: int = 3, **extra):
    fl = {"rounds": rounds, "on_failure": policy}
    if kind == "hang":
        fl["timeout_s"] = 0.5
    return tiny_config(
        algorithms=["fedavg"], fl=fl, faults=[{"site": "site2", "round": 2, "kind": kind, "factor": 100.0}], **extra
    )


@pytest.mark.parametrize("kind", KINDS)
def test_stop_names_site_round_and_kind_and_keeps_the_last_good_checkpoint(kind, tmp_path, tiny_config, discs):
    out = tmp_path / "run"
    with pytest.raises(SiteFailure, match=rf"site 'site2', round 2, fedavg train: .*{EXPECTED[kind]}"):
        run_experiment(_cfg(tiny_config, kind, "stop"), out, federation=discs)
    ckpt = torch.load(out / "checkpoints" / "fedavg.pt", weights_only=False)
    assert ckpt["round"] == 1 and not ckpt.get("finished")  # round 1's checkpoint, intact and loadable
    assert not list(out.rglob(".*.pt.*")), "a temporary checkpoint file was left behind"
    assert not (out / "summary.json").exists()  # no half-written results


@pytest.mark.parametrize("kind", KINDS)
def test_skip_completes_with_the_others_and_records_the_failure(kind, tmp_path, tiny_config, discs):
    out = tmp_path / "run"
    results = run_experiment(_cfg(tiny_config, kind, "skip"), out, federation=discs)
    (result,) = results.algorithms
    failures = result.summary["failures"]
    assert [(f["round"], f["site"], f["action"]) for f in failures] == [(2, "site2", "train")]
    assert EXPECTED[kind] in failures[0]["reason"]
    rows = [r for r in result.ledger if r["round"] == 2 and r["action"] == "train"]
    assert sorted(r["site"] for r in rows) == ["site1", "site2", "site3"]
    assert [r["failure"] != "" for r in rows if r["site"] == "site2"] == [True]
    assert all(torch.isfinite(w).all() for w in result.bundle["global"].values())
    summary = json.loads((out / "summary.json").read_text())
    assert summary["algorithms"]["fedavg"]["failures"] == failures
    assert "site2" in (out / "ledger.csv").read_text()


def test_a_skipped_site_is_said_once_when_it_fails_and_once_when_it_answers_again(tmp_path, tiny_config, discs, caplog):
    """fl.on_failure = skip: site2 crashing in every exchange of rounds 2 and 3 of 4 (as a site that is gone): one
    WARNING with the first reason, none for the later failures (ledger.csv has them: a site that is gone fails every
    exchange of every round), one line when it answers again in round 4. Before, a skipped site was in the ledger
    only."""
    import logging

    faults = [
        {"site": "site2", "round": r, "kind": "crash", "action": a} for r in (2, 3) for a in ("train", "evaluate")
    ]
    cfg = tiny_config(algorithms=["fedavg"], fl={"rounds": 4, "on_failure": "skip"}, faults=faults)
    with caplog.at_level(logging.INFO, logger="fedseg.engine.base"):
        results = run_experiment(cfg, tmp_path / "run", federation=discs)
    failed = {(f["round"], f["site"], f["action"]) for f in results.algorithms[0].summary["failures"]}
    assert failed == {(r, "site2", a) for r in (2, 3) for a in ("train", "evaluate")}, failed
    said = [(r.levelname, r.getMessage()) for r in caplog.records if r.name == "fedseg.engine.base"]
    assert len(said) == 2, said
    assert said[0][0] == "WARNING" and said[0][1].startswith("site 'site2', round 2, fedavg train: InjectedCrash")
    assert "fl.on_failure = skip: left out until it answers again" in said[0][1]
    assert said[1] == ("INFO", "site 'site2' answers again (round 4, fedavg train)")


def test_a_skipped_site_is_left_out_of_the_merge_which_reweights_the_others(tmp_path, tiny_config, discs):
    """Round 2's global model with site2 skipped = the sample-weighted average of site1 and site3's replies."""
    cfg = _cfg(tiny_config, "nan", "skip", rounds=2)
    rounds: list[dict[str, Message]] = []

    def keep(site, action, msg, reply):
        if action == "train":
            if site == "site1":  # the first site of each round's train exchange
                rounds.append({})
            rounds[-1][site] = reply

    result = run_algorithm("fedavg", prepare(cfg, discs), tmp_path / "r", resume=False, observers=[keep])
    replies = rounds[-1]
    assert sorted(replies) == ["site1", "site3"]  # observers see accepted replies only
    n = {s: float(replies[s].meta["num_examples"]) for s in replies}
    for name, value in result.bundle["global"].items():
        expect = sum(n[s] * replies[s].group("model")[name].double() for s in replies) / sum(n.values())
        assert torch.allclose(value.double(), expect, atol=1e-6), name


def test_scale_attack_moves_the_update_factor_times(tmp_path, tiny_config, discs):
    """kind scale: the site replies w + factor (w_k - w); FedAvg averages it in (nothing is invalid)."""
    clean = run_algorithm("fedavg", prepare(tiny_config(fl={"rounds": 1}), discs), tmp_path / "a", resume=False)
    cfg = tiny_config(fl={"rounds": 1}, faults=[{"site": "site2", "kind": "scale", "factor": 100.0}])
    attacked = run_algorithm("fedavg", prepare(cfg, discs), tmp_path / "b", resume=False)
    assert attacked.summary["failures"] == []
    diff = max(
        float((attacked.bundle["global"][k] - clean.bundle["global"][k]).abs().max()) for k in clean.bundle["global"]
    )
    assert diff > 1e-3


def test_an_update_far_beyond_the_other_sites_is_said_once_a_round(tmp_path, tiny_config, discs, caplog):
    """A site scaling its update 10,000 times took over the global model of a real deployment without a word (a
    security audit); the run now says which site in one warning per round (plain FedAvg still averages it in: a
    robust aggregator is the defence). A clean run of the same sites says nothing."""
    with caplog.at_level(logging.WARNING, logger="fedseg.engine.base"):
        run_algorithm("fedavg", prepare(tiny_config(fl={"rounds": 1}), discs), tmp_path / "a", resume=False)
    assert not [r for r in caplog.records if "sent an update" in r.getMessage()]
    cfg = tiny_config(fl={"rounds": 2}, faults=[{"site": "site2", "kind": "scale", "factor": 1e4}])
    with caplog.at_level(logging.WARNING, logger="fedseg.engine.base"):
        run_algorithm("fedavg", prepare(cfg, discs), tmp_path / "b", resume=False)
    said = [r.getMessage() for r in caplog.records if "sent an update" in r.getMessage()]
    assert len(said) == 2 and all("fedavg train: site 'site2' sent an update " in m for m in said), said
    assert "times the median of the other sites'" in said[0] and "a robust merge" in said[0]


def test_with_two_sites_the_larger_far_update_is_named(tmp_path, tiny_config, disc_federation, caplog):
    """Two hospitals: the warning needed 3 replies, so a x10^4 update was merged silently (a security audit)."""
    cfg = tiny_config(fl={"rounds": 1}, faults=[{"site": "site2", "kind": "scale", "factor": 1e4}])
    with caplog.at_level(logging.WARNING, logger="fedseg.engine.base"):
        run_algorithm("fedavg", prepare(cfg, disc_federation(n_sites=2, cases_per_site=8)), tmp_path, resume=False)
    said = [r.getMessage() for r in caplog.records if "sent an update" in r.getMessage()]
    assert len(said) == 1 and "site 'site2' sent an update " in said[0] and "times the other site's" in said[0]


def test_too_few_sites_left_stops_the_run(tmp_path, tiny_config, discs):
    cfg = tiny_config(
        fl={"rounds": 2, "on_failure": "skip", "min_sites": 3},
        faults=[{"site": "site2", "round": 2, "kind": "crash"}],
    )
    with pytest.raises(SiteFailure, match=r"Only 2 sites answered; fl.min_sites = 3") as caught:
        run_experiment(cfg, tmp_path / "run", federation=discs)
    # site2's failure was said in its WARNING line: the error counts it, without repeating it
    said = str(caught.value)
    assert said.startswith("1 site(s) failed local train in round 2 (said in its warning above)"), said
    assert "injected crash" not in said


def test_a_method_that_needs_every_site_cannot_skip(tmp_path, tiny_config, discs):
    cfg = tiny_config(
        algorithms=["fedsm"],
        fl={"rounds": 2, "on_failure": "skip"},
        faults=[{"site": "site2", "round": 2, "kind": "crash"}],
        methods={"fedsm": {"selector_width": 0.0625}},
    )
    with pytest.raises(SiteFailure, match=r"fedsm needs every site's reply"):
        run_experiment(cfg, tmp_path / "run", federation=discs)


@pytest.mark.parametrize("aggregator", ["mean", "krum", "multikrum", "bulyan", "clipped"])
def test_a_nan_never_reaches_the_global_model_under_any_aggregator(aggregator, tmp_path, tiny_config, disc_federation):
    options = {"aggregator": aggregator, "clip_norm": 1.0} if aggregator == "clipped" else {"aggregator": aggregator}
    cfg = tiny_config(
        fl={"rounds": 2, "on_failure": "skip"},
        faults=[{"site": "site2", "kind": "nan"}],
        methods={"fedavg": options},
    )
    sites = 8 if aggregator == "bulyan" else 6  # after the skip: Krum needs n > 2f + 2, Bulyan n >= 4f + 3 (f = 1)
    fed = disc_federation(n_sites=sites, cases_per_site=8)
    result = run_algorithm("fedavg", prepare(cfg, fed), tmp_path / "r", resume=False)
    assert all(torch.isfinite(w).all() for w in result.bundle["global"].values())
    assert {f["site"] for f in result.summary["failures"]} == {"site2"}


def test_hang_needs_a_timeout(tiny_config):
    with pytest.raises(ValueError, match="hang needs fl.timeout_s"):
        tiny_config(faults=[{"site": "site2", "kind": "hang"}])


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.float64])
def test_all_finite_agrees_with_isfinite_value_by_value(dtype):
    """The sum-first check against ``isfinite(t).all()`` on clean tensors, the dtype's largest values (whose sum
    overflows: checked value by value, no false alarm), and one NaN, +Inf, -Inf or both infinities anywhere."""
    from fedseg.engine.faults import all_finite

    big = torch.finfo(dtype).max
    cases = [torch.randn(5000).to(dtype), torch.full((5000,), big, dtype=dtype), -torch.full((77,), big, dtype=dtype)]
    for bad in ([float("nan")], [float("inf")], [float("-inf")], [float("inf"), float("-inf")]):
        t = torch.randn(5000).to(dtype)
        t[torch.randperm(5000)[: len(bad)]] = torch.tensor(bad, dtype=dtype)
        cases.append(t)
    for t in cases:
        assert all_finite(t) == bool(torch.isfinite(t).all())
    assert [all_finite(t) for t in cases] == [True, True, True, False, False, False, False]


# --- a site's evaluation reply: its scores choose the selected round and make the tables ----------------------------
ROGUE_SCORES = {  # how a rogue (or broken) site2 changes its evaluation reply, and what the coordinator says
    "dice": ("dice scores leave [0, 1] (e.g. 1000)", lambda reply: reply.tensors["dice"].fill_(1000.0)),
    "cases": ("cases of its", lambda reply: reply.meta.update(cases='["a", "b", "c", "d", "e", "f", "g"]')),
    "model": (
        "reports scores of model 'local:site3', asked to score 'global'",
        lambda r: r.meta.update(model="local:site3"),
    ),
    "steps": ("steps = -1000000, expected a whole number >= 0", lambda reply: reply.meta.update(steps=-1000000)),
}


def _rogue_evaluator(change):
    from fedseg.algorithms.fedavg import FedAvgClient

    class RogueEvaluator(FedAvgClient):
        """FedAvg's client; site2 changes its evaluation replies (an attacker taking over model selection)."""

        def on_evaluate(self, msg, ctx):
            reply = super().on_evaluate(msg, ctx)
            if ctx.site == "site2":
                change(reply)
            return reply

    return RogueEvaluator


@pytest.mark.parametrize("kind", sorted(ROGUE_SCORES))
def test_a_sites_scores_outside_their_range_or_shape_are_its_failure_not_the_results(
    kind, tmp_path, tiny_config, discs
):
    """An attack on a real deployment: a site sending Dice 1000 chose the selected round and made the tables (1000
    in results.csv, no warning); extra case ids stopped the run with an IndexError naming nobody, even under skip.
    Each is now the site's failure, said with its name: skipped under fl.on_failure = skip, the results the others'."""
    from fedseg.algorithms import register_algorithm, unregister_algorithm
    from fedseg.algorithms.fedavg import FedAvgOptions, FedAvgServer
    from fedseg.algorithms.registry import AlgorithmSpec

    reason, change = ROGUE_SCORES[kind]
    register_algorithm(
        AlgorithmSpec("test-rogue", "Rogue", FedAvgServer, _rogue_evaluator(change), "test", FedAvgOptions)
    )
    try:
        cfg = tiny_config(
            algorithms=["test-rogue"], fl={"rounds": 2, "on_failure": "skip"}, eval={"local_models": False}
        )
        results = run_experiment(cfg, tmp_path / "skip", federation=discs)
        with pytest.raises(SiteFailure, match=rf"site 'site2', round \d, test-rogue evaluate: .*{re.escape(reason)}"):
            run_experiment(
                cfg.model_copy(update={"fl": cfg.fl.model_copy(update={"on_failure": "stop"})}),
                tmp_path / "stop",
                federation=discs,
            )
    finally:
        unregister_algorithm("test-rogue")
    (result,) = results.algorithms
    assert {f["site"] for f in result.summary["failures"]} == {"site2"}
    assert all(reason in f["reason"] for f in result.summary["failures"])
    dice = [r["value"] for r in result.test_rows if r["metric"] == "dice"]
    assert dice and all(0.0 <= v <= 1.0 for v in dice) and not [r for r in result.test_rows if r["site"] == "site2"]


ROGUE_TRAIN = {  # how a rogue site2 changes its train reply, and what the coordinator says
    "loss": (lambda reply: reply.meta.update(loss="=cmd|' /C calc'!A0"), "expected a number"),
    "no model": (lambda reply: Message({}, reply.meta), "it returned no model/ tensors"),
    "no weight": (
        lambda reply: Message(reply.tensors, {k: v for k, v in reply.meta.items() if k != "num_examples"}),
        "it reports no num_examples",
    ),
}


@pytest.mark.parametrize("kind", sorted(ROGUE_TRAIN))
def test_a_train_reply_the_merge_cannot_read_is_the_sites_failure(kind, tmp_path, tiny_config, discs):
    """A site's ``loss`` was read with ``float()`` (a rogue ``"=cmd"`` stopped the coordinator with a ValueError naming
    nobody), and a reply without its ``model/`` group was a KeyError in the merge: each is the site's failure now,
    skipped under fl.on_failure = skip."""
    from fedseg.algorithms import register_algorithm, unregister_algorithm
    from fedseg.algorithms.fedavg import FedAvgClient, FedAvgOptions, FedAvgServer
    from fedseg.algorithms.registry import AlgorithmSpec

    change, said = ROGUE_TRAIN[kind]

    class Rogue(FedAvgClient):
        def after_fit(self, model, stats, msg, ctx):
            reply = super().after_fit(model, stats, msg, ctx)
            return change(reply) or reply if ctx.site == "site2" else reply

    register_algorithm(AlgorithmSpec("test-rogue-train", "Rogue", FedAvgServer, Rogue, "test", FedAvgOptions))
    try:
        cfg = tiny_config(algorithms=["test-rogue-train"], fl={"rounds": 1, "on_failure": "skip"})
        (result,) = run_experiment(cfg, tmp_path, federation=discs).algorithms
    finally:
        unregister_algorithm("test-rogue-train")
    (failure,) = result.summary["failures"]
    assert failure["site"] == "site2" and said in failure["reason"], failure
    assert {r["site"] for r in result.rounds_rows} >= {"site1", "site3"}


def test_every_tensor_of_an_evaluation_reply_is_checked_fedsms_candidate_scores_too():
    """FedSM's threshold mode re-routes the candidates' scores (``dice_global``, ``dice_personal``...) at every gamma
    on the coordinator: a site's Dice 1000 there chose gamma, the round and the tables, and a wrongly shaped one
    crashed the coordinator naming nobody (a review of the first check, which read ``dice`` only)."""
    from fedseg.engine.faults import scores_problem

    asked = Message({}, {"model": "fedsm", "split": "test"})
    n, regions = 4, 2

    def reply(**changed):
        tensors = {
            "probs": torch.full((n, 3), 1 / 3),
            "choice": torch.zeros(n, dtype=torch.long),
            **{
                f"{m}{s}": torch.full((n, regions), 0.5)
                for m in ("dice", "hd95", "nsd")
                for s in ("", "_global", "_personal")
            },
        }
        return Message({**tensors, **changed}, {"model": "fedsm", "cases": json.dumps([f"c{i}" for i in range(n)])})

    assert scores_problem(asked, reply(), regions, n) is None
    assert scores_problem(asked, reply(hd95_global=torch.full((n, regions), math.inf)), regions, n) is None
    bad = {
        "dice_personal": (torch.full((n, regions), 1000.0), "dice_personal scores leave [0, 1] (e.g. 1000)"),
        "hd95_global": (torch.full((n, regions), -1.0), "hd95_global scores leave [0, inf] (e.g. -1)"),
        "dice_global": (torch.full((n + 3, regions), 0.5), "'dice_global' has shape (7, 2), not one row per case (4)"),
        "nsd": (torch.full((n, regions + 1), 0.5), "nsd scores have shape (4, 3), expected (4, 2)"),
        "probs": (torch.full((n, 3), 2.0), "probs scores leave [0, 1] (e.g. 2)"),
        "choice": (torch.zeros(n + 1, dtype=torch.long), "'choice' has shape (5,), not one row per case (4)"),
        "dice": (torch.full((n, regions), 1000), "dice scores are torch.int64, not floating point"),  # passed before
    }
    for name, (tensor, said) in bad.items():
        problem = scores_problem(asked, reply(**{name: tensor}), regions, n)
        assert problem is not None and said in problem, (name, problem)
    assert "declared as 5" in scores_problem(asked, reply(), regions, 5)
    no_cases = reply()
    del no_cases.meta["cases"]  # a KeyError naming no site where the rows were made
    assert scores_problem(asked, no_cases, regions, n) == "it names no cases for its scores"
    assert scores_problem(Message({}, {}), Message({}, {}), regions) is None  # share_model: no split, no scores


def test_the_numbers_a_server_reads_from_an_evaluation_reply_besides_scores_are_checked():
    """A per-site method's test reply names its kept model's round, a fine-tuning its kept rate and each candidate's
    Dice, FedSM its selector's softmax: a rogue string or a 1-D softmax was an error naming no site, a made-up key a
    row of round_metrics.csv (a trust-boundary audit). Each is the site's failure now."""
    from types import SimpleNamespace

    from fedseg.algorithms.fedsm.method import FedSMServer
    from fedseg.algorithms.finetune import CANDIDATE_DICE, SELECTED_LR, FinetuneOptions, FinetuneServer
    from fedseg.algorithms.persite import SELECTED_ROUND, USE_BEST

    test = Message({}, {"split": "test", USE_BEST: True})
    server = FinetuneServer.__new__(FinetuneServer)
    server.engine, server.options = SimpleNamespace(round=3), FinetuneOptions(lr_grid=[0.001, 0.01])
    honest = {SELECTED_ROUND: 2, SELECTED_LR: 0.01}
    assert server.eval_reply_problem("s", test, Message({}, honest)) is None
    for meta, said in (
        ({SELECTED_ROUND: 7}, "is not a round trained (1..3)"),
        ({SELECTED_ROUND: "2"}, "is not a round trained"),
        ({SELECTED_LR: 0.5}, "is not a rate of lr_grid"),
        ({CANDIDATE_DICE + "=cmd": 0.5}, "names no rate of lr_grid"),
    ):
        problem = server.eval_reply_problem("s", test, Message({}, {**honest, **meta}))
        assert problem is not None and said in problem, (meta, problem)
    val = Message({}, {"split": "val"})
    assert "is not a Dice" in server.eval_reply_problem("s", val, Message({}, {CANDIDATE_DICE + "0.01": 7.0}))

    fedsm = FedSMServer.__new__(FedSMServer)
    fedsm.sites = ["a", "b", "c"]
    scores = {f"{m}_{c}": torch.zeros(4, 1) for m in ("dice", "hd95", "nsd") for c in ("global", "personal")}
    assert fedsm.eval_reply_problem("a", val, Message({"probs": torch.full((4, 3), 1 / 3), **scores})) is None
    assert "expected (cases, 3)" in fedsm.eval_reply_problem("a", val, Message({"probs": torch.zeros(4), **scores}))
    del scores["dice_personal"]
    assert "lack 'dice_personal'" in fedsm.eval_reply_problem("a", val, Message({"probs": torch.zeros(4, 3), **scores}))


def test_update_norm_is_close_to_the_float64_norm_and_falls_back_to_it_beyond_float32():
    """The outlier warning's float32 norm is robust merging's float64 one (``l2_norm``) within 1e-5 relative here,
    over the float tensors sent and returned by name and shape only; where float32 overflows, the float64 one."""
    g = torch.Generator().manual_seed(0)
    sent = Message(
        tensors={
            "model/a": torch.randn(1000, 37, generator=g),
            "model/b": torch.randn(5, generator=g),
            "model/steps": torch.tensor(1),
            "model/c": torch.zeros(3),
        }
    )
    reply = Message(
        tensors={
            "model/a": sent.tensors["model/a"] + 0.01 * torch.randn(1000, 37, generator=g),
            "model/b": sent.tensors["model/b"] * 3,
            "stats/n": torch.ones(4),  # not sent: left out
            "model/steps": torch.tensor(30000),  # sent, but not a float: left out
            "model/c": torch.zeros(4),  # another shape: left out
        }
    )
    expected = l2_norm({k: reply.tensors[k] - sent.tensors[k] for k in ("model/a", "model/b")})
    assert update_norm(sent, reply) == pytest.approx(expected, rel=1e-5)
    assert update_norm(sent, sent) == 0.0
    huge = Message(tensors={"model/b": torch.full((5,), 1e20)})
    assert update_norm(Message(tensors={"model/b": torch.zeros(5)}), huge) == pytest.approx(math.sqrt(5) * 1e20)
