"""Command line: ``fedseg run | report | presets | algorithms | predict | loss-surface | data | flower``."""

from __future__ import annotations

import shlex
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import typer
from rich.console import Console

from fedseg.cli_errors import fail
from fedseg.cli_options import AlgorithmsHelp, device_option, threads_option, track_option
from fedseg.config_load import ConfigError, config_from_cli, error_text, preset_description, preset_names, preset_yaml
from fedseg.console_tables import print_dice, print_table
from fedseg.data.federation import FederationError
from fedseg.interrupts import INTERRUPTED_EXIT, interrupted_text, terminate_on_signals

if TYPE_CHECKING:  # the report's modules are imported where a command needs them (start-up time)
    from fedseg.predict_inputs import Skipped
    from fedseg.presentation.kit import RunFiles

# pretty_exceptions_show_locals=False: an unexpected error's traceback must not print every local variable (a full
# disk once gave 207 MB of them, and locals may hold a site's data)
app = typer.Typer(
    help="fedseg: cross-silo federated learning for medical image segmentation.",
    no_args_is_help=True,
    pretty_exceptions_show_locals=False,
)
console = Console()


def _mount_data_app() -> None:
    from fedseg.data.cli import data_app

    app.add_typer(
        data_app,
        name="data",
        help="Folder federations: check one, synth (write a built-in one to disk), import a real dataset (FeTS 2022, "
        "MSD, nnU-Net, ...), export to nnU-Net, and the cache of built-in ones.",
    )


_mount_data_app()


def _mount_flower_app() -> None:
    from fedseg.flower.cli import flower_app

    app.add_typer(
        flower_app,
        name="flower",
        help="Run on a real Flower deployment: local | simulate | server | supernode | certs.",
    )


_mount_flower_app()


def _print_version(value: bool) -> None:
    if value:
        from fedseg.run.provenance import version_text

        print(version_text())
        raise typer.Exit()


@app.callback()
def main(
    version: bool = typer.Option(
        False,
        "--version",
        callback=_print_version,
        is_eager=True,
        help="print the versions of fedseg, torch, MONAI, flwr",
    ),
) -> None:
    """fedseg: cross-silo federated learning for medical image segmentation."""
    import sys

    from fedseg import lean_monai
    from fedseg.run import provenance

    lean_monai.install()  # before anything imports MONAI: ~1 s less start-up (fedseg.lean_monai)

    provenance.COMMAND_LINE = list(sys.argv)  # recorded in summary.json's provenance


presets_app = typer.Typer(invoke_without_command=True)
app.add_typer(presets_app, name="presets")


@presets_app.callback()
def presets(ctx: typer.Context) -> None:
    """List the built-in presets, one line each; `fedseg presets show NAME` prints one as YAML."""
    if ctx.invoked_subcommand is not None:
        return
    for name in preset_names():
        console.print(f"[bold]{name}[/]: {preset_description(name)}", highlight=False)


@presets_app.command()
def show(name: str = typer.Argument(..., help="preset name (see `fedseg presets`)")) -> None:
    """Print preset NAME as a YAML config: `fedseg presets show demo > my.yaml`, edit, `fedseg run --config my.yaml`."""
    try:
        text = preset_yaml(name)
    except ConfigError as e:
        fail(str(e))
        return
    print(text, end="")


@app.command()
def algorithms(
    long: bool = typer.Option(
        False,
        "--long",
        help="every column: display name, family, minimum sites, Flower, source (built in, or the installed package), "
        "the full description",
    ),
) -> None:
    """List the registered methods, one line each: name, kind, summary (fits the terminal); --long: every column.
    A method installed as a package says so, with the package's name and version."""
    from fedseg.algorithms import ALGORITHMS, BUILTIN_ALGORITHMS, PLUGINS

    def source(name: str) -> str:
        return "built in" if name in BUILTIN_ALGORITHMS else str(PLUGINS[name]) if name in PLUGINS else "registered"

    terminal = Console()  # the width now (the module's console keeps a COLUMNS set when fedseg.cli was imported)
    if not long:
        brief = [
            (s.name, s.kind, s.display_name, s.description, source(s.name) if s.name in PLUGINS else "")
            for s in ALGORITHMS.values()
        ]
        for line in algorithm_lines(brief, terminal.width):
            terminal.print(line, highlight=False, markup=False, soft_wrap=True)
        return
    rows = [
        [
            s.name,
            s.display_name,
            s.kind,
            s.family_name or "",
            str(s.min_sites),
            "no" if s.on_flower else "yes",
            source(s.name),
            s.description,
        ]
        for s in ALGORITHMS.values()
    ]
    print_table(
        terminal,
        "Algorithms (config: --algorithms NAME,...; options: methods.NAME.KEY)",
        ["name", "display name", "kind", "family", "min sites", "Flower", "source", "description"],
        rows,
    )


def algorithm_lines(rows: Sequence[tuple[str, ...]], width: int) -> list[str]:
    """``fedseg algorithms``: a header, one line per ``(name, kind, display name, description[, source])`` and a
    footer, no line longer than ``width`` (at least 40). The summary is "<display name> [<source>]: " (``source``:
    e.g. ``plugin fedseg-mymethod 0.2.0`` for an installed method, where given) and the description without a
    leading "<display name> (authors):", cut at a word with "…" where it would pass ``width`` (``--long`` prints
    it whole)."""
    width = max(width, 40)
    name_w = max(len("name"), *(len(r[0]) for r in rows)) if rows else 4
    kind_w = max(len("kind"), *(len(r[1]) for r in rows)) if rows else 4
    room = max(width - name_w - kind_w - 4, 8)

    def summary(display: str, text: str, origin: str = "") -> str:
        head, sep, rest = text.partition(": ")
        if sep and rest and head.split(" (")[0] == display:  # "FedAvg (McMahan et al.): ..." -> "..."
            text = rest
        shown = display  # the name the report and tables show, first
        if origin:  # the package a method comes from: kept whole, the display name dropped where both do not fit
            shown = f"{display} [{origin}]" if len(display) + len(origin) + 6 <= room else f"[{origin}]"
        text = f"{shown}: {text[:1].upper() + text[1:]}"
        if len(text) <= room:
            return text
        keep = len(shown) + 2 if len(shown) + 4 <= room else 0  # the description is cut, not the name or package
        cut = text[: room - 1]
        cut = cut[:keep] + cut[keep:].rsplit(" ", 1)[0] if " " in cut[keep:] else cut
        return cut.rstrip(" ,;:(") + "…"

    lines = [f"{'name':<{name_w}}  {'kind':<{kind_w}}  summary"]
    lines += [f"{r[0]:<{name_w}}  {r[1]:<{kind_w}}  {summary(*r[2:])}".rstrip() for r in rows]
    footer = ["Use: --algorithms NAME,...; options: methods.NAME.KEY.", "Every column: fedseg algorithms --long."]
    return [line[:width] for line in lines + footer]


@app.command(cls=AlgorithmsHelp)
def run(
    out: Path = typer.Option(..., "--out", help="output directory of the run"),
    preset: str | None = typer.Option(None, "--preset", help="built-in preset name (see `fedseg presets`)"),
    config: Path | None = typer.Option(None, "--config", help="YAML config file"),
    data: Path | None = typer.Option(None, "--data", help="folder federation replacing the preset's data"),
    algorithms: str | None = typer.Option(None, "--algorithms", help="comma-separated algorithm names: {algorithms}"),
    rounds: int | None = typer.Option(None, "--rounds", help="federated rounds"),
    seed: int | None = typer.Option(
        None, "--seed", help="the run's seed: initial weights, batch order, augmentation (the data: data.seed)"
    ),
    device: str | None = device_option(),
    threads: int | None = threads_option(),
    workers: int | None = typer.Option(
        None,
        "--workers",
        min=1,
        help="sites in parallel in this many worker processes (config engine.workers; 1 = one after another); "
        "results are the same for any number",
    ),
    track: list[str] = track_option(),
    set_: list[str] = typer.Option([], "--set", help="override: key.sub=value (YAML value); repeatable"),
    resume: bool = typer.Option(False, "--resume", help="continue from the last checkpoint in --out"),
    holdout: str | None = typer.Option(
        None,
        "--holdout",
        help="train without SITE, evaluate on all of SITE's cases: OUT/holdout/SITE/ + OUT/unseen.csv",
    ),
    leave_one_out: bool = typer.Option(
        False, "--leave-one-out", help="--holdout for every site in turn: OUT/unseen.csv (FedSM Table 5)"
    ),
    sweep: str | None = typer.Option(
        None, "--sweep", help="key=v1,v2,...: one run per value, OUT/sweep/<key>=<value>/ + OUT/sweep.csv"
    ),
    keep_checkpoints: bool = typer.Option(
        False,
        "--keep-checkpoints",
        help="keep the trained models in each finished algorithm's checkpoints/<algorithm>.pt too, and its last "
        "round's states (<algorithm>.last.pt), so that --resume --rounds M can extend the finished run "
        "(default: a small record; the models are in OUT/model/)",
    ),
) -> None:
    """Train and evaluate every configured algorithm; write summary.json, CSVs, model/ and report.html.
    With --holdout / --leave-one-out / --sweep: a study of several such runs (see docs/benchmark-protocol.md)."""
    try:
        with terminate_on_signals():  # from the start: a SIGTERM while torch is imported (seconds) ended it silently
            cfg = config_from_cli(preset, config, data, algorithms, rounds, seed, set_, device, threads, track, workers)
            from fedseg.path_checks import check_run_paths
            from fedseg.run.runlog import last_event  # stdlib only: no torch yet

            if not (holdout or leave_one_out or sweep):  # a wrong --out or --data said at once, before torch
                check_run_paths(cfg, out, resume)

            # the pool's process server imports torch on another core while this one does; not for a resume of a run
            # whose run.log ends finished (run_experiment starts it, once torch can read the checkpoints, if any
            # algorithm has anything left to train)
            if cfg.engine.workers > 1 and not (resume and last_event(out) == "finished"):
                from fedseg.engine.forkserver import start_forkserver

                start_forkserver(while_waiting=lambda: report_modules(cfg.algorithms))
            from fedseg.run.progress import run_with_progress

            if holdout or leave_one_out or sweep:
                return run_study(cfg, out, resume, holdout, leave_one_out, sweep, keep_checkpoints)
            results = run_with_progress(cfg, out, resume, console, keep_checkpoints=keep_checkpoints)
    except (ConfigError, FederationError, OSError, KeyError, ValueError) as e:  # OSError: full disk, read-only...
        fail(error_text(resume_hinted(e, out) if resume else e))
        return
    except KeyboardInterrupt:
        fail(interrupted_text("the run", out, "every finished round is checkpointed"), INTERRUPTED_EXIT)
        return
    try:
        with terminate_on_signals():
            path, _ = report_or_fail(out)
    except KeyboardInterrupt:  # trained and its results written: only the report is missing
        fail(
            f"interrupted: training finished and its results are written in {out}, the report was not drawn: "
            f"`fedseg report {shlex.quote(str(out))}` draws it",
            INTERRUPTED_EXIT,
        )
        return
    try:
        with terminate_on_signals():
            from fedseg.tracking import log_report

            log_report(out, cfg, path)  # the report to each algorithm's tracking run (when tracking is on)
            print_dice_table(results)
            print_verdict(out)
    except KeyboardInterrupt:
        upload = " (with tracking on: its upload to the tracking runs may be missing)" if cfg.tracking else ""
        fail(f"interrupted: the run and its report are written: {path}{upload}", INTERRUPTED_EXIT)
        return
    console.print(f"report: {path}")


def resume_hinted(error: Exception, out: Path) -> Exception:
    """``--resume``'s error, with the hint the Python API gives (``fedseg.api.resume_error``) where it is a method or
    federation that the run (or bench) in ``out`` recorded and this process does not know: registered by a script
    (docs/api.md), which must register it again to resume."""
    from fedseg.api import resume_error

    return resume_error(error, out)


def report_modules(algorithms: Sequence[str]) -> list[str]:
    """The modules a run's report imports (the report, its methods' families' sections)."""
    from fedseg.algorithms import get_algorithm

    families = {get_algorithm(name).family for name in algorithms}
    return ["fedseg.report.html", *(m for f in families if f is not None for m in f.report_imports)]


def run_study(
    cfg,
    out: Path,
    resume: bool,
    holdout: str | None,
    leave_one_out: bool,
    sweep: str | None,
    keep_checkpoints: bool = False,
) -> None:
    """Plan the study (every site name / sweep value checked before any work), run it, print its table,
    render reports."""
    from fedseg import studies
    from fedseg.report.studies import render_study
    from fedseg.run.progress import run_with_progress

    if sum(map(bool, (holdout, leave_one_out, sweep))) > 1:
        raise ValueError("--holdout, --leave-one-out and --sweep cannot be combined; run them separately")
    study = (
        studies.plan_sweep(cfg, out, sweep) if sweep else studies.plan_holdout(cfg, out, [holdout] if holdout else None)
    )
    result = studies.run_study(
        study,
        resume,
        lambda c, o, r, fed: run_with_progress(c, o, r, console, fed, keep_checkpoints),
        lambda sub: console.print(f"[bold]{sub.label}[/]: {sub.dir}", highlight=False),
    )
    try:  # every run finished and the study's tables are written: only the reports may be missing
        for note in result.skipped:
            console.print(f"no unseen-site row for {note}", highlight=False)
        title = f"{study.table}.csv" + (f" ({study.key})" if study.key else "")
        print_rows(title, [c for c in result.columns if c not in ("run", "key")], result.rows)
        console.print(f"report: {render_study(out)}")
        from fedseg.tracking import log_report

        for sub in study.runs:  # each sub-run's report (just re-rendered) to its tracking runs
            log_report(sub.dir, sub.cfg)
    except KeyboardInterrupt:
        fail(
            f"interrupted: the study's runs finished and its {study.table}.csv is written in {out}, its reports were "
            f"not all drawn: `fedseg report {shlex.quote(str(out))}` draws them",
            INTERRUPTED_EXIT,
        )


def print_rows(title: str, columns: list[str], rows: list[dict]) -> None:
    """A study table on the console (floats to 4 digits, None blank; headers without ``freq_``/``dice_``;
    ``dice_global``, the mean over every test case pooled, headed ``pooled`` as in the run's Dice table)."""
    cell = lambda v: "" if v is None else f"{v:.4f}" if isinstance(v, float) else str(v)  # noqa: E731
    short = {"dice_global": "pooled"}
    headers = [short.get(c) or c.replace("freq_PM_", "PM ").replace("freq_", "").replace("dice_", "") for c in columns]
    print_table(console, title, headers, [[cell(row.get(c)) for c in columns] for row in rows])


def print_dice_table(results) -> None:
    print_dice(
        console,
        f"Test Dice ({results.federation.name})",
        results.federation.site_names,
        {a.name: a.summary["dice"] for a in results.algorithms},
        results.federation.regions.ignore,
    )


def print_verdict(run_dir: Path) -> None:
    """Under the Dice table: the report's verdict (best method on test Dice Client Avg, its paired differences,
    what is within noise, convergence) and routing notes (FedSM sending every test image to its global model),
    wrapped for the terminal, each comparison's test numbers on a line of their own (``terminal_lines``)."""
    from fedseg.report.verdict import summary_lines, terminal_lines

    for text in terminal_lines(summary_lines(run_dir), console.width):
        console.print(text, highlight=False, markup=False, soft_wrap=True)


@app.command()
def bench(
    config: Path = typer.Argument(..., help="bench file (YAML): federations, methods and grids, seeds, split, budget"),
    out: Path = typer.Option(..., "--out", help="output directory of the bench"),
    jobs: int = typer.Option(1, "--jobs", min=1, help="runs trained at once, each in its own process"),
    resume: bool = typer.Option(False, "--resume", help="continue: finished runs are reused, half-done ones resumed"),
    tables_only: bool = typer.Option(
        False, "--tables-only", help="train nothing: the tables of the runs finished so far (e.g. of a running bench)"
    ),
) -> None:
    """A declarative study (docs/benchmark-protocol.md): every method x fold x seed x federation as runs in
    OUT/runs/, grids tuned on validation, equal budgets; OUT/tables.md, tables.tex (LaTeX), tables.json, results.csv,
    report.html."""
    try:
        with terminate_on_signals():  # kill, a closed terminal: as Ctrl-C, from the first import to the tables
            from fedseg.bench.plan import load_bench  # no torch: a bench file missing or bad is said at once

            spec, root = load_bench(config)
            from fedseg.bench.phases import run_bench
            from fedseg.bench.report import write_report

            echo = lambda line: console.print(line, highlight=False, soft_wrap=True)  # noqa: E731
            runs = run_bench(spec, root, out, jobs, resume, echo, train=not tables_only)
            write_report(spec, runs, out, echo)
    except (ConfigError, FederationError, OSError, KeyError, ValueError) as e:
        fail(error_text(resume_hinted(e, out) if resume else e))
        return
    except KeyboardInterrupt:
        detail = "the running runs stopped at their last checkpoint, the queued ones did not start"
        fail(interrupted_text("the bench", out, detail), INTERRUPTED_EXIT)
        return
    console.print(f"tables: {out / 'tables.md'} (LaTeX: tables.tex)\nreport: {out / 'report.html'}", highlight=False)


@app.command()
def report(run_dir: Path = typer.Argument(..., help="output directory of a finished run, study or bench")) -> None:
    """Re-render report.html and figures/ from the files of a run (or of a study and its sub-runs; or of a bench:
    tables.md, tables.tex and report.html from its tables.json, by the current statistics rules)."""
    again = f"`fedseg report {shlex.quote(str(run_dir))}`"
    try:
        with terminate_on_signals():  # a page and its figures are replaced together at the end, or not at all
            from fedseg.report.studies import is_study_dir, render_study

            if not (run_dir / "summary.json").is_file() and (run_dir / "tables.json").is_file():
                from fedseg.bench.report import rewrite_report

                try:
                    page = rewrite_report(run_dir)
                except (ValueError, OSError) as e:
                    fail(error_text(e))
                console.print(f"tables: {run_dir / 'tables.md'} (LaTeX: tables.tex)\nreport: {page}", highlight=False)
                return
            if not (run_dir / "summary.json").is_file():
                if not is_study_dir(run_dir):
                    fail(
                        f"{run_dir}: no summary.json, study.json, unseen.csv, sweep.csv or tables.json (not a run, "
                        "study or bench directory?)"
                    )
                try:
                    page = render_study(run_dir)
                except OSError as e:  # writing it (a full disk)
                    fail(f"the report was not written: {error_text(e)}; {again} draws it again")
                except ValueError as e:  # a damaged file of the study or of a sub-run (the message names it)
                    fail(f"the report was not drawn: {error_text(e)}")
                console.print(f"report: {page}")
                return
            from fedseg.report.html import unfinished_text, unreadable_text

            path, run = report_or_fail(run_dir)
    except KeyboardInterrupt:  # Ctrl-C, SIGTERM, SIGHUP: the previous report.html and figures/ are left as they were
        fail(f"interrupted: the report was not drawn; run {again} again", INTERRUPTED_EXIT)
    console.print(f"report: {path}")
    for text in (unfinished_text(run), unreadable_text(run)):
        if text:
            console.print(f"note: {text}", highlight=False, soft_wrap=True)


def report_or_fail(run_dir: Path) -> tuple[Path, RunFiles]:
    """Render ``run_dir``'s report.html (``fedseg.report.html.render_report``); returns its path and the run's files
    as read. One error line if a file of the run cannot be read or the report cannot be written (a full disk:
    nothing half-written is left, the run's results stay as they are)."""
    from fedseg.presentation.kit import load_run
    from fedseg.report.html import render_report

    try:
        run = load_run(run_dir)
        return render_report(run_dir, run), run
    except OSError as e:  # writing it (a full disk): the same command draws it once there is room
        fail(f"the report was not written: {error_text(e)}; `fedseg report {shlex.quote(str(run_dir))}` draws it again")
        raise  # fail() exits; for the type checker
    except (ValueError, KeyError) as e:  # a damaged file of the run (the message says which and what to do)
        fail(f"the report was not drawn: {error_text(e)}")
        raise


@app.command()
def predict(
    model: Path = typer.Option(..., "--model", help="RUN/model (or RUN/model/<algorithm>) of a finished run"),
    input_: Path = typer.Option(
        ...,
        "--input",
        help="an image file, a DICOM series folder, or a folder of them (png, jpg, npy, nii, nii.gz, nrrd, mha, mhd)",
    ),
    out: Path = typer.Option(..., "--out", help="folder for the masks and predictions.csv"),
    gamma: float | None = typer.Option(None, "--gamma", help="FedSM threshold overriding the bundle's (0..1)"),
    algorithm: str | None = typer.Option(
        None, "--algorithm", help="which bundle of RUN/model (default: the only FedSM one)"
    ),
    site: str | None = typer.Option(None, "--site", help="bundles with one model per site (local): whose model"),
    force: bool = typer.Option(False, "--force", help="overwrite existing masks / predictions.csv in --out"),
    overlay: bool = typer.Option(
        False, "--overlay", help="also write <name>_overlay.png: the image (3D: middle slice) with the regions drawn"
    ),
    dicom_seg: bool = typer.Option(
        False,
        "--dicom-seg",
        help="also write <name>.dcm per DICOM series input: a DICOM-SEG of the regions referencing the series (PACS)",
    ),
    device: str = typer.Option("cpu", "--device", help="torch device the networks run on (cpu, cuda, cuda:1, mps)"),
    tta: bool = typer.Option(
        False, "--tta", help="mirroring test-time augmentation: logits averaged over every flip (2D: 4 passes, 3D: 8)"
    ),
) -> None:
    """Segment new images with a trained bundle (FedSM: Algorithm 2); writes masks in the input's format
    + predictions.csv (+ overlay pictures with --overlay, DICOM-SEGs of DICOM series with --dicom-seg)."""
    try:
        with terminate_on_signals():  # kill, a closed terminal: as Ctrl-C, the staged masks are removed
            from fedseg.path_checks import check_predict_paths

            check_predict_paths(model, input_, out, algorithm)  # a wrong path said at once, before torch
            from fedseg.predict import predict as predict_images

            notes: list[str] = []  # the channel order the model reads, where it knows it
            skipped: list[Skipped] = []  # DICOM series unreadable as volumes, left out (each said as a warning)
            rows = predict_images(
                model,
                input_,
                out,
                gamma,
                algorithm,
                site,
                force,
                overlay=overlay,
                notes=notes,
                dicom_seg=dicom_seg,
                device=device,
                tta=tta,
                skipped=skipped,
            )
    except (FederationError, OSError, ValueError) as e:  # OSError: an --out that cannot be made, a full disk...
        fail(error_text(e))
        return
    except KeyboardInterrupt:  # the masks are staged and moved into --out all together at the end
        fail(f"interrupted: no mask was written to {out}; run the same command again", INTERRUPTED_EXIT)
        return
    overlays = f", {len(rows)} overlay(s)" if overlay else ""
    overlays += f", {sum(bool(r['dicom_seg']) for r in rows)} DICOM-SEG(s)" if dicom_seg else ""
    for note in notes:
        console.print(note, highlight=False, soft_wrap=True)  # a path is not broken mid-name
    console.print(f"{len(rows)} mask(s){overlays}, predictions.csv and predict.json written to {out}", highlight=False)
    if skipped:  # the good series are predicted; a script must still notice the bad ones
        names = ", ".join(str(series.path) for series in skipped)
        fail(
            f"{len(skipped)} of {len(rows) + len(skipped)} inputs skipped, not predicted (DICOM series that cannot be "
            f"read as one volume; each said above, listed in predict.json's skipped): {names}"
        )


@app.command("loss-surface")
def loss_surface(
    runs: list[Path] = typer.Argument(..., help="finished run folders (e.g. of --algorithms local,fedavg,fedsm)"),
    site: str = typer.Option(..., "--site", help="whose training data the loss is computed on, and whose models"),
    out: Path = typer.Option(..., "--out", help="folder for loss_surface_<site>.csv and .png"),
    directions: int = typer.Option(10, "--directions", min=1, help="random filter-normalized directions"),
    seed: int = typer.Option(0, "--seed", help="seed of the random directions"),
    device: str = typer.Option("cpu", "--device", help="torch device the losses are computed on"),
    cases: int | None = typer.Option(
        None, "--cases", min=1, help="the loss on this many of SITE's training cases (drawn by --seed); default all"
    ),
) -> None:
    """FedSM's Figure 4: the training loss of SITE near each trained model (global, local:SITE, personal:SITE) along
    random filter-normalized directions (t in -1..1), and along the line from FedSM's global to its personalized
    model; writes OUT/loss_surface_<SITE>.csv and .png (docs/benchmark-protocol.md)."""
    try:
        with terminate_on_signals():
            from fedseg.loss_surface import loss_surface as compute_surface

            csv_path, png = compute_surface(runs, site, out, directions, seed, device, cases)
    except (FederationError, OSError, KeyError, ValueError) as e:  # ConfigError, BundleError: ValueErrors
        fail(error_text(e))
        return
    except KeyboardInterrupt:  # the CSV is written (atomically) only once every loss is computed
        said = f"interrupted: the loss surface of {site} was not written to {out}; run the same command again"
        fail(said, INTERRUPTED_EXIT)
        return
    console.print(f"loss surface: {csv_path}" + (f"\nfigure: {png}" if png else ""), highlight=False, soft_wrap=True)


def _print_logged_warnings() -> None:
    """fedseg's logged warnings (a corrupt cache entry rebuilt, a region no case holds, a site skipped...) on stderr
    as ``warning: ...``, as the commands' own warnings: unconfigured, Python's logging printed the bare message."""
    import logging

    handler = logging.StreamHandler()
    handler.setLevel(logging.WARNING)
    handler.setFormatter(logging.Formatter("warning: %(message)s"))
    logging.getLogger("fedseg").addHandler(handler)


def entry() -> None:
    """The ``fedseg`` command: the app, then :func:`fedseg.process_exit.exit_now` with its status (no
    interpreter teardown: 1.2-1.5 s saved after every command). Its output outlives a reader that goes away
    (``fedseg run ... | head``: :func:`fedseg.console_streams.outlive_readers`)."""
    from fedseg.console_streams import outlive_readers
    from fedseg.folder_lock import hold_until_exit, release_all
    from fedseg.process_exit import exit_now, print_error

    outlive_readers()  # before the warnings' handler takes sys.stderr
    _print_logged_warnings()
    hold_until_exit()  # a command holds its output folders until it ends: a run's report is drawn after its run
    try:
        try:
            app()
        finally:
            release_all()  # its work done: let go of its folders (their lock files removed) before any exit
    except SystemExit as e:  # Typer ends every command with one
        if isinstance(getattr(e.__context__, "__cause__", None), KeyboardInterrupt):
            # Typer's own exit for a Ctrl-C no handler of the command took (presets, algorithms...): silent else
            print_error("error: interrupted")
        exit_now(e.code)
    except KeyboardInterrupt:  # raised before Typer runs the command
        print_error("error: interrupted")
        exit_now(INTERRUPTED_EXIT)
    except OSError as e:  # escaped every command's own handling: a write to a full disk's stdout (`> file`)
        print_error(f"error: could not write the command's output: {e}" if e.filename is None else f"error: {e}")
        exit_now(1)
    exit_now(0)


if __name__ == "__main__":
    entry()
