"""``fedseg flower``: run fedseg's algorithms on a real Flower deployment.

fedseg flower local     --preset NAME --out DIR [--tls] [--resume]      everything on this machine
fedseg flower simulate  --preset NAME --out DIR [--gpus-per-site F]   Flower's Simulation Runtime (Ray)
fedseg flower server    --config FILE --out DIR --certs DIR [--resume]  the coordinator (SuperLink + ServerApp)
fedseg flower supernode --site NAME --data ROOT --superlink HOST:PORT --state DIR
                        [--root-certificates CA] [--auth-key KEY]
fedseg flower certs     --out DIR --node NAME ...             CA, SuperLink certificate, SuperNode keys
"""

from __future__ import annotations

import json
from pathlib import Path

import typer
from rich.console import Console

from fedseg.cli_errors import fail
from fedseg.cli_options import AlgorithmsHelp, device_option, threads_option
from fedseg.config_load import error_text
from fedseg.console_tables import print_dice
from fedseg.flower.deploy import DEFAULT_POLL
from fedseg.interrupts import interrupted_text

flower_app = typer.Typer(
    help="Run on a real Flower deployment (SuperLink + one SuperNode per site).", no_args_is_help=True
)
console = Console()


def _echo(line: str) -> None:
    console.print(line, highlight=False, markup=False, soft_wrap=True)


def _config(preset, config, data, algorithms, rounds, seed, set_, device=None, threads=None):
    from fedseg.config_load import config_from_cli

    return config_from_cli(preset, config, data, algorithms, rounds, seed, set_, device, threads)


def _errors():
    from fedseg.config_load import ConfigError
    from fedseg.data.federation import FederationError
    from fedseg.flower.launch import FlowerRunError

    return (
        ConfigError,
        FederationError,
        FileExistsError,
        FileNotFoundError,
        KeyError,
        ValueError,
        FlowerRunError,
        RuntimeError,
        TimeoutError,
    )


def _run_then_report(out: Path, run, stopped: str) -> None:
    """Call ``run()`` (which builds the config and runs on Flower); a known error or Ctrl-C becomes one
    message and exit code; on success print the test Dice and render the report."""
    try:
        run()
    except KeyboardInterrupt:
        fail(interrupted_text("the run", out, stopped), 130)
    except _errors() as e:
        said = error_text(e)
        fail(said + ("" if "--resume" in said else resumable(out)))
    _finish(out.resolve())


def resumable(out: Path) -> str:
    """What to add to a failed run's message where its finished rounds are kept (``OUT/checkpoints/*.pt``, no
    ``summary.json`` yet): how to continue once the cause is fixed; empty otherwise."""
    checkpoints = Path(out) / "checkpoints"
    if (Path(out) / "summary.json").exists() or not any(checkpoints.glob("*.pt")):
        return ""
    return (
        f"; the finished rounds are kept in {checkpoints}: once the cause is fixed (a site restarted, with the "
        "--state it had), the same command with --resume continues from them"
    )


def _finish(out: Path) -> None:
    from fedseg.report.html import render_report

    summary = json.loads((out / "summary.json").read_text())
    print_dice(
        console,
        f"Test Dice ({summary['dataset']}, on Flower)",
        summary["sites"],
        {name: entry["dice"] for name, entry in summary["algorithms"].items()},
        summary.get("ignore_label"),
    )
    path = render_report(out)
    console.print(f"report: {path}")
    from fedseg.tracking import log_report

    log_report(out, path=path)  # to each algorithm's tracking run (config.yaml's tracking; none: nothing)


OUT = typer.Option(
    ..., "--out", help="output directory of the run (summary.json, CSVs, model/, report.html, flower/ logs)"
)
PRESET = typer.Option(None, "--preset", help="built-in preset name (see `fedseg presets`)")
CONFIG = typer.Option(None, "--config", help="YAML config file")
DATA = typer.Option(None, "--data", help="folder federation replacing the preset's data")
ALGOS = typer.Option(None, "--algorithms", help="comma-separated algorithm names: {flower_algorithms}")
ROUNDS = typer.Option(None, "--rounds", help="federated rounds")
SEED = typer.Option(
    None, "--seed", help="the run's seed: initial weights, batch order, augmentation (the data: data.seed)"
)
SET = typer.Option([], "--set", help="override: key.sub=value (YAML value); repeatable")
ISOLATION_HELP = (
    "subprocess: one ClientApp process per message; warm: one long-lived ClientApp worker per SuperNode (no "
    "per-message process start). Either runs fedseg's own app only: a run bringing another app bundle is refused"
)
RESUME = typer.Option(
    False,
    "--resume",
    help="continue the run in --out from its last checkpoint (same config; every site's SuperNode keeps its "
    "--state folder); a finished run is reused",
)
POLL_HELP = (
    "seconds for the waits inside Flower (SuperNode idle polling and object-pull backoff, SuperExec task polling, "
    "ServerApp reply polling); 0 = Flower's own (3 s, 1 s, 1 s, 3 s)"
)


@flower_app.command(cls=AlgorithmsHelp)
def local(
    out: Path = OUT,
    preset: str | None = PRESET,
    config: Path | None = CONFIG,
    data: Path | None = DATA,
    algorithms: str | None = ALGOS,
    rounds: int | None = ROUNDS,
    seed: int | None = SEED,
    set_: list[str] = SET,
    device: str | None = device_option(),
    threads: int | None = threads_option(),
    tls: bool = typer.Option(
        False, "--tls", help="TLS + SuperNode authentication (fresh CA, certificate and keys in OUT/flower/certs)"
    ),
    isolation: str = typer.Option("warm", "--isolation", help=ISOLATION_HELP),
    poll: float = typer.Option(DEFAULT_POLL, "--poll", help=POLL_HELP),
    wait: float = typer.Option(300, "--wait", help="seconds to wait for every SuperNode to connect"),
    resume: bool = RESUME,
) -> None:
    """A SuperLink and one SuperNode per site on 127.0.0.1; the same outputs as `fedseg run`."""
    from fedseg.flower.launch import local as run_local

    def run() -> None:
        cfg = _config(preset, config, data, algorithms, rounds, seed, set_, device, threads)
        run_local(cfg, out, tls=tls, isolation=isolation, poll=poll, wait=wait, resume=resume, echo=_echo)

    _run_then_report(out, run, "every Flower process was stopped")


@flower_app.command(cls=AlgorithmsHelp)
def simulate(
    out: Path = OUT,
    preset: str | None = PRESET,
    config: Path | None = CONFIG,
    data: Path | None = DATA,
    algorithms: str | None = ALGOS,
    rounds: int | None = ROUNDS,
    seed: int | None = SEED,
    set_: list[str] = SET,
    device: str | None = device_option(),
    threads: int | None = threads_option(),
    cpus: int = typer.Option(1, "--cpus-per-site", help="CPUs Ray reserves for each site's ClientApp", min=1),
    gpus: float = typer.Option(
        0.0, "--gpus-per-site", help="fraction of a GPU Ray reserves for each site's ClientApp (0.5: two per GPU)"
    ),
    ray_address: str | None = typer.Option(
        None, "--ray-address", help="an existing Ray cluster (ray start --head ...) to spread the sites over"
    ),
    poll: float = typer.Option(DEFAULT_POLL, "--poll", help=POLL_HELP),
    wait: float = typer.Option(300, "--wait", help="seconds to wait for every virtual SuperNode"),
    resume: bool = RESUME,
) -> None:
    """Flower's Simulation Runtime (Ray): one virtual SuperNode per site; the same outputs as `fedseg run`."""
    from fedseg.flower.launch import simulate as run_simulate

    def run() -> None:
        cfg = _config(preset, config, data, algorithms, rounds, seed, set_, device, threads)
        run_simulate(
            cfg, out, cpus_per_site=cpus, gpus_per_site=gpus, ray_address=ray_address, poll=poll, wait=wait,
            resume=resume, echo=_echo,
        )  # fmt: skip

    _run_then_report(out, run, "every Flower process was stopped")


@flower_app.command(cls=AlgorithmsHelp)
def server(
    out: Path = OUT,
    preset: str | None = PRESET,
    config: Path | None = CONFIG,
    federation: Path | None = typer.Option(
        None,
        "--federation",
        help="folder federation (its federation.yaml and "
        "site folder names are read, no image) or a federation.yaml; default: data.root",
    ),
    sites: str | None = typer.Option(
        None, "--sites", help="comma-separated site names (default: the folder's site folders)"
    ),
    algorithms: str | None = ALGOS,
    rounds: int | None = ROUNDS,
    seed: int | None = SEED,
    set_: list[str] = SET,
    host: str = typer.Option("0.0.0.0", "--host", help="interface the SuperLink listens on"),
    port: int = typer.Option(9092, "--port", help="the SuperLink's port for SuperNodes (Fleet API only)"),
    control_address: str = typer.Option(
        "127.0.0.1:9093",
        "--control-address",
        help="HOST:PORT of the SuperLink's Control and Runtime APIs (register keys, start and list runs; the "
        "ServerApp's messages): only this coordinator uses them (the Control API asks a key drawn at each start), "
        "keep it on loopback",
    ),
    certs: Path | None = typer.Option(
        None, "--certs", help="folder with ca.crt, superlink.crt, superlink.key (`fedseg flower certs`)"
    ),
    insecure: bool = typer.Option(False, "--insecure", help="no TLS (testing only)"),
    auth_keys: Path | None = typer.Option(
        None,
        "--auth-keys",
        help="folder of SuperNode public keys <site>.pub to register; turns on SuperNode authentication",
    ),
    wait: float = typer.Option(600, "--wait", help="seconds to wait for every site's SuperNode"),
    poll: float = typer.Option(
        DEFAULT_POLL,
        "--poll",
        help="the coordinator's waits inside Flower (SuperExec task polling, "
        "ServerApp reply polling and object-pull backoff), seconds; 0 = Flower's own",
    ),
    resume: bool = RESUME,
) -> None:
    """The coordinator: a SuperLink on HOST:PORT, fedseg's ServerApp, the run's outputs in OUT."""
    from fedseg.flower.certs import TlsFiles, private_keys_in
    from fedseg.flower.launch import server as run_server
    from fedseg.flower.superlink import LinkSettings

    def run() -> None:
        cfg = _config(preset, config, None, algorithms, rounds, seed, set_)
        if cfg.data.source == "folder" and not cfg.data.root:  # said before any site connects (it was after)
            raise ValueError(
                "data.source is 'folder' but data.root is not set: set data.root (the folder federation's path) or "
                "leave data.source out of the run config (--federation gives the coordinator the sites' names)"
            )
        fed = coordinator_federation(federation or (Path(cfg.data.root) if cfg.data.root else None), sites)
        if certs is None and not insecure:
            raise ValueError("give --certs DIR (TLS; create it with `fedseg flower certs`) or --insecure")
        keys = {p.stem: p for p in sorted(auth_keys.glob("*.pub"))} if auth_keys else None
        if auth_keys is not None and not keys:
            raise FileNotFoundError(f"{auth_keys}: no *.pub SuperNode keys")
        if auth_keys is not None and keys:
            keys = site_keys(keys, fed.site_names, auth_keys)
        if auth_keys is not None and (private := private_keys_in(auth_keys)):
            _echo(
                f"warning: {auth_keys} holds private SuperNode keys ({', '.join(private)}): whoever reads this "
                "machine's disk can connect as those sites; give each to its hospital and delete it here (the "
                "coordinator needs only the *.pub)"
            )
        if (open_to := unprotected(host, certs is not None, keys is not None)) is not None:
            _echo(f"warning: {open_to}")
        if not is_loopback(control_address.rpartition(":")[0].strip("[]")):
            _echo(
                f"warning: the Control and Runtime APIs listen on {control_address}, which other machines can "
                "reach: only this coordinator uses them (keep it on 127.0.0.1)"
            )
        link = LinkSettings(
            host, port, TlsFiles.in_folder(certs) if certs else None, auth=bool(keys), control=control_address
        )
        run_server(cfg, fed, out, link, auth_keys=keys, wait=wait, poll=poll, resume=resume, echo=_echo)

    _run_then_report(out, run, "the SuperLink was stopped")


def is_loopback(host: str) -> bool:
    """Whether only this machine can reach ``host`` (``localhost``, 127.0.0.0/8, ``::1``)."""
    import ipaddress

    try:
        return host == "localhost" or ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def unprotected(host: str, tls: bool, auth: bool) -> str | None:
    """What a coordinator listening on ``host`` for SuperNodes lets through without TLS or SuperNode authentication,
    where ``host`` is not loopback-only (anyone on the network may connect); None when both are on or only this
    machine can reach it."""
    loopback = is_loopback(host)
    protections = (("TLS (--certs)", tls), ("SuperNode authentication (--auth-keys)", auth))
    missing = [what for what, on in protections if not on]
    if loopback or not missing:
        return None
    return (
        f"the SuperLink listens on {host} (other machines can reach it) without {' and without '.join(missing)}: "
        + "; ".join(
            (["its traffic, the models included, can be read on the way"] if not tls else [])
            + (["any SuperNode can claim to be any site"] if not auth else [])
        )
        + " (for a test network only)"
    )


def site_keys(keys: dict[str, Path], sites: list[str], folder: Path) -> dict[str, Path]:
    """The keys to register: one per site of the federation (a site without one could never connect: refused before
    the run starts); a key of no site is said and left unregistered (an audit: ``--sites`` without site1 still
    registered site1.pub)."""
    missing = [s for s in sites if s not in keys]
    if missing:
        raise ValueError(
            f"--auth-keys {folder}: no key for site {', '.join(map(repr, missing))} (expected "
            f"{folder / (missing[0] + '.pub')}); every site of the run connects with its own key"
        )
    if others := [k for k in keys if k not in sites]:
        _echo(
            f"warning: --auth-keys {folder}: {', '.join(o + '.pub' for o in others)} name no site of this run: "
            "not registered"
        )
    return {s: keys[s] for s in sites}


def coordinator_federation(path: Path | None, sites: str | None):
    """The case-less federation the coordinator needs: header + site names (in the folder federation's order:
    ``site_order``, else sorted)."""
    from fedseg.data.federation import Federation, Site
    from fedseg.data.folder import ordered_site_names, read_header, scan_sites
    from fedseg.data.folder_write import safe_name

    if path is None:
        raise ValueError("give --federation (a folder federation or its federation.yaml) or set data.root")
    path = Path(path)
    names = [safe_name(s.strip(), "--sites: site") for s in sites.split(",") if s.strip()] if sites else []
    if twice := sorted({n for n in names if names.count(n) > 1}):
        raise ValueError(f"--sites: site {', '.join(map(repr, twice))} given twice; each site once")
    if path.is_file():
        if path.name != "federation.yaml":
            raise ValueError(f"{path}: give a folder federation or its federation.yaml")
        if not names:
            raise ValueError(f"{path}: with a federation.yaml alone, name the sites: --sites a,b,c")
        root = path.parent
    else:
        root = path
        names = names or [s.name for s in scan_sites(root)[0]]
        if not names:
            raise ValueError(f"{root}: no site folders; give --sites a,b,c")
    header = read_header(root)
    if header.site_order is not None and (left := [n for n in names if n not in header.site_order]):
        raise ValueError(  # data check refuses such a folder; the coordinator put the sites last without a word
            f"{root / 'federation.yaml'}: site_order leaves out {', '.join(map(repr, left))}, a site of this run; "
            "list every site once (or drop site_order)"
        )
    return Federation(
        header.name,
        header.kind,
        header.channels,
        header.regions,
        [Site(n, []) for n in ordered_site_names(names, header)],
        header.label_names,
        channel_names=header.channel_names,
    )


@flower_app.command()
def supernode(
    site: str = typer.Option(..., "--site", help="this hospital's site name (its folder in ROOT)"),
    data: Path = typer.Option(
        ..., "--data", help="folder federation with this site's data: ROOT/federation.yaml, ROOT/<site>/"
    ),
    superlink: str = typer.Option(..., "--superlink", help="the coordinator's SuperLink, HOST:PORT"),
    root_certificates: Path | None = typer.Option(
        None, "--root-certificates", help="CA certificate that signed the SuperLink's (TLS)"
    ),
    insecure: bool = typer.Option(False, "--insecure", help="no TLS (testing only)"),
    auth_key: Path | None = typer.Option(
        None, "--auth-key", help="this SuperNode's private key (SuperNode authentication)"
    ),
    port: int = typer.Option(9094, "--port", help="local port of the SuperNode's Runtime API (127.0.0.1)"),
    samples: Path | None = typer.Option(
        None, "--samples", help="where this site writes its example predictions (default ./fedseg-samples)"
    ),
    isolation: str = typer.Option("subprocess", "--isolation", help=ISOLATION_HELP),
    poll: float | None = typer.Option(
        None,
        "--poll",
        help="shorten the SuperNode's waits inside Flower (idle polling 3 s, "
        "object-pull backoff 1 s) to this many seconds; default: Flower's",
    ),
    max_wait: float | None = typer.Option(
        None, "--max-wait", help="give up connecting to the SuperLink after this many seconds"
    ),
    state: Path | None = typer.Option(
        None,
        "--state",
        help="folder where this site keeps the snapshots of its state store (only its own); keep it across "
        "restarts: a run is resumed from it (`fedseg flower server --resume`). Default: in memory, no resume",
    ),
    config_sha256: str | None = typer.Option(
        None,
        "--config-sha256",
        help="the SHA-256 of the study's agreed configuration (`fedseg flower config-digest`): a run of any other "
        "configuration is refused at its data check, before this site's data trains",
    ),
    allow_injected_faults: bool = typer.Option(
        False,
        "--allow-injected-faults",
        help="a test deployment: accept a run whose configuration injects faults (config `faults`: altered "
        "updates, crashes); refused otherwise, since sites sending no change would expose another site's update",
    ),
) -> None:
    """A hospital: check the data, then serve it to the federation as a Flower SuperNode (data never leaves)."""
    from fedseg.flower.supernode import run_supernode

    try:
        run_supernode(
            site,
            data,
            superlink,
            port=port,
            samples=samples or Path("fedseg-samples"),
            root_certificates=root_certificates,
            insecure=insecure,
            auth_key=auth_key,
            isolation=isolation,
            poll=poll,
            max_wait=max_wait,
            state=state,
            config_sha256=config_sha256,
            allow_faults=allow_injected_faults,
            echo=_echo,
        )
    except KeyboardInterrupt:
        raise typer.Exit(130) from None
    except _errors() as e:
        fail(error_text(e))


@flower_app.command(name="config-digest", cls=AlgorithmsHelp)
def config_digest(
    preset: str | None = PRESET,
    config: Path | None = CONFIG,
    algorithms: str | None = ALGOS,
    rounds: int | None = ROUNDS,
    seed: int | None = SEED,
    set_: list[str] = SET,
    write: Path | None = typer.Option(
        None, "--write", help="also write the configuration as the sites record it (JSON), to send to the hospitals"
    ),
) -> None:
    """The SHA-256 of the configuration `fedseg flower server` sends for the same options, before any run: each
    hospital pins it (`fedseg flower supernode --config-sha256`) and its SuperNode refuses any other."""
    from fedseg.atomic_files import atomic_write_text
    from fedseg.config_load import config_record
    from fedseg.flower.server import check_run

    try:
        cfg = _config(preset, config, None, algorithms, rounds, seed, set_)
        check_run(cfg)  # a configuration the coordinator would refuse gets no digest to agree on
        text, digest = config_record(cfg)
        if write is not None:
            atomic_write_text(write, text)
    except _errors() as e:
        fail(error_text(e))
    typer.echo(f"configuration sha256 {digest}" + (f" ({write})" if write is not None else ""))


@flower_app.command()
def certs(
    out: Path = typer.Option(
        ..., "--out", help="folder for ca.crt/.key, superlink.crt/.key, site-keys/<name>.key, supernodes/<name>.pub"
    ),
    host: list[str] = typer.Option(
        [],
        "--host",
        help="extra name or IP of the SuperLink machine (repeatable); 127.0.0.1 and localhost are always in",
    ),
    node: list[str] = typer.Option(
        [], "--node", help="a SuperNode (site) to create an authentication key pair for (repeatable)"
    ),
    force: bool = typer.Option(False, "--force", help="overwrite existing files"),
) -> None:
    """Create a CA, the SuperLink's TLS certificate and SuperNode authentication keys (cryptography)."""
    from fedseg.flower.certs import PUBLIC_KEYS, SITE_KEYS, host_problem, make_certs

    if out.exists() and not out.is_dir():
        fail(f"{out}: not a folder (--out names the folder to write the certificates and keys into)")
    for name in host:  # a certificate for a name no machine can have would be refused by every SuperNode
        if (problem := host_problem(name)) is not None:
            fail(f"--host {name!r}: {problem}")
    for name in node:  # its key is written to site-keys/<name>.key: a plain file name, as a site's folder is
        if not name or name.startswith(".") or any(c in name for c in "/\\\0"):
            fail(f"--node {name!r}: not a site name (a file name: no '/' or '\\', not starting with '.')")
        if node.count(name) > 1:
            fail(f"--node {name!r}: given {node.count(name)} times; one key pair per site")
    if (out / "ca.key").exists() and not force:
        fail(f"{out}: already holds a CA (use --force to replace it)")
    try:
        files = make_certs(out, hosts=host, nodes=node)
    except OSError as e:  # a forbidden folder, a full disk: nothing was written
        fail(f"{error_text(e)}; nothing was written to {out}")
    _echo(f"CA: {files.ca}\nSuperLink certificate: {files.cert} (+ {files.key.name})")
    for name in node:
        _echo(
            f"SuperNode {name}: {out / SITE_KEYS / (name + '.key')} (to that site only, then delete it here), "
            f"{out / PUBLIC_KEYS / (name + '.pub')} (the coordinator's --auth-keys {out / PUBLIC_KEYS})"
        )
