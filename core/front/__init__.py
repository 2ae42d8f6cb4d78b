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
    (any) ──▶ stopped ──▶ starting       starting ──▶ asleep: drained before it served

=========  ========================================  ================================
state      a write (POST, PUT, ...)                  a read (GET, HEAD, OPTIONS)
=========  ========================================  ================================
starting   held                                      503 at once, reason "starting"
open       forwarded (held past max_in_flight)       forwarded
closing    held (in-flight requests finish)          503 at once, reason "closing"
asleep     held; the first one calls ``on_wake``     503 at once, reason "asleep"
waking     held                                      503 at once, reason "waking"
stopped    503 at once, with the stop reason         503 at once, reason "stopped"
=========  ========================================  ================================

A read never wakes the engine (seed 002: monitors poll, and each poll would undo the sleep), and
the front answers no read 200 itself, but for one path when told: with ``ready_path`` set
(``berth run --front-health``) it answers that path 200 while it holds writes, so llama-swap,
which polls its health check and takes a 200 as "ready" (reference "llama-swap", "Readiness and
states"), hands requests over to be held here. A streaming request held long gets SSE keep-alive
bytes (:mod:`.held`). Which requests are reads is
``is_write(method, path)`` (default: GET, HEAD and OPTIONS are reads; ``berth run`` may pass the
plugins' ``berth_front_is_write``); it is asked only while the front is not open.

With ``max_in_flight`` (the engine's slots: ``berth run`` declares or measures them, issue 34)
an open front forwards at most that many writes at once and holds the rest in arrival order, the
same hold as while asleep: a park then waits only for the requests the engine runs, the held ones
stay held across it, and a slot that frees goes to the oldest held write.

A held request ends when the front opens (it is then forwarded), at the client's own deadline, at
``wait_limit_s``, or when the caller fails it (:meth:`Front.fail_held`, :meth:`Front.stopped`),
whichever is first: a 503 with ``Retry-After`` that names the reason, never a hang. The client's
deadline is the smallest of :data:`DEADLINE_HEADERS` (seconds; the openai Python client sends its
read timeout as ``X-Stainless-Read-Timeout``), less :data:`DEADLINE_MARGIN_S` so that the answer
arrives before the client gives up. A client that disconnects while held simply goes away
(counted in ``client_gone``); one that disconnects mid-forward closes the upstream connection, so
the engine sees the disconnect and stops generating.

While open, requests pass through unchanged but for hop-by-hop headers (:data:`HOP_BY_HOP`,
``Proxy-*`` and those named in ``Connection``, both ways) and ``Host``. Bodies are neither
decompressed nor re-encoded; answers stream through as they arrive (server-sent events chunk by
chunk); request bodies over 1 MiB or without a length stream too. Connections to the engine are
kept alive and reused (one that the engine closed while idle is replaced, and its request sent
again once). An engine that cannot be reached
gets the client a 502 (``src: "berth"``, reason ``engine_unreachable``); an engine that cuts a
stream mid-way ends it by closing the client's connection, so the client sees it incomplete.
WebSocket upgrades are not forwarded (the request goes as a plain one, then the connection closes).
A request target that is not a path (absolute-form, ``GET http://x/y``) is a 400, and so is a
malformed body (a chunk's framing) while nothing of an answer has gone to the client: a held
write whose body streams asks for the wake only once its body is in (all of it, or the first MiB
the front buffers), so a malformed one wakes nothing.

Every client connection is held to the front's :class:`~berth.front.listen.Limits` (issue 26,
:mod:`.listen`, the same for the gateway): a request head within 10 s, a kept-alive connection
idle (or a request body silent) at most 60 s, and a bound on open connections from the file
descriptor limit, beyond which the connection that waited longest for its head gives its place,
else the new one gets a 503 at once.

How (measured in ``bench/front.py``, beside nginx): the front is an asyncio protocol over
httptools' C parser on both sides (:mod:`.server`, :mod:`.upstream`), not aiohttp's server and
client; the request path (:mod:`.path`) is the same code in every state, the open state only
skips the hold, and its most common case (a whole small body, an idle kept-alive engine
connection, nothing else pending on the client's connection) is forwarded from the parser's
callback without a task (:mod:`.fast`). The rules as data are in :mod:`.rules`.

The API for ``berth run`` (every method runs on the event loop that called :meth:`Front.start`)::

    front = Front(host, port, *, name="engine", wait_limit_s=120.0, on_wake=None,
                  on_activity=None, on_state=None, is_write=None, activity_every_s=1.0,
                  shutdown_grace_s=2.0, max_in_flight=None, on_unwanted=None, limits=None)
    await front.start()            # listening (port=0 picks one: front.port), state "starting"
    front.set_upstream(url)        # the engine's base URL; may change at any time
    front.open()                   # starting/closing/asleep/waking -> open: forward (held go too)
    await front.close_and_drain(timeout_s, why="") -> bool   # open -> closing; True when none in flight
    front.sleep()                  # closing -> asleep (park done) or waking -> asleep (refused)
    front.waking()                 # asleep -> waking: the broker resumes on its own
    front.stopped(reason)          # -> stopped: held and new requests get 503 with reason
    front.starting()               # stopped -> starting: the engine starts again
    front.fail_held(reason) -> int # answer every held request 503 now; the state is unchanged
    front.set_max_in_flight(n)     # forward at most n writes at once (None: all); held look again
    front.set_cause(cause, lasting) # why the lease waits: named in held 503s; lasting: answer now
    front.state, front.since, front.in_flight, front.holding, front.counters()
    await front.stop()             # -> stopped, stop listening, close engine connections

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

from typing import TYPE_CHECKING, Any

from .rules import (
                    DEADLINE_HEADERS,
                    DEADLINE_MARGIN_S,
                    EDGES,
                    HOLDING_STATES,
                    HOP_BY_HOP,
                    READ_METHODS,
                    TRANSITIONS,
                    FrontState,
                    IllegalFrontTransition,
)

__all__ = [
    "Front", "Limits", "Listener", "FrontState", "EDGES", "TRANSITIONS", "HOLDING_STATES", "READ_METHODS",
    "HOP_BY_HOP", "DEADLINE_HEADERS", "DEADLINE_MARGIN_S", "IllegalFrontTransition",
]

if TYPE_CHECKING:
    from .front import Front
    from .listen import Limits, Listener

#: Loaded on first use (PEP 562): berthd reads only the listener's limits (for its control API
#: and board), and the front's own modules cost each berthd's start CPU (issue 38).
_HOME = {"Front": ".front", "Limits": ".listen", "Listener": ".listen"}


def __getattr__(name: str) -> Any:
    if name not in _HOME:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib
    return getattr(importlib.import_module(_HOME[name], __name__), name)
