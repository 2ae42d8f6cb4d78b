""":class:`ConfigError`, without the schema: a command that only finds berth.toml (``berth
run`` before its front listens, :func:`berth.paths.find_config`) can raise and catch it
without loading pydantic."""

from __future__ import annotations

import re

__all__ = ["ConfigError", "said_once", "in_words"]

#: A message's own label: the value checks name what they read ("size: ...", "duration: ...",
#: "read_interval: ..."), which the key path before it already says.
_LABEL = re.compile(r"^([A-Za-z0-9_.\[\]\-]+): ")
#: The labels the shared value checks give whatever key they read (berth.config.values).
_GENERIC = {"size", "duration", "total"}


def said_once(key: str, message: str) -> str:
    """``message`` without a leading label that repeats ``key`` (a key path such as
    ``policy.release_grace``): the whole path, its last part, or a value check's generic
    label (``size``, ``duration``, ``total``), so ``policy.ram_budget: ram_budget: '5' has no
    unit`` reads ``policy.ram_budget: '5' has no unit``."""
    while (m := _LABEL.match(message)) is not None:
        label = m.group(1)
        if not (label in _GENERIC or label == key or key.endswith("." + label)):
            break
        message = message[m.end():]
    return message


def _bound(ctx: dict, key: str) -> str:
    v = ctx.get(key)
    return f"{v:g}" if isinstance(v, float) else str(v)


#: pydantic's error types in Berth's words (its own, "Input should be ...", name Python types):
#: type -> the message, formatted with the error's ``ctx`` (bounds, lengths, choices).
_WORDS = {
    "missing": "missing: this key is required",
    "int_type": "expected a whole number", "int_parsing": "expected a whole number",
    "int_from_float": "expected a whole number", "float_type": "expected a number",
    "float_parsing": "expected a number", "finite_number": "expected a finite number",
    "bool_type": "expected true or false", "bool_parsing": "expected true or false",
    "string_type": "expected a string", "list_type": "expected a list",
    "dict_type": "expected a table", "none_required": "expected nothing here",
    "greater_than": "must be more than {gt}", "greater_than_equal": "must be {ge} or more",
    "less_than": "must be less than {lt}", "less_than_equal": "must be at most {le}",
    "string_too_short": "must be at least {min_length} characters",
    "string_too_long": "must be at most {max_length} characters",
    "too_short": "must have at least {min_length} item(s)",
    "too_long": "must have at most {max_length} items",
    "string_pattern_mismatch": "is not allowed here (it must match {pattern})",
    "enum": "expected {expected}", "literal_error": "expected {expected}",
    "extra_forbidden": "unknown key",
}


#: The patterns Berth's fields use, in words (a regular expression is not a user's word).
_PATTERNS = {r"^[^\s\x00-\x1f\x7f]+$": "must have no spaces or control characters",
             r"^[0-9a-zA-Z_-]+$": "may have only letters, digits, '_' and '-'"}


def in_words(err: dict) -> str:
    """One pydantic error (an item of ``ValidationError.errors()``) as Berth says it: what the
    field expects (``expected a whole number``, ``must be at most 1000``, ``expected one of
    'scan' or 'strict'``), never pydantic's "Input should be ..."; a validator's own message
    (``Value error, ...``) as it wrote it. The caller adds the key path and the value (never a
    secret's). Source: review of user-facing text (pydantic's words reached users)."""
    kind, msg = err.get("type", ""), err.get("msg", "")
    if kind in ("value_error", "assertion_error"):
        return msg.removeprefix("Value error, ").removeprefix("Assertion failed, ")
    pattern = (err.get("ctx") or {}).get("pattern")
    if kind == "string_pattern_mismatch" and pattern in _PATTERNS:
        return _PATTERNS[pattern]
    words = _WORDS.get(kind)
    if words is None:
        return "expected " + msg.removeprefix("Input should be ") \
            if msg.startswith("Input should be ") else msg
    ctx = {k: _bound(err.get("ctx") or {}, k) for k in (err.get("ctx") or {})}
    try:
        return words.format(**ctx)
    except (KeyError, IndexError):
        return msg


class ConfigError(ValueError):
    """A config that cannot be used. ``source`` is the file (or ``berth.toml``), ``problems``
    lists ``(key path, message)`` pairs. ``str()`` is one line when the file itself is the
    problem (missing, unreadable, not TOML: key paths in parentheses), e.g.
    ``/etc/berth/berth.toml: no such file (named by BERTH_CONFIG)`` or
    ``berth.toml: (toml): Expected '=' after a key (at line 2, column 5)``; otherwise a count, then one
    indented line per problem."""

    def __init__(self, source: str, problems: list[tuple[str, str]]):
        self.source = source
        problems = [(k, said_once(k, m)) for k, m in problems]
        self.problems = problems
        if len(problems) == 1 and problems[0][0].startswith("("):
            key, message = problems[0]
            super().__init__(f"{source}: {message}" if key == "(file)" else
                             f"{source}: {key}: {message}")
            return
        lines = "\n".join(f"  {k}: {m}" for k, m in problems)
        super().__init__(f"{source}: {len(problems)} problem(s)\n{lines}")
