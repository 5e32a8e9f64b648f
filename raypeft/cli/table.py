"""``raypeft table EXPERIMENT --out T.json``: a finished search as a learning-curve table.

Thin: it parses options and calls :func:`raypeft.search.simulate.read_table`.
"""

from __future__ import annotations

from pathlib import Path

import click

from raypeft.cli.options import TRACKING_URI, fail, quiet_libraries
from raypeft.errors import ConfigError


@click.command("table")
@click.argument("experiment")
@TRACKING_URI
@click.option("--run", "run_id", default=None, metavar="PARENT_RUN_ID",
              help="the search (parent run) to read (default: the newest finished)")  # fmt: skip
@click.option("--out", required=True, type=click.Path(dir_okay=False, path_type=Path),
              help="the table file to write (JSON)")  # fmt: skip
@click.option("--storage", default=None, metavar="URL",
              help="the search's Optuna storage (default: its search.storage as logged; give "
              "it where the database needs a password, which is never logged)")  # fmt: skip
def command(
    experiment: str, tracking_uri: str | None, run_id: str | None, out: Path, storage: str | None
) -> None:
    """Read a finished search of EXPERIMENT over a discrete space (grid or choice keys) back
    from Optuna and MLflow as learning curves: per configuration and seed, the validation
    loss and metric at every evaluation and the trial's wall time at each. Only trials that
    ran to their end are kept. ``raypeft simulate`` replays searches against the file."""
    quiet_libraries()
    from raypeft.search.simulate import read_table
    from raypeft.tracking.runs import tracking_uri as default_uri

    try:
        table = read_table(default_uri(tracking_uri), experiment, run_id, storage)
    except ConfigError as exc:
        fail(str(exc))
    table.source["command"] = f"raypeft table {experiment} --out {out}"
    table.save(out)
    configurations = len(table.by_configuration())
    click.echo(
        f"{out}: {len(table.curves)} curves, {configurations} configurations x seeds "
        f"{table.seeds()}, metric {table.metric} ({table.mode}); "
        f"{table.source['trials_left_out']} trials left out"
    )
