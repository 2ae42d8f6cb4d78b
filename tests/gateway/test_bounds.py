"""Every relay is bounded (issue 27): a peer that goes silent mid-stream, one that dies, one
that never answers, a local engine that stalls; and a request a peer took but never answered
goes to another machine. A real gateway on loopback, and peers that are real aiohttp servers
misbehaving on purpose (they answer the engines poll as a gateway does)."""

from __future__ import annotations

import asyncio
import json
import time

import aiohttp
from aiohttp import web
from berth.client import Client
from berth.config import parse
from berth.gateway.server import Gateway

from tests.gateway.world import KEY, free_port
from tests.gateway.world import serve as _serve
from tests.helpers import ceiling

CHAT = {"model": "m", "stream": True, "messages": [{"role": "user", "content": "hi"}]}


class FakePeer:
    """A peer gateway serving model ``m``: its engines answer (``state``, ``read_timeout_s``),
    and a chat stream whose behaviour the test sets (``mode``: ``ok``, ``stall`` after two
    events, ``die`` after two events, ``silent``: never answers). ``hang_polls`` makes its
    engines answer hang (the peer as a whole goes silent). ``chats`` counts chats received."""

    def __init__(self, name: str, state: str = "active", read_timeout_s: float = 30.0):
        self.name, self.state, self.read_timeout_s = name, state, read_timeout_s
        self.mode = "ok"
        self.hang_polls = False
        self.chats = 0
        self.forever = asyncio.Event()
        self.runner = None
        self.port = 0

    async def start(self) -> "FakePeer":
        app = web.Application()
        app.router.add_get("/berth/v1/peer/engines", self._engines)
        app.router.add_post("/v1/chat/completions", self._chat)
        self.runner, self.port = await _serve(app)
        return self

    async def stop(self) -> None:
        self.forever.set()
        await self.runner.cleanup()

    async def _engines(self, request):
        if self.hang_polls:
            await self.forever.wait()
        return web.json_response({"machine": self.name, "switch_costs": {}, "engines": [
            {"name": "m", "target": "http://127.0.0.1:9", "state": self.state,
             "read_timeout_s": self.read_timeout_s}]})

    async def _chat(self, request):
        self.chats += 1
        await request.read()
        if self.mode == "silent":
            await self.forever.wait()
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream",
                                           "X-Berth-Machine": self.name})
        await resp.prepare(request)
        for i in range(2):
            await resp.write(b'data: {"n": %d}\n\n' % i)
        if self.mode == "stall":
            await self.forever.wait()
        elif self.mode == "die":
            request.transport.abort()            # a reset mid-stream, as a killed process
            return resp
        await resp.write(b"data: [DONE]\n\n")
        return resp


def _gateway(tmp_path, peers: list[int], engines: dict | None = None,
             timeout: str = "0.5s") -> Gateway:
    doc = {"engines": engines or {}, "network": {"name": "A"}, "state_dir": str(tmp_path)}
    if peers:
        doc["network"].update(key=KEY, peers=[f"127.0.0.1:{p}" for p in peers],
                              peer_timeout=timeout, peer_poll="0.2s", peer_retry="5s")
    return Gateway(parse(doc), f"127.0.0.1:{free_port()}",
                   client=Client(socket=tmp_path / "no-berthd.sock"))


async def _stream(port: int) -> tuple[int, list[dict | str], float, dict]:
    """A streaming chat through the gateway, read to its end: (status, events, seconds, headers).
    An answer cut short raises (aiohttp's payload error)."""
    t0 = time.monotonic()
    async with aiohttp.ClientSession() as s:
        async with s.post(f"http://127.0.0.1:{port}/v1/chat/completions", json=CHAT) as r:
            body = await r.read()
            events = []
            for line in body.decode().splitlines():
                if line.startswith("data: "):
                    data = line[len("data: "):]
                    events.append(data if data == "[DONE]" else json.loads(data))
            return r.status, events, time.monotonic() - t0, dict(r.headers)


async def _routed(port: int, model: str = "m") -> None:
    """Until the gateway on ``port`` lists ``model`` (its peer's first poll answered): on a
    loaded machine that poll can outlast the 0.5 s peer timeout, and the peer is retried 5 s
    later (a CI run at load 10 streamed at once and got a 404)."""
    end = time.monotonic() + ceiling(30.0)
    async with aiohttp.ClientSession() as s:
        while True:
            async with s.get(f"http://127.0.0.1:{port}/v1/models") as r:
                ids = [m.get("id") for m in (await r.json()).get("data", [])]
            if model in ids:
                return
            assert time.monotonic() < end, f"the gateway never listed {model!r}: {ids}"
            await asyncio.sleep(0.05)


async def _peers_up(port: int, n: int) -> None:
    """Until the gateway on ``port`` counts ``n`` peers up in its ``/health``."""
    async with aiohttp.ClientSession() as s:
        async def up():
            async with s.get(f"http://127.0.0.1:{port}/health") as r:
                return (await r.json())["peers_up"] == n
        end = time.monotonic() + ceiling(30.0)
        while not await up():
            assert time.monotonic() < end, f"the gateway never counted {n} peers up"
            await asyncio.sleep(0.05)


async def _until(check, what: str) -> None:
    end = time.monotonic() + ceiling(30.0)
    while not check():
        assert time.monotonic() < end, f"waited for {what}"
        await asyncio.sleep(0.01)


def _run(coro, limit_s: float = 30.0):
    async def bounded():
        # A bound on a hung scenario, scaled as its waits are (the peer's first poll may be
        # retried once, 5 s later, on a loaded machine).
        async with asyncio.timeout(ceiling(limit_s) + 10):
            await coro
    asyncio.run(bounded())


def test_a_peer_stalled_mid_stream_ends_the_stream_with_an_error_event(tmp_path):
    async def scenario():
        peer = await FakePeer("H", read_timeout_s=1.0).start()
        peer.mode = "stall"
        gw = _gateway(tmp_path, [peer.port])
        await gw.start()
        try:
            await _routed(gw.port)
            code, events, took, _ = await _stream(gw.port)
            # the peer's gap (1 s, its own read_timeout) plus the peer timeout (0.5 s)
            assert code == 200 and events[:2] == [{"n": 0}, {"n": 1}], events
            err = events[2]
            assert err["error"]["code"] == 504 and err["reason"] == "upstream_stalled", err
            assert err["src"] == "peer" and events[3] == "[DONE]" and len(events) == 4
            assert 1.4 <= took < ceiling(5.0), took
            assert gw.relays.gap_timeouts == 1 and not gw.relays.live
        finally:
            await gw.stop()
            await peer.stop()
    _run(scenario())


def test_a_peer_that_dies_mid_stream_ends_the_stream_at_once_with_an_error_event(tmp_path):
    async def scenario():
        peer = await FakePeer("H").start()
        peer.mode = "die"
        gw = _gateway(tmp_path, [peer.port])
        await gw.start()
        try:
            await _routed(gw.port)
            code, events, took, _ = await _stream(gw.port)
            assert code == 200 and events[:2] == [{"n": 0}, {"n": 1}], events
            assert events[2]["reason"] == "upstream_cut" and events[3] == "[DONE]", events
            assert took < ceiling(2.0), took
        finally:
            await gw.stop()
            await peer.stop()
    _run(scenario())


def test_a_peer_marked_down_ends_its_relays_at_once(tmp_path):
    async def scenario():
        peer = await FakePeer("H", read_timeout_s=60.0).start()   # the gap would take 60 s
        peer.mode = "stall"
        gw = _gateway(tmp_path, [peer.port])
        await gw.start()
        try:
            await _routed(gw.port)
            task = asyncio.ensure_future(_stream(gw.port))
            end = time.monotonic() + 5
            while not gw.relays.live:
                assert time.monotonic() < end
                await asyncio.sleep(0.01)
            peer.hang_polls = True         # the peer goes silent: its next poll times out
            code, events, took, _ = await task
            assert code == 200 and events[2]["reason"] == "peer_down", events
            assert events[3] == "[DONE]" and took < 3.0, took
        finally:
            await gw.stop()
            await peer.stop()
    _run(scenario())


def test_a_silent_peer_gives_a_504_within_its_timeout_and_a_request_it_took_goes_elsewhere(
        tmp_path):
    async def scenario():
        silent = await FakePeer("H1", state="active").start()
        other = await FakePeer("H2", state="parked").start()    # ranked after H1
        silent.mode = "silent"
        gw = _gateway(tmp_path, [silent.port, other.port])
        await gw.start()
        try:
            # Both peers' first polls answered (at load 15 both outlasted the 0.5 s peer
            # timeout: no machine served m, a 404); then H1 takes the request and only then
            # goes silent as a whole, so the request is surely one H1 took.
            await _peers_up(gw.port, 2)
            t0 = time.monotonic()
            stream = asyncio.ensure_future(_stream(gw.port))
            await _until(lambda: silent.chats == 1 or stream.done(), "H1 to take the request")
            silent.hang_polls = True       # accepts the request, then answers nothing at all
            code, events, _, headers = await stream
            took = time.monotonic() - t0
            # H1 took it and went down before a byte: the request went to H2
            assert code == 200 and headers["X-Berth-Machine"] == "H2", (code, events)
            assert silent.chats == 1 and other.chats == 1
            assert took < ceiling(0.5 + 0.2 + 1.0), took       # timeout + poll + slack
            await other.stop()
            other.forever = asyncio.Event()
            # Now H2 is gone too and H1 was down: no machine left
            async with aiohttp.ClientSession() as s:
                async with s.post(f"http://127.0.0.1:{gw.port}/v1/chat/completions",
                                  json=CHAT) as r:
                    doc = await r.json()
            assert r.status == 503 and doc["reason"] == "peer_down", doc
        finally:
            await gw.stop()
            await silent.stop()
    _run(scenario())


def test_a_silent_peer_alone_gives_a_504_within_the_peer_timeout(tmp_path):
    async def scenario():
        silent = await FakePeer("H").start()
        silent.mode = "silent"
        gw = _gateway(tmp_path, [silent.port], timeout="1s")
        await gw.start()
        try:
            await _peers_up(gw.port, 1)    # its first poll answered (see the test above)
            silent.hang_polls = True
            t0 = time.monotonic()
            async with aiohttp.ClientSession() as s:
                async with s.post(f"http://127.0.0.1:{gw.port}/v1/chat/completions",
                                  json=CHAT) as r:
                    doc = await r.json()
            took = time.monotonic() - t0
            assert r.status == 504 and doc["reason"] == "peer_timeout" and doc["src"] == "peer"
            assert took < ceiling(1.0 + 0.2 + 1.0), took      # the peer timeout + a poll + slack
        finally:
            await gw.stop()
            await silent.stop()
    _run(scenario())


def test_a_local_engine_that_stalls_mid_stream_is_ended_at_its_read_timeout(tmp_path):
    async def scenario():
        forever = asyncio.Event()

        async def chat(request):
            resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
            await resp.prepare(request)
            await resp.write(b'data: {"n": 0}\n\n')
            await forever.wait()
            return resp
        app = web.Application()
        app.router.add_post("/v1/chat/completions", chat)
        engine, port = await _serve(app)
        gw = _gateway(tmp_path, [], {"m": {"url": f"http://127.0.0.1:{port}",
                                           "read_timeout": "1s"}})
        await gw.start()
        try:
            code, events, took, headers = await _stream(gw.port)
            assert code == 200 and headers["X-Berth-Machine"] == "A"
            assert events[0] == {"n": 0} and events[1]["reason"] == "upstream_stalled"
            assert events[1]["src"] == "berth" and events[2] == "[DONE]", events
            assert 0.9 <= took < 4.0, took
        finally:
            forever.set()
            await gw.stop()
            await engine.cleanup()
    _run(scenario())


def test_the_default_gap_is_30s_and_an_entry_may_change_it():
    assert parse({"engines": {"x": {"url": "http://h:1"}}}).engines["x"].read_timeout == 30.0
    assert parse({"engines": {"x": {"url": "http://h:1", "read_timeout": "2m"}}}) \
        .engines["x"].read_timeout == 120.0
