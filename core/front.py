"""The front: the only door to one engine, a reverse proxy with states (seed 002 "Fronts").

``berth run --front HOST:PORT`` owns one :class:`Front` for its engine. The front forwards every
request while the engine is awake; while it sleeps it holds writes, asks for the card on the first
one, and forwards once the engine answers. It never answers *for* the engine: what it says itself
is a 503 (held too long, engine not serving) or a 502 (engine failed), always in OpenAI's error
shape plus llama-swap's ``src`` so a client can tell Berth from the engine::

    {"error": {"message": "...", "type": "unavailable_error", "code": 503},
     "src": "berth", "reason": "wait_limit"}

States (:class:`FrontState`; edges in :data:`EDGES`, each labelled with why it is taken)::

    starting ──▶ open ──▶ closing ──▶ asleep ──▶ waking ──▶ open
                  ▲          │         │  ▲         │
                  └──────────┘         │  └─────────┘  wake failed: the next write asks again
              park called off          └──▶ open       woken by the broker, no write held
    (any) ──▶ stopped ──▶ starting

=========  ========================================  ================================
state      a write (POST, PUT, ...)                  a read (GET, HEAD, OPTIONS)
=========  ========================================  ================================
starting   held                                      503 at once, reason "starting"
open       forwarded                                 forwarded
closing    held (in-flight requests finish)          503 at once, reason "closing"
asleep     held; the first one calls ``on_wake``     503 at once, reason "asleep"
waking     held                                      503 at once, reason "waking"
stopped    503 at once, with the stop reason         503 at once, reason "stopped"
=========  ========================================  ================================

A read never wakes the engine (seed 002: monitors poll, and each poll would undo the sleep), and
the front never answers one 200 itself: llama-swap polls ``/health`` every second and takes a 200
as "ready" (reference "llama-swap", "Readiness and states"). Which requests are reads is
``is_write(method, path)`` (default: GET, HEAD and OPTIONS are reads; ``berth run`` may pass the
plugins' ``berth_front_is_write``); it is asked only while the front is not open.

A held request ends when the front opens (it is then forwarded), at the client's own deadline, at
``wait_limit_s``, or when the caller fails it (:meth:`Front.fail_held`, :meth:`Front.stopped`),
whichever is first: a 503 with ``Retry-After`` that names the reason, never a hang. The client's
deadline is the smallest of :data:`DEADLINE_HEADERS` (seconds; the openai Python client sends its
read timeout as ``X-Stainless-Read-Timeout``), less :data:`DEADLINE_MARGIN_S` so that the answer
arrives before the client gives up. A client that disconnects while held simply goes away
(counted in ``client_gone``); one that disconnects mid-forward closes the upstream connection, so
the engine sees the disconnect and stops generating (aiohttp's server no longer cancels a handler
when its client goes, so the front turns ``handler_cancellation`` on).

While open, requests pass through unchanged but for hop-by-hop headers (:data:`HOP_BY_HOP`,
``Proxy-*`` and those named in ``Connection``, both ways) and ``Host``. Bodies are neither
decompressed nor re-encoded; answers stream through as they arrive (server-sent events chunk by
chunk); request bodies over 1 MiB or without a length stream too. An engine that cannot be reached
gets the client a 502 (``src: "berth"``, reason ``engine_unreachable``); an engine that cuts a
stream mid-way ends it by closing the client's connection, so the client sees it incomplete.
WebSocket upgrades are not forwarded.

The API for ``berth run`` (every method runs on the event loop that called :meth:`Front.start`)::

    front = Front(host, port, *, name="engine", wait_limit_s=120.0, on_wake=None,
                  on_activity=None, on_state=None, is_write=None, activity_every_s=1.0,
                  shutdown_grace_s=2.0)
    await front.start()            # listening (port=0 picks one: front.port), state "starting"
    front.set_upstream(url)        # the engine's base URL; may change at any time
    front.open()                   # starting/closing/asleep/waking -> open: forward (held go too)
    await front.close_and_drain(timeout_s) -> bool   # open -> closing; True when nothing in flight
    front.sleep()                  # closing -> asleep (park done) or waking -> asleep (refused)
    front.waking()                 # asleep -> waking: the broker resumes on its own
    front.stopped(reason)          # -> stopped: held and new requests get 503 with reason
    front.starting()               # stopped -> starting: the engine starts again
    front.fail_held(reason) -> int # answer every held request 503 now; the state is unchanged
    front.state, front.since, front.in_flight, front.holding, front.counters()
    await front.stop()             # -> stopped, stop listening, close the upstream session

State methods return True when the state changed, False when it already was the target, and raise
:class:`IllegalFrontTransition` for an edge :data:`TRANSITIONS` lacks. ``on_wake()`` is awaited
in its own task once per sleep, when the first write arrives while asleep (never for a read); the
front moves to ``waking`` first. The front does not open when ``on_wake`` returns: the caller
calls :meth:`Front.open` when the engine answers (possibly from inside ``on_wake``). If
``on_wake`` raises, the front goes back to ``asleep`` and every held request gets a 503 with
reason ``"wake failed: <error>"``; the next write asks again. ``on_activity()`` is called when a
request is forwarded, at most once per ``activity_every_s`` seconds. ``on_state(old, new, why)``
is called on every transition. Callbacks must not block; exceptions from ``on_activity``,
``on_state`` and ``is_write`` are logged and do not reach the client.
"""

from __future__ import annotations

import asyncio
import enum
import json
import logging
import time
from typing import Awaitable, Callable, Mapping

import aiohttp
from aiohttp import web
from multidict import CIMultiDict
from yarl import URL

__all__ = [
    "Front", "FrontState", "EDGES", "TRANSITIONS", "HOLDING_STATES", "READ_METHODS",
    "HOP_BY_HOP", "DEADLINE_HEADERS", "DEADLINE_MARGIN_S", "IllegalFrontTransition",
]

log = logging.getLogger(__name__)


class FrontState(enum.StrEnum):
    """A front's states: the seed's four (open, closing, asleep, waking) plus ``starting`` (before
    the engine is up) and ``stopped`` (the engine is gone)."""

    STARTING = "starting"
    OPEN = "open"
    CLOSING = "closing"
    ASLEEP = "asleep"
    WAKING = "waking"
    STOPPED = "stopped"


F = FrontState

#: Every legal transition, labelled with why it is taken.
EDGES: dict[tuple[FrontState, FrontState], str] = {
    (F.STARTING, F.OPEN): "the engine answered",
    (F.OPEN, F.CLOSING): "a park, checkpoint or lend begins: drain first (seed 002 Fronts)",
    (F.CLOSING, F.ASLEEP): "in-flight requests done, the engine sleeps",
    (F.CLOSING, F.OPEN): "the park was called off, or the lend is done (the engine serves on)",
    (F.ASLEEP, F.WAKING): "a write arrived, or the broker resumes the lease",
    (F.ASLEEP, F.OPEN): "the engine was woken without a held write (the broker resumed it)",
    (F.WAKING, F.OPEN): "the wake answered",
    (F.WAKING, F.ASLEEP): "the wake failed or was refused; the next write asks again",
    (F.STOPPED, F.STARTING): "the run starts the engine again",
    **{(s, F.STOPPED): "the engine stopped, or the run is ending (rule 4: a wake that does not "
                       "answer stops the engine)" for s in FrontState if s is not F.STOPPED},
}

#: Allowed next states, by state.
TRANSITIONS: dict[FrontState, frozenset[FrontState]] = {
    st: frozenset(b for (a, b) in EDGES if a == st) for st in FrontState
}

#: States in which a write is held rather than forwarded or refused.
HOLDING_STATES = frozenset({F.STARTING, F.CLOSING, F.ASLEEP, F.WAKING})

#: Methods that never wake an engine (seed 002 Fronts).
READ_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})

#: Hop-by-hop headers (RFC 9110 §7.6.1), lower case; ``proxy-*`` and the names listed in
#: ``Connection`` are dropped too. Towards the engine ``Host``, ``Expect`` (the front answers it)
#: and ``Content-Length`` (set again from the body) are dropped as well.
HOP_BY_HOP = frozenset({"connection", "keep-alive", "te", "trailer", "trailers",
                        "transfer-encoding", "upgrade"})
_REQUEST_DROP = HOP_BY_HOP | {"host", "expect", "content-length"}

#: Request headers that carry the client's own deadline, in seconds from when it sent the request.
#: The openai Python client sends its read timeout as ``X-Stainless-Read-Timeout`` (older
#: Stainless clients: ``X-Stainless-Timeout``); a held request has sent nothing back, so the read
#: timeout is when that client gives up.
DEADLINE_HEADERS = ("X-Stainless-Read-Timeout", "X-Stainless-Timeout", "X-Berth-Deadline",
                    "X-Request-Timeout")

#: A held request is answered this many seconds before the client's own deadline.
DEADLINE_MARGIN_S = 0.1

_BUFFER_BODY_BYTES = 1 << 20   # request bodies up to this are read whole, larger ones streamed
_WHOLE_ANSWER_BYTES = 1 << 16  # answers of known length up to this are sent in one write
_RETRY_AFTER_S = 1
_CONNECT_TIMEOUT_S = 10.0
_KEEPALIVE_S = 60.0
_MAX_FIELD_BYTES = 65536       # longest request header line accepted (aiohttp's default: 8190)


class IllegalFrontTransition(RuntimeError):
    """A state change that :data:`TRANSITIONS` does not allow."""


class Front:
    """A reverse proxy for one engine with the states of seed 002 "Fronts".

    ``host``/``port``: the front's address (``port=0`` picks one; read :attr:`port` after
    :meth:`start`). ``name``: the engine's name, used in messages. ``wait_limit_s``: the longest
    a request is held, seconds. ``on_wake``: awaited once per sleep when the first write arrives
    while asleep. ``on_activity``: called when a request is forwarded, at most once per
    ``activity_every_s`` seconds. ``on_state(old, new, why)``: called on every transition.
    ``is_write(method, path)``: True when a request needs the engine awake (default: any method
    but GET, HEAD and OPTIONS).
    ``shutdown_grace_s``: how long :meth:`stop` lets in-flight requests finish, seconds.
    ``max_in_flight``: the most writes forwarded at once (the engine's parallel slots; ``None``:
    no limit). Further writes wait in the front, not in the engine's own queue, so a park waits
    only for what the engine is running, and what waits can be held while it sleeps.
    ``on_unwanted``: called when the last held request leaves (answered at its deadline, or its
    client gone) while the front is ``waking``: nobody waits for that wake any more.

    Counters (plain ints): ``forwarded`` requests sent to the engine, ``held`` requests that
    waited, ``held_timeouts`` held requests answered 503 at a deadline, ``client_gone`` clients
    that disconnected before their answer was complete, ``errors`` engine failures (502s and
    streams cut mid-way), ``refused_reads`` reads answered 503 while not open, ``wakes`` calls of
    ``on_wake``. ``in_flight``: requests being forwarded now.
    """

    def __init__(self, host: str, port: int, *, name: str = "engine", wait_limit_s: float = 120.0,
                 on_wake: Callable[[], Awaitable[None]] | None = None,
                 on_activity: Callable[[], None] | None = None,
                 on_state: Callable[[FrontState, FrontState, str], None] | None = None,
                 is_write: Callable[[str, str], bool] | None = None,
                 activity_every_s: float = 1.0, shutdown_grace_s: float = 2.0,
                 max_in_flight: int | None = None,
                 on_unwanted: Callable[[], None] | None = None):
        if wait_limit_s <= 0:
            raise ValueError(f"wait_limit_s must be positive, got {wait_limit_s}")
        if max_in_flight is not None and max_in_flight < 1:
            raise ValueError(f"max_in_flight must be at least 1, got {max_in_flight}")
        self.max_in_flight = max_in_flight
        self._on_unwanted = on_unwanted
        self.host, self.port, self.name = host, port, name
        self.wait_limit_s = wait_limit_s
        self.activity_every_s = activity_every_s
        self._on_wake, self._on_activity, self._on_state = on_wake, on_activity, on_state
        self._is_write = is_write or _is_write
        self._shutdown_grace_s = shutdown_grace_s
        self._state = F.STARTING
        self.since = time.monotonic()           # when the current state began (monotonic s)
        self._upstream: str | None = None       # base URL without a trailing slash
        self._changed = asyncio.Event()         # replaced on every change; held requests wait on it
        self._fail_epoch, self._fail_reason = 0, ""
        self._stop_reason = "engine stopped"
        self._idle = asyncio.Event()            # set while in_flight == 0
        self._idle.set()
        self._wake_tasks: set[asyncio.Task[None]] = set()
        self._runner: web.ServerRunner | None = None
        self._session: aiohttp.ClientSession | None = None
        self._last_activity = float("-inf")
        self.in_flight = self._holding = 0
        self.forwarded = self.held = self.held_timeouts = self.client_gone = self.errors = 0
        self.refused_reads = self.wakes = 0

    # ---- lifetime --------------------------------------------------------------------------------

    async def start(self) -> None:
        """Listen on the front's address, in state ``starting``. Raises ``OSError`` if the address
        is taken.

        The front is aiohttp's low-level server with one handler: no router, no middlewares (it
        answers every path the same way, and that saves work on every request)."""
        self._session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=0, keepalive_timeout=_KEEPALIVE_S,
                                           ttl_dns_cache=None),
            auto_decompress=False, cookie_jar=aiohttp.DummyCookieJar(),
            timeout=aiohttp.ClientTimeout(total=None, sock_connect=_CONNECT_TIMEOUT_S),
            skip_auto_headers=("Accept", "Accept-Encoding", "User-Agent", "Content-Type"))
        server = web.Server(self._handle, handler_cancellation=True, access_log=None,
                            max_field_size=_MAX_FIELD_BYTES)
        runner = web.ServerRunner(server, shutdown_timeout=self._shutdown_grace_s)
        try:
            await runner.setup()
            await web.TCPSite(runner, self.host, self.port, reuse_address=True).start()
        except BaseException:
            await runner.cleanup()
            await self._session.close()
            raise
        self._runner = runner
        self.port = runner.addresses[0][1]

    async def stop(self) -> None:
        """Shut the front down:

        1. move to ``stopped`` (reason "front stopped" unless already stopped): every held
           request is answered 503 at once;
        2. cancel a wake in progress;
        3. stop listening and give in-flight requests ``shutdown_grace_s`` to finish;
        4. close the upstream session.
        """
        if self._state is not F.STOPPED:
            self.stopped("front stopped")
        for task in list(self._wake_tasks):
            task.cancel()
        if self._runner is not None:
            runner, self._runner = self._runner, None
            await runner.cleanup()
        if self._session is not None:
            session, self._session = self._session, None
            await session.close()

    @property
    def url(self) -> str:
        """The front's base URL, e.g. ``http://127.0.0.1:5800``."""
        return f"http://{self.host}:{self.port}"

    @property
    def upstream(self) -> str | None:
        """The engine's base URL, or None before :meth:`set_upstream`."""
        return self._upstream

    def set_upstream(self, url: str) -> None:
        """Send requests to ``url`` (``http://HOST:PORT``, optionally with a path prefix) from now
        on. May be called in any state; requests already forwarded keep their connection."""
        u = URL(url)
        if u.scheme not in ("http", "https") or not u.host:
            raise ValueError(f"upstream must be an http(s) URL with a host, got {url!r}")
        self._upstream = str(u).rstrip("/")

    # ---- states ----------------------------------------------------------------------------------

    @property
    def state(self) -> FrontState:
        """The current state."""
        return self._state

    @property
    def holding(self) -> int:
        """Requests held now."""
        return self._holding

    def _move(self, new: FrontState, why: str = "") -> bool:
        """The only place the state changes: check the edge, record the time, wake every held
        request, emit one event. Moving to the current state does nothing and returns False."""
        old = self._state
        if new is old:
            return False
        edge = EDGES.get((old, new))
        if edge is None:
            raise IllegalFrontTransition(
                f"front {self.name!r}: {old} -> {new} is not allowed; from {old} it may go to "
                f"{', '.join(sorted(TRANSITIONS[old])) or 'nowhere'}")
        self._state, self.since = new, time.monotonic()
        self._notify()
        log.info("front %s: %s -> %s (%s)", self.name, old, new, why or edge)
        if self._on_state is not None:
            try:
                self._on_state(old, new, why or edge)
            except Exception:
                log.exception("front %s: on_state callback failed", self.name)
        return True

    def _notify(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()

    def starting(self) -> bool:
        """``stopped -> starting``: the run starts the engine again (writes held, reads 503)."""
        return self._move(F.STARTING)

    def open(self) -> bool:
        """Forward from now on; held requests are forwarded. Raises
        :class:`IllegalFrontTransition` from ``asleep`` (go through :meth:`waking`) or ``stopped``,
        and ``RuntimeError`` before :meth:`set_upstream`."""
        if self._upstream is None:
            raise RuntimeError(f"front {self.name!r}: set_upstream() before open()")
        return self._move(F.OPEN)

    async def close_and_drain(self, timeout_s: float) -> bool:
        """``open -> closing``: hold new requests and wait up to ``timeout_s`` seconds for the
        in-flight ones to finish. Returns True when none is left. The state stays ``closing``:
        the caller then calls :meth:`sleep` (park done), :meth:`open` (called off) or
        :meth:`stopped` (seed 002: "Only then does the park, checkpoint or lend begin").
        In a state that forwards nothing (starting, asleep, waking, stopped) nothing is in flight:
        it returns True at once and leaves the state as it is."""
        if self._state is F.OPEN:
            self._move(F.CLOSING)
        elif self._state is not F.CLOSING:
            return True
        try:
            async with asyncio.timeout(timeout_s):
                await self._idle.wait()
            return True
        except TimeoutError:
            return False

    def sleep(self) -> bool:
        """``closing -> asleep`` (or ``waking -> asleep`` when a wake is refused). Writes held
        from now on, or already held, make the front ask for the card through ``on_wake``."""
        return self._move(F.ASLEEP)

    def waking(self) -> bool:
        """``asleep -> waking``: the broker resumes the lease on its own (no ``on_wake`` call)."""
        return self._move(F.WAKING)

    def stopped(self, reason: str = "engine stopped") -> bool:
        """Move to ``stopped``: every held request and every new one is answered 503 with
        ``reason``. :meth:`starting` leaves it."""
        self._stop_reason = reason
        self.fail_held(reason)
        return self._move(F.STOPPED, reason)

    def fail_held(self, reason: str) -> int:
        """Answer every request held now with a 503 naming ``reason``; requests that arrive later
        are held as the state says. Returns how many were held."""
        self._fail_epoch += 1
        self._fail_reason = reason
        self._notify()
        return self._holding

    def counters(self) -> dict[str, int | str]:
        """The state and counters, for ``berth status``."""
        return {"state": str(self._state), "in_flight": self.in_flight, "holding": self._holding,
                "forwarded": self.forwarded, "held": self.held,
                "held_timeouts": self.held_timeouts, "client_gone": self.client_gone,
                "errors": self.errors, "refused_reads": self.refused_reads, "wakes": self.wakes}

    def _ask_wake(self) -> None:
        if self._on_wake is None:
            return   # nobody to ask: the request waits for the caller or its deadline
        self._move(F.WAKING, "a write arrived while asleep")
        self.wakes += 1
        task = asyncio.get_running_loop().create_task(self._wake(self._on_wake))
        self._wake_tasks.add(task)
        task.add_done_callback(self._wake_tasks.discard)

    async def _wake(self, on_wake: Callable[[], Awaitable[None]]) -> None:
        try:
            await on_wake()
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            reason = f"wake failed: {exc or type(exc).__name__}"
            log.warning("front %s: %s", self.name, reason)
            if self._state is F.WAKING:
                self._move(F.ASLEEP, reason)
            self.fail_held(reason)

    # ---- requests --------------------------------------------------------------------------------

    async def _handle(self, request: web.BaseRequest) -> web.StreamResponse:
        st = self._state
        if st is F.OPEN:
            if self.max_in_flight is None or self.in_flight < self.max_in_flight \
                    or not self._writes(request):
                return await self._forward(request)
            return await self._hold(request)
        if not self._writes(request):
            self.refused_reads += 1
            return self._unavailable(str(st), f"engine {self.name!r} is {st}; the front answers "
                                     "reads itself until it serves, and a read never wakes it")
        if st in HOLDING_STATES:
            return await self._hold(request)
        return self._unavailable(self._stop_reason, f"engine {self.name!r} is not running: "
                                 f"{self._stop_reason}")

    def _writes(self, request: web.BaseRequest) -> bool:
        try:
            return bool(self._is_write(request.method, request.path))
        except Exception:
            log.exception("front %s: is_write failed; using the method alone", self.name)
            return _is_write(request.method, request.path)

    async def _hold(self, request: web.BaseRequest) -> web.StreamResponse:
        """Wait for ``open`` (then forward), a failure, the client's deadline or the wait limit."""
        loop = asyncio.get_running_loop()
        limit_s, reason = self.wait_limit_s, "wait_limit"
        client_s = _client_deadline_s(request.headers)
        if client_s is not None and client_s - DEADLINE_MARGIN_S < limit_s:
            limit_s, reason = max(0.0, client_s - DEADLINE_MARGIN_S), "client_deadline"
        epoch = self._fail_epoch
        self.held += 1
        self._holding += 1
        try:
            async with asyncio.timeout_at(loop.time() + limit_s):
                while True:
                    if self._fail_epoch != epoch:
                        return self._unavailable(self._fail_reason, f"engine {self.name!r} is "
                                                 f"unavailable: {self._fail_reason}")
                    st = self._state
                    if st is F.OPEN and (self.max_in_flight is None
                                         or self.in_flight < self.max_in_flight):
                        break
                    if st is F.STOPPED:
                        return self._unavailable(self._stop_reason, f"engine {self.name!r} is "
                                                 f"not running: {self._stop_reason}")
                    if st is F.ASLEEP:
                        self._ask_wake()
                    await self._changed.wait()
        except TimeoutError:
            self.held_timeouts += 1
            who = "the client's deadline" if reason == "client_deadline" else "the wait limit"
            return self._unavailable(reason, f"engine {self.name!r} was not ready within {who} "
                                     f"({limit_s:g} s, state {self._state}); the request was "
                                     "held and not sent")
        except asyncio.CancelledError:
            self.client_gone += 1
            raise
        finally:
            self._holding -= 1
            if self._holding == 0 and self._state is F.WAKING and self._on_unwanted is not None:
                try:
                    self._on_unwanted()
                except Exception:
                    log.exception("front %s: on_unwanted callback failed", self.name)
        return await self._forward(request)

    async def _forward(self, request: web.BaseRequest) -> web.StreamResponse:
        """Send ``request`` to the engine and stream the answer back as it arrives."""
        session = self._session
        assert session is not None and self._upstream is not None
        self.in_flight += 1
        if self.in_flight == 1:
            self._idle.clear()
        self.forwarded += 1
        if self._on_activity is not None:
            now = time.monotonic()
            if now - self._last_activity >= self.activity_every_s:
                self._last_activity = now
                try:
                    self._on_activity()
                except Exception:
                    log.exception("front %s: on_activity callback failed", self.name)
        up: aiohttp.ClientResponse | None = None
        resp: web.StreamResponse | None = None
        try:
            headers = _strip(request.headers, _REQUEST_DROP)
            data: bytes | aiohttp.StreamReader | None = None
            if request.body_exists:
                if "Expect" in request.headers:
                    await _continue(request)   # the client sends its body only now
                length = request.content_length
                if length is not None and length <= _BUFFER_BODY_BYTES:
                    data = await request.content.readexactly(length)
                else:
                    data = request.content
                    if length is not None:
                        headers["Content-Length"] = str(length)
            url = URL(self._upstream + request.raw_path, encoded=True)
            try:
                up = await session.request(request.method, url, headers=headers, data=data,
                                           allow_redirects=False)
            except (aiohttp.ClientError, OSError, asyncio.TimeoutError) as exc:
                self.errors += 1
                unreachable = isinstance(exc, aiohttp.ClientConnectorError)
                log.warning("front %s: engine failed: %r", self.name, exc)
                return _error(502, "engine_unreachable" if unreachable else "engine_failed",
                              f"engine {self.name!r} failed: {exc or type(exc).__name__}",
                              "upstream_error")
            length = up.content_length
            if length is not None and 0 < length <= _WHOLE_ANSWER_BYTES and \
                    request.method != "HEAD":
                # A small answer of known length: one write for headers and body (a stream
                # sends its headers at once, then each chunk as it comes).
                try:
                    body = await up.read()
                except (aiohttp.ClientPayloadError, aiohttp.ClientConnectionError) as exc:
                    self.errors += 1
                    log.warning("front %s: engine failed mid-answer: %r", self.name, exc)
                    return _error(502, "engine_failed", f"engine {self.name!r} failed: {exc}",
                                  "upstream_error")
                return web.Response(status=up.status, reason=up.reason, body=body,
                                    headers=_strip(up.headers, HOP_BY_HOP))
            resp = web.StreamResponse(status=up.status, reason=up.reason,
                                      headers=_strip(up.headers, HOP_BY_HOP))
            await resp.prepare(request)
            read, write = up.content.readany, resp.write
            while True:
                try:
                    chunk = await read()
                except (aiohttp.ClientPayloadError, aiohttp.ClientConnectionError) as exc:
                    # The engine cut the stream: end it by closing the client's connection
                    # without a final chunk, so the client can tell the body is incomplete.
                    self.errors += 1
                    log.warning("front %s: engine cut the response mid-stream: %r", self.name, exc)
                    up.close()
                    if request.transport is not None:
                        request.transport.close()
                    return resp
                if not chunk:
                    break
                await write(chunk)   # ConnectionResetError: the client went
            up.release()
            return resp
        except asyncio.CancelledError:   # the client went (handler cancellation) or stop()
            self.client_gone += 1
            if up is not None:
                up.close()   # the engine sees its connection close
            raise
        except (ConnectionResetError, asyncio.IncompleteReadError):   # the client went
            self.client_gone += 1
            if up is not None:
                up.close()
            if request.transport is not None:
                request.transport.close()
            return resp if resp is not None else web.Response(status=400)   # nobody reads it
        finally:
            self.in_flight -= 1
            if self.in_flight == 0:
                self._idle.set()
            if self.max_in_flight is not None and self._holding:
                self._notify()          # a slot freed: a waiting write may go
    def _unavailable(self, reason: str, message: str) -> web.Response:
        return _error(503, reason, message, "unavailable_error")


def _error(status: int, reason: str, message: str, type_: str) -> web.Response:
    body = {"error": {"message": message, "type": type_, "code": status}, "src": "berth",
            "reason": reason}
    headers = {"Retry-After": str(_RETRY_AFTER_S)} if status == 503 else None
    return web.Response(status=status, body=json.dumps(body).encode(),
                        content_type="application/json", headers=headers)


def _is_write(method: str, path: str) -> bool:
    return method not in READ_METHODS


async def _continue(request: web.BaseRequest) -> None:
    """Answer ``Expect: 100-continue`` (aiohttp's low-level server leaves it to the handler)."""
    if request.version == aiohttp.HttpVersion11 and \
            request.headers["Expect"].lower() == "100-continue":
        await request.writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        request.writer.output_size = 0   # the answer proper has not started


def _strip(headers: Mapping[str, str], drop: frozenset[str]) -> CIMultiDict[str]:
    """Copy ``headers`` without hop-by-hop ones: those in ``drop``, ``proxy-*``, and those named
    in ``Connection``."""
    named = headers.get("Connection")
    listed = {t.strip().lower() for t in named.split(",")} if named else ()
    out: CIMultiDict[str] = CIMultiDict()
    for k, v in headers.items():
        lk = k.lower()
        if lk in drop or lk in listed or lk.startswith("proxy-"):
            continue
        out.add(k, v)
    return out


def _client_deadline_s(headers: Mapping[str, str]) -> float | None:
    """The client's own deadline in seconds from now, from :data:`DEADLINE_HEADERS`; the
    smallest valid one, or None."""
    best: float | None = None
    for name in DEADLINE_HEADERS:
        raw = headers.get(name)
        if raw is None:
            continue
        try:
            v = float(raw)
        except ValueError:
            continue
        if v == v and v >= 0 and (best is None or v < best):   # v == v: not NaN
            best = v
    return best
