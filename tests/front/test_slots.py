"""``max_in_flight``: the front forwards at most the engine's parallel slots; the rest wait in
the front, so a park waits only for what the engine runs (the backlog can be held)."""

from __future__ import annotations

import asyncio

import aiohttp
from aiohttp import web
from berth.front import FrontState

from tests.front.conftest import Upstream, front_for, run, until


@run
async def test_a_write_beyond_the_slots_waits_in_the_front_and_a_park_holds_it():
    up = Upstream()
    started, finish = [], asyncio.Event()

    async def job(request: web.Request) -> web.Response:
        started.append(await request.text())
        await finish.wait()
        return web.json_response({"ok": True})
    up.route("POST", "/prompt", job)
    async with up, front_for(up, name="comfy", wait_limit_s=5.0, max_in_flight=1) as front, \
        aiohttp.ClientSession() as http:
        url = front.url + "/prompt"
        first = asyncio.create_task(http.post(url, data="one"))
        await until(lambda: started == ["one"], "the first job to reach the engine")
        second = asyncio.create_task(http.post(url, data="two"))
        await until(lambda: front.holding == 1, "the second job to wait in the front")
        assert started == ["one"]                  # the engine never saw it
        drain = asyncio.create_task(front.close_and_drain(5.0))
        await until(lambda: front.state is FrontState.CLOSING, "closing")
        finish.set()
        assert await drain                         # only the running job had to finish
        assert (await first).status == 200
        front.sleep()
        assert started == ["one"] and front.holding == 1   # the backlog stays held
        front.open()
        r = await second
        assert r.status == 200 and started == ["one", "two"]


@run
async def test_reads_are_not_gated_by_the_slots():
    up = Upstream()
    gate = asyncio.Event()

    async def slow(request: web.Request) -> web.Response:
        await gate.wait()
        return web.json_response({})

    async def health(request: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})
    up.route("POST", "/v1/chat/completions", slow)
    up.route("GET", "/health", health)
    async with up, front_for(up, wait_limit_s=5.0, max_in_flight=1) as front, \
        aiohttp.ClientSession() as http:
        busy = asyncio.create_task(http.post(front.url + "/v1/chat/completions", json={}))
        await until(lambda: front.in_flight == 1, "one write in flight")
        async with http.get(front.url + "/health") as r:
            assert r.status == 200
        gate.set()
        assert (await busy).status == 200
