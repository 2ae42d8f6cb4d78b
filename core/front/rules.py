"""The front's rules as data: states and their edges, which requests are reads, hop-by-hop
headers, the client's deadline, and the answers the front gives itself (seed 002 "Fronts")."""

from __future__ import annotations

import enum
import json
from http import HTTPStatus
from typing import Iterable

__all__ = [
    "FrontState", "EDGES", "TRANSITIONS", "HOLDING_STATES", "READ_METHODS", "HOP_BY_HOP",
    "DEADLINE_HEADERS", "DEADLINE_MARGIN_S", "IllegalFrontTransition", "error_answer",
    "bad_berth_deadline", "client_deadline_s", "default_is_write", "strip_headers", "BOARD_COOKIE",
    "without_board_cookie",
]


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
    (F.STARTING, F.ASLEEP): "drained before it served: the run stays, the next write asks again",
    (F.OPEN, F.CLOSING): "a park, checkpoint or lend begins: drain first (rule 3)",
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

#: Request headers that carry the client's own deadline, in seconds from when it sent the request.
#: The openai Python client sends its read timeout as ``X-Stainless-Read-Timeout`` (older
#: Stainless clients: ``X-Stainless-Timeout``); a held request has sent nothing back, so the read
#: timeout is when that client gives up.
DEADLINE_HEADERS = ("X-Stainless-Read-Timeout", "X-Stainless-Timeout", "X-Berth-Deadline",
                    "X-Request-Timeout")
_DEADLINE_LOWER = tuple(h.lower().encode() for h in DEADLINE_HEADERS)

#: A held request is answered this many seconds before the client's own deadline.
DEADLINE_MARGIN_S = 0.1

#: ``Retry-After`` (seconds) of a 503 whose cause may pass soon (a park, a wake, a slot).
RETRY_AFTER_S = 1
#: ``Retry-After`` (seconds) of a lasting ``no_room`` 503: nothing under way can end the wait (a
#: higher-priority holder, a hold, a stowaway), so a retry every second only loops. A lasting
#: cause has no known end by definition (:mod:`berth.decide.causes`: a minimum turn or juggle
#: guard that runs out is not lasting, and its 503 keeps 1 s), so this is a bound, not a
#: deadline: long enough to stop a tight loop, short enough that a client comes back soon after
#: the holder leaves. A client that would rather wait sends ``X-Berth-Deadline``.
RETRY_LASTING_S = 30


class IllegalFrontTransition(RuntimeError):
    """A state change that :data:`TRANSITIONS` does not allow."""


def default_is_write(method: str, path: str) -> bool:
    """A request needs the engine awake unless its method is a read (:data:`READ_METHODS`)."""
    return method not in READ_METHODS


def error_answer(status: int, reason: str, message: str, type_: str, *,
                 close: bool = False, head: bool = False, src: str = "berth",
                 retry_after_s: int = RETRY_AFTER_S,
                 headers: dict[str, str] | None = None) -> bytes:
    """A whole HTTP/1.1 answer the front gives itself: OpenAI's error shape plus llama-swap's
    ``src`` (reference "llama-swap") and the ``reason``; a 503 carries ``Retry-After``
    (``retry_after_s`` seconds). ``head``: the answer to a HEAD request (headers only).
    ``headers``: more header lines (a 405's ``Allow``)."""
    body = json.dumps({"error": {"message": message, "type": type_, "code": status},
                       "src": src, "reason": reason}).encode()
    lines = [f"HTTP/1.1 {status} {phrase(status)}",
             "Content-Type: application/json; charset=utf-8", f"Content-Length: {len(body)}"]
    if status == 503:
        lines.append(f"Retry-After: {retry_after_s}")
    if headers:
        lines.extend(f"{k}: {v}" for k, v in headers.items())
    if close:
        lines.append("Connection: close")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + (b"" if head else body)


def phrase(status: int) -> str:
    """The reason phrase for ``status`` (RFC 9110), "Error" for one it does not name."""
    try:
        return HTTPStatus(status).phrase
    except ValueError:
        return "Error"


def client_deadline_s(headers: Iterable[tuple[bytes, bytes]]) -> float | None:
    """The client's own deadline in seconds from now, from :data:`DEADLINE_HEADERS` in raw
    ``(name, value)`` pairs; the smallest valid one, or None."""
    best: float | None = None
    for name, raw in headers:
        if name.lower() not in _DEADLINE_LOWER:
            continue
        try:
            v = float(raw)
        except ValueError:
            continue
        if v == v and v >= 0 and (best is None or v < best):   # v == v: not NaN
            best = v
    return best


def bad_berth_deadline(headers: Iterable[tuple[bytes, bytes]]) -> str | None:
    """The value of an ``X-Berth-Deadline`` in raw ``(name, value)`` pairs that is not a number
    of seconds of at least 0 (``"30s"``, ``"abc"``, ``"-1"``, ``"nan"``), as text; None when
    every one is valid or there is none. Berth's own header is checked (a 400), where the
    clients' timeouts in :data:`DEADLINE_HEADERS` are only ignored when malformed: a client
    that named its deadline wrongly would otherwise wait the whole wait limit."""
    for name, raw in headers:
        # asked of every request on the fast path: the length first spares most names a lower()
        if len(name) != 16 or name.lower() != b"x-berth-deadline":
            continue
        try:
            v = float(raw)
        except ValueError:
            v = -1.0
        if not v >= 0 or v == float("inf"):     # NaN fails v >= 0
            return raw.decode("latin-1")
    return None


#: The board's operator session cookie (berth.daemon.board_web): a browser sends it to every port of
#: the board's host, so fronts and the gateway strip it from what they relay (issue 26).
BOARD_COOKIE = "berth_board"
_BOARD = BOARD_COOKIE.encode()


def without_board_cookie(value: bytes) -> bytes:
    """A ``Cookie`` header's value without :data:`BOARD_COOKIE` (``b""`` when nothing is left)."""
    return b"; ".join(c for c in (p.strip() for p in value.split(b";"))
                      if c and c.partition(b"=")[0].strip() != _BOARD)


_HOP = frozenset(h.encode() for h in HOP_BY_HOP)
REQUEST_DROP = _HOP | {b"host", b"expect", b"content-length"}
ANSWER_DROP = _HOP


# What strip_headers does with a header, by its name as sent (names repeat from request to
# request, so each is lowered and classified once; bounded, as a client could send any names)
_KEEP, _DROP, _LENGTH, _LENGTH_DROP, _TE, _CONNECTION, _EXPECT, _COOKIE = range(8)
_KINDS: dict[frozenset[bytes], dict[bytes, int]] = {}
_KINDS_MAX = 1024


def _kind(name: bytes, drop: frozenset[bytes]) -> int:
    low = name.lower()
    if low == b"content-length":
        return _LENGTH_DROP if low in drop else _LENGTH
    if low == b"transfer-encoding":
        return _TE
    if low == b"connection":
        return _CONNECTION
    if low == b"expect" and low in drop:
        return _EXPECT
    if low == b"cookie":
        return _COOKIE
    if low in drop or low.startswith(b"proxy-"):
        return _DROP
    return _KEEP


def strip_headers(headers: list[tuple[bytes, bytes]], drop: frozenset[bytes]
                  ) -> tuple[list[bytes], int | None, bool, bool]:
    """Header lines (``b"Name: value\\r\\n"``) of ``headers`` without hop-by-hop ones: those in
    ``drop``, ``proxy-*``, and those named in ``Connection``; without the board's session
    cookie (:data:`BOARD_COOKIE`); plus the ``Content-Length``
    (None when absent), whether ``Transfer-Encoding`` ends in ``chunked``, and whether an
    ``Expect: 100-continue`` was dropped. Names keep their case; the parser has already refused
    malformed lines. Raises ``ValueError`` for a Content-Length that is not a number."""
    kinds = _KINDS.get(drop)
    if kinds is None or len(kinds) > _KINDS_MAX:
        kinds = _KINDS[drop] = {}
    lines: list[bytes] = []
    length: int | None = None
    chunked = expect = False
    listed: set[bytes] | None = None
    for name, value in headers:
        kind = kinds.get(name)
        if kind is None:
            kind = kinds[name] = _kind(name, drop)
        if kind == _KEEP:
            lines.append(b"%s: %s\r\n" % (name, value))
        elif kind == _LENGTH:
            length = int(value)
            lines.append(b"%s: %s\r\n" % (name, value))
        elif kind == _LENGTH_DROP:
            length = int(value)
        elif kind == _TE:
            chunked = value.rstrip().lower().endswith(b"chunked")
        elif kind == _CONNECTION:
            tokens = {t.strip().lower() for t in value.split(b",")}
            tokens.discard(b"keep-alive")   # dropped anyway: the common case needs no filter
            if tokens:
                listed = tokens if listed is None else listed | tokens
        elif kind == _EXPECT:
            expect = expect or value.strip().lower() == b"100-continue"
        elif kind == _COOKIE:
            if _BOARD in value:
                value = without_board_cookie(value)
            if value:
                lines.append(b"%s: %s\r\n" % (name, value))
    if listed is not None:   # rare: names listed in Connection go too
        lines = [line for line in lines if line.partition(b":")[0].lower() not in listed]
    return lines, length, chunked, expect
