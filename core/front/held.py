"""Progress for a held streaming request: SSE keep-alive comments and, when asked, a loading state.

Source: issue 30 ("Progress while a request waits"); llama-swap's ``sendLoadingState``
(``internal/router/loading.go`` at 0bdb372: a ``200 text/event-stream`` answer at once, progress
text in ``choices[0].delta.reasoning_content``); the SSE format (WHATWG HTML "Server-sent
events": a line starting with ``:`` is a comment, which every client ignores).

A held request otherwise gets no byte until the engine serves, up to the wait limit, and a client
with a short read timeout gives up during a cold start. So, for a request whose JSON body asks
for a stream (``"stream": true``), held past :data:`FIRST_S`:

1. the front answers ``200`` with ``Content-Type: text/event-stream`` (chunked) and writes
   ``: keep-alive`` every :data:`EVERY_S` while it holds the request;
2. with ``X-Berth-Loading-State: true`` on a chat completion (:data:`LOADING_PATHS`), each tick
   also carries a ``chat.completion.chunk`` whose ``reasoning_content`` says what the front
   waits for, as llama-swap's loading state does;
3. when the front opens, the engine's answer follows in the same stream, without its head
   (:meth:`berth.front.upstream.EngineConnection.begin` with ``headless``): its events pass as
   they come; an answer that is not an event stream (an error) becomes one ``data:`` event
   (:func:`tail_event`);
4. a hold that ends without a forward (wait limit, stop, no room) ends the stream with one
   ``data: {"error": …}`` event in the front's error shape (:func:`error_event`), which OpenAI
   clients raise as an API error.

A request held less than :data:`FIRST_S` is unchanged (its status is the engine's or the front's
own 503), and so is every request that does not ask for a stream.
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import TYPE_CHECKING, Callable

if TYPE_CHECKING:
    from .server import ClientConnection, Request

__all__ = ["FIRST_S", "EVERY_S", "LOADING_HEADER", "LOADING_PATHS", "wants_stream", "HeldStream",
           "error_event", "tail_event"]

#: Seconds a streaming request is held before the front answers 200 and starts the keep-alive.
FIRST_S = 1.0
#: Seconds between keep-alive comments (well under the 5 s the issue asks for, so a loaded
#: event loop stays inside it).
EVERY_S = 2.0
#: The request header that asks for a loading state (value ``true`` or ``1``).
LOADING_HEADER = b"x-berth-loading-state"
#: Paths whose streams get a loading state (llama-swap's ``loadingPaths``).
LOADING_PATHS = ("/v1/chat/completions",)

_HEAD = (b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\n"
         b"X-Berth-Held: true\r\nTransfer-Encoding: chunked\r\n\r\n")
_COMMENT = b": keep-alive\n\n"
_END = b"0\r\n\r\n"
_MAX_BODY_BYTES = 1 << 20


def _chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


def wants_stream(req: "Request") -> bool:
    """Whether ``req`` is an HTTP/1.1 write whose whole JSON body (here already, at most 1 MiB,
    not compressed) has ``"stream": true``."""
    if req.version != "1.1" or not req.complete or req.size > _MAX_BODY_BYTES:
        return False
    body = b"".join(req.parts)
    if b'"stream"' not in body:
        return False
    if any(k.lower() == b"content-encoding" for k, _ in req.headers):
        return False
    try:
        doc = json.loads(body)
    except (ValueError, RecursionError):    # RecursionError: nested too deep to parse
        return False
    return isinstance(doc, dict) and doc.get("stream") is True


def error_event(message: str, reason: str, code: int = 503) -> bytes:
    """The last chunk and the end of a held stream that is not forwarded: one ``data:`` event in
    the front's error shape (:func:`berth.front.rules.error_answer`)."""
    body = json.dumps({"error": {"message": message, "type": "unavailable_error", "code": code},
                       "src": "berth", "reason": reason})
    return _chunk(f"data: {body}\n\n".encode()) + _END


def tail_event(status: int, body: bytes) -> bytes:
    """The engine's answer that is not an event stream, as one event in the held stream: a JSON
    object as it is (``src: "engine"`` added to an error), anything else as an error message;
    a 2xx answer is followed by ``data: [DONE]``. Ends the chunked answer."""
    try:
        doc = json.loads(body) if body else None
    except ValueError:
        doc = None
    ok = 200 <= status < 300
    if not isinstance(doc, dict):
        text = body.decode("utf-8", "replace")[:2000]
        doc = {"error": {"message": f"the engine answered {status}: {text}",
                         "type": "upstream_error", "code": status}}
    elif not ok:
        doc.setdefault("src", "engine")
    data = f"data: {json.dumps(doc)}\n\n".encode() + (b"data: [DONE]\n\n" if ok else b"")
    return _chunk(data) + _END


class HeldStream:
    """The keep-alive of one held streaming request. :meth:`start` schedules it; :attr:`started`
    is True once the 200 head went to the client (from then on the answer is this stream's);
    :meth:`stop` ends the ticks (the hold is over). ``what()`` says what the front waits for."""

    def __init__(self, req: "Request", client: "ClientConnection", name: str,
                 what: Callable[[], str]):
        self.client, self.name, self.what = client, name, what
        self.started = False
        self.since = time.monotonic()
        self._task: asyncio.Task[None] | None = None
        self._said = ""
        self._model = ""
        self._loading = req.path.startswith(LOADING_PATHS) and any(
            k.lower() == LOADING_HEADER and v.strip().lower() in (b"true", b"1")
            for k, v in req.headers)
        if self._loading:
            try:
                self._model = str(json.loads(b"".join(req.parts)).get("model", ""))
            except (ValueError, AttributeError):
                self._loading = False

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run())

    def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            self._task = None

    async def _run(self) -> None:
        await asyncio.sleep(FIRST_S)
        self.client.write(_HEAD)
        self.started = True
        while True:
            self.client.write(_chunk(_COMMENT + self._progress()))
            await asyncio.sleep(EVERY_S)

    def _progress(self) -> bytes:
        """The loading state's next event (empty when not asked for): what the front waits for
        when that changes, else a dot."""
        if not self._loading:
            return b""
        now = self.what()
        text = "." if now == self._said else (
            f"Berth: {self.name} {now}" if not self._said else f"\n{now}")
        self._said = now
        return self._delta(text)

    def ready(self) -> bytes:
        """What goes to the client before the engine's first byte once the front forwards."""
        if not (self.started and self._loading):
            return b""
        return _chunk(self._delta(f"\nBerth: ready after {time.monotonic() - self.since:.2f}s\n"))

    def _delta(self, text: str) -> bytes:
        chunk = {"id": "berth-loading", "object": "chat.completion.chunk",
                 "created": int(time.time()), "model": self._model,
                 "choices": [{"index": 0, "delta": {"reasoning_content": text},
                              "finish_reason": None}]}
        return f"data: {json.dumps(chunk)}\n\n".encode()
