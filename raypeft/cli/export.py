"""``raypeft export``: write a trained trial as a Hugging Face peft adapter, then check that
peft loads it and reproduces the trained model.

The trained artefacts come from MLflow only, as for ``raypeft predict``. Heavy imports (torch,
transformers, mlflow, peft) stay inside the function.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import click

from raypeft.cli.options import (
    download_trained,
    fail,
    first_line,
    one_source,
    quiet_libraries,
    run_options,
)
from raypeft.errors import ConfigError


@click.command("export")
@run_options
@click.option(
    "--format",
    "export_format",
    type=click.Choice(["peft"]),
    required=True,
    help="peft: a Hugging Face peft adapter, for the methods peft has an exact equivalent of "
    "(an error names them)",
)
@click.option(
    "--out",
    required=True,
    type=click.Path(file_okay=False, path_type=Path),
    help="folder to write (must be absent or empty unless --force)",
)
@click.option("--force", is_flag=True, help="replace a non-empty --out folder")
def command(
    run_id: str | None,
    experiment: str | None,
    model_uri: str | None,
    tracking_uri: str | None,
    export_format: str,
    out: Path,
    force: bool,
) -> None:
    """Export a trained trial as a peft adapter, then check that peft loads it and
    reproduces the trained model (prompt, head and logits)."""
    quiet_libraries()
    one_source(run_id, experiment, model_uri)
    from raypeft.serving.export import (  # why: torch, transformers, peft
        ExportVerificationError,
        check_out_dir,
        export_peft,
        require_peft,
    )

    try:
        require_peft()
        check_out_dir(out, force)
    except ConfigError as exc:
        fail(str(exc))
    with tempfile.TemporaryDirectory(prefix="raypeft-export-") as tmp:
        try:
            folder, used_run = download_trained(
                run_id, experiment, tracking_uri, Path(tmp), model_uri
            )
            result = export_peft(folder, out, force=force)
        except ConfigError as exc:
            fail(str(exc))
        except (ValueError, OSError) as exc:  # e.g. a base model that cannot be loaded
            fail(f"cannot export the trained model: {first_line(exc)}")
        except ExportVerificationError as exc:
            click.echo(f"error: peft does not reproduce the trained model: {exc}", err=True)
            click.echo("nothing was written", err=True)
            sys.exit(1)
    click.echo(
        f"Exported run {used_run} as a peft {result.peft_type} adapter "
        f"(task_type {result.task_type}) to {result.out}:"
    )
    width = max(len(name) for name in result.files)
    for name, what in result.files.items():
        click.echo(f"  {name:<{width}}  {what}")
    click.echo("Verified:")
    for line in result.checks:
        click.echo(f"  {line}")
