"""The front while open: bodies, streams, headers and failures pass through as they should."""

from __future__ import annotations

import asyncio
import io
import json
import logging

import aiohttp
import pytest
from aiohttp import web
from berth.front import Front
from yarl import URL

from tests.helpers import openai

from .conftest import Upstream, free_port, front_for, json_handler, run, sse_handler, until


@run
async def test_forwards_json_request_and_answer_unchanged():
    async def created(request: web.Request) -> web.Response:
        body = await request.json()
        return web.json_response({"echo": body, "ct": request.headers.get("Content-Type")},
                                 status=201, headers={"X-Engine": "stub"})

    async with Upstream() as up, front_for(up) as front, aiohttp.ClientSession() as s:
        up.route("POST", "/v1/chat/completions", created)
        payload = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
        url = URL(front.url + "/v1/chat/completions?x=1&y=%2F%20", encoded=True)
        async with s.post(url, json=payload) as r:
            assert r.status == 201
            assert r.headers["X-Engine"] == "stub"
            assert r.headers["Content-Type"].startswith("application/json")
            got = await r.json()
        assert got == {"echo": payload, "ct": "application/json"}
        method, path_qs, headers, body = up.seen[0]
        assert (method, path_qs) == ("POST", "/v1/chat/completions?x=1&y=%2F%20")
        assert json.loads(body) == payload
        assert headers["Content-Type"] == "application/json"
        assert front.forwarded == 1 and front.in_flight == 0 and front.errors == 0


@run
async def test_sse_stream_arrives_chunk_by_chunk():
    async with Upstream() as up, front_for(up) as front, aiohttp.ClientSession() as s:
        up.route("POST", "/v1/chat/completions", sse_handler(up, n=4))
        async with s.post(front.url + "/v1/chat/completions", json={"stream": True}) as r:
            assert r.status == 200
            assert r.headers["Content-Type"] == "text/event-stream"
            first = await r.content.readuntil(b"\n\n")
            # the upstream is still waiting for us: chunk 1 was not buffered behind the rest
            assert not up.release.is_set()
            assert b'"t0 "' in first
            up.release.set()
            rest = await r.read()
        assert rest.endswith(b"data: [DONE]\n\n") and rest.count(b"data: ") == 4
        assert front.in_flight == 0


@run
async def test_hop_by_hop_headers_are_stripped_both_ways():
    async def hoppy(request: web.Request) -> web.Response:
        return web.Response(text="ok", headers={
            "Connection": "X-Resp-Hop", "X-Resp-Hop": "1", "Keep-Alive": "timeout=5",
            "Proxy-Authenticate": "Basic", "Trailer": "X-T", "X-Resp-Keep": "yes"})

    async with Upstream() as up, front_for(up) as front, aiohttp.ClientSession() as s:
        up.route("POST", "/hop", hoppy)
        sent = {"Connection": "keep-alive, X-Req-Hop", "X-Req-Hop": "1", "Keep-Alive": "300",
                "Proxy-Authorization": "Basic eA==", "Proxy-Connection": "keep-alive",
                "TE": "trailers", "X-Req-Keep": "yes", "Authorization": "Bearer k"}
        async with s.post(front.url + "/hop", data=b"x", headers=sent) as r:
            assert r.status == 200 and await r.text() == "ok"
            got = {k.lower() for k in r.headers}
        assert r.headers["X-Resp-Keep"] == "yes"
        assert not got & {"x-resp-hop", "keep-alive", "proxy-authenticate", "trailer"}
        assert r.headers.get("Connection", "keep-alive").lower() == "keep-alive"
        headers = {k.lower(): v for k, v in up.seen[0][2].items()}
        assert headers["x-req-keep"] == "yes" and headers["authorization"] == "Bearer k"
        assert not set(headers) & {"x-req-hop", "keep-alive", "proxy-authorization",
                                   "proxy-connection", "te"}
        assert headers.get("connection", "keep-alive").lower() == "keep-alive"


@run
async def test_compressed_body_passes_without_recompression_and_head_works():
    raw = b"\x1f\x8b not really gzip, passed as bytes"

    async def gz(request: web.Request) -> web.Response:
        return web.Response(body=raw, headers={"Content-Encoding": "gzip",
                                               "Content-Type": "application/octet-stream"})

    async with Upstream() as up, front_for(up) as front:
        up.route("GET", "/gz", gz)
        async with aiohttp.ClientSession(auto_decompress=False) as s:
            async with s.get(front.url + "/gz", headers={"Accept-Encoding": "gzip"}) as r:
                assert r.headers["Content-Encoding"] == "gzip"
                assert await r.read() == raw
            async with s.head(front.url + "/gz", skip_auto_headers=("Accept-Encoding",)) as r:
                assert r.status == 200 and int(r.headers["Content-Length"]) == len(raw)
                assert await r.read() == b""
        # the front adds no Accept-Encoding the client did not send
        assert "Accept-Encoding" not in up.seen[1][2]


@run
async def test_large_and_chunked_request_bodies_stream_through():
    async def digest(request: web.Request) -> web.Response:
        body = up.seen[-1][3]
        return web.json_response({"n": len(body), "sum": sum(body[::4096]),
                                  "te": request.headers.get("Transfer-Encoding"),
                                  "cl": request.headers.get("Content-Length")})

    big = bytes(range(256)) * (12 * 4096)   # 12 MiB
    async with Upstream() as up, front_for(up) as front, aiohttp.ClientSession() as s:
        up.route("PUT", "/blob", digest)
        async with s.put(front.url + "/blob", data=io.BytesIO(big)) as r:
            got = await r.json()
        assert got == {"n": len(big), "sum": sum(big[::4096]), "te": None, "cl": str(len(big))}

        async def parts():
            for i in range(4):
                yield bytes([i]) * 1000
        async with s.put(front.url + "/blob", data=parts()) as r:
            got = await r.json()
        assert got["n"] == 4000 and got["te"] == "chunked"


@run
async def test_upstream_can_be_set_and_changed_after_start():
    async with Upstream() as a, Upstream() as b, front_for(None, state="starting") as front, \
            aiohttp.ClientSession() as s:
        a.route("GET", "/who", json_handler({"who": "a"}))
        b.route("GET", "/who", json_handler({"who": "b"}))
        with pytest.raises(RuntimeError, match="set_upstream"):
            front.open()
        front.set_upstream(a.url)
        front.open()
        async with s.get(front.url + "/who") as r:
            assert (await r.json())["who"] == "a"
        front.set_upstream(b.url + "/")
        async with s.get(front.url + "/who") as r:
            assert (await r.json())["who"] == "b"
        with pytest.raises(ValueError):
            front.set_upstream("127.0.0.1:80")


@run
async def test_engine_down_is_a_502_from_berth():
    async with front_for(None, state="starting") as front, aiohttp.ClientSession() as s:
        front.set_upstream(f"http://127.0.0.1:{free_port()}")
        front.open()
        async with s.post(front.url + "/v1/completions", json={}) as r:
            assert r.status == 502
            body = await r.json()
        assert body["src"] == "berth" and body["reason"] == "engine_unreachable"
        assert body["error"]["code"] == 502 and "failed" in body["error"]["message"]
        assert front.errors == 1 and front.in_flight == 0


@run
async def test_engine_reset_mid_stream_ends_the_stream(caplog):
    async def dies(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        await resp.write(b"data: one\n\n")
        await up.release.wait()
        assert request.transport is not None
        request.transport.abort()   # the engine crashes
        return resp

    async with Upstream() as up, front_for(up) as front, aiohttp.ClientSession() as s:
        up.route("POST", "/v1/chat/completions", dies)
        async with s.post(front.url + "/v1/chat/completions", json={}) as r:
            assert await r.content.readuntil(b"\n\n") == b"data: one\n\n"
            up.release.set()
            with pytest.raises(aiohttp.ClientPayloadError):
                await r.read()   # cut short, not a clean end
        await until(lambda: front.in_flight == 0, "the forward to end")
        assert front.errors == 1
        # the front still serves afterwards
        up.route("GET", "/ok", json_handler())
        async with s.get(front.url + "/ok") as r:
            assert r.status == 200
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]


@pytest.mark.parametrize("cancellation", [True, False], ids=["cancelled", "write-reset"])
def test_client_disconnect_mid_stream_reaches_the_engine(cancellation: bool, caplog):
    @run
    async def scenario():
        ticks = asyncio.Event()

        async def endless(request: web.Request) -> web.StreamResponse:
            resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
            await resp.prepare(request)
            await resp.write(b"data: first\n\n")
            if cancellation:
                await up.release.wait()   # only a cancellation ends this
            while True:   # an engine generating tokens: only a failed write stops it
                await resp.write(b"data: token\n\n")
                ticks.set()
                await asyncio.sleep(0.002)

        async with Upstream(handler_cancellation=cancellation) as up, front_for(up) as front:
            up.route("POST", "/v1/chat/completions", endless)
            async with aiohttp.ClientSession() as s:
                r = await s.post(front.url + "/v1/chat/completions", json={})
                assert await r.content.readuntil(b"\n\n") == b"data: first\n\n"
                r.close()   # the client goes away mid-stream
            async with asyncio.timeout(5):
                await up.gone_event.wait()
            assert up.gone == ["CancelledError" if cancellation else "ClientConnectionResetError"]
            await until(lambda: front.in_flight == 0, "the forward to end")
            assert front.client_gone == 1 and front.errors == 0
    scenario()
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]


@run
async def test_openai_client_streams_through_the_front():
    async with Upstream() as up, front_for(up) as front:
        up.release.set()
        up.route("POST", "/v1/chat/completions", sse_handler(up, n=6))

        def chat() -> str:
            client = openai.OpenAI(base_url=front.url + "/v1", api_key="x", max_retries=0)
            stream = client.chat.completions.create(
                model="m", messages=[{"role": "user", "content": "hi"}], stream=True)
            return "".join(c.choices[0].delta.content or "" for c in stream)

        assert await asyncio.to_thread(chat) == "t0 t1 t2 t3 t4 t5 "
        headers = up.seen[0][2]
        assert headers["Authorization"] == "Bearer x"
        assert float(headers["X-Stainless-Read-Timeout"]) > 0   # the client's deadline header


@run
async def test_activity_is_reported_at_most_once_per_interval():
    calls: list[int] = []
    async with Upstream() as up, front_for(up, on_activity=lambda: calls.append(1),
                                          activity_every_s=60.0) as front, \
            aiohttp.ClientSession() as s:
        up.route("GET", "/ok", json_handler())
        for _ in range(5):
            async with s.get(front.url + "/ok") as r:
                assert r.status == 200
        assert calls == [1] and front.forwarded == 5
        front.activity_every_s = 0.0
        async with s.get(front.url + "/ok") as r:
            assert r.status == 200
        assert calls == [1, 1]


@run
async def test_address_in_use_is_an_oserror():
    async with front_for(None, state="starting") as first:
        second = Front("127.0.0.1", first.port, name="dup")
        with pytest.raises(OSError):
            await second.start()
