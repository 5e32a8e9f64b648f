"""Pydantic validation errors as one line: ``FILE: key.path: the rule that must hold (got X)``.

pydantic says "Input should be greater than or equal to 1"; raypeft says which key, and the
rule: "train.max_steps: must be >= 1 (got 0)". Unknown keys get "did you mean ...?" or the
list of keys that section takes.
"""

from __future__ import annotations

import difflib
import types
import typing
from typing import Annotated, Any, Union

from pydantic import BaseModel, ValidationError

from raypeft.config.method_configs import (
    RegisteredMethodConfig,
    method_config_classes,
    method_config_union,
)


def format_validation_error(
    err: ValidationError, source: str, root: type[BaseModel] | None = None
) -> str:
    """First error of a pydantic ValidationError as ``SOURCE: key.path: rule (got X)``.

    ``root`` is the model that was validated (``ExperimentConfig``): an unknown key's hint
    (close names, or the keys that section takes) comes from its fields; None: no hint.
    """
    first = err.errors()[0]
    raw = [p for p in first["loc"]]
    is_key = bool(raw) and raw[-1] == "[key]"  # a mapping's key (not its value) is wrong
    if is_key:
        raw = raw[:-1]
    loc = _loc_text(raw)
    msg = describe_error(first)
    if first["type"] == "extra_forbidden":
        msg = "unknown key" + _key_hint(raw, root)
    elif first["type"] == "union_tag_invalid":
        known = sorted(method_config_classes())
        msg = f"unknown method {first['input'].get('name')!r}; expected one of {known}"
    elif is_key:
        msg = f"unknown key; {msg}"
    got = first.get("input")
    got_text = (
        ""  # custom checks (value_error) state what they got themselves
        if first["type"] in ("missing", "extra_forbidden", "value_error", "assertion_error")
        or isinstance(got, dict)
        or is_key
        else f" (got {got!r})"
    )
    more = len(err.errors()) - 1
    tail = f" [+{more} more]" if more else ""
    if not loc:  # a check across sections: its message names the key itself
        return f"{source}: {msg}{tail}"
    return f"{source}: {loc}: {msg}{got_text}{tail}"


def _loc_text(loc: list[Any]) -> str:
    """``("search", "objectives", 0, "metric")`` -> ``search.objectives[0].metric``; union
    tags (a method's name, a space entry's kind repeated) are dropped."""
    parts = [p for p in loc if not _is_union_tag(p)]
    out = ""
    for i, part in enumerate(parts):
        if isinstance(part, int):
            out += f"[{part}]"
        elif i and part == parts[i - 1]:  # a space entry's tag repeats its key: keep one
            continue
        else:
            out += f".{part}" if out else str(part)
    return out


# pydantic's wording ("Input should be ...") restated as the rule that must hold
_RULES = {
    "missing": "required key is missing (it must be given)",
    "missing_item": "an item is missing here: the list must have one more value",
    "greater_than": "must be > {gt}",
    "greater_than_equal": "must be >= {ge}",
    "less_than": "must be < {lt}",
    "less_than_equal": "must be <= {le}",
    "multiple_of": "must be a multiple of {multiple_of}",
    "finite_number": "must be a finite number",
    "int_type": "must be an integer",
    "int_parsing": "must be an integer",
    "int_from_float": "must be an integer (no fractional part)",
    "float_type": "must be a number",
    "float_parsing": "must be a number",
    "bool_type": "must be true or false",
    "bool_parsing": "must be true or false",
    "string_type": "must be a string",
    "string_too_short": "must have at least {min_length} character(s)",
    "string_pattern_mismatch": "must match the pattern {pattern}",
    "literal_error": "must be one of {expected}",
    "enum": "must be one of {expected}",
    "too_short": "must have at least {min_length} item(s)",
    "too_long": "must have at most {max_length} item(s)",
    "list_type": "must be a list",
    "tuple_type": "must be a list",
    "set_type": "must be a list",
    "dict_type": "must be a mapping of keys",
    "model_type": "must be a mapping of keys",
    "model_attributes_type": "must be a mapping of keys",
    "path_type": "must be a path (a string)",
    "union_tag_not_found": "must name the method: `name: <method>`, one of {methods}",
}


def describe_error(error: dict[str, Any]) -> str:
    """One pydantic error's message as the rule that must hold (custom checks say it
    themselves)."""
    kind = error["type"]
    if kind == "missing" and error["loc"] and isinstance(error["loc"][-1], int):
        kind = "missing_item"  # a tuple given too few values
    template = _RULES.get(kind)
    if template is not None:
        ctx = {**error.get("ctx", {}), "methods": ", ".join(sorted(method_config_classes()))}
        try:
            return template.format(**ctx)
        except (KeyError, IndexError):
            pass
    return error["msg"].removeprefix("Value error, ").rstrip(".")


def _key_hint(loc: list[Any], root: Any = None, shown: str = "") -> str:
    """``; did you mean X?`` (close names), else the keys that section takes."""
    known = _known_keys(loc[:-1], root)
    if not known or not isinstance(loc[-1], str):
        return ""
    prefix = ".".join(p for p in (shown, _loc_text(list(loc[:-1]))) if p)
    prefix = f"{prefix}." if prefix else ""
    close = _close_names(loc[-1], known)
    if close:
        return f"; did you mean {' or '.join(prefix + c for c in close)}?"
    return f"; the keys there are {', '.join(known)}"


def _close_names(word: str, known: list[str]) -> list[str]:
    """Names ``word`` may be a typo of: same letters in another case, a prefix either way
    (grace -> grace_period), then difflib's close matches."""
    low = word.lower()
    same = [k for k in known if k.lower() == low]
    prefix = [
        k for k in known if len(low) >= 3 and (k.lower().startswith(low) or low.startswith(k))
    ]
    similar = difflib.get_close_matches(word, known, n=3, cutoff=0.6)
    return list(dict.fromkeys([*same, *prefix, *similar]))[:3]


def _known_keys(loc: list[Any], root: Any = None) -> list[str] | None:
    """Field names of the model an error location points into (None: not a model)."""
    if root is None:
        return None
    node: Any = root
    for part in loc:
        node = _step(node, part)
        if node is None:
            return None
    node = _unwrap(node)
    if typing.get_origin(node) in (Union, types.UnionType):  # X | None
        members = [_unwrap(a) for a in typing.get_args(node) if a is not type(None)]
        node = members[0] if len(members) == 1 else None
    if isinstance(node, type) and issubclass(node, BaseModel):
        return list(node.model_fields)
    return None


def _unwrap(ann: Any) -> Any:
    while typing.get_origin(ann) is Annotated:
        ann = typing.get_args(ann)[0]
    return ann


def _step(ann: Any, part: Any) -> Any:
    """The annotation one location ``part`` below ``ann`` (None when it cannot tell)."""
    ann = _unwrap(ann)
    if ann is RegisteredMethodConfig:  # the method section: the registered configs' union
        ann = _unwrap(method_config_union())
    origin = typing.get_origin(ann)
    if origin in (Union, types.UnionType):
        members = [_unwrap(a) for a in typing.get_args(ann) if a is not type(None)]
        if len(members) == 1:  # X | None
            return _step(members[0], part)
        models = [m for m in members if isinstance(m, type) and issubclass(m, BaseModel)]
        for model in models:  # a discriminator tag: a method's name, a space entry's kind
            name = model.model_fields.get("name")
            if (name is not None and name.default == part) or (
                len(model.model_fields) <= 2 and part in model.model_fields
            ):
                return model
        return None
    if isinstance(ann, type) and issubclass(ann, BaseModel):
        field = ann.model_fields.get(part) if isinstance(part, str) else None
        return None if field is None else field.annotation
    if origin is dict:
        return typing.get_args(ann)[1]
    if origin in (list, tuple) and isinstance(part, int):
        args = typing.get_args(ann)
        return args[0] if args else None
    return None


def _is_union_tag(part: Any) -> bool:
    # pydantic puts the discriminator tag / union member names into error locations
    return isinstance(part, str) and part in method_config_classes()
