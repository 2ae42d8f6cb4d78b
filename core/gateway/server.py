"""The gateway: its routes, its listener and its lifetime.

Source: issue 14; issue 27; seed 002 "Fronts" and "Many machines"; reference "llama-swap"
("HTTP endpoints": routing by the JSON ``model`` field or ``?model=``).

=====================================  ============================================================
``POST /v1/chat/completions``,         by ``model`` (JSON body, else ``?model=``) to the front of
``/v1/completions``, ``/v1/embeddings`` the engine that serves it here, or to the peer that
                                       answers first (:mod:`berth.gateway.route`); answers
                                       streamed through
``GET /v1/models``, ``/v1/models/{id}`` every engine of every machine with its state, switch
                                       costs and ranking (:mod:`berth.gateway.views`); never
                                       forwarded, so a read wakes nothing
``GET /berth/v1/peer/engines``         for peers (signed): this machine's routes and costs
``GET /berth/v1/gateway``              the gateway's own state (machines, ranking, listeners)
``GET /health``, ``GET /metrics``      that it answers; its figures (Prometheus text)
``GET /``                              a redirect to ``/board/``
``/board/``                            the web board (:mod:`berth.daemon.board_web`), read from
                                       berthd
ComfyUI's API (``/prompt``, ``/api/…``, to the ``comfyui`` engine (its front, else its ``url``);
``/queue``, ``/history``, ``/ws``, …)  ``/ws`` to the entry's own ``url`` when it names one
=====================================  ============================================================

The listener is the front's (:class:`berth.front.listen.Listener`): the same asyncio protocol
over httptools, the same limits on slow and idle clients (issue 26), the same kept-alive engine
connections (issue 27 "As light as the front"). The board and websockets are handed whole to
aiohttp's server (:mod:`berth.gateway.ws`).

A request that carries a peer's signature (:mod:`berth.gateway.signing`) is checked, and served
by this machine only: it is never forwarded again, so two gateways cannot bounce a request. A
signed request that fails the check gets a 401 and is not served.

Lifetime: :meth:`Gateway.start` builds each part on one ``AsyncExitStack`` (the table, the peer
session and polls, the board's hub, the hand-off server, the ComfyUI port, the listener, the
relay sweep: the gateway's own address answers only once every listener is bound), so a failed
start stops only what was built, in reverse order, and :meth:`Gateway.stop` is that stack's
close.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import time

from aiohttp import web
from berth.client import Client
from berth.config import Config
from berth.front.listen import Limits, Listener
from berth.front.server import ClientConnection, Request
from berth.front.upstream import Address, Pool
from berth.gateway import route as routing
from berth.gateway import views
from berth.gateway.body import Passing
from berth.gateway.errors import answer, document, error, redirect
from berth.gateway.fast import fast
from berth.gateway.peers import ENGINES_PATH, Peer, Peers, new_session
from berth.gateway.relay import RelayConnection, Relays, Target, attempt
from berth.gateway.signing import EMPTY_DIGEST, Verifier
from berth.gateway.table import LocalTable, address_url
from berth.gateway.ws import HandOff, Unreachable, is_websocket, json_error, relay_ws
from berth.origin import refusal

__all__ = ["Gateway", "OPENAI_POSTS", "COMFY_PREFIXES", "is_comfy_path"]

log = logging.getLogger("berth.gateway")

OPENAI_POSTS = ("/v1/chat/completions", "/v1/completions", "/v1/embeddings")
#: ComfyUI's routes (reference "Host programs: ComfyUI", "API surface"); every one is also
#: served under ``/api``.
COMFY_PREFIXES = ("/api/", "/prompt", "/queue", "/history", "/interrupt", "/free",
                  "/object_info", "/system_stats", "/view", "/upload/", "/ws", "/features",
                  "/userdata", "/settings", "/extensions", "/embeddings")
COMFY_ENGINE = "comfyui"
SWEEP_S = 0.5
_READS = ("GET", "HEAD")
_CONTENT_METRICS = "text/plain; version=0.0.4; charset=utf-8"


def is_comfy_path(path: str) -> bool:
    return any(path == p.rstrip("/") or path.startswith(p if p.endswith("/") else p + "/")
               or path == p for p in COMFY_PREFIXES)


def limits_of(cfg: Config) -> Limits:
    """The listeners' limits from ``[listeners]``."""
    li = cfg.listeners
    return Limits(li.head_timeout, li.idle_timeout, li.max_connections or None)


class Gateway:
    """One machine's gateway. ``cfg``: berth.toml; ``listen``/``comfyui_listen``: ``HOST:PORT``
    (port 0 picks one: read :attr:`port` and ``comfy.port`` after :meth:`start`). ``client``:
    berthd's control client (default: the socket berth.toml names)."""

    name = "gateway"

    def __init__(self, cfg: Config, listen: str = "127.0.0.1:7880",
                 comfyui_listen: str | None = None, client: Client | None = None,
                 refresh_s: float = 0.5):
        from berth import paths
        self.cfg = cfg
        net = cfg.network
        self.machine = net.name or socket.gethostname()
        self.machine_line = b"X-Berth-Machine: %s\r\n" % self.machine.encode("latin-1", "replace")
        self.host, self.port = _addr(listen, "--listen")
        self.addresses = {"--listen": listen, "--comfyui-listen": comfyui_listen}
        self.table = LocalTable(cfg, client or Client(socket=paths.socket_path(cfg)), refresh_s)
        nonces = paths.state_dir(cfg) / f"gateway-{_file_safe(self.machine)}.nonces"
        self.verifier = Verifier(net.key, net.replay_window, self.machine,
                                 nonces) if net.key else None
        self.relays = Relays()
        self.peers = Peers(list(net.peers), net.key, self.machine, timeout_s=net.peer_timeout,
                           retry_s=net.peer_retry, poll_s=net.peer_poll,
                           on_down=self._peer_down) if net.peers else None
        self.pool = Pool(RelayConnection)
        limits = limits_of(cfg)
        self.listener = Listener(self, self.host, self.port, name="gateway", pool=self.pool,
                                 limits=limits, hand_off=self._hand_off)
        self.comfy = None
        if comfyui_listen:
            from berth.gateway.comfy import ComfyPort
            host, port = _addr(comfyui_listen, "--comfyui-listen")
            self.comfy = ComfyPort(self, host, port, limits)
        self.served_local = self.forwarded = self.refused = 0
        self._addresses: dict[str, Address] = {}
        self._handoff: HandOff | None = None
        self.session = None
        self._stack: contextlib.AsyncExitStack | None = None

    # -- lifetime ----------------------------------------------------------------------------
    async def start(self) -> None:
        """Read berthd, ask the peers once, listen. Raises ``OSError`` if an address is taken
        (:class:`~berth.exposed.CannotListen`, naming the flag, where a listener cannot listen);
        what was started by then is stopped again, in reverse order."""
        async with contextlib.AsyncExitStack() as stack:
            await self.table.start()
            stack.push_async_callback(self.table.stop)
            self.session = new_session(connect_timeout_s=self.cfg.network.peer_timeout)
            stack.push_async_callback(self.session.close)
            if self.verifier is not None:
                stack.callback(self.verifier.close)
            if self.peers is not None:
                await self.peers.start(self.session)
                stack.push_async_callback(self.peers.stop)
            self._handoff = HandOff(await self._handoff_app(stack))
            await self._handoff.start()
            stack.push_async_callback(self._handoff.stop)
            stack.callback(self.pool.close)     # after both listeners: they share the pool
            # The ComfyUI port listens before the gateway's own address answers: whoever reads
            # the gateway (its /berth/v1/gateway names the port) may use the port at once.
            # Bound after, a client told of the port by the gateway found it refused (issue 38).
            if self.comfy is not None:
                with self._naming("--comfyui-listen"):
                    await self.comfy.start()
                stack.push_async_callback(self.comfy.stop)
            with self._naming("--listen"):
                await self.listener.start()
            stack.push_async_callback(self._stop_listening, self.listener)
            self.port = self.listener.port
            sweep = asyncio.get_running_loop().create_task(self._sweep())
            stack.callback(sweep.cancel)
            self._stack = stack.pop_all()

    @contextlib.contextmanager
    def _naming(self, flag: str):
        """An ``OSError`` of the listener ``flag`` gave, as one line naming the flag."""
        from berth.exposed import cannot_listen
        try:
            yield
        except OSError as e:
            address = self.addresses[flag]
            raise cannot_listen(f"{flag} {address}", address, e) from None

    async def stop(self) -> None:
        """Stop everything :meth:`start` built, in reverse order (idempotent)."""
        stack, self._stack = self._stack, None
        if stack is not None:
            await stack.aclose()

    async def _stop_listening(self, listener: Listener) -> None:
        server = listener.close()
        busy = {c.task for c in listener.conns if c.task is not None}
        if busy:
            await asyncio.wait(busy, timeout=2.0)
        listener.close_clients()
        await listener.wait_closed(server)

    async def _handoff_app(self, stack: contextlib.AsyncExitStack) -> web.Application:
        # The board (issue 15: served by the gateway when it runs), read over berthd's socket.
        from berth.daemon.board_web import Hub, SocketSource, board_app
        hub = Hub(SocketSource(self.table.client.socket))
        await hub.start()
        stack.push_async_callback(hub.stop)
        app = web.Application()
        app.add_subapp("/board/", board_app(hub, self.cfg.board.key,
                                             self.cfg.board.session_limit))
        app.router.add_get("/board", _to_board)
        app.router.add_get("/{tail:.*}", self._websocket)
        return app

    async def _sweep(self) -> None:
        while True:
            await asyncio.sleep(SWEEP_S)
            self.relays.sweep(time.monotonic())    # the relays' clock (uvloop's is coarser)

    def _peer_down(self, peer: Peer, why: str) -> None:
        self.relays.peer_down(peer, why)

    def listeners(self) -> list[Listener]:
        return [self.listener] + ([self.comfy.listener] if self.comfy is not None else [])

    def address(self, url: str) -> Address:
        return routing.address(self._addresses, url)

    # -- the listener's handler ----------------------------------------------------------------
    def _hand_off(self, req: Request):
        """The board, and websockets on ComfyUI's routes, go to aiohttp's server whole."""
        t = req.target
        if t.startswith(b"/board") and (len(t) == 6 or t[6:7] in b"/?"):
            return self._handoff
        if req.conn.parser.should_upgrade() and is_comfy_path(req.path) and \
                is_websocket(req.headers):
            return self._handoff
        return None

    #: the listener's shortest way (:mod:`berth.gateway.fast`), called as a method: one Python
    #: call less per request than a method that calls it
    _fast = fast

    async def _handle(self, req: Request, client: ClientConnection) -> bool:
        if (refused := self.foreign(req, client)) is not None:
            client.write(refused)
            return await _rest_read(req)
        path = req.path
        if path in OPENAI_POSTS:
            if req.method == b"POST":
                return await routing.openai(self, req, client)
            return await self._not_allowed(req, client, "POST")
        if path in self._reads or path.startswith("/v1/models/"):
            if req.method_str not in _READS:
                return await self._not_allowed(req, client, "GET")
            return await self._read(req, client, path)
        if is_comfy_path(path):
            return await self._comfy_api(req, client)
        client.write(error(404, "no_route", f"{req.method_str} {path}: not a route of the "
                           f"gateway (OpenAI: {', '.join(OPENAI_POSTS)}, /v1/models; ComfyUI's "
                           "API; /health, /metrics, /board/)", head=req.method == b"HEAD"))
        return await _rest_read(req)

    _reads = frozenset({"/", "/health", "/metrics", "/v1/models", "/berth/v1/gateway",
                        ENGINES_PATH})

    async def _read(self, req: Request, client: ClientConnection, path: str) -> bool:
        head = req.method == b"HEAD"
        if path == ENGINES_PATH:
            client.write(self._peer_engines(req))
        elif path == "/":
            client.write(redirect("/board/"))
        elif path == "/health":
            client.write(document(views.health(self), head=head))
        elif path == "/metrics":
            client.write(answer(200, views.metrics(self), _CONTENT_METRICS, head=head))
        elif path == "/v1/models":
            client.write(document(views.models(self), head=head))
        elif path == "/berth/v1/gateway":
            client.write(document(views.status(self), head=head))
        else:
            name = path[len("/v1/models/"):]
            doc = views.model(self, name)
            client.write(document(doc, head=head) if doc is not None else error(
                404, "model_not_found", f"model {name!r} is served by no engine", head=head))
        return await _rest_read(req)

    def _peer_engines(self, req: Request) -> bytes:
        checked = routing.check_peer(self, req, EMPTY_DIGEST)
        if checked is None:
            return error(401, "unsigned", "peer calls must be signed")
        if isinstance(checked, bytes):
            return checked
        return document({"machine": self.machine, "engines": self.table.snapshot(),
                         "switch_costs": self.table.costs})

    def foreign(self, req: Request, client: ClientConnection) -> bytes | None:
        """A 403 for a request whose ``Origin`` is another site's page (:mod:`berth.origin`:
        checked against the allow-list, never ``Host``; issue 36), else ``None``. The
        ``Origin`` that passes goes on to the engine unchanged."""
        t = client.transport
        why = origin_refusal(req.headers, t.get_extra_info("sockname") if t else None,
                             self.cfg.listeners.origins)
        return None if why is None else error(403, "foreign_origin", f"{req.method_str} "
                                              f"{req.path} refused: {why}",
                                              head=req.method == b"HEAD")

    def foreign_ws(self, request: web.Request) -> web.StreamResponse | None:
        """:meth:`foreign` for a websocket handed to aiohttp."""
        t = request.transport
        why = refusal_of(request.headers.getall("Origin", []),
                         t.get_extra_info("sockname") if t else None, self.cfg.listeners.origins)
        if why is None:
            return None
        r = json_error(403, "foreign_origin", f"{request.path} refused: {why}")
        r.force_close()             # the handed-off connection ends with it: say so
        return r

    async def _not_allowed(self, req: Request, client: ClientConnection, allowed: str) -> bool:
        client.write(error(405, "method_not_allowed", f"{req.method_str} {req.path}: this route "
                           f"takes {allowed}", headers={"Allow": allowed},
                           head=req.method == b"HEAD"))
        return await _rest_read(req)

    # -- ComfyUI's API -----------------------------------------------------------------------
    def comfy_target(self) -> str | None:
        r = self.table.find(COMFY_ENGINE)
        return r.target if r is not None else None

    def comfy_ws_target(self) -> str | None:
        """Where ComfyUI's ``/ws`` goes: the entry's own ``url`` when it names one, past a Berth
        front (a front does not pass websocket upgrades, and an idle status socket must never
        count as a request in flight before a park), else where the API goes."""
        e = self.cfg.engines.get(COMFY_ENGINE)
        return address_url(e.url) if e is not None and e.url else self.comfy_target()

    async def comfy_relay(self, req: Request, client: ClientConnection, target: str) -> bool:
        """Pass one request of ComfyUI's surface to ``target``, its body streamed through."""
        e = self.cfg.engines.get(COMFY_ENGINE)
        gap = e.read_timeout if e is not None else None
        body = await Passing.read(req)
        t = await attempt(self.pool, self.relays, req, client,
                          Target(self.machine, self.address(target), gap_s=gap), body)
        if t.answered:
            return t.keep
        client.write(error(502, "engine_unreachable", f"ComfyUI cannot be reached: {t.why}",
                           head=req.method == b"HEAD"))
        return body.whole

    async def _comfy_api(self, req: Request, client: ClientConnection) -> bool:
        target = self.comfy_target()
        if target is None:
            client.write(error(404, "no_comfyui", "ComfyUI's API: berth.toml has no "
                               "[engines.comfyui] with a url or a front address",
                               head=req.method == b"HEAD"))
            return await _rest_read(req)
        return await self.comfy_relay(req, client, target)

    async def _websocket(self, request: web.Request) -> web.StreamResponse:
        if (refused := self.foreign_ws(request)) is not None:
            return refused
        target = self.comfy_ws_target()
        if target is None:
            return json_error(404, "no_comfyui", "ComfyUI's websocket: berth.toml has no "
                               "[engines.comfyui] with a url or a front address")
        try:
            return await relay_ws(request, self.session, target)
        except Unreachable as e:
            return json_error(502, "engine_unreachable", f"ComfyUI cannot be reached: {e}")


def refusal_of(origins: list[str], sockname, allowed) -> str | None:
    """Why a request with these ``Origin`` headers is refused (each must pass), or ``None``."""
    for o in origins:
        if (why := refusal(o, sockname, allowed)) is not None:
            return why
    return None


def origin_refusal(headers: list[tuple[bytes, bytes]], sockname, allowed) -> str | None:
    """:func:`refusal_of` for a raw request head's ``(name, value)`` pairs."""
    return refusal_of([v.decode("latin-1") for k, v in headers if k.lower() == b"origin"],
                      sockname, allowed)


async def _rest_read(req: Request) -> bool:
    """Read what is left of a request answered without its body; False when it cannot be
    (large or chunked: the connection closes after the answer)."""
    if req.complete:
        return True
    if req.streamed:
        return False
    await req.read_all()
    return True


async def _to_board(request: web.Request) -> web.Response:
    raise web.HTTPFound("/board/")


def _file_safe(name: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in name)[:100]


def _addr(value: str, flag: str) -> tuple[str, int]:
    host, sep, port = value.rpartition(":")
    if not sep or not port.isdigit() or int(port) > 65535:
        raise ValueError(f"{flag}: expected HOST:PORT like 127.0.0.1:7880, got {value!r}")
    return host or "127.0.0.1", int(port)
