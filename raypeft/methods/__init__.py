"""Prompt methods. Importing this package registers every built-in method."""

from raypeft.methods import deep_prompts, dept, idpg, ipt, prompt_tuning  # noqa: F401  (registration side effects)
from raypeft.methods.base import (
    METHODS,
    BackboneDims,
    MethodConfig,
    PromptMethod,
    build_method,
    register_method,
)

__all__ = [
    "METHODS",
    "BackboneDims",
    "MethodConfig",
    "PromptMethod",
    "build_method",
    "register_method",
]
