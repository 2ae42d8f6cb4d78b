""":class:`ConfigError`, without the schema: a command that only finds berth.toml (``berth
run`` before its front listens, :func:`berth.paths.find_config`) can raise and catch it
without loading pydantic."""

from __future__ import annotations

__all__ = ["ConfigError"]


class ConfigError(ValueError):
    """A config that cannot be used. ``source`` is the file (or ``berth.toml``), ``problems``
    lists ``(key path, message)`` pairs. ``str()`` is one line when the file itself is the
    problem (missing, unreadable, not TOML: key paths in parentheses), e.g.
    ``/etc/berth/berth.toml: no such file (named by BERTH_CONFIG)`` or
    ``berth.toml: (toml): Expected '=' after a key (at line 2, column 5)``; otherwise a count, then one
    indented line per problem."""

    def __init__(self, source: str, problems: list[tuple[str, str]]):
        self.source = source
        self.problems = problems
        if len(problems) == 1 and problems[0][0].startswith("("):
            key, message = problems[0]
            super().__init__(f"{source}: {message}" if key == "(file)" else
                             f"{source}: {key}: {message}")
            return
        lines = "\n".join(f"  {k}: {m}" for k, m in problems)
        super().__init__(f"{source}: {len(problems)} problem(s)\n{lines}")
