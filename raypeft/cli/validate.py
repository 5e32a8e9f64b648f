"""``raypeft validate``: every check ``tune`` runs before it starts, and nothing else.

The same preflight pipeline as ``tune`` (schema, files and data, model, method settings,
stores, resources), so a file ``validate`` accepts fails ``tune`` only for what happens during
the search itself.
"""

from __future__ import annotations

import sys
from pathlib import Path

import click

from raypeft.cli.options import (
    EXIT_USER_ERROR,
    OVERRIDES,
    check_file,
    error_line,
    experiment_files,
    quiet_libraries,
)
from raypeft.errors import ConfigError
from raypeft.search.resources import describe_placement


@click.command("validate")
@click.argument("files", nargs=-1, type=click.Path(dir_okay=False, path_type=Path))
@click.option(
    "--space",
    "space_file",
    type=click.Path(dir_okay=False, path_type=Path),
    help="the experiment file (as for tune; or give it as the argument)",
)
@OVERRIDES
@click.option(
    "--address",
    default=None,
    help="the Ray cluster the file is for, as tune takes it: the resources are then not "
    "checked against this machine (default: they must fit it, as a local tune needs)",
)
def command(
    files: tuple[Path, ...],
    space_file: Path | None,
    overrides: tuple[str, ...],
    address: str | None,
) -> None:
    """Check experiment FILES without running anything: one line each, `ok` or the error
    (exit 2 when any file fails)."""
    files = experiment_files(files, space_file, most=None)
    quiet_libraries()
    # why: Optuna takes a second to import; --help and bad arguments answer sooner
    from raypeft.preflight.sampler import sampler_notes

    failed = 0
    for file in files:
        try:
            cfg, checked = check_file(file, overrides, address)
        except ConfigError as exc:
            click.echo(error_line(str(exc)), err=True)
            failed += 1
            continue
        click.echo(ok_line(file, cfg, checked, address))
        if checked.gpu_line:
            click.echo(f"  {checked.gpu_line}")
        for note in (*checked.notes, *sampler_notes(cfg)):
            click.echo(f"  note: {note}")
    if failed:
        sys.exit(EXIT_USER_ERROR)


def ok_line(file: Path, cfg, checked, address: str | None) -> str:
    """What an accepted file is: method, model, task, trials, space, where they would run."""
    grid = cfg.grid_size()
    return (
        f"{file}: ok ({cfg.method.name} on {cfg.model.name}, task {cfg.task.name}, "
        f"{cfg.search.num_samples} trials, {len(cfg.space)} searched keys"
        + (f", joint grid of {grid} points" if grid else "")
        + (f"; resources not checked: cluster {address}" if address else "")
        + (
            f"; {describe_placement(cfg, checked.trials_at_once, ' here')}"
            if checked.trials_at_once
            else ""
        )
        + ")"
    )
