"""Reading and writing llama-swap's YAML with PyYAML, close to how llama-swap (yaml.v3) reads it.

PyYAML was chosen over ruamel.yaml (no new dependency): the output keeps every key, its order
and every value, but not YAML comments. Comment lines *inside* a ``cmd`` block are part of the
string and are kept. Two differences from PyYAML's defaults make the round trip faithful:

- Plain scalars resolve as in YAML 1.2, as yaml.v3 does for untyped values: ``on``, ``yes``,
  ``1:20`` and dates stay strings (YAML 1.1 would turn them into ``True``, ``80`` and a date).
- A key given twice is an error, as in yaml.v3 ("mapping key already defined").

Output: multi-line strings as literal blocks (``|``), no anchors or aliases (each model is
written out in full), keys in their original order.

A string holding ``${env.NAME}`` keeps the style it was written in (:class:`EnvText`):
llama-swap pastes the variable's value into the YAML *text* before parsing it, escaped for a
double-quoted scalar (``\\`` and ``\"``; ``internal/config/macros.go``,
``sanitizeEnvValueForYAML``). The value a model gets therefore depends on the quotes around
the reference: written plain, ``abc #def`` is cut to ``abc`` and ``a: b`` becomes a mapping;
double-quoted, both arrive whole. Writing ``"${env.HF_TOKEN}"`` back bare would change the
value; so would quoting a bare one.
"""

from __future__ import annotations

import re

import yaml

__all__ = ["YamlError", "EnvText", "ENV_REF", "like", "style_of", "env_styles", "load", "dump"]

#: What llama-swap replaces in the text before parsing.
ENV_REF = "${env."


class YamlError(ValueError):
    """Text that is not valid YAML; the message names the line and column."""


class EnvText(str):
    """A string holding ``${env.NAME}`` and the YAML style it was read in: ``style`` is
    ``None`` (plain), ``"'"``, ``'"'``, ``"|"`` or ``">"``."""

    style: str | None

    def __new__(cls, text: str, style: str | None):
        self = super().__new__(cls, text)
        self.style = style
        return self

    def __reduce__(self):
        return EnvText, (str(self), self.style)


def like(old: object, new: str) -> str:
    """``new``, written in the style of ``old`` when ``old`` was read as :class:`EnvText` and
    ``new`` still holds ``${env.``; plain ``new`` otherwise."""
    if isinstance(old, EnvText) and ENV_REF in new:
        return EnvText(new, old.style)
    return new


def env_styles(data: object, path: str = "") -> list[tuple[str, str | None]]:
    """``(path, style)`` of every string holding ``${env.`` in ``data``, keys included, in
    order; ``>`` counts as ``|``."""
    if isinstance(data, str):
        if ENV_REF not in data:
            return []
        style = style_of(data)
        return [(path, "|" if style == ">" else style)]
    out: list[tuple[str, str | None]] = []
    if isinstance(data, dict):
        for key, value in data.items():
            out += env_styles(key, f"{path}.{key}(key)") + env_styles(value, f"{path}.{key}")
    elif isinstance(data, list):
        for i, value in enumerate(data):
            out += env_styles(value, f"{path}[{i}]")
    return out


def style_of(text: object) -> str | None:
    """The style a string holding ``${env.`` was read in (``None``: plain, or not read)."""
    return text.style if isinstance(text, EnvText) else None


class _Loader(yaml.SafeLoader):
    """SafeLoader with YAML 1.2 core scalars and duplicate keys refused."""

    def construct_mapping(self, node, deep=False):
        seen: dict = {}
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue
            key = self.construct_object(key_node, deep=deep)
            try:
                hashable = key in seen
            except TypeError:
                continue
            if hashable:
                mark = key_node.start_mark
                raise YamlError(f"line {mark.line + 1}, column {mark.column + 1}: key {key!r} "
                                f"is given twice in one mapping (first on line {seen[key]})")
            seen[key] = key_node.start_mark.line + 1
        return super().construct_mapping(node, deep=deep)


_REPLACED = {"tag:yaml.org,2002:bool", "tag:yaml.org,2002:int", "tag:yaml.org,2002:float",
             "tag:yaml.org,2002:timestamp"}
_Loader.yaml_implicit_resolvers = {
    first: [(tag, rx) for tag, rx in resolvers if tag not in _REPLACED]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()}
_Loader.add_implicit_resolver("tag:yaml.org,2002:bool",
                              re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"), list("tTfF"))
_Loader.add_implicit_resolver("tag:yaml.org,2002:int",
                              re.compile(r"^(?:[-+]?[0-9]+|0o[0-7]+|0x[0-9a-fA-F]+)$"),
                              list("-+0123456789"))
_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^(?:[-+]?(?:\.[0-9]+|[0-9]+(?:\.[0-9]*)?)(?:[eE][-+]?[0-9]+)?"
               r"|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))$"),
    list("-+0123456789."))


def _int_1_2(loader, node):
    text = loader.construct_scalar(node)
    if text.startswith("0o"):
        return int(text[2:], 8)
    return int(text, 0) if text.startswith("0x") else int(text, 10)


_Loader.add_constructor("tag:yaml.org,2002:int", _int_1_2)


def _env_str(loader, node):
    text = loader.construct_scalar(node)
    return EnvText(text, node.style) if ENV_REF in text else text


_Loader.add_constructor("tag:yaml.org,2002:str", _env_str)


class _Dumper(yaml.SafeDumper):
    """SafeDumper without aliases. Its YAML 1.1 resolver quotes every string that a YAML 1.1
    or 1.2 reader could take for something else (``'on'``, ``'1:20'``)."""

    def ignore_aliases(self, data) -> bool:
        return True


def _str(dumper: yaml.SafeDumper, data: str):
    style = "|" if "\n" in data else None
    if isinstance(data, EnvText) and data.style is not None:
        # The pasted value is read in the context it was written for: quotes kept, a block
        # stays a block.
        style = "|" if data.style == ">" else data.style
    return dumper.represent_scalar("tag:yaml.org,2002:str", str(data), style=style)


_Dumper.add_representer(str, _str)
_Dumper.add_representer(EnvText, _str)


def load(text: str, source: str = "CONFIG") -> object:
    """Parse YAML text. Raises :class:`YamlError` naming ``source``, the line and the column."""
    try:
        return yaml.load(text, Loader=_Loader)   # noqa: S506 - a SafeLoader subclass
    except YamlError as e:
        raise YamlError(f"{source}: not valid YAML: {e}") from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark is not None else ""
        what = getattr(e, "problem", None) or str(e)
        context = getattr(e, "context", None)
        raise YamlError(f"{source}: not valid YAML: {where}{what}"
                        + (f" ({context})" if context else "")) from None


def dump(data: object, header: str = "") -> str:
    """YAML text for ``data``, keys in order, multi-line strings as ``|`` blocks; ``header``
    (comment lines, each starting with ``#``) goes first."""
    body = yaml.dump(data, Dumper=_Dumper, sort_keys=False, allow_unicode=True,
                     default_flow_style=False, width=1 << 16, indent=2)
    return header + body
