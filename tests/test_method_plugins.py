"""Methods installed as packages (entry-point group ``fedseg.methods``, ``fedseg.method_plugins``).

Each test writes real installed distributions into a folder (a package ``fedseg_toymethod/`` and its
``fedseg_toymethod-<version>.dist-info/`` with ``METADATA`` and ``entry_points.txt``, what pip leaves in
site-packages) and runs fresh Python processes with that folder on ``PYTHONPATH``: entry points are read when
``fedseg.algorithms`` is imported, as in every process of a deployment. Nothing of fedseg is mocked.

- ``fedseg algorithms`` lists an installed method with its distribution and version;
- ``fedseg run`` trains it (its options under ``methods.<name>``), and the run records the package's name and version
  (provenance, model card, the method record a resume reads); a resume under another version says so in one line;
- a broken plugin (its import fails; a spec taking a built-in name) is left out with one warning line, said once in a
  process and not again in the processes it starts; other methods run; its method's name says why it is missing;
- on Flower (real SuperLink, SuperNodes, ServerApp and ClientApp processes) an installed method trains, and a
  SuperNode holding another version of its package refuses the run in one line naming both versions, or holding the
  right version that fails to import there, in one line naming the package, the method and the import error."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from fedseg.data.folder_write import write_folder
from fedseg.flower.deploy import Processes, flower_env, free_ports
from fedseg.flower.supernode import supernode_command
from fedseg.method_plugins import WARNED

TOY = '''"""A method package as a research group would ship it: FedAvg with its own server, client and name."""

from fedseg import AlgorithmSpec, FedAvgClient, FedAvgOptions, FedAvgServer


class ToyServer(FedAvgServer):
    pass


class ToyClient(FedAvgClient):
    pass


SPECS = (
    AlgorithmSpec("toymethod", "Toy FedAvg", ToyServer, ToyClient, "FedAvg under its own name", FedAvgOptions),
)
'''
BUILTIN_NAME = """from fedseg import AlgorithmSpec, FedAvgClient, FedAvgServer

SPECS = (AlgorithmSpec("fedavg", "My FedAvg", FedAvgServer, FedAvgClient, "takes a built-in name"),)
"""
ROOT = Path(__file__).resolve().parents[1]
TINY_SETS = [
    *("--set", "model.channels=[4,8,16]", "--set", "data.image_size=32", "--set", "train.batch_size=4"),
    *("--set", "threads=1", "--set", "eval.hd95=false", "--set", "eval.local_models=false"),
]


def install(root: Path, dist: str, version: str, module: str, text: str, entry: str) -> Path:
    """An installed distribution ``dist`` ``version`` in ``root``: package ``module`` (its ``__init__.py`` is
    ``text``) and the dist-info declaring entry point ``entry = module`` in group ``fedseg.methods``."""
    (root / module).mkdir(parents=True)
    (root / module / "__init__.py").write_text(text)
    info = root / f"{module}-{version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: {version}\n")
    (info / "entry_points.txt").write_text(f"[fedseg.methods]\n{entry} = {module}\n")
    return root


def toy(root: Path, version: str = "0.1.0") -> Path:
    return install(root, "fedseg-toymethod", version, "fedseg_toymethod", TOY, "toymethod")


def broken(root: Path) -> Path:
    """Two plugins that cannot load: one whose module fails to import, one whose spec takes a built-in name."""
    install(root, "fedseg-broken", "1.0", "fedseg_broken", "import no_such_dependency_xyz\n", "brokenmethod")
    return install(root, "fedseg-dup", "0.3", "fedseg_dup", BUILTIN_NAME, "dup")


def environment(*paths: Path, base: dict[str, str] | None = None) -> dict[str, str]:
    env = dict(base or os.environ)
    env.pop(WARNED, None)
    env["PYTHONPATH"] = os.pathsep.join([*map(str, paths), *filter(None, [env.get("PYTHONPATH")])])
    return env


def fedseg(*args: str, paths: tuple[Path, ...], timeout: float = 300) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "fedseg", *args]
    return subprocess.run(cmd, env=environment(*paths), capture_output=True, text=True, timeout=timeout)


def warnings(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("warning: method plugin")]


def toy_not_importing(root: Path) -> Path:
    """fedseg-toymethod 0.1.0, the version the coordinator has, whose module needs a package this machine lacks."""
    return install(
        root, "fedseg-toymethod", "0.1.0", "fedseg_toymethod", "import no_such_dependency_xyz\n" + TOY, "toymethod"
    )


@pytest.fixture(scope="module")
def plugins(tmp_path_factory) -> dict[str, Path]:
    base = tmp_path_factory.mktemp("plugins")
    return {
        "toy": toy(base / "toy"),
        "toy2": toy(base / "toy2", "0.2.0"),
        "broken": broken(base / "broken"),
        "toy-not-importing": toy_not_importing(base / "toy-not-importing"),
    }


@pytest.fixture(scope="module")
def folder(tmp_path_factory, disc_federation) -> Path:
    return write_folder(disc_federation(n_sites=2, cases_per_site=8), tmp_path_factory.mktemp("fed") / "fed")


LONG_AND_DOCS = """
import importlib.util, sys
from typer.testing import CliRunner
from fedseg.cli import app

print(CliRunner().invoke(app, ["algorithms", "--long"]).output)
spec = importlib.util.spec_from_file_location("gen_methods", sys.argv[1])
gen = importlib.util.module_from_spec(spec)
spec.loader.exec_module(gen)
text = gen.render() + gen.readme_table()
print("generated docs:", "toymethod" if "toymethod" in text else "no toymethod")
"""


def test_fedseg_algorithms_lists_an_installed_method_with_its_distribution_and_version(plugins):
    done = fedseg("algorithms", paths=(plugins["toy"],))  # 80 columns: the package is said whole
    assert done.returncode == 0 and not done.stderr, done.stderr
    (line,) = [line for line in done.stdout.splitlines() if line.startswith("toymethod ")]
    assert line.split()[1] == "global" and "[plugin fedseg-toymethod 0.1.0]: FedAvg" in line, line
    assert any(line.startswith("fedavg ") for line in done.stdout.splitlines())
    wide = subprocess.run(
        [sys.executable, "-c", LONG_AND_DOCS, str(ROOT / "docs" / "gen_methods.py")],
        env={**environment(plugins["toy"]), "COLUMNS": "250"},  # the table's rows on one line each
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert wide.returncode == 0, wide.stderr
    (row,) = [line for line in wide.stdout.splitlines() if line.startswith("│ toymethod ")]
    cells = [cell.strip() for cell in row.split("│") if cell.strip()]
    assert cells[:2] == ["toymethod", "Toy FedAvg"] and "plugin fedseg-toymethod 0.1.0" in cells, cells
    assert cells[cells.index("plugin fedseg-toymethod 0.1.0") - 1] == "yes"  # runs on Flower: installed code
    (fedavg,) = [line for line in wide.stdout.splitlines() if line.startswith("│ fedavg ")]
    assert "built in" in fedavg
    assert "generated docs: no toymethod" in wide.stdout  # docs/gen_methods.py documents the built-in methods only


def test_fedseg_run_trains_an_installed_method_and_records_its_package_version(plugins, folder, tmp_path):
    """Beside two broken plugins: the run trains, each broken one said in one warning line."""
    out = tmp_path / "run"
    args = ["run", "--preset", "demo", "--data", str(folder), "--algorithms", "toymethod", "--rounds", "1"]
    done = fedseg(
        *args,
        *("--out", str(out), *TINY_SETS, "--set", "methods.toymethod.weighting=uniform"),
        paths=(plugins["toy"], plugins["broken"]),
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert len(warnings(done.stderr)) == 2 and "Traceback" not in done.stderr, done.stderr
    summary = json.loads((out / "summary.json").read_text())
    assert summary["algorithms"]["toymethod"]["display_name"] == "Toy FedAvg"
    assert summary["algorithms"]["toymethod"]["dice"]["client_avg"] > 0
    record = {"distribution": "fedseg-toymethod", "version": "0.1.0"}
    assert summary["provenance"]["plugins"] == {"toymethod": record}
    card = json.loads((out / "model" / "toymethod" / "manifest.json").read_text())["trained"]
    assert card["plugin"] == record and card["method"] == "Toy FedAvg"
    assert "toymethod: plugin fedseg-toymethod 0.1.0" in (out / "report.html").read_text()
    methods = json.loads((out / ".methods.json").read_text())["toymethod"]
    assert methods["plugin"] == record and methods["options"]["weighting"] == "uniform"


RESUMED = """
import sys
from pathlib import Path
from fedseg.config import RunConfig
from fedseg.run import run_experiment

class Stop(Exception):
    pass

def stop(name, rnd, losses):
    if rnd == 1:
        raise Stop

cfg = RunConfig.model_validate({
    "seed": 0, "threads": 1, "algorithms": ["toymethod"], "fl": {"rounds": 2},
    "data": {"source": "folder", "root": sys.argv[1], "image_size": 32},
    "model": {"channels": [4, 8, 16]}, "train": {"batch_size": 4},
    "eval": {"hd95": False, "local_models": False},
})
try:
    run_experiment(cfg, Path(sys.argv[2]), on_round_end=stop)
except Stop:
    print("stopped after round 1")
"""


def test_a_resume_under_another_version_of_the_package_says_so_in_one_line(plugins, folder, tmp_path):
    """Stopped after round 1 of 2 with fedseg-toymethod 0.1.0: resumed without the package, the error names the
    package and version to install; resumed with 0.2.0 installed, one warning line (shown and in run.log); the method
    record keeps the version it started with, the provenance the one that finished."""
    out = tmp_path / "run"
    first = subprocess.run(
        [sys.executable, "-c", RESUMED, str(folder), str(out)],
        env=environment(plugins["toy"]),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert "stopped after round 1" in first.stdout, first.stderr[-3000:]
    resume = ("run", "--config", str(out / "config.yaml"), "--out", str(out), "--resume")
    missing = fedseg(*resume, paths=())  # the package uninstalled: the error says which to install
    assert missing.returncode == 1 and missing.stderr.splitlines()[-1].endswith(
        "; the run trained it from the method package fedseg-toymethod 0.1.0, which this environment does not have: "
        "install it (pip install 'fedseg-toymethod==0.1.0') before resuming its run"
    ), missing.stderr
    done = fedseg(*resume, paths=(plugins["toy2"],))
    assert done.returncode == 0, done.stderr[-3000:]
    (logged,) = [line for line in (out / "run.log").read_text().splitlines() if "method package" in line]
    assert logged.startswith(
        "warning: toymethod: the run started with its method package fedseg-toymethod 0.1.0, this process has "
        "fedseg-toymethod 0.2.0: the rounds trained now run that version"
    ), logged
    shown = " ".join((done.stdout + done.stderr).split())
    assert shown.count(" ".join(logged.split())) == 1, shown[-3000:]
    assert json.loads((out / ".methods.json").read_text())["toymethod"]["plugin"]["version"] == "0.1.0"
    summary = json.loads((out / "summary.json").read_text())
    assert summary["provenance"]["plugins"]["toymethod"]["version"] == "0.2.0"
    assert summary["algorithms"]["toymethod"]["rounds"] == 2


TWICE = """
import subprocess, sys
from typer.testing import CliRunner
import fedseg.algorithms  # the plugins load here (the warnings to this stderr, not to a CliRunner's capture)
from fedseg.cli import app

for _ in range(2):
    listed = CliRunner().invoke(app, ["algorithms"], terminal_width=200)
    assert listed.exit_code == 0, listed.output
print(listed.stdout)
child = subprocess.run([sys.executable, "-c", "import fedseg.algorithms"], capture_output=True, text=True)
print("child stderr:", repr(child.stderr))
"""


def test_a_broken_plugin_is_one_warning_line_and_its_methods_name_says_why(plugins, folder, tmp_path):
    """A plugin whose module fails to import and one whose spec takes a built-in name: each is left out with one
    warning line naming the distribution, the entry point and the problem, in a process that lists the methods twice
    (said once), and not again in a process it starts; the other methods are there (``fedavg`` is fedseg's own).
    Asking for the first's method is the unknown-algorithm error with the plugin's failure."""
    done = subprocess.run(
        [sys.executable, "-c", TWICE],
        env=environment(plugins["toy"], plugins["broken"]),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert warnings(done.stderr) == [
        "warning: method plugin fedseg-broken 1.0 (entry point brokenmethod = fedseg_broken) is not loaded: "
        "importing fedseg_broken failed: ModuleNotFoundError: No module named 'no_such_dependency_xyz'; fedseg goes "
        "on without it",
        "warning: method plugin fedseg-dup 0.3 (entry point dup = fedseg_dup) is not loaded: SPECS[0]: algorithm "
        "'fedavg' is built in (FedAvg); choose another name; fedseg goes on without it",
    ], done.stderr
    assert done.stderr.strip().splitlines() == warnings(done.stderr)  # nothing else: no traceback
    assert "child stderr: ''" in done.stdout  # said once for the process tree
    names = [line.split()[0] for line in done.stdout.splitlines() if line.strip()]
    assert "toymethod" in names and "fedavg" in names and "brokenmethod" not in names
    assert "My FedAvg" not in done.stdout

    unknown = fedseg(
        *("run", "--preset", "demo", "--data", str(folder), "--algorithms", "brokenmethod"),
        *("--out", str(tmp_path / "x")),
        paths=(plugins["broken"],),
    )
    assert unknown.returncode == 1 and "Traceback" not in unknown.stderr
    assert unknown.stderr.splitlines()[-1] == (
        "error: unknown algorithm 'brokenmethod'; plugin fedseg-broken 1.0 (entry point brokenmethod) failed to "
        "load: importing fedseg_broken failed: ModuleNotFoundError: No module named 'no_such_dependency_xyz'"
    ), unknown.stderr
    assert len(warnings(unknown.stderr)) == 2 and not (tmp_path / "x").exists()


def _config(path: Path, tiny: dict) -> Path:
    run = {**tiny, "algorithms": ["toymethod"], "fl": {"rounds": 1}}
    run["eval"] = {**tiny["eval"], "hd95": False, "local_models": False}
    path.write_text(yaml.safe_dump(run))
    return path


@pytest.mark.slow
def test_an_installed_method_trains_on_flower(plugins, folder, tmp_path, tiny):
    """`fedseg flower local` (SuperLink, two SuperNodes, ServerApp and ClientApps: every process with the package
    installed) trains the installed method (a method registered in Python is refused there)."""
    cfg = _config(tmp_path / "cfg.yaml", tiny)
    out = tmp_path / "flower"
    done = fedseg(
        *("flower", "local", "--config", str(cfg), "--data", str(folder), "--out", str(out)), paths=(plugins["toy"],)
    )
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["algorithms"]["toymethod"]["dice"]["client_avg"] > 0
    assert summary["provenance"]["plugins"]["toymethod"]["version"] == "0.1.0"


def _run_with_site2_holding(site2_install: Path, plugins, folder, tmp_path, tiny) -> tuple[str, str, str]:
    """A coordinator (`fedseg flower server`) and site1's SuperNode with fedseg-toymethod 0.1.0 installed, site2's
    with ``site2_install``; the run must fail. The logs of the coordinator, site1 and site2."""
    cfg = _config(tmp_path / "cfg.yaml", tiny)
    fleet_port, control_port, port1, port2 = free_ports(4)
    fleet = f"127.0.0.1:{fleet_port}"
    hospitals, out = tmp_path / "hospitals", tmp_path / "out"
    base = flower_env(hospitals / "home")
    with Processes(hospitals / "processes.json") as procs:
        coordinator = procs.start(
            "coordinator",
            [sys.executable, "-m", "fedseg.cli", "flower", "server", "--config", str(cfg), "--insecure"]
            + ["--federation", str(folder), "--out", str(out), "--host", "127.0.0.1", "--port", str(fleet_port)]
            + ["--control-address", f"127.0.0.1:{control_port}", "--wait", "120"],
            hospitals / "coordinator.log",
            environment(plugins["toy"], base=base),
        )
        for site, port, installed in (("site1", port1, plugins["toy"]), ("site2", port2, site2_install)):
            procs.start(
                site,
                supernode_command(site, folder, fleet, port, hospitals / site, None, None, "warm", 0.05),
                hospitals / f"{site}.log",
                environment(installed, base=base),
            )
        assert coordinator.proc.wait(timeout=300) == 1, coordinator.log.read_text()[-3000:]
    return coordinator.log.read_text(), (hospitals / "site1.log").read_text(), (hospitals / "site2.log").read_text()


@pytest.mark.slow
def test_a_supernode_with_another_version_of_the_package_refuses_in_one_line(plugins, folder, tmp_path, tiny):
    """site2's SuperNode has fedseg-toymethod 0.2.0 installed, the coordinator and site1 0.1.0. site2 refuses the run
    in one line of its log naming the method, the package and both versions; the coordinator's run fails with that
    line."""
    coordinator, site1, site2 = _run_with_site2_holding(plugins["toy2"], plugins, folder, tmp_path, tiny)
    said = (
        "the run's method packages: method 'toymethod' comes from fedseg-toymethod 0.1.0 but this SuperNode has "
        "fedseg-toymethod 0.2.0 installed (install the same version)"
    )
    refusals = [line for line in site2.splitlines() if said in line]
    assert refusals and all(line.endswith(said) for line in refusals), site2[-3000:]
    assert "Traceback" not in site2
    assert said in " ".join(coordinator.split()) and said not in site1


NOT_IMPORTING = (
    "the run's method packages: method 'toymethod' comes from fedseg-toymethod 0.1.0, which this SuperNode has "
    "installed but cannot load: entry point toymethod = fedseg_toymethod: importing fedseg_toymethod failed: "
    "ModuleNotFoundError: No module named 'no_such_dependency_xyz' (install what it imports on this SuperNode's "
    "machine, then restart this SuperNode)"
)


@pytest.mark.slow
def test_a_supernode_whose_package_does_not_import_refuses_at_its_data_check(plugins, folder, tmp_path, tiny):
    """As above, site2 holding fedseg-toymethod 0.1.0, the coordinator's version, whose module fails to import there
    (a dependency missing on that machine): the version check passed it, and the run failed in round 1 with an
    unknown method. site2 refuses the run at its start-up data check (the ``info`` query), in one line of its log
    naming the package, the method and the import error; the coordinator's run fails with that line."""
    coordinator, site1, site2 = _run_with_site2_holding(plugins["toy-not-importing"], plugins, folder, tmp_path, tiny)
    refusals = [line for line in site2.splitlines() if NOT_IMPORTING in line]
    assert refusals and all(line.endswith(NOT_IMPORTING) for line in refusals), site2[-3000:]
    assert all("query.info" in line for line in refusals), site2[-3000:]  # at the data check, before any round
    assert "Traceback" not in site2 and "train." not in site2, site2[-3000:]
    assert NOT_IMPORTING in " ".join(coordinator.split()) and NOT_IMPORTING not in site1


LOAD_CHECK = """
import json, sys
from fedseg.method_plugins import load_problem, run_config_value, version_problem

value = run_config_value(json.loads(sys.argv[1]))


def loaded():
    from fedseg.algorithms import loaded_plugins

    return loaded_plugins()


said = [version_problem(value, "this SuperNode"), load_problem(value, "this SuperNode", loaded)]
print(json.dumps([*said, "fedseg.algorithms" in sys.modules]))
"""


def test_the_load_check_names_a_package_whose_module_fails_to_import(plugins):
    """What a SuperNode checks at its data check (``fedseg.method_plugins.load_problem``), in fresh processes with
    real installed distributions: fedseg-toymethod 0.1.0, the run's version, whose module fails to import, is named
    with the method and the import error (the version check passes it); importing, it is no problem; a package in
    another version is the version check's to name, not this one's; a run without plugin methods imports nothing."""
    record = {"toymethod": {"distribution": "fedseg-toymethod", "version": "0.1.0"}}

    def checked(path: Path, records: dict) -> list:
        cmd = [sys.executable, "-c", LOAD_CHECK, json.dumps(records)]
        done = subprocess.run(cmd, env=environment(path), capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr[-3000:]
        *said, imported = json.loads(done.stdout.splitlines()[-1])
        assert imported == bool(records)  # the methods imported only for a run that has plugin methods
        return said

    assert checked(plugins["toy-not-importing"], record) == [
        None,
        NOT_IMPORTING.removeprefix("the run's method packages: "),
    ]
    assert checked(plugins["toy"], record) == [None, None]
    version, loading = checked(plugins["toy2"], record)
    assert "but this SuperNode has fedseg-toymethod 0.2.0 installed" in version and loading is None
    assert checked(plugins["toy-not-importing"], {}) == [None, None]


def test_the_version_check_names_a_missing_package_and_another_version():
    """What the ServerApp and each SuperNode check (``fedseg.method_plugins.version_problem``), against this
    environment's installed distributions (fedseg itself stands for an installed method package)."""
    from importlib.metadata import version

    from fedseg.method_plugins import run_config_value, version_problem

    ours = version("fedseg")
    value = run_config_value(
        {
            "gone": {"distribution": "fedseg-no-such-package", "version": "1.0"},
            "other": {"distribution": "fedseg", "version": "0.0.1"},
            "same": {"distribution": "fedseg", "version": ours},
        }
    )
    assert version_problem(value, "this SuperNode") == (
        "method 'gone' comes from fedseg-no-such-package 1.0, which this SuperNode does not have installed (pip "
        "install 'fedseg-no-such-package==1.0'); method 'other' comes from fedseg 0.0.1 but this SuperNode has "
        f"fedseg {ours} installed (install the same version)"
    )
    assert run_config_value({}) == "" and version_problem("", "this SuperNode") is None
    release = ".".join(ours.split(".")[:2]) if ours.count(".") == 2 and ours.endswith(".0") else None
    if release:  # 0.1 names the release 0.1.0 (PEP 440): no refusal for how a version is written
        assert version_problem(run_config_value({"same": {"distribution": "fedseg", "version": release}}), "x") is None


def test_a_plugin_imported_before_fedseg_loads_once_its_import_has_finished(plugins):
    """A script (or the plugin's own tests) importing the method package first: its ``from fedseg import ...`` loads
    fedseg's methods while the package is half imported (no ``SPECS`` yet), which declared it broken with a warning
    and left its method unknown. It is loaded when a method is first looked up instead."""
    code = (
        "import fedseg_toymethod\n"
        "from fedseg.algorithms import PLUGINS, get_algorithm\n"
        "print(get_algorithm('toymethod').display_name, PLUGINS['toymethod'])\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], env=environment(plugins["toy"]), capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "Toy FedAvg plugin fedseg-toymethod 0.1.0" and not warnings(done.stderr), done.stderr


SUBMODULE = """from fedseg import AlgorithmSpec, FedAvgClient, FedAvgOptions, FedAvgServer

DISPLAY = "Toy from a submodule"

from fedseg_subtoy.methods import SPECS  # noqa: E402 - the package's methods, after what they import from it
"""
METHODS = """from fedseg import AlgorithmSpec, FedAvgClient, FedAvgOptions, FedAvgServer
from fedseg_subtoy import DISPLAY

SPECS = (AlgorithmSpec("subtoy", DISPLAY, FedAvgServer, FedAvgClient, "FedAvg from a submodule", FedAvgOptions),)
"""


def test_a_plugin_whose_entry_point_is_a_submodule_of_a_package_being_imported_waits_for_it(tmp_path):
    """A second reviewer: an entry point naming a submodule (``fedseg_subtoy.methods``) whose package's
    ``__init__`` imports fedseg first was loaded while the package was half imported (``ImportError: cannot import
    name 'DISPLAY' from partially initialized module``) and declared broken."""
    root = install(tmp_path, "fedseg-subtoy", "0.1.0", "fedseg_subtoy", SUBMODULE, "subtoy")
    (root / "fedseg_subtoy" / "methods.py").write_text(METHODS)
    info = root / "fedseg_subtoy-0.1.0.dist-info" / "entry_points.txt"
    info.write_text("[fedseg.methods]\nsubtoy = fedseg_subtoy.methods\n")
    code = "import fedseg_subtoy\nfrom fedseg.algorithms import get_algorithm as get\nprint(get('subtoy').display_name)"
    done = subprocess.run(
        [sys.executable, "-c", code], env=environment(root), capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "Toy from a submodule" and not warnings(done.stderr), done.stderr
