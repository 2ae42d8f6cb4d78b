"""The front's side towards the engine: kept-alive HTTP/1.1 connections, each an asyncio protocol
over httptools' response parser, that write the engine's answer into the client's connection as it
arrives (no task wakes per chunk; server-sent events pass chunk by chunk).

An answer's header lines are stripped of hop-by-hop ones once, when its headers are complete; a
body of known length passes as the bytes that came, a chunked one is framed again: what one read
from the engine held goes to the client as one HTTP chunk in one write, so the client sees each
event as soon as the front does (server-sent events are delimited by blank lines, not by chunks).
"""

from __future__ import annotations

import asyncio
import ssl
import time
from typing import TYPE_CHECKING, Callable

import httptools
from yarl import URL

from . import held
from .rules import ANSWER_DROP, strip_headers

if TYPE_CHECKING:
    from .server import ClientConnection

#: How long an idle engine connection is kept, seconds. Below the 5 s that uvicorn (vLLM, SGLang)
#: and llama.cpp's server keep an idle connection, so the front seldom reuses one the engine is
#: closing at that moment (and when it does, :class:`StaleConnection` lets it retry).
IDLE_KEEP_S = 4.0
CONNECT_TIMEOUT_S = 10.0
#: One read from a socket, bytes (asyncio's own read size). The front's connections all read into
#: one buffer of this size, parsed before the next read: asyncio's default ``recv`` allocates a
#: new buffer this large for every read, which glibc serves with mmap, mremap and munmap (three
#: system calls per read, measured with ``strace -c`` under ``bench/front.py``).
READ_BYTES = 256 * 1024


class EngineFailed(Exception):
    """The engine closed the connection or sent what is not HTTP before the answer's end.
    ``started``: whether the answer's head had already gone to the client."""

    def __init__(self, message: str, started: bool):
        super().__init__(message)
        self.started = started


class StaleConnection(EngineFailed):
    """A reused connection closed before a byte of the answer: the engine had closed it while
    idle (its keep-alive timeout). The request may be sent again on a new connection."""


class Address:
    """Where the engine listens, from its base URL: host, port, TLS, the path prefix (bytes) and
    the ``Host`` header line."""

    __slots__ = ("host", "port", "tls", "prefix", "host_line", "key")

    def __init__(self, url: str):
        u = URL(url)
        if u.scheme not in ("http", "https") or not u.host:
            raise ValueError(f"upstream must be an http(s) URL with a host, got {url!r}")
        self.host, self.tls = u.raw_host or u.host, u.scheme == "https"
        self.port = u.port or (443 if self.tls else 80)
        self.prefix = u.raw_path.rstrip("/").encode()
        default = (self.port == 443) if self.tls else (self.port == 80)
        host = f"[{self.host}]" if ":" in self.host else self.host   # IDNA-encoded already
        self.host_line = f"Host: {host}{'' if default else f':{self.port}'}\r\n".encode("ascii")
        self.key = (self.host, self.port, self.tls)


class EngineConnection(asyncio.BufferedProtocol):
    """One connection to the engine. :meth:`begin` ties it to the client connection that gets
    the next answer. The exchange's outcome is True (answer complete, connection reusable),
    False (answer complete, connection spent) or an :class:`EngineFailed`; it resolves
    :attr:`done` (a future, for a task to await) or, given ``on_settled``, is passed to that
    callback right after the read that settled it has gone to the client (no loop turn)."""

    #: header lines added to every answer's head (a subclass sets them per exchange)
    extra = b""

    def __init__(self, pool: "Pool"):
        self.pool = pool
        # the body pieces of one read; the parser calls list.append itself (no Python frame
        # per piece: an engine's events arrive dozens to a read under load)
        self.body: list[bytes] = []
        self.on_body = self.body.append
        self.parser = httptools.HttpResponseParser(self)
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self.reused = False
        self.idle_since = 0.0
        self.client: ClientConnection | None = None
        self.done: asyncio.Future[bool] | None = None
        self.active = False   # an exchange is under way and not settled
        self.on_settled: Callable[[bool | EngineFailed | None], None] | None = None
        self._outcome: bool | EngineFailed | None = None
        self._drain: asyncio.Future[None] | None = None
        self._paused = False
        self._reset()

    def _reset(self) -> None:
        self.head_only = self.http10 = self.headless = False
        self.status = 0
        self.kept: list[bytes] | None = None   # a headless answer that is not a stream
        self.got_bytes = self.started = False
        self.rechunk = self.until_close = self.ended = False
        self.reason = b""
        self.headers: list[tuple[bytes, bytes]] = []
        self.out: list[bytes] = []
        self.body.clear()

    def begin(self, client: "ClientConnection", head_only: bool, http10: bool,
              on_settled: Callable[[bool | EngineFailed | None], None] | None = None,
              headless: bool = False) -> None:
        """Tie the connection to ``client`` for one answer. ``head_only``: the request was a
        HEAD. ``http10``: the client speaks HTTP/1.0 (no chunks). ``on_settled``: see the class;
        None makes :attr:`done` a new future. ``headless``: the client already has the head of
        a chunked event stream (a held request's, :mod:`berth.front.held`): the answer's body
        goes on as chunks of it, and an answer that is not an event stream as one event."""
        self._reset()
        self.active = True
        self.head_only, self.http10, self.headless = head_only, http10, headless
        self.client = client
        client.feeding = self.transport
        if client.writing_paused and self.transport is not None:
            self.transport.pause_reading()   # the client still has not taken the last answer
        self.on_settled = on_settled
        self.done = None if on_settled else asyncio.get_running_loop().create_future()

    def abandon(self) -> None:
        """The client went: settle with None now (the caller closes the connection)."""
        if self.active:
            self._outcome = None
            self.active = False
            self._deliver()

    def _settle(self, outcome: bool | EngineFailed) -> None:
        if not self.active:
            return
        self.active = False
        d = self.done
        if d is None:
            self._outcome = outcome   # delivered by _deliver() once the read is flushed
        elif d.done():
            pass   # cancelled with the task that awaited it (its client went)
        elif isinstance(outcome, EngineFailed):
            d.set_exception(outcome)
        else:
            d.set_result(outcome)

    def _deliver(self) -> None:
        cb = self.on_settled
        if cb is not None and not self.active:
            self.on_settled = None
            cb(self._outcome)

    def end(self) -> None:
        """The exchange is over: untie the client, and read again if a slow client paused us."""
        if self.client is not None:
            self.client.feeding = None
            self.client = None
        t = self.transport
        if t is not None and not t.is_closing() and not t.is_reading():
            t.resume_reading()

    def write(self, data: bytes) -> None:
        t = self.transport
        if t is not None and not t.is_closing():
            t.write(data)

    async def drain(self) -> None:
        """Wait while the engine's socket buffer is full (a large body streaming to it)."""
        if self._paused and not self.closed:
            self._drain = asyncio.get_running_loop().create_future()
            try:
                await self._drain
            finally:
                self._drain = None

    def close(self) -> None:
        """Close the connection: the engine sees it go (and stops generating). An exchange
        under way is dropped unsettled: the caller has ended it."""
        self.closed = True
        self.active = False
        self.end()
        if self.transport is not None:
            self.transport.close()

    # ---- asyncio.BufferedProtocol -----------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport   # type: ignore[assignment]

    def get_buffer(self, sizehint: int) -> memoryview:
        return self.pool.buffer

    def buffer_updated(self, nbytes: int) -> None:
        self.data_received(self.pool.buffer[:nbytes])

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.pool._forget(self)
        if self._drain is not None and not self._drain.done():
            self._drain.set_result(None)
        if not self.active:
            return
        if self.until_close:   # an answer without a length ends when the engine closes
            self.ended = True
            self._flush()
            self._settle(False)
        elif self.reused and not self.got_bytes:
            self._settle(StaleConnection("the engine closed an idle connection", False))
        else:
            self._settle(EngineFailed(
                f"the engine closed the connection mid-answer{f': {exc}' if exc else ''}",
                self.started))
        self._deliver()

    def pause_writing(self) -> None:
        self._paused = True

    def resume_writing(self) -> None:
        self._paused = False
        if self._drain is not None and not self._drain.done():
            self._drain.set_result(None)

    def data_received(self, data: bytes | memoryview) -> None:
        if not self.active:
            self.close()   # bytes outside an exchange: the engine misbehaves; do not reuse
            return
        self.got_bytes = True
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self._flush()
            self._settle(EngineFailed(f"the engine's answer is not HTTP: {exc}", self.started))
            self.close()
            self._deliver()
            return
        self._flush()
        if not self.active:
            self._deliver()

    def _flush(self) -> None:
        """Write what one read parsed to the client at once: the head, if it came, then the
        body pieces (one HTTP chunk for all of them when the front frames the body itself)."""
        out, body = self.out, self.body
        if self.kept is not None:
            self.kept += body
            body.clear()
            if self.ended:
                out.append(held.tail_event(self.status, b"".join(self.kept)))
                self.kept = None
                self.rechunk = False
        if body:
            if self.head_only:
                pass   # never sent: a HEAD answer has no body
            elif self.rechunk:
                data = b"".join(body)
                out.append(b"%x\r\n%s\r\n" % (len(data), data))
            else:
                out.extend(body)
            body.clear()
        if self.ended and self.rechunk:
            out.append(b"0\r\n\r\n")
            self.rechunk = False
        if out:
            if self.client is not None:
                self.client.write(b"".join(out) if len(out) > 1 else out[0])
            out.clear()

    # ---- httptools callbacks ----------------------------------------------------------------------

    def on_status(self, status: bytes) -> None:
        self.reason += status

    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers.append((name, value))

    def on_headers_complete(self) -> None:
        status = self.parser.get_status_code()
        if 100 <= status < 200:
            return   # an interim answer (100, 103): the final one follows
        lines, length, chunked, _ = strip_headers(self.headers, ANSWER_DROP)
        if self.headless:
            self._headless(status, length, chunked)
            return
        if self.http10:   # an HTTP/1.0 client knows no chunks: its answer ends at close
            lines.append(b"Connection: close\r\n")
        if self.head_only or status in (204, 304):
            pass   # no body; Content-Length, if any, describes the GET's
        elif length is None:
            self.until_close = not chunked
            if not self.http10:
                self.rechunk = True
                lines.append(b"Transfer-Encoding: chunked\r\n")
        self.out.append(b"HTTP/1.1 %d %s\r\n%s%s\r\n" % (status, self.reason, b"".join(lines),
                                                         self.extra))
        self.started = True
        if self.head_only:
            # llhttp cannot be told that a HEAD answer has no body: end here, do not reuse
            self._finish(False)

    def _headless(self, status: int, length: int | None, chunked: bool) -> None:
        """The answer's head is not sent (the client has a held stream's): an event stream's
        body goes on as chunks, anything else is kept for one event at its end."""
        self.started = True
        self.status = status
        self.until_close = length is None and not chunked
        stream = 200 <= status < 300 and any(
            k.lower() == b"content-type" and v.lower().startswith(b"text/event-stream")
            for k, v in self.headers)
        if stream:
            self.rechunk = True
        else:
            self.kept = []

    def on_message_complete(self) -> None:
        if not self.started:   # the end of an interim answer
            self.headers.clear()
            self.reason = b""
            return
        if self.head_only:
            return
        self.ended = True
        self._finish(self.parser.should_keep_alive())

    def _finish(self, reusable: bool) -> None:
        self._settle(reusable and not self.closed)


class Pool:
    """Idle engine connections, newest first out, by address. A connection the engine closes
    while idle leaves the pool at once (its ``connection_lost``)."""

    def __init__(self, factory: Callable[["Pool"], EngineConnection] | None = None) -> None:
        #: makes each new connection (default :class:`EngineConnection`)
        self.factory = factory or EngineConnection
        #: the read buffer of every connection of this front, engine and client side (one
        #: event loop: each read is parsed, and its bytes copied out, before the next)
        self.buffer = memoryview(bytearray(READ_BYTES))
        self._idle: dict[tuple[str, int, bool], list[EngineConnection]] = {}
        self._tls: ssl.SSLContext | None = None

    def take(self, addr: Address) -> EngineConnection | None:
        """An idle connection to ``addr``, or None."""
        idle = self._idle.get(addr.key)
        if idle:
            now = time.monotonic()
            while idle:
                conn = idle.pop()
                if not conn.closed and now - conn.idle_since < IDLE_KEEP_S:
                    conn.reused = True
                    return conn
                conn.close()
        return None

    async def acquire(self, addr: Address,
                      timeout_s: float = CONNECT_TIMEOUT_S) -> EngineConnection:
        """An idle connection to ``addr`` or a new one (connected within ``timeout_s``
        seconds). Raises ``OSError`` (or ``TimeoutError``) when the engine cannot be reached."""
        conn = self.take(addr)
        if conn is not None:
            return conn
        loop = asyncio.get_running_loop()
        tls = None
        if addr.tls:
            if self._tls is None:
                self._tls = ssl.create_default_context()
            tls = self._tls
        async with asyncio.timeout(timeout_s):
            _, new = await loop.create_connection(
                lambda: self.factory(self), addr.host, addr.port, ssl=tls,
                server_hostname=addr.host if tls else None)
        return new   # asyncio sets TCP_NODELAY on TCP connections

    def release(self, conn: EngineConnection, addr: Address) -> None:
        """Keep ``conn`` for the next request to ``addr``."""
        conn.end()
        if conn.closed:
            return
        conn.done = conn.on_settled = None
        conn.idle_since = time.monotonic()
        self._idle.setdefault(addr.key, []).append(conn)

    def _forget(self, conn: EngineConnection) -> None:
        for idle in self._idle.values():
            if conn in idle:
                idle.remove(conn)
                return

    def close(self) -> None:
        """Close every idle connection."""
        idle, self._idle = self._idle, {}
        for conns in idle.values():
            for conn in conns:
                conn.close()
