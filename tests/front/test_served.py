"""The front's count of model requests served (issue 24): every forward that is not a read by
method, by the parser's shortest way and by the connection's task alike, held ones included.
berth run reports it, so berthd learns of a request answered between two samples of the
in-flight count; a health check or a monitor's poll must not count as one."""

from __future__ import annotations

import asyncio

import aiohttp

from .conftest import Upstream, front_for, json_handler, run, until


@run
async def test_writes_count_as_served_and_reads_do_not():
    async with Upstream() as up, front_for(up) as front, aiohttp.ClientSession() as s:
        for method in ("POST", "PUT", "GET", "HEAD", "OPTIONS"):
            up.route(method, "/v1/x", json_handler({"ok": True}))
        up.route("GET", "/health", json_handler({"status": "ok"}))
        for method in ("GET", "POST", "HEAD", "GET", "OPTIONS", "PUT", "POST"):
            async with s.request(method, front.url + ("/health" if method == "GET" else "/v1/x"),
                                 json={} if method in ("POST", "PUT") else None) as r:
                assert r.status == 200, (method, r.status)
                await r.read()
        assert front.forwarded == 7 and front.served == 3, front.counters()
        assert front.counters()["served"] == 3


@run
async def test_a_held_write_counts_when_it_is_forwarded():
    async with Upstream() as up, front_for(up, state="starting") as front, \
            aiohttp.ClientSession() as s:
        up.route("POST", "/v1/completions", json_handler({"text": "hi"}))
        post = asyncio.create_task(s.post(front.url + "/v1/completions", json={"prompt": "x"}))
        await until(lambda: front.holding == 1, "the post to be held")
        assert front.served == 0
        front.open()
        async with await post as r:
            assert r.status == 200
        assert front.served == 1 and front.held == 1
