"""``raypeft validate``: every check ``tune`` runs before it starts, and nothing else.

The same preflight pipeline as ``tune`` (schema, files and data, model, method settings,
stores, resources), so a file ``validate`` accepts fails ``tune`` only for what happens during
the search itself.
"""

from __future__ import annotations

from pathlib import Path

import click

from raypeft.cli.options import OVERRIDES, fail, load_and_check, quiet_libraries
from raypeft.search.resources import describe_placement


@click.command("validate")
@click.argument("file", required=False, type=click.Path(dir_okay=False, path_type=Path))
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
    file: Path | None, space_file: Path | None, overrides: tuple[str, ...], address: str | None
) -> None:
    """Check an experiment file without running anything."""
    if (file is None) == (space_file is None):
        fail("name one experiment file: raypeft validate FILE (or --space FILE)")
    file = file or space_file
    quiet_libraries()
    cfg, checked = load_and_check(file, overrides, address)
    grid = cfg.grid_size()
    click.echo(
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
