"""The coordinator side inside Flower's ServerApp: run a whole fedseg experiment over the Grid.

The ServerApp (``fedseg.flower.apps.server_app``) calls ``serve(grid, run_config)``. The run
config (set by ``fedseg flower local|server`` when it submits the run) carries everything the
coordinator needs and nothing of the sites' data:

- ``fedseg-config``: the resolved ``RunConfig`` (JSON);
- ``fedseg-federation``: the federation header (name, kind, channels, regions, label names)
  and the ordered site names (the order defines each site's index, as in the simulator);
- ``fedseg-version``, ``fedseg-plugins``: the fedseg version and the installed method packages (``{method:
  {distribution, version}}``, ``fedseg.method_plugins``) that submitted the run: the ServerApp and every site refuse
  another version;
- ``fedseg-wait``: seconds to wait for every site's SuperNode; ``fedseg-poll``: reply polling and
  object-pull backoff, seconds (0: Flower's own 3 s and 1 s, see ``fedseg.flower.flwr_internals``);
- ``fedseg-resume``: continue the run in the output folder from its checkpoints (``--resume``);
  ``fedseg-run-key``: names the experiment across Flower runs, so that the sites find the snapshots
  of their state stores kept on disk (``fedseg.flower.snapshots``);
- ``fedseg-simulation`` (Flower's Simulation Runtime only): the folders of the virtual SuperNodes
  (``fedseg.flower.node.NodeSettings.of``);
- ``fedseg-node-sites`` (with SuperNode authentication): ``{node id: site}``, the node id Flower gave each
  registered public key (``--auth-keys``): a site is the holder of its key, whatever its SuperNode declares
  (``fedseg.flower.engine.connect_sites``).

The output folder (summary.json etc.) is not in the run config, which every site receives: the coordinator's
launcher gives it in the ServerApp's environment (``FEDSEG_OUT``, ``fedseg.flower.deploy.COORDINATOR_OUT``). The
ServerApp stops when that launcher is gone (``stop_with_launcher``).

It maps sites to nodes, then runs ``fedseg.run.run_experiment`` with the ``FlowerEngine``:
the same rounds, validation, best-round selection, single test evaluation and output files as
``fedseg run``. The voxel orientations each site reported with its data check are compared as ``fedseg run``'s data
check compares those of a federation it holds: sites whose volumes lie in different orientations get the same kind of
WARNING (one line naming each site's orientation and the ``fedseg data reorient`` that turns the odd ones), not a
refusal; where every volume of every site lies in one, each model bundle's ``manifest.json`` records it
(``orientation``), so ``fedseg predict`` turns its inputs to it, as for a model trained by ``fedseg run``. What each
site's label files hold (counts per region label value) is compared too: a region some sites never hold while others
do, beyond chance, gets the line ``fedseg run``'s data check says (``fedseg.data.check.region_site_warnings``).
Progress goes to ``<out>/flower/server.log``; a failure's message to ``<out>/flower/error.txt`` (the launcher prints
it).
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

import fedseg
from fedseg.config import RunConfig
from fedseg.data.federation import Federation, Regions, Site

log = logging.getLogger("fedseg.flower.server")

DEFAULTS = {
    "fedseg-config": "",
    "fedseg-federation": "",
    "fedseg-wait": 120.0,
    "fedseg-poll": 0.2,
    "fedseg-version": "",
    "fedseg-plugins": "",
    "fedseg-resume": False,
    "fedseg-run-key": "",
    "fedseg-simulation": "",
    "fedseg-node-sites": "",
}
FLOWER_REPLY_POLL = 3.0  # flwr's Grid.send_and_receive interval, used with fedseg-poll = 0


def refuse_unsupported(algorithms: list[str]) -> None:
    """Algorithms that cannot run on real sites (registry: ``AlgorithmSpec.on_flower``) raise ``ValueError``
    naming the reason."""
    from fedseg.algorithms import ALGORITHMS, ON_FLOWER_REGISTERED

    why = {a: ALGORITHMS[a].on_flower if a in ALGORITHMS else None for a in algorithms}  # unknown: refused elsewhere
    bad = [a for a in algorithms if why[a]]
    if bad:
        keep = [a for a in algorithms if not why[a]]
        reasons = "; ".join(f"{a!r}: {why[a]}" for a in bad)
        where = (
            "from Python (fedseg.Experiment: the simulator or the worker pool)"
            if any(why[a] == ON_FLOWER_REGISTERED for a in bad)
            else "with `fedseg run` (the simulator or the worker pool)"
        )
        raise ValueError(
            f"cannot run on Flower: {reasons}. Run it {where}, or drop it: --algorithms {','.join(keep) or 'fedavg'}"
        )


def refuse_repartition(cfg: RunConfig) -> None:
    """``ValueError`` for a ``data.repartition`` (an IID or limited repartition, a held-out site): on Flower each
    site trains on the cases its own SuperNode loads, so a repartition that deals or drops cases across sites
    cannot be applied there, and a run would silently train the federation as it is."""
    part = cfg.data.repartition
    if part.mode == "none" and part.holdout is None:
        return
    what = f"data.repartition.mode={part.mode}" if part.mode != "none" else f"data.repartition.holdout={part.holdout}"
    raise ValueError(
        f"cannot run on Flower: {what} deals, drops or holds out cases across sites, but each Flower site trains on "
        "the data its own SuperNode loads; run the repartition with `fedseg run` (the simulator or the worker pool), "
        "or drop it"
    )


def check_run(cfg: RunConfig) -> None:
    """Before any work: every algorithm of ``cfg`` runs on Flower, the federation is not repartitioned
    (``refuse_repartition``), and under ``fl.secure_aggregation`` the sites' updates stay hidden
    (``fedseg.flower.secure.check``). ``ValueError`` names the reason."""
    from fedseg.flower.secure import check

    refuse_unsupported(cfg.algorithms)
    refuse_repartition(cfg)
    check(cfg)


def federation_record(fed: Federation) -> str:
    """The federation header + ordered site names, as the ``fedseg-federation`` run config value."""
    record = {
        "name": fed.name,
        "kind": fed.kind,
        "channels": int(fed.channels),
        "regions": [[k, v] for k, v in fed.regions.as_dict().items()],
        "label_names": {str(k): v for k, v in (fed.label_names or {}).items()} or None,
        "channel_names": fed.channel_names,
        "sites": fed.site_names,
    }
    if fed.regions.ignore is not None:  # nnU-Net's ignore label; absent otherwise (the record as before)
        record["ignore_label"] = int(fed.regions.ignore)
    return json.dumps(record)


def federation_from_record(raw: str) -> Federation:
    """A case-less ``Federation`` (header + site names): all the coordinator knows about the data."""
    d = json.loads(raw)
    names = {int(k): v for k, v in d["label_names"].items()} if d.get("label_names") else None
    return Federation(
        d["name"],
        d["kind"],
        int(d["channels"]),
        Regions.from_mapping(dict(map(tuple, d["regions"])), d.get("ignore_label")),
        [Site(s, []) for s in d["sites"]],
        names,
        channel_names=d.get("channel_names"),
    )


def _log_to(out: Path) -> logging.Handler:
    (out / "flower").mkdir(parents=True, exist_ok=True)
    handler = logging.FileHandler(out / "flower" / "server.log")
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger("fedseg")
    root.addHandler(handler)
    root.setLevel(os.environ.get("FEDSEG_FLOWER_LOG_LEVEL", "INFO"))  # DEBUG: per-exchange push/wait times
    return handler


def stop_with_launcher(poll: float = 2.0) -> None:
    """End this ServerApp's process once the ``fedseg flower`` process that started the deployment is gone (its PID
    and start time in ``FEDSEG_LAUNCHER_PID``, ``fedseg.flower.deploy.flower_env``): Flower's SuperExec starts the
    ServerApp, out of reach of the launcher's clean-up and of its children's PR_SET_PDEATHSIG, so a coordinator killed
    with SIGKILL left it running, holding its memory (an audit). Gone: no such process, a zombie, or one that started
    at another time (its PID reused). Nothing happens where the variable is not set."""
    import threading
    import time

    from fedseg.flower.deploy import LAUNCHER_PID
    from fedseg.interrupts import is_running, start_time

    pid, _, started = os.environ.get(LAUNCHER_PID, "").partition(":")
    if not pid.isdigit():
        return

    def gone() -> bool:
        return not is_running(int(pid)) or bool(started) and start_time(int(pid)) not in (started, None)

    def watch() -> None:
        while True:
            time.sleep(poll)
            if gone():
                log.error(
                    "the fedseg process that started this coordinator (pid %s) is gone: the ServerApp stops; the "
                    "finished rounds are kept in the run's checkpoints/: the same command with --resume continues",
                    pid,
                )
                os._exit(1)

    threading.Thread(target=watch, name="stop with the launcher", daemon=True).start()


def serve(grid, run_config: dict) -> None:
    """Run the experiment described by ``run_config`` over ``grid`` (see the module docstring)."""
    from fedseg.data.folder import group_problems
    from fedseg.data.reorient import with_reported_orientation
    from fedseg.engine.context import Task
    from fedseg.flower.deploy import COORDINATOR_OUT
    from fedseg.flower.engine import Courier, FlowerEngine, connect_sites
    from fedseg.flower.node import federation_header
    from fedseg.run import Prepared, run_experiment

    if not os.environ.get(COORDINATOR_OUT):
        raise RuntimeError(f"no {COORDINATOR_OUT} in the environment: start the coordinator with `fedseg flower`")
    out = Path(os.environ[COORDINATOR_OUT])
    stop_with_launcher()
    handler = _log_to(out)
    try:
        version = str(run_config.get("fedseg-version", ""))
        if version and version != fedseg.__version__:
            raise RuntimeError(
                f"the run was submitted by fedseg {version} but the coordinator runs fedseg {fedseg.__version__}"
            )
        from fedseg.method_plugins import RUN_CONFIG_KEY, version_problem

        plugins = version_problem(run_config.get(RUN_CONFIG_KEY, ""), "the coordinator")
        if plugins:
            raise RuntimeError(f"the run's method packages: {plugins}")
        cfg = RunConfig.model_validate(json.loads(str(run_config["fedseg-config"])))
        check_run(cfg)
        fed = federation_from_record(str(run_config["fedseg-federation"]))
        from fedseg.flower.flwr_internals import cap_object_pull_backoff

        poll = float(run_config["fedseg-poll"])
        if poll > 0:
            cap_object_pull_backoff(poll)  # replies are pulled as soon as they appear
        courier = Courier(grid, poll=poll if poll > 0 else FLOWER_REPLY_POLL)
        log.info("waiting up to %.0f s for sites %s", float(run_config["fedseg-wait"]), fed.site_names)
        raw_nodes = str(run_config.get("fedseg-node-sites", ""))
        node_sites = {int(k): str(v) for k, v in json.loads(raw_nodes).items()} if raw_nodes else None
        site_map = connect_sites(
            courier, fed.site_names, federation_header(fed), float(run_config["fedseg-wait"]), node_sites
        )
        # as `fedseg run`'s data check warns, grouped as it groups them (a few lines of a kind, then a count)
        for line in group_problems(site_map.orientation_warnings() + site_map.label_warnings(fed.regions)):
            log.warning("%s", line)
        fed = with_reported_orientation(fed, site_map.orientation())  # what the model bundles record
        prep = Prepared(fed, {}, [], Task.of(cfg, fed))

        def engine(name, spec, options, prep, out, observers):
            return FlowerEngine(name, courier, site_map, prep.task, options, observers)

        def round_end(name: str, rnd: int, losses: dict) -> None:
            mean = sum(losses.values()) / max(len(losses), 1)
            log.info("%s round %d/%d: mean train loss %.4f", name, rnd, cfg.fl.rounds, mean)

        run_experiment(
            cfg,
            out,
            resume=bool(run_config.get("fedseg-resume", False)),
            prepared=prep,
            engine_factory=engine,
            on_round_end=round_end,
            on_algorithm_start=lambda name: log.info("%s: start", name),
            hold_out=False,  # the coordinator's process (fedseg flower local/simulate/coordinator) holds it
        )
        log.info("finished: %s", out / "summary.json")
    except BaseException as e:
        (out / "flower" / "error.txt").write_text(f"{type(e).__name__}: {e}" if not str(e) else str(e))
        log.exception("run failed")
        raise
    finally:
        logging.getLogger("fedseg").removeHandler(handler)
        handler.close()
