"""What a replay runs: the search file's space and search section on the table's recording.

The table fixes what the curves were recorded with (model, task, training length and
evaluations); the search file brings what is being chosen (sampler, scheduler, number of
trials, concurrency, space). Every key the file searches must be one the table varies, over
values it holds; a key the table varies that the file does not search takes the file's value,
which the table must hold too. Anything else is a one-line error naming the key.
"""

from __future__ import annotations

import itertools
from typing import Any

from raypeft.config.dotted import flatten, set_dotted
from raypeft.config.loading import validate_experiment
from raypeft.config.schema import ExperimentConfig
from raypeft.config.space import SEED_KEY, configuration_key
from raypeft.errors import ConfigError
from raypeft.search.simulate.table import CurveTable

# sections of the file that never reach a replay: where records go, what Ray is asked for
_NOT_REPLAYED = ("name", "space", "search", "tracking", "run", "resources")


def replay_config(
    search: ExperimentConfig, table: CurveTable, concurrency: int
) -> ExperimentConfig:
    """The search ``search`` describes, as replayed on ``table`` with ``concurrency`` trials
    at a time (checked: every configuration it can propose has a recorded curve)."""
    held = table.space()
    for key, entry in search.space.items():
        _check_searched(key, entry, held, table.seeds())
    data = table.config.model_dump(mode="json")
    fixed = flatten(search.model_dump(mode="json", exclude={"space"}))
    for key, values in held.items():
        if key not in search.space:
            set_dotted(data, key, _held_value(key, fixed.get(key), values))
    data["name"] = search.name
    data["space"] = {key: entry.model_dump() for key, entry in search.space.items()}
    data["search"] = search.search.model_dump(mode="json") | {"max_concurrent": concurrency}
    cfg = validate_experiment(data, "the replayed search")
    _check_recorded(cfg, table)
    _check_repeat_seeds(cfg, table)
    return cfg


def differences(search: ExperimentConfig, table: CurveTable) -> list[str]:
    """Settings of the file that the replay takes from the table instead (``key table
    (file: value)``), for the one line that says so."""
    mine = flatten(search.model_dump(mode="json", exclude=set(_NOT_REPLAYED)))
    recorded = flatten(table.config.model_dump(mode="json", exclude=set(_NOT_REPLAYED)))
    varied = set(table.space())
    return [
        f"{key} {recorded[key]} (file: {value})"
        for key, value in mine.items()
        if key in recorded and recorded[key] != value and key not in varied
    ]


def _check_searched(key: str, entry, held: dict[str, list[Any]], seeds: list[int]) -> None:
    listed = entry.listed()
    recorded = seeds if key == SEED_KEY else held.get(key)
    if recorded is None:
        raise ConfigError(
            f"space.{key}: the table does not vary it; it varies {', '.join(sorted(held))}"
        )
    if listed is None:
        raise ConfigError(
            f"space.{key}: a range, but the table holds the points {recorded}; search them "
            "as grid or choice"
        )
    missing = [v for v in listed if v not in recorded]
    if missing:
        raise ConfigError(f"space.{key}: {missing} not in the table, which holds {recorded}")


def _held_value(key: str, value: Any, values: list[Any]) -> Any:
    if value not in values:
        raise ConfigError(
            f"{key}: the file fixes it at {value!r}, but the table holds only {values}; "
            f"search it (space.{key}) or set one of them"
        )
    return value


def _check_recorded(cfg: ExperimentConfig, table: CurveTable) -> None:
    """Every configuration the replayed space can propose has at least one curve."""
    recorded = set(table.by_configuration())
    for key in sorted(configurations_of(cfg, table)):
        if key not in recorded:
            raise ConfigError(f"the table has no curve for {key} (a recording still under way?)")


def _check_repeat_seeds(cfg: ExperimentConfig, table: CurveTable) -> None:
    """``search.repeat_best`` trains a configuration again with other seeds: the replay needs
    that many recorded seeds besides the one the search draws, for every configuration."""
    if cfg.search.repeat_best is None:
        return
    wanted = cfg.search.repeat_best.seeds + 1
    groups = table.by_configuration()
    fewest = min(len(groups[key]) for key in configurations_of(cfg, table))
    if fewest < wanted:
        raise ConfigError(
            f"search.repeat_best.seeds: {wanted - 1} more seeds per configuration, but the "
            f"table recorded as few as {fewest} seeds of a configuration (at most {fewest - 1})"
        )


def fixed_values(cfg: ExperimentConfig, table: CurveTable) -> dict[str, Any]:
    """The values ``cfg`` gives the keys the table varies but it does not search."""
    flat = flatten(cfg.model_dump(mode="json"))
    return {k: flat[k] for k in table.space() if k not in cfg.space}


def configurations_of(cfg: ExperimentConfig, table: CurveTable) -> set[str]:
    """The configuration keys of every point of ``cfg``'s (discrete) space, seeds aside."""
    keys = [k for k in cfg.space if k != SEED_KEY]
    fixed = fixed_values(cfg, table)
    return {
        configuration_key({**fixed, **dict(zip(keys, combo, strict=True))})
        for combo in itertools.product(*(cfg.space[k].listed() for k in keys))
    }
