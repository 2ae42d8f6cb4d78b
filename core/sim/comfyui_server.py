"""The ComfyUI stand-in's ``server`` module: ``PromptServer`` with ComfyUI's routes and its
websocket messaging.

Source: ComfyUI ``server.py`` (read at 0.3.64): ``PromptServer.instance``, ``routes``
registered as ``/x`` and ``/api/x`` by ``add_routes``, the ``/ws`` handler (a ``status``
message on connect, sockets kept by ``sid``: the page's ``clientId``), ``send_sync(event,
data, sid)`` queueing a message from any thread for ``publish_loop``, ``send`` (bytes as a
binary frame: a 4-byte big-endian event number before the data; anything else as JSON
``{"type", "data"}``), ``send_progress_text`` (binary event 3: the node id's length, the node
id, the text) and ``queue_updated`` (a ``status`` message, sent by the queue on every change).
Custom nodes reach it as ``import server``.
"""

from __future__ import annotations

import asyncio
import json
import logging
import struct
import sys
import uuid
from typing import Any

from aiohttp import web

__all__ = ["PromptServer", "TEXT"]

log = logging.getLogger("comfyui")

#: ``protocol.BinaryEventTypes.TEXT``.
TEXT = 3


@web.middleware
async def cache_control(request: web.Request, handler):
    return await handler(request)


class PromptServer:
    """The server object custom nodes reach as ``server.PromptServer.instance``. ``card`` is
    the stand-in's :class:`~berth.sim.comfyui.Card`; ``queue`` its ``PromptQueue`` class."""

    instance: "PromptServer"

    def __init__(self, loop: asyncio.AbstractEventLoop, card, queue_class):
        PromptServer.instance = self
        self.loop, self.card = loop, card
        self.prompt_queue = queue_class(self)
        self.number = 0
        self.client_id = None
        self.sockets: dict[str, web.WebSocketResponse] = {}
        self.messages: asyncio.Queue = asyncio.Queue()
        self.app = web.Application(middlewares=[cache_control])
        self.routes = web.RouteTableDef()
        self.on_prompt_handlers: list = []
        self._prompt_routes()
        self._queue_routes()
        self._info_routes()
        self.routes.get("/ws")(self._websocket)

    # -- routes ------------------------------------------------------------------------------
    def _prompt_routes(self) -> None:
        r = self.routes

        @r.get("/prompt")
        async def get_prompt(request):
            return web.json_response(self.get_queue_info())

        @r.post("/prompt")
        async def post_prompt(request):
            data = self.trigger_on_prompt(await request.json())
            if "prompt" not in data:
                return _prompt_error("no_prompt", "No prompt provided", "No prompt provided")
            number = self.number
            self.number += 1
            prompt_id = str(data.get("prompt_id", uuid.uuid4()))
            problem = _validate(data["prompt"])
            if problem:
                return _prompt_error("prompt_outputs_failed_validation",
                                     "Prompt outputs failed validation", problem)
            extra = dict(data.get("extra_data") or {})
            if "client_id" in data:
                extra["client_id"] = data["client_id"]
            self.prompt_queue.put((number, prompt_id, data["prompt"], extra, []))
            return web.json_response({"prompt_id": prompt_id, "number": number,
                                      "node_errors": {}})

    def _queue_routes(self) -> None:
        r = self.routes

        @r.get("/queue")
        async def get_queue(request):
            running, pending = self.prompt_queue.get_current_queue()
            return web.json_response({"queue_running": [list(x[:2]) for x in running],
                                      "queue_pending": [list(x[:2]) for x in pending]})

        @r.post("/queue")
        async def post_queue(request):
            # server.py 0.3.64: "clear" wipes the pending prompts; "delete" removes each named
            # pending prompt (its prompt id, a string, compared as given: 5 is not "5"); 200
            # with no body. A body that is not JSON, or a "delete" that is not a list (null),
            # raises in the handler: aiohttp answers 500.
            data = await request.json()
            if "clear" in data and data["clear"]:
                self.prompt_queue.wipe_queue()
            if "delete" in data:
                for id_to_delete in data["delete"]:
                    self.prompt_queue.delete_queue_item(lambda a, i=id_to_delete: a[1] == i)
            return web.Response(status=200)

        @r.post("/interrupt")
        async def post_interrupt(request):
            # server.py 0.3.64: a body is optional (none, or one that is not JSON, reads as
            # {}); with a prompt_id, only that prompt is interrupted, and only if it runs now
            # (a pending one is left queued); without, whatever runs now. A JSON body that is
            # not an object (null, a list) raises in the handler: aiohttp answers 500.
            try:
                data = await request.json()
            except json.JSONDecodeError:
                data = {}
            prompt_id = data.get("prompt_id")
            running, _ = self.prompt_queue.get_current_queue()
            if not prompt_id:
                log.info("Global interrupt (no prompt_id specified)")
                sys.modules["nodes"].interrupt_processing()
            elif any(item[1] == prompt_id for item in running):
                log.info("Interrupting prompt %s", prompt_id)
                sys.modules["nodes"].interrupt_processing()
            else:
                log.info("Prompt %s is not currently running, skipping interrupt", prompt_id)
            return web.Response(status=200)

        @r.post("/free")
        async def post_free(request):
            data = await request.json()
            for flag in ("unload_models", "free_memory"):
                if data.get(flag):
                    self.prompt_queue.set_flag(flag, data[flag])
            return web.Response(status=200)

        @r.get("/history/{prompt_id}")
        async def get_history(request):
            pid = request.match_info["prompt_id"]
            with self.prompt_queue.mutex:
                h = self.prompt_queue.history.get(pid)
                out = {pid: {"status": h["status"], "outputs": h["outputs"]}} if h else {}
            return web.json_response(out)

    def _info_routes(self) -> None:
        r = self.routes

        @r.get("/system_stats")
        async def system_stats(request):
            free = self.card.free_bytes()
            return web.json_response({"system": {"comfyui_version": "stand-in"}, "devices": [{
                "name": f"cuda:0 {self.card.pci}", "type": "cuda", "index": 0,
                "vram_total": self.card.total_bytes, "vram_free": free,
                "torch_vram_total": self.card.own_bytes(), "torch_vram_free": 0}],
                # Not in ComfyUI's answer: what the stand-in's comfy-aimdo holds, for tests.
                "stand_in": {"simple_vram_headroom": self.card.headroom_bytes,
                             "extra_vram_headroom": self.card.extra_headroom_bytes,
                             "nvml_pressure": self.card.nvml_pressure}})

        @r.get("/object_info")
        async def object_info(request):
            nodes = sys.modules["nodes"].NODE_CLASS_MAPPINGS
            return web.json_response({name: {"name": name} for name in nodes})

    async def _websocket(self, request: web.Request) -> web.WebSocketResponse:
        """ComfyUI's status channel (``websocket_handler``): the page's ``clientId`` names the
        socket (a new id without one), a ``status`` message on connect, then open for as long
        as the page is."""
        ws = web.WebSocketResponse()
        await ws.prepare(request)
        sid = request.rel_url.query.get("clientId", "")
        if sid:
            self.sockets.pop(sid, None)
        else:
            sid = uuid.uuid4().hex
        self.sockets[sid] = ws
        try:
            await self.send("status", {"status": self.get_queue_info(), "sid": sid}, sid)
            async for _ in ws:
                pass
        finally:
            self.sockets.pop(sid, None)
        return ws

    def add_routes(self) -> None:
        """Every route twice, as ``/x`` and ``/api/x`` (server.py ``add_routes``)."""
        api = web.RouteTableDef()
        for route in self.routes:
            if isinstance(route, web.RouteDef):
                api.route(route.method, "/api" + route.path)(route.handler, **route.kwargs)
        self.app.add_routes(api)
        self.app.add_routes(self.routes)

    # -- prompts -----------------------------------------------------------------------------
    def add_on_prompt_handler(self, fn) -> None:
        self.on_prompt_handlers.append(fn)

    def trigger_on_prompt(self, data: Any) -> Any:
        for fn in self.on_prompt_handlers:          # exceptions swallowed, as in ComfyUI
            try:
                data = fn(data)
            except Exception:
                log.exception("on_prompt handler failed")
        return data

    def get_queue_info(self) -> dict:
        return {"exec_info": {"queue_remaining": self.prompt_queue.get_tasks_remaining()}}

    # -- messages ----------------------------------------------------------------------------
    async def send(self, event, data, sid=None) -> None:
        if isinstance(data, (bytes, bytearray)):
            await self._to(sid, "send_bytes", struct.pack(">I", event) + bytes(data))
        else:
            await self._to(sid, "send_json", {"type": event, "data": data})

    async def _to(self, sid, method: str, message) -> None:
        sockets = list(self.sockets.values()) if sid is None else \
            [self.sockets[sid]] if sid in self.sockets else []
        for ws in sockets:
            try:                                    # send_socket_catch_exception
                await getattr(ws, method)(message)
            except (ConnectionError, RuntimeError):
                pass

    def send_sync(self, event, data, sid=None) -> None:
        """Queue a message from any thread; ``publish_loop`` sends it."""
        self.loop.call_soon_threadsafe(self.messages.put_nowait, (event, data, sid))

    def queue_updated(self) -> None:
        self.send_sync("status", {"status": self.get_queue_info()})

    def send_progress_text(self, text, node_id, sid=None) -> None:
        if isinstance(text, str):
            text = text.encode("utf-8")
        node = str(node_id).encode("utf-8")
        self.send_sync(TEXT, struct.pack(">I", len(node)) + node + text, sid)

    async def publish_loop(self) -> None:
        while True:
            msg = await self.messages.get()
            await self.send(*msg)

    async def start(self, address: str, port: int) -> web.AppRunner:
        runner = web.AppRunner(self.app, access_log=None)
        await runner.setup()                         # freezes the app and its middlewares
        await web.TCPSite(runner, address, port).start()
        print(f"To see the GUI go to: http://{address}:{port}", flush=True)
        return runner


def _prompt_error(kind: str, message: str, details: str) -> web.Response:
    return web.json_response({"error": {"type": kind, "message": message, "details": details,
                                         "extra_info": {}}, "node_errors": {}}, status=400)


def _validate(prompt: Any) -> str | None:
    if not isinstance(prompt, dict) or not prompt:
        return "prompt must be a non-empty object of nodes"
    fp, nodes = sys.modules["folder_paths"], sys.modules["nodes"]
    for nid, node in prompt.items():
        if not isinstance(node, dict) or node.get("class_type") not in nodes.NODE_CLASS_MAPPINGS:
            kind = node.get("class_type") if isinstance(node, dict) else node
            return f"node {nid}: unknown class_type {kind!r}"
        for inp, folder in nodes.LOADERS.get(node["class_type"], {}).items():
            name = (node.get("inputs") or {}).get(inp)
            if not isinstance(name, str) or fp.get_full_path(folder, name) is None:
                return f"node {nid}: {inp} {name!r} is not in {folder}"
    return None
