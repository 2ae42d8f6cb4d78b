"""The control socket's bounds (issue 36, "A flood on the control socket").

berthd started with the soft descriptor limit most services get (1024, systemd's default): a
member of the socket group opened idle connections until the socket stopped accepting, root's
``berth status`` failed 15 of 15 tries, and berthd wrote 15,476 tracebacks (25 MB of log). So:

1. at start, ``RLIMIT_NOFILE``'s soft limit is raised to its hard limit
   (:func:`raise_fd_limit`), said in the log;
2. each connection's peer uid is read (``SO_PEERCRED``); a uid other than root's and berthd's
   own may hold at most :data:`PER_UID` connections, and all such uids together the bound
   (:func:`~berth.front.listen.connections_from_fd_limit`) less :data:`KEPT_FOR_OPERATORS`: that
   room is kept for root and berthd's own user, whose connections are bounded only by the whole;
   a connection over its bound is answered 503 at once and closed;
3. a connection that sends no request head within ``head_timeout_s`` is answered 408 and closed,
   one kept alive idle for ``idle_timeout_s`` is closed (the board's :class:`_Guarded`); a request
   being answered (a long poll) is never timed, but its body is: one not all in
   ``idle_timeout_s`` after its head (fewer bytes than its Content-Length said) is logged,
   answered 408 and its connection closed (:func:`berth.daemon.api_bodies.read_json`), and
   no other connection waits on it;
4. connections refused at a bound are logged at most once per :data:`REFUSED_LOG_EVERY_S`, with
   the count and the uids; "Too many open files" on accept likewise (the front's throttle,
   :func:`~berth.front.listen.throttle_fd_logs`).
"""

from __future__ import annotations

import asyncio
import logging
import os
import resource
import socket
import struct
import time
from dataclasses import dataclass, field

from aiohttp import web
from berth.daemon.board_web.listen import Limits, _503, _Guarded
from berth.front.listen import throttle_fd_logs

__all__ = ["PER_UID", "KEPT_FOR_OPERATORS", "ControlBounds", "GuardedUnixSite", "raise_fd_limit",
           "peer_uid"]

log = logging.getLogger("berth.daemon")

#: Connections one uid other than root's and berthd's own may hold at once: room for many runs
#: (each holds one or two: its lease's long poll and a call), none for a flood.
PER_UID = 128
#: Connections of the bound kept for root and berthd's own user whatever the others hold.
KEPT_FOR_OPERATORS = 64
#: Seconds between two log lines about connections refused at a bound.
REFUSED_LOG_EVERY_S = 60.0


def raise_fd_limit() -> tuple[int, int]:
    """Raise ``RLIMIT_NOFILE``'s soft limit to its hard limit; ``(before, after)`` soft limits.
    A limit that cannot be raised is left as it is (the bounds are computed from what is)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != soft:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
        except (ValueError, OSError):
            return soft, soft
    return soft, resource.getrlimit(resource.RLIMIT_NOFILE)[0]


def peer_uid(transport: asyncio.BaseTransport) -> int | None:
    """The uid of the process at the other end of a Unix socket (``SO_PEERCRED``); ``None``
    where the transport has no Unix socket (TCP) or the read fails."""
    sock = transport.get_extra_info("socket")
    if sock is None or sock.family != socket.AF_UNIX:
        return None
    try:
        raw = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    except OSError:
        return None
    return struct.unpack("3i", raw)[1]


@dataclass
class ControlBounds:
    """Open connections per peer uid, and the bounds they are held to (see the module
    docstring). ``total``: the whole bound (connections); ``per_uid``: one other uid's bound;
    ``kept``: room kept for ``operators`` (uids: root and berthd's own user)."""

    total: int
    per_uid: int = PER_UID
    kept: int = KEPT_FOR_OPERATORS
    operators: frozenset[int] = field(
        default_factory=lambda: frozenset({0, os.geteuid()}))
    open: dict[int | None, int] = field(default_factory=dict)
    refused: dict[int | None, int] = field(default_factory=dict)
    _said_at: float = float("-inf")

    def admit(self, uid: int | None) -> bool:
        """Count a new connection of ``uid`` if its bounds allow it; whether they did."""
        everyone = sum(self.open.values())
        if uid in self.operators:
            ok = everyone < self.total
        else:
            others = everyone - sum(n for u, n in self.open.items() if u in self.operators)
            ok = (self.open.get(uid, 0) < self.per_uid and everyone < self.total
                  and others < max(1, self.total - self.kept))
        if ok:
            self.open[uid] = self.open.get(uid, 0) + 1
        else:
            self.refused[uid] = self.refused.get(uid, 0) + 1
            self._say()
        return ok

    def gone(self, uid: int | None) -> None:
        """A counted connection of ``uid`` closed."""
        n = self.open.get(uid, 0) - 1
        if n > 0:
            self.open[uid] = n
        else:
            self.open.pop(uid, None)

    def _say(self) -> None:
        now = time.monotonic()
        if now - self._said_at < REFUSED_LOG_EVERY_S:
            return
        first = self._said_at == float("-inf")
        self._said_at = now
        who = ", ".join(f"uid {u}: {n}" for u, n in sorted(self.refused.items(),
                                                            key=lambda kv: -kv[1])[:5])
        log.warning("control socket: %d connection(s) refused at their bound (%d per uid, %d "
                    "kept for root and berthd's user, %d in all)%s: %s", sum(self.refused.values()),
                    self.per_uid, self.kept, self.total,
                    "" if first else f" in the last {REFUSED_LOG_EVERY_S:g} s", who)
        self.refused.clear()


class _ControlGuarded(_Guarded):
    """The board's guarded handler, with the control socket's per-uid bounds."""

    __slots__ = ("_berth_bounds", "_berth_uid", "_berth_counted")

    def __init__(self, server: web.Server, limits: Limits, bounds: ControlBounds, **kwargs):
        super().__init__(server, limits, **kwargs)
        self._berth_bounds = bounds
        self._berth_uid: int | None = None
        self._berth_counted = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._berth_uid = peer_uid(transport)
        if self._berth_bounds.admit(self._berth_uid):
            self._berth_counted = True
            super().connection_made(transport)
            return
        web.RequestHandler.connection_made(self, transport)
        transport.write(_503)
        self.force_close()

    def connection_lost(self, exc: BaseException | None) -> None:
        if self._berth_counted:
            self._berth_counted = False
            self._berth_bounds.gone(self._berth_uid)
        super().connection_lost(exc)


class GuardedUnixSite(web.UnixSite):
    """berthd's control socket: a :class:`aiohttp.web.UnixSite` whose connections are held to
    ``limits`` (head and idle times) and ``bounds`` (per peer uid). ``handler_args`` are the
    runner's (``access_log`` and the like)."""

    def __init__(self, runner: web.AppRunner, path: str, limits: Limits, bounds: ControlBounds,
                 handler_args: dict | None = None, **kwargs):
        super().__init__(runner, path, **kwargs)
        self._limits, self._bounds = limits, bounds
        self._handler_args = dict(handler_args or {})

    async def start(self) -> None:
        throttle_fd_logs()
        await web.BaseSite.start(self)
        loop = asyncio.get_running_loop()
        server = self._runner.server
        assert server is not None

        def factory() -> _ControlGuarded:
            return _ControlGuarded(server, self._limits, self._bounds, loop=loop,
                                   **self._handler_args)
        self._server = await loop.create_unix_server(factory, self._path, backlog=self._backlog)
