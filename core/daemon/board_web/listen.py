"""The board's listener: aiohttp's server with the limits every Berth listener keeps on its
clients (issue 26 "Every listener closes slow and idle clients").

aiohttp has a keep-alive timeout (``keepalive_timeout``: an idle connection, one waiting for a
request, is closed that long after it opened or after its last answer), but no time limit on a
request head: one that arrives a byte at a time keeps the keep-alive deadline from ever being
reached only if the client is quick enough, and there is no bound on connections. So:

1. a request head not complete ``head_timeout_s`` after its first byte (or a new connection that
   sent nothing for as long) is answered 408 and closed: :class:`_Guarded`, a
   :class:`aiohttp.web.RequestHandler` that arms one timer per head;
2. a kept-alive connection idle for ``idle_timeout_s`` is closed: aiohttp's own
   ``keepalive_timeout``;
3. at most ``max_connections`` client connections are open (default from the file descriptor
   limit, :func:`berth.front.listen.connections_from_fd_limit`); one more is answered 503 at
   once and closed;
4. a malformed request (a head aiohttp's parser refuses: a bad request line or version, a
   Content-Length that is not a number, a line over 8 KiB) is answered 400 in berthd's error shape
   and logged as one WARNING line naming the fault (:meth:`_Guarded.handle_error`); aiohttp logged
   each with a traceback at ERROR and answered plain text. A flood does not fill the log: the
   first :data:`MALFORMED_LOG_FIRST` in each :data:`MALFORMED_LOG_EVERY_S` are logged, the rest
   counted in one line at the window's end (:class:`MalformedLog`);
5. "Too many open files" on accept is logged at most once a minute, with the count left out
   (the front's throttle, :func:`berth.front.listen.throttle_fd_logs`: asyncio retries a failed
   accept every second and logged each with a traceback).

A request being answered (the board's event stream included) is never timed here. Times are the
event loop's clock (seconds).
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass

from aiohttp import web
from aiohttp.http_exceptions import BadHttpMessage
from berth.front.listen import connections_from_fd_limit, throttle_fd_logs

__all__ = ["Limits", "GuardedSite", "connections_from_fd_limit"]

log = logging.getLogger("berth.daemon")


#: Malformed requests logged one line each per window; the rest of the window's are counted.
MALFORMED_LOG_FIRST = 5
#: Seconds of one window of :class:`MalformedLog`.
MALFORMED_LOG_EVERY_S = 60.0


class MalformedLog:
    """The log lines about malformed requests: the first ``first`` of each ``every_s``-second
    window one line each (WARNING), the rest counted and said in one line when the window ends,
    so a flood of bad requests costs a few lines a minute, not one each."""

    def __init__(self, first: int = MALFORMED_LOG_FIRST, every_s: float = MALFORMED_LOG_EVERY_S):
        self.first, self.every_s = first, every_s
        self.said = self.left_out = 0
        self._window: asyncio.TimerHandle | None = None
        self._last = ""

    def say(self, loop: asyncio.AbstractEventLoop, where: str, line: str) -> None:
        """Log ``line`` (about a malformed request on ``where``) or count it."""
        if self._window is None:
            self._window = loop.call_later(self.every_s, self._end)
        if self.said < self.first:
            self.said += 1
            log.warning("malformed request on %s: %s", where, line)
            return
        self.left_out += 1
        self._last = f"{where}: {line}"

    def _end(self) -> None:
        self._window = None
        if self.left_out:
            log.warning("%d more malformed request(s) left out of the log in the last %g s "
                        "(the last on %s)", self.left_out, self.every_s, self._last)
        self.said = self.left_out = 0


#: One for the process: berthd's listeners (the control socket, the board) share its log.
MALFORMED_LOG = MalformedLog()


def _answer(status: bytes, text: bytes, extra: bytes = b"") -> bytes:
    return (b"HTTP/1.1 %s\r\nContent-Type: text/plain\r\nContent-Length: %d\r\n%s"
            b"Connection: close\r\n\r\n%s" % (status, len(text), extra, text))


_408 = _answer(b"408 Request Timeout", b"the request head came too slowly\n")
_503 = _answer(b"503 Service Unavailable", b"too many connections; try again\n",
               b"Retry-After: 1\r\n")


@dataclass(frozen=True)
class Limits:
    """``head_timeout_s``: seconds for a request head; ``idle_timeout_s``: seconds a kept-alive
    connection may wait for its next request; ``max_connections``: open client connections
    (``None``: :func:`connections_from_fd_limit`)."""

    head_timeout_s: float = 10.0
    idle_timeout_s: float = 60.0
    max_connections: int | None = None

    def bound(self) -> int:
        return self.max_connections or connections_from_fd_limit()


class _Guarded(web.RequestHandler):
    """aiohttp's handler with a time limit on each request head and a bound on connections."""

    __slots__ = ("_berth_server", "_berth_limits", "_berth_timer", "_berth_count")

    def __init__(self, server: web.Server, limits: Limits, **kwargs):
        super().__init__(server, keepalive_timeout=limits.idle_timeout_s, **kwargs)
        self._berth_server = server
        self._berth_limits = limits
        self._berth_timer: asyncio.TimerHandle | None = None
        self._berth_count = 0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        full = len(self._berth_server.connections) >= self._berth_limits.bound()
        super().connection_made(transport)
        if full:
            transport.write(_503)
            self.force_close()
            return
        self._arm()

    def data_received(self, data: bytes) -> None:
        before = self._request_count
        if self._berth_timer is None and not self._busy():
            self._arm()             # the first byte of a request head
        super().data_received(data)
        if self._request_count != before and self._berth_timer is not None:
            self._berth_timer.cancel()          # the head is complete
            self._berth_timer = None

    def connection_lost(self, exc: BaseException | None) -> None:
        if self._berth_timer is not None:
            self._berth_timer.cancel()
            self._berth_timer = None
        super().connection_lost(exc)

    def handle_error(self, request, status: int = 500, exc: BaseException | None = None,
                     message: str | None = None) -> web.StreamResponse:
        """A request aiohttp's parser refused (``exc`` a :class:`BadHttpMessage`, ``status`` its
        4xx): one WARNING line naming the fault (throttled: :data:`MALFORMED_LOG`) and a JSON answer in berthd's error shape
        (:func:`berth.daemon.api_bodies.error`), the connection closed. Any other error is
        aiohttp's own handling (a 500 with its traceback: a defect worth one)."""
        if not isinstance(exc, BadHttpMessage) or not 400 <= status < 500:
            return super().handle_error(request, status, exc, message)
        fault = " ".join(w for w in str(exc.message).split() if w.strip("^"))[:200]
        MALFORMED_LOG.say(self._loop, self._berth_where(),
                          f"{fault} ({type(exc).__name__}; answered {status})")
        resp = web.json_response({"error": {"type": "invalid_request", "code": status,
                                            "message": f"malformed HTTP request: {fault}"},
                                  "src": "berthd"}, status=status)
        resp.force_close()
        return resp

    def _berth_where(self) -> str:
        """The listener, in words, for a log line: its socket path or address."""
        sock = self.transport.get_extra_info("sockname") if self.transport else None
        return str(sock) if sock else "a listener"

    def _busy(self) -> bool:
        """A request is being answered (aiohttp 3.9+ says so; older, its current request)."""
        busy = getattr(self, "_request_in_progress", None)
        return busy if busy is not None else self._current_request is not None

    def _arm(self) -> None:
        self._berth_count = self._request_count
        self._berth_timer = self._loop.call_later(self._berth_limits.head_timeout_s, self._due)

    def _due(self) -> None:
        self._berth_timer = None
        # A head completed since the timer was armed: its request is (or was) answered.
        if self._request_count != self._berth_count or self.transport is None or self._busy():
            return
        self.transport.write(_408)
        self.force_close()


class GuardedSite(web.TCPSite):
    """A :class:`aiohttp.web.TCPSite` whose connections are :class:`_Guarded` under ``limits``.
    ``handler_args`` are the runner's (``access_log`` and the like)."""

    def __init__(self, runner: web.AppRunner, host: str, port: int, limits: Limits,
                 handler_args: dict | None = None, **kwargs):
        super().__init__(runner, host, port, **kwargs)
        self._limits = limits
        self._handler_args = dict(handler_args or {})

    async def start(self) -> None:
        throttle_fd_logs()
        await web.BaseSite.start(self)
        loop = asyncio.get_running_loop()
        server = self._runner.server
        assert server is not None

        def factory() -> _Guarded:
            return _Guarded(server, self._limits, loop=loop, **self._handler_args)
        self._server = await loop.create_server(factory, self._host, self._port,
                                                backlog=self._backlog,
                                                reuse_address=self._reuse_address,
                                                reuse_port=self._reuse_port)
