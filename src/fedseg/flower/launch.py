"""What ``fedseg flower local | server | supernode`` do.

- ``run_supernode``: one hospital (``fedseg.flower.supernode``). The SuperLink is started by
  ``fedseg.flower.superlink``; the coordinator reads the logs with ``fedseg.flower.log_watch``.
- ``serve_experiment``: the coordinator. Starts a SuperLink (TLS and ``--enable-supernode-auth``
  as given), registers the SuperNodes' public keys, submits fedseg's app with the run's
  config (``flwr run``), waits for it, and returns; the ServerApp writes the run's outputs.
- ``simulate``: ``serve_experiment`` on a SuperLink in simulation mode (Flower's Simulation Runtime, Ray):
  one virtual SuperNode per site (``fedseg.flower.node.NodeSettings.of``), each ClientApp a Ray actor.
- ``local``: ``serve_experiment`` plus one ``fedseg flower supernode`` process per site on this
  machine (127.0.0.1, free ports). Each site gets a folder holding only its own data (a
  ``federation.yaml`` copy and a link to its site folder) and a ``--state`` folder
  (``OUT/flower/state/<site>``); a built-in federation is written to a folder first.

Resume (``--resume``): the coordinator checkpoints its state every round (``OUT/checkpoints``); each
site keeps the snapshots of its state store in its SuperNode's ``--state`` folder. A resumed run is a
new Flower run with the same run key (``OUT/flower/run-key``): the coordinator restores its checkpoint
and asks every site to restore the snapshot that checkpoint names, then goes on with the next round.

Every process started here is stopped on return, on error and on Ctrl-C / SIGTERM.
"""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path

import fedseg
from fedseg.atomic_files import atomic_write_text
from fedseg.config import RunConfig
from fedseg.data.federation import Federation
from fedseg.flower.certs import PUBLIC_KEYS, SITE_KEYS, make_certs
from fedseg.flower.deploy import (
    COORDINATOR_OUT,
    DEFAULT_POLL,
    SUBMITTED_RUN,
    Processes,
    Started,
    flower_env,
    flower_home,
    free_ports,
    register_node,
    submit_run,
    wait_run,
)
from fedseg.flower.log_watch import LOG_LINE, ActivationRefusals, LogTail, log_tail
from fedseg.flower.superlink import LinkSettings, start_superlink
from fedseg.flower.supernode import ISOLATIONS, supernode_command
from fedseg.folder_lock import holding
from fedseg.interrupts import terminate_on_signals
from fedseg.run.preflight import check_device, check_out_dir, check_out_kind, check_out_outside

FLEET_GATE = "fleet-open"  # in OUT/flower while a coordinator runs: its Fleet API is open (superlink_main)
FLOWER_TASK_POLL = 1.0  # flwr's default SuperExec task polling interval (FLWR_SUPEREXEC_TASK_POLL_INTERVAL)


class FlowerRunError(RuntimeError):
    """The Flower run failed; the message is the coordinator's (e.g. a site's data check)."""


# --- the experiment -------------------------------------------------------------------------------


def run_config(
    cfg: RunConfig, fed: Federation, wait: float, poll: float, resume: bool = False, run_key: str = ""
) -> dict:
    """The run config fedseg's ServerApp reads (``fedseg.flower.server``); every site receives it too, so it holds
    nothing of the coordinator's machine (its output folder travels in the ServerApp's environment)."""
    from fedseg.algorithms import plugin_records
    from fedseg.flower.server import federation_record
    from fedseg.method_plugins import RUN_CONFIG_KEY, run_config_value

    return {
        "fedseg-config": cfg.model_dump_json(),
        "fedseg-federation": federation_record(fed),
        "fedseg-wait": float(wait),
        "fedseg-poll": float(poll),
        "fedseg-version": fedseg.__version__,
        RUN_CONFIG_KEY: run_config_value(plugin_records(cfg.algorithms)),  # the method packages' versions
        "fedseg-resume": bool(resume),
        "fedseg-run-key": run_key,
    }


def record_config(cfg: RunConfig, out: Path) -> str:
    """Write the run's configuration as every site records it (``OUT/flower/run-config.json``,
    ``config_load.config_record``) and return the line that gives its digest, for the hospitals to compare."""
    from fedseg.config_load import config_record

    text, digest = config_record(cfg)
    path = out / "flower" / "run-config.json"
    atomic_write_text(path, text)
    return (
        f"configuration sha256 {digest} ({path}; each site logs the same digest and keeps the file as "
        "run-config__<site>__<digest prefix>.json: compare it with the study's agreed configuration)"
    )


def run_key(out: Path, resume: bool) -> str:
    """The experiment's name for the sites' snapshot folders: ``OUT/flower/run-key``, kept by a resume, new (a
    random id: it travels to every site, which need not learn the coordinator's folders) for a new run, so a reused
    ``--state`` folder never mixes two runs."""
    import uuid

    path = Path(out) / "flower" / "run-key"
    if resume and path.is_file() and path.read_text().strip():
        return path.read_text().strip()
    key = uuid.uuid4().hex
    atomic_write_text(path, key + "\n")
    return key


PROTECTION_FILE = "protection.json"  # OUT/flower/: the TLS and SuperNode authentication a run started with


def keep_protection(out: Path, link: LinkSettings, resume: bool, sites: list[str] | None = None) -> None:
    """A run's coordinator keeps the protection it started with: ``OUT/flower/protection.json`` records TLS and
    SuperNode authentication at the first start; a resume without one of them is refused (a coordinator restarted
    without ``--auth-keys`` ran unauthenticated without a word: any SuperNode could then claim a site). It records
    the federation's ``sites`` in their order too, and a resume with another order is refused: a site's index sets its
    random streams (and FedSM's selector labels), and a coordinator given a ``federation.yaml`` with another
    ``site_order`` swapped them in mid-run without a word (a security test)."""
    path = Path(out) / "flower" / PROTECTION_FILE
    now: dict[str, object] = {"tls": bool(link.tls), "auth": bool(link.auth)}
    if sites is not None:
        now["sites"] = list(sites)
    if resume and path.is_file():
        try:
            started = json.loads(path.read_text())
        except (OSError, ValueError):
            started = {}
        lost = [
            flag
            for key, flag in (("tls", "TLS (--certs)"), ("auth", "SuperNode authentication (--auth-keys)"))
            if started.get(key) and not now[key]
        ]
        if lost:
            raise FlowerRunError(
                f"{out}: this run started with {' and '.join(lost)}; resume it with the flags it was started with "
                "(without them any SuperNode could claim a site)"
            )
        before = started.get("sites")
        if isinstance(before, list) and sites is not None and before != list(sites):
            raise FlowerRunError(
                f"{out}: this run started with its sites in the order {', '.join(map(str, before))}, now "
                f"{', '.join(sites)}: a resume keeps their order (a site's index sets its random streams); give the "
                "federation.yaml (site_order) and --sites the run started with"
            )
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, json.dumps(now) + "\n")


def check_new_or_resumed(out: Path, resume: bool, data: str | None) -> None:
    """A coordinator's ``--out``: a new run needs a folder without checkpoints; ``--resume`` continues one; a study's,
    bench's or federation's folder, or one inside the federation folder ``data`` (``data.root``), is refused either
    way, before any Flower process starts or a site's folder is written."""
    check_out_dir(out)
    check_out_kind(out, "run")
    check_out_outside(out, data)
    if (out / "checkpoints").exists() and not resume:
        raise FileExistsError(f"{out}: already holds a run; use --resume to continue it or choose another --out")


@contextmanager
def coordinator_folder(out: Path, resume: bool, data: str | None) -> Iterator[Path]:
    """``out`` resolved, checked (``check_new_or_resumed``), created and held (``fedseg.folder_lock``) for the
    coordinator's whole run: a second coordinator, run or resume on it is refused in one line while this one lives
    (its ServerApp, a child process, writes the run's files under this hold)."""
    out = Path(out).resolve()
    check_new_or_resumed(out, resume, data)
    out.mkdir(parents=True, exist_ok=True)
    with holding(out):
        yield out


def serve_experiment(
    cfg: RunConfig,
    fed: Federation,
    out: Path,
    link: LinkSettings,
    procs: Processes,
    env: dict,
    *,
    register: dict[str, Path] | None = None,
    start_nodes: Callable[[], dict[str, Started]] | None = None,
    wait: float = 600,
    poll: float = DEFAULT_POLL,
    resume: bool = False,
    simulation: dict | None = None,
    echo: Callable[[str], None] = print,
) -> None:
    """Start the SuperLink, register keys, (start local nodes,) submit the run and wait for it to finish.
    ``simulation``: run on Flower's Simulation Runtime (``submit_run``; the SuperLink has ``--simulation``).

    Raises ``FlowerRunError`` with the coordinator's message if the run fails, or naming the
    SuperNode that died and its log if one of ours exits first (under ``fl.on_failure = skip`` a
    SuperNode that exits is reported and the run goes on without its site)."""
    from fedseg.flower.apps import build_fab

    out = Path(out).resolve()
    logs = out / "flower" / "logs"
    keep_protection(out, link, resume, fed.site_names)
    link_log = logs / "superlink.log"  # appended to by each start in this --out: only this one's lines are read
    link_log_start = link_log.stat().st_size if link_log.is_file() else 0
    if register and not link.simulation:  # SuperNodes already trying to connect wait (503) until their keys are in
        link = replace(link, gate=out / "flower" / FLEET_GATE)
    running = start_superlink(procs, link, logs, env)
    link_proc = running.started
    fleet = "no Fleet API (simulation)" if link.simulation else f"Fleet API (SuperNodes) on {link.host}:{link.port}"
    echo(
        f"SuperLink: {fleet} ({'TLS' if link.tls else 'insecure'}"
        f"{', SuperNode authentication' if link.auth else ''}); Control API on {link.control_address} only"
    )
    client = running.control_client()
    try:
        node_sites = {}  # node id -> site: with authentication, a node's site is that of its key
        for name, key in (register or {}).items():
            node_id = register_node(client, key, name)
            node_sites[str(node_id)] = name
            echo(f"registered SuperNode key {key.name} ({name}): node id {node_id}")
        if link.gate is not None:
            link.gate.touch()  # the Fleet API opens
        nodes = start_nodes() if start_nodes else {}
        for stale in ("server.log", "error.txt", SUBMITTED_RUN):  # left by an earlier attempt in the same --out
            (out / "flower" / stale).unlink(missing_ok=True)
        config = run_config(cfg, fed, wait, poll, resume, run_key(out, resume))
        if node_sites:
            config["fedseg-node-sites"] = json.dumps(node_sites)
        if simulation is not None:
            config["fedseg-simulation"] = json.dumps(simulation.pop("fedseg"))
        run_id = submit_run(client, build_fab(), config, simulation)
        # the coordinator's ServerApp runner serves this run only (fedseg.flower.serverapp_runner)
        atomic_write_text(out / "flower" / SUBMITTED_RUN, f"{run_id}\n", private=True)
        echo(f"run {run_id} submitted; sites: {', '.join(fed.site_names)}")
        echo(record_config(cfg, out))
        tail, last_observe = LogTail(out / "flower" / "server.log"), 0.0
        refusals = ActivationRefusals(link_proc.log, node_sites, link_log_start)
        showing = False  # whether the last log record was shown: its continuation lines are shown too

        def show_progress() -> None:
            nonlocal showing
            for line in tail.new_lines():
                if m := LOG_LINE.match(line):
                    showing = m.group(1) != "ERROR"  # errors (and their tracebacks) end in error.txt, printed once
                    if showing:
                        echo(m.group(2))
                elif showing and line.strip():  # a message of several lines (a site's reason under its own)
                    echo(f"  {line.strip()}")

        def tick() -> None:
            nonlocal last_observe
            show_progress()
            for line in refusals.new_lines():
                echo(line)
            if time.monotonic() - last_observe > 1.0:
                procs.observe()
                last_observe = time.monotonic()
            if link_proc.proc.poll() is not None:
                raise FlowerRunError(
                    f"the SuperLink exited (code {link_proc.proc.returncode}):\n{log_tail(link_proc.log)}"
                )
            for site, node in list(nodes.items()):
                if node.proc.poll() is not None:
                    said = f"the SuperNode of site {site!r} exited (code {node.proc.returncode})"
                    if cfg.fl.on_failure != "skip":
                        raise FlowerRunError(f"{said}:\n{log_tail(node.log)}")
                    echo(f"{said}; fl.on_failure = skip: the run goes on without it")
                    del nodes[site]

        status = wait_run(client, run_id, poll=0.25, tick=tick, say=echo)
        show_progress()
        if status.sub_status != "completed":
            error = out / "flower" / "error.txt"
            reason = error.read_text() if error.is_file() else status.details or status.sub_status
            raise FlowerRunError(f"the Flower run {status.sub_status}: {reason}")
    except control_errors() as e:
        raise FlowerRunError(control_problem(e, link.control_dial, link_proc.log)) from None
    finally:
        client.close()
        if link.gate is not None:
            link.gate.unlink(missing_ok=True)


def control_errors() -> tuple[type[Exception], ...]:
    """What the Control API's client raises where it cannot talk to the SuperLink (httpx's transport and status
    errors: a certificate that expired or does not fit, nothing listening)."""
    import httpx

    return (httpx.TransportError, httpx.HTTPStatusError)


def control_problem(error: Exception, address: str, log: Path) -> str:
    """One message for a Control API call that failed (a 370-line traceback before: an audit's expired certificate),
    with what most likely caused it and the end of the SuperLink's log."""
    reason = " ".join(str(error).split()) or type(error).__name__
    hint = ""
    if "expired" in reason or "not yet valid" in reason:
        when = "has expired" if "expired" in reason else "is not yet valid (this machine's clock?)"
        hint = f"; a certificate {when}: make new ones (`fedseg flower certs`) and give the sites the new ca.crt"
    elif "CERTIFICATE_VERIFY_FAILED" in reason:
        hint = (
            "; superlink.crt is not signed by ca.crt, or names another host: make them together (`fedseg flower certs`)"
        )
    elif "refused" in reason.lower():
        hint = "; nothing listens there: the SuperLink's log below says why"
    return f"the coordinator cannot reach its SuperLink's Control API on {address}: {reason}{hint}:\n{log_tail(log)}"


def federation_folder(cfg: RunConfig, work: Path) -> tuple[Path, Federation]:
    """The run's federation as a checked folder: ``data.root``, or the built-in (or registered) one written
    under ``work``."""
    from fedseg.data.check import check_folder

    if cfg.data.source == "folder" or cfg.data.root:
        if not cfg.data.root:
            raise ValueError("data.source is 'folder' but data.root is not set (use --data ROOT)")
        root = Path(cfg.data.root).resolve()
    else:
        from fedseg.data.folder_write import write_folder
        from fedseg.data.sources import build_federation

        root = write_folder(build_federation(cfg), work / "federation", overwrite=True).resolve()
    # the coordinator compares the sites' orientations and regions from their reports, in its own lines: not twice
    return root, check_folder(root, cfg.data.split, cfg.data.seed, across_sites=False)


def site_views(root: Path, fed: Federation, folder: Path) -> dict[str, Path]:
    """Per site, a folder federation holding only that site: ``federation.yaml`` + a link to ``root/<site>``."""
    views = {}
    for site in fed.site_names:
        view = folder / site
        if view.exists():
            shutil.rmtree(view)
        view.mkdir(parents=True)
        shutil.copy(root / "federation.yaml", view / "federation.yaml")
        (view / site).symlink_to(root / site, target_is_directory=True)
        views[site] = view
    return views


def sites_on_this_machine(cfg: RunConfig, out: Path) -> tuple[RunConfig, Federation, dict[str, Path]]:
    """For ``local`` and ``simulate`` (every site computes here) in the held ``out`` (``coordinator_folder``):
    write the federation to a checked folder and one folder per site holding only its data (``site_views``);
    returns the config reading that folder, the federation and the site folders."""
    root, fed = federation_folder(cfg, out / "flower")
    cfg = cfg.model_copy(update={"data": cfg.data.model_copy(update={"source": "folder", "root": str(root)})})
    return cfg, fed, site_views(root, fed, out / "flower" / "sites")


@contextmanager
def deployment(work: Path) -> Iterator[Processes]:
    """A deployment's processes in ``work`` (stopped on the way out, also on SIGTERM / SIGHUP), Flower's CLI state in
    ``work/home``, which every process it starts inherits as its FLWR_HOME (how ``Processes`` finds them all)."""
    with terminate_on_signals(), flower_home(work / "home"), Processes(work / "processes.json", work / "home") as procs:
        yield procs


def waits(poll: float) -> tuple[float | None, float]:
    """``(SuperNode poll or None = Flower's, SuperExec task poll)`` for ``--poll`` (0 = Flower's defaults)."""
    return (poll, poll) if poll > 0 else (None, FLOWER_TASK_POLL)


def local(
    cfg: RunConfig,
    out: Path,
    *,
    tls: bool = False,
    isolation: str = "warm",
    poll: float = DEFAULT_POLL,
    wait: float = 300,
    resume: bool = False,
    echo: Callable[[str], None] = print,
) -> Path:
    """Run ``cfg`` on a Flower deployment on this machine; the same outputs as ``fedseg run`` in ``out``.

    ``poll`` > 0 shortens every wait inside Flower to that many seconds (``fedseg.flower.flwr_internals``);
    0 keeps Flower's defaults. ``resume``: continue the run in ``out`` from its last checkpoint (the sites'
    snapshots are in ``out/flower/state``)."""
    from fedseg.flower.server import check_run

    check_run(cfg)
    if isolation not in ISOLATIONS:
        raise ValueError(f"isolation must be one of {ISOLATIONS}, got {isolation!r}")
    check_device(cfg.device)
    with coordinator_folder(out, resume, cfg.data.root) as out:
        cfg, fed, views = sites_on_this_machine(cfg, out)
        work = out / "flower"
        link_port, control_port, *node_ports = free_ports(2 + len(fed.site_names))
        certs = make_certs(work / "certs", nodes=fed.site_names) if tls else None
        link = LinkSettings("127.0.0.1", link_port, certs, auth=tls, control=f"127.0.0.1:{control_port}")
        node_poll, task_poll = waits(poll)
        env = flower_env(work / "home", task_poll, {COORDINATOR_OUT: str(out)})
        keys = work / "certs" / SITE_KEYS  # <site>.key stays with the site, supernodes/<site>.pub is registered

        def start_nodes() -> dict[str, Started]:
            return {
                site: procs.start(
                    f"supernode-{site}",
                    supernode_command(
                        site,
                        views[site],
                        link.address,
                        port,
                        out / "samples",
                        certs.ca if certs else None,
                        keys / f"{site}.key" if tls else None,
                        isolation,
                        node_poll,
                        work / "state" / site,
                        allow_faults=True,  # one researcher's test deployment (faults: robustness studies)
                    ),
                    work / "logs" / f"supernode-{site}.log",
                    env,
                )
                for site, port in zip(fed.site_names, node_ports)
            }

        with deployment(work) as procs:
            serve_experiment(
                cfg,
                fed,
                out,
                link,
                procs,
                env,
                register={s: work / "certs" / PUBLIC_KEYS / f"{s}.pub" for s in fed.site_names} if tls else None,
                start_nodes=start_nodes,
                wait=wait,
                poll=poll,
                resume=resume,
                echo=echo,
            )
    return out


def server(
    cfg: RunConfig,
    fed: Federation,
    out: Path,
    link: LinkSettings,
    *,
    auth_keys: dict[str, Path] | None = None,
    poll: float = DEFAULT_POLL,
    wait: float = 600,
    resume: bool = False,
    echo: Callable[[str], None] = print,
) -> Path:
    """The coordinator of a multi-machine deployment (SuperNodes started by the hospitals); ``poll``: the
    coordinator's waits inside Flower (SuperExec, ServerApp; 0 = Flower's defaults). ``resume``: continue
    the run in ``out``; every SuperNode must have been started with ``--state DIR`` and be restarted with
    the same folder."""
    from fedseg.flower.server import check_run

    check_run(cfg)
    with coordinator_folder(out, resume, cfg.data.root) as out:
        work = out / "flower"
        env = flower_env(work / "home", waits(poll)[1], {COORDINATOR_OUT: str(out)})
        link = replace(link, auth=link.auth or bool(auth_keys))
        echo(
            f"hospitals start: fedseg flower supernode --site NAME --data ROOT --superlink <this host>:{link.port}"
            + (" --root-certificates ca.crt" if link.tls else " --insecure")
            + (" --auth-key NAME.key" if link.auth else "")
            + " --state DIR (a folder the site keeps: needed to resume the run)"
        )
        with deployment(work) as procs:
            serve_experiment(
                cfg, fed, out, link, procs, env, register=auth_keys, wait=wait, poll=poll, resume=resume, echo=echo
            )
    return out


def simulate(
    cfg: RunConfig,
    out: Path,
    *,
    cpus_per_site: int = 1,
    gpus_per_site: float = 0.0,
    ray_address: str | None = None,
    poll: float = DEFAULT_POLL,
    wait: float = 300,
    resume: bool = False,
    echo: Callable[[str], None] = print,
) -> Path:
    """Run ``cfg`` on Flower's Simulation Runtime (Ray): a SuperLink with ``--simulation`` runs fedseg's app with
    one virtual SuperNode per site, each ClientApp a Ray actor with ``cpus_per_site`` CPUs and ``gpus_per_site``
    of a GPU; ``ray_address``: an existing Ray cluster to spread them over (``RAY_ADDRESS``; its machines need
    fedseg and this run's folders at the same paths). The same outputs as ``fedseg run`` in ``out``; sites keep
    their snapshots in ``out/flower/state/<site>`` (``resume``)."""
    import importlib.util

    from fedseg.flower.server import check_run

    check_run(cfg)
    if importlib.util.find_spec("ray") is None:
        raise ValueError(
            "Flower's Simulation Runtime needs Ray: pip install 'fedseg[simulation]' (flwr[simulation], ray 2.55.1)"
        )
    check_device(cfg.device)
    with coordinator_folder(out, resume, cfg.data.root) as out:
        cfg, fed, _ = sites_on_this_machine(cfg, out)
        work = out / "flower"
        (control_port,) = free_ports(1)
        link = LinkSettings("127.0.0.1", 0, simulation=True, control=f"127.0.0.1:{control_port}")
        env = flower_env(
            work / "home",
            waits(poll)[1],
            {COORDINATOR_OUT: str(out), **({"RAY_ADDRESS": ray_address} if ray_address else {})},
        )
        simulation = {
            "num_supernodes": len(fed.site_names),
            "client_resources_num_cpus": cpus_per_site,
            "client_resources_num_gpus": gpus_per_site,
            "fedseg": {"data": str(work / "sites"), "samples": str(out / "samples"), "state": str(work / "state")},
        }
        with deployment(work) as procs:
            serve_experiment(
                cfg,
                fed,
                out,
                link,
                procs,
                env,
                wait=wait,
                poll=poll,
                resume=resume,
                simulation=simulation,
                echo=echo,
            )
    return out
