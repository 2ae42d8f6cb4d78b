"""The supervisord host plugin: ownership for berthd, stop and start for the listener.

Source: issue 7; reference/hosts.md "XML-RPC", "Orphans"; seed 002 rule 6; berth_plugins
hookspecs ``berth_configure``, ``berth_vouch``, ``berth_drain``, ``berth_start``.

Registered through berth-gpu's entry point (``[project.entry-points.berth] supervisor``), so
berthd, ``berth run`` and the listener all load it. It carries out the mechanism ``supervisor``
(``berth_mechanisms``, checked against engine entries at startup), does nothing until
:func:`berth_configure` hands it a config, and imports supervisor's package only when it makes
a call.

- ``berth_vouch``: berthd asks it when the listener, which is neither a program's process nor
  its parent, adopts or attaches a supervisord program's PID. It vouches only when
  ``getProcessInfo`` of the program the engine entry names shows the same PID and a start time
  within :data:`START_TOLERANCE_S` of psutil's.
- ``berth_drain`` (mechanism ``"supervisor"``): ``stopProcess`` through supervisord, never a
  signal from Berth (rule 6). ``berth_start``: ``startProcess``.

The program's name comes from ``ctx.options["supervisor_program"]`` (actions) or from the
``supervisor`` key of the engine's berth.toml entry (vouch).
"""

from __future__ import annotations

import asyncio
import logging

from berth_plugins.hookspecs import ActionContext, MechanismError, hookimpl

from .rpc import Endpoint, Supervisor, SupervisorError, SupervisorUnavailable

__all__ = ["MECHANISM", "START_TOLERANCE_S", "configure", "programs", "vouches"]

log = logging.getLogger("berth.hosts.supervisor")

#: The ``host`` a listener names when it adopts or attaches, and the action mechanism.
MECHANISM = "supervisor"
#: supervisord's ``start`` is ``int(time.time())`` taken just before the fork; psutil's start
#: time is the boot time (itself whole seconds) plus the process's start in clock ticks. The two
#: differ by less than one second of truncation on each side plus the spawn latency.
START_TOLERANCE_S = 1.5
#: Bound on the vouch's RPC call (berthd answers an attach meanwhile), seconds.
VOUCH_TIMEOUT_S = 1.0

_state: dict = {"supervisor": None, "programs": {}}


def configure(config, env=None) -> None:
    """Take berth.toml: the RPC endpoint and the engines that name a supervisord program. With
    no endpoint anywhere but programs named, the plugin stays off and says so once."""
    progs = {name: e.supervisor for name, e in config.engines.items() if e.supervisor}
    _state["programs"] = progs
    try:
        _state["supervisor"] = Supervisor(Endpoint.from_config(config, env))
    except ValueError as e:
        _state["supervisor"] = None
        if progs:
            log.warning("%s; supervisord programs (%s) cannot be vouched for", e,
                        ", ".join(sorted(progs.values())))


def programs() -> dict[str, str]:
    """Engine name -> supervisord program name, as configured."""
    return dict(_state["programs"])


def vouches(sup: Supervisor, program: str, pid: int, start_time: float) -> bool:
    """Does supervisord run ``program`` as ``pid``, started at ``start_time`` (seconds since
    the epoch)? False for another PID, a start time off by more than
    :data:`START_TOLERANCE_S`, an unknown program, or no answer (logged)."""
    try:
        info = sup.info(program)
    except (SupervisorError, SupervisorUnavailable) as e:
        log.warning("cannot vouch for pid %s as %s: %s", pid, program, e)
        return False
    if info.pid != pid:
        log.warning("not vouching for pid %s: supervisord runs %s as pid %s (%s)", pid, program,
                    info.pid, info.statename)
        return False
    if abs(info.start - start_time) > START_TOLERANCE_S:
        log.warning("not vouching for pid %s: supervisord started %s at %s, the process started "
                    "at %.3f (a reused PID?)", pid, program, info.start, start_time)
        return False
    return True


@hookimpl
def berth_mechanisms() -> list[str]:
    return [MECHANISM]


@hookimpl
def berth_configure(config) -> None:
    configure(config)


@hookimpl
def berth_vouch(pid: int, start_time: float, engine: str, host: str | None) -> bool | None:
    if host != MECHANISM:
        return None
    program = _state["programs"].get(engine)
    sup = _state["supervisor"]
    if program is None or sup is None:
        log.warning("not vouching for pid %s: engine %r names no supervisord program in "
                    "berth.toml, or [hosts.supervisor] is not set", pid, engine)
        return False
    sup = Supervisor(sup.endpoint, timeout_s=VOUCH_TIMEOUT_S)
    return vouches(sup, program, pid, start_time)


def _program(ctx: ActionContext) -> str:
    name = ctx.options.get("supervisor_program") or _state["programs"].get(ctx.engine)
    if not name:
        raise MechanismError(MECHANISM, f"engine {ctx.engine!r} names no supervisord program "
                                        "(berth.toml: [engines.X] supervisor = \"program\")")
    return name


def _supervisor(ctx: ActionContext) -> Supervisor:
    sup = _state["supervisor"]
    if sup is None:
        raise MechanismError(MECHANISM, "supervisord's RPC endpoint is not configured "
                                        "([hosts.supervisor] url, or $SUPERVISOR_SERVER_URL)")
    return sup


async def _stop(ctx: ActionContext) -> None:
    name, sup = _program(ctx), _supervisor(ctx)
    try:
        await asyncio.to_thread(sup.stop, name, True, ctx.timeout_s)
    except SupervisorError as e:
        if e.fault != "NOT_RUNNING":          # already down: the drain is done
            raise MechanismError(MECHANISM, f"stopProcess({name!r}): {e.fault}: {e.detail}") from e
    except SupervisorUnavailable as e:
        raise MechanismError(MECHANISM, str(e)) from None


async def _start(ctx: ActionContext) -> None:
    name, sup = _program(ctx), _supervisor(ctx)
    try:
        await asyncio.to_thread(sup.start, name, False, ctx.timeout_s)
    except SupervisorError as e:
        if e.fault != "ALREADY_STARTED":
            raise MechanismError(MECHANISM, f"startProcess({name!r}): {e.fault}: {e.detail}") from e
    except SupervisorUnavailable as e:
        raise MechanismError(MECHANISM, str(e)) from None


@hookimpl
def berth_drain(ctx: ActionContext):
    return _stop(ctx) if ctx.mechanism == MECHANISM else None


@hookimpl
def berth_start(ctx: ActionContext):
    return _start(ctx) if ctx.mechanism == MECHANISM else None
