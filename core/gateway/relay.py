"""One try of a request at one machine, on the front's own HTTP code (issue 27 "As light as the
front"): the request goes out on a kept-alive :class:`berth.front.upstream.EngineConnection` of
the gateway's pool, and the answer streams back into the client's connection as it arrives,
server-sent events chunk by chunk, with no task woken per chunk.

Every relay is bounded (issue 27 "Every relay is bounded"):

- after the answer's headers, a gap between two reads longer than the route's ``gap_s``
  (``[engines.X] read_timeout``, default 30 s) ends it (:class:`GapTimeout`, checked by
  :meth:`Relays.sweep`);
- a peer marked down ends its relays at once (:meth:`Relays.peer_down`, :class:`PeerGone`);
- a client that goes away closes the connection, so the engine (or the peer's gateway, and
  through it the engine) sees the disconnect and stops generating.

A try that fails before any byte of the answer reached the client is reported as such
(:class:`Tried`) so the caller may send the request to another machine. A stream cut after its
headers ends with an in-band error event and the stream's proper end when it is a chunked
event stream (:func:`berth.gateway.errors.event`); any other answer cut mid-way ends by closing
the client's connection, so the client sees it incomplete.

An error answer of the engine (status 400 or more, JSON of at most 64 KiB with a length) gets
``"src": "engine"`` added when it names no ``src`` (issue 14: errors say who failed).
"""

from __future__ import annotations

import json
import re
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable

from berth.front.upstream import Address, EngineConnection, EngineFailed, Pool, StaleConnection
from berth.gateway.errors import event

if TYPE_CHECKING:
    from berth.front.server import ClientConnection, Request
    from berth.gateway.body import Body

__all__ = ["RelayConnection", "Relays", "Target", "Tried", "attempt", "end_cut", "GapTimeout",
           "PeerGone", "DEFAULT_GAP_S"]

#: The longest gap between two reads of an answer, after its headers, seconds (issue 27).
DEFAULT_GAP_S = 30.0
_MARK_BYTES = 1 << 16
_LENGTH_LINE = re.compile(rb"(?im)^content-length:[^\r\n]*\r\n")


class GapTimeout(EngineFailed):
    """No byte of the answer for longer than the route's gap."""


class PeerGone(EngineFailed):
    """The peer was marked down while the answer was under way."""


class RelayConnection(EngineConnection):
    """An engine connection with what the gateway adds: header lines on the answer
    (``extra``), ``src`` marked on small JSON error bodies, the time of the last read
    (``read_at``, monotonic seconds) for the gap limit, whether the answer is an event stream
    (``sse``) and whether any of it reached the client (``sent``). ``peer``: the peer it goes
    to, None for this machine."""

    def __init__(self, pool: Pool):
        super().__init__(pool)
        self.peer: object | None = None
        self.gap_s: float | None = None
        self.src: bytes | None = None
        self.read_at = 0.0
        self.sent = False
        self._held: list[bytes] | None = None
        self._held_head = b""

    def relay(self, client: "ClientConnection", req: "Request", *, extra: bytes = b"",
              src: bytes | None = None, gap_s: float | None = None, peer: object | None = None,
              on_settled: Callable | None = None) -> None:
        """Tie the connection to ``client`` for the answer to ``req`` (see
        :meth:`EngineConnection.begin`)."""
        self.extra, self.src, self.gap_s, self.peer = extra, src, gap_s, peer
        self.sent = False
        self._held = None
        self.begin(client, req.method == b"HEAD", req.version == "1.0", on_settled)

    def fail(self, exc: EngineFailed) -> None:
        """End the exchange now with ``exc`` and close the connection."""
        if not self.active:
            return
        self._settle(exc)
        self.close()
        self._deliver()

    @property
    def sse(self) -> bool:
        """Whether the answer is an event stream (its headers, kept until the next exchange)."""
        return any(n.lower() == b"content-type" and b"event-stream" in v.lower()
                   for n, v in self.headers)

    def on_headers_complete(self) -> None:
        was = self.started
        super().on_headers_complete()
        if was or not self.started:
            return
        if self.src is None or self.head_only or self.parser.get_status_code() < 400:
            return
        length = next((int(v) for n, v in self.headers if n.lower() == b"content-length"
                       and v.strip().isdigit()), None)
        if length is not None and length <= _MARK_BYTES:
            self._held_head, self._held = self.out.pop(), []

    def _flush(self) -> None:
        # after every read (EngineConnection.data_received), so the read's time is stamped
        # here rather than in a data_received of its own: one Python call less per read
        self.read_at = time.monotonic()
        if self._held is not None:
            self._held.extend(self.body)
            self.body.clear()
            if self.ended:
                self._write_marked()
            return
        if self.out or self.body:
            self.sent = True
        super()._flush()

    def _write_marked(self) -> None:
        payload = _with_src(b"".join(self._held or ()), self.src or b"")
        head = _LENGTH_LINE.sub(b"", self._held_head)
        self._held = None
        self.sent = True
        if self.client is not None:
            self.client.write(b"%sContent-Length: %d\r\n\r\n%s" % (head[:-2], len(payload),
                                                                  payload))


def _with_src(payload: bytes, src: bytes) -> bytes:
    """An error body with ``"src"`` added when it is a JSON object without one; else as it was."""
    try:
        doc = json.loads(payload)
    except (ValueError, RecursionError):
        return payload
    if not isinstance(doc, dict) or "src" in doc:
        return payload
    return json.dumps({**doc, "src": src.decode()}).encode()


class Relays:
    """The relays under way, for the limits on them."""

    def __init__(self) -> None:
        self.live: set[RelayConnection] = set()
        self.gap_timeouts = self.peer_cuts = 0

    def sweep(self, now: float) -> None:
        """End every relay whose answer has been silent past its gap (``now``: monotonic s)."""
        for c in list(self.live):
            if c.gap_s is not None and c.started and c.active and now - c.read_at > c.gap_s:
                self.gap_timeouts += 1
                c.fail(GapTimeout(f"no byte of the answer for {c.gap_s:g} s", c.started))

    def peer_down(self, peer: object, why: str) -> None:
        """End every relay to ``peer`` at once."""
        for c in list(self.live):
            if c.peer is peer and c.active:
                self.peer_cuts += 1
                c.fail(PeerGone(f"the peer is down ({why})", c.started))


@dataclass(frozen=True)
class Target:
    """Where one try goes: ``machine`` (its name), ``addr`` (the front, engine or peer gateway),
    ``peer`` (the :class:`berth.gateway.peers.Peer`, None for this machine), ``gap_s`` (see the
    module docstring), ``extra`` (header lines added to the answer), ``src`` (marked on error
    bodies), ``connect_s`` (the longest wait for a connection, seconds)."""

    machine: str
    addr: Address
    peer: object | None = None
    gap_s: float = DEFAULT_GAP_S
    extra: bytes = b""
    src: bytes | None = None
    connect_s: float = 10.0


@dataclass(frozen=True)
class Tried:
    """How a try went. ``answered``: the client got an answer (whole, or cut after its head:
    ``cut`` says why); else nothing reached the client and ``why``/``kind`` say what failed
    (``unreachable``: no connection; ``gone``: the peer went down; ``failed``: the connection
    closed or the answer was not HTTP). ``keep``: the client's connection may carry another
    request."""

    answered: bool
    keep: bool = True
    kind: str = "answered"
    why: str = ""
    cut: str = ""


async def attempt(pool: Pool, relays: Relays, req: "Request", client: "ClientConnection",
                  target: Target, body: "Body", sign: bytes = b"") -> Tried:
    """Send ``req`` (its ``body`` already read) to ``target``, the answer streaming to
    ``client``. ``sign``: header lines added to the request (a peer call's signature). A kept-
    alive connection the other side had closed is replaced once."""
    addr = target.addr
    head = b"%s %s%s HTTP/1.1\r\n%s%s%s" % (req.method, addr.prefix, req.target, addr.host_line,
                                            b"".join(req.lines), sign)
    for retry in (False, True):
        try:
            conn = pool.take(addr) or await pool.acquire(addr, target.connect_s)
        except (OSError, TimeoutError) as exc:
            return Tried(False, kind="unreachable", why=f"{exc or type(exc).__name__}")
        assert isinstance(conn, RelayConnection)
        conn.relay(client, req, extra=target.extra, src=target.src, gap_s=target.gap_s,
                   peer=target.peer)
        relays.live.add(conn)
        if target.peer is not None and not getattr(target.peer, "up", True):
            conn.fail(PeerGone("the peer went down as the request left", False))
        reusable = False
        try:
            await body.send(conn, head)
            assert conn.done is not None
            reusable = await conn.done
            return Tried(True, keep=req.version != "1.0")
        except StaleConnection:
            if retry:
                return Tried(False, kind="failed", why="the connection closed before an answer")
        except EngineFailed as exc:
            if conn.sent:
                return end_cut(conn, client, exc, target)
            return Tried(False, kind="gone" if isinstance(exc, PeerGone) else "failed",
                         why=str(exc))
        finally:
            relays.live.discard(conn)
            if reusable and not conn.closed:
                pool.release(conn, addr)
            else:
                conn.close()       # the other side sees its connection close
    raise AssertionError("unreachable")


def end_cut(conn: RelayConnection, client: "ClientConnection", exc: EngineFailed,
         target: Target) -> Tried:
    """The answer was cut after part of it reached the client: end an event stream in band,
    anything else by closing the client's connection."""
    if isinstance(exc, GapTimeout):
        status, reason = 504, "upstream_stalled"
    elif isinstance(exc, PeerGone):
        status, reason = 502, "peer_down"
    else:
        status, reason = 502, "upstream_cut"
    src = "peer" if target.peer is not None else "berth"
    message = f"the answer from {target.machine} was cut: {exc}"
    if conn.sse and conn.rechunk and not conn.head_only:
        data = event(status, reason, message, src)
        client.write(b"%x\r\n%s\r\n0\r\n\r\n" % (len(data), data))
        conn.rechunk = False
        return Tried(True, keep=True, cut=reason)
    client.close()
    return Tried(True, keep=False, cut=reason)
