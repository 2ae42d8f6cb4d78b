"""Validation errors in words: key paths as berth.toml writes them, unknown keys with the keys
their table allows, names TOML split at their dots.

A leaf of the config package: the models' tree comes as an argument (``root``, the
:class:`~berth.config.models.Config` class), so the models and the checks between values can
use these words without an import circle (issue 38)."""

from __future__ import annotations

import difflib
import json
import re
import types
import typing
from typing import Annotated, Any

from pydantic import BaseModel

__all__ = ["key_str", "loc_str", "unknown_key", "is_secret", "shows_value"]

#: Key names whose values an error never repeats ([board] key, [api] key, [network] key,
#: [hosts.supervisor] password), and any name that looks like one.
_SECRET_WORDS = ("key", "password", "passwd", "secret", "token")


def is_secret(key: Any) -> bool:
    """Whether a key's value is, or may be, a secret (issue 36): its name holds one of
    :data:`_SECRET_WORDS` (``key``, ``api_key``; a misspelling such as ``pasword`` holds
    none: see :func:`shows_value`)."""
    name = str(key).lower()
    return any(w in name for w in _SECRET_WORDS)


def shows_value(key: Any, root: type[BaseModel]) -> bool:
    """Whether an error about ``key`` may repeat its value: only a key the document ``root``
    models knows (in any table) that is not a secret. A misspelled key may be a secret put under
    the wrong name (``kye``, ``pasword``), so its value is never repeated (issue 36)."""
    return not is_secret(key) and any(key in m.model_fields for _, m in _tables(root))

_BARE = re.compile(r"^[A-Za-z0-9_-]+$")


def key_str(k: Any) -> str:
    return str(k) if not isinstance(k, str) or _BARE.match(k) else json.dumps(k)


def loc_str(loc: tuple) -> str:
    return ".".join(key_str(x) for x in loc)


def _unwrap(t: Any) -> Any:
    while True:
        origin = typing.get_origin(t)
        if origin is Annotated:
            t = typing.get_args(t)[0]
        elif origin in (typing.Union, types.UnionType):
            args = [a for a in typing.get_args(t) if a is not type(None)]
            if len(args) != 1:
                return t
            t = args[0]
        else:
            return t


def _model_at(path: tuple, root: type[BaseModel]) -> type[BaseModel] | None:
    """The model of the table at ``path`` under ``root`` (``("engines", "x")`` ->
    :class:`EngineConfig`)."""
    t: Any = root
    for part in path:
        if isinstance(t, type) and issubclass(t, BaseModel):
            f = t.model_fields.get(part) if isinstance(part, str) else None
            if f is None:
                return None
            t = _unwrap(f.annotation)
        elif typing.get_origin(t) in (dict, list):
            t = _unwrap(typing.get_args(t)[-1])
        else:
            return None
    return t if isinstance(t, type) and issubclass(t, BaseModel) else None


def _is_model(t: Any) -> bool:
    return isinstance(t, type) and issubclass(t, BaseModel)


def _tables(model: type[BaseModel], path: tuple = ()) -> list[tuple[str, type[BaseModel]]]:
    """Every table berth.toml has, as its header reads (``[policy]``, ``[cards.<name>]``,
    ``[[driver.cards]]``; the top level as ``""``), with its model."""
    out = [(f"[{'.'.join(path)}]" if path else "", model)]
    for name, f in model.model_fields.items():
        t = _unwrap(f.annotation)
        origin = typing.get_origin(t)
        if _is_model(t):
            out += _tables(t, (*path, name))
        elif origin in (dict, list) and _is_model(inner := _unwrap(typing.get_args(t)[-1])):
            head = ".".join((*path, name))
            entry = f"[{head}.<name>]" if origin is dict else f"[[{head}]]"
            out += [(entry, inner)] + [(h, m) for h, m in _tables(inner, ()) if h]
    return out


def _elsewhere(key: str, model: type[BaseModel] | None, root: type[BaseModel]) -> str:
    """Where else under ``root`` ``key`` is a key, as a hint: ``[policy] release_grace``,
    several joined by "or"; ``""`` when it is a key of no other table."""
    found = [f"{head} {key}" if head else f"{key} at the top level (before any [table])"
             for head, m in _tables(root) if m is not model and key in m.model_fields]
    return " or ".join(found)


def unknown_key(loc: tuple, value: Any, root: type[BaseModel]) -> tuple[tuple, str]:
    """An "extra inputs" error at ``loc`` of the document ``root`` models, in words: which keys
    the table allows, or, for a name TOML split at its dots (``[engines.qwen2.5-coder]``), how
    to quote it."""
    *parent, key = loc
    parent = tuple(parent)
    model = _model_at(parent, root)
    if (len(parent) == 2 and parent[0] in ("engines", "cards") and isinstance(value, dict)
            and model is not None):
        parts, v = [str(parent[1]), str(key)], value
        while isinstance(v, dict) and len(v) == 1:
            (k, sub), = v.items()
            if k in model.model_fields or not isinstance(sub, dict):
                break
            parts.append(k)
            v = sub
        name = ".".join(parts)
        return ((parent[0], name),
                f"TOML reads the dots in [{parent[0]}.{name}] as nested tables ({parent[0]} entry "
                f"{parent[1]!r} holding a table {key!r}): quote the name in the table header, "
                f"e.g. [{parent[0]}.{json.dumps(name)}]")
    msg = "unknown key"
    if model is not None:
        allowed = list(model.model_fields)
        close = difflib.get_close_matches(str(key), allowed, 1)
        other = _elsewhere(str(key), model, root)
        if other:           # a key in the wrong table: its own table, not a look-alike here
            msg += f" (did you mean {other}?)"
        elif close:
            msg += f" (did you mean {close[0]!r}?)"
        where = f"[{loc_str(parent)}]" if parent else "the top level"
        msg += f"; {where} allows: {', '.join(allowed)}"
    if not isinstance(value, dict) and shows_value(key, root):
        msg += f" (got {value!r})"
    return loc, msg


