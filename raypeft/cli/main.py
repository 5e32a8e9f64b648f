"""``raypeft`` command line: tune, validate, budget.

Commands are thin: they parse, validate and call library functions. User errors print one
line on stderr and exit with code 2, before Ray, MLflow or any folder is touched.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import click

from raypeft.cli.options import TRACKING_URI
from raypeft.config.schema import ExperimentConfig, load_experiment
from raypeft.errors import ConfigError

EXIT_USER_ERROR = 2


def _fail(message: str) -> None:
    click.echo(f"error: {message}", err=True)
    sys.exit(EXIT_USER_ERROR)


def _quiet_libraries() -> None:
    # Progress bars from datasets/transformers would drown the trial table.
    os.environ.setdefault("HF_DATASETS_DISABLE_PROGRESS_BARS", "1")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
    # with a tracking server MLflow prints two "View run" links per run closed (--quiet too)
    os.environ.setdefault("MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT", "true")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def _check_resolvable(cfg: ExperimentConfig, source: str, *, address: str | None = None) -> None:
    """Checks beyond the schema, all prefixed with the file's name.

    The task's files, the model, the metrics, every method setting the space can produce,
    the stores, and (without ``address``: the local Ray ``raypeft tune`` starts) that one
    trial's resources fit this machine. A cluster (``address``) is checked once connected.
    """
    try:
        _check_task_and_model(cfg, source)
        from raypeft.preflight import check_stores

        check_stores(cfg)
        if address is None:
            from raypeft.search.resources import check_fits, local_nodes

            check_fits(cfg, local_nodes())
    except ConfigError as exc:
        text = str(exc)
        raise ConfigError(text if text.startswith(f"{source}: ") else f"{source}: {text}") from None


def _check_task_and_model(cfg: ExperimentConfig, source: str) -> None:
    """The task and model exist, the metric is the task's, and every method setting the
    space can produce resolves on the backbone (DePT's rank >= 1, PHM sizes, ...)."""
    import itertools
    import math

    from pydantic import ValidationError

    from raypeft.config.messages import format_validation_error
    from raypeft.config.schema import apply_trial_params, space_candidates
    from raypeft.data.tasks import check_task_files, resolve_task_spec
    from raypeft.methods.ipt.corpora import check_corpus
    from raypeft.modeling.backbones import backbone_dims, load_config
    from raypeft.preflight import check_model_name

    spec = resolve_task_spec(cfg.task)
    check_task_files(cfg.task)  # exist, readable, not empty, columns in the header
    from raypeft.search.searcher import resolve_constraints, resolve_objectives

    resolve_objectives(cfg, spec.metrics)  # search.metric / objectives / constraints name
    resolve_constraints(cfg, spec.metrics)  # metrics this task reports
    check_model_name(cfg.model)  # a missing folder or uncached id fails here, not on the Hub
    config = load_config(cfg.model, spec.num_labels or 2, spec.problem)
    dims = backbone_dims(config, cfg.model.max_length, cfg.model.name)
    candidates = space_candidates(cfg)
    combos = math.prod(len(v) for v in candidates.values())
    if combos <= 2000:  # every combination of the searched keys' values
        trials = [
            dict(zip(candidates, combo, strict=True))
            for combo in itertools.product(*candidates.values())
        ]
    else:  # too many: each key's values with the file's others
        trials = [{k: v} for k, values in candidates.items() for v in values]
    checked: set[str] = set()
    for params in trials or [{}]:
        where = " ".join(f"{k}={v}" for k, v in params.items()) or "method"
        try:
            method = apply_trial_params(cfg, params).method
        except ValidationError as err:  # values that are valid alone but not together
            raise ConfigError(f"{format_validation_error(err, source)} [from {where}]") from None
        try:
            key = method.model_dump_json()
            if key in checked:
                continue
            checked.add(key)
            resolved = method.resolve(dims)
            resolved.check_backbone(dims)
            _check_positions(resolved, config, cfg.model)
            if hasattr(method, "corpus") and getattr(method, "strategy", None) != "random":
                check_corpus(method.corpus)  # IPT's pretraining corpus (built before trials)
        except ValueError as exc:
            raise ConfigError(f"{source}: {where}: {exc}") from None


# Model types whose position embeddings are a table of max_position_embeddings rows.
_ABSOLUTE_POSITIONS = {
    "albert",
    "bert",
    "camembert",
    "distilbert",
    "electra",
    "ernie",
    "gpt2",
    "opt",
    "roberta",
    "xlm-roberta",
}


def _check_positions(method, config, model) -> None:
    """Prompt tokens prepended to an input of ``max_length`` tokens must fit the backbone's
    absolute position embeddings (BERT-, RoBERTa-, GPT-2-style); otherwise every trial would
    fail in its first step. (kv deep prompts add keys only, no positions.)"""
    limit = getattr(config, "max_position_embeddings", None) or getattr(config, "n_positions", None)
    kind = getattr(config, "position_embedding_type", None)  # BERT-family configs may say
    absolute = kind == "absolute" or (kind is None and config.model_type in _ABSOLUTE_POSITIONS)
    if not limit or not absolute:
        return
    tokens = 0 if getattr(method, "style", None) == "kv" else getattr(method, "prompt_length", 0)
    if model.max_length + tokens > limit:
        raise ValueError(
            f"`model.max_length + prompt_length <= {limit}` must hold ({model.name} has {limit} "
            f"positions), but got {model.max_length} + {tokens} = {model.max_length + tokens}"
        )


# Shared by every command that reads an experiment file.
OVERRIDES = click.option(
    "--set",
    "overrides",
    multiple=True,
    metavar="KEY=VALUE",
    help="override a key of the file, e.g. --set search.num_samples=4 (repeatable)",
)


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
            click.echo(f"error: {message} (see '{where} --help')", err=True)
            sys.exit(EXIT_USER_ERROR)
        except click.ClickException as exc:
            click.echo(f"error: {' '.join(exc.format_message().split())}", err=True)
            sys.exit(exc.exit_code)
        except click.Abort:
            click.echo("Aborted!", err=True)
            sys.exit(1)
        if not standalone_mode:
            return rv
        sys.exit(rv if isinstance(rv, int) else 0)  # --help and --version return 0


@click.group(cls=OneLineErrors, context_settings={"help_option_names": ["-h", "--help"]})
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
    "--resume",
    is_flag=True,
    help="continue the experiment's interrupted search (its driver died): finished trials "
    "are kept, unfinished ones continue from their checkpoints, in the same MLflow runs",
)
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
    resume: bool,
    progress_interval: float,
) -> None:
    """Run the hyperparameter search an experiment file describes."""
    _quiet_libraries()
    if tracking_uri:
        overrides = (*overrides, f"tracking.uri={tracking_uri}")
    try:
        cfg = load_experiment(space_file, list(overrides))
        _check_resolvable(cfg, str(space_file), address=address)
    except ConfigError as exc:
        _fail(str(exc))
    from raypeft.search.run import SearchFailed, run_experiment

    try:
        summary = run_experiment(
            cfg,
            address=address,
            quiet=quiet,
            source=str(space_file),
            progress_interval=progress_interval,
            resume=resume,
        )
    except ConfigError as exc:  # e.g. a task's data turned out unusable
        _fail(str(exc))
    except SearchFailed as exc:
        click.echo(f"error: {exc}", err=True)
        sys.exit(1)
    _print_summary(summary)


def _print_summary(s) -> None:
    from raypeft.config.redact import redact_uri

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
    for line in s.published.lines() if s.published else []:  # issue 16: model, registry
        echo(line)
    echo(
        f"MLflow: experiment {s.experiment!r} (id {s.experiment_id}), parent run {s.parent_run_id}"
    )
    echo(f"  store {redact_uri(s.tracking_uri)}; browse with: raypeft ui {s.experiment}")
    echo(f"Optuna study {s.optuna_study!r} in {redact_uri(s.optuna_storage)}")
    echo(f"  browse with: optuna-dashboard {redact_uri(s.optuna_storage)}")
    echo(f"Ray results: {redact_uri(s.storage_path)}")


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

    from raypeft.config.schema import experiment_json_schema

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
@click.option(
    "--address",
    default=None,
    help="the Ray cluster the file is for, as tune takes it: the resources are then not "
    "checked against this machine (default: they must fit it, as a local tune needs)",
)
def validate(
    file: Path | None, space_file: Path | None, overrides: tuple[str, ...], address: str | None
) -> None:
    """Check an experiment file without running anything."""
    if (file is None) == (space_file is None):
        _fail("name one experiment file: raypeft validate FILE (or --space FILE)")
    file = file or space_file
    _quiet_libraries()
    try:
        cfg = load_experiment(file, list(overrides))
        _check_resolvable(cfg, str(file), address=address)
    except ConfigError as exc:
        _fail(str(exc))
    grid = cfg.grid_points()
    click.echo(
        f"{file}: ok ({cfg.method.name} on {cfg.model.name}, task {cfg.task.name}, "
        f"{cfg.search.num_samples} trials, {len(cfg.space)} searched keys"
        + (f", joint grid of {len(grid)} points" if grid else "")
        + (f"; resources not checked: cluster {address}" if address else "")
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
    from raypeft.reporting.budget_table import BudgetRequest, budget_rows

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
from raypeft.cli import predict as _predict  # noqa: E402
from raypeft.cli import report as _report  # noqa: E402
from raypeft.cli import ui as _ui  # noqa: E402

main.add_command(_report.command)
main.add_command(_ui.command)
main.add_command(_predict.predict_command)
main.add_command(_predict.export_command)
