"""A request body as the gateway keeps it: whole in memory when small, else spooled to an
unlinked temporary file as it arrives, with the request's ``model`` found on the way and the
SHA-256 digest a peer signature covers (issue 26 "Low": a 64 MiB body cost the gateway about
240 MiB, in copies of the whole body; issue 14: routing by the JSON ``model`` field).

A body is read whole before the gateway chooses where it goes (the ``model`` field may come
last, after the messages), and kept until the request is answered, so that a try that fails
before any byte of the answer can go to another machine. A large body's bytes stay in the file
(the page cache, not the gateway's memory) and are streamed from it to the engine.
"""

from __future__ import annotations

import hashlib
import json
import re
import tempfile
from typing import IO, TYPE_CHECKING

from berth.front.path import request_bytes

if TYPE_CHECKING:
    from berth.front.server import Request
    from berth.front.upstream import EngineConnection

__all__ = ["Body", "Passing", "TooLarge", "ModelScanner", "MAX_BODY_BYTES"]

#: The largest request body the gateway takes, bytes.
MAX_BODY_BYTES = 64 << 20
#: Bodies up to this size with a Content-Length are read into memory; larger ones are spooled.
SMALL_BYTES = 1 << 20
_SEND_BYTES = 256 * 1024
#: The longest key or value at the object's top level the scanner keeps, bytes.
_KEEP_BYTES = 4096

_STRUCT = re.compile(rb'[{}\[\]:,"]')
# a string's content up to its closing quote or the end of the piece (escapes skipped whole)
_STR_REST = re.compile(rb'[^"\\]*(?:\\.[^"\\]*)*', re.S)
_WS = frozenset(b" \t\r\n")


def continue_if_asked(req: "Request") -> None:
    """Tell a client that sent ``Expect: 100-continue`` to send its body (curl waits a second
    for it before a body over 1 KiB); the gateway reads every body it routes."""
    if req.expect and not req.complete and not req.size:
        req.conn.interim(b"HTTP/1.1 100 Continue\r\n\r\n")


class TooLarge(Exception):
    """The body is over :data:`MAX_BODY_BYTES` (``size``: what arrived or was announced)."""

    def __init__(self, size: int):
        super().__init__(f"the body is over {MAX_BODY_BYTES} bytes")
        self.size = size


class ModelScanner:
    """Finds the ``model`` member of a JSON object read in pieces, without parsing the rest
    (a chat's messages, images included, are skipped at the speed of a regular expression).

    After the last :meth:`feed`: ``model`` (the string found, or None), ``invalid`` (a
    ``model`` that is not a string: a short excerpt of it) and ``object`` (whether the body
    began as a JSON object). Only the top level counts: ``{"x": {"model": "a"}}`` has none."""

    def __init__(self) -> None:
        self.depth = 0
        self.model: str | None = None
        self.invalid: str | None = None
        self.object = False
        self.done = False
        self._in_str = self._esc = False
        self._keep: bytearray | None = None
        self._key: bytes | None = None
        self._expect_key = self._expect_value = False

    def feed(self, data: bytes) -> None:
        i, n = 0, len(data)
        while i < n and not self.done:
            if self._in_str:
                i = self._string(data, i)
                continue
            if self._expect_value:
                i = self._value(data, i)
                if i >= n:
                    break
            m = _STRUCT.search(data, i)
            if m is None:
                break
            i = m.end()
            self._struct(data[m.start()])

    def _struct(self, c: int) -> None:
        if c == 0x22:                              # "
            self._in_str = True
            self._keep = bytearray() if self.depth == 1 else None
        elif c in (0x7B, 0x5B):                    # { [
            if self.depth == 0:
                self.object = c == 0x7B
                if not self.object:
                    self.done = True               # not an object: no member named model
            self.depth += 1
            self._expect_key = self.depth == 1
        elif c in (0x7D, 0x5D):                    # } ]
            self.depth -= 1
            self.done = self.depth <= 0
        elif c == 0x3A and self.depth == 1:        # :
            self._expect_value = True
        elif c == 0x2C and self.depth == 1:        # ,
            self._expect_key = True

    def _value(self, data: bytes, i: int) -> int:
        """At the top level after a colon: a value that is not a string, for the key
        ``model``, makes the body's model invalid."""
        n = len(data)
        while i < n and data[i] in _WS:
            i += 1
        if i < n:
            self._expect_value = False
            # in JSON only null begins with n: a null model is no model
            if data[i] not in (0x22, 0x6E) and self._key == b"model":
                excerpt = data[i:i + 20].split(b",")[0].split(b"}")[0]
                self.invalid = excerpt.decode("utf-8", "replace")
                self.done = True
        return i

    def _string(self, data: bytes, i: int) -> int:
        keep = self._keep
        if self._esc:               # the last piece ended right after a backslash
            self._esc = False
            if keep is not None:
                keep += data[i:i + 1]
            i += 1
        j = _STR_REST.match(data, i).end()
        if keep is not None:
            keep += data[i:j]
            if len(keep) > _KEEP_BYTES:
                self._keep = keep = None
        if j < len(data) and data[j] == 0x5C:       # a backslash, last in the piece
            self._esc = True
            if keep is not None:
                keep += b"\\"
            return len(data)
        if j >= len(data):
            return j
        self._in_str = False
        self._ended(None if keep is None else bytes(keep))
        return j + 1

    def _ended(self, raw: bytes | None) -> None:
        if self.depth != 1:
            return
        if self._expect_key:
            self._key, self._expect_key = raw, False
        elif self._key == b"model":
            try:
                self.model = json.loads(b'"' + raw + b'"') if raw is not None else None
            except ValueError:
                self.model = None
            if self.model is None:
                self.invalid = "a string too long or not valid JSON"
            self.done = True


class Body:
    """One request body. ``data``: the bytes, when kept in memory; ``size``: its length, bytes;
    ``model``: the JSON ``model`` field (None: no string there); ``invalid``: a ``model`` that is
    not a string, shown; ``json``: whether the body parsed (or, spooled, began) as a JSON
    object. :meth:`close` removes a spool."""

    def __init__(self, data: bytes | None, size: int, spool: IO[bytes] | None = None,
                 digest: str | None = None):
        self.data, self.size, self.spool = data, size, spool
        self._digest = digest
        self.model: str | None = None
        self.invalid: str | None = None
        self.json = False

    @classmethod
    async def read(cls, req: "Request") -> "Body":
        """Read ``req``'s body. Raises :class:`TooLarge` past :data:`MAX_BODY_BYTES` (at once
        when the Content-Length says so)."""
        if req.length is not None and req.length > MAX_BODY_BYTES:
            raise TooLarge(req.length)
        continue_if_asked(req)
        if not req.streamed:
            body = cls(await req.read_all(), 0)
            body.size = len(body.data)
            body._parse()
            return body
        return await cls._spooled(req)

    def _parse(self) -> None:
        try:
            doc = json.loads(self.data) if self.data else None
        except (ValueError, RecursionError):    # RecursionError: nested too deep to parse
            return
        if isinstance(doc, dict):
            self.json = True
            m = doc.get("model")
            if isinstance(m, str):
                self.model = m
            elif m is not None:
                self.invalid = repr(m)[:40]

    @classmethod
    async def _spooled(cls, req: "Request") -> "Body":
        spool = tempfile.TemporaryFile(prefix="berth-gateway-body-")
        digest, scan, size = hashlib.sha256(), ModelScanner(), 0
        try:
            while data := await req.read_some():
                size += len(data)
                if size > MAX_BODY_BYTES:
                    raise TooLarge(size)
                digest.update(data)
                if not scan.done:
                    scan.feed(data)
                spool.write(data)
        except BaseException:
            spool.close()
            raise
        spool.flush()
        body = cls(None, size, spool, digest.hexdigest())
        body.model, body.invalid, body.json = scan.model, scan.invalid, scan.object
        return body

    @property
    def digest(self) -> str:
        """The body's SHA-256, hex (what a peer signature covers)."""
        if self._digest is None:
            self._digest = hashlib.sha256(self.data or b"").hexdigest()
        return self._digest

    async def send(self, conn: "EngineConnection", head: bytes) -> None:
        """Write ``head`` (request line and headers, without the framing) and the body to
        ``conn``; a spooled body in pieces, waiting while the engine's socket is full."""
        if self.data is not None:
            conn.write(b"%sContent-Length: %d\r\n\r\n%s" % (head, self.size, self.data))
            return
        assert self.spool is not None
        conn.write(b"%sContent-Length: %d\r\n\r\n" % (head, self.size))
        self.spool.seek(0)
        while not conn.closed and (piece := self.spool.read(_SEND_BYTES)):
            conn.write(piece)
            await conn.drain()

    def close(self) -> None:
        if self.spool is not None:
            self.spool.close()
            self.spool = None


class Passing:
    """A body passed through as it arrives, never kept (ComfyUI's surface: uploads of any
    size): a try that fails cannot send it again. ``whole``: all of it arrived, so the client's
    connection may carry another request."""

    def __init__(self, req: "Request", data: bytes | None):
        self.req, self.data = req, data

    @classmethod
    async def read(cls, req: "Request") -> "Passing":
        """A small body is read first; a large or chunked one streams in :meth:`send`."""
        continue_if_asked(req)
        return cls(req, None if req.streamed else await req.read_all())

    @property
    def whole(self) -> bool:
        return self.req.complete

    async def send(self, conn: "EngineConnection", head: bytes) -> None:
        req = self.req
        if self.data is not None:
            conn.write(request_bytes(req, head, self.data))
            return
        if req.chunked:
            conn.write(head + b"Transfer-Encoding: chunked\r\n\r\n")
        else:
            conn.write(b"%sContent-Length: %d\r\n\r\n" % (head, req.length))
        while not conn.closed and (data := await req.read_some()):
            conn.write(b"%x\r\n%s\r\n" % (len(data), data) if req.chunked else data)
            await conn.drain()
        if req.chunked:
            conn.write(b"0\r\n\r\n")

    def close(self) -> None:
        """Nothing to free: the body is read from the client as it is sent (the spooled body's
        ``close`` removes its file)."""
