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
from typing import TYPE_CHECKING, Callable
from urllib.parse import unquote

import httptools

from .rules import REQUEST_DROP, error_answer, strip_headers

if TYPE_CHECKING:
    from .listen import Listener
    from .upstream import EngineConnection

log = logging.getLogger("berth.front")

_BODY_HIGH_BYTES = 1 << 20    # a request body buffered past this pauses reading from the client
_HEAD_LIMIT_BYTES = 1 << 20   # a request line and headers longer than this are refused (431)
_PIPELINE_LIMIT = 16          # requests parsed ahead of the one being answered
_LINGER_S = 1.0               # how long a refused connection's input is drained before closing
_LINGER_MAX = 64              # refused connections lingering at once, at most


class Request:
    """One parsed request. ``method`` and ``target`` are bytes as sent; ``headers`` the raw
    ``(name, value)`` pairs; ``lines`` the header lines for the engine (hop-by-hop ones
    dropped); ``length`` the Content-Length (None when absent); ``chunked`` whether the body is
    chunked. The body arrives in ``parts``; ``complete`` once it has all arrived."""

    __slots__ = ("conn", "method", "target", "version", "headers", "lines", "length", "chunked",
                 "expect", "keep_alive", "parts", "size", "complete", "upgrade", "bad", "watcher",
                 "_waiter")

    def __init__(self, conn: "ClientConnection"):
        self.conn = conn
        self.target = b""
        self.headers: list[tuple[bytes, bytes]] = []
        self.parts: list[bytes] = []
        self.size = 0
        self.complete = self.upgrade = self.expect = False
        #: why the body cannot be read: a :class:`BadBody` raised by the reads, else None
        self.bad: BadBody | None = None
        #: called when more of the body arrives, it ends, or it turns out malformed (a holder
        #: waiting for the body before it asks for a wake, berth.front.path)
        self.watcher: Callable[[], None] | None = None
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

    @property
    def body_in(self) -> bool:
        """Whether the body has come as far as it will before someone reads it: all of it, or
        the buffer's worth (reading from the client is paused), or it turned out malformed."""
        return self.complete or self.size > _BODY_HIGH_BYTES or self.bad is not None

    def _feed(self, chunk: bytes) -> None:
        self.parts.append(chunk)
        self.size += len(chunk)
        if self.size > _BODY_HIGH_BYTES:
            self.conn.pause_reading()
        self._wake()

    def _finish(self) -> None:
        self.complete = True
        self._wake()

    def _fail(self, bad: "BadBody") -> None:
        self.bad = bad
        self._wake()

    def _wake(self) -> None:
        w = self._waiter
        if w is not None and not w.done():
            w.set_result(None)
        if self.watcher is not None:
            self.watcher()

    async def read_some(self) -> bytes:
        """The body bytes that arrived since the last call, waiting for some; b"" at the end.
        Reading from the client resumes once the buffered part is taken."""
        while not self.parts:
            if self.bad is not None:
                raise self.bad
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
        """The whole body (the caller has checked that it is small). Raises :class:`BadBody`
        when it turns out malformed."""
        while not self.complete:
            if self.bad is not None:
                raise self.bad
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        data = b"".join(self.parts)
        self.parts.clear()
        return data


class BadBody(Exception):
    """The request's body turned out malformed after its head was taken (a chunk's framing, for
    one): the connection answers it ``status`` (a 4xx) in its turn, when nothing of an answer
    has gone to the client yet, and closes. Raised by :meth:`Request.read_some` and
    :meth:`Request.read_all`, and by a holder (berth.front.path) so that nothing is woken."""

    def __init__(self, status: int, reason: str, message: str):
        super().__init__(message)
        self.status, self.reason, self.message = status, reason, message


class _HandOff(Exception):
    """Raised from a parser callback: give the connection to ``factory``'s protocol."""

    def __init__(self, factory):
        super().__init__("hand off")
        self.factory = factory


class _Stop(Exception):
    """Raised from a parser callback: the request was refused; parse no further."""


class _Refusals:
    """A :class:`ClientConnection`'s answers to what it cannot take (a malformed head or body,
    a request over the bounds): a 4xx in the request's turn, then a lingering close."""

    def _refuse(self, status: int, reason: str, message: str) -> None:
        """A request the server cannot take: a 4xx if nothing is being answered, then close.
        A request whose head was taken and whose body turned out malformed is answered in its
        turn (:meth:`_answer_bad`): the one being answered may be held, not yet sent."""
        self._refused = True
        req = self.current
        if req is not None and (self.task is not None or self.exchange is not None) \
                and req in self.queue:
            self.body_at = None    # nothing more is read: the idle limit is not its to keep
            req._fail(BadBody(status, reason, message))
            return
        if self.task is not None or self.exchange is not None or self.transport is None:
            self.close()
            return
        self._linger(error_answer(status, reason, message, "invalid_request_error", close=True))

    def _answer_bad(self, bad: BadBody, answered: bool) -> None:
        """The request being answered has a malformed body: its 4xx, unless part of an answer
        went to the client already (then only the close tells it); the connection closes."""
        log.info("%s: %s (%d)", self.listener.name, bad.message, bad.status)
        if answered or self.closed or self.transport is None:
            self.close()
            return
        self._linger(error_answer(bad.status, bad.reason, bad.message, "invalid_request_error",
                                  close=True))

    def _linger(self, answer: bytes) -> None:
        """Write ``answer``, end the sending side and close after :data:`_LINGER_S`: what the
        client still sends is read and dropped meanwhile (closing with unread bytes would reset
        the connection, and the client would lose the answer)."""
        assert self.transport is not None
        self.write(answer)
        if self.listener.lingering >= _LINGER_MAX:
            self.close()       # a flood: file descriptors count more than one lost answer
            return
        self.listener.lingering += 1
        self._lingers = True
        self.resume_reading()
        if self.transport.can_write_eof():
            self.transport.write_eof()
        self.listener.loop.call_later(_LINGER_S, self.close)


class ClientConnection(_Refusals, asyncio.BufferedProtocol):
    """One client's connection to a listener (:class:`berth.front.listen.Listener`). Parses
    requests, queues them, and runs them in order through the handler's ``_handle`` (or
    ``_fast``), which writes each answer with :meth:`write`.

    For the listener's limits it keeps ``head_at`` (when the head being parsed began; None
    outside a head), ``body_at`` (when a body still arriving last sent bytes) and ``served``
    (requests answered)."""

    def __init__(self, listener: "Listener"):
        self.listener = listener
        self.handler = listener.handler
        self._buffer = listener.pool.buffer
        self.parser = httptools.HttpRequestParser(self)
        self.transport: asyncio.Transport | None = None
        self.queue: collections.deque[Request] = collections.deque()
        self.current: Request | None = None     # the request being parsed
        self.task: asyncio.Task[None] | None = None
        self.exchange: EngineConnection | None = None   # a task-free forward (berth.front.fast)
        self._pending: Request | None = None            # to start once its body is complete
        self.closed = False
        self.feeding: asyncio.Transport | None = None   # the engine connection writing to us
        self.head_at: float | None = None
        self.body_at: float | None = None
        self.served = 0
        self.writes = 0          # writes to the client (whether a request's answer has begun)
        self._head_bytes = 0
        self._refused = self._lingers = False
        self._reading_paused = False
        self._writing_paused = False
        # the bytes of a request head that began a read (kept only while a hand-off may follow)
        self._raw: list[bytes] | None = None
        self._begun = 0

    # ---- asyncio.BufferedProtocol -----------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport   # type: ignore[assignment]
        if not self.listener.admit(self):
            self._refused = True
            self._linger(self.listener.refusal())

    def get_buffer(self, sizehint: int) -> memoryview:
        return self._buffer   # the listener's one read buffer (berth.front.upstream.READ_BYTES)

    def buffer_updated(self, nbytes: int) -> None:
        self.data_received(self._buffer[:nbytes])

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.listener.forget(self)
        if self._lingers:
            self.listener.lingering -= 1
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
        if self.listener.hand_off is not None:
            _keep_raw(self, data)   # for a hand-off (berth.gateway.ws)
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
        except httptools.HttpParserCallbackError as exc:
            if isinstance(exc.__context__, _HandOff):
                _give(self, exc.__context__.factory)
            elif not isinstance(exc.__context__, _Stop):
                raise
            return
        except httptools.HttpParserError as exc:
            req = self.current
            if req is not None and not self._head_bytes:   # the head was taken: the body
                kind = "chunked request body" if req.chunked else "request body"
                self._refuse(400, "malformed_body", f"malformed {kind}: {exc}")
            else:
                self._refuse(400, "bad_request", f"malformed HTTP request: {exc}")
            return
        if self.current is not None:
            if self._head_bytes:
                self._head_bytes += len(data)
                if self._head_bytes > _HEAD_LIMIT_BYTES:
                    self._refuse(431, "headers_too_large", "request line and headers over "
                                 f"{_HEAD_LIMIT_BYTES} bytes")
            else:
                self.body_at = self.listener.loop.time()   # a body still arriving
        elif self.body_at is not None:
            self.body_at = None

    # ---- httptools callbacks ----------------------------------------------------------------------

    def on_message_begin(self) -> None:
        self.current = Request(self)
        self._head_bytes = 1
        self.head_at = self.listener.loop.time()
        self._begun += 1

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
        self.head_at = None
        self.listener.waiting.pop(self, None)
        p = self.parser
        req.method = p.get_method()
        req.version = p.get_http_version()
        req.keep_alive = p.should_keep_alive()
        if req.target[:1] != b"/" and not (req.target == b"*" and req.method == b"OPTIONS"):
            # absolute-form (a proxy request, RFC 9112 §3.2.2) or authority-form (CONNECT):
            # this is not a forward proxy
            self._refuse(400, "absolute_form", f"request target {_shown(req.target)}: this "
                         "server takes a path (origin-form, RFC 9112 §3.2.1), not a URL")
            raise _Stop()
        if self._raw is not None:
            factory = self.listener.hand_off(req)
            if factory is not None:
                raise _HandOff(factory)
            self._raw = None
        elif self.listener.hand_off is not None and self.listener.hand_off(req) is not None:
            self._refuse(400, "not_first", "this request goes to another server inside this one: "
                         "send it first on a connection of its own (not pipelined)")
            raise _Stop()
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
            if not self.handler._fast(req, self):
                self._start()

    # ---- answering ----------------------------------------------------------------------------------

    def _start(self) -> None:
        self.task = self.listener.loop.create_task(self._serve())

    def answered(self, keep: bool) -> None:
        """A task-free forward answered the first queued request; go on with the rest."""
        req = self.queue.popleft()
        self.served += 1
        if not (keep and req.keep_alive and req.complete) or self.closed:
            self.close()
            return
        self.run_queue()
        if not self.queue:
            self._wait_for_head()

    def run_queue(self) -> None:
        """Answer what is queued in the connection's task (none runs now)."""
        if self._reading_paused and len(self.queue) <= _PIPELINE_LIMIT:
            self.resume_reading()
        if self.queue and self.task is None and not self.closed:
            self._start()

    def _wait_for_head(self) -> None:
        """Nothing left to answer: the idle and head limits apply again."""
        if not self.closed:
            self.listener.waiting[self] = self.listener.loop.time()

    async def _serve(self) -> None:
        """Answer queued requests in order; the task ends when none is left."""
        try:
            while self.queue:
                req = self.queue[0]
                wrote = self.writes
                try:
                    if req.bad is not None:
                        raise req.bad
                    keep = await self.handler._handle(req, self)
                except BadBody as bad:
                    self._answer_bad(bad, answered=self.writes != wrote)
                    return
                self.queue.popleft()
                self.served += 1
                if not (keep and req.keep_alive and req.complete) or self.closed:
                    # the client asked to close, the answer ends at close, or the rest of
                    # the body was never read: the connection cannot carry another request
                    self.close()
                    return
                if self._reading_paused and len(self.queue) <= _PIPELINE_LIMIT:
                    self.resume_reading()
            self._wait_for_head()
        except asyncio.CancelledError:
            pass   # the client went (or the listener stopped); the handler counted it
        except Exception:
            log.exception("%s: request failed", self.listener.name)
            self.close()
        finally:
            self.task = None

    def write(self, data: bytes) -> None:
        self.writes += 1
        t = self.transport
        if t is not None and not t.is_closing():
            t.write(data)

    def interim(self, data: bytes) -> None:
        """Write an interim answer (``100 Continue``): not counted as an answer begun, so a
        final 4xx may still follow it."""
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

    def expire(self, in_head: bool) -> None:
        """Close for a limit of the listener: a 408 first if part of a head came (``in_head``
        and a byte arrived), else silently (an idle kept-alive connection)."""
        self.listener.forget(self)
        if in_head and self.head_at is not None and self.task is None \
                and self.exchange is None and not self._refused:
            self._refused = True
            self.write(error_answer(408, "head_timeout", "the request head did not arrive in "
                                    f"{self.listener.limits.head_timeout_s:g} s",
                                    "invalid_request_error", close=True))
        self.close()

    def pause_reading(self) -> None:
        if not self._reading_paused and self.transport is not None and not self.closed:
            self._reading_paused = True
            self.transport.pause_reading()

    def resume_reading(self) -> None:
        if self._reading_paused and self.transport is not None and not self.closed:
            self._reading_paused = False
            self.transport.resume_reading()
            if self.body_at is not None:
                self.body_at = self.listener.loop.time()   # the wait was ours, not the client's

    @property
    def writing_paused(self) -> bool:
        return self._writing_paused


# ---- handing a connection to another server ---------------------------------------------------

def _keep_raw(self: ClientConnection, data: bytes | memoryview) -> None:
    """Keep the bytes of a request head that begins this read, for :func:`_give`."""
    if self.current is None and not self.queue and self.task is None \
            and self.exchange is None:
        self._raw = [bytes(data)]
        self._begun = 0
    elif self._raw is not None and self._head_bytes:
        self._raw.append(bytes(data))
    else:
        self._raw = None


def _give(self: ClientConnection, factory) -> None:
    """Give the connection to ``factory()``'s protocol (aiohttp's server), with the bytes
    of the request it starts with. Only a request that began a read and has nothing before
    it on the connection is given (``_raw``); the listener stops counting the connection."""
    raw, self._raw = self._raw, None
    if raw is None or self._begun != 1:
        self._refuse(400, "not_first", "this request goes to another server inside this one: "
                     "send it first on a connection of its own (not pipelined)")
        return
    t, self.transport = self.transport, None
    self.closed = True
    self.current = None
    self.listener.forget(self)
    self.listener.handed_off += 1
    proto = factory()
    t.set_protocol(proto)
    if self._reading_paused:
        t.resume_reading()
    proto.connection_made(t)
    proto.data_received(b"".join(raw))


def _shown(target: bytes) -> str:
    text = target[:200].decode("latin-1")
    return repr(text + ("..." if len(target) > 200 else ""))
