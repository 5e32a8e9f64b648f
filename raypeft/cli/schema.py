"""``raypeft schema``: the JSON schema of experiment files, for editor completion."""

from __future__ import annotations

import json
from pathlib import Path

import click

from raypeft.config.schema import experiment_json_schema


@click.command("schema")
@click.option(
    "--out",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="write the schema to this file (default: print it)",
)
def command(out: Path | None) -> None:
    """JSON schema of experiment files, for editor completion of the YAML.

    Shipped as schema/experiment.schema.json; point an editor at it with a first line
    `# yaml-language-server: $schema=../schema/experiment.schema.json`.
    """
    text = json.dumps(experiment_json_schema(), indent=2) + "\n"
    if out is None:
        click.echo(text, nl=False)
    else:
        out.write_text(text)
        click.echo(f"wrote {out}")
