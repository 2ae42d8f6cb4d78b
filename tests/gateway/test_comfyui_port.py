"""``--comfyui-listen``: ComfyUI's whole surface through the gateway, websocket included, and an
idle open websocket never holds up a park (issue 14 "Acceptance", third line; llama-swap
#1001/#1137)."""

from __future__ import annotations

import asyncio
import socket
import time

import aiohttp
from aiohttp import web
from berth.client import Client
from berth.config import parse
from berth.gateway.comfy import EDGES, TRANSITIONS, PortState
from berth.gateway.server import Gateway

from tests.helpers import ceiling, free_port


def _comfy_stand_in() -> web.Application:
    """A test server with ComfyUI's shapes: ``/ws`` (a ``status`` message on connect, then the
    prompt's ``executing`` to its client), ``POST /prompt`` (``?slow=S`` takes S seconds),
    ``GET /queue``, and a page at ``/``."""
    sockets: dict[str, web.WebSocketResponse] = {}

    async def ws(request):
        sock = web.WebSocketResponse()
        await sock.prepare(request)
        cid = request.query.get("clientId", "")
        sockets[cid] = sock
        await sock.send_json({"type": "status", "data": {"status": {"exec_info":
                                                                     {"queue_remaining": 0}}}})
        async for msg in sock:
            if msg.type == aiohttp.WSMsgType.TEXT:
                await sock.send_str("echo:" + msg.data)
        sockets.pop(cid, None)
        return sock

    async def prompt(request):
        doc = await request.json()
        await asyncio.sleep(float(request.query.get("slow", 0)))
        sock = sockets.get(doc.get("client_id", ""))
        if sock is not None:
            await sock.send_json({"type": "executing", "data": {"node": None,
                                                                 "prompt_id": "p1"}})
        return web.json_response({"prompt_id": "p1", "number": 1, "node_errors": {}})

    async def queue(request):
        return web.json_response({"queue_running": [], "queue_pending": []})

    async def index(request):
        return web.Response(text="<html>ComfyUI</html>", content_type="text/html")

    app = web.Application()
    app.router.add_get("/ws", ws)
    app.router.add_post("/prompt", prompt)
    app.router.add_post("/api/prompt", prompt)
    app.router.add_get("/queue", queue)
    app.router.add_get("/", index)
    return app


async def _scenario(tmp_path) -> None:
    runner = web.AppRunner(_comfy_stand_in())
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    comfy_port = runner.addresses[0][1]
    cfg = parse({"engines": {"comfyui": {"url": f"http://127.0.0.1:{comfy_port}"}},
                 "network": {"name": "solo"}})
    # berthd is not running: the gateway fails open and routes by berth.toml.
    gw = Gateway(cfg, "127.0.0.1:0", "127.0.0.1:0",
                 client=Client(socket=tmp_path / "no-berthd.sock"))
    await gw.start()
    port = gw.comfy
    base = f"http://127.0.0.1:{port.port}"
    try:
        async with aiohttp.ClientSession() as s:
            async with s.get(base + "/") as r:
                assert r.status == 200 and "ComfyUI" in await r.text()
            ws = await s.ws_connect(base + "/ws?clientId=c1")
            first = await ws.receive_json(timeout=5)
            assert first["type"] == "status"
            await ws.send_str("hello")
            assert (await ws.receive(timeout=5)).data == "echo:hello"
            assert port.websockets == 1 and port.in_flight == 0

            async with s.post(base + "/prompt", json={"prompt": {}, "client_id": "c1"}) as r:
                assert r.status == 200 and (await r.json())["prompt_id"] == "p1"
            msg = await ws.receive_json(timeout=5)
            assert msg["type"] == "executing" and msg["data"]["prompt_id"] == "p1"

            # The main gateway routes ComfyUI's API too (/api/prompt, and /queue).
            gbase = f"http://127.0.0.1:{gw.port}"
            async with s.post(gbase + "/api/prompt", json={"prompt": {}}) as r:
                assert r.status == 200 and (await r.json())["prompt_id"] == "p1"
            async with s.get(gbase + "/queue") as r:
                assert r.status == 200 and (await r.json())["queue_running"] == []

            # A park's drain with only an idle websocket open: done at once.
            t0 = time.monotonic()
            assert await port.close_and_drain(2.0) is True
            assert port.state is PortState.CLOSING and port.counters()["state"] == "closing"
            assert time.monotonic() - t0 < ceiling(0.5)
            assert port.websockets == 1
            # While closing: reads pass, writes are held until the port opens again.
            async with s.get(base + "/queue") as r:
                assert r.status == 200
            held = asyncio.ensure_future(s.post(base + "/prompt", json={"prompt": {}}))
            await _until(lambda: port.held == 1)
            assert not held.done()
            port.open()
            r = await held
            assert r.status == 200
            r.release()
            # The websocket still passes messages after all of it.
            await ws.send_str("again")
            assert (await ws.receive(timeout=5)).data == "echo:again"

            # An HTTP request in flight does hold the drain up (so the count is real).
            slow = asyncio.ensure_future(s.post(base + "/prompt?slow=0.6", json={"prompt": {}}))
            await _until(lambda: port.in_flight == 1)
            assert await port.close_and_drain(0.1) is False
            assert await port.close_and_drain(5.0) is True
            port.open()
            (await slow).release()
            await ws.close()
            await _until(lambda: port.websockets == 0)
    finally:
        await gw.stop()
        await runner.cleanup()


async def _until(pred, timeout_s: float = 5.0) -> None:
    end = time.monotonic() + timeout_s
    while not pred():
        assert time.monotonic() < end, "timed out"
        await asyncio.sleep(0.01)


def test_comfyui_port_passes_websocket_and_prompt_and_an_idle_websocket_never_blocks_a_park(
        tmp_path):
    asyncio.run(_scenario(tmp_path))


def test_the_ports_states_are_an_enum_with_a_transition_table():
    """Issue 23: the port kept its state in bare strings with no table."""
    assert set(EDGES) == {(PortState.OPEN, PortState.CLOSING), (PortState.CLOSING, PortState.OPEN)}
    assert all(isinstance(why, str) and why for why in EDGES.values())
    assert TRANSITIONS[PortState.OPEN] == {PortState.CLOSING}
    assert TRANSITIONS[PortState.CLOSING] == {PortState.OPEN}


def test_the_gateway_answers_only_once_its_comfyui_port_listens(tmp_path):
    """The gateway's address accepts only once the ComfyUI port is bound: a client that reads
    ``/berth/v1/gateway`` (which names the port) may use the port at once. The port was bound
    after the gateway's own listener, so under load tests/hosts/comfyui/test_gateway_port.py
    read the gateway and then found the port refusing connections (issue 38). Here a
    connection to the gateway's address is tried at the moment the port is about to bind."""
    async def scenario():
        port = free_port()
        gw = Gateway(parse({"network": {"name": "solo"}}), f"127.0.0.1:{port}", "127.0.0.1:0",
                     client=Client(socket=tmp_path / "no-berthd.sock"))
        seen: list[str] = []
        bind = gw.comfy.listener.start

        async def start() -> None:
            try:
                _, w = await asyncio.open_connection("127.0.0.1", port)
                w.close()
                seen.append("the gateway accepted")
            except ConnectionRefusedError:
                seen.append("refused")
            await bind()
        gw.comfy.listener.start = start
        await gw.start()
        try:
            assert seen == ["refused"], seen
            async with aiohttp.ClientSession() as s:
                async with s.get(f"http://127.0.0.1:{gw.port}/berth/v1/gateway") as r:
                    doc = await r.json()
                assert doc["comfyui_port"]["state"] == "open", doc
                named = {x["name"]: x["port"] for x in doc["listeners"]}
                assert named == {"gateway": port, "comfyui port": gw.comfy.port}, named
        finally:
            await gw.stop()
        with socket.socket() as s:
            s.bind(("127.0.0.1", port))          # stopped in order: its address is free again
    asyncio.run(asyncio.wait_for(scenario(), 20))
