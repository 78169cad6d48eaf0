"""Local models (Auto-FedAvg Table 2, "local avg" / "local gen"; config ``eval.local_models``).

In every validated round (``fl.validate_every``, and the last) a site scores the model it holds right
after its local training on its own validation split, inside its ``train`` handling (no extra
message; the compute counts in the train rows' seconds, so also in a measured ``t_batch``), and
keeps it in its state store (``localbest/`` weights, ``localbest_score``, ``localbest_round``)
when it beats its best so far (:func:`keep_best_local`; no random numbers drawn). At test time the
server scores every site's kept model on every site's test split (rows ``model = "local:<site>"``,
:func:`cross_site_rows`, shared with ``local``), which the run's summary turns into ``cross_site`` /
``local_avg`` / ``local_gen``. A client that overrides ``on_train`` without calling
``keep_best_local`` (the FedSM family) has no local models.

The best global round's restore puts back the client states of that round, whose kept models are
only the best up to it. So the run asks the server to collect the kept models
(``FedAvgServer.collect_local_models``: one ``share_model`` exchange, evaluation traffic) after the
last round and *before* that restore: each site's model is then its best over all rounds. The kept
model lives in the checkpointed client state, so a resumed run collects the same models.
"""

from __future__ import annotations

import torch
from torch import nn

from fedseg.algorithms.client_state import ROUND, SCORE, keep_if_better, state_group
from fedseg.algorithms.prefixes import MODEL
from fedseg.algorithms.site_scoring import SURFACE
from fedseg.config import RunConfig
from fedseg.engine.base import Engine
from fedseg.engine.context import ClientContext, Task
from fedseg.engine.faults import model_problem
from fedseg.engine.messages import Message, MetaValue, prefixed
from fedseg.evaluate.inference import score_caseset
from fedseg.evaluate.tables import eval_rows, site_dice

LOCAL_BEST = "localbest"  # client-state prefix of the site's best local model (weights)
LOCAL_BEST_SCORE = LOCAL_BEST + SCORE  # client-state entry: the kept local model's validation Dice
LOCAL_BEST_ROUND = LOCAL_BEST + ROUND  # client-state entry: the round it was trained in
SHARE_MODEL = "share_model"  # the action that uploads a site's own model (evaluation traffic)

Models = dict[str, dict[str, torch.Tensor]]  # site -> weights


def local_model_name(site: str) -> str:
    """Name of ``site``'s locally trained model in result rows (``local``'s naming)."""
    return f"local:{site}"


def validated_round(rnd: int, cfg: RunConfig) -> bool:
    """Whether the run validates round ``rnd`` (``fl.validate_every`` and always the last), as a site knows it while
    it trains: a round where a stop budget (``fl.stop``) ends the run early is validated too
    (``fedseg.run.steps.must_validate``), but the budget is reached only once that round's training is counted, so
    its local models are not scored; the kept one is the best of the rounds before."""
    return rnd % cfg.fl.validate_every == 0 or rnd == cfg.fl.rounds


# --- the site ----------------------------------------------------------------------------------------
def keep_best_local(model: nn.Module, ctx: ClientContext) -> None:
    """Score the just-trained ``model`` on the site's validation split and keep it in the state
    store if it beats the best so far (module docstring; ``eval.local_models``).

    Only in validated rounds. The score is the site's mean validation Dice as the run's
    selection computes it (``score_caseset`` at ``cfg.eval`` without HD95; per case the mean
    over regions, NaN not counted; then the mean over cases). A NaN score ranks below every
    number; ties keep the earlier round. Runs inside the train handling: its time is in the
    train row's seconds. Draws no random numbers; leaves ``model``'s train/eval mode as it was.
    """
    cfg = ctx.cfg
    if not (cfg.eval.local_models and validated_round(ctx.round, cfg)):
        return
    data, ev, training = ctx.data.val, cfg.eval, model.training
    dice = score_caseset(
        model, data, ev.batch_size, ev.threshold, False, ctx.task.device, regions=ctx.task.scored_regions
    )["dice"]
    model.train(training)
    keep_if_better(ctx.state, LOCAL_BEST, model, site_dice(dice, data.ids, ctx.site, ctx.task.regions), ctx.round)


def kept_model_reply(ctx: ClientContext, prefix: str = LOCAL_BEST) -> Message:
    """The reply to ``share_model``: the model kept under ``prefix/`` in the site's state (empty if none)."""
    return Message(prefixed(MODEL, state_group(ctx.state, prefix)))


# --- the server --------------------------------------------------------------------------------------
def collect_models(engine: Engine, reference: dict[str, torch.Tensor]) -> Models:
    """Every site's own model (a ``share_model`` exchange: evaluation traffic, outside
    ``floats_sent``); a site that has none replies empty and is left out. A model that is not one of
    ``reference``'s names, shapes and dtypes, or holds NaN/Inf (``fedseg.engine.faults.model_problem``), is the site's
    failure: it would be scored on every site and saved in the bundle."""

    def check(site: str, sent: Message, reply: Message) -> str | None:
        problem = model_problem(reply.group(MODEL), reference) if reply.group(MODEL) else None
        return None if problem is None else f"its own model: {problem}"

    replies = engine.exchange({s: Message() for s in engine.sites}, SHARE_MODEL, check)
    return {s: r.group(MODEL) for s, r in replies.items() if r.group(MODEL)}


def cross_site_rows(engine: Engine, task: Task, models: Models, skip_own: bool = False) -> list[dict]:
    """``models[owner]`` scored on every site's test split, one ``evaluate`` exchange per owner;
    rows ``model = "local:<owner>"``. ``skip_own``: not on the owner's own split (already scored). Dice
    only unless ``eval.cross_site_hd95`` (HD95/NSD NaN: the tables show a dash)."""
    rows = []
    for owner, weights in models.items():
        meta: dict[str, MetaValue] = {
            "split": "test",
            "model": local_model_name(owner),
            "sample": False,
            SURFACE: task.cfg.eval.cross_site_hd95,
        }
        msgs = {s: Message(prefixed(MODEL, weights), dict(meta)) for s in engine.sites if not (skip_own and s == owner)}
        rows += eval_rows(engine.algorithm, engine.exchange(msgs, "evaluate"), task.regions)
    return rows
