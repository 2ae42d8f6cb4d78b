"""A listener: the socket every front-built HTTP server accepts on, and the limits it keeps on its
clients (issue 26 "Every listener closes slow and idle clients").

One :class:`Listener` serves one address for one *handler* (a :class:`berth.front.Front`, the
gateway, the gateway's ComfyUI port): each accepted connection is a
:class:`berth.front.server.ClientConnection`, which parses requests and hands them to the
handler's ``_fast(req, conn) -> bool`` (answer from the parser's callback, or False) and
``_handle(req, conn) -> bool`` (answer in the connection's task; whether the connection may
carry another request).

The limits (:class:`Limits`):

1. a request head (request line and headers) not complete ``head_timeout_s`` after its first
   byte, or a new connection that sent nothing for as long, is answered 408 and closed;
2. a kept-alive connection idle (nothing being answered, no byte of a new request) for
   ``idle_timeout_s`` is closed, and so is one whose request body stops arriving for as long;
3. at most ``max_connections`` client connections are open (default from the process's file
   descriptor limit, :func:`connections_from_fd_limit`). A connection beyond it first takes the
   place of the one that has waited longest for a request head (or sat idle), if that one has
   waited :data:`EVICT_AFTER_S` or more, so slow clients cannot starve quick ones; failing that,
   it is answered 503 at once and closed;
4. "Too many open files" (and asyncio's "out of system resource" on accept) is logged at most
   once per :data:`FD_LOG_EVERY_S`, with the count of those left out, not once per accept.

Times are the event loop's clock (monotonic seconds). The limits are checked every
:data:`SWEEP_S` seconds by one task per listener, so a connection is closed at most that much
after its limit; nothing per request is scheduled.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import resource
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable

from .rules import error_answer
from .upstream import Pool

if TYPE_CHECKING:
    from .server import ClientConnection, Request

log = logging.getLogger("berth.front")

DEFAULT_HEAD_TIMEOUT_S = 10.0
DEFAULT_IDLE_TIMEOUT_S = 60.0
#: File descriptors kept for everything but client connections (logs, berthd's socket, files).
FD_RESERVE = 64
#: A connection waiting this long for a request head may give its place to a new one.
EVICT_AFTER_S = 1.0
SWEEP_S = 0.5
FD_LOG_EVERY_S = 60.0


def connections_from_fd_limit() -> int:
    """The default bound on client connections: half of what the file descriptor limit
    (``RLIMIT_NOFILE``, soft) leaves after :data:`FD_RESERVE`, since each client connection may
    hold a connection to the engine too; at least 16."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        soft = 1 << 20
    return max(16, (soft - FD_RESERVE) // 2)


@dataclass(frozen=True)
class Limits:
    """What a listener allows its clients. ``head_timeout_s``: seconds for a request head;
    ``idle_timeout_s``: seconds a kept-alive connection (or a request body) may stay silent;
    ``max_connections``: open client connections (None: :func:`connections_from_fd_limit`)."""

    head_timeout_s: float = DEFAULT_HEAD_TIMEOUT_S
    idle_timeout_s: float = DEFAULT_IDLE_TIMEOUT_S
    max_connections: int | None = None

    def __post_init__(self) -> None:
        for name in ("head_timeout_s", "idle_timeout_s"):
            v = getattr(self, name)
            if not v > 0:
                raise ValueError(f"{name} must be more than 0 seconds, got {v!r}")
        if self.max_connections is not None and self.max_connections < 1:
            raise ValueError(f"max_connections must be at least 1, got {self.max_connections}")

    @property
    def connections(self) -> int:
        return self.max_connections or connections_from_fd_limit()


class _FdLogThrottle(logging.Filter):
    """Lets one "too many open files" record through per :data:`FD_LOG_EVERY_S` and counts the
    rest (they come once per accept, or per request, while the process is out of descriptors)."""

    MARKS = ("Too many open files", "out of system resource")

    def __init__(self) -> None:
        super().__init__()
        self.last = float("-inf")
        self.left_out = 0

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno < logging.WARNING:
            return True
        text = record.getMessage()
        if record.exc_info and record.exc_info[1] is not None:
            text += " " + str(record.exc_info[1])
        if not any(m in text for m in self.MARKS):
            return True
        now = time.monotonic()
        if now - self.last < FD_LOG_EVERY_S:
            self.left_out += 1
            return False
        self.last = now
        if self.left_out:
            record.msg = f"{record.msg} ({self.left_out} more like it left out of the log in " \
                         f"the last {FD_LOG_EVERY_S:g} s)"
            self.left_out = 0
        return True


#: One throttle for the process: the descriptor limit is the process's.
FD_LOG = _FdLogThrottle()
_THROTTLED = ("asyncio", "berth.front", "berth.gateway")


def throttle_fd_logs() -> None:
    """Install :data:`FD_LOG` on the loggers that report accepts and connects (idempotent)."""
    for name in _THROTTLED:
        lg = logging.getLogger(name)
        if FD_LOG not in lg.filters:
            lg.addFilter(FD_LOG)


class Listener:
    """Accepts client connections for ``handler`` on ``host:port`` under ``limits``.

    ``pool``: the engine connections (and the read buffer) the handler's connections share.
    ``hand_off(req)``: for a request whose head is complete, a protocol factory (an aiohttp
    ``web.Server``) to give the connection to, or None to keep it (see
    :meth:`berth.front.server.ClientConnection.on_headers_complete`).

    Counters: ``accepted``, ``refused`` (503 at the bound), ``evicted`` (gave their place),
    ``head_timeouts``, ``idle_timeouts``, ``handed_off``."""

    def __init__(self, handler, host: str, port: int, *, name: str, pool: Pool,
                 limits: Limits | None = None,
                 hand_off: Callable[["Request"], Callable | None] | None = None):
        self.handler, self.host, self.port, self.name = handler, host, port, name
        self.pool = pool
        self.limits = limits or Limits()
        self.max_connections = self.limits.connections
        self.hand_off = hand_off
        self.conns: set[ClientConnection] = set()
        #: connections waiting for a request head or idle, oldest first -> since when
        self.waiting: dict[ClientConnection, float] = {}
        self.loop: asyncio.AbstractEventLoop | None = None
        self._server: asyncio.Server | None = None
        self._sweeper: asyncio.Task[None] | None = None
        self._swept: asyncio.Task[None] | None = None     # cancelled by close, not yet awaited
        self.lingering = 0       # refused connections still reading what the client sends
        self.accepted = self.refused = self.evicted = 0
        self.head_timeouts = self.idle_timeouts = self.handed_off = 0

    async def start(self) -> None:
        """Listen. Raises ``OSError`` if the address is taken."""
        from .server import ClientConnection
        throttle_fd_logs()
        self.loop = asyncio.get_running_loop()
        self._server = await self.loop.create_server(lambda: ClientConnection(self), self.host,
                                                     self.port, reuse_address=True)
        self.port = self._server.sockets[0].getsockname()[1]
        self._sweeper = self.loop.create_task(self._sweep())

    @property
    def listening(self) -> bool:
        return self._server is not None

    def close(self) -> asyncio.Server | None:
        """Stop accepting and checking limits; returns the server to await ``wait_closed`` on
        (None when not listening). Open connections stay."""
        server, self._server = self._server, None
        if self._sweeper is not None:
            self._sweeper.cancel()
            self._swept, self._sweeper = self._sweeper, None
        if server is not None:
            server.close()
        return server

    async def wait_closed(self, server: asyncio.Server | None) -> None:
        """Wait for ``server`` (what :meth:`close` returned) and the limit checks to end, so
        no task of the listener outlives its owner's stop."""
        swept, self._swept = self._swept, None
        if swept is not None:
            with contextlib.suppress(asyncio.CancelledError):
                await swept
        if server is not None:
            await server.wait_closed()

    def close_clients(self) -> None:
        """Close every client connection (cancelling its task)."""
        for conn in list(self.conns):
            conn.close()
            if conn.task is not None:
                conn.task.cancel()

    # ---- admission -----------------------------------------------------------------------------

    def admit(self, conn: "ClientConnection") -> bool:
        """A new connection: True to serve it (it is counted and waits for its head), False
        when the bound is reached and no waiting connection can give its place."""
        now = self.loop.time() if self.loop is not None else time.monotonic()
        if len(self.conns) >= self.max_connections and not self._evict(now):
            self.refused += 1
            if self.refused == 1 or self.refused % 1000 == 0:
                log.warning("%s: %d client connections open, the most it takes; new ones get "
                            "a 503 (refused so far: %d)", self.name, len(self.conns),
                            self.refused)
            return False
        self.accepted += 1
        self.conns.add(conn)
        self.waiting[conn] = now
        return True

    def _evict(self, now: float) -> bool:
        for conn, since in self.waiting.items():
            if now - since < EVICT_AFTER_S:
                return False          # the oldest is young: so are the others
            self.evicted += 1
            conn.expire(in_head=conn.head_at is not None or not conn.served)
            return True
        return False

    def forget(self, conn: "ClientConnection") -> None:
        self.conns.discard(conn)
        self.waiting.pop(conn, None)

    def refusal(self) -> bytes:
        return error_answer(503, "too_many_connections", f"{self.name}: {len(self.conns)} client "
                            "connections are open, the most this listener takes; try again",
                            "unavailable_error", close=True)

    # ---- the limits ----------------------------------------------------------------------------

    async def _sweep(self) -> None:
        while True:
            await asyncio.sleep(SWEEP_S)
            try:
                self._check(self.loop.time())
            except Exception:
                log.exception("%s: checking client connections failed", self.name)

    def _check(self, now: float) -> None:
        lim = self.limits
        for conn, since in list(self.waiting.items()):
            if conn.head_at is not None:
                late = now - conn.head_at > lim.head_timeout_s
            elif not conn.served:
                late = now - since > lim.head_timeout_s
            else:
                late = now - since > lim.idle_timeout_s
            if late:
                in_head = conn.head_at is not None or not conn.served
                if in_head:
                    self.head_timeouts += 1
                else:
                    self.idle_timeouts += 1
                conn.expire(in_head)
        for conn in list(self.conns):
            if conn.body_at is not None and now - conn.body_at > lim.idle_timeout_s:
                self.idle_timeouts += 1
                conn.expire(False)
