"""``raypeft``: the click group every command registers with (the console script's entry point).

Commands are thin: they parse, call library functions and print. One module per command
(:mod:`.tune`, :mod:`.validate`, :mod:`.schema`, :mod:`.budget`, :mod:`.report`, :mod:`.ui`,
:mod:`.predict`, :mod:`.serve`, :mod:`.export`, ...); what they share is in :mod:`.options`.
User errors print one line on stderr and exit with code 2, before Ray, MLflow or any folder
is touched.
"""

from __future__ import annotations

import atexit
import gc
import sys

import click

from raypeft.cli import (
    budget,
    export,
    predict,
    report,
    schema,
    serve,
    simulate,
    table,
    tune,
    ui,
    validate,
)
from raypeft.cli.options import EXIT_USER_ERROR, error_line
from raypeft.config.secrets_file import load_secrets_file
from raypeft.errors import ConfigError


class OneLineErrors(click.Group):
    """Click's own usage errors (an unknown option, a missing ``--space``, a folder given as
    the file) as one ``error:`` line with exit code 2, like every other user error, instead of
    a usage block."""

    def main(self, *args, standalone_mode: bool = True, **kwargs):
        try:
            rv = super().main(*args, standalone_mode=False, **kwargs)
        except click.exceptions.NoArgsIsHelpError as exc:  # plain `raypeft`: its help
            click.echo(exc.ctx.get_help())
            sys.exit(0)
        except click.UsageError as exc:
            where = exc.ctx.command_path if exc.ctx else "raypeft"
            message = " ".join(exc.format_message().split())
            click.echo(error_line(f"{message} (see '{where} --help')"), err=True)
            sys.exit(EXIT_USER_ERROR)
        except click.ClickException as exc:
            click.echo(error_line(" ".join(exc.format_message().split())), err=True)
            sys.exit(exc.exit_code)
        except click.Abort:  # Ctrl-C outside a search (a search pauses and says so itself)
            click.echo("Interrupted.", err=True)
            sys.exit(130)
        if not standalone_mode:
            return rv
        sys.exit(rv if isinstance(rv, int) else 0)  # --help and --version return 0


@click.group(cls=OneLineErrors, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="raypeft")
def main() -> None:
    """Distributed hyperparameter search for prompt-based PEFT (Ray Tune + Optuna + MLflow)."""
    try:  # a cluster head's database URIs (cluster/node.sh): this process's alone
        load_secrets_file()
    except ConfigError as exc:
        click.echo(error_line(str(exc)), err=True)
        sys.exit(EXIT_USER_ERROR)


for _module in (
    tune, validate, schema, budget, report, ui, predict, serve, export, table, simulate
):  # fmt: skip
    main.add_command(_module.command)


def run() -> None:
    """The ``raypeft`` console script: :func:`main` in a process that ends promptly.

    A search leaves millions of objects (torch, transformers, Ray, MLflow) to the
    interpreter's last garbage collection, which took ~2 s of CPU after every command had
    printed its last line. :func:`gc.freeze` at exit skips that collection. It is registered
    before the command runs, so what the command registers (Ray's shutdown, MLflow's end of
    run) runs before it; the memory goes back to the operating system as before.
    """
    atexit.register(gc.freeze)
    main()
