"""What a new user sends by mistake gets a 4xx in OpenAI's shape, never a 5xx or a traceback;
every engine entry is listed; ComfyUI's websocket goes past a Berth front to ComfyUI itself
(issue 14; STYLE.md "Errors"). A real gateway on loopback, no berthd (it fails open)."""

from __future__ import annotations

import asyncio

import aiohttp
from aiohttp import web
from berth.client import Client
from berth.config import parse
from berth.gateway.body import MAX_BODY_BYTES
from berth.gateway.server import Gateway

from tests.gateway.world import serve as _serve


def _comfy() -> web.Application:
    """ComfyUI itself: ``/ws`` answers with a websocket."""
    async def ws(request):
        sock = web.WebSocketResponse()
        await sock.prepare(request)
        await sock.send_json({"type": "status", "from": "comfyui"})
        async for _ in sock:
            pass
        return sock
    app = web.Application()
    app.router.add_get("/ws", ws)
    return app


def _front() -> web.Application:
    """A Berth front before ComfyUI: it answers the API, and passes no websocket upgrade (a
    ``GET /ws`` is a plain request to it, as in berth.front)."""
    async def prompt(request):
        return web.json_response({"prompt_id": "p1", "via": "front"})

    async def ws(request):
        return web.Response(status=400, text="not a websocket")
    app = web.Application()
    app.router.add_post("/prompt", prompt)
    app.router.add_get("/ws", ws)
    return app


def _engine() -> web.Application:
    """An engine that refuses every chat, as llama.cpp does a bad one: OpenAI's error shape."""
    async def chat(request):
        return web.json_response({"error": {"message": "messages: required", "code": 400,
                                            "type": "invalid_request_error"}}, status=400)
    app = web.Application()
    app.router.add_post("/v1/chat/completions", chat)
    return app


async def _openai_error(r: aiohttp.ClientResponse, status: int, reason: str) -> dict:
    text = await r.text()
    assert r.status == status, (r.status, text)
    assert r.content_type == "application/json", text
    doc = await r.json()
    assert doc["reason"] == reason and doc["src"] == "berth", doc
    assert doc["error"]["code"] == status and doc["error"]["type"] and doc["error"]["message"]
    return doc


async def _scenario(tmp_path) -> None:
    comfy, comfy_port = await _serve(_comfy())
    front, front_port = await _serve(_front())
    engine, engine_port = await _serve(_engine())
    cfg = parse({"engines": {
        "picky": {"url": f"http://127.0.0.1:{engine_port}"},
        "quiet": {"size": "4GiB"},                      # an entry with no front and no url
        "comfyui": {"url": f"http://127.0.0.1:{comfy_port}",
                    "front": f"127.0.0.1:{front_port}"}},
        "network": {"name": "solo"}})
    gw = Gateway(cfg, "127.0.0.1:0", "127.0.0.1:0",
                 client=Client(socket=tmp_path / "no-berthd.sock"))
    await gw.start()
    bare = Gateway(parse({"network": {"name": "bare"}}), "127.0.0.1:0",
                   client=Client(socket=tmp_path / "no-berthd.sock"))
    await bare.start()
    base = f"http://127.0.0.1:{gw.port}"
    chat = base + "/v1/chat/completions"
    try:
        async with aiohttp.ClientSession() as s:
            async with s.post(chat, data=b"not json at all") as r:
                await _openai_error(r, 400, "invalid_json")
            # Nested too deep for Python's parser: it raised RecursionError, a 500 and a
            # traceback in the log.
            async with s.post(chat, data=b"[" * 100_000) as r:
                await _openai_error(r, 400, "invalid_json")
            async with s.post(chat, json={"messages": []}) as r:
                await _openai_error(r, 400, "model_missing")
            # Over the body limit: aiohttp's own 413 was plain text.
            async with s.post(chat, data=b" " * (MAX_BODY_BYTES + 1)) as r:
                doc = await _openai_error(r, 413, "body_too_large")
                assert str(MAX_BODY_BYTES) in doc["error"]["message"], doc
            async with s.get(base + "/no/such/route") as r:
                await _openai_error(r, 404, "no_route")
            # A known route with another method: 405 naming the method it takes (it was 404).
            async with s.get(chat) as r:
                await _openai_error(r, 405, "method_not_allowed")
                assert r.headers["Allow"] == "POST"
            async with s.post(base + "/v1/models") as r:
                await _openai_error(r, 405, "method_not_allowed")
                assert r.headers["Allow"] == "GET"

            # Every engine entry is listed, one with neither front nor url too (it was left
            # out), and a request for it says what is missing.
            async with s.get(base + "/v1/models") as r:
                ids = [e["id"] for e in (await r.json())["data"]]
            assert ids == ["comfyui", "picky", "quiet"], ids
            async with s.post(chat, json={"model": "quiet", "messages": []}) as r:
                doc = await _openai_error(r, 503, "no_front")
                assert "berth run --engine quiet --front" in doc["error"]["message"], doc

            # The engine's own error passes through, marked as the engine's (it had no src).
            async with s.post(chat, json={"model": "picky"}) as r:
                assert r.status == 400
                doc = await r.json()
                assert doc["src"] == "engine" and doc["error"]["message"] == "messages: required"

            # ComfyUI's API goes to its front; its websocket past the front to ComfyUI itself,
            # through the main gateway and through the ComfyUI port alike (through the front,
            # which passes no upgrade, it failed with a 502).
            for b in (base, f"http://127.0.0.1:{gw.comfy.port}"):
                async with s.post(b + "/prompt", json={"prompt": {}}) as r:
                    assert r.status == 200 and (await r.json())["via"] == "front"
                ws = await s.ws_connect(b + "/ws?clientId=c1")
                assert (await ws.receive_json(timeout=5))["from"] == "comfyui"
                await ws.close()

            # Without a comfyui entry, ComfyUI's routes are not routes here: a 404, not a 503.
            async with s.get(f"http://127.0.0.1:{bare.port}/prompt") as r:
                await _openai_error(r, 404, "no_comfyui")
            async with s.post(f"http://127.0.0.1:{bare.port}/v1/completions",
                              json={"model": "x"}) as r:
                doc = await _openai_error(r, 404, "model_not_found")
                assert doc["error"]["message"].endswith("no engine is known"), doc
    finally:
        await bare.stop()
        await gw.stop()
        await front.cleanup()
        await engine.cleanup()
        await comfy.cleanup()


def test_malformed_requests_get_openai_shaped_4xx_and_comfyui_ws_skips_the_front(tmp_path):
    asyncio.run(_scenario(tmp_path))


def test_a_client_that_expects_100_continue_gets_it_at_once(tmp_path):
    """curl sends ``Expect: 100-continue`` with a body over 1 KiB and waits a second for it."""
    async def scenario():
        async def chat(request):
            return web.json_response({"got": len(await request.read())})
        app = web.Application()
        app.router.add_post("/v1/chat/completions", chat)
        engine, port = await _serve(app)
        gw = Gateway(parse({"engines": {"m": {"url": f"http://127.0.0.1:{port}"}},
                            "network": {"name": "solo"}}), "127.0.0.1:0",
                     client=Client(socket=tmp_path / "no-berthd.sock"))
        await gw.start()
        try:
            body = b'{"model": "m", "pad": "' + b"x" * 4000 + b'"}'
            r, w = await asyncio.open_connection("127.0.0.1", gw.port)
            w.write(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n"
                    b"Expect: 100-continue\r\n\r\n" % len(body))
            async with asyncio.timeout(0.8):       # before curl would send the body anyway
                assert (await r.readuntil(b"\r\n\r\n")).startswith(b"HTTP/1.1 100")
            w.write(body)
            head = await r.readuntil(b"\r\n\r\n")
            assert head.startswith(b"HTTP/1.1 200"), head
            w.close()
        finally:
            await gw.stop()
            await engine.cleanup()
    asyncio.run(scenario())


def test_a_malformed_chunked_body_is_a_400_naming_the_chunk(tmp_path):
    """The gateway reads a chunked body while it arrives (in the connection's task): a bad
    chunk closed the connection with no answer."""
    async def scenario():
        engine, port = await _serve(_engine())
        gw = Gateway(parse({"engines": {"m": {"url": f"http://127.0.0.1:{port}"}},
                            "network": {"name": "solo"}}), "127.0.0.1:0",
                     client=Client(socket=tmp_path / "no-berthd.sock"))
        await gw.start()
        try:
            r, w = await asyncio.open_connection("127.0.0.1", gw.port)
            w.write(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: "
                    b"chunked\r\n\r\n5\r\n{\"mod\r\n")
            await w.drain()
            w.write(b"zz\r\n")
            raw = await asyncio.wait_for(r.read(), 30)
            head, _, body = raw.partition(b"\r\n\r\n")
            assert head.startswith(b"HTTP/1.1 400"), raw
            assert b'"reason": "malformed_body"' in body and b"chunk size" in body, raw
            w.close()
        finally:
            await gw.stop()
            await engine.cleanup()
    asyncio.run(scenario())
