"""The ComfyUI port: ``berth gateway --comfyui-listen ADDR`` fronts ComfyUI's whole surface (web
UI, API, the ``/ws`` websocket) from outside ComfyUI.

Source: issue 14; seed 002 "Fronts" (the ComfyUI port fronts ComfyUI's own surface) and "Before
an engine sleeps, its front stops forwarding new requests and waits for the ones in flight";
llama-swap #1001/#1137 (a ComfyUI websocket counted as a request in flight forever blocked every
swap; llama-swap's ``compat.ignoreWebsockets``); issue 23 (its states as an enum with a
transition table).

Every request goes to the ``comfyui`` engine's address (its front, else its ``url``), streamed
through on the gateway's relay; a websocket upgrade is handed to aiohttp and passed through as a
websocket. What counts as *in flight* is HTTP requests only: an open websocket is ComfyUI's
status channel, idle for hours, and never holds up :meth:`ComfyPort.close_and_drain` (the step
before a park). The port's listener keeps the gateway's limits on slow and idle clients.

States (:class:`PortState`; edges in :data:`EDGES`, each with why it is taken)::

    open ──▶ closing ──▶ open

``open`` forwards; ``closing`` holds new writes until :meth:`ComfyPort.open` or the wait limit
and passes reads and websockets, while :meth:`ComfyPort.close_and_drain` waits for the HTTP
requests in flight. Which side of ComfyUI holds writes while it is parked is the custom node's
gate (issue 13); the port's ``closing`` covers the moment before a park for a ComfyUI reached
only through the port.
"""

from __future__ import annotations

import asyncio
import enum
import logging
import time
from typing import TYPE_CHECKING

from aiohttp import web
from berth.front.listen import Limits, Listener
from berth.gateway.errors import error
from berth.gateway.ws import HandOff, Unreachable, is_websocket, json_error, relay_ws

if TYPE_CHECKING:
    from berth.front.server import ClientConnection, Request
    from berth.gateway.server import Gateway

__all__ = ["ComfyPort", "PortState", "EDGES", "TRANSITIONS", "IllegalPortTransition"]

log = logging.getLogger("berth.gateway")

_READS = frozenset({"GET", "HEAD", "OPTIONS"})


class PortState(enum.StrEnum):
    OPEN = "open"
    CLOSING = "closing"


P = PortState

#: Every legal transition, labelled with why it is taken.
EDGES: dict[tuple[PortState, PortState], str] = {
    (P.OPEN, P.CLOSING): "a park begins: hold new writes, drain the HTTP requests in flight",
    (P.CLOSING, P.OPEN): "the park is done or called off: held writes go",
}
TRANSITIONS: dict[PortState, frozenset[PortState]] = {
    st: frozenset(b for (a, b) in EDGES if a == st) for st in PortState}


class IllegalPortTransition(RuntimeError):
    """A state change :data:`TRANSITIONS` does not allow."""


class ComfyPort:
    """A pass-through for ComfyUI on ``host:port``, on ``gateway``'s relay. ``wait_limit_s``:
    the longest a write is held while closing, seconds (default berth.toml's ``wait_limit``).

    Counters: ``in_flight`` (HTTP requests being forwarded; websockets never count),
    ``websockets`` (open now), ``forwarded``, ``held``, ``held_timeouts``."""

    name = "comfyui port"

    def __init__(self, gateway: "Gateway", host: str, port: int, limits: Limits | None = None,
                 wait_limit_s: float | None = None):
        self.gw = gateway
        self.host = host
        self.wait_limit_s = wait_limit_s or gateway.cfg.policy.wait_limit
        self.state = P.OPEN
        self.since = time.monotonic()
        self.in_flight = self.websockets = 0
        self.forwarded = self.held = self.held_timeouts = 0
        self._idle = asyncio.Event()
        self._idle.set()
        self._opened = asyncio.Event()
        self._opened.set()
        app = web.Application()
        app.router.add_get("/{tail:.*}", self._websocket)
        self._handoff = HandOff(app)
        self.listener = Listener(self, host, port, name="comfyui port", pool=gateway.pool,
                                 limits=limits, hand_off=self._hand_off)

    @property
    def port(self) -> int:
        return self.listener.port

    async def start(self) -> None:
        """Listen. Raises ``OSError`` if the address is taken."""
        await self._handoff.start()
        try:
            await self.listener.start()
        except BaseException:
            await self._handoff.stop()
            raise

    async def stop(self) -> None:
        server = self.listener.close()
        self.listener.close_clients()
        if server is not None:
            await server.wait_closed()
        await self._handoff.stop()

    # -- states ------------------------------------------------------------------------------
    def _move(self, new: PortState, why: str = "") -> bool:
        """The only place the state changes: check the edge, record the time, emit one event.
        Moving to the current state does nothing and returns False."""
        old = self.state
        if new is old:
            return False
        edge = EDGES.get((old, new))
        if edge is None:
            raise IllegalPortTransition(f"comfyui port: {old} -> {new} is not allowed")
        self.state, self.since = new, time.monotonic()
        if new is P.OPEN:
            self._opened.set()
        else:
            self._opened.clear()
        log.info("comfyui port: %s -> %s (%s)", old, new, why or edge)
        return True

    async def close_and_drain(self, timeout_s: float) -> bool:
        """``open -> closing``: hold new writes, wait up to ``timeout_s`` seconds for the HTTP
        requests in flight. True when none is left; open websockets are not waited for."""
        self._move(P.CLOSING)
        try:
            async with asyncio.timeout(timeout_s):
                await self._idle.wait()
            return True
        except TimeoutError:
            return False

    def open(self) -> bool:
        """``closing -> open``: forward again; held writes go."""
        return self._move(P.OPEN)

    def counters(self) -> dict:
        return {"state": str(self.state), "in_flight": self.in_flight,
                "websockets": self.websockets, "forwarded": self.forwarded, "held": self.held,
                "held_timeouts": self.held_timeouts}

    # -- the listener's handler ----------------------------------------------------------------
    def _hand_off(self, req: "Request"):
        upgrade = req.conn.parser.should_upgrade() and is_websocket(req.headers)
        return self._handoff if upgrade else None

    def _fast(self, req: "Request", client: "ClientConnection") -> bool:
        return False

    async def _handle(self, req: "Request", client: "ClientConnection") -> bool:
        head = req.method == b"HEAD"
        if (refused := self.gw.foreign(req, client)) is not None:
            client.write(refused)           # another site's page (issue 36)
            return req.complete
        target = self.gw.comfy_target()
        if target is None:
            client.write(error(503, "no_comfyui", "berth.toml has no [engines.comfyui] with a "
                               "url or a front address", head=head))
            return req.complete
        if self.state is not P.OPEN and req.method_str not in _READS:
            if not await self._hold():
                client.write(error(503, "wait_limit", f"ComfyUI was not ready within the wait "
                                   f"limit ({self.wait_limit_s:g} s); the request was held and "
                                   f"not sent", head=head))
                return req.complete
        self.in_flight += 1
        self._idle.clear()
        self.forwarded += 1
        try:
            return await self.gw.comfy_relay(req, client, target)
        finally:
            self.in_flight -= 1
            if self.in_flight == 0:
                self._idle.set()

    async def _hold(self) -> bool:
        """Wait for ``open``: True, or False at the wait limit."""
        self.held += 1
        try:
            async with asyncio.timeout(self.wait_limit_s):
                await self._opened.wait()
            return True
        except TimeoutError:
            self.held_timeouts += 1
            return False

    async def _websocket(self, request: web.Request) -> web.StreamResponse:
        if (refused := self.gw.foreign_ws(request)) is not None:
            return refused
        target = self.gw.comfy_ws_target()
        if target is None:
            return json_error(503, "no_comfyui", "berth.toml has no [engines.comfyui] with a "
                               "url or a front address")
        try:
            return await relay_ws(request, self.gw.session, target, on_open=self._ws_open,
                                  on_close=self._ws_close)
        except Unreachable as e:
            return json_error(502, "engine_unreachable", f"ComfyUI cannot be reached: {e}")

    def _ws_open(self) -> None:
        self.websockets += 1

    def _ws_close(self) -> None:
        self.websockets -= 1
