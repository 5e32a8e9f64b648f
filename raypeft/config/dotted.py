"""Dotted keys (``method.lr``) over nested sections: what ``--set`` and the space write."""

from __future__ import annotations

from typing import Any

from raypeft.errors import ConfigError


def set_dotted(data: dict, key: str, value: Any) -> None:
    """``set_dotted(d, "method.lr", 0.1)`` sets ``d["method"]["lr"]``, creating levels."""
    *parents, leaf = key.split(".")
    node = data
    for part in parents:
        child = node.get(part)
        if child is None:
            child = node[part] = {}
        if not isinstance(child, dict):
            raise ConfigError(f"{key}: `{part}` is not a section, cannot set `{leaf}` inside it")
        node = child
    node[leaf] = value


def flatten(data: dict, prefix: str = "") -> dict[str, Any]:
    """``{"a": {"b": 1}}`` -> ``{"a.b": 1}`` (lists kept as values)."""
    out: dict[str, Any] = {}
    for key, value in data.items():
        path = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            out.update(flatten(value, path + "."))
        else:
            out[path] = value
    return out
