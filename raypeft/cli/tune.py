"""``raypeft tune``: check an experiment file (the preflight pipeline), run its search, and
print the summary: best trial, validation and test scores, repeats, Pareto front, where the
records are."""

from __future__ import annotations

import shlex
import sys
from pathlib import Path

import click

from raypeft.cli.options import (
    OVERRIDES,
    TRACKING_URI,
    experiment_files,
    fail,
    load_and_check,
    quiet_libraries,
)
from raypeft.config.redact import redact_uri
from raypeft.data.metrics import format_metric
from raypeft.errors import ConfigError
from raypeft.tracking.tags import result_tag
from raypeft.training.result_keys import RESTARTED_KEY


@click.command("tune")
@click.argument("file", required=False, type=click.Path(dir_okay=False, path_type=Path))
@click.option(
    "--space",
    "space_file",
    type=click.Path(dir_okay=False, path_type=Path),
    help="the experiment file, as the argument takes it (e.g. search_spaces/dept.yaml)",
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
def command(
    file: Path | None,
    space_file: Path | None,
    overrides: tuple[str, ...],
    address: str | None,
    tracking_uri: str | None,
    quiet: bool,
    resume: bool,
    progress_interval: float,
) -> None:
    """Run the hyperparameter search the experiment FILE (YAML) describes."""
    (space_file,) = experiment_files((file,) if file else (), space_file, most=1)
    quiet_libraries()
    given = overrides
    if tracking_uri:
        overrides = (*overrides, f"tracking.uri={tracking_uri}")
    cfg, checked = load_and_check(space_file, overrides, address)
    for note in checked.notes:
        click.echo(f"note: {note}", err=True)
    # why: Ray, MLflow and Optuna take seconds to import; --help and bad input answer sooner
    from raypeft.search.interrupts import SearchInterrupted, ignore_further_signals
    from raypeft.search.run import SearchFailed, run_experiment
    from raypeft.tracking.stores import TrackingLost

    try:
        summary = run_experiment(
            cfg,
            address=address,
            quiet=quiet,
            source=str(space_file),
            progress_interval=progress_interval,
            resume=resume,
        )
    except ConfigError as exc:  # e.g. --resume without a search to resume, a cluster too small
        fail(str(exc))
    except SearchFailed as exc:
        fail(str(exc), exit_code=1)
    except TrackingLost as exc:  # the parent run stays RUNNING, as after a SIGKILL
        fail(exc.line(_resume_command(space_file, given, address, tracking_uri)), exit_code=1)
    except SearchInterrupted as exc:
        resume_args = _resume_command(space_file, given, address, tracking_uri)
        click.echo(paused_line(exc, resume_args), err=True)
        ignore_further_signals()
        sys.exit(exc.exit_code)
    print_summary(summary)


def _resume_command(
    space_file: Path, overrides: tuple[str, ...], address: str | None, tracking_uri: str | None
) -> str:
    """The command that continues this search: the same file, overrides and stores, with
    the passwords of their URLs redacted (as everything raypeft prints)."""
    args = ["raypeft", "tune", "--space", str(space_file)]
    for item in overrides:
        args += ["--set", redact_uri(item)]
    if address:
        args += ["--address", address]
    if tracking_uri:
        args += ["--tracking-uri", redact_uri(tracking_uri)]
    return shlex.join([*args, "--resume"])


def paused_line(exc, resume_command: str) -> str:
    """One line for a search paused by a signal: what ended, what will continue, and how."""
    if not exc.recorded:
        start_again = resume_command.removesuffix(" --resume")
        return (
            f"Interrupted by {exc.signal_name} before the search started (nothing was "
            f"recorded); start it again with: {start_again}"
        )
    plural = "s" if exc.finished != 1 else ""
    ids = f" ({', '.join(exc.interrupted)})" if exc.interrupted else ""
    return (
        f"Paused by {exc.signal_name}: {exc.finished} trial{plural} ended, "
        f"{len(exc.interrupted)} interrupted{ids}; continue with: {resume_command}"
    )


def print_summary(s) -> None:
    """The search's outcome, as the last lines ``tune`` prints."""
    echo = click.echo
    echo("")
    echo(
        f"Search finished: {s.num_trials} trials ({s.num_pruned} stopped early, "
        f"{s.num_errors} failed) in {s.wall_s / 60:.1f} min"
    )
    if s.started_over:
        echo(
            f"  {len(s.started_over)} of them could not resume from the checkpoint Tune named "
            f"(damaged or incomplete) and went back to an intact one or started over "
            f"({', '.join(s.started_over)}; which and why: the tag "
            f"{result_tag(RESTARTED_KEY)} of their MLflow runs)"
        )
    if s.rerun:
        plural = "s" if len(s.rerun) != 1 else ""
        echo(
            f"  {len(s.rerun)} trial{plural} started after Ray Tune's last snapshot ran again "
            f"as new trial{plural} (their first runs: MLflow KILLED, Optuna FAIL, with the "
            f"reason): {'; '.join(s.rerun)}"
        )
    if s.unrecorded:
        echo(
            f"  warning: the Optuna study could not record how {len(s.unrecorded)} of them "
            "ended (its samplers and optuna-dashboard see them unfinished or wrong; MLflow "
            f"holds their results): {'; '.join(s.unrecorded)}"
        )
    if not s.constraints_met:
        echo("  warning: no trial met search.constraints; the best of all trials is shown")
    echo(f"Best trial {s.best_trial_id} (MLflow run {s.best_run_id}):")
    for key, value in sorted(s.best_params.items()):
        echo(f"  {key} = {value}")
    val = ", ".join(
        f"{k[len('val_') :]} {format_metric(v)}"
        for k, v in s.best_validation.items()
        if not k.endswith(("loss", "samples_per_s"))
    )
    echo(f"  validation: {val}")
    if s.repeats:
        echo(f"  repeated seeds (mean ± std of validation {s.metric}):")
        for group in s.repeats:
            mark = "*" if group.trial_id == s.best_trial_id else " "
            spread = f"{format_metric(group.mean)} ± {format_metric(group.std)}"
            echo(f"   {mark} {group.trial_id}: {spread} over seeds {sorted(group.scores)}")
    _print_test(s.test)
    if s.pareto:
        names = [o.name for o in s.objectives]
        echo(f"Pareto front ({' vs '.join(names)}), {len(s.pareto)} trials:")
        for point in s.pareto:
            values = ", ".join(f"{n} {point[n]:.4g}" for n in names)
            echo(f"  {point['trial_id']} ({point['method']}): {values}")
    for line in s.published.lines() if s.published else []:  # the model, the registry version
        echo(line)
    echo(
        f"MLflow: experiment {s.experiment!r} (id {s.experiment_id}), parent run {s.parent_run_id}"
    )
    echo(f"  store {redact_uri(s.tracking_uri)}; {_browse_hint(s)}")
    echo(f"Optuna study {s.optuna_study!r} in {redact_uri(s.optuna_storage)}")
    if s.seed_means_study:
        echo(
            f"  the repeated configurations' seed means: study {s.seed_means_study!r} (its "
            "best trial is the chosen configuration)"
        )
    echo(f"  browse with: optuna-dashboard {redact_uri(s.optuna_storage)}")
    echo(f"Ray results: {redact_uri(s.storage_path)}")


def _browse_hint(s) -> str:
    """How to open the search's runs: a tracking server already serves the UI (``raypeft
    ui`` refuses one), any other store needs ``raypeft ui``'s server."""
    from raypeft.tracking.experiment_view import search_runs_url  # why: imports MLflow

    uri = s.tracking_uri.rstrip("/")
    if uri.startswith(("http://", "https://")):
        # the model-training view: without the parameter MLflow 3.17 opens GenAI
        return f"open {search_runs_url(redact_uri(uri), s.experiment_id)} in a browser"
    return f"browse with: raypeft ui {s.experiment}"


def _print_test(test: dict[str, float]) -> None:
    """The best configuration's test scores (and their mean ± std over repeated seeds)."""
    line = ", ".join(
        f"{k[len('test_') :]} {format_metric(v)}"
        for k, v in test.items()
        if not k.endswith(("loss", "samples_per_s", "majority_class_accuracy"))
        and not k.endswith(("_mean", "_std", "_seeds"))
    )
    if "test_majority_class_accuracy" in test:
        majority = format_metric(test["test_majority_class_accuracy"])
        line += f" (majority-class accuracy {majority})"
    click.echo(f"  test:       {line or 'n/a'}")
    means = [k for k in test if k.endswith("_mean")]
    if means:
        over = ", ".join(
            f"{k[len('test_') : -len('_mean')]} {format_metric(test[k])} "
            f"± {format_metric(test[k[:-5] + '_std'])}"
            for k in means
        )
        click.echo(f"  test over its {int(test[means[0][:-5] + '_seeds'])} seeds: {over}")
