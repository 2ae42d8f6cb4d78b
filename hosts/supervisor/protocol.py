"""supervisord's eventlistener protocol, on guarded file descriptors.

Source: reference/hosts.md "Eventlistener protocol", "Pitfalls"; supervisor's ``docs/events.rst``
and ``supervisor/dispatchers.py`` (``PEventListenerDispatcher``), ``childutils.py``.

One cycle: the listener writes ``READY\\n``; supervisord sends a header line of ``key:value``
tokens (``ver server serial pool poolserial eventname len``) and then a payload of ``len``
**characters** (supervisord takes ``len()`` of a Python 3 str and writes it as UTF-8, issue
#1243, although its documentation says bytes); the listener answers ``RESULT 2\\nOK``.

Standard output belongs to the protocol alone: any other byte there while the listener is READY
moves it to UNKNOWN, and supervisord then sends it nothing, for good, while ``supervisorctl``
still shows it RUNNING. :func:`guard_stdout` keeps the protocol on a private duplicate of fd 1
and points fd 1 (and ``sys.stdout``) at stderr, so that a stray ``print`` anywhere in the
process, or a child's output, lands in the log instead. A header that does not parse or a
payload cut short is a desync: :class:`ProtocolError`, and the listener exits non-zero so that
supervisord restarts it.
"""

from __future__ import annotations

import io
import os
import sys
from dataclasses import dataclass, field
from typing import TextIO

__all__ = ["Event", "ProtocolError", "Protocol", "guard_stdout", "parse_tokens"]

READY = "READY\n"
OK = "RESULT 2\nOK"
FAIL = "RESULT 4\nFAIL"
_HEADER_KEYS = ("ver", "server", "serial", "pool", "poolserial", "eventname", "len")
_MAX_LEN = 64 << 20      # characters; supervisord's payloads are small, a huge len is garbage


class ProtocolError(RuntimeError):
    """The stream from supervisord does not follow the protocol (a desync)."""


@dataclass(frozen=True)
class Event:
    """One event as supervisord sent it.

    ``headers``: the header tokens (``eventname``, ``serial``, ``pool`` ...). ``fields``: the
    payload's first line as tokens (``processname``, ``groupname``, ``from_state``, ``pid``,
    ``when`` ...). ``data``: what follows that line (communication events), else ``""``.
    """

    headers: dict[str, str]
    payload: str
    fields: dict[str, str] = field(default_factory=dict)
    data: str = ""

    @property
    def name(self) -> str:
        return self.headers["eventname"]


def parse_tokens(line: str) -> dict[str, str]:
    """``"a:1 b:x"`` -> ``{"a": "1", "b": "x"}``. A token without ``:`` raises
    :class:`ProtocolError`. Values keep any further colons (``groupname:g``)."""
    out: dict[str, str] = {}
    for tok in line.split():
        key, sep, value = tok.partition(":")
        if not sep or not key:
            raise ProtocolError(f"token {tok!r} is not key:value in {line!r}")
        out[key] = value
    return out


def parse_header(line: str) -> dict[str, str]:
    """Parse and check one header line. Raises :class:`ProtocolError` naming what is wrong."""
    if not line.endswith("\n"):
        raise ProtocolError(f"header line cut short (end of input): {line!r}")
    headers = parse_tokens(line)
    missing = [k for k in _HEADER_KEYS if k not in headers]
    if missing:
        raise ProtocolError(f"header lacks {', '.join(missing)}: {line!r}")
    try:
        n = int(headers["len"])
    except ValueError:
        raise ProtocolError(f"header len is not a number: {headers['len']!r}") from None
    if not 0 <= n <= _MAX_LEN:
        raise ProtocolError(f"header len {n} is out of range")
    return headers


def parse_payload(headers: dict[str, str], payload: str) -> Event:
    """Split a payload into its token line and the data after it (communication events)."""
    first, _, rest = payload.partition("\n")
    try:
        fields = parse_tokens(first)
    except ProtocolError:
        fields = {}           # a payload's own format is not the protocol's: keep it as data
        rest = payload
    return Event(headers, payload, fields, rest)


class Protocol:
    """The listener's side of the cycle over ``stdin`` (text, UTF-8) and ``out_fd`` (the
    guarded protocol descriptor). Not thread-safe: one thread runs the cycle."""

    def __init__(self, stdin: TextIO, out_fd: int):
        self.stdin = stdin
        self.out_fd = out_fd

    def _write(self, text: str) -> None:
        data = text.encode("utf-8")
        while data:
            n = os.write(self.out_fd, data)
            data = data[n:]

    def ready(self) -> None:
        """Tell supervisord the listener waits for an event (``READY\\n``)."""
        self._write(READY)

    def read_event(self) -> Event | None:
        """Block for the next event; ``None`` when supervisord closed the stream between
        events. Raises :class:`ProtocolError` on a bad header or a payload cut short."""
        line = self.stdin.readline()
        if line == "":
            return None
        headers = parse_header(line)
        n = int(headers["len"])
        payload = self.stdin.read(n) if n else ""
        if len(payload) != n:
            raise ProtocolError(f"payload cut short: {len(payload)} of {n} characters "
                                f"({headers['eventname']} serial {headers['serial']})")
        return parse_payload(headers, payload)

    def ok(self) -> None:
        """Accept the event (``RESULT 2\\nOK``)."""
        self._write(OK)

    def fail(self) -> None:
        """Reject the event; supervisord re-sends it (``RESULT 4\\nFAIL``)."""
        self._write(FAIL)


def guard_stdout() -> int:
    """Keep the protocol on a private duplicate of fd 1 and point fd 1 at stderr.

    Call it first, before anything that could print. Returns the protocol descriptor (not
    inherited by children). Afterwards ``print()``, ``sys.stdout``, ``os.write(1, …)`` and any
    child process's standard output all go to stderr (supervisord's ``stderr_logfile``).
    """
    try:
        sys.stdout.flush()
    except (OSError, ValueError):
        pass
    proto = os.dup(1)
    os.dup2(2, 1)
    sys.stdout = io.TextIOWrapper(os.fdopen(1, "wb", buffering=0, closefd=False),
                                  encoding="utf-8", errors="replace", line_buffering=True)
    return proto


def text_stdin() -> TextIO:
    """Standard input as UTF-8 text with no newline translation (``len`` counts characters of
    exactly what supervisord wrote, ``\\r`` included)."""
    return io.TextIOWrapper(sys.stdin.buffer, encoding="utf-8", errors="strict", newline="\n")
