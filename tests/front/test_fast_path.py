"""The open state's request path at the byte level (issue 17): raw sockets on both sides where a
client library would hide what crosses the wire. Chunked bodies, pipelining, a client that leaves
mid-stream, an engine that closes kept-alive connections, a request that arrives while the front
starts closing, and the answers the front gives itself."""

from __future__ import annotations

import asyncio
import contextlib
import json
from typing import AsyncIterator, Awaitable, Callable

import aiohttp
import httptools
import pytest
from aiohttp import web
from berth.front import Front, FrontState

from .conftest import Upstream, front_for, json_handler, run, until

F = FrontState


class Answers:
    """Reads whole HTTP answers from a raw connection: ``(status, headers, body)`` each."""

    def __init__(self, reader: asyncio.StreamReader):
        self.reader = reader
        self.parser = httptools.HttpResponseParser(self)
        self.done: list[tuple[int, dict[str, str], bytes]] = []
        self._headers: dict[str, str] = {}
        self._body: list[bytes] = []

    def on_header(self, name: bytes, value: bytes) -> None:
        self._headers[name.decode().lower()] = value.decode()

    def on_body(self, body: bytes) -> None:
        self._body.append(body)

    def on_message_complete(self) -> None:
        self.done.append((self.parser.get_status_code(), self._headers, b"".join(self._body)))
        self._headers, self._body = {}, []

    async def next(self) -> tuple[int, dict[str, str], bytes]:
        while not self.done:
            data = await self.reader.read(65536)
            assert data, "the front closed the connection before a whole answer"
            self.parser.feed_data(data)
        return self.done.pop(0)


@contextlib.asynccontextmanager
async def raw(url: str) -> AsyncIterator[tuple[asyncio.StreamWriter, Answers]]:
    host, port = url.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    try:
        yield writer, Answers(reader)
    finally:
        writer.close()


@run
async def test_chunked_body_and_pipelined_requests_keep_their_order():
    async def echo(request: web.Request) -> web.Response:
        return web.json_response({"body": (await request.read()).decode(),
                                  "te": request.headers.get("Transfer-Encoding")})

    async with Upstream() as up, front_for(up) as front, raw(front.url) as (w, answers):
        up.route("POST", "/echo", echo)
        up.route("GET", "/who", json_handler({"who": "engine"}))
        w.write(b"POST /echo HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
                b"5;ext=1\r\nhello\r\n6\r\n world\r\n0\r\nX-Trailer: t\r\n\r\n"
                b"GET /who HTTP/1.1\r\nHost: x\r\n\r\n")   # the second one pipelined
        status, headers, body = await answers.next()
        assert status == 200 and body == b'{"body": "hello world", "te": "chunked"}'
        status, _, body = await answers.next()
        assert status == 200 and body == b'{"who": "engine"}'
        assert [s[0] for s in up.seen] == ["POST", "GET"]
        assert front.forwarded == 2 and front.in_flight == 0


@run
async def test_engine_connections_are_kept_alive_and_reused():
    peers: list[object] = []

    async def who(request: web.Request) -> web.Response:
        peers.append(request.transport.get_extra_info("peername"))   # the front's side
        return web.json_response({})

    async with Upstream() as up, front_for(up) as front, aiohttp.ClientSession() as s:
        up.route("GET", "/who", who)
        for _ in range(5):
            async with s.get(front.url + "/who") as r:
                assert r.status == 200
        assert len(peers) == 5 and len(set(peers)) == 1


async def one_shot_engine(on_request: Callable[[int, int], Awaitable[bytes | None]]
                          ) -> tuple[asyncio.Server, str, list[int]]:
    """A raw engine: ``on_request(connection number, request number on it)`` returns the answer
    to send, or None to close the connection without one. Returns the server, its URL and the
    connection number of every request seen."""
    seen: list[int] = []
    count = 0

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal count
        count += 1
        me, n = count, 0
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = next((int(line.split(b":")[1]) for line in head.split(b"\r\n")
                               if line.lower().startswith(b"content-length:")), 0)
                await reader.readexactly(length)
                n += 1
                seen.append(me)
                answer = await on_request(me, n)
                if answer is None:
                    return
                writer.write(answer)
                await writer.drain()
                if b"Connection: close" in answer:
                    return
        except (asyncio.IncompleteReadError, ConnectionError):
            return
        finally:
            writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    return server, f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}", seen


OK = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}"


@run
async def test_an_engine_that_closes_a_kept_alive_connection_is_retried_once():
    async def answer(conn: int, n: int) -> bytes | None:
        return OK if n == 1 else None   # the second request on a connection: closed unanswered

    server, url, seen = await one_shot_engine(answer)
    async with server, front_for(None, state="starting") as front, aiohttp.ClientSession() as s:
        front.set_upstream(url)
        front.open()
        for _ in range(3):
            async with s.post(front.url + "/v1/completions", data=b"{}") as r:
                assert r.status == 200 and await r.read() == b"{}"
        # each request after the first went out on the kept connection, found it closed, and
        # went again on a new one
        assert seen == [1, 1, 2, 2, 3]
        assert front.errors == 0


@run
async def test_an_engine_that_says_close_gets_a_new_connection():
    async def answer(conn: int, n: int) -> bytes | None:
        return OK.replace(b"Content-Length", b"Connection: close\r\nContent-Length")

    server, url, seen = await one_shot_engine(answer)
    async with server, front_for(None, state="starting") as front, aiohttp.ClientSession() as s:
        front.set_upstream(url)
        front.open()
        for _ in range(3):
            async with s.post(front.url + "/x", data=b"{}") as r:
                assert r.status == 200 and "Connection" not in r.headers
        assert seen == [1, 2, 3]


@run
async def test_a_new_connection_closed_unanswered_is_a_502_not_a_retry():
    async def answer(conn: int, n: int) -> bytes | None:
        return None

    server, url, seen = await one_shot_engine(answer)
    async with server, front_for(None, state="starting") as front, aiohttp.ClientSession() as s:
        front.set_upstream(url)
        front.open()
        async with s.post(front.url + "/v1/completions", data=b"{}") as r:
            assert r.status == 502
            body = await r.json()
        assert body["src"] == "berth" and body["reason"] == "engine_failed"
        assert seen == [1] and front.errors == 1


@run
async def test_close_delimited_answer_is_chunked_to_the_client():
    async def answer(conn: int, n: int) -> bytes | None:
        return b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nConnection: close\r\n\r\nall of it"

    server, url, _ = await one_shot_engine(answer)
    async with server, front_for(None, state="starting") as front, raw(front.url) as (w, answers):
        front.set_upstream(url)
        front.open()
        for _ in range(2):   # the client's connection survives the engine's close
            w.write(b"GET /x HTTP/1.1\r\nHost: x\r\n\r\n")
            status, headers, body = await answers.next()
            assert status == 200 and body == b"all of it"
            assert headers["transfer-encoding"] == "chunked"


WAYS = pytest.mark.parametrize("way", ["task", "fast"])


async def warm(front: Front, up: Upstream, way: str) -> None:
    """For ``way == "fast"``, leave an idle engine connection in the front's pool, so the next
    request takes the task-free way (berth.front.fast); "task": leave none."""
    if way == "fast":
        up.route("GET", "/warm", json_handler())
        async with aiohttp.ClientSession() as s, s.get(front.url + "/warm") as r:
            assert r.status == 200


def went(front: Front) -> str:
    """Which way the request in flight took."""
    return "fast" if any(c.exchange is not None for c in front._conns) else "task"


@WAYS
def test_client_that_leaves_mid_stream_frees_the_engine_connection(way: str):
    @run
    async def scenario():
        async with Upstream() as up, front_for(up) as front:
            await warm(front, up, way)
            up.route("POST", "/v1/chat/completions", _endless(up))
            async with raw(front.url) as (w, answers):
                w.write(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n"
                        b"Content-Length: 2\r\n\r\n{}")
                first = await answers.reader.readuntil(b"data: first\n\n")
                assert b"200 OK" in first and went(front) == way
            async with asyncio.timeout(5):
                await up.gone_event.wait()
            await until(lambda: front.in_flight == 0, "the forward to end")
            assert front.client_gone == 1 and front.errors == 0
            # the engine connection was closed, not pooled: the next request gets a fresh one
            up.route("GET", "/ok", json_handler())
            async with aiohttp.ClientSession() as s, s.get(front.url + "/ok") as r:
                assert r.status == 200
    scenario()


@WAYS
def test_engine_that_dies_mid_stream_cuts_the_clients_answer(way: str):
    @run
    async def scenario():
        async def dies(request: web.Request) -> web.StreamResponse:
            resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
            await resp.prepare(request)
            await resp.write(b"data: one\n\n")
            await up.release.wait()
            assert request.transport is not None
            request.transport.abort()
            return resp

        async with Upstream() as up, front_for(up) as front, aiohttp.ClientSession() as s:
            await warm(front, up, way)
            up.route("POST", "/v1/chat/completions", dies)
            async with s.post(front.url + "/v1/chat/completions", json={}) as r:
                assert await r.content.readuntil(b"\n\n") == b"data: one\n\n"
                assert went(front) == way
                up.release.set()
                with pytest.raises(aiohttp.ClientPayloadError):
                    await r.read()
            await until(lambda: front.in_flight == 0, "the forward to end")
            assert front.errors == 1 and front.client_gone == 0
    scenario()


def _endless(up: Upstream) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
    async def handler(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        await resp.write(b"data: first\n\n")
        await up.release.wait()   # only a cancellation ends this
        return resp
    return handler


@run
async def test_a_request_arriving_while_the_front_starts_closing_is_held_not_lost():
    async with Upstream() as up, front_for(up) as front, raw(front.url) as (w, answers):
        up.route("POST", "/v1/completions", json_handler({"text": "late"}))
        # half a request is on the wire while the park begins
        w.write(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n")
        await w.drain()
        assert await front.close_and_drain(1.0) is True
        assert front.state is F.CLOSING
        w.write(b"Content-Length: 2\r\n\r\n{}")
        await until(lambda: front.holding == 1, "the request to be held")
        assert up.seen == []
        front.open()   # the park was called off
        status, _, body = await answers.next()
        assert status == 200 and body == b'{"text": "late"}'
        assert front.held == 1 and front.forwarded == 1


@WAYS
def test_a_request_forwarded_just_before_closing_is_drained(way: str):
    @run
    async def scenario():
        gate = asyncio.Event()

        async def slow(request: web.Request) -> web.Response:
            await gate.wait()
            return web.json_response({"done": True})

        async with Upstream() as up, front_for(up) as front, raw(front.url) as (w, answers):
            await warm(front, up, way)
            up.route("POST", "/v1/completions", slow)
            w.write(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}")
            await until(lambda: up.seen and up.seen[-1][1] == "/v1/completions", "the request "
                        "to reach the engine")
            assert went(front) == way and front.in_flight == 1
            drain = asyncio.create_task(front.close_and_drain(5.0))
            await until(lambda: front.state is F.CLOSING, "closing")
            assert not drain.done()
            gate.set()
            assert await drain is True
            status, _, body = await answers.next()
            assert status == 200 and body == b'{"done": true}'
    scenario()


@run
async def test_malformed_requests_get_a_400_in_openai_shape():
    async with Upstream() as up, front_for(up) as front, raw(front.url) as (w, answers):
        w.write(b"POST /x HTTP/1.1\r\nContent-Length: nope\r\n\r\n")
        status, headers, body = await answers.next()
        assert status == 400 and b'"src": "berth"' in body and b'"code": 400' in body
        assert headers["connection"] == "close" and up.seen == []
    async with Upstream() as up, front_for(up) as front, raw(front.url) as (w, answers):
        w.write(b"GET / HTTP/1.1\r\nX-Big: " + b"a" * (2 << 20) + b"\r\n\r\n")
        status, headers, body = await answers.next()   # not lost to a reset
        assert status == 431 and b'"reason": "headers_too_large"' in body and up.seen == []


_CHUNKED = b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"


@run
async def test_a_malformed_chunked_body_is_a_400_held_or_forwarded_and_wakes_nothing():
    # The body streams from its head on, so the request is under way (held, or its head at the
    # engine) when the bad chunk comes: that used to close the connection with no answer.
    wakes: list[int] = []

    async def on_wake() -> None:
        wakes.append(1)

    async with Upstream() as up, front_for(up, state="asleep", on_wake=on_wake) as front, \
            raw(front.url) as (w, answers):
        w.write(_CHUNKED + b"5\r\nhello\r\n")
        await until(lambda: front.holding == 1, "the chunked write held")
        w.write(b"5\r\nworldXX")                       # no CRLF after the chunk's data
        status, headers, body = await answers.next()
        assert status == 400 and b'"reason": "malformed_body"' in body, body
        assert b"malformed chunked request body" in body and headers["connection"] == "close"
        assert wakes == [] and front.state is F.ASLEEP and up.seen == []
        await until(lambda: front.holding == 0, "the refused write no longer held")
    async with Upstream() as up, front_for(up) as front, raw(front.url) as (w, answers):
        up.route("POST", "/v1/chat/completions", json_handler())
        w.write(_CHUNKED + b"5\r\nhello\r\n")
        await until(lambda: front.in_flight == 1, "the chunked write forwarded")
        w.write(b"zz\r\n")                               # a chunk size that is not hex
        status, headers, body = await answers.next()
        assert status == 400 and b"Invalid character in chunk size" in body, body
        await until(lambda: front.in_flight == 0, "the forward ended")
        assert up.seen == []        # the engine's connection closed before the body ended


@run
async def test_http10_client_gets_a_whole_answer_then_close():
    async with Upstream() as up, front_for(up) as front, raw(front.url) as (w, answers):
        up.route("POST", "/v1/chat/completions", _sse3())
        w.write(b"POST /v1/chat/completions HTTP/1.0\r\nContent-Length: 2\r\n\r\n{}")
        data = await answers.reader.read()   # to the close
        head, _, body = data.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 200") and b"Connection: close" in head
        assert b"chunked" not in head.lower() and body == b"data: a\n\ndata: b\n\ndata: c\n\n"


def _sse3() -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
    async def handler(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        for t in (b"a", b"b", b"c"):
            await resp.write(b"data: " + t + b"\n\n")
        return resp
    return handler


@run
async def test_a_slow_client_pauses_the_engine_and_the_connections_recover():
    total, piece = 32 << 20, b"x" * 65536
    written = [0]

    async def big(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "application/octet-stream"})
        await resp.prepare(request)
        while written[0] < total:
            await resp.write(piece)
            written[0] += len(piece)
        return resp

    async with Upstream() as up, front_for(up) as front, raw(front.url) as (w, answers):
        up.route("GET", "/big", big)
        up.route("GET", "/ok", json_handler())
        w.write(b"GET /big HTTP/1.1\r\nHost: x\r\n\r\n")
        # the client reads nothing: the front stops reading from the engine, whose writes wait
        await until(lambda: any(c.writing_paused for c in front._conns), "the client to fill up")
        engine = next(c.feeding for c in front._conns if c.feeding is not None)
        await until(lambda: not engine.is_reading(), "the front to stop reading the engine")
        assert written[0] < total
        status, _, body = await answers.next()
        assert status == 200 and len(body) == total
        w.write(b"GET /ok HTTP/1.1\r\nHost: x\r\n\r\n")   # same client, pooled engine connection
        status, _, _ = await answers.next()
        assert status == 200 and front.in_flight == 0


@pytest.mark.parametrize("value", ["abc", "-5", "nan"])
@WAYS
def test_a_malformed_berth_deadline_is_a_400_on_either_way(way: str, value: str):
    """With an idle engine connection in the pool, a request whose body came with its head took
    the task-free way, which never looked at ``X-Berth-Deadline``: ``abc`` went to the engine,
    where the task's way answers 400 (a new user's report). Both ways answer the 400 naming the
    header and the value, send nothing to the engine, and the connection goes on serving."""
    @run
    async def scenario():
        async with Upstream() as up, front_for(up) as front:
            await warm(front, up, way)
            up.route("POST", "/v1/completions", json_handler({"ok": True}))
            async with raw(front.url) as (w, answers):
                w.write(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nX-Berth-Deadline: "
                        + value.encode() + b"\r\nContent-Length: 2\r\n\r\n{}")
                status, _, body = await answers.next()
                assert status == 400, (status, body)
                text = json.loads(body)["error"]["message"]
                assert "X-Berth-Deadline" in text and repr(value) in text, text
                assert [s for s in up.seen if s[1] == "/v1/completions"] == []
                w.write(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nX-Berth-Deadline: 30"
                        b"\r\nContent-Length: 2\r\n\r\n{}")
                status, _, body = await answers.next()
                assert status == 200 and json.loads(body) == {"ok": True}
            assert front.state is F.OPEN and front.errors == 0
    scenario()
