"""The gateway's routes and its choice of machine.

Source: issue 14; seed 002 "Fronts" and "Many machines"; reference "llama-swap" ("HTTP
endpoints": routing by the JSON ``model`` field or ``?model=``).

=====================================  ============================================================
``POST /v1/chat/completions``,         by ``model`` (JSON body, else ``?model=``) to the front of
``/v1/completions``, ``/v1/embeddings`` the engine that serves it here, or to the peer that can
                                       serve it soonest (:mod:`berth.gateway.choose`); answers
                                       streamed through
``GET /v1/models``, ``/v1/models/{id}`` every engine of every machine with its state and each
                                       machine's measured switch costs; never forwarded to an
                                       engine, so a read wakes nothing
``GET /berth/v1/peer/engines``         for peers (signed): this machine's routes and costs
``GET /berth/v1/gateway``              the gateway's own state (peers, ComfyUI port)
``/board/``                            the web board (:mod:`berth.daemon.web`), read from berthd
ComfyUI's API (``/prompt``, ``/api/…``, to the ``comfyui`` engine (its front, else its ``url``),
``/queue``, ``/history``, ``/ws``, …)  websocket included
=====================================  ============================================================

A request that carries a peer's signature (:mod:`berth.gateway.signing`) is checked, and served
by this machine only: it is never forwarded again, so two gateways cannot bounce a request. A
signed request that fails the check gets a 401 and is not served.
"""

from __future__ import annotations

import json
import logging
import socket
from typing import Any

import aiohttp
from aiohttp import web
from berth.client import Client
from berth.config import Config
from berth.gateway.choose import Candidate, rank
from berth.gateway.errors import error, openai_errors
from berth.gateway.peers import ENGINES_PATH, Peer, Peers
from berth.gateway.relay import Unreachable, new_session, relay, relay_ws
from berth.gateway.signing import Refused, Verifier
from berth.gateway.table import LocalTable, Route, address_url

__all__ = ["Gateway", "OPENAI_POSTS", "COMFY_PREFIXES", "is_comfy_path"]

log = logging.getLogger("berth.gateway")

OPENAI_POSTS = ("/v1/chat/completions", "/v1/completions", "/v1/embeddings")
#: ComfyUI's routes (reference "Host programs: ComfyUI", "API surface"); every one is also
#: served under ``/api``.
COMFY_PREFIXES = ("/api/", "/prompt", "/queue", "/history", "/interrupt", "/free",
                  "/object_info", "/system_stats", "/view", "/upload/", "/ws", "/features",
                  "/userdata", "/settings", "/extensions", "/embeddings")
COMFY_ENGINE = "comfyui"
MAX_BODY_BYTES = 64 << 20
#: The gateway's own routes and the methods they take (another method: a 405, not a 404).
_ALLOWED = {**{p: ("POST",) for p in OPENAI_POSTS}, "/v1/models": ("GET",)}


def is_comfy_path(path: str) -> bool:
    return any(path == p.rstrip("/") or path.startswith(p if p.endswith("/") else p + "/")
               or path == p for p in COMFY_PREFIXES)


class Gateway:
    """One machine's gateway. ``cfg``: berth.toml; ``listen``/``comfyui_listen``: ``HOST:PORT``
    (port 0 picks one: read :attr:`port` and ``comfy.port`` after :meth:`start`). ``client``:
    berthd's control client (default: the socket berth.toml names)."""

    def __init__(self, cfg: Config, listen: str = "127.0.0.1:7880",
                 comfyui_listen: str | None = None, client: Client | None = None,
                 refresh_s: float = 0.5):
        from berth import paths
        self.cfg = cfg
        net = cfg.network
        self.machine = net.name or socket.gethostname()
        self.host, self.port = _addr(listen, "--listen")
        self.table = LocalTable(cfg, client or Client(socket=paths.socket_path(cfg)), refresh_s)
        self.verifier = Verifier(net.key, net.replay_window) if net.key else None
        self.peers = Peers(list(net.peers), net.key, self.machine, timeout_s=net.peer_timeout,
                           retry_s=net.peer_retry, poll_s=net.peer_poll) if net.peers else None
        self.comfy = None
        if comfyui_listen:
            from berth.gateway.comfy import ComfyPort
            host, port = _addr(comfyui_listen, "--comfyui-listen")
            self.comfy = ComfyPort(host, port, self._comfy_target,
                                   wait_limit_s=cfg.policy.wait_limit,
                                   ws_target=self._comfy_ws_target)
        self._session: aiohttp.ClientSession | None = None
        self._runner: web.AppRunner | None = None
        self._hub = None
        self.served_local = self.forwarded = self.refused = 0

    # -- lifetime ----------------------------------------------------------------------------
    async def start(self) -> None:
        """Read berthd, ask the peers once, listen. Raises ``OSError`` if an address is taken."""
        self._session = new_session(connect_timeout_s=self.cfg.network.peer_timeout)
        await self.table.start()
        if self.peers is not None:
            await self.peers.start(self._session)
        app = web.Application(client_max_size=MAX_BODY_BYTES, middlewares=[openai_errors])
        r = app.router
        for path in OPENAI_POSTS:
            r.add_post(path, self._openai)
        r.add_get("/v1/models", self._models)
        r.add_get("/v1/models/{model:.+}", self._model)
        r.add_get(ENGINES_PATH, self._peer_engines)
        r.add_get("/berth/v1/gateway", self._status)
        # The board (issue 15: served by the gateway when it runs), read over berthd's socket.
        from berth.daemon.web import Hub, SocketSource, board_app
        self._hub = Hub(SocketSource(self.table.client.socket))
        await self._hub.start()
        app.add_subapp("/board/", board_app(self._hub, self.cfg.board.key))
        r.add_get("/board", _to_board)
        r.add_route("*", "/{tail:.*}", self._other)
        self._runner = web.AppRunner(app, access_log=None, handler_cancellation=True,
                                     shutdown_timeout=2.0)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.host, self.port, reuse_address=True)
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]   # type: ignore[union-attr]
        if self.comfy is not None:
            await self.comfy.start(self._session)

    async def stop(self) -> None:
        if self.comfy is not None:
            await self.comfy.stop()
        if self._runner is not None:
            await self._runner.cleanup()
        if self._hub is not None:
            await self._hub.stop()
        if self.peers is not None:
            await self.peers.stop()
        await self.table.stop()
        if self._session is not None:
            await self._session.close()

    # -- OpenAI routes -----------------------------------------------------------------------
    async def _openai(self, request: web.Request) -> web.StreamResponse:
        body = await request.read()
        from_peer = await self._check_peer(request, body)
        if isinstance(from_peer, web.Response):
            return from_peer
        model = request.query.get("model")
        try:
            doc = json.loads(body) if body else {}
            if isinstance(doc, dict) and isinstance(doc.get("model"), str):
                model = doc["model"]
            elif isinstance(doc, dict) and doc.get("model") is not None:
                return error(400, "model_invalid", f"model: expected a string naming the model, "
                                                   f"got {doc['model']!r}")
        except (ValueError, RecursionError):      # RecursionError: nested too deep to parse
            if model is None:
                return error(400, "invalid_json", "the body is not JSON and no ?model= is given")
        if not model:
            return error(400, "model_missing", "model: a request must name the model it is for "
                                               "(the JSON field \"model\" or ?model=)")
        return await self._route(request, model, body, local_only=from_peer is not None)

    async def _check_peer(self, request: web.Request, body: bytes) -> str | web.Response | None:
        """The peer's machine name for a signed request, a 401 for a bad one, None unsigned."""
        if "X-Berth-Signature" not in request.headers and "X-Berth-Peer" not in request.headers:
            return None
        if self.verifier is None:
            self.refused += 1
            return error(401, "peers_off", "this gateway takes no peer calls ([network] key is "
                                           "not set)")
        try:
            return self.verifier.verify(request.method, request.raw_path, body, request.headers)
        except Refused as e:
            self.refused += 1
            log.warning("gateway: refused a peer call from %s: %s", request.remote, e)
            return error(401, e.reason, f"peer call refused: {e}")

    def _candidates(self, model: str, local_only: bool) -> tuple[list[Candidate], list[Peer]]:
        cands: list[Candidate] = []
        r = self.table.find(model)
        if r is not None and r.target:
            cands.append(Candidate(self.machine, True, r.state,
                                   r.waiting + self.table.in_flight.get(r.name, 0),
                                   self.table.costs.get(r.name), r))
        down: list[Peer] = []
        if not local_only and self.peers is not None:
            for p, pr in self.peers.candidates(model):
                if not pr.target:
                    continue
                if not p.up:
                    down.append(p)
                    continue
                cands.append(Candidate(p.machine, False, pr.state, pr.queue,
                                       p.costs.get(pr.name), (p, pr)))
        return rank(cands), down

    async def _route(self, request: web.Request, model: str, body: bytes,
                     local_only: bool) -> web.StreamResponse:
        cands, down = self._candidates(model, local_only)
        if not cands and not down and self.table.find(model) is None:
            await self.table.refresh()      # a run may have registered since the last read
            cands, down = self._candidates(model, local_only)
        failures: list[str] = []
        for c in cands:
            try:
                if c.local:
                    return await self._local(request, c.ref, body)
                peer, _ = c.ref
                return await self._forward(request, peer, body)
            except Unreachable as e:
                failures.append(f"{c.machine}: {e}")
                if not c.local:
                    self.peers.mark_down(c.ref[0], str(e))
                    down.append(c.ref[0])
            except aiohttp.ClientError as e:
                # Sent, then failed before an answer could start: not retried elsewhere (the
                # engine may have acted on it).
                log.warning("gateway: %s failed mid-request: %r", c.machine, e)
                return error(502, "upstream_failed", f"model {model!r} on {c.machine}: the "
                             f"answer failed: {e or type(e).__name__}",
                             src="berth" if c.local else "peer")
        if down:
            names = ", ".join(sorted({p.machine or p.url for p in down}))
            return error(503, "peer_down", f"model {model!r} is served by {names}, which does not "
                                           f"answer; retried after {self.peers.retry_s:g} s",
                         src="peer")
        if failures:
            return error(502, "front_unreachable", f"model {model!r}: its front cannot be "
                                                   f"reached ({'; '.join(failures)})")
        r = self.table.find(model)
        if r is not None:
            return error(503, "no_front", f"model {model!r} is an engine on {self.machine} "
                         f"({r.state}) with no front or url to send requests to: run it with "
                         f"`berth run --engine {r.name} --front HOST:PORT -- ...`, or give its "
                         f"entry a url")
        known = sorted({x.name for x in self._all_routes()})
        return error(404, "model_not_found", f"model {model!r} is served by no engine here"
                     + ("" if local_only else " or on a peer")
                     + (f"; known: {', '.join(known)}" if known else "; no engine is known"))

    async def _local(self, request: web.Request, route: Route, body: bytes) -> web.StreamResponse:
        name = route.name
        inf = self.table.in_flight
        inf[name] = inf.get(name, 0) + 1
        self.served_local += 1
        try:
            resp = await relay(request, self._session, route.target, body=body,
                               answer_headers={"X-Berth-Machine": self.machine}, src="engine")
            return resp
        finally:
            inf[name] -= 1

    async def _forward(self, request: web.Request, peer: Peer, body: bytes) -> web.StreamResponse:
        self.forwarded += 1
        headers = self.peers.signed(request.method, request.raw_path, body)
        return await relay(request, self._session, peer.url, body=body, extra_headers=headers,
                           abort=peer.gone)

    # -- reads -------------------------------------------------------------------------------
    def _all_routes(self) -> list[Route]:
        out = list(self.table.routes)
        if self.peers is not None:
            for p in self.peers.peers:
                out += p.routes
        return out

    def _machines(self) -> list[dict]:
        me = {"machine": self.machine, "local": True, "up": True,
              "berthd": self.table.berthd_up, "switch_costs": self.table.costs}
        others = [{**p.as_dict(), "local": False} for p in self.peers.peers] if self.peers else []
        return [me, *others]

    def _entries(self) -> dict[str, dict]:
        by: dict[str, dict[str, Any]] = {}
        rows: list[tuple[str, bool, bool, dict, dict]] = []
        for d in self.table.snapshot():
            rows.append((self.machine, True, True, d, self.table.costs.get(d["name"]) or {}))
        if self.peers is not None:
            for p in self.peers.peers:
                for r in p.routes:
                    rows.append((p.machine or p.url, False, p.up, r.as_dict(),
                                 p.costs.get(r.name) or {}))
        for machine, local, up, d, costs in rows:
            e = by.setdefault(d["name"], {"id": d["name"], "object": "model", "created": 0,
                                          "owned_by": "berth",
                                          "berth": {"aliases": [], "machines": []}})
            b = e["berth"]
            b["aliases"] = sorted(set(b["aliases"]) | set(d.get("aliases") or []))
            b["machines"].append({"machine": machine, "local": local, "up": up,
                                  "state": d["state"] if up else "unreachable",
                                  "queue": d.get("queue", 0), "switch_costs": costs})
        for e in by.values():
            ms = e["berth"]["machines"]
            best = rank([Candidate(m["machine"], m["local"], m["state"], m["queue"],
                                   m["switch_costs"]) for m in ms if m["up"]])
            e["berth"]["state"] = best[0].state if best else "unreachable"
            e["berth"]["machine"] = best[0].machine if best else None
        return by

    async def _models(self, request: web.Request) -> web.Response:
        by = self._entries()
        return web.json_response({"object": "list", "data": [by[k] for k in sorted(by)],
                                  "machines": self._machines()})

    async def _model(self, request: web.Request) -> web.Response:
        model = request.match_info["model"]
        for e in self._entries().values():
            if e["id"] == model or model in e["berth"]["aliases"]:
                return web.json_response(e)
        return error(404, "model_not_found", f"model {model!r} is served by no engine")

    async def _peer_engines(self, request: web.Request) -> web.Response:
        checked = await self._check_peer(request, await request.read())
        if checked is None:
            return error(401, "unsigned", "peer calls must be signed")
        if isinstance(checked, web.Response):
            return checked
        return web.json_response({"machine": self.machine, "engines": self.table.snapshot(),
                                  "switch_costs": self.table.costs})

    async def _status(self, request: web.Request) -> web.Response:
        return web.json_response({
            "machine": self.machine, "berthd": self.table.berthd_up,
            "machines": self._machines(), "served_local": self.served_local,
            "forwarded": self.forwarded, "refused": self.refused,
            "in_flight": {k: v for k, v in self.table.in_flight.items() if v},
            "comfyui_port": self.comfy.counters() if self.comfy is not None else None})

    # -- ComfyUI's API and the rest ----------------------------------------------------------
    def _comfy_target(self) -> str | None:
        r = self.table.find(COMFY_ENGINE)
        return r.target if r is not None else None

    def _comfy_ws_target(self) -> str | None:
        """Where ComfyUI's ``/ws`` goes: the entry's own ``url`` when it names one, past a Berth
        front (a front does not pass websocket upgrades, and an idle status socket must never
        count as a request in flight before a park), else where the API goes."""
        e = self.cfg.engines.get(COMFY_ENGINE)
        return address_url(e.url) if e is not None and e.url else self._comfy_target()

    async def _other(self, request: web.Request) -> web.StreamResponse:
        allowed = _ALLOWED.get(request.path) or (
            ("GET",) if request.path.startswith("/v1/models/") else None)
        if allowed:
            return error(405, "method_not_allowed", f"{request.method} {request.path}: this "
                         f"route takes {' or '.join(allowed)}", headers={"Allow": ", ".join(allowed)})
        if not is_comfy_path(request.path):
            return error(404, "no_route", f"{request.method} {request.path}: not a route of the "
                                          f"gateway (OpenAI: {', '.join(OPENAI_POSTS)}, "
                                          f"/v1/models; ComfyUI's API)")
        websocket = request.headers.get("Upgrade", "").lower() == "websocket"
        target = self._comfy_ws_target() if websocket else self._comfy_target()
        if target is None:
            return error(404, "no_comfyui", "ComfyUI's API: berth.toml has no [engines.comfyui] "
                                            "with a url or a front address")
        try:
            if websocket:
                return await relay_ws(request, self._session, target)
            return await relay(request, self._session, target)
        except Unreachable as e:
            return error(502, "engine_unreachable", f"ComfyUI cannot be reached: {e}")
        except aiohttp.ClientError as e:
            return error(502, "engine_failed", f"ComfyUI failed mid-request: {e!r}")


async def _to_board(request: web.Request) -> web.Response:
    raise web.HTTPFound("/board/")


def _addr(value: str, flag: str) -> tuple[str, int]:
    host, sep, port = value.rpartition(":")
    if not sep or not port.isdigit() or int(port) > 65535:
        raise ValueError(f"{flag}: expected HOST:PORT like 127.0.0.1:7880, got {value!r}")
    return host or "127.0.0.1", int(port)
