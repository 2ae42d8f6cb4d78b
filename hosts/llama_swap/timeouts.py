"""``healthCheckTimeout`` and ``unloadTimeout`` for a wrapped config.

Source: reference/llama-swap.md ("Relevant configuration keys", "Stopping", "Consequences for
a ``cmd`` wrapper"); ``berth run``'s stop sequence (:mod:`berth.run.main`, step 5; its flags in :mod:`berth.run.cli`).

- ``healthCheckTimeout`` (global; default 120 s, at least 15) bounds a start from spawn to a
  passing health check. Under Berth a start includes the wait for a lease (berthd may first park
  or drain another engine) as well as the load, so it is raised to at least
  :data:`MIN_HEALTH_CHECK_TIMEOUT_S`.
- ``unloadTimeout`` (global and per model; default 10 s; 0 means the global value) is how long
  llama-swap waits for ``cmd`` to exit after a TTL or API unload before it SIGKILLs the group.
  ``berth run``'s stop sequence (in-flight grace, SIGTERM to SIGKILL, the driver's word that
  the memory is free) must fit, so it is raised to at least :data:`MIN_UNLOAD_TIMEOUT_S`.
- A ``cmdStop`` that stops a container waits for the container first (``docker stop``'s
  default 10 s, or its ``-t``/``--time``), then ``berth run`` checks the memory: a warning
  suggests a timeout that covers both.
"""

from __future__ import annotations

import math
import os

from berth.run.cli import RunOptions

from . import command

__all__ = ["SettingError", "fit_timeouts", "MIN_HEALTH_CHECK_TIMEOUT_S", "MIN_UNLOAD_TIMEOUT_S",
           "STOP_SEQUENCE_S", "CONTAINER_TOOLS"]

#: The shortest ``healthCheckTimeout`` (s) a wrapped config keeps.
MIN_HEALTH_CHECK_TIMEOUT_S = 300
#: ``berth run``'s stop sequence with its default flags (s): 1 + 4 + 3.
STOP_SEQUENCE_S = RunOptions.stop_grace_s + RunOptions.term_grace_s + RunOptions.release_wait_s
#: The shortest ``unloadTimeout`` (s): the stop sequence and a margin, never below
#: llama-swap's own default of 10 s.
MIN_UNLOAD_TIMEOUT_S = max(10, math.ceil(STOP_SEQUENCE_S + 1))
#: Container runtimes whose ``run`` starts an engine outside ``berth run``'s process tree.
CONTAINER_TOOLS = ("docker", "podman", "nerdctl")
_HEALTH_CHECK_DEFAULT_S, _HEALTH_CHECK_FLOOR_S, _UNLOAD_DEFAULT_S = 120, 15, 10
_CONTAINER_STOP_DEFAULT_S = 10


class SettingError(ValueError):
    """A timeout that is not a number of seconds; the message names the key."""


def int_value(value, where: str, macros: command.Macros, default: int) -> int:
    """An integer setting, macros expanded (llama-swap expands them in every value). Raises
    :class:`SettingError` naming ``where``."""
    if value is None:
        return default
    if isinstance(value, bool):
        raise SettingError(f"{where}: expected a number of seconds, got {value!r}")
    if isinstance(value, int):
        return value
    try:
        return int(command.expand(str(value), macros))
    except ValueError:
        raise SettingError(f"{where}: expected a number of seconds, got {value!r}") from None


def _container_stop_s(argv: list[str]) -> int | None:
    """How long a container ``stop`` waits (s), or ``None`` if ``argv`` is not one."""
    if len(argv) < 2 or os.path.basename(argv[0]) not in CONTAINER_TOOLS or "stop" not in argv[1:3]:
        return None
    for i, word in enumerate(argv):
        for flag in ("-t", "--time", "--timeout"):
            value = argv[i + 1] if word == flag and i + 1 < len(argv) else (
                word.split("=", 1)[1] if word.startswith(flag + "=") else None)
            if value is not None and value.isdigit():
                return int(value)
    return _CONTAINER_STOP_DEFAULT_S


def fit_timeouts(doc: dict, models: list[tuple[str, dict, command.Macros]],
                 min_health_check_timeout_s: int = MIN_HEALTH_CHECK_TIMEOUT_S) -> list[str]:
    """Raise the timeouts of ``doc`` in place; ``models``: ``(id, its mapping, its macro
    scope)``. Returns the warnings (one per change, with the reason)."""
    warnings = []
    globals_ = list((doc.get("macros") or {}).items())
    hct = max(int_value(doc.get("healthCheckTimeout"), "healthCheckTimeout", globals_,
                        _HEALTH_CHECK_DEFAULT_S), _HEALTH_CHECK_FLOOR_S)
    if hct < min_health_check_timeout_s:
        warnings.append(
            f"healthCheckTimeout: {hct} s raised to {min_health_check_timeout_s} s: a start now "
            f"includes the wait for a lease (berthd may first park or drain another engine) as "
            f"well as the load, and llama-swap kills a start that runs past it")
        if "healthCheckTimeout" in doc:
            doc["healthCheckTimeout"] = min_health_check_timeout_s
        else:                                   # first, where people look for it
            rest = dict(doc)
            doc.clear()
            doc.update({"healthCheckTimeout": min_health_check_timeout_s, **rest})
    glob = int_value(doc.get("unloadTimeout"), "unloadTimeout", globals_, _UNLOAD_DEFAULT_S)
    glob = glob or _UNLOAD_DEFAULT_S
    if glob < MIN_UNLOAD_TIMEOUT_S:
        warnings.append(
            f"unloadTimeout: {glob} s raised to {MIN_UNLOAD_TIMEOUT_S} s: berth run's stop "
            f"sequence (in-flight grace, SIGTERM to SIGKILL, driver check) takes up to "
            f"{STOP_SEQUENCE_S:g} s, and llama-swap SIGKILLs it when the timeout runs out")
        doc["unloadTimeout"] = glob = MIN_UNLOAD_TIMEOUT_S
    for mid, conf, scope in models:
        own = int_value(conf.get("unloadTimeout"), f"models.{mid}.unloadTimeout", scope, 0)
        if own and own < MIN_UNLOAD_TIMEOUT_S:
            warnings.append(f"models.{mid}.unloadTimeout: {own} s raised to "
                            f"{MIN_UNLOAD_TIMEOUT_S} s (berth run's stop sequence takes up to "
                            f"{STOP_SEQUENCE_S:g} s)")
            conf["unloadTimeout"] = own = MIN_UNLOAD_TIMEOUT_S
        stop_s = _container_stop_s(command.argv(str(conf.get("cmdStop") or ""), scope))
        want = None if stop_s is None else stop_s + math.ceil(RunOptions.release_wait_s + 1)
        if want is not None and (own or glob) < want:
            warnings.append(
                f"models.{mid}.unloadTimeout: {own or glob} s may be short: its cmdStop waits "
                f"up to {stop_s} s for the container, then berth run confirms the memory free; "
                f"consider unloadTimeout: {want}")
    return warnings
