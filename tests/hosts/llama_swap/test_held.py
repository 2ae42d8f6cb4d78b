"""Progress while a request waits (issue 30): a held streaming request gets SSE keep-alive
comments, a loading state when it asks, then the engine's stream; a non-streaming one, or one held
briefly, is unchanged. And ``berth run --front-health``: the front answers llama-swap's health
check while it holds requests.

The front (:class:`berth.front.Front`) before a real aiohttp engine stand-in, on loopback.
"""

from __future__ import annotations

import asyncio
import functools
import json
import time

import aiohttp
from aiohttp import web
from berth.front import Front, held

LIMIT_S = 30.0


def run(test):
    @functools.wraps(test)
    def wrapper(*a, **kw):
        async def bounded():
            async with asyncio.timeout(LIMIT_S):
                await test(*a, **kw)
        asyncio.run(bounded())
    return wrapper


class Engine:
    """An OpenAI-style engine: a stream of three chunks, a JSON answer, or an error."""

    def __init__(self, status: int = 200):
        self.status = status
        self.app = web.Application()
        self.app.router.add_post("/v1/chat/completions", self.chat)
        self.app.router.add_get("/health", self.health)
        self.runner: web.AppRunner | None = None
        self.url = ""

    async def health(self, request):
        return web.json_response({"status": "ok", "engine": True})

    async def chat(self, request):
        body = await request.json()
        if self.status != 200:
            return web.json_response({"error": {"message": "bad model", "code": self.status}},
                                     status=self.status)
        if not body.get("stream"):
            return web.json_response({"choices": [{"message": {"content": "whole"}}]})
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        for word in ("one", "two", "three"):
            chunk = {"choices": [{"index": 0, "delta": {"content": word}}]}
            await resp.write(b"data: " + json.dumps(chunk).encode() + b"\n\n")
        await resp.write(b"data: [DONE]\n\n")
        return resp

    async def __aenter__(self):
        self.runner = web.AppRunner(self.app, access_log=None)
        await self.runner.setup()
        await web.TCPSite(self.runner, "127.0.0.1", 0).start()
        self.url = f"http://127.0.0.1:{self.runner.addresses[0][1]}"
        return self

    async def __aexit__(self, *exc):
        await self.runner.cleanup()


async def started(engine: Engine, **kw) -> Front:
    """A front in ``starting`` (it holds writes) pointed at ``engine``."""
    front = Front("127.0.0.1", 0, name="m", **kw)
    await front.start()
    front.set_upstream(engine.url)
    return front


async def post(front: Front, body: dict, headers: dict | None = None, on_line=None):
    """POST a chat; returns (status, content type, [(seconds, line)], whole body)."""
    t0 = time.monotonic()
    lines: list[tuple[float, str]] = []
    async with aiohttp.ClientSession() as s, s.post(
            front.url + "/v1/chat/completions", json=body, headers=headers or {}) as r:
        if "event-stream" not in r.headers.get("Content-Type", ""):
            return r.status, r.headers.get("Content-Type"), lines, await r.read()
        async for raw in r.content:
            line = raw.decode().rstrip("\n")
            if line:
                lines.append((time.monotonic() - t0, line))
                if on_line is not None:
                    on_line(line)
        return r.status, r.headers.get("Content-Type"), lines, b""


STREAM = {"model": "m", "messages": [], "stream": True}


def comments(lines):
    return [t for t, line in lines if line.startswith(":")]


@run
async def test_a_held_stream_gets_keep_alive_then_the_engines_events():
    async with Engine() as engine:
        front = await started(engine)
        seen = asyncio.Event()
        counts: list[str] = []

        def on_line(line):
            if line.startswith(": keep-alive"):
                counts.append(line)
                if len(counts) >= 3:
                    seen.set()
        task = asyncio.create_task(post(front, STREAM, on_line=on_line))
        await asyncio.wait_for(seen.wait(), 20)     # three keep-alives while held
        front.open()
        status, ctype, lines, _ = await task
        await front.stop()
    assert status == 200 and ctype.startswith("text/event-stream")
    ticks = comments(lines)
    assert len(ticks) >= 3
    gaps = [b - a for a, b in zip(ticks, ticks[1:], strict=False)]
    assert ticks[0] < 5.0 and max(gaps) < 5.0, (ticks, gaps)
    data = [line[6:] for _, line in lines if line.startswith("data: ")]
    words = [json.loads(d)["choices"][0]["delta"]["content"] for d in data[:-1]]
    assert words == ["one", "two", "three"] and data[-1] == "[DONE]"


@run
async def test_a_loading_state_when_asked_names_what_the_front_waits_for():
    async with Engine() as engine:
        front = await started(engine)
        front.set_cause("gpu0 is held by x (priority 9)")
        got = asyncio.Event()

        def on_line(line):
            if line.startswith("data: ") and "reasoning_content" in line:
                got.set()
        task = asyncio.create_task(post(front, STREAM, {held.LOADING_HEADER.decode(): "true"},
                                        on_line))
        await asyncio.wait_for(got.wait(), 20)
        front.open()
        status, _, lines, _ = await task
        await front.stop()
    assert status == 200
    reasoning = "".join(json.loads(line[6:])["choices"][0]["delta"].get("reasoning_content", "")
                        for _, line in lines if line.startswith("data: {"))
    assert "Berth: m is starting: gpu0 is held by x" in reasoning
    assert "ready after" in reasoning
    content = [json.loads(line[6:])["choices"][0]["delta"].get("content")
               for _, line in lines if line.startswith("data: {")]
    assert [c for c in content if c] == ["one", "two", "three"]


@run
async def test_a_held_stream_that_times_out_ends_with_an_error_event():
    async with Engine() as engine:
        front = await started(engine, wait_limit_s=2.5)
        status, _, lines, _ = await post(front, STREAM)
        await front.stop()
    assert status == 200 and comments(lines)
    last = json.loads(lines[-1][1][6:])
    assert last["src"] == "berth" and last["reason"] == "wait_limit"
    assert last["error"]["code"] == 503


@run
async def test_an_engine_error_after_a_held_stream_becomes_one_error_event():
    async with Engine(status=400) as engine:
        front = await started(engine)
        ticked = asyncio.Event()
        task = asyncio.create_task(post(front, STREAM, on_line=lambda line: ticked.set()))
        await asyncio.wait_for(ticked.wait(), 20)
        front.open()
        status, _, lines, _ = await task
        await front.stop()
    assert status == 200
    events = [json.loads(line[6:]) for _, line in lines if line.startswith("data: ")]
    assert events == [{"error": {"message": "bad model", "code": 400}, "src": "engine"}]


async def until(check, what: str, timeout_s: float = 10.0):
    end = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < end, f"timed out waiting for {what}"
        await asyncio.sleep(0.005)


@run
async def test_a_non_streaming_request_or_a_short_hold_is_unchanged():
    async with Engine() as engine:
        front = await started(engine)
        ticked = asyncio.Event()
        plain = asyncio.create_task(post(front, {"model": "m", "messages": []}))
        await until(lambda: front.holding == 1, "the plain request held")
        # a stream beside it: its first keep-alive shows the plain one was held as long
        stream = asyncio.create_task(post(front, STREAM, on_line=lambda line: ticked.set()))
        await asyncio.wait_for(ticked.wait(), 20)
        front.open()
        status, ctype, lines, body = await plain
        await stream
        assert status == 200 and ctype.startswith("application/json") and not lines
        assert json.loads(body)["choices"][0]["message"]["content"] == "whole"
        # a stream held less than FIRST_S keeps the engine's own head
        front2 = await started(engine)
        task = asyncio.create_task(post(front2, STREAM))
        await until(lambda: front2.holding == 1, "the stream held")
        front2.open()
        status, _, lines, _ = await task
        await front.stop()
        await front2.stop()
    assert status == 200 and not comments(lines)
    assert lines[-1][1] == "data: [DONE]"


@run
async def test_front_health_answers_while_holding_and_the_engine_once_open():
    async with Engine() as engine:
        front = await started(engine)
        async with aiohttp.ClientSession() as s:
            async with s.get(front.url + "/health") as r:
                assert r.status == 503              # without --front-health: a read, refused
            front.ready_path = "/health"
            async with s.get(front.url + "/health") as r:
                assert r.status == 200 and (await r.json())["src"] == "berth"
            async with s.get(front.url + "/v1/models") as r:
                assert r.status == 503              # other reads are still the front's 503
            front.open()
            async with s.get(front.url + "/health") as r:
                assert r.status == 200 and (await r.json()) == {"status": "ok", "engine": True}
            front.stopped("gone")
            async with s.get(front.url + "/health") as r:
                assert r.status == 503              # stopped: nothing is accepted
        await front.stop()
