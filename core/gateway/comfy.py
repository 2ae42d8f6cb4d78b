"""The ComfyUI port: ``berth gateway --comfyui-listen ADDR`` fronts ComfyUI's whole surface (web
UI, API, the ``/ws`` websocket) from outside ComfyUI.

Source: issue 14; seed 002 "Fronts" (the ComfyUI port fronts ComfyUI's own surface) and "Before
an engine sleeps, its front stops forwarding new requests and waits for the ones in flight";
llama-swap #1001/#1137 (a ComfyUI websocket counted as a request in flight forever blocked every
swap; llama-swap's ``compat.ignoreWebsockets``).

Every request goes to the ``comfyui`` engine's address (its front, else its ``url``), streamed
through; a websocket upgrade is passed through as a websocket. What counts as *in flight* is
HTTP requests only: an open websocket is ComfyUI's status channel, idle for hours, and never
holds up :meth:`ComfyPort.close_and_drain` (the step before a park).

States: ``open`` (forward) and ``closing`` (hold new writes until :meth:`open` or the wait limit,
pass reads and websockets; :meth:`close_and_drain` waits for the HTTP requests in flight).
Which side of ComfyUI holds writes while it is parked is the custom node's gate (issue 13); the
port's ``closing`` covers the moment before a park for a ComfyUI reached only through the port.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Callable

import aiohttp
from aiohttp import web
from berth.gateway.errors import error
from berth.gateway.relay import Unreachable, relay, relay_ws

__all__ = ["ComfyPort"]

log = logging.getLogger("berth.gateway")

_READS = frozenset({"GET", "HEAD", "OPTIONS"})


class ComfyPort:
    """A pass-through for ComfyUI. ``target()`` gives ComfyUI's base URL now (``None``: not
    configured); ``ws_target()`` the one websockets go to (default ``target``). ``wait_limit_s``: the longest a write is held while closing, seconds.

    Counters: ``in_flight`` (HTTP requests being forwarded; websockets never count),
    ``websockets`` (open now), ``forwarded``, ``held``, ``held_timeouts``."""

    def __init__(self, host: str, port: int, target: Callable[[], str | None],
                 wait_limit_s: float = 120.0,
                 ws_target: Callable[[], str | None] | None = None):
        self.host, self.port = host, port
        self._target = target
        self._ws_target = ws_target or target
        self.wait_limit_s = wait_limit_s
        self.state = "open"
        self.in_flight = self.websockets = 0
        self.forwarded = self.held = self.held_timeouts = 0
        self._idle = asyncio.Event()
        self._idle.set()
        self._opened = asyncio.Event()
        self._opened.set()
        self._session: aiohttp.ClientSession | None = None
        self._runner: web.AppRunner | None = None

    async def start(self, session: aiohttp.ClientSession) -> None:
        self._session = session
        app = web.Application(client_max_size=1 << 30)
        app.router.add_route("*", "/{tail:.*}", self._handle)
        self._runner = web.AppRunner(app, access_log=None, handler_cancellation=True,
                                     shutdown_timeout=1.0)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.host, self.port, reuse_address=True)
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]   # type: ignore[union-attr]

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    async def close_and_drain(self, timeout_s: float) -> bool:
        """``open -> closing``: hold new writes, wait up to ``timeout_s`` seconds for the HTTP
        requests in flight. True when none is left; open websockets are not waited for."""
        self.state = "closing"
        self._opened.clear()
        try:
            async with asyncio.timeout(timeout_s):
                await self._idle.wait()
            return True
        except TimeoutError:
            return False

    def open(self) -> None:
        """Forward again; held writes go."""
        self.state = "open"
        self._opened.set()

    def counters(self) -> dict:
        return {"state": self.state, "in_flight": self.in_flight, "websockets": self.websockets,
                "forwarded": self.forwarded, "held": self.held,
                "held_timeouts": self.held_timeouts}

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        websocket = request.headers.get("Upgrade", "").lower() == "websocket"
        target = self._ws_target() if websocket else self._target()
        if target is None:
            return error(503, "no_comfyui", "berth.toml has no [engines.comfyui] with a url or "
                                            "a front address")
        if websocket:
            try:
                return await relay_ws(request, self._session, target, on_open=self._ws_open,
                                      on_close=self._ws_close)
            except Unreachable as e:
                return error(502, "engine_unreachable", f"ComfyUI cannot be reached: {e}")
        if self.state != "open" and request.method not in _READS:
            self.held += 1
            try:
                async with asyncio.timeout(self.wait_limit_s):
                    await self._opened.wait()
            except TimeoutError:
                self.held_timeouts += 1
                return error(503, "wait_limit", f"ComfyUI was not ready within the wait limit "
                                                f"({self.wait_limit_s:g} s); the request was "
                                                f"held and not sent")
        self.in_flight += 1
        self._idle.clear()
        self.forwarded += 1
        try:
            return await relay(request, self._session, target)
        except Unreachable as e:
            return error(502, "engine_unreachable", f"ComfyUI cannot be reached: {e}")
        except aiohttp.ClientError as e:
            return error(502, "engine_failed", f"ComfyUI failed mid-request: {e!r}")
        finally:
            self.in_flight -= 1
            if self.in_flight == 0:
                self._idle.set()

    def _ws_open(self) -> None:
        self.websockets += 1

    def _ws_close(self) -> None:
        self.websockets -= 1
