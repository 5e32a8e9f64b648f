"""The search-space language: one entry per searched key, of one of five kinds.

``grid`` and ``choice`` list their values (a grid's keys form a joint grid that every search
runs whole; a choice is sampled by Optuna), ``uniform``, ``loguniform`` and ``int`` give a
range. Each kind owns its behaviour: how Optuna is asked for a value (:meth:`suggest`), the
values it lists (:meth:`listed`, None for a range), the values worth resolving before a search
(:meth:`candidates`) and its smallest and largest values. Nothing else switches on the kind.
"""

from __future__ import annotations

import math
from typing import Annotated, Any, ClassVar

from pydantic import (
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    Tag,
    field_validator,
    model_validator,
)

# A searched key `methods.X.knob` is sampled only in trials that choose method X.
CONDITIONAL_PREFIX = "methods."
SEED_KEY = "train.seed"  # the key search.seeds grids over


class StrictModel(BaseModel):
    """A section of the experiment file: unknown keys are errors, and so is NaN or an
    infinity in any float key (YAML reads ``.nan`` and ``.inf`` as floats; a learning rate of
    inf would only fail inside a trial)."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


class SpaceEntry(StrictModel):
    """What every kind of space entry answers."""

    # grid: the entry's values join the joint grid every search runs whole (and enqueues
    # before Optuna samples); the other kinds are sampled
    joint: ClassVar[bool] = False

    def suggest(self, trial: Any, key: str) -> Any:
        """Ask Optuna's ``trial`` for a value of ``key``."""
        raise NotImplementedError

    def listed(self) -> list[Any] | None:
        """The values the entry lists (grid, choice); None for a range."""
        return None

    def candidates(self, max_int_values: int = 64) -> list[Any]:
        """Values worth resolving before a search: every listed value, or a range's ends."""
        return list(dict.fromkeys(self.listed() or []))

    def smallest(self) -> Any:
        return min(self.candidates())

    def largest(self) -> Any:
        return max(self.candidates())


class GridParam(SpaceEntry):
    joint: ClassVar[bool] = True
    grid: list[Any] = Field(min_length=1, description="joint grid: every combination is run")

    def suggest(self, trial: Any, key: str) -> Any:
        return trial.suggest_categorical(key, self.grid)

    def listed(self) -> list[Any]:
        return self.grid


class ChoiceParam(SpaceEntry):
    choice: list[Any] = Field(min_length=1, description="categorical, sampled by Optuna")

    def suggest(self, trial: Any, key: str) -> Any:
        return trial.suggest_categorical(key, self.choice)

    def listed(self) -> list[Any]:
        return self.choice


def _ordered(kind: str, bounds: tuple) -> tuple:
    low, high = bounds
    if not (math.isfinite(low) and math.isfinite(high)):
        raise ValueError(
            f"`low` and `high` must be finite numbers for {kind}, but got {list(bounds)}"
        )
    if low > high:
        raise ValueError(f"`low <= high` must hold for {kind}: [low, high], but got {list(bounds)}")
    return bounds


class UniformParam(SpaceEntry):
    uniform: tuple[float, float]

    @field_validator("uniform")
    @classmethod
    def _low_high(cls, v):
        return _ordered("uniform", v)

    def suggest(self, trial: Any, key: str) -> Any:
        return trial.suggest_float(key, *self.uniform)

    def candidates(self, max_int_values: int = 64) -> list[Any]:
        return list(dict.fromkeys(self.uniform))


class LogUniformParam(SpaceEntry):
    loguniform: tuple[float, float]

    @field_validator("loguniform")
    @classmethod
    def _positive(cls, v):
        if v[0] <= 0:
            raise ValueError(f"`0 < low` must hold for loguniform, but got low={v[0]}")
        return _ordered("loguniform", v)

    def suggest(self, trial: Any, key: str) -> Any:
        return trial.suggest_float(key, *self.loguniform, log=True)

    def candidates(self, max_int_values: int = 64) -> list[Any]:
        return list(dict.fromkeys(self.loguniform))


class IntParam(SpaceEntry):
    int: tuple[int, int]
    step: int = Field(1, ge=1)

    @field_validator("int")
    @classmethod
    def _low_high(cls, v):
        return _ordered("int", v)

    @model_validator(mode="after")
    def _step_fits(self) -> IntParam:
        low, high = self.int
        if (high - low) % self.step:
            raise ValueError(
                f"`(high - low) % step == 0` must hold for int (every value low, low+step, "
                f"..., high), but got int=[{low}, {high}], step={self.step}"
            )
        return self

    def suggest(self, trial: Any, key: str) -> Any:
        return trial.suggest_int(key, *self.int, step=self.step)

    def candidates(self, max_int_values: int = 64) -> list[Any]:
        """Every value of a short range, else its ends."""
        low, high = self.int
        values = range(low, high + 1, self.step)
        return list(values) if len(values) <= max_int_values else [low, values[-1]]


SPACE_KINDS = {"grid", "choice", "uniform", "loguniform", "int"}


def _space_kind(entry: Any) -> str | None:
    if isinstance(entry, BaseModel):
        entry = entry.model_dump()
    kinds = set(entry) & SPACE_KINDS if isinstance(entry, dict) else set()
    return kinds.pop() if len(kinds) == 1 else None


SpaceParam = Annotated[
    Annotated[GridParam, Tag("grid")]
    | Annotated[ChoiceParam, Tag("choice")]
    | Annotated[UniformParam, Tag("uniform")]
    | Annotated[LogUniformParam, Tag("loguniform")]
    | Annotated[IntParam, Tag("int")],
    Discriminator(_space_kind),
]


def is_conditional(space_key: str) -> bool:
    """``methods.X.knob``: a knob searched only in trials that choose method ``X``."""
    return space_key.startswith(CONDITIONAL_PREFIX)


def configuration_key(params: dict[str, Any]) -> str:
    """What a trial trains apart from its seed: its searched values, ``key=value`` sorted by
    key and joined by ", ", ``train.seed`` left out. Trials with equal keys are seeds of one
    configuration (the ``raypeft.configuration`` tag in MLflow and user attribute in Optuna)."""
    return ", ".join(f"{k}={params[k]}" for k in sorted(params) if k != SEED_KEY)
