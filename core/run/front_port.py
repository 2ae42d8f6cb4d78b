"""The front's port, taken by something that is not a listener: wait for it, don't exit.

A port another process *listens* on stays taken: the run exits 2 at once, naming it. A port that
is only some connection's local port (an outgoing connection the kernel gave it to, from the
ephemeral range) or a closed connection's ``TIME_WAIT`` (60 s on Linux) is free again soon,
and a run started on it (a port a caller chose by ``bind(0)`` and closed, say, on a busy
machine) waited for it rather than failing its start: before, the run exited 2 and the engine
never came up. ``SO_REUSEADDR``, which the front's listener sets, does not cover either case on
Linux: the other socket would need it too, and a client's socket has not set it.

Whether a listener holds the port is read from ``/proc/net/tcp`` and ``/proc/net/tcp6``
(:func:`berth.exposed.listener_on`).
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import time

from berth.exposed import cannot_listen, listener_on
from berth.front import Front

__all__ = ["PORT_WAIT_S", "listen_front", "listener_on"]

log = logging.getLogger("berth.run")

#: Seconds a run waits for its front's port while only a connection holds it: a ``TIME_WAIT``
#: (Linux's ``TCP_TIMEWAIT_LEN``, 60 s) and a little more.
PORT_WAIT_S = 75.0
#: The first and the longest pause between two tries to listen (seconds).
FIRST_PAUSE_S, MAX_PAUSE_S = 0.05, 1.0


async def listen_front(front: Front, address: str, stop: asyncio.Event,
                       wait_s: float = PORT_WAIT_S) -> bool:
    """Start ``front`` (its ``--front`` is ``address``, ``host:port``). True once it listens;
    False, with the reason logged, when it cannot: the port has a listener (at once), it is
    still held by a connection after ``wait_s`` seconds, another error, or ``stop`` was set
    while waiting. Logs once that it waits, naming the port."""
    deadline = time.monotonic() + wait_s
    pause, waiting = FIRST_PAUSE_S, False
    while True:
        try:
            await front.start()
            if waiting:
                log.info("the front's port %d is free: the front listens on %s", front.port,
                         address)
            return True
        except OSError as e:
            if e.errno != errno.EADDRINUSE or listener_on(front.port):
                log.error("%s", cannot_listen(f"--front {address}", address, e))
                return False
            if time.monotonic() >= deadline:
                log.error("--front %s: cannot listen: port %d is still held by a connection "
                          "after %g s", address, front.port, wait_s)
                return False
            if not waiting:
                waiting = True
                log.warning("the front's port %d is held by a connection, not a listener (an "
                            "outgoing connection's local port, or TIME_WAIT); waiting up to %g s "
                            "for it", front.port, wait_s)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), min(pause, max(0.0, deadline - time.monotonic())))
        if stop.is_set():
            return False
        pause = min(MAX_PAUSE_S, pause * 2)
