"""``max_in_flight``: the front forwards at most the engine's parallel slots; the rest wait in
the front, so a park waits only for what the engine runs (the backlog can be held)."""

from __future__ import annotations

import asyncio
import json
import re
import time

import aiohttp
import pytest
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


class _RawEngine:
    """An engine whose answers the test writes itself, at the moment it chooses: each request's
    body goes to ``bodies`` and ``(body, writer, answered)`` to ``waiting``."""

    def __init__(self) -> None:
        self.bodies: list[bytes] = []
        self.waiting: asyncio.Queue = asyncio.Queue()
        self.url = ""

    async def __aenter__(self) -> "_RawEngine":
        self.server = await asyncio.start_server(self._conn, "127.0.0.1", 0)
        self.url = f"http://127.0.0.1:{self.server.sockets[0].getsockname()[1]}"
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.server.close()

    async def _conn(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                m = re.search(rb"(?i)\r\ncontent-length: *(\d+)", head)
                body = await reader.readexactly(int(m.group(1)) if m else 0)
                self.bodies.append(body)
                answered = asyncio.Event()
                await self.waiting.put((body, writer, answered))
                await answered.wait()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()


def _answer(writer: asyncio.StreamWriter, answered: asyncio.Event) -> None:
    writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
    answered.set()


@run
async def test_a_freed_slot_goes_to_the_oldest_held_write_not_to_a_newcomer():
    """Issue 34: held writes go in arrival order. The engine's answer to the running write and a
    new client's write reach the front in the same turn of its loop: the slot that frees is the
    held write's. Before, the newcomer took it from the fast path (a kept-alive engine
    connection was idle and the count was below the slots), and the held write waited again."""
    async with _RawEngine() as engine, front_for(engine, max_in_flight=1) as front, \
            aiohttp.ClientSession() as http:
        url = front.url + "/v1/completions"
        first = asyncio.create_task(http.post(url, data="one"))
        body, w1, a1 = await asyncio.wait_for(engine.waiting.get(), 10)
        assert body == b"one"
        second = asyncio.create_task(http.post(url, data="two"))
        await until(lambda: front.holding == 1, "the second write held")
        reader, writer = await asyncio.open_connection(front.host, front.port)
        # Both in one step: the engine's answer first, then the newcomer's request.
        _answer(w1, a1)
        writer.write(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nthree")
        body, w2, a2 = await asyncio.wait_for(engine.waiting.get(), 10)
        assert body == b"two", engine.bodies
        _answer(w2, a2)
        body, w3, a3 = await asyncio.wait_for(engine.waiting.get(), 10)
        assert body == b"three"
        _answer(w3, a3)
        assert (await first).status == 200 and (await second).status == 200
        assert (await reader.readuntil(b"\r\n\r\n")).startswith(b"HTTP/1.1 200")
        writer.close()


@run
async def test_held_writes_go_in_arrival_order_after_a_park():
    """The backlog held across a park goes to the engine in the order it arrived, one slot at
    a time."""
    async with _RawEngine() as engine, front_for(engine, max_in_flight=1) as front, \
            aiohttp.ClientSession() as http:
        url = front.url + "/v1/completions"
        sent = [asyncio.create_task(http.post(url, data="w0"))]
        body, w, a = await asyncio.wait_for(engine.waiting.get(), 10)
        for i in range(1, 5):
            sent.append(asyncio.create_task(http.post(url, data=f"w{i}")))
            await until(lambda i=i: front.holding == i, f"write {i} held")
        drain = asyncio.create_task(front.close_and_drain(5.0))
        await until(lambda: front.state is FrontState.CLOSING, "closing")
        _answer(w, a)
        assert await drain
        front.sleep()
        assert front.holding == 4 and engine.bodies == [b"w0"]
        front.open()
        for i in range(1, 5):
            body, w, a = await asyncio.wait_for(engine.waiting.get(), 10)
            assert body == f"w{i}".encode() and front.in_flight == 1, (i, engine.bodies)
            _answer(w, a)
        assert [(await t).status for t in sent] == [200] * 5


@run
async def test_a_raised_limit_lets_held_writes_go_at_once():
    """``set_max_in_flight`` (the run measures the engine's slots after its start): writes held
    under the old limit go as soon as the new one leaves them room."""
    async with _RawEngine() as engine, front_for(engine, max_in_flight=1) as front, \
            aiohttp.ClientSession() as http:
        url = front.url + "/v1/completions"
        tasks = [asyncio.create_task(http.post(url, data="a"))]
        got = [await asyncio.wait_for(engine.waiting.get(), 10)]
        tasks += [asyncio.create_task(http.post(url, data=d)) for d in ("b", "c")]
        await until(lambda: front.holding == 2, "two writes held")
        front.set_max_in_flight(3)
        got += [await asyncio.wait_for(engine.waiting.get(), 10) for _ in range(2)]
        assert front.in_flight == 3 and front.holding == 0
        for _, w, a in got:
            _answer(w, a)
        assert [(await t).status for t in tasks] == [200] * 3
        with pytest.raises(ValueError, match="max_in_flight must be at least 1, got 0"):
            front.set_max_in_flight(0)


@run
async def test_a_stream_held_for_a_slot_says_it_waits_for_one():
    """A streaming request held past the slots gets the held stream's keep-alive, and its
    loading state says what it waits for: a slot, not a wake (it said "is open")."""
    async with _RawEngine() as engine, front_for(engine, max_in_flight=1) as front, \
            aiohttp.ClientSession() as http:
        busy = asyncio.create_task(http.post(front.url + "/v1/completions", data="one"))
        _, w1, a1 = await asyncio.wait_for(engine.waiting.get(), 10)
        async with http.post(front.url + "/v1/chat/completions",
                             json={"model": "m", "stream": True, "messages": []},
                             headers={"X-Berth-Loading-State": "true"}) as r:
            assert r.status == 200 and r.headers["X-Berth-Held"] == "true"
            said = ""
            async for raw in r.content:
                line = raw.decode()
                if line.startswith("data: ") and "reasoning_content" in line:
                    said = json.loads(line[6:])["choices"][0]["delta"]["reasoning_content"]
                    break
            assert "runs 1 request at once (its slots); this one waits for a slot" in said, said
            _answer(w1, a1)
            _, w2, a2 = await asyncio.wait_for(engine.waiting.get(), 10)
            done = b"data: [DONE]\n\n"
            w2.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                     b"Content-Length: %d\r\n\r\n%s" % (len(done), done))
            a2.set()
            assert b"data: [DONE]" in await r.content.read()
        assert (await busy).status == 200


@run
async def test_a_fenced_close_forwards_the_older_held_writes_and_holds_the_newer():
    """Issue 34, the fence: a one-slot engine runs "one"; "two" is held, then the waiter asks
    (the fence), then "three" is held. The fenced close forwards "two" when "one" ends (it is
    older than the waiter's request), and closes the instant "two" ends, so "three" stays held
    and the drain waited for "one" and "two" only. Before, a park closed at once ("two" waited
    across it) or, decided once the older writes ended, waited for "three" too."""
    async with _RawEngine() as engine, front_for(engine, max_in_flight=1) as front, \
            aiohttp.ClientSession() as http:
        url = front.url + "/v1/completions"
        first = asyncio.create_task(http.post(url, data="one"))
        _, w1, a1 = await asyncio.wait_for(engine.waiting.get(), 10)
        second = asyncio.create_task(http.post(url, data="two"))
        await until(lambda: front.holding == 1, "two held for the slot")
        fence = time.monotonic()                    # the waiter asks now
        held_at = front.oldest_held_at
        assert held_at is not None and held_at < fence
        third = asyncio.create_task(http.post(url, data="three"))
        await until(lambda: front.holding == 2, "three held for the slot")
        drain = asyncio.create_task(front.close_and_drain(10.0, "a park", fence_at=fence))
        await asyncio.sleep(0)
        assert front.state is FrontState.OPEN      # "one" and "two" are older than the fence
        _answer(w1, a1)
        body, w2, a2 = await asyncio.wait_for(engine.waiting.get(), 10)
        assert body == b"two" and front.state is FrontState.OPEN and not drain.done()
        _answer(w2, a2)
        assert await asyncio.wait_for(drain, 10)
        assert front.state is FrontState.CLOSING and front.holding == 1
        assert engine.bodies == [b"one", b"two"]   # "three" never reached the engine
        assert (await first).status == 200 and (await second).status == 200
        front.open()
        _, w3, a3 = await asyncio.wait_for(engine.waiting.get(), 10)
        _answer(w3, a3)
        assert (await third).status == 200 and engine.bodies[-1] == b"three"
