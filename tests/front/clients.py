"""Clients that misbehave on purpose (issue 26 "Slow clients are never closed"): connections that
send a request head one byte at a time, and a count of how long the server kept each one open.
Shared by the front's and the gateway's listener tests."""

from __future__ import annotations

import asyncio
import time

HEAD = b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n" \
       b"X-Padding: " + b"p" * 64 + b"\r\nContent-Length: 2\r\n\r\n"


async def _one_byte_at_a_time(port: int, every_s: float, give_up_s: float) -> float | None:
    """One connection sending :data:`HEAD` a byte every ``every_s`` seconds, until the server
    closes it: the seconds it stayed open, or None when it was still open after ``give_up_s``."""
    t0 = time.monotonic()
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
    except OSError:
        return 0.0           # refused at once counts as closed
    try:
        for i in range(len(HEAD)):
            writer.write(HEAD[i:i + 1])
            try:
                # the server closing shows as EOF (after a 408, or nothing) or as a reset
                got = await asyncio.wait_for(reader.read(65536), every_s)
                while got:
                    got = await asyncio.wait_for(reader.read(65536), every_s)
                return time.monotonic() - t0
            except asyncio.TimeoutError:
                pass
            except OSError:
                return time.monotonic() - t0
            if time.monotonic() - t0 > give_up_s:
                return None
        return None
    finally:
        writer.close()


async def slow_heads(port: int, n: int = 20, every_s: float = 2.0,
                     give_up_s: float = 30.0) -> list[float | None]:
    """``n`` connections at once, each sending a request head one byte every ``every_s``
    seconds: how long each stayed open (None: still open after ``give_up_s``)."""
    return list(await asyncio.gather(*(_one_byte_at_a_time(port, every_s, give_up_s)
                                       for _ in range(n))))


async def open_slow(port: int, n: int) -> list[asyncio.StreamWriter]:
    """``n`` connections that each sent the first byte of a head and nothing more (the caller
    closes them)."""
    writers = []
    for _ in range(n):
        try:
            _, w = await asyncio.open_connection("127.0.0.1", port)
        except OSError:
            continue
        w.write(HEAD[:1])
        writers.append(w)
    return writers
