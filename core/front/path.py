"""One request's way through the front: refused, held, or forwarded (seed 002 "Fronts").

:class:`RequestPath` is the request half of :class:`berth.front.Front` (the other half holds the
states and the lifetime). While the front is open a request costs one state check, the in-flight
count, one write of its head and body to a kept-alive engine connection and the answer's bytes
passed back as they arrive; the slow states add the hold.
The answers the front writes itself (the ready path's 200, a 503, a 502) are :mod:`.answers`.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import time
from typing import TYPE_CHECKING, Callable

from .answers import Answers
from .clients import ClientLog
from .hold import Hold
from .rules import (
    HOLDING_STATES,
    FrontState,
    bad_berth_deadline,
    default_is_write,
    error_answer,
)
from .upstream import Address, EngineConnection, EngineFailed, Pool, StaleConnection

if TYPE_CHECKING:
    from .server import ClientConnection, Request

log = logging.getLogger("berth.front")
F = FrontState

_CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"
_BODY_METHODS = frozenset({b"POST", b"PUT", b"PATCH"})
#: The built-in rule's reads (:data:`.rules.READ_METHODS`) as the parser gives them: a forward of
#: one is not a model request served (a health check, a monitor's poll).
_READS = frozenset({b"GET", b"HEAD", b"OPTIONS"})


class RequestPath(Hold, Answers):
    """The request path of a front. Answers return whether the client's connection may carry
    another request."""

    #: A path (``berth run --front-health``) the front answers 200 itself while it holds writes
    #: (starting, closing, asleep, waking): "requests are accepted", so llama-swap's health check
    #: passes at its first poll and its requests wait here, with keep-alive bytes for streams,
    #: not inside llama-swap, which polls only once a second. Open, the engine answers it.
    ready_path: str | None = None

    # set by Front.__init__
    name: str
    wait_limit_s: float
    activity_every_s: float
    max_in_flight: int | None
    in_flight: int
    forwarded: int
    served: int
    held: int
    held_timeouts: int
    client_gone: int
    errors: int
    refused_reads: int
    _state: FrontState
    _stop_reason: str
    engine_state: str | None
    _fail_epoch: int
    _fail_reason: str
    _holding: int
    _arrived: dict
    _line: "collections.deque"
    clients: ClientLog
    _arrive: Callable[["Request"], None]
    _unheld: Callable[["Request"], None]
    _last_activity: float
    _addr: Address | None
    _pool: Pool
    _idle: asyncio.Event
    _changed: asyncio.Event
    _is_write: Callable[[str, str], bool]
    _on_activity: Callable[[], None] | None
    _on_unwanted: Callable[[], None] | None
    _ask_wake: Callable[[], None]
    _notify: Callable[[], None]
    _fence_check: Callable[[], None]

    async def _handle(self, req: "Request", client: "ClientConnection") -> bool:
        # A malformed X-Berth-Deadline is a 400 in every state, before anything is woken: a
        # client's mistake must not show only once its engine sleeps (docs/hosts/llama-swap.md).
        bad = bad_berth_deadline(req.headers)
        if bad is not None:
            req.conn.write(error_answer(
                400, "bad_deadline", f"X-Berth-Deadline: expected seconds to wait, like 60 or "
                f"0.5, got {bad!r}", "invalid_request_error", head=req.method == b"HEAD"))
            return True
        st = self._state
        if st is F.OPEN:
            # A slot free goes to the oldest held write first (issue 34: arrival order).
            if self.max_in_flight is None or not self._writes(req) or (
                    self.in_flight < self.max_in_flight and not self._line):
                return await self._forward(req, client)
            return await self._hold(req, client)
        if not self._writes(req):
            if self.ready_path is not None and st in HOLDING_STATES \
                    and req.path == self.ready_path:
                return self._accepting(req, st)
            self.refused_reads += 1
            return self._unavailable(req, str(st), f"engine {self.name!r} is {st}; the front "
                                     "answers reads itself until it serves, and a read never "
                                     "wakes it")
        if st in HOLDING_STATES:
            return await self._hold(req, client)
        return self._unavailable(req, self._stop_reason, f"engine {self.name!r} is not "
                                 f"running: {self._stop_reason}")

    def _writes(self, req: "Request") -> bool:
        try:
            return bool(self._is_write(req.method_str, req.path))
        except Exception:
            log.exception("front %s: is_write failed; using the method alone", self.name)
            return default_is_write(req.method_str, req.path)

    async def _forward(self, req: "Request", client: "ClientConnection",
                       headless: bool = False) -> bool:
        """Send ``req`` to the engine; its answer streams to ``client`` as it arrives. The
        in-flight count rises before the first suspension, so a drain that starts later waits.
        ``headless``: the client has the head of a held stream already (:mod:`.held`)."""
        addr = self._addr
        assert addr is not None
        self._forwarding(req)
        engine: EngineConnection | None = None
        reusable = False
        try:
            head, payload = await self._outgoing(req, client, addr)
            streamed = payload is None
            for retry in (False, True):
                try:
                    engine = await self._pool.acquire(addr)
                except (OSError, TimeoutError) as exc:
                    self.errors += 1
                    log.warning("front %s: engine unreachable: %r", self.name, exc)
                    return self._fail(req, client, headless, "engine_unreachable",
                                      f"engine {self.name!r} failed: {exc or type(exc).__name__}")
                engine.begin(client, req.method == b"HEAD", req.version == "1.0",
                             headless=headless)
                assert engine.done is not None
                if streamed:
                    await self._send_body(req, engine, head)
                else:
                    engine.write(payload)
                try:
                    reusable = await engine.done
                    break
                except StaleConnection:
                    engine.close()
                    engine = None
                    if streamed or retry:
                        raise
            return req.version != "1.0"
        except EngineFailed as exc:
            self.errors += 1
            if exc.started:
                # the engine cut the answer: end it by closing the client's connection (after
                # what arrived), so the client can tell the body is incomplete
                log.warning("front %s: engine cut the answer mid-stream: %s", self.name, exc)
                client.close()
                return False
            log.warning("front %s: engine failed: %s", self.name, exc)
            return self._fail(req, client, headless, "engine_failed",
                              f"engine {self.name!r} failed: {exc}")
        except asyncio.CancelledError:   # the client went, or the front stops
            self.client_gone += 1
            raise
        finally:
            if engine is not None:
                if reusable and addr is self._addr:
                    self._pool.release(engine, addr)
                else:
                    engine.close()   # the engine sees its connection close
            self._forwarded(req)

    async def _outgoing(self, req: "Request", client: "ClientConnection",
                        addr) -> tuple[bytes, bytes | None]:
        """The request's head for the engine, and its whole bytes (``None``: its body is
        streamed as it arrives)."""
        head = request_head(req, addr)
        if req.expect and not req.complete and not req.size:
            client.interim(_CONTINUE)   # the client sends its body only now
        if req.streamed:
            return head, None
        return head, request_bytes(req, head, await req.read_all())

    def _forwarding(self, req: "Request") -> None:
        """A request goes to the engine: count it in flight (a drain waits for it), and in
        ``served`` unless it is a read (issue 24: berthd learns of a request that came and went
        between two samples of ``in_flight``)."""
        self._arrived.setdefault(req, time.monotonic())
        self.in_flight += 1
        if self.in_flight == 1:
            self._idle.clear()
        self.forwarded += 1
        # The method alone, not is_write (a plugin hook per request on the open path): the
        # built-in rule, which no bundled adapter refines.
        if req.method not in _READS:
            self.served += 1
            self.clients.came(req)
        if self._on_activity is not None:
            now = time.monotonic()
            if now - self._last_activity >= self.activity_every_s:
                self._last_activity = now
                try:
                    self._on_activity()
                except Exception:
                    log.exception("front %s: on_activity callback failed", self.name)

    def _forwarded(self, req: "Request") -> None:
        """A forward ended (answered, failed, or its client went): its last answer (issue 34)."""
        self._arrived.pop(req, None)
        self.in_flight -= 1
        self.clients.left(req, True, self.in_flight == 0)
        self._fence_check()     # before a held request may take the slot (issue 34)
        if self.in_flight == 0:
            self._idle.set()
        if self.max_in_flight is not None and self._holding:
            self._notify()   # a slot freed: a waiting write may go

    async def _send_body(self, req: "Request", engine: EngineConnection, head: bytes) -> None:
        """Stream a large or chunked request body to the engine as it arrives."""
        if req.chunked:
            engine.write(head + b"Transfer-Encoding: chunked\r\n\r\n")
        else:
            engine.write(b"%sContent-Length: %d\r\n\r\n" % (head, req.length))
        while not engine.closed:
            data = await req.read_some()
            if not data:
                break
            engine.write(b"%x\r\n%s\r\n" % (len(data), data) if req.chunked else data)
            await engine.drain()
        if req.chunked:
            engine.write(b"0\r\n\r\n")

    @property
    def oldest_at(self) -> float | None:
        """When the oldest request held or forwarded now arrived at the front (``time.monotonic``
        seconds; ``None``: none). berthd's ladder keeps a busy holder's card for a waiter that
        asked later than that (issue 16: no engine waits behind requests newer than its own)."""
        return min(self._arrived.values(), default=None)


def request_head(req: "Request", addr: Address) -> bytes:
    """The request line and header lines for the engine, without the framing header."""
    return b"%s %s%s HTTP/1.1\r\n%s%s" % (req.method, addr.prefix, req.target, addr.host_line,
                                          b"".join(req.lines))


def request_bytes(req: "Request", head: bytes, body: bytes) -> bytes:
    """A whole request for the engine: ``head``, its length, and ``body``."""
    if body or req.length is not None or req.method in _BODY_METHODS:
        return b"%sContent-Length: %d\r\n\r\n%s" % (head, len(body), body)
    return head + b"\r\n"
