"""``raypeft budget``: each method's settings that fit one trainable-parameter budget."""

from __future__ import annotations

from pathlib import Path

import click
from tabulate import tabulate

from raypeft.cli.options import fail, quiet_libraries
from raypeft.config.loading import load_experiment
from raypeft.errors import ConfigError


@click.command("budget")
@click.option(
    "--prompt-length",
    "-l",
    type=click.IntRange(min=2),
    default=None,
    help="budget = the l·d parameters of PT with length l (default 100)",
)
@click.option(
    "--params",
    "-p",
    "budget_params",
    type=click.IntRange(min=1),
    default=None,
    help="budget as a trainable-parameter count (instead of -l)",
)
@click.option(
    "--max-length",
    "-s",
    type=click.IntRange(min=1),
    default=None,
    help="input length s (default: the experiment's, else 256)",
)
@click.option(
    "--hidden-size",
    "-d",
    type=click.IntRange(min=1),
    default=None,
    help="hidden size d (default: the model's, else 768 = T5-base)",
)
@click.option(
    "--layers", "-N", type=click.IntRange(min=1), default=None, help="layers N (default 12)"
)
@click.option("--vocab-size", "-V", type=click.IntRange(min=1), default=None, help="vocabulary V")
@click.option("--model", default=None, help="read the shapes from this model (id, path, alias)")
@click.option(
    "--space",
    "space_file",
    default=None,
    type=click.Path(dir_okay=False, path_type=Path),
    help="read the budget, the model and each method's settings from an experiment file",
)
@click.option(
    "--method",
    "-M",
    "methods",
    multiple=True,
    help="methods to list (default: every registered method)",
)
@click.option(
    "-m",
    "prompt_lengths",
    multiple=True,
    type=click.IntRange(min=1),
    help="prompt lengths m to list, for methods chosen by one (default: multiples of a tenth "
    "of PT's length)",
)
def command(
    prompt_length: int | None,
    budget_params: int | None,
    max_length: int | None,
    hidden_size: int | None,
    layers: int | None,
    vocab_size: int | None,
    model: str | None,
    space_file: Path | None,
    methods: tuple[str, ...],
    prompt_lengths: tuple[int, ...],
) -> None:
    """List each method's settings that fit one trainable-parameter budget, with the slack.

    Each registered method lists the settings of its size knob that fit (a prompt length, a
    rank derived from it, a generator or encoder width). Shapes default to T5-base (d=768,
    N=12, s=256).
    """
    from raypeft.reporting.budget_table import BudgetRequest, budget_rows  # why: transformers

    quiet_libraries()
    if prompt_length is not None and budget_params is not None:
        fail("give the budget as -l (a PT length) or --params (a count), not both")
    try:
        cfg = load_experiment(space_file) if space_file is not None else None
        request = BudgetRequest(
            prompt_length=prompt_length,
            params=budget_params,
            max_length=max_length,
            hidden_size=hidden_size,
            layers=layers,
            vocab_size=vocab_size,
            model=model,
            methods=list(methods),
            prompt_lengths=list(prompt_lengths),
        )
        header, rows = budget_rows(request, cfg)
    except (ConfigError, ValueError) as exc:
        fail(str(exc))
    click.echo(header)
    table = [
        [
            name,
            settings,
            "" if params is None else f"{params:,}",
            "" if slack is None else f"{slack:,}",
        ]
        for name, settings, params, slack in rows
    ]
    headers = ["method", "settings", "params", "slack"]
    click.echo(
        tabulate(table, headers, tablefmt="plain", colalign=("left", "left", "right", "right"))
    )
    if all(params is None for _, _, params, _ in rows):
        fail("no setting of any method fits the budget")


def _count(value: int | None) -> str:
    return "" if value is None else f"{value:,}"
