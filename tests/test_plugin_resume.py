"""A registered method across a resume, in its state and in other processes (from a study that registered FedAvgM as
an out-of-tree plugin):

- a resume whose method now resolves its options to other values (its code edited between the interruption and the
  resume: same name, another default) is refused in one line naming each ``option: recorded -> now`` (it trained the
  remaining rounds with the new default, without a word); a changed code is a warning line;
- a server ``state_dict()`` or a client ``ctx.state`` holding something else than tensors (an int, a nested dict)
  is one line naming the method and the entry, in both engines (a traceback from the checkpoint's copy before);
- ``fedseg run --resume`` / ``fedseg bench --resume`` of a method this process does not know give the Python API's
  hint to register it again;
- ``bench --jobs 2`` of a method registered under ``if __name__ == "__main__":`` registers it in each run's process
  (each failed with ``unknown algorithm``), and one whose class the processes cannot import is refused first."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
import yaml
from pydantic import Field
from typer.testing import CliRunner

from fedseg import AlgorithmSpec, FedAvgClient, FedAvgOptions, FedAvgServer, Message, register_algorithm
from fedseg.algorithms import ALGORITHMS, unregister_algorithm
from fedseg.cli import app
from fedseg.engine.faults import MethodError, SiteFailure
from fedseg.engine.messages import prefixed
from fedseg.run import run_experiment
from fedseg.run.method_record import RECORD
from test_bench import TINY_SET


class MomentumOptions(FedAvgOptions):
    momentum: float = Field(0.9, ge=0, lt=1)


class MomentumOptionsV2(FedAvgOptions):  # the plugin edited: the same option, another default
    momentum: float = Field(0.0, ge=0, lt=1)


class MomentumServer(FedAvgServer):
    """FedAvg whose merged update gets a server momentum (a velocity kept in ``state_dict``)."""

    def __init__(self, engine, task, options):
        super().__init__(engine, task, options)
        self.velocity: dict[str, torch.Tensor] = {}

    def aggregate(self, replies):
        before = self.global_weights
        super().aggregate(replies)
        new = {}
        for name, x in before.items():
            v = self.options.momentum * self.velocity.get(name, torch.zeros_like(x)) + (self.global_weights[name] - x)
            self.velocity[name] = v
            new[name] = x + v
        self.global_weights = new

    def state_dict(self):
        return {**super().state_dict(), **prefixed("velocity", self.velocity)}

    def load_state_dict(self, state):
        super().load_state_dict(state)
        self.velocity = Message(state).group("velocity")


class MomentumServerFixed(MomentumServer):  # the plugin's code edited (another aggregate)
    def aggregate(self, replies):
        super().aggregate(replies)
        self.global_weights = dict(self.global_weights)


class IntStepsServer(FedAvgServer):
    steps = 0

    def aggregate(self, replies):
        super().aggregate(replies)
        self.steps += 1

    def state_dict(self):
        return {**super().state_dict(), "steps": self.steps}


class NestedServer(FedAvgServer):
    def state_dict(self):
        return {**super().state_dict(), "velocity": dict(self.global_weights)}


class IntCountClient(FedAvgClient):
    def train_hooks(self, model, msg, ctx):
        ctx.state["count"] = ctx.state.get("count", 0) + 1  # the mistake: an int, not torch.tensor(n)
        return super().train_hooks(model, msg, ctx)


@pytest.fixture
def registry():
    """The registry as it was after the test."""
    before = dict(ALGORITHMS)
    yield
    for name in set(ALGORITHMS) - set(before):
        unregister_algorithm(name)


def _spec(name, server=MomentumServer, client=FedAvgClient, options=MomentumOptions):
    return AlgorithmSpec(name, name, server, client, "a plugin (a test)", options)


class Stop(Exception):
    pass


def _stop_after(rnd):
    def stop(name, at, losses):
        if at == rnd:
            raise Stop

    return stop


def _interrupted(tmp_path, tiny_config, federation, algorithms, rounds=2):
    """A run of ``algorithms`` stopped after its first algorithm's round 1."""
    cfg = tiny_config(algorithms=algorithms, fl={"rounds": rounds}, eval={"hd95": False, "local_models": False})
    out = tmp_path / "run"
    with pytest.raises(Stop):
        run_experiment(cfg, out, on_round_end=_stop_after(1), federation=federation)
    return cfg, out


def test_a_resume_whose_method_defaults_changed_is_refused_naming_each_option(
    registry, tmp_path, tiny_config, disc_federation
):
    fed = disc_federation(n_sites=2, cases_per_site=8)
    register_algorithm(_spec("test-momentum"))
    cfg, out = _interrupted(tmp_path, tiny_config, fed, ["test-momentum"])
    record = json.loads((out / RECORD).read_text())
    assert record["test-momentum"]["options"]["momentum"] == 0.9 and record["test-momentum"]["code"]
    register_algorithm(_spec("test-momentum", options=MomentumOptionsV2), replace=True)
    before = (out / "checkpoints" / "test-momentum.pt").read_bytes()
    with pytest.raises(ValueError) as caught:
        run_experiment(cfg, out, resume=True, federation=fed)
    text = str(caught.value)
    assert "\n" not in text and "cannot resume: test-momentum (momentum: 0.9 -> 0.0)" in text, text
    assert "the method's defaults changed: another version of its code, or of fedseg" in text, text
    assert (out / "checkpoints" / "test-momentum.pt").read_bytes() == before  # nothing trained
    register_algorithm(_spec("test-momentum"), replace=True)  # the code the run started with: it resumes
    run_experiment(cfg, out, resume=True, federation=fed)
    assert (out / "summary.json").is_file()


def test_a_run_without_a_record_resumes_as_before_and_an_unstarted_method_takes_its_new_defaults(
    registry, tmp_path, tiny_config, disc_federation
):
    """A run of an older fedseg has no record: it resumes (the record starts then). A method that had not trained
    when the run stopped (the second of two) runs at its defaults of now: nothing of it ran with the old ones."""
    fed = disc_federation(n_sites=2, cases_per_site=8)
    register_algorithm(_spec("test-first"))
    register_algorithm(_spec("test-second"))
    cfg, out = _interrupted(tmp_path, tiny_config, fed, ["test-first", "test-second"])
    old = tmp_path / "old"
    shutil.copytree(out, old)
    (old / RECORD).unlink()
    register_algorithm(_spec("test-first", options=MomentumOptionsV2), replace=True)
    run_experiment(cfg, old, resume=True, federation=fed)  # no record: as before
    assert json.loads((old / RECORD).read_text())["test-first"]["options"]["momentum"] == 0.0
    register_algorithm(_spec("test-first"), replace=True)
    register_algorithm(_spec("test-second", options=MomentumOptionsV2), replace=True)
    run_experiment(cfg, out, resume=True, federation=fed)  # test-second had not started
    record = json.loads((out / RECORD).read_text())
    assert record["test-first"]["options"]["momentum"] == 0.9 and record["test-second"]["options"]["momentum"] == 0


def test_a_resume_with_the_methods_code_changed_warns_in_one_line(registry, tmp_path, tiny_config, disc_federation):
    fed = disc_federation(n_sites=2, cases_per_site=8)
    register_algorithm(_spec("test-edited"))
    cfg, out = _interrupted(tmp_path, tiny_config, fed, ["test-edited"])
    lines: list[str] = []
    register_algorithm(_spec("test-edited"), replace=True)  # registered again, the same code: no word
    shutil.copytree(out, tmp_path / "same")
    run_experiment(cfg, tmp_path / "same", resume=True, federation=fed, on_log_line=lines.append)
    assert not [line for line in lines if "differs from the code" in line], lines
    register_algorithm(_spec("test-edited", server=MomentumServerFixed), replace=True)
    run_experiment(cfg, out, resume=True, federation=fed, on_log_line=lines.append)
    warned = [line for line in lines if "differs from the code" in line]
    assert len(warned) == 1 and warned[0].startswith("warning: test-edited: the code of MomentumServerFixed"), lines
    assert warned[0] in (out / "run.log").read_text()


def test_a_resume_under_other_fedseg_code_warns_in_one_line(tmp_path, tiny_config, disc_federation):
    """A run interrupted, fedseg updated (a `git pull`, another release), then resumed: the rounds trained after the
    resume ran the new code without a word (a fix to a resampling between the two, as FedSM's 3D selector had, mixed
    two versions in one run). The record keeps fedseg's version, commit and uncommitted edits per method."""
    from fedseg.run.provenance import source_state

    fed = disc_federation(n_sites=2, cases_per_site=8)
    cfg, out = _interrupted(tmp_path, tiny_config, fed, ["fedavg"])
    record = json.loads((out / RECORD).read_text())
    now = record["fedavg"]["fedseg"]
    assert now == source_state() and now["version"]
    lines: list[str] = []
    shutil.copytree(out, tmp_path / "same")
    run_experiment(cfg, tmp_path / "same", resume=True, federation=fed, on_log_line=lines.append)
    assert not [line for line in lines if "started under" in line], lines  # the same code: no word
    older = {**now, "version": "0.0.1", "commit": None, "dirty": None, "changes": None}  # an installed release
    changes = [older] + ([{**now, "commit": "0" * 40, "dirty": False, "changes": None}] if now["commit"] else [])
    for i, before in enumerate(changes):
        run = tmp_path / f"moved{i}"
        shutil.copytree(out, run)
        (run / RECORD).write_text(json.dumps({**record, "fedavg": {**record["fedavg"], "fedseg": before}}))
        lines = []
        run_experiment(cfg, run, resume=True, federation=fed, on_log_line=lines.append)
        warned = [line for line in lines if "started under" in line]
        was = "fedseg 0.0.1" if i == 0 else f"fedseg {now['version']} at commit 000000000000"
        assert len(warned) == 1 and warned[0].startswith(f"warning: fedavg started under {was} and continues under"), (
            lines
        )
        assert warned[0] in (run / "run.log").read_text()
        kept = json.loads((run / RECORD).read_text())["fedavg"]["fedseg"]
        assert kept == before  # the record keeps the code the method started with


@pytest.mark.parametrize(
    "server, said",
    [
        (IntStepsServer, "IntStepsServer.state_dict()['steps'] is an int; a method's state holds tensors only (keep"),
        (NestedServer, "NestedServer.state_dict()['velocity'] is a dict; a method's state holds tensors only (put a"),
    ],
    ids=["int", "nested-dict"],
)
def test_a_server_state_of_no_tensors_is_one_line_at_round_1(
    registry, tmp_path, tiny_config, disc_federation, server, said
):
    register_algorithm(_spec("test-state", server=server, options=FedAvgOptions))
    cfg = tiny_config(algorithms=["test-state"], eval={"hd95": False, "local_models": False})
    with pytest.raises(MethodError) as caught:
        run_experiment(cfg, tmp_path / "run", federation=disc_federation(n_sites=2, cases_per_site=8))
    assert str(caught.value).startswith(f"test-state, round 1: {said}"), str(caught.value)


@pytest.mark.parametrize("workers", [1, 2], ids=["simulator", "pool"])
def test_a_client_state_of_no_tensors_is_the_same_line_in_both_engines(
    registry, tmp_path, tiny_config, disc_federation, workers
):
    register_algorithm(_spec("test-count", server=FedAvgServer, client=IntCountClient, options=FedAvgOptions))
    cfg = tiny_config(algorithms=["test-count"], engine={"workers": workers}, eval={"hd95": False})
    with pytest.raises(SiteFailure) as caught:
        run_experiment(cfg, tmp_path / "run", federation=disc_federation(n_sites=2, cases_per_site=8))
    assert str(caught.value) == (
        "site 'site1', round 1, test-count train: TypeError: ctx.state['count'] is an int; a method's state holds "
        "tensors only (keep a number as torch.tensor(1))"
    ), str(caught.value)


REGISTER_AGAIN = "a method added with register_algorithm exists only in the process that registered it"


def test_cli_run_resume_of_an_unregistered_method_says_to_register_it_again(tmp_path):
    out = tmp_path / "run"
    out.mkdir()
    (out / "config.yaml").write_text(yaml.safe_dump({"algorithms": ["test-plugin"]}))
    args = ["run", "--preset", "demo", "--algorithms", "test-plugin", "--out", str(out)]
    resumed = CliRunner().invoke(app, [*args, "--resume"])
    assert resumed.exit_code == 1 and "unknown algorithm 'test-plugin'" in resumed.output, resumed.output
    assert REGISTER_AGAIN in resumed.output, resumed.output
    typo = CliRunner().invoke(app, [*args[:4], "test-plugn", *args[5:], "--resume"])  # not the run's: no hint
    assert "unknown algorithm 'test-plugn'" in typo.output and REGISTER_AGAIN not in typo.output, typo.output


def test_cli_bench_resume_of_an_unregistered_method_says_to_register_it_again(tmp_path):
    bench = {
        "name": "b",
        "base": {"preset": "demo"},
        "federations": ["synthetic-retina"],
        "methods": ["fedavg", "test-plugin"],
        "budget": {"rule": "rounds", "rounds": 1},
    }
    (tmp_path / "bench.yaml").write_text(yaml.safe_dump(bench))
    out = tmp_path / "out"
    out.mkdir()
    (out / "bench.json").write_text(json.dumps({**bench, "methods": [{"name": "fedavg"}, {"name": "test-plugin"}]}))
    args = ["bench", str(tmp_path / "bench.yaml"), "--out", str(out)]
    resumed = CliRunner().invoke(app, [*args, "--resume"])
    assert resumed.exit_code == 1 and "unknown algorithm 'test-plugin'" in resumed.output, resumed.output
    assert REGISTER_AGAIN in " ".join(resumed.output.split()), resumed.output


TINY_BENCH_SET = [*TINY_SET, "eval.hd95=false"]  # test_bench's tiny runs


def _tiny_bench(tmp_path, method):
    from fedseg.bench.plan import load_bench

    spec = {
        "name": "tiny",
        "base": {"preset": "synthetic-retina"},
        "set": TINY_BENCH_SET,
        "federations": ["synthetic-retina"],
        "methods": [method],
        "seeds": [0, 1],
        "split": {"mode": "ratio"},
        "budget": {"rule": "rounds", "rounds": 1},
        "reference": method,
    }
    (tmp_path / "bench.yaml").write_text(yaml.safe_dump(spec))
    return load_bench(tmp_path / "bench.yaml")


def test_bench_jobs_2_registers_this_processs_methods_in_each_runs_process(registry, tmp_path):
    """The runs' processes are fresh (forkserver): a method registered here only (a script's registration under
    ``if __name__ == "__main__":``) was unknown there, each run failed and stopped the others."""
    from fedseg.bench.phases import run_bench

    register_algorithm(_spec("test-jobs"))
    spec, root = _tiny_bench(tmp_path, "test-jobs")
    runs = run_bench(spec, root, tmp_path / "out", jobs=2, echo=lambda line: None)
    assert len(runs.final) == 2
    assert all(f.summary["algorithms"]["test-jobs"]["kind"] == "global" for f in runs.final.values())


def test_bench_jobs_2_refuses_a_method_the_runs_processes_cannot_import_before_any_run(registry, tmp_path):
    from fedseg.bench.phases import run_bench

    class Local(MomentumServer):  # defined inside a function: no process can import it
        pass

    register_algorithm(_spec("test-local", server=Local))
    spec, root = _tiny_bench(tmp_path, "test-local")
    with pytest.raises(ValueError) as caught:
        run_bench(spec, root, tmp_path / "out", jobs=2, echo=lambda line: None)
    assert str(caught.value).startswith("bench --jobs > 1 (each run in a new process): method 'test-local': class ")
    assert "is defined inside a function" in str(caught.value) and "or use --jobs 1" in str(caught.value)
    assert not (tmp_path / "out").exists()  # before anything is written


PLUGIN = """
from fedseg import AlgorithmSpec, FedAvgClient, FedAvgServer, register_algorithm


class Picky(FedAvgServer):
    def aggregation_weights(self, replies):
        return {s: 1.0 if s not in {"site7", "site8", "site9"} else 0.5 for s in replies}  # a frozenset constant


register_algorithm(AlgorithmSpec("test-picky", "picky", Picky, FedAvgClient, "a plugin (a test)"))
"""


def test_the_code_digest_is_the_same_in_every_process(tmp_path):
    """The digest is of bytecode, constants and names: a set constant's order follows string hashing, which differs
    between processes (PYTHONHASHSEED), so it is sorted; a digest that changed with it would warn on every resume."""
    import os
    import subprocess
    import sys

    (tmp_path / "picky.py").write_text(PLUGIN)
    code = "import picky; from fedseg.run.method_record import code_digest; print(code_digest('test-picky'))"
    digests = set()
    for seed in ("1", "3"):  # two seeds that order {"site7", "site8", "site9"} differently
        env = {**os.environ, "PYTHONHASHSEED": seed, "PYTHONPATH": str(tmp_path)}
        done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
        digests.add(done.stdout.strip())
    assert len(digests) == 1 and len(digests.pop()) == 64


def test_a_bench_does_not_reuse_a_finished_run_whose_method_defaults_changed(registry, tmp_path):
    """A finished bench run is reused when its configuration is the same; trained before the plugin's default
    changed, its numbers would have joined runs trained with the new one in the same table."""
    from fedseg.bench.phases import run_bench

    register_algorithm(_spec("test-bench-defaults"))
    spec, root = _tiny_bench(tmp_path, "test-bench-defaults")
    run_bench(spec, root, tmp_path / "out", echo=lambda line: None)
    register_algorithm(_spec("test-bench-defaults", options=MomentumOptionsV2), replace=True)
    with pytest.raises(ValueError, match=r"cannot resume: test-bench-defaults \(momentum: 0.9 -> 0.0\)"):
        run_bench(spec, root, tmp_path / "out", resume=True, echo=lambda line: None)


def retina_by_another_name(cfg):
    """A registered federation's builder (module level: the bench's run processes import it by name)."""
    from fedseg.data.sources import build_federation

    return build_federation(cfg.model_copy(update={"data": cfg.data.model_copy(update={"source": "synthetic-retina"})}))


@pytest.fixture
def federations():
    from fedseg.data.sources import REGISTERED

    before = dict(REGISTERED)
    yield
    REGISTERED.clear()
    REGISTERED.update(before)


def _bench_of_registered_federation(tmp_path, source):
    from fedseg.bench.plan import load_bench

    spec = {
        "name": "tiny",
        "base": {"preset": "synthetic-retina"},
        "set": TINY_BENCH_SET,
        "federations": [{"name": "mine", "set": [f"data.source={source}"]}],
        "methods": ["fedavg"],
        "seeds": [0, 1],
        "split": {"mode": "ratio"},
        "budget": {"rule": "rounds", "rounds": 1},
    }
    (tmp_path / "bench.yaml").write_text(yaml.safe_dump(spec))
    return load_bench(tmp_path / "bench.yaml")


def test_bench_jobs_2_registers_this_processs_federations_in_each_runs_process(federations, tmp_path):
    """As for methods: a federation registered only here was an unknown data.source in every run's process."""
    from fedseg.bench.phases import run_bench
    from fedseg.data.sources import register_federation

    register_federation("test-fed-jobs", retina_by_another_name, sites=3)
    spec, root = _bench_of_registered_federation(tmp_path, "test-fed-jobs")
    runs = run_bench(spec, root, tmp_path / "out", jobs=2, echo=lambda line: None)
    assert len(runs.final) == 2


def test_bench_jobs_2_refuses_a_federation_it_cannot_send_before_any_run(federations, tmp_path):
    from fedseg.bench.phases import run_bench
    from fedseg.data.sources import register_federation

    register_federation("test-fed-lambda", lambda cfg: retina_by_another_name(cfg), sites=3)
    spec, root = _bench_of_registered_federation(tmp_path, "test-fed-lambda")
    with pytest.raises(ValueError, match=r"federation 'test-fed-lambda' cannot be sent to the run processes"):
        run_bench(spec, root, tmp_path / "out", jobs=2, echo=lambda line: None)
    assert not list((tmp_path / "out").glob("runs/**/config.yaml"))


class OddOptions(MomentumOptions):
    """Options whose values a plain comparison of their JSON got wrong (a reviewer): a set (its order follows string
    hashing, which differs between processes) and a NaN (equal to nothing)."""

    skip: frozenset[str] = frozenset({"eps", "alpha", "beta", "gamma", "delta"})
    tau: float = float("nan")


def test_a_set_or_a_nan_option_resumes_and_is_recorded_as_strict_json(registry, tmp_path, tiny_config, disc_federation):
    from fedseg.run.method_record import comparable

    fed = disc_federation(n_sites=2, cases_per_site=8)
    register_algorithm(_spec("test-odd", options=OddOptions))
    cfg, out = _interrupted(tmp_path, tiny_config, fed, ["test-odd"])
    run_experiment(cfg, out, resume=True, federation=fed)  # was refused: "tau: nan -> nan"
    options = json.loads((out / RECORD).read_text(), parse_constant=lambda c: pytest.fail(f"{c} in the record"))
    assert options["test-odd"]["options"]["skip"] == ["alpha", "beta", "delta", "eps", "gamma"]
    assert options["test-odd"]["options"]["tau"] == "nan"
    assert comparable(frozenset(["b", "a"])) == comparable(frozenset(["a", "b"])) == ["a", "b"]
    import enum

    class Mode(enum.Enum):
        MEAN = "mean"

    assert comparable({"mode": Mode.MEAN}) == {"mode": "mean"}  # as JSON mode recorded it (a reviewer: Mode.MEAN)
