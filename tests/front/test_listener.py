"""A front closes slow and idle clients and bounds its connections (issue 26 "Every listener
closes slow and idle clients"): real fronts and real sockets on loopback."""

from __future__ import annotations

import asyncio
import time

from berth.front.listen import Limits

from tests.front.clients import open_slow, slow_heads
from tests.front.conftest import Upstream, front_for, json_handler, until
from tests.helpers import ceiling, log_at_the_fd_limit


def _bounded(coro, limit_s: float):
    async def bounded():
        async with asyncio.timeout(limit_s):
            await coro
    asyncio.run(bounded())


async def _request(port: int, head: bytes = b"GET /ok HTTP/1.1\r\nHost: x\r\n\r\n"
                   ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter, bytes]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(head)
    got = await reader.readuntil(b"\r\n\r\n")
    length = int(next((ln.split(b":")[1] for ln in got.split(b"\r\n")
                       if ln.lower().startswith(b"content-length:")), b"0"))
    return reader, writer, got + await reader.readexactly(length)


async def _closed_within(reader: asyncio.StreamReader, limit_s: float) -> float:
    t0 = time.monotonic()
    try:
        async with asyncio.timeout(limit_s):
            while await reader.read(65536):
                pass
    except OSError:
        pass
    return time.monotonic() - t0


def test_twenty_slow_heads_are_closed_within_30s_and_the_front_serves_meanwhile():
    async def scenario():
        async with Upstream() as up, front_for(up) as front:    # default limits: 10 s a head
            up.route("GET", "/ok", json_handler())
            slow = asyncio.ensure_future(slow_heads(front.port, n=20, every_s=2.0,
                                                    give_up_s=30.0))
            await until(lambda: len(front._conns) == 20, "20 slow connections")
            _, w, answer = await _request(front.port)
            assert answer.startswith(b"HTTP/1.1 200"), answer
            w.close()
            open_s = await slow
        assert None not in open_s, open_s            # none open after 30 s
        assert min(open_s) >= 9.0, open_s            # closed by the head limit, not at once
        assert front.listener.head_timeouts == 20
    _bounded(scenario(), 45)


def test_an_idle_keep_alive_connection_and_a_stalled_body_are_closed():
    async def scenario():
        limits = Limits(head_timeout_s=1.0, idle_timeout_s=1.0)
        async with Upstream() as up, front_for(up, limits=limits) as front:
            up.route("GET", "/ok", json_handler())
            reader, w, answer = await _request(front.port)
            assert answer.startswith(b"HTTP/1.1 200")
            took = await _closed_within(reader, 5.0)     # kept alive, then idle
            assert 0.9 <= took < 5.0, took
            w.close()
            reader, w = await asyncio.open_connection("127.0.0.1", front.port)
            w.write(b"POST /ok HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n0123456789")
            assert await _closed_within(reader, 5.0) < 5.0       # the body stopped coming
            w.close()
            reader, w = await asyncio.open_connection("127.0.0.1", front.port)
            assert await _closed_within(reader, 5.0) < 5.0       # nothing sent at all
            w.close()
            assert front.listener.idle_timeouts == 2 and front.listener.head_timeouts == 1
    _bounded(scenario(), 30)


def test_beyond_the_bound_a_new_connection_gets_a_503_at_once():
    async def scenario():
        limits = Limits(max_connections=3)
        async with Upstream() as up, front_for(up, state="starting", limits=limits) as front:
            held = []
            for _ in range(3):      # writes held while the engine starts: busy connections
                r, w = await asyncio.open_connection("127.0.0.1", front.port)
                w.write(b"POST /ok HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}")
                held.append(w)
            await until(lambda: front.holding == 3, "three held writes")
            t0 = time.monotonic()
            _, w, answer = await _request(front.port)
            assert time.monotonic() - t0 < ceiling(2.0)
            assert answer.startswith(b"HTTP/1.1 503") and b"too_many_connections" in answer
            assert front.listener.refused == 1 and len(front._conns) == 3
            for x in (*held, w):
                x.close()
    _bounded(scenario(), 20)


def test_at_the_bound_the_longest_waiting_slow_head_gives_its_place():
    async def scenario():
        limits = Limits(max_connections=3)
        async with Upstream() as up, front_for(up, limits=limits) as front:
            up.route("GET", "/ok", json_handler())
            slow = await open_slow(front.port, 3)
            loop = asyncio.get_running_loop()
            await until(lambda: len(front.listener.waiting) == 3 and loop.time()
                        - min(front.listener.waiting.values()) >= 1.0, "slow heads a second old")
            _, w, answer = await _request(front.port)
            assert answer.startswith(b"HTTP/1.1 200"), answer
            assert front.listener.evicted == 1 and front.listener.refused == 0
            for x in (*slow, w):
                x.close()
    _bounded(scenario(), 20)


def test_an_absolute_form_target_is_a_400_not_forwarded():
    async def scenario():
        async with Upstream() as up, front_for(up) as front:
            up.route("GET", "/y", json_handler())
            _, w, answer = await _request(front.port, b"GET http://x/y HTTP/1.1\r\nHost: x\r\n\r\n")
            assert answer.startswith(b"HTTP/1.1 400") and b'"reason": "absolute_form"' in answer
            assert up.seen == []
            w.close()
    _bounded(scenario(), 10)


_SERVE = """
import asyncio, logging, resource, sys
_, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (48, hard))
logging.basicConfig(level=logging.INFO, stream=sys.stderr)
from berth.front import Front
from berth.front.listen import Limits
async def main():
    f = Front("127.0.0.1", 0, name="x", limits=Limits(max_connections=10000))
    await f.start()
    print(f.port, flush=True)
    await asyncio.Event().wait()
asyncio.run(main())
"""


def test_too_many_open_files_is_logged_once_a_minute_not_per_accept(tmp_path):
    """The bound is set past the descriptor limit on purpose, so accepts fail with EMFILE
    (asyncio retries each second, and logged every retry)."""
    text = log_at_the_fd_limit(_SERVE, tmp_path)
    assert text.count("out of system resource") == 1, text[-3000:]
