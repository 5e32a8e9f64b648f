"""One experiment file: every section together, the checks across sections, and the JSON
schema editors check the YAML with."""

from __future__ import annotations

import itertools
import math
from typing import Any

from pydantic import Field, ValidationError, field_validator, model_validator

from raypeft.config.messages import _key_hint, _loc_text, describe_error
from raypeft.config.method_configs import (
    RegisteredMethodConfig,
    method_config_classes,
    on_method_registered,
)
from raypeft.config.schema.model import ModelConfig
from raypeft.config.schema.replay import ReplayConfig
from raypeft.config.schema.resources import ResourcesConfig
from raypeft.config.schema.run import RunConfig
from raypeft.config.schema.search import SearchConfig
from raypeft.config.schema.task import TaskConfig
from raypeft.config.schema.tracking import TrackingConfig
from raypeft.config.schema.train import TrainConfig
from raypeft.config.space import (
    SEED_KEY,
    SPACE_KINDS,
    SpaceParam,
    StrictModel,
    configuration_key,
    is_conditional,
)


class ExperimentConfig(StrictModel):
    """One experiment file: what to train, how, and what to search."""

    name: str = Field(min_length=1, pattern=r"^[A-Za-z0-9_.-]+$")
    model: ModelConfig = ModelConfig()
    task: TaskConfig = TaskConfig()
    budget_params: int | None = Field(
        None,
        ge=1,
        description="one trainable-parameter budget for every method (task head excluded): "
        "each method derives its size knob from it",
    )
    method: RegisteredMethodConfig  # a registered method's config, told apart by `name`
    methods: dict[str, dict[str, Any]] = Field(
        default_factory=dict,
        description="settings of each method by name, used when the space chooses "
        "method.name (one experiment comparing methods)",
    )
    train: TrainConfig = TrainConfig()
    search: SearchConfig = SearchConfig()
    space: dict[str, SpaceParam] = Field(
        default_factory=dict, description="dotted config key -> distribution or grid"
    )
    resources: ResourcesConfig = ResourcesConfig()
    tracking: TrackingConfig = TrackingConfig()
    run: RunConfig = RunConfig()
    replay: ReplayConfig = ReplayConfig()

    @model_validator(mode="before")
    @classmethod
    def _budget_for_every_method(cls, data: Any) -> Any:
        # the experiment-wide budget is each method's budget_params
        if isinstance(data, dict) and data.get("budget_params") is not None:
            method = data.get("method")
            if isinstance(method, dict):
                data = {**data, "method": {**method, "budget_params": data["budget_params"]}}
        return data

    @model_validator(mode="before")
    @classmethod
    def _seeds_join_the_space(cls, data: Any) -> Any:
        # search.seeds is the grid `train.seed: {grid: seeds}`: every configuration once per
        # seed. Written back into the space, so everything that reads the space sees it.
        search = data.get("search") if isinstance(data, dict) else None
        seeds = search.get("seeds") if isinstance(search, dict) else None
        if not isinstance(seeds, list):
            return data
        space = dict(data.get("space") or {})
        given = space.get(SEED_KEY)
        if given is None:
            space[SEED_KEY] = {"grid": list(seeds)}
        elif not (isinstance(given, dict) and given.get("grid") == seeds):
            raise ValueError(
                f"search.seeds: the seeds are given twice, as search.seeds and as space."
                f"{SEED_KEY}; keep one"
            )
        return {**data, "space": space}

    @field_validator("methods")
    @classmethod
    def _known_methods(cls, methods: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
        known = method_config_classes()
        for name, settings in methods.items():
            if name not in known:
                raise ValueError(f"unknown method {name!r}; expected one of {sorted(known)}")
            if not isinstance(settings, dict) or "name" in settings:
                raise ValueError(f"`methods.{name}` must be a mapping of that method's settings")
        return methods

    @model_validator(mode="after")
    def _method_presets_validate(self) -> ExperimentConfig:
        for name in self.methods:
            config_cls = method_config_classes()[name]
            try:
                config_cls.model_validate(self.method_settings(name))
            except ValidationError as err:
                first = err.errors()[0]
                loc = _loc_text(list(first["loc"]))
                msg = (
                    "unknown key" + _key_hint(list(first["loc"]), config_cls, f"methods.{name}")
                    if first["type"] == "extra_forbidden"
                    else describe_error(first)
                )
                got = first.get("input")
                got_text = (
                    "" if first["type"] in ("missing", "extra_forbidden") else f" (got {got!r})"
                )
                raise ValueError(f"methods.{name}.{loc}: {msg}{got_text}") from None
        return self

    def method_settings(self, name: str) -> dict[str, Any]:
        """The method section a trial gets when it chooses method ``name``.

        ``methods[name]`` if given, else the ``method`` section when it names that method,
        else the method's defaults; the experiment's ``budget_params`` applies to each.
        """
        if name in self.methods:
            settings = {"name": name, **self.methods[name]}
        elif name == self.method.name:
            settings = self.method.model_dump(mode="json")
        else:
            settings = {"name": name}
        if self.budget_params is not None:
            settings["budget_params"] = self.budget_params
        return settings

    @field_validator("space", mode="before")
    @classmethod
    def _one_kind_per_key(cls, space: Any) -> Any:
        if not isinstance(space, dict):
            return space
        for key, entry in space.items():
            kinds = sorted(set(entry) & SPACE_KINDS) if isinstance(entry, dict) else []
            if len(kinds) != 1:
                found = f"got {kinds}" if kinds else f"got {entry!r}"
                raise ValueError(
                    f"`{key}` must have exactly one of {sorted(SPACE_KINDS)}, but {found}"
                )
        return space

    @model_validator(mode="after")
    def _sampler_fits_space(self) -> ExperimentConfig:
        sampler = self.search.sampler
        if self.search.seeds is not None and sampler != "grid":
            raise ValueError(
                f"search.seeds: every configuration runs once per seed, which needs "
                f"sampler: grid, but got sampler: {sampler}"
            )
        if sampler == "grid":
            for key, param in self.space.items():
                if param.listed() is None:
                    raise ValueError(
                        f"search.sampler: grid runs every combination of grid/choice keys, so "
                        f"every space key must be grid or choice, but space.{key} is "
                        "continuous; use choice, or another sampler"
                    )
                if is_conditional(key):
                    raise ValueError(
                        f"search.sampler: grid cannot run the conditional key space.{key} (it "
                        "is inactive in trials of other methods); use tpe or random"
                    )
            size = math.prod(len(p.listed()) for p in self.space.values())
            if self.search.num_samples > size:
                raise ValueError(
                    f"search.num_samples: {self.search.num_samples} trials exceed the "
                    f"{size} combinations sampler grid runs (each once)"
                )
        if sampler == "cmaes" and all(p.listed() is not None for p in self.space.values()):
            raise ValueError(
                "search.sampler: cmaes needs at least one uniform, loguniform or int space key "
                "(it samples the others at random)"
            )
        return self

    @model_validator(mode="after")
    def _batch_splits_over_workers(self) -> ExperimentConfig:
        workers = self.resources.workers_per_trial
        runner = self.resources.trial_runner
        if runner in ("in_process", "replay") and workers != 1:
            raise ValueError(
                "resources.workers_per_trial: `workers_per_trial == 1` must hold with "
                f"trial_runner: {runner} (it runs in the Tune trial itself), but got "
                f"workers_per_trial={workers}; use trial_runner: ray_train or auto for DDP"
            )
        if self.train.batch_size % workers:
            raise ValueError(
                f"train.batch_size: `batch_size % resources.workers_per_trial == 0` must hold "
                f"(DDP splits the global batch evenly over the workers), but got "
                f"batch_size={self.train.batch_size}, workers_per_trial={workers}"
            )
        return self

    @model_validator(mode="after")
    def _replay_has_a_table(self) -> ExperimentConfig:
        replaying = self.resources.trial_runner == "replay"
        if replaying and not self.replay.table:
            raise ValueError(
                "replay.table: resources.trial_runner: replay needs a learning-curve table "
                "(`raypeft table ... --out FILE`), but none was given"
            )
        if self.replay.table and not replaying:
            raise ValueError(
                f"replay.table: set ({self.replay.table}), but trials train "
                f"(resources.trial_runner: {self.resources.trial_runner}); set "
                "resources.trial_runner: replay, or leave replay.table out"
            )
        if replaying and self.resources.trials_per_worker > 1:
            raise ValueError(
                "resources.trials_per_worker: `trials_per_worker == 1` must hold with "
                f"trial_runner: replay (replayed trials do not train), but got "
                f"{self.resources.trials_per_worker}"
            )
        return self

    @model_validator(mode="after")
    def _fp16_needs_a_gpu(self) -> ExperimentConfig:
        # caught here rather than when every trial starts and fails on its CPU
        # use_gpu: auto may still find a GPU: the search refuses fp16 if it finds none
        if self.train.precision == "fp16" and not (self.resources.gpus or self.resources.gpu_auto):
            raise ValueError(
                "train.precision: fp16 needs a GPU (resources.use_gpu or gpus_per_worker > 0), "
                "but the trials run on CPUs; use bf16 or auto there"
            )
        return self

    def configuration_of(self, trial_config: dict[str, Any]) -> str:
        """The :func:`configuration_key` of a trial's config (its searched keys only)."""
        return configuration_key({k: v for k, v in trial_config.items() if k in self.space})

    def grid_keys(self) -> list[str]:
        return [k for k, p in self.space.items() if p.joint]

    def grid_size(self) -> int:
        """How many combinations the joint grid has (computed, not enumerated)."""
        keys = self.grid_keys()
        return math.prod(len(self.space[k].listed()) for k in keys) if keys else 0

    def space_candidates(self, max_int_values: int = 64) -> dict[str, list[Any]]:
        """Values of each searched key worth resolving before a search: every grid/choice
        value, every value of a short int range (else its ends), the ends of a float range."""
        return {k: p.candidates(max_int_values) for k, p in self.space.items()}

    def most_evaluations(self) -> int:
        """The most evaluations a trial of this search makes (the schedulers count them; the
        schedulers' ``max_t``): the longest ``train.max_steps`` over the shortest
        ``train.eval_every`` the space can give; a shorter trial ends at its own length."""
        steps, every = self.space.get("train.max_steps"), self.space.get("train.eval_every")
        longest = steps.largest() if steps else self.train.max_steps
        most_often = every.smallest() if every else self.train.eval_every
        return math.ceil(longest / most_often)

    def grid_points(self) -> list[dict[str, Any]]:
        """Every combination of the ``grid`` keys (the joint grid), in file order."""
        keys = self.grid_keys()
        if not keys:
            return []
        values = [self.space[k].listed() for k in keys]
        return [dict(zip(keys, combo, strict=True)) for combo in itertools.product(*values)]


# A method registered after this module is imported (a plugin) joins the `method` union too.
on_method_registered(lambda: ExperimentConfig.model_rebuild(force=True))


def experiment_json_schema() -> dict[str, Any]:
    """JSON schema of an experiment file (editors complete and check the YAML with it)."""
    schema = ExperimentConfig.model_json_schema(mode="validation")
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["title"] = "raypeft experiment"
    # the name defaults to the file's stem when the file leaves it out
    schema["required"] = [k for k in schema.get("required", []) if k != "name"]
    return schema
