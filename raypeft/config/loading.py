"""Reading an experiment file: safe YAML (no duplicate keys, no alias bombs), ``--set``
overrides, validation against the schema, and the checks that need the whole file (space keys
that name real fields, the joint grid's size, the scheduler's grace period). Every failure is a
one-line :class:`~raypeft.errors.ConfigError` naming the file and the key.
"""

from __future__ import annotations

import difflib
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from raypeft.config.dotted import flatten, set_dotted
from raypeft.config.messages import format_validation_error
from raypeft.config.method_configs import method_config_classes
from raypeft.config.schema import ExperimentConfig, apply_trial_params
from raypeft.config.space import is_conditional
from raypeft.errors import ConfigError


def parse_override(text: str) -> tuple[str, Any]:
    """``key=value`` with the value parsed as YAML (numbers, lists, true/false, null)."""
    if "=" not in text:
        raise ConfigError(f"--set {text!r}: expected key=value")
    key, raw = text.split("=", 1)
    if not key.strip():
        raise ConfigError(f"--set {text!r}: the key is empty")
    try:
        value = _safe_yaml(raw) if raw.strip() else ""
    except yaml.YAMLError:
        value = raw
    return key.strip(), value


# An experiment file is a few hundred values. YAML anchors and aliases share nodes, so a
# small file can stand for billions of values ("billion laughs"), which validating would
# walk one by one: such a file is refused before anything is built from it.
MAX_YAML_VALUES = 100_000


def _safe_yaml(text: str) -> Any:
    """Parse YAML with the safe loader (duplicate keys refused) after checking that anchors
    and aliases do not expand it beyond :data:`MAX_YAML_VALUES` values."""
    loader = _UniqueKeyLoader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        size = _expanded_size(node, {})
        if size > MAX_YAML_VALUES:
            raise yaml.YAMLError(
                f"anchors and aliases expand it to more than {MAX_YAML_VALUES:,} values "
                f"({size:,}); an experiment file must not"
            )
        return loader.construct_document(node)
    finally:
        loader.dispose()


def _expanded_size(node: yaml.Node, sizes: dict[int, int]) -> int:
    """How many values ``node`` stands for once every alias is expanded (memoised per node,
    so a shared node is counted in linear time, however often it is referenced)."""
    if id(node) in sizes:
        return sizes[id(node)]
    sizes[id(node)] = 1  # a node that contains itself (a recursive alias) counts once
    if isinstance(node, yaml.MappingNode):
        children = [n for pair in node.value for n in pair]
    elif isinstance(node, yaml.SequenceNode):
        children = node.value
    else:
        children = []
    sizes[id(node)] = min(1 + sum(_expanded_size(c, sizes) for c in children), 2**62)
    return sizes[id(node)]


class _UniqueKeyLoader(yaml.SafeLoader):
    """YAML's safe loader, except that a key written twice in one mapping is an error (the
    plain loader silently keeps the last one)."""

    def construct_mapping(self, node, deep=False):
        seen: set[Any] = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if isinstance(key, (str, int, float, bool)) and key in seen:
                raise yaml.constructor.ConstructorError(
                    None,
                    None,
                    f"duplicate key {key!r}; each key must appear once in a mapping",
                    key_node.start_mark,
                )
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


def load_experiment(path: str | Path, overrides: list[str] = ()) -> ExperimentConfig:
    """Read, override and validate an experiment file. Raises :class:`ConfigError`."""
    path = Path(path)
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise ConfigError(f"{path}: file not found") from None
    except UnicodeDecodeError as exc:
        raise ConfigError(
            f"{path}: cannot read: not UTF-8 text (byte {exc.object[exc.start : exc.start + 1]!r} "
            f"at position {exc.start}); an experiment file must be UTF-8 YAML"
        ) from None
    except OSError as exc:
        why = exc.strerror or exc.__class__.__name__
        raise ConfigError(f"{path}: cannot read ({why}); the file must be readable") from None
    try:
        data = _safe_yaml(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or (str(exc) if not mark else None)
        why = f" ({' '.join(str(problem).split())})" if problem else ""
        raise ConfigError(f"{path}: not valid YAML{where}{why}") from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(
            f"{path}: the top level must be a mapping of keys, got {type(data).__name__}"
        )
    data.setdefault("name", path.stem)
    for item in overrides:
        try:
            key, value = parse_override(item)
            if key.startswith("space."):
                # space keys are dotted themselves: space.method.lr -> space["method.lr"]
                data.setdefault("space", {})[key[len("space.") :]] = value
            else:
                set_dotted(data, key, value)
        except ConfigError as exc:
            raise ConfigError(f"{path}: {exc}") from None
    return validate_experiment(data, str(path))


def validate_experiment(data: dict, source: str) -> ExperimentConfig:
    """Validate a raw dict; the error names ``source`` and the key."""
    try:
        cfg = ExperimentConfig.model_validate(data)
    except ValidationError as err:
        raise ConfigError(format_validation_error(err, source, ExperimentConfig)) from None
    _check_space_keys(cfg, source)
    _check_grid_size(cfg, source)
    _check_scheduler(cfg, source)
    return cfg


# Every point of a joint grid is enqueued before Optuna samples (and compared with the
# trials an earlier search of the study ran): a grid is a list of trials to run, and a
# prompt-method search runs tens to thousands of them, never billions.
MAX_GRID_POINTS = 10_000


def _check_grid_size(cfg: ExperimentConfig, source: str) -> None:
    """The joint grid is counted, never enumerated, and refused beyond MAX_GRID_POINTS."""
    size = cfg.grid_size()
    if size > MAX_GRID_POINTS:
        keys = cfg.grid_keys()
        raise ConfigError(
            f"{source}: space: the joint grid of {len(keys)} grid keys has {size:,} "
            f"combinations, over the limit of {MAX_GRID_POINTS:,} (give fewer grid values, or "
            "search some keys with choice/uniform/loguniform/int, which Optuna samples)"
        )


def _check_scheduler(cfg: ExperimentConfig, source: str) -> None:
    """A grace period the file sets must fit the longest trial's evaluations (the default,
    2, is lowered to fit): the scheduler is built once, for the search's longest trial."""
    sched = cfg.search.scheduler
    if sched.type == "none" or "grace_period" not in sched.model_fields_set:
        return
    evaluations = cfg.most_evaluations()
    if sched.grace_period > evaluations:
        raise ConfigError(
            f"{source}: search.scheduler.grace_period: `grace_period <= {evaluations}` must "
            f"hold (it counts evaluations, and the longest trial has ceil(train.max_steps / "
            f"train.eval_every) = {evaluations}), but got grace_period={sched.grace_period}"
        )


def _check_space_keys(cfg: ExperimentConfig, source: str) -> None:
    """Every search-space key must name a real field, and every value must validate there."""
    known = flatten(cfg.model_dump(mode="json", exclude={"space", "methods"}))
    for key, param in cfg.space.items():
        if is_conditional(key):
            _check_conditional_key(cfg, key, param, source)
            continue
        if key not in known:
            close = difflib.get_close_matches(key, list(known), n=3, cutoff=0.6)
            hint = f"; did you mean {', '.join(close)}?" if close else ""
            raise ConfigError(f"{source}: space.{key}: unknown key, not a config field{hint}")
        if not key.startswith(("method.", "train.", "budget_params")):
            # the task is loaded and tokenised once per experiment, with the file's model and
            # task sections: a searched model.* or task.* key would not reach the data
            raise ConfigError(
                f"{source}: space.{key}: only method, methods.<name>, train and budget_params "
                "keys can be searched (the task is tokenised once, with the file's model and "
                "task)"
            )
        for value in param.candidates():
            try:
                apply_trial_params(cfg, {key: value})
            except ValidationError as err:
                inner = format_validation_error(err, source, ExperimentConfig)
                raise ConfigError(f"{inner} [from space.{key}={value!r}]") from None


def _check_conditional_key(cfg: ExperimentConfig, key: str, param: Any, source: str) -> None:
    parts = key.split(".", 2)
    known = method_config_classes()
    if len(parts) != 3 or parts[1] not in known:
        raise ConfigError(
            f"{source}: space.{key}: conditional keys are methods.<method>.<knob> with a "
            f"method among {sorted(known)}"
        )
    _, name, knob = parts
    fields = known[name].model_fields
    if knob not in fields or knob == "name":
        close = difflib.get_close_matches(knob, list(fields), n=3, cutoff=0.6)
        hint = f"; did you mean {', '.join(f'methods.{name}.{c}' for c in close)}?" if close else ""
        raise ConfigError(f"{source}: space.{key}: {name} has no knob {knob!r}{hint}")
    if param.joint:
        raise ConfigError(
            f"{source}: space.{key}: a conditional knob cannot be part of the joint grid "
            "(it is inactive in trials of other methods); use choice"
        )
    for value in param.candidates():
        try:
            apply_trial_params(cfg, {"method.name": name, key: value})
        except ValidationError as err:
            inner = format_validation_error(err, source, ExperimentConfig)
            raise ConfigError(f"{inner} [from space.{key}={value!r}]") from None
