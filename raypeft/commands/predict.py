"""Placeholder: being written."""

import click


@click.command("predict")
def predict_command() -> None:
    """(being written)"""
    raise click.ClickException("not written yet")


@click.command("export")
def export_command() -> None:
    """(being written)"""
    raise click.ClickException("not written yet")
