"""Pass-through of one HTTP request or one websocket to a base URL, answers streamed as they
come (server-sent events chunk by chunk), client disconnects passed on.

Source: issue 14 ("Streams are relayed as they come (SSE), with client disconnects passed
through"); RFC 9110 §7.6.1 (hop-by-hop headers).

A client that goes away cancels the handler (the gateway's server runs with
``handler_cancellation``), and the upstream connection is closed, so the engine (or the peer's
gateway, and through it the engine) sees the disconnect and stops generating. An upstream that
cannot be reached is :class:`Unreachable`; one that cuts a stream mid-way ends the client's
answer by closing its connection, so the client sees it incomplete.
"""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Mapping

import aiohttp
from aiohttp import web
from berth.front.rules import without_board_cookie
from multidict import CIMultiDict
from yarl import URL

__all__ = ["relay", "relay_ws", "strip", "Unreachable", "HOP_BY_HOP", "new_session"]

log = logging.getLogger("berth.gateway")

HOP_BY_HOP = frozenset({"connection", "keep-alive", "te", "trailer", "trailers",
                        "transfer-encoding", "upgrade"})
_REQUEST_DROP = HOP_BY_HOP | {"host", "expect", "content-length"}
_WHOLE_ANSWER_BYTES = 1 << 16


class Unreachable(ConnectionError):
    """The upstream could not be reached (nothing was sent)."""


def new_session(connect_timeout_s: float = 10.0) -> aiohttp.ClientSession:
    """A client session for relaying: kept-alive connections, no decompression, no cookies."""
    return aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=0, keepalive_timeout=60.0),
        auto_decompress=False, cookie_jar=aiohttp.DummyCookieJar(),
        timeout=aiohttp.ClientTimeout(total=None, sock_connect=connect_timeout_s),
        skip_auto_headers=("Accept", "Accept-Encoding", "User-Agent", "Content-Type"))


def strip(headers: Mapping[str, str], drop: frozenset[str] = HOP_BY_HOP) -> CIMultiDict[str]:
    """Copy ``headers`` without hop-by-hop ones (``drop``, ``proxy-*``, those named in
    ``Connection``)."""
    named = headers.get("Connection")
    listed = {t.strip().lower() for t in named.split(",")} if named else ()
    out: CIMultiDict[str] = CIMultiDict()
    for k, v in headers.items():
        lk = k.lower()
        if lk in drop or lk in listed or lk.startswith("proxy-"):
            continue
        if lk == "cookie":              # the board's session goes to no engine (issue 26)
            v = without_board_cookie(v.encode("latin-1")).decode("latin-1")
            if not v:
                continue
        out.add(k, v)
    return out


async def relay(request: web.BaseRequest, session: aiohttp.ClientSession, base: str, *,
                body: bytes | None = None, extra_headers: Mapping[str, str] | None = None,
                path_qs: str | None = None, answer_headers: Mapping[str, str] | None = None,
                abort: asyncio.Future | None = None, src: str | None = None
                ) -> web.StreamResponse:
    """Send ``request`` to ``base`` (a base URL) and stream the answer back.

    ``body``: the request body already read (else it is streamed from the client).
    ``extra_headers``: added to the request (signatures). ``path_qs``: the path to send (default
    the request's own). ``abort``: a future whose completion before the answer's headers arrive
    gives up (a peer marked down). ``answer_headers``: added to the answer (unless the upstream
    set them). ``src``: written into an error answer's JSON object that has none (``"engine"``:
    issue 14, errors say who failed). Raises :class:`Unreachable` then, and when the connection
    cannot be made."""
    headers = strip(request.headers, _REQUEST_DROP)
    if extra_headers:
        headers.update(extra_headers)
    data: bytes | aiohttp.StreamReader | None
    if body is not None:
        data = body
    elif request.body_exists:
        data = request.content
        if request.content_length is not None:
            headers["Content-Length"] = str(request.content_length)
    else:
        data = None
    url = URL(base + (path_qs if path_qs is not None else request.raw_path), encoded=True)
    call = session.request(request.method, url, headers=headers, data=data,
                           allow_redirects=False)
    try:
        if abort is None:
            up = await call
        else:
            task = asyncio.ensure_future(call)
            done, _ = await asyncio.wait({task, abort}, return_when=asyncio.FIRST_COMPLETED)
            if task not in done:
                task.cancel()
                raise Unreachable(f"{base} stopped answering")
            up = task.result()
    except (aiohttp.ClientConnectorError, aiohttp.ServerDisconnectedError,
            asyncio.TimeoutError) as e:
        raise Unreachable(f"{base}: {e or type(e).__name__}") from None
    resp: web.StreamResponse | None = None
    out_headers = strip(up.headers)
    for k, v in (answer_headers or {}).items():
        out_headers.setdefault(k, v)
    try:
        length = up.content_length
        if length is not None and 0 < length <= _WHOLE_ANSWER_BYTES and request.method != "HEAD":
            try:
                payload = await up.read()
            except (aiohttp.ClientPayloadError, aiohttp.ClientConnectionError) as e:
                log.warning("gateway: %s failed mid-answer: %r", base, e)
                raise        # nothing sent to the client yet: the caller answers 502
            if src is not None and up.status >= 400:
                payload = _with_src(payload, src)
                out_headers.pop("Content-Length", None)
            return web.Response(status=up.status, reason=up.reason, body=payload,
                                headers=out_headers)
        resp = web.StreamResponse(status=up.status, reason=up.reason, headers=out_headers)
        await resp.prepare(request)
        while True:
            try:
                chunk = await up.content.readany()
            except (aiohttp.ClientPayloadError, aiohttp.ClientConnectionError) as e:
                log.warning("gateway: %s cut the answer mid-stream: %r", base, e)
                if request.transport is not None:
                    request.transport.close()
                return resp
            if not chunk:
                break
            await resp.write(chunk)
        await resp.write_eof()
        return resp
    except (ConnectionResetError, asyncio.CancelledError):
        up.close()      # the client went: so does the upstream connection
        raise
    finally:
        up.release()


async def relay_ws(request: web.Request, session: aiohttp.ClientSession, base: str,
                   on_open=None, on_close=None) -> web.WebSocketResponse:
    """Pass a websocket through to ``base`` (same path and query): messages both ways as they
    come, a close from either side closes the other. Raises :class:`Unreachable` before the
    client's socket is accepted if the upstream's cannot be opened."""
    url = URL(base + request.raw_path, encoded=True)
    proto = request.headers.get("Sec-WebSocket-Protocol")
    protocols = tuple(p.strip() for p in proto.split(",")) if proto else ()
    try:
        up = await session.ws_connect(url, protocols=protocols, autoping=True,
                                      headers={k: v for k, v in strip(request.headers).items()
                                               if k.lower() in ("cookie", "authorization",
                                                                "origin")})
    except (aiohttp.ClientError, OSError, asyncio.TimeoutError) as e:
        raise Unreachable(f"{base}: {e or type(e).__name__}") from None
    ws = web.WebSocketResponse(protocols=protocols, autoping=True)
    await ws.prepare(request)
    if on_open is not None:
        on_open()

    async def pump(src, dst) -> None:
        async for msg in src:
            if msg.type == aiohttp.WSMsgType.TEXT:
                await dst.send_str(msg.data)
            elif msg.type == aiohttp.WSMsgType.BINARY:
                await dst.send_bytes(msg.data)
            else:
                break

    tasks = [asyncio.ensure_future(pump(ws, up)), asyncio.ensure_future(pump(up, ws))]
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await up.close()
        await ws.close()
        if on_close is not None:
            on_close()
    return ws


def _with_src(payload: bytes, src: str) -> bytes:
    """An error body with ``"src"`` added when it is a JSON object without one; else as it was."""
    try:
        doc = json.loads(payload)
    except (ValueError, RecursionError):
        return payload
    if not isinstance(doc, dict) or "src" in doc:
        return payload
    return json.dumps({**doc, "src": src}).encode()
