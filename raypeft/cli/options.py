"""Commands that read a finished search back from MLflow: report, ui, predict, export.

Each module defines click command(s) that ``raypeft.cli.main`` registers; heavy imports stay inside
the functions so ``raypeft --help`` stays fast.
"""

import click

# Every command that reads or writes a tracking store takes the same option.
TRACKING_URI = click.option(
    "--tracking-uri",
    default=None,
    help="MLflow tracking URI (default: $MLFLOW_TRACKING_URI, else sqlite:///mlflow.db)",
)
