"""The ``method`` section of an experiment file: what every method's config has, and the
registry of method configs by name.

Methods sit above the config layer (:mod:`raypeft.methods`); each one registers its config
class here (``raypeft.methods.base.register_method`` does it), and the experiment schema then
accepts that config under its ``name``. The config layer never imports a method: it reads the
registry. ``raypeft/__init__.py`` imports :mod:`raypeft.methods`, so the built-in methods are
registered before any experiment file is read.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any, Union

from pydantic import BaseModel, ConfigDict, Field, GetCoreSchemaHandler
from pydantic_core import CoreSchema


class MethodConfigBase(BaseModel):
    """The fields every method's config has. Subclasses set ``name: Literal["..."]``;
    :class:`raypeft.methods.MethodConfig` adds what a method does with them."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True, allow_inf_nan=False)

    name: str
    budget_params: int | None = Field(
        None,
        ge=1,
        description="trainable-parameter budget: the method's size knob is derived from it",
    )


_CONFIGS: dict[str, type[MethodConfigBase]] = {}  # by name, in registration order
_ON_REGISTER: list[Callable[[], None]] = []  # schemas built from the registry rebuild


def config_name(config_cls: type[MethodConfigBase]) -> str:
    """The ``name`` literal of a method config class (``Literal["x"]`` -> ``"x"``)."""
    (name,) = config_cls.model_fields["name"].annotation.__args__
    return name


def register_method_config(config_cls: type[MethodConfigBase]) -> type[MethodConfigBase]:
    """Accept ``config_cls`` as an experiment's ``method`` section under its ``name``."""
    name = config_name(config_cls)
    if name in _CONFIGS:
        raise ValueError(f"method {name!r} is registered twice")
    _CONFIGS[name] = config_cls
    for rebuild in _ON_REGISTER:
        rebuild()
    return config_cls


def method_config_classes() -> dict[str, type[MethodConfigBase]]:
    """Every registered method config by name, in registration order."""
    return dict(_CONFIGS)


def on_method_registered(rebuild: Callable[[], None]) -> None:
    """Call ``rebuild`` after each later registration (a model whose schema reads the
    registry rebuilds it, so a method registered after it is accepted too)."""
    _ON_REGISTER.append(rebuild)


def method_config_union() -> Any:
    """The registered configs as one type, told apart by ``name`` (a discriminated union)."""
    if not _CONFIGS:
        raise RuntimeError("no method is registered: import raypeft.methods first")
    return Annotated[Union[tuple(_CONFIGS.values())], Field(discriminator="name")]  # noqa: UP007


class RegisteredMethodConfig:
    """Type of an experiment's ``method`` section: any registered method config.

    pydantic asks for its schema whenever a model using it is built, or rebuilt after a
    registration (:func:`on_method_registered`): the union then holds every method
    registered so far, and validation and the JSON schema are those of the union itself.
    """

    @classmethod
    def __get_pydantic_core_schema__(cls, source: Any, handler: GetCoreSchemaHandler) -> CoreSchema:
        return handler(method_config_union())
