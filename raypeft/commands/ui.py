"""Placeholder: being written."""

import click


@click.command("ui")
def command() -> None:
    """(being written)"""
    raise click.ClickException("not written yet")
