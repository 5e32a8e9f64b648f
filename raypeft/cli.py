"""``raypeft`` command line: tune, validate, budget.

Commands are thin: they parse, validate and call library functions. User errors print one
line on stderr and exit with code 2, before Ray, MLflow or any folder is touched.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import click

from raypeft.commands import TRACKING_URI
from raypeft.config import ConfigError, ExperimentConfig, load_experiment

EXIT_USER_ERROR = 2


def _fail(message: str) -> None:
    click.echo(f"error: {message}", err=True)
    sys.exit(EXIT_USER_ERROR)


def _quiet_libraries() -> None:
    # Progress bars from datasets/transformers would drown the trial table.
    os.environ.setdefault("HF_DATASETS_DISABLE_PROGRESS_BARS", "1")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def _check_resolvable(cfg: ExperimentConfig, source: str) -> None:
    """Checks beyond the schema, all prefixed with the file's name."""
    try:
        _check_task_and_model(cfg, source)
    except ConfigError as exc:
        text = str(exc)
        raise ConfigError(text if text.startswith(f"{source}: ") else f"{source}: {text}") from None


def _check_task_and_model(cfg: ExperimentConfig, source: str) -> None:
    """The task and model exist, the metric is the task's, every DePT rank is >= 1."""
    import itertools

    from raypeft.backbones import backbone_dims, load_config
    from raypeft.config import ChoiceParam, GridParam, apply_trial_params
    from raypeft.data.tasks import resolve_task_spec

    spec = resolve_task_spec(cfg.task)
    for split, path in (cfg.task.files or {}).items():
        if not Path(path).is_file():
            raise ConfigError(f"task.files.{split}: {path}: file not found")
    if cfg.task.data_dir is not None and not Path(cfg.task.data_dir).is_dir():
        raise ConfigError(f"task.data_dir: {cfg.task.data_dir}: no such folder")
    from raypeft.searcher import resolve_constraints, resolve_objectives

    resolve_objectives(cfg, spec.metrics)  # search.metric / objectives / constraints name
    resolve_constraints(cfg, spec.metrics)  # metrics this task reports
    config = load_config(cfg.model, spec.num_labels or 2, spec.problem)
    dims = backbone_dims(config, cfg.model.max_length, cfg.model.name)
    discrete = {
        k: (p.grid if isinstance(p, GridParam) else p.choice)
        for k, p in cfg.space.items()
        if isinstance(p, (GridParam, ChoiceParam))
    }
    for combo in itertools.product(*discrete.values()) if discrete else [()]:
        params = dict(zip(discrete, combo, strict=True))
        try:
            apply_trial_params(cfg, params).method.resolve(dims).check_backbone(dims)
        except ValueError as exc:
            where = " ".join(f"{k}={v}" for k, v in params.items()) or "method"
            raise ConfigError(f"{source}: {where}: {exc}") from None


# Shared by every command that reads an experiment file.
OVERRIDES = click.option(
    "--set",
    "overrides",
    multiple=True,
    metavar="KEY=VALUE",
    help="override a key of the file, e.g. --set search.num_samples=4 (repeatable)",
)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="raypeft")
def main() -> None:
    """Distributed hyperparameter search for prompt-based PEFT (Ray Tune + Optuna + MLflow)."""


@main.command()
@click.option(
    "--space",
    "space_file",
    required=True,
    type=click.Path(dir_okay=False, path_type=Path),
    help="experiment file (YAML), e.g. search_spaces/dept.yaml",
)
@OVERRIDES
@click.option("--address", default=None, help="Ray cluster address (default: start a local Ray)")
@TRACKING_URI
@click.option("--quiet", is_flag=True, help="print only the final summary (for scripts)")
@click.option(
    "--progress-interval",
    type=click.FloatRange(min=1),
    default=30.0,
    show_default=True,
    help="seconds between two trial tables while the search runs",
)
def tune(
    space_file: Path,
    overrides: tuple[str, ...],
    address: str | None,
    tracking_uri: str | None,
    quiet: bool,
    progress_interval: float,
) -> None:
    """Run the hyperparameter search an experiment file describes."""
    _quiet_libraries()
    if tracking_uri:
        overrides = (*overrides, f"tracking.uri={tracking_uri}")
    try:
        cfg = load_experiment(space_file, list(overrides))
        _check_resolvable(cfg, str(space_file))
    except ConfigError as exc:
        _fail(str(exc))
    from raypeft.tune import SearchFailed, run_experiment

    try:
        summary = run_experiment(
            cfg,
            address=address,
            quiet=quiet,
            source=str(space_file),
            progress_interval=progress_interval,
        )
    except ConfigError as exc:  # e.g. a task's data turned out unusable
        _fail(str(exc))
    except SearchFailed as exc:
        click.echo(f"error: {exc}", err=True)
        sys.exit(1)
    _print_summary(summary)


def _print_summary(s) -> None:
    echo = click.echo
    echo("")
    echo(
        f"Search finished: {s.num_trials} trials ({s.num_pruned} stopped early, "
        f"{s.num_errors} failed) in {s.wall_s / 60:.1f} min"
    )
    if not s.constraints_met:
        echo("  warning: no trial met search.constraints; the best of all trials is shown")
    echo(f"Best trial {s.best_trial_id} (MLflow run {s.best_run_id}):")
    for key, value in sorted(s.best_params.items()):
        echo(f"  {key} = {value}")
    val = ", ".join(
        f"{k[len('val_') :]} {v:.4f}"
        for k, v in s.best_validation.items()
        if not k.endswith(("loss", "samples_per_s"))
    )
    echo(f"  validation: {val}")
    if s.repeats:
        echo(f"  repeated seeds (mean ± std of validation {s.metric}):")
        for group in s.repeats:
            mark = "*" if group.trial_id == s.best_trial_id else " "
            echo(
                f"   {mark} {group.trial_id}: {group.mean:.4f} ± {group.std:.4f} "
                f"over seeds {sorted(group.scores)}"
            )
    test = ", ".join(
        f"{k[len('test_') :]} {v:.4f}"
        for k, v in s.test.items()
        if not k.endswith(("loss", "samples_per_s", "majority_class_accuracy"))
        and not k.endswith(("_mean", "_std", "_seeds"))
    )
    if "test_majority_class_accuracy" in s.test:
        test += f" (majority-class accuracy {s.test['test_majority_class_accuracy']:.4f})"
    echo(f"  test:       {test or 'n/a'}")
    means = [k for k in s.test if k.endswith("_mean")]
    if means:
        over = ", ".join(
            f"{k[len('test_') : -len('_mean')]} {s.test[k]:.4f} ± {s.test[k[:-5] + '_std']:.4f}"
            for k in means
        )
        echo(f"  test over its {int(s.test[means[0][:-5] + '_seeds'])} seeds: {over}")
    if s.pareto:
        names = [o.name for o in s.objectives]
        echo(f"Pareto front ({' vs '.join(names)}), {len(s.pareto)} trials:")
        for point in s.pareto:
            values = ", ".join(f"{n} {point[n]:.4g}" for n in names)
            echo(f"  {point['trial_id']} ({point['method']}): {values}")
    echo(
        f"MLflow: experiment {s.experiment!r} (id {s.experiment_id}), parent run {s.parent_run_id}"
    )
    echo(f"  store {s.tracking_uri}; browse with: raypeft ui {s.experiment}")
    echo(f"Optuna study {s.optuna_study!r} in {s.optuna_storage}")
    echo(f"  browse with: optuna-dashboard {s.optuna_storage}")
    echo(f"Ray results: {s.storage_path}")


@main.command()
@click.option(
    "--out",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="write the schema to this file (default: print it)",
)
def schema(out: Path | None) -> None:
    """JSON schema of experiment files, for editor completion of the YAML.

    Shipped as schema/experiment.schema.json; point an editor at it with a first line
    `# yaml-language-server: $schema=../schema/experiment.schema.json`.
    """
    import json

    from raypeft.config import experiment_json_schema

    text = json.dumps(experiment_json_schema(), indent=2) + "\n"
    if out is None:
        click.echo(text, nl=False)
    else:
        out.write_text(text)
        click.echo(f"wrote {out}")


@main.command()
@click.argument("file", required=False, type=click.Path(dir_okay=False, path_type=Path))
@click.option(
    "--space",
    "space_file",
    type=click.Path(dir_okay=False, path_type=Path),
    help="the experiment file (as for tune; or give it as the argument)",
)
@OVERRIDES
def validate(file: Path | None, space_file: Path | None, overrides: tuple[str, ...]) -> None:
    """Check an experiment file without running anything."""
    if (file is None) == (space_file is None):
        _fail("name one experiment file: raypeft validate FILE (or --space FILE)")
    file = file or space_file
    _quiet_libraries()
    try:
        cfg = load_experiment(file, list(overrides))
        _check_resolvable(cfg, str(file))
    except ConfigError as exc:
        _fail(str(exc))
    grid = cfg.grid_points()
    click.echo(
        f"{file}: ok ({cfg.method.name} on {cfg.model.name}, task {cfg.task.name}, "
        f"{cfg.search.num_samples} trials, {len(cfg.space)} searched keys"
        + (f", joint grid of {len(grid)} points" if grid else "")
        + ")"
    )


@main.command()
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
    help="DePT prompt lengths m to list (default: multiples of a tenth of PT's length)",
)
def budget(
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

    DePT: m and its derived r; PT and deep prompts: t; IDPG: the generator width; IPT: the
    prompt length or encoder width. Shapes default to T5-base (d=768, N=12, s=256).
    """
    from raypeft.budget_report import BudgetRequest, budget_rows

    _quiet_libraries()
    if prompt_length is not None and budget_params is not None:
        _fail("give the budget as -l (a PT length) or --params (a count), not both")
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
            dept_prompt_lengths=list(prompt_lengths),
        )
        header, rows = budget_rows(request, cfg)
    except (ConfigError, ValueError) as exc:
        _fail(str(exc))
    click.echo(header)
    width = max([len(r[1]) for r in rows] + [8])
    click.echo(f"{'method':<8} {'settings':<{width}} {'params':>12} {'slack':>10}")
    for name, settings, params, slack in rows:
        if params is None:
            click.echo(f"{name:<8} {settings:<{width}}")
        else:
            click.echo(f"{name:<8} {settings:<{width}} {params:>12,} {slack:>10,}")
    if all(params is None for _, _, params, _ in rows):
        _fail("no setting of any method fits the budget")


# Commands reading finished searches back from MLflow (raypeft/commands/).
from raypeft.commands import predict as _predict  # noqa: E402
from raypeft.commands import report as _report  # noqa: E402
from raypeft.commands import ui as _ui  # noqa: E402

main.add_command(_report.command)
main.add_command(_ui.command)
main.add_command(_predict.predict_command)
main.add_command(_predict.export_command)
