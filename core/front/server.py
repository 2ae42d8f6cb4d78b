"""The front's HTTP/1.1 server: an asyncio protocol over httptools' C parser (llhttp, the parser
Node.js uses), one per client connection.

Why not aiohttp's server: measured under ``bench/front.py --profile``, its request and response
objects, writer and per-request bookkeeping cost more CPU than moving the bytes. Here a request is
parsed once into raw ``(name, value)`` pairs, its header lines for the engine are built once when
its headers are complete, and its body is kept as the bytes that arrived. The connection runs its
requests one after another in one task (HTTP/1.1 pipelining keeps their order); a client that goes
away cancels that task, which is how a held request is forgotten and a forwarded one closes its
engine connection.
"""

from __future__ import annotations

import asyncio
import collections
import logging
from typing import TYPE_CHECKING
from urllib.parse import unquote

import httptools

from .rules import REQUEST_DROP, error_answer, strip_headers

if TYPE_CHECKING:
    from .front import Front
    from .upstream import EngineConnection

log = logging.getLogger("berth.front")

_BODY_HIGH_BYTES = 1 << 20    # a request body buffered past this pauses reading from the client
_HEAD_LIMIT_BYTES = 1 << 20   # a request line and headers longer than this are refused (431)
_PIPELINE_LIMIT = 16          # requests parsed ahead of the one being answered
_LINGER_S = 1.0               # how long a refused connection's input is drained before closing


class Request:
    """One parsed request. ``method`` and ``target`` are bytes as sent; ``headers`` the raw
    ``(name, value)`` pairs; ``lines`` the header lines for the engine (hop-by-hop ones
    dropped); ``length`` the Content-Length (None when absent); ``chunked`` whether the body is
    chunked. The body arrives in ``parts``; ``complete`` once it has all arrived."""

    __slots__ = ("conn", "method", "target", "version", "headers", "lines", "length", "chunked",
                 "expect", "keep_alive", "parts", "size", "complete", "upgrade", "_waiter")

    def __init__(self, conn: "ClientConnection"):
        self.conn = conn
        self.target = b""
        self.headers: list[tuple[bytes, bytes]] = []
        self.parts: list[bytes] = []
        self.size = 0
        self.complete = self.upgrade = self.expect = False
        self._waiter: asyncio.Future[None] | None = None

    @property
    def streamed(self) -> bool:
        """Whether the body goes to the engine as it arrives (large or chunked) rather than
        whole."""
        return self.chunked or (self.length is not None and self.length > _BODY_HIGH_BYTES)

    @property
    def method_str(self) -> str:
        return self.method.decode("ascii", "replace")

    @property
    def path(self) -> str:
        """The path without the query, percent-decoded (what ``is_write`` is asked about)."""
        return unquote(self.target.partition(b"?")[0].decode("latin-1"))

    def _feed(self, chunk: bytes) -> None:
        self.parts.append(chunk)
        self.size += len(chunk)
        if self.size > _BODY_HIGH_BYTES:
            self.conn.pause_reading()
        self._wake()

    def _finish(self) -> None:
        self.complete = True
        self._wake()

    def _wake(self) -> None:
        w = self._waiter
        if w is not None and not w.done():
            w.set_result(None)

    async def read_some(self) -> bytes:
        """The body bytes that arrived since the last call, waiting for some; b"" at the end.
        Reading from the client resumes once the buffered part is taken."""
        while not self.parts:
            if self.complete:
                return b""
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        data = b"".join(self.parts) if len(self.parts) > 1 else self.parts[0]
        self.parts.clear()
        self.size = 0
        self.conn.resume_reading()
        return data

    async def read_all(self) -> bytes:
        """The whole body (the caller has checked that it is small)."""
        while not self.complete:
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        data = b"".join(self.parts)
        self.parts.clear()
        return data


class ClientConnection(asyncio.BufferedProtocol):
    """One client's connection to the front. Parses requests, queues them, and runs them in
    order through :meth:`Front._handle`, which writes each answer with :meth:`write`."""

    def __init__(self, front: "Front"):
        self.front = front
        self._buffer = front._pool.buffer
        self.parser = httptools.HttpRequestParser(self)
        self.transport: asyncio.Transport | None = None
        self.queue: collections.deque[Request] = collections.deque()
        self.current: Request | None = None     # the request being parsed
        self.task: asyncio.Task[None] | None = None
        self.exchange: EngineConnection | None = None   # a task-free forward (berth.front.fast)
        self._pending: Request | None = None            # to start once its body is complete
        self.closed = False
        self.feeding: asyncio.Transport | None = None   # the engine connection writing to us
        self._head_bytes = 0
        self._refused = False
        self._reading_paused = False
        self._writing_paused = False

    # ---- asyncio.BufferedProtocol -----------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport   # type: ignore[assignment]
        self.front._conns.add(self)

    def get_buffer(self, sizehint: int) -> memoryview:
        return self._buffer   # the front's one read buffer (berth.front.upstream.READ_BYTES)

    def buffer_updated(self, nbytes: int) -> None:
        self.data_received(self._buffer[:nbytes])

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.front._conns.discard(self)
        if self.task is not None:
            self.task.cancel()
        if self.exchange is not None:
            self.exchange.abandon()   # FastPath._fast_done counts the client gone
        if self.current is not None:
            self.current._wake()

    def eof_received(self) -> bool:
        return False   # a client that stops sending has gone (as aiohttp's server takes it)

    def pause_writing(self) -> None:
        self._writing_paused = True
        if self.feeding is not None:
            self.feeding.pause_reading()   # the engine waits for a slow client, not our memory

    def resume_writing(self) -> None:
        self._writing_paused = False
        if self.feeding is not None and not self.feeding.is_closing():
            self.feeding.resume_reading()

    def data_received(self, data: bytes | memoryview) -> None:
        if self._refused:
            return   # lingering after a 4xx
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            # The request asked to switch protocols: it is answered as a plain request (the
            # front does not forward upgrades), and what follows it is not HTTP: close after.
            req = self.current
            if req is not None:
                req.upgrade = True
                req.keep_alive = False
                self.current = None
                self._complete(req)
            self.pause_reading()
        except httptools.HttpParserError as exc:
            self._refuse(400, "bad_request", f"malformed HTTP request: {exc}")
            return
        if self.current is not None and self._head_bytes:
            self._head_bytes += len(data)
            if self._head_bytes > _HEAD_LIMIT_BYTES:
                self._refuse(431, "headers_too_large", "request line and headers over "
                             f"{_HEAD_LIMIT_BYTES} bytes")

    # ---- httptools callbacks ----------------------------------------------------------------------

    def on_message_begin(self) -> None:
        self.current = Request(self)
        self._head_bytes = 1

    def on_url(self, url: bytes) -> None:
        req = self.current
        assert req is not None
        req.target += url

    def on_header(self, name: bytes, value: bytes) -> None:
        req = self.current
        assert req is not None
        req.headers.append((name, value))

    def on_headers_complete(self) -> None:
        req = self.current
        assert req is not None
        self._head_bytes = 0
        p = self.parser
        req.method = p.get_method()
        req.version = p.get_http_version()
        req.keep_alive = p.should_keep_alive()
        req.lines, req.length, req.chunked, expect = strip_headers(req.headers, REQUEST_DROP)
        req.expect = expect and req.version == "1.1"
        self.queue.append(req)
        if len(self.queue) > _PIPELINE_LIMIT:
            self.pause_reading()
        if self.task is None and self.exchange is None and len(self.queue) == 1:
            if req.streamed or req.expect:
                self._start()   # the task forwards the body as it comes
            else:
                self._pending = req   # the body is small: decide once it is all here

    def on_body(self, body: bytes) -> None:
        req = self.current
        assert req is not None
        req._feed(body)

    def on_message_complete(self) -> None:
        req = self.current
        assert req is not None
        self.current = None
        self._complete(req)

    def _complete(self, req: Request) -> None:
        req._finish()
        if self._pending is req:
            self._pending = None
            if not self.front._fast(req, self):
                self._start()

    # ---- answering ----------------------------------------------------------------------------------

    def _start(self) -> None:
        self.task = self.front._loop.create_task(self._serve())

    def answered(self, keep: bool) -> None:
        """A task-free forward answered the first queued request; go on with the rest."""
        req = self.queue.popleft()
        if not (keep and req.keep_alive and req.complete) or self.closed:
            self.close()
            return
        self.run_queue()

    def run_queue(self) -> None:
        """Answer what is queued in the connection's task (none runs now)."""
        if self._reading_paused and len(self.queue) <= _PIPELINE_LIMIT:
            self.resume_reading()
        if self.queue and self.task is None and not self.closed:
            self._start()

    async def _serve(self) -> None:
        """Answer queued requests in order; the task ends when none is left."""
        try:
            while self.queue:
                req = self.queue[0]
                keep = await self.front._handle(req, self)
                self.queue.popleft()
                if not (keep and req.keep_alive and req.complete) or self.closed:
                    # the client asked to close, the answer ends at close, or the rest of
                    # the body was never read: the connection cannot carry another request
                    self.close()
                    return
                if self._reading_paused and len(self.queue) <= _PIPELINE_LIMIT:
                    self.resume_reading()
        except asyncio.CancelledError:
            pass   # the client went (or the front stopped); the handler counted it
        except Exception:
            log.exception("front %s: request failed", self.front.name)
            self.close()
        finally:
            self.task = None

    def write(self, data: bytes) -> None:
        t = self.transport
        if t is not None and not t.is_closing():
            t.write(data)

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()

    def abort(self) -> None:
        """Close without flushing: the client sees its answer cut short."""
        if self.transport is not None:
            self.transport.abort()

    def pause_reading(self) -> None:
        if not self._reading_paused and self.transport is not None and not self.closed:
            self._reading_paused = True
            self.transport.pause_reading()

    def resume_reading(self) -> None:
        if self._reading_paused and self.transport is not None and not self.closed:
            self._reading_paused = False
            self.transport.resume_reading()

    @property
    def writing_paused(self) -> bool:
        return self._writing_paused

    def _refuse(self, status: int, reason: str, message: str) -> None:
        """A request the front cannot parse: a 4xx if nothing is being answered, then close.
        What the client still sends is read and dropped for up to :data:`_LINGER_S` (closing
        with unread bytes would reset the connection, and the client would lose the 4xx)."""
        self._refused = True
        if self.task is not None or self.exchange is not None or self.transport is None:
            self.close()
            return
        self.write(error_answer(status, reason, message, "invalid_request_error", close=True))
        self.resume_reading()
        if self.transport.can_write_eof():
            self.transport.write_eof()
        self.front._loop.call_later(_LINGER_S, self.close)
