"""The engines of a run's algorithms: the in-process simulator, or engines on one worker pool for the run."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from fedseg.algorithms.registry import AlgorithmSpec
from fedseg.config import RunConfig
from fedseg.engine.base import Engine, Observer
from fedseg.engine.simulator import Simulator
from fedseg.engine.state import state_store
from fedseg.run.preparation import Prepared

# (algorithm name, AlgorithmSpec, validated options, Prepared, out dir, observers) -> engine; see ``simulator_engine``
EngineFactory = Callable[..., Engine]


def simulator_engine(
    name: str, spec: AlgorithmSpec, options: Any, prep: Prepared, out: Path, observers: list[Observer] | None
) -> Simulator:
    """The default engine: every site in this process, data from ``prep.site_data``; the sites' state stores
    where ``engine.state`` says (``fedseg.engine.state``; disk: OUT/states/<name>/)."""
    store = state_store(prep.task.cfg, [d.name for d in prep.site_data], out / "states" / name)
    return Simulator(name, spec.client(), prep.site_data, prep.task, options, out / "samples", observers, store)


@contextmanager
def local_engines(
    cfg: RunConfig, prep: Prepared, engine_factory: EngineFactory | None, idle: bool = False
) -> Iterator[EngineFactory | None]:
    """The engine factory of a run: ``engine_factory`` if given (e.g. Flower), else the simulator
    (``engine.workers`` = 1: None, ``run_algorithm``'s default) or engines on one worker pool for the whole
    run (``fedseg.engine.pool``), whose processes end when the context does (also on errors). ``idle``: the run
    has nothing to train or evaluate (a finished run resumed: each algorithm's result is read back from its
    checkpoint before its engine is used), so no pool is started, whatever ``engine.workers``: the simulator's
    engines, which start no process."""
    if engine_factory is not None or cfg.engine.workers == 1 or idle:
        yield engine_factory
        return
    from fedseg.engine.pool import PoolEngine, WorkerPool

    devices = cfg.engine.devices or [cfg.device]
    with WorkerPool(prep.site_data, cfg.engine.workers, cfg.threads, devices) as pool:

        def pool_engine(
            name: str, spec: AlgorithmSpec, options: Any, prep: Prepared, out: Path, observers: list[Observer] | None
        ) -> PoolEngine:
            store = state_store(prep.task.cfg, [d.name for d in prep.site_data], out / "states" / name)
            client = spec.client()
            return PoolEngine(name, client, pool, prep.site_data, prep.task, options, out / "samples", observers, store)

        yield pool_engine
