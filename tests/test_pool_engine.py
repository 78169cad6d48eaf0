"""The worker pool (fedseg.engine.pool): bit-identical to the simulator for any number of workers, resumable
across worker counts, faults as on the simulator, a dead worker named by its site, no worker left behind."""

from __future__ import annotations

import csv
import json
import multiprocessing
import os
import subprocess
import sys

import pytest
import torch

from fedseg.algorithms import register_algorithm, unregister_algorithm
from fedseg.algorithms.fedavg import FedAvgClient, FedAvgOptions, FedAvgServer
from fedseg.algorithms.registry import AlgorithmSpec
from fedseg.engine.faults import SiteFailure
from fedseg.run import run_experiment

ALGORITHMS = ["fedavg", "fedsm", "scaffold"]
WALL_CLOCK = {"seconds", "wall_seconds"}


def _numbers(out) -> dict:
    """summary.json without wall-clock seconds."""
    summary = json.loads((out / "summary.json").read_text())
    return {a: {k: v for k, v in e.items() if k != "seconds"} for a, e in summary["algorithms"].items()}


def _ledger(out) -> list[dict]:
    """ledger.csv rows without the wall-clock columns."""
    with open(out / "ledger.csv") as f:
        return [{k: v for k, v in row.items() if k not in WALL_CLOCK} for row in csv.DictReader(f)]


def _weights(out, algorithm: str) -> bytes:
    return (out / "model" / algorithm / "weights.safetensors").read_bytes()


def _worker_pids() -> set[int]:
    return {p.pid for p in multiprocessing.active_children() if p.name.startswith("fedseg-worker-") and p.pid}


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


@pytest.fixture(scope="module")
def sequential(tmp_path_factory, tiny_config, disc_federation):
    """fedavg, fedsm and scaffold, 2 rounds, on the simulator (workers = 1)."""
    out = tmp_path_factory.mktemp("pool") / "w1"
    run_experiment(tiny_config(algorithms=ALGORITHMS), out, federation=disc_federation())
    return out


@pytest.mark.parametrize("state", ["memory", "disk"])
def test_two_workers_give_bit_identical_summary_ledger_and_weights(
    state, sequential, tmp_path, tiny_config, disc_federation
):
    """W = 2 against W = 1, with the state stores in RAM (where an unchanged store a worker returned is sent again
    as its buffer, ``WorkerPool.store_payload``) and on disk: every number of summary.json, every ledger row's
    floats and steps, and the saved weights' bytes."""
    out = tmp_path / "w2"
    pids: set[int] = set()
    seen = lambda site, action, msg, reply: pids.update(_worker_pids())  # noqa: E731
    cfg = tiny_config(algorithms=ALGORITHMS, engine={"workers": 2, "state": state})
    run_experiment(cfg, out, federation=disc_federation(), observers=[seen])
    assert len(pids) == 2  # two workers answered, and no others were started
    assert all(_gone(pid) for pid in pids), "a worker process outlived the run"
    assert _numbers(out) == _numbers(sequential)
    assert _ledger(out) == _ledger(sequential)
    for algorithm in ALGORITHMS:
        assert _weights(out, algorithm) == _weights(sequential, algorithm), algorithm
    assert not (out / "states").exists()  # the disk stores are removed when each algorithm finishes


class _Stop(Exception):
    pass


def test_a_checkpoint_written_with_two_workers_resumes_with_one_identically(
    sequential, tmp_path, tiny_config, disc_federation
):
    out = tmp_path / "cut"

    def stop(name, rnd, losses):
        if rnd == 1:
            raise _Stop

    with pytest.raises(_Stop):
        run_experiment(
            tiny_config(algorithms=["scaffold"], engine={"workers": 2}),
            out,
            federation=disc_federation(),
            on_round_end=stop,
        )
    run_experiment(tiny_config(algorithms=["scaffold"]), out, resume=True, federation=disc_federation())
    assert _numbers(out)["scaffold"] == _numbers(sequential)["scaffold"]
    assert _weights(out, "scaffold") == _weights(sequential, "scaffold")
    assert _ledger(out) == [r for r in _ledger(sequential) if r["algorithm"] == "scaffold"]


def test_faults_behave_as_on_the_simulator(tmp_path, tiny_config, disc_federation):
    """An injected crash and NaN, skipped: same failures recorded, same models, with 1 and 2 workers."""
    faults = [{"site": "site2", "round": 1, "kind": "crash"}, {"site": "site3", "round": 2, "kind": "nan"}]
    results = {}
    for workers in (1, 2):
        cfg = tiny_config(algorithms=["fedavg"], fl={"on_failure": "skip"}, faults=faults, engine={"workers": workers})
        results[workers] = run_experiment(cfg, tmp_path / str(workers), federation=disc_federation()).algorithms[0]
    failures = [(f["round"], f["site"], f["action"]) for f in results[2].summary["failures"]]
    assert failures == [(1, "site2", "train"), (2, "site3", "train")]
    assert results[2].summary["failures"] == results[1].summary["failures"]
    assert "InjectedCrash" in results[2].summary["failures"][0]["reason"]
    for k, v in results[1].bundle["global"].items():
        assert torch.equal(v, results[2].bundle["global"][k]), k


class _ExitingClient(FedAvgClient):
    """FedAvg's client whose process ends abruptly (no exception, no reply) at site2 in round 2."""

    def on_train(self, msg, ctx):
        if ctx.site == "site2" and ctx.round == 2:
            os._exit(7)
        return super().on_train(msg, ctx)


@pytest.fixture
def exiting():
    spec = AlgorithmSpec("pool-exit", "Exits", FedAvgServer, _ExitingClient, "dies at site2, round 2", FedAvgOptions)
    register_algorithm(spec, replace=True)
    yield spec.name
    unregister_algorithm(spec.name)


@pytest.mark.slow
def test_a_dead_worker_stops_the_run_naming_the_site_and_leaves_no_process(
    exiting, tmp_path, tiny_config, disc_federation
):
    pids: set[int] = set()
    seen = lambda site, action, msg, reply: pids.update(_worker_pids())  # noqa: E731
    cfg = tiny_config(algorithms=[exiting], engine={"workers": 2}, eval={"local_models": False})
    with pytest.raises(SiteFailure, match=r"site 'site2', round 2, pool-exit train: WorkerDied: .*site 'site2'.*7"):
        run_experiment(cfg, tmp_path / "stop", federation=disc_federation(), observers=[seen])
    assert len(pids) >= 2 and all(_gone(pid) for pid in pids), "a worker process outlived the failed run"
    assert not _worker_pids()


@pytest.mark.slow
def test_under_skip_a_dead_workers_site_is_skipped_and_the_worker_replaced(
    exiting, tmp_path, tiny_config, disc_federation
):
    pids: set[int] = set()
    seen = lambda site, action, msg, reply: pids.update(_worker_pids())  # noqa: E731
    cfg = tiny_config(
        algorithms=[exiting], engine={"workers": 2}, fl={"on_failure": "skip"}, eval={"local_models": False}
    )
    (result,) = run_experiment(cfg, tmp_path / "skip", federation=disc_federation(), observers=[seen]).algorithms
    (failure,) = result.summary["failures"]
    assert (failure["round"], failure["site"]) == (2, "site2") and "WorkerDied" in failure["reason"]
    assert len(pids) == 3  # the two started, and the one that replaced the dead worker
    assert all(_gone(pid) for pid in pids), "a worker process outlived the run"
    assert {r["site"] for r in result.ledger if r["round"] == 2 and r["action"] == "evaluate"} == {
        "site1",
        "site2",
        "site3",
    }  # the replacement serves site2 again


def test_a_store_the_client_left_unchanged_is_not_sent_back_or_rewritten(tmp_path, tiny_config, disc_federation):
    """With the stores on disk (a save writes a new file and renames it over the old), every site's store file is
    rewritten by a train exchange (FedSM keeps its personalized model and moments there) and left as it was by the
    validation exchanges, whose clients change nothing: the worker sends an unchanged store back as None."""
    out = tmp_path / "w2"
    files = out / "states" / "fedsm"
    seen: list[tuple[str, str, tuple[int, int] | None]] = []

    def record(site, action, msg, reply):
        path = files / f"{site}.safetensors"
        seen.append((site, action, (path.stat().st_ino, path.stat().st_mtime_ns) if path.exists() else None))

    cfg = tiny_config(algorithms=["fedsm"], engine={"workers": 2, "state": "disk"})
    run_experiment(cfg, out, federation=disc_federation(), observers=[record])
    previous: dict[str, tuple[str, tuple[int, int] | None]] = {}  # site -> its last (action, file stamp)
    rewritten = {"train": 0, "evaluate": 0}
    for site, action, stamp in seen:
        before = previous.get(site)
        # a validation right after training (the final test follows a best-round restore, which rewrites files)
        if before is not None and (action == "train" or before[0] == "train"):
            rewritten[action] += stamp != before[1]
        previous[site] = (action, stamp)
    sites = len(disc_federation().sites)
    assert rewritten["train"] >= sites  # round 2's train exchange rewrote every site's store
    assert rewritten["evaluate"] == 0, "\n".join(map(str, seen))


def test_messages_with_the_same_tensors_share_one_pack():
    """The sites' messages of an exchange usually hold the same model: ``WorkerPool.run`` packs (copies into
    shared memory) each distinct set of tensors once. Same tensor objects -> same key; another object with equal
    values, or the same object changed in place, -> another key (so it is packed anew)."""
    from fedseg.engine.pool import tensors_key

    weights = {"w": torch.ones(3), "b": torch.zeros(1)}
    per_site = [dict(weights) for _ in range(3)]  # one dict per site, the same tensors
    assert len({tensors_key(t) for t in per_site}) == 1
    assert tensors_key({"w": torch.ones(3), "b": torch.zeros(1)}) != tensors_key(weights)  # equal, not the same
    before = tensors_key(weights)
    weights["w"].add_(1)
    assert tensors_key(weights) != before


def test_the_pool_imports_what_the_run_will_need_while_its_server_starts():
    """``start_forkserver(while_waiting=...)``: the modules named are imported (in a thread) by the time the pool
    has started; a provider that fails changes nothing else (a fresh interpreter: imports are global)."""
    import subprocess
    import sys

    code = """
import sys
from fedseg.engine.forkserver import start_forkserver
from fedseg.engine.pool import WorkerPool
seen = []
for names in (lambda: 1 / 0, lambda: ["fedseg.report.html"]):
    start_forkserver(while_waiting=names)
    with WorkerPool([], 1, 1, ["cpu"]) as pool:
        seen.append(("fedseg.report.html" in sys.modules, len(pool.pids)))
print(seen)
"""
    import resource

    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    low = lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (256, hard))  # noqa: E731
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, preexec_fn=low)  # noqa: PLW1509
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().splitlines()[-1] == "[(False, 1), (True, 1)]"


# --- what the workers cannot import: one line, before they have to --------------------------------------------
_NOTEBOOK = """
import sys
from fedseg import AlgorithmSpec, FedAvgClient, FedAvgServer, load_config, register_algorithm
from fedseg.run import run_experiment

class MyClient(FedAvgClient):
    pass

register_algorithm(AlgorithmSpec("myclient", "Mine", FedAvgServer, MyClient, "x"), replace=True)
overrides = ["fl.rounds=1", "data.scale=0.1", "data.image_size=32", "threads=1", "engine.workers=2"]
cfg = load_config(preset="demo", overrides=overrides + [f"algorithms=[{sys.argv[2]}]"])
try:
    run_experiment(cfg, sys.argv[1])
except ValueError as e:
    print("ERROR:", e)
"""


def _script_run(tmp_path, args: list[str], stdin: str | None = None) -> tuple[list[str], str]:
    """Run ``python ARGS`` (in ``tmp_path``); its stdout's ``ERROR:`` lines and its stderr. Output goes to files, not
    pipes: the pool's process server, still importing when the run is refused, holds them open a few seconds."""
    import subprocess
    import sys

    out, err = tmp_path / "stdout.txt", tmp_path / "stderr.txt"
    with open(out, "w") as o, open(err, "w") as e:
        subprocess.run([sys.executable, *args], input=stdin, stdout=o, stderr=e, text=True, cwd=tmp_path, timeout=120)
    return [line for line in out.read_text().splitlines() if line.startswith("ERROR:")], err.read_text()


def test_a_method_defined_in_a_sessions_main_is_refused_in_one_line(tmp_path):
    """A method registered from a notebook or ``python -c`` (its client class in a ``__main__`` the workers do not
    load): one ValueError naming the method, the class and the fix, before any worker tried to import it; no
    worker traceback, no WorkerDied."""
    errors, stderr = _script_run(tmp_path, ["-c", _NOTEBOOK, str(tmp_path / "run"), "myclient"])
    assert len(errors) == 1, stderr[-3000:]
    assert "method 'myclient': class MyClient is defined in __main__" in errors[0]
    assert "importable by the workers, or use engine.workers: 1" in errors[0]
    assert "Traceback" not in stderr and "WorkerDied" not in stderr, stderr[-3000:]


def test_a_script_that_starts_the_run_at_its_top_level_is_refused_in_one_line(tmp_path):
    """Each worker runs a script's top level again as it starts: a run started there, not under ``if __name__ ==
    "__main__":``, would start again in every worker (each printing a traceback); refused before any starts."""
    script = tmp_path / "unguarded.py"
    script.write_text(_NOTEBOOK.replace("class MyClient(FedAvgClient):\n    pass", "MyClient = FedAvgClient"))
    errors, stderr = _script_run(tmp_path, [str(script), str(tmp_path / "run"), "fedavg"])
    assert len(errors) == 1, stderr[-3000:]
    assert "unguarded.py starts the run at its top level (line 12)" in errors[0]
    assert 'put the run under `if __name__ == "__main__":`' in errors[0]
    assert "Traceback" not in stderr, stderr[-3000:]


@pytest.mark.parametrize(
    ("source", "unconditional"),
    [
        ("run()\n", True),
        ("with ctx():\n    for a in b:\n        run()\n", True),
        ("try:\n    run()\nfinally:\n    pass\n", True),
        ('if __name__ == "__main__":\n    run()\n', False),
        ("if main():\n    run()\n", False),  # some other condition: let through
        ("try:\n    pass\nexcept E:\n    run()\n", False),
        ('run() if __name__ == "__main__" else None\n', False),
    ],
)
def test_only_a_statement_under_no_condition_counts_as_unguarded(tmp_path, source, unconditional):
    from fedseg.engine.worker_imports import _unconditional

    path = tmp_path / "script.py"
    path.write_text("import x\n" + source)
    line = 1 + next(i for i, text in enumerate(source.splitlines(), 1) if "run()" in text)
    assert _unconditional(str(path), line) is unconditional


def test_a_class_defined_inside_a_function_is_refused_naming_it():
    from fedseg.engine.worker_imports import check_sendable

    def make():
        class Local(FedAvgClient):
            pass

        return Local()

    with pytest.raises(ValueError, match=r"method 'loc': class .*make.<locals>.Local is defined inside a function"):
        check_sendable("loc", (make(), None, FedAvgOptions(), None))
    check_sendable("fedavg", (FedAvgClient(), None, FedAvgOptions(), None))  # importable: nothing to say


def test_a_client_a_worker_cannot_load_is_each_sites_error_not_a_worker_traceback(
    tmp_path, tiny_config, disc_federation, capfd
):
    """A class the parent has and the workers cannot import (here a module made in memory) gets past the checks:
    the workers report it as the method's error at each site (the run stops with one line), they do not die."""
    import sys
    import types

    module = types.ModuleType("fedseg_parent_only")
    exec("from fedseg.algorithms.fedavg import FedAvgClient\nclass Client(FedAvgClient):\n    pass\n", vars(module))
    sys.modules[module.__name__] = module
    register_algorithm(AlgorithmSpec("parent-only", "P", FedAvgServer, module.Client, "x", FedAvgOptions), replace=True)
    try:
        cfg = tiny_config(algorithms=["parent-only"], engine={"workers": 2})
        with pytest.raises(SiteFailure, match=r"could not load method 'parent-only' \(ModuleNotFoundError"):
            run_experiment(cfg, tmp_path / "run", federation=disc_federation())
    finally:
        unregister_algorithm("parent-only")
        del sys.modules[module.__name__]
    assert "Traceback" not in capfd.readouterr().err


def test_a_worker_whose_pool_is_gone_ends_quietly_reading_or_answering():
    """A pool killed with a worker's reply unread resets the pipe: the worker's next read raised
    ConnectionResetError and its answer BrokenPipeError, each a traceback on the terminal after the command had died
    (an interruption audit); both now end the worker as the pool's EOF does. Real pipes, the real worker loop."""
    import multiprocessing

    from fedseg.engine.pool import worker_main

    threads = torch.get_num_threads()
    pool_end, worker_end = multiprocessing.Pipe()
    worker_end.send("a reply the pool never read")
    pool_end.close()  # with that reply unread: a reset
    worker_main(worker_end, threads, "cpu")  # reading: returns, no ConnectionResetError
    pool_end, worker_end = multiprocessing.Pipe()
    pool_end.send(("context", "k", b"not a pickle"))  # an algorithm it cannot load: every answer is an error
    pool_end.send(("answer", "k", "site1", None, None, None))
    pool_end.close()  # gone before the answer is sent
    worker_main(worker_end, threads, "cpu")  # answering: returns, no BrokenPipeError
    assert torch.get_num_threads() == threads


@pytest.mark.skipif(sys.platform == "win32", reason="no RLIMIT_NOFILE")
def test_the_pool_raises_the_soft_limit_of_open_files_its_shared_tensors_need():
    """The pool sends the sites' tensors through shared memory, a file descriptor per tensor (three per volume) in
    the parent and each worker: a FeTS-sized federation on ``--workers`` passed a soft limit of 1024 (a reviewer
    counted 900 descriptors for 300 volumes). Starting the process server raises the soft limit towards the hard one,
    before the server (and the workers it forks) start; in a fresh process whose soft limit is 256."""
    code = (
        "import resource; from fedseg.engine.forkserver import raise_open_files_limit, OPEN_FILES\n"
        "soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)\n"
        "raise_open_files_limit()\n"
        "now = resource.getrlimit(resource.RLIMIT_NOFILE)[0]\n"
        "want = OPEN_FILES if hard == resource.RLIM_INFINITY else min(OPEN_FILES, hard)\n"
        "print(soft, now == max(soft, want))\n"
    )
    done = subprocess.run(
        ["bash", "-c", f"ulimit -Sn 256 && {sys.executable} -c '{code}'"], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["256", "True"], done.stdout


@pytest.mark.slow
@pytest.mark.skipif(not os.path.exists("/proc/self/stat"), reason="reads sessions from /proc (Linux)")
def test_resuming_a_finished_run_starts_no_process_server(tmp_path):
    """`fedseg run --workers 2 --resume` of a finished run reuses every result and only writes the outputs again,
    but started the pool's process server (a process importing torch and every method) and the pool. Watched by
    session in /proc: the run that trains has one; its resume none, and says nothing is trained."""

    from test_interrupts import TINY_SET, run_watching_process_server

    out = tmp_path / "run"
    run = ["run", "--preset", "demo", "--algorithms", "fedavg", "--rounds", "1", "--workers", "2", "--out", str(out)]
    command = [sys.executable, "-m", "fedseg.cli", *run, *(a for s in TINY_SET for a in ("--set", s))]

    def watched(*more: str) -> tuple[bool, str]:
        return run_watching_process_server([*command, *more])

    trained, _ = watched()
    assert trained  # the check sees a process server where there is one
    resumed, output = watched("--resume")
    assert "every algorithm of this run has finished; nothing is trained" in " ".join(output.split())
    assert not resumed, output[-3000:]
