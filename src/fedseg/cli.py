"""Command line: ``fedseg run | report | presets | data``."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer
from rich.console import Console
from rich.table import Table

from fedseg.config import ConfigError, config_from_cli, preset_description, preset_names
from fedseg.data.federation import FederationError

app = typer.Typer(help="fedseg: cross-silo federated learning for medical image segmentation.", no_args_is_help=True)
console = Console()


def _mount_data_app() -> None:
    from fedseg.data.cli import data_app

    app.add_typer(data_app, name="data", help="Validate or generate folder federations.")


_mount_data_app()


def _mount_flower_app() -> None:
    from fedseg.flower.cli import flower_app

    app.add_typer(flower_app, name="flower", help="Run on a real Flower deployment: local | server | supernode | certs.")


_mount_flower_app()


def fail(message: str) -> None:
    console.print(f"[bold red]error:[/] {message}", highlight=False)
    raise typer.Exit(1)


@app.command()
def presets() -> None:
    """List the built-in presets, one line each."""
    for name in preset_names():
        console.print(f"[bold]{name}[/]: {preset_description(name)}", highlight=False)


@app.command()
def run(
    out: Path = typer.Option(..., "--out", help="output directory of the run"),
    preset: Optional[str] = typer.Option(None, "--preset", help="built-in preset name (see `fedseg presets`)"),
    config: Optional[Path] = typer.Option(None, "--config", help="YAML config file"),
    data: Optional[Path] = typer.Option(None, "--data", help="folder federation replacing the preset's data"),
    algorithms: Optional[str] = typer.Option(None, "--algorithms", help="comma-separated algorithm names"),
    rounds: Optional[int] = typer.Option(None, "--rounds", help="federated rounds"),
    seed: Optional[int] = typer.Option(None, "--seed"),
    set_: list[str] = typer.Option([], "--set", help="override: key.sub=value (YAML value); repeatable"),
    resume: bool = typer.Option(False, "--resume", help="continue from the last checkpoint in --out"),
) -> None:
    """Train and evaluate every configured algorithm; write summary.json, CSVs, model/ and report.html."""
    try:
        cfg = config_from_cli(preset, config, data, algorithms, rounds, seed, set_)
        from fedseg.progress import run_with_progress

        results = run_with_progress(cfg, out, resume, console)
    except (ConfigError, FederationError, FileExistsError, KeyError, ValueError) as e:
        fail(str(e).strip("'\""))
        return
    from fedseg.report import render_report

    path = render_report(out)
    print_dice_table(results)
    console.print(f"report: {path}")


def print_dice_table(results) -> None:
    sites = results.federation.site_names
    table = Table(title=f"Test Dice ({results.federation.name})")
    for col in ["algorithm", *sites, "client_avg", "global"]:
        table.add_column(col, justify="right" if col != "algorithm" else "left")
    for algo in results.algorithms:
        dice = algo.summary["dice"]
        table.add_row(algo.name, *(f"{dice[k]:.4f}" for k in [*sites, "client_avg", "global"]))
    console.print(table)


@app.command()
def report(run_dir: Path = typer.Argument(..., help="output directory of a finished run")) -> None:
    """Re-render report.html and figures/ from the files of a run."""
    if not (run_dir / "summary.json").is_file():
        fail(f"{run_dir}: no summary.json (not a run directory?)")
    from fedseg.report import render_report

    console.print(f"report: {render_report(run_dir)}")


if __name__ == "__main__":
    app()
