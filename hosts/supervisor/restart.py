"""A supervisord program that supervisord restarts keeps its lease's room (issue 12 case 2).

Source: supervisor's ``process.py`` (``autorestart`` acts at the next pass of supervisord's loop;
a start that dies before ``startsecs`` goes to BACKOFF, waits 1, 2, … s, and after
``startretries`` tries gives up into FATAL); hosts/supervisor/README.md "A crash that
supervisord's ``autorestart`` repairs".

The listener asks berthd for every lease with a restart hold (:func:`restart_grace` seconds):
berthd keeps an active lease's shares when its PID dies on its own, and the listener attaches
the new PID, or releases the lease when :func:`coming_back` says supervisord is not bringing the
program back. ``getAllConfigInfo`` does not give ``autorestart``, so an EXITED program counts as
coming back for :data:`EXITED_SETTLE_S`.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING

from .rpc import ProcessInfo, Supervisor, SupervisorError, SupervisorUnavailable

if TYPE_CHECKING:
    from .listener import Program

__all__ = ["EXITED_SETTLE_S", "coming_back", "restart_grace"]

log = logging.getLogger("berth.hosts.supervisor")

#: supervisord acts on ``autorestart`` at its next loop pass (it waits at most 1 s for I/O);
#: a program still EXITED this many seconds after the listener first saw it is not coming back.
EXITED_SETTLE_S = 3.0
#: Added to the time supervisord's own tries can take (the restart hold's bound), seconds.
RESTART_MARGIN_S = 5.0
#: The longest restart hold asked for, seconds.
RESTART_MAX_S = 300.0


def coming_back(prog: "Program", info: ProcessInfo) -> bool:
    """Is supervisord restarting the program whose lease held ``prog.pid``? STARTING, BACKOFF,
    RUNNING under a new PID, or EXITED for less than :data:`EXITED_SETTLE_S` (the program is
    kicked again then, so the next sync decides). Call it from the program's sync, on the
    running loop."""
    if info.statename != "EXITED":
        prog.exited_at = None
        return info.statename in ("STARTING", "BACKOFF") or (
            info.statename == "RUNNING" and info.pid != prog.pid)
    loop = asyncio.get_running_loop()
    if prog.exited_at is None:
        prog.exited_at = loop.time()
    if loop.time() - prog.exited_at < EXITED_SETTLE_S:
        loop.call_later(EXITED_SETTLE_S, prog.kick.set)
        return True
    return False


async def restart_grace(sup: Supervisor, prog: "Program") -> float:
    """The restart hold to ask berthd for, in seconds: the longest supervisord's own tries can
    take to bring the program back (``startretries`` + 1 starts of ``startsecs`` each, and the
    backoffs of 1, 2, … s between them), plus :data:`RESTART_MARGIN_S`, at most
    :data:`RESTART_MAX_S`; read once per program. 0 (no hold) when supervisord's settings cannot
    be read."""
    if prog.restart_grace_s is None:
        try:
            conf = await asyncio.to_thread(sup.config, prog.name)
            tries = int(conf["startretries"]) + 1
            grace = tries * int(conf["startsecs"]) + tries * (tries - 1) / 2
            prog.restart_grace_s = min(RESTART_MAX_S, grace + RESTART_MARGIN_S)
        except (SupervisorError, SupervisorUnavailable, KeyError, TypeError, ValueError) as e:
            log.warning("%s: cannot read supervisord's settings for %s (%s); a crash will give "
                        "its room up at once", prog.engine, prog.name, e)
            return 0.0
    return prog.restart_grace_s
