"""Streams and peers in one process: a client that goes away mid-stream is passed through to
the engine (directly and through a peer), and a peer that hangs is given up on within its
timeout (issue 14 "Many machines")."""

from __future__ import annotations

import asyncio
import time

import aiohttp
from aiohttp import web
from berth.client import Client
from berth.config import parse
from berth.gateway.server import Gateway

from tests.gateway.world import KEY, free_port
from tests.gateway.world import serve as _serve
from tests.helpers import ceiling


def _gateway(tmp_path, name: str, port: int, engines: dict, peers: list[int] = (),
             retry: str = "5s") -> Gateway:
    doc = {"engines": engines, "network": {"name": name}, "state_dir": str(tmp_path)}
    if peers:
        doc["network"].update(key=KEY, peers=[f"127.0.0.1:{p}" for p in peers],
                              peer_timeout="0.5s", peer_poll="0.2s", peer_retry=retry)
    return Gateway(parse(doc), f"127.0.0.1:{port}",
                   client=Client(socket=tmp_path / f"{name}-no-berthd.sock"))


async def _disconnects(tmp_path) -> None:
    gone = asyncio.Event()
    started = asyncio.Event()

    async def slow_stream(request):
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        started.set()
        try:
            for _ in range(500):
                await resp.write(b'data: {"x": 1}\n\n')
                await asyncio.sleep(0.02)
        except (ConnectionResetError, asyncio.CancelledError):
            gone.set()
            raise
        return resp

    app = web.Application(handler_args={"handler_cancellation": True})
    app.router.add_post("/v1/chat/completions", slow_stream)
    up, up_port = await _serve(app)
    pa, pb = free_port(), free_port()
    b = _gateway(tmp_path, "B", pb, {"slow": {"url": f"http://127.0.0.1:{up_port}"}}, [pa])
    a = _gateway(tmp_path, "A", pa, {}, [pb])
    await b.start()
    await a.start()
    try:
        async with aiohttp.ClientSession() as s:
            for port in (pb, pa):        # B serves it itself; A forwards it to B
                gone.clear()
                started.clear()
                r = await s.post(f"http://127.0.0.1:{port}/v1/chat/completions",
                                 json={"model": "slow", "stream": True})
                assert r.status == 200 and r.headers["X-Berth-Machine"] == "B"
                assert (await r.content.readany()).startswith(b"data:")
                r.close()                 # the client goes away mid-stream
                t0 = time.monotonic()
                await asyncio.wait_for(gone.wait(), 5)
                assert time.monotonic() - t0 < 5
    finally:
        await a.stop()
        await b.stop()
        await up.cleanup()


async def _hung_peer(tmp_path) -> None:
    hung = asyncio.Event()
    forever = asyncio.Event()

    async def engines(request):
        if hung.is_set():
            await forever.wait()
        return web.json_response({"machine": "H", "switch_costs": {}, "engines": [
            {"name": "h-model", "target": "http://127.0.0.1:9", "state": "active"}]})

    async def chat(request):
        if hung.is_set():
            await forever.wait()
        return web.json_response({"model": "h-model"})

    app = web.Application()
    app.router.add_get("/berth/v1/peer/engines", engines)
    app.router.add_post("/v1/chat/completions", chat)
    fake, fake_port = await _serve(app)
    pa = free_port()
    own, own_port = await _serve(_ok_engine())
    a = _gateway(tmp_path, "A", pa, {"mine": {"url": f"http://127.0.0.1:{own_port}"}},
                 [fake_port], retry="1s")
    await a.start()
    try:
        async with aiohttp.ClientSession() as s:
            async with s.get(f"http://127.0.0.1:{pa}/v1/models") as r:
                assert "h-model" in {e["id"] for e in (await r.json())["data"]}
            hung.set()             # the peer still accepts connections but answers nothing
            t0 = time.monotonic()
            async with s.post(f"http://127.0.0.1:{pa}/v1/chat/completions",
                              json={"model": "h-model"}) as r:
                doc = await r.json()
            took = time.monotonic() - t0
            # the peer took the request and never answered: a 504 (issue 27; it was a 503)
            assert r.status == 504 and doc["src"] == "peer" and doc["reason"] == "peer_timeout", \
                doc
            assert took < ceiling(0.5 + 0.2 + 0.5), took        # timeout + poll interval + slack
            async with s.post(f"http://127.0.0.1:{pa}/v1/chat/completions",
                              json={"model": "h-model"}) as r:     # known down now: skipped
                doc = await r.json()
                assert r.status == 503 and doc["reason"] == "peer_down", doc
            async with s.post(f"http://127.0.0.1:{pa}/v1/chat/completions",
                              json={"model": "mine"}) as r:
                assert r.status == 200
            # The peer answers again: it is asked again after peer_retry, and serves.
            hung.clear()
            end = time.monotonic() + 5
            while True:
                async with s.get(f"http://127.0.0.1:{pa}/berth/v1/gateway") as r:
                    if (await r.json())["machines"][1]["up"]:
                        break
                assert time.monotonic() < end, "the peer was not asked again"
                await asyncio.sleep(0.05)
            async with s.post(f"http://127.0.0.1:{pa}/v1/chat/completions",
                              json={"model": "h-model"}) as r:
                assert r.status == 200 and (await r.json())["model"] == "h-model"
    finally:
        forever.set()
        await a.stop()
        await fake.cleanup()
        await own.cleanup()


def _ok_engine() -> web.Application:
    async def chat(request):
        return web.json_response({"model": "mine"})
    app = web.Application()
    app.router.add_post("/v1/chat/completions", chat)
    return app


def test_a_client_gone_mid_stream_is_passed_to_the_engine_directly_and_through_a_peer(tmp_path):
    asyncio.run(_disconnects(tmp_path))


def test_a_peer_that_hangs_is_given_up_on_within_its_timeout(tmp_path):
    asyncio.run(_hung_peer(tmp_path))
