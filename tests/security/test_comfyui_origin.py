"""The ComfyUI node's park and wake routes refuse another site's page (issue 26, Low): a
browser's "simple" cross-site POST (a form, no preflight) to ComfyUI's port is a 403 and parks
nothing; ComfyUI's own page and callers that are not browsers (no ``Origin``) pass.

The routes are the node's own (:func:`berth_hosts.comfyui.routes.add_routes`) on a real aiohttp
server, over an agent that records what it is asked to do."""

from __future__ import annotations

import asyncio

import aiohttp
from aiohttp import web
from berth_hosts.comfyui.routes import add_routes

from tests.front.conftest import free_port, run


class Agent:
    def __init__(self):
        self.done: list[str] = []
        self.loop = asyncio.get_running_loop()

    def call(self, coro):
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    async def park(self):
        self.done.append("park")
        return True, "parked"

    async def wake(self):
        self.done.append("wake")
        return True


@run
async def test_a_cross_site_post_neither_parks_nor_wakes():
    agent = Agent()
    routes = web.RouteTableDef()
    add_routes(routes, agent)
    app = web.Application()
    app.add_routes(routes)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    base = f"http://127.0.0.1:{port}"
    form = {"Content-Type": "application/x-www-form-urlencoded"}
    try:
        async with aiohttp.ClientSession() as s:
            for op in ("park", "wake"):
                for headers in ({"Origin": "https://evil.example", **form},
                                {"Origin": "null", **form},
                                {"Origin": f"http://127.0.0.1:{port + 1}", **form},
                                {"Sec-Fetch-Site": "cross-site", **form}):
                    async with s.post(f"{base}/berth/v1/{op}", data="x=1", headers=headers) as r:
                        assert r.status == 403, (op, headers, await r.text())
                        assert "refused" in (await r.json())["error"]["message"]
            assert agent.done == []
            for headers in ({}, {"Origin": base}, {"Origin": base + "/",
                                                   "Sec-Fetch-Site": "same-origin"}):
                async with s.post(f"{base}/berth/v1/park", json={}, headers=headers) as r:
                    assert r.status == 200, (headers, await r.text())
            async with s.post(f"{base}/berth/v1/wake", json={}) as r:
                assert r.status == 200
            assert agent.done == ["park", "park", "park", "wake"]
    finally:
        await runner.cleanup()


@run
async def test_a_rebound_name_is_refused_whatever_its_host():
    """Issue 36, DNS rebinding: a page on ``evil.example`` (rebound to 127.0.0.1) sends
    ``Host: evil.example:PORT`` and ``Origin: http://evil.example:PORT``; the check compared the
    two and let it park. Origin is checked against the allow-list, never against Host."""
    agent = Agent()
    routes = web.RouteTableDef()
    add_routes(routes, agent)
    app = web.Application()
    app.add_routes(routes)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    base = f"http://127.0.0.1:{port}"
    try:
        async with aiohttp.ClientSession() as s:
            for op in ("park", "wake"):
                for name in ("evil.example", "localhost.evil.example", "127.0.0.1.nip.io"):
                    own = f"{name}:{port}"
                    async with s.post(f"{base}/berth/v1/{op}", json={},
                                      headers={"Host": own, "Origin": f"http://{own}"}) as r:
                        assert r.status == 403, (op, own, await r.text())
            assert agent.done == []
            # This machine's own page still passes, whatever Host it names.
            for origin in (base, f"http://localhost:{port}"):
                async with s.post(f"{base}/berth/v1/park", json={},
                                  headers={"Origin": origin, "Host": f"other:{port}"}) as r:
                    assert r.status == 200, (origin, await r.text())
            assert agent.done == ["park", "park"]
    finally:
        await runner.cleanup()
