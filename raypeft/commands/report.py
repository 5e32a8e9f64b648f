"""Placeholder: being written."""

import click


@click.command("report")
def command() -> None:
    """(being written)"""
    raise click.ClickException("not written yet")
