"""The front's connections read into one buffer, and header names are classified once (issue 17:
what the open state costs). Bytes from many reads on many connections at once must arrive
intact, and the name cache must not carry one request's ``Connection`` list into the next."""

from __future__ import annotations

import asyncio
import hashlib

import aiohttp
from aiohttp import web
from berth.front import rules
from berth.front.rules import ANSWER_DROP, REQUEST_DROP, strip_headers

from .conftest import Upstream, front_for, run


@run
async def test_concurrent_large_bodies_both_ways_arrive_byte_for_byte():
    """Each answer is the request body reversed, streamed in pieces: several MiB cross the
    front's one read buffer on four client and four engine connections at once."""
    async def mirror(request: web.Request) -> web.StreamResponse:
        body = await request.read()
        resp = web.StreamResponse()
        await resp.prepare(request)
        back = body[::-1]
        for i in range(0, len(back), 100_003):   # odd pieces, so reads split anywhere
            await resp.write(back[i:i + 100_003])
        return resp

    async with Upstream() as up, front_for(up) as front, aiohttp.ClientSession() as s:
        up.route("POST", "/mirror", mirror)

        async def one(seed: int) -> None:
            body = b"".join(hashlib.sha256(b"%d-%d" % (seed, i)).digest()
                            for i in range(40_000))   # 1.28 MB, different for each client
            async with s.post(front.url + "/mirror", data=body) as r:
                assert r.status == 200
                got = await r.read()
            assert got == body[::-1], f"client {seed}: answer differs from the body sent"

        await asyncio.gather(*(one(k) for k in range(4)))


def test_header_names_keep_their_rule_in_any_case_and_connection_lists_do_not_stick():
    headers = [(b"Host", b"x"), (b"X-Tag", b"1"), (b"content-length", b"3"),
               (b"Transfer-Encoding", b"chunked"), (b"Expect", b"100-continue"),
               (b"Proxy-Authorization", b"Basic eA=="), (b"Connection", b"keep-alive, X-Tag")]
    lines, length, chunked, expect = strip_headers(headers, REQUEST_DROP)
    assert (lines, length, chunked, expect) == ([], 3, True, True)
    # the same names in other cases, and X-Tag no longer listed: it passes this time
    lines, length, chunked, expect = strip_headers(
        [(b"HOST", b"x"), (b"x-tag", b"2"), (b"CONTENT-LENGTH", b"4"), (b"connection", b"close")],
        REQUEST_DROP)
    assert (lines, length, chunked, expect) == ([b"x-tag: 2\r\n"], 4, False, False)
    # towards the client Content-Length stays; Expect is an ordinary header there
    lines, length, _, expect = strip_headers([(b"Content-Length", b"5"), (b"Expect", b"x")],
                                             ANSWER_DROP)
    assert (lines, length, expect) == ([b"Content-Length: 5\r\n", b"Expect: x\r\n"], 5, False)


def test_the_header_name_cache_stays_bounded():
    for i in range(3 * rules._KINDS_MAX):
        lines, *_ = strip_headers([(b"X-Name-%d" % i, b"v")], ANSWER_DROP)
        assert lines == [b"X-Name-%d: v\r\n" % i]
    assert len(rules._KINDS[ANSWER_DROP]) <= rules._KINDS_MAX + 1
