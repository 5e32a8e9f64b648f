"""Record a learning-curve table in chunks, on machines that keep nothing between sessions.

A table is a whole grid, every configuration at every seed (benchmarks/tables/*.yaml): 144
trials of DePT on MR take about four hours on 2 CPU cores, longer than a session here, and
the MLflow store and Optuna study of an unfinished recording do not outlive the session. What
does outlive it is the table ``raypeft table`` exports of the trials that ran to their end.
This module continues a recording from such partial tables, with raypeft's own search:

    python -m benchmarks.search.table_chunks rest benchmarks/results/table_dept_mr_partial.json \\
        --tracking-uri sqlite:////tmp/rec/mlflow.db --out /tmp/rec/rest.yaml
    raypeft tune /tmp/rec/rest.yaml --tracking-uri sqlite:////tmp/rec/mlflow.db
    raypeft table dept-grid-mr --tracking-uri sqlite:////tmp/rec/mlflow.db --out /tmp/rec/b.json
    python -m benchmarks.search.table_chunks merge benchmarks/results/table_dept_mr_partial.json \\
        /tmp/rec/b.json --out benchmarks/results/table_dept_mr.json

``rest`` adds each recorded (configuration, seed) to the recording's Optuna study as a finished
trial (Optuna's public ``create_trial``/``add_trial``), and writes the experiment the tables
ran with its seeds as a grid key (``train.seed: {grid: ...}``) and a random sampler: raypeft
enqueues every point of a joint grid that no finished trial of the study ran
(:func:`raypeft.search.study.remaining_grid_points`), so the search trains exactly the missing
(configuration, seed) pairs, each once. ``merge`` joins the tables, refusing tables of
different experiments and a (configuration, seed) recorded twice (``--keep-first`` keeps the
first chunk's draw instead: a resumed chunk's sampler can draw a recorded pair once the
missing ones are done).
"""

from __future__ import annotations

import argparse
import itertools
import sys
from pathlib import Path
from typing import Any

import optuna
import yaml

from raypeft.config.schema import ExperimentConfig
from raypeft.config.space import SEED_KEY, configuration_key
from raypeft.errors import ConfigError
from raypeft.search.simulate.table import CurveTable
from raypeft.search.study import CONFIGURATION_ATTR, directions, open_storage, study_location

RECORDED_IN_ATTR = "raypeft.recorded_in"  # the partial table an added trial comes from
# What may differ between chunks of one recording: where and how each chunk's search ran.
PER_CHUNK = ("search", "space", "tracking", "run")


def grid_of(cfg: ExperimentConfig) -> dict[str, list[Any]]:
    """The recording's joint grid, the seeds as one of its keys (last)."""
    grid = {k: list(v.listed()) for k, v in cfg.space.items() if k != SEED_KEY}
    grid[SEED_KEY] = list(cfg.search.seeds or cfg.space[SEED_KEY].listed())
    return grid


def recorded_points(tables: list[CurveTable]) -> list[dict[str, Any]]:
    """Every (configuration, seed) the tables hold, as the search's params."""
    return [{**c.params, SEED_KEY: c.seed} for t in tables for c in t.curves]


def missing_points(grid: dict[str, list[Any]], done: list[dict[str, Any]]) -> list[dict]:
    """The grid's points no table holds, in grid order."""
    points = [dict(zip(grid, combo, strict=True)) for combo in itertools.product(*grid.values())]
    return [p for p in points if p not in done]


def check_same_recording(tables: list[CurveTable], paths: list[Path]) -> None:
    """Chunks of one recording ran one experiment (apart from how each search ran)."""

    def what(table: CurveTable) -> dict[str, Any]:
        # through today's schema: a section added since a chunk was recorded (with its
        # defaults) is no difference between chunks
        experiment = table.config.model_dump(mode="json")
        return {k: v for k, v in experiment.items() if k not in PER_CHUNK}

    first = what(tables[0])
    for table, path in zip(tables[1:], paths[1:], strict=True):
        this = what(table)
        if this != first:
            differ = sorted(k for k in this if this[k] != first.get(k))
            raise ConfigError(f"{path}: not the recording {paths[0]} is ({', '.join(differ)})")
        if (table.metric, table.mode, table.dims) != (
            tables[0].metric,
            tables[0].mode,
            tables[0].dims,
        ):
            raise ConfigError(f"{path}: another metric or backbone than {paths[0]}")


def add_recorded_trials(
    storage_url: str, study_name: str, tables: list[CurveTable], paths: list[Path]
) -> int:
    """Each recorded (configuration, seed) as a finished trial of the study; returns how many
    were added (points the study already holds are not added twice)."""
    cfg = tables[0].config
    grid = grid_of(cfg)
    distributions = {k: optuna.distributions.CategoricalDistribution(v) for k, v in grid.items()}
    study = optuna.create_study(
        storage=open_storage(storage_url),
        study_name=study_name,
        directions=directions([tables[0].mode]),
        load_if_exists=True,
    )
    held = [t.params for t in study.get_trials(deepcopy=False) if t.state.is_finished()]
    added = 0
    for table, path in zip(tables, paths, strict=True):
        for curve in table.curves:
            params = {**curve.params, SEED_KEY: curve.seed}
            if params in held:
                continue
            values = curve.values[f"val_{table.metric}"]
            study.add_trial(
                optuna.trial.create_trial(
                    params=params,
                    distributions=distributions,
                    value=max(values) if table.mode == "max" else min(values),
                    user_attrs={
                        CONFIGURATION_ATTR: configuration_key(curve.params),
                        RECORDED_IN_ATTR: str(path),
                    },
                )
            )
            held.append(params)
            added += 1
    return added


def rest_experiment(cfg: ExperimentConfig, missing: int) -> dict[str, Any]:
    """The recording's experiment, running its ``missing`` grid points: seeds as a grid key,
    because ``search.seeds`` needs Optuna's grid sampler, which would run the whole grid."""
    data = cfg.model_dump(mode="json", exclude_none=True)
    grid = grid_of(cfg)
    data["space"] = {
        **{k: v for k, v in data["space"].items() if k != SEED_KEY},
        SEED_KEY: {"grid": grid[SEED_KEY]},
    }
    data["search"].pop("seeds", None)
    data["search"].update(sampler="random", num_samples=missing)
    # where the first chunk kept its records: this chunk's come from its command line
    data["tracking"].pop("uri", None)
    data["run"].pop("storage_path", None)
    return data


def rest(paths: list[Path], tracking_uri: str, out: Path) -> None:
    tables = [CurveTable.load(p) for p in paths]
    check_same_recording(tables, paths)
    cfg = tables[0].config
    recorded = recorded_points(tables)
    missing = missing_points(grid_of(cfg), recorded)
    if not missing:
        print("every grid point is recorded: nothing left to run")
        return
    storage, study_name = study_location(cfg, tracking_uri)
    added = add_recorded_trials(storage, study_name, tables, paths)
    out.write_text(yaml.safe_dump(rest_experiment(cfg, len(missing)), sort_keys=False))
    print(
        f"{len(recorded_points(tables))} of {len(missing) + len(recorded_points(tables))} "
        f"grid points recorded ({added} added to study {study_name!r} at {storage}); "
        f"{len(missing)} left: raypeft tune {out} --tracking-uri {tracking_uri}"
    )


def merged_experiment(first: CurveTable, curves: list) -> dict[str, Any]:
    """The first chunk's experiment, its search saying what the joined table holds: a search
    over explicit seeds names every seed the curves hold, and as many samples as curves (chunks
    recorded over other seeds, MR's 3 then 2 more, are one 5-seed recording)."""
    experiment = dict(first.experiment)
    search = dict(experiment.get("search") or {})
    if search.get("seeds"):
        seeds = sorted({c.seed for c in curves})
        experiment["search"] = {**search, "seeds": seeds, "num_samples": len(curves)}
        # the schema writes search.seeds into the space as the seed's grid: both must agree
        experiment["space"] = {**experiment.get("space", {}), SEED_KEY: {"grid": seeds}}
    return experiment


def merge(paths: list[Path], out: Path, keep_first: bool = False) -> None:
    """Join the chunks' tables into ``out``. A (configuration, seed) in more than one chunk is
    refused, or with ``keep_first`` kept from the first chunk that holds it: a resumed
    search's sampler may draw a pair an earlier chunk recorded once the missing ones are done,
    and a table holds one draw per pair."""
    tables = [CurveTable.load(p) for p in paths]
    check_same_recording(tables, paths)
    seen: set[tuple[str, int]] = set()
    kept: list[list] = []
    for table, path in zip(tables, paths, strict=True):
        kept.append([])
        for curve in table.curves:
            if (curve.configuration, curve.seed) not in seen:
                seen.add((curve.configuration, curve.seed))
                kept[-1].append(curve)
            elif not keep_first:
                raise ConfigError(
                    f"{path}: {curve.configuration} at seed {curve.seed} is in an earlier table "
                    "too (--keep-first keeps the earlier one)"
                )
    first = tables[0]
    curves = [c for chunk in kept for c in chunk]
    merged = CurveTable(
        experiment=merged_experiment(first, curves),
        metric=first.metric,
        mode=first.mode,
        dims=first.dims,
        curves=curves,
        source={
            **first.source,
            "concurrency": max(t.concurrency() for t in tables),
            "chunks": [
                {
                    **t.source,
                    "table": str(p),
                    "trials": len(chunk),
                    "left_out_as_repeats": len(t.curves) - len(chunk),
                }
                for t, p, chunk in zip(tables, paths, kept, strict=True)
            ],  # fmt: skip
        },
    )
    merged.save(out)
    repeats = sum(len(t.curves) for t in tables) - len(merged.curves)
    print(
        f"{len(merged.curves)} curves from {len(tables)} tables -> {out}"
        + (f" ({repeats} repeated pairs left out)" if repeats else "")
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    rest_cmd = commands.add_parser("rest", help="seed the study; write the rest's experiment")
    rest_cmd.add_argument("tables", nargs="+", type=Path)
    rest_cmd.add_argument("--tracking-uri", required=True)
    rest_cmd.add_argument("--out", required=True, type=Path)
    merge_cmd = commands.add_parser("merge", help="join the chunks' tables into one")
    merge_cmd.add_argument("tables", nargs="+", type=Path)
    merge_cmd.add_argument("--out", required=True, type=Path)
    merge_cmd.add_argument(
        "--keep-first",
        action="store_true",
        help="keep a pair in several chunks from the first, not refuse it",
    )
    args = parser.parse_args(argv)
    try:
        if args.command == "rest":
            rest(args.tables, args.tracking_uri, args.out)
        else:
            merge(args.tables, args.out, keep_first=args.keep_first)
    except ConfigError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
