"""Prompt methods. Importing this package registers every method in it.

Every module of this package (a file, or a subpackage such as ``idpg/``) is imported, and a
method registers itself when its module is imported: a new method's file is found without
editing this one. The registration order is the order listings use (``raypeft budget``,
messages): the built-in methods' family tree, PT first, then any other module by name.
"""

import importlib
import pkgutil

from raypeft.methods.base import (
    METHODS,
    BackboneDims,
    MethodConfig,
    PromptMethod,
    build_method,
    register_method,
)

# the built-in method modules in their listing order; any other module follows by name
_FAMILY_ORDER = ("prompt_tuning", "dept", "deep_prompts", "idpg", "ipt")


def _method_modules() -> list[str]:
    """This package's modules, the built-in methods' first, in their listing order."""
    found = sorted(module.name for module in pkgutil.iter_modules(__path__))
    return [*_FAMILY_ORDER, *(name for name in found if name not in _FAMILY_ORDER)]


for _name in _method_modules():
    importlib.import_module(f"{__name__}.{_name}")  # registers the module's method, if any

__all__ = [
    "METHODS",
    "BackboneDims",
    "MethodConfig",
    "PromptMethod",
    "build_method",
    "register_method",
]
