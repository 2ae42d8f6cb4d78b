"""What the gateway passes to aiohttp's server whole: the board (``/board/``, read from berthd's
socket, issue 15) and websockets (ComfyUI's ``/ws``), each on a connection of its own.

The gateway's listener parses every request head itself (:mod:`berth.front.server`); for these
it hands the connection, with the bytes of the request, to an aiohttp ``web.Server``
(:meth:`berth.front.server.ClientConnection._give`), which answers it and closes the connection
after the answer (``Connection: close``): a browser opens another for its next request, so a
request for the OpenAI routes never lands on aiohttp. A websocket keeps its connection until
either side closes it.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Callable

import aiohttp
from aiohttp import web
from berth.front.rules import without_board_cookie
from berth.gateway.errors import error
from yarl import URL

__all__ = ["HandOff", "relay_ws", "Unreachable", "is_websocket", "json_error"]

log = logging.getLogger("berth.gateway")


class Unreachable(ConnectionError):
    """The upstream could not be reached (nothing was sent)."""


def is_websocket(headers: list[tuple[bytes, bytes]]) -> bool:
    """Whether raw request ``headers`` ask for a websocket (``Upgrade: websocket``)."""
    return any(k.lower() == b"upgrade" and v.strip().lower() == b"websocket" for k, v in headers)


def json_error(status: int, reason: str, message: str) -> web.Response:
    """An error answer (:func:`berth.gateway.errors.error`) in aiohttp's terms."""
    raw = error(status, reason, message)
    return web.Response(status=status, content_type="application/json",
                        body=raw.partition(b"\r\n\r\n")[2])


async def _close_after(request: web.Request, response: web.StreamResponse) -> None:
    if not isinstance(response, web.WebSocketResponse):
        response.force_close()


class HandOff:
    """aiohttp's server for ``app``; calling it makes the protocol a handed connection gets.
    ``connections``: how many it holds now."""

    def __init__(self, app: web.Application):
        app.on_response_prepare.append(_close_after)
        self._runner = web.AppRunner(app, access_log=None, handler_cancellation=True,
                                     shutdown_timeout=1.0, handle_signals=False)
        self._server: web.Server | None = None

    async def start(self) -> None:
        await self._runner.setup()
        self._server = self._runner.server

    async def stop(self) -> None:
        await self._runner.cleanup()

    def __call__(self) -> asyncio.Protocol:
        assert self._server is not None, "HandOff.start() first"
        return self._server()

    @property
    def connections(self) -> int:
        return len(self._server.connections) if self._server is not None else 0


def _passed(request: web.Request) -> dict[str, str]:
    """The client's headers a websocket's upstream gets: its cookies (the board's session left
    out, issue 26), authorization and origin."""
    out = {}
    for k, v in request.headers.items():
        if k.lower() == "cookie":
            v = without_board_cookie(v.encode("latin-1")).decode("latin-1")
        if v and k.lower() in ("cookie", "authorization", "origin"):
            out[k] = v
    return out


async def relay_ws(request: web.Request, session: aiohttp.ClientSession, base: str,
                   on_open: Callable[[], None] | None = None,
                   on_close: Callable[[], None] | None = None) -> web.WebSocketResponse:
    """Pass a websocket through to ``base`` (same path and query): messages both ways as they
    come, a close from either side closes the other. Raises :class:`Unreachable` before the
    client's socket is accepted if the upstream's cannot be opened."""
    url = URL(base + request.raw_path, encoded=True)
    proto = request.headers.get("Sec-WebSocket-Protocol")
    protocols = tuple(p.strip() for p in proto.split(",")) if proto else ()
    try:
        up = await session.ws_connect(url, protocols=protocols, autoping=True,
                                      headers=_passed(request))
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
