""":class:`ConfigError`, without the schema: a command that only finds berth.toml (``berth
run`` before its front listens, :func:`berth.paths.find_config`) can raise and catch it
without loading pydantic."""

from __future__ import annotations

import re

__all__ = ["ConfigError", "said_once"]

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
