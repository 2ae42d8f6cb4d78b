"""DNS rebinding (issue 36): the gateway rewrote ``Host`` and passed ``Origin`` on unchecked.
``Origin`` is checked against an allow-list (``[listeners] origins``, this machine's loopback or
the listener's address on its port), never against ``Host``: a foreign Origin is refused on the
gateway's port and on its ComfyUI port whatever the ``Host``; one that passes goes on to the
engine unchanged."""

from __future__ import annotations

import aiohttp
from aiohttp import web
from berth.client import Client
from berth.config import parse
from berth.gateway.server import Gateway
from berth.origin import refusal

from tests.front.conftest import run


def _stand_in(seen: list[dict]) -> web.Application:
    async def prompt(request):
        seen.append({"origin": request.headers.get("Origin"), "host": request.host})
        return web.json_response({"prompt_id": "p1", "number": 1, "node_errors": {}})

    async def ws(request):
        seen.append({"origin": request.headers.get("Origin"), "ws": True})
        sock = web.WebSocketResponse()
        await sock.prepare(request)
        await sock.close()
        return sock
    app = web.Application()
    app.router.add_post("/prompt", prompt)
    app.router.add_get("/ws", ws)
    return app


@run
async def test_a_foreign_origin_is_refused_by_the_gateway_whatever_its_host(tmp_path):
    seen: list[dict] = []
    runner = web.AppRunner(_stand_in(seen))
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    comfy = runner.addresses[0][1]
    cfg = parse({"engines": {"comfyui": {"url": f"http://127.0.0.1:{comfy}"}},
                 "network": {"name": "solo"},
                 "listeners": {"origins": ["https://studio.example"]}})
    gw = Gateway(cfg, "127.0.0.1:0", "127.0.0.1:0",
                 client=Client(socket=tmp_path / "no-berthd.sock"))
    await gw.start()
    try:
        async with aiohttp.ClientSession() as s:
            for port, path in ((gw.comfy.port, "/prompt"), (gw.port, "/prompt"),
                               (gw.port, "/v1/chat/completions")):
                url = f"http://127.0.0.1:{port}{path}"
                for origin, host in ((f"http://evil.example:{port}", f"evil.example:{port}"),
                                     (f"http://evil.example:{port}", f"127.0.0.1:{port}"),
                                     ("http://localhost:1", f"localhost:{port}"),
                                     ("null", f"127.0.0.1:{port}")):
                    async with s.post(url, json={"model": "m", "prompt": {}},
                                      headers={"Origin": origin, "Host": host}) as r:
                        doc = await r.json()
                        assert r.status == 403, (port, path, origin, host, doc)
                        assert "refused" in doc["error"]["message"], doc
                if path == "/prompt":
                    await _ws_refused(s, port)
        assert seen == [], seen                 # nothing reached ComfyUI
        async with aiohttp.ClientSession() as s:
            for port in (gw.comfy.port, gw.port):
                for origin in (f"http://127.0.0.1:{port}", f"http://localhost:{port}",
                               "https://studio.example"):
                    async with s.post(f"http://127.0.0.1:{port}/prompt", json={"prompt": {}},
                                      headers={"Origin": origin}) as r:
                        assert r.status == 200, (port, origin, await r.text())
                    # passed on unchanged; Host is the engine's
                    assert seen[-1] == {"origin": origin, "host": f"127.0.0.1:{comfy}"}, seen
    finally:
        await gw.stop()
        await runner.cleanup()


async def _ws_refused(s: aiohttp.ClientSession, port: int) -> None:
    try:
        async with s.ws_connect(f"http://127.0.0.1:{port}/ws", headers={
                "Origin": f"http://evil.example:{port}", "Host": f"evil.example:{port}"}):
            pass
    except aiohttp.WSServerHandshakeError as e:
        assert e.status == 403, e
    else:
        raise AssertionError(f"a foreign origin's websocket was accepted on port {port}")


def test_refusal_never_reads_host_and_keeps_to_the_listeners_port():
    local = ("127.0.0.1", 8188)
    assert refusal(None, local) is None
    assert refusal("http://127.0.0.1:8188", local) is None
    assert refusal("http://localhost:8188/", local) is None
    assert refusal("http://[::1]:8188", ("::1", 8188, 0, 0)) is None
    assert refusal("http://192.168.1.5:8188", ("192.168.1.5", 8188)) is None
    assert refusal("https://comfy.example", local, ["https://comfy.example:443"]) is None
    for bad in ("http://evil.example:8188", "http://127.0.0.1:8189", "null", "file://",
                "http://127.0.0.1.evil.example:8188", "http://user@127.0.0.1:8188",
                "http://127.0.0.1:8188/path", "ftp://127.0.0.1:8188", "http://192.168.1.6:8188"):
        assert refusal(bad, ("192.168.1.5", 8188)) is not None, bad
